//! `pocketmoe-serve`: the OpenAI-compatible server. Binds first (so `/health` answers 503 while
//! the model loads, with a progress bar on a terminal), logs one line with the URL once the
//! model is ready, and exits 0 after SIGINT/SIGTERM once running requests have finished or the
//! grace period has ended them. A model that fails to load exits 1 with the reason.
use anyhow::{Context as _, Result};
use clap::Parser;
use pocketmoe::engine::EngineOptions;
use pocketmoe::server::{self, Engine, Health, LocalEngine, LocalOptions, ServerConfig};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

#[derive(Parser)]
#[command(
    name = "pocketmoe-serve",
    version,
    // As llama-server: an option given twice takes the later value.
    args_override_self = true,
    about = "OpenAI-compatible server for a Mixture-of-Experts GGUF model",
    long_about = "OpenAI-compatible server for a Mixture-of-Experts GGUF model.\n\n\
        Endpoints: POST /v1/chat/completions, POST /v1/completions (stream: true for SSE), \
        GET /v1/models, GET /health (503 while loading), GET /metrics (Prometheus), \
        llama-server's /chat/completions, /models, /v1/health, /completion, /tokenize, \
        /detokenize, /apply-template, /props, /slots, /infill (fill-in-the-middle), with \
        --reranking /rerank, Anthropic's /v1/messages and \
        /v1/messages/count_tokens, with --embedding POST /v1/embeddings, /embedding and \
        /embeddings, and a chat \
        page at GET / (open without the API key; its API calls send the key entered on the \
        page; --no-webui turns it off).\n\n\
        Concurrency: up to --parallel requests are decoded together in one batch; further \
        requests wait in a bounded FIFO queue of --queue entries, and a request that finds the \
        queue full is answered 429 (Retry-After: 1); with --queue 0 a request is served when a \
        slot is free and gets 429 otherwise.\n\n\
        Slow clients: a connection with no request in progress must send a whole request head \
        within --header-timeout (408 and closed otherwise, or just closed when it sent nothing), \
        and a request's body must arrive within --body-timeout (408). At most --max-connections \
        are open; at the cap a new connection replaces the longest-idle one, and when every \
        open connection has a request in progress it is answered 503 (Retry-After: 1) and \
        closed.\n\n\
        SIGINT/SIGTERM: stop accepting, let running requests finish within --shutdown-grace, \
        close whatever is still open a second later, exit 0.\n\n\
        llama-server's options are accepted: -m, -c/--ctx-size (the whole cache, split between \
        the -np slots), -t/--threads, -np/--parallel, -a/--alias, --host, --port, --api-key, \
        the sampling defaults (--temp, --top-k, ..., -s, -n) and the rest under \"llama-server \
        options\" below; those with no effect here print a one-line note at start. \
        -ngl/--n-gpu-layers only picks the device (see its help). -hf USER/MODEL[:QUANT] \
        downloads the model from the Hugging Face Hub into the cache llama.cpp shares (see \
        --hf-repo)."
)]
struct Args {
    /// The GGUF model (any shard of a split bundle).
    #[arg(long, short, required_unless_present_any = ["hf_repo", "model_url"])]
    model: Option<PathBuf>,
    /// Address to listen on (loopback by default; use 0.0.0.0 to serve the network).
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    #[arg(long, default_value_t = 8000)]
    port: u16,
    /// Run on GPU N (needs a CUDA build). Default: every GPU when this is a CUDA build and GPUs
    /// are present (with --gpu-mem defaulting to each one's free memory minus a margin, so a
    /// model larger than the GPUs offloads its experts by itself), else the CPU.
    /// Several (`--gpu 0,1`, or the default with several GPUs): the model's blocks split over
    /// them (llama.cpp's `-sm layer`; -ts sets their shares; `-sm none` keeps the first GPU
    /// alone), each caching the routed experts of its own blocks when they do not all fit.
    #[arg(
        long,
        conflicts_with = "cpu",
        value_delimiter = ',',
        value_name = "N[,N...]"
    )]
    gpu: Vec<usize>,
    /// Run on the CPU even when a GPU is present.
    #[arg(long, conflicts_with = "n_gpu_layers")]
    cpu: bool,
    #[arg(
        long = "n-gpu-layers",
        visible_alias = "gpu-layers",
        value_name = "N",
        conflicts_with = "gpu",
        value_parser = pocketmoe::cli::parse_gpu_layers,
        help = pocketmoe::cli::GPU_LAYERS_HELP
    )]
    n_gpu_layers: Option<pocketmoe::cli::GpuLayers>,
    /// Memory budget on the GPU (bytes; K/M/G/KiB/MiB/GiB suffixes; default: the GPU's free
    /// memory minus max(1 GiB, 5%)); routed experts that do not fit are offloaded. With several
    /// GPUs: one value for each, or one per GPU (`--gpu-mem 22GiB,11GiB`); each GPU then caches
    /// the experts of its own blocks.
    #[arg(long, value_delimiter = ',', value_parser = pocketmoe::cli::inspect::parse_bytes)]
    gpu_mem: Vec<u64>,
    /// Context length of each request (prompt + completion); the KV cache holds
    /// ctx × parallel positions (-c/--ctx-size gives the whole cache instead, as llama-server).
    /// Default, as llama.cpp's --fit: on a GPU, the model's
    /// trained context when that many positions for every parallel request fit beside the whole
    /// model in the budget, else the most that does, down to 4096 (below that the routed experts
    /// are offloaded and the context stays at 4096); on the CPU, 4096. Capped by the trained
    /// context either way. A request's cache rows are taken as it grows, in pages of 256, lowest
    /// first, so a large context does not slow requests that use little of it.
    #[arg(long, conflicts_with = "ctx_size")]
    ctx: Option<usize>,
    /// llama-server's -c/--ctx-size: the whole KV cache, shared by the slots, so each request
    /// gets N / --parallel tokens (0 = the default above). Use --ctx for the per-request length.
    #[arg(short = 'c', long = "ctx-size", value_name = "N")]
    ctx_size: Option<usize>,
    /// KV cache type: f16, or q8_0 (half the memory; K and V stored Hadamard-rotated, as
    /// llama.cpp does for a quantised cache).
    #[arg(long, value_parser = pocketmoe::cli::parse_cache_type)]
    cache_type: Option<pocketmoe::ggml::GgmlType>,
    /// llama.cpp's -ctk: the K cache type. K and V share one type here (--cache-type); when
    /// -ctk and -ctv differ, a note says which is used.
    #[arg(long, value_parser = pocketmoe::cli::parse_cache_type, conflicts_with = "cache_type")]
    cache_type_k: Option<pocketmoe::ggml::GgmlType>,
    /// llama.cpp's -ctv: the V cache type (see --cache-type-k).
    #[arg(long, value_parser = pocketmoe::cli::parse_cache_type, conflicts_with = "cache_type")]
    cache_type_v: Option<pocketmoe::ggml::GgmlType>,
    /// Requests decoded together (continuous batching); also -np N, as llama-server.
    #[arg(long, default_value_t = pocketmoe::cli::DEFAULT_PARALLEL)]
    parallel: usize,
    /// Requests that may wait for a free slot; when full, new requests get 429 (0: no waiting,
    /// a request is served only if a slot is free).
    #[arg(long, default_value_t = 64)]
    queue: usize,
    /// Require `Authorization: Bearer KEY` or `x-api-key: KEY` (all routes but /health);
    /// several keys separated by commas, as llama-server.
    #[arg(long, env = "POCKETMOE_API_KEY", hide_env_values = true)]
    api_key: Option<String>,
    /// The model name clients use and /v1/models reports (default: the file name without
    /// .gguf).
    #[arg(short = 'a', long)]
    alias: Option<String>,
    /// CPU threads (0 = all cores).
    #[arg(short = 't', long, default_value_t = 0)]
    threads: usize,
    /// Tokens per forward pass (prompt chunks and decode tokens of all requests together);
    /// llama.cpp's -ub/--ubatch-size.
    #[arg(long, visible_alias = "ubatch-size", default_value_t = 512)]
    batch: usize,
    /// Largest request body (bytes; suffixes as --gpu-mem).
    #[arg(long, default_value = "8MiB", value_parser = pocketmoe::cli::inspect::parse_bytes)]
    max_body: u64,
    /// Parse control-token texts typed into chat message content (`<|im_end|>`,
    /// `<|im_start|>`, ...) as control tokens, as llama.cpp's server does. By default (as vLLM)
    /// message content is plain text, so a message cannot forge a role boundary; only the chat
    /// template's own markers are control tokens. /v1/completions prompts are parsed for control
    /// tokens either way.
    #[arg(long)]
    parse_special_in_content: bool,
    /// Batch-invariant CPU kernels: each request gets exactly the tokens it would get alone,
    /// whatever it is batched with (ggml otherwise picks CPU kernels by batch shape, which moves
    /// the last bits of the logits). Slower CPU prompt processing; CUDA kernels are unaffected.
    #[arg(long)]
    batch_invariant: bool,
    /// On the CPU: keep every weight in its file layout (llama.cpp's `--no-repack`). By default
    /// the matrices the CPU's kernels take are repacked into interleaved blocks at load (not with
    /// --batch-invariant: the repacked kernels take rows four at a time).
    #[arg(long)]
    no_repack: bool,
    /// Seconds running requests may go on after SIGINT/SIGTERM before they are ended;
    /// connections still open a second later are closed.
    #[arg(long, default_value_t = 10)]
    shutdown_grace: u64,
    /// Seconds a connection with no request in progress has to send a whole request head (after
    /// opening, or after its previous response); then it is closed (408 if a head had begun).
    #[arg(long, default_value = "10", value_parser = parse_secs)]
    header_timeout: Duration,
    /// Seconds a request's body has to arrive after its head (408 otherwise).
    #[arg(long, default_value = "30", value_parser = parse_secs)]
    body_timeout: Duration,
    /// Open connections at most. At the cap a new connection replaces the longest-idle one
    /// (no request in progress); if every one is busy, it gets 503 and is closed.
    #[arg(long, default_value_t = 512, value_parser = clap::value_parser!(u64).range(1..))]
    max_connections: u64,
    /// Allow browser pages from ORIGINS (comma-separated, e.g. http://localhost:3000; * for
    /// any; localhost for any local origin; also --cors-origins): a request whose Origin matches
    /// gets it back in Access-Control-Allow-Origin. OPTIONS preflights are answered (204)
    /// without the API key either way. Default: no origin allowed (llama-server allows *; not
    /// here, so that web pages cannot use a key-less local server through the browser).
    #[arg(long, visible_alias = "cors-origins", value_name = "ORIGINS")]
    cors: Option<String>,
    /// Do not serve the built-in chat page (GET /, /app.js, /app.css: they then answer 404).
    /// The page streams chats, folds the reasoning, and shows the model, live tok/s and the
    /// expert cache's hit rate and PCIe traffic from /metrics.
    #[arg(long, visible_alias = "no-ui")]
    no_webui: bool,
    #[command(flatten)]
    llama: LlamaServerArgs,
}

