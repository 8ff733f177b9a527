//! `pocketmoe run`: load a GGUF (progress bar), tokenize a prompt (optionally through the model's
//! chat template), stream generated text to the terminal, and end with prompt and generation
//! tok/s.
use super::{Decoder, LlamaDecoder};
use crate::engine::sampling::{Sampler, SamplerParams};
use crate::engine::{Device, Engine, EngineOptions};
use crate::ggml::llama::{LlamaContext, LlamaModel};
use crate::gguf::GgufModel;
use crate::tokenizer::{ChatMessage, ChatTemplate, StreamDecoder, Tokenizer};
use anyhow::{bail, Context as _, Result};
use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

#[derive(clap::Args, Debug)]
pub struct RunArgs {
    /// The GGUF model (any shard of a split bundle).
    #[arg(long, short)]
    pub model: PathBuf,
    /// The prompt.
    #[arg(long, short)]
    pub prompt: String,
    /// Tokens to generate at most (stops earlier at an end-of-generation token).
    #[arg(short = 'n', long, default_value_t = 128)]
    pub n_predict: usize,
    /// Wrap the prompt as a user message with the model's chat template.
    #[arg(long)]
    pub chat: bool,
    /// Run on GPU N (needs a CUDA build).
    #[arg(long, conflicts_with = "cpu")]
    pub gpu: Option<usize>,
    /// Run on the CPU (the default).
    #[arg(long)]
    pub cpu: bool,
    /// Context length.
    #[arg(long, default_value_t = 4096)]
    pub ctx: usize,
    /// Device memory budget (e.g. 8GiB). When the model does not fit, routed experts stay in
    /// pinned host memory and the GPU keeps a cache of them (DESIGN.md §4).
    #[arg(long, value_parser = super::inspect::parse_bytes)]
    pub gpu_mem: Option<u64>,
    /// Expert-cache policy: lru, lfu, lfru, lfru:HALF_LIFE.
    #[arg(long, default_value = "lfru", value_parser = crate::experts::policy::PolicyKind::parse)]
    pub cache_policy: crate::experts::policy::PolicyKind,
    /// Print offload statistics (hit rate, PCIe bytes, waits) at the end.
    #[arg(long, short)]
    pub verbose: bool,
    /// CPU threads (0 = all cores).
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
    /// Sampling temperature (0 = greedy).
    #[arg(long, default_value_t = 0.8)]
    pub temp: f32,
    #[arg(long, default_value_t = 40)]
    pub top_k: usize,
    #[arg(long, default_value_t = 0.95)]
    pub top_p: f32,
    #[arg(long, default_value_t = 0.05)]
    pub min_p: f32,
    #[arg(long, default_value_t = 1.0)]
    pub repeat_penalty: f32,
    #[arg(long, default_value_t = 0.0)]
    pub presence_penalty: f32,
    #[arg(long, default_value_t = 0.0)]
    pub frequency_penalty: f32,
    #[arg(long, default_value_t = 0xC0FFEE)]
    pub seed: u64,
    /// Generate with libllama (stock llama.cpp, same build) instead of PocketMoE, for comparison.
    #[arg(long)]
    pub reference: bool,
}

