//! llama-server's fill-in-the-middle endpoint, `POST /infill`: code completion between an
//! `input_prefix` and an `input_suffix`, with optional `input_extra` context chunks
//! (`[{"filename", "text"}]`, other files of the project) and an optional `prompt` (text the
//! middle starts with). The usual completion fields (`n_predict`, `stream`, sampling,
//! `n_probs`, ...) apply, and the answer is `/completion`'s (`native`).
//!
//! The prompt is assembled from token ids as llama-server's `format_prompt_infill` does
//! (the repo-level FIM pattern of Qwen2.5-Coder, arXiv 2409.12186):
//!
//! ```text
//! [FIM_REP]myproject\n [FIM_SEP]{filename}\n{text} ... [FIM_SEP]filename\n
//! [BOS] [FIM_PRE]{prefix}{prompt} [FIM_SUF]{suffix} [FIM_MID]
//! ```
//!
//! - Prefix and suffix are tokenized without BOS/EOS and without parsing control-token texts
//!   (a string, or a list of token ids and strings); `prompt` with control tokens parsed.
//! - Budget: the prefix keeps its last `3 * (n_batch / 4)` tokens, the suffix its first
//!   `n_batch / 4 - 2 - len(prompt)` (at least 0), where `n_batch` is the server's `-b`
//!   (2048 by default, as llama-server); the extra context keeps its last
//!   `n_ctx - n_batch - 2 * n_predict` tokens (the server's `-n`, -1 by default; at least 0).
//! - Without a repo token the `[FIM_REP]myproject` header is left out; without a file
//!   separator each chunk is preceded by `"\n\n--- snippet ---\n\n"` and no trailing
//!   `[FIM_SEP]filename` is added.
//! - `--spm-infill` puts the suffix part before the prefix part (suffix-prefix-middle order).
//! - BOS (when the vocabulary adds it) comes after the extra context, before the FIM parts.
//!
//! A model without FIM prefix, suffix or middle tokens (from the GGUF, or found by their text as
//! llama.cpp's vocabulary does) answers 501 `not_supported_error` with llama-server's message.
use super::error::ApiError;
use super::native::{self, NativeRequest};
use super::types::PromptInput;
use super::{read_body, validate, AppState};
use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::Value;
use std::sync::Arc;

/// `/infill`'s budget settings (llama-server's `-b` and `--spm-infill`).
#[derive(Debug, Clone)]
pub struct InfillConfig {
    /// llama-server's logical batch `-b`: the prefix/suffix budget.
    pub n_batch: usize,
    /// Suffix before prefix.
    pub spm: bool,
}

impl Default for InfillConfig {
    fn default() -> Self {
        Self {
            n_batch: 2048,
            spm: false,
        }
    }
}

#[derive(Debug, Deserialize)]
struct InfillRequest {
    input_prefix: Option<Value>,
    input_suffix: Option<Value>,
    input_extra: Option<Value>,
    prompt: Option<Value>,
    n_probs: Option<u64>,
    return_tokens: Option<bool>,
}

/// The FIM tokens of a vocabulary.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fim {
    pub pre: u32,
    pub suf: u32,
    pub mid: u32,
    pub rep: Option<u32>,
    pub sep: Option<u32>,
    /// BOS, when the vocabulary adds it.
    pub bos: Option<u32>,
}

/// The sizes the assembly budgets with.
#[derive(Debug, Clone, Copy)]
pub struct Budget {
    pub n_batch: usize,
    /// The server's default `n_predict` (-1: none).
    pub n_predict: i64,
    pub n_ctx: usize,
    pub spm: bool,
}

/// One `input_extra` chunk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chunk {
    pub filename: String,
    pub text: String,
}

/// The separator put before each extra chunk when the vocabulary has no file separator.
const SNIPPET: &str = "\n\n--- snippet ---\n\n";

