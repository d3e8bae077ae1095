//! The control plane at a thousand hosts, without SPDK: a domain of 1,024 hosts with a
//! full history, the statistics RPC's forms built from it, and `qos_host_set`'s change
//! of the monitor. The tests check what the forms say; the ignored one prints what
//! they cost (run it under callgrind for instruction counts, see docs/benchmarks.md).

use std::collections::BTreeSet;
use std::hint::black_box;
use std::time::Instant;

use qos_core::{Monitor, Nanos};
use serde_json::{Value, json};

use crate::params::{DEFAULT_STATS_PERIODS, DomainParams, HostParams};
use crate::stats::{self, Source};

const HOSTS: usize = 1024;

fn nqn(i: usize) -> String {
    format!("nqn.2014-08.io.example:host-{i:04}")
}

fn host(i: usize, max_iops: u64) -> HostParams {
    serde_json::from_value(json!({
        "domain": "d0", "host_nqn": nqn(i), "min_iops": 1000, "max_iops": max_iops,
    }))
    .unwrap()
}

/// A domain with `hosts` hosts (what `exporter/tools/stats_cost.py` configures) and a
/// full history: more ended periods than the monitor keeps. Returns the monitor and
/// the time of its last tick.
fn domain_with_history(hosts: usize) -> (Monitor, Nanos) {
    let params: DomainParams = serde_json::from_value(
        json!({"name": "d0", "capacity_iops": 4_000_000, "estimator": false}),
    )
    .unwrap();
    let cfg = params.to_config().unwrap();
    let period = cfg.period;
    let mut monitor = Monitor::new(cfg, Nanos::ZERO).unwrap();
    for i in 0..hosts {
        monitor
            .add_host(host(i, 2000).to_config(), Nanos::ZERO)
            .unwrap();
    }
    let last = Nanos(period.0 * (qos_core::monitor::HISTORY_PERIODS as u64 + 2));
    let mut at = Nanos::ZERO;
    while at < last {
        at = at.saturating_add(period);
        monitor.tick(at);
    }
    (monitor, at)
}

fn source<'a>((monitor, now): &'a (Monitor, Nanos), implicit: &'a BTreeSet<String>) -> Source<'a> {
    Source {
        monitor,
        implicit,
        now: *now,
    }
}

const FULL: stats::Shape<'static> = stats::Shape {
    periods: DEFAULT_STATS_PERIODS,
    compact: false,
    counters: false,
    host_nqn: None,
};

const COMPACT: stats::Shape<'static> = stats::Shape {
    periods: DEFAULT_STATS_PERIODS,
    compact: true,
    counters: false,
    host_nqn: None,
};

const COUNTERS: stats::Shape<'static> = stats::Shape {
    periods: DEFAULT_STATS_PERIODS,
    compact: false,
    counters: true,
    host_nqn: None,
};

fn full(d: &Source<'_>) -> Value {
    serde_json::from_str(&stats::domain("d0", d, FULL)).unwrap()
}

fn compact(d: &Source<'_>) -> Value {
    serde_json::from_str(&stats::domain("d0", d, COMPACT)).unwrap()
}

fn keys(v: &Value) -> BTreeSet<&str> {
    v.as_object().unwrap().keys().map(String::as_str).collect()
}

/// The cluster agent's form: per host the compact form's counters and the settings
/// `qos_host_get` prints (a setting the host does not have left out), per domain the
/// compact form's period and capacity; nothing else.
#[test]
fn the_counters_form_is_the_compact_forms_counters_and_the_hosts_settings() {
    let (mut monitor, at) = domain_with_history(8);
    let other: HostParams = serde_json::from_value(json!({
        "domain": "d0", "host_nqn": nqn(100), "max_mibps": 90, "max_iops": 7000, "weight": 3,
    }))
    .unwrap();
    monitor.add_host(other.to_config(), at).unwrap();
    let domain = (monitor, at);
    // One host no `qos_host_set` configured: `configured` false, as in the other forms.
    let implicit: BTreeSet<String> = [nqn(3)].into_iter().collect();
    let d = source(&domain, &implicit);
    let compact = compact(&d);
    let counters: Value = serde_json::from_str(&stats::domain("d0", &d, COUNTERS)).unwrap();
    let top = [
        "capacity_estimate",
        "capacity_learning",
        "epoch",
        "hosts",
        "name",
        "period_ns",
    ];
    assert_eq!(keys(&counters), top.into_iter().collect());
    for k in top.iter().filter(|k| **k != "hosts") {
        assert_eq!(counters[k], compact[k], "{k}");
    }
    let (hosts, compact_hosts) = (
        counters["hosts"].as_array().unwrap(),
        compact["hosts"].as_array().unwrap(),
    );
    assert_eq!(hosts.len(), 9);
    assert_eq!(hosts.len(), compact_hosts.len());
    let settings = ["min_iops", "max_iops", "min_mibps", "max_mibps", "weight"];
    for (h, c) in hosts.iter().zip(compact_hosts) {
        for k in ["host_nqn", "configured", "completed_total"] {
            assert_eq!(h[k], c[k], "{k}");
        }
        assert_eq!(h["held_time"]["sum_ns"], c["held_time"]["sum_ns"]);
        let nqn = h["host_nqn"].as_str().unwrap();
        let cfg = domain.0.host_configs().find(|c| c.host_nqn == nqn).unwrap();
        let printed = HostParams::from_config("d0", cfg).to_json();
        for k in settings {
            assert_eq!(h[k].as_u64(), printed[k].as_u64(), "{nqn}: {k}");
        }
        let mut extra = keys(h);
        extra.retain(|k| !settings.contains(k));
        assert_eq!(
            extra,
            ["completed_total", "configured", "held_time", "host_nqn"]
                .into_iter()
                .collect()
        );
    }
    let other = hosts.iter().find(|h| h["host_nqn"] == nqn(100)).unwrap();
    assert_eq!(
        other,
        &json!({
            "host_nqn": nqn(100), "configured": true,
            "completed_total": {"ops": 0, "bytes": 0, "ios": 0}, "held_time": {"sum_ns": 0},
            "max_iops": 7000, "max_mibps": 90, "weight": 3,
        })
    );
    assert_eq!(hosts[3]["configured"], json!(false));
    // Per host, under a fifth of the compact form's bytes.
    let len = |v: &Value| v.to_string().len();
    let (counters_len, compact_len) = (len(&counters["hosts"]), len(&compact["hosts"]));
    assert!(
        counters_len * 5 < compact_len,
        "{counters_len} vs {compact_len}"
    );
}

