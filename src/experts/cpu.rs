//! The CPU channel: cache misses computed by ggml's CPU kernels, straight from the host store,
//! on a worker thread, while the GPU runs the hits and the copy engine brings other misses in
//! (DESIGN.md §1: PCIe and CPU in parallel). Decode only (one token per step): the worker builds
//! a tiny graph — the same expert FFN as the GPU's — over the chosen experts and returns their
//! weighted sum.
//!
//! Invariant: at most one job in flight; [`CpuChannel::finish`] returns its result before the
//! next [`CpuChannel::start`].
use super::offload::MATS;
use crate::ggml::{Backend, Context, GgmlType, Graph, Tensor};
use crate::graph::blocks::moe::{expert_ffn, ExpertAct, ExpertTensors, FfnDims};
use std::sync::mpsc::{channel, Receiver, Sender};

/// One matrix of one layer in the host store: type, [ne0, ne1, n_expert], address.
#[derive(Debug, Clone, Copy)]
pub struct StoreMat {
    pub ty: GgmlType,
    pub ne: [i64; 3],
    pub addr: usize,
    pub bytes: usize,
}

/// What the worker needs to know about the model (plain data: it crosses threads).
#[derive(Debug, Clone)]
pub struct CpuModel {
    pub n_embd: usize,
    /// Per layer, per matrix (up, gate, down).
    pub layers: Vec<Option<[Option<StoreMat>; 3]>>,
}

struct Job {
    il: usize,
    act: ExpertAct,
    x: Vec<f32>,
    picks: Vec<(u32, f32)>,
}

pub struct CpuChannel {
    tx: Sender<Job>,
    rx: Receiver<Result<Vec<f32>, String>>,
    pending: Option<usize>,
}

impl CpuChannel {
    /// Starts the worker with `n_threads` ggml CPU threads.
    pub fn new(model: CpuModel, n_threads: usize) -> Self {
        let (tx, job_rx) = channel::<Job>();
        let (res_tx, rx) = channel();
        std::thread::Builder::new()
            .name("pocketmoe-cpu-experts".into())
            .spawn(move || {
                let backend = match Backend::cpu(n_threads) {
                    Ok(b) => b,
                    Err(e) => {
                        let _ = res_tx.send(Err(e.to_string()));
                        return;
                    }
                };
                while let Ok(job) = job_rx.recv() {
                    let r = run_job(&backend, &model, &job).map_err(|e| e.to_string());
                    if res_tx.send(r).is_err() {
                        break;
                    }
                }
            })
            .expect("spawning the CPU expert worker");
        Self {
            tx,
            rx,
            pending: None,
        }
    }

    /// Queues layer `il`'s CPU experts `picks` (expert, router weight) on input `x` [n_embd].
    pub fn start(&mut self, il: usize, act: ExpertAct, x: Vec<f32>, picks: Vec<(u32, f32)>) {
        if self.pending.is_some() {
            // Left over from a step that failed half-way: drain it.
            let _ = self.finish();
        }
        self.pending = Some(il);
        // A send error means the worker died; finish() reports it.
        let _ = self.tx.send(Job { il, act, x, picks });
    }

    /// The layer whose job is in flight.
    pub fn pending(&self) -> Option<usize> {
        self.pending
    }

    /// Waits for the job in flight: the weighted sum of its experts' outputs [n_embd].
    pub fn finish(&mut self) -> Result<Vec<f32>, String> {
        self.pending = None;
        self.rx
            .recv()
            .unwrap_or_else(|_| Err("the CPU expert worker stopped".into()))
    }
}

fn run_job(
    backend: &Backend,
    model: &CpuModel,
    job: &Job,
) -> Result<Vec<f32>, crate::ggml::GgmlError> {
    let mats = model.layers[job.il]
        .as_ref()
        .expect("CPU job for an offloaded layer");
    let kc = job.picks.len() as i64;
    let ctx = Context::new(64, 64)?;
    let mut w: [Option<Tensor<'_>>; 3] = [None; 3];
    for (m, sm) in mats.iter().enumerate() {
        let Some(sm) = sm else { continue };
        let t = ctx
            .new_tensor(sm.ty, &sm.ne)?
            .set_name(&format!("blk.{}.{}.weight", job.il, MATS[m]));
        // SAFETY: the store outlives the worker's jobs (the engine joins... drops the channel
        // before the store), and the range is exactly the store tensor's bytes.
        let buf = unsafe { ctx.wrap_host_memory(sm.addr, sm.bytes)? };
        buf.place(t, 0)?;
        w[m] = Some(t);
    }
    let n_embd = model.n_embd as i64;
    let x = ctx.new_tensor(GgmlType::F32, &[n_embd, 1])?;
    let ids = ctx.new_tensor(GgmlType::I32, &[kc, 1])?;
    let wt = ctx.new_tensor(GgmlType::F32, &[1, kc, 1])?;
    let t = ExpertTensors {
        w,
        biases: [None; 3],
    };
    let dims = FfnDims {
        n_embd,
        k: kc,
        nt: 1,
    };
    let out = expert_ffn(&ctx, &t, x, dims, [ids; 3], ids, wt, job.act, &|y, _| y);
    let graph = Graph::new(&ctx, 64);
    graph.build_forward(out);
    ctx.alloc_tensors(backend)?;
    x.write_f32(&job.x)?;
    ids.write_i32(&job.picks.iter().map(|p| p.0 as i32).collect::<Vec<_>>())?;
    wt.write_f32(&job.picks.iter().map(|p| p.1).collect::<Vec<_>>())?;
    backend.compute(&graph)?;
    out.read_f32()
}