pub fn run(args: RunArgs) -> Result<()> {
    let params = SamplerParams {
        temperature: args.temp,
        top_k: args.top_k,
        top_p: args.top_p,
        min_p: args.min_p,
        repeat_penalty: args.repeat_penalty,
        presence_penalty: args.presence_penalty,
        frequency_penalty: args.frequency_penalty,
        seed: args.seed,
        ..Default::default()
    };
    params.validate().map_err(anyhow::Error::msg)?;
    let file = GgufModel::open(&args.model)
        .with_context(|| format!("reading {}", args.model.display()))?;
    let tok = Tokenizer::from_gguf(&file)?;
    let text = if args.chat {
        let tmpl = ChatTemplate::from_gguf(&file)?;
        tmpl.apply(
            &[ChatMessage::user(&args.prompt)],
            true,
            serde_json::Value::Null,
        )?
    } else {
        args.prompt.clone()
    };
    drop(file);
    let prompt = tok.encode(&text, true, args.chat);
    if prompt.is_empty() {
        bail!("the prompt tokenized to nothing");
    }
    let device = args.gpu.map_or(Device::Cpu, Device::Cuda);
    let opts = EngineOptions {
        device,
        n_ctx: args.ctx,
        n_threads: args.threads,
        gpu_mem: args.gpu_mem,
        policy: args.cache_policy.clone(),
        ..Default::default()
    };
    let t_load = Instant::now();
    let what = if args.reference {
        "libllama"
    } else {
        "pocketmoe"
    };
    let loaded = |t: Instant| {
        eprintln!(
            "loaded {} ({device:?}, {what}) in {:.1} s",
            args.model.display(),
            t.elapsed().as_secs_f64()
        )
    };
    let gen = Generation {
        tok: &tok,
        text: &text,
        prompt: &prompt,
        params,
        n_predict: args.n_predict,
    };
    if args.reference {
        let lm = LlamaModel::load(&args.model, if args.gpu.is_some() { -1 } else { 0 })?;
        let threads = if args.threads == 0 {
            std::thread::available_parallelism().map_or(1, |n| n.get())
        } else {
            args.threads
        };
        let ctx = LlamaContext::new(&lm, args.ctx as u32, threads as i32)?;
        loaded(t_load);
        let mut dec = LlamaDecoder { ctx, n_past: 0 };
        let r = gen.run(&mut dec);
        drop(dec);
        r
    } else {
        let size = std::fs::metadata(&args.model).map(|m| m.len()).unwrap_or(0);
        let pb = super::byte_progress(size, "loading");
        let mut eng = Engine::load(&args.model, opts, &|done, _| pb.set_position(done))?;
        pb.finish_and_clear();
        loaded(t_load);
        if let Some(s) = eng.expert_slots() {
            eprintln!(
                "offload: {s} of {} experts per layer cached on the device ({:.2} GiB in use)",
                eng.hp.n_expert,
                eng.device_bytes() as f64 / (1u64 << 30) as f64
            );
        }
        gen.run(&mut eng)?;
        if let (true, Some(st)) = (args.verbose, eng.offload_stats()) {
            eprintln!("{}", st.summary());
        }
        Ok(())
    }
}

/// One generation: prompt, sampling, streaming output.
struct Generation<'a> {
    tok: &'a Tokenizer,
    text: &'a str,
    prompt: &'a [u32],
    params: SamplerParams,
    n_predict: usize,
}

impl Generation<'_> {
    fn run(self, decoder: &mut dyn Decoder) -> Result<()> {
        let (tok, text, prompt) = (self.tok, self.text, self.prompt);
        let mut sampler = Sampler::new(self.params.clone());
        for &t in prompt {
            sampler.accept(t);
        }
        let mut out = std::io::stdout().lock();
        let mut dec = StreamDecoder::new();
        write!(out, "{text}")?;
        let t0 = Instant::now();
        let mut logits = decoder.prefill(prompt)?;
        let t_prompt = t0.elapsed().as_secs_f64();
        let t1 = Instant::now();
        let mut n_gen = 0;
        while n_gen < self.n_predict {
            let next = sampler.sample(&logits);
            if tok.is_eog(next) {
                break;
            }
            sampler.accept(next);
            write!(out, "{}", dec.push(&tok.token_to_piece(next)))?;
            out.flush()?;
            n_gen += 1;
            if n_gen == self.n_predict {
                break;
            }
            logits = decoder.step(next)?;
        }
        writeln!(out, "{}", dec.finish())?;
        let t_gen = t1.elapsed().as_secs_f64();
        eprintln!(
            "prompt: {} tokens, {:.1} tok/s | generation: {} tokens, {:.1} tok/s",
            prompt.len(),
            prompt.len() as f64 / t_prompt,
            n_gen,
            n_gen as f64 / t_gen.max(1e-9)
        );
        Ok(())
    }
}
