//! From a request body to a [`GenRequest`] and the server-side output options ([`Plan`]), or a
//! 4xx [`ApiError`] that names the field and says what to send instead.
//!
//! Parsing is two-step: the body becomes a `serde_json::Value` (syntax errors, invalid UTF-8 and
//! nesting deeper than serde_json's 128 levels are refused there, without recursion trouble),
//! then typed structs are read from it with `serde_path_to_error`, so a wrong type is reported
//! as `temperature: invalid type: string "hot", expected f32`. Sampling defaults are
//! llama.cpp's (`SamplerParams::default`), with a fresh random seed when none is given.
use super::api::{GenRequest, ModelCard, OutputFormat, Prompt};
use super::error::ApiError;
use super::gbnf;
use super::grammar::Constraint;
use super::types::{ChatRequest, Common, CompletionRequest, PromptInput, Seed, Stop};
use crate::engine::sampling::SamplerParams;
use crate::tokenizer::MessageContent;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

/// What the server does with the output, besides generating it.
#[derive(Debug, Clone)]
pub struct Plan {
    pub gen: GenRequest,
    pub stream: bool,
    pub include_usage: bool,
    pub stops: Vec<String>,
}

/// The server's defaults for what a request leaves out (llama-server's `--temp`, `--top-k`, ...,
/// `--seed`, `-n`).
#[derive(Debug, Clone, Default)]
pub struct Defaults {
    pub sampling: SamplerParams,
    /// `None`: a fresh random seed per request.
    pub seed: Option<u64>,
    /// Tokens to generate when a request sets no limit (`None`: until the context is full).
    pub n_predict: Option<usize>,
    /// `--ignore-eos`: requests that do not say otherwise never sample an end-of-generation
    /// token.
    pub ignore_eos: bool,
}

/// Parses `bytes` as a JSON object and reads the shared fields and the endpoint's own.
pub fn parse_body<T: DeserializeOwned>(bytes: &[u8]) -> Result<(Common, T), ApiError> {
    let v: Value = serde_json::from_slice(bytes)
        .map_err(|e| ApiError::bad(format!("the request body is not valid JSON: {e}")))?;
    if !v.is_object() {
        return Err(ApiError::bad(format!(
            "the request body must be a JSON object, not {}",
            kind_of(&v)
        )));
    }
    Ok((typed(&v)?, typed(&v)?))
}

fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn typed<T: DeserializeOwned>(v: &Value) -> Result<T, ApiError> {
    serde_path_to_error::deserialize(v).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.inner().to_string();
        let hint = if inner.contains("untagged enum") {
            match path.as_str() {
                "stop" => ": send a string or a list of strings",
                "prompt" => ": send a string, a list of one string, or a list of token ids",
                p if p.ends_with(".content") => ": send a string or a list of content parts",
                _ => "",
            }
        } else {
            ""
        };
        if path == "." {
            ApiError::bad(inner)
        } else {
            ApiError::invalid(&path, format!("{path}: {inner}{hint}"))
        }
    })
}

/// `model` is accepted whatever it names, as llama-server does: clients hard-code names like
/// `gpt-3.5-turbo`, and there is one model here. Responses report the served name.
pub fn check_model(_common: &Common, _card: &ModelCard) -> Result<(), ApiError> {
    Ok(())
}

fn random_seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.finish()
}

fn sampling(c: &Common, defaults: &Defaults) -> Result<SamplerParams, ApiError> {
    let d = defaults.sampling.clone();
    let p = SamplerParams {
        temperature: c.temperature.unwrap_or(d.temperature),
        top_k: c.top_k.map_or(d.top_k, |k| k.min(u32::MAX as u64) as usize),
        top_p: c.top_p.unwrap_or(d.top_p),
        min_p: c.min_p.unwrap_or(d.min_p),
        repeat_penalty: c.repeat_penalty.unwrap_or(d.repeat_penalty),
        presence_penalty: c.presence_penalty.unwrap_or(d.presence_penalty),
        frequency_penalty: c.frequency_penalty.unwrap_or(d.frequency_penalty),
        seed: match &c.seed {
            // llama.cpp: -1 = a random seed.
            Some(Seed::Signed(-1)) => defaults.seed.unwrap_or_else(random_seed),
            Some(s) => s.as_u64(),
            None => defaults.seed.unwrap_or_else(random_seed),
        },
        ..d
    };
    p.validate().map_err(|msg| {
        let field = msg.split_whitespace().next().unwrap_or("").to_string();
        ApiError::invalid(&field, msg)
    })?;
    Ok(p)
}

