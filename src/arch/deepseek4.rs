//! deepseek4 — DeepSeek-V4. Hyper-connections: `hyper_connection.count` residual streams, mixed
//! before attention and before the FFN by Sinkhorn-normalised matrices (`hc_{attn,ffn}_{fn,base,
//! scale}`) and collapsed at the output (`output_hc_*`). Attention: low-rank q (`attn_q_a` →
//! `attn_q_a_norm` → `attn_q_b`), one shared latent KV head of the full head size (`attn_kv` +
//! `attn_kv_a_norm`), per-head sinks, NORM RoPE, a sliding window in every block plus per-block
//! KV compression (`attention.compress_ratios`: 0 none, 4 compressed KV with a sparse top-k
//! indexer `indexer.*`/`indexer_compressor_*`, 128 compressed KV; `attn_compressor_*`), and a
//! grouped low-rank output projection (`attn_output_a` per group, then `attn_output_b`).
//! Every block MoE: sqrt-softplus gating, weights normalised/scaled; the first
//! `hash_layer_count` blocks pick experts by token id (`ffn_gate_tid2eid`), the rest by router
//! top-k with the `exp_probs_b` bias (`exp_probs_b_vl` optional, vision inputs); shared experts
//! of width `n_ff_exp * n_expert_shared`; SwiGLU clamps. No dense blocks, no tied output.
//! MTP: trailing `nextn_predict_layers` blocks are full blocks plus `nextn.*`; llama.cpp drops the
//! count when `blk.{n}.nextn.eh_proj.weight` is absent (those blocks then load as ordinary ones),
//! so their block tensors stay required. Head size is llama.cpp's `n_embd_head_k()` of block 0,
//! a sliding-window block (`attention.key_length_swa`, default `attention.key_length`).
//! Source: llama.cpp `src/models/deepseek4.cpp` (`load_arch_hparams`, `load_arch_tensors`).
use super::rows::{ATTN_NORM, EMBED_OUTPUT, EXPERTS, FFN_NORM, NEXTN, ROUTER};
use super::{preset_base, tiny_of, with_heads, Arch, KvLayout, SeqState, Synth};
use crate::ggml::{GgmlType, Tensor};
use crate::gguf::Metadata;
use crate::graph::blocks::dsv4::HcSite;
use crate::graph::blocks::{ExpertAct, MoeOpts};
use crate::graph::kv::Extra;
use crate::graph::step::ArchStep;
use crate::graph::{dsv4, GraphBuilder};
use crate::model::arch::Rules;
use crate::model::hparams::{Gating, RopeScaling};
use crate::model::{ArchSpec, Hparams, Layers::*, Role::*, TensorSpec};

/// Head size (llama.cpp `n_embd_head_k()`, block 0).
fn hd(h: &Hparams) -> u64 {
    h.head_dim_k_at(0)
}

/// KV compression ratio of block `il` (0 = none).
fn ratio(h: &Hparams, il: usize) -> u64 {
    h.dsv4.compress_ratios.get(il).copied().unwrap_or(0)
}

/// Compressor width multiplier: ratio-4 blocks compress two overlapping windows.
fn coff(h: &Hparams, il: usize) -> u64 {
    if ratio(h, il) == 4 {
        2
    } else {
        1
    }
}

/// Hyper-connection mixing width: `(2 + hc_mult) * hc_mult`.
fn hc_mix(h: &Hparams) -> u64 {
    (2 + h.dsv4.hc_mult) * h.dsv4.hc_mult
}

