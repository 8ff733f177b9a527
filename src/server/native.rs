//! llama.cpp's native completion endpoint, `POST /completion` (also `/completions`, as
//! llama-server routes it): `prompt` as a string, token ids, or a list of either (one result
//! each, answered as a JSON array); `n_predict` (-1: until the context is full, the default
//! unless the server's `-n`), `n_probs`, `stop`, `stream`, the sampling fields, `cache_prompt`
//! (reuse the prefix a slot kept; default true), `id_slot` and `return_tokens`. The answer has llama-server's fields: `content`, `tokens`, `stop`,
//! `stop_type` (`eos`, `limit`, `word`), `stopping_word`, `tokens_predicted`,
//! `tokens_evaluated`, `tokens_cached`, `truncated`, `has_new_line`, `timings`,
//! `generation_settings`, and with `n_probs` `completion_probabilities`. A stream sends one
//! `data:` object per piece of text (`stop: false`), then the whole final object (`stop: true`,
//! empty `content`); there is no `[DONE]`, as llama-server.
use super::api::{FinishReason, TokenLogprob};
use super::error::ApiError;
use super::parse::Piece;
use super::respond::{Kind, State};
use super::types::{Common, PromptInput};
use super::validate::{self, Defaults, Plan};
use super::{read_body, AppState};
use axum::extract::{Request, State as AxState};
use axum::response::sse::{Event as Sse, KeepAlive};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};
use std::sync::Arc;

#[derive(Debug, Deserialize)]
pub struct NativeRequest {
    pub prompt: PromptInput,
    /// Top alternatives reported per generated token (0 = none).
    pub n_probs: Option<u64>,
    /// Add the generated tokens' ids (`tokens`).
    pub return_tokens: Option<bool>,
}

/// One plan per prompt of a native body.
pub fn plans(
    c: &Common,
    r: NativeRequest,
    card: &super::ModelCard,
    defaults: &Defaults,
) -> Result<Vec<Plan>, ApiError> {
    let n_probs = r.n_probs.unwrap_or(0);
    if n_probs > 20 {
        return Err(ApiError::invalid(
            "n_probs",
            format!("n_probs = {n_probs}: use 0..=20"),
        ));
    }
    let ids = r.return_tokens.unwrap_or(false) || n_probs > 0;
    validate::prompts(r.prompt, card)?
        .into_iter()
        .map(|p| {
            let mut plan = validate::plan_for(
                c,
                card,
                p,
                (n_probs > 0).then_some(n_probs as usize),
                defaults,
            )?;
            plan.gen.token_ids |= ids;
            Ok(plan)
        })
        .collect()
}

pub(super) async fn completion(AxState(st): AxState<Arc<AppState>>, req: Request) -> Response {
    let run = async {
        let bytes = read_body(req, &st.cfg).await?;
        let (common, r) = validate::parse_body::<NativeRequest>(&bytes)?;
        let return_tokens = r.return_tokens.unwrap_or(false);
        let prompt_texts: Vec<Option<String>> = match &r.prompt {
            PromptInput::Text(s) => vec![Some(s.clone())],
            PromptInput::Texts(v) => v.iter().cloned().map(Some).collect(),
            PromptInput::Tokens(_) => vec![None],
            PromptInput::TokenLists(v) => vec![None; v.len()],
        };
        let plans = plans(&common, r, st.engine.card(), &st.cfg.defaults)?;
        answer(&st, plans, prompt_texts, return_tokens).await
    };
    run.await.unwrap_or_else(IntoResponse::into_response)
}

/// Runs `plans` (one per prompt; `prompt_texts` the text each answer echoes as `prompt`) and
/// answers in llama-server's native shape: an object, a JSON array for several prompts, or a
/// stream. Shared by `/completion` and `/infill`.
pub(super) async fn answer(
    st: &AppState,
    plans: Vec<Plan>,
    prompt_texts: Vec<Option<String>>,
    return_tokens: bool,
) -> Result<Response, ApiError> {
    {
        if plans.len() > 1 && plans.iter().any(|p| p.stream) {
            return Err(ApiError::invalid(
                "prompt",
                "stream: true takes one prompt per request here; send the prompts separately, or without stream",
            ));
        }
        let mut states = Vec::new();
        for (i, plan) in plans.iter().enumerate() {
            let (gen, t0) = super::submit(st, plan.gen.clone()).await?;
            let meta = super::meta(st, plan, Kind::Completion, t0);
            states.push(Native {
                st: State::new(meta, gen),
                index: i,
                return_tokens,
                n_probs: plan.gen.logprobs.is_some(),
                settings: settings(plan),
                prompt: prompt_texts.get(i).cloned().flatten(),
                content: String::new(),
                all_ids: Vec::new(),
            });
        }
        if plans[0].stream {
            let n = states.remove(0);
            return Ok(stream(n));
        }
        let runs = states.into_iter().map(|mut n| async move {
            while n.st.finish.is_none() {
                let pieces = n.st.next().await?;
                n.take(pieces);
            }
            Ok::<_, ApiError>(n.last(true))
        });
        let mut out = Vec::new();
        for r in futures_util::future::join_all(runs).await {
            out.push(r?);
        }
        Ok(if out.len() == 1 {
            Json(out.remove(0)).into_response()
        } else {
            Json(Value::Array(out)).into_response()
        })
    }
}

