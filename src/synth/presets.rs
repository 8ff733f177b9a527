//! Synth presets: the hyper-parameters of real MoE models (from their published configs), plus
//! the `tiny` preset of each architecture (a few MB, `crate::arch`) for tests. Real vocabulary sizes throughout: the
//! output projection is a large part of decode cost.
use crate::arch::{
    deepseek2, glm4moe, gpt_oss, llama, minimax_m2, olmoe, qwen2moe, qwen3moe, with_heads,
};
use crate::model::hparams::{Gating, Hparams};

pub use crate::arch::TINY_VOCAB;

/// A named model shape.
#[derive(Debug, Clone)]
pub struct Preset {
    pub name: &'static str,
    /// The real model it mirrors ("" for tiny).
    pub model: &'static str,
    pub hparams: Hparams,
}

/// V3-style routing: sigmoid gating, group-limited top-k, scaled weights.
fn sigmoid_groups(h: Hparams, groups: u64, used: u64) -> Hparams {
    Hparams {
        gating: Gating::Sigmoid,
        n_expert_groups: groups,
        n_group_used: used,
        expert_weights_scale: 2.5,
        ..h
    }
}

/// Every preset, real shapes first (from the models' published configs).
pub fn all() -> Vec<Preset> {
    let p = |name, model, hparams| Preset {
        name,
        model,
        hparams,
    };
    let v = TINY_VOCAB;
    let mut all = vec![
        p(
            "qwen3-30b-a3b",
            "Qwen3-30B-A3B",
            Hparams {
                n_embd: 2048,
                n_layer: 48,
                n_ff_exp: 768,
                ..with_heads(qwen3moe::family(), 32, 4, 128)
            },
        ),
        p(
            "qwen3-235b-a22b",
            "Qwen3-235B-A22B",
            Hparams {
                n_embd: 4096,
                n_layer: 94,
                n_ff_exp: 1536,
                ..with_heads(qwen3moe::family(), 64, 4, 128)
            },
        ),
        p(
            "qwen1.5-moe-a2.7b",
            "Qwen1.5-MoE-A2.7B",
            Hparams {
                n_embd: 2048,
                n_layer: 24,
                n_expert: 60,
                n_expert_used: 4,
                n_ff_exp: 1408,
                n_ff: 5632,
                n_ff_shexp: 5632,
                ..with_heads(qwen2moe::family(), 16, 16, 128)
            },
        ),
        p(
            "gpt-oss-20b",
            "GPT-OSS-20B",
            Hparams {
                n_layer: 24,
                n_expert: 32,
                ..gpt_oss::family()
            },
        ),
        p(
            "gpt-oss-120b",
            "GPT-OSS-120B",
            Hparams {
                n_layer: 36,
                n_expert: 128,
                ..gpt_oss::family()
            },
        ),
        p(
            "deepseek-v2-lite",
            "DeepSeek-V2-Lite",
            Hparams {
                n_vocab: 102400,
                n_embd: 2048,
                n_layer: 27,
                n_head: 16,
                n_expert: 64,
                n_expert_used: 6,
                n_expert_shared: 2,
                n_ff_exp: 1408,
                n_ff: 10944,
                n_layer_dense_lead: 1,
                expert_weights_norm: false,
                expert_weights_scale: 1.0,
                rope_yarn_log_mul: 0.0707,
                ..deepseek2::family(512)
            },
        ),
        p(
            "deepseek-v3",
            "DeepSeek-V3 (671B)",
            Hparams {
                n_vocab: 129280,
                n_embd: 7168,
                n_layer: 61,
                n_head: 128,
                q_lora_rank: 1536,
                n_expert: 256,
                n_expert_used: 8,
                n_expert_shared: 1,
                n_ff_exp: 2048,
                n_ff: 18432,
                n_layer_dense_lead: 3,
                ..sigmoid_groups(deepseek2::family(512), 8, 4)
            },
        ),
        p(
            "mixtral-8x7b",
            "Mixtral-8x7B",
            Hparams {
                n_embd: 4096,
                n_layer: 32,
                n_ff: 14336,
                ..llama::family()
            },
        ),
        p(
            "glm-4.5-air",
            "GLM-4.5-Air",
            Hparams {
                n_embd: 4096,
                n_layer: 47,
                n_expert: 128,
                n_ff_exp: 1408,
                n_ff: 10944,
                ..glm4moe::family()
            },
        ),
        p(
            "minimax-m2",
            "MiniMax-M2",
            Hparams {
                n_layer: 62,
                ..minimax_m2::family()
            },
        ),
        p(
            "olmoe-1b-7b",
            "OLMoE-1B-7B",
            Hparams {
                n_embd: 2048,
                n_layer: 16,
                n_expert: 64,
                n_ff: 1024,
                n_ff_exp: 1024,
                ..olmoe::family()
            },
        ),
        // Deep but narrow (~20 MB): 24 blocks, for tests of what depth does to routing.
        p(
            "deep-tiny",
            "qwen3moe-deep-tiny",
            Hparams {
                n_vocab: v,
                n_embd: 256,
                n_layer: 24,
                n_expert: 32,
                n_expert_used: 4,
                n_ff_exp: 128,
                ..with_heads(qwen3moe::family(), 4, 2, 64)
            },
        ),
        // Qwen3-30B-A3B's routing shape (128 experts, top-8, head dim 128, RoPE base 1e6) at
        // tiny width (~25 MB): the synthetic routing is calibrated on it (tests/synth_routing).
        p(
            "routing-tiny",
            "qwen3moe-routing-tiny",
            Hparams {
                n_vocab: v,
                n_embd: 256,
                n_layer: 8,
                n_ff_exp: 64,
                ..with_heads(qwen3moe::family(), 4, 1, 128)
            },
        ),
        p(
            // A legacy-layout file (fused attn_kv_b, no key_length_mla: per-head K/V decompressed,
            // ordinary MHA) with V2-style routing: softmax, no groups, no renormalisation.
            "tiny-kvb",
            "deepseek2",
            Hparams {
                n_vocab: v,
                n_embd: 256,
                n_layer: 3,
                n_head: 4,
                n_head_kv: 4,
                head_dim_k: 192,
                head_dim_v: 128,
                head_dim_k_mla: 0,
                head_dim_v_mla: 0,
                q_lora_rank: 256,
                n_expert: 16,
                n_expert_used: 4,
                n_expert_shared: 2,
                n_ff_exp: 256,
                n_ff: 512,
                n_layer_dense_lead: 1,
                expert_weights_norm: false,
                expert_weights_scale: 1.0,
                rope_yarn_log_mul: 0.0707,
                ..deepseek2::family(512)
            },
        ),
    ];
    // Tiny: same structure as each architecture's real models, a few MB (`Synth::tiny`).
    for arch in crate::arch::built() {
        if let Some(tiny) = arch.synth.tiny {
            all.push(p("tiny", arch.spec.name, tiny()));
        }
    }
    all
}

