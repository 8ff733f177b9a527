//! The hyper-parameter schema: one row per GGUF key (`{arch}.` + [`Key::name`]) saying its type,
//! its default when absent, the range its value must lie in on its own, the rule that relates it
//! to other keys, which architectures read it, and the [`Hparams`] field it fills.
//! [`Hparams::from_meta`] reads the rows in order (a default may name an earlier row),
//! [`Hparams::validate`] checks them in order (each row's bound, then its rule: the order in which
//! a file's first fault is reported), errors name the key as the file spells it, and
//! `pocketmoe inspect` lists the rows of the file's architecture.
//!
//! Rows of [`Ty::Custom`] or [`Dflt::Code`] are read by code of their own (`from_meta`: the
//! vocabulary size, which may come from the token list, the gating function and the RoPE scaling
//! type; the architectures' rules: per-block arrays), but are listed here all the same.
use super::rules;
pub use super::value::Val;
use super::{Hparams, MAX_CTX, MAX_DIM, MAX_LAYERS};

/// How a key is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ty {
    /// A non-negative integer of any GGUF integer type.
    Uint,
    /// A number (F32, F64 or a small integer).
    Float,
    Bool,
    /// Read by code of its own (see the module comment).
    Custom,
}

impl Ty {
    /// What a value of this type must be, for errors.
    pub fn what(self) -> &'static str {
        match self {
            Ty::Uint => "a non-negative integer",
            Ty::Float => "a number",
            Ty::Bool => "true or false",
            Ty::Custom => "as documented",
        }
    }
}

/// The value an absent key takes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Dflt {
    /// 0, 0.0 or false.
    Zero,
    /// A number.
    Num(f32),
    /// The value of another (earlier) row.
    Same(&'static str),
    /// `embedding_length / attention.head_count` (0 when there are no heads).
    HeadSize,
    /// The value of an older key of the same type (`{arch}.` + name), else 0.
    Legacy(&'static str),
    /// Read by code of its own in `from_meta` (the vocabulary size, from the token list too).
    Code,
}

/// The range a key's value must lie in on its own; relations to other keys are [`Key::rule`]s.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Bound {
    Free,
    /// An integer in `lo..=hi`; the text follows the range in errors.
    Int(u64, u64, &'static str),
    /// 0 (none: the row's rule says what that means) or an integer in `lo..=hi`.
    ZeroOr(u64, u64),
    /// A finite number >= 0; the text says what 0 means.
    NonNeg(&'static str),
    /// A finite number > 0 (a RoPE base), or 0 where the row has a fallback (`unset_ok`).
    Base {
        unset_ok: bool,
    },
    /// A finite number.
    Finite,
    /// A number in (0, 1] (a norm epsilon).
    Epsilon,
}

/// When a row's bound and rule apply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum When {
    Always,
    /// Only in a model with experts (`expert_count > 0`): a dense model reads no expert keys.
    WithExperts,
}

/// A check of a key against others (`rules`), its error naming the keys.
pub type Rule = fn(&Hparams) -> Result<(), String>;

/// One GGUF key of the schema.
pub struct Key {
    /// The key after `{arch}.`.
    pub name: &'static str,
    pub ty: Ty,
    pub default: Dflt,
    pub bound: Bound,
    pub when: When,
    /// Its relation to other keys (checked after the bound), each error naming the keys.
    pub rule: Option<Rule>,
    /// The architectures whose graphs or rules read it; empty: every one.
    pub archs: &'static [&'static str],
    /// The field's value (custom rows: what `inspect` shows).
    pub get: fn(&Hparams) -> Val,
    /// Stores a value read from the file (custom rows: nothing).
    pub set: fn(&mut Hparams, Val),
}

impl Key {
    /// A custom row with nothing set: the base of the table's rows.
    const BASE: Key = Key {
        name: "",
        ty: Ty::Custom,
        default: Dflt::Zero,
        bound: Bound::Free,
        when: When::Always,
        rule: None,
        archs: &[],
        get: |_| Val::U(0),
        set: |_, _| {},
    };

    /// Whether architecture `arch` reads this key.
    pub fn applies_to(&self, arch: &str) -> bool {
        self.archs.is_empty() || self.archs.contains(&arch)
    }

