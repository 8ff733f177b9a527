//! Synthetic routing calibrated to real routers: static popularity skew plus a context channel
//! that gives decode routing the temporal locality of real models.
//!
//! **Target** (third-party measurements of real Qwen3-30B-A3B, not ours): a per-layer LRU over
//! 40% of the experts hits 90–95% with a median reuse distance of about 2 tokens
//! (github.com/kekzl/imp issue #1359); over 15% / 30% / 50% of the experts it hits about
//! 74% / 89% / 96% (kekzl/imp#1374); nearly every expert is used within ~1.3k tokens
//! (llama.cpp issue #28545).
//!
//! **Popularity.** With skew `s`, expert `e` of popularity rank `r_e` (a seeded random
//! permutation per layer) gets its router row scaled by `m_e = exp(-s * r_e / n_expert)`: the
//! logit `w_e·h` is Gaussian with standard deviation proportional to `m_e`, so wider experts reach
//! the top-k more often ([`multipliers`]). Popularity alone cannot give the curve: skewed enough
//! to hit 74% at 15%, a tenth of the experts are never used (skew 2.8: ~80 of 128 touched in
//! 4096 tokens).
//!
//! **Locality: the context channel** ([`ContextChannel`], Qwen3-style models: per-head q/k RMS
//! norms, NEOX RoPE). Random weights give none: the token embedding dominates the residual
//! stream, so consecutive tokens route independently. The channel is a real, slowly varying,
//! context-dependent component of every router's input, computed by the ordinary graph (ours and
//! libllama's alike, from the file):
//! 1. Residual dimension 0 is a constant: every token embedding holds `+emb_std` there and no
//!    output projection (attention output, expert down projections) writes into it; routers do
//!    not read it.
//! 2. In block 0, the query heads of kv group 0 and kv head 0 read only that constant, on a few
//!    rotary pairs with frequencies in [`KERNEL_FREQS`]; after the per-head RMS norm their q and k
//!    are the same constant vector at every position, so RoPE turns the attention logit into a
//!    function of distance alone, `S * mean_i cos(Δ θ_i)`, a recency kernel
//!    (S = [`KERNEL_SHARPNESS`], set by the q/k norm gain on those dimensions; no other head uses
//!    them). These heads average the values of the last ~50 tokens (participation ratio; weight
//!    beyond 64 tokens ~3%, bounded at any context length), a moving average that drifts slowly.
//! 3. Their output columns are scaled so the average enters the residual stream at
//!    [`CONTEXT_STRENGTH`] times the embeddings' RMS (times `skew / DEFAULT_SKEW`): every later
//!    router sees it, so consecutive tokens share most experts while over hundreds of tokens the
//!    average wanders through the whole space and every expert gets its turn.
//!
//! **Calibration** (tests/synth_routing.rs, through the real engine on the `routing-tiny`
//! preset — Qwen3-30B-A3B's 128 experts, top-8, head dim 128, RoPE base 1e6 — with a fresh
//! random token at every decode step, 400 steps, mean over layers): the default gives LRU
//! 15% / 30% / 50% -> 0.74 / 0.90 / 0.94 (seeds 1, 2, 11: 0.73–0.75 / 0.89–0.90 / 0.93–0.94), and a
//! 4096-token prompt touches 125–128 of each layer's 128 experts. `--routing-skew 0` is the hard
//! case, unchanged: uniform popularity and no channel, LRU 0.13 / 0.29 / 0.50 (about the
//! capacity share), every expert used. The channel's strength scales with the skew, so the hit
//! rate rises with it (2.8: 0.93 / 0.97 / 0.98, but only ~80 experts touched).
//!
//! [`simulate_lru_hit_rate`] models popularity alone (independent tokens).
use crate::util::Rng;

/// Default `--routing-skew`: with the context channel it reproduces real Qwen3-30B-A3B decode
/// routing, per-layer LRU at 15% / 30% / 50% of the experts -> ~0.74 / 0.90 / 0.94 (real: ~74% /
/// 89% / 96%), nearly every expert used in 4096 tokens (module docs). 0 is the hard case (uniform,
/// no channel: ~0.13 / 0.29 / 0.50).
pub const DEFAULT_SKEW: f32 = 1.0;

/// Band of rotary frequencies (radians per token) the recency kernel uses.
pub const KERNEL_FREQS: (f32, f32) = (0.001, 0.01);
/// The recency kernel's logit at distance 0 (its sharpness).
pub const KERNEL_SHARPNESS: f32 = 64.0;
/// RMS of the context channel per residual dimension, relative to the token embeddings', at
/// [`DEFAULT_SKEW`] (proportional to the skew).
pub const CONTEXT_STRENGTH: f32 = 5.0;