fn stops(c: &Common) -> Result<Vec<String>, ApiError> {
    let v = match &c.stop {
        None => Vec::new(),
        Some(Stop::One(s)) => vec![s.clone()],
        Some(Stop::Many(v)) => v.clone(),
    };
    if v.len() > 16 {
        return Err(ApiError::invalid(
            "stop",
            format!("{} stop strings given; send at most 16", v.len()),
        ));
    }
    if let Some(s) = v.iter().find(|s| s.len() > 512) {
        return Err(ApiError::invalid(
            "stop",
            format!(
                "a stop string of {} bytes; send stop strings of at most 512 bytes",
                s.len()
            ),
        ));
    }
    Ok(v)
}

/// One `logit_bias` entry: a number in -100..=100, or `false` (the token is never picked, as
/// llama.cpp).
fn bias_value(v: &Value, at: &str) -> Result<f32, ApiError> {
    match v {
        Value::Bool(false) => Ok(f32::NEG_INFINITY),
        v => v
            .as_f64()
            .filter(|b| (-100.0..=100.0).contains(b))
            .map(|b| b as f32)
            .ok_or_else(|| {
                ApiError::invalid(
                    "logit_bias",
                    format!("logit_bias{at} = {v} must be a number in -100..=100 or false"),
                )
            }),
    }
}

fn logit_bias(c: &Common, card: &ModelCard) -> Result<Vec<(u32, f32)>, ApiError> {
    let token = |k: &Value, at: &str| -> Result<u32, ApiError> {
        let id = match k {
            Value::String(s) => s.parse::<u64>().ok(),
            v => v.as_u64(),
        };
        id.filter(|&id| (id as usize) < card.n_vocab)
            .map(|id| id as u32)
            .ok_or_else(|| {
                ApiError::invalid(
                    "logit_bias",
                    format!(
                        "logit_bias{at}: {k} is not a token id (0..{})",
                        card.n_vocab
                    ),
                )
            })
    };
    match &c.logit_bias {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Object(map)) => map
            .iter()
            .map(|(k, v)| {
                let at = format!("[{k:?}]");
                Ok((token(&Value::String(k.clone()), &at)?, bias_value(v, &at)?))
            })
            .collect(),
        // llama.cpp's form: [[id, bias], ...].
        Some(Value::Array(list)) => list
            .iter()
            .enumerate()
            .map(|(i, pair)| {
                let at = format!("[{i}]");
                match pair.as_array().map(Vec::as_slice) {
                    Some([k, v]) => Ok((token(k, &at)?, bias_value(v, &at)?)),
                    _ => Err(ApiError::invalid(
                        "logit_bias",
                        format!("logit_bias{at} = {pair}: send [token_id, bias]"),
                    )),
                }
            })
            .collect(),
        Some(v) => Err(ApiError::invalid(
            "logit_bias",
            format!(
                "logit_bias is {}: send {{\"token_id\": bias}} or [[token_id, bias], ...]",
                kind_of(v)
            ),
        )),
    }
}

/// The completion length a request asks for: llama.cpp's `n_predict` first, then the
/// endpoint's own field (`max_completion_tokens`, `max_tokens`), then the server's `-n`;
/// -1 means no limit (until the context is full), as llama-server. The flag says the limit is
/// the server's default (the request set none): then it is shortened to what the context
/// leaves instead of refused.
fn length(
    fields: &[(&str, Option<i64>)],
    defaults: &Defaults,
) -> Result<(Option<usize>, bool), ApiError> {
    for &(name, v) in fields {
        match v {
            None => continue,
            Some(-1) => return Ok((None, false)),
            Some(0) => {
                return Err(ApiError::invalid(
                    name,
                    format!("{name} = 0: ask for at least 1 token (or -1 for no limit)"),
                ))
            }
            Some(n) if n < 0 => {
                return Err(ApiError::invalid(
                    name,
                    format!("{name} = {n}: send a count above 0, or -1 for no limit"),
                ))
            }
            Some(n) => return Ok((Some(usize::try_from(n).unwrap_or(usize::MAX)), false)),
        }
    }
    Ok((defaults.n_predict, true))
}

