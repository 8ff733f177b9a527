//! Model weights on a backend: every tensor of the GGUF recreated in one ggml context (same name,
//! type, shape), allocated in one buffer of the chosen backend, and filled from the mmap'd file
//! (the bytes are copied as they are: quantised blocks are never dequantised).
//!
//! Invariant: `get(name)` returns exactly the GGUF tensor of that name; shapes were checked
//! against the architecture table before loading (`model::validate`).
use crate::ggml::{Backend, Context, GgmlError, Tensor, TensorIndex};
use crate::gguf::GgufModel;

pub struct Weights {
    ctx: Context,
    index: TensorIndex,
    pub bytes: u64,
}

impl Weights {
    /// Loads the tensors of `model` for which `keep(name)` holds onto `backend`;
    /// `progress(done, total)` reports bytes.
    pub fn load(
        model: &GgufModel,
        backend: &Backend,
        keep: &dyn Fn(&str) -> bool,
        progress: &dyn Fn(u64, u64),
    ) -> Result<Self, GgmlError> {
        let n = model.n_tensors();
        let ctx = Context::new(n + 1, 0)?;
        let mut pairs = Vec::with_capacity(n);
        for t in model.tensors().filter(|t| keep(&t.name)) {
            let ne: Vec<i64> = t.shape().iter().map(|&d| d as i64).collect();
            let tensor = ctx.new_tensor(t.ty, &ne)?.set_name(&t.name);
            pairs.push((tensor, t));
        }
        ctx.alloc_tensors(backend)?;
        let total: u64 = pairs.iter().map(|(_, t)| t.n_bytes).sum();
        let mut done = 0;
        for (tensor, info) in &pairs {
            tensor.write_bytes(model.tensor_data(info))?;
            model.release(info);
            done += info.n_bytes;
            progress(done, total);
        }
        drop(pairs);
        let index = ctx.index();
        Ok(Self {
            ctx,
            index,
            bytes: total,
        })
    }

    /// The tensor `name`, if the file has it.
    pub fn get(&self, name: &str) -> Option<Tensor<'_>> {
        self.ctx.get(&self.index, name)
    }

    /// Tensor `template` (with `{}` = block) of block `il`, if present.
    pub fn layer(&self, il: usize, suffix: &str) -> Option<Tensor<'_>> {
        self.get(&format!("blk.{il}.{suffix}"))
    }
}
