//! `GgufError`: the one error type of the GGUF layer, and `FormatError`, what exactly is wrong
//! with a malformed file.
//!
//! Invariant: every message names the file (or, for the writer before a file exists, the
//! writer), and for format errors also the byte offset of the field and the field itself, e.g.
//! `model.gguf: byte 1234: tensor info #17 "blk.3.ffn_up_exps.weight": offset: data [0x..,
//! 0x..) runs past the end of the file (size 5000)`. The checks behind the kinds follow ggml's
//! `gguf.cpp` (`gguf_init_from_reader`), plus a few it leaves out (overlapping tensors, data past
//! the end of the file, nesting depth).
use std::path::{Path, PathBuf};

use super::value::GgufValueType;

/// Errors of the GGUF reader and writer. Every variant names the file it is about.
#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    /// Opening, mapping, sizing or writing a file failed.
    #[error("{}: {op}: {source}", path.display())]
    Io {
        path: PathBuf,
        op: &'static str,
        #[source]
        source: std::io::Error,
    },
    /// The file is not a well-formed GGUF file: `field` at byte `offset` is wrong as `kind` says.
    #[error("{}: byte {offset}: {field}: {kind}", path.display())]
    Format {
        path: PathBuf,
        offset: u64,
        field: String,
        kind: FormatError,
    },
    /// A shard of a split bundle could not be found.
    #[error("{}: split bundle opened from {}: shard {no} of {count} is missing: {source}",
        path.display(), opened_from.display())]
    MissingShard {
        /// The missing shard file.
        path: PathBuf,
        opened_from: PathBuf,
        /// 1-based, as in the file name.
        no: u32,
        count: u32,
        #[source]
        source: std::io::Error,
    },
    /// A metadata key that a caller requires is missing or has the wrong type.
    #[error("{}: {}metadata key {key:?}: {msg}", path.display(),
        offset.map(|o| format!("byte {o}: ")).unwrap_or_default())]
    Key {
        path: PathBuf,
        /// Where the key-value pair starts, when the key exists.
        offset: Option<u64>,
        key: String,
        msg: String,
    },
    /// The writer was asked for something GGUF (or ggml's reader) cannot represent.
    #[error("GGUF writer: {field}: {msg}")]
    Writer { field: String, msg: String },
    /// The caller's fill callback failed for a tensor.
    #[error("{}: filling tensor #{index} {name:?}: {source}", path.display())]
    Fill {
        path: PathBuf,
        index: usize,
        name: String,
        #[source]
        source: std::io::Error,
    },
}

impl GgufError {
    /// The format error kind, for errors about a malformed file.
    pub fn format_kind(&self) -> Option<&FormatError> {
        match self {
            GgufError::Format { kind, .. } => Some(kind),
            _ => None,
        }
    }

    pub(crate) fn io(path: &Path, op: &'static str, source: std::io::Error) -> Self {
        GgufError::Io {
            path: path.to_path_buf(),
            op,
            source,
        }
    }

    pub(crate) fn writer(field: impl Into<String>, msg: impl Into<String>) -> Self {
        GgufError::Writer {
            field: field.into(),
            msg: msg.into(),
        }
    }
}

/// What is wrong with a field of a malformed GGUF file.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum FormatError {
    #[error("truncated: needs {need} bytes but only {available} remain")]
    Truncated { need: u64, available: u64 },
    #[error("bad magic {0:02x?} (expected \"GGUF\"): not a GGUF file")]
    BadMagic([u8; 4]),
    #[error("GGUF v1 is not supported (convert the file with a current llama.cpp)")]
    VersionV1,
    #[error(
        "version reads as {0:#010x}: a big-endian GGUF file; big-endian GGUF is not supported"
    )]
    BigEndian(u32),
    #[error("unsupported GGUF version {0} (supported: 2 and 3)")]
    UnsupportedVersion(u32),
    #[error("string length {len} runs past the end of the file ({available} bytes remain)")]
    StringPastEof { len: u64, available: u64 },
    #[error("string length {len} exceeds the limit of {max} bytes")]
    StringTooLong { len: u64, max: u64 },
    #[error("invalid UTF-8 at byte {valid_up_to} of the string")]
    InvalidUtf8 { valid_up_to: usize },
    #[error("unknown value type {0} (known: 0..=12)")]
    UnknownValueType(u32),
    #[error("bool value is {0}, must be 0 or 1")]
    BadBool(u8),
    #[error("array count {count} is absurd: {count} {elem} elements need at least {need} bytes but only {available} remain")]
    ArrayTooLarge {
        count: u64,
        elem: GgufValueType,
        /// Saturated at u64::MAX (still a lower bound).
        need: u64,
        available: u64,
    },
    #[error("array count {count} exceeds ggml's limit of {max} elements")]
    ArrayCountLimit { count: u64, max: u64 },
    #[error("arrays nested {depth} deep (at most {max} allowed)")]
    ArrayTooDeep { depth: u32, max: u32 },
    #[error("{count} is absurd: at least {need} bytes needed but only {available} remain")]
    CountTooLarge {
        count: u64,
        /// Saturated at u64::MAX (still a lower bound).
        need: u64,
        available: u64,
    },
    #[error("key is empty")]
    EmptyKey,
    #[error("duplicate key (first defined at byte {first_at})")]
    DuplicateKey { first_at: u64 },
    #[error("must be of type u32, found {0}")]
    AlignmentType(GgufValueType),
    #[error("alignment {0} is not a nonzero power of two")]
    BadAlignment(u64),
    #[error("tensor name is {len} bytes, ggml allows at most {max}")]
    NameTooLong { len: u64, max: u64 },
    #[error("duplicate tensor name (first defined by tensor info #{first_index}{first_file})")]
    DuplicateTensor {
        first_index: usize,
        /// `" in <file>"` when the first definition is in another shard, else empty.
        first_file: String,
    },
    #[error("n_dims is {0}, must be 1..=4")]
    BadNDims(u32),
    #[error("ne[{dim}] is 0 (empty tensors are not allowed)")]
    ZeroDim { dim: usize },
    #[error("ne[{dim}] = {value} exceeds i64::MAX")]
    DimTooLarge { dim: usize, value: u64 },
    #[error("shape {ne:?} has more than i64::MAX elements")]
    ShapeOverflow { ne: [u64; 4] },
    #[error("unknown ggml type id {0}")]
    UnknownGgmlType(u32),
    #[error("ne0 = {ne0} is not a multiple of {ty}'s block size {block}")]
    BlockSize {
        ne0: u64,
        ty: &'static str,
        block: u64,
    },
    #[error("byte size of shape {ne:?} overflows u64")]
    SizeOverflow { ne: [u64; 4] },
    #[error("offset {offset:#x} is not a multiple of the alignment {alignment}")]
    Misaligned { offset: u64, alignment: u64 },
    #[error("data [{start:#x}, {start:#x} + {n_bytes} bytes) runs past the end of the file (size {file_size})")]
    PastEnd {
        start: u64,
        n_bytes: u64,
        file_size: u64,
    },
    #[error("data [{start:#x}, {end:#x}) overlaps tensor {other:?} at [{other_start:#x}, {other_end:#x})")]
    Overlap {
        start: u64,
        end: u64,
        other: String,
        other_start: u64,
        other_end: u64,
    },
    #[error("split bundle: {0}")]
    Split(String),
}
