//! Gated decode: a decode step's graph queued ahead of the stops that feed it.
//!
//! A stop of the eval-callback path (`hook`) waits for the device, runs the protocol, and only
//! then lets the scheduler launch the graph's next piece: on the H200 the launch of a piece
//! (a CUDA graph of ~30 nodes) costs ~40 us of host time, during which the GPU has nothing to
//! do (docs/bench-h200.md, 2026-12-03 late: ~95 us of GPU idle per stop, 48 stops a token).
//! Here the host cuts the graph at the routing stops itself and queues the pieces one stop
//! ahead, behind a gate on the device ([`Transfer::close_gate`]): while the GPU computes piece
//! `s`, the host launches piece `s + 1`, which waits. At stop `s` the host waits only for that
//! stop's routing reads (queued on the read stream behind an event after piece `s`), plans,
//! queues the miss copies and the control on the copy stream, and opens the gate to `s + 1`
//! behind them; prefetches for the next layer follow the open and do not hold the GPU. The graph
//! is also cut after each layer's GPU experts where the CPU channel's share joins (in the layers
//! the channel may serve): a layer with a CPU job opens the gate to its GPU experts at the
//! routing stop, so they run beside the job, and its join opens the rest once the share is
//! written; a layer without one opens both at the stop. (Joining the job at the routing stop,
//! before the open, left the GPU idle through every job: at uniform routing the planner then
//! priced the CPU out, 30% of misses against the hook path's 75%, and the step lost 7%,
//! docs/bench-h200.md 2026-12-05; `POCKETMOE_GATED_JOIN=0` keeps that cut for an A/B.)
//!
//! Invariants:
//! - Piece `c > 0` waits for ticket `base + c`; cut `s` opens ticket `base + s + 1` (a routing
//!   stop whose layer has no CPU job opens `base + s + 2`, its join's, at once). A gate passes
//!   at any ticket at least its own; tickets only grow, step after step. On any error every ticket of the step is opened before the
//!   step waits for the device, so nothing queued waits for ever.
//! - Nothing a queued piece reads is written on the compute stream after the piece was queued
//!   (the slot and control writes go on the copy stream, before the open).
//! - Used only where ggml-cuda computes a piece without synchronising the host (quantised
//!   experts: its `mul_mat_id` runs as mat-vec or MMQ kernels; see [`Offload::can_gate`]), on
//!   one device, for slot-mode micro-batches (decode: one token, or one per request), with
//!   every input of the graph in device memory (the engine allocates it so and checks that the
//!   scheduler made no copies), and from a graph's third step on (its first two go through the
//!   eval hook, so ggml-cuda has warmed up, captured its pieces and grown its memory pool, whose
//!   growth may synchronise the device).
use super::transfer::READ_BATCHES;
use super::*;
use std::time::Instant;

/// Where a gated step cuts the graph at the CPU channel's joins (so a layer's GPU experts run
/// beside its CPU job): `POCKETMOE_GATED_JOIN` = 1 at every join (the default), 2 only in the
/// layers that had a CPU job in the step before (fewer pieces to launch where jobs are rare),
/// 0 at none (the routing stop joins the job before it opens the gate, and the GPU idles
/// through it), for an A/B on the device.
fn join_cuts() -> u8 {
    static JOIN: std::sync::OnceLock<u8> = std::sync::OnceLock::new();
    *JOIN.get_or_init(|| {
        std::env::var("POCKETMOE_GATED_JOIN")
            .ok()
            .and_then(|v| v.parse().ok())
            .filter(|&v| v <= 2)
            .unwrap_or(1)
    })
}

/// Where a gated step's graph is cut: after a layer's routing (a stop: read, plan, open), or
/// after its GPU experts, where the CPU channel's share joins.
#[derive(Clone, Copy)]
enum Cut {
    Routing(Resolved),
    Join(usize),
}

