//! Gated decode's automatic choice (`Gated::Auto`, docs/design.md §4.4a): the eval-hook path
//! or gated, and how much of its budget prefetch takes, by measuring them on the box, per
//! micro-batch size.
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
//! at 12 GiB. So the ways in [`ARMS`] take turns and the fastest runs.
//!
//! A duel: blocks of [`BLOCK`] steps, the arms in turn, the hook path first, until each has run
//! [`BLOCKS`] blocks. The arm with the lowest median step time then runs for [`HOLD`] steps,
//! and they duel again (the routing regime moves with the prompts). A median, not a mean: the
//! first step of a block is disturbed by the switch (ggml-cuda's CUDA graphs of the hook path's
//! pieces, the slack controller's correction, which settles at another value on each path, the
//! cache's contents, which prefetch shapes), and one stalled step must not decide.
use tracing::debug;

/// A way to run a decode step: gated or on the eval-hook path, prefetching this share of the
/// miss balance's budget (`Offload::prefetch_budget`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Arm {
    pub gated: bool,
    pub prefetch: f64,
}

/// The arms a duel measures: the hook path, gated, and the hook path prefetching half the
/// budget (measured H100 2026-12-05, uniform routing: +9% at 8 GiB, +14% at 12 GiB over the
/// hook path; not measured where the cache hits, which is what a duel is for).
pub(super) const ARMS: [Arm; 3] = [
    Arm {
        gated: false,
        prefetch: 1.0,
    },
    Arm {
        gated: true,
        prefetch: 1.0,
    },
    Arm {
        gated: false,
        prefetch: 0.5,
    },
];

/// Steps an arm runs at a time in a duel: 8, short enough that a duel of 72 steps ends within
/// the first tokens of a reply.
const BLOCK: u32 = 8;

/// Blocks each arm runs per duel: 3, so each median is of 24 steps, 3 of them first in their
/// block (the step time spreads by a few percent from step to step; the arms differed by
/// 5-30% where measured).
const BLOCKS: u32 = 3;

/// Steps the winner runs before the next duel: 512 (a duel's 48 steps on slower arms then cost
/// ~2% of decode where they are slower by a quarter).
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
    /// Steps of this duel so far (every arm).
    steps: u32,
    /// Step times per arm (as [`ARMS`]).
    times: [Vec<f64>; ARMS.len()],
    /// The fastest arm and the steps it still runs before the next duel.
    winner: Option<usize>,
    hold: u32,
}

impl Duels {
    /// How this step of `n_tokens` runs; remembered for [`Duels::step_time`].
    pub fn choose(&mut self, n_tokens: usize) -> Arm {
        if self.by_tokens.len() <= n_tokens {
            self.by_tokens.resize(n_tokens + 1, Duel::default());
        }
        let arm = self.by_tokens[n_tokens].arm();
        self.pending = Some((n_tokens, arm));
        ARMS[arm]
    }

    /// The share of the prefetch budget the step in flight takes: its arm's, 1 where no arm
    /// was chosen (not `Gated::Auto`, or a step that cannot gate).
    pub fn prefetch(&self) -> f64 {
        self.pending.map_or(1.0, |(_, arm)| ARMS[arm].prefetch)
    }

    /// A step begins: whatever was chosen for an earlier one that did not finish is dropped.
    pub fn begin(&mut self) {
        self.pending = None;
    }

    /// The step chosen last took `secs` (its graph's compute, stops included).
    pub fn step_time(&mut self, secs: f64) {
        if let Some((n, arm)) = self.pending.take() {
            self.by_tokens[n].record(n, arm, secs);
        }
    }
}

impl Duel {
    fn arm(&self) -> usize {
        self.winner
            .unwrap_or((self.steps / BLOCK) as usize % ARMS.len())
    }