#[rustfmt::skip]
pub static DEEPSEEK4: Arch = Arch {
    spec: ArchSpec {
        name: "deepseek4",
        description: "DeepSeek-V4",
        required_keys: &[
            "attention.layer_norm_rms_epsilon", "attention.q_lora_rank", "attention.sliding_window", "expert_feed_forward_length",
            "expert_shared_count", "expert_weights_scale", "expert_weights_norm", "swiglu_clamp_exp", "attention.indexer.head_count",
            "attention.indexer.key_length", "attention.indexer.top_k", "attention.output_group_count", "attention.output_lora_rank",
            "attention.compress_rope_freq_base", "hyper_connection.count", "hyper_connection.sinkhorn_iterations",
            "hyper_connection.epsilon", "hash_layer_count", "attention.compress_ratios", "expert_gating_func", "expert_count", "expert_used_count",
        ],
        tensors: &[
            EMBED_OUTPUT,
            &[
                TensorSpec { name: "output_hc_fn.weight", role: Other, layers: Global, shape: |h, _| vec![h.dsv4.hc_mult * h.n_embd, h.dsv4.hc_mult], required: true },
                TensorSpec { name: "output_hc_base.weight", role: Other, layers: Global, shape: |h, _| vec![h.dsv4.hc_mult], required: true },
                TensorSpec { name: "output_hc_scale.weight", role: Other, layers: Global, shape: |_, _| vec![1], required: true },
                ATTN_NORM,
                TensorSpec { name: "blk.{}.attn_sinks.weight", role: Attention, layers: All, shape: |h, _| vec![h.n_head], required: true },
                TensorSpec { name: "blk.{}.attn_q_a.weight", role: Attention, layers: All, shape: |h, _| vec![h.n_embd, h.mla.q_lora_rank], required: true },
                TensorSpec { name: "blk.{}.attn_q_a_norm.weight", role: Norm, layers: All, shape: |h, _| vec![h.mla.q_lora_rank], required: true },
                TensorSpec { name: "blk.{}.attn_q_b.weight", role: Attention, layers: All, shape: |h, _| vec![h.mla.q_lora_rank, h.n_head * hd(h)], required: true },
                TensorSpec { name: "blk.{}.attn_kv.weight", role: Attention, layers: All, shape: |h, _| vec![h.n_embd, hd(h)], required: true },
                TensorSpec { name: "blk.{}.attn_kv_a_norm.weight", role: Norm, layers: All, shape: |h, _| vec![hd(h)], required: true },
                // The file's 2-D shape; llama.cpp views it as [.., o_lora_rank, o_groups] (TENSOR_ALLOW_RESHAPE).
                TensorSpec { name: "blk.{}.attn_output_a.weight", role: Attention, layers: All, shape: |h, _| vec![h.n_head * hd(h) / h.dsv4.o_group_count, h.dsv4.o_lora_rank * h.dsv4.o_group_count], required: true },
                TensorSpec { name: "blk.{}.attn_output_b.weight", role: Attention, layers: All, shape: |h, _| vec![h.dsv4.o_group_count * h.dsv4.o_lora_rank, h.n_embd], required: true },
                TensorSpec { name: "blk.{}.hc_attn_fn.weight", role: Other, layers: All, shape: |h, _| vec![h.dsv4.hc_mult * h.n_embd, hc_mix(h)], required: true },
                TensorSpec { name: "blk.{}.hc_attn_base.weight", role: Other, layers: All, shape: |h, _| vec![hc_mix(h)], required: true },
                TensorSpec { name: "blk.{}.hc_attn_scale.weight", role: Other, layers: All, shape: |_, _| vec![3], required: true },
                TensorSpec { name: "blk.{}.hc_ffn_fn.weight", role: Other, layers: All, shape: |h, _| vec![h.dsv4.hc_mult * h.n_embd, hc_mix(h)], required: true },
                TensorSpec { name: "blk.{}.hc_ffn_base.weight", role: Other, layers: All, shape: |h, _| vec![hc_mix(h)], required: true },
                TensorSpec { name: "blk.{}.hc_ffn_scale.weight", role: Other, layers: All, shape: |_, _| vec![3], required: true },
                TensorSpec { name: "blk.{}.attn_compressor_kv.weight", role: Attention, layers: Where(|h, il| ratio(h, il) != 0), shape: |h, il| vec![h.n_embd, coff(h, il) * hd(h)], required: true },
                TensorSpec { name: "blk.{}.attn_compressor_gate.weight", role: Attention, layers: Where(|h, il| ratio(h, il) != 0), shape: |h, il| vec![h.n_embd, coff(h, il) * hd(h)], required: true },
                TensorSpec { name: "blk.{}.attn_compressor_ape.weight", role: Attention, layers: Where(|h, il| ratio(h, il) != 0), shape: |h, il| vec![coff(h, il) * hd(h), ratio(h, il)], required: true },
                TensorSpec { name: "blk.{}.attn_compressor_norm.weight", role: Norm, layers: Where(|h, il| ratio(h, il) != 0), shape: |h, _| vec![hd(h)], required: true },
                TensorSpec { name: "blk.{}.indexer.proj.weight", role: Attention, layers: Where(|h, il| ratio(h, il) == 4), shape: |h, _| vec![h.n_embd, h.indexer.n_head], required: true },
                TensorSpec { name: "blk.{}.indexer.attn_q_b.weight", role: Attention, layers: Where(|h, il| ratio(h, il) == 4), shape: |h, _| vec![h.mla.q_lora_rank, h.indexer.n_head * h.indexer.head_dim], required: true },
                TensorSpec { name: "blk.{}.indexer_compressor_kv.weight", role: Attention, layers: Where(|h, il| ratio(h, il) == 4), shape: |h, _| vec![h.n_embd, 2 * h.indexer.head_dim], required: true },
                TensorSpec { name: "blk.{}.indexer_compressor_gate.weight", role: Attention, layers: Where(|h, il| ratio(h, il) == 4), shape: |h, _| vec![h.n_embd, 2 * h.indexer.head_dim], required: true },
                TensorSpec { name: "blk.{}.indexer_compressor_ape.weight", role: Attention, layers: Where(|h, il| ratio(h, il) == 4), shape: |h, il| vec![2 * h.indexer.head_dim, ratio(h, il)], required: true },
                TensorSpec { name: "blk.{}.indexer_compressor_norm.weight", role: Norm, layers: Where(|h, il| ratio(h, il) == 4), shape: |h, _| vec![h.indexer.head_dim], required: true },
                ROUTER,
                TensorSpec { name: "blk.{}.ffn_gate_tid2eid.weight", role: Router, layers: Where(|h, il| h.is_moe_layer(il) && il < h.dsv4.hash_layer_count), shape: |h, _| vec![h.n_expert_used, h.n_vocab], required: true },
                TensorSpec { name: "blk.{}.exp_probs_b.bias", role: Router, layers: Where(|h, il| h.is_moe_layer(il) && il >= h.dsv4.hash_layer_count), shape: |h, _| vec![h.n_expert], required: true },
                TensorSpec { name: "blk.{}.exp_probs_b_vl.bias", role: Router, layers: Moe, shape: |h, _| vec![h.n_expert], required: false },
                FFN_NORM,
            ],
            EXPERTS,
            &[
                TensorSpec { name: "blk.{}.ffn_gate_shexp.weight", role: SharedExperts, layers: Moe, shape: |h, _| vec![h.n_embd, h.n_ff_exp * h.n_expert_shared], required: true },
                TensorSpec { name: "blk.{}.ffn_down_shexp.weight", role: SharedExperts, layers: Moe, shape: |h, _| vec![h.n_ff_exp * h.n_expert_shared, h.n_embd], required: true },
                TensorSpec { name: "blk.{}.ffn_up_shexp.weight", role: SharedExperts, layers: Moe, shape: |h, _| vec![h.n_embd, h.n_ff_exp * h.n_expert_shared], required: true },
                // MTP ("nextn") blocks: the block above plus these.
            ],
            NEXTN,
        ],
        rules: Rules {
            mtp_needs_probe: true,
            derive,
            check,
            ..Rules::NONE
        },
        ..ArchSpec::NONE
    },
    graph: Some(build),
    quantized_kv: false,
    // Hyper-connections, compressors and the indexer: ~200 nodes per ratio-4 block (96 per
    // block overflowed the context at 21 blocks).
    nodes_per_block: 320,
    kv: KvLayout {
        k_only: true,
        extra: cache_tensors,
        seq_state: Some(SeqState {
            what: "compressor state (DeepSeek-V4's compressed blocks)",
            kept: |h| !dsv4::ratios(&h.dsv4.compress_ratios).is_empty(),
            plan: |h, spans, n, rings, n_ctx| {
                ArchStep::compressors(dsv4::step_plans(
                    &h.dsv4.compress_ratios,
                    spans,
                    n,
                    rings,
                    n_ctx, // the rows `cache_tensors` sized the compressed caches for
                ))
            },
        }),
    },
    synth: Synth {
        pre_tokenizer: "deepseek-v3",
        tiny: Some(tiny),
        ..Synth::NONE
    },
};

