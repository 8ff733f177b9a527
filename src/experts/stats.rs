//! Offload statistics (docs/design.md §4.9: everything that decides is measured): cache hits and
//! misses per layer, where misses were served (copied over PCIe, or computed on the CPU), bytes
//! moved, prefetch precision/recall, and the time the host spent waiting.
//!
//! Invariant: counters only grow; [`Stats::since`] gives the difference of two snapshots, so a
//! benchmark can report one test's figures.
use serde::Serialize;

mod summary;
pub use summary::busy_shares;

/// Counters for one MoE layer.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct LayerStats {
    /// Expert uses served from a GPU slot that already held the expert.
    pub hits: u64,
    /// Expert uses that were not resident: copied into a slot, or computed on the CPU.
    pub misses: u64,
    /// Misses computed on the CPU.
    pub cpu: u64,
    /// Experts whose bytes crossed PCIe (miss copies, prefetches and prefill staging).
    pub copies: u64,
    /// Prefetched experts, and how many of them the layer then used.
    pub prefetched: u64,
    pub prefetch_used: u64,
    /// Experts the layer used that the prediction had named (for recall).
    pub predicted_used: u64,
    /// Distinct experts used (the recall denominator for prefetch).
    pub used: u64,
    /// Bytes copied host -> GPU for this layer (miss copies, prefetches, staging).
    #[serde(default)]
    pub h2d_bytes: u64,
}

impl LayerStats {
    /// A stop's counters per share under expert parallelism (one per device), none with one
    /// share (nothing to split there).
    pub fn per_share(shares: usize) -> Vec<LayerStats> {
        vec![LayerStats::default(); if shares > 1 { shares } else { 0 }]
    }

    /// Counts one used expert of a decode stop: a hit, or a miss (`cpu`: computed on the CPU).
    pub fn count_use(&mut self, hit: bool, cpu: bool) {
        if hit {
            self.hits += 1;
        } else {
            self.misses += 1;
            self.cpu += cpu as u64;
        }
    }

    /// Adds `o`'s counters.
    pub fn add(&mut self, o: &LayerStats) {
        self.hits += o.hits;
        self.misses += o.misses;
        self.cpu += o.cpu;
        self.copies += o.copies;
        self.prefetched += o.prefetched;
        self.prefetch_used += o.prefetch_used;
        self.predicted_used += o.predicted_used;
        self.used += o.used;
        self.h2d_bytes += o.h2d_bytes;
    }

    /// Subtracts `o`'s counters (an earlier snapshot of the same).
    pub fn sub(&mut self, o: &LayerStats) {
        self.hits -= o.hits;
        self.misses -= o.misses;
        self.cpu -= o.cpu;
        self.copies -= o.copies;
        self.prefetched -= o.prefetched;
        self.prefetch_used -= o.prefetch_used;
        self.predicted_used -= o.predicted_used;
        self.used -= o.used;
        self.h2d_bytes -= o.h2d_bytes;
    }
}

/// The miss cost model's rates (docs/design.md §4.5): given, the defaults, or measured on the box
/// at the first decode stop.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq)]
pub struct ChannelRates {
    pub pcie_gb_s: f64,
    pub cpu_gb_s: f64,
    pub cpu_start_us: f64,
    pub measured: bool,
    /// The slack controller's correction to the start cost (added to `cpu_start_us` when the
    /// planner splits; negative: the CPU's results waited for the step, so it is charged less).
    #[serde(default)]
    pub cpu_correction_us: f64,
    /// The slack controller's setpoint (20 us, or `POCKETMOE_SLACK_TARGET_US`, or where its
    /// outer loop left it).
    #[serde(default)]
    pub slack_target_us: f64,
}

/// One device's share of the counters (a layer split's device; the whole model on one).
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct DeviceStats {
    /// MoE layers of this device that ran experts.
    pub moe_layers: usize,
    pub hits: u64,
    pub misses: u64,
    pub cpu: u64,
    /// As [`Stats::hit_rate`] and [`Stats::cache_hit_rate`], over this device's layers.
    pub hit_rate: f64,
    pub own_hit_rate: f64,
    pub h2d_bytes: u64,
}

/// `Gated::Auto`'s last decision for one micro-batch size (`offload::duel`): the arm that runs
/// until the next duel, and each arm's median step time.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct DuelChoice {
    pub n_tokens: usize,
    pub winner: &'static str,
    /// Per arm that took part (the duel's order): its name, median step time in us (infinite
    /// where it ran no counted step) and whether it sat the duel's end out (1.15x the best).
    pub arms: Vec<(&'static str, f64, bool)>,
}

