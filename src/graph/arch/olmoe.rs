//! olmoe — OLMoE-1B-7B: MHA with q/k RMSNorm over the whole projection, NeoX RoPE, every block
//! MoE (64 experts, top-8) with softmax gating and no renormalisation. Mirrors llama.cpp
//! `src/models/olmoe.cpp`.
use crate::ggml::Tensor;
use crate::graph::blocks::attention::{QkNorm, ROPE_NEOX};
use crate::graph::blocks::{AttnOpts, ExpertAct, MoeOpts};
use crate::graph::GraphBuilder;
use crate::model::hparams::Gating;

pub fn build<'a>(g: &GraphBuilder<'a>) -> Tensor<'a> {
    let attn = AttnOpts {
        qk_norm: QkNorm::Full,
        rope_mode: ROPE_NEOX,
    };
    let moe = MoeOpts {
        act: ExpertAct::Swiglu,
        gating: Gating::Softmax,
        norm_w: false,
        scale: 1.0,
    };
    g.pre_norm_decoder(&attn, "ffn_norm.weight", |g, h, il| g.moe(h, il, &moe))
}
