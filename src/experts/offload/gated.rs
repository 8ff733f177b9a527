//! Gated decode: a decode step's graph queued ahead of the stops that feed it.
//!
//! A stop of the eval-callback path (`hook`) waits for the device, runs the protocol, and only
//! then lets the scheduler launch the graph's next piece: on the H200 the launch of a piece
//! (a CUDA graph of ~30 nodes) costs ~40 us of host time, during which the GPU has nothing to
//! do (docs/bench-h200.md, 2026-12-03 late: ~95 us of GPU idle per stop, 48 stops a token).
//! Here the host cuts the graph at the routing stops itself and queues each stop's pieces one
//! stop ahead (`gates::ahead`; none in a graph's first gated steps, which ggml-cuda may
//! capture), behind gates on the device. The graph is in table form (`table`): after a stop's
//! routing it gathers each pick's slot id and residency from the layer's expert table and
//! computes a hit flag. Per stop `c` two pieces: up to the routing (behind the previous
//! stop's flag, [`Transfer::close_word`], and the ticket its prefetch's bytes open), then the
//! gathers and the flag (behind a ticket, [`Transfer::close_gate`], which the previous stop
//! opens once its prefetch left this layer's table consistent). Where every pick is resident
//! (a prefetched expert counts once its slot is assigned) the flag opens its own gate and the
//! GPU runs on: the host reads the stop (routing reads queued on the read stream behind an
//! event after the flag) only to count it and prefetch. Where one is not, the host plans the
//! misses, queues their copies, the table and the slot ids and mask over the gathered ones on
//! the copy stream, and opens the flag behind them; prefetches for the next layer follow and
//! do not hold the GPU. A layer whose misses went to the CPU channel joins the CPU's share
//! before it opens the flag (the piece behind it adds the share), so there is no second stop,
//! and the GPU waits through the job: hence `Gated::Auto` measures whether to gate
//! (docs/design.md §4.4a, §4.4b).
//!
//! Invariants:
//! - Stop `c`'s gathers wait for ticket `Tickets::gathers(c)`, its experts for `experts(c)` (table
//!   form: and its flag), in split form the add of its CPU share for `joined(c)`: the step's start
//!   opens the first stop's two, stop `s` opens stop `s + 1`'s gathers behind the next layer's
//!   table and its experts behind the bytes prefetched into it (control form: its own experts'
//!   behind its copies, `joined(s)` after the join). Opened in order, so opening one never opens
//!   another early. Tickets and flags only grow, step after step. On any error every ticket and
//!   flag of the step is opened before the step waits for the device: nothing waits for ever.
//! - A hit flag is its layer's own word (`Offload::hit_flag`), which only its flag node and the
//!   gate's open write: the wait for it is queued ahead of the node that computes it, so a word
//!   other nodes of the step share (a graph output's memory may be) could pass it early
//!   (`step::GraphNodes::shared_flag` turns gating off for such a graph).
//! - Nothing a queued piece reads is written on the compute stream after the piece was queued
//!   (the slot, table and control writes go on the copy stream, before the open); what the
//!   host reads back after a flag is a graph output, never overwritten by the nodes that may
//!   run before the host has read it.
//! - Used only where ggml-cuda computes a piece without synchronising the host (quantised
//!   experts: its `mul_mat_id` runs as mat-vec or MMQ kernels; see [`Offload::can_gate`]), on
//!   one device, for table-form micro-batches (decode: one token, or one per request, up to 8),
//!   with every input of the graph in device memory (the engine allocates it so and checks that
//!   the scheduler made no copies), and from a graph's third step on (its first two go through
//!   the eval hook, so ggml-cuda has warmed up, captured its pieces and grown its memory pool,
//!   whose growth may synchronise the device).
use super::gates::{ahead, capture_guard, table_kernel, GateStop, Open, Tickets};
use super::prefetch::Pre;
use super::trace;
use super::*;
use crate::experts::step::HitAddrs;
use crate::experts::transfer::Lookup;
use std::time::Instant;

