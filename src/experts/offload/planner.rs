//! The CPU channel's share of a decode step's misses: the cost model that picks them (rates
//! measured on the box at the first decode stop, and when the copy engine is next idle), the
//! prefetch budget it sets, and the join of the CPU's result (docs/design.md §4.5).
use super::*;
use crate::graph::blocks::ExpertAct;
use std::time::{Duration, Instant};

/// What a miss costs on each channel, and when each channel is next free.
#[derive(Debug, Clone)]
pub struct MissModel {
    /// Host-to-device copies, bytes/s.
    pub pcie_bw: f64,
    /// Expert bytes the CPU channel computes per second (one token).
    pub cpu_bw: f64,
    /// Fixed cost of a CPU job: the hand-over to the worker, its graph, the join (and, on a
    /// GPU, the step's second stop), seconds.
    pub cpu_start_s: f64,
    /// Whether the rates were measured on this box (else: given, or the defaults).
    pub measured: bool,
    /// The slack controller's correction to `cpu_start_s` (see [`MissModel::observe`]), and
    /// whether the controller runs (with the balance only).
    pub cpu_correction_s: f64,
    pub slack_control: bool,
    /// Whether the balance (copy-engine backlog, prefetch budget) is on; off: PCIe first at
    /// every stop from an idle copy engine, every predicted expert prefetched (the planner
    /// before 2026-12-02, kept to measure against).
    pub balance: bool,
    /// When the copies queued so far should have landed (estimated at `pcie_bw`).
    copy_idle_at: Option<Instant>,
    /// When the CPU job in flight should be done.
    cpu_idle_at: Option<Instant>,
}

/// GPU time from an offloaded layer's expert matmuls to the next offloaded layer's stop
/// (its experts, the next attention and router): the head start a prefetch has over the next
/// stop. ~70 us on the H200 (a 3.3 ms resident Qwen3-30B-A3B step over 48 layers).
const GPU_LAYER_S: f64 = 50e-6;

/// The GPU's extra cost of a layer with a CPU job: the graph stops a second time after its GPU
/// experts (a host round trip, ~30 us on the H200), which a start-up job does not see.
const SECOND_STOP_S: f64 = 30e-6;

/// How long a CPU job's result should wait for the join, on average: the slack the controller
/// ([`MissModel::observe`]) aims at. Below it a job's jitter (H200 host: compute of one shape
/// spreads by ~10-20 us) would make the step wait; above it the CPU idles while the copy engine
/// still works.
const SLACK_TARGET_S: f64 = 20e-6;

/// The share of a job's slack error the controller corrects per job: ~48 jobs a token, so it
/// settles within a token or two and one outlier job moves the charge by a quarter of its error.
const SLACK_GAIN: f64 = 0.25;

/// The bounds of the correction: at most a few experts' worth of CPU time either way, so a
/// stalled or pre-empted worker cannot push the split to an extreme that takes long to undo.
const MAX_CORRECTION_S: f64 = 300e-6;

impl MissModel {
    /// Given rates (`bw`: PCIe, CPU, bytes/s), or the defaults until [`Offload::measure_rates`].
    pub(super) fn new(bw: Option<(f64, f64)>, cuda: bool, balance: bool) -> Self {
        Self {
            pcie_bw: bw.map_or(if cuda { 45e9 } else { 20e9 }, |b| b.0),
            cpu_bw: bw.map_or(30e9, |b| b.1),
            cpu_start_s: 40e-6,
            measured: false,
            cpu_correction_s: 0.0,
            slack_control: true,
            balance,
            copy_idle_at: None,
            cpu_idle_at: None,
        }
    }

    /// The rates, for the statistics.
    pub fn rates(&self) -> crate::experts::stats::ChannelRates {
        crate::experts::stats::ChannelRates {
            pcie_gb_s: self.pcie_bw / 1e9,
            cpu_gb_s: self.cpu_bw / 1e9,
            cpu_start_us: self.cpu_start_s * 1e6,
            measured: self.measured,
            cpu_correction_us: self.cpu_correction_s * 1e6,
        }
    }

