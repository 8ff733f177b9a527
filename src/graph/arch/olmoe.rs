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
    let mut x = g.embed(); // [n_embd, n_tokens]
    for il in 0..g.hp.n_layer_decode() {
        let i = il as i32;
        let h = g.rms_norm(x, g.wl(il, "attn_norm.weight"), "attn_norm", i);
        let h = g.attention(h, il, &attn);
        let ffn_inp = g.add(h, x, "ffn_inp", i);
        let h = g.rms_norm(ffn_inp, g.wl(il, "ffn_norm.weight"), "ffn_norm", i);
        let h = g.moe(h, il, &moe);
        x = g.add(h, ffn_inp, "l_out", i);
    }
    g.output(x) // [n_vocab, n_tokens]
}
