//! The engine: a GGUF model loaded on one backend (CPU, or one GPU with the CPU as fallback for
//! unsupported ops), its KV cache, and the forward pass over micro-batches.
//!
//! Invariants: the cache holds positions `0..n_past`; `forward` appends; exceeding `n_ctx` is an
//! error (`ContextFull`) before any graph is built. Logits are returned for every input position.
pub mod batch;
pub mod context;
pub mod embed;
pub mod sampling;
pub mod snapshot;
/// The KV cache and the weights live with the graph that reads them; their old paths stay.
pub use crate::graph::{kv, weights};
pub use snapshot::StatsSnapshot;

use crate::arch;
use crate::experts::step::GraphNodes;
use crate::experts::{Offload, OffloadOptions, StepHook};
use crate::ggml::{Backend, Context, GgmlError, GgmlType, OwnedGraph, Sched};
use crate::gguf::{GgufError, GgufModel};
use crate::graph::blocks::{Resident, RoutedExperts};
use crate::graph::{dsv4, BatchInputs, GraphBuilder};
use crate::model::{validate::validate, Hparams};
use std::path::Path;
use std::rc::Rc;

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Gguf(#[from] GgufError),
    #[error(transparent)]
    Ggml(#[from] GgmlError),
    #[error("{path}: {msg}")]
    Model { path: String, msg: String },
    #[error("context full: {need} positions needed, the context holds {n_ctx} (raise --ctx)")]
    ContextFull { n_ctx: usize, need: usize },
    #[error("a GPU budget of {} is below what the resident parts need: the smallest budget that works is {} ({need} B: weights other than routed experts, KV cache, staging and compute buffers, with no expert cache); raise --gpu-mem, or lower --ctx or the micro-batch", gib(*budget), gib(*need))]
    BudgetTooSmall { budget: u64, need: u64 },
    #[error("a sequence's KV pages hold {have} positions, {need} needed")]
    KvPages { need: usize, have: usize },
    #[error("token id {id} is outside the vocabulary (0..{n_vocab})")]
    BadToken { id: u32, n_vocab: u64 },
}

/// Where the model runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Device {
    Cpu,
    Cuda(usize),
    /// GPU 0 when this is a CUDA build and a GPU is present, else the CPU.
    Auto,
}

impl Device {
    /// [`Device::Auto`] resolved for this build and machine; others as they are.
    pub fn resolve(self) -> Device {
        match self {
            Device::Auto if Backend::cuda_device_count() > 0 => Device::Cuda(0),
            Device::Auto => Device::Cpu,
            d => d,
        }
    }
}

/// Whether the engine's CPU thread pool polls between graphs (ggml's `poll`: idle workers spin
/// up to ~10^8 cycles for the next graph before they sleep), given whether a GPU runs the step,
/// whether the offload path's own CPU-expert threads need the cores, and `n_threads` (0 = all).
/// A CPU-only engine whose pool takes every core waits instead: its spinning workers would
/// starve every other thread of the machine (the server's, another engine's, another process's),
/// and on an oversubscribed 2-core machine each graph then stalled for whole time slices
/// (issue 27).
fn cpu_pool_polls(gpu: bool, cpu_experts: bool, n_threads: usize) -> bool {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let n = if n_threads == 0 { cores } else { n_threads };
    !cpu_experts && (gpu || n < cores)
}

/// `names` for the unused-tensor warning: each by name, except that a multi-token-prediction
/// block (`blk.N.*` with N at or past `n_decode`, not built) is one entry with its count.
fn unused_summary(names: &[String], n_decode: usize) -> String {
    let mtp_block = |name: &str| {
        let n: usize = name.strip_prefix("blk.")?.split('.').next()?.parse().ok()?;
        (n >= n_decode).then_some(n)
    };
    let mut out: Vec<String> = Vec::new();
    let mut blocks: Vec<(usize, usize)> = Vec::new();
    for name in names {
        match mtp_block(name) {
            Some(b) => match blocks.iter_mut().find(|(n, _)| *n == b) {
                Some((_, k)) => *k += 1,
                None => blocks.push((b, 1)),
            },
            None => out.push(name.clone()),
        }
    }
    out.extend(blocks.into_iter().map(|(b, k)| {
        format!("blk.{b}.* ({k} tensors of a multi-token-prediction block, not built)")
    }));
    out.join(", ")
}

/// `b` bytes as GiB with two decimals, for messages.
fn gib(b: u64) -> String {
    format!("{:.2} GiB", b as f64 / (1u64 << 30) as f64)
}

/// VRAM left free when the budget is automatic (no `gpu_mem`): the larger of this and
/// [`AUTO_MARGIN_FRACTION`] of the device, for the CUDA runtime, cuBLAS and other processes.
pub const AUTO_MARGIN: u64 = 1 << 30;
pub const AUTO_MARGIN_FRACTION: f64 = 0.05;

/// The automatic budget on a device with `free` of `total` bytes free: free minus the margin.
pub fn auto_budget(free: u64, total: u64) -> u64 {
    let margin = AUTO_MARGIN.max((total as f64 * AUTO_MARGIN_FRACTION) as u64);
    free.saturating_sub(margin)
}

