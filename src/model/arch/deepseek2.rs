//! deepseek2 — DeepSeek-V2 / V2-Lite / V2.5 / V3 / V3.1 / R1, Kimi-K2, GLM-4.7-Flash and other
//! DeepSeek-style files. Multi-head latent attention (MLA): q either low-rank
//! (`attn_q_a` → `attn_q_a_norm` → `attn_q_b`, q_lora_rank > 0) or plain `attn_q` in the "lite"
//! variants (q_lora_rank forced to 0, see `Hparams::from_meta`); the kv path compresses to
//! `kv_lora_rank` plus a shared rotary key (`attn_kv_a_mqa`, `attn_kv_a_norm`) and decompresses
//! per head through `attn_k_b`/`attn_v_b` (files with `key_length_mla`/`value_length_mla`) or
//! the legacy fused `attn_kv_b`. YaRN RoPE on the `n_rot` rotary dims only.
//! The first `leading_dense_block_count` blocks are dense (`ffn_{gate,up,down}`, `n_ff`); the
//! rest are MoE: routed experts of width `n_ff_exp`, a shared expert of width
//! `n_ff_exp * n_expert_shared` (ungated), softmax (V2) or sigmoid (V3+, GLM-4.7-Flash) gating with
//! the optional `exp_probs_b` selection bias, group-limited routing (`expert_group_count`),
//! `expert_weights_norm`/`expert_weights_scale`. Output projection may be tied.
//! MTP: V3-family files may carry `nextn_predict_layers` trailing blocks that hold a full block
//! plus the `nextn.*` tensors; decode never runs them and llama.cpp accepts files without them.
//! Source: llama.cpp `src/models/deepseek2.cpp` (`load_arch_hparams`, `load_arch_tensors`).
use super::{ArchSpec, Layers::*, Role::*, TensorSpec};