/// What every DeepSeek-V4 model shares (DeepSeek-V4-Flash's config.json, see
/// `synth::presets`): one latent KV head, sqrt-softplus routing scaled by 1.5, four Sinkhorn-mixed
/// residual streams, SwiGLU clamped at 10, YaRN on the compressed blocks' RoPE (base 160000).
pub fn family() -> Hparams {
    {
        let mut hp = Hparams {
            n_head_kv: 1,
            n_expert_shared: 1,
            gating: Gating::SqrtSoftplus,
            expert_weights_norm: true,
            expert_weights_scale: 1.5,
            rope_freq_base: 10000.0,
            rope_scaling: RopeScaling::Yarn,
            rope_scaling_factor: 16.0,
            ..preset_base(&DEEPSEEK4)
        };
        hp.dsv4.compress_rope_freq_base = 160000.0;
        hp.dsv4.hc_mult = 4;
        hp.dsv4.hc_sinkhorn_iters = 20;
        hp.dsv4.hc_eps = 1e-6;
        hp.dsv4.swiglu_clamp_exp = 10.0;
        hp.dsv4.swiglu_clamp_shexp = 10.0;
        hp
    }
}

/// `h` with its per-block facts: every block windowed (llama.cpp sets it; `derive` does on load).
pub fn with_blocks(mut h: Hparams, compress_ratios: Vec<u64>) -> Hparams {
    h.swa.layers = vec![true; h.n_layer];
    h.dsv4.compress_ratios = compress_ratios;
    h
}

