//! `pocketmoe synth --upcycle`: a dense Llama-architecture GGUF turned into a Mixture-of-Experts
//! GGUF of the `llama` (Mixtral) architecture that answers exactly as the dense model does.
//!
//! Every block's dense SwiGLU FFN (`ffn_gate`/`ffn_up`/`ffn_down`) becomes `n_expert` identical
//! experts (`ffn_*_exps`: the dense tensor's bytes copied `n_expert` times along the expert
//! dimension, same quantisation), and a router `ffn_gate_inp` (F32) is added. The llama arch
//! routes by softmax and renormalises the top-k weights to sum to 1 (llama.cpp `build_moe_ffn`
//! with `norm_w = true`), so the block computes `sum_i w_i * FFN(x)`. The router's rows come in
//! groups of `n_expert_used` identical random rows: a token picks one group (which one depends on
//! the token, so the expert cache sees real hits and misses), its experts get equal
//! probabilities `p`, and each weight is `p / (k p)`. For k = 1 that is exactly 1, for k = 2
//! exactly 0.5 and `0.5 F + 0.5 F = F` exactly: the MoE's output is the dense model's bit for
//! bit (tests/upcycle.rs). Larger k are exact only up to rounding (`0.25 F + 0.25 F + 0.25 F`
//! rounds). Independent random rows would not be exact even for k = 2 (`w1 + w2 = 1` only up to
//! an ulp, and the next matmul's 8-bit requantisation of its input amplifies an ulp into a
//! visible logit change: measured max |dlogit| 0.92 on SmolLM2-135M). Tokenizer, chat template
//! and every other key are carried over.
use super::SynthError;
use crate::ggml::GgmlType;
use crate::gguf::{GgufModel, GgufValue, GgufWriter, TensorInfo};
use crate::util::Rng;
use std::path::{Path, PathBuf};

/// What `upcycle` reads and writes.
#[derive(Debug, Clone)]
pub struct UpcycleOptions {
    pub src: PathBuf,
    pub out: PathBuf,
    pub n_expert: u32,
    pub n_expert_used: u32,
    pub seed: u64,
}

/// What `upcycle` wrote.
#[derive(Debug, Clone)]
pub struct UpcycleReport {
    pub path: PathBuf,
    pub bytes: u64,
    pub n_tensors: usize,
    pub n_layer: usize,
}

/// Router logits' standard deviation for unit-RMS inputs: decisive (top-k far from ties, so two
/// correct engines pick the same experts), as synth's routers.
const ROUTER_STD: f32 = 4.0;
/// llama.cpp's `LLAMA_MAX_EXPERTS`.
const MAX_EXPERTS: u32 = 512;
const FFN: [&str; 3] = ["ffn_gate", "ffn_up", "ffn_down"];

