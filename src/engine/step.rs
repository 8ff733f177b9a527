//! One forward pass, whoever asks for it: a single sequence (`Engine::forward*`: run, bench,
//! embeddings, the tests) is a batch of one, and the server's multi-sequence micro-batches
//! (`engine::batch`) are the general case. Both plan a [`StepPlan`] (tokens, positions, cache
//! rows, mask, which rows come out, the architecture's own plan) and hand it to
//! [`Engine::run_step`], which builds the step's graph or reuses the last one of the same shape
//! (one cache for both: [`GraphKey`]), writes its inputs, computes it (through the offload step
//! hook when routed experts are offloaded: `run_graph`) and reads its outputs.
//!
//! Invariant: the graph depends only on the [`GraphKey`]; everything else a step differs in is
//! an input written here, so consecutive decode steps of one shape replay one graph.
use super::batch::{mask_row, SeqChunk, Tok};
use super::{causal_mask_f16, out_name, run_graph, Engine, EngineError, MAX_SLOT_TOKENS};
use crate::experts::step::GraphNodes;
use crate::ggml::{OwnedGraph, Tensor};
use crate::graph::step::ArchStep;

/// Whether the scheduler left an allocated graph as built: no node reads a copy it made of a
/// tensor for another backend (named `<backend>#<name>#<copy>` by ggml).
fn no_copies(g: &OwnedGraph) -> bool {
    let graph = g.graph();
    (0..graph.n_nodes()).all(|i| graph.node(i).srcs().iter().all(|s| !s.name().contains('#')))
}

/// Which rows of a step's result come out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Outputs {
    /// Every token's row, in order.
    All,
    /// The last token's row only.
    Last,
    /// These tokens' rows (the graph's `inp_out_ids`).
    Rows(Vec<i32>),
    /// None: the step only fills the cache (its graph computes the last row, unread).
    Nothing,
}

impl Outputs {
    /// The rows `outs` of an `n`-token step, in the cheapest form the graph has for them: all
    /// of them or the last one need no row selection.
    pub(super) fn of_rows(outs: Vec<i32>, n: usize) -> Self {
        if outs.is_empty() {
            Outputs::Nothing
        } else if outs.len() == n && outs.iter().enumerate().all(|(i, &r)| r == i as i32) {
            Outputs::All
        } else if outs == [n as i32 - 1] {
            Outputs::Last
        } else {
            Outputs::Rows(outs)
        }
    }

    /// (last_only, n_out) as the graph builder takes them.
    fn graph_args(&self) -> (bool, usize) {
        match self {
            Outputs::All => (false, 0),
            Outputs::Last | Outputs::Nothing => (true, 0),
            Outputs::Rows(r) => (false, r.len()),
        }
    }
}

/// A step graph's shape: what decides whether the last graph can be reused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct GraphKey {
    n_tokens: usize,
    n_kv: usize,
    kv_lo: usize,
    /// (last_only, n_out), see [`Outputs::graph_args`].
    out: (bool, usize),
    embd: bool,
    /// What of the architecture's own plan shapes the graph ([`ArchStep::key`]).
    arch: Vec<(usize, usize)>,
    /// Offloaded experts in table form (`Offload::begin_form`).
    table: bool,
}

/// Of the graph shape in use, the forms whose graphs ran their warm-up (`GraphNodes::runs`), so
/// that a graph rebuilt when the duel switches form (`experts::offload::duel`) gates from its
/// first step again: ggml-cuda's memory pool has grown for it and does not shrink, and its CUDA
/// graphs are captured under the capture guard (`GraphNodes::gated_in_a_row`). Forgotten when a
/// graph of another shape is built: a graph that comes back after another shape ran (a decode
/// graph after a prompt) takes its warm-up steps as before.
#[derive(Default)]
pub(super) struct WarmKeys(Vec<GraphKey>);

impl WarmKeys {
    /// The graph of `old` (`warm`: it ran its warm-up) makes way for one of `new`.
    fn replaced(&mut self, old: GraphKey, warm: bool, new: &GraphKey) {
        let shape = |k: &GraphKey| GraphKey {
            table: false,
            ..k.clone()
        };
        if shape(&old) != shape(new) {
            self.0.clear();
        } else if warm && !self.0.contains(&old) {
            self.0.push(old);
        }
    }

    fn contains(&self, k: &GraphKey) -> bool {
        self.0.contains(k)
    }
}

/// Whose positions a step's tokens see.
pub(super) enum Mask<'a> {
    /// One sequence whose cache rows are its positions: token t (position `n_past + t`) sees
    /// rows `0..=n_past + t`.
    Causal { n_past: usize },
    /// Tokens of several sequences, each over its own pages (`engine::batch`).
    Seqs {
        chunks: &'a [SeqChunk<'a>],
        toks: &'a [Tok],
    },
}