#[derive(Debug, Clone)]
pub struct EngineOptions {
    pub device: Device,
    pub n_ctx: usize,
    pub n_threads: usize,
    pub n_ubatch: usize,
    pub kv_type: GgmlType,
    /// Memory budget on the main device (bytes). With a budget the model does not fit in,
    /// routed experts are offloaded (docs/design.md §4.1). `None` on a GPU: the device's free
    /// memory minus a margin ([`auto_budget`]), so a model larger than the GPU offloads by
    /// itself.
    pub gpu_mem: Option<u64>,
    /// Prefetch experts of the next layer while the current one runs (when offloading).
    pub prefetch: bool,
    /// Compute some cache misses on the CPU, in parallel with copies (when offloading).
    pub cpu_experts: bool,
    /// Offload cost model: (PCIe, CPU-channel) bytes/s; `None`: measured on the box at the
    /// first decode step that may use the CPU channel.
    pub offload_bandwidths: Option<(f64, f64)>,
    /// Offloading: balance each decode step's misses between the copy engine and the CPU
    /// channel (its backlog counted, part of the predicted experts left to the CPU instead of
    /// prefetched; docs/design.md §4.5). `false`: the planner before 2026-12-02.
    pub miss_balance: bool,
    /// Expert-cache policy when offloading.
    pub policy: crate::experts::policy::PolicyKind,
    /// Offloading on a GPU: decode single tokens without graph stops (misses read in place
    /// from the host store, the cache updated between tokens; `experts::offload::direct`).
    pub direct_decode: bool,
    /// How direct decode admits misses into the cache (without stops).
    pub admit: crate::experts::Admit,
    /// Direct decode stops at every this many offloaded layers to prefetch for the following
    /// ones (0: never stops; misses then enter the cache after the step, per `admit`).
    pub direct_stop_every: usize,
    /// Sequences served at once (`engine::batch`, the server's `--parallel`): the per-sequence
    /// state some architectures keep besides the KV rows (DeepSeek-V4's compressor rings) is
    /// sized for this many.
    pub n_seq: usize,
    /// On the CPU (no GPU, no offload): weights read only as the matrix of a matrix product go
    /// into the CPU's extra buffer types where its kernels take them (ggml-cpu's repack layout:
    /// interleaved Q4_K/Q4_0/IQ4_NL/MXFP4 blocks, faster products), as llama.cpp does by default
    /// (its `--no-repack` turns it off, as `false` here does). See `Engine::fill_weights`.
    pub repack: bool,
}

impl Default for EngineOptions {
    fn default() -> Self {
        Self {
            n_seq: 1,
            device: Device::Cpu,
            n_ctx: 4096,
            n_threads: 0,
            n_ubatch: 512,
            kv_type: GgmlType::F16,
            gpu_mem: None,
            policy: Default::default(),
            prefetch: true,
            cpu_experts: true,
            offload_bandwidths: None,
            miss_balance: true,
            // Measured slower than the stopping path so far (docs/bench-h200.md, session 6).
            direct_decode: false,
            admit: crate::experts::Admit::Sync,
            direct_stop_every: 0,
            repack: true,
        }
    }
}

pub struct Engine {
    pub hp: Hparams,
    opts: EngineOptions,
    // Field order = drop order: the cached graph first, the file map last.
    /// The last graph built and allocated, with its (n_tokens, n_kv, last_only) shape and its
    /// offloaded layers.
    graph: Option<(GraphKey, OwnedGraph, GraphNodes)>,
    /// The last multi-sequence graph (`batch`), likewise.
    batch_graph: Option<(batch::GraphKey, OwnedGraph, GraphNodes)>,
    offload: Option<Offload>,
    sched: Sched,
    kv: kv::KvCache,
    weights: weights::Weights,
    _backends: Vec<Rc<Backend>>,
    _file: GgufModel,
    n_past: usize,
    /// Bytes of the model's tensors, and whether the budget was chosen automatically.
    model_bytes: u64,
    budget_auto: bool,
    /// `POCKETMOE_STEP_PROFILE=1`: host time of single-token steps by phase, printed on drop.
    profile: Option<StepProfile>,
    /// Page-locked memory the logits come back through, on a GPU (up to [`MAX_SLOT_TOKENS`]
    /// rows; more are read directly).
    stage: Option<crate::ggml::HostStage>,
    /// The file's tensors no graph reads (`unread_tensors`), warned about at load.
    unused: Vec<String>,
}

/// Where a single-token step's wall time goes on the host (`POCKETMOE_STEP_PROFILE=1`; issue 30:
/// the resident decode floor is host time between kernels once the kernels match libllama's).
#[derive(Default)]
struct StepProfile {
    steps: u32,
    /// From the previous step's return to this step's start (the caller: sampling, the bench).
    between: f64,
    /// Graph lookup and input writes.
    inputs: f64,
    /// The scheduler's compute, synchronised.
    compute: f64,
    /// Logits read-back into the returned vector.
    logits: f64,
    last_end: Option<std::time::Instant>,
}

impl Drop for StepProfile {
    fn drop(&mut self) {
        if self.steps > 0 {
            let us = |x: f64| 1e6 * x / f64::from(self.steps);
            eprintln!(
                "step profile: {} single-token steps, per step: between steps {:.1} us, inputs {:.1} us, compute {:.1} us, logits {:.1} us",
                self.steps,
                us(self.between),
                us(self.inputs),
                us(self.compute),
                us(self.logits)
            );
        }
    }
}