/// Finds a preset by name; `tiny` needs the architecture.
pub fn find(arch: &str, name: &str) -> Result<Preset, String> {
    let all = all();
    let hit = all.iter().find(|p| {
        p.name == name && (p.name != "tiny" || p.model == arch) && p.hparams.arch.name == arch
    });
    hit.cloned().ok_or_else(|| {
        let names: Vec<String> = all
            .iter()
            .filter(|p| p.hparams.arch.name == arch)
            .map(|p| p.name.to_string())
            .collect();
        if names.is_empty() {
            return unknown_arch(arch);
        }
        format!(
            "no preset {name:?} for architecture {arch:?} (available: {})",
            names.join(", ")
        )
    })
}

/// The architectures (GGUF names) that have presets, in the order of [`all`].
pub fn archs() -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for p in all() {
        let name = p.hparams.arch.name;
        if !out.iter().any(|a| a == name) {
            out.push(name.to_string());
        }
    }
    out
}

/// The error for an architecture without presets: the supported list, and the GGUF name when
/// `arch` is another name of one.
fn unknown_arch(arch: &str) -> String {
    let supported = archs();
    let lower = arch.to_ascii_lowercase();
    // GGUF names of models often called otherwise (Hugging Face `model_type`s and family
    // names, `Synth::aliases`): Mixtral is `llama` in GGUF.
    let hint = crate::arch::ARCHS
        .iter()
        .find(|a| a.synth.aliases.contains(&lower.as_str()))
        .map(|a| a.spec.name.to_string())
        .or_else(|| supported.iter().find(|a| **a == lower).cloned());
    let mut msg = format!(
        "unknown architecture {arch:?}: supported (GGUF names) are {}",
        supported.join(", ")
    );
    match hint {
        Some(h) => msg.push_str(&format!("; {arch} -> {h}: use --arch {h}")),
        None => msg.push_str("; mixtral -> llama (Mixtral is `llama` in GGUF)"),
    }
    msg
}
