//! Helpers shared by integration tests (each test binary uses some of them).
#![allow(dead_code)]
pub mod hub;

use std::path::{Path, PathBuf};

/// Test fixtures from registry packages (vocab-only GGUFs and chat templates from the
/// llama-cpp-python sdist), fetched once by scripts/fetch-fixtures.sh into target/fixtures.
///
/// Once per test binary: tests run in parallel threads, and two concurrent runs of the script
/// race on the same files (`cp: cannot create regular file ...: File exists`).
pub fn fixtures() -> PathBuf {
    static ONCE: std::sync::Mutex<bool> = std::sync::Mutex::new(false);
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut done = ONCE.lock().unwrap_or_else(|e| e.into_inner());
    if *done {
        return root.join("target/fixtures");
    }
    let out = std::process::Command::new("bash")
        .arg(root.join("scripts/fetch-fixtures.sh"))
        .arg(root.join("target/fixtures"))
        .output()
        .expect("running scripts/fetch-fixtures.sh");
    assert!(
        out.status.success(),
        "fetch-fixtures failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    *done = true;
    root.join("target/fixtures")
}

/// This test process's own folder in the temp dir, `{name}-{pid}` (created), after removing the
/// folders `{name}-{pid}` of test processes that have exited: each run of a test binary writes
/// its models under its own pid (tests of one binary share them, runs never do), and nothing
/// removes them at its end (a Rust test binary has no teardown), so runs piled up (1212 folders,
/// 27 GB, on the dev box by 2026-12-05). A folder whose pid is alive, or is not known to have
/// exited (no `/proc` to ask), is left alone.
pub fn process_dir(name: &str) -> PathBuf {
    let tmp = std::env::temp_dir();
    if Path::new("/proc/self").exists() {
        let prefix = format!("{name}-");
        for entry in std::fs::read_dir(&tmp).into_iter().flatten().flatten() {
            let file = entry.file_name();
            let Some(pid) = file
                .to_str()
                .and_then(|f| f.strip_prefix(&prefix))
                .filter(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
            else {
                continue;
            };
            if !Path::new("/proc").join(pid).exists() {
                // Another binary sweeping the same name may have removed it first.
                let _ = std::fs::remove_dir_all(entry.path());
            }
        }
    }
    let dir = tmp.join(format!("{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Synthesises `arch`'s `tiny` preset into a per-test, per-process temp folder (`tag` names the
/// test) and returns its path.
pub fn synth_tiny(
    tag: &str,
    arch: &str,
    quant: pocketmoe::synth::quantmix::QuantMix,
    routing_skew: f32,
    seed: u64,
) -> PathBuf {
    synth_preset(tag, arch, "tiny", quant, routing_skew, seed)
}

/// As [`synth_tiny`] for any preset (the file is `{arch}.gguf` for `tiny`, else named by
/// preset, skew and seed).
pub fn synth_preset(
    tag: &str,
    arch: &str,
    preset: &str,
    quant: pocketmoe::synth::quantmix::QuantMix,
    routing_skew: f32,
    seed: u64,
) -> PathBuf {
    let dir = process_dir(&format!("pocketmoe-{tag}"));
    let out = if preset == "tiny" {
        dir.join(format!("{arch}.gguf"))
    } else {
        dir.join(format!("{arch}-{preset}-{routing_skew}-{seed}.gguf"))
    };
    // Written under a name of this thread's and renamed into place: tests of one file run in
    // parallel threads of one process and often synthesise the same file, and one truncating
    // it while another has it mapped is a SIGBUS (tests/dense.rs in CI, 2026-12-03). A rename
    // leaves a mapping of the old file intact; the bytes are the same either way.
    static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp = out.with_extension(format!("gguf.part{n}"));
    let opts = pocketmoe::synth::SynthOptions {
        arch: arch.into(),
        preset: preset.into(),
        quant,
        routing_skew,
        seed,
        out: tmp.clone(),
    };
    pocketmoe::synth::synth(&opts, &|_, _| {}).unwrap();
    std::fs::rename(&tmp, &out).unwrap();
    out
}

/// Our engine on the CPU with 2 threads and context `n_ctx`.
pub fn cpu_engine(path: &Path, n_ctx: usize) -> pocketmoe::engine::Engine {
    pocketmoe::engine::Engine::load(
        path,
        pocketmoe::engine::EngineOptions {
            device: pocketmoe::engine::Device::Cpu,
            n_ctx,
            n_threads: 2,
            ..Default::default()
        },
        &|_, _| {},
    )
    .unwrap()
}

/// The router's top-k of every layer over `n_steps` decode steps, one token from `tok` each:
/// `[layer][step]` (captured from `ffn_moe_probs-{il}`).
pub fn decode_routing(
    eng: &mut pocketmoe::engine::Engine,
    n_steps: usize,
    tok: &mut dyn FnMut() -> u32,
) -> Vec<Vec<Vec<usize>>> {
    let (n_layer, k) = (eng.hp.n_layer, eng.hp.n_expert_used as usize);
    let names: Vec<String> = (0..n_layer)
        .map(|il| format!("ffn_moe_probs-{il}"))
        .collect();
    let mut cap = pocketmoe::ggml::capture::Capture::new(names.clone());
    eng.set_capture(Some(&mut cap)).unwrap();
    let mut picks = vec![Vec::new(); n_layer];
    for _ in 0..n_steps {
        eng.forward_last(&[tok()]).unwrap();
        for (il, name) in names.iter().enumerate() {
            picks[il].push(pocketmoe::util::top_k(&cap.got[name], k));
        }
        cap.got.clear();
    }
    eng.set_capture(None).unwrap();
    picks
}

/// Cosine similarity, in f64.
pub fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let (mut ab, mut aa, mut bb) = (0f64, 0f64, 0f64);
    for (&x, &y) in a.iter().zip(b) {
        ab += x as f64 * y as f64;
        aa += (x as f64).powi(2);
        bb += (y as f64).powi(2);
    }
    ab / (aa.sqrt() * bb.sqrt())
}

/// The largest |a[i] - b[i]|.
pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0f32, f32::max)
}

/// Index of the largest logit.
pub fn argmax(v: &[f32]) -> u32 {
    pocketmoe::engine::sampling::argmax(v)
}

/// Starts `pocketmoe-serve` with `args` (its info log on, each stderr line echoed with a
/// `[serve]` prefix) and waits up to 120 s for the line with its URL. Returns the child and the
/// `host:port` it listens on (ask it for `--port 0`).
pub fn spawn_serve<S: AsRef<std::ffi::OsStr>>(args: &[S]) -> (std::process::Child, String) {
    use std::io::BufRead;
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_pocketmoe-serve"))
        .args(args)
        .env("RUST_LOG", "info")
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("starting pocketmoe-serve");
    let err = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut tx = Some(tx);
        for line in std::io::BufReader::new(err).lines().map_while(Result::ok) {
            eprintln!("[serve] {line}");
            if let Some(p) = line.find("http://") {
                if let Some(t) = tx.take() {
                    let url = line[p + 7..].split_whitespace().next().unwrap();
                    let _ = t.send(url.trim_end_matches("/v1").to_string());
                }
            }
        }
    });
    let addr = rx
        .recv_timeout(std::time::Duration::from_secs(120))
        .expect("pocketmoe-serve did not report its URL");
    (child, addr)
}

