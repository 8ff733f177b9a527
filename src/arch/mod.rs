//! The supported architectures, one file each, and their list [`ARCHS`].
//!
//! An architecture is one `&'static` [`Arch`] value: its model facts ([`ArchSpec`]: the tensor
//! table, required metadata keys, the hyper-parameter rules of llama.cpp's `load_arch_hparams`,
//! what its graph does not build, RoPE specifics), its graph builder (`None`: registry only; every
//! architecture listed has one today), its KV layout ([`KvLayout`]) and what the synthesiser needs
//! to make a tiny model of it. Code asks the
//! spec (`hp.arch`, [`of`]) instead of comparing names.
//!
//! This module sits above `model` and `graph` (it names both; neither names it): `model` holds
//! the schema ([`ArchSpec`], [`TensorSpec`](crate::model::TensorSpec)) and `graph` the blocks an
//! architecture's builder strings together.
//!
//! Adding an architecture:
//! 1. a file here, `<name>.rs`, with one `pub static <NAME>: Arch` (its table, built from the
//!    shared row groups of [`rows`] where llama.cpp's rows are the same, its rules, refusals,
//!    graph builder, tiny preset and synth facts) — deepseek2.rs is the fullest example;
//! 2. its `pub mod <name>;` line and its entry in [`ARCHS`] below.
//!
//! The tests that cover every architecture (`tests/parity.rs`, `offload.rs`, `graph_order.rs`,
//! `hparams_fuzz.rs`, `synth_llama.rs`, and the table checks of `arch::tests`, which use each
//! built architecture's tiny preset) iterate over [`built`] and pick the new one up; an
//! architecture without a graph needs a hand-written case in `arch::tests`. A new pre-tokenizer
//! (`tokenizer/pretok.rs`) or graph block (`graph/blocks/`) is code of its own.
use crate::ggml::Tensor;
use crate::gguf::Metadata;
use crate::graph::kv::Extra;
use crate::graph::step::{ArchStep, Span};
use crate::graph::GraphBuilder;
use crate::model::hparams::Gating;
use crate::model::{ArchSpec, Hparams};

pub mod deepseek2;
pub mod deepseek32;
pub mod deepseek4;
pub mod glm4moe;
pub mod gpt_oss;
pub mod llama;
pub mod minimax_m2;
pub mod olmoe;
pub mod qwen2moe;
pub mod qwen3moe;
pub mod rows;
#[cfg(test)]
mod tests;

/// Every supported architecture.
pub static ARCHS: &[&Arch] = &[
    &qwen3moe::QWEN3MOE,
    &qwen2moe::QWEN2MOE,
    &gpt_oss::GPT_OSS,
    &deepseek2::DEEPSEEK2,
    &deepseek32::DEEPSEEK32,
    &deepseek4::DEEPSEEK4,
    &llama::LLAMA,
    &glm4moe::GLM4MOE,
    &minimax_m2::MINIMAX_M2,
    &olmoe::OLMOE,
];

/// Graph nodes of a plain block, generously (~64 are made).
pub const NODES_PER_BLOCK: usize = 96;

/// Vocabulary size of the tiny presets.
pub const TINY_VOCAB: u64 = 1024;

/// A graph builder: the forward graph of one step, returning the logits [n_vocab, n_tokens].
pub type GraphFn = for<'a> fn(&GraphBuilder<'a>) -> Tensor<'a>;

/// One architecture: everything the crate knows of it.
pub struct Arch {
    /// Model facts: name, tensor table, required keys, hyper-parameter rules, refusals.
    pub spec: ArchSpec,
    /// Its forward graph; `None` for an architecture only the registry knows (inspect,
    /// validation), whose files the engine refuses.
    pub graph: Option<GraphFn>,
    /// Whether its graph runs over a quantised KV cache (`--kv-type`); deepseek2's MLA does not
    /// yet.
    pub quantized_kv: bool,
    /// Graph nodes a block may make, at most (sizes a step's graph context): [`NODES_PER_BLOCK`]
    /// for the plain blocks.
    pub nodes_per_block: usize,
    /// What its KV cache holds besides one K and V row per position and block.
    pub kv: KvLayout,
    /// What the synthesiser needs for it.
    pub synth: Synth,
}

