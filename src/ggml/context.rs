//! `Context` (a `ggml_context`, always `no_alloc`: tensor data lives in backend buffers) and
//! `Tensor`, a copyable handle that borrows its context. Ops are methods on the context and name
//! nothing about where they run; backends and the scheduler decide that.
//!
//! Invariant: buffers allocated for a context's tensors are owned by that context, so a
//! `Tensor<'ctx>` never points at freed memory.
use super::{backend::Backend, cstr, GgmlError, GgmlType, Graph, Result};
use ggml_sys as sys;
use std::cell::RefCell;
use std::ffi::CString;
use std::marker::PhantomData;
use std::ptr::NonNull;

/// Rotary-embedding parameters (ggml `rope_ext`); YaRN fields are 0/1 when unused.
#[derive(Debug, Clone, Copy)]
pub struct RopeParams {
    pub n_dims: i32,
    pub mode: i32,
    pub n_ctx_orig: i32,
    pub freq_base: f32,
    pub freq_scale: f32,
    pub ext_factor: f32,
    pub attn_factor: f32,
    pub beta_fast: f32,
    pub beta_slow: f32,
}

/// `ggml_rope_ext` and `ggml_rope_ext_back` (the same arguments).
type RopeFn = unsafe extern "C" fn(
    *mut sys::ggml_context,
    *mut sys::ggml_tensor,
    *mut sys::ggml_tensor,
    *mut sys::ggml_tensor,
    i32,
    i32,
    i32,
    f32,
    f32,
    f32,
    f32,
    f32,
    f32,
) -> *mut sys::ggml_tensor;

/// A ggml context: metadata for tensors and graph nodes. Data lives in backend buffers.
pub struct Context {
    ptr: NonNull<sys::ggml_context>,
    buffers: RefCell<Vec<sys::ggml_backend_buffer_t>>,
}

impl Context {
    /// A context with room for the metadata of `max_tensors` tensors and one graph of
    /// `graph_size` nodes.
    pub fn new(max_tensors: usize, graph_size: usize) -> Result<Self> {
        // SAFETY: pure size queries.
        let mem = unsafe {
            max_tensors * sys::ggml_tensor_overhead()
                + sys::ggml_graph_overhead_custom(graph_size, false)
        } + 1024;
        let params = sys::ggml_init_params {
            mem_size: mem,
            mem_buffer: std::ptr::null_mut(),
            no_alloc: true,
        };
        // SAFETY: ggml allocates and owns the metadata pool; we free it in Drop.
        let ptr = unsafe { sys::ggml_init(params) };
        Ok(Self {
            ptr: NonNull::new(ptr).ok_or(GgmlError::ContextInit(mem))?,
            buffers: RefCell::new(Vec::new()),
        })
    }

    pub(crate) fn raw(&self) -> *mut sys::ggml_context {
        self.ptr.as_ptr()
    }

