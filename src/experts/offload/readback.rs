//! Reading a stop's routing back to the host: the selected ids, their weights, the prefetch
//! prediction and the FFN input, with one wait, through the host scratch.
use super::*;

impl Offload {
    /// Reads the routing of a step — `k * n_tokens` selected ids and their weights, the
    /// prefetch prediction when the graph has one, and the FFN input [n_embd, n_tokens] when the
    /// CPU channel may take misses — with one wait, for these reads only (not for prefetches).
    pub(super) fn read_routing(
        &mut self,
        n: &Resolved,
        n_tokens: usize,
    ) -> Result<Routing, GgmlError> {
        let reads = self.queue_reads(n, n_tokens)?;
        let t0 = std::time::Instant::now();
        self.xfer(n.il).wait_reads()?;
        self.stats.wait_copy_s += t0.elapsed().as_secs_f64();
        self.take_reads(n, n_tokens, &reads)
    }

    /// Queues the reads of [`Offload::read_routing`] without waiting for them.
    pub(super) fn queue_reads(
        &mut self,
        n: &Resolved,
        n_tokens: usize,
    ) -> Result<Reads, GgmlError> {
        let cnt = self.k * n_tokens;
        let n_pred = if n.pred_addr.is_some() {
            self.n_expert * n_tokens
        } else {
            0
        };
        let x_len = if self.cpu_candidate(n, n_tokens) {
            self.n_embd * n_tokens
        } else {
            0
        };
        let base = self.scratch_base();
        let lay = ScratchLayout::new(base, cnt, n_pred, self.shares);
        let x_at = base + self.scratch_len - 4 * x_len - 256;
        // The reads, the control and the hit flag end below the FFN input (sized for slot steps).
        if lay.end > x_at {
            return Err(GgmlError::Tensor {
                name: format!("offload scratch of layer {}", n.il),
                msg: format!(
                    "{n_tokens} tokens x {} experts, {n_pred} predicted logits and {x_len} inputs \
                     need {} B, the scratch has {} B",
                    self.k,
                    lay.end - base + 4 * x_len + 256,
                    self.scratch_len
                ),
            });
        }
        // The selected ids are a view of the router's argsort [n_expert, n_tokens]: one read of
        // the rows they lie in when the tokens' k ids are not contiguous (compacted below).
        let row = 4 * self.k;
        let strided = n_tokens > 1 && n.sel_row != row;
        if strided {
            let bytes = n.sel_row * (n_tokens - 1) + row;
            if bytes > self.sel_rows_len {
                return Err(GgmlError::Tensor {
                    name: format!("ffn_moe_topk of layer {}", n.il),
                    msg: format!(
                        "{n_tokens} tokens' rows need {bytes} B, the read-back room has {} B",
                        self.sel_rows_len
                    ),
                });
            }
            let rows = self.sel_rows;
            self.xfer(n.il).read(rows, n.sel_addr, bytes)?;
        } else {
            self.xfer(n.il).read(lay.sel, n.sel_addr, 4 * cnt)?;
        }
        self.xfer(n.il).read(lay.w, n.w_addr, 4 * cnt)?;
        if let Some(p) = n.pred_addr {
            self.xfer(n.il).read(lay.pred, p, 4 * n_pred)?;
        }
        if x_len > 0 {
            self.xfer(n.il).read(x_at, n.x_addr, 4 * x_len)?;
        }
        Ok(Reads {
            cnt,
            n_pred,
            x_len,
            x_at,
            lay,
            strided,
        })
    }

