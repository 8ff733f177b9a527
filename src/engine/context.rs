//! The context length when none is given (`-c/--ctx` left out), as llama.cpp's `--fit` picks it:
//! the model's trained context when the whole model and that much KV cache fit the GPU budget;
//! else the largest context that still lets the whole model fit, down to [`MIN_AUTO_CTX`]; and
//! when not even that fits, [`MIN_AUTO_CTX`] with the routed experts offloaded (more context
//! would take expert-cache slots). On the CPU there is no budget to fit: [`MIN_AUTO_CTX`].
//! Always capped by the trained context. Reference: llama.cpp `common/fit.cpp` (its "step 2":
//! reduce the context towards `--fit-ctx`, default 4096, before offloading anything).
use super::{auto_budget, Device, EngineError, EngineOptions, COMPUTE_RESERVE};
use crate::ggml::{Backend, GgmlType};
use crate::gguf::GgufModel;
use crate::model::Hparams;
use std::path::Path;

/// The context kept when the model does not fit beside more (llama.cpp's `--fit-ctx` default).
pub const MIN_AUTO_CTX: usize = 4096;

/// A chosen context length and why, for the start-up plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContextFit {
    /// Positions per sequence.
    pub ctx: usize,
    pub why: String,
}

/// KV-cache bytes per cached position, all layers, K and V (MLA caches one latent row per
/// position, read as both K and V: no V cache).
pub fn kv_row_bytes(hp: &Hparams, kv_type: GgmlType) -> u64 {
    let v = if hp.is_mla() || crate::arch::of(hp.arch).kv.k_only {
        0
    } else {
        hp.v_dim()
    };
    kv_type.row_size(1).unwrap_or(2) * (hp.k_dim() + v) * hp.n_layer as u64
}

/// The context per sequence for `n_seq` sequences: `model_bytes` of weights, `row_bytes` of KV
/// cache per position, micro-batches of `n_ubatch` tokens (their f16 attention mask costs 2
/// bytes per token and cache row), and the GPU `budget` (`None`: the CPU).
pub fn fit_context(
    n_ctx_train: usize,
    model_bytes: u64,
    row_bytes: u64,
    n_ubatch: usize,
    budget: Option<u64>,
    n_seq: usize,
) -> ContextFit {
    let trained = n_ctx_train.max(1);
    let floor = MIN_AUTO_CTX.min(trained);
    let Some(budget) = budget else {
        return ContextFit {
            ctx: floor,
            why: format!("the CPU default, {floor} (trained: {trained}); -c to set"),
        };
    };
    let per_pos = (row_bytes + 2 * n_ubatch as u64) * n_seq.max(1) as u64;
    let fixed = model_bytes + COMPUTE_RESERVE;
    let room = budget.saturating_sub(fixed) / per_pos.max(1);
    if room >= trained as u64 {
        return ContextFit {
            ctx: trained,
            why: "the model's trained context: it fits beside the whole model; -c to set".into(),
        };
    }
    if room >= floor as u64 {
        // Whole pages (the batch cache's unit), never below the floor.
        let ctx = ((room as usize) / super::batch::KV_PAGE * super::batch::KV_PAGE).max(floor);
        return ContextFit {
            ctx,
            why: format!(
                "what fits beside the whole model in the budget (trained: {trained}); -c to set"
            ),
        };
    }
    ContextFit {
        ctx: floor,
        why: format!(
            "the model does not fit whole beside more: its routed experts are offloaded and the \
             context stays at {floor}, leaving the rest to the expert cache (trained: {trained}); \
             -c to set"
        ),
    }
}

/// [`fit_context`] for the model at `path` on `opts.device` with `opts.gpu_mem` (or the GPU's
/// free memory minus the margin), before loading it: what a server needs to know to size its
/// slots.
pub fn fit_context_for(
    path: &Path,
    opts: &EngineOptions,
    n_seq: usize,
) -> Result<ContextFit, EngineError> {
    let model_err = |msg: String| EngineError::Model {
        path: path.display().to_string(),
        msg,
    };
    let file = GgufModel::open(path)?;
    let (_, hp) = crate::arch::hparams(&file).map_err(model_err)?;
    let model_bytes: u64 = file.tensors().map(|t| t.n_bytes).sum();
    // Every device's budget together (a layer split holds the KV rows of each block on its
    // block's device), less the compute reserves of all but the one `fit_context` counts.
    let devices = opts.device_list();
    let mut budget = Some(0u64);
    for (k, d) in devices.iter().enumerate() {
        let b = match d.resolve() {
            Device::Cuda(i) => match opts.gpu_mems.get(k).copied().or(opts.gpu_mem) {
                Some(b) => Some(b),
                None => Backend::cuda(i)?
                    .memory()
                    .map(|(free, total)| auto_budget(free as u64, total as u64)),
            },
            _ => None,
        };
        budget = budget.zip(b).map(|(sum, b)| sum + b);
    }
    let budget = budget.map(|b| b.saturating_sub(COMPUTE_RESERVE * (devices.len() as u64 - 1)));
    Ok(fit_context(
        hp.n_ctx_train as usize,
        model_bytes,
        kv_row_bytes(&hp, opts.kv_type),
        opts.n_ubatch,
        budget,
        n_seq,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    #[test]
    fn trained_context_when_it_all_fits() {
        // 17 GiB of weights, 96 KiB per position, 4 sequences of 40960: 15 GiB of KV.
        let f = fit_context(40960, 17 * GIB, 96 << 10, 512, Some(132 * GIB), 4);
        assert_eq!(f.ctx, 40960, "{}", f.why);
    }

    #[test]
    fn shrinks_to_what_fits_beside_the_whole_model() {
        // 20 GiB budget: 20 - 17 - 0.5 (compute reserve) = 2.5 GiB for 4 sequences at
        // 97 KiB per position (KV + mask) -> 6757 positions, 6656 in whole pages.
        let f = fit_context(40960, 17 * GIB, 96 << 10, 512, Some(20 * GIB), 4);
        let room = (20 * GIB - 17 * GIB - COMPUTE_RESERVE) / (((96 << 10) + 1024) * 4);
        assert_eq!(f.ctx as u64, room / 256 * 256, "{}", f.why);
        assert!(f.ctx > MIN_AUTO_CTX && f.ctx < 40960);
    }

    #[test]
    fn keeps_the_floor_and_offloads_when_the_model_does_not_fit() {
        let f = fit_context(40960, 17 * GIB, 96 << 10, 512, Some(8 * GIB), 4);
        assert_eq!(f.ctx, MIN_AUTO_CTX);
        assert!(f.why.contains("offloaded"), "{}", f.why);
        // The floor never exceeds the trained context.
        assert_eq!(
            fit_context(1000, 17 * GIB, 1, 512, Some(8 * GIB), 1).ctx,
            1000
        );
        assert_eq!(fit_context(1000, 1, 1, 512, None, 1).ctx, 1000);
    }

    #[test]
    fn cpu_keeps_the_floor() {
        let f = fit_context(40960, GIB, 1024, 512, None, 1);
        assert_eq!(f.ctx, MIN_AUTO_CTX);
    }
}
