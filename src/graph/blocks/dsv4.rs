//! DeepSeek-V4's blocks (llama.cpp `src/models/deepseek4.cpp`, semantics in
//! docs/deepseek4-port.md): hyper-connections (the residual as `hc` streams, mixed before and
//! after each sub-block), the attention (low-rank q, one shared K=V head RoPE'd on its last
//! `n_rot` dims, sinks, a raw sliding window plus compressed rows: every 128 positions at ratio
//! 128, every 4 with a lightning-indexer top-k at ratio 4), the compressors that make those
//! rows, and the grouped low-rank output projection.
//!
//! Invariants: each compressed row is written (and the compressor ring updated) in the graph
//! before the attention that reads the cache (ggml runs nodes in order); the compressors' inputs
//! are the step's [`crate::graph::dsv4::CompInputs`].
use crate::ggml::{RopeParams, Tensor};
use crate::graph::blocks::attention::ROPE_NORMAL;
use crate::graph::blocks::rope::mul_add1;
use crate::graph::dsv4::CompInputs;
use crate::graph::layers::{CompW, Dsv4Comp};
use crate::graph::GraphBuilder;

/// Which hyper-connection mix: before the attention or before the FFN.
#[derive(Clone, Copy)]
pub enum HcSite {
    Attn,
    Ffn,
}

/// What a hyper-connection pre-mix leaves for its post-mix.
#[derive(Clone, Copy)]
pub struct HcMix<'a> {
    /// The streams' weighted sum: the sub-block's input [n_embd, nt].
    pub cur: Tensor<'a>,
    /// [hc, nt]: how much of the sub-block's output each stream takes.
    pub post: Tensor<'a>,
    /// [hc (dst), hc (src), nt]: the Sinkhorn-normalised stream mixing.
    pub comb: Tensor<'a>,
}

/// A compressor's tensors: projection, gate, positional bias, norm, and its cache and ring.
struct Compressor<'a> {
    wkv: Tensor<'a>,
    wgate: Tensor<'a>,
    ape: Tensor<'a>,
    norm: Tensor<'a>,
    cache: Tensor<'a>,
    state_kv: Tensor<'a>,
    state_score: Tensor<'a>,
    /// Row width of the compressed rows.
    d: i64,
    /// Hadamard rotation applied to the rows before they are cached (the indexer's keys).
    rot: Option<Tensor<'a>>,
}

impl<'a> GraphBuilder<'a> {
    /// Block `il`'s compression ratio (0: window only).
    pub fn dsv4_ratio(&self, il: usize) -> usize {
        self.hp.dsv4.compress_ratios.get(il).copied().unwrap_or(0) as usize
    }

    /// RoPE of DeepSeek-V4's attention: window-only blocks use `rope.freq_base` plain; compressed
    /// blocks (and every compressed row, and the indexer) `compress_rope_freq_base` with the
    /// model's YaRN and the attention factor `1 / (1 + 0.1 ln(1 / freq_scale))`.
    fn dsv4_rope(&self, compressed: bool) -> RopeParams {
        let hp = self.hp;
        if !compressed {
            return RopeParams {
                n_dims: hp.n_rot as i32,
                mode: ROPE_NORMAL,
                n_ctx_orig: 0,
                freq_base: hp.rope_freq_base,
                freq_scale: 1.0,
                ext_factor: 0.0,
                attn_factor: 1.0,
                beta_fast: 0.0,
                beta_slow: 0.0,
            };
        }
        let mut p = self.rope_params_scaled(hp.n_rot, hp.dsv4.compress_rope_freq_base, ROPE_NORMAL);
        p.attn_factor = if p.ext_factor != 0.0 {
            1.0 / mul_add1(0.1, (1.0 / p.freq_scale).ln())
        } else {
            1.0
        };
        p
    }

