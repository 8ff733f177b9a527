//! Token sampling, in llama.cpp's default order: repetition/presence/frequency penalties over the
//! last `penalty_last_n` tokens, top-k, top-p, min-p, temperature, then a draw from a seeded RNG
//! (deterministic for a seed). Temperature 0 is greedy (argmax after penalties).
use crate::util::Rng;
use std::collections::{HashMap, VecDeque};

#[derive(Debug, Clone)]
pub struct SamplerParams {
    /// 0 = greedy.
    pub temperature: f32,
    /// 0 = off.
    pub top_k: usize,
    /// 1 = off.
    pub top_p: f32,
    /// 0 = off.
    pub min_p: f32,
    /// 1 = off. Positive logits are divided, negative multiplied (llama.cpp / CTRL).
    pub repeat_penalty: f32,
    pub presence_penalty: f32,
    pub frequency_penalty: f32,
    pub penalty_last_n: usize,
    pub seed: u64,
}

impl Default for SamplerParams {
    fn default() -> Self {
        Self {
            temperature: 0.8,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            repeat_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            penalty_last_n: 64,
            seed: 0xC0FFEE,
        }
    }
}

impl SamplerParams {
    /// Checks ranges, naming the offending field.
    pub fn validate(&self) -> Result<(), String> {
        let bad = |f: &str, v: f32, r: &str| Err(format!("{f} = {v} is out of range ({r})"));
        if !(self.temperature.is_finite() && self.temperature >= 0.0) {
            return bad("temperature", self.temperature, ">= 0");
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return bad("top_p", self.top_p, "0 < top_p <= 1");
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return bad("min_p", self.min_p, "0..=1");
        }
        if !(self.repeat_penalty.is_finite() && self.repeat_penalty > 0.0) {
            return bad("repeat_penalty", self.repeat_penalty, "> 0");
        }
        for (f, v) in [
            ("presence_penalty", self.presence_penalty),
            ("frequency_penalty", self.frequency_penalty),
        ] {
            if !(-2.0..=2.0).contains(&v) {
                return bad(f, v, "-2..=2");
            }
        }
        Ok(())
    }
}

pub struct Sampler {
    p: SamplerParams,
    rng: Rng,
    history: VecDeque<u32>,
}

impl Sampler {
    pub fn new(p: SamplerParams) -> Self {
        let rng = Rng::new(p.seed);
        Self {
            p,
            rng,
            history: VecDeque::new(),
        }
    }

    /// Records a token (prompt or generated) for the penalties.
    pub fn accept(&mut self, token: u32) {
        if self.p.penalty_last_n == 0 {
            return;
        }
        if self.history.len() == self.p.penalty_last_n {
            self.history.pop_front();
        }
        self.history.push_back(token);
    }

    /// Picks the next token from `logits` (does not `accept` it).
    pub fn sample(&mut self, logits: &[f32]) -> u32 {
        let mut l = logits.to_vec();
        self.apply_penalties(&mut l);
        if self.p.temperature == 0.0 {
            return argmax(&l);
        }
        // Candidates sorted by logit, descending (the top k of them with top-k on).
        let n_cand = if self.p.top_k > 0 {
            self.p.top_k
        } else {
            l.len()
        };
        let mut cand: Vec<(u32, f32)> = crate::util::top_k(&l, n_cand)
            .into_iter()
            .map(|i| (i as u32, l[i]))
            .collect();
        // Tokens masked out (-inf: a grammar's) are never drawn, whatever the rounding.
        if cand.first().is_some_and(|c| c.1 > f32::NEG_INFINITY) {
            cand.retain(|c| c.1 > f32::NEG_INFINITY);
        }
        let probs = softmax(&cand, 1.0);
        if self.p.top_p < 1.0 {
            let mut acc = 0.0;
            let keep = probs.iter().position(|&p| {
                acc += p;
                acc >= self.p.top_p
            });
            cand.truncate(keep.map_or(cand.len(), |k| k + 1));
        }
        if self.p.min_p > 0.0 {
            let max_p = probs[0];
            let n = probs
                .iter()
                .take(cand.len())
                .take_while(|&&p| p >= self.p.min_p * max_p)
                .count();
            cand.truncate(n.max(1));
        }
        let probs = softmax(&cand, self.p.temperature);
        let r = self.rng.uniform() as f64;
        let mut acc = 0.0;
        for (i, &p) in probs.iter().enumerate() {
            acc += p as f64;
            if r < acc {
                return cand[i].0;
            }
        }
        cand.last().map_or(0, |c| c.0)
    }

