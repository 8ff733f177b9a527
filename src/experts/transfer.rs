//! The copy engine behind the expert cache: copies between host and device memory by address.
//! With CUDA, copies queue on a stream of our own (page-locked host memory, so they run at PCIe
//! speed and overlap ggml's compute); with the CPU standing in for the GPU (tests, CI), "device"
//! memory is host memory and a copy is a `memcpy`.
//!
//! Invariant: a range handed to [`Transfer::copy`] is not read or written by anyone else until
//! [`Transfer::wait`] returns.
use crate::ggml::{Backend, GgmlError};

pub trait Transfer {
    /// Queues a copy of `n` bytes from `src` to `dst` (addresses from `Tensor::data_addr` or
    /// `BufferRef::base_addr`, plus offsets).
    fn copy(&mut self, dst: usize, src: usize, n: usize) -> Result<(), GgmlError>;
    /// Waits until every queued copy is done.
    fn wait(&mut self) -> Result<(), GgmlError>;
}

/// The copy engine for `backend`.
pub fn for_backend(backend: &Backend) -> Result<Box<dyn Transfer>, GgmlError> {
    if backend.is_cuda() {
        cuda(backend)
    } else {
        Ok(Box::new(HostCopy))
    }
}

/// Plain memcpy between host addresses (the CPU backend's buffers).
struct HostCopy;

impl Transfer for HostCopy {
    fn copy(&mut self, dst: usize, src: usize, n: usize) -> Result<(), GgmlError> {
        // SAFETY: both are host addresses inside live ggml CPU buffers (the caller's contract),
        // the ranges belong to different tensors (slot vs store, or scratch vs graph) so they
        // do not overlap.
        unsafe { std::ptr::copy_nonoverlapping(src as *const u8, dst as *mut u8, n) };
        Ok(())
    }
    fn wait(&mut self) -> Result<(), GgmlError> {
        Ok(())
    }
}

#[cfg(feature = "cuda")]
fn cuda(backend: &Backend) -> Result<Box<dyn Transfer>, GgmlError> {
    let dev: i32 = backend
        .name()
        .trim_start_matches("CUDA")
        .parse()
        .unwrap_or(0);
    let s = extra_kernels::CopyStream::new(dev).map_err(cuda_err)?;
    Ok(Box::new(CudaCopy(s)))
}

#[cfg(not(feature = "cuda"))]
fn cuda(_backend: &Backend) -> Result<Box<dyn Transfer>, GgmlError> {
    Err(GgmlError::BuiltWithoutCuda)
}

#[cfg(feature = "cuda")]
fn cuda_err(e: extra_kernels::CudaError) -> GgmlError {
    GgmlError::Compute {
        backend: format!("copy stream: {e}"),
        status: e.code,
    }
}

#[cfg(feature = "cuda")]
struct CudaCopy(extra_kernels::CopyStream);

#[cfg(feature = "cuda")]
impl Transfer for CudaCopy {
    fn copy(&mut self, dst: usize, src: usize, n: usize) -> Result<(), GgmlError> {
        // SAFETY: the addresses come from live ggml buffers (device or page-locked host), and the
        // caller keeps them untouched until wait() (the trait's invariant).
        unsafe { self.0.copy(dst, src, n) }.map_err(cuda_err)
    }
    fn wait(&mut self) -> Result<(), GgmlError> {
        self.0.sync().map_err(cuda_err)
    }
}