/// Counters for the whole model.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct Stats {
    /// The CPU/PCIe split's rates (`None` without a CPU channel).
    #[serde(default)]
    pub channels: Option<ChannelRates>,
    pub layers: Vec<LayerStats>,
    /// In a layer split, each layer's device (index in the split's device list); empty on one
    /// device.
    #[serde(default)]
    pub layer_device: Vec<usize>,
    /// Under expert parallelism, each device's counters over its share of every layer's
    /// experts (decode stops: hits, misses, CPU, bytes copied to it); empty otherwise.
    #[serde(default)]
    pub by_share: Vec<LayerStats>,
    /// Bytes copied host -> GPU.
    pub h2d_bytes: u64,
    /// Bytes of expert weights the CPU read.
    pub cpu_bytes: u64,
    /// Seconds the host waited for copies and for the CPU experts.
    pub wait_copy_s: f64,
    pub wait_cpu_s: f64,
    /// CPU jobs joined, and where their time went in total (`experts::cpu::JobTimes`).
    #[serde(default)]
    pub cpu_jobs: u64,
    #[serde(default)]
    pub cpu_handover_s: f64,
    #[serde(default)]
    pub cpu_prep_s: f64,
    #[serde(default)]
    pub cpu_compute_s: f64,
    #[serde(default)]
    pub cpu_back_s: f64,
    /// Graph stops (the step hook's callbacks) and the seconds the host spent in them, during
    /// which the GPU has nothing queued: the per-layer overhead of decode.
    pub stops: u64,
    pub hook_s: f64,
    /// Wall seconds of the forward passes' graph computes (stops included): where a decode
    /// step's time goes.
    #[serde(default)]
    pub compute_s: f64,
    /// Tokens and forward passes (micro-batches) seen.
    pub tokens: u64,
    pub steps: u64,
    /// Of those steps, how many ran gated (`offload::gated`: no second stop for a CPU join).
    #[serde(default)]
    pub gated_steps: u64,
    /// Of those, how many were a graph's first gated steps in a row, in which ggml-cuda may
    /// capture the pieces and nothing was queued ahead (`run_gated`'s capture guard).
    #[serde(default)]
    pub capture_steps: u64,
    /// Of those, how many ran in table form (`offload::table`).
    #[serde(default)]
    pub table_steps: u64,
    /// Of those, how many ran in split form (`offload::gated`: a stop's GPU experts beside its
    /// CPU job; `POCKETMOE_GATED_SPLIT=1` or the duel's arm).
    #[serde(default)]
    pub split_steps: u64,
    /// Of their stops, how many the GPU passed on its own, every pick resident in the expert
    /// table (`offload::table`).
    #[serde(default)]
    pub hit_stops: u64,
    /// Of those steps, how many prefetched less than the miss balance's budget (`Gated::Auto`'s
    /// arm of the hook path at half the budget, `offload::duel`).
    #[serde(default)]
    pub less_prefetch_steps: u64,
    /// Of those steps, how many ran while their micro-batch size's duel was still deciding
    /// (`offload::duel`: the arms in turn, before the winner's hold): the duel's share of decode.
    #[serde(default)]
    pub duel_steps: u64,
    /// The duels' last decisions, one per micro-batch size, by size (not counters: `since`
    /// keeps the later snapshot's).
    #[serde(default)]
    pub duels: Vec<DuelChoice>,
}

impl Stats {
    pub fn new(n_layer: usize) -> Self {
        Self {
            layers: vec![LayerStats::default(); n_layer],
            ..Default::default()
        }
    }

    fn total(&self) -> LayerStats {
        self.total_of(|_| true)
    }

    /// The sum of the layers `pick` selects (by index).
    fn total_of(&self, pick: impl Fn(usize) -> bool) -> LayerStats {
        let mut t = LayerStats::default();
        for (_, l) in self.layers.iter().enumerate().filter(|(il, _)| pick(*il)) {
            t.add(l);
        }
        t
    }

    /// Hits / (hits + misses) over all layers (0 when nothing ran).
    pub fn hit_rate(&self) -> f64 {
        let t = self.total();
        ratio(t.hits, t.hits + t.misses)
    }

