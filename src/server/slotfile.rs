//! Slot save files (`POST /slots/{id}?action=save|restore`, llama-server's `--slot-save-path`):
//! a slot's tokens and the cache rows that hold them, in our own format.
//!
//! Layout (little-endian): the magic `PMOESLOT`, the format version (u32), a zero u32, the
//! model's fingerprint (u64, [`model_fingerprint`]), the cache layout's hash (u64, of
//! `BatchModel::seq_layout`'s description: tensors, types, row sizes), the bytes of one
//! position's state (u64), the token count n (u64); then n token ids (u32) and n positions'
//! state, tensor by tensor. A file is refused, naming it and saying why, unless every one of
//! those matches this server and its length is exactly what the header implies; nothing in a
//! file can make the reader allocate more than the file's own size.
//!
//! Filenames are checked as llama-server checks them (`fs_validate_filename`): one plain name
//! inside the save directory, never a path.
use crate::gguf::GgufModel;
use std::path::Path;

pub const MAGIC: &[u8; 8] = b"PMOESLOT";
pub const VERSION: u32 = 1;
/// Bytes before the tokens.
pub const HEADER: usize = 48;

/// FNV-1a, 64 bits, over `bytes`, continuing from `h`.
fn fnv(mut h: u64, bytes: &[u8]) -> u64 {
    for &b in bytes {
        h = (h ^ b as u64).wrapping_mul(0x100000001b3);
    }
    h
}

const FNV_START: u64 = 0xcbf29ce484222325;

/// The hash of a cache layout's description.
pub fn layout_hash(desc: &str) -> u64 {
    fnv(FNV_START, desc.as_bytes())
}

/// A fingerprint of the model file: each shard's size, its header and metadata bytes (names,
/// shapes and types of every tensor, the tokenizer, the hyperparameters) and the first 64
/// bytes of every tensor's data (two fine-tunes of one base differ there). Cheap: a few MB of
/// reads at most, without touching the bulk of the weights.
pub fn model_fingerprint(file: &GgufModel) -> u64 {
    let mut h = FNV_START;
    for shard in file.shards() {
        h = fnv(h, &shard.file_size().to_le_bytes());
        let head = (shard.data_offset() as usize).min(shard.bytes().len());
        h = fnv(h, &shard.bytes()[..head]);
        for t in shard.tensors() {
            let data = shard.tensor_data(t);
            h = fnv(h, &data[..data.len().min(64)]);
        }
    }
    h
}

/// Whether `name` may name a file in the save directory: llama-server's rules (its
/// `fs_validate_filename`, restated): not empty, at most 255 bytes, no control characters, no
/// path separators or characters Windows forbids (`/ \ : * ? " < > |`), not `.` or `..`, no
/// leading or trailing space and no trailing dot.
pub fn valid_filename(name: &str) -> bool {
    if name.is_empty() || name.len() > 255 || name == "." || name == ".." {
        return false;
    }
    if name.starts_with(' ') || name.ends_with(' ') || name.ends_with('.') {
        return false;
    }
    !name.chars().any(|c| {
        c.is_control()
            || matches!(c, '/' | '\\' | ':' | '*' | '?' | '"' | '<' | '>' | '|')
            || c == '\u{FFFD}'
    })
}

/// What a file must match to be restored here.
#[derive(Debug, Clone, Copy)]
pub struct Expect {
    pub model: u64,
    pub layout: u64,
    pub row_bytes: usize,
    /// The most tokens a slot holds (its context).
    pub max_tokens: usize,
    pub n_vocab: usize,
}

/// The bytes of a save file.
pub fn encode(e: &Expect, tokens: &[u32], state: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER + 4 * tokens.len() + state.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&VERSION.to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes());
    out.extend_from_slice(&e.model.to_le_bytes());
    out.extend_from_slice(&e.layout.to_le_bytes());
    out.extend_from_slice(&(e.row_bytes as u64).to_le_bytes());
    out.extend_from_slice(&(tokens.len() as u64).to_le_bytes());
    for t in tokens {
        out.extend_from_slice(&t.to_le_bytes());
    }
    out.extend_from_slice(state);
    out
}

/// Writes `bytes` to `path` whole or not at all (a temporary file beside it, then renamed).
pub fn write(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".partial");
    let tmp = std::path::PathBuf::from(tmp);
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(&tmp, path).inspect_err(|_| {
        let _ = std::fs::remove_file(&tmp);
    })
}

