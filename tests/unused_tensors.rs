//! Tensors a graph never reads are named at load, not accepted silently (issue 27): a file with
//! one tensor more than its graph uses loads (llama.cpp-compatible files may carry extras), and
//! the engine lists that tensor by name and warns with it; a file of only used tensors (every
//! built architecture's tiny preset, but for a multi-token-prediction block, which is not built)
//! lists none.
mod common;
use pocketmoe::engine::Engine;
use pocketmoe::ggml::GgmlType;
use pocketmoe::gguf::{GgufModel, GgufWriter};
use pocketmoe::synth::quantmix::QuantMix;
use std::path::{Path, PathBuf};

const EXTRA: &str = "blk.0.never_read.weight";

/// `base` with one more tensor, [`EXTRA`] (f32, 16 zeros), that no graph reads.
fn with_extra_tensor(base: &Path) -> PathBuf {
    let model = GgufModel::open(base).unwrap();
    let mut w = GgufWriter::new();
    for (k, v) in model.metadata() {
        w.add_kv(k, v.clone());
    }
    let tensors: Vec<_> = model.tensors().cloned().collect();
    for t in &tensors {
        w.add_tensor(&t.name, t.ty, t.shape()).unwrap();
    }
    w.add_tensor(EXTRA, GgmlType::F32, &[16]).unwrap();
    let out = base.with_extension("extra.gguf");
    w.write(&out, |i, buf| {
        if let Some(t) = tensors.get(i) {
            buf.copy_from_slice(model.tensor_data(t));
        }
        Ok(())
    })
    .unwrap();
    out
}

#[test]
fn a_tensor_no_graph_reads_is_named_at_load() {
    let base = common::synth_tiny("unused", "qwen3moe", QuantMix::Q8_0, 1.0, 3);
    let path = with_extra_tensor(&base);
    let eng = common::cpu_engine(&path, 256);
    assert_eq!(eng.unused_tensors(), [EXTRA.to_string()]);

    // And the warning reaches the user of `pocketmoe run` without RUST_LOG.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_pocketmoe"))
        .args(["run", "--cpu", "-n", "1", "-p", "hi", "-m"])
        .arg(&path)
        .env_remove("RUST_LOG")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("no graph reads") && stderr.contains(EXTRA),
        "the warning does not name {EXTRA}:\n{stderr}"
    );
}

/// Every tensor of each built architecture's tiny preset is read by its graphs, except those of a
/// multi-token-prediction block (glm4moe's tiny has one; not built, as in libllama, which skips
/// loading them): those are listed, all of them.
#[test]
fn every_built_architecture_reads_all_its_tensors_but_mtp_blocks() {
    let mut bad = Vec::new();
    for arch in pocketmoe::arch::built() {
        let name = arch.spec.name;
        let path = common::synth_tiny("unused-clean", name, QuantMix::Q8_0, 1.0, 3);
        let eng: Engine = common::cpu_engine(&path, 256);
        let n_decode = eng.hp.n_layer_decode();
        let mtp = |t: &str| {
            t.strip_prefix("blk.")
                .and_then(|r| r.split('.').next()?.parse::<usize>().ok())
                .is_some_and(|b| b >= n_decode)
        };
        let unused = eng.unused_tensors();
        let (in_mtp, other): (Vec<&String>, Vec<&String>) = unused.iter().partition(|t| mtp(t));
        if !other.is_empty() {
            bad.push(format!("{name}: unread {other:?}"));
        }
        let model = pocketmoe::gguf::GgufModel::open(&path).unwrap();
        let mtp_in_file = model.tensors().filter(|t| mtp(&t.name)).count();
        if in_mtp.len() != mtp_in_file {
            bad.push(format!(
                "{name}: {} of {mtp_in_file} MTP-block tensors listed",
                in_mtp.len()
            ));
        }
    }
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}