/// A test's server process: killed and reaped when dropped, so no server outlives its test.
pub struct Served(pub std::process::Child);

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// [`spawn_serve`], the process held as [`Served`].
pub fn serve<S: AsRef<std::ffi::OsStr>>(args: &[S]) -> (Served, String) {
    let (child, addr) = spawn_serve(args);
    (Served(child), addr)
}

/// [`serve`] with `--model model`, then `args`, then `extra` (a test's own flags after its
/// file's common ones).
pub fn serve_model(model: &Path, args: &[&str], extra: &[&str]) -> (Served, String) {
    let mut all: Vec<std::ffi::OsString> = vec!["--model".into(), model.into()];
    all.extend(args.iter().chain(extra).map(std::ffi::OsString::from));
    serve(&all)
}

/// `POST path` with a JSON `body` (and `Authorization: Bearer KEY` when `key` is given) to the
/// server at `addr`: the status and the body parsed as JSON (a body that is not JSON is a panic
/// naming the path and the text).
pub fn post_json(
    addr: &str,
    path: &str,
    body: &serde_json::Value,
    key: Option<&str>,
) -> (u16, serde_json::Value) {
    let (status, text) = post_text(addr, path, body, key);
    let v = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}: {text:?}"));
    (status, v)
}

/// [`post_json`] without parsing: the status and the raw body.
pub fn post_text(
    addr: &str,
    path: &str,
    body: &serde_json::Value,
    key: Option<&str>,
) -> (u16, String) {
    let b = body.to_string();
    let auth = key.map_or(String::new(), |k| format!("\r\nAuthorization: Bearer {k}"));
    let head = format!(
        "POST {path} HTTP/1.1{auth}\r\nContent-Type: application/json\r\nContent-Length: {}",
        b.len()
    );
    let (status, _, text) = http_exchange(addr, &head, b.as_bytes());
    (status, text)
}

