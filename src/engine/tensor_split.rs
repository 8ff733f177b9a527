//! Tensor parallelism (llama.cpp's `-sm tensor`, our `--split-mode tensor`, alias `row`; issue
//! 26 item 3): every block on every device, each weight sliced across them, on ggml's meta
//! backend (`crate::ggml::meta`), which runs the graph on all devices and all-reduces where the
//! slices meet. What is ours is where each tensor is cut ([`TensorRules`]):
//!
//! - attention by heads: Q, K, V (and their biases) by output rows, whole KV groups per device
//!   (a device's Q heads read only its own K/V heads), the KV cache along the same heads, the
//!   output projection by input columns (each device's product is a partial sum, all-reduced),
//!   sinks by head;
//! - FFNs, shared and routed experts alike, by the hidden dimension: gate and up by output rows,
//!   down by input columns (partial sums, all-reduced), an expert bias of down as a partial sum;
//! - the output head by vocabulary rows; the rest (embedding, norms, routers) whole on every
//!   device.
//!
//! Cuts fall on multiples of a granularity: whole heads (of a KV group), and whole quant blocks
//! of the matrix cut along its rows' direction (down's and the attention output's columns),
//! rounded up to 128 columns where that still leaves every device some (as llama.cpp's rules,
//! whose semantics these follow). Device k gets about `shares[k] / sum` of each cut dimension
//! (equal shares by default; `-ts`); where a cut cannot be even, block `il`'s parts are rotated
//! by `il` devices, so the larger part falls on each device in turn.
//!
//! Not for MLA (DeepSeek-2/3.2's latent cache is one head), DeepSeek-V4, or architectures whose
//! Q/K norm spans all heads at once (OLMoE, MiniMax-M2): refused at load, by name. Not with
//! offloaded experts (the expert cache has one device's slots).
use super::{load::cpu_pool_polls, Device, EngineError, EngineOptions};
use crate::ggml::meta::{Split, SplitRules};
use crate::ggml::{Backend, GgmlType};
use crate::gguf::GgufModel;
use crate::model::Hparams;
use std::collections::HashMap;

/// The meta backend of a tensor split over `opts.devices` (two or more), cut by the rules for
/// `file`'s tensors. Refused, by name: an architecture the rules do not cover, CPU and CUDA
/// devices mixed, a GPU named twice, a tensor split (`-ts`) of another length than the device
/// list, a dimension too small to cut.
pub(super) fn backend(
    opts: &EngineOptions,
    hp: &Hparams,
    file: &GgufModel,
) -> Result<Backend, EngineError> {
    let err = |msg: String| Err(EngineError::Devices(msg));
    if let Some(msg) = unsupported(hp.arch.name) {
        return err(msg);
    }
    let list = &opts.devices;
    let n = list.len();
    let mut names = Vec::with_capacity(n);
    for (k, d) in list.iter().enumerate() {
        names.push(match d {
            Device::Cuda(i) if list[..k].contains(d) => {
                return err(format!(
                    "--split-mode tensor over {list:?} names GPU {i} twice: a tensor split needs                      distinct GPUs"
                ))
            }
            Device::Cuda(i) => format!("CUDA{i}"),
            _ => "CPU".to_string(),
        });
    }
    if names.iter().any(|x| x == "CPU") && names.iter().any(|x| x != "CPU") {
        return err(format!(
            "a tensor split over {list:?}: CPU and CUDA devices are not mixed in one split"
        ));
    }
    let shares = if opts.tensor_split.is_empty() {
        vec![1.0; n]
    } else if opts.tensor_split.len() == n {
        opts.tensor_split.clone()
    } else {
        return err(format!(
            "a tensor split of {} shares ({:?}) for {n} devices: give one share per device",
            opts.tensor_split.len(),
            opts.tensor_split
        ));
    };
    let rules = TensorRules::for_file(hp, file, &shares).map_err(EngineError::Devices)?;
    let poll = cpu_pool_polls(false, false, opts.n_threads);
    Ok(Backend::meta(
        &names,
        Box::new(rules),
        opts.n_threads,
        poll,
    )?)
}

/// Architectures whose graph the rules cover (see the module doc for the others).
pub const SUPPORTED: &[&str] = &["qwen3moe", "qwen2moe", "llama", "gpt-oss", "glm4moe"];

