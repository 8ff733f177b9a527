//! Streaming parsers of generated text: stop strings ([`StopMatcher`]) and the split of the
//! output into content, reasoning and tool calls ([`OutputParser`]) for the formats of
//! [`OutputFormat`]. Both take text piece by piece and hold back only what could still be the
//! start of a marker, so streamed deltas concatenate to exactly the non-streamed message.
//!
//! Reference: llama.cpp `common/chat.cpp` (`common_chat_parse_hermes_2_pro` for Qwen3's
//! `<tool_call>` JSON, `common_chat_parse_gpt_oss` for harmony channels) and OpenAI's harmony
//! format description. Invariants: no input panics; text that fails to parse as a tool call is
//! returned as content rather than dropped; nothing is emitted twice.
use super::api::OutputFormat;

/// A parsed piece of output.
#[derive(Debug, Clone, PartialEq)]
pub enum Piece {
    Content(String),
    Reasoning(String),
    /// `arguments` is a JSON text (OpenAI's `function.arguments`).
    ToolCall {
        name: String,
        arguments: String,
    },
}

/// Finds stop strings in streamed text.
pub struct StopMatcher {
    stops: Vec<String>,
    pending: String,
    /// The stop string that ended the output, once one has.
    pub hit: Option<String>,
}

impl StopMatcher {
    pub fn new(stops: Vec<String>) -> Self {
        let stops = stops.into_iter().filter(|s| !s.is_empty()).collect();
        Self {
            stops,
            pending: String::new(),
            hit: None,
        }
    }

    /// Adds `text`; returns what may be emitted and whether a stop string was reached (the stop
    /// string and everything after it are dropped).
    pub fn push(&mut self, text: &str) -> (String, bool) {
        self.pending.push_str(text);
        if let Some((pos, word)) = find_first(&self.pending, &self.stops) {
            self.hit = Some(word.to_string());
            let out = self.pending[..pos].to_string();
            self.pending.clear();
            return (out, true);
        }
        let keep = partial_suffix(&self.pending, &self.stops);
        let out = self.pending[..self.pending.len() - keep].to_string();
        self.pending.drain(..self.pending.len() - keep);
        (out, false)
    }

    /// The text held back (the output ended without completing a stop string).
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.pending)
    }
}

/// The earliest occurrence of any of `markers` in `s`: (byte offset, marker).
fn find_first<'m, S: AsRef<str>>(s: &str, markers: &'m [S]) -> Option<(usize, &'m str)> {
    markers
        .iter()
        .filter_map(|m| s.find(m.as_ref()).map(|p| (p, m.as_ref())))
        .min_by_key(|&(p, m)| (p, usize::MAX - m.len()))
}

/// Length of the longest suffix of `s` that is a proper prefix of one of `markers`.
fn partial_suffix<S: AsRef<str>>(s: &str, markers: &[S]) -> usize {
    let mut best = 0;
    for m in markers {
        let m = m.as_ref();
        for (i, _) in s
            .char_indices()
            .rev()
            .take_while(|(i, _)| s.len() - i < m.len())
        {
            if m.starts_with(&s[i..]) {
                best = best.max(s.len() - i);
            }
        }
    }
    best
}

const THINK_OPEN: &str = "<think>";
const THINK_CLOSE: &str = "</think>";
const CALL_OPEN: &str = "<tool_call>";
const CALL_CLOSE: &str = "</tool_call>";
const H_MESSAGE: &str = "<|message|>";
const H_ENDS: [&str; 4] = ["<|end|>", "<|return|>", "<|call|>", "<|start|>"];

/// Whether a rendered prompt ends inside an open `<think>` block.
pub fn prompt_opens_reasoning(format: OutputFormat, prompt: &str) -> bool {
    matches!(format, OutputFormat::Think | OutputFormat::Qwen3)
        && prompt
            .rfind(THINK_OPEN)
            .is_some_and(|p| !prompt[p..].contains(THINK_CLOSE))
}

