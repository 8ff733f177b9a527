//! Backends (CPU, CUDA), the devices ggml registered, and the multi-backend scheduler.
//!
//! Without the `cuda` feature the CUDA entry points exist and return
//! [`GgmlError::BuiltWithoutCuda`], so callers build the same way on every machine.
use super::{cstr, GgmlError, Graph, Result, Tensor};
use ggml_sys as sys;
use std::ffi::CString;
use std::ptr::NonNull;
use std::rc::Rc;

/// What kind of device ggml says a device is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceKind {
    Cpu,
    Gpu,
    IntegratedGpu,
    Accel,
    Other,
}

/// A device registered with ggml (static registry of the linked backends).
#[derive(Debug, Clone)]
pub struct Device {
    pub index: usize,
    pub name: String,
    pub description: String,
    pub kind: DeviceKind,
    pub memory_free: usize,
    pub memory_total: usize,
}

impl Device {
    /// Every device of every backend compiled into this binary.
    pub fn all() -> Vec<Device> {
        // SAFETY: registry queries; device handles are static for the program's life.
        let n = unsafe { sys::ggml_backend_dev_count() };
        (0..n)
            .map(|i| {
                // SAFETY: i < count.
                let dev = unsafe { sys::ggml_backend_dev_get(i) };
                let (mut free, mut total) = (0usize, 0usize);
                // SAFETY: dev is a valid registered device.
                let (name, description, ty) = unsafe {
                    sys::ggml_backend_dev_memory(dev, &mut free, &mut total);
                    (
                        cstr(sys::ggml_backend_dev_name(dev)),
                        cstr(sys::ggml_backend_dev_description(dev)),
                        sys::ggml_backend_dev_type(dev),
                    )
                };
                let kind = match ty {
                    sys::GGML_BACKEND_DEVICE_TYPE_CPU => DeviceKind::Cpu,
                    sys::GGML_BACKEND_DEVICE_TYPE_GPU => DeviceKind::Gpu,
                    sys::GGML_BACKEND_DEVICE_TYPE_IGPU => DeviceKind::IntegratedGpu,
                    sys::GGML_BACKEND_DEVICE_TYPE_ACCEL => DeviceKind::Accel,
                    _ => DeviceKind::Other,
                };
                Device {
                    index: i,
                    name,
                    description,
                    kind,
                    memory_free: free,
                    memory_total: total,
                }
            })
            .collect()
    }
}

/// ggml-cuda settings PocketMoE chooses for its own process, applied by [`configure_cuda`];
/// the variables it set (and not the user) are listed here, so that a child process running
/// the llama.cpp baseline can drop them (`pocketmoe bench`).
static CUDA_ENV_SET: std::sync::OnceLock<Vec<&'static str>> = std::sync::OnceLock::new();

/// Chooses ggml-cuda's process-wide switches before its first kernel launch (they are read
/// once). By default ggml's own choices stand: CUDA-graph replay and programmatic dependent
/// launch (PDL) both on, as in llama.cpp. `POCKETMOE_CUDA_GRAPHS=0` switches replay off
/// (`GGML_CUDA_DISABLE_GRAPHS=1`), e.g. to compare a replayed run with a direct one
/// (`scripts/device-replay-check.sh`). Variables the user set are left alone.
///
/// PDL lets a kernel start before its predecessor ends; each kernel waits for its inputs
/// inside (`cudaGridDependencySynchronize`). Replay with PDL is exact on every built
/// architecture once the graph has libllama's node order (Q, V, K, then the cache stores: see
/// `attend_kv`); with K computed before Q, replay read stale data (first seen at the first
/// residual add), and sessions 3-4 ran with PDL off, at about 9% of decode speed.
pub fn configure_cuda() {
    CUDA_ENV_SET.get_or_init(|| {
        let graphs_off = std::env::var("POCKETMOE_CUDA_GRAPHS").is_ok_and(|v| v == "0");
        let var = "GGML_CUDA_DISABLE_GRAPHS";
        if !graphs_off || std::env::var_os(var).is_some() {
            return Vec::new();
        }
        std::env::set_var(var, "1");
        vec![var]
    });
}

/// Turns ggml-cuda's CUDA graphs off for the rest of the process, for a layer split over CUDA
/// devices (`engine::split`): on the H200 with two logical devices on one GPU, a split's decode
/// diverged at the first step ggml-cuda replayed as a CUDA graph (the third, after its warm-up)
/// and was bit-identical to one device with graphs off (2026-12-04, tests/multi_device.rs). Not
/// yet tried on two real GPUs, where llama.cpp's own `-sm layer` keeps them. ggml reads the
/// switch once, at the first graph compute of the process: returns false when that may have
/// happened already (a CUDA backend was made earlier in the process), so the caller can say so.
pub fn disable_cuda_graphs_for_split() -> bool {
    let var = "GGML_CUDA_DISABLE_GRAPHS";
    if std::env::var_os(var).is_some() {
        return true;
    }
    std::env::set_var(var, "1");
    !COMPUTED.load(std::sync::atomic::Ordering::Relaxed)
}

