//! Stop-free single-token decode ([`Mode::Direct`]): the cache protocol around a step whose
//! offloaded layers never stop the graph.
//!
//! Why: a stop costs a host round trip with the GPU idle (about 90 µs on the H200, one per
//! offloaded layer, 48 per token on Qwen3-30B-A3B: about 30% of a decode step at a 12 GiB
//! budget). Reading a miss in place costs what copying it costs: a GPU kernel reads page-locked
//! host memory at 44–49 GB/s, the copy engine at 47–52 GB/s (`scripts/probe/zerocopy.cu` on
//! the H200). So the graph maps expert ids to slots on the device, a miss reads the host store
//! where it lies, and the cache is maintained between steps.
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
use super::offload::{Admit, Offload, MATS};
use super::step::GraphNodes;
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
        let remap = self.remap();
        // SAFETY: the mirror stays unchanged until the compute stream ran this copy (see the
        // module's invariants); the table tensor lives in the compute backend's buffer.
        unsafe { remap.write_async(&self.backend, 0, self.mirror, 4 * table_len) }
    }

    /// After a step with direct layers: reads their routing, counts, and admits misses.
    pub fn end_direct(&mut self, nodes: &GraphNodes) -> Result<(), GgmlError> {
        let k = self.k;
        let reads = self.mirror + 4 * 3 * self.n_expert * self.layers.len();
        for (i, &(_, addr)) in nodes.direct.iter().enumerate() {
            self.xfer.read(reads + 4 * k * i, addr, 4 * k)?;
        }
        let t0 = std::time::Instant::now();
        self.xfer.wait_reads()?;
        self.stats.wait_copy_s += t0.elapsed().as_secs_f64();
        // SAFETY: `k` i32 per direct layer, just written by the waited reads, inside the mirror
        // buffer (sized for `k` per layer after the table).
        let sel =
            unsafe { std::slice::from_raw_parts(reads as *const i32, k * nodes.direct.len()) };
        let admit = self.opts.admit;
        let now = self.step;
        let mut queued = false;
        for (i, &(il, _)) in nodes.direct.iter().enumerate() {
            let mut used: Vec<u32> = Vec::with_capacity(k);
            for &e in &sel[k * i..k * (i + 1)] {
                let e = u32::try_from(e)
                    .ok()
                    .filter(|&e| (e as usize) < self.n_expert)
                    .ok_or_else(|| GgmlError::Tensor {
                        name: format!("ffn_moe_topk-{il}"),
                        msg: format!("router selected expert {e}, outside 0..{}", self.n_expert),
                    })?;
                if !used.contains(&e) {
                    used.push(e);
                }
            }
            let bases = self.bases(il);
            let expert_bytes: u64 = bases.iter().flatten().map(|b| b.3 as u64).sum();
            let layer = self.layers[il].as_mut().expect("offloaded layer");
            let st = &mut self.stats.layers[il];
            st.used += used.len() as u64;
            for &e in &used {
                match layer.cache.slot(e) {
                    Some(s) if !layer.pending.iter().any(|p| (p.0, p.1) == (e, s)) => st.hits += 1,
                    _ => {
                        st.misses += 1;
                        st.in_place += 1;
                        self.stats.h2d_bytes += expert_bytes;
                    }
                }
                layer.cache.touch(e, now);
            }
            if admit == Admit::Off {
                continue;
            }
            for &e in &used {
                if layer.cache.slot(e).is_some() {
                    continue;
                }
                let pending = &layer.pending;
                let keep = |r: u32| used.contains(&r) || pending.iter().any(|p| p.0 == r);
                let Some((slot, _)) = layer.cache.admit(e, &keep, now) else {
                    break; // every slot holds an expert this step used or one still landing
                };
                for (m, b) in bases.iter().enumerate() {
                    let Some((store, slots, _, eb)) = *b else {
                        continue;
                    };
                    debug_assert!(m < MATS.len());
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
        if queued {
            match admit {
                // The next step's table upload and graph queue after this, on the device.
                Admit::Sync => self.xfer.fence()?,
                Admit::Async => self.xfer.mark(now)?,
                Admit::Off => {}
            }
        }
        Ok(())
    }
}
