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
    fn cudaEventQuery(event: *mut c_void) -> c_int;
    fn cudaStreamWaitEvent(stream: Stream, event: *mut c_void, flags: u32) -> c_int;
    fn cudaMalloc(ptr: *mut *mut c_void, size: usize) -> c_int;
    fn cudaFree(ptr: *mut c_void) -> c_int;
    fn cudaMemsetAsync(ptr: *mut c_void, value: c_int, count: usize, stream: Stream) -> c_int;
    fn cudaMemcpyAsync(
        dst: *mut c_void,
        src: *const c_void,
        count: usize,
        kind: c_int,
        stream: Stream,
    ) -> c_int;
}

// Our kernels' launchers (kernels/*.cu), compiled and linked with the `cuda` feature.
extern "C" {
    fn pmoe_table_lookup(
        picks: *const c_void,
        n: c_int,
        n_expert: c_int,
        tab: *const c_void,
        on: *const c_void,
        ids: *mut c_void,
        mask: *mut c_void,
        base: *const c_void,
        flag: *mut c_void,
        stream: Stream,
    ) -> c_int;
}

/// Queues table form's lookup on `stream` (kernels/table_lookup.cu): each pick's slot id and
/// residency gathered from the table, and the hit flag written, in one kernel.
///
/// # Safety
/// `stream` must be a live CUDA stream of the device every address lies on; the addresses must
/// stay valid until the kernel has run, and nothing else may write `ids`, `mask` or `flag`
/// meanwhile.
pub unsafe fn table_lookup(stream: Stream, l: &crate::Lookup) -> Result<(), CudaError> {
    let (Ok(n), Ok(n_expert)) = (c_int::try_from(l.n), c_int::try_from(l.n_expert)) else {
        return check("pmoe_table_lookup", INVALID_VALUE);
    };
    // SAFETY: per the contract above.
    check("pmoe_table_lookup", unsafe {
        pmoe_table_lookup(
            l.picks as *const c_void,
            n,
            n_expert,
            l.tab as *const c_void,
            l.on as *const c_void,
            l.ids as *mut c_void,
            l.mask as *mut c_void,
            l.base as *const c_void,
            l.flag as *mut c_void,
            stream,
        )
    })
}

/// `cudaErrorInvalidValue`.
const INVALID_VALUE: c_int = 1;

/// `cudaMemcpyDefault`: direction inferred from the addresses (unified addressing).
const DEFAULT: c_int = 4;
/// `cudaErrorNotReady`: what `cudaEventQuery` returns while the event's work is pending.
const NOT_READY: c_int = 600;

/// Whether the work recorded in `event` (a `cudaEvent_t`) has run (`cudaEventQuery`): the host
/// can poll it with a deadline where `cudaEventSynchronize` would wait for ever.
///
/// # Safety
/// `event` must be a live CUDA event.
pub unsafe fn event_done(event: *mut c_void) -> Result<bool, CudaError> {
    // SAFETY: per the contract above.
    match unsafe { cudaEventQuery(event) } {
        NOT_READY => Ok(false),
        code => check("cudaEventQuery", code).map(|()| true),
    }
}

