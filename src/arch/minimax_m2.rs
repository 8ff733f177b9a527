//! minimax-m2 — MiniMax-M2 / M2.1 (230B-A10B): GQA without biases in practice (llama.cpp accepts
//! optional q/k/v biases), RMSNorm over the whole q and k projections (`attn_q_norm` is
//! `n_head * head_dim` wide, `attn_k_norm` `n_head_kv * head_dim`) rather than per head, partial
//! NeoX RoPE. Every block MoE: sigmoid gating (`expert_gating_func`, which llama.cpp requires in
//! practice; assumed sigmoid when absent) with a required `exp_probs_b` selection bias, top-k
//! weights renormalised; no shared expert, no dense blocks. Experts are sized by
//! `feed_forward_length` (`n_ff`), although `expert_feed_forward_length` is a required key.
//! Source: llama.cpp `src/models/minimax-m2.cpp` (`load_arch_tensors`).
use super::rows::{ATTN_NORM, EMBED_OUTPUT, EXPERTS_FF, FFN_NORM, QKV_O_GQA, ROUTER};
use super::{preset_base, tiny_of, with_heads, Arch, KvLayout, Synth};
use crate::ggml::Tensor;
use crate::graph::blocks::attention::{QkNorm, ROPE_NEOX};
use crate::graph::blocks::{AttnOpts, ExpertAct, MoeOpts};
use crate::graph::GraphBuilder;
use crate::model::arch::{GatingRule, Rules};
use crate::model::hparams::Gating;
use crate::model::{ArchSpec, Hparams, Layers::*, Role::*, TensorSpec};

#[rustfmt::skip]
pub static MINIMAX_M2: Arch = Arch {
    spec: ArchSpec {
        name: "minimax-m2",
        description: "MiniMax-M2",
        required_keys: &["attention.layer_norm_rms_epsilon", "expert_feed_forward_length", "expert_count", "expert_used_count"],
        tensors: &[
            EMBED_OUTPUT,
            QKV_O_GQA,
            &[
                ATTN_NORM,
                TensorSpec { name: "blk.{}.attn_q_norm.weight", role: Norm, layers: All, shape: |h, _| vec![h.q_dim()], required: true },
                TensorSpec { name: "blk.{}.attn_k_norm.weight", role: Norm, layers: All, shape: |h, _| vec![h.k_dim()], required: true },
                FFN_NORM,
                ROUTER,
            ],
            EXPERTS_FF,
            &[
                TensorSpec { name: "blk.{}.exp_probs_b.bias", role: Router, layers: Moe, shape: |h, _| vec![h.n_expert], required: true },
            ],
        ],
        rules: Rules {
            // llama.cpp leaves NONE (and aborts in the graph); MiniMax-M2 scores with sigmoid.
            gating: GatingRule::Default(Gating::Sigmoid),
            weights_norm: Some(true),
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
        pre_tokenizer: "default",
        aliases: &["minimax", "minimax_m2"],
        tiny: Some(tiny),
        ..Synth::NONE
    },
};

/// GQA with q/k RMSNorm over the whole projection, NeoX RoPE over a partial rotary width; every
/// block routed SwiGLU experts (sigmoid gating, `exp_probs_b` bias, renormalised weights).
/// Mirrors llama.cpp `src/models/minimax-m2.cpp`.
fn build<'a>(g: &GraphBuilder<'a>) -> Tensor<'a> {
    let attn = AttnOpts::new(QkNorm::Full, ROPE_NEOX);
    let moe = MoeOpts::new(g.hp, ExpertAct::Swiglu, g.hp.expert_weights_scale);
    g.pre_norm_decoder(&attn, |g, h, il| g.ffn(h, il, &moe))
}

/// What MiniMax-M2 models share (the synth presets start from it).
pub fn family() -> Hparams {
    let h = Hparams {
        n_vocab: 200064,
        n_embd: 3072,
        n_expert: 256,
        n_expert_used: 8,
        n_ff: 1536,
        n_ff_exp: 1536,
        gating: Gating::Sigmoid,
        n_ctx_train: 196608,
        rope_freq_base: 5e6,
        ..preset_base(&MINIMAX_M2)
    };
    Hparams {
        n_rot: 64,
        ..with_heads(h, 48, 8, 128)
    }
}

fn tiny() -> Hparams {
    Hparams {
        n_ff: 256,
        n_ff_exp: 256,
        n_rot: 64,
        ..tiny_of(with_heads(family(), 4, 2, 128))
    }
}
