//! Implementations of the `pocketmoe` subcommands (the binary only parses arguments).
pub mod bench;
pub mod inspect;
pub mod run;
pub mod serve_bench;
pub mod synth;
pub mod tokenize;

/// A progress bar over bytes, on stderr (hidden when stderr is not a terminal).
pub fn byte_progress(total: u64, what: &str) -> indicatif::ProgressBar {
    let pb = indicatif::ProgressBar::new(total);
    pb.set_style(
        indicatif::ProgressStyle::with_template(
            "{msg} [{bar:40}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
        )
        .expect("valid template")
        .progress_chars("=> "),
    );
    pb.set_message(what.to_string());
    pb
}

/// `--cache-type`: the KV cache's element type, as llama.cpp's `-ctk`/`-ctv` (one for both).
pub fn parse_cache_type(s: &str) -> Result<crate::ggml::GgmlType, String> {
    match s.to_ascii_lowercase().as_str() {
        "f16" => Ok(crate::ggml::GgmlType::F16),
        "q8_0" => Ok(crate::ggml::GgmlType::Q8_0),
        other => Err(format!("cache type {other:?}: f16 or q8_0")),
    }
}

/// llama.cpp's `-ngl/--n-gpu-layers` value: a layer count, `auto` or `all`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GpuLayers {
    Count(u32),
    Auto,
    All,
}

impl std::fmt::Display for GpuLayers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            GpuLayers::Count(n) => write!(f, "{n}"),
            GpuLayers::Auto => f.write_str("auto"),
            GpuLayers::All => f.write_str("all"),
        }
    }
}

/// `--n-gpu-layers`: a count of layers (0 or more), `auto` or `all`.
pub fn parse_gpu_layers(s: &str) -> Result<GpuLayers, String> {
    match s.to_ascii_lowercase().as_str() {
        "auto" => Ok(GpuLayers::Auto),
        "all" => Ok(GpuLayers::All),
        n => n
            .parse()
            .map(GpuLayers::Count)
            .map_err(|_| format!("{s:?}: a number of layers (0 = CPU, more = GPU 0), auto or all")),
    }
}

/// What `-ngl`/`--n-gpu-layers` means here, as help text.
pub const GPU_LAYERS_HELP: &str = "llama.cpp's -ngl (also --gpu-layers): PocketMoE does not \
    split a model by layers, so this only picks the device. 0 = the CPU; any other count, auto \
    or all = GPU 0 when this is a CUDA build with a GPU (the CPU otherwise), where the weights \
    other than routed experts and the KV cache go on the GPU and routed experts fill the \
    --gpu-mem budget (default: the GPU's free memory less a margin), the rest staying in host \
    memory. A one-line note at start says what it chose. Use --gpu N / --gpu-mem SIZE for \
    control.";

/// `pocketmoe-serve`'s default `--parallel` (requests decoded together), which `inspect` fits
/// its default context for too.
pub const DEFAULT_PARALLEL: usize = 4;

/// The context per sequence: `given` (`-c`), or what fits beside the model at `path` for
/// `n_seq` sequences (`engine::context`), printed with its reason.
pub fn context_for(
    given: Option<usize>,
    path: &std::path::Path,
    opts: &crate::engine::EngineOptions,
    n_seq: usize,
) -> Result<usize, crate::engine::EngineError> {
    if let Some(c) = given {
        return Ok(c);
    }
    let f = crate::engine::context::fit_context_for(path, opts, n_seq)?;
    let each = if n_seq > 1 {
        format!(" per request × {n_seq} parallel")
    } else {
        String::new()
    };
    eprintln!("context {} tokens{each}: {}", f.ctx, f.why);
    Ok(f.ctx)
}

/// The device for `--cpu`, `--gpu` or `-ngl` (at most one is given; clap makes them exclusive)
/// and, for `-ngl`, the one-line note that says how it was mapped. None of them: GPU 0 on a
/// CUDA build with a GPU, else the CPU ([`crate::engine::Device::Auto`]).
pub fn device_for(
    cpu: bool,
    gpu: Option<usize>,
    ngl: Option<GpuLayers>,
) -> (crate::engine::Device, Option<String>) {
    use crate::engine::Device;
    let Some(ngl) = ngl else {
        return match (cpu, gpu) {
            (true, _) => (Device::Cpu, None),
            (false, Some(i)) => (Device::Cuda(i), None),
            (false, None) if Device::Auto.resolve() == Device::Cpu => {
                (Device::Cpu, Some(no_gpu_note()))
            }
            (false, None) => (Device::Auto, None),
        };
    };
    if ngl == GpuLayers::Count(0) {
        return (
            Device::Cpu,
            Some("note: -ngl 0: running on the CPU (--gpu N to use a GPU)".into()),
        );
    }
    match Device::Auto.resolve() {
        Device::Cuda(i) => (
            Device::Cuda(i),
            Some(format!(
                "note: -ngl {ngl}: running on GPU {i} (as --gpu {i}); PocketMoE places routed \
                 experts by the --gpu-mem budget, not by layers"
            )),
        ),
        d => (
            d,
            Some(format!(
                "note: -ngl {ngl}: no CUDA GPU in this build or machine, running on the CPU"
            )),
        ),
    }
}

