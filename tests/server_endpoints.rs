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
use std::process::Command;
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
    _child: common::Served,
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
        let (_child, addr) = common::serve(&args);
        Server { _child, addr }
    }
}

/// One raw HTTP/1.1 exchange; returns the status, the head and the body.
fn http(addr: &str, head: &str, body: &[u8]) -> (u16, String, String) {
    common::http_exchange(addr, head, body)
}

fn post(addr: &str, path: &str, body: &Value) -> (u16, Value) {
    common::post_json(addr, path, body, Some(KEY))
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
        let (st, head, _) = http(
            &s.addr,
            "GET /props HTTP/1.1\r\nOrigin: http://example.test:3000",
            b"",
        );
        assert_eq!(st, 401);
        assert_eq!(
            head.contains("access-control-allow-origin"),
            origin.is_some(),
            "{head}"
        );
        // A preflight carries no key: answered 204 either way, with the allow headers only
        // for an allowed origin.
        let (st, head, _) = http(
            &s.addr,
            "OPTIONS /tokenize HTTP/1.1\r\nOrigin: http://example.test:3000\r\nAccess-Control-Request-Method: POST\r\nAccess-Control-Request-Headers: authorization, content-type",
            b"",
        );
        assert_eq!(st, 204, "{head}");
        match origin {
            None => assert!(!head.contains("access-control-"), "{head}"),
            Some(o) => {
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

/// `--cors-origins` is a list matched against the request's Origin: a listed origin is echoed,
/// any other gets no allow-origin header (the issue's `--cors localhost` answered
/// `Origin: http://evil.com` with `localhost`); `localhost` means any local origin.
#[test]
fn cors_origin_is_matched_not_echoed() {
    let s = Server::start(&["--cors-origins", "http://app.test:3000,localhost"]);
    for (origin, allowed) in [
        ("http://app.test:3000", true),
        ("http://localhost:5173", true),
        ("http://127.0.0.1:8080", true),
        ("http://evil.com", false),
        ("http://app.test:3001", false),
        ("http://localhost.evil.com", false),
    ] {
        for (method, path) in [("GET", "/v1/models"), ("OPTIONS", "/v1/chat/completions")] {
            let (st, head, _) = http(
                &s.addr,
                &format!("{method} {path} HTTP/1.1\r\nOrigin: {origin}\r\nAuthorization: Bearer {KEY}\r\nAccess-Control-Request-Method: POST"),
                b"",
            );
            assert!(st == 200 || st == 204, "{method} {origin}: {head}");
            let echoed = head.contains(&format!("access-control-allow-origin: {origin}\r\n"));
            assert_eq!(echoed, allowed, "{method} {origin}: {head}");
            if !allowed {
                assert!(
                    !head.contains("access-control-allow-origin"),
                    "{origin}: {head}"
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

/// The ids of the end-of-generation tokens, for a `logit_bias` that bans them.
fn end_ids(addr: &str) -> Vec<u64> {
    let (_, v) = post(
        addr,
        "/tokenize",
        &json!({"content": "<|im_end|><|endoftext|>"}),
    );
    v["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_u64().unwrap())
        .collect()
}

fn assert_timings(v: &Value, prompt_n: &Value, predicted_n: &Value) {
    let t = &v["timings"];
    for f in [
        "prompt_n",
        "prompt_ms",
        "prompt_per_token_ms",
        "prompt_per_second",
        "predicted_n",
        "predicted_ms",
        "predicted_per_token_ms",
        "predicted_per_second",
    ] {
        assert!(t[f].is_number(), "timings.{f}: {v}");
    }
    assert_eq!(&t["prompt_n"], prompt_n, "{v}");
    assert_eq!(&t["predicted_n"], predicted_n, "{v}");
    assert!(t["predicted_ms"].as_f64().unwrap() > 0.0, "{v}");
}

/// llama-server's command line and routes: `-c 256 -np 2` is 128 tokens per request (and
/// /props says so), `--temp 0 -n 3` are the defaults of requests that set nothing, any model
/// name is accepted, the unprefixed routes answer, and the shapes carry `timings`,
/// `cached_tokens` and llama-server's context error.
#[test]
fn llama_server_command_line_routes_and_shapes() {
    let s = Server::start(&[
        "-c",
        "256",
        "-np",
        "2",
        "--temp",
        "0",
        "-n",
        "3",
        "--no-slots",
    ]);
    let (st, p) = get(&s.addr, "/props");
    assert_eq!(st, 200, "{p}");
    assert_eq!(p["n_ctx"], 128, "{p}");
    assert_eq!(p["default_generation_settings"]["n_ctx"], 128, "{p}");
    assert_eq!(p["total_slots"], 2, "{p}");
    let params = &p["default_generation_settings"]["params"];
    assert_eq!(params["temperature"], 0.0, "{p}");
    assert_eq!(params["n_predict"], 3, "{p}");
    assert_eq!(params["top_k"], 40, "{p}");
    assert_eq!(params["ignore_eos"], false, "{p}");
    // --no-slots: 501, as llama-server.
    let (st, v) = get(&s.addr, "/slots");
    assert_eq!(st, 501, "{v}");

    let (st, v) = get(&s.addr, "/models");
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["data"][0]["id"], "tiny");
    let (st, _, _) = http(&s.addr, "GET /v1/health HTTP/1.1", b"");
    assert_eq!(st, 200, "/v1/health is open, as /health");

    // llama.cpp's array logit_bias: false bans a token.
    let ban: Vec<Value> = end_ids(&s.addr)
        .iter()
        .map(|&id| json!([id, false]))
        .collect();
    let msgs = json!([{"role": "user", "content": "Tell me a story."}]);
    let (st, v) = post(
        &s.addr,
        "/chat/completions",
        &json!({"model": "gpt-3.5-turbo", "messages": msgs, "logit_bias": ban}),
    );
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["model"], "tiny", "{v}");
    assert_eq!(
        v["usage"]["completion_tokens"], 3,
        "-n 3 is the default: {v}"
    );
    assert_eq!(
        v["usage"]["prompt_tokens_details"]["cached_tokens"], 0,
        "{v}"
    );
    assert_timings(
        &v,
        &v["usage"]["prompt_tokens"],
        &v["usage"]["completion_tokens"],
    );
    // Greedy by default (--temp 0): the same text twice.
    let (_, again) = post(
        &s.addr,
        "/v1/chat/completions",
        &json!({"messages": msgs, "logit_bias": ban}),
    );
    assert_eq!(again["choices"][0]["message"], v["choices"][0]["message"]);
    // n_predict in a chat body.
    let (st, v) = post(
        &s.addr,
        "/v1/chat/completions",
        &json!({"messages": msgs, "n_predict": 2, "logit_bias": ban}),
    );
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["usage"]["completion_tokens"], 2, "{v}");
    // max_tokens -1: until the context (128 per request) is full.
    let (st, v) = post(
        &s.addr,
        "/v1/chat/completions",
        &json!({"messages": msgs, "max_tokens": -1, "logit_bias": ban}),
    );
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["choices"][0]["finish_reason"], "length", "{v}");
    assert_eq!(v["usage"]["total_tokens"], 128, "{v}");
    // llama-server's ignore_eos: end-of-generation tokens are never sampled, even pushed by
    // a bias of +100 that makes one the first token without it.
    let push: Vec<Value> = end_ids(&s.addr)
        .iter()
        .map(|&id| json!([id, 100]))
        .collect();
    let (st, v) = post(
        &s.addr,
        "/v1/chat/completions",
        &json!({"messages": msgs, "n_predict": 4, "logit_bias": push}),
    );
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["choices"][0]["finish_reason"], "stop", "{v}");
    assert_eq!(v["usage"]["completion_tokens"], 0, "{v}");
    let (st, v) = post(
        &s.addr,
        "/v1/chat/completions",
        &json!({"messages": msgs, "n_predict": 4, "logit_bias": push, "ignore_eos": true}),
    );
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["choices"][0]["finish_reason"], "length", "{v}");
    assert_eq!(v["usage"]["completion_tokens"], 4, "{v}");
    // A bad array entry is named.
    let (st, v) = post(
        &s.addr,
        "/v1/chat/completions",
        &json!({"messages": msgs, "logit_bias": [[1]]}),
    );
    assert_eq!(st, 400, "{v}");
    assert_eq!(v["error"]["param"], "logit_bias", "{v}");
    let (st, v) = post(
        &s.addr,
        "/v1/chat/completions",
        &json!({"messages": msgs, "max_tokens": -2}),
    );
    assert_eq!(st, 400, "{v}");
    assert_eq!(v["error"]["param"], "max_tokens", "{v}");

    // Several prompts in one /v1/completions: one choice each, in order.
    let (st, v) = post(
        &s.addr,
        "/v1/completions",
        &json!({"prompt": ["Once upon", "The cat"], "max_tokens": 2, "logit_bias": ban}),
    );
    assert_eq!(st, 200, "{v}");
    let choices = v["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 2, "{v}");
    for (i, c) in choices.iter().enumerate() {
        assert_eq!(c["index"], i, "{v}");
    }
    assert_eq!(v["usage"]["completion_tokens"], 4, "{v}");
    let (_, one) = post(
        &s.addr,
        "/v1/completions",
        &json!({"prompt": "The cat", "max_tokens": 2, "logit_bias": ban}),
    );
    assert_eq!(
        choices[1]["text"], one["choices"][0]["text"],
        "{v} vs {one}"
    );
    // Streamed: the chunks of both in one stream, by index, adding up to the same texts, one
    // [DONE] at the end.
    let b = json!({"prompt": ["Once upon", "The cat"], "max_tokens": 2, "logit_bias": ban, "stream": true}).to_string();
    let head = format!("POST /v1/completions HTTP/1.1\r\nAuthorization: Bearer {KEY}\r\nContent-Type: application/json\r\nContent-Length: {}", b.len());
    let (st, _, raw) = http(&s.addr, &head, b.as_bytes());
    assert_eq!(st, 200, "{raw}");
    let datas: Vec<&str> = raw
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .collect();
    assert_eq!(datas.iter().filter(|d| **d == "[DONE]").count(), 1, "{raw}");
    assert_eq!(datas.last(), Some(&"[DONE]"), "{raw}");
    let mut texts = [String::new(), String::new()];
    for d in &datas[..datas.len() - 1] {
        let c: Value = serde_json::from_str(d).unwrap();
        for ch in c["choices"].as_array().unwrap() {
            texts[ch["index"].as_u64().unwrap() as usize].push_str(ch["text"].as_str().unwrap());
        }
    }
    assert_eq!(texts[0], choices[0]["text"].as_str().unwrap(), "{raw}");
    assert_eq!(texts[1], choices[1]["text"].as_str().unwrap(), "{raw}");

    // The server's -n is shortened to what the prompt leaves (127 of 128 tokens: 1), not refused;
    // a request's own max_tokens past it is still a 400.
    let (st, v) = post(
        &s.addr,
        "/v1/completions",
        &json!({"prompt": vec![100; 127], "logit_bias": ban}),
    );
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["usage"]["completion_tokens"], 1, "{v}");
    assert_eq!(v["choices"][0]["finish_reason"], "length", "{v}");
    let (st, v) = post(
        &s.addr,
        "/v1/completions",
        &json!({"prompt": vec![100; 127], "max_tokens": 3}),
    );
    assert_eq!(st, 400, "{v}");
    assert_eq!(v["error"]["param"], "max_tokens", "{v}");
    // The over-long prompt: llama-server's error type and fields.
    let (st, v) = post(
        &s.addr,
        "/v1/completions",
        &json!({"prompt": "word ".repeat(300)}),
    );
    assert_eq!(st, 400, "{v}");
    assert_eq!(v["error"]["type"], "exceed_context_size_error", "{v}");
    assert_eq!(v["error"]["n_ctx"], 128, "{v}");
    assert!(v["error"]["n_prompt_tokens"].as_u64().unwrap() > 128, "{v}");

    // llamacpp:* series beside ours.
    let (st, _, text) = http(
        &s.addr,
        &format!("GET /metrics HTTP/1.1\r\nAuthorization: Bearer {KEY}"),
        b"",
    );
    assert_eq!(st, 200);
    let value = |name: &str| -> f64 {
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{name} ")))
            .unwrap_or_else(|| panic!("no {name}: {text}"))
            .parse()
            .unwrap()
    };
    assert!(value("llamacpp:prompt_tokens_total") > 0.0);
    assert!(value("llamacpp:tokens_predicted_total") >= 3.0 + 3.0 + 2.0 + 4.0);
    assert!(value("llamacpp:prompt_seconds_total") > 0.0);
    assert!(value("llamacpp:tokens_predicted_seconds_total") > 0.0);
    assert!(value("llamacpp:n_decode_total") > 0.0);
    assert_eq!(value("llamacpp:requests_processing"), 0.0);
    assert_eq!(value("llamacpp:requests_deferred"), 0.0);
    assert!(
        text.contains("pocketmoe_generated_tokens_total"),
        "ours stay"
    );
}

/// llama.cpp's native `/completion` (and `/completions`): its fields, `n_probs`, token prompts,
/// several prompts, stop words and its stream.
#[test]
fn native_completion() {
    let s = Server::start(&[]);
    let ban: Vec<Value> = end_ids(&s.addr)
        .iter()
        .map(|&id| json!([id, false]))
        .collect();
    let body = json!({"prompt": "Once upon a time", "n_predict": 6, "temperature": 0,
                      "cache_prompt": true, "n_probs": 2, "logit_bias": ban});
    let (st, v) = post(&s.addr, "/completion", &body);
    assert_eq!(st, 200, "{v}");
    let content = v["content"].as_str().unwrap().to_string();
    assert_eq!(v["tokens_predicted"], 6, "{v}");
    assert_eq!(v["stop"], true, "{v}");
    assert_eq!(v["stop_type"], "limit", "{v}");
    let n_prompt = tokenizer().encode("Once upon a time", true, true).len();
    assert_eq!(v["tokens_evaluated"], n_prompt, "{v}");
    assert_timings(&v, &json!(n_prompt), &json!(6));
    let probs = v["completion_probabilities"].as_array().unwrap();
    assert_eq!(probs.len(), 6, "{v}");
    for p in probs {
        assert!(p["id"].is_u64() && p["logprob"].is_number(), "{p}");
        assert_eq!(p["top_logprobs"].as_array().unwrap().len(), 2, "{p}");
    }
    // /completions is the same endpoint (as llama-server routes it), and a token prompt gives
    // the same text.
    let ids = tokenizer().encode("Once upon a time", true, true);
    let (st, v2) = post(
        &s.addr,
        "/completions",
        &json!({"prompt": ids, "n_predict": 6, "temperature": 0, "logit_bias": ban}),
    );
    assert_eq!(st, 200, "{v2}");
    assert_eq!(v2["content"], content.as_str(), "{v2}");
    // Several prompts: an array of results.
    let (st, v3) = post(
        &s.addr,
        "/completion",
        &json!({"prompt": ["Once upon a time", "The cat"], "n_predict": 2, "temperature": 0}),
    );
    assert_eq!(st, 200, "{v3}");
    let list = v3.as_array().unwrap();
    assert_eq!(list.len(), 2, "{v3}");
    assert_eq!(list[1]["index"], 1, "{v3}");
    // A stop word: stop_type word, the text before it.
    let word: String = content.chars().skip(2).take(2).collect();
    if !word.trim().is_empty() {
        let (_, v4) = post(
            &s.addr,
            "/completion",
            &json!({"prompt": "Once upon a time", "n_predict": 6, "temperature": 0, "stop": [word], "logit_bias": ban}),
        );
        assert_eq!(v4["stop_type"], "word", "{v4}");
        assert_eq!(v4["stopping_word"], word.as_str(), "{v4}");
        assert!(content.starts_with(v4["content"].as_str().unwrap()), "{v4}");
    }
    // The stream: pieces with stop false, then the final object; they add up to the content.
    let b = json!({"prompt": "Once upon a time", "n_predict": 6, "temperature": 0, "stream": true, "logit_bias": ban}).to_string();
    let head = format!("POST /completion HTTP/1.1\r\nAuthorization: Bearer {KEY}\r\nContent-Type: application/json\r\nContent-Length: {}", b.len());
    let (st, _, text) = http(&s.addr, &head, b.as_bytes());
    assert_eq!(st, 200, "{text}");
    let events: Vec<Value> = text
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    let last = events.last().unwrap();
    assert_eq!(last["stop"], true, "{text}");
    assert_eq!(last["tokens_predicted"], 6, "{text}");
    assert!(last["timings"].is_object(), "{text}");
    let streamed: String = events[..events.len() - 1]
        .iter()
        .map(|e| {
            assert_eq!(e["stop"], false);
            e["content"].as_str().unwrap().to_string()
        })
        .collect();
    assert_eq!(streamed, content);
    assert!(!text.contains("[DONE]"), "{text}");
    // Bad fields are named.
    let (st, e) = post(
        &s.addr,
        "/completion",
        &json!({"prompt": "x", "n_probs": 99}),
    );
    assert_eq!(st, 400, "{e}");
    assert_eq!(e["error"]["param"], "n_probs", "{e}");
    let (st, e) = post(&s.addr, "/completion", &json!({"n_predict": 3}));
    assert_eq!(st, 400, "{e}");
    assert!(
        e["error"]["message"].as_str().unwrap().contains("prompt"),
        "{e}"
    );
}

/// Anthropic's `/v1/messages` (JSON and its event stream) and `/v1/messages/count_tokens`.
#[test]
fn anthropic_messages() {
    let s = Server::start(&[]);
    let body = json!({
        "model": "claude-3-5-sonnet-latest",
        "max_tokens": 4,
        "temperature": 0,
        "system": "Be brief.",
        "messages": [{"role": "user", "content": [{"type": "text", "text": "Hello there"}]}],
    });
    let (st, v) = post(&s.addr, "/v1/messages", &body);
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["type"], "message", "{v}");
    assert_eq!(v["role"], "assistant", "{v}");
    assert!(v["id"].as_str().unwrap().starts_with("msg_"), "{v}");
    let stop = v["stop_reason"].as_str().unwrap();
    assert!(["end_turn", "max_tokens"].contains(&stop), "{v}");
    let out = v["usage"]["output_tokens"].as_u64().unwrap();
    assert!((1..=4).contains(&out), "{v}");
    let input = v["usage"]["input_tokens"].as_u64().unwrap();
    // The same prompt as the chat endpoint renders.
    let (_, chat) = post(
        &s.addr,
        "/v1/chat/completions",
        &json!({"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello there"}], "max_tokens": 4, "temperature": 0}),
    );
    assert_eq!(
        input,
        chat["usage"]["prompt_tokens"].as_u64().unwrap(),
        "{v} {chat}"
    );
    let text: String = v["content"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|b| b["type"] == "text")
        .map(|b| b["text"].as_str().unwrap())
        .collect();
    let (st, c) = post(&s.addr, "/v1/messages/count_tokens", &body);
    assert_eq!(st, 200, "{c}");
    assert_eq!(c["input_tokens"], input, "{c}");
    // The stream: Anthropic's event order, the same text.
    let mut sb = body.clone();
    sb["stream"] = json!(true);
    let b = sb.to_string();
    let head = format!("POST /v1/messages HTTP/1.1\r\nAuthorization: Bearer {KEY}\r\nContent-Type: application/json\r\nContent-Length: {}", b.len());
    let (st, _, raw) = http(&s.addr, &head, b.as_bytes());
    assert_eq!(st, 200, "{raw}");
    let names: Vec<&str> = raw
        .lines()
        .filter_map(|l| l.strip_prefix("event: "))
        .collect();
    assert_eq!(names.first(), Some(&"message_start"), "{raw}");
    assert_eq!(names.last(), Some(&"message_stop"), "{raw}");
    assert!(names.contains(&"message_delta"), "{raw}");
    let datas: Vec<Value> = raw
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    let streamed: String = datas
        .iter()
        .filter(|d| d["type"] == "content_block_delta" && d["delta"]["type"] == "text_delta")
        .map(|d| d["delta"]["text"].as_str().unwrap())
        .collect();
    assert_eq!(streamed, text, "{raw}");
    // Bad bodies are named.
    let (st, e) = post(
        &s.addr,
        "/v1/messages",
        &json!({"max_tokens": 4, "messages": [{"role": "wizard", "content": "x"}]}),
    );
    assert_eq!(st, 400, "{e}");
    assert_eq!(e["error"]["param"], "messages[0].role", "{e}");
    let (st, e) = post(
        &s.addr,
        "/v1/messages",
        &json!({"max_tokens": 4, "messages": [{"role": "user", "content": [{"type": "image"}]}]}),
    );
    assert_eq!(st, 400, "{e}");
    assert_eq!(e["error"]["param"], "messages[0].content[0]", "{e}");
}

