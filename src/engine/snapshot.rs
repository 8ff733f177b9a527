//! The engine's figures at one moment, as one value: what the server's `/metrics`, `/slots`,
//! `/props` and the chat page (which polls `/metrics`) show, so the server reads this and never
//! the expert cache's own counters (issue 27, item 5).
//!
//! Two producers fill it: the model, after each step, the expert cache and its miss channels
//! ([`Engine::experts_snapshot`], through `BatchModel::experts_snapshot`); the scheduler that
//! drives the model (the server's engine thread) the queue, tokens, KV rows and slots.
use super::Engine;

/// The engine's figures: its scheduler's queue and tokens, the KV cache's use, its decoding
/// slots and, when the model offloads experts, the expert cache.
#[derive(Debug, Clone, Default)]
pub struct StatsSnapshot {
    /// Requests waiting for a free slot.
    pub queued: usize,
    /// Sequences being decoded together, and how many can be (`--parallel`).
    pub active: usize,
    pub parallel: usize,
    /// Prompt tokens evaluated (those a slot's prompt cache supplied are not counted), and
    /// tokens generated.
    pub prompt_tokens: u64,
    pub generated_tokens: u64,
    /// Forward passes, and the tokens they carried.
    pub steps: u64,
    pub batch_tokens: u64,
    /// Generated tokens per second over the last few seconds.
    pub recent_tok_s: f64,
    /// Requests dropped before their end.
    pub cancelled: u64,
    /// KV-cache rows held by the sequences in slots (their tokens already forwarded); 0 when
    /// idle. Capacity: `n_ctx × parallel`.
    pub kv_tokens: u64,
    /// One entry per decoding slot (empty when the engine has no slots to show).
    pub slots: Vec<SlotState>,
    /// The expert cache, when the model offloads experts.
    pub experts: Option<ExpertsSnapshot>,
}

/// One decoding slot, as `/slots` shows it.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct SlotState {
    pub id: usize,
    pub is_processing: bool,
    /// Context length of the slot's sequence.
    pub n_ctx: usize,
    /// Prompt tokens of the request in the slot.
    pub n_prompt_tokens: usize,
    /// Tokens generated so far.
    pub n_decoded: usize,
    /// KV-cache rows the slot holds (tokens already forwarded; an idle slot's kept prompt
    /// cache).
    pub n_cached: usize,
}

/// One device's expert cache in a layer split (docs/design.md §8).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct DeviceExperts {
    /// Cache slots per MoE layer of this device's blocks.
    pub slots: usize,
    /// MoE layers of this device that ran experts.
    pub moe_layers: usize,
    pub hits: u64,
    pub misses: u64,
    pub hit_rate: f64,
    /// Expert bytes copied host to this device.
    pub h2d_bytes: u64,
}

/// The expert cache and its miss channels: totals over all MoE layers since the model loaded.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ExpertsSnapshot {
    /// Cache slots per MoE layer.
    pub slots: usize,
    /// Routed-expert uses served from the cache, and not.
    pub hits: u64,
    pub misses: u64,
    /// Misses computed on the CPU.
    pub cpu: u64,
    /// Hits / (hits + misses) (0 when nothing ran).
    pub hit_rate: f64,
    /// As `hit_rate`, with hits a prefetch made counted as misses: the rate PCIe traffic
    /// follows.
    pub own_hit_rate: f64,
    /// Share of misses computed on the CPU.
    pub cpu_share: f64,
    /// Prefetched experts that were used / prefetched; used experts that had been predicted /
    /// used.
    pub prefetch_precision: f64,
    pub prefetch_recall: f64,
    /// Expert bytes copied host to GPU, and read by the CPU.
    pub h2d_bytes: u64,
    pub cpu_bytes: u64,
    /// Experts whose bytes crossed PCIe (miss copies, prefetches, prefill staging), and of
    /// them those prefetched ahead of their layer.
    pub copies: u64,
    pub prefetched: u64,
    /// Graph stops for expert routing, and the host seconds spent in them.
    pub stops: u64,
    pub stop_s: f64,
    /// Forward passes with offloaded experts; of them those run gated, of those the ones in
    /// table form and in split form (the way `Gated::Auto`'s duel runs them), and the stops of
    /// gated steps the GPU passed on its own (table form: every pick resident).
    pub steps: u64,
    pub gated_steps: u64,
    pub table_steps: u64,
    pub split_steps: u64,
    pub passed_stops: u64,
    /// Wall seconds of those forward passes (the step's time: stops, waits and copies
    /// within it), and the host's waits in them for copies and for the CPU's experts.
    pub compute_s: f64,
    pub wait_copy_s: f64,
    pub wait_cpu_s: f64,
    /// The miss channels' rates (`None` without a CPU channel).
    pub channels: Option<ChannelRates>,
    /// Per device of a layer split (empty on one device).
    pub devices: Vec<DeviceExperts>,
}

/// The rates the CPU/PCIe split of misses plans with.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ChannelRates {
    pub pcie_gb_s: f64,
    pub cpu_gb_s: f64,
    /// The CPU's start cost per job, and the slack controller's correction to it (added
    /// when the planner splits).
    pub cpu_start_us: f64,
    pub cpu_correction_us: f64,
    /// Measured on this machine (else given or the defaults).
    pub measured: bool,
}

impl ExpertsSnapshot {
    /// The figures of an expert cache of `slots` slots per layer whose counters are `s`.
    pub fn new(s: &crate::experts::Stats, slots: usize) -> Self {
        Self::with_devices(s, slots, &[])
    }

