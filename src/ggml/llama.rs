//! libllama, the reference implementation, from the same llama.cpp build as our ggml: load a
//! GGUF, tokenize, and get per-position logits. Used by parity tests, `inspect`'s cross-checks
//! and the benchmark baseline; never on PocketMoE's own inference path.
//!
//! llama.cpp's log output is silenced unless `POCKETMOE_LLAMA_LOG=1`.
use super::{GgmlError, Result};
use ggml_sys::llama as sys;
use std::ffi::{c_char, c_void, CString};
use std::path::Path;
use std::ptr::NonNull;
use std::sync::Once;

static INIT: Once = Once::new();

unsafe extern "C" fn quiet_log(
    _level: sys::ggml_log_level,
    text: *const c_char,
    _user: *mut c_void,
) {
    if std::env::var_os("POCKETMOE_LLAMA_LOG").is_some() && !text.is_null() {
        // SAFETY: llama.cpp passes a NUL-terminated message.
        eprint!(
            "{}",
            unsafe { std::ffi::CStr::from_ptr(text) }.to_string_lossy()
        );
    }
}

fn init() {
    INIT.call_once(|| {
        // SAFETY: one-time global initialisation; the callback is a plain function.
        unsafe {
            sys::llama_log_set(Some(quiet_log), std::ptr::null_mut());
            sys::llama_backend_init();
        }
    });
}

fn err(what: impl Into<String>) -> GgmlError {
    GgmlError::Llama(what.into())
}

/// A model loaded by libllama.
pub struct LlamaModel {
    ptr: NonNull<sys::llama_model>,
    /// Tensor-override patterns handed to libllama at load (kept alive with the model).
    _patterns: Vec<CString>,
}

/// llama.cpp's regex for routed-expert tensors (`LLM_FFN_EXPS_REGEX` in common.h: what
/// `-ot exps=CPU`, `--cpu-moe` and `--n-cpu-moe` match).
pub const FFN_EXPS_REGEX: &str = "\\.ffn_(up|down|gate|gate_up)_(ch|)exps";

/// Which routed experts llama.cpp keeps in host memory (`tensor_buft_overrides` to the CPU).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum CpuExperts {
    /// None: every weight of an offloaded layer goes to the GPU.
    None,
    /// Those of the first `n` layers (`--n-cpu-moe n`).
    FirstLayers(usize),
    /// Those of every layer (`-ot exps=CPU`, `--cpu-moe`).
    All,
}

impl CpuExperts {
    /// The override patterns (libllama matches them with `std::regex_search` on tensor names).
    pub fn patterns(&self) -> Vec<String> {
        match *self {
            CpuExperts::None => Vec::new(),
            CpuExperts::FirstLayers(n) => (0..n)
                .map(|il| format!("blk\\.{il}{FFN_EXPS_REGEX}"))
                .collect(),
            CpuExperts::All => vec![FFN_EXPS_REGEX.to_string()],
        }
    }
}

/// How a model is placed, in llama.cpp's own terms (`-ngl`, `--main-gpu`, `--n-cpu-moe`, `-ot`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoadOptions {
    /// Layers in VRAM (0 = CPU only, -1 = all).
    pub n_gpu_layers: i32,
    /// The one GPU to use (`--split-mode none --main-gpu N`); None = llama.cpp's default.
    pub main_gpu: Option<usize>,
    pub cpu_experts: CpuExperts,
    /// CPU weights in the CPU's extra buffer types where its kernels take them (repacked:
    /// llama.cpp's default; `false` is its `--no-repack`).
    pub extra_bufts: bool,
}

/// Context settings beyond the defaults, as llama-bench exposes them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ContextOptions {
    pub n_ctx: u32,
    /// Logical batch (tokens per `llama_decode`) and physical micro-batch.
    pub n_batch: u32,
    pub n_ubatch: u32,
    pub n_threads: i32,
    /// Offload host-resident weights' ops to the GPU for large batches (llama.cpp default: on).
    pub op_offload: bool,
    /// Attach a persistent CPU thread pool, as llama-bench does (see
    /// [`LlamaContext::with_options`]); off only to measure what it is worth.
    pub threadpool: bool,
}

impl LlamaModel {
    /// Loads `path` with `n_gpu_layers` layers offloaded (0 = CPU only, -1 = all).
    pub fn load(path: &Path, n_gpu_layers: i32) -> Result<Self> {
        Self::load_with(path, n_gpu_layers, false, true)
    }

