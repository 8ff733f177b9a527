//! Hyper-parameters of an MoE model, read from GGUF metadata (`{arch}.*` keys, as llama.cpp's
//! `llama_model::load_hparams` and each arch's `load_arch_hparams` read them) or set by a synth
//! preset. One struct for every architecture: fields an architecture does not use stay 0/None.
//! One table, [`schema::KEYS`], says for every key its type, default, bound, its rule against
//! other keys (`rules`), which architectures read it and the field it fills: reading
//! (`from_meta`, in `read`), validation, the errors' key names and `pocketmoe inspect`'s listing
//! all go by it.
//!
//! Invariant after [`Hparams::validate`]: every field a graph or a shape reads is in a range
//! that builds and runs (sizes positive and at most 2^24, head sizes consistent with the rotary
//! dimensions and the head counts, `n_expert_used <= n_expert`, epsilons and RoPE bases finite
//! and positive, ...), so shapes computed from these fields cannot overflow u64 and no ggml
//! assertion, hang or huge allocation waits for the first request. Each refusal names the GGUF
//! key (`{arch}.*`), its value and what is allowed; the loader prefixes the file.

/// How router logits become expert weights (llama.cpp `LLAMA_EXPERT_GATING_FUNC_TYPE_*`, the
/// values of `{arch}.expert_gating_func`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Gating {
    #[default]
    Softmax = 1,
    Sigmoid = 2,
    /// Softmax over the selected experts' logits only (gpt-oss).
    SoftmaxWeight = 3,
    /// `sqrt(softplus(logit))` (DeepSeek-V4, `LLAMA_EXPERT_GATING_FUNC_TYPE_SQRT_SOFTPLUS`).
    SqrtSoftplus = 4,
}

/// RoPE scaling kind (`{arch}.rope.scaling.type`; llama.cpp `LLAMA_ROPE_SCALING_TYPE_*`). An absent
/// key reads as llama.cpp's default "linear", which scales nothing without a factor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RopeScaling {
    None,
    #[default]
    Linear,
    Yarn,
    LongRope,
}

impl RopeScaling {
    /// The GGUF string (`rope.scaling.type`).
    pub fn name(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Linear => "linear",
            Self::Yarn => "yarn",
            Self::LongRope => "longrope",
        }
    }
}

use super::arch::ArchSpec;

mod parts;
mod read;
mod rules;
pub mod schema;
mod value;

pub use parts::{Dsv4, Indexer, Mla, Swa};

/// Largest size of one dimension (embedding width, heads, head size, FFN width, experts,
/// vocabulary): no real model comes near 16M; larger is corrupt metadata.
pub const MAX_DIM: u64 = 1 << 24;

/// Most blocks a file may declare.
pub const MAX_LAYERS: u64 = 4096;

/// Largest context length (ggml takes positions and RoPE's original context as `int`).
pub const MAX_CTX: u64 = i32::MAX as u64;

/// Keys every architecture needs (after the `{arch}.` prefix).
pub const COMMON_REQUIRED: &[&str] = &[
    "block_count",
    "embedding_length",
    "attention.head_count",
    "context_length",
];

#[derive(Debug, Clone, Default, PartialEq)]
pub struct Hparams {
    /// The architecture: its tables, rules and name (`general.architecture`).
    pub arch: &'static ArchSpec,
    pub n_vocab: u64,
    pub n_ctx_train: u64,
    pub n_embd: u64,
    /// Blocks in the file, including any MTP/nextn blocks.
    pub n_layer: usize,
    /// Trailing MTP ("nextn") blocks that decode does not run (GLM-4.5, DeepSeek-V3 files).
    pub n_layer_nextn: usize,
    pub n_head: u64,
    pub n_head_kv: u64,
    pub head_dim_k: u64,
    pub head_dim_v: u64,
    /// Dense FFN width (dense blocks; Mixtral-style experts when no expert width is given).
    pub n_ff: u64,
    /// Routed-expert FFN width.
    pub n_ff_exp: u64,
    /// Shared-expert FFN width (qwen2moe: `expert_shared_feed_forward_length`).
    pub n_ff_shexp: u64,
    pub n_expert: u64,
    pub n_expert_used: u64,
    pub n_expert_shared: u64,
    /// Leading dense blocks before the MoE blocks (`leading_dense_block_count`).
    pub n_layer_dense_lead: usize,
    pub n_expert_groups: u64,
    pub n_group_used: u64,
    pub gating: Gating,
    pub expert_weights_norm: bool,
    pub expert_weights_scale: f32,
    pub rope_freq_base: f32,
    /// Rotary dimensions (partial rotary when < head_dim_k).
    pub n_rot: u64,
    pub rms_eps: f32,
    /// RoPE scaling: kind, `rope.scaling.factor` (0 = none), `rope.scaling.original_context_length`
    /// (0 = `n_ctx_train`) and `rope.scaling.yarn_log_multiplier` as the file stores it
    /// (DeepSeek's converter writes `0.1 * mscale_all_dim`). The derived YaRN parameters are
    /// computed where RoPE is built (`graph::blocks::rope`).
    pub rope_scaling: RopeScaling,
    pub rope_scaling_factor: f32,
    pub n_ctx_orig_yarn: u64,
    pub rope_yarn_log_mul: f32,
    /// Per-position attention temperature (`attention.temperature_scale`, Llama-4 style; used by
    /// Mistral-Large-3 files of the deepseek2 architecture). 0 = none.
    pub attn_temp_scale: f32,
    /// Multi-head latent attention (deepseek2, deepseek32; `q_lora_rank` deepseek4 too).
    pub mla: Mla,
    /// Sliding-window attention (gpt-oss, deepseek4).
    pub swa: Swa,
    /// The sparse-attention indexer (deepseek32, deepseek4).
    pub indexer: Indexer,
    /// DeepSeek-V4's own fields.
    pub dsv4: Dsv4,
}

