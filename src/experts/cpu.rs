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
use crate::ggml::{Backend, GgmlError, GgmlType, OwnedGraph};
use crate::graph::blocks::moe::ExpertAct;
use std::collections::HashMap;
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
    /// When [`CpuChannel::start`] sent it.
    sent: Instant,
    #[cfg(test)]
    probe: Option<std::sync::Arc<tests::Probe>>,
}

/// Where one CPU job's wall time went, seconds (the offload summary's "CPU jobs" line; issue
/// 30: the channel's fixed cost per job decides how much of a step's misses it can take).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct JobTimes {
    /// From `start` until the worker had the job (a sleeping worker's wake-up).
    pub handover: f64,
    /// The worker's graph: looked up (or built the first time for its shape) and its inputs
    /// written.
    pub prep: f64,
    /// ggml's compute of the graph, and the result read out.
    pub compute: f64,
    /// From the worker's reply until `finish` had it (a sleeping joiner's wake-up, or the time
    /// the result waited for the join).
    pub back: f64,
}

/// The worker's reply: the result, its times, and when it was sent.
type Reply = Result<(Vec<f32>, JobTimes, Instant), String>;

pub struct CpuChannel {
    /// `None` once dropping: closing it ends the worker's loop.
    tx: Option<Sender<Job>>,
    rx: Receiver<Reply>,
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
    /// they sleep ([`WORKER_SPIN`]), and so do the ggml pool's idle threads between jobs: only
    /// where the cores are spare (a GPU does the step's other work; on a CPU-only engine the
    /// spinning threads would take cores from the step). Fails when the OS gives no thread.
    pub fn new(model: CpuModel, n_threads: usize, spin: bool) -> Result<Self, GgmlError> {
        let (worker_spin, finish_spin) = if spin {
            (WORKER_SPIN, FINISH_SPIN)
        } else {
            (Duration::ZERO, Duration::ZERO)
        };
        // A/B switch (docs/usage.md): the jobs' weighting and sum in the ggml graph, as before
        // 2026-12-06, instead of on this worker.
        let ggml_sums = std::env::var("POCKETMOE_CPU_HOST_SUMS").as_deref() == Ok("0");
        let (tx, job_rx) = channel::<Job>();
        let (res_tx, rx) = channel();
        let worker = std::thread::Builder::new()
            .name("pocketmoe-cpu-experts".into())
            .spawn(move || {
                // One graph per (layer, experts per token, tokens), built at its first job: a
                // job then only writes its inputs (decode uses a few dozen shapes).
                let mut graphs: HashMap<(usize, usize, usize), OwnedGraph> = HashMap::new();
                // Its pool polls only where its hand-overs spin (a spare core beside a GPU step):
                // on a CPU-only engine polling workers would take the cores the step computes on.
                let backend = match Backend::cpu_polling(n_threads, spin) {
                    Ok(b) => b,
                    Err(e) => {
                        let _ = res_tx.send(Err(e.to_string()));
                        return;
                    }
                };
                while let Some(job) = spin_recv(&job_rx, worker_spin) {
                    let got = Instant::now();
                    #[cfg(test)]
                    if let Some(p) = &job.probe {
                        if !p.before_job() {
                            let _ = res_tx.send(Err("store freed".into()));
                            continue;
                        }
                    }
                    let r = run_job(&backend, &model, &mut graphs, &job, ggml_sums)
                        .map(|(out, mut times)| {
                            times.handover = (got - job.sent).as_secs_f64();
                            (out, times, Instant::now())
                        })
                        .map_err(|e| e.to_string());
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
            sent: Instant::now(),
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
    /// [n_embd * n_tokens], and where the job's time went.
    pub fn finish(&mut self) -> Result<(Vec<f32>, JobTimes), String> {
        self.pending = None;
        let (out, mut times, replied) = spin_recv(&self.rx, self.finish_spin)
            .unwrap_or_else(|| Err("the CPU expert worker stopped".into()))?;
        times.back = replied.elapsed().as_secs_f64();
        Ok((out, times))
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
/// hundred microseconds, and a sleeping worker's wake-up measured 24-28 us per job on the H200's
/// host against 1 us spinning (decode +10%, docs/design.md §4.5). ggml's own pool spins the same
/// way between graphs.
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

#[path = "cpu_job.rs"]
mod job;
use job::run_job;

#[path = "cpu_probe.rs"]
pub mod probe;

#[cfg(test)]
#[path = "cpu_tests.rs"]
pub(super) mod tests;
