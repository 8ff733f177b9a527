//! The registry schema and the table of supported architectures.
//!
//! An architecture is data: GGUF name, the tensors each layer (or the model) holds, their shapes
//! as functions of [`Hparams`], which layers they occur in, their [`Role`] and whether llama.cpp
//! requires them.
//!
//! Adding an architecture touches several places today (issue 15 item 2 is to make it one file
//! plus one list entry; until then, this is the recipe):
//! 1. here: a file with one `ArchSpec` constant (tensor table, required keys), its `mod` line
//!    and its entry in [`ARCHS`] — enough for `inspect` and validation;
//! 2. `model/hparams.rs`: what llama.cpp's `load_arch_hparams` derives or fixes for it
//!    (`apply_arch_rules`: gating, weight normalisation, expert width, sliding windows) and the
//!    `ONE_HEAD_SIZE` / `WHOLE_HEAD_ROPE` lists where they apply;
//! 3. `graph/arch/`: a file with its `build`, its `mod` line, its name in `BUILT`, its arm in
//!    `build`'s match, and an arm in `unsupported` for variants the graph refuses;
//!    `graph/blocks/rope.rs` where its RoPE differs (e.g. deepseek2's YaRN factor);
//! 4. `synth/presets.rs` (a `tiny` preset, name aliases) and `synth/vocab.rs` (its
//!    tokenizer's pre-tokenizer), so tests can make a model; `tokenizer/pretok.rs` if the
//!    pre-tokenizer is new;
//! 5. the test lists naming every built architecture (`tests/parity.rs`, `offload.rs`,
//!    `hparams_fuzz.rs`, `graph_order.rs`, `synth_llama.rs`, `weights.rs`, ...).
//!
//! Conventions shared by the tables: llama.cpp's `create_tensor_qkv` first tries a fused
//! `attn_qkv` and falls back to separate `attn_q`/`attn_k`/`attn_v` (each with an optional bias);
//! converters write the separate form for these architectures, so only that form is listed (with
//! the optional biases). Likewise `create_tensor_gate_up_exps` (deepseek2) tries a fused
//! `ffn_gate_up_exps` before separate `ffn_gate_exps`/`ffn_up_exps`: only the separate form is
//! listed. Optional tensors (`required: false`) are ones llama.cpp uses when present; a writer of
//! synthetic files should emit them only where the model it mimics has them. Not listed: the
//! generic optional NVFP4 `.scale`/`.input_scale` companions llama.cpp probes for every arch.
use super::Hparams;

mod deepseek2;
mod deepseek4;
mod glm4moe;
mod gpt_oss;
mod llama;
mod minimax_m2;
mod olmoe;
mod qwen2moe;
mod qwen3moe;
#[cfg(test)]
mod tests;

/// What a tensor is for; decides placement (resident vs routed-expert store) and reporting.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Role {
    /// Token embeddings (`token_embd`).
    Embedding,
    /// Output projection (`output`) — read once per decoded token, large for real vocabularies.
    Output,
    /// Any norm weight/bias (attention, FFN, output, q/k norms).
    Norm,
    /// Attention projections, biases, sinks, MLA low-rank factors.
    Attention,
    /// The MoE router (`ffn_gate_inp`) and its expert-selection bias (`exp_probs_b`).
    Router,
    /// Routed experts' matrices (`ffn_{up,gate,down}_exps.weight`): the offloaded part — with a
    /// budget, exactly these tensors go to the host store and the GPU expert cache.
    RoutedExperts,
    /// Routed experts' biases (gpt-oss `ffn_{up,gate,down}_exps.bias`): a few KB per layer,
    /// resident; the graph adds the selected experts' rows on the device.
    RoutedExpertBias,
    /// Always-active shared experts (`ffn_*_shexp`) and their gate.
    SharedExperts,
    /// FFN of dense (non-MoE) layers.
    DenseFfn,
    /// Anything else llama.cpp loads (e.g. MTP/nextn tensors).
    Other,
}

impl Role {
    /// Whether this role stays resident on the GPU (everything except the routed experts'
    /// matrices, docs/design.md §4.1): the placement planner and the engine decide by this.
    pub fn is_resident(self) -> bool {
        self != Role::RoutedExperts
    }
}

/// Which blocks a per-layer tensor appears in.
#[derive(Debug, Clone, Copy)]
pub enum Layers {
    /// Not per layer: a model-level tensor (`token_embd.weight`).
    Global,
    /// Every block.
    All,
    /// Blocks with a routed-expert FFN ([`Hparams::is_moe_layer`]).
    Moe,
    /// Blocks with a dense FFN (the leading dense blocks of DeepSeek/GLM, ...).
    Dense,
    /// Blocks for which the arch-specific predicate holds (e.g. sliding-window layers).
    Where(fn(&Hparams, usize) -> bool),
}

