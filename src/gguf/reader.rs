//! The zero-copy GGUF reader: `GgufFile` (one memory-mapped file), `GgufModel` (one model: a
//! single file or a split bundle `<prefix>-00001-of-0000N.gguf` ... presented as one index of
//! `TensorInfo`s).
//!
//! Follows ggml's `gguf.cpp` for the file format (through [`GgufHeader::parse`]) and llama.cpp's
//! split convention (`llama_split_path`, `gguf-split`): shard files are named
//! `<prefix>-%05d-of-%05d.gguf` (1-based), and carry `split.no` (0-based), `split.count` and
//! `split.tensors.count` (the bundle's total); the first shard holds the model's metadata.
//!
//! Invariants: tensor data are never copied: `tensor_data` returns a slice of the map, and every
//! `TensorInfo` of an opened file or model lies inside its shard's map (checked when parsing). A
//! bundle's shards agree with their file names, their count and the total tensor count, and its
//! tensor names are unique across shards.
use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use indexmap::IndexMap;
use memmap2::Mmap;

use super::error::{FormatError, GgufError};
use super::header::{GgufHeader, TensorInfo};
use super::value::GgufValue;
use super::{Metadata, KEY_SPLIT_COUNT, KEY_SPLIT_NO, KEY_SPLIT_TENSORS_COUNT};

/// One memory-mapped GGUF file with its validated header.
pub struct GgufFile {
    header: GgufHeader,
    map: Mmap,
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("header", &self.header)
            .finish_non_exhaustive()
    }
}

impl GgufFile {
    /// Maps and parses `path`.
    pub fn open(path: &Path) -> Result<Self, GgufError> {
        Self::open_shard(path, 0)
    }

    fn open_shard(path: &Path, shard: usize) -> Result<Self, GgufError> {
        let file = File::open(path).map_err(|e| GgufError::io(path, "open", e))?;
        Self::map_shard(path, &file, shard)
    }

    fn map_shard(path: &Path, file: &File, shard: usize) -> Result<Self, GgufError> {
        // SAFETY: the map is read-only and private to us; like every mmap-based model loader
        // (llama.cpp's included) we rely on the file not being truncated or rewritten while it is
        // mapped. Everything read from it is bounds-checked against its length.
        let map = unsafe { Mmap::map(file) }.map_err(|e| GgufError::io(path, "mmap", e))?;
        let header = GgufHeader::parse_shard(path, &map, shard)?;
        Ok(GgufFile { header, map })
    }

    /// Parses a GGUF image held in memory (no file involved); `path` is used in messages only.
    pub fn parse(path: &Path, bytes: &[u8]) -> Result<GgufHeader, GgufError> {
        GgufHeader::parse(path, bytes)
    }

    pub fn header(&self) -> &GgufHeader {
        &self.header
    }
    /// The whole mapped file.
    pub fn bytes(&self) -> &[u8] {
        &self.map
    }
    pub fn path(&self) -> &Path {
        self.header.path()
    }
    pub fn version(&self) -> u32 {
        self.header.version()
    }
    pub fn alignment(&self) -> u64 {
        self.header.alignment()
    }
    pub fn data_offset(&self) -> u64 {
        self.header.data_offset()
    }
    pub fn file_size(&self) -> u64 {
        self.header.file_size()
    }
    pub fn metadata(&self) -> &IndexMap<String, GgufValue> {
        self.header.metadata()
    }
    pub fn tensors(&self) -> &[TensorInfo] {
        self.header.tensors()
    }
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.header.tensor(name)
    }

    /// The bytes of `t`, a slice of the map. Panics if `t` does not describe a range of this
    /// file (it was not taken from it).
    pub fn tensor_data(&self, t: &TensorInfo) -> &[u8] {
        t.offset
            .checked_add(t.n_bytes)
            .and_then(|end| self.map.get(t.offset as usize..end as usize))
            .unwrap_or_else(|| panic!("tensor {:?} is not in {}", t.name, self.path().display()))
    }

    /// Lets the kernel drop this process's pages of `t`'s bytes (after they were copied into
    /// backend buffers), so that a loaded model does not hold the file twice in its resident
    /// set. The map stays valid: a later read faults the pages in again from the file.
    pub fn release(&self, t: &TensorInfo) {
        let (Ok(off), Ok(len)) = (usize::try_from(t.offset), usize::try_from(t.n_bytes)) else {
            return;
        };
        if len == 0 || off.checked_add(len).is_none_or(|end| end > self.map.len()) {
            return;
        }
        // SAFETY: the map is private and read-only, so dropping its pages loses nothing (they
        // are re-read from the file on the next access); no Rust reference into these bytes is
        // alive across this call by the callers' use (they copy the slice first).
        let _ = unsafe {
            self.map
                .unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, off, len)
        };
    }
}