/// Why an architecture cannot be split by tensors, or `None` where it can.
pub fn unsupported(arch: &str) -> Option<String> {
    if SUPPORTED.contains(&arch) {
        return None;
    }
    let why = match arch {
        "deepseek2" | "deepseek32" => "its MLA attention caches one latent head",
        "deepseek4" => "its attention caches one head and mixes streams across blocks",
        "olmoe" | "minimax-m2" => "its Q/K norm spans every head at once",
        _ => "the tensor split rules do not cover it yet",
    };
    Some(format!(
        "--split-mode tensor is not built for {arch} ({why}); --split-mode layer (the default \
         with several devices) splits whole blocks (tensor split built for: {})",
        SUPPORTED.join(", ")
    ))
}

/// The cut of every weight and cache tensor over `n` devices (see the module doc).
pub struct TensorRules {
    splits: HashMap<String, Split>,
    shares: Vec<f64>,
    /// `cache_k_l*` / `cache_v_l*`: (row width, granularity), cut per block as its weights.
    cache_k: (i64, i64),
    cache_v: (i64, i64),
}

/// One tensor of the file: name, shape, type.
pub struct TensorInfo<'a> {
    pub name: &'a str,
    pub ne: [i64; 4],
    pub ty: GgmlType,
}

fn lcm(a: i64, b: i64) -> i64 {
    fn gcd(a: i64, b: i64) -> i64 {
        if b == 0 {
            a
        } else {
            gcd(b, a % b)
        }
    }
    a / gcd(a, b) * b
}

/// `total` cut into `shares.len()` parts in proportion to `shares`, every cut at a multiple of
/// `g` (rounded down), the last part taking the rest.
pub fn cut(total: i64, g: i64, shares: &[f64]) -> Vec<i64> {
    let sum: f64 = shares.iter().sum();
    let mut out = Vec::with_capacity(shares.len());
    let (mut cum, mut low) = (0.0, 0i64);
    for (k, s) in shares.iter().enumerate() {
        cum += s;
        let high = if k + 1 == shares.len() {
            total
        } else {
            let h = (total as f64 * cum / sum).floor() as i64;
            (h - h % g).clamp(low, total)
        };
        out.push(high - low);
        low = high;
    }
    out
}

impl TensorRules {
    /// [`TensorRules::new`] for the tensors of `file`.
    pub fn for_file(hp: &Hparams, file: &GgufModel, shares: &[f64]) -> Result<Self, String> {
        let infos: Vec<TensorInfo<'_>> = file
            .tensors()
            .map(|t| TensorInfo {
                name: &t.name,
                ne: t.ne.map(|x| x as i64),
                ty: t.ty,
            })
            .collect();
        Self::new(hp, &infos, shares)
    }

