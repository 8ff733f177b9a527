//! Synth presets: the hyper-parameters of real MoE models (from their published configs), plus
//! a `tiny` preset per architecture (a few MB) for tests. Real vocabulary sizes throughout: the
//! output projection is a large part of decode cost.
use crate::model::hparams::{Gating, Hparams, RopeScaling};

/// Vocabulary size of the tiny presets.
pub const TINY_VOCAB: u64 = 1024;

/// A named model shape.
#[derive(Debug, Clone)]
pub struct Preset {
    pub name: &'static str,
    /// The real model it mirrors ("" for tiny).
    pub model: &'static str,
    pub hparams: Hparams,
}

/// Defaults shared by every preset; each preset overrides what its model changes.
fn moe(arch: &str) -> Hparams {
    Hparams {
        arch: arch.into(),
        n_ctx_train: 32768,
        rope_freq_base: 1e6,
        rms_eps: 1e-6,
        gating: Gating::Softmax,
        expert_weights_norm: true,
        ..Default::default()
    }
}

/// GQA attention sizes: heads, kv heads, head dim (rotary over the whole head).
fn attn(h: Hparams, n_head: u64, n_head_kv: u64, head_dim: u64) -> Hparams {
    Hparams {
        n_head,
        n_head_kv,
        head_dim_k: head_dim,
        head_dim_v: head_dim,
        n_rot: head_dim,
        ..h
    }
}

fn qwen3moe() -> Hparams {
    Hparams {
        n_vocab: 151936,
        n_ctx_train: 40960,
        n_expert: 128,
        n_expert_used: 8,
        ..moe("qwen3moe")
    }
}

fn qwen2moe() -> Hparams {
    Hparams {
        n_vocab: 151936,
        expert_weights_norm: false,
        ..moe("qwen2moe")
    }
}

fn gpt_oss() -> Hparams {
    let h = Hparams {
        n_vocab: 201088,
        n_embd: 2880,
        n_ff: 2880,
        n_ff_exp: 2880,
        n_expert_used: 4,
        n_ctx_train: 131072,
        sliding_window: 128,
        rope_freq_base: 150000.0,
        rms_eps: 1e-5,
        gating: Gating::SoftmaxWeight,
        ..moe("gpt-oss")
    };
    attn(h, 64, 8, 64)
}