    /// The key as a file of `hp`'s architecture spells it.
    pub fn full(&self, hp: &Hparams) -> String {
        hp.key(self.name)
    }

    /// This row's bound and rule on `hp`.
    pub fn check(&self, hp: &Hparams) -> Result<(), String> {
        if self.when == When::WithExperts && hp.n_expert == 0 {
            return Ok(());
        }
        let v = (self.get)(hp);
        let key = self.full(hp);
        let ok = match (self.bound, &v) {
            (Bound::Free, _) => true,
            (Bound::Int(lo, hi, why), Val::U(x)) => {
                if !(lo..=hi).contains(x) {
                    return Err(format!("{key} = {x}: must be in {lo}..={hi}{why}"));
                }
                true
            }
            (Bound::ZeroOr(lo, hi), Val::U(x)) => {
                if *x != 0 && !(lo..=hi).contains(x) {
                    return Err(format!("{key} = {x}: must be in {lo}..={hi}"));
                }
                true
            }
            (Bound::NonNeg(why), Val::F(x)) => {
                if !(x.is_finite() && *x >= 0.0) {
                    return Err(format!("{key} = {x}: must be a finite number >= 0 ({why})"));
                }
                true
            }
            (Bound::Base { unset_ok }, Val::F(x)) => {
                if !((unset_ok && *x == 0.0) || (x.is_finite() && *x > 0.0)) {
                    return Err(format!(
                        "{key} = {x}: must be a finite number > 0 (real models use 1e4 to 1e7)"
                    ));
                }
                true
            }
            (Bound::Finite, Val::F(x)) => {
                if !x.is_finite() {
                    return Err(format!("{key} = {x}: must be a finite number"));
                }
                true
            }
            (Bound::Epsilon, Val::F(x)) => {
                if !(*x > 0.0 && *x <= 1.0) {
                    return Err(format!(
                        "{key} = {x}: must be a number in (0, 1] (real models use 1e-6 to 1e-5)"
                    ));
                }
                true
            }
            _ => false,
        };
        assert!(ok, "schema row {key}: bound {:?} on {v:?}", self.bound);
        self.rule.map_or(Ok(()), |r| r(hp))
    }
}

/// The row of `name` (after `{arch}.`).
pub fn key(name: &str) -> Option<&'static Key> {
    KEYS.iter().find(|k| k.name == name)
}

/// The value of every row architecture `hp.arch` reads, as (key after `{arch}.`, value).
pub fn listing(hp: &Hparams) -> Vec<(&'static str, Val)> {
    KEYS.iter()
        .filter(|k| k.applies_to(hp.arch.name))
        .map(|k| (k.name, (k.get)(hp)))
        .collect()
}

/// A size: an integer in `1..=MAX_DIM`.
const SIZE: Bound = Bound::Int(1, MAX_DIM, "");
/// A size that may be 0 (absent).
const SIZE0: Bound = Bound::Int(0, MAX_DIM, "");
/// A size of sliding-window blocks, 0 meaning the full-attention one.
const SWA: Bound = Bound::Int(0, MAX_DIM, " (0: as in full-attention blocks)");

const DS: &[&str] = &["deepseek2", "deepseek32", "deepseek4"];
const MLA: &[&str] = &["deepseek2", "deepseek32"];
const DSV4: &[&str] = &["deepseek4"];
const SWA_ARCHS: &[&str] = &["gpt-oss", "deepseek4"];
const LEAD: &[&str] = &["deepseek2", "deepseek32", "glm4moe"];
const SHARED: &[&str] = &["deepseek2", "deepseek32", "deepseek4", "glm4moe"];
const NEXTN: &[&str] = &["deepseek2", "deepseek32", "deepseek4", "glm4moe"];
const INDEXER: &[&str] = &["deepseek32", "deepseek4"];

