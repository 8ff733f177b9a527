//! The copy engine behind the expert cache: copies between host and device memory by address.
//! With CUDA, copies queue on a stream of our own (page-locked host memory, so they run at PCIe
//! speed and overlap ggml's compute), and the small reads of each layer's routing on a second
//! one, so that a read never waits behind expert copies; with the CPU standing in for the GPU
//! (tests, CI), "device" memory is host memory and a copy is a `memcpy`.
//!
//! Invariants: a range handed to [`Transfer::copy`] is not read or written by anyone else until
//! [`Transfer::wait`] returns, or, on the device, until compute work queued after
//! [`Transfer::fence`] runs. A range handed to [`Transfer::read`] likewise until
//! [`Transfer::wait_reads`] returns.
#[cfg(feature = "cuda-api")]
use crate::ggml::Event;
use crate::ggml::{Backend, GgmlError};
use std::rc::Rc;

pub trait Transfer {
    /// Queues a copy of `n` bytes from `src` to `dst` (addresses from `Tensor::data_addr` or
    /// `BufferRef::base_addr`, plus offsets).
    fn copy(&mut self, dst: usize, src: usize, n: usize) -> Result<(), GgmlError>;
    /// Waits until every queued copy is done.
    fn wait(&mut self) -> Result<(), GgmlError>;
    /// Queues a small device-to-host read, apart from the copies.
    fn read(&mut self, dst: usize, src: usize, n: usize) -> Result<(), GgmlError>;
    /// Waits until every queued read is done (not the copies).
    fn wait_reads(&mut self) -> Result<(), GgmlError>;
    /// Makes the compute backend wait, on the device, for every copy queued so far: work queued
    /// on the compute stream after this call runs once they have landed. The host does not wait
    /// (where the device has no events, it does).
    fn fence(&mut self) -> Result<(), GgmlError>;
}

/// The copy engine for `backend`.
pub fn for_backend(backend: &Rc<Backend>) -> Result<Box<dyn Transfer>, GgmlError> {
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
    fn read(&mut self, dst: usize, src: usize, n: usize) -> Result<(), GgmlError> {
        self.copy(dst, src, n)
    }
    fn wait_reads(&mut self) -> Result<(), GgmlError> {
        Ok(())
    }
    fn fence(&mut self) -> Result<(), GgmlError> {
        Ok(())
    }
}

#[cfg(feature = "cuda-api")]
fn cuda(backend: &Rc<Backend>) -> Result<Box<dyn Transfer>, GgmlError> {
    let dev: i32 = backend
        .name()
        .trim_start_matches("CUDA")
        .parse()
        .unwrap_or(0);
    Ok(Box::new(CudaCopy {
        copies: extra_kernels::CopyStream::new(dev).map_err(cuda_err)?,
        reads: extra_kernels::CopyStream::new(dev).map_err(cuda_err)?,
        landed: Event::new(backend),
        backend: backend.clone(),
        unfenced: false,
    }))
}

#[cfg(not(feature = "cuda-api"))]
fn cuda(_backend: &Rc<Backend>) -> Result<Box<dyn Transfer>, GgmlError> {
    Err(GgmlError::BuiltWithoutCuda)
}

#[cfg(feature = "cuda-api")]
fn cuda_err(e: extra_kernels::CudaError) -> GgmlError {
    GgmlError::Compute {
        backend: format!("copy stream: {e}"),
        status: e.code,
    }
}

#[cfg(feature = "cuda-api")]
struct CudaCopy {
    copies: extra_kernels::CopyStream,
    reads: extra_kernels::CopyStream,
    /// Recorded on `copies` by `fence`, waited for by the compute stream.
    landed: Option<Event>,
    backend: Rc<Backend>,
    /// Copies queued since the last fence.
    unfenced: bool,
}

#[cfg(feature = "cuda-api")]
impl Transfer for CudaCopy {
    fn copy(&mut self, dst: usize, src: usize, n: usize) -> Result<(), GgmlError> {
        self.unfenced = true;
        // SAFETY: the addresses come from live ggml buffers (device or page-locked host), and the
        // caller keeps them untouched until wait() or the fence (the trait's invariant).
        unsafe { self.copies.copy(dst, src, n) }.map_err(cuda_err)
    }
    fn wait(&mut self) -> Result<(), GgmlError> {
        self.unfenced = false;
        self.copies.sync().map_err(cuda_err)
    }
    fn read(&mut self, dst: usize, src: usize, n: usize) -> Result<(), GgmlError> {
        // SAFETY: as `copy`, until wait_reads().
        unsafe { self.reads.copy(dst, src, n) }.map_err(cuda_err)
    }
    fn wait_reads(&mut self) -> Result<(), GgmlError> {
        self.reads.sync().map_err(cuda_err)
    }
    fn fence(&mut self) -> Result<(), GgmlError> {
        if !self.unfenced {
            return Ok(());
        }
        let Some(ev) = &self.landed else {
            return self.wait();
        };
        // SAFETY: a live CUDA event of the copy stream's device (both from `backend`).
        unsafe { self.copies.record(ev.cuda_event()) }.map_err(cuda_err)?;
        ev.wait_on(&self.backend);
        self.unfenced = false;
        Ok(())
    }
}
