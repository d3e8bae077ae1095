//! Burst credits (issue 28) through the monitor and the ledger, on the ideal server of
//! `common`: a full bucket lasts its seconds at the burst rate and then the limit
//! holds; another host's reservation is met in every period of a burst; a group bursts
//! as one; refusals name the fix.

mod common;

use common::Sim;
use qos_core::burst::Burst;
use qos_core::{
    BatchSize, Capacity, DomainConfig, EstimatorConfig, ExcessSharing, GroupConfig, HostConfig,
    Monitor, Nanos, Rate,
};

/// 100 ms periods (ten a second, so a burst's seconds are counted in periods), 1 ms
/// check intervals, paced release (the defaults otherwise).
fn domain(iops: u64, sharing: ExcessSharing) -> DomainConfig {
    DomainConfig {
        period: Nanos::from_millis(100),
        capacity: Capacity {
            iops: Some(iops),
            ..Capacity::default()
        },
        global_batch: BatchSize::Fixed {
            ops: 4,
            bytes: 1 << 40,
        },
        estimator: EstimatorConfig {
            enabled: false,
            ..Default::default()
        },
        sharing,
        ..DomainConfig::default()
    }
}

fn bursting(nqn: &str, limit: u64, burst: u64, seconds: u64) -> HostConfig {
    let mut h = HostConfig::new(nqn).with_limit(Rate::iops(limit));
    h.burst = Burst {
        iops: Some(burst),
        mibps: None,
        seconds: Some(seconds),
    };
    h
}

/// Periods (of `per_period`, from `from` on) within `tol` of `want`, and how many.
fn run_within(per_period: &[u64], from: usize, want: u64, tol_pct: u64) -> usize {
    per_period[from..]
        .iter()
        .take_while(|&&v| v.abs_diff(want) * 100 <= want * tol_pct)
        .count()
}

#[test]
fn a_full_bucket_runs_at_the_burst_rate_for_its_seconds_then_at_the_limit_and_the_reservation_holds()
 {
    for sharing in [ExcessSharing::FirstCome, ExcessSharing::Weighted] {
        // Capacity 100 K IOPS; a host reserving 60 K (limited to 65 K, so that weighted
        // sharing leaves the burst the rest) next to one limited to 10 K with a burst
        // to 30 K for 2 s: together at most 95 K, so the burst fits the unreserved
        // capacity and the reservation must be met throughout.
        let hosts = vec![
            (
                HostConfig::new("nqn.reserved")
                    .with_reservation(Rate::iops(60_000))
                    .with_limit(Rate::iops(65_000)),
                None,
            ),
            (bursting("nqn.burst", 10_000, 30_000, 2), Some(0)),
        ];
        // What this server gives a host limited to 30 K without a burst: weighted
        // sharing on it leaves 9 % of a limit unused whatever the limit (its claims
        // are paced), so the burst is judged against that.
        let mut reference = Sim::new(
            domain(100_000, sharing),
            vec![
                hosts[0].clone(),
                (
                    HostConfig::new("nqn.b").with_limit(Rate::iops(30_000)),
                    None,
                ),
            ],
            2,
            7,
        );
        reference.run_periods(10);
        let mut at_30k = reference.hosts[1].admitted_per_period.clone();
        at_30k.sort_unstable();
        let at_30k = at_30k[5];
        assert!(
            at_30k > 2_500,
            "{sharing:?}: a 30 K limit gave {at_30k} a period"
        );
        let mut sim = Sim::new(domain(100_000, sharing), hosts, 2, 7);
        // Idle 3 s: the bucket (full at creation anyway) stays full.
        sim.run_periods(30);
        sim.hosts[1].demand = None;
        sim.run_periods(60);
        let burst = &sim.hosts[1].admitted_per_period[30..];
        // As a 30 K limit until the bucket (2 s of the 20 K excess: 40,000) is spent:
        // 20 periods (2 s) where the server gives the whole 30 K, give or take one.
        let at_burst = run_within(burst, 0, at_30k, 2);
        let expected = 40_000 / (at_30k - 1_000) as usize;
        assert!(
            at_burst.abs_diff(expected) <= 1
                && (sharing == ExcessSharing::Weighted || expected == 20),
            "{sharing:?}: {at_burst} periods at the burst rate: {burst:?}"
        );
        // Then at its limit (1,000 a period) within 1 %, after at most one period of
        // change-over.
        let after = &burst[at_burst + 1..];
        assert!(
            after.iter().all(|&v| v.abs_diff(1_000) <= 10),
            "{sharing:?}: after the burst {after:?}"
        );
        let reserved = &sim.hosts[0].per_period[30..];
        assert!(
            reserved.iter().all(|&v| v >= 6_000),
            "{sharing:?}: reservation missed during the burst: {reserved:?}"
        );
        assert_eq!(sim.audit_gap(), [0, 0]);
    }
}

