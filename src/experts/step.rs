//! One forward pass through the offloaded experts: the scheduler stops after each offloaded
//! layer's router ([`StepHook`] as ggml's eval callback); we read the selected expert ids, make
//! the experts available (slot cache: admit misses, copy them in, remap ids to slots; staging:
//! copy every used expert in, from its slot when cached), write the control tensors the layer's
//! expert matmuls read, and let the graph continue.
//!
//! Invariant: when `computed` returns, every copy it queued has landed (the copy engine was
//! waited on), so the expert matmuls that follow read complete weights.
use super::offload::{Mode, Offload};
use crate::ggml::{EvalHook, GgmlError, OwnedGraph};
use std::collections::HashMap;

/// An offloaded layer of a built graph, as the graph builder recorded it.
#[derive(Debug, Clone)]
pub struct MoeNode {
    pub il: usize,
    pub mode: Mode,
    /// Name of the routing node the hook stops after (the final weights).
    pub anchor: String,
    /// Name of the selected ids, i32 [k, n_tokens].
    pub selected: String,
    /// Name of the FFN input, f32 [n_embd, n_tokens] (prefetch predicts from it).
    pub input: String,
}

/// [`MoeNode`]s of an allocated graph, keyed by the anchor node's id.
pub struct GraphNodes {
    by_anchor: HashMap<usize, Resolved>,
}

struct Resolved {
    il: usize,
    mode: Mode,
    sel_addr: usize,
    x_addr: usize,
}

impl GraphNodes {
    /// Resolves names to node ids and data addresses; call after the graph is allocated.
    pub fn resolve(nodes: &[MoeNode], g: &OwnedGraph) -> Self {
        let by_anchor = nodes
            .iter()
            .map(|n| {
                (
                    g.tensor(&n.anchor).id(),
                    Resolved {
                        il: n.il,
                        mode: n.mode,
                        sel_addr: g.tensor(&n.selected).data_addr(),
                        x_addr: g.tensor(&n.input).data_addr(),
                    },
                )
            })
            .collect();
        Self { by_anchor }
    }
}

/// The eval hook for one forward pass of `n_tokens`.
pub struct StepHook<'a> {
    pub off: &'a mut Offload,
    pub nodes: &'a GraphNodes,
    pub n_tokens: usize,
}

impl EvalHook for StepHook<'_> {
    fn wants(&mut self, id: usize) -> bool {
        self.nodes.by_anchor.contains_key(&id)
    }

    fn computed(&mut self, id: usize) -> Result<(), GgmlError> {
        let n = &self.nodes.by_anchor[&id];
        self.off
            .on_routing(n.il, n.mode, n.sel_addr, self.n_tokens)?;
        if n.mode == Mode::Slots && self.off.opts.prefetch {
            self.off.prefetch_after(n.il, n.x_addr, self.n_tokens)?;
        }
        Ok(())
    }
}

impl Offload {
    /// Starts a forward pass of `n_tokens` (advances the policies' clock).
    pub fn begin_step(&mut self, n_tokens: usize) {
        self.step += 1;
        self.stats.steps += 1;
        self.stats.tokens += n_tokens as u64;
    }

    /// Reads `k * n_tokens` selected ids from device address `sel_addr`.
    fn read_selected(&mut self, sel_addr: usize, n_tokens: usize) -> Result<Vec<u32>, GgmlError> {
        let n = self.k * n_tokens;
        assert!(
            4 * n <= self.scratch_len,
            "routing read exceeds the scratch"
        );
        self.xfer.copy(self.scratch, sel_addr, 4 * n)?;
        self.xfer.wait()?;
        // SAFETY: the scratch is a live host buffer of scratch_len >= 4n bytes, 4-aligned (ggml
        // buffer bases are aligned), just written by the waited copy and not shared.
        let ids = unsafe { std::slice::from_raw_parts(self.scratch as *const i32, n) };
        let n_expert = self.n_expert as u32;
        ids.iter()
            .map(|&e| {
                u32::try_from(e)
                    .ok()
                    .filter(|&e| e < n_expert)
                    .ok_or_else(|| GgmlError::Tensor {
                        name: "ffn_moe_topk".into(),
                        msg: format!("router selected expert {e}, outside 0..{n_expert}"),
                    })
            })
            .collect()
    }

