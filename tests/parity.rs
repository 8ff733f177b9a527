//! Logit parity with libllama (same GGUF, same ggml): for each built architecture's `tiny`
//! synth preset, our logits at every prompt position have cosine similarity >= 0.999 with
//! libllama's, and 32 greedy tokens (decoded one at a time through the KV cache) are identical.
mod common;
use common::{argmax, cosine};
use pocketmoe::engine::{Device, Engine, EngineOptions};
use pocketmoe::ggml::llama::{LlamaContext, LlamaModel};
use pocketmoe::ggml::GgmlType;
use pocketmoe::synth::{self, quantmix::QuantMix, SynthOptions};
use std::path::PathBuf;

const PROMPT: &str = "The quick brown fox jumps over the lazy dog. 12345 tokens of text!";

fn tiny(arch: &str) -> PathBuf {
    common::synth_tiny("parity", arch, QuantMix::Q8_0, 1.0, 11)
}

fn synth_preset(arch: &str, preset: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("pocketmoe-parity-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join(format!("{arch}-{preset}.gguf"));
    let opts = SynthOptions {
        arch: arch.into(),
        preset: preset.into(),
        quant: QuantMix::Q8_0,
        routing_skew: 1.0,
        seed: 11,
        out: out.clone(),
    };
    synth::synth(&opts, &|_, _| {}).unwrap();
    out
}

pub fn check_parity(arch: &str, device: Device) {
    check_parity_preset(arch, "tiny", device)
}

/// [`check_parity`] on another synth preset of `arch` (a variant of its tiny one).
pub fn check_parity_preset(arch: &str, preset: &str, device: Device) {
    check_parity_kv(arch, preset, device, GgmlType::F16)
}

/// [`check_parity_preset`] with a KV cache of type `kv` in both engines.
pub fn check_parity_kv(arch: &str, preset: &str, device: Device, kv: GgmlType) {
    if device != Device::Cpu {
        // Before libllama's first CUDA kernel: the switches are process-wide, and both engines
        // run under the same ones.
        pocketmoe::ggml::configure_cuda();
    }
    let path = synth_preset(arch, preset);
    let lm = LlamaModel::load_plain(&path, if device == Device::Cpu { 0 } else { -1 }).unwrap();
    let mut lctx = LlamaContext::new_with_kv(&lm, 256, 2, kv).unwrap();
    let prompt = lm.tokenize(PROMPT, false, false).unwrap();
    let opts = EngineOptions {
        device,
        n_ctx: 256,
        n_threads: 2,
        kv_type: kv,
        ..Default::default()
    };
    let mut eng = Engine::load(&path, opts, &|_, _| {}).unwrap();

    let theirs = lctx.logits_all(&prompt).unwrap();
    let ours = eng
        .forward(&prompt.iter().map(|&t| t as u32).collect::<Vec<_>>())
        .unwrap();
    assert_eq!(ours.len(), theirs.len());
    let mut min_cos = f64::INFINITY;
    for (pos, (o, t)) in ours.iter().zip(&theirs).enumerate() {
        let c = cosine(o, t);
        min_cos = min_cos.min(c);
        assert!(c >= 0.999, "{arch}: cosine {c:.6} at prompt position {pos}");
    }

    // Greedy continuation, one token at a time through both KV caches. Both engines are fed
    // libllama's greedy token (teacher forcing), so one near-tie cannot cascade; at each step our
    // argmax must equal libllama's unless libllama's own top-2 margin is within the measured
    // numerical difference (a true tie, where either answer is right). At most 2 such ties.
    let mut b = argmax(theirs.last().unwrap());
    let mut seq = vec![b];
    let mut ties = Vec::new();
    assert_eq!(
        argmax(ours.last().unwrap()),
        b,
        "{arch}: first generated token differs"
    );
    for (step, n_past) in (prompt.len()..prompt.len() + 31).enumerate() {
        let lo = eng.forward(&[b]).unwrap();
        let lt = lctx.eval(&[b as i32], n_past).unwrap();
        let (o, t) = (&lo[0], &lt[0]);
        let c = cosine(o, t);
        min_cos = min_cos.min(c);
        assert!(c >= 0.999, "{arch}: cosine {c:.6} at decode step {step}");
        let (a, b_next) = (argmax(o), argmax(t));
        if a != b_next {
            let max_diff = o
                .iter()
                .zip(t)
                .map(|(x, y)| (x - y).abs())
                .fold(0f32, f32::max);
            let margin = t[b_next as usize] - t[a as usize];
            assert!(
                margin <= 2.0 * max_diff,
                "{arch}: step {step}: we pick {a}, libllama {b_next} with margin {margin} > 2 x max |diff| {max_diff} (cosine {c:.6})"
            );
            ties.push((step, margin, max_diff));
        }
        b = b_next;
        seq.push(b);
    }
    assert!(
        ties.len() <= 2,
        "{arch}: {} near-ties in 32 steps: {ties:?}",
        ties.len()
    );
    if !ties.is_empty() {
        eprintln!("{arch}: near-ties (step, margin, max diff): {ties:?}");
    }
    eprintln!(
        "{arch} {preset} ({device:?}): min cosine {min_cos:.7} over {} prompt positions and 31 decode steps",
        prompt.len()
    );
    let seq_ours = seq;
    // The continuation is not degenerate (peaked, varied logits make argmax meaningful).
    let distinct: std::collections::HashSet<_> = seq_ours.iter().collect();
    assert!(
        distinct.len() > 3,
        "{arch}: degenerate continuation {seq_ours:?}"
    );
}

#[test]
fn qwen3moe_cpu_parity() {
    check_parity("qwen3moe", Device::Cpu);
}

/// A q8_0 KV cache: libllama stores K and V Hadamard-rotated; so do we.
#[test]
fn q8_0_kv_cache_cpu_parity() {
    for arch in ["qwen3moe", "gpt-oss"] {
        check_parity_kv(arch, "tiny", Device::Cpu, GgmlType::Q8_0);
    }
}

#[test]
fn mixtral_cpu_parity() {
    check_parity("llama", Device::Cpu);
}

#[test]
fn qwen2moe_cpu_parity() {
    check_parity("qwen2moe", Device::Cpu);
}

#[test]
fn gpt_oss_cpu_parity() {
    check_parity("gpt-oss", Device::Cpu);
}

#[test]
fn glm4moe_cpu_parity() {
    check_parity("glm4moe", Device::Cpu);
}

#[test]
fn minimax_m2_cpu_parity() {
    check_parity("minimax-m2", Device::Cpu);
}

#[test]
fn olmoe_cpu_parity() {
    check_parity("olmoe", Device::Cpu);
}

#[test]
fn deepseek2_cpu_parity() {
    check_parity("deepseek2", Device::Cpu);
}

/// DeepSeek files in the legacy layout (fused `attn_kv_b`): per-head K/V, ordinary MHA.
#[test]
fn deepseek2_legacy_kv_b_cpu_parity() {
    check_parity_preset("deepseek2", "tiny-kvb", Device::Cpu);
}

#[cfg(feature = "cuda")]
#[test]
fn cuda_parity_every_built_arch() {
    for arch in [
        "qwen3moe",
        "gpt-oss",
        "llama",
        "qwen2moe",
        "olmoe",
        "glm4moe",
        "minimax-m2",
        "deepseek2",
    ] {
        check_parity(arch, Device::Cuda(0));
    }
    check_parity_preset("deepseek2", "tiny-kvb", Device::Cuda(0));
}

#[cfg(feature = "cuda")]
#[test]
fn cuda_q8_0_kv_cache_parity() {
    for arch in ["qwen3moe", "gpt-oss"] {
        check_parity_kv(arch, "tiny", Device::Cuda(0), GgmlType::Q8_0);
    }
}

#[test]
fn context_limit_is_an_error() {
    let path = tiny("qwen3moe");
    let opts = EngineOptions {
        n_ctx: 8,
        n_threads: 2,
        ..Default::default()
    };
    let mut eng = Engine::load(&path, opts, &|_, _| {}).unwrap();
    eng.forward(&[1, 2, 3, 4, 5]).unwrap();
    let e = eng.forward(&[1, 2, 3, 4]).unwrap_err().to_string();
    assert!(
        e.contains("context full") && e.contains('9') && e.contains('8'),
        "{e}"
    );
    let e = eng.forward(&[100_000]).unwrap_err().to_string();
    assert!(e.contains("100000"), "{e}");
}

/// MLA (deepseek2) has no quantised cache yet: the load refuses it, naming the type and the way
/// out, before any weight is loaded.
#[test]
fn quantised_cache_with_mla_is_refused() {
    let path = tiny("deepseek2");
    let opts = EngineOptions {
        n_ctx: 64,
        n_threads: 2,
        kv_type: GgmlType::Q8_0,
        ..Default::default()
    };
    let e = match Engine::load(&path, opts, &|_, _| {}) {
        Ok(_) => panic!("a q8_0 cache was accepted for MLA"),
        Err(e) => e.to_string(),
    };
    assert!(e.contains("q8_0") && e.contains("use f16"), "{e}");
}
