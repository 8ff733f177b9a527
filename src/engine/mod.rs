//! The engine: a GGUF model loaded on one backend (CPU, or one GPU with the CPU as fallback for
//! unsupported ops), its KV cache, and the forward pass over micro-batches. One job per file:
//! `options` (what a caller asks for), `load` (loading and the offload plan), `step` (one
//! forward pass, planned and run, for one sequence or many), `graph` (a step's graph built and
//! computed), `batch` (several sequences over a shared cache), `embed`, `sampling`, `context`
//! (the context a budget fits); this file holds the engine and its single-sequence API.
//!
//! Invariants: the cache holds positions `0..n_past`; `forward` appends; exceeding `n_ctx` is an
//! error (`ContextFull`) before any graph is built. Logits are returned for every input position.
pub mod batch;
pub mod context;
pub mod embed;
mod graph;
mod load;
mod options;
pub mod sampling;
pub mod snapshot;
pub mod split;
mod step;
pub mod tensor_split;
/// The KV cache and the weights live with the graph that reads them; their old paths stay.
pub use crate::graph::{kv, weights};
pub use graph::expert_share_nodes;
use graph::{causal_mask_f16, graph_size};
pub(crate) use graph::{out_name, run_graph};
use options::gib;
pub use options::{auto_budget, Device, EngineOptions, AUTO_MARGIN, AUTO_MARGIN_FRACTION};
pub use snapshot::StatsSnapshot;
pub use split::LayerPlan;

use crate::arch;
use crate::experts::step::GraphNodes;
use crate::experts::{Offload, OffloadOptions, StepHook};
use crate::ggml::{Backend, Context, GgmlError, GgmlType, OwnedGraph, Sched};
use crate::gguf::{GgufError, GgufModel};
use crate::graph::blocks::{Resident, RoutedExperts};
use crate::graph::step::{self as arch_step, ArchStep, Span};
use crate::graph::{BatchInputs, GraphBuilder};
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
    #[error("device {device}'s budget {} is below what its blocks need besides routed experts: the smallest that works is {} ({need} B: its weights other than routed experts, KV cache rows, offload staging and control, compute buffer, with no expert cache); raise its --gpu-mem, give it a smaller share of the layers (--tensor-split), or lower --ctx", gib(*budget), gib(*need))]
    DeviceBudgetTooSmall {
        device: usize,
        budget: u64,
        need: u64,
    },
    #[error("a sequence's KV pages hold {have} positions, {need} needed")]
    KvPages { need: usize, have: usize },
    #[error("token id {id} is outside the vocabulary (0..{n_vocab})")]
    BadToken { id: u32, n_vocab: u64 },
    /// Devices a caller asked for that this build cannot split over as asked (several
    /// devices: `engine::split`).
    #[error("{0}")]
    Devices(String),
}

pub struct Engine {
    pub hp: Hparams,
    opts: EngineOptions,
    // Field order = drop order: the cached graph first, the file map last.
    /// The last step graph built and allocated, with its shape and its offloaded layers
    /// (`step`: single-sequence and multi-sequence steps share it).
    graph: Option<(step::GraphKey, OwnedGraph, GraphNodes)>,
    /// Keys of graphs that ran their warm-up (`step::WarmKeys`).
    warm_keys: step::WarmKeys,
    offload: Option<Offload>,
    sched: Sched,
    kv: kv::KvCache,
    weights: weights::Weights,
    _backends: Vec<Rc<Backend>>,
    /// The layer split over several devices (`None`: one device, as before).
    split: Option<split::Split>,
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
    /// Device bytes this engine allocated itself: weights, KV cache, offload buffers and the
    /// scheduler's compute buffer (what a `--gpu-mem` budget covers, minus the backend's own
    /// workspace).
    pub fn device_bytes(&self) -> u64 {
        self.weights.bytes()
            + self.kv.bytes() as u64
            + self.offload.as_ref().map_or(0, |o| o.dev_bytes() as u64)
            + self.compute_bytes()
    }

    /// Bytes of the scheduler's compute buffers on the device(s) (each device's in a split).
    fn compute_bytes(&self) -> u64 {
        let n = self.split.as_ref().map_or(1, |s| s.devices.len());
        (0..n).map(|i| self.sched.buffer_size(i) as u64).sum()
    }

    /// The layer split's plan (`None` on one device).
    pub fn layer_plan(&self) -> Option<&LayerPlan> {
        self.split.as_ref().map(|s| &s.plan)
    }

    /// In a layer split, the device whose memory holds weight `name` (`None` on one device, or
    /// for a name the weights do not hold).
    pub fn weight_device(&self, name: &str) -> Option<usize> {
        self.split
            .as_ref()?
            .device_of_tensor(self.weights.get(name)?)
    }