    fn wrap(&self, t: *mut sys::ggml_tensor, what: &str) -> Tensor<'_> {
        // ggml returns null only when the context's metadata pool is exhausted, which is a sizing
        // bug in the caller (graph invariant), not bad input.
        let ptr = NonNull::new(t)
            .unwrap_or_else(|| panic!("ggml context out of metadata memory creating {what}"));
        Tensor {
            ptr,
            _ctx: PhantomData,
        }
    }

    /// A new tensor of `ty` with shape `ne` (ne0 first, 1 to 4 dims).
    pub fn new_tensor(&self, ty: GgmlType, ne: &[i64]) -> Result<Tensor<'_>> {
        if ne.is_empty() || ne.len() > 4 || ne.iter().any(|&n| n <= 0) {
            return Err(GgmlError::Tensor {
                name: "<new>".into(),
                msg: format!("invalid shape {ne:?}"),
            });
        }
        if ne[0] % ty.block_size() as i64 != 0 {
            return Err(GgmlError::Tensor {
                name: "<new>".into(),
                msg: format!(
                    "ne0={} is not a multiple of the {ty} block size {}",
                    ne[0],
                    ty.block_size()
                ),
            });
        }
        // SAFETY: ne has 1..=4 positive entries; the context is live.
        let t = unsafe { sys::ggml_new_tensor(self.raw(), ty.raw(), ne.len() as i32, ne.as_ptr()) };
        Ok(self.wrap(t, "tensor"))
    }

    /// Allocates every tensor of this context that has no data yet in one buffer of `backend`.
    /// The buffer is owned by the context. Returns its size in bytes.
    pub fn alloc_tensors(&self, backend: &Backend) -> Result<usize> {
        // SAFETY: context and backend are live; ggml returns null on failure (or when there is
        // nothing to allocate, which we treat as 0 bytes).
        let buf = unsafe {
            sys::ggml_backend_alloc_ctx_tensors_from_buft(self.raw(), backend.buffer_type().raw())
        };
        if buf.is_null() {
            // SAFETY: walking the context's tensor list; pointers stay valid while self lives.
            let pending = unsafe {
                let mut t = sys::ggml_get_first_tensor(self.raw());
                let mut n = 0usize;
                while !t.is_null() {
                    if (*t).data.is_null() && (*t).view_src.is_null() {
                        n += sys::ggml_nbytes(t);
                    }
                    t = sys::ggml_get_next_tensor(self.raw(), t);
                }
                n
            };
            if pending == 0 {
                return Ok(0);
            }
            return Err(GgmlError::Alloc {
                backend: backend.name(),
                what: "context tensors".into(),
                size: pending,
            });
        }
        // SAFETY: buf is a live buffer we now own.
        let size = unsafe { sys::ggml_backend_buffer_get_size(buf) };
        self.buffers.borrow_mut().push(buf);
        Ok(size)
    }

    /// Marks this context's buffers as holding weights. ggml's scheduler runs an op where its
    /// weights are (so a lookup in a host-memory table runs on the CPU), and copies a source in
    /// an unmarked buffer of another backend to the op's backend at every compute instead.
    pub fn mark_weights(&self) {
        for &buf in self.buffers.borrow().iter() {
            // SAFETY: a live buffer owned by this context.
            unsafe {
                sys::ggml_backend_buffer_set_usage(buf, sys::GGML_BACKEND_BUFFER_USAGE_WEIGHTS)
            };
        }
    }

    /// Takes ownership of `buf`: freed when the context drops.
    pub(crate) fn adopt_buffer(&self, buf: sys::ggml_backend_buffer_t) {
        self.buffers.borrow_mut().push(buf);
    }

    /// Looks up every tensor of this context by name, once (ggml's own lookup is a linear scan).
    pub fn index(&self) -> TensorIndex {
        let mut map = std::collections::HashMap::new();
        // SAFETY: walking the context's tensor list; pointers stay valid while self lives.
        unsafe {
            let mut t = sys::ggml_get_first_tensor(self.raw());
            while !t.is_null() {
                map.insert(cstr((*t).name.as_ptr()), NonNull::new_unchecked(t));
                t = sys::ggml_get_next_tensor(self.raw(), t);
            }
        }
        TensorIndex { ctx: self.ptr, map }
    }

    /// The tensor called `name`, through an index built from this context.
    pub fn get<'a>(&'a self, index: &TensorIndex, name: &str) -> Option<Tensor<'a>> {
        assert!(
            index.ctx == self.ptr,
            "tensor index used with another context"
        );
        index.map.get(name).map(|&ptr| Tensor {
            ptr,
            _ctx: PhantomData,
        })
    }

    /// Sets every byte of this context's buffers to `value` (e.g. zeroing a KV cache, so padded
    /// attention never reads NaN garbage from unwritten positions).
    pub fn clear_buffers(&self, value: u8) {
        for &buf in self.buffers.borrow().iter() {
            // SAFETY: a live buffer owned by this context.
            unsafe { sys::ggml_backend_buffer_clear(buf, value) };
        }
    }

    // ---- ops (shapes in ggml order, ne0 first) ----

    /// `a` [k, n, ...] × `b` [k, m, ...] -> [n, m, ...] (a may be quantised).
    pub fn mul_mat<'a>(&'a self, a: Tensor<'a>, b: Tensor<'a>) -> Tensor<'a> {
        // SAFETY: both tensors belong to this live context (lifetime 'a).
        self.wrap(
            unsafe { sys::ggml_mul_mat(self.raw(), a.raw(), b.raw()) },
            "mul_mat",
        )
    }

    /// Indirect matmul over experts: `as_` [k, n, n_expert], `b` [k, n_used|1, n_tokens],
    /// `ids` i32 [n_used, n_tokens] -> [n, n_used, n_tokens].
    pub fn mul_mat_id<'a>(&'a self, as_: Tensor<'a>, b: Tensor<'a>, ids: Tensor<'a>) -> Tensor<'a> {
        // SAFETY: as above.
        self.wrap(
            unsafe { sys::ggml_mul_mat_id(self.raw(), as_.raw(), b.raw(), ids.raw()) },
            "mul_mat_id",
        )
    }

    pub fn add<'a>(&'a self, a: Tensor<'a>, b: Tensor<'a>) -> Tensor<'a> {
        // SAFETY: as above.
        self.wrap(
            unsafe { sys::ggml_add(self.raw(), a.raw(), b.raw()) },
            "add",
        )
    }

    pub fn mul<'a>(&'a self, a: Tensor<'a>, b: Tensor<'a>) -> Tensor<'a> {
        // SAFETY: as above.
        self.wrap(
            unsafe { sys::ggml_mul(self.raw(), a.raw(), b.raw()) },
            "mul",
        )
    }

    pub fn scale<'a>(&'a self, a: Tensor<'a>, s: f32) -> Tensor<'a> {
        // SAFETY: as above.
        self.wrap(unsafe { sys::ggml_scale(self.raw(), a.raw(), s) }, "scale")
    }

    pub fn rms_norm<'a>(&'a self, a: Tensor<'a>, eps: f32) -> Tensor<'a> {
        // SAFETY: as above.
        self.wrap(
            unsafe { sys::ggml_rms_norm(self.raw(), a.raw(), eps) },
            "rms_norm",
        )
    }

    /// Rows of `a` [n_embd, n_rows] picked by i32 `ids` [n] -> [n_embd, n] (f32).
    pub fn get_rows<'a>(&'a self, a: Tensor<'a>, ids: Tensor<'a>) -> Tensor<'a> {
        // SAFETY: as above.
        self.wrap(
            unsafe { sys::ggml_get_rows(self.raw(), a.raw(), ids.raw()) },
            "get_rows",
        )
    }

    pub fn soft_max<'a>(&'a self, a: Tensor<'a>) -> Tensor<'a> {
        // SAFETY: as above.
        self.wrap(
            unsafe { sys::ggml_soft_max(self.raw(), a.raw()) },
            "soft_max",
        )
    }

    pub fn div<'a>(&'a self, a: Tensor<'a>, b: Tensor<'a>) -> Tensor<'a> {
        // SAFETY: as above.
        self.wrap(
            unsafe { sys::ggml_div(self.raw(), a.raw(), b.raw()) },
            "div",
        )
    }

    pub fn sigmoid<'a>(&'a self, a: Tensor<'a>) -> Tensor<'a> {
        // SAFETY: as above.
        self.wrap(unsafe { sys::ggml_sigmoid(self.raw(), a.raw()) }, "sigmoid")
    }

    /// DeepSeek-V4 hyper-connections, the mixing matrix: `mixes` [(2+hc)·hc, nt], `scale` [3],
    /// `base` [(2+hc)·hc] → [hc (dst), hc (src), nt]. Logits `mixes[2hc + dst + hc·src]·scale[2] +
    /// base[2hc + dst + hc·src]`; softmax over dst, `+ eps`, normalised over src, then
    /// `n_iter − 1` rounds of normalising over dst and then src (Sinkhorn; each sum `+ eps`).
    pub fn dsv4_hc_comb<'a>(
        &'a self,
        mixes: Tensor<'a>,
        scale: Tensor<'a>,
        base: Tensor<'a>,
        eps: f32,
        n_iter: i32,
    ) -> Tensor<'a> {
        // SAFETY: as above.
        self.wrap(
            unsafe {
                sys::ggml_dsv4_hc_comb(
                    self.raw(),
                    mixes.raw(),
                    scale.raw(),
                    base.raw(),
                    eps,
                    n_iter,
                )
            },
            "dsv4_hc_comb",
        )
    }

    /// DeepSeek-V4 hyper-connections, the streams' weighted sum: `x` [n, hc, nt], `weights`
    /// [hc, nt] → [n, nt], `Σ_h x[.., h, t]·weights[h, t]`.
    pub fn dsv4_hc_pre<'a>(&'a self, x: Tensor<'a>, weights: Tensor<'a>) -> Tensor<'a> {
        // SAFETY: as above.
        self.wrap(
            unsafe { sys::ggml_dsv4_hc_pre(self.raw(), x.raw(), weights.raw()) },
            "dsv4_hc_pre",
        )
    }

    /// DeepSeek-V4 hyper-connections, the new streams: `x` [n, nt], `residual` [n, hc, nt],
    /// `post` [hc, nt], `comb` [hc (dst), hc (src), nt] → [n, hc, nt],
    /// `x·post[dst] + Σ_src residual[.., src]·comb[dst, src]`.
    pub fn dsv4_hc_post<'a>(
        &'a self,
        x: Tensor<'a>,
        residual: Tensor<'a>,
        post: Tensor<'a>,
        comb: Tensor<'a>,
    ) -> Tensor<'a> {
        // SAFETY: as above.
        self.wrap(
            unsafe {
                sys::ggml_dsv4_hc_post(self.raw(), x.raw(), residual.raw(), post.raw(), comb.raw())
            },
            "dsv4_hc_post",
        )
    }

    /// `ln(1 + e^a)` elementwise.
    pub fn softplus<'a>(&'a self, a: Tensor<'a>) -> Tensor<'a> {
        // SAFETY: as above.
        self.wrap(
            unsafe { sys::ggml_softplus(self.raw(), a.raw()) },
            "softplus",
        )
    }

    pub fn sqrt<'a>(&'a self, a: Tensor<'a>) -> Tensor<'a> {
        // SAFETY: as above.
        self.wrap(unsafe { sys::ggml_sqrt(self.raw(), a.raw()) }, "sqrt")
    }

    /// Asks for F32 accumulation in `t` (a matmul or attention node), as llama.cpp does where
    /// half-precision accumulation loses too much; backends that always accumulate in F32 ignore
    /// it.
    pub fn prec_f32(&self, t: Tensor<'_>) {
        // SAFETY: t is a live tensor of this context.
        unsafe { sys::ggml_prec_set_acc(t.raw(), sys::GGML_PREC_F32) };
    }

    pub fn silu<'a>(&'a self, a: Tensor<'a>) -> Tensor<'a> {
        // SAFETY: as above.
        self.wrap(unsafe { sys::ggml_silu(self.raw(), a.raw()) }, "silu")
    }

    /// `silu(a) * b` (SwiGLU with separate gate and up).
    pub fn swiglu_split<'a>(&'a self, a: Tensor<'a>, b: Tensor<'a>) -> Tensor<'a> {
        // SAFETY: as above.
        self.wrap(
            unsafe { sys::ggml_swiglu_split(self.raw(), a.raw(), b.raw()) },
            "swiglu",
        )
    }

    /// Sum of each row: [n, ...] -> [1, ...].
    pub fn sum_rows<'a>(&'a self, a: Tensor<'a>) -> Tensor<'a> {
        // SAFETY: as above.
        self.wrap(
            unsafe { sys::ggml_sum_rows(self.raw(), a.raw()) },
            "sum_rows",
        )
    }

    pub fn clamp<'a>(&'a self, a: Tensor<'a>, min: f32, max: f32) -> Tensor<'a> {
        // SAFETY: as above.
        self.wrap(
            unsafe { sys::ggml_clamp(self.raw(), a.raw(), min, max) },
            "clamp",
        )
    }

    /// Indices of the `k` largest values of each row, i32 [k, rows...].
    pub fn argsort_top_k<'a>(&'a self, a: Tensor<'a>, k: usize) -> Tensor<'a> {
        // SAFETY: as above.
        self.wrap(
            unsafe { sys::ggml_argsort_top_k(self.raw(), a.raw(), k as i32) },
            "argsort_top_k",
        )
    }

    pub fn cont<'a>(&'a self, a: Tensor<'a>) -> Tensor<'a> {
        // SAFETY: as above.
        self.wrap(unsafe { sys::ggml_cont(self.raw(), a.raw()) }, "cont")
    }

    pub fn permute<'a>(&'a self, a: Tensor<'a>, axes: [i32; 4]) -> Tensor<'a> {
        // SAFETY: as above; ggml asserts the axes are a permutation (graph invariant).
        self.wrap(
            unsafe { sys::ggml_permute(self.raw(), a.raw(), axes[0], axes[1], axes[2], axes[3]) },
            "permute",
        )
    }

    /// Writes the rows of `b` [n, n_rows] into rows `c` (i64 [n_rows]) of `a` [n, rows]
    /// (with type conversion); returns a view of `a` for the graph.
    pub fn set_rows<'a>(&'a self, a: Tensor<'a>, b: Tensor<'a>, c: Tensor<'a>) -> Tensor<'a> {
        // SAFETY: as above; row indices are an input the caller fills within bounds.
        self.wrap(
            unsafe { sys::ggml_set_rows(self.raw(), a.raw(), b.raw(), c.raw()) },
            "set_rows",
        )
    }

    /// Copies `a` into `b` (with type conversion), returning the view `b` for the graph.
    pub fn cpy<'a>(&'a self, a: Tensor<'a>, b: Tensor<'a>) -> Tensor<'a> {
        // SAFETY: as above.
        self.wrap(
            unsafe { sys::ggml_cpy(self.raw(), a.raw(), b.raw()) },
            "cpy",
        )
    }

    /// A view of `a` with shape `ne` (1..=4 dims), byte strides `nb` (one fewer than dims) and
    /// byte `offset`. The caller guarantees it lies inside `a` (graph invariant; ggml asserts).
    pub fn view<'a>(
        &'a self,
        a: Tensor<'a>,
        ne: &[i64],
        nb: &[usize],
        offset: usize,
    ) -> Tensor<'a> {
        assert!(
            !ne.is_empty() && ne.len() <= 4 && nb.len() + 1 == ne.len(),
            "view: {ne:?} / {nb:?}"
        );
        // SAFETY: dimensions checked above; bounds are ggml's assertion.
        let t = unsafe {
            match ne.len() {
                1 => sys::ggml_view_1d(self.raw(), a.raw(), ne[0], offset),
                2 => sys::ggml_view_2d(self.raw(), a.raw(), ne[0], ne[1], nb[0], offset),
                3 => sys::ggml_view_3d(
                    self.raw(),
                    a.raw(),
                    ne[0],
                    ne[1],
                    ne[2],
                    nb[0],
                    nb[1],
                    offset,
                ),
                _ => sys::ggml_view_4d(
                    self.raw(),
                    a.raw(),
                    ne[0],
                    ne[1],
                    ne[2],
                    ne[3],
                    nb[0],
                    nb[1],
                    nb[2],
                    offset,
                ),
            }
        };
        self.wrap(t, "view")
    }

    /// Rotary embedding (`mode` 0 = normal, 2 = NeoX) over the first `n_dims` of each head.
    /// `a` [head_dim, n_head, n_tokens], `pos` i32 [n_tokens].
    pub fn rope<'a>(&'a self, a: Tensor<'a>, pos: Tensor<'a>, p: &RopeParams) -> Tensor<'a> {
        self.rope_op(sys::ggml_rope_ext, a, pos, p, "rope")
    }

    /// A rope node built by `f` (`ggml_rope_ext` or its inverse, which take the same arguments).
    fn rope_op<'a>(
        &'a self,
        f: RopeFn,
        a: Tensor<'a>,
        pos: Tensor<'a>,
        p: &RopeParams,
        name: &str,
    ) -> Tensor<'a> {
        // SAFETY: live context and tensors; no frequency-factor tensor.
        self.wrap(
            unsafe {
                f(
                    self.raw(),
                    a.raw(),
                    pos.raw(),
                    std::ptr::null_mut(),
                    p.n_dims,
                    p.mode,
                    p.n_ctx_orig,
                    p.freq_base,
                    p.freq_scale,
                    p.ext_factor,
                    p.attn_factor,
                    p.beta_fast,
                    p.beta_slow,
                )
            },
            name,
        )
    }

    /// `x` rotated block-wise by the orthonormal Hadamard matrix `rot` [n, n]: each run of `n`
    /// consecutive elements of `x` becomes `rot · run` (llama.cpp's `llama_mul_mat_hadamard`,
    /// with its hint, so the CPU backend runs a fast Walsh-Hadamard transform). Shape kept.
    pub fn mul_mat_hadamard<'a>(&'a self, rot: Tensor<'a>, x: Tensor<'a>) -> Tensor<'a> {
        let n = rot.ne()[0];
        let ne = x.ne();
        let rows = x.n_elements() / n;
        // SAFETY: live context and tensors; ggml checks the shapes (rows divide evenly: the
        // caller picks n dividing the head size).
        let t = unsafe {
            let flat = if sys::ggml_is_contiguous(x.raw()) {
                sys::ggml_reshape_2d(self.raw(), x.raw(), n, rows)
            } else {
                sys::ggml_cont_2d(self.raw(), x.raw(), n, rows)
            };
            let r = sys::ggml_mul_mat(self.raw(), rot.raw(), flat);
            sys::ggml_mul_mat_set_hint(r, sys::GGML_HINT_SRC0_IS_HADAMARD);
            sys::ggml_reshape_4d(self.raw(), r, ne[0], ne[1], ne[2], ne[3])
        };
        self.wrap(t, "mul_mat_hadamard")
    }

    /// Fused attention: `q` [d, n_tokens, n_head], `k` [d, n_kv, n_head_kv], `v` [dv, n_kv,
    /// n_head_kv], `mask` f16 [n_kv, n_tokens_padded] -> [dv, n_head, n_tokens].
    pub fn flash_attn<'a>(
        &'a self,
        q: Tensor<'a>,
        k: Tensor<'a>,
        v: Tensor<'a>,
        mask: Tensor<'a>,
        scale: f32,
    ) -> Tensor<'a> {
        // SAFETY: as above.
        let t = unsafe {
            sys::ggml_flash_attn_ext(
                self.raw(),
                q.raw(),
                k.raw(),
                v.raw(),
                mask.raw(),
                scale,
                0.0,
                0.0,
            )
        };
        // SAFETY: t is a live tensor; F32 accumulation as llama.cpp requests.
        unsafe { sys::ggml_prec_set_acc(t, sys::GGML_PREC_F32) };
        self.wrap(t, "flash_attn")
    }

    /// Promises a `flash_attn` node that no mask row holds more than `n` finite entries (sparse
    /// attention): ggml-cuda then compacts the mask and visits those rows only. Other backends
    /// ignore it.
    pub fn flash_attn_n_kv_max(&self, fa: Tensor<'_>, n: usize) {
        // SAFETY: fa is a live flash_attn_ext node; ggml stores n in its op parameters.
        unsafe { sys::ggml_flash_attn_ext_set_n_kv_max(fa.raw(), n.min(i32::MAX as usize) as i32) };
    }

    /// Adds per-head attention sinks (`sinks` f32 [n_head]) to a `flash_attn` result (gpt-oss).
    pub fn flash_attn_add_sinks(&self, fa: Tensor<'_>, sinks: Tensor<'_>) {
        // SAFETY: both live; ggml records sinks as an extra source of the FA node.
        unsafe { sys::ggml_flash_attn_ext_add_sinks(fa.raw(), sinks.raw()) };
    }

    /// `a + b[:, ids]`: per-selected-expert bias; `a` [n, k, nt], `b` [n, n_expert], `ids` i32 [k, nt].
    pub fn add_id<'a>(&'a self, a: Tensor<'a>, b: Tensor<'a>, ids: Tensor<'a>) -> Tensor<'a> {
        // SAFETY: as above.
        self.wrap(
            unsafe { sys::ggml_add_id(self.raw(), a.raw(), b.raw(), ids.raw()) },
            "add_id",
        )
    }

    /// gpt-oss's clamped SwiGLU: `a` = gate, `b` = up.
    pub fn swiglu_oai<'a>(
        &'a self,
        a: Tensor<'a>,
        b: Tensor<'a>,
        alpha: f32,
        limit: f32,
    ) -> Tensor<'a> {
        // SAFETY: as above.
        self.wrap(
            unsafe { sys::ggml_swiglu_oai(self.raw(), a.raw(), b.raw(), alpha, limit) },
            "swiglu_oai",
        )
    }

    /// `a` and `b` joined along `dim` (every other dimension equal); either may be a view.
    pub fn concat<'a>(&'a self, a: Tensor<'a>, b: Tensor<'a>, dim: i32) -> Tensor<'a> {
        // SAFETY: as above; ggml asserts the shapes agree (graph invariant).
        self.wrap(
            unsafe { sys::ggml_concat(self.raw(), a.raw(), b.raw(), dim) },
            "concat",
        )
    }

    /// `a` tiled to the shape `ne` (each dimension a multiple of `a`'s).
    pub fn repeat_4d<'a>(&'a self, a: Tensor<'a>, ne: [i64; 4]) -> Tensor<'a> {
        // SAFETY: as above; ggml asserts `ne` is a multiple of a's shape (graph invariant).
        self.wrap(
            unsafe { sys::ggml_repeat_4d(self.raw(), a.raw(), ne[0], ne[1], ne[2], ne[3]) },
            "repeat_4d",
        )
    }

    /// A tensor of `a`'s shape with every element `c` (a new tensor; `a` is unchanged).
    pub fn fill<'a>(&'a self, a: Tensor<'a>, c: f32) -> Tensor<'a> {
        // SAFETY: as above.
        self.wrap(unsafe { sys::ggml_fill(self.raw(), a.raw(), c) }, "fill")
    }

    /// `a·s + b` elementwise.
    pub fn scale_bias<'a>(&'a self, a: Tensor<'a>, s: f32, b: f32) -> Tensor<'a> {
        // SAFETY: as above.
        self.wrap(
            unsafe { sys::ggml_scale_bias(self.raw(), a.raw(), s, b) },
            "scale_bias",
        )
    }

    pub fn relu<'a>(&'a self, a: Tensor<'a>) -> Tensor<'a> {
        // SAFETY: as above.
        self.wrap(unsafe { sys::ggml_relu(self.raw(), a.raw()) }, "relu")
    }

    /// Layer normalisation of each row (mean 0, variance 1), without weight.
    pub fn norm<'a>(&'a self, a: Tensor<'a>, eps: f32) -> Tensor<'a> {
        // SAFETY: as above.
        self.wrap(unsafe { sys::ggml_norm(self.raw(), a.raw(), eps) }, "norm")
    }

    /// Indices of the `k` largest values of each row, in no particular order, i32 [k, rows...].
    pub fn top_k<'a>(&'a self, a: Tensor<'a>, k: usize) -> Tensor<'a> {
        // SAFETY: as above.
        self.wrap(
            unsafe { sys::ggml_top_k(self.raw(), a.raw(), k as i32) },
            "top_k",
        )
    }

    /// `mask` [n_kv, rows] with every cell not picked by its row of `top_k` (i32 [k, rows]) set
    /// to -inf: ggml's fused top-k sparse mask (`ggml_top_k_mask` without scores, blocks or
    /// extra cells), what libllama's `build_fused_top_k_mask` builds. `top_k` is reshaped to the
    /// mask's rows.
    pub fn top_k_mask<'a>(&'a self, mask: Tensor<'a>, top_k: Tensor<'a>) -> Tensor<'a> {
        let [_, m1, m2, m3] = mask.ne();
        let top_k = self
            .reshape(top_k, &[top_k.ne()[0], m1, m2, m3])
            .expect("top_k has the mask's rows");
        // SAFETY: as above; null score/blocks/extra are the op's documented defaults.
        self.wrap(
            unsafe {
                sys::ggml_top_k_mask(
                    self.raw(),
                    mask.raw(),
                    top_k.raw(),
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                )
            },
            "top_k_mask",
        )
    }

    /// DeepSeek-V4's clamped SwiGLU: `silu(min(a, limit)) · clamp(b, -limit, limit)` (`a` =
    /// gate, `b` = up).
    pub fn swiglu_clamp<'a>(&'a self, a: Tensor<'a>, b: Tensor<'a>, limit: f32) -> Tensor<'a> {
        // SAFETY: as above.
        self.wrap(
            unsafe { sys::ggml_swiglu_clamp(self.raw(), a.raw(), b.raw(), limit) },
            "swiglu_clamp",
        )
    }

    /// A rope node (`rope`, `rope_back`) applied to the last `n_dims` of each head instead of
    /// the first: the rotary part starts `n_offs` elements into the head (DeepSeek-V4).
    pub fn rope_offset<'a>(&'a self, rope: Tensor<'a>, n_offs: i32) -> Tensor<'a> {
        // SAFETY: rope is a live rope node of this context; ggml records the offset in its
        // op parameters.
        self.wrap(
            unsafe { sys::ggml_rope_set_offset(rope.raw(), n_offs) },
            "rope_set_offset",
        )
    }

    /// The inverse rotation of [`Self::rope`] (same parameters): un-ropes `a`.
    pub fn rope_back<'a>(&'a self, a: Tensor<'a>, pos: Tensor<'a>, p: &RopeParams) -> Tensor<'a> {
        self.rope_op(sys::ggml_rope_ext_back, a, pos, p, "rope_back")
    }

    /// DeepSeek's lightning indexer (fused): `q` [d, n_head, nt, s], `k` [d, 1, n_kv, s],
    /// `weights` [n_head, nt, 1, s] (pre-scaled), `mask` f16 [n_kv, nt, 1, s] → scores
    /// [n_kv, nt, 1, s] = `Σ_h relu(q_h·k)·w_h + mask`.
    pub fn lightning_indexer<'a>(
        &'a self,
        q: Tensor<'a>,
        k: Tensor<'a>,
        weights: Tensor<'a>,
        mask: Tensor<'a>,
    ) -> Tensor<'a> {
        // SAFETY: as above; ggml asserts the shapes.
        self.wrap(
            unsafe {
                sys::ggml_lightning_indexer(self.raw(), q.raw(), k.raw(), weights.raw(), mask.raw())
            },
            "lightning_indexer",
        )
    }

    /// Marks `t` as a graph input (allocated so it can be written before compute).
    pub fn set_input(&self, t: Tensor<'_>) {
        // SAFETY: live tensor.
        unsafe { sys::ggml_set_input(t.raw()) };
    }

    /// Marks `t` as a graph output (never overwritten by the allocator).
    pub fn set_output(&self, t: Tensor<'_>) {
        // SAFETY: live tensor.
        unsafe { sys::ggml_set_output(t.raw()) };
    }

    /// Reshape to `ne` (same element count, `a` contiguous).
    pub fn reshape<'a>(&'a self, a: Tensor<'a>, ne: &[i64]) -> Result<Tensor<'a>> {
        let n: i64 = ne.iter().product();
        if n != a.n_elements() || !a.is_contiguous() || ne.is_empty() || ne.len() > 4 {
            return Err(a.err(format!("cannot reshape {:?} to {ne:?}", a.shape())));
        }
        // SAFETY: element counts match and `a` is contiguous (ggml's own preconditions).
        let t = unsafe {
            match *ne {
                [n0] => sys::ggml_reshape_1d(self.raw(), a.raw(), n0),
                [n0, n1] => sys::ggml_reshape_2d(self.raw(), a.raw(), n0, n1),
                [n0, n1, n2] => sys::ggml_reshape_3d(self.raw(), a.raw(), n0, n1, n2),
                [n0, n1, n2, n3] => sys::ggml_reshape_4d(self.raw(), a.raw(), n0, n1, n2, n3),
                _ => unreachable!(),
            }
        };
        Ok(self.wrap(t, "reshape"))
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        for buf in self.buffers.get_mut().drain(..) {
            // SAFETY: we own each buffer; tensors that point into it die with this context.
            unsafe { sys::ggml_backend_buffer_free(buf) };
        }
        // SAFETY: we own the context.
        unsafe { sys::ggml_free(self.ptr.as_ptr()) };
    }
}

