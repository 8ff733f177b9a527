//! The narrow boundary between the HTTP layer and whatever generates tokens (docs/design.md §6,
//! after TGI's router/backend split): the server only calls [`Engine`]. [`super::LocalEngine`]
//! is the real one (a GGUF on one engine thread with continuous batching); tests plug in mocks.
//!
//! Contract: `submit` validates and queues without blocking on generation and answers errors as
//! values (prompt too long, queue full, still loading); the returned receiver then yields
//! one `Token` per generated token (each preceded by an `Id` when the request set
//! [`GenRequest::token_ids`]) and exactly one final `Done` or `Error`. Dropping the receiver
//! cancels the request: the engine frees its sequence (and its KV-cache rows) at its next step.
use super::error::ApiError;
use crate::engine::sampling::SamplerParams;
use crate::tokenizer::ChatMessage;
use std::time::Duration;
use tokio::sync::mpsc::UnboundedReceiver;

/// llama-server's answer to an embedding request when started without `--embedding`.
pub const NO_EMBEDDINGS: &str =
    "This server does not support embeddings. Start it with `--embeddings`";

/// How a model marks reasoning and tool calls in its output (picked from its chat template).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutputFormat {
    /// Plain text.
    Plain,
    /// `<think>…</think>` reasoning (DeepSeek-R1, GLM, …), no tool-call syntax we parse.
    Think,
    /// Qwen3 / Hermes: `<think>…</think>` and `<tool_call>{"name", "arguments"}</tool_call>`.
    Qwen3,
    /// OpenAI harmony (gpt-oss): `<|channel|>analysis|commentary|final<|message|>…<|end|>`,
    /// tool calls as `commentary to=functions.NAME … <|message|>{args}<|call|>`.
    Harmony,
}

impl OutputFormat {
    /// The format a chat template implies.
    pub fn from_template(source: &str) -> Self {
        if source.contains("<|channel|>") {
            OutputFormat::Harmony
        } else if source.contains("<tool_call>") {
            OutputFormat::Qwen3
        } else if source.contains("<think>") {
            OutputFormat::Think
        } else {
            OutputFormat::Plain
        }
    }

    /// Whether control tokens must reach the parser as text (harmony's markers are control
    /// tokens; elsewhere they are hidden, as llama.cpp's server hides them).
    pub fn needs_special_tokens(self) -> bool {
        self == OutputFormat::Harmony
    }
}

