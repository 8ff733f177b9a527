//! From a [`Generation`]'s events to OpenAI responses: one JSON object, or an SSE stream of
//! chunks ending in `data: [DONE]` (with a usage chunk first when `stream_options.include_usage`).
//! Text goes through the stop strings, then the output parser (reasoning / tool calls for chat);
//! streamed deltas concatenate to exactly what the non-streamed response holds, and so do the
//! streamed `token_ids` (`return_token_ids`: each chunk carries the ids that arrived since the
//! previous one).
//!
//! Cancellation: the receiver is dropped when the response is (client gone, stop string hit),
//! which tells the engine to free the sequence. An engine error mid-stream is sent as a
//! `data: {"error": ...}` event (what the `openai` clients raise on), and the stream ends.
use super::api::{Event, FinishReason, Generation, OutputFormat, TokenLogprob};
use super::error::ApiError;
use super::parse::{OutputParser, Piece, StopMatcher};
use super::types::*;
use axum::response::sse::{Event as Sse, KeepAlive};
use axum::response::{IntoResponse, Response};
use futures_util::Stream;
use serde_json::Value;
use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Instant;

/// Which endpoint answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Chat,
    Completion,
}

/// The fixed parts of every response object.
#[derive(Debug, Clone)]
pub struct Meta {
    pub id: String,
    pub created: u64,
    pub model: String,
    pub kind: Kind,
    pub format: OutputFormat,
    pub stops: Vec<String>,
    pub include_usage: bool,
    /// Add `token_ids` to the choices (`return_token_ids`).
    pub token_ids: bool,
    /// When the request was queued (the start of `timings.prompt_ms`).
    pub submitted: Instant,
    /// Where finished requests add their prompt and generation time (`/metrics`' `llamacpp:*`).
    pub totals: Option<Arc<super::metrics::LlamaTotals>>,
    /// The choice's `index` (several prompts in one request).
    pub index: usize,
    /// End the stream with `data: [DONE]` (not when several streams are merged into one).
    pub done_marker: bool,
}

/// llama-server's `timings`, measured here: the prompt phase runs from the request's queueing
/// to its first generated token (so it includes any wait for a slot), the generation phase from
/// the first token to the last. `cache_n`: prompt tokens reused from the slot's prompt cache;
/// `prompt_n`: the prompt tokens evaluated (the rest).
pub fn timings(
    cache_n: usize,
    prompt_n: usize,
    prompt_ms: f64,
    predicted_n: usize,
    predicted_ms: f64,
) -> Value {
    let per = |n: usize, ms: f64| if n == 0 { 0.0 } else { ms / n as f64 };
    let rate = |n: usize, ms: f64| if ms <= 0.0 { 0.0 } else { n as f64 * 1e3 / ms };
    serde_json::json!({
        "cache_n": cache_n,
        "prompt_n": prompt_n,
        "prompt_ms": prompt_ms,
        "prompt_per_token_ms": per(prompt_n, prompt_ms),
        "prompt_per_second": rate(prompt_n, prompt_ms),
        "predicted_n": predicted_n,
        "predicted_ms": predicted_ms,
        "predicted_per_token_ms": per(predicted_n, predicted_ms),
        "predicted_per_second": rate(predicted_n, predicted_ms),
    })
}

/// llama-server's `system_fingerprint`: its build string, "b<number>-<commit>" (ours).
const FINGERPRINT: &str = crate::BUILD_INFO;

fn finish_str(r: FinishReason, tool_calls: bool) -> &'static str {
    match r {
        _ if tool_calls => "tool_calls",
        FinishReason::Stop => "stop",
        FinishReason::Length => "length",
    }
}

