//! The offloaded routed experts of a model: the host store (raw quantised GGUF blocks, copied
//! once into page-locked memory), the GPU slot cache (per layer, same layout as the GGUF tensor,
//! one expert per slot), the prefill staging area, the per-layer control tensors the graph reads
//! (slot ids, masks), and the copy engine.
//!
//! Why copy into pinned buffers rather than register the mmap: `cudaHostRegister` on a
//! file-backed read-only mapping needs the read-only flag and pins page-cache pages the kernel
//! may still want to write back or drop; a one-time copy (≈ 5 GB/s) gives plain anonymous
//! page-locked memory ggml already knows how to allocate (its CUDA host buffer type), the CPU
//! kernels read it as ordinary host memory, and the file map can be dropped afterwards, so host
//! RSS ≈ the experts' bytes, not twice that.
//!
//! Invariants: slot `s` of layer `il`, matrix `m`, holds exactly the bytes of expert
//! `cache.slot_of⁻¹(s)` of `blk.il.<m>` (copied whole, never dequantised); staging holds, for a
//! prefill step, every expert the step uses at its real expert index.
//!
//! The code is split by job, each a child module (they alone see the fields): `load` and
//! `alloc` (memory), `addrs` (where an expert lies), `tensors` (what graphs read), `hook` (the
//! step hook), `readback` (a stop's routing to the host), `slots` (a stop's cache
//! protocol), `prefetch` (the next layer's predicted experts), `staging` (prefill), `planner`
//! and `miss` (the CPU channel's share), `gated` (decode steps queued behind a gate) and `duel`
//! (whether a step runs gated, measured).
mod addrs;
mod alloc;
mod duel;
mod form;
mod gated;
mod gates;
mod hook;
mod load;
mod miss;
mod planner;
mod prefetch;
mod readback;
mod slots;
mod staging;
mod table;
mod tensors;
mod trace;

pub use super::mats::{ExpertMat, MATS};
pub use super::options::{Gated, Mode, OffloadOptions, TableForm};
pub use hook::StepHook;
pub use miss::MissModel;
pub use readback::predicted_experts;
pub use tensors::Ctl;

use addrs::LayerAddrs;

use super::cache::LayerCache;
use super::cpu::CpuChannel;
use super::step::{GraphNodes, Resolved};
use super::transfer::{self, Transfer};
use super::Stats;
use crate::ggml::{Backend, Context, GgmlError, GgmlType, Graph, Memory, Tensor, TensorIndex};
use crate::gguf::GgufModel;
use crate::model::Hparams;
use std::rc::Rc;

/// One matrix of one layer's experts.
#[derive(Debug, Clone)]
struct Mat {
    ty: GgmlType,
    /// [ne0, ne1, n_expert]
    ne: [i64; 3],
    /// Bytes of one expert (nb2).
    expert_bytes: usize,
}

impl Mat {
    /// Bytes a tensor of this matrix with `n` experts takes in any buffer: the data, the
    /// backend's row padding (at most 512 columns' worth, ggml-cuda) and alignment.
    fn alloc_bytes(&self, n: usize) -> usize {
        let pad = self.ty.row_size(512).unwrap_or(0) as usize;
        (self.expert_bytes * n + pad).next_multiple_of(256) + 256
    }
}

struct Layer {
    /// Per [`ExpertMat`]; `None` where the model has no such matrix (e.g. no gate).
    mats: [Option<Mat>; 3],
    /// The expert cache, one per share of the experts ([`Offload::shares`]): one, on the
    /// layer's device; with expert parallelism one per device, share `s` caching only the
    /// experts `e` with `e % shares == s`, in device `s`'s memory.
    caches: Vec<LayerCache>,
    /// Experts prefetched for this layer's next step, and all experts predicted for it.
    prefetched: Vec<u32>,
    predicted: Vec<u32>,
    /// Prefill: the step whose experts were all staged ahead of this layer's router (see
    /// `staging`), if any.
    staged_ahead: Option<u64>,
}

impl Layer {
    /// Bytes of one expert, every matrix together (what one slot holds, one copy moves).
    fn expert_bytes(&self) -> usize {
        self.mats.iter().flatten().map(|m| m.expert_bytes).sum()
    }