    /// `t` [d, heads, nt] RoPE'd on the last `n_rot` dims of each head.
    fn rope_tail(&self, t: Tensor<'a>, pos: Tensor<'a>, p: &RopeParams) -> Tensor<'a> {
        let d = t.ne()[0] as i32;
        self.ctx.rope_offset(self.ctx.rope(t, pos, p), d - p.n_dims)
    }

    /// The hyper-connection pre-mix of block `il` on the streams `x` [n_embd, hc, nt].
    pub fn hc_pre(&self, x: Tensor<'a>, il: usize, site: HcSite) -> HcMix<'a> {
        let (ctx, hp) = (self.ctx, self.hp);
        let (s, w) = match site {
            HcSite::Attn => ("attn", self.blk(il).hc()[0]),
            HcSite::Ffn => ("ffn", self.blk(il).hc()[1]),
        };
        let (f, scale, base) = (self.t(w.f), self.t(w.scale), self.t(w.base));
        let hc = hp.dsv4.hc_mult as i64;
        let mixes = self.hc_mixes(x, f); // [(2+hc)·hc, nt]
        let nt = mixes.ne()[1];
        let part =
            |t: Tensor<'a>, n: i64, off: i64| ctx.view(t, &[n, nt], &[t.nb()[1]], off as usize * 4);
        let one = |off: i64| ctx.view(scale, &[1], &[], off as usize * 4);
        let affine = |off_mix: i64, off_scale: i64| {
            let m = ctx.mul(part(mixes, hc, off_mix), one(off_scale));
            ctx.add(m, ctx.view(base, &[hc], &[], off_mix as usize * 4))
        };
        let pre = ctx.scale_bias(ctx.sigmoid(affine(0, 0)), 1.0, hp.dsv4.hc_eps);
        let post = ctx.scale(ctx.sigmoid(affine(hc, 1)), 2.0);
        let comb = ctx.dsv4_hc_comb(
            mixes,
            scale,
            base,
            hp.dsv4.hc_eps,
            hp.dsv4.hc_sinkhorn_iters as i32,
        );
        let i = il as i32;
        let cur = self.cb(
            ctx.dsv4_hc_pre(x, self.cb(pre, "hc_pre", i)),
            &format!("hc_{s}_pre"), // libllama's names: hc_attn_pre, hc_ffn_pre
            i,
        );
        HcMix {
            cur,
            post: self.cb(post, "hc_post", i),
            comb: self.cb(comb, "hc_comb", i),
        }
    }

    /// `f · rms_norm(x flattened)`: the mixing logits of the streams `x` [n_embd, hc, nt].
    fn hc_mixes(&self, x: Tensor<'a>, f: Tensor<'a>) -> Tensor<'a> {
        let ne = x.ne();
        let flat = self
            .ctx
            .reshape(x, &[ne[0] * ne[1], ne[2]])
            .expect("streams flat");
        self.ctx
            .mul_mat(f, self.ctx.rms_norm(flat, self.hp.rms_eps))
    }

    /// The hyper-connection post-mix: new streams from the sub-block's output `y` [n_embd, nt]
    /// and the streams before it.
    pub fn hc_post(&self, y: Tensor<'a>, residual: Tensor<'a>, m: &HcMix<'a>) -> Tensor<'a> {
        self.ctx.dsv4_hc_post(y, residual, m.post, m.comb)
    }

    /// The output head's collapse of the streams `x` [n_embd, hc, nt] (only the wanted columns)
    /// into [n_embd, n_out]: the `output_hc_*` pre-weights' sum of the streams.
    pub fn hc_head(&self, x: Tensor<'a>) -> Tensor<'a> {
        let (ctx, hp) = (self.ctx, self.hp);
        let [n_embd, hc, nt, _] = x.ne();
        let flat = ctx.reshape(x, &[n_embd * hc, nt]).expect("streams flat");
        let flat = self.select_outputs(flat); // [n_embd·hc, n_out]
        let n_out = flat.ne()[1];
        let x = ctx.reshape(flat, &[n_embd, hc, n_out]).expect("streams 3d");
        let w = self.w.layers().io().hc_head.unwrap_or_else(|| {
            panic!("the architecture's table has no output_hc_*; the graph asks for them")
        });
        let mixes = self.hc_mixes(x, self.t(w.f)); // [hc, n_out]
        let pre = ctx.add(ctx.mul(mixes, self.t(w.scale)), self.t(w.base));
        let pre = self.cb(
            ctx.scale_bias(ctx.sigmoid(pre), 1.0, hp.dsv4.hc_eps),
            "hc_head_pre",
            -1,
        );
        // libllama sums the streams unfused here (its fused op serves the blocks only).
        let mut out = None;
        for h in 0..hc {
            let xh = ctx.view(x, &[n_embd, n_out], &[x.nb()[2]], h as usize * x.nb()[1]);
            let wh = ctx.view(pre, &[1, n_out], &[pre.nb()[1]], h as usize * 4);
            let t = ctx.mul(xh, wh);
            out = Some(match out {
                Some(o) => ctx.add(o, t),
                None => t,
            });
        }
        self.cb(out.expect("hc >= 1"), "hc_head", -1)
    }

    /// DeepSeek-V4 attention of block `il` on `x` [n_embd, nt] (after `attn_norm`).
    pub fn dsv4_attention(&self, x: Tensor<'a>, il: usize) -> Tensor<'a> {
        let (hp, ctx, b) = (self.hp, self.ctx, self.batch);
        let i = il as i32;
        let hd = hp.head_dim_k_at(0) as i64;
        let (n_head, nt) = (hp.n_head as i64, b.n_tokens as i64);
        let r = self.dsv4_ratio(il);
        let rp = self.dsv4_rope(r != 0);
        let w = self.blk(il).dsv4();

        let qr = self.cb(ctx.mul_mat(self.t(w.q_a), x), "qr", i);
        let qr = self.rms_norm(qr, self.t(w.q_a_norm), "qr_norm", i); // [q_lora, nt]
        let q = ctx.mul_mat(self.t(w.q_b), qr);
        let q = ctx.reshape(q, &[hd, n_head, nt]).expect("q 3d");
        let q = self.cb(ctx.rms_norm(q, hp.rms_eps), "q_norm", i);
        let q = self.cb(self.rope_tail(q, b.pos, &rp), "q", i); // [hd, n_head, nt]

        let kv = ctx.mul_mat(self.t(w.kv), x);
        let kv = self.rms_norm(kv, self.t(w.kv_a_norm), "kv_norm", i);
        let kv = ctx.reshape(kv, &[hd, 1, nt]).expect("kv 3d");
        let kv = self.cb(self.rope_tail(kv, b.pos, &rp), "kv", i); // [hd, 1, nt]

        let dsv4 = b.dsv4.as_ref();
        let csa = dsv4.and_then(|d| d.csa).filter(|_| r == 4);
        let hca = dsv4.and_then(|d| d.hca).filter(|_| r == 128);
        let comp = |name: &str| self.kv.extra(&format!("dsv4_{name}_l{il}"));
        // The block's compressors, by its table (the same ratio rule as `dsv4_ratio`).
        let (comp_w, lid_w) = match w.comp {
            Dsv4Comp::None => (None, None),
            Dsv4Comp::Hca(c) => (Some(c), None),
            Dsv4Comp::Csa { comp, lid, .. } => (Some(comp), Some(lid)),
        };
        let no_comp = || -> CompW { panic!("block {il} compresses but has no compressor weights") };
        let attn_comp = || {
            let c = comp_w.unwrap_or_else(no_comp);
            Compressor {
                wkv: self.t(c.kv),
                wgate: self.t(c.gate),
                ape: self.t(c.ape),
                norm: self.t(c.norm),
                cache: comp("comp"),
                state_kv: comp("state_kv"),
                state_score: comp("state_score"),
                d: hd,
                rot: None,
            }
        };
        if let Some(inp) = &hca {
            self.dsv4_compress(x, il, inp, 128, attn_comp(), "hca");
        }
        if let Some(inp) = &csa {
            self.dsv4_compress(x, il, inp, 4, attn_comp(), "csa");
            let lw = lid_w.unwrap_or_else(no_comp);
            let lid = Compressor {
                wkv: self.t(lw.kv),
                wgate: self.t(lw.gate),
                ape: self.t(lw.ape),
                norm: self.t(lw.norm),
                cache: comp("lid"),
                state_kv: comp("lid_state_kv"),
                state_score: comp("lid_state_score"),
                d: hp.indexer.head_dim as i64,
                rot: Some(self.kv.extra("dsv4_lid_rot")),
            };
            self.dsv4_compress(x, il, inp, 4, lid, "lid");
        }

        // The raw window: this step's K rows into the cache (Q, then K, then the store).
        self.graph.build_forward(q);
        self.graph.build_forward(kv);
        let kc = self.kv.k(il);
        self.kv_store(kc, ctx.reshape(kv, &[hd, nt]).expect("kv 2d"));
        let mask_swa = b.mask_swa.expect("deepseek4 blocks are windowed");
        let raw = self.kv_view(kc, hd, hd, hd, 1); // [hd, n_kv, 1]
        let row = |t: Tensor<'a>, n: i64| {
            ctx.view(t, &[hd, n, 1], &[t.nb()[1], t.nb()[1] * n as usize], 0)
        };
        // Ratio 4: at most the window plus the top-k rows are finite in any mask row.
        let mut n_kv_max = None;
        let (k_all, mask) = if let Some(inp) = &hca {
            let k = ctx.concat(raw, row(comp("comp"), inp.n_comp as i64), 1);
            (k, ctx.concat(mask_swa, inp.mask, 0))
        } else if let Some(inp) = &csa {
            let top_k = self.dsv4_indexer_top_k(qr, x, il, inp);
            n_kv_max = Some(b.n_kv().min(hp.swa.window as usize) + top_k.ne()[0] as usize);
            let sparse = self.ctx.top_k_mask(inp.mask, top_k);
            let sparse = self.cb(sparse, "csa_top_k_mask", i);
            let k = ctx.concat(raw, row(comp("comp"), inp.n_comp as i64), 1);
            (k, ctx.concat(mask_swa, sparse, 0))
        } else {
            (raw, mask_swa)
        };
        let qp = ctx.permute(q, [0, 2, 1, 3]); // [hd, nt, n_head]
        let o = ctx.flash_attn(qp, k_all, k_all, mask, 1.0 / (hd as f32).sqrt()); // [hd, n_head, nt]
        if let Some(n) = n_kv_max {
            ctx.flash_attn_n_kv_max(o, n);
        }
        ctx.flash_attn_add_sinks(o, self.t(w.sinks));
        let o = ctx.reshape(o, &[hd, n_head, nt]).expect("attn 3d");
        let o = ctx.rope_offset(ctx.rope_back(o, b.pos, &rp), (hd - hp.n_rot as i64) as i32);
        let o = self.cb(o, "attn_derope", i);

        // Grouped low-rank output: group g's heads through its own slice of attn_output_a.
        let g = hp.dsv4.o_group_count as i64;
        let o_lora = hp.dsv4.o_lora_rank as i64;
        let og = hd * n_head / g;
        let o = ctx.permute(
            ctx.reshape(o, &[og, g, nt]).expect("attn groups"),
            [0, 2, 1, 3],
        ); // [og, nt, g]
        let wo_a = ctx
            .reshape(self.t(w.output_a), &[og, o_lora, g])
            .expect("wo_a 3d");
        let oa = self.cb(ctx.mul_mat(wo_a, o), "attn_wo_a", i); // [o_lora, nt, g]
        let oa = ctx.cont(ctx.permute(oa, [0, 2, 1, 3])); // [o_lora, g, nt]
        let oa = ctx.reshape(oa, &[o_lora * g, nt]).expect("wo_a out 2d");
        self.cb(ctx.mul_mat(self.t(w.output_b), oa), "attn_out", i)
    }

    /// One compressor's step: projections and scores of this step's tokens, the compressed rows
    /// completed (softmax-weighted sums over their windows, RMS-normed, RoPE'd at their first
    /// position) written to the cache, and the ring updated.
    fn dsv4_compress(
        &self,
        x: Tensor<'a>,
        il: usize,
        inp: &CompInputs<'a>,
        r: usize,
        c: Compressor<'a>,
        name: &str,
    ) {
        let ctx = self.ctx;
        let i = il as i32;
        let (d, r, nb) = (c.d, r as i64, inp.n_blocks as i64);
        let kv = self.cb(ctx.mul_mat(c.wkv, x), &format!("{name}_state_kv"), i); // [coff·d, nt]
        let score = ctx.add(ctx.mul_mat(c.wgate, x), ctx.get_rows(c.ape, inp.state_pos));
        let score = self.cb(score, &format!("{name}_state_score"), i);
        let mut src_kv = ctx.concat(c.state_kv, kv, 1); // [coff·d, ring + nt]
        let mut src_score = ctx.concat(c.state_score, score, 1);
        let overlap = r == 4;
        if overlap {
            // Position < 0 of the first window's previous half: zero projections, −∞ scores.
            let w = src_kv.ne()[0];
            let first = |t: Tensor<'a>| ctx.view(t, &[w, 1], &[t.nb()[1]], 0);
            src_kv = ctx.concat(src_kv, ctx.scale(first(src_kv), 0.0), 1);
            src_score = ctx.concat(
                src_score,
                ctx.scale_bias(first(src_score), 0.0, f32::NEG_INFINITY),
                1,
            );
        }
        let rows_kv = ctx.get_rows(src_kv, inp.read); // [coff·d, reads]
        let rows_score = ctx.get_rows(src_score, inp.read);
        let windows = |rows: Tensor<'a>| {
            if overlap {
                // Previous windows' first halves, then current windows' second halves.
                let n = r * nb;
                let half = |off: usize| {
                    let v = ctx.view(rows, &[d, n], &[rows.nb()[1]], off);
                    ctx.reshape(ctx.cont(v), &[d, r, nb]).expect("window")
                };
                let cur = half(n as usize * rows.nb()[1] + d as usize * 4);
                ctx.concat(half(0), cur, 1) // [d, 2r, nb]
            } else {
                ctx.reshape(rows, &[d, r, nb]).expect("window") // [d, r, nb]
            }
        };
        let values = ctx.cont(ctx.permute(windows(rows_kv), [1, 0, 2, 3])); // [w, d, nb]
        let weights = ctx.soft_max(ctx.cont(ctx.permute(windows(rows_score), [1, 0, 2, 3])));
        let comp = ctx.sum_rows(ctx.mul(values, weights)); // [1, d, nb]
        let comp = ctx.cont(ctx.permute(comp, [1, 0, 2, 3])); // [d, 1, nb]
        let comp = self.rms_norm(comp, c.norm, &format!("{name}_state_compress"), i);
        let rp = self.dsv4_rope(true);
        let comp = self.rope_tail(comp, inp.write_pos, &rp);
        let comp = match c.rot {
            Some(rot) => ctx.mul_mat_hadamard(rot, comp),
            None => comp,
        };
        let comp = ctx.reshape(comp, &[d, nb]).expect("compressed 2d");
        self.graph
            .build_forward(ctx.set_rows(c.cache, comp, inp.write));
        // The ring keeps this step's last positions (after the reads above: graph order).
        for (state, cur) in [(c.state_kv, kv), (c.state_score, score)] {
            let kept = ctx.get_rows(cur, inp.persist_src);
            self.graph
                .build_forward(ctx.set_rows(state, kept, inp.persist_dst));
        }
    }

    /// The lightning indexer of ratio-4 block `il`: for each token, the `indexer.top_k`
    /// compressed rows (of those it may see) with the highest `Σ_h relu(q_h·k)·w_h`
    /// -> i32 [k, nt].
    fn dsv4_indexer_top_k(
        &self,
        qr: Tensor<'a>,
        x: Tensor<'a>,
        il: usize,
        inp: &CompInputs<'a>,
    ) -> Tensor<'a> {
        let (hp, ctx, b) = (self.hp, self.ctx, self.batch);
        let i = il as i32;
        let (d, h, nt) = (
            hp.indexer.head_dim as i64,
            hp.indexer.n_head as i64,
            b.n_tokens as i64,
        );
        let Dsv4Comp::Csa { q_b, proj, .. } = self.blk(il).dsv4().comp else {
            panic!("block {il} has no lightning indexer in its architecture's table")
        };
        let q = ctx.mul_mat(self.t(q_b), qr);
        let q = ctx.reshape(q, &[d, h, nt]).expect("indexer q");
        let q = self.rope_tail(q, b.pos, &self.dsv4_rope(true));
        let q = self.cb(
            ctx.mul_mat_hadamard(self.kv.extra("dsv4_lid_rot"), q),
            "lid_q_rot",
            i,
        ); // [d, h, nt]
        let w = ctx.mul_mat(self.t(proj), x);
        let w = self.cb(
            ctx.scale(w, 1.0 / ((d * h) as f32).sqrt()),
            "lid_weights",
            i,
        ); // [h, nt]
        let cache = self.kv.extra(&format!("dsv4_lid_l{il}"));
        let n = inp.n_comp as i64;
        let k = ctx.view(cache, &[d, 1, n], &[cache.nb()[1], cache.nb()[1]], 0); // [d, 1, n]
        let scores = self.cb(
            ctx.lightning_indexer(q, k, w, inp.mask),
            "lid_score_masked",
            i,
        ); // [n, nt]
        let k = (hp.indexer.top_k as usize).min(n as usize);
        self.cb(ctx.cont(ctx.top_k(scores, k)), "lid_top_k", i)
    }
}
