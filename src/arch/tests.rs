//! Structural tests of every architecture table: per-block name uniqueness, the routed-expert
//! triple of MoE blocks, dense blocks without experts, non-zero shapes, names of the forms
//! llama.cpp's `LLM_TENSOR_NAMES` uses, and spot checks of real-model shapes and of the
//! arch-specific rules in `Hparams::from_meta`.
use std::collections::{HashMap, HashSet};

use super::ARCHS;
use crate::gguf::{GgufArray, GgufValue, Metadata};
use crate::model::hparams::{Gating, Hparams};
use crate::model::{ArchSpec, Layers, Role};

/// Global tensor stems (llama.cpp `LLM_TENSOR_NAMES` entries without a block index).
#[rustfmt::skip]
const GLOBAL_STEMS: &[&str] = &["token_embd", "output_norm", "output", "rope_freqs", "output_hc_fn", "output_hc_base", "output_hc_scale"];

/// Per-block stems (the part after `blk.%d.` of llama.cpp `LLM_TENSOR_NAMES` entries).
#[rustfmt::skip]
const BLOCK_STEMS: &[&str] = &[
    "attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "attn_q_norm", "attn_k_norm", "post_attention_norm", "attn_sinks",
    "attn_q_a", "attn_q_a_norm", "attn_q_b", "attn_kv_a_mqa", "attn_kv_a_norm", "attn_kv_b", "attn_k_b", "attn_v_b", "attn_kv",
    "attn_output_a", "attn_output_b", "attn_compressor_kv", "attn_compressor_gate", "attn_compressor_ape", "attn_compressor_norm",
    "indexer.proj", "indexer.attn_q_b", "indexer.attn_k", "indexer.k_norm", "indexer_compressor_kv", "indexer_compressor_gate", "indexer_compressor_ape",
    "indexer_compressor_norm", "hc_attn_fn", "hc_attn_base", "hc_attn_scale", "hc_ffn_fn", "hc_ffn_base", "hc_ffn_scale", "ffn_norm",
    "ffn_gate", "ffn_down", "ffn_up", "ffn_gate_inp", "exp_probs_b", "exp_probs_b_vl", "ffn_gate_tid2eid", "ffn_gate_exps",
    "ffn_down_exps", "ffn_up_exps", "ffn_gate_shexp", "ffn_down_shexp", "ffn_up_shexp", "ffn_gate_inp_shexp", "nextn.eh_proj",
    "nextn.enorm", "nextn.hnorm", "nextn.embed_tokens", "nextn.shared_head_head", "nextn.shared_head_norm",
];

fn base(arch: &str) -> Hparams {
    Hparams {
        arch: spec(arch),
        n_vocab: 1000,
        n_ctx_train: 4096,
        n_embd: 256,
        n_layer: 4,
        n_head: 4,
        n_head_kv: 2,
        head_dim_k: 64,
        head_dim_v: 64,
        n_ff: 512,
        n_ff_exp: 128,
        n_expert: 8,
        n_expert_used: 2,
        rope_freq_base: 10000.0,
        n_rot: 64,
        rms_eps: 1e-6,
        ..Default::default()
    }
}

fn hp_qwen2moe() -> Hparams {
    Hparams {
        n_head_kv: 4,
        n_ff_shexp: 384,
        ..base("qwen2moe")
    }
}

fn hp_gpt_oss() -> Hparams {
    {
        let mut hp = Hparams {
            n_ff_exp: 256,
            gating: Gating::SoftmaxWeight,
            ..base("gpt-oss")
        };
        hp.swa.window = 128;
        hp.swa.layers = vec![true, false, true, false];
        hp
    }
}

/// DeepSeek-V3-like: one dense lead block, one MTP block, q compression, split MLA (k_b/v_b).
fn hp_deepseek2() -> Hparams {
    {
        let mut hp = Hparams {
            n_layer: 5,
            n_layer_nextn: 1,
            n_layer_dense_lead: 1,
            n_head_kv: 1,
            head_dim_k: 96, // kv_lora_rank + n_rot, as MLA files write it
            head_dim_v: 64,
            n_rot: 32,
            n_expert_shared: 1,
            gating: Gating::Sigmoid,
            ..base("deepseek2")
        };
        hp.mla.q_lora_rank = 96;
        hp.mla.kv_lora_rank = 64;
        hp.mla.head_dim_k = 48;
        hp.mla.head_dim_v = 32;
        hp
    }
}

/// DeepSeek-V2-Lite-like legacy file: no q compression, fused `attn_kv_b`.
fn hp_deepseek2_lite_legacy() -> Hparams {
    {
        let mut hp = Hparams {
            head_dim_k: 48,
            head_dim_v: 32,
            n_layer_nextn: 0,
            n_layer: 4,
            ..hp_deepseek2()
        };
        hp.mla.q_lora_rank = 0;
        hp.mla.head_dim_k = 0;
        hp.mla.head_dim_v = 0;
        hp
    }
}

fn hp_llama() -> Hparams {
    Hparams {
        n_ff_exp: 0,
        ..base("llama")
    }
}

fn hp_glm4moe() -> Hparams {
    Hparams {
        n_layer: 5,
        n_layer_nextn: 1,
        n_layer_dense_lead: 1,
        n_expert_shared: 1,
        n_rot: 32,
        gating: Gating::Sigmoid,
        ..base("glm4moe")
    }
}

fn hp_minimax_m2() -> Hparams {
    Hparams {
        n_rot: 32,
        n_ff: 128,
        gating: Gating::Sigmoid,
        ..base("minimax-m2")
    }
}

fn hp_olmoe() -> Hparams {
    Hparams {
        n_head_kv: 4,
        n_ff: 128,
        ..base("olmoe")
    }
}

