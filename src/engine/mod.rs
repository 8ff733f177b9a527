//! The engine: a GGUF model loaded on one backend (CPU, or one GPU with the CPU as fallback for
//! unsupported ops), its KV cache, and the forward pass over micro-batches.
//!
//! Invariants: the cache holds positions `0..n_past`; `forward` appends; exceeding `n_ctx` is an
//! error (`ContextFull`) before any graph is built. Logits are returned for every input position.
pub mod batch;
pub mod kv;
pub mod sampling;
pub mod weights;

use crate::ggml::{Backend, Context, GgmlError, GgmlType, OwnedGraph, Sched};
use crate::gguf::{GgufError, GgufModel};
use crate::graph::{arch, BatchInputs, GraphBuilder};
use crate::model::{arch_by_name, validate::validate, Hparams};
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
    #[error("token id {id} is outside the vocabulary (0..{n_vocab})")]
    BadToken { id: u32, n_vocab: u64 },
}

/// Where the model runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Device {
    Cpu,
    Cuda(usize),
}

#[derive(Debug, Clone)]
pub struct EngineOptions {
    pub device: Device,
    pub n_ctx: usize,
    pub n_threads: usize,
    pub n_ubatch: usize,
    pub kv_type: GgmlType,
    /// Memory budget on the main device (bytes). `None`: all of the model on the device. With a
    /// budget the model does not fit in, routed experts are offloaded (DESIGN.md §4).
    pub gpu_mem: Option<u64>,
}

impl Default for EngineOptions {
    fn default() -> Self {
        Self {
            device: Device::Cpu,
            n_ctx: 4096,
            n_threads: 0,
            n_ubatch: 512,
            kv_type: GgmlType::F16,
            gpu_mem: None,
        }
    }
}

pub struct Engine {
    pub hp: Hparams,
    opts: EngineOptions,
    // Field order = drop order: the cached graph first, the file map last.
    /// The last graph built and allocated, with its (n_tokens, n_kv, last_only) shape.
    graph: Option<((usize, usize, bool), OwnedGraph)>,
    /// The last multi-sequence graph (`batch`), with its shape.
    batch_graph: Option<(batch::GraphKey, OwnedGraph)>,
    sched: Sched,
    kv: kv::KvCache,
    weights: weights::Weights,
    _backends: Vec<Rc<Backend>>,
    _file: GgufModel,
    n_past: usize,
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
        let arch_name = file
            .get_str("general.architecture")
            .ok_or_else(|| model_err("no general.architecture".into()))?
            .to_string();
        let spec = arch_by_name(&arch_name)
            .ok_or_else(|| model_err(format!("architecture {arch_name:?} is not supported")))?;
        let hp = Hparams::from_meta(&arch_name, spec.required_keys, &file).map_err(model_err)?;
        if !arch::is_built(&arch_name) {
            return Err(model_err(format!(
                "no graph for architecture {arch_name:?} yet (built: {})",
                arch::BUILT.join(", ")
            )));
        }
        let tensors: Vec<_> = file.tensors().cloned().collect();
        let v = validate(spec, &hp, &tensors);
        if let Some(e) = v.errors().next() {
            return Err(model_err(e.to_string()));
        }
        let cpu = Rc::new(Backend::cpu(opts.n_threads)?);
        let main = match opts.device {
            Device::Cpu => cpu.clone(),
            Device::Cuda(i) => Rc::new(Backend::cuda(i)?),
        };
        let weights = weights::Weights::load(&file, &main, progress)?;
        let widths: Vec<(usize, usize)> = (0..hp.n_layer)
            .map(|_| (hp.k_dim() as usize, hp.v_dim() as usize))
            .collect();
        let kv = kv::KvCache::new(&main, &widths, opts.n_ctx, opts.kv_type)?;
        let backends = if Rc::ptr_eq(&main, &cpu) {
            vec![cpu]
        } else {
            vec![main, cpu]
        };
        let sched = Sched::new(&backends, graph_size(&hp), false)?;
        Ok(Self {
            hp,
            opts,
            graph: None,
            batch_graph: None,
            sched,
            kv,
            weights,
            _backends: backends,
            _file: file,
            n_past: 0,
        })
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

    /// Appends `tokens` to the sequence and returns the logits at each of their positions.
    pub fn forward(&mut self, tokens: &[u32]) -> Result<Vec<Vec<f32>>, EngineError> {
        self.forward_with(tokens, false)
    }

