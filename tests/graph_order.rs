//! Structural parity with libllama: the kernels of every block of our decode graph, and of the
//! output head after the last one, come in the same order as libllama's, op for op (views,
//! reshapes and permutes, which launch nothing, left out). Every built architecture's tiny preset
//! is checked block by block, which covers every block kind the graphs build: a leading dense
//! block and MoE blocks (deepseek2, deepseek32), hash-routed and bias-routed blocks and each
//! compression ratio (deepseek4), sliding-window and full-attention blocks (gpt-oss), and the
//! last block, which feeds the head; [`block_kinds_are_covered`] holds the presets to that. The
//! one deliberate difference, where the output rows are selected, is named and pinned in
//! [`drop_output_selection`].
//!
//! On the GPU this order is what makes CUDA-graph replay with programmatic dependent launch exact
//! (docs/design.md §3.3; `scripts/device-replay-check.sh` checks replay on the device): with K's
//! projection ahead of Q's, replay read stale data. Here, on the CPU, a reordering shows up as a
//! differing sequence, before it reaches a GPU.
mod common;
use pocketmoe::cli::Decoder;
use pocketmoe::engine::{Device, Engine, EngineOptions};
use pocketmoe::ggml::capture::Capture;
use pocketmoe::ggml::llama::{LlamaContext, LlamaModel};
use pocketmoe::model::hparams::Hparams;
use pocketmoe::synth::quantmix::QuantMix;

/// Ops that only reinterpret memory: no kernel runs for them.
const NO_KERNEL: [&str; 5] = ["VIEW", "RESHAPE", "PERMUTE", "TRANSPOSE", "NONE"];

/// `(op, name)` of kernel nodes, in graph order.
type Kernels = Vec<(String, String)>;

/// A decode graph's kernels cut into its blocks, and the head after them.
type Parts = (Vec<Kernels>, Kernels);

/// The kernel nodes of a decode graph, cut into its blocks and the head: block 0 from the first
/// RMS_NORM to its output (`l_out-0`; DeepSeek-V4's hyper-connection streams: `l_last-0`),
/// block i from the node after block i-1's output to its own, the head from the node after the
/// last block's output to the graph's end. `n_layer` blocks must all be found.
fn blocks(order: &[String], n_layer: usize) -> Parts {
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
    let Some(mut start) = ops.iter().position(|(op, _)| op == "RMS_NORM") else {
        panic!("no RMS_NORM in {order:#?}")
    };
    let mut out = Vec::new();
    for il in 0..n_layer {
        // libllama's DeepSeek-V4 names its last block's output `h_nextn` (the MTP block's input).
        let mut ends = vec![format!("l_out-{il}"), format!("l_last-{il}")];
        if il + 1 == n_layer {
            ends.push("h_nextn".into());
        }
        let end = ops[start..]
            .iter()
            .position(|(_, name)| ends.contains(name))
            .map(|e| start + e)
            .unwrap_or_else(|| panic!("no block {il} (.. {}) in {order:#?}", ends.join(" / ")));
        out.push(ops[start..=end].to_vec());
        start = end + 1;
    }
    (out, ops[start..].to_vec())
}

/// The decode graph's blocks and head: (ours, libllama's), and our engine's hparams.
fn decode_order(arch: &str) -> (Parts, Parts, Hparams) {
    let path = common::synth_tiny("order", arch, QuantMix::Q8_0, 1.0, 11);
    let lm = LlamaModel::load_plain(&path, 0).unwrap();
    let prompt = lm.tokenize("hello world", false, false).unwrap();

    let opts = EngineOptions {
        device: Device::Cpu,
        n_ctx: 256,
        n_threads: 2,
        ..Default::default()
    };
    let mut eng = Engine::load(&path, opts, &|_, _| {}).unwrap();
    let hp = eng.hp.clone();
    let n_layer = hp.n_layer_decode();

    let mut lcap = Capture::new(["*"]);
    lcap.record_order = true;
    let mut lctx = LlamaContext::new_with_capture(&lm, 256, 2, Some(&mut lcap)).unwrap();
    lctx.eval(&prompt, 0).unwrap();
    lcap.order.clear();
    lctx.eval(&[prompt[0]], prompt.len()).unwrap();
    let theirs = blocks(&lcap.order, n_layer);
    drop(lctx);

    let mut cap = Capture::new(["*"]);
    cap.record_order = true;
    eng.set_capture(Some(&mut cap)).unwrap();
    let toks: Vec<u32> = prompt.iter().map(|&t| t as u32).collect();
    eng.prefill(&toks).unwrap();
    cap.order.clear();
    eng.step(toks[0]).unwrap();
    eng.set_capture(None).unwrap();
    (blocks(&cap.order, n_layer), theirs, hp)
}

