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
pub use ffi::{event_done, read_now, table_lookup, CopyStream, CudaError, Gate};

/// Device addresses of a table-form stop's lookup (`ffi::table_lookup`, with the `cuda-api`
/// feature; here in every build, for the callers' own types): `n` picks (i32 expert ids below
/// `n_expert`), the layer's table (slot id i32 and residency f32 per expert), where the picks'
/// slot ids and residency go (`n` each), the step's base and the layer's hit flag word (f32
/// each; the flag becomes base plus the resident picks).
#[derive(Clone, Copy, Debug)]
pub struct Lookup {
    pub picks: usize,
    pub n: usize,
    pub n_expert: usize,
    pub tab: usize,
    pub on: usize,
    pub ids: usize,
    pub mask: usize,
    pub base: usize,
    pub flag: usize,
}
