//! The lab end to end: determinism, every shipped scenario at reduced length, golden
//! summaries, the papers' phenomena in miniature, bad input, plots and the CLI.
//!
//! Golden summaries live in `tests/golden/`; after an intended change of behaviour,
//! regenerate them with `UPDATE_GOLDEN=1 cargo test -p qos-lab --test lab golden` and
//! review the diff.

use std::path::{Path, PathBuf};
use std::process::Command;

use qos_lab::runner::run_all;
use qos_lab::shipped::{SHIPPED, path_of};
use qos_lab::{RunOptions, Scenario, ScenarioError, Summary};

fn shipped(name: &str) -> Scenario {
    let text = qos_lab::shipped::find(name).expect("shipped scenario");
    Scenario::parse(text, &path_of(name), name).expect("valid shipped scenario")
}

/// Short runs: few periods, and the Haechi scenarios at 1/100 of the paper's rates.
fn reduced(s: &Scenario, periods: u32) -> RunOptions {
    RunOptions {
        seed: None,
        periods: Some(periods),
        warmup_periods: Some(1),
        scale: Some(if s.scale > 1 { s.scale * 10 } else { 10 }),
    }
}

fn summary(s: &Scenario, opts: RunOptions, threads: usize) -> Summary {
    let outcomes = run_all(s, opts, threads, &|_| {}).expect("runs");
    Summary::new(s, &outcomes)
}

#[test]
fn same_seed_same_results_whatever_the_threads() {
    let s = shipped("haechi-2b-zipf");
    let opts = reduced(&s, 2);
    let a = summary(&s, opts, 1);
    let b = summary(&s, opts, 2);
    assert_eq!(a.to_json(), b.to_json());
    let c = summary(
        &s,
        RunOptions {
            seed: Some(99),
            ..opts
        },
        2,
    );
    assert_ne!(a.to_json(), c.to_json(), "another seed gives another run");
}

#[test]
fn every_shipped_scenario_runs_at_reduced_length() {
    for (name, _) in SHIPPED {
        let s = shipped(name);
        let sum = summary(&s, reduced(&s, 2), 2);
        assert_eq!(
            sum.policies.len(),
            s.runs.len() * s.policies.len(),
            "{name}"
        );
        for p in &sum.policies {
            assert!(p.total_iops > 0.0, "{name} {}: nothing completed", p.policy);
            for h in &p.hosts {
                assert_eq!(h.periods.len(), 2, "{name}");
            }
            assert!(p.warnings.is_empty(), "{name}: {:?}", p.warnings);
        }
        assert!(!qos_lab::check::check(&s).text.is_empty());
    }
}

fn golden(name: &str) {
    let s = shipped(name);
    let got = summary(&s, reduced(&s, 3), 2).to_json() + "\n";
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(format!("{name}.json"));
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, &got).unwrap();
        eprintln!("golden summary {} rewritten", path.display());
        return;
    }
    let want = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e}; create it with UPDATE_GOLDEN=1 cargo test -p qos-lab --test lab golden",
            path.display()
        )
    });
    assert!(
        want == got,
        "summary of {name} differs from {}; if the change is intended, regenerate with UPDATE_GOLDEN=1 cargo test -p qos-lab --test lab golden\n--- got ---\n{got}",
        path.display()
    );
}

#[test]
fn golden_summary_haechi_1c_spike() {
    golden("haechi-1c-spike");
}

#[test]
fn golden_summary_haechi_2b_zipf() {
    golden("haechi-2b-zipf");
}

#[test]
fn golden_summary_op_weights_depth() {
    golden("op-weights-depth");
}

#[test]
fn golden_summary_op_circulation() {
    golden("op-circulation");
}

fn policy<'a>(
    s: &'a Summary,
    name: &str,
    variant: Option<&str>,
) -> &'a qos_lab::report::PolicySummary {
    s.policies
        .iter()
        .find(|p| p.policy == name && p.variant.as_deref() == variant)
        .unwrap_or_else(|| panic!("no policy {name} {variant:?}"))
}

/// Haechi 1C: the bare target shares C_G evenly and a host alone cannot exceed C_L, so
/// spike demand with bursts leaves the big hosts short (paper: 278K of 340K, 1380K in
/// all) and constant-rate requests fix it (332K, 1564K).
#[test]
fn bare_target_reproduces_haechi_1c() {
    let s = shipped("haechi-1c-spike");
    let sum = summary(&s, reduced(&s, 3), 2);
    let burst = policy(&sum, "bare", Some("burst"));
    let c1 = burst.hosts[0].mean_iops;
    assert!((260_000.0..295_000.0).contains(&c1), "burst c1 {c1}");
    assert!(
        (1_330_000.0..1_440_000.0).contains(&burst.total_iops),
        "burst total {}",
        burst.total_iops
    );
    let cr = policy(&sum, "bare", Some("constant-rate"));
    assert!(
        cr.hosts[0].mean_iops > 310_000.0,
        "constant-rate c1 {}",
        cr.hosts[0].mean_iops
    );
    assert!(
        cr.total_iops > 1_500_000.0,
        "constant-rate total {}",
        cr.total_iops
    );
}

