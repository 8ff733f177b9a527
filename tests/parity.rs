//! Logit parity with libllama (same GGUF, same ggml). For each built architecture's `tiny` synth
//! preset (Q8_0 weights), and for qwen3moe, gpt-oss and deepseek2 under the q4_k_m, mxfp4 and
//! iq2_xxs mixes, this runs the prompt through both engines, then greedy decoding one token at a
//! time through both KV caches, both engines fed libllama's greedy token at every step (teacher
//! forcing, so every step is compared on the same context), and asserts:
//! - on the CPU (both engines run the same ggml kernels on the same bits in the same order): at
//!   every prompt position and every step max |our logit - libllama's| <= [`CPU_MAX_DIFF`]
//!   (1e-5), and our greedy token equal to libllama's at every step (32 steps for Q8_0,
//!   [`QUANT_STEPS`] for the other mixes), no tie rule;
//! - on CUDA (kernel choice and fusion differ between the two graphs, see [`tie_eps`]): at every
//!   position and step cosine(ours, libllama's) >= a threshold (0.999 for Q8_0,
//!   [`QUANT_MIN_COS`] for the other mixes), and our argmax equal to libllama's except at most 2
//!   flips, each a true tie judged by the two tokens involved only;
//! - our greedy tokens are not degenerate (more than 3 distinct ones).
mod common;
use common::{argmax, cosine, max_abs_diff};
use pocketmoe::engine::{Device, Engine, EngineOptions};
use pocketmoe::ggml::llama::{LlamaContext, LlamaModel};
use pocketmoe::ggml::GgmlType;
use pocketmoe::synth::{self, quantmix::QuantMix, SynthOptions};
use std::path::PathBuf;

const PROMPT: &str = "The quick brown fox jumps over the lazy dog. 12345 tokens of text!";
/// A shorter prompt for the quantised-weight runs (CI time).
const SHORT_PROMPT: &str = "The quick brown fox jumps over the lazy dog.";

/// The CPU bound on max |our logit - libllama's|, at every prompt position and decode step. On
/// the CPU both engines run the same ggml kernels on the same bits in the same order: measured
/// max |dlogit| is exactly 0 on every run here (every built arch, every mix, both KV types;
/// docs/bench-h200.md "Parity on the new tree"). 1e-5 is a few f32 ulps at these logits'
/// magnitude: room for a reassociated sum in another ggml build, far below any real defect.
const CPU_MAX_DIFF: f32 = 1e-5;

/// CUDA only (the CPU allows no flip at all): a flip (our argmax != libllama's) is a tie only if
/// both engines' margins between the two tokens involved are below this. A flip needs the two
/// logits to move by at least the margin between them, i.e. margin <= 2 x max |dlogit|. On the
/// H200 max |dlogit| was 0 for 8 of the 10 built archs and 0.065-0.088 for deepseek2/deepseek32
/// (ggml-cuda fuses a node of libllama's MLA graph that it does not fuse in ours; bit-exact
/// with `GGML_CUDA_DISABLE_FUSION=1`; docs/bench-h200.md "Parity on the new tree"): 0.02 is a
/// quarter of that, so a flip passes only where the two tokens were within rounding of a tie.
fn tie_eps() -> f32 {
    0.02
}

/// CUDA cosine bound for the quantised mixes (the CPU is held to [`CPU_MAX_DIFF`]). The quantised
/// weights are the same bits in both engines, so the logits should agree as closely as with Q8_0,
/// whose H200 runs measured max |dlogit| 0 on 8 archs and cosine 0.99998 for deepseek2's MLA
/// fusion difference (docs/bench-h200.md); 0.9999 is tighter than the Q8_0 bound (0.999) yet
/// leaves room for that.
const QUANT_MIN_COS: f64 = 0.9999;

/// Greedy steps for the quantised mixes (CI time).
const QUANT_STEPS: usize = 12;
fn tiny(arch: &str) -> PathBuf {
    common::synth_tiny("parity", arch, QuantMix::Q8_0, 1.0, 11)
}

