//! A step's graph: built from the architecture's graph builder with the step's inputs (and the
//! offloaded experts where they are offloaded), and computed through the scheduler — with the
//! offload step hook when the graph stops (docs/design.md §4.4).
use super::*;

impl Engine {
    /// Builds the graph for a micro-batch of `n` tokens at `n_past` (attending `n_kv` cache rows
    /// from row `kv_lo`).
    /// `n_out > 0`: logits only for the `n_out` rows named by the `inp_out_ids` input (`batch`).
    /// `embd`: the output (named [`out_name`]) is the final normed hidden state, not logits.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn build_graph(
        &self,
        n: usize,
        n_kv: usize,
        kv_lo: usize,
        last_only: bool,
        n_out: usize,
        embd: bool,
        arch: &ArchStep,
    ) -> Result<(OwnedGraph, Vec<crate::experts::step::MoeNode>), EngineError> {
        let size = graph_size(&self.hp, self.offload.as_ref().map_or(1, Offload::shares));
        let window = self.hp.swa.window as usize;
        let mut nodes = Vec::new();
        let offloaded = self.offload.as_ref().map(Offload::graph_experts);
        let experts: &dyn RoutedExperts = match &offloaded {
            Some(o) => o,
            None => &Resident,
        };
        let g = OwnedGraph::build(Context::new(size, size)?, size, |ctx, graph| {
            let input = |ty, ne: &[i64], name: &'static str| -> Result<_, EngineError> {
                let t = ctx.new_tensor(ty, ne)?.set_name(name);
                ctx.set_input(t);
                Ok(t)
            };
            let t_tok = input(GgmlType::I32, &[n as i64], "inp_tokens")?; // [n]
            let t_pos = input(GgmlType::I32, &[n as i64], "inp_pos")?; // [n]
            let t_mask = input(GgmlType::F16, &[n_kv as i64, n as i64], "attn_inp_kq_mask")?; // [n_kv, n]
            let t_idx = input(GgmlType::I64, &[n as i64], "inp_kv_idxs")?; // [n]
            let t_mask_swa = if window > 0 {
                Some(input(
                    GgmlType::F16,
                    &[n_kv as i64, n as i64],
                    "attn_inp_kq_mask_swa",
                )?) // [n_kv, n]
            } else {
                None
            };
            let t_out = match n_out {
                0 => None,
                k => Some(input(GgmlType::I32, &[k as i64], "inp_out_ids")?), // [n_out]
            };
            let mut keep: Vec<String> = Vec::new();
            let embd_rows = if self.gated_shape(n) {
                let t = input(
                    GgmlType::F32,
                    &[self.hp.n_embd as i64, n as i64],
                    "inp_embd",
                )?;
                keep.push("inp_embd".into());
                Some(t)
            } else {
                None
            };
            let dsv4_inputs = arch.inputs(ctx, n, &mut keep)?;
            let batch = BatchInputs {
                tokens: t_tok,
                pos: t_pos,
                mask: t_mask,
                mask_swa: t_mask_swa,
                kv_idx: t_idx,
                n_tokens: n,
                n_kv,
                kv_lo,
                last_only,
                out_ids: t_out,
                embd,
                dsv4: dsv4_inputs,
                embd_rows,
            };
            let g = GraphBuilder {
                ctx,
                w: &self.weights,
                kv: &self.kv,
                hp: &self.hp,
                batch,
                graph,
                experts,
            };
            let logits = arch::build(&g).map_err(|msg| EngineError::Model {
                path: String::new(),
                msg,
            })?;
            g.finish(logits.set_name(out_name(embd)));
            keep.extend(
                [
                    "inp_tokens",
                    "inp_pos",
                    "attn_inp_kq_mask",
                    "inp_kv_idxs",
                    out_name(embd),
                ]
                .map(String::from),
            );
            if t_mask_swa.is_some() {
                keep.push("attn_inp_kq_mask_swa".into());
            }
            if t_out.is_some() {
                keep.push("inp_out_ids".into());
            }
            nodes = offloaded.as_ref().map_or_else(Vec::new, |o| o.take_nodes());
            for n in &nodes {
                keep.push(n.anchor.clone());
                keep.push(n.selected.clone());
                keep.push(n.weights.clone());
                keep.push(n.input.clone());
                keep.extend(n.pred.clone());
                keep.extend(n.gpu_out.clone());
                keep.extend(n.hit.iter().flatten().cloned());
            }
            Ok::<_, EngineError>(keep)
        })?;
        Ok((g, nodes))
    }
}

