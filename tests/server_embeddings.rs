//! Embeddings on `pocketmoe-serve --embedding` with the tiny synth model (qwen3moe):
//! - `openai_and_native_shapes`: `/v1/embeddings` in OpenAI's shape (`object`, `data[i]`
//!   with `index` and `embedding`, `usage.prompt_tokens` = the input's tokens, the alias as
//!   `model` whatever the request names), L2-normalised, equal to the library's own mean-pooled
//!   embedding; several inputs (strings, token ids, lists of ids) one item each; base64 equals
//!   the floats; `embd_normalize: -1` gives the raw pooled vector; `/embedding` and
//!   `/embeddings` in llama-server's native shape; empty input and bad fields get 400s.
//! - `pooling_none_is_per_position`: with `--pooling none`, `/embedding` gives one raw vector
//!   per input token and `/v1/embeddings` is refused with llama-server's message.
//! - `refused_without_the_flag`: without `--embedding`, 501 `not_supported_error`.
//! - `openai_client_embeddings`: the `openai` Python client's `embeddings.create`, floats and
//!   base64, with a foreign model name.
mod common;

use pocketmoe::engine::embed::{normalize, Pooler, Pooling};
use pocketmoe::gguf::GgufModel;
use pocketmoe::synth::quantmix::QuantMix;
use pocketmoe::tokenizer::Tokenizer;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

const KEY: &str = "embd-key";
const TEXT: &str = "Hello world, embeddings of a tiny model";

fn model() -> &'static Path {
    static MODEL: OnceLock<PathBuf> = OnceLock::new();
    MODEL
        .get_or_init(|| common::synth_tiny("server-embeddings", "qwen3moe", QuantMix::Q8_0, 1.0, 5))
}

struct Server {
    _child: common::Served,
    addr: String,
}

impl Server {
    fn start(extra: &[&str]) -> Self {
        let (_child, addr) = common::serve_model(
            model(),
            &[
                "--port",
                "0",
                "--threads",
                "2",
                "--api-key",
                KEY,
                "--alias",
                "tiny",
                "--ctx",
                "256",
            ],
            extra,
        );
        Server { _child, addr }
    }
}

fn post(addr: &str, path: &str, body: &Value) -> (u16, Value) {
    common::post_json(addr, path, body, Some(KEY))
}

fn floats(v: &Value) -> Vec<f32> {
    v.as_array()
        .unwrap_or_else(|| panic!("not a list: {v}"))
        .iter()
        .map(|x| x.as_f64().unwrap() as f32)
        .collect()
}

/// The library's ids for `text` as the server tokenizes embedding input (BOS/EOS, control
/// tokens parsed).
fn ids(text: &str) -> Vec<u32> {
    Tokenizer::from_gguf(&GgufModel::open(model()).unwrap())
        .unwrap()
        .encode(text, true, true)
}

/// The library's pooled (unnormalised) embedding of `tokens`, or its per-position rows.
fn library(tokens: &[u32], pooling: Pooling) -> Vec<Vec<f32>> {
    let mut eng = common::cpu_engine(model(), 256);
    let mut p = Pooler::new(pooling);
    p.push(eng.forward_embd(tokens).unwrap());
    p.finish()
}

/// Same vector to the last bits the batch shape may move (the server's pass is a
/// multi-sequence graph).
fn assert_close(a: &[f32], b: &[f32], what: &str) {
    assert_eq!(a.len(), b.len(), "{what}: width");
    let c = common::cosine(a, b);
    let d = common::max_abs_diff(a, b);
    assert!(
        c > 0.999999 && d < 1e-4,
        "{what}: cosine {c}, max |diff| {d}"
    );
}

fn assert_error(status: u16, v: &Value, want_status: u16, want_type: &str, msg: &str) {
    assert_eq!(status, want_status, "{v}");
    assert_eq!(v["error"]["type"], want_type, "{v}");
    let m = v["error"]["message"].as_str().unwrap_or_default();
    assert!(m.contains(msg), "{m:?} lacks {msg:?}");
}

