//! `POST /infill` (llama-server's fill-in-the-middle) on `pocketmoe-serve` with the tiny synth
//! model (qwen3moe), given FIM token ids through the GGUF keys llama.cpp reads
//! (`tokenizer.ggml.fim_{pre,suf,mid,rep,sep}_token_id`):
//! - `infill_prompt_is_llama_servers`: the prompt the server generates from is llama-server's
//!   repo-level FIM layout with its budget (`-b 64`: the prefix's last 48 tokens, the suffix's
//!   first `16 - 2 - len(prompt)`, the extra context's last `n_ctx - n_batch - 2 * n_predict`),
//!   built here independently with the library's tokenizer: the answer echoes it (`prompt`,
//!   `tokens_evaluated`) and, greedy, generates exactly what `/completion` generates from those
//!   ids; the answer has `/completion`'s shape; streaming works; `--spm-infill` puts the suffix
//!   part first.
//! - `infill_without_file_separator`: without repo/file-separator tokens the chunks are joined
//!   by llama-server's snippet separator.
//! - `infill_fim_tokens_found_by_text`: a vocabulary with `<|fim_prefix|>`, `<|fim_suffix|>`,
//!   `<|fim_middle|>` and no FIM keys (llama.cpp finds them by text) serves `/infill`.
//! - `infill_errors`: missing or mistyped fields get 400s naming the field.
//! - `infill_refused_without_fim_tokens`: a model without FIM tokens gets llama-server's 501.
mod common;

use pocketmoe::gguf::{GgufArray, GgufModel, GgufValue};
use pocketmoe::synth::quantmix::QuantMix;
use pocketmoe::tokenizer::Tokenizer;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

const KEY: &str = "infill-key";

fn base() -> &'static Path {
    static MODEL: OnceLock<PathBuf> = OnceLock::new();
    MODEL.get_or_init(|| common::synth_tiny("server-infill", "qwen3moe", QuantMix::Q8_0, 1.0, 5))
}

/// The tiny model with FIM prefix/suffix/middle tokens, and repo/file-separator ones when
/// `repo`.
fn fim_model(repo: bool) -> PathBuf {
    let tok = Tokenizer::from_gguf(&GgufModel::open(base()).unwrap()).unwrap();
    let id = |t: &str| GgufValue::U32(tok.token_id(t).unwrap());
    let mut keys = vec![
        ("tokenizer.ggml.fim_pre_token_id", id("<|start|>")),
        ("tokenizer.ggml.fim_suf_token_id", id("<|message|>")),
        ("tokenizer.ggml.fim_mid_token_id", id("<|channel|>")),
    ];
    if repo {
        keys.push(("tokenizer.ggml.fim_rep_token_id", id("<|end|>")));
        keys.push(("tokenizer.ggml.fim_sep_token_id", id("<|return|>")));
    }
    let dir = base().parent().unwrap();
    let mut from = base().to_path_buf();
    for (i, (k, v)) in keys.iter().enumerate() {
        let to = dir.join(format!("fim-{repo}-{i}.gguf"));
        common::write_with_key(&GgufModel::open(&from).unwrap(), k, v, &to);
        from = to;
    }
    from
}

/// The tiny model with three control tokens renamed to Qwen's FIM texts and no FIM keys:
/// llama.cpp's vocabulary finds FIM tokens by their text, and so must ours.
fn fim_by_text() -> PathBuf {
    let base_file = GgufModel::open(base()).unwrap();
    let tokens = match base_file.metadata().get("tokenizer.ggml.tokens").unwrap() {
        GgufValue::Array(GgufArray::Str(t)) => t.clone(),
        v => panic!("tokens: {v:?}"),
    };
    let renamed: Vec<String> = tokens
        .into_iter()
        .map(|t| match t.as_str() {
            "<|start|>" => "<|fim_prefix|>".to_string(),
            "<|message|>" => "<|fim_suffix|>".to_string(),
            "<|channel|>" => "<|fim_middle|>".to_string(),
            _ => t,
        })
        .collect();
    let out = base().parent().unwrap().join("fim-by-text.gguf");
    common::write_with_key(
        &base_file,
        "tokenizer.ggml.tokens",
        &GgufValue::Array(GgufArray::Str(renamed)),
        &out,
    );
    out
}

fn models() -> &'static (PathBuf, PathBuf) {
    static M: OnceLock<(PathBuf, PathBuf)> = OnceLock::new();
    M.get_or_init(|| (fim_model(true), fim_model(false)))
}

struct Server {
    _child: common::Served,
    addr: String,
}

impl Server {
    fn start(model: &Path, extra: &[&str]) -> Self {
        let (_child, addr) = common::serve_model(
            model,
            &[
                "--port",
                "0",
                "--threads",
                "2",
                "--api-key",
                KEY,
                "--ctx",
                "256",
                "-b",
                "64",
                "-n",
                "16",
                "--temp",
                "0",
            ],
            extra,
        );
        Server { _child, addr }
    }
}

fn post_raw(addr: &str, path: &str, body: &Value) -> (u16, String) {
    common::post_text(addr, path, body, Some(KEY))
}

