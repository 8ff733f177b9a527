//! `pocketmoe serve-bench`, the load client used to compare servers:
//! - `counts_agree_with_the_servers_metrics`: against pocketmoe-serve on the tiny synth model, the
//!   completion tokens the client counted over all levels (warm-up included) equal the server's
//!   own `pocketmoe_generated_tokens_total`; each level ran concurrency × requests requests; its
//!   tok/s is its tokens over its wall time; TTFT p50 ≤ p99 ≤ the level's wall time.
//! - `chunked_bodies_split_anywhere`: the chunked-transfer decoder gives back the exact bytes
//!   whatever the chunk sizes (split inside an SSE line, inside a UTF-8 character, with chunk
//!   extensions), and refuses a bad size line.
//! - `expert_counters_need_all_four`: `--metrics` reads the four expert counters of a
//!   Prometheus page (comments and other metrics skipped); a page without them (llama-server's, a
//!   resident pocketmoe-serve) or with a bad value gives none, not zeros.
//! - `bad_urls_are_named`: an https URL and a closed port are errors naming the URL.
mod common;

use pocketmoe::cli::serve_bench::{expert_counters, parse_url, quantile, Chunked};
use pocketmoe::synth::quantmix::QuantMix;
use std::io::{BufReader, Read};
use std::process::Command;

#[test]
fn counts_agree_with_the_servers_metrics() {
    let model = common::synth_tiny("serve-bench", "qwen3moe", QuantMix::Q8_0, 1.0, 3);
    let args: Vec<std::ffi::OsString> = vec![
        "--model".into(),
        model.into(),
        "--port".into(),
        "0".into(),
        "--threads".into(),
        "2".into(),
        "--parallel".into(),
        "2".into(),
        "--ctx".into(),
        "256".into(),
    ];
    let (mut child, addr) = common::spawn_serve(&args);
    let json = std::env::temp_dir().join(format!("serve-bench-{}.json", std::process::id()));
    let out = Command::new(env!("CARGO_BIN_EXE_pocketmoe"))
        .args([
            "serve-bench",
            "--url",
            &format!("http://{addr}"),
            "--concurrency",
            "1,2",
        ])
        .args([
            "--requests",
            "2",
            "--max-tokens",
            "6",
            "--prompt-words",
            "12",
            "--json",
        ])
        .arg(&json)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "serve-bench failed: {}{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    let j: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let _ = std::fs::remove_file(&json);
    let metrics = ureq_get(&addr, "/metrics");
    let _ = child.kill();
    let _ = child.wait();
    let generated: f64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("pocketmoe_generated_tokens_total "))
        .expect("pocketmoe_generated_tokens_total in /metrics")
        .trim()
        .parse()
        .unwrap();
    let levels = j["levels"].as_array().unwrap();
    assert_eq!(levels.len(), 2);
    let mut counted = j["warmup_tokens"].as_u64().unwrap();
    for (l, c) in levels.iter().zip([1u64, 2]) {
        assert_eq!(l["concurrency"].as_u64(), Some(c));
        assert_eq!(l["requests"].as_u64(), Some(c * 2), "{l}");
        let (tokens, wall) = (l["tokens"].as_u64().unwrap(), l["wall_s"].as_f64().unwrap());
        assert!(tokens > 0 && tokens <= c * 2 * 6, "{l}");
        assert!(
            (l["tok_s"].as_f64().unwrap() - tokens as f64 / wall).abs() < 1e-6,
            "{l}"
        );
        let (p50, p99) = (
            l["ttft_p50_ms"].as_f64().unwrap(),
            l["ttft_p99_ms"].as_f64().unwrap(),
        );
        assert!(0.0 < p50 && p50 <= p99 && p99 <= wall * 1e3, "{l}");
        counted += tokens;
    }
    assert_eq!(
        counted as f64, generated,
        "client-counted tokens vs the server's counter"
    );
    assert!(
        stdout.contains("| 2 | 4 |"),
        "the table names each level: {stdout}"
    );
}

/// GET `path` from `addr` (length-delimited or chunked), the body as text.
fn ureq_get(addr: &str, path: &str) -> String {
    common::http_exchange(addr, &format!("GET {path} HTTP/1.1"), b"").2
}

fn chunked(sizes: &[usize], payload: &[u8], ext: &str) -> Vec<u8> {
    let mut out = Vec::new();
    let mut at = 0;
    for &n in sizes.iter().cycle() {
        if at == payload.len() {
            break;
        }
        let n = n.min(payload.len() - at);
        out.extend_from_slice(format!("{n:x}{ext}\r\n").as_bytes());
        out.extend_from_slice(&payload[at..at + n]);
        out.extend_from_slice(b"\r\n");
        at += n;
    }
    out.extend_from_slice(b"0\r\n\r\n");
    out
}

#[test]
fn chunked_bodies_split_anywhere() {
    let payload = "data: {\"choices\":[{\"text\":\"héllo wörld\"}]}\n\ndata: [DONE]\n\n".as_bytes();
    for sizes in [&[1usize][..], &[3, 7], &[payload.len()], &[16, 1, 5]] {
        for ext in ["", ";name=value"] {
            let wire = chunked(sizes, payload, ext);
            let mut r = Chunked {
                inner: BufReader::new(&wire[..]),
                left: 0,
                done: false,
            };
            let mut got = Vec::new();
            r.read_to_end(&mut got).unwrap();
            assert_eq!(got, payload, "sizes {sizes:?} ext {ext:?}");
        }
    }
    let mut r = Chunked {
        inner: BufReader::new(&b"zz\r\nabc"[..]),
        left: 0,
        done: false,
    };
    let err = r.read_to_end(&mut Vec::new()).unwrap_err();
    assert!(err.to_string().contains("bad chunk size"), "{err}");
    assert_eq!(quantile(&[3.0, 1.0, 2.0, 4.0], 0.5), 2.0);
    assert_eq!(quantile(&[3.0, 1.0, 2.0, 4.0], 0.99), 4.0);
}

#[test]
fn bad_urls_are_named() {
    assert_eq!(
        parse_url("http://h:1/x/").unwrap(),
        ("h:1".into(), "/x".into())
    );
    assert_eq!(
        parse_url("http://h").unwrap(),
        ("h:80".into(), String::new())
    );
    let err = parse_url("https://h:1").unwrap_err().to_string();
    assert!(err.contains("only http://"), "{err}");
    // A port nothing listens on (bound, then released).
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("http://127.0.0.1:{port}");
    let out = Command::new(env!("CARGO_BIN_EXE_pocketmoe"))
        .args(["serve-bench", "--url", &url, "--model", "m"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains(&url), "{err}");
}

#[test]
fn expert_counters_need_all_four() {
    let page =
        "# HELP pocketmoe_expert_hits_total Hits.\n# TYPE pocketmoe_expert_hits_total counter\n\
                pocketmoe_expert_hits_total 90\npocketmoe_expert_misses_total 10\n\
                pocketmoe_expert_hits_total_x 5\npocketmoe_expert_cpu_total 4\n\
                pocketmoe_expert_h2d_bytes_total 1.5e9\npocketmoe_generated_tokens_total 7\n";
    assert_eq!(expert_counters(page), Some([90.0, 10.0, 4.0, 1.5e9]));
    let partial = page.replace("pocketmoe_expert_cpu_total 4\n", "");
    assert_eq!(expert_counters(&partial), None);
    assert_eq!(expert_counters(&page.replace(" 10\n", " ten\n")), None);
    assert_eq!(expert_counters("llamacpp:prompt_tokens_total 5\n"), None);
}
