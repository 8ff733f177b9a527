//! The vocabulary of a GGUF as llama.cpp sees it: token texts, scores and attributes, the special
//! token ids, the add-BOS/EOS flags, the end-of-generation set and the special-token list used to
//! cut text before tokenizing.
//!
//! Reference: `llama_vocab::impl::load` in llama.cpp `src/llama-vocab.cpp` (llama-cpp-sys-4
//! 0.11.0). The order of the steps is llama.cpp's, because later steps read what earlier ones
//! set: model defaults, then the pre-tokenizer's flags and the GGUF's overrides of them
//! (add_space_prefix, clean_spaces), tokens/scores/types, special ids from the GGUF, the add_*
//! flags and the Metaspace prepend scheme, detection of EOT/EOM/FIM tokens by their text (which
//! marks them control, in llama.cpp's hash-map order, see [`LibstdcxxMapOrder`]), "unused"
//! control tokens, the EOG set and its model-specific fixes (gpt-oss harmony, Gemma 4), the
//! special-token list, and finally per-model attributes (Phi-3's rstrip).
//!
//! Invariants: every id held here is < `tokens.len()`; `ids` maps each text to its unique id
//! (duplicate texts are an error, llama.cpp asserts on them); errors name the file and the key.
use super::pretok::{self, PreSpec};
use super::TokenizerError;
use crate::gguf::{GgufArray, GgufModel, GgufValue, Metadata};
use std::collections::{BTreeSet, HashMap};
use std::path::PathBuf;

/// llama.cpp's `llama_token_attr` bits.
pub mod attr {
    pub const UNKNOWN: u32 = 1 << 0;
    pub const UNUSED: u32 = 1 << 1;
    pub const NORMAL: u32 = 1 << 2;
    pub const CONTROL: u32 = 1 << 3;
    pub const USER_DEFINED: u32 = 1 << 4;
    pub const BYTE: u32 = 1 << 5;
    pub const NORMALIZED: u32 = 1 << 6;
    pub const LSTRIP: u32 = 1 << 7;
    pub const RSTRIP: u32 = 1 << 8;
    pub const SINGLE_WORD: u32 = 1 << 9;
}

/// The tokenizer algorithm a GGUF asks for (`tokenizer.ggml.model`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenizerKind {
    /// `llama`: SentencePiece BPE over scores, `<0xXX>` byte fallback, U+2581 for spaces.
    Spm,
    /// `gpt2`: byte-level BPE over ranked merges after a regex pre-tokenizer.
    Bpe,
    /// `gemma4`: BPE over merges on raw UTF-8 with U+2581 for spaces and `<0xXX>` fallback.
    BpeSpmStyle,
}

/// Special token ids (None = the model has none).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SpecialTokens {
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    pub eot: Option<u32>,
    pub eom: Option<u32>,
    pub unk: Option<u32>,
    pub sep: Option<u32>,
    pub pad: Option<u32>,
    pub mask: Option<u32>,
    pub fim_pre: Option<u32>,
    pub fim_suf: Option<u32>,
    pub fim_mid: Option<u32>,
    pub fim_pad: Option<u32>,
    pub fim_rep: Option<u32>,
    pub fim_sep: Option<u32>,
}

pub(crate) struct Vocab {
    pub path: PathBuf,
    pub kind: TokenizerKind,
    pub model: String,
    /// The pre-tokenizer (BPE kinds only).
    pub pre: Option<PreSpec>,
    pub tokens: Vec<String>,
    pub scores: Vec<f32>,
    pub attrs: Vec<u32>,
    pub ids: HashMap<String, u32>,
    pub special: SpecialTokens,
    pub add_bos: bool,
    pub add_eos: bool,
    /// `tokenizer.ggml.add_sep_token` (llama.cpp's `add_sep`; read by reranking prompts).
    pub add_sep: bool,
    pub add_space_prefix: bool,
    /// Spaces are U+2581 in token texts (SPM, Gemma 4); else GPT-2 byte symbols.
    pub escape_whitespaces: bool,
    pub clean_spaces: bool,
    /// `tokenizer.ggml.metaspace.prepend_scheme` = "first" (BPE kinds only): the first text
    /// fragment of an input gets a leading U+2581, and detokenizing drops the first rendered
    /// piece's leading space.
    pub metaspace_first: bool,
    pub eog: BTreeSet<u32>,
    /// Control, user-defined and unknown tokens, longest text first (`cache_special_tokens`).
    pub special_cache: Vec<u32>,
}

