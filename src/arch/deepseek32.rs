//! deepseek32 — DeepSeek-V3.2 (-Exp, -Speciale): DeepSeek-V3's multi-head latent attention
//! (always the absorbed form with `attn_k_b`/`attn_v_b`, always a low-rank q) made sparse by a
//! "lightning indexer" per block (`indexer.attn_q_b` on the low-rank q, `indexer.attn_k` +
//! LayerNorm `indexer.k_norm`, `indexer.proj` head weights): each token attends only to the
//! `attention.indexer.top_k` cached positions the indexer scores highest (`blocks::dsa`).
//! Everything else is deepseek2's V3 layout: leading dense blocks, then routed experts
//! (`expert_gating_func` required; sigmoid with the optional `exp_probs_b` bias in the real
//! models) plus an ungated shared expert; YaRN RoPE on the `n_rot` rotary dims; tied output
//! allowed. MTP: trailing `nextn_predict_layers` blocks (dense MLA, no indexer at draft time)
//! are optional in the file as in deepseek2 and never run.
//! Source: llama.cpp `src/models/deepseek32.cpp` (`load_arch_hparams`, `load_arch_tensors`,
//! graph), `src/llama-kv-cache-dsa.cpp` (the indexer's key cache).
use super::rows::{ATTN_NORM, DENSE_FFN, EMBED_OUTPUT_TIED, FFN_NORM, NEXTN, ROUTER};
use super::{deepseek2, Arch, KvLayout, Synth};
use crate::ggml::Tensor;
use crate::gguf::Metadata;
use crate::graph::blocks::attention::ROPE_NORMAL;
use crate::graph::blocks::dsa;
use crate::graph::blocks::mla::MlaOpts;
use crate::graph::blocks::{ExpertAct, MoeOpts};
use crate::graph::GraphBuilder;
use crate::model::arch::Rules;
use crate::model::hparams::RopeScaling;
use crate::model::{ArchSpec, Hparams, Layers::*, Role::*, TensorSpec};

