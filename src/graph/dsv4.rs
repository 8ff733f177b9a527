//! DeepSeek-V4's per-step compressor inputs: which positions' projections feed which compressed
//! rows, where those rows go in the cache, and which compressed rows each token may see
//! (libllama's `dsv4_build_comp_plan`, `llama-kv-cache-dsv4.cpp`, with the same semantics and
//! our own layout).
//!
//! A block of ratio `r` compresses every `r` consecutive positions into one row: row `j` covers
//! positions `j·r .. j·r + r − 1`, is made when position `j·r + r − 1` is processed, is RoPE'd at
//! position `j·r`, and is visible to a token at `pos` iff `j < (pos + 1) / r`. Ratio 4 overlaps:
//! row `j` mixes the first half of the projections of the previous window (`j·r − r ..`; zero
//! projections and −∞ scores before position 0) with the second half of its own window's.
//!
//! A step's source rows are `[state ring | this step's projections | a zero row]`: positions
//! before the step come from the ring (`pos mod state_rows`, the last `state_rows` positions of
//! the sequence), positions inside the step from its own rows. After the step the ring keeps the
//! step's last `state_rows` positions (`persist`).
//!
//! Shapes stay stable across decode: a step that completes no row writes one dummy row (to the
//! cache's scratch row, never visible); ratio 4 always makes `ceil(n / 4)` rows (as libllama),
//! and the attended width of compressed rows is padded to 256.
use super::step::{single, Span};
use crate::ggml::{Context, GgmlError, GgmlType, Tensor};

/// Rows of a block's compressed cache at ratio `r` for `n_ctx` positions of each of `n_seq`
/// sequences: one per `r` positions, plus a scratch row (the last) that steps completing no
/// compressed row write to (so decode keeps one graph), padded to 256 as libllama pads (the
/// attention reads a multiple of 256 rows, the rest masked).
pub fn comp_rows(n_ctx: usize, r: usize, n_seq: usize) -> usize {
    (n_seq * n_ctx.div_ceil(r) + 1).div_ceil(256) * 256
}

/// Compressor state rows per sequence at ratio `r`: the last `coff·r` positions' projections
/// (ratio 4 compresses two overlapping windows), a ring indexed by `pos mod (coff·r)`.
pub fn state_rows(r: usize) -> usize {
    if r == 4 {
        8
    } else {
        r
    }
}

/// The compression ratios a model's blocks use (of 4 and 128), each once.
pub fn ratios(compress_ratios: &[u64]) -> Vec<usize> {
    [4, 128]
        .into_iter()
        .filter(|r| compress_ratios.contains(&(*r as u64)))
        .collect()
}

/// Cache rows per page (`engine::batch::KV_PAGE`): a page of raw rows holds `256 / r` compressed
/// rows of ratio `r`.
const PAGE: usize = 256;

impl Span {
    /// The cache row of compressed row `j` (ratio `r`) of this sequence.
    fn comp_row(&self, j: usize, r: usize) -> usize {
        match &self.pages {
            None => j,
            Some(p) => p[j * r / PAGE] as usize * (PAGE / r) + (j * r % PAGE) / r,
        }
    }

    /// One past the highest compressed cache row among rows `0..v`.
    fn comp_top(&self, v: usize, r: usize) -> usize {
        let per = PAGE / r;
        (0..v.div_ceil(per))
            .map(|k| self.comp_row(((k + 1) * per).min(v) - 1, r) + 1)
            .max()
            .unwrap_or(0)
    }
}

/// One step's plans of every ratio the model uses: (ratio, plan, attended compressed rows),
/// for the step's `spans` (`n` tokens in all) with `rings` compressor rings, in a cache of
/// `n_ctx` positions.
pub fn step_plans(
    compress_ratios: &[u64],
    spans: &[Span],
    n: usize,
    rings: usize,
    n_ctx: usize,
) -> Vec<(usize, CompPlan, usize)> {
    ratios(compress_ratios)
        .into_iter()
        .map(|r| {
            let rows = comp_rows(n_ctx, r, 1);
            let p = plan_spans(spans, n, r, state_rows(r), rings, rows);
            let n_comp = p.n_comp(rows);
            (r, p, n_comp)
        })
        .collect()
}

