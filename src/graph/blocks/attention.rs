//! Grouped-query attention over the KV cache (llama.cpp `build_qkv` + `build_attn` with flash
//! attention): q/k/v projections (+ optional biases), optional q/k RMSNorm, RoPE, cache store,
//! `flash_attn_ext` with a causal mask, output projection.
use crate::ggml::{RopeParams, Tensor};
use crate::graph::layers::{Attn, Proj};
use crate::graph::GraphBuilder;

/// Where the q/k RMSNorm applies, if anywhere.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QkNorm {
    None,
    /// Per head, weight [head_dim] (Qwen3; GLM-4.5 where the file has the weights).
    PerHead,
    /// Over the whole projection, weight [n_head * head_dim] (MiniMax-M2, OLMoE).
    Full,
}

/// Per-architecture attention settings.
#[derive(Debug, Clone, Copy)]
pub struct AttnOpts {
    pub qk_norm: QkNorm,
    /// ggml rope mode: 0 = normal (GPT-J interleaved), 2 = NeoX (halves).
    pub rope_mode: i32,
}

impl AttnOpts {
    pub const fn new(qk_norm: QkNorm, rope_mode: i32) -> Self {
        Self { qk_norm, rope_mode }
    }
}

pub const ROPE_NORMAL: i32 = 0;
pub const ROPE_NEOX: i32 = 2;

impl<'a> GraphBuilder<'a> {
    fn rope_params(&self, mode: i32) -> RopeParams {
        self.rope_params_scaled(self.hp.n_rot, self.hp.rope_freq_base, mode)
    }