/// llama-server's options that have no other spelling here: sampling defaults, and the ones
/// that are accepted with a one-line note at start (what they mean here, or that they have no
/// effect). See `llama_notes`.
#[derive(clap::Args, Debug, Default)]
#[command(next_help_heading = "llama-server options")]
struct LlamaServerArgs {
    /// Default temperature of requests that do not set one (llama.cpp: 0.8).
    #[arg(long, visible_alias = "temperature", value_name = "T")]
    temp: Option<f32>,
    /// Default top_k (0 = off; llama.cpp: 40).
    #[arg(long, value_name = "N")]
    top_k: Option<u64>,
    /// Default top_p (1 = off; llama.cpp: 0.95).
    #[arg(long, value_name = "P")]
    top_p: Option<f32>,
    /// Default min_p (0 = off; llama.cpp: 0.05).
    #[arg(long, value_name = "P")]
    min_p: Option<f32>,
    /// Default repeat penalty (1 = off).
    #[arg(long, value_name = "X")]
    repeat_penalty: Option<f32>,
    /// Default tokens the repeat/presence/frequency penalties look back over (llama.cpp: 64).
    #[arg(long, value_name = "N")]
    repeat_last_n: Option<usize>,
    /// Default presence penalty (0 = off).
    #[arg(long, value_name = "X", allow_hyphen_values = true)]
    presence_penalty: Option<f32>,
    /// Default frequency penalty (0 = off).
    #[arg(long, value_name = "X", allow_hyphen_values = true)]
    frequency_penalty: Option<f32>,
    /// Default seed of requests that do not set one (-1 = a random seed per request).
    #[arg(short = 's', long, value_name = "N", allow_hyphen_values = true)]
    seed: Option<i64>,
    /// Default number of tokens to generate when a request sets no limit (-1 = until the
    /// context is full).
    #[arg(
        short = 'n',
        long = "n-predict",
        visible_alias = "predict",
        value_name = "N",
        allow_hyphen_values = true
    )]
    n_predict: Option<i64>,
    /// llama.cpp's logical batch: here only /infill's budget (the prefix keeps 3/4 of it, the
    /// suffix 1/4; default 2048); a forward pass takes --batch (-ub) tokens.
    #[arg(short = 'b', long = "batch-size", value_name = "N", value_parser = clap::value_parser!(u64).range(4..))]
    batch_size: Option<u64>,
    /// /infill: suffix/prefix/middle order instead of prefix/suffix/middle (for models
    /// trained so).
    #[arg(long)]
    spm_infill: bool,
    /// Chat templates are always rendered with Jinja here: no effect.
    #[arg(long)]
    jinja: bool,
    /// Chat templates are always rendered with Jinja here (a note says so).
    #[arg(long)]
    no_jinja: bool,
    /// The chat template: Jinja source, or the name of a template the GGUF carries
    /// (tokenizer.chat_template.NAME), or chatml.
    #[arg(long, value_name = "TEMPLATE", conflicts_with = "chat_template_file")]
    chat_template: Option<String>,
    /// The chat template from a Jinja file.
    #[arg(long, value_name = "FILE")]
    chat_template_file: Option<PathBuf>,
    /// Reasoning is always returned apart, in message.reasoning_content (llama.cpp's
    /// deepseek/auto); other values get a note.
    #[arg(long, value_name = "FORMAT")]
    reasoning_format: Option<String>,
    /// /metrics is always on here: no effect.
    #[arg(long)]
    metrics: bool,
    /// /slots is on by default here: no effect.
    #[arg(long)]
    slots: bool,
    /// Turn /slots off (answered 501, as llama-server).
    #[arg(long, conflicts_with = "slots")]
    no_slots: bool,
    /// Where POST /slots/{id}?action=save|restore keep slot files (a slot's prompt cache:
    /// its tokens and KV rows); created if missing. Without it those actions answer 501.
    #[arg(long, value_name = "PATH")]
    slot_save_path: Option<String>,
    /// Serve embeddings: POST /v1/embeddings (OpenAI's shape), /embedding and /embeddings
    /// (llama-server's): the final normed hidden state of the input's positions, pooled by
    /// --pooling and L2-normalised (embd_normalize). Completions keep working.
    #[arg(long, visible_alias = "embeddings")]
    embedding: bool,
    /// How embeddings pool the positions: none (one vector per position; /embedding only),
    /// mean, cls (the first), last, rank (reranking: /rerank scores with the GGUF's
    /// classification head). Default, as llama-server: the model's `{arch}.pooling_type`,
    /// else none.
    #[arg(long, value_name = "none|mean|cls|last|rank", value_parser = pocketmoe::engine::embed::Pooling::parse)]
    pooling: Option<pocketmoe::engine::embed::Pooling>,
    /// Serve reranking (POST /rerank, /reranking, /v1/rerank, /v1/reranking): as
    /// --embedding --pooling rank (also --rerank).
    /// It replaces a --pooling given with it (a note says so).
    #[arg(long, visible_alias = "rerank")]
    reranking: bool,
    /// Continuous batching is always on here: no effect.
    #[arg(long)]
    cont_batching: bool,
    /// Continuous batching is always on here (a note says so).
    #[arg(long)]
    no_cont_batching: bool,
    /// Attention always runs through ggml's flash-attention kernel here: on/auto have no
    /// effect, off gets a note.
    #[arg(long, value_name = "on|off|auto", value_parser = ["on", "off", "auto", "1", "0", "true", "false", "enabled", "disabled"])]
    flash_attn: Option<String>,
    /// The KV cache is paged per request here (each takes the pages it needs): no effect.
    #[arg(long)]
    kv_unified: bool,
    /// No effect (see --kv-unified).
    #[arg(long)]
    no_kv_unified: bool,
    /// No sliding-window cache here (every layer keeps the whole context): no effect.
    #[arg(long)]
    swa_full: bool,
    /// No context shift here: a request is limited to its context (a note says so).
    #[arg(long)]
    context_shift: bool,
    /// No context shift here: no effect.
    #[arg(long)]
    no_context_shift: bool,
    /// LoRA adapters are not supported: the base model is served (a note says so).
    #[arg(long, value_name = "FILE")]
    lora: Vec<String>,
    /// Debug logging (as RUST_LOG=debug, unless RUST_LOG is set).
    #[arg(short = 'v', long, visible_alias = "log-verbose")]
    verbose: bool,
    /// With -hf: use the Hub cache only, never the network.
    #[arg(long)]
    offline: bool,
    /// The model from the Hugging Face Hub (also -hf, -hfr), as llama-server: QUANT (any case)
    /// picks the file, Q4_K_M (then Q8_0, then the first GGUF) without it. Downloaded into the
    /// Hub cache llama.cpp shares (LLAMA_CACHE, else HF_HUB_CACHE, HF_HOME/hub,
    /// ~/.cache/huggingface/hub), a line per 5% on stderr; a file already there is used without
    /// the network. Endpoint: MODEL_ENDPOINT or HF_ENDPOINT.
    #[arg(long, value_name = "USER/MODEL[:QUANT]")]
    hf_repo: Option<String>,
    /// With -hf: this file of the repository (overrides QUANT; also -hff).
    #[arg(long, value_name = "FILE")]
    hf_file: Option<String>,
    /// With -hf: Hugging Face access token for gated or private repositories (also -hft).
    #[arg(long, value_name = "TOKEN", env = "HF_TOKEN", hide_env_values = true)]
    hf_token: Option<String>,
    /// Download the model from a URL: not available here (an error says so; use -m).
    #[arg(long, value_name = "URL")]
    model_url: Option<String>,
    /// llama-server's router-mode tags: no effect.
    #[arg(long, value_name = "TAGS")]
    tags: Option<String>,
    /// Experts of the first N layers on the CPU: here routed experts are placed by the
    /// --gpu-mem budget (a note says so).
    #[arg(long, value_name = "N")]
    n_cpu_moe: Option<usize>,
    /// All experts on the CPU: here routed experts are placed by the --gpu-mem budget.
    #[arg(long)]
    cpu_moe: bool,
    /// Threads for prompt processing: here -t is used for both (no effect).
    #[arg(long, value_name = "N")]
    threads_batch: Option<i64>,
    /// HTTP threads: requests are served by async tasks here (no effect).
    #[arg(long, value_name = "N")]
    threads_http: Option<i64>,
    /// llama-server's read/write timeout: here --header-timeout and --body-timeout (no effect).
    #[arg(long, value_name = "N")]
    timeout: Option<u64>,
    /// No effect here (weights are read by mmap or copied as the device needs).
    #[arg(long)]
    mlock: bool,
    /// No effect here.
    #[arg(long)]
    no_mmap: bool,
    /// No effect here.
    #[arg(long)]
    mmap: bool,
    /// No warm-up run is done here: no effect.
    #[arg(long)]
    no_warmup: bool,
    /// Device list: use --gpu N / --cpu here (a note says so).
    #[arg(long, value_name = "LIST")]
    device: Option<String>,
    /// With several GPUs (--gpu 0,1): `layer` (the default: whole blocks per GPU, each caching
    /// its blocks' experts when offloading), `expert` (ours: the layer split, but every GPU
    /// caches and computes a share of every layer's routed experts), `tensor` (alias `row`:
    /// every weight cut across the GPUs, resident models only; MLA and all-heads Q/K-norm
    /// models keep attention whole on every GPU) or `none` (the first GPU only).
    #[arg(long, value_name = "MODE")]
    split_mode: Option<String>,
    /// With several GPUs (--gpu 0,1): each one's share of the blocks (e.g. 3,1; default: in
    /// proportion to their memory). No effect with one device.
    #[arg(long, value_name = "LIST")]
    tensor_split: Option<String>,
    /// Use --gpu N here (a note says so).
    #[arg(long, value_name = "N")]
    main_gpu: Option<usize>,
    /// No host-memory prompt cache here (each slot keeps its prompt cache in the KV cache):
    /// no effect.
    #[arg(long, value_name = "MiB")]
    cache_ram: Option<i64>,
    /// No effect here (the paged cache needs no defragmentation).
    #[arg(long, value_name = "X")]
    defrag_thold: Option<f32>,
    /// A request goes to the idle slot whose kept prompt cache shares the longest prefix with
    /// its prompt when that prefix is at least this fraction of the prompt, else to the least
    /// recently used idle slot (default 0.1; 0: always the least recently used).
    #[arg(long, value_name = "X")]
    slot_prompt_similarity: Option<f32>,
    /// Logging stays on here: no effect.
    #[arg(long)]
    log_disable: bool,
    /// A file of API keys, one per line (with --api-key's, any of them is accepted).
    #[arg(long, value_name = "FILE")]
    api_key_file: Option<PathBuf>,
    /// Samplers not implemented here (mirostat, typical, dynamic temperature, XTC, DRY, a
    /// sampler order): accepted with a note that they are ignored.
    #[arg(long, value_name = "N")]
    mirostat: Option<String>,
    #[arg(long, value_name = "X", hide = true)]
    mirostat_lr: Option<String>,
    #[arg(long, value_name = "X", hide = true)]
    mirostat_ent: Option<String>,
    #[arg(long, value_name = "P", hide = true)]
    typical: Option<String>,
    #[arg(long, value_name = "X", hide = true)]
    dynatemp_range: Option<String>,
    #[arg(long, value_name = "X", hide = true)]
    dynatemp_exp: Option<String>,
    #[arg(long, value_name = "P", hide = true)]
    xtc_probability: Option<String>,
    #[arg(long, value_name = "X", hide = true)]
    xtc_threshold: Option<String>,
    #[arg(long, value_name = "X", hide = true)]
    dry_multiplier: Option<String>,
    #[arg(long, value_name = "LIST", hide = true)]
    samplers: Option<String>,
    /// Never sample end-of-generation tokens: a reply runs to its length limit (`-n`, the
    /// request's `max_tokens`, or the context). A request's `ignore_eos` overrides it.
    #[arg(long)]
    ignore_eos: bool,
    /// Control tokens in the output: shown where the chat format needs them (a note says so).
    #[arg(long)]
    special: bool,
    /// No context shift here, so nothing to keep: no effect.
    #[arg(long, value_name = "N", allow_hyphen_values = true)]
    keep: Option<i64>,
    /// Logs go to stderr here: no effect (redirect stderr).
    #[arg(long, value_name = "FILE")]
    log_file: Option<String>,
    /// No effect here (timings are always measured).
    #[arg(long)]
    no_perf: bool,
    /// TLS is not served here: an error says so (put a TLS proxy in front).
    #[arg(long, value_name = "FILE")]
    ssl_key_file: Option<PathBuf>,
    /// See --ssl-key-file.
    #[arg(long, value_name = "FILE")]
    ssl_cert_file: Option<PathBuf>,
    /// The chat page is on by default here (--no-webui turns it off): no effect.
    #[arg(long)]
    webui: bool,
}