/// Whether this process has computed a graph (ggml-cuda reads its CUDA-graph switch then).
static COMPUTED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

fn computing() {
    COMPUTED.store(true, std::sync::atomic::Ordering::Relaxed);
}

/// The level of the last ggml message that was not a continuation (for `GGML_LOG_LEVEL_CONT`).
static LOG_LEVEL: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

unsafe extern "C" fn filtered_log(
    level: sys::ggml_log_level,
    text: *const std::ffi::c_char,
    _: *mut std::ffi::c_void,
) {
    use std::sync::atomic::Ordering;
    let level = if level == sys::GGML_LOG_LEVEL_CONT {
        LOG_LEVEL.load(Ordering::Relaxed)
    } else {
        LOG_LEVEL.store(level, Ordering::Relaxed);
        level
    };
    static VERBOSE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let verbose = *VERBOSE.get_or_init(|| std::env::var_os("POCKETMOE_GGML_LOG").is_some());
    if (level >= sys::GGML_LOG_LEVEL_INFO || verbose) && !text.is_null() {
        // SAFETY: ggml passes a NUL-terminated message.
        let msg = unsafe { std::ffi::CStr::from_ptr(text) };
        eprint!("{}", msg.to_string_lossy());
    }
}

/// Routes ggml's log through a filter that drops its debug messages (ggml-cuda logs one per
/// CUDA-graph replay); `POCKETMOE_GGML_LOG=1` keeps them.
pub fn filter_ggml_log() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    // SAFETY: installs a plain function with no user data.
    ONCE.call_once(|| unsafe { sys::ggml_log_set(Some(filtered_log), std::ptr::null_mut()) });
}

/// The ggml-cuda variables [`configure_cuda`] set for this process (not set by the user).
pub fn cuda_env_set_by_us() -> &'static [&'static str] {
    CUDA_ENV_SET.get().map_or(&[], Vec::as_slice)
}

/// A persistent pool of ggml-cpu worker threads, as llama.cpp attaches one to its contexts:
/// without it ggml starts and joins `n - 1` threads at every CPU graph compute (with OpenMP off,
/// as our build has it). Freed on drop; whoever it is attached to must be freed first (declare
/// it after that owner's pointer, or free that owner in its own `Drop`).
pub struct ThreadPool(NonNull<sys::ggml_threadpool>);

impl ThreadPool {
    /// `n` threads; with `poll`, idle threads spin a while (ggml's default level) for the next
    /// graph before they sleep, else they sleep at once.
    pub fn new(n: usize, poll: bool) -> Result<Self> {
        // SAFETY: plain constructors; null on failure.
        let ptr = unsafe {
            let mut params = sys::ggml_threadpool_params_default(n as i32);
            if !poll {
                params.poll = 0;
            }
            sys::ggml_threadpool_new(&mut params)
        };
        NonNull::new(ptr)
            .map(Self)
            .ok_or_else(|| GgmlError::BackendInit(format!("CPU thread pool of {n} threads")))
    }

    pub fn raw(&self) -> *mut sys::ggml_threadpool {
        self.0.as_ptr()
    }
}

impl Drop for ThreadPool {
    fn drop(&mut self) {
        // SAFETY: we own the pool; its users were freed before it (see the type's doc).
        unsafe { sys::ggml_threadpool_free(self.0.as_ptr()) };
    }
}

/// An initialised ggml backend (a stream of work on one device).
pub struct Backend {
    ptr: NonNull<sys::ggml_backend>,
    /// The persistent worker threads of the CPU backend (or of a meta backend's CPU devices),
    /// dropped after `Drop` frees the backend.
    threadpool: Vec<ThreadPool>,
    /// The buffer type this backend's memory is allocated from, where it is not the backend's
    /// default: a CPU stand-in device's own copy of the CPU buffer type
    /// ([`Backend::cpu_standin`]).
    buft: Option<super::BufType>,
}

impl Backend {
    /// The CPU backend with `n_threads` threads (0 = all cores).
    pub fn cpu(n_threads: usize) -> Result<Self> {
        Self::cpu_polling(n_threads, true)
    }

