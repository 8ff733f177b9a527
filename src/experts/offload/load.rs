//! Loading: the host store filled from the file, staging and control buffers.
use super::*;

impl Offload {
    /// Copies every routed expert of `file` into the host store (page-locked memory of the
    /// first backend's device), and allocates staging and control tensors on each device:
    /// `backends` are the devices (one, or a layer split's), `device_of(il)` the index in them of
    /// layer `il`'s device. Slots come later: [`Offload::alloc_slots`].
    pub fn load(
        file: &GgufModel,
        hp: &Hparams,
        backends: &[Rc<Backend>],
        device_of: &dyn Fn(usize) -> usize,
        opts: OffloadOptions,
        progress: &dyn Fn(u64, u64),
    ) -> Result<Self, GgmlError> {
        let (n_expert, k) = (hp.n_expert as usize, hp.n_expert_used as usize);
        let backend = &backends[0];
        // Expert parallelism: every device caches a share of every layer's experts.
        let ep = opts.expert_parallel;
        let shares = if ep { backends.len() } else { 1 };
        let n_layer = hp.n_layer_decode();
        let mut layers = Vec::with_capacity(n_layer);
        let store = Context::new(n_layer * 3 + 1, 0)?;
        let mut pairs = Vec::new();
        for il in 0..n_layer {
            if il < opts.resident_below {
                layers.push(None); // in the weights (`OffloadOptions::resident_below`)
                continue;
            }
            let mut mats: [Option<Mat>; 3] = [None, None, None];
            for m in ExpertMat::ALL {
                let mat = m.name();
                let Some(t) = file.tensor(&format!("blk.{il}.{mat}.weight")) else {
                    continue;
                };
                let ne = [t.ne[0] as i64, t.ne[1] as i64, t.ne[2] as i64];
                let st = store
                    .new_tensor(t.ty, &ne)?
                    .set_name(&format!("blk.{il}.{mat}.weight"));
                mats[m.index()] = Some(Mat {
                    ty: t.ty,
                    ne,
                    expert_bytes: st.nb()[2],
                });
                pairs.push((st, t));
            }
            layers.push(if mats.iter().any(Option::is_some) {
                Some(Layer {
                    mats,
                    caches: (0..shares)
                        .map(|_| LayerCache::new(il, n_expert, 0, &opts.policy))
                        .collect(),
                    prefetched: Vec::new(),
                    predicted: Vec::new(),
                    staged_ahead: None,
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
        // Scratch (see `readback::ScratchLayout`): selected ids + weights (k per token, whole
        // micro-batch), the prefetch prediction and control (ids + mask) of a slot micro-batch,
        // and its FFN input.
        let t_max = opts.max_slot_tokens;
        let scratch_len = 4
            * (2 * (k * opts.n_ubatch.max(t_max)).next_multiple_of(64)
                + (n_expert * t_max).next_multiple_of(64)
                + 2 * shares * (k * t_max).next_multiple_of(64))
            + 64
            + 4 * hp.n_embd as usize * t_max
            + 1024;
        let scratch_buf = store.new_buffer(
            backend,
            Memory::Host,
            scratch_len * super::readback::SCRATCH_REGIONS,
        )?;
        let scratch = scratch_buf.base_addr();
        // A micro-batch's rows of the router's argsort (its top-k ids are a view of them).
        let sel_rows_len = 4 * n_expert * opts.n_ubatch.max(t_max).max(1);
        let sel_rows = store
            .new_buffer(backend, Memory::Host, sel_rows_len)?
            .base_addr();
        let n_moe = layers.iter().flatten().count();
        let tab = table::Tables::new(
            &store,
            backend,
            n_layer,
            n_moe,
            hp.n_embd as usize * t_max,
            n_expert,
        )?;

        // Per device: two staging areas as large as the largest of its layers' experts, and
        // the control tensors of its layers.
        let n_embd = hp.n_embd as usize;
        let layer_dev: Vec<usize> = (0..n_layer).map(device_of).collect();
        let mut parts = Vec::with_capacity(backends.len());
        for (d, backend) in backends.iter().enumerate() {
            parts.push(DevPart::new(
                backend,
                &layers,
                &|il| layer_dev[il] == d,
                shares > 1,
                k,
                t_max,
                n_embd,
                n_expert,
                opts.late_copies,
            )?);
        }
        // The CPU channel reads the expert matrices from the store in place and keeps a copy of
        // their per-expert biases (gpt-oss: f32 [ne0, n_expert], a few KiB per layer); a layer
        // whose biases are of another shape stays on the GPU.
        use crate::experts::cpu::{CpuLayer, CpuModel, HostBias, StoreMat};
        let cpu_layers: Vec<Option<CpuLayer>> = (0..n_layer)
            .map(|il| {
                layers[il].as_ref()?;
                let mut biases: [Option<HostBias>; 3] = Default::default();
                for m in ExpertMat::ALL {
                    let Some(t) = file.tensor(&format!("blk.{il}.{}.bias", m.name())) else {
                        continue;
                    };
                    if t.ty != GgmlType::F32 || t.n_dims != 2 || t.ne[1] != n_expert as u64 {
                        return None;
                    }
                    biases[m.index()] = Some(HostBias {
                        ty: t.ty,
                        ne: [t.ne[0] as i64, t.ne[1] as i64],
                        data: file.tensor_data(t).to_vec(),
                    });
                }
                let mats = ExpertMat::ALL.map(|m| {
                    let t = store.get(&store.index(), &format!("blk.{il}.{}.weight", m.name()))?;
                    let ne = t.ne();
                    Some(StoreMat {
                        ty: t.ty(),
                        ne: [ne[0], ne[1], ne[2]],
                        addr: t.data_addr(),
                        bytes: t.n_bytes(),
                    })
                });
                Some(CpuLayer { mats, biases })
            })
            .collect();
        let cpu_ok: Vec<bool> = cpu_layers.iter().map(Option::is_some).collect();
        let cpu = (opts.cpu_threads > 0 && cpu_ok.iter().any(|&b| b)).then(|| {
            let model = CpuModel {
                n_embd,
                layers: cpu_layers,
            };
            // Spinning hand-overs where a GPU runs the step and a core is left for this thread
            // (H200, 2026-12-03: hand-over 24-28 -> 1 us, decode +10%, docs/design.md §4.5);
            // `cpu_spin: false` (POCKETMOE_CPU_SPIN=0) turns them off to measure against.
            let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
            let spin = backend.is_cuda() && cores > opts.cpu_threads && opts.cpu_spin;
            crate::experts::cpu::CpuChannel::new(model, opts.cpu_threads, spin)
        });
        let cpu = cpu.transpose()?;
        let store_idx = store.index();
        let bw = opts.bandwidths;
        let balance = opts.balance;
        let mut miss = MissModel::new(bw, backend.is_cuda(), balance);
        // The slack controller (docs/design.md §4.5), where a GPU runs the step: on a CPU-only
        // engine a result that waited says nothing about spare capacity (the "GPU" side ran on
        // the same cores). `slack_control: false` (POCKETMOE_SLACK_CONTROL=0) turns it off to
        // measure against.
        miss.slack_control = backend.is_cuda() && opts.slack_control;
        let mut stats = Stats::new(n_layer);
        if backends.len() > 1 {
            stats.layer_device = layer_dev.clone();
        }
        stats.channels = cpu.as_ref().map(|_| miss.rates());
        Ok(Self {
            n_expert,
            k,
            layers,
            opts,
            #[cfg(test)]
            store_freed: Default::default(),
            store,
            store_idx,
            parts,
            layer_dev,
            shares,
            scratch,
            scratch_len,
            scratch_region: 0,
            sel_rows,
            sel_rows_len,
            stats,
            step: 0,
            host_bytes,
            n_embd,
            cpu,
            cpu_dirty: vec![false; n_layer],
            gate_stop: None,
            tab,
            planned: None,
            duels: Default::default(),
            gate_next: 1,
            gate_reads: std::collections::VecDeque::new(),
            cpu_ok,
            miss,
        })
    }
}

impl DevPart {
    /// Device `backend`'s part for the offloaded layers `mine` selects of `layers`: two staging
    /// areas as large as the largest of their experts (alternating between consecutive
    /// offloaded layers, so the next layer's experts can be copied in while this one computes),
    /// and per layer its slot ids, mask and CPU-result tensors (`t_max` tokens of `k` picks);
    /// with `every_ctl` (expert parallelism: the device computes its share of every layer's
    /// experts) the slot ids and mask of every offloaded layer.
    #[allow(clippy::too_many_arguments)]
    fn new(
        backend: &Rc<Backend>,
        layers: &[Option<Layer>],
        mine: &dyn Fn(usize) -> bool,
        every_ctl: bool,
        k: usize,
        t_max: usize,
        n_embd: usize,
        n_expert: usize,
        late_copies: bool,
    ) -> Result<Self, GgmlError> {
        let n_layer = layers.len();
        let dev = Context::new(n_layer * 9 + 3, 0)?;
        let own = || {
            layers
                .iter()
                .enumerate()
                .filter(|(il, l)| l.is_some() && mine(*il))
        };
        let stage_bytes = own()
            .flat_map(|(_, l)| l.as_ref())
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
        let cpu_bytes = (4 * n_embd * t_max.max(1)).next_multiple_of(256);
        let n_moe = own().count();
        let n_ctl = if every_ctl {
            layers.iter().flatten().count()
        } else {
            n_moe
        };
        let stage_bufs = [
            dev.new_buffer(backend, Memory::Device, stage_bytes)?,
            dev.new_buffer(backend, Memory::Device, stage_bytes)?,
        ];
        // Table-form decode's (`table`), one share only: per own layer each expert's slot (i32)
        // and residency (f32), adjacent (one copy writes both), and the layer's hit flag.
        let tab_bytes = (8 * n_expert + 4).next_multiple_of(256) * usize::from(!every_ctl);
        let ctl_size = 2 * ctl_bytes * n_ctl + (cpu_bytes + tab_bytes) * n_moe + 256;
        let ctl_buf = dev.new_buffer(backend, Memory::Device, ctl_size)?;
        ctl_buf.clear(0);
        let mut ctl_off = 0;
        let mut i_moe = 0;
        for (il, l) in layers.iter().enumerate() {
            let Some(l) = l else { continue };
            let own = mine(il);
            if !own && !every_ctl {
                continue;
            }
            if own {
                let stage_buf = stage_bufs[i_moe % 2];
                i_moe += 1;
                let mut off = 0;
                for (m, mat) in l.mats.iter().enumerate() {
                    let Some(mat) = mat else { continue };
                    let t = dev
                        .new_tensor(mat.ty, &mat.ne)?
                        .set_name(&name(il, &format!("stage{m}")));
                    off = stage_buf.place(t, off)?;
                }
            }
            let ids = dev
                .new_tensor(GgmlType::I32, &[k as i64, t_max.max(1) as i64])?
                .set_name(&name(il, "ids"));
            ctl_buf.place(ids, ctl_off)?;
            let mask = dev
                .new_tensor(GgmlType::F32, &[1, k as i64, t_max.max(1) as i64])?
                .set_name(&name(il, "mask"));
            ctl_buf.place(mask, ctl_off + ctl_bytes)?;
            ctl_off += 2 * ctl_bytes;
            if own {
                let cpu = dev
                    .new_tensor(GgmlType::F32, &[n_embd as i64, t_max.max(1) as i64])?
                    .set_name(&name(il, "cpu"));
                ctl_buf.place(cpu, ctl_off)?;
                ctl_off += cpu_bytes;
            }
            if own && tab_bytes > 0 {
                // Slot ids, residency, then the hit flag (`table`).
                for (w, ty, len, at) in [
                    ("tab", GgmlType::I32, n_expert, 0),
                    ("on", GgmlType::F32, n_expert, 4 * n_expert),
                    ("hit", GgmlType::F32, 1, 8 * n_expert),
                ] {
                    let t = dev.new_tensor(ty, &[1, len as i64])?.set_name(&name(il, w));
                    ctl_buf.place(t, ctl_off + at)?;
                }
                ctl_off += tab_bytes;
            }
        }
        // The hit flags' step base (`table`), written at each table-form step's start.
        let base = dev
            .new_tensor(GgmlType::F32, &[1])?
            .set_name("off.hit_base");
        ctl_buf.place(base, ctl_off)?;
        let dev_idx = dev.index();
        Ok(Self {
            backend: backend.clone(),
            xfer: transfer::for_backend(backend, late_copies)?,
            dev,
            dev_idx,
            slots: None,
            n_slots: 0,
            dev_bytes: 2 * stage_bytes + ctl_size,
        })
    }
}