impl Args {
    fn llama_cache_k(&self) -> Option<pocketmoe::ggml::GgmlType> {
        self.cache_type_k
    }
    fn llama_cache_v(&self) -> Option<pocketmoe::ggml::GgmlType> {
        self.cache_type_v
    }
}

/// Seconds (fractions allowed), more than 0.
fn parse_secs(s: &str) -> Result<Duration, String> {
    match s.parse::<f64>() {
        Ok(x) if x > 0.0 && x <= 1e9 => Ok(Duration::from_secs_f64(x)),
        _ => Err(format!("{s:?} is not a number of seconds > 0")),
    }
}

fn main() {
    let args = Args::parse_from(pocketmoe::cli::llama_flags(
        std::env::args_os(),
        pocketmoe::cli::SERVE_LLAMA_FLAGS,
    ));
    let level = if args.llama.verbose { "debug" } else { "info" };
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(level)),
        )
        .with_writer(std::io::stderr)
        .init();
    pocketmoe::stackdump::install_from_env();
    if let Err(e) = pocketmoe::ggml::cpu_isa::check_host() {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
    match run(args) {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::exit(1);
        }
    }
}

/// The one-line notes for llama-server options that have no effect here or mean something a
/// little different, or the error for the ones that cannot work (downloads).
fn llama_notes(a: &LlamaServerArgs) -> Result<Vec<String>> {
    if let Some(url) = &a.model_url {
        anyhow::bail!(
            "--model-url {url}: pocketmoe-serve does not download from plain URLs: use \
             -hf USER/MODEL[:QUANT] for the Hugging Face Hub, or download the GGUF and pass -m PATH"
        );
    }
    if a.ssl_key_file.is_some() || a.ssl_cert_file.is_some() {
        anyhow::bail!(
            "--ssl-key-file/--ssl-cert-file: pocketmoe-serve does not serve TLS; put a TLS \
             proxy (caddy, nginx) in front, or serve on 127.0.0.1 only"
        );
    }
    if a.hf_file.is_some() && a.hf_repo.is_none() {
        anyhow::bail!("--hf-file needs -hf USER/MODEL, the repository it is in");
    }
    let mut notes = Vec::new();
    let mut note = |flag: &str, what: &str| notes.push(format!("note: {flag}: {what}"));
    let none = "no effect here";
    if a.batch_size.is_some() {
        note(
            "-b/--batch-size",
            "sets /infill's prefix/suffix budget only: a forward pass takes --batch (-ub/--ubatch-size) tokens",
        );
    }
    if a.jinja {
        note(
            "--jinja",
            "no effect here: chat templates are always rendered with Jinja",
        );
    }
    if a.no_jinja {
        note(
            "--no-jinja",
            "ignored: chat templates are always rendered with Jinja here",
        );
    }
    if let Some(f) = a
        .reasoning_format
        .as_deref()
        .filter(|f| !matches!(*f, "deepseek" | "auto"))
    {
        note(
            &format!("--reasoning-format {f}"),
            "ignored: reasoning is always returned apart, in reasoning_content (as deepseek)",
        );
    }
    if a.metrics {
        note("--metrics", "no effect here: /metrics is always on");
    }
    if a.slots {
        note("--slots", "no effect here: /slots is on unless --no-slots");
    }
    if let (true, Some(p)) = (a.reranking, a.pooling) {
        note(
            "--reranking",
            &format!("replaces --pooling {} (reranking pools rank)", p.name()),
        );
    }
    if a.pooling.is_some() && !a.embedding && !a.reranking {
        note(
            "--pooling",
            "no effect without --embedding (embeddings are not served)",
        );
    }
    if a.cont_batching {
        note(
            "--cont-batching",
            "no effect here: continuous batching is always on",
        );
    }
    if a.no_cont_batching {
        note(
            "--no-cont-batching",
            "ignored: continuous batching is always on here",
        );
    }
    match a.flash_attn.as_deref() {
        Some("off" | "0" | "false" | "disabled") => note(
            "-fa off",
            "ignored: attention always runs through ggml's flash-attention kernel here",
        ),
        Some(_) => note(
            "-fa",
            "no effect here: attention always uses flash attention",
        ),
        None => {}
    }
    if a.kv_unified || a.no_kv_unified {
        note(
            "--kv-unified",
            "no effect here: each request's cache is paged, within -c / --parallel tokens",
        );
    }
    if a.swa_full {
        note(
            "--swa-full",
            "no effect here: every layer keeps the whole context",
        );
    }
    if a.context_shift {
        note(
            "--context-shift",
            "ignored: no context shift here; a request stops when its context is full",
        );
    }
    if a.no_context_shift {
        note(
            "--no-context-shift",
            "no effect here: there is no context shift",
        );
    }
    if !a.lora.is_empty() {
        note(
            "--lora",
            "ignored: LoRA adapters are not supported here; the base model is served",
        );
    }
    if a.offline && a.hf_repo.is_none() {
        note("--offline", "no effect without -hf: nothing is downloaded");
    }
    if a.tags.is_some() {
        note("--tags", none);
    }
    if a.n_cpu_moe.is_some() || a.cpu_moe {
        note(
            "--n-cpu-moe/--cpu-moe",
            "ignored: routed experts are placed by the --gpu-mem budget here (the rest stay in host memory)",
        );
    }
    if a.threads_batch.is_some() {
        note(
            "-tb/--threads-batch",
            "no effect here: -t threads do both prompt and decode",
        );
    }
    if a.threads_http.is_some() {
        note(
            "--threads-http",
            "no effect here: requests are served by async tasks",
        );
    }
    if a.timeout.is_some() {
        note(
            "-to/--timeout",
            "no effect here: see --header-timeout and --body-timeout",
        );
    }
    for (set, flag) in [
        (a.mlock, "--mlock"),
        (a.no_mmap, "--no-mmap"),
        (a.mmap, "--mmap"),
        (a.no_warmup, "--no-warmup"),
        (a.log_disable, "--log-disable"),
        (a.webui, "--webui"),
        (a.cache_ram.is_some(), "--cache-ram"),
        (a.defrag_thold.is_some(), "--defrag-thold"),
    ] {
        if set {
            note(flag, none);
        }
    }
    for (set, flag) in [
        (a.mirostat.is_some(), "--mirostat"),
        (a.mirostat_lr.is_some(), "--mirostat-lr"),
        (a.mirostat_ent.is_some(), "--mirostat-ent"),
        (a.typical.is_some(), "--typical"),
        (a.dynatemp_range.is_some(), "--dynatemp-range"),
        (a.dynatemp_exp.is_some(), "--dynatemp-exp"),
        (a.xtc_probability.is_some(), "--xtc-probability"),
        (a.xtc_threshold.is_some(), "--xtc-threshold"),
        (a.dry_multiplier.is_some(), "--dry-multiplier"),
        (a.samplers.is_some(), "--samplers"),
    ] {
        if set {
            note(
                flag,
                "ignored: this sampler is not implemented here (penalties, top-k, top-p, min-p and temperature are)",
            );
        }
    }
    if a.special {
        note(
            "-sp/--special",
            "ignored: control tokens are shown only where the chat format needs them",
        );
    }
    for (set, flag) in [
        (a.keep.is_some(), "--keep"),
        (a.log_file.is_some(), "--log-file"),
        (a.no_perf, "--no-perf"),
    ] {
        if set {
            note(flag, none);
        }
    }
    if a.device.is_some() || a.main_gpu.is_some() {
        note(
            "-dev/--device/-mg",
            "ignored: pick the device with --gpu N or --cpu here",
        );
    }
    Ok(notes)
}

