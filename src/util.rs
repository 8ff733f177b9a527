//! Small shared helpers: a seeded PRNG (SplitMix64) so tests, synth and self-checks are
//! reproducible without pulling in a random-number crate.

/// SplitMix64: tiny, fast, good enough for random weights and test data; deterministic per seed.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn uniform(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32
    }

    /// Standard normal (Box-Muller).
    pub fn normal(&mut self) -> f32 {
        let u1 = (self.uniform() as f64).max(1e-12);
        let u2 = self.uniform() as f64;
        ((-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()) as f32
    }

    pub fn normals(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.normal() * scale).collect()
    }
}

/// The upper median of `v` (sorted in place: the element at `len / 2`), `None` when empty. The
/// one median of the crate: the decode duel's step times and `bench --cpu-jobs`' job times.
pub fn median(v: &mut [f64]) -> Option<f64> {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied()
}

/// Indices of the `k` largest of `values`, largest first; equal values by index (the lower
/// first). The one ranking of the crate: the offload path's predicted experts, greedy and top-k
/// sampling, and the synthesiser's routing simulation all use it.
pub fn top_k(values: &[f32], k: usize) -> Vec<usize> {
    // `total_cmp`, then the index: a total order, so any selection gives the same result.
    let before = |&a: &usize, &b: &usize| values[b].total_cmp(&values[a]).then(a.cmp(&b));
    let k = k.min(values.len());
    if k == 0 {
        return Vec::new();
    }
    if k == 1 {
        // Greedy decoding's argmax over the vocabulary: one pass, no allocation of indices.
        let best = values
            .iter()
            .enumerate()
            .max_by(|a, b| a.1.total_cmp(b.1).then(b.0.cmp(&a.0)))
            .map(|(i, _)| i);
        return best.into_iter().collect();
    }
    let mut idx: Vec<usize> = (0..values.len()).collect();
    if k < idx.len() {
        idx.select_nth_unstable_by(k - 1, before);
        idx.truncate(k);
    }
    idx.sort_by(before);
    idx
}

#[cfg(test)]
mod tests {
    use super::top_k;

    /// The fast paths (k = 1, a partial selection) rank exactly as a full sort does, ties and
    /// NaNs included.
    #[test]
    fn top_k_ranks_as_a_full_sort() {
        let mut rng = super::Rng::new(7);
        for n in [0usize, 1, 2, 5, 64, 300] {
            // Few distinct values: many ties.
            let mut v: Vec<f32> = (0..n)
                .map(|_| (rng.uniform() * 6.0).floor() - 3.0)
                .collect();
            if n > 3 {
                v[1] = f32::NAN;
                v[2] = -0.0;
            }
            let mut full: Vec<usize> = (0..n).collect();
            full.sort_by(|&a, &b| v[b].total_cmp(&v[a]).then(a.cmp(&b)));
            for k in [0, 1, 2, 3, 8, n, n + 2] {
                assert_eq!(top_k(&v, k), full[..k.min(n)], "n {n}, k {k}");
            }
        }
    }
}
