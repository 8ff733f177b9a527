//! Every architecture's `tiny` synth preset: written by our writer, read back by our reader,
//! valid against the registry, and loaded and run by libllama (the reference) — which must agree
//! with us on the weight bytes and parameter count, and produce finite, peaked logits.
//! deepseek4's tiny preset runs in libllama over prompts that reach every attention path (its
//! graph's parity test, tests/parity_long.rs, compares against libllama on them).
mod common;

use pocketmoe::ggml::llama::{ContextOptions, LlamaContext, LlamaModel};
use pocketmoe::ggml::GgmlType;
use pocketmoe::gguf::GgufModel;
use pocketmoe::model::{validate::validate, Hparams, Role};
use pocketmoe::synth::{self, presets, quantmix::QuantMix, SynthOptions};
use std::path::PathBuf;

fn tmp(name: &str) -> PathBuf {
    let dir = common::process_dir("pocketmoe-test");
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

/// The text a forward pass runs.
#[derive(Clone, Copy)]
enum Prompt {
    /// A sentence, in one micro-batch.
    Short,
    /// This many tokens in micro-batches of 128, then four single-token decode steps.
    Long(usize),
}

fn check_arch(arch: &str, quant: QuantMix) {
    check_arch_with(arch, quant, Prompt::Short);
}

/// Logits finite and peaked (not flat) at every position.
fn check_logits(arch: &str, logits: &[Vec<f32>], first_pos: usize) {
    for (i, l) in logits.iter().enumerate() {
        let pos = first_pos + i;
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
}

/// Runs `prompt` through libllama and checks every position's logits.
fn run_prompt(lm: &LlamaModel, arch: &str, prompt: Prompt) {
    let (text, n, ubatch) = match prompt {
        Prompt::Short => (
            "Hello world, this is a test of 123 tokens".to_string(),
            0,
            64,
        ),
        Prompt::Long(n) => {
            let words: Vec<String> = (0..n).map(|i| format!("w{} ", i * 7919 % 1000)).collect();
            (words.concat(), n, 128)
        }
    };
    let mut tokens = lm.tokenize(&text, false, false).unwrap();
    assert!(tokens.len() > 3.max(n), "{arch}: tokenized to {tokens:?}");
    if n > 0 {
        tokens.truncate(n);
    }
    let n_ctx = (tokens.len() as u32 + 16).next_multiple_of(256);
    let mut ctx = LlamaContext::with_options(
        lm,
        &ContextOptions {
            n_ctx,
            n_batch: n_ctx,
            n_ubatch: ubatch,
            n_threads: 2,
            op_offload: false,
            threadpool: false,
        },
    )
    .unwrap_or_else(|e| panic!("{arch}: {e}"));
    let logits = ctx.logits_all(&tokens).unwrap();
    assert_eq!(logits.len(), tokens.len());
    check_logits(arch, &logits, 0);
    if let Prompt::Long(_) = prompt {
        for step in 0..4 {
            let pos = tokens.len() + step;
            let l = ctx.eval(&[tokens[step]], pos).unwrap();
            check_logits(arch, &l, pos);
        }
    }
}

fn check_arch_with(arch: &str, quant: QuantMix, prompt: Prompt) {
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
    run_prompt(&lm, arch, prompt);
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

/// Tokens of the long prompt the deepseek4 tests run: past the 64-token window, over 128 (a
/// ratio-128 row), and 75 ratio-4 rows of which the indexer keeps 8.
const DSV4_PROMPT: usize = 300;

/// deepseek4's tiny preset in libllama, over the long prompt in
/// micro-batches (the compressors carry state across them) and then decode steps.
#[test]
fn tiny_deepseek4_runs_in_libllama() {
    check_arch_with("deepseek4", QuantMix::Q4KM, Prompt::Long(DSV4_PROMPT));
}

/// The tiny deepseek4 holds every kind of block the graph builds, and the sizes that make the
/// long prompt reach every path.
#[test]
fn tiny_deepseek4_covers_every_block_kind() {
    let path = write_tiny("deepseek4", QuantMix::Q8_0);
    let model = GgufModel::open(&path).unwrap();
    let spec = &pocketmoe::arch::by_name("deepseek4").unwrap().spec;
    let hp = Hparams::from_meta(spec, &model).unwrap();
    for r in [0, 4, 128] {
        assert!(
            hp.dsv4.compress_ratios.contains(&r),
            "no block of ratio {r}"
        );
    }
    let hash = hp.dsv4.hash_layer_count;
    assert!(
        (1..hp.n_layer).contains(&hash),
        "hash-routed blocks {hash} of {}",
        hp.n_layer
    );
    assert!(
        hp.dsv4.compress_ratios[..hash].iter().any(|&r| r != 0),
        "no compressed hash-routed block"
    );
    assert_eq!((hp.dsv4.hc_mult, hp.gating as u32), (4, 4));
    assert!(
        hp.dsv4.swiglu_clamp_exp > 0.0
            && hp.dsv4.swiglu_clamp_shexp > 0.0
            && hp.n_expert_shared > 0
    );
    let n = DSV4_PROMPT as u64;
    assert!(
        hp.swa.window < n && n > 128,
        "the prompt stays in the window"
    );
    assert!(
        hp.indexer.top_k > 0 && hp.indexer.top_k < n / 4,
        "top-{} keeps every ratio-4 row",
        hp.indexer.top_k
    );
    let names: Vec<&str> = model.tensors().map(|t| t.name.as_str()).collect();
    for (il, &r) in hp.dsv4.compress_ratios.iter().enumerate() {
        let has = |s: &str| names.contains(&format!("blk.{il}.{s}.weight").as_str());
        assert_eq!(has("attn_compressor_kv"), r != 0, "block {il} ratio {r}");
        assert_eq!(has("indexer.proj"), r == 4, "block {il} ratio {r}");
        assert!(has("attn_sinks"), "block {il} has no sinks");
    }
    // The hash routers' tables: I32, every token `n_expert_used` distinct valid experts.
    for il in 0..hash {
        let t = model
            .tensors()
            .find(|t| t.name == format!("blk.{il}.ffn_gate_tid2eid.weight"))
            .unwrap_or_else(|| panic!("block {il} has no tid2eid"));
        assert_eq!(t.ty, GgmlType::I32);
        assert_eq!(t.ne[..2], [hp.n_expert_used, hp.n_vocab]);
        let ids: &[i32] = bytemuck::cast_slice(model.tensor_data(t));
        for row in ids.chunks(hp.n_expert_used as usize) {
            assert!(
                row.iter().all(|&e| (0..hp.n_expert as i32).contains(&e)),
                "{row:?}"
            );
            assert!(row[0] != row[1], "repeated expert {row:?}");
        }
    }
    std::fs::remove_file(&path).ok();
}

/// The seed's mix (`dsv4-seed`): libllama runs the tiny deepseek4 in it, and every tensor has
/// the type its role gets: routed gate/up IQ2_XXS, down Q2_K, other matrices Q8_0.
#[test]
fn tiny_deepseek4_in_the_seed_mix() {
    check_arch_with("deepseek4", QuantMix::Dsv4Seed, Prompt::Long(DSV4_PROMPT));
    let path = write_tiny("deepseek4", QuantMix::Dsv4Seed);
    let model = GgufModel::open(&path).unwrap();
    let spec = &pocketmoe::arch::by_name("deepseek4").unwrap().spec;
    let hp = Hparams::from_meta(spec, &model).unwrap();
    let tensors: Vec<_> = model.tensors().cloned().collect();
    let roles = validate(spec, &hp, &tensors).roles;
    let mut seen = std::collections::BTreeMap::new();
    for t in &tensors {
        let role = roles[&t.name];
        let matrix = t.ne.iter().filter(|&&d| d > 1).count() >= 2;
        let want = match role {
            _ if t.name.contains("tid2eid") => GgmlType::I32,
            Role::RoutedExperts if t.name.contains("ffn_down_exps") => GgmlType::Q2_K,
            Role::RoutedExperts => GgmlType::IQ2_XXS,
            Role::Router | Role::Norm => GgmlType::F32,
            _ if !matrix => GgmlType::F32,
            _ => GgmlType::Q8_0,
        };
        assert_eq!(t.ty, want, "{} ({role:?})", t.name);
        *seen.entry(format!("{role:?} {}", t.ty.name())).or_insert(0) += 1;
    }
    for kind in [
        "RoutedExperts iq2_xxs",
        "RoutedExperts q2_K",
        "Attention q8_0",
        "SharedExperts q8_0",
        "Output q8_0",
        "Embedding q8_0",
    ] {
        assert!(seen.contains_key(kind), "no {kind} tensor: {seen:?}");
    }
    std::fs::remove_file(&path).ok();
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
