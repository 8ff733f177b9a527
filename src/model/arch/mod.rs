//! The schema of an architecture's model facts: [`ArchSpec`] (GGUF name, the tensors each
//! layer or the model holds, their shapes as functions of [`Hparams`], which layers they occur
//! in, their [`Role`], whether llama.cpp requires them; the required metadata keys; the rules by
//! which llama.cpp's `load_arch_hparams` derives and checks hyper-parameters; the variants no
//! graph is built for; RoPE specifics). Each architecture's value lives in its own file of the
//! top-level [`crate::arch`] module, with its graph builder and synth facts (`model` sits below
//! `graph`, so it holds the schema, not the list).
//!
//! Conventions shared by the tables: llama.cpp's `create_tensor_qkv` first tries a fused
//! `attn_qkv` and falls back to separate `attn_q`/`attn_k`/`attn_v` (each with an optional bias);
//! converters write the separate form for these architectures, so only that form is listed (with
//! the optional biases). Likewise `create_tensor_gate_up_exps` (deepseek2) tries a fused
//! `ffn_gate_up_exps` before separate `ffn_gate_exps`/`ffn_up_exps`: only the separate form is
//! listed. Optional tensors (`required: false`) are ones llama.cpp uses when present; a writer of
//! synthetic files should emit them only where the model it mimics has them. Not listed: the
//! generic optional NVFP4 `.scale`/`.input_scale` companions llama.cpp probes for every arch.
use super::hparams::Gating;
use super::Hparams;
use crate::gguf::Metadata;

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

/// An architecture's model facts. One `&'static` value per architecture (in `crate::arch`);
/// [`Hparams::arch`] points to it, so code asks the spec instead of comparing names.
pub struct ArchSpec {
    /// `general.architecture` value, as llama.cpp spells it (`qwen3moe`, `gpt-oss`, ...).
    pub name: &'static str,
    /// Human description (for `inspect`).
    pub description: &'static str,
    /// Metadata keys (without the `{arch}.` prefix) llama.cpp requires for this architecture, on
    /// top of the common ones [`hparams::COMMON_REQUIRED`](super::hparams::COMMON_REQUIRED).
    pub required_keys: &'static [&'static str],
    /// The tensor table, in llama.cpp's `load_arch_tensors` order, as groups of rows (shared
    /// groups, `crate::arch::rows`, are reused by several tables).
    pub tensors: &'static [&'static [TensorSpec]],
    /// llama.cpp accepts a file whose trailing MTP ("nextn") blocks are missing altogether: it
    /// probes `blk.{n_layer_decode}.nextn.eh_proj.weight` and, without it, loads every tensor of
    /// those blocks as not required (glm4moe, deepseek2). False where those blocks are loaded like
    /// any other (deepseek4) or the arch has none.
    pub nextn_blocks_optional: bool,
    /// What llama.cpp's `load_arch_hparams` (and graph) derives, fixes and asserts.
    pub rules: Rules,
    /// Why a file of this architecture still cannot run (a variant its graph does not build),
    /// checked at load before anything is allocated; `None`: it runs.
    pub unsupported: fn(&Hparams) -> Option<String>,
    /// A file without experts (no `expert_count`, or 0) is a dense model this graph runs with
    /// every block a dense FFN (llama: plain Llama, as llama.cpp's `llama` arch); the expert
    /// keys are then not required. False: such a file is refused as a dense model.
    pub dense: bool,
}

/// How the gating function (`expert_gating_func`) is decided.
#[derive(Debug, Clone, Copy)]
pub enum GatingRule {
    /// The graph hard-codes it (llama.cpp passes a constant to `build_moe_ffn`); the key is
    /// ignored.
    Fixed(Gating),
    /// The key when given (not 0), else this.
    Default(Gating),
    /// The key when given, else this function of the other hyper-parameters.
    DefaultBy(fn(&Hparams) -> Gating),
}