    fn record(&mut self, n_tokens: usize, arm: usize, secs: f64) {
        if self.winner.is_some() {
            self.hold = self.hold.saturating_sub(1);
            if self.hold == 0 {
                *self = Duel::default();
            }
            return;
        }
        self.times[arm].push(secs);
        self.steps += 1;
        if self.steps == ARMS.len() as u32 * BLOCK * BLOCKS {
            // An arm with no times yet counts as the slowest.
            let medians: Vec<f64> = self
                .times
                .iter_mut()
                .map(|t| crate::util::median(t).unwrap_or(f64::INFINITY))
                .collect();
            let win = (0..ARMS.len())
                .min_by(|&a, &b| medians[a].total_cmp(&medians[b]))
                .unwrap_or(0);
            debug!(
                "decode of {n_tokens}-token steps: {:?} (median step us by arm {:?}: {:?})",
                ARMS[win],
                ARMS,
                medians
                    .iter()
                    .map(|m| (m * 1e6).round())
                    .collect::<Vec<_>>()
            );
            *self = Duel {
                winner: Some(win),
                hold: HOLD,
                ..Duel::default()
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `n` steps of one size, each taking `times[arm]` seconds (a step that begins a
    /// block takes `first` more), and returns the arms taken.
    fn run(d: &mut Duels, n: u32, times: [f64; 3], first: f64) -> Vec<Arm> {
        (0..n)
            .map(|_| {
                d.begin();
                assert_eq!(d.prefetch(), 1.0, "no arm chosen yet: the whole budget");
                let arm = d.choose(1);
                assert_eq!(
                    d.prefetch(),
                    arm.prefetch,
                    "the step in flight prefetches as its arm"
                );
                let i = ARMS.iter().position(|a| *a == arm).unwrap();
                let duel = &d.by_tokens[1];
                let new_block = duel.winner.is_none() && duel.steps.is_multiple_of(BLOCK);
                d.step_time(times[i] + if new_block { first } else { 0.0 });
                arm
            })
            .collect()
    }

    const DUEL: u32 = ARMS.len() as u32 * BLOCK * BLOCKS;

    #[test]
    fn the_arms_take_turns_in_blocks_then_the_fastest_runs() {
        let mut d = Duels::default();
        let want: Vec<Arm> = (0..DUEL)
            .map(|i| ARMS[(i / BLOCK) as usize % ARMS.len()])
            .collect();
        assert!(
            !want[0].gated && want[0].prefetch == 1.0,
            "the hook path first"
        );
        let arms = run(&mut d, DUEL, [14e-3, 11e-3, 12e-3], 0.0);
        assert_eq!(arms, want, "in turn, blocks of {BLOCK}");
        // Gated was fastest: it runs for HOLD steps.
        let held = run(&mut d, HOLD, [14e-3, 11e-3, 12e-3], 0.0);
        assert!(held.iter().all(|&a| a == ARMS[1]));
        // Then a new duel, where the hook path prefetching half is fastest now: it wins.
        assert_eq!(run(&mut d, DUEL, [12e-3, 11e-3, 9e-3], 0.0), want);
        let held = run(&mut d, HOLD, [12e-3, 11e-3, 9e-3], 0.0);
        assert!(held.iter().all(|&a| a == ARMS[2]));
        // And the plain hook path when it is.
        run(&mut d, DUEL, [8e-3, 11e-3, 9e-3], 0.0);
        assert!(run(&mut d, 4, [8e-3, 11e-3, 9e-3], 0.0)
            .iter()
            .all(|&a| a == ARMS[0]));
    }

    #[test]
    fn slow_first_steps_of_blocks_and_an_outlier_do_not_decide() {
        // Gated is 5% faster, but the first step of every block is 200 ms slow (a switch of
        // path), and one more gated step is very slow: the medians still pick gated (the means
        // would pick the hook path).
        let mut d = Duels::default();
        let times = [10e-3, 9.5e-3, 10e-3];
        // Step 33 lies in gated's second block (steps 32-39).
        run(&mut d, 33, times, 0.2);
        d.begin();
        let a = d.choose(1);
        d.step_time(1.0);
        assert!(a.gated, "step 33 is in a gated block");
        run(&mut d, DUEL - 34, times, 0.2);
        assert!(run(&mut d, 4, times, 0.0).iter().all(|&a| a == ARMS[1]));
    }

    #[test]
    fn each_micro_batch_size_duels_on_its_own_and_a_step_without_a_time_is_not_counted() {
        let mut d = Duels::default();
        run(&mut d, 3, [1.0; 3], 0.0);
        // A 4-token step starts its own duel on the hook path.
        d.begin();
        assert_eq!(d.choose(4), ARMS[0]);
        d.step_time(1.0);
        assert_eq!((d.by_tokens[1].steps, d.by_tokens[4].steps), (3, 1));
        // A step that failed (no time) and the next that does not ask: nothing counted.
        d.begin();
        d.choose(1);
        d.begin();
        d.step_time(1.0);
        assert_eq!(d.by_tokens[1].steps, 3);
    }
}
