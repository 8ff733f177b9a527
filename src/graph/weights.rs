//! Model weights on backends: every tensor of the GGUF recreated in a ggml context (same name,
//! type, shape), allocated in one buffer of the backend it is placed on, and filled from the
//! mmap'd file (the bytes are copied as they are: quantised blocks are never dequantised).
//!
//! Placement: the main backend holds every kept tensor (in a layer split over several devices,
//! `engine::split`, each block's tensors are in one buffer of its device instead: `fill_split`). When the engine offloads experts, the
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
use super::layers::Layers;
use crate::ggml::{Backend, BufType, Context, GgmlError, Graph, Tensor, TensorIndex};
use crate::gguf::GgufModel;
use crate::model::Hparams;
use std::collections::HashMap;
use std::ptr::NonNull;

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
    /// The tensors [`W`] handles stand for (tensors of `main`'s and `host`'s contexts, which
    /// live as long as `self`).
    slots: Vec<NonNull<ggml_sys::ggml_tensor>>,
    /// Every tensor the graphs read, by block and kind, resolved once at [`Weights::declare`].
    layers: Layers,
}

/// A weight of [`Weights`]: a handle without a lifetime (`Copy`, storable in the typed per-block
/// structs of [`Layers`]), turned into the tensor by [`Weights::t`]. Only the [`Weights`] that
/// made it knows what it stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct W(u32);

