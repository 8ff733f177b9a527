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
pub use super::gate::GateTally;
#[cfg(feature = "cuda-api")]
use super::gate::Gated;
use super::host_copy::HostCopy;
#[cfg(feature = "cuda-api")]
use crate::ggml::Event;
use crate::ggml::{Backend, GgmlError};
pub use extra_kernels::Lookup;
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

    /// Whether this engine can gate the compute stream ([`Transfer::close_gate`]): a step can
    /// then queue its graph ahead of the stops that feed it (`offload::gated`).
    fn can_gate(&self) -> bool {
        false
    }
    /// Whether compute queued behind a closed gate waits for it: on a device, so a gated step
    /// queues a piece ahead; on the host (the CPU standing in for the GPU) a piece computes as
    /// it is queued, so the gate is a formality and a gated step queues nothing ahead.
    fn queues_ahead(&self) -> bool {
        false
    }
    /// Compute queued from now on runs only once [`Transfer::open_gate`] reached `ticket`.
    fn close_gate(&mut self, _ticket: u64) -> Result<(), GgmlError> {
        Err(no_gate())
    }
    /// Marks the copies queued so far: the next [`Transfer::open_gate`] waits for them (and
    /// not for copies queued after this call).
    fn mark_copies(&mut self) -> Result<(), GgmlError> {
        Err(no_gate())
    }
    /// Opens the gate to `ticket` once the copies of the last [`Transfer::mark_copies`] have
    /// landed (on the device: the host returns at once).
    fn open_gate(&mut self, _ticket: u64) -> Result<(), GgmlError> {
        Err(no_gate())
    }
    /// Compute queued from now on runs only once the 32-bit word at device address `addr` is at
    /// least `value` (cyclically: `(i32)(word - value) >= 0`); compute queued before may write
    /// the word itself (the expert table's hit flag, `offload::table`).
    fn close_word(&mut self, _addr: usize, _value: u32) -> Result<(), GgmlError> {
        Err(no_gate())
    }
    /// Writes `value` to the word at `addr` once the copies of the last
    /// [`Transfer::mark_copies`] have landed (on the device: the host returns at once).
    fn open_word(&mut self, _addr: usize, _value: u32) -> Result<(), GgmlError> {
        Err(no_gate())
    }
    /// Reads queued from now on wait (on the device) for everything queued on the compute
    /// stream so far.
    fn reads_after_compute(&mut self) -> Result<(), GgmlError> {
        Err(no_gate())
    }
    /// Marks the reads queued so far as one batch, for [`Transfer::wait_batch`]; returns its id.
    fn end_batch(&mut self) -> Result<u64, GgmlError> {
        Err(no_gate())
    }
    /// Waits until the reads of batch `id` (one of the last [`READ_BATCHES`]) are done, not for
    /// reads queued after it.
    fn wait_batch(&mut self, _id: u64) -> Result<(), GgmlError> {
        Err(no_gate())
    }
    /// Queues table form's lookup of a stop on the compute stream: one kernel of our own
    /// (extra-kernels' `table_lookup`) in place of the graph's gathers and hit flag nodes.
    /// False where this engine has none (the host; a device whose compute stream cannot be
    /// had): the caller computes the nodes.
    fn table_lookup(&mut self, _l: &Lookup) -> Result<bool, GgmlError> {
        Ok(false)
    }
    /// The highest tickets closed and opened so far, as the host queued them.
    fn gate_tally(&self) -> GateTally {
        GateTally::default()
    }
    /// The 32-bit word at device address `addr` and the gate's counter as they are now, not
    /// waiting for any stream (what a stalled step reports; `None` where it cannot be read).
    fn peek(&mut self, _addr: Option<usize>) -> (Option<u32>, Option<u64>) {
        (None, None)
    }
}

/// Read batches a gated step may have queued and not yet waited for.
pub const READ_BATCHES: usize = 8;

fn no_gate() -> GgmlError {
    GgmlError::Tensor {
        name: "copy engine".into(),
        msg: "this device cannot gate its compute stream".into(),
    }
}

/// The copy engine for `backend`; on the CPU, with `late` (tests), one whose copies land late
/// (`host_copy`).
pub fn for_backend(backend: &Rc<Backend>, late: bool) -> Result<Box<dyn Transfer>, GgmlError> {
    if backend.is_cuda() {
        cuda(backend)
    } else {
        Ok(Box::new(HostCopy::new(late)))
    }
}

