//! OpenAI's Responses API, as llama-server serves it: `POST /v1/responses` (also `/responses`),
//! JSON or an SSE stream of `response.*` events. `instructions` becomes the system message,
//! `input` (a string, or a list of messages with string or `input_text`/`output_text` content,
//! and `function_call` / `function_call_output` items) the chat, `tools` (Responses' flat
//! function tools) the chat's tools, `max_output_tokens` the length; then the request goes
//! through the same checks, template and output parser as `/v1/chat/completions`. The answer's
//! `output` holds a `reasoning` item when the model reasoned, a `message` with one `output_text`
//! part, and a `function_call` item per tool call; `status` is `incomplete`
//! (`incomplete_details.reason: max_output_tokens`) when the length ran out.
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

/// Text of a Responses content value: a string or a list of text parts.
fn content_text(v: &Value, field: &str) -> Result<String, ApiError> {
    match v {
        Value::String(s) => Ok(s.clone()),
        Value::Array(parts) => {
            let mut out = Vec::new();
            for (i, p) in parts.iter().enumerate() {
                match (p.get("type").and_then(Value::as_str), p.get("text")) {
                    (Some("input_text" | "output_text" | "text"), Some(Value::String(t))) => {
                        out.push(t.clone())
                    }
                    (t, _) => {
                        return Err(ApiError::invalid(
                            &format!("{field}[{i}]"),
                            format!("{field}[{i}]: part type {t:?} is not supported here (input_text, output_text)"),
                        ))
                    }
                }
            }
            Ok(out.join("\n"))
        }
        _ => Err(ApiError::invalid(
            field,
            format!("{field}: send a string or a list of input_text parts"),
        )),
    }
}

/// The Responses body as a chat body.
fn to_chat(body: &Value) -> Result<Value, ApiError> {
    let obj = body
        .as_object()
        .ok_or_else(|| ApiError::bad("the request body must be a JSON object"))?;
    let mut messages = Vec::new();
    if let Some(Value::String(sys)) = obj.get("instructions") {
        messages.push(json!({"role": "system", "content": sys}));
    }
    match obj.get("input") {
        Some(Value::String(s)) => messages.push(json!({"role": "user", "content": s})),
        Some(Value::Array(items)) => {
            for (i, it) in items.iter().enumerate() {
                let field = format!("input[{i}]");
                match it.get("type").and_then(Value::as_str).unwrap_or("message") {
                    "message" => {
                        let role = it.get("role").and_then(Value::as_str).unwrap_or("");
                        let content = content_text(it.get("content").unwrap_or(&Value::Null), &format!("{field}.content"))?;
                        messages.push(json!({"role": role, "content": content}));
                    }
                    "function_call" => messages.push(json!({
                        "role": "assistant",
                        "content": "",
                        "tool_calls": [{
                            "id": it.get("call_id").cloned().unwrap_or(Value::Null),
                            "type": "function",
                            "function": {
                                "name": it.get("name").cloned().unwrap_or(Value::Null),
                                "arguments": it.get("arguments").cloned().unwrap_or(json!("{}")),
                            },
                        }],
                    })),
                    "function_call_output" => messages.push(json!({
                        "role": "tool",
                        "tool_call_id": it.get("call_id").cloned().unwrap_or(Value::Null),
                        "content": match it.get("output") {
                            Some(Value::String(s)) => s.clone(),
                            Some(v) => v.to_string(),
                            None => String::new(),
                        },
                    })),
                    t => {
                        return Err(ApiError::invalid(
                            &field,
                            format!("{field}: item type {t:?} is not supported here (message, function_call, function_call_output)"),
                        ))
                    }
                }
            }
        }
        _ => {
            return Err(ApiError::invalid(
                "input",
                "input: send a string or a list of messages",
            ))
        }
    }
    let mut chat = Map::new();
    chat.insert("messages".into(), Value::Array(messages));
    for (from, to) in [
        ("max_output_tokens", "max_tokens"),
        ("temperature", "temperature"),
        ("top_p", "top_p"),
        ("stream", "stream"),
        ("model", "model"),
        ("tool_choice", "tool_choice"),
    ] {
        if let Some(v) = obj.get(from) {
            chat.insert(to.into(), v.clone());
        }
    }
    if let Some(tools) = obj.get("tools").and_then(Value::as_array) {
        let mut out = Vec::new();
        for (i, t) in tools.iter().enumerate() {
            if t.get("type").and_then(Value::as_str) != Some("function") {
                return Err(ApiError::invalid(
                    &format!("tools[{i}]"),
                    format!("tools[{i}]: only function tools are supported here"),
                ));
            }
            out.push(json!({"type": "function", "function": {
                "name": t.get("name").cloned().unwrap_or(Value::Null),
                "description": t.get("description").cloned().unwrap_or(json!("")),
                "parameters": t.get("parameters").cloned().unwrap_or(json!({})),
            }}));
        }
        chat.insert("tools".into(), Value::Array(out));
    }
    Ok(Value::Object(chat))
}

