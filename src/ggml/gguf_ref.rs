//! The reference: ggml's own GGUF parser (`gguf_init_from_file` / `gguf_init_from_buffer` of the
//! linked llama.cpp, through `ggml-sys`), summarised into plain Rust data so tests can compare our
//! reader and writer against it.
//!
//! Follows `ggml/include/gguf.h`: `no_alloc = true` and no ggml context (only the index is read,
//! never the tensor data); a NULL result means ggml rejected the file (it logs why through ggml's
//! logger, which [`quiet_logs`] silences).
//!
//! Invariants: every `unsafe` block calls ggml on a context that is non-null and not yet freed,
//! with ids below the counts ggml reported; getters whose type ggml asserts on are only called
//! after checking the type; each context is freed exactly once (by `Ctx` / `DataCtx::drop`).
use std::ffi::{c_char, c_void, CStr, CString};
use std::path::Path;

use ggml_sys as sys;

/// What ggml's parser saw in a file.
#[derive(Clone, Debug, PartialEq)]
pub struct GgmlGguf {
    pub version: u32,
    pub alignment: u64,
    /// Start of the data section (padded only if there are tensors, as ggml documents).
    pub data_offset: u64,
    pub kvs: Vec<GgmlKv>,
    pub tensors: Vec<GgmlTensor>,
}

/// One key-value pair as ggml reports it.
#[derive(Clone, Debug, PartialEq)]
pub struct GgmlKv {
    pub key: String,
    /// `gguf_get_kv_type` (9 for arrays).
    pub ty: u32,
    /// For arrays: element type and length.
    pub array: Option<(u32, usize)>,
    /// For strings: the value; for arrays of strings: the elements.
    pub strings: Vec<String>,
    /// For integer scalars: the value.
    pub int: Option<i128>,
}

/// One tensor info as ggml reports it.
#[derive(Clone, Debug, PartialEq)]
pub struct GgmlTensor {
    pub name: String,
    pub ty: u32,
    pub ne: [i64; 4],
    /// Relative to the data section.
    pub offset: u64,
    pub n_bytes: u64,
}

/// Owns a `gguf_context` and frees it once.
struct Ctx(*mut sys::gguf_context);

impl Drop for Ctx {
    fn drop(&mut self) {
        // SAFETY: the pointer came non-null from gguf_init_* and is freed only here.
        unsafe { sys::gguf_free(self.0) }
    }
}

fn params() -> sys::gguf_init_params {
    sys::gguf_init_params {
        no_alloc: true,
        ctx: std::ptr::null_mut(),
    }
}

/// Parses `path` with ggml; `None` if ggml rejects it (or the path is not valid C text).
pub fn read_file(path: &Path) -> Option<GgmlGguf> {
    let c_path = CString::new(path.to_str()?).ok()?;
    // SAFETY: c_path is a valid NUL-terminated string for the duration of the call.
    let ctx = unsafe { sys::gguf_init_from_file(c_path.as_ptr(), params()) };
    summarise(ctx)
}

/// Parses an in-memory GGUF image with ggml; `None` if ggml rejects it.
pub fn read_buffer(bytes: &[u8]) -> Option<GgmlGguf> {
    // SAFETY: ggml reads at most `bytes.len()` bytes from the pointer during the call and keeps
    // no reference to it (no_alloc, no ggml context).
    let ctx = unsafe { sys::gguf_init_from_buffer(bytes.as_ptr().cast(), bytes.len(), params()) };
    summarise(ctx)
}

/// Loads `path` with ggml into a ggml context (tensor data read into memory, as llama.cpp's
/// `gguf_init_from_file` with a context does) and returns each tensor's name and bytes in file
/// order; `None` if ggml rejects the file.
pub fn read_file_data(path: &Path) -> Option<Vec<(String, Vec<u8>)>> {
    let c_path = CString::new(path.to_str()?).ok()?;
    let mut data_ctx: *mut sys::ggml_context = std::ptr::null_mut();
    let params = sys::gguf_init_params {
        no_alloc: false,
        ctx: &mut data_ctx,
    };
    // SAFETY: c_path is NUL-terminated and `data_ctx` outlives the call, which stores a new
    // ggml context in it on success (and leaves or resets it to null on failure).
    let ctx = unsafe { sys::gguf_init_from_file(c_path.as_ptr(), params) };
    if ctx.is_null() {
        return None;
    }
    let ctx = Ctx(ctx);
    let data_ctx = DataCtx(data_ctx);
    if data_ctx.0.is_null() {
        return None;
    }
    // SAFETY: live context.
    let n_tensors = unsafe { sys::gguf_get_n_tensors(ctx.0) };
    let mut out = Vec::new();
    for id in 0..n_tensors {
        // SAFETY: live contexts; id < n_tensors; ggml created a tensor of that name in
        // `data_ctx` whose `data` points at ggml_nbytes readable bytes owned by `data_ctx`.
        let item = unsafe {
            let name_ptr = sys::gguf_get_tensor_name(ctx.0, id);
            let t = sys::ggml_get_tensor(data_ctx.0, name_ptr);
            if t.is_null() || (*t).data.is_null() {
                return None;
            }
            let n = sys::ggml_nbytes(t);
            let bytes = std::slice::from_raw_parts((*t).data as *const u8, n).to_vec();
            (text(name_ptr), bytes)
        };
        out.push(item);
    }
    Some(out)
}

