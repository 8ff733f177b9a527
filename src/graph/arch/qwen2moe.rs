//! qwen2moe — Qwen1.5-MoE / Qwen2-57B-A14B: MHA/GQA with q/k/v biases, NeoX RoPE, every block
//! MoE with softmax gating (no renormalisation) plus a shared expert gated per token by a
//! sigmoid. Mirrors llama.cpp `src/models/qwen2moe.cpp`.
use crate::ggml::Tensor;
use crate::graph::blocks::attention::{QkNorm, ROPE_NEOX};
use crate::graph::blocks::{AttnOpts, ExpertAct, MoeOpts};
use crate::graph::GraphBuilder;
use crate::model::hparams::Gating;

pub fn build<'a>(g: &GraphBuilder<'a>) -> Tensor<'a> {
    let attn = AttnOpts {
        qk_norm: QkNorm::None,
        rope_mode: ROPE_NEOX,
    };
    let moe = MoeOpts {
        act: ExpertAct::Swiglu,
        gating: Gating::Softmax,
        norm_w: false,
        scale: g.hp.expert_weights_scale,
    };
    g.pre_norm_decoder(&attn, "ffn_norm.weight", |g, h, il| {
        let routed = g.moe(h, il, &moe);
        let shared = g.shared_expert_sigmoid_gated(h, il);
        g.add(routed, shared, "ffn_out", il as i32)
    })
}
