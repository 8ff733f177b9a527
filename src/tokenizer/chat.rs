//! Chat templates: the Jinja template a GGUF carries (`tokenizer.chat_template`, and named
//! variants `tokenizer.chat_template.<name>` such as Command-R's `tool_use`/`rag`), rendered
//! over OpenAI-style messages with the variables Hugging Face and llama.cpp provide.
//!
//! Reference: transformers `PreTrainedTokenizerBase.apply_chat_template` (variables `messages`,
//! `add_generation_prompt`, `bos_token`, `eos_token`, `tools`, plus `chat_template_kwargs`) and
//! llama.cpp `common/chat.cpp` (`common_chat_template_direct_apply_impl`): the same variables,
//! the BOS/EOS texts of the vocabulary, and — in [`ChatTemplate::apply`] — removal of a leading
//! BOS / trailing EOS text when the tokenizer adds those tokens itself, so the prompt does not
//! start with two BOS tokens.
//!
//! Invariants: a template compiles when the [`ChatTemplate`] is built (syntax errors surface
//! there, naming the template); rendering never panics; `extra` keys override the defaults, as
//! `chat_template_kwargs` do in both references. Object keys reach templates in serde_json's
//! order (sorted unless its `preserve_order` feature is on), which matters only for `tojson` of
//! tool schemas.
use super::jinja;
use super::vocab;
use super::TokenizerError;
use crate::gguf::GgufModel;
use serde::{Deserialize, Serialize};

/// A message's content: plain text, or OpenAI content parts (`[{"type": "text", ...}]`), which
/// templates that support them iterate.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum MessageContent {
    Text(String),
    Parts(Vec<serde_json::Value>),
}

/// One chat message. Fields other than `role` and `content` (`tool_calls`, `tool_call_id`,
/// `name`, `reasoning_content`, ...) are kept in `extra` and passed to the template as they are.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    #[serde(default)]
    pub content: Option<MessageContent>,
    #[serde(flatten)]
    pub extra: serde_json::Map<String, serde_json::Value>,
}

impl ChatMessage {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Self {
            role: role.into(),
            content: Some(MessageContent::Text(content.into())),
            extra: serde_json::Map::new(),
        }
    }
    pub fn system(content: impl Into<String>) -> Self {
        Self::new("system", content)
    }
    pub fn user(content: impl Into<String>) -> Self {
        Self::new("user", content)
    }
    pub fn assistant(content: impl Into<String>) -> Self {
        Self::new("assistant", content)
    }
    /// The text of the content: the "text" parts joined by newlines (as llama.cpp flattens
    /// parts for templates that only take strings), "" without content.
    pub fn text(&self) -> String {
        let parts = match &self.content {
            None => return String::new(),
            Some(MessageContent::Text(t)) => return t.clone(),
            Some(MessageContent::Parts(p)) => p,
        };
        let field = |part: &serde_json::Value, key: &str| part.get(key)?.as_str().map(String::from);
        let texts: Vec<String> = parts
            .iter()
            .filter(|part| field(part, "type").as_deref() == Some("text"))
            .filter_map(|part| field(part, "text"))
            .collect();
        texts.join("\n")
    }
}

/// A compiled chat template with the special-token texts it renders with.
pub struct ChatTemplate {
    name: String,
    source: String,
    bos_token: String,
    eos_token: String,
    add_bos: bool,
    add_eos: bool,
    env: minijinja::Environment<'static>,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("name", &self.name)
            .field("bos_token", &self.bos_token)
            .field("eos_token", &self.eos_token)
            .field("add_bos", &self.add_bos)
            .field("add_eos", &self.add_eos)
            .finish_non_exhaustive()
    }
}

const TEMPLATE: &str = "chat";

