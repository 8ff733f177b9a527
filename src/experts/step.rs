//! One forward pass through the offloaded experts: the scheduler stops after each offloaded
//! layer's router ([`StepHook`] as ggml's eval callback); we read the selected expert ids (and
//! the next layer's predicted router logits), make the experts available (slot cache: admit
//! misses, queue their copies and the remapped ids on the compute stream; staging: copy every
//! used expert in, from its slot when cached), queue prefetches for the next layer on our copy
//! stream, and let the graph continue. A second stop joins the CPU channel's share, only in
//! layers that gave it work.
//!
//! Invariants:
//! - Slots: everything the layer's expert matmuls read (miss copies, ids, mask) is queued on
//!   the compute stream before they are, so it lands first without the host waiting.
//! - Prefetches run on the copy stream. The next stop reads its routing on a stream of its own
//!   (the host waits for that read only), then fences: the compute stream waits, on the device,
//!   for the prefetches before any later slot write or matmul.
//! - Staging: when `computed` returns, every staging copy of the layer has landed.
use super::offload::{Mode, Offload};
use crate::ggml::{EvalHook, GgmlError, OwnedGraph};
use std::collections::HashMap;

/// An offloaded layer of a built graph, as the graph builder recorded it.
#[derive(Debug, Clone)]
pub struct MoeNode {
    pub il: usize,
    pub mode: Mode,
    /// Name of the node the hook stops after: the last of the routing nodes below.
    pub anchor: String,
    /// Name of the selected ids, i32 [k, n_tokens].
    pub selected: String,
    /// Name of their final weights, f32 [1, k, n_tokens].
    pub weights: String,
    /// Name of the FFN input, f32 [n_embd, n_tokens] (the CPU channel computes on it).
    pub input: String,
    /// Name of the prefetch prediction: the next offloaded layer's router logits on this
    /// layer's FFN input, f32 [n_expert, n_tokens].
    pub pred: Option<String>,
    /// Name of the GPU experts' sum when the CPU channel adds its share after it.
    pub gpu_out: Option<String>,
    pub act: crate::graph::blocks::ExpertAct,
    /// Direct mode: whether the layer stops (to prefetch), the predicted layers' router logits
    /// on its FFN input (layer, name; f32 [n_expert, 1]), and its slot-or-store ids of the up
    /// matrix (i32 [k, 1], read after the step).
    pub direct_stop: bool,
    pub direct_preds: Vec<(usize, String)>,
    pub direct_ids: Option<String>,
}

/// [`MoeNode`]s of an allocated graph, keyed by the ids of the nodes the hook stops after.
pub struct GraphNodes {
    by_anchor: HashMap<usize, (Stop, Resolved)>,
    /// Direct layers: layer, and the addresses of its selected ids and its up-matrix ids, read
    /// after the step.
    pub(super) direct: Vec<(usize, usize, usize)>,
    /// Direct stop layers: predicted layers and the addresses of their logits.
    pub(super) direct_stops: HashMap<usize, DirectStop>,
}

/// A direct layer that stops: its selected ids, and the layers it predicts.
pub(super) struct DirectStop {
    pub il: usize,
    pub sel_addr: usize,
    pub preds: Vec<(usize, usize)>,
}

#[derive(Clone, Copy)]
enum Stop {
    Routing,
    GpuOut,
}

#[derive(Clone, Copy)]
struct Resolved {
    il: usize,
    mode: Mode,
    sel_addr: usize,
    w_addr: usize,
    x_addr: usize,
    /// The prefetch prediction's address, when the graph computes one.
    pred_addr: Option<usize>,
    act: crate::graph::blocks::ExpertAct,
}