fn hp_deepseek4() -> Hparams {
    {
        let mut hp = Hparams {
            n_layer: 5,
            n_layer_nextn: 1,
            n_head_kv: 1,
            head_dim_k: 128,
            head_dim_v: 128,
            n_rot: 32,
            n_expert_shared: 1,
            gating: Gating::SqrtSoftplus,
            ..base("deepseek4")
        };
        hp.swa.head_dim_k = 128;
        hp.swa.head_dim_v = 128;
        hp.swa.n_rot = 32;
        hp.mla.q_lora_rank = 64;
        hp.swa.layers = vec![true; 5];
        hp.swa.window = 128;
        hp.indexer.n_head = 2;
        hp.indexer.head_dim = 64;
        hp.indexer.top_k = 16;
        hp.dsv4.o_group_count = 2;
        hp.dsv4.o_lora_rank = 32;
        hp.dsv4.compress_ratios = vec![0, 4, 128, 4, 0];
        hp.dsv4.compress_rope_freq_base = 160000.0;
        hp.dsv4.hc_mult = 4;
        hp.dsv4.hc_sinkhorn_iters = 20;
        hp.dsv4.hash_layer_count = 2;
        hp
    }
}

/// One small plausible `Hparams` per registered architecture (plus variants), and the tiny
/// preset of every built one (so a new architecture is covered by its own file).
fn cases() -> Vec<Hparams> {
    let tiny = super::built().filter_map(|a| a.synth.tiny.map(|t| t()));
    let mut cases = vec![
        base("qwen3moe"),
        hp_qwen2moe(),
        hp_gpt_oss(),
        hp_deepseek2(),
        hp_deepseek2_lite_legacy(),
        hp_llama(),
        hp_glm4moe(),
        hp_minimax_m2(),
        hp_olmoe(),
        hp_deepseek4(),
    ];
    cases.extend(tiny);
    cases
}

fn spec(name: &str) -> &'static ArchSpec {
    super::by_name(name)
        .map(|a| &a.spec)
        .unwrap_or_else(|| panic!("{name} is not registered"))
}

/// Tensors of block `il` (None = global): name -> (role, shape, required).
fn block(a: &ArchSpec, h: &Hparams, il: Option<usize>) -> HashMap<String, (Role, Vec<u64>, bool)> {
    let mut m = HashMap::new();
    for (name, t, b) in a.expected_tensors(h) {
        if b == il {
            let shape = (t.shape)(h, b.unwrap_or(0));
            assert!(
                m.insert(name.clone(), (t.role, shape, a.required_in(t, h, b)))
                    .is_none(),
                "{}: {name} twice in block {il:?}",
                a.name
            );
        }
    }
    m
}

fn shape(m: &HashMap<String, (Role, Vec<u64>, bool)>, name: &str) -> Vec<u64> {
    m.get(name)
        .unwrap_or_else(|| panic!("{name} missing"))
        .1
        .clone()
}

#[test]
fn registry_has_every_arch_once() {
    let names: Vec<&str> = ARCHS.iter().map(|a| a.spec.name).collect();
    let unique: HashSet<&str> = names.iter().copied().collect();
    assert_eq!(unique.len(), names.len(), "duplicate arch names: {names:?}");
    for n in [
        "qwen3moe",
        "qwen2moe",
        "gpt-oss",
        "deepseek2",
        "deepseek4",
        "llama",
        "glm4moe",
        "minimax-m2",
        "olmoe",
    ] {
        assert_eq!(spec(n).name, n);
    }
    let tested: HashSet<&str> = cases().into_iter().map(|h| h.arch.name).collect();
    for n in names {
        assert!(tested.contains(n), "{n} has no test case");
    }
}

#[test]
fn cases_validate() {
    for h in cases() {
        h.validate().unwrap_or_else(|e| panic!("{}: {e}", h.arch));
    }
}

#[test]
fn names_use_llama_cpp_forms() {
    for a in ARCHS.iter().map(|a| &a.spec) {
        let mut seen = HashSet::new();
        for t in a.tensor_specs() {
            assert!(seen.insert(t.name), "{}: {} listed twice", a.name, t.name);
            let (stem, suffix) = t
                .name
                .rsplit_once('.')
                .unwrap_or_else(|| panic!("{}: {} has no suffix", a.name, t.name));
            assert!(
                suffix == "weight" || suffix == "bias",
                "{}: {} suffix {suffix}",
                a.name,
                t.name
            );
            if matches!(t.layers, Layers::Global) {
                assert!(
                    !t.name.contains("{}"),
                    "{}: global {} has a block index",
                    a.name,
                    t.name
                );
                assert!(
                    GLOBAL_STEMS.contains(&stem),
                    "{}: unknown global tensor {}",
                    a.name,
                    t.name
                );
            } else {
                let s = stem
                    .strip_prefix("blk.{}.")
                    .unwrap_or_else(|| panic!("{}: {} is not blk.{{}}.*", a.name, t.name));
                assert!(
                    BLOCK_STEMS.contains(&s),
                    "{}: unknown block tensor {}",
                    a.name,
                    t.name
                );
            }
            let bias_role = matches!(
                t.role,
                Role::Norm
                    | Role::Attention
                    | Role::Router
                    | Role::RoutedExpertBias
                    | Role::DenseFfn
            );
            assert!(
                suffix == "weight" || bias_role,
                "{}: bias {} with role {:?}",
                a.name,
                t.name,
                t.role
            );
        }
        assert!(
            a.tensor_specs()
                .any(|t| t.name == "token_embd.weight" && t.role == Role::Embedding && t.required),
            "{}",
            a.name
        );
        assert!(
            a.tensor_specs()
                .any(|t| t.name == "output_norm.weight" && t.role == Role::Norm && t.required),
            "{}",
            a.name
        );
        assert!(
            a.tensor_specs()
                .any(|t| t.name == "output.weight" && t.role == Role::Output),
            "{}",
            a.name
        );
    }
}