/// Synthesises `preset` of `arch` under `quant`; the name carries the mix and the KV type so
/// that tests running in parallel threads never write a file another one is reading.
fn synth_preset(arch: &str, preset: &str, quant: QuantMix, kv: GgmlType) -> PathBuf {
    let dir = common::process_dir("pocketmoe-parity");
    let out = dir.join(format!("{arch}-{preset}-{}-{kv:?}.gguf", quant.name()));
    let opts = SynthOptions {
        arch: arch.into(),
        preset: preset.into(),
        quant,
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
    let p = Parity {
        arch,
        preset,
        device,
        kv,
        meta: None,
        quant: QuantMix::Q8_0,
        prompt: PROMPT,
        n_gen: 32,
        min_cos: 0.999,
        repack: true,
    };
    p.check();
}

/// `arch`'s tiny preset under the weight mix `quant`; the file must hold every type in `types`
/// (so a fallback in the mix cannot silently take the quantisation under test away). On the
/// CPU both engines repack (their default).
pub fn check_parity_quant(arch: &str, quant: QuantMix, types: &[GgmlType], device: Device) {
    check_parity_quant_with(arch, "tiny", quant, types, device, true)
}

/// [`check_parity_quant`] on `preset`, both engines with repacked CPU weights (`repack`) or
/// plain ones.
pub fn check_parity_quant_with(
    arch: &str,
    preset: &str,
    quant: QuantMix,
    types: &[GgmlType],
    device: Device,
    repack: bool,
) {
    let p = Parity {
        arch,
        preset,
        device,
        kv: GgmlType::F16,
        meta: None,
        quant,
        prompt: SHORT_PROMPT,
        n_gen: QUANT_STEPS,
        min_cos: QUANT_MIN_COS,
        repack,
    };
    let path = synth_preset(arch, preset, quant, p.kv);
    let f = pocketmoe::gguf::GgufFile::open(&path).unwrap();
    let mut have: Vec<GgmlType> = f.tensors().iter().map(|t| t.ty).collect();
    have.sort_by_key(|t| format!("{t:?}"));
    have.dedup();
    for t in types {
        assert!(
            have.contains(t),
            "{arch} {}: no {t:?} tensor in the file (types {have:?})",
            quant.name()
        );
    }
    drop(f);
    p.check();
}

struct Parity<'a> {
    arch: &'a str,
    preset: &'a str,
    /// A metadata key (without the `{arch}.` prefix) set to a value in the synthesised file
    /// before both engines load it.
    meta: Option<(&'a str, pocketmoe::gguf::GgufValue)>,
    device: Device,
    kv: GgmlType,
    quant: QuantMix,
    prompt: &'a str,
    /// Greedy tokens compared (the first from the prompt's last position).
    n_gen: usize,
    /// The cosine bound on CUDA; the CPU is held to [`CPU_MAX_DIFF`] instead.
    min_cos: f64,
    /// Both engines with CPU weights repacked into the CPU's extra buffer types where its
    /// kernels take them (each engine's default; libllama with `use_extra_bufts`), or both with
    /// plain buffers. Only the CPU is affected.
    repack: bool,
}

impl Parity<'_> {
    fn check(&self) {
        let (arch, preset, device, kv) = (self.arch, self.preset, self.device, self.kv);
        let what = format!(
            "{arch} {preset} {} kv {kv:?} ({device:?})",
            self.quant.name()
        );
        if device != Device::Cpu {
            // Before libllama's first CUDA kernel: the switches are process-wide, and both
            // engines run under the same ones.
            pocketmoe::ggml::configure_cuda();
        }
        let mut path = synth_preset(arch, preset, self.quant, kv);
        if let Some((key, value)) = &self.meta {
            let out = path.with_extension(format!("{key}.gguf"));
            let key = format!("{arch}.{key}");
            common::write_with_key(
                &pocketmoe::gguf::GgufModel::open(&path).unwrap(),
                &key,
                value,
                &out,
            );
            path = out;
        }
        let repack = self.repack && device == Device::Cpu;
        let lm = if repack {
            LlamaModel::load(&path, 0)
        } else {
            LlamaModel::load_plain(&path, if device == Device::Cpu { 0 } else { -1 })
        }
        .unwrap();
        let mut lctx = LlamaContext::new_with_kv(&lm, 256, 2, kv).unwrap();
        let prompt = lm.tokenize(self.prompt, false, false).unwrap();
        let opts = EngineOptions {
            device,
            n_ctx: 256,
            n_threads: 2,
            kv_type: kv,
            repack,
            ..Default::default()
        };
        let mut eng = Engine::load(&path, opts, &|_, _| {}).unwrap();
        let (n_repacked, _) = eng.repacked();
        if repack && self.quant != QuantMix::Q8_0 && repacks_q4_k() {
            // Every non-Q8_0 mix here holds Q4_K or MXFP4 matrices, which this CPU repacks.
            assert!(n_repacked > 0, "{what}: nothing repacked");
        }
        if !repack {
            assert_eq!(n_repacked, 0, "{what}: repacked without being asked");
        }

        let theirs = lctx.logits_all(&prompt).unwrap();
        let ours = eng
            .forward(&prompt.iter().map(|&t| t as u32).collect::<Vec<_>>())
            .unwrap();
        assert_eq!(ours.len(), theirs.len());
        let cpu = device == Device::Cpu;
        let mut min_cos = f64::INFINITY;
        let mut max_diff = 0f32;
        // One position's (or step's) logits: on the CPU within CPU_MAX_DIFF of libllama's, on
        // CUDA within the cosine bound.
        let mut compare = |o: &[f32], t: &[f32], at: &str| {
            let (c, d) = (cosine(o, t), max_abs_diff(o, t));
            min_cos = min_cos.min(c);
            max_diff = max_diff.max(d);
            if cpu {
                // This is also what holds the two engines to the same buffer-type choice per
                // weight: one Q4_K matrix repacked in one engine and plain in the other moves
                // the logits by up to 0.12 (tiny q4_k_m), which a cosine bound does not always
                // catch.
                assert!(
                    d <= CPU_MAX_DIFF,
                    "{what}: max |dlogit| {d:e} > {CPU_MAX_DIFF:e} at {at} (cosine {c:.7})"
                );
            } else {
                assert!(
                    c >= self.min_cos,
                    "{what}: cosine {c:.6} < {} at {at} (max |dlogit| {d})",
                    self.min_cos
                );
            }
        };
        for (pos, (o, t)) in ours.iter().zip(&theirs).enumerate() {
            compare(o, t, &format!("prompt position {pos}"));
        }

        // Greedy continuation, one token at a time through both KV caches, both engines fed
        // libllama's token (teacher forcing): on CUDA our sequence would diverge legitimately
        // after an allowed flip, and feeding both the same token keeps every later step
        // comparable. On the CPU no flip is allowed, so this is plain greedy decoding in both.
        let mut o = ours.last().unwrap().clone();
        let mut t = theirs.last().unwrap().clone();
        let mut seq_ours = Vec::new();
        let mut seq_theirs = Vec::new();
        let mut ties = Vec::new();
        for step in 0..self.n_gen {
            if step > 0 {
                let b = argmax(&t); // libllama's previous greedy token
                let n_past = prompt.len() + step - 1;
                o = eng.forward(&[b]).unwrap().swap_remove(0);
                t = lctx.eval(&[b as i32], n_past).unwrap().swap_remove(0);
                compare(&o, &t, &format!("decode step {step}"));
            }
            let (a, b) = (argmax(&o), argmax(&t));
            seq_ours.push(a);
            seq_theirs.push(b);
            if a == b || cpu {
                continue;
            }
            // A flip on CUDA: judged by the two tokens involved only.
            let eps = tie_eps();
            let margin_theirs = t[b as usize] - t[a as usize];
            let margin_ours = o[a as usize] - o[b as usize];
            assert!(
                margin_theirs < eps && margin_ours < eps,
                "{what}: step {step}: we pick {a}, libllama {b}: not a tie (libllama's margin \
                 {margin_theirs}, ours {margin_ours}, tie epsilon {eps})"
            );
            ties.push((step, margin_theirs, margin_ours));
        }
        if cpu {
            assert_eq!(
                seq_ours, seq_theirs,
                "{what}: greedy tokens differ from libllama's"
            );
        }
        assert!(
            ties.len() <= 2,
            "{what}: {} ties in {} steps: {ties:?}",
            ties.len(),
            self.n_gen
        );
        eprintln!(
            "{what}: min cosine {min_cos:.7}, max |dlogit| {max_diff:e} over {} prompt positions \
             and {} greedy steps; ties (step, libllama margin, ours) {ties:?}; {n_repacked} \
             matrices repacked (libllama {})",
            prompt.len(),
            self.n_gen,
            if repack { "too" } else { "plain" }
        );
        // Our continuation is not degenerate (peaked, varied logits make argmax meaningful).
        let distinct: std::collections::HashSet<_> = seq_ours.iter().collect();
        assert!(
            distinct.len() > 3,
            "{what}: degenerate continuation (ours) {seq_ours:?}"
        );
    }
}

