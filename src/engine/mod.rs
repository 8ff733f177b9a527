//! The engine: a GGUF model loaded on one backend (CPU, or one GPU with the CPU as fallback for
//! unsupported ops), its KV cache, and the forward pass over micro-batches.
//!
//! Invariants: the cache holds positions `0..n_past`; `forward` appends; exceeding `n_ctx` is an
//! error (`ContextFull`) before any graph is built. Logits are returned for every input position.
pub mod kv;
pub mod sampling;
pub mod weights;

use crate::ggml::{Backend, Context, GgmlError, GgmlType, Graph, Sched};
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
}

impl Default for EngineOptions {
    fn default() -> Self {
        Self {
            device: Device::Cpu,
            n_ctx: 4096,
            n_threads: 0,
            n_ubatch: 512,
            kv_type: GgmlType::F16,
        }
    }
}

pub struct Engine {
    pub hp: Hparams,
    opts: EngineOptions,
    // Field order = drop order: graphs' users first, the file map last.
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
            sched,
            kv,
            weights,
            _backends: backends,
            _file: file,
            n_past: 0,
        })
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

    fn forward_ubatch(
        &mut self,
        tokens: &[u32],
        last_only: bool,
    ) -> Result<Vec<Vec<f32>>, EngineError> {
        let n = tokens.len();
        let n_past = self.n_past;
        let ctx = Context::new(graph_size(&self.hp), graph_size(&self.hp))?;
        let t_tok = ctx
            .new_tensor(GgmlType::I32, &[n as i64])?
            .set_name("inp_tokens"); // [n]
        let t_pos = ctx
            .new_tensor(GgmlType::I32, &[n as i64])?
            .set_name("inp_pos"); // [n]
        let n_kv = BatchInputs::padded_n_kv(n_past, n, self.opts.n_ctx);
        let t_mask = ctx
            .new_tensor(GgmlType::F16, &[n_kv as i64, n as i64])?
            .set_name("attn_inp_kq_mask"); // [n_kv, n]
        let t_idx = ctx
            .new_tensor(GgmlType::I64, &[n as i64])?
            .set_name("inp_kv_idxs"); // [n]
        for t in [t_tok, t_pos, t_mask, t_idx] {
            ctx.set_input(t);
        }
        let window = self.hp.sliding_window as usize;
        let t_mask_swa = if window > 0 {
            let m = ctx
                .new_tensor(GgmlType::F16, &[n_kv as i64, n as i64])?
                .set_name("attn_inp_kq_mask_swa"); // [n_kv, n]
            ctx.set_input(m);
            Some(m)
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
        };
        let g = GraphBuilder {
            ctx: &ctx,
            w: &self.weights,
            kv: &self.kv,
            hp: &self.hp,
            batch,
            graph: Graph::new(&ctx, graph_size(&self.hp)),
        };
        let logits = arch::build(&g).map_err(|msg| EngineError::Model {
            path: String::new(),
            msg,
        })?;
        g.finish(logits);
        self.sched.alloc(&g.graph)?;
        let ids: Vec<i32> = tokens.iter().map(|&t| t as i32).collect();
        t_tok.write_i32(&ids)?;
        t_pos.write_i32(&(n_past as i32..(n_past + n) as i32).collect::<Vec<_>>())?;
        t_mask.write_bytes(&causal_mask_f16(n_past, n, n_kv, usize::MAX))?;
        if let Some(m) = t_mask_swa {
            m.write_bytes(&causal_mask_f16(n_past, n, n_kv, window))?;
        }
        t_idx.write_i64(&(n_past as i64..(n_past + n) as i64).collect::<Vec<_>>())?;
        self.sched.compute(&g.graph)?;
        let flat = logits.read_f32()?;
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
