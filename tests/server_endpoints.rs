//! llama-server's utility endpoints on `pocketmoe-serve` with the tiny synth model, and the
//! `pocketmoe tokenize` subcommand:
//! - `tokenize_detokenize_round_trip`: `/tokenize` gives the library tokenizer's ids (with and
//!   without BOS, with pieces), `/detokenize` gives the text back (control tokens as text); bad bodies get 400s in
//!   OpenAI's error shape.
//! - `apply_template_equals_library`: `/apply-template` is the library's rendering with the
//!   generation prompt.
//! - `props_and_slots`: `/props` names the model, its path, `n_ctx` = `--ctx`, `total_slots` =
//!   `--parallel`, the chat template and the build; `/slots` lists `--parallel` idle slots, and
//!   one processing while a stream runs.
//! - `cors_only_with_the_flag`: no Access-Control headers by default; with `--cors ORIGIN` every
//!   response names it and an OPTIONS preflight (no key) gets 204.
//! - `endpoints_need_the_key`: each new endpoint answers 401 without the API key.
//! - `cli_tokenize`: `pocketmoe tokenize -m MODEL TEXT` prints the library's ids, `--pieces`
//!   one line per token.
mod common;

use pocketmoe::gguf::{GgufModel, Metadata};
use pocketmoe::synth::quantmix::QuantMix;
use pocketmoe::tokenizer::{ChatMessage, ChatTemplate, Tokenizer};
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

const KEY: &str = "endpoints-key";
const TEXT: &str = "Hello world, <|im_end|> tokens: 12345 héllo";

fn model() -> &'static Path {
    static MODEL: OnceLock<PathBuf> = OnceLock::new();
    MODEL.get_or_init(|| common::synth_tiny("server-endpoints", "qwen3moe", QuantMix::Q8_0, 1.0, 5))
}

fn tokenizer() -> Tokenizer {
    Tokenizer::from_gguf(&GgufModel::open(model()).unwrap()).unwrap()
}

struct Server {
    child: Child,
    addr: String,
}

impl Server {
    fn start(extra: &[&str]) -> Self {
        let mut args: Vec<std::ffi::OsString> = Vec::new();
        args.push("--model".into());
        args.push(model().into());
        args.extend(
            ["--port", "0", "--threads", "2", "--api-key", KEY]
                .iter()
                .map(std::ffi::OsString::from),
        );
        args.extend(["--alias", "tiny"].iter().map(std::ffi::OsString::from));
        args.extend(extra.iter().map(std::ffi::OsString::from));
        let (child, addr) = common::spawn_serve(&args);
        Server { child, addr }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One raw HTTP/1.1 exchange; returns the status, the head and the body.
fn http(addr: &str, head: &str, body: &[u8]) -> (u16, String, String) {
    common::http_exchange(addr, head, body)
}

fn post(addr: &str, path: &str, body: &Value) -> (u16, Value) {
    let b = body.to_string();
    let head = format!("POST {path} HTTP/1.1\r\nAuthorization: Bearer {KEY}\r\nContent-Type: application/json\r\nContent-Length: {}", b.len());
    let (status, _, text) = http(addr, &head, b.as_bytes());
    (
        status,
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}: {text:?}")),
    )
}

fn get(addr: &str, path: &str) -> (u16, Value) {
    let head = format!("GET {path} HTTP/1.1\r\nAuthorization: Bearer {KEY}");
    let (status, _, text) = http(addr, &head, b"");
    (
        status,
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}: {text:?}")),
    )
}

fn assert_openai_error(v: &Value) {
    assert!(v["error"]["message"].is_string(), "{v}");
    assert!(v["error"]["type"].is_string(), "{v}");
}

