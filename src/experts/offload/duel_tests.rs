//! The duel's tests (`offload::duel`).
use super::*;

/// Runs `n` steps of one size that may take the table form, each taking `times[arm]`
/// seconds (a step that begins a block takes `first` more), and returns the arms taken.
fn run(d: &mut Duels, n: u32, times: [f64; 5], first: f64) -> Vec<Arm> {
    (0..n)
        .map(|_| {
            d.discard();
            assert_eq!(d.prefetch(), 1.0, "no arm chosen yet: the whole budget");
            let arm = d.choose(1, true);
            assert_eq!(
                d.prefetch(),
                arm.prefetch,
                "the step in flight prefetches as its arm"
            );
            let i = ARMS.iter().position(|a| *a == arm).unwrap();
            let duel = &d.by_tokens[1];
            let new_block = duel.winner.is_none() && duel.in_block == 0;
            d.step_time(times[i] + if new_block { first } else { 0.0 });
            arm
        })
        .collect()
}

/// A duel's steps where no arm sits out.
const DUEL: u32 = ARMS.len() as u32 * BLOCK * BLOCKS;

/// Steps a duel counted so far.
fn counted(d: &Duel) -> usize {
    d.times.iter().map(Vec::len).sum()
}

#[test]
fn the_arms_take_turns_in_blocks_then_the_fastest_runs() {
    let mut d = Duels::default();
    let want: Vec<Arm> = (0..DUEL)
        .map(|i| ARMS[(i / BLOCK) as usize % ARMS.len()])
        .collect();
    assert!(
        !want[0].gated && want[0].prefetch == 1.0 && !want[0].table,
        "the hook path first"
    );
    // Within PRUNE of each other: every arm runs every round.
    let times = [12.5e-3, 11e-3, 12e-3, 11.8e-3, 11.5e-3];
    let arms = run(&mut d, DUEL, times, 0.0);
    assert_eq!(arms, want, "in turn, blocks of {BLOCK}");
    // Gated was fastest: it runs for HOLD steps.
    let held = run(&mut d, HOLD, times, 0.0);
    assert!(held.iter().all(|&a| a == ARMS[1]));
    // Then a new duel, where the hook path prefetching half is fastest now: it wins.
    let times = [10e-3, 10e-3, 9e-3, 9.6e-3, 9.8e-3];
    assert_eq!(run(&mut d, DUEL, times, 0.0), want);
    let held = run(&mut d, HOLD, times, 0.0);
    assert!(held.iter().all(|&a| a == ARMS[2]));
    // Split form when it is.
    let times = [10e-3, 10e-3, 9.5e-3, 9e-3, 9.8e-3];
    assert_eq!(run(&mut d, DUEL, times, 0.0), want);
    let held = run(&mut d, HOLD, times, 0.0);
    assert!(
        held.iter().all(|&a| a.split && a.gated && !a.table),
        "{held:?}"
    );
    // The table form when it is.
    let times = [10e-3, 10e-3, 9.5e-3, 9.8e-3, 9e-3];
    assert_eq!(run(&mut d, DUEL, times, 0.0), want);
    let held = run(&mut d, 4, times, 0.0);
    assert!(
        held.iter().all(|&a| a.table && a.gated && !a.split),
        "{held:?}"
    );
    run(&mut d, HOLD - 4, [1.0; 5], 0.0);
    // And the plain hook path when it is.
    let times = [9e-3, 10e-3, 9.5e-3, 9.9e-3, 9.8e-3];
    assert_eq!(run(&mut d, DUEL, times, 0.0), want);
    assert!(run(&mut d, 4, times, 0.0).iter().all(|&a| a == ARMS[0]));
}

#[test]
fn an_arm_far_slower_after_a_round_sits_out_the_rest() {
    // Half prefetch 18% and split form 16% slower than gated after the first round: out. The
    // hook path, 27% slower, ran the duel's first block: out after its second. So 40 + 24 + 16
    // steps, and gated wins.
    let mut d = Duels::default();
    let times = [14e-3, 11e-3, 13e-3, 12.8e-3, 11.5e-3];
    let arms = run(&mut d, 40 + 24 + 16, times, 0.0);
    assert!(
        arms[40..].iter().all(|&a| a != ARMS[2] && a != ARMS[3]),
        "half prefetch or split form ran after the first round"
    );
    assert_eq!(arms[40..48], [ARMS[0]; 8], "the hook path's second block");
    assert!(
        arms[64..].iter().all(|&a| a != ARMS[0]),
        "the hook path ran a third block"
    );
    assert_eq!(d.by_tokens[1].winner, Some(1), "gated won after 80 steps");
    // Every arm but one far slower: the duel ends when the hook path has run its second block.
    let mut d = Duels::default();
    run(&mut d, 40 + 16, [20e-3, 10e-3, 20e-3, 20e-3, 20e-3], 0.0);
    assert_eq!(d.by_tokens[1].winner, Some(1));
}

#[test]
fn a_size_that_cannot_take_the_table_form_duels_without_it() {
    let mut d = Duels::default();
    let arms: Vec<Arm> = (0..TABLE_ARM as u32 * BLOCK * BLOCKS)
        .map(|_| {
            d.discard();
            let a = d.choose(16, false);
            // Table form would be fastest by far: never taken.
            d.step_time(if a.table { 1e-3 } else { 10e-3 });
            a
        })
        .collect();
    assert!(arms.iter().all(|a| !a.table), "no table step in the duel");
    assert!(
        (0..TABLE_ARM).all(|i| arms.contains(&ARMS[i])),
        "the other arms all ran"
    );
    d.discard();
    assert!(d.by_tokens[16].winner.is_some(), "4 arms: the duel ended");
    assert!(!d.choose(16, false).table);
}

