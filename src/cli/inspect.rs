//! `pocketmoe inspect MODEL.gguf`: architecture and hyper-parameters, tensor bytes by role and
//! by type, validation against the architecture table, kernel capabilities of the types present,
//! and the placement report for a VRAM budget (human-readable, or `--json`).
use crate::ggml::{GgmlType, Kernels};
use crate::gguf::{GgufModel, Metadata};
use crate::model::placement::{self, Bandwidths, Placement};
use crate::model::validate::{validate, Finding};
use crate::model::{Hparams, Role};
use anyhow::{bail, Context as _, Result};
use std::collections::BTreeMap;
use std::path::PathBuf;

#[derive(clap::Args, Debug)]
pub struct InspectArgs {
    /// The GGUF file (any shard of a split bundle).
    pub model: PathBuf,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
    /// GPU memory budget for the placement report: bytes, or with a unit (24GiB, 8G, 512MiB).
    #[arg(long, default_value = "24GiB", value_parser = parse_bytes)]
    pub gpu_mem: u64,
    /// Context length of each sequence for the KV-cache estimate. Default: what
    /// `pocketmoe-serve` picks for this budget (`engine::context::fit_context`: the trained
    /// context if it fits beside the whole model for --parallel sequences, else the most that
    /// does, down to 4096).
    #[arg(long)]
    pub ctx: Option<u64>,
    /// Sequences the KV cache holds, each of --ctx positions (default: pocketmoe-serve's
    /// --parallel).
    #[arg(long, default_value_t = super::DEFAULT_PARALLEL)]
    pub parallel: usize,
    /// Expected expert-cache hit rate for the bound (default: the cached fraction, i.e. uniform
    /// routing, the pessimistic case).
    #[arg(long)]
    pub hit_rate: Option<f64>,
    /// GPU memory bandwidth, GB/s (default: measured H200).
    #[arg(long, default_value_t = 4470.0)]
    pub hbm_gbps: f64,
    /// Host-to-GPU bandwidth (pinned), GB/s.
    #[arg(long, default_value_t = 50.7)]
    pub pcie_gbps: f64,
    /// CPU memory bandwidth for CPU-computed experts, GB/s.
    #[arg(long, default_value_t = 68.0)]
    pub cpu_gbps: f64,
}

/// Parses `123`, `8G`, `8GB` (10^9), `8GiB` (2^30), `512MiB`, ...
pub fn parse_bytes(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: f64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a size (try 24GiB or 8000000000)"))?;
    let mult = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kb" => 1e3,
        "kib" => 1024.0,
        "m" | "mb" => 1e6,
        "mib" => (1u64 << 20) as f64,
        "g" | "gb" => 1e9,
        "gib" => (1u64 << 30) as f64,
        "t" | "tb" => 1e12,
        "tib" => (1u64 << 40) as f64,
        u => return Err(format!("unknown unit {u:?} in {s:?}")),
    };
    let v = n * mult;
    if !v.is_finite() || !(0.0..=1e16).contains(&v) {
        return Err(format!("{s:?} is out of range"));
    }
    Ok(v as u64)
}

#[derive(Debug, serde::Serialize)]
pub struct Report {
    pub path: PathBuf,
    pub architecture: String,
    pub supported: bool,
    pub hparams: Option<BTreeMap<&'static str, String>>,
    pub file_bytes: u64,
    pub n_tensors: usize,
    pub by_role: BTreeMap<String, (usize, u64)>,
    pub by_type: BTreeMap<String, (usize, u64)>,
    pub findings: Vec<String>,
    pub valid: bool,
    pub kernels: BTreeMap<String, Kernels>,
    pub placement: Option<Placement>,
    /// The context of each sequence the placement is for, and why (given, or fitted as
    /// `pocketmoe-serve` fits it).
    pub ctx: Option<u64>,
    pub ctx_why: String,
    pub parallel: usize,
}

