//! `pocketmoe bench`: PocketMoE and stock llama.cpp (libllama from the same build) on the same
//! GGUF in one run, in llama-bench's terms (`pp512`, `tg128 @ d8192`, mean ± sd over `--reps`
//! after a warm-up), at one or more VRAM budgets (`--gpu-mem resident,12GiB,8GiB`).
//!
//! Per budget, ours runs in this process with `gpu_mem` set to the budget; llama.cpp runs in a
//! child process (`--baseline-child`) that searches its best settings for the budget
//! ([`baseline`]). Peak VRAM and host RSS are measured the same way for both ([`measure`]). The
//! result is a markdown table on stdout, `--json`, and `--plot` ([`report`], [`plot`]).
//!
//! Threads default to the physical cores, for both engines.
pub mod baseline;
pub mod measure;
pub mod plot;
pub mod report;
pub mod stock;

use crate::cli::inspect::parse_bytes;
use crate::engine::{Device, Engine, EngineOptions};
use crate::gguf::{GgufModel, Metadata};
use crate::model::placement::Bandwidths;
use crate::model::validate::validate;
use crate::model::Hparams;
use anyhow::{bail, Context as _, Result};
use measure::{matrix, n_ctx_for, run_tests, Test, VramPeak};
use report::{ModelFacts, Report, Setting, Status};
use std::path::PathBuf;

/// Expected growth of a llama.cpp context's device memory while it runs (ggml-cuda's buffer
/// pool), until measured: the search keeps this much headroom below the budget.
const POOL_RESERVE: u64 = 128 << 20;

/// Our micro-batch when offloading.
const OFFLOAD_UBATCH: usize = 4096;
/// Our micro-batch fully resident (llama.cpp's best on the H200 is -ub 2048 for pp4096; the
/// baseline searches 512/2048/4096, we run one).
const RESIDENT_UBATCH: usize = 2048;

/// A VRAM budget: `None` = resident (the whole device).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget(pub Option<u64>);

/// Parses `resident` (or `all`) and sizes as `inspect --gpu-mem` does (`12GiB`, `8G`).
pub fn parse_budget(s: &str) -> Result<Budget, String> {
    match s.trim().to_ascii_lowercase().as_str() {
        "resident" | "all" => Ok(Budget(None)),
        _ => parse_bytes(s).map(|b| Budget(Some(b))),
    }
}

