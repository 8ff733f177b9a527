//! On a GPU the engine stays within `--gpu-mem`, as the device itself counts it: bytes in use
//! (cudaMemGetInfo's total − free, through ggml's device query) above what was in use with the
//! CUDA context already up, read after load, after a prefill that fills the whole context the
//! plan was made for, and after decode steps. Every built architecture's tiny preset, at the
//! smallest budget the engine accepts (no expert slots: everything the plan counts is the floor,
//! so any byte it under-counts shows) and at that floor plus a quarter of the file (some slots).
//!
//! CUDA builds only: a CPU-only build has no device memory to read (the CPU backend plays the GPU
//! in tests/offload.rs, whose budgets are bookkeeping, not measured).
mod common;
use pocketmoe::cli::bench::measure::device_used;
use pocketmoe::engine::{Device, Engine, EngineError, EngineOptions};
use pocketmoe::synth::quantmix::QuantMix;
use std::path::Path;

const N_CTX: usize = 1024;
const N_UBATCH: usize = 256;

fn opts(gpu_mem: u64) -> EngineOptions {
    EngineOptions {
        device: Device::Cuda(0),
        n_ctx: N_CTX,
        n_threads: 4,
        n_ubatch: N_UBATCH,
        gpu_mem: Some(gpu_mem),
        ..Default::default()
    }
}

/// The floor the engine names when refusing a 1-byte budget.
fn floor(path: &Path) -> u64 {
    match Engine::load(path, opts(1), &|_, _| {}) {
        Err(EngineError::BudgetTooSmall { need, .. }) => need,
        Err(e) => panic!("wrong error for a 1-byte budget: {e}"),
        Ok(_) => panic!("a 1-byte budget was accepted"),
    }
}

/// Loads at `budget`, fills the context, decodes; returns the device use above `base` at each
/// point (load, prefill, decode).
fn measure(path: &Path, budget: u64, base: u64) -> [u64; 3] {
    let used = || {
        device_used(Some(0))
            .expect("CUDA0 answers")
            .saturating_sub(base)
    };
    let mut eng = Engine::load(path, opts(budget), &|_, _| {}).unwrap();
    let at_load = used();
    // The whole context but the decode steps, in micro-batches of the plan's size.
    let steps = 16;
    let prompt: Vec<u32> = (0..N_CTX - steps)
        .map(|i| (i * 7 + 3) as u32 % 200)
        .collect();
    let mut last = eng.forward_last(&prompt).unwrap();
    let at_prefill = used();
    for _ in 0..steps {
        let next = common::argmax(&last);
        last = eng.forward_last(&[next]).unwrap();
    }
    assert_eq!(eng.n_past(), N_CTX, "the context is full");
    let at_decode = used();
    drop(eng);
    [at_load, at_prefill, at_decode]
}

#[test]
#[cfg_attr(not(feature = "cuda"), ignore = "needs a CUDA build and a GPU")]
fn device_use_stays_within_the_budget() {
    // Bring the CUDA context (and ggml's device list) up before the baseline: the context is the
    // driver's, not the plan's.
    device_used(Some(0)).expect("a CUDA build needs GPU 0");
    let mut over = Vec::new();
    for arch in pocketmoe::arch::built() {
        let name = arch.spec.name;
        let path = common::synth_tiny("vram", name, QuantMix::Q4KM, 2.8, 5);
        let fl = floor(&path);
        let file = std::fs::metadata(&path).unwrap().len();
        for (label, budget) in [("floor", fl), ("floor+file/4", fl + file / 4)] {
            let base = device_used(Some(0)).unwrap();
            let m = measure(&path, budget, base);
            let mib = |b: u64| b as f64 / 1048576.0;
            println!(
                "{name:<12} {label:<13} budget {:8.2} MiB  used: load {:8.2}  prefill {:8.2}  \
                 decode {:8.2} MiB",
                mib(budget),
                mib(m[0]),
                mib(m[1]),
                mib(m[2])
            );
            if m.iter().any(|&u| u > budget) {
                over.push(format!(
                    "{name} at {label} ({budget} B): load {} B, prefill {} B, decode {} B",
                    m[0], m[1], m[2]
                ));
            }
        }
    }
    assert!(
        over.is_empty(),
        "device use above the budget (the plan under-counts):\n{}",
        over.join("\n")
    );
}
