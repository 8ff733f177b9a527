//! deepseek2 — DeepSeek-V2/V2.5/V3/R1, Kimi-K2 and other DeepSeek-style files: multi-head
//! latent attention in llama.cpp's absorbed form (`blocks::mla`) with normal (interleaved) RoPE
//! and YaRN scaling; leading dense SwiGLU blocks, then MoE blocks with softmax (V2) or sigmoid
//! (V3) gating, the `exp_probs_b` selection bias, group-limited top-k, renormalised and scaled
//! weights, plus an ungated shared expert. Trailing MTP (nextn) blocks are not run.
//! Mirrors llama.cpp `src/models/deepseek2.cpp` (the MLA branch).
use crate::ggml::Tensor;
use crate::graph::blocks::attention::ROPE_NORMAL;
use crate::graph::blocks::mla::MlaOpts;
use crate::graph::blocks::{ExpertAct, MoeOpts};
use crate::graph::GraphBuilder;

pub fn build<'a>(g: &GraphBuilder<'a>) -> Tensor<'a> {
    let mla = MlaOpts {
        rope_mode: ROPE_NORMAL,
    };
    let moe = MoeOpts {
        act: ExpertAct::Swiglu,
        gating: g.hp.gating,
        norm_w: g.hp.expert_weights_norm,
        scale: g.hp.expert_weights_scale,
    };
    g.pre_norm_decoder_with(
        |g, h, il| g.mla_attention(h, il, &mla),
        "ffn_norm.weight",
        |g, h, il| {
            if il < g.hp.n_layer_dense_lead {
                return g.swiglu_ffn(h, il, "");
            }
            let routed = g.moe(h, il, &moe);
            let shared = g.swiglu_ffn(h, il, "_shexp");
            g.add(routed, shared, "ffn_out", il as i32)
        },
    )
}
