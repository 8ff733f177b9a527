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
//! Where attention cannot be cut by heads ([`WHOLE_ATTENTION`]: MLA, whose latent cache is one
//! head (DeepSeek-2/3.2); DeepSeek-V4, whose compressed caches are one head too; a Q/K norm that
//! spans every head at once (OLMoE, MiniMax-M2)) attention stays whole on every device, its
//! weights and KV cache mirrored, each device computing all of it: only the FFNs, experts and
//! head are cut. llama.cpp's tensor split refuses these but DeepSeek-V4 (whose attention it
//! cuts in part); ours runs them all with the experts, the bulk of a MoE, cut. Not with
//! offloaded experts (the expert cache has one device's slots).
use super::{load::cpu_pool_polls, Device, EngineError, EngineOptions};
use crate::ggml::meta::{Split, SplitRules};
use crate::ggml::{Backend, GgmlType};
use crate::gguf::GgufModel;
use crate::model::Hparams;
use std::collections::HashMap;

/// The meta backend of a tensor split over `opts.devices` (two or more), cut by the rules for
/// `file`'s tensors, and what each device holds. Refused, by name: an architecture the rules
/// do not cover, CPU and CUDA devices mixed, a GPU named twice, a tensor split (`-ts`) or a
/// budget list (`--gpu-mem`) of another length than the device list, a dimension too small to
/// cut.
pub(super) fn backend(
    opts: &EngineOptions,
    hp: &Hparams,
    file: &GgufModel,
) -> Result<(Backend, Vec<DeviceShare>), EngineError> {
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
    if !opts.gpu_mems.is_empty() && opts.gpu_mems.len() != n {
        return err(format!(
            "{} memory budgets (--gpu-mem) for the {n} devices of a tensor split: give one for \
             all, or one per device",
            opts.gpu_mems.len()
        ));
    }
    let rules = TensorRules::for_file(hp, file, &shares).map_err(EngineError::Devices)?;
    let held = rules.device_shares(file);
    let poll = cpu_pool_polls(false, false, opts.n_threads);
    let meta = Backend::meta(&names, Box::new(rules), opts.n_threads, poll)?;
    Ok((meta, held))
}

/// What one device of a tensor split holds.
#[derive(Debug, Clone, PartialEq)]
pub struct DeviceShare {
    /// Weight bytes: every whole tensor (mirrored, or a partial sum's) and its slices of the
    /// cut ones.
    pub weights: u64,
    /// Its fraction of the KV cache's bytes (1 where the cache is whole on every device).
    pub kv: f64,
}

/// Architectures whose attention the rules cut by heads.
pub const SUPPORTED: &[&str] = &["qwen3moe", "qwen2moe", "llama", "gpt-oss", "glm4moe"];

/// Architectures whose attention stays whole on every device (see the module doc), and why.
pub const WHOLE_ATTENTION: &[(&str, &str)] = &[
    ("deepseek2", "its MLA attention caches one latent head"),
    ("deepseek32", "its MLA attention caches one latent head"),
    (
        "deepseek4",
        "its attention caches one compressed head and mixes streams across blocks",
    ),
    ("olmoe", "its Q/K norm spans every head at once"),
    ("minimax-m2", "its Q/K norm spans every head at once"),
];

/// Why `arch`'s attention is not cut by heads (it stays whole on every device), or `None`.
pub fn whole_attention(arch: &str) -> Option<&'static str> {
    WHOLE_ATTENTION
        .iter()
        .find(|(a, _)| *a == arch)
        .map(|(_, why)| *why)
}

/// Why an architecture cannot be split by tensors, or `None` where it can.
pub fn unsupported(arch: &str) -> Option<String> {
    if SUPPORTED.contains(&arch) || whole_attention(arch).is_some() {
        return None;
    }
    let built: Vec<&str> = SUPPORTED
        .iter()
        .copied()
        .chain(WHOLE_ATTENTION.iter().map(|(a, _)| *a))
        .collect();
    Some(format!(
        "--split-mode tensor is not built for {arch} (the tensor split rules do not cover it \
         yet); --split-mode layer (the default with several devices) splits whole blocks \
         (tensor split built for: {})",
        built.join(", ")
    ))
}