/// Checks and converts what both endpoints share.
fn common_plan(
    c: &Common,
    card: &ModelCard,
    prompt: Prompt,
    (max_tokens, soft): (Option<usize>, bool),
    logprobs: Option<usize>,
    tool_call: Option<Constraint>,
    defaults: &Defaults,
) -> Result<Plan, ApiError> {
    check_model(c, card)?;
    if let Some(n) = c.n.filter(|&n| n != 1) {
        return Err(ApiError::invalid(
            "n",
            format!("n = {n}: only n = 1 is supported; send {n} requests instead"),
        ));
    }
    let constraint = match (tool_call, constraint(c)?) {
        (Some(t), None) => Some(t),
        (Some(_), Some(_)) => {
            return Err(ApiError::invalid(
                "tool_choice",
                "tool_choice: \"required\" (or a named function) constrains the output to a tool call: send it without grammar, json_schema or a JSON response_format",
            ))
        }
        (None, c) => c,
    };
    let max_tokens = match max_tokens {
        Some(m) if soft && m > card.n_ctx => Some(card.n_ctx),
        m => m,
    };
    if let Some(m) = max_tokens.filter(|&m| m > card.n_ctx) {
        return Err(ApiError::Invalid {
            msg: format!(
                "max_tokens = {m} is more than the context length of {} tokens: lower it",
                card.n_ctx
            ),
            param: Some("max_tokens".into()),
            code: Some("context_length_exceeded"),
        });
    }
    let stream = c.stream.unwrap_or(false);
    let include_usage = c
        .stream_options
        .as_ref()
        .and_then(|o| o.include_usage)
        .unwrap_or(false);
    if c.stream_options.is_some() && !stream {
        return Err(ApiError::invalid(
            "stream_options",
            "stream_options is only allowed with stream: true",
        ));
    }
    Ok(Plan {
        gen: GenRequest {
            prompt,
            sampling: sampling(c, defaults)?,
            max_tokens,
            max_tokens_soft: soft,
            logprobs,
            logit_bias: logit_bias(c, card)?,
            token_ids: c.return_token_ids.unwrap_or(false),
            constraint,
            cache_prompt: c.cache_prompt.unwrap_or(true),
            id_slot: c.id_slot.and_then(|i| usize::try_from(i).ok()),
            ignore_eos: c.ignore_eos.unwrap_or(defaults.ignore_eos),
        },
        stream,
        include_usage,
        stops: stops(c)?,
    })
}

/// The output constraint of `grammar` (GBNF), `json_schema` or `response_format` (llama-server's
/// fields: `{"type": "json_object"}` with an optional `schema`, `{"type": "json_schema",
/// "json_schema": {"schema": ...}}`); at most one of them.
fn constraint(c: &Common) -> Result<Option<Constraint>, ApiError> {
    let from_format = match &c.response_format {
        None => None,
        Some(f) => {
            let ty = f.get("type").and_then(Value::as_str);
            match ty {
                Some("text") => None,
                Some("json_object") => Some(
                    f.get("schema")
                        .cloned()
                        .unwrap_or_else(|| serde_json::json!({"type": "object"})),
                ),
                Some("json_schema") => {
                    let s = f.pointer("/json_schema/schema").or_else(|| f.get("schema"));
                    let Some(s) = s else {
                        return Err(ApiError::invalid(
                            "response_format",
                            "response_format: {\"type\": \"json_schema\"} needs {\"json_schema\": {\"schema\": {...}}}",
                        ));
                    };
                    Some(s.clone())
                }
                _ => {
                    return Err(ApiError::invalid(
                        "response_format",
                        format!(
                            "response_format.type = {}: use \"text\", \"json_object\" or \"json_schema\"",
                            f.get("type").map_or("none".to_string(), Value::to_string)
                        ),
                    ))
                }
            }
        }
    };
    let schema = match (&c.json_schema, from_format) {
        (Some(_), Some(_)) => {
            return Err(ApiError::invalid(
                "json_schema",
                "json_schema and a JSON response_format both given: send one of them",
            ))
        }
        (Some(s), None) => Some((s.clone(), "json_schema")),
        (None, Some(s)) => Some((s, "response_format")),
        (None, None) => None,
    };
    if let Some((s, field)) = &schema {
        if !s.is_object() && !s.is_boolean() {
            return Err(ApiError::invalid(
                field,
                format!(
                    "{field}: the schema must be a JSON object, not {}",
                    kind_of(s)
                ),
            ));
        }
    }
    // An empty grammar is no grammar (llama-server).
    let grammar = c.grammar.as_deref().filter(|g| !g.trim().is_empty());
    match (grammar, schema) {
        (Some(_), Some(_)) => Err(ApiError::invalid(
            "grammar",
            "grammar and json_schema (or a JSON response_format) both given: send one of them",
        )),
        (Some(g), None) => {
            let lark = gbnf::to_lark(g)
                .map_err(|e| ApiError::invalid("grammar", format!("grammar: {e}")))?;
            Ok(Some(Constraint::Lark {
                lark,
                field: "grammar",
            }))
        }
        (None, s) => Ok(schema_constraint(s)),
    }
}

