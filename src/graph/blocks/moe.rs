//! The routed-expert FFN (llama.cpp `build_moe_ffn`): router logits, gating (softmax / sigmoid /
//! softmax over the selected), optional selection bias (`exp_probs_b`), top-k, weight
//! renormalisation and scaling, then up/gate/down through `mul_mat_id` and the weighted sum over
//! the selected experts. Shared experts are added by the caller's arch file.
//!
//! This is the seam of docs/design.md §4.2: the graph runs the selected experts through a
//! [`RoutedExperts`] — [`Resident`] here, from the model's weights; the offloaded experts
//! implement it in `experts` — so architecture files never change, and `graph` never names the
//! offload path.
use crate::ggml::Tensor;
use crate::graph::GraphBuilder;
use crate::model::hparams::Gating;
use crate::model::Hparams;

/// The experts' activation.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ExpertAct {
    /// `silu(gate) * up`.
    Swiglu,
    /// gpt-oss: clamped SwiGLU with alpha 1.702, limit 7.
    SwigluOai,
    /// DeepSeek-V4: `silu(min(gate, l)) * clamp(up, -l, l)` (`swiglu_clamp_exp`; a limit of at
    /// most 1e-6 is no clamp, as llama.cpp).
    SwigluClamp(f32),
}

/// Per-architecture MoE settings (from the hyper-parameters, with arch overrides).
#[derive(Debug, Clone, Copy)]
pub struct MoeOpts {
    pub act: ExpertAct,
    pub gating: Gating,
    /// Renormalise the selected weights to sum to 1.
    pub norm_w: bool,
    /// Multiply the weights by this (0 or 1 = no scaling).
    pub scale: f32,
}

impl MoeOpts {
    /// Routing as the architecture's rules settled it in `hp` (gating, top-k weight
    /// normalisation: `model::arch::Rules`), with activation `act` and weight scale `scale`.
    pub fn new(hp: &Hparams, act: ExpertAct, scale: f32) -> Self {
        Self {
            act,
            gating: hp.gating,
            norm_w: hp.expert_weights_norm,
            scale,
        }
    }
}

/// The router's decision for a micro-batch.
#[derive(Clone, Copy)]
pub struct Routing<'a> {
    /// i32 [k, n_tokens]: expert ids, best first.
    pub selected: Tensor<'a>,
    /// f32 [1, k, n_tokens]: their weights (after renormalisation and scaling).
    pub weights: Tensor<'a>,
}

/// Runs a block's routed experts once its router has chosen them: where the experts' weights
/// live, and how the graph reaches them. The graph builder holds one ([`GraphBuilder::experts`]).
pub trait RoutedExperts {
    /// The selected experts' FFN of block `il` on `x` [n_embd, n_tokens], weighted by the
    /// routing `r` and summed over each token's k experts: [n_embd, n_tokens].
    fn ffn<'a>(
        &'a self,
        g: &GraphBuilder<'a>,
        x: Tensor<'a>,
        il: usize,
        r: &Routing<'a>,
        opts: &MoeOpts,
    ) -> Tensor<'a>;
}

/// Every routed expert resident with the model's weights: `mul_mat_id` on `ffn_*_exps`.
pub struct Resident;

impl RoutedExperts for Resident {
    fn ffn<'a>(
        &'a self,
        g: &GraphBuilder<'a>,
        x: Tensor<'a>,
        il: usize,
        r: &Routing<'a>,
        opts: &MoeOpts,
    ) -> Tensor<'a> {
        g.resident_experts(x, il, r, opts)
    }
}

impl<'a> GraphBuilder<'a> {
    /// Routed experts of block `il` on `x` [n_embd, n_tokens] -> [n_embd, n_tokens]: the router
    /// ([`Self::route`]), then the experts ([`Self::routed_experts`], the offload seam).
    pub fn moe(&self, x: Tensor<'a>, il: usize, opts: &MoeOpts) -> Tensor<'a> {
        self.moe_selected(x, il, opts, None)
    }

    /// [`Self::moe`] with the experts chosen before the router (`selected` i32 [k, n_tokens]:
    /// DeepSeek-V4's hash layers pick them by token id); the router still weighs them.
    pub fn moe_selected(
        &self,
        x: Tensor<'a>,
        il: usize,
        opts: &MoeOpts,
        selected: Option<Tensor<'a>>,
    ) -> Tensor<'a> {
        let r = self.route(x, il, opts, selected);
        self.routed_experts(x, il, &r, opts)
    }

