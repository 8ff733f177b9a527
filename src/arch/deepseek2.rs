//! deepseek2 — DeepSeek-V2 / V2-Lite / V2.5 / V3 / V3.1 / R1, Kimi-K2, GLM-4.7-Flash and other
//! DeepSeek-style files. Multi-head latent attention (MLA): q either low-rank
//! (`attn_q_a` → `attn_q_a_norm` → `attn_q_b`, q_lora_rank > 0) or plain `attn_q` in the "lite"
//! variants (q_lora_rank forced to 0, see `derive`); the kv path compresses to
//! `kv_lora_rank` plus a shared rotary key (`attn_kv_a_mqa`, `attn_kv_a_norm`) and decompresses
//! per head through `attn_k_b`/`attn_v_b` (files with `key_length_mla`/`value_length_mla`) or
//! the legacy fused `attn_kv_b`. YaRN RoPE on the `n_rot` rotary dims only.
//! The first `leading_dense_block_count` blocks are dense (`ffn_{gate,up,down}`, `n_ff`); the
//! rest are MoE: routed experts of width `n_ff_exp`, a shared expert of width
//! `n_ff_exp * n_expert_shared` (ungated), softmax (V2) or sigmoid (V3+, GLM-4.7-Flash) gating with
//! the optional `exp_probs_b` selection bias, group-limited routing (`expert_group_count`),
//! `expert_weights_norm`/`expert_weights_scale`. Output projection may be tied.
//! MTP: V3-family files may carry `nextn_predict_layers` trailing blocks that hold a full block
//! plus the `nextn.*` tensors; decode never runs them and llama.cpp accepts files without them.
//! Source: llama.cpp `src/models/deepseek2.cpp` (`load_arch_hparams`, `load_arch_tensors`).
use super::rows::{ATTN_NORM, DENSE_FFN, EMBED_OUTPUT_TIED, FFN_NORM, NEXTN, ROUTER};
use super::{preset_base, tiny_of, Arch, KvLayout, Synth};
use crate::ggml::Tensor;
use crate::gguf::Metadata;
use crate::graph::blocks::attention::ROPE_NORMAL;
use crate::graph::blocks::mla::MlaOpts;
use crate::graph::blocks::{ExpertAct, MoeOpts};
use crate::graph::GraphBuilder;
use crate::model::arch::{GatingRule, Rules};
use crate::model::hparams::{Gating, RopeScaling};
use crate::model::{ArchSpec, Hparams, Layers::*, Role::*, TensorSpec};

