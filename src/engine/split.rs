//! The layer split over several devices (llama.cpp's `-sm layer`, issue 26): each device holds
//! a contiguous run of decode blocks, their weights and their KV-cache rows; the token
//! embedding lives on the first device that holds blocks, the output norm and head on the last.
//! Every node of block `il`'s graph is assigned to its device's backend
//! (`ggml_backend_sched_set_tensor_backend`, by the `name-il` names the graph builder gives),
//! and ggml's scheduler copies activations between backends at block boundaries.
//!
//! With one device nothing here runs: the engine is built and stepped exactly as before.
use super::{auto_budget, gib, load::cpu_pool_polls, Device, EngineError, EngineOptions};
use crate::ggml::{Backend, BufType, Graph, Tensor};
use crate::graph::device_tag;
use crate::model::Hparams;
use std::ops::Range;
use std::rc::Rc;

/// A loaded engine's layer split: the plan and each device's backend.
pub(super) struct Split {
    pub plan: LayerPlan,
    /// Device k's backend (the scheduler's backend k; the CPU backend comes after them).
    pub devices: Vec<Rc<Backend>>,
    /// Device k's budget, where it has one (`gpu_mem`, or a GPU's free memory minus the
    /// margin).
    pub budgets: Vec<Option<u64>>,
}

impl Split {
    /// The devices of `opts.devices` (two or more, resolved; `first` the first one's backend
    /// when it is a GPU), their budgets (`given`: the budgets a caller set, one for every
    /// device or one each; else a GPU's free memory minus the margin), and the plan of `hp`'s
    /// decode blocks over them. Refused: CPU and CUDA devices together, a tensor split or a
    /// budget list of another length.
    pub fn new(
        opts: &EngineOptions,
        first: Option<Rc<Backend>>,
        given: &[u64],
        hp: &Hparams,
    ) -> Result<Self, EngineError> {
        let list = &opts.devices;
        let n = list.len();
        let err = |msg: String| Err(EngineError::Devices(msg));
        let all_cpu = list.iter().all(|d| *d == Device::Cpu);
        let all_cuda = list.iter().all(|d| matches!(d, Device::Cuda(_)));
        if !all_cpu && !all_cuda {
            return err(format!(
                "a layer split over {list:?}: CPU and CUDA devices are not mixed in one split \
                 (give only GPUs, or only CPU stand-ins)"
            ));
        }
        if !opts.tensor_split.is_empty() && opts.tensor_split.len() != n {
            return err(format!(
                "a tensor split of {} shares ({:?}) for {n} devices: give one share per device",
                opts.tensor_split.len(),
                opts.tensor_split
            ));
        }
        if given.len() > 1 && given.len() != n {
            return err(format!(
                "{} memory budgets (--gpu-mem {}) for {n} devices: give one for all, or one per \
                 device",
                given.len(),
                given.iter().map(|b| gib(*b)).collect::<Vec<_>>().join(",")
            ));
        }
        if all_cuda && !crate::ggml::disable_cuda_graphs_for_split() {
            tracing::warn!(
                "a layer split over CUDA devices runs without CUDA graphs (docs/design.md §8), \
                 but this process computed on a GPU before: set GGML_CUDA_DISABLE_GRAPHS=1 \
                 before it starts, or the split's decode may go wrong"
            );
        }
        let poll = cpu_pool_polls(false, false, opts.n_threads);
        let mut devices = Vec::with_capacity(n);
        for (k, d) in list.iter().enumerate() {
            // A GPU named twice (`--gpu 0,0`): a second logical device on it (tests).
            let again = list[..k].contains(d);
            devices.push(match (d, k, &first) {
                (Device::Cuda(_), 0, Some(b)) => b.clone(),
                (Device::Cuda(i), _, _) if again => Rc::new(Backend::cuda_logical(*i, k)?),
                (Device::Cuda(i), _, _) => Rc::new(Backend::cuda(*i)?),
                _ => Rc::new(Backend::cpu_standin(k, opts.n_threads, poll)?),
            });
        }
        let budgets: Vec<Option<u64>> = devices
            .iter()
            .enumerate()
            .map(|(k, b)| {
                given.get(k).or(given.first()).copied().or_else(|| {
                    b.memory()
                        .filter(|_| b.is_cuda())
                        .map(|(free, total)| auto_budget(free as u64, total as u64))
                })
            })
            .collect();
        let shares: Vec<f64> = if opts.tensor_split.is_empty() {
            budgets
                .iter()
                .map(|b| b.map_or(1.0, |b| b as f64))
                .collect()
        } else {
            opts.tensor_split.clone()
        };
        let plan = LayerPlan::new(hp.n_layer_decode(), &shares).map_err(EngineError::Devices)?;
        Ok(Self {
            plan,
            devices,
            budgets,
        })
    }