impl GraphNodes {
    /// Resolves names to node ids and data addresses; call after the graph is allocated.
    pub fn resolve(nodes: &[MoeNode], g: &OwnedGraph) -> Self {
        let mut by_anchor = HashMap::new();
        let mut direct = Vec::new();
        let mut direct_stops = HashMap::new();
        for n in nodes {
            if n.mode == Mode::Direct {
                let sel_addr = g.tensor(&n.selected).data_addr();
                let ids = n.direct_ids.as_ref().expect("direct ids recorded");
                direct.push((n.il, sel_addr, g.tensor(ids).data_addr()));
                if n.direct_stop {
                    let preds = n
                        .direct_preds
                        .iter()
                        .map(|(j, p)| (*j, g.tensor(p).data_addr()))
                        .collect();
                    let stop = DirectStop {
                        il: n.il,
                        sel_addr,
                        preds,
                    };
                    direct_stops.insert(g.tensor(&n.anchor).id(), stop);
                }
                continue;
            }
            let r = Resolved {
                il: n.il,
                mode: n.mode,
                sel_addr: g.tensor(&n.selected).data_addr(),
                w_addr: g.tensor(&n.weights).data_addr(),
                x_addr: g.tensor(&n.input).data_addr(),
                pred_addr: n.pred.as_ref().map(|p| g.tensor(p).data_addr()),
                act: n.act,
            };
            by_anchor.insert(g.tensor(&n.anchor).id(), (Stop::Routing, r));
            if let Some(o) = &n.gpu_out {
                by_anchor.insert(g.tensor(o).id(), (Stop::GpuOut, r));
            }
        }
        Self {
            by_anchor,
            direct,
            direct_stops,
        }
    }

    /// Whether the step stops at all (else the scheduler runs it without the eval callback,
    /// in one piece).
    pub fn has_stops(&self) -> bool {
        !self.by_anchor.is_empty() || !self.direct_stops.is_empty()
    }

    /// Whether the step has direct layers (see `experts::direct`).
    pub fn is_direct(&self) -> bool {
        !self.direct.is_empty()
    }
}

/// The eval hook for one forward pass of `n_tokens`.
pub struct StepHook<'a> {
    pub off: &'a mut Offload,
    pub nodes: &'a GraphNodes,
    pub n_tokens: usize,
}

impl EvalHook for StepHook<'_> {
    fn wants(&mut self, id: usize) -> bool {
        if self.nodes.direct_stops.contains_key(&id) {
            return true;
        }
        match self.nodes.by_anchor.get(&id) {
            Some((Stop::Routing, _)) => true,
            // Asked after this layer's routing stop: only a layer whose misses went to the CPU
            // channel stops again.
            Some((Stop::GpuOut, n)) => {
                self.off.cpu.as_ref().and_then(|c| c.pending()) == Some(n.il)
            }
            None => false,
        }
    }

    fn computed(&mut self, id: usize) -> Result<(), GgmlError> {
        let t0 = std::time::Instant::now();
        if let Some(d) = self.nodes.direct_stops.get(&id) {
            let r = self.off.on_direct_stop(d);
            self.off.stats.stops += 1;
            self.off.stats.hook_s += t0.elapsed().as_secs_f64();
            return r;
        }
        let (stop, n) = self.nodes.by_anchor[&id];
        let r = match stop {
            Stop::Routing => self.off.on_routing(&n, self.n_tokens),
            Stop::GpuOut => self.off.on_gpu_out(n.il, self.n_tokens),
        };
        self.off.stats.stops += 1;
        self.off.stats.hook_s += t0.elapsed().as_secs_f64();
        r
    }
}

impl Offload {
    /// Starts a forward pass of `n_tokens` (advances the policies' clock).
    pub fn begin_step(&mut self, n_tokens: usize) {
        // A CPU job left by a step that failed half-way must not be joined into this one.
        if let Some(cpu) = self.cpu.as_mut().filter(|c| c.pending().is_some()) {
            let _ = cpu.finish();
        }
        self.step += 1;
        self.stats.steps += 1;
        self.stats.tokens += n_tokens as u64;
    }

