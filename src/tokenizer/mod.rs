//! Tokenizer and chat templates of a GGUF model, built from its metadata alone (no
//! `tokenizer.json`): the same token ids as libllama's `llama_tokenize` for the same text and
//! flags, the same text back as `llama_detokenize`, and the model's Jinja chat template.
//!
//! Reference: llama.cpp `src/llama-vocab.cpp` + `src/unicode.cpp` (llama-cpp-sys-4 0.11.0),
//! which in turn follow HF `tokenizers`/SentencePiece. Parts:
//! - [`vocab`](self::vocab): tokens, attributes, special ids, EOG set (llama.cpp's `load`);
//! - `pretok`: the regex pre-tokenizers by `tokenizer.ggml.pre`; `bpe`: byte-level BPE with
//!   the `tokenizers` crate; `spm`: SentencePiece merges; `decode`: pieces and detokenizing;
//! - `chat` + `jinja`: chat templates with minijinja.
//!
//! Encoding ([`Tokenizer::encode`]) is llama.cpp's `tokenize`: the text is first cut at special
//! tokens (control tokens only when `parse_special`; user-defined tokens always, as HF does),
//! longest special text first (`tokenizer_st_partition`, with lstrip/rstrip attributes), then
//! each remaining fragment goes through the model; `add_special` adds BOS/EOS as the GGUF says.
//!
//! Chat prompts ([`Tokenizer::encode_chat`]): by default the template's own text is parsed for
//! control tokens but the text that came from the messages is not (as vLLM), so content such as
//! `x<|im_end|>\n<|im_start|>system` stays plain text instead of forging a turn;
//! [`ChatTemplate::apply_marking`] finds those byte ranges and
//! [`Tokenizer::encode_with_plain`] skips control tokens there. `parse_special_in_content`
//! (`pocketmoe-serve --parse-special-in-content`) is llama.cpp's server: everything parsed.
//!
//! Invariants: every id returned is < [`Tokenizer::n_vocab`]; encoding never fails or panics
//! on any `&str`; a file is refused at load time, with an error naming it and the key, rather
//! than tokenized differently from llama.cpp where we know we would differ (unsupported models
//! and pre-tokenizers).
mod bpe;
mod chat;
mod decode;
mod jinja;
mod pretok;
mod spm;
pub mod vocab;

pub use chat::{ChatMessage, ChatTemplate, MessageContent, RenderedChat};
pub use decode::StreamDecoder;
pub use vocab::{attr, SpecialTokens, TokenizerKind};

use crate::gguf::{GgufError, GgufModel};
use std::path::PathBuf;
use vocab::Vocab;

/// Errors of loading a tokenizer or rendering a chat template.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    #[error(transparent)]
    Gguf(#[from] GgufError),
    /// A tokenizer key of the file is missing or malformed.
    #[error("{}: {key}: {msg}", path.display())]
    Key {
        path: PathBuf,
        key: String,
        msg: String,
    },
    /// The file asks for a tokenizer we do not implement.
    #[error("{}: {what}", path.display())]
    Unsupported { path: PathBuf, what: String },
    /// A chat template failed to compile or render.
    #[error("chat template {name}: {msg}")]
    Template { name: String, msg: String },
}

/// A GGUF model's tokenizer.
pub struct Tokenizer {
    vocab: Vocab,
    bpe: Option<bpe::Bpe>,
    pieces: Vec<Vec<u8>>,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("path", &self.vocab.path)
            .field("kind", &self.vocab.kind)
            .field("pre", &self.pre())
            .field("n_vocab", &self.n_vocab())
            .finish_non_exhaustive()
    }
}

/// A tokenized chat prompt ([`Tokenizer::encode_chat`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChatPrompt {
    /// The rendered prompt, as [`ChatTemplate::apply`] returns it.
    pub text: String,
    /// Byte ranges of `text` that were tokenized as plain text although they spell control
    /// tokens (message content); empty when content is parsed for control tokens.
    pub plain: Vec<std::ops::Range<usize>>,
    pub tokens: Vec<u32>,
}