    /// Per matrix: (store base, slot base, staging base, bytes per expert); `None` for a
    /// matrix the model lacks.
    fn bases(&self, il: usize) -> [Option<(usize, usize, usize, usize)>; 3] {
        let layer = self.layers[il].as_ref().expect("offloaded layer");
        std::array::from_fn(|m| {
            let mat = layer.mats[m].as_ref()?;
            Some((
                self.store_tensor(il, m)?.data_addr(),
                self.slot_tensor(il, m).map_or(0, |t| t.data_addr()),
                self.staging_tensor(il, m)?.data_addr(),
                mat.expert_bytes,
            ))
        })
    }

    fn on_routing(
        &mut self,
        il: usize,
        mode: Mode,
        sel_addr: usize,
        n_tokens: usize,
    ) -> Result<(), GgmlError> {
        let sel = self.read_selected(sel_addr, n_tokens)?;
        let mut used: Vec<u32> = Vec::with_capacity(sel.len());
        for &e in &sel {
            if !used.contains(&e) {
                used.push(e);
            }
        }
        let bases = self.bases(il);
        let now = self.step;
        let layer = self.layers[il].as_mut().expect("offloaded layer");
        let st = &mut self.stats.layers[il];
        st.used += used.len() as u64;
        if mode == Mode::Slots {
            st.prefetch_used += layer.prefetched.iter().filter(|e| used.contains(e)).count() as u64;
            st.predicted_used += layer.predicted.iter().filter(|e| used.contains(e)).count() as u64;
        }
        layer.prefetched.clear();
        layer.predicted.clear();
        let mut h2d = 0u64;
        match mode {
            Mode::Staging => {
                for &e in &used {
                    let cached = layer.cache.slot(e);
                    if cached.is_some() {
                        st.hits += 1;
                    } else {
                        st.misses += 1;
                        st.copies += 1;
                    }
                    for &(store, slot, stage, eb) in bases.iter().flatten() {
                        let src = match cached {
                            Some(s) => slot + s as usize * eb,
                            None => {
                                h2d += eb as u64;
                                store + e as usize * eb
                            }
                        };
                        self.xfer.copy(stage + e as usize * eb, src, eb)?;
                    }
                }
                self.stats.h2d_bytes += h2d;
                let t0 = std::time::Instant::now();
                self.xfer.wait()?;
                self.stats.wait_copy_s += t0.elapsed().as_secs_f64();
            }
            Mode::Slots => {
                for &e in &used {
                    if layer.cache.slot(e).is_some() {
                        st.hits += 1;
                        continue;
                    }
                    st.misses += 1;
                    st.copies += 1;
                    let (slot, _) = layer
                        .cache
                        .admit(e, &|r| used.contains(&r), now)
                        .ok_or_else(|| GgmlError::Tensor {
                            name: format!("expert cache of layer {il}"),
                            msg: format!(
                                "{} experts needed at once, {} slots",
                                used.len(),
                                layer.cache.n_slots()
                            ),
                        })?;
                    for &(store, slot_base, _, eb) in bases.iter().flatten() {
                        self.xfer.copy(
                            slot_base + slot as usize * eb,
                            store + e as usize * eb,
                            eb,
                        )?;
                        h2d += eb as u64;
                    }
                }
                for &e in &used {
                    layer.cache.touch(e, now);
                }
                self.stats.h2d_bytes += h2d;
                // Control: slot ids and the mask (all experts on the GPU for now).
                let ids: Vec<i32> = sel
                    .iter()
                    .map(|&e| layer.cache.slot(e).expect("admitted above") as i32)
                    .collect();
                let mask = vec![1f32; ids.len()];
                let (t_ids, t_mask) = self.ctl(il);
                let (ids_addr, mask_addr) = (t_ids.data_addr(), t_mask.data_addr());
                let n = ids.len();
                let ctl = self.scratch + 4 * n.next_multiple_of(64);
                assert!(ctl + 8 * n <= self.scratch + self.scratch_len);
                // SAFETY: [ctl, ctl + 8n) lies in the live host scratch (asserted), 4-aligned,
                // and no copy touching it is pending (the last read was waited on).
                unsafe {
                    let p = ctl as *mut i32;
                    std::ptr::copy_nonoverlapping(ids.as_ptr(), p, n);
                    std::ptr::copy_nonoverlapping(mask.as_ptr(), p.add(n).cast::<f32>(), n);
                }
                self.xfer.copy(ids_addr, ctl, 4 * n)?;
                self.xfer.copy(mask_addr, ctl + 4 * n, 4 * n)?;
                let t0 = std::time::Instant::now();
                self.xfer.wait()?;
                self.stats.wait_copy_s += t0.elapsed().as_secs_f64();
            }
        }
        Ok(())
    }
}

