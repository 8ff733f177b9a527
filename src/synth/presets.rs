//! Synth presets: the hyper-parameters of real MoE models (from their published configs), plus
//! a `tiny` preset per architecture (a few MB) for tests. Real vocabulary sizes throughout: the
//! output projection is a large part of decode cost.
use crate::model::hparams::{Gating, Hparams};

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

#[allow(clippy::too_many_arguments)]
fn base(
    arch: &str,
    n_vocab: u64,
    n_embd: u64,
    n_layer: usize,
    n_head: u64,
    n_head_kv: u64,
    head_dim: u64,
    n_expert: u64,
    n_used: u64,
    n_ff_exp: u64,
) -> Hparams {
    Hparams {
        arch: arch.into(),
        n_vocab,
        n_ctx_train: 32768,
        n_embd,
        n_layer,
        n_head,
        n_head_kv,
        head_dim_k: head_dim,
        head_dim_v: head_dim,
        n_expert,
        n_expert_used: n_used,
        n_ff_exp,
        rope_freq_base: 1e6,
        n_rot: head_dim,
        rms_eps: 1e-6,
        gating: Gating::Softmax,
        expert_weights_norm: true,
        ..Default::default()
    }
}

fn qwen3moe(
    n_vocab: u64,
    n_embd: u64,
    n_layer: usize,
    n_head: u64,
    n_head_kv: u64,
    n_expert: u64,
    n_used: u64,
    n_ff_exp: u64,
) -> Hparams {
    Hparams {
        n_ctx_train: 40960,
        ..base(
            "qwen3moe", n_vocab, n_embd, n_layer, n_head, n_head_kv, 128, n_expert, n_used,
            n_ff_exp,
        )
    }
}

fn qwen2moe(
    n_vocab: u64,
    n_embd: u64,
    n_layer: usize,
    n_head: u64,
    n_expert: u64,
    n_used: u64,
    n_ff_exp: u64,
    n_ff_shexp: u64,
) -> Hparams {
    let head = n_embd / n_head;
    Hparams {
        n_ff_shexp,
        n_ff: n_ff_shexp,
        expert_weights_norm: false,
        ..base(
            "qwen2moe", n_vocab, n_embd, n_layer, n_head, n_head, head, n_expert, n_used, n_ff_exp,
        )
    }
}

fn gpt_oss(n_layer: usize, n_embd: u64, n_expert: u64) -> Hparams {
    Hparams {
        n_ctx_train: 131072,
        sliding_window: 128,
        rope_freq_base: 150000.0,
        rms_eps: 1e-5,
        gating: Gating::SoftmaxWeight,
        n_ff: n_embd,
        ..base(
            "gpt-oss", 201088, n_embd, n_layer, 64, 8, 64, n_expert, 4, n_embd,
        )
    }
}

#[allow(clippy::too_many_arguments)]
fn deepseek2(
    n_vocab: u64,
    n_embd: u64,
    n_layer: usize,
    n_head: u64,
    q_lora: u64,
    n_expert: u64,
    n_used: u64,
    n_shared: u64,
    n_ff_exp: u64,
    n_ff: u64,
    dense_lead: usize,
    sigmoid_groups: Option<(u64, u64)>,
) -> Hparams {
    // MLA as llama.cpp's converter writes it: key/value_length describe the absorbed (latent)
    // heads, key/value_length_mla the decompressed ones (192 = 128 nope + 64 rope, 128).
    let mut h = base(
        "deepseek2",
        n_vocab,
        n_embd,
        n_layer,
        n_head,
        1,
        512 + 64,
        n_expert,
        n_used,
        n_ff_exp,
    );
    h.head_dim_v = 512;
    h.head_dim_k_mla = 192;
    h.head_dim_v_mla = 128;
    h.n_rot = 64;
    h.q_lora_rank = q_lora;
    h.kv_lora_rank = 512;
    h.n_expert_shared = n_shared;
    h.n_ff = n_ff;
    h.n_layer_dense_lead = dense_lead;
    h.rope_freq_base = 10000.0;
    h.n_ctx_train = 163840;
    if let Some((groups, used)) = sigmoid_groups {
        h.gating = Gating::Sigmoid;
        h.n_expert_groups = groups;
        h.n_group_used = used;
        h.expert_weights_scale = 2.5;
    } else {
        h.expert_weights_norm = false;
        h.expert_weights_scale = 1.0;
    }
    h
}

fn mixtral(n_layer: usize, n_embd: u64, n_ff: u64) -> Hparams {
    Hparams {
        n_ff,
        n_ff_exp: 0,
        rope_freq_base: 1e6,
        rms_eps: 1e-5,
        ..base("llama", 32000, n_embd, n_layer, 32, 8, n_embd / 32, 8, 2, 0)
    }
}

fn glm4moe(
    n_layer: usize,
    n_embd: u64,
    n_head: u64,
    n_expert: u64,
    n_ff_exp: u64,
    n_ff: u64,
) -> Hparams {
    Hparams {
        n_ff,
        n_expert_shared: 1,
        n_layer_dense_lead: 1,
        n_layer_nextn: 1,
        n_rot: 64,
        gating: Gating::Sigmoid,
        expert_weights_scale: 1.0,
        n_ctx_train: 131072,
        rms_eps: 1e-5,
        ..base(
            "glm4moe", 151552, n_embd, n_layer, n_head, 8, 128, n_expert, 8, n_ff_exp,
        )
    }
}

