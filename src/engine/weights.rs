//! Model weights on a backend: every tensor of the GGUF recreated in one ggml context (same name,
//! type, shape), allocated in one buffer of the chosen backend, and filled from the mmap'd file
//! (the bytes are copied as they are: quantised blocks are never dequantised).
//!
//! Invariant: `get(name)` returns exactly the GGUF tensor of that name; shapes were checked
//! against the architecture table before loading (`model::validate`).
use crate::ggml::{Backend, Context, GgmlError, Tensor, TensorIndex};
use crate::gguf::GgufModel;

pub struct Weights {
    /// Tensors on the main backend, and (when the main backend is a GPU) the input layer on the
    /// CPU, as llama.cpp places it: `token_embd` is only gathered from (a few rows per token), so
    /// it costs VRAM without speeding anything up.
    parts: Vec<(Context, TensorIndex)>,
    pub bytes: u64,
}

impl Weights {
    /// Loads every tensor of `model` onto `main` (the token embedding onto `input` when given and
    /// the model has its own output projection); `progress(done, total)` reports bytes.
    pub fn load(
        model: &GgufModel,
        main: &Backend,
        input: Option<&Backend>,
        progress: &dyn Fn(u64, u64),
    ) -> Result<Self, GgmlError> {
        let tied = model.tensor("output.weight").is_none();
        let on_input = |name: &str| input.is_some() && !tied && name == "token_embd.weight";
        let total: u64 = model.tensors().map(|t| t.n_bytes).sum();
        let mut done = 0;
        let mut parts = Vec::new();
        for (backend, here) in [(Some(main), false), (input, true)] {
            let Some(backend) = backend else { continue };
            let infos: Vec<_> = model
                .tensors()
                .filter(|t| on_input(&t.name) == here)
                .collect();
            if infos.is_empty() {
                continue;
            }
            let ctx = Context::new(infos.len() + 1, 0)?;
            let mut pairs = Vec::with_capacity(infos.len());
            for t in infos {
                let ne: Vec<i64> = t.shape().iter().map(|&d| d as i64).collect();
                pairs.push((ctx.new_tensor(t.ty, &ne)?.set_name(&t.name), t));
            }
            ctx.alloc_tensors(backend)?;
            for (tensor, info) in &pairs {
                tensor.write_bytes(model.tensor_data(info))?;
                done += info.n_bytes;
                progress(done, total);
            }
            drop(pairs);
            let index = ctx.index();
            parts.push((ctx, index));
        }
        Ok(Self {
            parts,
            bytes: total,
        })
    }

    /// The tensor `name`, if the file has it.
    pub fn get(&self, name: &str) -> Option<Tensor<'_>> {
        self.parts
            .iter()
            .find_map(|(ctx, index)| ctx.get(index, name))
    }

    /// Tensor `template` (with `{}` = block) of block `il`, if present.
    pub fn layer(&self, il: usize, suffix: &str) -> Option<Tensor<'_>> {
        self.get(&format!("blk.{il}.{suffix}"))
    }
}