/// Five blocks covering every kind the graph builds: ratios 0, 4, 128, 4, 0 (the ratio-4 blocks
/// with the indexer), the first two hash-routed (one of them compressed), the rest bias-routed.
/// A 64-token window and an indexer top-k of 8 so that a prompt of a few hundred tokens leaves
/// the window, fills ratio-128 rows and makes the sparse selection drop compressed rows; YaRN
/// with an original context of 256. Head 256 wide (64 rotary), indexer heads 128: every matrix
/// row is a multiple of 256, so each quant type applies. A variant must keep a ratio-4 block:
/// libllama 0.1.161 dies (SIGFPE in the DSV4 KV cache's constructor) on a file without one
/// (every block window-only, or ratios 0 and 128 only); ratios 0 and 4 only it runs.
/// 32 indexer heads: a compressed row scores exactly 0 when every head's `relu(q·k)` is 0
/// (odds 2^-heads with random weights), and two such rows tie in the top-k, which ggml breaks
/// by cache row, so the same sequence in other KV pages could keep another row; with 4 heads
/// that happened (tests/batch.rs), with 32 (as with V4-Flash's 64) it does not.
fn tiny() -> Hparams {
    let h = {
        let mut hp = Hparams {
            n_layer: 5,
            n_ctx_train: 4096,
            n_ctx_orig_yarn: 256,
            n_rot: 64,
            n_ff_exp: 256,
            ..tiny_of(with_heads(family(), 4, 1, 256))
        };
        hp.mla.q_lora_rank = 256;
        hp.swa.window = 64;
        hp.indexer.n_head = 32;
        hp.indexer.head_dim = 128;
        hp.indexer.top_k = 8;
        hp.dsv4.o_group_count = 2;
        hp.dsv4.o_lora_rank = 128;
        hp.dsv4.hash_layer_count = 2;
        hp
    };
    with_blocks(h, vec![0, 4, 128, 4, 0])
}

/// Sqrt-softplus scoring, a sliding window in every block, the per-block compression ratios.
fn derive(h: &mut Hparams, meta: &dyn Metadata) -> Result<(), String> {
    if h.gating != Gating::SqrtSoftplus {
        return Err(format!(
            "{}: DeepSeek-V4 expects sqrtsoftplus scoring (4)",
            h.key("expert_gating_func")
        ));
    }
    h.swa.layers = vec![true; h.n_layer];
    let key = h.key("attention.compress_ratios");
    let ratios = meta
        .get_u64_array(&key)
        .ok_or_else(|| format!("{key}: array values are not available"))?;
    if ratios.len() < h.n_layer {
        return Err(format!(
            "{key} has {} entries, shorter than {}",
            ratios.len(),
            h.key_is("block_count", h.n_layer as u64)
        ));
    }
    h.dsv4.compress_ratios = ratios;
    Ok(())
}