/// The server's default sampling parameters: llama.cpp's, with the command line's.
fn sampling_defaults(a: &LlamaServerArgs) -> Result<pocketmoe::server::validate::Defaults> {
    let mut d = pocketmoe::server::validate::Defaults::default();
    let p = &mut d.sampling;
    p.temperature = a.temp.unwrap_or(p.temperature);
    p.top_k = a.top_k.map_or(p.top_k, |k| k.min(u32::MAX as u64) as usize);
    p.top_p = a.top_p.unwrap_or(p.top_p);
    p.min_p = a.min_p.unwrap_or(p.min_p);
    p.repeat_penalty = a.repeat_penalty.unwrap_or(p.repeat_penalty);
    p.penalty_last_n = a.repeat_last_n.unwrap_or(p.penalty_last_n);
    p.presence_penalty = a.presence_penalty.unwrap_or(p.presence_penalty);
    p.frequency_penalty = a.frequency_penalty.unwrap_or(p.frequency_penalty);
    p.validate()
        .map_err(|e| anyhow::anyhow!("sampling defaults: {e}"))?;
    d.seed = a.seed.filter(|&s| s >= 0).map(|s| s as u64);
    d.n_predict = match a.n_predict {
        None | Some(-1) => None,
        Some(n) if n > 0 => Some(n as usize),
        Some(n) => anyhow::bail!("-n/--n-predict {n}: send -1 (no limit) or a count above 0"),
    };
    d.ignore_eos = a.ignore_eos;
    Ok(d)
}

