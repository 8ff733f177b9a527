//! `inspect` figures: on tiny synth presets (consistent with the file and libllama) and on real
//! GGUFs from a registry package (the vocab-only files the llama-cpp-python sdist ships, fetched by
//! scripts/fetch-fixtures.sh), compared with ggml's own GGUF parser and libllama.
use pocketmoe::cli::inspect::{parse_bytes, report, InspectArgs};
use pocketmoe::ggml::gguf_ref;
use pocketmoe::ggml::llama::LlamaModel;
use pocketmoe::gguf::{GgufModel, Metadata};
use pocketmoe::model::placement::kv_bytes;
use pocketmoe::synth::{self, presets, quantmix::QuantMix, SynthOptions};
use std::path::{Path, PathBuf};

mod common;

fn args(model: &Path, gpu_mem: u64) -> InspectArgs {
    InspectArgs {
        model: model.to_path_buf(),
        json: false,
        gpu_mem,
        ctx: Some(4096),
        parallel: 1,
        hit_rate: None,
        hbm_gbps: 4470.0,
        pcie_gbps: 50.7,
        cpu_gbps: 68.0,
    }
}

fn tiny(arch: &str) -> PathBuf {
    let dir = common::process_dir("pocketmoe-inspect");
    let out = dir.join(format!("{arch}.gguf"));
    let opts = SynthOptions {
        arch: arch.into(),
        preset: "tiny".into(),
        quant: QuantMix::Q4KM,
        routing_skew: 1.0,
        seed: 3,
        out: out.clone(),
    };
    synth::synth(&opts, &|_, _| {}).unwrap();
    out
}

#[test]
fn tiny_report_adds_up() {
    for arch in ["qwen3moe", "deepseek2", "gpt-oss"] {
        let path = tiny(arch);
        let model = GgufModel::open(&path).unwrap();
        let total: u64 = model.tensors().map(|t| t.n_bytes).sum();
        // A budget that holds the resident parts and exactly half the experts.
        let big = report(&args(&path, 1 << 40)).unwrap();
        assert!(big.supported && big.valid, "{arch}: {:?}", big.findings);
        let p = big.placement.as_ref().unwrap();
        assert_eq!(
            big.by_role.values().map(|&(_, b)| b).sum::<u64>(),
            total,
            "{arch}: roles do not cover the file"
        );
        assert_eq!(
            big.by_type.values().map(|&(_, b)| b).sum::<u64>(),
            total,
            "{arch}: types do not cover the file"
        );
        assert_eq!(
            p.resident_bytes + p.host_bytes + p.expert_bytes_total,
            total,
            "{arch}: resident + host + experts != file"
        );
        let embd = big.by_role.get("Embedding").map_or(0, |&(_, b)| b);
        assert!(embd > 0, "{arch}: no embedding role");
        let tied = !big.by_role.contains_key("Output");
        assert_eq!(
            p.host_bytes,
            if tied { 0 } else { embd },
            "{arch}: host part"
        );
        assert_eq!(
            p.experts_cached, p.n_experts_total,
            "{arch}: 1 TiB holds every expert"
        );
        let hp = presets::find(arch, "tiny").unwrap().hparams;
        assert_eq!(p.kv_bytes, kv_bytes(&hp, 4096));
        let fixed = p.resident_bytes + p.kv_bytes + p.compute_bytes;
        let half = fixed + p.expert_bytes_each * (p.n_experts_total / 2);
        let r = report(&args(&path, half)).unwrap();
        let p = r.placement.unwrap();
        assert_eq!(
            p.experts_cached,
            p.n_experts_total / 2,
            "{arch}: half the experts fit"
        );
        assert!((p.hit_rate - 0.5).abs() < 1e-9);
        assert!(
            p.bound_pcie_and_cpu >= p.bound_pcie_only
                && p.bound_all_in_vram >= p.bound_pcie_and_cpu
        );
        let tiny_budget = report(&args(&path, fixed / 2)).unwrap().placement.unwrap();
        assert!(
            !tiny_budget.fits && tiny_budget.experts_cached == 0,
            "{arch}: a budget below the resident parts"
        );
    }
}

#[test]
fn kv_bytes_follow_the_attention_kind() {
    let q = presets::find("qwen3moe", "qwen3-30b-a3b").unwrap().hparams;
    // 48 layers x 4 kv heads x 128 x (K + V) x f16.
    assert_eq!(kv_bytes(&q, 4096), 48 * 4096 * (4 * 128 * 2) * 2);
    let d = presets::find("deepseek2", "deepseek-v3").unwrap().hparams;
    // MLA caches the 512-wide latent plus the 64-wide rotary key per token and layer.
    assert_eq!(kv_bytes(&d, 1000), 61 * 1000 * (512 + 64) * 2);
    let g = presets::find("gpt-oss", "gpt-oss-20b").unwrap().hparams;
    // Half the layers are sliding-window (128 tokens).
    assert_eq!(kv_bytes(&g, 8192), 12 * (128 + 8192) * (8 * 64 * 2) * 2);
}

#[test]
fn byte_sizes_parse() {
    assert_eq!(parse_bytes("8GiB").unwrap(), 8 << 30);
    assert_eq!(parse_bytes("12 GB").unwrap(), 12_000_000_000);
    assert_eq!(parse_bytes("512MiB").unwrap(), 512 << 20);
    assert_eq!(parse_bytes("1000").unwrap(), 1000);
    for bad in ["", "GiB", "8 parsecs", "-3G", "1e30"] {
        assert!(parse_bytes(bad).is_err(), "{bad:?} parsed");
    }
}

