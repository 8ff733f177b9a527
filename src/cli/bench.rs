//! `pocketmoe bench` (first cut): prompt processing (`pp N`) and generation (`tg N`) in
//! llama-bench's sense, for PocketMoE and for stock llama.cpp (libllama from the same build) on the
//! same GGUF in the same process, with the ratio. Both run fully resident on one device here; the
//! VRAM-budget matrix and llama.cpp's offload settings come with the offload work.
use super::{Decoder, LlamaDecoder};
use crate::engine::{Device, Engine, EngineOptions};
use crate::ggml::llama::{LlamaContext, LlamaModel};
use crate::util::Rng;
use anyhow::{Context as _, Result};
use std::path::PathBuf;
use std::time::Instant;

#[derive(clap::Args, Debug)]
pub struct BenchArgs {
    /// The GGUF model.
    #[arg(long, short)]
    pub model: PathBuf,
    /// Run on this GPU (default: the CPU).
    #[arg(long)]
    pub gpu: Option<usize>,
    /// Prompt length for pp.
    #[arg(short = 'p', long, default_value_t = 512)]
    pub prompt: usize,
    /// Generated tokens for tg.
    #[arg(short = 'n', long, default_value_t = 128)]
    pub gen: usize,
    /// Repetitions (after one warm-up).
    #[arg(long, default_value_t = 3)]
    pub reps: usize,
    /// CPU threads (0 = all cores).
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
    /// Device memory budget for PocketMoE (e.g. 8GiB): routed experts are offloaded when the
    /// model does not fit (the baseline here still runs fully resident).
    #[arg(long, value_parser = super::inspect::parse_bytes)]
    pub gpu_mem: Option<u64>,
    /// Skip the llama.cpp baseline.
    #[arg(long)]
    pub no_baseline: bool,
    /// Internal: run only the llama.cpp baseline and print its rows as JSON (the parent runs it
    /// in a child process, see `Backend::cuda` on CUDA graphs).
    #[arg(long, hide = true)]
    pub baseline_child: bool,
}

/// tok/s samples of one test.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Row {
    pub engine: String,
    pub test: String,
    pub tok_s: Vec<f64>,
}

impl Row {
    pub fn mean(&self) -> f64 {
        self.tok_s.iter().sum::<f64>() / self.tok_s.len().max(1) as f64
    }
    pub fn std(&self) -> f64 {
        let m = self.mean();
        (self.tok_s.iter().map(|x| (x - m).powi(2)).sum::<f64>() / self.tok_s.len().max(1) as f64)
            .sqrt()
    }
}

fn run_tests(
    engine: &'static str,
    m: &mut dyn Decoder,
    args: &BenchArgs,
    n_vocab: u64,
) -> Result<Vec<Row>> {
    let mut rng = Rng::new(42);
    let tokens: Vec<u32> = (0..args.prompt)
        .map(|_| (rng.next_u64() % n_vocab) as u32)
        .collect();
    // Warm-up: a short prompt and a few tokens.
    m.prefill(&tokens[..tokens.len().min(16)])?;
    for &t in tokens.iter().take(4) {
        m.step(t)?;
    }
    let mut pp = Row {
        engine: engine.into(),
        test: format!("pp{}", args.prompt),
        tok_s: Vec::new(),
    };
    let mut tg = Row {
        engine: engine.into(),
        test: format!("tg{}", args.gen),
        tok_s: Vec::new(),
    };
    for _ in 0..args.reps {
        let t0 = Instant::now();
        m.prefill(&tokens)?;
        pp.tok_s
            .push(args.prompt as f64 / t0.elapsed().as_secs_f64());
        let t0 = Instant::now();
        for i in 0..args.gen {
            m.step(tokens[i % tokens.len()])?;
        }
        tg.tok_s.push(args.gen as f64 / t0.elapsed().as_secs_f64());
    }
    Ok(vec![pp, tg])
}

