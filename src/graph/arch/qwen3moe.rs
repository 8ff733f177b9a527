//! qwen3moe — Qwen3-MoE: GQA with per-head q/k RMSNorm, NeoX RoPE, every block MoE with softmax
//! gating renormalised over the top-k, no shared expert. Mirrors llama.cpp `src/models/qwen3moe.cpp`.
use crate::ggml::Tensor;
use crate::graph::blocks::attention::{QkNorm, ROPE_NEOX};
use crate::graph::blocks::{AttnOpts, ExpertAct, MoeOpts};
use crate::graph::GraphBuilder;
use crate::model::hparams::Gating;

pub fn build<'a>(g: &GraphBuilder<'a>) -> Tensor<'a> {
    let attn = AttnOpts {
        qk_norm: QkNorm::PerHead,
        rope_mode: ROPE_NEOX,
    };
    let moe = MoeOpts {
        act: ExpertAct::Swiglu,
        gating: Gating::Softmax,
        norm_w: true,
        scale: 1.0,
    };
    g.pre_norm_decoder(&attn, "ffn_norm.weight", |g, h, il| g.moe(h, il, &moe))
}