#[cfg(feature = "cuda-api")]
fn cuda(backend: &Rc<Backend>) -> Result<Box<dyn Transfer>, GgmlError> {
    let dev: i32 = backend
        .name()
        .trim_start_matches("CUDA")
        .parse()
        .unwrap_or(0);
    let gated = match Gated::new(dev, backend) {
        Ok(g) => Some(g),
        Err(e) => {
            tracing::debug!("{} cannot gate its compute stream: {e}", backend.name());
            None
        }
    };
    Ok(Box::new(CudaCopy {
        copies: extra_kernels::CopyStream::new(dev).map_err(cuda_err)?,
        reads: extra_kernels::CopyStream::new(dev).map_err(cuda_err)?,
        dev,
        landed: Event::new(backend),
        backend: backend.clone(),
        unfenced: false,
        gated,
        compute_stream: std::cell::OnceCell::new(),
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
    /// The CUDA device of the streams.
    dev: i32,
    /// Recorded on `copies` by `fence`, waited for by the compute stream.
    landed: Option<Event>,
    backend: Rc<Backend>,
    /// Copies queued since the last fence.
    unfenced: bool,
    /// The gate and its events, where the driver has stream memory operations.
    gated: Option<Gated>,
    /// ggml-cuda's compute stream, read once (`Backend::cuda_stream`; the handle lives as long
    /// as the backend; `None` inside: it could not be read): where table form's lookup kernel goes.
    compute_stream: std::cell::OnceCell<Option<*mut std::ffi::c_void>>,
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

    fn can_gate(&self) -> bool {
        self.gated.is_some()
    }

    fn queues_ahead(&self) -> bool {
        true
    }

    fn close_gate(&mut self, ticket: u64) -> Result<(), GgmlError> {
        let g = self.gated.as_mut().ok_or_else(no_gate)?;
        g.tally.close(ticket);
        // SAFETY: `closed` is a live event of the gate's device (both from `backend`).
        unsafe { g.gate.close(ticket, g.closed.cuda_event()) }.map_err(cuda_err)?;
        g.closed.wait_on(&self.backend);
        Ok(())
    }

    fn mark_copies(&mut self) -> Result<(), GgmlError> {
        let g = self.gated.as_ref().ok_or_else(no_gate)?;
        // SAFETY: a live event of the copy stream's device.
        unsafe { self.copies.record(g.copied.cuda_event()) }.map_err(cuda_err)
    }

    fn open_gate(&mut self, ticket: u64) -> Result<(), GgmlError> {
        let g = self.gated.as_mut().ok_or_else(no_gate)?;
        g.tally.open(ticket)?;
        // SAFETY: a live event of the gate's device.
        unsafe { g.gate.open_after(ticket, g.copied.cuda_event()) }.map_err(cuda_err)
    }

    fn close_word(&mut self, addr: usize, value: u32) -> Result<(), GgmlError> {
        let g = self.gated.as_ref().ok_or_else(no_gate)?;
        // SAFETY: `addr` is a graph output's device address (allocated as long as the graph,
        // which outlives the step), `closed` a live event of the gate's device.
        unsafe { g.gate.close_word(addr, value, g.closed.cuda_event()) }.map_err(cuda_err)?;
        g.closed.wait_on(&self.backend);
        Ok(())
    }

    fn open_word(&mut self, addr: usize, value: u32) -> Result<(), GgmlError> {
        let g = self.gated.as_ref().ok_or_else(no_gate)?;
        // SAFETY: as `close_word`; `copied` a live event of the copy stream's device.
        unsafe { g.gate.open_word_after(addr, value, g.copied.cuda_event()) }.map_err(cuda_err)
    }

    fn reads_after_compute(&mut self) -> Result<(), GgmlError> {
        let g = self.gated.as_ref().ok_or_else(no_gate)?;
        g.computed.record(&self.backend);
        // SAFETY: a live event of the read stream's device.
        unsafe { self.reads.wait_event(g.computed.cuda_event()) }.map_err(cuda_err)
    }

    fn end_batch(&mut self) -> Result<u64, GgmlError> {
        let g = self.gated.as_mut().ok_or_else(no_gate)?;
        let id = g.next_batch;
        g.next_batch += 1;
        let ev = &g.batches[id as usize % READ_BATCHES];
        // SAFETY: a live event of the read stream's device.
        unsafe { self.reads.record(ev.cuda_event()) }.map_err(cuda_err)?;
        Ok(id)
    }

    fn wait_batch(&mut self, id: u64) -> Result<(), GgmlError> {
        let g = self.gated.as_ref().ok_or_else(no_gate)?;
        g.wait_batch(id)
    }

    fn gate_tally(&self) -> GateTally {
        self.gated.as_ref().map(|g| g.tally).unwrap_or_default()
    }

    fn table_lookup(&mut self, l: &Lookup) -> Result<bool, GgmlError> {
        let Some(stream) = *self
            .compute_stream
            .get_or_init(|| self.backend.cuda_stream())
        else {
            static SAID: std::sync::Once = std::sync::Once::new();
            SAID.call_once(|| {
                tracing::warn!(
                    "POCKETMOE_TABLE_KERNEL: ggml-cuda's compute stream could not be read from \
                     its context (another ggml layout?): the graph's gathers run instead"
                )
            });
            return Ok(false);
        };
        // SAFETY: the addresses are the live graph's and the offload's device tensors (the
        // caller's), on the compute stream's device; the kernel runs in the stream's order,
        // where the graph's gathers would, so nothing else writes its outputs meanwhile.
        unsafe { extra_kernels::table_lookup(stream, l) }.map_err(cuda_err)?;
        Ok(true)
    }

    fn peek(&mut self, addr: Option<usize>) -> (Option<u32>, Option<u64>) {
        match &self.gated {
            Some(g) => g.peek(self.dev, addr),
            None => (None, None),
        }
    }
}