    /// [`Backend::cpu`]; with `poll`, its idle threads spin a while for the next graph before
    /// they sleep (fastest for back-to-back graphs; off where other threads need the cores
    /// meanwhile, e.g. the offload path's CPU experts).
    pub fn cpu_polling(n_threads: usize, poll: bool) -> Result<Self> {
        filter_ggml_log();
        // SAFETY: plain constructor; null on failure.
        let ptr = unsafe { sys::ggml_backend_cpu_init() };
        let mut b = Self::from_raw(ptr, "CPU")?;
        let cpu = b.raw();
        // SAFETY: a CPU backend, which `b` frees before its pools.
        unsafe { b.give_cpu_threads(cpu, n_threads, poll) };
        Ok(b)
    }

    /// The CUDA backend on GPU `device`.
    ///
    /// Applies [`configure_cuda`] first (process-wide ggml-cuda switches; `pocketmoe bench`
    /// runs the llama.cpp baseline in a child process without the ones it set).
    #[cfg(feature = "cuda-api")]
    pub fn cuda(device: usize) -> Result<Self> {
        configure_cuda();
        filter_ggml_log();
        // SAFETY: plain query.
        let n = unsafe { sys::ggml_backend_cuda_get_device_count() } as usize;
        if device >= n {
            return Err(GgmlError::NoSuchDevice(
                format!("CUDA{device}"),
                format!("{n} CUDA device(s)"),
            ));
        }
        // SAFETY: device < count; null on failure.
        let ptr = unsafe { sys::ggml_backend_cuda_init(device as i32) };
        Self::from_raw(ptr, &format!("CUDA{device}"))
    }

    /// A second (third, ...) logical device `k` on CUDA device `device`: a CUDA backend of its
    /// own (its own stream) whose memory comes from its own copy of the device's buffer type
    /// ([`super::BufType::copy_of`]), so that ggml's scheduler treats it as another device.
    /// For testing a layer split with CUDA on one GPU (issue 26: "two logical devices on one
    /// H200"); the memory is the same GPU's.
    pub fn cuda_logical(device: usize, k: usize) -> Result<Self> {
        let mut b = Self::cuda(device)?;
        let base = b.buffer_type();
        b.buft = Some(super::BufType::copy_of(base, k));
        Ok(b)
    }

    /// How many CUDA devices this build sees (0 without CUDA).
    #[cfg(feature = "cuda-api")]
    pub fn cuda_device_count() -> usize {
        configure_cuda();
        filter_ggml_log();
        // SAFETY: plain query.
        unsafe { sys::ggml_backend_cuda_get_device_count() }.max(0) as usize
    }

    /// How many CUDA devices this build sees (0 without CUDA).
    #[cfg(not(feature = "cuda-api"))]
    pub fn cuda_device_count() -> usize {
        0
    }

    /// The CUDA backend on GPU `device` (this build has no CUDA).
    #[cfg(not(feature = "cuda-api"))]
    pub fn cuda(_device: usize) -> Result<Self> {
        Err(GgmlError::BuiltWithoutCuda)
    }

    /// A backend by ggml device name (`CPU`, `CUDA0`, ...).
    pub fn by_name(name: &str) -> Result<Self> {
        let c = CString::new(name)
            .map_err(|_| GgmlError::NoSuchDevice(name.into(), "NUL in name".into()))?;
        // SAFETY: registry lookup with a valid C string; null if absent.
        let ptr = unsafe { sys::ggml_backend_init_by_name(c.as_ptr(), std::ptr::null()) };
        let threadpool = Vec::new();
        NonNull::new(ptr)
            .map(|ptr| Self {
                ptr,
                threadpool,
                buft: None,
            })
            .ok_or_else(|| {
                let names: Vec<String> = Device::all().into_iter().map(|d| d.name).collect();
                GgmlError::NoSuchDevice(name.into(), names.join(", "))
            })
    }

    pub(crate) fn raw(&self) -> *mut sys::ggml_backend {
        self.ptr.as_ptr()
    }

    /// A backend ggml initialised (`what` names it in the error where `ptr` is null).
    pub(crate) fn from_raw(ptr: *mut sys::ggml_backend, what: &str) -> Result<Self> {
        Ok(Self {
            ptr: NonNull::new(ptr).ok_or_else(|| GgmlError::BackendInit(what.into()))?,
            threadpool: Vec::new(),
            buft: None,
        })
    }

