//! OpenAI wire types: the request bodies of `/v1/chat/completions` and `/v1/completions`
//! (serde, every field optional except what OpenAI requires), and the response objects and
//! stream chunks. Unknown request fields are ignored, as OpenAI-compatible servers do; known
//! fields we cannot honour are rejected by `validate`, never silently dropped.
//!
//! One extension, opt-in: `"return_token_ids": true` (vLLM's name for it) adds `token_ids` to
//! each choice — the ids of the generated tokens (in a stream, those that arrived since the
//! previous chunk; concatenated over the chunks they are the whole completion's, in order).
//!
//! Reference: the OpenAI API reference (chat completion object, chunk object, legacy
//! completions) and `openai-python`'s `types/chat/*.py`, which the tests drive.
use crate::tokenizer::ChatMessage;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// `stop`: one string or a list.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Stop {
    One(String),
    Many(Vec<String>),
}

/// `seed`: any 64-bit integer, signed or not.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Seed {
    Signed(i64),
    Unsigned(u64),
}

impl Seed {
    pub fn as_u64(&self) -> u64 {
        match *self {
            Seed::Signed(s) => s as u64,
            Seed::Unsigned(u) => u,
        }
    }
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct StreamOptions {
    #[serde(default)]
    pub include_usage: Option<bool>,
}

/// Sampling and length fields both endpoints share (parsed from the same body as the
/// endpoint's own struct; no `#[serde(flatten)]`, which would lose the field names in errors).
#[derive(Debug, Clone, Default, Deserialize)]
pub struct Common {
    /// Accepted and ignored, as llama-server does (clients hard-code names).
    pub model: Option<String>,
    /// -1: no limit (until the context is full), as llama-server.
    pub max_tokens: Option<i64>,
    /// llama.cpp's name for the completion length (wins over `max_tokens`); -1: no limit.
    pub n_predict: Option<i64>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<u64>,
    pub min_p: Option<f32>,
    pub seed: Option<Seed>,
    pub stop: Option<Stop>,
    pub presence_penalty: Option<f32>,
    pub frequency_penalty: Option<f32>,
    pub repeat_penalty: Option<f32>,
    pub n: Option<u64>,
    pub stream: Option<bool>,
    pub stream_options: Option<StreamOptions>,
    /// OpenAI's `{"id": bias}` or llama.cpp's `[[id, bias]]` (`false` = never).
    pub logit_bias: Option<Value>,
    pub response_format: Option<Value>,
    /// llama-server: a GBNF grammar the output must match.
    pub grammar: Option<String>,
    /// llama-server: a JSON Schema the output must be an instance of.
    pub json_schema: Option<Value>,
    /// Extension: add the generated tokens' ids to each choice (`token_ids`).
    pub return_token_ids: Option<bool>,
    /// llama-server: reuse the prompt prefix a slot kept from an earlier request (default
    /// true).
    pub cache_prompt: Option<bool>,
    /// llama-server: run in this slot (-1 or absent: any).
    pub id_slot: Option<i64>,
    /// llama-server: end-of-generation tokens are never sampled (the reply runs to its length
    /// limit); absent: the server's `--ignore-eos`.
    pub ignore_eos: Option<bool>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct ChatRequest {
    pub messages: Vec<ChatMessage>,
    pub max_completion_tokens: Option<i64>,
    pub logprobs: Option<bool>,
    pub top_logprobs: Option<u64>,
    pub tools: Option<Vec<Value>>,
    pub tool_choice: Option<Value>,
    /// With `tool_choice: "required"`: one call or several (default one, as llama-server).
    pub parallel_tool_calls: Option<bool>,
    pub chat_template_kwargs: Option<Map<String, Value>>,
    pub reasoning_effort: Option<String>,
}

/// `prompt`: a string, a list of strings (one completion each), token ids, or lists of them.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum PromptInput {
    Text(String),
    Tokens(Vec<u32>),
    Texts(Vec<String>),
    TokenLists(Vec<Vec<u32>>),
}

#[derive(Debug, Clone, Deserialize)]
pub struct CompletionRequest {
    pub prompt: PromptInput,
    /// 0..=5 alternatives per token (legacy completions).
    pub logprobs: Option<u64>,
    pub echo: Option<bool>,
    pub suffix: Option<String>,
    pub best_of: Option<u64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub total_tokens: usize,
    pub prompt_tokens_details: PromptTokensDetails,
}

/// `usage.prompt_tokens_details` (OpenAI, llama-server).
#[derive(Debug, Clone, Default, Serialize)]
pub struct PromptTokensDetails {
    /// Prompt tokens whose KV rows were reused from an earlier request (the slot's prompt
    /// cache), not evaluated again.
    pub cached_tokens: usize,
}

impl Usage {
    pub fn new(prompt_tokens: usize, completion_tokens: usize, cached_tokens: usize) -> Self {
        Self {
            prompt_tokens,
            completion_tokens,
            total_tokens: prompt_tokens + completion_tokens,
            prompt_tokens_details: PromptTokensDetails { cached_tokens },
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct FunctionCall {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    pub arguments: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct ToolCall {
    /// Position in the message's list (stream deltas only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub index: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<&'static str>,
    pub function: FunctionCall,
}

/// A chat message (`message`) or stream delta (`delta`).
#[derive(Debug, Clone, Default, Serialize)]
pub struct ChatOut {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCall>>,
}

/// One entry of `logprobs.content` (chat).
#[derive(Debug, Clone, Serialize)]
pub struct ChatLogprob {
    pub token: String,
    pub logprob: f32,
    pub bytes: Vec<u8>,
    pub top_logprobs: Vec<TopLogprob>,
}

#[derive(Debug, Clone, Serialize)]
pub struct TopLogprob {
    pub token: String,
    pub logprob: f32,
    pub bytes: Vec<u8>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ChatLogprobs {
    pub content: Vec<ChatLogprob>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ChatChoice {
    pub index: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<ChatOut>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub delta: Option<ChatOut>,
    pub logprobs: Option<ChatLogprobs>,
    pub finish_reason: Option<&'static str>,
    /// With `return_token_ids`: the ids of the generated tokens (this chunk's, when streamed).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token_ids: Option<Vec<u32>>,
}

/// `chat.completion` and `chat.completion.chunk`.
#[derive(Debug, Clone, Serialize)]
pub struct ChatResponse {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub system_fingerprint: String,
    pub choices: Vec<ChatChoice>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    /// llama-server's `timings` (the whole response, or a stream's last chunk).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timings: Option<Value>,
}

/// Legacy completions' `logprobs`.
#[derive(Debug, Clone, Default, Serialize)]
pub struct CompletionLogprobs {
    pub tokens: Vec<String>,
    pub token_logprobs: Vec<f32>,
    pub top_logprobs: Vec<Map<String, Value>>,
    pub text_offset: Vec<usize>,
}

#[derive(Debug, Clone, Serialize)]
pub struct CompletionChoice {
    pub index: usize,
    pub text: String,
    pub logprobs: Option<CompletionLogprobs>,
    pub finish_reason: Option<&'static str>,
    /// With `return_token_ids`: the ids of the generated tokens (this chunk's, when streamed).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token_ids: Option<Vec<u32>>,
}

/// `text_completion` (also the stream chunks' object).
#[derive(Debug, Clone, Serialize)]
pub struct CompletionResponse {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub system_fingerprint: String,
    pub choices: Vec<CompletionChoice>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    /// llama-server's `timings` (the whole response, or a stream's last chunk).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timings: Option<Value>,
}
