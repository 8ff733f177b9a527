//! The layer split over several devices (issue 26, `engine::split`), checked on the CPU: 2 and 3
//! CPU stand-in devices (`Device::Cpu` repeated: each its own CPU backend and its own memory)
//! against the single-device engine, on every built architecture's tiny synthetic model
//! (Q8_0 weights, which the CPU does not repack, so both runs use the same kernels).
//!
//! The logits must be bit-identical (max |Δ| = 0) at every prompt position and every decode
//! step, and so the greedy tokens: each device runs the same CPU kernels on the same weights in
//! the same order, and a block boundary at most copies f32 activations, which is exact. Any
//! difference is a placement bug (a node reading another block's cache, a weight on the wrong
//! device read as garbage, a lost copy), not rounding.
//!
//! The test also checks that the split really happened, so it cannot pass by running
//! everything on one device: block 0's and the last block's weights (and KV rows) are in
//! different devices' buffers, their nodes ran on different backends, and ggml's scheduler cut
//! the graph into at least one split per device that holds blocks.
mod common;
use common::argmax;
use pocketmoe::engine::{Device, Engine, EngineError, EngineOptions};
use pocketmoe::gguf::GgufModel;
use pocketmoe::synth::quantmix::QuantMix;
use std::path::Path;

const PROMPT_LEN: usize = 9;
const STEPS: usize = 6;

fn load(path: &Path, devices: Vec<Device>) -> Result<Engine, EngineError> {
    Engine::load(
        path,
        EngineOptions {
            device: Device::Cpu,
            devices,
            n_ctx: 64,
            n_threads: 2,
            ..Default::default()
        },
        &|_, _| {},
    )
}

/// The logits of a prompt (every position) and of `STEPS` greedy decode steps, and the
/// greedy tokens.
fn run(eng: &mut Engine) -> (Vec<Vec<f32>>, Vec<u32>) {
    let n_vocab = eng.hp.n_vocab as u32;
    let prompt: Vec<u32> = (0..PROMPT_LEN as u32)
        .map(|i| (i * 37 + 11) % n_vocab)
        .collect();
    let mut logits = eng.forward(&prompt).unwrap();
    let mut tokens = Vec::new();
    for _ in 0..STEPS {
        let t = argmax(logits.last().unwrap());
        tokens.push(t);
        logits.extend(eng.forward(&[t]).unwrap());
    }
    (logits, tokens)
}

/// Names of the file's tensors of block `il`.
fn block_tensors(path: &Path, il: usize) -> Vec<String> {
    let prefix = format!("blk.{il}.");
    GgufModel::open(path)
        .unwrap()
        .tensors()
        .filter(|t| t.name.starts_with(&prefix))
        .map(|t| t.name.clone())
        .collect()
}

fn check_arch(arch: &str) {
    let path = common::synth_tiny("multi_device", arch, QuantMix::Q8_0, 1.0, 11);
    let mut one = load(&path, Vec::new()).unwrap();
    assert!(one.layer_plan().is_none());
    let (want, want_tokens) = run(&mut one);
    let n_decode = one.hp.n_layer_decode();
    let last = n_decode - 1;
    drop(one);
    for n_dev in [2, 3] {
        let mut eng = load(&path, vec![Device::Cpu; n_dev]).unwrap();
        let plan = eng.layer_plan().expect("a layer split").clone();
        assert_eq!(plan.n_devices(), n_dev);
        let holding = plan.blocks.iter().filter(|r| !r.is_empty()).count();
        assert!(
            holding >= 2,
            "{arch}: {n_decode} blocks over {n_dev} devices, only {holding} hold any"
        );
        let (d0, dl) = (plan.device_of(0), plan.device_of(last));
        assert_ne!(d0, dl, "{arch}: blocks 0 and {last} on one device");
        // Weights: every tensor of block 0 on its device, every one of the last block on its.
        for (il, dev) in [(0, d0), (last, dl)] {
            let names = block_tensors(&path, il);
            assert!(!names.is_empty(), "{arch}: block {il} has no tensors");
            for name in names {
                assert_eq!(
                    eng.weight_device(&name),
                    Some(dev),
                    "{arch}, {n_dev} devices: {name}"
                );
            }
        }
        assert_eq!(eng.weight_device("token_embd.weight"), Some(plan.input));
        assert_eq!(eng.weight_device("output_norm.weight"), Some(plan.output));
        // KV rows, where the architecture has per-block K rows.
        if let (Some(c0), Some(cl)) = (
            eng.cache_device("cache_k_l0"),
            eng.cache_device(&format!("cache_k_l{last}")),
        ) {
            assert_eq!((c0, cl), (d0, dl), "{arch}: KV rows of blocks 0 and {last}");
        }
        let (got, got_tokens) = run(&mut eng);
        // Nodes: the last step's graph ran block 0 and the last block on their devices.
        let node = |il: usize| {
            ["l_out", "ffn_inp", "attn_norm", "ffn_out"]
                .iter()
                .find_map(|n| eng.node_backend(&format!("{n}-{il}")))
        };
        if let (Some(b0), Some(bl)) = (node(0), node(last)) {
            assert_eq!(
                (b0, bl),
                (d0, dl),
                "{arch}: backends of blocks 0 and {last}"
            );
        }
        assert!(
            eng.n_splits() >= holding,
            "{arch}: {} scheduler split(s) for {holding} devices holding blocks",
            eng.n_splits()
        );
        assert_eq!(got.len(), want.len());
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            let bad = g
                .iter()
                .zip(w)
                .filter(|(a, b)| a.to_bits() != b.to_bits())
                .count();
            let max = common::max_abs_diff(g, w);
            assert_eq!(
                bad, 0,
                "{arch}, {n_dev} devices, row {i}: {bad} logits differ from one device's (max |d| {max}): a placement bug"
            );
        }
        assert_eq!(got_tokens, want_tokens, "{arch}, {n_dev} devices");
        eprintln!(
            "{arch}: {n_dev} devices {:?}, {} splits: logits bit-identical over {PROMPT_LEN} prompt positions and {STEPS} steps",
            plan.blocks,
            eng.n_splits()
        );
    }
}