    /// Reads the routing of a step — `k * n_tokens` selected ids and their weights, the
    /// prefetch prediction when the graph has one, and the FFN input [n_embd, n_tokens] when the
    /// CPU channel may take misses — with one wait, for these reads only (not for prefetches).
    fn read_routing(&mut self, n: &Resolved, n_tokens: usize) -> Result<Routing, GgmlError> {
        let cnt = self.k * n_tokens;
        let n_pred = if n.pred_addr.is_some() {
            self.n_expert * n_tokens
        } else {
            0
        };
        let x_len = if self.cpu_candidate(n, n_tokens) {
            self.n_embd * n_tokens
        } else {
            0
        };
        let lay = ScratchLayout::new(self.scratch, cnt, n_pred);
        let x_at = self.scratch + self.scratch_len - 4 * x_len - 256;
        // The reads end where the control area starts (used by slot steps only, sized for them).
        if lay.ctl > x_at {
            return Err(GgmlError::Tensor {
                name: format!("offload scratch of layer {}", n.il),
                msg: format!(
                    "{n_tokens} tokens x {} experts, {n_pred} predicted logits and {x_len} inputs \
                     need {} B, the scratch has {} B",
                    self.k,
                    lay.ctl - self.scratch + 4 * x_len + 256,
                    self.scratch_len
                ),
            });
        }
        self.xfer.read(lay.sel, n.sel_addr, 4 * cnt)?;
        self.xfer.read(lay.w, n.w_addr, 4 * cnt)?;
        if let Some(p) = n.pred_addr {
            self.xfer.read(lay.pred, p, 4 * n_pred)?;
        }
        if x_len > 0 {
            self.xfer.read(x_at, n.x_addr, 4 * x_len)?;
        }
        let t0 = std::time::Instant::now();
        self.xfer.wait_reads()?;
        self.stats.wait_copy_s += t0.elapsed().as_secs_f64();
        // SAFETY: the ranges lie in the live host scratch (asserted above), 4-aligned (ggml
        // buffer bases are aligned), just written by the waited copies and not shared.
        let (ids, weights, pred, x) = unsafe {
            (
                std::slice::from_raw_parts(lay.sel as *const i32, cnt),
                std::slice::from_raw_parts(lay.w as *const f32, cnt).to_vec(),
                std::slice::from_raw_parts(lay.pred as *const f32, n_pred).to_vec(),
                std::slice::from_raw_parts(x_at as *const f32, x_len).to_vec(),
            )
        };
        let n_expert = self.n_expert as u32;
        let sel = ids
            .iter()
            .map(|&e| {
                u32::try_from(e)
                    .ok()
                    .filter(|&e| e < n_expert)
                    .ok_or_else(|| GgmlError::Tensor {
                        name: "ffn_moe_topk".into(),
                        msg: format!("router selected expert {e}, outside 0..{n_expert}"),
                    })
            })
            .collect::<Result<_, _>>()?;
        Ok(Routing {
            sel,
            weights,
            pred,
            x,
        })
    }

    /// Whether the CPU channel may take some of this step's misses in layer `n.il`.
    fn cpu_candidate(&self, n: &Resolved, n_tokens: usize) -> bool {
        n.mode == Mode::Slots && n_tokens == 1 && self.cpu_enabled(n.il)
    }

    /// Per matrix: (store base, slot base, staging base, bytes per expert); `None` for a
    /// matrix the model lacks.
    pub(super) fn bases(&self, il: usize) -> Bases {
        let layer = self.layers[il].as_ref().expect("offloaded layer");
        std::array::from_fn(|m| {
            let mat = layer.mats[m].as_ref()?;
            Some((
                self.store_tensor(il, m)?.data_addr(),
                self.slot_tensor(il, m).map_or(0, |t| t.data_addr()),
                self.staging_tensor(il, m)?.data_addr(),
                mat.expert_bytes,
            ))
        })
    }

