//! BPE over ranked merges (`tokenizer.ggml.model` = `gpt2`, and Gemma 4's `gemma4`): the text is
//! cut into words by the pre-tokenizer, each word is mapped to GPT-2 byte symbols (or kept as
//! raw UTF-8 with spaces as U+2581 for Gemma 4), and the merges run with the `tokenizers` crate's
//! BPE model, built in memory from the GGUF's tokens and merges.
//!
//! Reference: `llm_tokenizer_bpe_session::tokenize` in llama.cpp `src/llama-vocab.cpp` and
//! `unicode_byte_to_utf8` in `src/unicode.cpp`; HF `tokenizers` `models::bpe` for the merge loop.
//! Both merge the lowest-rank adjacent pair first, leftmost on ties, and skip merges made stale
//! by an earlier one, so they produce the same tokens. `ignore_merges` (a whole word that is a
//! token is that token) is the same flag in both.
//!
//! Where the crate needs consistent data and llama.cpp does not: a merge whose parts or result
//! are not tokens cannot be represented (llama.cpp would merge and later spell the non-token out
//! byte by byte); such merges are dropped and counted ([`Bpe::dropped_merges`]). A repeated pair
//! keeps its first (lowest) rank, as in llama.cpp's map. Invariant: every merge entry is read as
//! the C string llama.cpp reads (up to a NUL) and split at its first space after the first byte
//! (llama.cpp's `strchr(word + 1, ' ')`); one without is an error.
use super::pretok::PreTokenizer;
use super::vocab::Vocab;
use super::TokenizerError;
use crate::gguf::{GgufModel, Metadata};
use std::borrow::Cow;
use std::collections::HashSet;
use tokenizers::models::bpe::{Vocab as BpeVocab, BPE};
use tokenizers::Model;

/// GPT-2's byte -> printable char table (`bytes_to_unicode`).
pub(crate) fn byte_chars() -> [char; 256] {
    let printable = |b: u32| (33..=126).contains(&b) || (161..=172).contains(&b) || b >= 174;
    let mut table = ['\0'; 256];
    let mut n = 0;
    for b in 0..256u32 {
        table[b as usize] = if printable(b) {
            char::from_u32(b).unwrap_or('\0')
        } else {
            n += 1;
            char::from_u32(255 + n).unwrap_or('\0')
        };
    }
    table
}

pub(crate) struct Bpe {
    model: BPE,
    pre: PreTokenizer,
    /// GPT-2 byte symbols (false for Gemma 4's raw UTF-8).
    byte_encode: bool,
    /// Spaces become U+2581 before splitting (Gemma 4).
    escape_whitespaces: bool,
    byte_chars: [char; 256],
    /// Gemma 4: a word of newlines that is a token is that token (llama.cpp PR 21343).
    newline_runs: bool,
    /// Nemotron 3.5 embed: a ZWNJ after `[` or `<` is dropped before splitting.
    drop_bracket_zwnj: bool,
    dropped_merges: usize,
}

