//! minimax-m2 — MiniMax-M2 / M2.1 (230B-A10B): GQA without biases in practice (llama.cpp accepts
//! optional q/k/v biases), RMSNorm over the whole q and k projections (`attn_q_norm` is
//! `n_head * head_dim` wide, `attn_k_norm` `n_head_kv * head_dim`) rather than per head, partial
//! NeoX RoPE. Every block MoE: sigmoid gating (`expert_gating_func`, which llama.cpp requires in
//! practice; assumed sigmoid when absent) with a required `exp_probs_b` selection bias, top-k
//! weights renormalised; no shared expert, no dense blocks. Experts are sized by
//! `feed_forward_length` (`n_ff`), although `expert_feed_forward_length` is a required key.
//! Source: llama.cpp `src/models/minimax-m2.cpp` (`load_arch_tensors`).
use super::{ArchSpec, Layers::*, Role::*, TensorSpec};

#[rustfmt::skip]
pub static MINIMAX_M2: ArchSpec = ArchSpec {
    name: "minimax-m2",
    description: "MiniMax-M2",
    required_keys: &["attention.layer_norm_rms_epsilon", "expert_feed_forward_length", "expert_count", "expert_used_count"],
    tensors: &[
        TensorSpec { name: "token_embd.weight", role: Embedding, layers: Global, shape: |h, _| vec![h.n_embd, h.n_vocab], required: true },
        TensorSpec { name: "output_norm.weight", role: Norm, layers: Global, shape: |h, _| vec![h.n_embd], required: true },
        TensorSpec { name: "output.weight", role: Output, layers: Global, shape: |h, _| vec![h.n_embd, h.n_vocab], required: true },
        // k and v are n_embd_gqa = n_embd_v_gqa wide (llama.cpp).
        TensorSpec { name: "blk.{}.attn_q.weight", role: Attention, layers: All, shape: |h, _| vec![h.n_embd, h.q_dim()], required: true },
        TensorSpec { name: "blk.{}.attn_k.weight", role: Attention, layers: All, shape: |h, _| vec![h.n_embd, h.v_dim()], required: true },
        TensorSpec { name: "blk.{}.attn_v.weight", role: Attention, layers: All, shape: |h, _| vec![h.n_embd, h.v_dim()], required: true },
        TensorSpec { name: "blk.{}.attn_q.bias", role: Attention, layers: All, shape: |h, _| vec![h.q_dim()], required: false },
        TensorSpec { name: "blk.{}.attn_k.bias", role: Attention, layers: All, shape: |h, _| vec![h.v_dim()], required: false },
        TensorSpec { name: "blk.{}.attn_v.bias", role: Attention, layers: All, shape: |h, _| vec![h.v_dim()], required: false },
        TensorSpec { name: "blk.{}.attn_output.weight", role: Attention, layers: All, shape: |h, _| vec![h.q_dim(), h.n_embd], required: true },
        TensorSpec { name: "blk.{}.attn_norm.weight", role: Norm, layers: All, shape: |h, _| vec![h.n_embd], required: true },
        TensorSpec { name: "blk.{}.attn_q_norm.weight", role: Norm, layers: All, shape: |h, _| vec![h.q_dim()], required: true },
        TensorSpec { name: "blk.{}.attn_k_norm.weight", role: Norm, layers: All, shape: |h, _| vec![h.k_dim()], required: true },
        TensorSpec { name: "blk.{}.ffn_norm.weight", role: Norm, layers: All, shape: |h, _| vec![h.n_embd], required: true },
        TensorSpec { name: "blk.{}.ffn_gate_inp.weight", role: Router, layers: Moe, shape: |h, _| vec![h.n_embd, h.n_expert], required: true },
        TensorSpec { name: "blk.{}.ffn_gate_exps.weight", role: RoutedExperts, layers: Moe, shape: |h, _| vec![h.n_embd, h.n_ff, h.n_expert], required: true },
        TensorSpec { name: "blk.{}.ffn_down_exps.weight", role: RoutedExperts, layers: Moe, shape: |h, _| vec![h.n_ff, h.n_embd, h.n_expert], required: true },
        TensorSpec { name: "blk.{}.ffn_up_exps.weight", role: RoutedExperts, layers: Moe, shape: |h, _| vec![h.n_embd, h.n_ff, h.n_expert], required: true },
        TensorSpec { name: "blk.{}.exp_probs_b.bias", role: Router, layers: Moe, shape: |h, _| vec![h.n_expert], required: true },
    ],
    nextn_blocks_optional: false,
};
