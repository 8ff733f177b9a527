//! qwen2moe — Qwen1.5-MoE-A2.7B, Qwen2-57B-A14B: GQA with q/k/v biases (optional in llama.cpp,
//! present in the real files), NeoX RoPE, every block MoE with softmax gating (top-k weights not
//! renormalised), plus one always-on shared expert scaled by `sigmoid(ffn_gate_inp_shexp · x)`.
//! Expert width `n_ff_exp` falls back to `n_ff / n_expert_used`; shared width `n_ff_shexp`
//! (`expert_shared_feed_forward_length`) falls back to `n_ff`. Output projection not tied.
//! Source: llama.cpp `src/models/qwen2moe.cpp` (`load_arch_tensors`).
use super::{ArchSpec, Hparams, Layers::*, Role::*, TensorSpec};

/// Shared-expert width: `expert_shared_feed_forward_length`, else `feed_forward_length`.
fn n_ff_shexp(h: &Hparams) -> u64 {
    if h.n_ff_shexp > 0 {
        h.n_ff_shexp
    } else {
        h.n_ff
    }
}

#[rustfmt::skip]
pub static QWEN2MOE: ArchSpec = ArchSpec {
    name: "qwen2moe",
    description: "Qwen2-MoE (Qwen1.5-MoE, Qwen2-57B-A14B)",
    required_keys: &["attention.layer_norm_rms_epsilon", "expert_count", "expert_used_count"],
    tensors: &[
        TensorSpec { name: "token_embd.weight", role: Embedding, layers: Global, shape: |h, _| vec![h.n_embd, h.n_vocab], required: true },
        TensorSpec { name: "output_norm.weight", role: Norm, layers: Global, shape: |h, _| vec![h.n_embd], required: true },
        TensorSpec { name: "output.weight", role: Output, layers: Global, shape: |h, _| vec![h.n_embd, h.n_vocab], required: true },
        TensorSpec { name: "blk.{}.attn_norm.weight", role: Norm, layers: All, shape: |h, _| vec![h.n_embd], required: true },
        // q is n_embd wide; k and v are n_embd_gqa = n_embd_v_gqa wide (llama.cpp).
        TensorSpec { name: "blk.{}.attn_q.weight", role: Attention, layers: All, shape: |h, _| vec![h.n_embd, h.n_embd], required: true },
        TensorSpec { name: "blk.{}.attn_k.weight", role: Attention, layers: All, shape: |h, _| vec![h.n_embd, h.v_dim()], required: true },
        TensorSpec { name: "blk.{}.attn_v.weight", role: Attention, layers: All, shape: |h, _| vec![h.n_embd, h.v_dim()], required: true },
        TensorSpec { name: "blk.{}.attn_q.bias", role: Attention, layers: All, shape: |h, _| vec![h.n_embd], required: false },
        TensorSpec { name: "blk.{}.attn_k.bias", role: Attention, layers: All, shape: |h, _| vec![h.v_dim()], required: false },
        TensorSpec { name: "blk.{}.attn_v.bias", role: Attention, layers: All, shape: |h, _| vec![h.v_dim()], required: false },
        TensorSpec { name: "blk.{}.attn_output.weight", role: Attention, layers: All, shape: |h, _| vec![h.n_embd, h.n_embd], required: true },
        TensorSpec { name: "blk.{}.ffn_norm.weight", role: Norm, layers: All, shape: |h, _| vec![h.n_embd], required: true },
        TensorSpec { name: "blk.{}.ffn_gate_inp.weight", role: Router, layers: Moe, shape: |h, _| vec![h.n_embd, h.n_expert], required: true },
        TensorSpec { name: "blk.{}.ffn_gate_exps.weight", role: RoutedExperts, layers: Moe, shape: |h, _| vec![h.n_embd, h.n_ff_exp, h.n_expert], required: true },
        TensorSpec { name: "blk.{}.ffn_down_exps.weight", role: RoutedExperts, layers: Moe, shape: |h, _| vec![h.n_ff_exp, h.n_embd, h.n_expert], required: true },
        TensorSpec { name: "blk.{}.ffn_up_exps.weight", role: RoutedExperts, layers: Moe, shape: |h, _| vec![h.n_embd, h.n_ff_exp, h.n_expert], required: true },
        TensorSpec { name: "blk.{}.ffn_gate_inp_shexp.weight", role: SharedExperts, layers: Moe, shape: |h, _| vec![h.n_embd], required: true },
        TensorSpec { name: "blk.{}.ffn_gate_shexp.weight", role: SharedExperts, layers: Moe, shape: |h, _| vec![h.n_embd, n_ff_shexp(h)], required: true },
        TensorSpec { name: "blk.{}.ffn_down_shexp.weight", role: SharedExperts, layers: Moe, shape: |h, _| vec![n_ff_shexp(h), h.n_embd], required: true },
        TensorSpec { name: "blk.{}.ffn_up_shexp.weight", role: SharedExperts, layers: Moe, shape: |h, _| vec![h.n_embd, n_ff_shexp(h)], required: true },
    ],
    nextn_blocks_optional: false,
};
