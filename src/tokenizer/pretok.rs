//! Pre-tokenizers of byte-level BPE vocabularies: which regexes split the text into words before
//! the merges run, chosen by the GGUF key `tokenizer.ggml.pre`, plus the per-family flags that
//! llama.cpp attaches to the same name (ignore_merges, clean_spaces, add_bos, ...).
//!
//! Reference: llama.cpp `src/llama-vocab.cpp` (`llm_tokenizer_bpe` and the `tokenizer_pre`
//! name table in `llama_vocab::impl::load`) and `src/unicode.cpp` (`unicode_regex_split`) of the
//! llama.cpp we link (llama-cpp-sys-4 0.11.0). The regex strings below are llama.cpp's, verbatim.
//!
//! How llama.cpp runs them, and what we do to match:
//! - The regexes apply in sequence; each splits every piece the previous ones produced into its
//!   matches *and* the gaps between them ("isolated" splitting). `$` and lookahead see only the
//!   current piece. We run fancy-regex (through `tokenizers::utils::SysRegex`) per piece.
//! - Regexes that use `\p{..}` run in llama.cpp on a "collapsed" text where each non-ASCII code
//!   point becomes one byte per Unicode category, and every letter class (`\p{Lu}`, `\p{Ll}`,
//!   `\p{Lt}`, `\p{Lm}`, `\p{Lo}`) collapses to `\p{L}`. We apply that same rewrite; `\d` is
//!   ECMAScript's ASCII `[0-9]`. The remaining semantics (leftmost-first alternation, greedy
//!   quantifiers, Unicode `\s` = White_Space) are the same in both engines.
//! - llama.cpp's hand-written splitters for the gpt2/llama3/qwen2/qwen35 regexes are exact
//!   implementations of those regexes, so the regex engine reproduces them; so is K2-Horizon's,
//!   except that its contraction test case-folds `'ſ` (U+017F) to `'s`, which we add to the
//!   regex. The AFMoE/tiny-aya digit splitter has no regex equivalent and is ported as code
//!   ([`Step::AfmoeDigits`]).
//!
//! Invariants: [`PreTokenizer::split`] returns non-empty pieces that concatenate to the input;
//! an unknown `tokenizer.ggml.pre` is an error (llama.cpp refuses to load such a file), a missing
//! one falls back to `default` with a warning (as llama.cpp does).
use tokenizers::utils::SysRegex;

/// llama.cpp's flags for one pre-tokenizer family.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PreSpec {
    /// llama.cpp's `LLAMA_VOCAB_PRE_TYPE_*` name, lowercase.
    pub kind: &'static str,
    pub regexes: &'static [&'static str],
    /// Whole words that are tokens skip the merges (llama3, tekken, glm4, ...).
    pub ignore_merges: bool,
    /// `clean_up_tokenization_spaces` when detokenizing.
    pub clean_spaces: bool,
    /// Sets add_bos to true before the GGUF's `tokenizer.ggml.add_bos_token` is read.
    pub add_bos: bool,
    /// chatglm: no BOS unless the GGUF names one.
    pub no_bos: bool,
    /// SPM-style BPE (gemma4): spaces become U+2581 and words are raw UTF-8, not GPT-2 bytes.
    pub escape_whitespaces: bool,
}

/// Marks llama.cpp's custom AFMoE digit splitter in a regex list.
const AFMOE_DIGITS: &str = "\u{0}afmoe-digits";