#[derive(clap::Args, Debug, Clone)]
pub struct BenchArgs {
    /// The GGUF model.
    #[arg(long, short)]
    pub model: PathBuf,
    /// Run on this GPU (default: the CPU). Several (`--gpu 0,1`): ours splits the blocks over
    /// them (llama.cpp's `-sm layer`), each GPU held to the budget (each caching its own
    /// blocks' experts when offloading), or cuts every weight across them with `--split-mode
    /// tensor`; the llama.cpp baseline is not built for several GPUs in this command yet
    /// (--no-baseline; `scripts/device.sh multi` runs stock llama-bench -sm layer and -sm
    /// tensor beside it).
    #[arg(long = "gpu", value_delimiter = ',', value_name = "N[,N...]")]
    pub gpus: Vec<usize>,
    /// With several GPUs: `layer` (whole blocks per GPU, the default), `expert` (the layer
    /// split with every GPU caching a share of every layer's routed experts, when offloading)
    /// or `tensor` (alias `row`: every weight cut across the GPUs, resident budgets only; MLA
    /// and all-heads Q/K-norm models keep attention whole on every GPU); llama.cpp's `-sm`.
    #[arg(long = "split-mode", value_name = "MODE", default_value = "layer")]
    pub split_mode: String,
    /// VRAM budgets, comma-separated: `resident` (the whole device) or sizes (12GiB, 8G).
    #[arg(long = "gpu-mem", value_delimiter = ',', default_value = "resident", value_parser = parse_budget)]
    pub gpu_mem: Vec<Budget>,
    /// Prompt lengths for pp, comma-separated (0: none).
    #[arg(
        short = 'p',
        long = "prompt",
        value_delimiter = ',',
        default_value = "512"
    )]
    pub prompt: Vec<usize>,
    /// Generated tokens for tg, comma-separated (0: none).
    #[arg(
        short = 'n',
        long = "gen",
        value_delimiter = ',',
        default_value = "128"
    )]
    pub gen: Vec<usize>,
    /// KV depths the tests start at, comma-separated.
    #[arg(short = 'd', long, value_delimiter = ',', default_value = "0")]
    pub depth: Vec<usize>,
    /// Timed repetitions per test (after one warm-up).
    #[arg(short = 'r', long, default_value_t = 3)]
    pub reps: usize,
    /// CPU threads for both engines (0 = physical cores).
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
    /// llama.cpp micro-batch sizes to try for pp (each counts only if it fits the budget).
    #[arg(long, value_delimiter = ',', default_value = "512,2048,4096")]
    pub ubatch: Vec<usize>,
    /// Skip the llama.cpp baseline.
    #[arg(long)]
    pub no_baseline: bool,
    /// On the CPU: our engine keeps every weight in its file layout, and so does the llama.cpp
    /// baseline (llama.cpp's `--no-repack`; both repack by default).
    #[arg(long)]
    pub no_repack: bool,
    /// Offloading: the miss planner before 2026-12-02 (each stop's misses split from an idle
    /// copy engine, every predicted expert prefetched) instead of the balance of the copy
    /// engine and the CPU channel, to measure one against the other.
    #[arg(long)]
    pub no_miss_balance: bool,
    /// Stock `llama-bench` (built as llama.cpp builds itself) to run beside the in-process
    /// baseline at each setting it chose; the comparison then uses the faster of the two and
    /// prints both (`scripts/device-stock-llama.sh` builds one on the H200 machine).
    #[arg(long, env = "POCKETMOE_LLAMA_BENCH", value_name = "PATH")]
    pub llama_bench: Option<PathBuf>,
    /// Also write the report as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Also draw tokens/s vs depth and vs budget, both engines, as a PNG here.
    #[arg(long)]
    pub plot: Option<PathBuf>,
    /// Bandwidths for the bound column, GB/s (HBM and PCIe default: measured on the H200 box).
    #[arg(long, default_value_t = 4470.0)]
    pub hbm_gbps: f64,
    #[arg(long, default_value_t = 50.7)]
    pub pcie_gbps: f64,
    /// Host DRAM read bandwidth for the bound, GB/s (default: measured at start with --threads
    /// threads, a 1 GiB streaming read, best of 5; the H200 host reads 68 at 16 threads, the 2-core
    /// dev box 33-34 at 2).
    #[arg(long)]
    pub cpu_gbps: Option<f64>,
    /// Diagnosis (issue 30): instead of pp/tg, time the CPU expert channel's jobs on this file's
    /// experts with each of these thread counts (e.g. `4,8,15`) and print where a job's time
    /// goes: ggml's pool kick-off and barriers, jobs of 1-8 experts read from DRAM (hand-over,
    /// prep, compute, result), the fixed cost and rate per expert, each node of the job. No
    /// GPU, no baseline; `--reps` jobs a point (at least 20).
    #[arg(
        long = "cpu-jobs",
        value_delimiter = ',',
        value_name = "THREADS[,THREADS...]"
    )]
    pub cpu_jobs: Vec<usize>,
    /// Internal: run only the llama.cpp baseline for the one budget given and print its
    /// settings as JSON (the parent runs it in a child process, see `Backend::cuda`).
    #[arg(long, hide = true)]
    pub baseline_child: bool,
}