#[test]
fn blocks_are_well_formed() {
    for h in cases() {
        let a = h.arch;
        for (name, (_, s, _)) in block(a, &h, None) {
            assert!(
                !s.is_empty() && !s.contains(&0),
                "{}: {name} has shape {s:?}",
                a.name
            );
        }
        for il in 0..h.n_layer {
            let m = block(a, &h, Some(il));
            assert!(
                m.contains_key(&format!("blk.{il}.attn_norm.weight")),
                "{}: block {il} has no attn_norm",
                a.name
            );
            for (name, (role, s, _)) in &m {
                assert!(
                    !s.is_empty() && !s.contains(&0),
                    "{}: {name} has shape {s:?}",
                    a.name
                );
                assert!(
                    name.starts_with(&format!("blk.{il}.")),
                    "{}: {name} in block {il}",
                    a.name
                );
                if matches!(role, Role::RoutedExperts | Role::RoutedExpertBias) {
                    assert_eq!(
                        s.last(),
                        Some(&h.n_expert),
                        "{}: {name} {s:?} does not end in n_expert",
                        a.name
                    );
                }
            }
            let experts: Vec<&String> = m
                .iter()
                .filter(|(_, (r, _, _))| *r == Role::RoutedExperts)
                .map(|(n, _)| n)
                .collect();
            let routers = m
                .iter()
                .filter(|(n, (r, _, _))| *r == Role::Router && n.ends_with("ffn_gate_inp.weight"))
                .count();
            if h.is_moe_layer(il) {
                assert_eq!(
                    experts.len(),
                    3,
                    "{}: MoE block {il} has expert weights {experts:?}",
                    a.name
                );
                for which in ["gate", "up", "down"] {
                    assert!(
                        m.contains_key(&format!("blk.{il}.ffn_{which}_exps.weight")),
                        "{}: block {il} lacks ffn_{which}_exps",
                        a.name
                    );
                }
                assert_eq!(routers, 1, "{}: MoE block {il} router count", a.name);
                assert_eq!(
                    shape(&m, &format!("blk.{il}.ffn_gate_inp.weight")),
                    vec![h.n_embd, h.n_expert]
                );
                let down = shape(&m, &format!("blk.{il}.ffn_down_exps.weight"));
                assert_eq!(down[1], h.n_embd, "{}: ffn_down_exps {down:?}", a.name);
            } else {
                assert!(
                    experts.is_empty(),
                    "{}: dense block {il} has experts {experts:?}",
                    a.name
                );
                assert_eq!(routers, 0, "{}: dense block {il} has a router", a.name);
                assert!(
                    m.values().any(|(r, _, _)| *r == Role::DenseFfn),
                    "{}: dense block {il} has no FFN",
                    a.name
                );
            }
            let nextn = m.keys().any(|n| n.contains(".nextn."));
            assert_eq!(
                nextn,
                h.is_nextn_layer(il),
                "{}: nextn tensors in block {il}",
                a.name
            );
        }
    }
}

#[test]
fn dense_lead_blocks_and_shared_experts() {
    for h in [hp_deepseek2(), hp_glm4moe()] {
        let a = h.arch;
        let b0 = block(a, &h, Some(0));
        assert_eq!(shape(&b0, "blk.0.ffn_gate.weight"), vec![h.n_embd, h.n_ff]);
        assert_eq!(shape(&b0, "blk.0.ffn_down.weight"), vec![h.n_ff, h.n_embd]);
        assert!(
            !b0.contains_key("blk.0.ffn_gate_shexp.weight"),
            "{}",
            a.name
        );
        let b1 = block(a, &h, Some(1));
        assert!(!b1.contains_key("blk.1.ffn_gate.weight"), "{}", a.name);
        assert_eq!(
            shape(&b1, "blk.1.ffn_up_shexp.weight"),
            vec![h.n_embd, h.n_ff_exp * h.n_expert_shared]
        );
        assert_eq!(b1["blk.1.ffn_gate_shexp.weight"].0, Role::SharedExperts);
    }
    // glm4moe without shared experts loads none.
    let h = Hparams {
        n_expert_shared: 0,
        ..hp_glm4moe()
    };
    assert!(!block(spec("glm4moe"), &h, Some(1)).contains_key("blk.1.ffn_gate_shexp.weight"));
    // qwen2moe: gated shared expert, width falling back to n_ff.
    let h = hp_qwen2moe();
    let b = block(spec("qwen2moe"), &h, Some(0));
    assert_eq!(shape(&b, "blk.0.ffn_gate_inp_shexp.weight"), vec![h.n_embd]);
    assert_eq!(
        shape(&b, "blk.0.ffn_down_shexp.weight"),
        vec![384, h.n_embd]
    );
    let h = Hparams { n_ff_shexp: 0, ..h };
    assert_eq!(
        shape(
            &block(spec("qwen2moe"), &h, Some(0)),
            "blk.0.ffn_down_shexp.weight"
        ),
        vec![h.n_ff, h.n_embd]
    );
}