/// Whether ggml-cpu repacks Q4_K (and MXFP4) matrices on this CPU: AVX2 on x86 (ARM needs
/// i8mm or dotprod, not asserted here).
fn repacks_q4_k() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx2")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Every architecture with a graph (`pocketmoe::arch::built`).
#[test]
fn cpu_parity_every_built_arch() {
    for arch in pocketmoe::arch::built() {
        check_parity(arch.spec.name, Device::Cpu);
    }
}

/// Sqrt-softplus gating (`expert_gating_func = 4`, DeepSeek-V4's scoring) on the built
/// architectures whose router reads the key, against libllama, which computes
/// `sqrt(softplus(logits))` for it: the router's probabilities, hence the experts' weights and
/// selection, differ from every other gating. On the CPU the logits come out bitwise equal
/// (measured: max |dlogit| 0) and are held to [`CPU_MAX_DIFF`]: the tiny models' MoE share is
/// small, and plain softplus in place of its square root measured cosine 0.99897 at the first
/// position, which a cosine bound of 0.999 would only just catch.
#[test]
fn sqrt_softplus_gating_cpu_parity() {
    check_sqrt_softplus(Device::Cpu);
}

/// [`sqrt_softplus_gating_cpu_parity`] on the GPU: there the two engines' logits are not
/// bitwise equal (kernel choice and fusion differ: deepseek2 measured max |dlogit| 0.065), so
/// the bound is the cosine every CUDA parity test uses.
#[cfg(feature = "cuda-api")]
#[test]
fn cuda_sqrt_softplus_gating_parity() {
    check_sqrt_softplus(Device::Cuda(0));
}

