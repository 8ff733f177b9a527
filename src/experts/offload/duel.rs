//! Gated decode's automatic choice (`Gated::Auto`, docs/design.md §4.4a): the eval-hook path
//! or gated, in control or table form, and how much of its budget prefetch takes, by measuring
//! them on the box, per micro-batch size.
//!
//! Which is faster depends on what the CPU channel does, and no rule of thumb over it held up:
//! gated, a stop joins the CPU's job before it opens the gate, so the GPU idles through the
//! job, while on the hook path the GPU's own experts run beside it; gated saves a piece's launch
//! and the host's plan at every stop. H100, Qwen3-30B-A3B q4_k_m, tg128 (2026-12-05): calibrated
//! routing, gated +21-29% (few CPU jobs); uniform routing at 12 GiB, gated 92-97 t/s against the
//! hook path's 72-75 (0.65 CPU jobs a layer); at 8 GiB, 60-70 against 69-73 (0.9 a layer). The
//! earlier rule (gate while at most an eighth of a job per layer) chose the slower path at
//! 12 GiB. The hook path in turn gained 9-14% there from prefetching half its budget (the CPU
//! job runs beside its GPU experts, so what prefetch leaves to the CPU is cheap), gated did not
//! at 12 GiB. Table form (`offload::table`: a stop whose picks all hit passes on the GPU) gained
//! 4-8% over control-form gating where the cache hits and lost 4-11% where it misses (H100,
//! 2026-12-06). So the ways in [`ARMS`] take turns and the fastest runs.
//!
//! A duel: blocks of [`BLOCK`] steps, the arms in turn, the hook path first, for [`BLOCKS`]
//! rounds; after each round an arm far slower than the best so far sits out the rest
//! ([`PRUNE`]). The arm with the lowest median step time then runs for [`HOLD`] steps,
//! and they duel again (the routing regime moves with the prompts). A median, not a mean: the
//! first step of a block is disturbed by the switch (ggml-cuda's CUDA graphs of the hook path's
//! pieces, the slack controller's correction, which settles at another value on each path, the
//! cache's contents, which prefetch shapes), and one stalled step must not decide. A step that
//! did not run as its arm says (a graph's first steps, which take the eval hook; a gated step in
//! which ggml-cuda may capture, which queues nothing ahead) is not counted ([`Duels::discard`]):
//! its block runs on until it has [`BLOCK`] steps that were. A gated arm on a graph that cannot
//! gate once warm (`Offload::can_gate`) runs through the eval hook and is counted so: it never
//! holds the duel.
//!
//! The table form is a graph of its own: the arm is chosen before the step's graph is built
//! ([`Duels::choose`] from `Offload::begin_form`), and the engine builds the graph of the form
//! the arm asks for.
use crate::experts::stats::DuelChoice;
use tracing::debug;

/// A way to run a decode step: gated or on the eval-hook path, prefetching this share of the
/// miss balance's budget (`Offload::prefetch_budget`), in table form or not, gated in split
/// form or not (`offload::gated`: a stop's GPU experts run while its CPU job does).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Arm {
    pub gated: bool,
    pub prefetch: f64,
    pub table: bool,
    pub split: bool,
}

impl Arm {
    /// Its name in the offload summary (`Stats::duels`).
    pub fn name(&self) -> &'static str {
        match (self.gated, self.table, self.split) {
            (false, ..) if self.prefetch < 1.0 => "hook-half",
            (false, ..) => "hook",
            (true, true, _) => "table",
            (true, false, true) => "split",
            (true, false, false) => "gated",
        }
    }
}

/// The arms a duel measures: the hook path, gated, the hook path prefetching half the budget
/// (measured H100 2026-12-05, uniform routing: +9% at 8 GiB, +14% at 12 GiB over the hook path;
/// not measured where the cache hits, which is what a duel is for), gated in split form
/// (measured H100 2026-12-07, uniform routing: +9% at 12 GiB, +6% at 8 GiB over gated; 2-5%
/// below it where the cache hits, within the spread; a duel's medians on another H100 the same
/// day: 9211 us a step against gated's 10800 at 12 GiB), and, last, gated in table form, where a
/// step may take it ([`TABLE_ARM`]). Split form is gated for the slack controller: it shares the
/// gated path's setpoint and correction (`MissModel::set_gated`).
pub(super) const ARMS: [Arm; 5] = [
    Arm {
        gated: false,
        prefetch: 1.0,
        table: false,
        split: false,
    },
    Arm {
        gated: true,
        prefetch: 1.0,
        table: false,
        split: false,
    },
    Arm {
        gated: false,
        prefetch: 0.5,
        table: false,
        split: false,
    },
    Arm {
        gated: true,
        prefetch: 1.0,
        table: false,
        split: true,
    },
    Arm {
        gated: true,
        prefetch: 1.0,
        table: true,
        split: false,
    },
];

/// The table form's arm, the last of [`ARMS`]: a duel of steps that cannot take it runs the
/// others only (the first `TABLE_ARM`).
const TABLE_ARM: usize = ARMS.len() - 1;
const _: () = assert!(
    ARMS[TABLE_ARM].table,
    "the table form's arm must be the last"
);

/// Steps an arm runs at a time in a duel: 8, short enough that a duel of at most 120 steps ends
/// within the first tokens of a reply.
const BLOCK: u32 = 8;

/// Rounds per duel (a round: a block of every arm still in): 3, so each median is of 24 steps,
/// 3 of them first in their block (the step time spreads by a few percent from step to step;
/// the arms differed by 4-30% where measured).
const BLOCKS: u32 = 3;

