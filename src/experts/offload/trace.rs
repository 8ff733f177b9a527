//! A per-stop trace of the decode timeline, for finding where a step's time goes on the device
//! (issue 30: at uniform routing the CPU channel idles ~80% of a step while PCIe is saturated,
//! and a cost model with the GPU's ~70 us of work per layer predicts ~90 t/s where 68 were
//! measured). `POCKETMOE_STOP_TRACE=path` appends one CSV row per stop (host clock, us since
//! the trace began): when the host began waiting for the routing, had it, had made the stop's
//! decisions, opened the gate (or, on the eval-hook path, returned to ggml), and what the stop
//! decided. Off (the default) it costs one load of a `OnceLock` per call.
//!
//! Process-wide, not a field of `Offload`: a diagnostic that must not grow the protocol's
//! state; `Offload`'s `Drop` flushes what is left.
use std::io::Write;
use std::sync::{Mutex, OnceLock};
use std::time::Instant;

/// What a row's stop was.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(super) enum Kind {
    /// A gated step's routing stop.
    #[default]
    Gated,
    /// The eval-hook path's routing stop.
    Hook,
    /// The eval-hook path's second stop (the GPU's experts done; the CPU's share joined).
    GpuOut,
}

/// One stop. Times: us since the trace began, on the host's clock (0: not reached).
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Row {
    pub step: u64,
    pub il: usize,
    pub kind: Kind,
    /// The host began waiting for the routing (gated), or ggml called the hook.
    pub wait: f64,
    /// The routing was on the host.
    pub routed: f64,
    /// The stop's decisions were made (the CPU/PCIe split, the CPU job handed over, cache
    /// lookups and admissions), before its copies, control words and gate were queued:
    /// `routed -> decided` is host logic, `decided -> open` the calls that queue them (and,
    /// gated with a CPU job, its join).
    pub decided: f64,
    /// The gate was opened (queued behind the stop's copies; gated only).
    pub open: f64,
    /// The stop's protocol returned.
    pub done: f64,
    /// Distinct experts used, of them not resident (misses), sent to the CPU channel.
    pub used: usize,
    pub misses: usize,
    pub cpu: usize,
    /// The copy engine's backlog the split saw, us.
    pub backlog: f64,
    /// The next layer's predicted experts not resident, and of them prefetched.
    pub cands: usize,
    pub prefetched: usize,
    /// The CPU job's join: how long it waited, and the job's compute, us.
    pub cpu_wait: f64,
    pub cpu_compute: f64,
    /// Every pick was resident on the device (a table-form stop that passed).
    pub fast: bool,
}

struct Trace {
    path: String,
    base: Instant,
    rows: Vec<Row>,
    cur: Row,
    /// Flushes so far (a column: one per engine in a process that loads several).
    run: u32,
}

/// Rows kept before they are written (~50 stops a token: a few thousand tokens).
const MAX_ROWS: usize = 200_000;

fn trace() -> Option<&'static Mutex<Trace>> {
    static T: OnceLock<Option<Mutex<Trace>>> = OnceLock::new();
    T.get_or_init(|| {
        let path = std::env::var("POCKETMOE_STOP_TRACE").ok()?;
        Some(Mutex::new(Trace {
            path,
            base: Instant::now(),
            rows: Vec::new(),
            cur: Row::default(),
            run: 0,
        }))
    })
    .as_ref()
}

/// Updates the stop in progress: `f` gets it and the time now (us since the trace began).
pub(super) fn with(f: impl FnOnce(&mut Row, f64)) {
    if let Some(t) = trace() {
        let mut t = t.lock().unwrap_or_else(|p| p.into_inner());
        let now = t.base.elapsed().as_secs_f64() * 1e6;
        f(&mut t.cur, now);
    }
}

/// A stop of `kind` in layer `il` of step `step` begins (the host starts waiting, or the hook
/// was called).
pub(super) fn begin(step: u64, il: usize, kind: Kind) {
    with(|r, now| {
        *r = Row {
            step,
            il,
            kind,
            wait: now,
            ..Row::default()
        }
    });
}

/// The stop in progress is done: its row is kept.
pub(super) fn done() {
    if let Some(t) = trace() {
        let mut t = t.lock().unwrap_or_else(|p| p.into_inner());
        let mut row = t.cur;
        row.done = t.base.elapsed().as_secs_f64() * 1e6;
        if t.rows.len() < MAX_ROWS {
            t.rows.push(row);
        }
    }
}

/// Appends the rows kept to the file (its header first where it is new); a failure to write
/// is said, not raised (a diagnostic).
pub(super) fn flush() {
    let Some(t) = trace() else {
        return;
    };
    let mut t = t.lock().unwrap_or_else(|p| p.into_inner());
    if t.rows.is_empty() {
        return;
    }
    let rows = std::mem::take(&mut t.rows);
    let run = t.run;
    t.run += 1;
    let r = write_rows(&t.path, run, &rows);
    if let Err(e) = r {
        tracing::warn!("stop trace {}: not written ({e})", t.path);
    }
}

fn write_rows(path: &str, run: u32, rows: &[Row]) -> std::io::Result<()> {
    let new = std::fs::metadata(path).map_or(true, |m| m.len() == 0);
    let f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)?;
    let mut w = std::io::BufWriter::new(f);
    if new {
        writeln!(
            w,
            "run,step,layer,kind,wait,routed,decided,open,done,used,misses,cpu,backlog,cands,\
             prefetched,cpu_wait,cpu_compute,fast"
        )?;
    }
    for r in rows {
        writeln!(
            w,
            "{run},{},{},{:?},{:.1},{:.1},{:.1},{:.1},{:.1},{},{},{},{:.1},{},{},{:.1},{:.1},{}",
            r.step,
            r.il,
            r.kind,
            r.wait,
            r.routed,
            r.decided,
            r.open,
            r.done,
            r.used,
            r.misses,
            r.cpu,
            r.backlog,
            r.cands,
            r.prefetched,
            r.cpu_wait,
            r.cpu_compute,
            u8::from(r.fast)
        )?;
    }
    w.flush()
}
