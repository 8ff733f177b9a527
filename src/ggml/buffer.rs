//! Backend buffers a [`Context`] owns but the caller lays out: tensors placed at chosen offsets
//! (several tensors may alias one range, e.g. the per-layer views of one staging area), host
//! buffers that are page-locked when the device offers that (ggml-cuda's host buffer type), and
//! the device memory query.
//!
//! Invariant: a [`BufferRef`] borrows its context, which frees the buffer when it drops, so a
//! tensor placed in it never outlives its data.
use super::{Backend, Context, GgmlError, Result, Tensor};
use ggml_sys as sys;
use std::marker::PhantomData;

/// Which memory a new buffer lives in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Memory {
    /// The backend's own memory (VRAM for a GPU backend).
    Device,
    /// Host memory the device reads fast: page-locked for CUDA; plain host memory for the CPU.
    Host,
}

/// A buffer owned by a context (see [`Context::new_buffer`]).
#[derive(Clone, Copy)]
pub struct BufferRef<'ctx> {
    ptr: sys::ggml_backend_buffer_t,
    _ctx: PhantomData<&'ctx Context>,
}

impl Context {
    /// Allocates a `size`-byte buffer of `backend` in `mem`, owned by this context.
    pub fn new_buffer(&self, backend: &Backend, mem: Memory, size: usize) -> Result<BufferRef<'_>> {
        // SAFETY: live backend; the device handle is static; a null host buffer type means the
        // device has none and the CPU's is used instead.
        let buft = unsafe {
            match mem {
                Memory::Device => backend.buffer_type().raw(),
                Memory::Host => {
                    let dev = sys::ggml_backend_get_device(backend.raw());
                    let host = if dev.is_null() {
                        std::ptr::null_mut()
                    } else {
                        sys::ggml_backend_dev_host_buffer_type(dev)
                    };
                    if host.is_null() {
                        sys::ggml_backend_cpu_buffer_type()
                    } else {
                        host
                    }
                }
            }
        };
        // SAFETY: valid buffer type; null on failure. ggml rounds a 0-byte request up.
        let buf = unsafe { sys::ggml_backend_buft_alloc_buffer(buft, size.max(1)) };
        if buf.is_null() {
            return Err(GgmlError::Alloc {
                backend: backend.name(),
                what: format!("{mem:?} buffer"),
                size,
            });
        }
        self.adopt_buffer(buf);
        Ok(BufferRef {
            ptr: buf,
            _ctx: PhantomData,
        })
    }
}

impl Context {
    /// A CPU buffer over existing host memory `[addr, addr + size)`, owned (not the memory) by
    /// this context: tensors placed in it read that memory directly.
    ///
    /// # Safety
    /// The memory must stay valid, and not be freed, while this context lives.
    pub unsafe fn wrap_host_memory(&self, addr: usize, size: usize) -> Result<BufferRef<'_>> {
        // SAFETY: per the contract above; ggml does not free memory it did not allocate.
        let buf =
            unsafe { sys::ggml_backend_cpu_buffer_from_ptr(addr as *mut std::ffi::c_void, size) };
        if buf.is_null() {
            return Err(GgmlError::Alloc {
                backend: "CPU".into(),
                what: "buffer over host memory".into(),
                size,
            });
        }
        self.adopt_buffer(buf);
        Ok(BufferRef {
            ptr: buf,
            _ctx: PhantomData,
        })
    }
}

impl<'ctx> BufferRef<'ctx> {
    pub fn size(&self) -> usize {
        // SAFETY: live buffer (owned by the context 'ctx borrows).
        unsafe { sys::ggml_backend_buffer_get_size(self.ptr) }
    }

    /// Address of the first byte (host address for host buffers, device address otherwise).
    pub fn base_addr(&self) -> usize {
        // SAFETY: as above.
        unsafe { sys::ggml_backend_buffer_get_base(self.ptr) as usize }
    }

    /// Whether the host can read and write the memory directly.
    pub fn is_host(&self) -> bool {
        // SAFETY: as above.
        unsafe { sys::ggml_backend_buffer_is_host(self.ptr) }
    }

