//! Weight placement (`engine::weights`): offloading to a GPU, the token embedding lives in host
//! memory, looked up on the CPU, with a device copy only when the output head is tied to it. Two
//! CPU backends stand in for the GPU and the host here; the GPU run itself is covered by the
//! device workflow (`scripts/device-run.sh tests`).
mod common;
use pocketmoe::engine::weights::{Weights, TOKEN_EMBD};
use pocketmoe::ggml::Backend;
use pocketmoe::gguf::{GgufModel, GgufWriter};
use pocketmoe::synth::quantmix::QuantMix;
use std::path::{Path, PathBuf};

/// `path` rewritten without `output.weight` (a head tied to the embedding, as llama.cpp reads
/// such files).
fn without_output(path: &Path) -> PathBuf {
    let src = GgufModel::open(path).unwrap();
    let mut w = GgufWriter::new();
    for (k, v) in src.metadata() {
        w.add_kv(k, v.clone());
    }
    let kept: Vec<_> = src
        .tensors()
        .filter(|t| t.name != "output.weight")
        .collect();
    for t in &kept {
        w.add_tensor(&t.name, t.ty, t.shape()).unwrap();
    }
    let out = path.with_extension("tied.gguf");
    w.write(&out, |i, buf| {
        buf.copy_from_slice(src.tensor_data(kept[i]));
        Ok(())
    })
    .unwrap();
    out
}

#[test]
fn token_embedding_goes_to_the_host_part_and_a_tied_head_keeps_a_device_copy() {
    let mut saw_tied = false;
    let mut saw_untied = false;
    for arch in pocketmoe::arch::built().map(|a| a.spec.name) {
        let untied = common::synth_tiny("weights", arch, QuantMix::Q8_0, 1.0, 3);
        for path in [without_output(&untied), untied] {
            let file = GgufModel::open(&path).unwrap();
            let total: u64 = file.tensors().map(|t| t.n_bytes).sum();
            let embd = file
                .tensors()
                .find(|t| t.name == TOKEN_EMBD)
                .unwrap()
                .clone();
            let tied = !file.tensors().any(|t| t.name == "output.weight");
            saw_tied |= tied;
            saw_untied |= !tied;

            let (main, host) = (Backend::cpu(1).unwrap(), Backend::cpu(1).unwrap());
            let w = Weights::load(&file, &main, Some(&host), &|_| true, &|_, _| {}).unwrap();
            assert_eq!(w.host_bytes(), embd.n_bytes, "{arch}: host part");
            let on_main = if tied { total } else { total - embd.n_bytes };
            assert_eq!(w.bytes(), on_main, "{arch}: main part (tied: {tied})");
            let lookup = w.embedding().unwrap();
            assert_eq!(
                lookup.read_bytes().unwrap(),
                file.tensor_data(&embd),
                "{arch}: host copy's bytes"
            );
            // `get` serves the head: the device copy where there is one.
            let head_table = w.get(TOKEN_EMBD).unwrap();
            assert_eq!(
                head_table.data_addr() != lookup.data_addr(),
                tied,
                "{arch}: a tied head reads its own device copy, an untied model has one copy"
            );

            // Without a host backend everything is on the main one.
            let w = Weights::load(&file, &main, None, &|_| true, &|_, _| {}).unwrap();
            assert_eq!(
                (w.bytes(), w.host_bytes()),
                (total, 0),
                "{arch}: no host part"
            );
            assert_eq!(
                w.embedding().unwrap().data_addr(),
                w.get(TOKEN_EMBD).unwrap().data_addr()
            );
        }
    }
    assert!(
        saw_untied && saw_tied,
        "untied {saw_untied}, tied {saw_tied}"
    );
}
