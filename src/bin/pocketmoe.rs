//! `pocketmoe`: the command-line tool (self-check, synth, inspect, run, bench, serve-bench, tokenize).
use anyhow::{bail, Context as _, Result};
use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use pocketmoe::ggml::{Backend, Device, DeviceKind};
use pocketmoe::selfcheck;

#[derive(Parser)]
#[command(
    name = "pocketmoe",
    about = "Run large Mixture-of-Experts GGUF models on GPUs too small to hold them"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// List the ggml backends and devices in this build, and check on each one that a quantised
    /// matrix-vector product (Q4_K, Q8_0, Q6_K, IQ2_XXS, MXFP4) matches a reference.
    SelfCheck {
        /// Only list devices; skip the numerical check.
        #[arg(long)]
        list: bool,
        /// CPU threads for the check (0 = all cores).
        #[arg(long, default_value_t = 0)]
        threads: usize,
    },
    /// Write a random-weight GGUF of a real model's shape that stock llama.cpp loads and runs.
    Synth(pocketmoe::cli::synth::SynthArgs),
    /// Show a GGUF's architecture, hyper-parameters, bytes by role and type, validation, kernel
    /// capabilities and the placement report for a VRAM budget.
    Inspect(pocketmoe::cli::inspect::InspectArgs),
    /// Generate text from a prompt, streaming it to the terminal.
    Run(pocketmoe::cli::run::RunArgs),
    /// Time prompt processing (pp) and generation (tg), ours and llama.cpp's on the same file.
    Bench(pocketmoe::cli::bench::BenchArgs),
    /// Load an OpenAI-compatible server (this one, llama-server, vLLM) with concurrent
    /// streaming completions: aggregate tok/s and time to first token per concurrency level.
    ServeBench(pocketmoe::cli::serve_bench::ServeBenchArgs),
    /// Print the token ids (or, with --pieces, ids and pieces) a GGUF's tokenizer gives a text.
    Tokenize(pocketmoe::cli::tokenize::TokenizeArgs),
}

fn main() {
    // Warnings show without RUST_LOG (e.g. tensors a model's graph never reads).
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    pocketmoe::stackdump::install_from_env();
    let version: &'static str = Box::leak(pocketmoe::version().into_boxed_str());
    // llama-cli's `-ngl N` (clap has no multi-letter short options).
    let argv = pocketmoe::cli::llama_flags(std::env::args_os(), pocketmoe::cli::CLI_LLAMA_FLAGS);
    let matches = Cli::command().version(version).get_matches_from(argv);
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    if let Err(e) = pocketmoe::ggml::cpu_isa::check_host() {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
    let result = match cli.cmd {
        Cmd::SelfCheck { list, threads } => self_check(list, threads),
        Cmd::Synth(args) => pocketmoe::cli::synth::run(args),
        Cmd::Inspect(args) => pocketmoe::cli::inspect::run(args),
        Cmd::Bench(args) => pocketmoe::cli::bench::run(args),
        Cmd::Run(args) => pocketmoe::cli::run::run(args),
        Cmd::Tokenize(args) => pocketmoe::cli::tokenize::run(args),
        Cmd::ServeBench(args) => pocketmoe::cli::serve_bench::run(args),
    };
    if let Err(e) = result {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}

fn self_check(list_only: bool, threads: usize) -> Result<()> {
    println!("pocketmoe {}", pocketmoe::version());
    println!("CPU kernels: {}", pocketmoe::ggml::cpu_isa::cpu_variant());
    let devices = Device::all();
    println!("ggml devices ({}):", devices.len());
    for d in &devices {
        println!(
            "  {:<8} {:<14} {:>9.1} GiB free / {:>9.1} GiB  {}",
            d.name,
            format!("{:?}", d.kind),
            d.memory_free as f64 / (1u64 << 30) as f64,
            d.memory_total as f64 / (1u64 << 30) as f64,
            d.description
        );
    }
    if list_only {
        return Ok(());
    }
    let mut backends = vec![Backend::cpu(threads)?];
    for d in devices.iter().filter(|d| d.kind == DeviceKind::Gpu) {
        backends
            .push(Backend::by_name(&d.name).with_context(|| format!("initialising {}", d.name))?);
    }
    let mut failed = 0;
    println!(
        "quantised matvec W[4096x512]·x vs dequantise-then-dot reference (NMSE limit {:.0e}):",
        selfcheck::MATVEC_NMSE_MAX
    );
    for b in &backends {
        for ty in selfcheck::SMOKE_TYPES {
            let c = selfcheck::matvec(b, ty, 512, 4096, 7)?;
            let verdict = if c.passed() { "ok" } else { "FAIL" };
            failed += usize::from(!c.passed());
            println!(
                "  {:<8} {:<8} nmse {:.2e}  ref {:?}  {verdict}",
                c.backend,
                c.ty.name(),
                c.nmse,
                c.reference
            );
        }
    }
    if failed > 0 {
        bail!("{failed} check(s) failed");
    }
    println!("all checks passed");
    Ok(())
}
