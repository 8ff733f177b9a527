//! llama — the Llama architecture with experts: Mixtral-8x7B / 8x22B and mergekit-style Llama
//! MoEs (`expert_count` > 0). GQA without q/k/v biases in practice (llama.cpp accepts optional
//! q/k/v/o biases), NORM-style RoPE (rope.dimension_count must equal the head size) with optional
//! `rope_freqs` factors (Llama-3-based merges). Every block MoE: softmax gating with the top-k
//! weights renormalised, experts of width `feed_forward_length` (`n_ff`; Mixtral writes no
//! `expert_feed_forward_length`), `ffn_gate_exps` optional; no shared expert, no router bias.
//! Blocks are dense (`ffn_{gate,up,down}` + optional biases) when `expert_count` is absent or 0:
//! plain Llama (SmolLM2, Llama-3, ...), run with every block resident (`ArchSpec::dense`).
//! Output projection may be tied. Not listed: the
//! `rope_factors_long/short` llama.cpp loads only under LongRoPE scaling (no Llama MoE uses it).
//! Source: llama.cpp `src/models/llama.cpp` (`load_arch_tensors`).
use super::rows::{ATTN_NORM, DENSE_FFN, EMBED_OUTPUT_TIED, FFN_NORM, QKV_O, ROUTER};
use super::{preset_base, tiny_of, with_heads, Arch, KvLayout, Synth};
use crate::ggml::Tensor;
use crate::graph::blocks::attention::{QkNorm, ROPE_NORMAL};
use crate::graph::blocks::{AttnOpts, ExpertAct, MoeOpts};
use crate::graph::GraphBuilder;
use crate::model::arch::{GatingRule, Rules};
use crate::model::hparams::Gating;
use crate::model::{ArchSpec, Hparams, Layers::*, Role::*, TensorSpec};

#[rustfmt::skip]
pub static LLAMA: Arch = Arch {
    spec: ArchSpec {
        name: "llama",
        description: "Llama with experts (Mixtral), or dense",
        required_keys: &["attention.layer_norm_rms_epsilon", "expert_count", "expert_used_count"],
        tensors: &[
            EMBED_OUTPUT_TIED,
            &[
                // One tensor for every block (llama.cpp loads it per block, TENSOR_DUPLICATED after the first).
                TensorSpec { name: "rope_freqs.weight", role: Other, layers: Global, shape: |h, _| vec![h.n_rot / 2], required: false },
                ATTN_NORM,
            ],
            QKV_O,
            &[
                TensorSpec { name: "blk.{}.attn_output.bias", role: Attention, layers: All, shape: |h, _| vec![h.n_embd], required: false },
                FFN_NORM,
            ],
            DENSE_FFN,
            &[
                TensorSpec { name: "blk.{}.ffn_gate.bias", role: DenseFfn, layers: Dense, shape: |h, _| vec![h.n_ff], required: false },
                TensorSpec { name: "blk.{}.ffn_down.bias", role: DenseFfn, layers: Dense, shape: |h, _| vec![h.n_embd], required: false },
                TensorSpec { name: "blk.{}.ffn_up.bias", role: DenseFfn, layers: Dense, shape: |h, _| vec![h.n_ff], required: false },
                ROUTER,
                TensorSpec { name: "blk.{}.ffn_gate_exps.weight", role: RoutedExperts, layers: Moe, shape: |h, _| vec![h.n_embd, h.n_ff, h.n_expert], required: false },
                TensorSpec { name: "blk.{}.ffn_down_exps.weight", role: RoutedExperts, layers: Moe, shape: |h, _| vec![h.n_ff, h.n_embd, h.n_expert], required: true },
                TensorSpec { name: "blk.{}.ffn_up_exps.weight", role: RoutedExperts, layers: Moe, shape: |h, _| vec![h.n_embd, h.n_ff, h.n_expert], required: true },
            ],
        ],
        rules: Rules {
            gating: GatingRule::Fixed(Gating::Softmax),
            weights_norm: Some(true),
            one_head_size: true,
            whole_head_rope: true,
            ..Rules::NONE
        },
        dense: true,
        ..ArchSpec::NONE
    },
    graph: Some(build),
    quantized_kv: true,
    nodes_per_block: super::NODES_PER_BLOCK,
    kv: KvLayout::PLAIN,
    synth: Synth {
        pre_tokenizer: "default",
        aliases: &["mixtral"],
        optional_tensors: &["ffn_gate_exps.weight"],
        tiny: Some(tiny),
        ..Synth::NONE
    },
};

/// GQA, normal (GPT-J) RoPE, every block routed SwiGLU experts (a block without a router would
/// be a dense SwiGLU FFN). Mirrors llama.cpp `src/models/llama.cpp`.
fn build<'a>(g: &GraphBuilder<'a>) -> Tensor<'a> {
    let attn = AttnOpts::new(QkNorm::None, ROPE_NORMAL);
    let moe = MoeOpts::new(g.hp, ExpertAct::Swiglu, g.hp.expert_weights_scale);
    g.pre_norm_decoder(&attn, |g, h, il| g.ffn(h, il, &moe))
}

/// What Mixtral models share (the synth presets start from it).
pub fn family() -> Hparams {
    let h = Hparams {
        n_vocab: 32000,
        n_expert: 8,
        n_expert_used: 2,
        rms_eps: 1e-5,
        ..preset_base(&LLAMA)
    };
    with_heads(h, 32, 8, 128)
}

fn tiny() -> Hparams {
    Hparams {
        n_ff: 512,
        ..tiny_of(with_heads(family(), 4, 2, 64))
    }
}
