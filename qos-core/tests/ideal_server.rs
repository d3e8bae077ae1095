//! Seeded simulations of the ledger and monitor on an ideal server: the guarantees the
//! papers promise, checked as properties over random admissible configurations.

mod common;

use common::Sim;
use proptest::prelude::*;
use qos_core::{
    BatchSize, Capacity, DomainConfig, HostConfig, Nanos, Rate, ReservationRelease, TokenMode,
};

fn domain(capacity: u64, mode: TokenMode) -> DomainConfig {
    DomainConfig {
        period: Nanos::from_millis(100),
        check_interval: Nanos::from_millis(1),
        capacity: Capacity {
            iops: Some(capacity),
            ..Capacity::default()
        },
        mode,
        estimator: qos_core::EstimatorConfig {
            enabled: false,
            ..Default::default()
        },
        ..DomainConfig::default()
    }
}

/// Reservations as fractions (per mille) of the capacity, scaled to sum to `reserved_milli`.
fn hosts_from(weights: &[u64], reserved_milli: u64, capacity: u64) -> Vec<HostConfig> {
    let total: u64 = weights.iter().sum::<u64>().max(1);
    weights
        .iter()
        .enumerate()
        .map(|(i, w)| {
            let r = capacity * reserved_milli / 1000 * w / total;
            let h = HostConfig::new(format!("nqn.2026-11.io.test:h{i}"));
            if r > 0 {
                h.with_reservation(Rate::iops(r))
            } else {
                h
            }
        })
        .collect()
}

proptest! {
    // A fixed seed: the same 24 cases in every run, so a rare case found by chance does
    // not turn main red in an unrelated change (one did: `paced_release_at_94_percent_
    // reserved...` below, now fixed). `PROPTEST_RNG_SEED` does not override a fixed
    // seed: to explore, set `cases` high and `RngSeed::Random` here (10,000 random
    // cases of the first property passed on 2026-11-30, in 55 s with `--release`).
    #![proptest_config(ProptestConfig {
        cases: 24,
        rng_seed: proptest::test_runner::RngSeed::Fixed(20261130),
        .. ProptestConfig::default()
    })]

    /// Haechi's guarantee: a continuously backlogged host of an admissible set gets at
    /// least its reservation in every period, whatever the others do.
    #[test]
    fn backlogged_hosts_get_their_reservation(
        weights in proptest::collection::vec(0u64..10, 2..8),
        reserved_milli in 100u64..950,
        seed in any::<u64>(),
        channels in 1usize..3,
        mode in prop_oneof![Just(TokenMode::Haechi), Just(TokenMode::Basic)],
        release in prop_oneof![Just(ReservationRelease::Start), Just(ReservationRelease::Paced)],
    ) {
        let cap = 100_000;
        let hosts = hosts_from(&weights, reserved_milli, cap);
        let reservations: Vec<u64> = hosts.iter().map(|h| h.reservation.total.iops.unwrap_or(0)).collect();
        let d = DomainConfig { release, ..domain(cap, mode) };
        let mut sim = Sim::new(d, hosts.into_iter().map(|h| (h, None)).collect(), channels, seed);
        sim.run_periods(4);
        for (i, h) in sim.hosts.iter().enumerate() {
            let r = reservations[i] / 10; // per 100 ms period
            // Up to one reservation batch per channel may sit in a thread's cache at
            // the instant the period ends.
            let slack = channels as u64 * (r / 1024).max(1);
            for (p, &done) in h.admitted_per_period.iter().enumerate().skip(1) {
                prop_assert!(done + slack >= r, "host {i} period {p}: admitted {done} < reservation {r} - {slack}");
            }
        }
        // Released at the period's start, the pool is Haechi's: the estimate less the
        // reservations, so tokens out never exceed what the period can serve. Paced,
        // first come is work-conserving: its pool does not bind while nothing lags
        // (the hosts' queue depth bounds what is out), and the reservations above are
        // what it still promises.
        if release == ReservationRelease::Start {
            prop_assert!(sim.max_excess <= 0, "outstanding tokens exceeded the remaining capacity by {}", sim.max_excess);
        }
        prop_assert_eq!(sim.audit_gap(), [0, 0]);
    }

    /// No host ever completes more than its limit in a period.
    #[test]
    fn no_host_exceeds_its_limit(
        // At least one command per 100 ms period: lower limits are refused
        // (config::tests::rates_below_one_command_per_period_are_refused).
        limits in proptest::collection::vec(10u64..60_000, 1..6),
        seed in any::<u64>(),
        channels in 1usize..4,
    ) {
        let cap = 100_000;
        let hosts: Vec<_> = limits
            .iter()
            .enumerate()
            .map(|(i, l)| (HostConfig::new(format!("nqn.l{i}")).with_limit(Rate::iops(*l)), None))
            .collect();
        let mut sim = Sim::new(domain(cap, TokenMode::Haechi), hosts, channels, seed);
        sim.run_periods(3);
        for (i, h) in sim.hosts.iter().enumerate() {
            for &done in h.admitted_per_period.iter().skip(1) {
                prop_assert!(done <= limits[i] / 10, "host {i}: {done} > limit {}", limits[i] / 10);
            }
        }
        prop_assert_eq!(sim.audit_gap(), [0, 0]);
    }

    /// Same inputs, same trace.
    #[test]
    fn same_seed_same_trace(seed in any::<u64>(), weights in proptest::collection::vec(1u64..5, 2..5)) {
        let run = || {
            let hosts = hosts_from(&weights, 800, 50_000);
            let demand = |i: usize| if i == 0 { Some(500) } else { None };
            let mut sim = Sim::new(
                domain(50_000, TokenMode::Haechi),
                hosts.into_iter().enumerate().map(|(i, h)| (h, demand(i))).collect(),
                2,
                seed,
            );
            sim.run_periods(3);
            sim.hosts.iter().map(|h| h.per_period.clone()).collect::<Vec<_>>()
        };
        prop_assert_eq!(run(), run());
    }
}

