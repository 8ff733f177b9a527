//! The offloaded experts' side of the graph seam (docs/design.md §4.2): [`OffloadedExperts`]
//! implements `graph`'s [`RoutedExperts`] for one graph build. An offloaded layer's experts run
//! from cache slots with remapped ids and a mask (decode) or from the staging area (prefill);
//! the layer is recorded as a [`MoeNode`] for
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
        // Slots and staging read the routing at the stop right after it. Its memory must not
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
            hit: None,
            act: opts.act,
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
            Mode::Slots if off.table_form(nt as usize) => {
                // The picks copied out of the router's argsort and kept (an output, so the
                // graph's later nodes never overwrite them: a gated stop reads them while the
                // GPU may run on), the last routing node: the stop's anchor.
                let kept = g.cb(ctx.cont(r.selected), "ffn_moe_topk_kept", il as i32);
                ctx.set_output(kept);
                g.graph.build_forward(kept);
                node.anchor = kept.name();
                node.selected = kept.name();
                let hit = hit_nodes(g, off, il, kept);
                node.hit = Some(hit.map(|t| t.name()));
                let [ids, mask, _] = hit;
                let ids = ctx.reshape(ids, &[k, nt]).expect("ids reshape"); // i32 [k, nt]
                let weights = ctx.mul(weights, mask); // [1, k, nt]
                let weights = g.cb(weights, "ffn_moe_weights_share", il as i32);
                let w = ExpertMat::ALL.map(|m| off.slot_tensor(il, m, 0));
                let t = ExpertTensors { w, biases };
                let out = g.expert_ffn(&t, x, il, [ids; 3], r.selected, weights, opts);
                with_cpu(g, off, il, out, &mut node)
            }
            Mode::Slots => {
                // After the anchor (the graph's last node so far), so the ids live until the
                // stop has read them (see above); one small copy kernel.
                let keep = ctx.cont(r.selected);
                g.graph
                    .build_forward(g.cb(keep, "ffn_moe_topk_kept", il as i32));
                let share = |s: usize| {
                    let w = ExpertMat::ALL.map(|m| off.slot_tensor(il, m, s));
                    let ctl = off.ctl(il, s);
                    let (ids, mask) = (ctl.ids, ctl.mask);
                    let ids = ctx.view(ids, &[k, nt], &[ids.nb()[1]], 0); // i32 [k, nt]
                    let mask = ctx.view(mask, &[1, k, nt], &[mask.nb()[1], mask.nb()[2]], 0); // [1, k, nt]
                    let weights = ctx.mul(weights, mask); // [1, k, nt]
                    let weights = g.cb(weights, "ffn_moe_weights_share", il as i32);
                    let t = ExpertTensors { w, biases };
                    g.expert_ffn(&t, x, il, [ids; 3], r.selected, weights, opts)
                };
                let out = if off.expert_parallel() {
                    // Each device computes its share of the picks on its own slots (the other
                    // picks weigh 0 there); the layer's device adds the shares.
                    let mut sum: Option<Tensor<'_>> = None;
                    for s in 0..off.shares() {
                        let before = g.graph.n_nodes();
                        let part = share(s);
                        g.graph.build_forward(part);
                        on_device(g, before, off.share_device(il, s));
                        sum = Some(match sum {
                            None => part,
                            Some(acc) => g.cb(ctx.add(acc, part), "ffn_moe_out_shares", il as i32),
                        });
                    }
                    g.cb(sum.expect("two or more shares"), "ffn_moe_out", il as i32)
                } else {
                    share(0)
                };
                with_cpu(g, off, il, out, &mut node)
            }
        };
        self.nodes.borrow_mut().push(node);
        out
    }
}