    /// Gives CPU backend `cpu` (this backend, or one of a meta backend's devices) `n_threads`
    /// threads (0 = all cores) and a persistent pool kept until this backend is freed, as
    /// llama.cpp attaches one: without it ggml starts and joins the threads at every graph
    /// compute (a fixed cost per decoded token, paid even for a GPU model's CPU-side embedding
    /// lookup). With `poll` the pool's threads poll briefly for the next graph before they
    /// sleep.
    ///
    /// # Safety
    /// `cpu` is a live CPU backend that this backend frees (itself, or a meta backend's device).
    pub(crate) unsafe fn give_cpu_threads(
        &mut self,
        cpu: sys::ggml_backend_t,
        n_threads: usize,
        poll: bool,
    ) {
        let n = if n_threads == 0 {
            std::thread::available_parallelism().map_or(1, |n| n.get())
        } else {
            n_threads
        };
        // SAFETY: the caller's contract; the pool is dropped after the backend (field order).
        unsafe { sys::ggml_backend_cpu_set_n_threads(cpu, n as i32) };
        if let Ok(tp) = ThreadPool::new(n, poll) {
            unsafe { sys::ggml_backend_cpu_set_threadpool(cpu, tp.raw()) };
            self.threadpool.push(tp);
        }
    }

    /// A CPU backend standing in for device `k` of a multi-device run (tests of the layer split
    /// on a machine without GPUs): a CPU backend like [`Backend::cpu_polling`] whose memory
    /// comes from its own buffer type, [`super::BufType::cpu_standin`]`(k)`. ggml's scheduler
    /// tells backends apart by buffer type (it moves a node to an earlier backend of the same
    /// buffer type), so stand-ins sharing the CPU's one would all collapse onto the first.
    pub fn cpu_standin(k: usize, n_threads: usize, poll: bool) -> Result<Self> {
        let mut b = Self::cpu_polling(n_threads, poll)?;
        b.buft = Some(super::BufType::cpu_standin(k));
        Ok(b)
    }

    /// The buffer type this backend's tensors are allocated from (its default, or a stand-in's
    /// own).
    pub fn buffer_type(&self) -> super::BufType {
        self.buft.unwrap_or_else(|| {
            // SAFETY: live backend; the default buffer type is a static singleton.
            super::BufType::from_raw(unsafe {
                sys::ggml_backend_get_default_buffer_type(self.raw())
            })
        })
    }

    pub fn name(&self) -> String {
        // SAFETY: live backend.
        cstr(unsafe { sys::ggml_backend_name(self.raw()) })
    }

    /// ggml-cuda's compute stream of this CUDA backend (`cudaStream_t`), for a kernel of our own
    /// queued between the graph pieces it computes. ggml has no accessor: read from the pinned
    /// ggml's `struct ggml_backend` (ggml-backend-impl.h) and `ggml_backend_cuda_context`
    /// (ggml-cuda/common.cuh), each checked against what the library itself says (the backend's
    /// device, and the context's name, whose characters `ggml_backend_name` returns). None where
    /// a check fails (another layout), on another backend, or before ggml-cuda made the stream
    /// (its first compute).
    #[cfg(feature = "cuda-api")]
    pub fn cuda_stream(&self) -> Option<*mut std::ffi::c_void> {
        use std::ffi::c_void;
        /// `struct ggml_backend`: the guid, 16 interface functions, the device, the context.
        #[repr(C)]
        struct RawBackend {
            guid: *mut c_void,
            iface: [*const c_void; 16],
            device: *mut c_void,
            context: *mut c_void,
        }
        /// The head of `ggml_backend_cuda_context`: the device, its name (a libstdc++
        /// `std::string`: data pointer, length, 16 bytes of buffer), the copy event, and the
        /// streams [GGML_CUDA_MAX_DEVICES = 16][GGML_CUDA_MAX_STREAMS = 8].
        #[repr(C)]
        struct RawCudaContext {
            device: i32,
            name: [usize; 4],
            copy_event: *mut c_void,
            streams: [[*mut c_void; 8]; 16],
        }
        if !self.name().starts_with("CUDA") {
            return None;
        }
        // SAFETY: a live CUDA backend; each field is read only once the one before it checked
        // out against the library (the device pointer's offset, then the context's name, which
        // for ggml-cuda is the string `ggml_backend_name` returns the characters of).
        unsafe {
            let b = self.raw() as *const RawBackend;
            if (*b).device != sys::ggml_backend_get_device(self.raw()) as *mut c_void {
                return None;
            }
            let ctx = (*b).context as *const RawCudaContext;
            if ctx.is_null() || (*ctx).name[0] != sys::ggml_backend_name(self.raw()) as usize {
                return None;
            }
            let dev = usize::try_from((*ctx).device).ok().filter(|&d| d < 16)?;
            let stream = (*ctx).streams[dev][0];
            (!stream.is_null()).then_some(stream)
        }
    }

