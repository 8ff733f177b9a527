//! KV cache: per layer, K and V rows (one row per position, all kv heads side by side) in f16
//! (or q8_0), on the same backend as the weights. Positions `0..n_ctx`; writing past the end is
//! a clear error (`EngineError::ContextFull`), never an out-of-bounds view.
use crate::ggml::{Backend, Context, GgmlError, GgmlType, Tensor, TensorIndex};

pub struct KvCache {
    ctx: Context,
    index: TensorIndex,
    n_layer: usize,
    pub n_ctx: usize,
    pub ty: GgmlType,
    /// Row widths of K and V per layer.
    pub k_width: Vec<usize>,
    pub v_width: Vec<usize>,
}

impl KvCache {
    /// A cache for `n_ctx` positions; `widths[il] = (k_row, v_row)` (0 = the layer has none).
    pub fn new(
        backend: &Backend,
        widths: &[(usize, usize)],
        n_ctx: usize,
        ty: GgmlType,
    ) -> Result<Self, GgmlError> {
        let ctx = Context::new(2 * widths.len() + 1, 0)?;
        for (il, &(k, v)) in widths.iter().enumerate() {
            if k > 0 {
                ctx.new_tensor(ty, &[k as i64, n_ctx as i64])?
                    .set_name(&format!("cache_k_l{il}"));
            }
            if v > 0 {
                ctx.new_tensor(ty, &[v as i64, n_ctx as i64])?
                    .set_name(&format!("cache_v_l{il}"));
            }
        }
        ctx.alloc_tensors(backend)?;
        ctx.clear_buffers(0);
        let index = ctx.index();
        Ok(Self {
            ctx,
            index,
            n_layer: widths.len(),
            n_ctx,
            ty,
            k_width: widths.iter().map(|w| w.0).collect(),
            v_width: widths.iter().map(|w| w.1).collect(),
        })
    }

    fn find(&self, name: &str) -> Tensor<'_> {
        self.ctx
            .get(&self.index, name)
            .unwrap_or_else(|| panic!("kv cache has no {name}"))
    }

    pub fn k(&self, il: usize) -> Tensor<'_> {
        assert!(il < self.n_layer);
        self.find(&format!("cache_k_l{il}"))
    }

    pub fn v(&self, il: usize) -> Tensor<'_> {
        assert!(il < self.n_layer);
        self.find(&format!("cache_v_l{il}"))
    }

    pub fn bytes(&self) -> usize {
        self.k_width
            .iter()
            .chain(&self.v_width)
            .map(|&w| self.ty.row_size(w as u64).unwrap_or(0) as usize * self.n_ctx)
            .sum()
    }
}
