//! One graph file per architecture; [`build`] dispatches on `general.architecture`.
use crate::ggml::Tensor;
use crate::graph::GraphBuilder;

mod mixtral;
mod olmoe;
mod qwen2moe;
mod qwen3moe;

/// Architectures whose graph we can build.
pub const BUILT: &[&str] = &["qwen3moe", "qwen2moe", "llama", "olmoe"];

/// Builds the forward graph for `g.hp.arch`; returns the logits [n_vocab, n_tokens].
pub fn build<'a>(g: &GraphBuilder<'a>) -> Result<Tensor<'a>, String> {
    match g.hp.arch.as_str() {
        "qwen3moe" => Ok(qwen3moe::build(g)),
        "qwen2moe" => Ok(qwen2moe::build(g)),
        "llama" => Ok(mixtral::build(g)),
        "olmoe" => Ok(olmoe::build(g)),
        other => Err(format!(
            "no graph for architecture {other:?} yet (built: {})",
            BUILT.join(", ")
        )),
    }
}
