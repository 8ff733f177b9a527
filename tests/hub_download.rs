//! `-hf user/model[:quant]` against a local mock of the Hub API (tests/common/hub.rs), through
//! the built `pocketmoe run` and `pocketmoe-serve`, each with its own `LLAMA_CACHE`:
//! - `default_quant_downloaded_into_the_hub_cache_then_reused_without_network`: no tag picks
//!   Q4_K_M (not Q8_0, not the mmproj), stored as blob + snapshot link + refs/main, with
//!   progress lines; a second run with the Hub unreachable loads it from the cache.
//! - `quant_tag_and_hf_file_pick_the_file`: `:q8_0` and `--hf-file` download that file only.
//! - `missing_file_or_repo_is_named`: an absent quant, file or repository fails naming them.
//! - `offline_uses_the_cache_only`: `--offline` with an empty cache fails without a request.
//! - `unreachable_or_stalled_hub_fails_without_hanging`: a closed port, a Hub that never answers
//!   and a download that stops halfway each fail within seconds with a clear error.
//! - `gated_repo_takes_the_token`: 401 without a token names HF_TOKEN; `-hft` and `HF_TOKEN` work.
//! - `serve_downloads_then_serves`: `pocketmoe-serve -hf` serves the downloaded file.
mod common;

use common::hub::{self, MockHub, Repo};
use pocketmoe::synth::quantmix::QuantMix;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

const REPO: &str = "test-user/tiny-GGUF";

fn model_bytes() -> Arc<Vec<u8>> {
    static M: OnceLock<Arc<Vec<u8>>> = OnceLock::new();
    M.get_or_init(|| {
        let p = common::synth_tiny("hub-download", "qwen3moe", QuantMix::Q8_0, 1.0, 3);
        Arc::new(std::fs::read(p).unwrap())
    })
    .clone()
}

/// The repository: README, two quants (the same model bytes), a projector.
fn repo(token: Option<&str>) -> Repo {
    let m = model_bytes();
    Repo {
        id: REPO.into(),
        files: vec![
            hub::file("README.md", Arc::new(b"# tiny".to_vec()), 1),
            hub::file("mmproj-tiny-Q4_K_M.gguf", Arc::new(vec![7; 100]), 2),
            hub::file("tiny-Q8_0.gguf", m.clone(), 3),
            hub::file("tiny-Q4_K_M.gguf", m, 4),
        ],
        token: token.map(String::from),
    }
}

fn cache(tag: &str) -> PathBuf {
    let d = common::process_dir(&format!("pocketmoe-hub-{tag}"));
    let _ = std::fs::remove_dir_all(&d);
    d
}

/// `pocketmoe run ARGS -p Hello -n 2 --cpu` with the Hub at `url` and the cache at `dir`.
fn run(args: &[&str], url: &str, dir: &Path, env: &[(&str, &str)]) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_pocketmoe"));
    c.arg("run")
        .args(args)
        .args(["-p", "Hello", "-n", "2", "--cpu", "-t", "2"])
        .env("HF_ENDPOINT", url)
        .env("LLAMA_CACHE", dir)
        .env_remove("MODEL_ENDPOINT")
        .env_remove("HF_TOKEN")
        .env_remove("POCKETMOE_HUB_TIMEOUT");
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().expect("running pocketmoe run")
}

fn err(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn downloads(h: &MockHub) -> Vec<String> {
    let r = h.requests();
    r.into_iter().filter(|p| p.contains("/resolve/")).collect()
}

/// A port nothing listens on.
fn closed_url() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    format!("http://{}", l.local_addr().unwrap())
}

