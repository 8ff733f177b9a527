//! Tokens back to text: the byte piece of every token, llama.cpp's detokenizer (leading-space
//! removal for SentencePiece, BOS/EOS removal, `clean_up_tokenization_spaces`), and a streaming
//! UTF-8 assembler for generation, where one character's bytes may span several tokens.
//!
//! Reference: `llama_vocab::impl::token_to_piece` and `detokenize` in llama.cpp
//! `src/llama-vocab.cpp` (and `llama_decode_text` for byte-level pieces). The three
//! clean-spaces passes are ported literally, in place, because they read bytes the earlier
//! iterations may have moved.
//!
//! Invariants: pieces are computed once, with `special = true` (control tokens render as their
//! text); `special = false` hides control and unknown tokens only. Ids outside the vocabulary
//! decode to nothing (llama.cpp throws).
use super::bpe::byte_chars;
use super::vocab::{attr, Vocab};
use std::collections::HashMap;

/// The piece of every token with `special = true`, as llama.cpp caches them.
pub(crate) fn pieces(v: &Vocab) -> Vec<Vec<u8>> {
    let to_byte: HashMap<char, u8> = byte_chars()
        .iter()
        .enumerate()
        .map(|(b, &c)| (c, b as u8))
        .collect();
    v.tokens
        .iter()
        .zip(&v.attrs)
        .map(|(text, &a)| {
            if a & (attr::UNKNOWN | attr::CONTROL | attr::USER_DEFINED) != 0 {
                text.as_bytes().to_vec()
            } else if a & attr::NORMAL != 0 {
                if v.escape_whitespaces {
                    text.replace('\u{2581}', " ").into_bytes()
                } else {
                    byte_level_decode(text, &to_byte)
                }
            } else if a & attr::BYTE != 0 {
                let hex = text.get(3..5).unwrap_or("");
                vec![u8::from_str_radix(hex, 16).unwrap_or(0)]
            } else {
                Vec::new()
            }
        })
        .collect()
}

/// GPT-2 symbols back to bytes; a symbol outside the table is spelled as llama.cpp does.
fn byte_level_decode(text: &str, to_byte: &HashMap<char, u8>) -> Vec<u8> {
    let mut out = Vec::with_capacity(text.len());
    for c in text.chars() {
        match to_byte.get(&c) {
            Some(&b) => out.push(b),
            None => {
                out.extend_from_slice(b"[UNK_BYTE_0x");
                let mut buf = [0u8; 4];
                for b in c.encode_utf8(&mut buf).bytes() {
                    out.extend_from_slice(format!("{b:02x}").as_bytes());
                }
                out.extend_from_slice(text.as_bytes());
                out.push(b']');
            }
        }
    }
    out
}

/// llama.cpp's `detokenize`.
pub(crate) fn detokenize(
    v: &Vocab,
    pieces: &[Vec<u8>],
    ids: &[u32],
    remove_special: bool,
    unparse_special: bool,
) -> Vec<u8> {
    let mut ids = ids;
    let mut remove_space = v.add_space_prefix;
    if remove_special && v.add_bos {
        if let (Some(&first), Some(bos)) = (ids.first(), v.special.bos) {
            if first == bos {
                remove_space = false;
                ids = &ids[1..];
            }
        }
    }
    if remove_special && v.add_eos {
        if let (Some(&last), Some(eos)) = (ids.last(), v.special.eos) {
            if last == eos {
                ids = &ids[..ids.len() - 1];
            }
        }
    }
    // Metaspace prepend scheme "first": the first piece that renders loses its leading space.
    let mut remove_first_space = v.metaspace_first;
    let mut text = Vec::new();
    for &id in ids {
        let piece = piece(v, pieces, id, unparse_special);
        // Only the first token loses its leading space, even when it renders as nothing.
        let strip = (remove_space || remove_first_space) && piece.first() == Some(&b' ');
        text.extend_from_slice(&piece[usize::from(strip)..]);
        remove_space = false;
        let hidden =
            v.attrs.get(id as usize).copied().unwrap_or(0) & (attr::UNKNOWN | attr::CONTROL);
        if unparse_special || hidden == 0 {
            remove_first_space = false;
        }
    }
    if v.clean_spaces {
        clean_spaces(&mut text);
    }
    text
}