/// What running on the CPU by default means here, and how to get a GPU build.
fn no_gpu_note() -> String {
    let why = if cfg!(feature = "cuda") {
        "this CUDA build finds no GPU"
    } else {
        "this build has no CUDA (scripts/build-cuda.sh, or `cargo build --release --features \
         cuda` with a toolkit, builds one)"
    };
    format!("note: running on the CPU: {why}; --cpu silences this note")
}

/// llama.cpp's multi-letter single-dash options (`-ngl 99`, `-np 4`) rewritten to the long
/// names clap knows (`--n-gpu-layers 99`, `--parallel 4`), up to a `--`. `names` pairs each
/// short spelling with its long name; `-X=V` becomes `--long=V`.
pub fn llama_flags<I: IntoIterator<Item = std::ffi::OsString>>(
    args: I,
    names: &[(&str, &str)],
) -> Vec<std::ffi::OsString> {
    let mut out = Vec::new();
    let mut done = false;
    for a in args {
        let s = a.to_str().unwrap_or("");
        done |= s == "--";
        let hit = names.iter().find_map(|&(short, long)| {
            let rest = s.strip_prefix(short)?;
            (rest.is_empty() || rest.starts_with('=')).then(|| format!("{long}{rest}"))
        });
        match hit {
            Some(long) if !done => out.push(long.into()),
            _ => out.push(a),
        }
    }
    out
}

/// The GPUs a command line runs on: those of `--gpu` (`gpus`); without it, on a GPU (`device`
/// from [`device_for`], not the CPU), every visible CUDA device, as llama.cpp spreads a model
/// over all GPUs by default (`-sm none` keeps the first alone, [`split_for`]).
pub fn gpus_for(gpus: &[usize], device: crate::engine::Device) -> Vec<usize> {
    gpus_for_visible(gpus, device, crate::ggml::Backend::cuda_device_count())
}

/// [`gpus_for`] on a machine with `visible` CUDA devices.
fn gpus_for_visible(gpus: &[usize], device: crate::engine::Device, visible: usize) -> Vec<usize> {
    if gpus.is_empty() && device != crate::engine::Device::Cpu && visible > 1 {
        (0..visible).collect()
    } else {
        gpus.to_vec()
    }
}

/// `--gpu-mem` as given: one budget for every device (`gpu_mem`), or one per device of a layer
/// split (`gpu_mems`, two or more).
pub fn budgets_for(list: &[u64]) -> (Option<u64>, Vec<u64>) {
    match list {
        [] => (None, Vec::new()),
        [one] => (Some(*one), Vec::new()),
        many => (None, many.to_vec()),
    }
}

/// What a command line's device options ask for ([`split_for`]).
#[derive(Debug, Clone, PartialEq)]
pub struct SplitChoice {
    /// `EngineOptions::devices` (empty: one device).
    pub devices: Vec<crate::engine::Device>,
    /// `EngineOptions::tensor_split`.
    pub tensor_split: Vec<f64>,
    /// `EngineOptions::split_tensors`: tensor parallelism instead of the layer split.
    pub tensors: bool,
    /// `EngineOptions::expert_parallel`: the layer split with the routed experts placed by
    /// expert id over every device (`-sm expert`).
    pub experts: bool,
    /// A note to print where an option has no effect.
    pub note: Option<String>,
}