#[test]
fn default_quant_downloaded_into_the_hub_cache_then_reused_without_network() {
    let h = hub::start(vec![repo(None)], false);
    let dir = cache("default");
    let o = run(&["-hf", REPO], &h.url, &dir, &[]);
    let e = err(&o);
    assert!(o.status.success(), "{e}");
    assert!(
        downloads(&h)
            .iter()
            .all(|p| p.ends_with("/tiny-Q4_K_M.gguf")),
        "{:?}",
        h.requests()
    );
    assert!(!downloads(&h).is_empty());
    assert!(
        e.contains("download: tiny-Q4_K_M.gguf") && e.contains("100%"),
        "{e}"
    );
    assert!(e.contains(" 50%"), "a line per 5%: {e}");
    // The Hub cache layout, as llama.cpp and the hf CLI keep it.
    let root = dir.join("models--test-user--tiny-GGUF");
    let r = std::fs::read_to_string(root.join("refs/main")).unwrap();
    assert_eq!(r.trim(), hub::COMMIT);
    let snap = root
        .join("snapshots")
        .join(hub::COMMIT)
        .join("tiny-Q4_K_M.gguf");
    let link = std::fs::read_link(&snap).expect("snapshot entry is a link to the blob");
    assert_eq!(link, Path::new("../../blobs").join(format!("{:064x}", 4)));
    assert_eq!(std::fs::read(&snap).unwrap(), *model_bytes());
    // Again with the Hub gone: from the cache.
    let before = h.requests().len();
    let o = run(&["-hf", REPO], &closed_url(), &dir, &[]);
    let e = err(&o);
    assert!(o.status.success(), "{e}");
    assert!(e.contains("from the cache"), "{e}");
    assert_eq!(h.requests().len(), before);
}

#[test]
fn quant_tag_and_hf_file_pick_the_file() {
    let h = hub::start(vec![repo(None)], false);
    let o = run(
        &["-hf", &format!("{REPO}:q8_0")],
        &h.url,
        &cache("tag"),
        &[],
    );
    assert!(o.status.success(), "{}", err(&o));
    assert!(
        downloads(&h).iter().all(|p| p.ends_with("/tiny-Q8_0.gguf")),
        "{:?}",
        h.requests()
    );
    let h = hub::start(vec![repo(None)], false);
    let o = run(
        &["-hfr", &format!("{REPO}:Q8_0"), "-hff", "tiny-Q4_K_M.gguf"],
        &h.url,
        &cache("file"),
        &[],
    );
    assert!(o.status.success(), "{}", err(&o));
    let d = downloads(&h);
    assert!(
        !d.is_empty() && d.iter().all(|p| p.ends_with("/tiny-Q4_K_M.gguf")),
        "{d:?}"
    );
}

#[test]
fn missing_file_or_repo_is_named() {
    let h = hub::start(vec![repo(None)], false);
    let dir = cache("missing");
    let cases: [(&[&str], &[&str]); 3] = [
        (
            &["-hf", "test-user/tiny-GGUF:Q2_K"],
            &[REPO, "'Q2_K'", "tiny-Q8_0.gguf"],
        ),
        (
            &["-hf", REPO, "--hf-file", "nope.gguf"],
            &[REPO, "'nope.gguf'", "not found"],
        ),
        (
            &["-hf", "nobody/none-GGUF"],
            &["nobody/none-GGUF", "not found", "404"],
        ),
    ];
    for (args, want) in cases {
        let o = run(args, &h.url, &dir, &[]);
        let e = err(&o);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {e}");
        for w in want {
            assert!(e.contains(w), "{args:?}: wants {w:?} in {e}");
        }
    }
    assert!(downloads(&h).is_empty(), "{:?}", h.requests());
    let o = run(&["-hf", "not-a-repo"], &h.url, &dir, &[]);
    assert!(
        err(&o).contains("expected <user>/<model>[:quant]"),
        "{}",
        err(&o)
    );
}

#[test]
fn offline_uses_the_cache_only() {
    let h = hub::start(vec![repo(None)], false);
    let o = run(&["-hf", REPO, "--offline"], &h.url, &cache("offline"), &[]);
    let e = err(&o);
    assert_eq!(o.status.code(), Some(1), "{e}");
    assert!(
        e.contains("not in the cache") && e.contains("--offline"),
        "{e}"
    );
    assert!(h.requests().is_empty(), "{:?}", h.requests());
}