#[test]
fn without_credit_a_backlogged_host_never_exceeds_its_limit_and_never_its_burst_rate() {
    let hosts = vec![(bursting("nqn.burst", 20_000, 50_000, 1), None)];
    let mut sim = Sim::new(domain(200_000, ExcessSharing::FirstCome), hosts, 2, 3);
    sim.run_periods(40);
    let per = &sim.hosts[0].admitted_per_period;
    assert!(
        per.iter().all(|&v| v <= 5_000 + 50),
        "above the burst rate: {per:?}"
    );
    // The bucket (1 s) is spent in the first ten periods; then the limit, always.
    assert!(
        per[12..].iter().all(|&v| v <= 2_000 + 20),
        "above the limit without credit: {per:?}"
    );
    let stats = sim.monitor.stats(sim.now);
    let b = stats.hosts[0].burst.expect("a burst");
    assert!(!b.bursting && b.credit_seconds < 0.01, "{b:?}");
    assert!(b.bursting_periods >= 9, "{b:?}");
}

#[test]
fn a_host_under_its_limit_earns_credit_and_bursts_again() {
    let hosts = vec![(bursting("nqn.burst", 10_000, 20_000, 1), None)];
    let mut sim = Sim::new(domain(100_000, ExcessSharing::FirstCome), hosts, 1, 5);
    sim.run_periods(20); // spends the full bucket
    // Half its limit for 1 s earns 5,000 operations: half a second of the 10 K excess.
    sim.hosts[0].demand = Some(500);
    sim.run_periods(10);
    let b = sim.monitor.stats(sim.now).hosts[0].burst.expect("a burst");
    assert!(
        (0.45..=0.55).contains(&b.credit_seconds),
        "credit after half a second's worth: {b:?}"
    );
    sim.hosts[0].demand = None;
    sim.run_periods(10);
    let per = &sim.hosts[0].admitted_per_period[30..];
    let at_burst = run_within(per, 0, 2_000, 2);
    assert!((4..=6).contains(&at_burst), "{at_burst}: {per:?}");
}

#[test]
fn a_group_bursts_as_one_above_its_limit() {
    let d = domain(100_000, ExcessSharing::Weighted);
    let mut g = GroupConfig::new("tenant");
    g.limit = Rate::iops(20_000);
    g.burst = Burst {
        iops: Some(40_000),
        mibps: None,
        seconds: Some(1),
    };
    let member = |n: &str| {
        let mut h = HostConfig::new(n);
        h.group = Some("tenant".into());
        (h, None)
    };
    let hosts = vec![
        member("nqn.g1"),
        member("nqn.g2"),
        // Limited to 50 K, so the group's burst is not cut by its weighted share.
        (
            HostConfig::new("nqn.other")
                .with_reservation(Rate::iops(40_000))
                .with_limit(Rate::iops(50_000)),
            None,
        ),
    ];
    let mut sim = Sim::with_groups(d, vec![g], hosts, 1, 11);
    sim.run_periods(30);
    let total: Vec<u64> = (0..30)
        .map(|p| sim.hosts[0].admitted_per_period[p] + sim.hosts[1].admitted_per_period[p])
        .collect();
    // The group's limit under weighted sharing gives it 94 % of the limit on this
    // 100 ms-period server (its hosts' claims are paced), burst or not: judge the
    // burst against what the same server gives the limit, twice it.
    let at_limit = total[29];
    assert!(at_limit <= 2_000, "group above its limit: {total:?}");
    let at_burst = run_within(&total, 0, 2 * at_limit, 3);
    assert!((9..=12).contains(&at_burst), "{at_burst}: {total:?}");
    assert!(
        total[at_burst + 1..].iter().all(|&v| v <= 2_000),
        "group above its limit without credit: {total:?}"
    );
    assert!(sim.hosts[2].per_period.iter().all(|&v| v >= 4_000));
}

#[test]
fn bad_bursts_are_refused_with_the_fix() {
    let mut m = Monitor::new(
        domain(100_000, ExcessSharing::FirstCome),
        Nanos::from_secs(1),
    )
    .expect("valid domain");
    let refused = |m: &mut Monitor, h: HostConfig| {
        m.add_host(h, Nanos::from_secs(1))
            .expect_err("refused")
            .to_string()
    };
    let below = refused(&mut m, bursting("nqn.a", 10_000, 5_000, 10));
    assert!(below.contains("below its limit 10000 IOPS"), "{below}");
    for seconds in [0, 86_401] {
        let msg = refused(&mut m, bursting("nqn.a", 10_000, 20_000, seconds));
        assert!(msg.contains("give burst_seconds in that range"), "{msg}");
    }
    let mut no_limit = bursting("nqn.a", 1, 20_000, 10);
    no_limit.limit = Default::default();
    let msg = refused(&mut m, no_limit);
    assert!(msg.contains("set max_iops"), "{msg}");
    let mut no_seconds = bursting("nqn.a", 10_000, 20_000, 10);
    no_seconds.burst.seconds = None;
    assert!(refused(&mut m, no_seconds).contains("needs burst_seconds"));
    let mut only_seconds = bursting("nqn.a", 10_000, 20_000, 10);
    only_seconds.burst.iops = None;
    assert!(refused(&mut m, only_seconds).contains("without a burst rate"));
    // A bucket shorter than the period is refused too (a 2 s period needs 2 s).
    let mut d = domain(100_000, ExcessSharing::FirstCome);
    d.period = Nanos::from_secs(2);
    d.check_interval = Nanos::from_millis(1);
    let mut m2 = Monitor::new(d, Nanos::from_secs(1)).expect("valid domain");
    let msg = refused(&mut m2, bursting("nqn.a", 10_000, 20_000, 1));
    assert!(msg.contains("outside 2 ..= 86400 s"), "{msg}");
}