    /// Loads `path` placed as `opts` says (the settings of a llama.cpp MoE-offload run).
    pub fn load_placed(path: &Path, opts: &LoadOptions) -> Result<Self> {
        init();
        let c = CString::new(path.to_string_lossy().as_bytes())
            .map_err(|_| err(format!("{}: NUL in path", path.display())))?;
        let patterns: Vec<CString> = opts
            .cpu_experts
            .patterns()
            .into_iter()
            .map(|p| CString::new(p).expect("patterns have no NUL"))
            .collect();
        // SAFETY: plain query.
        let max = unsafe { sys::llama_max_tensor_buft_overrides() };
        if patterns.len() >= max {
            return Err(err(format!(
                "{} tensor overrides, libllama takes at most {}",
                patterns.len(),
                max.saturating_sub(1)
            )));
        }
        // SAFETY: the CPU buffer type is a static singleton.
        let cpu = unsafe { sys::ggml_backend_cpu_buffer_type() };
        let mut overrides: Vec<sys::llama_model_tensor_buft_override> = patterns
            .iter()
            .map(|p| sys::llama_model_tensor_buft_override {
                pattern: p.as_ptr(),
                buft: cpu,
            })
            .collect();
        // The list is NULL-terminated.
        overrides.push(sys::llama_model_tensor_buft_override {
            pattern: std::ptr::null(),
            buft: std::ptr::null_mut(),
        });
        // SAFETY: default params are plain data; `c`, `patterns` and `overrides` outlive the call
        // (libllama reads the overrides while loading); null = failure.
        let ptr = unsafe {
            let mut p = sys::llama_model_default_params();
            p.n_gpu_layers = opts.n_gpu_layers;
            p.use_extra_bufts = opts.extra_bufts;
            if let Some(g) = opts.main_gpu {
                p.split_mode = sys::LLAMA_SPLIT_MODE_NONE;
                p.main_gpu = g as i32;
            }
            if overrides.len() > 1 {
                p.tensor_buft_overrides = overrides.as_ptr();
            }
            sys::llama_model_load_from_file(c.as_ptr(), p)
        };
        NonNull::new(ptr)
            .map(|ptr| Self {
                ptr,
                _patterns: patterns,
            })
            .ok_or_else(|| {
                err(format!(
                    "libllama could not load {} with {opts:?} (set POCKETMOE_LLAMA_LOG=1 for its log)",
                    path.display()
                ))
            })
    }

    /// As [`LlamaModel::load`], with CPU weights kept in plain buffers (no repacking into
    /// llama.cpp's "extra" CPU layouts), so CPU results come from the same kernels PocketMoE uses:
    /// the configuration for logit-parity tests.
    pub fn load_plain(path: &Path, n_gpu_layers: i32) -> Result<Self> {
        Self::load_with(path, n_gpu_layers, false, false)
    }

    /// Loads only the vocabulary of `path` (works on vocab-only GGUFs of any architecture).
    pub fn load_vocab(path: &Path) -> Result<Self> {
        Self::load_with(path, 0, true, true)
    }

    fn load_with(
        path: &Path,
        n_gpu_layers: i32,
        vocab_only: bool,
        extra_bufts: bool,
    ) -> Result<Self> {
        init();
        let c = CString::new(path.to_string_lossy().as_bytes())
            .map_err(|_| err(format!("{}: NUL in path", path.display())))?;
        // SAFETY: default params are plain data; path is a valid C string; null = failure.
        let ptr = unsafe {
            let mut p = sys::llama_model_default_params();
            p.n_gpu_layers = n_gpu_layers;
            p.vocab_only = vocab_only;
            p.use_extra_bufts = extra_bufts;
            sys::llama_model_load_from_file(c.as_ptr(), p)
        };
        NonNull::new(ptr)
            .map(|ptr| Self {
                ptr,
                _patterns: Vec::new(),
            })
            .ok_or_else(|| {
                err(format!(
                    "libllama could not load {} (set POCKETMOE_LLAMA_LOG=1 for its log)",
                    path.display()
                ))
            })
    }

    fn vocab(&self) -> *const sys::llama_vocab {
        // SAFETY: live model.
        unsafe { sys::llama_model_get_vocab(self.ptr.as_ptr()) }
    }