#[rustfmt::skip]
pub static DEEPSEEK32: Arch = Arch {
    spec: ArchSpec {
        name: "deepseek32",
        description: "DeepSeek-V3.2 (MLA + DSA sparse attention)",
        required_keys: &[
            "attention.layer_norm_rms_epsilon", "attention.q_lora_rank", "attention.kv_lora_rank", "expert_feed_forward_length",
            "expert_shared_count", "expert_count", "expert_used_count", "expert_gating_func", "attention.indexer.head_count",
            "attention.indexer.key_length", "attention.indexer.top_k",
        ],
        tensors: &[
            EMBED_OUTPUT_TIED,
            &[
                ATTN_NORM,
                TensorSpec { name: "blk.{}.attn_q_a_norm.weight", role: Norm, layers: All, shape: |h, _| vec![h.mla.q_lora_rank], required: true },
                TensorSpec { name: "blk.{}.attn_kv_a_norm.weight", role: Norm, layers: All, shape: |h, _| vec![h.mla.kv_lora_rank], required: true },
                TensorSpec { name: "blk.{}.attn_q_a.weight", role: Attention, layers: All, shape: |h, _| vec![h.n_embd, h.mla.q_lora_rank], required: true },
                TensorSpec { name: "blk.{}.attn_q_b.weight", role: Attention, layers: All, shape: |h, _| vec![h.mla.q_lora_rank, h.n_head * h.mla_head_dim_k()], required: true },
                TensorSpec { name: "blk.{}.attn_kv_a_mqa.weight", role: Attention, layers: All, shape: |h, _| vec![h.n_embd, h.mla.kv_lora_rank + h.n_rot], required: true },
                TensorSpec { name: "blk.{}.attn_k_b.weight", role: Attention, layers: All, shape: |h, _| vec![h.mla_qk_nope(), h.mla.kv_lora_rank, h.n_head], required: true },
                TensorSpec { name: "blk.{}.attn_v_b.weight", role: Attention, layers: All, shape: |h, _| vec![h.mla.kv_lora_rank, h.mla_head_dim_v(), h.n_head], required: true },
                TensorSpec { name: "blk.{}.attn_output.weight", role: Attention, layers: All, shape: |h, _| vec![h.n_head * h.mla_head_dim_v(), h.n_embd], required: true },
                FFN_NORM,
                TensorSpec { name: "blk.{}.indexer.k_norm.weight", role: Norm, layers: All, shape: |h, _| vec![h.indexer.head_dim], required: true },
                TensorSpec { name: "blk.{}.indexer.k_norm.bias", role: Norm, layers: All, shape: |h, _| vec![h.indexer.head_dim], required: true },
                TensorSpec { name: "blk.{}.indexer.proj.weight", role: Attention, layers: All, shape: |h, _| vec![h.n_embd, h.indexer.n_head], required: true },
                TensorSpec { name: "blk.{}.indexer.attn_k.weight", role: Attention, layers: All, shape: |h, _| vec![h.n_embd, h.indexer.head_dim], required: true },
                TensorSpec { name: "blk.{}.indexer.attn_q_b.weight", role: Attention, layers: All, shape: |h, _| vec![h.mla.q_lora_rank, h.indexer.n_head * h.indexer.head_dim], required: true },
            ],
            DENSE_FFN,
            &[
                ROUTER,
                TensorSpec { name: "blk.{}.exp_probs_b.bias", role: Router, layers: Moe, shape: |h, _| vec![h.n_expert], required: false },
                TensorSpec { name: "blk.{}.ffn_gate_exps.weight", role: RoutedExperts, layers: Moe, shape: |h, _| vec![h.n_embd, h.n_ff_exp, h.n_expert], required: true },
                TensorSpec { name: "blk.{}.ffn_down_exps.weight", role: RoutedExperts, layers: Moe, shape: |h, _| vec![h.n_ff_exp, h.n_embd, h.n_expert], required: true },
                TensorSpec { name: "blk.{}.ffn_up_exps.weight", role: RoutedExperts, layers: Moe, shape: |h, _| vec![h.n_embd, h.n_ff_exp, h.n_expert], required: true },
                TensorSpec { name: "blk.{}.ffn_gate_shexp.weight", role: SharedExperts, layers: Moe, shape: |h, _| vec![h.n_embd, h.n_ff_exp * h.n_expert_shared], required: true },
                TensorSpec { name: "blk.{}.ffn_down_shexp.weight", role: SharedExperts, layers: Moe, shape: |h, _| vec![h.n_ff_exp * h.n_expert_shared, h.n_embd], required: true },
                TensorSpec { name: "blk.{}.ffn_up_shexp.weight", role: SharedExperts, layers: Moe, shape: |h, _| vec![h.n_embd, h.n_ff_exp * h.n_expert_shared], required: true },
            ],
            // MTP ("nextn") blocks: the block above plus these.
            NEXTN,
        ],
        nextn_blocks_optional: true,
        rules: Rules {
            yarn_mscale_all_dim: true,
            derive,
            check,
            ..Rules::NONE
        },
        unsupported,
        dense: false,
    },
    graph: Some(build),
    quantized_kv: false,
    nodes_per_block: super::NODES_PER_BLOCK,
    kv: KvLayout {
        k_only: false,
        extra: dsa::cache_tensors,
        seq_state: None,
    },
    synth: Synth {
        pre_tokenizer: "deepseek-v3",
        aliases: &["deepseek_v32", "deepseek-v3.2", "deepseek_v3_2"],
        tiny: Some(tiny),
        ..Synth::NONE
    },
};

/// `expert_gating_func` is required and must name a function: libllama's MoE aborts on 0 (none).
fn derive(h: &mut Hparams, meta: &dyn Metadata) -> Result<(), String> {
    let key = h.key("expert_gating_func");
    if meta.get_u64(&key) == Some(0) {
        return Err(format!(
            "{key} = 0: DeepSeek-V3.2 needs a gating function (1 softmax, 2 sigmoid, 3 softmax \
             over the selected experts)"
        ));
    }
    Ok(())
}