/// One compressor's plan for one step of one sequence.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CompPlan {
    /// Per token: `pos mod r` (the row of the positional bias `ape`).
    pub state_pos: Vec<i32>,
    /// Step rows kept in the ring, and the ring rows they go to.
    pub persist_src: Vec<i32>,
    pub persist_dst: Vec<i64>,
    /// Source rows read per compressed row: `r` per row (ratio 4: the previous windows of every
    /// row, then the current windows of every row).
    pub read: Vec<i32>,
    /// Cache rows written, and their RoPE positions.
    pub write: Vec<i64>,
    pub write_pos: Vec<i32>,
    /// Per token: compressed rows visible (of its own sequence), and its span.
    pub n_visible: Vec<usize>,
    pub tok_span: Vec<usize>,
    /// The step's sequences (their pages map compressed rows to cache rows).
    pub spans: Vec<Span>,
    /// Ratio.
    pub r: usize,
}

impl CompPlan {
    pub fn n_blocks(&self) -> usize {
        self.write.len()
    }

    /// Attended width of compressed rows: the most any token sees, padded to 256 (at least
    /// 256), at most `cache_rows`.
    pub fn n_comp(&self, cache_rows: usize) -> usize {
        // A span's last token sees the most of its sequence.
        let most = self
            .spans
            .iter()
            .filter(|s| s.n > 0)
            .map(|s| s.comp_top(self.n_visible[s.tok + s.n - 1], self.r))
            .max()
            .unwrap_or(0);
        (most.div_ceil(256) * 256).max(256).min(cache_rows)
    }

    /// The f16 mask [n_comp, n_tokens]: 0 at the cache rows of the compressed rows each token
    /// sees, −∞ elsewhere.
    pub fn mask(&self, n_comp: usize) -> Vec<u16> {
        let (zero, neg_inf) = (half::f16::ZERO.to_bits(), half::f16::NEG_INFINITY.to_bits());
        let mut m = vec![neg_inf; n_comp * self.n_visible.len()];
        let per = PAGE / self.r;
        for (t, row) in m.chunks_exact_mut(n_comp.max(1)).enumerate() {
            let (v, s) = (self.n_visible[t], &self.spans[self.tok_span[t]]);
            // Page by page: the compressed rows of one page are consecutive cache rows.
            let mut j = 0;
            while j < v {
                let len = (per - j % per).min(v - j);
                let at = s.comp_row(j, self.r);
                let end = (at + len).min(n_comp);
                if at < end {
                    row[at..end].fill(zero);
                }
                j += len;
            }
        }
        m
    }
}

/// The plan for `n` tokens at positions `n_past..` of one sequence, at ratio `r` with a ring of
/// `state_rows` rows and a compressed cache of `cache_rows` rows (the last one scratch).
pub fn plan(n_past: usize, n: usize, r: usize, state_rows: usize, cache_rows: usize) -> CompPlan {
    plan_spans(&single(n_past, n), n, r, state_rows, 1, cache_rows)
}

