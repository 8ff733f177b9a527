//! The OpenAI-compatible HTTP server (axum + tokio) in front of an [`Engine`].
//!
//! Routes: `POST /v1/chat/completions` (also `/chat/completions`), `POST /v1/completions`
//! (JSON or SSE with `stream: true`), `GET /v1/models[/{id}]` (also `/models`), `GET /health`
//! and `/v1/health` (503 while loading), `GET /metrics` (Prometheus, `llamacpp:*` included),
//! llama.cpp's native `POST /completion` and `/completions` (`native`), fill-in-the-middle
//! `POST /infill` (`infill`), Anthropic's
//! `POST /v1/messages` and `/v1/messages/count_tokens` (`anthropic`), OpenAI's Responses API
//! `POST /v1/responses` and `/responses` (`responses`), and llama-server's
//! `POST /tokenize`, `POST /detokenize`, `POST /apply-template`, `GET /props` and `GET /slots`
//! (`extra`), embeddings with `--embedding` (`POST /v1/embeddings`, `/embedding`,
//! `/embeddings`: `embeddings`), reranking with `--reranking` (`POST /rerank`, `/reranking`,
//! `/v1/rerank`, `/v1/reranking`: `rerank`), and the built-in chat page at `GET /` (`web`; off with `--no-webui`). Parts: `api` (the engine boundary), `error` (the one mapping to HTTP), `types`
//! (wire types), `validate` (body -> request, 4xx on anything off), `respond` (JSON / SSE),
//! `parse` (stop strings, reasoning, tool calls), `worker` + `local` (the real engine: one
//! thread, continuous batching), `metrics`, `conn` (below hyper: connection cap, header
//! timeout, request-head checks).
//!
//! Invariants: every request is answered — a body that is too large, not JSON, nested too
//! deep, of the wrong types or asking for the impossible gets a 4xx in OpenAI's error shape, and
//! so does a malformed request head (`conn`); a slow client is cut off (`--header-timeout` for
//! the head, `--body-timeout` for the body: 408); at most `--max-connections` are open; the
//! API key (when set, `Authorization: Bearer KEY`, the scheme in any case) guards everything but
//! `/health` and the chat page's static files (the page's own API calls carry the key); `OPTIONS`
//! preflights are answered before the key check (browsers send no key there), and a request's
//! `Origin` is echoed in `Access-Control-Allow-Origin` only when `--cors ORIGINS` allows it;
//! shutdown stops accepting, lets running requests finish within the grace period,
//! then ends them, and closes what is still open one second later (a stalled connection
//! included).
mod anthropic;
pub mod api;
pub mod conn;
mod embeddings;
pub mod error;
mod extra;
pub mod gbnf;
pub mod grammar;
pub mod infill;
mod local;
pub mod metrics;
mod native;
pub mod parse;
mod rerank;
mod respond;
mod responses;
pub mod slotfile;
pub mod types;
pub mod validate;
mod web;
pub mod worker;

pub use api::{
    Engine, Event, FinishReason, GenRequest, Generation, Health, ModelCard, StatsSnapshot,
};
pub use api::{EngineInfo, OutputFormat, Prompt, SlotState, TokenLogprob};
pub use error::ApiError;
pub use local::{LocalEngine, LocalOptions, TemplateChoice};

