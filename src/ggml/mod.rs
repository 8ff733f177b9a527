//! Safe wrappers over ggml (from `ggml-sys`): contexts and tensors, graphs, backends, buffers, the
//! scheduler, and quantisation helpers.
//!
//! Follows the ggml C API one-to-one where it can (names, ne0-first shapes); the wrappers add
//! ownership (RAII), lifetimes that keep tensors from outliving their context, and `Result`s where
//! ggml would abort. All `unsafe` of the crate outside `experts/` lives here, each block with a
//! `// SAFETY:` line.
//!
//! Invariants: a [`Tensor`] borrows its [`Context`]; a buffer allocated for a context is owned by
//! that context and freed with it, so tensor data stays valid for the tensor's whole lifetime.

mod backend;
mod buffer;
pub mod capture;
mod context;
pub mod cpu_isa;
pub mod gguf_ref;
mod graph;
pub mod llama;
pub mod meta;
pub mod quant;
pub mod refquant;
mod types;

pub use backend::{
    configure_cuda, cuda_env_set_by_us, disable_cuda_graphs_for_split, Backend, Device, DeviceKind,
    EvalHook, Event, Sched, ThreadPool,
};
pub use buffer::{BufType, BufferRef, HostStage, Memory};
pub use context::{Context, OwnedGraph, RopeParams, Tensor, TensorIndex};
pub use graph::Graph;
pub use types::{GgmlType, Kernels};

/// Errors of the ggml layer. Every variant names what failed.
#[derive(Debug, thiserror::Error)]
pub enum GgmlError {
    #[error("this build of PocketMoE has no CUDA support (rebuild with `--features cuda`)")]
    BuiltWithoutCuda,
    #[error("no ggml device {0:?} (found: {1})")]
    NoSuchDevice(String, String),
    #[error("ggml could not initialise backend {0}")]
    BackendInit(String),
    #[error("ggml_init failed for a context of {0} bytes")]
    ContextInit(usize),
    #[error("could not allocate a {size}-byte buffer on {backend} for {what}")]
    Alloc {
        backend: String,
        what: String,
        size: usize,
    },
    #[error("tensor {name}: {msg}")]
    Tensor { name: String, msg: String },
    #[error("graph compute failed on {backend}: status {status}")]
    Compute { backend: String, status: i32 },
    #[error("unknown ggml type id {0}")]
    UnknownType(u32),
    #[error("libllama: {0}")]
    Llama(String),
    #[error("quantisation to {ty}: {msg}")]
    Quant { ty: &'static str, msg: String },
}

pub type Result<T, E = GgmlError> = std::result::Result<T, E>;

/// Text of a C string returned by ggml (static or owned by ggml), or "" for null.
pub(crate) fn cstr(p: *const std::os::raw::c_char) -> String {
    if p.is_null() {
        return String::new();
    }
    // SAFETY: ggml returns NUL-terminated strings that stay valid at least until this copy.
    unsafe { std::ffi::CStr::from_ptr(p) }
        .to_string_lossy()
        .into_owned()
}

/// ggml's version, as the linked library reports it (its commit string names whatever git
/// repository the copied sources were built in: ours, with llama-cpp-sys-4).
pub fn version() -> String {
    // SAFETY: returns a static NUL-terminated string.
    unsafe { cstr(ggml_sys::ggml_version()) }
}