/// What the generation produced, gathered for the final object.
#[derive(Default)]
struct Out {
    text: String,
    reasoning: String,
    calls: Vec<(String, String, String)>,
}

fn response_obj(st: &State, out: &Out, status: &str, msg_id: &str) -> Value {
    let mut output = Vec::new();
    if !out.reasoning.is_empty() {
        output.push(
            json!({"type": "reasoning", "id": format!("rs_{msg_id}"), "summary": [],
            "content": [{"type": "reasoning_text", "text": out.reasoning}]}),
        );
    }
    if !out.text.is_empty() || out.calls.is_empty() {
        output.push(
            json!({"type": "message", "id": msg_id, "status": status, "role": "assistant",
            "content": [{"type": "output_text", "text": out.text, "annotations": []}]}),
        );
    }
    for (id, name, args) in &out.calls {
        output.push(
            json!({"type": "function_call", "id": format!("fc_{id}"), "call_id": id,
            "name": name, "arguments": args, "status": "completed"}),
        );
    }
    let incomplete = status == "incomplete";
    json!({
        "id": st.meta.id,
        "object": "response",
        "created_at": st.meta.created,
        "status": status,
        "model": st.meta.model,
        "output": output,
        "incomplete_details": if incomplete { json!({"reason": "max_output_tokens"}) } else { Value::Null },
        "error": null,
        "parallel_tool_calls": true,
        "tool_choice": "auto",
        "tools": [],
        "text": {"format": {"type": "text"}},
        "usage": {
            "input_tokens": st.prompt_tokens,
            "output_tokens": st.n_tokens,
            "total_tokens": st.prompt_tokens + st.n_tokens,
            "input_tokens_details": {"cached_tokens": st.cached_tokens},
            "output_tokens_details": {"reasoning_tokens": 0},
        },
    })
}

fn status(st: &State) -> &'static str {
    match (st.finish, &st.stop.hit) {
        (Some(FinishReason::Length), None) => "incomplete",
        (None, _) => "in_progress",
        _ => "completed",
    }
}

impl Out {
    fn take(&mut self, st: &mut State, pieces: Vec<Piece>) -> String {
        let mut delta = String::new();
        for p in pieces {
            match p {
                Piece::Content(s) => {
                    delta.push_str(&s);
                    self.text.push_str(&s);
                }
                Piece::Reasoning(s) => self.reasoning.push_str(&s),
                Piece::ToolCall { name, arguments } => {
                    let (_, id) = st.new_call_id();
                    self.calls.push((id, name, arguments));
                }
            }
        }
        delta
    }
}

