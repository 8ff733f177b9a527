//! Gated decode's automatic choice (`Gated::Auto`, docs/design.md §4.4a): the eval-hook path
//! or gated, by measuring both on the box, per micro-batch size.
//!
//! Which is faster depends on what the CPU channel does, and no rule of thumb over it held up:
//! gated, a stop joins the CPU's job before it opens the gate, so the GPU idles through the
//! job, while on the hook path the GPU's own experts run beside it; gated saves a piece's launch
//! and the host's plan at every stop. H100, Qwen3-30B-A3B q4_k_m, tg128 (2026-12-05): calibrated
//! routing, gated +21-29% (few CPU jobs); uniform routing at 12 GiB, gated 92-97 t/s against the
//! hook path's 72-75 (0.65 CPU jobs a layer); at 8 GiB, 60-70 against 69-73 (0.9 a layer). The
//! earlier rule (gate while at most an eighth of a job per layer) chose the slower path at
//! 12 GiB. So the two take turns and the faster one runs.
//!
//! A duel: blocks of [`BLOCK`] steps, the hook path first, then gated, alternating, until each
//! has run [`BLOCKS`] blocks. The path with the lower median step time then runs for [`HOLD`]
//! steps, and they duel again (the routing regime moves with the prompts). A median, not a
//! mean: the first step of a block is disturbed by the switch (ggml-cuda's CUDA graphs of the
//! hook path's pieces, the slack controller's correction, which settles at another value on
//! each path), and one stalled step must not decide.
use tracing::debug;

/// Steps a path runs at a time in a duel: 8, short enough that a duel of 48 steps ends within
/// the first tokens of a reply.
const BLOCK: u32 = 8;

/// Blocks each path runs per duel: 3, so each median is of 24 steps, 3 of them first in their
/// block (the step time spreads by a few percent from step to step; the paths differed by
/// 5-30% where measured).
const BLOCKS: u32 = 3;

/// Steps the winner runs before the next duel: 512 (a duel's 24 steps on the slower path then
/// cost ~1% of decode where the paths differ by a quarter).
const HOLD: u32 = 512;

/// One duel per micro-batch size, and the step in flight (its size and path), set when a step
/// asks which path to take and counted when its time is in.
#[derive(Debug, Default)]
pub(super) struct Duels {
    by_tokens: Vec<Duel>,
    pending: Option<(usize, bool)>,
}

#[derive(Debug, Default, Clone)]
struct Duel {
    /// Steps of this duel so far (both paths).
    steps: u32,
    /// Counted step times, hook path then gated.
    times: [Vec<f64>; 2],
    /// The faster path (`true`: gated) and the steps it still runs before the next duel.
    winner: Option<bool>,
    hold: u32,
}

impl Duels {
    /// Whether this step of `n_tokens` runs gated; remembered for [`Duels::step_time`].
    pub fn choose(&mut self, n_tokens: usize) -> bool {
        if self.by_tokens.len() <= n_tokens {
            self.by_tokens.resize(n_tokens + 1, Duel::default());
        }
        let gated = self.by_tokens[n_tokens].gated();
        self.pending = Some((n_tokens, gated));
        gated
    }

    /// A step begins: whatever was chosen for an earlier one that did not finish is dropped.
    pub fn begin(&mut self) {
        self.pending = None;
    }

    /// The step chosen last took `secs` (its graph's compute, stops included).
    pub fn step_time(&mut self, secs: f64) {
        if let Some((n, gated)) = self.pending.take() {
            self.by_tokens[n].record(n, gated, secs);
        }
    }
}

impl Duel {
    fn gated(&self) -> bool {
        self.winner.unwrap_or((self.steps / BLOCK) % 2 == 1)
    }

    fn record(&mut self, n_tokens: usize, gated: bool, secs: f64) {
        if self.winner.is_some() {
            self.hold = self.hold.saturating_sub(1);
            if self.hold == 0 {
                *self = Duel::default();
            }
            return;
        }
        self.times[usize::from(gated)].push(secs);
        self.steps += 1;
        if self.steps == 2 * BLOCK * BLOCKS {
            let (hook, gate) = (median(&mut self.times[0]), median(&mut self.times[1]));
            let win = gate < hook;
            debug!(
                "gated decode, {n_tokens}-token steps: {} (median step {:.0} us gated, {:.0} us \
                 on the eval-hook path)",
                if win { "gated" } else { "eval-hook path" },
                gate * 1e6,
                hook * 1e6
            );
            *self = Duel {
                winner: Some(win),
                hold: HOLD,
                ..Duel::default()
            };
        }
    }
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::INFINITY)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `n` steps of one size, each taking `hook` or `gated` seconds by its path (a step
    /// that begins a block takes `first` more), and returns the paths taken.
    fn run(d: &mut Duels, n: u32, hook: f64, gated: f64, first: f64) -> Vec<bool> {
        (0..n)
            .map(|_| {
                d.begin();
                let g = d.choose(1);
                let new_block =
                    d.by_tokens[1].winner.is_none() && d.by_tokens[1].steps.is_multiple_of(BLOCK);
                d.step_time(if g { gated } else { hook } + if new_block { first } else { 0.0 });
                g
            })
            .collect()
    }

    #[test]
    fn the_paths_take_turns_in_blocks_then_the_faster_runs() {
        let mut d = Duels::default();
        let duel = 2 * BLOCK * BLOCKS;
        let paths = run(&mut d, duel, 14e-3, 11e-3, 0.0);
        let want: Vec<bool> = (0..duel).map(|i| (i / BLOCK) % 2 == 1).collect();
        assert_eq!(paths, want, "hook first, alternating blocks of {BLOCK}");
        // Gated was faster: it runs for HOLD steps.
        assert!(run(&mut d, HOLD, 14e-3, 11e-3, 0.0).iter().all(|&g| g));
        // Then a new duel, where the hook path is faster now: it wins.
        let again = run(&mut d, duel, 9e-3, 11e-3, 0.0);
        assert_eq!(again, want);
        assert!(run(&mut d, HOLD, 9e-3, 11e-3, 0.0).iter().all(|&g| !g));
    }

    #[test]
    fn slow_first_steps_of_blocks_and_an_outlier_do_not_decide() {
        // Gated is 5% faster, but the first step of every block is 200 ms slow (a switch of
        // path), and one more gated step is very slow: the medians still pick gated (the means
        // would pick the hook path).
        let mut d = Duels::default();
        let duel = 2 * BLOCK * BLOCKS;
        run(&mut d, 25, 10e-3, 9.5e-3, 0.2);
        d.begin();
        let g = d.choose(1);
        d.step_time(1.0); // step 25: within the second gated block, an outlier
        assert!(g, "step 25 is in a gated block");
        run(&mut d, duel - 26, 10e-3, 9.5e-3, 0.2);
        assert!(run(&mut d, 4, 10e-3, 9.5e-3, 0.0).iter().all(|&g| g));
    }

    #[test]
    fn each_micro_batch_size_duels_on_its_own_and_a_step_without_a_time_is_not_counted() {
        let mut d = Duels::default();
        run(&mut d, 3, 1.0, 1.0, 0.0);
        // A 4-token step starts its own duel on the hook path.
        d.begin();
        assert!(!d.choose(4));
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