    fn on_routing(&mut self, n: &Resolved, n_tokens: usize) -> Result<(), GgmlError> {
        let (il, mode) = (n.il, n.mode);
        let routing = self.read_routing(n, n_tokens)?;
        let sel = &routing.sel;
        let mut used: Vec<u32> = Vec::with_capacity(sel.len());
        for &e in sel {
            if !used.contains(&e) {
                used.push(e);
            }
        }
        // Decode: split the misses between the copy engine and the CPU channel.
        let on_cpu = if self.cpu_candidate(n, n_tokens) {
            self.plan_cpu(il, &used)
        } else {
            Vec::new()
        };
        let bases = self.bases(il);
        let backend = self.backend.clone();
        let now = self.step;
        let layer = self.layers[il].as_mut().expect("offloaded layer");
        let st = &mut self.stats.layers[il];
        st.used += used.len() as u64;
        if mode == Mode::Slots {
            st.prefetch_used += layer.prefetched.iter().filter(|e| used.contains(e)).count() as u64;
            st.predicted_used += layer.predicted.iter().filter(|e| used.contains(e)).count() as u64;
        }
        layer.prefetched.clear();
        layer.predicted.clear();
        let mut h2d = 0u64;
        match mode {
            Mode::Staging => {
                let ahead = layer.staged_ahead == Some(now);
                for &e in &used {
                    let cached = layer.cache.slot(e);
                    if cached.is_some() {
                        st.hits += 1;
                    } else {
                        st.misses += 1;
                        st.copies += u64::from(!ahead);
                    }
                    if ahead {
                        // Already copied in while the previous layer ran.
                        continue;
                    }
                    h2d += stage_expert(self.xfer.as_mut(), &bases, e, cached)?;
                }
                self.stats.h2d_bytes += h2d;
                let t0 = std::time::Instant::now();
                self.xfer.wait()?;
                self.stats.wait_copy_s += t0.elapsed().as_secs_f64();
                if n_tokens * self.k >= STAGE_AHEAD_PICKS * self.n_expert {
                    self.stage_ahead(il)?;
                }
            }
            Mode::Direct => unreachable!("direct layers never stop"),
            Mode::Slots => {
                // The previous layer's prefetches into this layer's slots land before anything
                // queued on the compute stream from here: the miss copies below (which may
                // reuse a slot a prefetch is still filling) and the expert matmuls.
                self.xfer.fence()?;
                let mut copies = Vec::new();
                for &e in &used {
                    if layer.cache.slot(e).is_some() {
                        st.hits += 1;
                        continue;
                    }
                    st.misses += 1;
                    if on_cpu.contains(&e) {
                        st.cpu += 1;
                        continue;
                    }
                    st.copies += 1;
                    let (slot, _) = layer
                        .cache
                        .admit(e, &|r| used.contains(&r), now)
                        .ok_or_else(|| GgmlError::Tensor {
                            name: format!("expert cache of layer {il}"),
                            msg: format!(
                                "{} experts needed at once, {} slots",
                                used.len(),
                                layer.cache.n_slots()
                            ),
                        })?;
                    copies.push((slot, e));
                    h2d += bases.iter().flatten().map(|b| b.3 as u64).sum::<u64>();
                }
                for &e in &used {
                    layer.cache.touch(e, now);
                }
                self.stats.h2d_bytes += h2d;
                // Control: slot ids and the mask; CPU experts point at slot 0 with weight 0.
                let ids: Vec<i32> = sel
                    .iter()
                    .map(|&e| layer.cache.slot(e).map_or(0, |s| s as i32))
                    .collect();
                let mask: Vec<f32> = sel
                    .iter()
                    .map(|e| if on_cpu.contains(e) { 0.0 } else { 1.0 })
                    .collect();
                for (slot, e) in copies {
                    for (m, b) in bases.iter().enumerate() {
                        let (Some((store, _, _, eb)), Some(t)) = (*b, self.slot_tensor(il, m))
                        else {
                            continue;
                        };
                        // SAFETY: the store is page-locked host memory that lives, unchanged,
                        // as long as the engine; the slot tensor lies in the compute backend's
                        // buffer.
                        unsafe {
                            t.write_async(&backend, slot as usize * eb, store + e as usize * eb, eb)
                        }?;
                    }
                }
                if !on_cpu.is_empty() {
                    let picks: Vec<(u32, f32)> = sel
                        .iter()
                        .zip(&routing.weights)
                        .filter(|(e, _)| on_cpu.contains(e))
                        .map(|(&e, &w)| (e, w))
                        .collect();
                    let bytes: usize = bases.iter().flatten().map(|b| b.3).sum();
                    self.stats.cpu_bytes += (bytes * picks.len()) as u64;
                    let cpu = self.cpu.as_mut().expect("CPU channel enabled");
                    cpu.start(il, n.act, routing.x.clone(), picks);
                } else if self.cpu_dirty[il] {
                    // The CPU-result tensor still holds an earlier step's share: zero it.
                    self.cpu_dirty[il] = false;
                    let zeros = vec![0u8; 4 * self.n_embd * n_tokens];
                    self.ctl_cpu(il).write_bytes_at(0, &zeros)?;
                }
                let (t_ids, t_mask) = self.ctl(il);
                let n = ids.len();
                let lay = ScratchLayout::new(self.scratch, n, routing.pred.len());
                assert!(lay.end <= self.scratch + self.scratch_len);
                // SAFETY: [ctl, ctl + 8n) lies in the live host scratch (asserted), 4-aligned;
                // no copy reading it is pending (every stop follows a synchronisation of the
                // compute stream), and nothing writes it again before the next stop, so the
                // queued copies read it unchanged.
                unsafe {
                    let p = lay.ctl as *mut i32;
                    std::ptr::copy_nonoverlapping(ids.as_ptr(), p, n);
                    std::ptr::copy_nonoverlapping(mask.as_ptr(), p.add(n).cast::<f32>(), n);
                    t_ids.write_async(&backend, 0, lay.ctl, 4 * n)?;
                    t_mask.write_async(&backend, 0, lay.ctl + 4 * n, 4 * n)?;
                }
                if !routing.pred.is_empty() {
                    self.prefetch_after(il, &routing.pred)?;
                }
            }
        }
        Ok(())
    }
}

