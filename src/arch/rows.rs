//! Rows several tensor tables share, as named groups: same tensors, same order and same shapes as
//! llama.cpp's `load_arch_tensors` creates them in each architecture that uses a group.
use crate::model::{Layers::*, Role::*, TensorSpec};

/// The token embedding.
#[rustfmt::skip]
const TOKEN_EMBD: TensorSpec = TensorSpec { name: "token_embd.weight", role: Embedding, layers: Global, shape: |h, _| vec![h.n_embd, h.n_vocab], required: true };

/// The output norm.
#[rustfmt::skip]
const OUTPUT_NORM: TensorSpec = TensorSpec { name: "output_norm.weight", role: Norm, layers: Global, shape: |h, _| vec![h.n_embd], required: true };

/// The pre-attention RMSNorm.
#[rustfmt::skip]
pub const ATTN_NORM: TensorSpec = TensorSpec { name: "blk.{}.attn_norm.weight", role: Norm, layers: All, shape: |h, _| vec![h.n_embd], required: true };

/// The pre-FFN RMSNorm.
#[rustfmt::skip]
pub const FFN_NORM: TensorSpec = TensorSpec { name: "blk.{}.ffn_norm.weight", role: Norm, layers: All, shape: |h, _| vec![h.n_embd], required: true };

/// The router (`ffn_gate_inp`).
#[rustfmt::skip]
pub const ROUTER: TensorSpec = TensorSpec { name: "blk.{}.ffn_gate_inp.weight", role: Router, layers: Moe, shape: |h, _| vec![h.n_embd, h.n_expert], required: true };

/// The embedding, the output norm and an `output` projection a file may leave out (tied: llama.cpp
/// then reuses `token_embd`).
#[rustfmt::skip]
pub const EMBED_OUTPUT_TIED: &[TensorSpec] = &[
    TOKEN_EMBD,
    OUTPUT_NORM,
    TensorSpec { name: "output.weight", role: Output, layers: Global, shape: |h, _| vec![h.n_embd, h.n_vocab], required: false },
];

/// The embedding, the output norm and a required `output` projection.
#[rustfmt::skip]
pub const EMBED_OUTPUT: &[TensorSpec] = &[
    TOKEN_EMBD,
    OUTPUT_NORM,
    TensorSpec { name: "output.weight", role: Output, layers: Global, shape: |h, _| vec![h.n_embd, h.n_vocab], required: true },
];

/// q/k/v projections with their optional biases (`create_tensor_qkv`), and the output
/// projection: q `n_head * head_dim_k`, k `n_head_kv * head_dim_k`, v `n_head_kv * head_dim_v`.
#[rustfmt::skip]
pub const QKV_O: &[TensorSpec] = &[
    TensorSpec { name: "blk.{}.attn_q.weight", role: Attention, layers: All, shape: |h, _| vec![h.n_embd, h.q_dim()], required: true },
    TensorSpec { name: "blk.{}.attn_k.weight", role: Attention, layers: All, shape: |h, _| vec![h.n_embd, h.k_dim()], required: true },
    TensorSpec { name: "blk.{}.attn_v.weight", role: Attention, layers: All, shape: |h, _| vec![h.n_embd, h.v_dim()], required: true },
    TensorSpec { name: "blk.{}.attn_q.bias", role: Attention, layers: All, shape: |h, _| vec![h.q_dim()], required: false },
    TensorSpec { name: "blk.{}.attn_k.bias", role: Attention, layers: All, shape: |h, _| vec![h.k_dim()], required: false },
    TensorSpec { name: "blk.{}.attn_v.bias", role: Attention, layers: All, shape: |h, _| vec![h.v_dim()], required: false },
    TensorSpec { name: "blk.{}.attn_output.weight", role: Attention, layers: All, shape: |h, _| vec![h.q_dim(), h.n_embd], required: true },
];

/// [`QKV_O`] with k sized like v: llama.cpp sizes both as `n_embd_gqa` = `n_embd_v_gqa` (one head
/// size for keys and values, `Rules::one_head_size`).
#[rustfmt::skip]
pub const QKV_O_GQA: &[TensorSpec] = &[
    TensorSpec { name: "blk.{}.attn_q.weight", role: Attention, layers: All, shape: |h, _| vec![h.n_embd, h.q_dim()], required: true },
    TensorSpec { name: "blk.{}.attn_k.weight", role: Attention, layers: All, shape: |h, _| vec![h.n_embd, h.v_dim()], required: true },
    TensorSpec { name: "blk.{}.attn_v.weight", role: Attention, layers: All, shape: |h, _| vec![h.n_embd, h.v_dim()], required: true },
    TensorSpec { name: "blk.{}.attn_q.bias", role: Attention, layers: All, shape: |h, _| vec![h.q_dim()], required: false },
    TensorSpec { name: "blk.{}.attn_k.bias", role: Attention, layers: All, shape: |h, _| vec![h.v_dim()], required: false },
    TensorSpec { name: "blk.{}.attn_v.bias", role: Attention, layers: All, shape: |h, _| vec![h.v_dim()], required: false },
    TensorSpec { name: "blk.{}.attn_output.weight", role: Attention, layers: All, shape: |h, _| vec![h.q_dim(), h.n_embd], required: true },
];