impl ChatTemplate {
    /// Compiles `source`. `name` only labels errors. The tokenizer is assumed to add neither BOS
    /// nor EOS (see [`ChatTemplate::with_tokenizer_flags`]).
    pub fn new(
        name: impl Into<String>,
        source: impl Into<String>,
        bos_token: impl Into<String>,
        eos_token: impl Into<String>,
    ) -> Result<Self, TokenizerError> {
        let (name, source) = (name.into(), source.into());
        let mut env = jinja::environment();
        env.add_template_owned(TEMPLATE, jinja::rewrite_hf_tags(&source))
            .map_err(|e| template_err(&name, &e))?;
        Ok(Self {
            name,
            source,
            bos_token: bos_token.into(),
            eos_token: eos_token.into(),
            add_bos: false,
            add_eos: false,
            env,
        })
    }

    /// Whether the tokenizer adds BOS / EOS itself (`tokenizer.ggml.add_bos_token`, ...); then
    /// [`ChatTemplate::apply`] drops the template's own leading BOS / trailing EOS text.
    pub fn with_tokenizer_flags(mut self, add_bos: bool, add_eos: bool) -> Self {
        (self.add_bos, self.add_eos) = (add_bos, add_eos);
        self
    }

    /// The default template of `model` (`tokenizer.chat_template`), with the vocabulary's BOS
    /// and EOS texts and add-BOS/EOS flags.
    pub fn from_gguf(model: &GgufModel) -> Result<Self, TokenizerError> {
        Self::from_gguf_key(model, "tokenizer.chat_template", "default")
    }

    /// The named template `tokenizer.chat_template.<name>` of `model` ("default" = the default).
    pub fn from_gguf_named(model: &GgufModel, name: &str) -> Result<Self, TokenizerError> {
        if name == "default" {
            return Self::from_gguf(model);
        }
        Self::from_gguf_key(model, &format!("tokenizer.chat_template.{name}"), name)
    }

    /// The template names `model` carries: "default" if it has `tokenizer.chat_template`, then
    /// every `tokenizer.chat_template.<name>`.
    pub fn names_in_gguf(model: &GgufModel) -> Vec<String> {
        let mut names = Vec::new();
        if model.get_str("tokenizer.chat_template").is_some() {
            names.push("default".to_string());
        }
        for key in model.metadata().keys() {
            if let Some(name) = key.strip_prefix("tokenizer.chat_template.") {
                if model.get_str(key).is_some() {
                    names.push(name.to_string());
                }
            }
        }
        names
    }

    fn from_gguf_key(model: &GgufModel, key: &str, name: &str) -> Result<Self, TokenizerError> {
        let source = model.get_str(key).ok_or_else(|| TokenizerError::Key {
            path: model.path().to_path_buf(),
            key: key.to_string(),
            msg: match model.get(key) {
                None => "missing (the model has no such chat template)".to_string(),
                Some(v) => format!("is {}, expected a string", v.type_name()),
            },
        })?;
        let t = vocab::template_tokens(model)?;
        let label = format!("'{name}' of {}", model.path().display());
        Ok(Self::new(label, source, t.bos, t.eos)?.with_tokenizer_flags(t.add_bos, t.add_eos))
    }

    pub fn name(&self) -> &str {
        &self.name
    }
    pub fn source(&self) -> &str {
        &self.source
    }
    pub fn bos_token(&self) -> &str {
        &self.bos_token
    }
    pub fn eos_token(&self) -> &str {
        &self.eos_token
    }

    /// The template's output, as Hugging Face's `apply_chat_template(tokenize=False)` returns it.
    /// `extra` (a JSON object, or null) holds `chat_template_kwargs` such as `enable_thinking`,
    /// `tools`, `reasoning_effort`; its keys override the defaults.
    pub fn render(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        extra: serde_json::Value,
    ) -> Result<String, TokenizerError> {
        let mut ctx = serde_json::Map::new();
        let msgs = serde_json::to_value(messages).map_err(|e| self.err(&e.to_string()))?;
        ctx.insert("messages".into(), msgs);
        ctx.insert("add_generation_prompt".into(), add_generation_prompt.into());
        ctx.insert("bos_token".into(), self.bos_token.clone().into());
        ctx.insert("eos_token".into(), self.eos_token.clone().into());
        match extra {
            serde_json::Value::Null => {}
            serde_json::Value::Object(kv) => ctx.extend(kv),
            other => return Err(self.err(&format!("extra must be a JSON object, not {other}"))),
        }
        let tmpl = self
            .env
            .get_template(TEMPLATE)
            .map_err(|e| template_err(&self.name, &e))?;
        tmpl.render(jinja::from_json(&serde_json::Value::Object(ctx)))
            .map_err(|e| template_err(&self.name, &e))
    }

