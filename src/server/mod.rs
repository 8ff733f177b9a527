//! The OpenAI-compatible HTTP server (axum + tokio) in front of an [`Engine`].
//!
//! Routes: `POST /v1/chat/completions`, `POST /v1/completions` (JSON or SSE with
//! `stream: true`), `GET /v1/models[/{id}]`, `GET /health` (503 while loading), `GET /metrics`
//! (Prometheus). Parts: `api` (the engine boundary), `error` (the one mapping to HTTP), `types`
//! (wire types), `validate` (body -> request, 4xx on anything off), `respond` (JSON / SSE),
//! `parse` (stop strings, reasoning, tool calls), `worker` + `local` (the real engine: one
//! thread, continuous batching), `metrics`.
//!
//! Invariants: every request is answered — a body that is too large, not JSON, nested too
//! deep, of the wrong types or asking for the impossible gets a 4xx in OpenAI's error shape; the
//! API key (when set) guards everything but `/health`; shutdown stops accepting, lets running
//! requests finish within the grace period, then ends them.
pub mod api;
pub mod error;
mod local;
pub mod metrics;
pub mod parse;
mod respond;
pub mod types;
pub mod validate;
pub mod worker;

pub use api::{
    Engine, EngineStats, Event, FinishReason, GenRequest, Generation, Health, ModelCard,
};
pub use api::{OutputFormat, Prompt, TokenLogprob};
pub use error::ApiError;
pub use local::{LocalEngine, LocalOptions};

use axum::body::Body;
use axum::extract::{Path, Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use respond::{Kind, Meta};
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Required as `Authorization: Bearer <key>` when set.
    pub api_key: Option<String>,
    /// Largest request body accepted (bytes).
    pub max_body: usize,
    /// How long running requests may go on after a shutdown signal.
    pub shutdown_grace: Duration,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            api_key: None,
            max_body: 8 << 20,
            shutdown_grace: Duration::from_secs(10),
        }
    }
}

struct AppState {
    engine: Arc<dyn Engine>,
    cfg: ServerConfig,
    http: metrics::HttpMetrics,
    next_id: AtomicU64,
}

/// The application: routes, API key check, request counting.
pub fn router(engine: Arc<dyn Engine>, cfg: ServerConfig) -> Router {
    let st = Arc::new(AppState {
        engine,
        cfg,
        http: metrics::HttpMetrics::default(),
        next_id: AtomicU64::new(1),
    });
    Router::new()
        .route("/v1/chat/completions", post(chat))
        .route("/v1/completions", post(completions))
        .route("/v1/models", get(models))
        .route("/v1/models/{id}", get(model))
        .route("/health", get(health))
        .route("/metrics", get(metrics_text))
        .fallback(no_route)
        .method_not_allowed_fallback(not_allowed)
        .layer(middleware::from_fn_with_state(st.clone(), auth))
        .layer(middleware::from_fn_with_state(st.clone(), count))
        .with_state(st)
}

/// Serves `engine` on `listener` until `shutdown` resolves; then stops accepting, gives running
/// requests the grace period, and returns once every connection is closed.
pub async fn serve(
    listener: tokio::net::TcpListener,
    engine: Arc<dyn Engine>,
    cfg: ServerConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let grace = cfg.shutdown_grace;
    let app = router(engine.clone(), cfg);
    axum::serve(listener, app)
        .with_graceful_shutdown(async move {
            shutdown.await;
            tracing::info!("shutting down: no new requests; running ones get {grace:?}");
            engine.shutdown(grace);
        })
        .await
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

async fn auth(State(st): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    if let Some(key) = &st.cfg.api_key {
        if req.uri().path() != "/health" {
            let given = req
                .headers()
                .get(header::AUTHORIZATION)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.strip_prefix("Bearer "))
                .map(str::trim);
            if !given.is_some_and(|g| same_key(g.as_bytes(), key.as_bytes())) {
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

/// The body, within the size limit, if it claims to be JSON (or claims nothing).
async fn read_body(req: Request, limit: usize) -> Result<axum::body::Bytes, ApiError> {
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
    axum::body::to_bytes(body, limit).await.map_err(|e| {
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
        let bytes = read_body(req, st.cfg.max_body).await?;
        let (common, r) = validate::parse_body::<types::ChatRequest>(&bytes)?;
        let plan = validate::chat_plan(&common, r, st.engine.card())?;
        start(&st, plan, Kind::Chat).await
    };
    run.await.unwrap_or_else(IntoResponse::into_response)
}

async fn completions(State(st): State<Arc<AppState>>, req: Request) -> Response {
    let run = async {
        let bytes = read_body(req, st.cfg.max_body).await?;
        let (common, r) = validate::parse_body::<types::CompletionRequest>(&bytes)?;
        let plan = validate::completion_plan(&common, r, st.engine.card())?;
        start(&st, plan, Kind::Completion).await
    };
    run.await.unwrap_or_else(IntoResponse::into_response)
}

/// Submits a checked request (off the async runtime: rendering and tokenizing take time) and
/// answers with JSON or SSE.
async fn start(st: &AppState, plan: validate::Plan, kind: Kind) -> Result<Response, ApiError> {
    let engine = st.engine.clone();
    let logprobs = plan.gen.logprobs.is_some();
    let gen_req = plan.gen;
    let gen = tokio::task::spawn_blocking(move || engine.submit(gen_req))
        .await
        .map_err(|e| ApiError::Internal(format!("request task failed: {e}")))??;
    let card = st.engine.card();
    let n = st.next_id.fetch_add(1, Relaxed);
    let prefix = match kind {
        Kind::Chat => "chatcmpl",
        Kind::Completion => "cmpl",
    };
    let meta = Meta {
        id: format!("{prefix}-{:x}{n:06x}", unix_now()),
        created: unix_now(),
        model: card.id.clone(),
        kind,
        format: card.format,
        stops: plan.stops,
        include_usage: plan.include_usage,
    };
    Ok(if plan.stream {
        respond::stream(meta, gen, logprobs)
    } else {
        respond::full(meta, gen, logprobs).await
    })
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
    let text = st
        .http
        .render(st.engine.card(), &st.engine.health(), &st.engine.stats());
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        text,
    )
        .into_response()
}