/// Haechi 2B: conversion gives the unused reservation of C1 and C2 to the others.
#[test]
fn conversion_beats_basic_haechi_in_2b() {
    let s = shipped("haechi-2b-zipf");
    let sum = summary(&s, reduced(&s, 3), 2);
    let basic = policy(&sum, "first_come/start/basic", None).total_iops;
    let full = policy(&sum, "weighted", None).total_iops;
    let bare = policy(&sum, "bare", None).total_iops;
    assert!(full >= basic * 1.05, "weighted {full} vs basic {basic}");
    assert!(full >= bare * 0.97, "weighted {full} vs bare {bare}");
    for h in &policy(&sum, "weighted", None).hosts[2..] {
        assert_eq!(h.reservation_met_fraction, Some(1.0), "{}", h.host);
    }
}

/// Haechi 2A Zipf: with the whole reservation at the period start (Haechi as
/// published) the two largest reservations are missed (local capacity constraint);
/// with paced release every host meets its reservation in every period.
#[test]
fn paced_release_meets_every_reservation_in_2a_zipf() {
    let s = shipped("haechi-2a-zipf");
    let sum = summary(&s, reduced(&s, 3), 2);
    for h in &policy(&sum, "weighted", None).hosts {
        assert_eq!(h.reservation_met_fraction, Some(1.0), "weighted {}", h.host);
    }
    let start = policy(&sum, "first_come/start", None);
    assert_eq!(
        start.hosts[0].reservation_met_fraction,
        Some(0.0),
        "first_come/start c1"
    );
}

/// Haechi Set 4: after a 20% capacity drop the estimator follows, and the host with
/// the largest reservation meets it again within 10 periods (the drop comes 15 s into
/// the measured periods).
#[test]
fn capacity_drop_is_followed_within_ten_periods() {
    let mut s = shipped("haechi-4-over");
    // Haechi on the Zipf reservations only, at 1/20 of the paper's rates (1/100 is too
    // coarse for a 1% question), to keep the test short.
    s.policies.retain(|p| p.name() == "weighted");
    s.runs.truncate(1);
    let opts = RunOptions {
        seed: None,
        periods: Some(26),
        warmup_periods: None,
        scale: Some(20),
    };
    let sum = summary(&s, opts, 1);
    let haechi = policy(&sum, "weighted", Some("zipf"));
    let c1 = &haechi.hosts[0];
    let reservation = c1.reservation_iops.expect("c1 has a reservation");
    let after_drop = &c1.periods[15..];
    assert!(
        after_drop[..10].iter().any(|&n| n >= reservation),
        "c1 (reservation {reservation}) after the drop: {after_drop:?}"
    );
    // The drop is real: without an estimator's help the first period after it misses.
    assert!(after_drop[0] < reservation, "{after_drop:?}");
    // Reservations starved in a period that served 20 % less than the estimate: the
    // estimate restarts there (within 2 % of the reduced capacity one period after the
    // drop) instead of averaging its way down over the window (1,497 K, then 1,428 K).
    let reduced = 1_570_000.0 * 0.8;
    let estimate = haechi.capacity_estimate_iops[16] as f64;
    assert!(
        estimate <= reduced * 1.02 && estimate >= reduced * 0.98,
        "estimate one period after the drop {estimate}, reduced capacity {reduced}: {:?}",
        haechi.capacity_estimate_iops
    );
}

/// Mean of the periods from `from` on.
fn mean_from(periods: &[u64], from: usize) -> f64 {
    let p = &periods[from..];
    p.iter().sum::<u64>() as f64 / p.len() as f64
}

/// Weighted max-min shares of `excess` among backlogged hosts with these weights.
fn weighted_shares(excess: f64, weights: &[f64]) -> Vec<f64> {
    let w: f64 = weights.iter().sum();
    weights.iter().map(|x| excess * x / w).collect()
}

/// Asserts that every host of `w` met its reservation in every period and got within
/// 10% of its weighted share of the total beyond the reservations; returns the
/// reservations.
fn shares_by_weight_and_every_reservation_met(
    w: &qos_lab::report::PolicySummary,
    weights: &[f64],
) -> Vec<f64> {
    let res: Vec<f64> = w
        .hosts
        .iter()
        .map(|h| h.reservation_iops.unwrap() as f64)
        .collect();
    let shares = weighted_shares(w.total_iops - res.iter().sum::<f64>(), weights);
    for (i, h) in w.hosts.iter().enumerate() {
        let got = h.mean_iops - res[i];
        assert!(
            (got - shares[i]).abs() <= 0.10 * shares[i],
            "{}: {got:.0} above its reservation, share {:.0}",
            h.host,
            shares[i]
        );
        assert_eq!(h.reservation_met_fraction, Some(1.0), "{}", h.host);
    }
    res
}