    /// The prompt llama.cpp's server would tokenize: [`ChatTemplate::render`] without the leading
    /// BOS text when the tokenizer adds BOS, and without a trailing EOS text when it adds EOS.
    /// Tokenize the result with `add_special = true, parse_special = true`.
    pub fn apply(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        extra: serde_json::Value,
    ) -> Result<String, TokenizerError> {
        let mut out = self.render(messages, add_generation_prompt, extra)?;
        if self.add_bos && !self.bos_token.is_empty() && out.starts_with(&self.bos_token) {
            out.drain(..self.bos_token.len());
        }
        if self.add_eos && !self.eos_token.is_empty() && out.ends_with(&self.eos_token) {
            out.truncate(out.len() - self.eos_token.len());
        }
        Ok(out)
    }

    fn err(&self, msg: &str) -> TokenizerError {
        TokenizerError::Template {
            name: self.name.clone(),
            msg: msg.to_string(),
        }
    }
}

fn template_err(name: &str, e: &minijinja::Error) -> TokenizerError {
    let mut msg = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        msg.push_str(&format!(": {s}"));
        source = s.source();
    }
    TokenizerError::Template {
        name: name.to_string(),
        msg,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CHATML: &str = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

    #[test]
    fn renders_chatml_and_strips_bos() {
        let t = ChatTemplate::new("t", CHATML, "<s>", "</s>").unwrap();
        let msgs = [ChatMessage::system("be brief"), ChatMessage::user("hi")];
        let out = t.render(&msgs, true, serde_json::Value::Null).unwrap();
        assert_eq!(out, "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
        let b = ChatTemplate::new("b", "{{ bos_token }}x{{ eos_token }}", "<s>", "</s>").unwrap();
        assert_eq!(
            b.apply(&msgs, false, serde_json::Value::Null).unwrap(),
            "<s>x</s>"
        );
        let b = b.with_tokenizer_flags(true, true);
        assert_eq!(b.apply(&msgs, false, serde_json::Value::Null).unwrap(), "x");
    }

    #[test]
    fn errors_name_the_template() {
        let e = ChatTemplate::new("broken.jinja", "{% if %}", "", "").unwrap_err();
        assert!(e.to_string().contains("broken.jinja"), "{e}");
        let t = ChatTemplate::new("r.jinja", "{{ raise_exception('no system role') }}", "", "")
            .unwrap();
        let e = t.render(&[], false, serde_json::Value::Null).unwrap_err();
        assert!(e.to_string().contains("no system role"), "{e}");
        let t = ChatTemplate::new(
            "k",
            "{{ enable_thinking }}|{{ 'a b'.split()|length }}",
            "",
            "",
        )
        .unwrap();
        let out = t
            .render(&[], false, serde_json::json!({"enable_thinking": false}))
            .unwrap();
        assert_eq!(out, "False|2"); // Python prints booleans capitalised, as Jinja2 does
        assert!(t.render(&[], false, serde_json::json!([1])).is_err());
    }

    #[test]
    fn messages_round_trip_through_serde() {
        let m: ChatMessage = serde_json::from_value(serde_json::json!({
            "role": "assistant", "content": null,
            "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": "{}"}}]
        }))
        .unwrap();
        assert!(m.content.is_none() && m.extra.contains_key("tool_calls"));
        let parts: ChatMessage = serde_json::from_value(serde_json::json!({
            "role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
        }))
        .unwrap();
        assert_eq!(parts.text(), "a\nb");
        assert_eq!(
            serde_json::to_value(ChatMessage::user("x")).unwrap()["content"],
            "x"
        );
    }
}
