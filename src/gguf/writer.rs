//! `GgufWriter`: builds a GGUF v3 file from metadata and tensor shapes, then fills the tensor
//! data in parallel straight into a memory-mapped output file (no model-sized buffer).
//!
//! Follows the layout ggml's `gguf_write_to_file` produces (ggml/src/gguf.cpp, `gguf_writer`):
//! header, metadata in insertion order, tensor infos, zero padding to `general.alignment`, then
//! each tensor's data at offset = sum of the previous tensors' sizes each rounded up to the
//! alignment, the last one padded too. ggml's reader requires exactly this contiguous layout.
//!
//! Invariants: everything `add_tensor` accepts and `write` writes is accepted by our reader and
//! by ggml's (tensor names of 1..=63 bytes without NUL, no duplicates, nonzero dims, ne0 a
//! multiple of the block size, keys nonempty without NUL, alignment a u32 power of two, arrays
//! nested at most `MAX_ARRAY_DEPTH`; nested arrays themselves only by ours). The header is
//! written after all data, so a write that fails or is interrupted leaves a file that no GGUF
//! reader accepts (its magic is still zero); a failed write removes the file.
use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;

use indexmap::IndexMap;
use memmap2::MmapMut;

use super::error::GgufError;
use super::value::{encode_str, GgufArray, GgufValue, MAX_ARRAY_DEPTH};
use super::{DEFAULT_ALIGNMENT, GGUF_MAGIC, GGUF_VERSION, KEY_ALIGNMENT, MAX_TENSOR_NAME};
use crate::ggml::GgmlType;

/// ggml's `GGUF_MAX_STRING_LENGTH` / `GGUF_MAX_ARRAY_ELEMENTS`, which its reader enforces.
const MAX_LEN: usize = 1 << 30;

#[derive(Clone, Debug)]
struct PendingTensor {
    name: String,
    ty: GgmlType,
    ne: Vec<u64>,
    n_bytes: u64,
}

/// Where everything goes in the output file.
struct Layout {
    header: Vec<u8>,
    data_offset: u64,
    /// Per tensor, relative to the data section.
    offsets: Vec<u64>,
    total: u64,
}

/// Builder for one GGUF file. Metadata keep insertion order; `add_kv` with an existing key
/// replaces the value in place (the key keeps its position).
#[derive(Clone, Debug, Default)]
pub struct GgufWriter {
    metadata: IndexMap<String, GgufValue>,
    tensors: Vec<PendingTensor>,
    names: HashMap<String, usize>,
}

impl GgufWriter {
    /// A writer for GGUF v3 with the default alignment (32).
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets `general.alignment` (checked by `write`: must be a nonzero power of two).
    pub fn with_alignment(mut self, alignment: u32) -> Self {
        self.add_kv(KEY_ALIGNMENT, GgufValue::U32(alignment));
        self
    }

    /// Adds or replaces a metadata value. Nested arrays are valid GGUF and our reader reads them,
    /// but ggml's reader rejects them; llama.cpp models never use them.
    pub fn add_kv(&mut self, key: &str, value: impl Into<GgufValue>) {
        self.metadata.insert(key.to_string(), value.into());
    }

    pub fn metadata(&self) -> &IndexMap<String, GgufValue> {
        &self.metadata
    }