/// [`QKV_O_GQA`] with a square query projection: q and the output are `n_embd` wide
/// (`Rules::square_q`).
#[rustfmt::skip]
pub const QKV_O_SQUARE: &[TensorSpec] = &[
    TensorSpec { name: "blk.{}.attn_q.weight", role: Attention, layers: All, shape: |h, _| vec![h.n_embd, h.n_embd], required: true },
    TensorSpec { name: "blk.{}.attn_k.weight", role: Attention, layers: All, shape: |h, _| vec![h.n_embd, h.v_dim()], required: true },
    TensorSpec { name: "blk.{}.attn_v.weight", role: Attention, layers: All, shape: |h, _| vec![h.n_embd, h.v_dim()], required: true },
    TensorSpec { name: "blk.{}.attn_q.bias", role: Attention, layers: All, shape: |h, _| vec![h.n_embd], required: false },
    TensorSpec { name: "blk.{}.attn_k.bias", role: Attention, layers: All, shape: |h, _| vec![h.v_dim()], required: false },
    TensorSpec { name: "blk.{}.attn_v.bias", role: Attention, layers: All, shape: |h, _| vec![h.v_dim()], required: false },
    TensorSpec { name: "blk.{}.attn_output.weight", role: Attention, layers: All, shape: |h, _| vec![h.n_embd, h.n_embd], required: true },
];

/// The routed experts' gate, down and up matrices, `expert_feed_forward_length` wide.
#[rustfmt::skip]
pub const EXPERTS: &[TensorSpec] = &[
    TensorSpec { name: "blk.{}.ffn_gate_exps.weight", role: RoutedExperts, layers: Moe, shape: |h, _| vec![h.n_embd, h.n_ff_exp, h.n_expert], required: true },
    TensorSpec { name: "blk.{}.ffn_down_exps.weight", role: RoutedExperts, layers: Moe, shape: |h, _| vec![h.n_ff_exp, h.n_embd, h.n_expert], required: true },
    TensorSpec { name: "blk.{}.ffn_up_exps.weight", role: RoutedExperts, layers: Moe, shape: |h, _| vec![h.n_embd, h.n_ff_exp, h.n_expert], required: true },
];

/// The routed experts' gate, down and up matrices, `feed_forward_length` wide.
#[rustfmt::skip]
pub const EXPERTS_FF: &[TensorSpec] = &[
    TensorSpec { name: "blk.{}.ffn_gate_exps.weight", role: RoutedExperts, layers: Moe, shape: |h, _| vec![h.n_embd, h.n_ff, h.n_expert], required: true },
    TensorSpec { name: "blk.{}.ffn_down_exps.weight", role: RoutedExperts, layers: Moe, shape: |h, _| vec![h.n_ff, h.n_embd, h.n_expert], required: true },
    TensorSpec { name: "blk.{}.ffn_up_exps.weight", role: RoutedExperts, layers: Moe, shape: |h, _| vec![h.n_embd, h.n_ff, h.n_expert], required: true },
];

/// The SwiGLU FFN of a dense block: gate, down and up, `feed_forward_length` wide.
#[rustfmt::skip]
pub const DENSE_FFN: &[TensorSpec] = &[
    TensorSpec { name: "blk.{}.ffn_gate.weight", role: DenseFfn, layers: Dense, shape: |h, _| vec![h.n_embd, h.n_ff], required: true },
    TensorSpec { name: "blk.{}.ffn_down.weight", role: DenseFfn, layers: Dense, shape: |h, _| vec![h.n_ff, h.n_embd], required: true },
    TensorSpec { name: "blk.{}.ffn_up.weight", role: DenseFfn, layers: Dense, shape: |h, _| vec![h.n_embd, h.n_ff], required: true },
];

/// The MTP ("nextn") tensors of a trailing block, on top of a full block (`Hparams::is_nextn_layer`).
#[rustfmt::skip]
pub const NEXTN: &[TensorSpec] = &[
    TensorSpec { name: "blk.{}.nextn.eh_proj.weight", role: Other, layers: Where(|h, il| h.is_nextn_layer(il)), shape: |h, _| vec![2 * h.n_embd, h.n_embd], required: false },
    TensorSpec { name: "blk.{}.nextn.enorm.weight", role: Other, layers: Where(|h, il| h.is_nextn_layer(il)), shape: |h, _| vec![h.n_embd], required: false },
    TensorSpec { name: "blk.{}.nextn.hnorm.weight", role: Other, layers: Where(|h, il| h.is_nextn_layer(il)), shape: |h, _| vec![h.n_embd], required: false },
    TensorSpec { name: "blk.{}.nextn.embed_tokens.weight", role: Other, layers: Where(|h, il| h.is_nextn_layer(il)), shape: |h, _| vec![h.n_embd, h.n_vocab], required: false },
    TensorSpec { name: "blk.{}.nextn.shared_head_head.weight", role: Other, layers: Where(|h, il| h.is_nextn_layer(il)), shape: |h, _| vec![h.n_embd, h.n_vocab], required: false },
    TensorSpec { name: "blk.{}.nextn.shared_head_norm.weight", role: Other, layers: Where(|h, il| h.is_nextn_layer(il)), shape: |h, _| vec![h.n_embd], required: false },
];