    /// The routing of reads queued by [`Offload::queue_reads`] that have landed.
    pub(super) fn take_reads(
        &mut self,
        n: &Resolved,
        n_tokens: usize,
        r: &Reads,
    ) -> Result<Routing, GgmlError> {
        let Reads {
            cnt,
            n_pred,
            x_len,
            x_at,
            strided,
            ..
        } = *r;
        let lay = &r.lay;
        let row = 4 * self.k;
        if strided {
            // SAFETY: the rows were read into the live, 4-aligned `sel_rows` room (size checked
            // above) by the waited copy; token t's k ids start t rows in; the compacted ids go
            // to `lay.sel`, which lies in the scratch and does not overlap it.
            unsafe {
                for t in 0..n_tokens {
                    let src = (self.sel_rows + t * n.sel_row) as *const i32;
                    let dst = (lay.sel + t * row) as *mut i32;
                    std::ptr::copy_nonoverlapping(src, dst, self.k);
                }
            }
        }
        // SAFETY: the ranges lie in the live host scratch (asserted above), 4-aligned (ggml
        // buffer bases are aligned), just written by the waited copies and not shared.
        let (ids, weights, pred, x) = unsafe {
            (
                std::slice::from_raw_parts(lay.sel as *const i32, cnt),
                std::slice::from_raw_parts(lay.w as *const f32, cnt).to_vec(),
                std::slice::from_raw_parts(lay.pred as *const f32, n_pred).to_vec(),
                std::slice::from_raw_parts(x_at as *const f32, x_len).to_vec(),
            )
        };
        let n_expert = self.n_expert as u32;
        let sel = ids
            .iter()
            .map(|&e| {
                u32::try_from(e)
                    .ok()
                    .filter(|&e| e < n_expert)
                    .ok_or_else(|| GgmlError::Tensor {
                        name: "ffn_moe_topk".into(),
                        msg: format!("router selected expert {e}, outside 0..{n_expert}"),
                    })
            })
            .collect::<Result<_, _>>()?;
        Ok(Routing {
            sel,
            weights,
            pred,
            x,
            fast: false,
        })
    }
}

/// Reads of a stop's routing, queued (see [`Offload::queue_reads`]).
pub(super) struct Reads {
    cnt: usize,
    n_pred: usize,
    x_len: usize,
    x_at: usize,
    lay: ScratchLayout,
    strided: bool,
}

impl Offload {
    /// The host scratch region reads and control writes go to now: the first, or (gated, a
    /// stop's reads queued while earlier stops' are still read) one per stop in flight.
    pub(super) fn scratch_base(&self) -> usize {
        self.scratch + (self.scratch_region % SCRATCH_REGIONS) * self.scratch_len
    }
}

/// Host scratch regions: one per gated stop in flight (at most [`READ_BATCHES`] / 2).
pub(super) const SCRATCH_REGIONS: usize = super::transfer::READ_BATCHES / 2;

impl Reads {
    /// Where a table-form stop's hit flag is read to (a separate read, after the flag).
    pub(super) fn flag_at(&self) -> usize {
        self.lay.flag
    }
}

/// Where a stop's reads and control writes go in the host scratch (byte addresses).
pub(super) struct ScratchLayout {
    sel: usize,
    w: usize,
    pred: usize,
    pub(super) ctl: usize,
    /// Bytes of one share's control.
    ctl_len: usize,
    /// Table form: the hit flag, read back.
    pub(super) flag: usize,
    pub(super) end: usize,
}

impl ScratchLayout {
    /// For `picks` selected experts (k per token), `n_pred` predicted logits and the control
    /// (ids and mask) of `shares` shares of the experts.
    pub(super) fn new(base: usize, picks: usize, n_pred: usize, shares: usize) -> Self {
        let p = 4 * picks.next_multiple_of(64);
        let sel = base;
        let w = sel + p;
        let pred = w + p;
        let ctl = pred + 4 * n_pred.next_multiple_of(64);
        let flag = ctl + 2 * p * shares.max(1);
        Self {
            sel,
            w,
            pred,
            ctl,
            ctl_len: 2 * p,
            flag,
            end: flag + 64,
        }
    }

    /// Where share `s`'s control (ids, then mask) goes.
    pub(super) fn ctl_of(&self, s: usize) -> usize {
        self.ctl + s * self.ctl_len
    }
}

/// What a step's router chose, read back to the host.
pub(super) struct Routing {
    /// Expert per pick, [k * n_tokens].
    pub(super) sel: Vec<u32>,
    /// Weight per pick.
    pub(super) weights: Vec<f32>,
    /// The next offloaded layer's predicted router logits [n_expert * n_tokens] (empty without
    /// prefetch).
    pub(super) pred: Vec<f32>,
    /// FFN input [n_embd * n_tokens] (when the CPU channel may take misses).
    pub(super) x: Vec<f32>,
    /// A gated table-form stop whose picks were all resident: the GPU ran on (`table`; set
    /// once the flag is read).
    pub(super) fast: bool,
}

/// The distinct experts of the top `k` of each token's predicted router logits (`pred`:
/// [n_expert * n_tokens]), in order of first appearance.
pub fn predicted_experts(pred: &[f32], n_expert: usize, k: usize) -> Vec<u32> {
    let mut predicted: Vec<u32> = Vec::new();
    for logits in pred.chunks_exact(n_expert) {
        for e in crate::util::top_k(logits, k) {
            if !predicted.contains(&(e as u32)) {
                predicted.push(e as u32);
            }
        }
    }
    predicted
}