impl Bpe {
    pub(crate) fn new(model: &GgufModel, v: &Vocab) -> Result<Self, TokenizerError> {
        let key = "tokenizer.ggml.merges";
        let err = |msg: String| TokenizerError::Key {
            path: v.path.clone(),
            key: key.to_string(),
            msg,
        };
        let spec = v
            .pre
            .ok_or_else(|| err("BPE vocabulary without a pre-tokenizer".into()))?;
        let entries = model.require_str_array(key)?;
        let mut seen = HashSet::with_capacity(entries.len());
        let mut merges = Vec::with_capacity(entries.len());
        let mut dropped_merges = 0;
        for (i, entry) in entries.iter().enumerate() {
            let entry = entry.split('\0').next().unwrap_or_default();
            let space = (entry.as_bytes().iter().skip(1).position(|&c| c == b' '))
                .ok_or_else(|| err(format!("entry {i} {entry:?} has no space")))?
                + 1;
            let (a, b) = (&entry[..space], &entry[space + 1..]);
            if !seen.insert((a, b)) {
                continue;
            }
            let known = |t: &str| v.ids.contains_key(t);
            if known(a) && known(b) && known(&format!("{a}{b}")) {
                merges.push((a.to_string(), b.to_string()));
            } else {
                dropped_merges += 1;
            }
        }
        if dropped_merges > 0 {
            tracing::warn!(
                "{}: {dropped_merges} merges join or make strings that are not tokens; ignored",
                v.path.display()
            );
        }
        let vocab: BpeVocab = v.ids.iter().map(|(t, &id)| (t.clone(), id)).collect();
        // Gemma 4 / Sarvam: raw UTF-8 words with U+2581 for spaces and <0xXX> byte fallback.
        let raw_utf8 = spec.escape_whitespaces;
        let model = BPE::builder()
            .vocab_and_merges(vocab, merges)
            .ignore_merges(spec.ignore_merges)
            .byte_fallback(raw_utf8)
            .build()
            .map_err(|e| err(format!("building the BPE model: {e}")))?;
        let pre = PreTokenizer::new(&spec).map_err(|e| TokenizerError::Key {
            path: v.path.clone(),
            key: "tokenizer.ggml.pre".into(),
            msg: e,
        })?;
        Ok(Self {
            model,
            pre,
            byte_encode: !raw_utf8,
            escape_whitespaces: spec.escape_whitespaces,
            byte_chars: byte_chars(),
            newline_runs: spec.kind == "gemma4",
            drop_bracket_zwnj: spec.kind == "nemotron-3-5-embd",
            dropped_merges,
        })
    }

    /// Merges that could not be represented (see the module docs).
    pub(crate) fn dropped_merges(&self) -> usize {
        self.dropped_merges
    }

    /// Appends the tokens of one text fragment (no special tokens inside) to `out`.
    /// `metaspace_first`: the fragment starts the input and the GGUF's Metaspace
    /// `prepend_scheme` is "first", so it gets a leading U+2581 unless it has one.
    pub(crate) fn tokenize(
        &self,
        v: &Vocab,
        text: &str,
        metaspace_first: bool,
        out: &mut Vec<u32>,
    ) {
        let mut text: Cow<str> = if self.escape_whitespaces {
            Cow::Owned(text.replace(' ', "\u{2581}"))
        } else {
            Cow::Borrowed(text)
        };
        if metaspace_first && !text.starts_with('\u{2581}') {
            text = Cow::Owned(format!("\u{2581}{text}"));
        }
        if self.drop_bracket_zwnj {
            text = Cow::Owned(text.replace("[\u{200C}", "[").replace("<\u{200C}", "<"));
        }
        for word in self.pre.split(&text) {
            let word: Cow<str> = if self.byte_encode {
                Cow::Owned(word.bytes().map(|b| self.byte_chars[b as usize]).collect())
            } else {
                Cow::Borrowed(word)
            };
            if self.newline_runs && word.bytes().all(|b| b == b'\n') {
                if let Some(id) = v.id(&word) {
                    out.push(id);
                    continue;
                }
            }
            match self.model.tokenize(&word) {
                Ok(tokens) => out.extend(tokens.iter().map(|t| t.id)),
                // Only reachable with an unknown-token setting, which we never configure.
                Err(e) => tracing::error!("BPE failed on {word:?}: {e}"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_table_matches_gpt2() {
        let t = byte_chars();
        assert_eq!(t[b'a' as usize], 'a');
        assert_eq!(t[b' ' as usize], 'Ġ');
        assert_eq!(t[b'\n' as usize], 'Ċ');
        assert_eq!(t[0xAD], 'Ń');
        for b in 0..=255u8 {
            assert_eq!(
                t[b as usize],
                crate::synth::vocab::byte_to_char(b),
                "byte {b}"
            );
        }
        let distinct: HashSet<char> = t.iter().copied().collect();
        assert_eq!(distinct.len(), 256);
    }
}
