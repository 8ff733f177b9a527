//! GGUF: the model file format of llama.cpp. A zero-copy reader (mmap; tensor data are slices of
//! the map), split bundles (`<prefix>-00001-of-00003.gguf`), and a parallel writer.
//!
//! Follows the GGUF spec (llama.cpp `ggml/docs/gguf.md`) and ggml's reference implementation
//! `ggml/src/gguf.cpp` of the llama.cpp we link (llama-cpp-sys-2 0.1.161); [`crate::ggml::gguf_ref`] calls
//! that implementation directly so tests can compare against it.
//!
//! Layout (little-endian): `"GGUF"`, u32 version (2 or 3), u64 n_tensors, u64 n_kv, n_kv
//! key-value pairs, n_tensors tensor infos (name, u32 n_dims, u64 ne[n_dims], u32 ggml type,
//! u64 offset), padding to `general.alignment` (default 32), then the data section.
//!
//! Invariants: parsing never panics, never reads outside its input and never allocates in
//! proportion to a length field before checking it against the bytes that remain; every
//! [`GgufError`] names the file, and format errors the byte offset and the field. What the
//! writer produces, ggml's reader accepts (checked by the tests against `gguf_init_from_file`).

/// Typed read access to GGUF metadata: a file's ([`GgufHeader`], [`GgufFile`]), a split
/// bundle's (its first shard's, [`GgufModel`]) or a map in tests. An implementation gives
/// [`get`](Self::get) and [`origin`](Self::origin); the typed getters, the `require_*` checks
/// (errors naming the file, the key and its byte offset) and the integer-array view the
/// hyper-parameters read are written once, here.
pub trait Metadata {
    /// The value of `key`.
    fn get(&self, key: &str) -> Option<&GgufValue>;
    /// The file the metadata was read from and the byte offset of `key`'s pair in it (`None`:
    /// the key is missing, or the metadata is not from a file), for errors.
    fn origin(&self, key: &str) -> (&Path, Option<u64>);

