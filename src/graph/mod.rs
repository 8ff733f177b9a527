//! Graph building: [`GraphBuilder`] holds one step's ggml context, the weights, the KV cache and
//! the batch inputs; blocks (`blocks/`) are its methods; each architecture's builder (in its file
//! of [`crate::arch`]) only strings blocks together (docs/design.md §3.1).
//!
//! Tensor names follow llama.cpp's `cb(cur, "name", il)` convention (`attn_norm-3`,
//! `ffn_moe_out-12`) so a debug dump diffs by name against the reference.
pub mod blocks;
pub mod dsv4;
pub mod kv;
pub mod layers;
pub mod step;
pub mod weights;

use crate::ggml::{Context, Graph, Tensor};
use crate::model::Hparams;
use kv::KvCache;
use layers::Block;
use weights::{Weights, W};

/// The inputs of one micro-batch (created by the engine, filled after allocation).
#[derive(Clone, Copy)]
pub struct BatchInputs<'a> {
    /// i32 [n_tokens]
    pub tokens: Tensor<'a>,
    /// i32 [n_tokens]
    pub pos: Tensor<'a>,
    /// f16 [n_kv, n_tokens]: 0 where a token may attend, -inf elsewhere.
    pub mask: Tensor<'a>,
    /// The same for sliding-window blocks (present when the model has a window).
    pub mask_swa: Option<Tensor<'a>>,
    /// i64 [n_tokens]: the cache row each token's K/V goes to (`n_past + i`); an input rather
    /// than a view offset, so the graph is the same at every decode step.
    pub kv_idx: Tensor<'a>,
    pub n_tokens: usize,
    /// Cache positions attention reads: `n_past + n_tokens` rounded up to a multiple of
    /// [`KV_PAD`] (capped at the context), the rest masked. A stable shape across decode steps
    /// lets ggml-cuda replay its CUDA graph instead of rebuilding it every token.
    pub n_kv: usize,
    /// The first cache row attention reads: it reads rows `kv_lo..kv_lo + n_kv` (the mask's
    /// columns). 0 but for a multi-sequence pass whose sequences all sit above the cache's
    /// bottom (`engine::batch`): rows below them would only be masked, at full cost.
    pub kv_lo: usize,
    /// Compute logits for the last position only (prompt processing).
    pub last_only: bool,
    /// i32 [n_outputs]: compute logits for these batch positions only (multi-sequence batches,
    /// `engine::batch`); overrides `last_only`.
    pub out_ids: Option<Tensor<'a>>,
    /// Output the final normed hidden state (`result_norm`, llama.cpp's `t_embd`, what its
    /// embeddings pool) of the selected positions instead of their logits: the head is skipped.
    pub embd: bool,
    /// DeepSeek-V4's compressor inputs (models with compressed blocks).
    pub dsv4: Option<dsv4::Dsv4Inputs<'a>>,
    /// f32 [n_embd, n_tokens]: the tokens' embedding rows, looked up on the host, in place of
    /// the graph's lookup (a gated decode graph: the lookup would be a CPU piece of its own where
    /// the embedding stays in host memory, as it does when offloading).
    pub embd_rows: Option<Tensor<'a>>,
}

pub use crate::model::placement::KV_PAD;

impl BatchInputs<'_> {
    /// Cache positions attention reads (see the field).
    pub fn n_kv(&self) -> usize {
        self.n_kv
    }

    /// `n_past + n_tokens` padded to [`KV_PAD`], at most `n_ctx`.
    pub fn padded_n_kv(n_past: usize, n_tokens: usize, n_ctx: usize) -> usize {
        (n_past + n_tokens)
            .div_ceil(KV_PAD)
            .saturating_mul(KV_PAD)
            .min(n_ctx)
            .max(n_past + n_tokens)
    }
}

