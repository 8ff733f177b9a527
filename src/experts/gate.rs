//! A copy engine's gate (`transfer::Transfer::close_gate`): its device side (CUDA) and the
//! host's tally of its tickets.
#[cfg(feature = "cuda-api")]
use super::transfer::READ_BATCHES;
use crate::ggml::GgmlError;
#[cfg(feature = "cuda-api")]
use crate::ggml::{Backend, Event};
#[cfg(feature = "cuda-api")]
use std::rc::Rc;

/// The host's account of a gate's counter: the highest ticket closed and opened so far. Tickets
/// open in order (the counter only grows, so a lower one opened later opens nothing, and the
/// compute behind it had been let through early): an open below the highest is an error, on
/// the host as on the device, so the CPU's tests check the order the device relies on.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct GateTally {
    pub closed: u64,
    pub opened: u64,
}

impl GateTally {
    pub(super) fn close(&mut self, ticket: u64) {
        self.closed = self.closed.max(ticket);
    }

    pub(super) fn open(&mut self, ticket: u64) -> Result<(), GgmlError> {
        if ticket < self.opened {
            return Err(GgmlError::Tensor {
                name: "copy engine gate".into(),
                msg: format!("ticket {ticket} opened after ticket {}", self.opened),
            });
        }
        self.opened = ticket;
        Ok(())
    }
}

/// A copy engine's gate ([`super::transfer::Transfer::close_gate`]) and the events around it.
#[cfg(feature = "cuda-api")]
pub(super) struct Gated {
    pub(super) gate: extra_kernels::Gate,
    /// Recorded after each close on the gate's stream; the compute stream waits on it.
    pub(super) closed: Event,
    /// Recorded on the compute stream; the read stream waits on it.
    pub(super) computed: Event,
    /// Recorded on the copy stream by `mark_copies`; the gate's open waits on it.
    pub(super) copied: Event,
    /// One per read batch in flight, by batch id modulo their number.
    pub(super) batches: Vec<Event>,
    pub(super) next_batch: u64,
    pub(super) tally: GateTally,
}

#[cfg(feature = "cuda-api")]
impl Gated {
    pub(super) fn new(dev: i32, backend: &Rc<Backend>) -> Result<Self, String> {
        let gate = extra_kernels::Gate::new(dev).map_err(|e| e.to_string())?;
        let ev = || Event::new(backend).ok_or_else(|| "the device has no events".to_string());
        Ok(Self {
            gate,
            closed: ev()?,
            computed: ev()?,
            copied: ev()?,
            batches: (0..READ_BATCHES).map(|_| ev()).collect::<Result<_, _>>()?,
            next_batch: 0,
            tally: GateTally::default(),
        })
    }
}

/// How long [`Gated::wait_batch`] waits: a gated step is at most 8 tokens, whose pieces up to a
/// stop run in milliseconds; a batch not done by then waits behind a gate that was never
/// opened, and the step fails saying where instead of hanging.
#[cfg(feature = "cuda-api")]
const STALL_LIMIT: std::time::Duration = std::time::Duration::from_secs(10);

#[cfg(feature = "cuda-api")]
impl Gated {
    /// Waits until read batch `id`'s event has run, polling it ([`STALL_LIMIT`] at most).
    pub(super) fn wait_batch(&self, id: u64) -> Result<(), GgmlError> {
        let ev = self.batches[id as usize % READ_BATCHES].cuda_event();
        let t0 = std::time::Instant::now();
        for i in 0u64.. {
            // SAFETY: a live event of the read stream's device.
            let done =
                unsafe { extra_kernels::event_done(ev) }.map_err(|e| GgmlError::Compute {
                    backend: format!("read stream: {e}"),
                    status: e.code,
                })?;
            if done {
                return Ok(());
            }
            if i % 1024 == 1023 && t0.elapsed() > STALL_LIMIT {
                let t = self.tally;
                return Err(GgmlError::Tensor {
                    name: "gated step".into(),
                    msg: format!(
                        "read batch {id} not done after {:?} (gate tickets closed to {}, \
                         opened to {})",
                        STALL_LIMIT, t.closed, t.opened
                    ),
                });
            }
            std::hint::spin_loop();
        }
        unreachable!("the loop returns")
    }

    /// The 32-bit word at device address `addr` of device `dev` and the gate's counter, read now
    /// without waiting for any stream (`None` where a read failed).
    pub(super) fn peek(&self, dev: i32, addr: Option<usize>) -> (Option<u32>, Option<u64>) {
        let word = addr.and_then(|a| {
            let mut b = [0u8; 4];
            // SAFETY: a hit flag's device address (a graph output, live through the step).
            unsafe { extra_kernels::read_now(dev, a, &mut b) }.ok()?;
            Some(u32::from_ne_bytes(b))
        });
        let mut b = [0u8; 8];
        // SAFETY: the gate's own 8-byte counter, live as long as the gate.
        let counter = unsafe { extra_kernels::read_now(dev, self.gate.counter_addr(), &mut b) }
            .ok()
            .map(|()| u64::from_ne_bytes(b));
        (word, counter)
    }
}
