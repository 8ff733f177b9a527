//! The offload statistics as one paragraph for humans (`pocketmoe bench`, the run summary).
use super::{ratio, Stats};

impl Stats {
    /// One paragraph for humans: totals, then per-layer hit rates.
    pub fn summary(&self) -> String {
        let t = self.total();
        let mut s = format!(
            "offload: {} steps, {} tokens; hit rate {:.3} ({} hits, {} misses, {:.1}% of misses on the CPU; cache alone, without prefetched hits: {:.3}); {:.2} GB host->device; waited {:.3} s on copies, {:.3} s on the CPU; {} graph stops ({:.1} us each in the hook); {} steps gated ({} while ggml-cuda may capture; {} in table form, {} stops passed on the device, {} in split form), {} at a reduced prefetch budget, {} in a duel still deciding; per step {:.0} us computing; prefetch precision {:.2} recall {:.2}\nper-layer hit rate:",
            self.steps,
            self.tokens,
            self.hit_rate(),
            t.hits,
            t.misses,
            100.0 * self.cpu_share(),
            self.cache_hit_rate(),
            self.h2d_bytes as f64 / 1e9,
            self.wait_copy_s,
            self.wait_cpu_s,
            self.stops,
            1e6 * self.hook_s / self.stops.max(1) as f64,
            self.gated_steps,
            self.capture_steps,
            self.table_steps,
            self.hit_stops,
            self.split_steps,
            self.less_prefetch_steps,
            self.duel_steps,
            1e6 * self.compute_s / self.steps.max(1) as f64,
            self.prefetch_precision(),
            self.prefetch_recall(),
        );
        for l in &self.layers {
            if l.hits + l.misses > 0 {
                s += &format!(" {:.2}", ratio(l.hits, l.hits + l.misses));
            }
        }
        if !self.layer_device.is_empty() {
            for (d, ds) in self.devices().iter().enumerate() {
                s += &format!(
                    "\ndevice {d}: {} MoE layers used, hit rate {:.3} ({} hits, {} misses, {} on the CPU), {:.2} GB host->device",
                    ds.moe_layers,
                    ds.hit_rate,
                    ds.hits,
                    ds.misses,
                    ds.cpu,
                    ds.h2d_bytes as f64 / 1e9
                );
            }
        }
        if self.cpu_jobs > 0 {
            let us = |x: f64| 1e6 * x / self.cpu_jobs as f64;
            s += &format!(
                "\nCPU jobs: {} ({:.1} per step), per job: hand-over {:.0} us, graph {:.0} us, compute {:.0} us, result back {:.0} us; the step waited {:.0} us for it",
                self.cpu_jobs,
                self.cpu_jobs as f64 / self.steps.max(1) as f64,
                us(self.cpu_handover_s),
                us(self.cpu_prep_s),
                us(self.cpu_compute_s),
                us(self.cpu_back_s),
                us(self.wait_cpu_s),
            );
        }
        for d in &self.duels {
            s += &format!("\nduel (POCKETMOE_GATED=auto): {d}");
        }
        if let Some(c) = self.channels {
            s += &format!(
                "\nmiss channels ({}): PCIe {:.1} GB/s, CPU {:.1} GB/s + {:.0} us per job (slack correction {:+.0} us, setpoint {:+.0} us)",
                if c.measured {
                    "measured"
                } else {
                    "not measured"
                },
                c.pcie_gb_s,
                c.cpu_gb_s,
                c.cpu_start_us,
                c.cpu_correction_us,
                c.slack_target_us,
            );
            if let Some((pcie, cpu)) = self.channels_busy() {
                s += &format!(
                    "; busy over the steps' time: PCIe {:.0}% ({:.0} MB a step), CPU {:.0}%",
                    100.0 * pcie,
                    self.h2d_bytes as f64 / 1e6 / self.steps.max(1) as f64,
                    100.0 * cpu
                );
            }
        }
        s
    }

    /// How busy each miss channel was over the steps' wall time (`compute_s`): the copy engine
    /// as the bytes copied at its measured rate would take (prefill's staging copies included),
    /// the CPU channel as its jobs' graph and compute took. A channel near 1 bounds the step;
    /// which one is what a balance between them must move (issue 30: at uniform routing PCIe
    /// ran ~80% busy beside a CPU at ~16%). None before a step or without the rates.
    pub fn channels_busy(&self) -> Option<(f64, f64)> {
        let c = self.channels?;
        if self.compute_s <= 0.0 || c.pcie_gb_s <= 0.0 {
            return None;
        }
        Some(busy_shares(
            self.h2d_bytes,
            self.cpu_channel_s(),
            self.compute_s,
            c.pcie_gb_s * 1e9,
        ))
    }

