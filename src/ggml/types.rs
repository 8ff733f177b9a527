//! `GgmlType`: a checked handle on `enum ggml_type` with the type traits ggml reports (block size,
//! bytes per block, name). Unknown ids from files are rejected here, before anything indexes
//! ggml's trait table with them.
use super::{GgmlError, Result};
use ggml_sys as sys;

/// A ggml tensor element type (F32, F16, Q4_K, MXFP4, ...). Always a type ggml knows.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct GgmlType(sys::ggml_type);

impl GgmlType {
    pub const F32: Self = Self(sys::GGML_TYPE_F32);
    pub const F16: Self = Self(sys::GGML_TYPE_F16);
    pub const BF16: Self = Self(sys::GGML_TYPE_BF16);
    pub const I32: Self = Self(sys::GGML_TYPE_I32);
    pub const I64: Self = Self(sys::GGML_TYPE_I64);
    pub const Q4_0: Self = Self(sys::GGML_TYPE_Q4_0);
    pub const Q5_0: Self = Self(sys::GGML_TYPE_Q5_0);
    pub const Q8_0: Self = Self(sys::GGML_TYPE_Q8_0);
    pub const Q2_K: Self = Self(sys::GGML_TYPE_Q2_K);
    pub const Q3_K: Self = Self(sys::GGML_TYPE_Q3_K);
    pub const Q4_K: Self = Self(sys::GGML_TYPE_Q4_K);
    pub const Q5_K: Self = Self(sys::GGML_TYPE_Q5_K);
    pub const Q6_K: Self = Self(sys::GGML_TYPE_Q6_K);
    pub const Q8_K: Self = Self(sys::GGML_TYPE_Q8_K);
    pub const IQ2_XXS: Self = Self(sys::GGML_TYPE_IQ2_XXS);
    pub const IQ2_XS: Self = Self(sys::GGML_TYPE_IQ2_XS);
    pub const IQ3_XXS: Self = Self(sys::GGML_TYPE_IQ3_XXS);
    pub const IQ4_XS: Self = Self(sys::GGML_TYPE_IQ4_XS);
    pub const MXFP4: Self = Self(sys::GGML_TYPE_MXFP4);

    /// Number of type ids ggml defines (ids at or above it are invalid).
    pub const COUNT: u32 = sys::GGML_TYPE_COUNT;

    /// Checked conversion from a raw id (as read from a GGUF file).
    pub fn from_id(id: u32) -> Result<Self> {
        let t = Self(id);
        // Ids that ggml has retired (Q4_2, Q4_3, ...) have no block size.
        if id >= Self::COUNT || t.traits().blck_size == 0 {
            return Err(GgmlError::UnknownType(id));
        }
        Ok(t)
    }

    /// Looks a type up by ggml's name for it (`"q4_K"`, `"mxfp4"`, case-insensitive).
    pub fn from_name(name: &str) -> Option<Self> {
        Self::all().find(|t| t.name().eq_ignore_ascii_case(name))
    }

    /// Every type ggml currently defines.
    pub fn all() -> impl Iterator<Item = Self> {
        (0..Self::COUNT).filter_map(|id| Self::from_id(id).ok())
    }

    pub fn id(self) -> u32 {
        self.0
    }

    pub(crate) fn raw(self) -> sys::ggml_type {
        self.0
    }

    fn traits(self) -> &'static sys::ggml_type_traits {
        // SAFETY: ggml_get_type_traits returns a pointer into a static table for ids below
        // GGML_TYPE_COUNT; every GgmlType is constructed from such an id.
        unsafe { &*sys::ggml_get_type_traits(self.0) }
    }

    /// ggml's name for the type, e.g. `q4_K`.
    pub fn name(self) -> &'static str {
        let p = self.traits().type_name;
        if p.is_null() {
            return "?";
        }
        // SAFETY: type names are static NUL-terminated C strings in ggml's trait table.
        unsafe { std::ffi::CStr::from_ptr(p) }
            .to_str()
            .unwrap_or("?")
    }

    /// Elements per block (1 for plain types).
    pub fn block_size(self) -> usize {
        self.traits().blck_size as usize
    }

    /// Bytes per block.
    pub fn type_size(self) -> usize {
        self.traits().type_size
    }

    pub fn is_quantized(self) -> bool {
        self.traits().is_quantized
    }

    /// Whether ggml can turn a row of this type back into f32.
    pub fn has_to_float(self) -> bool {
        self.traits().to_float.is_some()
    }

    /// Whether ggml's quantiser for this type needs an importance matrix.
    pub fn requires_imatrix(self) -> bool {
        // SAFETY: pure query on a valid type id.
        unsafe { sys::ggml_quantize_requires_imatrix(self.0) }
    }

    /// Bytes of a row of `n` elements; `None` if `n` is not a multiple of the block size or the
    /// size overflows.
    pub fn row_size(self, n: u64) -> Option<u64> {
        let bs = self.block_size() as u64;
        if !n.is_multiple_of(bs) {
            return None;
        }
        (n / bs).checked_mul(self.type_size() as u64)
    }
}

impl std::fmt::Debug for GgmlType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::fmt::Display for GgmlType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Quantised types ggml-cuda's MMVQ (batch-1 matrix-vector) kernel handles, from
/// `ggml-cuda/mmvq.cu` (`get_vdr_mmvq`) of the pinned llama.cpp tree.
const CUDA_MMVQ: &[&str] = &[
    "q1_0", "q2_0", "q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "mxfp4", "nvfp4", "q2_K", "q3_K",
    "q4_K", "q5_K", "q6_K", "iq2_xxs", "iq2_xs", "iq2_s", "iq3_xxs", "iq3_s", "iq1_s", "iq1_m",
    "iq4_nl", "iq4_xs",
];
/// Quantised types ggml-cuda's MMQ (batched, tensor-core) kernel handles, from
/// `ggml-cuda/mmq.cu` (`ggml_cuda_should_use_mmq`) of the pinned tree.
const CUDA_MMQ: &[&str] = &[
    "q1_0", "q2_0", "q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q2_K", "q3_K", "q4_K", "q5_K", "q6_K",
    "iq1_s", "iq2_xxs", "iq2_xs", "iq2_s", "iq3_xxs", "iq3_s", "iq4_xs", "iq4_nl", "mxfp4",
    "nvfp4",
];

/// Which matmul kernels the linked ggml has for a type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Kernels {
    /// ggml-cpu has a vec-dot for the type (from `ggml_get_type_traits_cpu`, at run time).
    pub cpu: bool,
    /// ggml-cuda MMVQ / MMQ consume the blocks directly (float types go through cuBLAS instead).
    pub cuda_mmvq: bool,
    pub cuda_mmq: bool,
}

impl GgmlType {
    pub fn kernels(self) -> Kernels {
        // SAFETY: the CPU trait table is static and indexed by a valid type id.
        let cpu = unsafe { (*sys::ggml_get_type_traits_cpu(self.0)).vec_dot.is_some() };
        Kernels {
            cpu,
            cuda_mmvq: CUDA_MMVQ.contains(&self.name()),
            cuda_mmq: CUDA_MMQ.contains(&self.name()),
        }
    }
}