/// Haechi experiment 2B in miniature: two hosts under-use their reservation. With
/// conversion the others get the unused capacity; basic Haechi (its pool bound by the
/// estimate less the reservations, released at the period's start) wastes it. Paced,
/// first come's pool does not bind while no reservation is behind, so the others get
/// it even without conversion.
#[test]
fn conversion_gives_unused_reservation_to_busy_hosts() {
    let cap = 100_000;
    let run = |mode, release| {
        let hosts = hosts_from(&[3, 3, 1, 1, 1, 1], 900, cap);
        let demand = |i: usize| if i < 2 { Some(1_000) } else { None };
        let mut sim = Sim::new(
            DomainConfig {
                release,
                ..domain(cap, mode)
            },
            hosts
                .into_iter()
                .enumerate()
                .map(|(i, h)| (h, demand(i)))
                .collect(),
            2,
            7,
        );
        sim.run_periods(4);
        let total: u64 = sim.hosts.iter().map(|h| h.per_period[2]).sum();
        assert_eq!(sim.audit_gap(), [0, 0]);
        total
    };
    let haechi = run(TokenMode::Haechi, ReservationRelease::Paced);
    let basic = run(TokenMode::Basic, ReservationRelease::Start);
    let basic_paced = run(TokenMode::Basic, ReservationRelease::Paced);
    // Per 100 ms period the server can do 10,000.
    assert!(haechi >= 9_800, "Haechi keeps the server busy: {haechi}");
    assert!(
        basic < 9_000,
        "basic Haechi wastes unused reservation: {basic}"
    );
    assert!(
        basic_paced >= 9_800,
        "a work-conserving pool keeps the server busy: {basic_paced}"
    );
}

/// A 20% fixed batch and several channels: tokens cached at a roll-over expire, and
/// the books still balance. (Large global batches are taken from the pool by the
/// channels themselves only when sharing is first come.)
#[test]
fn large_batches_balance_the_books() {
    let mut d = domain(20_000, TokenMode::Haechi);
    d.release = ReservationRelease::Start;
    d.sharing = qos_core::ExcessSharing::FirstCome;
    d.global_batch = BatchSize::Fixed {
        ops: 400,
        bytes: 1 << 30,
    };
    let hosts = hosts_from(&[1, 2, 3], 500, 20_000);
    let mut sim = Sim::new(d, hosts.into_iter().map(|h| (h, None)).collect(), 3, 99);
    sim.run_periods(5);
    assert_eq!(sim.audit_gap(), [0, 0]);
    let expired: u64 = sim
        .hosts
        .iter()
        .map(|h| h.channels[0].host().counters().expired.ops)
        .sum();
    assert!(expired > 0, "some cached tokens expired at roll-overs");
}

/// Haechi Example 2 at scale (C_G = 100 K, C_L = 50 K, R_1 = 40 K, R_2..5 = 10 K): with
/// the whole reservation released at the period start, the four small hosts spend
/// theirs at an equal share of the server and client 1 cannot catch up at C_L; with
/// paced release it gets its reservation.
#[test]
fn paced_release_rescues_haechi_example_2() {
    let run = |release| {
        let mut d = domain(100_000, TokenMode::Haechi);
        d.per_host_max = Rate::iops(50_000);
        d.release = release;
        let hosts = [40_000u64, 10_000, 10_000, 10_000, 10_000]
            .iter()
            .enumerate()
            .map(|(i, r)| {
                (
                    HostConfig::new(format!("nqn.ex2:c{}", i + 1)).with_reservation(Rate::iops(*r)),
                    None,
                )
            })
            .collect();
        let mut sim = Sim::new(d, hosts, 1, 3);
        sim.run_periods(4);
        assert_eq!(sim.audit_gap(), [0, 0]);
        sim.hosts[0].admitted_per_period[1..]
            .iter()
            .copied()
            .min()
            .unwrap()
    };
    let start = run(ReservationRelease::Start);
    let paced = run(ReservationRelease::Paced);
    eprintln!("client 1 per 100 ms period: start {start}, paced {paced} (reservation 4000)");
    assert!(
        start < 3600,
        "release at start misses by more than 10%: {start}"
    );
    assert!(paced >= 3940, "paced release meets 98.5% of it: {paced}");
}

