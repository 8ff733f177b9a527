//! `/metrics` in Prometheus' text format (version 0.0.4): HTTP requests by route and status,
//! tokens, throughput, queue depth, batch occupancy and KV-cache use, and — when the engine
//! offloads experts — the expert cache's figures (all from the engine's [`StatsSnapshot`]; nothing
//! is printed for figures the engine does not have: no placeholder zeros), and the connection
//! layer's counters (`conn`).
use super::api::{Health, ModelCard, StatsSnapshot};
use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Mutex;

/// Routes that get their own label; anything else is counted as "other".
const ROUTES: [&str; 7] = [
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/models",
    "/health",
    "/metrics",
    "/v1/models/{id}",
    "other",
];

#[derive(Default)]
pub struct HttpMetrics {
    counts: Mutex<BTreeMap<(&'static str, u16), u64>>,
}

impl HttpMetrics {
    pub fn record(&self, path: &str, status: u16) {
        let route = ROUTES.iter().find(|r| **r == path).copied().unwrap_or(
            if path.starts_with("/v1/models/") {
                "/v1/models/{id}"
            } else {
                "other"
            },
        );
        *self
            .counts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry((route, status))
            .or_default() += 1;
    }

    pub fn render(
        &self,
        card: &ModelCard,
        health: &Health,
        s: &StatsSnapshot,
        conns: Option<&super::conn::Conns>,
    ) -> String {
        const COUNTER: &str = "counter";
        const GAUGE: &str = "gauge";
        let mut o = String::new();
        let mut metric = |name: &str, kind: &str, help: &str, samples: &[(String, f64)]| {
            let _ = writeln!(o, "# HELP pocketmoe_{name} {help}");
            let _ = writeln!(o, "# TYPE pocketmoe_{name} {kind}");
            for (labels, v) in samples {
                let _ = writeln!(o, "pocketmoe_{name}{labels} {v}");
            }
        };
        let requests: Vec<(String, f64)> = self
            .counts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|((r, st), n)| (format!("{{route=\"{r}\",status=\"{st}\"}}"), *n as f64))
            .collect();
        metric(
            "requests_total",
            COUNTER,
            "HTTP requests answered, by route and status.",
            &requests,
        );
        let (ready, progress) = match health {
            Health::Ready => (1.0, 1.0),
            Health::Loading { fraction } => (0.0, *fraction),
            _ => (0.0, 0.0),
        };
        let ready_help = format!("1 when the model {} is loaded and serving.", card.id);
        // (name, type, help, value): one unlabelled sample each.
        let mut single: Vec<(&str, &str, &str, f64)> = vec![
            ("model_ready", GAUGE, &ready_help, ready),
            (
                "model_load_progress",
                GAUGE,
                "Fraction of the weights loaded.",
                progress,
            ),
            (
                "prompt_tokens_total",
                COUNTER,
                "Prompt tokens evaluated (those a slot's prompt cache supplied are not counted).",
                s.prompt_tokens as f64,
            ),
            (
                "generated_tokens_total",
                COUNTER,
                "Tokens generated.",
                s.generated_tokens as f64,
            ),
            (
                "generation_tokens_per_second",
                GAUGE,
                "Tokens generated per second, all sequences together, over the last 10 s.",
                s.recent_tok_s,
            ),
            (
                "queue_depth",
                GAUGE,
                "Requests waiting for a free sequence slot.",
                s.queued as f64,
            ),
            (
                "active_sequences",
                GAUGE,
                "Sequences being decoded together.",
                s.active as f64,
            ),
            (
                "parallel_slots",
                GAUGE,
                "Sequences that can be decoded together (--parallel).",
                s.parallel as f64,
            ),
            (
                "kv_cache_tokens",
                GAUGE,
                "KV-cache rows held by active sequences (0 when idle).",
                s.kv_tokens as f64,
            ),
            (
                "kv_cache_capacity_tokens",
                GAUGE,
                "KV-cache rows in all (--ctx x --parallel).",
                (card.n_ctx * s.parallel) as f64,
            ),
            (
                "forward_passes_total",
                COUNTER,
                "Batched forward passes run.",
                s.steps as f64,
            ),
            (
                "batch_tokens_total",
                COUNTER,
                "Tokens carried by the forward passes (prompt and decode).",
                s.batch_tokens as f64,
            ),
            (
                "requests_cancelled_total",
                COUNTER,
                "Requests dropped before the end (client gone or stop string reached).",
                s.cancelled as f64,
            ),
        ];
        if let Some(c) = conns {
            let n = |x: &std::sync::atomic::AtomicU64| {
                x.load(std::sync::atomic::Ordering::Relaxed) as f64
            };
            let k = &c.counters;
            single.extend([
                (
                    "connections_open",
                    GAUGE,
                    "Open HTTP connections.",
                    c.open() as f64,
                ),
                (
                    "connections_accepted_total",
                    COUNTER,
                    "Connections accepted.",
                    n(&k.accepted),
                ),
                (
                    "connections_rejected_total",
                    COUNTER,
                    "Connections answered 503 at --max-connections (every open one busy).",
                    n(&k.rejected),
                ),
                (
                    "connections_evicted_total",
                    COUNTER,
                    "Idle connections closed at --max-connections to make room for a new one.",
                    n(&k.evicted),
                ),
                (
                    "connections_timed_out_total",
                    COUNTER,
                    "Connections closed by --header-timeout.",
                    n(&k.timed_out),
                ),
                (
                    "malformed_requests_total",
                    COUNTER,
                    "Request heads answered 400/414/431 before routing.",
                    n(&k.malformed),
                ),
            ]);
        }
        if let Some(x) = &s.experts {
            single.extend([
                (
                    "expert_hits_total",
                    COUNTER,
                    "Routed-expert uses served from the GPU cache.",
                    x.hits as f64,
                ),
                (
                    "expert_misses_total",
                    COUNTER,
                    "Routed-expert uses not in the GPU cache.",
                    x.misses as f64,
                ),
                (
                    "expert_cpu_total",
                    COUNTER,
                    "Misses computed on the CPU.",
                    x.cpu as f64,
                ),
                (
                    "expert_cache_hit_ratio",
                    GAUGE,
                    "Hits / (hits + misses) since start.",
                    x.hit_rate,
                ),
                (
                    "expert_cache_own_hit_ratio",
                    GAUGE,
                    "As expert_cache_hit_ratio, with hits a prefetch made counted as misses (what PCIe traffic follows).",
                    x.own_hit_rate,
                ),
                (
                    "expert_cpu_share",
                    GAUGE,
                    "Share of misses computed on the CPU.",
                    x.cpu_share,
                ),
                (
                    "expert_prefetch_precision",
                    GAUGE,
                    "Prefetched experts that were used / prefetched.",
                    x.prefetch_precision,
                ),
                (
                    "expert_prefetch_recall",
                    GAUGE,
                    "Used experts that had been predicted / used.",
                    x.prefetch_recall,
                ),
                (
                    "expert_h2d_bytes_total",
                    COUNTER,
                    "Expert bytes copied host to GPU.",
                    x.h2d_bytes as f64,
                ),
                (
                    "expert_cpu_bytes_total",
                    COUNTER,
                    "Expert bytes read by the CPU.",
                    x.cpu_bytes as f64,
                ),
                (
                    "expert_copies_total",
                    COUNTER,
                    "Experts copied host to GPU (miss copies, prefetches, prefill staging).",
                    x.copies as f64,
                ),
                (
                    "expert_prefetched_total",
                    COUNTER,
                    "Of those, experts copied ahead of their layer on a prediction.",
                    x.prefetched as f64,
                ),
                (
                    "expert_graph_stops_total",
                    COUNTER,
                    "Graph stops for expert routing (about one per offloaded layer per step).",
                    x.stops as f64,
                ),
                (
                    "expert_stop_seconds_total",
                    COUNTER,
                    "Host seconds spent in those stops (the GPU idles meanwhile unless the step is gated).",
                    x.stop_s,
                ),
                (
                    "expert_steps_total",
                    COUNTER,
                    "Forward passes with offloaded experts.",
                    x.steps as f64,
                ),
                (
                    "expert_gated_steps_total",
                    COUNTER,
                    "Of those, steps run gated (the graph queued a stop ahead, behind a gate on the GPU).",
                    x.gated_steps as f64,
                ),
                (
                    "expert_table_steps_total",
                    COUNTER,
                    "Of the gated steps, those in table form (the GPU gathers its picks' slots itself).",
                    x.table_steps as f64,
                ),
                (
                    "expert_split_steps_total",
                    COUNTER,
                    "Of the gated steps, those in split form (a layer's GPU experts run beside its CPU job).",
                    x.split_steps as f64,
                ),
                (
                    "expert_stops_passed_on_gpu_total",
                    COUNTER,
                    "Stops of gated steps the GPU passed on its own, every pick resident in its expert table.",
                    x.passed_stops as f64,
                ),
                (
                    "expert_step_seconds_total",
                    COUNTER,
                    "Wall seconds of the forward passes with offloaded experts (per step: divide by expert_steps_total).",
                    x.compute_s,
                ),
                (
                    "expert_wait_copy_seconds_total",
                    COUNTER,
                    "Host seconds those steps waited for expert copies to land.",
                    x.wait_copy_s,
                ),
                (
                    "expert_wait_cpu_seconds_total",
                    COUNTER,
                    "Host seconds those steps waited for the experts computed on the CPU.",
                    x.wait_cpu_s,
                ),
            ]);
        }
        for (name, kind, help, v) in single {
            metric(name, kind, help, &[(String::new(), v)]);
        }
        // A layer split: each device's expert cache, labelled by device.
        if let Some(x) = s.experts.as_ref().filter(|x| !x.devices.is_empty()) {
            let per = |f: &dyn Fn(&crate::engine::snapshot::DeviceExperts) -> f64| {
                x.devices
                    .iter()
                    .enumerate()
                    .map(|(d, e)| (format!("{{device=\"{d}\"}}"), f(e)))
                    .collect::<Vec<_>>()
            };
            metric(
                "expert_device_slots",
                GAUGE,
                "Expert-cache slots per MoE layer on each device of the layer split (under -sm expert: \
                 per MoE layer of its share of the experts).",
                &per(&|e| e.slots as f64),
            );
            metric(
                "expert_device_layers",
                GAUGE,
                "MoE layers of each device that ran experts (its share of the layers; under -sm \
                 expert every layer, each device its share of the experts).",
                &per(&|e| e.moe_layers as f64),
            );
            metric(
                "expert_device_hit_ratio",
                GAUGE,
                "Hits / (hits + misses) since start, over each device's layers (under -sm expert: \
                 its share of every layer's experts, decode steps).",
                &per(&|e| e.hit_rate),
            );
            metric(
                "expert_device_h2d_bytes_total",
                COUNTER,
                "Expert bytes copied host to each device.",
                &per(&|e| e.h2d_bytes as f64),
            );
        }
        o
    }
}

