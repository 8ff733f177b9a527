//! glm4moe — GLM-4.5 / GLM-4.5-Air / GLM-4.6: GQA with q/k/v biases and optional per-head q/k
//! norms, NeoX RoPE over a partial rotary width, pre-FFN norm `post_attention_norm`; leading
//! dense SwiGLU blocks, then MoE blocks with sigmoid gating, the `exp_probs_b` selection bias,
//! renormalised and scaled weights plus an ungated shared expert. Trailing MTP (nextn) blocks are
//! not run. Mirrors llama.cpp `src/models/glm4-moe.cpp`.
use crate::ggml::Tensor;
use crate::graph::blocks::attention::{QkNorm, ROPE_NEOX};
use crate::graph::blocks::{AttnOpts, ExpertAct, MoeOpts};
use crate::graph::GraphBuilder;

pub fn build<'a>(g: &GraphBuilder<'a>) -> Tensor<'a> {
    let attn = AttnOpts {
        qk_norm: QkNorm::PerHead,
        rope_mode: ROPE_NEOX,
    };
    let moe = MoeOpts {
        act: ExpertAct::Swiglu,
        gating: g.hp.gating,
        norm_w: g.hp.expert_weights_norm,
        scale: g.hp.expert_weights_scale,
    };
    g.pre_norm_decoder(&attn, "post_attention_norm.weight", |g, h, il| {
        if il < g.hp.n_layer_dense_lead {
            return g.swiglu_ffn(h, il, "");
        }
        let routed = g.moe(h, il, &moe);
        let shared = g.swiglu_ffn(h, il, "_shexp");
        g.add(routed, shared, "ffn_out", il as i32)
    })
}