/// The MLA widths (absorbed form only), the shared expert and the indexer's sizes.
fn check(h: &Hparams) -> Result<(), String> {
    for (s, v) in [
        ("attention.q_lora_rank", h.mla.q_lora_rank),
        ("attention.kv_lora_rank", h.mla.kv_lora_rank),
        ("expert_shared_count", h.n_expert_shared),
        ("attention.indexer.head_count", h.indexer.n_head),
        ("attention.indexer.top_k", h.indexer.top_k),
    ] {
        if v == 0 {
            return Err(format!("{}: must be positive", h.key_is(s, 0)));
        }
    }
    if !h.is_mla() {
        return Err(format!(
            "{} and {}: DeepSeek-V3.2 files give both (its attention is MLA with split \
             attn_k_b/attn_v_b)",
            h.key_is("attention.key_length_mla", h.mla.head_dim_k),
            h.key_is("attention.value_length_mla", h.mla.head_dim_v)
        ));
    }
    let (k, v) = (h.mla.kv_lora_rank + h.n_rot, h.mla.kv_lora_rank);
    if h.head_dim_k != k || h.head_dim_v != v {
        return Err(format!(
            "{} and {}: the latent key and value heads must be {} + {} = {k} and {v}",
            h.key_is("attention.key_length", h.head_dim_k),
            h.key_is("attention.value_length", h.head_dim_v),
            h.key_is("attention.kv_lora_rank", h.mla.kv_lora_rank),
            h.key_is("rope.dimension_count", h.n_rot)
        ));
    }
    if h.mla_head_dim_k() <= h.n_rot {
        return Err(format!(
            "{}: must exceed {} (an MLA key head has a non-rotary part)",
            h.key_is("attention.key_length_mla", h.mla_head_dim_k()),
            h.key_is("rope.dimension_count", h.n_rot)
        ));
    }
    // libllama rotates the indexer's q and k by one Hadamard matrix of the head size: a power
    // of two from 64 up; the head holds the rotary dims first.
    let d = h.indexer.head_dim;
    if d < 64 || !d.is_power_of_two() || d < h.n_rot {
        return Err(format!(
            "{}: must be a power of two, at least 64 and at least {}",
            h.key_is("attention.indexer.key_length", d),
            h.key_is("rope.dimension_count", h.n_rot)
        ));
    }
    Ok(())
}

/// What the graph does not build.
fn unsupported(h: &Hparams) -> Option<String> {
    // The YaRN attention factor: our rope rule (`Rules::yarn_mscale_all_dim`) takes
    // mscale = mscale_all_dim as libllama does for deepseek2 only; for deepseek32 libllama keeps
    // mscale = 1. The two agree when mscale_all_dim (the stored multiplier / 0.1) is 0 or 1,
    // which DeepSeek-V3.2's config gives (1.0).
    let log_mul = h.rope_yarn_log_mul / 0.1;
    if h.rope_scaling == RopeScaling::Yarn && log_mul != 0.0 && log_mul != 1.0 {
        return Some(format!(
            "{}.rope.scaling.yarn_log_multiplier = {}: YaRN with mscale_all_dim other than 1 \
             (multiplier 0.1) is not built for deepseek32",
            h.arch.name, h.rope_yarn_log_mul
        ));
    }
    (h.attn_temp_scale != 0.0).then(|| {
        format!(
            "{}.attention.temperature_scale: attention temperature tuning is not built for \
             deepseek32",
            h.arch.name
        )
    })
}

/// deepseek2's V3 graph with each block's MLA attending through its indexer's sparse mask
/// (`blocks::dsa`): leading dense SwiGLU blocks, then routed experts plus an ungated shared
/// expert. Trailing MTP (nextn) blocks are not run. Mirrors llama.cpp `src/models/deepseek32.cpp`.
fn build<'a>(g: &GraphBuilder<'a>) -> Tensor<'a> {
    let mla = MlaOpts {
        rope_mode: ROPE_NORMAL,
    };
    let moe = MoeOpts::new(g.hp, ExpertAct::Swiglu, g.hp.expert_weights_scale);
    g.pre_norm_decoder_with(
        |g, h, il| {
            g.mla_attention_masked(h, il, &mla, &|qr| {
                // `check` requires q_lora_rank > 0: the low-rank q always exists.
                let qr = qr.expect("deepseek32 has a low-rank q");
                // Each row keeps at most the top-k positions (libllama bounds its flash
                // attention the same way).
                let k = (g.hp.indexer.top_k as usize).min(g.batch.n_kv());
                (g.dsa_mask(h, qr, il), k)
            })
        },
        |g, h, il| g.ffn(h, il, &moe),
    )
}