const EOT_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "<｜end▁of▁sentence｜>",
    "<end_of_utterance>",
];
const FIM_PRE_TEXTS: &[&str] = &[
    "<|fim_prefix|>",
    "<fim-prefix>",
    "<fim_prefix>",
    "<｜fim▁begin｜>",
    "<PRE>",
    "▁<PRE>",
    "<|code_prefix|>",
    "<|prefix|>",
    "<|plamo:fim_prefix|>",
];
const FIM_SUF_TEXTS: &[&str] = &[
    "<|fim_suffix|>",
    "<fim-suffix>",
    "<fim_suffix>",
    "<｜fim▁hole｜>",
    "<SUF>",
    "▁<SUF>",
    "<|code_suffix|>",
    "<|suffix|>",
    "<|plamo:fim_suffix|>",
];
const FIM_MID_TEXTS: &[&str] = &[
    "<|fim_middle|>",
    "<fim-middle>",
    "<fim_middle>",
    "<｜fim▁end｜>",
    "<MID>",
    "▁<MID>",
    "<|code_middle|>",
    "<|middle|>",
    "<|plamo:fim_middle|>",
];
const FIM_PAD_TEXTS: &[&str] = &["<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"];
const FIM_REP_TEXTS: &[&str] = &[
    "<|fim_repo|>",
    "<|repo_name|>",
    "<fim-repo>",
    "<REPO>",
    "<reponame>",
];
const FIM_SEP_TEXTS: &[&str] = &["<|file_sep|>", "<|plamo:file_separator|>"];
const EOG_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|eot|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<｜end▁of▁sentence｜>",
    "[e~[",
    "<|ifm|im_end|>",
];
/// End-of-generation texts only for the FLINT pre-tokenizer.
const EOG_TEXTS_FLINT: &[&str] = &["<|user|>", "<|observation|>"];