    /// The router of block `il`: which experts each token uses (the router's top-k, or
    /// `preselected`), and with what weight.
    pub fn route(
        &self,
        x: Tensor<'a>,
        il: usize,
        opts: &MoeOpts,
        preselected: Option<Tensor<'a>>,
    ) -> Routing<'a> {
        let ctx = self.ctx;
        let ili = il as i32;
        let w = self.blk(il).moe();
        let mut logits = ctx.mul_mat(self.t(w.router), x); // [n_expert, nt]
        if opts.gating == Gating::SqrtSoftplus {
            // As llama.cpp does for this gating: the router's matmul accumulates in F32.
            ctx.prec_f32(logits);
        }
        if let Some(b) = self.t_opt(w.router_bias) {
            logits = ctx.add(logits, b);
        }
        let logits = self.cb(logits, "ffn_moe_logits", ili);
        let probs = match opts.gating {
            Gating::Softmax => ctx.soft_max(logits),
            Gating::Sigmoid => ctx.sigmoid(logits),
            Gating::SoftmaxWeight => logits,
            // DeepSeek-V4's scoring (llama.cpp `LLAMA_EXPERT_GATING_FUNC_TYPE_SQRT_SOFTPLUS`).
            Gating::SqrtSoftplus => ctx.sqrt(ctx.softplus(logits)),
        };
        let probs = self.cb(probs, "ffn_moe_probs", ili); // [n_expert, nt]
        let selected = match preselected {
            Some(s) => self.cb(s, "ffn_moe_topk", ili),
            None => self.top_k_experts(probs, il),
        }; // i32 [k, nt]
        self.expert_weights(probs, selected, il, opts)
    }

    /// The router's choice from its probabilities `probs` [n_expert, nt]: plus the selection
    /// bias, group-limited where the model groups its experts, top-k -> i32 [k, nt].
    fn top_k_experts(&self, probs: Tensor<'a>, il: usize) -> Tensor<'a> {
        let (ctx, hp) = (self.ctx, self.hp);
        let ili = il as i32;
        let nt = self.batch.n_tokens as i64;
        let k = hp.n_expert_used as i64;
        let selection = match self.t_opt(self.blk(il).moe().probs_bias) {
            Some(b) => self.cb(ctx.add(probs, b), "ffn_moe_probs_biased", ili),
            None => probs,
        };
        let selection = if hp.n_expert_groups > 1 && hp.n_group_used > 0 && nt > 0 {
            self.group_limited(selection, il)
        } else {
            selection
        };
        self.cb(
            ctx.argsort_top_k(selection, k as usize),
            "ffn_moe_topk",
            ili,
        ) // i32 [k, nt]
    }

    /// The weights of the `selected` experts from `probs`: (softmax over the selected,)
    /// renormalised, scaled.
    fn expert_weights(
        &self,
        probs: Tensor<'a>,
        selected: Tensor<'a>,
        il: usize,
        opts: &MoeOpts,
    ) -> Routing<'a> {
        let (ctx, hp) = (self.ctx, self.hp);
        let ili = il as i32;
        let nt = self.batch.n_tokens as i64;
        let (n_expert, k) = (hp.n_expert as i64, hp.n_expert_used as i64);
        let probs3 = ctx
            .reshape(probs, &[1, n_expert, nt])
            .expect("probs reshape"); // [1, n_expert, nt]
        let mut weights = self.cb(ctx.get_rows(probs3, selected), "ffn_moe_weights", ili); // [1, k, nt]
        if opts.gating == Gating::SoftmaxWeight {
            let w2 = ctx.reshape(weights, &[k, nt]).expect("weights 2d");
            weights = ctx
                .reshape(ctx.soft_max(w2), &[1, k, nt])
                .expect("weights 3d");
        }
        if opts.norm_w {
            let w2 = ctx.reshape(weights, &[k, nt]).expect("weights 2d"); // [k, nt]
            let sum = ctx.clamp(ctx.sum_rows(w2), 6.103_515_6e-5, f32::INFINITY); // [1, nt]
            weights = ctx
                .reshape(ctx.div(w2, sum), &[1, k, nt])
                .expect("weights 3d");
            weights = self.cb(weights, "ffn_moe_weights_norm", ili);
        }
        if opts.scale != 0.0 && opts.scale != 1.0 {
            weights = self.cb(
                ctx.scale(weights, opts.scale),
                "ffn_moe_weights_scaled",
                ili,
            );
        }
        // In the graph before any expert matmul: the offload path reads the routing here.
        self.graph.build_forward(weights);
        Routing { selected, weights }
    }

    /// DeepSeek-V3 group-limited routing (llama.cpp `build_moe_ffn`, `n_expert_groups > 1`): the
    /// experts form `n_expert_groups` equal groups, a group scores the sum of its two best
    /// selection values, and only the `n_group_used` best groups stay selectable (the others
    /// become -inf). `selection` [n_expert, nt] -> [n_expert, nt].
    fn group_limited(&self, selection: Tensor<'a>, il: usize) -> Tensor<'a> {
        let (ctx, hp) = (self.ctx, self.hp);
        let nt = self.batch.n_tokens as i64;
        let n_expert = hp.n_expert as i64;
        let n_groups = hp.n_expert_groups as i64;
        let per = n_expert / n_groups;
        let groups = ctx
            .reshape(selection, &[per, n_groups, nt])
            .expect("expert groups"); // [per, n_groups, nt]
        let top2 = ctx.argsort_top_k(groups, 2); // i32 [2, n_groups, nt]
        let groups4 = ctx
            .reshape(groups, &[1, per, n_groups, nt])
            .expect("expert groups 4d"); // [1, per, n_groups, nt]
        let top2 = ctx.get_rows(groups4, top2); // [1, 2, n_groups, nt]
        let top2 = ctx.reshape(top2, &[2, n_groups, nt]).expect("top2 3d"); // [2, n_groups, nt]
        let scores = ctx.sum_rows(top2); // [1, n_groups, nt]
        let scores = ctx.reshape(scores, &[n_groups, nt]).expect("scores 2d"); // [n_groups, nt]
        let best = self.cb(
            ctx.argsort_top_k(scores, hp.n_group_used as usize),
            "ffn_moe_group_topk",
            il as i32,
        ); // i32 [n_group_used, nt]
        let kept = ctx.get_rows(groups, best); // [per, n_group_used, nt]
        let masked = ctx.set_rows(ctx.fill(groups, f32::NEG_INFINITY), kept, best); // [per, n_groups, nt]
        let masked = ctx.reshape(masked, &[n_expert, nt]).expect("masked 2d"); // [n_expert, nt]
        self.cb(masked, "ffn_moe_probs_masked", il as i32)
    }

    /// The selected experts' FFN, weighted and summed over the k experts of each token, through
    /// the builder's [`RoutedExperts`]: resident here; offloaded ones (docs/design.md §4.2) run
    /// through the expert cache, implemented with the offloaded experts.
    pub fn routed_experts(
        &self,
        x: Tensor<'a>,
        il: usize,
        r: &Routing<'a>,
        opts: &MoeOpts,
    ) -> Tensor<'a> {
        self.experts.ffn(self, x, il, r, opts)
    }

    /// [`Self::routed_experts`] from the model's own expert weights (ids straight from the
    /// router).
    pub fn resident_experts(
        &self,
        x: Tensor<'a>,
        il: usize,
        r: &Routing<'a>,
        opts: &MoeOpts,
    ) -> Tensor<'a> {
        // Resident experts run only where the engine kept them in the weights.
        let e = self.blk(il).moe().exps.unwrap_or_else(|| {
            panic!("block {il}'s routed experts are not in the weights (offloaded)")
        });
        let w = [Some(self.t(e.up)), self.t_opt(e.gate), Some(self.t(e.down))];
        let t = ExpertTensors {
            w,
            biases: self.expert_biases(il),
        };
        let ids = [r.selected; 3];
        self.expert_ffn(&t, x, il, ids, r.selected, r.weights, opts)
    }

    /// Block `il`'s optional per-expert biases (up, gate, down), resident in every mode.
    pub fn expert_biases(&self, il: usize) -> [Option<Tensor<'a>>; 3] {
        self.blk(il).moe().exps_bias.map(|b| self.t_opt(b))
    }

    /// up/gate/down through `mul_mat_id` with expert ids `ids` (per matrix, into `t.w`'s third
    /// dimension),
    /// per-expert biases picked by `bias_ids`, the activation, and the `weights`-weighted sum
    /// over the k experts of each token: `x` [n_embd, nt] -> [n_embd, nt].
    #[allow(clippy::too_many_arguments)]
    pub fn expert_ffn(
        &self,
        t: &ExpertTensors<'a>,
        x: Tensor<'a>,
        il: usize,
        ids: [Tensor<'a>; 3],
        bias_ids: Tensor<'a>,
        weights: Tensor<'a>,
        opts: &MoeOpts,
    ) -> Tensor<'a> {
        let dims = FfnDims {
            n_embd: self.hp.n_embd as i64,
            k: self.hp.n_expert_used as i64,
            nt: self.batch.n_tokens as i64,
        };
        let name = |y: Tensor<'a>, n: &str| self.cb(y, n, il as i32);
        expert_ffn(
            self.ctx, t, x, dims, ids, bias_ids, weights, opts.act, &name,
        )
    }
}

