//! `pocketmoe synth`: write a synthetic model, or list the presets.
use crate::synth::{self, presets, quantmix::QuantMix, upcycle::UpcycleOptions, SynthOptions};
use anyhow::{Context as _, Result};
use std::path::PathBuf;
use std::time::Instant;

#[derive(clap::Args, Debug)]
pub struct SynthArgs {
    /// Architecture (GGUF name): qwen3moe, qwen2moe, gpt-oss, deepseek2, deepseek32, deepseek4,
    /// llama (Mixtral), glm4moe, minimax-m2, olmoe.
    #[arg(long, required_unless_present_any = ["list", "upcycle"])]
    pub arch: Option<String>,
    /// Preset: `tiny` (every arch, a few MB) or a real model's shape (see --list); `NAME:N`
    /// keeps its first N blocks (the same shape per block, a smaller file).
    #[arg(long, default_value = "tiny")]
    pub preset: String,
    /// Quantisation mix: q4_k_m, q8_0, iq2_xxs, mxfp4, dsv4-seed (routed gate/up IQ2_XXS, down
    /// Q2_K, the rest Q8_0), f16.
    #[arg(long, default_value = "q4_k_m")]
    pub quant: String,
    /// Routing skew: expert popularity and, on Qwen3-style models, temporal locality (a context
    /// channel). The default reproduces real Qwen3-30B-A3B decode routing: a per-layer LRU over
    /// 15% / 30% / 50% of the experts hits ~74% / 90% / 94%, nearly every expert used in 4096
    /// tokens. 0 = uniform and independent routing, the worst case for a cache (~13% / 29% / 50%).
    #[arg(long, default_value_t = synth::routing::DEFAULT_SKEW)]
    pub routing_skew: f32,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Output file (default: ARCH-PRESET-QUANT.gguf in the current directory).
    #[arg(short, long)]
    pub output: Option<PathBuf>,
    /// List the presets with their sizes and exit.
    #[arg(long)]
    pub list: bool,
    /// Write the header only, the tensor data a sparse hole of the right size: real shapes too
    /// large to write here (deepseek-v4-flash), for `pocketmoe inspect`.
    #[arg(long)]
    pub header_only: bool,
    /// Turn a dense `llama` GGUF (Llama, SmolLM2, …) into a Mixture-of-Experts GGUF whose
    /// experts are copies of its FFN and whose router is random: it answers as the dense model
    /// does, and the router's choice (and the expert cache) is visible. Output default:
    /// SRC-moeN.gguf beside SRC.
    #[arg(long, value_name = "SRC.gguf", conflicts_with_all = ["arch", "list", "header_only", "preset", "quant", "routing_skew"])]
    pub upcycle: Option<PathBuf>,
    /// --upcycle: experts per block.
    #[arg(long, default_value_t = 8, requires = "upcycle")]
    pub experts: u32,
    /// --upcycle: experts used per token (their weights are renormalised to sum to 1).
    #[arg(long, default_value_t = 2, requires = "upcycle")]
    pub experts_used: u32,
}

pub fn run(args: SynthArgs) -> Result<()> {
    if let Some(src) = args.upcycle {
        return upcycle(UpcycleOptions {
            out: args
                .output
                .unwrap_or_else(|| synth::upcycle::default_path(&src, args.experts)),
            src,
            n_expert: args.experts,
            n_expert_used: args.experts_used,
            seed: args.seed,
        });
    }
    let quant = QuantMix::parse(&args.quant).map_err(anyhow::Error::msg)?;
    if args.list {
        println!(
            "{:<18} {:<12} {:<22} {:>10}",
            "preset",
            "arch",
            "model",
            format!("{} GiB", quant.name())
        );
        for p in presets::all() {
            let size = synth::estimate_bytes(&p, quant).map_err(|e| anyhow::anyhow!("{e}"))?;
            println!(
                "{:<18} {:<12} {:<22} {:>10.2}",
                p.name,
                p.hparams.arch,
                p.model,
                size as f64 / (1u64 << 30) as f64
            );
        }
        return Ok(());
    }
    let arch = args.arch.expect("clap requires --arch without --list");
    let out = args.output.unwrap_or_else(|| {
        synth::default_path(std::path::Path::new("."), &arch, &args.preset, quant)
    });
    let opts = SynthOptions {
        arch,
        preset: args.preset,
        quant,
        routing_skew: args.routing_skew,
        seed: args.seed,
        out,
    };
    if args.header_only {
        let report = synth::synth_header_only(&opts)
            .with_context(|| format!("writing {}", opts.out.display()))?;
        println!(
            "wrote the header of {}: {} tensors, {:.2} GiB (sparse: no tensor data)",
            report.path.display(),
            report.n_tensors,
            report.bytes as f64 / (1u64 << 30) as f64
        );
        return Ok(());
    }
    let pb = byte_progress_for(&opts)?;
    let t0 = Instant::now();
    let report = synth::synth(&opts, &|done, _total| pb.set_position(done))
        .with_context(|| format!("writing {}", opts.out.display()))?;
    pb.finish_and_clear();
    print_wrote(&report.path, report.n_tensors, report.bytes, t0);
    for (ty, bytes) in &report.bytes_by_type {
        println!(
            "  {:<8} {:>10.3} GiB",
            ty.name(),
            *bytes as f64 / (1u64 << 30) as f64
        );
    }
    Ok(())
}

fn upcycle(opts: UpcycleOptions) -> Result<()> {
    let pb = super::byte_progress(0, &format!("upcycle to {} experts", opts.n_expert));
    let t0 = Instant::now();
    let report = synth::upcycle::upcycle(&opts, &|done, total| {
        pb.set_length(total);
        pb.set_position(done)
    })
    .with_context(|| format!("upcycling {} to {}", opts.src.display(), opts.out.display()))?;
    pb.finish_and_clear();
    print_wrote(&report.path, report.n_tensors, report.bytes, t0);
    println!(
        "  {} blocks, each {} copies of its dense FFN, {} used per token, random router",
        report.n_layer, opts.n_expert, opts.n_expert_used
    );
    Ok(())
}

fn print_wrote(path: &std::path::Path, n_tensors: usize, bytes: u64, t0: Instant) {
    let secs = t0.elapsed().as_secs_f64();
    println!(
        "wrote {}: {} tensors, {:.2} GiB in {:.1} s ({:.2} GB/s)",
        path.display(),
        n_tensors,
        bytes as f64 / (1u64 << 30) as f64,
        secs,
        bytes as f64 / secs / 1e9
    );
}

fn byte_progress_for(opts: &SynthOptions) -> Result<indicatif::ProgressBar> {
    let preset = presets::find(&opts.arch, &opts.preset).map_err(anyhow::Error::msg)?;
    let total = synth::estimate_bytes(&preset, opts.quant).map_err(|e| anyhow::anyhow!("{e}"))?;
    Ok(super::byte_progress(
        total,
        &format!("synth {} {}", opts.arch, opts.preset),
    ))
}