fn run(args: Args) -> Result<i32> {
    for n in llama_notes(&args.llama)? {
        eprintln!("{n}");
    }
    let defaults = sampling_defaults(&args.llama)?;
    let mut keys: Vec<String> = args
        .api_key
        .iter()
        .flat_map(|k| k.split(','))
        .map(|k| k.trim().to_string())
        .filter(|k| !k.is_empty())
        .collect();
    if let Some(f) = &args.llama.api_key_file {
        let text = std::fs::read_to_string(f)
            .with_context(|| format!("--api-key-file {}", f.display()))?;
        keys.extend(
            text.lines()
                .map(|l| l.trim().to_string())
                .filter(|l| !l.is_empty()),
        );
    }
    if keys.is_empty()
        && args
            .cors
            .as_deref()
            .is_some_and(|c| c.split(',').any(|o| o.trim() == "*"))
    {
        eprintln!(
            "warning: --cors '*' without --api-key: any web page the user opens can use this server through the browser"
        );
    }
    let hf = args
        .llama
        .hf_repo
        .as_ref()
        .map(|repo| pocketmoe::hub::HubModel {
            repo: repo.clone(),
            file: args.llama.hf_file.clone(),
            token: args.llama.hf_token.clone(),
            offline: args.llama.offline,
        });
    let model = pocketmoe::hub::model_path(args.model.as_deref(), hf.as_ref())?;
    let cache_type = match (args.cache_type, args.llama_cache_k(), args.llama_cache_v()) {
        (Some(t), _, _) => t,
        (None, Some(k), Some(v)) if k != v => {
            eprintln!(
                "note: -ctk {k:?} -ctv {v:?}: K and V share one cache type here; using {k:?} for both"
            );
            k
        }
        (None, k, v) => k.or(v).unwrap_or(pocketmoe::ggml::GgmlType::F16),
    };
    let template = match (&args.llama.chat_template, &args.llama.chat_template_file) {
        (_, Some(f)) => Some(pocketmoe::server::TemplateChoice::Source(
            std::fs::read_to_string(f)
                .with_context(|| format!("--chat-template-file {}", f.display()))?,
        )),
        (Some(t), None) if t.contains("{%") || t.contains("{{") => {
            Some(pocketmoe::server::TemplateChoice::Source(t.clone()))
        }
        (Some(t), None) => Some(pocketmoe::server::TemplateChoice::Named(t.clone())),
        (None, None) => None,
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let addr = format!("{}:{}", args.host, args.port);
    let listener = rt
        .block_on(tokio::net::TcpListener::bind(&addr))
        .with_context(|| format!("binding {addr}"))?;
    let local = listener.local_addr()?;
    let size = std::fs::metadata(&model).map_or(0, |m| m.len());
    let pb = pocketmoe::cli::byte_progress(size, "loading");
    let pb2 = pb.clone();
    let (device, note) =
        pocketmoe::cli::device_for(args.cpu, args.gpu.first().copied(), args.n_gpu_layers);
    if let Some(note) = note {
        eprintln!("{note}");
    }
    let gpus = pocketmoe::cli::gpus_for(&args.gpu, device);
    let choice = pocketmoe::cli::split_for(
        &gpus,
        args.llama.split_mode.as_deref(),
        args.llama.tensor_split.as_deref(),
    )?;
    if let Some(note) = &choice.note {
        eprintln!("{note}");
    }
    let mut engine_opts = EngineOptions {
        device,
        devices: choice.devices,
        tensor_split: choice.tensor_split,
        split_tensors: choice.tensors,
        expert_parallel: choice.experts,
        n_threads: args.threads,
        n_ubatch: args.batch,
        gpu_mem: pocketmoe::cli::budgets_for(&args.gpu_mem).0,
        gpu_mems: pocketmoe::cli::budgets_for(&args.gpu_mem).1,
        kv_type: cache_type,
        repack: !args.no_repack,
        ..Default::default()
    };
    // llama-server's -c is the whole cache, split evenly between the slots.
    let per_request = match args.ctx_size {
        Some(0) | None => args.ctx,
        Some(total) => {
            let each = total / args.parallel.max(1);
            anyhow::ensure!(
                each >= 2,
                "-c {total} split between --parallel {} slots leaves {each} tokens each: raise -c",
                args.parallel
            );
            if args.parallel > 1 {
                eprintln!(
                    "context: -c {total} over {} slots = {each} tokens per request",
                    args.parallel
                );
            }
            Some(each)
        }
    };
    engine_opts.n_ctx =
        pocketmoe::cli::context_for(per_request, &model, &engine_opts, args.parallel)?;
    engine_opts.n_seq = args.parallel;
    let ctx = engine_opts.n_ctx;
    let opts = LocalOptions {
        model: model.clone(),
        engine: engine_opts,
        parallel: args.parallel,
        max_queue: args.queue,
        alias: args.alias.clone(),
        batch_invariant: args.batch_invariant,
        parse_special_in_content: args.parse_special_in_content,
        chat_template: template,
        embedding: args.llama.embedding || args.llama.reranking,
        pooling: if args.llama.reranking {
            Some(pocketmoe::engine::embed::Pooling::Rank)
        } else {
            args.llama.pooling
        },
        slot_similarity: args.llama.slot_prompt_similarity.unwrap_or(0.1),
    };
    let engine = Arc::new(LocalEngine::start(
        opts,
        Box::new(move |done, _| pb2.set_position(done)),
    )?);
    match engine.pooling() {
        Some(pocketmoe::engine::embed::Pooling::None) => eprintln!(
            "embeddings: pooling none (the model sets no pooling_type): /embedding answers one \
             vector per position, /v1/embeddings needs --pooling mean|cls|last"
        ),
        Some(pocketmoe::engine::embed::Pooling::Rank) => {
            eprintln!("reranking: POST /rerank (also /reranking, /v1/rerank, /v1/reranking)")
        }
        Some(p) => eprintln!("embeddings: pooling {}", p.name()),
        None => {}
    }
    let slot_save_path = match &args.llama.slot_save_path {
        Some(dir) => {
            let dir = PathBuf::from(dir);
            std::fs::create_dir_all(&dir)
                .with_context(|| format!("--slot-save-path {}", dir.display()))?;
            eprintln!("slot files: {}", dir.display());
            Some(dir)
        }
        None => None,
    };
    let cfg = ServerConfig {
        api_key: keys.first().cloned(),
        more_keys: keys.iter().skip(1).cloned().collect(),
        max_body: args.max_body.min(usize::MAX as u64) as usize,
        shutdown_grace: Duration::from_secs(args.shutdown_grace),
        header_timeout: args.header_timeout,
        body_timeout: args.body_timeout,
        max_connections: args.max_connections.min(usize::MAX as u64) as usize,
        cors: args.cors.clone(),
        webui: !args.no_webui,
        slots: !args.llama.no_slots,
        slot_save_path,
        defaults,
        infill: pocketmoe::server::infill::InfillConfig {
            n_batch: args.llama.batch_size.map_or(2048, |b| b as usize),
            spm: args.llama.spm_infill,
        },
    };
    let (failed_tx, failed_rx) = tokio::sync::oneshot::channel::<String>();
    // Watches the load: one line with the URL when ready, or the reason it failed.
    {
        let engine = engine.clone();
        let (id, parallel) = (engine.card().id.clone(), args.parallel);
        let page = if args.no_webui {
            String::new()
        } else {
            format!("; chat page: http://{local}/")
        };
        rt.spawn(async move {
            loop {
                match engine.health() {
                    Health::Loading { .. } => tokio::time::sleep(Duration::from_millis(50)).await,
                    Health::Ready => {
                        pb.finish_and_clear();
                        tracing::info!(
                            "serving {id} at http://{local}/v1 ({parallel} parallel, {ctx} tokens of context each){page}"
                        );
                        return;
                    }
                    Health::Failed(e) => {
                        pb.finish_and_clear();
                        let _ = failed_tx.send(e);
                        return;
                    }
                    Health::ShuttingDown => return,
                }
            }
        });
    }
    let failed = Arc::new(std::sync::Mutex::new(None::<String>));
    let failed2 = failed.clone();
    let shutdown = async move {
        tokio::select! {
            _ = server::shutdown_signal() => {},
            Ok(e) = failed_rx => { *failed2.lock().unwrap_or_else(|p| p.into_inner()) = Some(e); },
        }
    };
    let dyn_engine: Arc<dyn Engine> = engine.clone();
    rt.block_on(server::serve(listener, dyn_engine, cfg, shutdown))?;
    if let Some(e) = failed.lock().unwrap_or_else(|p| p.into_inner()).take() {
        anyhow::bail!("loading {}: {e}", model.display());
    }
    engine.join();
    tracing::info!("stopped");
    Ok(0)
}