/// The name of a step graph's output: `logits`, or `embd` (the final normed hidden state).
pub(crate) fn out_name(embd: bool) -> &'static str {
    if embd {
        "embd"
    } else {
        "logits"
    }
}

/// Computes an allocated graph of `n` tokens: through the offload step hook when routed experts
/// are offloaded (see `experts::step`), straight through the scheduler otherwise.
pub(crate) fn run_graph(
    sched: &mut Sched,
    offload: Option<&mut Offload>,
    g: &OwnedGraph,
    nodes: &GraphNodes,
    n: usize,
) -> Result<(), EngineError> {
    match offload {
        Some(off) => {
            off.begin_step(n);
            let t0 = std::time::Instant::now();
            nodes.runs.set(nodes.runs.get().saturating_add(1));
            if off.can_gate(nodes, n, nodes.runs.get() > 2) {
                tracing::trace!(tokens = n, "step: gated");
                let in_a_row = nodes.gated_in_a_row.get();
                nodes.gated_in_a_row.set(in_a_row.saturating_add(1));
                off.run_gated(
                    &g.graph(),
                    nodes,
                    n,
                    in_a_row < crate::experts::step::CAPTURE_STEPS,
                )?;
            } else if nodes.has_stops() {
                nodes.gated_in_a_row.set(0);
                tracing::trace!(tokens = n, "step: through the eval hook");
                off.begin_hooked(nodes)?;
                let mut hook = StepHook {
                    off: &mut *off,
                    nodes,
                    n_tokens: n,
                };
                sched.compute_hooked(&g.graph(), &mut hook)?;
            } else {
                // No stop: one piece, without the eval callback (ggml-cuda may then replay it
                // as a CUDA graph).
                sched.compute(&g.graph())?;
            }
            tracing::trace!("step done");
            off.add_step_time(t0.elapsed().as_secs_f64());
        }
        None => sched.compute(&g.graph())?,
    }
    Ok(())
}

/// Nodes a step's graph may hold: the architecture's most per block
/// ([`arch::Arch::nodes_per_block`]), and the head's.
/// Nodes a step's graph may make: the architecture's per block, plus, with the routed experts
/// computed in `shares` parts (expert parallelism: one per device), each further part's per
/// block ([`expert_share_nodes`]).
pub(super) fn graph_size(hp: &Hparams, shares: usize) -> usize {
    let per_share = shares.saturating_sub(1) * expert_share_nodes(hp);
    (hp.n_layer * (arch::of(hp.arch).nodes_per_block + per_share) + 256).max(2048)
}

/// Graph nodes one more part of a block's routed experts makes at most (expert parallelism):
/// the input's reshape, the mask product, up/gate/down, the activation, up to three bias adds,
/// the weighted product, `k` views and `k - 1` adds of the sum over the picks, and the add of
/// the parts: `2k + 10`, and two spare.
pub fn expert_share_nodes(hp: &Hparams) -> usize {
    2 * hp.n_expert_used as usize + 12
}

/// f16 causal mask [n_kv, n]: token t (position p = n_past + t) sees cache positions j <= p with
/// p - j < window (llama.cpp's standard sliding window); the padding beyond is masked too.
pub(super) fn causal_mask_f16(n_past: usize, n: usize, n_kv: usize, window: usize) -> Vec<u16> {
    // Row fills, not per-element pushes: at depth 8192 a 2048-token micro-batch's mask has 25M
    // entries, and building it element by element cost tens of ms per micro-batch.
    let (zero, neg_inf) = (half::f16::ZERO.to_bits(), half::f16::NEG_INFINITY.to_bits());
    let mut m = vec![neg_inf; n_kv * n];
    for (t, row) in m.chunks_exact_mut(n_kv.max(1)).enumerate().take(n) {
        let p = n_past + t;
        let lo = (p + 1).saturating_sub(window);
        let hi = (p + 1).min(n_kv);
        if lo < hi {
            row[lo..hi].fill(zero);
        }
    }
    m
}
