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
use super::cache::LayerCache;
use super::policy::PolicyKind;
use super::transfer::{self, Transfer};
use super::Stats;
use crate::ggml::{Backend, Context, GgmlError, GgmlType, Memory, Tensor, TensorIndex};
use crate::gguf::GgufModel;
use crate::model::Hparams;
use std::rc::Rc;

/// The routed-expert matrices, in the order the graph uses them: `blk.N.<mat>.weight` are the
/// tensors of role `Role::RoutedExperts`, the non-resident ones (tested in `model::arch::tests`).
pub const MATS: [&str; 3] = ["ffn_up_exps", "ffn_gate_exps", "ffn_down_exps"];

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
    /// Cost-model bandwidths (PCIe copy, CPU channel), bytes/s; `None`: the defaults.
    pub bandwidths: Option<(f64, f64)>,
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
    /// (`experts::direct`).
    Direct,
}

/// One matrix of one layer's experts.
#[derive(Debug, Clone)]
pub(super) struct Mat {
    pub ty: GgmlType,
    /// [ne0, ne1, n_expert]
    pub ne: [i64; 3],
    /// Bytes of one expert (nb2).
    pub expert_bytes: usize,
}

impl Mat {
    /// Bytes a tensor of this matrix with `n` experts takes in any buffer: the data, the
    /// backend's row padding (at most 512 columns' worth, ggml-cuda) and alignment.
    fn alloc_bytes(&self, n: usize) -> usize {
        let pad = self.ty.row_size(512).unwrap_or(0) as usize;
        (self.expert_bytes * n + pad).next_multiple_of(256) + 256
    }
}

pub(super) struct Layer {
    /// `None` where the model has no such matrix (e.g. no gate).
    pub mats: [Option<Mat>; 3],
    pub cache: LayerCache,
    /// Experts prefetched for this layer's next step, and all experts predicted for it.
    pub prefetched: Vec<u32>,
    pub predicted: Vec<u32>,
    /// Prefill: the step whose experts were all staged ahead of this layer's router (see
    /// `Offload::stage_ahead`), if any.
    pub staged_ahead: Option<u64>,
    /// Direct mode, per matrix: the expert id that addresses expert 0 in the host store
    /// relative to the slot tensor (`(store - slots) / expert_bytes`); `None` when the layer
    /// cannot run direct.
    pub direct_base: Option<[Option<i32>; 3]>,
    /// Direct mode: admissions whose copies may still be in flight (expert, slot, step).
    pub pending: Vec<(u32, u32, u64)>,
    /// Direct mode: misses of this step copied in at this layer's own stop.
    pub copied_at_stop: Vec<u32>,
}

pub struct Offload {
    pub(super) n_expert: usize,
    pub(super) k: usize,
    pub(super) layers: Vec<Option<Layer>>,
    pub(crate) opts: OffloadOptions,
    /// Tests: marks the store freed as it drops, just before `store` (see `cpu::tests`).
    #[cfg(test)]
    pub(super) store_freed: super::cpu::tests::StoreFreed,
    /// Host store (+ scratch), device staging + control, device slots. The CPU channel's worker
    /// reads the store: see `cpu`.
    store: Context,
    store_idx: TensorIndex,
    dev: Context,
    dev_idx: TensorIndex,
    slots: Option<(Context, TensorIndex)>,
    /// Host scratch for routing reads and control writes.
    pub(super) scratch: usize,
    /// Page-locked host copy of the direct-mode id table (`off.remap`), then room for the
    /// routing read-back of every layer of a direct step.
    pub(super) mirror: usize,
    pub(super) mirror_len: usize,
    /// Every offloaded layer can run [`Mode::Direct`] (set by `alloc_slots`).
    pub(super) direct_ready: bool,
    /// [`Admit::Prefetch`]: page-locked mailboxes (per layer: k up-matrix ids, then n_expert
    /// predicted logits) and the raw handle of a device buffer the nodes writing them name.
    pub(super) mailbox: usize,
    pub(super) mailbox_owner: usize,
    pub(super) scratch_len: usize,
    pub(super) xfer: Box<dyn Transfer>,
    /// The compute backend: miss copies and control writes queue on its stream.
    pub(super) backend: Rc<Backend>,
    pub stats: Stats,
    pub(super) step: u64,
    /// Device bytes of staging + control + slots.
    pub dev_bytes: usize,
    /// Host bytes of the store.
    pub host_bytes: usize,
    pub n_slots: usize,
    pub(super) n_embd: usize,
    /// The CPU channel, and per layer: whether it may serve the layer (no expert biases), and
    /// whether the layer's CPU-result tensor holds a non-zero result from an earlier step. Its
    /// worker reads `store`: `Offload`'s `Drop` (in `cpu.rs`) joins it before `store` is freed.
    pub(super) cpu: Option<super::cpu::CpuChannel>,
    pub(super) cpu_ok: Vec<bool>,
    pub(super) cpu_dirty: Vec<bool>,
    /// Cost model, bytes/s: PCIe copies, and the CPU channel (fixed at load: the options or the
    /// defaults; docs/design.md §4.5).
    pub(super) pcie_bw: f64,
    pub(super) cpu_bw: f64,
}