/// `/apply-template` honours `add_generation_prompt: false`, and a trailing assistant message
/// is continued (assistant prefill), not closed, in /apply-template and in chat requests.
#[test]
fn assistant_prefill_and_generation_prompt() {
    let s = Server::start(&[]);
    let tok = tokenizer();
    let t = ChatTemplate::from_gguf(&GgufModel::open(model()).unwrap()).unwrap();
    let user = json!({"role": "user", "content": "Name a colour."});
    let msgs: Vec<ChatMessage> = serde_json::from_value(json!([user])).unwrap();
    let closed = tok
        .encode_chat(&t, &msgs, false, json!({}), false)
        .unwrap()
        .text;
    let open = tok
        .encode_chat(&t, &msgs, true, json!({}), false)
        .unwrap()
        .text;
    assert_ne!(closed, open);
    let (st, v) = post(
        &s.addr,
        "/apply-template",
        &json!({"messages": [user], "add_generation_prompt": false}),
    );
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["prompt"].as_str().unwrap(), closed);
    let (_, v) = post(&s.addr, "/apply-template", &json!({"messages": [user]}));
    assert_eq!(v["prompt"].as_str().unwrap(), open);
    // Prefill: the assistant's start follows the generation prompt, unclosed.
    let prefill = json!({"role": "assistant", "content": "My favourite is"});
    let (_, v) = post(
        &s.addr,
        "/apply-template",
        &json!({"messages": [user, prefill]}),
    );
    assert_eq!(
        v["prompt"].as_str().unwrap(),
        format!("{open}My favourite is")
    );
    let (st, v) = post(
        &s.addr,
        "/v1/chat/completions",
        &json!({"messages": [user, prefill], "max_tokens": 2, "temperature": 0}),
    );
    assert_eq!(st, 200, "{v}");
    let want = tok
        .encode(&format!("{open}My favourite is"), true, true)
        .len();
    assert_eq!(v["usage"]["prompt_tokens"], want, "{v}");
}

