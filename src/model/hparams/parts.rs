//! The hyper-parameters only some architectures read, one struct per kind of model part
//! ([`Hparams::mla`](super::Hparams), `swa`, `indexer`, `dsv4`). They live here rather than beside
//! the architecture files (`crate::arch`) because the graph blocks (`crate::graph`) and the
//! model tables read them too, and both sit below `arch`. Fields an architecture does not read
//! stay 0 / empty.

/// Multi-head latent attention (deepseek2, deepseek32; deepseek4 reads `q_lora_rank`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Mla {
    /// The q low-rank (`attention.q_lora_rank`; 0 = no q compression, V2-Lite).
    pub q_lora_rank: u64,
    /// The kv low-rank (`attention.kv_lora_rank`).
    pub kv_lora_rank: u64,
    /// Per-head key/value length after decompression (`attention.key_length_mla` /
    /// `attention.value_length_mla`; 0 in legacy files with a fused `attn_kv_b`).
    pub head_dim_k: u64,
    pub head_dim_v: u64,
}

/// Sliding-window attention (gpt-oss, deepseek4).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Swa {
    /// The window (`attention.sliding_window`), 0 = none.
    pub window: u64,
    /// Per-block sliding-window flag (llama.cpp `is_swa_impl`): gpt-oss from
    /// `attention.sliding_window_pattern` (a per-block array, or a period, default 2 = even blocks
    /// windowed), deepseek4 every block. Empty = no sliding-window blocks.
    pub layers: Vec<bool>,
    /// Key/value head sizes and rotary dims of sliding-window blocks (`attention.key_length_swa`,
    /// `attention.value_length_swa`, `rope.dimension_count_swa`; default the full-attention ones).
    pub head_dim_k: u64,
    pub head_dim_v: u64,
    pub n_rot: u64,
    /// RoPE base of sliding-window blocks (`rope.freq_base_swa`, default `rope.freq_base`;
    /// gpt-oss).
    pub rope_freq_base: f32,
}

/// The sparse-attention indexer (deepseek32, deepseek4): heads, head size and top-k
/// (`attention.indexer.head_count`, `.key_length`, `.top_k`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Indexer {
    pub n_head: u64,
    pub head_dim: u64,
    pub top_k: u64,
}

/// DeepSeek-V4's own hyper-parameters.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Dsv4 {
    /// Grouped low-rank output projection: groups and rank per group
    /// (`attention.output_group_count`, `attention.output_lora_rank`).
    pub o_group_count: u64,
    pub o_lora_rank: u64,
    /// RoPE base of the compressed KV (`attention.compress_rope_freq_base`).
    pub compress_rope_freq_base: f32,
    /// Per-block KV compression ratio (`attention.compress_ratios`, one per block): 0 = window
    /// only, 4 = compressed KV plus the sparse indexer, 128 = compressed KV.
    pub compress_ratios: Vec<u64>,
    /// Hyper-connections: residual streams (`hyper_connection.count`), Sinkhorn iterations and
    /// epsilon (`hyper_connection.sinkhorn_iterations`, `.epsilon`).
    pub hc_mult: u64,
    pub hc_sinkhorn_iters: u64,
    pub hc_eps: f32,
    /// Leading blocks that route by a token-id -> expert table (`ffn_gate_tid2eid`) instead of
    /// the router's top-k (`hash_layer_count`).
    pub hash_layer_count: usize,
    /// SwiGLU clamp of routed / shared experts (`swiglu_clamp_exp`, `swiglu_clamp_shexp`, the
    /// latter defaulting to the former; scalar form only, 0 = none).
    pub swiglu_clamp_exp: f32,
    pub swiglu_clamp_shexp: f32,
}