#[test]
fn deepseek_v3_real_shapes() {
    let h = {
        let mut hp = Hparams {
            arch: spec("deepseek2"),
            n_vocab: 129280,
            n_embd: 7168,
            n_layer: 62,
            n_layer_nextn: 1,
            n_head: 128,
            n_head_kv: 1,
            head_dim_k: 576,
            head_dim_v: 512,
            n_rot: 64,
            n_ff: 18432,
            n_ff_exp: 2048,
            n_expert: 256,
            n_expert_used: 8,
            n_expert_shared: 1,
            n_layer_dense_lead: 3,
            n_expert_groups: 8,
            n_group_used: 4,
            n_ctx_train: 163840,
            rope_freq_base: 10000.0,
            rms_eps: 1e-6,
            ..Default::default()
        };
        hp.mla.q_lora_rank = 1536;
        hp.mla.kv_lora_rank = 512;
        hp.mla.head_dim_k = 192;
        hp.mla.head_dim_v = 128;
        hp
    };
    h.validate().unwrap();
    let a = spec("deepseek2");
    let b = block(a, &h, Some(3));
    assert_eq!(shape(&b, "blk.3.attn_q_a.weight"), vec![7168, 1536]);
    assert_eq!(shape(&b, "blk.3.attn_q_b.weight"), vec![1536, 128 * 192]);
    assert_eq!(shape(&b, "blk.3.attn_kv_a_mqa.weight"), vec![7168, 576]);
    assert_eq!(shape(&b, "blk.3.attn_k_b.weight"), vec![128, 512, 128]);
    assert_eq!(shape(&b, "blk.3.attn_v_b.weight"), vec![512, 128, 128]);
    assert_eq!(shape(&b, "blk.3.attn_output.weight"), vec![128 * 128, 7168]);
    assert_eq!(
        shape(&b, "blk.3.ffn_gate_exps.weight"),
        vec![7168, 2048, 256]
    );
    assert_eq!(shape(&b, "blk.3.ffn_down_shexp.weight"), vec![2048, 7168]);
    assert!(!b.contains_key("blk.3.attn_kv_b.weight") && !b.contains_key("blk.3.attn_q.weight"));
    assert!(!b["blk.3.exp_probs_b.bias"].2, "exp_probs_b is optional");
    assert_eq!(
        shape(&block(a, &h, Some(2)), "blk.2.ffn_up.weight"),
        vec![7168, 18432]
    );
    // The MTP block: a full MoE block plus nextn.*, none of it required (file may omit it).
    let m = block(a, &h, Some(61));
    assert_eq!(
        shape(&m, "blk.61.nextn.eh_proj.weight"),
        vec![2 * 7168, 7168]
    );
    assert!(m.contains_key("blk.61.ffn_up_exps.weight"));
    assert!(m.values().all(|(_, _, req)| !req));
    assert!(
        block(a, &h, Some(60))
            .values()
            .filter(|(_, _, req)| *req)
            .count()
            > 10
    );
    assert!(!block(a, &h, Some(60)).contains_key("blk.60.nextn.eh_proj.weight"));
    // 3 global + 3 dense blocks + 58 MoE decode blocks + the MTP block.
    let per_dense = 10 + 3; // attn (norm, q_a_norm, kv_a_norm, q_a, q_b, kv_a_mqa, k_b, v_b, output, ffn_norm) + ffn
    let per_moe = 10 + 2 + 3 + 3; // attn + router/exp_probs_b + experts + shared
    assert_eq!(
        a.expected_tensors(&h).count(),
        3 + 3 * per_dense + 59 * per_moe + 6
    );
}

#[test]
fn deepseek2_lite_and_legacy_kv_b() {
    let h = hp_deepseek2_lite_legacy();
    let b = block(spec("deepseek2"), &h, Some(1));
    assert!(
        !b.contains_key("blk.1.attn_q_a.weight") && !b.contains_key("blk.1.attn_q_a_norm.weight")
    );
    assert_eq!(
        shape(&b, "blk.1.attn_q.weight"),
        vec![h.n_embd, h.n_head * 48]
    );
    // kv_b: [kv_lora_rank, n_head * (qk_nope + v_head)] with qk_nope = 48 - 32.
    assert_eq!(shape(&b, "blk.1.attn_kv_b.weight"), vec![64, 4 * (16 + 32)]);
    assert!(!b.contains_key("blk.1.attn_k_b.weight"));
}

#[test]
fn gpt_oss_20b_shapes() {
    let h = Hparams {
        n_vocab: 201088,
        n_embd: 2880,
        n_layer: 24,
        n_head: 64,
        n_head_kv: 8,
        head_dim_k: 64,
        head_dim_v: 64,
        n_rot: 64,
        n_ff_exp: 2880,
        n_expert: 32,
        n_expert_used: 4,
        ..hp_gpt_oss()
    };
    let b = block(spec("gpt-oss"), &h, Some(5));
    assert_eq!(shape(&b, "blk.5.attn_q.weight"), vec![2880, 4096]);
    assert_eq!(shape(&b, "blk.5.attn_k.weight"), vec![2880, 512]);
    assert_eq!(shape(&b, "blk.5.attn_output.weight"), vec![4096, 2880]);
    assert_eq!(shape(&b, "blk.5.attn_sinks.weight"), vec![64]);
    assert_eq!(shape(&b, "blk.5.ffn_gate_inp.bias"), vec![32]);
    assert_eq!(shape(&b, "blk.5.ffn_gate_exps.bias"), vec![2880, 32]);
    assert_eq!(shape(&b, "blk.5.ffn_down_exps.bias"), vec![2880, 32]);
    assert!(b["blk.5.attn_output.bias"].2 && !b["blk.5.attn_q.bias"].2);
    assert_eq!(b["blk.5.ffn_up_exps.bias"].0, Role::RoutedExpertBias);
    assert_eq!(b["blk.5.post_attention_norm.weight"].0, Role::Norm);
}

#[test]
fn glm4moe_mtp_block_keeps_block_tensors() {
    let h = hp_glm4moe();
    let a = spec("glm4moe");
    let last = h.n_layer - 1;
    let m = block(a, &h, Some(last));
    for n in [
        "attn_q.weight",
        "post_attention_norm.weight",
        "exp_probs_b.bias",
        "ffn_gate_exps.weight",
        "ffn_up_shexp.weight",
        "nextn.eh_proj.weight",
        "nextn.shared_head_norm.weight",
    ] {
        let (_, _, req) = m
            .get(&format!("blk.{last}.{n}"))
            .unwrap_or_else(|| panic!("{n} missing from the MTP block"));
        assert!(!req, "{n} required in the MTP block");
    }
    assert_eq!(m[&format!("blk.{last}.nextn.hnorm.weight")].0, Role::Other);
    let b = block(a, &h, Some(1));
    assert!(
        b["blk.1.exp_probs_b.bias"].2
            && b["blk.1.attn_q.weight"].2
            && !b["blk.1.attn_q_norm.weight"].2
    );
    assert!(!b.contains_key("blk.1.ffn_norm.weight"));
}