/// The piece of `id`; empty for control/unknown tokens unless `special`, and for bad ids.
pub(crate) fn piece<'a>(v: &Vocab, pieces: &'a [Vec<u8>], id: u32, special: bool) -> &'a [u8] {
    let Some(p) = pieces.get(id as usize) else {
        return &[];
    };
    if !special && v.attrs[id as usize] & (attr::UNKNOWN | attr::CONTROL) != 0 {
        return &[];
    }
    p
}

/// `clean_up_tokenization_spaces`: " ?" " !" " ." " ," lose the space, " ' " loses both, and
/// " 's" " 'm" " 're" " 've" lose the space.
fn clean_spaces(text: &mut Vec<u8>) {
    // Pass 1: space before ? ! . ,
    let total1 = text.len();
    let mut total = usize::from(total1 > 0);
    for i in 1..total1 {
        let x = text[i];
        if text[i - 1] == b' ' && matches!(x, b'?' | b'!' | b'.' | b',') {
            total -= 1;
        }
        text[total] = x;
        total += 1;
    }
    // Pass 2: a single apostrophe between spaces.
    let total2 = total;
    total = usize::from(total2 > 0);
    let mut i = 1;
    while i < total2 {
        let x = text[i];
        if x == b'\'' && i + 1 < total2 && text[i - 1] == b' ' && text[i + 1] == b' ' {
            total -= 1;
            i += 1;
            text[i] = 0;
        }
        text[total] = x;
        total += 1;
        i += 1;
    }
    // Pass 3: contractions.
    let total3 = total;
    total = usize::from(total3 > 0);
    for i in 1..total3 {
        let x = text[i];
        if text[i - 1] == b' ' && x == b'\'' && i + 1 < total3 {
            let x1 = text[i + 1];
            if matches!(x1, b's' | b'm') {
                total -= 1;
            } else if !matches!(x1, b't' | b'd') && i + 2 < total3 {
                let x2 = text[i + 2];
                if (x1 == b'r' || x1 == b'v') && x2 == b'e' {
                    total -= 1;
                }
            }
        }
        text[total] = x;
        total += 1;
    }
    text.truncate(total);
}

/// Assembles streamed token pieces into text: returns the complete UTF-8 characters so far and
/// keeps an unfinished multi-byte character for the next piece. Invalid bytes become U+FFFD.
#[derive(Debug, Default, Clone)]
pub struct StreamDecoder {
    pending: Vec<u8>,
}

impl StreamDecoder {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `piece` and returns the text that is now complete (possibly empty).
    pub fn push(&mut self, piece: &[u8]) -> String {
        self.pending.extend_from_slice(piece);
        let mut out = String::new();
        loop {
            match std::str::from_utf8(&self.pending) {
                Ok(s) => {
                    out.push_str(s);
                    self.pending.clear();
                    return out;
                }
                Err(e) => {
                    let good = e.valid_up_to();
                    // The prefix up to valid_up_to() is valid UTF-8.
                    out.push_str(std::str::from_utf8(&self.pending[..good]).unwrap_or_default());
                    match e.error_len() {
                        None => {
                            self.pending.drain(..good);
                            return out;
                        }
                        Some(bad) => {
                            out.push('\u{FFFD}');
                            self.pending.drain(..good + bad);
                        }
                    }
                }
            }
        }
    }

    /// Flushes what is left (an unfinished character becomes U+FFFD).
    pub fn finish(&mut self) -> String {
        let out = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn clean(s: &str) -> String {
        let mut v = s.as_bytes().to_vec();
        clean_spaces(&mut v);
        String::from_utf8(v).unwrap()
    }

    #[test]
    fn clean_spaces_follows_llama_cpp() {
        assert_eq!(clean("Hello , world !"), "Hello, world!");
        assert_eq!(clean("a ' b"), "a'b");
        assert_eq!(
            clean("it 's I 'm we 're they 've don 't I 'd we 'll"),
            "it's I'm we're they've don 't I 'd we 'll"
        );
        assert_eq!(clean(""), "");
        assert_eq!(clean(" ."), ".");
    }

    #[test]
    fn stream_decoder_holds_split_characters() {
        let mut d = StreamDecoder::new();
        let euro = "€".as_bytes();
        assert_eq!(d.push(b"a"), "a");
        assert_eq!(d.push(&euro[..1]), "");
        assert_eq!(d.push(&euro[1..2]), "");
        assert_eq!(d.push(&euro[2..]), "€");
        assert_eq!(d.push(&[0xff, b'b']), "\u{FFFD}b");
        assert_eq!(d.push(&euro[..2]), "");
        assert_eq!(d.finish(), "\u{FFFD}");
    }
}