/// deepseek2's tiny V3 shape (sigmoid, group-limited routing, one dense lead block) with the
/// indexer: 32 heads of 128 (64 rotary), top-k 8, so that prompts of more than 8 tokens make the
/// sparse selection drop positions. 32 heads as the real model's 64 make an exactly-zero score
/// (every head's q·k negative under the ReLU) rare; with 4 heads about one position in 16 scored
/// exactly 0, and top-k then broke those ties by cache row, so a sequence's picks depended on
/// where its rows sat (multi-sequence batches, `tests/batch.rs`; libllama's unified cache alike).
fn tiny() -> Hparams {
    // DeepSeek-V2/V3's tiny preset, plus the indexer.
    let mut hp = Hparams {
        arch: &DEEPSEEK32.spec,
        ..deepseek2::tiny()
    };
    hp.indexer.n_head = 32;
    hp.indexer.head_dim = 128;
    hp.indexer.top_k = 8;
    hp
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::GgufValue;
    use crate::model::hparams::Gating;
    use std::collections::HashMap;
    use std::path::Path;

    /// The tiny preset's metadata as a file would hold it, with `edit` applied.
    struct Meta(HashMap<String, GgufValue>);

    impl Metadata for Meta {
        fn get(&self, key: &str) -> Option<&GgufValue> {
            self.0.get(key)
        }
        fn origin(&self, _key: &str) -> (&Path, Option<u64>) {
            (Path::new("<map>"), None)
        }
    }

    fn load(edit: &[(&str, Option<GgufValue>)]) -> Result<Hparams, String> {
        let mut m: HashMap<String, GgufValue> = crate::synth::hparams_kv(&tiny())
            .into_iter()
            .map(|(k, v)| (format!("deepseek32.{k}"), v))
            .collect();
        m.insert(
            "general.architecture".into(),
            GgufValue::Str("deepseek32".into()),
        );
        for (k, v) in edit {
            let k = format!("deepseek32.{k}");
            match v {
                Some(v) => m.insert(k, v.clone()),
                None => m.remove(&k),
            };
        }
        Hparams::from_meta(&DEEPSEEK32.spec, &Meta(m))
    }

    #[test]
    fn tiny_round_trips_and_has_the_indexer() {
        let h = load(&[]).unwrap();
        let t = tiny();
        assert_eq!(
            (h.indexer.n_head, h.indexer.head_dim, h.indexer.top_k),
            (t.indexer.n_head, t.indexer.head_dim, t.indexer.top_k)
        );
        assert_eq!(h.gating, Gating::Sigmoid);
        assert!(unsupported(&h).is_none());
        let shapes: HashMap<String, Vec<u64>> = DEEPSEEK32
            .spec
            .expected_tensors(&h)
            .map(|(n, s, b)| (n, (s.shape)(&h, b.unwrap_or(0))))
            .collect();
        assert_eq!(shapes["blk.1.indexer.attn_q_b.weight"], vec![256, 32 * 128]);
        assert_eq!(shapes["blk.1.indexer.attn_k.weight"], vec![256, 128]);
        assert_eq!(shapes["blk.1.indexer.proj.weight"], vec![256, 32]);
        assert_eq!(shapes["blk.1.indexer.k_norm.bias"], vec![128]);
        assert_eq!(shapes["blk.0.attn_k_b.weight"], vec![128, 512, 4]);
        // The cache: one indexer key row per position and block, and the rotation.
        let extra = dsa::cache_tensors(&h, 64, 1);
        assert_eq!(extra.len(), h.n_layer + 1);
        assert_eq!(extra[0].ne, vec![128, 64]);
        assert_eq!(
            extra[h.n_layer].init.as_ref().map(Vec::len),
            Some(128 * 128)
        );
    }

    #[test]
    fn refusals_name_the_key() {
        let u = |v: u64| Some(GgufValue::U32(v as u32));
        for (key, v, want) in [
            ("expert_gating_func", u(0), "deepseek32.expert_gating_func"),
            ("expert_gating_func", None, "deepseek32.expert_gating_func"),
            (
                "attention.indexer.top_k",
                u(0),
                "deepseek32.attention.indexer.top_k",
            ),
            (
                "attention.indexer.top_k",
                None,
                "deepseek32.attention.indexer.top_k",
            ),
            (
                "attention.indexer.key_length",
                u(96),
                "deepseek32.attention.indexer.key_length",
            ),
            (
                "attention.indexer.key_length",
                u(32),
                "deepseek32.attention.indexer.key_length",
            ),
            (
                "attention.indexer.head_count",
                u(0),
                "deepseek32.attention.indexer.head_count",
            ),
            (
                "attention.q_lora_rank",
                None,
                "deepseek32.attention.q_lora_rank",
            ),
            (
                "attention.key_length_mla",
                None,
                "deepseek32.attention.key_length_mla",
            ),
        ] {
            let e = load(&[(key, v.clone())]).unwrap_err();
            assert!(e.contains(want), "{key} = {v:?}: {e}");
        }
        // YaRN with mscale_all_dim != 1: libllama's deepseek32 keeps mscale 1, our rule does not.
        let h = load(&[(
            "rope.scaling.yarn_log_multiplier",
            Some(GgufValue::F32(0.0707)),
        )])
        .unwrap();
        let e = unsupported(&h).unwrap();
        assert!(
            e.contains("deepseek32.rope.scaling.yarn_log_multiplier"),
            "{e}"
        );
        let h = load(&[(
            "rope.scaling.yarn_log_multiplier",
            Some(GgufValue::F32(0.0)),
        )])
        .unwrap();
        assert!(unsupported(&h).is_none());
    }
}
