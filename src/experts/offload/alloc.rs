//! The slot cache's device memory: its size, and its placement (congruent to the store where
//! direct decode may run).
use super::*;

impl Offload {
    /// Device bytes one slot costs in every MoE layer together.
    pub fn slot_bytes_all_layers(&self) -> usize {
        self.layers.iter().flatten().map(Layer::expert_bytes).sum()
    }

    /// Device bytes `n_slots` slots take in every MoE layer together (with padding, and, where
    /// direct decode may run, one expert's worth per matrix so each slot tensor can be placed
    /// congruent to its store: see [`Offload::alloc_slots`]).
    pub fn slots_alloc_bytes(&self, n_slots: usize) -> usize {
        let direct = self.direct_candidate();
        self.layers
            .iter()
            .flatten()
            .flat_map(|l| l.mats.iter().flatten())
            .map(|m| m.alloc_bytes(n_slots) + if direct { m.expert_bytes + 256 } else { 0 })
            .sum()
    }

    /// Whether [`Mode::Direct`] may run on this model and device: asked for, a CUDA backend
    /// (unified addressing: the GPU reads the page-locked store at its host address), and every
    /// expert matrix quantised (ggml-cuda then multiplies a single token's experts with its
    /// mat-vec kernel, which reads the ids on the device and nothing else of them).
    pub(super) fn direct_candidate(&self) -> bool {
        self.opts.direct
            && self.backend.is_cuda()
            && self
                .layers
                .iter()
                .flatten()
                .flat_map(|l| l.mats.iter().flatten())
                .all(|m| m.ty.is_quantized())
    }

    /// Gives every MoE layer `n_slots` cache slots on `backend` (at most one per expert).
    ///
    /// Direct decode (see [`Mode::Direct`]) addresses a miss through the slot tensor: expert `e`
    /// of matrix `m` is "slot" `base_m + e`, where `base_m = (store_m - slots_m) / bytes_m`, so
    /// each slot tensor is placed at an address congruent to its store modulo the expert size,
    /// and the resulting block offsets must fit ggml-cuda's 32-bit index arithmetic.
    pub fn alloc_slots(&mut self, backend: &Backend, n_slots: usize) -> Result<(), GgmlError> {
        let n_slots = n_slots.min(self.n_expert);
        let n_layer = self.layers.len();
        let direct = self.direct_candidate() && n_slots > 0;
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
        let base = buf.base_addr();
        let mut off = 0;
        let mut all_direct = direct;
        let store_addrs: Vec<[Option<usize>; 3]> = (0..n_layer)
            .map(|il| ExpertMat::ALL.map(|m| self.store_tensor(il, m).map(|t| t.data_addr())))
            .collect();
        for (il, l) in self.layers.iter_mut().enumerate() {
            let Some(l) = l else { continue };
            let mut bases = [None; 3];
            for (m, mat) in l.mats.iter().enumerate() {
                // No slots: the layer always stages (see `slot_tokens`).
                let Some(mat) = mat.as_ref().filter(|_| n_slots > 0) else {
                    continue;
                };
                let t = ctx
                    .new_tensor(mat.ty, &[mat.ne[0], mat.ne[1], n_slots as i64])?
                    .set_name(&name(il, &format!("slot{m}")));
                if direct {
                    let store = store_addrs[il][m].expect("store tensor of an offloaded matrix");
                    match congruent_offset(base, off, store, mat.expert_bytes) {
                        Some(at) => {
                            off = at;
                            bases[m] = direct_base(store, base + at, mat, n_slots, self.n_expert);
                        }
                        None => bases[m] = None,
                    }
                    all_direct &= bases[m].is_some();
                }
                off = buf.place(t, off)?;
            }
            l.direct_base = direct.then_some(bases);
            l.pending.clear();
            l.cache = LayerCache::new(il, self.n_expert, n_slots, &self.opts.policy);
        }
        let idx = ctx.index();
        self.slots = Some(SlotArea { ctx, idx });
        self.dev_bytes += size;
        self.n_slots = n_slots;
        self.direct_ready = all_direct;
        Ok(())
    }
}

/// The smallest offset `>= off` in a buffer at `base` whose address is congruent to `store`
/// modulo `expert_bytes` and 256-aligned (ggml's tensor alignment), if one exists.
fn congruent_offset(base: usize, off: usize, store: usize, expert_bytes: usize) -> Option<usize> {
    let eb = expert_bytes;
    let first = off + (store % eb + eb - (base + off) % eb) % eb;
    (0..256)
        .map(|j| first + j * eb)
        .find(|&at| (base + at).is_multiple_of(256))
        .filter(|&at| at < off + eb + 256)
}

/// The id of expert 0 in the store relative to a slot tensor at `slots` (see
/// [`Offload::alloc_slots`]), when every id a step can use (slots, and `base..base + n_expert`)
/// keeps ggml-cuda's block index within `i32`.
fn direct_base(
    store: usize,
    slots: usize,
    mat: &Mat,
    n_slots: usize,
    n_expert: usize,
) -> Option<i32> {
    let eb = mat.expert_bytes as i128;
    let d = store as i128 - slots as i128;
    if d % eb != 0 {
        return None;
    }
    let b = d / eb;
    // Blocks per expert: ggml-cuda's mat-vec kernel indexes quant blocks with 32-bit ints.
    let blocks = eb / mat.ty.type_size() as i128;
    let lo = b.min(0);
    let hi = (b + n_expert as i128).max(n_slots as i128);
    let fits = |id: i128| (id.abs() + 1) * blocks < i32::MAX as i128;
    (fits(lo) && fits(hi))
        .then(|| i32::try_from(b).ok())
        .flatten()
}