    /// In a layer split, the device whose memory holds the token embedding the lookup reads
    /// (with a tied head on another device, a copy of the head's matrix).
    pub fn embedding_device(&self) -> Option<usize> {
        self.split
            .as_ref()?
            .device_of_tensor(self.weights.embedding()?)
    }

    /// In a layer split, the device whose memory holds KV-cache tensor `name`.
    pub fn cache_device(&self, name: &str) -> Option<usize> {
        self.split.as_ref()?.device_of_tensor(self.kv.named(name)?)
    }

    /// The scheduler backend (device k is backend k; the CPU comes last) that ran the node
    /// named `name` of the last step's graph, and the number of backend splits of that graph.
    pub fn node_backend(&self, name: &str) -> Option<usize> {
        let (_, g, _) = self.graph.as_ref()?;
        let graph = g.graph();
        let t = (0..graph.n_nodes())
            .map(|i| graph.node(i))
            .find(|t| t.name() == name)?;
        self.sched.tensor_backend(t)
    }

    /// Tensor parallelism: the devices the meta backend spans (0 without a tensor split).
    pub fn tensor_split_devices(&self) -> usize {
        self._backends.first().map_or(0, |b| b.meta_devices())
    }

    /// Whether weight `name` is in the tensor split's (meta) memory, sliced over its devices.
    pub fn weight_is_tensor_split(&self, name: &str) -> bool {
        self.weights
            .get(name)
            .is_some_and(crate::ggml::meta::in_meta_buffer)
    }

    /// Bytes of the buffer weight `name` is in; in a tensor split, the largest device's part
    /// of it (what one device holds).
    pub fn weight_buffer_bytes(&self, name: &str) -> Option<usize> {
        self.weights.get(name).map(crate::ggml::meta::buffer_bytes)
    }

    /// Backend splits of the last step's graph (ggml's scheduler: runs of nodes on one backend).
    pub fn n_splits(&self) -> usize {
        self.sched.n_splits()
    }