/// Equality by variant; `Where` predicates compare by address (`std::ptr::fn_addr_eq`), which
/// is reliable only for the same static table entry.
impl PartialEq for Layers {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (Layers::Where(a), Layers::Where(b)) => std::ptr::fn_addr_eq(*a, *b),
            _ => std::mem::discriminant(self) == std::mem::discriminant(other),
        }
    }
}

impl Eq for Layers {}

/// One tensor (template) of an architecture.
#[derive(Debug, Clone, Copy)]
pub struct TensorSpec {
    /// Full GGUF name, `{}` standing for the block index: `"blk.{}.ffn_up_exps.weight"`.
    pub name: &'static str,
    pub role: Role,
    pub layers: Layers,
    /// Shape in ggml order (ne0 first) for block `il`, from the hyper-parameters.
    pub shape: fn(&Hparams, usize) -> Vec<u64>,
    /// llama.cpp refuses to load a file without it (vs `TENSOR_NOT_REQUIRED`). In trailing MTP
    /// blocks see [`ArchSpec::required_in`].
    pub required: bool,
}

impl TensorSpec {
    /// The tensor's GGUF name in block `il` (ignored for global tensors).
    pub fn name_for(&self, il: usize) -> String {
        self.name.replace("{}", &il.to_string())
    }

    /// Whether this tensor exists in block `il` (global tensors: `il` is ignored).
    pub fn in_layer(&self, hp: &Hparams, il: usize) -> bool {
        match self.layers {
            Layers::Global => true,
            Layers::All => true,
            Layers::Moe => hp.is_moe_layer(il),
            Layers::Dense => !hp.is_moe_layer(il),
            Layers::Where(f) => f(hp, il),
        }
    }
}

/// An architecture: its GGUF name and tensor table.
#[derive(Debug)]
pub struct ArchSpec {
    /// `general.architecture` value, as llama.cpp spells it (`qwen3moe`, `gpt-oss`, ...).
    pub name: &'static str,
    /// Human description (for `inspect`).
    pub description: &'static str,
    /// Metadata keys (without the `{arch}.` prefix) llama.cpp requires for this architecture, on
    /// top of the common ones [`hparams::COMMON_REQUIRED`](super::hparams::COMMON_REQUIRED).
    pub required_keys: &'static [&'static str],
    pub tensors: &'static [TensorSpec],
    /// llama.cpp accepts a file whose trailing MTP ("nextn") blocks are missing altogether: it
    /// probes `blk.{n_layer_decode}.nextn.eh_proj.weight` and, without it, loads every tensor of
    /// those blocks as not required (glm4moe, deepseek2). False where those blocks are loaded like
    /// any other (deepseek4) or the arch has none.
    pub nextn_blocks_optional: bool,
}

impl ArchSpec {
    /// Every concrete tensor this architecture expects for `hp`: (name, spec, block or None).
    pub fn expected_tensors<'a>(
        &'a self,
        hp: &'a Hparams,
    ) -> impl Iterator<Item = (String, &'a TensorSpec, Option<usize>)> + 'a {
        self.tensors.iter().flat_map(move |t| {
            let blocks: Vec<Option<usize>> = match t.layers {
                Layers::Global => vec![None],
                _ => (0..hp.n_layer)
                    .filter(|&il| t.in_layer(hp, il))
                    .map(Some)
                    .collect(),
            };
            blocks
                .into_iter()
                .map(move |b| (t.name_for(b.unwrap_or(0)), t, b))
        })
    }

    /// Whether a file must hold tensor `t` in `block` (None: a global tensor): `t.required`,
    /// except in the trailing MTP blocks of an arch with [`nextn_blocks_optional`](Self::nextn_blocks_optional).
    /// Decode never runs those blocks.
    pub fn required_in(&self, t: &TensorSpec, hp: &Hparams, block: Option<usize>) -> bool {
        t.required && !(self.nextn_blocks_optional && block.is_some_and(|il| hp.is_nextn_layer(il)))
    }
}

/// Every supported architecture.
pub static ARCHS: &[&ArchSpec] = &[
    &qwen3moe::QWEN3MOE,
    &qwen2moe::QWEN2MOE,
    &gpt_oss::GPT_OSS,
    &deepseek2::DEEPSEEK2,
    &deepseek4::DEEPSEEK4,
    &llama::LLAMA,
    &glm4moe::GLM4MOE,
    &minimax_m2::MINIMAX_M2,
    &olmoe::OLMOE,
];