    /// On a CPU backend, switches ggml's reference kernels on or off: no llamafile sgemm, no
    /// tiled or KV-split flash attention, so each output row is computed the same way whatever
    /// the batch shape (slower prompt processing). Returns false (and does nothing) elsewhere.
    ///
    /// On a meta backend (a tensor split), its CPU devices' backends.
    pub fn set_cpu_reference_kernels(&self, on: bool) -> bool {
        let mut any = false;
        for b in self.simple_backends() {
            // SAFETY: live backends; the setter is only called on a CPU backend.
            unsafe {
                if sys::ggml_backend_is_cpu(b) {
                    sys::ggml_backend_cpu_set_use_ref(b, on);
                    any = true;
                }
            }
        }
        any
    }

    /// Whether this backend can run the op that produced `t`.
    pub fn supports_op(&self, t: Tensor<'_>) -> bool {
        // SAFETY: live backend and tensor.
        unsafe { sys::ggml_backend_supports_op(self.raw(), t.raw()) }
    }

    /// Runs a graph whose tensors are all allocated (e.g. by [`Context::alloc_tensors`]).
    pub fn compute(&self, graph: &Graph<'_>) -> Result<()> {
        computing();
        // SAFETY: live backend and graph; all tensors allocated (ggml checks and aborts otherwise,
        // so callers allocate first).
        let status = unsafe { sys::ggml_backend_graph_compute(self.raw(), graph.raw()) };
        check_status(status, self.name())
    }

    /// Queues nodes `i0..i1` of `graph` (allocated, every tensor in a buffer this backend
    /// reads) on this backend without waiting for them: ggml's `ggml_graph_view`, which the
    /// scheduler's eval callback computes through but the library does not export.
    pub fn compute_nodes_async(&self, graph: &Graph<'_>, i0: usize, i1: usize) -> Result<()> {
        assert!(
            i0 < i1 && i1 <= graph.n_nodes(),
            "nodes {i0}..{i1} of {}",
            graph.n_nodes()
        );
        computing();
        // SAFETY: `CGraph` mirrors the pinned ggml's `struct ggml_cgraph` (ggml-impl.h), checked
        // against the library's own accessors below; the view borrows the graph's node array,
        // use counts and hash set, alive for this call, as ggml_graph_view's does.
        let status = unsafe {
            let mut v = *(graph.raw() as *const CGraph);
            assert_eq!(v.n_nodes as usize, graph.n_nodes(), "ggml_cgraph layout");
            assert_eq!(*v.nodes, graph.node(0).raw(), "ggml_cgraph layout");
            v.size = 0;
            v.n_nodes = (i1 - i0) as i32;
            v.n_leafs = 0;
            v.nodes = v.nodes.add(i0);
            v.grads = std::ptr::null_mut();
            v.grad_accs = std::ptr::null_mut();
            v.leafs = std::ptr::null_mut();
            v.uid = 0;
            sys::ggml_backend_graph_compute_async(
                self.raw(),
                (&mut v as *mut CGraph).cast::<sys::ggml_cgraph>(),
            )
        };
        check_status(status, self.name())
    }

    /// Waits until everything queued on this backend has run.
    pub fn synchronize(&self) {
        // SAFETY: live backend.
        unsafe { sys::ggml_backend_synchronize(self.raw()) }
    }
}

/// The pinned ggml's `struct ggml_cgraph` (ggml-impl.h, llama-cpp-sys-4 0.11.0), for
/// [`Backend::compute_nodes_async`].
#[repr(C)]
#[derive(Clone, Copy)]
struct CGraph {
    size: i32,
    n_nodes: i32,
    n_leafs: i32,
    nodes: *mut *mut sys::ggml_tensor,
    grads: *mut *mut sys::ggml_tensor,
    grad_accs: *mut *mut sys::ggml_tensor,
    leafs: *mut *mut sys::ggml_tensor,
    use_counts: *mut i32,
    /// `struct ggml_hash_set { size_t size; ggml_bitset_t * used; struct ggml_tensor ** keys; }`
    visited_size: usize,
    visited_used: *mut u32,
    visited_keys: *mut *mut sys::ggml_tensor,
    order: i32,
    uid: u64,
}

impl Drop for Backend {
    fn drop(&mut self) {
        // SAFETY: we own the backend; its thread pool, a field, is dropped after this.
        unsafe { sys::ggml_backend_free(self.raw()) };
    }
}

// SAFETY: a ggml backend may be moved to another thread; it is used from one thread at a time.
unsafe impl Send for Backend {}

/// A ggml backend event of a GPU device (a CUDA event): work recorded into it on one stream can
/// be waited for by the backend's compute stream on the device, without the host waiting.
pub struct Event {
    ptr: NonNull<sys::ggml_backend_event>,
}

