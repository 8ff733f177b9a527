//! Constrained decoding: a request's `grammar` (GBNF), `json_schema` / `response_format`, or
//! `tool_choice: "required"` becomes an llguidance [`Matcher`] that the scheduler consults for
//! every sampled token of that request (docs/design.md §6, "Constrained output").
//!
//! [`Constraint`] is what validation extracts from the body (GBNF already read into Lark, so
//! syntax errors are 400s before anything is queued); [`Grammars`] holds the vocabulary as a
//! byte trie (built once, on the first constrained request) and compiles a constraint into a
//! fresh matcher per request. Compile errors (an unsatisfiable schema, a Lark error) are 400s
//! naming the field.
//!
//! Vocabulary bytes: a normal token is its piece; a control token is `0xFF` + its text, the
//! trie's convention for special tokens (a grammar reaches them only by name, `<|im_end|>`);
//! tokens without bytes are never allowed. Every end-of-generation token counts as EOS, so the
//! model may end whenever the grammar accepts.
use super::api::OutputFormat;
use super::error::ApiError;
use crate::tokenizer::Tokenizer;
use llguidance::api::TopLevelGrammar;
use llguidance::{Matcher, ParserFactory};
use serde_json::{json, Value};
use std::sync::{Arc, OnceLock};
use toktrie::{ApproximateTokEnv, TokRxInfo, TokTrie, TokenizerEnv};

/// A request's constraint on its output.
#[derive(Debug, Clone, PartialEq)]
pub enum Constraint {
    /// An llguidance Lark grammar (from GBNF `grammar`); `field` is the request field.
    Lark { lark: String, field: &'static str },
    /// A JSON Schema the output must be an instance of.
    JsonSchema { schema: Value, field: &'static str },
    /// The output is one tool call (or several, with `parallel`), in the chat format's syntax.
    ToolCall { tools: Vec<Value>, parallel: bool },
}

impl Constraint {
    fn field(&self) -> &'static str {
        match self {
            Constraint::Lark { field, .. } | Constraint::JsonSchema { field, .. } => field,
            Constraint::ToolCall { .. } => "tool_choice",
        }
    }
}

/// JSON output without free whitespace (`{"a":1,"b":[2,3]}`): a sampler that may put any
/// amount of whitespace anywhere can fill `max_tokens` with it. A schema's own `x-guidance`
/// options win.
fn compact(mut schema: Value) -> Value {
    if let Some(o) = schema.as_object_mut() {
        o.entry("x-guidance").or_insert_with(
            || json!({"whitespace_flexible": false, "key_separator": ": ", "item_separator": ", "}),
        );
    }
    schema
}

/// The schema of one call of `tools`: `{"name": <one of them>, "arguments": <its parameters>}`.
fn call_schema(tools: &[Value]) -> Value {
    let calls: Vec<Value> = tools
        .iter()
        .map(|t| {
            let f = t.get("function").unwrap_or(t);
            let params = f
                .get("parameters")
                .filter(|p| p.is_object() && p.as_object().is_some_and(|o| !o.is_empty()))
                .cloned()
                .unwrap_or_else(|| json!({"type": "object"}));
            json!({
                "type": "object",
                "properties": {"name": {"const": f.get("name")}, "arguments": params},
                "required": ["name", "arguments"],
                "additionalProperties": false,
            })
        })
        .collect();
    compact(if calls.len() == 1 {
        calls.into_iter().next().expect("one call")
    } else {
        json!({"anyOf": calls})
    })
}

/// The Lark grammar of a tool-call turn in `format` (None: the format has no tool calls we
/// parse). `opens_reasoning`: the prompt left a `<think>` block open, which is closed first.
pub fn tool_call_lark(
    tools: &[Value],
    parallel: bool,
    format: OutputFormat,
    opens_reasoning: bool,
) -> Option<String> {
    let schema = serde_json::to_string(&call_schema(tools)).ok()?;
    match format {
        OutputFormat::Qwen3 => {
            let pre = if opens_reasoning {
                "\"</think>\\n\\n\" "
            } else {
                ""
            };
            let more = if parallel { " (\"\\n\" call)*" } else { "" };
            Some(format!(
                "start: {pre}call{more}\ncall: \"<tool_call>\\n\" body \"\\n</tool_call>\"\nbody: %json {schema}\n"
            ))
        }
        OutputFormat::Harmony => {
            // One call: `<|channel|>commentary to=functions.NAME json<|message|>ARGS`, then an
            // end-of-generation token (`<|call|>`) once the arguments are complete.
            let alts: Vec<String> = tools
                .iter()
                .filter_map(|t| {
                    let f = t.get("function").unwrap_or(t);
                    let name = f.get("name")?.as_str()?;
                    let params = f
                        .get("parameters")
                        .filter(|p| p.as_object().is_some_and(|o| !o.is_empty()))
                        .cloned()
                        .unwrap_or_else(|| json!({"type": "object"}));
                    let params = serde_json::to_string(&compact(params)).ok()?;
                    // The markers as text: the tokenizer keeps harmony's markers user-defined
                    // (rendered as text), so a literal matches the marker token.
                    let head = serde_json::to_string(&format!(
                        "<|channel|>commentary to=functions.{name} json<|message|>"
                    ))
                    .ok()?;
                    Some(format!("{head} %json {params}"))
                })
                .collect();
            (!alts.is_empty()).then(|| format!("start: {}\n", alts.join(" | ")))
        }
        OutputFormat::Plain | OutputFormat::Think => None,
    }
}

/// The vocabulary's trie and the parser factory over it.
pub struct Grammars {
    tok: Arc<Tokenizer>,
    factory: OnceLock<Result<ParserFactory, String>>,
}

/// Byte strings of every token as the trie wants them.
pub fn token_bytes(tok: &Tokenizer) -> Vec<Vec<u8>> {
    (0..tok.n_vocab() as u32)
        .map(|id| {
            let p = tok.piece(id, true);
            if tok.is_control(id) && !p.is_empty() {
                let mut b = Vec::with_capacity(p.len() + 1);
                b.push(TokTrie::SPECIAL_TOKEN_MARKER);
                b.extend_from_slice(p);
                b
            } else {
                p.to_vec()
            }
        })
        .collect()
}

impl Grammars {
    pub fn new(tok: Arc<Tokenizer>) -> Self {
        Self {
            tok,
            factory: OnceLock::new(),
        }
    }