impl Engine {
    /// Opens, validates and loads `path`. `progress(done, total)` reports weight bytes.
    pub fn load(
        path: &Path,
        opts: EngineOptions,
        progress: &dyn Fn(u64, u64),
    ) -> Result<Self, EngineError> {
        let model_err = |msg: String| EngineError::Model {
            path: path.display().to_string(),
            msg,
        };
        let file = GgufModel::open(path)?;
        let (arch, hp) = arch::hparams(&file).map_err(model_err)?;
        let spec = &arch.spec;
        if arch.graph.is_none() {
            return Err(model_err(format!(
                "no graph for architecture {:?} yet (built: {})",
                spec.name,
                arch::built_names()
            )));
        }
        if let Some(msg) = arch::unsupported(&hp) {
            return Err(model_err(msg));
        }
        let tensors: Vec<_> = file.tensors().cloned().collect();
        let v = validate(spec, &hp, &tensors);
        if let Some(e) = v.errors().next() {
            return Err(model_err(e.to_string()));
        }
        check_expert_ids(&file, &hp).map_err(model_err)?;
        // Before any weight is loaded: refuse what the options cannot give.
        if opts.kv_type.is_quantized() && (hp.is_mla() || !arch.quantized_kv) {
            return Err(model_err(format!(
                "a {:?} KV cache is not built for {}'s attention yet (use f16)",
                opts.kv_type, spec.name
            )));
        }
        let total_bytes: u64 = tensors.iter().map(|t| t.n_bytes).sum();
        let mut opts = opts;
        opts.device = opts.device.resolve();
        // MLA (absorbed) caches one latent row per position, read as both K and V: no V cache;
        // nor does an architecture whose attention reads V from the K row (`arch.kv.k_only`).
        let v_width = if hp.is_mla() || arch.kv.k_only {
            0
        } else {
            hp.v_dim() as usize
        };
        let widths: Vec<(usize, usize)> = (0..hp.n_layer)
            .map(|_| (hp.k_dim() as usize, v_width))
            .collect();
        let kv_row = context::kv_row_bytes(&hp, opts.kv_type);
        // On a GPU without a budget: its free memory minus a margin.
        let gpu = match opts.device {
            Device::Cuda(i) => Some(Rc::new(Backend::cuda(i)?)),
            _ => None,
        };
        // Whole 256-row blocks on a GPU, where ggml-cuda's kernel choice needs them
        // (`kv_rows_for`). The CPU keeps the exact context for now: padded, DeepSeek-V4's
        // offloaded decode with CPU-channel experts moved one step off the resident one
        // (cosine 0.99995, tests/offload.rs), not yet understood (docs/design.md §3.4).
        let kv_ctx = if gpu.is_some() {
            kv_rows_for(opts.n_ctx)
        } else {
            opts.n_ctx
        };
        let auto_budget = opts.gpu_mem.is_none() && gpu.is_some();
        if auto_budget {
            opts.gpu_mem = gpu
                .as_ref()
                .and_then(|g| g.memory())
                .map(|(free, total)| self::auto_budget(free as u64, total as u64));
        }
        let kv_bytes = kv_row * kv_ctx as u64;
        // Offload when the budget is below the whole model (+ KV + a compute reserve).
        let offload = opts
            .gpu_mem
            .is_some_and(|b| total_bytes + kv_bytes + COMPUTE_RESERVE > b && hp.n_expert > 0);
        let cpu = Rc::new(Backend::cpu_polling(
            opts.n_threads,
            cpu_pool_polls(gpu.is_some(), offload && opts.cpu_experts, opts.n_threads),
        )?);
        let main = gpu.clone().unwrap_or_else(|| cpu.clone());
        // Offloading, the tensors whose role is not resident (the routed experts' matrices) stay
        // out of the weights: the offload store holds them.
        let resident = |name: &str| v.roles.get(name).is_none_or(|r| r.is_resident());
        let keep = |name: &str| !offload || resident(name);
        // Offloading to a GPU, the token embedding stays in host memory (its lookup runs on the
        // CPU) and its VRAM goes to expert slots. Fully resident, VRAM is not what limits, and
        // it stays on the GPU: no CPU split and host round trip at every step.
        let host = (offload && !Rc::ptr_eq(&main, &cpu)).then_some(&*cpu);
        // CPU-only and resident: the weights are filled once the engine can build graphs on
        // them, which decide what goes into the CPU's extra buffer types (`fill_weights`).
        let repack = opts.repack && Rc::ptr_eq(&main, &cpu) && !offload;
        let mut weights = weights::Weights::declare(&file, host.is_some(), &keep)?;
        if !repack {
            let none = weights::ExtraPlacement::new();
            weights.fill(&file, &main, host, &none, progress)?;
        }
        let rot = kv::rotation_sizes(opts.kv_type, hp.head_dim_k as usize, hp.head_dim_v as usize);
        let kv = kv::KvCache::new(
            &main,
            &widths,
            kv_ctx,
            opts.kv_type,
            rot,
            // The architecture's own caches (DeepSeek-3.2's indexer keys, DeepSeek-V4's
            // compressed rows) are read through the same padded views: the same rows.
            &(arch.kv.extra)(&hp, kv_ctx, opts.n_seq.max(1)),
        )?;
        let off = if offload {
            let o = OffloadOptions {
                policy: opts.policy.clone(),
                max_slot_tokens: MAX_SLOT_TOKENS,
                // Sizes the host scratch for a micro-batch of up to the whole context.
                n_ubatch: opts.n_ctx.max(1),
                prefetch: opts.prefetch,
                bandwidths: opts.offload_bandwidths,
                balance: opts.miss_balance,
                // Experiment switches (until the defaults are settled by measurement).
                direct: std::env::var("POCKETMOE_DIRECT").map_or(opts.direct_decode, |v| v != "0"),
                stop_every: match std::env::var("POCKETMOE_STOP_EVERY") {
                    Ok(v) => v.parse().map_err(|_| EngineError::Model {
                        path: "POCKETMOE_STOP_EVERY".into(),
                        msg: format!("{v:?} is not a layer count"),
                    })?,
                    Err(_) => opts.direct_stop_every,
                },
                admit: match std::env::var("POCKETMOE_ADMIT") {
                    Ok(v) => {
                        crate::experts::Admit::parse(&v).map_err(|msg| EngineError::Model {
                            path: "POCKETMOE_ADMIT".into(),
                            msg,
                        })?
                    }
                    Err(_) => opts.admit,
                },
                cpu_threads: if opts.cpu_experts {
                    match opts.n_threads {
                        0 => std::thread::available_parallelism()
                            .map_or(1, |n| n.get())
                            .saturating_sub(1)
                            .max(1),
                        // The main thread waits on the GPU meanwhile: leave it a core.
                        n => n.saturating_sub(1).max(1),
                    }
                } else {
                    0
                },
            };
            Some(Offload::load(&file, &hp, &main, o, progress)?)
        } else {
            None
        };
        let backends = if Rc::ptr_eq(&main, &cpu) {
            vec![cpu]
        } else {
            vec![main.clone(), cpu]
        };
        let sched = Sched::new(&backends, graph_size(&hp), false)?;
        let stage = match &gpu {
            Some(g) => Some(crate::ggml::HostStage::new(
                g,
                hp.n_vocab as usize * 4 * MAX_SLOT_TOKENS,
            )?),
            None => None,
        };
        let mut eng = Self {
            hp,
            opts,
            graph: None,
            batch_graph: None,
            offload: off,
            sched,
            kv,
            weights,
            _backends: backends,
            _file: file,
            n_past: 0,
            model_bytes: total_bytes,
            budget_auto: auto_budget,
            stage,
            profile: std::env::var("POCKETMOE_STEP_PROFILE")
                .is_ok_and(|v| v == "1")
                .then(StepProfile::default),
            unused: Vec::new(),
        };
        if repack {
            eng.fill_weights(progress)?;
        }
        // Resident models do not reserve the largest graph up front: tried for issue 30's
        // fresh-process decode loss, it cost 0.1-0.26 GiB of VRAM and changed nothing (H200,
        // docs/bench-h200.md, 2026-12-02).
        if let (Some(budget), true) = (eng.opts.gpu_mem, eng.offload.is_some()) {
            eng.plan_slots(&main, budget)?;
        }
        // A tensor the graphs never read is loaded for nothing, and usually means the file
        // holds something this build does not compute (issue 27): say which, by name.
        eng.unused = eng.unread_tensors()?;
        if !eng.unused.is_empty() {
            tracing::warn!(
                "{}: {} tensor(s) that no graph reads (loaded, unused): {}",
                path.display(),
                eng.unused.len(),
                unused_summary(&eng.unused, eng.hp.n_layer_decode())
            );
        }
        // The server (and RUST_LOG=info) shows it at start; `pocketmoe run` prints it itself.
        tracing::info!("{}", eng.plan());
        Ok(eng)
    }