/// After a round, an arm whose median step time is more than this times the best arm's sits out
/// the rest of the duel: 1.15 (a median of 8 steps spreads by a few percent, far less than 15%).
/// The arms that differed by 20-30% (the hook path against gating where either pays: see the
/// module's doc) are then out after one or two blocks, not three. The hook path, whose first
/// block is the duel's first, after the prompt changed the cache, stays for a second.
const PRUNE: f64 = 1.15;

/// Steps the winner runs before the next duel: 512 (a duel's steps on slower arms then cost
/// ~1-3% of decode where they are slower by a quarter).
const HOLD: u32 = 512;

/// One duel per micro-batch size, and the step in flight (its size and arm), set when a step
/// asks which arm to take and counted when its time is in.
#[derive(Debug, Default)]
pub(super) struct Duels {
    by_tokens: Vec<Duel>,
    pending: Option<(usize, usize)>,
}

#[derive(Debug, Default, Clone)]
struct Duel {
    /// How many of [`ARMS`] take part: all, or all but the table form's.
    arms: usize,
    /// Arms sitting out the rest of the duel ([`PRUNE`]).
    out: [bool; ARMS.len()],
    /// The arm whose block runs, the steps of its block so far, and the rounds done.
    turn: usize,
    in_block: u32,
    rounds: u32,
    /// Step times per arm (as [`ARMS`]).
    times: [Vec<f64>; ARMS.len()],
    /// The fastest arm and the steps it still runs before the next duel.
    winner: Option<usize>,
    hold: u32,
}

impl Duels {
    /// How this step of `n_tokens` runs (`table`: whether a step of its size may take the table
    /// form; a duel's arms are fixed at its start); remembered for [`Duels::step_time`].
    pub fn choose(&mut self, n_tokens: usize, table: bool) -> Arm {
        if self.by_tokens.len() <= n_tokens {
            self.by_tokens.resize(n_tokens + 1, Duel::default());
        }
        let duel = &mut self.by_tokens[n_tokens];
        if duel.arms == 0 {
            duel.arms = if table { ARMS.len() } else { TABLE_ARM };
        }
        let arm = duel.arm();
        self.pending = Some((n_tokens, arm));
        ARMS[arm]
    }

    /// The arm of the step in flight, if one was chosen.
    pub fn pending(&self) -> Option<Arm> {
        self.pending.map(|(_, arm)| ARMS[arm])
    }

    /// Whether the step in flight is one of a duel still deciding (not its winner's hold).
    pub fn deciding(&self) -> bool {
        self.pending
            .is_some_and(|(n, _)| self.by_tokens[n].winner.is_none())
    }

    /// The share of the prefetch budget the step in flight takes: its arm's, 1 where no arm
    /// was chosen (not `Gated::Auto`, or a step that cannot gate).
    pub fn prefetch(&self) -> f64 {
        self.pending().map_or(1.0, |a| a.prefetch)
    }

    /// The step in flight does not run as its arm says (or not as it runs once settled): its
    /// time is not counted, and the next step takes the same arm. Also where a step begins:
    /// whatever was chosen for an earlier one that did not finish is dropped.
    pub fn discard(&mut self) {
        self.pending = None;
    }

    /// The step chosen last took `secs` (its graph's compute, stops included). Returns the
    /// duel's decision where this step ended one.
    pub fn step_time(&mut self, secs: f64) -> Option<DuelChoice> {
        let (n, arm) = self.pending.take()?;
        self.by_tokens[n].record(n, arm, secs)
    }
}

impl Duel {
    fn arm(&self) -> usize {
        self.winner.unwrap_or(self.turn)
    }

    fn record(&mut self, n_tokens: usize, arm: usize, secs: f64) -> Option<DuelChoice> {
        let arms = self.arms;
        if self.winner.is_some() {
            self.hold = self.hold.saturating_sub(1);
            if self.hold == 0 {
                *self = Duel {
                    arms,
                    ..Duel::default()
                };
            }
            return None;
        }
        self.times[arm].push(secs);
        self.in_block += 1;
        if self.in_block < BLOCK {
            return None;
        }
        self.in_block = 0;
        if let Some(next) = (self.turn + 1..arms).find(|&a| !self.out[a]) {
            self.turn = next;
            return None;
        }
        // A round is over. An arm with no times yet counts as the slowest.
        self.rounds += 1;
        let medians: Vec<f64> = self.times[..arms]
            .iter_mut()
            .map(|t| crate::util::median(t).unwrap_or(f64::INFINITY))
            .collect();
        let best = (0..arms)
            .filter(|&a| !self.out[a])
            .min_by(|&a, &b| medians[a].total_cmp(&medians[b]))
            .unwrap_or(0);
        // The duel's first block (the hook path's) ran as the prompt left the cache: its arm is
        // not dropped before a second block.
        for a in (0..arms).filter(|&a| a > 0 || self.rounds > 1) {
            self.out[a] |= a != best && medians[a] > PRUNE * medians[best];
        }
        let left = (0..arms).filter(|&a| !self.out[a]).count();
        if self.rounds < BLOCKS && left > 1 {
            self.turn = (0..arms).find(|&a| !self.out[a]).unwrap_or(best);
            return None;
        }
        let choice = DuelChoice {
            n_tokens,
            winner: ARMS[best].name(),
            arms: (0..arms)
                .map(|a| (ARMS[a].name(), medians[a] * 1e6, self.out[a]))
                .collect(),
        };
        debug!("decode of {choice}");
        *self = Duel {
            arms,
            winner: Some(best),
            hold: HOLD,
            ..Duel::default()
        };
        Some(choice)
    }
}

#[cfg(test)]
#[path = "duel_tests.rs"]
mod tests;