/// The plan for a step of `n` tokens over `spans`, each sequence with its own ring of
/// `state_rows` rows (of `rings`).
pub fn plan_spans(
    spans: &[Span],
    n: usize,
    r: usize,
    state_rows: usize,
    rings: usize,
    cache_rows: usize,
) -> CompPlan {
    let overlap = r == 4;
    let all_rings = state_rows * rings;
    let zero = (all_rings + n) as i32;
    let mut p = CompPlan {
        state_pos: vec![0; n],
        n_visible: vec![0; n],
        tok_span: vec![0; n],
        spans: spans.to_vec(),
        r,
        ..Default::default()
    };
    let (mut prev, mut cur) = (Vec::new(), Vec::new());
    for (si, s) in spans.iter().enumerate() {
        let src = |pos: i64| -> i32 {
            if pos < 0 {
                zero
            } else if pos as usize >= s.pos {
                (all_rings + s.tok + (pos as usize - s.pos)) as i32
            } else {
                (s.ring * state_rows + pos as usize % state_rows) as i32
            }
        };
        let mut made = 0;
        for i in 0..s.n {
            let (t, pos) = (s.tok + i, s.pos + i);
            p.state_pos[t] = (pos % r) as i32;
            p.n_visible[t] = (pos + 1) / r;
            p.tok_span[t] = si;
            if (pos + 1) % r != 0 {
                continue;
            }
            let start = (pos + 1 - r) as i64;
            p.write.push(s.comp_row(pos / r, r) as i64);
            p.write_pos.push(start as i32);
            if overlap {
                prev.extend((0..r as i64).map(|j| src(start - r as i64 + j)));
            }
            cur.extend((0..r as i64).map(|j| src(start + j)));
            made += 1;
        }
        // Stable shapes: ratio 4 makes ceil(n / 4) rows per sequence, ratio 128 at least one;
        // the extra ones are dummies (any source, the scratch row, never visible).
        let want = if overlap { s.n.max(1).div_ceil(r) } else { 1 };
        for _ in made..want {
            let first = src(s.pos as i64);
            p.write.push(cache_rows as i64 - 1);
            p.write_pos.push(0);
            if overlap {
                prev.extend(std::iter::repeat_n(first, r));
            }
            cur.extend(std::iter::repeat_n(first, r));
        }
        let keep = s.n.min(state_rows);
        for i in s.n - keep..s.n {
            p.persist_src.push((s.tok + i) as i32);
            p.persist_dst
                .push((s.ring * state_rows + (s.pos + i) % state_rows) as i64);
        }
    }
    p.read = prev;
    p.read.extend(cur);
    p
}

/// A compressor's plan as graph inputs.
#[derive(Clone, Copy)]
pub struct CompInputs<'a> {
    pub state_pos: Tensor<'a>,
    pub persist_src: Tensor<'a>,
    pub persist_dst: Tensor<'a>,
    pub read: Tensor<'a>,
    pub write: Tensor<'a>,
    pub write_pos: Tensor<'a>,
    /// f16 [n_comp, n_tokens]: 0 where a token sees a compressed row, −∞ elsewhere.
    pub mask: Tensor<'a>,
    pub n_blocks: usize,
    pub n_comp: usize,
}

/// The inputs of one step for both compressors (ratio 4 also drives the indexer's).
#[derive(Clone, Copy)]
pub struct Dsv4Inputs<'a> {
    pub csa: Option<CompInputs<'a>>,
    pub hca: Option<CompInputs<'a>>,
}

/// Input names of the compressor of ratio `r`.
fn name(r: usize, what: &str) -> String {
    format!("dsv4_r{r}_{what}")
}

impl<'a> CompInputs<'a> {
    /// Input tensors for `p` over `n` tokens with `n_comp` attended compressed rows; `keep`
    /// collects their names (graph inputs the engine fills).
    pub fn create(
        ctx: &'a Context,
        r: usize,
        p: &CompPlan,
        n: usize,
        n_comp: usize,
        keep: &mut Vec<String>,
    ) -> Result<Self, GgmlError> {
        let mut input = |ty, len: usize, what: &str| -> Result<Tensor<'a>, GgmlError> {
            let nm = name(r, what);
            let t = ctx.new_tensor(ty, &[len as i64])?.set_name(&nm);
            ctx.set_input(t);
            keep.push(nm);
            Ok(t)
        };
        let state_pos = input(GgmlType::I32, n, "state_pos")?;
        let persist_src = input(GgmlType::I32, p.persist_src.len(), "persist_src")?;
        let persist_dst = input(GgmlType::I64, p.persist_dst.len(), "persist_dst")?;
        let read = input(GgmlType::I32, p.read.len(), "read")?;
        let write = input(GgmlType::I64, p.write.len(), "write")?;
        let write_pos = input(GgmlType::I32, p.write_pos.len(), "write_pos")?;
        let nm = name(r, "mask");
        let mask = ctx
            .new_tensor(GgmlType::F16, &[n_comp as i64, n as i64])?
            .set_name(&nm);
        ctx.set_input(mask);
        keep.push(nm);
        Ok(Self {
            state_pos,
            persist_src,
            persist_dst,
            read,
            write,
            write_pos,
            mask,
            n_blocks: p.n_blocks(),
            n_comp,
        })
    }
}