/// Reads the tokenizer part of `model`'s metadata.
pub(crate) fn load(model: &GgufModel) -> Result<Vocab, TokenizerError> {
    let path = model.path().to_path_buf();
    let key_err = |key: &str, msg: String| TokenizerError::Key {
        path: path.clone(),
        key: key.to_string(),
        msg,
    };
    let model_name = model.require_str("tokenizer.ggml.model")?.to_string();
    let pre_raw = match model.get("tokenizer.ggml.pre") {
        None => None,
        Some(v) => Some(v.as_str().ok_or_else(|| {
            key_err(
                "tokenizer.ggml.pre",
                format!("is {}, expected a string", v.type_name()),
            )
        })?),
    };
    let mut special = SpecialTokens::default();
    let (kind, mut add_bos, mut add_space_prefix, mut clean_spaces) = match model_name.as_str() {
        "llama" => {
            (special.bos, special.eos, special.unk) = (Some(1), Some(2), Some(0));
            (TokenizerKind::Spm, true, true, false)
        }
        "gpt2" => {
            (special.bos, special.eos) = (Some(11), Some(11));
            (TokenizerKind::Bpe, false, false, true)
        }
        "gemma4" => (TokenizerKind::BpeSpmStyle, false, false, true),
        other => {
            let what = match other {
                "bert" => "WordPiece (bert) tokenizers are not supported",
                "t5" => "Unigram (t5) tokenizers are not supported",
                "rwkv" => "RWKV tokenizers are not supported",
                "plamo2" => "PLaMo-2 tokenizers are not supported",
                "plamo3" => "PLaMo-3 tokenizers are not supported",
                "hybriddna" => "HybridDNA tokenizers are not supported",
                "whitespace" => "whitespace tokenizers are not supported",
                "no_vocab" | "none" => "the file has no vocabulary",
                _ => "unknown tokenizer model (supported: llama, gpt2, gemma4)",
            };
            return Err(TokenizerError::Unsupported {
                path,
                what: format!("tokenizer.ggml.model '{other}': {what}"),
            });
        }
    };
    let mut pre = None;
    if kind != TokenizerKind::Spm {
        let name = match (kind, pre_raw) {
            (TokenizerKind::BpeSpmStyle, _) => "gemma4",
            (_, None | Some("")) => {
                tracing::warn!(
                    "{}: tokenizer.ggml.pre is missing, using 'default' (as llama.cpp does); \
                     generation quality will be degraded, consider regenerating the model",
                    path.display()
                );
                "default"
            }
            (_, Some(name)) => name,
        };
        let spec = pretok::lookup(name).ok_or_else(|| TokenizerError::Unsupported {
            path: path.clone(),
            what: if pretok::KNOWN_UNSUPPORTED.contains(&name) {
                format!("tokenizer.ggml.pre '{name}' needs llama.cpp's custom code, not ported")
            } else {
                format!("tokenizer.ggml.pre '{name}' is unknown (llama.cpp refuses it too)")
            },
        })?;
        add_bos |= spec.add_bos;
        clean_spaces = spec.clean_spaces;
        if spec.no_bos {
            special.bos = None;
        }
        pre = Some(spec);
    }
    if let Some(v) = model.get("tokenizer.ggml.add_space_prefix") {
        add_space_prefix = bool_of(v, "tokenizer.ggml.add_space_prefix", &key_err)?;
    }
    if let Some(v) = model.get("tokenizer.ggml.clean_spaces") {
        clean_spaces = bool_of(v, "tokenizer.ggml.clean_spaces", &key_err)?;
    }

    let texts = model.require_str_array("tokenizer.ggml.tokens")?;
    let n = texts.len();
    if n == 0 || n > i32::MAX as usize {
        return Err(key_err("tokenizer.ggml.tokens", format!("has {n} tokens")));
    }
    let scores: Vec<f32> = match model.get("tokenizer.ggml.scores") {
        None => vec![0.0; n],
        Some(v) => match v.as_array() {
            Some(GgufArray::F32(s)) if s.len() >= n => s[..n].to_vec(),
            Some(GgufArray::I32(s)) if s.len() >= n => s[..n].iter().map(|&x| x as f32).collect(),
            Some(GgufArray::F32(_) | GgufArray::I32(_)) => {
                let len = v.as_array().map_or(0, |a| a.len());
                return Err(key_err(
                    "tokenizer.ggml.scores",
                    format!("{len} scores < {n} tokens"),
                ));
            }
            _ => {
                let t = v.type_name();
                return Err(key_err(
                    "tokenizer.ggml.scores",
                    format!("is {t}, expected f32/i32[]"),
                ));
            }
        },
    };
    let mut attrs = vec![attr::NORMAL; n];
    if let Some(v) = model.get("tokenizer.ggml.token_type") {
        let types = match v.as_array() {
            Some(GgufArray::I32(t)) => t,
            _ => {
                let t = v.type_name();
                return Err(key_err(
                    "tokenizer.ggml.token_type",
                    format!("is {t}, expected i32[]"),
                ));
            }
        };
        if types.len() < n {
            let len = types.len();
            return Err(key_err(
                "tokenizer.ggml.token_type",
                format!("{len} types < {n} tokens"),
            ));
        }
        for (a, &t) in attrs.iter_mut().zip(types) {
            *a = match t {
                1 => attr::NORMAL,
                2 => attr::UNKNOWN,
                3 => attr::CONTROL,
                4 => attr::USER_DEFINED,
                5 => attr::UNUSED,
                6 => attr::BYTE,
                _ => 0,
            };
        }
    }
    let mut tokens = Vec::with_capacity(n);
    let mut ids = HashMap::with_capacity(n);
    for (i, t) in texts.iter().enumerate() {
        let text = if t.is_empty() {
            tracing::warn!("{}: empty token at index {i}", path.display());
            format!("[EMPTY_{i}]")
        } else {
            t.clone()
        };
        if let Some(first) = ids.insert(text.clone(), i as u32) {
            let msg = format!("entry {i} {text:?} repeats entry {first}");
            return Err(key_err("tokenizer.ggml.tokens", msg));
        }
        tokens.push(text);
    }

    // Special ids: defaults out of range are dropped; the GGUF's ids override when in range.
    let n32 = n as u32;
    const SLOTS: [&str; 17] = [
        "bos_token_id",
        "eos_token_id",
        "eot_token_id",
        "eom_token_id",
        "unknown_token_id",
        "seperator_token_id",
        "padding_token_id",
        "mask_token_id",
        "fim_pre_token_id",
        "fim_suf_token_id",
        "fim_mid_token_id",
        "fim_pad_token_id",
        "fim_rep_token_id",
        "fim_sep_token_id",
        "prefix_token_id",
        "suffix_token_id",
        "middle_token_id",
    ];
    for name in SLOTS {
        let slot = special.slot(name);
        let key = format!("tokenizer.ggml.{name}");
        if slot.is_some_and(|id| id >= n32) {
            *slot = None;
        }
        let Some(v) = model.get(&key) else { continue };
        let id = v.as_u32().ok_or_else(|| {
            key_err(
                &key,
                format!("is {} {v}, expected a token id", v.type_name()),
            )
        })?;
        if id < n32 {
            *slot = Some(id);
        } else {
            tracing::warn!(
                "{}: {key} = {id} is outside the vocabulary of {n}",
                path.display()
            );
        }
    }
    let mut add_eos = false;
    if let Some(v) = model.get("tokenizer.ggml.add_bos_token") {
        add_bos = bool_of(v, "tokenizer.ggml.add_bos_token", &key_err)?;
    }
    if let Some(v) = model.get("tokenizer.ggml.add_eos_token") {
        add_eos = bool_of(v, "tokenizer.ggml.add_eos_token", &key_err)?;
    }
    let mut add_sep = false;
    if let Some(v) = model.get("tokenizer.ggml.add_sep_token") {
        add_sep = bool_of(v, "tokenizer.ggml.add_sep_token", &key_err)?;
    }
    if pre.is_some_and(|p| p.kind == "gemma4") {
        add_bos = true; // llama.cpp's Gemma 4 workaround (PR 21500)
    }
    let key = "tokenizer.ggml.metaspace.prepend_scheme";
    let mut metaspace_first = false;
    if let Some(v) = model.get(key) {
        let scheme = v
            .as_str()
            .ok_or_else(|| key_err(key, format!("is {}, expected a string", v.type_name())))?;
        match scheme {
            "never" => {}
            "first" => metaspace_first = kind != TokenizerKind::Spm,
            "always" if kind != TokenizerKind::Spm => {
                return Err(TokenizerError::Unsupported {
                    path,
                    what: format!(
                        "{key} 'always' is not supported for BPE vocabularies (llama.cpp \
                         refuses it too)"
                    ),
                });
            }
            "always" => {} // SPM: llama.cpp reads it but keeps add_space_prefix
            other => {
                let msg = format!("unknown scheme '{other}' (never, first, always)");
                return Err(key_err(key, msg));
            }
        }
    }

    let mut v = Vocab {
        path,
        kind,
        model: model_name,
        pre,
        tokens,
        scores,
        attrs,
        ids,
        special,
        add_bos,
        add_eos,
        add_sep,
        add_space_prefix,
        escape_whitespaces: pre.is_none_or(|p| p.escape_whitespaces),
        clean_spaces,
        metaspace_first,
        eog: BTreeSet::new(),
        special_cache: Vec::new(),
    };
    v.detect_special_by_text();
    v.build_eog();
    v.special_cache = (0..n32)
        .filter(|&id| {
            v.attrs[id as usize] & (attr::CONTROL | attr::USER_DEFINED | attr::UNKNOWN) != 0
        })
        .collect();
    v.special_cache
        .sort_by_key(|&id| std::cmp::Reverse(v.tokens[id as usize].len()));
    v.per_model_attrs(model, pre_raw.unwrap_or(""));
    Ok(v)
}