/// The per-architecture hyper-parameter rules (llama.cpp `load_arch_hparams` and the asserts of
/// its graph), applied by [`Hparams::from_meta`] and [`Hparams::validate`].
#[derive(Clone, Copy)]
pub struct Rules {
    pub gating: GatingRule,
    /// Top-k weight normalisation fixed by the graph (`Some`), else `expert_weights_norm`.
    pub weights_norm: Option<bool>,
    /// `expert_feed_forward_length` defaults to `feed_forward_length / expert_used_count`.
    pub ff_exp_from_ff: bool,
    /// Keys and values share one head size (llama.cpp's graph asserts it).
    pub one_head_size: bool,
    /// RoPE rotates whole heads (`rope.dimension_count == attention.key_length`).
    pub whole_head_rope: bool,
    /// The query projection is square: `head_count * key_length == embedding_length`.
    pub square_q: bool,
    /// llama.cpp drops `nextn_predict_layers` when the file lacks the MTP probe tensor, running
    /// those blocks as ordinary ones ([`Hparams::apply_mtp_probe`]).
    pub mtp_needs_probe: bool,
    /// deepseek2's YaRN: the file stores `0.1 * mscale_all_dim` as `yarn_log_multiplier`, which
    /// llama.cpp's loader scales back, and `mscale = mscale_all_dim`
    /// (`[TAG_DEEPSEEK2_YARN_LOG_MUL_FIX]`, `graph::blocks::rope`).
    pub yarn_mscale_all_dim: bool,
    /// Further derivations from the metadata after the ones above (sliding-window patterns,
    /// per-block arrays, keys required only in some variants).
    pub derive: fn(&mut Hparams, &dyn Metadata) -> Result<(), String>,
    /// Further checks at the end of [`Hparams::validate`], each naming the key.
    pub check: fn(&Hparams) -> Result<(), String>,
}

impl Rules {
    /// No architecture-specific rule: the file's gating (softmax when absent) and weight
    /// normalisation, nothing derived or asserted. Specs spell out what differs.
    pub const NONE: Rules = Rules {
        gating: GatingRule::Default(Gating::Softmax),
        weights_norm: None,
        ff_exp_from_ff: false,
        one_head_size: false,
        whole_head_rope: false,
        square_q: false,
        mtp_needs_probe: false,
        yarn_mscale_all_dim: false,
        derive: |_, _| Ok(()),
        check: |_| Ok(()),
    };
}

impl ArchSpec {
    /// A spec without tables or rules: the placeholder of a default [`Hparams`].
    pub const NONE: ArchSpec = ArchSpec {
        name: "",
        description: "",
        required_keys: &[],
        tensors: &[],
        nextn_blocks_optional: false,
        rules: Rules::NONE,
        unsupported: |_| None,
        dense: false,
    };

    /// Every row of the tensor table, in order.
    pub fn tensor_specs(&self) -> impl Iterator<Item = &'static TensorSpec> {
        self.tensors.iter().flat_map(|g| g.iter())
    }

    /// Every concrete tensor this architecture expects for `hp`: (name, spec, block or None).
    pub fn expected_tensors<'a>(
        &'a self,
        hp: &'a Hparams,
    ) -> impl Iterator<Item = (String, &'static TensorSpec, Option<usize>)> + 'a {
        self.tensor_specs().flat_map(move |t| {
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

/// Specs are equal when they name the same architecture.
impl PartialEq for ArchSpec {
    fn eq(&self, other: &Self) -> bool {
        self.name == other.name
    }
}

/// The GGUF name (a spec's tables and functions say nothing readable).
impl std::fmt::Debug for ArchSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ArchSpec({:?})", self.name)
    }
}

/// The GGUF name, as metadata keys are prefixed with it (`{arch}.block_count`).
impl std::fmt::Display for ArchSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.name)
    }
}

impl Default for &'static ArchSpec {
    fn default() -> Self {
        &ArchSpec::NONE
    }
}