fn check_sqrt_softplus(device: Device) {
    for arch in ["deepseek2", "glm4moe", "minimax-m2"] {
        Parity {
            arch,
            preset: "tiny",
            meta: Some(("expert_gating_func", pocketmoe::gguf::GgufValue::U32(4))),
            device,
            kv: GgmlType::F16,
            quant: QuantMix::Q8_0,
            prompt: PROMPT,
            n_gen: 32,
            min_cos: 0.999,
            repack: true,
        }
        .check();
    }
}

/// A q8_0 KV cache: libllama stores K and V Hadamard-rotated; so do we.
#[test]
fn q8_0_kv_cache_cpu_parity() {
    for arch in ["qwen3moe", "gpt-oss"] {
        check_parity_kv(arch, "tiny", Device::Cpu, GgmlType::Q8_0);
    }
}

/// DeepSeek files in the legacy layout (fused `attn_kv_b`): per-head K/V, ordinary MHA.
#[test]
fn deepseek2_legacy_kv_b_cpu_parity() {
    check_parity_preset("deepseek2", "tiny-kvb", Device::Cpu);
}

/// The architectures the quantised-weight parity runs on: a softmax-routed GQA model, gpt-oss
/// (sinks, biases, SWA, its own MXFP4 experts) and MLA with a dense lead layer.
const QUANT_ARCHS: [&str; 3] = ["qwen3moe", "gpt-oss", "deepseek2"];

/// q4_k_m: Q4_K, Q6_K for `output` and for `attn_v`/`ffn_down*` on the "more bits" layers. (The
/// synth mix has no Q5_K: llama.cpp's q4_k_m uses Q5_K only for tensors these archs lack.)
#[test]
fn q4_k_m_cpu_parity() {
    for arch in QUANT_ARCHS {
        check_parity_quant(
            arch,
            QuantMix::Q4KM,
            &[GgmlType::Q4_K, GgmlType::Q6_K],
            Device::Cpu,
        );
    }
}

/// q4_k_m with both engines' CPU weights in plain buffers (`--no-repack`, libllama without
/// extra buffer types): the kernels PocketMoE ran before repacking, still bit-exact.
#[test]
fn q4_k_m_plain_cpu_parity() {
    for arch in QUANT_ARCHS {
        check_parity_quant_with(
            arch,
            "tiny",
            QuantMix::Q4KM,
            &[GgmlType::Q4_K, GgmlType::Q6_K],
            Device::Cpu,
            false,
        );
    }
}

/// q4_k_m, repacked, on every other built architecture: the Q8_0 tiny runs repack nothing on
/// x86 (ggml-cpu repacks Q8_0 on ARM only), so this is where each architecture's choice of
/// what to repack (not the embedding, not a matrix sliced by views, ...) meets libllama's.
/// The standard prompt, not the short one: on the short one olmoe's tiny q4_k_m model loops
/// over 3 tokens (bit-exactly as libllama does), too few for the degeneracy check.
#[test]
fn q4_k_m_repack_cpu_parity_every_built_arch() {
    let run = |arch, preset| {
        Parity {
            arch,
            preset,
            meta: None,
            device: Device::Cpu,
            kv: GgmlType::F16,
            quant: QuantMix::Q4KM,
            prompt: PROMPT,
            n_gen: QUANT_STEPS,
            min_cos: QUANT_MIN_COS,
            repack: true,
        }
        .check()
    };
    for arch in pocketmoe::arch::built() {
        if !QUANT_ARCHS.contains(&arch.spec.name) {
            run(arch.spec.name, "tiny");
        }
    }
    run("deepseek2", "tiny-kvb");
}

