//! llama-server's reranking (`--reranking`, or `--embedding --pooling rank`): `POST /rerank`,
//! `/reranking`, `/v1/rerank` and `/v1/reranking`.
//!
//! As llama-server: the body has a `query` (a string) and `documents` (a non-empty list of
//! strings), optionally `top_n` (default: all). Each document is scored on its own prompt:
//! the GGUF's `tokenizer.chat_template.rerank` with `{query}` and `{document}` replaced
//! (control tokens parsed), else `[BOS] query [EOS] [SEP] document [EOS]`, each marker only
//! where the vocabulary adds it (EOS falls back to SEP). The score is the first output of
//! the classification head on the last position's hidden state (`engine::embed::RankHead`).
//! The answer, Jina's shape: `{"model", "object": "list", "usage", "results": [{"index",
//! "relevance_score"}]}`, best first, cut to `top_n`. A body with `texts` instead of
//! `documents` is Hugging Face TEI's form and gets TEI's answer: a bare list of `{"index",
//! "score"}` (with `"text"` when `return_text` is true). Without reranking on: 501
//! `not_supported_error` with llama-server's message. Documents are read in waves of
//! `--parallel`, so a list longer than the queue is served rather than refused with 429.
use super::api::VocabInfo;
use super::embeddings::embed_one;
use super::{read_body, ApiError, AppState};
use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};
use std::sync::Arc;

/// llama-server's answer when reranking is off.
pub const NO_RERANK: &str = "This server does not support reranking. Start it with `--reranking`";

/// Documents in one request at most.
pub const MAX_DOCUMENTS: usize = 2048;

/// The prompt of one (query, document) pair (llama-server's `format_prompt_rerank`). `tok`
/// tokenizes without BOS/EOS; its flag says whether control-token texts are parsed.
pub fn prompt(
    v: &VocabInfo,
    query: &str,
    doc: &str,
    tok: &dyn Fn(&str, bool) -> Vec<u32>,
) -> Vec<u32> {
    if let Some(t) = &v.rerank_template {
        let text = t.replace("{query}", query).replace("{document}", doc);
        return tok(&text, true);
    }
    let s = &v.special;
    let eos = s.eos.or(s.sep);
    let mut out = Vec::new();
    if v.add_bos {
        out.extend(s.bos);
    }
    out.extend(tok(query, false));
    if v.add_eos {
        out.extend(eos);
    }
    if v.add_sep {
        out.extend(s.sep);
    }
    out.extend(tok(doc, false));
    if v.add_eos {
        out.extend(eos);
    }
    out
}

fn strings(v: &Value) -> Option<Vec<String>> {
    v.as_array()?
        .iter()
        .map(|d| d.as_str().map(str::to_string))
        .collect()
}

