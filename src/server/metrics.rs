//! `/metrics` in Prometheus' text format (version 0.0.4): HTTP requests by route and status,
//! tokens, throughput, queue depth and batch occupancy, and — when the engine offloads experts —
//! the expert cache's counters from `experts::Stats` (nothing is printed for figures the engine
//! does not have: no placeholder zeros).
use super::api::{EngineStats, Health, ModelCard};
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

    pub fn render(&self, card: &ModelCard, health: &Health, s: &EngineStats) -> String {
        let mut o = String::new();
        let mut metric = |name: &str, kind: &str, help: &str, samples: &[(String, f64)]| {
            let _ = writeln!(o, "# HELP pocketmoe_{name} {help}");
            let _ = writeln!(o, "# TYPE pocketmoe_{name} {kind}");
            for (labels, v) in samples {
                let _ = writeln!(o, "pocketmoe_{name}{labels} {v}");
            }
        };
        let one = |v: f64| vec![(String::new(), v)];
        let requests: Vec<(String, f64)> = self
            .counts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|((r, st), n)| (format!("{{route=\"{r}\",status=\"{st}\"}}"), *n as f64))
            .collect();
        metric(
            "requests_total",
            "counter",
            "HTTP requests answered, by route and status.",
            &requests,
        );
        let (ready, progress) = match health {
            Health::Ready => (1.0, 1.0),
            Health::Loading { fraction } => (0.0, *fraction),
            _ => (0.0, 0.0),
        };
        metric(
            "model_ready",
            "gauge",
            &format!("1 when the model {} is loaded and serving.", card.id),
            &one(ready),
        );
        metric(
            "model_load_progress",
            "gauge",
            "Fraction of the weights loaded.",
            &one(progress),
        );
        metric(
            "prompt_tokens_total",
            "counter",
            "Prompt tokens of admitted requests.",
            &one(s.prompt_tokens as f64),
        );
        metric(
            "generated_tokens_total",
            "counter",
            "Tokens generated.",
            &one(s.generated_tokens as f64),
        );
        metric(
            "generation_tokens_per_second",
            "gauge",
            "Tokens generated per second, all sequences together, over the last 10 s.",
            &one(s.recent_tok_s),
        );
        metric(
            "queue_depth",
            "gauge",
            "Requests waiting for a free sequence slot.",
            &one(s.queued as f64),
        );
        metric(
            "active_sequences",
            "gauge",
            "Sequences being decoded together.",
            &one(s.active as f64),
        );
        metric(
            "parallel_slots",
            "gauge",
            "Sequences that can be decoded together (--parallel).",
            &one(s.parallel as f64),
        );
        metric(
            "forward_passes_total",
            "counter",
            "Batched forward passes run.",
            &one(s.steps as f64),
        );
        metric(
            "batch_tokens_total",
            "counter",
            "Tokens carried by the forward passes (prompt and decode).",
            &one(s.batch_tokens as f64),
        );
        metric(
            "requests_cancelled_total",
            "counter",
            "Requests dropped before the end (client gone or stop string reached).",
            &one(s.cancelled as f64),
        );
        if let Some(x) = &s.offload {
            let sum = |f: fn(&crate::experts::stats::LayerStats) -> u64| -> f64 {
                x.layers.iter().map(f).sum::<u64>() as f64
            };
            metric(
                "expert_hits_total",
                "counter",
                "Routed-expert uses served from the GPU cache.",
                &one(sum(|l| l.hits)),
            );
            metric(
                "expert_misses_total",
                "counter",
                "Routed-expert uses not in the GPU cache.",
                &one(sum(|l| l.misses)),
            );
            metric(
                "expert_cpu_total",
                "counter",
                "Misses computed on the CPU.",
                &one(sum(|l| l.cpu)),
            );
            metric(
                "expert_cache_hit_ratio",
                "gauge",
                "Hits / (hits + misses) since start.",
                &one(x.hit_rate()),
            );
            metric(
                "expert_cpu_share",
                "gauge",
                "Share of misses computed on the CPU.",
                &one(x.cpu_share()),
            );
            metric(
                "expert_prefetch_precision",
                "gauge",
                "Prefetched experts that were used / prefetched.",
                &one(x.prefetch_precision()),
            );
            metric(
                "expert_prefetch_recall",
                "gauge",
                "Used experts that had been predicted / used.",
                &one(x.prefetch_recall()),
            );
            metric(
                "expert_h2d_bytes_total",
                "counter",
                "Expert bytes copied host to GPU.",
                &one(x.h2d_bytes as f64),
            );
            metric(
                "expert_cpu_bytes_total",
                "counter",
                "Expert bytes read by the CPU.",
                &one(x.cpu_bytes as f64),
            );
            metric(
                "expert_graph_stops_total",
                "counter",
                "Graph stops for expert routing (about one per offloaded layer per step).",
                &one(x.stops as f64),
            );
            metric(
                "expert_stop_seconds_total",
                "counter",
                "Host seconds spent in those stops (the GPU idles meanwhile).",
                &one(x.hook_s),
            );
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
        let mut s = EngineStats {
            queued: 3,
            ..Default::default()
        };
        let text = m.render(&card, &Health::Ready, &s);
        assert!(text
            .contains("pocketmoe_requests_total{route=\"/v1/chat/completions\",status=\"200\"} 2"));
        assert!(text.contains("pocketmoe_requests_total{route=\"other\",status=\"404\"} 1"));
        assert!(text.contains("pocketmoe_queue_depth 3"));
        assert!(!text.contains("expert"));
        let mut st = crate::experts::Stats::new(2);
        st.layers[0].hits = 3;
        st.layers[1].misses = 1;
        s.offload = Some(st);
        let text = m.render(&card, &Health::Ready, &s);
        assert!(
            text.contains("pocketmoe_expert_cache_hit_ratio 0.75"),
            "{text}"
        );
    }
}
