//! The default synthetic routing is calibrated to real Qwen3-30B-A3B decode routing (see
//! `synth::routing`): measured here through the real engine, with fresh random tokens at every
//! decode step (so any locality comes from the model, not from repeated tokens).
mod common;
use pocketmoe::ggml::capture::Capture;
use pocketmoe::synth::routing::DEFAULT_SKEW;
use pocketmoe::util::top_k;

/// Per-layer LRU hit rate of the routing in `picks[layer][step]`, per layer.
fn lru_hit_rates(picks: &[Vec<Vec<usize>>], n_expert: usize, capacity: usize) -> Vec<f64> {
    picks
        .iter()
        .map(|layer| {
            let (mut hits, mut total) = (0u64, 0u64);
            let mut last_use = vec![None::<usize>; n_expert];
            let mut cached = 0;
            for (t, sel) in layer.iter().enumerate() {
                for &e in sel {
                    total += 1;
                    if last_use[e].is_some() {
                        hits += 1;
                    } else if cached >= capacity {
                        let victim = (0..n_expert)
                            .filter(|&x| last_use[x].is_some())
                            .min_by_key(|&x| last_use[x])
                            .unwrap();
                        last_use[victim] = None;
                    } else {
                        cached += 1;
                    }
                    last_use[e] = Some(t);
                }
            }
            hits as f64 / total as f64
        })
        .collect()
}

struct Routing {
    n_expert: usize,
    /// Decode: `[layer][step]` top-k experts.
    decode: Vec<Vec<Vec<usize>>>,
    /// Prefill of a long prompt: experts each layer touched.
    touched: Vec<usize>,
}

fn measure(skew: f32, seed: u64, n_decode: usize, n_long: usize) -> Routing {
    let path = common::synth_preset(
        "routing",
        "qwen3moe",
        "routing-tiny",
        pocketmoe::synth::quantmix::QuantMix::Q4KM,
        skew,
        seed,
    );
    let mut eng = common::cpu_engine(&path, n_long.max(n_decode + 64));
    let (n_layer, n_expert, k) = (
        eng.hp.n_layer,
        eng.hp.n_expert as usize,
        eng.hp.n_expert_used as usize,
    );
    let names: Vec<String> = (0..n_layer)
        .map(|il| format!("ffn_moe_probs-{il}"))
        .collect();
    let mut cap = Capture::new(names.clone());
    let mut rng = pocketmoe::util::Rng::new(seed ^ 5);
    let n_vocab = eng.hp.n_vocab;
    let mut tok = || (rng.next_u64() % n_vocab) as u32;
    // Decode after a short random prompt, one fresh random token per step.
    let prompt: Vec<u32> = (0..32).map(|_| tok()).collect();
    eng.forward_last(&prompt).unwrap();
    let decode = common::decode_routing(&mut eng, n_decode, &mut tok);
    // A long random prompt, prefilled in chunks: which experts does each layer use?
    eng.reset();
    eng.set_capture(Some(&mut cap)).unwrap();
    let mut used = vec![vec![false; n_expert]; n_layer];
    let long: Vec<u32> = (0..n_long).map(|_| tok()).collect();
    for chunk in long.chunks(256) {
        eng.forward_last(chunk).unwrap();
        for (il, name) in names.iter().enumerate() {
            for probs in cap.got[name].chunks_exact(n_expert) {
                for e in top_k(probs, k) {
                    used[il][e] = true;
                }
            }
        }
        cap.got.clear();
    }
    eng.set_capture(None).unwrap();
    let _ = std::fs::remove_file(&path);
    Routing {
        n_expert,
        decode,
        touched: used
            .iter()
            .map(|u| u.iter().filter(|&&b| b).count())
            .collect(),
    }
}

/// LRU hit rates (mean over layers) at 15%, 30%, 50% of a layer's experts, and the per-layer spread.
fn curve(r: &Routing) -> Vec<(f64, f64, f64)> {
    [0.15, 0.30, 0.50]
        .iter()
        .map(|&f| {
            let cap = (f * r.n_expert as f64).round() as usize;
            let per = lru_hit_rates(&r.decode, r.n_expert, cap);
            let mean = per.iter().sum::<f64>() / per.len() as f64;
            let lo = per.iter().cloned().fold(1.0, f64::min);
            let hi = per.iter().cloned().fold(0.0, f64::max);
            (mean, lo, hi)
        })
        .collect()
}

/// Real Qwen3-30B-A3B decode routing (third-party figures, see `synth::routing`): per-layer LRU
/// over 15% / 30% / 50% of a layer's experts hits about 74% / 89% / 96% (kekzl/imp#1374).
const QWEN3_LRU: [f64; 3] = [0.74, 0.89, 0.96];

#[test]
fn default_routing_reproduces_qwen3_lru_curve() {
    let seed: u64 = std::env::var("PMOE_ROUTING_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(11);
    // 400 decode steps x 8 layers x 8 experts: the mean hit rate over layers is known to well
    // under a point; a 4096-token prefill as in the issue (real models use nearly every expert
    // within ~1.3k tokens, llama.cpp#28545).
    let r = measure(DEFAULT_SKEW, seed, 400, 4096);
    let c = curve(&r);
    eprintln!(
        "default skew {DEFAULT_SKEW}: LRU 15/30/50% -> {:.3}/{:.3}/{:.3} (per-layer {:?}); \
         experts touched in 4096 tokens {:?} of {}",
        c[0].0,
        c[1].0,
        c[2].0,
        c.iter()
            .map(|x| format!("{:.2}-{:.2}", x.1, x.2))
            .collect::<Vec<_>>(),
        r.touched,
        r.n_expert
    );
    // ±5 points on the mean over layers: the tolerance, and about the precision of the
    // public figures themselves ("about", one model, one workload); per layer ±10, because the
    // layers of a random model spread by a few points around their mean.
    for ((&(mean, lo, hi), want), frac) in c.iter().zip(QWEN3_LRU).zip(["15%", "30%", "50%"]) {
        assert!(
            (mean - want).abs() <= 0.05,
            "LRU at {frac}: {mean:.3}, want {want} ± 0.05"
        );
        assert!(
            lo >= want - 0.10 && hi <= want + 0.10,
            "LRU at {frac}: layers {lo:.3}..{hi:.3}, want {want} ± 0.10"
        );
    }
    // Nearly every expert of each layer is used in a long prompt: >= 95% (a cache simulation
    // of a synthetic model that never touches a fifth of its experts would be kinder than real).
    let min = (0.95 * r.n_expert as f64).ceil() as usize;
    assert!(
        r.touched.iter().all(|&t| t >= min),
        "experts touched per layer in 4096 tokens: {:?}, want >= {min}",
        r.touched
    );
}

#[test]
fn skew_zero_stays_the_hard_case() {
    let r = measure(0.0, 12, 200, 1024);
    let c = curve(&r);
    eprintln!(
        "skew 0: LRU 15/30/50% -> {:.3}/{:.3}/{:.3}; touched {:?}",
        c[0].0, c[1].0, c[2].0, r.touched
    );
    // Uniform popularity and no context channel: an LRU hits about its capacity share (0.30 at
    // 30%, some margin for chance repeats), far below the calibrated 0.89.
    assert!(c[1].0 < 0.40, "skew 0, LRU at 30%: {:.3}", c[1].0);
    assert!(
        r.touched.iter().all(|&t| t == r.n_expert),
        "{:?}",
        r.touched
    );
}