/// One block's (or the head's) kernels, ours against libllama's.
fn check_part(what: &str, ours: &[(String, String)], theirs: &[(String, String)], il: usize) {
    let ops = |v: &[(String, String)]| v.iter().map(|(o, _)| o.clone()).collect::<Vec<_>>();
    assert_eq!(
        ops(ours),
        ops(theirs),
        "{what}: kernels differ from libllama's\nours:   {ours:?}\ntheirs: {theirs:?}"
    );
    // The nodes both graphs name (Qcur-N, Vcur-N, Kcur-N, attn_norm-N, ffn_moe_*-N, ...) come in
    // the same relative order: swapping K and V, which keeps the op sequence, fails here. Each
    // name is placed by its first node. A cache view written a different number of times says
    // nothing about order: libllama names both of a DeepSeek-V4 compressed block's cache writes
    // (the compressed row, the raw row) `cache_k_lN (view)`, ours only the second; such a name is
    // left out (the op sequence above still holds both writes in place).
    let count = |v: &[(String, String)], n: &str| v.iter().filter(|(_, m)| m == n).count();
    let named = |v: &[(String, String)], other: &[(String, String)]| {
        let mut seen = Vec::new();
        for (_, n) in v {
            let auto = n.is_empty() || n.starts_with("node_") || n.starts_with("leaf_");
            let cache_mismatch = n.starts_with("cache_") && count(v, n) != count(other, n);
            if !auto && !seen.contains(n) && count(other, n) > 0 && !cache_mismatch {
                seen.push(n.clone());
            }
        }
        seen
    };
    let (ours_named, theirs_named) = (named(ours, theirs), named(theirs, ours));
    assert_eq!(
        ours_named, theirs_named,
        "{what}: named nodes come in another order than libllama's"
    );
    if il == usize::MAX {
        return; // the head
    }
    assert!(
        ours_named.len() >= 8,
        "{what}: only {} nodes named alike: {ours_named:?}",
        ours_named.len()
    );
    // The property replay depends on: Q's projection comes before K's (MLA names its
    // projections differently and has no Kcur).
    let pos = |n: &str| ours.iter().position(|(_, name)| name == n);
    if let (Some(q), Some(k)) = (pos(&format!("Qcur-{il}")), pos(&format!("Kcur-{il}"))) {
        assert!(q < k, "{what}: K before Q");
    } else {
        // MLA (deepseek2, deepseek32) and DeepSeek-V4 name their projections otherwise.
        assert!(
            ["deepseek2", "deepseek32", "deepseek4"]
                .iter()
                .any(|a| what.starts_with(&format!("{a} "))),
            "{what}: no Qcur-{il}/Kcur-{il} in {ours:?}"
        );
    }
}