pub struct GraphBuilder<'a> {
    pub ctx: &'a Context,
    pub w: &'a Weights,
    pub kv: &'a KvCache,
    pub hp: &'a Hparams,
    pub batch: BatchInputs<'a>,
    pub graph: Graph<'a>,
    /// Where the routed experts run: [`blocks::Resident`], or the offloaded experts
    /// (docs/design.md §4), which record what their step hook needs as the graph is built.
    pub experts: &'a dyn blocks::RoutedExperts,
}

/// `name` tagged to run on device `d` whatever its block (expert parallelism: one device's
/// share of a layer's routed experts): `name@d`, which the layer split's assignment
/// (`engine::split`) reads before the block index.
pub fn tag_device(name: &str, d: usize) -> String {
    format!("{name}@{d}")
}

/// The device a node's name is tagged with ([`tag_device`]).
pub fn device_tag(name: &str) -> Option<usize> {
    name.rsplit_once('@')?.1.parse().ok()
}

impl<'a> GraphBuilder<'a> {
    /// Names `t` as llama.cpp would (`name-il`, or `name` for il < 0).
    pub fn cb(&self, t: Tensor<'a>, name: &str, il: i32) -> Tensor<'a> {
        if il >= 0 {
            t.set_name(&format!("{name}-{il}"))
        } else {
            t.set_name(name)
        }
    }

    /// The tensor of weight `h`.
    pub fn t(&self, h: W) -> Tensor<'a> {
        self.w.t(h)
    }

    /// [`Self::t`] of an optional weight.
    pub fn t_opt(&self, h: Option<W>) -> Option<Tensor<'a>> {
        h.map(|h| self.w.t(h))
    }

    /// Block `il`'s weights, by type (resolved when the weights were declared).
    pub fn blk(&self, il: usize) -> &'a Block {
        self.w.layers().block(il)
    }

    pub fn add(&self, a: Tensor<'a>, b: Tensor<'a>, name: &str, il: i32) -> Tensor<'a> {
        self.cb(self.ctx.add(a, b), name, il)
    }

    /// Ends the graph with `t` as its output.
    pub fn finish(&self, t: Tensor<'a>) {
        self.ctx.set_output(t);
        self.graph.build_forward(t);
    }
}

impl<'a> GraphBuilder<'a> {
    /// The pre-norm decoder stack most MoE architectures share, for every decode block `il`:
    /// `x += attention(rms_norm(x, attn_norm))`, then `x += ffn(rms_norm(x, <ffn_norm>), il)`,
    /// and the output head. Architecture files pick the attention options and the FFN (routed
    /// experts, plus shared experts where the model has them); the pre-FFN norm is the block's
    /// (`ffn_norm`, or `post_attention_norm` where the table names it so).
    pub fn pre_norm_decoder(
        &self,
        attn: &blocks::AttnOpts,
        ffn: impl Fn(&Self, Tensor<'a>, usize) -> Tensor<'a>,
    ) -> Tensor<'a> {
        self.pre_norm_decoder_with(|g, h, il| g.attention(h, il, attn), ffn)
    }

    /// [`Self::pre_norm_decoder`] with the attention block chosen by the architecture (MLA).
    pub fn pre_norm_decoder_with(
        &self,
        attn: impl Fn(&Self, Tensor<'a>, usize) -> Tensor<'a>,
        ffn: impl Fn(&Self, Tensor<'a>, usize) -> Tensor<'a>,
    ) -> Tensor<'a> {
        let mut x = self.embed(); // [n_embd, n_tokens]
        for il in 0..self.hp.n_layer_decode() {
            let i = il as i32;
            let w = self.blk(il);
            let h = self.rms_norm(x, self.t(w.attn_norm), "attn_norm", i);
            let h = attn(self, h, il);
            let ffn_inp = self.add(h, x, "ffn_inp", i);
            let h = self.rms_norm(ffn_inp, self.t(w.ffn_norm), "ffn_norm", i);
            let h = ffn(self, h, il);
            x = self.add(h, ffn_inp, "l_out", i);
        }
        self.output(x) // [n_vocab, n_tokens]
    }
}
