//! minimax-m2 — MiniMax-M2: GQA with q/k RMSNorm over the whole projection, NeoX RoPE over a
//! partial rotary width; every block MoE with sigmoid gating, the `exp_probs_b` selection bias
//! and renormalised weights. Mirrors llama.cpp `src/models/minimax-m2.cpp`.
use crate::ggml::Tensor;
use crate::graph::blocks::attention::{QkNorm, ROPE_NEOX};
use crate::graph::blocks::{AttnOpts, ExpertAct, MoeOpts};
use crate::graph::GraphBuilder;

pub fn build<'a>(g: &GraphBuilder<'a>) -> Tensor<'a> {
    let attn = AttnOpts {
        qk_norm: QkNorm::Full,
        rope_mode: ROPE_NEOX,
    };
    let moe = MoeOpts {
        act: ExpertAct::Swiglu,
        gating: g.hp.gating,
        norm_w: true,
        scale: g.hp.expert_weights_scale,
    };
    g.pre_norm_decoder(&attn, "ffn_norm.weight", |g, h, il| g.moe(h, il, &moe))
}