impl Offload {
    /// Computes an allocated step graph gated (see the module's doc); returns once the device
    /// has run all of it. `capturing`: ggml-cuda may capture this step's pieces as CUDA graphs
    /// (the graph's first gated steps in a row, [`crate::experts::step::CAPTURE_STEPS`]): then
    /// nothing is queued ahead of the stop being served, so no compute waits behind a closed
    /// gate while ggml-cuda captures, instantiates or updates a graph (which may wait for the
    /// device; `POCKETMOE_CAPTURE_GUARD=0` queues ahead there too, to see it hang).
    pub fn run_gated(
        &mut self,
        graph: &Graph<'_>,
        nodes: &GraphNodes,
        n_tokens: usize,
        capturing: bool,
    ) -> Result<(), GgmlError> {
        let backend = self.parts[0].backend.clone();
        self.stats.gated_steps += 1;
        self.stats.capture_steps += u64::from(capturing);
        self.miss.set_gated(true);
        let n_stops = nodes.routing.len();
        let tickets = Tickets(self.gate_next);
        self.gate_next += Tickets::count(n_stops);
        self.gate_reads.clear();
        let guarded = capturing && capture_guard();
        if guarded {
            // Nothing queued ahead: slower than the arm runs once captured; not counted.
            self.duels.discard();
        }
        let ahead = if !self.parts[0].xfer.queues_ahead() || guarded {
            0
        } else {
            ahead()
        };
        tracing::trace!(capturing, ahead, "gated step");
        let r = self
            .gated_pieces(&backend, graph, nodes, n_tokens, tickets, ahead)
            .and_then(|()| self.gates_settled());
        tracing::trace!(ok = r.is_ok(), "gated step queued, waiting for the device");
        if let Err(e) = &r {
            // Said before the wait below, which hangs should the device be stuck elsewhere.
            tracing::warn!("gated step failed, opening every gate and waiting for the device: {e}");
            // Nothing queued may wait for ever: every gate and flag opened.
            let target = self.hit_target(self.k * n_tokens);
            let x = self.parts[0].xfer.as_mut();
            let _ = x.mark_copies();
            let _ = x.open_gate(tickets.end(n_stops));
            for (_, n) in &nodes.routing {
                if let Some(h) = n.hit {
                    let _ = x.open_word(h.flag, target);
                }
            }
        }
        backend.synchronize();
        tracing::trace!("gated step: the device is done");
        self.scratch_region = 0;
        self.planned = None;
        self.gate_reads.clear();
        self.gate_stop = None;
        r
    }

    /// Table form's lookup of stop `n` (`h`: where the graph puts its gathers and flag) for
    /// [`Transfer::table_lookup`]: the picks the stop's anchor kept (table form's selected ids
    /// are that copy, contiguous), the layer's table, the step's base.
    fn lookup(&self, n: &Resolved, h: HitAddrs, n_tokens: usize) -> Lookup {
        let (tab, on) = self.table(n.il);
        Lookup {
            picks: n.sel_addr,
            n: self.k * n_tokens,
            n_expert: self.n_expert,
            tab: tab.data_addr(),
            on: on.data_addr(),
            ids: h.ids,
            mask: h.mask,
            base: self.hit_base().data_addr(),
            flag: h.flag,
        }
    }

    /// Whether every ticket the step closed has been opened: a closed one never opened would
    /// hold the device's compute for ever (checked before the step waits for it).
    fn gates_settled(&self) -> Result<(), GgmlError> {
        let t = self.parts[0].xfer.gate_tally();
        if t.closed > t.opened {
            return Err(GgmlError::Tensor {
                name: "gated step".into(),
                msg: format!(
                    "ticket {} closed, the highest opened {}",
                    t.closed, t.opened
                ),
            });
        }
        Ok(())
    }