/// Router-row multipliers for one layer: `m[e]` for expert `e`.
pub fn multipliers(n_expert: usize, skew: f32, rng: &mut Rng) -> Vec<f32> {
    let mut rank: Vec<usize> = (0..n_expert).collect();
    for i in (1..n_expert).rev() {
        let j = (rng.next_u64() % (i as u64 + 1)) as usize;
        rank.swap(i, j);
    }
    rank.iter()
        .map(|&r| (-skew * r as f32 / n_expert as f32).exp())
        .collect()
}

/// How the context channel changes one tensor's values (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Edit {
    /// Every row's element 0 is set to this value (token embeddings: the constant dimension).
    SetCol0(f32),
    /// Every row's element 0 is zeroed (routers read nothing from the constant dimension).
    ZeroCol0,
    /// Rows `r` with `r % period == 0` are zeroed (output projections: nothing writes into the
    /// constant dimension).
    ZeroRowsEvery(usize),
    /// Block 0's query (`kv = false`) or key (`kv = true`) projection: the positional heads read
    /// only the constant dimension, on the rotary dimensions of the kernel; no other head uses
    /// those dimensions.
    QkProj { kv: bool },
    /// Block 0's q/k norm gain: `gain` on the kernel's rotary dimensions.
    QkNorm { gain: f32 },
    /// Block 0's attention output: row 0 zeroed, the positional heads' columns scaled.
    OutProj { scale: f32 },
}

/// The context channel of a synthetic model (module docs): which heads and rotary dimensions
/// carry it and how strongly.
#[derive(Debug, Clone)]
pub struct ContextChannel {
    pub n_embd: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    /// Rotary dimensions (NEOX layout: pair `i` is dimensions `i` and `i + head_dim / 2`) of the
    /// recency kernel.
    pub dims: Vec<usize>,
    /// q/k norm gain on `dims`: the kernel's logit at distance 0 is `gain^2 * sqrt(head_dim)`.
    pub qk_gain: f32,
    /// Value of the constant residual dimension (0) in every token embedding.
    pub bias: f32,
    /// Scale of the positional heads' output columns (relative to the random init).
    pub out_scale: f32,
}

impl ContextChannel {
    /// The channel for a model of hyper-parameters `h` whose embeddings have standard deviation
    /// `emb_std`, at routing skew `skew`; `None` where the architecture has none (only Qwen3's
    /// per-head q/k norms with NEOX RoPE are handled) or `skew` is 0 (the hard case).
    pub fn new(h: &crate::model::hparams::Hparams, skew: f32, emb_std: f32) -> Option<Self> {
        if skew <= 0.0 || !crate::arch::of(h.arch).synth.context_channel {
            return None;
        }
        let d = h.head_dim_k as usize;
        if d != h.n_rot as usize
            || d < 8
            || h.n_head_kv == 0
            || !h.n_head.is_multiple_of(h.n_head_kv)
        {
            return None;
        }
        let (lo, hi) = KERNEL_FREQS;
        let base = h.rope_freq_base;
        let mut pairs: Vec<usize> = (0..d / 2)
            .filter(|&i| {
                let th = base.powf(-2.0 * i as f32 / d as f32);
                (lo..=hi).contains(&th)
            })
            .collect();
        if pairs.len() < 2 {
            return None;
        }
        pairs.truncate(16);
        let dims: Vec<usize> = pairs.iter().flat_map(|&i| [i, i + d / 2]).collect();
        let sharp = KERNEL_SHARPNESS;
        let qk_gain = (sharp / (d as f32).sqrt()).sqrt();
        let rho = CONTEXT_STRENGTH * (skew / DEFAULT_SKEW).min(2.0);
        let ratio = (h.n_head / h.n_head_kv) as f32;
        // The positional heads' output columns (ratio * d of them, std 1/sqrt(n_head * d)) at
        // `out_scale` times: the channel's RMS per residual dimension is about `rho * emb_std`
        // (values of unit RMS, averaged over a few tokens, ~0.5).
        let init = 1.0 / ((h.n_head as usize * d) as f32).sqrt();
        let out_scale = rho * emb_std / (init * (ratio * d as f32).sqrt() * 0.5);
        Some(Self {
            n_embd: h.n_embd as usize,
            n_head: h.n_head as usize,
            n_head_kv: h.n_head_kv as usize,
            head_dim: d,
            dims,
            qk_gain,
            bias: emb_std,
            out_scale,
        })
    }

