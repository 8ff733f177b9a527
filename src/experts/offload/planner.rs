//! The CPU channel's share of a decode step's misses: the cost model that picks them, and the
//! join of its result (docs/design.md §4.5).
use super::*;

impl Offload {
    /// Whether the CPU channel may take some of this step's misses in layer `n.il`: a slot-mode
    /// micro-batch (decode: one token, or one per concurrent request).
    pub(super) fn cpu_candidate(&self, n: &Resolved, n_tokens: usize) -> bool {
        n.mode == Mode::Slots && n_tokens <= self.opts.max_slot_tokens && self.cpu_enabled(n.il)
    }

    /// Which of `used`'s misses the CPU computes: greedy, each miss to the channel that would
    /// finish it first (copy engine at `pcie_bw`, CPU at `cpu_bw` plus a fixed start cost), so
    /// both channels end at about the same time.
    pub(super) fn plan_cpu(&self, il: usize, used: &[u32]) -> Vec<u32> {
        let layer = self.layers[il].as_ref().expect("offloaded layer");
        let bytes = layer.expert_bytes() as f64;
        let (cp, cc) = (bytes / self.pcie_bw, bytes / self.cpu_bw);
        let (mut t_pcie, mut t_cpu) = (0.0, CPU_START_S);
        let mut on_cpu = Vec::new();
        // More experts than slots: the excess must run on the CPU.
        let mut forced = used.len().saturating_sub(layer.cache.n_slots());
        for &e in used.iter().filter(|&&e| layer.cache.slot(e).is_none()) {
            if forced > 0 || t_cpu + cc < t_pcie + cp {
                forced = forced.saturating_sub(1);
                t_cpu += cc;
                on_cpu.push(e);
            } else {
                t_pcie += cp;
            }
        }
        on_cpu
    }

    /// The GPU's experts of layer `il` are done (a stop made only when the CPU channel has this
    /// layer's job): put the CPU channel's share in the tensor the graph adds next.
    pub(super) fn on_gpu_out(&mut self, il: usize, n_tokens: usize) -> Result<(), GgmlError> {
        let n = self.n_embd * n_tokens;
        let Some(cpu) = self.cpu.as_mut().filter(|c| c.pending() == Some(il)) else {
            return Ok(()); // nothing of this layer's to join (waiting would never end)
        };
        let t0 = std::time::Instant::now();
        let out = cpu.finish().map_err(|msg| GgmlError::Tensor {
            name: format!("CPU experts of layer {il}"),
            msg,
        })?;
        self.stats.wait_cpu_s += t0.elapsed().as_secs_f64();
        self.cpu_dirty[il] = true;
        assert_eq!(out.len(), n, "CPU result size");
        // Through ggml's own (synchronous) upload, not the copy engine: waiting on the copy
        // engine here would also wait for the next layer's prefetches.
        self.ctl_cpu(il)
            .write_bytes_at(0, bytemuck::cast_slice(&out))
    }
}

/// Fixed cost of a CPU-channel job (thread wake-up, graph build), seconds.
const CPU_START_S: f64 = 40e-6;
