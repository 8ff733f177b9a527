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

impl hparams::Meta for crate::gguf::GgufModel {
    fn u64(&self, key: &str) -> Option<u64> {
        self.get_u64(key)
    }
    fn f32(&self, key: &str) -> Option<f32> {
        self.get_f32(key)
    }
    fn bool(&self, key: &str) -> Option<bool> {
        self.get_bool(key)
    }
    fn str(&self, key: &str) -> Option<String> {
        self.get_str(key).map(str::to_string)
    }
    fn array_len(&self, key: &str) -> Option<u64> {
        self.get_array(key).map(|a| a.len() as u64)
    }
    fn has(&self, key: &str) -> bool {
        self.get(key).is_some()
    }
    fn u64_array(&self, key: &str) -> Option<Vec<u64>> {
        let a = self.get_array(key)?;
        if let Some(b) = a.as_bools() {
            return Some(b.iter().map(|&x| u64::from(x)).collect());
        }
        a.to_i64_vec()?
            .into_iter()
            .map(|v| u64::try_from(v).ok())
            .collect()
    }
}
