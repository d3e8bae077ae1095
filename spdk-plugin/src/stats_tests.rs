//! The stats RPC's answer, byte for byte, and its schema. Goldens of every form
//! (`spdk-plugin/tests/stats-golden/`), written by the code before its `json!` parts
//! became typed, so that changing how the answer is built cannot change the answer
//! (field names, their order, how numbers print); `UPDATE_GOLDEN=1` rewrites them, for a
//! change of the answer that is meant. And `rpc-scripts/schema/stats.json`, read off the
//! types that write the answer over sample domains (`stats_probe.rs`) and compared with
//! the committed file (`UPDATE_SCHEMA=1` rewrites it; the readers' tests read it).

use std::collections::BTreeSet;
use std::path::PathBuf;

use qos_core::burst::Burst;
use qos_core::config::{PriorityClass, Rate, RateSet};
use qos_core::depth::{CurvePoint, OperatingPoint, OperatingTarget};
use qos_core::estimator::{EstimateStep, Evidence};
use qos_core::histogram::HeldTimeSnapshot;
use qos_core::monitor::{
    BurstStats, DomainStats, Entitlement, EstimatorRecord, GroupStats, HostStats, PeriodCounts,
    PeriodRecord,
};
use qos_core::{Amount, ExcessSharing, GroupConfig, HoldCounts, HostConfig, Monitor, Nanos};
use serde_json::json;

use crate::params::{DomainParams, GroupParams, HostParams};
use crate::stats::{self, Shape, Source};

fn golden(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/stats-golden")
        .join(name)
}

/// Compares `text` with the golden `name` (or rewrites it with `UPDATE_GOLDEN=1`).
fn check_golden(name: &str, text: &str) {
    let path = golden(name);
    if std::env::var_os("UPDATE_GOLDEN").is_some_and(|v| v == "1") {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, text).unwrap();
        return;
    }
    let committed = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (UPDATE_GOLDEN=1 writes it)", path.display()));
    if committed != text {
        let at = committed
            .bytes()
            .zip(text.bytes())
            .position(|(a, b)| a != b)
            .unwrap_or(committed.len().min(text.len()));
        let from = at.saturating_sub(80);
        panic!(
            "qos_stats_get's answer differs from {} at byte {at}:\n  golden: ...{}\n  now:    ...{}\n\
             If the change is meant: UPDATE_GOLDEN=1 SPDK_DIR=/opt/spdk cargo test -p spdk-plugin \
             stats::tests, then regenerate rpc-scripts/schema/stats.json (UPDATE_SCHEMA=1)",
            path.display(),
            &committed[from..(at + 80).min(committed.len())],
            &text[from..(at + 80).min(text.len())],
        );
    }
}

/// A monitor with a tenant group (a burst on the group and on one of its hosts), a lone
/// host, a best-effort host no `qos_host_set` configured, and a few ended periods.
fn monitor() -> (Monitor, Nanos, BTreeSet<String>) {
    let params: DomainParams = serde_json::from_value(json!({
        "name": "d0", "capacity_iops": 100_000, "capacity_mibps": 800, "estimator": false,
        "sharing": "weighted", "period_ms": 100,
    }))
    .unwrap();
    let cfg = params.to_config().unwrap();
    let period = cfg.period;
    let mut m = Monitor::new(cfg, Nanos::ZERO).unwrap();
    let group: GroupParams = serde_json::from_value(json!({
        "domain": "d0", "name": "g1", "min_iops": 20_000, "max_iops": 40_000, "weight": 3,
        "burst_iops": 60_000, "burst_seconds": 5,
    }))
    .unwrap();
    m.add_group(group.to_config(), Nanos::ZERO).unwrap();
    let hosts = [
        json!({"domain": "d0", "host_nqn": "nqn.h1", "min_iops": 5000, "max_iops": 10_000,
               "burst_iops": 15_000, "burst_seconds": 2, "group": "g1", "weight": 2,
               "priority": "high"}),
        json!({"domain": "d0", "host_nqn": "nqn.h2", "min_read_iops": 1000, "max_write_mibps": 50,
               "soft_min_iops": 2000}),
        json!({"domain": "d0", "host_nqn": "nqn.implicit"}),
    ];
    for h in hosts {
        let h: HostParams = serde_json::from_value(h).unwrap();
        m.add_host(h.to_config(), Nanos::ZERO).unwrap();
    }
    let mut at = Nanos::ZERO;
    for _ in 0..5 {
        at = at.saturating_add(period);
        m.tick(at);
    }
    // A third into the period in progress.
    let now = at.saturating_add(Nanos(period.0 / 3));
    m.tick(now);
    (m, now, ["nqn.implicit".to_string()].into_iter().collect())
}

