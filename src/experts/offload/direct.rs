//! Stop-free single-token decode ([`Mode::Direct`]): the cache protocol around a step whose
//! offloaded layers read their experts through a device-side id table, so the graph need not
//! stop for the host to place them.
//!
//! Why: a stop costs a host round trip with the GPU idle (30-90 µs on the H200, one per
//! offloaded layer, 48 per token on Qwen3-30B-A3B). Reading a miss in place costs what copying
//! it costs: a GPU kernel reads page-locked host memory at 44–49 GB/s, the copy engine at
//! 47–52 GB/s (`scripts/probe/zerocopy.cu` on the H200). So the graph maps expert ids to slots
//! on the device, a miss reads the host store where it lies, and the cache is maintained around
//! the step.
//!
//! Three ways to keep the cache, switched by `OffloadOptions` (`POCKETMOE_STOP_EVERY`,
//! `POCKETMOE_ADMIT`, experiments until one wins):
//! - no stops (`stop_every = 0`): misses are admitted after the step ([`Admit`]: sync, async,
//!   off);
//! - a stop every `stop_every` offloaded layers ([`Offload::on_direct_stop`]): the stop copies
//!   its own layer's misses in and prefetches the next layers' FATE-predicted experts on the
//!   copy stream, each copy followed there by the flip of its table entries;
//! - a followed step ([`Admit::Prefetch`], no stops): the GPU writes each layer's ids and the
//!   next layer's predicted router logits into page-locked mailboxes, and the host, following
//!   the running graph, prefetches predicted experts into free slots (flips as above); victims
//!   are freed between steps, so no slot a step may read is ever written during it.
//!
//! Measured (H200, session 6, `docs/bench-h200.md`): all three are exact, and none is faster
//! than the stopping path (`experts::step`, `slots`) yet — without stops a prefetch that lands
//! after its layer ran is a miss read in place, so the hit rate falls (99% to 89-95%), and the
//! step's GPU time stays at 7.5-8 ms against ~4.5 ms resident. Off by default
//! (`EngineOptions::direct_decode`).
//!
//! Before the step ([`Offload::begin_direct`]): admissions whose copies have landed become
//! resident; the id table (per layer and matrix, an expert's slot when resident, else its place
//! in the store, see `alloc::direct_base`) is written to page-locked memory and its upload
//! queued on the compute stream, ahead of the step's graph.
//! After the step ([`Offload::end_direct`]): every direct layer's selected ids are read back
//! (one wait), hits and in-place misses counted, the policy touched, and misses admitted
//! ([`Admit`]), their copies queued on the copy stream.
//!
//! Invariants:
//! - A step reads slot `s` for expert `e` only when its table says so, and the table says so
//!   only once `e`'s copy into `s` has landed (`Sync`: the compute stream waits for the copies
//!   on the device before the next step; `Async`: promoted only after the host waited for the
//!   copy of that step's admissions, two steps later).
//! - A slot being filled is read by no step: its previous expert was evicted after the step
//!   that last read it had finished, and the next table maps that expert to the store.
//! - The mirror is rewritten only after the step that uploaded it has finished (the engine
//!   synchronises every step).
use super::*;
use crate::experts::stats::LayerStats;

impl Offload {
    /// Before a step with direct layers: promotes landed admissions and queues the upload of
    /// the id table on the compute stream.
    pub fn begin_direct(&mut self) -> Result<(), GgmlError> {
        let now = self.step;
        // Admissions queued after the step before last: long landed unless PCIe is saturated,
        // and then this wait is the back-pressure that keeps admissions within its bandwidth.
        let landed = |t: u64| t + 2 <= now;
        let old = self
            .layers
            .iter()
            .flatten()
            .flat_map(|l| l.pending.iter().map(|p| p.step))
            .filter(|&t| landed(t))
            .max();
        if let Some(tag) = old {
            let t0 = std::time::Instant::now();
            self.xfer.wait_mark(tag)?;
            self.stats.wait_copy_s += t0.elapsed().as_secs_f64();
            for l in self.layers.iter_mut().flatten() {
                l.pending.retain(|p| !landed(p.step));
            }
        }
        let n_expert = self.n_expert;
        let table_len = 3 * n_expert * self.layers.len();
        // SAFETY: the mirror is a live page-locked buffer of at least `table_len` i32 (sized in
        // `load`), 4-aligned, not shared; its previous upload finished with the previous step.
        let table = unsafe { std::slice::from_raw_parts_mut(self.mirror as *mut i32, table_len) };
        for (il, l) in self.layers.iter().enumerate() {
            let Some((l, bases)) = l.as_ref().and_then(|l| Some((l, l.direct_base?))) else {
                continue;
            };
            for (m, base) in bases.iter().enumerate() {
                let Some(base) = base else { continue };
                let row = &mut table[(3 * il + m) * n_expert..][..n_expert];
                for (e, id) in row.iter_mut().enumerate() {
                    let e = e as u32;
                    *id = match l.cache.slot(e) {
                        Some(s) if !l.pending.iter().any(|p| (p.expert, p.slot) == (e, s)) => {
                            s as i32
                        }
                        _ => base + e as i32,
                    };
                }
            }
        }
        if self.follows() {
            // Mailboxes to "not written yet": no id or logit the GPU writes has these bits.
            let n = (self.k + n_expert) * self.layers.len();
            // SAFETY: the live page-locked mailbox buffer, sized for this in `load`; the GPU
            // writes it only during the step, which has not been launched yet.
            let words = unsafe { std::slice::from_raw_parts_mut(self.mailbox as *mut u32, n) };
            words.fill(UNWRITTEN);
        }
        let remap = self.remap();
        // SAFETY: the mirror stays unchanged until the compute stream ran this copy (see the
        // module's invariants); the table tensor lives in the compute backend's buffer.
        unsafe { remap.write_async(&self.backend, 0, self.mirror, 4 * table_len) }
    }