use axum::body::Body;
use axum::extract::{ConnectInfo, Path, Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use http_body_util::BodyExt as _;
use respond::{Kind, Meta};
use std::future::{Future, IntoFuture};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Required as `Authorization: Bearer <key>` (or `x-api-key: <key>`) when set.
    pub api_key: Option<String>,
    /// More keys that are accepted as well (llama-server's comma-separated `--api-key` and
    /// `--api-key-file`); only checked when `api_key` is set.
    pub more_keys: Vec<String>,
    /// Largest request body accepted (bytes).
    pub max_body: usize,
    /// How long running requests may go on after a shutdown signal.
    pub shutdown_grace: Duration,
    /// A connection with no request in progress must deliver a whole request head within this
    /// time (of opening, or of its previous response's end).
    pub header_timeout: Duration,
    /// A request's body must arrive within this time of its head (408 otherwise).
    pub body_timeout: Duration,
    /// Open connections at most (`conn`).
    pub max_connections: usize,
    /// `--cors ORIGINS` (comma-separated; `*`; `localhost`): the origins whose requests get
    /// `Access-Control-Allow-Origin` (their own origin echoed); `None`: none ([`cors_allows`]).
    pub cors: Option<String>,
    /// Serve the built-in chat page at `/` (`--no-webui`: off).
    pub webui: bool,
    /// Serve `/slots` (`--no-slots`: 501, as llama-server).
    pub slots: bool,
    /// `--slot-save-path`: where `POST /slots/{id}?action=save|restore` keep slot files;
    /// `None`: those actions answer 501, as llama-server's.
    pub slot_save_path: Option<std::path::PathBuf>,
    /// Sampling and length defaults for requests that do not set them (llama-server's
    /// `--temp`, `--top-k`, ..., `-n`).
    pub defaults: validate::Defaults,
    /// `/infill`'s budget (`-b`) and order (`--spm-infill`).
    pub infill: infill::InfillConfig,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            api_key: None,
            more_keys: Vec::new(),
            max_body: 8 << 20,
            shutdown_grace: Duration::from_secs(10),
            header_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(30),
            max_connections: 512,
            cors: None,
            webui: true,
            slots: true,
            slot_save_path: None,
            defaults: validate::Defaults::default(),
            infill: infill::InfillConfig::default(),
        }
    }
}

pub(crate) struct AppState {
    pub(crate) engine: Arc<dyn Engine>,
    pub(crate) cfg: ServerConfig,
    http: metrics::HttpMetrics,
    pub(crate) totals: Arc<metrics::LlamaTotals>,
    pub(crate) next_id: AtomicU64,
    conns: Option<Arc<conn::Conns>>,
}

/// The application: routes, API key check, request counting.
pub fn router(engine: Arc<dyn Engine>, cfg: ServerConfig) -> Router {
    app(engine, cfg, None)
}

fn app(engine: Arc<dyn Engine>, cfg: ServerConfig, conns: Option<Arc<conn::Conns>>) -> Router {
    let st = Arc::new(AppState {
        engine,
        cfg,
        http: metrics::HttpMetrics::default(),
        totals: Arc::new(metrics::LlamaTotals::default()),
        next_id: AtomicU64::new(1),
        conns,
    });
    let routes = Router::new();
    let routes = if st.cfg.webui {
        web::routes(routes)
    } else {
        routes
    };
    routes
        .route("/v1/chat/completions", post(chat))
        .route("/chat/completions", post(chat))
        .route("/v1/completions", post(completions))
        .route("/completion", post(native::completion))
        .route("/completions", post(native::completion))
        .route("/infill", post(infill::infill))
        .route("/v1/messages", post(anthropic::messages))
        .route("/v1/responses", post(responses::responses))
        .route("/responses", post(responses::responses))
        .route("/v1/messages/count_tokens", post(anthropic::count_tokens))
        .route("/v1/embeddings", post(embeddings::openai))
        .route("/embedding", post(embeddings::native))
        .route("/embeddings", post(embeddings::native))
        .route("/rerank", post(rerank::rerank))
        .route("/reranking", post(rerank::rerank))
        .route("/v1/rerank", post(rerank::rerank))
        .route("/v1/reranking", post(rerank::rerank))
        .route("/v1/models", get(models))
        .route("/models", get(models))
        .route("/v1/models/{id}", get(model))
        .route("/health", get(health))
        .route("/v1/health", get(health))
        .route("/metrics", get(metrics_text))
        .route("/tokenize", post(extra::tokenize))
        .route("/detokenize", post(extra::detokenize))
        .route("/apply-template", post(extra::apply_template))
        .route("/props", get(extra::props))
        .route("/slots", get(extra::slots))
        .route("/slots/{id}", post(extra::slot_action))
        .fallback(no_route)
        .method_not_allowed_fallback(not_allowed)
        .layer(middleware::from_fn_with_state(st.clone(), auth))
        .layer(middleware::from_fn_with_state(st.clone(), count))
        .layer(middleware::from_fn_with_state(st.clone(), cors))
        .layer(middleware::from_fn(track))
        .with_state(st)
}