    /// The share (cache) expert `e` belongs to.
    fn owner(&self, e: u32) -> usize {
        e as usize % self.caches.len()
    }

    /// The cache expert `e` belongs to.
    fn cache(&self, e: u32) -> &LayerCache {
        &self.caches[self.owner(e)]
    }

    fn cache_mut(&mut self, e: u32) -> &mut LayerCache {
        let s = self.owner(e);
        &mut self.caches[s]
    }

    /// The slot holding expert `e` in its share's cache, if resident.
    fn slot(&self, e: u32) -> Option<u32> {
        self.cache(e).slot(e)
    }
}

/// The slot cache's device memory (from [`Offload::alloc_slots`]).
struct SlotArea {
    ctx: Context,
    idx: TensorIndex,
}

/// One device's part of the offload (one part on one device; in a layer split, one per device,
/// each serving the MoE layers of the blocks that device holds): its compute backend (miss copies
/// and control writes queue on its stream), its copy engine (prefetch, staging and routing
/// reads, on streams of its own), the staging and control tensors of its layers, and its slots.
struct DevPart {
    backend: Rc<Backend>,
    xfer: Box<dyn Transfer>,
    dev: Context,
    dev_idx: TensorIndex,
    slots: Option<SlotArea>,
    /// Cache slots per layer of this device's layers.
    n_slots: usize,
    /// Device bytes of staging + control + slots.
    dev_bytes: usize,
}

/// Every field is private: the child modules implement the protocol, the rest of the crate
/// goes through methods.
pub struct Offload {
    n_expert: usize,
    k: usize,
    layers: Vec<Option<Layer>>,
    opts: OffloadOptions,
    /// Tests: marks the store freed as it drops, just before `store` (see `cpu::tests`).
    #[cfg(test)]
    store_freed: super::cpu::tests::StoreFreed,
    /// Host store (+ scratch), device staging + control, device slots. The CPU channel's worker
    /// reads the store: see `cpu`.
    store: Context,
    store_idx: TensorIndex,
    /// Per device (one without a layer split); `layer_dev[il]` is layer `il`'s.
    parts: Vec<DevPart>,
    layer_dev: Vec<usize>,
    /// Shares the routed experts of a layer are cached in: 1 (on the layer's device), or with
    /// expert parallelism one per device (expert `e` in share `e % shares`, on device
    /// `e % shares`, whatever the layer's device): see [`Offload::share_device`].
    shares: usize,
    /// Host scratch for routing reads and control writes.
    scratch: usize,
    scratch_len: usize,
    /// Which region of the scratch (each `scratch_len` bytes) is in use: see `scratch_base`.
    scratch_region: usize,
    /// Page-locked room for a micro-batch's selected-id rows as the graph holds them (strided:
    /// see `step::Resolved::sel_row`), compacted on the host.
    sel_rows: usize,
    sel_rows_len: usize,
    stats: Stats,
    step: u64,
    /// Host bytes of the store.
    host_bytes: usize,
    n_embd: usize,
    /// The CPU channel, and per layer: whether it may serve the layer (no expert biases), and
    /// whether the layer's CPU-result tensor holds a non-zero result from an earlier step. Its
    /// worker reads `store`: `Offload`'s `Drop` (below) joins it before `store` is freed.
    cpu: Option<CpuChannel>,
    cpu_ok: Vec<bool>,
    cpu_dirty: Vec<bool>,
    /// Cost model of a miss on each channel (docs/design.md §4.5).
    miss: MissModel,
    /// Gated decode (`gated`): the gates the current stop opens, the next ticket not yet
    /// handed out, and the stops whose routing reads are queued (layer, read batch, what was
    /// read where), oldest first.
    gate_stop: Option<gates::GateStop>,
    /// Table form's state (`table`).
    tab: table::Tables,
    /// Gated: the next layer's prefetch, planned at this stop and not yet queued.
    planned: Option<prefetch::Prefetch>,
    /// `Gated::Auto`'s choice between the eval-hook path and gated and of how much to
    /// prefetch, measured (`duel`), with the step in flight's arm.
    duels: duel::Duels,
    gate_next: u64,
    gate_reads: std::collections::VecDeque<(usize, u64, Option<u64>, readback::Reads)>,
}

