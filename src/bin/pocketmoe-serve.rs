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
    about = "OpenAI-compatible server for a Mixture-of-Experts GGUF model",
    long_about = "OpenAI-compatible server for a Mixture-of-Experts GGUF model.\n\n\
        Endpoints: POST /v1/chat/completions, POST /v1/completions (stream: true for SSE), \
        GET /v1/models, GET /health (503 while loading), GET /metrics (Prometheus), and a chat \
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
        llama-server's names work where they mean the same: -m, -c/--ctx-size, -t/--threads, \
        -np/--parallel, -a/--alias, --host, --port, --api-key; -ngl/--n-gpu-layers only picks \
        the device (see its help)."
)]
struct Args {
    /// The GGUF model (any shard of a split bundle).
    #[arg(long, short)]
    model: PathBuf,
    /// Address to listen on (loopback by default; use 0.0.0.0 to serve the network).
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    #[arg(long, default_value_t = 8000)]
    port: u16,
    /// Run on GPU N (needs a CUDA build). Default: GPU 0 when this is a CUDA build and a GPU is
    /// present (with --gpu-mem defaulting to its free memory minus a margin, so a model larger
    /// than the GPU offloads its experts by itself), else the CPU.
    #[arg(long, conflicts_with = "cpu")]
    gpu: Option<usize>,
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
    /// memory minus max(1 GiB, 5%)); routed experts that do not fit are offloaded.
    #[arg(long, value_parser = pocketmoe::cli::inspect::parse_bytes)]
    gpu_mem: Option<u64>,
    /// Context length of each request (prompt + completion); the KV cache holds
    /// ctx × parallel positions (llama-server's -c/--ctx-size is the whole cache, shared by its
    /// slots; here it is per request). Default, as llama.cpp's --fit: on a GPU, the model's
    /// trained context when that many positions for every parallel request fit beside the whole
    /// model in the budget, else the most that does, down to 4096 (below that the routed experts
    /// are offloaded and the context stays at 4096); on the CPU, 4096. Capped by the trained
    /// context either way. A request's cache rows are taken as it grows, in pages of 256, lowest
    /// first, so a large context does not slow requests that use little of it.
    #[arg(short = 'c', long, visible_alias = "ctx-size")]
    ctx: Option<usize>,
    /// KV cache type: f16, or q8_0 (half the memory; K and V stored Hadamard-rotated, as
    /// llama.cpp does for a quantised cache).
    #[arg(long, default_value = "f16", value_parser = pocketmoe::cli::parse_cache_type)]
    cache_type: pocketmoe::ggml::GgmlType,
    /// Requests decoded together (continuous batching); also -np N, as llama-server.
    #[arg(long, default_value_t = 4)]
    parallel: usize,
    /// Requests that may wait for a free slot; when full, new requests get 429 (0: no waiting,
    /// a request is served only if a slot is free).
    #[arg(long, default_value_t = 64)]
    queue: usize,
    /// Require `Authorization: Bearer KEY` (all routes but /health).
    #[arg(long, env = "POCKETMOE_API_KEY", hide_env_values = true)]
    api_key: Option<String>,
    /// The model name clients use and /v1/models reports (default: the file name without
    /// .gguf).
    #[arg(short = 'a', long)]
    alias: Option<String>,
    /// CPU threads (0 = all cores).
    #[arg(short = 't', long, default_value_t = 0)]
    threads: usize,
    /// Tokens per forward pass (prompt chunks and decode tokens of all requests together).
    #[arg(long, default_value_t = 512)]
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
    /// Allow browser pages from ORIGIN (e.g. http://localhost:3000, or *): responses carry
    /// Access-Control-Allow-Origin and OPTIONS preflights are answered. Default: no CORS headers.
    #[arg(long, value_name = "ORIGIN")]
    cors: Option<String>,
    /// Do not serve the built-in chat page (GET /, /app.js, /app.css: they then answer 404).
    /// The page streams chats, folds the reasoning, and shows the model, live tok/s and the
    /// expert cache's hit rate and PCIe traffic from /metrics.
    #[arg(long)]
    no_webui: bool,
}

/// Seconds (fractions allowed), more than 0.
fn parse_secs(s: &str) -> Result<Duration, String> {
    match s.parse::<f64>() {
        Ok(x) if x > 0.0 && x <= 1e9 => Ok(Duration::from_secs_f64(x)),
        _ => Err(format!("{s:?} is not a number of seconds > 0")),
    }
}

fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse_from(pocketmoe::cli::llama_flags(
        std::env::args_os(),
        pocketmoe::cli::SERVE_LLAMA_FLAGS,
    ));
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

fn run(args: Args) -> Result<i32> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let addr = format!("{}:{}", args.host, args.port);
    let listener = rt
        .block_on(tokio::net::TcpListener::bind(&addr))
        .with_context(|| format!("binding {addr}"))?;
    let local = listener.local_addr()?;
    let size = std::fs::metadata(&args.model).map_or(0, |m| m.len());
    let pb = pocketmoe::cli::byte_progress(size, "loading");
    let pb2 = pb.clone();
    let (device, note) = pocketmoe::cli::device_for(args.cpu, args.gpu, args.n_gpu_layers);
    if let Some(note) = note {
        eprintln!("{note}");
    }
    let mut engine_opts = EngineOptions {
        device,
        n_threads: args.threads,
        n_ubatch: args.batch,
        gpu_mem: args.gpu_mem,
        kv_type: args.cache_type,
        repack: !args.no_repack,
        ..Default::default()
    };
    engine_opts.n_ctx =
        pocketmoe::cli::context_for(args.ctx, &args.model, &engine_opts, args.parallel)?;
    engine_opts.n_seq = args.parallel;
    let ctx = engine_opts.n_ctx;
    let opts = LocalOptions {
        model: args.model.clone(),
        engine: engine_opts,
        parallel: args.parallel,
        max_queue: args.queue,
        alias: args.alias.clone(),
        batch_invariant: args.batch_invariant,
        parse_special_in_content: args.parse_special_in_content,
    };
    let engine = Arc::new(LocalEngine::start(
        opts,
        Box::new(move |done, _| pb2.set_position(done)),
    )?);
    let cfg = ServerConfig {
        api_key: args.api_key.clone(),
        max_body: args.max_body.min(usize::MAX as u64) as usize,
        shutdown_grace: Duration::from_secs(args.shutdown_grace),
        header_timeout: args.header_timeout,
        body_timeout: args.body_timeout,
        max_connections: args.max_connections.min(usize::MAX as u64) as usize,
        cors: args.cors.clone(),
        webui: !args.no_webui,
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
        anyhow::bail!("loading {}: {e}", args.model.display());
    }
    engine.join();
    tracing::info!("stopped");
    Ok(0)
}
