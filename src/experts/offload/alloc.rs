//! The slot cache's device memory: its size and its placement.
use super::*;

impl Offload {
    /// Device bytes one slot costs in every MoE layer together.
    pub fn slot_bytes_all_layers(&self) -> usize {
        self.layers.iter().flatten().map(Layer::expert_bytes).sum()
    }

    /// Device bytes `n_slots` slots take in every MoE layer together (with padding).
    pub fn slots_alloc_bytes(&self, n_slots: usize) -> usize {
        self.layers
            .iter()
            .flatten()
            .flat_map(|l| l.mats.iter().flatten())
            .map(|m| m.alloc_bytes(n_slots))
            .sum()
    }

    /// Gives every MoE layer `n_slots` cache slots on `backend` (at most one per expert).
    pub fn alloc_slots(&mut self, backend: &Backend, n_slots: usize) -> Result<(), GgmlError> {
        let n_slots = n_slots.min(self.n_expert);
        let n_layer = self.layers.len();
        let ctx = Context::new(n_layer * 3 + 1, 0)?;
        let size = if n_slots == 0 {
            0
        } else {
            self.slots_alloc_bytes(n_slots)
        };
        let buf = ctx.new_buffer(backend, Memory::Device, size)?;
        // Zeroed: a masked-out slot id points at slot 0, and zero blocks compute to zeros
        // (never NaN) before slot 0 was ever filled.
        buf.clear(0);
        let mut off = 0;
        for (il, l) in self.layers.iter_mut().enumerate() {
            let Some(l) = l else { continue };
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
            l.cache = LayerCache::new(il, self.n_expert, n_slots, &self.opts.policy);
        }
        let idx = ctx.index();
        self.slots = Some(SlotArea { ctx, idx });
        self.dev_bytes += size;
        self.n_slots = n_slots;
        Ok(())
    }
}