/// Where a stop's reads and control writes go in the host scratch (byte addresses).
struct ScratchLayout {
    sel: usize,
    w: usize,
    pred: usize,
    ctl: usize,
    end: usize,
}

impl ScratchLayout {
    /// For `picks` selected experts (k per token) and `n_pred` predicted logits.
    fn new(base: usize, picks: usize, n_pred: usize) -> Self {
        let p = 4 * picks.next_multiple_of(64);
        let sel = base;
        let w = sel + p;
        let pred = w + p;
        let ctl = pred + 4 * n_pred.next_multiple_of(64);
        Self {
            sel,
            w,
            pred,
            ctl,
            end: ctl + 2 * p,
        }
    }
}

impl Offload {
    /// After layer `il`'s experts are queued: takes the next offloaded layer's predicted router
    /// logits `pred` [n_expert, n_tokens] (computed by the graph on this layer's FFN input),
    /// and queues copies of the predicted experts that are not resident on the copy stream.
    /// Not waited for: the copies overlap this layer's expert matmuls and the next layer's
    /// attention; the next stop fences them before its slot writes and matmuls.
    fn prefetch_after(&mut self, il: usize, pred: &[f32]) -> Result<(), GgmlError> {
        let Some(next) = self.next_offloaded(il) else {
            return Ok(());
        };
        let bases = self.bases(next);
        let now = self.step;
        let k = self.k;
        let layer = self.layers[next].as_mut().expect("offloaded layer");
        let predicted = predicted_experts(pred, self.n_expert, k);
        let mut h2d = 0u64;
        let mut fetched = Vec::new();
        for &e in &predicted {
            if layer.cache.slot(e).is_some() {
                continue;
            }
            // Evict only experts not predicted; stop when the cache has none left to give.
            let Some((slot, _)) = layer.cache.admit(e, &|r| predicted.contains(&r), now) else {
                break;
            };
            for &(store, slot_base, _, eb) in bases.iter().flatten() {
                self.xfer
                    .copy(slot_base + slot as usize * eb, store + e as usize * eb, eb)?;
                h2d += eb as u64;
            }
            fetched.push(e);
        }
        let st = &mut self.stats.layers[next];
        st.prefetched += fetched.len() as u64;
        st.copies += fetched.len() as u64;
        self.stats.h2d_bytes += h2d;
        layer.prefetched = fetched;
        layer.predicted = predicted;
        Ok(())
    }
}

/// What a step's router chose, read back to the host.
struct Routing {
    /// Expert per pick, [k * n_tokens].
    sel: Vec<u32>,
    /// Weight per pick.
    weights: Vec<f32>,
    /// The next offloaded layer's predicted router logits [n_expert * n_tokens] (empty without
    /// prefetch).
    pred: Vec<f32>,
    /// FFN input [n_embd * n_tokens] (when the CPU channel may take misses).
    x: Vec<f32>,
}

impl Offload {
    /// Which of `used`'s misses the CPU computes: greedy, each miss to the channel that would
    /// finish it first (copy engine at `pcie_bw`, CPU at `cpu_bw` plus a fixed start cost), so
    /// both channels end at about the same time.
    fn plan_cpu(&self, il: usize, used: &[u32]) -> Vec<u32> {
        let layer = self.layers[il].as_ref().expect("offloaded layer");
        let bytes: f64 = layer
            .mats
            .iter()
            .flatten()
            .map(|m| m.expert_bytes as f64)
            .sum();
        let (cp, cc) = (bytes / self.pcie_bw, bytes / self.cpu_bw);
        let (mut t_pcie, mut t_cpu) = (0.0, CPU_START_S);
        let mut on_cpu = Vec::new();
        // More experts than slots: the excess must run on the CPU.
        let mut forced = used.len().saturating_sub(layer.cache.n_slots());
        for &e in used.iter().filter(|&&e| layer.cache.slot(e).is_none()) {
            if forced > 0 || t_cpu + cc < t_pcie + cp {
                forced = forced.saturating_sub(1);
                t_cpu += cc;
                on_cpu.push(e);
            } else {
                t_pcie += cp;
            }
        }
        on_cpu
    }