    pub fn n_vocab(&self) -> usize {
        // SAFETY: live model's vocab.
        unsafe { sys::llama_vocab_n_tokens(self.vocab()) as usize }
    }

    pub fn n_params(&self) -> u64 {
        // SAFETY: live model.
        unsafe { sys::llama_model_n_params(self.ptr.as_ptr()) }
    }

    /// Bytes of all weights as libllama counts them.
    pub fn size(&self) -> u64 {
        // SAFETY: live model.
        unsafe { sys::llama_model_size(self.ptr.as_ptr()) }
    }

    /// Tokenizes `text` as llama.cpp does.
    pub fn tokenize(&self, text: &str, add_special: bool, parse_special: bool) -> Result<Vec<i32>> {
        let len = i32::try_from(text.len()).map_err(|_| err("text longer than 2^31 bytes"))?;
        let run = |out: &mut Vec<i32>| {
            // SAFETY: text is valid for len bytes; out has room for out.len() tokens.
            unsafe {
                sys::llama_tokenize(
                    self.vocab(),
                    text.as_ptr().cast(),
                    len,
                    out.as_mut_ptr(),
                    out.len() as i32,
                    add_special,
                    parse_special,
                )
            }
        };
        let mut out = vec![0i32; text.len() + 8];
        let mut n = run(&mut out);
        if n < 0 {
            // llama.cpp says how many tokens it needs.
            out.resize(n.unsigned_abs() as usize, 0);
            n = run(&mut out);
        }
        if n < 0 {
            return Err(err(format!("llama_tokenize failed ({n})")));
        }
        out.truncate(n as usize);
        Ok(out)
    }
}

impl Drop for LlamaModel {
    fn drop(&mut self) {
        // SAFETY: we own the model; contexts borrow it and are dropped first.
        unsafe { sys::llama_model_free(self.ptr.as_ptr()) };
    }
}

/// An inference context of a [`LlamaModel`].
pub struct LlamaContext<'m> {
    ptr: NonNull<sys::llama_context>,
    model: &'m LlamaModel,
    /// The CPU worker pool attached to the context, as llama-bench attaches one (dropped after
    /// `Drop` frees the context).
    threadpool: Option<super::ThreadPool>,
}

impl<'m> LlamaContext<'m> {
    pub fn new(model: &'m LlamaModel, n_ctx: u32, n_threads: i32) -> Result<Self> {
        Self::new_with_capture(model, n_ctx, n_threads, None)
    }

    /// A context with llama-bench's knobs (batch, micro-batch, threads, op offload), and a
    /// persistent CPU thread pool attached as llama-bench attaches one (`--poll 50`).
    ///
    /// The pool is what makes this an honest baseline. Without one, and with OpenMP off (as our
    /// llama.cpp build has it), ggml-cpu starts and joins `n_threads - 1` threads at every CPU
    /// graph piece; with experts on the CPU that is every CPU-expert layer of every decoded token,
    /// and it made this in-process llama.cpp decode 3-4x slower than stock `llama-bench`
    /// (issue 13). Stock builds use OpenMP, whose threads stay alive between pieces; llama-bench
    /// also attaches a pool (`ggml_threadpool_new` + `llama_attach_threadpool`).
    pub fn with_options(model: &'m LlamaModel, o: &ContextOptions) -> Result<Self> {
        // SAFETY: default params are plain data; model is live; null = failure.
        let ptr = unsafe {
            let mut p = sys::llama_context_default_params();
            p.n_ctx = o.n_ctx;
            p.n_batch = o.n_batch;
            p.n_ubatch = o.n_ubatch;
            p.n_threads = o.n_threads;
            p.n_threads_batch = o.n_threads;
            p.op_offload = o.op_offload;
            sys::llama_init_from_model(model.ptr.as_ptr(), p)
        };
        let mut ctx = NonNull::new(ptr)
            .map(|ptr| Self {
                ptr,
                model,
                threadpool: None,
            })
            .ok_or_else(|| err(format!("llama_init_from_model failed ({o:?})")))?;
        if o.threadpool {
            let tp = super::ThreadPool::new(o.n_threads.max(1) as usize, true)?;
            // SAFETY: live context; the pool outlives it (a field dropped after the context is
            // freed). The two bindgen runs bind the same C struct under two Rust names.
            unsafe {
                sys::llama_attach_threadpool(ctx.ptr.as_ptr(), tp.raw().cast(), tp.raw().cast())
            };
            ctx.threadpool = Some(tp);
        }
        Ok(ctx)
    }

