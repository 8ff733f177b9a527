//! Multi-sequence forward passes over one shared KV cache (continuous batching, as llama.cpp's
//! `llama_batch` with several `seq_id`s): each sequence owns a contiguous range of cache rows
//! starting at its `kv_base` (position p of the sequence lives in row `kv_base + p`), and one
//! forward pass carries tokens of several sequences. Each token gets its own position, its own
//! cache row (the `inp_kv_idxs` input) and its own mask row over the shared cache (it sees the
//! rows of its own sequence up to its position, nothing else), so sequences never see each other.
//! Logits are computed only for the rows asked for (`out_ids`, llama.cpp's `inp_out_ids`).
//!
//! Invariants: every row a chunk touches is checked against the cache size before a graph is
//! built (`ContextFull`), token ids against the vocabulary (`BadToken`); chunks longer than a
//! micro-batch in total are split over several passes, in order. Where ranges of two chunks
//! overlap is the caller's business (the server's scheduler gives each slot its own range).
//! Reference: llama.cpp `llama_kv_cache::set_input_kq_mask` (per-token mask rows over a unified
//! cache) and `llama_batch` / `inp_out_ids`.
use super::run_graph;
use super::{Engine, EngineError};
use crate::experts::step::GraphNodes;
use crate::graph::BatchInputs;

/// One sequence's tokens in a batched forward pass.
#[derive(Debug, Clone, Copy)]
pub struct SeqChunk<'t> {
    /// First cache row of the sequence (the row of its position 0).
    pub kv_base: usize,
    /// Position of `tokens[0]` (= how many of the sequence's tokens are already cached).
    pub pos: usize,
    pub tokens: &'t [u32],
    /// Whether the logits of the chunk's last token are wanted.
    pub logits: bool,
}

/// The shape a cached multi-sequence graph was built for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GraphKey {
    n_tokens: usize,
    n_kv: usize,
    n_out: usize,
}

