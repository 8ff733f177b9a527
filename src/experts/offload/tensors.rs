//! What graphs read of the offloaded experts: the mode of a micro-batch and, per layer, the
//! tensors its experts run from (slots, staging, control, the CPU channel's result, direct
//! decode's id table and mailboxes).
use super::*;

impl Offload {
    /// The largest micro-batch the slot cache serves (k experts per token must fit).
    pub fn slot_tokens(&self) -> usize {
        if self.n_slots == 0 {
            return 0;
        }
        (self.n_slots / self.k.max(1)).min(self.opts.max_slot_tokens)
    }

    /// Slots when the micro-batch's experts fit the cache, or for a decode micro-batch (up to
    /// `max_slot_tokens`) when the CPU channel can take what does not fit; staging otherwise.
    pub fn mode(&self, n_tokens: usize) -> Mode {
        if n_tokens == 1 && self.direct_ready {
            return Mode::Direct;
        }
        let overflow_to_cpu = n_tokens <= self.opts.max_slot_tokens
            && self.n_slots > 0
            && self.cpu.is_some()
            && (0..self.layers.len()).all(|il| !self.is_offloaded(il) || self.cpu_ok[il]);
        if n_tokens <= self.slot_tokens() || overflow_to_cpu {
            Mode::Slots
        } else {
            Mode::Staging
        }
    }

    /// Whether direct decode follows the step through mailboxes ([`Admit::Prefetch`]).
    pub fn follows(&self) -> bool {
        self.opts.stop_every == 0 && self.opts.admit == Admit::Prefetch
    }

    /// Gives node `t` of layer `il` its mailbox (`pred`: the predicted logits, else the ids).
    ///
    /// The mailbox is page-locked host memory that lives as long as the engine; the GPU writes
    /// it through unified addressing (see `direct`).
    pub fn preset_mailbox(&self, t: Tensor<'_>, il: usize, pred: bool) {
        let mb = self.mailbox_of(il);
        // SAFETY: per the doc: live page-locked memory of the right size, reachable by the GPU
        // at its host address (the CUDA host buffer type; direct decode runs on CUDA only).
        unsafe { t.preset(self.mailbox_owner, if pred { mb.logits } else { mb.ids }) }
    }

    /// Direct mode: the layers a stop at layer `il` prefetches for (the offloaded layers after
    /// it up to and including the next stop layer), or `None` when `il` does not stop.
    pub fn direct_stop(&self, il: usize) -> Option<Vec<usize>> {
        let every = self.opts.stop_every;
        let moe: Vec<usize> = (0..self.layers.len())
            .filter(|&j| self.is_offloaded(j))
            .collect();
        let pos = moe.iter().position(|&j| j == il)?;
        (every > 0 && pos % every == 0)
            .then(|| moe[pos + 1..].iter().take(every).copied().collect())
    }

    /// Slot tensor of matrix `m` of layer `il` [ne0, ne1, n_slots].
    pub fn slot_tensor(&self, il: usize, m: ExpertMat) -> Option<Tensor<'_>> {
        let slots = self.slots.as_ref()?;
        slots
            .ctx
            .get(&slots.idx, &name(il, &format!("slot{}", m.index())))
    }

    /// Staging tensor of matrix `m` of layer `il` [ne0, ne1, n_expert].
    pub fn staging_tensor(&self, il: usize, m: ExpertMat) -> Option<Tensor<'_>> {
        self.dev
            .get(&self.dev_idx, &name(il, &format!("stage{}", m.index())))
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
        self.dev
            .get(&self.dev_idx, &name(il, "cpu"))
            .unwrap_or_else(|| panic!("layer {il} has no CPU result tensor"))
    }

    /// Direct mode's id table of layer `il`, matrix `m`: i32 [1, n_expert], a view of
    /// `off.remap` (rows of one element, so `get_rows` maps expert ids through it).
    pub fn remap_view<'a>(&'a self, ctx: &'a Context, il: usize, m: ExpertMat) -> Tensor<'a> {
        let t = self.remap();
        ctx.view(
            t,
            &[1, self.n_expert as i64],
            &[4],
            4 * self.n_expert * (3 * il + m.index()),
        )
    }

    pub(super) fn remap(&self) -> Tensor<'_> {
        self.dev
            .get(&self.dev_idx, "off.remap")
            .expect("the offload id table exists")
    }

    /// Control tensors of layer `il` (see [`Ctl`]).
    pub fn ctl(&self, il: usize) -> Ctl<'_> {
        let get = |w: &str| {
            self.dev
                .get(&self.dev_idx, &name(il, w))
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
    /// 1 for a pick the GPU computes, 0 for one the CPU channel does: f32 [1, k, t_max].
    pub mask: Tensor<'a>,
}