/// The hyper-parameters of the file's architecture, by GGUF key (after `{arch}.`), as the
/// schema lists them (`model::hparams::schema`).
fn hparams_table(h: &Hparams) -> BTreeMap<&'static str, String> {
    crate::model::hparams::schema::listing(h)
        .into_iter()
        .map(|(k, v)| (k, v.to_string()))
        .collect()
}

/// Builds the report (no printing), so tests can check the figures.
pub fn report(args: &InspectArgs) -> Result<Report> {
    let model = GgufModel::open(&args.model)
        .with_context(|| format!("reading {}", args.model.display()))?;
    let arch_name = model
        .get_str("general.architecture")
        .unwrap_or("")
        .to_string();
    if arch_name.is_empty() {
        bail!(
            "{}: metadata has no general.architecture",
            args.model.display()
        );
    }
    let tensors: Vec<_> = model.tensors().cloned().collect();
    let mut by_type: BTreeMap<String, (usize, u64)> = BTreeMap::new();
    let mut kernels = BTreeMap::new();
    for t in &tensors {
        let e = by_type.entry(t.ty.name().to_string()).or_default();
        e.0 += 1;
        e.1 += t.n_bytes;
        if t.ty.is_quantized() || t.ty == GgmlType::F16 || t.ty == GgmlType::BF16 {
            kernels.insert(t.ty.name().to_string(), t.ty.kernels());
        }
    }
    let mut rep = Report {
        path: args.model.clone(),
        architecture: arch_name.clone(),
        supported: false,
        hparams: None,
        file_bytes: model.file_size(),
        n_tensors: tensors.len(),
        by_role: BTreeMap::new(),
        by_type,
        findings: Vec::new(),
        valid: false,
        kernels,
        placement: None,
        ctx: None,
        ctx_why: String::new(),
        parallel: args.parallel,
    };
    let Some(arch) = crate::arch::by_name(&arch_name).map(|a| &a.spec) else {
        rep.findings.push(crate::arch::not_built_reason(&arch_name));
        return Ok(rep);
    };
    rep.supported = true;
    let hp = match Hparams::from_meta(arch, &model) {
        Ok(hp) => hp,
        Err(e) => {
            rep.findings.push(format!("hyper-parameters: {e}"));
            return Ok(rep);
        }
    };
    let v = validate(arch, &hp, &tensors);
    rep.valid = v.is_ok();
    rep.findings = v.findings.iter().map(Finding::to_string).collect();
    for t in &tensors {
        let role = v.roles.get(&t.name).copied().unwrap_or(Role::Other);
        let e = rep.by_role.entry(format!("{role:?}")).or_default();
        e.0 += 1;
        e.1 += t.n_bytes;
    }
    let bw = Bandwidths {
        hbm: args.hbm_gbps * 1e9,
        pcie: args.pcie_gbps * 1e9,
        cpu: args.cpu_gbps * 1e9,
    };
    let (ctx, why) = match args.ctx {
        Some(c) => (c, "given (--ctx)".to_string()),
        None => {
            let f = crate::engine::context::fit_context(
                hp.n_ctx_train as usize,
                tensors.iter().map(|t| t.n_bytes).sum(),
                crate::engine::context::kv_row_bytes(&hp, GgmlType::F16),
                crate::engine::EngineOptions::default().n_ubatch,
                Some(args.gpu_mem),
                args.parallel,
            );
            (f.ctx as u64, f.why.replace("-c to set", "--ctx to set"))
        }
    };
    let positions = crate::engine::batch::rows_for(args.parallel.max(1), ctx as usize);
    rep.placement = Some(placement::plan(
        &hp,
        &tensors,
        &v.roles,
        args.gpu_mem,
        positions as u64,
        args.hit_rate,
        bw,
    ));
    rep.ctx = Some(ctx);
    rep.ctx_why = why;
    rep.hparams = Some(hparams_table(&hp));
    Ok(rep)
}

/// Bytes in the largest binary unit that keeps the number >= 1 (`1.50 GiB`, `312.0 KiB`).
pub fn human_bytes(b: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{b} B")
    } else {
        format!("{v:.2} {}", UNITS[u])
    }
}

