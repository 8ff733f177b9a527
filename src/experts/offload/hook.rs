//! A step of the offloaded experts: its start, its times, and the eval hook that runs the
//! protocol at each stop ([`StepHook`]; the graph's nodes it stops at: `step::GraphNodes`).
use super::*;
use crate::experts::step::Stop;
use crate::ggml::EvalHook;

impl Offload {
    /// Starts a forward pass of `n_tokens` (advances the policies' clock).
    pub fn begin_step(&mut self, n_tokens: usize) {
        // A CPU job left by a step that failed half-way must not be joined into this one.
        if let Some(cpu) = self.cpu.as_mut().filter(|c| c.pending().is_some()) {
            let _ = cpu.finish();
        }
        self.miss.set_gated(false); // run_gated says otherwise
        self.tab.step = false; // begin_table_step says otherwise
        self.step += 1;
        self.stats.steps += 1;
        self.stats.tokens += n_tokens as u64;
        let st = &self.stats;
        let decode = self.miss.setpoint_auto && self.mode(n_tokens) == Mode::Slots;
        self.miss.step_mark = decode.then_some((st.h2d_bytes, st.cpu_channel_s()));
    }

    /// Starts a step of `nodes` through the eval hook: a graph in table form first brings the
    /// expert tables in step with the cache (`table`).
    pub fn begin_hooked(&mut self, nodes: &GraphNodes) -> Result<(), GgmlError> {
        if nodes.flags.is_empty() {
            return Ok(());
        }
        self.begin_table_step(nodes, false)
    }

    /// Adds a step's graph compute time (stops included); after a decode step, the outer loop
    /// of the slack controller's setpoint takes the step's channel shares (`MissModel::
    /// steer_setpoint`; unless `POCKETMOE_SLACK_TARGET_US` fixes the setpoint).
    pub fn add_step_time(&mut self, compute_s: f64) {
        if let Some(choice) = self.duels.step_time(compute_s) {
            self.stats.record_duel(choice);
        }
        self.stats.compute_s += compute_s;
        if let Some((h2d, cpu_s)) = self.miss.step_mark.take().filter(|_| compute_s > 0.0) {
            let st = &self.stats;
            let (pcie, cpu) = crate::experts::stats::busy_shares(
                st.h2d_bytes - h2d,
                st.cpu_channel_s() - cpu_s,
                compute_s,
                self.miss.pcie_bw,
            );
            self.miss.steer_setpoint(pcie, cpu);
        }
    }

    /// Counts a graph stop that began at `t0`.
    pub(super) fn count_stop(&mut self, t0: std::time::Instant) {
        self.stats.stops += 1;
        self.stats.hook_s += t0.elapsed().as_secs_f64();
        super::trace::done();
    }
}

/// The eval hook for one forward pass of `n_tokens`.
pub struct StepHook<'a> {
    pub off: &'a mut Offload,
    pub nodes: &'a GraphNodes,
    pub n_tokens: usize,
}

impl EvalHook for StepHook<'_> {
    fn wants(&mut self, id: usize) -> bool {
        match self.nodes.by_anchor.get(&id) {
            Some((Stop::Routing, _)) => true,
            // Asked after this layer's routing stop: only a layer whose misses went to the CPU
            // channel stops again.
            Some((Stop::GpuOut, n)) => {
                self.off.cpu.as_ref().and_then(|c| c.pending()) == Some(n.il)
            }
            None => false,
        }
    }

    fn computed(&mut self, id: usize) -> Result<(), GgmlError> {
        let t0 = std::time::Instant::now();
        let (stop, n) = self.nodes.by_anchor[&id];
        tracing::trace!(layer = n.il, ?stop, "hook stop");
        let kind = match stop {
            Stop::Routing => super::trace::Kind::Hook,
            Stop::GpuOut => super::trace::Kind::GpuOut,
        };
        super::trace::begin(self.off.step, n.il, kind);
        super::trace::with(|r, now| r.routed = now);
        let r = match stop {
            Stop::Routing => self.off.on_routing(&n, self.n_tokens),
            Stop::GpuOut => self.off.on_gpu_out(n.il, self.n_tokens),
        };
        self.off.count_stop(t0);
        r
    }
}
