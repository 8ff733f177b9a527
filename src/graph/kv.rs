//! KV cache: per layer, K and V rows (one row per position, all kv heads side by side) in f16
//! (or q8_0), on the same backend as the weights. Positions `0..n_ctx`; writing past the end is
//! a clear error (`EngineError::ContextFull`), never an out-of-bounds view.
use crate::ggml::{Backend, BufType, Context, GgmlError, GgmlType, Tensor, TensorIndex};

pub struct KvCache {
    ctx: Context,
    index: TensorIndex,
    n_layer: usize,
    pub n_ctx: usize,
    pub ty: GgmlType,
    /// Row widths of K and V per layer.
    pub k_width: Vec<usize>,
    pub v_width: Vec<usize>,
    /// Sizes of the Hadamard rotations of K (and Q) and of V for a quantised cache (0 = none).
    pub rot: (usize, usize),
    /// Bytes of the architecture's own cache tensors ([`Extra`]).
    extra_bytes: usize,
    /// The architecture's own cache tensors: (name, type, shape, has a fixed `init`).
    extras: Vec<(String, GgmlType, Vec<i64>, bool)>,
}

/// One cache tensor whose rows are positions, as [`KvCache::position_tensors`] lists them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PositionTensor {
    pub name: String,
    pub ty: GgmlType,
    /// Bytes of one row (one position).
    pub row_bytes: usize,
}

/// A cache tensor of an architecture's own (DeepSeek-V4's compressed rows and compressor
/// state), zeroed at allocation (or set to `init`, f32 values) and found by name
/// ([`KvCache::extra`]).
#[derive(Debug, Clone)]
pub struct Extra {
    pub name: String,
    pub ty: GgmlType,
    pub ne: Vec<i64>,
    pub init: Option<Vec<f32>>,
}

/// libllama's rotation sizes for a cache of type `ty` with K heads of `dk` and V heads of `dv`
/// (`dv` = 0: no V cache, as MLA): a quantised cache stores K and V rotated by an orthonormal
/// Hadamard matrix (outliers spread over the block, so q8_0 loses less), Q is rotated alike
/// (the scores are unchanged) and the attention output rotated back. K: 64, doubled while it
/// divides the head; V: 64. None for f16/f32 or heads not a multiple of 64.
pub fn rotation_sizes(ty: GgmlType, dk: usize, dv: usize) -> (usize, usize) {
    if !ty.is_quantized() {
        return (0, 0);
    }
    let k = if dk > 0 && dk.is_multiple_of(64) {
        let mut n = 64;
        while dk.is_multiple_of(2 * n) {
            n *= 2;
        }
        n
    } else {
        0
    };
    let v = if dv > 0 && dv.is_multiple_of(64) {
        64
    } else {
        0
    };
    (k, v)
}

/// The orthonormal Walsh-Hadamard matrix of size `n` (a power of two), row-major; `H·H = I`.
pub fn hadamard(n: usize) -> Vec<f32> {
    assert!(n.is_power_of_two(), "Hadamard size {n}");
    let mut h = vec![0f32; n * n];
    h[0] = 1.0 / (n as f32).sqrt();
    let mut s = 1;
    while s < n {
        for i in 0..s {
            for j in 0..s {
                let v = h[i * n + j];
                h[(i + s) * n + j] = v;
                h[i * n + j + s] = v;
                h[(i + s) * n + j + s] = -v;
            }
        }
        s *= 2;
    }
    h
}

impl KvCache {
    /// A cache for `n_ctx` positions; `widths[il] = (k_row, v_row)` (0 = the layer has none),
    /// plus the architecture's `extra` tensors.
    pub fn new(
        backend: &Backend,
        widths: &[(usize, usize)],
        n_ctx: usize,
        ty: GgmlType,
        rot: (usize, usize),
        extra: &[Extra],
    ) -> Result<Self, GgmlError> {
        Self::new_placed(backend, &|_| None, widths, n_ctx, ty, rot, extra)
    }