pub fn run(args: InspectArgs) -> Result<()> {
    let rep = report(&args)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&rep)?);
    } else {
        print_text(&rep);
    }
    if !rep.supported || !rep.valid {
        bail!(
            "{}: {} finding(s); the model cannot be run as is",
            rep.path.display(),
            rep.findings.len()
        );
    }
    Ok(())
}

fn print_text(r: &Report) {
    println!("{}", r.path.display());
    println!(
        "  architecture  {}{}",
        r.architecture,
        if r.supported { "" } else { " (not supported)" }
    );
    println!(
        "  file size     {} ({} tensors)",
        human_bytes(r.file_bytes),
        r.n_tensors
    );
    if let Some(h) = &r.hparams {
        let line: Vec<String> = h.iter().map(|(k, v)| format!("{k}={v}")).collect();
        println!("  hparams       {}", line.join(" "));
    }
    println!("  bytes by role:");
    for (role, (n, b)) in &r.by_role {
        println!("    {role:<14} {n:>6} tensors {:>12}", human_bytes(*b));
    }
    println!("  bytes by type (kernels: CPU vec-dot / CUDA MMVQ / CUDA MMQ):");
    for (ty, (n, b)) in &r.by_type {
        let k = r.kernels.get(ty).map_or(String::from("-"), |k| {
            let yn = |x: bool| if x { "yes" } else { "no" };
            format!(
                "cpu {} mmvq {} mmq {}",
                yn(k.cpu),
                yn(k.cuda_mmvq),
                yn(k.cuda_mmq)
            )
        });
        println!("    {ty:<8} {n:>6} tensors {:>12}   {k}", human_bytes(*b));
    }
    if r.findings.is_empty() {
        println!("  validation    ok");
    } else {
        println!(
            "  validation    {}:",
            if r.valid { "ok, with notes" } else { "FAILED" }
        );
        for f in &r.findings {
            println!("    - {f}");
        }
    }
    if let Some(p) = &r.placement {
        println!(
            "  placement for --gpu-mem {} --ctx {} --parallel {} ({} KV positions); context: {}:",
            human_bytes(p.gpu_mem),
            r.ctx.unwrap_or(p.n_ctx),
            r.parallel,
            p.n_ctx,
            r.ctx_why
        );
        println!(
            "    resident (non-expert) weights {}",
            human_bytes(p.resident_bytes)
        );
        if p.host_bytes > 0 {
            println!(
                "    token embedding (host memory) {}",
                human_bytes(p.host_bytes)
            );
        }
        println!(
            "    KV cache (f16)                {}",
            human_bytes(p.kv_bytes)
        );
        println!(
            "    compute buffers (estimate)    {}",
            human_bytes(p.compute_bytes)
        );
        if !p.fits {
            println!("    DOES NOT FIT: resident parts + KV + compute exceed the budget");
        }
        if p.n_experts_total == 0 {
            println!(
                "    expert cache                  none (a dense model: every weight resident)"
            );
        } else {
            println!(
                "    expert cache                  {} = {} of {} experts ({:.1}%), {} each",
                human_bytes(p.cache_bytes),
                p.experts_cached,
                p.n_experts_total,
                100.0 * p.cached_fraction,
                human_bytes(p.expert_bytes_each)
            );
        }
        println!(
            "    per token: {} resident + {} routed experts; hit rate assumed {:.0}%",
            human_bytes(p.active_resident_bytes),
            human_bytes(p.active_expert_bytes),
            100.0 * p.hit_rate
        );
        println!(
            "    decode bound (tok/s, HBM {:.0} GB/s, PCIe {:.1} GB/s, CPU {:.0} GB/s): all in VRAM {:.0} | misses over PCIe {:.0} | PCIe + CPU {:.0}",
            p.bandwidths.hbm / 1e9,
            p.bandwidths.pcie / 1e9,
            p.bandwidths.cpu / 1e9,
            p.bound_all_in_vram,
            p.bound_pcie_only,
            p.bound_pcie_and_cpu
        );
    }
}
