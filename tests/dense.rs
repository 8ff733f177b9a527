//! Dense (non-MoE) `llama` GGUFs run: a file without `llama.expert_count` is plain Llama, every
//! block a dense SwiGLU FFN, all of it resident.
//! - `dense_llama_logits_equal_libllama`: a synthetic dense llama (the tiny Mixtral synth with
//!   its expert keys dropped and each block's router and experts replaced by a dense FFN of
//!   expert 0's bytes) gives libllama's logits bit for bit on the CPU, over the prompt and 12
//!   greedy steps through both KV caches (the parity standard of tests/parity.rs: both engines
//!   run the same ggml kernels on the same bits, so the bound is 0).
//! - `dense_embeddings_equal_libllama`: its embeddings (pooling last) too.
//! - `moe_arch_without_experts_is_refused`: an architecture with no dense form (qwen3moe)
//!   without `expert_count` still gets the one-line "a dense model" refusal.
mod common;
use common::{argmax, max_abs_diff};
use pocketmoe::engine::embed::{Pooler, Pooling};
use pocketmoe::ggml::llama::{LlamaContext, LlamaModel};
use pocketmoe::gguf::{GgufModel, GgufWriter, Metadata};
use pocketmoe::synth::quantmix::QuantMix;
use std::path::PathBuf;

const PROMPT: &str = "The quick brown fox jumps over the lazy dog. 12345 tokens of text!";

/// The tiny llama (Mixtral) synth made dense: no `expert_*` keys, and per block
/// `ffn_{gate,up,down}.weight` = expert 0's slice of `ffn_{gate,up,down}_exps.weight` (the first
/// 1/n_expert of its bytes) instead of the router and the experts. Made once per process: the
/// tests run in parallel threads, and one rewriting the file another has mapped is a SIGBUS
/// (CI, 2026-12-03).
fn dense_tiny() -> PathBuf {
    static PATH: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    PATH.get_or_init(make_dense_tiny).clone()
}

fn make_dense_tiny() -> PathBuf {
    let moe = common::synth_tiny("dense", "llama", QuantMix::Q8_0, 1.0, 11);
    let out = moe.with_file_name("llama-dense.gguf");
    let base = GgufModel::open(&moe).unwrap();
    let n_expert = base.get_u64("llama.expert_count").unwrap();
    let mut w = GgufWriter::new();
    for (k, v) in base.metadata() {
        if !k.starts_with("llama.expert_") {
            w.add_kv(k, v.clone());
        }
    }
    // (name in the new file, source tensor, bytes of it)
    let mut plan = Vec::new();
    for t in base.tensors() {
        if t.name.contains("ffn_gate_inp") {
            continue;
        }
        if let Some(stem) = t.name.strip_suffix("_exps.weight") {
            let shape = &t.shape()[..2];
            let name = format!("{stem}.weight");
            w.add_tensor(&name, t.ty, shape).unwrap();
            plan.push((t.clone(), t.n_bytes / n_expert));
        } else {
            w.add_tensor(&t.name, t.ty, t.shape()).unwrap();
            plan.push((t.clone(), t.n_bytes));
        }
    }
    assert!(
        plan.iter().any(|(t, _)| t.name.contains("ffn_gate_exps")),
        "the synth has gate experts to make the dense gate of"
    );
    w.write(&out, |i, buf| {
        let (t, n) = &plan[i];
        buf.copy_from_slice(&base.tensor_data(t)[..*n as usize]);
        Ok(())
    })
    .unwrap();
    out
}

#[test]
fn dense_llama_logits_equal_libllama() {
    let path = dense_tiny();
    let f = GgufModel::open(&path).unwrap();
    assert!(!f.has("llama.expert_count") && f.tensors().all(|t| !t.name.contains("exps")));
    drop(f);
    let lm = LlamaModel::load(&path, 0).unwrap();
    let mut lctx = LlamaContext::new(&lm, 256, 2).unwrap();
    let prompt = lm.tokenize(PROMPT, false, false).unwrap();
    let ids: Vec<u32> = prompt.iter().map(|&t| t as u32).collect();
    let mut eng = common::cpu_engine(&path, 256);
    assert_eq!(eng.hp.n_expert, 0);
    assert!(eng.expert_slots().is_none(), "nothing to offload");
    let theirs = lctx.logits_all(&prompt).unwrap();
    let ours = eng.forward(&ids).unwrap();
    assert_eq!(ours.len(), theirs.len());
    let mut max_diff = 0f32;
    for (o, t) in ours.iter().zip(&theirs) {
        max_diff = max_diff.max(max_abs_diff(o, t));
    }
    // Greedy steps, both fed libllama's token.
    let mut t = theirs.last().unwrap().clone();
    let mut picks = Vec::new();
    for step in 0..12 {
        let b = argmax(&t);
        picks.push(b);
        let o = eng.forward(&[b]).unwrap().swap_remove(0);
        t = lctx
            .eval(&[b as i32], prompt.len() + step)
            .unwrap()
            .swap_remove(0);
        max_diff = max_diff.max(max_abs_diff(&o, &t));
    }
    eprintln!(
        "dense llama: max |dlogit| {max_diff} over {} positions + 12 steps; greedy {picks:?}",
        ids.len()
    );
    assert_eq!(max_diff, 0.0, "dense llama logits not bit-exact on the CPU");
    let distinct: std::collections::HashSet<_> = picks.iter().collect();
    assert!(distinct.len() > 3, "degenerate continuation {picks:?}");
}

#[test]
fn dense_embeddings_equal_libllama() {
    let path = dense_tiny();
    let lm = LlamaModel::load(&path, 0).unwrap();
    let prompt = lm.tokenize(PROMPT, true, false).unwrap();
    let mut ctx = LlamaContext::new_embeddings(&lm, 256, 2, 3).unwrap();
    let theirs = ctx.embeddings(&prompt).unwrap();
    let mut eng = common::cpu_engine(&path, 256);
    let ids: Vec<u32> = prompt.iter().map(|&t| t as u32).collect();
    let mut p = Pooler::new(Pooling::Last);
    p.push(eng.forward_embd(&ids).unwrap());
    assert_eq!(p.finish(), theirs);
}

#[test]
fn moe_arch_without_experts_is_refused() {
    let moe = common::synth_tiny("dense", "qwen3moe", QuantMix::Q8_0, 1.0, 11);
    let out = moe.with_file_name("qwen3moe-no-experts.gguf");
    let base = GgufModel::open(&moe).unwrap();
    let mut w = GgufWriter::new();
    for (k, v) in base.metadata() {
        if k != "qwen3moe.expert_count" {
            w.add_kv(k, v.clone());
        }
    }
    let tensors: Vec<_> = base.tensors().cloned().collect();
    for t in &tensors {
        w.add_tensor(&t.name, t.ty, t.shape()).unwrap();
    }
    w.write(&out, |i, buf| {
        buf.copy_from_slice(base.tensor_data(&tensors[i]));
        Ok(())
    })
    .unwrap();
    let err = pocketmoe::engine::Engine::load(
        &out,
        pocketmoe::engine::EngineOptions {
            n_ctx: 64,
            ..Default::default()
        },
        &|_, _| {},
    )
    .err()
    .expect("refused")
    .to_string();
    assert!(
        err.contains("no qwen3moe.expert_count: a dense model") && !err.contains('\n'),
        "{err}"
    );
}
