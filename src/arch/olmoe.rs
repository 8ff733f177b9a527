//! olmoe — OLMoE-1B-7B (AllenAI): MHA without biases in practice (llama.cpp accepts optional
//! q/k/v biases), RMSNorm over the whole q and k projections (`attn_q_norm`/`attn_k_norm` are
//! `n_embd` wide), NeoX RoPE. Every block MoE: softmax gating, top-k weights not renormalised;
//! experts sized by `feed_forward_length` (`n_ff`); no shared expert, no dense blocks, no router
//! bias. Output projection not tied.
//! Source: llama.cpp `src/models/olmoe.cpp` (`load_arch_tensors`).
use super::rows::{ATTN_NORM, EMBED_OUTPUT, EXPERTS_FF, FFN_NORM, QKV_O_SQUARE, ROUTER};
use super::{preset_base, tiny_of, with_heads, Arch, KvLayout, Synth};
use crate::ggml::Tensor;
use crate::graph::blocks::attention::{QkNorm, ROPE_NEOX};
use crate::graph::blocks::{AttnOpts, ExpertAct, MoeOpts};
use crate::graph::GraphBuilder;
use crate::model::arch::{GatingRule, Rules};
use crate::model::hparams::Gating;
use crate::model::{ArchSpec, Hparams, Layers::*, Role::*, TensorSpec};

#[rustfmt::skip]
pub static OLMOE: Arch = Arch {
    spec: ArchSpec {
        name: "olmoe",
        description: "OLMoE",
        required_keys: &["attention.layer_norm_rms_epsilon", "expert_count", "expert_used_count"],
        tensors: &[
            EMBED_OUTPUT,
            &[ATTN_NORM],
            QKV_O_SQUARE,
            &[
                TensorSpec { name: "blk.{}.attn_q_norm.weight", role: Norm, layers: All, shape: |h, _| vec![h.n_embd], required: true },
                TensorSpec { name: "blk.{}.attn_k_norm.weight", role: Norm, layers: All, shape: |h, _| vec![h.n_embd], required: true },
                FFN_NORM,
                ROUTER,
            ],
            EXPERTS_FF,
        ],
        rules: Rules {
            gating: GatingRule::Fixed(Gating::Softmax),
            weights_norm: Some(false),
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
        pre_tokenizer: "olmo",
        tiny: Some(tiny),
        ..Synth::NONE
    },
};

/// MHA with q/k RMSNorm over the whole projection, NeoX RoPE; every block routed SwiGLU
/// experts (softmax gating, no renormalisation). Mirrors llama.cpp `src/models/olmoe.cpp`.
fn build<'a>(g: &GraphBuilder<'a>) -> Tensor<'a> {
    let attn = AttnOpts::new(QkNorm::Full, ROPE_NEOX);
    let moe = MoeOpts::new(g.hp, ExpertAct::Swiglu, 1.0);
    g.pre_norm_decoder(&attn, |g, h, il| g.ffn(h, il, &moe))
}

/// What OLMoE models share (the synth presets start from it).
pub fn family() -> Hparams {
    let h = Hparams {
        n_vocab: 50304,
        n_expert_used: 8,
        n_ctx_train: 4096,
        rope_freq_base: 10000.0,
        rms_eps: 1e-5,
        expert_weights_norm: false,
        ..preset_base(&OLMOE)
    };
    with_heads(h, 16, 16, 128)
}

fn tiny() -> Hparams {
    Hparams {
        n_ff: 256,
        n_ff_exp: 256,
        ..tiny_of(with_heads(family(), 2, 2, 128))
    }
}