fn schema_constraint(s: Option<(Value, &'static str)>) -> Option<Constraint> {
    s.map(|(schema, field)| {
        // `true` / `false` schemas: anything / nothing.
        let schema = match schema {
            Value::Bool(true) => serde_json::json!({}),
            v => v,
        };
        Constraint::JsonSchema { schema, field }
    })
}

const ROLES: [&str; 5] = ["system", "developer", "user", "assistant", "tool"];

pub fn chat_plan(
    c: &Common,
    r: ChatRequest,
    card: &ModelCard,
    defaults: &Defaults,
) -> Result<Plan, ApiError> {
    check_model(c, card)?;
    if !card.has_chat_template {
        return Err(ApiError::bad(
            "the model has no chat template: use /v1/completions with a prompt you format yourself",
        ));
    }
    if r.messages.is_empty() {
        return Err(ApiError::invalid(
            "messages",
            "messages is empty: send at least one message",
        ));
    }
    // As llama-server: one trailing assistant message is a prefill to continue; two are refused.
    let n = r.messages.len();
    if n >= 2 && r.messages[n - 2..].iter().all(|m| m.role == "assistant") {
        return Err(ApiError::invalid(
            "messages",
            format!(
                "messages[{}] and messages[{}] are both assistant messages at the end: at most one (a prefill to continue) may end the list",
                n - 2,
                n - 1
            ),
        ));
    }
    let mut r = r;
    for (i, m) in r.messages.iter_mut().enumerate() {
        if !ROLES.contains(&m.role.as_str()) {
            return Err(ApiError::invalid(
                &format!("messages[{i}].role"),
                format!(
                    "messages[{i}].role = {:?}: use one of {}",
                    m.role,
                    ROLES.join(", ")
                ),
            ));
        }
        if let Some(MessageContent::Parts(parts)) = &m.content {
            for (j, p) in parts.iter().enumerate() {
                let ty = p.get("type").and_then(Value::as_str);
                if ty != Some("text") || !p.get("text").is_some_and(Value::is_string) {
                    return Err(ApiError::invalid(
                        &format!("messages[{i}].content[{j}]"),
                        format!(
                            "messages[{i}].content[{j}]: only {{\"type\": \"text\", \"text\": \"...\"}} parts are supported (got type {})",
                            ty.map_or("none".to_string(), |t| format!("{t:?}"))
                        ),
                    ));
                }
            }
            // Text parts become one string: templates that only take strings (most) work.
            m.content = Some(MessageContent::Text(m.text()));
        }
    }
    let mut vars: Map<String, Value> = r.chat_template_kwargs.clone().unwrap_or_default();
    // `required`, or one named function: the output is constrained to a call.
    let mut forced: Option<Option<String>> = None;
    let tools_off = match &r.tool_choice {
        None => false,
        Some(Value::String(s)) if s == "auto" => false,
        Some(Value::String(s)) if s == "none" => true,
        Some(Value::String(s)) if s == "required" => {
            forced = Some(None);
            false
        }
        Some(v) if v.get("type").and_then(Value::as_str) == Some("function") => {
            let Some(name) = v.pointer("/function/name").and_then(Value::as_str) else {
                return Err(ApiError::invalid(
                    "tool_choice",
                    "tool_choice: a named choice is {\"type\": \"function\", \"function\": {\"name\": ...}}",
                ));
            };
            forced = Some(Some(name.to_string()));
            false
        }
        Some(_) => {
            return Err(ApiError::invalid(
                "tool_choice",
                "tool_choice: use \"auto\", \"none\", \"required\" or {\"type\": \"function\", \"function\": {\"name\": ...}}",
            ))
        }
    };
    if let Some(tools) = &r.tools {
        for (i, t) in tools.iter().enumerate() {
            let ok = t.get("type").and_then(Value::as_str) == Some("function")
                && t.pointer("/function/name").is_some_and(Value::is_string);
            if !ok {
                return Err(ApiError::invalid(
                    &format!("tools[{i}]"),
                    format!("tools[{i}] must be {{\"type\": \"function\", \"function\": {{\"name\": ..., \"parameters\": ...}}}}"),
                ));
            }
        }
        if !tools_off && !tools.is_empty() {
            vars.insert("tools".into(), Value::Array(tools.clone()));
        }
    }
    let tool_call = match forced {
        None => None,
        Some(name) => {
            let tools = r.tools.clone().unwrap_or_default();
            let chosen: Vec<Value> = match &name {
                None => tools,
                Some(n) => tools
                    .into_iter()
                    .filter(|t| t.pointer("/function/name").and_then(Value::as_str) == Some(n))
                    .collect(),
            };
            if chosen.is_empty() {
                return Err(ApiError::invalid(
                    "tool_choice",
                    match name {
                        None => {
                            "tool_choice: \"required\" needs at least one tool in tools".to_string()
                        }
                        Some(n) => {
                            format!("tool_choice names the function {n:?}, which is not in tools")
                        }
                    },
                ));
            }
            if !matches!(card.format, OutputFormat::Qwen3 | OutputFormat::Harmony) {
                return Err(ApiError::invalid(
                    "tool_choice",
                    "tool_choice: the model's chat template has no tool-call format this server parses (Qwen3/Hermes <tool_call>, harmony): use \"auto\" or \"none\"",
                ));
            }
            Some(Constraint::ToolCall {
                tools: chosen,
                parallel: r.parallel_tool_calls.unwrap_or(false) && name.is_none(),
            })
        }
    };
    if let Some(e) = &r.reasoning_effort {
        vars.insert("reasoning_effort".into(), Value::String(e.clone()));
    }
    let logprobs = match (r.logprobs, r.top_logprobs) {
        (Some(true), n) => Some(n.unwrap_or(0)),
        (_, Some(_)) => {
            return Err(ApiError::invalid(
                "top_logprobs",
                "top_logprobs needs logprobs: true",
            ))
        }
        _ => None,
    };
    if let Some(n) = logprobs.filter(|&n| n > 20) {
        return Err(ApiError::invalid(
            "top_logprobs",
            format!("top_logprobs = {n}: use 0..=20"),
        ));
    }
    let prompt = Prompt::Chat {
        messages: r.messages,
        template_vars: vars,
    };
    let max = length(
        &[
            ("n_predict", c.n_predict),
            ("max_completion_tokens", r.max_completion_tokens),
            ("max_tokens", c.max_tokens),
        ],
        defaults,
    )?;
    common_plan(
        c,
        card,
        prompt,
        max,
        logprobs.map(|n| n as usize),
        tool_call,
        defaults,
    )
}

/// A plan for one prompt of llama.cpp's native `/completion`: the length is `n_predict` (or
/// `max_tokens`), else the server's `-n`, else until the context is full.
pub fn plan_for(
    c: &Common,
    card: &ModelCard,
    prompt: Prompt,
    logprobs: Option<usize>,
    defaults: &Defaults,
) -> Result<Plan, ApiError> {
    let max = length(
        &[("n_predict", c.n_predict), ("max_tokens", c.max_tokens)],
        defaults,
    )?;
    common_plan(c, card, prompt, max, logprobs, None, defaults)
}

/// Prompts in one `/v1/completions` request at most.
pub const MAX_PROMPTS: usize = 64;

/// The prompts of a `/v1/completions` or `/completion` body: a string, token ids, or a list of
/// either (one completion each, as llama-server).
pub fn prompts(input: PromptInput, card: &ModelCard) -> Result<Vec<Prompt>, ApiError> {
    let list = match input {
        PromptInput::Text(s) => vec![Prompt::Text(s)],
        PromptInput::Tokens(v) => vec![Prompt::Tokens(v)],
        PromptInput::Texts(v) => v.into_iter().map(Prompt::Text).collect(),
        PromptInput::TokenLists(v) => v.into_iter().map(Prompt::Tokens).collect(),
    };
    if list.is_empty() {
        return Err(ApiError::invalid(
            "prompt",
            "prompt is an empty list: send at least one prompt",
        ));
    }
    if list.len() > MAX_PROMPTS {
        return Err(ApiError::invalid(
            "prompt",
            format!(
                "{} prompts in one request: send at most {MAX_PROMPTS}",
                list.len()
            ),
        ));
    }
    for (i, p) in list.iter().enumerate() {
        if let Prompt::Tokens(t) = p {
            if t.is_empty() {
                return Err(ApiError::invalid(
                    "prompt",
                    format!("prompt[{i}] is an empty list of token ids"),
                ));
            }
            if let Some(&id) = t.iter().find(|&&id| id as usize >= card.n_vocab) {
                return Err(ApiError::invalid(
                    "prompt",
                    format!(
                        "token id {id} is outside the vocabulary (0..{})",
                        card.n_vocab
                    ),
                ));
            }
        }
    }
    Ok(list)
}

/// One plan per prompt of a `/v1/completions` body.
pub fn completion_plans(
    c: &Common,
    r: CompletionRequest,
    card: &ModelCard,
    defaults: &Defaults,
) -> Result<Vec<Plan>, ApiError> {
    if r.echo == Some(true) {
        return Err(ApiError::invalid("echo", "echo is not supported"));
    }
    if r.suffix.as_ref().is_some_and(|s| !s.is_empty()) {
        return Err(ApiError::invalid("suffix", "suffix is not supported"));
    }
    if let Some(b) = r.best_of.filter(|&b| b != 1) {
        return Err(ApiError::invalid(
            "best_of",
            format!("best_of = {b}: only 1 is supported"),
        ));
    }
    if let Some(n) = r.logprobs.filter(|&n| n > 5) {
        return Err(ApiError::invalid(
            "logprobs",
            format!("logprobs = {n}: use 0..=5"),
        ));
    }
    // As llama-server (not OpenAI's 16): without a length, the server's -n, else until the
    // context is full.
    let max = length(
        &[("n_predict", c.n_predict), ("max_tokens", c.max_tokens)],
        defaults,
    )?;
    prompts(r.prompt, card)?
        .into_iter()
        .map(|p| {
            common_plan(
                c,
                card,
                p,
                max,
                r.logprobs.map(|n| n as usize),
                None,
                defaults,
            )
        })
        .collect()
}

/// A `/v1/completions` body with one prompt.
pub fn completion_plan(
    c: &Common,
    r: CompletionRequest,
    card: &ModelCard,
    defaults: &Defaults,
) -> Result<Plan, ApiError> {
    let mut plans = completion_plans(c, r, card, defaults)?;
    if plans.len() != 1 {
        return Err(ApiError::invalid("prompt", "send one prompt"));
    }
    Ok(plans.remove(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn card() -> ModelCard {
        ModelCard {
            id: "m".into(),
            aliases: vec!["m.gguf".into()],
            created: 0,
            n_ctx: 100,
            n_vocab: 50,
            format: OutputFormat::Plain,
            has_chat_template: true,
        }
    }

    fn chat(body: &str) -> Result<Plan, ApiError> {
        let (c, r) = parse_body::<ChatRequest>(body.as_bytes())?;
        chat_plan(&c, r, &card(), &Defaults::default())
    }

    fn param(e: ApiError) -> Option<String> {
        match e {
            ApiError::Invalid { param, .. } => param,
            _ => None,
        }
    }

    #[test]
    fn errors_name_the_field() {
        let e = chat(r#"{"messages": [{"role": "user", "content": "x"}], "temperature": "hot"}"#);
        assert_eq!(param(e.unwrap_err()).as_deref(), Some("temperature"));
        let e = chat(r#"{"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}"#);
        assert_eq!(
            param(e.unwrap_err()).as_deref(),
            Some("messages[0].content[0]")
        );
        let e = chat(r#"{"messages": [{"role": "user", "content": "x"}], "stop": ["ab", 3]}"#);
        assert_eq!(param(e.unwrap_err()).as_deref(), Some("stop"));
        let long = "s".repeat(600);
        let e = chat(&format!(
            r#"{{"messages": [{{"role": "user", "content": "x"}}], "stop": "{long}"}}"#
        ));
        assert_eq!(param(e.unwrap_err()).as_deref(), Some("stop"));
        let e = chat(
            r#"{"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "a"}, {"role": "assistant", "content": "b"}]}"#,
        );
        assert_eq!(param(e.unwrap_err()).as_deref(), Some("messages"));
        // Any model name is accepted (llama-server ignores it).
        assert!(chat(
            r#"{"model": "gpt-3.5-turbo", "messages": [{"role": "user", "content": "x"}]}"#
        )
        .is_ok());
        let e = chat(r#"{"messages": [{"role": "user", "content": "x"}], "max_tokens": 101}"#);
        assert_eq!(param(e.unwrap_err()).as_deref(), Some("max_tokens"));
    }

    #[test]
    fn accepts_what_clients_send() {
        let p = chat(
            r#"{"model": "m.gguf", "messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}],
                "seed": 18446744073709551615, "stop": "x", "stream": true, "stream_options": {"include_usage": true},
                "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}], "logprobs": true, "top_logprobs": 2,
                "chat_template_kwargs": {"enable_thinking": false}, "user": "ignored"}"#,
        )
        .unwrap();
        assert!(p.stream && p.include_usage);
        assert_eq!(p.stops, vec!["x".to_string()]);
        assert_eq!(p.gen.sampling.seed, u64::MAX);
        assert_eq!(p.gen.logprobs, Some(2));
        let Prompt::Chat {
            messages,
            template_vars,
        } = p.gen.prompt
        else {
            panic!("chat prompt");
        };
        assert_eq!(messages[0].text(), "a\nb");
        assert!(matches!(messages[0].content, Some(MessageContent::Text(_))));
        assert!(
            template_vars.contains_key("tools") && template_vars.contains_key("enable_thinking")
        );
        let (c, r) = parse_body::<CompletionRequest>(br#"{"prompt": ["hi"]}"#).unwrap();
        let p = completion_plan(&c, r, &card(), &Defaults::default()).unwrap();
        assert_eq!(
            p.gen.max_tokens, None,
            "until the context is full, as llama-server"
        );
        assert!(matches!(p.gen.prompt, Prompt::Text(ref t) if t == "hi"));
    }

    #[test]
    fn constraints_from_the_body() {
        let c = |extra: &str| {
            chat(&format!(
                r#"{{"messages": [{{"role": "user", "content": "x"}}]{extra}}}"#
            ))
            .map(|p| p.gen.constraint)
        };
        assert_eq!(c("").unwrap(), None);
        assert_eq!(
            c(r#", "grammar": "", "response_format": {"type": "text"}"#).unwrap(),
            None
        );
        assert!(matches!(
            c(r#", "grammar": "root ::= \"a\"""#).unwrap(),
            Some(Constraint::Lark {
                field: "grammar",
                ..
            })
        ));
        let Some(Constraint::JsonSchema { schema, field }) =
            c(r#", "response_format": {"type": "json_object"}"#).unwrap()
        else {
            panic!("json_object");
        };
        assert_eq!(
            (schema, field),
            (serde_json::json!({"type": "object"}), "response_format")
        );
        let Some(Constraint::JsonSchema { schema, .. }) = c(
            r#", "response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "integer"}}}"#,
        )
        .unwrap() else {
            panic!("json_schema");
        };
        assert_eq!(schema, serde_json::json!({"type": "integer"}));
        for (extra, field) in [
            (r#", "grammar": "root ::= x""#, "grammar"),
            (
                r#", "grammar": "root ::= \"a\"", "json_schema": {}"#,
                "grammar",
            ),
            (r#", "json_schema": 3"#, "json_schema"),
            (
                r#", "response_format": {"type": "yaml"}"#,
                "response_format",
            ),
            (r#", "tool_choice": "required""#, "tool_choice"),
            (r#", "tool_choice": "sometimes""#, "tool_choice"),
        ] {
            assert_eq!(
                param(c(extra).unwrap_err()).as_deref(),
                Some(field),
                "{extra}"
            );
        }
    }
}