    /// The file's tensors, in file order, that no graph of [`Engine::shape_graphs`] reads, as
    /// weights here or through the offload store (the routed experts it holds count as read:
    /// the expert path computes them).
    fn unread_tensors(&self) -> Result<Vec<String>, EngineError> {
        let graphs = self.shape_graphs()?;
        let read: std::collections::HashSet<usize> = graphs
            .iter()
            .flat_map(|g| g.graph().reads().into_iter().map(|(_, _, src)| src))
            .collect();
        let is_read = |name: &str| {
            let main = self.weights.get(name);
            let host = (name == weights::TOKEN_EMBD)
                .then(|| self.weights.embedding())
                .flatten();
            match (main, host) {
                (None, None) => self.offload.is_some(),
                (m, h) => [m, h].into_iter().flatten().any(|t| read.contains(&t.id())),
            }
        };
        Ok(self
            ._file
            .tensors()
            .filter(|t| !is_read(&t.name))
            .map(|t| t.name.clone())
            .collect())
    }

    /// Tensors of the file that no graph reads (see [`Engine::load`]'s warning), in file order.
    pub fn unused_tensors(&self) -> &[String] {
        &self.unused
    }

    /// Graphs of the shapes this engine runs, built but not allocated: a decode step at the
    /// start and at the end of the context, and the largest micro-batch at the end of the
    /// context (as `reserve_largest` builds it), so that shape-dependent paths (DeepSeek-V4's
    /// compressors, the sparse-attention indexer) are present.
    fn shape_graphs(&self) -> Result<Vec<OwnedGraph>, EngineError> {
        let n_ctx = self.opts.n_ctx.max(1);
        let n = self.opts.n_ubatch.min(n_ctx).max(1);
        [(1, 0, false), (1, n_ctx - 1, false), (n, n_ctx - n, true)]
            .into_iter()
            .map(|(n, n_past, last_only)| self.graph_at(n, n_past, last_only))
            .collect()
    }

    /// Fills the declared weights of a CPU-only engine, each matrix that only ever is the
    /// matrix of a product in one of the CPU device's extra buffer types where its kernels take
    /// it (`Weights::extra_placement`). The uses are read from the graphs this engine builds
    /// ([`Engine::shape_graphs`]); a weight none of them reads stays plain.
    fn fill_weights(&mut self, progress: &dyn Fn(u64, u64)) -> Result<(), EngineError> {
        let cpu = self._backends.last().expect("the CPU backend").clone();
        let bufts = cpu.extra_buffer_types();
        let place = if bufts.is_empty() {
            weights::ExtraPlacement::new()
        } else {
            let graphs = self.shape_graphs()?;
            let gs: Vec<_> = graphs.iter().map(|g| g.graph()).collect();
            self.weights.extra_placement(&gs, &bufts)
        };
        self.weights
            .fill(&self._file, &cpu, None, &place, progress)?;
        let (n, bytes) = self.weights.extra();
        tracing::info!(
            "weights: {n} matrices ({bytes} B) in the CPU's extra buffer types ({})",
            bufts
                .iter()
                .map(|b| b.name())
                .collect::<Vec<_>>()
                .join(", ")
        );
        Ok(())
    }

    /// Weights in the CPU device's extra buffer types (repacked): (tensors, bytes).
    pub fn repacked(&self) -> (usize, u64) {
        self.weights.extra()
    }

    /// Reserves the scheduler's buffers for the largest graph: a full micro-batch at the end of
    /// the context (staging mode when offloading). Returns the compute buffer's size.
    fn reserve_largest(&mut self) -> Result<u64, EngineError> {
        let n = self.opts.n_ubatch.min(self.opts.n_ctx).max(1);
        let g = self.graph_at(n, self.opts.n_ctx - n, false)?;
        self.sched.reserve(&g.graph())?;
        drop(g);
        Ok(self.sched.buffer_size(0) as u64)
    }

    /// The graph of a single-sequence micro-batch of `n` tokens at `n_past`, with its padded
    /// KV view and compressor plans, built but not allocated (for sizing and inspection).
    fn graph_at(
        &self,
        n: usize,
        n_past: usize,
        last_only: bool,
    ) -> Result<OwnedGraph, EngineError> {
        let n_kv = BatchInputs::padded_n_kv(n_past, n, self.kv.n_ctx);
        let comp = self.comp_plans(&dsv4::single(n_past, n), n);
        Ok(self
            .build_graph(n, n_past, n_kv, last_only, 0, false, &comp)?
            .0)
    }

    /// Sizes the compute buffer on the largest graph (a full micro-batch at the full context, in
    /// staging mode), then gives the expert cache what is left of `budget`.
    ///
    /// Large micro-batches amortise prefill copies but need a large compute buffer; while that
    /// leaves the cache fewer than two tokens' worth of slots, the micro-batch is halved (down
    /// to 512).
    fn plan_slots(&mut self, main: &Backend, budget: u64) -> Result<(), EngineError> {
        let margin = if main.is_cuda() { CUDA_MARGIN } else { 0 };
        let k = self.hp.n_expert_used.max(1);
        let (fixed, per_slot) = loop {
            let compute = self.reserve_largest()?;
            let off = self.offload.as_ref().expect("offloading");
            let fixed = self.weights.bytes()
                + self.kv.bytes() as u64
                + off.dev_bytes() as u64
                + compute
                + margin;
            let per_slot = off.slot_bytes_all_layers().max(1) as u64;
            let slots = budget.saturating_sub(fixed) / per_slot;
            if slots >= 2 * k || self.opts.n_ubatch <= 512 {
                break (fixed, per_slot);
            }
            // A fresh scheduler: reserved buffers only ever grow.
            self.opts.n_ubatch /= 2;
            self.sched = Sched::new(&self._backends, graph_size(&self.hp), false)?;
        };
        let off = self.offload.as_mut().expect("offloading");
        if fixed > budget {
            return Err(EngineError::BudgetTooSmall {
                budget,
                need: fixed,
            });
        }
        let mut n_slots = (budget - fixed) / per_slot;
        // Padding and alignment per matrix: step down until the slots really fit.
        while n_slots > 0 && off.slots_alloc_bytes(n_slots as usize) as u64 > budget - fixed {
            n_slots -= 1;
        }
        tracing::info!(
            "offload: budget {budget} B; resident {} B, KV {} B, staging+control {} B, micro-batch {} -> {n_slots} expert slots per layer of {}",
            self.weights.bytes(),
            self.kv.bytes(),
            off.dev_bytes(),
            self.opts.n_ubatch,
            self.hp.n_expert
        );
        off.alloc_slots(main, n_slots as usize)?;
        Ok(())
    }