/// What `/v1/models` says about the served model.
#[derive(Debug, Clone)]
pub struct ModelCard {
    /// The name clients pass as `model`.
    pub id: String,
    /// Other names accepted as `model` (the GGUF file name, ...).
    pub aliases: Vec<String>,
    /// Unix seconds.
    pub created: u64,
    /// Context length of one sequence (prompt + completion).
    pub n_ctx: usize,
    pub n_vocab: usize,
    pub format: OutputFormat,
    /// Whether chat requests can be served (the model has a chat template).
    pub has_chat_template: bool,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Health {
    Loading { fraction: f64 },
    Ready,
    Failed(String),
    ShuttingDown,
}

/// The prompt of a request, before the engine renders and tokenizes it.
#[derive(Debug, Clone)]
pub enum Prompt {
    Chat {
        messages: Vec<ChatMessage>,
        /// Template variables: `tools`, `chat_template_kwargs` (e.g. `enable_thinking`), ...
        template_vars: serde_json::Map<String, serde_json::Value>,
    },
    Text(String),
    Tokens(Vec<u32>),
}

#[derive(Debug, Clone)]
pub struct GenRequest {
    pub prompt: Prompt,
    pub sampling: SamplerParams,
    /// `None`: until the context is full.
    pub max_tokens: Option<usize>,
    /// `max_tokens` is the server's default (`-n`), not the
    /// request's: shorten it to what the prompt leaves of the context instead of refusing.
    pub max_tokens_soft: bool,
    /// `Some(n)`: report each token's log-probability and its `n` most likely alternatives.
    pub logprobs: Option<usize>,
    /// Added to the logits before sampling.
    pub logit_bias: Vec<(u32, f32)>,
    /// Report each generated token's id (an [`Event::Id`] before its `Token`): the request's
    /// `return_token_ids`.
    pub token_ids: bool,
    /// The output must match this (grammar, JSON schema, tool call); the engine compiles it
    /// and answers 400 when it does not compile.
    pub constraint: Option<super::grammar::Constraint>,
    /// Reuse the cache rows of a prompt prefix a slot kept from an earlier request
    /// (llama-server's `cache_prompt`, default true); false: the whole prompt is evaluated.
    pub cache_prompt: bool,
    /// Run in this slot (llama-server's `id_slot`), waiting for it if busy; `None`: any.
    pub id_slot: Option<usize>,
    /// Never sample an end-of-generation token (llama-server's `ignore_eos`: a bias of -inf on
    /// each of them).
    pub ignore_eos: bool,
}

/// A token's log-probability and the most likely alternatives (from the raw logits).
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprob {
    pub bytes: Vec<u8>,
    pub logprob: f32,
    pub top: Vec<(Vec<u8>, f32)>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    /// An end-of-generation token (or, in the server, a stop string).
    Stop,
    /// `max_tokens` or the context ran out.
    Length,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// The id of the generated token whose `Token` comes next (only when asked for:
    /// [`GenRequest::token_ids`]).
    Id(u32),
    /// One generated token's text (complete UTF-8 only: empty while a character is unfinished).
    Token {
        text: String,
        logprob: Option<TokenLogprob>,
    },
    /// The end. `tail`: text still held by the UTF-8 decoder (an unfinished character, as
    /// U+FFFD); usually empty.
    Done {
        reason: FinishReason,
        tail: String,
    },
    Error(String),
    /// The request got a slot (sent once, before anything else): `cached` prompt tokens were
    /// found in the slot's kept cache and are not evaluated again.
    Started {
        slot: usize,
        cached: usize,
    },
    /// An embedding request's result (before its `Done`): one pooled vector, or one per prompt
    /// position with pooling `none`; not normalised.
    Embedding(Vec<Vec<f32>>),
}

/// A queued generation.
pub struct Generation {
    pub prompt_tokens: usize,
    /// The rendered prompt leaves a reasoning block open (a template that starts the assistant
    /// turn with `<think>`), so the output starts inside it.
    pub opens_reasoning: bool,
    pub events: UnboundedReceiver<Event>,
}

/// What `/metrics`, `/slots`, `/props` and the chat page show: the engine's figures, one
/// snapshot at a time (`Engine::stats`).
pub use crate::engine::snapshot::{SlotState, StatsSnapshot};

/// `POST /slots/{id}?action=...` (llama-server's slot actions).
#[derive(Debug, Clone)]
pub enum SlotAction {
    /// Write the slot's kept tokens and their cache rows to `path` (named `filename`).
    Save {
        path: std::path::PathBuf,
        filename: String,
    },
    /// Load a file written by `Save` into the slot (its kept cache until a request uses it).
    Restore {
        path: std::path::PathBuf,
        filename: String,
    },
    /// Forget the slot's kept cache.
    Erase,
}

/// What `/props` shows beyond the [`ModelCard`].
#[derive(Debug, Clone, Default)]
pub struct EngineInfo {
    pub model_path: Option<String>,
    /// The chat template's source.
    pub chat_template: Option<String>,
}

pub trait Engine: Send + Sync + 'static {
    fn card(&self) -> &ModelCard;
    /// `/tokenize`: the ids of `text` (control tokens parsed when `parse_special`) and each
    /// one's bytes.
    fn tokenize(
        &self,
        _text: &str,
        _add_special: bool,
        _parse_special: bool,
    ) -> Result<Vec<(u32, Vec<u8>)>, ApiError> {
        Err(ApiError::bad("this engine does not tokenize"))
    }
    /// `/detokenize`: the text of `ids`, control tokens included.
    fn detokenize(&self, _ids: &[u32]) -> Result<String, ApiError> {
        Err(ApiError::bad("this engine does not detokenize"))
    }
    /// `/apply-template`: the chat template rendered as a chat request's prompt is rendered
    /// (with the generation prompt when `add_generation_prompt`; a trailing assistant message is
    /// continued, not closed).
    fn apply_template(
        &self,
        _messages: Vec<ChatMessage>,
        _template_vars: serde_json::Map<String, serde_json::Value>,
        _add_generation_prompt: bool,
    ) -> Result<String, ApiError> {
        Err(ApiError::bad("the model has no chat template"))
    }
    /// `/props` extras.
    fn info(&self) -> EngineInfo {
        EngineInfo::default()
    }
    fn health(&self) -> Health;
    /// Renders, tokenizes, checks against the context and queues `req` (may take a while for a
    /// long prompt: call it off the async runtime).
    fn submit(&self, req: GenRequest) -> Result<Generation, ApiError>;
    /// The engine's figures now: queue, tokens, KV use, slots (`/slots`) and the expert cache.
    fn stats(&self) -> StatsSnapshot;
    /// Stops taking work: queued requests end with an error now, running ones may finish
    /// within `grace` and are ended after it. Returns at once.
    fn shutdown(&self, grace: Duration);
    /// Waits until the engine has stopped (after [`Engine::shutdown`]).
    fn join(&self) {}
    /// How `/v1/embeddings` and `/embedding(s)` pool; `None`: embeddings are off (the server
    /// was not started with `--embedding`).
    fn pooling(&self) -> Option<crate::engine::embed::Pooling> {
        None
    }
    /// Checks `tokens` against the vocabulary and the context and queues their embedding: the
    /// receiver yields one [`Event::Embedding`] and a `Done`, or an `Error`.
    fn embed(&self, _tokens: Vec<u32>) -> Result<Generation, ApiError> {
        Err(ApiError::NotSupported(NO_EMBEDDINGS.into()))
    }
    /// Runs a slot action once the slot is idle (blocks until then: call it off the async
    /// runtime) and answers llama-server's JSON for it.
    fn slot_action(&self, _id: usize, _action: SlotAction) -> Result<serde_json::Value, ApiError> {
        Err(ApiError::NotSupported(
            "this engine has no slots to save or restore".into(),
        ))
    }
    /// The classification head `/rerank` scores with (`--pooling rank`); `None`: reranking is
    /// off.
    fn rank_head(&self) -> Option<std::sync::Arc<crate::engine::embed::RankHead>> {
        None
    }
    /// The vocabulary's special tokens and flags, for the prompts `/infill` and `/rerank`
    /// assemble from token ids; `None`: this engine has no vocabulary to show.
    fn vocab(&self) -> Option<VocabInfo> {
        None
    }
}

/// What `/infill` and `/rerank` need of the vocabulary (llama.cpp's `llama_vocab_fim_pre`,
/// `llama_vocab_get_add_bos`, ...).
#[derive(Debug, Clone, Default)]
pub struct VocabInfo {
    pub special: crate::tokenizer::vocab::SpecialTokens,
    /// Whether tokenizing with `add_special` prepends BOS / appends EOS / appends SEP.
    pub add_bos: bool,
    pub add_eos: bool,
    pub add_sep: bool,
    /// The GGUF's `tokenizer.chat_template.rerank` (with `{query}` and `{document}`).
    pub rerank_template: Option<String>,
}