#[test]
fn unsupported_and_broken_files_are_reported_not_panicked() {
    let dir = common::process_dir("pocketmoe-inspect-bad");
    let junk = dir.join("junk.gguf");
    std::fs::write(&junk, b"GGUF\x03\x00\x00\x00garbage").unwrap();
    let e = format!("{:#}", report(&args(&junk, 1 << 30)).unwrap_err());
    assert!(e.contains("junk.gguf"), "{e}");
    let missing = dir.join("missing.gguf");
    let e = format!("{:#}", report(&args(&missing, 1 << 30)).unwrap_err());
    assert!(e.contains("missing.gguf"), "{e}");
}

/// The vocab-only GGUFs from the llama-cpp-python sdist (fetched once by the script).
fn real_vocab_files() -> Vec<PathBuf> {
    let dir = common::fixtures().join("vocab");
    let mut v: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "gguf"))
        .collect();
    v.sort();
    assert!(
        v.len() >= 10,
        "expected the sdist's vocab GGUFs in {}, found {v:?}",
        dir.display()
    );
    v
}

#[test]
fn real_gguf_files_match_ggml_and_libllama() {
    for path in real_vocab_files() {
        let ours = GgufModel::open(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let theirs =
            gguf_ref::read_file(&path).unwrap_or_else(|| panic!("ggml rejects {}", path.display()));
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        assert_eq!(
            ours.metadata().len(),
            theirs.kvs.len(),
            "{name}: metadata count"
        );
        for (kv, (k, _)) in theirs.kvs.iter().zip(ours.metadata()) {
            assert_eq!(&kv.key, k, "{name}: key order");
        }
        assert_eq!(
            ours.n_tensors(),
            theirs.tensors.len(),
            "{name}: tensor count"
        );
        let tokens = ours
            .get_str_array("tokenizer.ggml.tokens")
            .map_or(0, |t| t.len());
        assert!(tokens > 1000, "{name}: {tokens} tokens");
        // libllama reads the same vocabulary size.
        let lm = LlamaModel::load_vocab(&path).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(lm.n_vocab(), tokens, "{name}: libllama vocabulary size");
        // inspect reports why these (dense, weightless) files cannot run instead of failing:
        // an architecture outside the registry is named; a registered one (`llama`, which
        // covers Mixtral) fails on its hyper-parameters, since these files have no experts.
        let r = report(&args(&path, 8 << 30)).unwrap();
        let arch = ours.get_str("general.architecture").unwrap();
        assert_eq!(r.architecture, arch);
        assert!(
            !r.valid,
            "{name}: a vocab-only {arch} file passed validation"
        );
        let why = if r.supported { "expert" } else { arch };
        assert!(
            r.findings.iter().any(|f| f.contains(why)),
            "{name}: {:?}",
            r.findings
        );
    }
}

/// `inspect` without `--ctx` plans for the context `pocketmoe-serve` picks with the same budget
/// and its default `--parallel`, not a fixed 4096 (issue 27): a file trained for 32768 positions
/// whose KV cache fits beside it gets 32768 from both, for every one of the parallel sequences.
#[test]
fn default_context_is_the_one_pocketmoe_serve_fits() {
    use clap::Parser as _;
    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        inspect: InspectArgs,
    }
    let base = tiny("qwen3moe");
    let path = base.with_extension("ctx32k.gguf");
    common::write_with_key(
        &GgufModel::open(&base).unwrap(),
        "qwen3moe.context_length",
        &pocketmoe::gguf::GgufValue::U32(32768),
        &path,
    );
    for budget in ["1TiB", "24GiB"] {
        let cli = Cli::parse_from(["inspect", path.to_str().unwrap(), "--gpu-mem", budget]);
        let rep = report(&cli.inspect).unwrap();
        // What pocketmoe-serve runs: `cli::context_for` -> `fit_context_for` with its defaults
        // (micro-batch 512, f16 KV, --parallel 4) on a GPU with this budget.
        let serve = pocketmoe::engine::EngineOptions {
            device: pocketmoe::engine::Device::Cuda(0),
            gpu_mem: Some(parse_bytes(budget).unwrap()),
            n_ubatch: 512,
            ..Default::default()
        };
        let fit = pocketmoe::engine::context::fit_context_for(&path, &serve, 4).unwrap();
        assert_eq!(fit.ctx, 32768, "{budget}: {}", fit.why);
        let p = rep.placement.unwrap();
        assert_eq!(
            p.n_ctx as usize,
            pocketmoe::engine::batch::rows_for(4, fit.ctx),
            "{budget}: inspect's KV positions are not pocketmoe-serve's 4 x {}",
            fit.ctx
        );
        assert_eq!(p.kv_bytes, kv_bytes(&rep_hp(&path), p.n_ctx));
    }
}

fn rep_hp(path: &Path) -> pocketmoe::model::Hparams {
    let model = GgufModel::open(path).unwrap();
    let arch = pocketmoe::arch::by_name("qwen3moe").unwrap();
    pocketmoe::model::Hparams::from_meta(&arch.spec, &model).unwrap()
}
