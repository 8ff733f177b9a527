//! Model description: the schema of an architecture's model facts ([`ArchSpec`]: its tensor
//! table, modelled on llama.cpp's `src/llama-arch.cpp` and each `src/models/<arch>.cpp`'s
//! `load_arch_tensors`, and its `load_arch_hparams` rules; the values live in
//! [`crate::arch`]), hyper-parameters read from GGUF metadata, and validation of a file against
//! its architecture's table.
//!
//! Invariant: every tensor a GGUF holds is classified by exactly one [`Role`]; what stays on the
//! GPU and what is offloaded is decided by role ([`Role::is_resident`]), in the placement
//! planner and in the engine, never by name. The offload host store holds exactly the
//! non-resident tensors (the routed experts' matrices; a test in `crate::arch`'s tests checks every
//! table against it).
pub mod arch;
pub mod hparams;
pub mod placement;
pub mod validate;

pub use arch::{ArchSpec, Layers, Role, TensorSpec};
pub use hparams::Hparams;

/// The block a GGUF tensor name belongs to: `N` of `blk.N.*` (`None` for the globals).
pub fn block_of(name: &str) -> Option<usize> {
    name.strip_prefix("blk.")?.split('.').next()?.parse().ok()
}
