//! Structural parity with libllama: the kernels of our decode graph's first block come in the
//! same order as libllama's, op for op (views, reshapes and permutes, which launch nothing, left
//! out). On the GPU this order is what makes CUDA-graph replay with programmatic dependent
//! launch exact (docs/design.md §3.3; `scripts/device-replay-check.sh` checks replay on the
//! device): with K's projection ahead of Q's, replay read stale data. Here, on the CPU, a reordering shows
//! up as a differing sequence, before it reaches a GPU.
mod common;
use pocketmoe::cli::Decoder;
use pocketmoe::engine::{Device, Engine, EngineOptions};
use pocketmoe::ggml::capture::Capture;
use pocketmoe::ggml::llama::{LlamaContext, LlamaModel};
use pocketmoe::synth::quantmix::QuantMix;

/// Ops that only reinterpret memory: no kernel runs for them.
const NO_KERNEL: [&str; 5] = ["VIEW", "RESHAPE", "PERMUTE", "TRANSPOSE", "NONE"];

/// `(op, name)` of kernel nodes, in graph order.
type Kernels = Vec<(String, String)>;

/// The kernel nodes from the first RMS_NORM to block 0's output (`l_out-0`; DeepSeek-V4's
/// hyper-connection streams: `l_last-0`).
fn block0(order: &[String]) -> Kernels {
    let ops: Kernels = order
        .iter()
        .map(|l| {
            // "name OP [ne0, ne1, ne2, ne3]"; names may contain spaces.
            let head = l.split(" [").next().unwrap_or(l);
            let (name, op) = head.rsplit_once(' ').unwrap_or(("", head));
            (op.to_string(), name.to_string())
        })
        .filter(|(op, _)| !NO_KERNEL.contains(&op.as_str()))
        .collect();
    let start = ops.iter().position(|(op, _)| op == "RMS_NORM");
    let end = ops
        .iter()
        .position(|(_, name)| name == "l_out-0" || name == "l_last-0");
    match (start, end) {
        (Some(s), Some(e)) if s <= e => ops[s..=e].to_vec(),
        _ => panic!("no block 0 (RMS_NORM .. l_out-0 / l_last-0) in {order:#?}"),
    }
}

/// Block 0 of the decode graph: (ours, libllama's).
fn decode_order(arch: &str) -> (Kernels, Kernels) {
    let path = common::synth_tiny("order", arch, QuantMix::Q8_0, 1.0, 11);
    let lm = LlamaModel::load_plain(&path, 0).unwrap();
    let prompt = lm.tokenize("hello world", false, false).unwrap();

    let mut lcap = Capture::new(["*"]);
    lcap.record_order = true;
    let mut lctx = LlamaContext::new_with_capture(&lm, 256, 2, Some(&mut lcap)).unwrap();
    lctx.eval(&prompt, 0).unwrap();
    lcap.order.clear();
    lctx.eval(&[prompt[0]], prompt.len()).unwrap();
    let theirs = block0(&lcap.order);
    drop(lctx);

    let opts = EngineOptions {
        device: Device::Cpu,
        n_ctx: 256,
        n_threads: 2,
        ..Default::default()
    };
    let mut eng = Engine::load(&path, opts, &|_, _| {}).unwrap();
    let mut cap = Capture::new(["*"]);
    cap.record_order = true;
    eng.set_capture(Some(&mut cap));
    let toks: Vec<u32> = prompt.iter().map(|&t| t as u32).collect();
    eng.prefill(&toks).unwrap();
    cap.order.clear();
    eng.step(toks[0]).unwrap();
    eng.set_capture(None);
    (block0(&cap.order), theirs)
}

fn check(arch: &str) {
    let (ours, theirs) = decode_order(arch);
    let ops = |v: &[(String, String)]| v.iter().map(|(o, _)| o.clone()).collect::<Vec<_>>();
    assert_eq!(
        ops(&ours),
        ops(&theirs),
        "{arch}: block 0's kernels differ from libllama's\nours:   {ours:?}\ntheirs: {theirs:?}"
    );
    // The nodes both graphs name (Qcur-0, Vcur-0, Kcur-0, attn_norm-0, ffn_moe_*-0, ...) come in
    // the same relative order: swapping K and V, which keeps the op sequence, fails here.
    let named = |v: &[(String, String)], other: &[(String, String)]| {
        let mut seen = Vec::new();
        for (_, n) in v {
            let auto = n.is_empty() || n.starts_with("node_") || n.starts_with("leaf_");
            if !auto && !seen.contains(n) && other.iter().any(|(_, m)| m == n) {
                seen.push(n.clone());
            }
        }
        seen
    };
    let (ours_named, theirs_named) = (named(&ours, &theirs), named(&theirs, &ours));
    assert!(
        ours_named.len() >= 8,
        "{arch}: only {} nodes named alike: {ours_named:?}",
        ours_named.len()
    );
    assert_eq!(
        ours_named, theirs_named,
        "{arch}: block 0's named nodes come in another order than libllama's"
    );
    // The property replay depends on: Q's projection comes before K's (MLA names its
    // projections differently and has no Kcur).
    let pos = |n: &str| ours.iter().position(|(_, name)| name == n);
    if let (Some(q), Some(k)) = (pos("Qcur-0"), pos("Kcur-0")) {
        assert!(q < k, "{arch}: K before Q");
    } else {
        // MLA (deepseek2, deepseek32) and DeepSeek-V4 name their projections otherwise.
        assert!(
            ["deepseek2", "deepseek32", "deepseek4"].contains(&arch),
            "{arch}: no Qcur-0/Kcur-0 in {ours:?}"
        );
    }
}

/// Every architecture with a graph (`pocketmoe::arch::built`).
#[test]
fn decode_kernels_in_libllama_order() {
    for arch in pocketmoe::arch::built() {
        check(arch.spec.name);
    }
}