    /// Appends `tokens` and returns the logits of the last position only (cheaper: the output
    /// projection runs once per micro-batch).
    pub fn forward_last(&mut self, tokens: &[u32]) -> Result<Vec<f32>, EngineError> {
        let mut v = self.forward_with(tokens, true)?;
        Ok(v.pop().unwrap_or_default())
    }

    fn forward_with(
        &mut self,
        tokens: &[u32],
        last_only: bool,
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
            out.extend(self.forward_ubatch(chunk, last_only)?);
        }
        Ok(out)
    }

    /// Builds the graph for a micro-batch of `n` tokens at `n_past` (attending `n_kv` positions).
    fn build_graph(
        &self,
        n: usize,
        n_past: usize,
        n_kv: usize,
        last_only: bool,
    ) -> Result<OwnedGraph, EngineError> {
        let size = graph_size(&self.hp);
        let window = self.hp.sliding_window as usize;
        OwnedGraph::build(Context::new(size, size)?, size, |ctx, graph| {
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
                out_ids: None,
            };
            let g = GraphBuilder {
                ctx,
                w: &self.weights,
                kv: &self.kv,
                hp: &self.hp,
                batch,
                graph,
            };
            let logits = arch::build(&g).map_err(|msg| EngineError::Model {
                path: String::new(),
                msg,
            })?;
            g.finish(logits.set_name("logits"));
            let mut keep = vec![
                "inp_tokens",
                "inp_pos",
                "attn_inp_kq_mask",
                "inp_kv_idxs",
                "logits",
            ];
            if t_mask_swa.is_some() {
                keep.push("attn_inp_kq_mask_swa");
            }
            Ok(keep)
        })
    }

    fn forward_ubatch(
        &mut self,
        tokens: &[u32],
        last_only: bool,
    ) -> Result<Vec<Vec<f32>>, EngineError> {
        let n = tokens.len();
        let n_past = self.n_past;
        let n_kv = BatchInputs::padded_n_kv(n_past, n, self.opts.n_ctx);
        // Reuse the last graph when the shapes match: decode steps within one KV bucket differ
        // only in their inputs. Otherwise build, and let the scheduler allocate it.
        let key = (n, n_kv, last_only);
        if self.graph.as_ref().is_none_or(|(k, _)| *k != key) {
            self.graph = None;
            let g = self.build_graph(n, n_past, n_kv, last_only)?;
            self.sched.alloc(&g.graph())?;
            self.graph = Some((key, g));
        }
        let (_, g) = self.graph.as_ref().expect("built above");
        let ids: Vec<i32> = tokens.iter().map(|&t| t as i32).collect();
        g.tensor("inp_tokens").write_i32(&ids)?;
        g.tensor("inp_pos")
            .write_i32(&(n_past as i32..(n_past + n) as i32).collect::<Vec<_>>())?;
        g.tensor("attn_inp_kq_mask")
            .write_bytes(&causal_mask_f16(n_past, n, n_kv, usize::MAX))?;
        if g.has("attn_inp_kq_mask_swa") {
            let window = self.hp.sliding_window as usize;
            g.tensor("attn_inp_kq_mask_swa")
                .write_bytes(&causal_mask_f16(n_past, n, n_kv, window))?;
        }
        g.tensor("inp_kv_idxs")
            .write_i64(&(n_past as i64..(n_past + n) as i64).collect::<Vec<_>>())?;
        self.sched.compute(&g.graph())?;
        let flat = g.tensor("logits").read_f32()?;
        self.n_past = n_past + n;
        let n_vocab = self.hp.n_vocab as usize;
        Ok(flat.chunks_exact(n_vocab).map(<[f32]>::to_vec).collect())
    }
}

/// Nodes a step's graph may hold (generous: ~64 per block).
fn graph_size(hp: &Hparams) -> usize {
    (hp.n_layer * 96 + 256).max(2048)
}

/// f16 causal mask [n_kv, n]: token t (position p = n_past + t) sees cache positions j <= p with
/// p - j < window (llama.cpp's standard sliding window); the padding beyond is masked too.
fn causal_mask_f16(n_past: usize, n: usize, n_kv: usize, window: usize) -> Vec<u8> {
    let (zero, neg_inf) = (
        half::f16::ZERO.to_le_bytes(),
        half::f16::NEG_INFINITY.to_le_bytes(),
    );
    let mut m = Vec::with_capacity(n_kv * n * 2);
    for t in 0..n {
        for j in 0..n_kv {
            let p = n_past + t;
            m.extend_from_slice(if j <= p && p - j < window {
                &zero
            } else {
                &neg_inf
            });
        }
    }
    m
}