    /// Uses served by what the cache held before this step's prefetches / all uses: hits that a
    /// prefetch made count as misses here (their bytes crossed PCIe all the same), so this is
    /// the rate PCIe traffic follows. [`Stats::hit_rate`] counts them as hits (the rate the
    /// expert matmuls saw).
    pub fn cache_hit_rate(&self) -> f64 {
        let t = self.total();
        ratio(t.hits.saturating_sub(t.prefetch_used), t.hits + t.misses)
    }

    /// Share of misses computed on the CPU.
    pub fn cpu_share(&self) -> f64 {
        let t = self.total();
        ratio(t.cpu, t.misses)
    }

    /// Prefetch precision: prefetched experts that were used / prefetched.
    pub fn prefetch_precision(&self) -> f64 {
        let t = self.total();
        ratio(t.prefetch_used, t.prefetched)
    }

    /// Prefetch recall: used experts that had been predicted / used.
    pub fn prefetch_recall(&self) -> f64 {
        let t = self.total();
        ratio(t.predicted_used, t.used)
    }

    /// Adds one stop's counters per share of the experts (expert parallelism).
    pub fn add_by_share(&mut self, by: &[LayerStats]) {
        if self.by_share.len() < by.len() {
            self.by_share.resize(by.len(), LayerStats::default());
        }
        for (t, b) in self.by_share.iter_mut().zip(by) {
            t.add(b);
        }
    }

    /// Per device of a layer split (one entry on one device): its MoE layers' counters; under
    /// expert parallelism its share of every layer's experts (decode stops).
    pub fn devices(&self) -> Vec<DeviceStats> {
        let used = |pick: &dyn Fn(usize) -> bool| {
            (0..self.layers.len())
                .filter(|&il| pick(il) && self.layers[il].used > 0)
                .count()
        };
        let of = |t: &LayerStats, moe_layers: usize| DeviceStats {
            moe_layers,
            hits: t.hits,
            misses: t.misses,
            cpu: t.cpu,
            hit_rate: ratio(t.hits, t.hits + t.misses),
            own_hit_rate: ratio(t.hits.saturating_sub(t.prefetch_used), t.hits + t.misses),
            h2d_bytes: t.h2d_bytes,
        };
        if !self.by_share.is_empty() {
            let all = used(&|_| true);
            return self.by_share.iter().map(|t| of(t, all)).collect();
        }
        let n = self.layer_device.iter().max().map_or(1, |m| m + 1);
        let dev = |il: usize| self.layer_device.get(il).copied().unwrap_or(0);
        (0..n)
            .map(|d| of(&self.total_of(|il| dev(il) == d), used(&|il| dev(il) == d)))
            .collect()
    }

    /// Records a duel's decision, replacing the one before of its micro-batch size.
    pub fn record_duel(&mut self, choice: DuelChoice) {
        match self
            .duels
            .binary_search_by_key(&choice.n_tokens, |c| c.n_tokens)
        {
            Ok(i) => self.duels[i] = choice,
            Err(i) => self.duels.insert(i, choice),
        }
    }

    /// `self - earlier`, counter by counter.
    pub fn since(&self, earlier: &Stats) -> Stats {
        let mut d = self.clone();
        for (l, e) in d.layers.iter_mut().zip(&earlier.layers) {
            l.sub(e);
        }
        for (l, e) in d.by_share.iter_mut().zip(&earlier.by_share) {
            l.sub(e);
        }
        d.h2d_bytes -= earlier.h2d_bytes;
        d.cpu_bytes -= earlier.cpu_bytes;
        d.wait_copy_s -= earlier.wait_copy_s;
        d.wait_cpu_s -= earlier.wait_cpu_s;
        d.cpu_jobs -= earlier.cpu_jobs;
        d.cpu_handover_s -= earlier.cpu_handover_s;
        d.cpu_prep_s -= earlier.cpu_prep_s;
        d.cpu_compute_s -= earlier.cpu_compute_s;
        d.cpu_back_s -= earlier.cpu_back_s;
        d.stops -= earlier.stops;
        d.hook_s -= earlier.hook_s;
        d.compute_s -= earlier.compute_s;
        d.tokens -= earlier.tokens;
        d.steps -= earlier.steps;
        d.gated_steps -= earlier.gated_steps;
        d.capture_steps -= earlier.capture_steps;
        d.table_steps -= earlier.table_steps;
        d.split_steps -= earlier.split_steps;
        d.hit_stops -= earlier.hit_stops;
        d.less_prefetch_steps -= earlier.less_prefetch_steps;
        d.duel_steps -= earlier.duel_steps;
        d
    }
}

fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 {
        0.0
    } else {
        a as f64 / b as f64
    }
}