/// Writes plan `p` (ratio `r`, `n_comp` attended rows) into the inputs of an allocated graph
/// (`get` finds an input by name).
pub fn fill<'g>(
    get: impl Fn(&str) -> Tensor<'g>,
    r: usize,
    p: &CompPlan,
    n_comp: usize,
) -> Result<(), GgmlError> {
    get(&name(r, "state_pos")).write_i32(&p.state_pos)?;
    get(&name(r, "persist_src")).write_i32(&p.persist_src)?;
    get(&name(r, "persist_dst")).write_i64(&p.persist_dst)?;
    get(&name(r, "read")).write_i32(&p.read)?;
    get(&name(r, "write")).write_i64(&p.write)?;
    get(&name(r, "write_pos")).write_i32(&p.write_pos)?;
    let m = p.mask(n_comp);
    get(&name(r, "mask")).write_bytes(bytemuck::cast_slice(&m))
}

#[cfg(test)]
mod tests {
    use super::plan;

    #[test]
    fn hca_rows_complete_every_128_positions_and_read_their_window() {
        // 300 tokens from 0 in one step: rows 0 and 1 complete (positions 127, 255), each
        // reading its 128 positions from this step's rows (after the 128-row ring).
        let p = plan(0, 300, 128, 128, 257);
        assert_eq!(p.write, vec![0, 1]);
        assert_eq!(p.write_pos, vec![0, 128]);
        assert_eq!(p.read.len(), 256);
        assert_eq!(p.read[0], 128);
        assert_eq!(p.read[255], 128 + 255);
        assert_eq!(p.n_visible[126], 0);
        assert_eq!(p.n_visible[127], 1);
        assert_eq!(p.n_visible[299], 2);
        // The ring keeps positions 172..300 at pos mod 128.
        assert_eq!(p.persist_src.first(), Some(&172));
        assert_eq!(p.persist_dst.first(), Some(&(172 % 128)));
    }

    #[test]
    fn a_decode_step_reads_earlier_positions_from_the_ring() {
        // Position 255 completes HCA row 1: positions 128..255, all but the last in the ring.
        let p = plan(255, 1, 128, 128, 257);
        assert_eq!(p.write, vec![1]);
        assert_eq!(p.read[0], 0); // position 128 -> ring row 0
        assert_eq!(p.read[126], 126); // position 254
        assert_eq!(p.read[127], 128); // position 255: this step's row 0
                                      // A step completing nothing writes the scratch row.
        let q = plan(256, 1, 128, 128, 257);
        assert_eq!(q.write, vec![256]);
        assert_eq!(q.n_visible, vec![2]);
    }

    #[test]
    fn csa_rows_overlap_the_previous_window() {
        // Ratio 4, 10 tokens from 0: rows 0 (pos 3) and 1 (pos 7), padded to ceil(10/4) = 3.
        let p = plan(0, 10, 4, 8, 65);
        assert_eq!(p.write, vec![0, 1, 64]);
        let zero = 8 + 10;
        // Previous halves first: row 0's window precedes position 0 (the zero row).
        assert_eq!(&p.read[0..4], &[zero; 4]);
        assert_eq!(&p.read[4..8], &[8, 9, 10, 11]); // row 1: positions 0..3
                                                    // Then the current halves.
        assert_eq!(&p.read[12..16], &[8, 9, 10, 11]);
        assert_eq!(&p.read[16..20], &[12, 13, 14, 15]);
        // Split in two steps, position 7 reads positions 0..3 and 4..6 from the ring.
        let q = plan(7, 3, 4, 8, 65);
        assert_eq!(q.write[0], 1);
        assert_eq!(&q.read[0..4], &[0, 1, 2, 3]);
        assert_eq!(&q.read[4..8], &[4, 5, 6, 8]);
    }
}