#[test]
fn tokenize_detokenize_round_trip() {
    let s = Server::start(&[]);
    let tok = tokenizer();
    for add_special in [false, true] {
        let want = tok.encode(TEXT, add_special, true);
        let (st, v) = post(
            &s.addr,
            "/tokenize",
            &json!({"content": TEXT, "add_special": add_special}),
        );
        assert_eq!(st, 200, "{v}");
        let got: Vec<u32> = serde_json::from_value(v["tokens"].clone()).unwrap();
        assert_eq!(got, want, "add_special {add_special}");
        let (st, v) = post(&s.addr, "/detokenize", &json!({"tokens": got}));
        assert_eq!(st, 200, "{v}");
        assert_eq!(
            v["content"].as_str().unwrap(),
            String::from_utf8_lossy(&tok.detokenize(&want, false, true))
        );
        if !add_special {
            assert_eq!(v["content"].as_str().unwrap(), TEXT);
        }
    }
    // Default: no BOS, control tokens parsed (llama-server's defaults).
    let (_, v) = post(&s.addr, "/tokenize", &json!({"content": TEXT}));
    let got: Vec<u32> = serde_json::from_value(v["tokens"].clone()).unwrap();
    assert_eq!(got, tok.encode(TEXT, false, true));
    let (st, v) = post(
        &s.addr,
        "/tokenize",
        &json!({"content": TEXT, "with_pieces": true}),
    );
    assert_eq!(st, 200, "{v}");
    let pieces = v["tokens"].as_array().unwrap();
    assert_eq!(pieces.len(), got.len());
    let mut bytes = Vec::new();
    for (p, &id) in pieces.iter().zip(&got) {
        assert_eq!(p["id"].as_u64().unwrap(), id as u64);
        let want = tok.token_to_piece(id);
        match &p["piece"] {
            Value::String(s) => assert_eq!(s.as_bytes(), &want[..]),
            Value::Array(a) => {
                let b: Vec<u8> = a.iter().map(|x| x.as_u64().unwrap() as u8).collect();
                assert_eq!(b, want);
            }
            other => panic!("piece {other}"),
        }
        bytes.extend(want);
    }
    assert_eq!(String::from_utf8(bytes).unwrap(), TEXT);
    // Errors in OpenAI's shape.
    for (path, body) in [
        ("/tokenize", json!({"text": "x"})),
        ("/tokenize", json!({"content": 5})),
        ("/detokenize", json!({"tokens": ["a"]})),
        ("/detokenize", json!({"tokens": [u32::MAX]})),
        ("/apply-template", json!({"messages": 3})),
    ] {
        let (st, v) = post(&s.addr, path, &body);
        assert_eq!(st, 400, "{path} {body}: {v}");
        assert_openai_error(&v);
    }
}

#[test]
fn apply_template_equals_library() {
    let s = Server::start(&[]);
    let tok = tokenizer();
    let t = ChatTemplate::from_gguf(&GgufModel::open(model()).unwrap()).unwrap();
    let messages = json!([
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi <|im_end|> there"},
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": "Count to three."}
    ]);
    let msgs: Vec<ChatMessage> = serde_json::from_value(messages.clone()).unwrap();
    let want = tok
        .encode_chat(&t, &msgs, true, json!({}), false)
        .unwrap()
        .text;
    let (st, v) = post(&s.addr, "/apply-template", &json!({"messages": messages}));
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["prompt"].as_str().unwrap(), want);
    assert!(want.ends_with("<|im_start|>assistant\n"), "{want:?}");
}

