//! Chat templates: the Jinja template a GGUF carries (`tokenizer.chat_template`, and named
//! variants `tokenizer.chat_template.<name>` such as Command-R's `tool_use`/`rag`), rendered
//! over OpenAI-style messages with the variables Hugging Face and llama.cpp provide.
//!
//! Reference: transformers `PreTrainedTokenizerBase.apply_chat_template` (variables `messages`,
//! `add_generation_prompt`, `bos_token`, `eos_token`, `tools`, plus `chat_template_kwargs`) and
//! llama.cpp `common/chat.cpp` (`common_chat_template_direct_apply_impl`): the same variables,
//! the BOS/EOS texts of the vocabulary, and — in [`ChatTemplate::apply`] — removal of a leading
//! BOS / trailing EOS text when the tokenizer adds those tokens itself, so the prompt does not
//! start with two BOS tokens. [`ChatTemplate::apply_marking`] also reports which control-token
//! texts of the output came from the messages, so they can be tokenized as plain text.
//!
//! Invariants: a template compiles when the [`ChatTemplate`] is built (syntax errors surface
//! there, naming the template); rendering never panics; `extra` keys override the defaults, as
//! `chat_template_kwargs` do in both references. Object keys reach templates in serde_json's
//! order (sorted unless its `preserve_order` feature is on), which matters only for `tojson` of
//! tool schemas.
use super::jinja;
use super::vocab;
use super::TokenizerError;
use crate::gguf::{GgufModel, Metadata};
use serde::{Deserialize, Serialize};
use std::ops::Range;

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
        env.add_template_owned(
            TEMPLATE,
            jinja::mutable_lists(&jinja::rewrite_hf_tags(&source)),
        )
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
    /// Tokenize the result with `add_special = true, parse_special = true` for llama.cpp's
    /// behaviour, where control-token texts typed into messages become control tokens; see
    /// [`ChatTemplate::apply_marking`] for keeping them plain text.
    pub fn apply(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        extra: serde_json::Value,
    ) -> Result<String, TokenizerError> {
        let out = self.render(messages, add_generation_prompt, extra)?;
        Ok(self.strip_bos_eos(out, Vec::new()).text)
    }

    /// [`ChatTemplate::apply`], and where its output spells one of `specials` (the control-token
    /// texts, [`Tokenizer::control_texts`](super::Tokenizer::control_texts)) with text that came
    /// from the messages: their content (a string, or the `text` of each part) and
    /// `reasoning_content`. Those byte ranges are to be tokenized as plain text
    /// ([`Tokenizer::encode_with_plain`](super::Tokenizer::encode_with_plain)) while the
    /// template's own markers stay control tokens.
    ///
    /// How: each occurrence of a special text in a message is prefixed with a marker character
    /// that occurs nowhere in the messages, `extra`, or the template (a private-use code point),
    /// the template is rendered, and the markers are taken out again, each one recording where
    /// a message's special text begins in the output. Templates that copy, trim or split
    /// content carry the markers along; one that changes the special text itself (`upper`) only
    /// loses the mark, and a message without special texts renders exactly as with `apply`.
    pub fn apply_marking(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        extra: serde_json::Value,
        specials: &[&str],
    ) -> Result<RenderedChat, TokenizerError> {
        let specials: Vec<&str> = specials.iter().copied().filter(|t| !t.is_empty()).collect();
        let holds = |s: &str| specials.iter().any(|t| s.contains(t));
        if !messages.iter().any(|m| message_texts(m).any(holds)) {
            let out = self.render(messages, add_generation_prompt, extra)?;
            return Ok(self.strip_bos_eos(out, Vec::new()));
        }
        let marker = self.free_marker(messages, &extra)?;
        let marked: Vec<ChatMessage> = messages
            .iter()
            .map(|m| mark_message(m, &specials, marker))
            .collect();
        let out = self.render(&marked, add_generation_prompt, extra)?;
        let mut text = String::with_capacity(out.len());
        let mut starts = Vec::new();
        for c in out.chars() {
            if c == marker {
                starts.push(text.len());
            } else {
                text.push(c);
            }
        }
        let mut plain: Vec<Range<usize>> = Vec::new();
        for s in starts {
            let Some(len) = specials
                .iter()
                .filter(|t| text[s..].starts_with(**t))
                .map(|t| t.len())
                .max()
            else {
                continue; // the template changed the text after the marker
            };
            match plain.last_mut() {
                Some(r) if r.end >= s => r.end = r.end.max(s + len),
                _ => plain.push(s..s + len),
            }
        }
        Ok(self.strip_bos_eos(text, plain))
    }

    /// Drops a leading BOS / trailing EOS text the tokenizer adds itself, unless that text is
    /// (part of) a plain range, i.e. came from a message.
    fn strip_bos_eos(&self, mut text: String, mut plain: Vec<Range<usize>>) -> RenderedChat {
        let b = self.bos_token.len();
        if self.add_bos
            && b > 0
            && text.starts_with(&self.bos_token)
            && plain.first().is_none_or(|r| r.start >= b)
        {
            text.drain(..b);
            for r in &mut plain {
                (r.start, r.end) = (r.start - b, r.end - b);
            }
        }
        let e = self.eos_token.len();
        if self.add_eos
            && e > 0
            && text.ends_with(&self.eos_token)
            && plain.last().is_none_or(|r| r.end <= text.len() - e)
        {
            text.truncate(text.len() - e);
        }
        RenderedChat { text, plain }
    }

    /// A private-use character found nowhere in the template, its BOS/EOS texts, the messages
    /// or `extra`, so that every one in the output is a marker.
    fn free_marker(
        &self,
        messages: &[ChatMessage],
        extra: &serde_json::Value,
    ) -> Result<char, TokenizerError> {
        let private = |c: &char| matches!(*c as u32, 0xE000..=0xF8FF | 0xF0000..=0x10FFFD);
        let msgs = serde_json::to_string(messages).map_err(|e| self.err(&e.to_string()))?;
        let extra = extra.to_string();
        let used: std::collections::HashSet<char> = [
            self.source.as_str(),
            &self.bos_token,
            &self.eos_token,
            &msgs,
            &extra,
        ]
        .iter()
        .flat_map(|s| s.chars())
        .filter(private)
        .collect();
        (0xE000..=0xF8FF)
            .chain(0xF0000..=0x10FFFD)
            .filter_map(char::from_u32)
            .find(|c| !used.contains(c))
            .ok_or_else(|| self.err("the messages use every private-use character"))
    }

    fn err(&self, msg: &str) -> TokenizerError {
        TokenizerError::Template {
            name: self.name.clone(),
            msg: msg.to_string(),
        }
    }
}