async fn handle(st: &AppState, req: Request) -> Result<Response, ApiError> {
    let Some(head) = st.engine.rank_head() else {
        return Err(ApiError::NotSupported(NO_RERANK.into()));
    };
    let bytes = read_body(req, &st.cfg).await?;
    let body: Value = serde_json::from_slice(&bytes)
        .map_err(|e| ApiError::bad(format!("the request body is not valid JSON: {e}")))?;
    if !body.is_object() {
        return Err(ApiError::bad("the body must be a JSON object"));
    }
    let tei = body.get("texts").is_some();
    let query = match body.get("query") {
        Some(Value::String(q)) => q.clone(),
        Some(_) => return Err(ApiError::invalid("query", "\"query\" must be a string")),
        None => return Err(ApiError::invalid("query", "\"query\" must be provided")),
    };
    let field = if body.get("documents").is_some() || !tei {
        "documents"
    } else {
        "texts"
    };
    let docs = body
        .get(field)
        .and_then(strings)
        .filter(|d| !d.is_empty())
        .ok_or_else(|| {
            ApiError::invalid(
                field,
                format!("\"{field}\" must be a non-empty string array"),
            )
        })?;
    if docs.len() > MAX_DOCUMENTS {
        return Err(ApiError::invalid(
            field,
            format!(
                "{} documents in one request: send at most {MAX_DOCUMENTS}",
                docs.len()
            ),
        ));
    }
    let top_n = match body.get("top_n") {
        None | Some(Value::Null) => docs.len(),
        Some(v) => v
            .as_u64()
            .map(|n| (n as usize).min(docs.len()))
            .ok_or_else(|| {
                ApiError::invalid("top_n", "\"top_n\" must be a non-negative integer")
            })?,
    };
    let return_text = match body.get("return_text") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => {
            return Err(ApiError::invalid(
                "return_text",
                "\"return_text\" must be a boolean",
            ))
        }
    };
    let vocab = st.engine.vocab().unwrap_or_default();
    let engine = st.engine.clone();
    let tok = move |s: &str, special: bool| -> Vec<u32> {
        engine
            .tokenize(s, false, special)
            .map(|v| v.into_iter().map(|(id, _)| id).collect())
            .unwrap_or_default()
    };
    let prompts: Vec<Vec<u32>> = docs
        .iter()
        .map(|d| prompt(&vocab, &query, d, &tok))
        .collect();
    // Documents go in waves of as many as there are slots, read together in one batch where
    // they fit: a long list would otherwise overflow the queue (429) where llama-server queues
    // every document.
    let wave = st.engine.stats().parallel.max(1);
    let mut results = Vec::with_capacity(prompts.len());
    for chunk in prompts.chunks(wave) {
        results.extend(
            futures_util::future::join_all(chunk.iter().map(|p| embed_one(st, p.clone()))).await,
        );
    }
    let mut scored = Vec::with_capacity(results.len());
    let mut n_tokens = 0;
    for (i, r) in results.into_iter().enumerate() {
        let (rows, n) = r?;
        n_tokens += n;
        let row = rows
            .first()
            .ok_or_else(|| ApiError::Internal("the engine returned no hidden state".into()))?;
        let score = head.scores(row).first().copied().unwrap_or(0.0);
        scored.push((i, score));
    }
    // Best first; equal scores keep the documents' order.
    scored.sort_by(|a, b| b.1.total_cmp(&a.1));
    scored.truncate(top_n);
    if tei {
        let out: Vec<Value> = scored
            .into_iter()
            .map(|(i, s)| {
                let mut e = json!({"index": i, "score": s});
                if return_text {
                    e["text"] = json!(docs[i]);
                }
                e
            })
            .collect();
        return Ok(Json(Value::Array(out)).into_response());
    }
    let results: Vec<Value> = scored
        .into_iter()
        .map(|(i, s)| json!({"index": i, "relevance_score": s}))
        .collect();
    Ok(Json(json!({
        "model": st.engine.card().id,
        "object": "list",
        "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens},
        "results": results,
    }))
    .into_response())
}

pub(super) async fn rerank(State(st): State<Arc<AppState>>, req: Request) -> Response {
    handle(&st, req)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokenizer::vocab::SpecialTokens;

    fn tok(s: &str, special: bool) -> Vec<u32> {
        let base = if special { 2000 } else { 1000 };
        s.bytes().map(|b| base + u32::from(b)).collect()
    }

    #[test]
    fn prompts_are_llama_servers() {
        let special = SpecialTokens {
            bos: Some(1),
            eos: Some(2),
            sep: Some(3),
            ..Default::default()
        };
        let mut v = VocabInfo {
            special,
            add_bos: true,
            ..Default::default()
        };
        assert_eq!(prompt(&v, "q", "d", &tok), vec![1, 1000 + 113, 1000 + 100]);
        v.add_eos = true;
        v.add_sep = true;
        assert_eq!(prompt(&v, "q", "d", &tok), vec![1, 1113, 2, 3, 1100, 2]);
        // EOS falls back to SEP.
        v.special.eos = None;
        assert_eq!(prompt(&v, "q", "d", &tok), vec![1, 1113, 3, 3, 1100, 3]);
        v.rerank_template = Some("<{query}|{document}>".into());
        assert_eq!(prompt(&v, "q", "d", &tok), tok("<q|d>", true));
    }
}