fn bool_of(
    v: &GgufValue,
    key: &str,
    key_err: &impl Fn(&str, String) -> TokenizerError,
) -> Result<bool, TokenizerError> {
    v.as_bool()
        .ok_or_else(|| key_err(key, format!("is {} {v}, expected a bool", v.type_name())))
}

impl SpecialTokens {
    /// The field a `tokenizer.ggml.<name>` key sets (llama.cpp's deprecated prefix/suffix/middle
    /// keys alias the FIM ones).
    fn slot(&mut self, name: &str) -> &mut Option<u32> {
        match name {
            "bos_token_id" => &mut self.bos,
            "eos_token_id" => &mut self.eos,
            "eot_token_id" => &mut self.eot,
            "eom_token_id" => &mut self.eom,
            "unknown_token_id" => &mut self.unk,
            "seperator_token_id" => &mut self.sep,
            "padding_token_id" => &mut self.pad,
            "mask_token_id" => &mut self.mask,
            "fim_pre_token_id" | "prefix_token_id" => &mut self.fim_pre,
            "fim_suf_token_id" | "suffix_token_id" => &mut self.fim_suf,
            "fim_mid_token_id" | "middle_token_id" => &mut self.fim_mid,
            "fim_pad_token_id" => &mut self.fim_pad,
            "fim_rep_token_id" => &mut self.fim_rep,
            _ => &mut self.fim_sep,
        }
    }
}