const RE_LLAMA3: &[&str] = &[
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
];
const RE_JAIS2: &[&str] = &[
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s{512}(?!\\S)|\\s{256}(?!\\S)|\\s{128}(?!\\S)|\\s{64}(?!\\S)|\\s{32}(?!\\S)|\\s{16}(?!\\S)|\\s{8}(?!\\S)|\\s{4}(?!\\S)|\\s{1,2}(?!\\S)|\\s{1}",
];
const RE_DEEPSEEK_LLM: &[&str] = &[
    "[\r\n]",
    "\\s?[A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ-ΡΣ-ϵϷ-ҁҊ-ԯԱ-ՖႠ-ჅᎠ-Ᏽᏸ-ᏽᲐ-ᲺᲽ-Ჿᴀ-ᴫᵫ-ᵷᵹ-ᶚḀ-ἕἘ-Ἕἠ-ὅὈ-Ὅὐ-ὗὙὛὝὟ-ώᾀ-ᾴᾶ-ᾼιῂ-ῄῆ-ῌῐ-ΐῖ-Ίῠ-Ῥῲ-ῴῶ-ῼℂℇℊ-ℓℕℙ-ℝℤΩℨK-ℭℯ-ℴℹℼ-ℿⅅ-ⅉⅎↃↄⰀ-ⱻⱾ-ⳤⳫ-ⳮⳲⳳꙀ-ꙭꚀ-ꚛꜢ-ꝯꝱ-ꞇꞋ-ꞎꭰ-ꮿﬀ-ﬆﬓ-ﬗＡ-Ｚａ-ｚ𐐀-𐑏𐒰-𐓓𐓘-𐓻𐲀-𐲲𐳀-𐳲𑢠-𑣟𞤀-𞥃]+",
    "\\s?[!-/:-~！-／：-～‘-‟　-。]+",
    "\\s+$",
    "[一-龥ࠀ-一가-퟿]+",
    "\\p{N}+",
];
const RE_DEEPSEEK3_LLM: &[&str] = &[
    "\\p{N}{1,3}",
    "[一-龥぀-ゟ゠-ヿ]+",
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+",
];
const RE_SPARK2_5: &[&str] = &[
    "\\p{N}{1,3}",
    "[一-龥぀-ゟ゠-ヿ]+",
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+|[\r\n]|\\s+(?!\\S)|\\s+",
    "\\p{N}",
];
const RE_FLINT: &[&str] = &[
    "\\p{N}{1,3}",
    "[一-龥぀-ゟ゠-ヿ]+",
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?| ?[\\p{P}\\p{S}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
];
const RE_YOUTU: &[&str] = &[
    "[가-힣ㄱ-ㆎ]+|[！…“”‘’—：；，、-〿︰-﹏]+|[ㄅ-ㄯ]+|[一-龥぀-ゟ゠-ヿ]+",
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
];
const RE_DEEPSEEK_CODER: &[&str] = &[
    "[\r\n]",
    "\\s?\\p{L}+",
    "\\s?\\p{P}+",
    "[一-龥ࠀ-一가-퟿]+",
    "\\p{N}",
];
const RE_FALCON: &[&str] = &[
    "[\\p{P}\\$\\+<=>\\^~\\|`]+",
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)",
    "[0-9][0-9][0-9]",
];
const RE_STARCODER: &[&str] = &[
    "\\p{N}",
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)",
];
const RE_GPT2: &[&str] =
    &["'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)"];
