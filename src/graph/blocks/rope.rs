//! RoPE parameters from the hyper-parameters, including RoPE scaling (linear, YaRN), derived the
//! way llama.cpp's `llama_context` derives its `cparams` (`rope_freq_scale`, `yarn_ext_factor`,
//! `yarn_attn_factor`, `n_ctx_orig_yarn`; `src/llama-context.cpp`) from the file's
//! `rope.scaling.*` keys. Without scaling keys every field is the identity (scale 1, no YaRN).
//!
//! Invariant: `attn_factor` here is what llama.cpp passes to `ggml_rope_ext`, i.e. already divided
//! by the `1 + 0.1 ln(factor)` that ggml's YaRN multiplies in again (llama.cpp PR 17945).
use crate::ggml::RopeParams;
use crate::graph::GraphBuilder;
use crate::model::hparams::RopeScaling;

/// `a * b + 1` rounded once, as llama.cpp's `a * b + 1.0f` compiles (GCC contracts it into an
/// FMA on x86-64 with FMA): the score scale then matches libllama's to the bit, which keeps
/// f16 rounding inside flash attention identical.
pub(crate) fn mul_add1(a: f32, b: f32) -> f32 {
    a.mul_add(b, 1.0)
}

/// YaRN's `0.1 * mscale * ln(scale) + 1` (1 for scale <= 1).
fn yarn_mscale(scale: f32, mscale: f32) -> f32 {
    if scale <= 1.0 {
        1.0
    } else {
        mul_add1(0.1 * mscale, scale.ln())
    }
}

impl<'a> GraphBuilder<'a> {
    /// `rope_yarn_log_mul` as llama.cpp's hparams hold it: where the architecture's rules say so
    /// (`Rules::yarn_mscale_all_dim`, deepseek2) the loader cancels the converter's factor 0.1
    /// (`[TAG_DEEPSEEK2_YARN_LOG_MUL_FIX]`), so it is `mscale_all_dim`.
    pub fn rope_yarn_log_mul(&self) -> f32 {
        if self.hp.arch.rules.yarn_mscale_all_dim {
            self.hp.rope_yarn_log_mul / 0.1
        } else {
            self.hp.rope_yarn_log_mul
        }
    }

    /// RoPE over `n_dims` rotary dims with the model's base and scaling, in `mode`.
    pub fn rope_params_scaled(&self, n_dims: u64, freq_base: f32, mode: i32) -> RopeParams {
        let hp = self.hp;
        let factor = hp.rope_scaling_factor;
        let freq_scale = if hp.rope_scaling == RopeScaling::None || factor == 0.0 {
            1.0
        } else {
            1.0 / factor
        };
        let yarn = hp.rope_scaling == RopeScaling::Yarn;
        let mut attn_factor = 1.0f32;
        if yarn {
            let scale = 1.0 / freq_scale;
            let log_mul = self.rope_yarn_log_mul();
            attn_factor = if log_mul != 0.0 {
                // llama.cpp assumes mscale = 1, except DeepSeek-V2 where mscale = mscale_all_dim.
                let mscale = if hp.arch.rules.yarn_mscale_all_dim && log_mul != 1.0 {
                    log_mul
                } else {
                    1.0
                };
                yarn_mscale(scale, mscale) / yarn_mscale(scale, log_mul)
            } else {
                yarn_mscale(scale, 1.0)
            };
            attn_factor *= 1.0 / mul_add1(0.1, scale.ln());
        }
        let n_ctx_orig = if hp.n_ctx_orig_yarn != 0 {
            hp.n_ctx_orig_yarn
        } else {
            hp.n_ctx_train
        };
        RopeParams {
            n_dims: n_dims as i32,
            mode,
            n_ctx_orig: n_ctx_orig as i32,
            freq_base,
            freq_scale,
            ext_factor: if yarn { 1.0 } else { 0.0 },
            attn_factor,
            beta_fast: 32.0,
            beta_slow: 1.0,
        }
    }
}