impl Vocab {
    pub fn id(&self, text: &str) -> Option<u32> {
        self.ids.get(text).copied()
    }

    fn set_control(&mut self, id: u32) {
        self.attrs[id as usize] |= attr::CONTROL;
    }

    /// EOT/EOM/FIM tokens found by their text when the GGUF does not name them; each found one
    /// becomes a control token. llama.cpp walks its `std::unordered_map` of token texts here and
    /// takes, per kind, the first candidate it meets, so with several candidates of one kind
    /// (`<|im_end|>`, `<|end|>` and `<|endoftext|>` for EOT) the pick is the map's order, which
    /// [`LibstdcxxMapOrder`] reproduces.
    fn detect_special_by_text(&mut self) {
        let lists: [(&str, &[&str]); 8] = [
            ("eot_token_id", EOT_TEXTS),
            ("eom_token_id", &["<|eom_id|>"]),
            ("fim_pre_token_id", FIM_PRE_TEXTS),
            ("fim_suf_token_id", FIM_SUF_TEXTS),
            ("fim_mid_token_id", FIM_MID_TEXTS),
            ("fim_pad_token_id", FIM_PAD_TEXTS),
            ("fim_rep_token_id", FIM_REP_TEXTS),
            ("fim_sep_token_id", FIM_SEP_TEXTS),
        ];
        let mut picks: Vec<(&str, Vec<u32>)> = Vec::new();
        for (slot, texts) in lists {
            if self.special.slot(slot).is_some() {
                continue;
            }
            let found: Vec<u32> = texts.iter().filter_map(|t| self.id(t)).collect();
            if !found.is_empty() {
                picks.push((slot, found));
            }
        }
        if !picks.is_empty() {
            let all: Vec<u32> = picks
                .iter()
                .flat_map(|(_, ids)| ids.iter().copied())
                .collect();
            let order = LibstdcxxMapOrder::new(&self.tokens, &all);
            for (slot, ids) in picks {
                if let Some(id) = ids.into_iter().min_by_key(|&id| order.position(id)) {
                    *self.special.slot(slot) = Some(id);
                    self.set_control(id);
                }
            }
        }
        // Control tokens named "...unused..." are unused (affects nothing we tokenize, but kept).
        for (t, a) in self.tokens.iter().zip(self.attrs.iter_mut()) {
            if *a & attr::CONTROL != 0 && t.contains("unused") {
                *a |= attr::UNUSED;
            }
        }
    }