fn name(il: usize, what: &str) -> String {
    format!("off.{il}.{what}")
}

impl Offload {
    /// Copies every routed expert of `file` into the host store of `backend`'s device, and
    /// allocates staging and control tensors (slots come later: [`Offload::alloc_slots`]).
    pub fn load(
        file: &GgufModel,
        hp: &Hparams,
        backend: &Rc<Backend>,
        opts: OffloadOptions,
        progress: &dyn Fn(u64, u64),
    ) -> Result<Self, GgmlError> {
        let (n_expert, k) = (hp.n_expert as usize, hp.n_expert_used as usize);
        let n_layer = hp.n_layer_decode();
        let mut layers = Vec::with_capacity(n_layer);
        let store = Context::new(n_layer * 3 + 1, 0)?;
        let mut pairs = Vec::new();
        for il in 0..n_layer {
            let mut mats: [Option<Mat>; 3] = [None, None, None];
            for (m, mat) in MATS.iter().enumerate() {
                let Some(t) = file.tensor(&format!("blk.{il}.{mat}.weight")) else {
                    continue;
                };
                let ne = [t.ne[0] as i64, t.ne[1] as i64, t.ne[2] as i64];
                let st = store
                    .new_tensor(t.ty, &ne)?
                    .set_name(&format!("blk.{il}.{mat}.weight"));
                mats[m] = Some(Mat {
                    ty: t.ty,
                    ne,
                    expert_bytes: st.nb()[2],
                });
                pairs.push((st, t));
            }
            layers.push(if mats.iter().any(Option::is_some) {
                Some(Layer {
                    mats,
                    cache: LayerCache::new(il, n_expert, 0, &opts.policy),
                    prefetched: Vec::new(),
                    predicted: Vec::new(),
                    staged_ahead: None,
                    direct_base: None,
                    pending: Vec::new(),
                    copied_at_stop: Vec::new(),
                })
            } else {
                None
            });
        }
        let host_bytes: usize = layers
            .iter()
            .flatten()
            .flat_map(|l| l.mats.iter().flatten())
            .map(|m| m.alloc_bytes(n_expert))
            .sum();
        let buf = store.new_buffer(backend, Memory::Host, host_bytes)?;
        let mut off = 0;
        for (t, _) in &pairs {
            off = buf.place(*t, off)?;
        }
        let total = host_bytes as u64;
        let mut done = 0;
        for (t, info) in &pairs {
            t.write_bytes(file.tensor_data(info))?;
            file.release(info);
            done += info.n_bytes;
            progress(done, total);
        }
        drop(pairs);
        // Scratch (see `step::ScratchLayout`): selected ids + weights (k per token, whole
        // micro-batch), the prefetch prediction and control (ids + mask) of a slot micro-batch,
        // and its FFN input.
        let t_max = opts.max_slot_tokens;
        let scratch_len = 4
            * (2 * (k * opts.n_ubatch.max(t_max)).next_multiple_of(64)
                + (n_expert * t_max).next_multiple_of(64)
                + 2 * (k * t_max).next_multiple_of(64))
            + 4 * hp.n_embd as usize * t_max
            + 1024;
        let scratch_buf = store.new_buffer(backend, Memory::Host, scratch_len)?;
        let scratch = scratch_buf.base_addr();

        // Device: one staging area as large as the largest layer's experts, and control tensors.
        let dev = Context::new(n_layer * 6 + 2, 0)?;
        let stage_bytes = layers
            .iter()
            .flatten()
            .map(|l| {
                l.mats
                    .iter()
                    .flatten()
                    .map(|m| m.alloc_bytes(n_expert))
                    .sum::<usize>()
            })
            .max()
            .unwrap_or(0);
        let ctl_bytes = (4 * k * t_max.max(1)).next_multiple_of(256);
        let n_embd = hp.n_embd as usize;
        let cpu_bytes = (4 * n_embd * t_max.max(1)).next_multiple_of(256);
        let n_moe = layers.iter().flatten().count();
        // Two staging areas, alternating between consecutive offloaded layers, so the next
        // layer's experts can be copied in while this one computes.
        let stage_bufs = [
            dev.new_buffer(backend, Memory::Device, stage_bytes)?,
            dev.new_buffer(backend, Memory::Device, stage_bytes)?,
        ];
        let ctl_buf =
            dev.new_buffer(backend, Memory::Device, (2 * ctl_bytes + cpu_bytes) * n_moe)?;
        ctl_buf.clear(0);
        // Direct mode's id table: per layer and matrix, i32 [n_expert] (slot, or store offset).
        let remap_bytes = 4 * n_expert * 3 * n_layer;
        let remap_buf = dev.new_buffer(backend, Memory::Device, remap_bytes + 256)?;
        let remap = dev
            .new_tensor(GgmlType::I32, &[n_expert as i64, 3 * n_layer as i64])?
            .set_name("off.remap");
        remap_buf.place(remap, 0)?;
        // Host side: the table, the cells prefetch flips copy from, and the read-back of a
        // step's routing (selected and up-matrix ids, k each per layer).
        let mirror_bytes = 2 * remap_bytes + 8 * k * n_layer + 256;
        let mirror_buf = store.new_buffer(backend, Memory::Host, mirror_bytes)?;
        let mirror = mirror_buf.base_addr();
        let mailbox_buf =
            store.new_buffer(backend, Memory::Host, 4 * (k + n_expert) * n_layer + 256)?;
        let (mailbox, mailbox_owner) = (mailbox_buf.base_addr(), remap_buf.raw_addr());
        let mut ctl_off = 0;
        for (i_moe, (il, l)) in layers
            .iter()
            .enumerate()
            .filter(|(_, l)| l.is_some())
            .enumerate()
        {
            let Some(l) = l else { continue };
            let stage_buf = stage_bufs[i_moe % 2];
            let mut off = 0;
            for (m, mat) in l.mats.iter().enumerate() {
                let Some(mat) = mat else { continue };
                let t = dev
                    .new_tensor(mat.ty, &mat.ne)?
                    .set_name(&name(il, &format!("stage{m}")));
                off = stage_buf.place(t, off)?;
            }
            let ids = dev
                .new_tensor(GgmlType::I32, &[k as i64, t_max.max(1) as i64])?
                .set_name(&name(il, "ids"));
            ctl_buf.place(ids, ctl_off)?;
            let mask = dev
                .new_tensor(GgmlType::F32, &[1, k as i64, t_max.max(1) as i64])?
                .set_name(&name(il, "mask"));
            ctl_buf.place(mask, ctl_off + ctl_bytes)?;
            let cpu = dev
                .new_tensor(GgmlType::F32, &[n_embd as i64, t_max.max(1) as i64])?
                .set_name(&name(il, "cpu"));
            ctl_buf.place(cpu, ctl_off + 2 * ctl_bytes)?;
            ctl_off += 2 * ctl_bytes + cpu_bytes;
        }
        // The CPU channel reads the store directly; layers with expert biases stay on the GPU.
        let cpu_ok: Vec<bool> = (0..n_layer)
            .map(|il| {
                layers[il].is_some()
                    && MATS
                        .iter()
                        .all(|m| file.tensor(&format!("blk.{il}.{m}.bias")).is_none())
            })
            .collect();
        let cpu = (opts.cpu_threads > 0 && cpu_ok.iter().any(|&b| b)).then(|| {
            let model = super::cpu::CpuModel {
                n_embd,
                layers: (0..n_layer)
                    .map(|il| {
                        cpu_ok[il].then(|| {
                            std::array::from_fn(|m| {
                                let t = store
                                    .get(&store.index(), &format!("blk.{il}.{}.weight", MATS[m]))?;
                                let ne = t.ne();
                                Some(super::cpu::StoreMat {
                                    ty: t.ty(),
                                    ne: [ne[0], ne[1], ne[2]],
                                    addr: t.data_addr(),
                                    bytes: t.n_bytes(),
                                })
                            })
                        })
                    })
                    .collect(),
            };
            super::cpu::CpuChannel::new(model, opts.cpu_threads)
        });
        let cpu = cpu.transpose()?;
        let store_idx = store.index();
        let dev_idx = dev.index();
        let bw = opts.bandwidths;
        Ok(Self {
            n_expert,
            k,
            layers,
            opts,
            #[cfg(test)]
            store_freed: Default::default(),
            store,
            store_idx,
            dev,
            dev_idx,
            slots: None,
            scratch,
            scratch_len,
            xfer: transfer::for_backend(backend)?,
            backend: backend.clone(),
            stats: Stats::new(n_layer),
            step: 0,
            dev_bytes: 2 * stage_bytes + (2 * ctl_bytes + cpu_bytes) * n_moe + remap_bytes,
            mirror,
            mirror_len: mirror_bytes,
            direct_ready: false,
            mailbox,
            mailbox_owner,
            host_bytes,
            n_slots: 0,
            n_embd,
            cpu,
            cpu_dirty: vec![false; n_layer],
            cpu_ok,
            pcie_bw: bw.map_or(if backend.is_cuda() { 45e9 } else { 20e9 }, |b| b.0),
            cpu_bw: bw.map_or(30e9, |b| b.1),
        })
    }