#[derive(Debug, Clone, PartialEq)]
enum State {
    Content,
    Reasoning,
    ToolCall(String),
    /// Harmony: collecting a message header up to `<|message|>`.
    Header(String),
    /// Harmony: a message body of a channel, to a recipient (tool call) or not.
    Body {
        channel: String,
        recipient: Option<String>,
        args: String,
    },
}

/// Splits generated text into [`Piece`]s.
pub struct OutputParser {
    format: OutputFormat,
    state: State,
    buf: String,
    /// Drop whitespace at the start of content that follows reasoning.
    trim_start: bool,
    /// Harmony: whether any `<|message|>` was seen (otherwise the raw text is content).
    seen_message: bool,
}

impl OutputParser {
    pub fn new(format: OutputFormat, opens_reasoning: bool) -> Self {
        let state = match format {
            OutputFormat::Harmony => State::Header(String::new()),
            _ if opens_reasoning => State::Reasoning,
            _ => State::Content,
        };
        Self {
            format,
            state,
            buf: String::new(),
            trim_start: false,
            seen_message: false,
        }
    }

    fn markers(&self) -> &'static [&'static str] {
        match (&self.state, self.format) {
            (State::Content, OutputFormat::Qwen3) => &[THINK_OPEN, CALL_OPEN],
            (State::Content, OutputFormat::Think) => &[THINK_OPEN],
            (State::Content, _) => &[],
            (State::Reasoning, _) => &[THINK_CLOSE],
            (State::ToolCall(_), _) => &[CALL_CLOSE],
            (State::Header(_), _) => &[H_MESSAGE],
            (State::Body { .. }, _) => &H_ENDS,
        }
    }

    /// Adds generated text; returns the pieces now complete.
    pub fn push(&mut self, text: &str) -> Vec<Piece> {
        self.buf.push_str(text);
        let mut out = Vec::new();
        loop {
            let markers = self.markers();
            match find_first(&self.buf, markers) {
                Some((pos, marker)) => {
                    let before: String = self.buf.drain(..pos + marker.len()).collect();
                    self.emit(&before[..pos], &mut out);
                    self.transition(marker, &mut out);
                }
                None => {
                    let keep = partial_suffix(&self.buf, markers);
                    let text: String = self.buf.drain(..self.buf.len() - keep).collect();
                    self.emit(&text, &mut out);
                    return out;
                }
            }
        }
    }

    /// The output ended: flushes what is held back (an unterminated tool call is parsed if it
    /// is complete JSON, as models often stop right after it).
    pub fn finish(&mut self) -> Vec<Piece> {
        let rest = std::mem::take(&mut self.buf);
        let mut out = Vec::new();
        self.emit(&rest, &mut out);
        match std::mem::replace(&mut self.state, State::Content) {
            State::ToolCall(body) => out.push(qwen_call(&body)),
            State::Body {
                recipient: Some(name),
                args,
                ..
            } => out.push(harmony_call(&name, &args)),
            State::Header(h) if !self.seen_message && !h.is_empty() => {
                out.push(Piece::Content(h));
            }
            _ => {}
        }
        out
    }

    fn emit(&mut self, text: &str, out: &mut Vec<Piece>) {
        if text.is_empty() {
            return;
        }
        match &mut self.state {
            State::Content => {
                let t = if self.trim_start {
                    text.trim_start()
                } else {
                    text
                };
                if !t.is_empty() {
                    self.trim_start = false;
                    push_merged(out, Piece::Content(t.to_string()));
                }
            }
            State::Reasoning => push_merged(out, Piece::Reasoning(text.to_string())),
            State::ToolCall(body) => body.push_str(text),
            State::Header(h) => h.push_str(text),
            State::Body {
                channel,
                recipient,
                args,
            } => match (recipient.is_some(), channel.as_str()) {
                (true, _) => args.push_str(text),
                (false, "analysis") => push_merged(out, Piece::Reasoning(text.to_string())),
                (false, _) => push_merged(out, Piece::Content(text.to_string())),
            },
        }
    }

    fn transition(&mut self, marker: &str, out: &mut Vec<Piece>) {
        let next = match (std::mem::replace(&mut self.state, State::Content), marker) {
            (State::Content, THINK_OPEN) => State::Reasoning,
            (State::Content, CALL_OPEN) => State::ToolCall(String::new()),
            (State::Reasoning, _) => {
                self.trim_start = true;
                State::Content
            }
            (State::ToolCall(body), _) => {
                out.push(qwen_call(&body));
                self.trim_start = true;
                State::Content
            }
            (State::Header(h), _) => {
                self.seen_message = true;
                let (channel, recipient) = harmony_header(&h);
                State::Body {
                    channel,
                    recipient,
                    args: String::new(),
                }
            }
            (
                State::Body {
                    recipient: Some(name),
                    args,
                    ..
                },
                _,
            ) => {
                out.push(harmony_call(&name, &args));
                State::Header(String::new())
            }
            (State::Body { .. }, _) => State::Header(String::new()),
            (s, _) => s,
        };
        self.state = next;
    }
}