/// The devices and split a command line asks for: `--gpu 0,1` (several GPUs), llama.cpp's
/// `-sm/--split-mode` (`layer`, the default with several GPUs: whole blocks per GPU,
/// `engine::split`; `tensor`, alias `row`: every weight cut across the GPUs,
/// `engine::tensor_split`; `expert`, ours: the layer split with every device caching a share of
/// every layer's routed experts, `EngineOptions::expert_parallel`; `none`: the first GPU only) and `-ts/--tensor-split` (each GPU's
/// share of the blocks, or of every cut dimension; `3,1` or `3/1`). Refused: `graph`
/// (ik_llama.cpp's mode, not built), an unknown mode, a bad share.
pub fn split_for(
    gpus: &[usize],
    split_mode: Option<&str>,
    tensor_split: Option<&str>,
) -> anyhow::Result<SplitChoice> {
    use crate::engine::Device;
    let (several, tensors, experts) = match split_mode.map(str::to_ascii_lowercase).as_deref() {
        None | Some("layer") => (true, false, false),
        Some("tensor" | "row") => (true, true, false),
        Some("expert") => (true, false, true),
        Some("none") => (false, false, false),
        Some("graph") => anyhow::bail!(
            "-sm graph (ik_llama.cpp's split) is not built; -sm tensor cuts every weight \
             across the GPUs, -sm layer (the default with --gpu 0,1,...) splits whole blocks"
        ),
        Some(m) => {
            anyhow::bail!("-sm {m}: unknown split mode (layer, tensor or row, expert, none)")
        }
    };
    let ts = match tensor_split {
        None => Vec::new(),
        Some(list) => list
            .split([',', '/'])
            .map(|x| {
                x.trim().parse::<f64>().map_err(|_| {
                    anyhow::anyhow!("-ts {list}: {x:?} is not a number (e.g. -ts 3,1)")
                })
            })
            .collect::<anyhow::Result<_>>()?,
    };
    if gpus.len() > 1 && several {
        let devices = gpus.iter().map(|&i| Device::Cuda(i)).collect();
        return Ok(SplitChoice {
            devices,
            tensor_split: ts,
            tensors,
            experts,
            note: None,
        });
    }
    let mut notes = Vec::new();
    if !ts.is_empty() {
        notes.push("-ts/--tensor-split");
    }
    if tensors {
        notes.push("-sm tensor");
    }
    if experts {
        notes.push("-sm expert");
    }
    let note = (!notes.is_empty() && gpus.len() <= 1).then(|| {
        format!(
            "note: {} has no effect with one device (give several: --gpu 0,1)",
            notes.join(" and ")
        )
    });
    Ok(SplitChoice {
        devices: Vec::new(),
        tensor_split: Vec::new(),
        tensors: false,
        experts: false,
        note,
    })
}

/// The llama.cpp spellings `pocketmoe-serve` takes (llama-server's names).
pub const SERVE_LLAMA_FLAGS: &[(&str, &str)] = &[
    ("-ngl", "--n-gpu-layers"),
    ("-np", "--parallel"),
    ("-ctk", "--cache-type-k"),
    ("-ctv", "--cache-type-v"),
    ("-fa", "--flash-attn"),
    ("-ub", "--ubatch-size"),
    ("-hfr", "--hf-repo"),
    ("-hff", "--hf-file"),
    ("-hf", "--hf-repo"),
    ("-hft", "--hf-token"),
    ("-mu", "--model-url"),
    ("-cb", "--cont-batching"),
    ("-nocb", "--no-cont-batching"),
    ("-kvu", "--kv-unified"),
    ("-no-kvu", "--no-kv-unified"),
    ("-ncmoe", "--n-cpu-moe"),
    ("-cmoe", "--cpu-moe"),
    ("-tb", "--threads-batch"),
    ("-to", "--timeout"),
    ("-dev", "--device"),
    ("-sm", "--split-mode"),
    ("-ts", "--tensor-split"),
    ("-mg", "--main-gpu"),
    ("-cram", "--cache-ram"),
    ("-dt", "--defrag-thold"),
    ("-sps", "--slot-prompt-similarity"),
    ("-sp", "--special"),
];
/// The llama.cpp spellings `pocketmoe` subcommands take (llama-cli's names).
pub const CLI_LLAMA_FLAGS: &[(&str, &str)] = &[
    ("-ngl", "--n-gpu-layers"),
    ("-ts", "--tensor-split"),
    ("-sm", "--split-mode"),
    ("-hfr", "--hf-repo"),
    ("-hff", "--hf-file"),
    ("-hf", "--hf-repo"),
    ("-hft", "--hf-token"),
];

use crate::engine::Engine;
use crate::ggml::llama::LlamaContext;

/// Something that turns tokens into next-token logits: our engine, or libllama (the reference),
/// so `run --reference` and `bench` drive both the same way.
pub trait Decoder {
    /// Starts a fresh sequence with `tokens`; returns the last position's logits.
    fn prefill(&mut self, tokens: &[u32]) -> anyhow::Result<Vec<f32>>;
    /// Appends one token; returns its logits.
    fn step(&mut self, token: u32) -> anyhow::Result<Vec<f32>>;
}