impl BenchArgs {
    fn tests(&self) -> Vec<Test> {
        matrix(&self.prompt, &self.gen, &self.depth)
    }
    /// The (first) GPU, `None` on the CPU.
    fn gpu(&self) -> Option<usize> {
        self.gpus.first().copied()
    }
    /// `--split-mode tensor` (or `row`) over several GPUs.
    fn split_tensors(&self) -> bool {
        self.gpus.len() > 1
            && matches!(
                self.split_mode.to_ascii_lowercase().as_str(),
                "tensor" | "row"
            )
    }
    fn threads(&self) -> usize {
        if self.threads == 0 {
            measure::physical_cores()
        } else {
            self.threads
        }
    }
    fn ubatches(&self) -> Vec<usize> {
        let mut u: Vec<usize> = self.ubatch.iter().copied().filter(|&u| u > 0).collect();
        u.sort_unstable();
        u.dedup();
        if u.is_empty() {
            u.push(512);
        }
        u
    }
}

/// `--cpu-jobs`: the CPU channel's job costs on this host (`experts::cpu::probe`).
fn cpu_jobs(args: &BenchArgs) -> Result<()> {
    if let Some(&t) = args.cpu_jobs.iter().find(|&&t| t == 0) {
        bail!("--cpu-jobs {t}: thread counts are 1 or more");
    }
    let path = &args.model;
    let facts = model_facts(path)?;
    let file = GgufModel::open(path).with_context(|| format!("reading {}", path.display()))?;
    let report = crate::experts::cpu::probe::profile(
        &file,
        facts.hp.n_embd as usize,
        facts.hp.n_layer,
        &args.cpu_jobs,
        args.reps.max(20),
    )
    .with_context(|| format!("{}: timing CPU channel jobs", path.display()))?;
    println!("{report}");
    Ok(())
}

/// Reads what the bound and the search need from the GGUF.
pub fn model_facts(path: &std::path::Path) -> Result<ModelFacts> {
    let file = GgufModel::open(path).with_context(|| format!("reading {}", path.display()))?;
    let arch_name = file
        .get_str("general.architecture")
        .unwrap_or("")
        .to_string();
    let arch = crate::arch::by_name(&arch_name).with_context(|| {
        format!(
            "{}: {}",
            path.display(),
            crate::arch::not_built_reason(&arch_name)
        )
    })?;
    let spec = &arch.spec;
    let hp =
        Hparams::from_meta(spec, &file).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    let tensors: Vec<_> = file.tensors().cloned().collect();
    let roles = validate(spec, &hp, &tensors).roles;
    Ok(ModelFacts {
        hp,
        tensors,
        roles,
        file_bytes: file.file_size(),
    })
}

/// The child: llama.cpp's settings search for one budget; prints the settings as JSON.
fn baseline_child(args: &BenchArgs) -> Result<()> {
    let facts = model_facts(&args.model)?;
    let tests = args.tests();
    let budget = args.gpu_mem.first().copied().unwrap_or(Budget(None)).0;
    let limit = match (args.gpu(), budget) {
        (Some(_), Some(b)) => b,
        (Some(g), None) => measure::device_free(g).unwrap_or(u64::MAX),
        (None, _) => u64::MAX,
    };
    let layers = baseline::layer_expert_bytes(&facts.tensors, facts.hp.n_layer);
    let sweep = baseline::Sweep {
        layers: &layers,
        budget: limit,
        model_bytes: facts.file_bytes,
        reserve: if args.gpu().is_some() {
            POOL_RESERVE
        } else {
            0
        },
    };
    let mut rig = baseline::LlamaRig::new(
        args.model.clone(),
        args.gpu(),
        facts.hp.n_layer,
        n_ctx_for(&tests),
        args.threads(),
        args.reps,
    );
    rig.repack = !args.no_repack;
    let settings = sweep.run(&mut rig, &args.ubatches(), &tests, budget);
    println!("{}", serde_json::to_string(&settings)?);
    Ok(())
}

