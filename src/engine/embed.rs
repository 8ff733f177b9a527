//! Embeddings as llama.cpp makes them: the final normed hidden state of a prompt's positions
//! (`result_norm`, what `Engine::forward_embd` returns) pooled into one vector per prompt, then
//! normalised.
//!
//! Pooling (llama.cpp `llm_graph_context::build_pooling`): `mean` averages every position,
//! `cls` takes the first, `last` the last, `none` keeps one vector per position. llama.cpp
//! computes the mean in its graph (a matmul with a column of `1/n`), we sum in f64 on the host
//! and divide once: the same value to within a few f32 ulps (`tests/embeddings.rs` measures it),
//! and prompts longer than a micro-batch pool like short ones (llama.cpp refuses those).
//! Normalisation is llama.cpp's `common_embd_normalize` (what llama-server applies to pooled
//! vectors: `embd_normalize`, 2 by default).
//!
//! `rank` (rerankers, llama.cpp's `LLAMA_POOLING_TYPE_RANK`): the pooled row is the last
//! position's (llama.cpp takes the last one when attention is causal, as in every architecture
//! here), then the GGUF's classification head ([`RankHead`]) maps it to `n_cls_out` scores; the
//! first is the relevance score llama-server reports.

/// How a prompt's hidden states become its embedding (llama.cpp's `llama_pooling_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pooling {
    /// One vector per position.
    None,
    Mean,
    /// The first position's.
    Cls,
    /// The last position's.
    Last,
    /// A reranker's: the last position's, then the classification head ([`RankHead`]).
    Rank,
}

impl Pooling {
    /// `--pooling NAME` (llama.cpp's names).
    pub fn parse(name: &str) -> Result<Self, String> {
        match name {
            "none" => Ok(Pooling::None),
            "mean" => Ok(Pooling::Mean),
            "cls" => Ok(Pooling::Cls),
            "last" => Ok(Pooling::Last),
            "rank" => Ok(Pooling::Rank),
            _ => Err(format!(
                "--pooling {name}: not a pooling type (none, mean, cls, last, rank)"
            )),
        }
    }

    /// The GGUF key `{arch}.pooling_type` (llama.cpp's enum: 0 none, 1 mean, 2 cls, 3 last,
    /// 4 rank).
    pub fn from_gguf(v: u64) -> Result<Self, String> {
        match v {
            0 => Ok(Pooling::None),
            1 => Ok(Pooling::Mean),
            2 => Ok(Pooling::Cls),
            3 => Ok(Pooling::Last),
            4 => Ok(Pooling::Rank),
            v => Err(format!("pooling_type = {v}: not a pooling type (0..=4)")),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Pooling::None => "none",
            Pooling::Mean => "mean",
            Pooling::Cls => "cls",
            Pooling::Last => "last",
            Pooling::Rank => "rank",
        }
    }
}

/// Pools one prompt's hidden states as they come, micro-batch by micro-batch.
#[derive(Debug, Clone)]
pub struct Pooler {
    pooling: Pooling,
    sum: Vec<f64>,
    rows: Vec<Vec<f32>>,
    n: usize,
}

impl Pooler {
    pub fn new(pooling: Pooling) -> Self {
        Self {
            pooling,
            sum: Vec::new(),
            rows: Vec::new(),
            n: 0,
        }
    }

    /// The hidden states of the prompt's next positions, in order.
    pub fn push(&mut self, rows: impl IntoIterator<Item = Vec<f32>>) {
        for r in rows {
            match self.pooling {
                Pooling::None => self.rows.push(r),
                Pooling::Cls if self.n == 0 => self.rows = vec![r],
                Pooling::Cls => {}
                Pooling::Last | Pooling::Rank => self.rows = vec![r],
                Pooling::Mean => {
                    self.sum.resize(r.len(), 0.0);
                    for (s, x) in self.sum.iter_mut().zip(&r) {
                        *s += f64::from(*x);
                    }
                }
            }
            self.n += 1;
        }
    }

    /// The embedding: one vector (pooled), or one per position (`none`); empty when nothing
    /// was pushed.
    pub fn finish(self) -> Vec<Vec<f32>> {
        match self.pooling {
            Pooling::Mean if self.n > 0 => {
                let n = self.n as f64;
                vec![self.sum.iter().map(|s| (s / n) as f32).collect()]
            }
            Pooling::Mean => Vec::new(),
            _ => self.rows,
        }
    }
}