/// Adds the CPU channel's share of layer `il` to the GPU experts' sum `out` where the channel
/// may serve the layer (written by the step hook once the GPU's share is done).
fn with_cpu<'a>(
    g: &GraphBuilder<'a>,
    off: &'a Offload,
    il: usize,
    out: Tensor<'a>,
    node: &mut MoeNode,
) -> Tensor<'a> {
    if !off.cpu_enabled(il) {
        return out;
    }
    let gpu = g.cb(out, "ffn_moe_out_gpu", il as i32);
    node.gpu_out = Some(gpu.name());
    let cpu = off.ctl_cpu(il);
    let nt = g.batch.n_tokens as i64;
    let cpu = g
        .ctx
        .view(cpu, &[g.hp.n_embd as i64, nt], &[cpu.nb()[1]], 0); // [n_embd, nt]
    g.cb(g.ctx.add(gpu, cpu), "ffn_moe_out", il as i32)
}

/// Table form (docs/design.md §4.4b): each pick's slot id and residency gathered from layer
/// `il`'s expert table on the device (`selected`: the picks, contiguous), right after the routing
/// stop's anchor, and the hit flag:
/// the step's base plus the resident picks, which reaches the stop's target exactly when every
/// pick is resident (a gated step then runs on without the host). Returns [slot ids i32
/// [1, k, nt], mask f32 [1, k, nt], flag f32 [1, 1]]: the first two outputs (the host reads them,
/// and writes them where a stop had misses), the flag a copy into the layer's flag word;
/// computed mask first, flag last.
fn hit_nodes<'a>(
    g: &GraphBuilder<'a>,
    off: &'a Offload,
    il: usize,
    selected: Tensor<'a>,
) -> [Tensor<'a>; 3] {
    let ctx = g.ctx;
    let nt = g.batch.n_tokens as i64;
    let (tab, on) = off.table(il);
    let k = g.hp.n_expert_used as i64;
    // Every token reads the same table: the (contiguous) picks as one row.
    let picks = ctx.reshape(selected, &[k * nt]).expect("picks reshape");
    let gather = |t: Tensor<'a>| {
        ctx.reshape(ctx.get_rows(t, picks), &[1, k, nt])
            .expect("gathered reshape")
    };
    // Residency before slot ids: a prefetch's table lands slot ids first, residency after
    // (`table`), so a pick read resident has its slot id in place when its id is read.
    let mask = g.cb(gather(on), "ffn_moe_hit_mask", il as i32);
    let ids = g.cb(gather(tab), "ffn_moe_hit_ids", il as i32);
    let picks = ctx.reshape(mask, &[k * nt]).expect("mask reshape");
    // Into the layer's own flag word, never a graph output's memory: a gated step queues the
    // wait for it ahead, while the nodes before it may still be writing memory the allocator
    // shares between them and an output (`Offload::hit_flag`).
    let count = ctx.add(ctx.sum_rows(picks), off.hit_base());
    let flag = g.cb(ctx.cpy(count, off.hit_flag(il)), "ffn_moe_hit", il as i32);
    for t in [mask, ids] {
        ctx.set_output(t);
        g.graph.build_forward(t);
    }
    g.graph.build_forward(flag);
    [ids, mask, flag]
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
    let logits = g.ctx.mul_mat(g.t(g.blk(next).moe().router), x);
    g.cb(logits, name, il as i32)
}

/// Tags the graph's nodes from index `from` on (one share's expert FFN, just added) to run on
/// device `d`: their names get the suffix `@d` ([`crate::graph::tag_device`]), which the layer
/// split's assignment reads before the block index.
fn on_device(g: &GraphBuilder<'_>, from: usize, d: usize) {
    for i in from..g.graph.n_nodes() {
        let t = g.graph.node(i);
        t.set_name(&crate::graph::tag_device(&t.name(), d));
    }
}

/// Marks `t` a graph output (never reused by the allocator: the hook reads it) and adds it to
/// the graph now, so it is computed right after the router.
fn output<'a>(g: &GraphBuilder<'a>, t: Tensor<'a>) -> Tensor<'a> {
    g.ctx.set_output(t);
    g.graph.build_forward(t);
    t
}