/// The infill prompt (see the module doc). `tok` tokenizes without BOS/EOS and without parsing
/// control tokens.
pub fn assemble(
    fim: &Fim,
    budget: Budget,
    prefix: &[u32],
    suffix: &[u32],
    extra: &[Chunk],
    prompt: &[u32],
    tok: &dyn Fn(&str) -> Vec<u32>,
) -> Vec<u32> {
    let mut context = Vec::new();
    if let Some(rep) = fim.rep {
        context.push(rep);
        context.extend(tok("myproject\n"));
    }
    for c in extra {
        match fim.sep {
            Some(sep) => {
                context.push(sep);
                context.extend(tok(&format!("{}\n", c.filename)));
            }
            None => context.extend(tok(SNIPPET)),
        }
        context.extend(tok(&c.text));
    }
    if let Some(sep) = fim.sep {
        context.push(sep);
        context.extend(tok("filename\n"));
    }
    let quarter = budget.n_batch / 4;
    let n_prefix = prefix.len().min(3 * quarter);
    let n_suffix = suffix.len().min(quarter.saturating_sub(2 + prompt.len()));
    let room = budget.n_ctx as i64 - budget.n_batch as i64 - 2 * budget.n_predict;
    let n_context = context.len().min(room.max(0) as usize);

    let mut pre_part = vec![fim.pre];
    pre_part.extend(&prefix[prefix.len() - n_prefix..]);
    pre_part.extend(prompt);
    let mut suf_part = vec![fim.suf];
    suf_part.extend(&suffix[..n_suffix]);
    let (first, second) = if budget.spm {
        (suf_part, pre_part)
    } else {
        (pre_part, suf_part)
    };
    let mut out = context[context.len() - n_context..].to_vec();
    out.extend(fim.bos);
    out.extend(first);
    out.extend(second);
    out.push(fim.mid);
    out
}

/// llama-server's 501 for a vocabulary that lacks FIM prefix, suffix or middle tokens.
fn fim_of(st: &AppState) -> Result<Fim, ApiError> {
    let v = st.engine.vocab().unwrap_or_default();
    let s = &v.special;
    let mut missing = String::new();
    for (id, what) in [
        (s.fim_pre, "prefix"),
        (s.fim_suf, "suffix"),
        (s.fim_mid, "middle"),
    ] {
        if id.is_none() {
            missing.push_str(&format!("{what} token is missing. "));
        }
    }
    match (s.fim_pre, s.fim_suf, s.fim_mid) {
        (Some(pre), Some(suf), Some(mid)) => Ok(Fim {
            pre,
            suf,
            mid,
            rep: s.fim_rep,
            sep: s.fim_sep,
            bos: s.bos.filter(|_| v.add_bos),
        }),
        _ => Err(ApiError::NotSupported(format!(
            "Infill is not supported by this model: {missing}"
        ))),
    }
}

/// `input_prefix` / `input_suffix`: a string, or a list of token ids and strings (llama.cpp's
/// `tokenize_mixed`), tokenized without BOS/EOS and control tokens as plain text.
fn mixed(st: &AppState, field: &str, v: &Value) -> Result<Vec<u32>, ApiError> {
    let text = |s: &str| -> Result<Vec<u32>, ApiError> {
        Ok(st
            .engine
            .tokenize(s, false, false)?
            .into_iter()
            .map(|(id, _)| id)
            .collect())
    };
    let bad = || {
        ApiError::invalid(
            field,
            format!("\"{field}\" must be a string or a list of token ids and strings"),
        )
    };
    let n_vocab = st.engine.card().n_vocab;
    match v {
        Value::String(s) => text(s),
        Value::Array(items) => {
            let mut out = Vec::new();
            for it in items {
                match it {
                    Value::String(s) => out.extend(text(s)?),
                    Value::Number(n) => {
                        let id = n
                            .as_u64()
                            .and_then(|n| u32::try_from(n).ok())
                            .filter(|&id| (id as usize) < n_vocab)
                            .ok_or_else(|| {
                                ApiError::invalid(
                                    field,
                                    format!(
                                        "\"{field}\": {n} is not a token id of the vocabulary (0..{n_vocab})"
                                    ),
                                )
                            })?;
                        out.push(id);
                    }
                    _ => return Err(bad()),
                }
            }
            Ok(out)
        }
        _ => Err(bad()),
    }
}

