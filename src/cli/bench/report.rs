//! What `pocketmoe bench` reports: every setting tried (ours and llama.cpp's, per budget), and one
//! row per (budget, test) comparing ours with llama.cpp's best setting that fits the budget, with
//! the decode/prefill bound docs/design.md §1 implies and the fraction of it we reach. Printed as
//! markdown (llama-bench's test names: `pp512`, `tg128 @ d8192`), written as JSON.
//!
//! Bounds (tokens/s), from the placement plan for the budget (`model::placement`):
//! - tg: one token reads the resident weights, the KV cache up to the depth and the hit experts
//!   from VRAM, and the missed experts over PCIe and by the CPU in parallel:
//!   `1 / max((resident + kv(d) + hit·experts) / HBM, miss·experts / (PCIe + CPU))`, with the
//!   measured hit rate when the engine reports one (the cache's own: hits a prefetch made moved
//!   their bytes over PCIe too), else the cached fraction (uniform routing).
//!   On the CPU device everything streams from host RAM at the CPU bandwidth.
//! - pp with offload: each expert not cached crosses PCIe at most once per micro-batch, so
//!   `ubatch · PCIe / uncached expert bytes`. Fully resident or CPU prefill is compute-bound and
//!   has no bound here.
use super::measure::{Measurement, Test};
use crate::cli::inspect::human_bytes;
use crate::gguf::TensorInfo;
use crate::model::placement::{self, Bandwidths};
use crate::model::{Hparams, Role};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::fmt::Write as _;

/// How a setting ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// Fits the budget; the tests ran on it.
    Ran,
    /// Fits, but the search kept looking for a setting with fewer host experts.
    Fits,
    OverBudget,
    Failed(String),
}

/// One engine configuration at one budget, with its measurements.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Setting {
    /// `pocketmoe` or `llama.cpp`.
    pub engine: String,
    /// VRAM budget in bytes; None = resident (the whole device).
    pub budget: Option<u64>,
    /// The setting in the engine's own flags (`-ngl 99 --n-cpu-moe 18 -ub 2048`).
    pub label: String,
    /// llama.cpp: layers whose routed experts stay in host memory.
    pub n_cpu_moe: Option<usize>,
    pub n_ubatch: usize,
    /// Peak device memory above what was in use before the model loaded (None on the CPU).
    pub vram_bytes: Option<u64>,
    /// Peak resident set of the process while the setting ran.
    pub host_rss_bytes: u64,
    pub fits: bool,
    pub status: Status,
    pub results: Vec<Measurement>,
}

impl Setting {
    fn get(&self, test: &str) -> Option<&Measurement> {
        self.results.iter().find(|m| m.test == test)
    }
}

/// One line of the comparison.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    pub budget: Option<u64>,
    pub test: String,
    pub n_prompt: usize,
    pub n_gen: usize,
    pub depth: usize,
    pub ours_tok_s: Option<f64>,
    pub ours_std: Option<f64>,
    pub llama_tok_s: Option<f64>,
    pub llama_std: Option<f64>,
    /// The llama.cpp setting the row compares with (its fastest that fits).
    pub llama_setting: Option<String>,
    /// ours / llama.cpp.
    pub ratio: Option<f64>,
    /// The in-process llama.cpp at its fastest setting that fits, and stock llama-bench at that
    /// same setting (`--llama-bench`): the cross-check of the baseline. `llama_tok_s` is the
    /// faster of every llama.cpp figure, in-process or stock.
    pub inproc_tok_s: Option<f64>,
    pub stock_tok_s: Option<f64>,
    pub ours_vram_bytes: Option<u64>,
    pub ours_fits: Option<bool>,
    pub llama_vram_bytes: Option<u64>,
    pub ours_rss_bytes: Option<u64>,
    pub llama_rss_bytes: Option<u64>,
    pub hit_rate: Option<f64>,
    /// The cache's own hit rate: without the hits prefetches made.
    pub cache_hit_rate: Option<f64>,
    pub pcie_gbs: Option<f64>,
    /// Host milliseconds per token spent in the offload's graph stops, while the GPU idles.
    pub stall_ms_per_token: Option<f64>,
    pub bound_tok_s: Option<f64>,
    pub bound_fraction: Option<f64>,
}