/// First come gives the deepest queue (the last host) more beyond its reservation than
/// the shallowest (the first).
fn first_come_follows_queue_depth(fcfs: &qos_lab::report::PolicySummary, res: &[f64]) {
    let above = |i: usize| fcfs.hosts[i].mean_iops - res[i];
    let last = res.len() - 1;
    assert!(
        above(last) > above(0),
        "first come: the deepest queue gets more than the shallowest"
    );
}

/// Issue 12: queue depths 16 / 32 / 48 / 64 with weights 4 / 3 / 2 / 1. With weighted
/// sharing each host's throughput above its reservation is within 10% of its weighted
/// max-min share, every reservation is met, and the total is within 3% of the bare
/// target's. First come (the open global pool) gives the excess by queue depth, the
/// inverse of the weights.
#[test]
fn weighted_sharing_is_independent_of_queue_depth() {
    let s = shipped("qd-weights");
    let sum = summary(&s, RunOptions::default(), 2);
    let bare = policy(&sum, "bare", None).total_iops;
    let w = policy(&sum, "weighted", None);
    assert!(
        w.total_iops >= 0.97 * bare,
        "weighted {} vs bare {bare}",
        w.total_iops
    );
    let res = shares_by_weight_and_every_reservation_met(w, &[4.0, 3.0, 2.0, 1.0]);
    let fcfs = policy(&sum, "first_come", None);
    first_come_follows_queue_depth(fcfs, &res);
}

/// Issue 12, on a target that is faster the more commands it holds (as the real
/// NVMe/TCP target): weighted sharing still splits the excess by weight (within 10%) and
/// meets every reservation, at a price in total throughput that the lab now predicts
/// (the real target: 67-74% of bare); first come keeps the target deeper and faster but
/// gives the excess by queue depth.
#[test]
fn weighted_shares_on_a_depth_bound_target() {
    let s = shipped("qd-weights-depth");
    let sum = summary(&s, RunOptions::default(), 2);
    let bare = policy(&sum, "bare", None).total_iops;
    let w = policy(&sum, "weighted", None);
    let res = shares_by_weight_and_every_reservation_met(w, &[4.0, 3.0, 2.0, 1.0]);
    let fcfs = policy(&sum, "first_come", None);
    assert!(
        w.total_iops < 0.9 * bare && fcfs.total_iops > w.total_iops,
        "the depth costs weighted sharing throughput: haechi {}, first come {}, bare {bare}",
        w.total_iops,
        fcfs.total_iops
    );
    assert!(
        w.total_iops >= 0.75 * bare,
        "weighted {} of {bare}",
        w.total_iops
    );
    first_come_follows_queue_depth(fcfs, &res);
}

/// Issue 12: a third of the capacity lost to unmanaged load, reservations (45% of the
/// profile) still admissible: every host, the queue-depth-bound one included, meets
/// its reservation within 3 periods of the drop, and the excess is again shared by
/// weight (within 10%) once the estimate has followed.
#[test]
fn reservations_hold_after_a_capacity_drop() {
    let s = shipped("qd-capacity-drop");
    let sum = summary(&s, RunOptions::default(), 2);
    let w = policy(&sum, "weighted", None);
    let drop_at = 12; // measured periods before the drop
    for h in &w.hosts {
        let r = h.reservation_iops.unwrap() as f64;
        let after = &h.periods[drop_at..];
        let first_ok = after
            .iter()
            .position(|&n| n as f64 >= r)
            .unwrap_or_else(|| panic!("{}: never meets {r} after the drop: {after:?}", h.host));
        assert!(first_ok <= 3, "{}: {after:?}", h.host);
        assert!(
            after[first_ok..].iter().all(|&n| n as f64 >= r),
            "{} misses again: {after:?}",
            h.host
        );
    }
    let settled = drop_at + 4;
    let res: Vec<f64> = w
        .hosts
        .iter()
        .map(|h| h.reservation_iops.unwrap() as f64)
        .collect();
    let means: Vec<f64> = w
        .hosts
        .iter()
        .map(|h| mean_from(&h.periods, settled))
        .collect();
    let excess = means.iter().sum::<f64>() - res.iter().sum::<f64>();
    let shares = weighted_shares(excess, &[4.0, 3.0, 2.0, 1.0]);
    for i in 0..4 {
        let got = means[i] - res[i];
        assert!(
            (got - shares[i]).abs() <= 0.10 * shares[i],
            "host {i}: {got:.0} above its reservation after the drop, share {:.0}",
            shares[i]
        );
    }
}