    /// The end-of-generation set, with llama.cpp's fixes for gpt-oss and Gemma 4.
    fn build_eog(&mut self) {
        let s = &self.special;
        let mut eog: BTreeSet<u32> = [s.fim_pad, s.fim_rep, s.fim_sep]
            .into_iter()
            .flatten()
            .collect();
        let flint = self.pre.is_some_and(|p| p.kind == "flint");
        let flint_texts = if flint { EOG_TEXTS_FLINT } else { &[] };
        for text in EOG_TEXTS.iter().chain(flint_texts) {
            if let Some(id) = self.id(text) {
                eog.insert(id);
                self.set_control(id);
            }
        }
        // gpt-oss: harmony markers are always rendered (user-defined, not control).
        for text in ["<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"] {
            if let Some(id) = self.id(text) {
                self.attrs[id as usize] = attr::USER_DEFINED;
            }
        }
        let s = &self.special;
        eog.extend([s.eos, s.eot, s.eom].into_iter().flatten());
        let has = |t: &str| self.id(t).is_some_and(|id| eog.contains(&id));
        // o200k_harmony / solar-open: "<|end|>" ends a message, not the generation.
        let call = has("<|call|>") || has("<|calls|>");
        let end_not_eog = (has("<|return|>") || has("<|flush|>")) && call && has("<|end|>");
        // Gemma 4, PLaMo and Beam (whose tool-call marker need not be EOG): "</s>" is a normal
        // token there.
        let beam = self.id("<rfl:parameter name=\"").is_some();
        let s_normal = (beam || has("<|tool_response>") || has("<|plamo:eos|>")) && has("</s>");
        if let Some(end) = self.id("<|end|>").filter(|_| end_not_eog) {
            eog.remove(&end);
            self.attrs[end as usize] = attr::USER_DEFINED;
        }
        if let Some(s_id) = self.id("</s>").filter(|_| s_normal) {
            eog.remove(&s_id);
            self.attrs[s_id as usize] = attr::NORMAL;
        }
        self.eog = eog;
    }

    /// Attributes llama.cpp sets by model name: lstrip on mask tokens of some encoders, rstrip
    /// on Phi-3's special tokens (which eats the whitespace after them when tokenizing).
    fn per_model_attrs(&mut self, model: &GgufModel, pre: &str) {
        let name = model.get_str("general.name").unwrap_or("").to_lowercase();
        let arch = model.get_str("general.architecture").unwrap_or("");
        let any = |s: &str, subs: &[&str]| subs.iter().any(|x| s.contains(x));
        let set = |v: &mut Self, text: &str, a: u32, on: bool| {
            if let Some(id) = v.id(text) {
                let cur = &mut v.attrs[id as usize];
                *cur = if on { *cur | a } else { *cur & !a };
            }
        };
        if any(pre, &["jina-v2-de", "jina-v2-es", "jina-v2-code", "mmbert"])
            || any(arch, &["nomic-bert-moe", "jina-bert-v3"])
        {
            set(self, "<mask>", attr::LSTRIP, true);
        } else if any(&name, &["phi-3", "phi3"]) {
            for id in self.special_cache.clone() {
                self.attrs[id as usize] |= attr::RSTRIP;
            }
            set(self, "</s>", attr::RSTRIP, true);
            for t in ["<unk>", "<s>", "<|endoftext|>"] {
                set(self, t, attr::RSTRIP, false);
            }
        } else if name.contains("modern-bert") {
            set(self, "[MASK]", attr::LSTRIP, true);
        }
    }
}

/// The order in which llama.cpp's `std::unordered_map<std::string, llama_token> token_to_id`
/// yields its entries, as built by GCC's libstdc++ (the C++ library of the libllama we check
/// against; a libllama built with libc++ walks it otherwise, and may pick other EOT/FIM ids):
/// `reserve(n_tokens)` gives it the first bucket count of libstdc++'s prime table that is
/// `>= n_tokens` (so it never rehashes while the tokens are inserted, in id order), a token sits
/// in bucket `std::hash<std::string>(text) % buckets`, and a node goes to the front of the
/// element list when its bucket was empty, else to the front of its bucket's run. The walk
/// therefore visits buckets latest-first-filled first, and within a bucket the highest id
/// first. Only the buckets of the `ids` asked about are tracked.
struct LibstdcxxMapOrder {
    /// Per id asked about: (lowest id in its bucket, id); the walk visits larger keys first.
    keys: HashMap<u32, (u32, u32)>,
}

