//! Synthetic routing must be no kinder than real routing (DESIGN.md §4): the skew is calibrated
//! on independent hidden states (`synth::routing::simulate_lru_hit_rate`), so decode through a
//! deep synthetic model — whose hidden states carry over from token to token — must not hit an
//! expert cache much more often than that calibration says.
mod common;
use pocketmoe::engine::{Device, Engine, EngineOptions};
use pocketmoe::ggml::capture::Capture;
use pocketmoe::synth::routing::{simulate_lru_hit_rate, top_k, DEFAULT_SKEW};

/// Per-layer LRU hit rate of the routing in `picks[layer][step]`.
fn lru_hit_rate(picks: &[Vec<Vec<usize>>], n_expert: usize, capacity: usize) -> f64 {
    let (mut hits, mut total) = (0u64, 0u64);
    for layer in picks {
        let mut last_use = vec![None::<usize>; n_expert];
        for (t, sel) in layer.iter().enumerate() {
            for &e in sel {
                total += 1;
                if last_use[e].is_some() {
                    hits += 1;
                } else if last_use.iter().flatten().count() >= capacity {
                    let victim = (0..n_expert)
                        .filter(|&x| last_use[x].is_some())
                        .min_by_key(|&x| last_use[x])
                        .unwrap();
                    last_use[victim] = None;
                }
                last_use[e] = Some(t);
            }
        }
    }
    hits as f64 / total as f64
}

#[test]
fn deep_synthetic_decode_routes_about_as_independently_as_calibrated() {
    let dir = std::env::temp_dir().join(format!("pocketmoe-routing-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("deep.gguf");
    let opts = pocketmoe::synth::SynthOptions {
        arch: "qwen3moe".into(),
        preset: "deep-tiny".into(),
        quant: pocketmoe::synth::quantmix::QuantMix::Q4KM,
        routing_skew: DEFAULT_SKEW,
        seed: 11,
        out: path.clone(),
    };
    pocketmoe::synth::synth(&opts, &|_, _| {}).unwrap();
    let mut eng = Engine::load(
        &path,
        EngineOptions {
            device: Device::Cpu,
            n_ctx: 512,
            n_threads: 2,
            ..Default::default()
        },
        &|_, _| {},
    )
    .unwrap();
    let (n_layer, n_expert, k) = (
        eng.hp.n_layer as usize,
        eng.hp.n_expert as usize,
        eng.hp.n_expert_used as usize,
    );
    let names: Vec<String> = (0..n_layer)
        .map(|il| format!("ffn_moe_probs-{il}"))
        .collect();
    let mut cap = Capture::new(names.clone());
    let mut rng = pocketmoe::util::Rng::new(5);
    let n_vocab = eng.hp.n_vocab;
    let prompt: Vec<u32> = (0..32).map(|_| (rng.next_u64() % n_vocab) as u32).collect();
    eng.forward_last(&prompt).unwrap();
    eng.set_capture(Some(&mut cap));
    let mut picks = vec![Vec::new(); n_layer];
    for _ in 0..160 {
        let tok = (rng.next_u64() % n_vocab) as u32;
        eng.forward_last(&[tok]).unwrap();
        for (il, name) in names.iter().enumerate() {
            picks[il].push(top_k(&cap.got[name], k));
        }
        cap.got.clear();
    }
    eng.set_capture(None);
    let capacity = n_expert / 4;
    let got = lru_hit_rate(&picks, n_expert, capacity);
    let iid = simulate_lru_hit_rate(n_expert, k, DEFAULT_SKEW, capacity, 4000, 3);
    eprintln!("deep-tiny decode: LRU at 25% hits {got:.3}; iid calibration {iid:.3}");
    assert!(
        got <= iid + 0.10,
        "decode routing is kinder than calibrated: {got:.3} vs {iid:.3}"
    );
}