/// DeepSeek-V2/V3 with MLA as llama.cpp's converter writes it: key/value_length describe the
/// absorbed (latent) heads (kv_lora + rope, kv_lora), key/value_length_mla the decompressed ones
/// (192 = 128 nope + 64 rope, 128). YaRN as in their configs: factor 40 over 4096 original
/// positions, `yarn_log_multiplier` = 0.1 * mscale_all_dim (1.0 in V3; V2-Lite overrides).
fn deepseek2(kv_lora: u64) -> Hparams {
    Hparams {
        rope_scaling: RopeScaling::Yarn,
        rope_scaling_factor: 40.0,
        n_ctx_orig_yarn: 4096,
        rope_yarn_log_mul: 0.1,
        n_head_kv: 1,
        head_dim_k: kv_lora + 64,
        head_dim_v: kv_lora,
        head_dim_k_mla: 192,
        head_dim_v_mla: 128,
        n_rot: 64,
        kv_lora_rank: kv_lora,
        rope_freq_base: 10000.0,
        n_ctx_train: 163840,
        ..moe("deepseek2")
    }
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

fn mixtral() -> Hparams {
    let h = Hparams {
        n_vocab: 32000,
        n_expert: 8,
        n_expert_used: 2,
        rms_eps: 1e-5,
        ..moe("llama")
    };
    attn(h, 32, 8, 128)
}

fn glm4moe() -> Hparams {
    let h = Hparams {
        n_vocab: 151552,
        n_expert_used: 8,
        n_expert_shared: 1,
        n_layer_dense_lead: 1,
        n_layer_nextn: 1,
        gating: Gating::Sigmoid,
        expert_weights_scale: 1.0,
        n_ctx_train: 131072,
        rms_eps: 1e-5,
        ..moe("glm4moe")
    };
    Hparams {
        n_rot: 64,
        ..attn(h, 96, 8, 128)
    }
}

fn minimax_m2() -> Hparams {
    let h = Hparams {
        n_vocab: 200064,
        n_embd: 3072,
        n_expert: 256,
        n_expert_used: 8,
        n_ff: 1536,
        n_ff_exp: 1536,
        gating: Gating::Sigmoid,
        n_ctx_train: 196608,
        rope_freq_base: 5e6,
        ..moe("minimax-m2")
    };
    Hparams {
        n_rot: 64,
        ..attn(h, 48, 8, 128)
    }
}

fn olmoe() -> Hparams {
    let h = Hparams {
        n_vocab: 50304,
        n_expert_used: 8,
        n_ctx_train: 4096,
        rope_freq_base: 10000.0,
        rms_eps: 1e-5,
        expert_weights_norm: false,
        ..moe("olmoe")
    };
    attn(h, 16, 16, 128)
}

/// Every preset, real shapes first (from the models' published configs).
pub fn all() -> Vec<Preset> {
    let p = |name, model, hparams| Preset {
        name,
        model,
        hparams,
    };
    let v = TINY_VOCAB;
    vec![
        p(
            "qwen3-30b-a3b",
            "Qwen3-30B-A3B",
            Hparams {
                n_embd: 2048,
                n_layer: 48,
                n_ff_exp: 768,
                ..attn(qwen3moe(), 32, 4, 128)
            },
        ),
        p(
            "qwen3-235b-a22b",
            "Qwen3-235B-A22B",
            Hparams {
                n_embd: 4096,
                n_layer: 94,
                n_ff_exp: 1536,
                ..attn(qwen3moe(), 64, 4, 128)
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
                ..attn(qwen2moe(), 16, 16, 128)
            },
        ),
        p(
            "gpt-oss-20b",
            "GPT-OSS-20B",
            Hparams {
                n_layer: 24,
                n_expert: 32,
                ..gpt_oss()
            },
        ),
        p(
            "gpt-oss-120b",
            "GPT-OSS-120B",
            Hparams {
                n_layer: 36,
                n_expert: 128,
                ..gpt_oss()
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
                ..deepseek2(512)
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
                ..sigmoid_groups(deepseek2(512), 8, 4)
            },
        ),
        p(
            "mixtral-8x7b",
            "Mixtral-8x7B",
            Hparams {
                n_embd: 4096,
                n_layer: 32,
                n_ff: 14336,
                ..mixtral()
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
                ..glm4moe()
            },
        ),
        p(
            "minimax-m2",
            "MiniMax-M2",
            Hparams {
                n_layer: 62,
                ..minimax_m2()
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
                ..olmoe()
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
                ..attn(qwen3moe(), 4, 2, 64)
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
                ..attn(qwen3moe(), 4, 1, 128)
            },
        ),
        // Tiny: same structure, a few MB; 256-multiple widths so every quant type applies.
        p(
            "tiny",
            "qwen3moe",
            Hparams {
                n_vocab: v,
                n_embd: 256,
                n_layer: 2,
                n_expert: 8,
                n_expert_used: 2,
                n_ff_exp: 256,
                ..attn(qwen3moe(), 4, 2, 128)
            },
        ),
        p(
            "tiny",
            "qwen2moe",
            Hparams {
                n_vocab: v,
                n_embd: 256,
                n_layer: 2,
                n_expert: 8,
                n_expert_used: 2,
                n_ff_exp: 256,
                n_ff: 512,
                n_ff_shexp: 512,
                ..attn(qwen2moe(), 4, 4, 64)
            },
        ),
        p(
            "tiny",
            "gpt-oss",
            Hparams {
                n_vocab: v,
                n_embd: 256,
                n_ff: 256,
                n_ff_exp: 256,
                n_layer: 2,
                n_expert: 8,
                n_ctx_train: 4096,
                sliding_window: 16,
                ..attn(gpt_oss(), 4, 2, 64)
            },
        ),
        p(
            "tiny",
            "deepseek2",
            Hparams {
                n_vocab: v,
                n_embd: 256,
                n_layer: 3,
                n_head: 4,
                q_lora_rank: 256,
                n_expert: 16,
                n_expert_used: 4,
                n_expert_shared: 1,
                n_ff_exp: 256,
                n_ff: 512,
                n_layer_dense_lead: 1,
                ..sigmoid_groups(deepseek2(512), 4, 2)
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
                ..deepseek2(512)
            },
        ),
        p(
            "tiny",
            "llama",
            Hparams {
                n_vocab: v,
                n_embd: 256,
                n_layer: 2,
                n_ff: 512,
                ..attn(mixtral(), 4, 2, 64)
            },
        ),
        p(
            "tiny",
            "glm4moe",
            Hparams {
                n_vocab: v,
                n_embd: 256,
                n_layer: 3,
                n_expert: 8,
                n_expert_used: 2,
                n_ff_exp: 256,
                n_ff: 512,
                n_rot: 64,
                ..attn(glm4moe(), 4, 2, 128)
            },
        ),
        p(
            "tiny",
            "minimax-m2",
            Hparams {
                n_vocab: v,
                n_embd: 256,
                n_layer: 2,
                n_expert: 8,
                n_expert_used: 2,
                n_ff: 256,
                n_ff_exp: 256,
                n_rot: 64,
                ..attn(minimax_m2(), 4, 2, 128)
            },
        ),
        p(
            "tiny",
            "olmoe",
            Hparams {
                n_vocab: v,
                n_embd: 256,
                n_layer: 2,
                n_expert: 8,
                n_expert_used: 2,
                n_ff: 256,
                n_ff_exp: 256,
                ..attn(olmoe(), 2, 2, 128)
            },
        ),
    ]
}

/// Finds a preset by name; `tiny` needs the architecture.
pub fn find(arch: &str, name: &str) -> Result<Preset, String> {
    let all = all();
    let hit = all.iter().find(|p| {
        p.name == name && (p.name != "tiny" || p.model == arch) && p.hparams.arch == arch
    });
    hit.cloned().ok_or_else(|| {
        let names: Vec<String> = all
            .iter()
            .filter(|p| p.hparams.arch == arch)
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
        if !out.contains(&p.hparams.arch) {
            out.push(p.hparams.arch.clone());
        }
    }
    out
}

/// GGUF architecture names of models often called otherwise (Hugging Face `model_type`s and
/// family names): Mixtral is `llama` in GGUF.
const ARCH_HINTS: &[(&str, &str)] = &[
    ("mixtral", "llama"),
    ("qwen3_moe", "qwen3moe"),
    ("qwen3-moe", "qwen3moe"),
    ("qwen2_moe", "qwen2moe"),
    ("qwen2-moe", "qwen2moe"),
    ("gpt_oss", "gpt-oss"),
    ("gptoss", "gpt-oss"),
    ("deepseek_v2", "deepseek2"),
    ("deepseek-v2", "deepseek2"),
    ("deepseek_v3", "deepseek2"),
    ("deepseek-v3", "deepseek2"),
    ("deepseek3", "deepseek2"),
    ("kimi_k2", "deepseek2"),
    ("kimi-k2", "deepseek2"),
    ("glm4_moe", "glm4moe"),
    ("glm4-moe", "glm4moe"),
    ("minimax", "minimax-m2"),
    ("minimax_m2", "minimax-m2"),
];

/// The error for an architecture without presets: the supported list, and the GGUF name when
/// `arch` is another name of one.
fn unknown_arch(arch: &str) -> String {
    let supported = archs();
    let lower = arch.to_ascii_lowercase();
    let hint = ARCH_HINTS
        .iter()
        .find(|(alias, _)| *alias == lower)
        .map(|&(_, gguf)| gguf.to_string())
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