/// Appends `p`, merging it into the last piece when both are text of the same kind.
fn push_merged(out: &mut Vec<Piece>, p: Piece) {
    match (out.last_mut(), p) {
        (Some(Piece::Content(a)), Piece::Content(b)) => a.push_str(&b),
        (Some(Piece::Reasoning(a)), Piece::Reasoning(b)) => a.push_str(&b),
        (_, p) => out.push(p),
    }
}

/// A Qwen3 / Hermes tool call body: `{"name": ..., "arguments": {...}}`; anything else is
/// returned as content, tags included.
fn qwen_call(body: &str) -> Piece {
    #[derive(serde::Deserialize)]
    struct Call {
        name: String,
        #[serde(default)]
        arguments: serde_json::Value,
    }
    match serde_json::from_str::<Call>(body.trim()) {
        Ok(c) => Piece::ToolCall {
            name: c.name,
            arguments: match c.arguments {
                serde_json::Value::String(s) => s,
                serde_json::Value::Null => "{}".to_string(),
                v => v.to_string(),
            },
        },
        Err(_) => Piece::Content(format!("{CALL_OPEN}{body}{CALL_CLOSE}")),
    }
}

fn harmony_call(name: &str, args: &str) -> Piece {
    Piece::ToolCall {
        name: name.to_string(),
        arguments: args.trim().to_string(),
    }
}

