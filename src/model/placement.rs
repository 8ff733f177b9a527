//! The placement plan for a VRAM budget (docs/design.md §1, §4.1): what stays resident on the
//! GPU, what the KV cache and compute buffers take, how many routed experts fit in the expert
//! cache, and the decode-speed bound the physics then implies.
//!
//! Bound for one decoded token (batch 1), with `f` the expected cache hit rate:
//!   resident bytes read once from HBM + hit expert bytes from HBM, and miss bytes either over
//!   PCIe alone, or split between PCIe and the CPU so both finish together
//!   (`t = miss / (pcie + cpu)`). The token time is the largest of the channel times.
use super::{Hparams, Role};
use crate::gguf::TensorInfo;
use std::collections::HashMap;

/// Granularity of the attended cache length (llama.cpp pads the same way).
pub const KV_PAD: usize = 256;

/// KV-cache rows for a context of `n_ctx` positions: a whole number of [`KV_PAD`] blocks, as
/// libllama pads its cache. Every attention view is then a multiple of 256 positions, which
/// ggml-cuda's vector flash-attention kernel (the batch-1 decode kernel) requires: with an
/// unpadded cache a short context (a benchmark's, or `--ctx 1000`) sent each decode step's
/// attention to the tensor-core kernel instead, 21 us per call against 8.5 (issue 30: the
/// fresh-process tg128 at 0.77x stock, docs/bench-h200.md). Positions past `n_ctx` stay unused:
/// `forward` still refuses them (`ContextFull`).
pub fn kv_rows_for(n_ctx: usize) -> usize {
    n_ctx.max(1).next_multiple_of(KV_PAD)
}

/// Bandwidths the bound uses, bytes/s. Defaults: measured on the H200 box (docs/design.md §1).
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct Bandwidths {
    pub hbm: f64,
    pub pcie: f64,
    pub cpu: f64,
}

impl Default for Bandwidths {
    fn default() -> Self {
        Self {
            hbm: 4.47e12,
            pcie: 50.7e9,
            cpu: 68e9,
        }
    }
}

/// Compute-buffer reserve besides the logits: what llama.cpp's graph allocator typically needs
/// for a 512-token micro-batch of a large MoE model.
const COMPUTE_RESERVE: u64 = 512 << 20;

#[derive(Debug, Clone, serde::Serialize)]
pub struct Placement {
    pub gpu_mem: u64,
    pub n_ctx: u64,
    pub resident_bytes: u64,
    /// Non-expert bytes kept in host memory: the token embedding (unless the head is tied to it).
    pub host_bytes: u64,
    pub kv_bytes: u64,
    pub compute_bytes: u64,
    /// Routed-expert bytes in the whole model, and per expert (one expert of one layer, all of its
    /// up/gate/down tensors and biases).
    pub expert_bytes_total: u64,
    pub expert_bytes_each: u64,
    pub n_experts_total: u64,
    /// How many experts the cache holds, and that as a fraction of all.
    pub cache_bytes: u64,
    pub experts_cached: u64,
    pub cached_fraction: f64,
    /// Whether resident parts + KV + compute fit at all.
    pub fits: bool,
    /// Bytes read per decoded token: resident parts that every token reads, and routed experts.
    pub active_resident_bytes: u64,
    pub active_expert_bytes: u64,
    pub hit_rate: f64,
    pub bandwidths: Bandwidths,
    /// Decode bounds (tokens/s): all experts on the GPU (if it all fit), misses over PCIe only,
    /// misses over PCIe and the CPU in parallel.
    pub bound_all_in_vram: f64,
    pub bound_pcie_only: f64,
    pub bound_pcie_and_cpu: f64,
}

/// KV-cache bytes for `n_ctx` tokens (f16 K and V; MLA caches the compressed latent; sliding
/// window layers cache at most the window).
pub fn kv_bytes(hp: &Hparams, n_ctx: u64) -> u64 {
    if !hp.dsv4.compress_ratios.is_empty() {
        // DeepSeek-V4 (`graph::dsv4`): one K row (= V) per position and block, plus per
        // compressed block a row per `ratio` positions, and at ratio 4 the indexer's key too.
        let hd = hp.head_dim_k_at(0);
        return (0..hp.n_layer_decode())
            .map(|il| {
                let per = match hp.dsv4.compress_ratios.get(il).copied().unwrap_or(0) {
                    0 => 0,
                    4 => (hd + hp.indexer.head_dim) * n_ctx.div_ceil(4),
                    r => hd * n_ctx.div_ceil(r),
                };
                (hd * n_ctx + per) * 2
            })
            .sum();
    }
    // Absorbed MLA caches the latent row only; legacy attn_kv_b files cache per-head K and V.
    let per_token_layer = if hp.mla.kv_lora_rank > 0 && hp.is_mla() {
        hp.mla.kv_lora_rank + hp.n_rot
    } else {
        hp.k_dim() + hp.v_dim()
    };
    (0..hp.n_layer_decode())
        .map(|il| {
            // gpt-oss alternates sliding-window and full layers, starting with a sliding one.
            let ctx = if hp.swa.window > 0 && il % 2 == 0 {
                n_ctx.min(hp.swa.window)
            } else {
                n_ctx
            };
            ctx * per_token_layer * 2
        })
        .sum()
}

