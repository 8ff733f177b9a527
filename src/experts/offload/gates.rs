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
/// `gathers(c)`, its experts for `experts(c)` (in table form besides its flag), and in split
/// form the add of its CPU share for `joined(c)`; they open in that order, stop after stop, and
/// `end` opens them all.
#[derive(Clone, Copy)]
pub(super) struct Tickets(pub(super) u64);

impl Tickets {
    /// Tickets a step of `n_stops` stops takes.
    pub(super) fn count(n_stops: usize) -> u64 {
        3 * n_stops as u64 + 1
    }
    pub(super) fn gathers(self, c: usize) -> u64 {
        self.0 + 3 * c as u64
    }
    pub(super) fn experts(self, c: usize) -> u64 {
        self.0 + 3 * c as u64 + 1
    }
    pub(super) fn joined(self, c: usize) -> u64 {
        self.0 + 3 * c as u64 + 2
    }
    pub(super) fn end(self, n_stops: usize) -> u64 {
        self.0 + 3 * n_stops as u64
    }
}

/// A gated stop's gate, (table form) whether its hit flag had reached the target: the GPU ran
/// on, and (split form) the ticket the add of its CPU share waits for.
#[derive(Clone, Copy)]
pub(super) struct GateStop {
    pub(super) open: Open,
    pub(super) fast: bool,
    pub(super) joined: Option<u64>,
}

impl GateStop {
    /// Opens the stop's every gate (split form: the CPU share's add too, which opens its
    /// experts' as well: tickets open in order) once the copies marked last have landed.
    pub(super) fn open_all(self, x: &mut dyn Transfer) -> Result<(), GgmlError> {
        match self.joined {
            Some(j) => x.open_gate(j),
            None => self.open.open(x),
        }
    }
}

/// Whether a flag word read back has reached `target` (the device's comparison: cyclic).
pub(super) fn reached(flag: u32, target: u32) -> bool {
    flag.wrapping_sub(target) as i32 >= 0
}

/// Pieces the host queues ahead of the stop it serves, where queued compute waits for its gate:
/// `POCKETMOE_GATED_AHEAD` (0 to 3: two read batches a stop, at most
/// [`super::transfer::READ_BATCHES`] in flight; 0 queues a stop's pieces only once the previous
/// stop is served), read once, for an A/B on the device; unset, 1. (Builds 27f9065 to 37f392d
/// queued nothing ahead in table form: its flag was then a graph output, whose memory
/// earlier nodes of the step could hold values in that passed the wait queued ahead for it;
/// H100, 2026-12-06: 19 table-form cases of the gated test off; see [`Offload::hit_flag`].)
pub(super) fn ahead() -> usize {
    static AHEAD: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *AHEAD.get_or_init(|| {
        std::env::var("POCKETMOE_GATED_AHEAD")
            .ok()
            .and_then(|v| v.parse().ok())
            .map_or(1, |a: usize| a.min(super::transfer::READ_BATCHES / 2 - 1))
    })
}

/// Whether a gated table-form stop looks its picks up with one kernel of our own on ggml-cuda's
/// stream (extra-kernels' `table_lookup`) instead of computing the graph's gathers and hit flag
/// nodes (five small kernels and a copy, ~12.5 us a layer on the H100, docs/bench-h200.md
/// 2026-12-07 evening): `POCKETMOE_TABLE_KERNEL=1`, read once; off by default until it has run
/// on a GPU.
pub(super) fn table_kernel() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("POCKETMOE_TABLE_KERNEL").is_ok_and(|v| v.trim() == "1"))
}

/// Whether the capture guard is on (`run_gated`): yes, unless `POCKETMOE_CAPTURE_GUARD=0`.
pub(super) fn capture_guard() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("POCKETMOE_CAPTURE_GUARD").map_or(true, |v| v != "0"))
}
