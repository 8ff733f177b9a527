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
    let mut x = g.embed(); // [n_embd, n_tokens]
    for il in 0..g.hp.n_layer_decode() {
        let i = il as i32;
        let h = g.rms_norm(x, g.wl(il, "attn_norm.weight"), "attn_norm", i);
        let h = g.attention(h, il, &attn);
        let ffn_inp = g.add(h, x, "ffn_inp", i);
        let h = g.rms_norm(ffn_inp, g.wl(il, "ffn_norm.weight"), "ffn_norm", i);
        let routed = g.moe(h, il, &moe);
        let shared = g.shared_expert_sigmoid_gated(h, il);
        let h = g.add(routed, shared, "ffn_out", i);
        x = g.add(h, ffn_inp, "l_out", i);
    }
    g.output(x) // [n_vocab, n_tokens]
}
