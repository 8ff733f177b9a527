//! llama-server's embeddings (`--embedding`): `POST /v1/embeddings` in OpenAI's shape, and
//! `POST /embedding` and `/embeddings` in llama-server's native one. The vectors are the
//! engine's: the final normed hidden state of the prompt's positions, pooled as `--pooling`
//! says (`engine::embed`).
//!
//! As llama-server: the body's `input` (or `content`, which makes the answer native even on
//! `/v1/embeddings`) is a string, a list of token ids (strings mixed in are tokenized in place),
//! or a list of those (one embedding each); text is tokenized with the model's BOS/EOS and with
//! control tokens parsed. Pooled vectors are normalised by `embd_normalize` (2, L2, by default;
//! llama.cpp's `common_embd_normalize`), per-position ones (`--pooling none`) are not, and
//! `/v1/embeddings` refuses pooling `none` with llama-server's message.
//! `encoding_format: "base64"` gives each vector as the base64 of its little-endian f32 bytes
//! (what the `openai` Python client asks for by default). Without `--embedding`: 501
//! `not_supported_error`.
use super::api::{Event, NO_EMBEDDINGS};
use super::{read_body, ApiError, AppState};
use crate::engine::embed::{normalize, Pooling};
use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};
use std::sync::Arc;

/// Inputs in one request at most.
pub const MAX_INPUTS: usize = 2048;

/// A piece of a prompt: text to tokenize, or a token id.
#[derive(Debug, Clone, PartialEq)]
enum Piece {
    Text(String),
    Token(u32),
}

/// The prompts of `input` (llama-server's `tokenize_input_prompts`): a string; a list holding
/// at least one number is one prompt of mixed ids and strings; any other list is several
/// prompts, each a string or a mixed list.
fn prompts(input: &Value) -> Result<Vec<Vec<Piece>>, ApiError> {
    let bad = |m: String| ApiError::invalid("input", m);
    let one = |v: &Value| -> Result<Vec<Piece>, ApiError> {
        match v {
            Value::String(s) => Ok(vec![Piece::Text(s.clone())]),
            Value::Array(items) => items
                .iter()
                .map(|p| match p {
                    Value::String(s) => Ok(Piece::Text(s.clone())),
                    Value::Number(n) => n
                        .as_u64()
                        .and_then(|n| u32::try_from(n).ok())
                        .map(Piece::Token)
                        .ok_or_else(|| bad(format!("{n} is not a token id"))),
                    _ => Err(bad(
                        "a prompt is a string or a list of token ids and strings".into(),
                    )),
                })
                .collect(),
            _ => Err(bad(
                "input must be a string, a list of token ids, or a list of those".into(),
            )),
        }
    };
    let list = match input {
        Value::Array(items) if !items.iter().any(Value::is_number) => {
            items.iter().map(one).collect::<Result<Vec<_>, _>>()?
        }
        v => vec![one(v)?],
    };
    if list.is_empty() {
        return Err(bad("input is an empty list: send at least one input".into()));
    }
    if list.len() > MAX_INPUTS {
        return Err(bad(format!(
            "{} inputs in one request: send at most {MAX_INPUTS}",
            list.len()
        )));
    }
    Ok(list)
}

/// The ids of a prompt: strings tokenized with BOS/EOS added to the first piece only (when it
/// is text) and control tokens parsed, as llama-server.
fn tokens(st: &AppState, prompt: &[Piece]) -> Result<Vec<u32>, ApiError> {
    let mut out = Vec::new();
    for (k, p) in prompt.iter().enumerate() {
        match p {
            Piece::Token(id) => out.push(*id),
            Piece::Text(s) => out.extend(
                st.engine
                    .tokenize(s, k == 0, true)?
                    .into_iter()
                    .map(|(id, _)| id),
            ),
        }
    }
    Ok(out)
}