/// mxfp4: MXFP4 routed experts, Q8_0 elsewhere.
#[test]
fn mxfp4_cpu_parity() {
    for arch in QUANT_ARCHS {
        check_parity_quant(arch, QuantMix::MXFP4, &[GgmlType::MXFP4], Device::Cpu);
    }
}

/// iq2_xxs: IQ2_XXS routed experts, Q4_K elsewhere, Q6_K output.
#[test]
fn iq2_xxs_cpu_parity() {
    for arch in QUANT_ARCHS {
        check_parity_quant(
            arch,
            QuantMix::IQ2XXS,
            &[GgmlType::IQ2_XXS, GgmlType::Q4_K, GgmlType::Q6_K],
            Device::Cpu,
        );
    }
}

#[cfg(feature = "cuda-api")]
#[test]
fn cuda_parity_every_built_arch() {
    for arch in pocketmoe::arch::built() {
        check_parity(arch.spec.name, Device::Cuda(0));
    }
    check_parity_preset("deepseek2", "tiny-kvb", Device::Cuda(0));
}

/// The quantisations users run, on the GPU: the same three mixes as the CPU tests above, each
/// architecture of [`QUANT_ARCHS`], within the CUDA tolerance of [`check_parity`].
#[cfg(feature = "cuda-api")]
#[test]
fn cuda_quantised_parity() {
    let mixes: [(QuantMix, &[GgmlType]); 3] = [
        (QuantMix::Q4KM, &[GgmlType::Q4_K, GgmlType::Q6_K]),
        (QuantMix::MXFP4, &[GgmlType::MXFP4]),
        (
            QuantMix::IQ2XXS,
            &[GgmlType::IQ2_XXS, GgmlType::Q4_K, GgmlType::Q6_K],
        ),
    ];
    for (mix, types) in mixes {
        for arch in QUANT_ARCHS {
            check_parity_quant(arch, mix, types, Device::Cuda(0));
        }
    }
}

#[cfg(feature = "cuda-api")]
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

/// A prompt of about 180 tokens of the tiny vocabulary (the parity contexts hold 256 positions,
/// and libllama takes the prompt as one batch of at most 256): far more positions than
/// deepseek32's tiny indexer top-k (8), so most of each token's context is masked.
const LONG_PROMPT: &str =
    "In the beginning the river was only a thin line of silver across the plain, \
    and the people who lived beside it counted its bends: seven before the hills, eleven after. \
    Every spring the snow melted and 42 old stones by the ford disappeared.";

/// DeepSeek-V3.2 (MLA + the lightning indexer's top-k sparse attention) on the standard prompt,
/// longer than the tiny preset's top-k of 8: from the ninth position on, each token attends to
/// 8 of its earlier positions only.
#[test]
fn deepseek32_cpu_parity() {
    check_parity("deepseek32", Device::Cpu);
}

/// deepseek32 over a long prompt (~180 tokens, then 32 greedy steps through both caches): the
/// indexer keys cached across the whole context, and most positions dropped by the selection.
#[test]
fn deepseek32_long_prompt_cpu_parity() {
    Parity {
        arch: "deepseek32",
        preset: "tiny",
        meta: None,
        device: Device::Cpu,
        kv: GgmlType::F16,
        quant: QuantMix::Q8_0,
        prompt: LONG_PROMPT,
        n_gen: 32,
        min_cos: 0.999,
        repack: true,
    }
    .check();
}

/// deepseek32 with the file's `attention.indexer.top_k` set to 2: nearly every position dropped.
#[test]
fn deepseek32_top_k_2_cpu_parity() {
    Parity {
        arch: "deepseek32",
        preset: "tiny",
        meta: Some((
            "attention.indexer.top_k",
            pocketmoe::gguf::GgufValue::U32(2),
        )),
        device: Device::Cpu,
        kv: GgmlType::F16,
        quant: QuantMix::Q8_0,
        prompt: LONG_PROMPT,
        n_gen: 16,
        min_cos: 0.999,
        repack: true,
    }
    .check();
}