impl Drop for Offload {
    /// The CPU channel's worker reads the host store (`Offload::store`) in place: join it before
    /// any field is dropped, so the store is never freed under a job in flight, whatever the
    /// fields' declaration order.
    fn drop(&mut self) {
        drop(self.cpu.take());
        trace::flush();
    }
}

fn name(il: usize, what: &str) -> String {
    format!("off.{il}.{what}")
}

impl Offload {
    pub fn is_offloaded(&self, il: usize) -> bool {
        self.layers.get(il).is_some_and(Option::is_some)
    }

    /// The first offloaded layer after `il`.
    pub fn next_offloaded(&self, il: usize) -> Option<usize> {
        (il + 1..self.layers.len()).find(|&j| self.layers[j].is_some())
    }

    /// Whether slot-mode graphs predict the next layer's experts (FATE prefetch).
    pub fn prefetches(&self) -> bool {
        self.opts.prefetch
    }

    /// The counters so far.
    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    /// Device bytes of staging, control and slots, every device together.
    pub fn dev_bytes(&self) -> usize {
        self.parts.iter().map(|p| p.dev_bytes).sum()
    }

    /// Device bytes of staging, control and slots on device `d` (0 on one device).
    pub fn dev_bytes_on(&self, d: usize) -> usize {
        self.parts.get(d).map_or(0, |p| p.dev_bytes)
    }

    /// Devices the offload spans (1 without a layer split).
    pub fn n_devices(&self) -> usize {
        self.parts.len()
    }

    /// The device of layer `il` (0 without a layer split).
    pub fn layer_device(&self, il: usize) -> usize {
        self.layer_dev.get(il).copied().unwrap_or(0)
    }

    /// Layer `il`'s device part.
    fn part(&self, il: usize) -> &DevPart {
        &self.parts[self.layer_device(il)]
    }

    /// The share of layer `il`'s experts cached on the layer's own device (where its staging
    /// area is): its device's share under expert parallelism, else the one share.
    fn local_share(&self, il: usize) -> usize {
        if self.expert_parallel() {
            self.layer_device(il)
        } else {
            0
        }
    }

    /// Shares a layer's experts are cached in (1, or the devices under expert parallelism).
    pub fn shares(&self) -> usize {
        self.shares
    }

    /// Whether the routed experts are placed by expert id over the devices (expert
    /// parallelism): each device caches its share of every offloaded layer.
    pub fn expert_parallel(&self) -> bool {
        self.shares > 1
    }

    /// The device of share `s` of layer `il`'s experts: device `s` under expert parallelism,
    /// else the layer's.
    pub fn share_device(&self, il: usize, s: usize) -> usize {
        if self.expert_parallel() {
            s
        } else {
            self.layer_device(il)
        }
    }

    /// Layer `il`'s device's copy engine.
    fn xfer(&mut self, il: usize) -> &mut dyn Transfer {
        let d = self.layer_device(il);
        self.parts[d].xfer.as_mut()
    }

    /// Host bytes of the store.
    pub fn host_bytes(&self) -> usize {
        self.host_bytes
    }

    /// Cache slots per layer (and share): the fewest of any device that holds slots (what the
    /// slot mode can count on in every layer).
    pub fn n_slots(&self) -> usize {
        self.parts
            .iter()
            .enumerate()
            .filter(|&(d, _)| self.slot_layers_on(d).next().is_some())
            .map(|(_, p)| p.n_slots)
            .min()
            .unwrap_or(0)
    }

    /// Cache slots per layer of device `d`'s layers.
    pub fn n_slots_on(&self, d: usize) -> usize {
        self.parts.get(d).map_or(0, |p| p.n_slots)
    }

    /// The misses' cost model: rates (measured at the first decode stop that may use the CPU
    /// channel, or given) and whether the balance is on.
    pub fn miss_model(&self) -> &MissModel {
        &self.miss
    }
}

/// Tests: the fields the CPU channel's drop test reaches.
#[cfg(test)]
impl Offload {
    pub(in crate::experts) fn test_parts(
        &mut self,
    ) -> (
        &mut super::cpu::tests::StoreFreed,
        &[bool],
        Option<&mut CpuChannel>,
    ) {
        (&mut self.store_freed, &self.cpu_ok, self.cpu.as_mut())
    }
}
