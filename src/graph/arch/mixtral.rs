//! llama with experts — Mixtral-8x7B/8x22B: GQA, normal (GPT-J) RoPE, every block MoE (8
//! experts, top-2) with softmax gating renormalised over the top-k; a block without a router
//! would be a dense SwiGLU FFN. Mirrors llama.cpp `src/models/llama.cpp`.
use crate::ggml::Tensor;
use crate::graph::blocks::attention::{QkNorm, ROPE_NORMAL};
use crate::graph::blocks::{AttnOpts, ExpertAct, MoeOpts};
use crate::graph::GraphBuilder;
use crate::model::hparams::Gating;

pub fn build<'a>(g: &GraphBuilder<'a>) -> Tensor<'a> {
    let attn = AttnOpts {
        qk_norm: QkNorm::None,
        rope_mode: ROPE_NORMAL,
    };
    let moe = MoeOpts {
        act: ExpertAct::Swiglu,
        gating: Gating::Softmax,
        norm_w: true,
        scale: g.hp.expert_weights_scale,
    };
    g.pre_norm_decoder(&attn, "ffn_norm.weight", |g, h, il| {
        if g.wl_opt(il, "ffn_gate_inp.weight").is_some() {
            g.moe(h, il, &moe)
        } else {
            g.swiglu_ffn(h, il, "")
        }
    })
}