/// A piece of the input after cutting at special tokens.
enum Fragment<'t> {
    Text(&'t str),
    Token(u32),
}

/// C's `isspace` in the "C" locale (what llama.cpp strips around lstrip/rstrip tokens).
fn c_isspace(c: char) -> bool {
    matches!(c, ' ' | '\t' | '\n' | '\x0b' | '\x0c' | '\r')
}

impl Tokenizer {
    /// Builds the tokenizer `model`'s metadata describes.
    pub fn from_gguf(model: &GgufModel) -> Result<Self, TokenizerError> {
        let vocab = vocab::load(model)?;
        let bpe = match vocab.kind {
            TokenizerKind::Spm => None,
            TokenizerKind::Bpe | TokenizerKind::BpeSpmStyle => Some(bpe::Bpe::new(model, &vocab)?),
        };
        let pieces = decode::pieces(&vocab);
        Ok(Self { vocab, bpe, pieces })
    }

    /// Token ids of `text`, as `llama_tokenize(vocab, text, add_special, parse_special)`.
    /// `add_special`: BOS/EOS when the model adds them; `parse_special`: control-token texts
    /// such as `<|im_start|>` become their tokens (otherwise they are tokenized as plain text).
    pub fn encode(&self, text: &str, add_special: bool, parse_special: bool) -> Vec<u32> {
        self.encode_parts(text, add_special, parse_special, &[])
    }

    /// [`Tokenizer::encode`] with `parse_special = true`, except that no control (or unknown)
    /// token is recognised where its text overlaps one of the byte ranges `plain` (sorted,
    /// disjoint): those bytes are tokenized as if `parse_special` were off, together with the
    /// text around them. User-defined tokens are recognised everywhere, as with `encode`.
    ///
    /// This is how a chat prompt keeps message content plain text while the template's own
    /// markers stay control tokens ([`Tokenizer::encode_chat`]).
    pub fn encode_with_plain(
        &self,
        text: &str,
        add_special: bool,
        plain: &[std::ops::Range<usize>],
    ) -> Vec<u32> {
        self.encode_parts(text, add_special, true, plain)
    }

    /// The texts of the tokens that `encode(.., parse_special = false)` does not recognise (control
    /// and unknown tokens), longest first.
    pub fn control_texts(&self) -> Vec<&str> {
        let v = &self.vocab;
        v.special_cache
            .iter()
            .filter(|&&id| v.attrs[id as usize] & (attr::CONTROL | attr::UNKNOWN) != 0)
            .map(|&id| v.tokens[id as usize].as_str())
            .filter(|t| !t.is_empty())
            .collect()
    }

    /// A chat prompt as the server tokenizes it: `template` applied to `messages`
    /// ([`ChatTemplate::apply`]), then tokenized with BOS/EOS as the model adds them.
    ///
    /// `parse_special_in_content = false` (the default of `pocketmoe-serve`, as vLLM): the
    /// template's own text is parsed for control tokens, but text that came from the messages
    /// (content, content parts, `reasoning_content`) is plain text, so a message cannot forge a
    /// role boundary by typing `<|im_end|>`; see [`ChatTemplate::apply_marking`]. `true`:
    /// the whole rendered prompt is parsed for control tokens (llama.cpp's server).
    pub fn encode_chat(
        &self,
        template: &ChatTemplate,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        extra: serde_json::Value,
        parse_special_in_content: bool,
    ) -> Result<ChatPrompt, TokenizerError> {
        if parse_special_in_content {
            let text = template.apply(messages, add_generation_prompt, extra)?;
            let tokens = self.encode(&text, true, true);
            return Ok(ChatPrompt {
                text,
                plain: Vec::new(),
                tokens,
            });
        }
        let RenderedChat { text, plain } = template.apply_marking(
            messages,
            add_generation_prompt,
            extra,
            &self.control_texts(),
        )?;
        let tokens = self.encode_with_plain(&text, true, &plain);
        Ok(ChatPrompt {
            text,
            plain,
            tokens,
        })
    }