/// A graph and the context holding its nodes, kept across steps (graph reuse, as llama.cpp does
/// for decode): the engine rewrites the named inputs and computes again, without rebuilding or
/// re-allocating. The context lives on the heap, so tensor pointers stay valid as this moves.
pub struct OwnedGraph {
    // Field order = drop order: the pointers below die with the context.
    graph: NonNull<sys::ggml_cgraph>,
    named: std::collections::HashMap<String, NonNull<sys::ggml_tensor>>,
    ctx: Box<Context>,
}

impl OwnedGraph {
    /// Builds a graph of at most `size` nodes in `ctx`; `f` adds the nodes and returns the names
    /// of the tensors to keep (inputs and outputs; names must be unique in the graph).
    pub fn build<E>(
        ctx: Context,
        size: usize,
        f: impl FnOnce(&Context, Graph<'_>) -> std::result::Result<Vec<String>, E>,
    ) -> std::result::Result<Self, E> {
        let ctx = Box::new(ctx);
        let graph = Graph::new(&ctx, size);
        let keep = f(&ctx, graph)?;
        let index = ctx.index();
        let named = keep
            .into_iter()
            .map(|n| {
                (
                    n.clone(),
                    ctx.get(&index, &n)
                        .unwrap_or_else(|| panic!("graph has no tensor {n:?}"))
                        .ptr,
                )
            })
            .collect();
        Ok(Self {
            graph: graph.ptr(),
            named,
            ctx,
        })
    }

    /// The graph, borrowed from `self`.
    pub fn graph(&self) -> Graph<'_> {
        Graph::from_ptr(self.graph, &self.ctx)
    }

