//! A synthetic byte-level BPE vocabulary of any size that llama.cpp accepts (`gpt2` tokenizer
//! model): the 256 GPT-2 byte symbols, then merged tokens (all two-letter, then three-letter
//! alphanumeric strings, each with the merge that builds it), then control tokens.
//!
//! Invariant: every merge `"a b"` joins two tokens that exist and yields a token that exists, so
//! both llama.cpp and our tokenizer can build the same merge table.

/// The control tokens every synthetic vocabulary ends with (ChatML and harmony markers).
pub const SPECIALS: [&str; 8] = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|start|>",
    "<|end|>",
    "<|message|>",
    "<|channel|>",
    "<|return|>",
];

/// GPT-2's byte -> printable char mapping (`bytes_to_unicode`).
pub fn byte_to_char(b: u8) -> char {
    let printable = |b: u8| (33..=126).contains(&b) || (161..=172).contains(&b) || b >= 174;
    if printable(b) {
        return b as char;
    }
    let n = (0..b).filter(|&x| !printable(x)).count() as u32;
    char::from_u32(256 + n).expect("valid code point")
}

#[derive(Debug, Clone)]
pub struct Vocab {
    pub tokens: Vec<String>,
    /// llama.cpp token types: 1 normal, 3 control, 6 byte.
    pub types: Vec<i32>,
    pub merges: Vec<String>,
    pub bos: u32,
    pub eos: u32,
    /// `tokenizer.ggml.pre` for the architecture's real tokenizer family.
    pub pre: &'static str,
}

/// Builds a vocabulary of exactly `n_vocab` tokens (at least 256 + the control tokens).
pub fn build(pre: &'static str, n_vocab: usize) -> Result<Vocab, String> {
    let n_normal = n_vocab
        .checked_sub(SPECIALS.len())
        .filter(|&n| n >= 256)
        .ok_or_else(|| {
            format!(
                "vocabulary of {n_vocab} tokens is too small (need at least {})",
                256 + SPECIALS.len()
            )
        })?;
    let alphabet: Vec<char> = ('a'..='z').chain('A'..='Z').chain('0'..='9').collect();
    let mut tokens: Vec<String> = (0..=255u8).map(|b| byte_to_char(b).to_string()).collect();
    let mut types = vec![1; 256];
    let mut merges = Vec::new();
    let a = alphabet.len();
    'outer: for len in 2..=4usize {
        let count = a.pow(len as u32);
        for idx in 0..count {
            if tokens.len() == n_normal {
                break 'outer;
            }
            let mut s = String::with_capacity(len);
            let mut rest = idx;
            for _ in 0..len {
                s.insert(0, alphabet[rest % a]);
                rest /= a;
            }
            let (head, last) = s.split_at(len - 1);
            merges.push(format!("{head} {last}"));
            tokens.push(s);
            types.push(1);
        }
    }
    if tokens.len() != n_normal {
        return Err(format!(
            "vocabulary of {n_vocab} tokens is larger than the synthetic generator supports"
        ));
    }
    let first_special = tokens.len() as u32;
    for s in SPECIALS {
        tokens.push(s.to_string());
        types.push(3);
    }
    Ok(Vocab {
        tokens,
        types,
        merges,
        bos: first_special,
        eos: first_special + 2,
        pre,
    })
}

/// A ChatML chat template (Qwen style), enough for llama.cpp and minijinja to render prompts.
pub const CHATML_TEMPLATE: &str = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn vocab_sizes_and_merges_are_consistent() {
        for n in [1024usize, 151936, 201088] {
            let v = build("qwen2", n).unwrap();
            assert_eq!(v.tokens.len(), n);
            assert_eq!(v.types.len(), n);
            let set: HashSet<&str> = v.tokens.iter().map(String::as_str).collect();
            assert_eq!(set.len(), n, "tokens are unique");
            for m in &v.merges {
                let (x, y) = m.split_once(' ').unwrap();
                assert!(
                    set.contains(x) && set.contains(y),
                    "merge {m} joins unknown tokens"
                );
                assert!(
                    set.contains(format!("{x}{y}").as_str()),
                    "merge {m} builds an unknown token"
                );
            }
            assert_eq!(v.tokens[v.eos as usize], "<|im_end|>");
        }
        assert!(build("qwen2", 100).is_err());
    }

    #[test]
    fn byte_symbols_are_distinct() {
        let set: HashSet<char> = (0..=255u8).map(byte_to_char).collect();
        assert_eq!(set.len(), 256);
        assert_eq!(byte_to_char(b'A'), 'A');
        assert_eq!(byte_to_char(b' '), '\u{120}');
    }
}