/// One raw HTTP/1.1 exchange with the server at `addr`: `head` is the request line and headers
/// (without Host, Connection and the blank line, which are added), then `body`. Returns the
/// status, the response head in lower case, and the body. A server may answer (413, 431) and
/// close before reading a body, so write errors are ignored; no status line is a panic naming
/// the request.
pub fn http_exchange(addr: &str, head: &str, body: &[u8]) -> (u16, String, String) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(std::time::Duration::from_secs(300)))
        .unwrap();
    let req = format!("{head}\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    let _ = s.write_all(req.as_bytes()).and_then(|_| s.write_all(body));
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    let text = String::from_utf8_lossy(&out).into_owned();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| {
            panic!(
                "no HTTP status in {text:?} (request {head:?} {:?})",
                String::from_utf8_lossy(&body[..body.len().min(200)])
            )
        });
    let (h, b) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    (status, h.to_ascii_lowercase(), b.to_string())
}

/// Writes `base` with `key` set to `value` (everything else copied: metadata order, tensors,
/// data) to `out`; a key the base lacks is added at the end.
pub fn write_with_key(
    base: &pocketmoe::gguf::GgufModel,
    key: &str,
    value: &pocketmoe::gguf::GgufValue,
    out: &Path,
) {
    let mut w = pocketmoe::gguf::GgufWriter::new();
    for (k, v) in base.metadata() {
        w.add_kv(k, if k == key { value.clone() } else { v.clone() });
    }
    if !key.is_empty() && !base.metadata().contains_key(key) {
        w.add_kv(key, value.clone());
    }
    let tensors: Vec<_> = base.tensors().cloned().collect();
    for t in &tensors {
        w.add_tensor(&t.name, t.ty, t.shape()).unwrap();
    }
    w.write(out, |i, buf| {
        buf.copy_from_slice(base.tensor_data(&tensors[i]));
        Ok(())
    })
    .unwrap();
}