#[rustfmt::skip]
pub static DEEPSEEK2: Arch = Arch {
    spec: ArchSpec {
        name: "deepseek2",
        description: "DeepSeek-V2/V3 (MLA)",
        // attention.q_lora_rank is required too, except in "lite" files (checked in `derive`).
        required_keys: &["attention.layer_norm_rms_epsilon", "attention.kv_lora_rank", "expert_feed_forward_length", "expert_shared_count", "expert_count", "expert_used_count"],
        tensors: &[
            EMBED_OUTPUT_TIED,
            &[
                ATTN_NORM,
                TensorSpec { name: "blk.{}.attn_q_a_norm.weight", role: Norm, layers: Where(|h, _| h.mla.q_lora_rank > 0), shape: |h, _| vec![h.mla.q_lora_rank], required: true },
                TensorSpec { name: "blk.{}.attn_kv_a_norm.weight", role: Norm, layers: All, shape: |h, _| vec![h.mla.kv_lora_rank], required: true },
                TensorSpec { name: "blk.{}.attn_q_a.weight", role: Attention, layers: Where(|h, _| h.mla.q_lora_rank > 0), shape: |h, _| vec![h.n_embd, h.mla.q_lora_rank], required: true },
                TensorSpec { name: "blk.{}.attn_q_b.weight", role: Attention, layers: Where(|h, _| h.mla.q_lora_rank > 0), shape: |h, _| vec![h.mla.q_lora_rank, h.n_head * h.mla_head_dim_k()], required: true },
                TensorSpec { name: "blk.{}.attn_q.weight", role: Attention, layers: Where(|h, _| h.mla.q_lora_rank == 0), shape: |h, _| vec![h.n_embd, h.n_head * h.mla_head_dim_k()], required: true },
                TensorSpec { name: "blk.{}.attn_kv_a_mqa.weight", role: Attention, layers: All, shape: |h, _| vec![h.n_embd, h.mla.kv_lora_rank + h.n_rot], required: true },
                TensorSpec { name: "blk.{}.attn_k_b.weight", role: Attention, layers: Where(|h, _| h.is_mla()), shape: |h, _| vec![h.mla_qk_nope(), h.mla.kv_lora_rank, h.n_head], required: true },
                TensorSpec { name: "blk.{}.attn_v_b.weight", role: Attention, layers: Where(|h, _| h.is_mla()), shape: |h, _| vec![h.mla.kv_lora_rank, h.mla_head_dim_v(), h.n_head], required: true },
                TensorSpec { name: "blk.{}.attn_kv_b.weight", role: Attention, layers: Where(|h, _| !h.is_mla()), shape: |h, _| vec![h.mla.kv_lora_rank, h.n_head * (h.mla_qk_nope() + h.mla_head_dim_v())], required: true },
                TensorSpec { name: "blk.{}.attn_output.weight", role: Attention, layers: All, shape: |h, _| vec![h.n_head * h.mla_head_dim_v(), h.n_embd], required: true },
                FFN_NORM,
            ],
            DENSE_FFN,
            &[
                ROUTER,
                TensorSpec { name: "blk.{}.exp_probs_b.bias", role: Router, layers: Moe, shape: |h, _| vec![h.n_expert], required: false },
                TensorSpec { name: "blk.{}.ffn_down_exps.weight", role: RoutedExperts, layers: Moe, shape: |h, _| vec![h.n_ff_exp, h.n_embd, h.n_expert], required: true },
                TensorSpec { name: "blk.{}.ffn_gate_exps.weight", role: RoutedExperts, layers: Moe, shape: |h, _| vec![h.n_embd, h.n_ff_exp, h.n_expert], required: true },
                TensorSpec { name: "blk.{}.ffn_up_exps.weight", role: RoutedExperts, layers: Moe, shape: |h, _| vec![h.n_embd, h.n_ff_exp, h.n_expert], required: true },
                TensorSpec { name: "blk.{}.ffn_gate_shexp.weight", role: SharedExperts, layers: Moe, shape: |h, _| vec![h.n_embd, h.n_ff_exp * h.n_expert_shared], required: true },
                TensorSpec { name: "blk.{}.ffn_down_shexp.weight", role: SharedExperts, layers: Moe, shape: |h, _| vec![h.n_ff_exp * h.n_expert_shared, h.n_embd], required: true },
                TensorSpec { name: "blk.{}.ffn_up_shexp.weight", role: SharedExperts, layers: Moe, shape: |h, _| vec![h.n_embd, h.n_ff_exp * h.n_expert_shared], required: true },
            ],
            // MTP ("nextn") blocks: the block above plus these.
            NEXTN,
        ],
        nextn_blocks_optional: true,
        rules: Rules {
            gating: GatingRule::DefaultBy(default_gating),
            yarn_mscale_all_dim: true,
            derive,
            check,
            ..Rules::NONE
        },
        unsupported,
        dense: false,
    },
    graph: Some(build),
    quantized_kv: false,
    nodes_per_block: super::NODES_PER_BLOCK,
    kv: KvLayout::PLAIN,
    synth: Synth {
        pre_tokenizer: "deepseek-v3",
        aliases: &["deepseek_v2", "deepseek-v2", "deepseek_v3", "deepseek-v3", "deepseek3", "kimi_k2", "kimi-k2"],
        tiny: Some(tiny),
        ..Synth::NONE
    },
};

/// Gating of a file without `expert_gating_func`: V2/V2.5 files have none (softmax); GLM-4.7
/// Lite (47/48 blocks, vocab 154880) is sigmoid.
fn default_gating(h: &Hparams) -> Gating {
    let n = h.n_layer_decode();
    if (n == 47 || n == 48) && h.n_vocab == 154880 {
        Gating::Sigmoid
    } else {
        Gating::Softmax
    }
}

/// The "lite" variants (DeepSeek-V2-Lite, GigaChat3-10B-A1.8B, Kanana-2-30B-A3B: 26 or 27 blocks,
/// or 48 with a 128256-token vocabulary; llama.cpp's rule) have no q compression:
/// `q_lora_rank` is not read; every other file must give it.
fn derive(h: &mut Hparams, meta: &dyn Metadata) -> Result<(), String> {
    let n = h.n_layer_decode();
    if n == 27 || n == 26 || (n == 48 && h.n_vocab == 128256) {
        h.mla.q_lora_rank = 0;
    } else if meta.get_u64(&h.key("attention.q_lora_rank")).is_none() {
        return Err(format!(
            "missing required metadata key {}",
            h.key("attention.q_lora_rank")
        ));
    }
    Ok(())
}