/// The sizes the attention, hyper-connections and hash routing are built from.
fn check(h: &Hparams) -> Result<(), String> {
    let a = h.arch;
    for (s, v) in [
        ("attention.q_lora_rank", h.mla.q_lora_rank),
        ("attention.output_group_count", h.dsv4.o_group_count),
        ("attention.output_lora_rank", h.dsv4.o_lora_rank),
        ("hyper_connection.count", h.dsv4.hc_mult),
        ("expert_shared_count", h.n_expert_shared),
        ("expert_feed_forward_length", h.n_ff_exp),
    ] {
        if v == 0 {
            return Err(format!("{}: must be positive", h.key_is(s, 0)));
        }
    }
    if !(h.n_head * h.head_dim_k_at(0)).is_multiple_of(h.dsv4.o_group_count) {
        return Err(format!(
            "{}: does not divide n_head * head size = {}",
            h.key_is("attention.output_group_count", h.dsv4.o_group_count),
            h.n_head * h.head_dim_k_at(0)
        ));
    }
    if h.dsv4.compress_ratios.len() < h.n_layer {
        return Err(format!(
            "{a}.attention.compress_ratios has {} entries, shorter than {}",
            h.dsv4.compress_ratios.len(),
            h.key_is("block_count", h.n_layer as u64)
        ));
    }
    if h.head_dim_k_at(0) != h.head_dim_v {
        return Err(format!(
            "{} (head size {}): must equal {} (one shared head is both K and V)",
            h.key_is("attention.key_length", h.head_dim_k),
            h.head_dim_k_at(0),
            h.key_is("attention.value_length", h.head_dim_v)
        ));
    }
    for (s, v) in [
        (
            "hyper_connection.sinkhorn_iterations",
            h.dsv4.hc_sinkhorn_iters,
        ),
        ("attention.sliding_window", h.swa.window),
    ] {
        if v == 0 {
            return Err(format!("{}: must be positive", h.key_is(s, 0)));
        }
    }
    if h.dsv4.compress_ratios.iter().any(|&r| r != 0)
        && !(h.dsv4.compress_rope_freq_base.is_finite() && h.dsv4.compress_rope_freq_base > 0.0)
    {
        return Err(format!(
            "{a}.attention.compress_rope_freq_base = {}: must be a positive number",
            h.dsv4.compress_rope_freq_base
        ));
    }
    if let Some(r) = h
        .dsv4
        .compress_ratios
        .iter()
        .find(|r| ![0, 4, 128].contains(*r))
    {
        return Err(format!(
            "{a}.attention.compress_ratios holds {r}; only 0, 4 and 128 are supported"
        ));
    }
    if h.dsv4.compress_ratios.contains(&4)
        && (h.indexer.n_head == 0 || h.indexer.head_dim == 0 || h.indexer.top_k == 0)
    {
        return Err(format!(
            "{a}: compression ratio 4 needs positive {}, {} and {}",
            h.key_is("attention.indexer.head_count", h.indexer.n_head),
            h.key_is("attention.indexer.key_length", h.indexer.head_dim),
            h.key_is("attention.indexer.top_k", h.indexer.top_k)
        ));
    }
    if h.dsv4.compress_ratios.contains(&4) && !h.indexer.head_dim.is_multiple_of(64) {
        return Err(format!(
            "{}: must be a multiple of 64 (the indexer's Hadamard rotation)",
            h.key_is("attention.indexer.key_length", h.indexer.head_dim)
        ));
    }
    if h.head_dim_k_at(0) < h.n_rot || h.indexer.head_dim < h.n_rot {
        return Err(format!(
            "{}: larger than the head ({}) or the indexer head ({}); RoPE runs on the last \
             n_rot dims of each",
            h.key_is("rope.dimension_count", h.n_rot),
            h.head_dim_k_at(0),
            h.indexer.head_dim
        ));
    }
    if h.dsv4.hash_layer_count > h.n_layer {
        return Err(format!(
            "{}: must be at most {}",
            h.key_is("hash_layer_count", h.dsv4.hash_layer_count as u64),
            h.key_is("block_count", h.n_layer as u64)
        ));
    }
    Ok(())
}

