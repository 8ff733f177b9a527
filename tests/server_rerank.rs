//! Reranking on `pocketmoe-serve --reranking` with the tiny synth model (qwen3moe) given a
//! BERT-style classification head (`cls.weight`, `cls.bias`, `cls.output.weight`,
//! `cls.output.bias`, random f32):
//! - `rerank_scores_are_the_heads`: `/rerank` (and `/reranking`, `/v1/rerank`,
//!   `/v1/reranking`) answers llama-server's Jina shape, best first, cut to `top_n`, each score
//!   equal to the head computed here in f64 over the library's last hidden state of
//!   llama-server's reranking prompt (`[BOS] query document` for this vocabulary), within
//!   1e-5 relative: the server runs `--batch-invariant`, so the documents' hidden states are
//!   the library's bit for bit however they are batched, and what is left is the head's sums
//!   (f32 weights, f64 sums, in another order; measured ~1e-7). Without it the batched
//!   documents' hidden states move by ~1e-5 in cosine (ggml's repacked CPU kernels round by
//!   batch shape), which this random head amplifies to ~1% of the score; `texts` gives TEI's bare list with `return_text`; embeddings are refused
//!   under rank pooling; bad bodies get 400s naming the field.
//! - `many_documents_fit_a_small_queue`: 40 documents on `--parallel 2 --queue 1` are all
//!   scored (in waves), not refused with 429.
//! - `refused_without_the_flag`: without `--reranking`, 501 with llama-server's message.
//! - `libllama_refuses_a_qwen3moe_head`: libllama cannot load the file with the head (extra
//!   tensors for its qwen3moe), so the head is checked against the f64 computation instead.
//! - `unsupported_heads_are_refused`: a head with `cls.norm.weight` (ModernBERT's) is refused
//!   at start, naming the tensor.
mod common;

use pocketmoe::gguf::{GgufModel, GgufValue, GgufWriter};
use pocketmoe::synth::quantmix::QuantMix;
use pocketmoe::tokenizer::Tokenizer;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

const KEY: &str = "rerank-key";

fn base() -> &'static Path {
    static MODEL: OnceLock<PathBuf> = OnceLock::new();
    MODEL.get_or_init(|| common::synth_tiny("server-rerank", "qwen3moe", QuantMix::Q8_0, 1.0, 5))
}

/// Deterministic values in [-scale, scale).
fn values(n: usize, seed: u64, scale: f32) -> Vec<f32> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            ((x >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
        })
        .collect()
}

/// The head added to the base model: (cls.weight rows, cls.bias, cls.output.weight, bias).
struct Head {
    w: Vec<f32>,
    b: Vec<f32>,
    wo: Vec<f32>,
    bo: f32,
    n: usize,
}

fn n_embd() -> usize {
    let f = GgufModel::open(base()).unwrap();
    match f.metadata().get("qwen3moe.embedding_length").unwrap() {
        GgufValue::U32(n) => *n as usize,
        v => panic!("embedding_length {v:?}"),
    }
}

fn head() -> Head {
    let n = n_embd();
    Head {
        w: values(n * n, 1, 0.2),
        b: values(n, 2, 0.1),
        wo: values(n, 3, 0.5),
        bo: 0.125,
        n,
    }
}

/// `base` with the head's tensors (and `extra` ones) added, as F32.
fn with_head(out: &Path, extra: &[(&str, Vec<f32>, Vec<u64>)]) -> PathBuf {
    let h = head();
    let n = h.n as u64;
    let base = GgufModel::open(base()).unwrap();
    let mut w = GgufWriter::new();
    for (k, v) in base.metadata() {
        w.add_kv(k, v.clone());
    }
    let tensors: Vec<_> = base.tensors().cloned().collect();
    for t in &tensors {
        w.add_tensor(&t.name, t.ty, t.shape()).unwrap();
    }
    let mut added: Vec<(String, Vec<f32>, Vec<u64>)> = vec![
        ("cls.weight".into(), h.w.clone(), vec![n, n]),
        ("cls.bias".into(), h.b.clone(), vec![n]),
        ("cls.output.weight".into(), h.wo.clone(), vec![n, 1]),
        ("cls.output.bias".into(), vec![h.bo], vec![1]),
    ];
    added.extend(
        extra
            .iter()
            .map(|(a, b, c)| (a.to_string(), b.clone(), c.clone())),
    );
    for (name, _, shape) in &added {
        w.add_tensor(name, pocketmoe::ggml::GgmlType::F32, shape)
            .unwrap();
    }
    w.write(out, |i, buf| {
        if i < tensors.len() {
            buf.copy_from_slice(base.tensor_data(&tensors[i]));
        } else {
            let v = &added[i - tensors.len()].1;
            buf.copy_from_slice(&v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>());
        }
        Ok(())
    })
    .unwrap();
    out.to_path_buf()
}