/// The cut of every weight and cache tensor over `n` devices (see the module doc).
pub struct TensorRules {
    splits: HashMap<String, Split>,
    shares: Vec<f64>,
    /// `cache_k_l*` / `cache_v_l*`: (row width, granularity), cut per block as its weights.
    /// (`None`: mirrored, as the attention of [`WHOLE_ATTENTION`]'s architectures.)
    cache_k: Option<(i64, i64)>,
    cache_v: Option<(i64, i64)>,
    n_layer: usize,
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
        let whole_attn = whole_attention(hp.arch.name).is_some();
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
            // Attention by heads, or (WHOLE_ATTENTION) whole on every device.
            if whole_attn && what.starts_with("attn_") {
                continue;
            }
            let heads = || attn(il);
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
                "attn_q.weight" => axis(1, t.ne[1], heads().0),
                "attn_k.weight" => axis(1, t.ne[1], heads().2),
                "attn_v.weight" => axis(1, t.ne[1], heads().3),
                "attn_q.bias" => axis(0, t.ne[0], heads().0),
                "attn_k.bias" => axis(0, t.ne[0], heads().2),
                "attn_v.bias" => axis(0, t.ne[0], heads().3),
                "attn_sinks.weight" => axis(0, t.ne[0], heads().1),
                "attn_output.weight" => axis(0, t.ne[0], heads().1 * hd_v),
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
        let cache = (!whole_attn).then(|| attn("0"));
        Ok(Self {
            splits,
            shares: shares.to_vec(),
            cache_k: cache.map(|(_, _, g_kv, _)| (hp.n_head_kv as i64 * hd_k, g_kv)),
            cache_v: cache.map(|(.., g_v)| (hp.n_head_kv as i64 * hd_v, g_v)),
            n_layer: hp.n_layer,
        })
    }

    /// What each device holds of `file`'s weights and of the KV cache, as these rules cut them
    /// (ggml pads each tensor to its buffer's alignment on top).
    pub fn device_shares(&self, file: &GgufModel) -> Vec<DeviceShare> {
        let n = self.shares.len();
        let mut weights = vec![0u64; n];
        for t in file.tensors() {
            match self.split(&t.name, t.ne.map(|x| x as i64), Some(t.ty)) {
                Split::Axis { axis, ne } => {
                    for (w, part) in weights.iter_mut().zip(&ne) {
                        *w += t.n_bytes * *part as u64 / t.ne[axis].max(1);
                    }
                }
                Split::Mirrored | Split::Partial { .. } => {
                    weights.iter_mut().for_each(|w| *w += t.n_bytes);
                }
            }
        }
        // The cache's K and V rows per block, cut as the block's heads (or whole).
        let (mut held, mut all) = (vec![0i64; n], 0i64);
        for il in 0..self.n_layer {
            for name in [format!("cache_k_l{il}"), format!("cache_v_l{il}")] {
                if let Split::Axis { ne, .. } = self.split(&name, [0; 4], None) {
                    held.iter_mut().zip(&ne).for_each(|(h, x)| *h += x);
                    all += ne.iter().sum::<i64>();
                }
            }
        }
        weights
            .into_iter()
            .zip(held)
            .map(|(weights, h)| DeviceShare {
                weights,
                kv: if all > 0 { h as f64 / all as f64 } else { 1.0 },
            })
            .collect()
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
        if let (Some(il), Some(c)) = (layer("cache_k_l"), self.cache_k) {
            return cache(c, il);
        }
        if let (Some(il), Some(c)) = (layer("cache_v_l"), self.cache_v) {
            return cache(c, il);
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
        // Attention whole on every device: built, with the reason the plan gives.
        assert!(unsupported("deepseek2").is_none());
        assert!(whole_attention("deepseek2").unwrap().contains("MLA"));
        assert!(whole_attention("olmoe").unwrap().contains("norm"));
        assert!(whole_attention("qwen3moe").is_none());
        assert!(unsupported("deepseek4").is_none());
        let e = unsupported("jamba").unwrap();
        assert!(
            e.contains("jamba") && e.contains("--split-mode layer") && e.contains("olmoe"),
            "{e}"
        );
    }
}