#[test]
fn slow_first_steps_of_blocks_and_an_outlier_do_not_decide() {
    // Gated is 5% faster, but the first step of every block is 200 ms slow (a switch of
    // path), and one more gated step is very slow: the medians still pick gated (the means
    // would pick the hook path).
    let mut d = Duels::default();
    let times = [10e-3, 9.5e-3, 10e-3, 10e-3, 10e-3];
    // Step 49 lies in gated's second block (steps 48-55).
    run(&mut d, 49, times, 0.2);
    d.discard();
    let a = d.choose(1, true);
    d.step_time(1.0);
    assert!(
        a.gated && !a.table && !a.split,
        "step 49 is in a gated block"
    );
    run(&mut d, DUEL - 50, times, 0.2);
    assert!(run(&mut d, 4, times, 0.0).iter().all(|&a| a == ARMS[1]));
}

#[test]
fn each_micro_batch_size_duels_on_its_own_and_a_step_without_a_time_is_not_counted() {
    let mut d = Duels::default();
    run(&mut d, 3, [1.0; 5], 0.0);
    // A 4-token step starts its own duel on the hook path.
    d.discard();
    assert_eq!(d.choose(4, true), ARMS[0]);
    d.step_time(1.0);
    assert_eq!((counted(&d.by_tokens[1]), counted(&d.by_tokens[4])), (3, 1));
    // A step that failed (no time) and the next that does not ask: nothing counted.
    d.discard();
    d.choose(1, true);
    d.discard();
    d.step_time(1.0);
    assert_eq!(counted(&d.by_tokens[1]), 3);
}

#[test]
fn a_discarded_step_is_not_counted_and_its_arm_runs_on() {
    // A block's first two gated steps capture (nothing queued ahead: slow) and are
    // discarded: gated still ends its block with BLOCK counted steps, none of them slow.
    let mut d = Duels::default();
    run(&mut d, BLOCK, [1.0; 5], 0.0);
    for _ in 0..2 {
        d.discard();
        assert!(d.choose(1, true).gated);
        d.discard();
        d.step_time(5.0);
    }
    assert_eq!(
        counted(&d.by_tokens[1]),
        BLOCK as usize,
        "the two not counted"
    );
    let arms = run(&mut d, BLOCK, [1.0; 5], 0.0);
    assert!(
        arms.iter().all(|a| a.gated && !a.table && !a.split),
        "{arms:?}"
    );
    assert!(d.by_tokens[1].times[1].iter().all(|&t| t == 1.0));
}

/// `duel_steps` counts what `deciding` says: every step of a duel until its winner is known,
/// none of the winner's hold, and none before an arm is chosen.
#[test]
fn a_duel_is_deciding_until_its_winner_holds() {
    let mut d = Duels::default();
    assert!(!d.deciding(), "no step in flight");
    let times = [12.5e-3, 11e-3, 12e-3, 11.8e-3, 11.5e-3];
    let deciding = |d: &mut Duels, n: u32| {
        (0..n)
            .filter(|_| {
                d.discard();
                let arm = d.choose(1, true);
                let i = ARMS.iter().position(|a| *a == arm).unwrap();
                let yes = d.deciding();
                d.step_time(times[i]);
                yes
            })
            .count() as u32
    };
    assert_eq!(deciding(&mut d, DUEL), DUEL, "a whole duel (none pruned)");
    assert_eq!(deciding(&mut d, HOLD), 0, "the winner's hold");
    assert_eq!(deciding(&mut d, 1), 1, "the next duel");
    // Another size's duel is its own: deciding while the first size's holds.
    let mut d = Duels::default();
    deciding(&mut d, DUEL);
    d.discard();
    d.choose(2, true);
    assert!(d.deciding(), "a size that has not dueled yet");
}

/// The step that ends a duel returns its decision (for the offload summary): the winner's name,
/// and each arm's median step time and whether it sat out; no other step returns one.
#[test]
fn the_step_that_ends_a_duel_reports_its_choice() {
    let mut d = Duels::default();
    // Half prefetch and split form far slower after the first round: out; the others run on.
    let times = [12e-3, 10e-3, 13e-3, 12.5e-3, 10.5e-3];
    let mut choices = Vec::new();
    for i in 0..DUEL {
        d.discard();
        let arm = d.choose(1, true);
        let a = ARMS.iter().position(|x| *x == arm).unwrap();
        if let Some(c) = d.step_time(times[a]) {
            choices.push((i, c));
        }
    }
    assert_eq!(choices.len(), 1, "{choices:?}");
    let (i, c) = &choices[0];
    // 40 steps of the first round, then 24 and 16 (hook path out after its second block).
    assert_eq!(*i, 40 + 24 + 16 - 1, "the duel's last step");
    assert_eq!(c.n_tokens, 1);
    assert_eq!(c.winner, "gated");
    let want = [
        ("hook", 12e3, true),
        ("gated", 10e3, false),
        ("hook-half", 13e3, true),
        ("split", 12.5e3, true),
        ("table", 10.5e3, false),
    ];
    assert_eq!(c.arms.len(), want.len());
    for (got, want) in c.arms.iter().zip(want) {
        assert_eq!((got.0, got.2), (want.0, want.2), "{got:?}");
        assert!((got.1 - want.1).abs() < 1e-6, "{got:?} against {want:?}");
    }
}