/// What a model must offer the server's scheduler: batched forward passes over sequences in
/// disjoint cache ranges. [`Engine`] is the real one; tests use fakes.
pub trait BatchModel {
    /// Cache rows in all (every `kv_base + pos + len` must stay within).
    fn kv_rows(&self) -> usize;
    fn n_vocab(&self) -> usize;
    /// Runs `chunks` and returns, in order, the logits of each chunk with `logits: true`.
    fn forward_batch(&mut self, chunks: &[SeqChunk<'_>]) -> Result<Vec<Vec<f32>>, EngineError>;
    /// Expert-offload counters, where the model offloads experts.
    fn offload_stats(&self) -> Option<crate::experts::Stats> {
        None
    }
}

/// A token of a batch: which chunk, its position, and the token.
#[derive(Clone, Copy)]
struct Tok {
    chunk: usize,
    pos: usize,
    id: u32,
    /// The chunk's last token, whose logits were asked for.
    out: bool,
}

impl BatchModel for Engine {
    fn kv_rows(&self) -> usize {
        self.opts.n_ctx
    }

    fn n_vocab(&self) -> usize {
        self.hp.n_vocab as usize
    }

    fn offload_stats(&self) -> Option<crate::experts::Stats> {
        Engine::offload_stats(self)
    }

    fn forward_batch(&mut self, chunks: &[SeqChunk<'_>]) -> Result<Vec<Vec<f32>>, EngineError> {
        for c in chunks {
            let need = c.kv_base + c.pos + c.tokens.len();
            if need > self.opts.n_ctx {
                return Err(EngineError::ContextFull {
                    n_ctx: self.opts.n_ctx,
                    need,
                });
            }
            if let Some(&id) = c.tokens.iter().find(|&&t| t as u64 >= self.hp.n_vocab) {
                return Err(EngineError::BadToken {
                    id,
                    n_vocab: self.hp.n_vocab,
                });
            }
        }
        let toks: Vec<Tok> = chunks
            .iter()
            .enumerate()
            .flat_map(|(i, c)| {
                let n = c.tokens.len();
                c.tokens.iter().enumerate().map(move |(t, &id)| Tok {
                    chunk: i,
                    pos: c.pos + t,
                    id,
                    out: c.logits && t + 1 == n,
                })
            })
            .collect();
        let mut out = Vec::new();
        for ub in toks.chunks(self.opts.n_ubatch.max(1)) {
            out.extend(self.forward_multi(chunks, ub)?);
        }
        Ok(out)
    }
}

impl Engine {
    /// Batch-invariant CPU kernels: with `on`, every token's logits are computed the same way
    /// whatever else shares its forward pass, so a request served beside others gives exactly
    /// the tokens it gives alone. By default ggml's CPU backend picks kernels by batch shape —
    /// llamafile sgemm from 2 columns, tiled flash attention from 64 query rows, KV-split flash
    /// attention for 1 row over 512+ cache rows — which changes the last bits of the logits and,
    /// now and then, a sampled token. Costs CPU prompt-processing speed; CUDA kernels are not
    /// affected (they are not batch-invariant either). Returns whether a CPU backend took it.
    pub fn set_batch_invariant(&mut self, on: bool) -> bool {
        let mut any = false;
        for b in &self._backends {
            any |= b.set_cpu_reference_kernels(on);
        }
        any
    }

    /// One micro-batch of tokens from several sequences.
    fn forward_multi(
        &mut self,
        chunks: &[SeqChunk<'_>],
        toks: &[Tok],
    ) -> Result<Vec<Vec<f32>>, EngineError> {
        let n = toks.len();
        let row = |t: &Tok| chunks[t.chunk].kv_base + t.pos;
        let top = toks.iter().map(|t| row(t) + 1).max().unwrap_or(0);
        let n_kv = BatchInputs::padded_n_kv(top, 0, self.opts.n_ctx);
        let outs: Vec<i32> = (0..n as i32).filter(|&i| toks[i as usize].out).collect();
        let key = GraphKey {
            n_tokens: n,
            n_kv,
            n_out: outs.len(),
        };
        // The single-sequence path shares the scheduler: if it ran since, our allocation is gone.
        let stale = self.graph.take().is_some();
        if self.batch_graph.as_ref().is_none_or(|(k, _, _)| *k != key) {
            self.batch_graph = None;
            let (g, nodes) = self.build_graph(n, 0, n_kv, outs.is_empty(), outs.len())?;
            self.sched.alloc(&g.graph())?;
            let nodes = GraphNodes::resolve(&nodes, &g);
            self.batch_graph = Some((key, g, nodes));
        } else if stale {
            let (_, g, _) = self.batch_graph.as_ref().expect("cached");
            self.sched.alloc(&g.graph())?;
        }
        let (_, g, nodes) = self.batch_graph.as_ref().expect("built above");
        let ids: Vec<i32> = toks.iter().map(|t| t.id as i32).collect();
        g.tensor("inp_tokens").write_i32(&ids)?;
        let pos: Vec<i32> = toks.iter().map(|t| t.pos as i32).collect();
        g.tensor("inp_pos").write_i32(&pos)?;
        let rows: Vec<i64> = toks.iter().map(|t| row(t) as i64).collect();
        g.tensor("inp_kv_idxs").write_i64(&rows)?;
        let window = self.hp.sliding_window as usize;
        let mask = |window: usize| {
            let mut m = Vec::with_capacity(n_kv * n * 2);
            for t in toks {
                mask_row(&mut m, chunks[t.chunk].kv_base, t.pos, n_kv, window);
            }
            m
        };
        g.tensor("attn_inp_kq_mask")
            .write_bytes(&mask(usize::MAX))?;
        if g.has("attn_inp_kq_mask_swa") {
            g.tensor("attn_inp_kq_mask_swa")
                .write_bytes(&mask(window))?;
        }
        if !outs.is_empty() {
            g.tensor("inp_out_ids").write_i32(&outs)?;
        }
        run_graph(&mut self.sched, self.offload.as_mut(), g, nodes, n)?;
        if outs.is_empty() {
            return Ok(Vec::new());
        }
        let flat = g.tensor("logits").read_f32()?;
        let n_vocab = self.hp.n_vocab as usize;
        Ok(flat.chunks_exact(n_vocab).map(<[f32]>::to_vec).collect())
    }
}

/// Appends the f16 mask row of the token at position `pos` of the sequence based at cache row
/// `base`: 0 for rows `base + j` with `j <= pos` and `pos - j < window`, -inf elsewhere (other
/// sequences, later positions, padding).
fn mask_row(m: &mut Vec<u8>, base: usize, pos: usize, n_kv: usize, window: usize) {
    let (zero, neg_inf) = (
        half::f16::ZERO.to_le_bytes(),
        half::f16::NEG_INFINITY.to_le_bytes(),
    );
    for r in 0..n_kv {
        let visible = r >= base && r - base <= pos && pos - (r - base) < window;
        m.extend_from_slice(if visible { &zero } else { &neg_inf });
    }
}