/// Runs the baseline child for `budget` and reads its settings back.
fn baseline_in_child(args: &BenchArgs, budget: Budget) -> Result<Vec<Setting>> {
    let exe = std::env::current_exe().context("locating the pocketmoe binary")?;
    let list = |v: &[usize]| v.iter().map(usize::to_string).collect::<Vec<_>>().join(",");
    let mut cmd = std::process::Command::new(exe);
    cmd.arg("bench")
        .arg("--model")
        .arg(&args.model)
        .arg("--baseline-child");
    cmd.args([
        "--gpu-mem",
        &budget.0.map_or("resident".into(), |b| b.to_string()),
    ]);
    cmd.args([
        "-p",
        &list(&args.prompt),
        "-n",
        &list(&args.gen),
        "--depth",
        &list(&args.depth),
    ]);
    cmd.args([
        "--reps",
        &args.reps.to_string(),
        "--threads",
        &args.threads().to_string(),
    ]);
    cmd.args(["--ubatch", &list(&args.ubatches())]);
    if let Some(g) = args.gpu() {
        cmd.args(["--gpu", &g.to_string()]);
    }
    if args.no_repack {
        cmd.arg("--no-repack");
    }
    // llama.cpp runs as it would for the user: without the switches our backend set.
    for var in crate::ggml::cuda_env_set_by_us() {
        cmd.env_remove(var);
    }
    let out = cmd
        .stderr(std::process::Stdio::inherit())
        .output()
        .context("running the llama.cpp baseline")?;
    if !out.status.success() {
        bail!("the llama.cpp baseline failed ({})", out.status);
    }
    serde_json::from_slice(&out.stdout).context("reading the baseline's settings")
}

/// Ours at one budget, in this process.
fn ours(args: &BenchArgs, budget: Budget, tests: &[Test]) -> Setting {
    let opts = EngineOptions {
        device: args.gpu().map_or(Device::Cpu, Device::Cuda),
        devices: if args.gpus.len() > 1 {
            args.gpus.iter().map(|&g| Device::Cuda(g)).collect()
        } else {
            Vec::new()
        },
        n_ctx: n_ctx_for(tests),
        n_threads: args.threads(),
        gpu_mem: budget.0,
        // Offloaded prefill moves every used expert over PCIe once per micro-batch: large
        // micro-batches amortise that (the planner sizes the expert cache around the larger
        // compute buffer).
        n_ubatch: if budget.0.is_some() {
            OFFLOAD_UBATCH
        } else {
            RESIDENT_UBATCH
        },
        repack: !args.no_repack,
        miss_balance: !args.no_miss_balance,
        split_tensors: args.split_tensors(),
        expert_parallel: args.gpus.len() > 1 && args.split_mode.eq_ignore_ascii_case("expert"),
        ..Default::default()
    };
    let mut s = Setting {
        engine: "pocketmoe".into(),
        budget: budget.0,
        label: format!(
            "pocketmoe -ub {}{}",
            opts.n_ubatch,
            if args.gpu().is_none() && args.no_repack {
                " --no-repack"
            } else if budget.0.is_some() && args.no_miss_balance {
                " --no-miss-balance"
            } else {
                ""
            }
        ),
        n_cpu_moe: None,
        n_ubatch: opts.n_ubatch,
        vram_bytes: None,
        host_rss_bytes: 0,
        fits: false,
        status: Status::Ran,
        results: Vec::new(),
    };
    measure::reset_peak_rss();
    // Every GPU's peak (a layer split holds each to the budget): the largest counts.
    let mut vram = VramPeak::start(args.gpu());
    let mut others: Vec<VramPeak> = args
        .gpus
        .iter()
        .skip(1)
        .map(|&g| VramPeak::start(Some(g)))
        .collect();
    let mut run = |vram: &mut VramPeak, s: &mut Setting| -> Result<Vec<measure::Measurement>> {
        let mut eng = Engine::load(&args.model, opts.clone(), &|_, _| {})
            .with_context(|| format!("loading {}", args.model.display()))?;
        vram.sample();
        others.iter_mut().for_each(|v| _ = v.sample());
        // The offload planner may have lowered the micro-batch to leave the cache room.
        s.n_ubatch = eng.n_ubatch();
        s.label = format!(
            "pocketmoe -ub {}{}",
            eng.n_ubatch(),
            if args.gpus.len() > 1 {
                format!(" --gpu {} -sm {}", gpu_list(&args.gpus), args.split_mode)
            } else {
                String::new()
            }
        );
        let n_vocab = eng.hp.n_vocab;
        let r = run_tests(&mut eng, tests, args.reps, n_vocab, &mut || {
            vram.sample();
            others.iter_mut().for_each(|v| _ = v.sample());
        })?;
        if let Some(st) = eng.offload_stats() {
            eprintln!(
                "pocketmoe: {} slots/layer, {:.2} GiB on the device\n{}",
                eng.expert_slots().unwrap_or(0),
                eng.device_bytes() as f64 / (1u64 << 30) as f64,
                st.summary()
            );
        }
        Ok(r)
    };
    match run(&mut vram, &mut s) {
        Ok(r) => s.results = r,
        Err(e) => s.status = Status::Failed(format!("{e:#}")),
    }
    s.vram_bytes = others
        .iter()
        .map(VramPeak::bytes)
        .fold(vram.bytes(), |a, b| a.max(b));
    s.host_rss_bytes = measure::peak_rss();
    s.fits =
        matches!(s.status, Status::Ran) && budget.0.zip(s.vram_bytes).is_none_or(|(b, v)| v <= b);
    s
}