    /// Whether `need` bytes (the model and its KV cache) with a compute `reserve` per device fit
    /// the devices' budgets together (any device without a budget: yes).
    pub fn fits(&self, need: u64, reserve: u64) -> bool {
        if self.budgets.iter().any(Option::is_none) {
            return true;
        }
        let sum: u64 = self.budgets.iter().flatten().sum();
        need + reserve * self.devices.len() as u64 <= sum
    }

    /// The buffer type of weight `name`'s device where it is not the first device (`None`:
    /// the first, the weights' main backend).
    pub fn weight_buft(&self, name: &str) -> Option<BufType> {
        self.buft(self.plan.device_of_weight(name))
    }

    /// As [`Split::weight_buft`] for the KV-cache tensor `name`.
    pub fn cache_buft(&self, name: &str) -> Option<BufType> {
        self.buft(self.plan.device_of_cache(name))
    }

    /// Device `k`'s buffer type where it is not the first device (`None`: the first, the
    /// weights' main backend).
    pub fn buft(&self, k: usize) -> Option<BufType> {
        (k > 0).then(|| self.devices[k].buffer_type())
    }

    /// The device whose memory `t` is in.
    pub fn device_of_tensor(&self, t: Tensor<'_>) -> Option<usize> {
        let b = t.buffer_type()?;
        self.devices.iter().position(|d| d.buffer_type() == b)
    }
}

/// Which device holds what: block runs, the embedding's device and the head's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayerPlan {
    /// Per device, the decode blocks it holds (contiguous, in device order; empty for a device
    /// given none).
    pub blocks: Vec<Range<usize>>,
    /// The device of the token embedding (the first that holds blocks).
    pub input: usize,
    /// The device of the output norm and head (the last that holds blocks); also of the blocks
    /// past the decode stack (multi-token-prediction blocks, loaded and not built).
    pub output: usize,
}

impl LayerPlan {
    /// `n_blocks` decode blocks over devices in proportion to `shares` (llama.cpp's
    /// `--tensor-split 3,1` meaning: device k gets about `shares[k] / sum` of the blocks):
    /// device k holds blocks `round(n * c(k-1)) .. round(n * c(k))`, `c(k)` the cumulative
    /// share up to and including k over the sum. A zero share gets no block; more devices
    /// than blocks leave some empty. Errors: no share, a negative or non-finite share, or
    /// every share zero.
    pub fn new(n_blocks: usize, shares: &[f64]) -> Result<Self, String> {
        if shares.is_empty() {
            return Err("a layer split needs at least one device".into());
        }
        if let Some(s) = shares.iter().find(|s| !s.is_finite() || **s < 0.0) {
            return Err(format!(
                "a device's share of the layers must be a finite number >= 0, not {s}"
            ));
        }
        let total: f64 = shares.iter().sum();
        if total <= 0.0 {
            return Err("every device's share of the layers is zero".into());
        }
        let mut blocks = Vec::with_capacity(shares.len());
        let (mut cum, mut start) = (0.0, 0);
        for (k, s) in shares.iter().enumerate() {
            cum += s;
            let end = if k + 1 == shares.len() {
                n_blocks
            } else {
                ((n_blocks as f64 * cum / total).round() as usize).clamp(start, n_blocks)
            };
            blocks.push(start..end);
            start = end;
        }
        let holding = |r: &&Range<usize>| !r.is_empty();
        let first_positive = shares.iter().position(|&s| s > 0.0).expect("total > 0");
        let input = blocks
            .iter()
            .position(|r| holding(&r))
            .unwrap_or(first_positive);
        let output = blocks
            .iter()
            .rposition(|r| holding(&r))
            .unwrap_or(first_positive);
        Ok(Self {
            blocks,
            input,
            output,
        })
    }

