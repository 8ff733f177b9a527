//! Model description: the architecture registry (one data table per architecture, modelled on
//! llama.cpp's `src/llama-arch.cpp` and each `src/models/<arch>.cpp`'s `load_arch_hparams` /
//! `load_arch_tensors`), hyper-parameters read from GGUF metadata, and validation of a file
//! against its architecture's table.
//!
//! Invariant: every tensor a GGUF holds is classified by exactly one [`Role`]; what stays on the
//! GPU and what is offloaded is decided by role ([`Role::is_resident`]), in the placement
//! planner and in the engine, never by name. The offload host store holds exactly the
//! non-resident tensors (the routed experts' matrices; a test in `arch::tests` checks every
//! table against it).
pub mod arch;
pub mod hparams;
pub mod placement;
pub mod validate;

pub use arch::{ArchSpec, Layers, Role, TensorSpec, ARCHS};
pub use hparams::Hparams;

/// Looks an architecture up by its GGUF name (`general.architecture`).
pub fn arch_by_name(name: &str) -> Option<&'static ArchSpec> {
    ARCHS.iter().copied().find(|a| a.name == name)
}

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
