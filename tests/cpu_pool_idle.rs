//! A CPU-only engine whose thread pool takes every core leaves the cores alone between graphs
//! (issue 27). ggml's pool polls by default: after a graph its idle workers spin up to ~10^8
//! cycles for the next one before they sleep. On an oversubscribed 2-core machine those spinning
//! workers took the cores from the threads with work (the server's, another engine's, another
//! process's), and each graph stalled for whole time slices. The engine's pool now waits instead
//! of polling there, which this test sees as CPU time: none is spent while the engine is idle.
//!
//! One test in this binary, so that no other test's threads add CPU time to the process's.
mod common;
use pocketmoe::engine::{Device, Engine, EngineOptions};
use pocketmoe::synth::quantmix::QuantMix;
use std::time::Duration;

/// CPU time (user + system) of this whole process so far.
fn process_cpu_time() -> Duration {
    // SAFETY: getrusage writes the struct it is given.
    let ru = unsafe {
        let mut ru: libc::rusage = std::mem::zeroed();
        assert_eq!(libc::getrusage(libc::RUSAGE_SELF, &mut ru), 0);
        ru
    };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

#[test]
fn cpu_pool_taking_every_core_waits_between_graphs_instead_of_spinning() {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    assert!(
        cores >= 2,
        "needs 2 cores: a pool of 1 thread has no idle workers"
    );
    let path = common::synth_tiny("cpu-pool-idle", "qwen3moe", QuantMix::Q8_0, 1.0, 5);
    let opts = EngineOptions {
        device: Device::Cpu,
        n_ctx: 256,
        n_threads: 0, // every core, the default
        ..Default::default()
    };
    let mut eng = Engine::load(&path, opts, &|_, _| {}).unwrap();
    let idle = Duration::from_millis(400);
    for step in 0..3 {
        eng.forward(&[1 + step, 2, 3]).unwrap();
        let before = process_cpu_time();
        std::thread::sleep(idle);
        let spent = process_cpu_time() - before;
        // Sleeping threads cost nothing; the allowance is for timer and bookkeeping noise.
        assert!(
            spent < Duration::from_millis(40),
            "step {step}: the engine's {} idle CPU threads used {spent:?} of CPU in {idle:?} \
             between graphs (polling instead of waiting)",
            cores - 1
        );
    }
}