impl Event {
    /// An event of `backend`'s device; `None` where the device has no events (the CPU, or
    /// ggml-cuda built with `GGML_CUDA_NO_PEER_COPY`).
    pub fn new(backend: &Backend) -> Option<Self> {
        if !backend.is_cuda() {
            return None;
        }
        // SAFETY: a live backend's device; null when the device has no events.
        let ptr =
            unsafe { sys::ggml_backend_event_new(sys::ggml_backend_get_device(backend.raw())) };
        NonNull::new(ptr).map(|ptr| Self { ptr })
    }

    /// The `cudaEvent_t` inside (ggml's `struct ggml_backend_event { device; context; }`,
    /// `ggml-backend-impl.h` of the pinned ggml, whose CUDA backend keeps the event in
    /// `context`), for recording it on a stream of our own.
    pub fn cuda_event(&self) -> *mut std::ffi::c_void {
        // SAFETY: the pinned ggml's event struct is two pointers, the second the CUDA event.
        unsafe { (*self.ptr.as_ptr().cast::<[*mut std::ffi::c_void; 2]>())[1] }
    }

    /// Makes `backend`'s compute stream wait (on the device) for the work recorded in this
    /// event; the host returns at once.
    pub fn wait_on(&self, backend: &Backend) {
        // SAFETY: a live event of this backend's device (both checked CUDA at creation).
        unsafe { sys::ggml_backend_event_wait(backend.raw(), self.ptr.as_ptr()) }
    }

    /// Records, on `backend`'s compute stream, everything queued there so far.
    pub fn record(&self, backend: &Backend) {
        // SAFETY: a live event of this backend's device (both checked CUDA at creation).
        unsafe { sys::ggml_backend_event_record(self.ptr.as_ptr(), backend.raw()) }
    }

    /// Waits (on the host) until the work recorded in this event has run.
    pub fn synchronize(&self) {
        // SAFETY: a live event.
        unsafe { sys::ggml_backend_event_synchronize(self.ptr.as_ptr()) }
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        // SAFETY: we own the event.
        unsafe { sys::ggml_backend_event_free(self.ptr.as_ptr()) }
    }
}

fn check_status(status: sys::ggml_status, backend: String) -> Result<()> {
    if status == sys::GGML_STATUS_SUCCESS {
        Ok(())
    } else {
        Err(GgmlError::Compute { backend, status })
    }
}

/// ggml's scheduler: splits a graph over several backends (first = highest priority, last must be
/// the CPU), allocates intermediates in its own buffers, and copies between backends.
pub struct Sched {
    ptr: NonNull<sys::ggml_backend_sched>,
    /// Kept alive as long as the scheduler, which holds their raw pointers.
    backends: Vec<Rc<Backend>>,
}

impl Sched {
    pub fn new(backends: &[Rc<Backend>], graph_size: usize, op_offload: bool) -> Result<Self> {
        let mut raw: Vec<_> = backends.iter().map(|b| b.raw()).collect();
        // As llama.cpp: with a GPU, the CPU backend's intermediates and graph inputs live in
        // the GPU's page-locked host memory, so their uploads (e.g. a deep context's causal
        // mask, tens of MB per micro-batch) run at PCIe speed, not through a pageable bounce.
        // SAFETY: live backends; device handles are static; null = no such buffer type.
        let mut bufts: Vec<_> = unsafe {
            let gpu_host = backends
                .iter()
                .filter(|b| b.is_cuda())
                .map(|b| {
                    sys::ggml_backend_dev_host_buffer_type(sys::ggml_backend_get_device(b.raw()))
                })
                .find(|t| !t.is_null());
            backends
                .iter()
                .map(|b| match gpu_host {
                    Some(h) if !b.is_cuda() => h,
                    _ => b.buffer_type().raw(),
                })
                .collect()
        };
        // SAFETY: `raw` holds live backends, kept alive by `backends` (Rc) as long as the
        // scheduler; `bufts` one valid buffer type per backend.
        let ptr = unsafe {
            sys::ggml_backend_sched_new(
                raw.as_mut_ptr(),
                bufts.as_mut_ptr(),
                raw.len() as i32,
                graph_size,
                false,
                op_offload,
            )
        };
        Ok(Self {
            ptr: NonNull::new(ptr).ok_or_else(|| GgmlError::BackendInit("scheduler".into()))?,
            backends: backends.to_vec(),
        })
    }

    /// Assigns backends and allocates every tensor of `graph` (inputs included, so they can be
    /// written before [`Sched::compute`]).
    pub fn alloc(&mut self, graph: &Graph<'_>) -> Result<()> {
        // SAFETY: live scheduler and graph.
        let ok = unsafe {
            sys::ggml_backend_sched_reset(self.ptr.as_ptr());
            sys::ggml_backend_sched_alloc_graph(self.ptr.as_ptr(), graph.raw())
        };
        if !ok {
            return Err(GgmlError::Alloc {
                backend: "scheduler".into(),
                what: "graph".into(),
                size: 0,
            });
        }
        Ok(())
    }