fn minimax_m2(n_layer: usize) -> Hparams {
    Hparams {
        n_rot: 64,
        gating: Gating::Sigmoid,
        n_ctx_train: 196608,
        rope_freq_base: 5e6,
        n_ff: 1536,
        ..base(
            "minimax-m2",
            200064,
            3072,
            n_layer,
            48,
            8,
            128,
            256,
            8,
            1536,
        )
    }
}

fn olmoe(n_layer: usize, n_embd: u64, n_expert: u64) -> Hparams {
    Hparams {
        n_ff: 1024,
        n_ctx_train: 4096,
        rope_freq_base: 10000.0,
        rms_eps: 1e-5,
        expert_weights_norm: false,
        ..base(
            "olmoe", 50304, n_embd, n_layer, 16, 16, 128, n_expert, 8, 1024,
        )
    }
}

/// Every preset, real shapes first. `tiny` presets use the arch name as their model.
pub fn all() -> Vec<Preset> {
    let p = |name, model, hparams| Preset {
        name,
        model,
        hparams,
    };
    let mut v = vec![
        p(
            "qwen3-30b-a3b",
            "Qwen3-30B-A3B",
            qwen3moe(151936, 2048, 48, 32, 4, 128, 8, 768),
        ),
        p(
            "qwen3-235b-a22b",
            "Qwen3-235B-A22B",
            qwen3moe(151936, 4096, 94, 64, 4, 128, 8, 1536),
        ),
        p(
            "qwen1.5-moe-a2.7b",
            "Qwen1.5-MoE-A2.7B",
            qwen2moe(151936, 2048, 24, 16, 60, 4, 1408, 5632),
        ),
        p("gpt-oss-20b", "GPT-OSS-20B", gpt_oss(24, 2880, 32)),
        p("gpt-oss-120b", "GPT-OSS-120B", gpt_oss(36, 2880, 128)),
        p(
            "deepseek-v2-lite",
            "DeepSeek-V2-Lite",
            deepseek2(102400, 2048, 27, 16, 0, 64, 6, 2, 1408, 10944, 1, None),
        ),
        p(
            "deepseek-v3",
            "DeepSeek-V3 (671B)",
            deepseek2(
                129280,
                7168,
                61,
                128,
                1536,
                256,
                8,
                1,
                2048,
                18432,
                3,
                Some((8, 4)),
            ),
        ),
        p("mixtral-8x7b", "Mixtral-8x7B", mixtral(32, 4096, 14336)),
        p(
            "glm-4.5-air",
            "GLM-4.5-Air",
            glm4moe(47, 4096, 96, 128, 1408, 10944),
        ),
        p("minimax-m2", "MiniMax-M2", minimax_m2(62)),
        p("olmoe-1b-7b", "OLMoE-1B-7B", olmoe(16, 2048, 64)),
    ];
    // Tiny: same structure, a few MB; 256-multiple widths so every quant type applies.
    const V: u64 = TINY_VOCAB;
    v.extend([
        p("tiny", "qwen3moe", qwen3moe(V, 256, 2, 4, 2, 8, 2, 256)),
        p("tiny", "qwen2moe", qwen2moe(V, 256, 2, 4, 8, 2, 256, 512)),
        p(
            "tiny",
            "gpt-oss",
            Hparams {
                n_vocab: V,
                n_head: 4,
                n_head_kv: 2,
                n_ctx_train: 4096,
                sliding_window: 16,
                ..gpt_oss(2, 256, 8)
            },
        ),
        p(
            "tiny",
            "deepseek2",
            Hparams {
                kv_lora_rank: 256,
                head_dim_k: 256 + 64,
                head_dim_v: 256,
                ..deepseek2(V, 256, 3, 4, 256, 8, 2, 1, 256, 512, 1, Some((2, 1)))
            },
        ),
        p(
            "tiny",
            "llama",
            Hparams {
                n_vocab: V,
                ..mixtral(2, 256, 512)
            },
        ),
        p(
            "tiny",
            "glm4moe",
            Hparams {
                n_vocab: V,
                n_head: 4,
                n_head_kv: 2,
                ..glm4moe(3, 256, 4, 8, 256, 512)
            },
        ),
        p(
            "tiny",
            "minimax-m2",
            Hparams {
                n_vocab: V,
                n_embd: 256,
                n_head: 4,
                n_head_kv: 2,
                n_expert: 8,
                n_expert_used: 2,
                n_ff_exp: 256,
                n_ff: 256,
                ..minimax_m2(2)
            },
        ),
        p(
            "tiny",
            "olmoe",
            Hparams {
                n_vocab: V,
                n_head: 2,
                n_head_kv: 2,
                n_ff: 256,
                n_ff_exp: 256,
                n_expert_used: 2,
                ..olmoe(2, 256, 8)
            },
        ),
    ]);
    v
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
        format!(
            "no preset {name:?} for architecture {arch:?} (available: {})",
            names.join(", ")
        )
    })
}
