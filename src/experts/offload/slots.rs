//! A stop's cache protocol (the graph waits after an offloaded layer's router): the routing
//! read back, then, by the layer's mode, the used experts staged (`staging`), or the misses
//! split between the copy engine and the CPU channel (`planner`), admitted into slots, the
//! control written and the next layer's predicted experts prefetched.
use super::readback::{Routing, ScratchLayout};
use super::*;
use crate::experts::stats::LayerStats;

impl Offload {
    pub(super) fn on_routing(&mut self, n: &Resolved, n_tokens: usize) -> Result<(), GgmlError> {
        let routing = self.read_routing(n, n_tokens)?;
        self.routed(n, n_tokens, &routing)
    }

    /// A stop's protocol once its routing is on the host.
    pub(super) fn routed(
        &mut self,
        n: &Resolved,
        n_tokens: usize,
        routing: &Routing,
    ) -> Result<(), GgmlError> {
        let (il, mode) = (n.il, n.mode);
        let mut used: Vec<u32> = Vec::with_capacity(routing.sel.len());
        for &e in &routing.sel {
            if !used.contains(&e) {
                used.push(e);
            }
        }
        // Decode: split the misses between the copy engine and the CPU channel (a stop whose
        // picks all hit on the device has none).
        let on_cpu = if !routing.fast && self.cpu_candidate(n, n_tokens) {
            self.plan_cpu(il, &used, n.act)
        } else {
            Vec::new()
        };
        let layer = self.layers[il].as_mut().expect("offloaded layer");
        let st = &mut self.stats.layers[il];
        st.used += used.len() as u64;
        if mode == Mode::Slots {
            let hit = |e: &&u32| used.contains(e);
            st.prefetch_used += layer.prefetched.iter().filter(hit).count() as u64;
            st.predicted_used += layer.predicted.iter().filter(hit).count() as u64;
            if self.shares > 1 {
                let mut by = vec![LayerStats::default(); self.shares];
                for &e in layer.prefetched.iter().filter(hit) {
                    by[layer.owner(e)].prefetch_used += 1;
                }
                self.stats.add_by_share(&by);
            }
        }
        layer.prefetched.clear();
        layer.predicted.clear();
        match mode {
            Mode::Staging => self.stage_used(il, &used, n_tokens),
            Mode::Slots => self.slots_used(n, n_tokens, routing, &used, &on_cpu),
        }
    }