    /// Projection `w·x` plus an optional bias.
    fn proj(&self, x: Tensor<'a>, p: Proj) -> Tensor<'a> {
        let y = self.ctx.mul_mat(self.t(p.w), x);
        match self.t_opt(p.b) {
            Some(b) => self.ctx.add(y, b),
            None => y,
        }
    }

    /// Self-attention of block `il` on `x` [n_embd, n_tokens] -> [n_embd, n_tokens].
    pub fn attention(&self, x: Tensor<'a>, il: usize, opts: &AttnOpts) -> Tensor<'a> {
        let (hp, ctx, b) = (self.hp, self.ctx, self.batch);
        let (n_head, n_head_kv) = (hp.n_head as i64, hp.n_head_kv as i64);
        let (dk, nt) = (hp.head_dim_k as i64, b.n_tokens as i64);
        let ili = il as i32;
        let w = self.blk(il).gqa();

        let mut q = self.cb(self.proj(x, w.q), "Qcur", ili); // [dk*n_head, nt]
        let mut k = self.cb(self.proj(x, w.k), "Kcur", ili); // [dk*n_head_kv, nt]
        let v = self.cb(self.proj(x, w.v), "Vcur", ili); // [dv*n_head_kv, nt]

        // q/k norms apply where the file has them (required ones were checked at load).
        let (qn, kn) = (self.t_opt(w.q_norm), self.t_opt(w.k_norm));
        if opts.qk_norm == QkNorm::Full {
            if let Some(w) = qn {
                q = self.rms_norm(q, w, "Qcur_normed", ili);
            }
            if let Some(w) = kn {
                k = self.rms_norm(k, w, "Kcur_normed", ili);
            }
        }
        let q = ctx.reshape(q, &[dk, n_head, nt]).expect("q reshape"); // [dk, n_head, nt]
        let k = ctx.reshape(k, &[dk, n_head_kv, nt]).expect("k reshape"); // [dk, n_head_kv, nt]
        let (q, k) = match (opts.qk_norm, qn, kn) {
            (QkNorm::PerHead, Some(qw), Some(kw)) => (
                self.rms_norm(q, qw, "Qcur_normed", ili),
                self.rms_norm(k, kw, "Kcur_normed", ili),
            ),
            _ => (q, k),
        };
        let rp = self.rope_params(opts.rope_mode);
        let q = self.cb(ctx.rope(q, b.pos, &rp), "Qcur", ili);
        let k = self.cb(ctx.rope(k, b.pos, &rp), "Kcur", ili);

        let scale = 1.0 / (dk as f32).sqrt();
        let o = self.attend_kv(q, k, v, il, scale); // [dv*n_head, nt]
        self.cb(self.proj(o, w.output), "attn_out", ili)
    }

    /// Stores this batch's `k` [dk, n_head_kv, nt] (contiguous) and `v` [dv * n_head_kv, nt]
    /// (any layout) at positions n_past.. of block `il`'s cache, then attends with `q`
    /// [dk, n_head, nt] over cache positions 0..n_kv (causal / sliding-window mask, sinks where
    /// the file has them) -> [dv * n_head, nt], before the output projection.
    pub fn attend_kv(
        &self,
        q: Tensor<'a>,
        k: Tensor<'a>,
        v: Tensor<'a>,
        il: usize,
        scale: f32,
    ) -> Tensor<'a> {
        let (hp, ctx, b) = (self.hp, self.ctx, self.batch);
        // A quantised cache holds K and V Hadamard-rotated (as libllama): Q turns with K, so
        // the scores are unchanged, and the output turns back with V's rotation below.
        let (rk, rv) = (self.kv.rot_k(), self.kv.rot_v());
        let q = rk.map_or(q, |r| ctx.mul_mat_hadamard(r, q));
        let k = rk.map_or(k, |r| ctx.mul_mat_hadamard(r, k));
        let v = rv.map_or(v, |r| ctx.mul_mat_hadamard(r, v));
        // Node order as libllama's build_attn: Q, then V, then K (Q, K, V in its sliding-window
        // variant), then the two cache stores. K's rope then directly precedes its store
        // (ggml-cuda fuses rope -> view -> set_rows), and CUDA-graph replay with programmatic
        // dependent launch (PDL) is exact; with K first it was not
        // (scripts/device-replay-check.sh; tests/graph_order.rs checks the order on the CPU).
        self.graph.build_forward(q);
        if hp.swa.window > 0 {
            self.graph.build_forward(k);
            self.graph.build_forward(v);
        } else {
            self.graph.build_forward(v);
            self.graph.build_forward(k);
        }
        let (n_head, n_head_kv) = (hp.n_head as i64, hp.n_head_kv as i64);
        let (dk, dv, nt) = (
            hp.head_dim_k as i64,
            hp.head_dim_v as i64,
            b.n_tokens as i64,
        );
        // Store this batch's K and V rows at positions n_past.. of the cache.
        let (kc, vc) = (self.kv.k(il), self.kv.v(il));
        let (k_row, v_row) = (self.kv.k_width[il] as i64, self.kv.v_width[il] as i64);
        // Views, not reshape/cont nodes (as llama.cpp's cpy_k/cpy_v): ggml-cuda fuses
        // rope -> view -> set_rows into one kernel, and a contiguous V needs no copy.
        let k = if k.is_contiguous() { k } else { ctx.cont(k) };
        let k_flat = ctx.view(k, &[k_row, nt], &[k.nb()[0] * k_row as usize], 0); // [k_row, nt]
        let v_flat = if v.is_contiguous() && v.ne()[0] == v_row {
            v
        } else {
            ctx.cont(v)
        }; // [v_row, nt]
        self.kv_store(kc, k_flat);
        self.kv_store(vc, v_flat);

        // Attend over cache rows kv_lo..kv_lo + n_kv.
        let k_all = self.kv_view(kc, k_row, dk, dk, n_head_kv); // [dk, n_kv, n_head_kv]
        let v_all = self.kv_view(vc, v_row, dv, dv, n_head_kv); // [dv, n_kv, n_head_kv]
        let qp = ctx.permute(q, [0, 2, 1, 3]); // [dk, nt, n_head]
        let mask = match b.mask_swa {
            Some(m) if hp.is_swa(il) => m,
            _ => b.mask,
        };
        let o = ctx.flash_attn(qp, k_all, v_all, mask, scale); // [dv, n_head, nt]
        if let Attn::Gqa(w) = &self.blk(il).attn {
            if let Some(sinks) = self.t_opt(w.sinks) {
                ctx.flash_attn_add_sinks(o, sinks);
            }
        }
        let o = ctx
            .reshape(o, &[dv * n_head, nt])
            .expect("attn out reshape"); // [dv*n_head, nt]
        match self.kv.rot_v() {
            Some(r) => ctx.mul_mat_hadamard(r, o),
            None => o,
        }
    }

    /// Stores `rows` [row, nt] (one cache row per token of the batch) at this batch's
    /// positions of `cache` (a `set_rows` node, as llama.cpp's `cpy_k`/`cpy_v`).
    pub(crate) fn kv_store(&self, cache: Tensor<'a>, rows: Tensor<'a>) {
        self.graph
            .build_forward(self.ctx.set_rows(cache, rows, self.batch.kv_idx));
    }

    /// `cache` (rows of `row` elements) over rows `kv_lo..kv_lo + n_kv` as `heads` heads of `d`
    /// elements, `head` elements apart: [d, n_kv, heads] (a view, as llama.cpp's `get_k`/`get_v`).
    pub(crate) fn kv_view(
        &self,
        cache: Tensor<'a>,
        row: i64,
        d: i64,
        head: i64,
        heads: i64,
    ) -> Tensor<'a> {
        let bytes = |n: i64| self.kv.ty.row_size(n as u64).expect("cache row") as usize;
        let n_kv = self.batch.n_kv() as i64;
        // [d, heads, n_kv] with ascending strides, then permuted (as libllama's get_k and
        // build_attn_mha): the same memory as viewing [d, n_kv, heads] directly, but a view
        // ggml's meta backend can follow through a tensor split (it cannot view a permuted
        // layout; `engine::tensor_split`).
        let v = self.ctx.view(
            cache,
            &[d, heads, n_kv],
            &[bytes(head), bytes(row)],
            self.batch.kv_lo * bytes(row),
        );
        self.ctx.permute(v, [0, 2, 1, 3])
    }
}