    pub fn n_devices(&self) -> usize {
        self.blocks.len()
    }

    /// The device of block `il` (a block past the decode stack: the output device's).
    pub fn device_of(&self, il: usize) -> usize {
        self.blocks
            .iter()
            .position(|r| r.contains(&il))
            .unwrap_or(self.output)
    }

    /// The device of the weight named `name` (a GGUF tensor name): `blk.N.*` its block's, the
    /// output norm and head (`output*`) the output device's, the rest (the token embedding and
    /// other globals) the input device's.
    pub fn device_of_weight(&self, name: &str) -> usize {
        if let Some(il) = crate::model::block_of(name) {
            return self.device_of(il);
        }
        if name.starts_with("output") {
            self.output
        } else {
            self.input
        }
    }

    /// The device of the KV-cache tensor named `name`: per-block tensors end in `_l{il}`
    /// (`cache_k_l3`, `dsv4_comp_l7`); others (rotation matrices) are the input device's.
    pub fn device_of_cache(&self, name: &str) -> usize {
        match name
            .rsplit_once("_l")
            .and_then(|(_, n)| n.parse::<usize>().ok())
        {
            Some(il) => self.device_of(il),
            None => self.input,
        }
    }

    /// The backend assignments of `g`'s nodes: a node named `name-il` (llama.cpp's `cb`
    /// names, [`crate::graph::GraphBuilder::cb`], views' ` (view)` suffixes ignored) runs on
    /// block `il`'s device, one tagged `@d` ([`crate::graph::tag_device`]) on device `d`; an
    /// unnamed node on the device of the last named node before it (so the embedding's nodes
    /// run on the first block's device and the head's on the last block's). Not assigned, left to the scheduler: views (no computation; they follow their
    /// source) and nodes whose memory is already allocated (writes into the KV cache, which
    /// run where the cache is). Device k is the scheduler's backend k.
    pub fn assign<'a>(&self, g: &Graph<'a>) -> Vec<(Tensor<'a>, usize)> {
        let mut cur = self.input;
        let mut out = Vec::with_capacity(g.n_nodes());
        for i in 0..g.n_nodes() {
            let t = g.node(i);
            let name = t.name();
            if let Some(d) = device_tag(&name) {
                cur = d;
            } else if let Some(il) = block_of(&name) {
                cur = self.device_of(il);
            }
            if t.is_view_op() || t.has_buffer() {
                continue;
            }
            out.push((t, cur));
        }
        out
    }
}

