//! Dense SwiGLU FFN (llama.cpp `build_ffn(..., LLM_FFN_SILU, LLM_FFN_PAR)`): `down(silu(gate·x) *
//! up·x)`, used by dense blocks and shared experts; and a block's FFN as its weights make it.
use crate::ggml::Tensor;
use crate::graph::blocks::MoeOpts;
use crate::graph::layers::{Ffn, Shared, Swiglu};
use crate::graph::GraphBuilder;

impl<'a> GraphBuilder<'a> {
    /// Block `il`'s FFN on `x` [n_embd, n_tokens]: the dense SwiGLU FFN, or the routed experts
    /// (`opts`) plus the shared experts where the block has them.
    pub fn ffn(&self, x: Tensor<'a>, il: usize, opts: &MoeOpts) -> Tensor<'a> {
        match &self.blk(il).ffn {
            Ffn::Dense(w) => self.swiglu_ffn(x, il, w, "ffn_out"),
            Ffn::Moe(m) => {
                let routed = self.moe(x, il, opts);
                match &m.shared {
                    None => routed,
                    Some(s) => {
                        let shared = self.shared_experts(x, il, s, 0.0);
                        self.add(routed, shared, "ffn_out", il as i32)
                    }
                }
            }
        }
    }

    /// SwiGLU FFN of block `il` with weights `w` on `x` [n_embd, n_tokens], its output named
    /// `name` (libllama's: a dense block's output is `ffn_out`; a shared expert's is
    /// `ffn_shexp`, the block's `ffn_out` then being the sum with the routed experts).
    pub fn swiglu_ffn(&self, x: Tensor<'a>, il: usize, w: &Swiglu, name: &str) -> Tensor<'a> {
        self.swiglu_ffn_clamped(x, il, w, name, 0.0)
    }

    /// [`Self::swiglu_ffn`] with DeepSeek-V4's clamp `silu(min(gate, l)) * clamp(up, -l, l)`
    /// (`limit` <= 1e-6: none, as llama.cpp).
    pub fn swiglu_ffn_clamped(
        &self,
        x: Tensor<'a>,
        il: usize,
        w: &Swiglu,
        name: &str,
        limit: f32,
    ) -> Tensor<'a> {
        let (ctx, i) = (self.ctx, il as i32);
        let up = ctx.mul_mat(self.t(w.up), x); // [n_ff, nt]
        let gate = ctx.mul_mat(self.t(w.gate), x); // [n_ff, nt]
        let act = if limit > 1e-6 {
            self.cb(ctx.swiglu_clamp(gate, up, limit), "ffn_swiglu_limited", i)
        } else {
            self.cb(ctx.swiglu_split(gate, up), "ffn_swiglu", i)
        };
        self.cb(ctx.mul_mat(self.t(w.down), act), name, i) // [n_embd, nt]
    }

    /// Block `il`'s shared experts `s` on `x` (SwiGLU-clamped at `limit`, see
    /// [`Self::swiglu_ffn_clamped`]); Qwen2-MoE's (with `gate_inp`) gated per token by
    /// `sigmoid(gate_inp·x)`.
    pub fn shared_experts(&self, x: Tensor<'a>, il: usize, s: &Shared, limit: f32) -> Tensor<'a> {
        let Some(gate_inp) = s.gate_inp else {
            return self.swiglu_ffn_clamped(x, il, &s.ffn, "ffn_shexp", limit);
        };
        let (ctx, i) = (self.ctx, il as i32);
        let g = self.cb(ctx.mul_mat(self.t(gate_inp), x), "ffn_shexp_gate_inp", i); // [1, nt]
                                                                                    // llama.cpp computes the sigmoid as silu(g) / g.
        let gate = self.cb(ctx.div(ctx.silu(g), g), "ffn_shexp_gate", i);
        let ffn = self.swiglu_ffn_clamped(x, il, &s.ffn, "ffn_shexp", limit);
        self.cb(ctx.mul(ffn, gate), "ffn_shexp_out", i)
    }
}
