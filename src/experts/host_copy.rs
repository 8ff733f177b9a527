//! The copy engine where the CPU stands in for the GPU (tests, CI): "device" memory is host
//! memory and a copy is a `memcpy`; gating is a formality (compute runs as it is queued). With
//! late copies (`EngineOptions::late_copies`) it enforces the copy engine's contract
//! (`transfer`'s header) as a GPU would: see [`HostCopy`].
use super::transfer::{GateTally, Transfer};
use crate::ggml::GgmlError;

/// Plain memcpy between host addresses (the CPU backend's buffers), and the gate's tally.
/// With `late` (tests: `EngineOptions::late_copies`), a copy or read fills its destination
/// with 0xFF bytes (NaN as f32 and as the f16 scales of quantized blocks) when queued and
/// lands at the latest moment `Transfer`'s contract allows: copies at the next `wait`, `fence`,
/// or gate opening (those marked before it), reads at the next `wait_reads` or `wait_batch`.
/// So on the CPU too, compute that reads a copy's range before the protocol lets it computes
/// NaN, where on a GPU it would race the copy engine; and a source changed before its copy
/// landed gives the copy the new bytes, as on a GPU.
#[derive(Default)]
pub(super) struct HostCopy {
    tally: GateTally,
    late: Option<Late>,
}

/// Late copies and reads not landed yet, in queue order, and how many copies a gate's
/// opening waits for (`mark_copies`).
#[derive(Default)]
struct Late {
    copies: Vec<(usize, usize, usize)>,
    reads: Vec<(usize, usize, usize)>,
    marked: usize,
}

/// Copies `n` bytes from `src` to `dst`.
///
/// SAFETY: both are host addresses inside live ggml CPU buffers (the caller's contract), the
/// ranges belong to different tensors (slot vs store, or scratch vs graph) so they do not
/// overlap.
unsafe fn memcpy(dst: usize, src: usize, n: usize) {
    std::ptr::copy_nonoverlapping(src as *const u8, dst as *mut u8, n);
}

/// Lands the first `n` of `queued`, in order.
fn land(queued: &mut Vec<(usize, usize, usize)>, n: usize) {
    for (dst, src, len) in queued.drain(..n) {
        // SAFETY: as queued (`HostCopy::copy`, `HostCopy::read`), and the buffers outlive
        // the engine's copies (`Transfer`'s contract).
        unsafe { memcpy(dst, src, len) };
    }
}

impl HostCopy {
    pub(super) fn new(late: bool) -> Self {
        Self {
            late: late.then(Late::default),
            ..Default::default()
        }
    }
    fn queue(&mut self, dst: usize, src: usize, n: usize, read: bool) {
        match &mut self.late {
            Some(l) => {
                // SAFETY: `dst` is a live host range of `n` bytes (the caller's contract).
                unsafe { std::ptr::write_bytes(dst as *mut u8, 0xFF, n) };
                let q = if read { &mut l.reads } else { &mut l.copies };
                q.push((dst, src, n));
            }
            // SAFETY: as for `memcpy`.
            None => unsafe { memcpy(dst, src, n) },
        }
    }
    /// Lands every copy (`all`) or those marked for a gate's opening.
    fn land_copies(&mut self, all: bool) {
        if let Some(l) = &mut self.late {
            let n = if all { l.copies.len() } else { l.marked };
            land(&mut l.copies, n);
            l.marked = 0;
        }
    }
    fn land_reads(&mut self) {
        if let Some(l) = &mut self.late {
            let n = l.reads.len();
            land(&mut l.reads, n);
        }
    }
}

impl Transfer for HostCopy {
    fn copy(&mut self, dst: usize, src: usize, n: usize) -> Result<(), GgmlError> {
        self.queue(dst, src, n, false);
        Ok(())
    }
    fn wait(&mut self) -> Result<(), GgmlError> {
        self.land_copies(true);
        Ok(())
    }
    fn read(&mut self, dst: usize, src: usize, n: usize) -> Result<(), GgmlError> {
        self.queue(dst, src, n, true);
        Ok(())
    }
    fn wait_reads(&mut self) -> Result<(), GgmlError> {
        self.land_reads();
        Ok(())
    }
    fn fence(&mut self) -> Result<(), GgmlError> {
        self.land_copies(true);
        Ok(())
    }
    // Gating on the host: compute runs as it is queued (`queues_ahead` false); a copy or read
    // is done when its call returns, or with late copies when a gate opens (the marked copies)
    // or a batch is waited for (every read).
    fn can_gate(&self) -> bool {
        true
    }
    fn close_gate(&mut self, ticket: u64) -> Result<(), GgmlError> {
        self.tally.close(ticket);
        Ok(())
    }
    fn mark_copies(&mut self) -> Result<(), GgmlError> {
        if let Some(l) = &mut self.late {
            l.marked = l.copies.len();
        }
        Ok(())
    }
    fn open_gate(&mut self, ticket: u64) -> Result<(), GgmlError> {
        self.land_copies(false);
        self.tally.open(ticket)
    }
    fn close_word(&mut self, _addr: usize, _value: u32) -> Result<(), GgmlError> {
        Ok(())
    }
    fn open_word(&mut self, _addr: usize, _value: u32) -> Result<(), GgmlError> {
        self.land_copies(false);
        Ok(())
    }
    fn reads_after_compute(&mut self) -> Result<(), GgmlError> {
        Ok(())
    }
    fn end_batch(&mut self) -> Result<u64, GgmlError> {
        Ok(0)
    }
    fn wait_batch(&mut self, _id: u64) -> Result<(), GgmlError> {
        self.land_reads();
        Ok(())
    }
    fn gate_tally(&self) -> GateTally {
        self.tally
    }
}