    /// Waits for read batch `id` of stop `s` (layer `il`; `what` it reads); one that stalls
    /// (`Transfer::wait_batch`) errors naming the stop and what the device holds now: the gate's
    /// counter and the hit flag `flag` its compute waits on (against `target`).
    fn wait_stop(
        &mut self,
        id: u64,
        s: usize,
        il: usize,
        what: &str,
        flag: Option<usize>,
        target: u32,
    ) -> Result<(), GgmlError> {
        let base = self.tab.base();
        let x = self.parts[0].xfer.as_mut();
        x.wait_batch(id).map_err(|e| {
            let (word, counter) = x.peek(flag);
            let counted = word.map(|w| f32::from_bits(w) - base);
            let want = f32::from_bits(target) - base;
            GgmlError::Tensor {
                name: format!("gated stop {s} (layer {il})"),
                msg: format!(
                    "waiting for its {what}: {e}; now the gate's counter is {counter:?}, the flag \
                     its compute waits on counts {counted:?} of {want} picks"
                ),
            }
        })
    }

    fn gated_pieces(
        &mut self,
        backend: &Backend,
        graph: &Graph<'_>,
        nodes: &GraphNodes,
        n_tokens: usize,
        t: Tickets,
        ahead: usize,
    ) -> Result<(), GgmlError> {
        let stops = &nodes.routing;
        let n_stops = stops.len();
        let table = !nodes.flags.is_empty();
        let target = if table {
            self.begin_table_step(nodes, true)?;
            // The first stop's gathers and experts wait for what the step's start queued.
            Open::Ticket(t.experts(0)).open_behind_copies(self.parts[0].xfer.as_mut())?;
            self.hit_target(self.k * n_tokens)
        } else {
            0
        };
        // The gate stop `c` opens to its experts: its hit flag (behind the ticket the previous
        // stop opens once its prefetch's bytes landed), or (control form) a ticket.
        let gate = |c: usize| match stops[c].1.hit {
            Some(h) => Open::Word {
                flag: h.flag,
                target,
                landed: t.experts(c),
            },
            None => Open::Ticket(t.experts(c)),
        };
        // Where the nodes after stop `c` start: after its flag, or its routing; in split form
        // (control form with a CPU channel) where its CPU share's add starts, too.
        let after = |c: usize| if table { nodes.flags[c] } else { stops[c].0 } + 1;
        // Split form: asked for (`POCKETMOE_GATED_SPLIT=1`), or the duel's arm for this step.
        let on = !table && (self.opts.gated_split || self.duels.pending().is_some_and(|a| a.split));
        self.stats.split_steps += u64::from(on && nodes.gpu_outs.iter().any(Option::is_some));
        let split = |c: usize| nodes.gpu_outs[c].filter(|_| on);
        let mut queued = 0;
        for s in 0..=n_stops {
            // Stop c's pieces: after the previous stop (behind its gate) up to its routing,
            // then in table form, behind its gathers' ticket, its gathers and flag; after the
            // last stop, the rest of the graph.
            while queued <= n_stops && queued <= s + ahead {
                let c = queued;
                queued += 1;
                let from = if c == 0 {
                    0
                } else {
                    let x = self.parts[0].xfer.as_mut();
                    gate(c - 1).close(x)?;
                    match split(c - 1) {
                        Some(out) => {
                            backend.compute_nodes_async(graph, after(c - 1), out + 1)?;
                            x.close_gate(t.joined(c - 1))?;
                            out + 1
                        }
                        None => after(c - 1),
                    }
                };
                tracing::trace!(piece = c, "gated: queueing a stop's pieces");
                let Some((anchor, n)) = stops.get(c) else {
                    backend.compute_nodes_async(graph, from, graph.n_nodes())?;
                    continue;
                };
                backend.compute_nodes_async(graph, from, anchor + 1)?;
                self.parts[0].xfer.reads_after_compute()?;
                self.scratch_region = c;
                let reads = self.queue_reads(n, n_tokens)?;
                let lookup = n
                    .hit
                    .filter(|_| table_kernel())
                    .map(|h| self.lookup(n, h, n_tokens));
                let x = self.parts[0].xfer.as_mut();
                let routed = x.end_batch()?;
                let flagged = match n.hit {
                    Some(h) => {
                        x.close_gate(t.gathers(c))?;
                        // The gathers and the flag: one kernel of ours where asked for and
                        // possible, else the graph's nodes.
                        if !lookup.map_or(Ok(false), |l| x.table_lookup(&l))? {
                            backend.compute_nodes_async(graph, anchor + 1, after(c))?;
                        }
                        x.reads_after_compute()?;
                        x.read(reads.flag_at(), h.flag, 4)?;
                        Some(x.end_batch()?)
                    }
                    None => None,
                };
                self.gate_reads.push_back((n.il, routed, flagged, reads));
                tracing::trace!(piece = c, "gated: queued");
            }
            let Some((_, n)) = stops.get(s) else {
                break;
            };
            let (il, routed, flagged, reads) = self.gate_reads.pop_front().expect("queued above");
            assert_eq!(il, n.il, "gated stops out of order");
            // Waits for the piece before the stop (the GPU's work) and its reads: not a stop's
            // own time, which counts from here as the hook path's does (from its callback).
            let prev = s
                .checked_sub(1)
                .and_then(|p| stops[p].1.hit)
                .map(|h| h.flag);
            tracing::trace!(
                stop = s,
                layer = n.il,
                "gated stop: waiting for the routing"
            );
            trace::begin(self.step, n.il, trace::Kind::Gated);
            self.wait_stop(routed, s, n.il, "routing", prev, target)?;
            trace::with(|r, now| r.routed = now);
            let t0 = Instant::now();
            self.scratch_region = s;
            let mut routing = self.take_reads(n, n_tokens, &reads)?;
            if let Some(flagged) = flagged {
                // What the flag must have counted, before the prefetch (which may admit into this
                // very layer where it is the only offloaded one).
                let cached = self.cached_picks(n.il, &routing.sel);
                // The next layer's prefetch first: its gate (the next stop's gathers') opens on
                // it while the GPU computes this stop's flag, experts and the next attention.
                let pre = (s + 1 < n_stops).then(|| Pre {
                    gathers: t.gathers(s + 1),
                    experts: t.experts(s + 1),
                });
                self.planned = self.plan_prefetch(n.il, &routing.pred, pre)?;
                let flag = n.hit.map(|h| h.flag);
                tracing::trace!(stop = s, "gated stop: waiting for the hit flag");
                self.wait_stop(flagged, s, n.il, "hit flag", flag, target)?;
                // SAFETY: the flag's read (4 bytes into the live scratch, 4-aligned) has landed.
                let got = unsafe { *(reads.flag_at() as *const u32) };
                let picks = routing.sel.len();
                routing.fast = self.hit_read(n.il, got, target, cached, picks)?;
                self.stats.hit_stops += u64::from(routing.fast);
                trace::with(|r, _| r.fast = routing.fast);
            }
            self.gate_stop = Some(GateStop {
                open: gate(s),
                fast: routing.fast,
                joined: split(s).map(|_| t.joined(s)),
            });
            tracing::trace!(stop = s, fast = routing.fast, "gated stop: the protocol");
            self.routed(n, n_tokens, &routing)?;
            if let Some(g) = self.gate_stop.take() {
                // Slot mode opens the gate itself; should a stop not have, open it here.
                let x = self.parts[0].xfer.as_mut();
                x.mark_copies()?;
                g.open_all(x)?;
            }
            if let Some(p) = self.planned.take() {
                let landed = self.queue_prefetch(p)?;
                self.open_pre(n.il, landed)?;
            }
            self.count_stop(t0);
            tracing::trace!(stop = s, "gated stop: opened");
        }
        Ok(())
    }
}