#[test]
fn openai_and_native_shapes() {
    let s = Server::start(&["--embedding", "--pooling", "mean"]);
    let toks = ids(TEXT);
    let raw = library(&toks, Pooling::Mean).remove(0);
    let want = normalize(&raw, 2);
    let n_embd = raw.len();

    let (st, v) = post(
        &s.addr,
        "/v1/embeddings",
        &json!({"input": TEXT, "model": "text-embedding-3-small"}),
    );
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["object"], "list");
    assert_eq!(v["model"], "tiny");
    assert_eq!(v["usage"]["prompt_tokens"], toks.len());
    assert_eq!(v["usage"]["total_tokens"], toks.len());
    let d = v["data"].as_array().unwrap();
    assert_eq!(d.len(), 1);
    assert_eq!(
        (d[0]["object"].as_str(), d[0]["index"].as_u64()),
        (Some("embedding"), Some(0))
    );
    let got = floats(&d[0]["embedding"]);
    assert_eq!(got.len(), n_embd);
    let norm: f64 = got
        .iter()
        .map(|x| f64::from(*x).powi(2))
        .sum::<f64>()
        .sqrt();
    assert!((norm - 1.0).abs() < 1e-5, "L2 norm {norm}");
    assert_close(&got, &want, "/v1/embeddings vs the library");

    // Several inputs: strings, ids, lists of ids; one item each, in order.
    let other: Vec<u32> = vec![5, 17, 42, 99];
    let (st, v) = post(
        &s.addr,
        "/v1/embeddings",
        &json!({"input": [TEXT, other.clone()]}),
    );
    assert_eq!(st, 200, "{v}");
    let d = v["data"].as_array().unwrap();
    assert_eq!(d.len(), 2);
    assert_eq!(
        (d[0]["index"].as_u64(), d[1]["index"].as_u64()),
        (Some(0), Some(1))
    );
    assert_close(&floats(&d[0]["embedding"]), &want, "input[0]");
    let want_other = normalize(&library(&other, Pooling::Mean)[0], 2);
    assert_close(&floats(&d[1]["embedding"]), &want_other, "input[1] (ids)");
    assert_eq!(v["usage"]["prompt_tokens"], toks.len() + other.len());
    let (st, v) = post(&s.addr, "/v1/embeddings", &json!({"input": other.clone()}));
    assert_eq!(
        (st, v["data"].as_array().map(Vec::len)),
        (200, Some(1)),
        "{v}"
    );
    assert_close(
        &floats(&v["data"][0]["embedding"]),
        &want_other,
        "ids as one input",
    );

    // base64: the little-endian f32 bytes of the same vector.
    let (st, v) = post(
        &s.addr,
        "/v1/embeddings",
        &json!({"input": TEXT, "encoding_format": "base64"}),
    );
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["data"][0]["encoding_format"], "base64");
    let b64 = v["data"][0]["embedding"].as_str().unwrap();
    let bytes = decode_base64(b64);
    let dec: Vec<f32> = bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    assert_close(&dec, &want, "base64");

    // No normalisation: the raw mean.
    let (st, v) = post(
        &s.addr,
        "/v1/embeddings",
        &json!({"input": TEXT, "embd_normalize": -1}),
    );
    assert_eq!(st, 200, "{v}");
    assert_close(
        &floats(&v["data"][0]["embedding"]),
        &raw,
        "embd_normalize -1",
    );

    // Native shapes: [{"index", "embedding": [[...]]}].
    for (path, body) in [
        ("/embedding", json!({"content": TEXT})),
        ("/embeddings", json!({"input": TEXT})),
        ("/v1/embeddings", json!({"content": TEXT})),
    ] {
        let (st, v) = post(&s.addr, path, &body);
        assert_eq!(st, 200, "{path}: {v}");
        let a = v
            .as_array()
            .unwrap_or_else(|| panic!("{path}: not a list: {v}"));
        assert_eq!(a.len(), 1, "{path}");
        assert_eq!(a[0]["index"], 0, "{path}");
        let e = a[0]["embedding"].as_array().unwrap();
        assert_eq!(e.len(), 1, "{path}: one pooled vector");
        assert_close(&floats(&e[0]), &want, path);
    }

    // Bad requests.
    let (st, v) = post(&s.addr, "/v1/embeddings", &json!({"input": ""}));
    assert_error(
        st,
        &v,
        400,
        "invalid_request_error",
        "Input content cannot be empty",
    );
    let (st, v) = post(&s.addr, "/v1/embeddings", &json!({"model": "x"}));
    assert_error(
        st,
        &v,
        400,
        "invalid_request_error",
        "\"input\" or \"content\"",
    );
    let (st, v) = post(
        &s.addr,
        "/v1/embeddings",
        &json!({"input": "a", "encoding_format": "int8"}),
    );
    assert_error(st, &v, 400, "invalid_request_error", "float or base64");
    let (st, v) = post(&s.addr, "/v1/embeddings", &json!({"input": [1, 1_000_000]}));
    assert_error(
        st,
        &v,
        400,
        "invalid_request_error",
        "outside the vocabulary",
    );
    let (st, v) = post(&s.addr, "/v1/embeddings", &json!({"input": {"a": 1}}));
    assert_error(st, &v, 400, "invalid_request_error", "input must be");
    let long: Vec<u32> = vec![7; 300];
    let (st, v) = post(&s.addr, "/v1/embeddings", &json!({"input": long}));
    assert_error(st, &v, 400, "exceed_context_size_error", "context");
    // Completions still work beside embeddings.
    let (st, v) = post(
        &s.addr,
        "/v1/completions",
        &json!({"prompt": "Hi", "max_tokens": 3}),
    );
    assert_eq!(st, 200, "{v}");
}

