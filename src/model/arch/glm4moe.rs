//! glm4moe — GLM-4.5 / GLM-4.5-Air / GLM-4.6 / GLM-4.7, Solar Open: GQA with q/k/v biases
//! (optional in llama.cpp, present in the real files) and optional per-head q/k RMSNorm (the
//! 355B models), partial NeoX RoPE (`rope.dimension_count` of the head), pre-FFN norm named
//! `post_attention_norm` (no `ffn_norm`). The first `leading_dense_block_count` blocks are dense
//! (`ffn_{gate,up,down}`, `n_ff`); the rest MoE with sigmoid gating (the default when
//! `expert_gating_func` is absent), a required `exp_probs_b` selection bias, top-k weights
//! normalised / scaled per `expert_weights_norm`/`expert_weights_scale`, and `expert_shared_count`
//! shared experts of width `n_ff_exp * n_expert_shared` (ungated). Output projection may be tied.
//! MTP: the last `nextn_predict_layers` block(s) are full blocks (MoE tensors included) plus the
//! `nextn.*` tensors; decode never runs them and llama.cpp accepts files without them.
//! Source: llama.cpp `src/models/glm4-moe.cpp` (`load_arch_hparams`, `load_arch_tensors`).
use super::{ArchSpec, Layers::*, Role::*, TensorSpec};

#[rustfmt::skip]
pub static GLM4MOE: ArchSpec = ArchSpec {
    name: "glm4moe",
    description: "GLM-4.5/4.6/4.7 MoE",
    required_keys: &["expert_feed_forward_length", "attention.layer_norm_rms_epsilon", "expert_shared_count", "expert_count", "expert_used_count"],
    tensors: &[
        TensorSpec { name: "token_embd.weight", role: Embedding, layers: Global, shape: |h, _| vec![h.n_embd, h.n_vocab], required: true },
        TensorSpec { name: "output_norm.weight", role: Norm, layers: Global, shape: |h, _| vec![h.n_embd], required: true },
        TensorSpec { name: "output.weight", role: Output, layers: Global, shape: |h, _| vec![h.n_embd, h.n_vocab], required: false },
        TensorSpec { name: "blk.{}.attn_norm.weight", role: Norm, layers: All, shape: |h, _| vec![h.n_embd], required: true },
        TensorSpec { name: "blk.{}.attn_q.weight", role: Attention, layers: All, shape: |h, _| vec![h.n_embd, h.q_dim()], required: true },
        TensorSpec { name: "blk.{}.attn_k.weight", role: Attention, layers: All, shape: |h, _| vec![h.n_embd, h.k_dim()], required: true },
        TensorSpec { name: "blk.{}.attn_v.weight", role: Attention, layers: All, shape: |h, _| vec![h.n_embd, h.v_dim()], required: true },
        TensorSpec { name: "blk.{}.attn_q.bias", role: Attention, layers: All, shape: |h, _| vec![h.q_dim()], required: false },
        TensorSpec { name: "blk.{}.attn_k.bias", role: Attention, layers: All, shape: |h, _| vec![h.k_dim()], required: false },
        TensorSpec { name: "blk.{}.attn_v.bias", role: Attention, layers: All, shape: |h, _| vec![h.v_dim()], required: false },
        TensorSpec { name: "blk.{}.attn_output.weight", role: Attention, layers: All, shape: |h, _| vec![h.q_dim(), h.n_embd], required: true },
        TensorSpec { name: "blk.{}.attn_q_norm.weight", role: Norm, layers: All, shape: |h, _| vec![h.head_dim_k], required: false },
        TensorSpec { name: "blk.{}.attn_k_norm.weight", role: Norm, layers: All, shape: |h, _| vec![h.head_dim_k], required: false },
        TensorSpec { name: "blk.{}.post_attention_norm.weight", role: Norm, layers: All, shape: |h, _| vec![h.n_embd], required: true },
        TensorSpec { name: "blk.{}.ffn_gate_inp.weight", role: Router, layers: Moe, shape: |h, _| vec![h.n_embd, h.n_expert], required: true },
        TensorSpec { name: "blk.{}.exp_probs_b.bias", role: Router, layers: Moe, shape: |h, _| vec![h.n_expert], required: true },
        TensorSpec { name: "blk.{}.ffn_gate_exps.weight", role: RoutedExperts, layers: Moe, shape: |h, _| vec![h.n_embd, h.n_ff_exp, h.n_expert], required: true },
        TensorSpec { name: "blk.{}.ffn_down_exps.weight", role: RoutedExperts, layers: Moe, shape: |h, _| vec![h.n_ff_exp, h.n_embd, h.n_expert], required: true },
        TensorSpec { name: "blk.{}.ffn_up_exps.weight", role: RoutedExperts, layers: Moe, shape: |h, _| vec![h.n_embd, h.n_ff_exp, h.n_expert], required: true },
        TensorSpec { name: "blk.{}.ffn_gate_shexp.weight", role: SharedExperts, layers: Where(|h, il| h.is_moe_layer(il) && h.n_expert_shared > 0), shape: |h, _| vec![h.n_embd, h.n_ff_exp * h.n_expert_shared], required: true },
        TensorSpec { name: "blk.{}.ffn_down_shexp.weight", role: SharedExperts, layers: Where(|h, il| h.is_moe_layer(il) && h.n_expert_shared > 0), shape: |h, _| vec![h.n_ff_exp * h.n_expert_shared, h.n_embd], required: true },
        TensorSpec { name: "blk.{}.ffn_up_shexp.weight", role: SharedExperts, layers: Where(|h, il| h.is_moe_layer(il) && h.n_expert_shared > 0), shape: |h, _| vec![h.n_embd, h.n_ff_exp * h.n_expert_shared], required: true },
        TensorSpec { name: "blk.{}.ffn_gate.weight", role: DenseFfn, layers: Dense, shape: |h, _| vec![h.n_embd, h.n_ff], required: true },
        TensorSpec { name: "blk.{}.ffn_down.weight", role: DenseFfn, layers: Dense, shape: |h, _| vec![h.n_ff, h.n_embd], required: true },
        TensorSpec { name: "blk.{}.ffn_up.weight", role: DenseFfn, layers: Dense, shape: |h, _| vec![h.n_embd, h.n_ff], required: true },
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
