//! The offload statistics as one paragraph for humans (`pocketmoe bench`, the run summary).
use super::{ratio, Stats};

impl Stats {
    /// One paragraph for humans: totals, then per-layer hit rates.
    pub fn summary(&self) -> String {
        let t = self.total();
        let mut s = format!(
            "offload: {} steps, {} tokens; hit rate {:.3} ({} hits, {} misses, {:.1}% of misses on the CPU; cache alone, without prefetched hits: {:.3}); {:.2} GB host->device; waited {:.3} s on copies, {:.3} s on the CPU; {} graph stops ({:.1} us each in the hook); {} steps gated ({} while ggml-cuda may capture; {} in table form, {} stops passed on the device), {} at a reduced prefetch budget, {} in a duel still deciding; per step {:.0} us computing; prefetch precision {:.2} recall {:.2}\nper-layer hit rate:",
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
        if let Some(c) = self.channels {
            s += &format!(
                "\nmiss channels ({}): PCIe {:.1} GB/s, CPU {:.1} GB/s + {:.0} us per job (slack correction {:+.0} us)",
                if c.measured {
                    "measured"
                } else {
                    "not measured"
                },
                c.pcie_gb_s,
                c.cpu_gb_s,
                c.cpu_start_us,
                c.cpu_correction_us,
            );
        }
        s
    }
}