/// The whole result (`--json`).
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub model: String,
    pub file_bytes: u64,
    /// `CPU` or `CUDA<n>`.
    pub device: String,
    /// Device memory, bytes (None on the CPU).
    pub device_memory: Option<u64>,
    pub threads: usize,
    /// ggml's name for this build's CPU kernels (`haswell`, `sapphirerapids`, ...), which our CPU
    /// channel and the in-process llama.cpp both use.
    #[serde(default)]
    pub cpu_variant: String,
    pub reps: usize,
    pub bandwidths: Bandwidths,
    /// Whether the CPU rate in `bandwidths` was measured on this machine (else given).
    #[serde(default)]
    pub cpu_bw_measured: bool,
    pub settings: Vec<Setting>,
    pub rows: Vec<Row>,
}

/// What the bound needs to know about the model.
pub struct ModelFacts {
    pub hp: Hparams,
    pub tensors: Vec<TensorInfo>,
    pub roles: HashMap<String, Role>,
    pub file_bytes: u64,
}

/// The bound (tokens/s) for `test` at `budget`; see the module header.
pub fn bound(
    f: &ModelFacts,
    on_gpu: bool,
    budget: Option<u64>,
    test: &Test,
    hit_rate: Option<f64>,
    ubatch: usize,
    bw: Bandwidths,
) -> Option<f64> {
    let ctx = (test.depth + test.n_prompt + test.n_gen) as u64;
    let p = placement::plan(
        &f.hp,
        &f.tensors,
        &f.roles,
        budget.unwrap_or(u64::MAX / 4),
        ctx,
        hit_rate,
        bw,
    );
    let kv = placement::kv_bytes(&f.hp, test.depth as u64) as f64;
    let experts = p.active_expert_bytes as f64;
    let resident = p.active_resident_bytes as f64;
    let offloaded = p.cached_fraction < 1.0;
    if !on_gpu {
        return (!test.is_pp()).then(|| bw.cpu / (resident + kv + experts));
    }
    if test.is_pp() {
        let uncached = p.expert_bytes_total.saturating_sub(p.cache_bytes) as f64;
        return offloaded.then(|| ubatch.min(test.n_prompt) as f64 * bw.pcie / uncached);
    }
    let hit = if offloaded { p.hit_rate } else { 1.0 };
    let t_hbm = (resident + kv + hit * experts) / bw.hbm;
    let t_miss = (1.0 - hit) * experts / (bw.pcie + bw.cpu);
    Some(1.0 / t_hbm.max(t_miss))
}

/// The bound (tokens/s) for (budget, test, measured hit rate).
pub type BoundFn<'a> = dyn Fn(Option<u64>, &Test, Option<f64>) -> Option<f64> + 'a;