/// The bucket counts libstdc++'s `_Prime_rehash_policy::_M_next_bkt` picks from, up to the
/// first one above `i32::MAX` (vocabularies are smaller than that).
const LIBSTDCXX_BUCKETS: &[u64] = &[
    2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47, 53, 59, 61, 67, 71, 73, 79, 83, 89, 97,
    103, 109, 113, 127, 137, 139, 149, 157, 167, 179, 193, 199, 211, 227, 241, 257, 277, 293, 313,
    337, 359, 383, 409, 439, 467, 503, 541, 577, 619, 661, 709, 761, 823, 887, 953, 1031, 1109,
    1193, 1289, 1381, 1493, 1613, 1741, 1879, 2029, 2179, 2357, 2549, 2753, 2971, 3209, 3469, 3739,
    4027, 4349, 4703, 5087, 5503, 5953, 6427, 6949, 7517, 8123, 8783, 9497, 10273, 11113, 12011,
    12983, 14033, 15173, 16411, 17749, 19183, 20753, 22447, 24281, 26267, 28411, 30727, 33223,
    35933, 38873, 42043, 45481, 49201, 53201, 57557, 62233, 67307, 72817, 78779, 85229, 92203,
    99733, 107897, 116731, 126271, 136607, 147793, 159871, 172933, 187091, 202409, 218971, 236897,
    256279, 277261, 299951, 324503, 351061, 379787, 410857, 444487, 480881, 520241, 562841, 608903,
    658753, 712697, 771049, 834181, 902483, 976369, 1056323, 1142821, 1236397, 1337629, 1447153,
    1565659, 1693859, 1832561, 1982627, 2144977, 2320627, 2510653, 2716249, 2938679, 3179303,
    3439651, 3721303, 4026031, 4355707, 4712381, 5098259, 5515729, 5967347, 6456007, 6984629,
    7556579, 8175383, 8844859, 9569143, 10352717, 11200489, 12117689, 13109983, 14183539, 15345007,
    16601593, 17961079, 19431899, 21023161, 22744717, 24607243, 26622317, 28802401, 31160981,
    33712729, 36473443, 39460231, 42691603, 46187573, 49969847, 54061849, 58488943, 63278561,
    68460391, 74066549, 80131819, 86693767, 93793069, 101473717, 109783337, 118773397, 128499677,
    139022417, 150406843, 162723577, 176048909, 190465427, 206062531, 222936881, 241193053,
    260944219, 282312799, 305431229, 330442829, 357502601, 386778277, 418451333, 452718089,
    489790921, 529899637, 573292817, 620239453, 671030513, 725980837, 785430967, 849749479,
    919334987, 994618837, 1076067617, 1164186217, 1259520799, 1362662261, 1474249943, 1594975441,
    1725587117, 1866894511, 2019773507, 2185171673,
];

/// libstdc++'s `std::hash<std::string>` on a 64-bit target (`std::_Hash_bytes` with its seed).
fn libstdcxx_hash(bytes: &[u8]) -> u64 {
    const MUL: u64 = (0xc6a4_a793 << 32) + 0x5bd1_e995;
    const SEED: u64 = 0xc70f_6907;
    let shift_mix = |v: u64| v ^ (v >> 47);
    let mut hash = SEED ^ (bytes.len() as u64).wrapping_mul(MUL);
    let mut chunks = bytes.chunks_exact(8);
    for chunk in &mut chunks {
        let word = u64::from_le_bytes(chunk.try_into().unwrap_or_default());
        hash ^= shift_mix(word.wrapping_mul(MUL)).wrapping_mul(MUL);
        hash = hash.wrapping_mul(MUL);
    }
    let tail = chunks.remainder();
    if !tail.is_empty() {
        let word = tail
            .iter()
            .rev()
            .fold(0u64, |acc, &b| (acc << 8) | u64::from(b));
        hash ^= word;
        hash = hash.wrapping_mul(MUL);
    }
    shift_mix(shift_mix(hash).wrapping_mul(MUL))
}

