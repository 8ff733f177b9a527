//! The CPU channel's share of a decode step's misses: the cost model that picks them (rates
//! measured on the box at the first decode stop, and when the copy engine is next idle), the
//! prefetch budget it sets, and the join of the CPU's result (docs/design.md §4.5).
use super::miss::{secs, GPU_LAYER_S, SECOND_STOP_S};
use super::*;
use crate::experts::stats::LayerStats;
use crate::graph::blocks::ExpertAct;
use std::time::Instant;

/// Whether a CPU channel fit (start cost s, bytes/s) can be a CPU's: a start of at most 2 ms
/// (measured: 58-99 us) and a rate of at most 2 TB/s (no host streams expert weights from
/// DRAM faster; measured 30-72 GB/s). H100 host, 2026-12-05: one fit came out at 16.6 ms and
/// 3,060 TB/s (a disturbed one-expert job, as slow as the k-expert one), priced the CPU out of
/// every split (0.0% of misses on it) and cost that run 11% of its decode.
fn plausible_cpu(start: f64, rate: f64) -> bool {
    start <= 2e-3 && rate <= 2e12
}

impl Offload {
    /// Whether the CPU channel may take some of this step's misses in layer `n.il`: a slot-mode
    /// micro-batch (decode: one token, or one per concurrent request).
    pub(super) fn cpu_candidate(&self, n: &Resolved, n_tokens: usize) -> bool {
        n.mode == Mode::Slots && n_tokens <= self.opts.max_slot_tokens && self.cpu_enabled(n.il)
    }

    /// Which of `used`'s misses the CPU computes: each to the channel that would finish it
    /// first, the copy engine after what it still has queued (the prefetches for this layer),
    /// the CPU after its start cost, so both channels end at about the same time; misses beyond
    /// the slot count must go to the CPU.
    pub(super) fn plan_cpu(&mut self, il: usize, used: &[u32], act: ExpertAct) -> Vec<u32> {
        if !self.miss.measured && self.opts.bandwidths.is_none() {
            self.measure_rates(il, act);
        }
        let layer = self.layers[il].as_ref().expect("offloaded layer");
        let misses: Vec<u32> = used
            .iter()
            .copied()
            .filter(|&e| layer.slot(e).is_none())
            .collect();
        // Per share (its cache, its device's copy engine): the misses beyond its slots must go
        // to the CPU.
        let mut over: Vec<usize> = (0..self.shares)
            .map(|s| {
                let share = used.iter().filter(|&&e| layer.owner(e) == s).count();
                share.saturating_sub(layer.caches[s].n_slots())
            })
            .collect();
        let forced: Vec<bool> = misses
            .iter()
            .map(|&e| {
                let o = &mut over[layer.owner(e)];
                let f = *o > 0;
                *o = o.saturating_sub(1);
                f
            })
            .collect();
        let links: Vec<usize> = misses.iter().map(|&e| layer.owner(e)).collect();
        let now = Instant::now();
        let m = &self.miss;
        let t_pcie: Vec<f64> = (0..self.shares)
            .map(|s| m.copy_backlog(now, self.share_device(il, s)))
            .collect();
        let split = m.split_links(
            &links,
            &t_pcie,
            layer.expert_bytes() as f64,
            m.cpu_start(),
            &forced,
        );
        let cpu: Vec<u32> = misses
            .iter()
            .zip(&split)
            .filter_map(|(&e, &cpu)| cpu.then_some(e))
            .collect();
        if cpu.is_empty() && !misses.is_empty() {
            self.miss.idle_layer();
        }
        super::trace::with(|r, _| {
            (r.used, r.misses, r.cpu) = (used.len(), misses.len(), cpu.len());
            r.backlog = t_pcie.iter().fold(0.0, |a: f64, &b| a.max(b)) * 1e6;
        });
        cpu
    }

    /// Copies of `bytes` were queued on device `dev`'s copy engine (at a stop or a prefetch):
    /// its backlog grows.
    fn copies_queued(&mut self, dev: usize, bytes: u64) {
        if bytes > 0 {
            self.miss.queued(Instant::now(), bytes, dev);
        }
    }

    /// Books the copies just queued for layer `il`: `h2d[s]` bytes to share `s`'s device
    /// `devs[s]`, into the layer's and the engine's counters, each device's copy backlog and,
    /// under expert parallelism, the per-share counters `by` (this stop's, which the caller
    /// filled with the rest of its per-share counts; ignored with one share).
    pub(super) fn book_copies(
        &mut self,
        il: usize,
        devs: &[usize],
        h2d: &[u64],
        mut by: Vec<LayerStats>,
    ) {
        let h2d_all: u64 = h2d.iter().sum();
        self.stats.layers[il].h2d_bytes += h2d_all;
        self.stats.h2d_bytes += h2d_all;
        if self.shares > 1 {
            for (b, &bytes) in by.iter_mut().zip(h2d) {
                b.h2d_bytes += bytes;
            }
            self.stats.add_by_share(&by);
        }
        for (&d, &b) in devs.iter().zip(h2d) {
            self.copies_queued(d, b);
        }
    }