/// One row per (budget, test): ours against llama.cpp's fastest setting that fits.
pub fn rows(
    settings: &[Setting],
    budgets: &[Option<u64>],
    tests: &[Test],
    bound_of: &BoundFn<'_>,
) -> Vec<Row> {
    let mut out = Vec::new();
    for &b in budgets {
        let at = |engine: &'static str| {
            settings
                .iter()
                .filter(move |s| s.engine == engine && s.budget == b)
        };
        for t in tests {
            let name = t.name();
            let ours = at("pocketmoe").find_map(|s| s.get(&name).map(|m| (s, m)));
            let fastest = |engines: &[&str]| {
                settings
                    .iter()
                    .filter(|s| s.budget == b && engines.contains(&s.engine.as_str()))
                    .filter(|s| s.fits && s.status == Status::Ran)
                    .filter_map(|s| s.get(&name).map(|m| (s, m)))
                    .max_by(|a, b| a.1.mean.total_cmp(&b.1.mean))
            };
            let inproc = fastest(&["llama.cpp"]);
            let best = fastest(&["llama.cpp", super::stock::ENGINE]);
            let stock = inproc.and_then(|(s, _)| {
                at(super::stock::ENGINE)
                    .find(|x| x.label == s.label)
                    .and_then(|x| x.get(&name))
            });
            // Stock measures no memory: a stock best shows the in-process run at its setting.
            let best_mem = best.and_then(|(s, _)| {
                if s.engine == super::stock::ENGINE {
                    at("llama.cpp").find(|x| x.label == s.label)
                } else {
                    Some(s)
                }
            });
            let hit = ours.and_then(|(_, m)| m.offload.as_ref().map(|o| o.hit_rate));
            // The bound follows the bytes: prefetched hits crossed PCIe too.
            let own_hit = ours.and_then(|(_, m)| m.offload.as_ref().map(|o| o.cache_hit_rate));
            let bound_tok_s = ours.and_then(|_| bound_of(b, t, own_hit));
            out.push(Row {
                budget: b,
                test: name,
                n_prompt: t.n_prompt,
                n_gen: t.n_gen,
                depth: t.depth,
                ours_tok_s: ours.map(|(_, m)| m.mean),
                ours_std: ours.map(|(_, m)| m.std),
                llama_tok_s: best.map(|(_, m)| m.mean),
                llama_std: best.map(|(_, m)| m.std),
                llama_setting: best.map(|(s, _)| {
                    if s.engine == super::stock::ENGINE {
                        format!("{} (stock)", s.label)
                    } else {
                        s.label.clone()
                    }
                }),
                inproc_tok_s: inproc.map(|(_, m)| m.mean),
                stock_tok_s: stock.map(|m| m.mean),
                ratio: ours.zip(best).map(|((_, o), (_, l))| o.mean / l.mean),
                ours_vram_bytes: ours.and_then(|(s, _)| s.vram_bytes),
                ours_fits: ours.map(|(s, _)| s.fits),
                llama_vram_bytes: best_mem.and_then(|s| s.vram_bytes),
                ours_rss_bytes: ours.map(|(s, _)| s.host_rss_bytes),
                llama_rss_bytes: best_mem.map(|s| s.host_rss_bytes),
                hit_rate: hit,
                cache_hit_rate: own_hit,
                pcie_gbs: ours.and_then(|(_, m)| m.offload.as_ref().map(|o| o.pcie_gbs)),
                stall_ms_per_token: ours.and_then(|(_, m)| {
                    m.offload
                        .as_ref()
                        .map(|o| o.stops_per_token * o.us_per_stop / 1e3)
                }),
                bound_tok_s,
                bound_fraction: ours.zip(bound_tok_s).map(|((_, m), bd)| m.mean / bd),
            });
        }
    }
    out
}

/// `resident` or the budget in binary units.
pub fn budget_name(b: Option<u64>) -> String {
    b.map_or_else(|| "resident".into(), human_bytes)
}

/// The comparison columns, in order (tests check them).
pub const COLUMNS: [&str; 16] = [
    "budget",
    "test",
    "pocketmoe t/s",
    "llama.cpp t/s",
    "ratio",
    "llama.cpp setting",
    "in-process / stock",
    "VRAM ours",
    "VRAM llama.cpp",
    "RSS ours",
    "RSS llama.cpp",
    "hit rate (own)",
    "PCIe GB/s",
    "stall ms/tok",
    "bound t/s",
    "of bound",
];

/// The settings table's columns.
pub const SETTING_COLUMNS: [&str; 7] = [
    "budget", "engine", "setting", "VRAM", "host RSS", "status", "t/s",
];

fn opt<T>(v: Option<T>, f: impl Fn(T) -> String) -> String {
    v.map_or_else(|| "-".into(), f)
}

