//! The step's side of the offloaded experts: its start, its times, and the step hook's entry
//! points (`step::StepHook`), each counting its stop.
use super::*;

impl Offload {
    /// Starts a forward pass of `n_tokens` (advances the policies' clock).
    pub fn begin_step(&mut self, n_tokens: usize) {
        // A CPU job left by a step that failed half-way must not be joined into this one.
        if let Some(cpu) = self.cpu.as_mut().filter(|c| c.pending().is_some()) {
            let _ = cpu.finish();
        }
        self.step += 1;
        self.stats.steps += 1;
        self.stats.tokens += n_tokens as u64;
    }

    /// Adds a step's time: on the device (compute) and on the host around it (direct decode).
    pub fn add_step_time(&mut self, compute_s: f64, direct_s: f64) {
        self.stats.compute_s += compute_s;
        self.stats.direct_s += direct_s;
    }

    /// The layer whose CPU-channel job is in flight.
    pub(super) fn cpu_pending(&self) -> Option<usize> {
        self.cpu.as_ref().and_then(|c| c.pending())
    }

    /// Counts a graph stop that began at `t0`.
    pub(super) fn count_stop(&mut self, t0: std::time::Instant) {
        self.stats.stops += 1;
        self.stats.hook_s += t0.elapsed().as_secs_f64();
    }

    /// The step hook's entry points (`step::StepHook`).
    pub(in crate::experts) fn hook_wants_gpu_out(&self, il: usize) -> bool {
        self.cpu_pending() == Some(il)
    }

    pub(in crate::experts) fn hook_direct_stop(
        &mut self,
        d: &DirectStop,
        t0: std::time::Instant,
    ) -> Result<(), GgmlError> {
        let r = self.on_direct_stop(d);
        self.count_stop(t0);
        r
    }

    pub(in crate::experts) fn hook_routing(
        &mut self,
        n: &Resolved,
        n_tokens: usize,
        t0: std::time::Instant,
    ) -> Result<(), GgmlError> {
        let r = self.on_routing(n, n_tokens);
        self.count_stop(t0);
        r
    }

    pub(in crate::experts) fn hook_gpu_out(
        &mut self,
        il: usize,
        n_tokens: usize,
        t0: std::time::Instant,
    ) -> Result<(), GgmlError> {
        let r = self.on_gpu_out(il, n_tokens);
        self.count_stop(t0);
        r
    }
}