    /// Device bytes this engine allocated itself: weights, KV cache, offload buffers and the
    /// scheduler's compute buffer (what a `--gpu-mem` budget covers, minus the backend's own
    /// workspace).
    pub fn device_bytes(&self) -> u64 {
        self.weights.bytes()
            + self.kv.bytes() as u64
            + self.offload.as_ref().map_or(0, |o| o.dev_bytes() as u64)
            + self.sched.buffer_size(0) as u64
    }

    /// Offload statistics (`None` when the model is fully resident).
    pub fn offload_stats(&self) -> Option<crate::experts::Stats> {
        self.offload.as_ref().map(|o| o.stats().clone())
    }

    /// Device bytes one expert-cache slot costs across all MoE layers (`None` when resident).
    pub fn expert_slot_bytes(&self) -> Option<u64> {
        self.offload
            .as_ref()
            .map(|o| o.slot_bytes_all_layers() as u64)
    }

    /// The load plan in a few readable lines: where the model runs, the budget, what is
    /// resident, the expert cache, the KV cache and the micro-batch.
    pub fn plan(&self) -> String {
        let gib = |b: u64| format!("{:.2} GiB", b as f64 / (1u64 << 30) as f64);
        let o = &self.opts;
        let dev = match o.device {
            Device::Cuda(i) => format!("CUDA{i}"),
            _ => "the CPU".to_string(),
        };
        let budget = match (o.device, o.gpu_mem) {
            (Device::Cuda(_), Some(b)) if self.budget_auto => format!(
                ", budget {} (free VRAM minus a margin of max({}, {:.0}%); --gpu-mem to set it)",
                gib(b),
                gib(AUTO_MARGIN),
                100.0 * AUTO_MARGIN_FRACTION
            ),
            (Device::Cuda(_), Some(b)) => format!(", budget {} (--gpu-mem)", gib(b)),
            _ => String::new(),
        };
        let mut s = format!("plan: model {} on {dev}{budget}\n", gib(self.model_bytes));
        let compute = self.sched.buffer_size(0) as u64;
        match &self.offload {
            None => {
                s += &format!(
                    "  all weights resident: {}; KV cache {} ({} tokens, {})",
                    gib(self.weights.bytes()),
                    gib(self.kv.bytes() as u64),
                    o.n_ctx,
                    o.kv_type.name(),
                );
                if compute > 0 {
                    s += &format!("; compute buffer {}", gib(compute));
                }
                let (n, bytes) = self.weights.extra();
                if n > 0 {
                    s += &format!(
                        "; {n} matrices ({}) repacked for the CPU's kernels",
                        gib(bytes)
                    );
                }
            }
            Some(off) => {
                let n_expert = self.hp.n_expert as usize;
                s += &format!(
                    "  resident: weights other than routed experts {}; KV cache {} ({} tokens, {}); staging+control {}; compute buffer {}\n",
                    gib(self.weights.bytes()),
                    gib(self.kv.bytes() as u64),
                    o.n_ctx,
                    o.kv_type.name(),
                    gib((off.dev_bytes() - off.slots_alloc_bytes(off.n_slots()).min(off.dev_bytes())) as u64),
                    gib(compute)
                );
                s += &format!(
                    "  routed experts offloaded: {} in page-locked host memory; GPU cache {} slots per layer of {n_expert} experts ({:.0}%), {}; prefill micro-batch {}",
                    gib(off.host_bytes() as u64),
                    off.n_slots(),
                    100.0 * off.n_slots() as f64 / n_expert.max(1) as f64,
                    gib(off.slots_alloc_bytes(off.n_slots()) as u64),
                    o.n_ubatch
                );
            }
        }
        s
    }

    /// Device bytes an expert cache of `n_slots` slots per layer takes, padding included (`None`
    /// when resident): a budget of the resident parts plus this gives exactly `n_slots`.
    pub fn expert_cache_bytes(&self, n_slots: usize) -> Option<u64> {
        self.offload
            .as_ref()
            .map(|o| o.slots_alloc_bytes(n_slots) as u64)
    }

    /// Whether single-token decode runs without graph stops (`experts::offload::direct`).
    pub fn direct_decode(&self) -> bool {
        self.offload.as_ref().is_some_and(|o| o.direct_ready())
    }

    /// The prefill micro-batch (the offload planner may have lowered the requested one).
    pub fn n_ubatch(&self) -> usize {
        self.opts.n_ubatch
    }

    /// The expert cache's slots per layer (`None` when fully resident).
    pub fn expert_slots(&self) -> Option<usize> {
        self.offload.as_ref().map(|o| o.n_slots())
    }

    /// Captures named intermediate tensors of later forward passes into `cap` (see
    /// `ggml::capture`); `None` stops. `cap` must outlive its use.
    pub fn set_capture(&mut self, cap: Option<&mut crate::ggml::capture::Capture>) {
        self.sched.set_capture(cap);
    }

    /// Positions in the cache.
    pub fn n_past(&self) -> usize {
        self.n_past
    }

    /// Forgets the cached sequence.
    pub fn reset(&mut self) {
        self.n_past = 0;
    }

    /// Forgets positions `n..` (keeps the first `n` cached), e.g. to rerun a benchmark at a depth.
    pub fn truncate(&mut self, n: usize) {
        self.n_past = self.n_past.min(n);
    }

    /// Appends `tokens` to the sequence and returns the logits at each of their positions.
    pub fn forward(&mut self, tokens: &[u32]) -> Result<Vec<Vec<f32>>, EngineError> {
        self.forward_with(tokens, false, false)
    }

