//! Micro-benchmarks of the hot host-side paths (`cargo bench`; one group: `cargo bench -- cache`):
//! what the host does at every offloaded layer of a decode step, and what it does once per
//! request or per load.
//!
//! - `cache_step`: one decode token's expert-cache decisions over 48 layers (Qwen3-30B-A3B:
//!   128 experts, top-8, 37 slots per layer as at 12 GiB): look up the 8 selected experts,
//!   admit the misses by policy (LFRU, the default, and LRU), touch the used ones.
//! - `routing_readback`: one token's read-back parse over 48 layers: the selected ids checked
//!   and made distinct, and the FATE prediction turned into distinct top-8 experts
//!   (`experts::offload::predicted_experts`).
//! - `tokenizer_encode`: ~4 KB of English through a real vocabulary (Qwen2's, from the test
//!   fixtures when `scripts/fetch-fixtures.sh` has fetched them, else the tiny synthetic
//!   model's 151,936-token vocabulary).
//! - `gguf_open_split`: opening a 3-shard bundle of the tiny synthetic Qwen3-MoE (its real-size
//!   tokenizer arrays in the first shard, its tensors spread over the three).
//!
//! Inputs are made at start in `target/bench-inputs` (a tiny synthetic model, a few MB); routing
//! is a fixed pseudo-random skewed trace, so runs compare.
use criterion::{black_box, criterion_group, criterion_main, Criterion};
use pocketmoe::experts::cache::LayerCache;
use pocketmoe::experts::offload::predicted_experts;
use pocketmoe::experts::policy::PolicyKind;
use pocketmoe::gguf::{split_path, GgufModel, GgufWriter};
use pocketmoe::synth::quantmix::QuantMix;
use pocketmoe::tokenizer::Tokenizer;
use std::path::{Path, PathBuf};

const N_LAYER: usize = 48;
const N_EXPERT: usize = 128;
const K: usize = 8;
const N_SLOTS: usize = 37;

/// A small deterministic generator (xorshift64*): the same trace on every run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// In [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// `n_tokens` decode tokens' routing: per token and layer, `K` distinct experts drawn with a
/// popularity skew (expert `e` of a layer's permutation weighs `1 / (1 + rank)`).
fn trace(n_tokens: usize) -> Vec<Vec<Vec<u32>>> {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let weights: Vec<f64> = (0..N_EXPERT).map(|r| 1.0 / (1.0 + r as f64)).collect();
    let total: f64 = weights.iter().sum();
    (0..n_tokens)
        .map(|_| {
            (0..N_LAYER)
                .map(|il| {
                    let mut picks = Vec::with_capacity(K);
                    while picks.len() < K {
                        let mut x = rng.unit() * total;
                        let mut r = 0;
                        while x >= weights[r] && r + 1 < N_EXPERT {
                            x -= weights[r];
                            r += 1;
                        }
                        // Each layer ranks the experts differently.
                        let e = ((r * 37 + il * 11) % N_EXPERT) as u32;
                        if !picks.contains(&e) {
                            picks.push(e);
                        }
                    }
                    picks
                })
                .collect()
        })
        .collect()
}

/// What `experts::offload` (`slots`) does with one layer's selected experts in slot mode: hits
/// looked up, misses admitted (a used expert is never the victim), every used expert touched.
fn decide(cache: &mut LayerCache, used: &[u32], now: u64) -> usize {
    let mut misses = 0;
    for &e in used {
        if cache.slot(e).is_none() {
            misses += 1;
            cache.admit(e, &|r| used.contains(&r), now);
        }
    }
    for &e in used {
        cache.touch(e, now);
    }
    misses
}

fn cache_step(c: &mut Criterion) {
    let tokens = trace(1024);
    let mut g = c.benchmark_group("cache_step");
    for (name, policy) in [
        ("lfru", PolicyKind::default()),
        ("lru", PolicyKind::parse("lru").unwrap()),
    ] {
        let mut caches: Vec<LayerCache> = (0..N_LAYER)
            .map(|il| LayerCache::new(il, N_EXPERT, N_SLOTS, &policy))
            .collect();
        // Warm: the caches full, as in a long decode.
        for (t, layers) in tokens.iter().enumerate() {
            for (il, used) in layers.iter().enumerate() {
                decide(&mut caches[il], used, t as u64);
            }
        }
        let mut step = tokens.len() as u64;
        g.bench_function(format!("{name}, one token, {N_LAYER} layers"), |b| {
            b.iter(|| {
                let layers = &tokens[step as usize % tokens.len()];
                let mut misses = 0;
                for (il, used) in layers.iter().enumerate() {
                    misses += decide(&mut caches[il], used, step);
                }
                step += 1;
                black_box(misses)
            })
        });
    }
    g.finish();
}