/// A reranker's classification head (llama.cpp `build_pooling`, `LLAMA_POOLING_TYPE_RANK`),
/// read from the GGUF: `cls.weight` (+ `cls.bias`) then the activation
/// (`{arch}.classifier.activation`: tanh by default, or silu), then `cls.output.weight`
/// (+ `cls.output.bias`), each part optional. Without any of them the scores are the pooled row
/// itself, as llama.cpp computes them for such a model (its first component then is the
/// "score": not a relevance score, so the server says so at start).
///
/// Computed on the host in f64 from f32 (dequantised) weights: one row per request, a few
/// thousand multiply-adds.
#[derive(Debug, Clone, Default)]
pub struct RankHead {
    dense: Option<Linear>,
    silu: bool,
    out: Option<Linear>,
}

#[derive(Debug, Clone)]
struct Linear {
    /// `n_out` rows of `n_in` (ggml's `ne = [n_in, n_out]`).
    w: Vec<f32>,
    b: Option<Vec<f32>>,
    n_in: usize,
    n_out: usize,
}

impl Linear {
    fn apply(&self, x: &[f32]) -> Vec<f32> {
        (0..self.n_out)
            .map(|j| {
                let row = &self.w[j * self.n_in..(j + 1) * self.n_in];
                let dot: f64 = row
                    .iter()
                    .zip(x)
                    .map(|(w, x)| f64::from(*w) * f64::from(*x))
                    .sum();
                (dot + self.b.as_ref().map_or(0.0, |b| f64::from(b[j]))) as f32
            })
            .collect()
    }
}

impl RankHead {
    /// The head `file` carries for hidden states of `n_embd`; errors name the tensor or key.
    pub fn from_gguf(file: &crate::gguf::GgufModel, n_embd: usize) -> Result<Self, String> {
        use crate::gguf::Metadata;
        for name in ["cls.norm.weight", "cls.norm.bias"] {
            if file.tensor(name).is_some() {
                return Err(format!(
                    "{name}: a normed classification head (ModernBERT's) is not supported here"
                ));
            }
        }
        let arch = file.get_str("general.architecture").unwrap_or_default();
        let key = format!("{arch}.classifier.pooling_type");
        if file.get_u64(&key).is_some_and(|v| v != 2 && v != 3) {
            return Err(format!(
                "{key}: only the last position (causal attention) is pooled for ranking here"
            ));
        }
        let key = format!("{arch}.classifier.activation");
        let silu = match file.get_str(&key) {
            None | Some("tanh") => false,
            Some("silu") => true,
            Some(other) => return Err(format!("{key} = {other}: not supported here (tanh, silu)")),
        };
        let read = |name: &str, want: &[Option<usize>]| -> Result<Option<Vec<f32>>, String> {
            let Some(t) = file.tensor(name) else {
                return Ok(None);
            };
            let shape: Vec<usize> = t.shape().iter().map(|&d| d as usize).collect();
            let fits = shape.len() == want.len()
                && shape
                    .iter()
                    .zip(want)
                    .all(|(d, w)| w.is_none_or(|w| *d == w));
            if !fits {
                return Err(format!(
                    "{name} has shape {shape:?}, expected {want:?} (None: any)"
                ));
            }
            let n = t.n_elements() as usize;
            crate::ggml::quant::dequantize(t.ty, file.tensor_data(t), n)
                .map(Some)
                .map_err(|e| format!("{name}: {e}"))
        };
        let linear = |w: &str, b: &str, n_in: usize| -> Result<Option<Linear>, String> {
            let Some(wv) = read(w, &[Some(n_in), None])? else {
                if file.tensor(b).is_some() {
                    return Err(format!("{b} without {w}"));
                }
                return Ok(None);
            };
            let n_out = wv.len() / n_in.max(1);
            let bv = read(b, &[Some(n_out)])?;
            Ok(Some(Linear {
                w: wv,
                b: bv,
                n_in,
                n_out,
            }))
        };
        let dense = linear("cls.weight", "cls.bias", n_embd)?;
        let n_mid = dense.as_ref().map_or(n_embd, |d| d.n_out);
        let out = linear("cls.output.weight", "cls.output.bias", n_mid)?;
        Ok(Self { dense, silu, out })
    }

    /// Whether the file has a head at all (else the scores are the pooled row).
    pub fn is_empty(&self) -> bool {
        self.dense.is_none() && self.out.is_none()
    }

