//! What an engine is asked for: the device, the options a caller sets, and the automatic VRAM
//! budget.
use super::*;

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

impl EngineOptions {
    /// The devices the engine runs on: [`EngineOptions::devices`], or `[device]` when empty.
    pub fn device_list(&self) -> Vec<Device> {
        if self.devices.is_empty() {
            vec![self.device]
        } else {
            self.devices.clone()
        }
    }
}

/// `b` bytes as GiB with two decimals, for messages.
pub(super) fn gib(b: u64) -> String {
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
    /// The device the model runs on (when [`EngineOptions::devices`] is empty).
    pub device: Device,
    /// Several devices, for a layer split (llama.cpp's `-sm layer`, issue 26): each holds a
    /// contiguous run of blocks with their KV rows, the first also the token embedding, the
    /// last the output head (`engine::split`). Empty (the default): `device` alone, the
    /// single-device engine. A one-element list is the same as `device` = that element.
    /// [`Device::Cpu`] more than once stands in for GPUs on a machine without them: each its
    /// own CPU backend with its own memory (what tests/multi_device.rs checks the split with).
    /// CPU and CUDA devices are not mixed.
    pub devices: Vec<Device>,
    /// Each device's share of the blocks (llama.cpp's `--tensor-split`, e.g. `[3.0, 1.0]`);
    /// empty: in proportion to each device's memory (its `gpu_mem` budget or free VRAM; equal
    /// for CPU stand-ins).
    pub tensor_split: Vec<f64>,
    /// With several [`EngineOptions::devices`]: tensor parallelism (llama.cpp's `-sm tensor`,
    /// `engine::tensor_split`) instead of the layer split: every block on every device, each
    /// weight cut across them (`tensor_split` then gives each device's share of every cut
    /// dimension). Resident models only.
    pub split_tensors: bool,
    /// With several [`EngineOptions::devices`] in a layer split that offloads: expert
    /// parallelism for the routed experts (`--split-mode expert`): every device caches and
    /// computes a share of every offloaded layer's experts (expert `e` on device `e mod n`), so
    /// a decode step's misses cross every device's link at once, while the dense weights keep
    /// the layer split. `false`: each device caches its own blocks' experts. No effect on one
    /// device or when nothing is offloaded.
    pub expert_parallel: bool,
    pub n_ctx: usize,
    pub n_threads: usize,
    pub n_ubatch: usize,
    pub kv_type: GgmlType,
    /// Memory budget on the main device (bytes). With a budget the model does not fit in,
    /// routed experts are offloaded (docs/design.md §4.1). `None` on a GPU: the device's free
    /// memory minus a margin ([`auto_budget`]), so a model larger than the GPU offloads by
    /// itself.
    pub gpu_mem: Option<u64>,
    /// A layer split's budgets, one per device in device order (`--gpu-mem 22GiB,11GiB`);
    /// empty: `gpu_mem` for every device, or, without it, each GPU's free memory minus the
    /// margin. Where the devices' budgets together are below the model, each device offloads
    /// the routed experts of its blocks into an expert cache of its own.
    pub gpu_mems: Vec<u64>,
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
    /// Offloading on a GPU: spinning CPU-channel hand-overs and the slack controller
    /// (docs/design.md §4.5). Both on by default; `POCKETMOE_CPU_SPIN=0` and
    /// `POCKETMOE_SLACK_CONTROL=0` turn them off in the default options (A/B switches, read
    /// once, when the options are made; docs/usage.md "Environment switches").
    pub cpu_spin: bool,
    pub slack_control: bool,
    /// Offloading on one GPU: decode steps run gated (`experts::offload::gated`: the graph's
    /// pieces queued a stop ahead, behind a gate on the device, so a stop does not wait for the
    /// next piece's launch). Default auto: on CUDA, whichever of gated, the eval-hook path and
    /// the hook path prefetching half its budget measures fastest (`experts::offload::duel`);
    /// `POCKETMOE_GATED=1` always, `=0` never (both prefetching the whole budget).
    pub gated_decode: crate::experts::Gated,
    /// Gated decode in table form (`experts::offload::table`, docs/design.md §4.4b): a step of
    /// up to 8 tokens gathers its picks' slots from expert tables on the device, and a stop
    /// whose picks all hit opens its own gate. Faster where the cache hits, slower where it
    /// misses (H100, 2026-12-06). `POCKETMOE_TABLE=auto`: one more arm of `gated_decode`'s duel
    /// (built 2026-12-07, not yet run on a GPU: so not the default); `=1` always; by default
    /// never.
    pub table_decode: crate::experts::TableForm,
    /// Gated decode in control form, split (`experts::offload::gated`): a layer's GPU experts
    /// wait for its copies only and run beside the CPU channel's job, the add of the CPU's
    /// share waits for a gate of its own, opened after the join (as on the eval-hook path;
    /// unsplit, the gate opens after the join and the GPU idles through the job). Off by
    /// default: slower at uniform routing (2026-12-06, Qwen3-30B-A3B q4_k_m: H100, build
    /// 5487e6d, 12 GiB 93.2 against 97.7 t/s, 8 GiB 64.3 against 72.3; H200, build 4d0b1af, its
    /// joins measured against the copies, 91.4 against 94.6 and 61.4 against 67.1).
    /// `POCKETMOE_GATED_SPLIT=1` turns it on in the default options.
    pub gated_split: bool,
    /// Tests, on the CPU standing in for the GPU: a copy into "device" memory fills its
    /// destination with NaN bytes when queued and lands only at the latest moment the copy
    /// engine's contract allows (the next wait, fence or gate opening), as a GPU copy may; a
    /// read before then computes NaN (`experts::host_copy`). Ignored on a GPU.
    /// `POCKETMOE_LATE_COPIES=1` turns it on in the default options (every CPU test at once).
    pub late_copies: bool,
    /// Expert-cache policy when offloading.
    pub policy: crate::experts::policy::PolicyKind,
    /// Sequences served at once (`engine::batch`, the server's `--parallel`): the per-sequence
    /// state some architectures keep besides the KV rows (DeepSeek-V4's compressor rings) is
    /// sized for this many.
    pub n_seq: usize,
    /// On the CPU (no GPU, no offload): weights read only as the matrix of a matrix product go
    /// into the CPU's extra buffer types where its kernels take them (ggml-cpu's repack layout:
    /// interleaved Q4_K/Q4_0/IQ4_NL/MXFP4 blocks, faster products), as llama.cpp does by default
    /// (its `--no-repack` turns it off, as `false` here does). See `Engine::fill_weights`.
    pub repack: bool,
    /// Offloading: the routed experts of the layers below this one stay in the weights, on the
    /// device, as fully resident (no stop, no cache), and the expert cache takes what is left
    /// of the budget for the others: llama.cpp's static split turned around (its `-ncmoe`
    /// keeps the first layers' experts on the CPU). For measuring where routing is uniform,
    /// where a cache spread thin over every layer hits little and each of its layers pays a
    /// stop (H200, 2026-12-06, uniform routing: 12 GiB 92.1-92.6 t/s at R = 16 and 24 against
    /// 88.6 at 0, 8 GiB 66.1 at R = 10 against 67.8: no gain beyond the noise, the misses move
    /// to fewer layers); `POCKETMOE_RESIDENT_MOE=R` sets it in the default options (default 0).
    pub resident_moe_layers: usize,
}

