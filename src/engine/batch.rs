//! Multi-sequence forward passes over one shared KV cache (continuous batching, as llama.cpp's
//! `llama_batch` with several `seq_id`s). The cache is cut into pages of [`KV_PAGE`] rows; each
//! sequence owns a list of pages (position p lives in row `pages[p / KV_PAGE] * KV_PAGE +
//! p % KV_PAGE`), handed out lowest first by a [`PagePool`], and one forward pass carries tokens
//! of several sequences. Each token gets its own position, its own cache row (the `inp_kv_idxs`
//! input) and its own mask row over the shared cache (it sees the rows of its own sequence up to
//! its position, nothing else), so sequences never see each other.
//!
//! Why pages: attention runs over cache rows `0..n_kv`, where `n_kv` is the highest row any
//! token of the pass can see (padded). With one fixed range of `ctx` rows per sequence, the
//! sequence in range s made every pass attend over `s × ctx` rows, mostly masked, so the cost
//! of concurrent decode grew with the context length chosen; with pages taken lowest first,
//! `n_kv` grows with the tokens actually held (as llama.cpp's unified cache).
//! Logits are computed only for the rows asked for (`out_ids`, llama.cpp's `inp_out_ids`).
//!
//! Invariants: every row a chunk touches is checked against the cache size and its page list
//! before a graph is built (`ContextFull`, `KvPages`), token ids against the vocabulary
//! (`BadToken`); chunks longer than a micro-batch in total are split over several passes, in
//! order. That two sequences' pages are disjoint is the caller's business (the server's
//! scheduler takes them from one [`PagePool`]).
//! Reference: llama.cpp `llama_kv_cache::set_input_kq_mask` (per-token mask rows over a unified
//! cache) and `llama_batch` / `inp_out_ids`.
use super::step::{Mask, Outputs, StepPlan};
use super::{Engine, EngineError};
use crate::graph::step::{ArchStep, Span};
use crate::graph::BatchInputs;

/// Cache rows per page: the unit in which sequences get cache rows, and the padding of `n_kv`
/// (a multiple of the graph's own KV padding, so a full page never adds a pad).
pub const KV_PAGE: usize = 256;

/// One sequence's tokens in a batched forward pass.
#[derive(Debug, Clone, Copy)]
pub struct SeqChunk<'t> {
    /// The sequence's cache pages, in position order: they must cover `pos + tokens.len()`
    /// positions.
    pub pages: &'t [u32],
    /// Position of `tokens[0]` (= how many of the sequence's tokens are already cached).
    pub pos: usize,
    pub tokens: &'t [u32],
    /// Whether the logits of the chunk's last token are wanted.
    pub logits: bool,
    /// The sequence's slot (`0..EngineOptions::n_seq`): where state kept per sequence besides
    /// its KV rows lives (DeepSeek-V4's compressor rings).
    pub slot: usize,
}

impl SeqChunk<'_> {
    /// The cache row of position `pos` of this sequence (its page must exist).
    pub fn row(&self, pos: usize) -> usize {
        self.pages[pos / KV_PAGE] as usize * KV_PAGE + pos % KV_PAGE
    }

    /// The lowest cache row this chunk's tokens can see (the first row of the lowest page
    /// holding its positions `0..pos + len`; a sliding window sees no lower).
    fn low_row(&self) -> usize {
        let n = (self.pos + self.tokens.len()).max(1);
        self.pages[..n.div_ceil(KV_PAGE).min(self.pages.len())]
            .iter()
            .min()
            .map_or(0, |&p| p as usize * KV_PAGE)
    }

    /// One past the highest cache row this chunk's tokens can see (its rows of positions
    /// `0..pos + len`).
    fn top_row(&self) -> usize {
        let n = self.pos + self.tokens.len();
        if n == 0 {
            return 0;
        }
        let last = (n - 1) / KV_PAGE;
        self.pages[..=last]
            .iter()
            .enumerate()
            .map(|(k, &p)| {
                p as usize * KV_PAGE
                    + if k == last {
                        (n - 1) % KV_PAGE + 1
                    } else {
                        KV_PAGE
                    }
            })
            .max()
            .unwrap_or(0)
    }
}

