//! Loading an engine: the file checked and mapped, weights placed on the backends, the KV
//! cache, the offload plan (how many expert-cache slots fit the budget) and the warnings about
//! tensors no graph reads.
use super::*;

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
        let devices: Vec<Device> = opts
            .device_list()
            .into_iter()
            .map(Device::resolve)
            .collect();
        opts.device = devices[0];
        opts.devices = if devices.len() > 1 {
            devices
        } else {
            Vec::new()
        };
        let multi = !opts.devices.is_empty();
        if opts.expert_parallel && opts.split_tensors {
            return Err(EngineError::Devices(
                "expert parallelism (--split-mode expert) runs over the layer split; the tensor                  split (--split-mode tensor) cuts every expert across the devices instead:                  choose one"
                    .into(),
            ));
        }
        // Tensor parallelism: one meta backend over the devices (`tensor_split`), which the rest
        // of the engine sees as one device; no layer split.
        let (meta, tp_held) = if multi && opts.split_tensors {
            let (b, held) = tensor_split::backend(&opts, &hp, &file)?;
            (Some(Rc::new(b)), held)
        } else {
            (None, Vec::new())
        };
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
        let gpu = match (&meta, opts.device) {
            (Some(m), Device::Cuda(_)) => Some(m.clone()),
            (Some(_), _) => None,
            (None, Device::Cuda(i)) => Some(Rc::new(Backend::cuda(i)?)),
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
        // A layer split: its plan and its devices' backends (the first is `gpu`, made above).
        let split = if multi && meta.is_none() {
            let given: Vec<u64> = if !opts.gpu_mems.is_empty() {
                opts.gpu_mems.clone()
            } else {
                (!auto_budget)
                    .then_some(opts.gpu_mem)
                    .flatten()
                    .into_iter()
                    .collect()
            };
            Some(split::Split::new(&opts, gpu.clone(), &given, &hp)?)
        } else {
            None
        };
        // Offload when the budget is below the whole model (+ KV + a compute reserve); in a
        // layer split, when the devices' budgets together are.
        let need = total_bytes + kv_bytes;
        // A tensor split: each device's budget (given per device, one given for all, or
        // (automatic) the meta device's free memory, the devices' together, shared evenly)
        // against what it holds: every whole tensor (a whole-attention architecture's
        // attention among them), its slices of the cut ones, its share of the KV cache and a
        // compute reserve. The first device that does not fit, with its need and budget.
        let n_dev = opts.devices.len().max(1) as u64;
        let tp_over = tp_held.iter().enumerate().find_map(|(k, h)| {
            let budget = match (opts.gpu_mems.get(k), auto_budget) {
                (Some(&b), _) => Some(b),
                (None, true) => opts.gpu_mem.map(|b| b / n_dev),
                (None, false) => opts.gpu_mem,
            }?;
            let holds = h.weights + (kv_bytes as f64 * h.kv).ceil() as u64 + COMPUTE_RESERVE;
            (holds > budget).then_some((k, holds, budget))
        });
        let offload = match (&split, &meta) {
            (Some(s), _) => !s.fits(need, COMPUTE_RESERVE),
            (None, Some(_)) => tp_over.is_some(),
            (None, None) => opts.gpu_mem.is_some_and(|b| need + COMPUTE_RESERVE > b),
        };
        if offload && hp.n_expert == 0 {
            if let Some(s) = &split {
                return Err(EngineError::Devices(format!(
                    "the model and its KV cache ({}) do not fit the {} devices' budgets ({} \
                     together, with compute reserves of {} each), and a dense model has no \
                     routed experts to offload: give the devices more memory (--gpu-mem) or \
                     lower --ctx",
                    gib(need),
                    s.devices.len(),
                    gib(s.budgets.iter().flatten().sum()),
                    gib(COMPUTE_RESERVE)
                )));
            }
        }
        if let (true, Some((k, holds, budget))) = (offload && meta.is_some(), tp_over) {
            let whole = match tensor_split::whole_attention(hp.arch.name) {
                Some(why) => format!(", attention and KV cache whole on every device ({why})"),
                None => String::new(),
            };
            return Err(EngineError::Devices(format!(
                "device {k} of the tensor split would hold {} (its weights {}: the whole \
                 tensors and its slices of the cut ones{whole}; its KV share; a compute \
                 reserve of {}), over its budget of {}; the model and its KV cache are {} in \
                 all. The tensor split does not offload routed experts yet: use --split-mode \
                 layer (each device caches its blocks' experts), or give more memory",
                gib(holds),
                gib(tp_held[k].weights),
                gib(COMPUTE_RESERVE),
                gib(budget),
                gib(need)
            )));
        }
        let offload = offload && hp.n_expert > 0;
        // A GPU named twice (`--gpu 0,0`, logical devices for tests) cannot offload: ggml-cuda's
        // async tensor writes assert the device's own buffer type, which a logical device's is
        // a copy of, and would abort.
        let cuda_twice = opts
            .devices
            .iter()
            .enumerate()
            .any(|(k, d)| matches!(d, Device::Cuda(_)) && opts.devices[..k].contains(d));
        if offload && cuda_twice {
            return Err(EngineError::Devices(format!(
                "--gpu {:?} names a GPU twice (logical devices), and the model does not fit \
                 their budgets: logical devices cannot offload routed experts; name each GPU \
                 once, or give more memory (--gpu-mem)",
                opts.devices
            )));
        }
        let cpu = Rc::new(Backend::cpu_polling(
            opts.n_threads,
            cpu_pool_polls(gpu.is_some(), offload && opts.cpu_experts, opts.n_threads),
        )?);
        let main = match &split {
            Some(s) => s.devices[0].clone(),
            None => meta
                .clone()
                .or_else(|| gpu.clone())
                .unwrap_or_else(|| cpu.clone()),
        };
        // Offloading, the tensors whose role is not resident (the routed experts' matrices) stay
        // out of the weights: the offload store holds them.
        let resident = |name: &str| v.roles.get(name).is_none_or(|r| r.is_resident());
        // The routed experts of the layers below `resident_moe_layers` stay in them too.
        let below = |name: &str| {
            crate::model::block_of(name).is_some_and(|il| il < opts.resident_moe_layers)
        };
        let keep = |name: &str| !offload || resident(name) || below(name);
        // Offloading to a GPU, the token embedding stays in host memory (its lookup runs on the
        // CPU) and its VRAM goes to expert slots. Fully resident, VRAM is not what limits, and
        // it stays on the GPU: no CPU split and host round trip at every step.
        // In a layer split the embedding stays on the first device (its lookup feeds block 0);
        // a head tied to it gets its own copy on the last device (as llama.cpp duplicates it),
        // else the scheduler would copy the whole matrix between devices at every step.
        let tied_split = split.as_ref().filter(|s| {
            s.plan.input != s.plan.output && file.tensors().all(|t| t.name != "output.weight")
        });
        let host = match tied_split {
            Some(s) => Some(&*s.devices[s.plan.input]),
            None => (offload && split.is_none() && !Rc::ptr_eq(&main, &cpu)).then_some(&*cpu),
        };
        // CPU-only and resident: the weights are filled once the engine can build graphs on
        // them, which decide what goes into the CPU's extra buffer types (`fill_weights`).
        let repack = opts.repack && Rc::ptr_eq(&main, &cpu) && !offload;
        let mut weights =
            weights::Weights::declare(&file, &hp, host.is_some(), &keep).map_err(|e| match e {
                weights::WeightsError::Ggml(e) => e.into(),
                missing => model_err(missing.to_string()),
            })?;
        if let Some(s) = &split {
            let place = |name: &str| match tied_split {
                // The head's copy: the last device's.
                Some(_) if name == weights::TOKEN_EMBD => s.buft(s.plan.output),
                _ => s.weight_buft(name),
            };
            weights.fill_split(&file, &main, &place, host, progress)?;
        } else if !repack {
            let none = weights::ExtraPlacement::new();
            weights.fill(&file, &main, host, &none, progress)?;
        }
        let rot = kv::rotation_sizes(opts.kv_type, hp.head_dim_k as usize, hp.head_dim_v as usize);
        let kv = kv::KvCache::new_placed(
            &main,
            &|name| split.as_ref().and_then(|s| s.cache_buft(name)),
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
                cpu_spin: opts.cpu_spin,
                slack_control: opts.slack_control,
                gated: opts.gated_decode,
                table: opts.table_decode,
                late_copies: opts.late_copies,
                gated_split: opts.gated_split,
                resident_below: opts.resident_moe_layers,
                expert_parallel: opts.expert_parallel && split.is_some(),
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
            Some(match &split {
                Some(s) => Offload::load(
                    &file,
                    &hp,
                    &s.devices,
                    &|il| s.plan.device_of(il),
                    o,
                    progress,
                )?,
                None => {
                    Offload::load(&file, &hp, std::slice::from_ref(&main), &|_| 0, o, progress)?
                }
            })
        } else {
            None
        };
        let backends = if let Some(s) = &split {
            // The devices in order (device k is the scheduler's backend k), the CPU last.
            s.devices.iter().cloned().chain([cpu]).collect()
        } else if Rc::ptr_eq(&main, &cpu) {
            vec![cpu]
        } else {
            vec![main.clone(), cpu]
        };
        let shares = off.as_ref().map_or(1, Offload::shares);
        let sched = Sched::new(&backends, graph_size(&hp, shares), false)?;
        let stage = match gpu.as_ref().filter(|g| !g.is_meta()) {
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
            warm_keys: Default::default(),
            offload: off,
            sched,
            kv,
            weights,
            _backends: backends,
            split,
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
        if eng.offload.is_some() {
            let budgets: Vec<u64> = match &eng.split {
                Some(s) => s.budgets.iter().flatten().copied().collect(),
                None => eng.opts.gpu_mem.into_iter().collect(),
            };
            eng.plan_slots(&budgets)?;
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
    pub(super) fn unread_tensors(&self) -> Result<Vec<String>, EngineError> {
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
    pub(super) fn shape_graphs(&self) -> Result<Vec<OwnedGraph>, EngineError> {
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
    pub(super) fn fill_weights(&mut self, progress: &dyn Fn(u64, u64)) -> Result<(), EngineError> {
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
    pub(super) fn reserve_largest(&mut self) -> Result<u64, EngineError> {
        let n = self.opts.n_ubatch.min(self.opts.n_ctx).max(1);
        let g = self.graph_at(n, self.opts.n_ctx - n, false)?;
        match &self.split {
            None => self.sched.reserve(&g.graph())?,
            Some(s) => {
                let graph = g.graph();
                self.sched
                    .reserve_assigned(&graph, &s.plan.assign(&graph))?;
            }
        }
        drop(g);
        Ok(self.compute_bytes())
    }

    /// The graph of a single-sequence micro-batch of `n` tokens at `n_past`, with its padded
    /// KV view and compressor plans, built but not allocated (for sizing and inspection).
    pub(super) fn graph_at(
        &self,
        n: usize,
        n_past: usize,
        last_only: bool,
    ) -> Result<OwnedGraph, EngineError> {
        let n_kv = BatchInputs::padded_n_kv(n_past, n, self.kv.n_ctx);
        let plan = self.arch_step(&arch_step::single(n_past, n), n);
        Ok(self.build_graph(n, n_kv, 0, last_only, 0, false, &plan)?.0)
    }

    /// Sizes the compute buffer on the largest graph (a full micro-batch at the full context, in
    /// staging mode), then gives the expert cache what is left of each device's budget
    /// (`budgets`: one per device, the one device's without a layer split).
    ///
    /// Large micro-batches amortise prefill copies but need a large compute buffer; while that
    /// leaves the cache of some device fewer than two tokens' worth of slots, the micro-batch is
    /// halved (down to 512).
    pub(super) fn plan_slots(&mut self, budgets: &[u64]) -> Result<(), EngineError> {
        let k = self.hp.n_expert_used.max(1);
        let n_dev = budgets.len();
        let holds = |off: &Offload, d: usize| off.slot_bytes_on(d) > 0;
        let fixed = loop {
            self.reserve_largest()?;
            let off = self.offload.as_ref().expect("offloading");
            let fixed: Vec<u64> = (0..n_dev).map(|d| self.device_fixed(d)).collect();
            let fewest = (0..n_dev)
                .filter(|&d| holds(off, d))
                .map(|d| budgets[d].saturating_sub(fixed[d]) / off.slot_bytes_on(d) as u64)
                .min()
                .unwrap_or(u64::MAX);
            if fewest >= 2 * k || self.opts.n_ubatch <= 512 {
                break fixed;
            }
            // A fresh scheduler: reserved buffers only ever grow.
            self.opts.n_ubatch /= 2;
            let shares = self.offload.as_ref().map_or(1, Offload::shares);
            self.sched = Sched::new(&self._backends, graph_size(&self.hp, shares), false)?;
        };
        for d in 0..n_dev {
            let (budget, fixed) = (budgets[d], fixed[d]);
            let off = self.offload.as_mut().expect("offloading");
            if fixed > budget {
                return Err(match &self.split {
                    None => EngineError::BudgetTooSmall {
                        budget,
                        need: fixed,
                    },
                    Some(_) => EngineError::DeviceBudgetTooSmall {
                        device: d,
                        budget,
                        need: fixed,
                    },
                });
            }
            let per_slot = off.slot_bytes_on(d).max(1) as u64;
            let mut n_slots = (budget - fixed) / per_slot;
            // Padding and alignment per matrix: step down until the slots really fit.
            while n_slots > 0
                && off.slots_alloc_bytes_on(d, n_slots as usize) as u64 > budget - fixed
            {
                n_slots -= 1;
            }
            tracing::info!(
                "offload{}: budget {budget} B; fixed {fixed} B (staging+control {} B), micro-batch {} -> {n_slots} expert slots per layer of {}",
                if n_dev > 1 { format!(" on device {d}") } else { String::new() },
                off.dev_bytes_on(d),
                self.opts.n_ubatch,
                self.hp.n_expert
            );
            if holds(off, d) {
                off.alloc_slots(d, n_slots as usize)?;
            }
        }
        Ok(())
    }

    /// Device `d`'s bytes besides expert slots: its weights, KV cache, offload staging and
    /// control, compute buffer, and the CUDA workspace margin on a GPU.
    fn device_fixed(&self, d: usize) -> u64 {
        let off = self
            .offload
            .as_ref()
            .map_or(0, |o| o.dev_bytes_on(d) as u64);
        let compute = self.sched.buffer_size(d) as u64;
        match &self.split {
            None => {
                let margin = if self._backends[0].is_cuda() {
                    CUDA_MARGIN
                } else {
                    0
                };
                self.weights.bytes() + self.kv.bytes() as u64 + off + compute + margin
            }
            Some(s) => {
                let dev = &s.devices[d];
                let margin = if dev.is_cuda() { CUDA_MARGIN } else { 0 };
                let b = dev.buffer_type();
                self.weights.bytes_in(b) + self.kv.bytes_in(b) as u64 + off + compute + margin
            }
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
pub(crate) fn cpu_pool_polls(gpu: bool, cpu_experts: bool, n_threads: usize) -> bool {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let n = if n_threads == 0 { cores } else { n_threads };
    !cpu_experts && (gpu || n < cores)
}

/// `names` for the unused-tensor warning: each by name, except that a multi-token-prediction
/// block (`blk.N.*` with N at or past `n_decode`, not built) is one entry with its count.
pub(super) fn unused_summary(names: &[String], n_decode: usize) -> String {
    let mtp_block = |name: &str| crate::model::block_of(name).filter(|&n| n >= n_decode);
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

/// Expert-id tables in the file (DeepSeek-V4's hash layers, `ffn_gate_tid2eid`: the experts a
/// token id routes to) hold i32 ids below `expert_count`: the graph hands them to the expert
/// matmuls as they are, so an id out of range would index past the experts.
pub(super) fn check_expert_ids(file: &GgufModel, hp: &Hparams) -> Result<(), String> {
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