    /// A CPU job of `n` experts of `bytes` each started now.
    pub(super) fn cpu_job_started(&mut self, n: usize, bytes: u64) {
        let m = &mut self.miss;
        let t = m.cpu_start_s + n as f64 * bytes as f64 / m.cpu_bw;
        m.cpu_idle_at = Some(Instant::now() + secs(t));
    }

    /// Of layer `next`'s predicted experts not resident (`cands`, most likely first), how many
    /// to prefetch now: the rest are left to the CPU channel at `next`'s stop, so that the copy
    /// engine (from its backlog, with a head start of the GPU work until that stop) and the CPU
    /// (from that stop) finish together. All of them without the balance or the CPU channel.
    pub(super) fn prefetch_budget(&self, next: usize, cands: &[u32]) -> usize {
        let m = &self.miss;
        if !m.balance || !self.cpu_enabled(next) || cands.is_empty() {
            return cands.len();
        }
        let now = Instant::now();
        let backlog: Vec<f64> = (0..self.shares)
            .map(|s| m.copy_backlog(now, self.share_device(next, s)))
            .collect();
        let cpu_busy = m
            .cpu_idle_at
            .map_or(0.0, |t| t.saturating_duration_since(now).as_secs_f64());
        // The next stop: after this layer's copies and CPU job, then the GPU's work up to it.
        let busiest = backlog.iter().copied().fold(0.0, f64::max);
        let t_stop = busiest.max(cpu_busy) + GPU_LAYER_S;
        let layer = self.layers[next].as_ref().expect("offloaded layer");
        let links: Vec<usize> = cands.iter().map(|&e| layer.owner(e)).collect();
        let split = m.split_links(
            &links,
            &backlog,
            layer.expert_bytes() as f64,
            t_stop + m.cpu_start(),
            &vec![false; cands.len()],
        );
        split.iter().filter(|&&cpu| !cpu).count()
    }

    /// Measures both channels' rates on this box, once, at the first decode stop that may use
    /// the CPU channel: copies of up to 16 of layer `il`'s experts into its staging area (the
    /// copy engine's rate), and CPU jobs of 1 and k experts (the CPU's start cost and rate).
    /// On failure the defaults stay.
    fn measure_rates(&mut self, il: usize, act: ExpertAct) {
        self.miss.measured = true;
        let mut measure = || {
            self.measure_pcie(il)
                .and_then(|p| Ok((p, self.measure_cpu(il, act)?)))
        };
        let mut r = measure();
        if matches!(r, Ok((_, (start, cpu))) if !plausible_cpu(start, cpu)) {
            // A job disturbed (the worker's first run, a page fault storm, the OS): once more.
            r = measure();
        }
        let sane = |x: f64| x.is_finite() && x > 0.0;
        match r {
            Ok((pcie, (start, cpu))) if sane(pcie) && sane(cpu) && plausible_cpu(start, cpu) => {
                let cuda = self.part(il).backend.is_cuda();
                let m = &mut self.miss;
                m.pcie_bw = pcie;
                m.cpu_bw = cpu;
                m.cpu_start_s = start + if cuda { SECOND_STOP_S } else { 0.0 };
                self.stats.channels = Some(m.rates());
                tracing::info!(
                    "miss channels measured: PCIe {:.1} GB/s, CPU {:.1} GB/s + {:.0} us per job",
                    pcie / 1e9,
                    cpu / 1e9,
                    m.cpu_start_s * 1e6
                );
            }
            Ok(r) => tracing::warn!("miss channels measured as {r:?}: using the defaults"),
            Err(e) => tracing::warn!("miss channels not measured ({e}); using the defaults"),
        }
    }

    fn measure_pcie(&mut self, il: usize) -> Result<f64, GgmlError> {
        let addrs = self.addrs(il);
        let n = self.n_expert.min(16) as u32;
        let mut best = f64::INFINITY;
        let xfer = self.xfer(il);
        for _ in 0..3 {
            xfer.wait()?;
            let t0 = Instant::now();
            for e in 0..n {
                for (_, a) in addrs.mats() {
                    xfer.copy(a.in_staging(e), a.in_store(e), a.expert_bytes)?;
                }
            }
            xfer.wait()?;
            best = best.min(t0.elapsed().as_secs_f64());
        }
        Ok(n as f64 * addrs.expert_bytes() as f64 / best.max(1e-9))
    }