/// An architecture's KV cache beyond the plain layout: K-only rows (the attention reads V from
/// the K row, as DeepSeek-V4's shared latent head) and tensors of its own ([`Extra`]: compressed
/// rows, compressor state).
pub struct KvLayout {
    /// No V rows: the graph attends with V = K.
    pub k_only: bool,
    /// Its own cache tensors for a context of `n_ctx` positions and `n_seq` sequences.
    pub extra: fn(&Hparams, usize, usize) -> Vec<Extra>,
    /// State it keeps per sequence that is not rows of positions (so a cache cannot be cut to
    /// a prefix, saved or restored), which each step must plan for; `None`: nothing of the sort.
    pub seq_state: Option<SeqState>,
}

impl KvLayout {
    /// One K and one V row per position and block, nothing else.
    pub const PLAIN: KvLayout = KvLayout {
        k_only: false,
        extra: |_, _, _| Vec::new(),
        seq_state: None,
    };
}

/// Per-sequence state of an architecture beside its cache rows (DeepSeek-V4's compressor
/// rings), and the plan each step needs for it.
pub struct SeqState {
    /// What the state is, for errors ("compressor state (DeepSeek-V4's compressed blocks)").
    pub what: &'static str,
    /// Whether a model keeps any (a file may use none of what its architecture allows).
    pub kept: fn(&Hparams) -> bool,
    /// The plan of a step of `n` tokens over `spans`, with `rings` sequences (slots), each over
    /// a cache of `n_ctx` rows.
    pub plan: fn(&Hparams, &[Span], usize, usize, usize) -> ArchStep,
}

/// `hp`'s per-sequence state, where its model keeps any.
pub fn seq_state(hp: &Hparams) -> Option<&'static SeqState> {
    of(hp.arch).kv.seq_state.as_ref().filter(|s| (s.kept)(hp))
}

/// Synthesiser facts of an architecture (`crate::synth`).
pub struct Synth {
    /// `tokenizer.ggml.pre` of its real models' tokenizer.
    pub pre_tokenizer: &'static str,
    /// Other names of it (Hugging Face `model_type`s, family names), for `synth --arch` hints.
    pub aliases: &'static [&'static str],
    /// Optional tensors (name endings) its real files carry, which synthetic files then carry too.
    pub optional_tensors: &'static [&'static str],
    /// Whether the synthetic routing's context channel (`synth::routing`, calibrated on
    /// Qwen3-30B-A3B: per-head q/k norms with NeoX RoPE) applies.
    pub context_channel: bool,
    /// The `tiny` preset (a few MB, widths multiples of 256 so every quant type applies), which
    /// the tests build their models from; an architecture without a graph may have one too
    /// (libllama must load and run it: the parity tests compare against it).
    pub tiny: Option<fn() -> Hparams>,
}

impl Synth {
    /// No aliases, no optional tensors, no context channel, no tiny preset, the default
    /// pre-tokenizer: specs spell out what differs.
    pub const NONE: Synth = Synth {
        pre_tokenizer: "default",
        aliases: &[],
        optional_tensors: &[],
        context_channel: false,
        tiny: None,
    };
}

/// Defaults every synth preset starts from; each architecture's `family()` overrides what its
/// models change.
pub fn preset_base(arch: &'static Arch) -> Hparams {
    Hparams {
        arch: &arch.spec,
        n_ctx_train: 32768,
        rope_freq_base: 1e6,
        rms_eps: 1e-6,
        gating: Gating::Softmax,
        expert_weights_norm: true,
        ..Default::default()
    }
}

/// The shape every tiny preset starts from, over `h` (its architecture's family): the tiny
/// vocabulary, 256 wide, 2 blocks, 8 experts of which 2 are used.
pub fn tiny_of(h: Hparams) -> Hparams {
    Hparams {
        n_vocab: TINY_VOCAB,
        n_embd: 256,
        n_layer: 2,
        n_expert: 8,
        n_expert_used: 2,
        ..h
    }
}

/// GQA attention sizes: heads, KV heads, head size (rotary over the whole head).
pub fn with_heads(h: Hparams, n_head: u64, n_head_kv: u64, head_dim: u64) -> Hparams {
    Hparams {
        n_head,
        n_head_kv,
        head_dim_k: head_dim,
        head_dim_v: head_dim,
        n_rot: head_dim,
        ..h
    }
}