fn baseline(args: &BenchArgs, n_ctx: usize) -> Result<Vec<Row>> {
    let lm = LlamaModel::load(&args.model, if args.gpu.is_some() { -1 } else { 0 })?;
    let threads = if args.threads == 0 {
        std::thread::available_parallelism().map_or(1, |n| n.get())
    } else {
        args.threads
    };
    let ctx = LlamaContext::new(&lm, n_ctx as u32, threads as i32)?;
    let n_vocab = lm.n_vocab() as u64;
    let mut theirs = LlamaDecoder { ctx, n_past: 0 };
    let rows = run_tests("llama.cpp", &mut theirs, args, n_vocab);
    drop(theirs);
    rows
}

/// Runs the baseline in a child process with the environment the user gave us (CUDA graph
/// replay on unless `user_disabled_graphs`), and reads its rows back.
fn baseline_in_child(args: &BenchArgs, user_disabled_graphs: bool) -> Result<Vec<Row>> {
    let exe = std::env::current_exe().context("locating the pocketmoe binary")?;
    let mut cmd = std::process::Command::new(exe);
    cmd.arg("bench")
        .arg("--model")
        .arg(&args.model)
        .arg("--baseline-child");
    cmd.args([
        "-p",
        &args.prompt.to_string(),
        "-n",
        &args.gen.to_string(),
        "--reps",
        &args.reps.to_string(),
        "--threads",
        &args.threads.to_string(),
    ]);
    if let Some(g) = args.gpu {
        cmd.args(["--gpu", &g.to_string()]);
    }
    if !user_disabled_graphs {
        cmd.env_remove("GGML_CUDA_DISABLE_GRAPHS");
    }
    let out = cmd
        .stderr(std::process::Stdio::inherit())
        .output()
        .context("running the llama.cpp baseline")?;
    if !out.status.success() {
        anyhow::bail!("the llama.cpp baseline failed ({})", out.status);
    }
    serde_json::from_slice(&out.stdout).context("reading the baseline's rows")
}

pub fn run(args: BenchArgs) -> Result<()> {
    // As the user set it, before our CUDA backend sets it for this process.
    let user_disabled_graphs = std::env::var_os("GGML_CUDA_DISABLE_GRAPHS").is_some();
    let n_ctx = args.prompt + args.gen + 32;
    if args.baseline_child {
        println!("{}", serde_json::to_string(&baseline(&args, n_ctx)?)?);
        return Ok(());
    }
    let device = args.gpu.map_or(Device::Cpu, Device::Cuda);
    let mut rows = Vec::new();
    {
        let opts = EngineOptions {
            device,
            n_ctx,
            n_threads: args.threads,
            gpu_mem: args.gpu_mem,
            ..Default::default()
        };
        let eng = Engine::load(&args.model, opts, &|_, _| {})
            .with_context(|| format!("loading {}", args.model.display()))?;
        let n_vocab = eng.hp.n_vocab;
        let mut eng = eng;
        rows.extend(run_tests("pocketmoe", &mut eng, &args, n_vocab)?);
        if let Some(st) = eng.offload_stats() {
            eprintln!(
                "{} slots/layer, {:.2} GiB on the device\n{}",
                eng.expert_slots().unwrap_or(0),
                eng.device_bytes() as f64 / (1u64 << 30) as f64,
                st.summary()
            );
        }
    }
    if !args.no_baseline {
        rows.extend(baseline_in_child(&args, user_disabled_graphs)?);
    }
    println!("| model | device | engine | test | t/s | vs llama.cpp |");
    println!("| --- | --- | --- | --- | --- | --- |");
    let name = args
        .model
        .file_name()
        .map_or(String::new(), |f| f.to_string_lossy().into_owned());
    for r in &rows {
        let base = rows
            .iter()
            .find(|b| b.engine == "llama.cpp" && b.test == r.test);
        let ratio = base.map_or(String::from("-"), |b| {
            format!("{:.2}x", r.mean() / b.mean())
        });
        println!(
            "| {name} | {device:?} | {} | {} | {:.1} ± {:.1} | {ratio} |",
            r.engine,
            r.test,
            r.mean(),
            r.std()
        );
    }
    Ok(())
}