/// SmolLM2-135M-Instruct (a dense `llama` GGUF, Q4_1), fetched once from PyPI by
/// scripts/fetch-smollm2.sh into ~/.cache/pocketmoe (or `POCKETMOE_CACHE`).
pub fn smollm2() -> PathBuf {
    static ONCE: std::sync::Mutex<Option<PathBuf>> = std::sync::Mutex::new(None);
    let mut done = ONCE.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(p) = done.as_ref() {
        return p.clone();
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = std::process::Command::new("bash")
        .arg(root.join("scripts/fetch-smollm2.sh"))
        .stderr(std::process::Stdio::inherit())
        .output()
        .expect("running scripts/fetch-smollm2.sh");
    assert!(out.status.success(), "scripts/fetch-smollm2.sh failed");
    let p = PathBuf::from(String::from_utf8(out.stdout).unwrap().trim());
    *done = Some(p.clone());
    p
}

/// A venv (under the target dir, built once per version) with the pinned Python package
/// `pkg==version` from PyPI, importable as `pkg`; returns its python. Serialised: two test
/// threads building the same venv would race on its files.
pub fn pip_venv(pkg: &str, version: &str) -> PathBuf {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _g = LOCK.lock().unwrap_or_else(|p| p.into_inner());
    let venv = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("{pkg}-{version}"));
    let py = venv.join("bin/python");
    let ok = |py: &Path| {
        std::process::Command::new(py)
            .args([
                "-c",
                &format!("import {pkg}; assert {pkg}.__version__ == '{version}'"),
            ])
            .status()
            .is_ok_and(|s| s.success())
    };
    if !ok(&py) {
        let st = std::process::Command::new("python3")
            .args(["-m", "venv", "--clear"])
            .arg(&venv)
            .status()
            .expect(
                "python3 is needed for the client tests (apt-get install python3 python3-venv)",
            );
        assert!(st.success(), "python3 -m venv {} failed", venv.display());
        let st = std::process::Command::new(venv.join("bin/pip"))
            .args(["install", "--quiet", "--disable-pip-version-check"])
            .arg(format!("{pkg}=={version}"))
            .status()
            .expect("running pip");
        assert!(st.success(), "pip install {pkg}=={version} failed");
        assert!(ok(&py), "{pkg} {version} does not import after installing");
    }
    py
}

/// `path` rewritten without the tensor `drop`, as `out`.
pub fn write_without(path: &Path, drop: &str, out: &Path) {
    use pocketmoe::gguf::{GgufModel, GgufWriter};
    let src = GgufModel::open(path).unwrap();
    let mut w = GgufWriter::new();
    for (k, v) in src.metadata() {
        w.add_kv(k, v.clone());
    }
    let kept: Vec<_> = src.tensors().filter(|t| t.name != drop).collect();
    for t in &kept {
        w.add_tensor(&t.name, t.ty, t.shape()).unwrap();
    }
    w.write(out, |i, buf| {
        buf.copy_from_slice(src.tensor_data(kept[i]));
        Ok(())
    })
    .unwrap();
}

/// `path` rewritten without `output.weight` (a head tied to the embedding, as llama.cpp reads
/// such files).
pub fn without_output(path: &Path) -> PathBuf {
    let out = path.with_extension("tied.gguf");
    write_without(path, "output.weight", &out);
    out
}

/// Greedy continuation of sequences decoded together (`Engine::forward_batch`): sequence `i`
/// of `seqs` is `(prompt, pages, slot)`; its prompt is computed in one micro-batch with the
/// others, then `steps` one-token steps of all of them. Per sequence: its greedy tokens and the
/// logits of every step (the prompt's last row first).
pub fn batch_greedy(
    eng: &mut pocketmoe::engine::Engine,
    seqs: &[(&[u32], &[u32], usize)],
    steps: usize,
) -> Vec<(Vec<u32>, Vec<Vec<f32>>)> {
    use pocketmoe::engine::batch::{BatchModel, SeqChunk};
    let mut out: Vec<(Vec<u32>, Vec<Vec<f32>>)> = vec![(Vec::new(), Vec::new()); seqs.len()];
    let chunks: Vec<SeqChunk> = seqs
        .iter()
        .map(|&(tokens, pages, slot)| SeqChunk {
            pages,
            pos: 0,
            tokens,
            logits: true,
            slot,
        })
        .collect();
    let mut logits = eng.forward_batch(&chunks).unwrap();
    for _ in 0..steps {
        let next: Vec<u32> = logits.iter().map(|l| argmax(l)).collect();
        for (k, l) in logits.into_iter().enumerate() {
            out[k].0.push(next[k]);
            out[k].1.push(l);
        }
        let chunks: Vec<SeqChunk> = seqs
            .iter()
            .enumerate()
            .map(|(k, &(prompt, pages, slot))| SeqChunk {
                pages,
                pos: prompt.len() + out[k].0.len() - 1,
                tokens: std::slice::from_ref(&next[k]),
                logits: true,
                slot,
            })
            .collect();
        logits = eng.forward_batch(&chunks).unwrap();
    }
    out
}
