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
    #[arg(long, short, required_unless_present = "hf_repo")]
    pub model: Option<PathBuf>,
    /// The model from the Hugging Face Hub instead (also -hf), as llama.cpp: QUANT picks the
    /// file (default Q4_K_M), cached in the Hub cache llama.cpp shares (see pocketmoe-serve
    /// --help).
    #[arg(long, value_name = "USER/MODEL[:QUANT]")]
    pub hf_repo: Option<String>,
    /// With -hf: this file of the repository (also -hff).
    #[arg(long, value_name = "FILE", requires = "hf_repo")]
    pub hf_file: Option<String>,
    /// With -hf: access token for gated or private repositories (also -hft).
    #[arg(long, value_name = "TOKEN", env = "HF_TOKEN", hide_env_values = true)]
    pub hf_token: Option<String>,
    /// With -hf: the Hub cache only, never the network.
    #[arg(long)]
    pub offline: bool,
    /// The prompt.
    #[arg(long, short)]
    pub prompt: String,
    /// Tokens to generate at most (stops earlier at an end-of-generation token).
    #[arg(short = 'n', long, default_value_t = 128)]
    pub n_predict: usize,
    /// Wrap the prompt as a user message with the model's chat template.
    #[arg(long)]
    pub chat: bool,
    /// Run on GPU N (needs a CUDA build); several (`--gpu 0,1`): the model's blocks split
    /// over them (llama.cpp's `-sm layer`), each GPU caching the routed experts of its blocks
    /// when the model does not fit them all. Default: every GPU when this is a CUDA build and
    /// GPUs are present (`-sm none`: the first alone), else the CPU.
    #[arg(
        long,
        conflicts_with = "cpu",
        value_delimiter = ',',
        value_name = "N[,N...]"
    )]
    pub gpu: Vec<usize>,
    /// With several GPUs: each one's share of the blocks, or with `--split-mode tensor` of every
    /// cut dimension (llama.cpp's `-ts 3,1`; default: blocks in proportion to their memory,
    /// cuts equal).
    #[arg(long = "tensor-split", value_name = "LIST")]
    pub tensor_split: Option<String>,
    /// With several GPUs: `layer` (the default: whole blocks per GPU, each caching its blocks'
    /// experts when offloading), `expert` (ours: the layer split, but every GPU caches and
    /// computes a share of every layer's routed experts, so a step's misses cross every GPU's
    /// link at once), `tensor` (alias `row`: every weight cut across the GPUs, resident models
    /// only; MLA and all-heads Q/K-norm models keep attention whole on every GPU) or `none`
    /// (the first GPU only); llama.cpp's `-sm`.
    #[arg(long = "split-mode", value_name = "MODE")]
    pub split_mode: Option<String>,
    /// Run on the CPU even when a GPU is present.
    #[arg(long)]
    pub cpu: bool,
    #[arg(
        long = "n-gpu-layers",
        visible_alias = "gpu-layers",
        value_name = "N",
        conflicts_with_all = ["gpu", "cpu"],
        value_parser = super::parse_gpu_layers,
        help = super::GPU_LAYERS_HELP
    )]
    pub n_gpu_layers: Option<super::GpuLayers>,
    /// Context length. Default: on a GPU, the model's trained context if it fits beside the
    /// whole model in the budget, else the most that does, down to 4096 (then the routed experts
    /// are offloaded); on the CPU, 4096. Capped by the trained context either way.
    #[arg(short = 'c', long, visible_alias = "ctx-size")]
    pub ctx: Option<usize>,
    /// KV cache type: f16, or q8_0 (half the memory; K and V stored Hadamard-rotated, as
    /// llama.cpp does for a quantised cache).
    #[arg(long, default_value = "f16", value_parser = super::parse_cache_type)]
    pub cache_type: crate::ggml::GgmlType,
    /// Device memory budget (e.g. 8GiB; default on a GPU: its free memory minus max(1 GiB, 5%)).
    /// When the model does not fit, routed experts stay in pinned host memory and the GPU keeps
    /// a cache of them (docs/design.md §4). With several GPUs: one value for each, or one per
    /// GPU (`--gpu-mem 22GiB,11GiB`); each GPU then caches the experts of its own blocks.
    #[arg(long, value_delimiter = ',', value_parser = super::inspect::parse_bytes)]
    pub gpu_mem: Vec<u64>,
    /// Expert-cache policy: lru, lfu, lfru, lfru:HALF_LIFE.
    #[arg(long, default_value = "lfru", value_parser = crate::experts::policy::PolicyKind::parse)]
    pub cache_policy: crate::experts::policy::PolicyKind,
    /// Offloading: no FATE-style prefetch (layer L+1's experts are then fetched only when its
    /// router asks for them), e.g. to measure what the prefetch gains.
    #[arg(long)]
    pub no_prefetch: bool,
    /// Offloading: never compute missed experts on the CPU (every miss crosses PCIe).
    #[arg(long)]
    pub no_cpu_experts: bool,
    /// On the CPU: keep every weight in its file layout (llama.cpp's `--no-repack`). By default
    /// the matrices the CPU's kernels take are repacked into interleaved blocks at load.
    #[arg(long)]
    pub no_repack: bool,
    /// Print offload statistics (hit rate, PCIe bytes, waits) at the end.
    #[arg(long, short)]
    pub verbose: bool,
    /// CPU threads (0 = all cores).
    #[arg(short = 't', long, default_value_t = 0)]
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
    let hf = args.hf_repo.as_ref().map(|repo| crate::hub::HubModel {
        repo: repo.clone(),
        file: args.hf_file.clone(),
        token: args.hf_token.clone(),
        offline: args.offline,
    });
    let model = crate::hub::model_path(args.model.as_deref(), hf.as_ref())?;
    let file = GgufModel::open(&model).with_context(|| format!("reading {}", model.display()))?;
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
    let (device, note) = super::device_for(args.cpu, args.gpu.first().copied(), args.n_gpu_layers);
    if let Some(note) = note {
        eprintln!("{note}");
    }
    let gpus = super::gpus_for(&args.gpu, device);
    let choice = super::split_for(
        &gpus,
        args.split_mode.as_deref(),
        args.tensor_split.as_deref(),
    )?;
    if let Some(note) = &choice.note {
        eprintln!("{note}");
    }
    let mut opts = EngineOptions {
        device,
        devices: choice.devices,
        tensor_split: choice.tensor_split,
        split_tensors: choice.tensors,
        expert_parallel: choice.experts,
        n_threads: args.threads,
        gpu_mem: super::budgets_for(&args.gpu_mem).0,
        gpu_mems: super::budgets_for(&args.gpu_mem).1,
        kv_type: args.cache_type,
        policy: args.cache_policy.clone(),
        prefetch: !args.no_prefetch,
        cpu_experts: !args.no_cpu_experts,
        repack: !args.no_repack,
        ..Default::default()
    };
    opts.n_ctx = super::context_for(args.ctx, &model, &opts, 1)?;
    let t_load = Instant::now();
    let what = if args.reference {
        "libllama"
    } else {
        "pocketmoe"
    };
    let loaded = |t: Instant| {
        eprintln!(
            "loaded {} ({device:?}, {what}) in {:.1} s",
            model.display(),
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
        let lm = LlamaModel::load(&model, if device == Device::Cpu { 0 } else { -1 })?;
        let threads = if args.threads == 0 {
            std::thread::available_parallelism().map_or(1, |n| n.get())
        } else {
            args.threads
        };
        let ctx =
            LlamaContext::new_with_kv(&lm, opts.n_ctx as u32, threads as i32, args.cache_type)?;
        loaded(t_load);
        let mut dec = LlamaDecoder { ctx, n_past: 0 };
        let r = gen.run(&mut dec);
        drop(dec);
        r
    } else {
        let size = std::fs::metadata(&model).map(|m| m.len()).unwrap_or(0);
        let pb = super::byte_progress(size, "loading");
        let mut eng = Engine::load(&model, opts, &|done, _| pb.set_position(done))?;
        pb.finish_and_clear();
        loaded(t_load);
        eprintln!("{}", eng.plan());
        match std::env::var_os("POCKETMOE_TRACE") {
            Some(path) => gen.run(&mut Trace::new(&mut eng, path.into())?)?,
            None => gen.run(&mut eng)?,
        }
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

/// `POCKETMOE_TRACE=FILE pocketmoe run ...` (a diagnosis aid, e.g. for CUDA-graph replay vs
/// direct runs): writes one line per step with the argmax and a checksum of the logits, and with
/// `POCKETMOE_TRACE_NODES=NAME,...` (`*` = all) one line per named f32 node (name, sum, first values). Two traces
/// diff line by line; the first differing node is where two runs part.
struct Trace<'e> {
    eng: &'e mut Engine,
    cap: Option<Box<crate::ggml::capture::Capture>>,
    out: std::io::BufWriter<std::fs::File>,
    step: usize,
}

impl<'e> Trace<'e> {
    fn new(eng: &'e mut Engine, path: PathBuf) -> Result<Self> {
        let out = std::io::BufWriter::new(
            std::fs::File::create(&path).with_context(|| format!("creating {}", path.display()))?,
        );
        let mut cap = std::env::var("POCKETMOE_TRACE_NODES")
            .ok()
            .map(|names| crate::ggml::capture::Capture::new(names.split(',')));
        eng.set_capture(cap.as_deref_mut())?;
        Ok(Self {
            eng,
            cap,
            out,
            step: 0,
        })
    }

    fn record(&mut self, logits: &[f32]) -> Result<()> {
        let argmax = logits
            .iter()
            .enumerate()
            .fold(
                (0, f32::NEG_INFINITY),
                |m, (i, &v)| if v > m.1 { (i, v) } else { m },
            )
            .0;
        let sum: f64 = logits.iter().map(|&v| v as f64).sum();
        writeln!(self.out, "step {} argmax {argmax} sum {sum:.6e}", self.step)?;
        if let Some(cap) = self.cap.as_mut() {
            let mut names: Vec<_> = cap.got.keys().cloned().collect();
            names.sort();
            for n in names {
                let v = &cap.got[&n];
                let s: f64 = v.iter().map(|&x| x as f64).sum();
                let head: Vec<String> = v.iter().take(4).map(|x| format!("{x:.6e}")).collect();
                writeln!(
                    self.out,
                    "  {n} n={} sum={s:.6e} head={}",
                    v.len(),
                    head.join(",")
                )?;
            }
            cap.got.clear();
        }
        self.step += 1;
        Ok(())
    }
}

impl Decoder for Trace<'_> {
    fn prefill(&mut self, tokens: &[u32]) -> Result<Vec<f32>> {
        let l = self.eng.prefill(tokens)?;
        self.record(&l)?;
        Ok(l)
    }
    fn step(&mut self, token: u32) -> Result<Vec<f32>> {
        let l = self.eng.step(token)?;
        self.record(&l)?;
        Ok(l)
    }
}

impl Drop for Trace<'_> {
    fn drop(&mut self) {
        let _ = self.eng.set_capture(None);
        let _ = self.out.flush();
    }
}