/// The time finished requests spent in their prompt and generation phases (`respond::timings`),
/// for llama-server's `llamacpp:prompt_seconds_total` / `llamacpp:tokens_predicted_seconds_total`.
#[derive(Debug, Default)]
pub struct LlamaTotals {
    prompt_us: std::sync::atomic::AtomicU64,
    predicted_us: std::sync::atomic::AtomicU64,
}

impl LlamaTotals {
    pub fn add(&self, prompt_ms: f64, predicted_ms: f64) {
        use std::sync::atomic::Ordering::Relaxed;
        self.prompt_us
            .fetch_add((prompt_ms * 1e3).max(0.0) as u64, Relaxed);
        self.predicted_us
            .fetch_add((predicted_ms * 1e3).max(0.0) as u64, Relaxed);
    }

    /// llama-server's `llamacpp:*` series (its names, types and meanings), from our counters, so
    /// dashboards built for llama-server work unchanged beside the `pocketmoe_*` ones.
    pub fn render(&self, card: &ModelCard, s: &StatsSnapshot) -> String {
        use std::sync::atomic::Ordering::Relaxed;
        let prompt_s = self.prompt_us.load(Relaxed) as f64 / 1e6;
        let predicted_s = self.predicted_us.load(Relaxed) as f64 / 1e6;
        let rate = |n: u64, secs: f64| if secs > 0.0 { n as f64 / secs } else { 0.0 };
        let capacity = (card.n_ctx * s.parallel).max(1) as f64;
        let rows: [(&str, &str, &str, f64); 11] = [
            (
                "prompt_tokens_total",
                "counter",
                "Number of prompt tokens processed.",
                s.prompt_tokens as f64,
            ),
            (
                "prompt_seconds_total",
                "counter",
                "Prompt process time (from queueing to the first token).",
                prompt_s,
            ),
            (
                "tokens_predicted_total",
                "counter",
                "Number of generation tokens processed.",
                s.generated_tokens as f64,
            ),
            (
                "tokens_predicted_seconds_total",
                "counter",
                "Predict process time.",
                predicted_s,
            ),
            (
                "n_decode_total",
                "counter",
                "Total number of llama_decode() calls (forward passes).",
                s.steps as f64,
            ),
            (
                "n_busy_slots_per_decode",
                "counter",
                "Average number of busy slots per llama_decode() call.",
                if s.steps == 0 { 0.0 } else { s.active as f64 },
            ),
            (
                "prompt_tokens_seconds",
                "gauge",
                "Average prompt throughput in tokens/s.",
                rate(s.prompt_tokens, prompt_s),
            ),
            (
                "predicted_tokens_seconds",
                "gauge",
                "Average generation throughput in tokens/s.",
                rate(s.generated_tokens, predicted_s),
            ),
            (
                "kv_cache_usage_ratio",
                "gauge",
                "KV-cache usage. 1 means 100 percent usage.",
                s.kv_tokens as f64 / capacity,
            ),
            (
                "requests_processing",
                "gauge",
                "Number of requests processing.",
                s.active as f64,
            ),
            (
                "requests_deferred",
                "gauge",
                "Number of requests deferred.",
                s.queued as f64,
            ),
        ];
        let mut o = String::new();
        for (name, kind, help, v) in rows {
            let _ = writeln!(o, "# HELP llamacpp:{name} {help}");
            let _ = writeln!(o, "# TYPE llamacpp:{name} {kind}");
            let _ = writeln!(o, "llamacpp:{name} {v}");
        }
        o
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::api::OutputFormat;

    #[test]
    fn renders_prometheus_text() {
        let m = HttpMetrics::default();
        m.record("/v1/chat/completions", 200);
        m.record("/v1/chat/completions", 200);
        m.record("/nope", 404);
        let card = ModelCard {
            id: "tiny".into(),
            aliases: vec![],
            created: 0,
            n_ctx: 256,
            n_vocab: 1000,
            format: OutputFormat::Plain,
            has_chat_template: true,
        };
        let mut s = StatsSnapshot {
            queued: 3,
            ..Default::default()
        };
        let text = m.render(&card, &Health::Ready, &s, None);
        assert!(text
            .contains("pocketmoe_requests_total{route=\"/v1/chat/completions\",status=\"200\"} 2"));
        assert!(text.contains("pocketmoe_requests_total{route=\"other\",status=\"404\"} 1"));
        assert!(text.contains("pocketmoe_queue_depth 3"));
        assert!(!text.contains("expert"));
        s.experts = Some(crate::engine::snapshot::ExpertsSnapshot {
            hit_rate: 0.75,
            gated_steps: 9,
            table_steps: 2,
            split_steps: 5,
            ..Default::default()
        });
        let text = m.render(&card, &Health::Ready, &s, None);
        for want in [
            "pocketmoe_expert_cache_hit_ratio 0.75",
            // Which way the gated steps ran (`Gated::Auto`'s duel chooses).
            "pocketmoe_expert_gated_steps_total 9",
            "pocketmoe_expert_table_steps_total 2",
            "pocketmoe_expert_split_steps_total 5",
        ] {
            assert!(text.contains(want), "{want} missing: {text}");
        }
        // One device: no per-device series.
        assert!(!text.contains("expert_device"), "{text}");
        // A layer split over two devices: each one's cache, by device label.
        use crate::engine::snapshot::DeviceExperts;
        s.experts.as_mut().unwrap().devices = vec![
            DeviceExperts {
                slots: 40,
                moe_layers: 24,
                hit_rate: 0.5,
                h2d_bytes: 7,
                ..Default::default()
            },
            DeviceExperts {
                slots: 31,
                moe_layers: 24,
                hit_rate: 0.25,
                h2d_bytes: 9,
                ..Default::default()
            },
        ];
        let text = m.render(&card, &Health::Ready, &s, None);
        for want in [
            "pocketmoe_expert_device_slots{device=\"0\"} 40",
            "pocketmoe_expert_device_slots{device=\"1\"} 31",
            "pocketmoe_expert_device_layers{device=\"1\"} 24",
            "pocketmoe_expert_device_hit_ratio{device=\"0\"} 0.5",
            "pocketmoe_expert_device_hit_ratio{device=\"1\"} 0.25",
            "pocketmoe_expert_device_h2d_bytes_total{device=\"1\"} 9",
        ] {
            assert!(text.contains(want), "{want} missing: {text}");
        }
    }
}