    /// Forgets positions `n..` of the sequence (keeps the first `n` in the KV cache).
    pub fn truncate(&mut self, n: usize) {
        // SAFETY: live context; removing a position range of sequence 0 (p1 < 0 = to the end).
        unsafe {
            sys::llama_memory_seq_rm(sys::llama_get_memory(self.ptr.as_ptr()), 0, n as i32, -1)
        };
    }

    /// As [`LlamaContext::new`] with a KV cache of type `kv` (f16 default, q8_0, ...).
    pub fn new_with_kv(
        model: &'m LlamaModel,
        n_ctx: u32,
        n_threads: i32,
        kv: super::GgmlType,
    ) -> Result<Self> {
        Self::build(model, n_ctx, n_threads, None, Some(kv))
    }

    /// As [`LlamaContext::new`], capturing named tensors into `cap` at every decode (for
    /// locating a divergence from PocketMoE by tensor name). `cap` must outlive the context.
    pub fn new_with_capture(
        model: &'m LlamaModel,
        n_ctx: u32,
        n_threads: i32,
        cap: Option<&mut super::capture::Capture>,
    ) -> Result<Self> {
        Self::build(model, n_ctx, n_threads, cap, None)
    }

    fn build(
        model: &'m LlamaModel,
        n_ctx: u32,
        n_threads: i32,
        cap: Option<&mut super::capture::Capture>,
        kv: Option<super::GgmlType>,
    ) -> Result<Self> {
        // SAFETY: default params are plain data; model is live; null = failure.
        let ptr = unsafe {
            let mut p = oracle_params(n_ctx, n_threads);
            if let Some(t) = kv {
                p.type_k = t.raw();
                p.type_v = t.raw();
            }
            if let Some(c) = cap {
                // SAFETY: same C callback type (bound twice by two bindgen runs); `c` outlives
                // the context by this function's contract.
                p.cb_eval = Some(std::mem::transmute::<
                    unsafe extern "C" fn(*mut ggml_sys::ggml_tensor, bool, *mut c_void) -> bool,
                    unsafe extern "C" fn(*mut sys::ggml_tensor, bool, *mut c_void) -> bool,
                >(super::capture::capture_cb));
                p.cb_eval_user_data = c as *mut _ as *mut c_void;
            }
            sys::llama_init_from_model(model.ptr.as_ptr(), p)
        };
        Self::from_raw(ptr, model, "llama_init_from_model failed")
    }

    /// A context that computes embeddings (`llama_context_params.embeddings`), pooled by
    /// `pooling` (llama.cpp's `llama_pooling_type`: 0 none, 1 mean, 2 cls, 3 last, 4 rank: then
    /// [`LlamaContext::embeddings`] gives the `n_cls_out` scores), on the CPU
    /// settings of [`LlamaContext::new`]. A prompt must fit one micro-batch (512 tokens, or
    /// `n_ctx` when smaller): llama.cpp pools within one.
    pub fn new_embeddings(
        model: &'m LlamaModel,
        n_ctx: u32,
        n_threads: i32,
        pooling: i32,
    ) -> Result<Self> {
        // SAFETY: default params are plain data; model is live; null = failure.
        let ptr = unsafe {
            let mut p = oracle_params(n_ctx, n_threads);
            p.embeddings = true;
            p.pooling_type = pooling as sys::llama_pooling_type;
            sys::llama_init_from_model(model.ptr.as_ptr(), p)
        };
        Self::from_raw(ptr, model, "llama_init_from_model (embeddings) failed")
    }

    /// A context around `ptr` from `llama_init_from_model` (null: the error `what`).
    fn from_raw(ptr: *mut sys::llama_context, model: &'m LlamaModel, what: &str) -> Result<Self> {
        NonNull::new(ptr)
            .map(|ptr| Self {
                ptr,
                model,
                threadpool: None,
            })
            .ok_or_else(|| err(what))
    }