fn text_of(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn chat_logprob(lp: &TokenLogprob) -> ChatLogprob {
    ChatLogprob {
        token: text_of(&lp.bytes),
        logprob: lp.logprob,
        bytes: lp.bytes.clone(),
        top_logprobs: lp
            .top
            .iter()
            .map(|(b, l)| TopLogprob {
                token: text_of(b),
                logprob: *l,
                bytes: b.clone(),
            })
            .collect(),
    }
}

/// The state of one response: text pipeline, counters, what is not sent yet.
pub(super) struct State {
    pub(super) meta: Meta,
    gen: Option<Generation>,
    pub(super) prompt_tokens: usize,
    /// Prompt tokens reused from the slot's cache, and the slot (once the engine said).
    pub(super) cached_tokens: usize,
    pub(super) slot: Option<usize>,
    pub(super) stop: StopMatcher,
    parser: OutputParser,
    pub(super) n_tokens: usize,
    /// When the first token came, and when the output ended.
    t_first: Option<Instant>,
    t_end: Option<Instant>,
    n_calls: usize,
    /// Logprobs not yet attached to a chunk, and the text length they start at (completions).
    pub(super) logprobs: Vec<TokenLogprob>,
    /// Token ids not yet attached to a chunk.
    pub(super) ids: Vec<u32>,
    text_len: usize,
    pub(super) finish: Option<FinishReason>,
}

impl State {
    pub(super) fn new(meta: Meta, gen: Generation) -> Self {
        let format = match meta.kind {
            Kind::Chat => meta.format,
            Kind::Completion => OutputFormat::Plain,
        };
        Self {
            stop: StopMatcher::new(meta.stops.clone()),
            parser: OutputParser::new(format, gen.opens_reasoning),
            prompt_tokens: gen.prompt_tokens,
            cached_tokens: 0,
            slot: None,
            gen: Some(gen),
            meta,
            n_tokens: 0,
            t_first: None,
            t_end: None,
            n_calls: 0,
            logprobs: Vec::new(),
            ids: Vec::new(),
            text_len: 0,
            finish: None,
        }
    }

    /// Waits for the next engine event; returns the parsed pieces, or the error that ended it.
    /// `self.finish` is set when the output is complete.
    pub(super) async fn next(&mut self) -> Result<Vec<Piece>, ApiError> {
        let Some(gen) = self.gen.as_mut() else {
            return Ok(Vec::new());
        };
        let ev = gen.events.recv().await;
        let (text, end) = match ev {
            Some(Event::Id(id)) => {
                self.ids.push(id);
                return Ok(Vec::new());
            }
            // Only embedding requests get one.
            Some(Event::Embedding(_)) => return Ok(Vec::new()),
            Some(Event::Started { slot, cached }) => {
                self.slot = Some(slot);
                self.cached_tokens = cached;
                return Ok(Vec::new());
            }
            Some(Event::Token { text, logprob }) => {
                self.n_tokens += 1;
                self.t_first.get_or_insert_with(Instant::now);
                self.logprobs.extend(logprob);
                (text, None)
            }
            Some(Event::Done { reason, tail }) => (tail, Some(reason)),
            Some(Event::Error(e)) => {
                self.gen = None;
                return Err(ApiError::Internal(e));
            }
            None => {
                self.gen = None;
                return Err(ApiError::Internal("the engine stopped".into()));
            }
        };
        let (text, stopped) = self.stop.push(&text);
        let mut pieces = self.parser.push(&text);
        let end = if stopped {
            Some(FinishReason::Stop)
        } else {
            end
        };
        if let Some(reason) = end {
            if !stopped {
                let rest = self.stop.finish();
                pieces.extend(self.parser.push(&rest));
            }
            pieces.extend(self.parser.finish());
            self.finish = Some(reason);
            self.t_end = Some(Instant::now());
            if let Some(t) = &self.meta.totals {
                let (p, g) = self.phase_ms();
                t.add(p, g);
            }
            self.gen = None; // frees the engine's sequence now if it was still running
        }
        Ok(pieces)
    }

    /// The pending token ids, when the request asked for them.
    fn take_ids(&mut self) -> Option<Vec<u32>> {
        self.meta.token_ids.then(|| std::mem::take(&mut self.ids))
    }

    pub(super) fn usage(&self) -> Usage {
        Usage::new(self.prompt_tokens, self.n_tokens, self.cached_tokens)
    }

    /// Milliseconds of the prompt phase and of the generation phase (see [`timings`]).
    fn phase_ms(&self) -> (f64, f64) {
        let end = self.t_end.unwrap_or_else(Instant::now);
        let first = self.t_first.unwrap_or(end);
        let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
        (
            ms(first.saturating_duration_since(self.meta.submitted)),
            ms(end.saturating_duration_since(first)),
        )
    }

    pub(super) fn timings(&self) -> Value {
        let (p, g) = self.phase_ms();
        timings(
            self.cached_tokens,
            self.prompt_tokens.saturating_sub(self.cached_tokens),
            p,
            self.n_tokens,
            g,
        )
    }

    fn chat_chunk(
        &self,
        delta: ChatOut,
        logprobs: Option<ChatLogprobs>,
        finish: Option<&'static str>,
    ) -> ChatResponse {
        ChatResponse {
            id: self.meta.id.clone(),
            object: "chat.completion.chunk",
            created: self.meta.created,
            model: self.meta.model.clone(),
            system_fingerprint: FINGERPRINT.into(),
            choices: vec![ChatChoice {
                index: self.meta.index,
                message: None,
                delta: Some(delta),
                logprobs,
                finish_reason: finish,
                token_ids: None,
            }],
            usage: None,
            timings: None,
        }
    }

    fn completion_obj(
        &self,
        text: String,
        logprobs: Option<CompletionLogprobs>,
        finish: Option<&'static str>,
    ) -> CompletionResponse {
        CompletionResponse {
            id: self.meta.id.clone(),
            object: "text_completion",
            created: self.meta.created,
            model: self.meta.model.clone(),
            system_fingerprint: FINGERPRINT.into(),
            choices: vec![CompletionChoice {
                index: self.meta.index,
                text,
                logprobs,
                finish_reason: finish,
                token_ids: None,
            }],
            usage: None,
            timings: None,
        }
    }

    /// Takes the pending logprobs in the completions shape, advancing the text offsets.
    fn take_completion_logprobs(&mut self) -> CompletionLogprobs {
        let mut out = CompletionLogprobs::default();
        for lp in self.logprobs.drain(..) {
            let tok = text_of(&lp.bytes);
            out.text_offset.push(self.text_len);
            self.text_len += tok.len();
            out.tokens.push(tok);
            out.token_logprobs.push(lp.logprob);
            out.top_logprobs.push(
                lp.top
                    .iter()
                    .map(|(b, l)| (text_of(b), serde_json::json!(l)))
                    .collect(),
            );
        }
        out
    }

    pub(super) fn new_call_id(&mut self) -> (usize, String) {
        let i = self.n_calls;
        self.n_calls += 1;
        (
            i,
            format!(
                "call_{}_{i}",
                self.meta.id.rsplit('-').next().unwrap_or("0")
            ),
        )
    }
}

/// Runs the generation to its end and answers with one object.
pub async fn full(meta: Meta, gen: Generation, logprobs: bool) -> Response {
    match full_value(meta, gen, logprobs).await {
        Ok(v) => axum::Json(v).into_response(),
        Err(e) => e.into_response(),
    }
}

/// Runs the generation to its end; the response object.
pub async fn full_value(meta: Meta, gen: Generation, logprobs: bool) -> Result<Value, ApiError> {
    let mut st = State::new(meta, gen);
    let (mut content, mut reasoning, mut calls) = (String::new(), String::new(), Vec::new());
    let mut text = String::new();
    while st.finish.is_none() {
        let pieces = st.next().await?;
        for p in pieces {
            match p {
                Piece::Content(s) => {
                    content.push_str(&s);
                    text.push_str(&s);
                }
                Piece::Reasoning(s) => reasoning.push_str(&s),
                Piece::ToolCall { name, arguments } => {
                    let (_, id) = st.new_call_id();
                    calls.push(ToolCall {
                        index: None,
                        id: Some(id),
                        kind: Some("function"),
                        function: FunctionCall {
                            name: Some(name),
                            arguments,
                        },
                    });
                }
            }
        }
    }
    let finish = finish_str(st.finish.unwrap_or(FinishReason::Stop), !calls.is_empty());
    let usage = st.usage();
    match st.meta.kind {
        Kind::Chat => {
            let lp = logprobs.then(|| ChatLogprobs {
                content: st.logprobs.iter().map(chat_logprob).collect(),
            });
            let mut r = st.chat_chunk(ChatOut::default(), lp, Some(finish));
            r.object = "chat.completion";
            r.usage = Some(usage);
            r.timings = Some(st.timings());
            r.choices[0].token_ids = st.take_ids();
            let c = &mut r.choices[0];
            c.delta = None;
            c.message = Some(ChatOut {
                role: Some("assistant"),
                content: (!content.is_empty() || calls.is_empty()).then_some(content),
                reasoning_content: (!reasoning.is_empty()).then_some(reasoning),
                tool_calls: (!calls.is_empty()).then_some(calls),
            });
            Ok(serde_json::to_value(r).unwrap_or_default())
        }
        Kind::Completion => {
            let lp = logprobs.then(|| st.take_completion_logprobs());
            let mut r = st.completion_obj(text, lp, Some(finish));
            r.usage = Some(usage);
            r.timings = Some(st.timings());
            r.choices[0].token_ids = st.take_ids();
            Ok(serde_json::to_value(r).unwrap_or_default())
        }
    }
}

fn data<T: serde::Serialize>(v: &T) -> Sse {
    Sse::default().data(
        serde_json::to_string(v).unwrap_or_else(|e| {
            format!("{{\"error\":{{\"message\":\"serialization failed: {e}\"}}}}")
        }),
    )
}

struct Streamer {
    st: State,
    queue: VecDeque<Sse>,
    logprobs: bool,
    done: bool,
}

impl Streamer {
    /// Turns pieces into chunks (pending logprobs ride on the first one).
    fn chunks(&mut self, pieces: Vec<Piece>) {
        for p in pieces {
            match self.st.meta.kind {
                Kind::Chat => {
                    let lp = self.chat_lp();
                    let deltas = match p {
                        Piece::Content(s) => vec![ChatOut {
                            content: Some(s),
                            ..Default::default()
                        }],
                        Piece::Reasoning(s) => vec![ChatOut {
                            reasoning_content: Some(s),
                            ..Default::default()
                        }],
                        Piece::ToolCall { name, arguments } => {
                            let (index, id) = self.st.new_call_id();
                            let call = |id, kind, name, arguments| ChatOut {
                                tool_calls: Some(vec![ToolCall {
                                    index: Some(index),
                                    id,
                                    kind,
                                    function: FunctionCall { name, arguments },
                                }]),
                                ..Default::default()
                            };
                            vec![
                                call(Some(id), Some("function"), Some(name), String::new()),
                                call(None, None, None, arguments),
                            ]
                        }
                    };
                    let mut lp = lp;
                    for d in deltas {
                        let mut c = self.st.chat_chunk(d, lp.take(), None);
                        c.choices[0].token_ids = self.st.take_ids();
                        self.queue.push_back(data(&c));
                    }
                }
                Kind::Completion => {
                    let Piece::Content(s) = p else { continue };
                    let lp = self.logprobs.then(|| self.st.take_completion_logprobs());
                    let mut c = self.st.completion_obj(s, lp, None);
                    c.choices[0].token_ids = self.st.take_ids();
                    self.queue.push_back(data(&c));
                }
            }
        }
    }

    fn chat_lp(&mut self) -> Option<ChatLogprobs> {
        (self.logprobs && !self.st.logprobs.is_empty()).then(|| ChatLogprobs {
            content: self
                .st
                .logprobs
                .drain(..)
                .map(|l| chat_logprob(&l))
                .collect(),
        })
    }

    /// The closing chunks: finish reason, usage, `[DONE]`.
    fn close(&mut self, reason: FinishReason) {
        let finish = Some(finish_str(reason, self.st.n_calls > 0));
        let ids = self.st.take_ids();
        let last = match self.st.meta.kind {
            Kind::Chat => {
                let lp = self.chat_lp();
                let mut c = self.st.chat_chunk(ChatOut::default(), lp, finish);
                c.choices[0].token_ids = ids;
                c.timings = Some(self.st.timings());
                data(&c)
            }
            Kind::Completion => {
                let lp = self.logprobs.then(|| self.st.take_completion_logprobs());
                let mut c = self.st.completion_obj(String::new(), lp, finish);
                c.choices[0].token_ids = ids;
                c.timings = Some(self.st.timings());
                data(&c)
            }
        };
        self.queue.push_back(last);
        if self.st.meta.include_usage {
            let usage = Some(self.st.usage());
            let u = match self.st.meta.kind {
                Kind::Chat => {
                    let mut c = self.st.chat_chunk(ChatOut::default(), None, None);
                    c.choices.clear();
                    c.usage = usage;
                    data(&c)
                }
                Kind::Completion => {
                    let mut c = self.st.completion_obj(String::new(), None, None);
                    c.choices.clear();
                    c.usage = usage;
                    data(&c)
                }
            };
            self.queue.push_back(u);
        }
        if self.st.meta.done_marker {
            self.queue.push_back(Sse::default().data("[DONE]"));
        }
        self.done = true;
    }

    async fn advance(&mut self) {
        match self.st.next().await {
            Ok(pieces) => {
                self.chunks(pieces);
                if let Some(r) = self.st.finish {
                    self.close(r);
                }
            }
            Err(e) => {
                tracing::warn!("generation {} failed: {e}", self.st.meta.id);
                self.queue.push_back(data(&e.body()));
                self.done = true;
            }
        }
    }
}

fn sse_stream(
    meta: Meta,
    gen: Generation,
    logprobs: bool,
) -> impl Stream<Item = Result<Sse, Infallible>> {
    let mut s = Streamer {
        st: State::new(meta, gen),
        queue: VecDeque::new(),
        logprobs,
        done: false,
    };
    if s.st.meta.kind == Kind::Chat {
        let first = s.st.chat_chunk(
            ChatOut {
                role: Some("assistant"),
                content: Some(String::new()),
                ..Default::default()
            },
            None,
            None,
        );
        s.queue.push_back(data(&first));
    }
    futures_util::stream::unfold(s, |mut s| async move {
        loop {
            if let Some(e) = s.queue.pop_front() {
                return Some((Ok(e), s));
            }
            if s.done {
                return None;
            }
            s.advance().await;
        }
    })
}

/// Answers with one SSE stream of several generations' chunks (each choice's `index` is its
/// prompt's), in the order they come, then `data: [DONE]`.
pub fn stream_many(runs: Vec<(Meta, Generation, bool)>) -> Response {
    use futures_util::StreamExt as _;
    let streams = runs.into_iter().map(|(mut meta, gen, logprobs)| {
        meta.done_marker = false;
        Box::pin(sse_stream(meta, gen, logprobs))
    });
    let done = futures_util::stream::once(async { Ok(Sse::default().data("[DONE]")) });
    axum::response::sse::Sse::new(futures_util::stream::select_all(streams).chain(done))
        .keep_alive(KeepAlive::default())
        .into_response()
}

/// Answers with an SSE stream.
pub fn stream(meta: Meta, gen: Generation, logprobs: bool) -> Response {
    axum::response::sse::Sse::new(sse_stream(meta, gen, logprobs))
        .keep_alive(KeepAlive::default())
        .into_response()
}