/// Weighted sharing on the ideal server: backlogged hosts without reservations get the
/// capacity in proportion to their weights (within 5%), and the books balance.
#[test]
fn backlogged_hosts_share_by_weight() {
    let cap = 100_000;
    let weights = [4u32, 3, 2, 1];
    let hosts = weights
        .iter()
        .enumerate()
        .map(|(i, &w)| {
            let mut h = HostConfig::new(format!("nqn.w{i}"));
            h.weight = w;
            (h, None)
        })
        .collect();
    let d = DomainConfig {
        sharing: qos_core::ExcessSharing::Weighted,
        ..domain(cap, TokenMode::Haechi)
    };
    let mut sim = Sim::new(d, hosts, 2, 5);
    sim.run_periods(4);
    assert_eq!(sim.audit_gap(), [0, 0]);
    let total: u64 = sim.hosts.iter().map(|h| h.admitted_per_period[3]).sum();
    for (i, h) in sim.hosts.iter().enumerate() {
        let want = total as f64 * weights[i] as f64 / 10.0;
        let got = h.admitted_per_period[3] as f64;
        assert!(
            (got - want).abs() <= 0.05 * want,
            "host {i} (weight {}): {got} of {total}, share {want}",
            weights[i]
        );
    }
    assert!(total >= 9_500, "work-conserving: {total} of 10,000");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 16, .. ProptestConfig::default() })]

    /// A tenant group never gets more than its limit in a period (its hosts' own
    /// reservations included), whatever the weights and the other hosts; its
    /// reservation is met; the token books balance.
    #[test]
    fn a_group_stays_within_its_limit(
        limit_pct in 20u64..70,
        weights in proptest::collection::vec(1u32..8, 4),
        seed in any::<u64>(),
    ) {
        let cap = 100_000u64;
        let d = DomainConfig {
            sharing: qos_core::ExcessSharing::Weighted,
            ..domain(cap, TokenMode::Haechi)
        };
        let mut monitor_groups = vec![qos_core::GroupConfig {
            name: "g".into(),
            reservation: Rate::iops(cap * 10 / 100),
            limit: Rate::iops(cap * limit_pct / 100),
            weight: weights[0],
            burst: qos_core::burst::Burst::NONE,
        }];
        let hosts: Vec<_> = (0..4)
            .map(|i| {
                let mut h = HostConfig::new(format!("nqn.g{i}")).with_reservation(Rate::iops(cap * 5 / 100));
                h.weight = weights[i];
                if i < 2 {
                    h.group = Some("g".into());
                }
                (h, None)
            })
            .collect();
        let mut sim = Sim::with_groups(d, std::mem::take(&mut monitor_groups), hosts, 2, seed);
        sim.run_periods(3);
        prop_assert_eq!(sim.audit_gap(), [0, 0]);
        let per_period_limit = cap * limit_pct / 100 / 10; // 100 ms periods
        for p in 1..3 {
            let g = sim.hosts[0].admitted_per_period[p] + sim.hosts[1].admitted_per_period[p];
            prop_assert!(g <= per_period_limit + 2, "period {p}: group {g} > limit {per_period_limit}");
            prop_assert!(g + 4 >= cap / 100, "period {p}: group {g} < reservation {}", cap / 100);
        }
    }
}

/// Found by the property above with a random seed in CI on 2026-11-30: reservations of
/// 93.7 % of the capacity released paced (`first_come`, Basic tokens, one channel). The
/// ideal server's round robin starts at a random host and goes in index order, so the
/// last host gets the fewest of a step's leftover slots: host 6 completed 2,748 of its
/// 2,776 in period 0 (1.0 % short, lagging all period), was judged to lag in vain (its
/// own queue depth) and served 2,577 (its completions less a sixteenth) for two
/// periods, and got 2,612 in period 1, while the unreserved hosts took 523 with global
/// tokens: holding them could have closed its gap. A host now lags in vain only when
/// the others' global work of the period was less than its shortfall
/// (`LaggedShort::in_vain`).
#[test]
fn paced_release_at_94_percent_reserved_meets_every_reservation() {
    let weights = [0u64, 0, 5, 0, 6, 8, 8];
    let cap = 100_000;
    let hosts = hosts_from(&weights, 937, cap);
    let reservations: Vec<u64> = hosts
        .iter()
        .map(|h| h.reservation.total.iops.unwrap_or(0))
        .collect();
    let d = DomainConfig {
        release: ReservationRelease::Paced,
        ..domain(cap, TokenMode::Basic)
    };
    let hosts = hosts.into_iter().map(|h| (h, None)).collect();
    let mut sim = Sim::new(d, hosts, 1, 16_967_706_285_108_199_772);
    sim.run_periods(4);
    for (i, h) in sim.hosts.iter().enumerate() {
        let r = reservations[i] / 10;
        for (p, &done) in h.admitted_per_period.iter().enumerate().skip(1) {
            assert!(
                done + 2 >= r,
                "host {i} period {p}: admitted {done} < reservation {r} - 2"
            );
        }
    }
}