/// MLA's widths, and the shared expert every DeepSeek block holds.
fn check(h: &Hparams) -> Result<(), String> {
    if h.mla.kv_lora_rank == 0 {
        return Err(format!(
            "{}: must be positive (the compressed KV width of MLA)",
            h.key_is("attention.kv_lora_rank", 0)
        ));
    }
    if (h.mla.head_dim_k == 0) != (h.mla.head_dim_v == 0) {
        return Err(format!(
            "{} and {}: MLA files give both (split attn_k_b/attn_v_b), legacy files \
             neither (fused attn_kv_b)",
            h.key_is("attention.key_length_mla", h.mla.head_dim_k),
            h.key_is("attention.value_length_mla", h.mla.head_dim_v)
        ));
    }
    if h.is_mla() {
        // The cache holds one latent row per position: kv_lora_rank + the rotary key.
        let (k, v) = (h.mla.kv_lora_rank + h.n_rot, h.mla.kv_lora_rank);
        if h.head_dim_k != k || h.head_dim_v != v {
            return Err(format!(
                "{} and {}: an MLA file's latent key and value heads must be {} + {} \
                 = {k} and {v}",
                h.key_is("attention.key_length", h.head_dim_k),
                h.key_is("attention.value_length", h.head_dim_v),
                h.key_is("attention.kv_lora_rank", h.mla.kv_lora_rank),
                h.key_is("rope.dimension_count", h.n_rot)
            ));
        }
    }
    if h.mla_head_dim_k() <= h.n_rot {
        let s = if h.is_mla() {
            "attention.key_length_mla"
        } else {
            "attention.key_length"
        };
        return Err(format!(
            "{}: must exceed {} (an MLA key head has a non-rotary part)",
            h.key_is(s, h.mla_head_dim_k()),
            h.key_is("rope.dimension_count", h.n_rot)
        ));
    }
    if h.n_expert_shared == 0 {
        return Err(format!(
            "{}: must be positive (DeepSeek blocks always hold a shared expert)",
            h.key_is("expert_shared_count", 0)
        ));
    }
    Ok(())
}

/// Variants the MLA graph does not build.
fn unsupported(h: &Hparams) -> Option<String> {
    if !h.is_mla() && h.n_head_kv != h.n_head {
        // Legacy files (fused attn_kv_b) decompress K/V to every head: one KV head per q head.
        return Some(format!(
            "deepseek2.attention.head_count_kv = {}: a legacy file (fused attn_kv_b, no \
             deepseek2.attention.key_length_mla) needs one KV head per query head \
             (deepseek2.attention.head_count = {})",
            h.n_head_kv, h.n_head
        ));
    }
    (h.attn_temp_scale != 0.0).then(|| {
        "deepseek2: attention temperature tuning (attention.temperature_scale, Mistral-Large-3) \
         is not built"
            .into()
    })
}

/// Multi-head latent attention in llama.cpp's absorbed form (`blocks::mla`) with normal
/// (interleaved) RoPE and YaRN scaling; leading dense SwiGLU blocks, then routed experts
/// (gating, `exp_probs_b` bias, group-limited top-k, renormalised and scaled weights) plus an
/// ungated shared expert. Trailing MTP (nextn) blocks are not run. Mirrors llama.cpp
/// `src/models/deepseek2.cpp` (the MLA branch).
fn build<'a>(g: &GraphBuilder<'a>) -> Tensor<'a> {
    let mla = MlaOpts {
        rope_mode: ROPE_NORMAL,
    };
    let moe = MoeOpts::new(g.hp, ExpertAct::Swiglu, g.hp.expert_weights_scale);
    g.pre_norm_decoder_with(
        |g, h, il| g.mla_attention(h, il, &mla),
        |g, h, il| g.ffn(h, il, &moe),
    )
}

/// DeepSeek-V2/V3 with MLA as llama.cpp's converter writes it: key/value_length describe the
/// absorbed (latent) heads (kv_lora + rope, kv_lora), key/value_length_mla the decompressed ones
/// (192 = 128 nope + 64 rope, 128). YaRN as in their configs: factor 40 over 4096 original
/// positions, `yarn_log_multiplier` = 0.1 * mscale_all_dim (1.0 in V3; V2-Lite overrides). The
/// synth presets start from it.
pub fn family(kv_lora: u64) -> Hparams {
    {
        let mut hp = Hparams {
            rope_scaling: RopeScaling::Yarn,
            rope_scaling_factor: 40.0,
            n_ctx_orig_yarn: 4096,
            rope_yarn_log_mul: 0.1,
            n_head_kv: 1,
            head_dim_k: kv_lora + 64,
            head_dim_v: kv_lora,
            n_rot: 64,
            rope_freq_base: 10000.0,
            n_ctx_train: 163840,
            ..preset_base(&DEEPSEEK2)
        };
        hp.mla.head_dim_k = 192;
        hp.mla.head_dim_v = 128;
        hp.mla.kv_lora_rank = kv_lora;
        hp
    }
}

/// V3-style routing: sigmoid gating, group-limited top-k, scaled weights.
pub(super) fn tiny() -> Hparams {
    let mut hp = Hparams {
        n_layer: 3,
        n_head: 4,
        n_expert: 16,
        n_expert_used: 4,
        n_expert_shared: 1,
        n_ff_exp: 256,
        n_ff: 512,
        n_layer_dense_lead: 1,
        gating: Gating::Sigmoid,
        n_expert_groups: 4,
        n_group_used: 2,
        expert_weights_scale: 2.5,
        ..tiny_of(family(512))
    };
    hp.mla.q_lora_rank = 256;
    hp
}