    fn factory(&self) -> Result<&ParserFactory, ApiError> {
        let f = self.factory.get_or_init(|| {
            let words = token_bytes(&self.tok);
            let eog = self.tok.eog_ids();
            let first = eog.first().copied().or(self.tok.eos()).unwrap_or(0);
            let info = TokRxInfo::new(words.len() as u32, first);
            let mut trie = TokTrie::from(&info, &words);
            if !eog.is_empty() {
                trie = trie.with_eos_tokens(&eog);
            }
            let env: Arc<dyn TokenizerEnv + Sync> = Arc::new(ApproximateTokEnv::new(trie));
            let mut f = ParserFactory::new_simple(&env).map_err(|e| e.to_string())?;
            f.set_stderr_log_level(0);
            Ok(f)
        });
        f.as_ref()
            .map_err(|e| ApiError::Internal(format!("constrained decoding is unavailable: {e}")))
    }

    /// A fresh matcher for `c`; a constraint that does not compile is a 400 naming its field.
    pub fn compile(
        &self,
        c: &Constraint,
        format: OutputFormat,
        opens_reasoning: bool,
    ) -> Result<Matcher, ApiError> {
        let field = c.field();
        let grammar = match c {
            Constraint::Lark { lark, .. } => TopLevelGrammar::from_lark(lark.clone()),
            Constraint::JsonSchema { schema, .. } => {
                TopLevelGrammar::from_json_schema(compact(schema.clone()))
            }
            Constraint::ToolCall { tools, parallel } => {
                let lark = tool_call_lark(tools, *parallel, format, opens_reasoning).ok_or_else(
                    || {
                        ApiError::invalid(
                            field,
                            "tool_choice: the model's chat template has no tool-call format this server parses (Qwen3/Hermes <tool_call>, harmony): use \"auto\" or \"none\"",
                        )
                    },
                )?;
                TopLevelGrammar::from_lark(lark)
            }
        };
        let factory = self.factory()?;
        // A compiler panic is this request's error, not the request thread's.
        let parser = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            factory.create_parser(grammar)
        }))
        .map_err(|p| {
            let msg = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            ApiError::invalid(
                field,
                format!("{field}: the grammar compiler failed: {msg}"),
            )
        })?
        .map_err(|e| ApiError::invalid(field, format!("{field}: {e}")))?;
        let m = Matcher::new(Ok(parser));
        if let Some(e) = m.get_error() {
            return Err(ApiError::invalid(field, format!("{field}: {e}")));
        }
        Ok(m)
    }
}
