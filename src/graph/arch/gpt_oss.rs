//! gpt-oss — GPT-OSS-20B/120B: GQA with q/k/v/o biases and learned per-head attention sinks,
//! NeoX RoPE, sliding-window attention (128) on every other block, pre-FFN norm named
//! `post_attention_norm`; every block MoE with a biased router, softmax over the selected
//! experts' logits, expert biases and the clamped SwiGLU (alpha 1.702, limit 7).
//! Mirrors llama.cpp `src/models/openai-moe.cpp`.
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
        act: ExpertAct::SwigluOai,
        gating: Gating::SoftmaxWeight,
        norm_w: false,
        scale: g.hp.expert_weights_scale,
    };
    g.pre_norm_decoder(&attn, "post_attention_norm.weight", |g, h, il| {
        g.moe(h, il, &moe)
    })
}
