//! Anthropic's Messages API, as llama-server serves it: `POST /v1/messages` (JSON, or SSE with
//! `stream: true` in Anthropic's event sequence) and `POST /v1/messages/count_tokens`. The body
//! is turned into a chat request (`system` first, text blocks joined, `tool_use` blocks as the
//! assistant's tool calls, `tool_result` blocks as tool messages, `tools` as functions) and goes
//! through the same checks, template and output parser as `/v1/chat/completions`; the answer
//! has `content` blocks (`thinking`, `text`, `tool_use`), `stop_reason` (`end_turn`,
//! `max_tokens`, `stop_sequence`, `tool_use`) and `usage` (`input_tokens`, `output_tokens`).
use super::api::FinishReason;
use super::error::ApiError;
use super::parse::Piece;
use super::respond::{Kind, State};
use super::types::ChatRequest;
use super::validate;
use super::{read_body, AppState};
use axum::extract::{Request, State as AxState};
use axum::response::sse::{Event as Sse, KeepAlive};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Map, Value};
use std::sync::Arc;

/// The text of a `system` or `content` value: a string, or the `text` of its text blocks.
fn text_of(v: &Value, field: &str) -> Result<String, ApiError> {
    match v {
        Value::String(s) => Ok(s.clone()),
        Value::Array(blocks) => {
            let mut out = Vec::new();
            for (i, b) in blocks.iter().enumerate() {
                match (b.get("type").and_then(Value::as_str), b.get("text")) {
                    (Some("text"), Some(Value::String(t))) => out.push(t.clone()),
                    _ => {
                        return Err(ApiError::invalid(
                            &format!("{field}[{i}]"),
                            format!(
                            "{field}[{i}]: send {{\"type\": \"text\", \"text\": \"...\"}} blocks"
                        ),
                        ))
                    }
                }
            }
            Ok(out.join("\n"))
        }
        Value::Null => Ok(String::new()),
        _ => Err(ApiError::invalid(
            field,
            format!("{field}: send a string or a list of text blocks"),
        )),
    }
}

/// The Anthropic body as an OpenAI chat body.
fn to_chat(body: &Value) -> Result<Value, ApiError> {
    let obj = body
        .as_object()
        .ok_or_else(|| ApiError::bad("the request body must be a JSON object"))?;
    let mut messages = Vec::new();
    if let Some(sys) = obj.get("system") {
        let t = text_of(sys, "system")?;
        if !t.is_empty() {
            messages.push(json!({"role": "system", "content": t}));
        }
    }
    let list = obj
        .get("messages")
        .and_then(Value::as_array)
        .ok_or_else(|| {
            ApiError::invalid(
                "messages",
                "messages: send a list of {\"role\", \"content\"}",
            )
        })?;
    for (i, m) in list.iter().enumerate() {
        let role = m.get("role").and_then(Value::as_str).unwrap_or("");
        if role != "user" && role != "assistant" {
            return Err(ApiError::invalid(
                &format!("messages[{i}].role"),
                format!(
                    "messages[{i}].role = {:?}: use user or assistant",
                    m.get("role")
                ),
            ));
        }
        let field = format!("messages[{i}].content");
        match m.get("content") {
            Some(Value::Array(blocks)) => {
                let (mut text, mut calls) = (Vec::new(), Vec::new());
                for (j, b) in blocks.iter().enumerate() {
                    match b.get("type").and_then(Value::as_str) {
                        Some("text") => text.push(text_of(&json!([b]), &field)?),
                        Some("thinking" | "redacted_thinking") => {}
                        Some("tool_use") if role == "assistant" => calls.push(json!({
                            "id": b.get("id").cloned().unwrap_or(Value::Null),
                            "type": "function",
                            "function": {
                                "name": b.get("name").cloned().unwrap_or(Value::Null),
                                "arguments": b.get("input").cloned().unwrap_or(json!({})).to_string(),
                            },
                        })),
                        Some("tool_result") if role == "user" => {
                            let content = b.get("content").map_or(Ok(String::new()), |c| {
                                text_of(c, &format!("{field}[{j}].content"))
                            })?;
                            messages.push(json!({
                                "role": "tool",
                                "tool_call_id": b.get("tool_use_id").cloned().unwrap_or(Value::Null),
                                "content": content,
                            }));
                        }
                        t => {
                            return Err(ApiError::invalid(
                                &format!("{field}[{j}]"),
                                format!("{field}[{j}]: block type {t:?} is not supported here (text, tool_use, tool_result)"),
                            ))
                        }
                    }
                }
                if !text.is_empty() || !calls.is_empty() {
                    let mut msg = json!({"role": role, "content": text.join("\n")});
                    if !calls.is_empty() {
                        msg["tool_calls"] = Value::Array(calls);
                    }
                    messages.push(msg);
                }
            }
            Some(c) => messages.push(json!({"role": role, "content": text_of(c, &field)?})),
            None => return Err(ApiError::invalid(&field, format!("{field} is missing"))),
        }
    }
    let mut chat = Map::new();
    chat.insert("messages".into(), Value::Array(messages));
    for (from, to) in [
        ("max_tokens", "max_tokens"),
        ("temperature", "temperature"),
        ("top_p", "top_p"),
        ("top_k", "top_k"),
        ("stop_sequences", "stop"),
        ("stream", "stream"),
        ("model", "model"),
    ] {
        if let Some(v) = obj.get(from) {
            chat.insert(to.into(), v.clone());
        }
    }
    if let Some(tools) = obj.get("tools").and_then(Value::as_array) {
        let tools: Vec<Value> = tools
            .iter()
            .map(|t| {
                json!({"type": "function", "function": {
                    "name": t.get("name").cloned().unwrap_or(Value::Null),
                    "description": t.get("description").cloned().unwrap_or(json!("")),
                    "parameters": t.get("input_schema").cloned().unwrap_or(json!({})),
                }})
            })
            .collect();
        chat.insert("tools".into(), Value::Array(tools));
    }
    match obj
        .get("tool_choice")
        .and_then(|c| c.get("type"))
        .and_then(Value::as_str)
    {
        None | Some("auto") => {}
        Some("none") => {
            chat.insert("tool_choice".into(), json!("none"));
        }
        Some(t) => {
            return Err(ApiError::invalid(
                "tool_choice",
                format!("tool_choice {t:?}: only auto and none are supported here"),
            ))
        }
    }
    Ok(Value::Object(chat))
}

