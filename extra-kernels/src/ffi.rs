//! Raw launcher declarations plus the few CUDA runtime calls needed to test a kernel from host
//! data. The engine passes its own device pointers and stream; `*_host` helpers are for tests.
use std::ffi::c_void;
use std::os::raw::c_int;

/// `cudaStream_t`.
pub type Stream = *mut c_void;

extern "C" {
    /// See `kernels/remap_expert_ids.cuh`. Returns a `cudaError_t`.
    pub fn pmoe_remap_expert_ids(
        ids: *const i32,
        n: i32,
        slot_of_expert: *const i32,
        n_expert: i32,
        slots_out: *mut i32,
        n_miss: *mut i32,
        stream: Stream,
    ) -> c_int;

    fn cudaMalloc(ptr: *mut *mut c_void, size: usize) -> c_int;
    fn cudaFree(ptr: *mut c_void) -> c_int;
    fn cudaMemcpy(dst: *mut c_void, src: *const c_void, count: usize, kind: c_int) -> c_int;
    fn cudaDeviceSynchronize() -> c_int;
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

const H2D: c_int = 1;
const D2H: c_int = 2;

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

/// Device memory holding a copy of a host slice; freed on drop.
struct DeviceVec {
    ptr: *mut c_void,
    bytes: usize,
}

impl DeviceVec {
    fn from_host(data: &[i32]) -> Result<Self, CudaError> {
        let bytes = std::mem::size_of_val(data).max(4);
        let mut ptr = std::ptr::null_mut();
        // SAFETY: plain allocation of `bytes` bytes.
        check("cudaMalloc", unsafe { cudaMalloc(&mut ptr, bytes) })?;
        let v = Self { ptr, bytes };
        // SAFETY: ptr has `bytes` >= size_of_val(data) bytes.
        check("cudaMemcpy H2D", unsafe {
            cudaMemcpy(ptr, data.as_ptr().cast(), std::mem::size_of_val(data), H2D)
        })?;
        Ok(v)
    }

    fn to_host(&self, n: usize) -> Result<Vec<i32>, CudaError> {
        assert!(n * 4 <= self.bytes);
        let mut out = vec![0i32; n];
        // SAFETY: out has n*4 bytes, the device buffer at least as many.
        check("cudaMemcpy D2H", unsafe {
            cudaMemcpy(out.as_mut_ptr().cast(), self.ptr, n * 4, D2H)
        })?;
        Ok(out)
    }
}

impl Drop for DeviceVec {
    fn drop(&mut self) {
        // SAFETY: we own the allocation.
        unsafe { cudaFree(self.ptr) };
    }
}

/// Runs `pmoe_remap_expert_ids` on the default stream over host data: returns the slot per id
/// and the miss count.
pub fn remap_expert_ids_host(
    ids: &[i32],
    slot_of_expert: &[i32],
) -> Result<(Vec<i32>, i32), CudaError> {
    let d_ids = DeviceVec::from_host(ids)?;
    let d_table = DeviceVec::from_host(slot_of_expert)?;
    let d_out = DeviceVec::from_host(&vec![0; ids.len()])?;
    let d_miss = DeviceVec::from_host(&[0])?;
    // SAFETY: all pointers are device allocations of the sizes passed; null = default stream.
    let code = unsafe {
        pmoe_remap_expert_ids(
            d_ids.ptr.cast(),
            ids.len() as i32,
            d_table.ptr.cast(),
            slot_of_expert.len() as i32,
            d_out.ptr.cast(),
            d_miss.ptr.cast(),
            std::ptr::null_mut(),
        )
    };
    check("pmoe_remap_expert_ids", code)?;
    // SAFETY: plain synchronisation.
    check("cudaDeviceSynchronize", unsafe { cudaDeviceSynchronize() })?;
    Ok((d_out.to_host(ids.len())?, d_miss.to_host(1)?[0]))
}
