//! RMSNorm with a learned scale (llama.cpp `build_norm(..., LLM_NORM_RMS, il)`).
use crate::ggml::Tensor;
use crate::graph::GraphBuilder;

impl<'a> GraphBuilder<'a> {
    /// `rms_norm(x) * w` over ne0; `x` [n, ...], `w` [n].
    pub fn rms_norm(&self, x: Tensor<'a>, w: Tensor<'a>, name: &str, il: i32) -> Tensor<'a> {
        let n = self.ctx.rms_norm(x, self.hp.rms_eps);
        self.cb(self.ctx.mul(n, w), name, il)
    }
}
