//! Routed-expert offload (docs/design.md §4): the pinned host store of routed experts, the GPU
//! slot cache and its policies, prefetch, the CPU channel for misses, and their statistics.
pub mod stats;

pub use stats::Stats;
pub mod cache;
mod gate;
mod host_copy;
pub mod offload;
pub mod policy;
pub mod transfer;
pub use offload::{Gated, Mode, Offload, OffloadOptions, StepHook, TableForm};
pub mod cpu;
pub mod mats;
pub mod options;
pub mod seam;
pub mod step;
pub use seam::OffloadedExperts;