    /// Runs a graph allocated by [`Sched::alloc`]. Outputs are read (`Tensor::read_f32`) while
    /// `self` lives: its buffers hold them.
    pub fn compute(&mut self, graph: &Graph<'_>) -> Result<()> {
        computing();
        // SAFETY: live scheduler and a graph allocated by alloc().
        let status =
            unsafe { sys::ggml_backend_sched_graph_compute(self.ptr.as_ptr(), graph.raw()) };
        check_status(status, "scheduler".into())
    }

    /// Starts computing an allocated graph and returns without waiting ([`Sched::synchronize`]
    /// waits), so the host can follow the device meanwhile.
    pub fn compute_async(&mut self, graph: &Graph<'_>) -> Result<()> {
        computing();
        // SAFETY: live scheduler and a graph allocated by alloc(); the graph outlives the
        // computation (the caller synchronizes before dropping or reusing it).
        let status =
            unsafe { sys::ggml_backend_sched_graph_compute_async(self.ptr.as_ptr(), graph.raw()) };
        check_status(status, "scheduler".into())
    }

    /// Waits until the last [`Sched::compute_async`] has finished.
    pub fn synchronize(&mut self) {
        // SAFETY: live scheduler.
        unsafe { sys::ggml_backend_sched_synchronize(self.ptr.as_ptr()) }
    }

    /// Bytes of the compute buffer the scheduler holds on backend `i` (as passed to `new`).
    pub fn buffer_size(&self, i: usize) -> usize {
        // SAFETY: live scheduler; i indexes the backends it was created with.
        unsafe {
            sys::ggml_backend_sched_get_buffer_size(self.ptr.as_ptr(), self.backends[i].raw())
        }
    }

    /// Sizes the compute buffers for `graph` (the largest graph a caller will run) without
    /// computing it.
    pub fn reserve(&mut self, graph: &Graph<'_>) -> Result<()> {
        // SAFETY: live scheduler and graph.
        let ok = unsafe { sys::ggml_backend_sched_reserve(self.ptr.as_ptr(), graph.raw()) };
        if !ok {
            return Err(GgmlError::Alloc {
                backend: "scheduler".into(),
                what: "reserved graph".into(),
                size: 0,
            });
        }
        Ok(())
    }

    /// Like [`Sched::compute`], stopping after every node `hook` asks for: ggml computes the
    /// graph up to that node, waits for the device, and calls [`EvalHook::computed`], which may
    /// read computed tensors and write tensors later nodes read. Replaces any capture callback
    /// for this call.
    pub fn compute_hooked(&mut self, graph: &Graph<'_>, hook: &mut dyn EvalHook) -> Result<()> {
        computing();
        let mut h = HookCall { hook, error: None };
        let user = &mut h as *mut HookCall<'_> as *mut std::ffi::c_void;
        // SAFETY: `user` points at `h`, alive until the callback is removed below.
        unsafe {
            sys::ggml_backend_sched_set_eval_callback(self.ptr.as_ptr(), Some(hook_cb), user)
        };
        // SAFETY: live scheduler and a graph allocated by alloc().
        let status =
            unsafe { sys::ggml_backend_sched_graph_compute(self.ptr.as_ptr(), graph.raw()) };
        // SAFETY: removes the callback before `h` dies.
        unsafe {
            sys::ggml_backend_sched_set_eval_callback(self.ptr.as_ptr(), None, std::ptr::null_mut())
        };
        if let Some(e) = h.error {
            return Err(e);
        }
        check_status(status, "scheduler".into())
    }

    /// Calls [`super::capture::capture_cb`] for every node of later computes, filling `cap`
    /// (which must outlive the scheduler's use of it; pass `None` to stop).
    pub fn set_capture(&mut self, cap: Option<&mut super::capture::Capture>) {
        let (cb, user) = match cap {
            Some(c) => (
                Some(super::capture::capture_cb as _),
                c as *mut _ as *mut std::ffi::c_void,
            ),
            None => (None, std::ptr::null_mut()),
        };
        // SAFETY: live scheduler; the callback is a plain function and `user` stays valid while set.
        unsafe { sys::ggml_backend_sched_set_eval_callback(self.ptr.as_ptr(), cb, user) };
    }

