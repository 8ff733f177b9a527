//! Multi-sequence forward passes (`engine::batch`): several sequences decoded together over the
//! shared KV cache give the same logits as each sequence run alone, on the tiny synth models.
//!
//! "The same" means bit-identical logits, with `Engine::set_batch_invariant(true)`. By default
//! ggml's CPU backend picks kernels by batch shape: llamafile's sgemm from 2 columns (`vec_dot`
//! for 1), tiled flash attention from 64 query rows, KV-split flash attention for a single row
//! over 512+ cache rows. Each sums in another order, so the same token's logits differ in the
//! last bits depending on what shares its forward pass; the test prints that difference for the
//! default kernels and asserts exact equality with the reference kernels, covering all three
//! switches (92 prompt tokens in one pass; a lone sequence in the last slot).
mod common;
use common::argmax;
use pocketmoe::engine::batch::{BatchModel, SeqChunk};
use pocketmoe::engine::{Engine, EngineOptions};
use pocketmoe::synth::quantmix::QuantMix;
use std::path::PathBuf;

fn tiny(arch: &str) -> PathBuf {
    common::synth_tiny("batch", arch, QuantMix::Q8_0, 1.0, 5)
}

const SLOT: usize = 256;
const STEPS: usize = 8;

#[derive(Clone, Copy, PartialEq, Debug)]
enum Layout {
    /// Each prompt on its own, in slot 0.
    Alone,
    /// Each prompt on its own, in the last slot (a long, mostly masked cache: 512+ rows).
    AloneLastSlot,
    /// All prompts in one batch, prompt i in slot i.
    Together,
}

/// Greedy continuation of each prompt, returning the tokens and the logits of every step.
fn run(eng: &mut Engine, prompts: &[Vec<u32>], layout: Layout) -> Vec<(Vec<u32>, Vec<Vec<f32>>)> {
    let mut out: Vec<(Vec<u32>, Vec<Vec<f32>>)> = vec![(Vec::new(), Vec::new()); prompts.len()];
    let groups: Vec<Vec<usize>> = match layout {
        Layout::Together => vec![(0..prompts.len()).collect()],
        _ => (0..prompts.len()).map(|i| vec![i]).collect(),
    };
    let base = |i: usize| match layout {
        Layout::Alone => 0,
        Layout::AloneLastSlot => 3 * SLOT,
        Layout::Together => i * SLOT,
    };
    for g in groups {
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

/// Largest |difference| between the logits of two runs, and whether the tokens are the same.
fn compare(a: &[(Vec<u32>, Vec<Vec<f32>>)], b: &[(Vec<u32>, Vec<Vec<f32>>)]) -> (f32, bool) {
    let mut max_diff = 0f32;
    for (x, y) in a.iter().zip(b) {
        for (lx, ly) in x.1.iter().zip(&y.1) {
            for (p, q) in lx.iter().zip(ly) {
                max_diff = max_diff.max((p - q).abs());
            }
        }
    }
    (max_diff, a.iter().zip(b).all(|(x, y)| x.0 == y.0))
}

fn check(arch: &str) {
    let path = tiny(arch);
    let opts = EngineOptions {
        n_ctx: 4 * SLOT,
        n_threads: 2,
        ..Default::default()
    };
    let mut eng = Engine::load(&path, opts, &|_, _| {}).unwrap();
    // 5 + 17 + 29 + 41 = 92 prompt tokens together: past the 64-row tile of flash attention.
    let prompts: Vec<Vec<u32>> = (0..4u32)
        .map(|i| {
            (0..(5 + 12 * i))
                .map(|j| (j * 37 + i * 101) % 900)
                .collect()
        })
        .collect();
    // Default kernels: measured and reported, not asserted (they depend on the batch shape).
    let alone = run(&mut eng, &prompts, Layout::Alone);
    for layout in [Layout::Together, Layout::AloneLastSlot] {
        let (d, same) = compare(&alone, &run(&mut eng, &prompts, layout));
        eprintln!("{arch}: default CPU kernels, {layout:?} vs Alone: max |logit diff| {d:e}, same tokens: {same}");
    }
    assert!(
        eng.set_batch_invariant(true),
        "the CPU backend takes reference kernels"
    );
    let alone = run(&mut eng, &prompts, Layout::Alone);
    for layout in [Layout::Together, Layout::AloneLastSlot] {
        let (d, same) = compare(&alone, &run(&mut eng, &prompts, layout));
        eprintln!("{arch}: batch-invariant kernels, {layout:?} vs Alone: max |logit diff| {d:e}");
        assert!(same, "{arch}: {layout:?}: greedy tokens differ from Alone");
        assert_eq!(d, 0.0, "{arch}: {layout:?}: logits differ from Alone");
    }

    // The single-sequence path and the batch path share the scheduler and cache.
    eng.reset();
    let l = eng.forward_last(&prompts[0]).unwrap();
    assert_eq!(argmax(&l), alone[0].0[0]);
    let again = run(&mut eng, &prompts[..1], Layout::Alone);
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