const RE_STABLELM2: &[&str] = &[
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
];
const RE_QWEN35: &[&str] = &[
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
];
const RE_PORO: &[&str] = &[" ?[^(\\s|.,!?…。，、।۔،)]+"];
const RE_CHATGLM4: &[&str] = &[
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
];
const RE_VIKING: &[&str] = &[" ?[^(\\s|.,!?…。，、।۔،)]+", "\\p{N}"];
const RE_TEKKEN: &[&str] = &[
    "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}\\p{M}])([^a-z]))*((?=[\\p{L}\\p{M}])([^A-Z]))+|[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}\\p{M}])([^a-z]))+((?=[\\p{L}\\p{M}])([^A-Z]))*|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
];
const RE_TEKKEN_NUM3: &[&str] = &[
    "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}\\p{M}])([^a-z]))*((?=[\\p{L}\\p{M}])([^A-Z]))+|[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}\\p{M}])([^a-z]))+((?=[\\p{L}\\p{M}])([^A-Z]))*|\\p{N}{1,3}(?=(?:\\p{N}{3})*(?!\\p{N}))|\\p{N}{1,2}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
];
const RE_CHAMELEON: &[&str] = &[
    "<sentinel:[0-9]+>",
    "(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z",
    "([\\t\\n]|    |  )",
    "\\p{N}",
    "[\\p{P}!-/:-@\\[-`{-~]",
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)",
];
const RE_GPT4O: &[&str] = &[
    "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}\\p{M}])([^a-z]))*((?=[\\p{L}\\p{M}])([^A-Z]))+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}\\p{M}])([^a-z]))+((?=[\\p{L}\\p{M}])([^A-Z]))*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
];
const RE_GRANITE_EMB_MULTI: &[&str] = &[
    "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}\\p{M}])([^a-z]))*((?=[\\p{L}\\p{M}])([^A-Z]))+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}\\p{M}])([^a-z]))+((?=[\\p{L}\\p{M}])([^A-Z]))*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
];
const RE_TINY_AYA: &[&str] = &[
    AFMOE_DIGITS,
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
];
const RE_SUPERBPE: &[&str] = &["\\p{N}+", "(?=(\\d{3})+(?!\\d))"];
const RE_BAILINGMOE: &[&str] = &[
    "'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]|\\s+(?!\\S)|\\s+",
];
const RE_SEED_CODER: &[&str] = &[
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1}| ?[^\\s\\p{L}\\p{N}\\r\\n]+|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
];
const RE_UFAKZEKA: &[&str] = &[
    "[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
];
const RE_GROK_2: &[&str] = &[
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
];
const RE_AFMOE: &[&str] = &[
    AFMOE_DIGITS,
    "[一-鿿㐀-䶿豈-﫿぀-ゟ゠-ヿ･-ﾟ⼀-⿟เ-๿຀-໿ក-៿က-႟ꩠ-ꩿꧠ-꧿가-힯ᄀ-ᇿ]+",
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\\r\\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
];
const RE_LAGUNA: &[&str] = &[
    "[^\\n]+|[\\n]+",
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
];
const RE_EXAONE_MOE: &[&str] = &[
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?(?:\\p{L}\\p{M}*(?: \\p{L}\\p{M}*)*)+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]?|\\s*[\\r\\n]|\\s+(?!\\S)|\\s+",
];
const RE_GEMMA4: &[&str] = &["[^\\n]+|[\\n]+"];
const RE_MINICPM5: &[&str] = &[
    "\\p{N}{1,3}",
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}+| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
];
const RE_K2_HORIZON: &[&str] = &[
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?(?:\\p{L}|\\p{M}|\\u200C|\\u200D)+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
];
const RE_DEFAULT: &[&str] = &[
    "[\\p{P}\\$\\+<=>\\^~\\|]+",
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)",
    "\\p{N}+",
    "[0-9][0-9][0-9]",
];