    /// Sets every byte to `value`.
    pub fn clear(&self, value: u8) {
        // SAFETY: as above.
        unsafe { sys::ggml_backend_buffer_clear(self.ptr, value) };
    }

    /// Bytes `t` takes in this buffer (its data plus the backend's padding, e.g. ggml-cuda pads
    /// the last row of quantised matrices to 512 columns).
    pub fn alloc_size(&self, t: Tensor<'_>) -> usize {
        // SAFETY: live buffer and tensor; a pure size query.
        unsafe { sys::ggml_backend_buffer_get_alloc_size(self.ptr, t.raw()) }
    }

    /// Places `t` (a tensor of the same context, not yet allocated) at byte `offset`; returns
    /// the offset just past it, aligned for the next tensor.
    pub fn place(&self, t: Tensor<'ctx>, offset: usize) -> Result<usize> {
        let need = offset + self.alloc_size(t);
        if need > self.size() {
            return Err(GgmlError::Tensor {
                name: t.name(),
                msg: format!(
                    "does not fit in its buffer ({need} bytes needed, {} available)",
                    self.size()
                ),
            });
        }
        // SAFETY: live buffer, unallocated tensor, and the range lies inside the buffer.
        let status = unsafe {
            sys::ggml_backend_tensor_alloc(
                self.ptr,
                t.raw(),
                (self.base_addr() + offset) as *mut std::ffi::c_void,
            )
        };
        if status != sys::GGML_STATUS_SUCCESS {
            return Err(GgmlError::Tensor {
                name: t.name(),
                msg: format!("could not be placed in its buffer (status {status})"),
            });
        }
        Ok(need.next_multiple_of(256))
    }
}

impl Backend {
    /// (free, total) bytes of the backend's device, if it reports them.
    pub fn memory(&self) -> Option<(usize, usize)> {
        // SAFETY: live backend; the device handle is static.
        unsafe {
            let dev = sys::ggml_backend_get_device(self.raw());
            if dev.is_null() {
                return None;
            }
            let (mut free, mut total) = (0usize, 0usize);
            sys::ggml_backend_dev_memory(dev, &mut free, &mut total);
            Some((free, total))
        }
    }

    /// Whether this is a CUDA backend.
    pub fn is_cuda(&self) -> bool {
        self.name().starts_with("CUDA")
    }
}

/// Page-locked host memory that device results come back through. A device-to-host copy into
/// pageable memory goes through the driver's bounce buffer: a decode step's 600 KB of logits
/// took ~140 us that way against 14 us straight into page-locked memory (traced on the H200,
/// issue 30), each step.
pub struct HostStage {
    _ctx: Context,
    addr: usize,
    size: usize,
}

impl HostStage {
    /// `size` bytes of `backend`'s host memory (page-locked for CUDA).
    pub fn new(backend: &Backend, size: usize) -> Result<Self> {
        let ctx = Context::new(1, 1)?;
        let (addr, size) = {
            let b = ctx.new_buffer(backend, Memory::Host, size)?;
            (b.base_addr(), b.size())
        };
        Ok(Self {
            _ctx: ctx,
            addr,
            size,
        })
    }

    pub fn addr(&self) -> usize {
        self.addr
    }

    pub fn size(&self) -> usize {
        self.size
    }
}

/// A ggml buffer type: a kind of memory with its own layout rules. ggml's buffer types are
/// static singletons, so a handle is valid for the whole process.
///
/// The ones this crate names besides a backend's default are the CPU device's *extra* buffer
/// types ([`Backend::extra_buffer_types`]): ggml-cpu's "repack" type re-lays quantised matrices
/// (Q4_0, Q4_K, IQ4_NL, MXFP4, ... where the CPU has the kernels) into interleaved blocks as they
/// are written, for faster matrix-vector and matrix-matrix products (llama.cpp's default).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct BufType(sys::ggml_backend_buffer_type_t);