    /// After a step with direct layers: reads their routing and which picks hit a slot,
    /// counts, and (without stops) admits misses; with stops, waits for the step's prefetches
    /// and makes them resident.
    pub fn end_direct(&mut self, nodes: &GraphNodes) -> Result<(), GgmlError> {
        if self.follows() {
            return self.end_followed(nodes);
        }
        let k = self.k;
        let n_direct = nodes.direct.len();
        let reads = self.mirror + 2 * self.table_bytes();
        let ids_at = reads + 4 * k * n_direct;
        assert!(
            ids_at + 4 * k * n_direct <= self.mirror + self.mirror_len,
            "routing read-back in the mirror"
        );
        for (i, d) in nodes.direct.iter().enumerate() {
            self.xfer.read(reads + 4 * k * i, d.sel_addr, 4 * k)?;
            self.xfer.read(ids_at + 4 * k * i, d.ids_addr, 4 * k)?;
        }
        let t0 = std::time::Instant::now();
        self.xfer.wait_reads()?;
        self.stats.wait_copy_s += t0.elapsed().as_secs_f64();
        // SAFETY: `2k` i32 per direct layer, just written by the waited reads, inside the mirror
        // buffer (sized for `2k` per layer after the table and the flip cells).
        let (sel, ids) = unsafe {
            (
                std::slice::from_raw_parts(reads as *const i32, k * n_direct),
                std::slice::from_raw_parts(ids_at as *const i32, k * n_direct),
            )
        };
        let admit = if self.opts.stop_every > 0 {
            Admit::Off // the stops admitted (their own misses, and prefetches)
        } else {
            self.opts.admit
        };
        let now = self.step;
        let n_slots = self.n_slots as i32;
        let mut queued = false;
        for (i, il) in nodes.direct.iter().map(|d| d.il).enumerate() {
            let picks = k * i..k * (i + 1);
            let mut used: Vec<(u32, bool)> = Vec::with_capacity(k);
            for (&e, &id) in sel[picks.clone()].iter().zip(&ids[picks]) {
                let e = self.check_expert(il, e)?;
                if !used.iter().any(|u| u.0 == e) {
                    used.push((e, (0..n_slots).contains(&id)));
                }
            }
            let addrs = self.addrs(il);
            let expert_bytes = addrs.expert_bytes();
            let layer = self.layers[il].as_mut().expect("offloaded layer");
            let st = &mut self.stats.layers[il];
            count_predictions(layer, st, &used);
            for &(e, in_slot) in &used {
                if layer.copied_at_stop.contains(&e) {
                    st.misses += 1; // copied in at the stop (counted there)
                } else if in_slot {
                    st.hits += 1;
                } else {
                    st.misses += 1;
                    st.in_place += 1;
                    self.stats.h2d_bytes += expert_bytes;
                }
                layer.cache.touch(e, now);
            }
            layer.copied_at_stop.clear();
            if admit == Admit::Off {
                continue;
            }
            let used: Vec<u32> = used.iter().map(|u| u.0).collect();
            for &e in &used {
                if layer.cache.slot(e).is_some() {
                    continue;
                }
                let pending = &layer.pending;
                let keep = |r: u32| used.contains(&r) || pending.iter().any(|p| p.expert == r);
                let Some((slot, _)) = layer.cache.admit(e, &keep, now) else {
                    break; // every slot holds an expert this step used or one still landing
                };
                for (_, a) in addrs.mats() {
                    self.xfer
                        .copy(a.in_slot(slot), a.in_store(e), a.expert_bytes)?;
                }
                st.copies += 1;
                self.stats.h2d_bytes += expert_bytes;
                queued = true;
                if admit == Admit::Async {
                    layer.pending.push(Pending {
                        expert: e,
                        slot,
                        step: now,
                    });
                }
            }
        }
        if self.opts.stop_every > 0 {
            // The step's prefetches (copies and their table flips) have long landed unless PCIe
            // is saturated; then this wait is the back-pressure. They are resident from now on.
            let t0 = std::time::Instant::now();
            self.xfer.wait()?;
            self.stats.wait_copy_s += t0.elapsed().as_secs_f64();
            for l in self.layers.iter_mut().flatten() {
                l.pending.clear();
            }
        } else if queued {
            match admit {
                // The next step's table upload and graph queue after this, on the device.
                Admit::Sync => self.xfer.fence()?,
                Admit::Async => self.xfer.mark(now)?,
                Admit::Off | Admit::Prefetch => {}
            }
        }
        Ok(())
    }

