//! Hyper-parameters of an MoE model, read from GGUF metadata (`{arch}.*` keys, as llama.cpp's
//! `llama_model::load_hparams` and each arch's `load_arch_hparams` read them) or set by a synth
//! preset. One struct for every architecture: fields an architecture does not use stay 0/None.
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

use super::arch::{ArchSpec, GatingRule};
use crate::gguf::Metadata;

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

    /// Reads the hyper-parameters of architecture `arch` from `meta`, applying its rules. Missing
    /// required keys are errors naming the key; optional ones take llama.cpp's defaults.
    pub fn from_meta(arch: &'static ArchSpec, meta: &dyn Metadata) -> Result<Self, String> {
        let k = |s: &str| format!("{arch}.{s}");
        // A dense file of an architecture that runs dense models needs no expert keys.
        let dense = arch.dense && meta.get_u64(&k("expert_count")).unwrap_or(0) == 0;
        if !dense && arch.required_keys.contains(&"expert_count") && !meta.has(&k("expert_count")) {
            return Err(format!("no {}: {}", k("expert_count"), dense_model(arch)));
        }
        for key in COMMON_REQUIRED.iter().chain(arch.required_keys) {
            if dense && key.starts_with("expert_") {
                continue;
            }
            if !meta.has(&k(key)) {
                return Err(format!("missing required metadata key {}", k(key)));
            }
        }
        // A key that is present but not readable as what it holds (a negative or float size, a
        // string RoPE base, ...) is an error, not an absent key that takes the default.
        let unreadable = std::cell::RefCell::new(None::<String>);
        let wrong_type = |key: String, what: &str| {
            let msg = match meta.get_f32(&key) {
                Some(v) => format!("{key} = {v}: must be {what}"),
                None => format!("{key} holds a value of another type: must be {what}"),
            };
            unreadable.borrow_mut().get_or_insert(msg);
        };
        let u = |s: &str| {
            let v = meta.get_u64(&k(s));
            if v.is_none() && meta.has(&k(s)) {
                wrong_type(k(s), "a non-negative integer");
            }
            v
        };
        let f = |s: &str| {
            let v = meta.get_f32(&k(s));
            if v.is_none() && meta.has(&k(s)) {
                wrong_type(k(s), "a number");
            }
            v
        };
        let b = |s: &str| {
            let v = meta.get_bool(&k(s));
            if v.is_none() && meta.has(&k(s)) {
                wrong_type(k(s), "true or false");
            }
            v
        };
        let n_embd = u("embedding_length").unwrap_or(0);
        let n_head = u("attention.head_count").unwrap_or(0);
        let head_default = n_embd.checked_div(n_head).unwrap_or(0);
        let head_dim_k = u("attention.key_length").unwrap_or(head_default);
        let head_dim_v = u("attention.value_length").unwrap_or(head_default);
        let n_rot = u("rope.dimension_count").unwrap_or(head_dim_k);
        let rope_freq_base = f("rope.freq_base").unwrap_or(10000.0);
        let n_tokens = meta.get_array_len("tokenizer.ggml.tokens");
        let n_vocab = u("vocab_size").or(n_tokens).ok_or_else(|| {
            format!(
                "neither {} nor tokenizer.ggml.tokens gives the vocabulary size",
                k("vocab_size")
            )
        })?;
        // llama.cpp sizes the embedding and output by the token list; a different vocab_size
        // would give ids the tokenizer does not know (or tensors of another shape).
        if let Some(n) = n_tokens.filter(|&n| n != n_vocab) {
            return Err(format!(
                "{} = {n_vocab} differs from the {n} entries of tokenizer.ggml.tokens: \
                 they must be equal",
                k("vocab_size")
            ));
        }
        let gating_key = u("expert_gating_func").filter(|&v| v != 0); // 0 = NONE: the arch default
        let gating = match gating_key {
            None | Some(1) => Gating::Softmax,
            Some(2) => Gating::Sigmoid,
            Some(3) => Gating::SoftmaxWeight,
            Some(4) => Gating::SqrtSoftplus,
            Some(v) => {
                return Err(format!(
                    "{} = {v}: unknown gating function (1 softmax, 2 sigmoid, 3 softmax over \
                     the selected experts, 4 sqrt-softplus; 0 or absent: the architecture's)",
                    k("expert_gating_func")
                ))
            }
        };
        let swiglu_clamp_exp = f("swiglu_clamp_exp").unwrap_or(0.0);
        let rope_scaling = match meta.get_str(&k("rope.scaling.type")) {
            None | Some("linear") => RopeScaling::Linear,
            Some("none") => RopeScaling::None,
            Some("yarn") => RopeScaling::Yarn,
            Some("longrope") => RopeScaling::LongRope,
            Some(other) => {
                return Err(format!(
                    "{}: unknown RoPE scaling type {other:?}",
                    k("rope.scaling.type")
                ))
            }
        };
        let mut hp = Hparams {
            arch,
            n_vocab,
            n_ctx_train: u("context_length").unwrap_or(0),
            n_embd,
            n_layer: u("block_count").unwrap_or(0) as usize,
            n_layer_nextn: u("nextn_predict_layers").unwrap_or(0) as usize,
            n_head,
            n_head_kv: u("attention.head_count_kv").unwrap_or(n_head),
            head_dim_k,
            head_dim_v,
            n_ff: u("feed_forward_length").unwrap_or(0),
            n_ff_exp: u("expert_feed_forward_length").unwrap_or(0),
            n_ff_shexp: u("expert_shared_feed_forward_length").unwrap_or(0),
            n_expert: u("expert_count").unwrap_or(0),
            n_expert_used: u("expert_used_count").unwrap_or(0),
            n_expert_shared: u("expert_shared_count").unwrap_or(0),
            n_layer_dense_lead: u("leading_dense_block_count").unwrap_or(0) as usize,
            n_expert_groups: u("expert_group_count").unwrap_or(0),
            n_group_used: u("expert_group_used_count").unwrap_or(0),
            gating,
            expert_weights_norm: b("expert_weights_norm").unwrap_or(false),
            expert_weights_scale: f("expert_weights_scale").unwrap_or(0.0),
            rope_freq_base,
            n_rot,
            rms_eps: f("attention.layer_norm_rms_epsilon").unwrap_or(1e-6),
            rope_scaling,
            rope_scaling_factor: f("rope.scaling.factor")
                .or_else(|| f("rope.scale_linear"))
                .unwrap_or(0.0),
            n_ctx_orig_yarn: u("rope.scaling.original_context_length").unwrap_or(0),
            rope_yarn_log_mul: f("rope.scaling.yarn_log_multiplier").unwrap_or(0.0),
            attn_temp_scale: f("attention.temperature_scale").unwrap_or(0.0),
            sliding_window: u("attention.sliding_window").unwrap_or(0),
            q_lora_rank: u("attention.q_lora_rank").unwrap_or(0),
            kv_lora_rank: u("attention.kv_lora_rank").unwrap_or(0),
            head_dim_k_mla: u("attention.key_length_mla").unwrap_or(0),
            head_dim_v_mla: u("attention.value_length_mla").unwrap_or(0),
            swa_layers: Vec::new(),
            head_dim_k_swa: u("attention.key_length_swa").unwrap_or(head_dim_k),
            head_dim_v_swa: u("attention.value_length_swa").unwrap_or(head_dim_v),
            n_rot_swa: u("rope.dimension_count_swa").unwrap_or(n_rot),
            rope_freq_base_swa: f("rope.freq_base_swa").unwrap_or(rope_freq_base),
            indexer_n_head: u("attention.indexer.head_count").unwrap_or(0),
            indexer_head_dim: u("attention.indexer.key_length").unwrap_or(0),
            indexer_top_k: u("attention.indexer.top_k").unwrap_or(0),
            o_group_count: u("attention.output_group_count").unwrap_or(0),
            o_lora_rank: u("attention.output_lora_rank").unwrap_or(0),
            compress_rope_freq_base: f("attention.compress_rope_freq_base").unwrap_or(0.0),
            compress_ratios: Vec::new(),
            hc_mult: u("hyper_connection.count").unwrap_or(0),
            hc_sinkhorn_iters: u("hyper_connection.sinkhorn_iterations").unwrap_or(0),
            hc_eps: f("hyper_connection.epsilon").unwrap_or(0.0),
            hash_layer_count: u("hash_layer_count").unwrap_or(0) as usize,
            swiglu_clamp_exp,
            swiglu_clamp_shexp: f("swiglu_clamp_shexp").unwrap_or(swiglu_clamp_exp),
        };
        if let Some(e) = unreadable.borrow_mut().take() {
            return Err(e);
        }
        // Before the arch rules, which allocate per block.
        hp.check_block_count()?;
        hp.apply_arch_rules(meta, gating_key.is_some())?;
        hp.validate()?;
        Ok(hp)
    }

    /// What the architecture's `load_arch_hparams` (and graph) in llama.cpp derives or fixes
    /// beyond reading keys ([`Rules`](super::arch::Rules)): gating and weight normalisation
    /// hard-coded by the graph, the default of an absent `expert_gating_func`, the derived expert
    /// width, then the architecture's own derivations (deepseek2's "lite" rule, sliding-window
    /// patterns, deepseek4's per-block arrays).
    fn apply_arch_rules(&mut self, meta: &dyn Metadata, gating_given: bool) -> Result<(), String> {
        let rules = self.arch.rules;
        match rules.gating {
            GatingRule::Fixed(g) => self.gating = g,
            GatingRule::Default(g) if !gating_given => self.gating = g,
            GatingRule::DefaultBy(f) if !gating_given => self.gating = f(self),
            _ => {}
        }
        if let Some(norm) = rules.weights_norm {
            self.expert_weights_norm = norm;
        }
        // Expert width defaults to n_ff / n_expert_used where llama.cpp derives it.
        if rules.ff_exp_from_ff && self.n_ff_exp == 0 && self.n_expert_used > 0 {
            self.n_ff_exp = self.n_ff / self.n_expert_used;
        }
        (rules.derive)(self, meta)
    }

    /// `block_count` and `nextn_predict_layers` in range: checked before anything is sized per
    /// block (`apply_arch_rules`), and again by [`validate`](Self::validate).
    fn check_block_count(&self) -> Result<(), String> {
        let a = self.arch;
        let n = self.n_layer as u64;
        if !(1..=MAX_LAYERS).contains(&n) {
            return Err(format!(
                "{a}.block_count = {n}: must be in 1..={MAX_LAYERS}"
            ));
        }
        if self.n_layer_nextn >= self.n_layer {
            return Err(format!(
                "{a}.nextn_predict_layers = {}: must be less than {a}.block_count = {} (it would \
                 leave no block to decode)",
                self.n_layer_nextn, self.n_layer
            ));
        }
        Ok(())
    }

    /// Checks every field against what the shapes and graphs can take. The error names the GGUF
    /// key (`{arch}.*`, as the file spells it), its value and what is allowed.
    pub fn validate(&self) -> Result<(), String> {
        self.check_block_count()?;
        let a = self.arch;
        let key = |s: &str| format!("{a}.{s}");
        let is = |s: &str, v: u64| format!("{} = {v}", key(s));
        range(&key("embedding_length"), self.n_embd, 1, MAX_DIM, "")?;
        range(
            &key("vocab_size"),
            self.n_vocab,
            1,
            MAX_DIM,
            " (the vocabulary size: this key, else the length of tokenizer.ggml.tokens)",
        )?;
        range(&key("context_length"), self.n_ctx_train, 1, MAX_CTX, "")?;
        range(&key("attention.head_count"), self.n_head, 1, MAX_DIM, "")?;
        let heads = format!(" ({})", is("attention.head_count", self.n_head));
        range(
            &key("attention.head_count_kv"),
            self.n_head_kv,
            1,
            self.n_head,
            &heads,
        )?;
        if !self.n_head.is_multiple_of(self.n_head_kv) {
            return Err(format!(
                "{}: must divide {} (each KV head serves the same number of query heads)",
                is("attention.head_count_kv", self.n_head_kv),
                is("attention.head_count", self.n_head)
            ));
        }
        range(
            &key("attention.key_length"),
            self.head_dim_k,
            1,
            MAX_DIM,
            "",
        )?;
        range(
            &key("attention.value_length"),
            self.head_dim_v,
            1,
            MAX_DIM,
            "",
        )?;
        // Head sizes the graphs rely on (llama.cpp asserts the same when it builds them).
        if a.rules.one_head_size && self.head_dim_v != self.head_dim_k {
            return Err(format!(
                "{}: must equal {} (keys and values share one head size in {a})",
                is("attention.value_length", self.head_dim_v),
                is("attention.key_length", self.head_dim_k)
            ));
        }
        if a.rules.square_q && self.n_head * self.head_dim_k != self.n_embd {
            return Err(format!(
                "{}: times {} must make {} (the query projection is square in {a})",
                is("attention.key_length", self.head_dim_k),
                is("attention.head_count", self.n_head),
                is("embedding_length", self.n_embd)
            ));
        }
        self.check_rope()?;
        let eps = self.rms_eps;
        if !(eps > 0.0 && eps <= 1.0) {
            return Err(format!(
                "{} = {eps}: must be a number in (0, 1] (real models use 1e-6 to 1e-5)",
                key("attention.layer_norm_rms_epsilon")
            ));
        }
        for (s, v) in [
            ("feed_forward_length", self.n_ff),
            ("expert_feed_forward_length", self.n_ff_exp),
            ("expert_shared_feed_forward_length", self.n_ff_shexp),
        ] {
            range(&key(s), v, 0, MAX_DIM, "")?;
        }
        let lead = self.n_layer_dense_lead as u64;
        if lead > 0 && self.n_ff == 0 {
            return Err(format!(
                "{}: must be positive, it sizes the FFN of the dense blocks ({})",
                is("feed_forward_length", 0),
                is("leading_dense_block_count", lead)
            ));
        }
        self.check_experts()?;
        self.check_sliding_window()?;
        for (s, v) in [
            ("expert_weights_scale", self.expert_weights_scale),
            ("swiglu_clamp_exp", self.swiglu_clamp_exp),
            ("swiglu_clamp_shexp", self.swiglu_clamp_shexp),
            ("hyper_connection.epsilon", self.hc_eps),
        ] {
            if !(v.is_finite() && v >= 0.0) {
                return Err(format!(
                    "{} = {v}: must be a finite number >= 0 (0: none)",
                    key(s)
                ));
            }
        }
        self.validate_arch_fields()
    }

    /// Rotary dimensions, RoPE bases and scaling.
    fn check_rope(&self) -> Result<(), String> {
        let a = self.arch;
        let key = |s: &str| format!("{a}.{s}");
        // Rotated in pairs, within the key head (the decompressed one in MLA files).
        let (head_key, head) = if self.head_dim_k_mla > self.head_dim_k {
            ("attention.key_length_mla", self.head_dim_k_mla)
        } else {
            ("attention.key_length", self.head_dim_k)
        };
        check_rot(
            &key("rope.dimension_count"),
            self.n_rot,
            &key(head_key),
            head,
        )?;
        if a.rules.whole_head_rope && self.n_rot != self.head_dim_k {
            return Err(format!(
                "{} = {}: must equal {} = {} ({a} rotates whole heads)",
                key("rope.dimension_count"),
                self.n_rot,
                key("attention.key_length"),
                self.head_dim_k
            ));
        }
        for (s, v) in [
            ("rope.freq_base", self.rope_freq_base),
            (
                "attention.compress_rope_freq_base",
                self.compress_rope_freq_base,
            ),
            ("rope.freq_base_swa", self.rope_freq_base_swa),
        ] {
            // 0 stands for "unset" only where the field has a fallback (not rope.freq_base).
            let unset_ok = s != "rope.freq_base" && v == 0.0;
            if !(unset_ok || (v.is_finite() && v > 0.0)) {
                return Err(format!(
                    "{} = {v}: must be a finite number > 0 (real models use 1e4 to 1e7)",
                    key(s)
                ));
            }
        }
        if !self.rope_scaling_factor.is_finite() || self.rope_scaling_factor < 0.0 {
            return Err(format!(
                "{} = {}: must be a finite number >= 0 (0: no scaling)",
                key("rope.scaling.factor"),
                self.rope_scaling_factor
            ));
        }
        if !self.rope_yarn_log_mul.is_finite() {
            return Err(format!(
                "{} = {}: must be a finite number",
                key("rope.scaling.yarn_log_multiplier"),
                self.rope_yarn_log_mul
            ));
        }
        range(
            &key("rope.scaling.original_context_length"),
            self.n_ctx_orig_yarn,
            0,
            MAX_CTX,
            " (0: context_length)",
        )?;
        if !(self.attn_temp_scale.is_finite() && self.attn_temp_scale >= 0.0) {
            return Err(format!(
                "{} = {}: must be a finite number >= 0 (0: none)",
                key("attention.temperature_scale"),
                self.attn_temp_scale
            ));
        }
        Ok(())
    }

    /// Expert counts, routing groups and dense blocks.
    fn check_experts(&self) -> Result<(), String> {
        let a = self.arch;
        let key = |s: &str| format!("{a}.{s}");
        let is = |s: &str, v: u64| format!("{} = {v}", key(s));
        if self.n_expert == 0 && a.dense {
            // llama.cpp: without experts none is used.
            if self.n_expert_used != 0 {
                return Err(format!(
                    "{}: must be 0 in a model without experts ({})",
                    is("expert_used_count", self.n_expert_used),
                    is("expert_count", 0)
                ));
            }
            if self.n_ff == 0 {
                return Err(format!(
                    "{}: must be positive, it sizes the FFN of every block of a model without \
                     experts",
                    is("feed_forward_length", 0)
                ));
            }
            return Ok(());
        }
        if self.n_expert == 0 {
            return Err(format!("{}: {}", is("expert_count", 0), dense_model(a)));
        }
        range(&key("expert_count"), self.n_expert, 1, MAX_DIM, "")?;
        let experts = format!(" ({})", is("expert_count", self.n_expert));
        range(
            &key("expert_used_count"),
            self.n_expert_used,
            1,
            self.n_expert,
            &experts,
        )?;
        range(
            &key("expert_shared_count"),
            self.n_expert_shared,
            0,
            MAX_DIM,
            "",
        )?;
        let n_decode = self.n_layer_decode() as u64;
        range(
            &key("leading_dense_block_count"),
            self.n_layer_dense_lead as u64,
            0,
            n_decode - 1,
            &format!(
                " (at least one of the {n_decode} decoded blocks must be MoE: {}, {})",
                is("block_count", self.n_layer as u64),
                is("nextn_predict_layers", self.n_layer_nextn as u64)
            ),
        )?;
        let (groups, used) = (self.n_expert_groups, self.n_group_used);
        range(
            &key("expert_group_count"),
            groups,
            0,
            self.n_expert,
            &experts,
        )?;
        if used > groups {
            return Err(format!(
                "{}: must be at most {}",
                is("expert_group_used_count", used),
                is("expert_group_count", groups)
            ));
        }
        if groups > 1 {
            if !self.n_expert.is_multiple_of(groups) {
                return Err(format!(
                    "{}: must divide {} into equal groups",
                    is("expert_group_count", groups),
                    is("expert_count", self.n_expert)
                ));
            }
            let per = self.n_expert / groups;
            if used > 0 && per < 2 {
                return Err(format!(
                    "{}: leaves {per} expert per group of {}; group-limited routing scores a \
                     group by its two best experts (at most expert_count / 2 groups)",
                    is("expert_group_count", groups),
                    is("expert_count", self.n_expert)
                ));
            }
            if used > 0 && self.n_expert_used > used * per {
                return Err(format!(
                    "{}: more than the {} experts of the {} selected groups ({})",
                    is("expert_used_count", self.n_expert_used),
                    used * per,
                    used,
                    is("expert_group_used_count", used)
                ));
            }
        }
        Ok(())
    }

    /// Sliding-window attention: the window, and the head sizes / rotary dims / RoPE base of
    /// windowed blocks (each 0 = the full-attention value).
    fn check_sliding_window(&self) -> Result<(), String> {
        let a = self.arch;
        let key = |s: &str| format!("{a}.{s}");
        for (s, v) in [
            ("attention.key_length_swa", self.head_dim_k_swa),
            ("attention.value_length_swa", self.head_dim_v_swa),
            ("rope.dimension_count_swa", self.n_rot_swa),
        ] {
            range(&key(s), v, 0, MAX_DIM, " (0: as in full-attention blocks)")?;
        }
        let Some(il) = self.swa_layers.iter().position(|&w| w) else {
            return Ok(());
        };
        if self.sliding_window == 0 {
            return Err(format!(
                "{} = 0: must be positive (block {il} and others use sliding-window attention)",
                key("attention.sliding_window")
            ));
        }
        if self.n_rot_swa > 0 {
            let (hk, head) = if self.head_dim_k_swa > 0 {
                ("attention.key_length_swa", self.head_dim_k_swa)
            } else {
                ("attention.key_length", self.head_dim_k)
            };
            check_rot(
                &key("rope.dimension_count_swa"),
                self.n_rot_swa,
                &key(hk),
                head,
            )?;
        }
        Ok(())
    }

    /// Range checks of the architecture-specific fields (MLA, DeepSeek-V4) that shapes use, then
    /// the architecture's own checks ([`Rules::check`](super::arch::Rules)).
    fn validate_arch_fields(&self) -> Result<(), String> {
        let a = self.arch;
        let key = |s: &str| format!("{a}.{s}");
        for (s, v) in [
            ("attention.q_lora_rank", self.q_lora_rank),
            ("attention.kv_lora_rank", self.kv_lora_rank),
            ("attention.key_length_mla", self.head_dim_k_mla),
            ("attention.value_length_mla", self.head_dim_v_mla),
            ("attention.indexer.head_count", self.indexer_n_head),
            ("attention.indexer.key_length", self.indexer_head_dim),
            ("attention.output_group_count", self.o_group_count),
            ("attention.output_lora_rank", self.o_lora_rank),
            ("hyper_connection.count", self.hc_mult),
        ] {
            range(&key(s), v, 0, MAX_DIM, "")?;
        }
        range(
            &key("attention.indexer.top_k"),
            self.indexer_top_k,
            0,
            MAX_CTX,
            "",
        )?;
        range(
            &key("hyper_connection.sinkhorn_iterations"),
            self.hc_sinkhorn_iters,
            0,
            1024,
            "",
        )?;
        (a.rules.check)(self)
    }
}

/// `key = v` must lie in `lo..=hi`; `why` says where a bound comes from.
/// Why a model without experts does not run (an architecture without [`ArchSpec::dense`]).
fn dense_model(arch: &ArchSpec) -> String {
    format!(
        "a dense model, not a Mixture-of-Experts one: PocketMoE runs {arch} only with experts \
         (of dense models it runs the `llama` architecture)"
    )
}

fn range(key: &str, v: u64, lo: u64, hi: u64, why: &str) -> Result<(), String> {
    if (lo..=hi).contains(&v) {
        Ok(())
    } else {
        Err(format!("{key} = {v}: must be in {lo}..={hi}{why}"))
    }
}

/// Rotary dimensions `key = n_rot`: rotated in pairs (even), at least one pair, at most the key
/// head `head_key = head` (ggml's rope spins forever on 0 dims).
fn check_rot(key: &str, n_rot: u64, head_key: &str, head: u64) -> Result<(), String> {
    if n_rot < 2 || n_rot > head || !n_rot.is_multiple_of(2) {
        return Err(format!(
            "{key} = {n_rot}: must be an even number in 2..={head} ({head_key} = {head})"
        ));
    }
    Ok(())
}