    /// Appends `tokens` and returns, at each of their positions, the final normed hidden state
    /// (`n_embd` floats: the output norm's result, before the head; llama.cpp's `result_norm`,
    /// which its embeddings pool). The head is not computed.
    pub fn forward_embd(&mut self, tokens: &[u32]) -> Result<Vec<Vec<f32>>, EngineError> {
        self.forward_with(tokens, false, true)
    }

    /// Appends `tokens` and returns the logits of the last position only (cheaper: the output
    /// projection runs once per micro-batch).
    pub fn forward_last(&mut self, tokens: &[u32]) -> Result<Vec<f32>, EngineError> {
        let mut v = self.forward_with(tokens, true, false)?;
        Ok(v.pop().unwrap_or_default())
    }

    fn forward_with(
        &mut self,
        tokens: &[u32],
        last_only: bool,
        embd: bool,
    ) -> Result<Vec<Vec<f32>>, EngineError> {
        let need = self.n_past + tokens.len();
        if need > self.opts.n_ctx {
            return Err(EngineError::ContextFull {
                n_ctx: self.opts.n_ctx,
                need,
            });
        }
        if let Some(&id) = tokens.iter().find(|&&t| t as u64 >= self.hp.n_vocab) {
            return Err(EngineError::BadToken {
                id,
                n_vocab: self.hp.n_vocab,
            });
        }
        let mut out = Vec::with_capacity(tokens.len());
        for chunk in tokens.chunks(self.opts.n_ubatch.max(1)) {
            out.extend(self.forward_ubatch(chunk, last_only, embd)?);
        }
        Ok(out)
    }

    /// Whether the model keeps compressor state besides its KV rows (DeepSeek-V4's compressed
    /// blocks): steps then need plans ([`Self::comp_plans`]).
    fn keeps_compressors(&self) -> bool {
        !dsv4::ratios(&self.hp.compress_ratios).is_empty()
    }

    /// The compressor plans of a step of `n` tokens over `spans` (DeepSeek-V4; empty for a
    /// model without compressed blocks).
    fn comp_plans(&self, spans: &[dsv4::Span], n: usize) -> Vec<(usize, dsv4::CompPlan, usize)> {
        dsv4::step_plans(
            &self.hp.compress_ratios,
            spans,
            n,
            self.opts.n_seq.max(1),
            self.kv.n_ctx, // the rows `arch.kv.extra` sized the compressed caches for
        )
    }

    /// Builds the graph for a micro-batch of `n` tokens at `n_past` (attending `n_kv` positions).
    /// `n_out > 0`: logits only for the `n_out` rows named by the `inp_out_ids` input (`batch`).
    /// `embd`: the output (named [`out_name`]) is the final normed hidden state, not logits.
    #[allow(clippy::too_many_arguments)]
    fn build_graph(
        &self,
        n: usize,
        n_past: usize,
        n_kv: usize,
        last_only: bool,
        n_out: usize,
        embd: bool,
        comp: &[(usize, dsv4::CompPlan, usize)],
    ) -> Result<(OwnedGraph, Vec<crate::experts::step::MoeNode>), EngineError> {
        let size = graph_size(&self.hp);
        let window = self.hp.sliding_window as usize;
        let mut nodes = Vec::new();
        let offloaded = self.offload.as_ref().map(Offload::graph_experts);
        let experts: &dyn RoutedExperts = match &offloaded {
            Some(o) => o,
            None => &Resident,
        };
        let g = OwnedGraph::build(Context::new(size, size)?, size, |ctx, graph| {
            let input = |ty, ne: &[i64], name: &'static str| -> Result<_, EngineError> {
                let t = ctx.new_tensor(ty, ne)?.set_name(name);
                ctx.set_input(t);
                Ok(t)
            };
            let t_tok = input(GgmlType::I32, &[n as i64], "inp_tokens")?; // [n]
            let t_pos = input(GgmlType::I32, &[n as i64], "inp_pos")?; // [n]
            let t_mask = input(GgmlType::F16, &[n_kv as i64, n as i64], "attn_inp_kq_mask")?; // [n_kv, n]
            let t_idx = input(GgmlType::I64, &[n as i64], "inp_kv_idxs")?; // [n]
            let t_mask_swa = if window > 0 {
                Some(input(
                    GgmlType::F16,
                    &[n_kv as i64, n as i64],
                    "attn_inp_kq_mask_swa",
                )?) // [n_kv, n]
            } else {
                None
            };
            let t_out = match n_out {
                0 => None,
                k => Some(input(GgmlType::I32, &[k as i64], "inp_out_ids")?), // [n_out]
            };
            let mut keep: Vec<String> = Vec::new();
            let mut dsv4_inputs = None;
            for (r, p, n_comp) in comp {
                let inp = dsv4::CompInputs::create(ctx, *r, p, n, *n_comp, &mut keep)?;
                let d = dsv4_inputs.get_or_insert(dsv4::Dsv4Inputs {
                    csa: None,
                    hca: None,
                });
                match r {
                    4 => d.csa = Some(inp),
                    _ => d.hca = Some(inp),
                }
            }
            let batch = BatchInputs {
                tokens: t_tok,
                pos: t_pos,
                mask: t_mask,
                mask_swa: t_mask_swa,
                kv_idx: t_idx,
                n_tokens: n,
                n_past,
                n_kv,
                last_only,
                out_ids: t_out,
                embd,
                dsv4: dsv4_inputs,
            };
            let g = GraphBuilder {
                ctx,
                w: &self.weights,
                kv: &self.kv,
                hp: &self.hp,
                batch,
                graph,
                experts,
            };
            let logits = arch::build(&g).map_err(|msg| EngineError::Model {
                path: String::new(),
                msg,
            })?;
            g.finish(logits.set_name(out_name(embd)));
            keep.extend(
                [
                    "inp_tokens",
                    "inp_pos",
                    "attn_inp_kq_mask",
                    "inp_kv_idxs",
                    out_name(embd),
                ]
                .map(String::from),
            );
            if t_mask_swa.is_some() {
                keep.push("attn_inp_kq_mask_swa".into());
            }
            if t_out.is_some() {
                keep.push("inp_out_ids".into());
            }
            nodes = offloaded.as_ref().map_or_else(Vec::new, |o| o.take_nodes());
            for n in &nodes {
                keep.push(n.anchor.clone());
                keep.push(n.selected.clone());
                keep.push(n.weights.clone());
                keep.push(n.input.clone());
                keep.extend(n.pred.clone());
                keep.extend(n.gpu_out.clone());
                keep.extend(n.direct_preds.iter().map(|p| p.1.clone()));
                keep.extend(n.direct_ids.clone());
            }
            Ok::<_, EngineError>(keep)
        })?;
        Ok((g, nodes))
    }

    fn forward_ubatch(
        &mut self,
        tokens: &[u32],
        last_only: bool,
        embd: bool,
    ) -> Result<Vec<Vec<f32>>, EngineError> {
        let n = tokens.len();
        let t0 = std::time::Instant::now();
        let n_past = self.n_past;
        let n_kv = BatchInputs::padded_n_kv(n_past, n, self.kv.n_ctx);
        // Reuse the last graph when the shapes match: decode steps within one KV bucket differ
        // only in their inputs. Otherwise build, and let the scheduler allocate it.
        let comp = self.comp_plans(&dsv4::single(n_past, n), n);
        let key = GraphKey {
            n_tokens: n,
            n_kv,
            last_only,
            embd,
            comp: comp.iter().map(|(_, p, c)| (p.n_blocks(), *c)).collect(),
        };
        if self.graph.as_ref().is_none_or(|(k, _, _)| *k != key) {
            self.graph = None;
            let (g, nodes) = self.build_graph(n, n_past, n_kv, last_only, 0, embd, &comp)?;
            self.sched.alloc(&g.graph())?;
            let nodes = GraphNodes::resolve(&nodes, &g);
            self.graph = Some((key, g, nodes));
        }
        let (_, g, nodes) = self.graph.as_ref().expect("built above");
        let ids: Vec<i32> = tokens.iter().map(|&t| t as i32).collect();
        g.tensor("inp_tokens").write_i32(&ids)?;
        g.tensor("inp_pos")
            .write_i32(&(n_past as i32..(n_past + n) as i32).collect::<Vec<_>>())?;
        // An architecture whose every block is windowed (deepseek4) reads no full mask.
        let full = g.tensor("attn_inp_kq_mask");
        if full.is_allocated() {
            full.write_bytes(bytemuck::cast_slice(&causal_mask_f16(
                n_past,
                n,
                n_kv,
                usize::MAX,
            )))?;
        }
        if g.has("attn_inp_kq_mask_swa") {
            let window = self.hp.sliding_window as usize;
            g.tensor("attn_inp_kq_mask_swa")
                .write_bytes(bytemuck::cast_slice(&causal_mask_f16(
                    n_past, n, n_kv, window,
                )))?;
        }
        g.tensor("inp_kv_idxs")
            .write_i64(&(n_past as i64..(n_past + n) as i64).collect::<Vec<_>>())?;
        for (r, p, n_comp) in &comp {
            dsv4::fill(|name| g.tensor(name), *r, p, *n_comp)?;
        }
        let t1 = std::time::Instant::now();
        run_graph(&mut self.sched, self.offload.as_mut(), g, nodes, n)?;
        let t2 = std::time::Instant::now();
        let flat = g.tensor(out_name(embd)).read_f32_via(self.stage.as_ref())?;
        if let (Some(p), 1) = (self.profile.as_mut(), n) {
            let t3 = std::time::Instant::now();
            if let Some(e) = p.last_end {
                p.steps += 1;
                p.between += (t0 - e).as_secs_f64();
                p.inputs += (t1 - t0).as_secs_f64();
                p.compute += (t2 - t1).as_secs_f64();
                p.logits += (t3 - t2).as_secs_f64();
            }
            p.last_end = Some(t3);
        }
        self.n_past = n_past + n;
        let width = if embd {
            self.hp.n_embd as usize
        } else {
            self.hp.n_vocab as usize
        };
        if flat.len() == width {
            return Ok(vec![flat]); // one row (a decode step): no second copy
        }
        Ok(flat.chunks_exact(width).map(<[f32]>::to_vec).collect())
    }
}

