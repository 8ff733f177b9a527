//! Multi-head latent attention (DeepSeek-V2/V3, llama.cpp `src/models/deepseek2.cpp` with
//! `build_attn(llm_graph_input_attn_k *, ..., v_mla)`), in the absorbed form llama.cpp uses when
//! the file has `attn_k_b`/`attn_v_b`:
//!
//! - q: low rank (`attn_q_a` -> RMSNorm `attn_q_a_norm` -> `attn_q_b`) or plain `attn_q` ("lite"),
//!   split per head into a non-rotary part (`nope`) and a rotary part (`n_rot`).
//! - kv: `attn_kv_a_mqa` gives the latent `kv_cmpr` (`kv_lora_rank`, RMSNorm `attn_kv_a_norm`) and
//!   one rotary key `k_pe` shared by all heads.
//! - absorption: `q_nope` is multiplied by `attn_k_b` into latent space, so attention is MQA with
//!   one KV head of width `kv_lora_rank + n_rot` (K = [kv_cmpr | k_pe]) and V = the first
//!   `kv_lora_rank` columns of the same cache row; the per-head output is decompressed by
//!   `attn_v_b` after attention.
//!
//! Legacy files with the fused `attn_kv_b` (no `key_length_mla`) run llama.cpp's other branch:
//! K and V decompressed per head, ordinary multi-head attention over a K/V cache.
//!
//! Invariant (absorbed form): the cache is K-only (V width 0); one row per position = [kv_cmpr (kv_lora) | k_pe
//! (n_rot)]. The score scale folds in YaRN's mscale twice (`kq_scale`), as llama.cpp does.
use crate::ggml::Tensor;
use crate::graph::blocks::rope::mul_add1;
use crate::graph::layers::{MlaKv, MlaQ};
use crate::graph::GraphBuilder;

/// MLA settings of an architecture.
#[derive(Debug, Clone, Copy)]
pub struct MlaOpts {
    /// ggml rope mode of the rotary parts (DeepSeek: normal, interleaved pairs).
    pub rope_mode: i32,
}

impl<'a> GraphBuilder<'a> {
    /// The score scale: `mscale^2 / sqrt(head_dim_k_mla)` with YaRN's
    /// `mscale = attn_factor_org * (1 + 0.1 * mscale_all_dim * ln(factor))`, where
    /// `attn_factor_org` undoes the adjustment folded into the rope attn_factor.
    fn mla_kq_scale(&self, rope_mode: i32) -> f32 {
        let rp = self.rope_params_scaled(self.hp.n_rot, self.hp.rope_freq_base, rope_mode);
        let ln_scale = (1.0 / rp.freq_scale).ln();
        let attn_factor_org = rp.attn_factor * mul_add1(0.1, ln_scale);
        let mscale = attn_factor_org * mul_add1(0.1 * self.rope_yarn_log_mul(), ln_scale);
        mscale * mscale / (self.hp.mla_head_dim_k() as f32).sqrt()
    }

