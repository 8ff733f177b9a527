//! `pocketmoe synth`: random-weight GGUF models of real shapes that stock llama.cpp loads and
//! runs, for every registered architecture.
//!
//! Shapes come from the architecture table (`crate::arch`) and a preset's hyper-parameters; types
//! from a quantisation mix; values are random with variance-preserving scales (so activations
//! neither vanish nor explode and output logits are peaked), quantised by ggml's own quantisers.
//! Router rows carry the routing skew, and Qwen3-style models a context channel that gives decode
//! routing real models' temporal locality (`routing`, calibrated to real Qwen3-30B-A3B). Large tensors are filled from a pool of
//! pre-quantised random rows (one pool per type and row length), which is what makes a 17 GB
//! model take seconds to write instead of an hour of quantisation; tiny models are quantised row
//! by row. Output is deterministic for a given seed.
pub mod presets;
pub mod quantmix;
pub mod routing;
pub mod upcycle;
pub mod vocab;

use crate::ggml::{quant, GgmlType};
use crate::gguf::{GgufArray, GgufValue, GgufWriter};
use crate::model::{
    hparams::{Hparams, RopeScaling},
    Role, TensorSpec,
};
use crate::util::Rng;
use presets::Preset;
use quantmix::QuantMix;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// What `synth` writes.
#[derive(Debug, Clone)]
pub struct SynthOptions {
    pub arch: String,
    pub preset: String,
    pub quant: QuantMix,
    pub routing_skew: f32,
    pub seed: u64,
    pub out: PathBuf,
}

/// What `synth` wrote.
#[derive(Debug, Clone)]
pub struct SynthReport {
    pub path: PathBuf,
    pub bytes: u64,
    pub n_tensors: usize,
    pub bytes_by_type: Vec<(GgmlType, u64)>,
}

