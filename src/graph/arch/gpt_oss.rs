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
    let mut x = g.embed(); // [n_embd, n_tokens]
    for il in 0..g.hp.n_layer_decode() {
        let i = il as i32;
        let h = g.rms_norm(x, g.wl(il, "attn_norm.weight"), "attn_norm", i);
        let h = g.attention(h, il, &attn);
        let ffn_inp = g.add(h, x, "ffn_inp", i);
        let h = g.rms_norm(
            ffn_inp,
            g.wl(il, "post_attention_norm.weight"),
            "attn_post_norm",
            i,
        );
        let h = g.moe(h, il, &moe);
        x = g.add(h, ffn_inp, "l_out", i);
    }
    g.output(x) // [n_vocab, n_tokens]
}
