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
use super::rows::{ATTN_NORM, EMBED_OUTPUT, EXPERTS, ROUTER};
use super::{preset_base, tiny_of, with_heads, Arch, KvLayout, Synth};
use crate::ggml::Tensor;
use crate::gguf::Metadata;
use crate::graph::blocks::attention::{QkNorm, ROPE_NEOX};
use crate::graph::blocks::{AttnOpts, ExpertAct, MoeOpts};
use crate::graph::GraphBuilder;
use crate::model::arch::{GatingRule, Rules};
use crate::model::hparams::Gating;
use crate::model::{ArchSpec, Hparams, Layers::*, Role::*, TensorSpec};

/// Per-head q/k/v width: llama.cpp's `LLAMA_LOAD_LOCALS` `n_rot` (block 0's rotary dims).
fn hd(h: &Hparams) -> u64 {
    h.n_rot_at(0)
}

#[rustfmt::skip]
pub static GPT_OSS: Arch = Arch {
    spec: ArchSpec {
        name: "gpt-oss",
        description: "OpenAI gpt-oss",
        required_keys: &["attention.layer_norm_rms_epsilon", "expert_feed_forward_length", "attention.sliding_window", "expert_count", "expert_used_count"],
        tensors: &[
            EMBED_OUTPUT,
            &[
                ATTN_NORM,
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
                ROUTER,
                TensorSpec { name: "blk.{}.ffn_gate_inp.bias", role: Router, layers: Moe, shape: |h, _| vec![h.n_expert], required: true },
            ],
            EXPERTS,
            &[
                TensorSpec { name: "blk.{}.ffn_gate_exps.bias", role: RoutedExpertBias, layers: Moe, shape: |h, _| vec![h.n_ff_exp, h.n_expert], required: true },
                TensorSpec { name: "blk.{}.ffn_down_exps.bias", role: RoutedExpertBias, layers: Moe, shape: |h, _| vec![h.n_embd, h.n_expert], required: true },
                TensorSpec { name: "blk.{}.ffn_up_exps.bias", role: RoutedExpertBias, layers: Moe, shape: |h, _| vec![h.n_ff_exp, h.n_expert], required: true },
            ],
        ],
        rules: Rules {
            gating: GatingRule::Fixed(Gating::SoftmaxWeight),
            weights_norm: Some(false),
            one_head_size: true,
            whole_head_rope: true,
            derive,
            check,
            ..Rules::NONE
        },
        ..ArchSpec::NONE
    },
    graph: Some(build),
    quantized_kv: true,
    nodes_per_block: super::NODES_PER_BLOCK,
    kv: KvLayout::PLAIN,
    synth: Synth {
        pre_tokenizer: "gpt-4o",
        aliases: &["gpt_oss", "gptoss"],
        tiny: Some(tiny),
        ..Synth::NONE
    },
};

/// llama.cpp's `load_swa_pattern(ml, 2)`: a per-block array, else a period (default 2) where
/// the last block of each period is full attention; MTP blocks never windowed.
fn derive(h: &mut Hparams, meta: &dyn Metadata) -> Result<(), String> {
    let key = h.key("attention.sliding_window_pattern");
    h.swa.layers = match meta.get_u64_array(&key) {
        Some(v) => (0..h.n_layer)
            .map(|il| v.get(il).is_some_and(|&x| x != 0))
            .collect(),
        None => {
            let p = meta.get_u64(&key).unwrap_or(2) as usize;
            (0..h.n_layer)
                .map(|il| il < h.n_layer_decode() && (p == 0 || il % p < p - 1))
                .collect()
        }
    };
    Ok(())
}

/// Head sizes and RoPE bases of a file with sliding-window blocks.
fn check(h: &Hparams) -> Result<(), String> {
    if !h.swa.layers.contains(&true) {
        return Ok(());
    }
    // The tables size q/k/v by the rotary dims and the graph splits heads by the head
    // sizes, one size for every block: they must agree.
    let n_rot = h.n_rot;
    for (s, v) in [
        ("attention.key_length", h.head_dim_k),
        ("attention.value_length", h.head_dim_v),
        ("attention.key_length_swa", h.swa.head_dim_k),
        ("attention.value_length_swa", h.swa.head_dim_v),
        ("rope.dimension_count_swa", h.swa.n_rot),
    ] {
        if v != 0 && v != n_rot {
            return Err(format!(
                "{} = {v}: must equal {} = {n_rot} (gpt-oss heads are rotated whole, \
                 one head size for every block)",
                h.key(s),
                h.key("rope.dimension_count")
            ));
        }
    }
    let (b, b_swa) = (h.rope_freq_base, h.swa.rope_freq_base);
    if b_swa != 0.0 && b_swa != b {
        return Err(format!(
            "{} = {b_swa}: differs from {} = {b}; a separate RoPE base for \
             sliding-window blocks is not built",
            h.key("rope.freq_base_swa"),
            h.key("rope.freq_base")
        ));
    }
    Ok(())
}

/// GQA with q/k/v/o biases and learned per-head attention sinks, NeoX RoPE, sliding-window
/// attention on every other block, pre-FFN norm named `post_attention_norm`; every block routed
/// experts with a biased router, softmax over the selected experts' logits, expert biases and the
/// clamped SwiGLU (alpha 1.702, limit 7). Mirrors llama.cpp `src/models/openai-moe.cpp`.
fn build<'a>(g: &GraphBuilder<'a>) -> Tensor<'a> {
    let attn = AttnOpts::new(QkNorm::None, ROPE_NEOX);
    let moe = MoeOpts::new(g.hp, ExpertAct::SwigluOai, g.hp.expert_weights_scale);
    g.pre_norm_decoder(&attn, |g, h, il| g.ffn(h, il, &moe))
}

/// What gpt-oss models share (the synth presets start from it).
pub fn family() -> Hparams {
    let h = {
        let mut hp = Hparams {
            n_vocab: 201088,
            n_embd: 2880,
            n_ff: 2880,
            n_ff_exp: 2880,
            n_expert_used: 4,
            n_ctx_train: 131072,
            rope_freq_base: 150000.0,
            rms_eps: 1e-5,
            gating: Gating::SoftmaxWeight,
            ..preset_base(&GPT_OSS)
        };
        hp.swa.window = 128;
        hp
    };
    with_heads(h, 64, 8, 64)
}

fn tiny() -> Hparams {
    {
        let mut hp = Hparams {
            n_ff: 256,
            n_ff_exp: 256,
            n_ctx_train: 4096,
            n_expert_used: 4,
            ..tiny_of(with_heads(family(), 4, 2, 64))
        };
        hp.swa.window = 16;
        hp
    }
}
