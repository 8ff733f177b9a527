//! Tests of the miss cost model (`miss.rs`).
use super::MissModel;

fn model(pcie: f64, cpu: f64, start: f64) -> MissModel {
    let mut m = MissModel::new(Some((pcie, cpu)), true, true);
    m.cpu_start_s = start;
    m
}

#[test]
fn split_balances_the_two_channels() {
    // 1 MB experts, PCIe 50 GB/s (20 us each), CPU 50 GB/s + 30 us start: from idle
    // channels the first two misses go to PCIe (20, 40 us vs 50), then they alternate.
    let m = model(50e9, 50e9, 30e-6);
    let s = m.split(6, 1e6, 0.0, m.cpu_start_s, 0);
    assert_eq!(s, [false, false, true, false, true, false]);
    // A copy engine still busy for 100 us with prefetches: the CPU takes the first ones.
    let s = m.split(3, 1e6, 100e-6, m.cpu_start_s, 0);
    assert_eq!(s, [true, true, true]);
    // Forced picks (more than the slots) go to the CPU whatever it costs.
    let s = m.split(3, 1e6, 0.0, 1.0, 2);
    assert_eq!(s, [true, true, false]);
}

#[test]
fn slack_controller_settles_where_results_wait_the_target() {
    // A box whose real CPU jobs finish 100 us before the step joins them (the GPU's side
    // costs more than the model says): the correction falls until the split hands the CPU
    // enough to close the gap. Simulated: each extra us charged less gives the CPU 1 us
    // more work, so the slack is 100 us + correction.
    let mut m = model(50e9, 50e9, 60e-6);
    for _ in 0..200 {
        let slack = 100e-6 + m.cpu_correction_s;
        let (idle, waited) = if slack >= 0.0 {
            (slack, 0.0)
        } else {
            (0.0, -slack)
        };
        m.observe(idle, waited);
    }
    assert_eq!(
        m.slack_target_s,
        super::SLACK_TARGET_S,
        "the default setpoint"
    );
    let want = -(100e-6 - super::SLACK_TARGET_S);
    assert!(
        (m.cpu_correction_s - want).abs() < 1e-7,
        "correction {} us, want {} us",
        m.cpu_correction_s * 1e6,
        want * 1e6
    );
    // Charged less, the CPU takes more of the same misses: 1 MB experts, 20 us each on
    // either channel, both idle.
    let before = model(50e9, 50e9, 60e-6).split(8, 1e6, 0.0, 60e-6, 0);
    let after = m.split(8, 1e6, 0.0, m.cpu_start(), 0);
    let n = |s: &[bool]| s.iter().filter(|&&c| c).count();
    assert!(n(&after) > n(&before), "{before:?} -> {after:?}");
}

/// A lower setpoint (`POCKETMOE_SLACK_TARGET_US`) settles the correction that much lower, so
/// the CPU takes more misses: the box of `slack_controller_settles_where_results_wait_the_target`,
/// with the step to wait 40 us for the CPU on average instead of results waiting 20 us.
#[test]
fn a_lower_slack_target_gives_the_cpu_more() {
    let settle = |target: f64| {
        let mut m = model(50e9, 50e9, 60e-6);
        m.slack_target_s = target;
        for _ in 0..200 {
            let slack = 100e-6 + m.cpu_correction_s;
            m.observe(slack.max(0.0), (-slack).max(0.0));
        }
        m
    };
    let (usual, lower) = (settle(super::SLACK_TARGET_S), settle(-40e-6));
    let moved = usual.cpu_correction_s - lower.cpu_correction_s;
    assert!((moved - 60e-6).abs() < 1e-7, "moved {} us", moved * 1e6);
    let n = |m: &MissModel| {
        m.split(8, 1e6, 0.0, m.cpu_start(), 0)
            .iter()
            .filter(|&&c| c)
            .count()
    };
    assert!(n(&lower) > n(&usual), "{} -> {}", n(&usual), n(&lower));
}