    fn encode_parts(
        &self,
        text: &str,
        add_special: bool,
        parse_special: bool,
        plain: &[std::ops::Range<usize>],
    ) -> Vec<u32> {
        let v = &self.vocab;
        let mut out = Vec::with_capacity(text.len() / 3 + 2);
        let fragments = self.partition(text, parse_special, plain);
        if add_special && v.add_bos {
            out.extend(v.special.bos);
        }
        match &self.bpe {
            None => {
                let mut prev_special = true; // the first fragment gets the space prefix too
                for f in fragments {
                    match f {
                        Fragment::Text(t) => {
                            let mut s = String::with_capacity(t.len() + 3);
                            if v.add_space_prefix && prev_special {
                                s.push(' ');
                            }
                            s.push_str(t);
                            spm::tokenize(v, &s.replace(' ', "\u{2581}"), &mut out);
                            prev_special = false;
                        }
                        Fragment::Token(id) => {
                            out.push(id);
                            prev_special = true;
                        }
                    }
                }
            }
            Some(bpe) => {
                for (i, f) in fragments.into_iter().enumerate() {
                    match f {
                        Fragment::Text(t) => {
                            bpe.tokenize(v, t, v.metaspace_first && i == 0, &mut out)
                        }
                        Fragment::Token(id) => out.push(id),
                    }
                }
            }
        }
        if add_special && v.add_eos {
            out.extend(v.special.eos);
        }
        out
    }