/// `--chat-template-file` replaces the GGUF's template (what /apply-template and /props show
/// and chat requests are rendered with); `--chat-template chatml` names a built-in one.
#[test]
fn chat_template_from_the_command_line() {
    let dir = common::process_dir("pocketmoe-tmpl");
    let file = dir.join("t.jinja");
    let src = "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}{% if add_generation_prompt %}[assistant] {% endif %}";
    std::fs::write(&file, src).unwrap();
    let s = Server::start(&["--chat-template-file", file.to_str().unwrap()]);
    let (st, v) = post(
        &s.addr,
        "/apply-template",
        &json!({"messages": [{"role": "user", "content": "Hi"}]}),
    );
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["prompt"], "[user] Hi\n[assistant] ");
    let (_, p) = get(&s.addr, "/props");
    assert_eq!(p["chat_template"], src);
    drop(s);
    let s = Server::start(&["--chat-template", "chatml"]);
    let (_, v) = post(
        &s.addr,
        "/apply-template",
        &json!({"messages": [{"role": "user", "content": "Hi"}], "add_generation_prompt": false}),
    );
    assert_eq!(v["prompt"], "<|im_start|>user\nHi<|im_end|>\n");
    // Two assistant messages at the end are refused (llama-server); one is a prefill.
    let (st, e) = post(
        &s.addr,
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "a"}, {"role": "assistant", "content": "b"}]}),
    );
    assert_eq!(st, 400, "{e}");
    assert_eq!(e["error"]["param"], "messages", "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// OpenAI's Responses API (`/v1/responses`): `instructions` + `input` rendered as the chat
/// endpoint renders them, `max_output_tokens` honoured (status `incomplete`), the output as a
/// message with `output_text`, and the `response.*` event stream adding up to the same text.
#[test]
fn responses_api() {
    let s = Server::start(&[]);
    let body = json!({"model": "gpt-4o", "instructions": "Be brief.", "input": "Hello there",
                      "max_output_tokens": 3, "temperature": 0});
    let (st, v) = post(&s.addr, "/v1/responses", &body);
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["object"], "response", "{v}");
    assert!(v["id"].as_str().unwrap().starts_with("resp_"), "{v}");
    assert_eq!(v["status"], "incomplete", "{v}");
    assert_eq!(
        v["incomplete_details"]["reason"], "max_output_tokens",
        "{v}"
    );
    assert_eq!(v["usage"]["output_tokens"], 3, "{v}");
    let msg = &v["output"][0];
    assert_eq!(msg["type"], "message", "{v}");
    assert_eq!(msg["content"][0]["type"], "output_text", "{v}");
    let text = msg["content"][0]["text"].as_str().unwrap().to_string();
    let (_, chat) = post(
        &s.addr,
        "/v1/chat/completions",
        &json!({"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello there"}],
                "max_tokens": 3, "temperature": 0}),
    );
    assert_eq!(
        v["usage"]["input_tokens"], chat["usage"]["prompt_tokens"],
        "{v} {chat}"
    );
    assert_eq!(
        text,
        chat["choices"][0]["message"]["content"].as_str().unwrap()
    );
    // A list of messages with input_text parts is the same request.
    let (_, v2) = post(
        &s.addr,
        "/responses",
        &json!({"instructions": "Be brief.", "max_output_tokens": 3, "temperature": 0,
                "input": [{"role": "user", "content": [{"type": "input_text", "text": "Hello there"}]}]}),
    );
    assert_eq!(v2["output"][0]["content"][0]["text"], text.as_str(), "{v2}");
    // The stream.
    let mut sb = body.clone();
    sb["stream"] = json!(true);
    let b = sb.to_string();
    let head = format!("POST /v1/responses HTTP/1.1\r\nAuthorization: Bearer {KEY}\r\nContent-Type: application/json\r\nContent-Length: {}", b.len());
    let (st, _, raw) = http(&s.addr, &head, b.as_bytes());
    assert_eq!(st, 200, "{raw}");
    let names: Vec<&str> = raw
        .lines()
        .filter_map(|l| l.strip_prefix("event: "))
        .collect();
    assert_eq!(names.first(), Some(&"response.created"), "{raw}");
    assert_eq!(names.last(), Some(&"response.incomplete"), "{raw}");
    let datas: Vec<Value> = raw
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    let streamed: String = datas
        .iter()
        .filter(|d| d["type"] == "response.output_text.delta")
        .map(|d| d["delta"].as_str().unwrap())
        .collect();
    assert_eq!(streamed, text, "{raw}");
    for (i, d) in datas.iter().enumerate() {
        assert_eq!(d["sequence_number"], i, "{d}");
    }
    // Bad input is named.
    let (st, e) = post(&s.addr, "/v1/responses", &json!({"input": 5}));
    assert_eq!(st, 400, "{e}");
    assert_eq!(e["error"]["param"], "input", "{e}");
    let (st, e) = post(
        &s.addr,
        "/v1/responses",
        &json!({"input": [{"type": "input_image"}]}),
    );
    assert_eq!(st, 400, "{e}");
    assert_eq!(e["error"]["param"], "input[0]", "{e}");
}