    /// A kept tensor; panics on a name that was not kept (a programming error).
    pub fn tensor(&self, name: &str) -> Tensor<'_> {
        let ptr = *self
            .named
            .get(name)
            .unwrap_or_else(|| panic!("graph kept no tensor {name:?}"));
        Tensor {
            ptr,
            _ctx: PhantomData,
        }
    }

    pub fn has(&self, name: &str) -> bool {
        self.named.contains_key(name)
    }
}

/// Name -> tensor lookup for one context (see [`Context::index`]).
pub struct TensorIndex {
    ctx: NonNull<sys::ggml_context>,
    map: std::collections::HashMap<String, NonNull<sys::ggml_tensor>>,
}

impl TensorIndex {
    pub fn contains(&self, name: &str) -> bool {
        self.map.contains_key(name)
    }

    /// The names indexed (in no particular order).
    pub fn names(&self) -> impl Iterator<Item = &str> + '_ {
        self.map.keys().map(String::as_str)
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
}

/// A tensor of a [`Context`]; `Copy`, valid as long as the context.
#[derive(Clone, Copy)]
pub struct Tensor<'ctx> {
    ptr: NonNull<sys::ggml_tensor>,
    _ctx: PhantomData<&'ctx Context>,
}

impl<'ctx> Tensor<'ctx> {
    pub(crate) fn raw(self) -> *mut sys::ggml_tensor {
        self.ptr.as_ptr()
    }

