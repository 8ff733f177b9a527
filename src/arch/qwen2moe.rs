//! qwen2moe — Qwen1.5-MoE-A2.7B, Qwen2-57B-A14B: GQA with q/k/v biases (optional in llama.cpp,
//! present in the real files), NeoX RoPE, every block MoE with softmax gating (top-k weights not
//! renormalised), plus one always-on shared expert scaled by `sigmoid(ffn_gate_inp_shexp · x)`.
//! Expert width `n_ff_exp` falls back to `n_ff / n_expert_used`; shared width `n_ff_shexp`
//! (`expert_shared_feed_forward_length`) falls back to `n_ff`. Output projection not tied.
//! Source: llama.cpp `src/models/qwen2moe.cpp` (`load_arch_tensors`).
use super::rows::{ATTN_NORM, EMBED_OUTPUT, EXPERTS, FFN_NORM, QKV_O_SQUARE, ROUTER};
use super::{preset_base, tiny_of, with_heads, Arch, KvLayout, Synth};
use crate::ggml::Tensor;
use crate::graph::blocks::attention::{QkNorm, ROPE_NEOX};
use crate::graph::blocks::{AttnOpts, ExpertAct, MoeOpts};
use crate::graph::GraphBuilder;
use crate::model::arch::{GatingRule, Rules};
use crate::model::hparams::Gating;
use crate::model::{ArchSpec, Hparams, Layers::*, Role::*, TensorSpec};

/// Shared-expert width: `expert_shared_feed_forward_length`, else `feed_forward_length`.
fn n_ff_shexp(h: &Hparams) -> u64 {
    if h.n_ff_shexp > 0 {
        h.n_ff_shexp
    } else {
        h.n_ff
    }
}

#[rustfmt::skip]
pub static QWEN2MOE: Arch = Arch {
    spec: ArchSpec {
        name: "qwen2moe",
        description: "Qwen2-MoE (Qwen1.5-MoE, Qwen2-57B-A14B)",
        required_keys: &["attention.layer_norm_rms_epsilon", "expert_count", "expert_used_count"],
        tensors: &[
            EMBED_OUTPUT,
            &[ATTN_NORM],
            QKV_O_SQUARE,
            &[FFN_NORM, ROUTER],
            EXPERTS,
            &[
                TensorSpec { name: "blk.{}.ffn_gate_inp_shexp.weight", role: SharedExperts, layers: Moe, shape: |h, _| vec![h.n_embd], required: true },
                TensorSpec { name: "blk.{}.ffn_gate_shexp.weight", role: SharedExperts, layers: Moe, shape: |h, _| vec![h.n_embd, n_ff_shexp(h)], required: true },
                TensorSpec { name: "blk.{}.ffn_down_shexp.weight", role: SharedExperts, layers: Moe, shape: |h, _| vec![n_ff_shexp(h), h.n_embd], required: true },
                TensorSpec { name: "blk.{}.ffn_up_shexp.weight", role: SharedExperts, layers: Moe, shape: |h, _| vec![h.n_embd, n_ff_shexp(h)], required: true },
            ],
        ],
        rules: Rules {
            gating: GatingRule::Fixed(Gating::Softmax),
            weights_norm: Some(false),
            ff_exp_from_ff: true,
            one_head_size: true,
            whole_head_rope: true,
            square_q: true,
            ..Rules::NONE
        },
        ..ArchSpec::NONE
    },
    graph: Some(build),
    quantized_kv: true,
    nodes_per_block: super::NODES_PER_BLOCK,
    kv: KvLayout::PLAIN,
    synth: Synth {
        pre_tokenizer: "qwen2",
        aliases: &["qwen2_moe", "qwen2-moe"],
        optional_tensors: &["attn_q.bias", "attn_k.bias", "attn_v.bias"],
        tiny: Some(tiny),
        ..Synth::NONE
    },
};

/// MHA/GQA with q/k/v biases, NeoX RoPE; every block routed SwiGLU experts plus a shared expert
/// gated per token by a sigmoid. Mirrors llama.cpp `src/models/qwen2moe.cpp`.
fn build<'a>(g: &GraphBuilder<'a>) -> Tensor<'a> {
    let attn = AttnOpts::new(QkNorm::None, ROPE_NEOX);
    let moe = MoeOpts::new(g.hp, ExpertAct::Swiglu, g.hp.expert_weights_scale);
    g.pre_norm_decoder(&attn, |g, h, il| g.ffn(h, il, &moe))
}

/// What Qwen2-MoE models share (the synth presets start from it).
pub fn family() -> Hparams {
    Hparams {
        n_vocab: 151936,
        expert_weights_norm: false,
        ..preset_base(&QWEN2MOE)
    }
}

fn tiny() -> Hparams {
    Hparams {
        n_ff_exp: 256,
        n_ff: 512,
        n_ff_shexp: 512,
        ..tiny_of(with_heads(family(), 4, 4, 64))
    }
}