fn model() -> &'static Path {
    static M: OnceLock<PathBuf> = OnceLock::new();
    M.get_or_init(|| with_head(&base().parent().unwrap().join("ranker.gguf"), &[]))
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
                "--alias",
                "tiny",
            ],
            extra,
        );
        Server { _child, addr }
    }
}

fn post(addr: &str, path: &str, body: &Value) -> (u16, Value) {
    common::post_json(addr, path, body, Some(KEY))
}

fn assert_error(status: u16, v: &Value, want_status: u16, want_type: &str, msg: &str) {
    assert_eq!(status, want_status, "{v}");
    assert_eq!(v["error"]["type"], want_type, "{v}");
    let m = v["error"]["message"].as_str().unwrap_or_default();
    assert!(m.contains(msg), "{m:?} lacks {msg:?}");
}

const QUERY: &str = "Which animals live in the Andes?";
const DOCS: [&str; 4] = [
    "The llama is a domesticated South American camelid.",
    "The giant panda is a bear species endemic to China.",
    "Guanacos live in the mountains of South America.",
    "Pizza is a dish of Italian origin.",
];

/// The score of `doc`, computed here: llama-server's prompt for this vocabulary (no EOS/SEP
/// added: `[BOS]? query document`), the library's last hidden state, then the head in f64.
fn want_score(doc: &str) -> f32 {
    let tok = Tokenizer::from_gguf(&GgufModel::open(model()).unwrap()).unwrap();
    assert!(!tok.add_eos(), "the test's prompt assumes no EOS is added");
    let mut ids = Vec::new();
    if tok.add_bos() {
        ids.push(tok.bos().unwrap());
    }
    ids.extend(tok.encode(QUERY, false, false));
    ids.extend(tok.encode(doc, false, false));
    let mut eng = common::cpu_engine(model(), 256);
    let rows = eng.forward_embd(&ids).unwrap();
    let x = rows.last().unwrap();
    let h = head();
    let mid: Vec<f64> = (0..h.n)
        .map(|j| {
            let dot: f64 = (0..h.n)
                .map(|i| f64::from(h.w[j * h.n + i]) * f64::from(x[i]))
                .sum();
            (dot + f64::from(h.b[j])).tanh()
        })
        .collect();
    let s: f64 = mid
        .iter()
        .zip(&h.wo)
        .map(|(m, w)| m * f64::from(*w))
        .sum::<f64>()
        + f64::from(h.bo);
    s as f32
}

