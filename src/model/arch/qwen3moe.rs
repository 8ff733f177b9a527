//! qwen3moe — Qwen3-MoE (Qwen3-30B-A3B, Qwen3-235B-A22B): GQA with per-head q/k RMSNorm, NeoX
//! RoPE, every block MoE with softmax gating renormalised over the top-k, no shared expert.
//! `n_ff_exp` falls back to `n_ff / n_expert_used`. Optional q/k/v biases (create_tensor_qkv) are
//! absent from real Qwen3 files.
//! Source: llama.cpp `src/models/qwen3moe.cpp` (`load_arch_tensors`).
use super::{ArchSpec, Layers::*, Role::*, TensorSpec};

#[rustfmt::skip]
pub static QWEN3MOE: ArchSpec = ArchSpec {
    name: "qwen3moe",
    description: "Qwen3-MoE",
    required_keys: &["attention.layer_norm_rms_epsilon", "expert_count", "expert_used_count"],
    tensors: &[
        TensorSpec { name: "token_embd.weight", role: Embedding, layers: Global, shape: |h, _| vec![h.n_embd, h.n_vocab], required: true },
        TensorSpec { name: "output_norm.weight", role: Norm, layers: Global, shape: |h, _| vec![h.n_embd], required: true },
        TensorSpec { name: "output.weight", role: Output, layers: Global, shape: |h, _| vec![h.n_embd, h.n_vocab], required: false },
        TensorSpec { name: "blk.{}.attn_norm.weight", role: Norm, layers: All, shape: |h, _| vec![h.n_embd], required: true },
        TensorSpec { name: "blk.{}.attn_q.weight", role: Attention, layers: All, shape: |h, _| vec![h.n_embd, h.q_dim()], required: true },
        // llama.cpp sizes k and v both as n_embd_gqa = n_embd_v_gqa (equal to k_dim for Qwen3).
        TensorSpec { name: "blk.{}.attn_k.weight", role: Attention, layers: All, shape: |h, _| vec![h.n_embd, h.v_dim()], required: true },
        TensorSpec { name: "blk.{}.attn_v.weight", role: Attention, layers: All, shape: |h, _| vec![h.n_embd, h.v_dim()], required: true },
        TensorSpec { name: "blk.{}.attn_q.bias", role: Attention, layers: All, shape: |h, _| vec![h.q_dim()], required: false },
        TensorSpec { name: "blk.{}.attn_k.bias", role: Attention, layers: All, shape: |h, _| vec![h.v_dim()], required: false },
        TensorSpec { name: "blk.{}.attn_v.bias", role: Attention, layers: All, shape: |h, _| vec![h.v_dim()], required: false },
        TensorSpec { name: "blk.{}.attn_output.weight", role: Attention, layers: All, shape: |h, _| vec![h.q_dim(), h.n_embd], required: true },
        TensorSpec { name: "blk.{}.attn_q_norm.weight", role: Norm, layers: All, shape: |h, _| vec![h.head_dim_k], required: true },
        TensorSpec { name: "blk.{}.attn_k_norm.weight", role: Norm, layers: All, shape: |h, _| vec![h.head_dim_k], required: true },
        TensorSpec { name: "blk.{}.ffn_norm.weight", role: Norm, layers: All, shape: |h, _| vec![h.n_embd], required: true },
        TensorSpec { name: "blk.{}.ffn_gate_inp.weight", role: Router, layers: Moe, shape: |h, _| vec![h.n_embd, h.n_expert], required: true },
        TensorSpec { name: "blk.{}.ffn_gate_exps.weight", role: RoutedExperts, layers: Moe, shape: |h, _| vec![h.n_embd, h.n_ff_exp, h.n_expert], required: true },
        TensorSpec { name: "blk.{}.ffn_down_exps.weight", role: RoutedExperts, layers: Moe, shape: |h, _| vec![h.n_ff_exp, h.n_embd, h.n_expert], required: true },
        TensorSpec { name: "blk.{}.ffn_up_exps.weight", role: RoutedExperts, layers: Moe, shape: |h, _| vec![h.n_embd, h.n_ff_exp, h.n_expert], required: true },
    ],
    nextn_blocks_optional: false,
};