    /// (start cost s, bytes/s) from CPU jobs of one and of k experts, best of three each. Every
    /// job reads experts no earlier job read (counting down from the last, away from the first
    /// 16 that [`Offload::measure_pcie`] copied), as a decode step's misses come from DRAM: a
    /// repeated expert is served from the last-level cache (on the H200's host, 105 MiB holds
    /// k Qwen3-30B-A3B experts), which measured the rate at 126 GB/s, twice the DRAM's.
    fn measure_cpu(&mut self, il: usize, act: ExpertAct) -> Result<(f64, f64), GgmlError> {
        let bytes = self.addrs(il).expert_bytes() as f64;
        let n_expert = self.n_expert.max(1) as u32;
        let k = self.k.clamp(2, self.n_expert.max(2)).min(self.n_expert) as u32;
        let x = vec![0.0f32; self.n_embd];
        let cpu = self.cpu.as_mut().ok_or_else(|| GgmlError::Tensor {
            name: "CPU channel".into(),
            msg: "not enabled".into(),
        })?;
        let mut next = 0u32; // experts read so far, counting down from the last
        let mut time = |n: u32| -> Result<f64, GgmlError> {
            let mut best = f64::INFINITY;
            for _ in 0..3 {
                let picks = vec![(0..n)
                    .map(|_| {
                        next += 1;
                        (n_expert - 1 - (next - 1) % n_expert, 1.0)
                    })
                    .collect()];
                let t0 = Instant::now();
                cpu.start(il, act, x.clone(), picks);
                cpu.finish().map_err(|msg| GgmlError::Tensor {
                    name: "CPU channel".into(),
                    msg,
                })?;
                best = best.min(t0.elapsed().as_secs_f64());
            }
            Ok(best)
        };
        let (t1, tk) = (time(1)?, time(k)?);
        if k < 2 {
            return Ok((0.0, bytes / t1.max(1e-9)));
        }
        let per = ((tk - t1) / (k - 1) as f64).max(1e-9);
        Ok(((t1 - per).max(0.0), bytes / per))
    }

    /// The GPU's experts of layer `il` are done (a stop made only when the CPU channel has this
    /// layer's job): put the CPU channel's share in the tensor the graph adds next.
    pub(super) fn on_gpu_out(&mut self, il: usize, n_tokens: usize) -> Result<(), GgmlError> {
        self.join_cpu(il, n_tokens, None)
    }

    /// Joins layer `il`'s CPU job and puts its share where the graph adds it next. The slack
    /// controller learns from the join against what the step would wait for otherwise: on
    /// the eval-hook path the GPU's own experts ran beside the job, so against the join itself;
    /// gated (`copies_land`: when the stop's copies should have landed), the gate opens after
    /// both the job and the copies, so a result that came before the copies left slack too
    /// (the GPU waited on PCIe, not on the CPU), and a join that waited cost the step only
    /// what it waited beyond them. (Against the join alone, the controller read every gated
    /// job as the step waiting and priced the CPU out: H100, skew 0, 8 GiB, 2026-12-05, 26%
    /// of misses on the CPU and 62.8 t/s against 49-51% and 70.3-71.9 t/s with it off.)
    pub(super) fn join_cpu(
        &mut self,
        il: usize,
        n_tokens: usize,
        copies_land: Option<Instant>,
    ) -> Result<(), GgmlError> {
        let n = self.n_embd * n_tokens;
        let Some(cpu) = self.cpu.as_mut().filter(|c| c.pending() == Some(il)) else {
            return Ok(()); // nothing of this layer's to join (waiting would never end)
        };
        tracing::trace!(layer = il, "joining the CPU job");
        let t0 = std::time::Instant::now();
        let (out, times) = cpu.finish().map_err(|msg| GgmlError::Tensor {
            name: format!("CPU experts of layer {il}"),
            msg,
        })?;
        let waited = t0.elapsed().as_secs_f64();
        let behind = copies_land.map_or(0.0, |t| t.saturating_duration_since(t0).as_secs_f64());
        self.miss.observe_join(times.back, waited, behind);
        super::trace::with(|r, _| {
            (r.cpu_wait, r.cpu_compute) = (waited * 1e6, times.compute * 1e6)
        });
        let st = &mut self.stats;
        st.channels = Some(self.miss.rates());
        st.wait_cpu_s += waited;
        st.cpu_jobs += 1;
        st.cpu_handover_s += times.handover;
        st.cpu_prep_s += times.prep;
        st.cpu_compute_s += times.compute;
        st.cpu_back_s += times.back;
        self.miss.cpu_idle_at = None;
        self.cpu_dirty[il] = true;
        assert_eq!(out.len(), n, "CPU result size");
        tracing::trace!(layer = il, "CPU job joined, writing its result");
        // Through ggml's own (synchronous) upload, not the copy engine: waiting on the copy
        // engine here would also wait for the next layer's prefetches.
        self.ctl_cpu(il)
            .write_bytes_at(0, bytemuck::cast_slice(&out))?;
        tracing::trace!(layer = il, "CPU result written");
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_disturbed_cpu_fit_is_not_plausible() {
        // The H100 host's measured fits, and the disturbed one that priced the CPU out.
        assert!(super::plausible_cpu(71e-6, 65.5e9));
        assert!(super::plausible_cpu(58e-6, 72.2e9));
        assert!(!super::plausible_cpu(16.573e-3, 3.06e15));
        assert!(!super::plausible_cpu(50e-6, 3.06e15));
        assert!(!super::plausible_cpu(16.573e-3, 60e9));
    }
}