    /// Declares a tensor of type `ty` and shape `ne` (ne0 first, 1 to 4 dims); returns its index,
    /// which `write` passes to the fill callback. Tensors are stored in this order.
    pub fn add_tensor(&mut self, name: &str, ty: GgmlType, ne: &[u64]) -> Result<usize, GgufError> {
        let bad = |msg: String| GgufError::writer(format!("tensor {name:?}"), msg);
        if name.is_empty() || name.len() as u64 >= MAX_TENSOR_NAME {
            let max = MAX_TENSOR_NAME - 1;
            return Err(bad(format!(
                "name is {} bytes, must be 1..={max}",
                name.len()
            )));
        }
        if name.contains('\0') {
            return Err(bad(
                "name contains a NUL byte (ggml's C API would cut it there)".into(),
            ));
        }
        if let Some(&i) = self.names.get(name) {
            return Err(bad(format!("already added as tensor #{i}")));
        }
        if ne.is_empty() || ne.len() > 4 {
            return Err(bad(format!(
                "{} dimensions {ne:?}, must be 1..=4",
                ne.len()
            )));
        }
        if let Some(d) = ne.iter().position(|&n| n == 0 || n > i64::MAX as u64) {
            return Err(bad(format!("ne[{d}] = {} must be in 1..=i64::MAX", ne[d])));
        }
        let elements = ne.iter().try_fold(1u64, |a, &n| a.checked_mul(n));
        if elements.is_none_or(|n| n > i64::MAX as u64) {
            return Err(bad(format!("shape {ne:?} has more than i64::MAX elements")));
        }
        let n_bytes = ty
            .row_size(ne[0])
            .ok_or_else(|| {
                bad(format!(
                    "ne0 = {} is not a multiple of {ty}'s block size {}",
                    ne[0],
                    ty.block_size()
                ))
            })?
            .checked_mul(ne[1..].iter().product())
            .ok_or_else(|| bad(format!("byte size of shape {ne:?} overflows u64")))?;
        let index = self.tensors.len();
        self.names.insert(name.to_string(), index);
        self.tensors.push(PendingTensor {
            name: name.to_string(),
            ty,
            ne: ne.to_vec(),
            n_bytes,
        });
        Ok(index)
    }

    pub fn n_tensors(&self) -> usize {
        self.tensors.len()
    }

    /// Bytes of tensor `index`'s data. Panics if there is no such tensor.
    pub fn tensor_size(&self, index: usize) -> u64 {
        self.tensors[index].n_bytes
    }

    /// The alignment `write` will use (validated).
    pub fn alignment(&self) -> Result<u64, GgufError> {
        match self.metadata.get(KEY_ALIGNMENT) {
            None => Ok(DEFAULT_ALIGNMENT),
            Some(GgufValue::U32(a)) if a.is_power_of_two() => Ok((*a).into()),
            Some(v) => Err(GgufError::writer(
                format!("key {KEY_ALIGNMENT:?}"),
                format!("is {} {v}, must be a u32 power of two", v.type_name()),
            )),
        }
    }

    /// Size of the file `write` would produce.
    pub fn file_size(&self) -> Result<u64, GgufError> {
        Ok(self.layout()?.total)
    }

    fn layout(&self) -> Result<Layout, GgufError> {
        let alignment = self.alignment()?;
        let mut h = Vec::with_capacity(4096);
        h.extend_from_slice(GGUF_MAGIC);
        h.extend_from_slice(&GGUF_VERSION.to_le_bytes());
        h.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        h.extend_from_slice(&(self.metadata.len() as u64).to_le_bytes());
        for (key, value) in &self.metadata {
            check_value(key, value)?;
            encode_str(key, &mut h);
            h.extend_from_slice(&(value.value_type() as u32).to_le_bytes());
            value.encode(&mut h);
        }
        let pad = |x: u64| x.checked_next_multiple_of(alignment);
        let overflow = || GgufError::writer("tensor data", "total size overflows u64");
        let mut offsets = Vec::with_capacity(self.tensors.len());
        let mut data_size = 0u64;
        for t in &self.tensors {
            encode_str(&t.name, &mut h);
            h.extend_from_slice(&(t.ne.len() as u32).to_le_bytes());
            t.ne.iter()
                .for_each(|n| h.extend_from_slice(&n.to_le_bytes()));
            h.extend_from_slice(&t.ty.id().to_le_bytes());
            h.extend_from_slice(&data_size.to_le_bytes());
            offsets.push(data_size);
            data_size = pad(t.n_bytes)
                .and_then(|n| data_size.checked_add(n))
                .ok_or_else(overflow)?;
        }
        let data_offset = pad(h.len() as u64).ok_or_else(overflow)?;
        let total = data_offset.checked_add(data_size).ok_or_else(overflow)?;
        Ok(Layout {
            header: h,
            data_offset,
            offsets,
            total,
        })
    }

    /// Writes the file (created or truncated, preallocated, memory-mapped): every tensor's bytes
    /// from `fill(index, buf)`, where `buf` is exactly `tensor_size(index)` zeroed bytes of the
    /// mapped output, then the header. `fill` runs on up to `available_parallelism` threads at
    /// once, each taking the largest tensor left. Returns the file size. On an error the file is
    /// removed; if `fill` panics, the panic propagates and the file stays without a header.
    /// Data reach the disk through the page cache (no `msync`).
    pub fn write<F>(&self, path: &Path, fill: F) -> Result<u64, GgufError>
    where
        F: Fn(usize, &mut [u8]) -> std::io::Result<()> + Sync,
    {
        self.write_with_progress(path, &|_, _| {}, fill)
    }