/// Issue 12: a reservation the host's queue depth cannot carry. The QD-1 host keeps
/// most of what it can do (far above the bare target's share of it), the lag it cannot
/// make up does not close the excess for good: the others meet their reservations in
/// every period and share what is left beyond them by weight (within 10%).
#[test]
fn an_unreachable_reservation_keeps_what_it_can_do_and_frees_the_rest() {
    let s = shipped("qd-unreachable");
    let sum = summary(&s, RunOptions::default(), 2);
    let bare = policy(&sum, "bare", None);
    let w = policy(&sum, "weighted", None);
    let qd1 = &w.hosts[0];
    assert!(
        qd1.mean_iops >= 20.0 * bare.hosts[0].mean_iops && qd1.mean_iops >= 35_000.0,
        "QD 1: {} with QoS, {} bare",
        qd1.mean_iops,
        bare.hosts[0].mean_iops
    );
    let res: Vec<f64> = w.hosts[1..]
        .iter()
        .map(|h| h.reservation_iops.unwrap() as f64)
        .collect();
    let above: Vec<f64> = w.hosts[1..]
        .iter()
        .zip(&res)
        .map(|(h, r)| h.mean_iops - r)
        .collect();
    let shares = weighted_shares(above.iter().sum(), &[3.0, 2.0, 1.0]);
    for (i, h) in w.hosts[1..].iter().enumerate() {
        assert_eq!(h.reservation_met_fraction, Some(1.0), "{}", h.host);
        assert!(
            (above[i] - shares[i]).abs() <= 0.10 * shares[i],
            "{}: {:.0} above its reservation, share {:.0}",
            h.host,
            above[i],
            shares[i]
        );
    }
    // Not closed for good: the others get a part of the excess.
    assert!(above.iter().sum::<f64>() >= 3_000.0, "{above:?}");
}

/// Issue 12: a tenant group gets its reservation together and never more than its
/// limit (+1%) in any period, under weighted sharing and at the operating point
/// (issue 26); under weighted sharing the lone hosts share the rest by weight.
#[test]
fn a_group_gets_its_reservation_and_stays_under_its_limit() {
    let s = shipped("groups");
    let g = &s.groups[0];
    let (reservation, limit) = (
        g.reservation_iops.unwrap() as f64,
        g.limit_iops.unwrap() as f64,
    );
    let sum = summary(&s, RunOptions::default(), 2);
    let bare_like = policy(&sum, "first_come", None).total_iops;
    for sharing in ["weighted", "operating_point"] {
        let w = policy(&sum, sharing, None);
        let n = w.hosts[0].periods.len();
        for p in 0..n {
            let gold = (w.hosts[0].periods[p] + w.hosts[1].periods[p]) as f64;
            assert!(
                gold >= reservation,
                "{sharing}, period {p}: group {gold} < {reservation}"
            );
            assert!(
                gold <= 1.01 * limit,
                "{sharing}, period {p}: group {gold} > {limit} + 1%"
            );
        }
        assert!(
            w.total_iops >= 0.97 * bare_like,
            "{sharing}: {} vs {bare_like}",
            w.total_iops
        );
    }
    let w = policy(&sum, "weighted", None);
    let lone = (w.hosts[2].mean_iops - 15_000.0, w.hosts[3].mean_iops);
    assert!(
        (lone.0 - lone.1).abs() <= 0.10 * lone.1,
        "lone hosts of equal weight: {lone:?}"
    );
}

/// Seed 002: high-priority soft guarantees are met in every period while everyone is
/// busy, whatever the low-priority load, and when the high-priority hosts go idle the
/// low-priority ones get at least 95% of the spare capacity.
#[test]
fn soft_guarantees_by_priority_and_capacity_back_when_idle() {
    let s = shipped("priority-soft");
    let sum = summary(&s, RunOptions::default(), 2);
    let w = policy(&sum, "weighted", None);
    let busy = 15; // measured periods before the high-priority hosts stop
    for h in &w.hosts[..2] {
        let soft = 40_000.0;
        let met = h.periods[..busy]
            .iter()
            .filter(|&&n| n as f64 >= soft)
            .count();
        assert!(
            met * 100 >= busy * 99,
            "{}: {:?}",
            h.host,
            &h.periods[..busy]
        );
    }
    let total_busy = (0..4)
        .map(|i| mean_from(&w.hosts[i].periods[..busy], 0))
        .sum::<f64>();
    let low_idle =
        mean_from(&w.hosts[2].periods, busy + 1) + mean_from(&w.hosts[3].periods, busy + 1);
    assert!(
        low_idle >= 0.95 * total_busy,
        "low priority with the high idle: {low_idle:.0} of {total_busy:.0}"
    );
}