    /// After a followed step: the ids in the mailboxes say which picks hit a slot; counts and
    /// touches; waits for the step's prefetches (resident from now on); frees slots for the
    /// next step's prefetches (the policy's victims among experts this step did not use).
    pub(super) fn end_followed(&mut self, nodes: &GraphNodes) -> Result<(), GgmlError> {
        let (k, now) = (self.k, self.step);
        for il in nodes.direct.iter().map(|d| d.il) {
            let ids_at = self.mailbox_of(il).ids;
            // SAFETY: the live mailbox, written by the finished step (the engine synchronised).
            let ids = unsafe { std::slice::from_raw_parts(ids_at as *const i32, k) }.to_vec();
            let base = self.layers[il]
                .as_ref()
                .and_then(|l| l.direct_base)
                .and_then(|b| b[0])
                .expect("a direct layer's up matrix");
            let expert_bytes = self.addrs(il).expert_bytes();
            let n_slots = self.n_slots as i32;
            let layer = self.layers[il].as_mut().expect("offloaded layer");
            let mut used: Vec<(u32, bool)> = Vec::with_capacity(k);
            for id in ids {
                let (e, hit) = if (0..n_slots).contains(&id) {
                    let e = layer
                        .cache
                        .expert_in(id as u32)
                        .ok_or_else(|| GgmlError::Tensor {
                            name: format!("ffn_moe_direct_ids0-{il}"),
                            msg: format!("the step read slot {id}, which holds no expert"),
                        })?;
                    (e, true)
                } else {
                    let e = id.wrapping_sub(base);
                    (self_check(il, e, self.n_expert)?, false)
                };
                if !used.iter().any(|u| u.0 == e) {
                    used.push((e, hit));
                }
            }
            let st = &mut self.stats.layers[il];
            count_predictions(layer, st, &used);
            for &(e, hit) in &used {
                if hit {
                    st.hits += 1;
                } else {
                    st.misses += 1;
                    st.in_place += 1;
                    self.stats.h2d_bytes += expert_bytes;
                }
                layer.cache.touch(e, now);
            }
            let keep: Vec<u32> = used.iter().map(|u| u.0).collect();
            let free = (k.min(layer.cache.n_slots() / 4)).max(1);
            while layer.cache.n_free() < free {
                if layer.cache.free_one(&|r| keep.contains(&r), now).is_none() {
                    break;
                }
            }
        }
        let t0 = std::time::Instant::now();
        self.xfer.wait()?;
        self.stats.wait_copy_s += t0.elapsed().as_secs_f64();
        for l in self.layers.iter_mut().flatten() {
            l.pending.clear();
        }
        Ok(())
    }
}

/// A mailbox word the GPU has not written yet (as i32, beyond any id; as f32, a NaN).
pub(super) const UNWRITTEN: u32 = 0x7fff_ffff;

/// How long the host follows a step before calling the GPU stuck.
pub(super) const FOLLOW_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

fn self_check(il: usize, e: i32, n_expert: usize) -> Result<u32, GgmlError> {
    u32::try_from(e)
        .ok()
        .filter(|&e| (e as usize) < n_expert)
        .ok_or_else(|| GgmlError::Tensor {
            name: format!("ffn_moe_direct_ids0-{il}"),
            msg: format!("the step read expert {e} in place, outside 0..{n_expert}"),
        })
}

/// Counts the experts a step used, and how many of them the layer's prefetch had fetched and
/// its prediction had named; clears both for the next step.
pub(super) fn count_predictions(layer: &mut Layer, st: &mut LayerStats, used: &[(u32, bool)]) {
    let was_used = |e: &&u32| used.iter().any(|u| u.0 == **e);
    st.used += used.len() as u64;
    st.prefetch_used += layer.prefetched.iter().filter(was_used).count() as u64;
    st.predicted_used += layer.predicted.iter().filter(was_used).count() as u64;
    layer.prefetched.clear();
    layer.predicted.clear();
}