    /// The start cost a CPU job is charged: the measured one plus the slack controller's
    /// correction (none without the balance).
    fn cpu_start(&self) -> f64 {
        if self.balance {
            self.cpu_start_s + self.cpu_correction_s
        } else {
            self.cpu_start_s
        }
    }

    /// The slack controller: a CPU job's result waited `idle` seconds for the join, and the
    /// step waited `waited` seconds for the result (one of the two is ~0). The rates and start
    /// cost are measured once, on jobs that do not run beside a step; in a step the GPU's side
    /// (the copies, its experts, the second stop) and the CPU's (sharing DRAM with the copy
    /// engine) take what they take. A result that waited means the CPU could have taken more:
    /// charge it less; a step that waited: charge it more. An integral correction, so the
    /// average slack settles at [`SLACK_TARGET_S`].
    fn observe(&mut self, idle: f64, waited: f64) {
        if !(self.balance && self.slack_control) {
            return;
        }
        let err = idle - waited - SLACK_TARGET_S;
        self.cpu_correction_s =
            (self.cpu_correction_s - SLACK_GAIN * err).clamp(-MAX_CORRECTION_S, MAX_CORRECTION_S);
    }

    /// A stop sent all its misses over PCIe: the CPU idled through the layer. A positive
    /// correction (the CPU charged more than measured) decays towards zero by what a job whose
    /// result waited a GPU layer would take off, so one that priced the CPU out of every split
    /// does not stay where no job is left to measure it. It never goes below zero this way:
    /// an idle layer says nothing about how much more the CPU could take (at high hit rates
    /// most layers send a lone miss over PCIe rightly).
    fn idle_layer(&mut self) {
        if self.balance && self.slack_control && self.cpu_correction_s > 0.0 {
            self.cpu_correction_s = (self.cpu_correction_s - SLACK_GAIN * GPU_LAYER_S).max(0.0);
        }
    }

    /// Seconds until the copy engine has landed what is queued (0 without the balance).
    fn copy_backlog(&self, now: Instant) -> f64 {
        match (self.balance, self.copy_idle_at) {
            (true, Some(t)) => t.saturating_duration_since(now).as_secs_f64(),
            _ => 0.0,
        }
    }

    /// `bytes` were queued on the copy engine at `now`.
    fn queued(&mut self, now: Instant, bytes: u64) {
        let start = self.copy_idle_at.filter(|&t| t > now).unwrap_or(now);
        self.copy_idle_at = Some(start + secs(bytes as f64 / self.pcie_bw));
    }

    /// Greedy split of misses of `bytes` each between a copy engine free in `t_pcie` seconds
    /// and a CPU free in `t_cpu`: each to the channel that would finish it first; the first
    /// `forced` go to the CPU whatever it costs. Returns, per miss, whether the CPU takes it.
    fn split(&self, n: usize, bytes: f64, t_pcie: f64, t_cpu: f64, forced: usize) -> Vec<bool> {
        let (cp, cc) = (bytes / self.pcie_bw, bytes / self.cpu_bw);
        let (mut p, mut c) = (t_pcie, t_cpu);
        (0..n)
            .map(|i| {
                let cpu = i < forced || c + cc < p + cp;
                if cpu {
                    c += cc;
                } else {
                    p += cp;
                }
                cpu
            })
            .collect()
    }
}

