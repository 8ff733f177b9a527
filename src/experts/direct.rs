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
//! than the stopping path (`experts::step`) yet — without stops a prefetch that lands after its
//! layer ran is a miss read in place, so the hit rate falls (99% to 89-95%), and the step's GPU
//! time stays at 7.5-8 ms against ~4.5 ms resident. Off by default (`EngineOptions::direct_decode`).
//!
//! Before the step ([`Offload::begin_direct`]): admissions whose copies have landed become
//! resident; the id table (per layer and matrix, an expert's slot when resident, else its place
//! in the store, see `offload::direct_base`) is written to page-locked memory and its upload
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
use super::offload::{Admit, Layer, Offload};
use super::stats::LayerStats;
use super::step::{predicted_experts, DirectStop, GraphNodes};
use crate::ggml::GgmlError;

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
            .flat_map(|l| l.pending.iter().map(|p| p.2))
            .filter(|&t| landed(t))
            .max();
        if let Some(tag) = old {
            let t0 = std::time::Instant::now();
            self.xfer.wait_mark(tag)?;
            self.stats.wait_copy_s += t0.elapsed().as_secs_f64();
            for l in self.layers.iter_mut().flatten() {
                l.pending.retain(|p| !landed(p.2));
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
                        Some(s) if !l.pending.iter().any(|p| (p.0, p.1) == (e, s)) => s as i32,
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

    /// While a followed step runs ([`Admit::Prefetch`]): in layer order, waits for each layer's
    /// prediction of the next layer's routing in its mailbox, and prefetches the predicted
    /// experts that are not resident into free slots of that layer, each copy followed on the
    /// copy stream by the flip of its table entries (the layer reads a prefetched expert from its
    /// slot once that has landed, in place before). No slot the step may read is written: only
    /// free slots are filled, and slots are freed between steps.
    pub fn follow_step(&mut self, nodes: &GraphNodes) -> Result<(), GgmlError> {
        let (k, n_expert, now) = (self.k, self.n_expert, self.step);
        if std::env::var("POCKETMOE_MBOX_PRED").is_ok_and(|v| v == "0") {
            return Ok(());
        }
        for &(il, _, _) in &nodes.direct {
            let Some(j) = self.next_offloaded(il) else {
                continue;
            };
            let (_, at) = self.mailbox_of(il);
            let t0 = std::time::Instant::now();
            let logits = loop {
                // SAFETY: the live page-locked mailbox; the GPU writes it during the step, each
                // 4-byte value at once; volatile reads see its writes as they land.
                let v: Vec<u32> = (0..n_expert)
                    .map(|i| unsafe { std::ptr::read_volatile((at as *const u32).add(i)) })
                    .collect();
                if v.iter().all(|&w| w != UNWRITTEN) {
                    break v.into_iter().map(f32::from_bits).collect::<Vec<f32>>();
                }
                if t0.elapsed() > FOLLOW_TIMEOUT {
                    return Err(GgmlError::Tensor {
                        name: format!("ffn_moe_pred_logits-{il}"),
                        msg: format!("not written by the GPU within {FOLLOW_TIMEOUT:?}"),
                    });
                }
                std::hint::spin_loop();
            };
            self.stats.follow_wait_s += t0.elapsed().as_secs_f64();
            let predicted = predicted_experts(&logits, n_expert, k);
            let mut fetched = Vec::new();
            for &e in &predicted {
                let layer = self.layers[j].as_mut().expect("offloaded layer");
                if layer.cache.slot(e).is_some() || layer.cache.n_free() == 0 {
                    continue;
                }
                let (slot, victim) = layer
                    .cache
                    .admit(e, &|_| true, now)
                    .expect("a free slot was counted");
                debug_assert!(victim.is_none(), "follow_step evicts nothing");
                layer.pending.push((e, slot, now));
                self.fetch_and_flip(j, e, slot)?;
                fetched.push(e);
            }
            self.record_prefetch(j, fetched, predicted);
        }
        Ok(())
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
        for (i, &(_, sel, ids)) in nodes.direct.iter().enumerate() {
            self.xfer.read(reads + 4 * k * i, sel, 4 * k)?;
            self.xfer.read(ids_at + 4 * k * i, ids, 4 * k)?;
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
        for (i, &(il, _, _)) in nodes.direct.iter().enumerate() {
            let picks = k * i..k * (i + 1);
            let mut used: Vec<(u32, bool)> = Vec::with_capacity(k);
            for (&e, &id) in sel[picks.clone()].iter().zip(&ids[picks]) {
                let e = self.check_expert(il, e)?;
                if !used.iter().any(|u| u.0 == e) {
                    used.push((e, (0..n_slots).contains(&id)));
                }
            }
            let bases = self.bases(il);
            let expert_bytes: u64 = bases.iter().flatten().map(|b| b.3 as u64).sum();
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
                let keep = |r: u32| used.contains(&r) || pending.iter().any(|p| p.0 == r);
                let Some((slot, _)) = layer.cache.admit(e, &keep, now) else {
                    break; // every slot holds an expert this step used or one still landing
                };
                for (store, slots, _, eb) in bases.iter().flatten().copied() {
                    self.xfer
                        .copy(slots + slot as usize * eb, store + e as usize * eb, eb)?;
                }
                st.copies += 1;
                self.stats.h2d_bytes += expert_bytes;
                queued = true;
                if admit == Admit::Async {
                    layer.pending.push((e, slot, now));
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
    fn end_followed(&mut self, nodes: &GraphNodes) -> Result<(), GgmlError> {
        let (k, now) = (self.k, self.step);
        for &(il, _, _) in &nodes.direct {
            let (ids_at, _) = self.mailbox_of(il);
            // SAFETY: the live mailbox, written by the finished step (the engine synchronised).
            let ids = unsafe { std::slice::from_raw_parts(ids_at as *const i32, k) }.to_vec();
            let base = self.layers[il]
                .as_ref()
                .and_then(|l| l.direct_base)
                .and_then(|b| b[0])
                .expect("a direct layer's up matrix");
            let expert_bytes: u64 = self.bases(il).iter().flatten().map(|b| b.3 as u64).sum();
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

    /// Queues on the copy stream the copy of expert `e` of layer `j` into `slot`, each matrix
    /// followed by the flip of its table entry to the slot: the layer reads the expert from the
    /// slot once it has landed, in place before. Counts the bytes.
    fn fetch_and_flip(&mut self, j: usize, e: u32, slot: u32) -> Result<(), GgmlError> {
        let remap = self.remap().data_addr();
        let bases = self.bases(j);
        for (m, b) in bases.iter().enumerate() {
            let Some((store, slots, _, eb)) = *b else {
                continue;
            };
            self.xfer
                .copy(slots + slot as usize * eb, store + e as usize * eb, eb)?;
            let cell = self.cell(j, m, e);
            let flip = self.mirror + self.table_bytes() + cell;
            assert!(
                flip + 4 <= self.mirror + self.mirror_len,
                "flip cell in the mirror"
            );
            // SAFETY: the flip cell lies in the live mirror buffer; it is written only here, for
            // an expert admitted (pending, so not evictable) this step, and read by the copy
            // stream before the step's end waits for it.
            unsafe { *(flip as *mut i32) = slot as i32 };
            self.xfer.copy(remap + cell, flip, 4)?;
        }
        self.stats.h2d_bytes += bases.iter().flatten().map(|b| b.3 as u64).sum::<u64>();
        Ok(())
    }

    /// Counts a layer's prefetches and remembers them, and its prediction, for the step's end.
    fn record_prefetch(&mut self, j: usize, fetched: Vec<u32>, predicted: Vec<u32>) {
        let st = &mut self.stats.layers[j];
        st.prefetched += fetched.len() as u64;
        st.copies += fetched.len() as u64;
        let layer = self.layers[j].as_mut().expect("offloaded layer");
        layer.prefetched = fetched;
        layer.predicted = predicted;
    }

    fn check_expert(&self, il: usize, e: i32) -> Result<u32, GgmlError> {
        u32::try_from(e)
            .ok()
            .filter(|&e| (e as usize) < self.n_expert)
            .ok_or_else(|| GgmlError::Tensor {
                name: format!("ffn_moe_topk-{il}"),
                msg: format!("router selected expert {e}, outside 0..{}", self.n_expert),
            })
    }

    fn table_bytes(&self) -> usize {
        4 * 3 * self.n_expert * self.layers.len()
    }

    /// Byte offset of the table cell of layer `il`, matrix `m`, expert `e` (in the device table,
    /// the mirror, and the flip cells after it).
    fn cell(&self, il: usize, m: usize, e: u32) -> usize {
        4 * ((3 * il + m) * self.n_expert + e as usize)
    }

    /// Sets layer `il`'s table entries of expert `e` in the mirror to `slot` (or to its place in
    /// the store) and queues their upload on the compute stream: work queued after this sees them.
    fn set_entry(&mut self, il: usize, e: u32, slot: Option<u32>) -> Result<(), GgmlError> {
        let bases = self.layers[il]
            .as_ref()
            .and_then(|l| l.direct_base)
            .expect("a direct layer");
        let remap = self.remap();
        for (m, base) in bases.iter().enumerate() {
            let Some(base) = base else { continue };
            let at = self.cell(il, m, e);
            let v = slot.map_or(base + e as i32, |s| s as i32);
            // SAFETY: the cell lies in the live page-locked mirror (sized in `load`), and keeps
            // this value until the compute stream ran the upload below: the cell changes again
            // only at a later stop or step, after the compute stream has passed this point.
            unsafe {
                *((self.mirror + at) as *mut i32) = v;
                remap.write_async(&self.backend, at, self.mirror + at, 4)?;
            }
        }
        Ok(())
    }

    /// A direct stop at layer `d.il` (the graph waits): copies the layer's own misses in on the
    /// compute stream (they are needed now and then stay cached), and prefetches the predicted
    /// experts of the layers up to the next stop on the copy stream, each followed there by the
    /// flip of its table entries, so a layer reads a prefetched expert from its slot only once
    /// it has landed (before that, in place).
    pub(super) fn on_direct_stop(&mut self, d: &DirectStop) -> Result<(), GgmlError> {
        let (il, k, n_expert) = (d.il, self.k, self.n_expert);
        let sel_at = self.scratch;
        let pred_at = self.scratch + 4 * k.next_multiple_of(64);
        let need = pred_at + 4 * n_expert * d.preds.len();
        if need > self.scratch + self.scratch_len {
            return Err(GgmlError::Tensor {
                name: format!("offload scratch of layer {il}"),
                msg: format!("{} predicted layers do not fit", d.preds.len()),
            });
        }
        self.xfer.read(sel_at, d.sel_addr, 4 * k)?;
        for (i, &(_, addr)) in d.preds.iter().enumerate() {
            self.xfer
                .read(pred_at + 4 * n_expert * i, addr, 4 * n_expert)?;
        }
        let t0 = std::time::Instant::now();
        self.xfer.wait_reads()?;
        self.stats.wait_copy_s += t0.elapsed().as_secs_f64();
        // SAFETY: inside the live scratch (checked above), just written by the waited reads.
        let (sel, preds) = unsafe {
            (
                std::slice::from_raw_parts(sel_at as *const i32, k).to_vec(),
                std::slice::from_raw_parts(pred_at as *const f32, n_expert * d.preds.len())
                    .to_vec(),
            )
        };
        let mut used: Vec<u32> = Vec::with_capacity(k);
        for &e in &sel {
            let e = self.check_expert(il, e)?;
            if !used.contains(&e) {
                used.push(e);
            }
        }
        let now = self.step;
        // This layer's misses: copied on the compute stream ahead of its expert matmuls.
        let bases = self.bases(il);
        let backend = self.backend.clone();
        for &e in &used {
            let layer = self.layers[il].as_mut().expect("offloaded layer");
            if layer.cache.slot(e).is_some() {
                continue; // resident, or landing (then read in place until it has)
            }
            let pending = &layer.pending;
            let keep = |r: u32| used.contains(&r) || pending.iter().any(|p| p.0 == r);
            let Some((slot, victim)) = layer.cache.admit(e, &keep, now) else {
                continue; // read in place
            };
            layer.copied_at_stop.push(e);
            if let Some(v) = victim {
                self.set_entry(il, v, None)?;
            }
            for (m, b) in bases.iter().enumerate() {
                let (Some((store, _, _, eb)), Some(t)) = (*b, self.slot_tensor(il, m)) else {
                    continue;
                };
                // SAFETY: the store is page-locked host memory that lives, unchanged, as long as
                // the engine; the slot tensor lies in the compute backend's buffer.
                unsafe {
                    t.write_async(&backend, slot as usize * eb, store + e as usize * eb, eb)
                }?;
            }
            self.set_entry(il, e, Some(slot))?;
            self.stats.layers[il].copies += 1;
            self.stats.h2d_bytes += bases.iter().flatten().map(|b| b.3 as u64).sum::<u64>();
        }
        // Prefetch for the predicted layers.
        for (i, &(j, _)) in d.preds.iter().enumerate() {
            let predicted =
                predicted_experts(&preds[n_expert * i..n_expert * (i + 1)], n_expert, k);
            let mut fetched = Vec::new();
            for &e in &predicted {
                let layer = self.layers[j].as_mut().expect("offloaded layer");
                if layer.cache.slot(e).is_some() {
                    continue;
                }
                let pending = &layer.pending;
                let keep = |r: u32| predicted.contains(&r) || pending.iter().any(|p| p.0 == r);
                let Some((slot, victim)) = layer.cache.admit(e, &keep, now) else {
                    break;
                };
                layer.pending.push((e, slot, now));
                if let Some(v) = victim {
                    // Before the copy can land in its slot: layer j has not run yet, and reads
                    // the victim in place from here on.
                    self.set_entry(j, v, None)?;
                }
                self.fetch_and_flip(j, e, slot)?;
                fetched.push(e);
            }
            self.record_prefetch(j, fetched, predicted);
        }
        Ok(())
    }
}

/// A mailbox word the GPU has not written yet (as i32, beyond any id; as f32, a NaN).
const UNWRITTEN: u32 = 0x7fff_ffff;

/// How long the host follows a step before calling the GPU stuck.
const FOLLOW_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

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
fn count_predictions(layer: &mut Layer, st: &mut LayerStats, used: &[(u32, bool)]) {
    let was_used = |e: &&u32| used.iter().any(|u| u.0 == **e);
    st.used += used.len() as u64;
    st.prefetch_used += layer.prefetched.iter().filter(was_used).count() as u64;
    st.predicted_used += layer.predicted.iter().filter(was_used).count() as u64;
    layer.prefetched.clear();
    layer.predicted.clear();
}