/// Owns the ggml context that holds loaded tensor data.
struct DataCtx(*mut sys::ggml_context);

impl Drop for DataCtx {
    fn drop(&mut self) {
        if !self.0.is_null() {
            // SAFETY: created by gguf_init_from_file for us and freed only here.
            unsafe { sys::ggml_free(self.0) }
        }
    }
}

unsafe extern "C" fn discard_log(
    _level: sys::ggml_log_level,
    _text: *const c_char,
    _: *mut c_void,
) {
}

/// Silences ggml's logger for the whole process (ggml logs every rejected file to stderr).
pub fn quiet_logs() {
    // SAFETY: installs a callback that ignores its arguments; no user data.
    unsafe { sys::ggml_log_set(Some(discard_log), std::ptr::null_mut()) }
}

fn text(p: *const c_char) -> String {
    if p.is_null() {
        return String::new();
    }
    // SAFETY: ggml returns NUL-terminated strings owned by the context, valid until it is freed,
    // which happens after this copy.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

fn summarise(ctx: *mut sys::gguf_context) -> Option<GgmlGguf> {
    if ctx.is_null() {
        return None;
    }
    let ctx = Ctx(ctx);
    let c = ctx.0 as *const sys::gguf_context;
    // SAFETY: `c` is a live context (non-null, freed only when `ctx` drops, after this function).
    let (version, alignment, data_offset, n_kv, n_tensors) = unsafe {
        (
            sys::gguf_get_version(c),
            sys::gguf_get_alignment(c) as u64,
            sys::gguf_get_data_offset(c) as u64,
            sys::gguf_get_n_kv(c),
            sys::gguf_get_n_tensors(c),
        )
    };
    let kvs = (0..n_kv).map(|id| kv(c, id)).collect();
    let tensors = (0..n_tensors)
        // SAFETY: live context, id < gguf_get_n_tensors; ggml_get_tensor_ne points at
        // GGML_MAX_DIMS (4) int64s inside the context.
        .map(|id| unsafe {
            let ne = sys::gguf_get_tensor_ne(c, id);
            GgmlTensor {
                name: text(sys::gguf_get_tensor_name(c, id)),
                ty: sys::gguf_get_tensor_type(c, id),
                ne: if ne.is_null() {
                    [0; 4]
                } else {
                    *(ne as *const [i64; 4])
                },
                offset: sys::gguf_get_tensor_offset(c, id) as u64,
                n_bytes: sys::gguf_get_tensor_size(c, id) as u64,
            }
        })
        .collect();
    Some(GgmlGguf {
        version,
        alignment,
        data_offset,
        kvs,
        tensors,
    })
}

/// Key-value pair `id` (< gguf_get_n_kv) of the live context `c`.
fn kv(c: *const sys::gguf_context, id: i64) -> GgmlKv {
    // SAFETY: live context, id < gguf_get_n_kv.
    let (key, ty) = unsafe { (text(sys::gguf_get_key(c, id)), sys::gguf_get_kv_type(c, id)) };
    let mut kv = GgmlKv {
        key,
        ty,
        array: None,
        strings: Vec::new(),
        int: None,
    };
    // ggml's own type ids (`enum gguf_type`), so this reference does not lean on our reader.
    match ty {
        sys::GGUF_TYPE_ARRAY => {
            // SAFETY: live context, valid id, and the pair is an array.
            let (et, n) = unsafe { (sys::gguf_get_arr_type(c, id), sys::gguf_get_arr_n(c, id)) };
            kv.array = Some((et, n));
            if et == sys::GGUF_TYPE_STRING {
                // SAFETY: an array of strings with n elements; i < n.
                kv.strings = (0..n)
                    .map(|i| text(unsafe { sys::gguf_get_arr_str(c, id, i) }))
                    .collect();
            }
        }
        // SAFETY: live context, valid id, and the pair is a string scalar.
        sys::GGUF_TYPE_STRING => kv.strings = vec![text(unsafe { sys::gguf_get_val_str(c, id) })],
        // SAFETY (each arm): live context, valid id, and the getter matches the pair's type.
        sys::GGUF_TYPE_UINT8 => kv.int = Some(unsafe { sys::gguf_get_val_u8(c, id) }.into()),
        sys::GGUF_TYPE_INT8 => kv.int = Some(unsafe { sys::gguf_get_val_i8(c, id) }.into()),
        sys::GGUF_TYPE_UINT16 => kv.int = Some(unsafe { sys::gguf_get_val_u16(c, id) }.into()),
        sys::GGUF_TYPE_INT16 => kv.int = Some(unsafe { sys::gguf_get_val_i16(c, id) }.into()),
        sys::GGUF_TYPE_UINT32 => kv.int = Some(unsafe { sys::gguf_get_val_u32(c, id) }.into()),
        sys::GGUF_TYPE_INT32 => kv.int = Some(unsafe { sys::gguf_get_val_i32(c, id) }.into()),
        sys::GGUF_TYPE_UINT64 => kv.int = Some(unsafe { sys::gguf_get_val_u64(c, id) }.into()),
        sys::GGUF_TYPE_INT64 => kv.int = Some(unsafe { sys::gguf_get_val_i64(c, id) }.into()),
        _ => {}
    }
    kv
}