impl LibstdcxxMapOrder {
    fn new(tokens: &[String], ids: &[u32]) -> Self {
        let n = tokens.len() as u64;
        let i = LIBSTDCXX_BUCKETS.partition_point(|&b| b < n);
        let buckets = LIBSTDCXX_BUCKETS[i.min(LIBSTDCXX_BUCKETS.len() - 1)];
        let bucket = |t: &str| libstdcxx_hash(t.as_bytes()) % buckets;
        let mut first: HashMap<u64, Option<u32>> = ids
            .iter()
            .map(|&id| (bucket(&tokens[id as usize]), None))
            .collect();
        for (id, t) in tokens.iter().enumerate() {
            if let Some(slot @ None) = first.get_mut(&bucket(t)) {
                *slot = Some(id as u32);
            }
        }
        let keys = ids
            .iter()
            .map(|&id| {
                let lowest = first[&bucket(&tokens[id as usize])].unwrap_or(id);
                (id, (lowest, id))
            })
            .collect();
        Self { keys }
    }

    /// Sorts by the walk: smaller is visited earlier (`id` must be one asked about).
    fn position(&self, id: u32) -> std::cmp::Reverse<(u32, u32)> {
        std::cmp::Reverse(self.keys.get(&id).copied().unwrap_or((0, id)))
    }
}

/// What a chat template needs from the vocabulary.
pub(crate) struct TemplateTokens {
    pub bos: String,
    pub eos: String,
    pub add_bos: bool,
    pub add_eos: bool,
}

/// The BOS and EOS texts and add-BOS/EOS flags of `model` as llama.cpp would use them for chat
/// templates. For tokenizer models we do not implement, the GGUF's own ids (no defaults).
pub(crate) fn template_tokens(model: &GgufModel) -> Result<TemplateTokens, TokenizerError> {
    match load(model) {
        Ok(v) => {
            let text =
                |id: Option<u32>| id.map_or(String::new(), |id| v.tokens[id as usize].clone());
            Ok(TemplateTokens {
                bos: text(v.special.bos),
                eos: text(v.special.eos),
                add_bos: v.add_bos,
                add_eos: v.add_eos,
            })
        }
        Err(TokenizerError::Unsupported { .. }) => {
            let tokens = model.get_str_array("tokenizer.ggml.tokens").unwrap_or(&[]);
            let text = |key: &str| {
                let id = model.get_u32(key);
                id.and_then(|id| tokens.get(id as usize))
                    .cloned()
                    .unwrap_or_default()
            };
            let flag = |key: &str| model.get_bool(key).unwrap_or(false);
            Ok(TemplateTokens {
                bos: text("tokenizer.ggml.bos_token_id"),
                eos: text("tokenizer.ggml.eos_token_id"),
                add_bos: flag("tokenizer.ggml.add_bos_token"),
                add_eos: flag("tokenizer.ggml.add_eos_token"),
            })
        }
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hash_is_libstdcxx_std_hash_string() {
        // Values of std::hash<std::string> from GCC 12's libstdc++ on x86_64.
        for (text, hash) in [
            ("", 6142509188972423790u64),
            ("a", 4993892634952068459),
            ("ab", 5498234120169091963),
            ("bb", 1567269223287109631),
            ("abcdefg", 16063891478991045295),
            ("abcdefgh", 8664279048047335611),
            ("abcdefghi", 13036955925923793583),
            ("hello world12345", 12782225873792802115),
            ("<|im_end|>", 2038672007907099973),
            ("<｜end▁of▁sentence｜>", 4885843127401947952),
        ] {
            assert_eq!(libstdcxx_hash(text.as_bytes()), hash, "{text:?}");
        }
    }

    #[test]
    fn map_order_is_libstdcxx_walk() {
        // std::unordered_map<std::string, int> m; m.reserve(20); m["t0"] = 0 ... m["t19"] = 19
        // walks them in this order (23 buckets; 19 and 8, 12/4/3, 9/7/2, 13/1 and 6/0 share).
        let tokens: Vec<String> = (0..20).map(|i| format!("t{i}")).collect();
        let mut ids: Vec<u32> = (0..20).collect();
        let order = LibstdcxxMapOrder::new(&tokens, &ids);
        ids.sort_by_key(|&id| order.position(id));
        let walk = [
            18, 17, 16, 15, 14, 11, 10, 19, 8, 5, 12, 4, 3, 9, 7, 2, 13, 1, 6, 0,
        ];
        assert_eq!(ids, walk);
    }
}