/// `generation_settings`: the request's sampling parameters, llama-server's names.
fn settings(plan: &Plan) -> Value {
    let p = &plan.gen.sampling;
    let mut v = super::extra::sampler_settings(p);
    v.extend([
        (
            "n_predict".into(),
            json!(plan.gen.max_tokens.map_or(-1, |n| n as i64)),
        ),
        ("seed".into(), json!(p.seed)),
        ("n_probs".into(), json!(plan.gen.logprobs.unwrap_or(0))),
        ("stop".into(), json!(plan.stops)),
        ("stream".into(), json!(plan.stream)),
        ("cache_prompt".into(), json!(plan.gen.cache_prompt)),
        ("ignore_eos".into(), json!(plan.gen.ignore_eos)),
    ]);
    Value::Object(v)
}

struct Native {
    st: State,
    index: usize,
    return_tokens: bool,
    n_probs: bool,
    settings: Value,
    prompt: Option<String>,
    content: String,
    all_ids: Vec<u32>,
}

fn probs(lps: &[TokenLogprob], ids: &[u32]) -> Value {
    Value::Array(
        lps.iter()
            .enumerate()
            .map(|(i, lp)| {
                json!({
                    "id": ids.get(i),
                    "token": String::from_utf8_lossy(&lp.bytes),
                    "bytes": lp.bytes,
                    "logprob": lp.logprob,
                    "top_logprobs": lp.top.iter().map(|(b, l)| json!({
                        "token": String::from_utf8_lossy(b),
                        "bytes": b,
                        "logprob": l,
                    })).collect::<Vec<_>>(),
                })
            })
            .collect(),
    )
}

impl Native {
    /// Text of `pieces` (all content: the plain parser).
    fn take(&mut self, pieces: Vec<Piece>) -> String {
        let mut s = String::new();
        for p in pieces {
            if let Piece::Content(t) | Piece::Reasoning(t) = p {
                s.push_str(&t);
            }
        }
        self.content.push_str(&s);
        s
    }

    /// A stream chunk with `text` and the ids and probabilities that arrived with it.
    fn chunk(&mut self, text: String) -> Value {
        let ids = std::mem::take(&mut self.st.ids);
        let lps = std::mem::take(&mut self.st.logprobs);
        let mut v = json!({
            "index": self.index,
            "content": text,
            "tokens": if self.return_tokens { ids.clone() } else { Vec::new() },
            "stop": false,
            "id_slot": self.st.slot.map_or(-1, |s| s as i64),
            "tokens_predicted": self.st.n_tokens,
            "tokens_evaluated": self.st.prompt_tokens,
        });
        if self.n_probs {
            v["completion_probabilities"] = probs(&lps, &ids);
        }
        self.all_ids.extend(ids);
        v
    }

    /// The final object: the whole content (`whole`) or, ending a stream, an empty one.
    fn last(&mut self, whole: bool) -> Value {
        let ids = std::mem::take(&mut self.st.ids);
        let lps = std::mem::take(&mut self.st.logprobs);
        let (stop_type, word) = match (&self.st.stop.hit, self.st.finish) {
            (Some(w), _) => ("word", w.clone()),
            (None, Some(FinishReason::Length)) => ("limit", String::new()),
            (None, Some(FinishReason::Stop)) => ("eos", String::new()),
            (None, None) => ("none", String::new()),
        };
        let all: Vec<u32> = if whole {
            self.all_ids.iter().chain(&ids).copied().collect()
        } else {
            ids.clone()
        };
        let content = if whole {
            self.content.clone()
        } else {
            String::new()
        };
        let mut v = json!({
            "index": self.index,
            "content": content,
            "tokens": if self.return_tokens { all.clone() } else { Vec::new() },
            "id_slot": self.st.slot.map_or(-1, |s| s as i64),
            "stop": true,
            "model": self.st.meta.model,
            "tokens_predicted": self.st.n_tokens,
            "tokens_evaluated": self.st.prompt_tokens,
            "generation_settings": self.settings,
            "prompt": self.prompt,
            "has_new_line": self.content.contains('\n'),
            "truncated": false,
            "stop_type": stop_type,
            "stopping_word": word,
            "tokens_cached": self.st.prompt_tokens + self.st.n_tokens,
            "timings": self.st.timings(),
        });
        if self.n_probs {
            v["completion_probabilities"] = probs(&lps, &all);
        }
        v
    }
}

fn data(v: &Value) -> Sse {
    Sse::default().data(v.to_string())
}

fn stream(n: Native) -> Response {
    let s = futures_util::stream::unfold(Some(n), |n| async move {
        let mut n = n?;
        loop {
            if n.st.finish.is_some() {
                let last = n.last(false);
                return Some((Ok::<_, std::convert::Infallible>(data(&last)), None));
            }
            match n.st.next().await {
                Ok(pieces) => {
                    let text = n.take(pieces);
                    if !text.is_empty() {
                        let c = n.chunk(text);
                        return Some((Ok(data(&c)), Some(n)));
                    }
                }
                Err(e) => {
                    return Some((
                        Ok(data(&serde_json::to_value(e.body()).unwrap_or_default())),
                        None,
                    ))
                }
            }
        }
    });
    axum::response::sse::Sse::new(s)
        .keep_alive(KeepAlive::default())
        .into_response()
}