/// Justitia: chunking and pacing keep the reader out of the writer's queue.
#[test]
fn pacing_protects_the_small_reader() {
    let s = shipped("reader-writer");
    let opts = RunOptions {
        periods: Some(2),
        warmup_periods: Some(1),
        ..RunOptions::default()
    };
    let sum = summary(&s, opts, 2);
    let p99 = |p: &str| policy(&sum, p, None).hosts[1].latency_us.p99.unwrap();
    let mibps = |p: &str| policy(&sum, p, None).hosts[0].mib_per_s;
    assert!(
        p99("bare") >= 5.0 * p99("bare+pacing"),
        "{} vs {}",
        p99("bare"),
        p99("bare+pacing")
    );
    // Fair share: half of 25 Gb/s.
    let half = 25e9 / 8.0 / 2.0 / (1u64 << 20) as f64;
    assert!(
        mibps("bare+pacing") >= 0.9 * half,
        "writer {}",
        mibps("bare+pacing")
    );
}

/// The reader-writer scenario with a cost per command on the link and a fixed chunk of
/// `chunk_kib` (or the pacer's pick when `None`), paced only: the writer's MiB/s and the
/// reader's p99.
fn chunked_reader_writer(command_us: f64, chunk_kib: Option<u64>) -> (f64, f64) {
    let text = qos_lab::shipped::find("reader-writer").expect("shipped scenario");
    let mut text = text
        .replace(
            "link_gbps = 25.0",
            &format!("link_command_us = {command_us}\nlink_gbps = 25.0"),
        )
        .replace(
            "policies = [\"bare\", \"bare+pacing\", \"first_come/start\", \"first_come/start+pacing\", \"weighted\", \"weighted+pacing\"]",
            "policies = [\"bare+pacing\"]",
        );
    match chunk_kib {
        Some(k) => {
            text = text.replacen(
                "chunk_kib = 64",
                &format!("chunk_kib = {k}\nchunk_auto = false"),
                1,
            )
        }
        None => text = text.replacen("chunk_kib = 64", "chunk_kib = 128", 1),
    }
    let s =
        Scenario::parse(&text, &path_of("reader-writer"), "reader-writer").expect("valid scenario");
    assert_eq!(s.policies.len(), 1, "the policy list was replaced");
    let opts = RunOptions {
        periods: Some(2),
        warmup_periods: Some(1),
        ..RunOptions::default()
    };
    let sum = summary(&s, opts, 1);
    let p = policy(&sum, "bare+pacing", None);
    (p.hosts[0].mib_per_s, p.hosts[1].latency_us.p99.unwrap())
}

/// Issue 30 in the lab: when every command costs the link a fixed time (NVMe/TCP),
/// small chunks cost the paced writer throughput, and once the pacer's rate is more than
/// the link carries in such chunks the queue they leave costs the reader too; large
/// chunks cost the reader the wait behind one. The pacer's own pick (the latency
/// target's slack times the link) does better than either on both.
#[test]
fn a_per_command_cost_trades_the_writers_rate_against_the_readers_latency() {
    let (w16, r16) = chunked_reader_writer(3.0, Some(16));
    let (w128, r128) = chunked_reader_writer(3.0, Some(128));
    let (w16_free, r16_free) = chunked_reader_writer(0.0, Some(16));
    let (w_auto, r_auto) = chunked_reader_writer(3.0, None);
    println!(
        "3 us a command: 16 KiB chunks writer {w16:.0} MiB/s reader p99 {r16:.1} us; \
         128 KiB {w128:.0} / {r128:.1}; picked {w_auto:.0} / {r_auto:.1}; \
         16 KiB at no cost a command {w16_free:.0} / {r16_free:.1}"
    );
    assert!(
        w16 < 0.9 * w16_free,
        "a command's cost should cost 16 KiB chunks throughput: {w16:.0} vs {w16_free:.0}"
    );
    assert!(
        r128 > 1.2 * r_auto,
        "the reader waits behind 128 KiB chunks: {r128:.1} vs {r_auto:.1} us"
    );
    assert!(
        w_auto >= 0.95 * w16.max(w128) && r_auto <= 1.05 * r16.min(r128),
        "the pick should do no worse than either: {w_auto:.0} MiB/s, {r_auto:.1} us"
    );
}

// ---------------------------------------------------------------------------------------
// Bad input.

fn parse_err(text: &str) -> ScenarioError {
    Scenario::parse(text, "bad.toml", "bad").expect_err("refused")
}

