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
}

impl LlamaModel {
    /// Loads `path` with `n_gpu_layers` layers offloaded (0 = CPU only, -1 = all).
    pub fn load(path: &Path, n_gpu_layers: i32) -> Result<Self> {
        Self::load_with(path, n_gpu_layers, false)
    }

    /// Loads only the vocabulary of `path` (works on vocab-only GGUFs of any architecture).
    pub fn load_vocab(path: &Path) -> Result<Self> {
        Self::load_with(path, 0, true)
    }

    fn load_with(path: &Path, n_gpu_layers: i32, vocab_only: bool) -> Result<Self> {
        init();
        let c = CString::new(path.to_string_lossy().as_bytes())
            .map_err(|_| err(format!("{}: NUL in path", path.display())))?;
        // SAFETY: default params are plain data; path is a valid C string; null = failure.
        let ptr = unsafe {
            let mut p = sys::llama_model_default_params();
            p.n_gpu_layers = n_gpu_layers;
            p.vocab_only = vocab_only;
            sys::llama_model_load_from_file(c.as_ptr(), p)
        };
        NonNull::new(ptr).map(|ptr| Self { ptr }).ok_or_else(|| {
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
}

impl<'m> LlamaContext<'m> {
    pub fn new(model: &'m LlamaModel, n_ctx: u32, n_threads: i32) -> Result<Self> {
        // SAFETY: default params are plain data; model is live; null = failure.
        let ptr = unsafe {
            let mut p = sys::llama_context_default_params();
            p.n_ctx = n_ctx;
            p.n_batch = n_ctx;
            p.n_ubatch = n_ctx.min(512);
            p.n_threads = n_threads;
            p.n_threads_batch = n_threads;
            sys::llama_init_from_model(model.ptr.as_ptr(), p)
        };
        NonNull::new(ptr)
            .map(|ptr| Self { ptr, model })
            .ok_or_else(|| err("llama_init_from_model failed"))
    }

    /// Runs `tokens` as a fresh sequence (positions 0..n) and returns the logits at every position.
    pub fn logits_all(&mut self, tokens: &[i32]) -> Result<Vec<Vec<f32>>> {
        // SAFETY: live context; clears its KV memory.
        unsafe { sys::llama_memory_clear(sys::llama_get_memory(self.ptr.as_ptr()), true) };
        self.eval(tokens, 0)
    }

    /// Appends `tokens` at positions `n_past..` of sequence 0 and returns their logits.
    pub fn eval(&mut self, tokens: &[i32], n_past: usize) -> Result<Vec<Vec<f32>>> {
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
                *b.logits.add(i) = 1;
            }
            b.n_tokens = n as i32;
            let rc = sys::llama_decode(self.ptr.as_ptr(), b);
            let result = if rc != 0 {
                Err(err(format!("llama_decode returned {rc}")))
            } else {
                (0..n)
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
        // SAFETY: we own the context.
        unsafe { sys::llama_free(self.ptr.as_ptr()) };
    }
}