fn secs(s: f64) -> Duration {
    Duration::from_secs_f64(s.max(0.0))
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
            .filter(|&e| layer.cache.slot(e).is_none())
            .collect();
        let forced = used.len().saturating_sub(layer.cache.n_slots());
        let m = &self.miss;
        let t_pcie = m.copy_backlog(Instant::now());
        let split = m.split(
            misses.len(),
            layer.expert_bytes() as f64,
            t_pcie,
            m.cpu_start(),
            forced,
        );
        let cpu: Vec<u32> = misses
            .iter()
            .zip(&split)
            .filter_map(|(&e, &cpu)| cpu.then_some(e))
            .collect();
        if cpu.is_empty() && !misses.is_empty() {
            self.miss.idle_layer();
        }
        cpu
    }

    /// Copies of `bytes` were queued at a stop or a prefetch: the copy engine's backlog grows.
    pub(super) fn copies_queued(&mut self, bytes: u64) {
        if bytes > 0 {
            self.miss.queued(Instant::now(), bytes);
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
    pub(super) fn prefetch_budget(&self, next: usize, cands: usize) -> usize {
        let m = &self.miss;
        if !m.balance || !self.cpu_enabled(next) || cands == 0 {
            return cands;
        }
        let now = Instant::now();
        let backlog = m.copy_backlog(now);
        let cpu_busy = m
            .cpu_idle_at
            .map_or(0.0, |t| t.saturating_duration_since(now).as_secs_f64());
        // The next stop: after this layer's copies and CPU job, then the GPU's work up to it.
        let t_stop = backlog.max(cpu_busy) + GPU_LAYER_S;
        let bytes = self.layers[next]
            .as_ref()
            .expect("offloaded layer")
            .expert_bytes() as f64;
        let split = m.split(cands, bytes, backlog, t_stop + m.cpu_start(), 0);
        split.iter().filter(|&&cpu| !cpu).count()
    }

    /// Measures both channels' rates on this box, once, at the first decode stop that may use
    /// the CPU channel: copies of up to 16 of layer `il`'s experts into its staging area (the
    /// copy engine's rate), and CPU jobs of 1 and k experts (the CPU's start cost and rate).
    /// On failure the defaults stay.
    fn measure_rates(&mut self, il: usize, act: ExpertAct) {
        self.miss.measured = true;
        let r = self
            .measure_pcie(il)
            .and_then(|p| Ok((p, self.measure_cpu(il, act)?)));
        let sane = |x: f64| x.is_finite() && x > 0.0;
        match r {
            Ok((pcie, (start, cpu))) if sane(pcie) && sane(cpu) => {
                let m = &mut self.miss;
                m.pcie_bw = pcie;
                m.cpu_bw = cpu;
                m.cpu_start_s = start
                    + if self.backend.is_cuda() {
                        SECOND_STOP_S
                    } else {
                        0.0
                    };
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
        for _ in 0..3 {
            self.xfer.wait()?;
            let t0 = Instant::now();
            for e in 0..n {
                for (_, a) in addrs.mats() {
                    self.xfer
                        .copy(a.in_staging(e), a.in_store(e), a.expert_bytes)?;
                }
            }
            self.xfer.wait()?;
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
        let n = self.n_embd * n_tokens;
        let Some(cpu) = self.cpu.as_mut().filter(|c| c.pending() == Some(il)) else {
            return Ok(()); // nothing of this layer's to join (waiting would never end)
        };
        let t0 = std::time::Instant::now();
        let (out, times) = cpu.finish().map_err(|msg| GgmlError::Tensor {
            name: format!("CPU experts of layer {il}"),
            msg,
        })?;
        let waited = t0.elapsed().as_secs_f64();
        self.miss.observe(times.back, waited);
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
        // Through ggml's own (synchronous) upload, not the copy engine: waiting on the copy
        // engine here would also wait for the next layer's prefetches.
        self.ctl_cpu(il)
            .write_bytes_at(0, bytemuck::cast_slice(&out))
    }
}

#[cfg(test)]
mod tests {
    use super::MissModel;

    fn model(pcie: f64, cpu: f64, start: f64) -> MissModel {
        let mut m = MissModel::new(Some((pcie, cpu)), true, true);
        m.cpu_start_s = start;
        m
    }

    #[test]
    fn split_balances_the_two_channels() {
        // 1 MB experts, PCIe 50 GB/s (20 us each), CPU 50 GB/s + 30 us start: from idle
        // channels the first two misses go to PCIe (20, 40 us vs 50), then they alternate.
        let m = model(50e9, 50e9, 30e-6);
        let s = m.split(6, 1e6, 0.0, m.cpu_start_s, 0);
        assert_eq!(s, [false, false, true, false, true, false]);
        // A copy engine still busy for 100 us with prefetches: the CPU takes the first ones.
        let s = m.split(3, 1e6, 100e-6, m.cpu_start_s, 0);
        assert_eq!(s, [true, true, true]);
        // Forced picks (more than the slots) go to the CPU whatever it costs.
        let s = m.split(3, 1e6, 0.0, 1.0, 2);
        assert_eq!(s, [true, true, false]);
    }

    #[test]
    fn slack_controller_settles_where_results_wait_the_target() {
        // A box whose real CPU jobs finish 100 us before the step joins them (the GPU's side
        // costs more than the model says): the correction falls until the split hands the CPU
        // enough to close the gap. Simulated: each extra us charged less gives the CPU 1 us
        // more work, so the slack is 100 us + correction.
        let mut m = model(50e9, 50e9, 60e-6);
        for _ in 0..200 {
            let slack = 100e-6 + m.cpu_correction_s;
            let (idle, waited) = if slack >= 0.0 {
                (slack, 0.0)
            } else {
                (0.0, -slack)
            };
            m.observe(idle, waited);
        }
        let want = -(100e-6 - super::SLACK_TARGET_S);
        assert!(
            (m.cpu_correction_s - want).abs() < 1e-7,
            "correction {} us, want {} us",
            m.cpu_correction_s * 1e6,
            want * 1e6
        );
        // Charged less, the CPU takes more of the same misses: 1 MB experts, 20 us each on
        // either channel, both idle.
        let before = model(50e9, 50e9, 60e-6).split(8, 1e6, 0.0, 60e-6, 0);
        let after = m.split(8, 1e6, 0.0, m.cpu_start(), 0);
        let n = |s: &[bool]| s.iter().filter(|&&c| c).count();
        assert!(n(&after) > n(&before), "{before:?} -> {after:?}");
    }

    #[test]
    fn slack_controller_charges_more_when_the_step_waits_and_is_bounded() {
        let mut m = model(50e9, 50e9, 60e-6);
        m.observe(0.0, 80e-6); // the step waited 80 us for the CPU
        let c = m.cpu_correction_s;
        assert!(
            (c - super::SLACK_GAIN * 100e-6).abs() < 1e-12,
            "correction {c}"
        );
        // A stalled worker (the step waited a second) moves it by the bound only.
        m.observe(0.0, 1.0);
        assert_eq!(m.cpu_correction_s, super::MAX_CORRECTION_S);
        // Layers that gave the CPU nothing bring it back down to zero, not below: it is not
        // stuck priced out, and an idle CPU beside a lone PCIe miss is no sign of slack.
        for _ in 0..100 {
            m.idle_layer();
        }
        assert_eq!(m.cpu_correction_s, 0.0);
        // Without the balance (the old planner, kept to measure against) nothing moves.
        let mut m = model(50e9, 50e9, 60e-6);
        m.balance = false;
        m.observe(0.0, 80e-6);
        assert_eq!((m.cpu_correction_s, m.cpu_start()), (0.0, 60e-6));
    }

    #[test]
    fn backlog_follows_what_was_queued() {
        let mut m = model(1e9, 1e9, 0.0);
        let t = std::time::Instant::now();
        m.queued(t, 1_000_000); // 1 ms at 1 GB/s
        m.queued(t, 1_000_000); // behind it: 2 ms
        let b = m.copy_backlog(t);
        assert!((b - 2e-3).abs() < 1e-9, "backlog {b}");
        // Without the balance the planner sees an idle copy engine (the old planner).
        m.balance = false;
        assert_eq!(m.copy_backlog(t), 0.0);
    }
}