const GOOD: &str = r#"
[target]
capacity_iops = 100000
per_host_max_iops = 40000
[[host]]
name = "a"
reservation_iops = 1000
limit_iops = 5000
[[host]]
name = "b"
"#;

#[test]
fn the_good_example_is_good() {
    let s = Scenario::parse(GOOD, "good.toml", "good").unwrap();
    assert_eq!(s.runs[0].hosts.len(), 2);
}

#[test]
fn syntax_errors_name_file_line_and_field() {
    let e = parse_err(&GOOD.replace("limit_iops = 5000", "limit_iops = = 5"));
    let msg = e.to_string();
    assert!(msg.starts_with("bad.toml:8:"), "{msg}");
}

#[test]
fn unknown_fields_are_named() {
    let e = parse_err(&GOOD.replace("limit_iops = 5000", "limit_ops = 5000"));
    assert_eq!(e.line(), Some(8), "{e}");
    assert_eq!(e.field(), Some("host[0].limit_ops"), "{e}");
    assert!(e.to_string().contains("unknown field"), "{e}");
}

#[test]
fn wrong_types_are_named() {
    let e = parse_err(&GOOD.replace("capacity_iops = 100000", "capacity_iops = \"lots\""));
    assert_eq!(e.line(), Some(3), "{e}");
    assert_eq!(e.field(), Some("target.capacity_iops"), "{e}");
}

#[test]
fn negative_rates_are_refused_with_what_to_change() {
    let e = parse_err(&GOOD.replace("reservation_iops = 1000", "reservation_iops = -1000"));
    assert_eq!(e.line(), Some(7), "{e}");
    assert_eq!(e.field(), Some("host[0].reservation_iops"), "{e}");
    assert!(e.to_string().contains("cannot be negative"), "{e}");
}

#[test]
fn reservation_above_limit_is_refused() {
    let e = parse_err(&GOOD.replace("limit_iops = 5000", "limit_iops = 500"));
    assert_eq!(e.field(), Some("host[0].reservation_iops"), "{e}");
    let msg = e.to_string();
    assert!(msg.contains("exceeds its total limit 500 IOPS"), "{msg}");
    assert!(
        msg.contains("lower the reservation or raise the limit"),
        "{msg}"
    );
    assert!(msg.starts_with("bad.toml:7:"), "{msg}");
}

#[test]
fn more_reservations_than_hosts_are_refused() {
    let text = format!(
        "{}\n[reservations]\ndistribution = \"list\"\niops = [1, 2, 3]\n",
        GOOD.replace("reservation_iops = 1000\n", "")
    );
    let e = parse_err(&text);
    assert_eq!(e.field(), Some("reservations.iops"), "{e}");
    let msg = e.to_string();
    assert!(
        msg.contains("defines only 2 hosts; remove 1 values or add hosts"),
        "{msg}"
    );
    let e = parse_err(&GOOD.replace("reservation_iops = 1000\n", "").replace("[[host]]\nname = \"b\"", "[[host]]\nname = \"b\"\n[reservations]\ndistribution = \"zipf\"\nreserved_fraction = 0.5\ngroups = 3"));
    assert!(
        e.to_string().contains("3 groups need at least 3 hosts"),
        "{e}"
    );
}

#[test]
fn impossible_domain_values_are_refused() {
    let e = parse_err(&format!("{GOOD}\n[qos]\nperiod_ms = 5\n"));
    assert_eq!(e.field(), Some("qos.period_ms"), "{e}");
    let e = parse_err(&GOOD.replace("[[host]]\nname = \"b\"", "[[host]]\nname = \"a\""));
    assert!(e.to_string().contains("two hosts are named"), "{e}");
    let e = parse_err(&format!("policies = [\"fair\"]\n{GOOD}"));
    assert_eq!(e.field(), Some("policies[0]"), "{e}");
    assert!(e.to_string().contains("unknown policy"), "{e}");
    let e = parse_err(&GOOD.replace("[target]", "[target]\nlink_command_us = 2.0"));
    assert_eq!(e.field(), Some("target.link_command_us"), "{e}");
    assert!(e.to_string().contains("set link_gbps too"), "{e}");
    let e = parse_err(&GOOD.replace(
        "[target]",
        "[target]\nlink_gbps = 25.0\nlink_command_us = -1.0",
    ));
    assert_eq!(e.field(), Some("target.link_command_us"), "{e}");
    assert!(e.to_string().contains("0 ..= 10000 us"), "{e}");
}