    /// The GPU's experts of layer `il` are done (a stop made only when the CPU channel has this
    /// layer's job): put the CPU channel's share in the tensor the graph adds next.
    fn on_gpu_out(&mut self, il: usize, n_tokens: usize) -> Result<(), GgmlError> {
        let n = self.n_embd * n_tokens;
        let Some(cpu) = self.cpu.as_mut().filter(|c| c.pending() == Some(il)) else {
            return Ok(()); // nothing of this layer's to join (waiting would never end)
        };
        let t0 = std::time::Instant::now();
        let out = cpu.finish().map_err(|msg| GgmlError::Tensor {
            name: format!("CPU experts of layer {il}"),
            msg,
        })?;
        self.stats.wait_cpu_s += t0.elapsed().as_secs_f64();
        self.cpu_dirty[il] = true;
        assert_eq!(out.len(), n, "CPU result size");
        // Through ggml's own (synchronous) upload, not the copy engine: waiting on the copy
        // engine here would also wait for the next layer's prefetches.
        self.ctl_cpu(il)
            .write_bytes_at(0, bytemuck::cast_slice(&out))
    }
}

/// Fixed cost of a CPU-channel job (thread wake-up, graph build), seconds.
const CPU_START_S: f64 = 40e-6;

/// Per matrix of a layer: (store base, slot base, staging base, bytes per expert).
pub(super) type Bases = [Option<(usize, usize, usize, usize)>; 3];

/// Queues the copy of expert `e` into its place in the staging area: from slot `cached` when the
/// cache holds it (device to device), else from the host store. Returns the bytes that cross PCIe.
fn stage_expert(
    xfer: &mut dyn super::transfer::Transfer,
    bases: &Bases,
    e: u32,
    cached: Option<u32>,
) -> Result<u64, GgmlError> {
    let mut h2d = 0;
    for &(store, slot, stage, eb) in bases.iter().flatten() {
        let src = match cached {
            Some(s) => slot + s as usize * eb,
            None => {
                h2d += eb as u64;
                store + e as usize * eb
            }
        };
        xfer.copy(stage + e as usize * eb, src, eb)?;
    }
    Ok(h2d)
}

impl Offload {
    /// The first offloaded layer after `il`.
    pub(crate) fn next_offloaded(&self, il: usize) -> Option<usize> {
        (il + 1..self.layers.len()).find(|&j| self.layers[j].is_some())
    }
}

/// Prefill micro-batches with at least this many expert picks per expert use practically every
/// expert ((1 - k/n)^(picks) ~ e^-4 unused), so the next layer's are staged whole, ahead.
const STAGE_AHEAD_PICKS: usize = 4;

impl Offload {
    /// During a large prefill micro-batch, after layer `il`'s experts are staged: queues copies
    /// of *every* expert of the next offloaded layer into its staging area (the other one of the
    /// two), from its slot when cached, without waiting — they overlap this layer's expert
    /// matmuls and the next layer's attention. The next layer's staging stop waits for them.
    fn stage_ahead(&mut self, il: usize) -> Result<(), GgmlError> {
        let Some(next) = self.next_offloaded(il) else {
            return Ok(());
        };
        let bases = self.bases(next);
        let now = self.step;
        let layer = self.layers[next].as_mut().expect("offloaded layer");
        let mut h2d = 0u64;
        let mut copied = 0u64;
        for e in 0..self.n_expert as u32 {
            let cached = layer.cache.slot(e);
            copied += u64::from(cached.is_none());
            h2d += stage_expert(self.xfer.as_mut(), &bases, e, cached)?;
        }
        layer.staged_ahead = Some(now);
        self.stats.layers[next].copies += copied;
        self.stats.h2d_bytes += h2d;
        Ok(())
    }
}

/// The distinct experts of the top `k` of each token's predicted router logits (`pred`:
/// [n_expert * n_tokens]), in order of first appearance.
pub fn predicted_experts(pred: &[f32], n_expert: usize, k: usize) -> Vec<u32> {
    let mut predicted: Vec<u32> = Vec::new();
    for logits in pred.chunks_exact(n_expert) {
        for e in crate::util::top_k(logits, k) {
            if !predicted.contains(&(e as u32)) {
                predicted.push(e as u32);
            }
        }
    }
    predicted
}
