//! Helpers shared by integration tests (each test binary uses some of them).
#![allow(dead_code)]
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

/// Synthesises `arch`'s `tiny` preset into a per-test, per-process temp folder (`tag` names the
/// test) and returns its path.
pub fn synth_tiny(
    tag: &str,
    arch: &str,
    quant: pocketmoe::synth::quantmix::QuantMix,
    routing_skew: f32,
    seed: u64,
) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("pocketmoe-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join(format!("{arch}.gguf"));
    let opts = pocketmoe::synth::SynthOptions {
        arch: arch.into(),
        preset: "tiny".into(),
        quant,
        routing_skew,
        seed,
        out: out.clone(),
    };
    pocketmoe::synth::synth(&opts, &|_, _| {}).unwrap();
    out
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

/// Index of the largest logit.
pub fn argmax(v: &[f32]) -> u32 {
    pocketmoe::engine::sampling::argmax(v)
}
