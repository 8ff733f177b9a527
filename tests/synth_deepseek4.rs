//! The DeepSeek-V4-Flash preset (`deepseek-v4-flash`): its shape is the published config's, and
//! `inspect` plans its placement from a header-only file in the seed's mix (the data a sparse
//! hole: 284B parameters are not written on a CI machine). The tiny deepseek4 that libllama
//! runs is tested in `synth_llama.rs`.
mod common;

use clap::Parser as _;
use pocketmoe::cli::inspect::{report, InspectArgs};
use pocketmoe::model::hparams::{Gating, RopeScaling};
use pocketmoe::synth::{self, presets, quantmix::QuantMix, SynthOptions};
use std::path::Path;

/// `pocketmoe inspect MODEL --gpu-mem BUDGET`, the other options the command line's defaults.
fn args(model: &Path, gpu_mem: &str) -> InspectArgs {
    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        inspect: InspectArgs,
    }
    let model = model.to_str().unwrap();
    Cli::parse_from(["inspect", model, "--gpu-mem", gpu_mem]).inspect
}

/// Every value against config.json of deepseek-ai/DeepSeek-V4-Flash (the numbers below are the
/// config's, transcribed independently of the preset's).
#[test]
fn deepseek_v4_flash_preset_is_the_published_config() {
    let h = presets::find("deepseek4", "deepseek-v4-flash")
        .unwrap()
        .hparams;
    // (As f32: every integer here is exact in one.)
    for (field, ours, config) in [
        ("hidden_size", h.n_embd as f32, 4096.0),
        ("num_hidden_layers", h.n_layer as f32, 43.0),
        ("num_attention_heads", h.n_head as f32, 64.0),
        ("num_key_value_heads", h.n_head_kv as f32, 1.0),
        ("head_dim", h.head_dim_k as f32, 512.0),
        ("head_dim (values)", h.head_dim_v as f32, 512.0),
        ("qk_rope_head_dim", h.n_rot as f32, 64.0),
        ("q_lora_rank", h.mla.q_lora_rank as f32, 1024.0),
        ("o_groups", h.dsv4.o_group_count as f32, 8.0),
        ("o_lora_rank", h.dsv4.o_lora_rank as f32, 1024.0),
        ("n_routed_experts", h.n_expert as f32, 256.0),
        ("n_shared_experts", h.n_expert_shared as f32, 1.0),
        ("num_experts_per_tok", h.n_expert_used as f32, 6.0),
        ("moe_intermediate_size", h.n_ff_exp as f32, 2048.0),
        ("index_n_heads", h.indexer.n_head as f32, 64.0),
        ("index_head_dim", h.indexer.head_dim as f32, 128.0),
        ("index_topk", h.indexer.top_k as f32, 512.0),
        ("sliding_window", h.swa.window as f32, 128.0),
        ("num_hash_layers", h.dsv4.hash_layer_count as f32, 3.0),
        ("hc_mult", h.dsv4.hc_mult as f32, 4.0),
        ("hc_sinkhorn_iters", h.dsv4.hc_sinkhorn_iters as f32, 20.0),
        ("vocab_size", h.n_vocab as f32, 129280.0),
        ("max_position_embeddings", h.n_ctx_train as f32, 1048576.0),
        (
            "original_max_position_embeddings",
            h.n_ctx_orig_yarn as f32,
            65536.0,
        ),
        ("rope_theta", h.rope_freq_base, 10000.0),
        (
            "compress_rope_theta",
            h.dsv4.compress_rope_freq_base,
            160000.0,
        ),
        ("routed_scaling_factor", h.expert_weights_scale, 1.5),
        ("swiglu_limit", h.dsv4.swiglu_clamp_exp, 10.0),
        ("swiglu_limit (shared)", h.dsv4.swiglu_clamp_shexp, 10.0),
        ("rope_scaling.factor", h.rope_scaling_factor, 16.0),
        ("hc_eps", h.dsv4.hc_eps, 1e-6),
        ("rms_norm_eps", h.rms_eps, 1e-6),
    ] {
        assert_eq!(ours, config, "{field}");
    }
    assert_eq!(
        (h.gating, h.expert_weights_norm, h.rope_scaling),
        (Gating::SqrtSoftplus, true, RopeScaling::Yarn),
        "scoring_func sqrtsoftplus, norm_topk_prob, rope_scaling yarn"
    );
    // The config's 44 ratios (43 blocks, then the MTP block the preset leaves out).
    let mut config = vec![0, 0];
    for _ in 0..20 {
        config.extend([4, 128]);
    }
    config.extend([4, 0]);
    assert_eq!(h.dsv4.compress_ratios[..], config[..43]);
    assert!(h.swa.layers.len() == 43 && h.swa.layers.iter().all(|&w| w));
}