#[test]
fn deepseek4_per_block_tensors() {
    let h = hp_deepseek4();
    let a = spec("deepseek4");
    let g = block(a, &h, None);
    assert_eq!(shape(&g, "output_hc_fn.weight"), vec![4 * 256, 4]);
    let b0 = block(a, &h, Some(0)); // ratio 0, hash-routed
    assert!(!b0
        .keys()
        .any(|n| n.contains("compressor") || n.contains("indexer")));
    assert_eq!(shape(&b0, "blk.0.ffn_gate_tid2eid.weight"), vec![2, 1000]);
    assert!(!b0.contains_key("blk.0.exp_probs_b.bias"));
    assert_eq!(
        shape(&b0, "blk.0.hc_attn_fn.weight"),
        vec![4 * 256, (2 + 4) * 4]
    );
    assert_eq!(shape(&b0, "blk.0.attn_q_b.weight"), vec![64, 4 * 128]);
    assert_eq!(shape(&b0, "blk.0.attn_kv.weight"), vec![256, 128]);
    assert_eq!(
        shape(&b0, "blk.0.attn_output_a.weight"),
        vec![4 * 128 / 2, 32 * 2]
    );
    assert_eq!(shape(&b0, "blk.0.attn_output_b.weight"), vec![64, 256]);
    let b1 = block(a, &h, Some(1)); // ratio 4: two-window compressor + indexer
    assert_eq!(
        shape(&b1, "blk.1.attn_compressor_kv.weight"),
        vec![256, 2 * 128]
    );
    assert_eq!(
        shape(&b1, "blk.1.attn_compressor_ape.weight"),
        vec![2 * 128, 4]
    );
    assert_eq!(
        shape(&b1, "blk.1.indexer.attn_q_b.weight"),
        vec![64, 2 * 64]
    );
    assert_eq!(
        shape(&b1, "blk.1.indexer_compressor_ape.weight"),
        vec![2 * 64, 4]
    );
    let b2 = block(a, &h, Some(2)); // ratio 128: compressor only, router top-k with bias
    assert_eq!(
        shape(&b2, "blk.2.attn_compressor_ape.weight"),
        vec![128, 128]
    );
    assert!(!b2.keys().any(|n| n.contains("indexer")));
    assert!(b2["blk.2.exp_probs_b.bias"].2 && !b2.contains_key("blk.2.ffn_gate_tid2eid.weight"));
    // MTP block: block tensors stay required (llama.cpp loads it as a block when eh_proj is absent).
    let m = block(a, &h, Some(4));
    assert!(m["blk.4.ffn_up_exps.weight"].2 && !m["blk.4.nextn.eh_proj.weight"].2);
}

#[test]
fn optional_tensors_match_llama_cpp() {
    let req = |arch: &str, h: &Hparams, il: Option<usize>, n: &str| block(spec(arch), h, il)[n].2;
    assert!(!req(
        "llama",
        &hp_llama(),
        Some(0),
        "blk.0.ffn_gate_exps.weight"
    ));
    assert!(req(
        "llama",
        &hp_llama(),
        Some(0),
        "blk.0.ffn_up_exps.weight"
    ));
    assert!(!req("llama", &hp_llama(), None, "output.weight"));
    assert!(!req("llama", &hp_llama(), None, "rope_freqs.weight"));
    assert!(req("olmoe", &hp_olmoe(), None, "output.weight"));
    assert!(req(
        "minimax-m2",
        &hp_minimax_m2(),
        Some(0),
        "blk.0.exp_probs_b.bias"
    ));
    assert_eq!(
        shape(
            &block(spec("minimax-m2"), &hp_minimax_m2(), Some(0)),
            "blk.0.attn_q_norm.weight"
        ),
        vec![4 * 64]
    );
    assert_eq!(
        shape(
            &block(spec("minimax-m2"), &hp_minimax_m2(), Some(0)),
            "blk.0.attn_k_norm.weight"
        ),
        vec![2 * 64]
    );
    assert_eq!(
        shape(
            &block(spec("olmoe"), &hp_olmoe(), Some(0)),
            "blk.0.ffn_up_exps.weight"
        ),
        vec![256, 128, 8]
    );
    assert!(!req(
        "qwen2moe",
        &hp_qwen2moe(),
        Some(0),
        "blk.0.attn_q.bias"
    ));
}

/// Metadata in a map, for `Hparams::from_meta`.
#[derive(Default)]
struct MapMeta(HashMap<String, GgufValue>);

#[derive(Clone)]
enum V {
    U(u64),
    F(f32),
    B(bool),
    A(Vec<u64>),
}

impl MapMeta {
    fn new(arch: &str, kv: &[(&str, V)]) -> Self {
        let mut m = MapMeta::default();
        let common = [
            ("context_length", V::U(4096)),
            ("embedding_length", V::U(256)),
            ("block_count", V::U(4)),
            ("vocab_size", V::U(1000)),
            ("attention.head_count", V::U(4)),
            ("attention.head_count_kv", V::U(2)),
            ("attention.layer_norm_rms_epsilon", V::F(1e-6)),
            ("expert_count", V::U(8)),
            ("expert_used_count", V::U(2)),
            ("feed_forward_length", V::U(512)),
        ];
        for (k, v) in common.iter().chain(kv) {
            m.set(format!("{arch}.{k}"), v.clone());
        }
        m
    }

    fn set(&mut self, key: impl Into<String>, v: V) {
        let v = match v {
            V::U(x) => GgufValue::U64(x),
            V::F(x) => GgufValue::F32(x),
            V::B(x) => GgufValue::Bool(x),
            V::A(x) => GgufValue::Array(GgufArray::U64(x)),
        };
        self.0.insert(key.into(), v);
    }

    fn without(mut self, key: &str) -> Self {
        self.0.retain(|k, _| !k.ends_with(key));
        self
    }
}