/// Plans placement of `tensors` (classified by `roles`) for a GPU budget of `gpu_mem` bytes.
/// `hit_rate` = expected cache hit rate; `None` assumes uniform routing (hit rate = cached
/// fraction, the pessimistic case).
pub fn plan(
    hp: &Hparams,
    tensors: &[TensorInfo],
    roles: &HashMap<String, Role>,
    gpu_mem: u64,
    n_ctx: u64,
    hit_rate: Option<f64>,
    bw: Bandwidths,
) -> Placement {
    let role = |t: &TensorInfo| roles.get(&t.name).copied().unwrap_or(Role::Other);
    // Offloading, the token embedding lives in host memory (looked up on the CPU, as llama.cpp
    // does), unless the output head is tied to it and so reads it whole on the GPU. (A model
    // that fits whole keeps it on the GPU: 0.3 GB more for a 150k vocabulary.)
    let tied = !tensors.iter().any(|t| role(t) == Role::Output);
    let on_gpu = |t: &TensorInfo| role(t).is_resident() && (role(t) != Role::Embedding || tied);
    let resident_bytes: u64 = tensors
        .iter()
        .filter(|t| on_gpu(t))
        .map(|t| t.n_bytes)
        .sum();
    let host_bytes: u64 = tensors
        .iter()
        .filter(|t| role(t).is_resident() && !on_gpu(t))
        .map(|t| t.n_bytes)
        .sum();
    let expert_bytes_total: u64 = tensors
        .iter()
        .filter(|t| role(t) == Role::RoutedExperts)
        .map(|t| t.n_bytes)
        .sum();
    let n_moe_layers = (0..hp.n_layer_decode())
        .filter(|&il| hp.is_moe_layer(il))
        .count() as u64;
    let n_moe_layers_file = (0..hp.n_layer).filter(|&il| hp.is_moe_layer(il)).count() as u64;
    let n_experts_total = n_moe_layers_file * hp.n_expert;
    let expert_bytes_each = expert_bytes_total.checked_div(n_experts_total).unwrap_or(0);
    // The engine's cache holds whole 256-row blocks (`engine::kv_rows_for`).
    let kv = kv_bytes(hp, kv_rows_for(n_ctx as usize) as u64);
    let compute = COMPUTE_RESERVE + hp.n_vocab * 4 * 512;
    let fixed = resident_bytes + kv + compute;
    let fits = fixed <= gpu_mem;
    let cache_bytes = gpu_mem.saturating_sub(fixed);
    let experts_cached = cache_bytes
        .checked_div(expert_bytes_each)
        .unwrap_or(0)
        .min(n_experts_total);
    let cached_fraction = if n_experts_total > 0 {
        experts_cached as f64 / n_experts_total as f64
    } else {
        1.0
    };
    let hit = hit_rate.unwrap_or(cached_fraction).clamp(0.0, 1.0);

    // Per token: the output head (a tied embedding included) is read whole; attention, norms,
    // routers and shared experts of every decode layer are read once.
    let active_resident_bytes: u64 = tensors
        .iter()
        .filter(|t| on_gpu(t) && role(t) != Role::Other)
        .map(|t| t.n_bytes)
        .sum();
    let active_expert_bytes = n_moe_layers * hp.n_expert_used * expert_bytes_each;
    let hbm_time = |expert_hbm: f64| (active_resident_bytes as f64 + expert_hbm) / bw.hbm;
    let hit_bytes = active_expert_bytes as f64 * hit;
    let miss_bytes = active_expert_bytes as f64 - hit_bytes;
    let bound_all_in_vram = 1.0 / hbm_time(active_expert_bytes as f64);
    let bound_pcie_only = 1.0 / hbm_time(hit_bytes).max(miss_bytes / bw.pcie);
    let bound_pcie_and_cpu = 1.0 / hbm_time(hit_bytes).max(miss_bytes / (bw.pcie + bw.cpu));
    Placement {
        gpu_mem,
        n_ctx,
        resident_bytes,
        host_bytes,
        kv_bytes: kv,
        compute_bytes: compute,
        expert_bytes_total,
        expert_bytes_each,
        n_experts_total,
        cache_bytes,
        experts_cached,
        cached_fraction,
        fits,
        active_resident_bytes,
        active_expert_bytes,
        hit_rate: hit,
        bandwidths: bw,
        bound_all_in_vram,
        bound_pcie_only,
        bound_pcie_and_cpu,
    }
}