/// Errors of synth: bad options or I/O, each naming the option or file.
#[derive(Debug, thiserror::Error)]
pub enum SynthError {
    #[error("{0}")]
    Options(String),
    #[error(transparent)]
    Gguf(#[from] crate::gguf::GgufError),
    #[error(transparent)]
    Ggml(#[from] crate::ggml::GgmlError),
}

/// Values above this many elements are filled from pre-quantised pools, not quantised one by one.
const DIRECT_LIMIT: u64 = 1 << 22;
/// Elements per pool (per type and row length).
const POOL_ELEMS: u64 = 1 << 22;

/// One tensor to write: name, shape, type, how to fill it.
struct Planned {
    name: String,
    ty: GgmlType,
    shape: Vec<u64>,
    /// Standard deviation of the values (before quantisation); `None` = ones-ish norm weights.
    std: f32,
    mean: f32,
    /// Router skew multipliers per row (expert), for router tensors.
    row_scale: Option<Vec<f32>>,
    /// The context channel's edit of this tensor (`routing::ContextChannel`).
    edit: Option<(routing::Edit, Arc<routing::ContextChannel>)>,
    /// An I32 token-id -> expert-id table (deepseek4's `ffn_gate_tid2eid`): each row (token)
    /// holds distinct expert ids below this count.
    expert_ids: Option<u64>,
    seed: u64,
}

impl Planned {
    fn n_elements(&self) -> u64 {
        self.shape.iter().product()
    }
}

/// Value statistics for a tensor: (mean, std).
fn init_stats(spec: &TensorSpec, name: &str, shape: &[u64], n_layer: usize) -> (f32, f32) {
    let fan_in = shape[0] as f32;
    match spec.role {
        Role::Norm if !name.ends_with(".bias") => (1.0, 0.05),
        _ if name.ends_with(".bias") || name.contains("exp_probs_b") || name.contains("sinks") => {
            (0.0, 0.02)
        }
        // Token-dominated hidden states: every block adds outputs of about unit RMS that vary
        // little from token to token (random attention averages the context), so with unit
        // embeddings the residual stream — and with it every router's choice — would barely
        // change between decode steps (a 19% expert cache then hit 91% even without skew).
        // Embeddings of RMS ~sqrt(2 n_layer) keep the token's share of the stream at every
        // depth, so consecutive tokens route about as independently as the skew calibration
        // assumes (`routing::simulate_lru_hit_rate`).
        Role::Embedding => (0.0, (2.0 * n_layer as f32).sqrt().max(1.0)),
        // Peaked output logits: std of a logit ~ 4 for unit-RMS hidden states.
        Role::Output => (0.0, 4.0 / fan_in.sqrt()),
        // Decisive routers (logit std ~4): top-k choices are far from ties, so two correct
        // implementations pick the same experts (the skew's ranking statistics do not change).
        Role::Router => (0.0, 4.0 / fan_in.sqrt()),
        _ => (0.0, 1.0 / fan_in.sqrt()),
    }
}

fn plan(h: &Hparams, mix: QuantMix, skew: f32, seed: u64) -> Result<Vec<Planned>, SynthError> {
    let arch = h.arch;
    let mut out = Vec::new();
    let mut router_rng = Rng::new(seed ^ 0x005E_ED0F_5CE3);
    let emb_std = (2.0 * h.n_layer as f32).sqrt().max(1.0);
    let channel = routing::ContextChannel::new(h, skew, emb_std).map(Arc::new);
    let wanted = arch.expected_tensors(h).filter(|(name, spec, block)| {
        arch.required_in(spec, h, *block) || real_models_have(h, name, *block)
    });
    for (i, (name, spec, block)) in wanted.enumerate() {
        let shape = (spec.shape)(h, block.unwrap_or(0));
        if shape.is_empty() || shape.contains(&0) {
            return Err(SynthError::Options(format!(
                "{name}: preset gives the shape {shape:?}"
            )));
        }
        let ty = quantmix::tensor_type(mix, &name, spec.role, &shape, block, h.n_layer);
        let (mean, std) = init_stats(spec, &name, &shape, h.n_layer);
        let row_scale = (spec.role == Role::Router && name.ends_with("ffn_gate_inp.weight"))
            .then(|| routing::multipliers(shape[1] as usize, skew, &mut router_rng));
        let edit = channel
            .as_ref()
            .and_then(|c| Some((c.edit(&name, block)?, c.clone())));
        let expert_ids = (ty == GgmlType::I32).then_some(h.n_expert);
        out.push(Planned {
            name,
            ty,
            shape,
            std,
            mean,
            row_scale,
            edit,
            expert_ids,
            seed: seed.wrapping_add(i as u64 * 0x9E37),
        });
    }
    Ok(out)
}

/// Whether the real models a preset mirrors carry this optional tensor (synth writes only those:
/// an optional tensor with random values, like `rope_freqs`, would change what llama.cpp computes).
fn real_models_have(h: &Hparams, name: &str, block: Option<usize>) -> bool {
    let carried = crate::arch::of(h.arch).synth.optional_tensors;
    name == "output.weight"
        || carried.iter().any(|t| name.ends_with(t))
        || (name.ends_with("exp_probs_b.bias")
            && h.gating == crate::model::hparams::Gating::Sigmoid)
        // Real GLM-4.5 / DeepSeek-V3 files carry their MTP blocks whole.
        || block.is_some_and(|il| h.is_nextn_layer(il))
}

/// Values for rows `[row0, row0 + n_rows)` of a tensor: random, with the context channel's edit.
fn values(p: &Planned, rng: &mut Rng, row0: usize, n_rows: usize) -> Vec<f32> {
    let mut v = raw_values(p, rng, row0, n_rows);
    if let Some((edit, c)) = &p.edit {
        c.apply(*edit, p.shape[0] as usize, row0, &mut v);
    }
    v
}

/// Random f32 values for rows `[row0, row0 + n_rows)` of a tensor.
fn raw_values(p: &Planned, rng: &mut Rng, row0: usize, n_rows: usize) -> Vec<f32> {
    let ne0 = p.shape[0] as usize;
    let mut v = Vec::with_capacity(ne0 * n_rows);
    for r in row0..row0 + n_rows {
        let s = p.std * p.row_scale.as_ref().map_or(1.0, |m| m[r % m.len()]);
        v.extend((0..ne0).map(|_| p.mean + s * rng.normal()));
    }
    v
}

/// Whether `p` can be filled from a pool: large, no per-row scales, and no context-channel edit
/// that depends on the row (those that do not are baked into the pool; zeroed rows are patched
/// after copying).
fn pooled(p: &Planned) -> bool {
    use routing::Edit;
    p.n_elements() > DIRECT_LIMIT
        && p.row_scale.is_none()
        && matches!(
            p.edit,
            None | Some((
                Edit::SetCol0(_) | Edit::ZeroCol0 | Edit::ZeroRowsEvery(_),
                _
            ))
        )
}

/// Pools of quantised random rows, keyed by (type, row length, std bits, row-invariant edit).
type PoolKey = (u32, u64, u32, u32);

fn pool_key(p: &Planned) -> PoolKey {
    let edit = match p.edit {
        Some((routing::Edit::SetCol0(x), _)) => x.to_bits() | 1,
        Some((routing::Edit::ZeroCol0, _)) => 2,
        _ => 0,
    };
    (p.ty.id(), p.shape[0], p.std.to_bits(), edit)
}

fn build_pool(p: &Planned, seed: u64) -> Result<Vec<u8>, SynthError> {
    let ne0 = p.shape[0];
    let rows = (POOL_ELEMS / ne0).max(1) as usize;
    let mut rng = Rng::new(seed);
    let mut v = raw_values(p, &mut rng, 0, rows);
    // Row-invariant edits are baked into the pool; zeroed rows are patched by `fill`.
    if let Some((e @ (routing::Edit::SetCol0(_) | routing::Edit::ZeroCol0), c)) = &p.edit {
        c.apply(*e, ne0 as usize, 0, &mut v);
    }
    Ok(quant::quantize(p.ty, &v, ne0 as usize, None)?)
}

/// A token-id -> expert-id table into `buf` (I32 rows of `per_row`): every row `per_row` distinct
/// ids drawn uniformly from `0..n_expert`, as a hash router's table holds.
fn expert_ids(rng: &mut Rng, per_row: usize, n_expert: u64, buf: &mut [u8]) {
    let mut row: Vec<i32> = Vec::with_capacity(per_row);
    for out in buf.chunks_exact_mut(per_row * 4) {
        row.clear();
        while row.len() < per_row {
            let id = (rng.next_u64() % n_expert) as i32;
            if !row.contains(&id) {
                row.push(id);
            }
        }
        out.copy_from_slice(bytemuck::cast_slice(&row));
    }
}

/// Fills `buf` (the tensor's bytes) for planned tensor `p`.
fn fill(p: &Planned, pools: &HashMap<PoolKey, Vec<u8>>, buf: &mut [u8]) -> Result<(), SynthError> {
    let ne0 = p.shape[0] as usize;
    let n_rows = (p.n_elements() / p.shape[0]) as usize;
    let row_bytes =
        p.ty.row_size(ne0 as u64)
            .expect("planned types fit the row") as usize;
    let mut rng = Rng::new(p.seed);
    if let Some(n_expert) = p.expert_ids {
        expert_ids(&mut rng, ne0, n_expert, buf);
        return Ok(());
    }
    if let Some(pool) = pools.get(&pool_key(p)).filter(|_| pooled(p)) {
        let pool_rows = pool.len() / row_bytes;
        for row in buf.chunks_exact_mut(row_bytes) {
            let k = (rng.next_u64() % pool_rows as u64) as usize;
            row.copy_from_slice(&pool[k * row_bytes..(k + 1) * row_bytes]);
        }
        if let Some((routing::Edit::ZeroRowsEvery(period), _)) = p.edit {
            let zero = quant::quantize(p.ty, &vec![0.0; ne0], ne0, None)?;
            for row in buf.chunks_exact_mut(row_bytes).step_by(period) {
                row.copy_from_slice(&zero);
            }
        }
        return Ok(());
    }
    // Direct: quantise in chunks of rows so memory stays bounded.
    let chunk = ((DIRECT_LIMIT as usize) / ne0).max(1);
    let mut row0 = 0;
    for dst in buf.chunks_mut(chunk * row_bytes) {
        let rows = dst.len() / row_bytes;
        let v = values(p, &mut rng, row0, rows);
        let q = if p.ty == GgmlType::F32 {
            bytemuck::cast_slice(&v).to_vec()
        } else {
            quant::quantize(p.ty, &v, ne0, None)?
        };
        dst.copy_from_slice(&q);
        row0 += rows;
    }
    debug_assert_eq!(row0, n_rows);
    Ok(())
}

/// The `{arch}.*`, `general.*` and tokenizer metadata for `h`.
pub fn metadata(
    h: &Hparams,
    preset: &Preset,
    mix: QuantMix,
    skew: f32,
    seed: u64,
) -> Result<Vec<(String, GgufValue)>, SynthError> {
    let a = h.arch;
    let mut kv: Vec<(String, GgufValue)> = Vec::new();
    let mut put = |k: String, v: GgufValue| kv.push((k, v));
    put("general.architecture".into(), GgufValue::Str(a.name.into()));
    put(
        "general.name".into(),
        GgufValue::Str(format!(
            "PocketMoE synthetic {} ({})",
            preset.model, preset.name
        )),
    );
    put("general.file_type".into(), GgufValue::U32(mix.file_type()));
    put("general.quantization_version".into(), GgufValue::U32(2));
    put(
        "pocketmoe.synth.preset".into(),
        GgufValue::Str(preset.name.into()),
    );
    put("pocketmoe.synth.routing_skew".into(), GgufValue::F32(skew));
    put("pocketmoe.synth.seed".into(), GgufValue::U64(seed));
    for (key, v) in hparams_kv(h) {
        put(format!("{a}.{key}"), v);
    }
    let pre = crate::arch::of(a).synth.pre_tokenizer;
    let vocab = vocab::build(pre, h.n_vocab as usize).map_err(SynthError::Options)?;
    put("tokenizer.ggml.model".into(), GgufValue::Str("gpt2".into()));
    put(
        "tokenizer.ggml.pre".into(),
        GgufValue::Str(vocab.pre.into()),
    );
    put(
        "tokenizer.ggml.tokens".into(),
        GgufValue::Array(GgufArray::Str(vocab.tokens)),
    );
    put(
        "tokenizer.ggml.token_type".into(),
        GgufValue::Array(GgufArray::I32(vocab.types)),
    );
    put(
        "tokenizer.ggml.merges".into(),
        GgufValue::Array(GgufArray::Str(vocab.merges)),
    );
    put(
        "tokenizer.ggml.bos_token_id".into(),
        GgufValue::U32(vocab.bos),
    );
    put(
        "tokenizer.ggml.eos_token_id".into(),
        GgufValue::U32(vocab.eos),
    );
    put(
        "tokenizer.ggml.add_bos_token".into(),
        GgufValue::Bool(false),
    );
    put(
        "tokenizer.chat_template".into(),
        GgufValue::Str(vocab::CHATML_TEMPLATE.into()),
    );
    Ok(kv)
}

/// Hyper-parameters as `{arch}.`-relative GGUF keys (the inverse of `Hparams::from_meta`):
/// every row of the schema (`model::hparams::schema::KEYS`) the architecture reads whose value is
/// set (non-zero, true) or whose key the architecture requires; then the rows read by code of
/// their own (gating, RoPE scaling type, DeepSeek-V4's compression ratios).
pub fn hparams_kv(h: &Hparams) -> Vec<(&'static str, GgufValue)> {
    use crate::model::hparams::schema::{Ty, Val, KEYS};
    let mut kv: Vec<(&'static str, GgufValue)> = KEYS
        .iter()
        .filter(|k| k.applies_to(h.arch.name))
        .filter_map(|k| {
            let required = h.arch.required_keys.contains(&k.name);
            let v = match (k.ty, (k.get)(h)) {
                (Ty::Uint, Val::U(x)) if x > 0 || required => GgufValue::U32(x as u32),
                (Ty::Float, Val::F(x)) if x != 0.0 || required => GgufValue::F32(x),
                (Ty::Bool, Val::B(b)) if b || required => GgufValue::Bool(b),
                _ => return None,
            };
            Some((k.name, v))
        })
        .collect();
    kv.push(("expert_gating_func", GgufValue::U32(h.gating as u32)));
    if !h.dsv4.compress_ratios.is_empty() {
        let ratios = h.dsv4.compress_ratios.iter().map(|&r| r as u32).collect();
        kv.push((
            "attention.compress_ratios",
            GgufValue::Array(GgufArray::U32(ratios)),
        ));
    }
    if h.rope_scaling != RopeScaling::Linear {
        kv.push((
            "rope.scaling.type",
            GgufValue::Str(h.rope_scaling.name().into()),
        ));
    }
    kv
}

/// The checked preset of `opts`: its planned tensors and the writer holding its header.
fn prepare(opts: &SynthOptions) -> Result<(Vec<Planned>, GgufWriter), SynthError> {
    if !opts.routing_skew.is_finite() || !(0.0..=20.0).contains(&opts.routing_skew) {
        return Err(SynthError::Options(format!(
            "--routing-skew {} is outside 0..=20",
            opts.routing_skew
        )));
    }
    let preset = presets::find(&opts.arch, &opts.preset).map_err(SynthError::Options)?;
    let h = &preset.hparams;
    h.validate().map_err(SynthError::Options)?;
    let planned = plan(h, opts.quant, opts.routing_skew, opts.seed)?;

    let mut w = GgufWriter::new();
    for (k, v) in metadata(h, &preset, opts.quant, opts.routing_skew, opts.seed)? {
        w.add_kv(&k, v);
    }
    for p in &planned {
        w.add_tensor(&p.name, p.ty, &p.shape)?;
    }
    Ok((planned, w))
}

/// What was written: the file, its size, and bytes by type (largest first).
fn report(opts: &SynthOptions, planned: &[Planned], w: &GgufWriter, bytes: u64) -> SynthReport {
    let mut by_type: Vec<(GgmlType, u64)> = Vec::new();
    for (i, p) in planned.iter().enumerate() {
        let n = w.tensor_size(i);
        match by_type.iter_mut().find(|(t, _)| *t == p.ty) {
            Some((_, b)) => *b += n,
            None => by_type.push((p.ty, n)),
        }
    }
    by_type.sort_by_key(|&(_, b)| std::cmp::Reverse(b));
    SynthReport {
        path: opts.out.clone(),
        bytes,
        n_tensors: planned.len(),
        bytes_by_type: by_type,
    }
}

/// Writes the model's header only, its data a hole of the right size
/// ([`GgufWriter::write_header_only`]): real shapes too large to write here, for `inspect`.
pub fn synth_header_only(opts: &SynthOptions) -> Result<SynthReport, SynthError> {
    let (planned, w) = prepare(opts)?;
    let bytes = w.write_header_only(&opts.out)?;
    Ok(report(opts, &planned, &w, bytes))
}

/// Writes the model. `progress(done, total)` is called with bytes written.
pub fn synth(
    opts: &SynthOptions,
    progress: &(dyn Fn(u64, u64) + Sync),
) -> Result<SynthReport, SynthError> {
    let (planned, w) = prepare(opts)?;
    // Pools for the large tensors, built in parallel.
    let mut keys: Vec<(PoolKey, usize)> = Vec::new();
    for (i, p) in planned.iter().enumerate() {
        if pooled(p) && !keys.iter().any(|(k, _)| *k == pool_key(p)) {
            keys.push((pool_key(p), i));
        }
    }
    let planned_ref = &planned;
    let pools: HashMap<PoolKey, Vec<u8>> = std::thread::scope(|s| {
        // One thread per pool; a pool whose thread the OS refuses is built on this one.
        let handles: Vec<_> = keys
            .iter()
            .map(|&(k, i)| {
                let job = move || build_pool(&planned_ref[i], opts.seed ^ i as u64).map(|p| (k, p));
                std::thread::Builder::new()
                    .spawn_scoped(s, job)
                    .map_err(|_| job())
            })
            .collect();
        handles
            .into_iter()
            .map(|h| match h {
                Ok(h) => h
                    .join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic)),
                Err(built) => built,
            })
            .collect::<Result<_, _>>()
    })?;
    let tmp = partial_path(&opts.out);
    let bytes = w.write_with_progress(&tmp, progress, |i, buf| {
        fill(&planned[i], &pools, buf).map_err(|e| std::io::Error::other(e.to_string()))
    })?;
    rename_into_place(&tmp, &opts.out)?;
    Ok(report(opts, &planned, &w, bytes))
}

/// A temporary name for `out` in its folder. A model is written under it, then renamed over
/// `out` ([`rename_into_place`]): a process that has the old file open or mapped (a server, a
/// test running beside this one) keeps reading the old file whole, never a half-written one.
fn partial_path(out: &Path) -> PathBuf {
    static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let mut tmp_name = out.file_name().unwrap_or_default().to_os_string();
    tmp_name.push(format!(
        ".partial-{}-{}",
        std::process::id(),
        SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    ));
    out.with_file_name(tmp_name)
}

/// Renames the finished `tmp` over `out` (removing `tmp` if that fails).
fn rename_into_place(tmp: &Path, out: &Path) -> Result<(), SynthError> {
    std::fs::rename(tmp, out).map_err(|e| {
        let _ = std::fs::remove_file(tmp);
        crate::gguf::GgufError::io(out, "rename into place", e).into()
    })
}

/// Bytes of tensor data a preset gives under `mix` (without writing anything).
pub fn estimate_bytes(preset: &Preset, mix: QuantMix) -> Result<u64, SynthError> {
    let planned = plan(&preset.hparams, mix, 0.0, 0)?;
    Ok(planned
        .iter()
        .map(|p| p.ty.row_size(p.shape[0]).unwrap_or(0) * (p.n_elements() / p.shape[0]))
        .sum())
}

/// Default output name: `<arch>-<preset>-<quant>.gguf` in `dir`.
pub fn default_path(dir: &Path, arch: &str, preset: &str, quant: QuantMix) -> PathBuf {
    dir.join(format!("{arch}-{preset}-{}.gguf", quant.name()))
}
