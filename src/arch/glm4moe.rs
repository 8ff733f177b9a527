//! glm4moe — GLM-4.5 / GLM-4.5-Air / GLM-4.6 / GLM-4.7, Solar Open: GQA with q/k/v biases
//! (optional in llama.cpp, present in the real files) and optional per-head q/k RMSNorm (the
//! 355B models), partial NeoX RoPE (`rope.dimension_count` of the head), pre-FFN norm named
//! `post_attention_norm` (no `ffn_norm`). The first `leading_dense_block_count` blocks are dense
//! (`ffn_{gate,up,down}`, `n_ff`); the rest MoE with sigmoid gating (the default when
//! `expert_gating_func` is absent), a required `exp_probs_b` selection bias, top-k weights
//! normalised / scaled per `expert_weights_norm`/`expert_weights_scale`, and `expert_shared_count`
//! shared experts of width `n_ff_exp * n_expert_shared` (ungated). Output projection may be tied.
//! MTP: the last `nextn_predict_layers` block(s) are full blocks (MoE tensors included) plus the
//! `nextn.*` tensors; decode never runs them and llama.cpp accepts files without them.
//! Source: llama.cpp `src/models/glm4-moe.cpp` (`load_arch_hparams`, `load_arch_tensors`).
use super::rows::{ATTN_NORM, DENSE_FFN, EMBED_OUTPUT_TIED, EXPERTS, NEXTN, QKV_O, ROUTER};
use super::{preset_base, tiny_of, with_heads, Arch, KvLayout, Synth};
use crate::ggml::Tensor;
use crate::graph::blocks::attention::{QkNorm, ROPE_NEOX};
use crate::graph::blocks::{AttnOpts, ExpertAct, MoeOpts};
use crate::graph::GraphBuilder;
use crate::model::arch::{GatingRule, Rules};
use crate::model::hparams::Gating;
use crate::model::{ArchSpec, Hparams, Layers::*, Role::*, TensorSpec};

#[rustfmt::skip]
pub static GLM4MOE: Arch = Arch {
    spec: ArchSpec {
        name: "glm4moe",
        description: "GLM-4.5/4.6/4.7 MoE",
        required_keys: &["expert_feed_forward_length", "attention.layer_norm_rms_epsilon", "expert_shared_count", "expert_count", "expert_used_count"],
        tensors: &[
            EMBED_OUTPUT_TIED,
            &[ATTN_NORM],
            QKV_O,
            &[
                TensorSpec { name: "blk.{}.attn_q_norm.weight", role: Norm, layers: All, shape: |h, _| vec![h.head_dim_k], required: false },
                TensorSpec { name: "blk.{}.attn_k_norm.weight", role: Norm, layers: All, shape: |h, _| vec![h.head_dim_k], required: false },
                TensorSpec { name: "blk.{}.post_attention_norm.weight", role: Norm, layers: All, shape: |h, _| vec![h.n_embd], required: true },
                ROUTER,
                TensorSpec { name: "blk.{}.exp_probs_b.bias", role: Router, layers: Moe, shape: |h, _| vec![h.n_expert], required: true },
            ],
            EXPERTS,
            &[
                TensorSpec { name: "blk.{}.ffn_gate_shexp.weight", role: SharedExperts, layers: Where(|h, il| h.is_moe_layer(il) && h.n_expert_shared > 0), shape: |h, _| vec![h.n_embd, h.n_ff_exp * h.n_expert_shared], required: true },
                TensorSpec { name: "blk.{}.ffn_down_shexp.weight", role: SharedExperts, layers: Where(|h, il| h.is_moe_layer(il) && h.n_expert_shared > 0), shape: |h, _| vec![h.n_ff_exp * h.n_expert_shared, h.n_embd], required: true },
                TensorSpec { name: "blk.{}.ffn_up_shexp.weight", role: SharedExperts, layers: Where(|h, il| h.is_moe_layer(il) && h.n_expert_shared > 0), shape: |h, _| vec![h.n_embd, h.n_ff_exp * h.n_expert_shared], required: true },
            ],
            DENSE_FFN,
            &[
            ],
            // MTP ("nextn") blocks: the block above plus these.
            NEXTN,
        ],
        nextn_blocks_optional: true,
        rules: Rules {
            gating: GatingRule::Default(Gating::Sigmoid),
            ff_exp_from_ff: true,
            one_head_size: true,
            ..Rules::NONE
        },
        ..ArchSpec::NONE
    },
    graph: Some(build),
    quantized_kv: true,
    nodes_per_block: super::NODES_PER_BLOCK,
    kv: KvLayout::PLAIN,
    synth: Synth {
        pre_tokenizer: "glm4",
        aliases: &["glm4_moe", "glm4-moe"],
        optional_tensors: &["attn_q.bias", "attn_k.bias", "attn_v.bias"],
        tiny: Some(tiny),
        ..Synth::NONE
    },
};

/// GQA with q/k/v biases and optional per-head q/k norms, NeoX RoPE over a partial rotary width,
/// pre-FFN norm `post_attention_norm`; leading dense SwiGLU blocks, then routed experts (sigmoid
/// gating, `exp_probs_b` bias, renormalised and scaled weights) plus an ungated shared expert.
/// Trailing MTP (nextn) blocks are not run. Mirrors llama.cpp `src/models/glm4-moe.cpp`.
fn build<'a>(g: &GraphBuilder<'a>) -> Tensor<'a> {
    let attn = AttnOpts::new(QkNorm::PerHead, ROPE_NEOX);
    let moe = MoeOpts::new(g.hp, ExpertAct::Swiglu, g.hp.expert_weights_scale);
    g.pre_norm_decoder(&attn, |g, h, il| g.ffn(h, il, &moe))
}

/// What GLM-4.5 models share (the synth presets start from it).
pub fn family() -> Hparams {
    let h = Hparams {
        n_vocab: 151552,
        n_expert_used: 8,
        n_expert_shared: 1,
        n_layer_dense_lead: 1,
        n_layer_nextn: 1,
        gating: Gating::Sigmoid,
        expert_weights_scale: 1.0,
        n_ctx_train: 131072,
        rms_eps: 1e-5,
        ..preset_base(&GLM4MOE)
    };
    Hparams {
        n_rot: 64,
        ..with_heads(h, 96, 8, 128)
    }
}

fn tiny() -> Hparams {
    Hparams {
        n_layer: 3,
        n_ff_exp: 256,
        n_ff: 512,
        n_rot: 64,
        ..tiny_of(with_heads(family(), 4, 2, 128))
    }
}