impl Default for EngineOptions {
    fn default() -> Self {
        Self {
            n_seq: 1,
            device: Device::Cpu,
            devices: Vec::new(),
            tensor_split: Vec::new(),
            split_tensors: false,
            expert_parallel: false,
            n_ctx: 4096,
            n_threads: 0,
            n_ubatch: 512,
            kv_type: GgmlType::F16,
            gpu_mem: None,
            gpu_mems: Vec::new(),
            policy: Default::default(),
            prefetch: true,
            cpu_experts: true,
            offload_bandwidths: None,
            miss_balance: true,
            cpu_spin: switch_on("POCKETMOE_CPU_SPIN"),
            slack_control: switch_on("POCKETMOE_SLACK_CONTROL"),
            gated_decode: crate::experts::Gated::from_env(),
            table_decode: crate::experts::TableForm::from_env(),
            gated_split: std::env::var("POCKETMOE_GATED_SPLIT").as_deref() == Ok("1"),
            late_copies: std::env::var("POCKETMOE_LATE_COPIES").as_deref() == Ok("1"),
            repack: true,
            resident_moe_layers: std::env::var("POCKETMOE_RESIDENT_MOE")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(0),
        }
    }
}

/// An A/B switch: on unless the environment sets `name` to `0`.
fn switch_on(name: &str) -> bool {
    std::env::var(name).map_or(true, |v| v != "0")
}