/// One output tensor and where its bytes come from.
enum Source<'a> {
    /// Copied as is.
    Same(&'a TensorInfo),
    /// The dense tensor repeated once per expert.
    Experts(&'a TensorInfo),
    /// A router's random F32 rows.
    Router,
}

/// The block index and FFN name of a dense `blk.N.ffn_{gate,up,down}.weight`.
fn dense_ffn(name: &str) -> Option<(usize, &'static str)> {
    let rest = name.strip_prefix("blk.")?;
    let (il, t) = rest.split_once('.')?;
    let t = t.strip_suffix(".weight")?;
    Some((il.parse().ok()?, FFN.into_iter().find(|f| *f == t)?))
}

/// Writes the upcycled model. `progress(done, total)` is called with bytes written.
pub fn upcycle(
    opts: &UpcycleOptions,
    progress: &(dyn Fn(u64, u64) + Sync),
) -> Result<UpcycleReport, SynthError> {
    let bad = |m: String| SynthError::Options(format!("{}: {m}", opts.src.display()));
    let (n, k) = (opts.n_expert, opts.n_expert_used);
    if !(2..=MAX_EXPERTS).contains(&n) || !(1..=n).contains(&k) || n % k != 0 {
        return Err(SynthError::Options(format!(
            "--experts {n} --experts-used {k}: need 2 <= experts <= {MAX_EXPERTS} and \
             experts-used dividing experts (the router's rows come in groups of experts-used)"
        )));
    }
    let m = GgufModel::open(&opts.src)?;
    let meta = m.metadata();
    let arch = meta
        .get("general.architecture")
        .and_then(GgufValue::as_str)
        .unwrap_or("");
    if arch != "llama" {
        return Err(bad(format!(
            "architecture {arch:?}: --upcycle takes a dense `llama` model (Llama, SmolLM2, …)"
        )));
    }
    if meta
        .get("llama.expert_count")
        .and_then(GgufValue::as_u64)
        .is_some_and(|e| e > 0)
    {
        return Err(bad(
            "already a Mixture-of-Experts model (llama.expert_count > 0)".into(),
        ));
    }
    let n_layer = meta
        .get("llama.block_count")
        .and_then(GgufValue::as_u64)
        .ok_or_else(|| bad("no llama.block_count".into()))? as usize;
    let n_embd = meta
        .get("llama.embedding_length")
        .and_then(GgufValue::as_u64)
        .ok_or_else(|| bad("no llama.embedding_length".into()))?;

    let mut w = GgufWriter::new();
    for (key, v) in meta {
        w.add_kv(key, v.clone());
    }
    let name = meta
        .get("general.name")
        .and_then(GgufValue::as_str)
        .unwrap_or("model");
    w.add_kv(
        "general.name",
        GgufValue::Str(format!(
            "{name} (upcycled: {n} identical experts, {k} used)"
        )),
    );
    w.add_kv("llama.expert_count", GgufValue::U32(n));
    w.add_kv("llama.expert_used_count", GgufValue::U32(k));
    w.add_kv("pocketmoe.upcycle.seed", GgufValue::U64(opts.seed));

    // Tensors in the source's order; each block's router goes just before its first FFN tensor.
    let mut sources: Vec<Source> = Vec::new();
    let mut found = vec![0usize; n_layer];
    for t in m.tensors() {
        if t.name.starts_with("blk.") && t.name.contains(".ffn_") && t.name.ends_with(".bias") {
            return Err(bad(format!(
                "{}: FFN biases have no place in the llama arch's experts",
                t.name
            )));
        }
        let Some((il, f)) = dense_ffn(&t.name) else {
            w.add_tensor(&t.name, t.ty, t.shape())?;
            sources.push(Source::Same(t));
            continue;
        };
        if il >= n_layer {
            return Err(bad(format!("{}: block {il} of {n_layer}", t.name)));
        }
        if found[il] == 0 {
            w.add_tensor(
                &format!("blk.{il}.ffn_gate_inp.weight"),
                GgmlType::F32,
                &[n_embd, n as u64],
            )?;
            sources.push(Source::Router);
        }
        found[il] += 1;
        let shape = t.shape();
        if shape.len() != 2 {
            return Err(bad(format!("{}: shape {shape:?}, expected 2-D", t.name)));
        }
        w.add_tensor(
            &format!("blk.{il}.{f}_exps.weight"),
            t.ty,
            &[shape[0], shape[1], n as u64],
        )?;
        sources.push(Source::Experts(t));
    }
    if let Some(il) = found.iter().position(|&c| c != FFN.len()) {
        return Err(bad(format!(
            "block {il} has {} of ffn_gate/ffn_up/ffn_down (a dense SwiGLU FFN in every block is \
             what --upcycle turns into experts)",
            found[il]
        )));
    }

    let tmp = super::partial_path(&opts.out);
    let bytes = w.write_with_progress(&tmp, progress, |i, buf| {
        match sources[i] {
            Source::Same(t) => buf.copy_from_slice(m.tensor_data(t)),
            Source::Experts(t) => {
                let one = m.tensor_data(t);
                for dst in buf.chunks_exact_mut(one.len()) {
                    dst.copy_from_slice(one);
                }
            }
            Source::Router => {
                // Seeded per tensor (index), so the output does not depend on fill order.
                let mut rng = Rng::new(opts.seed ^ (i as u64).wrapping_mul(0x9E37_79B9));
                let row_bytes = n_embd as usize * 4;
                for group in buf.chunks_exact_mut(row_bytes * k as usize) {
                    let v = rng.normals(n_embd as usize, ROUTER_STD / (n_embd as f32).sqrt());
                    for row in group.chunks_exact_mut(row_bytes) {
                        row.copy_from_slice(bytemuck::cast_slice(&v));
                    }
                }
            }
        }
        Ok(())
    })?;
    super::rename_into_place(&tmp, &opts.out)?;
    Ok(UpcycleReport {
        path: opts.out.clone(),
        bytes,
        n_tensors: sources.len(),
        n_layer,
    })
}

/// Default output name: `SRC-moeN.gguf` beside the source.
pub fn default_path(src: &Path, n_expert: u32) -> PathBuf {
    let stem = src.file_stem().unwrap_or_default().to_string_lossy();
    src.with_file_name(format!("{stem}-moe{n_expert}.gguf"))
}