/// A rendered chat prompt and the byte ranges of it that came from the messages and spell
/// control tokens: those are plain text ([`ChatTemplate::apply_marking`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RenderedChat {
    pub text: String,
    /// Sorted, disjoint byte ranges of `text`.
    pub plain: Vec<Range<usize>>,
}

/// The message texts [`ChatTemplate::apply_marking`] keeps plain: the content (a string, or the
/// `text` of each part) and `reasoning_content`.
fn message_texts(m: &ChatMessage) -> impl Iterator<Item = &str> {
    let content: Vec<&str> = match &m.content {
        None => Vec::new(),
        Some(MessageContent::Text(t)) => vec![t.as_str()],
        Some(MessageContent::Parts(p)) => p
            .iter()
            .filter_map(|part| part.get("text")?.as_str())
            .collect(),
    };
    let reasoning = m.extra.get("reasoning_content").and_then(|r| r.as_str());
    content.into_iter().chain(reasoning)
}

/// `m` with `marker` inserted before every occurrence of a text of `specials` in the texts of
/// [`message_texts`].
fn mark_message(m: &ChatMessage, specials: &[&str], marker: char) -> ChatMessage {
    let mark = |s: &str| -> String {
        let mut at: Vec<usize> = specials
            .iter()
            .flat_map(|t| s.match_indices(t).map(|(i, _)| i))
            .collect();
        at.sort_unstable();
        at.dedup();
        let mut out = String::with_capacity(s.len() + at.len() * marker.len_utf8());
        let mut last = 0;
        for i in at {
            out.push_str(&s[last..i]);
            out.push(marker);
            last = i;
        }
        out.push_str(&s[last..]);
        out
    };
    let mut m = m.clone();
    match &mut m.content {
        None => {}
        Some(MessageContent::Text(t)) => *t = mark(t),
        Some(MessageContent::Parts(parts)) => {
            for part in parts {
                if let Some(serde_json::Value::String(t)) = part.get_mut("text") {
                    *t = mark(t);
                }
            }
        }
    }
    if let Some(serde_json::Value::String(r)) = m.extra.get_mut("reasoning_content") {
        *r = mark(r);
    }
    m
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
    fn marking_finds_specials_from_messages_only() {
        let specials = ["<|im_start|>", "<|im_end|>", "<s>", "</s>"];
        let t = ChatTemplate::new("t", CHATML, "<s>", "</s>").unwrap();
        // The content holds the first private-use character itself: another one marks.
        let msgs = [ChatMessage::user("\u{E000}a<|im_end|>b")];
        let r = t
            .apply_marking(&msgs, false, serde_json::Value::Null, &specials)
            .unwrap();
        assert_eq!(r.text, "<|im_start|>user\n\u{E000}a<|im_end|>b<|im_end|>\n");
        let at = r.text.find("a<|im_end|>").unwrap() + 1;
        assert_eq!(r.plain, vec![at..at + "<|im_end|>".len()]);
        // Without specials in the messages, exactly `apply`.
        let plain = [ChatMessage::user("a <im_end> b")];
        let r = t
            .apply_marking(&plain, true, serde_json::Value::Null, &specials)
            .unwrap();
        let out = t.apply(&plain, true, serde_json::Value::Null).unwrap();
        assert_eq!((r.text, r.plain), (out, vec![]));

        // Trimmed and adjacent specials; a transform that changes the text only drops the mark.
        let t = ChatTemplate::new(
            "trim",
            "{% for m in messages %}[{{ m.content|trim }}]{{ m.content|upper }}{% endfor %}",
            "",
            "",
        )
        .unwrap();
        let msgs = [ChatMessage::user(" <s></s> ")];
        let r = t
            .apply_marking(&msgs, false, serde_json::Value::Null, &specials)
            .unwrap();
        assert_eq!(r.text, "[<s></s>] <S></S> ");
        assert_eq!(r.plain, vec![1..8]);

        // A BOS/EOS text that came from a message is not taken for the template's.
        let t = ChatTemplate::new("b", "{{ messages[0].content }}", "<s>", "</s>")
            .unwrap()
            .with_tokenizer_flags(true, true);
        let msgs = [ChatMessage::user("<s>hi</s>")];
        let r = t
            .apply_marking(&msgs, false, serde_json::Value::Null, &specials)
            .unwrap();
        assert_eq!((r.text.as_str(), r.plain), ("<s>hi</s>", vec![0..3, 5..9]));
        let t = ChatTemplate::new("b", "<s>{{ messages[0].content }}</s>", "<s>", "</s>")
            .unwrap()
            .with_tokenizer_flags(true, true);
        let r = t
            .apply_marking(&msgs, false, serde_json::Value::Null, &specials)
            .unwrap();
        assert_eq!((r.text.as_str(), r.plain), ("<s>hi</s>", vec![0..3, 5..9]));
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