/// The block index of a graph node named `name-il` (`attn_norm-3`, `Qcur-12 (reshaped)`).
pub fn block_of(name: &str) -> Option<usize> {
    let base = name.split(' ').next()?;
    let (_, n) = base.rsplit_once('-')?;
    n.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(n: usize, shares: &[f64]) -> LayerPlan {
        LayerPlan::new(n, shares).unwrap()
    }

    #[test]
    fn one_device_holds_everything() {
        let p = plan(5, &[1.0]);
        assert_eq!(p.blocks, vec![0..5]);
        assert_eq!((p.input, p.output), (0, 0));
        assert_eq!(p.device_of(4), 0);
        assert_eq!(p.device_of_weight("output.weight"), 0);
    }

    #[test]
    fn shares_split_contiguously_in_proportion() {
        // llama.cpp's `-ts 3,1`: three quarters of the blocks on the first device.
        assert_eq!(plan(4, &[3.0, 1.0]).blocks, vec![0..3, 3..4]);
        assert_eq!(plan(48, &[3.0, 1.0]).blocks, vec![0..36, 36..48]);
        // Equal shares: as even as whole blocks allow, every block exactly once.
        assert_eq!(plan(5, &[1.0, 1.0]).blocks, vec![0..3, 3..5]);
        assert_eq!(plan(7, &[1.0; 3]).blocks, vec![0..2, 2..5, 5..7]);
        // Memory in bytes is a share like any other.
        let p = plan(10, &[22e9, 22e9, 11e9, 11e9]);
        assert_eq!(p.blocks, vec![0..3, 3..7, 7..8, 8..10]);
        assert_eq!((p.input, p.output), (0, 3));
        for (k, r) in p.blocks.iter().enumerate() {
            for il in r.clone() {
                assert_eq!(p.device_of(il), k);
            }
        }
    }

    #[test]
    fn zero_shares_and_more_devices_than_blocks() {
        // A zero share holds nothing; the embedding and head move to the devices that do.
        let p = plan(4, &[0.0, 1.0, 1.0, 0.0]);
        assert_eq!(p.blocks, vec![0..0, 0..2, 2..4, 4..4]);
        assert_eq!((p.input, p.output), (1, 2));
        assert_eq!(p.device_of_weight("token_embd.weight"), 1);
        assert_eq!(p.device_of_weight("output_norm.weight"), 2);
        // Two blocks over three devices: one stays empty, each block on one device.
        let p = plan(2, &[1.0, 1.0, 1.0]);
        assert_eq!(p.blocks.iter().map(|r| r.len()).sum::<usize>(), 2);
        assert_eq!(p.blocks.iter().filter(|r| r.is_empty()).count(), 1);
        assert!(p.input < p.output);
        // No block at all: everything on the first device with a share.
        let p = plan(0, &[0.0, 2.0]);
        assert_eq!((p.input, p.output), (1, 1));
    }

    #[test]
    fn bad_shares_are_refused() {
        assert!(LayerPlan::new(4, &[]).is_err());
        assert!(LayerPlan::new(4, &[0.0, 0.0]).is_err());
        assert!(LayerPlan::new(4, &[1.0, -1.0]).is_err());
        assert!(LayerPlan::new(4, &[1.0, f64::NAN]).is_err());
    }

    #[test]
    fn a_device_tag_wins_over_the_block() {
        use crate::graph::tag_device;
        let t = tag_device("ffn_moe_down-3", 1);
        assert_eq!(t, "ffn_moe_down-3@1");
        assert_eq!(device_tag(&t), Some(1));
        assert_eq!(
            device_tag(&tag_device("ffn_moe_weighted-5 (view)", 0)),
            Some(0)
        );
        assert_eq!(device_tag("ffn_moe_down-3"), None);
        assert_eq!(device_tag(""), None);
    }

    #[test]
    fn names_map_to_blocks_and_devices() {
        assert_eq!(block_of("attn_norm-3"), Some(3));
        assert_eq!(block_of("Qcur-12 (reshaped)"), Some(12));
        assert_eq!(block_of("inp_embd"), None);
        assert_eq!(block_of("result_norm"), None);
        let p = plan(4, &[1.0, 1.0]);
        assert_eq!(p.device_of_weight("blk.3.ffn_gate_exps.weight"), 1);
        assert_eq!(p.device_of_weight("blk.1.attn_q.weight"), 0);
        // A block past the decode stack (multi-token prediction): the output device's.
        assert_eq!(p.device_of_weight("blk.9.attn_q.weight"), 1);
        assert_eq!(p.device_of_weight("rope_freqs.weight"), 0);
        assert_eq!(p.device_of_cache("cache_k_l2"), 1);
        assert_eq!(p.device_of_cache("dsv4_state_kv_l1"), 0);
        assert_eq!(p.device_of_cache("attn_rot_k"), 0);
    }
}
