//! `pocketmoe-serve` end to end, on the CPU with a tiny synth model:
//! - `openai_client_real_engine`: the real `openai` Python client (PyPI, in a venv under the
//!   target dir) drives chat, completions, streaming, usage, logprobs, stop strings and errors
//!   (tests/server/openai_client.py asserts the specifics), then 16 concurrent streaming
//!   requests with fixed seeds must each equal the same request run alone; SIGTERM exits 0.
//! - `openai_client_tool_calls`: the same client against scripted engines behind the same HTTP
//!   layer (Qwen3 and harmony output formats): `tool_calls` and `reasoning_content`, streamed
//!   and not.
//! - `adversarial_bodies`: malformed, oversized, deeply nested, mistyped and invalid-UTF-8 bodies
//!   and a few hundred random mutations of a valid one each get a 4xx (never a 5xx or a dropped
//!   connection), and the server still serves afterwards.
//! - `slow_clients_are_cut_off`: a body shorter than its Content-Length gets a 408 at
//!   `--body-timeout`; a head sent byte by byte, and a connection that sends nothing, are cut
//!   off at `--header-timeout`.
//! - `connection_cap`: at `--max-connections`, idle connections make room for new ones (a real
//!   request is served after 20 idle connections), and when every connection is busy a new one
//!   gets a quick 503 in OpenAI's error shape.
//! - `sigterm_with_a_stalled_connection`: a request whose body never comes does not keep the
//!   server past `--shutdown-grace` (+ 1 s); the exit status is 0.
//! - `queue_zero_serves_when_a_slot_is_free`: `--queue 0` serves an idle server, answers 429
//!   while the one slot decodes, and `pocketmoe_active_sequences` returns to 0.
//! - `metrics_and_slots_text_is_pinned`: `/metrics` rendered from fixed engine figures (expert
//!   cache included) and a `/slots` entry, byte for byte.
//! - `edge_errors_use_the_openai_shape`: `bearer` in any case, `param: prompt` for a too-long
//!   completion prompt, and errors of the HTTP layer (bad Content-Length, 1 MiB header, ...)
//!   with OpenAI's error body.

mod common;

use pocketmoe::server::{
    self, ApiError, Engine, Event, FinishReason, GenRequest, Generation, Health, ModelCard,
    OutputFormat, Prompt, ServerConfig, StatsSnapshot,
};
use pocketmoe::synth::{self, quantmix::QuantMix, SynthOptions};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::Arc;
use std::time::{Duration, Instant};

const OPENAI_VERSION: &str = "3.57.0";
const KEY: &str = "test-key";

fn python() -> PathBuf {
    common::pip_venv("openai", OPENAI_VERSION)
}

fn run_script(args: &[&str]) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/server/openai_client.py");
    let out = Command::new(python())
        .arg(script)
        .args(args)
        .output()
        .expect("running the Python client");
    let (so, se) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    eprintln!("{so}{se}");
    assert!(
        out.status.success(),
        "openai_client.py {args:?} failed:\n{so}\n{se}"
    );
}

fn tiny_model(name: &str) -> PathBuf {
    let dir = common::process_dir("pocketmoe-server");
    let out = dir.join(format!("{name}.gguf"));
    let opts = SynthOptions {
        arch: "qwen3moe".into(),
        preset: "tiny".into(),
        quant: QuantMix::Q8_0,
        routing_skew: 1.0,
        seed: 21,
        out: out.clone(),
    };
    synth::synth(&opts, &|_, _| {}).unwrap();
    out
}

/// The server binary on a free port; killed (SIGKILL) on drop if still running.
struct Server {
    child: Child,
    url: String,
}

impl Server {
    fn start(model: &Path, extra: &[&str]) -> Self {
        let mut args: Vec<std::ffi::OsString> = Vec::new();
        args.push("--model".into());
        args.push(model.into());
        args.extend(
            ["--port", "0", "--threads", "2", "--api-key", KEY]
                .iter()
                .map(std::ffi::OsString::from),
        );
        args.extend(extra.iter().map(std::ffi::OsString::from));
        let (child, addr) = common::spawn_serve(&args);
        let url = format!("http://{addr}/v1");
        Server { child, url }
    }

    fn addr(&self) -> String {
        self.url
            .trim_start_matches("http://")
            .trim_end_matches("/v1")
            .to_string()
    }