/// How long connections may stay open past the grace period, for the ends of the requests the
/// engine cut to be written.
const FLUSH: Duration = Duration::from_secs(1);

/// Serves `engine` on `listener` until `shutdown` resolves; then stops accepting, gives running
/// requests the grace period, and returns once every connection is closed — connections still
/// open [`FLUSH`] after the grace period (a stalled client) are closed then.
pub async fn serve(
    listener: tokio::net::TcpListener,
    engine: Arc<dyn Engine>,
    cfg: ServerConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let grace = cfg.shutdown_grace;
    let conns = Arc::new(conn::Conns::new(conn::Limits {
        max_connections: cfg.max_connections,
        header_timeout: cfg.header_timeout,
    }));
    let app = app(engine.clone(), cfg, Some(conns.clone()))
        .into_make_service_with_connect_info::<conn::ConnHandle>();
    let (signalled_tx, signalled_rx) = tokio::sync::oneshot::channel::<()>();
    let serving = axum::serve(conn::Gate::new(listener, conns.clone()), app)
        .with_graceful_shutdown(async move {
            shutdown.await;
            tracing::info!("shutting down: no new requests; running ones get {grace:?}");
            engine.shutdown(grace);
            let _ = signalled_tx.send(());
        })
        .into_future();
    let mut serving = std::pin::pin!(serving);
    tokio::select! {
        r = &mut serving => return r,
        Ok(()) = signalled_rx => {}
    }
    if let Ok(r) = tokio::time::timeout(grace + FLUSH, &mut serving).await {
        return r;
    }
    let n = conns.kill_all();
    tracing::warn!("the grace period is over: closing {n} connection(s) still open");
    match tokio::time::timeout(Duration::from_secs(2), &mut serving).await {
        Ok(r) => r,
        Err(_) => {
            tracing::warn!("connections did not close; stopping anyway");
            Ok(())
        }
    }
}

/// Resolves on SIGINT or SIGTERM.
pub async fn shutdown_signal() {
    let int = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => {
                    let _ = int.await;
                    return;
                }
            };
        tokio::select! {
            _ = int => {},
            _ = term.recv() => {},
        }
    }
    #[cfg(not(unix))]
    let _ = int.await;
}

/// Marks the request's connection busy until its response body is done or dropped (`conn`:
/// the header timeout and the choice of a connection to close at the cap skip busy ones).
async fn track(req: Request, next: Next) -> Response {
    let Some(ConnectInfo(handle)) = req
        .extensions()
        .get::<ConnectInfo<conn::ConnHandle>>()
        .cloned()
    else {
        return next.run(req).await;
    };
    let busy = handle.begin();
    next.run(req).await.map(move |body| {
        Body::new(body.map_err(move |e| {
            busy.hold();
            e
        }))
    })
}

/// Whether the request's `Origin` is one `--cors ORIGINS` allows: an exact match of one of the
/// comma-separated origins (scheme, host and port, as browsers send them), `*` (any origin), or
/// `localhost` (llama-server's special value: an origin whose host is localhost, 127.0.0.1 or
/// [::1], any scheme and port).
pub fn cors_allows(allowed: &str, origin: &str) -> bool {
    let origin = origin.trim();
    allowed.split(',').map(str::trim).any(|a| match a {
        "" => false,
        "*" => true,
        "localhost" => {
            let host = origin.split_once("://").map_or(origin, |(_, h)| h);
            let host = host.strip_suffix('/').unwrap_or(host);
            let host = if host.starts_with('[') {
                host.split_once(']').map_or(host, |(h, _)| &h[1..])
            } else {
                host.split(':').next().unwrap_or(host)
            };
            matches!(host, "localhost" | "127.0.0.1" | "::1")
        }
        a => a
            .trim_end_matches('/')
            .eq_ignore_ascii_case(origin.trim_end_matches('/')),
    })
}