/// Expert-id tables in the file (DeepSeek-V4's hash layers, `ffn_gate_tid2eid`: the experts a
/// token id routes to) hold i32 ids below `expert_count`: the graph hands them to the expert
/// matmuls as they are, so an id out of range would index past the experts.
fn check_expert_ids(file: &GgufModel, hp: &Hparams) -> Result<(), String> {
    for t in file.tensors() {
        if !t.name.ends_with("ffn_gate_tid2eid.weight") {
            continue;
        }
        if t.ty != GgmlType::I32 {
            return Err(format!(
                "tensor {} has type {:?}: an expert-id table must be i32",
                t.name, t.ty
            ));
        }
        let ids: &[u8] = file.tensor_data(t);
        if let Some((i, id)) = ids
            .chunks_exact(4)
            .map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .enumerate()
            .find(|&(_, id)| id < 0 || id as u64 >= hp.n_expert)
        {
            return Err(format!(
                "tensor {} holds expert id {id} at element {i}, outside 0..{} \
                 ({}.expert_count)",
                t.name, hp.n_expert, hp.arch.name
            ));
        }
    }
    Ok(())
}

/// What makes two single-sequence steps' graphs differ in shape.
#[derive(Debug, Clone, PartialEq, Eq)]
struct GraphKey {
    n_tokens: usize,
    n_kv: usize,
    last_only: bool,
    embd: bool,
    /// Per compression ratio: compressed rows made, compressed rows attended (DeepSeek-V4).
    comp: Vec<(usize, usize)>,
}

/// The name of a step graph's output: `logits`, or `embd` (the final normed hidden state).
pub(crate) fn out_name(embd: bool) -> &'static str {
    if embd {
        "embd"
    } else {
        "logits"
    }
}