#[test]
fn every_form_of_a_monitor_is_as_before() {
    let (m, now, implicit) = monitor();
    let d = Source {
        monitor: &m,
        implicit: &implicit,
        now,
    };
    let shape = |periods, compact, host_nqn| Shape {
        periods,
        compact,
        counters: false,
        host_nqn,
    };
    let forms = [
        ("full.json", shape(3, false, None)),
        ("compact.json", shape(3, true, None)),
        ("one-host.json", shape(2, false, Some("nqn.h1"))),
        ("no-host.json", shape(2, false, Some(""))),
    ];
    for (name, s) in forms {
        check_golden(name, &(stats::domain("d0", &d, s) + "\n"));
    }
}

/// A host with every field set (the core's statistics as they are once the depth curve
/// has samples, a period has ended and the host bursts).
pub(crate) fn sample_host() -> HostStats {
    let a = |ops, bytes| Amount::new(ops, bytes);
    HostStats {
        host_nqn: "nqn.2014-08.org.example:h1".into(),
        config: HostConfig {
            host_nqn: "nqn.2014-08.org.example:h1".into(),
            reservation: RateSet::total(Rate::iops(5000)),
            limit: RateSet {
                total: Rate {
                    iops: Some(10_000),
                    mibps: Some(400),
                },
                read: Rate::iops(8000),
                write: Rate::mibps(200),
            },
            weight: 2,
            priority: PriorityClass::High,
            soft_reservation: Rate::iops(6000),
            group: Some("g1".into()),
            burst: Burst {
                iops: Some(15_000),
                mibps: Some(500),
                seconds: Some(2),
            },
        },
        completed_this_period: a(1234, 5_054_464),
        completed_ios_this_period: 1200,
        last_periods: vec![a(4999, 20_475_904), a(5001, 20_484_096)],
        reservation_met_fraction: 0.75,
        reservation_per_period: a(500, u64::MAX),
        soft_granted: a(100, 409_600),
        reservation_tokens: a(17, u64::MAX),
        credit_tokens: a(3, 12_288),
        limit_left: a(u64::MAX, u64::MAX),
        held_now: 4,
        underuse_flag: true,
        reservation_at_risk: true,
        completed_total: a(987_654, 4_045_430_784),
        completed_ios_total: 980_000,
        admitted_ios_total: 980_004,
        in_flight: a(4, 16_384),
        hold_events_total: 321,
        holds: HoldCounts {
            held_by: [10, 2, 30, 4, 5, 6],
            bypassed: 7,
        },
        held_time: HeldTimeSnapshot {
            cumulative: vec![1, 5, 9],
            sum_ns: 123_456,
            held_ios: 17,
        },
        period_counts: PeriodCounts {
            met: 10,
            missed: 1,
            met_backlogged: 4,
            missed_backlogged: 2,
        },
        group: Some("g1".into()),
        excess_granted: a(42, 172_032),
        reservation_unreachable: true,
        in_flight_at_base_milli: 1500,
        reservation_depth_needed_milli: Some(250),
        burst: Some(BurstStats {
            credit_seconds: 1.25,
            credit: a(30_000, 0),
            bursting: true,
            bursting_periods: 12,
        }),
        entitlement: Some(Entitlement {
            contending: true,
            held_fraction_milli: 625,
            at_target_milli: 7125,
            at_target_peak: 12,
            cap: 12_000,
            entitled: 9000,
            achieved: 8000,
            shortfall: 1000,
            queue_depth_needed_milli: 4800,
        }),
    }
}

