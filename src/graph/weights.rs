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
use crate::ggml::{Backend, BufType, Context, GgmlError, Graph, Tensor, TensorIndex};
use crate::gguf::GgufModel;
use std::collections::HashMap;

/// The tensor looked up by token id.
pub const TOKEN_EMBD: &str = "token_embd.weight";

/// One backend's share of the weights.
struct Part {
    ctx: Context,
    index: TensorIndex,
    bytes: u64,
    /// Declared, not yet allocated and filled ([`Weights::declare`]).
    pending: bool,
}

pub struct Weights {
    main: Part,
    /// Host copies (the token embedding, when offloading to a GPU).
    host: Option<Part>,
    /// Tensors in one of the CPU's extra buffer types, and their bytes.
    extra: (usize, u64),
}

/// Where a weight goes besides its backend's default buffer: one of the CPU device's extra
/// buffer types (by name of the tensor).
pub type ExtraPlacement = HashMap<String, BufType>;

impl Part {
    fn get(&self, name: &str) -> Option<Tensor<'_>> {
        self.ctx.get(&self.index, name)
    }

    /// Recreates the tensors of `model` that `keep` names, without memory.
    fn declare(model: &GgufModel, keep: &dyn Fn(&str) -> bool) -> Result<Self, GgmlError> {
        let ctx = Context::new(model.n_tensors() + 1, 0)?;
        let mut bytes = 0;
        for t in model.tensors().filter(|t| keep(&t.name)) {
            let ne: Vec<i64> = t.shape().iter().map(|&d| d as i64).collect();
            ctx.new_tensor(t.ty, &ne)?.set_name(&t.name);
            bytes += t.n_bytes;
        }
        let index = ctx.index();
        Ok(Self {
            ctx,
            index,
            bytes,
            pending: true,
        })
    }

    /// Allocates the declared tensors, those in `extra` in a buffer of their type each and the
    /// rest in one buffer of `backend`, and copies their bytes from the file. A write into an
    /// extra buffer type is converted to its layout by ggml as it is written (which is why each
    /// tensor is written whole, in one call). Returns (tensors, bytes) put in extra buffers.
    fn fill(
        &mut self,
        model: &GgufModel,
        backend: &Backend,
        extra: &ExtraPlacement,
        progress: &mut dyn FnMut(u64),
    ) -> Result<(usize, u64), GgmlError> {
        assert!(self.pending, "weights filled twice");
        let names: Vec<String> = model
            .tensors()
            .filter(|t| self.index.contains(&t.name))
            .map(|t| t.name.clone())
            .collect();
        let mut by_type: Vec<(BufType, Vec<Tensor<'_>>)> = Vec::new();
        for name in &names {
            if let Some(&buft) = extra.get(name) {
                let t = self.get(name).expect("declared");
                match by_type.iter_mut().find(|(b, _)| *b == buft) {
                    Some((_, ts)) => ts.push(t),
                    None => by_type.push((buft, vec![t])),
                }
            }
        }
        let mut n_extra = (0, 0);
        for (buft, ts) in &by_type {
            // `place` starts every tensor at a multiple of 256 (a multiple of any CPU alignment).
            let size: usize = ts
                .iter()
                .map(|&t| buft.alloc_size(t).next_multiple_of(256))
                .sum();
            let buf = self.ctx.new_buffer_of(*buft, size)?;
            let mut off = 0;
            for &t in ts {
                off = buf.place(t, off)?;
                n_extra.0 += 1;
                n_extra.1 += t.n_bytes() as u64;
            }
        }
        // The rest (ggml skips tensors that already have memory).
        self.ctx.alloc_tensors(backend)?;
        self.ctx.mark_weights();
        for name in &names {
            let info = model.tensor(name).expect("declared from the file");
            let tensor = self.get(name).expect("declared");
            tensor.write_bytes(model.tensor_data(info))?;
            // Copied: drop the file's pages (RSS holds one copy of the model; a second reader
            // of the tensor faults them back in).
            model.release(info);
            progress(info.n_bytes);
        }
        self.pending = false;
        Ok(n_extra)
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
        let mut w = Self::declare(model, host.is_some(), keep)?;
        w.fill(model, main, host, &ExtraPlacement::new(), progress)?;
        Ok(w)
    }

    /// [`Weights::load`] in two steps: the tensors without memory (so a graph can be built on
    /// them to see how each is used, [`Weights::extra_placement`]), then [`Weights::fill`].
    /// `host`: whether a host backend will take the token embedding.
    pub fn declare(
        model: &GgufModel,
        host: bool,
        keep: &dyn Fn(&str) -> bool,
    ) -> Result<Self, GgmlError> {
        let tied = model.tensors().all(|t| t.name != "output.weight");
        let on_host = |name: &str| host && name == TOKEN_EMBD && keep(name);
        let on_main = |name: &str| keep(name) && (!on_host(name) || tied);
        let main = Part::declare(model, &on_main)?;
        let host = if model.tensors().any(|t| on_host(&t.name)) {
            Some(Part::declare(model, &on_host)?)
        } else {
            None
        };
        Ok(Self {
            main,
            host,
            extra: (0, 0),
        })
    }

    /// Allocates and fills declared weights: on `main` (those `extra` names in their buffer
    /// type there) and the host copies on `host`.
    pub fn fill(
        &mut self,
        model: &GgufModel,
        main: &Backend,
        host: Option<&Backend>,
        extra: &ExtraPlacement,
        progress: &dyn Fn(u64, u64),
    ) -> Result<(), GgmlError> {
        let total = self.main.bytes + self.host.as_ref().map_or(0, |p| p.bytes);
        let mut done = 0;
        let mut report = |n: u64| {
            done += n;
            progress(done, total);
        };
        self.extra = self.main.fill(model, main, extra, &mut report)?;
        if let Some(h) = &mut self.host {
            let backend = host.expect("host weights declared without a host backend");
            h.fill(model, backend, &ExtraPlacement::new(), &mut report)?;
        }
        Ok(())
    }

    /// Which declared weights of the main backend go into one of `bufts` (the CPU device's extra
    /// buffer types, in preference order), judged on `graphs` (built on these weights before
    /// they are filled: every shape the engine runs should be represented). A weight qualifies
    /// when every read of it in every graph is as the matrix (source 0) of a `mul_mat` or
    /// `mul_mat_id`, not through a view, and the first type whose device supports each of those
    /// nodes with the weight in that type takes it (llama.cpp's `select_weight_buft`, asked of
    /// the real nodes). Anything else stays in plain memory: a lookup table (`get_rows`), a
    /// tied embedding that is also the head, a matrix sliced by views (DeepSeek's `attn_kv_b`),
    /// a weight the graphs never read, a shape or type the kernels do not take (the type then
    /// keeps its plain layout, as libllama does). A wrong call here is not silent for ops ggml
    /// refuses (its scheduler aborts naming the tensor), but a view of a re-laid matrix would
    /// read the wrong layout; hence reads through views disqualify.
    pub fn extra_placement(&self, graphs: &[Graph<'_>], bufts: &[BufType]) -> ExtraPlacement {
        let mut out = ExtraPlacement::new();
        if bufts.is_empty() {
            return out;
        }
        assert!(
            self.main.pending,
            "placement asked after the weights were filled"
        );
        let mut reads: HashMap<usize, Vec<(Tensor<'_>, usize)>> = HashMap::new();
        for g in graphs {
            for (node, slot, src) in g.reads() {
                reads.entry(src).or_default().push((node, slot));
            }
        }
        for name in self.main.index.names() {
            let w = self.main.get(name).expect("indexed");
            let Some(uses) = reads.get(&w.id()) else {
                continue;
            };
            if !uses
                .iter()
                .all(|(node, slot)| *slot == 0 && node.is_matmul())
            {
                continue;
            }
            if let Some(&b) = bufts
                .iter()
                .find(|b| uses.iter().all(|(node, _)| b.supports(w, *node)))
            {
                out.insert(name.to_string(), b);
            }
        }
        out
    }

    /// Tensors the CPU's extra buffer types hold, and their bytes (file layout).
    pub fn extra(&self) -> (usize, u64) {
        self.extra
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