/// The file's metadata.
impl Metadata for GgufFile {
    fn get(&self, key: &str) -> Option<&GgufValue> {
        self.header.get(key)
    }
    fn origin(&self, key: &str) -> (&Path, Option<u64>) {
        self.header.origin(key)
    }
}

/// `<prefix>-<index+1:05>-of-<count:05>.gguf`, llama.cpp's name for shard `index` (0-based).
pub fn split_path(prefix: &Path, index: u32, count: u32) -> PathBuf {
    let mut s = prefix.as_os_str().to_os_string();
    s.push(format!("-{:05}-of-{:05}.gguf", index + 1, count));
    PathBuf::from(s)
}

/// Inverse of [`split_path`]: `(prefix, index (0-based), count)` if `path` names a shard.
pub fn parse_split_path(path: &Path) -> Option<(PathBuf, u32, u32)> {
    let s = path.to_str()?;
    let stem = s.strip_suffix(".gguf")?;
    let (rest, count) = stem.rsplit_once("-of-")?;
    let (prefix, no) = rest.rsplit_once('-')?;
    let digits = |d: &str| d.len() >= 5 && d.bytes().all(|b| b.is_ascii_digit());
    if !digits(no) || !digits(count) || prefix.is_empty() {
        return None;
    }
    let (no, count): (u32, u32) = (no.parse().ok()?, count.parse().ok()?);
    if no == 0 || no > count {
        return None;
    }
    Some((PathBuf::from(prefix), no - 1, count))
}

/// One model: a single GGUF file, or all shards of a split bundle behind one tensor index.
/// Metadata come from the first shard.
#[derive(Debug)]
pub struct GgufModel {
    shards: Vec<GgufFile>,
    /// name -> (shard, index within the shard's tensors)
    by_name: HashMap<String, (usize, usize)>,
    n_tensors: usize,
}

impl GgufModel {
    /// Opens `path`; if it is a shard of a split bundle (by its name or its `split.count`), finds
    /// and checks all the other shards.
    pub fn open(path: &Path) -> Result<Self, GgufError> {
        let given = |shard| GgufFile::open_shard(path, shard);
        let Some((prefix, index, count)) = parse_split_path(path) else {
            let file = given(0)?;
            if let Some(n) = file.get_u64(KEY_SPLIT_COUNT).filter(|&n| n > 1) {
                let msg = format!(
                    "the file says it is one of {n} shards, but its name does not follow \
                     <prefix>-NNNNN-of-NNNNN.gguf, so the other shards cannot be found"
                );
                return Err(split_err(&file, KEY_SPLIT_COUNT, msg));
            }
            return Self::from_shards(vec![file]);
        };
        // The named file first, so that its own errors come before those of other shards.
        let mut named = Some(given(index as usize)?);
        let mut shards = Vec::with_capacity(count as usize);
        for i in 0..count {
            let file = match named.take_if(|_| i == index) {
                Some(file) => file,
                None => {
                    let p = split_path(&prefix, i, count);
                    match File::open(&p) {
                        Ok(f) => GgufFile::map_shard(&p, &f, i as usize)?,
                        Err(source) if source.kind() == std::io::ErrorKind::NotFound => {
                            return Err(GgufError::MissingShard {
                                path: p,
                                opened_from: path.to_path_buf(),
                                no: i + 1,
                                count,
                                source,
                            })
                        }
                        Err(e) => return Err(GgufError::io(&p, "open", e)),
                    }
                }
            };
            check_shard(&file, i, count)?;
            shards.push(file);
        }
        Self::from_shards(shards)
    }