    /// Device bytes one slot costs in every MoE layer together.
    pub fn slot_bytes_all_layers(&self) -> usize {
        self.layers
            .iter()
            .flatten()
            .map(|l| {
                l.mats
                    .iter()
                    .flatten()
                    .map(|m| m.expert_bytes)
                    .sum::<usize>()
            })
            .sum()
    }

    /// Device bytes `n_slots` slots take in every MoE layer together (with padding, and, where
    /// direct decode may run, one expert's worth per matrix so each slot tensor can be placed
    /// congruent to its store: see [`Offload::alloc_slots`]).
    pub fn slots_alloc_bytes(&self, n_slots: usize) -> usize {
        let direct = self.direct_candidate();
        self.layers
            .iter()
            .flatten()
            .flat_map(|l| l.mats.iter().flatten())
            .map(|m| m.alloc_bytes(n_slots) + if direct { m.expert_bytes + 256 } else { 0 })
            .sum()
    }

    /// Whether [`Mode::Direct`] may run on this model and device: asked for, a CUDA backend
    /// (unified addressing: the GPU reads the page-locked store at its host address), and every
    /// expert matrix quantised (ggml-cuda then multiplies a single token's experts with its
    /// mat-vec kernel, which reads the ids on the device and nothing else of them).
    fn direct_candidate(&self) -> bool {
        self.opts.direct
            && self.backend.is_cuda()
            && self
                .layers
                .iter()
                .flatten()
                .flat_map(|l| l.mats.iter().flatten())
                .all(|m| m.ty.is_quantized())
    }

