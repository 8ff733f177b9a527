//! gpt-oss — OpenAI gpt-oss-20b / gpt-oss-120b (llama.cpp `LLM_ARCH_OPENAI_MOE`, GGUF name
//! `gpt-oss`): GQA with q/k/v biases (optional in llama.cpp, present in the real files) and an
//! output bias, learned per-head attention sinks (`attn_sinks`), YaRN RoPE; sliding-window
//! attention (`attention.sliding_window`) in alternating blocks (`sliding_window_pattern`, default
//! period 2: even blocks windowed, see `Hparams::swa_layers`), optional `rope.freq_base_swa`.
//! Pre-FFN norm is `post_attention_norm`. Every block MoE: router with bias, softmax over the
//! selected top-k logits (`SoftmaxWeight`), experts with biases and the clamped "SwiGLU-OAI"
//! activation; no shared expert, no dense blocks. MXFP4 experts in the released files.
//! Head size in the shapes is llama.cpp's `n_rot` of block 0 (= head_dim 64 in the real files).
//! Source: llama.cpp `src/models/openai-moe.cpp` (`load_arch_tensors`).
use super::{ArchSpec, Hparams, Layers::*, Role::*, TensorSpec};

/// Per-head q/k/v width: llama.cpp's `LLAMA_LOAD_LOCALS` `n_rot` (block 0's rotary dims).
fn hd(h: &Hparams) -> u64 {
    h.n_rot_at(0)
}

#[rustfmt::skip]
pub static GPT_OSS: ArchSpec = ArchSpec {
    name: "gpt-oss",
    description: "OpenAI gpt-oss",
    required_keys: &["attention.layer_norm_rms_epsilon", "expert_feed_forward_length", "attention.sliding_window", "expert_count", "expert_used_count"],
    tensors: &[
        TensorSpec { name: "token_embd.weight", role: Embedding, layers: Global, shape: |h, _| vec![h.n_embd, h.n_vocab], required: true },
        TensorSpec { name: "output_norm.weight", role: Norm, layers: Global, shape: |h, _| vec![h.n_embd], required: true },
        TensorSpec { name: "output.weight", role: Output, layers: Global, shape: |h, _| vec![h.n_embd, h.n_vocab], required: true },
        TensorSpec { name: "blk.{}.attn_norm.weight", role: Norm, layers: All, shape: |h, _| vec![h.n_embd], required: true },
        TensorSpec { name: "blk.{}.post_attention_norm.weight", role: Norm, layers: All, shape: |h, _| vec![h.n_embd], required: true },
        TensorSpec { name: "blk.{}.attn_q.weight", role: Attention, layers: All, shape: |h, _| vec![h.n_embd, h.n_head * hd(h)], required: true },
        TensorSpec { name: "blk.{}.attn_k.weight", role: Attention, layers: All, shape: |h, _| vec![h.n_embd, h.n_head_kv * hd(h)], required: true },
        TensorSpec { name: "blk.{}.attn_v.weight", role: Attention, layers: All, shape: |h, _| vec![h.n_embd, h.n_head_kv * hd(h)], required: true },
        TensorSpec { name: "blk.{}.attn_q.bias", role: Attention, layers: All, shape: |h, _| vec![h.n_head * hd(h)], required: false },
        TensorSpec { name: "blk.{}.attn_k.bias", role: Attention, layers: All, shape: |h, _| vec![h.n_head_kv * hd(h)], required: false },
        TensorSpec { name: "blk.{}.attn_v.bias", role: Attention, layers: All, shape: |h, _| vec![h.n_head_kv * hd(h)], required: false },
        TensorSpec { name: "blk.{}.attn_output.weight", role: Attention, layers: All, shape: |h, _| vec![h.n_head * hd(h), h.n_embd], required: true },
        TensorSpec { name: "blk.{}.attn_output.bias", role: Attention, layers: All, shape: |h, _| vec![h.n_embd], required: true },
        TensorSpec { name: "blk.{}.attn_sinks.weight", role: Attention, layers: All, shape: |h, _| vec![h.n_head], required: true },
        TensorSpec { name: "blk.{}.ffn_gate_inp.weight", role: Router, layers: Moe, shape: |h, _| vec![h.n_embd, h.n_expert], required: true },
        TensorSpec { name: "blk.{}.ffn_gate_inp.bias", role: Router, layers: Moe, shape: |h, _| vec![h.n_expert], required: true },
        TensorSpec { name: "blk.{}.ffn_gate_exps.weight", role: RoutedExperts, layers: Moe, shape: |h, _| vec![h.n_embd, h.n_ff_exp, h.n_expert], required: true },
        TensorSpec { name: "blk.{}.ffn_down_exps.weight", role: RoutedExperts, layers: Moe, shape: |h, _| vec![h.n_ff_exp, h.n_embd, h.n_expert], required: true },
        TensorSpec { name: "blk.{}.ffn_up_exps.weight", role: RoutedExperts, layers: Moe, shape: |h, _| vec![h.n_embd, h.n_ff_exp, h.n_expert], required: true },
        TensorSpec { name: "blk.{}.ffn_gate_exps.bias", role: RoutedExpertBias, layers: Moe, shape: |h, _| vec![h.n_ff_exp, h.n_expert], required: true },
        TensorSpec { name: "blk.{}.ffn_down_exps.bias", role: RoutedExpertBias, layers: Moe, shape: |h, _| vec![h.n_embd, h.n_expert], required: true },
        TensorSpec { name: "blk.{}.ffn_up_exps.bias", role: RoutedExpertBias, layers: Moe, shape: |h, _| vec![h.n_ff_exp, h.n_expert], required: true },
    ],
    nextn_blocks_optional: false,
};