/// The free pages of a cache. Shared (the default): a sequence grows by the lowest free page
/// above its last one, else the lowest free page, so the rows in use stay at the bottom of the
/// cache and attention spans little more than the tokens held. Per slot ([`PagePool::per_slot`]):
/// slot i takes pages only from its own region, lowest first, so its rows always ascend.
///
/// Why ascending matters: attention sums over cache rows in row order. Rows of other sequences
/// are masked and add exact zeros, so a sequence whose pages ascend sums its own rows in
/// position order, exactly as alone; out of order, the sums round differently (on the tiny
/// models, logits move by ~0.1). Batch-invariant serving needs that exactness: it uses per-slot
/// pages.
#[derive(Debug, Clone)]
pub struct PagePool {
    free: std::collections::BTreeSet<u32>,
    /// Per-slot mode: pages per slot.
    region: Option<u32>,
}

impl PagePool {
    /// A shared pool of the whole pages of a cache of `rows` rows.
    pub fn new(rows: usize) -> Self {
        Self {
            free: (0..(rows / KV_PAGE) as u32).collect(),
            region: None,
        }
    }

    /// A pool of `rows` rows split into `n_slots` equal regions, one per slot.
    pub fn per_slot(rows: usize, n_slots: usize) -> Self {
        let per = (rows / KV_PAGE / n_slots.max(1)) as u32;
        Self {
            free: (0..per * n_slots as u32).collect(),
            region: Some(per),
        }
    }

    /// Grows the pages of `slot` to cover `n` positions; false (and `pages` unchanged) when the
    /// pool (or the slot's region) has too few pages left.
    pub fn cover(&mut self, slot: usize, pages: &mut Vec<u32>, n: usize) -> bool {
        let need = n.div_ceil(KV_PAGE).saturating_sub(pages.len());
        let (lo, hi) = match self.region {
            Some(per) => (per * slot as u32, per * (slot as u32 + 1)),
            None => (0, u32::MAX),
        };
        let before = pages.len();
        for _ in 0..need {
            let above = pages.last().map_or(lo, |&p| p + 1).max(lo);
            let pick = self.free.range(above..hi).next().copied().or_else(|| {
                // Shared mode only: below the last page when nothing above is free.
                self.region
                    .is_none()
                    .then(|| self.free.first().copied())
                    .flatten()
            });
            match pick {
                Some(p) => {
                    self.free.remove(&p);
                    pages.push(p);
                }
                None => {
                    self.free.extend(pages.drain(before..));
                    return false;
                }
            }
        }
        true
    }

    /// Gives `pages` back.
    pub fn release(&mut self, pages: &mut Vec<u32>) {
        self.free.extend(pages.drain(..));
    }

    pub fn n_free(&self) -> usize {
        self.free.len()
    }
}

/// Cache rows for `n_seq` sequences of `ctx` positions each: whole pages per sequence, so a
/// [`PagePool`] over them can always cover every sequence to its full context.
pub fn rows_for(n_seq: usize, ctx: usize) -> usize {
    n_seq * ctx.div_ceil(KV_PAGE) * KV_PAGE
}

