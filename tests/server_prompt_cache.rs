//! The per-slot prompt cache and llama-server's slot actions on `pocketmoe-serve`, with the
//! tiny synth model:
//! - `prefix_is_reused_and_output_equals_a_fresh_server`: a request sharing a prefix with the
//!   slot's last one reports the reused tokens (`timings.cache_n`, `prompt_n` the rest;
//!   `usage.prompt_tokens_details.cached_tokens` on the OpenAI routes) and gives exactly the
//!   tokens and log-probabilities of a fresh server; `cache_prompt: false` reuses nothing.
//! - `save_erase_restore`: `/slots/0?action=save` writes the slot's cache, `erase` forgets it
//!   (`/slots` shows 0), `restore` brings it back and the next request reuses it with a fresh
//!   server's output.
//! - `slot_actions_refuse_bad_input`: path-like filenames (400, nothing written outside the
//!   directory), truncated and garbage files (400 naming the file and why), a missing file,
//!   an unknown action, a bad slot id; without `--slot-save-path` llama-server's 501.
//!
//! Exactness: the servers run `--batch-invariant` (CPU reference kernels), where a token's
//! logits do not depend on the batch it is evaluated in; a cached run evaluates the prompt's
//! suffix in a pass of its own while the fresh one evaluates the whole prompt at once, and the
//! default kernels round those two batch shapes differently (llama-server's cache has the same
//! property). So the comparisons are bit-exact, no tolerance.
mod common;

use pocketmoe::synth::quantmix::QuantMix;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

fn model() -> &'static Path {
    static MODEL: OnceLock<PathBuf> = OnceLock::new();
    MODEL.get_or_init(|| common::synth_tiny("server-pcache", "qwen3moe", QuantMix::Q8_0, 1.0, 5))
}

struct Server {
    _child: common::Served,
    addr: String,
    /// The end-of-generation token ids (banned, so that every request runs its full length).
    ends: Vec<u64>,
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
                "--ctx",
                "1024",
                "--batch-invariant",
            ],
            extra,
        );
        let mut s = Server {
            _child,
            addr,
            ends: Vec::new(),
        };
        let (_, v) = s.post("/tokenize", &json!({"content": "<|im_end|><|endoftext|>"}));
        s.ends = v["tokens"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t.as_u64().unwrap())
            .collect();
        s
    }

    /// A native `/completion` body: greedy, 8 tokens, the ids and 3 alternatives each, end
    /// tokens banned (so every request generates all 8).
    fn native(&self, prompt: &str, cache_prompt: bool) -> Value {
        let ban: Vec<Value> = self.ends.iter().map(|&id| json!([id, false])).collect();
        json!({"prompt": prompt, "n_predict": 8, "temperature": 0, "n_probs": 3,
               "return_tokens": true, "cache_prompt": cache_prompt, "logit_bias": ban})
    }

    /// A chat body: greedy, 6 tokens with 2 alternatives each, end tokens banned.
    fn chat(&self, msgs: &Value) -> Value {
        let ban: serde_json::Map<String, Value> = self
            .ends
            .iter()
            .map(|id| (id.to_string(), json!(-100)))
            .collect();
        json!({"messages": msgs, "max_tokens": 6, "temperature": 0, "logprobs": true,
               "top_logprobs": 2, "logit_bias": ban})
    }

    fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        common::post_json(&self.addr, path, body, None)
    }

    fn get(&self, path: &str) -> Value {
        let (_, _, text) = common::http_exchange(&self.addr, &format!("GET {path} HTTP/1.1"), b"");
        serde_json::from_str(&text).unwrap()
    }
}

/// A long prompt (a few hundred tokens: past one KV page of 256) and one that shares its start.
fn prompts() -> (String, String) {
    let base: String = (0..8)
        .map(|i| format!("Line {i}: the quick brown fox jumps over the lazy dog. "))
        .collect();
    let more = format!("{base}And then, at last, something else entirely happened here.");
    (base, more)
}

/// The output that must match: generated ids and their probabilities (all 8 of each).
fn output(v: &Value) -> (Value, Value) {
    assert_eq!(v["tokens"].as_array().map(Vec::len), Some(8), "{v}");
    assert_eq!(
        v["completion_probabilities"].as_array().map(Vec::len),
        Some(8),
        "{v}"
    );
    (v["tokens"].clone(), v["completion_probabilities"].clone())
}

