//! Every architecture's `tiny` synth preset: written by our writer, read back by our reader,
//! valid against the registry, and loaded and run by libllama (the reference) — which must agree
//! with us on the weight bytes and parameter count, and produce finite, peaked logits.
use pocketmoe::ggml::llama::{LlamaContext, LlamaModel};
use pocketmoe::gguf::GgufModel;
use pocketmoe::model::{validate::validate, Hparams};
use pocketmoe::synth::{self, presets, quantmix::QuantMix, SynthOptions};
use std::path::PathBuf;

fn tmp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("pocketmoe-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

fn write_tiny(arch: &str, quant: QuantMix) -> PathBuf {
    let out = tmp(&format!("{arch}-{}.gguf", quant.name()));
    let opts = SynthOptions {
        arch: arch.into(),
        preset: "tiny".into(),
        quant,
        routing_skew: 1.0,
        seed: 7,
        out: out.clone(),
    };
    synth::synth(&opts, &|_, _| {}).unwrap_or_else(|e| panic!("synth {arch}: {e}"));
    out
}

fn check_arch(arch: &str, quant: QuantMix) {
    let path = write_tiny(arch, quant);
    // Our reader: round trip of the hyper-parameters and a clean validation.
    let model = GgufModel::open(&path).unwrap();
    let spec = &pocketmoe::arch::by_name(arch).unwrap().spec;
    let hp = Hparams::from_meta(spec, &model).unwrap();
    let preset = presets::find(arch, "tiny").unwrap();
    for (field, ours, theirs) in [
        ("n_embd", hp.n_embd, preset.hparams.n_embd),
        ("n_vocab", hp.n_vocab, preset.hparams.n_vocab),
        ("n_expert", hp.n_expert, preset.hparams.n_expert),
        (
            "n_expert_used",
            hp.n_expert_used,
            preset.hparams.n_expert_used,
        ),
        ("n_layer", hp.n_layer as u64, preset.hparams.n_layer as u64),
    ] {
        assert_eq!(ours, theirs, "{arch}: {field} did not round-trip");
    }
    let tensors: Vec<_> = model.tensors().cloned().collect();
    let v = validate(spec, &hp, &tensors);
    assert!(v.is_ok(), "{arch}: {:?}", v.errors().collect::<Vec<_>>());
    let our_bytes: u64 = tensors.iter().map(|t| t.n_bytes).sum();
    let our_params: u64 = tensors.iter().map(|t| t.n_elements()).sum();

    // The reference loads it and runs a forward pass.
    let lm = LlamaModel::load(&path, 0).unwrap_or_else(|e| panic!("{arch}: {e}"));
    assert_eq!(
        lm.n_vocab() as u64,
        preset.hparams.n_vocab,
        "{arch}: libllama's vocabulary size"
    );
    assert_eq!(
        lm.size(),
        our_bytes,
        "{arch}: libllama counts different weight bytes"
    );
    assert_eq!(
        lm.n_params(),
        our_params,
        "{arch}: libllama counts different parameters"
    );
    let mut ctx = LlamaContext::new(&lm, 64, 2).unwrap();
    let tokens = lm
        .tokenize("Hello world, this is a test of 123 tokens", false, false)
        .unwrap();
    assert!(tokens.len() > 3, "{arch}: tokenized to {tokens:?}");
    let logits = ctx.logits_all(&tokens).unwrap();
    assert_eq!(logits.len(), tokens.len());
    for (pos, l) in logits.iter().enumerate() {
        assert!(
            l.iter().all(|x| x.is_finite()),
            "{arch}: non-finite logits at {pos}"
        );
        let mean = l.iter().sum::<f32>() / l.len() as f32;
        let std = (l.iter().map(|x| (x - mean).powi(2)).sum::<f32>() / l.len() as f32).sqrt();
        assert!(
            std > 0.5,
            "{arch}: near-flat logits at position {pos} (std {std})"
        );
    }
    std::fs::remove_file(&path).ok();
}

/// Every architecture with a graph (`pocketmoe::arch::built`), each with a `tiny` preset.
#[test]
fn tiny_presets_load_in_libllama() {
    for arch in pocketmoe::arch::built() {
        assert!(
            arch.synth.tiny.is_some(),
            "{} has no tiny preset",
            arch.spec.name
        );
        check_arch(arch.spec.name, QuantMix::Q4KM);
    }
}

#[test]
fn every_quant_mix_loads_in_libllama() {
    for q in [QuantMix::Q8_0, QuantMix::IQ2XXS, QuantMix::F16] {
        check_arch("qwen3moe", q);
    }
    check_arch("gpt-oss", QuantMix::MXFP4);
}

#[test]
fn synth_is_deterministic_and_seeded() {
    let a = write_tiny("olmoe", QuantMix::Q8_0);
    let bytes_a = std::fs::read(&a).unwrap();
    std::fs::remove_file(&a).unwrap();
    let b = write_tiny("olmoe", QuantMix::Q8_0);
    assert_eq!(
        bytes_a,
        std::fs::read(&b).unwrap(),
        "same seed, different file"
    );
    let out = tmp("olmoe-seed8.gguf");
    let opts = SynthOptions {
        arch: "olmoe".into(),
        preset: "tiny".into(),
        quant: QuantMix::Q8_0,
        routing_skew: 1.0,
        seed: 8,
        out: out.clone(),
    };
    synth::synth(&opts, &|_, _| {}).unwrap();
    assert_ne!(
        bytes_a,
        std::fs::read(&out).unwrap(),
        "different seed, same file"
    );
}

#[test]
fn synth_rejects_bad_options() {
    let out = tmp("bad.gguf");
    let mk = |arch: &str, preset: &str, skew: f32| SynthOptions {
        arch: arch.into(),
        preset: preset.into(),
        quant: QuantMix::Q8_0,
        routing_skew: skew,
        seed: 1,
        out: out.clone(),
    };
    let e = synth::synth(&mk("nope", "tiny", 1.0), &|_, _| {})
        .unwrap_err()
        .to_string();
    assert!(e.contains("nope"), "{e}");
    let e = synth::synth(&mk("qwen3moe", "huge", 1.0), &|_, _| {})
        .unwrap_err()
        .to_string();
    assert!(e.contains("huge") && e.contains("qwen3-30b-a3b"), "{e}");
    let e = synth::synth(&mk("qwen3moe", "tiny", f32::NAN), &|_, _| {})
        .unwrap_err()
        .to_string();
    assert!(e.contains("routing-skew"), "{e}");
}

/// Rewriting a file that a reader has mapped: the reader keeps the old file whole (the new one
/// is written aside and renamed over it), the path then holds the new file, and no partial
/// file is left behind. (Parallel tests re-synthesise shared fixtures; written in place, a
/// reader saw mixed bytes.)
#[test]
fn synth_replaces_a_mapped_file_atomically() {
    let out = tmp("replace.gguf");
    let mk = |seed| SynthOptions {
        arch: "qwen3moe".into(),
        preset: "tiny".into(),
        quant: QuantMix::Q8_0,
        routing_skew: 1.0,
        seed,
        out: out.clone(),
    };
    synth::synth(&mk(1), &|_, _| {}).unwrap();
    let old = GgufModel::open(&out).unwrap();
    let t = old
        .tensors()
        .find(|t| t.name == "token_embd.weight")
        .unwrap()
        .clone();
    let before = old.tensor_data(&t).to_vec();
    synth::synth(&mk(2), &|_, _| {}).unwrap();
    // (`assert!`, not `assert_eq!`: a failure would print megabytes of bytes.)
    assert!(
        old.tensor_data(&t) == &before[..],
        "the mapped file changed"
    );
    let new = GgufModel::open(&out).unwrap();
    assert_ne!(
        new.tensor_data(&t),
        &before[..],
        "the path still holds the old file"
    );
    let dir = out.parent().unwrap();
    let partial: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with("replace.gguf.partial-")
        })
        .collect();
    assert!(partial.is_empty(), "left behind: {partial:?}");
}