fn decode_base64(s: &str) -> Vec<u8> {
    const ABC: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let vals: Vec<u32> = s
        .bytes()
        .filter(|&b| b != b'=')
        .map(|b| ABC.iter().position(|&c| c == b).expect("base64 alphabet") as u32)
        .collect();
    let mut out = Vec::new();
    for c in vals.chunks(4) {
        let n = c
            .iter()
            .enumerate()
            .fold(0u32, |n, (k, v)| n | v << (18 - 6 * k));
        out.extend(&n.to_be_bytes()[1..c.len()]);
    }
    out
}

#[test]
fn pooling_none_is_per_position() {
    let s = Server::start(&["--embeddings", "--pooling", "none"]);
    let toks = ids(TEXT);
    let rows = library(&toks, Pooling::None);
    let (st, v) = post(&s.addr, "/embedding", &json!({"content": TEXT}));
    assert_eq!(st, 200, "{v}");
    let e = v[0]["embedding"].as_array().unwrap();
    assert_eq!(e.len(), toks.len(), "one vector per position");
    for (i, (got, want)) in e.iter().zip(&rows).enumerate() {
        assert_close(
            &floats(got),
            want,
            &format!("position {i} (not normalised)"),
        );
    }
    let (st, v) = post(&s.addr, "/v1/embeddings", &json!({"input": TEXT}));
    assert_error(
        st,
        &v,
        400,
        "invalid_request_error",
        "Pooling type 'none' is not OAI compatible",
    );
}

#[test]
fn refused_without_the_flag() {
    let s = Server::start(&[]);
    for path in ["/v1/embeddings", "/embedding", "/embeddings"] {
        let (st, v) = post(&s.addr, path, &json!({"input": TEXT}));
        assert_error(
            st,
            &v,
            501,
            "not_supported_error",
            "This server does not support embeddings. Start it with `--embeddings`",
        );
    }
}

#[test]
fn openai_client_embeddings() {
    let py = common::pip_venv("openai", "3.57.0");
    let s = Server::start(&["--embedding", "--pooling", "last"]);
    let want = normalize(&library(&ids(TEXT), Pooling::Last)[0], 2);
    let script = r#"
import base64, json, struct, sys
from openai import OpenAI
c = OpenAI(base_url=sys.argv[1], api_key=sys.argv[2])
r = c.embeddings.create(model="text-embedding-3-small", input=[sys.argv[3], "second input"])
assert r.object == "list" and len(r.data) == 2, r
assert [d.index for d in r.data] == [0, 1], r
assert r.usage.prompt_tokens > 0 and r.usage.total_tokens == r.usage.prompt_tokens, r.usage
b = c.embeddings.create(model="gpt-4o", input=sys.argv[3], encoding_format="base64")
e = b.data[0].embedding
if isinstance(e, str):
    e = list(struct.unpack("<%df" % (len(base64.b64decode(e)) // 4), base64.b64decode(e)))
assert max(abs(x - y) for x, y in zip(e, r.data[0].embedding)) < 1e-6
print(json.dumps(r.data[0].embedding))
"#;
    let out = std::process::Command::new(py)
        .args(["-c", script, &format!("http://{}/v1", s.addr), KEY, TEXT])
        .output()
        .unwrap();
    let (so, se) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "openai client failed:\n{so}\n{se}");
    let got: Vec<f32> = serde_json::from_str(so.trim()).unwrap();
    assert_close(&got, &want, "openai client (pooling last)");
}