/// Computes an allocated graph of `n` tokens: through the offload step hook when routed experts
/// are offloaded (see `experts::step`), straight through the scheduler otherwise.
pub(crate) fn run_graph(
    sched: &mut Sched,
    offload: Option<&mut Offload>,
    g: &OwnedGraph,
    nodes: &GraphNodes,
    n: usize,
) -> Result<(), EngineError> {
    match offload {
        Some(off) => {
            off.begin_step(n);
            let t0 = std::time::Instant::now();
            if nodes.is_direct() {
                off.begin_direct()?;
            }
            let t1 = std::time::Instant::now();
            if nodes.is_direct() && off.follows() {
                // Followed: the host prefetches from the GPU's mailboxes while the graph runs.
                sched.compute_async(&g.graph())?;
                // Experiment switch: follow only once the step has finished (no overlap).
                let late = std::env::var("POCKETMOE_FOLLOW_LATE").is_ok_and(|v| v == "1");
                if late {
                    sched.synchronize();
                }
                let followed = off.follow_step(nodes);
                sched.synchronize();
                followed?;
            } else if nodes.has_stops() {
                let mut hook = StepHook {
                    off: &mut *off,
                    nodes,
                    n_tokens: n,
                };
                sched.compute_hooked(&g.graph(), &mut hook)?;
            } else {
                // No stop: one piece, without the eval callback (ggml-cuda may then replay it
                // as a CUDA graph).
                sched.compute(&g.graph())?;
            }
            let t2 = std::time::Instant::now();
            if nodes.is_direct() {
                off.end_direct(nodes)?;
            }
            off.add_step_time(
                (t2 - t1).as_secs_f64(),
                (t1 - t0 + t2.elapsed()).as_secs_f64(),
            );
        }
        None => sched.compute(&g.graph())?,
    }
    Ok(())
}

pub use crate::model::placement::kv_rows_for;

/// Compute-buffer reserve assumed when deciding whether a model fits a budget whole.
const COMPUTE_RESERVE: u64 = 512 << 20;
/// Device memory left for the CUDA backend's own workspace (cuBLAS, its memory pool) when
/// sizing the expert cache.
const CUDA_MARGIN: u64 = 384 << 20;
/// Largest micro-batch decoded from the expert cache, with the CPU channel taking the misses
/// that do not fit (larger ones stage every used expert). 16: a server's concurrent decode
/// batch (`--parallel` up to 16) stays on the cache; at 4, a 16-stream batch on an 8 GiB budget
/// staged every expert through PCIe (docs/bench-h200.md, session 7).
const MAX_SLOT_TOKENS: usize = 16;

/// Nodes a step's graph may hold: generous for the plain blocks (~64 nodes each), and enough
/// for DeepSeek-V4's (hyper-connections, compressors and the indexer: ~200 per ratio-4 block;
/// 96 per block overflowed the context at 21 blocks).
fn graph_size(hp: &Hparams) -> usize {
    let per_block = if hp.compress_ratios.is_empty() {
        96
    } else {
        320
    };
    (hp.n_layer * per_block + 256).max(2048)
}

/// f16 causal mask [n_kv, n]: token t (position p = n_past + t) sees cache positions j <= p with
/// p - j < window (llama.cpp's standard sliding window); the padding beyond is masked too.
fn causal_mask_f16(n_past: usize, n: usize, n_kv: usize, window: usize) -> Vec<u16> {
    // Row fills, not per-element pushes: at depth 8192 a 2048-token micro-batch's mask has 25M
    // entries, and building it element by element cost tens of ms per micro-batch.
    let (zero, neg_inf) = (half::f16::ZERO.to_bits(), half::f16::NEG_INFINITY.to_bits());
    let mut m = vec![neg_inf; n_kv * n];
    for (t, row) in m.chunks_exact_mut(n_kv.max(1)).enumerate().take(n) {
        let p = n_past + t;
        let lo = (p + 1).saturating_sub(window);
        let hi = (p + 1).min(n_kv);
        if lo < hi {
            row[lo..hi].fill(zero);
        }
    }
    m
}

#[cfg(test)]
mod tests {
    use super::{auto_budget, kv_rows_for, BatchInputs, Device};
    use crate::graph::KV_PAD;

    #[test]
    fn auto_device_is_the_cpu_without_a_gpu() {
        // This build or machine has no CUDA device: Auto falls back to the CPU.
        if super::Backend::cuda_device_count() == 0 {
            assert_eq!(Device::Auto.resolve(), Device::Cpu);
        } else {
            assert_eq!(Device::Auto.resolve(), Device::Cuda(0));
        }
        assert_eq!(Device::Cuda(1).resolve(), Device::Cuda(1));
    }

    #[test]
    fn auto_budget_keeps_the_larger_margin() {
        // An H200 (141 GB, 139 GB free): 5% of it is more than 1 GiB.
        let (total, free) = (141_000_000_000u64, 139_000_000_000u64);
        assert_eq!(auto_budget(free, total), free - 7_050_000_000);
        // An 8 GiB card: 5% is 0.4 GiB, so 1 GiB stays free.
        assert_eq!(auto_budget(7 << 30, 8 << 30), 6 << 30);
        // Less free than the margin: 0 (then refused as too small, naming the smallest budget).
        assert_eq!(auto_budget(1 << 29, 8 << 30), 0);
    }

    #[test]
    fn every_attention_view_is_whole_kv_blocks_even_in_a_short_context() {
        // ggml-cuda's batch-1 flash-attention kernel (the vector kernel) needs the KV view to be
        // a multiple of 256 positions; a context of 144 (a tg128 benchmark's) gave views of 144.
        for n_ctx in [1, 100, 144, 256, 257, 1000, 4096] {
            let rows = kv_rows_for(n_ctx);
            assert!(
                rows >= n_ctx && rows.is_multiple_of(KV_PAD) && rows - n_ctx < KV_PAD,
                "{n_ctx}: {rows}"
            );
            for n_past in 0..n_ctx {
                for n in [1, 7].into_iter().filter(|n| n_past + n <= n_ctx) {
                    let n_kv = BatchInputs::padded_n_kv(n_past, n, rows);
                    assert_eq!(n_kv % KV_PAD, 0, "n_ctx {n_ctx}, n_past {n_past}, n {n}");
                    assert!(n_kv >= n_past + n && n_kv <= rows);
                }
            }
        }
    }

    #[test]
    fn causal_mask_matches_its_definition() {
        let (zero, neg_inf) = (half::f16::ZERO.to_bits(), half::f16::NEG_INFINITY.to_bits());
        for (n_past, n, n_kv, window) in [(0, 5, 8, usize::MAX), (3, 4, 16, 2), (10, 1, 11, 4)] {
            let m = super::causal_mask_f16(n_past, n, n_kv, window);
            assert_eq!(m.len(), n * n_kv);
            for t in 0..n {
                for j in 0..n_kv {
                    let p = n_past + t;
                    let want = if j <= p && p - j < window {
                        zero
                    } else {
                        neg_inf
                    };
                    assert_eq!(
                        m[t * n_kv + j],
                        want,
                        "{n_past} {n} {n_kv} {window}: ({t}, {j})"
                    );
                }
            }
        }
    }
}
