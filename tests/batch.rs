//! Multi-sequence forward passes (`engine::batch`): several sequences decoded together over the
//! shared KV cache give the same logits as each sequence run alone, on the tiny synth models.
//!
//! "The same" means bit-identical logits. That is not automatic: ggml's CPU backend multiplies a
//! 1-column batch with `vec_dot` but 2+ columns with llamafile's tinyBLAS (`n < 2` falls back),
//! and flash attention walks a longer, mostly masked cache when other sequences share it. For the
//! Q8_0 tiny models both kernels sum each dot product in the same order and masked cache rows are
//! skipped, so the results agree bit for bit; this test guards that (a kernel change that breaks
//! it shows up here first, with the size of the difference).
use pocketmoe::engine::batch::{BatchModel, SeqChunk};
use pocketmoe::engine::{Engine, EngineOptions};
use pocketmoe::synth::{self, quantmix::QuantMix, SynthOptions};
use std::path::PathBuf;

fn tiny(arch: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("pocketmoe-batch-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join(format!("{arch}.gguf"));
    let opts = SynthOptions {
        arch: arch.into(),
        preset: "tiny".into(),
        quant: QuantMix::Q8_0,
        routing_skew: 1.0,
        seed: 5,
        out: out.clone(),
    };
    synth::synth(&opts, &|_, _| {}).unwrap();
    out
}

fn argmax(v: &[f32]) -> u32 {
    pocketmoe::engine::sampling::argmax(v)
}

const SLOT: usize = 256;
const STEPS: usize = 12;

/// Greedy continuation of each prompt, alone (slot 0) and all together (slot i), returning the
/// tokens and the last-step logits per prompt.
fn run(eng: &mut Engine, prompts: &[Vec<u32>], together: bool) -> Vec<(Vec<u32>, Vec<Vec<f32>>)> {
    let mut out: Vec<(Vec<u32>, Vec<Vec<f32>>)> = vec![(Vec::new(), Vec::new()); prompts.len()];
    let groups: Vec<Vec<usize>> = if together {
        vec![(0..prompts.len()).collect()]
    } else {
        (0..prompts.len()).map(|i| vec![i]).collect()
    };
    for g in groups {
        let base = |i: usize| if together { i * SLOT } else { 0 };
        let chunks: Vec<SeqChunk> = g
            .iter()
            .map(|&i| SeqChunk {
                kv_base: base(i),
                pos: 0,
                tokens: &prompts[i],
                logits: true,
            })
            .collect();
        let mut logits = eng.forward_batch(&chunks).unwrap();
        for _ in 0..STEPS {
            let next: Vec<u32> = logits.iter().map(|l| argmax(l)).collect();
            for (k, &i) in g.iter().enumerate() {
                out[i].0.push(next[k]);
                out[i].1.push(logits[k].clone());
            }
            let chunks: Vec<SeqChunk> = g
                .iter()
                .enumerate()
                .map(|(k, &i)| SeqChunk {
                    kv_base: base(i),
                    pos: prompts[i].len() + out[i].0.len() - 1,
                    tokens: std::slice::from_ref(&next[k]),
                    logits: true,
                })
                .collect();
            logits = eng.forward_batch(&chunks).unwrap();
        }
    }
    out
}

fn check(arch: &str) {
    let path = tiny(arch);
    let opts = EngineOptions {
        n_ctx: 4 * SLOT,
        n_threads: 2,
        ..Default::default()
    };
    let mut eng = Engine::load(&path, opts, &|_, _| {}).unwrap();
    let prompts: Vec<Vec<u32>> = (0..4u32)
        .map(|i| (0..(5 + 7 * i)).map(|j| (j * 37 + i * 101) % 900).collect())
        .collect();
    let alone = run(&mut eng, &prompts, false);
    let together = run(&mut eng, &prompts, true);
    let mut max_diff = 0f32;
    for (i, (a, t)) in alone.iter().zip(&together).enumerate() {
        assert_eq!(a.0, t.0, "{arch}: prompt {i}: greedy tokens differ");
        for (la, lt) in a.1.iter().zip(&t.1) {
            for (x, y) in la.iter().zip(lt) {
                max_diff = max_diff.max((x - y).abs());
            }
        }
    }
    eprintln!("{arch}: max |logit difference| batched vs alone: {max_diff:e}");
    assert_eq!(
        max_diff, 0.0,
        "{arch}: batched logits differ from single ones"
    );

    // The single-sequence path and the batch path share the scheduler and cache.
    eng.reset();
    let l = eng.forward_last(&prompts[0]).unwrap();
    assert_eq!(argmax(&l), alone[0].0[0]);
    let again = run(&mut eng, &prompts[..1], false);
    assert_eq!(again[0].0, alone[0].0);

    // Errors are values: rows past the cache, ids past the vocabulary.
    let bad = [SeqChunk {
        kv_base: 4 * SLOT - 2,
        pos: 0,
        tokens: &[1, 2, 3],
        logits: true,
    }];
    assert!(eng.forward_batch(&bad).is_err());
    let bad = [SeqChunk {
        kv_base: 0,
        pos: 0,
        tokens: &[u32::MAX],
        logits: true,
    }];
    assert!(eng.forward_batch(&bad).is_err());
    drop(eng);
    let _ = std::fs::remove_file(&path);
}

#[test]
fn batched_equals_single_qwen3moe() {
    check("qwen3moe");
}

#[test]
fn batched_equals_single_gpt_oss() {
    check("gpt-oss");
}