#[test]
fn unreachable_or_stalled_hub_fails_without_hanging() {
    let t = Instant::now();
    let o = run(&["-hf", REPO], &closed_url(), &cache("closed"), &[]);
    let e = err(&o);
    assert_eq!(o.status.code(), Some(1), "{e}");
    assert!(e.contains("cannot reach") && e.contains(REPO), "{e}");
    assert!(t.elapsed() < Duration::from_secs(20), "{:?}", t.elapsed());
    // Accepts, never answers.
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", l.local_addr().unwrap());
    let t = Instant::now();
    let o = run(
        &["-hf", REPO],
        &url,
        &cache("silent"),
        &[("POCKETMOE_HUB_TIMEOUT", "1")],
    );
    let e = err(&o);
    assert_eq!(o.status.code(), Some(1), "{e}");
    assert!(e.contains("cannot reach"), "{e}");
    assert!(t.elapsed() < Duration::from_secs(20), "{:?}", t.elapsed());
    drop(l);
    // The listing answers, the download stops halfway.
    let h = hub::start(vec![repo(None)], true);
    let t = Instant::now();
    let o = run(
        &["-hf", REPO],
        &h.url,
        &cache("stall"),
        &[("POCKETMOE_HUB_TIMEOUT", "2")],
    );
    let e = err(&o);
    assert_eq!(o.status.code(), Some(1), "{e}");
    assert!(
        e.contains("stalled") && e.contains("tiny-Q4_K_M.gguf"),
        "{e}"
    );
    assert!(t.elapsed() < Duration::from_secs(30), "{:?}", t.elapsed());
}

#[test]
fn gated_repo_takes_the_token() {
    let token = "hf_abcdefghijklmnopqrstuvwxyz0123456789";
    let h = hub::start(vec![repo(Some(token))], false);
    let o = run(&["-hf", REPO], &h.url, &cache("gated"), &[]);
    let e = err(&o);
    assert_eq!(o.status.code(), Some(1), "{e}");
    assert!(e.contains("401") && e.contains("HF_TOKEN"), "{e}");
    let o = run(
        &["-hf", REPO, "-hft", token],
        &h.url,
        &cache("gated-flag"),
        &[],
    );
    assert!(o.status.success(), "{}", err(&o));
    let o = run(
        &["-hf", REPO],
        &h.url,
        &cache("gated-env"),
        &[("HF_TOKEN", token)],
    );
    assert!(o.status.success(), "{}", err(&o));
}

#[test]
fn serve_downloads_then_serves() {
    use std::io::BufRead;
    let h = hub::start(vec![repo(None)], false);
    let dir = cache("serve");
    let mut child = Command::new(env!("CARGO_BIN_EXE_pocketmoe-serve"))
        .args(["-hf", REPO, "--port", "0", "-t", "2", "--cpu"])
        .env("HF_ENDPOINT", &h.url)
        .env("LLAMA_CACHE", &dir)
        .env("RUST_LOG", "info")
        .env_remove("HF_TOKEN")
        .env_remove("MODEL_ENDPOINT")
        .env_remove("POCKETMOE_API_KEY")
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let stderr = child.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
        {
            eprintln!("[serve] {line}");
            if let Some(p) = line.find("http://") {
                let url = line[p + 7..].split_whitespace().next().unwrap();
                let _ = tx.send(url.trim_end_matches("/v1").to_string());
            }
        }
    });
    let addr = rx
        .recv_timeout(Duration::from_secs(120))
        .expect("server URL");
    let (st, _, body) = common::http_exchange(&addr, "GET /props HTTP/1.1", b"");
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(st, 200, "{body}");
    let props: serde_json::Value = serde_json::from_str(&body).unwrap();
    let path = props["model_path"].as_str().unwrap();
    let want = dir
        .join("models--test-user--tiny-GGUF/snapshots")
        .join(hub::COMMIT);
    assert_eq!(Path::new(path), want.join("tiny-Q4_K_M.gguf"), "{props}");
}