/// Sizes of an expert FFN call: model width, experts per token, tokens.
#[derive(Debug, Clone, Copy)]
pub struct FfnDims {
    pub n_embd: i64,
    pub k: i64,
    pub nt: i64,
}

/// The expert FFN on any context (the graph builder's, or the CPU channel's own): see
/// [`GraphBuilder::expert_ffn`]; `name` names intermediates.
#[allow(clippy::too_many_arguments)]
pub fn expert_ffn<'a>(
    ctx: &'a crate::ggml::Context,
    t: &ExpertTensors<'a>,
    x: Tensor<'a>,
    d: FfnDims,
    ids: [Tensor<'a>; 3],
    bias_ids: Tensor<'a>,
    weights: Tensor<'a>,
    act_kind: ExpertAct,
    name: &dyn Fn(Tensor<'a>, &str) -> Tensor<'a>,
) -> Tensor<'a> {
    let experts = expert_outputs(ctx, t, x, d, ids, bias_ids, act_kind, name);
    let FfnDims { n_embd, k, nt } = d;
    let experts = name(ctx.mul(experts, weights), "ffn_moe_weighted");
    // Sum over the k selected experts: views of [n_embd, nt] at stride nb1.
    let row = experts.ne()[0] as usize * 4;
    let view = |i: i64| {
        ctx.view(
            experts,
            &[n_embd, nt],
            &[row * k as usize],
            i as usize * row,
        )
    }; // [n_embd, nt]
    let mut out = view(0);
    for i in 1..k {
        out = ctx.add(out, view(i));
    }
    if k == 1 {
        out = ctx.cont(out);
    }
    name(out, "ffn_moe_out")
}