/// Reads `out.len()` bytes at device address `src` now, on a stream of its own (non-blocking:
/// it does not wait for the device's other streams, so it answers while they are stalled).
/// For diagnostics: a stalled gate's counter or flag.
///
/// # Safety
/// `[src, src + out.len())` must be live device memory of `device`.
pub unsafe fn read_now(device: i32, src: usize, out: &mut [u8]) -> Result<(), CudaError> {
    let s = CopyStream::new(device)?;
    // SAFETY: per the contract above; `out` is ours until the sync returns.
    unsafe { s.copy(out.as_mut_ptr() as usize, src, out.len()) }?;
    s.sync()
}
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

    /// Makes work queued on this stream from now on wait (on the device) for `event`'s last
    /// recording (`cudaStreamWaitEvent`).
    ///
    /// # Safety
    /// `event` must be a live CUDA event of this stream's device.
    pub unsafe fn wait_event(&self, event: *mut c_void) -> Result<(), CudaError> {
        // SAFETY: per the contract above; the stream is live.
        check("cudaStreamWaitEvent", unsafe {
            cudaStreamWaitEvent(self.stream, event, 0)
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

/// `CUresult (*)(CUstream, CUdeviceptr, cuuint64_t, unsigned int)`: the driver's
/// `cuStreamWaitValue64` and `cuStreamWriteValue64`.
type StreamValueFn = unsafe extern "C" fn(Stream, u64, u64, u32) -> c_int;

/// `CUresult (*)(CUstream, CUdeviceptr, cuuint32_t, unsigned int)`: the driver's
/// `cuStreamWaitValue32` and `cuStreamWriteValue32`.
type StreamValue32Fn = unsafe extern "C" fn(Stream, u64, u32, u32) -> c_int;

/// `CU_STREAM_WAIT_VALUE_GEQ`.
const WAIT_GEQ: u32 = 0;

/// A gate on the device: work queued behind [`Gate::close`] runs only once a stream has passed
/// [`Gate::open`] with a ticket at least as large. The host can thus queue compute before it
/// knows what the compute needs, and let it run, without waiting itself, once the copies that
/// feed it are queued. A 64-bit counter in device memory, written and waited for by the
/// driver's stream memory operations (`cuStreamWriteValue64`/`cuStreamWaitValue64`, looked up
/// in the driver the runtime has loaded: the PyPI toolkit has no `libcuda` to link against).
/// Tickets only grow, so a late wait never sees an earlier step's value.
pub struct Gate {
    flag: *mut c_void,
    /// Where closes wait; the compute stream waits on `closed` events recorded here.
    waits: CopyStream,
    /// Where opens are written, after the copies they follow (ordered by events).
    opens: CopyStream,
    wait_value: StreamValueFn,
    write_value: StreamValueFn,
    wait32: StreamValue32Fn,
    write32: StreamValue32Fn,
}

// SAFETY: stream handles and a device address may be used from any host thread.
unsafe impl Send for Gate {}

impl Gate {
    /// A gate on `device`, or an error when the driver lacks 64-bit stream memory operations.
    pub fn new(device: i32) -> Result<Self, CudaError> {
        let (wait_value, write_value, wait32, write32) = stream_value_fns()?;
        let waits = CopyStream::new(device)?;
        let opens = CopyStream::new(device)?;
        let mut flag = std::ptr::null_mut();
        // SAFETY: plain runtime calls on our own allocation and stream.
        check("cudaMalloc", unsafe { cudaMalloc(&mut flag, 8) })?;
        let gate = Self {
            flag,
            waits,
            opens,
            wait_value,
            write_value,
            wait32,
            write32,
        };
        // SAFETY: our 8-byte allocation, our live stream.
        check("cudaMemsetAsync", unsafe {
            cudaMemsetAsync(flag, 0, 8, gate.opens.stream)
        })?;
        // Probe both operations once: a driver or device without them fails here, not mid-step.
        gate.open(0)?;
        gate.opens.sync()?;
        // SAFETY: live stream, our flag.
        check("cuStreamWaitValue64", unsafe {
            (gate.wait_value)(gate.waits.stream, gate.flag as u64, 0, WAIT_GEQ)
        })?;
        gate.waits.sync()?;
        Ok(gate)
    }

    /// Queues a wait for ticket `ticket` on the gate's own stream and records `event` after it:
    /// a stream that then waits on `event` (`cudaStreamWaitEvent`) runs on only once the gate
    /// opened to `ticket`.
    ///
    /// # Safety
    /// `event` must be a live CUDA event of the gate's device.
    pub unsafe fn close(&self, ticket: u64, event: *mut c_void) -> Result<(), CudaError> {
        // SAFETY: live stream, our flag.
        check("cuStreamWaitValue64", unsafe {
            (self.wait_value)(self.waits.stream, self.flag as u64, ticket, WAIT_GEQ)
        })?;
        // SAFETY: per the contract above.
        unsafe { self.waits.record(event) }
    }

    /// Opens the gate to `ticket` once the work recorded in `after` (if any) has run.
    ///
    /// # Safety
    /// `after` must be null or a live CUDA event of the gate's device.
    pub unsafe fn open_after(&self, ticket: u64, after: *mut c_void) -> Result<(), CudaError> {
        if !after.is_null() {
            // SAFETY: per the contract above.
            unsafe { self.opens.wait_event(after) }?;
        }
        self.open(ticket)
    }

    /// Queues a wait, on the gate's own stream, until the 32-bit word at device address `addr`
    /// is at least `value` (`(int32_t)(*addr - value) >= 0`), and records `event` after it, as
    /// [`Gate::close`] does for the gate's counter. The word may be written by compute on the
    /// device (a graph node's output) or by [`Gate::open_word_after`].
    ///
    /// # Safety
    /// `addr` must be 4-aligned device memory of the gate's device that stays allocated until
    /// the wait passed; `event` a live CUDA event of that device.
    pub unsafe fn close_word(
        &self,
        addr: usize,
        value: u32,
        event: *mut c_void,
    ) -> Result<(), CudaError> {
        // SAFETY: per the contract above.
        check("cuStreamWaitValue32", unsafe {
            (self.wait32)(self.waits.stream, addr as u64, value, WAIT_GEQ)
        })?;
        // SAFETY: per the contract above.
        unsafe { self.waits.record(event) }
    }

    /// Writes `value` to the 32-bit word at `addr` once the work recorded in `after` (if any)
    /// has run (behind a memory fence, as [`Gate::open_after`]).
    ///
    /// # Safety
    /// As [`Gate::close_word`]; `after` null or a live CUDA event of the gate's device.
    pub unsafe fn open_word_after(
        &self,
        addr: usize,
        value: u32,
        after: *mut c_void,
    ) -> Result<(), CudaError> {
        if !after.is_null() {
            // SAFETY: per the contract above.
            unsafe { self.opens.wait_event(after) }?;
        }
        // SAFETY: per the contract above.
        check("cuStreamWriteValue32", unsafe {
            (self.write32)(self.opens.stream, addr as u64, value, 0)
        })
    }

    /// The device address of the gate's 64-bit counter (for [`read_now`]).
    pub fn counter_addr(&self) -> usize {
        self.flag as usize
    }

    fn open(&self, ticket: u64) -> Result<(), CudaError> {
        // Flags 0 (`CU_STREAM_WRITE_VALUE_DEFAULT`): the write follows a memory fence, so the
        // work before it on the stream is visible to whatever the gate releases.
        // SAFETY: live stream, our flag.
        check("cuStreamWriteValue64", unsafe {
            (self.write_value)(self.opens.stream, self.flag as u64, ticket, 0)
        })
    }
}

impl Drop for Gate {
    fn drop(&mut self) {
        // Whatever still waits must not wait forever on a freed flag.
        let _ = self.open(u64::MAX);
        let _ = self.opens.sync();
        let _ = self.waits.sync();
        // SAFETY: our allocation; nothing queued reads it any more.
        unsafe { cudaFree(self.flag) };
    }
}

/// The driver's 64-bit and 32-bit stream waits and writes, from the `libcuda` the runtime loaded.
fn stream_value_fns() -> Result<
    (
        StreamValueFn,
        StreamValueFn,
        StreamValue32Fn,
        StreamValue32Fn,
    ),
    CudaError,
> {
    let missing = |what: &str| CudaError {
        call: "dlsym",
        code: -1,
        message: format!("{what} not found in libcuda.so.1"),
    };
    // SAFETY: dlopen of the driver library (already loaded by the runtime: a reference count)
    // and dlsym of two functions whose C signatures `StreamValueFn` mirrors.
    unsafe {
        let lib = libc::dlopen(c"libcuda.so.1".as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL);
        if lib.is_null() {
            return Err(missing("the library itself"));
        }
        let sym = |names: &[&std::ffi::CStr]| {
            names
                .iter()
                .map(|n| libc::dlsym(lib, n.as_ptr()))
                .find(|p| !p.is_null())
        };
        let wait = sym(&[c"cuStreamWaitValue64_v2", c"cuStreamWaitValue64"])
            .ok_or_else(|| missing("cuStreamWaitValue64"))?;
        let write = sym(&[c"cuStreamWriteValue64_v2", c"cuStreamWriteValue64"])
            .ok_or_else(|| missing("cuStreamWriteValue64"))?;
        let wait32 = sym(&[c"cuStreamWaitValue32_v2", c"cuStreamWaitValue32"])
            .ok_or_else(|| missing("cuStreamWaitValue32"))?;
        let write32 = sym(&[c"cuStreamWriteValue32_v2", c"cuStreamWriteValue32"])
            .ok_or_else(|| missing("cuStreamWriteValue32"))?;
        Ok((
            std::mem::transmute::<*mut c_void, StreamValueFn>(wait),
            std::mem::transmute::<*mut c_void, StreamValueFn>(write),
            std::mem::transmute::<*mut c_void, StreamValue32Fn>(wait32),
            std::mem::transmute::<*mut c_void, StreamValue32Fn>(write32),
        ))
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
