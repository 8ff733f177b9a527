//! One graph file per architecture; [`build`] dispatches on `general.architecture`.
use crate::ggml::Tensor;
use crate::graph::GraphBuilder;

mod qwen3moe;

/// Architectures whose graph we can build.
pub const BUILT: &[&str] = &["qwen3moe"];

/// Builds the forward graph for `g.hp.arch`; returns the logits [n_vocab, n_tokens].
pub fn build<'a>(g: &GraphBuilder<'a>) -> Result<Tensor<'a>, String> {
    match g.hp.arch.as_str() {
        "qwen3moe" => Ok(qwen3moe::build(g)),
        other => Err(format!(
            "no graph for architecture {other:?} yet (built: {})",
            BUILT.join(", ")
        )),
    }
}
