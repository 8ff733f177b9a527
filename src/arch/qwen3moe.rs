//! qwen3moe — Qwen3-MoE (Qwen3-30B-A3B, Qwen3-235B-A22B): GQA with per-head q/k RMSNorm, NeoX
//! RoPE, every block MoE with softmax gating renormalised over the top-k, no shared expert.
//! `n_ff_exp` falls back to `n_ff / n_expert_used`. Optional q/k/v biases (create_tensor_qkv) are
//! absent from real Qwen3 files.
//! Source: llama.cpp `src/models/qwen3moe.cpp` (`load_arch_tensors`).
use super::rows::{ATTN_NORM, EMBED_OUTPUT_TIED, EXPERTS, FFN_NORM, QKV_O_GQA, ROUTER};
use super::{preset_base, tiny_of, with_heads, Arch, KvLayout, Synth};
use crate::ggml::Tensor;
use crate::graph::blocks::attention::{QkNorm, ROPE_NEOX};
use crate::graph::blocks::{AttnOpts, ExpertAct, MoeOpts};
use crate::graph::GraphBuilder;
use crate::model::arch::{GatingRule, Rules};
use crate::model::hparams::Gating;
use crate::model::{ArchSpec, Hparams, Layers::*, Role::*, TensorSpec};

#[rustfmt::skip]
pub static QWEN3MOE: Arch = Arch {
    spec: ArchSpec {
        name: "qwen3moe",
        description: "Qwen3-MoE",
        required_keys: &["attention.layer_norm_rms_epsilon", "expert_count", "expert_used_count"],
        tensors: &[
            EMBED_OUTPUT_TIED,
            &[ATTN_NORM],
            QKV_O_GQA,
            &[
                TensorSpec { name: "blk.{}.attn_q_norm.weight", role: Norm, layers: All, shape: |h, _| vec![h.head_dim_k], required: true },
                TensorSpec { name: "blk.{}.attn_k_norm.weight", role: Norm, layers: All, shape: |h, _| vec![h.head_dim_k], required: true },
                FFN_NORM,
                ROUTER,
            ],
            EXPERTS,
        ],
        rules: Rules {
            gating: GatingRule::Fixed(Gating::Softmax),
            weights_norm: Some(true),
            ff_exp_from_ff: true,
            one_head_size: true,
            whole_head_rope: true,
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
        aliases: &["qwen3_moe", "qwen3-moe"],
        context_channel: true,
        tiny: Some(tiny),
        ..Synth::NONE
    },
};

/// GQA with per-head q/k RMSNorm and NeoX RoPE; every block routed SwiGLU experts. Mirrors
/// llama.cpp `src/models/qwen3moe.cpp`.
fn build<'a>(g: &GraphBuilder<'a>) -> Tensor<'a> {
    let attn = AttnOpts::new(QkNorm::PerHead, ROPE_NEOX);
    let moe = MoeOpts::new(g.hp, ExpertAct::Swiglu, 1.0);
    g.pre_norm_decoder(&attn, |g, h, il| g.ffn(h, il, &moe))
}

/// What Qwen3-MoE models share (the synth presets start from it).
pub fn family() -> Hparams {
    Hparams {
        n_vocab: 151936,
        n_ctx_train: 40960,
        n_expert: 128,
        n_expert_used: 8,
        ..preset_base(&QWEN3MOE)
    }
}

fn tiny() -> Hparams {
    Hparams {
        n_ff_exp: 256,
        ..tiny_of(with_heads(family(), 4, 2, 128))
    }
}
