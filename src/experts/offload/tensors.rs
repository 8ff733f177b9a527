//! What graphs read of the offloaded experts: the mode of a micro-batch and, per layer, the
//! tensors its experts run from (slots, staging, control, the CPU channel's result).
use super::*;

impl Offload {
    /// The largest micro-batch the slot cache serves (k experts per token must fit; in a layer
    /// split, in the device with the fewest slots).
    pub fn slot_tokens(&self) -> usize {
        let n_slots = self.n_slots();
        if n_slots == 0 {
            return 0;
        }
        (n_slots / self.k.max(1)).min(self.opts.max_slot_tokens)
    }

    /// Slots when the micro-batch's experts fit the cache, or for a decode micro-batch (up to
    /// `max_slot_tokens`) when the CPU channel can take what does not fit; staging otherwise.
    pub fn mode(&self, n_tokens: usize) -> Mode {
        let overflow_to_cpu = n_tokens <= self.opts.max_slot_tokens
            && self.n_slots() > 0
            && self.cpu.is_some()
            && (0..self.layers.len()).all(|il| !self.is_offloaded(il) || self.cpu_ok[il]);
        if n_tokens <= self.slot_tokens() || overflow_to_cpu {
            Mode::Slots
        } else {
            Mode::Staging
        }
    }

    /// Slot tensor of matrix `m` of layer `il`'s share `s` of the experts [ne0, ne1, n_slots]
    /// (share 0 without expert parallelism).
    pub fn slot_tensor(&self, il: usize, m: ExpertMat, s: usize) -> Option<Tensor<'_>> {
        let slots = self.parts[self.share_device(il, s)].slots.as_ref()?;
        slots
            .ctx
            .get(&slots.idx, &name(il, &format!("slot{}", m.index())))
    }

    /// Staging tensor of matrix `m` of layer `il` [ne0, ne1, n_expert].
    pub fn staging_tensor(&self, il: usize, m: ExpertMat) -> Option<Tensor<'_>> {
        let p = self.part(il);
        p.dev
            .get(&p.dev_idx, &name(il, &format!("stage{}", m.index())))
    }

    /// Host store tensor of matrix `m` of layer `il` [ne0, ne1, n_expert].
    pub fn store_tensor(&self, il: usize, m: ExpertMat) -> Option<Tensor<'_>> {
        self.store
            .get(&self.store_idx, &format!("blk.{il}.{}.weight", m.name()))
    }

    /// Whether layer `il`'s misses may run on the CPU channel (decode graphs then add its
    /// result, [`Offload::ctl_cpu`]).
    pub fn cpu_enabled(&self, il: usize) -> bool {
        self.cpu.is_some() && self.cpu_ok.get(il).copied().unwrap_or(false)
    }

    /// The CPU channel's result for layer `il`, f32 [n_embd, t_max] (zeros when unused).
    pub fn ctl_cpu(&self, il: usize) -> Tensor<'_> {
        let p = self.part(il);
        p.dev
            .get(&p.dev_idx, &name(il, "cpu"))
            .unwrap_or_else(|| panic!("layer {il} has no CPU result tensor"))
    }
    /// Control tensors of layer `il`'s share `s` of the experts (see [`Ctl`]).
    pub fn ctl(&self, il: usize, s: usize) -> Ctl<'_> {
        let p = &self.parts[self.share_device(il, s)];
        let get = |w: &str| {
            p.dev
                .get(&p.dev_idx, &name(il, w))
                .unwrap_or_else(|| panic!("layer {il} has no offload control tensor {w}"))
        };
        Ctl {
            ids: get("ids"),
            mask: get("mask"),
        }
    }
}

/// A layer's control tensors, which slot-mode graphs read.
pub struct Ctl<'a> {
    /// Slot ids, i32 [k, t_max].
    pub ids: Tensor<'a>,
    /// 1 for a pick this share's device computes, 0 for one the CPU channel or (under expert
    /// parallelism) another device does: f32 [1, k, t_max].
    pub mask: Tensor<'a>,
}