    fn apply_penalties(&self, l: &mut [f32]) {
        if self.history.is_empty() {
            return;
        }
        let mut counts: HashMap<u32, u32> = HashMap::new();
        for &t in &self.history {
            *counts.entry(t).or_default() += 1;
        }
        for (&t, &c) in &counts {
            let Some(x) = l.get_mut(t as usize) else {
                continue;
            };
            if self.p.repeat_penalty != 1.0 {
                *x = if *x > 0.0 {
                    *x / self.p.repeat_penalty
                } else {
                    *x * self.p.repeat_penalty
                };
            }
            *x -= c as f32 * self.p.frequency_penalty + self.p.presence_penalty;
        }
    }
}

/// The index of the largest logit (the lowest among equals; 0 for none).
pub fn argmax(l: &[f32]) -> u32 {
    crate::util::top_k(l, 1).first().map_or(0, |&i| i as u32)
}

/// Softmax of the candidates' logits divided by `temp`.
fn softmax(cand: &[(u32, f32)], temp: f32) -> Vec<f32> {
    let max = cand.first().map_or(0.0, |c| c.1);
    let e: Vec<f32> = cand.iter().map(|c| ((c.1 - max) / temp).exp()).collect();
    let s: f32 = e.iter().sum();
    e.into_iter().map(|x| x / s).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn logits() -> Vec<f32> {
        vec![1.0, 3.0, 2.0, -1.0, 2.9]
    }

    #[test]
    fn greedy_picks_argmax_and_penalties_move_it() {
        let mut s = Sampler::new(SamplerParams {
            temperature: 0.0,
            ..Default::default()
        });
        assert_eq!(s.sample(&logits()), 1);
        let mut s = Sampler::new(SamplerParams {
            temperature: 0.0,
            repeat_penalty: 1.1,
            ..Default::default()
        });
        s.accept(1);
        // 3.0 / 1.1 = 2.727 < 2.9
        assert_eq!(s.sample(&logits()), 4);
        let mut s = Sampler::new(SamplerParams {
            temperature: 0.0,
            presence_penalty: 0.5,
            frequency_penalty: 0.5,
            ..Default::default()
        });
        s.accept(1);
        s.accept(1);
        s.accept(4);
        // 3 - 1 - 0.5 = 1.5; 2.9 - 0.5 - 0.5 = 1.9; token 2 (2.0) wins.
        assert_eq!(s.sample(&logits()), 2);
    }

    #[test]
    fn top_k_1_is_greedy_and_seeds_are_deterministic() {
        let mut s = Sampler::new(SamplerParams {
            temperature: 1.0,
            top_k: 1,
            ..Default::default()
        });
        for _ in 0..20 {
            assert_eq!(s.sample(&logits()), 1);
        }
        let draw = |seed, n| {
            let mut s = Sampler::new(SamplerParams {
                temperature: 1.5,
                top_k: 0,
                top_p: 1.0,
                min_p: 0.0,
                seed,
                ..Default::default()
            });
            (0..n).map(|_| s.sample(&logits())).collect::<Vec<_>>()
        };
        assert_eq!(draw(1, 64), draw(1, 64));
        assert_ne!(draw(1, 64), draw(2, 64));
        // At high temperature every candidate shows up (the rarest has p ~ 2%).
        let d = draw(3, 1000);
        assert!((0..5).all(|t| d.contains(&t)), "{d:?}");
    }

    #[test]
    fn top_p_and_min_p_cut_the_tail() {
        // min_p 0.5: only tokens with p >= 0.5 * p_max survive (1 and 4).
        let mut s = Sampler::new(SamplerParams {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.5,
            ..Default::default()
        });
        for _ in 0..200 {
            assert!([1, 4].contains(&s.sample(&logits())));
        }
        // top_p 0.5: token 1 alone holds ~0.39; with 4 (~0.35) the mass passes 0.5.
        let mut s = Sampler::new(SamplerParams {
            temperature: 1.0,
            top_k: 0,
            top_p: 0.5,
            min_p: 0.0,
            ..Default::default()
        });
        for _ in 0..200 {
            assert!([1, 4].contains(&s.sample(&logits())));
        }
    }

    #[test]
    fn bad_params_name_the_field() {
        let e = SamplerParams {
            top_p: 0.0,
            ..Default::default()
        }
        .validate()
        .unwrap_err();
        assert!(e.contains("top_p"));
        let e = SamplerParams {
            temperature: -1.0,
            ..Default::default()
        }
        .validate()
        .unwrap_err();
        assert!(e.contains("temperature"));
    }
}