#[test]
fn prefix_is_reused_and_output_equals_a_fresh_server() {
    let (base, more) = prompts();
    let s = Server::start(&["--parallel", "2"]);
    let (st, first) = s.post("/completion", &s.native(&base, true));
    assert_eq!(st, 200, "{first}");
    assert_eq!(first["timings"]["cache_n"], 0, "{first}");
    assert_eq!(first["timings"]["prompt_n"], first["tokens_evaluated"]);
    let (_, second) = s.post("/completion", &s.native(&more, true));
    let n_prompt = second["tokens_evaluated"].as_u64().unwrap();
    let cached = second["timings"]["cache_n"].as_u64().unwrap();
    assert!(cached > 256 && cached < n_prompt, "{second}");
    assert_eq!(
        second["timings"]["prompt_n"].as_u64().unwrap(),
        n_prompt - cached,
        "prompt_n counts only what was evaluated: {second}"
    );
    assert_eq!(
        second["id_slot"], first["id_slot"],
        "the slot with the prefix"
    );
    let fresh = Server::start(&["--parallel", "2"]);
    let (_, alone) = fresh.post("/completion", &fresh.native(&more, true));
    assert_eq!(alone["timings"]["cache_n"], 0, "{alone}");
    assert_eq!(output(&second), output(&alone));
    // cache_prompt false: nothing reused, the same output.
    let (_, off) = s.post("/completion", &s.native(&more, false));
    assert_eq!(off["timings"]["cache_n"], 0, "{off}");
    assert_eq!(off["timings"]["prompt_n"], n_prompt, "{off}");
    assert_eq!(output(&off), output(&alone));

    // A chat's next turn on the OpenAI route: the whole first turn is reused.
    let turn1 = json!([{"role": "user", "content": base}]);
    let (st, a) = s.post("/v1/chat/completions", &s.chat(&turn1));
    assert_eq!(st, 200, "{a}");
    let answer = a["choices"][0]["message"]["content"].as_str().unwrap();
    let turn2 = json!([{"role": "user", "content": base},
                       {"role": "assistant", "content": answer},
                       {"role": "user", "content": "And then?"}]);
    let (_, b) = s.post("/v1/chat/completions", &s.chat(&turn2));
    let cached = b["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    // The first turn's prompt is a prefix of the second's where the template renders history
    // as it rendered the generation prompt; the answer re-tokenized from its text may differ.
    let turn1 = a["usage"]["prompt_tokens"].as_u64().unwrap();
    assert!(cached > 256 && 10 * cached >= 9 * turn1, "{b}");
    assert_eq!(b["timings"]["cache_n"], cached, "{b}");
    let (_, b_fresh) = fresh.post("/v1/chat/completions", &fresh.chat(&turn2));
    assert_eq!(
        b_fresh["usage"]["prompt_tokens_details"]["cached_tokens"], 0,
        "{b_fresh}"
    );
    let lp = &b["choices"][0]["logprobs"]["content"];
    assert_eq!(lp.as_array().map(Vec::len), Some(6), "{b}");
    assert_eq!(lp, &b_fresh["choices"][0]["logprobs"]["content"]);
    assert_eq!(b["choices"][0]["message"], b_fresh["choices"][0]["message"]);
}

#[test]
fn save_erase_restore() {
    let dir = common::process_dir("pmoe-slots");
    let _ = std::fs::remove_dir_all(&dir);
    let s = Server::start(&["--parallel", "1", "--slot-save-path", dir.to_str().unwrap()]);
    let (base, more) = prompts();
    let (_, first) = s.post("/completion", &s.native(&base, true));
    let kept = first["tokens_evaluated"].as_u64().unwrap() + 8 - 1; // the last token is not cached
    let (st, v) = s.post("/slots/0?action=save", &json!({"filename": "a.bin"}));
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["id_slot"], 0, "{v}");
    assert_eq!(v["filename"], "a.bin", "{v}");
    assert_eq!(v["n_saved"], kept, "{v}");
    let written = std::fs::metadata(dir.join("a.bin")).unwrap().len();
    assert_eq!(v["n_written"], written, "{v}");
    assert!(v["timings"]["save_ms"].is_number(), "{v}");
    assert_eq!(s.get("/slots")[0]["n_cached"], kept);
    let (st, v) = s.post("/slots/0?action=erase", &json!({}));
    assert_eq!(st, 200, "{v}");
    assert_eq!(v, json!({"id_slot": 0, "n_erased": kept}));
    assert_eq!(s.get("/slots")[0]["n_cached"], 0, "erased");
    let (st, v) = s.post("/slots/0?action=restore", &json!({"filename": "a.bin"}));
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["n_restored"], kept, "{v}");
    assert_eq!(v["n_read"], written, "{v}");
    assert!(v["timings"]["restore_ms"].is_number(), "{v}");
    assert_eq!(s.get("/slots")[0]["n_cached"], kept);
    let (_, second) = s.post("/completion", &s.native(&more, true));
    assert!(
        second["timings"]["cache_n"].as_u64().unwrap() > 256,
        "{second}"
    );
    let fresh = Server::start(&["--parallel", "1"]);
    let (_, alone) = fresh.post("/completion", &fresh.native(&more, true));
    assert_eq!(output(&second), output(&alone));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn slot_actions_refuse_bad_input() {
    let dir = common::process_dir("pmoe-slots-bad");
    let _ = std::fs::remove_dir_all(&dir);
    let inner = dir.join("inner");
    let s = Server::start(&["--slot-save-path", inner.to_str().unwrap()]);
    s.post("/completion", &s.native("Hello there", true));
    for name in ["../x.bin", "a/b.bin", "..", "", "/tmp/x.bin", "x\\y", " x"] {
        for action in ["save", "restore"] {
            let (st, v) = s.post(
                &format!("/slots/0?action={action}"),
                &json!({ "filename": name }),
            );
            assert_eq!(st, 400, "{action} {name:?}: {v}");
            assert_eq!(v["error"]["message"], "Invalid filename", "{v}");
        }
    }
    assert!(!dir.join("x.bin").exists(), "nothing written outside");
    let (st, v) = s.post("/slots/0?action=save", &json!({"filename": "ok.bin"}));
    assert_eq!(st, 200, "{v}");
    let bytes = std::fs::read(inner.join("ok.bin")).unwrap();
    std::fs::write(inner.join("cut.bin"), &bytes[..bytes.len() - 5]).unwrap();
    std::fs::write(inner.join("junk.bin"), vec![7u8; 4096]).unwrap();
    for (name, why) in [
        ("cut.bin", "truncated"),
        ("junk.bin", "not a PocketMoE slot file"),
        ("missing.bin", "cannot read"),
    ] {
        let (st, v) = s.post("/slots/0?action=restore", &json!({ "filename": name }));
        assert_eq!(st, 400, "{name}: {v}");
        let m = v["error"]["message"].as_str().unwrap();
        assert!(m.contains(name) && m.contains(why), "{name}: {m}");
    }
    let (st, v) = s.post("/slots/0?action=frobnicate", &json!({}));
    assert_eq!(
        (st, v["error"]["message"].clone()),
        (400, json!("Invalid action"))
    );
    let (st, v) = s.post("/slots/abc?action=erase", &json!({}));
    assert_eq!(
        (st, v["error"]["message"].clone()),
        (400, json!("Invalid slot ID"))
    );
    let (st, v) = s.post("/slots/7?action=erase", &json!({}));
    assert_eq!(st, 400, "{v}");
    let (st, v) = s.post("/slots/0?action=save", &json!({"name": "x"}));
    assert_eq!((st, v["error"]["param"].clone()), (400, json!("filename")));
    // The server still serves.
    let (st, _) = s.post("/completion", &s.native("Hello there", true));
    assert_eq!(st, 200);
    drop(s);
    let plain = Server::start(&[]);
    let (st, v) = plain.post("/slots/0?action=save", &json!({"filename": "x.bin"}));
    assert_eq!(st, 501, "{v}");
    assert_eq!(
        v["error"]["message"],
        "This server does not support slots action. Start it with `--slot-save-path`"
    );
    assert_eq!(v["error"]["type"], "not_supported_error");
    let _ = std::fs::remove_dir_all(&dir);
}