    /// Wraps a tensor of a context that lives for 'ctx.
    pub(crate) fn from_raw(ptr: NonNull<sys::ggml_tensor>) -> Self {
        Self {
            ptr,
            _ctx: PhantomData,
        }
    }

    /// Whether this tensor is a view of another (view, reshape, permute, transpose): no
    /// computation of its own.
    pub fn is_view_op(&self) -> bool {
        matches!(
            self.get().op,
            sys::GGML_OP_VIEW
                | sys::GGML_OP_RESHAPE
                | sys::GGML_OP_PERMUTE
                | sys::GGML_OP_TRANSPOSE
        )
    }

    /// Whether this tensor's memory is already allocated (its own buffer, or its view source's).
    pub fn has_buffer(&self) -> bool {
        let t = self.get();
        // SAFETY: a view source lives in a context at least as long as its view.
        !t.buffer.is_null() || (!t.view_src.is_null() && unsafe { !(*t.view_src).buffer.is_null() })
    }

    /// The buffer this tensor's memory is in (its view source's for a view; null while
    /// unallocated).
    pub(crate) fn buffer_raw(&self) -> sys::ggml_backend_buffer_t {
        let t = self.get();
        if t.view_src.is_null() {
            t.buffer
        } else {
            // SAFETY: as in has_buffer.
            unsafe { (*t.view_src).buffer }
        }
    }

