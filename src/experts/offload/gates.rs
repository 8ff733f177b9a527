//! A gated step's gates (docs/design.md §4.4a, §4.4b): what a stop opens to its experts, the
//! tickets of the gate's counter a step takes, and reading a hit flag back.
use super::*;

/// The gate a gated stop opens to its experts: in table form its hit flag (address and target),
/// behind ticket `landed` of the gate's counter (which the previous stop opens once the bytes it
/// prefetched into this layer have landed: the table counts them resident before, see
/// [`super::table::prefetched_resident`]); else a ticket of the gate's counter.
#[derive(Clone, Copy)]
pub(super) enum Open {
    Word {
        flag: usize,
        target: u32,
        landed: u64,
    },
    Ticket(u64),
}

impl Open {
    /// Compute queued from now on waits for this gate.
    pub(super) fn close(self, x: &mut dyn Transfer) -> Result<(), GgmlError> {
        match self {
            Open::Word {
                flag,
                target,
                landed,
            } => {
                x.close_gate(landed)?;
                x.close_word(flag, target)
            }
            Open::Ticket(t) => x.close_gate(t),
        }
    }

    /// Opens it once the copies of the last `mark_copies` have landed (in table form the flag:
    /// its ticket is the previous stop's to open).
    pub(super) fn open(self, x: &mut dyn Transfer) -> Result<(), GgmlError> {
        match self {
            Open::Word { flag, target, .. } => x.open_word(flag, target),
            Open::Ticket(t) => x.open_gate(t),
        }
    }

    /// Marks the copies queued so far and opens it once they have landed.
    pub(super) fn open_behind_copies(self, x: &mut dyn Transfer) -> Result<(), GgmlError> {
        x.mark_copies()?;
        self.open(x)
    }
}

/// The tickets of a gated step from its first: stop `c`'s gathers (table form) wait for
/// `gathers(c)`, its experts for `experts(c)` (in table form besides its flag); they open in
/// that order, stop after stop, and `end` opens them all.
#[derive(Clone, Copy)]
pub(super) struct Tickets(pub(super) u64);

impl Tickets {
    /// Tickets a step of `n_stops` stops takes.
    pub(super) fn count(n_stops: usize) -> u64 {
        2 * n_stops as u64 + 1
    }
    pub(super) fn gathers(self, c: usize) -> u64 {
        self.0 + 2 * c as u64
    }
    pub(super) fn experts(self, c: usize) -> u64 {
        self.0 + 2 * c as u64 + 1
    }
    pub(super) fn end(self, n_stops: usize) -> u64 {
        self.0 + 2 * n_stops as u64
    }
}

/// A gated stop's gate, and (table form) whether its hit flag had reached the target: the GPU
/// ran on.
#[derive(Clone, Copy)]
pub(super) struct GateStop {
    pub(super) open: Open,
    pub(super) fast: bool,
}

/// Whether a flag word read back has reached `target` (the device's comparison: cyclic).
pub(super) fn reached(flag: u32, target: u32) -> bool {
    flag.wrapping_sub(target) as i32 >= 0
}
