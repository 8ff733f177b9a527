//! DeepSeek-V3.2's sparse attention (DSA; llama.cpp `src/models/deepseek32.cpp`, the lightning
//! indexer, and `build_attn` for `llm_graph_input_attn_k_dsa` in `src/llama-graph.cpp`).
//!
//! Per block, a small "lightning indexer" scores every cached position for every token:
//!
//! - indexer q: `indexer.attn_q_b` on the normed low-rank q of MLA (`qr`), `indexer.head_count`
//!   heads of `indexer.key_length`, NeoX RoPE on the first `n_rot` dims of each head (the head
//!   is [rope | nope]);
//! - indexer k: `indexer.attn_k` on the block input, LayerNorm (`indexer.k_norm` weight and bias,
//!   eps 1e-6) and the same RoPE: one key head per position, kept in a cache of its own
//!   (`dsa_lid_l{il}`, f16, one row per position, written and read like the K cache);
//! - q and k both rotated by the orthonormal Hadamard matrix of the head size (`dsa_rot`): the
//!   scores are unchanged, but the f16 rounding of the cached keys is libllama's (its indexer
//!   cache always rotates);
//! - weights: `indexer.proj` on the block input, scaled by `1/sqrt(head_size * heads)`;
//! - score[kv, t] = Σ_h relu(q_h·k_kv) w_h + causal mask (ggml's fused `lightning_indexer`).
//!
//! The `indexer.top_k` best positions of each token (all of them when fewer are cached) are
//! opened in a mask that is otherwise -inf, and that mask plus the causal one is what MLA
//! attends with: each token sees at most top_k earlier positions.
use crate::ggml::{GgmlType, Tensor};
use crate::graph::blocks::attention::ROPE_NEOX;
use crate::graph::kv::{hadamard, Extra};
use crate::graph::GraphBuilder;
use crate::model::Hparams;

/// Name of block `il`'s indexer key cache.
pub fn lid_cache_name(il: usize) -> String {
    format!("dsa_lid_l{il}")
}

/// Name of the indexer's Hadamard rotation (one for every block).
pub const ROT_NAME: &str = "dsa_rot";

/// LayerNorm eps of the indexer keys (llama.cpp hard-codes `f_norm_eps = 1e-6` for DSA).
const K_NORM_EPS: f32 = 1e-6;

/// The DSA cache tensors for `n_ctx` cache rows: per decode block the indexer keys
/// ([`lid_cache_name`], f16 [indexer head size, n_ctx]) and the Hadamard rotation ([`ROT_NAME`],
/// f32 [head size, head size], filled at allocation). The head size must be a power of two (the
/// architecture's checks refuse other files first).
pub fn cache_tensors(h: &Hparams, n_ctx: usize, _n_seq: usize) -> Vec<Extra> {
    let d = h.indexer.head_dim as i64;
    let mut v: Vec<Extra> = (0..h.n_layer_decode())
        .map(|il| Extra {
            name: lid_cache_name(il),
            ty: GgmlType::F16,
            ne: vec![d, n_ctx as i64],
            init: None,
        })
        .collect();
    v.push(Extra {
        name: ROT_NAME.into(),
        ty: GgmlType::F32,
        ne: vec![d, d],
        init: Some(hadamard(d as usize)),
    });
    v
}

impl<'a> GraphBuilder<'a> {
    /// The sparse attention mask of block `il`: `x` [n_embd, nt] is the block's normed input,
    /// `qr` [q_lora, nt] MLA's normed low-rank q. Stores this batch's indexer keys (expanded into
    /// the graph now, as libllama does before the attention) and returns the f16 mask
    /// [n_kv, nt]: the batch's causal mask with every position outside the token's top-k
    /// indexer scores set to -inf.
    pub fn dsa_mask(&self, x: Tensor<'a>, qr: Tensor<'a>, il: usize) -> Tensor<'a> {
        let (hp, ctx, b) = (self.hp, self.ctx, self.batch);
        let i = il as i32;
        let d = hp.indexer.head_dim as i64;
        let nh = hp.indexer.n_head as i64;
        let nt = b.n_tokens as i64;
        let n_kv = b.n_kv() as i64;
        let rp = self.rope_params_scaled(hp.n_rot, hp.rope_freq_base, ROPE_NEOX);
        let rot = self.kv.extra(ROT_NAME); // [d, d]
        let iw = self.blk(il).mla().indexer.as_ref().unwrap_or_else(|| {
            panic!("block {il} has no indexer in its architecture's table; the graph asks for it")
        });

        // Queries: [d, nh, nt], roped, rotated.
        let q = self.cb(ctx.mul_mat(self.t(iw.q_b), qr), "indexer_q", i); // [d * nh, nt]
        let q = ctx.reshape(q, &[d, nh, nt]).expect("indexer q 3d");
        let q = self.cb(ctx.rope(q, b.pos, &rp), "indexer_q", i); // [d, nh, nt]

        // Keys: [d, 1, nt], normed, roped, rotated; stored now.
        let k = self.cb(ctx.mul_mat(self.t(iw.k), x), "indexer_k", i); // [d, nt]
        let k = ctx.norm(k, K_NORM_EPS);
        let k = ctx.mul(k, self.t(iw.k_norm));
        let k = self.cb(ctx.add(k, self.t(iw.k_norm_bias)), "indexer_k", i); // [d, nt]
        let k = ctx.reshape(k, &[d, 1, nt]).expect("indexer k 3d");
        let k = self.cb(ctx.rope(k, b.pos, &rp), "indexer_k", i); // [d, 1, nt]

        let q = self.cb(ctx.mul_mat(rot, q), "indexer_q", i); // [d, nh, nt]
        let k = self.cb(ctx.mul_mat(rot, k), "indexer_k", i); // [d, 1, nt]
        let cache = self.kv.extra(&lid_cache_name(il)); // [d, n_ctx] f16
        let rows = ctx.reshape(k, &[d, nt]).expect("indexer k rows");
        // Named as libllama names it: its indexer cache is a second KV cache, whose block
        // tensors are `cache_k_l{il}` too (dumps then diff by name).
        let store = ctx
            .set_rows(cache, rows, b.kv_idx)
            .set_name(&format!("cache_k_l{il} (view)"));
        self.graph.build_forward(store);

        // Per-head weights [nh, nt], pre-scaled.
        let w = self.cb(ctx.mul_mat(self.t(iw.proj), x), "indexer_weights", i); // [nh, nt]
        let w = self.cb(
            ctx.scale(w, 1.0 / ((d * nh) as f32).sqrt()),
            "indexer_weights",
            i,
        );

        // Scores over cache positions 0..n_kv: [n_kv, nt].
        let row = GgmlType::F16.row_size(d as u64).expect("f16 row") as usize;
        let k_all = ctx.view(cache, &[d, 1, n_kv], &[row, row], 0); // [d, 1, n_kv]
        let score = self.cb(
            ctx.lightning_indexer(q, k_all, w, b.mask),
            "indexer_score",
            i,
        ); // [n_kv, nt]
        let top_k = (hp.indexer.top_k as i64).min(n_kv) as usize;
        let top = self.cb(ctx.cont(ctx.top_k(score, top_k)), "top_k", i); // i32 [top_k, nt]

        // The causal mask with every position outside the token's top-k set to -inf: ggml's
        // fused op, as libllama builds it (`build_fused_top_k_mask`, its default).
        self.cb(ctx.top_k_mask(b.mask, top), "kq_mask_top_k", i) // [n_kv, nt] f16
    }
}
