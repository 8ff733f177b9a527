//! SentencePiece-style BPE (`tokenizer.ggml.model` = `llama`): start from single UTF-8 characters,
//! repeatedly merge the adjacent pair whose concatenation is the token with the highest score,
//! and spell characters that never became a token as `<0xXX>` byte tokens.
//!
//! Reference: `llm_tokenizer_spm_session` in llama.cpp `src/llama-vocab.cpp` (originally
//! llama.cpp commit 074bea2e), ported as written rather than built with the `tokenizers` crate:
//! HF's converted SPM models rank merges by a derived list whose ties can differ from
//! llama.cpp's "highest score, then leftmost" rule, and this loop is short.
//!
//! Invariants: the input is one text fragment with spaces already escaped to U+2581 (the caller
//! adds the leading space); merged symbols stay contiguous in the input, so a symbol is a byte
//! range; a final symbol is either a token or a single character, which goes out as bytes.
use super::vocab::Vocab;
use std::cmp::Ordering;
use std::collections::BinaryHeap;

struct Symbol {
    prev: Option<usize>,
    next: Option<usize>,
    start: usize,
    /// Byte length; 0 once merged into its left neighbour.
    len: usize,
}

struct Bigram {
    left: usize,
    right: usize,
    score: f32,
    size: usize,
}

impl PartialEq for Bigram {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Bigram {}
impl PartialOrd for Bigram {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Bigram {
    /// Max-heap order: higher score first, then the leftmost pair (llama.cpp's comparator).
    fn cmp(&self, other: &Self) -> Ordering {
        (self
            .score
            .partial_cmp(&other.score)
            .unwrap_or(Ordering::Equal))
        .then_with(|| other.left.cmp(&self.left))
    }
}

/// Appends the tokens of `text` (escaped, see the module docs) to `out`.
pub(crate) fn tokenize(v: &Vocab, text: &str, out: &mut Vec<u32>) {
    let mut symbols: Vec<Symbol> = Vec::with_capacity(text.len());
    for (i, (start, c)) in text.char_indices().enumerate() {
        symbols.push(Symbol {
            prev: i.checked_sub(1),
            next: Some(i + 1),
            start,
            len: c.len_utf8(),
        });
    }
    let Some(last) = symbols.last_mut() else {
        return;
    };
    last.next = None;

    let mut queue = BinaryHeap::new();
    let try_add = |symbols: &[Symbol], queue: &mut BinaryHeap<Bigram>, left, right| {
        let (Some(left), Some(right)) = (left, right) else {
            return;
        };
        let (l, r): (&Symbol, &Symbol) = (&symbols[left], &symbols[right]);
        let piece = &text[l.start..l.start + l.len + r.len];
        if let Some(id) = v.id(piece) {
            queue.push(Bigram {
                left,
                right,
                score: v.scores[id as usize],
                size: piece.len(),
            });
        }
    };
    for i in 1..symbols.len() {
        try_add(&symbols, &mut queue, Some(i - 1), Some(i));
    }
    while let Some(b) = queue.pop() {
        let (l, r) = (&symbols[b.left], &symbols[b.right]);
        if l.len == 0 || r.len == 0 || l.len + r.len != b.size {
            continue; // one side was merged away since this pair was queued
        }
        let (r_len, r_next) = (r.len, r.next);
        symbols[b.left].len += r_len;
        symbols[b.right].len = 0;
        symbols[b.left].next = r_next;
        if let Some(n) = r_next {
            symbols[n].prev = Some(b.left);
        }
        let prev = symbols[b.left].prev;
        try_add(&symbols, &mut queue, prev, Some(b.left));
        try_add(&symbols, &mut queue, Some(b.left), r_next);
    }

    let mut i = Some(0);
    while let Some(k) = i {
        let s = &symbols[k];
        let piece = &text[s.start..s.start + s.len];
        match v.id(piece) {
            Some(id) => out.push(id),
            None => out.extend(piece.bytes().filter_map(|b| byte_token(v, b))),
        }
        i = s.next;
    }
}

/// `<0xXX>`, else the byte itself as a token (llama.cpp's `byte_to_token` for SPM), else the
/// unknown token (llama.cpp throws here).
fn byte_token(v: &Vocab, b: u8) -> Option<u32> {
    v.id(&format!("<0x{b:02X}>"))
        .or_else(|| std::str::from_utf8(&[b]).ok().and_then(|s| v.id(s)))
        .or(v.special.unk)
}
