//! Model weights on backends: every tensor of the GGUF recreated in a ggml context (same name,
//! type, shape), allocated in one buffer of the backend it is placed on, and filled from the
//! mmap'd file (the bytes are copied as they are: quantised blocks are never dequantised).
//!
//! Placement: the main backend holds every kept tensor. When the engine offloads experts, the
//! token embedding lives in host memory instead, as in llama.cpp: its lookup (`get_rows` of one
//! row per token) runs on the CPU and only the batch's rows cross to the GPU. That saves its
//! VRAM for expert-cache slots (0.3 GB for a 150k vocabulary). A model whose output head is tied
//! to the embedding keeps a device copy too, for the head's matmul.
//!
//! Weight buffers are marked as such (`Context::mark_weights`): ggml's scheduler then runs the
//! lookup where the table is, instead of copying the whole table to the GPU at every step.
//!
//! Invariant: `get(name)` returns exactly the GGUF tensor of that name (the device copy where
//! there are two); shapes were checked against the architecture table before loading
//! (`model::validate`).
use crate::ggml::{Backend, Context, GgmlError, Tensor, TensorIndex};
use crate::gguf::GgufModel;

/// The tensor looked up by token id.
pub const TOKEN_EMBD: &str = "token_embd.weight";

/// One backend's share of the weights.
struct Part {
    ctx: Context,
    index: TensorIndex,
    bytes: u64,
}

pub struct Weights {
    main: Part,
    /// Host copies (the token embedding, when offloading to a GPU).
    host: Option<Part>,
}

impl Part {
    fn get(&self, name: &str) -> Option<Tensor<'_>> {
        self.ctx.get(&self.index, name)
    }

    fn load(
        model: &GgufModel,
        backend: &Backend,
        keep: &dyn Fn(&str) -> bool,
        progress: &mut dyn FnMut(u64),
    ) -> Result<Self, GgmlError> {
        let ctx = Context::new(model.n_tensors() + 1, 0)?;
        let mut pairs = Vec::new();
        for t in model.tensors().filter(|t| keep(&t.name)) {
            let ne: Vec<i64> = t.shape().iter().map(|&d| d as i64).collect();
            let tensor = ctx.new_tensor(t.ty, &ne)?.set_name(&t.name);
            pairs.push((tensor, t));
        }
        ctx.alloc_tensors(backend)?;
        ctx.mark_weights();
        let mut bytes = 0;
        for (tensor, info) in &pairs {
            tensor.write_bytes(model.tensor_data(info))?;
            // Copied: drop the file's pages (RSS holds one copy of the model; a second reader
            // of the tensor faults them back in).
            model.release(info);
            bytes += info.n_bytes;
            progress(info.n_bytes);
        }
        drop(pairs);
        let index = ctx.index();
        Ok(Self { ctx, index, bytes })
    }
}

impl Weights {
    /// Loads the tensors of `model` for which `keep(name)` holds: onto `main`, except the token
    /// embedding, which goes to `host` when one is given (and to both when the model has no
    /// `output.weight`, its head being tied to the embedding). `progress(done, total)` reports
    /// bytes.
    pub fn load(
        model: &GgufModel,
        main: &Backend,
        host: Option<&Backend>,
        keep: &dyn Fn(&str) -> bool,
        progress: &dyn Fn(u64, u64),
    ) -> Result<Self, GgmlError> {
        let tied = model.tensors().all(|t| t.name != "output.weight");
        let on_host = |name: &str| host.is_some() && name == TOKEN_EMBD && keep(name);
        let on_main = |name: &str| keep(name) && (!on_host(name) || tied);
        let total: u64 = model
            .tensors()
            .map(|t| t.n_bytes * (on_host(&t.name) as u64 + on_main(&t.name) as u64))
            .sum();
        let mut done = 0;
        let mut report = |n: u64| {
            done += n;
            progress(done, total);
        };
        let main_part = Part::load(model, main, &on_main, &mut report)?;
        let host_part = match host {
            Some(h) if model.tensors().any(|t| on_host(&t.name)) => {
                Some(Part::load(model, h, &on_host, &mut report)?)
            }
            _ => None,
        };
        Ok(Self {
            main: main_part,
            host: host_part,
        })
    }

    /// The tensor `name`, if the file has it (the main backend's copy where there are two).
    pub fn get(&self, name: &str) -> Option<Tensor<'_>> {
        self.main
            .get(name)
            .or_else(|| self.host.as_ref()?.get(name))
    }

    /// The token embedding for the lookup by id: the host copy where there is one.
    pub fn embedding(&self) -> Option<Tensor<'_>> {
        let host = self.host.as_ref().and_then(|p| p.get(TOKEN_EMBD));
        host.or_else(|| self.get(TOKEN_EMBD))
    }

    /// Bytes on the main backend.
    pub fn bytes(&self) -> u64 {
        self.main.bytes
    }

    /// Bytes in host memory (copies kept off the main backend).
    pub fn host_bytes(&self) -> u64 {
        self.host.as_ref().map_or(0, |p| p.bytes)
    }

    /// Tensor `template` (with `{}` = block) of block `il`, if present.
    pub fn layer(&self, il: usize, suffix: &str) -> Option<Tensor<'_>> {
        self.get(&format!("blk.{il}.{suffix}"))
    }
}