    /// MLA self-attention of block `il` on `x` [n_embd, n_tokens] -> [n_embd, n_tokens].
    pub fn mla_attention(&self, x: Tensor<'a>, il: usize, opts: &MlaOpts) -> Tensor<'a> {
        self.mla_attention_masked(x, il, opts, &|_| (self.batch.mask, 0))
    }

    /// [`Self::mla_attention`] over a mask of the caller's making (DeepSeek-V3.2's sparse
    /// attention, `blocks::dsa`): `mask_of(qr)` gets the normed low-rank q `qr` [q_lora, nt]
    /// (`None` in files without q compression) and returns the f16 mask [n_kv, nt] the absorbed
    /// attention uses instead of the batch's, and the most finite entries any of its rows holds
    /// (0: no bound; a bound lets ggml-cuda's flash attention visit only those rows). It runs before any node of the attention is
    /// expanded into the graph, so what it expands (the indexer's key store) comes first, as in
    /// libllama. The legacy form (fused `attn_kv_b`) always uses the batch's mask.
    pub fn mla_attention_masked(
        &self,
        x: Tensor<'a>,
        il: usize,
        opts: &MlaOpts,
        mask_of: &dyn Fn(Option<Tensor<'a>>) -> (Tensor<'a>, usize),
    ) -> Tensor<'a> {
        let (hp, ctx, b) = (self.hp, self.ctx, self.batch);
        let i = il as i32;
        let n_head = hp.n_head as i64;
        let nt = b.n_tokens as i64;
        let dk = hp.mla_head_dim_k() as i64; // per-head q/k width after decompression
        let n_rot = hp.n_rot as i64;
        let nope = dk - n_rot;
        let kv_lora = hp.mla.kv_lora_rank as i64;
        let rp = self.rope_params_scaled(hp.n_rot, hp.rope_freq_base, opts.rope_mode);
        let f32_row = |n: i64| n as usize * 4;
        let w = self.blk(il).mla();

        // q: [dk * n_head, nt]
        let (q, mask) = match w.q {
            MlaQ::LowRank { a, a_norm, b } => {
                let q = self.cb(ctx.mul_mat(self.t(a), x), "q", i); // [q_lora, nt]
                let q = self.rms_norm(q, self.t(a_norm), "q", i);
                let mask = mask_of(Some(q));
                let q = self.cb(ctx.mul_mat(self.t(b), q), "q", i);
                (q, mask)
            }
            MlaQ::Full(q) => (self.cb(ctx.mul_mat(self.t(q), x), "q", i), mask_of(None)),
        };
        let q = self.cb(ctx.reshape(q, &[dk, n_head, nt]).expect("q 3d"), "q", i); // [dk, n_head, nt]

        let kv_cmpr_pe = self.cb(ctx.mul_mat(self.t(w.kv_a_mqa), x), "kv_cmpr_pe", i); // [kv_lora + n_rot, nt]
        let row = f32_row(kv_lora + n_rot);
        let kv_cmpr = self.cb(
            ctx.view(kv_cmpr_pe, &[kv_lora, nt], &[row], 0),
            "kv_cmpr",
            i,
        ); // [kv_lora, nt]
        let k_pe = ctx.view(kv_cmpr_pe, &[n_rot, 1, nt], &[row, row], f32_row(kv_lora)); // [n_rot, 1, nt]
        let k_pe = self.cb(k_pe, "k_pe", i);
        let k_pe = self.cb(ctx.rope(k_pe, b.pos, &rp), "k_pe", i); // [n_rot, 1, nt]
        let kv_cmpr = self.rms_norm(kv_cmpr, self.t(w.kv_a_norm), "kv_cmpr", i); // [kv_lora, nt]

        let qnb = q.nb();
        let q_nope = ctx.view(q, &[nope, n_head, nt], &[qnb[1], qnb[2]], 0); // [nope, n_head, nt]
        let q_nope = self.cb(q_nope, "q_nope", i);
        let q_pe = ctx.view(q, &[n_rot, n_head, nt], &[qnb[1], qnb[2]], f32_row(nope)); // [n_rot, n_head, nt]
        let q_pe = self.cb(q_pe, "q_pe", i);
        let q_pe = self.cb(ctx.rope(q_pe, b.pos, &rp), "q_pe", i); // [n_rot, n_head, nt]

        let kq_scale = self.mla_kq_scale(opts.rope_mode);
        let o = match w.kv {
            MlaKv::Absorbed { .. } => {
                self.mla_absorbed(q_nope, q_pe, kv_cmpr, k_pe, il, kq_scale, mask.0, mask.1)
            }
            MlaKv::Decompressed { .. } => {
                self.mla_decompressed(q_nope, q_pe, kv_cmpr, k_pe, il, kq_scale)
            }
        }; // [dv * n_head, nt]
        self.cb(ctx.mul_mat(self.t(w.output), o), "attn_out", i) // [n_embd, nt]
    }

    /// The absorbed form (files with `attn_k_b`/`attn_v_b`): MQA over the K-only latent cache.
    /// `q_nope` [nope, n_head, nt] (view), `q_pe` [n_rot, n_head, nt] (roped), `kv_cmpr`
    /// [kv_lora, nt] (normed), `k_pe` [n_rot, 1, nt] (roped), `mask` f16 [n_kv, nt] with at
    /// most `n_kv_max` finite entries a row (0: no bound) -> [dv * n_head, nt].
    #[allow(clippy::too_many_arguments)]
    fn mla_absorbed(
        &self,
        q_nope: Tensor<'a>,
        q_pe: Tensor<'a>,
        kv_cmpr: Tensor<'a>,
        k_pe: Tensor<'a>,
        il: usize,
        kq_scale: f32,
        mask: Tensor<'a>,
        n_kv_max: usize,
    ) -> Tensor<'a> {
        let (hp, ctx, b) = (self.hp, self.ctx, self.batch);
        let i = il as i32;
        let (n_head, nt) = (hp.n_head as i64, b.n_tokens as i64);
        let dv = hp.mla_head_dim_v() as i64;
        let (n_rot, kv_lora) = (hp.n_rot as i64, hp.mla.kv_lora_rank as i64);
        let MlaKv::Absorbed { k_b, v_b } = self.blk(il).mla().kv else {
            unreachable!("called for absorbed blocks")
        };
        // Absorb attn_k_b into q: [nope, kv_lora, n_head] x [nope, nt, n_head] -> [kv_lora, nt, n_head].
        let q_nope = self.cb(ctx.permute(q_nope, [0, 2, 1, 3]), "q_nope_perm", i); // [nope, nt, n_head]
        let q_abs = self.cb(ctx.mul_mat(self.t(k_b), q_nope), "q_nope_absorbed", i); // [kv_lora, nt, n_head]
        let q_abs = self.cb(ctx.permute(q_abs, [0, 2, 1, 3]), "q_nope_absorbed_perm", i); // [kv_lora, n_head, nt]
        let q_cur = self.cb(ctx.concat(q_abs, q_pe, 0), "Qcur", i); // [kv_lora + n_rot, n_head, nt]