/// Each selected expert's output, unweighted, [n_embd, k, nt]: the part of [`expert_ffn`]
/// before the router weights. The CPU channel stops here and sums on the host: on ggml's CPU
/// backend the weighting (a broadcast `mul`, an integer modulo per element) and the k - 1 adds
/// are k nodes, each a barrier of the job's threads.
#[allow(clippy::too_many_arguments)]
pub fn expert_outputs<'a>(
    ctx: &'a crate::ggml::Context,
    t: &ExpertTensors<'a>,
    x: Tensor<'a>,
    d: FfnDims,
    ids: [Tensor<'a>; 3],
    bias_ids: Tensor<'a>,
    act_kind: ExpertAct,
    name: &dyn Fn(Tensor<'a>, &str) -> Tensor<'a>,
) -> Tensor<'a> {
    let FfnDims { n_embd, nt, .. } = d;
    let x3 = ctx.reshape(x, &[n_embd, 1, nt]).expect("x reshape"); // [n_embd, 1, nt]

    // Optional per-expert biases (gpt-oss), added for the selected experts.
    let biased = |y: Tensor<'a>, m: usize| match t.biases[m] {
        Some(b) => ctx.add_id(y, b, bias_ids),
        None => y,
    };
    let [up_w, gate_w, down_w] = t.w;
    let up_w = up_w.expect("experts have an up matrix");
    let down_w = down_w.expect("experts have a down matrix");
    let [up_ids, gate_ids, down_ids] = ids;
    let up = ctx.mul_mat_id(up_w, x3, up_ids); // [n_ff, k, nt]
    let up = name(biased(up, 0), "ffn_moe_up");
    let act = match gate_w {
        Some(gate) => {
            let g = name(
                biased(ctx.mul_mat_id(gate, x3, gate_ids), 1),
                "ffn_moe_gate",
            );
            match act_kind {
                ExpertAct::SwigluClamp(l) if l > 1e-6 => {
                    name(ctx.swiglu_clamp(g, up, l), "ffn_moe_swiglu_limited")
                }
                ExpertAct::Swiglu | ExpertAct::SwigluClamp(_) => {
                    name(ctx.swiglu_split(g, up), "ffn_moe_swiglu")
                }
                ExpertAct::SwigluOai => {
                    name(ctx.swiglu_oai(g, up, 1.702, 7.0), "ffn_moe_swiglu_oai")
                }
            }
        }
        None => name(ctx.silu(up), "ffn_moe_silu"),
    };
    let experts = name(ctx.mul_mat_id(down_w, act, down_ids), "ffn_moe_down"); // [n_embd, k, nt]
    name(biased(experts, 2), "ffn_moe_down_biased")
}

/// The expert matrices (up, gate, down) and their optional biases, [ne0, ne1, n] each.
pub struct ExpertTensors<'a> {
    pub w: [Option<Tensor<'a>>; 3],
    pub biases: [Option<Tensor<'a>>; 3],
}