    /// As [`ExpertsSnapshot::new`], with `device_slots` the slots per layer of each device of a
    /// layer split (empty on one device).
    pub fn with_devices(s: &crate::experts::Stats, slots: usize, device_slots: &[usize]) -> Self {
        let devices = if device_slots.len() > 1 {
            s.devices()
                .iter()
                .zip(device_slots)
                .map(|(d, &slots)| DeviceExperts {
                    slots,
                    moe_layers: d.moe_layers,
                    hits: d.hits,
                    misses: d.misses,
                    hit_rate: d.hit_rate,
                    h2d_bytes: d.h2d_bytes,
                })
                .collect()
        } else {
            Vec::new()
        };
        let sum = |f: fn(&crate::experts::stats::LayerStats) -> u64| s.layers.iter().map(f).sum();
        Self {
            slots,
            hits: sum(|l| l.hits),
            misses: sum(|l| l.misses),
            cpu: sum(|l| l.cpu),
            hit_rate: s.hit_rate(),
            own_hit_rate: s.cache_hit_rate(),
            cpu_share: s.cpu_share(),
            prefetch_precision: s.prefetch_precision(),
            prefetch_recall: s.prefetch_recall(),
            h2d_bytes: s.h2d_bytes,
            cpu_bytes: s.cpu_bytes,
            copies: sum(|l| l.copies),
            prefetched: sum(|l| l.prefetched),
            stops: s.stops,
            stop_s: s.hook_s,
            steps: s.steps,
            gated_steps: s.gated_steps,
            table_steps: s.table_steps,
            split_steps: s.split_steps,
            passed_stops: s.hit_stops,
            compute_s: s.compute_s,
            wait_copy_s: s.wait_copy_s,
            wait_cpu_s: s.wait_cpu_s,
            channels: s.channels.map(|c| ChannelRates {
                pcie_gb_s: c.pcie_gb_s,
                cpu_gb_s: c.cpu_gb_s,
                cpu_start_us: c.cpu_start_us,
                cpu_correction_us: c.cpu_correction_us,
                measured: c.measured,
            }),
            devices,
        }
    }
}

impl Engine {
    /// The expert cache's figures now (`None` when the model is fully resident).
    pub fn experts_snapshot(&self) -> Option<ExpertsSnapshot> {
        self.offload.as_ref().map(|o| {
            let per: Vec<usize> = (0..o.n_devices()).map(|d| o.n_slots_on(d)).collect();
            ExpertsSnapshot::with_devices(o.stats(), o.n_slots(), &per)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::experts::stats::{ChannelRates as Rates, Stats};

    #[test]
    fn experts_snapshot_sums_layers_and_keeps_the_rates() {
        let mut s = Stats::new(2);
        (s.layers[0].hits, s.layers[0].misses, s.layers[0].cpu) = (3, 1, 1);
        (s.layers[1].hits, s.layers[1].misses, s.layers[1].cpu) = (3, 3, 2);
        (s.layers[0].prefetched, s.layers[0].prefetch_used) = (4, 2);
        (s.layers[1].predicted_used, s.layers[1].used) = (3, 4);
        (s.h2d_bytes, s.cpu_bytes, s.stops, s.hook_s) = (7, 11, 13, 0.5);
        (s.layers[0].copies, s.layers[1].copies) = (5, 2);
        (s.steps, s.gated_steps, s.hit_stops) = (17, 9, 19);
        (s.table_steps, s.split_steps) = (2, 5);
        (s.compute_s, s.wait_copy_s, s.wait_cpu_s) = (1.5, 0.25, 0.125);
        s.channels = Some(Rates {
            pcie_gb_s: 25.0,
            cpu_gb_s: 40.0,
            cpu_start_us: 30.0,
            measured: true,
            cpu_correction_us: -5.0,
            slack_target_us: 20.0,
        });
        let x = ExpertsSnapshot::new(&s, 6);
        assert_eq!(
            x,
            ExpertsSnapshot {
                slots: 6,
                hits: 6,
                misses: 4,
                cpu: 3,
                hit_rate: 0.6,
                own_hit_rate: 0.4,
                cpu_share: 0.75,
                prefetch_precision: 0.5,
                prefetch_recall: 0.75,
                h2d_bytes: 7,
                cpu_bytes: 11,
                copies: 7,
                prefetched: 4,
                stops: 13,
                stop_s: 0.5,
                steps: 17,
                gated_steps: 9,
                table_steps: 2,
                split_steps: 5,
                passed_stops: 19,
                compute_s: 1.5,
                wait_copy_s: 0.25,
                wait_cpu_s: 0.125,
                channels: Some(ChannelRates {
                    pcie_gb_s: 25.0,
                    cpu_gb_s: 40.0,
                    cpu_start_us: 30.0,
                    cpu_correction_us: -5.0,
                    measured: true,
                }),
                devices: Vec::new(),
            }
        );
        // A layer split: layer 0 on device 0 (6 slots), layer 1 on device 1 (9 slots).
        s.layer_device = vec![0, 1];
        (s.layers[0].h2d_bytes, s.layers[1].h2d_bytes) = (2, 5);
        let x = ExpertsSnapshot::with_devices(&s, 6, &[6, 9]);
        assert_eq!(
            x.devices,
            vec![
                DeviceExperts {
                    slots: 6,
                    moe_layers: 0,
                    hits: 3,
                    misses: 1,
                    hit_rate: 0.75,
                    h2d_bytes: 2,
                },
                DeviceExperts {
                    slots: 9,
                    moe_layers: 1,
                    hits: 3,
                    misses: 3,
                    hit_rate: 0.5,
                    h2d_bytes: 5,
                },
            ]
        );
    }
}