    /// The embeddings of `tokens` read as a fresh sequence 0 (a context from
    /// [`LlamaContext::new_embeddings`]): one pooled vector (`llama_get_embeddings_seq`; with
    /// rank pooling its `n_cls_out` scores), or one per position with pooling none
    /// (`llama_get_embeddings_ith`). Not normalised.
    pub fn embeddings(&mut self, tokens: &[i32]) -> Result<Vec<Vec<f32>>> {
        let n = tokens.len();
        if n == 0 {
            return Ok(Vec::new());
        }
        // SAFETY: live model.
        let n_embd = unsafe { sys::llama_model_n_embd(self.model.ptr.as_ptr()) } as usize;
        // SAFETY: as `eval_with`: the batch is allocated for n tokens with one sequence id
        // each, filled within bounds, decoded and freed; embedding pointers are read (n_embd
        // floats each, libllama's row size) while the context lives.
        unsafe {
            let ctx = self.ptr.as_ptr();
            sys::llama_memory_clear(sys::llama_get_memory(ctx), true);
            let pooled = sys::llama_pooling_type(ctx) != sys::LLAMA_POOLING_TYPE_NONE;
            // Rank pooling: libllama keeps n_cls_out scores per sequence, not a row.
            let n_seq_out = if sys::llama_pooling_type(ctx) == sys::LLAMA_POOLING_TYPE_RANK {
                sys::llama_model_n_cls_out(self.model.ptr.as_ptr()) as usize
            } else {
                n_embd
            };
            let mut b = sys::llama_batch_init(n as i32, 0, 1);
            for (i, &t) in tokens.iter().enumerate() {
                *b.token.add(i) = t;
                *b.pos.add(i) = i as i32;
                *b.n_seq_id.add(i) = 1;
                *(*b.seq_id.add(i)) = 0;
                *b.logits.add(i) = 1;
            }
            b.n_tokens = n as i32;
            let rc = sys::llama_decode(ctx, b);
            let row = |p: *const f32, len: usize, what: String| {
                if p.is_null() {
                    Err(err(format!("no embedding for {what}")))
                } else {
                    Ok(std::slice::from_raw_parts(p, len).to_vec())
                }
            };
            let result = if rc != 0 {
                Err(err(format!("llama_decode returned {rc}")))
            } else if pooled {
                row(
                    sys::llama_get_embeddings_seq(ctx, 0),
                    n_seq_out,
                    "sequence 0".into(),
                )
                .map(|v| vec![v])
            } else {
                (0..n)
                    .map(|i| {
                        row(
                            sys::llama_get_embeddings_ith(ctx, i as i32),
                            n_embd,
                            format!("position {i}"),
                        )
                    })
                    .collect()
            };
            sys::llama_batch_free(b);
            result
        }
    }

    /// Runs `tokens` as a fresh sequence (positions 0..n) and returns the logits at every position.
    pub fn logits_all(&mut self, tokens: &[i32]) -> Result<Vec<Vec<f32>>> {
        // SAFETY: live context; clears its KV memory.
        unsafe { sys::llama_memory_clear(sys::llama_get_memory(self.ptr.as_ptr()), true) };
        self.eval(tokens, 0)
    }

    /// Appends `tokens` at positions `n_past..` of sequence 0 and returns their logits.
    pub fn eval(&mut self, tokens: &[i32], n_past: usize) -> Result<Vec<Vec<f32>>> {
        self.eval_with(tokens, n_past, false)
    }

    /// Appends `tokens` and returns the last position's logits only.
    pub fn eval_last(&mut self, tokens: &[i32], n_past: usize) -> Result<Vec<f32>> {
        Ok(self
            .eval_with(tokens, n_past, true)?
            .pop()
            .unwrap_or_default())
    }

    /// Forgets the sequence.
    pub fn clear(&mut self) {
        // SAFETY: live context.
        unsafe { sys::llama_memory_clear(sys::llama_get_memory(self.ptr.as_ptr()), true) };
    }