/// The cuts of a step's graph in compute order: (node index, cut); `recent[il]`: whether layer
/// `il` had a CPU job in the step before.
fn cuts(nodes: &GraphNodes, recent: &[bool]) -> Vec<(usize, Cut)> {
    let mut cuts: Vec<(usize, Cut)> = nodes
        .routing
        .iter()
        .map(|&(i, r)| (i, Cut::Routing(r)))
        .collect();
    let mode = join_cuts();
    let joins = nodes
        .joins
        .iter()
        .filter(|&&(_, il)| mode == 1 || (mode == 2 && recent[il]));
    cuts.extend(joins.map(|&(i, il)| (i, Cut::Join(il))));
    cuts.sort_by_key(|c| c.0);
    cuts
}

/// Pieces the host queues ahead of the stop it serves, where queued compute waits for its gate:
/// 1, or `POCKETMOE_GATED_AHEAD` (1 to 3: the read batches in flight are at most
/// [`READ_BATCHES`]), read once, for an A/B on the device.
fn ahead() -> usize {
    static AHEAD: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *AHEAD.get_or_init(|| {
        std::env::var("POCKETMOE_GATED_AHEAD")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(1)
            .clamp(1, READ_BATCHES - 1)
    })
}

impl Offload {
    /// Whether a step of `n_tokens` over `nodes` can run gated: a slot-mode micro-batch on one
    /// device whose copy engine can gate; on a device that queues ahead, only with quantised
    /// experts (ggml-cuda's `mul_mat_id` then runs without synchronising the host: mat-vec
    /// kernels up to 8 tokens, MMQ beyond; of other types it may copy the ids to the host and
    /// wait, which behind a closed gate would never end).
    pub fn can_gate(&self, nodes: &GraphNodes, n_tokens: usize) -> bool {
        let Some(part) = self.parts.first().filter(|_| self.parts.len() == 1) else {
            return false;
        };
        let quantised = || {
            self.layers
                .iter()
                .flatten()
                .flat_map(|l| l.mats.iter().flatten())
                .all(|m| m.ty.is_quantized())
        };
        let wanted = match self.opts.gated {
            Gated::Off => false,
            Gated::Always => true,
            Gated::Auto => part.xfer.queues_ahead() && self.job_rate <= Gated::AUTO_MAX_JOBS,
        };
        wanted
            && n_tokens <= self.opts.max_slot_tokens
            && !nodes.routing.is_empty()
            && nodes.routing.iter().all(|(_, r)| r.mode == Mode::Slots)
            && part.xfer.can_gate()
            && (!part.xfer.queues_ahead() || quantised())
    }

    /// Whether a gated graph could gain here: never with gating off; with it on always; auto
    /// only on one device that queues compute ahead (on the CPU nothing is queued ahead, so
    /// there is nothing to gain).
    pub fn gating_wanted(&self) -> bool {
        match self.opts.gated {
            Gated::Off => false,
            Gated::Always => true,
            Gated::Auto => self.parts.len() == 1 && self.parts[0].xfer.queues_ahead(),
        }
    }

    /// Computes an allocated step graph gated (see the module's doc); returns once the device
    /// has run all of it.
    pub fn run_gated(
        &mut self,
        graph: &Graph<'_>,
        nodes: &GraphNodes,
        n_tokens: usize,
    ) -> Result<(), GgmlError> {
        let backend = self.parts[0].backend.clone();
        self.stats.gated_steps += 1;
        // (`cpu_dirty`: the layer's CPU-result tensor holds the last step's share.)
        let cuts = cuts(nodes, &self.cpu_dirty);
        let n_pieces = cuts.len() + 1;
        let base = self.gate_next;
        self.gate_next += n_pieces as u64;
        self.gate_reads.clear();
        let r = self.gated_pieces(&backend, graph, &cuts, n_tokens, base);
        if r.is_err() {
            let x = self.parts[0].xfer.as_mut();
            let _ = x.mark_copies();
            let _ = x.open_gate(base + n_pieces as u64 - 1);
        }
        backend.synchronize();
        self.gate_reads.clear();
        self.gate_ticket = None;
        self.gate_join_cut = false;
        r
    }