const fn spec(kind: &'static str, regexes: &'static [&'static str]) -> PreSpec {
    PreSpec {
        kind,
        regexes,
        ignore_merges: false,
        clean_spaces: true,
        add_bos: false,
        no_bos: false,
        escape_whitespaces: false,
    }
}

/// The spec of `tokenizer.ggml.pre` = `name`, as llama.cpp's load() maps it; None if unknown.
pub(crate) fn lookup(name: &str) -> Option<PreSpec> {
    let s = |kind, re| spec(kind, re);
    // ignore_merges, no clean_spaces, add_bos, ... are applied below per name.
    let mut p = match name {
        "flint" => s("flint", RE_FLINT),
        "default" => s("default", RE_DEFAULT),
        "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon-h1" | "midm-2.0" | "lfm2"
        | "jina-v5-nano" => s("llama3", RE_LLAMA3),
        "minicpm5" => s("minicpm5", RE_MINICPM5),
        "deepseek-llm" => s("deepseek-llm", RE_DEEPSEEK_LLM),
        "deepseek-coder" => s("deepseek-coder", RE_DEEPSEEK_CODER),
        "deepseek-v3" => s("deepseek3-llm", RE_DEEPSEEK3_LLM),
        "spark2_5" => s("spark2_5", RE_SPARK2_5),
        "youtu" => s("youtu", RE_YOUTU),
        "falcon" => s("falcon", RE_FALCON),
        "mpt" => s("mpt", RE_GPT2),
        "starcoder" => s("starcoder", RE_STARCODER),
        "gpt-2" | "phi-2" | "jina-es" | "jina-de" | "gigachat" | "jina-v2-es" | "jina-v2-de"
        | "a.x-4.0" | "mellum" | "modern-bert" | "jina-v1-en" | "jina-v2-code" | "roberta-bpe"
        | "exaone4" => s("gpt2", RE_GPT2),
        "jais-2" => s("jais2", RE_JAIS2),
        "gemma4" | "granite-embed-multi-311m" => s("gemma4", RE_GEMMA4),
        "sarvam-moe" => s("sarvam-moe", RE_GEMMA4),
        "refact" => s("refact", RE_STARCODER),
        "command-r" => s("command-r", RE_STARCODER),
        "qwen2" | "deepseek-r1-qwen" | "kormo" | "f2llmv2" | "megrez" => s("qwen2", RE_STABLELM2),
        "qwen35" => s("qwen35", RE_QWEN35),
        "stablelm2" => s("stablelm2", RE_STABLELM2),
        "olmo" => s("olmo", RE_GPT2),
        "dbrx" => s("dbrx", RE_LLAMA3),
        "smaug-bpe" => s("smaug", RE_LLAMA3),
        "poro-chat" => s("poro", RE_PORO),
        "chatglm-bpe" | "glm4" | "glm5" => s("chatglm4", RE_CHATGLM4),
        "viking" => s("viking", RE_VIKING),
        "jais" => s("jais", RE_GPT2),
        "tekken" | "pixtral" => s("tekken", RE_TEKKEN),
        "tekken-num3" => s("tekken-num3", RE_TEKKEN_NUM3),
        "smollm" => s("smollm", RE_STARCODER),
        "codeshell" => s("codeshell", RE_STARCODER),
        "bloom" => s("bloom", RE_PORO),
        "gpt3-finnish" => s("gpt3-finnish", RE_PORO),
        "exaone" => s("exaone", RE_STARCODER),
        "exaone-moe" => s("exaone-moe", RE_EXAONE_MOE),
        "chameleon" => s("chameleon", RE_CHAMELEON),
        "minerva-7b" => s("minerva", RE_STARCODER),
        "domyn-small" => s("domyn-small", RE_GEMMA4),
        "gpt-4o" | "llama4" | "kanana2" | "talkie" => s("gpt4o", RE_GPT4O),
        "minimax-m2" => s("minimax-m2", RE_GPT4O),
        "granite-embed-multi-97m" => s("granite-emb-multi", RE_GRANITE_EMB_MULTI),
        "tiny_aya" | "cohere2moe" => s("tiny-aya", RE_TINY_AYA),
        "superbpe" => s("superbpe", RE_SUPERBPE),
        "trillion" => s("trillion", RE_GPT2),
        "granite-docling" => s("granite-docling", RE_GPT2),
        "bailingmoe" | "bailingmoe2" | "llada-moe" => s("bailingmoe", RE_BAILINGMOE),
        "seed-coder" => s("seed-coder", RE_SEED_CODER),
        "hunyuan" => s("hunyuan", RE_STABLELM2),
        "hunyuan-dense" => s("hunyuan-dense", RE_DEEPSEEK3_LLM),
        "hy_v4" => s("hy-v4", RE_DEEPSEEK3_LLM),
        "joyai-llm" => s("joyai-llm", RE_DEEPSEEK3_LLM),
        "ufakzeka" => s("ufakzeka", RE_UFAKZEKA),
        "grok-2" => s("grok-2", RE_GROK_2),
        "afmoe" => s("afmoe", RE_AFMOE),
        "laguna" => s("laguna", RE_LAGUNA),
        "solar-open" => s("solar-open", RE_STABLELM2),
        "mellum2" => s("mellum2", RE_STARCODER),
        "k2-horizon" => s("k2-horizon", RE_K2_HORIZON),
        "nemotron-3.5-embed" => s("nemotron-3-5-embd", RE_TEKKEN),
        _ => return None,
    };
    p.ignore_merges = matches!(
        name,
        "minicpm5"
            | "llama3"
            | "llama-v3"
            | "llama-bpe"
            | "falcon3"
            | "falcon-h1"
            | "pixtral"
            | "midm-2.0"
            | "lfm2"
            | "jina-v5-nano"
            | "youtu"
            | "glm4"
            | "glm5"
            | "tekken"
            | "tekken-num3"
            | "granite-embed-multi-97m"
            | "nemotron-3.5-embed"
    );
    p.add_bos = matches!(
        p.kind,
        "llama3" | "tekken" | "tekken-num3" | "chameleon" | "nemotron-3-5-embd"
    );
    p.no_bos = p.kind == "chatglm4";
    p.escape_whitespaces = matches!(p.kind, "gemma4" | "sarvam-moe" | "domyn-small");
    // llama.cpp keeps clean_spaces (its BPE default) only for these names (a GGUF's
    // `tokenizer.ggml.clean_spaces` overrides it, see `vocab::load`).
    p.clean_spaces = matches!(
        name,
        "default"
            | "llama3"
            | "llama-v3"
            | "llama-bpe"
            | "falcon3"
            | "falcon-h1"
            | "midm-2.0"
            | "jina-v5-nano"
            | "falcon"
            | "mpt"
            | "starcoder"
            | "gpt-2"
            | "phi-2"
            | "jina-es"
            | "jina-de"
            | "gigachat"
            | "jina-v2-es"
            | "jina-v2-de"
            | "a.x-4.0"
            | "mellum"
            | "modern-bert"
            | "jina-v1-en"
            | "jina-v2-code"
            | "roberta-bpe"
            | "jais-2"
            | "refact"
            | "stablelm2"
            | "olmo"
            | "smaug-bpe"
            | "jais"
            | "codeshell"
            | "bloom"
            | "gpt3-finnish"
            | "exaone"
            | "exaone-moe"
            | "minerva-7b"
            | "domyn-small"
            | "megrez"
            | "nemotron-3.5-embed"
    );
    Some(p)
}

/// Names llama.cpp knows but we do not implement (custom code in llama.cpp, or not a BPE
/// pre-tokenizer of a generative model); their files are rejected with a clear error. Soprano
/// lowercases and collapses whitespace with llama.cpp's Unicode case tables, maps unknown pieces
/// to the unknown token and renders pieces raw: machinery we do not have.
pub(crate) const KNOWN_UNSUPPORTED: &[&str] = &["kimi-k2", "mmbert", "whitespace", "soprano"];

/// One splitting step.
pub(crate) enum Step {
    Regex(SysRegex),
    /// llama.cpp's `unicode_regex_split_custom_afmoe`.
    AfmoeDigits,
}

/// A compiled pre-tokenizer: the steps of one [`PreSpec`].
pub(crate) struct PreTokenizer {
    steps: Vec<Step>,
}

/// llama.cpp's rewrite of a regex that it runs on collapsed text (see the module docs), or the
/// regex its hand-written splitter implements.
fn as_llama_cpp_runs_it(re: &str) -> String {
    if re == RE_K2_HORIZON[0] {
        // `unicode_regex_split_custom_k2_horizon` lowercases the letter after the apostrophe and
        // also takes the long s (U+017F) for 's'.
        return re.replacen("'[sS]", "'[sS\u{17F}]", 1);
    }
    const CATEGORIES: [&str; 10] = [
        "\\p{N}", "\\p{L}", "\\p{P}", "\\p{M}", "\\p{S}", "\\p{Lu}", "\\p{Ll}", "\\p{Lt}",
        "\\p{Lm}", "\\p{Lo}",
    ];
    let mut out = re.replace("\\d", "[0-9]");
    if CATEGORIES.iter().any(|c| re.contains(c)) {
        for c in ["\\p{Lu}", "\\p{Ll}", "\\p{Lt}", "\\p{Lm}", "\\p{Lo}"] {
            out = out.replace(c, "\\p{L}");
        }
    }
    out
}

impl PreTokenizer {
    pub(crate) fn new(spec: &PreSpec) -> Result<Self, String> {
        let steps = spec
            .regexes
            .iter()
            .map(|&re| {
                if re == AFMOE_DIGITS {
                    return Ok(Step::AfmoeDigits);
                }
                SysRegex::new(&as_llama_cpp_runs_it(re))
                    .map(Step::Regex)
                    .map_err(|e| format!("regex {re:?} of pre-tokenizer '{}': {e}", spec.kind))
            })
            .collect::<Result<_, _>>()?;
        Ok(Self { steps })
    }

    /// Splits `text` into words: non-empty, in order, concatenating to `text`.
    pub(crate) fn split<'t>(&self, text: &'t str) -> Vec<&'t str> {
        let mut pieces = vec![text];
        for step in &self.steps {
            let mut next = Vec::with_capacity(pieces.len() * 2);
            for piece in pieces {
                match step {
                    Step::Regex(re) => isolate(re, piece, &mut next),
                    Step::AfmoeDigits => afmoe_digits(piece, &mut next),
                }
            }
            pieces = next;
        }
        pieces.retain(|p| !p.is_empty());
        pieces
    }
}

