//! Dense SwiGLU FFN (llama.cpp `build_ffn(..., LLM_FFN_SILU, LLM_FFN_PAR)`): `down(silu(gate·x) *
//! up·x)`, used by dense blocks and shared experts.
use crate::ggml::Tensor;
use crate::graph::GraphBuilder;

impl<'a> GraphBuilder<'a> {
    /// SwiGLU FFN of block `il` with weights `ffn_{up,gate,down}{suffix}.weight`
    /// (suffix "" for dense blocks, "_shexp" for shared experts); `x` [n_embd, n_tokens].
    pub fn swiglu_ffn(&self, x: Tensor<'a>, il: usize, suffix: &str) -> Tensor<'a> {
        self.swiglu_ffn_clamped(x, il, suffix, 0.0)
    }

    /// [`Self::swiglu_ffn`] with DeepSeek-V4's clamp `silu(min(gate, l)) * clamp(up, -l, l)`
    /// (`limit` <= 1e-6: none, as llama.cpp).
    pub fn swiglu_ffn_clamped(
        &self,
        x: Tensor<'a>,
        il: usize,
        suffix: &str,
        limit: f32,
    ) -> Tensor<'a> {
        let (ctx, i) = (self.ctx, il as i32);
        let up = ctx.mul_mat(self.wl(il, &format!("ffn_up{suffix}.weight")), x); // [n_ff, nt]
        let gate = ctx.mul_mat(self.wl(il, &format!("ffn_gate{suffix}.weight")), x); // [n_ff, nt]
        let act = if limit > 1e-6 {
            self.cb(ctx.swiglu_clamp(gate, up, limit), "ffn_swiglu_limited", i)
        } else {
            self.cb(ctx.swiglu_split(gate, up), "ffn_swiglu", i)
        };
        // libllama's names: a dense block's output is `ffn_out`; a shared expert's is `ffn_shexp`
        // (the block's `ffn_out` is then the sum with the routed experts).
        let name = if suffix == "_shexp" {
            "ffn_shexp"
        } else {
            "ffn_out"
        };
        self.cb(
            ctx.mul_mat(self.wl(il, &format!("ffn_down{suffix}.weight")), act),
            name,
            i,
        ) // [n_embd, nt]
    }

    /// Qwen2-MoE's shared expert: the SwiGLU FFN gated per token by `sigmoid(gate_inp_shexp·x)`.
    pub fn shared_expert_sigmoid_gated(&self, x: Tensor<'a>, il: usize) -> Tensor<'a> {
        let (ctx, i) = (self.ctx, il as i32);
        let g = self.cb(
            ctx.mul_mat(self.wl(il, "ffn_gate_inp_shexp.weight"), x),
            "ffn_shexp_gate_inp",
            i,
        ); // [1, nt]
           // llama.cpp computes the sigmoid as silu(g) / g.
        let gate = self.cb(ctx.div(ctx.silu(g), g), "ffn_shexp_gate", i);
        let ffn = self.swiglu_ffn(x, il, "_shexp");
        self.cb(ctx.mul(ffn, gate), "ffn_shexp_out", i)
    }
}