#[test]
fn rerank_scores_are_the_heads() {
    let s = Server::start(model(), &["--reranking", "--batch-invariant"]);
    let want: Vec<f32> = DOCS.iter().map(|d| want_score(d)).collect();
    let mut order: Vec<usize> = (0..DOCS.len()).collect();
    order.sort_by(|&a, &b| want[b].total_cmp(&want[a]));
    // The scores must differ enough for the order to be a real check.
    let mut sorted = want.clone();
    sorted.sort_by(|a, b| b.total_cmp(a));
    assert!(
        sorted.windows(2).all(|w| w[0] - w[1] > 1e-3),
        "scores too close to order: {want:?}"
    );
    for path in ["/rerank", "/reranking", "/v1/rerank", "/v1/reranking"] {
        let (st, v) = post(
            &s.addr,
            path,
            &json!({"model": "some-reranker", "query": QUERY, "documents": DOCS, "top_n": 3}),
        );
        assert_eq!(st, 200, "{path}: {v}");
        assert_eq!(v["model"], "tiny");
        assert_eq!(v["object"], "list");
        assert!(v["usage"]["prompt_tokens"].as_u64().unwrap() > 0, "{v}");
        let r = v["results"].as_array().unwrap();
        assert_eq!(r.len(), 3, "{path}: top_n");
        for (k, e) in r.iter().enumerate() {
            let i = e["index"].as_u64().unwrap() as usize;
            assert_eq!(i, order[k], "{path}: rank {k}: {v}");
            let got = e["relevance_score"].as_f64().unwrap() as f32;
            let tol = 1e-5 * (1.0 + want[i].abs());
            assert!(
                (got - want[i]).abs() <= tol,
                "{path}: document {i}: score {got}, want {}",
                want[i]
            );
        }
    }
    // Without top_n: all of them.
    let (st, v) = post(
        &s.addr,
        "/rerank",
        &json!({"query": QUERY, "documents": DOCS}),
    );
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["results"].as_array().unwrap().len(), DOCS.len());

    // TEI's form: `texts` in, a bare list of {index, score, text} out.
    let (st, v) = post(
        &s.addr,
        "/rerank",
        &json!({"query": QUERY, "texts": DOCS, "return_text": true}),
    );
    assert_eq!(st, 200, "{v}");
    let a = v.as_array().unwrap_or_else(|| panic!("not a list: {v}"));
    assert_eq!(a.len(), DOCS.len());
    assert_eq!(a[0]["index"], order[0]);
    assert_eq!(a[0]["text"], DOCS[order[0]]);
    assert!(a[0]["score"].is_number());

    // Embeddings are not served under rank pooling.
    let (st, v) = post(&s.addr, "/v1/embeddings", &json!({"input": "x"}));
    assert_error(st, &v, 400, "invalid_request_error", "use /rerank");

    // Bad bodies.
    for (body, param, msg) in [
        (
            json!({"documents": DOCS}),
            "query",
            "\"query\" must be provided",
        ),
        (
            json!({"query": 1, "documents": DOCS}),
            "query",
            "\"query\" must be a string",
        ),
        (
            json!({"query": "q", "documents": []}),
            "documents",
            "non-empty string array",
        ),
        (
            json!({"query": "q", "documents": [1]}),
            "documents",
            "non-empty string array",
        ),
        (json!({"query": "q"}), "documents", "non-empty string array"),
        (
            json!({"query": "q", "documents": DOCS, "top_n": -1}),
            "top_n",
            "top_n",
        ),
    ] {
        let (st, v) = post(&s.addr, "/rerank", &body);
        assert_error(st, &v, 400, "invalid_request_error", msg);
        assert_eq!(v["error"]["param"], param, "{v}");
    }
}

/// More documents than slots and queue places together: served in waves, not refused (429).
#[test]
fn many_documents_fit_a_small_queue() {
    let s = Server::start(model(), &["--reranking", "--parallel", "2", "--queue", "1"]);
    let docs: Vec<String> = (0..40).map(|i| format!("document number {i}")).collect();
    let (st, v) = post(
        &s.addr,
        "/rerank",
        &json!({"query": QUERY, "documents": docs, "top_n": 5}),
    );
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["results"].as_array().unwrap().len(), 5);
}

#[test]
fn refused_without_the_flag() {
    let s = Server::start(model(), &["--embedding", "--pooling", "mean"]);
    for path in ["/rerank", "/v1/rerank"] {
        let (st, v) = post(&s.addr, path, &json!({"query": "q", "documents": ["d"]}));
        assert_error(
            st,
            &v,
            501,
            "not_supported_error",
            "This server does not support reranking. Start it with `--reranking`",
        );
    }
}

#[test]
fn unsupported_heads_are_refused() {
    let n = n_embd();
    let path = with_head(
        &base().parent().unwrap().join("ranker-norm.gguf"),
        &[("cls.norm.weight", vec![1.0; n], vec![n as u64])],
    );
    let opts = pocketmoe::server::LocalOptions {
        model: path,
        engine: pocketmoe::engine::EngineOptions {
            device: pocketmoe::engine::Device::Cpu,
            n_ctx: 64,
            n_threads: 1,
            ..Default::default()
        },
        parallel: 1,
        max_queue: 0,
        alias: None,
        batch_invariant: false,
        parse_special_in_content: false,
        chat_template: None,
        embedding: true,
        pooling: Some(pocketmoe::engine::embed::Pooling::Rank),
        slot_similarity: 0.1,
    };
    let err = match pocketmoe::server::LocalEngine::start(opts, Box::new(|_, _| {})) {
        Ok(_) => panic!("a head with cls.norm.weight was accepted"),
        Err(e) => format!("{e:#}"),
    };
    assert!(err.contains("cls.norm.weight"), "{err}");
}

/// Why the head has no libllama oracle: libllama builds no `cls*` tensors for qwen3moe, and its
/// loader refuses a file with tensors it did not build.
#[test]
fn libllama_refuses_a_qwen3moe_head() {
    let err = match pocketmoe::ggml::llama::LlamaModel::load(model(), 0) {
        Ok(_) => panic!("libllama loaded a qwen3moe file with a classification head"),
        Err(e) => format!("{e:#}"),
    };
    eprintln!("libllama: {err}");
}
