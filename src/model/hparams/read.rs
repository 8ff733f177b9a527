//! Reading [`Hparams`] from GGUF metadata by the schema ([`schema::KEYS`](super::schema::KEYS)),
//! then the architecture's rules, then [`Hparams::validate`].
use super::schema::{self, Dflt, Ty, Val};
use super::{rules, Gating, Hparams, RopeScaling, COMMON_REQUIRED};
use crate::gguf::Metadata;
use crate::model::arch::{ArchSpec, GatingRule};

impl Hparams {
    /// Reads the hyper-parameters of architecture `arch` from `meta` by the schema
    /// ([`schema::KEYS`]), applying its rules. Missing required keys are errors naming the key;
    /// optional ones take llama.cpp's defaults (the schema's).
    pub fn from_meta(arch: &'static ArchSpec, meta: &dyn Metadata) -> Result<Self, String> {
        let k = |s: &str| format!("{arch}.{s}");
        // A dense file of an architecture that runs dense models needs no expert keys.
        let dense = arch.dense && meta.get_u64(&k("expert_count")).unwrap_or(0) == 0;
        if !dense && arch.required_keys.contains(&"expert_count") && !meta.has(&k("expert_count")) {
            return Err(format!(
                "no {}: {}",
                k("expert_count"),
                rules::dense_model(arch)
            ));
        }
        for key in COMMON_REQUIRED.iter().chain(arch.required_keys) {
            if dense && key.starts_with("expert_") {
                continue;
            }
            if !meta.has(&k(key)) {
                return Err(format!("missing required metadata key {}", k(key)));
            }
        }
        // A key that is present but not readable as what it holds (a negative or float size, a
        // string RoPE base, ...) is an error, not an absent key that takes the default.
        let mut unreadable = None::<String>;
        let mut read = |name: &str, ty: Ty| {
            let key = k(name);
            let v = match ty {
                Ty::Uint => meta.get_u64(&key).map(Val::U),
                Ty::Float => meta.get_f32(&key).map(Val::F),
                Ty::Bool => meta.get_bool(&key).map(Val::B),
                Ty::Custom => None,
            };
            if v.is_none() && meta.has(&key) {
                let what = ty.what();
                unreadable.get_or_insert(match meta.get_f32(&key) {
                    Some(v) => format!("{key} = {v}: must be {what}"),
                    None => format!("{key} holds a value of another type: must be {what}"),
                });
            }
            v
        };
        let mut hp = Hparams {
            arch,
            ..Default::default()
        };
        for key in schema::KEYS
            .iter()
            .filter(|r| r.ty != Ty::Custom && r.default != Dflt::Code)
        {
            let v = match read(key.name, key.ty) {
                Some(v) => v,
                None => match key.default {
                    Dflt::Zero => Val::U(0),
                    Dflt::Num(x) => Val::F(x),
                    Dflt::Same(other) => {
                        let other = schema::key(other).expect("a default names a row");
                        (other.get)(&hp)
                    }
                    Dflt::HeadSize => Val::U(hp.n_embd.checked_div(hp.n_head).unwrap_or(0)),
                    Dflt::Legacy(old) => read(old, key.ty).unwrap_or(Val::F(0.0)),
                    Dflt::Code => unreachable!("rows read by code are left out"),
                },
            };
            (key.set)(&mut hp, v);
        }
        let n_tokens = meta.get_array_len("tokenizer.ggml.tokens");
        let vocab_size = read("vocab_size", Ty::Uint).map(|v| v.u());
        hp.n_vocab = vocab_size.or(n_tokens).ok_or_else(|| {
            format!(
                "neither {} nor tokenizer.ggml.tokens gives the vocabulary size",
                k("vocab_size")
            )
        })?;
        // llama.cpp sizes the embedding and output by the token list; a different vocab_size
        // would give ids the tokenizer does not know (or tensors of another shape).
        if let Some(n) = n_tokens.filter(|&n| n != hp.n_vocab) {
            return Err(format!(
                "{} = {} differs from the {n} entries of tokenizer.ggml.tokens: \
                 they must be equal",
                k("vocab_size"),
                hp.n_vocab
            ));
        }
        // 0 = NONE: the arch default.
        let gating_key = read("expert_gating_func", Ty::Uint)
            .map(|v| v.u())
            .filter(|&v| v != 0);
        hp.gating = match gating_key {
            None | Some(1) => Gating::Softmax,
            Some(2) => Gating::Sigmoid,
            Some(3) => Gating::SoftmaxWeight,
            Some(4) => Gating::SqrtSoftplus,
            Some(v) => {
                return Err(format!(
                    "{} = {v}: unknown gating function (1 softmax, 2 sigmoid, 3 softmax over \
                     the selected experts, 4 sqrt-softplus; 0 or absent: the architecture's)",
                    k("expert_gating_func")
                ))
            }
        };
        hp.rope_scaling = match meta.get_str(&k("rope.scaling.type")) {
            None | Some("linear") => RopeScaling::Linear,
            Some("none") => RopeScaling::None,
            Some("yarn") => RopeScaling::Yarn,
            Some("longrope") => RopeScaling::LongRope,
            Some(other) => {
                return Err(format!(
                    "{}: unknown RoPE scaling type {other:?}",
                    k("rope.scaling.type")
                ))
            }
        };
        if let Some(e) = unreadable {
            return Err(e);
        }
        // Before the arch rules, which allocate per block.
        hp.check_block_count()?;
        hp.apply_arch_rules(meta, gating_key.is_some())?;
        hp.validate()?;
        Ok(hp)
    }

    /// What the architecture's `load_arch_hparams` (and graph) in llama.cpp derives or fixes
    /// beyond reading keys ([`Rules`](super::arch::Rules)): gating and weight normalisation
    /// hard-coded by the graph, the default of an absent `expert_gating_func`, the derived expert
    /// width, then the architecture's own derivations (deepseek2's "lite" rule, sliding-window
    /// patterns, deepseek4's per-block arrays).
    fn apply_arch_rules(&mut self, meta: &dyn Metadata, gating_given: bool) -> Result<(), String> {
        let rules = self.arch.rules;
        match rules.gating {
            GatingRule::Fixed(g) => self.gating = g,
            GatingRule::Default(g) if !gating_given => self.gating = g,
            GatingRule::DefaultBy(f) if !gating_given => self.gating = f(self),
            _ => {}
        }
        if let Some(norm) = rules.weights_norm {
            self.expert_weights_norm = norm;
        }
        // Expert width defaults to n_ff / n_expert_used where llama.cpp derives it.
        if rules.ff_exp_from_ff && self.n_ff_exp == 0 && self.n_expert_used > 0 {
            self.n_ff_exp = self.n_ff / self.n_expert_used;
        }
        (rules.derive)(self, meta)
    }
}