    fn from_shards(shards: Vec<GgufFile>) -> Result<Self, GgufError> {
        let n_tensors: usize = shards.iter().map(|s| s.tensors().len()).sum();
        if shards.len() > 1 {
            // Required in the first shard (where llama.cpp reads it), checked wherever present.
            for (i, s) in shards.iter().enumerate() {
                let Some(v) = s.get(KEY_SPLIT_TENSORS_COUNT) else {
                    if i == 0 {
                        let msg = "missing in the first shard of a split bundle".to_string();
                        return Err(split_err(s, KEY_SPLIT_TENSORS_COUNT, msg));
                    }
                    continue;
                };
                if v.as_u64() != Some(n_tensors as u64) {
                    let files = shards.len();
                    let msg = format!("is {v} but the {files} shards hold {n_tensors} tensors");
                    return Err(split_err(s, KEY_SPLIT_TENSORS_COUNT, msg));
                }
            }
        }
        let mut by_name: HashMap<String, (usize, usize)> = HashMap::with_capacity(n_tensors);
        for (si, s) in shards.iter().enumerate() {
            for (ti, t) in s.tensors().iter().enumerate() {
                if let Some(&(fs, fi)) = by_name.get(&t.name) {
                    let first_file = format!(" in {}", shards[fs].path().display());
                    return Err(GgufError::Format {
                        path: s.path().to_path_buf(),
                        offset: t.info_offset,
                        field: format!("tensor info #{ti} {:?}", t.name),
                        kind: FormatError::DuplicateTensor {
                            first_index: fi,
                            first_file,
                        },
                    });
                }
                by_name.insert(t.name.clone(), (si, ti));
            }
        }
        Ok(GgufModel {
            shards,
            by_name,
            n_tensors,
        })
    }

    /// The shard files, in order (one for an unsplit model).
    pub fn shards(&self) -> &[GgufFile] {
        &self.shards
    }
    /// The first shard's path.
    pub fn path(&self) -> &Path {
        self.shards[0].path()
    }
    pub fn paths(&self) -> Vec<&Path> {
        self.shards.iter().map(|s| s.path()).collect()
    }
    /// Total size of all shard files.
    pub fn file_size(&self) -> u64 {
        self.shards.iter().map(|s| s.file_size()).sum()
    }
    /// Metadata of the first shard (where a split bundle keeps the model's metadata).
    pub fn metadata(&self) -> &IndexMap<String, GgufValue> {
        self.shards[0].metadata()
    }
    pub fn n_tensors(&self) -> usize {
        self.n_tensors
    }
    /// All tensors: shard by shard, each in file order.
    pub fn tensors(&self) -> impl Iterator<Item = &TensorInfo> + '_ {
        self.shards.iter().flat_map(|s| s.tensors().iter())
    }
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        let &(s, i) = self.by_name.get(name)?;
        Some(&self.shards[s].tensors()[i])
    }
    /// The bytes of `t` in its shard's map (zero-copy). Panics if `t` is not from this model.
    pub fn tensor_data(&self, t: &TensorInfo) -> &[u8] {
        match self.shards.get(t.shard) {
            Some(s) => s.tensor_data(t),
            None => panic!("tensor {:?}: no shard {} in this model", t.name, t.shard),
        }
    }
    /// [`GgufFile::release`] in `t`'s shard.
    pub fn release(&self, t: &TensorInfo) {
        if let Some(s) = self.shards.get(t.shard) {
            s.release(t);
        }
    }
    /// The bytes of the tensor called `name`.
    pub fn tensor_bytes(&self, name: &str) -> Option<&[u8]> {
        self.tensor(name).map(|t| self.tensor_data(t))
    }
}

/// A bundle's metadata is its first shard's.
impl Metadata for GgufModel {
    fn get(&self, key: &str) -> Option<&GgufValue> {
        self.shards[0].header().get(key)
    }
    fn origin(&self, key: &str) -> (&Path, Option<u64>) {
        self.shards[0].header().origin(key)
    }
}

/// A split-bundle error about `key` of `file`, at the key's byte offset (0 if it is missing).
fn split_err(file: &GgufFile, key: &str, msg: String) -> GgufError {
    GgufError::Format {
        path: file.path().to_path_buf(),
        offset: file.header().kv_offset(key).unwrap_or(0),
        field: format!("key {key:?}"),
        kind: FormatError::Split(msg),
    }
}

/// Shard `index` (0-based) of `count` must say so in `split.no` / `split.count`.
fn check_shard(file: &GgufFile, index: u32, count: u32) -> Result<(), GgufError> {
    let name_says = format!("its file name says shard {} of {count}", index + 1);
    for (key, want) in [(KEY_SPLIT_NO, index), (KEY_SPLIT_COUNT, count)] {
        match file.get(key) {
            None if count == 1 => {}
            None => return Err(split_err(file, key, format!("missing, but {name_says}"))),
            Some(v) if v.as_u64() == Some(want.into()) => {}
            Some(v) => {
                let msg = format!("is {v}, but {name_says} (expected {want})");
                return Err(split_err(file, key, msg));
            }
        }
    }
    Ok(())
}
