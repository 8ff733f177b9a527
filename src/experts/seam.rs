//! The offloaded experts' side of the graph seam (docs/design.md §4.2): [`OffloadedExperts`]
//! implements `graph`'s [`RoutedExperts`] for one graph build. An offloaded layer's experts run
//! from cache slots with remapped ids and a mask (decode), from the staging area (prefill), or
//! through the device-side id table (direct decode); the layer is recorded as a [`MoeNode`] for
//! the step hook, which stops after the routing (see `experts::step`). Layers that are not
//! offloaded run resident.
use super::offload::{ExpertMat, Mode, Offload};
use super::step::MoeNode;
use crate::ggml::Tensor;
use crate::graph::blocks::moe::{ExpertTensors, MoeOpts, Resident, RoutedExperts, Routing};
use crate::graph::GraphBuilder;
use std::cell::RefCell;

/// The offloaded experts as one graph build sees them, and the offloaded layers it recorded.
pub struct OffloadedExperts<'o> {
    off: &'o Offload,
    nodes: RefCell<Vec<MoeNode>>,
}

impl Offload {
    /// The routed experts for the graph builder of one graph (see [`OffloadedExperts`]).
    pub fn graph_experts(&self) -> OffloadedExperts<'_> {
        OffloadedExperts {
            off: self,
            nodes: RefCell::new(Vec::new()),
        }
    }
}

impl OffloadedExperts<'_> {
    /// The offloaded layers of the graph built so far, for `step::GraphNodes::resolve`.
    pub fn take_nodes(&self) -> Vec<MoeNode> {
        self.nodes.take()
    }
}