#[test]
fn slack_controller_charges_more_when_the_step_waits_and_is_bounded() {
    let mut m = model(50e9, 50e9, 60e-6);
    m.observe(0.0, 80e-6); // the step waited 80 us for the CPU
    let c = m.cpu_correction_s;
    assert!(
        (c - super::SLACK_GAIN * 100e-6).abs() < 1e-12,
        "correction {c}"
    );
    // A stalled worker (the step waited a second) moves it by the bound only.
    m.observe(0.0, 1.0);
    assert_eq!(m.cpu_correction_s, super::MAX_CORRECTION_S);
    // Layers that gave the CPU nothing bring it back down to zero, not below: it is not
    // stuck priced out, and an idle CPU beside a lone PCIe miss is no sign of slack.
    for _ in 0..100 {
        m.idle_layer();
    }
    assert_eq!(m.cpu_correction_s, 0.0);
    // Without the balance (the old planner, kept to measure against) nothing moves.
    let mut m = model(50e9, 50e9, 60e-6);
    m.balance = false;
    m.observe(0.0, 80e-6);
    assert_eq!((m.cpu_correction_s, m.cpu_start()), (0.0, 60e-6));
}

#[test]
fn a_gated_join_that_waited_less_than_the_copies_leaves_slack() {
    // Gated, the gate opens after the job and the stop's copies. The join waited 60 us for
    // the result, the copies land 100 us after the join began: the CPU finished 40 us
    // before them, so it could have taken more (charged less), as the hook path would
    // read a result that waited 40 us.
    let (mut gated, mut hook) = (model(50e9, 50e9, 60e-6), model(50e9, 50e9, 60e-6));
    gated.observe_join(0.0, 60e-6, 100e-6);
    hook.observe(40e-6, 0.0);
    assert!(gated.cpu_correction_s < 0.0, "{}", gated.cpu_correction_s);
    assert!((gated.cpu_correction_s - hook.cpu_correction_s).abs() < 1e-12);
    // Copies that landed 20 us into an 80 us wait: the CPU held the step 60 us.
    let mut late = model(50e9, 50e9, 60e-6);
    late.observe_join(0.0, 80e-6, 20e-6);
    assert!(late.cpu_correction_s > 0.0, "{}", late.cpu_correction_s);
    // Nothing behind (the eval-hook path): the join is the whole measure.
    let mut plain = model(50e9, 50e9, 60e-6);
    plain.observe_join(0.0, 60e-6, 0.0);
    let mut direct = model(50e9, 50e9, 60e-6);
    direct.observe(0.0, 60e-6);
    assert_eq!(plain.cpu_correction_s, direct.cpu_correction_s);
}

#[test]
fn each_path_keeps_its_own_correction() {
    let mut m = model(50e9, 50e9, 60e-6);
    m.observe(100e-6, 0.0); // the hook path: results waited, the CPU charged less
    let hook = m.cpu_correction_s;
    assert!(hook < 0.0);
    m.set_gated(true);
    assert_eq!(
        m.cpu_correction_s, 0.0,
        "gated starts from its own (none yet)"
    );
    m.observe_join(0.0, 200e-6, 0.0); // gated: the step waited
    let gated = m.cpu_correction_s;
    assert!(gated > 0.0);
    m.set_gated(false);
    assert_eq!(
        m.cpu_correction_s, hook,
        "back on the hook path, its correction"
    );
    assert_eq!(m.cpu_start(), 60e-6 + hook);
    m.set_gated(false);
    assert_eq!(m.cpu_correction_s, hook, "no switch, no swap");
    m.set_gated(true);
    assert_eq!(m.cpu_correction_s, gated);
}

#[test]
fn each_path_keeps_its_own_setpoint() {
    let mut m = model(50e9, 50e9, 60e-6);
    m.setpoint_auto = true;
    m.set_gated(true);
    for _ in 0..10 {
        m.steer_setpoint(0.78, 0.16); // gated steps with the copy engine the bottleneck
    }
    let gated = m.slack_target_s;
    assert!(gated < super::SLACK_TARGET_S);
    m.set_gated(false);
    assert_eq!(
        m.slack_target_s,
        super::SLACK_TARGET_S,
        "the hook path's own setpoint: its steps did not move it"
    );
    m.set_gated(true);
    assert_eq!(
        m.slack_target_s, gated,
        "back on the gated path, its setpoint"
    );
}