    /// [`Sched::alloc`] with node `t` of `graph` run by backend `assign[..].1` (an index into
    /// the backends as passed to `new`) for each `(t, backend)` in `assign`
    /// (`ggml_backend_sched_set_tensor_backend`); the scheduler places the other nodes as
    /// usual and copies sources between backends where needed.
    pub fn alloc_assigned(
        &mut self,
        graph: &Graph<'_>,
        assign: &[(Tensor<'_>, usize)],
    ) -> Result<()> {
        // SAFETY: live scheduler and graph; the assignments are made after the reset (which
        // clears them) and before the split (which keeps them).
        let ok = unsafe {
            sys::ggml_backend_sched_reset(self.ptr.as_ptr());
            self.set_backends(assign);
            sys::ggml_backend_sched_alloc_graph(self.ptr.as_ptr(), graph.raw())
        };
        if !ok {
            return Err(GgmlError::Alloc {
                backend: "scheduler".into(),
                what: "graph".into(),
                size: 0,
            });
        }
        Ok(())
    }

    /// [`Sched::reserve`] with the assignments of [`Sched::alloc_assigned`].
    pub fn reserve_assigned(
        &mut self,
        graph: &Graph<'_>,
        assign: &[(Tensor<'_>, usize)],
    ) -> Result<()> {
        // SAFETY: as in alloc_assigned.
        let ok = unsafe {
            sys::ggml_backend_sched_reset(self.ptr.as_ptr());
            self.set_backends(assign);
            sys::ggml_backend_sched_reserve(self.ptr.as_ptr(), graph.raw())
        };
        if !ok {
            return Err(GgmlError::Alloc {
                backend: "scheduler".into(),
                what: "reserved graph".into(),
                size: 0,
            });
        }
        Ok(())
    }

    fn set_backends(&mut self, assign: &[(Tensor<'_>, usize)]) {
        for &(t, i) in assign {
            let b = self.backends[i].raw();
            // SAFETY: live scheduler, tensor and one of its backends (index checked above).
            unsafe { sys::ggml_backend_sched_set_tensor_backend(self.ptr.as_ptr(), t.raw(), b) };
        }
    }

    /// The index (as passed to `new`) of the backend the last allocated graph runs `t` on,
    /// `None` where the scheduler assigned it none.
    pub fn tensor_backend(&self, t: Tensor<'_>) -> Option<usize> {
        // SAFETY: live scheduler and tensor; a pure lookup.
        let b = unsafe { sys::ggml_backend_sched_get_tensor_backend(self.ptr.as_ptr(), t.raw()) };
        self.backends.iter().position(|x| x.raw() == b)
    }

    /// Number of backend splits of the last graph.
    pub fn n_splits(&self) -> usize {
        // SAFETY: pure query.
        unsafe { sys::ggml_backend_sched_get_n_splits(self.ptr.as_ptr()) as usize }
    }

    pub fn backends(&self) -> &[Rc<Backend>] {
        &self.backends
    }
}

/// A caller's stops during [`Sched::compute_hooked`]. Nodes are identified by
/// [`Tensor::id`].
pub trait EvalHook {
    /// Whether to stop after node `id`.
    fn wants(&mut self, id: usize) -> bool;
    /// Node `id` and everything before it are computed and the device is idle. Returning an
    /// error stops the graph; [`Sched::compute_hooked`] returns it.
    fn computed(&mut self, id: usize) -> Result<()>;
}

struct HookCall<'h> {
    hook: &'h mut dyn EvalHook,
    error: Option<GgmlError>,
}

/// ggml's eval callback, forwarding to the `&mut dyn EvalHook` behind `user`.
unsafe extern "C" fn hook_cb(
    t: *mut sys::ggml_tensor,
    ask: bool,
    user: *mut std::ffi::c_void,
) -> bool {
    // SAFETY: `user` is the `HookCall` set by compute_hooked, alive during compute.
    let call = unsafe { &mut *(user as *mut HookCall<'_>) };
    if call.error.is_some() {
        // Stop at the next node: ask for it, then refuse to go on.
        return ask;
    }
    // A panic must not unwind into C (that aborts the process): it becomes the compute's error,
    // and the graph stops.
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        if ask {
            Ok(call.hook.wants(t as usize))
        } else {
            call.hook.computed(t as usize).map(|()| true)
        }
    }));
    match r {
        Ok(Ok(go_on)) => go_on,
        Ok(Err(e)) => {
            call.error = Some(e);
            false
        }
        Err(panic) => {
            let msg = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "panic".into());
            call.error = Some(GgmlError::Compute {
                backend: format!("step hook panicked: {msg}"),
                status: sys::GGML_STATUS_FAILED,
            });
            // Returning false from an `ask` would not stop ggml: ask for the node instead, and
            // the call after it (not `ask`) returns false.
            ask
        }
    }
}

impl Drop for Sched {
    fn drop(&mut self) {
        // SAFETY: we own the scheduler.
        unsafe { sys::ggml_backend_sched_free(self.ptr.as_ptr()) };
    }
}