impl Hparams {
    /// The GGUF key `{arch}.{s}` (errors name keys as the file spells them).
    pub fn key(&self, s: &str) -> String {
        format!("{}.{s}", self.arch.name)
    }

    /// `{arch}.{s} = v`, for errors.
    pub fn key_is(&self, s: &str, v: u64) -> String {
        format!("{} = {v}", self.key(s))
    }

    /// Whether block `il` has a routed-expert FFN.
    pub fn is_moe_layer(&self, il: usize) -> bool {
        self.n_expert > 0 && il >= self.n_layer_dense_lead
    }

    pub fn q_dim(&self) -> u64 {
        self.n_head * self.head_dim_k
    }

    pub fn k_dim(&self) -> u64 {
        self.n_head_kv * self.head_dim_k
    }

    pub fn v_dim(&self) -> u64 {
        self.n_head_kv * self.head_dim_v
    }

    /// Blocks that decode runs (without MTP blocks).
    pub fn n_layer_decode(&self) -> usize {
        self.n_layer - self.n_layer_nextn
    }

    /// Name of the tensor whose presence tells llama.cpp that the MTP blocks are in the file.
    pub fn mtp_probe_name(&self) -> String {
        format!("blk.{}.nextn.eh_proj.weight", self.n_layer_decode())
    }

    /// Where the architecture's rules say so ([`Rules::mtp_needs_probe`](super::arch::Rules),
    /// deepseek4), llama.cpp counts trailing MTP blocks only when the file holds
    /// [`mtp_probe_name`](Self::mtp_probe_name); otherwise it drops `nextn_predict_layers` and runs
    /// those blocks as ordinary ones. The model loader calls this with whether the probe exists
    /// (from_meta cannot see tensors). Other architectures keep the count.
    pub fn apply_mtp_probe(&mut self, has_probe: bool) {
        if self.arch.rules.mtp_needs_probe && !has_probe {
            self.n_layer_nextn = 0;
        }
    }

    /// Whether block `il` is a trailing MTP ("nextn") block.
    pub fn is_nextn_layer(&self, il: usize) -> bool {
        il >= self.n_layer_decode()
    }

    /// Whether block `il` uses sliding-window attention (llama.cpp `hparams.is_swa(il)`).
    pub fn is_swa(&self, il: usize) -> bool {
        self.swa.layers.get(il).copied().unwrap_or(false)
    }

    /// Key head size of block `il` (llama.cpp `n_embd_head_k(il)`: the SWA size in SWA blocks; a
    /// hand-built `Hparams` with `head_dim_k_swa == 0` falls back to `head_dim_k`).
    pub fn head_dim_k_at(&self, il: usize) -> u64 {
        if self.is_swa(il) && self.swa.head_dim_k > 0 {
            self.swa.head_dim_k
        } else {
            self.head_dim_k
        }
    }

    /// Rotary dims of block `il` (llama.cpp `n_rot(il)`; `n_rot_swa == 0` falls back to `n_rot`).
    pub fn n_rot_at(&self, il: usize) -> u64 {
        if self.is_swa(il) && self.swa.n_rot > 0 {
            self.swa.n_rot
        } else {
            self.n_rot
        }
    }

    /// MLA (deepseek2): whether the file holds the split `attn_k_b`/`attn_v_b` form (both
    /// `key_length_mla` and `value_length_mla` set) rather than the legacy `attn_kv_b`.
    pub fn is_mla(&self) -> bool {
        self.mla.head_dim_k != 0 && self.mla.head_dim_v != 0
    }

    /// MLA per-head key length after decompression (llama.cpp `n_embd_head_k_mla()`).
    pub fn mla_head_dim_k(&self) -> u64 {
        if self.is_mla() {
            self.mla.head_dim_k
        } else {
            self.head_dim_k
        }
    }

    /// MLA per-head value length after decompression (llama.cpp `n_embd_head_v_mla()`).
    pub fn mla_head_dim_v(&self) -> u64 {
        if self.is_mla() {
            self.mla.head_dim_v
        } else {
            self.head_dim_v
        }
    }

    /// MLA non-rotary part of a key head (`n_embd_head_qk_nope`); the rotary part is `n_rot`.
    pub fn mla_qk_nope(&self) -> u64 {
        self.mla_head_dim_k().saturating_sub(self.n_rot)
    }

    /// `block_count` and `nextn_predict_layers` in range: checked before anything is sized per
    /// block (`apply_arch_rules`), and again by [`validate`](Self::validate).
    fn check_block_count(&self) -> Result<(), String> {
        schema::key("block_count")
            .expect("block_count is a row")
            .check(self)
    }

    /// Checks every field against what the shapes and graphs can take: each row of the schema
    /// in order (its bound, then its rule), then the architecture's own checks
    /// ([`Rules::check`](super::arch::Rules)). The error names the GGUF key (`{arch}.*`, as the
    /// file spells it), its value and what is allowed.
    pub fn validate(&self) -> Result<(), String> {
        for key in schema::KEYS {
            key.check(self)?;
        }
        (self.arch.rules.check)(self)
    }
}

#[cfg(test)]
mod tests;
