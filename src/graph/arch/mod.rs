//! One graph file per architecture; [`build`] dispatches on `general.architecture`.
use crate::ggml::Tensor;
use crate::graph::GraphBuilder;

mod deepseek2;
mod glm4moe;
mod gpt_oss;
mod minimax_m2;
mod mixtral;
mod olmoe;
mod qwen2moe;
mod qwen3moe;

/// Architectures whose graph we can build.
pub const BUILT: &[&str] = &[
    "qwen3moe",
    "qwen2moe",
    "llama",
    "olmoe",
    "glm4moe",
    "minimax-m2",
    "gpt-oss",
    "deepseek2",
];

/// Whether [`build`] handles `arch`.
pub fn is_built(arch: &str) -> bool {
    BUILT.contains(&arch)
}

/// Builds the forward graph for `g.hp.arch`; returns the logits [n_vocab, n_tokens].
pub fn build<'a>(g: &GraphBuilder<'a>) -> Result<Tensor<'a>, String> {
    match g.hp.arch.as_str() {
        "qwen3moe" => Ok(qwen3moe::build(g)),
        "qwen2moe" => Ok(qwen2moe::build(g)),
        "llama" => Ok(mixtral::build(g)),
        "olmoe" => Ok(olmoe::build(g)),
        "glm4moe" => Ok(glm4moe::build(g)),
        "minimax-m2" => Ok(minimax_m2::build(g)),
        "gpt-oss" => Ok(gpt_oss::build(g)),
        "deepseek2" if !g.hp.is_mla() => Err(
            "deepseek2: legacy files with a fused attn_kv_b (no key_length_mla) are not built; \
             re-convert with a current llama.cpp converter"
                .into(),
        ),
        "deepseek2" => Ok(deepseek2::build(g)),
        other => Err(format!(
            "no graph for architecture {other:?} yet (built: {})",
            BUILT.join(", ")
        )),
    }
}