impl RoutedExperts for OffloadedExperts<'_> {
    fn ffn<'a>(
        &'a self,
        g: &GraphBuilder<'a>,
        x: Tensor<'a>,
        il: usize,
        r: &Routing<'a>,
        opts: &MoeOpts,
    ) -> Tensor<'a> {
        let off = self.off;
        if !off.is_offloaded(il) {
            return Resident.ffn(g, x, il, r, opts);
        }
        let ctx = g.ctx;
        let nt = g.batch.n_tokens as i64;
        let k = g.hp.n_expert_used as i64;
        let biases = g.expert_biases(il);
        let mode = off.mode(nt as usize);
        let weights = g.cb(r.weights, "ffn_moe_weights_final", il as i32);
        if mode == Mode::Direct {
            // Read after the step: outputs, so the allocator never reuses their memory.
            ctx.set_output(r.selected);
            ctx.set_output(weights);
        }
        // Slots and staging read the routing at the stop right after it. Their memory must not
        // be reused before then: a consumer after the stop keeps it (below for the selected ids
        // of slot steps, whose matmuls read the control ids instead; the weights' and staging's
        // ids' consumers are the expert matmuls). Not `set_output`: ggml flags a view's source
        // too, and a flagged argsort or norm stops ggml-cuda's fused top-k routing kernel
        // (softmax, argsort, rows, norm in one): 6 kernels instead of 1 per layer, 0.55 ms of a
        // 12 GiB decode step on the H200 (docs/bench-h200.md, 2026-12-03 late).
        let x = g.cb(x, "ffn_moe_in", il as i32);
        ctx.set_output(x);
        let mut node = MoeNode {
            il,
            mode,
            anchor: weights.name(),
            selected: r.selected.name(),
            weights: weights.name(),
            input: x.name(),
            pred: None,
            gpu_out: None,
            act: opts.act,
            direct_stop: false,
            direct_preds: Vec::new(),
            direct_ids: None,
        };
        // FATE prefetch: the next offloaded layer's router on this layer's FFN input, computed
        // right after this router, so the hook's one stop reads the prediction with the routing.
        if let Some(next) = (mode == Mode::Slots && off.prefetches())
            .then(|| off.next_offloaded(il))
            .flatten()
        {
            let pred = output(g, predicted_logits(g, x, next, il, "ffn_moe_pred_logits")); // [n_expert, nt]
            node.anchor = pred.name();
            node.pred = Some(pred.name());
        }
        let out = match mode {
            Mode::Staging => {
                let w = ExpertMat::ALL.map(|m| off.staging_tensor(il, m));
                let t = ExpertTensors { w, biases };
                g.expert_ffn(&t, x, il, [r.selected; 3], r.selected, weights, opts)
            }
            Mode::Direct => {
                // A stop layer (every `stop_every`-th offloaded layer) predicts the following
                // layers' routing from this layer's FFN input (their routers on it, FATE-style),
                // so the hook's one stop here can prefetch for all of them.
                let ahead = off.direct_stop(il).unwrap_or_default();
                for &next in &ahead {
                    let name = format!("ffn_moe_pred_logits_{next}");
                    let pred = output(g, predicted_logits(g, x, next, il, &name)); // [n_expert, 1]
                    node.anchor = pred.name();
                    node.direct_preds.push((next, pred.name()));
                }
                node.direct_stop = off.direct_stop(il).is_some();
                // Each selected expert's id through the layer's device-side table: its slot, or
                // its place in the host store (read in place). One table per matrix, since each
                // matrix's store lies at its own distance from its slots.
                let w = ExpertMat::ALL.map(|m| off.slot_tensor(il, m));
                let ids: [Tensor<'a>; 3] = ExpertMat::ALL.map(|m| {
                    let t = ctx.get_rows(off.remap_view(ctx, il, m), r.selected); // i32 [1, k, 1]
                    if m == ExpertMat::Up && off.follows() {
                        // Written straight into the layer's mailbox: the host reads the step's
                        // hits and misses there (experts::offload::direct).
                        off.preset_mailbox(t, il, false);
                        // An output: the graph allocator never frees (reuses) its memory.
                        ctx.set_output(t);
                    }
                    let t = ctx.reshape(t, &[k, nt]).expect("direct ids"); // i32 [k, nt]
                    g.cb(t, &format!("ffn_moe_direct_ids{}", m.index()), il as i32)
                });
                let pred_on = std::env::var("POCKETMOE_MBOX_PRED").map_or(true, |v| v != "0");
                if let Some(next) = (off.follows() && pred_on)
                    .then(|| off.next_offloaded(il))
                    .flatten()
                {
                    // FATE: the next layer's router on this layer's FFN input, into the mailbox,
                    // which the host follows while the graph runs on.
                    let pred = predicted_logits(g, x, next, il, "ffn_moe_pred_logits"); // [n_expert, 1]

                    // Copied into the mailbox by a plain elementwise kernel.
                    let pred = ctx.scale(pred, 1.0);
                    off.preset_mailbox(pred, il, true);
                    output(g, pred);
                }
                // Read back after the step: which picks hit a slot.
                ctx.set_output(ids[0]);
                node.direct_ids = Some(ids[0].name());
                let t = ExpertTensors { w, biases };
                g.expert_ffn(&t, x, il, ids, r.selected, weights, opts)
            }
            Mode::Slots => {
                // After the anchor (the graph's last node so far), so the ids live until the
                // stop has read them (see above); one small copy kernel.
                let keep = ctx.cont(r.selected);
                g.graph
                    .build_forward(g.cb(keep, "ffn_moe_topk_kept", il as i32));
                let w = ExpertMat::ALL.map(|m| off.slot_tensor(il, m));
                let ctl = off.ctl(il);
                let (ids, mask) = (ctl.ids, ctl.mask);
                let ids = ctx.view(ids, &[k, nt], &[ids.nb()[1]], 0); // i32 [k, nt]
                let mask = ctx.view(mask, &[1, k, nt], &[mask.nb()[1], mask.nb()[2]], 0); // [1, k, nt]
                let weights = ctx.mul(weights, mask); // [1, k, nt]
                let t = ExpertTensors { w, biases };
                let out = g.expert_ffn(&t, x, il, [ids; 3], r.selected, weights, opts);
                if off.cpu_enabled(il) {
                    // The CPU channel's share, written by the step hook once the GPU's is done.
                    let gpu = g.cb(out, "ffn_moe_out_gpu", il as i32);
                    node.gpu_out = Some(gpu.name());
                    let cpu = off.ctl_cpu(il);
                    let cpu = ctx.view(cpu, &[g.hp.n_embd as i64, nt], &[cpu.nb()[1]], 0); // [n_embd, nt]
                    g.cb(ctx.add(gpu, cpu), "ffn_moe_out", il as i32)
                } else {
                    out
                }
            }
        };
        self.nodes.borrow_mut().push(node);
        out
    }
}

/// FATE: layer `next`'s router on layer `il`'s FFN input `x`, named `name` (a graph node, so it
/// runs where the graph does).
fn predicted_logits<'a>(
    g: &GraphBuilder<'a>,
    x: Tensor<'a>,
    next: usize,
    il: usize,
    name: &str,
) -> Tensor<'a> {
    let logits = g.ctx.mul_mat(g.wl(next, "ffn_gate_inp.weight"), x);
    g.cb(logits, name, il as i32)
}

/// Marks `t` a graph output (never reused by the allocator: the hook reads it) and adds it to
/// the graph now, so it is computed right after the router.
fn output<'a>(g: &GraphBuilder<'a>, t: Tensor<'a>) -> Tensor<'a> {
    g.ctx.set_output(t);
    g.graph.build_forward(t);
    t
}