#[test]
fn operating_point_settings_out_of_range_are_refused_with_the_range() {
    for bad in ["0.0", "1.5", "-0.2"] {
        let e = parse_err(&format!("{GOOD}\n[qos]\nefficiency = {bad}\n"));
        assert_eq!(e.field(), Some("qos.efficiency"), "{e}");
        assert!(e.to_string().contains("must be in (0, 1]"), "{e}");
    }
    let e = parse_err(&format!("{GOOD}\n[qos]\noperating_in_flight = 0\n"));
    assert_eq!(e.field(), Some("qos.operating_in_flight"), "{e}");
    let e = parse_err(&GOOD.replace("[target]", "[target]\nqos_path_cost_pct = -3.0"));
    assert_eq!(e.field(), Some("target.qos_path_cost_pct"), "{e}");
    assert!(e.to_string().contains("0 ..= 1000 %"), "{e}");
    let ok = format!("{GOOD}\n[qos]\nefficiency = 0.8\nover_circulation = true\n");
    assert!(Scenario::parse(&ok, "ok.toml", "ok").is_ok());
}

/// The QoS path's cost: a CPU-bound target does `1 / (1 + pct / 100)` of its capacity
/// under a QoS policy, and bare is untouched.
#[test]
fn the_qos_path_cost_slows_the_qos_policies_only() {
    let run = |cost: &str| {
        let text = format!(
            "policies = [\"bare\", \"first_come\"]\n[target]\ncapacity_iops = 100000\n\
             qos_path_cost_pct = {cost}\n[defaults]\npattern = \"burst\"\nqueue_depth = 32\n\
             demand = \"unlimited\"\n[[host]]\nname = \"a\"\n[[host]]\nname = \"b\"\n"
        );
        let s = Scenario::parse(&text, "cost.toml", "cost").unwrap();
        let sum = summary(&s, reduced(&s, 3), 2);
        let total = |p: &str| policy(&sum, p, None).total_iops;
        (total("bare"), total("first_come"))
    };
    let (bare0, qos0) = run("0.0");
    let (bare25, qos25) = run("25.0");
    assert_eq!(bare0, bare25, "bare does not pay the QoS path");
    let ratio = qos25 / qos0;
    assert!(
        (ratio - 0.8).abs() < 0.03,
        "{qos25} / {qos0} = {ratio}, expected 1 / 1.25"
    );
}

/// A machine whose speed moves: spells at `[min, 1]` of C_G, the same for every policy,
/// the same for a seed; its mean speed between the two.
#[test]
fn a_noisy_machine_is_slower_on_average_and_the_same_for_a_seed() {
    let text = |noise: &str| {
        format!(
            "policies = [\"bare\"]\n[target]\ncapacity_iops = 100000\n{noise}\n\
             [defaults]\npattern = \"burst\"\nqueue_depth = 32\ndemand = \"unlimited\"\n\
             [[host]]\nname = \"a\"\n[[host]]\nname = \"b\"\n"
        )
    };
    let bare = |noise: &str| {
        let s = Scenario::parse(&text(noise), "noise.toml", "noise").unwrap();
        policy(&summary(&s, reduced(&s, 4), 2), "bare", None).total_iops
    };
    let steady = bare("");
    let noisy = bare("speed_noise_min = 0.5\nspeed_noise_spell_ms = 200");
    assert_eq!(
        noisy,
        bare("speed_noise_min = 0.5\nspeed_noise_spell_ms = 200")
    );
    let r = noisy / steady;
    assert!(
        (0.6..0.9).contains(&r),
        "{noisy} / {steady} = {r}: spells at 0.5-1.0 average 0.75"
    );
    let e = parse_err(&GOOD.replace("[target]", "[target]\nspeed_noise_min = 1.5"));
    assert_eq!(e.field(), Some("target.speed_noise_min"), "{e}");
    assert!(e.to_string().contains("in (0, 1]"), "{e}");
    let e = parse_err(&GOOD.replace("[target]", "[target]\nspeed_noise_spell_ms = 100"));
    assert_eq!(e.field(), Some("target.speed_noise_spell_ms"), "{e}");
    let e = parse_err(&format!(
        "{}\n[[target.capacity_change]]\nat_s = 1\nfactor = 0.5\n",
        GOOD.replace("[target]", "[target]\nspeed_noise_min = 0.5")
    ));
    assert_eq!(e.field(), Some("target.speed_noise_min"), "{e}");
    assert!(e.to_string().contains("not supported"), "{e}");
}

#[test]
fn over_reserved_targets_fail_the_check_and_the_run() {
    let text = GOOD
        .replace("reservation_iops = 1000", "reservation_iops = 39000")
        .replace("limit_iops = 5000", "limit_iops = 50000")
        + "[[host]]\nname = \"c\"\nreservation_iops = 39000\n[[host]]\nname = \"d\"\nreservation_iops = 39000\n";
    let s = Scenario::parse(&text, "over.toml", "over").unwrap();
    let rep = qos_lab::check::check(&s);
    assert!(!rep.admitted);
    assert!(
        rep.text.contains("exceeds the target capacity C_G"),
        "{}",
        rep.text
    );
    let e = run_all(&s, RunOptions::default(), 1, &|_| {}).unwrap_err();
    assert!(e.to_string().contains("qos-lab check over.toml"), "{e}");
}