    /// The buffer type of this tensor's memory (`None` while unallocated).
    pub fn buffer_type(&self) -> Option<super::BufType> {
        let t = self.get();
        let buf = if t.view_src.is_null() {
            t.buffer
        } else {
            // SAFETY: as in has_buffer.
            unsafe { (*t.view_src).buffer }
        };
        // SAFETY: a live buffer; its type is static.
        (!buf.is_null())
            .then(|| super::BufType::from_raw(unsafe { sys::ggml_backend_buffer_get_type(buf) }))
    }

    /// Whether this tensor is a matrix product (`mul_mat` or `mul_mat_id`), whose source 0 is
    /// the matrix.
    pub fn is_matmul(&self) -> bool {
        matches!(
            self.get().op,
            sys::GGML_OP_MUL_MAT | sys::GGML_OP_MUL_MAT_ID
        )
    }

    fn get(&self) -> &sys::ggml_tensor {
        // SAFETY: the tensor lives in the context's pool for 'ctx.
        unsafe { self.ptr.as_ref() }
    }

    fn err(&self, msg: String) -> GgmlError {
        GgmlError::Tensor {
            name: self.name(),
            msg,
        }
    }

    pub fn name(&self) -> String {
        cstr(self.get().name.as_ptr())
    }

    /// Sets the tensor's name (llama.cpp style, e.g. `ffn_moe_out-12`). Truncated at 63 bytes.
    pub fn set_name(self, name: &str) -> Self {
        let c = CString::new(name.replace('\0', "")).expect("NULs removed");
        // SAFETY: ggml copies at most GGML_MAX_NAME-1 bytes.
        unsafe { sys::ggml_set_name(self.raw(), c.as_ptr()) };
        self
    }

