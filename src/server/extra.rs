//! llama-server's utility endpoints: `POST /tokenize`, `POST /detokenize`,
//! `POST /apply-template`, `GET /props`, `GET /slots` (its field names). Bodies are JSON; errors
//! use OpenAI's shape like every other route, and the API key guards them all.
use super::{read_body, ApiError, AppState};
use crate::tokenizer::ChatMessage;
use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};
use std::sync::Arc;

#[derive(Deserialize)]
struct TokenizeBody {
    content: String,
    /// BOS/EOS as the model adds them (llama-server's default: no).
    #[serde(default)]
    add_special: bool,
    /// Control-token text becomes control tokens (llama-server's default: yes).
    #[serde(default = "yes")]
    parse_special: bool,
    /// `[{"id", "piece"}]` instead of ids.
    #[serde(default)]
    with_pieces: bool,
}

fn yes() -> bool {
    true
}

#[derive(Deserialize)]
struct DetokenizeBody {
    tokens: Vec<u32>,
}

#[derive(Deserialize)]
struct TemplateBody {
    messages: Vec<ChatMessage>,
    #[serde(default)]
    tools: Option<Value>,
    #[serde(default)]
    chat_template_kwargs: Option<serde_json::Map<String, Value>>,
}

async fn body<T: serde::de::DeserializeOwned>(st: &AppState, req: Request) -> Result<T, ApiError> {
    let bytes = read_body(req, &st.cfg).await?;
    serde_json::from_slice(&bytes).map_err(|e| ApiError::bad(format!("invalid body: {e}")))
}

/// A piece as text when it is UTF-8, else its bytes (as llama-server).
fn piece_value(bytes: Vec<u8>) -> Value {
    match String::from_utf8(bytes) {
        Ok(s) => Value::String(s),
        Err(e) => json!(e.into_bytes()),
    }
}

pub(super) async fn tokenize(State(st): State<Arc<AppState>>, req: Request) -> Response {
    let run = async {
        let b: TokenizeBody = body(&st, req).await?;
        let engine = st.engine.clone();
        let toks = tokio::task::spawn_blocking(move || {
            engine.tokenize(&b.content, b.add_special, b.parse_special)
        })
        .await
        .map_err(|e| ApiError::Internal(format!("tokenize task failed: {e}")))??;
        let tokens: Vec<Value> = if b.with_pieces {
            toks.into_iter()
                .map(|(id, p)| json!({"id": id, "piece": piece_value(p)}))
                .collect()
        } else {
            toks.into_iter().map(|(id, _)| json!(id)).collect()
        };
        Ok::<_, ApiError>(Json(json!({ "tokens": tokens })).into_response())
    };
    run.await.unwrap_or_else(IntoResponse::into_response)
}

pub(super) async fn detokenize(State(st): State<Arc<AppState>>, req: Request) -> Response {
    let run = async {
        let b: DetokenizeBody = body(&st, req).await?;
        let engine = st.engine.clone();
        let content = tokio::task::spawn_blocking(move || engine.detokenize(&b.tokens))
            .await
            .map_err(|e| ApiError::Internal(format!("detokenize task failed: {e}")))??;
        Ok::<_, ApiError>(Json(json!({ "content": content })).into_response())
    };
    run.await.unwrap_or_else(IntoResponse::into_response)
}

pub(super) async fn apply_template(State(st): State<Arc<AppState>>, req: Request) -> Response {
    let run = async {
        let b: TemplateBody = body(&st, req).await?;
        let mut vars = b.chat_template_kwargs.unwrap_or_default();
        if let Some(tools) = b.tools {
            vars.insert("tools".into(), tools);
        }
        let engine = st.engine.clone();
        let prompt = tokio::task::spawn_blocking(move || engine.apply_template(b.messages, vars))
            .await
            .map_err(|e| ApiError::Internal(format!("template task failed: {e}")))??;
        Ok::<_, ApiError>(Json(json!({ "prompt": prompt })).into_response())
    };
    run.await.unwrap_or_else(IntoResponse::into_response)
}

pub(super) async fn props(State(st): State<Arc<AppState>>) -> Json<Value> {
    let card = st.engine.card();
    let info = st.engine.info();
    let total_slots = st.engine.stats().parallel;
    Json(json!({
        "model_alias": card.id,
        "model_path": info.model_path,
        "aliases": card.aliases,
        "n_ctx": card.n_ctx,
        "n_vocab": card.n_vocab,
        "total_slots": total_slots,
        "parallel": total_slots,
        "chat_template": info.chat_template.unwrap_or_default(),
        "build_info": crate::version(),
        "version": env!("CARGO_PKG_VERSION"),
        "default_generation_settings": {"n_ctx": card.n_ctx, "model": card.id},
    }))
}

pub(super) async fn slots(State(st): State<Arc<AppState>>) -> Json<Value> {
    Json(json!(st.engine.slots()))
}
