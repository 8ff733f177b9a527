//! Direct decode's prefetches: at a direct stop, or following a step through its mailboxes
//! (see `direct`), predicted experts copied into slots on the copy stream, each followed there by
//! the flip of its table entries.
use super::direct::{FOLLOW_TIMEOUT, UNWRITTEN};
use super::*;

impl Offload {
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
        for il in nodes.direct.iter().map(|d| d.il) {
            let Some(j) = self.next_offloaded(il) else {
                continue;
            };
            let at = self.mailbox_of(il).logits;
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
                layer.pending.push(Pending {
                    expert: e,
                    slot,
                    step: now,
                });
                self.fetch_and_flip(j, e, slot)?;
                fetched.push(e);
            }
            self.record_prefetch(j, fetched, predicted);
        }
        Ok(())
    }

    /// Queues on the copy stream the copy of expert `e` of layer `j` into `slot`, each matrix
    /// followed by the flip of its table entry to the slot: the layer reads the expert from the
    /// slot once it has landed, in place before. Counts the bytes.
    pub(super) fn fetch_and_flip(&mut self, j: usize, e: u32, slot: u32) -> Result<(), GgmlError> {
        let remap = self.remap().data_addr();
        let addrs = self.addrs(j);
        for (m, a) in addrs.mats() {
            self.xfer
                .copy(a.in_slot(slot), a.in_store(e), a.expert_bytes)?;
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
        self.stats.h2d_bytes += addrs.expert_bytes();
        Ok(())
    }

    /// Counts a layer's prefetches and remembers them, and its prediction, for the step's end.
    pub(super) fn record_prefetch(&mut self, j: usize, fetched: Vec<u32>, predicted: Vec<u32>) {
        let st = &mut self.stats.layers[j];
        st.prefetched += fetched.len() as u64;
        st.copies += fetched.len() as u64;
        let layer = self.layers[j].as_mut().expect("offloaded layer");
        layer.prefetched = fetched;
        layer.predicted = predicted;
    }

    pub(super) fn check_expert(&self, il: usize, e: i32) -> Result<u32, GgmlError> {
        u32::try_from(e)
            .ok()
            .filter(|&e| (e as usize) < self.n_expert)
            .ok_or_else(|| GgmlError::Tensor {
                name: format!("ffn_moe_topk-{il}"),
                msg: format!("router selected expert {e}, outside 0..{}", self.n_expert),
            })
    }

    pub(super) fn table_bytes(&self) -> usize {
        4 * 3 * self.n_expert * self.layers.len()
    }

    /// Byte offset of the table cell of layer `il`, matrix `m`, expert `e` (in the device table,
    /// the mirror, and the flip cells after it).
    pub(super) fn cell(&self, il: usize, m: ExpertMat, e: u32) -> usize {
        4 * ((3 * il + m.index()) * self.n_expert + e as usize)
    }

    /// Sets layer `il`'s table entries of expert `e` in the mirror to `slot` (or to its place in
    /// the store) and queues their upload on the compute stream: work queued after this sees them.
    pub(super) fn set_entry(
        &mut self,
        il: usize,
        e: u32,
        slot: Option<u32>,
    ) -> Result<(), GgmlError> {
        let bases = self.layers[il]
            .as_ref()
            .and_then(|l| l.direct_base)
            .expect("a direct layer");
        let remap = self.remap();
        for (m, base) in ExpertMat::ALL.into_iter().zip(bases) {
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
        for (i, p) in d.preds.iter().enumerate() {
            self.xfer
                .read(pred_at + 4 * n_expert * i, p.logits_addr, 4 * n_expert)?;
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
        let addrs = self.addrs(il);
        let backend = self.backend.clone();
        for &e in &used {
            let layer = self.layers[il].as_mut().expect("offloaded layer");
            if layer.cache.slot(e).is_some() {
                continue; // resident, or landing (then read in place until it has)
            }
            let pending = &layer.pending;
            let keep = |r: u32| used.contains(&r) || pending.iter().any(|p| p.expert == r);
            let Some((slot, victim)) = layer.cache.admit(e, &keep, now) else {
                continue; // read in place
            };
            layer.copied_at_stop.push(e);
            if let Some(v) = victim {
                self.set_entry(il, v, None)?;
            }
            for (m, a) in addrs.mats() {
                let Some(t) = self.slot_tensor(il, m) else {
                    continue;
                };
                let eb = a.expert_bytes;
                // SAFETY: the store is page-locked host memory that lives, unchanged, as long as
                // the engine; the slot tensor lies in the compute backend's buffer.
                unsafe { t.write_async(&backend, slot as usize * eb, a.in_store(e), eb) }?;
            }
            self.set_entry(il, e, Some(slot))?;
            self.stats.layers[il].copies += 1;
            self.stats.h2d_bytes += addrs.expert_bytes();
        }
        // Prefetch for the predicted layers.
        for (i, j) in d.preds.iter().map(|p| p.il).enumerate() {
            let predicted =
                predicted_experts(&preds[n_expert * i..n_expert * (i + 1)], n_expert, k);
            let mut fetched = Vec::new();
            for &e in &predicted {
                let layer = self.layers[j].as_mut().expect("offloaded layer");
                if layer.cache.slot(e).is_some() {
                    continue;
                }
                let pending = &layer.pending;
                let keep = |r: u32| predicted.contains(&r) || pending.iter().any(|p| p.expert == r);
                let Some((slot, victim)) = layer.cache.admit(e, &keep, now) else {
                    break;
                };
                layer.pending.push(Pending {
                    expert: e,
                    slot,
                    step: now,
                });
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