/// The one place where our graph differs from libllama's on purpose: where the rows whose logits
/// are wanted are selected (llama.cpp's `inp_out_ids`, one GET_ROWS per selected tensor).
/// libllama selects them inside the last block, after attention (two GET_ROWS: the attention
/// output and the residual, before `ffn_inp`), or for DeepSeek-V4 after the last block (one
/// GET_ROWS at the head's start); ours selects once, just before the head
/// (`GraphBuilder::select_outputs`), and a decode step's single row needs no selection. Removes
/// libllama's selection from its last block and head, and fails unless it is exactly one of those
/// two shapes (so a change on either side shows up here).
fn drop_output_selection(arch: &str, last: &mut Kernels, head: &mut Kernels, il: usize) {
    let auto_get_rows = |k: &(String, String)| k.0 == "GET_ROWS" && k.1.starts_with("node_");
    let ffn_inp = format!("ffn_inp-{il}");
    let in_block = last
        .iter()
        .position(|(op, name)| op == "ADD" && *name == ffn_inp)
        .filter(|&p| p >= 2 && auto_get_rows(&last[p - 2]) && auto_get_rows(&last[p - 1]));
    let in_head = head.first().is_some_and(auto_get_rows);
    match (in_block, in_head) {
        (Some(p), false) => {
            last.drain(p - 2..p);
        }
        (None, true) => {
            head.remove(0);
        }
        _ => panic!(
            "{arch}: libllama's output-row selection is not where this test expects it (two \
             GET_ROWS before {ffn_inp}, or one at the head's start)\nlast block: {last:?}\nhead: \
             {head:?}"
        ),
    }
}

fn check(arch: &str) -> Hparams {
    let ((ours, ours_head), (mut theirs, mut theirs_head), hp) = decode_order(arch);
    let il_last = hp.n_layer_decode() - 1;
    drop_output_selection(arch, &mut theirs[il_last], &mut theirs_head, il_last);
    for (il, (o, t)) in ours.iter().zip(&theirs).enumerate() {
        let kind = format!(
            "{}{}{}",
            if hp.is_moe_layer(il) { "MoE" } else { "dense" },
            if hp.is_swa(il) {
                ", sliding window"
            } else {
                ""
            },
            if il < hp.dsv4.hash_layer_count {
                ", hash-routed"
            } else {
                ""
            },
        );
        check_part(&format!("{arch} block {il} ({kind})"), o, t, il);
    }
    check_part(
        &format!("{arch} output head"),
        &ours_head,
        &theirs_head,
        usize::MAX,
    );
    assert!(
        ours_head.iter().any(|(op, _)| op == "MUL_MAT"),
        "{arch}: no output projection after the last block: {ours_head:?}"
    );
    hp
}

/// Every architecture with a graph (`pocketmoe::arch::built`), every block.
#[test]
fn decode_kernels_in_libllama_order() {
    for arch in pocketmoe::arch::built() {
        check(arch.spec.name);
    }
}

/// The tiny presets [`decode_kernels_in_libllama_order`] walks hold every block kind the issue
/// names: a leading dense block then MoE blocks, hash-routed blocks beside router-routed ones,
/// sliding-window blocks beside full-attention ones, and more than one block (so the last block
/// is not the first).
#[test]
fn block_kinds_are_covered() {
    let hp = |arch: &str| {
        let path = common::synth_tiny("order-kinds", arch, QuantMix::Q8_0, 1.0, 11);
        let opts = EngineOptions {
            device: Device::Cpu,
            n_ctx: 64,
            n_threads: 2,
            ..Default::default()
        };
        Engine::load(&path, opts, &|_, _| {}).unwrap().hp.clone()
    };
    for arch in ["deepseek2", "deepseek32"] {
        let h = hp(arch);
        assert!(
            !h.is_moe_layer(0) && h.is_moe_layer(h.n_layer - 1),
            "{arch}: no dense lead block before MoE blocks"
        );
    }
    let h = hp("deepseek4");
    assert!(
        h.dsv4.hash_layer_count > 0 && h.dsv4.hash_layer_count < h.n_layer,
        "deepseek4: hash-routed blocks {} of {}",
        h.dsv4.hash_layer_count,
        h.n_layer
    );
    let h = hp("gpt-oss");
    let swa: Vec<bool> = (0..h.n_layer).map(|il| h.is_swa(il)).collect();
    assert!(
        swa.contains(&true) && swa.contains(&false),
        "gpt-oss: sliding-window blocks {swa:?}"
    );
    for arch in pocketmoe::arch::built() {
        let name = arch.spec.name;
        assert!(hp(name).n_layer_decode() >= 2, "{name}: one block only");
    }
}