impl Metadata for MapMeta {
    fn get(&self, key: &str) -> Option<&GgufValue> {
        self.0.get(key)
    }
    fn origin(&self, _key: &str) -> (&std::path::Path, Option<u64>) {
        (std::path::Path::new("<map>"), None)
    }
}

fn load(arch: &str, meta: &MapMeta) -> Result<Hparams, String> {
    Hparams::from_meta(spec(arch), meta)
}

fn deepseek2_meta(layers: u64, vocab: u64, q_lora: Option<u64>) -> MapMeta {
    let mut kv = vec![
        ("block_count", V::U(layers)),
        ("vocab_size", V::U(vocab)),
        ("attention.head_count_kv", V::U(4)),
        ("attention.key_length", V::U(96)),
        ("attention.value_length", V::U(64)),
        ("attention.key_length_mla", V::U(48)),
        ("attention.value_length_mla", V::U(32)),
        ("rope.dimension_count", V::U(32)),
        ("attention.kv_lora_rank", V::U(64)),
        ("expert_feed_forward_length", V::U(128)),
        ("expert_shared_count", V::U(1)),
        ("leading_dense_block_count", V::U(1)),
    ];
    if let Some(q) = q_lora {
        kv.push(("attention.q_lora_rank", V::U(q)));
    }
    MapMeta::new("deepseek2", &kv)
}

#[test]
fn from_meta_deepseek2_rules() {
    // V2-Lite (27 blocks): q_lora_rank is ignored even if present; gating defaults to softmax.
    let h = load("deepseek2", &deepseek2_meta(27, 102400, Some(96))).unwrap();
    assert_eq!(
        (h.mla.q_lora_rank, h.gating, h.is_mla()),
        (0, Gating::Softmax, true)
    );
    // Non-lite without q_lora_rank is refused, naming the key.
    let e = load("deepseek2", &deepseek2_meta(61, 129280, None)).unwrap_err();
    assert!(e.contains("deepseek2.attention.q_lora_rank"), "{e}");
    let h = load("deepseek2", &deepseek2_meta(61, 129280, Some(96))).unwrap();
    assert_eq!(h.mla.q_lora_rank, 96);
    // GLM-4.7 Lite (47 blocks, vocab 154880) defaults to sigmoid; an explicit key wins.
    assert_eq!(
        load("deepseek2", &deepseek2_meta(47, 154880, Some(96)))
            .unwrap()
            .gating,
        Gating::Sigmoid
    );
    let mut m = deepseek2_meta(47, 154880, Some(96));
    m.set("deepseek2.expert_gating_func", V::U(1));
    assert_eq!(load("deepseek2", &m).unwrap().gating, Gating::Softmax);
    // Missing arch-specific required key.
    let e = load(
        "deepseek2",
        &deepseek2_meta(61, 129280, Some(96)).without("kv_lora_rank"),
    )
    .unwrap_err();
    assert!(e.contains("attention.kv_lora_rank"), "{e}");
}

#[test]
fn from_meta_gating_and_expert_width() {
    let glm = MapMeta::new(
        "glm4moe",
        &[
            ("expert_feed_forward_length", V::U(128)),
            ("expert_shared_count", V::U(1)),
        ],
    );
    assert_eq!(load("glm4moe", &glm).unwrap().gating, Gating::Sigmoid);
    // qwen3moe: no expert width key -> n_ff / n_expert_used; gating fixed by the graph.
    let q = MapMeta::new("qwen3moe", &[("expert_gating_func", V::U(2))]);
    let h = load("qwen3moe", &q).unwrap();
    assert_eq!(
        (h.n_ff_exp, h.gating, h.expert_weights_norm),
        (256, Gating::Softmax, true)
    );
    let h = load(
        "qwen2moe",
        &MapMeta::new("qwen2moe", &[("expert_weights_norm", V::B(true))]),
    )
    .unwrap();
    assert!(!h.expert_weights_norm);
    // llama: n_rot must equal the head size.
    let e = load(
        "llama",
        &MapMeta::new("llama", &[("rope.dimension_count", V::U(32))]),
    )
    .unwrap_err();
    assert!(
        e.contains("llama.rope.dimension_count = 32") && e.contains("llama.attention.key_length"),
        "{e}"
    );
    assert_eq!(
        load(
            "minimax-m2",
            &MapMeta::new("minimax-m2", &[("expert_feed_forward_length", V::U(512))])
        )
        .unwrap()
        .gating,
        Gating::Sigmoid
    );
}

#[test]
fn from_meta_gpt_oss_sliding_window_pattern() {
    let base = [
        ("expert_feed_forward_length", V::U(128)),
        ("attention.sliding_window", V::U(128)),
        ("expert_gating_func", V::U(1)),
    ];
    let h = load("gpt-oss", &MapMeta::new("gpt-oss", &base)).unwrap();
    assert_eq!(h.swa.layers, vec![true, false, true, false]);
    assert_eq!(h.gating, Gating::SoftmaxWeight);
    let mut kv = base.to_vec();
    kv.push(("attention.sliding_window_pattern", V::A(vec![0, 1, 0, 1])));
    assert_eq!(
        load("gpt-oss", &MapMeta::new("gpt-oss", &kv))
            .unwrap()
            .swa
            .layers,
        vec![false, true, false, true]
    );
    let e = load("gpt-oss", &MapMeta::new("gpt-oss", &base[..1])).unwrap_err();
    assert!(e.contains("attention.sliding_window"), "{e}");
}