/// The tokens and the state of a save file's bytes (`name` is the file's name, for messages),
/// or why it cannot be restored here.
pub fn decode(name: &str, bytes: &[u8], e: &Expect) -> Result<(Vec<u32>, Vec<u8>), String> {
    let bad = |why: String| format!("slot file {name}: {why}");
    if bytes.len() < HEADER {
        return Err(bad(format!(
            "{} bytes, shorter than the {HEADER}-byte header of a slot file (truncated, or not a slot file)",
            bytes.len()
        )));
    }
    if &bytes[..8] != MAGIC {
        return Err(bad("not a PocketMoE slot file (wrong magic)".into()));
    }
    let u32_at = |o: usize| u32::from_le_bytes(bytes[o..o + 4].try_into().expect("4 bytes"));
    let u64_at = |o: usize| u64::from_le_bytes(bytes[o..o + 8].try_into().expect("8 bytes"));
    let version = u32_at(8);
    if version != VERSION {
        return Err(bad(format!(
            "format version {version}, this server reads version {VERSION}"
        )));
    }
    if u64_at(16) != e.model {
        return Err(bad(
            "saved from a different model than the one this server runs".into(),
        ));
    }
    let row_bytes = u64_at(32);
    if u64_at(24) != e.layout || row_bytes != e.row_bytes as u64 {
        return Err(bad(
            "saved with a different KV cache layout (cache type -ctk/-ctv, or the model's attention) than this server's".into(),
        ));
    }
    let n = u64_at(40);
    if n > e.max_tokens as u64 {
        return Err(bad(format!(
            "holds {n} tokens, more than the {} of a slot's context here",
            e.max_tokens
        )));
    }
    let n = n as usize; // <= max_tokens, a usize
    let want = n
        .checked_mul(4 + e.row_bytes)
        .and_then(|b| b.checked_add(HEADER));
    if want != Some(bytes.len()) {
        return Err(bad(format!(
            "{} bytes, but its header says {n} tokens of {} bytes each: {} bytes (truncated or corrupt)",
            bytes.len(),
            4 + e.row_bytes,
            want.map_or("more than can be addressed".to_string(), |w| w.to_string())
        )));
    }
    let tokens: Vec<u32> = bytes[HEADER..HEADER + 4 * n]
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes(c.try_into().expect("4 bytes")))
        .collect();
    if let Some(&t) = tokens.iter().find(|&&t| t as usize >= e.n_vocab) {
        return Err(bad(format!(
            "token id {t} is outside the vocabulary (0..{}) (corrupt)",
            e.n_vocab
        )));
    }
    Ok((tokens, bytes[HEADER + 4 * n..].to_vec()))
}

#[cfg(test)]
mod tests {
    use super::*;

    const E: Expect = Expect {
        model: 7,
        layout: 9,
        row_bytes: 6,
        max_tokens: 100,
        n_vocab: 50,
    };

    #[test]
    fn round_trip_and_every_mismatch_is_refused() {
        let tokens = [1u32, 2, 49];
        let state: Vec<u8> = (0..18).collect();
        let b = encode(&E, &tokens, &state);
        assert_eq!(b.len(), HEADER + 12 + 18);
        assert_eq!(decode("x", &b, &E).unwrap(), (tokens.to_vec(), state));
        let err = |b: &[u8], e: &Expect| decode("x.bin", b, e).unwrap_err();
        assert!(err(&b[..b.len() - 1], &E).contains("truncated"));
        assert!(err(&b[..10], &E).contains("shorter than"));
        assert!(err(b"garbage garbage garbage garbage garbage garbage!!", &E).contains("magic"));
        let mut v = b.clone();
        v[8] = 2;
        assert!(err(&v, &E).contains("version 2"));
        assert!(err(&b, &Expect { model: 8, ..E }).contains("different model"));
        assert!(err(&b, &Expect { layout: 1, ..E }).contains("layout"));
        assert!(err(&b, &Expect { row_bytes: 5, ..E }).contains("layout"));
        assert!(err(&b, &Expect { max_tokens: 2, ..E }).contains("holds 3 tokens"));
        assert!(err(&b, &Expect { n_vocab: 49, ..E }).contains("token id 49"));
        // A huge count in the header is refused before anything is allocated for it.
        let mut v = b.clone();
        v[40..48].copy_from_slice(&u64::MAX.to_le_bytes());
        let big = Expect {
            max_tokens: usize::MAX,
            ..E
        };
        assert!(err(&v, &big).contains("corrupt"));
        assert!(err(&b[..5], &E).starts_with("slot file x.bin: "));
    }

    #[test]
    fn filenames_as_llama_server() {
        for ok in ["x.bin", "slot 1.bin", "a..b", ".hidden", "naïve.bin"] {
            assert!(valid_filename(ok), "{ok}");
        }
        let long = "a".repeat(256);
        for bad in [
            "",
            ".",
            "..",
            "../x",
            "a/b",
            "a\\b",
            "/etc/passwd",
            "c:x",
            "x.bin.",
            " x",
            "x ",
            "a\nb",
            "a\0b",
            "a*b",
            "a?b",
            "a|b",
            &long,
        ] {
            assert!(!valid_filename(bad), "{bad:?}");
        }
    }
}
