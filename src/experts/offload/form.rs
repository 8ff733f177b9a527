//! How a step runs (docs/design.md §4.4a): chosen before its graph is built (`Gated::Auto`'s
//! duel arm, and with it the table form: [`Offload::begin_form`]), then, the graph allocated,
//! whether it runs gated ([`Offload::can_gate`]) or through the eval hook (`hook`).
use super::*;

impl Offload {
    /// Chooses how a step of `n_tokens` runs, before its graph is built: with `Gated::Auto`,
    /// a step that may gate takes the duel's arm (`duel`; the table form's only where the step
    /// may take it and `OffloadOptions::table` leaves it to the duel). Returns whether the
    /// step's graph is in table form ([`Offload::table_form`]).
    pub fn begin_form(&mut self, n_tokens: usize) -> bool {
        self.duels.discard();
        if self.opts.gated == Gated::Auto
            && self.gating_wanted()
            && n_tokens <= self.opts.max_slot_tokens
            && self.mode(n_tokens) == Mode::Slots
        {
            let table = self.opts.table == TableForm::Auto && self.table_fits(n_tokens);
            self.duels.choose(n_tokens, table);
            if self.duels.deciding() {
                self.stats.duel_steps += 1;
            }
        }
        self.table_form(n_tokens)
    }

    /// Whether a step of `n_tokens` over `nodes` can run gated: a slot-mode micro-batch on one
    /// device whose copy engine can gate; on a device that queues ahead, only with quantised
    /// experts (ggml-cuda's `mul_mat_id` then runs without synchronising the host: mat-vec
    /// kernels up to 8 tokens, MMQ beyond; of other types it may copy the ids to the host and
    /// wait, which behind a closed gate would never end). Under `Gated::Auto` a step that can
    /// runs as the duel of the ways to run it says (`duel`: gated or not, how much to prefetch;
    /// measured on the box). `warm`: the graph ran its warm-up steps through the eval hook
    /// (`step::GraphNodes::runs`); a warm-up step is not counted in the duel. A step that
    /// cannot gate once warm is: its arm runs through the eval hook here, and is timed so (an
    /// arm not counted there would hold the duel on itself for good).
    pub fn can_gate(&mut self, nodes: &GraphNodes, n_tokens: usize, warm: bool) -> bool {
        if !warm {
            self.duels.discard();
            return false;
        }
        if !self.could_gate(nodes, n_tokens) {
            return false;
        }
        if self.opts.gated != Gated::Auto {
            return true;
        }
        // Chosen before the graph was built (`begin_form`), whose form follows it.
        let Some(arm) = self.duels.pending() else {
            return true;
        };
        if arm.prefetch < 1.0 {
            self.stats.less_prefetch_steps += 1;
        }
        arm.gated
    }

    /// Whether `nodes`' graph of `n_tokens` can run gated (`can_gate`'s conditions but the
    /// graph's warm-up): the engine allocated it so (`GraphNodes::gateable`) and the offload
    /// can.
    fn could_gate(&self, nodes: &GraphNodes, n_tokens: usize) -> bool {
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
        nodes.gateable
            && self.gating_wanted()
            && n_tokens <= self.opts.max_slot_tokens
            && !nodes.routing.is_empty()
            && (nodes.flags.is_empty() || nodes.flags.len() == nodes.routing.len())
            && nodes.routing.iter().all(|(_, r)| r.mode == Mode::Slots)
            && part.xfer.can_gate()
            && (!part.xfer.queues_ahead() || quantised())
    }

    /// Whether a gated graph could gain here: never with gating off; with it on always; auto
    /// only on one device that queues compute ahead (on the CPU nothing is queued ahead, so
    /// there is nothing to gain).
    pub fn gating_wanted(&self) -> bool {
        if self.expert_parallel() {
            // A gated stop opens one device's gate; a layer's experts run on every device.
            return false;
        }
        match self.opts.gated {
            Gated::Off => false,
            Gated::Always => true,
            Gated::Auto => self.parts.len() == 1 && self.parts[0].xfer.queues_ahead(),
        }
    }
}