pub(super) async fn responses(AxState(app): AxState<Arc<AppState>>, req: Request) -> Response {
    let run = async {
        let bytes = read_body(req, &app.cfg).await?;
        let body: Value = serde_json::from_slice(&bytes)
            .map_err(|e| ApiError::bad(format!("the request body is not valid JSON: {e}")))?;
        let chat = to_chat(&body)?.to_string();
        let (common, r) = validate::parse_body::<ChatRequest>(chat.as_bytes())?;
        let plan = validate::chat_plan(&common, r, app.engine.card(), &app.cfg.defaults)?;
        let (gen, t0) = super::submit(&app, plan.gen.clone()).await?;
        let mut meta = super::meta(&app, &plan, Kind::Chat, t0);
        let tail = meta.id.trim_start_matches("chatcmpl-").to_string();
        meta.id = format!("resp_{tail}");
        let msg_id = format!("msg_{tail}");
        let mut st = State::new(meta, gen);
        if plan.stream {
            return Ok::<_, ApiError>(stream(st, msg_id));
        }
        let mut out = Out::default();
        while st.finish.is_none() {
            let pieces = st.next().await?;
            out.take(&mut st, pieces);
        }
        Ok(Json(response_obj(&st, &out, status(&st), &msg_id)).into_response())
    };
    run.await.unwrap_or_else(IntoResponse::into_response)
}

struct Streamer {
    st: State,
    out: Out,
    msg_id: String,
    seq: u64,
    queue: std::collections::VecDeque<Sse>,
    done: bool,
}

impl Streamer {
    fn event(&mut self, name: &str, mut v: Value) {
        v["type"] = json!(name);
        v["sequence_number"] = json!(self.seq);
        self.seq += 1;
        self.queue
            .push_back(Sse::default().event(name).data(v.to_string()));
    }

    fn end(&mut self) {
        let id = self.msg_id.clone();
        let status = status(&self.st);
        let part = json!({"type": "output_text", "text": self.out.text, "annotations": []});
        self.event(
            "response.output_text.done",
            json!({"item_id": id, "output_index": 0, "content_index": 0, "text": self.out.text}),
        );
        self.event(
            "response.content_part.done",
            json!({"item_id": id, "output_index": 0, "content_index": 0, "part": part}),
        );
        self.event(
            "response.output_item.done",
            json!({"output_index": 0, "item": {"type": "message", "id": id,
            "status": status, "role": "assistant", "content": [part]}}),
        );
        let calls = std::mem::take(&mut self.out.calls);
        for (i, (cid, name, args)) in calls.iter().enumerate() {
            let item = json!({"type": "function_call", "id": format!("fc_{cid}"), "call_id": cid,
                "name": name, "arguments": args, "status": "completed"});
            self.event(
                "response.output_item.added",
                json!({"output_index": i + 1, "item": item}),
            );
            self.event(
                "response.output_item.done",
                json!({"output_index": i + 1, "item": item}),
            );
        }
        self.out.calls = calls;
        let full = response_obj(&self.st, &self.out, status, &self.msg_id);
        let name = if status == "incomplete" {
            "response.incomplete"
        } else {
            "response.completed"
        };
        self.event(name, json!({ "response": full }));
        self.done = true;
    }
}

fn stream(st: State, msg_id: String) -> Response {
    let mut s = Streamer {
        st,
        out: Out::default(),
        msg_id,
        seq: 0,
        queue: Default::default(),
        done: false,
    };
    let created = response_obj(&s.st, &s.out, "in_progress", &s.msg_id);
    let mut created = created;
    created["output"] = json!([]);
    s.event("response.created", json!({ "response": created }));
    let id = s.msg_id.clone();
    s.event(
        "response.output_item.added",
        json!({"output_index": 0, "item": {"type": "message", "id": id,
        "status": "in_progress", "role": "assistant", "content": []}}),
    );
    s.event(
        "response.content_part.added",
        json!({"item_id": id, "output_index": 0, "content_index": 0,
        "part": {"type": "output_text", "text": "", "annotations": []}}),
    );
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
                    let delta = s.out.take(&mut s.st, pieces);
                    if !delta.is_empty() {
                        let id = s.msg_id.clone();
                        s.event("response.output_text.delta", json!({"item_id": id, "output_index": 0, "content_index": 0, "delta": delta}));
                    }
                    if s.st.finish.is_some() {
                        s.end();
                    }
                }
                Err(e) => {
                    s.event(
                        "error",
                        json!({"code": "server_error", "message": e.to_string()}),
                    );
                    s.done = true;
                }
            }
        }
    });
    axum::response::sse::Sse::new(events)
        .keep_alive(KeepAlive::default())
        .into_response()
}
