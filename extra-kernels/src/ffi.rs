//! The few CUDA runtime calls of the expert cache's copy streams (and, when there are kernels of
//! our own, their launchers' declarations).
use std::ffi::c_void;
use std::os::raw::c_int;

/// `cudaStream_t`.
pub type Stream = *mut c_void;

extern "C" {
    fn cudaGetErrorString(err: c_int) -> *const std::os::raw::c_char;
    fn cudaSetDevice(device: c_int) -> c_int;
    fn cudaStreamCreateWithFlags(stream: *mut Stream, flags: u32) -> c_int;
    fn cudaStreamDestroy(stream: Stream) -> c_int;
    fn cudaStreamSynchronize(stream: Stream) -> c_int;
    fn cudaEventRecord(event: *mut c_void, stream: Stream) -> c_int;
    fn cudaMemcpyAsync(
        dst: *mut c_void,
        src: *const c_void,
        count: usize,
        kind: c_int,
        stream: Stream,
    ) -> c_int;
}

/// `cudaMemcpyDefault`: direction inferred from the addresses (unified addressing).
const DEFAULT: c_int = 4;
/// `cudaStreamNonBlocking`.
const NON_BLOCKING: u32 = 1;

/// A CUDA stream of our own for copies (the expert cache's copy engine), separate from ggml's
/// compute stream so copies overlap compute.
pub struct CopyStream {
    stream: Stream,
}

// SAFETY: a CUDA stream handle may be used from any host thread.
unsafe impl Send for CopyStream {}

impl CopyStream {
    pub fn new(device: i32) -> Result<Self, CudaError> {
        // SAFETY: plain runtime calls; the handle is written by CUDA.
        check("cudaSetDevice", unsafe { cudaSetDevice(device) })?;
        let mut stream = std::ptr::null_mut();
        check("cudaStreamCreateWithFlags", unsafe {
            cudaStreamCreateWithFlags(&mut stream, NON_BLOCKING)
        })?;
        Ok(Self { stream })
    }

    /// Queues a copy of `n` bytes from address `src` to `dst` (device or page-locked host
    /// memory, any direction).
    ///
    /// # Safety
    /// Both ranges must stay valid, and `dst` unread and unwritten by others, until
    /// [`CopyStream::sync`] returns.
    pub unsafe fn copy(&self, dst: usize, src: usize, n: usize) -> Result<(), CudaError> {
        // SAFETY: per the contract above.
        check("cudaMemcpyAsync", unsafe {
            cudaMemcpyAsync(
                dst as *mut c_void,
                src as *const c_void,
                n,
                DEFAULT,
                self.stream,
            )
        })
    }

    /// Records `event` (a `cudaEvent_t`) after every copy queued so far: a stream that waits on
    /// it (`cudaStreamWaitEvent`) runs on only once they have landed.
    ///
    /// # Safety
    /// `event` must be a live CUDA event of this stream's device.
    pub unsafe fn record(&self, event: *mut c_void) -> Result<(), CudaError> {
        // SAFETY: per the contract above; the stream is live.
        check("cudaEventRecord", unsafe {
            cudaEventRecord(event, self.stream)
        })
    }

    /// Waits for every queued copy.
    pub fn sync(&self) -> Result<(), CudaError> {
        // SAFETY: live stream.
        check("cudaStreamSynchronize", unsafe {
            cudaStreamSynchronize(self.stream)
        })
    }
}

impl Drop for CopyStream {
    fn drop(&mut self) {
        // SAFETY: we own the stream; pending copies finish first (CUDA semantics).
        unsafe { cudaStreamDestroy(self.stream) };
    }
}

/// A CUDA runtime error with the call that failed.
#[derive(Debug)]
pub struct CudaError {
    pub call: &'static str,
    pub code: i32,
    pub message: String,
}

impl std::fmt::Display for CudaError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} failed: CUDA error {} ({})",
            self.call, self.code, self.message
        )
    }
}

impl std::error::Error for CudaError {}

fn check(call: &'static str, code: c_int) -> Result<(), CudaError> {
    if code == 0 {
        return Ok(());
    }
    // SAFETY: cudaGetErrorString returns a static string for any code.
    let message = unsafe { std::ffi::CStr::from_ptr(cudaGetErrorString(code)) }
        .to_string_lossy()
        .into_owned();
    Err(CudaError {
        call,
        code,
        message,
    })
}
