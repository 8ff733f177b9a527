//! The slot cache's device memory: its size and its placement (per device in a layer split).
use super::*;

impl Offload {
    /// Device bytes one slot costs in every MoE layer together.
    pub fn slot_bytes_all_layers(&self) -> usize {
        self.layers.iter().flatten().map(Layer::expert_bytes).sum()
    }

    /// Device bytes one slot costs in every MoE layer whose slots device `d` holds.
    pub fn slot_bytes_on(&self, d: usize) -> usize {
        self.slot_layers_on(d).map(|(_, l)| l.expert_bytes()).sum()
    }

    /// Device bytes `n_slots` slots take in every MoE layer together (with padding).
    pub fn slots_alloc_bytes(&self, n_slots: usize) -> usize {
        (0..self.parts.len())
            .map(|d| self.slots_alloc_bytes_on(d, n_slots))
            .sum()
    }

    /// Device bytes `n_slots` slots take in every MoE layer whose slots device `d` holds (with
    /// padding).
    pub fn slots_alloc_bytes_on(&self, d: usize, n_slots: usize) -> usize {
        self.slot_layers_on(d)
            .flat_map(|(_, l)| l.mats.iter().flatten())
            .map(|m| m.alloc_bytes(n_slots))
            .sum()
    }

    /// The offloaded layers whose slots device `d` holds, with their indices: its own layers,
    /// or under expert parallelism every offloaded layer (its share of each).
    pub(super) fn slot_layers_on(&self, d: usize) -> impl Iterator<Item = (usize, &Layer)> + '_ {
        let ep = self.expert_parallel();
        self.layers
            .iter()
            .enumerate()
            .filter_map(move |(il, l)| Some((il, l.as_ref()?)))
            .filter(move |(il, _)| ep || self.layer_device(*il) == d)
    }

    /// Experts share `s` of a layer holds (`e % shares == s`).
    fn share_experts(&self, s: usize) -> usize {
        (s..self.n_expert).step_by(self.shares).count()
    }

    /// Gives every MoE layer of device `d` (the only device without a layer split; under expert
    /// parallelism every MoE layer's share `d`) `n_slots` cache slots in that device's memory
    /// (at most one per expert of the share). Once per device.
    pub fn alloc_slots(&mut self, d: usize, n_slots: usize) -> Result<(), GgmlError> {
        let share = if self.expert_parallel() { d } else { 0 };
        let n_slots = n_slots.min(self.share_experts(share));
        let n_layer = self.layers.len();
        let ctx = Context::new(n_layer * 3 + 1, 0)?;
        let size = if n_slots == 0 {
            0
        } else {
            self.slots_alloc_bytes_on(d, n_slots)
        };
        let buf = ctx.new_buffer(&self.parts[d].backend, Memory::Device, size)?;
        // Zeroed: a masked-out slot id points at slot 0, and zero blocks compute to zeros
        // (never NaN) before slot 0 was ever filled.
        buf.clear(0);
        let mut off = 0;
        let on_d: Vec<usize> = self.slot_layers_on(d).map(|(il, _)| il).collect();
        for il in on_d {
            let l = self.layers[il].as_mut().expect("an offloaded layer");
            for (m, mat) in l.mats.iter().enumerate() {
                // No slots: the layer always stages (see `slot_tokens`).
                let Some(mat) = mat.as_ref().filter(|_| n_slots > 0) else {
                    continue;
                };
                let t = ctx
                    .new_tensor(mat.ty, &[mat.ne[0], mat.ne[1], n_slots as i64])?
                    .set_name(&name(il, &format!("slot{m}")));
                off = buf.place(t, off)?;
            }
            l.caches[share] = LayerCache::new(il, self.n_expert, n_slots, &self.opts.policy);
        }
        let idx = ctx.index();
        let part = &mut self.parts[d];
        part.slots = Some(SlotArea { ctx, idx });
        part.dev_bytes += size;
        part.n_slots = n_slots;
        Ok(())
    }
}