/// DeepSeek-V4's cache beyond the raw K rows (libllama's DSV4 cache, `llama-kv-cache-dsv4.cpp`):
/// per compressed block the compressed K rows (`dsv4_comp_l{il}`, f16) and the compressor state
/// (`dsv4_state_{kv,score}_l{il}`, f32, ring of [`dsv4::state_rows`]); ratio-4 blocks also the
/// lightning indexer's compressed keys (`dsv4_lid_l{il}`) and its compressor state.
fn cache_tensors(h: &Hparams, n_ctx: usize, n_seq: usize) -> Vec<Extra> {
    let mut v = Vec::new();
    let hd = hd(h) as i64;
    if h.dsv4.compress_ratios.contains(&4) {
        // The indexer's keys and queries turn by a Hadamard matrix (libllama always does for
        // DeepSeek's lightning indexers; the scores are unchanged, the f16 rounding is not).
        let n = lid_rotation(h);
        v.push(Extra {
            name: "dsv4_lid_rot".into(),
            ty: GgmlType::F32,
            ne: vec![n as i64, n as i64],
            init: Some(crate::graph::kv::hadamard(n)),
        });
    }
    let mut add = |name: String, ty, ne: Vec<i64>| {
        v.push(Extra {
            name,
            ty,
            ne,
            init: None,
        })
    };
    for il in 0..h.n_layer_decode() {
        let r = ratio(h, il) as usize;
        if r == 0 {
            continue;
        }
        let rows = dsv4::comp_rows(n_ctx, r, 1) as i64;
        let st = (dsv4::state_rows(r) * n_seq) as i64;
        let c = coff(h, il) as i64;
        add(format!("dsv4_comp_l{il}"), GgmlType::F16, vec![hd, rows]);
        add(
            format!("dsv4_state_kv_l{il}"),
            GgmlType::F32,
            vec![c * hd, st],
        );
        add(
            format!("dsv4_state_score_l{il}"),
            GgmlType::F32,
            vec![c * hd, st],
        );
        if r == 4 {
            let d = h.indexer.head_dim as i64;
            add(format!("dsv4_lid_l{il}"), GgmlType::F16, vec![d, rows]);
            add(
                format!("dsv4_lid_state_kv_l{il}"),
                GgmlType::F32,
                vec![2 * d, st],
            );
            add(
                format!("dsv4_lid_state_score_l{il}"),
                GgmlType::F32,
                vec![2 * d, st],
            );
        }
    }
    v
}

/// Size of the indexer's Hadamard rotation: 64, doubled while it divides the indexer's head
/// (libllama's K-rotation rule).
pub fn lid_rotation(h: &Hparams) -> usize {
    let d = h.indexer.head_dim as usize;
    let mut n = 64;
    while d.is_multiple_of(2 * n) {
        n *= 2;
    }
    n
}

/// The forward pass (llama.cpp `llama_model_deepseek4::graph`): the token embedding repeated
/// into `hc` streams; per block the hyper-connection pre-mix, `attn_norm`, the attention, the
/// post-mix, then the same around `ffn_norm` and the MoE (routed experts, by token id in the
/// hash layers, plus the shared expert, both SwiGLU-clamped); the streams collapsed by the output
/// head's mix, `output_norm`, `output`. MTP blocks are not run.
fn build<'a>(g: &GraphBuilder<'a>) -> Tensor<'a> {
    let (ctx, hp) = (g.ctx, g.hp);
    let n_embd = hp.n_embd as i64;
    let hc = hp.dsv4.hc_mult as i64;
    let nt = g.batch.n_tokens as i64;
    let e = ctx.reshape(g.embed(), &[n_embd, 1, nt]).expect("embd 3d");
    let mut x = g.cb(ctx.repeat_4d(e, [n_embd, hc, nt, 1]), "hc_init", -1); // [n_embd, hc, nt]
    let moe = MoeOpts::new(
        hp,
        ExpertAct::SwigluClamp(hp.dsv4.swiglu_clamp_exp),
        hp.expert_weights_scale,
    );
    for il in 0..hp.n_layer_decode() {
        let i = il as i32;
        let m = g.hc_pre(x, il, HcSite::Attn);
        let w = g.blk(il);
        let h = g.rms_norm(m.cur, g.t(w.attn_norm), "attn_norm", i);
        let h = g.dsv4_attention(h, il);
        x = g.cb(g.hc_post(h, x, &m), "hc_attn_post", i);

        let m = g.hc_pre(x, il, HcSite::Ffn);
        // libllama's node order: the FFN mix's post and comb before its weighted sum.
        g.graph.build_forward(m.post);
        g.graph.build_forward(m.comb);
        let h = g.rms_norm(m.cur, g.t(w.ffn_norm), "ffn_norm", i);
        // Hash blocks (the table's tid2eid rows: `il < hash_layer_count`) pick by token id.
        let moe_w = w.moe();
        let selected = moe_w.tid2eid.map(|t| ctx.get_rows(g.t(t), g.batch.tokens));
        let routed = g.moe_selected(h, il, &moe, selected);
        let shexp = moe_w
            .shared
            .expect("deepseek4's table lists shared experts");
        let shared = g.shared_experts(h, il, &shexp, hp.dsv4.swiglu_clamp_shexp);
        let y = g.add(routed, shared, "ffn_out", i);
        x = g.cb(g.hc_post(y, x, &m), "l_last", i);
    }
    g.output_head(g.hc_head(x))
}