#[test]
fn split_over_links_gives_each_link_its_own_backlog() {
    // Copies take 1 ms a miss on any link, the CPU 1.5 ms. Link 0 is busy for 3 ms, link 1
    // idle: link 1's misses are copied (1, 2 ms), link 0's go to the CPU first (1.5 ms
    // against 4), then alternate as the two fill.
    let m = model(1e9, 1e9 / 1.5, 0.0);
    let links = [0, 0, 1, 1, 0];
    let cpu = m.split_links(&links, &[3e-3, 0.0], 1e6, 0.0, &[false; 5]);
    assert_eq!(cpu, [true, true, false, false, false]);
    // One link carrying all five (the same backlog): the CPU takes more.
    let one = m.split_links(&[0; 5], &[3e-3], 1e6, 0.0, &[false; 5]);
    assert_eq!(one.iter().filter(|&&c| c).count(), 3);
    // A forced miss goes to the CPU whatever it costs.
    let f = m.split_links(&[1, 1], &[0.0, 0.0], 1e6, 1.0, &[false, true]);
    assert_eq!(f, [false, true]);
}

#[test]
fn backlog_follows_what_was_queued() {
    let mut m = model(1e9, 1e9, 0.0);
    let t = std::time::Instant::now();
    m.queued(t, 1_000_000, 0); // 1 ms at 1 GB/s
    m.queued(t, 1_000_000, 0); // behind it: 2 ms
    let b = m.copy_backlog(t, 0);
    assert!((b - 2e-3).abs() < 1e-9, "backlog {b}");
    // Another device's copy engine (a layer split) has its own link: its backlog is its own.
    assert_eq!(m.copy_backlog(t, 1), 0.0);
    m.queued(t, 1_000_000, 1);
    let b1 = m.copy_backlog(t, 1);
    assert!((b1 - 1e-3).abs() < 1e-9, "device 1 backlog {b1}");
    assert!((m.copy_backlog(t, 0) - 2e-3).abs() < 1e-9);
    // Without the balance the planner sees an idle copy engine (the old planner).
    m.balance = false;
    assert_eq!(m.copy_backlog(t, 0), 0.0);
}

/// The outer loop (the default; `POCKETMOE_SLACK_TARGET_US` unset or `auto`): while the copy engine is the bottleneck
/// and busier than the CPU (the uniform rows of 2026-12-07: 0.78 against 0.16) the setpoint
/// falls, never below its floor; once the copy engine is not the bottleneck it rises back to
/// the default and no further; off where the setpoint is fixed (a number).
#[test]
fn the_setpoint_falls_while_the_copy_engine_is_the_bottleneck() {
    let mut m = model(50e9, 50e9, 60e-6);
    m.setpoint_auto = false;
    m.steer_setpoint(0.78, 0.16);
    assert_eq!(m.slack_target_s, super::SLACK_TARGET_S, "fixed");
    m.setpoint_auto = true;
    m.steer_setpoint(0.78, 0.16);
    assert!(m.slack_target_s < super::SLACK_TARGET_S, "it moved down");
    for _ in 0..1000 {
        m.steer_setpoint(0.78, 0.16);
    }
    assert_eq!(m.slack_target_s, super::SETPOINT_MIN_S, "held at the floor");
    // Busy, but the CPU busier: it goes back up, as it does where PCIe is not the bottleneck.
    m.steer_setpoint(0.7, 0.9);
    assert!(m.slack_target_s > super::SETPOINT_MIN_S);
    for _ in 0..1000 {
        m.steer_setpoint(0.3, 0.1);
    }
    assert_eq!(
        m.slack_target_s,
        super::SLACK_TARGET_S,
        "back at the default"
    );
    // The slack controller settles each stop at the setpoint the loop chose.
    m.slack_target_s = -40e-6;
    m.observe(0.0, 40e-6);
    assert_eq!(
        m.cpu_correction_s, 0.0,
        "the step waited exactly the setpoint"
    );
}
