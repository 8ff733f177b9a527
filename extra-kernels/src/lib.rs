//! extra-kernels — PocketMoE's own CUDA kernels (one op per `.cu`/`.cuh` pair in `kernels/`, each
//! with one `extern "C"` launcher that takes a stream), and the Rust declarations of those
//! launchers. Without the `cuda` feature the crate is empty apart from [`available`].
//!
//! Kernels (`kernels/README.md`): table form's lookup ([`ffi::table_lookup`]); the crate also
//! holds the CUDA runtime calls of the expert cache's copy streams ([`CopyStream`]).

/// Whether this build compiled the kernels.
pub const fn available() -> bool {
    cfg!(feature = "cuda")
}

#[cfg(feature = "cuda-api")]
pub mod ffi;

#[cfg(feature = "cuda-api")]
pub use ffi::{event_done, read_now, table_lookup, CopyStream, CudaError, Gate, Lookup};