fn plan(st: &AppState, bytes: &[u8]) -> Result<validate::Plan, ApiError> {
    let body: Value = serde_json::from_slice(bytes)
        .map_err(|e| ApiError::bad(format!("the request body is not valid JSON: {e}")))?;
    let chat = to_chat(&body)?.to_string();
    let (common, r) = validate::parse_body::<ChatRequest>(chat.as_bytes())?;
    validate::chat_plan(&common, r, st.engine.card(), &st.cfg.defaults)
}

pub(super) async fn count_tokens(AxState(st): AxState<Arc<AppState>>, req: Request) -> Response {
    let run = async {
        let bytes = read_body(req, &st.cfg).await?;
        let plan = plan(&st, &bytes)?;
        let super::Prompt::Chat {
            messages,
            template_vars,
        } = plan.gen.prompt
        else {
            return Err(ApiError::Internal("not a chat prompt".into()));
        };
        let engine = st.engine.clone();
        let n = tokio::task::spawn_blocking(move || {
            let text = engine.apply_template(messages, template_vars, true)?;
            engine.tokenize(&text, true, true).map(|t| t.len())
        })
        .await
        .map_err(|e| ApiError::Internal(format!("count task failed: {e}")))??;
        Ok::<_, ApiError>(Json(json!({ "input_tokens": n })).into_response())
    };
    run.await.unwrap_or_else(IntoResponse::into_response)
}

pub(super) async fn messages(AxState(st): AxState<Arc<AppState>>, req: Request) -> Response {
    let run = async {
        let bytes = read_body(req, &st.cfg).await?;
        let plan = plan(&st, &bytes)?;
        let (gen, t0) = super::submit(&st, plan.gen.clone()).await?;
        let mut meta = super::meta(&st, &plan, Kind::Chat, t0);
        meta.id = format!("msg_{}", meta.id.trim_start_matches("chatcmpl-"));
        let state = State::new(meta, gen);
        if plan.stream {
            Ok(stream(state))
        } else {
            full(state).await
        }
    };
    run.await.unwrap_or_else(IntoResponse::into_response)
}

fn stop_reason(st: &State, calls: bool) -> (&'static str, Value) {
    match (&st.stop.hit, st.finish) {
        _ if calls => ("tool_use", Value::Null),
        (Some(w), _) => ("stop_sequence", json!(w)),
        (None, Some(FinishReason::Length)) => ("max_tokens", Value::Null),
        _ => ("end_turn", Value::Null),
    }
}

fn tool_input(arguments: &str) -> Value {
    serde_json::from_str(arguments).unwrap_or_else(|_| json!({ "arguments": arguments }))
}