fn post(addr: &str, path: &str, body: &Value) -> (u16, Value) {
    let (status, text) = post_raw(addr, path, body);
    let v = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}: {text}"));
    (status, v)
}

fn assert_error(status: u16, v: &Value, want_status: u16, want_type: &str, msg: &str) {
    assert_eq!(status, want_status, "{v}");
    assert_eq!(v["error"]["type"], want_type, "{v}");
    let m = v["error"]["message"].as_str().unwrap_or_default();
    assert!(m.contains(msg), "{m:?} lacks {msg:?}");
}

const PREFIX: &str = "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number, computed the slow way so that the prefix is long enough to be cut.\"\"\"\n    if n < 2:\n        return n\n    a = fibonacci(n - 1)\n    b = ";
const SUFFIX: &str = "\n    return a + b\n\nprint(fibonacci(10))\nprint(fibonacci(20))\n# the end of the file, long enough to be cut as well\n";
const EXTRA: &str = "import math\nimport sys\n\ndef helper(x):\n    return math.sqrt(x) + sys.maxsize % 7\n\nclass Thing:\n    pass\n";

/// llama-server's infill prompt for the fields above, written out for this test: `repo` says
/// whether the model has repo/file-separator tokens, `spm` the order.
fn expected(model: &Path, prompt: &str, repo: bool, spm: bool) -> Vec<u32> {
    let tok = Tokenizer::from_gguf(&GgufModel::open(model).unwrap()).unwrap();
    let t = |s: &str| tok.encode(s, false, false);
    let sp = tok.special_tokens();
    let (fim_pre, fim_suf, fim_mid) = (
        sp.fim_pre.unwrap(),
        sp.fim_suf.unwrap(),
        sp.fim_mid.unwrap(),
    );
    let (n_batch, n_ctx, n_predict) = (64usize, 256usize, 16usize);
    let mut extra = Vec::new();
    if repo {
        extra.push(sp.fim_rep.unwrap());
        extra.extend(t("myproject\n"));
        extra.push(sp.fim_sep.unwrap());
        extra.extend(t("lib/util.py\n"));
    } else {
        extra.extend(t("\n\n--- snippet ---\n\n"));
    }
    extra.extend(t(EXTRA));
    if repo {
        extra.push(sp.fim_sep.unwrap());
        extra.extend(t("filename\n"));
    }
    let prompt = tok.encode(prompt, false, true);
    let prefix = t(PREFIX);
    let suffix = t(SUFFIX);
    assert!(
        prefix.len() > 48,
        "the prefix must be long enough to be cut"
    );
    assert!(
        suffix.len() > 16,
        "the suffix must be long enough to be cut"
    );
    let keep_extra = extra.len().min(n_ctx - n_batch - 2 * n_predict);
    let mut pre = vec![fim_pre];
    pre.extend(&prefix[prefix.len() - 48..]);
    pre.extend(&prompt);
    let mut suf = vec![fim_suf];
    suf.extend(&suffix[..16 - 2 - prompt.len()]);
    let mut out = extra[extra.len() - keep_extra..].to_vec();
    if tok.add_bos() {
        out.push(tok.bos().unwrap());
    }
    if spm {
        out.extend(suf);
        out.extend(pre);
    } else {
        out.extend(pre);
        out.extend(suf);
    }
    out.push(fim_mid);
    out
}

fn text_of(model: &Path, ids: &[u32]) -> String {
    let tok = Tokenizer::from_gguf(&GgufModel::open(model).unwrap()).unwrap();
    String::from_utf8_lossy(&tok.detokenize(ids, false, true)).into_owned()
}

fn body(prompt: &str, file: &str) -> Value {
    json!({
        "input_prefix": PREFIX,
        "input_suffix": SUFFIX,
        "input_extra": [{"filename": file, "text": EXTRA}],
        "prompt": prompt,
        "n_predict": 6,
        "return_tokens": true,
    })
}