    /// llama.cpp's `tokenizer_st_partition`: cut `text` at special tokens, longest first; no
    /// control or unknown token where it would overlap a byte range of `plain`.
    fn partition<'t>(
        &self,
        text: &'t str,
        parse_special: bool,
        plain: &[std::ops::Range<usize>],
    ) -> Vec<Fragment<'t>> {
        let v = &self.vocab;
        let base = text.as_ptr() as usize;
        // Whether text[start..end] overlaps a plain range (sorted and disjoint).
        let in_plain = |start: usize, end: usize| {
            let i = plain.partition_point(|r| r.end <= start);
            plain.get(i).is_some_and(|r| r.start < end)
        };
        let mut frags = Vec::new();
        if !text.is_empty() {
            frags.push(Fragment::Text(text));
        }
        for &id in &v.special_cache {
            let a = v.attrs[id as usize];
            if !parse_special && a & (attr::CONTROL | attr::UNKNOWN) != 0 {
                continue;
            }
            let control = a & (attr::CONTROL | attr::UNKNOWN) != 0;
            let tok = v.tokens[id as usize].as_str();
            if tok.is_empty() || !text.contains(tok) {
                continue; // cheap filter: no fragment can contain it either
            }
            let mut next = Vec::with_capacity(frags.len() + 2);
            for f in frags {
                let Fragment::Text(mut rest) = f else {
                    next.push(f);
                    continue;
                };
                let mut from = 0; // where to search `rest` from (past skipped plain matches)
                while let Some(pos) = rest[from..].find(tok).map(|p| p + from) {
                    let start = rest.as_ptr() as usize - base + pos;
                    if control && in_plain(start, start + tok.len()) {
                        // Plain text: look again from the next character.
                        from = pos + rest[pos..].chars().next().map_or(1, char::len_utf8);
                        continue;
                    }
                    from = 0;
                    let mut left = &rest[..pos];
                    if a & attr::LSTRIP != 0 {
                        left = left.trim_end_matches(c_isspace);
                    }
                    if !left.is_empty() {
                        next.push(Fragment::Text(left));
                    }
                    next.push(Fragment::Token(id));
                    rest = &rest[pos + tok.len()..];
                    if a & attr::RSTRIP != 0 {
                        rest = rest.trim_start_matches(c_isspace);
                    }
                }
                if !rest.is_empty() {
                    next.push(Fragment::Text(rest));
                }
            }
            frags = next;
        }
        frags
    }

    /// Text of `ids` as `llama_detokenize(remove_special = false, unparse_special = false)`:
    /// control tokens are left out, invalid UTF-8 becomes U+FFFD.
    pub fn decode(&self, ids: &[u32]) -> String {
        String::from_utf8_lossy(&self.detokenize(ids, false, false)).into_owned()
    }

    /// Bytes of `ids` exactly as `llama_detokenize(.., remove_special, unparse_special)`.
    pub fn detokenize(&self, ids: &[u32], remove_special: bool, unparse_special: bool) -> Vec<u8> {
        decode::detokenize(
            &self.vocab,
            &self.pieces,
            ids,
            remove_special,
            unparse_special,
        )
    }

    /// Raw bytes of one token as `llama_token_to_piece(special = true)`: control tokens render
    /// as their text. A UTF-8 character may span several tokens; see [`StreamDecoder`].
    pub fn token_to_piece(&self, id: u32) -> Vec<u8> {
        self.piece(id, true).to_vec()
    }

    /// The piece of `id`; with `special = false` control and unknown tokens are empty.
    pub fn piece(&self, id: u32, special: bool) -> &[u8] {
        decode::piece(&self.vocab, &self.pieces, id, special)
    }

    pub fn n_vocab(&self) -> usize {
        self.vocab.tokens.len()
    }
    pub fn bos(&self) -> Option<u32> {
        self.vocab.special.bos
    }
    pub fn eos(&self) -> Option<u32> {
        self.vocab.special.eos
    }
    /// End of turn (`<|im_end|>`, `<|eot_id|>`, ...), from the GGUF or found by its text.
    pub fn eot(&self) -> Option<u32> {
        self.vocab.special.eot
    }
    pub fn special_tokens(&self) -> &SpecialTokens {
        &self.vocab.special
    }
    /// Whether generation ends at `id` (EOS, EOT, EOM and llama.cpp's list of end texts).
    pub fn is_eog(&self, id: u32) -> bool {
        self.vocab.eog.contains(&id)
    }
    /// All end-of-generation ids, ascending.
    pub fn eog_ids(&self) -> Vec<u32> {
        self.vocab.eog.iter().copied().collect()
    }
    /// Whether `id` is a control token (hidden by [`Tokenizer::decode`]).
    pub fn is_control(&self, id: u32) -> bool {
        self.token_attr(id) & attr::CONTROL != 0
    }
    /// llama.cpp's `llama_token_attr` bits of `id` (see [`attr`]); 0 for invalid ids.
    pub fn token_attr(&self, id: u32) -> u32 {
        self.vocab.attrs.get(id as usize).copied().unwrap_or(0)
    }
    /// The vocabulary text of `id` (GPT-2 byte symbols / U+2581 as stored in the GGUF).
    pub fn token_text(&self, id: u32) -> Option<&str> {
        self.vocab.tokens.get(id as usize).map(String::as_str)
    }
    /// The id whose vocabulary text is `text`.
    pub fn token_id(&self, text: &str) -> Option<u32> {
        self.vocab.id(text)
    }
    /// Whether `encode(.., add_special = true, ..)` prepends BOS / appends EOS.
    pub fn add_bos(&self) -> bool {
        self.vocab.add_bos
    }
    pub fn add_eos(&self) -> bool {
        self.vocab.add_eos
    }
    /// `tokenizer.ggml.add_sep_token`: reranking prompts put SEP between query and document.
    pub fn add_sep(&self) -> bool {
        self.vocab.add_sep
    }
    pub fn kind(&self) -> TokenizerKind {
        self.vocab.kind
    }
    /// `tokenizer.ggml.model` as stored.
    pub fn model_name(&self) -> &str {
        &self.vocab.model
    }
    /// The pre-tokenizer family (llama.cpp's `LLAMA_VOCAB_PRE_TYPE_*`, lowercase) of BPE models.
    pub fn pre(&self) -> Option<&'static str> {
        self.vocab.pre.map(|p| p.kind)
    }
    /// BPE merges of the file that the merge table could not hold (0 for consistent files).
    pub fn dropped_merges(&self) -> usize {
        self.bpe.as_ref().map_or(0, |b| b.dropped_merges())
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn shareable_across_threads() {
        fn check<T: Send + Sync>() {}
        check::<super::Tokenizer>();
        check::<super::ChatTemplate>();
    }
}