/// A domain with every field set, the host above and a group with a burst.
pub(crate) fn sample_domain() -> DomainStats {
    let a = |ops, bytes| Amount::new(ops, bytes);
    DomainStats {
        epoch: 42,
        period_ns: 100_000_000,
        elapsed_ns: 33_333_333,
        budget: a(10_000, u64::MAX),
        capacity_learning: false,
        reserved: a(5500, 0),
        global_available: a(2500, u64::MAX),
        bypass: true,
        pool_paced: true,
        sharing: ExcessSharing::Weighted,
        efficiency_milli: 970,
        operating_target: OperatingTarget::Efficiency(970),
        operating_point: Some(OperatingPoint {
            in_flight_milli: 16_500,
            rate: 99_000,
            max_rate: 101_000,
            latency: Nanos(166_666),
        }),
        circulation: None,
        depth_curve: vec![
            CurvePoint {
                in_flight_milli: 1000,
                rate: 10_000,
            },
            CurvePoint {
                in_flight_milli: 16_500,
                rate: 99_000,
            },
        ],
        hosts: vec![sample_host()],
        groups: vec![GroupStats {
            name: "g1".into(),
            config: GroupConfig {
                name: "g1".into(),
                reservation: Rate::iops(20_000),
                limit: Rate {
                    iops: Some(40_000),
                    mibps: Some(1000),
                },
                weight: 3,
                burst: Burst {
                    iops: Some(60_000),
                    mibps: None,
                    seconds: Some(5),
                },
            },
            hosts: vec!["nqn.2014-08.org.example:h1".into()],
            completed_this_period: a(1234, 5_054_464),
            reservation_per_period: a(2000, 0),
            limit_per_period: a(4000, u64::MAX),
            given_this_period: a(300, 0),
            burst: Some(BurstStats {
                credit_seconds: 4.5,
                credit: a(270_000, 0),
                bursting: false,
                bursting_periods: 3,
            }),
        }],
    }
}

pub(crate) fn sample_history() -> Vec<PeriodRecord> {
    (40..42)
        .map(|epoch| PeriodRecord {
            epoch,
            completed: Amount::new(5000 + epoch, 20_480_000),
            completed_ios: 5000,
            reservation: Amount::new(500, 0),
            soft_granted: Amount::ZERO,
            met: epoch % 2 == 0,
            backlogged: true,
        })
        .collect()
}

pub(crate) fn sample_estimator_record() -> EstimatorRecord {
    EstimatorRecord {
        epoch: 41,
        budget: 10_000,
        used: 9800,
        offered: 10_100,
        evidence: Evidence::DepthBound,
        step: EstimateStep::Held,
        next: 10_000,
        longest_tick_gap_ns: 2_000_000,
    }
}

/// The sample domain over the hosts' circulation (issue 39): N* = 110 given, the
/// operating point the hosts ran at, and what the hold targets act on.
fn over_circulation() -> DomainStats {
    let mut s = sample_domain();
    s.sharing = ExcessSharing::OperatingPoint;
    s.operating_target = OperatingTarget::InFlight(110_000);
    s.operating_point = Some(OperatingPoint {
        in_flight_milli: 110_000,
        rate: 480_000,
        max_rate: 517_000,
        latency: Nanos(229_166),
    });
    s.circulation = Some(qos_core::CirculationStats {
        commands: 160,
        hold_target: 50,
        held: 49,
        learned: None,
    });
    s
}