/// Little-endian f32 bytes in standard base64 (with padding).
fn base64_f32(v: &[f32]) -> String {
    const ABC: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for c in bytes.chunks(3) {
        let n = (u32::from(c[0]) << 16)
            | (u32::from(*c.get(1).unwrap_or(&0)) << 8)
            | u32::from(*c.get(2).unwrap_or(&0));
        for k in 0..4 {
            if k <= c.len() {
                out.push(ABC[(n >> (18 - 6 * k) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// One input's embedding: its vectors (one, or one per position) and its token count.
pub(super) async fn embed_one(
    st: &AppState,
    ids: Vec<u32>,
) -> Result<(Vec<Vec<f32>>, usize), ApiError> {
    let n = ids.len();
    let engine = st.engine.clone();
    let mut gen = tokio::task::spawn_blocking(move || engine.embed(ids))
        .await
        .map_err(|e| ApiError::Internal(format!("embedding task failed: {e}")))??;
    let mut out = None;
    loop {
        match gen.events.recv().await {
            Some(Event::Embedding(v)) => out = Some(v),
            Some(Event::Done { .. }) => break,
            Some(Event::Error(e)) => return Err(ApiError::Internal(e)),
            Some(_) => {}
            None => return Err(ApiError::Internal("the engine stopped".into())),
        }
    }
    let v = out.ok_or_else(|| ApiError::Internal("the engine returned no embedding".into()))?;
    Ok((v, n))
}

/// `POST /v1/embeddings` (`oai`) or `/embedding(s)`.
async fn handle(st: &AppState, req: Request, oai: bool) -> Result<Response, ApiError> {
    let Some(pooling) = st.engine.pooling() else {
        return Err(ApiError::NotSupported(NO_EMBEDDINGS.into()));
    };
    if pooling == Pooling::Rank {
        return Err(ApiError::bad(
            "this server ranks (--pooling rank): use /rerank, or restart it with --pooling none|mean|cls|last for embeddings",
        ));
    }
    if oai && pooling == Pooling::None {
        return Err(ApiError::bad(
            "Pooling type 'none' is not OAI compatible. Please use a different pooling type",
        ));
    }
    let bytes = read_body(req, &st.cfg).await?;
    let body: Value =
        serde_json::from_slice(&bytes).map_err(|e| ApiError::bad(format!("invalid body: {e}")))?;
    if !body.is_object() {
        return Err(ApiError::bad("the body must be a JSON object"));
    }
    let (input, oai) = match (body.get("input"), body.get("content")) {
        (Some(i), _) => (i, oai),
        // `content` is not OpenAI's: the answer is native.
        (None, Some(c)) => (c, false),
        (None, None) => return Err(ApiError::bad("\"input\" or \"content\" must be provided")),
    };
    let base64 = match body.get("encoding_format") {
        None | Some(Value::Null) => false,
        Some(Value::String(f)) if f == "float" => false,
        Some(Value::String(f)) if f == "base64" => true,
        Some(_) => {
            return Err(ApiError::invalid(
                "encoding_format",
                "The format to return the embeddings in. Can be either float or base64",
            ))
        }
    };
    let norm = match body.get("embd_normalize") {
        None | Some(Value::Null) => 2,
        Some(v) => v
            .as_i64()
            .and_then(|n| i32::try_from(n).ok())
            .filter(|n| (-1..=64).contains(n))
            .ok_or_else(|| {
                ApiError::invalid(
                    "embd_normalize",
                    "embd_normalize must be an integer in -1..=64 (-1 none, 0 max-abs, 2 euclidean, p: p-norm)",
                )
            })?,
    };
    let prompts = prompts(input)?;
    let mut ids = Vec::with_capacity(prompts.len());
    for p in &prompts {
        let t = tokens(st, p)?;
        if t.is_empty() {
            return Err(ApiError::invalid("input", "Input content cannot be empty"));
        }
        ids.push(t);
    }
    // All inputs queued at once: they are read together, in one batch where they fit.
    let results = futures_util::future::join_all(ids.into_iter().map(|t| embed_one(st, t))).await;
    let mut items = Vec::with_capacity(results.len());
    let mut n_tokens = 0;
    for r in results {
        let (mut v, n) = r?;
        n_tokens += n;
        if pooling != Pooling::None {
            v = v.iter().map(|x| normalize(x, norm)).collect();
        }
        items.push(v);
    }
    if !oai {
        let out: Vec<Value> = items
            .into_iter()
            .enumerate()
            .map(|(i, v)| json!({"index": i, "embedding": v}))
            .collect();
        return Ok(Json(Value::Array(out)).into_response());
    }
    let data: Vec<Value> = items
        .into_iter()
        .enumerate()
        .map(|(i, mut v)| {
            let v = v.pop().unwrap_or_default();
            if base64 {
                json!({"embedding": base64_f32(&v), "index": i, "object": "embedding", "encoding_format": "base64"})
            } else {
                json!({"embedding": v, "index": i, "object": "embedding"})
            }
        })
        .collect();
    Ok(Json(json!({
        "model": st.engine.card().id,
        "object": "list",
        "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens},
        "data": data,
    }))
    .into_response())
}

pub(super) async fn openai(State(st): State<Arc<AppState>>, req: Request) -> Response {
    handle(&st, req, true)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

pub(super) async fn native(State(st): State<Arc<AppState>>, req: Request) -> Response {
    handle(&st, req, false)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inputs_split_as_llama_server() {
        let t = |s: &str| Piece::Text(s.into());
        let p = |v: Value| prompts(&v).unwrap();
        assert_eq!(p(json!("a")), vec![vec![t("a")]]);
        assert_eq!(p(json!(["a", "b"])), vec![vec![t("a")], vec![t("b")]]);
        assert_eq!(
            p(json!([1, "a", 2])),
            vec![vec![Piece::Token(1), t("a"), Piece::Token(2)]]
        );
        assert_eq!(
            p(json!([[1, 2], "b"])),
            vec![vec![Piece::Token(1), Piece::Token(2)], vec![t("b")]]
        );
        assert!(prompts(&json!([])).is_err());
        assert!(prompts(&json!([-1])).is_err());
        assert!(prompts(&json!({"a": 1})).is_err());
        assert!(prompts(&json!([[{"a": 1}]])).is_err());
    }

    #[test]
    fn base64_is_the_little_endian_bytes() {
        // 1.0f32 = 00 00 80 3f; 1.0, 2.0 = 00 00 80 3f 00 00 00 40.
        assert_eq!(base64_f32(&[1.0]), "AACAPw==");
        assert_eq!(base64_f32(&[1.0, 2.0]), "AACAPwAAAEA=");
        assert_eq!(base64_f32(&[]), "");
    }
}
