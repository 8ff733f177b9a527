//! The CPU channel: cache misses computed by ggml's CPU kernels, straight from the host store,
//! on a worker thread, while the GPU runs the hits and the copy engine brings other misses in
//! (docs/design.md §4.5). Decode micro-batches (one token, or a few from concurrent requests): the
//! worker builds a tiny graph — the same expert FFN as the GPU's — over each token's chosen
//! experts and returns their weighted sums.
//!
//! Invariants: at most one job in flight; [`CpuChannel::finish`] returns its result before the
//! next [`CpuChannel::start`]. The worker reads the host store, which
//! [`Offload`](super::Offload) owns: dropping the channel finishes the job in flight and joins the
//! worker, and `Offload`'s `Drop` (in `offload`) drops the channel before any of its fields (the
//! store among them), whatever their order.
use super::mats::ExpertMat;
use crate::ggml::{Backend, Context, GgmlError, GgmlType, Graph, Tensor};
use crate::graph::blocks::moe::{expert_ffn, ExpertAct, ExpertTensors, FfnDims};
use std::sync::mpsc::{channel, Receiver, Sender, TryRecvError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// One matrix of one layer in the host store: type, [ne0, ne1, n_expert], address.
#[derive(Debug, Clone, Copy)]
pub struct StoreMat {
    pub ty: GgmlType,
    pub ne: [i64; 3],
    pub addr: usize,
    pub bytes: usize,
}

/// One matrix's per-expert bias (gpt-oss): type, [ne0, n_expert], its bytes (a copy: they are
/// small, and the store holds only the expert matrices).
#[derive(Debug, Clone)]
pub struct HostBias {
    pub ty: GgmlType,
    pub ne: [i64; 2],
    pub data: Vec<u8>,
}

/// One offloaded layer as the worker sees it, per matrix (up, gate, down).
#[derive(Debug, Clone)]
pub struct CpuLayer {
    pub mats: [Option<StoreMat>; 3],
    pub biases: [Option<HostBias>; 3],
}

/// What the worker needs to know about the model (plain data: it crosses threads).
#[derive(Debug, Clone)]
pub struct CpuModel {
    pub n_embd: usize,
    /// Per layer: `None` where the CPU channel does not serve it.
    pub layers: Vec<Option<CpuLayer>>,
}

struct Job {
    il: usize,
    act: ExpertAct,
    /// FFN input, [n_embd * n_tokens].
    x: Vec<f32>,
    /// Per token, its experts on the CPU and their router weights (a token may have none).
    picks: Vec<Vec<(u32, f32)>>,
    #[cfg(test)]
    probe: Option<std::sync::Arc<tests::Probe>>,
}

pub struct CpuChannel {
    /// `None` once dropping: closing it ends the worker's loop.
    tx: Option<Sender<Job>>,
    rx: Receiver<Result<Vec<f32>, String>>,
    /// Joined on drop (see [`CpuChannel`]'s `Drop`).
    worker: Option<JoinHandle<()>>,
    pending: Option<usize>,
    /// How long [`CpuChannel::finish`] polls before it sleeps.
    finish_spin: Duration,
    /// Tests: slows the next jobs down and records what they saw (see `tests`).
    #[cfg(test)]
    probe: Option<std::sync::Arc<tests::Probe>>,
}

impl CpuChannel {
    /// Starts the worker with `n_threads` ggml CPU threads. With `spin`, hand-overs poll before
    /// they sleep ([`WORKER_SPIN`]): only where the cores are spare (a GPU does the step's other
    /// work; on a CPU-only engine the spinning thread would take a core from the step). Fails
    /// when the OS gives no thread.
    pub fn new(model: CpuModel, n_threads: usize, spin: bool) -> Result<Self, GgmlError> {
        let (worker_spin, finish_spin) = if spin {
            (WORKER_SPIN, FINISH_SPIN)
        } else {
            (Duration::ZERO, Duration::ZERO)
        };
        let (tx, job_rx) = channel::<Job>();
        let (res_tx, rx) = channel();
        let worker = std::thread::Builder::new()
            .name("pocketmoe-cpu-experts".into())
            .spawn(move || {
                let backend = match Backend::cpu(n_threads) {
                    Ok(b) => b,
                    Err(e) => {
                        let _ = res_tx.send(Err(e.to_string()));
                        return;
                    }
                };
                while let Some(job) = spin_recv(&job_rx, worker_spin) {
                    #[cfg(test)]
                    if let Some(p) = &job.probe {
                        if !p.before_job() {
                            let _ = res_tx.send(Err("store freed".into()));
                            continue;
                        }
                    }
                    let r = run_job(&backend, &model, &job).map_err(|e| e.to_string());
                    #[cfg(test)]
                    if let Some(p) = &job.probe {
                        p.after_job();
                    }
                    if res_tx.send(r).is_err() {
                        break;
                    }
                }
            })
            .map_err(|e| {
                GgmlError::BackendInit(format!(
                    "CPU (the CPU expert channel's worker thread did not start: {e})"
                ))
            })?;
        Ok(Self {
            tx: Some(tx),
            rx,
            worker: Some(worker),
            pending: None,
            finish_spin,
            #[cfg(test)]
            probe: None,
        })
    }

    /// Queues layer `il`'s CPU experts: `picks[t]` (expert, router weight) of token `t`, on input
    /// `x` [n_embd * picks.len()].
    pub fn start(&mut self, il: usize, act: ExpertAct, x: Vec<f32>, picks: Vec<Vec<(u32, f32)>>) {
        if self.pending.is_some() {
            // Left over from a step that failed half-way: drain it.
            let _ = self.finish();
        }
        self.pending = Some(il);
        let job = Job {
            il,
            act,
            x,
            picks,
            #[cfg(test)]
            probe: self.probe.clone(),
        };
        // A send error means the worker died; finish() reports it.
        if let Some(tx) = &self.tx {
            let _ = tx.send(job);
        }
    }

    /// The layer whose job is in flight.
    pub fn pending(&self) -> Option<usize> {
        self.pending
    }

    /// Waits for the job in flight: per token, the weighted sum of its experts' outputs
    /// [n_embd * n_tokens].
    pub fn finish(&mut self) -> Result<Vec<f32>, String> {
        self.pending = None;
        spin_recv(&self.rx, self.finish_spin)
            .unwrap_or_else(|| Err("the CPU expert worker stopped".into()))
    }
}

impl Drop for CpuChannel {
    /// Closes the job queue and joins the worker: a job still in flight (left by a step that
    /// failed half-way) finishes reading the host store before this returns.
    fn drop(&mut self) {
        drop(self.tx.take());
        if let Some(w) = self.worker.take() {
            // A worker that panicked has nothing left to read; its panic is not ours to raise
            // in a destructor.
            let _ = w.join();
        }
    }
}

/// How long the worker spins for the next job before it sleeps: decode sends one every few
/// hundred microseconds, and a sleeping thread's wake-up (a futex, and in a VM an idle vCPU's
/// halt exit) is, we suppose, much of the CPU channel's measured per-job start cost of
/// 190-320 us on the H200's host (docs/design.md §4.5; the A/B is to come). ggml's own pool
/// spins the same way between graphs.
const WORKER_SPIN: Duration = Duration::from_millis(5);

/// How long [`CpuChannel::finish`] spins for the result before it sleeps (a job is a few hundred
/// microseconds; the decode step waits for it either way).
const FINISH_SPIN: Duration = Duration::from_millis(20);

/// `rx.recv()`, polling for up to `spin` first (see [`WORKER_SPIN`]); `None` once the sender is
/// gone.
fn spin_recv<T>(rx: &Receiver<T>, spin: Duration) -> Option<T> {
    let t0 = Instant::now();
    loop {
        match rx.try_recv() {
            Ok(v) => return Some(v),
            Err(TryRecvError::Disconnected) => return None,
            Err(TryRecvError::Empty) if t0.elapsed() < spin => std::hint::spin_loop(),
            Err(TryRecvError::Empty) => return rx.recv().ok(),
        }
    }
}

fn run_job(
    backend: &Backend,
    model: &CpuModel,
    job: &Job,
) -> Result<Vec<f32>, crate::ggml::GgmlError> {
    let layer = model.layers[job.il]
        .as_ref()
        .expect("CPU job for an offloaded layer");
    let nt = job.picks.len();
    // mul_mat_id takes the same number of experts per token: shorter lists are padded with an
    // expert the job reads anyway, at weight 0.
    let kc = job.picks.iter().map(Vec::len).max().unwrap_or(0).max(1);
    let pad = job.picks.iter().flatten().next().map_or(0, |p| p.0);
    let (mut id_data, mut w_data) = (Vec::with_capacity(kc * nt), Vec::with_capacity(kc * nt));
    for tok in &job.picks {
        for j in 0..kc {
            let (e, w) = tok.get(j).copied().unwrap_or((pad, 0.0));
            id_data.push(e as i32);
            w_data.push(w);
        }
    }
    let (kc, nt) = (kc as i64, nt as i64);
    let ctx = Context::new(64, 64)?;
    let mut w: [Option<Tensor<'_>>; 3] = [None; 3];
    let mut biases: [Option<Tensor<'_>>; 3] = [None; 3];
    for m in ExpertMat::ALL {
        if let Some(b) = &layer.biases[m.index()] {
            biases[m.index()] = Some(ctx.new_tensor(b.ty, &b.ne)?.set_name(&format!(
                "blk.{}.{}.bias",
                job.il,
                m.name()
            )));
        }
        let Some(sm) = &layer.mats[m.index()] else {
            continue;
        };
        let t =
            ctx.new_tensor(sm.ty, &sm.ne)?
                .set_name(&format!("blk.{}.{}.weight", job.il, m.name()));
        // SAFETY: the store outlives every job: `Offload`'s `Drop` drops the channel, which joins
        // this worker, before the store is freed; the range is exactly the store tensor's bytes.
        let buf = unsafe { ctx.wrap_host_memory(sm.addr, sm.bytes)? };
        buf.place(t, 0)?;
        w[m.index()] = Some(t);
    }
    let n_embd = model.n_embd as i64;
    let x = ctx.new_tensor(GgmlType::F32, &[n_embd, nt])?;
    let ids = ctx.new_tensor(GgmlType::I32, &[kc, nt])?;
    let wt = ctx.new_tensor(GgmlType::F32, &[1, kc, nt])?;
    let t = ExpertTensors { w, biases };
    let dims = FfnDims { n_embd, k: kc, nt };
    let out = expert_ffn(&ctx, &t, x, dims, [ids; 3], ids, wt, job.act, &|y, _| y);
    let graph = Graph::new(&ctx, 64);
    graph.build_forward(out);
    ctx.alloc_tensors(backend)?;
    for (b, hb) in biases.iter().zip(&layer.biases) {
        if let (Some(b), Some(hb)) = (b, hb) {
            b.write_bytes_at(0, &hb.data)?;
        }
    }
    x.write_f32(&job.x)?;
    ids.write_i32(&id_data)?;
    wt.write_f32(&w_data)?;
    backend.compute(&graph)?;
    out.read_f32()
}

#[cfg(test)]
#[path = "cpu_tests.rs"]
pub(super) mod tests;