#[rustfmt::skip]
pub static DEEPSEEK2: ArchSpec = ArchSpec {
    name: "deepseek2",
    description: "DeepSeek-V2/V3 (MLA)",
    // attention.q_lora_rank is required too, except in "lite" files (checked in from_meta).
    required_keys: &["attention.layer_norm_rms_epsilon", "attention.kv_lora_rank", "expert_feed_forward_length", "expert_shared_count", "expert_count", "expert_used_count"],
    tensors: &[
        TensorSpec { name: "token_embd.weight", role: Embedding, layers: Global, shape: |h, _| vec![h.n_embd, h.n_vocab], required: true },
        TensorSpec { name: "output_norm.weight", role: Norm, layers: Global, shape: |h, _| vec![h.n_embd], required: true },
        TensorSpec { name: "output.weight", role: Output, layers: Global, shape: |h, _| vec![h.n_embd, h.n_vocab], required: false },
        TensorSpec { name: "blk.{}.attn_norm.weight", role: Norm, layers: All, shape: |h, _| vec![h.n_embd], required: true },
        TensorSpec { name: "blk.{}.attn_q_a_norm.weight", role: Norm, layers: Where(|h, _| h.q_lora_rank > 0), shape: |h, _| vec![h.q_lora_rank], required: true },
        TensorSpec { name: "blk.{}.attn_kv_a_norm.weight", role: Norm, layers: All, shape: |h, _| vec![h.kv_lora_rank], required: true },
        TensorSpec { name: "blk.{}.attn_q_a.weight", role: Attention, layers: Where(|h, _| h.q_lora_rank > 0), shape: |h, _| vec![h.n_embd, h.q_lora_rank], required: true },
        TensorSpec { name: "blk.{}.attn_q_b.weight", role: Attention, layers: Where(|h, _| h.q_lora_rank > 0), shape: |h, _| vec![h.q_lora_rank, h.n_head * h.mla_head_dim_k()], required: true },
        TensorSpec { name: "blk.{}.attn_q.weight", role: Attention, layers: Where(|h, _| h.q_lora_rank == 0), shape: |h, _| vec![h.n_embd, h.n_head * h.mla_head_dim_k()], required: true },
        TensorSpec { name: "blk.{}.attn_kv_a_mqa.weight", role: Attention, layers: All, shape: |h, _| vec![h.n_embd, h.kv_lora_rank + h.n_rot], required: true },
        TensorSpec { name: "blk.{}.attn_k_b.weight", role: Attention, layers: Where(|h, _| h.is_mla()), shape: |h, _| vec![h.mla_qk_nope(), h.kv_lora_rank, h.n_head], required: true },
        TensorSpec { name: "blk.{}.attn_v_b.weight", role: Attention, layers: Where(|h, _| h.is_mla()), shape: |h, _| vec![h.kv_lora_rank, h.mla_head_dim_v(), h.n_head], required: true },
        TensorSpec { name: "blk.{}.attn_kv_b.weight", role: Attention, layers: Where(|h, _| !h.is_mla()), shape: |h, _| vec![h.kv_lora_rank, h.n_head * (h.mla_qk_nope() + h.mla_head_dim_v())], required: true },
        TensorSpec { name: "blk.{}.attn_output.weight", role: Attention, layers: All, shape: |h, _| vec![h.n_head * h.mla_head_dim_v(), h.n_embd], required: true },
        TensorSpec { name: "blk.{}.ffn_norm.weight", role: Norm, layers: All, shape: |h, _| vec![h.n_embd], required: true },
        TensorSpec { name: "blk.{}.ffn_gate.weight", role: DenseFfn, layers: Dense, shape: |h, _| vec![h.n_embd, h.n_ff], required: true },
        TensorSpec { name: "blk.{}.ffn_down.weight", role: DenseFfn, layers: Dense, shape: |h, _| vec![h.n_ff, h.n_embd], required: true },
        TensorSpec { name: "blk.{}.ffn_up.weight", role: DenseFfn, layers: Dense, shape: |h, _| vec![h.n_embd, h.n_ff], required: true },
        TensorSpec { name: "blk.{}.ffn_gate_inp.weight", role: Router, layers: Moe, shape: |h, _| vec![h.n_embd, h.n_expert], required: true },
        TensorSpec { name: "blk.{}.exp_probs_b.bias", role: Router, layers: Moe, shape: |h, _| vec![h.n_expert], required: false },
        TensorSpec { name: "blk.{}.ffn_down_exps.weight", role: RoutedExperts, layers: Moe, shape: |h, _| vec![h.n_ff_exp, h.n_embd, h.n_expert], required: true },
        TensorSpec { name: "blk.{}.ffn_gate_exps.weight", role: RoutedExperts, layers: Moe, shape: |h, _| vec![h.n_embd, h.n_ff_exp, h.n_expert], required: true },
        TensorSpec { name: "blk.{}.ffn_up_exps.weight", role: RoutedExperts, layers: Moe, shape: |h, _| vec![h.n_embd, h.n_ff_exp, h.n_expert], required: true },
        TensorSpec { name: "blk.{}.ffn_gate_shexp.weight", role: SharedExperts, layers: Moe, shape: |h, _| vec![h.n_embd, h.n_ff_exp * h.n_expert_shared], required: true },
        TensorSpec { name: "blk.{}.ffn_down_shexp.weight", role: SharedExperts, layers: Moe, shape: |h, _| vec![h.n_ff_exp * h.n_expert_shared, h.n_embd], required: true },
        TensorSpec { name: "blk.{}.ffn_up_shexp.weight", role: SharedExperts, layers: Moe, shape: |h, _| vec![h.n_embd, h.n_ff_exp * h.n_expert_shared], required: true },
        // MTP ("nextn") blocks: the block above plus these.
        TensorSpec { name: "blk.{}.nextn.eh_proj.weight", role: Other, layers: Where(|h, il| h.is_nextn_layer(il)), shape: |h, _| vec![2 * h.n_embd, h.n_embd], required: false },
        TensorSpec { name: "blk.{}.nextn.enorm.weight", role: Other, layers: Where(|h, il| h.is_nextn_layer(il)), shape: |h, _| vec![h.n_embd], required: false },
        TensorSpec { name: "blk.{}.nextn.hnorm.weight", role: Other, layers: Where(|h, il| h.is_nextn_layer(il)), shape: |h, _| vec![h.n_embd], required: false },
        TensorSpec { name: "blk.{}.nextn.embed_tokens.weight", role: Other, layers: Where(|h, il| h.is_nextn_layer(il)), shape: |h, _| vec![h.n_embd, h.n_vocab], required: false },
        TensorSpec { name: "blk.{}.nextn.shared_head_head.weight", role: Other, layers: Where(|h, il| h.is_nextn_layer(il)), shape: |h, _| vec![h.n_embd, h.n_vocab], required: false },
        TensorSpec { name: "blk.{}.nextn.shared_head_norm.weight", role: Other, layers: Where(|h, il| h.is_nextn_layer(il)), shape: |h, _| vec![h.n_embd], required: false },
    ],
    nextn_blocks_optional: true,
};