/// Every architecture with a graph.
#[test]
fn layer_split_is_bit_identical_on_every_built_arch() {
    for arch in pocketmoe::arch::built() {
        check_arch(arch.spec.name);
    }
}

#[test]
fn a_one_device_list_is_the_single_device_engine() {
    let path = common::synth_tiny("multi_device", "qwen3moe", QuantMix::Q8_0, 1.0, 11);
    let mut a = load(&path, vec![Device::Cpu]).unwrap();
    let mut b = load(&path, Vec::new()).unwrap();
    assert!(a.layer_plan().is_none());
    assert_eq!(run(&mut a), run(&mut b));
}

#[test]
fn what_the_split_does_not_build_is_refused() {
    let path = common::synth_tiny("multi_device", "qwen3moe", QuantMix::Q8_0, 1.0, 11);
    // A budget the model does not fit: one device would offload; several must say so.
    let err = Engine::load(
        &path,
        EngineOptions {
            devices: vec![Device::Cpu; 2],
            gpu_mem: Some(1 << 16),
            n_ctx: 64,
            ..Default::default()
        },
        &|_, _| {},
    )
    .err()
    .expect("refused");
    let msg = err.to_string();
    assert!(
        msg.contains("offloading") && msg.contains("several devices") && msg.contains("--gpu"),
        "{msg}"
    );
    // CPU and CUDA devices in one split.
    let err = load(&path, vec![Device::Cpu, Device::Cuda(0)])
        .err()
        .expect("refused")
        .to_string();
    assert!(err.contains("not mixed") || err.contains("CUDA"), "{err}");
    // A tensor split of another length than the device list.
    let err = Engine::load(
        &path,
        EngineOptions {
            devices: vec![Device::Cpu; 2],
            tensor_split: vec![1.0, 1.0, 1.0],
            n_ctx: 64,
            ..Default::default()
        },
        &|_, _| {},
    )
    .err()
    .expect("refused")
    .to_string();
    assert!(err.contains("one share per device"), "{err}");
}

#[test]
fn a_tensor_split_moves_the_boundary() {
    let path = common::synth_tiny("multi_device", "qwen3moe", QuantMix::Q8_0, 1.0, 11);
    let eng = Engine::load(
        &path,
        EngineOptions {
            devices: vec![Device::Cpu; 2],
            tensor_split: vec![0.0, 1.0],
            n_ctx: 64,
            ..Default::default()
        },
        &|_, _| {},
    )
    .unwrap();
    let plan = eng.layer_plan().unwrap();
    assert!(plan.blocks[0].is_empty());
    assert_eq!((plan.input, plan.output), (1, 1));
    assert_eq!(eng.weight_device("token_embd.weight"), Some(1));
    let text = eng.plan();
    assert!(text.contains("CPU stand-in 0: no blocks"), "{text}");
}