impl Offload {
    /// After layer `il`'s experts are in place: predicts the next offloaded layer's experts by
    /// running its router on this layer's FFN input (at `x_addr`, [n_embd, n_tokens]) and queues
    /// copies of the predicted experts that are not resident. Not waited for: the copies overlap
    /// this layer's expert matmuls and the next layer's attention; the next layer's first copy
    /// engine wait covers them.
    fn prefetch_after(
        &mut self,
        il: usize,
        x_addr: usize,
        n_tokens: usize,
    ) -> Result<(), GgmlError> {
        let Some(next) = (il + 1..self.layers.len()).find(|&j| self.layers[j].is_some()) else {
            return Ok(());
        };
        let n_expert = self.n_expert;
        let n_embd = match &self.layers[next] {
            Some(l) if !l.router.is_empty() => l.router.len() / n_expert,
            _ => return Ok(()),
        };
        let n = n_embd * n_tokens;
        let xs = self.scratch + self.scratch_len - 4 * n - 256;
        self.xfer.copy(xs, x_addr, 4 * n)?;
        self.xfer.wait()?;
        // SAFETY: [xs, xs + 4n) lies in the live host scratch (sized for n_embd * t_max floats
        // at its end), 4-aligned, written by the waited copy.
        let x = unsafe { std::slice::from_raw_parts(xs as *const f32, n) }.to_vec();
        let bases = self.bases(next);
        let now = self.step;
        let k = self.k;
        let layer = self.layers[next].as_mut().expect("offloaded layer");
        let mut predicted: Vec<u32> = Vec::new();
        for xt in x.chunks_exact(n_embd) {
            let logits: Vec<f32> = layer
                .router
                .chunks_exact(n_embd)
                .map(|w| w.iter().zip(xt).map(|(a, b)| a * b).sum())
                .collect();
            for e in crate::synth::routing::top_k(&logits, k) {
                if !predicted.contains(&(e as u32)) {
                    predicted.push(e as u32);
                }
            }
        }
        let mut h2d = 0u64;
        let mut fetched = Vec::new();
        for &e in &predicted {
            if layer.cache.slot(e).is_some() {
                continue;
            }
            // Evict only experts not predicted; stop when the cache has none left to give.
            let Some((slot, _)) = layer.cache.admit(e, &|r| predicted.contains(&r), now) else {
                break;
            };
            for &(store, slot_base, _, eb) in bases.iter().flatten() {
                self.xfer
                    .copy(slot_base + slot as usize * eb, store + e as usize * eb, eb)?;
                h2d += eb as u64;
            }
            fetched.push(e);
        }
        let st = &mut self.stats.layers[next];
        st.prefetched += fetched.len() as u64;
        st.copies += fetched.len() as u64;
        self.stats.h2d_bytes += h2d;
        layer.prefetched = fetched;
        layer.predicted = predicted;
        Ok(())
    }
}