/// What a model must offer the server's scheduler: batched forward passes over sequences in
/// disjoint cache ranges. [`Engine`] is the real one; tests use fakes.
pub trait BatchModel {
    /// Cache rows in all (every `kv_base + pos + len` must stay within).
    fn kv_rows(&self) -> usize;
    fn n_vocab(&self) -> usize;
    /// Runs `chunks` and returns, in order, the logits of each chunk with `logits: true`.
    fn forward_batch(&mut self, chunks: &[SeqChunk<'_>]) -> Result<Vec<Vec<f32>>, EngineError>;
    /// Runs `chunks` (their `logits` flags ignored) and returns the final normed hidden state
    /// (what embeddings pool) of every token, chunk by chunk, in order.
    fn forward_batch_embd(
        &mut self,
        _chunks: &[SeqChunk<'_>],
    ) -> Result<Vec<Vec<f32>>, EngineError> {
        Err(EngineError::Model {
            path: String::new(),
            msg: "this model gives no embeddings".into(),
        })
    }
    /// The expert cache's figures, where the model offloads experts.
    fn experts_snapshot(&self) -> Option<super::snapshot::ExpertsSnapshot> {
        None
    }
    /// How a sequence's state is laid out when it is nothing but its cache rows (one row per
    /// position in each of the cache's per-position tensors): then a sequence is cut to its
    /// first `n` positions by forgetting the rows above (a prompt cache reuses a prefix so), and
    /// its rows can be copied out and back ([`Self::read_seq`], [`Self::write_seq`]). Err, with
    /// the reason, for a model that keeps other per-sequence state (DeepSeek-V4's compressors).
    fn seq_layout(&self) -> Result<SeqLayout, String> {
        Err("this model cannot cut or copy a sequence's cache".into())
    }
    /// The state of positions `0..n` of the sequence in `pages` ([`SeqLayout::row_bytes`] per
    /// position, in the layout's order).
    fn read_seq(&self, _pages: &[u32], _n: usize) -> Result<Vec<u8>, EngineError> {
        Err(no_seq_copy())
    }
    /// Writes `data` (as [`Self::read_seq`] gave it) as positions `0..n` of the sequence in
    /// `pages`.
    fn write_seq(&mut self, _pages: &[u32], _n: usize, _data: &[u8]) -> Result<(), EngineError> {
        Err(no_seq_copy())
    }
}

fn no_seq_copy() -> EngineError {
    EngineError::Model {
        path: "the KV cache".into(),
        msg: "this model cannot copy a sequence's cache".into(),
    }
}

/// The layout of a sequence's state (see [`BatchModel::seq_layout`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeqLayout {
    /// Bytes of one position's state over all per-position tensors.
    pub row_bytes: usize,
    /// The tensors, their types and row sizes, in order: two caches with the same description
    /// hold the same state the same way.
    pub desc: String,
}

/// The cache rows of positions `0..n` in `pages`, as (first row, rows) runs in position order;
/// Err when the pages do not cover `n` positions or a row is past `rows`.
fn page_runs(pages: &[u32], n: usize, rows: usize) -> Result<Vec<(usize, usize)>, EngineError> {
    let have = pages.len() * KV_PAGE;
    if n > have {
        return Err(EngineError::KvPages { need: n, have });
    }
    let mut runs = Vec::new();
    for (k, &p) in pages.iter().enumerate().take(n.div_ceil(KV_PAGE)) {
        let first = p as usize * KV_PAGE;
        let count = (n - k * KV_PAGE).min(KV_PAGE);
        if first + count > rows {
            return Err(EngineError::ContextFull {
                n_ctx: rows,
                need: first + count,
            });
        }
        runs.push((first, count));
    }
    Ok(runs)
}

/// A token of a batch: which chunk, its position, and the token.
#[derive(Clone, Copy)]
pub(super) struct Tok {
    pub(super) chunk: usize,
    pub(super) pos: usize,
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

    fn experts_snapshot(&self) -> Option<super::snapshot::ExpertsSnapshot> {
        Engine::experts_snapshot(self)
    }

    fn seq_layout(&self) -> Result<SeqLayout, String> {
        let t = self.seq_tensors()?;
        Ok(SeqLayout {
            row_bytes: t.iter().map(|t| t.row_bytes).sum(),
            desc: t
                .iter()
                .map(|t| format!("{} {} {}", t.name, t.ty.name(), t.row_bytes))
                .collect::<Vec<_>>()
                .join(", "),
        })
    }

    fn read_seq(&self, pages: &[u32], n: usize) -> Result<Vec<u8>, EngineError> {
        let (tensors, runs, total) = self.seq_rows(pages, n)?;
        let mut out = vec![0u8; total];
        let mut at = 0;
        for t in &tensors {
            let tensor = self.kv.named(&t.name).ok_or_else(|| no_tensor(&t.name))?;
            for &(first, count) in &runs {
                let len = count * t.row_bytes;
                tensor.read_bytes_at(first * t.row_bytes, &mut out[at..at + len])?;
                at += len;
            }
        }
        Ok(out)
    }

    fn write_seq(&mut self, pages: &[u32], n: usize, data: &[u8]) -> Result<(), EngineError> {
        let (tensors, runs, total) = self.seq_rows(pages, n)?;
        if data.len() != total {
            return Err(EngineError::Model {
                path: "the KV cache".into(),
                msg: format!(
                    "{} bytes of sequence state for {n} positions, {total} expected",
                    data.len()
                ),
            });
        }
        let mut at = 0;
        for t in &tensors {
            let tensor = self.kv.named(&t.name).ok_or_else(|| no_tensor(&t.name))?;
            for &(first, count) in &runs {
                let len = count * t.row_bytes;
                tensor.write_bytes_at(first * t.row_bytes, &data[at..at + len])?;
                at += len;
            }
        }
        Ok(())
    }

    fn forward_batch(&mut self, chunks: &[SeqChunk<'_>]) -> Result<Vec<Vec<f32>>, EngineError> {
        self.forward_chunks(chunks, false)
    }

    fn forward_batch_embd(
        &mut self,
        chunks: &[SeqChunk<'_>],
    ) -> Result<Vec<Vec<f32>>, EngineError> {
        self.forward_chunks(chunks, true)
    }
}

fn no_tensor(name: &str) -> EngineError {
    EngineError::Model {
        path: "the KV cache".into(),
        msg: format!("the KV cache has no tensor {name}"),
    }
}

impl Engine {
    /// The cache tensors that hold a sequence's state, one row per position; Err (why) when the
    /// model keeps per-sequence state besides (DeepSeek-V4: its compressors pool positions
    /// into per-slot rings and compressed rows, which no prefix of rows can be cut back to).
    /// What `read_seq` / `write_seq` move for `n` positions in `pages`: the per-position
    /// tensors, the runs of consecutive rows (first, count), and the total bytes.
    #[allow(clippy::type_complexity)]
    fn seq_rows(
        &self,
        pages: &[u32],
        n: usize,
    ) -> Result<
        (
            Vec<crate::graph::kv::PositionTensor>,
            Vec<(usize, usize)>,
            usize,
        ),
        EngineError,
    > {
        let tensors = self.seq_tensors().map_err(|msg| EngineError::Model {
            path: "the KV cache".into(),
            msg,
        })?;
        let runs = page_runs(pages, n, self.kv.n_ctx)?;
        let total = tensors.iter().map(|t| t.row_bytes * n).sum();
        Ok((tensors, runs, total))
    }

    fn seq_tensors(&self) -> Result<Vec<crate::graph::kv::PositionTensor>, String> {
        if let Some(s) = crate::arch::seq_state(&self.hp) {
            return Err(format!(
                "this model ({}) keeps {} per sequence besides its KV rows: its cache cannot \
                 be cut to a prefix, saved or restored",
                self.hp.arch.name, s.what
            ));
        }
        self.kv.position_tensors()
    }

    /// [`BatchModel::forward_batch`], or with `embd` every token's final normed hidden state.
    fn forward_chunks(
        &mut self,
        chunks: &[SeqChunk<'_>],
        embd: bool,
    ) -> Result<Vec<Vec<f32>>, EngineError> {
        // The slot names per-sequence state only an architecture that keeps some has.
        let per_seq_state = crate::arch::seq_state(&self.hp).is_some();
        for c in chunks {
            if per_seq_state && c.slot >= self.opts.n_seq.max(1) {
                return Err(EngineError::Model {
                    path: String::new(),
                    msg: format!(
                        "sequence slot {} of a batch, but the engine was loaded for {} \
                         sequences (EngineOptions::n_seq)",
                        c.slot,
                        self.opts.n_seq.max(1)
                    ),
                });
            }
        }
        for c in chunks {
            let need = c.pos + c.tokens.len();
            if need > c.pages.len() * KV_PAGE {
                return Err(EngineError::KvPages {
                    need,
                    have: c.pages.len() * KV_PAGE,
                });
            }
            let top = c.top_row();
            if top > self.opts.n_ctx {
                return Err(EngineError::ContextFull {
                    n_ctx: self.opts.n_ctx,
                    need: top,
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
                    out: embd || (c.logits && t + 1 == n),
                })
            })
            .collect();
        let mut out = Vec::new();
        for ub in toks.chunks(self.opts.n_ubatch.max(1)) {
            out.extend(self.forward_multi(chunks, ub, embd)?);
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
    /// affected (they are not batch-invariant either). Returns whether a CPU backend took it:
    /// not when weights were repacked for the CPU (`EngineOptions::repack`), whose kernels take
    /// a batch's rows four at a time and the rest one by one (measured: 0.09 apart on a tiny
    /// q4_k_m model); load with `repack: false` for invariance.
    pub fn set_batch_invariant(&mut self, on: bool) -> bool {
        if on && self.weights.extra().0 > 0 {
            return false;
        }
        let mut any = false;
        for b in &self._backends {
            any |= b.set_cpu_reference_kernels(on);
        }
        any
    }

    /// Whether attention may start above cache row 0 (`BatchInputs::kv_lo`): where every cache
    /// view of the graph is the attention's own (`kv_view`). Not for DeepSeek-V3.2's indexer or
    /// DeepSeek-V4's compressed caches, which read their caches from row 0, nor through a tensor
    /// split's meta backend.
    fn kv_lo_ok(&self) -> bool {
        self.hp.indexer.top_k == 0
            && crate::arch::seq_state(&self.hp).is_none()
            && self.tensor_split_devices() <= 1
    }

    /// One micro-batch of tokens from several sequences: the logits (or, with `embd`, the
    /// final normed hidden states) of its tokens marked `out`.
    fn forward_multi(
        &mut self,
        chunks: &[SeqChunk<'_>],
        toks: &[Tok],
        embd: bool,
    ) -> Result<Vec<Vec<f32>>, EngineError> {
        let n = toks.len();
        let row = |t: &Tok| chunks[t.chunk].row(t.pos);
        // The highest row a token of this micro-batch sees: its own sequence's rows up to it.
        // A chunk's tokens here are consecutive positions, so its last one sees the most.
        let mut last = vec![None; chunks.len()];
        for t in toks {
            last[t.chunk] = Some(t.pos);
        }
        // The chunks of this micro-batch, each cut at its last token here.
        let here: Vec<SeqChunk<'_>> = last
            .iter()
            .zip(chunks)
            .filter_map(|(p, c)| {
                p.map(|p| SeqChunk {
                    tokens: &c.tokens[..p + 1 - c.pos],
                    ..*c
                })
            })
            .collect();
        let top = here.iter().map(SeqChunk::top_row).max().unwrap_or(0);
        // Attention starts at the lowest row any of them sees: rows below would all be masked
        // yet cost as much as seen ones (a lone request above idle slots' kept prompts attended
        // over them: 25.1 against 32.4 t/s at depth 800 above 2048 such rows, OLMoE on 2 CPU
        // threads). Pages are whole multiples of the graph's KV padding, so `lo` is one too.
        let lo = if self.kv_lo_ok() {
            here.iter().map(SeqChunk::low_row).min().unwrap_or(0)
        } else {
            0
        };
        let n_kv = BatchInputs::padded_n_kv(top - lo, 0, self.kv.n_ctx - lo);
        let outs: Vec<i32> = (0..n as i32).filter(|&i| toks[i as usize].out).collect();
        let arch = if crate::arch::seq_state(&self.hp).is_some() {
            // Each chunk's tokens are one run of the micro-batch (`forward_batch` lays them out
            // so).
            let mut spans: Vec<Span> = Vec::new();
            for (i, t) in toks.iter().enumerate() {
                match spans.last_mut() {
                    Some(s) if toks[s.tok].chunk == t.chunk => s.n += 1,
                    _ => spans.push(Span {
                        tok: i,
                        pos: t.pos,
                        n: 1,
                        ring: chunks[t.chunk].slot,
                        pages: Some(chunks[t.chunk].pages.to_vec()),
                    }),
                }
            }
            self.arch_step(&spans, n)
        } else {
            ArchStep::default()
        };
        let plan = StepPlan {
            ids: toks.iter().map(|t| t.id as i32).collect(),
            pos: toks.iter().map(|t| t.pos as i32).collect(),
            rows: toks.iter().map(|t| row(t) as i64).collect(),
            n_kv,
            kv_lo: lo,
            mask: Mask::Seqs { chunks, toks },
            out: Outputs::of_rows(outs, n),
            embd,
            arch,
        };
        self.run_step(&plan)
    }
}

/// Fills `row` (one token's f16 mask over cache rows `lo..lo + row.len()`, all -inf on entry)
/// for the token at position `pos` of sequence `c`: 0 at the rows of its positions `j <= pos`
/// with `pos - j < window`; other sequences, later positions and padding stay -inf. Page-wise
/// slice fills: a 2048-token micro-batch at depth 8192 has 25M mask entries. Every row the
/// token sees must lie at or above `lo` (`forward_multi`'s [`SeqChunk::low_row`]).
pub(super) fn mask_row(row: &mut [u16], lo: usize, c: &SeqChunk<'_>, pos: usize, window: usize) {
    let zero = half::f16::ZERO.to_bits();
    let mut j = (pos + 1).saturating_sub(window);
    while j <= pos {
        let end = (j / KV_PAGE + 1) * KV_PAGE; // first position of the next page
        let last = pos.min(end - 1);
        let r = c.row(j) - lo;
        row[r..r + (last - j + 1)].fill(zero);
        j = last + 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pool_hands_out_lowest_pages_and_takes_them_back() {
        let mut pool = PagePool::new(4 * KV_PAGE + 7);
        assert_eq!(pool.n_free(), 4, "only whole pages");
        let (mut a, mut b) = (Vec::new(), Vec::new());
        assert!(pool.cover(0, &mut a, 1));
        assert!(pool.cover(1, &mut b, KV_PAGE + 1));
        assert_eq!((a.as_slice(), b.as_slice()), (&[0][..], &[1, 2][..]));
        assert!(
            pool.cover(0, &mut a, KV_PAGE),
            "already covered: takes nothing"
        );
        assert_eq!(a, [0]);
        assert!(!pool.cover(0, &mut a, 3 * KV_PAGE), "needs 2 more, 1 left");
        assert_eq!(
            (a.as_slice(), pool.n_free()),
            (&[0][..], 1),
            "unchanged after a refusal"
        );
        pool.release(&mut b);
        assert!(b.is_empty());
        assert!(pool.cover(0, &mut a, 2 * KV_PAGE + 1));
        assert_eq!(a, [0, 1, 2], "the lowest free pages again");
    }

    #[test]
    fn pool_prefers_pages_above_the_last_and_regions_stay_apart() {
        let mut pool = PagePool::new(4 * KV_PAGE);
        let (mut a, mut b, mut c) = (Vec::new(), Vec::new(), Vec::new());
        assert!(pool.cover(0, &mut a, 1)); // [0]
        assert!(pool.cover(1, &mut b, 1)); // [1]
        assert!(pool.cover(2, &mut c, 1)); // [2]
        pool.release(&mut a); // free: 0, 3
        assert!(pool.cover(1, &mut b, KV_PAGE + 1));
        assert_eq!(b, [1, 3], "above its last page, not the lower free 0");
        assert!(pool.cover(2, &mut c, KV_PAGE + 1));
        assert_eq!(c, [2, 0], "nothing free above: the lowest free");
        // Per slot: 2 slots of 2 pages; slot 1 never gets slot 0's pages.
        let mut pool = PagePool::per_slot(4 * KV_PAGE + 300, 2);
        assert_eq!(pool.n_free(), 4);
        let (mut a, mut b) = (Vec::new(), Vec::new());
        assert!(pool.cover(1, &mut b, 2 * KV_PAGE));
        assert_eq!(b, [2, 3]);
        assert!(
            !pool.cover(1, &mut b, 2 * KV_PAGE + 1),
            "its region is full"
        );
        assert_eq!((b.len(), pool.n_free()), (2, 2));
        assert!(pool.cover(0, &mut a, 2 * KV_PAGE));
        assert_eq!(a, [0, 1]);
    }

    #[test]
    fn rows_and_top_row_follow_the_pages() {
        let pages = [3u32, 1];
        let c = SeqChunk {
            pages: &pages,
            pos: KV_PAGE - 1,
            tokens: &[7, 8],
            logits: true,
            slot: 0,
        };
        assert_eq!(c.row(0), 3 * KV_PAGE);
        assert_eq!(c.row(KV_PAGE - 1), 4 * KV_PAGE - 1);
        assert_eq!(c.row(KV_PAGE), KV_PAGE);
        // Positions 0..KV_PAGE + 1: all of page 3, the first row of page 1.
        assert_eq!(c.top_row(), 4 * KV_PAGE);
        let low = [0u32, 5];
        assert_eq!(SeqChunk { pages: &low, ..c }.top_row(), 5 * KV_PAGE + 1);
        assert_eq!(rows_for(3, KV_PAGE + 1), 6 * KV_PAGE);
    }

    #[test]
    fn mask_row_sees_own_positions_through_pages() {
        let pages = [1u32, 0];
        let c = SeqChunk {
            pages: &pages,
            pos: 0,
            tokens: &[],
            logits: false,
            slot: 0,
        };
        let vis = |pos: usize, window: usize| {
            let mut m = vec![half::f16::NEG_INFINITY.to_bits(); 2 * KV_PAGE];
            mask_row(&mut m, 0, &c, pos, window);
            m.iter()
                .enumerate()
                .filter(|(_, &b)| b == half::f16::ZERO.to_bits())
                .map(|(r, _)| r)
                .collect::<Vec<_>>()
        };
        assert_eq!(vis(1, usize::MAX), [KV_PAGE, KV_PAGE + 1]);
        // Position KV_PAGE + 1 with a window of 3: positions KV_PAGE - 1 (row 2*KV_PAGE - 1),
        // KV_PAGE (row 0) and KV_PAGE + 1 (row 1).
        assert_eq!(vis(KV_PAGE + 1, 3), [0, 1, 2 * KV_PAGE - 1]);
    }
}