    /// Gives every MoE layer `n_slots` cache slots on `backend` (at most one per expert).
    ///
    /// Direct decode (see [`Mode::Direct`]) addresses a miss through the slot tensor: expert `e`
    /// of matrix `m` is "slot" `base_m + e`, where `base_m = (store_m - slots_m) / bytes_m`, so
    /// each slot tensor is placed at an address congruent to its store modulo the expert size,
    /// and the resulting block offsets must fit ggml-cuda's 32-bit index arithmetic.
    pub fn alloc_slots(&mut self, backend: &Backend, n_slots: usize) -> Result<(), GgmlError> {
        let n_slots = n_slots.min(self.n_expert);
        let n_layer = self.layers.len();
        let direct = self.direct_candidate() && n_slots > 0;
        let ctx = Context::new(n_layer * 3 + 1, 0)?;
        let size = if n_slots == 0 {
            0
        } else {
            self.slots_alloc_bytes(n_slots)
        };
        let buf = ctx.new_buffer(backend, Memory::Device, size)?;
        // Zeroed: a masked-out slot id points at slot 0, and zero blocks compute to zeros
        // (never NaN) before slot 0 was ever filled.
        buf.clear(0);
        let base = buf.base_addr();
        let mut off = 0;
        let mut all_direct = direct;
        let store_addrs: Vec<[Option<usize>; 3]> = (0..n_layer)
            .map(|il| std::array::from_fn(|m| self.store_tensor(il, m).map(|t| t.data_addr())))
            .collect();
        for (il, l) in self.layers.iter_mut().enumerate() {
            let Some(l) = l else { continue };
            let mut bases = [None; 3];
            for (m, mat) in l.mats.iter().enumerate() {
                // No slots: the layer always stages (see `slot_tokens`).
                let Some(mat) = mat.as_ref().filter(|_| n_slots > 0) else {
                    continue;
                };
                let t = ctx
                    .new_tensor(mat.ty, &[mat.ne[0], mat.ne[1], n_slots as i64])?
                    .set_name(&name(il, &format!("slot{m}")));
                if direct {
                    let store = store_addrs[il][m].expect("store tensor of an offloaded matrix");
                    match congruent_offset(base, off, store, mat.expert_bytes) {
                        Some(at) => {
                            off = at;
                            bases[m] = direct_base(store, base + at, mat, n_slots, self.n_expert);
                        }
                        None => bases[m] = None,
                    }
                    all_direct &= bases[m].is_some();
                }
                off = buf.place(t, off)?;
            }
            l.direct_base = direct.then_some(bases);
            l.pending.clear();
            l.cache = LayerCache::new(il, self.n_expert, n_slots, &self.opts.policy);
        }
        let idx = ctx.index();
        self.slots = Some((ctx, idx));
        self.dev_bytes += size;
        self.n_slots = n_slots;
        self.direct_ready = all_direct;
        Ok(())
    }