impl Mask<'_> {
    /// f16 [n_kv, n] mask bits over cache rows `lo..lo + n_kv`: 0 where a token may attend,
    /// -inf elsewhere; `window` limits how far back (`usize::MAX`: no limit). A causal mask's
    /// sequence starts at row 0, so its `lo` is 0.
    fn build(&self, n: usize, lo: usize, n_kv: usize, window: usize) -> Vec<u16> {
        match self {
            Mask::Causal { n_past } => {
                debug_assert_eq!(lo, 0, "a single sequence's rows start at 0");
                causal_mask_f16(*n_past, n, n_kv, window)
            }
            Mask::Seqs { chunks, toks } => {
                let mut m = vec![half::f16::NEG_INFINITY.to_bits(); n_kv * n];
                for (t, row) in toks.iter().zip(m.chunks_exact_mut(n_kv)) {
                    mask_row(row, lo, &chunks[t.chunk], t.pos, window);
                }
                m
            }
        }
    }
}

/// Everything one forward pass computes over, as the caller planned it.
pub(super) struct StepPlan<'a> {
    /// Token ids, positions and cache rows, one per token.
    pub ids: Vec<i32>,
    pub pos: Vec<i32>,
    pub rows: Vec<i64>,
    /// Cache rows attention reads (padded: see `BatchInputs::padded_n_kv`), from row `kv_lo`.
    pub n_kv: usize,
    pub kv_lo: usize,
    pub mask: Mask<'a>,
    pub out: Outputs,
    /// The final normed hidden states instead of logits.
    pub embd: bool,
    /// The architecture's own plan (DeepSeek-V4's compressors; empty for most).
    pub arch: ArchStep,
}

impl Engine {
    /// Whether an `n`-token step's graph is built to run gated (`experts::offload::gated`): gated
    /// decode asked for, a slot-mode micro-batch of offloaded experts, one device (the CPU's
    /// backend last, or the CPU alone standing in for it). Such a graph takes its tokens'
    /// embedding rows as an input ([`Engine::embedding_rows`]), so no piece of it runs on the CPU.
    pub(super) fn gated_shape(&self, n: usize) -> bool {
        let slots = self.offload.as_ref().map(|o| o.mode(n)) == Some(crate::experts::Mode::Slots);
        self.offload.as_ref().is_some_and(|o| o.gating_wanted())
            && n <= MAX_SLOT_TOKENS
            && self.split.is_none()
            && slots
            && self.sched.backends().len() <= 2
    }

    /// The embedding rows of `ids`, f32 [n_embd, ids.len()], looked up and dequantised on the
    /// host from the token embedding (host memory when offloading; read back where it is not).
    fn embedding_rows(&self, ids: &[i32]) -> Result<Vec<f32>, EngineError> {
        let table = self.weights.embedding().ok_or_else(|| EngineError::Model {
            path: String::new(),
            msg: "no token embedding".into(),
        })?;
        let (ty, n_embd) = (table.ty(), self.hp.n_embd as usize);
        let n_vocab = table.ne()[1];
        let row = table.nb()[1];
        let mut raw = vec![0u8; ty.row_size(n_embd as u64).unwrap_or(0) as usize];
        let mut out = Vec::with_capacity(n_embd * ids.len());
        for &id in ids {
            if id < 0 || i64::from(id) >= n_vocab {
                return Err(EngineError::Model {
                    path: String::new(),
                    msg: format!("token id {id} outside the vocabulary (0..{n_vocab})"),
                });
            }
            table.read_bytes_at(id as usize * row, &mut raw)?;
            out.extend(crate::ggml::quant::dequantize(ty, &raw, n_embd)?);
        }
        Ok(out)
    }

