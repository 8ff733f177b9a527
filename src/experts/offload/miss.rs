//! The miss cost model (docs/design.md §4.5): what a miss costs on each channel (PCIe, the CPU),
//! when each channel is next free, the greedy split between them, and the slack controller that
//! corrects the CPU's start cost from what each job's join measured.
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
    /// Per device (its own PCIe link and copy engine; one without a layer split): when the
    /// copies queued so far should have landed (estimated at `pcie_bw`).
    copy_idle_at: Vec<Option<Instant>>,
    /// When the CPU job in flight should be done.
    pub(super) cpu_idle_at: Option<Instant>,
}

/// GPU time from an offloaded layer's expert matmuls to the next offloaded layer's stop
/// (its experts, the next attention and router): the head start a prefetch has over the next
/// stop. ~70 us on the H200 (a 3.3 ms resident Qwen3-30B-A3B step over 48 layers).
pub(super) const GPU_LAYER_S: f64 = 50e-6;

/// The GPU's extra cost of a layer with a CPU job: the graph stops a second time after its GPU
/// experts (a host round trip, ~30 us on the H200), which a start-up job does not see.
pub(super) const SECOND_STOP_S: f64 = 30e-6;

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
            copy_idle_at: Vec::new(),
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
    pub(super) fn cpu_start(&self) -> f64 {
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
    pub(super) fn observe(&mut self, idle: f64, waited: f64) {
        if !(self.balance && self.slack_control) {
            return;
        }
        let err = idle - waited - SLACK_TARGET_S;
        self.cpu_correction_s =
            (self.cpu_correction_s - SLACK_GAIN * err).clamp(-MAX_CORRECTION_S, MAX_CORRECTION_S);
    }

    /// [`MissModel::observe`] for a join: the result waited `back` seconds for it, the join
    /// waited `waited` for the result, and the step would still have waited `behind` seconds
    /// (from the join's start) for something else, a gated stop's copies (0 on the eval-hook
    /// path, where the GPU's own experts run beside the job and the join is the measure): a
    /// result that came before them left slack, and a join cost the step only what it waited
    /// beyond them.
    pub(super) fn observe_join(&mut self, back: f64, waited: f64, behind: f64) {
        self.observe(back + behind, waited);
    }

    /// A stop sent all its misses over PCIe: the CPU idled through the layer. A positive
    /// correction (the CPU charged more than measured) decays towards zero by what a job whose
    /// result waited a GPU layer would take off, so one that priced the CPU out of every split
    /// does not stay where no job is left to measure it. It never goes below zero this way:
    /// an idle layer says nothing about how much more the CPU could take (at high hit rates
    /// most layers send a lone miss over PCIe rightly).
    pub(super) fn idle_layer(&mut self) {
        if self.balance && self.slack_control && self.cpu_correction_s > 0.0 {
            self.cpu_correction_s = (self.cpu_correction_s - SLACK_GAIN * GPU_LAYER_S).max(0.0);
        }
    }

    /// Seconds until device `dev`'s copy engine has landed what is queued (0 without the
    /// balance).
    pub(super) fn copy_backlog(&self, now: Instant, dev: usize) -> f64 {
        match (self.balance, self.copy_idle_at.get(dev).copied().flatten()) {
            (true, Some(t)) => t.saturating_duration_since(now).as_secs_f64(),
            _ => 0.0,
        }
    }

    /// When device `dev`'s copy engine should have landed what is queued (None: nothing
    /// queued yet, or no balance).
    pub(super) fn copy_idle_at(&self, dev: usize) -> Option<Instant> {
        self.copy_idle_at
            .get(dev)
            .copied()
            .flatten()
            .filter(|_| self.balance)
    }

    /// `bytes` were queued on device `dev`'s copy engine at `now`.
    pub(super) fn queued(&mut self, now: Instant, bytes: u64, dev: usize) {
        if self.copy_idle_at.len() <= dev {
            self.copy_idle_at.resize(dev + 1, None);
        }
        let at = &mut self.copy_idle_at[dev];
        let start = at.filter(|&t| t > now).unwrap_or(now);
        *at = Some(start + secs(bytes as f64 / self.pcie_bw));
    }

    /// Greedy split of misses of `bytes` each between a copy engine free in `t_pcie` seconds
    /// and a CPU free in `t_cpu`: each to the channel that would finish it first; the first
    /// `forced` go to the CPU whatever it costs. Returns, per miss, whether the CPU takes it.
    #[cfg(test)]
    pub(super) fn split(
        &self,
        n: usize,
        bytes: f64,
        t_pcie: f64,
        t_cpu: f64,
        forced: usize,
    ) -> Vec<bool> {
        let forced: Vec<bool> = (0..n).map(|i| i < forced).collect();
        self.split_links(&vec![0; n], &[t_pcie], bytes, t_cpu, &forced)
    }

    /// [`MissModel::split`] over several copy engines (expert parallelism: each device's own
    /// PCIe link): miss `i` would be copied over link `links[i]`, free in `t_pcie[links[i]]`
    /// seconds; `forced[i]` sends it to the CPU whatever it costs. Each miss goes to the channel
    /// that would finish it first, so the CPU takes misses from the busiest links.
    pub(super) fn split_links(
        &self,
        links: &[usize],
        t_pcie: &[f64],
        bytes: f64,
        t_cpu: f64,
        forced: &[bool],
    ) -> Vec<bool> {
        let (cp, cc) = (bytes / self.pcie_bw, bytes / self.cpu_bw);
        let (mut p, mut c) = (t_pcie.to_vec(), t_cpu);
        links
            .iter()
            .zip(forced)
            .map(|(&l, &forced)| {
                let cpu = forced || c + cc < p[l] + cp;
                if cpu {
                    c += cc;
                } else {
                    p[l] += cp;
                }
                cpu
            })
            .collect()
    }
}