    /// SIGTERM, then the exit status within 150 s (a grace period of up to 120 s included).
    fn stop(mut self) -> std::process::ExitStatus {
        let pid = self.child.id() as libc::pid_t;
        // SAFETY: signalling our own child process.
        unsafe { libc::kill(pid, libc::SIGTERM) };
        let t0 = Instant::now();
        loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                return st;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(150),
                "no exit after SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn openai_client_real_engine() {
    let model = tiny_model("tiny-real");
    let srv = Server::start(
        &model,
        &[
            // One slot per stream of the load test: all 16 decode together.
            "--parallel",
            "16",
            "--alias",
            "tiny",
            "--ctx",
            "256",
            "--batch-invariant",
        ],
    );
    run_script(&["real", &srv.url, "tiny", KEY]);
    run_script(&["load", &srv.url, "tiny", KEY]);
    let st = srv.stop();
    assert!(
        st.success(),
        "pocketmoe-serve exited with {st} after SIGTERM"
    );
    let _ = std::fs::remove_file(model);
}

/// One raw HTTP/1.1 exchange; returns the status and body.
fn http(addr: &str, head: &str, body: &[u8]) -> (u16, String) {
    let (status, _, body) = common::http_exchange(addr, head, body);
    (status, body)
}

fn post(addr: &str, path: &str, body: &[u8]) -> (u16, String) {
    let head = format!(
        "POST {path} HTTP/1.1\r\nAuthorization: Bearer {KEY}\r\nContent-Type: application/json\r\nContent-Length: {}",
        body.len()
    );
    http(addr, &head, body)
}

#[test]
fn adversarial_bodies() {
    let model = tiny_model("tiny-fuzz");
    let srv = Server::start(
        &model,
        &[
            "--max-body",
            "65536",
            "--parallel",
            "2",
            "--queue",
            "2",
            "--alias",
            "tiny",
            "--ctx",
            "64",
            // The in-flight stream at SIGTERM below must finish within the grace period even
            // when CI's two cores are oversubscribed (ggml's spinning thread pool then slows a
            // tiny model's decode to seconds per token); normally it takes milliseconds.
            "--shutdown-grace",
            "120",
        ],
    );
    let addr = srv.addr();
    let chat = "/v1/chat/completions";
    let deep = |n: usize| format!("{{\"messages\": {}{}}}", "[".repeat(n), "]".repeat(n));
    let cases: Vec<(&str, &str, Vec<u8>)> = vec![
        ("empty body", chat, vec![]),
        ("not json", chat, b"hello".to_vec()),
        ("truncated", chat, br#"{"messages": [{"role": "user", "content": "hi"#.to_vec()),
        ("array", chat, b"[1, 2]".to_vec()),
        ("null", chat, b"null".to_vec()),
        ("nested 60k", chat, "[".repeat(60_000).into_bytes()),
        ("nested messages", chat, deep(5000).into_bytes()),
        ("nested content", chat, format!(r#"{{"messages": [{{"role": "user", "content": {}"x"{}}}]}}"#, "[".repeat(3000), "]".repeat(3000)).into_bytes()),
        ("invalid utf-8", chat, b"{\"messages\": [{\"role\": \"user\", \"content\": \"\xff\xfe\xc3\"}]}".to_vec()),
        ("invalid utf-8 key", chat, b"{\"mess\xffages\": []}".to_vec()),
        ("lone surrogate", chat, br#"{"messages": [{"role": "user", "content": "\ud800"}]}"#.to_vec()),
        ("messages string", chat, br#"{"messages": "hi"}"#.to_vec()),
        ("no messages", chat, br#"{"model": "tiny"}"#.to_vec()),
        ("content number", chat, br#"{"messages": [{"role": "user", "content": 5}]}"#.to_vec()),
        ("role missing", chat, br#"{"messages": [{"content": "x"}]}"#.to_vec()),
        ("temperature string", chat, br#"{"messages": [{"role": "user", "content": "x"}], "temperature": "hot"}"#.to_vec()),
        ("temperature nan-ish", chat, br#"{"messages": [{"role": "user", "content": "x"}], "temperature": 1e999}"#.to_vec()),
        ("max_tokens negative", chat, br#"{"messages": [{"role": "user", "content": "x"}], "max_tokens": -5}"#.to_vec()),
        ("max_tokens huge", chat, br#"{"messages": [{"role": "user", "content": "x"}], "max_tokens": 18446744073709551615}"#.to_vec()),
        ("max_tokens float", chat, br#"{"messages": [{"role": "user", "content": "x"}], "max_tokens": 1.5}"#.to_vec()),
        ("max_tokens zero", chat, br#"{"messages": [{"role": "user", "content": "x"}], "max_tokens": 0}"#.to_vec()),
        ("n=3", chat, br#"{"messages": [{"role": "user", "content": "x"}], "n": 3}"#.to_vec()),
        ("stream string", chat, br#"{"messages": [{"role": "user", "content": "x"}], "stream": "yes"}"#.to_vec()),
        ("stop number", chat, br#"{"messages": [{"role": "user", "content": "x"}], "stop": 5}"#.to_vec()),
        ("top_p 2", chat, br#"{"messages": [{"role": "user", "content": "x"}], "top_p": 2}"#.to_vec()),
        ("logit_bias key", chat, br#"{"messages": [{"role": "user", "content": "x"}], "logit_bias": {"abc": 1}}"#.to_vec()),
        ("logit_bias value", chat, br#"{"messages": [{"role": "user", "content": "x"}], "logit_bias": {"5": "x"}}"#.to_vec()),
        ("tools wrong", chat, br#"{"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "retrieval"}]}"#.to_vec()),
        ("tools not a list", chat, br#"{"messages": [{"role": "user", "content": "x"}], "tools": {"a": 1}}"#.to_vec()),
        ("top_logprobs alone", chat, br#"{"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}"#.to_vec()),
        ("kwargs not a map", chat, br#"{"messages": [{"role": "user", "content": "x"}], "chat_template_kwargs": [1]}"#.to_vec()),
        ("prompt object", "/v1/completions", br#"{"prompt": {"a": 1}}"#.to_vec()),
        ("prompt empty", "/v1/completions", br#"{"prompt": ""}"#.to_vec()),
        ("prompt bad token", "/v1/completions", br#"{"prompt": [4000000000]}"#.to_vec()),
        ("prompt negative token", "/v1/completions", br#"{"prompt": [-1]}"#.to_vec()),
        ("prompt too long", "/v1/completions", format!(r#"{{"prompt": "{}"}}"#, "word ".repeat(2000)).into_bytes()),
        ("max_tokens past ctx", "/v1/completions", br#"{"prompt": "hi", "max_tokens": 64}"#.to_vec()),
        ("over the body limit", chat, format!(r#"{{"messages": [{{"role": "user", "content": "{}"}}]}}"#, "a".repeat(70_000)).into_bytes()),
    ];
    for (what, path, body) in &cases {
        let (status, text) = post(&addr, path, body);
        assert!(
            (400..500).contains(&status),
            "{what}: status {status}: {text}"
        );
        let v: serde_json::Value = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("{what}: error body is not JSON ({e}): {text}"));
        let msg = v["error"]["message"].as_str().unwrap_or("");
        assert!(!msg.is_empty(), "{what}: no error message: {text}");
        eprintln!("{what}: {status} {msg}");
    }
    // Headers: a huge claimed length, the wrong content type, no key, the wrong method or path.
    let huge = format!("POST {chat} HTTP/1.1\r\nAuthorization: Bearer {KEY}\r\nContent-Type: application/json\r\nContent-Length: 10000000000");
    assert_eq!(http(&addr, &huge, b"{").0, 413);
    let form = format!("POST {chat} HTTP/1.1\r\nAuthorization: Bearer {KEY}\r\nContent-Type: text/plain\r\nContent-Length: 2");
    assert_eq!(http(&addr, &form, b"{}").0, 415);
    let nokey =
        format!("POST {chat} HTTP/1.1\r\nContent-Type: application/json\r\nContent-Length: 2");
    assert_eq!(http(&addr, &nokey, b"{}").0, 401);
    let get = format!("GET {chat} HTTP/1.1\r\nAuthorization: Bearer {KEY}");
    assert_eq!(http(&addr, &get, b"").0, 405);
    let nope = format!("GET /v2/nothing HTTP/1.1\r\nAuthorization: Bearer {KEY}");
    assert_eq!(http(&addr, &nope, b"").0, 404);

    // Random mutations of a valid request: byte flips, truncations, insertions. Each answer is
    // a 2xx or a 4xx with a JSON error; the server never fails or hangs.
    let valid = br#"{"model": "tiny", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 2, "temperature": 0.5, "seed": 1, "stop": ["x"]}"#;
    let mut rng = pocketmoe::util::Rng::new(7);
    let junk = [
        b'{', b'}', b'[', b']', b'"', b',', b':', b'\\', 0xff, 0x00, b'-', b'9', b'e', b'n',
    ];
    let mut ok = 0;
    for i in 0..200 {
        let mut b = valid.to_vec();
        for _ in 0..1 + rng.next_u64() % 4 {
            let p = (rng.next_u64() as usize) % b.len();
            match rng.next_u64() % 3 {
                0 => b[p] = junk[(rng.next_u64() as usize) % junk.len()],
                1 => b.truncate(p.max(1)),
                _ => b.insert(p, junk[(rng.next_u64() as usize) % junk.len()]),
            }
        }
        let (status, text) = post(&addr, chat, &b);
        assert!(
            (200..300).contains(&status) || (400..500).contains(&status),
            "mutation {i} {:?}: status {status}: {text}",
            String::from_utf8_lossy(&b)
        );
        if status < 300 {
            ok += 1;
        } else {
            let v: serde_json::Value = serde_json::from_str(&text).unwrap();
            assert!(v["error"]["message"].is_string(), "mutation {i}: {text}");
        }
    }
    eprintln!("mutations: {ok} of 200 still valid");

    // Still up and serving.
    let (status, text) = post(&addr, chat, valid);
    assert_eq!(status, 200, "{text}");
    let health = http(&addr, "GET /health HTTP/1.1", b"");
    assert_eq!(health.0, 200, "{}", health.1);

    // Overload: 2 slots and 2 queue places; 8 requests at once -> the rest get 429.
    let long = br#"{"messages": [{"role": "user", "content": "hello"}], "max_tokens": 24, "temperature": 0}"#;
    let handles: Vec<_> = (0..8)
        .map(|_| {
            let addr = addr.clone();
            std::thread::spawn(move || post(&addr, chat, long))
        })
        .collect();
    let answers: Vec<(u16, String)> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    let n429 = answers.iter().filter(|a| a.0 == 429).count();
    let n200 = answers.iter().filter(|a| a.0 == 200).count();
    assert!(n429 >= 1 && n200 >= 2 && n429 + n200 == 8, "{answers:?}");
    let busy = answers.iter().find(|a| a.0 == 429).unwrap();
    assert!(busy.1.contains("rate_limit_exceeded"), "{}", busy.1);

    // SIGTERM with a stream in flight, deterministically: a greedy request that (as its
    // non-streamed twin shows) runs its whole max_tokens without an EOS is streamed; the signal
    // goes right after its first token arrives, with 39 of its 40 decode steps still to run. The
    // stream must end properly (every token then [DONE], within the grace period), and the
    // server exit 0.
    let body =
        br#"{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 40, "temperature": 0}"#;
    let (status, text) = post(&addr, chat, body);
    assert_eq!(status, 200, "{text}");
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(
        v["usage"]["completion_tokens"], 40,
        "the greedy request must not end early for this test: {text}"
    );
    let streamed = br#"{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 40, "temperature": 0, "stream": true}"#;
    let mut s = TcpStream::connect(&addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let head = format!(
        "POST {chat} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {KEY}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        streamed.len()
    );
    s.write_all(head.as_bytes()).unwrap();
    s.write_all(streamed).unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    // The first token (a non-empty content delta), not just the role chunk: the request is then
    // decoding in a slot. (A request still queued when the signal comes is ended with a
    // "shutting down" error by design: `worker::shutdown_ends_queued_jobs_with_an_error`.)
    let first_token = |b: &[u8]| {
        let t = String::from_utf8_lossy(b);
        t.match_indices("{\"content\":\"")
            .any(|(i, m)| !t[i + m.len()..].starts_with('"'))
    };
    while !first_token(&got) {
        let n = s.read(&mut buf).expect("reading the stream");
        assert!(
            n > 0,
            "stream ended before its first token: {}",
            String::from_utf8_lossy(&got)
        );
        got.extend_from_slice(&buf[..n]);
    }
    let before = String::from_utf8_lossy(&got).into_owned();
    assert!(
        !before.contains("[DONE]"),
        "the stream ended before the signal: {before}"
    );
    let st = srv.stop();
    let _ = s.read_to_end(&mut got);
    let text = String::from_utf8_lossy(&got).into_owned();
    assert!(st.success(), "exit status {st}");
    assert!(text.contains("data: [DONE]"), "stream cut off: {text}");
    assert!(
        text.contains("\"finish_reason\":\"length\""),
        "the in-flight stream must run to its max_tokens within the grace period: {text}"
    );
    let _ = std::fs::remove_file(model);
}

#[test]
fn health_503_while_loading() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let mut engine = Scripted::new(OutputFormat::Plain);
    engine.loading = true;
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let served = rt.spawn(server::serve(
        listener,
        Arc::new(engine),
        ServerConfig::default(),
        async {
            let _ = rx.await;
        },
    ));
    let (status, body) = http(&addr, "GET /health HTTP/1.1", b"");
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("\"loading\""), "{body}");
    let req = br#"{"messages":[{"role":"user","content":"hi"}]}"#;
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nContent-Type: application/json\r\nContent-Length: {}",
        req.len()
    );
    let (status, body) = http(&addr, &head, req);
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("loading (42% done)"), "{body}");
    let (status, body) = http(&addr, "GET /metrics HTTP/1.1", b"");
    assert_eq!(status, 200);
    assert!(
        body.contains("pocketmoe_model_ready 0")
            && body.contains("pocketmoe_model_load_progress 0.42"),
        "{body}"
    );
    let _ = tx.send(());
    rt.block_on(served).unwrap().unwrap();
}

/// An engine that replays a script: tool calls for a question about the weather, a short
/// answer otherwise, in the output format of the template it pretends to have.
struct Scripted {
    card: ModelCard,
    loading: bool,
}

impl Scripted {
    fn new(format: OutputFormat) -> Self {
        Scripted {
            card: ModelCard {
                id: "mock".into(),
                aliases: vec![],
                created: 0,
                n_ctx: 4096,
                n_vocab: 1000,
                format,
                has_chat_template: true,
            },
            loading: false,
        }
    }

    fn script(&self, weather: bool) -> &'static str {
        match (self.card.format, weather) {
            (OutputFormat::Harmony, true) => "<|channel|>analysis<|message|>The user asks about the weather in Paris.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Paris\"}",
            (OutputFormat::Harmony, false) => "<|channel|>analysis<|message|>Greet back.<|end|><|start|>assistant<|channel|>final<|message|>Hello! How can I help?",
            (_, true) => "<think>\nThe user asks about the weather in Paris.\n</think>\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
            (_, false) => "<think>\nGreet back.\n</think>\n\nHello! How can I help?",
        }
    }
}

impl Engine for Scripted {
    fn card(&self) -> &ModelCard {
        &self.card
    }
    fn health(&self) -> Health {
        if self.loading {
            Health::Loading { fraction: 0.42 }
        } else {
            Health::Ready
        }
    }
    fn submit(&self, req: GenRequest) -> Result<Generation, ApiError> {
        if self.loading {
            return Err(ApiError::Loading { percent: 42.0 });
        }
        let Prompt::Chat {
            messages,
            template_vars,
        } = &req.prompt
        else {
            return Err(ApiError::bad("chat only"));
        };
        let weather = messages.iter().any(|m| m.text().contains("weather"));
        assert_eq!(
            weather,
            template_vars.contains_key("tools"),
            "tools reach the template"
        );
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let chars: Vec<char> = self.script(weather).chars().collect();
        for piece in chars.chunks(3) {
            let text: String = piece.iter().collect();
            let _ = tx.send(Event::Token {
                text,
                logprob: None,
            });
        }
        let _ = tx.send(Event::Done {
            reason: FinishReason::Stop,
            tail: String::new(),
        });
        Ok(Generation {
            prompt_tokens: 10,
            opens_reasoning: false,
            events: rx,
        })
    }
    fn stats(&self) -> StatsSnapshot {
        StatsSnapshot::default()
    }
    fn shutdown(&self, _grace: Duration) {}
}

#[test]
fn openai_client_tool_calls() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let mut urls = Vec::new();
    let mut stops = Vec::new();
    for format in [OutputFormat::Qwen3, OutputFormat::Harmony] {
        let listener = rt
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .unwrap();
        urls.push(format!("http://{}/v1", listener.local_addr().unwrap()));
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        stops.push(tx);
        let engine: Arc<dyn Engine> = Arc::new(Scripted::new(format));
        rt.spawn(server::serve(
            listener,
            engine,
            ServerConfig::default(),
            async {
                let _ = rx.await;
            },
        ));
    }
    run_script(&["mock", &urls[0], &urls[1]]);
    for s in stops {
        let _ = s.send(());
    }
}

/// Status, headers and body of an HTTP response in `raw` (None: no status line).
fn parse_answer(raw: &[u8]) -> Option<(u16, String, String)> {
    let text = String::from_utf8_lossy(raw).into_owned();
    let status = text.split_whitespace().nth(1)?.parse().ok()?;
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    Some((status, head.to_ascii_lowercase(), body.to_string()))
}

/// Reads until the server closes, the reader errs, or `limit` passes; returns the bytes and
/// whether the connection ended (EOF or reset) within the limit.
fn read_until_closed(s: &mut TcpStream, limit: Duration) -> (Vec<u8>, bool) {
    let t0 = Instant::now();
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let left = limit.saturating_sub(t0.elapsed());
        if left.is_zero() {
            return (out, false);
        }
        s.set_read_timeout(Some(left.min(Duration::from_millis(200))))
            .unwrap();
        match s.read(&mut buf) {
            Ok(0) => return (out, true),
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => return (out, true),
        }
    }
}

/// OpenAI's error shape: `{"error": {"message", "type", "param", "code"}}`.
fn openai_error(what: &str, body: &str) -> serde_json::Value {
    let v: serde_json::Value = serde_json::from_str(body)
        .unwrap_or_else(|e| panic!("{what}: the error body is not JSON ({e}): {body:?}"));
    let e = &v["error"];
    assert!(
        e["message"].as_str().is_some_and(|m| !m.is_empty()),
        "{what}: no error.message: {body}"
    );
    assert!(e["type"].is_string(), "{what}: no error.type: {body}");
    let obj = e.as_object().unwrap();
    assert!(
        obj.contains_key("param") && obj.contains_key("code"),
        "{what}: error.param / error.code missing: {body}"
    );
    v
}

/// A POST whose body is announced but never comes; returns once the server has started the
/// request (its `100 Continue`, sent when the handler first reads the body).
fn stalled_request(addr: &str) -> TcpStream {
    let mut s = TcpStream::connect(addr).expect("connect");
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {KEY}\r\nContent-Type: application/json\r\nExpect: 100-continue\r\nContent-Length: 100\r\n\r\n"
    );
    s.write_all(head.as_bytes()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 256];
    while !String::from_utf8_lossy(&got).contains("\r\n\r\n") {
        let n = s.read(&mut buf).expect("waiting for 100 Continue");
        assert!(
            n > 0,
            "closed before 100 Continue: {:?}",
            String::from_utf8_lossy(&got)
        );
        got.extend_from_slice(&buf[..n]);
    }
    let text = String::from_utf8_lossy(&got);
    assert!(
        text.starts_with("HTTP/1.1 100"),
        "expected 100 Continue, got {text:?}"
    );
    s
}

#[test]
fn slow_clients_are_cut_off() {
    let model = tiny_model("tiny-slow");
    let srv = Server::start(
        &model,
        &[
            "--header-timeout",
            "2",
            "--body-timeout",
            "2",
            "--ctx",
            "64",
        ],
    );
    let addr = srv.addr();
    // The three clients run at once: each takes about one timeout.
    let body = {
        let addr = addr.clone();
        std::thread::spawn(move || {
            // 10 of the 100 bytes announced, then nothing.
            let mut s = TcpStream::connect(&addr).unwrap();
            let head = format!(
                "POST /v1/chat/completions HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {KEY}\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{{\"messages"
            );
            s.write_all(head.as_bytes()).unwrap();
            let t0 = Instant::now();
            let (raw, closed) = read_until_closed(&mut s, Duration::from_secs(30));
            (t0.elapsed(), raw, closed)
        })
    };
    let headers = {
        let addr = addr.clone();
        std::thread::spawn(move || {
            // A valid head, one byte every 250 ms (about 25 s in all): far slower than 2 s.
            let head = format!("GET /v1/models HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {KEY}\r\nX-Pad: {}\r\n\r\n", "p".repeat(20));
            let mut s = TcpStream::connect(&addr).unwrap();
            let t0 = Instant::now();
            let mut buf = [0u8; 4096];
            s.set_read_timeout(Some(Duration::from_millis(250)))
                .unwrap();
            for (i, b) in head.bytes().enumerate() {
                if s.write_all(&[b]).is_err() {
                    return (t0.elapsed(), Vec::new(), i, head.len());
                }
                match s.read(&mut buf) {
                    Err(e)
                        if matches!(
                            e.kind(),
                            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                        ) => {}
                    Ok(n) if n > 0 => {
                        // An answer: read the rest of it.
                        let (rest, _) = read_until_closed(&mut s, Duration::from_secs(10));
                        let raw = [&buf[..n], &rest[..]].concat();
                        return (t0.elapsed(), raw, i + 1, head.len());
                    }
                    _ => return (t0.elapsed(), Vec::new(), i + 1, head.len()), // end of file or reset
                }
            }
            (t0.elapsed(), Vec::new(), head.len(), head.len())
        })
    };
    let idle = {
        let addr = addr.clone();
        std::thread::spawn(move || {
            let mut s = TcpStream::connect(&addr).unwrap();
            let t0 = Instant::now();
            let (raw, closed) = read_until_closed(&mut s, Duration::from_secs(30));
            (t0.elapsed(), raw, closed)
        })
    };
    // Generous margins: CI's two cores may be busy with other tests' servers.
    let margin = Duration::from_secs(2 + 8);

    let (took, raw, closed) = body.join().unwrap();
    assert!(
        closed,
        "short body: the connection stayed open for {took:?}"
    );
    let (status, head, text) = parse_answer(&raw).unwrap_or_else(|| {
        panic!(
            "short body: no answer in {:?}",
            String::from_utf8_lossy(&raw)
        )
    });
    assert_eq!(status, 408, "short body: {text}");
    assert!(head.contains("connection: close"), "{head}");
    let v = openai_error("short body", &text);
    assert_eq!(v["error"]["code"], "request_timeout", "{text}");
    assert!(
        took >= Duration::from_millis(1500) && took < margin,
        "short body: answered after {took:?} with --body-timeout 2"
    );

    // (bytes written before the answer or the close, bytes in the head)
    let (took, raw, sent, total) = headers.join().unwrap();
    assert!(
        sent < total,
        "slow head: all {total} bytes went through in {took:?}, never cut off"
    );
    assert!(took < margin, "slow head: cut off only after {took:?}");
    if let Some((status, _, text)) = parse_answer(&raw) {
        assert_eq!(status, 408, "slow head: {text}");
        openai_error("slow head", &text);
    }

    let (took, raw, closed) = idle.join().unwrap();
    assert!(closed, "idle connection: still open after {took:?}");
    assert!(
        raw.is_empty(),
        "idle connection: {:?}",
        String::from_utf8_lossy(&raw)
    );
    assert!(took < margin, "idle connection: closed after {took:?}");

    // Still serving.
    let (status, text) = http(
        &addr,
        &format!("GET /v1/models HTTP/1.1\r\nAuthorization: Bearer {KEY}"),
        b"",
    );
    assert_eq!(status, 200, "{text}");
    let _ = std::fs::remove_file(model);
}

#[test]
fn connection_cap() {
    let model = tiny_model("tiny-cap");
    // Timeouts far longer than the test: only the cap closes connections here.
    let srv = Server::start(
        &model,
        &[
            "--max-connections",
            "4",
            "--header-timeout",
            "300",
            "--body-timeout",
            "300",
            "--ctx",
            "64",
        ],
    );
    let addr = srv.addr();
    // 20 connections that send nothing, then a real request.
    let mut idle: Vec<TcpStream> = (0..20)
        .map(|_| TcpStream::connect(&addr).expect("connect"))
        .collect();
    let body = br#"{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}"#;
    let (status, text) = post(&addr, "/v1/chat/completions", body);
    assert_eq!(
        status, 200,
        "a real request after 20 idle connections: {text}"
    );
    // The idle ones beyond the cap were closed to make room (16 for the last 4 idle, one
    // more for the request).
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut closed = vec![false; idle.len()];
    while closed.iter().filter(|&&c| c).count() < 16 && Instant::now() < deadline {
        for (s, c) in idle.iter_mut().zip(closed.iter_mut()).filter(|(_, c)| !**c) {
            s.set_read_timeout(Some(Duration::from_millis(20))).unwrap();
            let mut b = [0u8; 16];
            match s.read(&mut b) {
                Ok(0) => *c = true,
                Ok(n) => panic!(
                    "an idle connection got {:?}",
                    String::from_utf8_lossy(&b[..n])
                ),
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) => {}
                Err(_) => *c = true,
            }
        }
    }
    let n_closed = closed.iter().filter(|&&c| c).count();
    assert!(
        n_closed >= 16,
        "only {n_closed} of 20 idle connections were closed with --max-connections 4"
    );
    assert!(
        !closed[19],
        "the newest idle connection was closed rather than an older one"
    );
    drop(idle);

    // Four requests in progress (their bodies never come): a fifth connection is refused with
    // a 503 at once, in OpenAI's shape.
    let stalled: Vec<TcpStream> = (0..4).map(|_| stalled_request(&addr)).collect();
    let mut s = TcpStream::connect(&addr).expect("connect");
    let t0 = Instant::now();
    let head =
        format!("GET /v1/models HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {KEY}\r\n\r\n");
    let _ = s.write_all(head.as_bytes());
    let (raw, ended) = read_until_closed(&mut s, Duration::from_secs(20));
    let took = t0.elapsed();
    let (status, head, text) = parse_answer(&raw).unwrap_or_else(|| {
        panic!(
            "over the cap: no answer ({:?})",
            String::from_utf8_lossy(&raw)
        )
    });
    assert_eq!(
        status, 503,
        "over the cap with every connection busy: {text}"
    );
    assert!(ended, "the refused connection was not closed");
    assert!(took < Duration::from_secs(10), "the 503 took {took:?}");
    assert!(head.contains("retry-after: 1"), "{head}");
    let v = openai_error("over the cap", &text);
    assert_eq!(v["error"]["type"], "server_error", "{text}");

    // The stalled clients leave; the server serves again.
    drop(stalled);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (status, text) = post(&addr, "/v1/chat/completions", body);
        if status == 200 {
            break;
        }
        assert_eq!(status, 503, "{text}");
        assert!(
            Instant::now() < deadline,
            "still 503 after the stalled clients left"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = std::fs::remove_file(model);
}

#[test]
fn sigterm_with_a_stalled_connection() {
    let model = tiny_model("tiny-stall");
    let srv = Server::start(
        &model,
        &[
            "--shutdown-grace",
            "2",
            "--header-timeout",
            "300",
            "--body-timeout",
            "300",
            "--ctx",
            "64",
        ],
    );
    let addr = srv.addr();
    let mut stalled = stalled_request(&addr);
    let _idle = TcpStream::connect(&addr).unwrap();
    let mut partial = TcpStream::connect(&addr).unwrap();
    partial.write_all(b"GET /v1/mo").unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let mut srv = srv;
    let pid = srv.child.id() as libc::pid_t;
    // SAFETY: signalling our own child process.
    unsafe { libc::kill(pid, libc::SIGTERM) };
    let t0 = Instant::now();
    // Grace 2 s, connections closed 1 s after it; the rest is margin for a busy machine.
    let limit = Duration::from_secs(2 + 1 + 7);
    let status = loop {
        if let Some(st) = srv.child.try_wait().unwrap() {
            break st;
        }
        assert!(
            t0.elapsed() < limit,
            "still running {:?} after SIGTERM with --shutdown-grace 2 and a stalled request",
            t0.elapsed()
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let took = t0.elapsed();
    assert!(status.success(), "exit status {status} after SIGTERM");
    assert!(
        took >= Duration::from_millis(1500),
        "exited after {took:?}: before the grace period was over"
    );
    let (_, closed) = read_until_closed(&mut stalled, Duration::from_secs(5));
    assert!(closed, "the stalled connection is still open");
    let _ = std::fs::remove_file(model);
}

/// Polls `/metrics` until `line` appears (or `limit` passes); returns the last text.
fn metrics_until(addr: &str, line: &str, limit: Duration) -> String {
    let t0 = Instant::now();
    loop {
        let (status, text) = http(
            addr,
            &format!("GET /metrics HTTP/1.1\r\nAuthorization: Bearer {KEY}"),
            b"",
        );
        assert_eq!(status, 200, "{text}");
        if text.lines().any(|l| l == line) || t0.elapsed() > limit {
            return text;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn metric_line<'a>(text: &'a str, name: &str) -> &'a str {
    text.lines()
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with(' '))
        .unwrap_or("(missing)")
}

#[test]
fn queue_zero_serves_when_a_slot_is_free() {
    let model = tiny_model("tiny-q0");
    let srv = Server::start(
        &model,
        &["--parallel", "1", "--queue", "0", "--ctx", "4096"],
    );
    let addr = srv.addr();
    let chat = "/v1/chat/completions";
    let short =
        br#"{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "temperature": 0}"#;
    // An idle server has a free slot: the request is served, not refused.
    let (status, text) = post(&addr, chat, short);
    assert_eq!(status, 200, "--queue 0 on an idle server: {text}");
    // The request is over: nothing decodes. (The worker lowers its counters before the last
    // event goes out, so this holds as soon as the response has arrived.)
    let (_, m) = http(
        &addr,
        &format!("GET /metrics HTTP/1.1\r\nAuthorization: Bearer {KEY}"),
        b"",
    );
    assert_eq!(
        metric_line(&m, "pocketmoe_active_sequences"),
        "pocketmoe_active_sequences 0",
        "after the request ended"
    );
    assert_eq!(
        metric_line(&m, "pocketmoe_queue_depth"),
        "pocketmoe_queue_depth 0"
    );

    // One slot, decoding a long stream (token 100 forced: no early end): no waiting room, so
    // another request gets 429.
    let long = br#"{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4000, "temperature": 0, "logit_bias": {"100": 100}, "stream": true}"#;
    let mut s = TcpStream::connect(&addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    let head = format!(
        "POST {chat} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {KEY}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        long.len()
    );
    s.write_all(head.as_bytes()).unwrap();
    s.write_all(long).unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    // The first token (a non-empty content delta), not just the role chunk.
    let first_token = |b: &[u8]| {
        let t = String::from_utf8_lossy(b);
        t.match_indices("{\"content\":\"")
            .any(|(i, m)| !t[i + m.len()..].starts_with('"'))
    };
    while !first_token(&got) {
        let n = s.read(&mut buf).expect("reading the stream");
        assert!(
            n > 0,
            "stream ended early: {}",
            String::from_utf8_lossy(&got)
        );
        got.extend_from_slice(&buf[..n]);
    }
    assert!(!String::from_utf8_lossy(&got).contains("[DONE]"));
    let (status, text) = post(&addr, chat, short);
    assert_eq!(status, 429, "--queue 0 with the only slot decoding: {text}");
    assert_eq!(
        openai_error("busy", &text)["error"]["code"],
        "rate_limit_exceeded"
    );
    let (_, m) = http(
        &addr,
        &format!("GET /metrics HTTP/1.1\r\nAuthorization: Bearer {KEY}"),
        b"",
    );
    assert_eq!(
        metric_line(&m, "pocketmoe_active_sequences"),
        "pocketmoe_active_sequences 1",
        "while the stream decodes"
    );
    // The client leaves; its sequence is dropped and the gauge returns to 0.
    drop(s);
    let m = metrics_until(
        &addr,
        "pocketmoe_active_sequences 0",
        Duration::from_secs(60),
    );
    assert_eq!(
        metric_line(&m, "pocketmoe_active_sequences"),
        "pocketmoe_active_sequences 0",
        "after the stream's client left"
    );
    let (status, text) = post(&addr, chat, short);
    assert_eq!(status, 200, "the slot is free again: {text}");
    let _ = std::fs::remove_file(model);
}

#[test]
fn edge_errors_use_the_openai_shape() {
    let model = tiny_model("tiny-edges");
    let srv = Server::start(&model, &["--ctx", "64"]);
    let addr = srv.addr();
    // RFC 7235: the auth scheme is case-insensitive.
    for auth in [
        format!("bearer {KEY}"),
        format!("BEARER  {KEY}"),
        format!("Bearer {KEY}"),
    ] {
        let (status, text) = http(
            &addr,
            &format!("GET /v1/models HTTP/1.1\r\nAuthorization: {auth}"),
            b"",
        );
        assert_eq!(status, 200, "Authorization: {auth}: {text}");
    }
    let (status, text) = http(
        &addr,
        "GET /v1/models HTTP/1.1\r\nAuthorization: Basic abc",
        b"",
    );
    assert_eq!(status, 401, "{text}");

    // A prompt longer than the context: blamed on `prompt` for completions, `messages` for chat.
    let words = "word ".repeat(200);
    let (status, text) = post(
        &addr,
        "/v1/completions",
        format!(r#"{{"prompt": "{words}"}}"#).as_bytes(),
    );
    assert_eq!(status, 400, "{text}");
    let v = openai_error("long prompt", &text);
    assert_eq!(v["error"]["param"], "prompt", "{text}");
    assert_eq!(v["error"]["code"], "context_length_exceeded", "{text}");
    let (status, text) = post(
        &addr,
        "/v1/chat/completions",
        format!(r#"{{"messages": [{{"role": "user", "content": "{words}"}}]}}"#).as_bytes(),
    );
    assert_eq!(status, 400, "{text}");
    assert_eq!(
        openai_error("long chat", &text)["error"]["param"],
        "messages",
        "{text}"
    );

    // Errors of the HTTP layer, below the routes: OpenAI's shape too.
    let post_head = |extra: &str| {
        format!("POST /v1/chat/completions HTTP/1.1\r\nAuthorization: Bearer {KEY}\r\nContent-Type: application/json{extra}")
    };
    let cases: Vec<(&str, String, Vec<u8>, u16)> = vec![
        (
            "Content-Length abc",
            post_head("\r\nContent-Length: abc"),
            b"{}".to_vec(),
            400,
        ),
        (
            "Content-Length -1",
            post_head("\r\nContent-Length: -1"),
            b"{}".to_vec(),
            400,
        ),
        (
            "Content-Length 1, 2",
            post_head("\r\nContent-Length: 1, 2"),
            b"{}".to_vec(),
            400,
        ),
        (
            "two Content-Lengths",
            post_head("\r\nContent-Length: 2\r\nContent-Length: 3"),
            b"{}".to_vec(),
            400,
        ),
        (
            "Transfer-Encoding gzip",
            post_head("\r\nTransfer-Encoding: gzip"),
            b"{}".to_vec(),
            400,
        ),
        (
            "1 MiB header",
            post_head(&format!(
                "\r\nX-Big: {}\r\nContent-Length: 2",
                "a".repeat(1 << 20)
            )),
            b"{}".to_vec(),
            431,
        ),
        (
            "bad header name",
            post_head("\r\nBad Name: x\r\nContent-Length: 2"),
            b"{}".to_vec(),
            400,
        ),
        (
            "bad request line",
            "GET /v1/models HTTP/9.9".to_string(),
            vec![],
            400,
        ),
    ];
    for (what, head, body, want) in &cases {
        let (status, text) = http(&addr, head, body);
        assert_eq!(status, *want, "{what}: {text:?}");
        let v = openai_error(what, &text);
        assert_eq!(
            v["error"]["type"], "invalid_request_error",
            "{what}: {text}"
        );
        eprintln!("{what}: {status} {}", v["error"]["message"]);
    }
    // A valid chunked body still works (the framing finds the end of each chunk).
    let body = br#"{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}"#;
    let (a, b) = body.split_at(20);
    let mut chunked = Vec::new();
    for part in [a, b] {
        chunked.extend_from_slice(format!("{:x};x=y\r\n", part.len()).as_bytes());
        chunked.extend_from_slice(part);
        chunked.extend_from_slice(b"\r\n");
    }
    chunked.extend_from_slice(b"0\r\n\r\n");
    let (status, text) = http(
        &addr,
        &post_head("\r\nTransfer-Encoding: chunked"),
        &chunked,
    );
    assert_eq!(status, 200, "chunked: {text}");
    let _ = std::fs::remove_file(model);
}

/// `/metrics` and `/slots` as the HTTP layer renders them from the engine's figures, pinned
/// byte for byte (every series name and value): the expert-cache series from offload counters
/// of two layers, the scheduler's, the KV cache's and llama-server's `llamacpp:*` ones.
#[test]
fn metrics_and_slots_text_is_pinned() {
    let mut st = pocketmoe::experts::Stats::new(2);
    let l = &mut st.layers;
    (l[0].hits, l[0].misses, l[0].cpu) = (30, 10, 4);
    (
        l[0].prefetched,
        l[0].prefetch_used,
        l[0].predicted_used,
        l[0].used,
    ) = (8, 6, 5, 20);
    (l[1].hits, l[1].misses, l[1].cpu) = (10, 10, 1);
    (
        l[1].prefetched,
        l[1].prefetch_used,
        l[1].predicted_used,
        l[1].used,
    ) = (2, 1, 3, 12);
    (st.h2d_bytes, st.cpu_bytes, st.stops, st.hook_s) = (123_456_789, 4567, 12, 0.25);
    (st.layers[0].copies, st.layers[1].copies) = (7, 4);
    (st.steps, st.gated_steps, st.hit_stops) = (20, 14, 9);
    (st.table_steps, st.split_steps) = (3, 5);
    (st.compute_s, st.wait_copy_s, st.wait_cpu_s) = (1.75, 0.5, 0.125);
    let stats = StatsSnapshot {
        queued: 1,
        active: 2,
        parallel: 4,
        prompt_tokens: 100,
        generated_tokens: 50,
        steps: 20,
        batch_tokens: 150,
        recent_tok_s: 12.5,
        cancelled: 3,
        kv_tokens: 300,
        slots: vec![],
        experts: Some(pocketmoe::engine::snapshot::ExpertsSnapshot::new(&st, 3)),
    };
    let card = ModelCard {
        id: "tiny".into(),
        aliases: vec![],
        created: 0,
        n_ctx: 256,
        n_vocab: 1000,
        format: OutputFormat::Plain,
        has_chat_template: true,
    };
    let http = server::metrics::HttpMetrics::default();
    http.record("/v1/chat/completions", 200);
    let totals = server::metrics::LlamaTotals::default();
    totals.add(1000.0, 2000.0);
    let text = http.render(&card, &Health::Ready, &stats, None) + &totals.render(&card, &stats);
    assert_eq!(text, PINNED_METRICS);
    let slot = server::SlotState {
        id: 1,
        is_processing: true,
        n_ctx: 256,
        n_prompt_tokens: 7,
        n_decoded: 3,
        n_cached: 9,
    };
    assert_eq!(
        serde_json::to_string(&[slot]).unwrap(),
        r#"[{"id":1,"is_processing":true,"n_ctx":256,"n_prompt_tokens":7,"n_decoded":3,"n_cached":9}]"#
    );
}

const PINNED_METRICS: &str = r#"# HELP pocketmoe_requests_total HTTP requests answered, by route and status.
# TYPE pocketmoe_requests_total counter
pocketmoe_requests_total{route="/v1/chat/completions",status="200"} 1
# HELP pocketmoe_model_ready 1 when the model tiny is loaded and serving.
# TYPE pocketmoe_model_ready gauge
pocketmoe_model_ready 1
# HELP pocketmoe_model_load_progress Fraction of the weights loaded.
# TYPE pocketmoe_model_load_progress gauge
pocketmoe_model_load_progress 1
# HELP pocketmoe_prompt_tokens_total Prompt tokens evaluated (those a slot's prompt cache supplied are not counted).
# TYPE pocketmoe_prompt_tokens_total counter
pocketmoe_prompt_tokens_total 100
# HELP pocketmoe_generated_tokens_total Tokens generated.
# TYPE pocketmoe_generated_tokens_total counter
pocketmoe_generated_tokens_total 50
# HELP pocketmoe_generation_tokens_per_second Tokens generated per second, all sequences together, over the last 10 s.
# TYPE pocketmoe_generation_tokens_per_second gauge
pocketmoe_generation_tokens_per_second 12.5
# HELP pocketmoe_queue_depth Requests waiting for a free sequence slot.
# TYPE pocketmoe_queue_depth gauge
pocketmoe_queue_depth 1
# HELP pocketmoe_active_sequences Sequences being decoded together.
# TYPE pocketmoe_active_sequences gauge
pocketmoe_active_sequences 2
# HELP pocketmoe_parallel_slots Sequences that can be decoded together (--parallel).
# TYPE pocketmoe_parallel_slots gauge
pocketmoe_parallel_slots 4
# HELP pocketmoe_kv_cache_tokens KV-cache rows held by active sequences (0 when idle).
# TYPE pocketmoe_kv_cache_tokens gauge
pocketmoe_kv_cache_tokens 300
# HELP pocketmoe_kv_cache_capacity_tokens KV-cache rows in all (--ctx x --parallel).
# TYPE pocketmoe_kv_cache_capacity_tokens gauge
pocketmoe_kv_cache_capacity_tokens 1024
# HELP pocketmoe_forward_passes_total Batched forward passes run.
# TYPE pocketmoe_forward_passes_total counter
pocketmoe_forward_passes_total 20
# HELP pocketmoe_batch_tokens_total Tokens carried by the forward passes (prompt and decode).
# TYPE pocketmoe_batch_tokens_total counter
pocketmoe_batch_tokens_total 150
# HELP pocketmoe_requests_cancelled_total Requests dropped before the end (client gone or stop string reached).
# TYPE pocketmoe_requests_cancelled_total counter
pocketmoe_requests_cancelled_total 3
# HELP pocketmoe_expert_hits_total Routed-expert uses served from the GPU cache.
# TYPE pocketmoe_expert_hits_total counter
pocketmoe_expert_hits_total 40
# HELP pocketmoe_expert_misses_total Routed-expert uses not in the GPU cache.
# TYPE pocketmoe_expert_misses_total counter
pocketmoe_expert_misses_total 20
# HELP pocketmoe_expert_cpu_total Misses computed on the CPU.
# TYPE pocketmoe_expert_cpu_total counter
pocketmoe_expert_cpu_total 5
# HELP pocketmoe_expert_cache_hit_ratio Hits / (hits + misses) since start.
# TYPE pocketmoe_expert_cache_hit_ratio gauge
pocketmoe_expert_cache_hit_ratio 0.6666666666666666
# HELP pocketmoe_expert_cache_own_hit_ratio As expert_cache_hit_ratio, with hits a prefetch made counted as misses (what PCIe traffic follows).
# TYPE pocketmoe_expert_cache_own_hit_ratio gauge
pocketmoe_expert_cache_own_hit_ratio 0.55
# HELP pocketmoe_expert_cpu_share Share of misses computed on the CPU.
# TYPE pocketmoe_expert_cpu_share gauge
pocketmoe_expert_cpu_share 0.25
# HELP pocketmoe_expert_prefetch_precision Prefetched experts that were used / prefetched.
# TYPE pocketmoe_expert_prefetch_precision gauge
pocketmoe_expert_prefetch_precision 0.7
# HELP pocketmoe_expert_prefetch_recall Used experts that had been predicted / used.
# TYPE pocketmoe_expert_prefetch_recall gauge
pocketmoe_expert_prefetch_recall 0.25
# HELP pocketmoe_expert_h2d_bytes_total Expert bytes copied host to GPU.
# TYPE pocketmoe_expert_h2d_bytes_total counter
pocketmoe_expert_h2d_bytes_total 123456789
# HELP pocketmoe_expert_cpu_bytes_total Expert bytes read by the CPU.
# TYPE pocketmoe_expert_cpu_bytes_total counter
pocketmoe_expert_cpu_bytes_total 4567
# HELP pocketmoe_expert_copies_total Experts copied host to GPU (miss copies, prefetches, prefill staging).
# TYPE pocketmoe_expert_copies_total counter
pocketmoe_expert_copies_total 11
# HELP pocketmoe_expert_prefetched_total Of those, experts copied ahead of their layer on a prediction.
# TYPE pocketmoe_expert_prefetched_total counter
pocketmoe_expert_prefetched_total 10
# HELP pocketmoe_expert_graph_stops_total Graph stops for expert routing (about one per offloaded layer per step).
# TYPE pocketmoe_expert_graph_stops_total counter
pocketmoe_expert_graph_stops_total 12
# HELP pocketmoe_expert_stop_seconds_total Host seconds spent in those stops (the GPU idles meanwhile unless the step is gated).
# TYPE pocketmoe_expert_stop_seconds_total counter
pocketmoe_expert_stop_seconds_total 0.25
# HELP pocketmoe_expert_steps_total Forward passes with offloaded experts.
# TYPE pocketmoe_expert_steps_total counter
pocketmoe_expert_steps_total 20
# HELP pocketmoe_expert_gated_steps_total Of those, steps run gated (the graph queued a stop ahead, behind a gate on the GPU).
# TYPE pocketmoe_expert_gated_steps_total counter
pocketmoe_expert_gated_steps_total 14
# HELP pocketmoe_expert_table_steps_total Of the gated steps, those in table form (the GPU gathers its picks' slots itself).
# TYPE pocketmoe_expert_table_steps_total counter
pocketmoe_expert_table_steps_total 3
# HELP pocketmoe_expert_split_steps_total Of the gated steps, those in split form (a layer's GPU experts run beside its CPU job).
# TYPE pocketmoe_expert_split_steps_total counter
pocketmoe_expert_split_steps_total 5
# HELP pocketmoe_expert_stops_passed_on_gpu_total Stops of gated steps the GPU passed on its own, every pick resident in its expert table.
# TYPE pocketmoe_expert_stops_passed_on_gpu_total counter
pocketmoe_expert_stops_passed_on_gpu_total 9
# HELP pocketmoe_expert_step_seconds_total Wall seconds of the forward passes with offloaded experts (per step: divide by expert_steps_total).
# TYPE pocketmoe_expert_step_seconds_total counter
pocketmoe_expert_step_seconds_total 1.75
# HELP pocketmoe_expert_wait_copy_seconds_total Host seconds those steps waited for expert copies to land.
# TYPE pocketmoe_expert_wait_copy_seconds_total counter
pocketmoe_expert_wait_copy_seconds_total 0.5
# HELP pocketmoe_expert_wait_cpu_seconds_total Host seconds those steps waited for the experts computed on the CPU.
# TYPE pocketmoe_expert_wait_cpu_seconds_total counter
pocketmoe_expert_wait_cpu_seconds_total 0.125
# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed.
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total 100
# HELP llamacpp:prompt_seconds_total Prompt process time (from queueing to the first token).
# TYPE llamacpp:prompt_seconds_total counter
llamacpp:prompt_seconds_total 1
# HELP llamacpp:tokens_predicted_total Number of generation tokens processed.
# TYPE llamacpp:tokens_predicted_total counter
llamacpp:tokens_predicted_total 50
# HELP llamacpp:tokens_predicted_seconds_total Predict process time.
# TYPE llamacpp:tokens_predicted_seconds_total counter
llamacpp:tokens_predicted_seconds_total 2
# HELP llamacpp:n_decode_total Total number of llama_decode() calls (forward passes).
# TYPE llamacpp:n_decode_total counter
llamacpp:n_decode_total 20
# HELP llamacpp:n_busy_slots_per_decode Average number of busy slots per llama_decode() call.
# TYPE llamacpp:n_busy_slots_per_decode counter
llamacpp:n_busy_slots_per_decode 2
# HELP llamacpp:prompt_tokens_seconds Average prompt throughput in tokens/s.
# TYPE llamacpp:prompt_tokens_seconds gauge
llamacpp:prompt_tokens_seconds 100
# HELP llamacpp:predicted_tokens_seconds Average generation throughput in tokens/s.
# TYPE llamacpp:predicted_tokens_seconds gauge
llamacpp:predicted_tokens_seconds 25
# HELP llamacpp:kv_cache_usage_ratio KV-cache usage. 1 means 100 percent usage.
# TYPE llamacpp:kv_cache_usage_ratio gauge
llamacpp:kv_cache_usage_ratio 0.29296875
# HELP llamacpp:requests_processing Number of requests processing.
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing 2
# HELP llamacpp:requests_deferred Number of requests deferred.
# TYPE llamacpp:requests_deferred gauge
llamacpp:requests_deferred 1
"#;