    /// The largest micro-batch the slot cache serves (k experts per token must fit).
    pub fn slot_tokens(&self) -> usize {
        if self.n_slots == 0 {
            return 0;
        }
        (self.n_slots / self.k.max(1)).min(self.opts.max_slot_tokens)
    }

    /// Slots when the micro-batch's experts fit the cache, or for a single token when the CPU
    /// channel can take what does not fit; staging otherwise.
    pub fn mode(&self, n_tokens: usize) -> Mode {
        if n_tokens == 1 && self.direct_ready {
            return Mode::Direct;
        }
        let overflow_to_cpu = n_tokens == 1
            && self.n_slots > 0
            && self.cpu.is_some()
            && (0..self.layers.len()).all(|il| !self.is_offloaded(il) || self.cpu_ok[il]);
        if n_tokens <= self.slot_tokens() || overflow_to_cpu {
            Mode::Slots
        } else {
            Mode::Staging
        }
    }

    /// [`Admit::Prefetch`] decode: the mailbox of layer `il`: (its k up-matrix ids, the next
    /// layer's n_expert predicted logits), as host addresses.
    pub(super) fn mailbox_of(&self, il: usize) -> (usize, usize) {
        let at = self.mailbox + 4 * (self.k + self.n_expert) * il;
        (at, at + 4 * self.k)
    }

    /// Whether direct decode follows the step through mailboxes ([`Admit::Prefetch`]).
    pub fn follows(&self) -> bool {
        self.opts.stop_every == 0 && self.opts.admit == Admit::Prefetch
    }

    /// Gives node `t` of layer `il` its mailbox (`pred`: the predicted logits, else the ids).
    ///
    /// The mailbox is page-locked host memory that lives as long as the engine; the GPU writes
    /// it through unified addressing (see `experts::direct`).
    pub fn preset_mailbox(&self, t: Tensor<'_>, il: usize, pred: bool) {
        let (ids, logits) = self.mailbox_of(il);
        // SAFETY: per the doc: live page-locked memory of the right size, reachable by the GPU
        // at its host address (the CUDA host buffer type; direct decode runs on CUDA only).
        unsafe { t.preset(self.mailbox_owner, if pred { logits } else { ids }) }
    }

    /// Direct mode: the layers a stop at layer `il` prefetches for (the offloaded layers after
    /// it up to and including the next stop layer), or `None` when `il` does not stop.
    pub fn direct_stop(&self, il: usize) -> Option<Vec<usize>> {
        let every = self.opts.stop_every;
        let moe: Vec<usize> = (0..self.layers.len())
            .filter(|&j| self.is_offloaded(j))
            .collect();
        let pos = moe.iter().position(|&j| j == il)?;
        (every > 0 && pos % every == 0)
            .then(|| moe[pos + 1..].iter().take(every).copied().collect())
    }

    /// Whether single-token steps run [`Mode::Direct`].
    pub fn direct_ready(&self) -> bool {
        self.direct_ready
    }

    pub fn is_offloaded(&self, il: usize) -> bool {
        self.layers.get(il).is_some_and(Option::is_some)
    }