// SAFETY: a buffer type is an immutable static singleton in ggml.
unsafe impl Send for BufType {}
// SAFETY: as above.
unsafe impl Sync for BufType {}

impl std::fmt::Debug for BufType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.name())
    }
}

impl BufType {
    pub(crate) fn from_raw(p: sys::ggml_backend_buffer_type_t) -> Self {
        Self(p)
    }

    pub(crate) fn raw(&self) -> sys::ggml_backend_buffer_type_t {
        self.0
    }

    /// The buffer type of CPU stand-in device `k` ([`Backend::cpu_standin`]): a copy of the CPU
    /// buffer type ([`BufType::copy_of`]).
    pub fn cpu_standin(k: usize) -> Self {
        // SAFETY: a static singleton.
        Self::copy_of(Self(unsafe { sys::ggml_backend_cpu_buffer_type() }), k)
    }

    /// Copy `k` of buffer type `base` (the same functions, device and context, so the same
    /// memory and the same name) at an address of its own, made once per (`base`, `k`) for the
    /// process. ggml compares buffer types by address: a scheduler given backends whose buffer
    /// types are distinct copies sees distinct devices (a CPU stand-in device, or a second
    /// logical device on one GPU), and every backend of `base`'s device still supports them
    /// (ggml-cuda's and ggml-cpu's `supports_buft` look at the functions and the device, not
    /// the address).
    ///
    /// This reads `struct ggml_backend_buffer_type` (`ggml-backend-impl.h` of the pinned ggml:
    /// eight function pointers, then the device and context pointers) as ten pointers; the copy
    /// is checked to answer as `base` does.
    pub fn copy_of(base: BufType, k: usize) -> Self {
        const WORDS: usize = 10;
        type Raw = [usize; WORDS];
        static COPIES: std::sync::Mutex<Vec<(usize, usize, usize)>> =
            std::sync::Mutex::new(Vec::new());
        let mut copies = COPIES.lock().unwrap_or_else(|e| e.into_inner());
        let key = (base.0 as usize, k);
        let addr = match copies.iter().find(|c| (c.0, c.1) == key) {
            Some(c) => c.2,
            None => {
                // SAFETY: `base` is a static buffer type of that layout (see above); the copy is
                // leaked, so it lives as long as the process.
                let raw: Raw = unsafe { *(base.0 as *const Raw) };
                let addr = Box::into_raw(Box::new(raw)) as usize;
                copies.push((key.0, key.1, addr));
                addr
            }
        };
        let t = Self(addr as sys::ggml_backend_buffer_type_t);
        // SAFETY: the copy holds `base`'s own functions; pure queries.
        unsafe {
            assert!(
                sys::ggml_backend_buft_is_host(t.0) == sys::ggml_backend_buft_is_host(base.0)
                    && sys::ggml_backend_buft_get_alignment(t.0)
                        == sys::ggml_backend_buft_get_alignment(base.0)
                    && sys::ggml_backend_buft_get_device(t.0)
                        == sys::ggml_backend_buft_get_device(base.0)
                    && t.name() == base.name(),
                "a copy of buffer type {} does not answer as it does: the layout of \
                 ggml_backend_buffer_type changed (see BufType::copy_of)",
                base.name()
            );
        }
        t
    }

    /// ggml's name for it (`CPU_REPACK`, `CPU`, ...).
    pub fn name(&self) -> String {
        // SAFETY: static buffer type; ggml returns a static C string.
        super::cstr(unsafe { sys::ggml_backend_buft_name(self.0) })
    }