    pub fn ty(&self) -> GgmlType {
        GgmlType::from_id(self.get().type_).expect("ggml produced a tensor of an unknown type")
    }

    /// Shape, ne0 first, trailing 1s removed (at least one dimension).
    pub fn shape(&self) -> Vec<i64> {
        let ne = self.get().ne;
        let nd = (1..=4).rev().find(|&d| ne[d - 1] != 1).unwrap_or(1);
        ne[..nd].to_vec()
    }

    pub fn ne(&self) -> [i64; 4] {
        self.get().ne
    }

    /// Strides in bytes, ggml order (nb0 first).
    pub fn nb(&self) -> [usize; 4] {
        self.get().nb
    }

    /// A stable identity for this tensor (its address), e.g. to recognise a graph node in a
    /// scheduler callback ([`super::EvalHook`]).
    pub fn id(&self) -> usize {
        self.raw() as usize
    }

    /// Whether the tensor is flagged a graph input (`ggml_set_input`).
    pub fn is_input(&self) -> bool {
        self.get().flags & sys::GGML_TENSOR_FLAG_INPUT as i32 != 0
    }

    /// Its sources (null ones left out).
    pub fn srcs(&self) -> Vec<Tensor<'ctx>> {
        self.get()
            .src
            .iter()
            .filter_map(|&p| NonNull::new(p).map(Tensor::from_raw))
            .collect()
    }

    /// Whether the tensor has memory (an input no graph node reads is never allocated).
    pub fn is_allocated(&self) -> bool {
        let t = self.get();
        !t.buffer.is_null() && !t.data.is_null()
    }

    /// The address of the tensor's data in its buffer (a device address for GPU buffers, a host
    /// address for host buffers), or 0 when it has none yet. For copy engines that take raw
    /// addresses; reading through it is the caller's (unsafe) business.
    pub fn data_addr(&self) -> usize {
        self.get().data as usize
    }

    /// Copies `data` into the tensor's bytes at `offset`.
    pub fn write_bytes_at(self, offset: usize, data: &[u8]) -> Result<()> {
        let t = self.get();
        if t.buffer.is_null() || t.data.is_null() {
            return Err(self.err("has no backend buffer".into()));
        }
        if offset + data.len() > self.n_bytes() {
            return Err(self.err(format!(
                "write of {} bytes at {offset} overruns its {} bytes",
                data.len(),
                self.n_bytes()
            )));
        }
        // SAFETY: live buffer; the range was checked against the tensor's size.
        unsafe {
            sys::ggml_backend_tensor_set(self.raw(), data.as_ptr().cast(), offset, data.len())
        };
        Ok(())
    }

    /// Queues a copy of `n` bytes from host address `src` into the tensor at `offset` on
    /// `backend`'s compute stream (ggml's `tensor_set_async`): ordered before the work that
    /// backend runs next, without waiting here. Backends without async copies (the CPU) copy
    /// at once.
    ///
    /// # Safety
    /// `[src, src + n)` must be readable host memory that stays unchanged until the backend has
    /// run the copy (the next synchronisation of its stream), and the tensor must live in one of
    /// `backend`'s buffers.
    pub unsafe fn write_async(
        self,
        backend: &super::Backend,
        offset: usize,
        src: usize,
        n: usize,
    ) -> Result<()> {
        let t = self.get();
        if t.buffer.is_null() || t.data.is_null() {
            return Err(self.err("has no backend buffer".into()));
        }
        if offset + n > self.n_bytes() {
            return Err(self.err(format!(
                "write of {n} bytes at {offset} overruns its {} bytes",
                self.n_bytes()
            )));
        }
        // SAFETY: the range was checked against the tensor's size; the source per the contract.
        unsafe {
            sys::ggml_backend_tensor_set_async(
                backend.raw(),
                self.raw(),
                src as *const std::ffi::c_void,
                offset,
                n,
            )
        };
        Ok(())
    }

    pub fn n_elements(&self) -> i64 {
        self.get().ne.iter().product()
    }

    pub fn n_bytes(&self) -> usize {
        // SAFETY: pure computation from the tensor's metadata.
        unsafe { sys::ggml_nbytes(self.raw()) }
    }

    pub fn is_contiguous(&self) -> bool {
        // SAFETY: as above.
        unsafe { sys::ggml_is_contiguous(self.raw()) }
    }

    fn check_io(&self, len: usize) -> Result<()> {
        let t = self.get();
        if t.buffer.is_null() || t.data.is_null() {
            return Err(
                self.err("has no backend buffer (allocate its context or graph first)".into())
            );
        }
        if len != self.n_bytes() {
            return Err(self.err(format!("holds {} bytes, got {len}", self.n_bytes())));
        }
        Ok(())
    }

    /// Copies raw bytes (the tensor's own layout, e.g. quantised blocks) into the tensor.
    pub fn write_bytes(self, data: &[u8]) -> Result<()> {
        self.check_io(data.len())?;
        // SAFETY: the tensor has a live buffer (owned by its context or a live allocator) of
        // n_bytes == data.len() at its data pointer.
        unsafe { sys::ggml_backend_tensor_set(self.raw(), data.as_ptr().cast(), 0, data.len()) };
        Ok(())
    }

    /// Copies the tensor's bytes out.
    pub fn read_bytes(self) -> Result<Vec<u8>> {
        let mut out = vec![0u8; self.n_bytes()];
        self.check_io(out.len())?;
        // SAFETY: as in write_bytes; `out` has exactly n_bytes.
        unsafe { sys::ggml_backend_tensor_get(self.raw(), out.as_mut_ptr().cast(), 0, out.len()) };
        Ok(out)
    }

    /// Copies `out.len()` of the tensor's bytes, from `offset` on, into `out`.
    pub fn read_bytes_at(self, offset: usize, out: &mut [u8]) -> Result<()> {
        let t = self.get();
        if t.buffer.is_null() || t.data.is_null() {
            return Err(self.err("has no backend buffer".into()));
        }
        if offset
            .checked_add(out.len())
            .is_none_or(|end| end > self.n_bytes())
        {
            return Err(self.err(format!(
                "read of {} bytes at {offset} overruns its {} bytes",
                out.len(),
                self.n_bytes()
            )));
        }
        // SAFETY: live buffer; the range was checked against the tensor's size, and `out` has
        // exactly the bytes copied.
        unsafe {
            sys::ggml_backend_tensor_get(self.raw(), out.as_mut_ptr().cast(), offset, out.len())
        };
        Ok(())
    }

    pub fn write_f32(self, data: &[f32]) -> Result<()> {
        self.expect_type(GgmlType::F32)?;
        self.write_bytes(bytemuck::cast_slice(data))
    }

    pub fn write_i64(self, data: &[i64]) -> Result<()> {
        self.expect_type(GgmlType::I64)?;
        self.write_bytes(bytemuck::cast_slice(data))
    }

    pub fn write_i32(self, data: &[i32]) -> Result<()> {
        self.expect_type(GgmlType::I32)?;
        self.write_bytes(bytemuck::cast_slice(data))
    }

    /// Copies an f32 tensor out, straight into the returned vector (one copy: a decode step
    /// reads 600 KB of logits this way, and every extra pass over them is host time between
    /// two steps).
    pub fn read_f32(self) -> Result<Vec<f32>> {
        self.expect_type(GgmlType::F32)?;
        let n = self.n_bytes();
        self.check_io(n)?;
        let mut out: Vec<f32> = Vec::with_capacity(n / 4);
        // SAFETY: the tensor has a live buffer of n bytes (check_io); `out` has room for n / 4
        // f32s (an f32 tensor's size is a multiple of 4), all written by the copy before
        // set_len; every bit pattern is a valid f32.
        unsafe {
            sys::ggml_backend_tensor_get(self.raw(), out.as_mut_ptr().cast(), 0, n);
            out.set_len(n / 4);
        }
        Ok(out)
    }

    /// [`Tensor::read_f32`] through `stage` (page-locked host memory) when it is given and the
    /// tensor fits in it.
    pub fn read_f32_via(self, stage: Option<&super::buffer::HostStage>) -> Result<Vec<f32>> {
        let n = self.n_bytes();
        let Some(stage) = stage.filter(|st| n <= st.size()) else {
            return self.read_f32();
        };
        self.expect_type(GgmlType::F32)?;
        self.check_io(n)?;
        // SAFETY: the tensor has a live buffer of n bytes (check_io); the stage holds at least
        // n bytes of host memory, alive while `stage` is borrowed, fully written by the copy
        // before it is read as n / 4 f32s (every bit pattern is a valid f32).
        unsafe {
            sys::ggml_backend_tensor_get(self.raw(), stage.addr() as *mut std::ffi::c_void, 0, n);
            Ok(std::slice::from_raw_parts(stage.addr() as *const f32, n / 4).to_vec())
        }
    }

    fn expect_type(&self, ty: GgmlType) -> Result<()> {
        if self.ty() != ty {
            return Err(self.err(format!("is {}, not {ty}", self.ty())));
        }
        Ok(())
    }
}

impl std::fmt::Debug for Tensor<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}{:?}", self.name(), self.ty(), self.shape())
    }
}