/// N* to be learned, before the learner's first triplet (nothing held yet).
fn learning_circulation() -> DomainStats {
    let mut s = learned_circulation();
    if let Some(c) = s.circulation.as_mut() {
        c.learned = Some(qos_core::circulation::ProbeReport {
            n_star: None,
            ratio_milli: None,
            last_ratio_milli: None,
            triplets: 0,
        });
    }
    s
}

/// The same with N* learned for η (`operating_over_circulation`).
fn learned_circulation() -> DomainStats {
    let mut s = over_circulation();
    s.operating_target = OperatingTarget::Circulation(970);
    if let Some(c) = s.circulation.as_mut() {
        c.learned = Some(qos_core::circulation::ProbeReport {
            n_star: Some(110),
            ratio_milli: Some(975),
            last_ratio_milli: Some(981),
            triplets: 40,
        });
    }
    s
}

/// The parts of the answer that a monitor without I/O leaves out (the operating point,
/// the entitlements, the bursts' credit, every counter above 0), from a domain with every
/// field set.
#[test]
fn every_part_of_a_full_domain_is_as_before() {
    let s = sample_domain();
    let implicit = BTreeSet::new();
    let h = &s.hosts[0];
    let groups: Vec<_> = s.groups.iter().map(stats::group_out).collect();
    let parts = [
        (
            "compact_host",
            serde_json::to_string(&stats::compact_host(&implicit, h)),
        ),
        (
            "full_host",
            serde_json::to_string(&stats::full_host(&implicit, h, &sample_history(), 2)),
        ),
        (
            "operating_point",
            serde_json::to_string(&stats::operating_point(&s)),
        ),
        (
            "operating_point_over_circulation",
            serde_json::to_string(&stats::operating_point(&over_circulation())),
        ),
        (
            "operating_point_learned_circulation",
            serde_json::to_string(&stats::operating_point(&learned_circulation())),
        ),
        ("groups", serde_json::to_string(&groups)),
        ("sharing", serde_json::to_string(&s.sharing)),
    ];
    let text: String = parts
        .into_iter()
        .map(|(name, json)| format!("{name}: {}\n", json.unwrap()))
        .collect();
    check_golden("parts.txt", &text);
}

// The schema of the answer, read off the types that write it: compared with
// `rpc-scripts/schema/stats.json`, which the readers' tests read.

#[path = "../../rpc-scripts/schema/stats_probe.rs"]
mod stats_probe;