    /// The cuts for a model of `hp` whose tensors are `tensors`, over devices in proportion to
    /// `shares` (one per device). A dimension too small for whole granules on every device
    /// leaves some device none of it (that block's heads or hidden columns run on the others);
    /// an error where no tensor at all can be cut.
    pub fn new(hp: &Hparams, tensors: &[TensorInfo<'_>], shares: &[f64]) -> Result<Self, String> {
        let n = shares.len() as i64;
        let by_name: HashMap<&str, &TensorInfo<'_>> = tensors.iter().map(|t| (t.name, t)).collect();
        let blck = |name: &str| by_name.get(name).map_or(1, |t| t.ty.block_size() as i64);
        let (hd_k, hd_v) = (hp.head_dim_k as i64, hp.head_dim_v as i64);
        let n_gqa = (hp.n_head / hp.n_head_kv.max(1)).max(1) as i64;
        let n_embd_q = n_gqa * hd_k;
        let attn = |il: &str| {
            let mut perf = blck(&format!("blk.{il}.attn_output.weight"));
            while perf < 128 && perf * n < n_embd_q {
                perf *= 2;
            }
            let g_q = lcm(n_embd_q, perf);
            let g_head = g_q / hd_k;
            let g_kv = g_q / n_gqa;
            (g_q, g_head, g_kv, g_kv / hd_k * hd_v)
        };
        let mut splits = HashMap::new();
        let mut cuts = 0;
        for t in tensors {
            // Block il's cuts: shares turned back by il, parts turned on by il (`rotated`), so
            // each device keeps its share and the remainder of an uneven cut moves round.
            let rot = t
                .name
                .strip_prefix("blk.")
                .and_then(|r| r.split('.').next()?.parse::<usize>().ok())
                .unwrap_or(0);
            let sh = turned(shares, rot);
            let axis = |axis: usize, total: i64, g: i64| Split::Axis {
                axis,
                ne: cut(total, g, &sh),
            };
            let Some((il, what)) = t.name.strip_prefix("blk.").and_then(|r| r.split_once('.'))
            else {
                if t.name == "output.weight" {
                    splits.insert(t.name.to_string(), axis(1, t.ne[1], 1));
                } else if t.name == "output.bias" {
                    splits.insert(t.name.to_string(), axis(0, t.ne[0], 1));
                }
                continue;
            };
            let (g_q, g_head, g_kv, g_v) = attn(il);
            // Whole quant blocks of down's columns, 128 of them where every device still gets
            // some (ggml's faster kernels), else single blocks.
            let ffn = |down: &str| {
                let b = blck(&format!("blk.{il}.{down}.weight"));
                let wide = lcm(b, 128);
                let cols = by_name
                    .get(format!("blk.{il}.{down}.weight").as_str())
                    .map_or(0, |d| d.ne[0]);
                if cols >= n * wide {
                    wide
                } else {
                    b
                }
            };
            let s = match what {
                "attn_q.weight" => axis(1, t.ne[1], g_q),
                "attn_k.weight" => axis(1, t.ne[1], g_kv),
                "attn_v.weight" => axis(1, t.ne[1], g_v),
                "attn_q.bias" => axis(0, t.ne[0], g_q),
                "attn_k.bias" => axis(0, t.ne[0], g_kv),
                "attn_v.bias" => axis(0, t.ne[0], g_v),
                "attn_sinks.weight" => axis(0, t.ne[0], g_head),
                "attn_output.weight" => axis(0, t.ne[0], g_head * hd_v),
                "ffn_up.weight" | "ffn_gate.weight" => axis(1, t.ne[1], ffn("ffn_down")),
                "ffn_up_shexp.weight" | "ffn_gate_shexp.weight" => {
                    axis(1, t.ne[1], ffn("ffn_down_shexp"))
                }
                "ffn_up_exps.weight" | "ffn_gate_exps.weight" => {
                    axis(1, t.ne[1], ffn("ffn_down_exps"))
                }
                "ffn_up_exps.bias" | "ffn_gate_exps.bias" => axis(0, t.ne[0], ffn("ffn_down_exps")),
                "ffn_down.weight" => axis(0, t.ne[0], ffn("ffn_down")),
                "ffn_down_shexp.weight" => axis(0, t.ne[0], ffn("ffn_down_shexp")),
                "ffn_down_exps.weight" => axis(0, t.ne[0], ffn("ffn_down_exps")),
                "ffn_down_exps.bias" => {
                    let down = by_name
                        .get(format!("blk.{il}.ffn_down_exps.weight").as_str())
                        .map_or(t.ne[0], |d| d.ne[0]);
                    Split::Partial {
                        ne: cut(down, ffn("ffn_down_exps"), &sh),
                    }
                }
                _ => continue,
            };
            if let Split::Axis { ne, .. } = &s {
                cuts += usize::from(ne.iter().filter(|&&x| x > 0).count() >= 2);
            }
            splits.insert(t.name.to_string(), rotated(s, rot));
        }
        if cuts == 0 {
            return Err(format!(
                "no tensor of the model can be cut over {n} devices in parts of whole heads \
                 and quant blocks; --split-mode layer splits whole blocks"
            ));
        }
        let (_, _, g_kv, g_v) = attn("0");
        Ok(Self {
            splits,
            shares: shares.to_vec(),
            cache_k: (hp.n_head_kv as i64 * hd_k, g_kv),
            cache_v: (hp.n_head_kv as i64 * hd_v, g_v),
        })
    }
}

/// `shares` turned back `by` devices (entry j is device j + by's share), for [`rotated`].
fn turned(shares: &[f64], by: usize) -> Vec<f64> {
    let n = shares.len().max(1);
    (0..shares.len()).map(|j| shares[(j + by) % n]).collect()
}

/// `s` with its parts moved `by` devices on (device k's part to device k + by, wrapping): block
/// `il`'s cuts are rotated by `il`, so where a dimension does not cut evenly (Qwen3-30B-A3B's
/// 768-wide experts in 256-column blocks over two devices: 256 and 512) the larger part falls
/// on each device in turn, every block's tensors and its KV cache alike.
fn rotated(s: Split, by: usize) -> Split {
    let turn = |ne: Vec<i64>| {
        let n = ne.len().max(1);
        let mut out = vec![0; ne.len()];
        for (k, x) in ne.into_iter().enumerate() {
            out[(k + by) % n] = x;
        }
        out
    };
    match s {
        Split::Axis { axis, ne } => Split::Axis { axis, ne: turn(ne) },
        Split::Partial { ne } => Split::Partial { ne: turn(ne) },
        Split::Mirrored => Split::Mirrored,
    }
}

impl SplitRules for TensorRules {
    fn split(&self, name: &str, _ne: [i64; 4], _ty: Option<GgmlType>) -> Split {
        if let Some(s) = self.splits.get(name) {
            return s.clone();
        }
        let layer = |prefix: &str| name.strip_prefix(prefix)?.parse::<usize>().ok();
        let cache = |(dim, g): (i64, i64), il: usize| {
            let ne = cut(dim, g, &turned(&self.shares, il));
            rotated(Split::Axis { axis: 0, ne }, il)
        };
        if let Some(il) = layer("cache_k_l") {
            return cache(self.cache_k, il);
        }
        if let Some(il) = layer("cache_v_l") {
            return cache(self.cache_v, il);
        }
        Split::Mirrored
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuts_are_proportional_and_on_the_granularity() {
        assert_eq!(cut(4096, 1024, &[1.0, 1.0]), vec![2048, 2048]);
        // Qwen3-30B-A3B's 768-wide expert FFN in 256-column blocks over two devices.
        assert_eq!(cut(768, 256, &[1.0, 1.0]), vec![256, 512]);
        assert_eq!(cut(8, 1, &[3.0, 1.0]), vec![6, 2]);
        assert_eq!(cut(10, 2, &[1.0; 3]), vec![2, 4, 4]);
        // Too small to cut: everything on the last device.
        assert_eq!(cut(64, 128, &[1.0, 1.0]), vec![0, 64]);
        for (total, g, shares) in [(4096, 128, vec![1.0; 4]), (151936, 1, vec![2.0, 1.0])] {
            let parts = cut(total, g, &shares);
            assert_eq!(parts.iter().sum::<i64>(), total);
            for p in &parts[..parts.len() - 1] {
                assert_eq!(p % g, 0);
            }
        }
    }

    #[test]
    fn each_device_keeps_its_share_whatever_the_turn() {
        // -ts 3,1: device 0 holds 3/4 in every block; the remainder of a cut moves round.
        for by in 0..4 {
            let Split::Axis { ne, .. } = rotated(
                Split::Axis {
                    axis: 0,
                    ne: cut(1024, 128, &turned(&[3.0, 1.0], by)),
                },
                by,
            ) else {
                unreachable!()
            };
            assert_eq!(ne, vec![768, 256], "turn {by}");
        }
    }

    #[test]
    fn uneven_cuts_rotate_by_block() {
        let s = Split::Axis {
            axis: 0,
            ne: vec![256, 512],
        };
        assert_eq!(rotated(s.clone(), 0), s);
        assert_eq!(
            rotated(s.clone(), 1),
            Split::Axis {
                axis: 0,
                ne: vec![512, 256]
            }
        );
        assert_eq!(
            rotated(Split::Partial { ne: vec![1, 2, 3] }, 4),
            Split::Partial { ne: vec![3, 1, 2] }
        );
    }

    #[test]
    fn unsupported_architectures_are_named() {
        assert!(unsupported("qwen3moe").is_none());
        let e = unsupported("deepseek2").unwrap();
        assert!(e.contains("MLA") && e.contains("layer"), "{e}");
        assert!(unsupported("olmoe").unwrap().contains("norm"));
    }
}