pub(super) fn secs(s: f64) -> Duration {
    Duration::from_secs_f64(s.max(0.0))
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
    fn a_gated_join_that_waited_less_than_the_copies_leaves_slack() {
        // Gated, the gate opens after the job and the stop's copies. The join waited 60 us for
        // the result, the copies land 100 us after the join began: the CPU finished 40 us
        // before them, so it could have taken more (charged less), as the hook path would
        // read a result that waited 40 us.
        let (mut gated, mut hook) = (model(50e9, 50e9, 60e-6), model(50e9, 50e9, 60e-6));
        gated.observe_join(0.0, 60e-6, 100e-6);
        hook.observe(40e-6, 0.0);
        assert!(gated.cpu_correction_s < 0.0, "{}", gated.cpu_correction_s);
        assert!((gated.cpu_correction_s - hook.cpu_correction_s).abs() < 1e-12);
        // Copies that landed 20 us into an 80 us wait: the CPU held the step 60 us.
        let mut late = model(50e9, 50e9, 60e-6);
        late.observe_join(0.0, 80e-6, 20e-6);
        assert!(late.cpu_correction_s > 0.0, "{}", late.cpu_correction_s);
        // Nothing behind (the eval-hook path): the join is the whole measure.
        let mut plain = model(50e9, 50e9, 60e-6);
        plain.observe_join(0.0, 60e-6, 0.0);
        let mut direct = model(50e9, 50e9, 60e-6);
        direct.observe(0.0, 60e-6);
        assert_eq!(plain.cpu_correction_s, direct.cpu_correction_s);
    }

    #[test]
    fn split_over_links_gives_each_link_its_own_backlog() {
        // Copies take 1 ms a miss on any link, the CPU 1.5 ms. Link 0 is busy for 3 ms, link 1
        // idle: link 1's misses are copied (1, 2 ms), link 0's go to the CPU first (1.5 ms
        // against 4), then alternate as the two fill.
        let m = model(1e9, 1e9 / 1.5, 0.0);
        let links = [0, 0, 1, 1, 0];
        let cpu = m.split_links(&links, &[3e-3, 0.0], 1e6, 0.0, &[false; 5]);
        assert_eq!(cpu, [true, true, false, false, false]);
        // One link carrying all five (the same backlog): the CPU takes more.
        let one = m.split_links(&[0; 5], &[3e-3], 1e6, 0.0, &[false; 5]);
        assert_eq!(one.iter().filter(|&&c| c).count(), 3);
        // A forced miss goes to the CPU whatever it costs.
        let f = m.split_links(&[1, 1], &[0.0, 0.0], 1e6, 1.0, &[false, true]);
        assert_eq!(f, [false, true]);
    }

    #[test]
    fn backlog_follows_what_was_queued() {
        let mut m = model(1e9, 1e9, 0.0);
        let t = std::time::Instant::now();
        m.queued(t, 1_000_000, 0); // 1 ms at 1 GB/s
        m.queued(t, 1_000_000, 0); // behind it: 2 ms
        let b = m.copy_backlog(t, 0);
        assert!((b - 2e-3).abs() < 1e-9, "backlog {b}");
        // Another device's copy engine (a layer split) has its own link: its backlog is its own.
        assert_eq!(m.copy_backlog(t, 1), 0.0);
        m.queued(t, 1_000_000, 1);
        let b1 = m.copy_backlog(t, 1);
        assert!((b1 - 1e-3).abs() < 1e-9, "device 1 backlog {b1}");
        assert!((m.copy_backlog(t, 0) - 2e-3).abs() < 1e-9);
        // Without the balance the planner sees an idle copy engine (the old planner).
        m.balance = false;
        assert_eq!(m.copy_backlog(t, 0), 0.0);
    }
}