    fn gated_pieces(
        &mut self,
        backend: &Backend,
        graph: &Graph<'_>,
        cuts: &[(usize, Cut)],
        n_tokens: usize,
        base: u64,
    ) -> Result<(), GgmlError> {
        let n_nodes = graph.n_nodes();
        let n_pieces = cuts.len() + 1;
        // Piece c: the nodes after cut c - 1 up to and including cut c's node.
        let piece = |c: usize| {
            let i0 = if c == 0 { 0 } else { cuts[c - 1].0 + 1 };
            let i1 = if c + 1 == n_pieces {
                n_nodes
            } else {
                cuts[c].0 + 1
            };
            (i0, i1)
        };
        let ahead = if self.parts[0].xfer.queues_ahead() {
            ahead()
        } else {
            0
        };
        // Serving cut s, the host has queued every piece up to the one ending at the `ahead`-th
        // routing cut after s (a join's pieces ride along with its layer's routing).
        let routing_at: Vec<usize> = (0..cuts.len())
            .filter(|&c| matches!(cuts[c].1, Cut::Routing(_)))
            .collect();
        let upto = |s: usize| {
            let next = routing_at.partition_point(|&c| c <= s);
            routing_at
                .get(next + ahead - 1)
                .copied()
                .unwrap_or(n_pieces - 1)
        };
        let mut queued = 0;
        for s in 0..=cuts.len() {
            let last = if ahead == 0 { s } else { upto(s).max(s) };
            while queued < n_pieces && queued <= last {
                let c = queued;
                if c > 0 {
                    self.parts[0].xfer.close_gate(base + c as u64)?;
                }
                let (i0, i1) = piece(c);
                if i0 < i1 {
                    backend.compute_nodes_async(graph, i0, i1)?;
                }
                if let Some((_, Cut::Routing(n))) = cuts.get(c) {
                    self.parts[0].xfer.reads_after_compute()?;
                    let reads = self.queue_reads(n, n_tokens)?;
                    let batch = self.parts[0].xfer.end_batch()?;
                    self.gate_reads.push_back((n.il, batch, reads));
                }
                queued += 1;
            }
            let ticket = base + s as u64 + 1;
            match cuts.get(s) {
                None => break,
                Some((_, Cut::Routing(n))) => {
                    let (il, batch, reads) = self.gate_reads.pop_front().expect("queued above");
                    assert_eq!(il, n.il, "gated stops out of order");
                    // Waits for the piece before the stop (the GPU's work) and its reads: not a
                    // stop's own time, which counts from here as the hook path's does (from its
                    // callback).
                    self.parts[0].xfer.wait_batch(batch)?;
                    let t0 = Instant::now();
                    let routing = self.take_reads(n, n_tokens, &reads)?;
                    let join_next =
                        matches!(cuts.get(s + 1), Some((_, Cut::Join(j))) if *j == n.il);
                    self.gate_ticket = Some(ticket);
                    self.gate_join_cut = join_next;
                    self.routed(n, n_tokens, &routing)?;
                    self.gate_join_cut = false;
                    let x = self.parts[0].xfer.as_mut();
                    if self.gate_ticket.take().is_some() {
                        // Slot mode opens the gate itself; should a stop not have, open it here.
                        x.mark_copies()?;
                        x.open_gate(ticket)?;
                    }
                    if join_next && self.cpu.as_ref().and_then(|c| c.pending()) != Some(n.il) {
                        // No CPU job in this layer: the join's gate opens with the stop's.
                        x.open_gate(ticket + 1)?;
                    }
                    self.count_stop(t0);
                }
                Some((_, Cut::Join(il))) => {
                    if self.cpu.as_ref().and_then(|c| c.pending()) == Some(*il) {
                        let t0 = Instant::now();
                        self.on_gpu_out(*il, n_tokens)?;
                        self.parts[0].xfer.open_gate(ticket)?;
                        self.count_stop(t0);
                    }
                }
            }
        }
        Ok(())
    }
}