    fn eval_with(
        &mut self,
        tokens: &[i32],
        n_past: usize,
        last_only: bool,
    ) -> Result<Vec<Vec<f32>>> {
        let n = tokens.len();
        if n == 0 {
            return Ok(Vec::new());
        }
        let n_vocab = self.model.n_vocab();
        // SAFETY: the batch is allocated for n tokens with one sequence id each, filled within
        // bounds, decoded, and freed; logits pointers are read while the context lives.
        unsafe {
            let mut b = sys::llama_batch_init(n as i32, 0, 1);
            for (i, &t) in tokens.iter().enumerate() {
                *b.token.add(i) = t;
                *b.pos.add(i) = (n_past + i) as i32;
                *b.n_seq_id.add(i) = 1;
                *(*b.seq_id.add(i)) = 0;
                *b.logits.add(i) = i8::from(!last_only || i + 1 == n);
            }
            b.n_tokens = n as i32;
            let rc = sys::llama_decode(self.ptr.as_ptr(), b);
            let result = if rc != 0 {
                Err(err(format!("llama_decode returned {rc}")))
            } else {
                let first = if last_only { n - 1 } else { 0 };
                (first..n)
                    .map(|i| {
                        let p = sys::llama_get_logits_ith(self.ptr.as_ptr(), i as i32);
                        if p.is_null() {
                            Err(err(format!("no logits for position {i}")))
                        } else {
                            Ok(std::slice::from_raw_parts(p, n_vocab).to_vec())
                        }
                    })
                    .collect()
            };
            sys::llama_batch_free(b);
            result
        }
    }
}

impl Drop for LlamaContext<'_> {
    fn drop(&mut self) {
        // SAFETY: we own the context; its thread pool, a field, is dropped after this.
        unsafe { sys::llama_free(self.ptr.as_ptr()) };
    }
}

/// Tokenizer and chat-template entry points (the oracle for `crate::tokenizer`'s tests).
impl LlamaModel {
    /// Bytes of `token` as `llama_token_to_piece(.., lstrip, special)`.
    pub fn token_to_piece(&self, token: i32, lstrip: i32, special: bool) -> Result<Vec<u8>> {
        let run = |buf: &mut Vec<u8>| {
            // SAFETY: buf is valid for buf.len() bytes; libllama writes at most that many.
            unsafe {
                sys::llama_token_to_piece(
                    self.vocab(),
                    token,
                    buf.as_mut_ptr().cast(),
                    buf.len() as i32,
                    lstrip,
                    special,
                )
            }
        };
        let mut buf = vec![0u8; 64];
        let mut n = run(&mut buf);
        if n < 0 {
            buf.resize(n.unsigned_abs() as usize, 0);
            n = run(&mut buf);
        }
        if n < 0 {
            return Err(err(format!("llama_token_to_piece({token}) failed ({n})")));
        }
        buf.truncate(n as usize);
        Ok(buf)
    }

    /// Bytes of `tokens` as `llama_detokenize(.., remove_special, unparse_special)`.
    pub fn detokenize(
        &self,
        tokens: &[i32],
        remove_special: bool,
        unparse_special: bool,
    ) -> Result<Vec<u8>> {
        let n_tokens = i32::try_from(tokens.len()).map_err(|_| err("too many tokens"))?;
        let run = |buf: &mut Vec<u8>| {
            // SAFETY: tokens is valid for n_tokens ids; buf for buf.len() bytes.
            unsafe {
                sys::llama_detokenize(
                    self.vocab(),
                    tokens.as_ptr(),
                    n_tokens,
                    buf.as_mut_ptr().cast(),
                    buf.len() as i32,
                    remove_special,
                    unparse_special,
                )
            }
        };
        let mut buf = vec![0u8; tokens.len() * 8 + 16];
        let mut n = run(&mut buf);
        if n < 0 {
            buf.resize(n.unsigned_abs() as usize, 0);
            n = run(&mut buf);
        }
        if n < 0 {
            return Err(err(format!("llama_detokenize failed ({n})")));
        }
        buf.truncate(n as usize);
        Ok(buf)
    }

    fn token_or_none(t: i32) -> Option<i32> {
        (t >= 0).then_some(t)
    }

    /// BOS id (`llama_vocab_bos`); None for `LLAMA_TOKEN_NULL`.
    pub fn token_bos(&self) -> Option<i32> {
        // SAFETY: live model's vocab.
        Self::token_or_none(unsafe { sys::llama_vocab_bos(self.vocab()) })
    }

    pub fn token_eos(&self) -> Option<i32> {
        // SAFETY: live model's vocab.
        Self::token_or_none(unsafe { sys::llama_vocab_eos(self.vocab()) })
    }

    pub fn token_eot(&self) -> Option<i32> {
        // SAFETY: live model's vocab.
        Self::token_or_none(unsafe { sys::llama_vocab_eot(self.vocab()) })
    }

    /// Whether `token` ends generation (`llama_vocab_is_eog`).
    pub fn is_eog(&self, token: i32) -> bool {
        // SAFETY: live model's vocab; libllama checks the id.
        unsafe { sys::llama_vocab_is_eog(self.vocab(), token) }
    }