/// CORS. Preflights (`OPTIONS`) are answered here, before the API key check (browsers send no
/// key on a preflight), with 204 and the allowed methods and headers; the request's `Origin` is
/// echoed in `Access-Control-Allow-Origin` only when `--cors ORIGINS` allows it, so any other
/// page's browser refuses to hand it the response.
///
/// Default (no `--cors`): no origin is allowed. llama-server allows `*` by default; we do not,
/// because the server is often run on a workstation without `--api-key`, and `*` would let any
/// web page the user opens read the model's answers (and spend its compute) through the
/// user's browser. Pages served by this server itself (the chat page) are same-origin and need
/// no CORS at all.
async fn cors(State(st): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    let origin = req
        .headers()
        .get(header::ORIGIN)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let allowed = st.cfg.cors.as_deref().unwrap_or("");
    let allow = origin
        .as_deref()
        .filter(|o| cors_allows(allowed, o))
        .and_then(|o| {
            let value = if allowed.split(',').any(|a| a.trim() == "*") {
                "*"
            } else {
                o
            };
            header::HeaderValue::from_str(value).ok()
        });
    if req.method() == axum::http::Method::OPTIONS {
        let mut resp = StatusCode::NO_CONTENT.into_response();
        let h = resp.headers_mut();
        h.insert(header::VARY, header::HeaderValue::from_static("Origin"));
        if let Some(allow) = allow {
            let asked = req
                .headers()
                .get(header::ACCESS_CONTROL_REQUEST_HEADERS)
                .cloned()
                .unwrap_or(header::HeaderValue::from_static(
                    "authorization, content-type",
                ));
            h.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, allow);
            h.insert(
                header::ACCESS_CONTROL_ALLOW_METHODS,
                header::HeaderValue::from_static("GET, POST, OPTIONS"),
            );
            h.insert(header::ACCESS_CONTROL_ALLOW_HEADERS, asked);
            h.insert(
                header::ACCESS_CONTROL_MAX_AGE,
                header::HeaderValue::from_static("86400"),
            );
        }
        return resp;
    }
    let mut resp = next.run(req).await;
    if st.cfg.cors.is_some() {
        let h = resp.headers_mut();
        if let Some(allow) = allow {
            h.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, allow);
        }
        h.insert(header::VARY, header::HeaderValue::from_static("Origin"));
    }
    resp
}

async fn count(State(st): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    let path = req.uri().path().to_string();
    let resp = next.run(req).await;
    st.http.record(&path, resp.status().as_u16());
    resp
}

/// Constant-time comparison (the key's length is not secret).
fn same_key(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The token of `Bearer TOKEN` (RFC 7235: the scheme is case-insensitive, 1+ spaces follow it).
fn bearer_token(v: &str) -> Option<&str> {
    let (scheme, token) = v.trim().split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim_start_matches(' ').trim_end())
}

async fn auth(State(st): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    if let Some(key) = &st.cfg.api_key {
        let path = req.uri().path();
        let open = path == "/health"
            || path == "/v1/health"
            || (st.cfg.webui && web::PATHS.contains(&path));
        if !open {
            // `Authorization: Bearer KEY`, or Anthropic's `x-api-key: KEY` (its clients send
            // that; llama-server takes both).
            let given = req
                .headers()
                .get(header::AUTHORIZATION)
                .and_then(|v| v.to_str().ok())
                .and_then(bearer_token)
                .or_else(|| {
                    req.headers()
                        .get("x-api-key")
                        .and_then(|v| v.to_str().ok())
                        .map(str::trim)
                });
            let known = |g: &str| {
                std::iter::once(key)
                    .chain(&st.cfg.more_keys)
                    .fold(false, |ok, k| ok | same_key(g.as_bytes(), k.as_bytes()))
            };
            if !given.is_some_and(known) {
                return ApiError::Unauthorized.into_response();
            }
        }
    }
    next.run(req).await
}

async fn no_route(req: Request) -> ApiError {
    ApiError::NoRoute {
        method: req.method().to_string(),
        path: req.uri().path().to_string(),
    }
}

async fn not_allowed(req: Request) -> ApiError {
    ApiError::MethodNotAllowed {
        method: req.method().to_string(),
        path: req.uri().path().to_string(),
    }
}