/// Domains that together give every field of the answer a value, and leave out or
/// null every field that can be (each variant of the operating target once).
fn samples() -> Vec<(DomainStats, Vec<PeriodRecord>)> {
    let every = sample_domain();
    let mut wide = sample_domain();
    let rate = |iops, mibps| Rate {
        iops: Some(iops),
        mibps: Some(mibps),
    };
    wide.hosts[0].config.reservation = RateSet {
        total: rate(1, 2),
        read: rate(3, 4),
        write: rate(5, 6),
    };
    wide.hosts[0].config.limit = wide.hosts[0].config.reservation;
    wide.groups[0].config.reservation = rate(7, 8);
    wide.groups[0].config.burst.mibps = Some(9);
    wide.operating_target = OperatingTarget::InFlight(16_000);
    // Every amount bounded (the others have unlimited ones: `null`).
    let bounded = Amount::new(1, 4096);
    (wide.budget, wide.global_available) = (bounded, bounded);
    let h = &mut wide.hosts[0];
    (h.reservation_per_period, h.reservation_tokens, h.limit_left) = (bounded, bounded, bounded);
    wide.groups[0].limit_per_period = bounded;
    wide.hosts[0].entitlement.as_mut().unwrap().cap = u64::MAX;
    let mut latency = sample_domain();
    latency.operating_target = OperatingTarget::Latency(Nanos(200_000));
    latency.hosts[0].config.burst = Burst::default();
    latency.groups[0].config.burst = Burst::default();
    // Each rate with one of its two numbers.
    let one_each = RateSet {
        total: Rate::mibps(100),
        read: Rate::mibps(50),
        write: Rate::iops(1000),
    };
    (
        latency.hosts[0].config.reservation,
        latency.hosts[0].config.limit,
    ) = (one_each, one_each);
    latency.groups[0].config.reservation = Rate::mibps(100);
    latency.groups[0].config.limit = Rate::iops(1000);
    let mut rates = sample_domain();
    let the_other_each = RateSet {
        total: Rate::iops(1000),
        read: Rate::iops(500),
        write: Rate::mibps(50),
    };
    (
        rates.hosts[0].config.reservation,
        rates.hosts[0].config.limit,
    ) = (the_other_each, the_other_each);
    rates.groups[0].config.reservation = Rate::iops(1000);
    rates.groups[0].config.limit = Rate::mibps(100);
    let mut empty = sample_domain();
    empty.capacity_learning = true;
    empty.operating_point = None;
    empty.depth_curve.clear();
    // Every amount unlimited (`null`).
    let unlimited = Amount::new(u64::MAX, u64::MAX);
    (empty.budget, empty.reserved, empty.global_available) = (unlimited, unlimited, unlimited);
    let h = &mut empty.hosts[0];
    (h.reservation_per_period, h.in_flight, h.excess_granted) = (unlimited, unlimited, unlimited);
    (h.reservation_tokens, h.credit_tokens) = (unlimited, unlimited);
    (h.limit_left, h.soft_granted) = (unlimited, unlimited);
    (
        h.entitlement,
        h.burst,
        h.reservation_depth_needed_milli,
        h.group,
    ) = (None, None, None, None);
    h.config.reservation = RateSet::NONE;
    h.config.limit = RateSet::NONE;
    h.config.burst = Burst::default();
    h.last_periods.clear();
    let g = &mut empty.groups[0];
    g.burst = None;
    (g.completed_this_period, g.given_this_period) = (unlimited, unlimited);
    (g.reservation_per_period, g.limit_per_period) = (unlimited, unlimited);
    (g.config.reservation, g.config.limit) = (Rate::NONE, Rate::NONE);
    vec![
        (every, sample_history()),
        (wide, sample_history()),
        (latency, sample_history()),
        (rates, sample_history()),
        (over_circulation(), sample_history()),
        (learned_circulation(), sample_history()),
        (learning_circulation(), sample_history()),
        (empty, Vec::new()),
    ]
}

/// The recorded samples of each form: (full, compact).
fn recorded_forms() -> (stats_probe::Node, stats_probe::Node) {
    let implicit = BTreeSet::new();
    let records = [sample_estimator_record()];
    let samples = samples();
    let mut full = Vec::new();
    let mut compact = Vec::new();
    for (s, hist) in &samples {
        let hosts = s.hosts.iter();
        let f = hosts
            .clone()
            .map(|h| stats::full_host(&implicit, h, hist, 8))
            .collect();
        let estimator = Some(records.iter().collect());
        full.push(stats_probe::record(&stats::domain_out(
            "d0",
            s,
            stats::Hosts::Full(f),
            estimator,
        )));
        let c = hosts.map(|h| stats::compact_host(&implicit, h)).collect();
        compact.push(stats_probe::record(&stats::domain_out(
            "d0",
            s,
            stats::Hosts::Compact(c),
            None,
        )));
    }
    (stats_probe::form(&full), stats_probe::form(&compact))
}

#[test]
fn stats_schema_matches_rpc_scripts_schema() {
    let (full, compact) = recorded_forms();
    // The answer is an array of domains.
    let text = stats_probe::render(
        &stats_probe::array_of(&full),
        &stats_probe::array_of(&compact),
        "the tests of spdk-plugin/src/stats.rs (UPDATE_SCHEMA=1 rewrites this file); the \
         readers' tests check what they read against it",
    );
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../rpc-scripts/schema/stats.json");
    stats_probe::check_golden(
        &path,
        &text,
        "SPDK_DIR=/opt/spdk cargo test -p spdk-plugin stats_schema",
    );
}