/// The Mixture-of-Experts architectures the pinned llama.cpp tree added over the one before it
/// (llama-cpp-sys-2 0.1.161 -> llama-cpp-sys-4 0.11.0) that PocketMoE has no graph for yet, each
/// with what its graph needs that ours lacks (from the tree's `src/models/<name>.cpp`). A file of
/// one is refused with that reason; `inspect` reports it.
pub static NOT_BUILT: &[(&str, &str)] = &[
    (
        "flint",
        "NoPE layers (attention.rope_pattern) and the amax-rescaled expert down projection",
    ),
    (
        "kolibri1",
        "post-sublayer norms, NoPE global layers and logit-biased expert selection",
    ),
    (
        "beam",
        "NoPE layers with query temperature scaling, a gated attention output and scaled residuals",
    ),
    (
        "maion-coder",
        "latent-space experts (ffn_latent_down/up) in interleaved MoE blocks",
    ),
    (
        "muse-spark",
        "latent experts with per-expert output norms, a gated attention output and learned residual \
         scales",
    ),
    (
        "k2-horizon",
        "routed value experts (MoVA), a grouped RMSNorm and a softplus attention output gate",
    ),
    (
        "mistral-large4",
        "MLA with SSMax query scaling, NoPE and shared-KV layers and a shared lightning indexer",
    ),
    (
        "deepseek41",
        "DeepSeek-V4.1's shared compressed-KV/indexer layers, Engram n-gram embeddings and \
         single-pass hyper-connections",
    ),
];

/// Why a file whose `general.architecture` is `name` cannot run here, for a name that is not
/// ours: llama.cpp's own (the tree we link lists it), with our reason where [`NOT_BUILT`] has one,
/// or a name llama.cpp does not know either.
pub fn not_built_reason(name: &str) -> String {
    let tree = ggml_sys::LLAMA_TREE;
    if let Some((_, why)) = NOT_BUILT.iter().find(|(n, _)| *n == name) {
        format!(
            "architecture {name:?} is a MoE architecture of llama.cpp ({tree}) that PocketMoE does \
             not build yet: its graph needs {why} (built: {})",
            built_names()
        )
    } else if ggml_sys::LLAMA_ARCH_NAMES.contains(&name) {
        format!(
            "architecture {name:?} runs in llama.cpp ({tree}) but PocketMoE has no graph for it \
             (built: {})",
            built_names()
        )
    } else {
        format!(
            "architecture {name:?} is not supported, and llama.cpp ({tree}) does not know it either \
             (built: {})",
            built_names()
        )
    }
}

/// Looks an architecture up by its GGUF name (`general.architecture`).
pub fn by_name(name: &str) -> Option<&'static Arch> {
    ARCHS.iter().copied().find(|a| a.spec.name == name)
}

/// The architecture a file's `general.architecture` names, and the hyper-parameters its rules
/// read from `meta` (errors name the key; the caller names the file).
pub fn hparams(meta: &dyn Metadata) -> Result<(&'static Arch, Hparams), String> {
    let name = meta
        .get_str("general.architecture")
        .ok_or("no general.architecture")?;
    let arch = by_name(name).ok_or_else(|| not_built_reason(name))?;
    Ok((arch, Hparams::from_meta(&arch.spec, meta)?))
}

/// The architecture whose model facts `spec` are (`hp.arch`).
pub fn of(spec: &ArchSpec) -> &'static Arch {
    ARCHS
        .iter()
        .copied()
        .find(|a| a.spec == *spec)
        .unwrap_or_else(|| panic!("architecture {:?} is not in ARCHS", spec.name))
}

/// The architectures with a graph, in [`ARCHS`] order.
pub fn built() -> impl Iterator<Item = &'static Arch> {
    ARCHS.iter().copied().filter(|a| a.graph.is_some())
}

/// Names of the built architectures, comma-separated (for errors).
pub fn built_names() -> String {
    built().map(|a| a.spec.name).collect::<Vec<_>>().join(", ")
}

/// Why a file of a built architecture still cannot run (a variant whose graph is not built),
/// checked at load time so the error names the file before anything is allocated: the
/// architecture's own refusals.
pub fn unsupported(hp: &Hparams) -> Option<String> {
    (hp.arch.unsupported)(hp)
}

/// Builds the forward graph for `g.hp.arch`; returns the logits [n_vocab, n_tokens].
pub fn build<'a>(g: &GraphBuilder<'a>) -> Result<Tensor<'a>, String> {
    if let Some(msg) = unsupported(g.hp) {
        return Err(msg);
    }
    match of(g.hp.arch).graph {
        Some(build) => Ok(build(g)),
        None => Err(format!(
            "no graph for architecture {:?} yet (built: {})",
            g.hp.arch.name,
            built_names()
        )),
    }
}