/// Why weights could not be declared.
#[derive(Debug, thiserror::Error)]
pub enum WeightsError {
    #[error(transparent)]
    Ggml(#[from] GgmlError),
    /// A tensor the graph of a block needs is not in the file (the caller names the file).
    #[error("missing tensor {name}, which {what} needs")]
    Missing { name: String, what: String },
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
        split: &ExtraPlacement,
        progress: &mut dyn FnMut(u64),
    ) -> Result<(usize, u64), GgmlError> {
        assert!(self.pending, "weights filled twice");
        let names: Vec<String> = model
            .tensors()
            .filter(|t| self.index.contains(&t.name))
            .map(|t| t.name.clone())
            .collect();
        let mut n_extra = (0, 0);
        // The extra buffer types' tensors (counted), then those of other devices (`split`).
        for (map, counted) in [(extra, true), (split, false)] {
            let mut by_type: Vec<(BufType, Vec<Tensor<'_>>)> = Vec::new();
            for name in &names {
                if let Some(&buft) = map.get(name) {
                    let t = self.get(name).expect("declared");
                    if t.has_buffer() {
                        continue; // placed by the first map
                    }
                    match by_type.iter_mut().find(|(b, _)| *b == buft) {
                        Some((_, ts)) => ts.push(t),
                        None => by_type.push((buft, vec![t])),
                    }
                }
            }
            for (buft, ts) in &by_type {
                self.ctx.alloc_group(*buft, ts)?;
                if counted {
                    n_extra.0 += ts.len();
                    n_extra.1 += ts.iter().map(|t| t.n_bytes() as u64).sum::<u64>();
                }
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
        hp: &Hparams,
        main: &Backend,
        host: Option<&Backend>,
        keep: &dyn Fn(&str) -> bool,
        progress: &dyn Fn(u64, u64),
    ) -> Result<Self, WeightsError> {
        let mut w = Self::declare(model, hp, host.is_some(), keep)?;
        w.fill(model, main, host, &ExtraPlacement::new(), progress)?;
        Ok(w)
    }

    /// [`Weights::load`] in two steps: the tensors without memory (so a graph can be built on
    /// them to see how each is used, [`Weights::extra_placement`]), then [`Weights::fill`].
    /// `host`: whether a host backend will take the token embedding. Resolves the tensors each
    /// block's graph reads ([`Layers`], by `hp`'s architecture table): a tensor a block needs and
    /// the file lacks is an error naming it ([`WeightsError::Missing`]).
    pub fn declare(
        model: &GgufModel,
        hp: &Hparams,
        host: bool,
        keep: &dyn Fn(&str) -> bool,
    ) -> Result<Self, WeightsError> {
        let tied = model.tensors().all(|t| t.name != "output.weight");
        let on_host = |name: &str| host && name == TOKEN_EMBD && keep(name);
        let on_main = |name: &str| keep(name) && (!on_host(name) || tied);
        let main = Part::declare(model, &on_main)?;
        let host = if model.tensors().any(|t| on_host(&t.name)) {
            Some(Part::declare(model, &on_host)?)
        } else {
            None
        };
        let mut r = Resolver {
            main: &main,
            host: host.as_ref(),
            slots: Vec::new(),
            hp,
            keep,
        };
        let layers = Layers::resolve(&mut r)?;
        // The handles point into the parts' contexts, which moving the parts leaves in place.
        let slots = r.slots;
        Ok(Self {
            main,
            host,
            extra: (0, 0),
            slots,
            layers,
        })
    }

    /// The tensor `h` stands for.
    pub fn t(&self, h: W) -> Tensor<'_> {
        Tensor::from_raw(self.slots[h.0 as usize])
    }

    /// The typed weights of the model's blocks and its input/output.
    pub fn layers(&self) -> &Layers {
        &self.layers
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
        self.extra = self
            .main
            .fill(model, main, extra, &ExtraPlacement::new(), &mut report)?;
        if let Some(h) = &mut self.host {
            let backend = host.expect("host weights declared without a host backend");
            let none = ExtraPlacement::new();
            h.fill(model, backend, &none, &none, &mut report)?;
        }
        Ok(())
    }

    /// Fills the declared weights of a layer split (`engine::split`): each tensor in a buffer of
    /// the buffer type `place(name)` gives (one buffer per type), those it gives `None` on
    /// `main`; the host part, where declared (the token embedding's lookup copy, when the head
    /// tied to it lives on another device), on `host`. No extra buffer types.
    pub fn fill_split(
        &mut self,
        model: &GgufModel,
        main: &Backend,
        place: &dyn Fn(&str) -> Option<BufType>,
        host: Option<&Backend>,
        progress: &dyn Fn(u64, u64),
    ) -> Result<(), GgmlError> {
        let split: ExtraPlacement = self
            .main
            .index
            .names()
            .filter_map(|n| Some((n.to_string(), place(n)?)))
            .collect();
        let total = self.main.bytes + self.host.as_ref().map_or(0, |p| p.bytes);
        let mut done = 0;
        let mut report = |n: u64| {
            done += n;
            progress(done, total);
        };
        self.main
            .fill(model, main, &ExtraPlacement::new(), &split, &mut report)?;
        if let Some(h) = &mut self.host {
            let backend = host.expect("a host part declared without its backend");
            let none = ExtraPlacement::new();
            h.fill(model, backend, &none, &none, &mut report)?;
        }
        Ok(())
    }

    /// Bytes of the weights in buffers of type `buft` (a device's, in a layer split), the host
    /// part's included.
    pub fn bytes_in(&self, buft: BufType) -> u64 {
        [Some(&self.main), self.host.as_ref()]
            .into_iter()
            .flatten()
            .flat_map(|p| p.index.names().filter_map(|n| p.get(n)))
            .filter(|t| t.buffer_type() == Some(buft))
            .map(|t| t.n_bytes() as u64)
            .sum()
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
}

/// Resolves names into [`W`] handles while [`Weights::declare`] builds the typed [`Layers`]:
/// what the file holds, what the architecture's table lists for a block, and what stays out of
/// the weights (the routed experts, offloading).
pub struct Resolver<'r> {
    main: &'r Part,
    host: Option<&'r Part>,
    /// What the handles made so far stand for (`Weights::slots`).
    slots: Vec<NonNull<ggml_sys::ggml_tensor>>,
    /// The model's hyper-parameters (`hp.arch` is the table).
    pub hp: &'r Hparams,
    keep: &'r dyn Fn(&str) -> bool,
}

impl Resolver<'_> {
    /// A handle for `t`, a tensor of the parts being declared.
    fn handle(&mut self, t: Tensor<'_>) -> W {
        self.slots
            .push(NonNull::new(t.raw()).expect("a declared tensor"));
        W(u32::try_from(self.slots.len() - 1).expect("fewer than 2^32 weights"))
    }

    /// The tensor `name`, if declared (the main backend's copy where there are two, as
    /// [`Weights::get`]).
    pub fn global(&mut self, name: &str) -> Option<W> {
        let (main, host) = (self.main, self.host);
        let t = main.get(name).or_else(|| host?.get(name))?;
        Some(self.handle(t))
    }

    /// The token embedding for the lookup by id: the host copy where there is one (as
    /// [`Weights::embedding`]).
    pub fn embedding(&mut self) -> Option<W> {
        let (main, host) = (self.main, self.host);
        let t = host
            .and_then(|p| p.get(TOKEN_EMBD))
            .or_else(|| main.get(TOKEN_EMBD))?;
        Some(self.handle(t))
    }

    /// The global tensor `name`, which `what` needs.
    pub fn global_req(&mut self, name: &str, what: &str) -> Result<W, WeightsError> {
        self.global(name).ok_or_else(|| WeightsError::Missing {
            name: name.to_string(),
            what: what.to_string(),
        })
    }

    /// `blk.{il}.{suffix}`, which `what` of block `il` uses where the file has it: its absence
    /// is an error naming it only where the architecture's table requires it in that block.
    pub fn opt(&mut self, il: usize, suffix: &str, what: &str) -> Result<Option<W>, WeightsError> {
        let name = format!("blk.{il}.{suffix}");
        match self.global(&name) {
            Some(h) => Ok(Some(h)),
            None if self.required(il, suffix) => Err(WeightsError::Missing {
                name,
                what: format!("block {il}'s {what}"),
            }),
            None => Ok(None),
        }
    }

    /// `blk.{il}.{suffix}`, which `what` of block `il` needs: its absence is an error naming it.
    pub fn req(&mut self, il: usize, suffix: &str, what: &str) -> Result<W, WeightsError> {
        self.global(&format!("blk.{il}.{suffix}"))
            .ok_or_else(|| WeightsError::Missing {
                name: format!("blk.{il}.{suffix}"),
                what: format!("block {il}'s {what}"),
            })
    }

    /// Whether the architecture's table requires `blk.{}.{suffix}` in block `il`.
    fn required(&self, il: usize, suffix: &str) -> bool {
        let name = format!("blk.{{}}.{suffix}");
        self.hp.arch.tensor_specs().any(|t| {
            t.name == name
                && t.in_layer(self.hp, il)
                && self.hp.arch.required_in(t, self.hp, Some(il))
        })
    }

    /// Whether the architecture's table has `blk.{}.{suffix}` in block `il` (what decides the
    /// kind of each part of a block: MLA or GQA attention, dense or routed FFN, ...).
    pub fn listed(&self, il: usize, suffix: &str) -> bool {
        let name = format!("blk.{{}}.{suffix}");
        self.hp
            .arch
            .tensor_specs()
            .any(|t| t.name == name && t.in_layer(self.hp, il))
    }

    /// Whether `blk.{il}.{suffix}` is one of the weights (false for what another store holds:
    /// the routed experts when offloading).
    pub fn kept(&self, il: usize, suffix: &str) -> bool {
        (self.keep)(&format!("blk.{il}.{suffix}"))
    }
}