#[test]
fn the_full_form_is_the_compact_form_plus_the_history() {
    let domain = domain_with_history(8);
    let implicit = BTreeSet::new();
    let d = source(&domain, &implicit);
    let (full, compact) = (full(&d), compact(&d));
    let history = [
        "last_periods",
        "periods",
        "reservation_met_fraction_backlogged",
        "soft_granted",
    ];
    for (f, c) in full["hosts"]
        .as_array()
        .unwrap()
        .iter()
        .zip(compact["hosts"].as_array().unwrap())
    {
        let mut only_full = keys(f);
        only_full.retain(|k| !keys(c).contains(k));
        assert_eq!(only_full, history.into_iter().collect());
        for k in keys(c) {
            // The counters and gauges agree (at the same time, nothing moved).
            assert_eq!(f[k], c[k], "{k}");
        }
        let periods = f["periods"].as_array().unwrap();
        assert_eq!(periods.len(), DEFAULT_STATS_PERIODS);
        assert_eq!(
            keys(&periods[0]),
            ["backlogged", "bytes", "epoch", "ios", "met", "ops"]
                .into_iter()
                .collect()
        );
        // Newest first.
        assert!(periods[0]["epoch"].as_u64() > periods[1]["epoch"].as_u64());
        assert_eq!(f["last_periods"].as_array().unwrap().len(), 16);
        // Nothing was backlogged: no fraction.
        assert_eq!(f["reservation_met_fraction_backlogged"], Value::Null);
    }
    let mut only_full = keys(&full);
    only_full.retain(|k| !keys(&compact).contains(k));
    assert_eq!(only_full, ["estimator_periods"].into_iter().collect());
    for k in keys(&compact).into_iter().filter(|&k| k != "hosts") {
        assert_eq!(full[k], compact[k], "{k}");
    }
}

/// The full form, serialised, once.
#[inline(never)]
fn full_once(d: &Source<'_>) -> usize {
    stats::domain("d0", d, FULL).len()
}

/// The compact form, serialised, once.
#[inline(never)]
fn compact_once(d: &Source<'_>) -> usize {
    stats::domain("d0", d, COMPACT).len()
}

/// `qos_host_set`'s change of the monitor for an existing host, once.
#[inline(never)]
fn host_update_once(m: &mut Monitor, p: &HostParams, now: Nanos) {
    m.update_host(p.to_config(), now).unwrap();
}

/// `qos_host_set`'s change of the monitor for a new host, once.
#[inline(never)]
fn host_add_once(m: &mut Monitor, p: &HostParams, now: Nanos) {
    m.add_host(p.to_config(), now).unwrap();
}

/// What the control plane costs at 1,024 hosts (plus one added): prints the mean wall
/// time of each call. For instruction counts, run it under callgrind with
/// `--toggle-collect` on one of the `*_once` functions (docs/benchmarks.md).
#[test]
#[ignore = "a measurement: run it on its own (--ignored --nocapture)"]
fn control_plane_cost_at_1024_hosts() {
    let rounds: usize = std::env::var("ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(5);
    let mut domain = domain_with_history(HOSTS);
    let implicit = BTreeSet::new();
    let time = |what: &str, f: &mut dyn FnMut() -> usize| {
        let t0 = Instant::now();
        let mut size = 0;
        for _ in 0..rounds {
            size = black_box(f());
        }
        let ms = t0.elapsed().as_secs_f64() * 1000.0 / rounds as f64;
        println!("{what:<24} {ms:8.3} ms per call, {size} bytes");
    };
    let d = source(&domain, &implicit);
    time("qos_stats_get full", &mut || full_once(&d));
    time("qos_stats_get compact", &mut || compact_once(&d));
    let (m, now) = &mut domain;
    let mut next = 0;
    time("qos_host_set update", &mut || {
        next += 1;
        host_update_once(m, &host(next % HOSTS, 3000 + next as u64), *now);
        0
    });
    let mut added = HOSTS;
    time("qos_host_set add", &mut || {
        host_add_once(m, &host(added, 2000), *now);
        added += 1;
        0
    });
}