        let kv_cmpr = ctx.reshape(kv_cmpr, &[kv_lora, 1, nt]).expect("kv_cmpr 3d"); // [kv_lora, 1, nt]
        let kv_cmpr = self.cb(kv_cmpr, "kv_cmpr_reshape", i);
        let k_cur = self.cb(ctx.concat(kv_cmpr, k_pe, 0), "Kcur", i); // [kv_lora + n_rot, 1, nt]
        self.cb(kv_cmpr, "Vcur", i);
        self.graph.build_forward(q_cur);
        self.graph.build_forward(kv_cmpr);

        // Store this batch's latent rows at positions n_past.. of the K-only cache.
        let kc = self.kv.k(il);
        let k_row = self.kv.k_width[il] as i64; // kv_lora + n_rot
        debug_assert_eq!(k_row, kv_lora + n_rot);
        let k_flat = ctx.reshape(k_cur, &[k_row, nt]).expect("k flat"); // [k_row, nt]
        self.kv_store(kc, k_flat);

        // MQA over cache positions 0..n_kv: K = the whole row, V = its first kv_lora columns.
        let k_all = self.kv_view(kc, k_row, k_row, k_row, 1); // [k_row, n_kv, 1]
        let v_all = self.kv_view(kc, k_row, kv_lora, k_row, 1); // [kv_lora, n_kv, 1]
        let qp = ctx.permute(q_cur, [0, 2, 1, 3]); // [k_row, nt, n_head]
        let o = ctx.flash_attn(qp, k_all, v_all, mask, kq_scale); // [kv_lora, n_head, nt]
        if n_kv_max > 0 {
            ctx.flash_attn_n_kv_max(o, n_kv_max);
        }

        // Decompress per head with attn_v_b: [kv_lora, dv, n_head] x [kv_lora, nt, n_head].
        let o = ctx.permute(o, [0, 2, 1, 3]); // [kv_lora, nt, n_head]
        let o = self.cb(ctx.mul_mat(self.t(v_b), o), "fattn_mla", i); // [dv, nt, n_head]
        let o = ctx.cont(ctx.permute(o, [0, 2, 1, 3])); // [dv, n_head, nt]
        let o = ctx.reshape(o, &[dv * n_head, nt]).expect("attn out 2d"); // [dv * n_head, nt]
        self.cb(o, "kqv_out", i)
    }

    /// The legacy form (files with the fused `attn_kv_b`): decompress K and V per head and run
    /// ordinary multi-head attention over a K/V cache of `head_dim_k`/`head_dim_v` per head.
    /// Inputs as [`Self::mla_absorbed`] -> [dv * n_head, nt].
    fn mla_decompressed(
        &self,
        q_nope: Tensor<'a>,
        q_pe: Tensor<'a>,
        kv_cmpr: Tensor<'a>,
        k_pe: Tensor<'a>,
        il: usize,
        kq_scale: f32,
    ) -> Tensor<'a> {
        let (hp, ctx, b) = (self.hp, self.ctx, self.batch);
        let i = il as i32;
        let (n_head, nt) = (hp.n_head as i64, b.n_tokens as i64);
        let dv = hp.mla_head_dim_v() as i64;
        let (n_rot, nope) = (hp.n_rot as i64, hp.mla_qk_nope() as i64);
        let MlaKv::Decompressed { kv_b } = self.blk(il).mla().kv else {
            unreachable!("called for decompressed blocks")
        };
        let kv = self.cb(ctx.mul_mat(self.t(kv_b), kv_cmpr), "kv", i); // [n_head * (nope + dv), nt]
        let row = (nope + dv) as usize * 4;
        let k_nope = ctx.view(kv, &[nope, n_head, nt], &[row, row * n_head as usize], 0); // [nope, n_head, nt]
        let k_nope = self.cb(k_nope, "k_nope_view", i);
        let v = ctx.view(
            kv,
            &[dv, n_head, nt],
            &[row, row * n_head as usize],
            nope as usize * 4,
        ); // [dv, n_head, nt]
        let v = self.cb(ctx.cont(v), "Vcur_cont", i); // [dv, n_head, nt]
        let v = ctx.reshape(v, &[dv * n_head, nt]).expect("v 2d"); // [dv * n_head, nt]

        // llama.cpp ropes q in place at offset `nope`; roping the q_pe view is the same values.
        let q_cur = self.cb(ctx.concat(q_nope, q_pe, 0), "Qcur", i); // [nope + n_rot, n_head, nt]
        let k_pe = ctx.repeat_4d(k_pe, [n_rot, n_head, nt, 1]); // [n_rot, n_head, nt]
        let k_cur = self.cb(ctx.concat(k_nope, k_pe, 0), "Kcur", i); // [nope + n_rot, n_head, nt]
        let o = self.attend_kv(q_cur, k_cur, v, il, kq_scale); // [dv * n_head, nt]
        self.cb(o, "kqv_out", i)
    }
}