    /// Whether the op that produced `node` can run with `w` (one of its sources, not yet
    /// allocated) in a buffer of this type, as the type's device judges it. This is llama.cpp's
    /// `weight_buft_supported` asked of a real graph node instead of a dummy one: `w` is given a
    /// zero-size buffer of this type for the question and none after it.
    pub fn supports(&self, w: Tensor<'_>, node: Tensor<'_>) -> bool {
        let t = w.raw();
        // SAFETY: live tensors and a static buffer type. A zero-size request returns ggml's
        // dummy buffer of this type (no memory, nothing of the type's own allocator runs); `w`
        // had no buffer (asserted) and has none again before the dummy is freed.
        unsafe {
            assert!((*t).buffer.is_null(), "{} is already allocated", w.name());
            let dev = sys::ggml_backend_buft_get_device(self.0);
            if dev.is_null() {
                return false;
            }
            let dummy = sys::ggml_backend_buft_alloc_buffer(self.0, 0);
            if dummy.is_null() {
                return false;
            }
            (*t).buffer = dummy;
            let ok = sys::ggml_backend_dev_supports_op(dev, node.raw());
            (*t).buffer = std::ptr::null_mut();
            sys::ggml_backend_buffer_free(dummy);
            ok
        }
    }

    /// Bytes `t` takes in a buffer of this type (its data plus the type's padding).
    pub fn alloc_size(&self, t: Tensor<'_>) -> usize {
        // SAFETY: static buffer type, live tensor; a pure size query.
        unsafe { sys::ggml_backend_buft_get_alloc_size(self.0, t.raw()) }
    }
}

impl Backend {
    /// The extra buffer types of this backend's device, in the order ggml prefers them (the
    /// order llama.cpp tries them in), for a CPU backend; empty for any other (and for a CPU
    /// build without them).
    pub fn extra_buffer_types(&self) -> Vec<BufType> {
        let mut out = Vec::new();
        // SAFETY: live backend; device and registry handles are static; the proc address, when
        // present, has the documented `ggml_backend_dev_get_extra_bufts_t` signature and returns
        // a NULL-terminated static array.
        unsafe {
            if !sys::ggml_backend_is_cpu(self.raw()) {
                return out;
            }
            let dev = sys::ggml_backend_get_device(self.raw());
            if dev.is_null() {
                return out;
            }
            let reg = sys::ggml_backend_dev_backend_reg(dev);
            let f = sys::ggml_backend_reg_get_proc_address(
                reg,
                c"ggml_backend_dev_get_extra_bufts".as_ptr(),
            );
            if f.is_null() {
                return out;
            }
            let f: sys::ggml_backend_dev_get_extra_bufts_t = std::mem::transmute(f);
            let Some(f) = f else { return out };
            let mut p = f(dev);
            while !p.is_null() && !(*p).is_null() {
                out.push(BufType(*p));
                p = p.add(1);
            }
        }
        out
    }
}

impl Context {
    /// Allocates one buffer of type `buft` holding `ts` (tensors of this context, not yet
    /// allocated), each placed as [`BufferRef::place`] places it. Returns its size.
    pub fn alloc_group(&self, buft: BufType, ts: &[Tensor<'_>]) -> Result<usize> {
        // `place` starts every tensor at a multiple of 256 (a multiple of any CPU alignment).
        let size: usize = ts
            .iter()
            .map(|&t| buft.alloc_size(t).next_multiple_of(256))
            .sum();
        let buf = self.new_buffer_of(buft, size)?;
        let mut off = 0;
        for &t in ts {
            off = buf.place(
                Tensor::from_raw(std::ptr::NonNull::new(t.raw()).expect("a tensor")),
                off,
            )?;
        }
        Ok(buf.size())
    }

    /// Allocates a `size`-byte buffer of type `buft`, owned by this context (tensors are put in
    /// it with [`BufferRef::place`]).
    pub fn new_buffer_of(&self, buft: BufType, size: usize) -> Result<BufferRef<'_>> {
        // SAFETY: static buffer type; null on failure. ggml rounds a 0-byte request up.
        let buf = unsafe { sys::ggml_backend_buft_alloc_buffer(buft.0, size.max(1)) };
        if buf.is_null() {
            return Err(GgmlError::Alloc {
                backend: buft.name(),
                what: "weights buffer".into(),
                size,
            });
        }
        self.adopt_buffer(buf);
        Ok(BufferRef {
            ptr: buf,
            _ctx: PhantomData,
        })
    }
}