    /// For a decode graph (a slot-mode micro-batch) of offloaded experts on one GPU: its inputs, each to be placed on the
    /// GPU (scheduler backend 0), so that the scheduler has nothing to copy into the graph and
    /// the graph can run gated (`experts::offload::gated`). `None` where it cannot.
    fn gated_inputs<'g>(&self, g: &'g OwnedGraph, n: usize) -> Option<Vec<(Tensor<'g>, usize)>> {
        if !self.gated_shape(n) {
            return None;
        }
        let graph = g.graph();
        let mut inputs: Vec<(Tensor<'g>, usize)> = Vec::new();
        for i in 0..graph.n_nodes() {
            for s in graph.node(i).srcs() {
                if s.is_input() && !inputs.iter().any(|(t, _)| t.id() == s.id()) {
                    inputs.push((s, 0));
                }
            }
        }
        Some(inputs)
    }

    /// Runs one planned forward pass: the rows [`StepPlan::out`] asks for (logits, or hidden
    /// states with `embd`).
    pub(super) fn run_step(&mut self, p: &StepPlan<'_>) -> Result<Vec<Vec<f32>>, EngineError> {
        let t0 = std::time::Instant::now();
        let n = p.ids.len();
        let table = self.offload.as_mut().is_some_and(|o| o.begin_form(n));
        let key = GraphKey {
            n_tokens: n,
            n_kv: p.n_kv,
            kv_lo: p.kv_lo,
            out: p.out.graph_args(),
            embd: p.embd,
            arch: p.arch.key(),
            table,
        };
        if self.graph.as_ref().is_none_or(|(k, _, _)| *k != key) {
            if let Some((k, _, nodes)) = self.graph.take() {
                self.warm_keys.replaced(k, nodes.runs.get() > 2, &key);
            }
            let (last_only, n_out) = key.out;
            let (g, nodes) =
                self.build_graph(n, p.n_kv, p.kv_lo, last_only, n_out, p.embd, &p.arch)?;
            let gated = self.gated_inputs(&g, n);
            match (&self.split, &gated) {
                (None, None) => self.sched.alloc(&g.graph())?,
                (None, Some(inputs)) => self.sched.alloc_assigned(&g.graph(), inputs)?,
                (Some(s), _) => {
                    let graph = g.graph();
                    self.sched.alloc_assigned(&graph, &s.plan.assign(&graph))?;
                }
            }
            let mut nodes = GraphNodes::resolve(&nodes, &g);
            if gated.is_some() {
                let (splits, copies) = (self.sched.n_splits(), !no_copies(&g));
                nodes.gateable = splits == 1 && !copies && nodes.shared_flag.is_none();
                if let Some(why) = &nodes.shared_flag {
                    tracing::error!("gated decode off for the {n}-token graph: {why}");
                } else if !nodes.gateable {
                    tracing::info!(
                        "gated decode off for the {n}-token graph: {splits} scheduler pieces{}",
                        if copies { ", inputs copied" } else { "" }
                    );
                }
            }
            if self.warm_keys.contains(&key) {
                nodes.runs.set(2);
            }
            self.graph = Some((key, g, nodes));
        }
        let (_, g, nodes) = self.graph.as_ref().expect("built above");
        // A graph that takes its embedding rows as an input (gated decode) may read no ids
        // (DeepSeek-V4's hash routing still does).
        let tokens = g.tensor("inp_tokens");
        if tokens.is_allocated() {
            tokens.write_i32(&p.ids)?;
        }
        if g.has("inp_embd") && g.tensor("inp_embd").is_input() {
            g.tensor("inp_embd")
                .write_f32(&self.embedding_rows(&p.ids)?)?;
        }
        g.tensor("inp_pos").write_i32(&p.pos)?;
        g.tensor("inp_kv_idxs").write_i64(&p.rows)?;
        // An architecture whose every block is windowed (deepseek4) reads no full mask.
        let full = g.tensor("attn_inp_kq_mask");
        if full.is_allocated() {
            full.write_bytes(bytemuck::cast_slice(&p.mask.build(
                n,
                p.kv_lo,
                p.n_kv,
                usize::MAX,
            )))?;
        }
        if g.has("attn_inp_kq_mask_swa") {
            let window = self.hp.swa.window as usize;
            g.tensor("attn_inp_kq_mask_swa")
                .write_bytes(bytemuck::cast_slice(
                    &p.mask.build(n, p.kv_lo, p.n_kv, window),
                ))?;
        }
        if let Outputs::Rows(r) = &p.out {
            g.tensor("inp_out_ids").write_i32(r)?;
        }
        p.arch.fill(|name| g.tensor(name))?;
        let t1 = std::time::Instant::now();
        run_graph(&mut self.sched, self.offload.as_mut(), g, nodes, n)?;
        let t2 = std::time::Instant::now();
        if p.out == Outputs::Nothing {
            return Ok(Vec::new());
        }
        let flat = g
            .tensor(out_name(p.embd))
            .read_f32_via(self.stage.as_ref())?;
        if let (Some(prof), 1) = (self.profile.as_mut(), n) {
            let t3 = std::time::Instant::now();
            if let Some(e) = prof.last_end {
                prof.steps += 1;
                prof.between += (t0 - e).as_secs_f64();
                prof.inputs += (t1 - t0).as_secs_f64();
                prof.compute += (t2 - t1).as_secs_f64();
                prof.logits += (t3 - t2).as_secs_f64();
            }
            prof.last_end = Some(t3);
        }
        let width = if p.embd {
            self.hp.n_embd as usize
        } else {
            self.hp.n_vocab as usize
        };
        if flat.len() == width {
            return Ok(vec![flat]); // one row (a decode step): no second copy
        }
        Ok(flat.chunks_exact(width).map(<[f32]>::to_vec).collect())
    }
}