    /// The head's outputs for one pooled row; the first is the relevance score.
    pub fn scores(&self, pooled: &[f32]) -> Vec<f32> {
        let mut cur = pooled.to_vec();
        if let Some(d) = &self.dense {
            cur = d.apply(&cur);
            for x in &mut cur {
                *x = if self.silu {
                    *x / (1.0 + (-*x).exp())
                } else {
                    x.tanh()
                };
            }
        }
        if let Some(o) = &self.out {
            cur = o.apply(&cur);
        }
        cur
    }
}

/// llama.cpp's `common_embd_normalize`: `norm` -1 none, 0 max-abs scaled to the int16 range
/// (32760), 2 euclidean (L2), any other p the p-norm. A zero vector stays zero.
pub fn normalize(v: &[f32], norm: i32) -> Vec<f32> {
    let sum: f64 = match norm {
        -1 => 1.0,
        0 => v.iter().fold(0f64, |m, x| m.max(f64::from(x.abs()))) / 32760.0,
        // As llama.cpp: the product in f32, the sum in f64.
        2 => v.iter().map(|x| f64::from(x * x)).sum::<f64>().sqrt(),
        p => v
            .iter()
            .map(|x| f64::from(x.abs()).powf(f64::from(p)))
            .sum::<f64>()
            .powf(1.0 / f64::from(p)),
    };
    let scale = if sum > 0.0 { (1.0 / sum) as f32 } else { 0.0 };
    v.iter().map(|x| x * scale).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pooling_takes_the_right_rows() {
        let rows = || vec![vec![1.0, 2.0], vec![3.0, 4.0], vec![5.0, 9.0]];
        let pool = |p| {
            let mut a = Pooler::new(p);
            let r = rows();
            a.push(r[..1].to_vec());
            a.push(r[1..].to_vec());
            a.finish()
        };
        assert_eq!(pool(Pooling::Mean), vec![vec![3.0, 5.0]]);
        assert_eq!(pool(Pooling::Cls), vec![vec![1.0, 2.0]]);
        assert_eq!(pool(Pooling::Last), vec![vec![5.0, 9.0]]);
        assert_eq!(pool(Pooling::None), rows());
        assert!(Pooler::new(Pooling::Mean).finish().is_empty());
    }

    #[test]
    fn normalisation_is_llama_cpps() {
        assert_eq!(normalize(&[3.0, 4.0], 2), vec![0.6, 0.8]);
        assert_eq!(normalize(&[3.0, -4.0], -1), vec![3.0, -4.0]);
        let m = normalize(&[1.0, -2.0], 0);
        assert_eq!(m, vec![16380.0, -32760.0]);
        let p1 = normalize(&[1.0, -3.0], 1);
        assert_eq!(p1, vec![0.25, -0.75]);
        assert_eq!(normalize(&[0.0, 0.0], 2), vec![0.0, 0.0]);
    }

    #[test]
    fn names_parse() {
        for p in [
            Pooling::None,
            Pooling::Mean,
            Pooling::Cls,
            Pooling::Last,
            Pooling::Rank,
        ] {
            assert_eq!(Pooling::parse(p.name()), Ok(p));
        }
        assert!(Pooling::parse("avg").is_err());
        assert_eq!(Pooling::from_gguf(1), Ok(Pooling::Mean));
        assert_eq!(Pooling::from_gguf(4), Ok(Pooling::Rank));
        assert!(Pooling::from_gguf(9).is_err());
    }

    #[test]
    fn rank_pools_the_last_row_and_applies_the_head() {
        let mut p = Pooler::new(Pooling::Rank);
        p.push(vec![vec![1.0, 2.0], vec![3.0, -1.0]]);
        let row = p.finish().remove(0);
        assert_eq!(row, vec![3.0, -1.0]);
        assert_eq!(RankHead::default().scores(&row), row, "no head: the row");
        let head = RankHead {
            dense: Some(Linear {
                w: vec![1.0, 0.0, 0.5, 0.5],
                b: Some(vec![0.0, -1.0]),
                n_in: 2,
                n_out: 2,
            }),
            silu: false,
            out: Some(Linear {
                w: vec![2.0, -1.0],
                b: Some(vec![0.25]),
                n_in: 2,
                n_out: 1,
            }),
        };
        // dense: [3, 1 - 1] -> tanh -> [tanh 3, 0]; out: 2 tanh 3 + 0.25.
        let want = (2.0 * 3f64.tanh() + 0.25) as f32;
        assert_eq!(head.scores(&row), vec![want]);
    }
}