pub fn run(args: BenchArgs) -> Result<()> {
    if args.baseline_child {
        return baseline_child(&args);
    }
    if !args.cpu_jobs.is_empty() {
        return cpu_jobs(&args);
    }
    if let Some(p) = &args.llama_bench {
        if args.no_baseline {
            bail!("--llama-bench runs beside the baseline's settings: drop --no-baseline");
        }
        if !p.is_file() {
            bail!("--llama-bench {}: no such file", p.display());
        }
    }
    if args.gpus.len() > 1 && !args.no_baseline {
        bail!(
            "--gpu {}: the llama.cpp baseline of this command runs on one GPU; give \
             --no-baseline and run stock llama-bench -sm layer (-ts, -ncmoe) beside it",
            gpu_list(&args.gpus)
        );
    }
    match args.split_mode.to_ascii_lowercase().as_str() {
        "layer" => {}
        "tensor" | "row" if args.gpu_mem.iter().any(|b| b.0.is_some()) => bail!(
            "--split-mode tensor runs resident models only: give --gpu-mem resident (or use \
             --split-mode layer, whose GPUs cache their blocks' experts)"
        ),
        "tensor" | "row" | "expert" => {}
        m => bail!("--split-mode {m}: layer, expert or tensor (alias row)"),
    }
    if args.gpu().is_none() && args.gpu_mem.iter().any(|b| b.0.is_some()) {
        bail!("--gpu-mem budgets need --gpu (on the CPU there is no VRAM to budget)");
    }
    let tests = args.tests();
    if tests.is_empty() {
        bail!("no tests: give -p and/or -n sizes above 0");
    }
    let facts = model_facts(&args.model)?;
    let mut budgets: Vec<Option<u64>> = Vec::new();
    for b in &args.gpu_mem {
        if !budgets.contains(&b.0) {
            budgets.push(b.0);
        }
    }
    let cpu_bw = match args.cpu_gbps {
        Some(g) => g * 1e9,
        None => {
            let b = measure::host_read_bandwidth(args.threads(), 1 << 30);
            eprintln!(
                "host DRAM read: {:.1} GB/s with {} threads (measured; the bound's CPU rate, \
                 --cpu-gbps to set it)",
                b / 1e9,
                args.threads()
            );
            b
        }
    };
    let bw = Bandwidths {
        hbm: args.hbm_gbps * 1e9,
        pcie: args.pcie_gbps * 1e9,
        cpu: cpu_bw,
    };
    let on_gpu = args.gpu().is_some();
    let ub = EngineOptions::default().n_ubatch;
    let bound_of = |b: Option<u64>, t: &Test, hit: Option<f64>| {
        report::bound(&facts, on_gpu, b, t, hit, ub, bw)
    };
    let device_memory = args.gpu().and_then(|g| {
        crate::ggml::Device::all()
            .into_iter()
            .find(|d| d.name == format!("CUDA{g}"))
            .map(|d| d.memory_total as u64)
    });
    let make = |settings: &[Setting]| Report {
        model: args
            .model
            .file_name()
            .map_or(String::new(), |f| f.to_string_lossy().into_owned()),
        file_bytes: facts.file_bytes,
        device: match args.gpus.as_slice() {
            [] => "CPU".into(),
            gs => gs
                .iter()
                .map(|g| format!("CUDA{g}"))
                .collect::<Vec<_>>()
                .join("+"),
        },
        device_memory,
        threads: args.threads(),
        cpu_variant: crate::ggml::cpu_isa::cpu_variant().to_string(),
        reps: args.reps,
        bandwidths: bw,
        cpu_bw_measured: args.cpu_gbps.is_none(),
        settings: settings.to_vec(),
        rows: report::rows(settings, &budgets, &tests, &bound_of),
    };
    let write_json = |rep: &Report| -> Result<()> {
        if let Some(p) = &args.json {
            std::fs::write(p, serde_json::to_string_pretty(rep)?)
                .with_context(|| format!("writing {}", p.display()))?;
        }
        Ok(())
    };
    let mut settings = Vec::new();
    for &b in &budgets {
        eprintln!("bench: pocketmoe at {}", report::budget_name(b));
        settings.push(ours(&args, Budget(b), &tests));
        if !args.no_baseline {
            eprintln!("bench: llama.cpp at {}", report::budget_name(b));
            match baseline_in_child(&args, Budget(b)) {
                Ok(v) => {
                    let knobs = stock::Knobs {
                        gpu: args.gpu(),
                        n_layer: facts.hp.n_layer,
                        threads: args.threads(),
                        reps: args.reps,
                    };
                    let st = args
                        .llama_bench
                        .as_ref()
                        .map_or_else(Vec::new, |exe| stock::run(exe, &args.model, &v, &knobs));
                    settings.extend(v);
                    settings.extend(st);
                }
                Err(e) => settings.push(Setting {
                    engine: "llama.cpp".into(),
                    budget: b,
                    label: "(baseline process)".into(),
                    n_cpu_moe: None,
                    n_ubatch: 0,
                    vram_bytes: None,
                    host_rss_bytes: 0,
                    fits: false,
                    status: Status::Failed(format!("{e:#}")),
                    results: Vec::new(),
                }),
            }
        }
        // After each budget, so a run cut short still leaves its figures.
        write_json(&make(&settings))?;
    }
    let rep = make(&settings);
    print!("{}", report::markdown(&rep));
    if let Some(p) = &args.plot {
        plot::plot(&rep, p).with_context(|| format!("drawing {}", p.display()))?;
    }
    // The table is printed either way; the exit status says whether our engine (or the
    // baseline's process as a whole) failed a setting. llama.cpp's search records settings that
    // do not fit as failed too, which is its normal course, not an error.
    let failed: Vec<String> = rep
        .settings
        .iter()
        .filter_map(|s| match &s.status {
            Status::Failed(e) if s.engine == "pocketmoe" || s.label == "(baseline process)" => {
                Some(format!("{} {}: {e}", s.engine, s.label))
            }
            _ => None,
        })
        .collect();
    if !failed.is_empty() {
        bail!("{} setting(s) failed:\n{}", failed.len(), failed.join("\n"));
    }
    Ok(())
}

/// `0,1` for `--gpu 0,1`.
fn gpu_list(gpus: &[usize]) -> String {
    gpus.iter()
        .map(usize::to_string)
        .collect::<Vec<_>>()
        .join(",")
}
