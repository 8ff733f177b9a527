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
}

impl Pooling {
    /// `--pooling NAME` (llama.cpp's names; `rank` is a reranker's and is refused).
    pub fn parse(name: &str) -> Result<Self, String> {
        match name {
            "none" => Ok(Pooling::None),
            "mean" => Ok(Pooling::Mean),
            "cls" => Ok(Pooling::Cls),
            "last" => Ok(Pooling::Last),
            "rank" => Err("--pooling rank: reranking (a classifier head) is not supported here; use none, mean, cls or last".into()),
            _ => Err(format!(
                "--pooling {name}: not a pooling type (none, mean, cls, last)"
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
            4 => Err("pooling_type = 4 (rank): reranking is not supported here; pass --pooling none|mean|cls|last".into()),
            v => Err(format!("pooling_type = {v}: not a pooling type (0..=3)")),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Pooling::None => "none",
            Pooling::Mean => "mean",
            Pooling::Cls => "cls",
            Pooling::Last => "last",
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
                Pooling::Last => self.rows = vec![r],
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
    fn names_parse_and_rank_is_refused() {
        for p in [Pooling::None, Pooling::Mean, Pooling::Cls, Pooling::Last] {
            assert_eq!(Pooling::parse(p.name()), Ok(p));
        }
        assert!(Pooling::parse("rank")
            .unwrap_err()
            .contains("not supported"));
        assert!(Pooling::parse("avg").is_err());
        assert_eq!(Pooling::from_gguf(1), Ok(Pooling::Mean));
        assert!(Pooling::from_gguf(4).is_err() && Pooling::from_gguf(9).is_err());
    }
}
