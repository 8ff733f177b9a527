//! Zero-config start (issue 17 items 1-2): with no device flag, `pocketmoe run` picks GPU 0 on a
//! CUDA build with a GPU, else the CPU, and prints its load plan; `--cpu` forces the CPU and
//! conflicts with `--gpu`. (On the GPU, the automatic budget is `engine::auto_budget`, unit-tested
//! there; the plan's offload lines are asserted in tests/offload.rs.)
mod common;
use pocketmoe::synth::quantmix::QuantMix;
use std::process::Command;

fn run(args: &[&str]) -> (Option<i32>, String) {
    let o = Command::new(env!("CARGO_BIN_EXE_pocketmoe"))
        .args(args)
        .output()
        .expect("running pocketmoe");
    (
        o.status.code(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

#[test]
fn run_without_a_device_flag_prints_its_plan() {
    let path = common::synth_tiny("zero_config", "qwen3moe", QuantMix::Q8_0, 2.8, 5);
    let model = path.to_str().unwrap();
    let base = [
        "run", "-m", model, "-p", "hello", "-n", "2", "--temp", "0", "--ctx", "256",
    ];
    let (code, err) = run(&base);
    assert_eq!(code, Some(0), "{err}");
    let gpu = pocketmoe::ggml::Backend::cuda_device_count() > 0;
    let want = if gpu { "on CUDA0" } else { "on the CPU" };
    assert!(err.contains("plan: model"), "no plan printed:\n{err}");
    assert!(err.contains(want), "not {want}:\n{err}");
    assert!(
        err.contains("256 tokens"),
        "the plan lacks the context:\n{err}"
    );
    let mut forced = base.to_vec();
    forced.push("--cpu");
    let (code, err) = run(&forced);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        err.contains("on the CPU"),
        "--cpu did not force the CPU:\n{err}"
    );
    forced.extend(["--gpu", "0"]);
    let (code, err) = run(&forced);
    assert_eq!(
        code,
        Some(2),
        "--cpu with --gpu must be a usage error:\n{err}"
    );
}