    /// [`KvCache::new`] with each tensor `place(name)` gives a buffer type for (a layer split's
    /// other devices: `engine::split`) in one buffer of that type, the rest on `backend`.
    pub fn new_placed(
        backend: &Backend,
        place: &dyn Fn(&str) -> Option<BufType>,
        widths: &[(usize, usize)],
        n_ctx: usize,
        ty: GgmlType,
        rot: (usize, usize),
        extra: &[Extra],
    ) -> Result<Self, GgmlError> {
        let ctx = Context::new(2 * widths.len() + 3 + extra.len(), 0)?;
        let mut extra_bytes = 0;
        for e in extra {
            let t = ctx.new_tensor(e.ty, &e.ne)?.set_name(&e.name);
            extra_bytes += t.n_bytes();
        }
        for (n, name) in [(rot.0, "attn_rot_k"), (rot.1, "attn_rot_v")] {
            if n > 0 {
                ctx.new_tensor(GgmlType::F32, &[n as i64, n as i64])?
                    .set_name(name);
            }
        }
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
        let index = ctx.index();
        let mut groups: Vec<(BufType, Vec<Tensor<'_>>)> = Vec::new();
        let mut names: Vec<&str> = index.names().collect();
        names.sort_unstable();
        for name in names {
            if let Some(buft) = place(name) {
                let t = ctx.get(&index, name).expect("indexed");
                match groups.iter_mut().find(|(b, _)| *b == buft) {
                    Some((_, ts)) => ts.push(t),
                    None => groups.push((buft, vec![t])),
                }
            }
        }
        for (buft, ts) in &groups {
            ctx.alloc_group(*buft, ts)?;
        }
        ctx.alloc_tensors(backend)?;
        ctx.clear_buffers(0);
        for e in extra {
            if let Some(v) = &e.init {
                let t = ctx.get(&index, &e.name).expect("just made");
                t.write_bytes(bytemuck::cast_slice(v))?;
            }
        }
        for (n, name) in [(rot.0, "attn_rot_k"), (rot.1, "attn_rot_v")] {
            if n > 0 {
                let t = ctx.get(&index, name).expect("just made");
                t.write_bytes(bytemuck::cast_slice(&hadamard(n)))?;
            }
        }
        Ok(Self {
            ctx,
            index,
            n_layer: widths.len(),
            n_ctx,
            ty,
            k_width: widths.iter().map(|w| w.0).collect(),
            v_width: widths.iter().map(|w| w.1).collect(),
            rot,
            extra_bytes,
            extras: extra
                .iter()
                .map(|e| (e.name.clone(), e.ty, e.ne.clone(), e.init.is_some()))
                .collect(),
        })
    }

    /// Every cache tensor that holds state of the sequence, one row per cache row (K and V of
    /// each layer, then the architecture's per-row tensors such as DeepSeek-3.2's indexer
    /// keys): the state of positions held in some rows is exactly those rows of these tensors,
    /// so it can be copied out, copied back elsewhere, and cut short by forgetting rows. Err
    /// (the reason) when the architecture keeps other state that changes with the sequence
    /// (DeepSeek-V4's compressor rings and compressed rows): that state is not a function of
    /// rows and cannot be cut or moved so. Constant tensors (rotations filled at allocation) are
    /// not state.
    pub fn position_tensors(&self) -> Result<Vec<PositionTensor>, String> {
        let row = |ty: GgmlType, w: usize| ty.row_size(w as u64).unwrap_or(0) as usize;
        let mut out = Vec::new();
        for il in 0..self.n_layer {
            if self.k_width[il] > 0 {
                out.push(PositionTensor {
                    name: format!("cache_k_l{il}"),
                    ty: self.ty,
                    row_bytes: row(self.ty, self.k_width[il]),
                });
            }
            if self.v_width[il] > 0 {
                out.push(PositionTensor {
                    name: format!("cache_v_l{il}"),
                    ty: self.ty,
                    row_bytes: row(self.ty, self.v_width[il]),
                });
            }
        }
        for (name, ty, ne, constant) in &self.extras {
            if *constant {
                continue;
            }
            if ne.len() == 2 && ne[1] == self.n_ctx as i64 {
                out.push(PositionTensor {
                    name: name.clone(),
                    ty: *ty,
                    row_bytes: row(*ty, ne[0] as usize),
                });
            } else {
                return Err(format!(
                    "the cache keeps state that is not one row per position ({name})"
                ));
            }
        }
        Ok(out)
    }

    /// A cache tensor by the name [`Self::position_tensors`] gave.
    pub fn named(&self, name: &str) -> Option<Tensor<'_>> {
        self.ctx.get(&self.index, name)
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

    /// The architecture's cache tensor `name` ([`Extra`]); its absence is a graph invariant
    /// violation (the engine made the cache the architecture asked for), so this panics.
    pub fn extra(&self, name: &str) -> Tensor<'_> {
        self.find(name)
    }

    /// The K (and Q) rotation, when the cache is quantised.
    pub fn rot_k(&self) -> Option<Tensor<'_>> {
        (self.rot.0 > 0).then(|| self.find("attn_rot_k"))
    }

    /// The V rotation (the attention output is rotated back by it).
    pub fn rot_v(&self) -> Option<Tensor<'_>> {
        (self.rot.1 > 0).then(|| self.find("attn_rot_v"))
    }

    /// Bytes of the cache's tensors in buffers of type `buft` (a device's, in a layer split).
    pub fn bytes_in(&self, buft: BufType) -> usize {
        self.index
            .names()
            .filter_map(|n| self.ctx.get(&self.index, n))
            .filter(|t| t.buffer_type() == Some(buft))
            .map(|t| t.n_bytes())
            .sum()
    }

    pub fn bytes(&self) -> usize {
        self.k_width
            .iter()
            .chain(&self.v_width)
            .map(|&w| self.ty.row_size(w as u64).unwrap_or(0) as usize * self.n_ctx)
            .sum::<usize>()
            + self.extra_bytes
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn hadamard_is_orthonormal_and_its_own_inverse() {
        for n in [1, 2, 64, 128] {
            let h = super::hadamard(n);
            for i in 0..n {
                for j in 0..n {
                    let dot: f32 = (0..n).map(|k| h[i * n + k] * h[k * n + j]).sum();
                    let want = if i == j { 1.0 } else { 0.0 };
                    assert!((dot - want).abs() < 1e-5, "n {n}: (H H)[{i}][{j}] = {dot}");
                }
            }
        }
    }

    #[test]
    fn rotation_sizes_follow_libllama() {
        use crate::ggml::GgmlType;
        const Q8_0: GgmlType = GgmlType::Q8_0;
        assert_eq!(super::rotation_sizes(GgmlType::F16, 128, 128), (0, 0));
        assert_eq!(super::rotation_sizes(Q8_0, 128, 128), (128, 64));
        assert_eq!(super::rotation_sizes(Q8_0, 64, 64), (64, 64));
        assert_eq!(super::rotation_sizes(Q8_0, 576, 0), (64, 0));
        assert_eq!(super::rotation_sizes(Q8_0, 96, 96), (0, 0));
    }
}