/// Channel and recipient of a harmony header such as
/// `<|start|>assistant to=functions.get_weather<|channel|>commentary <|constrain|>json`.
fn harmony_header(h: &str) -> (String, Option<String>) {
    let channel = h
        .split("<|channel|>")
        .nth(1)
        .and_then(|rest| rest.split(|c: char| c.is_whitespace() || c == '<').next())
        .unwrap_or("")
        .to_string();
    let recipient = h.split_whitespace().find_map(|w| {
        let w = w.split("<|").next().unwrap_or(w);
        let to = w.strip_prefix("to=")?;
        let to = to.split("<|").next().unwrap_or(to);
        Some(to.strip_prefix("functions.").unwrap_or(to).to_string())
    });
    let recipient = recipient.or_else(|| {
        // `to=` glued to a marker: `...<|channel|>commentary to=functions.f<|constrain|>json`
        let p = h.find("to=")?;
        let to: String = h[p + 3..]
            .chars()
            .take_while(|c| !c.is_whitespace() && *c != '<')
            .collect();
        Some(to.strip_prefix("functions.").unwrap_or(&to).to_string())
    });
    (channel, recipient.filter(|r| !r.is_empty()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `text` in pieces of every size from 1 to 7 bytes (at char boundaries) and checks
    /// the result does not depend on the split.
    fn parse(format: OutputFormat, open: bool, text: &str) -> Vec<Piece> {
        let whole = {
            let mut p = OutputParser::new(format, open);
            let mut v = p.push(text);
            v.extend(p.finish());
            merge(v)
        };
        let chars: Vec<char> = text.chars().collect();
        for step in 1..=7 {
            let mut p = OutputParser::new(format, open);
            let mut v = Vec::new();
            for c in chars.chunks(step) {
                v.extend(p.push(&c.iter().collect::<String>()));
            }
            v.extend(p.finish());
            assert_eq!(merge(v), whole, "split by {step}");
        }
        whole
    }

    fn merge(v: Vec<Piece>) -> Vec<Piece> {
        let mut out = Vec::new();
        for p in v {
            push_merged(&mut out, p);
        }
        out
    }

    fn content(s: &str) -> Piece {
        Piece::Content(s.into())
    }
    fn reasoning(s: &str) -> Piece {
        Piece::Reasoning(s.into())
    }

    #[test]
    fn qwen3_think_and_tool_calls() {
        let out = parse(
            OutputFormat::Qwen3,
            false,
            "<think>\nuser wants weather\n</think>\n\nLet me check.<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"f\", \"arguments\": {}}",
        );
        assert_eq!(
            out,
            vec![
                reasoning("\nuser wants weather\n"),
                content("Let me check."),
                Piece::ToolCall {
                    name: "get_weather".into(),
                    arguments: "{\"city\":\"Paris\"}".into()
                },
                Piece::ToolCall {
                    name: "f".into(),
                    arguments: "{}".into()
                },
            ]
        );
        // Opened by the prompt; a broken call stays visible as content.
        let out = parse(
            OutputFormat::Qwen3,
            true,
            "hmm</think>ok <tool_call>not json</tool_call>",
        );
        assert_eq!(
            out,
            vec![
                reasoning("hmm"),
                content("ok <tool_call>not json</tool_call>")
            ]
        );
        assert_eq!(
            parse(OutputFormat::Plain, false, "<think>x</think> <"),
            vec![content("<think>x</think> <")]
        );
    }

    #[test]
    fn harmony_channels_and_calls() {
        let out = parse(
            OutputFormat::Harmony,
            false,
            "<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\":\"Paris\"}<|call|>",
        );
        assert_eq!(
            out,
            vec![
                reasoning("Need weather."),
                Piece::ToolCall {
                    name: "get_weather".into(),
                    arguments: "{\"city\":\"Paris\"}".into()
                }
            ]
        );
        let out = parse(
            OutputFormat::Harmony,
            false,
            "<|channel|>analysis<|message|>think<|end|><|start|>assistant<|channel|>final<|message|>Hello!",
        );
        assert_eq!(out, vec![reasoning("think"), content("Hello!")]);
        // Unmarked text (a model that ignores the format) is still returned.
        assert_eq!(
            parse(OutputFormat::Harmony, false, "just text"),
            vec![content("just text")]
        );
        // Unterminated call at the end of the output.
        let out = parse(
            OutputFormat::Harmony,
            false,
            "<|start|>assistant to=functions.f<|channel|>commentary json<|message|>{}",
        );
        assert_eq!(
            out,
            vec![Piece::ToolCall {
                name: "f".into(),
                arguments: "{}".into()
            }]
        );
    }

    #[test]
    fn stop_strings_hold_back_prefixes() {
        let mut s = StopMatcher::new(vec!["END".into(), "\n\n".into(), String::new()]);
        assert_eq!(s.push("abc E"), ("abc ".into(), false));
        assert_eq!(s.push("N"), (String::new(), false));
        assert_eq!(s.push("x\n"), ("ENx".into(), false));
        assert_eq!(s.push("\nmore"), (String::new(), true));
        let mut s = StopMatcher::new(vec!["é!".into()]);
        assert_eq!(s.push("aé"), ("a".into(), false));
        assert_eq!(s.finish(), "é");
        assert!(prompt_opens_reasoning(
            OutputFormat::Qwen3,
            "<|im_start|>assistant\n<think>\n"
        ));
        assert!(!prompt_opens_reasoning(
            OutputFormat::Qwen3,
            "<think>\n\n</think>\n\n"
        ));
    }
}