#[test]
fn infill_prompt_is_llama_servers() {
    let model = &models().0;
    let s = Server::start(model, &[]);
    let want = expected(model, "b", true, false);
    let (st, v) = post(&s.addr, "/infill", &body("b", "lib/util.py"));
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["prompt"], text_of(model, &want), "the assembled prompt");
    assert_eq!(v["tokens_evaluated"], want.len(), "{v}");
    assert_eq!(v["tokens_predicted"], 6, "{v}");
    assert_eq!(v["stop"], true);
    assert_eq!(v["stop_type"], "limit");
    for field in [
        "content",
        "tokens",
        "timings",
        "generation_settings",
        "model",
    ] {
        assert!(v.get(field).is_some(), "{field} missing: {v}");
    }
    // Greedy: what /completion generates from the very same ids.
    let (st, c) = post(
        &s.addr,
        "/completion",
        &json!({"prompt": want, "n_predict": 6, "return_tokens": true}),
    );
    assert_eq!(st, 200, "{c}");
    assert_eq!(v["tokens"], c["tokens"], "infill {v}\ncompletion {c}");
    assert_eq!(v["content"], c["content"]);

    // Streamed: pieces, then the final object (stop: true), same text.
    let mut b = body("b", "lib/util.py");
    b["stream"] = json!(true);
    let (st, text) = post_raw(&s.addr, "/infill", &b);
    assert_eq!(st, 200, "{text}");
    let events: Vec<Value> = text
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    let last = events.last().expect("events");
    assert_eq!(last["stop"], true, "{text}");
    let streamed: String = events
        .iter()
        .filter(|e| e["stop"] == false)
        .map(|e| e["content"].as_str().unwrap())
        .collect();
    assert_eq!(streamed, c["content"].as_str().unwrap());

    // Prefix and suffix as token ids and strings mixed (llama.cpp's tokenize_mixed).
    let tok = Tokenizer::from_gguf(&GgufModel::open(model).unwrap()).unwrap();
    // "def" as ids, the rest (from a pre-token boundary: " fibonacci") as text.
    let (head, rest) = PREFIX.split_at(3);
    let mut mixed: Vec<Value> = tok
        .encode(head, false, false)
        .iter()
        .map(|&i| json!(i))
        .collect();
    mixed.push(json!(rest));
    let mut b = body("b", "lib/util.py");
    b["input_prefix"] = Value::Array(mixed);
    let (st, m) = post(&s.addr, "/infill", &b);
    assert_eq!(st, 200, "{m}");
    assert_eq!(m["prompt"], v["prompt"], "mixed ids and text");
    drop(s);

    let s = Server::start(model, &["--spm-infill"]);
    let want = expected(model, "b", true, true);
    let (st, v) = post(&s.addr, "/infill", &body("b", "lib/util.py"));
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["prompt"], text_of(model, &want), "--spm-infill order");
}

#[test]
fn infill_without_file_separator() {
    let model = &models().1;
    let s = Server::start(model, &[]);
    let want = expected(model, "", false, false);
    let (st, v) = post(&s.addr, "/infill", &body("", "ignored.py"));
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["prompt"], text_of(model, &want));
    assert_eq!(v["tokens_evaluated"], want.len());
}

#[test]
fn infill_fim_tokens_found_by_text() {
    let model = fim_by_text();
    let tok = Tokenizer::from_gguf(&GgufModel::open(&model).unwrap()).unwrap();
    let sp = tok.special_tokens();
    assert_eq!(sp.fim_pre, tok.token_id("<|fim_prefix|>"));
    assert_eq!(sp.fim_suf, tok.token_id("<|fim_suffix|>"));
    assert_eq!(sp.fim_mid, tok.token_id("<|fim_middle|>"));
    assert!(sp.fim_pre.is_some() && sp.fim_rep.is_none() && sp.fim_sep.is_none());
    let s = Server::start(&model, &[]);
    let want = expected(&model, "", false, false);
    let (st, v) = post(&s.addr, "/infill", &body("", "x.py"));
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["prompt"], text_of(&model, &want));
}

#[test]
fn infill_errors() {
    let model = &models().0;
    let s = Server::start(model, &[]);
    let cases = [
        (
            json!({"input_suffix": "x"}),
            "input_prefix",
            "\"input_prefix\" is required",
        ),
        (
            json!({"input_prefix": "x"}),
            "input_suffix",
            "\"input_suffix\" is required",
        ),
        (
            json!({"input_prefix": "x", "input_suffix": "y", "prompt": 5}),
            "prompt",
            "\"prompt\" must be a string",
        ),
        (
            json!({"input_prefix": "x", "input_suffix": "y", "input_extra": "z"}),
            "input_extra",
            "must be an array",
        ),
        (
            json!({"input_prefix": "x", "input_suffix": "y", "input_extra": [{"filename": "a"}]}),
            "input_extra",
            "\"text\" field",
        ),
        (
            json!({"input_prefix": {"a": 1}, "input_suffix": "y"}),
            "input_prefix",
            "must be a string or a list",
        ),
        (
            json!({"input_prefix": [1, 99999999], "input_suffix": "y"}),
            "input_prefix",
            "not a token id",
        ),
        (
            json!({"input_prefix": "x", "input_suffix": "y", "n_probs": 50}),
            "n_probs",
            "n_probs",
        ),
    ];
    for (b, param, msg) in cases {
        let (st, v) = post(&s.addr, "/infill", &b);
        assert_error(st, &v, 400, "invalid_request_error", msg);
        assert_eq!(v["error"]["param"], param, "{v}");
    }
    let (st, text) = post_raw(&s.addr, "/infill", &json!([1]));
    assert_eq!(st, 400, "{text}");
}

#[test]
fn infill_refused_without_fim_tokens() {
    let s = Server::start(base(), &[]);
    let (st, v) = post(
        &s.addr,
        "/infill",
        &json!({"input_prefix": "a", "input_suffix": "b"}),
    );
    assert_error(
        st,
        &v,
        501,
        "not_supported_error",
        "Infill is not supported by this model: prefix token is missing. suffix token is missing. middle token is missing.",
    );
}