    /// As [`GgufWriter::write`], calling `progress(bytes_done, bytes_total)` (tensor data only)
    /// after each tensor, from the filling threads.
    pub fn write_with_progress<F>(
        &self,
        path: &Path,
        progress: &(dyn Fn(u64, u64) + Sync),
        fill: F,
    ) -> Result<u64, GgufError>
    where
        F: Fn(usize, &mut [u8]) -> std::io::Result<()> + Sync,
    {
        let layout = self.layout()?;
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(path)
            .map_err(|e| GgufError::io(path, "create", e))?;
        let result = self.fill_file(path, &file, &layout, &fill, progress);
        if result.is_err() {
            drop(file);
            let _ = std::fs::remove_file(path);
        }
        result.map(|()| layout.total)
    }

    fn fill_file(
        &self,
        path: &Path,
        file: &File,
        layout: &Layout,
        fill: &(dyn Fn(usize, &mut [u8]) -> std::io::Result<()> + Sync),
        progress: &(dyn Fn(u64, u64) + Sync),
    ) -> Result<(), GgufError> {
        let total = usize::try_from(layout.total)
            .map_err(|_| GgufError::writer("tensor data", "file too large for this platform"))?;
        preallocate(file, layout.total).map_err(|e| GgufError::io(path, "allocate", e))?;
        // SAFETY: we created (and truncated) the file and hold it open; nothing else is expected
        // to resize it while mapped. Blocks were preallocated, so stores cannot fault on ENOSPC.
        let mut map =
            unsafe { MmapMut::map_mut(file) }.map_err(|e| GgufError::io(path, "mmap", e))?;
        let (head, data) = map[..total].split_at_mut(layout.data_offset as usize);
        let jobs = split_jobs(&self.tensors, &layout.offsets, data);
        run_fill(jobs, fill, progress).map_err(|(index, source)| GgufError::Fill {
            path: path.to_path_buf(),
            index,
            name: self.tensors[index].name.clone(),
            source,
        })?;
        // Header last: until here the file has no magic and no reader takes it for GGUF.
        head[..layout.header.len()].copy_from_slice(&layout.header);
        Ok(())
    }

    /// Writes the header and tensor infos only, the data section left a hole of the right
    /// length (a sparse file that reads as zeros): a real-shape model whose weights would not
    /// fit on the disk, for what reads only the header (`inspect`, validation, placement).
    /// Returns the (logical) file size.
    pub fn write_header_only(&self, path: &Path) -> Result<u64, GgufError> {
        use std::io::Write as _;
        let layout = self.layout()?;
        let write = || -> std::io::Result<()> {
            let mut file = File::create(path)?;
            file.write_all(&layout.header)?;
            file.set_len(layout.total)
        };
        write().map_err(|e| {
            let _ = std::fs::remove_file(path);
            GgufError::io(path, "write", e)
        })?;
        Ok(layout.total)
    }

    /// The whole file in memory, `fill` called in index order on this thread (for tests and
    /// small files). Byte-for-byte what `write` produces.
    pub fn to_bytes<F>(&self, fill: F) -> Result<Vec<u8>, GgufError>
    where
        F: Fn(usize, &mut [u8]) -> std::io::Result<()>,
    {
        let layout = self.layout()?;
        let total = usize::try_from(layout.total)
            .map_err(|_| GgufError::writer("tensor data", "file too large for this platform"))?;
        let mut out = vec![0u8; total];
        out[..layout.header.len()].copy_from_slice(&layout.header);
        let (_, data) = out.split_at_mut(layout.data_offset as usize);
        for (index, buf) in split_jobs(&self.tensors, &layout.offsets, data) {
            fill(index, buf).map_err(|source| GgufError::Fill {
                path: "<memory>".into(),
                index,
                name: self.tensors[index].name.clone(),
                source,
            })?;
        }
        Ok(out)
    }
}