#[test]
fn from_meta_deepseek4() {
    let kv = [
        ("block_count", V::U(5)),
        ("nextn_predict_layers", V::U(1)),
        ("attention.head_count_kv", V::U(1)),
        ("attention.key_length", V::U(128)),
        ("attention.value_length", V::U(128)),
        ("rope.dimension_count", V::U(32)),
        ("attention.q_lora_rank", V::U(64)),
        ("attention.sliding_window", V::U(128)),
        ("expert_feed_forward_length", V::U(128)),
        ("expert_shared_count", V::U(1)),
        ("expert_weights_scale", V::F(1.5)),
        ("expert_weights_norm", V::B(true)),
        ("swiglu_clamp_exp", V::F(10.0)),
        ("attention.indexer.head_count", V::U(2)),
        ("attention.indexer.key_length", V::U(64)),
        ("attention.indexer.top_k", V::U(16)),
        ("attention.output_group_count", V::U(2)),
        ("attention.output_lora_rank", V::U(32)),
        ("attention.compress_rope_freq_base", V::F(160000.0)),
        ("hyper_connection.count", V::U(4)),
        ("hyper_connection.sinkhorn_iterations", V::U(20)),
        ("hyper_connection.epsilon", V::F(1e-6)),
        ("hash_layer_count", V::U(2)),
        ("attention.compress_ratios", V::A(vec![0, 4, 128, 4, 0])),
        ("expert_gating_func", V::U(4)),
    ];
    let h = load("deepseek4", &MapMeta::new("deepseek4", &kv)).unwrap();
    assert_eq!(h.dsv4.compress_ratios, vec![0, 4, 128, 4, 0]);
    assert_eq!(
        (
            h.gating,
            h.swa.layers.len(),
            h.is_swa(4),
            h.head_dim_k_at(0)
        ),
        (Gating::SqrtSoftplus, 5, true, 128)
    );
    assert_eq!(
        (
            h.dsv4.swiglu_clamp_exp,
            h.dsv4.swiglu_clamp_shexp,
            h.dsv4.hc_mult,
            h.dsv4.hash_layer_count
        ),
        (10.0, 10.0, 4, 2)
    );
    // Every tensor shape is computable and non-zero for the loaded hparams.
    for (name, t, b) in spec("deepseek4").expected_tensors(&h) {
        let s = (t.shape)(&h, b.unwrap_or(0));
        assert!(!s.contains(&0), "{name} {s:?}");
    }
    let mut bad = MapMeta::new("deepseek4", &kv);
    bad.set("deepseek4.expert_gating_func", V::U(2));
    assert!(load("deepseek4", &bad)
        .unwrap_err()
        .contains("sqrtsoftplus"));
    let mut short = MapMeta::new("deepseek4", &kv);
    short.set("deepseek4.attention.compress_ratios", V::A(vec![0, 4]));
    assert!(load("deepseek4", &short)
        .unwrap_err()
        .contains("compress_ratios"));
    let mut odd = MapMeta::new("deepseek4", &kv);
    odd.set(
        "deepseek4.attention.compress_ratios",
        V::A(vec![0, 8, 0, 0, 0]),
    );
    assert!(load("deepseek4", &odd).is_err());
    assert!(load(
        "deepseek4",
        &MapMeta::new("deepseek4", &kv).without("expert_weights_norm")
    )
    .is_err());
}

#[test]
fn every_synth_preset_validates() {
    for p in crate::synth::presets::all() {
        let h = &p.hparams;
        h.validate()
            .unwrap_or_else(|e| panic!("{} {}: {e}", h.arch, p.name));
    }
}

/// Values that used to load and then hang, abort or give NaN at the first request (issue 17)
/// are refused by `from_meta`, naming the key, its value and what is allowed.
#[test]
fn from_meta_refuses_bad_values_naming_the_key() {
    let cases: &[(&str, V, &str)] = &[
        // ggml's rope spins forever on 0 rotary dims; odd dims are not rotated pairs.
        (
            "rope.dimension_count",
            V::U(0),
            "rope.dimension_count = 0: must be an even number in 2..=64",
        ),
        (
            "rope.dimension_count",
            V::U(63),
            "rope.dimension_count = 63: must be an even number",
        ),
        (
            "rope.dimension_count",
            V::U(128),
            "rope.dimension_count = 128: must be an even number in 2..=64",
        ),
        // ggml asserts eps >= 0 (abort); 0 divides by zero on a zero row; inf gives NaN.
        (
            "attention.layer_norm_rms_epsilon",
            V::F(-1.0),
            "attention.layer_norm_rms_epsilon = -1: must be a number in (0, 1]",
        ),
        (
            "attention.layer_norm_rms_epsilon",
            V::F(f32::NAN),
            "attention.layer_norm_rms_epsilon = NaN",
        ),
        (
            "attention.layer_norm_rms_epsilon",
            V::F(0.0),
            "attention.layer_norm_rms_epsilon = 0",
        ),
        (
            "rope.freq_base",
            V::F(0.0),
            "rope.freq_base = 0: must be a finite number > 0",
        ),
        (
            "rope.freq_base",
            V::F(f32::INFINITY),
            "rope.freq_base = inf",
        ),
        (
            "rope.scaling.original_context_length",
            V::U(1 << 31),
            "rope.scaling.original_context_length = 2147483648: must be in 0..=2147483647",
        ),
        (
            "context_length",
            V::U(0),
            "context_length = 0: must be in 1..=2147483647",
        ),
        (
            "expert_weights_scale",
            V::F(f32::NAN),
            "expert_weights_scale = NaN: must be a finite number >= 0",
        ),
        // A size of the wrong type is not silently replaced by the default.
        (
            "block_count",
            V::F(2.5),
            "block_count = 2.5: must be a non-negative integer",
        ),
        (
            "rope.dimension_count",
            V::F(-1.0),
            "rope.dimension_count = -1: must be a non-negative integer",
        ),
        (
            "rope.freq_base",
            V::B(true),
            "rope.freq_base holds a value of another type: must be a number",
        ),
        // Sizes and their agreements.
        (
            "block_count",
            V::U(u32::MAX as u64),
            "block_count = 4294967295: must be in 1..=4096",
        ),
        (
            "embedding_length",
            V::U(1 << 31),
            "embedding_length = 2147483648: must be in 1..=16777216",
        ),
        (
            "attention.head_count_kv",
            V::U(3),
            "attention.head_count_kv = 3: must divide qwen3moe.attention.head_count = 4",
        ),
        (
            "attention.value_length",
            V::U(32),
            "attention.value_length = 32: must equal qwen3moe.attention.key_length = 64",
        ),
        (
            "expert_used_count",
            V::U(9),
            "expert_used_count = 9: must be in 1..=8 (qwen3moe.expert_count = 8)",
        ),
        (
            "expert_count",
            V::U(0),
            "expert_count = 0: a dense model, not a Mixture-of-Experts one",
        ),
        (
            "vocab_size",
            V::U(0),
            "vocab_size = 0: must be in 1..=16777216",
        ),
        (
            "nextn_predict_layers",
            V::U(4),
            "nextn_predict_layers = 4: must be less than qwen3moe.block_count = 4",
        ),
        (
            "expert_gating_func",
            V::U(9),
            "expert_gating_func = 9: unknown gating function",
        ),
    ];
    for (key, v, want) in cases {
        let e = load("qwen3moe", &MapMeta::new("qwen3moe", &[(key, v.clone())])).unwrap_err();
        assert!(e.contains(&format!("qwen3moe.{want}")), "{key}: {e}");
    }
    // The unmodified base loads.
    load("qwen3moe", &MapMeta::new("qwen3moe", &[])).unwrap();
}