    /// Whether `key` is present with any value.
    fn has(&self, key: &str) -> bool {
        self.get(key).is_some()
    }
    /// Any integer type whose value fits in u32.
    fn get_u32(&self, key: &str) -> Option<u32> {
        self.get(key)?.as_u32()
    }
    /// Any integer type whose value fits in u64.
    fn get_u64(&self, key: &str) -> Option<u64> {
        self.get(key)?.as_u64()
    }
    /// Any integer type whose value fits in i32.
    fn get_i32(&self, key: &str) -> Option<i32> {
        self.get(key)?.as_i32()
    }
    /// Any integer type whose value fits in i64.
    fn get_i64(&self, key: &str) -> Option<i64> {
        self.get(key)?.as_i64()
    }
    /// F32, F64 (rounded) or an integer of magnitude <= 2^24.
    fn get_f32(&self, key: &str) -> Option<f32> {
        self.get(key)?.as_f32()
    }
    /// F32, F64 or an integer of magnitude <= 2^53.
    fn get_f64(&self, key: &str) -> Option<f64> {
        self.get(key)?.as_f64()
    }
    fn get_bool(&self, key: &str) -> Option<bool> {
        self.get(key)?.as_bool()
    }
    fn get_str(&self, key: &str) -> Option<&str> {
        self.get(key)?.as_str()
    }
    fn get_array(&self, key: &str) -> Option<&GgufArray> {
        self.get(key)?.as_array()
    }
    fn get_str_array(&self, key: &str) -> Option<&[String]> {
        self.get_array(key)?.as_strs()
    }
    fn get_i32_array(&self, key: &str) -> Option<&[i32]> {
        self.get_array(key)?.as_i32s()
    }
    fn get_u32_array(&self, key: &str) -> Option<&[u32]> {
        self.get_array(key)?.as_u32s()
    }
    fn get_f32_array(&self, key: &str) -> Option<&[f32]> {
        self.get_array(key)?.as_f32s()
    }
    /// Length of an array value (e.g. `tokenizer.ggml.tokens`).
    fn get_array_len(&self, key: &str) -> Option<u64> {
        self.get_array(key).map(|a| a.len() as u64)
    }
    /// Elements of a non-negative integer or bool array (bools as 0/1), e.g. deepseek4's
    /// `attention.compress_ratios` or a per-layer `attention.sliding_window_pattern`; `None`
    /// when the key is absent or not such an array.
    fn get_u64_array(&self, key: &str) -> Option<Vec<u64>> {
        let a = self.get_array(key)?;
        if let Some(b) = a.as_bools() {
            return Some(b.iter().map(|&x| u64::from(x)).collect());
        }
        a.to_i64_vec()?
            .into_iter()
            .map(|v| u64::try_from(v).ok())
            .collect()
    }
    /// `conv` applied to the value of `key`; a [`GgufError::Key`] naming the file, the key,
    /// its byte offset and `expected` if the key is missing or `conv` returns `None`.
    fn require<'s, T>(
        &'s self,
        key: &str,
        expected: &str,
        conv: impl FnOnce(&'s GgufValue) -> Option<T>,
    ) -> Result<T, GgufError>
    where
        Self: Sized,
    {
        let (path, offset) = self.origin(key);
        let err = |offset, msg| GgufError::Key {
            path: path.to_path_buf(),
            offset,
            key: key.to_string(),
            msg,
        };
        let Some(v) = self.get(key) else {
            return Err(err(None, format!("missing (expected {expected})")));
        };
        let shown = match v {
            GgufValue::Str(_) | GgufValue::Array(_) => String::new(),
            v => format!(" {v}"),
        };
        conv(v).ok_or_else(|| {
            let msg = format!("is {}{shown}, expected {expected}", v.type_name());
            err(offset, msg)
        })
    }
    fn require_u32(&self, key: &str) -> Result<u32, GgufError>
    where
        Self: Sized,
    {
        self.require(key, "an integer in u32 range", |v| v.as_u32())
    }
    fn require_u64(&self, key: &str) -> Result<u64, GgufError>
    where
        Self: Sized,
    {
        self.require(key, "an integer in u64 range", |v| v.as_u64())
    }
    fn require_f32(&self, key: &str) -> Result<f32, GgufError>
    where
        Self: Sized,
    {
        self.require(key, "a number", |v| v.as_f32())
    }
    fn require_bool(&self, key: &str) -> Result<bool, GgufError>
    where
        Self: Sized,
    {
        self.require(key, "a bool", |v| v.as_bool())
    }
    fn require_str(&self, key: &str) -> Result<&str, GgufError>
    where
        Self: Sized,
    {
        self.require(key, "a string", |v| v.as_str())
    }
    fn require_str_array(&self, key: &str) -> Result<&[String], GgufError>
    where
        Self: Sized,
    {
        self.require(key, "an array of strings", |v| v.as_array()?.as_strs())
    }
}

mod error;

mod header;
mod reader;
mod value;
mod writer;

pub use error::{FormatError, GgufError};
pub use header::{GgufHeader, TensorInfo};
pub use reader::{parse_split_path, split_path, GgufFile, GgufModel};
pub use value::{GgufArray, GgufValue, GgufValueType, MAX_ARRAY_DEPTH};

use std::path::Path;
pub use writer::GgufWriter;

/// The first four bytes of every GGUF file.
pub const GGUF_MAGIC: &[u8; 4] = b"GGUF";
/// The version the writer produces.
pub const GGUF_VERSION: u32 = 3;
/// Alignment of the data section and of tensor offsets when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// ggml's `GGML_MAX_NAME`: tensor names must be shorter than this (they are NUL-terminated there).
pub const MAX_TENSOR_NAME: u64 = 64;

/// Metadata keys this module interprets.
pub const KEY_ALIGNMENT: &str = "general.alignment";
pub const KEY_SPLIT_NO: &str = "split.no";
pub const KEY_SPLIT_COUNT: &str = "split.count";
pub const KEY_SPLIT_TENSORS_COUNT: &str = "split.tensors.count";