/// The body, within the size limit and the body timeout, if it claims to be JSON (or claims
/// nothing).
pub(crate) async fn read_body(
    req: Request,
    cfg: &ServerConfig,
) -> Result<axum::body::Bytes, ApiError> {
    let limit = cfg.max_body;
    if let Some(ct) = req.headers().get(header::CONTENT_TYPE) {
        let ct = String::from_utf8_lossy(ct.as_bytes()).to_string();
        if !ct.to_ascii_lowercase().contains("json") {
            return Err(ApiError::MediaType(ct));
        }
    }
    let claimed = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if claimed.is_some_and(|n| n > limit as u64) {
        return Err(ApiError::TooLarge { limit });
    }
    let body: Body = req.into_body();
    let read = tokio::time::timeout(cfg.body_timeout, axum::body::to_bytes(body, limit));
    let Ok(read) = read.await else {
        return Err(ApiError::Timeout(format!(
            "the request body did not arrive within {} s (--body-timeout): send all the bytes that Content-Length announces",
            cfg.body_timeout.as_secs_f64()
        )));
    };
    read.map_err(|e| {
        if e.into_inner().is::<http_body_util::LengthLimitError>() {
            ApiError::TooLarge { limit }
        } else {
            ApiError::bad("could not read the request body")
        }
    })
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

async fn chat(State(st): State<Arc<AppState>>, req: Request) -> Response {
    let run = async {
        let bytes = read_body(req, &st.cfg).await?;
        let (common, r) = validate::parse_body::<types::ChatRequest>(&bytes)?;
        let plan = validate::chat_plan(&common, r, st.engine.card(), &st.cfg.defaults)?;
        start(&st, plan, Kind::Chat).await
    };
    run.await.unwrap_or_else(IntoResponse::into_response)
}

async fn completions(State(st): State<Arc<AppState>>, req: Request) -> Response {
    let run = async {
        let bytes = read_body(req, &st.cfg).await?;
        let (common, r) = validate::parse_body::<types::CompletionRequest>(&bytes)?;
        let mut plans = validate::completion_plans(&common, r, st.engine.card(), &st.cfg.defaults)?;
        if plans.len() == 1 {
            start(&st, plans.remove(0), Kind::Completion).await
        } else {
            start_many(&st, plans).await
        }
    };
    run.await.unwrap_or_else(IntoResponse::into_response)
}

/// Submits a checked request (off the async runtime: rendering and tokenizing take time).
pub(crate) async fn submit(
    st: &AppState,
    gen_req: GenRequest,
) -> Result<(Generation, std::time::Instant), ApiError> {
    let engine = st.engine.clone();
    let t0 = std::time::Instant::now();
    let gen = tokio::task::spawn_blocking(move || engine.submit(gen_req))
        .await
        .map_err(|e| ApiError::Internal(format!("request task failed: {e}")))??;
    Ok((gen, t0))
}

/// The fixed parts of a response to `plan`.
pub(crate) fn meta(
    st: &AppState,
    plan: &validate::Plan,
    kind: Kind,
    t0: std::time::Instant,
) -> Meta {
    let n = st.next_id.fetch_add(1, Relaxed);
    let prefix = match kind {
        Kind::Chat => "chatcmpl",
        Kind::Completion => "cmpl",
    };
    let card = st.engine.card();
    Meta {
        id: format!("{prefix}-{:x}{n:06x}", unix_now()),
        created: unix_now(),
        model: card.id.clone(),
        kind,
        format: card.format,
        stops: plan.stops.clone(),
        include_usage: plan.include_usage,
        token_ids: plan.gen.token_ids,
        submitted: t0,
        totals: Some(st.totals.clone()),
        index: 0,
        done_marker: true,
    }
}

/// Submits a checked request and answers with JSON or SSE.
async fn start(st: &AppState, plan: validate::Plan, kind: Kind) -> Result<Response, ApiError> {
    let logprobs = plan.gen.logprobs.is_some();
    let (gen, t0) = submit(st, plan.gen.clone()).await?;
    let meta = meta(st, &plan, kind, t0);
    Ok(if plan.stream {
        respond::stream(meta, gen, logprobs)
    } else {
        respond::full(meta, gen, logprobs).await
    })
}

/// Several prompts in one `/v1/completions` request (llama-server): each is generated (together,
/// in the batch), and the answer has one choice per prompt, `index` in the request's order, and
/// the usage summed; streamed, the chunks of all of them come in one stream, each choice with
/// its prompt's `index` (and, with `include_usage`, one usage chunk per prompt).
async fn start_many(st: &AppState, plans: Vec<validate::Plan>) -> Result<Response, ApiError> {
    let mut gens = Vec::with_capacity(plans.len());
    for plan in &plans {
        gens.push(submit(st, plan.gen.clone()).await?);
    }
    if plans.iter().any(|p| p.stream) {
        let runs = plans
            .iter()
            .zip(gens)
            .enumerate()
            .map(|(i, (plan, (gen, t0)))| {
                let mut m = meta(st, plan, Kind::Completion, t0);
                m.index = i;
                (m, gen, plan.gen.logprobs.is_some())
            })
            .collect();
        return Ok(respond::stream_many(runs));
    }
    let runs = plans.iter().zip(gens).map(|(plan, (gen, t0))| {
        let meta = meta(st, plan, Kind::Completion, t0);
        respond::full_value(meta, gen, plan.gen.logprobs.is_some())
    });
    let results = futures_util::future::join_all(runs).await;
    let mut out: Option<serde_json::Value> = None;
    let (mut prompt, mut completion) = (0u64, 0u64);
    let mut choices = Vec::new();
    for (i, r) in results.into_iter().enumerate() {
        let mut v = r?;
        prompt += v["usage"]["prompt_tokens"].as_u64().unwrap_or(0);
        completion += v["usage"]["completion_tokens"].as_u64().unwrap_or(0);
        if let Some(serde_json::Value::Array(cs)) = v.get_mut("choices").map(std::mem::take) {
            for mut c in cs {
                c["index"] = i.into();
                choices.push(c);
            }
        }
        out.get_or_insert(v);
    }
    let mut v = out.unwrap_or_default();
    v["choices"] = choices.into();
    v["usage"]["prompt_tokens"] = prompt.into();
    v["usage"]["completion_tokens"] = completion.into();
    v["usage"]["total_tokens"] = (prompt + completion).into();
    Ok(Json(v).into_response())
}

fn model_object(card: &ModelCard) -> serde_json::Value {
    serde_json::json!({
        "id": card.id,
        "object": "model",
        "created": card.created,
        "owned_by": "pocketmoe",
        "meta": {"n_ctx": card.n_ctx, "n_vocab": card.n_vocab},
    })
}

async fn models(State(st): State<Arc<AppState>>) -> Json<serde_json::Value> {
    Json(serde_json::json!({
        "object": "list",
        "data": [model_object(st.engine.card())],
    }))
}

async fn model(State(st): State<Arc<AppState>>, Path(id): Path<String>) -> Response {
    let card = st.engine.card();
    if id == card.id || card.aliases.contains(&id) {
        Json(model_object(card)).into_response()
    } else {
        ApiError::UnknownModel {
            asked: id,
            served: card.id.clone(),
        }
        .into_response()
    }
}

async fn health(State(st): State<Arc<AppState>>) -> Response {
    let (status, body) = match st.engine.health() {
        Health::Ready => (StatusCode::OK, serde_json::json!({"status": "ok"})),
        Health::Loading { fraction } => (
            StatusCode::SERVICE_UNAVAILABLE,
            serde_json::json!({"status": "loading", "progress": fraction}),
        ),
        Health::Failed(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            serde_json::json!({"status": "error", "error": e}),
        ),
        Health::ShuttingDown => (
            StatusCode::SERVICE_UNAVAILABLE,
            serde_json::json!({"status": "shutting_down"}),
        ),
    };
    (status, Json(body)).into_response()
}

async fn metrics_text(State(st): State<Arc<AppState>>) -> Response {
    let stats = st.engine.stats();
    let mut text = st.http.render(
        st.engine.card(),
        &st.engine.health(),
        &stats,
        st.conns.as_deref(),
    );
    text.push_str(&st.totals.render(st.engine.card(), &stats));
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        text,
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_scheme_is_case_insensitive() {
        assert_eq!(bearer_token("Bearer k1"), Some("k1"));
        assert_eq!(bearer_token("bearer k1"), Some("k1"));
        assert_eq!(bearer_token("BEARER   k1 "), Some("k1"));
        assert_eq!(bearer_token("Basic k1"), None);
        assert_eq!(bearer_token("Bearerk1"), None);
    }
}