    /// Nodes of the last step's graph (`None` before the first step).
    pub fn graph_nodes(&self) -> Option<usize> {
        self.graph.as_ref().map(|(_, g, _)| g.graph().n_nodes())
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
        let n_tp = self.tensor_split_devices();
        let dev = match o.device {
            _ if n_tp > 0 => format!("a tensor split over {:?} (-sm tensor)", o.devices),
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
        if let Some(sp) = &self.split {
            return self.split_plan(sp);
        }
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
                if n_tp > 0 {
                    let held = self
                        .weights
                        .get(weights::TOKEN_EMBD)
                        .map_or(0, crate::ggml::meta::buffer_bytes);
                    let attn = match tensor_split::whole_attention(self.hp.arch.name) {
                        Some(why) => format!("attention whole on every device ({why})"),
                        None => "attention by heads".to_string(),
                    };
                    s += &format!(
                        "\n  tensor split: {attn}, FFNs and experts by their hidden dimension, \
                         the head by vocabulary, the rest whole on each of the {n_tp} devices; \
                         the largest device holds {} of weights",
                        gib(held as u64)
                    );
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

    /// [`Engine::plan`] of a layer split: per device, its blocks, weights, KV cache and
    /// compute buffer.
    fn split_plan(&self, sp: &split::Split) -> String {
        let gib = |b: u64| format!("{:.2} GiB", b as f64 / (1u64 << 30) as f64);
        let o = &self.opts;
        let p = &sp.plan;
        let held = match &self.offload {
            // -sm expert places only offloaded experts: say so rather than ignore it.
            None if o.expert_parallel => {
                "all weights resident, so -sm expert changes nothing: each device holds its own \
                 blocks' experts"
                    .to_string()
            }
            None => "all weights resident".to_string(),
            Some(off) if off.expert_parallel() => format!(
                "routed experts offloaded: {} in page-locked host memory, each device caching a \
                 share of every layer's experts (-sm expert)",
                gib(off.host_bytes() as u64)
            ),
            Some(off) => format!(
                "routed experts offloaded: {} in page-locked host memory, an expert cache per device",
                gib(off.host_bytes() as u64)
            ),
        };
        let mut s = format!(
            "plan: model {} split by layers over {} devices ({held}; KV cache {} tokens, {})",
            gib(self.model_bytes),
            sp.devices.len(),
            o.n_ctx,
            o.kv_type.name()
        );
        for (k, dev) in sp.devices.iter().enumerate() {
            let name = match o.devices[k] {
                Device::Cuda(i) => format!("CUDA{i}"),
                _ => format!("CPU stand-in {k}"),
            };
            let r = &p.blocks[k];
            let blocks = if r.is_empty() {
                "no blocks".to_string()
            } else {
                format!("blocks {}..={}", r.start, r.end - 1)
            };
            let mut ends = Vec::new();
            if k == p.input {
                ends.push("token embedding");
            }
            if k == p.output {
                ends.push("output head");
            }
            let ends = if ends.is_empty() {
                String::new()
            } else {
                format!(" + {}", ends.join(" + "))
            };
            let budget = sp.budgets[k].map_or(String::new(), |b| format!(", budget {}", gib(b)));
            s += &format!(
                "\n  {name}: {blocks}{ends}; weights {}, KV cache {}, compute buffer {}{budget}",
                gib(self.weights.bytes_in(dev.buffer_type())),
                gib(self.kv.bytes_in(dev.buffer_type()) as u64),
                gib(self.sched.buffer_size(k) as u64)
            );
            if let Some(off) = self.offload.as_ref().filter(|o| o.slot_bytes_on(k) > 0) {
                let n = off.n_slots_on(k);
                let of = if off.expert_parallel() {
                    // Its share of every layer's experts (expert e on device e mod n).
                    let share = (k..self.hp.n_expert as usize).step_by(off.shares()).count();
                    format!(
                        "of its {share} (experts e with e mod {} = {k}) in every MoE layer",
                        off.shares()
                    )
                } else {
                    format!("of {}", self.hp.n_expert)
                };
                s += &format!(
                    "; expert cache {n} slots per layer {of} ({:.0}%), {}",
                    100.0 * n as f64 / self.hp.n_expert.max(1) as f64,
                    gib(off.slots_alloc_bytes_on(k, n) as u64)
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

    /// As [`Engine::expert_cache_bytes`] for the layers of device `d` of a layer split (device
    /// 0: all of them on one device).
    pub fn expert_cache_bytes_on(&self, d: usize, n_slots: usize) -> Option<u64> {
        self.offload
            .as_ref()
            .map(|o| o.slots_alloc_bytes_on(d, n_slots) as u64)
    }

    /// The expert cache's slots per layer on device `d` (`None` when fully resident).
    pub fn expert_slots_on(&self, d: usize) -> Option<usize> {
        self.offload.as_ref().map(|o| o.n_slots_on(d))
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
    /// `ggml::capture`); `None` stops. `cap` must outlive its use. Refused under a tensor split:
    /// ggml's meta backend aborts the process when a node it holds as per-device partial sums
    /// (an FFN's down product before its all-reduce) is read, and which nodes those are is its
    /// own (not exported) business.
    pub fn set_capture(
        &mut self,
        cap: Option<&mut crate::ggml::capture::Capture>,
    ) -> Result<(), EngineError> {
        if cap.is_some() && self.tensor_split_devices() > 0 {
            return Err(EngineError::Devices(
                "capturing graph nodes (POCKETMOE_TRACE_NODES, the parity captures) is not \
                 built under --split-mode tensor: ggml's meta backend aborts on reading a node \
                 it holds as per-device partial sums; trace with --split-mode layer or one device"
                    .into(),
            ));
        }
        self.sched.set_capture(cap);
        Ok(())
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

    /// The architecture's plan of a step of `n` tokens over `spans` (empty for a model that
    /// keeps no state of its own per sequence, [`crate::arch::SeqState`]).
    fn arch_step(&self, spans: &[Span], n: usize) -> ArchStep {
        match crate::arch::seq_state(&self.hp) {
            Some(s) => (s.plan)(
                &self.hp,
                spans,
                n,
                self.opts.n_seq.max(1),
                self.kv.n_ctx, // the rows `arch.kv.extra` sized its caches for
            ),
            None => ArchStep::default(),
        }
    }

    /// One micro-batch of the single sequence: its tokens at positions (and cache rows)
    /// `n_past..`.
    fn forward_ubatch(
        &mut self,
        tokens: &[u32],
        last_only: bool,
        embd: bool,
    ) -> Result<Vec<Vec<f32>>, EngineError> {
        let n = tokens.len();
        let n_past = self.n_past;
        let plan = step::StepPlan {
            ids: tokens.iter().map(|&t| t as i32).collect(),
            pos: (n_past as i32..(n_past + n) as i32).collect(),
            rows: (n_past as i64..(n_past + n) as i64).collect(),
            n_kv: BatchInputs::padded_n_kv(n_past, n, self.kv.n_ctx),
            kv_lo: 0,
            mask: step::Mask::Causal { n_past },
            out: if last_only && n > 1 {
                step::Outputs::Last
            } else {
                step::Outputs::All
            },
            embd,
            arch: self.arch_step(&arch_step::single(n_past, n), n),
        };
        let out = self.run_step(&plan)?;
        self.n_past = n_past + n;
        Ok(out)
    }
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