fn routing_readback(c: &mut Criterion) {
    let tokens = trace(64);
    let mut rng = Rng(7);
    // Per layer: the selected ids as the graph writes them (i32), and predicted router logits.
    let ids: Vec<Vec<Vec<i32>>> = tokens
        .iter()
        .map(|t| {
            t.iter()
                .map(|l| l.iter().map(|&e| e as i32).collect())
                .collect()
        })
        .collect();
    let logits: Vec<Vec<f32>> = (0..N_LAYER)
        .map(|_| (0..N_EXPERT).map(|_| rng.unit() as f32 * 8.0).collect())
        .collect();
    let mut step = 0;
    c.bench_function(
        &format!("routing_readback/one token, {N_LAYER} layers (ids + FATE top-{K})"),
        |b| {
            b.iter(|| {
                let mut n = 0;
                for (il, layer_ids) in ids[step % ids.len()].iter().enumerate() {
                    // The ids: checked against n_expert, made distinct in order.
                    let mut used: Vec<u32> = Vec::with_capacity(K);
                    for &e in layer_ids {
                        let e = u32::try_from(e).ok().filter(|&e| e < N_EXPERT as u32);
                        let e = black_box(e).expect("valid id");
                        if !used.contains(&e) {
                            used.push(e);
                        }
                    }
                    n += used.len();
                    n += predicted_experts(black_box(&logits[il]), N_EXPERT, K).len();
                }
                step += 1;
                black_box(n)
            })
        },
    );
}

/// The tiny synthetic Qwen3-MoE, written once into `dir`.
fn tiny_model(dir: &Path) -> PathBuf {
    let out = dir.join("qwen3moe-tiny.gguf");
    if !out.exists() {
        let opts = pocketmoe::synth::SynthOptions {
            arch: "qwen3moe".into(),
            preset: "tiny".into(),
            quant: QuantMix::Q8_0,
            routing_skew: 1.0,
            seed: 1,
            out: out.clone(),
        };
        pocketmoe::synth::synth(&opts, &|_, _| {}).expect("synthesising the tiny model");
    }
    out
}

/// `target/bench-inputs`: the inputs are kept between runs (the model is written once).
fn bench_dir() -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/bench-inputs");
    std::fs::create_dir_all(&dir).expect("creating target/bench-inputs");
    dir
}

fn tokenizer_encode(c: &mut Criterion) {
    let fixture =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("target/fixtures/vocab/ggml-vocab-qwen2.gguf");
    let (what, path) = if fixture.exists() {
        ("qwen2 vocabulary", fixture)
    } else {
        ("synthetic vocabulary", tiny_model(&bench_dir()))
    };
    let model = GgufModel::open(&path).expect("opening the vocabulary");
    let tok = Tokenizer::from_gguf(&model).expect("loading the tokenizer");
    let para = "The quick brown fox jumps over the lazy dog, then checks its cache: 12 hits, \
                3 misses (80.0%). Mixture-of-Experts models route each token to a few experts; \
                the rest stay in host memory until a router asks for them again.\n";
    let text = para.repeat(4096 / para.len() + 1);
    c.bench_function(
        &format!("tokenizer_encode/{} bytes, {what}", text.len()),
        |b| b.iter(|| black_box(tok.encode(black_box(&text), false, false).len())),
    );
}

fn gguf_open_split(c: &mut Criterion) {
    let dir = bench_dir();
    let base = GgufModel::open(&tiny_model(&dir)).expect("opening the tiny model");
    let tensors: Vec<_> = base.tensors().cloned().collect();
    let prefix = dir.join("bundle");
    let n_shards = 3u32;
    let per = tensors.len().div_ceil(n_shards as usize);
    for shard in 0..n_shards {
        let mut w = GgufWriter::new();
        if shard == 0 {
            for (k, v) in base.metadata() {
                w.add_kv(k, v.clone());
            }
        }
        w.add_kv("split.no", pocketmoe::gguf::GgufValue::U16(shard as u16));
        w.add_kv(
            "split.count",
            pocketmoe::gguf::GgufValue::U16(n_shards as u16),
        );
        w.add_kv(
            "split.tensors.count",
            pocketmoe::gguf::GgufValue::I32(tensors.len() as i32),
        );
        let mine = &tensors[(shard as usize * per).min(tensors.len())
            ..((shard as usize + 1) * per).min(tensors.len())];
        for t in mine {
            w.add_tensor(&t.name, t.ty, t.shape())
                .expect("adding a tensor");
        }
        w.write(&split_path(&prefix, shard, n_shards), |i, buf| {
            buf.copy_from_slice(base.tensor_data(&mine[i]));
            Ok(())
        })
        .expect("writing a shard");
    }
    let first = split_path(&prefix, 0, n_shards);
    c.bench_function(
        &format!(
            "gguf_open_split/{n_shards} shards, {} tensors",
            tensors.len()
        ),
        |b| {
            b.iter(|| {
                let m = GgufModel::open(black_box(&first)).expect("opening the bundle");
                black_box(m.tensors().count())
            })
        },
    );
}

criterion_group!(
    benches,
    cache_step,
    routing_readback,
    tokenizer_encode,
    gguf_open_split
);
criterion_main!(benches);