    /// Slot tensor of matrix `m` (index into [`MATS`]) of layer `il` [ne0, ne1, n_slots].
    pub fn slot_tensor(&self, il: usize, m: usize) -> Option<Tensor<'_>> {
        let (ctx, idx) = self.slots.as_ref()?;
        ctx.get(idx, &name(il, &format!("slot{m}")))
    }

    /// Staging tensor of matrix `m` of layer `il` [ne0, ne1, n_expert].
    pub fn staging_tensor(&self, il: usize, m: usize) -> Option<Tensor<'_>> {
        self.dev.get(&self.dev_idx, &name(il, &format!("stage{m}")))
    }

    /// Host store tensor of matrix `m` of layer `il` [ne0, ne1, n_expert].
    pub fn store_tensor(&self, il: usize, m: usize) -> Option<Tensor<'_>> {
        self.store
            .get(&self.store_idx, &format!("blk.{il}.{}.weight", MATS[m]))
    }

    /// Whether layer `il`'s misses may run on the CPU channel (decode graphs then add its
    /// result, [`Offload::ctl_cpu`]).
    pub fn cpu_enabled(&self, il: usize) -> bool {
        self.cpu.is_some() && self.cpu_ok.get(il).copied().unwrap_or(false)
    }

    /// The CPU channel's result for layer `il`, f32 [n_embd, t_max] (zeros when unused).
    pub fn ctl_cpu(&self, il: usize) -> Tensor<'_> {
        self.dev
            .get(&self.dev_idx, &name(il, "cpu"))
            .unwrap_or_else(|| panic!("layer {il} has no CPU result tensor"))
    }

    /// Direct mode's id table of layer `il`, matrix `m`: i32 [1, n_expert], a view of
    /// `off.remap` (rows of one element, so `get_rows` maps expert ids through it).
    pub fn remap_view<'a>(&'a self, ctx: &'a Context, il: usize, m: usize) -> Tensor<'a> {
        let t = self.remap();
        ctx.view(
            t,
            &[1, self.n_expert as i64],
            &[4],
            4 * self.n_expert * (3 * il + m),
        )
    }

    pub(super) fn remap(&self) -> Tensor<'_> {
        self.dev
            .get(&self.dev_idx, "off.remap")
            .expect("the offload id table exists")
    }

    /// Control tensors of layer `il`: slot ids i32 [k, t_max] and mask f32 [1, k, t_max].
    pub fn ctl(&self, il: usize) -> (Tensor<'_>, Tensor<'_>) {
        let get = |w: &str| {
            self.dev
                .get(&self.dev_idx, &name(il, w))
                .unwrap_or_else(|| panic!("layer {il} has no offload control tensor {w}"))
        };
        (get("ids"), get("mask"))
    }
}

/// The smallest offset `>= off` in a buffer at `base` whose address is congruent to `store`
/// modulo `expert_bytes` and 256-aligned (ggml's tensor alignment), if one exists.
fn congruent_offset(base: usize, off: usize, store: usize, expert_bytes: usize) -> Option<usize> {
    let eb = expert_bytes;
    let first = off + (store % eb + eb - (base + off) % eb) % eb;
    (0..256)
        .map(|j| first + j * eb)
        .find(|&at| (base + at) % 256 == 0)
        .filter(|&at| at < off + eb + 256)
}

/// The id of expert 0 in the store relative to a slot tensor at `slots` (see
/// [`Offload::alloc_slots`]), when every id a step can use (slots, and `base..base + n_expert`)
/// keeps ggml-cuda's block index within `i32`.
fn direct_base(
    store: usize,
    slots: usize,
    mat: &Mat,
    n_slots: usize,
    n_expert: usize,
) -> Option<i32> {
    let eb = mat.expert_bytes as i128;
    let d = store as i128 - slots as i128;
    if d % eb != 0 {
        return None;
    }
    let b = d / eb;
    // Blocks per expert: ggml-cuda's mat-vec kernel indexes quant blocks with 32-bit ints.
    let blocks = eb / mat.ty.type_size() as i128;
    let lo = b.min(0);
    let hi = (b + n_expert as i128).max(n_slots as i128);
    let fits = |id: i128| (id.abs() + 1) * blocks < i32::MAX as i128;
    (fits(lo) && fits(hi))
        .then(|| i32::try_from(b).ok())
        .flatten()
}