    /// Slot mode: admits the misses not on the CPU and queues their copies, the slot ids and
    /// the mask on the compute stream, starts the CPU channel's job, and prefetches for the next
    /// offloaded layer.
    pub(super) fn slots_used(
        &mut self,
        n: &Resolved,
        n_tokens: usize,
        routing: &Routing,
        used: &[u32],
        on_cpu: &[u32],
    ) -> Result<(), GgmlError> {
        let (il, hit) = (n.il, n.hit);
        let sel = &routing.sel;
        let addrs = self.addrs(il);
        if !on_cpu.is_empty() {
            // First of all: the CPU's share runs while the host queues the copies below.
            // Per token (sel holds k picks per token).
            let k = sel.len() / n_tokens;
            let picks: Vec<Vec<(u32, f32)>> = sel
                .chunks_exact(k)
                .zip(routing.weights.chunks_exact(k))
                .map(|(s, w)| {
                    s.iter()
                        .zip(w)
                        .filter(|(e, _)| on_cpu.contains(e))
                        .map(|(&e, &w)| (e, w))
                        .collect()
                })
                .collect();
            // Each CPU expert's weights are read once, whatever the tokens using it.
            self.stats.cpu_bytes += addrs.expert_bytes() * on_cpu.len() as u64;
            let cpu = self.cpu.as_mut().expect("CPU channel enabled");
            cpu.start(il, n.act, routing.x.clone(), picks);
            self.cpu_job_started(on_cpu.len(), addrs.expert_bytes());
        }
        let now = self.step;
        let shares = self.shares;
        let devs: Vec<usize> = (0..shares).map(|s| self.share_device(il, s)).collect();
        // Gated (the graph is queued ahead, behind the gate): everything below goes on the copy
        // stream, after the previous layer's prefetches, and the gate opens after it; where
        // every pick hit on the device the GPU opened it itself and nothing is written. Else the
        // previous layer's prefetches into this layer's slots land before anything queued on
        // the compute stream from here: the miss copies below (which may reuse a slot a
        // prefetch is still filling) and the expert matmuls (on each share's device).
        let gate = self.gate_stop.take();
        let fast = gate.is_some_and(|g| g.fast);
        if gate.is_none() {
            for &d in &devs {
                self.parts[d].xfer.fence()?;
            }
        }
        let layer = self.layers[il].as_mut().expect("offloaded layer");
        let st = &mut self.stats.layers[il];
        let mut h2d = vec![0u64; shares];
        // This stop's counters per share (expert parallelism: per device; none with one share).
        let mut by = LayerStats::per_share(shares);
        let mut copies = Vec::new();
        for &e in used {
            let s = layer.owner(e);
            let hit = layer.slot(e).is_some();
            let cpu = !hit && on_cpu.contains(&e);
            st.count_use(hit, cpu);
            if let Some(b) = by.get_mut(s) {
                b.count_use(hit, cpu);
            }
            if hit || cpu {
                continue;
            }
            if fast {
                return Err(GgmlError::Tensor {
                    name: format!("expert table of layer {il}"),
                    msg: format!("the device found expert {e} resident, the cache does not"),
                });
            }
            st.copies += 1;
            let cache = layer.cache_mut(e);
            let (slot, _) =
                cache
                    .admit(e, &|r| used.contains(&r), now)
                    .ok_or_else(|| GgmlError::Tensor {
                        name: format!("expert cache of layer {il}"),
                        msg: format!(
                            "{} experts needed at once, {} slots",
                            used.len(),
                            cache.n_slots()
                        ),
                    })?;
            copies.push((s, slot, e));
            h2d[s] += addrs.expert_bytes();
        }
        for &e in used {
            layer.cache_mut(e).touch(e, now);
        }
        // Control per share: slot ids and the mask; a pick of another share or of the CPU
        // points at a free slot id with weight 0.
        // None where the GPU ran on with what it gathered (nothing to write).
        let ctl: Vec<(Vec<i32>, Vec<f32>)> = (0..shares)
            .filter(|_| !fast)
            .map(|s| {
                let cache = &layer.caches[s];
                let mine = |e: u32| layer.owner(e) == s;
                let ids = control_ids(sel, n_tokens, cache.n_slots(), |e| {
                    cache.slot(e).filter(|_| mine(e)).map(|s| s as usize)
                });
                let mask: Vec<f32> = sel
                    .iter()
                    .map(|&e| {
                        if mine(e) && !on_cpu.contains(&e) {
                            1.0
                        } else {
                            0.0
                        }
                    })
                    .collect();
                (ids, mask)
            })
            .collect();
        super::trace::with(|r, now| r.decided = now);
        for (s, slot, e) in copies {
            let backend = self.parts[devs[s]].backend.clone();
            let addrs = self.addrs_of(il, s);
            for (m, a) in addrs.mats() {
                let Some(t) = self.slot_tensor(il, m, s) else {
                    continue;
                };
                let eb = a.expert_bytes;
                if gate.is_some() {
                    let (dst, src) = (t.data_addr() + slot as usize * eb, a.in_store(e));
                    self.parts[devs[s]].xfer.copy(dst, src, eb)?;
                    continue;
                }
                // SAFETY: the store is page-locked host memory that lives, unchanged,
                // as long as the engine; the slot tensor lies in the share's device's buffer,
                // whose compute backend queues the write.
                unsafe { t.write_async(&backend, slot as usize * eb, a.in_store(e), eb) }?;
            }
        }
        if on_cpu.is_empty() && self.cpu_dirty[il] {
            // The CPU-result tensor still holds an earlier step's share: zero it.
            self.cpu_dirty[il] = false;
            let zeros = vec![0u8; 4 * self.n_embd * n_tokens];
            self.ctl_cpu(il).write_bytes_at(0, &zeros)?;
        }
        self.book_copies(il, &devs, &h2d, by);
        let n = sel.len();
        let base = self.scratch_base();
        let lay = ScratchLayout::new(base, n, routing.pred.len(), shares);
        assert!(lay.end <= base + self.scratch_len);
        for (s, (ids, mask)) in ctl.iter().enumerate() {
            let at = lay.ctl_of(s);
            let c = self.ctl(il, s);
            let backend = self.parts[devs[s]].backend.clone();
            // SAFETY: [at, at + 8n) lies in the live host scratch (asserted), 4-aligned, one
            // region per share; no copy reading it is pending (every stop follows a
            // synchronisation of the compute streams, or, gated, the landing of the last stop's
            // copies, which the gate the graph passed since waited for), and nothing writes it
            // again before the next stop, so the queued copies read it unchanged.
            unsafe {
                let p = at as *mut i32;
                std::ptr::copy_nonoverlapping(ids.as_ptr(), p, n);
                std::ptr::copy_nonoverlapping(mask.as_ptr(), p.add(n).cast::<f32>(), n);
                if gate.is_none() && hit.is_none() {
                    c.ids.write_async(&backend, 0, at, 4 * n)?;
                    c.mask.write_async(&backend, 0, at + 4 * n, 4 * n)?;
                }
            }
        }
        if let (None, Some(_)) = (gate, hit) {
            // The eval-hook path in table form: the graph gathers the picks' slots from the
            // table after this stop.
            self.flush_table(il, &[], true)?;
        }
        if let Some(g) = gate.filter(|g| !g.fast) {
            // Gated, on the host's plan: the slot ids and mask on the copy stream (in table
            // form over what the graph gathered, after the table for later steps), then the gate.
            let (ids_at, mask_at) = match hit {
                Some(h) => {
                    self.flush_table(il, &[], false)?;
                    (h.ids, h.mask)
                }
                None => {
                    let c = self.ctl(il, 0);
                    (c.ids.data_addr(), c.mask.data_addr())
                }
            };
            let at = lay.ctl_of(0);
            let xfer = self.xfer(il);
            xfer.copy(ids_at, at, 4 * n)?;
            xfer.copy(mask_at, at + 4 * n, 4 * n)?;
            xfer.mark_copies()?;
            if on_cpu.is_empty() {
                g.open_all(xfer)?;
                super::trace::with(|r, now| r.open = now);
            } else if g.joined.is_some() {
                // Split form: the GPU's experts run beside the CPU's job.
                g.open.open(xfer)?;
            }
        }
        // When this stop's copies should have landed (the gate waits for them, not for the
        // prefetches queued next): a gated join's slack is measured against it. In split form
        // too: the host joins as soon as it has queued the stop, while the GPU's experts wait
        // for the copies and then run beside the job, so a join against itself read every
        // job as the step waiting (H100, uniform routing, 2026-12-06: correction +56/+83 us,
        // 10-19 jobs a step against 17-34 without the split, 64.3 against 72.3 t/s at 8 GiB).
        let copies_land = gate.and_then(|_| self.miss.copy_idle_at(devs[0]));
        let landed = match self.planned.take() {
            // Gated: the stop planned the next layer's prefetch as soon as it read the routing
            // (opening the next stop's gathers); its copies follow this stop's own.
            Some(p) => self.queue_prefetch(p)?,
            None if gate.is_none() || hit.is_none() => {
                self.prefetch_after(il, &routing.pred)?;
                None
            }
            None => None,
        };
        if let (Some(g), false) = (gate, on_cpu.is_empty()) {
            // The CPU's share joins before the gate opens: the graph queued behind it adds it.
            // Behind this stop's copies (the last marked before the prefetch's).
            self.join_cpu(il, n_tokens, copies_land)?;
            g.open_all(self.xfer(il))?;
            super::trace::with(|r, now| r.open = now);
        }
        // The next stop's experts, behind the prefetch's copies.
        self.open_pre(il, landed)
    }
}