/// Matches and the gaps between them, in order (llama.cpp's `unicode_regex_split_stl`).
fn isolate<'t>(re: &SysRegex, piece: &'t str, out: &mut Vec<&'t str>) {
    let mut prev = 0;
    for (start, end) in re.find_iter(piece) {
        if start > prev {
            out.push(&piece[prev..start]);
        }
        if end > start {
            out.push(&piece[start..end]);
        }
        prev = prev.max(end);
    }
    if prev < piece.len() {
        out.push(&piece[prev..]);
    }
}

/// Each run of numeric code points is cut after its first `len % 3` digits and then every 3;
/// everything before a cut (including non-digits) ends there. A faithful port of llama.cpp's
/// `unicode_regex_split_custom_afmoe`, quirks included.
fn afmoe_digits<'t>(piece: &'t str, out: &mut Vec<&'t str>) {
    let cpts: Vec<(usize, char)> = piece.char_indices().collect();
    let byte_at = |i: usize| cpts.get(i).map_or(piece.len(), |&(b, _)| b);
    let mut prev_end = 0usize; // in code points
    let mut emit = |end: usize, prev_end: &mut usize| {
        if end > *prev_end {
            out.push(&piece[byte_at(*prev_end)..byte_at(end)]);
        }
        *prev_end = end;
    };
    let mut pos = 0;
    while pos < cpts.len() {
        if cpts[pos].1.is_numeric() {
            let start = pos;
            while pos < cpts.len() && cpts[pos].1.is_numeric() {
                pos += 1;
            }
            let count = pos - start;
            let mut cur = start;
            if count % 3 > 0 {
                cur += count % 3;
                emit(cur, &mut prev_end);
            }
            while cur < start + count {
                cur += 3;
                emit(cur, &mut prev_end);
            }
            continue;
        }
        pos += 1;
    }
    if prev_end < cpts.len() {
        emit(cpts.len(), &mut prev_end);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(pre: &str, text: &str) -> Vec<String> {
        let spec = lookup(pre).unwrap();
        let p = PreTokenizer::new(&spec).unwrap();
        let v = p.split(text);
        assert_eq!(v.concat(), text, "{pre}: pieces must cover the text");
        v.into_iter().map(String::from).collect()
    }

    #[test]
    fn every_known_spec_compiles() {
        for name in [
            "default",
            "llama-bpe",
            "minicpm5",
            "deepseek-llm",
            "deepseek-coder",
            "deepseek-v3",
            "spark2_5",
            "youtu",
            "falcon",
            "mpt",
            "starcoder",
            "gpt-2",
            "jais-2",
            "gemma4",
            "qwen2",
            "qwen35",
            "poro-chat",
            "glm4",
            "viking",
            "tekken",
            "chameleon",
            "gpt-4o",
            "granite-embed-multi-97m",
            "tiny_aya",
            "superbpe",
            "bailingmoe",
            "seed-coder",
            "ufakzeka",
            "grok-2",
            "afmoe",
            "laguna",
            "exaone-moe",
            "command-r",
            "olmo",
            "flint",
            "pixtral",
            "tekken-num3",
            "domyn-small",
            "k2-horizon",
            "nemotron-3.5-embed",
        ] {
            let spec = lookup(name).unwrap_or_else(|| panic!("{name} unknown"));
            PreTokenizer::new(&spec).unwrap_or_else(|e| panic!("{name}: {e}"));
        }
        assert!(lookup("kimi-k2").is_none() && lookup("no-such-pre").is_none());
        assert!(lookup("soprano").is_none() && KNOWN_UNSUPPORTED.contains(&"soprano"));
    }

    #[test]
    fn llama3_splits_like_its_regex() {
        let v = split("llama3", "Hello world!!  I'M 12345\n\n  x");
        assert_eq!(
            v,
            ["Hello", " world", "!!", " ", " I", "'M", " ", "123", "45", "\n\n", " ", " x"]
        );
    }

    #[test]
    fn new_families_split_like_llama_cpp() {
        assert_eq!(
            split("tekken-num3", "1234567 x12"),
            ["1", "234", "567", " x", "12"]
        );
        // K2-Horizon's splitter takes 'ſ as a contraction and keeps ZWJ/ZWNJ in words.
        assert_eq!(
            split("k2-horizon", "it'ſt a\u{200D}b"),
            ["it", "'ſ", "t", " a\u{200D}b"]
        );
        assert_eq!(split("pixtral", "e\u{301}X"), split("tekken", "e\u{301}X"));
    }

    #[test]
    fn afmoe_digits_group_from_the_right() {
        let mut out = Vec::new();
        afmoe_digits("ab1234567 x12", &mut out);
        assert_eq!(out, ["ab1", "234", "567", " x12"]);
    }
}
