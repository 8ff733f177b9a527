//! The default expert-cache policy is the best candidate on the calibrated synthetic decode
//! routing (which reproduces real Qwen3-30B-A3B LRU hit rates, see `synth::routing`): per-layer
//! hit rates of LRU, LFU and LFRU at several half-lives, simulated on routing captured through the
//! engine, at 15%, 30% and 50% of each layer's experts cached.
mod common;
use pocketmoe::experts::cache::simulate;
use pocketmoe::experts::policy::PolicyKind;
use pocketmoe::synth::routing::DEFAULT_SKEW;

/// Decode routing `[layer][step]` of `routing-tiny` (128 experts, top-8) at the default skew,
/// one fresh random token per step.
fn decode_trace(n_steps: usize) -> (usize, Vec<Vec<Vec<u32>>>) {
    let path = common::synth_preset(
        "policy",
        "qwen3moe",
        "routing-tiny",
        pocketmoe::synth::quantmix::QuantMix::Q4KM,
        DEFAULT_SKEW,
        11,
    );
    let mut eng = common::cpu_engine(&path, n_steps + 64);
    let mut rng = pocketmoe::util::Rng::new(3);
    let n_vocab = eng.hp.n_vocab;
    let mut tok = || (rng.next_u64() % n_vocab) as u32;
    let prompt: Vec<u32> = (0..32).map(|_| tok()).collect();
    eng.forward_last(&prompt).unwrap();
    let picks = common::decode_routing(&mut eng, n_steps, &mut tok);
    let _ = std::fs::remove_file(&path);
    let trace = picks
        .into_iter()
        .map(|l| {
            l.into_iter()
                .map(|s| s.into_iter().map(|e| e as u32).collect())
                .collect()
        })
        .collect();
    (eng.hp.n_expert as usize, trace)
}

#[test]
fn default_policy_is_the_best_candidate_on_calibrated_routing() {
    let (n_expert, trace) = decode_trace(600);
    let rate = |kind: &PolicyKind, slots: usize| {
        let (mut h, mut m) = (0u64, 0u64);
        for layer in &trace {
            let (a, b) = simulate(kind, n_expert, slots, layer);
            h += a;
            m += b;
        }
        h as f64 / (h + m) as f64
    };
    let mut candidates = vec![("lru", PolicyKind::Lru), ("lfu", PolicyKind::Lfu)];
    for h in [2.0, 8.0, 16.0, 64.0] {
        candidates.push(("lfru", PolicyKind::Lfru { half_life: h }));
    }
    for frac in [0.15, 0.30, 0.50] {
        let slots = (n_expert as f64 * frac).round() as usize;
        let ours = rate(&PolicyKind::default(), slots);
        eprintln!(
            "{:.0}% cached: default {:?} hits {ours:.3}",
            100.0 * frac,
            PolicyKind::default()
        );
        for (name, kind) in &candidates {
            let r = rate(kind, slots);
            eprintln!("  {name} {kind:?}: {r:.3}");
            // 0.005: half a point, about the seed-to-seed spread of these rates (1000s of picks
            // per layer); a candidate better by more than that should be the default.
            assert!(
                ours >= r - 0.005,
                "at {frac}: {kind:?} hits {r:.3}, the default only {ours:.3}"
            );
        }
    }
}