    /// `llama_token_attr` bits of `token` (must be < n_vocab).
    pub fn token_attr(&self, token: i32) -> u32 {
        assert!(
            token >= 0 && (token as usize) < self.n_vocab(),
            "token {token} out of range"
        );
        // SAFETY: live model's vocab; the id is in range (checked above; libllama uses .at()).
        unsafe { sys::llama_vocab_get_attr(self.vocab(), token) }
    }

    /// `llama_vocab_get_add_bos` / `llama_vocab_get_add_eos`.
    pub fn add_bos(&self) -> bool {
        // SAFETY: live model's vocab.
        unsafe { sys::llama_vocab_get_add_bos(self.vocab()) }
    }

    pub fn add_eos(&self) -> bool {
        // SAFETY: live model's vocab.
        unsafe { sys::llama_vocab_get_add_eos(self.vocab()) }
    }

    /// The model's chat template (`name` = None: the default), as `llama_model_chat_template`.
    pub fn chat_template(&self, name: Option<&str>) -> Option<String> {
        let name = name.map(CString::new).transpose().ok()?;
        // SAFETY: live model; name is NULL or a C string; the result is NULL or a C string
        // owned by the model, copied before returning.
        unsafe {
            let p = sys::llama_model_chat_template(
                self.ptr.as_ptr(),
                name.as_ref().map_or(std::ptr::null(), |n| n.as_ptr()),
            );
            (!p.is_null()).then(|| std::ffi::CStr::from_ptr(p).to_string_lossy().into_owned())
        }
    }
}

/// `llama_chat_apply_template(tmpl, messages, add_ass)`: libllama's built-in (non-Jinja)
/// rendering of the templates it recognises by content or by name ("chatml", "llama3", ...).
/// Err when it does not recognise `tmpl`.
pub fn chat_apply_template(tmpl: &str, messages: &[(&str, &str)], add_ass: bool) -> Result<String> {
    init();
    let c = |s: &str| CString::new(s).map_err(|_| err("NUL in chat template input"));
    let tmpl_c = c(tmpl)?;
    let owned: Vec<(CString, CString)> = messages
        .iter()
        .map(|(r, m)| Ok((c(r)?, c(m)?)))
        .collect::<Result<_>>()?;
    let chat: Vec<sys::llama_chat_message> = owned
        .iter()
        .map(|(r, m)| sys::llama_chat_message {
            role: r.as_ptr(),
            content: m.as_ptr(),
        })
        .collect();
    let run = |buf: &mut Vec<u8>| {
        // SAFETY: tmpl_c and the strings behind chat live until after the call; buf is valid
        // for buf.len() bytes.
        unsafe {
            sys::llama_chat_apply_template(
                tmpl_c.as_ptr(),
                chat.as_ptr(),
                chat.len(),
                add_ass,
                buf.as_mut_ptr().cast(),
                buf.len() as i32,
            )
        }
    };
    let total: usize = messages.iter().map(|(r, m)| r.len() + m.len()).sum();
    let mut buf = vec![0u8; 2 * total + 256];
    let mut n = run(&mut buf);
    if n > buf.len() as i32 {
        buf.resize(n as usize, 0);
        n = run(&mut buf);
    }
    if n < 0 {
        return Err(err(
            "llama_chat_apply_template does not support this template",
        ));
    }
    buf.truncate(n as usize);
    String::from_utf8(buf).map_err(|_| err("llama_chat_apply_template returned invalid UTF-8"))
}

/// The oracle's context parameters: `n_ctx` tokens in micro-batches of up to 512, `n_threads`.
fn oracle_params(n_ctx: u32, n_threads: i32) -> sys::llama_context_params {
    // SAFETY: returns plain data.
    let mut p = unsafe { sys::llama_context_default_params() };
    p.n_ctx = n_ctx;
    p.n_batch = n_ctx;
    p.n_ubatch = n_ctx.min(512);
    p.n_threads = n_threads;
    p.n_threads_batch = n_threads;
    // The oracle computes where its weights are: with op offload (llama.cpp's default) a CUDA
    // build runs a CPU model's large-batch matmuls on the GPU, whose rounding then flips
    // near-tie routing against our CPU engine (the "CPU parity fails only in the CUDA build" of
    // sessions 1-2).
    p.op_offload = false;
    p
}