async fn full(mut st: State) -> Result<Response, ApiError> {
    let (mut text, mut thinking, mut blocks) = (String::new(), String::new(), Vec::new());
    while st.finish.is_none() {
        for p in st.next().await? {
            match p {
                Piece::Content(s) => text.push_str(&s),
                Piece::Reasoning(s) => thinking.push_str(&s),
                Piece::ToolCall { name, arguments } => {
                    let (_, id) = st.new_call_id();
                    blocks.push(json!({"type": "tool_use", "id": id, "name": name, "input": tool_input(&arguments)}));
                }
            }
        }
    }
    let (reason, seq) = stop_reason(&st, !blocks.is_empty());
    let mut content = Vec::new();
    if !thinking.is_empty() {
        content.push(json!({"type": "thinking", "thinking": thinking, "signature": ""}));
    }
    if !text.is_empty() || blocks.is_empty() {
        content.push(json!({"type": "text", "text": text}));
    }
    content.extend(blocks);
    Ok(Json(json!({
        "id": st.meta.id,
        "type": "message",
        "role": "assistant",
        "model": st.meta.model,
        "content": content,
        "stop_reason": reason,
        "stop_sequence": seq,
        // As llama-server (and Anthropic's meaning): input_tokens are the prompt tokens
        // evaluated, cache reads the ones reused from the slot's prompt cache.
        "usage": {
            "input_tokens": st.prompt_tokens - st.cached_tokens,
            "output_tokens": st.n_tokens,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": st.cached_tokens,
        },
    }))
    .into_response())
}

fn event(name: &str, v: Value) -> Sse {
    Sse::default().event(name).data(v.to_string())
}

/// The stream's state: the open content block (its kind and index).
struct Streamer {
    st: State,
    open: Option<&'static str>,
    index: usize,
    calls: bool,
    queue: std::collections::VecDeque<Sse>,
    done: bool,
}

impl Streamer {
    fn close_block(&mut self) {
        if self.open.take().is_some() {
            self.queue.push_back(event(
                "content_block_stop",
                json!({"type": "content_block_stop", "index": self.index}),
            ));
            self.index += 1;
        }
    }

    fn block(&mut self, kind: &'static str, start: Value) {
        if self.open != Some(kind) || kind == "tool_use" {
            self.close_block();
            self.queue.push_back(event(
                "content_block_start",
                json!({"type": "content_block_start", "index": self.index, "content_block": start}),
            ));
            self.open = Some(kind);
        }
    }

    fn delta(&mut self, delta: Value) {
        self.queue.push_back(event(
            "content_block_delta",
            json!({"type": "content_block_delta", "index": self.index, "delta": delta}),
        ));
    }

    fn pieces(&mut self, pieces: Vec<Piece>) {
        for p in pieces {
            match p {
                Piece::Content(s) => {
                    self.block("text", json!({"type": "text", "text": ""}));
                    self.delta(json!({"type": "text_delta", "text": s}));
                }
                Piece::Reasoning(s) => {
                    self.block("thinking", json!({"type": "thinking", "thinking": ""}));
                    self.delta(json!({"type": "thinking_delta", "thinking": s}));
                }
                Piece::ToolCall { name, arguments } => {
                    self.calls = true;
                    let (_, id) = self.st.new_call_id();
                    self.block(
                        "tool_use",
                        json!({"type": "tool_use", "id": id, "name": name, "input": {}}),
                    );
                    self.delta(json!({"type": "input_json_delta", "partial_json": arguments}));
                }
            }
        }
    }

    fn end(&mut self) {
        self.close_block();
        let (reason, seq) = stop_reason(&self.st, self.calls);
        self.queue.push_back(event(
            "message_delta",
            json!({"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": seq},
                   "usage": {"output_tokens": self.st.n_tokens}}),
        ));
        self.queue
            .push_back(event("message_stop", json!({"type": "message_stop"})));
        self.done = true;
    }
}

fn stream(st: State) -> Response {
    let start = event(
        "message_start",
        json!({"type": "message_start", "message": {
            "id": st.meta.id, "type": "message", "role": "assistant", "model": st.meta.model,
            "content": [], "stop_reason": null, "stop_sequence": null,
            "usage": {"input_tokens": st.prompt_tokens, "output_tokens": 0},
        }}),
    );
    let mut s = Streamer {
        st,
        open: None,
        index: 0,
        calls: false,
        queue: Default::default(),
        done: false,
    };
    s.queue.push_back(start);
    let events = futures_util::stream::unfold(s, |mut s| async move {
        loop {
            if let Some(e) = s.queue.pop_front() {
                return Some((Ok::<_, std::convert::Infallible>(e), s));
            }
            if s.done {
                return None;
            }
            match s.st.next().await {
                Ok(pieces) => {
                    s.pieces(pieces);
                    if s.st.finish.is_some() {
                        s.end();
                    }
                }
                Err(e) => {
                    s.queue.push_back(event(
                        "error",
                        json!({"type": "error", "error": {"type": "api_error", "message": e.to_string()}}),
                    ));
                    s.done = true;
                }
            }
        }
    });
    axum::response::sse::Sse::new(events)
        .keep_alive(KeepAlive::default())
        .into_response()
}
