//! How the offloaded experts run: the options the engine picks, how direct decode admits its
//! misses, and the mode of a micro-batch.
use super::policy::PolicyKind;

#[derive(Debug, Clone)]
pub struct OffloadOptions {
    pub policy: PolicyKind,
    /// Largest micro-batch decoded through the slot cache; larger ones use staging.
    pub max_slot_tokens: usize,
    /// Largest micro-batch (sizes the host scratch: 16 B per expert pick).
    pub n_ubatch: usize,
    /// FATE-style prefetch: predict layer L+1's experts from layer L's FFN input.
    pub prefetch: bool,
    /// Threads of the CPU channel for misses (0: misses are always copied).
    pub cpu_threads: usize,
    /// Cost-model bandwidths (PCIe copy, CPU channel), bytes/s; `None`: measured on the box at
    /// the first decode stop that may use the CPU channel.
    pub bandwidths: Option<(f64, f64)>,
    /// Balance a step's misses between the copy engine and the CPU channel, counting the copy
    /// engine's backlog and leaving part of the predicted experts to the CPU instead of
    /// prefetching them all (docs/design.md §4.5); `false`: the planner before 2026-12-02.
    pub balance: bool,
    /// Single-token decode without graph stops where the device allows it ([`Mode::Direct`]);
    /// `false` keeps the stop after every offloaded router ([`Mode::Slots`]).
    pub direct: bool,
    /// How [`Mode::Direct`] steps admit their misses into the cache, when they never stop.
    pub admit: Admit,
    /// [`Mode::Direct`] stops at every this many offloaded layers (the first, then every
    /// `stop_every`-th) to prefetch for the layers up to the next stop; 0: no stops.
    pub stop_every: usize,
}

/// How a direct (stop-free) decode step's misses enter the cache, after the step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admit {
    /// Copies queued before the next step's compute (it waits for them on the device): the
    /// next step finds them resident.
    Sync,
    /// Copies overlap the next step, which still reads those experts in place; they count as
    /// resident from the step after.
    Async,
    /// No admissions: the cache keeps what prefill and multi-token steps put in it.
    Off,
    /// The step never stops: the GPU writes each layer's routing and the next layer's
    /// predicted router logits into page-locked mailboxes, the host follows and prefetches
    /// predicted experts into free slots while the graph runs; victims are freed between steps.
    Prefetch,
}

impl Admit {
    pub fn parse(s: &str) -> Result<Self, String> {
        match s {
            "sync" => Ok(Self::Sync),
            "async" => Ok(Self::Async),
            "off" => Ok(Self::Off),
            "prefetch" => Ok(Self::Prefetch),
            _ => Err(format!(
                "admission mode {s:?}: expected sync, async, off or prefetch"
            )),
        }
    }
}

/// How a micro-batch's routed experts run (chosen when its graph is built).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// From the slot cache, with expert ids remapped to slots.
    Slots,
    /// From the staging area, every used expert copied in (prefill).
    Staging,
    /// Single-token decode with no graph stop (CUDA): a device-side table maps each selected
    /// expert to its slot, or, on a miss, to its bytes in the page-locked host store, which the
    /// GPU reads in place over PCIe (unified addressing). The cache is updated after the step
    /// (`experts::offload::direct`).
    Direct,
}
