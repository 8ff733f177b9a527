//! One graph file per architecture; [`build`] dispatches on `general.architecture`.
use crate::ggml::Tensor;
use crate::graph::GraphBuilder;
use crate::model::hparams::Gating;
use crate::model::Hparams;

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

/// Why a file of a built architecture still cannot run (a variant whose graph is not built),
/// checked at load time so the error names the file before anything is allocated.
pub fn unsupported(hp: &Hparams) -> Option<String> {
    match hp.arch.as_str() {
        // Legacy files (fused attn_kv_b) decompress K/V to every head: one KV head per q head.
        "deepseek2" if !hp.is_mla() && hp.n_head_kv != hp.n_head => Some(format!(
            "deepseek2.attention.head_count_kv = {}: a legacy file (fused attn_kv_b, no \
             deepseek2.attention.key_length_mla) needs one KV head per query head \
             (deepseek2.attention.head_count = {})",
            hp.n_head_kv, hp.n_head
        )),
        "deepseek2" if hp.attn_temp_scale != 0.0 => Some(
            "deepseek2: attention temperature tuning (attention.temperature_scale, Mistral-Large-3) \
             is not built"
                .into(),
        ),
        // libllama computes sqrt(softplus(logits)) for it; our router has no such gating yet.
        _ if hp.gating == Gating::SqrtSoftplus => Some(format!(
            "{}.expert_gating_func = {} (sqrt-softplus gating) is not built for {} (built: 1 \
             softmax, 2 sigmoid, 3 softmax over the selected experts)",
            hp.arch,
            Gating::SqrtSoftplus as u32,
            hp.arch
        )),
        _ => None,
    }
}

/// Builds the forward graph for `g.hp.arch`; returns the logits [n_vocab, n_tokens].
pub fn build<'a>(g: &GraphBuilder<'a>) -> Result<Tensor<'a>, String> {
    if let Some(msg) = unsupported(g.hp) {
        return Err(msg);
    }
    match g.hp.arch.as_str() {
        "qwen3moe" => Ok(qwen3moe::build(g)),
        "qwen2moe" => Ok(qwen2moe::build(g)),
        "llama" => Ok(mixtral::build(g)),
        "olmoe" => Ok(olmoe::build(g)),
        "glm4moe" => Ok(glm4moe::build(g)),
        "minimax-m2" => Ok(minimax_m2::build(g)),
        "gpt-oss" => Ok(gpt_oss::build(g)),
        "deepseek2" => Ok(deepseek2::build(g)),
        other => Err(format!(
            "no graph for architecture {other:?} yet (built: {})",
            BUILT.join(", ")
        )),
    }
}