#[test]
fn validate_refuses_inconsistent_groups_and_windows() {
    let mut h = hp_deepseek2();
    h.n_expert_groups = 4;
    h.n_group_used = 2;
    assert_eq!(h.validate(), Ok(()));
    // One expert per group: the group score (its two best experts) cannot be formed.
    h.n_expert_groups = h.n_expert;
    let e = h.validate().unwrap_err();
    assert!(
        e.contains("deepseek2.expert_group_count = 8: leaves 1 expert per group"),
        "{e}"
    );
    // More experts routed than the selected groups hold.
    h.n_expert_groups = 4;
    h.n_group_used = 1;
    h.n_expert_used = 3;
    let e = h.validate().unwrap_err();
    assert!(
        e.contains("deepseek2.expert_used_count = 3: more than the 2 experts"),
        "{e}"
    );
    // MLA: the latent heads are kv_lora_rank + n_rot and kv_lora_rank.
    let mut h = hp_deepseek2();
    h.head_dim_k += 2;
    let e = h.validate().unwrap_err();
    assert!(e.contains("deepseek2.attention.key_length = 98"), "{e}");
    let mut h = hp_deepseek2();
    h.mla.head_dim_v = 0;
    let e = h.validate().unwrap_err();
    assert!(
        e.contains("deepseek2.attention.value_length_mla = 0"),
        "{e}"
    );
    // gpt-oss: windowed blocks need a window; one head size; no separate SWA RoPE base.
    let mut h = hp_gpt_oss();
    h.swa.window = 0;
    let e = h.validate().unwrap_err();
    assert!(
        e.contains("gpt-oss.attention.sliding_window = 0: must be positive"),
        "{e}"
    );
    let mut h = hp_gpt_oss();
    h.swa.rope_freq_base = 5000.0;
    let e = h.validate().unwrap_err();
    assert!(e.contains("gpt-oss.rope.freq_base_swa = 5000"), "{e}");
    // qwen2moe: the query projection is [n_embd, n_embd].
    let mut h = hp_qwen2moe();
    h.head_dim_k = 32;
    h.head_dim_v = 32;
    h.n_rot = 32;
    let e = h.validate().unwrap_err();
    assert!(e.contains("qwen2moe.attention.key_length = 32: times qwen2moe.attention.head_count = 4 must make qwen2moe.embedding_length = 256"), "{e}");
}

/// What offload moves off the GPU is decided by role ([`Role::is_resident`]); the host store
/// (`experts::offload`) holds the routed-expert matrices by name. The two must name the same
/// tensors in every table, or a tensor would be in neither place (or in both).
#[test]
fn non_resident_roles_are_exactly_the_offload_stores_matrices() {
    use crate::experts::offload::MATS;
    for a in ARCHS.iter().map(|a| &a.spec) {
        for t in a.tensor_specs() {
            let stored = MATS
                .iter()
                .any(|m| t.name == format!("blk.{{}}.{m}.weight"));
            assert_eq!(
                !t.role.is_resident(),
                stored,
                "{}: {} has role {:?}",
                a.name,
                t.name,
                t.role
            );
        }
    }
}

/// The tree we link knows every architecture we build and every one of [`super::NOT_BUILT`] (a pin
/// move that dropped or renamed one fails here), and a file of an architecture we do not build
/// is refused naming it: with our reason for the new MoE ones, as llama.cpp's for the rest, as
/// unknown to both otherwise.
#[test]
fn not_built_architectures_are_refused_by_name() {
    let named = |arch: &str| {
        let mut m = MapMeta::new(arch, &[]);
        m.0.insert("general.architecture".into(), GgufValue::Str(arch.into()));
        m
    };
    let known = ggml_sys::LLAMA_ARCH_NAMES;
    for a in ARCHS {
        assert!(
            known.contains(&a.spec.name),
            "{} not in llama.cpp's list",
            a.spec.name
        );
    }
    for (name, why) in super::NOT_BUILT {
        assert!(known.contains(name), "{name} not in llama.cpp's list");
        assert!(
            super::by_name(name).is_none(),
            "{name} is built, not NOT_BUILT"
        );
        let err = super::hparams(&named(name)).err().expect("refused");
        assert!(
            err.contains(&format!("{name:?} is a MoE architecture of llama.cpp"))
                && err.contains(why),
            "{err}"
        );
    }
    let err = super::hparams(&named("qwen35moe")).err().expect("refused");
    assert!(err.contains("\"qwen35moe\" runs in llama.cpp"), "{err}");
    let err = super::hparams(&named("no-such-arch"))
        .err()
        .expect("refused");
    assert!(err.contains("does not know it either"), "{err}");
}