/// `input_extra`: a list of `{"text": string, "filename": string (optional, "tmp")}`.
fn chunks(v: Option<&Value>) -> Result<Vec<Chunk>, ApiError> {
    let list = match v {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Array(a)) => a,
        Some(_) => {
            return Err(ApiError::invalid(
                "input_extra",
                "\"input_extra\" must be an array of {\"filename\": string, \"text\": string}",
            ))
        }
    };
    list.iter()
        .map(|c| {
            let text = c.get("text").and_then(Value::as_str).ok_or_else(|| {
                ApiError::invalid(
                    "input_extra",
                    "extra_context chunk must contain a \"text\" field with a string value",
                )
            })?;
            let filename = match c.get("filename") {
                None => "tmp",
                Some(Value::String(f)) => f,
                Some(_) => {
                    return Err(ApiError::invalid(
                        "input_extra",
                        "extra_context chunk's \"filename\" field must be a string",
                    ))
                }
            };
            Ok(Chunk {
                filename: filename.to_string(),
                text: text.to_string(),
            })
        })
        .collect()
}

pub(super) async fn infill(State(st): State<Arc<AppState>>, req: Request) -> Response {
    let run = async {
        let fim = fim_of(&st)?;
        let bytes = read_body(req, &st.cfg).await?;
        let (common, r) = validate::parse_body::<InfillRequest>(&bytes)?;
        let prompt = match &r.prompt {
            None | Some(Value::Null) => String::new(),
            Some(Value::String(s)) => s.clone(),
            Some(_) => {
                return Err(ApiError::invalid("prompt", "\"prompt\" must be a string"));
            }
        };
        let prefix = r
            .input_prefix
            .as_ref()
            .ok_or_else(|| ApiError::invalid("input_prefix", "\"input_prefix\" is required"))?;
        let suffix = r
            .input_suffix
            .as_ref()
            .ok_or_else(|| ApiError::invalid("input_suffix", "\"input_suffix\" is required"))?;
        let extra = chunks(r.input_extra.as_ref())?;
        let prefix = mixed(&st, "input_prefix", prefix)?;
        let suffix = mixed(&st, "input_suffix", suffix)?;
        let prompt: Vec<u32> = st
            .engine
            .tokenize(&prompt, false, true)?
            .into_iter()
            .map(|(id, _)| id)
            .collect();
        let budget = Budget {
            n_batch: st.cfg.infill.n_batch,
            n_predict: st.cfg.defaults.n_predict.map_or(-1, |n| n as i64),
            n_ctx: st.engine.card().n_ctx,
            spm: st.cfg.infill.spm,
        };
        let engine = st.engine.clone();
        let tok = move |s: &str| -> Vec<u32> {
            engine
                .tokenize(s, false, false)
                .map(|v| v.into_iter().map(|(id, _)| id).collect())
                .unwrap_or_default()
        };
        let ids = assemble(&fim, budget, &prefix, &suffix, &extra, &prompt, &tok);
        let text = st.engine.detokenize(&ids).ok();
        let return_tokens = r.return_tokens.unwrap_or(false);
        let native = NativeRequest {
            prompt: PromptInput::Tokens(ids),
            n_probs: r.n_probs,
            return_tokens: r.return_tokens,
        };
        let plans = native::plans(&common, native, st.engine.card(), &st.cfg.defaults)?;
        native::answer(&st, plans, vec![text], return_tokens).await
    };
    run.await.unwrap_or_else(IntoResponse::into_response)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A toy tokenizer: one id per byte, 1000 + the byte.
    fn tok(s: &str) -> Vec<u32> {
        s.bytes().map(|b| 1000 + u32::from(b)).collect()
    }

    const FIM: Fim = Fim {
        pre: 1,
        suf: 2,
        mid: 3,
        rep: Some(4),
        sep: Some(5),
        bos: Some(9),
    };

    fn budget(n_batch: usize, spm: bool) -> Budget {
        Budget {
            n_batch,
            n_predict: -1,
            n_ctx: 4096,
            spm,
        }
    }

    #[test]
    fn layout_is_llama_servers() {
        let extra = [Chunk {
            filename: "a.py".into(),
            text: "x".into(),
        }];
        let got = assemble(
            &FIM,
            budget(2048, false),
            &[10, 11],
            &[20, 21],
            &extra,
            &[30],
            &tok,
        );
        let mut want = vec![4];
        want.extend(tok("myproject\n"));
        want.push(5);
        want.extend(tok("a.py\n"));
        want.extend(tok("x"));
        want.push(5);
        want.extend(tok("filename\n"));
        want.extend([9, 1, 10, 11, 30, 2, 20, 21, 3]);
        assert_eq!(got, want);

        // Suffix-prefix-middle.
        let got = assemble(&FIM, budget(2048, true), &[10], &[20], &[], &[], &tok);
        let mut want = vec![4];
        want.extend(tok("myproject\n"));
        want.push(5);
        want.extend(tok("filename\n"));
        want.extend([9, 2, 20, 1, 10, 3]);
        assert_eq!(got, want);

        // No repo token, no file separator, no BOS: snippet separators only.
        let bare = Fim {
            rep: None,
            sep: None,
            bos: None,
            ..FIM
        };
        let extra = [
            Chunk {
                filename: "a".into(),
                text: "p".into(),
            },
            Chunk {
                filename: "b".into(),
                text: "q".into(),
            },
        ];
        let got = assemble(&bare, budget(2048, false), &[10], &[20], &extra, &[], &tok);
        let mut want = tok(SNIPPET);
        want.extend(tok("p"));
        want.extend(tok(SNIPPET));
        want.extend(tok("q"));
        want.extend([1, 10, 2, 20, 3]);
        assert_eq!(got, want);
    }

    #[test]
    fn budget_keeps_the_prefix_end_and_the_suffix_start() {
        let bare = Fim {
            rep: None,
            sep: None,
            bos: None,
            ..FIM
        };
        let prefix: Vec<u32> = (100..120).collect();
        let suffix: Vec<u32> = (200..220).collect();
        // n_batch 16: prefix 3 * 4 = 12 (its last 12), suffix 4 - 2 - 1 = 1 (its first).
        let got = assemble(&bare, budget(16, false), &prefix, &suffix, &[], &[7], &tok);
        let mut want = vec![1];
        want.extend(108..120);
        want.extend([7, 2, 200, 3]);
        assert_eq!(got, want);
        // A prompt longer than the suffix's quarter leaves no suffix.
        let got = assemble(
            &bare,
            budget(16, false),
            &[],
            &suffix,
            &[],
            &[7, 7, 7],
            &tok,
        );
        assert_eq!(got, vec![1, 7, 7, 7, 2, 3]);
        // Extra context: only its last n_ctx - n_batch - 2 * n_predict tokens.
        let extra = [Chunk {
            filename: "f".into(),
            text: "abcdef".into(),
        }];
        let b = Budget {
            n_batch: 16,
            n_predict: 4,
            n_ctx: 16 + 8 + 3,
            spm: false,
        };
        let got = assemble(&bare, b, &[], &[], &extra, &[], &tok);
        let mut want = tok("def");
        want.extend([1, 2, 3]);
        assert_eq!(got, want);
        // No room at all: no extra context.
        let b = Budget { n_ctx: 10, ..b };
        assert_eq!(
            assemble(&bare, b, &[], &[], &extra, &[], &tok),
            vec![1, 2, 3]
        );
    }

    #[test]
    fn extra_chunks_are_checked() {
        use serde_json::json;
        assert_eq!(chunks(None).unwrap(), vec![]);
        let c = chunks(Some(
            &json!([{"text": "t"}, {"text": "u", "filename": "f"}]),
        ))
        .unwrap();
        assert_eq!(c[0].filename, "tmp");
        assert_eq!(c[1].filename, "f");
        for bad in [
            json!("x"),
            json!([{"filename": "f"}]),
            json!([{"text": 1}]),
            json!([{"text": "t", "filename": 2}]),
        ] {
            assert!(chunks(Some(&bad)).is_err(), "{bad}");
        }
    }
}
