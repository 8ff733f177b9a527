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

mod read;
mod rules;
pub mod schema;

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
    /// Sliding-window size (gpt-oss), 0 = none.
    pub sliding_window: u64,
    /// MLA (deepseek2): q low-rank (0 = no q compression, V2-Lite), kv low-rank.
    pub q_lora_rank: u64,
    pub kv_lora_rank: u64,
    /// MLA per-head key/value length after decompression (`key_length_mla`/`value_length_mla`).
    pub head_dim_k_mla: u64,
    pub head_dim_v_mla: u64,
    /// Per-block sliding-window flag (llama.cpp `is_swa_impl`): gpt-oss from
    /// `attention.sliding_window_pattern` (a per-block array, or a period, default 2 = even blocks
    /// windowed), deepseek4 every block. Empty = no sliding-window blocks.
    pub swa_layers: Vec<bool>,
    /// Key/value head sizes and rotary dims of sliding-window blocks (`attention.key_length_swa`,
    /// `attention.value_length_swa`, `rope.dimension_count_swa`; default the full-attention ones).
    pub head_dim_k_swa: u64,
    pub head_dim_v_swa: u64,
    pub n_rot_swa: u64,
    /// RoPE base of sliding-window blocks (`rope.freq_base_swa`, default `rope_freq_base`; gpt-oss).
    pub rope_freq_base_swa: f32,
    /// DeepSeek-V4 sparse-attention indexer: heads, head size and top-k
    /// (`attention.indexer.head_count`, `.key_length`, `.top_k`).
    pub indexer_n_head: u64,
    pub indexer_head_dim: u64,
    pub indexer_top_k: u64,
    /// DeepSeek-V4 grouped low-rank output projection: groups and rank per group
    /// (`attention.output_group_count`, `attention.output_lora_rank`).
    pub o_group_count: u64,
    pub o_lora_rank: u64,
    /// DeepSeek-V4 RoPE base of the compressed KV (`attention.compress_rope_freq_base`).
    pub compress_rope_freq_base: f32,
    /// DeepSeek-V4 per-block KV compression ratio (`attention.compress_ratios`, one per block):
    /// 0 = window only, 4 = compressed KV plus the sparse indexer, 128 = compressed KV.
    pub compress_ratios: Vec<u64>,
    /// DeepSeek-V4 hyper-connections: residual streams (`hyper_connection.count`), Sinkhorn
    /// iterations and epsilon (`hyper_connection.sinkhorn_iterations`, `.epsilon`).
    pub hc_mult: u64,
    pub hc_sinkhorn_iters: u64,
    pub hc_eps: f32,
    /// DeepSeek-V4: leading blocks that route by a token-id -> expert table
    /// (`ffn_gate_tid2eid`) instead of the router's top-k (`hash_layer_count`).
    pub hash_layer_count: usize,
    /// SwiGLU clamp of routed / shared experts (`swiglu_clamp_exp`, `swiglu_clamp_shexp`, the
    /// latter defaulting to the former; scalar form only, 0 = none). DeepSeek-V4.
    pub swiglu_clamp_exp: f32,
    pub swiglu_clamp_shexp: f32,
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
        self.swa_layers.get(il).copied().unwrap_or(false)
    }

    /// Key head size of block `il` (llama.cpp `n_embd_head_k(il)`: the SWA size in SWA blocks; a
    /// hand-built `Hparams` with `head_dim_k_swa == 0` falls back to `head_dim_k`).
    pub fn head_dim_k_at(&self, il: usize) -> u64 {
        if self.is_swa(il) && self.head_dim_k_swa > 0 {
            self.head_dim_k_swa
        } else {
            self.head_dim_k
        }
    }

    /// Rotary dims of block `il` (llama.cpp `n_rot(il)`; `n_rot_swa == 0` falls back to `n_rot`).
    pub fn n_rot_at(&self, il: usize) -> u64 {
        if self.is_swa(il) && self.n_rot_swa > 0 {
            self.n_rot_swa
        } else {
            self.n_rot
        }
    }

    /// MLA (deepseek2): whether the file holds the split `attn_k_b`/`attn_v_b` form (both
    /// `key_length_mla` and `value_length_mla` set) rather than the legacy `attn_kv_b`.
    pub fn is_mla(&self) -> bool {
        self.head_dim_k_mla != 0 && self.head_dim_v_mla != 0
    }

    /// MLA per-head key length after decompression (llama.cpp `n_embd_head_k_mla()`).
    pub fn mla_head_dim_k(&self) -> u64 {
        if self.is_mla() {
            self.head_dim_k_mla
        } else {
            self.head_dim_k
        }
    }

    /// MLA per-head value length after decompression (llama.cpp `n_embd_head_v_mla()`).
    pub fn mla_head_dim_v(&self) -> u64 {
        if self.is_mla() {
            self.head_dim_v_mla
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