/// The slot id of each pick (`sel`: k experts per token, `slot_of`: an expert's slot if cached).
/// A pick without a slot (the CPU channel's, masked to weight 0) gets the lowest slot id that
/// none of its token's other picks uses: ggml-cuda's batched mul_mat_id (more than 8 tokens)
/// groups rows by expert assuming a token names each at most once, and overran its buffers
/// (an illegal memory access on the H200 at 16 tokens) when every CPU pick pointed at slot 0.
pub(super) fn control_ids(
    sel: &[u32],
    n_tokens: usize,
    n_slots: usize,
    slot_of: impl Fn(u32) -> Option<usize>,
) -> Vec<i32> {
    let k = sel.len() / n_tokens.max(1);
    let mut ids = Vec::with_capacity(sel.len());
    for tok in sel.chunks_exact(k.max(1)) {
        let slots: Vec<Option<usize>> = tok.iter().map(|&e| slot_of(e)).collect();
        let mut free = (0..n_slots).filter(|s| !slots.contains(&Some(*s)));
        for s in &slots {
            // With fewer slots than a token's picks, ids repeat: only a single-token step
            // (ggml's per-row kernels) has so few.
            ids.push(s.or_else(|| free.next()).unwrap_or(0) as i32);
        }
    }
    ids
}

#[cfg(test)]
mod tests {
    use super::control_ids;

    #[test]
    fn cpu_picks_get_distinct_unused_slot_ids_per_token() {
        // 2 tokens, k = 3, 4 slots: expert 10 in slot 2, 11 in slot 0; the others on the CPU.
        let slot_of = |e: u32| match e {
            10 => Some(2),
            11 => Some(0),
            _ => None,
        };
        let ids = control_ids(&[10, 5, 6, 7, 11, 8], 2, 4, slot_of);
        assert_eq!(ids, [2, 0, 1, 1, 0, 2]);
        for tok in ids.chunks(3) {
            let mut t = tok.to_vec();
            t.dedup();
            t.sort();
            t.dedup();
            assert_eq!(t.len(), 3, "ids repeat within a token: {tok:?}");
        }
        // Fewer slots than picks: what is left repeats 0 (single-token steps only).
        assert_eq!(control_ids(&[5, 6, 7], 1, 1, |_| None), [0, 0, 0]);
    }
}