// ---------------------------------------------------------------------------------------
// Plots and the command line.

#[test]
fn plots_render_without_fonts() {
    let dir = tempfile::tempdir().unwrap();
    let s = shipped("haechi-1c-spike");
    let sum = summary(&s, reduced(&s, 2), 2);
    let p = dir.path().join("notext.png");
    qos_lab::plot::render_with(&sum, &p, false).unwrap();
    assert!(std::fs::metadata(&p).unwrap().len() > 1000);
    match qos_lab::plot::font() {
        Some(font) => {
            let p = dir.path().join("text.png");
            qos_lab::plot::render(&sum, &p).unwrap();
            assert!(
                std::fs::metadata(&p).unwrap().len() > 1000,
                "with {}",
                font.display()
            );
        }
        None => eprintln!(
            "SKIPPED: plot with text: no font found (install fonts-dejavu-core or set QOS_LAB_FONT)"
        ),
    }
}

fn qos_lab() -> Command {
    Command::new(env!("CARGO_BIN_EXE_qos-lab"))
}

#[test]
fn cli_list_check_and_run() {
    let out = qos_lab().arg("list").output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    for (name, _) in SHIPPED {
        assert!(text.contains(name), "{name} missing from list");
    }

    let out = qos_lab()
        .args(["check", "haechi-2a-zipf"])
        .output()
        .unwrap();
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("admitted"));

    let dir = tempfile::tempdir().unwrap();
    let json: PathBuf = dir.path().join("s.json");
    let png: PathBuf = dir.path().join("s.png");
    let out = qos_lab()
        .args([
            "run",
            "haechi-1c-uniform",
            "--periods",
            "1",
            "--scale",
            "100",
            "--json",
        ])
        .arg(&json)
        .arg("--plot")
        .arg(&png)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let table = String::from_utf8(out.stdout).unwrap();
    assert!(table.contains("policy bare"), "{table}");
    let sum: Summary = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(sum.scenario, "haechi-1c-uniform");
    assert_eq!(sum.policies[0].hosts.len(), 10);
    assert!(png.exists());

    let bad = dir.path().join("bad.toml");
    std::fs::write(
        &bad,
        "[target]\ncapacity_iops = -3\n[[host]]\nname = \"a\"\n",
    )
    .unwrap();
    let out = qos_lab().arg("run").arg(&bad).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("bad.toml:2:17: target.capacity_iops"), "{err}");
}

/// Issue 28, scenario `boot-storm`: ten VMs idle for 5 s, then all read at once next to
/// a database reserving 40,000 IOPS. With burst credits each VM runs above its 10,000
/// limit until its full bucket (5 s x 20,000 excess = 100,000 operations) is spent, then
/// at its limit; without, at its limit from the start. The database meets its
/// reservation in every period either way: bursts come from unreserved capacity only.
#[test]
fn a_boot_storm_bursts_on_credit_then_holds_the_limit_and_the_reservation_stands() {
    let s = shipped("boot-storm");
    let sum = summary(&s, RunOptions::default(), 2);
    for sharing in ["first_come", "weighted"] {
        let with = policy(&sum, sharing, Some("burst"));
        let without = policy(&sum, sharing, Some("no-burst"));
        for p in [with, without] {
            assert!(
                p.hosts[0].periods.iter().all(|&v| v >= 40_000),
                "{sharing}: the database missed its reservation: {:?}",
                p.hosts[0].periods
            );
        }
        for vm in &with.hosts[1..] {
            // Periods 0-3 idle, then above the limit until the bucket is spent.
            let storm = &vm.periods[4..];
            let above: Vec<u64> = storm.iter().map(|&v| v.saturating_sub(10_000)).collect();
            let spent: u64 = above.iter().sum();
            assert!(
                (99_000..=101_000).contains(&spent),
                "{sharing} {}: {spent} above the limit for a bucket of 100,000: {storm:?}",
                vm.host
            );
            let bursting = above.iter().take_while(|&&a| a > 5_000).count();
            assert!(bursting >= 8, "{sharing} {}: {storm:?}", vm.host);
            assert!(
                storm[bursting + 1..]
                    .iter()
                    .all(|&v| v.abs_diff(10_000) <= 100),
                "{sharing} {}: after the burst {storm:?}",
                vm.host
            );
        }
        for vm in &without.hosts[1..] {
            assert!(vm.periods[4..].iter().all(|&v| v.abs_diff(10_000) <= 100));
        }
        assert!(with.total_iops > 1.15 * without.total_iops);
    }
}