    /// The edit for tensor `name` of block `block`, if any.
    pub fn edit(&self, name: &str, block: Option<usize>) -> Option<Edit> {
        let b0 = block == Some(0);
        let ends = |s: &str| name.ends_with(s);
        Some(match () {
            _ if name == "token_embd.weight" => Edit::SetCol0(self.bias),
            _ if ends("ffn_gate_inp.weight") => Edit::ZeroCol0,
            _ if b0 && ends("attn_q.weight") => Edit::QkProj { kv: false },
            _ if b0 && ends("attn_k.weight") => Edit::QkProj { kv: true },
            _ if b0 && (ends("attn_q_norm.weight") || ends("attn_k_norm.weight")) => {
                Edit::QkNorm { gain: self.qk_gain }
            }
            _ if b0 && ends("attn_output.weight") => Edit::OutProj {
                scale: self.out_scale,
            },
            _ if ends("attn_output.weight")
                || ends("ffn_down_exps.weight")
                || ends("ffn_down_shexp.weight")
                || ends("ffn_down.weight") =>
            {
                Edit::ZeroRowsEvery(self.n_embd)
            }
            _ => return None,
        })
    }

    /// Applies `edit` to rows `[row0, row0 + n)` of a tensor with rows of `ne0` values.
    pub fn apply(&self, edit: Edit, ne0: usize, row0: usize, v: &mut [f32]) {
        let d = self.head_dim;
        let in_kernel = |j: usize| self.dims.contains(&(j % d));
        for (i, row) in v.chunks_exact_mut(ne0).enumerate() {
            let r = row0 + i;
            match edit {
                Edit::SetCol0(x) => row[0] = x,
                Edit::ZeroCol0 => row[0] = 0.0,
                Edit::ZeroRowsEvery(p) => {
                    if r.is_multiple_of(p) {
                        row.fill(0.0)
                    }
                }
                Edit::QkProj { kv } => {
                    // Head of this output row; heads of kv group 0 (or kv head 0) are positional.
                    let head = r / d;
                    let positional = if kv {
                        head == 0
                    } else {
                        head < self.n_head / self.n_head_kv
                    };
                    if positional {
                        row.fill(0.0);
                        if in_kernel(r) {
                            row[0] = 1.0;
                        }
                    } else if in_kernel(r) {
                        row.fill(0.0);
                    } else {
                        row[0] = 0.0;
                    }
                }
                Edit::QkNorm { gain } => {
                    for (j, x) in row.iter_mut().enumerate() {
                        if in_kernel(j) {
                            *x = gain;
                        }
                    }
                }
                Edit::OutProj { scale } => {
                    if r == 0 {
                        row.fill(0.0);
                    } else {
                        let n = (self.n_head / self.n_head_kv) * d;
                        row[..n].iter_mut().for_each(|x| *x *= scale);
                    }
                }
            }
        }
    }
}

/// Hit rate of a per-layer LRU cache holding `capacity` of `n_expert` experts, over `n_tokens`
/// tokens routed top-`k` by a router with the given skew (iid hidden states: no temporal locality,
/// so this is a lower bound for real traffic at the same popularity).
pub fn simulate_lru_hit_rate(
    n_expert: usize,
    k: usize,
    skew: f32,
    capacity: usize,
    n_tokens: usize,
    seed: u64,
) -> f64 {
    let mut rng = Rng::new(seed);
    let m = multipliers(n_expert, skew, &mut rng);
    let mut last_use = vec![u64::MAX; n_expert]; // u64::MAX = not cached
    let mut cached = 0usize;
    let (mut hits, mut total) = (0u64, 0u64);
    for t in 0..n_tokens as u64 {
        let logits: Vec<f32> = m.iter().map(|&me| me * rng.normal()).collect();
        for e in crate::util::top_k(&logits, k) {
            total += 1;
            if last_use[e] != u64::MAX {
                hits += 1;
            } else if cached < capacity {
                cached += 1;
            } else {
                // Evict the least recently used expert.
                let victim = (0..n_expert)
                    .filter(|&x| last_use[x] != u64::MAX)
                    .min_by_key(|&x| last_use[x])
                    .expect("cache is full");
                last_use[victim] = u64::MAX;
            }
            last_use[e] = t;
        }
    }
    hits as f64 / total as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uniform_routing_hits_about_capacity() {
        let h = simulate_lru_hit_rate(128, 8, 0.0, 32, 3000, 1);
        assert!(
            (0.18..0.32).contains(&h),
            "uniform routing, 25% LRU: hit rate {h}"
        );
    }

    #[test]
    fn skew_raises_hit_rate_monotonically() {
        let rates: Vec<f64> = [0.0, 1.0, 2.0, 4.0]
            .iter()
            .map(|&s| simulate_lru_hit_rate(128, 8, s, 32, 3000, 2))
            .collect();
        assert!(rates.windows(2).all(|w| w[1] > w[0]), "{rates:?}");
    }

    #[test]
    fn default_popularity_alone_leaves_locality_to_the_channel() {
        // Independent tokens at the default popularity hit far below real routers (~0.74 at 15%):
        // the calibrated curve comes from the context channel (tests/synth_routing.rs).
        let h = simulate_lru_hit_rate(128, 8, DEFAULT_SKEW, 32, 4000, 3);
        assert!(
            (0.25..=0.50).contains(&h),
            "default skew: 25% LRU hit rate {h}"
        );
    }
}