    /// The CPU channel's busy seconds: its jobs' graph and compute.
    pub fn cpu_channel_s(&self) -> f64 {
        self.cpu_prep_s + self.cpu_compute_s
    }
}

/// `8-token steps: split runs (median step us: hook 12923 (out), gated 10800, split 9211)`.
impl std::fmt::Display for super::DuelChoice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}-token steps: {} runs (median step us:",
            self.n_tokens, self.winner
        )?;
        for (i, (name, us, out)) in self.arms.iter().enumerate() {
            let sep = if i == 0 { " " } else { ", " };
            if us.is_finite() {
                write!(f, "{sep}{name} {us:.0}")?;
            } else {
                write!(f, "{sep}{name} -")?;
            }
            if *out {
                write!(f, " (out)")?;
            }
        }
        write!(f, ")")
    }
}

/// The copy engine's and the CPU channel's shares of `secs`: `h2d_bytes` at `pcie_bytes_s`, and
/// `cpu_s` ([`Stats::channels_busy`] over a run's totals; the setpoint's outer loop over one
/// step's, `offload::hook`).
pub fn busy_shares(h2d_bytes: u64, cpu_s: f64, secs: f64, pcie_bytes_s: f64) -> (f64, f64) {
    (h2d_bytes as f64 / pcie_bytes_s / secs, cpu_s / secs)
}

#[cfg(test)]
mod tests {
    use super::super::ChannelRates;
    use super::*;

    /// The busy shares are the bytes at the measured rate and the jobs' time over the steps'
    /// time, and the summary says them: 10 steps of 10 ms with 400 MB copied each at 50 GB/s
    /// (8 ms: 80%) and 1.5 ms of CPU jobs each (15%).
    #[test]
    fn the_summary_says_how_busy_each_channel_was() {
        let mut st = Stats::new(2);
        assert_eq!(st.channels_busy(), None, "no rates, no steps");
        st.channels = Some(ChannelRates {
            pcie_gb_s: 50.0,
            cpu_gb_s: 60.0,
            cpu_start_us: 50.0,
            measured: true,
            cpu_correction_us: 0.0,
            slack_target_us: 20.0,
        });
        assert_eq!(st.channels_busy(), None, "no steps yet");
        st.steps = 10;
        st.compute_s = 0.1;
        st.h2d_bytes = 4_000_000_000;
        st.cpu_prep_s = 0.005;
        st.cpu_compute_s = 0.010;
        let (pcie, cpu) = st.channels_busy().unwrap();
        assert!((pcie - 0.8).abs() < 1e-9, "{pcie}");
        assert!((cpu - 0.15).abs() < 1e-9, "{cpu}");
        let s = st.summary();
        assert!(s.contains("PCIe 80% (400 MB a step), CPU 15%"), "{s}");
    }

    /// The duels' decisions, one line per micro-batch size in size order, the later decision of
    /// a size replacing the earlier; an arm without a counted step shows as `-`.
    #[test]
    fn the_summary_names_each_duels_choice() {
        use super::super::DuelChoice;
        let mut st = Stats::new(1);
        let choice = |n, winner, split_us| DuelChoice {
            n_tokens: n,
            winner,
            arms: vec![
                ("hook", 12923.4, true),
                ("gated", 10800.0, false),
                ("split", split_us, false),
            ],
        };
        st.record_duel(choice(8, "gated", f64::INFINITY));
        st.record_duel(choice(1, "gated", 11000.0));
        st.record_duel(choice(1, "split", 9211.0));
        assert_eq!(st.duels.len(), 2);
        let s = st.summary();
        let one = s.find("duel (POCKETMOE_GATED=auto): 1-token steps: split runs (median step us: hook 12923 (out), gated 10800, split 9211)");
        let eight = s.find("duel (POCKETMOE_GATED=auto): 8-token steps: gated runs (median step us: hook 12923 (out), gated 10800, split -)");
        assert!(one.is_some() && eight.is_some() && one < eight, "{s}");
        assert!(
            !s.contains("11000"),
            "the earlier 1-token decision stayed: {s}"
        );
    }
}
