//! How the offloaded experts run: the options the engine picks and the mode of a micro-batch.
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
    /// Where a GPU runs the step and a core is spare: the CPU channel's hand-overs spin instead
    /// of sleeping (docs/design.md §4.5).
    pub cpu_spin: bool,
    /// Where a GPU runs the step: the slack controller corrects the CPU channel's start cost
    /// (`MissModel::observe`, docs/design.md §4.5).
    pub slack_control: bool,
    /// Expert parallelism over a layer split's devices: every device caches and computes a
    /// share of every offloaded layer's routed experts (expert `e` on device `e % n`), so a
    /// decode step's misses cross every device's PCIe link at once; `false`: each device
    /// caches the experts of its own blocks.
    pub expert_parallel: bool,
    /// Whether decode steps on one device run gated where its copy engine can gate
    /// (`offload::gated`).
    pub gated: Gated,
    /// Gated decode of up to 8 tokens in table form (`offload::table`): the device passes a
    /// stop whose picks all hit on its own.
    pub table: TableForm,
    /// Gated control form in split form (`EngineOptions::gated_split`).
    pub gated_split: bool,
    /// The CPU standing in for the GPU only (tests): copies land as late as the copy engine's
    /// contract allows and their destinations hold NaN bytes until then (`host_copy`).
    pub late_copies: bool,
    /// Layers below this one are not offloaded: their routed experts are in the weights
    /// (`EngineOptions::resident_moe_layers`).
    pub resident_below: usize,
}

/// Gated decode (`offload::gated`, docs/design.md §4.4a): never, always where it can run, or
/// (the default) on a device that queues compute ahead (CUDA), whichever way measures fastest
/// on the box (`offload::duel`: the eval-hook path, gated, the hook path prefetching half its
/// budget and, where a step may take it, gated in table form take turns for 24 steps each of a
/// micro-batch size, then the fastest runs 512).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gated {
    Off,
    Auto,
    Always,
}

impl Gated {
    /// From `POCKETMOE_GATED`: `1` always, `0` never, else auto.
    pub fn from_env() -> Self {
        match std::env::var("POCKETMOE_GATED").as_deref() {
            Ok("1") => Gated::Always,
            Ok("0") => Gated::Off,
            _ => Gated::Auto,
        }
    }
}

/// Gated decode in table form (`offload::table`, docs/design.md §4.4b): never (the default
/// until the duel with it is measured on a GPU: built 2026-12-07 without device time), always
/// where a step can take it, or as one more arm of `Gated::Auto`'s duel (`offload::duel`),
/// which runs it where it measures fastest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TableForm {
    Off,
    Auto,
    Always,
}

impl TableForm {
    /// From `POCKETMOE_TABLE`: `1` always, `auto` a duel arm, else (`0`, unset) never.
    pub fn from_env() -> Self {
        match std::env::var("POCKETMOE_TABLE").as_deref().map(str::trim) {
            Ok("1") => TableForm::Always,
            Ok("auto") => TableForm::Auto,
            _ => TableForm::Off,
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
}