#[test]
fn props_and_slots() {
    let s = Server::start(&["--ctx", "1536", "--parallel", "3"]);
    let (st, p) = get(&s.addr, "/props");
    assert_eq!(st, 200, "{p}");
    assert_eq!(p["model_alias"], "tiny");
    assert_eq!(
        p["model_path"].as_str().unwrap(),
        model().display().to_string()
    );
    assert_eq!(p["n_ctx"], 1536);
    assert_eq!(p["default_generation_settings"]["n_ctx"], 1536);
    assert_eq!(p["total_slots"], 3);
    let t = GgufModel::open(model()).unwrap();
    assert_eq!(
        p["chat_template"].as_str().unwrap(),
        t.get_str("tokenizer.chat_template").unwrap()
    );
    assert_eq!(p["version"], env!("CARGO_PKG_VERSION"));
    assert!(
        p["build_info"]
            .as_str()
            .unwrap()
            .contains(env!("CARGO_PKG_VERSION")),
        "{p}"
    );

    let (st, v) = get(&s.addr, "/slots");
    assert_eq!(st, 200, "{v}");
    let slots = v.as_array().unwrap();
    assert_eq!(slots.len(), 3, "{v}");
    for (i, sl) in slots.iter().enumerate() {
        assert_eq!(sl["id"], i);
        assert_eq!(sl["n_ctx"], 1536);
        assert_eq!(sl["is_processing"], false, "{v}");
    }

    // A stream that cannot stop early (end tokens banned) keeps one slot busy.
    let (_, v) = post(
        &s.addr,
        "/tokenize",
        &json!({"content": "<|im_end|><|endoftext|>"}),
    );
    let bias: serde_json::Map<String, Value> = v["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|id| (id.to_string(), json!(-100)))
        .collect();
    let body = json!({
        "prompt": "Once upon a time",
        "max_tokens": 1400,
        "stream": true,
        "logit_bias": bias,
    })
    .to_string();
    let mut stream = TcpStream::connect(&s.addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    write!(stream, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}", body.len()).unwrap();
    let mut r = BufReader::new(stream.try_clone().unwrap());
    let mut line = String::new();
    loop {
        line.clear();
        assert!(
            r.read_line(&mut line).unwrap() > 0,
            "the stream ended early"
        );
        if line.starts_with("data: {") {
            break;
        }
    }
    let t0 = Instant::now();
    let busy = loop {
        let (_, v) = get(&s.addr, "/slots");
        let slots = v.as_array().unwrap().clone();
        assert_eq!(slots.len(), 3);
        let busy: Vec<Value> = slots
            .into_iter()
            .filter(|s| s["is_processing"] == true)
            .collect();
        if !busy.is_empty() || t0.elapsed() > Duration::from_secs(10) {
            break busy;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    assert_eq!(busy.len(), 1, "one slot processing while the stream runs");
    assert!(busy[0]["n_prompt_tokens"].as_u64().unwrap() > 0, "{busy:?}");
    assert!(busy[0]["n_cached"].as_u64().unwrap() > 0, "{busy:?}");
    drop(r);
    drop(stream);
    // The disconnect frees the slot.
    let t0 = Instant::now();
    loop {
        let (_, v) = get(&s.addr, "/slots");
        if v.as_array()
            .unwrap()
            .iter()
            .all(|s| s["is_processing"] == false)
        {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "the slot stayed busy: {v}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

const ENDPOINTS: [(&str, &str); 5] = [
    ("POST", "/tokenize"),
    ("POST", "/detokenize"),
    ("POST", "/apply-template"),
    ("GET", "/props"),
    ("GET", "/slots"),
];

#[test]
fn cors_only_with_the_flag() {
    for origin in [None, Some("http://example.test:3000")] {
        let extra: Vec<&str> = origin.map_or(vec![], |o| vec!["--cors", o]);
        let s = Server::start(&extra);
        for path in ["/props", "/v1/models", "/health"] {
            let (st, head, _) = http(
                &s.addr,
                &format!("GET {path} HTTP/1.1\r\nOrigin: http://example.test:3000\r\nAuthorization: Bearer {KEY}"),
                b"",
            );
            assert_eq!(st, 200);
            match origin {
                None => assert!(!head.contains("access-control-"), "{path}: {head}"),
                Some(o) => assert!(
                    head.contains(&format!("access-control-allow-origin: {o}")),
                    "{path}: {head}"
                ),
            }
        }
        // An unauthorised answer names the origin too (a browser could not read it otherwise).
        let (st, head, _) = http(&s.addr, "GET /props HTTP/1.1", b"");
        assert_eq!(st, 401);
        assert_eq!(
            head.contains("access-control-allow-origin"),
            origin.is_some(),
            "{head}"
        );
        // A preflight carries no key.
        let (st, head, _) = http(
            &s.addr,
            "OPTIONS /tokenize HTTP/1.1\r\nOrigin: http://example.test:3000\r\nAccess-Control-Request-Method: POST\r\nAccess-Control-Request-Headers: authorization, content-type",
            b"",
        );
        match origin {
            None => {
                assert_ne!(st / 100, 2, "{head}");
                assert!(!head.contains("access-control-"), "{head}");
            }
            Some(o) => {
                assert_eq!(st, 204, "{head}");
                assert!(
                    head.contains(&format!("access-control-allow-origin: {o}")),
                    "{head}"
                );
                assert!(head.contains("access-control-allow-methods:"), "{head}");
                assert!(
                    head.contains("access-control-allow-headers: authorization, content-type"),
                    "{head}"
                );
            }
        }
    }
}

#[test]
fn endpoints_need_the_key() {
    let s = Server::start(&[]);
    for (method, path) in ENDPOINTS {
        for auth in ["", "\r\nAuthorization: Bearer wrong"] {
            let body = b"{\"content\":\"x\",\"tokens\":[1],\"messages\":[]}";
            let head = format!("{method} {path} HTTP/1.1\r\nContent-Type: application/json\r\nContent-Length: {}{auth}", body.len());
            let (st, _, text) = http(&s.addr, &head, body);
            assert_eq!(st, 401, "{method} {path}: {text}");
            assert_openai_error(&serde_json::from_str(&text).unwrap());
        }
    }
    let (st, _, _) = http(&s.addr, "GET /health HTTP/1.1", b"");
    assert_eq!(st, 200);
}

#[test]
fn cli_tokenize() {
    let tok = tokenizer();
    let run = |extra: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_pocketmoe"))
            .arg("tokenize")
            .arg("-m")
            .arg(model())
            .args(extra)
            .arg(TEXT)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    let want = tok.encode(TEXT, false, true);
    let ids: Vec<u32> = serde_json::from_str(run(&[]).trim()).unwrap();
    assert_eq!(ids, want);
    let ids: Vec<u32> = serde_json::from_str(run(&["--add-special"]).trim()).unwrap();
    assert_eq!(ids, tok.encode(TEXT, true, true));
    let out = run(&["--pieces"]);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), want.len(), "{out}");
    for (l, &id) in lines.iter().zip(&want) {
        let (i, piece) = l.split_once('\t').unwrap();
        assert_eq!(i.parse::<u32>().unwrap(), id);
        assert_eq!(
            piece,
            format!("{:?}", String::from_utf8_lossy(&tok.token_to_piece(id)))
        );
    }
}