fn table_row(cells: &[String]) -> String {
    format!("| {} |\n", cells.join(" | "))
}

/// The markdown report: the comparison, then every setting tried.
pub fn markdown(r: &Report) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "pocketmoe bench: {} ({}) on {}, {} threads, CPU kernels {}, {} reps; t/s = mean ± sd; bound from HBM {:.0} / PCIe {:.1} / CPU {:.1} GB/s{}\n",
        r.model,
        human_bytes(r.file_bytes),
        r.device,
        r.threads,
        r.cpu_variant,
        r.reps,
        r.bandwidths.hbm / 1e9,
        r.bandwidths.pcie / 1e9,
        r.bandwidths.cpu / 1e9,
        if r.cpu_bw_measured {
            " (CPU measured here)"
        } else {
            ""
        }
    );
    s += &table_row(&COLUMNS.map(String::from));
    s += &table_row(&COLUMNS.map(|_| "---".to_string()));
    let ts =
        |m: Option<f64>, sd: Option<f64>| opt(m, |m| format!("{m:.1} ± {:.1}", sd.unwrap_or(0.0)));
    for w in &r.rows {
        let over = if w.ours_fits == Some(false) {
            " (over)"
        } else {
            ""
        };
        s += &table_row(&[
            budget_name(w.budget),
            w.test.clone(),
            ts(w.ours_tok_s, w.ours_std),
            ts(w.llama_tok_s, w.llama_std),
            opt(w.ratio, |x| format!("{x:.2}x")),
            w.llama_setting.clone().unwrap_or_else(|| "-".into()),
            match (w.inproc_tok_s, w.stock_tok_s) {
                (Some(i), Some(st)) => {
                    format!("{i:.1} / {st:.1} ({:+.0}%)", 100.0 * (i / st - 1.0))
                }
                (Some(i), None) => format!("{i:.1} / -"),
                _ => "-".into(),
            },
            opt(w.ours_vram_bytes, |b| format!("{}{over}", human_bytes(b))),
            opt(w.llama_vram_bytes, human_bytes),
            opt(w.ours_rss_bytes, human_bytes),
            opt(w.llama_rss_bytes, human_bytes),
            opt(w.hit_rate, |h| {
                let own = w
                    .cache_hit_rate
                    .map_or(String::new(), |o| format!(" ({:.1}%)", 100.0 * o));
                format!("{:.1}%{own}", 100.0 * h)
            }),
            opt(w.pcie_gbs, |g| format!("{g:.1}")),
            opt(w.stall_ms_per_token, |m| format!("{m:.2}")),
            opt(w.bound_tok_s, |b| format!("{b:.0}")),
            opt(w.bound_fraction, |f| format!("{:.1}%", 100.0 * f)),
        ]);
    }
    s += "\nsettings tried:\n\n";
    s += &table_row(&SETTING_COLUMNS.map(String::from));
    s += &table_row(&SETTING_COLUMNS.map(|_| "---".to_string()));
    for x in &r.settings {
        let status = match &x.status {
            Status::Ran => "ran".to_string(),
            Status::Fits => "fits (searched on)".to_string(),
            Status::OverBudget => "over budget".to_string(),
            Status::Failed(e) => format!("failed: {}", e.replace('|', "/").replace('\n', " ")),
        };
        let results: Vec<String> = x
            .results
            .iter()
            .map(|m| format!("{} {:.1}", m.test, m.mean))
            .collect();
        s += &table_row(&[
            budget_name(x.budget),
            x.engine.clone(),
            x.label.clone(),
            opt(x.vram_bytes, human_bytes),
            // Stock llama-bench reports no memory figures.
            opt(
                (x.engine != super::stock::ENGINE).then_some(x.host_rss_bytes),
                human_bytes,
            ),
            status,
            if results.is_empty() {
                "-".into()
            } else {
                results.join(", ")
            },
        ]);
    }
    s
}