/// The header-only file in the seed's mix: 284B parameters as published, sparse on the disk,
/// and `inspect` validates it and plans its placement at 24 GiB and at 1 TiB.
#[test]
fn deepseek_v4_flash_header_inspects() {
    let dir = common::process_dir("pocketmoe-dsv4");
    let out = dir.join("deepseek-v4-flash.gguf");
    let opts = SynthOptions {
        arch: "deepseek4".into(),
        preset: "deepseek-v4-flash".into(),
        quant: QuantMix::Dsv4Seed,
        routing_skew: 1.0,
        seed: 1,
        out: out.clone(),
    };
    let written = synth::synth_header_only(&opts).unwrap();
    let meta = std::fs::metadata(&out).unwrap();
    assert_eq!(meta.len(), written.bytes);
    {
        use std::os::unix::fs::MetadataExt as _;
        assert!(
            meta.blocks() * 512 < 256 << 20,
            "{} bytes on the disk: not sparse",
            meta.blocks() * 512
        );
    }
    let rep = report(&args(&out, "24GiB")).unwrap();
    assert!(
        rep.supported && rep.valid,
        "{:?} {:?}",
        rep.supported,
        rep.findings
    );
    let params: u64 = pocketmoe::gguf::GgufModel::open(&out)
        .unwrap()
        .tensors()
        .map(|t| t.n_elements())
        .sum();
    assert!(
        (283_000_000_000..=286_000_000_000).contains(&params),
        "{params} parameters, not DeepSeek-V4-Flash's 284B"
    );
    // The seed's types: IQ2_XXS the larger part (gate and up), Q2_K the down projections.
    let bytes = |ty: &str| rep.by_type.get(ty).map_or(0, |&(_, b)| b);
    let (iq2, q2k, q8) = (bytes("iq2_xxs"), bytes("q2_K"), bytes("q8_0"));
    assert!(
        iq2 > q2k && q2k > q8 && q8 > 0,
        "iq2_xxs {iq2}, q2_K {q2k}, q8_0 {q8}"
    );
    let total: u64 = rep.by_type.values().map(|&(_, b)| b).sum();
    let p = rep.placement.as_ref().unwrap();
    assert_eq!(
        p.resident_bytes + p.host_bytes + p.expert_bytes_total,
        total
    );
    assert_eq!(p.n_experts_total, 43 * 256);
    // 24 GiB (and the seed's 22 GiB cards) hold the resident parts and part of the experts.
    assert!(
        p.fits && p.experts_cached > 0 && p.experts_cached < p.n_experts_total,
        "24 GiB caches {} of {} experts (resident parts fit: {})",
        p.experts_cached,
        p.n_experts_total,
        p.fits
    );
    let card = report(&args(&out, "22GiB")).unwrap().placement.unwrap();
    assert!(card.fits && card.experts_cached > 0 && card.experts_cached < p.experts_cached);
    let big = report(&args(&out, "1TiB")).unwrap().placement.unwrap();
    assert_eq!(big.experts_cached, big.n_experts_total);
    std::fs::remove_file(&out).ok();
}

/// The same from the command line: `pocketmoe synth --header-only` then `pocketmoe inspect`,
/// which prints the placement plan of the V4-Flash shape in the seed's mix.
#[test]
fn deepseek_v4_flash_header_from_the_command_line() {
    let dir = common::process_dir("pocketmoe-dsv4-cli");
    let out = dir.join("v4.gguf");
    let run = |args: &[&str]| {
        let o = std::process::Command::new(env!("CARGO_BIN_EXE_pocketmoe"))
            .args(args)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&o.stdout).into_owned();
        assert!(
            o.status.success(),
            "{args:?}: {text}{}",
            String::from_utf8_lossy(&o.stderr)
        );
        text
    };
    let path = out.to_str().unwrap();
    let wrote = run(&[
        "synth",
        "--arch",
        "deepseek4",
        "--preset",
        "deepseek-v4-flash",
        "--quant",
        "dsv4-seed",
        "--header-only",
        "-o",
        path,
    ]);
    assert!(wrote.contains("sparse"), "{wrote}");
    let shown = run(&["inspect", path, "--gpu-mem", "24GiB"]);
    for want in [
        "deepseek4",
        "block_count=43",
        "iq2_xxs",
        "q2_K",
        "expert cache",
        "of 11008 experts",
    ] {
        assert!(shown.contains(want), "{want:?} not in:\n{shown}");
    }
    std::fs::remove_file(&out).ok();
}

/// A hash layer's expert-id table (`ffn_gate_tid2eid`) with an id past `expert_count` is
/// refused at load, naming the tensor, the id and the key: the graph hands the ids to the expert
/// matmuls unchecked, so loading it would index past the experts.
#[test]
fn an_expert_id_out_of_range_is_refused_at_load() {
    use std::io::{Seek, SeekFrom, Write};
    let dir = common::process_dir("pocketmoe-dsv4-ids");
    let path = dir.join("tiny.gguf");
    synth::synth(
        &SynthOptions {
            arch: "deepseek4".into(),
            preset: "tiny".into(),
            quant: QuantMix::Q8_0,
            routing_skew: 1.0,
            seed: 3,
            out: path.clone(),
        },
        &|_, _| {},
    )
    .unwrap();
    let name = "blk.1.ffn_gate_tid2eid.weight";
    let (offset, n_expert) = {
        let m = pocketmoe::gguf::GgufModel::open(&path).unwrap();
        let h = presets::find("deepseek4", "tiny").unwrap().hparams;
        (m.tensor(name).unwrap().offset, h.n_expert)
    };
    // The untouched file loads.
    let opts = || pocketmoe::engine::EngineOptions {
        n_ctx: 256,
        n_threads: 2,
        ..Default::default()
    };
    assert!(pocketmoe::engine::Engine::load(&path, opts(), &|_, _| {}).is_ok());
    // Token 5's third expert id becomes expert_count.
    let mut f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    let k = presets::find("deepseek4", "tiny")
        .unwrap()
        .hparams
        .n_expert_used;
    f.seek(SeekFrom::Start(offset + 4 * (5 * k + 2))).unwrap();
    f.write_all(&(n_expert as i32).to_le_bytes()).unwrap();
    drop(f);
    let e = match pocketmoe::engine::Engine::load(&path, opts(), &|_, _| {}) {
        Ok(_) => panic!("an expert id of {n_expert} loaded"),
        Err(e) => e.to_string(),
    };
    for want in [
        name,
        &format!("expert id {n_expert}"),
        "deepseek4.expert_count",
    ] {
        assert!(e.contains(want), "error {e:?} does not say {want:?}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
