//! Synth presets: the hyper-parameters of real MoE models (from their published configs), plus
//! the `tiny` preset of each architecture (a few MB, `crate::arch`) for tests. Real vocabulary sizes throughout: the
//! output projection is a large part of decode cost.
use crate::arch::{
    deepseek2, deepseek4, glm4moe, gpt_oss, llama, minimax_m2, olmoe, qwen2moe, qwen3moe,
    with_heads,
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
        p("deepseek-v3", "DeepSeek-V3 (671B)", {
            let mut hp = Hparams {
                n_vocab: 129280,
                n_embd: 7168,
                n_layer: 61,
                n_head: 128,
                n_expert: 256,
                n_expert_used: 8,
                n_expert_shared: 1,
                n_ff_exp: 2048,
                n_ff: 18432,
                n_layer_dense_lead: 3,
                ..sigmoid_groups(deepseek2::family(512), 8, 4)
            };
            hp.mla.q_lora_rank = 1536;
            hp
        }),
        // DeepSeek-V4-Flash (284B total, 13B active), from its config.json,
        // https://huggingface.co/deepseek-ai/DeepSeek-V4-Flash/blob/main/config.json (read from
        // copies of it in public code; the model card's architecture notes agree): hidden_size
        // 4096, num_hidden_layers 43, num_attention_heads 64, num_key_value_heads 1, head_dim 512,
        // qk_rope_head_dim 64, q_lora_rank 1024, o_groups 8, o_lora_rank 1024, n_routed_experts
        // 256, n_shared_experts 1, num_experts_per_tok 6, moe_intermediate_size 2048,
        // index_n_heads 64, index_head_dim 128, index_topk 512, sliding_window 128,
        // compress_ratios [0, 0, then 4 and 128 alternating, 4, 0] (44 entries: blocks 0-1 none,
        // even blocks 2-42 ratio 4, odd blocks 3-41 ratio 128, then the MTP block), num_hash_layers
        // 3, hc_mult 4, hc_sinkhorn_iters 20, hc_eps 1e-6, scoring_func sqrtsoftplus,
        // routed_scaling_factor 1.5, norm_topk_prob true, swiglu_limit 10, rms_norm_eps 1e-6,
        // vocab_size 129280, max_position_embeddings 1048576, rope_theta 10000,
        // compress_rope_theta 160000, rope_scaling yarn (factor 16, original 65536) (`family`).
        // Chosen here: the MTP block (num_nextn_predict_layers 1) is left out, as deepseek-v3's
        // preset leaves its own (decode does not run it; llama.cpp skips it unless asked), so the
        // file has 43 blocks and the first 43 ratios; no rope.scaling.yarn_log_multiplier (the
        // config has no mscale, and libllama's deepseek4 graph computes its own YaRN factor).
        p(
            "deepseek-v4-flash",
            "DeepSeek-V4-Flash (284B)",
            deepseek4::with_blocks(
                {
                    let mut hp = Hparams {
                        n_vocab: 129280,
                        n_ctx_train: 1 << 20,
                        n_ctx_orig_yarn: 65536,
                        n_embd: 4096,
                        n_layer: 43,
                        n_rot: 64,
                        n_expert: 256,
                        n_expert_used: 6,
                        n_ff_exp: 2048,
                        ..with_heads(deepseek4::family(), 64, 1, 512)
                    };
                    hp.mla.q_lora_rank = 1024;
                    hp.swa.window = 128;
                    hp.indexer.n_head = 64;
                    hp.indexer.head_dim = 128;
                    hp.indexer.top_k = 512;
                    hp.dsv4.o_group_count = 8;
                    hp.dsv4.o_lora_rank = 1024;
                    hp.dsv4.hash_layer_count = 3;
                    hp
                },
                [0, 0]
                    .into_iter()
                    .chain((2..43).map(|il| if il % 2 == 0 { 4 } else { 128 }))
                    .collect(),
            ),
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
            {
                let mut hp = Hparams {
                    n_vocab: v,
                    n_embd: 256,
                    n_layer: 3,
                    n_head: 4,
                    n_head_kv: 4,
                    head_dim_k: 192,
                    head_dim_v: 128,
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
                };
                hp.mla.head_dim_k = 0;
                hp.mla.head_dim_v = 0;
                hp.mla.q_lora_rank = 256;
                hp
            },
        ),
    ];
    // Tiny: same structure as each architecture's real models, a few MB (`Synth::tiny`); also
    // of an architecture without a graph yet (deepseek4: libllama runs it, the engine refuses).
    for arch in crate::arch::ARCHS {
        if let Some(tiny) = arch.synth.tiny {
            all.push(p("tiny", arch.spec.name, tiny()));
        }
    }
    all
}

/// Finds a preset by name; `tiny` needs the architecture.
/// `name` may end in `:N`: the preset's first `N` blocks only (a shallower model of the same
/// shape per block, for a machine without room for the whole file).
pub fn find(arch: &str, name: &str) -> Result<Preset, String> {
    if let Some((base, n)) = name.rsplit_once(':') {
        let mut p = find(arch, base)?;
        let h = &mut p.hparams;
        let n: usize = n
            .parse()
            .ok()
            .filter(|&n| (1..=h.n_layer).contains(&n))
            .ok_or_else(|| {
                format!(
                    "preset {name:?}: the block count after ':' must be 1..={}",
                    h.n_layer
                )
            })?;
        h.n_layer = n;
        h.swa.layers.truncate(n);
        h.dsv4.compress_ratios.truncate(n);
        h.n_layer_dense_lead = h.n_layer_dense_lead.min(n);
        h.dsv4.hash_layer_count = h.dsv4.hash_layer_count.min(n);
        return Ok(p);
    }
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