/// Several keys (`--api-key a,b`, as llama-server): each is accepted, as a Bearer token or
/// as Anthropic's `x-api-key`; anything else is 401.
#[test]
fn several_api_keys() {
    let keys = format!("{KEY},second-key");
    let s = Server::start(&["--api-key", &keys]);
    for auth in [
        format!("Authorization: Bearer {KEY}"),
        "Authorization: Bearer second-key".to_string(),
        "x-api-key: second-key".to_string(),
    ] {
        let (st, _, text) = http(&s.addr, &format!("GET /props HTTP/1.1\r\n{auth}"), b"");
        assert_eq!(st, 200, "{auth}: {text}");
    }
    for auth in [
        "Authorization: Bearer second",
        "x-api-key: nope",
        "Authorization: Bearer endpoints-key,second-key",
    ] {
        let (st, _, text) = http(&s.addr, &format!("GET /props HTTP/1.1\r\n{auth}"), b"");
        assert_eq!(st, 401, "{auth}: {text}");
    }
}

/// `/v1/completions` without a length generates as llama-server's (until the context is full,
/// not OpenAI's 16), and `system_fingerprint` is llama-server's build form, "b<number>-<commit>".
#[test]
fn completions_length_and_fingerprint_as_llama_server() {
    let s = Server::start(&["--ctx", "64", "--temp", "0"]);
    let ban: Vec<Value> = end_ids(&s.addr)
        .iter()
        .map(|&id| json!([id, false]))
        .collect();
    let (st, v) = post(
        &s.addr,
        "/v1/completions",
        &json!({"prompt": vec![100; 10], "logit_bias": ban}),
    );
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["usage"]["completion_tokens"], 64 - 10, "{v}");
    assert_eq!(v["choices"][0]["finish_reason"], "length", "{v}");
    let fp = v["system_fingerprint"].as_str().unwrap();
    let (n, commit) = fp
        .strip_prefix('b')
        .and_then(|r| r.split_once('-'))
        .unwrap_or_else(|| panic!("{fp}"));
    assert!(n.parse::<u64>().is_ok(), "{fp}");
    assert!(
        commit == "unknown" || (commit.len() == 7 && commit.bytes().all(|b| b.is_ascii_hexdigit())),
        "{fp}"
    );
    assert_eq!(fp, pocketmoe::BUILD_INFO);
    let (st, v) = post(
        &s.addr,
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1}),
    );
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["system_fingerprint"], fp, "{v}");
}
