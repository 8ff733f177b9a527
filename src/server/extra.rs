//! llama-server's utility endpoints: `POST /tokenize`, `POST /detokenize`,
//! `POST /apply-template`, `GET /props`, `GET /slots` (its field names). Bodies are JSON; errors
//! use OpenAI's shape like every other route, and the API key guards them all.
use super::{read_body, ApiError, AppState};
use crate::tokenizer::ChatMessage;
use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Map, Value};
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
    /// Open the assistant's turn at the end (llama-server's default: yes).
    #[serde(default = "yes")]
    add_generation_prompt: bool,
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
        let gen = b.add_generation_prompt;
        let prompt =
            tokio::task::spawn_blocking(move || engine.apply_template(b.messages, vars, gen))
                .await
                .map_err(|e| ApiError::Internal(format!("template task failed: {e}")))??;
        Ok::<_, ApiError>(Json(json!({ "prompt": prompt })).into_response())
    };
    run.await.unwrap_or_else(IntoResponse::into_response)
}

/// `default_generation_settings.params`: the sampling defaults requests get (llama-server's
/// names).
pub(super) fn default_params(st: &AppState) -> Value {
    let d = &st.cfg.defaults;
    let mut v = sampler_settings(&d.sampling);
    v.extend([
        (
            "n_predict".into(),
            json!(d.n_predict.map_or(-1, |n| n as i64)),
        ),
        ("seed".into(), json!(d.seed.map_or(-1, |s| s as i64))),
        ("n_probs".into(), json!(0)),
        ("stop".into(), json!([])),
        ("stream".into(), json!(false)),
        ("cache_prompt".into(), json!(true)),
        ("ignore_eos".into(), json!(d.ignore_eos)),
        (
            "samplers".into(),
            json!(["penalties", "top_k", "top_p", "min_p", "temperature"]),
        ),
    ]);
    Value::Object(v)
}

/// The sampler's parameters under llama-server's names (`/props` and `/completion`'s
/// `generation_settings` both report them).
pub(super) fn sampler_settings(p: &crate::engine::sampling::SamplerParams) -> Map<String, Value> {
    let v = json!({
        "temperature": p.temperature,
        "top_k": p.top_k,
        "top_p": p.top_p,
        "min_p": p.min_p,
        "repeat_penalty": p.repeat_penalty,
        "repeat_last_n": p.penalty_last_n,
        "presence_penalty": p.presence_penalty,
        "frequency_penalty": p.frequency_penalty,
    });
    match v {
        Value::Object(m) => m,
        _ => unreachable!("a JSON object literal"),
    }
}

pub(super) async fn props(State(st): State<Arc<AppState>>) -> Json<Value> {
    let card = st.engine.card();
    let info = st.engine.info();
    let total_slots = st.engine.stats().parallel;
    Json(json!({
        "model_alias": card.id,
        "model_path": info.model_path,
        "aliases": card.aliases,
        // As llama-server: the context of one slot (-c / -np).
        "n_ctx": card.n_ctx,
        "n_vocab": card.n_vocab,
        "total_slots": total_slots,
        "parallel": total_slots,
        "chat_template": info.chat_template.unwrap_or_default(),
        "build_info": crate::version(),
        "version": env!("CARGO_PKG_VERSION"),
        "endpoint_slots": st.cfg.slots,
        "endpoint_metrics": true,
        "default_generation_settings": {
            "id": 0,
            "n_ctx": card.n_ctx,
            "model": card.id,
            "is_processing": false,
            "params": default_params(&st),
        },
    }))
}

pub(super) async fn slots(State(st): State<Arc<AppState>>) -> Response {
    if !st.cfg.slots {
        // llama-server's answer with --no-slots.
        return (
            axum::http::StatusCode::NOT_IMPLEMENTED,
            Json(json!({"error": {
                "code": 501,
                "message": "This server does not support slots endpoint: restart it without --no-slots",
                "type": "not_supported_error",
            }})),
        )
            .into_response();
    }
    Json(json!(st.engine.stats().slots)).into_response()
}

/// llama-server's answer to a slot action without `--slot-save-path`.
pub const NO_SLOT_SAVE: &str =
    "This server does not support slots action. Start it with `--slot-save-path`";

#[derive(Deserialize)]
struct SlotFileBody {
    filename: Option<Value>,
}

/// `POST /slots/{id}?action=save|restore|erase` (llama-server's): save writes the slot's kept
/// prompt cache to `--slot-save-path`/`filename`, restore loads such a file into the slot, erase
/// forgets the slot's cache. Filenames are plain names in that directory
/// ([`super::slotfile::valid_filename`]); the action waits until the slot is idle.
pub(super) async fn slot_action(State(st): State<Arc<AppState>>, req: Request) -> Response {
    let run = async {
        let Some(dir) = st.cfg.slot_save_path.clone() else {
            return Err(ApiError::NotSupported(NO_SLOT_SAVE.into()));
        };
        let path = req.uri().path().to_string();
        let id = path
            .rsplit('/')
            .next()
            .and_then(|s| s.parse::<usize>().ok())
            .ok_or_else(|| ApiError::bad("Invalid slot ID"))?;
        let query = req.uri().query().unwrap_or("").to_string();
        let action = query
            .split('&')
            .find_map(|kv| kv.strip_prefix("action="))
            .unwrap_or("")
            .to_string();
        let file = |body: &[u8]| -> Result<(std::path::PathBuf, String), ApiError> {
            let b: SlotFileBody = serde_json::from_slice(body).map_err(|e| {
                ApiError::bad(format!("the body must be {{\"filename\": ...}}: {e}"))
            })?;
            let name = match b.filename {
                Some(Value::String(s)) => s,
                Some(_) => return Err(ApiError::invalid("filename", "filename must be a string")),
                None => return Err(ApiError::invalid("filename", "filename is required")),
            };
            if !super::slotfile::valid_filename(&name) {
                return Err(ApiError::invalid("filename", "Invalid filename"));
            }
            Ok((dir.join(&name), name))
        };
        let action = match action.as_str() {
            "save" | "restore" => {
                let body = read_body(req, &st.cfg).await?;
                let (path, filename) = file(&body)?;
                if action == "save" {
                    crate::server::api::SlotAction::Save { path, filename }
                } else {
                    crate::server::api::SlotAction::Restore { path, filename }
                }
            }
            "erase" => crate::server::api::SlotAction::Erase,
            _ => return Err(ApiError::invalid("action", "Invalid action")),
        };
        let engine = st.engine.clone();
        let v = tokio::task::spawn_blocking(move || engine.slot_action(id, action))
            .await
            .map_err(|e| ApiError::Internal(format!("slot task failed: {e}")))??;
        Ok::<_, ApiError>(Json(v).into_response())
    };
    run.await.unwrap_or_else(IntoResponse::into_response)
}