/// Rejects what ggml's (or our) reader would reject: empty keys, too-deep nesting, strings and
/// arrays over ggml's 2^30 limits.
fn check_value(key: &str, value: &GgufValue) -> Result<(), GgufError> {
    let bad = |msg: String| Err(GgufError::writer(format!("key {key:?}"), msg));
    if key.is_empty() {
        return bad("key is empty".into());
    }
    if key.contains('\0') {
        return bad("key contains a NUL byte (ggml's C API would cut it there)".into());
    }
    if key.len() > MAX_LEN {
        return bad("key is longer than 2^30 bytes".into());
    }
    if value.depth() > MAX_ARRAY_DEPTH {
        return bad(format!(
            "arrays nested {} deep, at most {MAX_ARRAY_DEPTH}",
            value.depth()
        ));
    }
    fn too_long(a: &GgufArray) -> bool {
        a.len() > MAX_LEN
            || match a {
                GgufArray::Str(v) => v.iter().any(|s| s.len() > MAX_LEN),
                GgufArray::Array(v) => v.iter().any(too_long),
                _ => false,
            }
    }
    match value {
        GgufValue::Str(s) if s.len() > MAX_LEN => bad("string longer than 2^30 bytes".into()),
        GgufValue::Array(a) if too_long(a) => bad("array or string longer than 2^30".into()),
        _ => Ok(()),
    }
}

/// Cuts the data section into one `(index, bytes)` per tensor, in index order.
fn split_jobs<'a>(
    tensors: &[PendingTensor],
    offsets: &[u64],
    mut data: &'a mut [u8],
) -> Vec<(usize, &'a mut [u8])> {
    let mut jobs = Vec::with_capacity(tensors.len());
    let mut pos = 0u64;
    for (i, (t, &off)) in tensors.iter().zip(offsets).enumerate() {
        let rest = std::mem::take(&mut data);
        let (_pad, rest) = rest.split_at_mut((off - pos) as usize);
        let (buf, rest) = rest.split_at_mut(t.n_bytes as usize);
        jobs.push((i, buf));
        data = rest;
        pos = off + t.n_bytes;
    }
    jobs
}

type FillFn<'f> = &'f (dyn Fn(usize, &mut [u8]) -> std::io::Result<()> + Sync);

/// Runs `fill` over `jobs` on up to `available_parallelism` threads; stops at the first error.
fn run_fill(
    jobs: Vec<(usize, &mut [u8])>,
    fill: FillFn,
    progress: &(dyn Fn(u64, u64) + Sync),
) -> Result<(), (usize, std::io::Error)> {
    let total: u64 = jobs.iter().map(|(_, b)| b.len() as u64).sum();
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(jobs.len())
        .max(1);
    let mut jobs = jobs;
    jobs.sort_by_key(|(_, b)| b.len()); // pop() takes the largest left
    let queue = Mutex::new(jobs);
    let done = AtomicU64::new(0);
    let failed = AtomicBool::new(false);
    let first_error = Mutex::new(None);
    let work = || {
        while !failed.load(Ordering::Relaxed) {
            let job = queue.lock().unwrap_or_else(|e| e.into_inner()).pop();
            let Some((index, buf)) = job else { break };
            let n = buf.len() as u64;
            if let Err(e) = fill(index, buf) {
                failed.store(true, Ordering::Relaxed);
                let mut slot = first_error.lock().unwrap_or_else(|e| e.into_inner());
                slot.get_or_insert((index, e));
                break;
            }
            progress(done.fetch_add(n, Ordering::Relaxed) + n, total);
        }
    };
    std::thread::scope(|s| {
        // Helpers beside this thread; a thread the OS refuses means fewer helpers, not a panic.
        for _ in 1..threads {
            if std::thread::Builder::new().spawn_scoped(s, work).is_err() {
                break;
            }
        }
        work();
    });
    match first_error.into_inner().unwrap_or_else(|e| e.into_inner()) {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// Gives `file` its final length with real blocks behind it where the filesystem can, so that
/// stores into the map cannot hit a full disk (which would be SIGBUS, not an error).
fn preallocate(file: &File, len: u64) -> std::io::Result<()> {
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::io::AsRawFd;
        let len_off = libc::off_t::try_from(len)
            .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
        // SAFETY: the descriptor is valid for the duration of the call (we borrow the File);
        // posix_fallocate has no memory-safety preconditions.
        let r = unsafe { libc::posix_fallocate(file.as_raw_fd(), 0, len_off) };
        if r != 0 && r != libc::EOPNOTSUPP && r != libc::EINVAL {
            return Err(std::io::Error::from_raw_os_error(r));
        }
    }
    file.set_len(len)
}
