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
    /// Whether the step runs gated, and the other path's correction and setpoint: each path
    /// keeps its own (see [`MissModel::set_gated`]).
    gated: bool,
    other_correction_s: f64,
    other_setpoint_s: f64,
    /// Whether the balance (copy-engine backlog, prefetch budget) is on; off: PCIe first at
    /// every stop from an idle copy engine, every predicted expert prefetched (the planner
    /// before 2026-12-02, kept to measure against).
    pub balance: bool,
    /// Per device (its own PCIe link and copy engine; one without a layer split): when the
    /// copies queued so far should have landed (estimated at `pcie_bw`).
    copy_idle_at: Vec<Option<Instant>>,
    /// When the CPU job in flight should be done.
    pub(super) cpu_idle_at: Option<Instant>,
    /// The slack controller's setpoint ([`MissModel::observe`]): where the outer loop
    /// ([`MissModel::steer_setpoint`]) leaves it, from [`SLACK_TARGET_S`], or fixed by
    /// `POCKETMOE_SLACK_TARGET_US`. Below it (negative: the step waits that long for the CPU on
    /// average) the controller charges the CPU less and it takes more misses: what moves misses
    /// off the copy engine where it is the step's busy channel (issue 30's uniform rows: PCIe
    /// ~80% busy beside a CPU at ~16%), which each stop's balance does not see. (A fixed charge
    /// on copies in the split would be undone: the controller's integral moves the CPU's charge
    /// by as much.)
    pub slack_target_s: f64,
    /// Whether an outer loop sets the setpoint from how busy each channel was in the last decode
    /// step ([`MissModel::steer_setpoint`]): by default (`POCKETMOE_SLACK_TARGET_US` unset or
    /// `auto`); a number fixes the setpoint.
    pub setpoint_auto: bool,
    /// At a decode step's start: the copied bytes and the CPU jobs' seconds so far (the
    /// statistics' totals), for the outer loop's shares of that step.
    pub(super) step_mark: Option<(u64, f64)>,
}

/// `POCKETMOE_SLACK_TARGET_US`: the setpoint (microseconds, -300 to 300) and whether the outer
/// loop moves it (unset or `auto`: from [`SLACK_TARGET_S`]; a number fixes it). Read once.
fn slack_target() -> (f64, bool) {
    static S: std::sync::OnceLock<(f64, bool)> = std::sync::OnceLock::new();
    *S.get_or_init(|| {
        let v = std::env::var("POCKETMOE_SLACK_TARGET_US").unwrap_or_default();
        match v.trim().parse::<f64>().ok().filter(|x| x.is_finite()) {
            Some(us) => (us.clamp(-300.0, 300.0) * 1e-6, false),
            None => {
                if !matches!(v.trim(), "" | "auto") {
                    tracing::warn!(
                        "POCKETMOE_SLACK_TARGET_US={v:?} is neither microseconds nor \"auto\": using auto"
                    );
                }
                (SLACK_TARGET_S, true)
            }
        }
    })
}

/// The outer loop's bounds and pace ([`MissModel::steer_setpoint`]): the setpoint moves between
/// -150 us (the step waits that long for the CPU on average) and [`SLACK_TARGET_S`], by
/// `SETPOINT_GAIN_S` per step times the gap between the two channels' busy shares, and only
/// down while the copy engine is busier than `PCIE_BUSY` of the step (the bottleneck), else back
/// up at a fifth of the gain: ~13 steps of a 0.6 gap from the default to -100 us, so that the
/// gated arm of a duel (`duel`: blocks of 8 steps) is measured near where the loop settles.
const SETPOINT_MIN_S: f64 = -150e-6;
const SETPOINT_GAIN_S: f64 = 15e-6;
const PCIE_BUSY: f64 = 0.6;

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
        let (setpoint, auto) = slack_target();
        Self {
            pcie_bw: bw.map_or(if cuda { 45e9 } else { 20e9 }, |b| b.0),
            cpu_bw: bw.map_or(30e9, |b| b.1),
            cpu_start_s: 40e-6,
            measured: false,
            cpu_correction_s: 0.0,
            slack_control: true,
            gated: false,
            other_correction_s: 0.0,
            other_setpoint_s: setpoint,
            balance,
            copy_idle_at: Vec::new(),
            cpu_idle_at: None,
            slack_target_s: setpoint,
            setpoint_auto: auto,
            step_mark: None,
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
            slack_target_us: self.slack_target_s * 1e6,
        }
    }

    /// The outer loop (`setpoint_auto`): after a decode step in which the copy engine was busy
    /// `pcie` of the step's time and the CPU channel `cpu` (`Stats::channels_busy`'s shares, of
    /// that step), lowers the slack controller's setpoint while the copy engine is the
    /// bottleneck and busier than the CPU, so the controller hands the CPU more misses; else
    /// lets it back up towards [`SLACK_TARGET_S`]. Cascade control: the slack controller still
    /// settles each stop's balance, at the setpoint this loop chooses.
    pub(super) fn steer_setpoint(&mut self, pcie: f64, cpu: f64) {
        if !(self.setpoint_auto && self.balance && self.slack_control) {
            return;
        }
        let gap = pcie - cpu;
        let step = if pcie > PCIE_BUSY && gap > 0.0 {
            -SETPOINT_GAIN_S * gap
        } else {
            SETPOINT_GAIN_S / 5.0
        };
        self.slack_target_s = (self.slack_target_s + step).clamp(SETPOINT_MIN_S, SLACK_TARGET_S);
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
    /// average slack settles at the setpoint ([`MissModel::slack_target_s`]).
    pub(super) fn observe(&mut self, idle: f64, waited: f64) {
        if !(self.balance && self.slack_control) {
            return;
        }
        let err = idle - waited - self.slack_target_s;
        self.cpu_correction_s =
            (self.cpu_correction_s - SLACK_GAIN * err).clamp(-MAX_CORRECTION_S, MAX_CORRECTION_S);
    }

    /// The step about to run is gated or not. The controller's correction settles at another
    /// value on each path (H100, uniform routing, 2026-12-05: -67 to -213 us on the eval-hook
    /// path, where the GPU's experts run beside a job; -7 to +19 us gated), so each path keeps
    /// its own, and a step that switches (`Gated::Auto`'s duel) starts from where its path
    /// left off instead of re-learning within the step. So does the setpoint, which the outer
    /// loop moves from the steps of the path it is on.
    pub(super) fn set_gated(&mut self, gated: bool) {
        if gated != self.gated {
            std::mem::swap(&mut self.cpu_correction_s, &mut self.other_correction_s);
            std::mem::swap(&mut self.slack_target_s, &mut self.other_setpoint_s);
            self.gated = gated;
        }
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
        self.copy_idle_at(dev)
            .map_or(0.0, |t| t.saturating_duration_since(now).as_secs_f64())
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
#[path = "miss_tests.rs"]
mod tests;