/// A row of an integer (`u`), number (`f`) or flag (`b`) field; `$k: $v` set the other columns.
macro_rules! row {
    (u $name:literal => $($f:ident).+ $(, $k:ident: $v:expr)* $(,)?) => {
        Key {
            name: $name,
            ty: Ty::Uint,
            get: |h| Val::U(h.$($f).+ as u64),
            set: |h, v| h.$($f).+ = v.u() as _,
            $($k: $v,)*
            ..Key::BASE
        }
    };
    (f $name:literal => $($f:ident).+ $(, $k:ident: $v:expr)* $(,)?) => {
        Key {
            name: $name,
            ty: Ty::Float,
            get: |h| Val::F(h.$($f).+),
            set: |h, v| h.$($f).+ = v.f(),
            $($k: $v,)*
            ..Key::BASE
        }
    };
    (b $name:literal => $($f:ident).+ $(, $k:ident: $v:expr)* $(,)?) => {
        Key {
            name: $name,
            ty: Ty::Bool,
            get: |h| Val::B(h.$($f).+),
            set: |h, v| h.$($f).+ = v.b(),
            $($k: $v,)*
            ..Key::BASE
        }
    };
}

/// Every key, in the order they are read (a [`Dflt::Same`] names an earlier row) and checked.
#[rustfmt::skip]
pub static KEYS: &[Key] = &[
    row!(u "block_count" => n_layer, bound: Bound::Int(1, MAX_LAYERS, ""), rule: Some(rules::decoded_blocks)),
    row!(u "nextn_predict_layers" => n_layer_nextn, archs: NEXTN),
    row!(u "embedding_length" => n_embd, bound: SIZE),
    row!(u "vocab_size" => n_vocab, default: Dflt::Code,
        bound: Bound::Int(1, MAX_DIM, " (the vocabulary size: this key, else the length of tokenizer.ggml.tokens)")),
    row!(u "context_length" => n_ctx_train, bound: Bound::Int(1, MAX_CTX, "")),
    row!(u "attention.head_count" => n_head, bound: SIZE),
    row!(u "attention.head_count_kv" => n_head_kv, default: Dflt::Same("attention.head_count"), rule: Some(rules::kv_heads)),
    row!(u "attention.key_length" => head_dim_k, default: Dflt::HeadSize, bound: SIZE),
    row!(u "attention.value_length" => head_dim_v, default: Dflt::HeadSize, bound: SIZE, rule: Some(rules::head_sizes)),
    row!(u "rope.dimension_count" => n_rot, default: Dflt::Same("attention.key_length"), rule: Some(rules::rotary)),
    row!(f "rope.freq_base" => rope_freq_base, default: Dflt::Num(10000.0), bound: Bound::Base { unset_ok: false }),
    row!(f "attention.compress_rope_freq_base" => dsv4.compress_rope_freq_base, bound: Bound::Base { unset_ok: true }, archs: DSV4),
    row!(f "rope.freq_base_swa" => swa.rope_freq_base, default: Dflt::Same("rope.freq_base"), bound: Bound::Base { unset_ok: true }, archs: &["gpt-oss"]),
    Key {
        name: "rope.scaling.type",
        get: |h| Val::Text(h.rope_scaling.name().into()),
        ..Key::BASE
    },
    row!(f "rope.scaling.factor" => rope_scaling_factor, default: Dflt::Legacy("rope.scale_linear"), bound: Bound::NonNeg("0: no scaling")),
    row!(f "rope.scaling.yarn_log_multiplier" => rope_yarn_log_mul, bound: Bound::Finite),
    row!(u "rope.scaling.original_context_length" => n_ctx_orig_yarn, bound: Bound::Int(0, MAX_CTX, " (0: context_length)")),
    row!(f "attention.temperature_scale" => attn_temp_scale, bound: Bound::NonNeg("0: none"), archs: MLA),
    row!(f "attention.layer_norm_rms_epsilon" => rms_eps, default: Dflt::Num(1e-6), bound: Bound::Epsilon),
    row!(u "feed_forward_length" => n_ff, bound: SIZE0, rule: Some(rules::dense_ffn)),
    row!(u "expert_feed_forward_length" => n_ff_exp, bound: SIZE0),
    row!(u "expert_shared_feed_forward_length" => n_ff_shexp, bound: SIZE0, archs: &["qwen2moe"]),
    row!(u "expert_count" => n_expert, bound: Bound::ZeroOr(1, MAX_DIM), rule: Some(rules::no_experts)),
    row!(u "expert_used_count" => n_expert_used, when: When::WithExperts, rule: Some(rules::used_experts)),
    row!(u "expert_shared_count" => n_expert_shared, bound: SIZE0, when: When::WithExperts, archs: SHARED),
    row!(u "leading_dense_block_count" => n_layer_dense_lead, when: When::WithExperts, rule: Some(rules::dense_lead), archs: LEAD),
    row!(u "expert_group_count" => n_expert_groups, when: When::WithExperts, rule: Some(rules::groups), archs: LEAD),
    row!(u "expert_group_used_count" => n_group_used, when: When::WithExperts, rule: Some(rules::groups_used), archs: LEAD),
    Key {
        name: "expert_gating_func",
        get: |h| Val::Text(format!("{:?}", h.gating)),
        ..Key::BASE
    },
    row!(b "expert_weights_norm" => expert_weights_norm),
    row!(u "attention.key_length_swa" => swa.head_dim_k, default: Dflt::Same("attention.key_length"), bound: SWA, archs: SWA_ARCHS),
    row!(u "attention.value_length_swa" => swa.head_dim_v, default: Dflt::Same("attention.value_length"), bound: SWA, archs: SWA_ARCHS),
    row!(u "rope.dimension_count_swa" => swa.n_rot, default: Dflt::Same("rope.dimension_count"), bound: SWA, archs: SWA_ARCHS),
    row!(u "attention.sliding_window" => swa.window, rule: Some(rules::window), archs: SWA_ARCHS),
    Key {
        name: "attention.sliding_window_pattern",
        get: |h| Val::Text(format!("{} of {} blocks windowed", h.swa.layers.iter().filter(|&&w| w).count(), h.n_layer)),
        archs: &["gpt-oss"],
        ..Key::BASE
    },
    row!(f "expert_weights_scale" => expert_weights_scale, bound: Bound::NonNeg("0: none")),
    row!(f "swiglu_clamp_exp" => dsv4.swiglu_clamp_exp, bound: Bound::NonNeg("0: none"), archs: DSV4),
    row!(f "swiglu_clamp_shexp" => dsv4.swiglu_clamp_shexp, default: Dflt::Same("swiglu_clamp_exp"), bound: Bound::NonNeg("0: none"), archs: DSV4),
    row!(f "hyper_connection.epsilon" => dsv4.hc_eps, bound: Bound::NonNeg("0: none"), archs: DSV4),
    row!(u "attention.q_lora_rank" => mla.q_lora_rank, bound: SIZE0, archs: DS),
    row!(u "attention.kv_lora_rank" => mla.kv_lora_rank, bound: SIZE0, archs: MLA),
    row!(u "attention.key_length_mla" => mla.head_dim_k, bound: SIZE0, archs: MLA),
    row!(u "attention.value_length_mla" => mla.head_dim_v, bound: SIZE0, archs: MLA),
    row!(u "attention.indexer.head_count" => indexer.n_head, bound: SIZE0, archs: INDEXER),
    row!(u "attention.indexer.key_length" => indexer.head_dim, bound: SIZE0, archs: INDEXER),
    row!(u "attention.output_group_count" => dsv4.o_group_count, bound: SIZE0, archs: DSV4),
    row!(u "attention.output_lora_rank" => dsv4.o_lora_rank, bound: SIZE0, archs: DSV4),
    row!(u "hyper_connection.count" => dsv4.hc_mult, bound: SIZE0, archs: DSV4),
    row!(u "attention.indexer.top_k" => indexer.top_k, bound: Bound::Int(0, MAX_CTX, ""), archs: INDEXER),
    row!(u "hyper_connection.sinkhorn_iterations" => dsv4.hc_sinkhorn_iters, bound: Bound::Int(0, 1024, ""), archs: DSV4),
    row!(u "hash_layer_count" => dsv4.hash_layer_count, archs: DSV4),
    Key {
        name: "attention.compress_ratios",
        get: |h| Val::Text(format!("{:?}", h.dsv4.compress_ratios)),
        archs: DSV4,
        ..Key::BASE
    },
];