impl Decoder for Engine {
    fn prefill(&mut self, tokens: &[u32]) -> anyhow::Result<Vec<f32>> {
        self.reset();
        Ok(self.forward_last(tokens)?)
    }
    fn step(&mut self, token: u32) -> anyhow::Result<Vec<f32>> {
        Ok(self.forward_last(&[token])?)
    }
}

/// libllama behind [`Decoder`].
pub struct LlamaDecoder<'m> {
    pub ctx: LlamaContext<'m>,
    pub n_past: usize,
}

impl Decoder for LlamaDecoder<'_> {
    fn prefill(&mut self, tokens: &[u32]) -> anyhow::Result<Vec<f32>> {
        self.ctx.clear();
        let t: Vec<i32> = tokens.iter().map(|&x| x as i32).collect();
        let l = self.ctx.eval_last(&t, 0)?;
        self.n_past = tokens.len();
        Ok(l)
    }
    fn step(&mut self, token: u32) -> anyhow::Result<Vec<f32>> {
        let l = self.ctx.eval_last(&[token as i32], self.n_past)?;
        self.n_past += 1;
        Ok(l)
    }
}

#[cfg(test)]
mod tests {
    use super::{budgets_for, gpus_for_visible, split_for};
    use crate::engine::Device;

    #[test]
    fn every_visible_gpu_by_default_and_budgets_per_device() {
        // No --gpu on a GPU: all visible GPUs (one: as before, no split).
        assert_eq!(gpus_for_visible(&[], Device::Auto, 4), vec![0, 1, 2, 3]);
        assert_eq!(gpus_for_visible(&[], Device::Cuda(0), 2), vec![0, 1]);
        assert!(gpus_for_visible(&[], Device::Auto, 1).is_empty());
        // --gpu given, or --cpu: as given.
        assert_eq!(gpus_for_visible(&[1], Device::Cuda(1), 4), vec![1]);
        assert!(gpus_for_visible(&[], Device::Cpu, 4).is_empty());
        // --gpu-mem: one for all, or one per device.
        assert_eq!(budgets_for(&[]), (None, vec![]));
        assert_eq!(budgets_for(&[8]), (Some(8), vec![]));
        assert_eq!(budgets_for(&[8, 4]), (None, vec![8, 4]));
    }

    #[test]
    fn split_options_follow_llama_cpp() {
        // Several GPUs: a layer split, -ts as given (commas or slashes).
        let c = split_for(&[0, 1], None, Some("3,1")).unwrap();
        assert_eq!(c.devices, vec![Device::Cuda(0), Device::Cuda(1)]);
        assert_eq!(c.tensor_split, vec![3.0, 1.0]);
        assert!(c.note.is_none() && !c.tensors);
        let c = split_for(&[0, 1], Some("layer"), Some("3/1")).unwrap();
        assert_eq!(c.tensor_split, vec![3.0, 1.0]);
        // -sm none: the first GPU alone; one GPU: -ts has no effect (a note says so).
        assert!(split_for(&[0, 1], Some("none"), None)
            .unwrap()
            .devices
            .is_empty());
        let c = split_for(&[0], None, Some("1,1")).unwrap();
        assert!(c.devices.is_empty() && c.tensor_split.is_empty() && c.note.is_some());
        // Tensor parallelism: -sm tensor, or llama.cpp's older name row.
        for m in ["tensor", "row", "ROW"] {
            let c = split_for(&[0, 1], Some(m), Some("1,1")).unwrap();
            assert!(c.tensors && c.devices.len() == 2, "{m}");
        }
        // ... with one GPU: no effect, said.
        let c = split_for(&[0], Some("tensor"), None).unwrap();
        assert!(!c.tensors && c.note.unwrap().contains("-sm tensor"));
        // ik_llama.cpp's graph split is not built: refused, never silently another split.
        let e = split_for(&[0, 1], Some("graph"), None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("not built"), "{e}");
        // Expert parallelism: the layer split, every GPU caching a share of every layer's
        // experts; with one GPU no effect, said.
        let c = split_for(&[0, 1], Some("expert"), None).unwrap();
        assert!(c.experts && !c.tensors && c.devices.len() == 2);
        let c = split_for(&[0], Some("expert"), None).unwrap();
        assert!(!c.experts && c.note.unwrap().contains("-sm expert"));
        assert!(split_for(&[0, 1], Some("diagonal"), None).is_err());
        assert!(split_for(&[0, 1], None, Some("3,x")).is_err());
    }
}
