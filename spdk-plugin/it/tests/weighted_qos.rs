//! Weighted sharing, capacity drops, tenant groups and priority classes on a real
//! `nvmf_tgt` near saturation (issue 12). Plain NVMe/TCP hosts (no initiator plugin):
//! four bdev_nvme controllers, each with its own host NQN, in one bdevperf process on
//! core 1, the target on core 0, so that no host is starved by the kernel scheduler.
//! Every test first measures the same load without QoS (plain namespaces), then sizes
//! the QoS domain from it, so the target is driven at its real capacity, not at a toy
//! rate. Prints `SKIPPED: ...` and passes when SPDK, bdevperf or the plugins are not found.
//!
//! - `weighted_excess_whatever_the_queue_depth`: queue depths 16 / 32 / 48 / 64 with
//!   weights 4 / 3 / 2 / 1: each host's throughput above its reservation is within 10%
//!   of its weighted max-min share, reservations are met in >= 99% of steady periods,
//!   the total is >= 97% of the same load without QoS. Under `QOS_IT_SHARING=operating_point`
//!   each host is checked against its entitlement `max(r_i, theta w_i)` instead (that
//!   policy's contract, issue 26), and the operating point (Q*, C*) is printed.
//! - `reservations_hold_when_capacity_drops`: a CPU quota on the target's cgroup
//!   (`QOS_IT_CPU_QUOTA`, default 0.6 of its core) takes part of its capacity; every host
//!   meets its reservation again within 3 periods (reservations in the issue's
//!   proportions, see the test), and the estimate falls no further than the target.
//! - `group_reservation_and_limit`: a group of two hosts gets its reservation together
//!   and never more than its limit (+1%); a host moves between groups under load with
//!   no I/O failed or lost; bad group input is refused with a message naming the fix.
//! - `soft_guarantees_by_priority`: high-priority soft guarantees hold under
//!   low-priority load; idle high-priority hosts give the capacity back.
//! - `qos_total_against_bare_side_by_side`: a load (`QOS_IT_WORKLOAD`: the weighted
//!   test's four hosts, eight hosts at QD 4-128, 70/30 read/write, or 128 KiB beside
//!   4 KiB) on QoS and on plain namespaces of one target, alternated for
//!   `QOS_IT_ROUNDS` rounds of `QOS_IT_PHASE_SECS`: the QoS total against the plain
//!   phases around it (median and quartiles), each host against its entitlement.
//! - `target_throughput_by_depth`: the same target without QoS at 8-160 commands in
//!   flight, rounds rotated (the bound weighted sharing's total runs into).
//!
//! `QOS_IT_SHARING=first_come` runs them with Haechi's first-come pool instead,
//! `QOS_IT_PROFILE=F` configures the domain at F times the bare total (default 0.9;
//! `QOS_IT_CAPACITY=none` gives it no capacity: it learns it from the target),
//! `QOS_IT_QDS=a,b,c,d` sets the weighted test's four queue depths (`QOS_IT_WEIGHTS=a,b,c,d`
//! the side-by-side test's four weights), `QOS_IT_ESTIMATOR=0`
//! turns the capacity estimator off (the domain then stays at its configured capacity),
//! `QOS_IT_ESTIMATOR_HOLD=N` sets the estimator's hold band (thousandths; 0 = none),
//! `QOS_IT_CHECK_US=N` the domain's check interval (default 1000 us),
//! `QOS_IT_OVER_CIRCULATION=1` N\* over the hosts' circulation learned for η (issue 39
//! item 1; the hosts judged against their parts of the N\* reported after each phase);
//! `QOS_IT_EFFICIENCY=N` the operating point's efficiency η (thousandths, default 970;
//! with `QOS_IT_SHARING=operating_point`; `QOS_IT_OPERATING_IN_FLIGHT=N` sets Q\* instead,
//! thousandths of a command), `QOS_IT_BASE_LATENCY_US=N` puts SPDK's delay
//! bdev (N µs a command) under every base. With `QOS_IT_COOPERATIVE=1` (the side-by-side
//! test's QoS phases through the initiator plugin), `QOS_IT_INI_OPTS='{...}'` gives every
//! initiator bdev options, and `QOS_IT_INI_LIB_B=<.so>` and/or `QOS_IT_INI_OPTS_B` run
//! the even rounds' QoS phases with another build or other options (variant B, each
//! variant against the plain phases around it, reported apart); `QOS_IT_PASSTHRU_B=1`
//! makes variant B SPDK's own passthru bdev (no initiator plugin).
//!
//! Every test prints its figures. They are `#[ignore]`d: `make accept` runs them on a
//! quiet machine, with the acceptance thresholds (the figures above) asserted
//! (`NVMF_QOS_ACCEPTANCE=1`); without it each asserts only what must hold whatever else
//! runs on the machine (no failed I/O, refusals, limits, looser bounds). They are not in
//! `make test` because weighted sharing does not meet them yet on the real target
//! (docs/benchmarks.md): the domains here set `sharing = weighted`, which is opt-in.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use target_it::*;

const PERIOD_MS: u64 = 500;

/// A target with the plugin preloaded and a 64 MiB base bdev `Malloc0` ([`base_bdev`]).
fn target(s: &Setup) -> Target {
    let mut t = s.target(300);
    base_bdev(&mut t, "Malloc0");
    t
}

/// A 64 MiB malloc bdev `name`; with `QOS_IT_BASE_LATENCY_US=N`, SPDK's delay bdev
/// `name` over one, N µs a command (a base with a device's latency and unbounded
/// parallelism: its depth curve is Little's law up to the target's CPU, not the malloc
/// base's batching alone).
fn base_bdev(t: &mut Target, name: &str) {
    match env_number("QOS_IT_BASE_LATENCY_US", "microseconds, e.g. 100") {
        Some(us) => {
            let raw = format!("{name}Raw");
            t.malloc(&raw, 131072, 512);
            t.call(
                "bdev_delay_create",
                json!({"base_bdev_name": raw, "name": name,
                       "avg_read_latency": us, "p99_read_latency": us,
                       "avg_write_latency": us, "p99_write_latency": us}),
            );
        }
        None => t.malloc(name, 131072, 512),
    }
}

/// bdevperf on core 1, one 4 KiB random-read job per host (`qds[i]` for host i + 1).
fn bdevperf(s: &Setup, hosts: &[usize], qds: &[u32], secs: u32) -> Bdevperf {
    s.randread_per_host(hosts, qds, secs)
}

/// IOPS per host of the same jobs on plain namespaces (no QoS), and their sum.
fn bare(s: &Setup, qds: &[u32], secs: u32) -> (Vec<f64>, f64) {
    let mut t = target(s);
    t.call(
        "bdev_split_create",
        json!({"base_bdev": "Malloc0", "split_count": qds.len()}),
    );
    let bdevs: Vec<String> = (0..qds.len()).map(|i| format!("Malloc0p{i}")).collect();
    expose_per_host(&mut t, &bdevs, s.port);
    let hosts: Vec<usize> = (1..=qds.len()).collect();
    let out = bdevperf(s, &hosts, qds, secs).run();
    let iops: Vec<f64> = hosts
        .iter()
        .map(|&i| {
            out.jobs
                .get(&s.controller(i).bdev())
                .map_or(0.0, |r| r.iops)
        })
        .collect();
    t.stop(30);
    let total = iops.iter().sum();
    println!(
        "  without QoS: {} = {total:.0} IOPS",
        iops.iter()
            .map(|v| format!("{v:.0}"))
            .collect::<Vec<_>>()
            .join(" + ")
    );
    (iops, total)
}

/// QoS bdevs `qos1..` on Malloc0 for hosts 1.., exposed one per host.
fn qos_bdevs(s: &Setup, t: &mut Target, n: usize) {
    let bdevs: Vec<String> = (1..=n)
        .map(|i| t.qos_bdev_for_host(i, "Malloc0", "d"))
        .collect();
    expose_per_host(t, &bdevs, s.port);
}

/// What the hosts' load does without QoS (run for `secs`), and the domain's capacity
/// for it: the operator's profile comes in under what the target does (as the
/// estimator expects), at `profile_factor()` of the measured total.
fn profiled(s: &Setup, qds: &[u32], secs: u32) -> (f64, u64) {
    let (_, bare_total) = bare(s, qds, secs);
    (bare_total, (bare_total * profile_factor()) as u64)
}

fn domain(t: &mut Target, capacity: u64) {
    let sharing = std::env::var("QOS_IT_SHARING").unwrap_or_else(|_| "weighted".into());
    let estimator = std::env::var("QOS_IT_ESTIMATOR").map_or(true, |v| v != "0");
    let check_us = env_number("QOS_IT_CHECK_US", "microseconds, e.g. 250").unwrap_or(1000);
    let mut params = json!({"name": "d", "period_ms": PERIOD_MS,
           "check_interval_us": check_us, "sharing": sharing, "estimator": estimator});
    // `QOS_IT_CAPACITY=none`: no capacity given (the domain learns it from the target,
    // the default an operator gets); else the profile (`QOS_IT_PROFILE` of bare).
    if std::env::var("QOS_IT_CAPACITY").as_deref() != Ok("none") {
        params["capacity_iops"] = json!(capacity);
        params["capacity_iops_stddev"] = json!(capacity / 20);
    }
    if let Some(eta) = env_number("QOS_IT_EFFICIENCY", "thousandths, e.g. 800") {
        // The operating point's efficiency η (sharing operating_point; default 970).
        params["efficiency_milli"] = json!(eta);
    }
    if let Some(q) = env_number("QOS_IT_OPERATING_IN_FLIGHT", "thousandths of a command") {
        // Q* instead of η: the deepest point of the curve not above it.
        params["operating_in_flight_milli"] = json!(q);
    }
    if over_circulation_learned() {
        // η over the hosts' circulation: N* learned (issue 39 item 1).
        params["operating_over_circulation"] = json!(true);
    }
    if let Some(hold) = env_number("QOS_IT_ESTIMATOR_HOLD", "thousandths, e.g. 30") {
        params["estimator_hold_milli"] = json!(hold);
    }
    t.call("qos_domain_create", params);
}

/// `QOS_IT_OVER_CIRCULATION=1`: the domain's `operating_over_circulation` (N\* learned
/// for η, with `QOS_IT_SHARING=operating_point`).
fn over_circulation_learned() -> bool {
    std::env::var("QOS_IT_OVER_CIRCULATION").as_deref() == Ok("1")
}

/// The four hosts' load without QoS (`bare_secs`), then a target whose domain is
/// configured at `profile_factor()` of that total, host i + 1 reserving `res_pct[i]` %
/// of it with `weights[i]`, and bdevperf started on the QoS bdevs for `secs`. Returns
/// the bare total, the reservations (IOPS), the target and bdevperf.
fn weighted_run(
    s: &Setup,
    qds: &[u32; 4],
    res_pct: [u64; 4],
    weights: [u32; 4],
    bare_secs: u32,
    secs: u32,
) -> (f64, Vec<u64>, Target, Bdevperf) {
    let (bare_total, capacity) = profiled(s, qds, bare_secs);
    let res: Vec<u64> = res_pct.iter().map(|p| capacity * p / 100).collect();
    let mut t = target(s);
    domain(&mut t, capacity);
    for i in 1..=4 {
        t.call(
            "qos_host_set",
            json!({"domain": "d", "host_nqn": host_nqn(i), "min_iops": res[i - 1],
                   "weight": weights[i - 1]}),
        );
    }
    qos_bdevs(s, &mut t, 4);
    let b = bdevperf(s, &[1, 2, 3, 4], qds, secs);
    (bare_total, res, t, b)
}

/// Runs `b` for its time, polling the target every second; `during` is called once per
/// poll with the seconds elapsed. Returns the periods, the start, and the results.
fn run_polling(
    t: &mut Target,
    b: &mut Bdevperf,
    secs: u32,
    mut during: impl FnMut(&mut Target, f64),
) -> (History, Instant, BTreeMap<String, JobResult>) {
    let mut p = History::new("d");
    let t0 = Instant::now();
    let every = Duration::from_secs(1);
    let out = b.run_polling(every, Duration::from_secs(secs as u64 + 1), |_, el| {
        p.poll(t);
        during(t, el.as_secs_f64());
    });
    p.poll(t);
    (p, t0, out.jobs)
}

/// The domain's configured capacity as a fraction of what the same load did without
/// QoS: 0.9 (an operator's profile a little under the target), or `QOS_IT_PROFILE`
/// (e.g. 2.0: the budget never binds, so the run measures the plugin's own cost).
fn profile_factor() -> f64 {
    std::env::var("QOS_IT_PROFILE")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|f: &f64| *f > 0.0 && *f <= 10.0)
        .unwrap_or(0.9)
}

/// Where domain `d` runs on its depth curve at `el` seconds: the commands its hosts had
/// in flight at the base (each host's mean since the last read, summed), the operating
/// point's Q* and C* (`qos_stats_get`), printed as `el:q/Q*@C*`.
fn depth_point(t: &mut Target, el: f64) -> String {
    let st = t.call("qos_stats_get", json!({"domain": "d", "compact": true}));
    let d = st.as_array().and_then(|a| a.first()).unwrap_or(&st);
    let num = |v: &Value| v.as_f64().unwrap_or(0.0);
    let at_base: f64 = d["hosts"].as_array().map_or(0.0, |h| {
        h.iter().map(|h| num(&h["in_flight_at_base"])).sum()
    });
    let op = &d["operating_point"];
    format!(
        "{el:.0}:{at_base:.2}/{:.2}@{:.0}",
        num(&op["in_flight"]),
        num(&op["ops_per_s"]) / 1000.0
    )
}

/// The capacity estimate last polled in or before `epoch` (the polls do not see every
/// period).
fn estimate_at(p: &History, epoch: u64) -> Option<u64> {
    p.estimate.range(..=epoch).next_back().map(|(_, v)| *v)
}

fn show(v: &[f64]) -> String {
    v.iter()
        .map(|x| format!("{:.1}K", x / 1000.0))
        .collect::<Vec<_>>()
        .join(" ")
}

#[test]
#[ignore = "acceptance on a quiet machine: make accept"]
fn weighted_excess_whatever_the_queue_depth() {
    let Some(s) = setup_or_skip("weighted sharing on a real target") else {
        return;
    };
    let qds = queue_depths([16, 32, 48, 64]);
    let weights = [4u32, 3, 2, 1];
    let secs = 26;
    println!("weighted sharing: queue depths {qds:?}, weights {weights:?}");
    // Reservations 15 / 15 / 10 / 5 % of the profile. (A QD-16 host does not reach 40%
    // of this target at any latency it gives: that reservation is marked unreachable,
    // see docs/benchmarks.md.)
    let (bare_total, res, mut t, mut b) =
        weighted_run(&s, &qds, [15, 15, 10, 5], weights, 10, secs);
    // Commands held by QoS and completed, per host, at the start of the steady window
    // and at its end.
    let counts = |t: &mut Target| -> Vec<(u64, u64, bool)> {
        let st = t.compact_stats("d");
        (1..=4)
            .map(|i| {
                st.host(&host_nqn(i)).map_or((0, 0, false), |h| {
                    (
                        h.throttled_ios,
                        h.completed_total.ios,
                        h.reservation_unreachable,
                    )
                })
            })
            .collect()
    };
    let mut at_start = None;
    let mut at_end = None;
    // The operating point at each steady poll: Q*, C*, T(max) (sharing operating_point).
    let mut op_points: Vec<(f64, u64, u64)> = Vec::new();
    let (p, t0, jr) = run_polling(&mut t, &mut b, secs, |t, el| {
        if el >= 10.0 && at_start.is_none() {
            at_start = Some(counts(t));
        } else if el <= secs as f64 {
            at_end = Some(counts(t));
        }
        if el >= 10.0 {
            let op = t.compact_stats("d").operating_point;
            if let (Some(q), Some(c), Some(m)) = (op.in_flight, op.ops_per_s, op.max_ops_per_s) {
                op_points.push((q, c, m));
            }
        }
    });
    t.stop(30);
    // The same load without QoS again: this machine's speed drifts by 10-20 % between
    // runs a minute apart, so the total is compared with the mean of before and after.
    let before = bare_total;
    let (_, after) = bare(&s, &qds, 10);
    let bare_total = (before + after) / 2.0;
    let (at_start, at_end) = (at_start.expect("polled at 10 s"), at_end.expect("polled"));
    // The estimator climbs 1% of the profile a period from 90%: steady after 10 s.
    let epochs = p.epochs(
        t0 + Duration::from_secs(10),
        t0 + Duration::from_secs(secs as u64),
    );
    assert!(epochs.len() >= 20, "only {} steady periods", epochs.len());
    let rates: Vec<Vec<f64>> = (1..=4).map(|i| p.iops(&host_nqn(i), &epochs)).collect();
    let means: Vec<f64> = rates.iter().map(|r| mean(r)).collect();
    let total: f64 = means.iter().sum();
    let above: Vec<f64> = (0..4).map(|i| means[i] - res[i] as f64).collect();
    // Weighted max-min among backlogged hosts: every host here is backlogged, a
    // closed loop that always has its queue depth of commands outstanding. One QoS
    // never holds still wants more: the target's latency bounds it, and the contract is
    // shares by weight whatever the queue depth. (This test used to count a host held
    // under 1% of its commands as wanting no more, so its share was whatever it got;
    // that hid a QD-16 host at 31-34% of the excess for a weight of 40%.)
    let held_frac: Vec<f64> = (0..4)
        .map(|i| {
            let held = at_end[i].0.saturating_sub(at_start[i].0) as f64;
            let done = at_end[i].1.saturating_sub(at_start[i].1).max(1) as f64;
            held / done
        })
        .collect();
    let shares = shares_by_weight(
        above.iter().sum::<f64>().max(0.0),
        &weights.map(|w| w as f64),
    );
    // Sharing operating_point promises every contending host its entitlement
    // e_i = max(r_i, theta w_i) of what the target served (issue 26, water-filling with
    // the reservation as a floor), not its reservation plus a weighted share of the
    // rest (weighted sharing's contract, `shares`): with reservations of 15/15/10/5 %
    // and weights 4/3/2/1 the two differ by +13 % for h1 and -9 % for the others.
    let entitled = entitlements(total, &res, &weights);
    let sharing = std::env::var("QOS_IT_SHARING").unwrap_or_else(|_| "weighted".into());
    let by_entitlement = sharing == "operating_point";
    println!(
        "  with QoS ({} steady periods of {PERIOD_MS} ms): {} = {total:.0} IOPS ({:.1}% of without: {:.1}% of the run before, {:.1}% of the run after)",
        epochs.len(),
        show(&means),
        100.0 * total / bare_total,
        100.0 * total / before,
        100.0 * total / after,
    );
    println!(
        "  capacity estimate at the polls: {}",
        p.estimate
            .values()
            .map(|v| format!("{:.0}K", *v as f64 * 2.0 / 1000.0))
            .collect::<Vec<_>>()
            .join(" ")
    );
    println!(
        "  estimator (offered/budget->next, K IOPS): {}",
        p.decisions_line()
    );
    if !op_points.is_empty() {
        let q: Vec<f64> = op_points.iter().map(|o| o.0).collect();
        let c: Vec<f64> = op_points.iter().map(|o| o.1 as f64).collect();
        let m: Vec<f64> = op_points.iter().map(|o| o.2 as f64).collect();
        println!(
            "  operating point at the steady polls (median): Q* {:.1} commands, C* {:.0} IOPS, T(max) {:.0} IOPS; served {:.1}% of C*, {:.1}% of T(max)",
            median(&q),
            median(&c),
            median(&m),
            100.0 * total / median(&c).max(1.0),
            100.0 * total / median(&m).max(1.0),
        );
    }
    for i in 0..4 {
        println!(
            "  h{}: entitlement e_i = max(r_i, theta w_i) {:.0}, got {:+.1}%",
            i + 1,
            entitled[i],
            100.0 * (means[i] - entitled[i]) / entitled[i].max(1.0)
        );
    }
    for i in 0..4 {
        let share = shares[i];
        let met = rates[i].iter().filter(|&&r| r >= res[i] as f64).count();
        println!(
            "  h{} (QD {}, weight {}): reservation {}, got {:.0} ({:+.0} above; weighted max-min share {share:.0}, {:+.1}%), held {:.2}% of its commands{}, met in {met}/{} periods, bdevperf {:.0} IOPS",
            i + 1,
            qds[i],
            weights[i],
            res[i],
            means[i],
            above[i],
            100.0 * (above[i] - share) / share.max(1.0),
            100.0 * held_frac[i],
            if at_end[i].2 {
                ", reservation unreachable"
            } else {
                ""
            },
            rates[i].len(),
            jr.get(&s.controller(i + 1).bdev()).map_or(0.0, |r| r.iops)
        );
    }
    // Every host's figures are printed before the first check that could fail.
    for i in 0..4 {
        let share = shares[i];
        let met = rates[i].iter().filter(|&&r| r >= res[i] as f64).count();
        // Always: each host gets at least 80% of its weighted max-min allocation
        // (reservation plus share); first come gives the QD-16 host far less.
        let alloc = res[i] as f64 + share;
        if by_entitlement {
            let e = entitled[i];
            check(
                (means[i] - e).abs() <= 0.10 * e.max(1.0),
                means[i] >= 0.8 * e,
                format_args!("h{}: {:.0}, entitlement {e:.0}", i + 1, means[i]),
            );
        } else {
            check(
                (above[i] - share).abs() <= 0.10 * share.max(1.0),
                means[i] >= 0.8 * alloc,
                format_args!(
                    "h{}: {:.0} above its reservation, weighted max-min share {share:.0} (allocation {alloc:.0})",
                    i + 1,
                    above[i]
                ),
            );
        }
        check(
            met * 100 >= rates[i].len() * 99,
            met * 10 >= rates[i].len() * 5,
            format_args!(
                "h{}: reservation {} met in {met}/{} periods: {}",
                i + 1,
                res[i],
                rates[i].len(),
                show(&rates[i])
            ),
        );
        let failed = jr
            .get(&s.controller(i + 1).bdev())
            .map_or(0, |r| r.io_failed);
        assert_eq!(failed, 0, "h{}: failed I/O", i + 1);
    }
    // Loose: at queue depths 16-64 this target does 63-74 % of the load without QoS
    // with weighted sharing (the Little's-law bound, docs/benchmarks.md, "Weighted
    // sharing ... on the real target"); 0.85 failed every such run. The issue's 0.97
    // stays the acceptance.
    check(
        total >= 0.97 * bare_total,
        total >= 0.6 * bare_total,
        format_args!("total {total:.0} against {bare_total:.0} without QoS"),
    );
}

/// Busy and idle ticks of the target's poll-group threads so far (`thread_get_stats`):
/// a busy-polling reactor is busy when its pollers found work, so the share of busy
/// ticks over a phase says whether the target was the bottleneck.
fn poll_group_ticks(t: &mut Target) -> (u64, u64) {
    let v = t.call("thread_get_stats", Value::Null);
    let threads = v["threads"].as_array().cloned().unwrap_or_default();
    threads
        .iter()
        .filter(|th| {
            th["name"]
                .as_str()
                .is_some_and(|n| n.starts_with("nvmf_tgt_poll_group"))
        })
        .fold((0, 0), |(b, i), th| {
            (
                b + th["busy"].as_u64().unwrap_or(0),
                i + th["idle"].as_u64().unwrap_or(0),
            )
        })
}

/// The QoS total against the bare target, side by side in one target process: every
/// host's subsystem has a plain split of a base (`Bare0`) as namespace 1 and its QoS
/// bdev on a base of the same kind (`Malloc0`) as namespace 2. A plain phase sizes the
/// domain's capacity hint; after one QoS warm-up phase (the domain learns its curve and
/// estimate), `QOS_IT_ROUNDS` rounds (default 5) each run the same bdevperf jobs for
/// `QOS_IT_PHASE_SECS` (default 6) on the QoS namespaces and then on the plain ones. A
/// round's ratio is its QoS total over the mean of the plain phases before and after
/// it, so the machine's changes of speed between runs a minute apart
/// (docs/benchmarks.md) move both sides of a ratio alike, and the rounds whose two
/// plain phases differ by more than 10 % (the machine changed speed meanwhile) are
/// counted apart. Prints the ratios' median and quartiles, and each host against its
/// entitlement `max(r_i, θ w_i)` of the QoS total; `NVMF_QOS_ACCEPTANCE=1` asserts the
/// median ratio of the steady rounds >= 0.97 (issue 26). Otherwise the
/// environment of `weighted_excess_whatever_the_queue_depth` (`QOS_IT_SHARING`,
/// `QOS_IT_EFFICIENCY`, `QOS_IT_QDS`, `QOS_IT_BASE_LATENCY_US`, ...).
#[test]
#[ignore = "acceptance on a quiet machine: make accept"]
fn qos_total_against_bare_side_by_side() {
    let Some(s) = setup_or_skip("QoS against bare, side by side") else {
        return;
    };
    let (workload, loads) = side_by_side_workload([15, 15, 10, 5]);
    let qds: Vec<u32> = loads.iter().map(|l| l.qd).collect();
    let weights: Vec<u32> = loads.iter().map(|l| l.weight).collect();
    let res_pct: Vec<u64> = loads.iter().map(|l| l.res_pct).collect();
    let rounds = env_number("QOS_IT_ROUNDS", "a count, e.g. 5")
        .unwrap_or(5)
        .max(1) as usize;
    let phase = env_number("QOS_IT_PHASE_SECS", "seconds, e.g. 6")
        .unwrap_or(6)
        .max(3) as u32;
    println!(
        "QoS against bare, side by side ({workload}): {}; weights {weights:?}, reservations \
         {res_pct:?} %, {rounds} rounds of {phase} s a phase",
        loads
            .iter()
            .map(HostLoad::describe)
            .collect::<Vec<_>>()
            .join(", ")
    );
    let hosts: Vec<usize> = (1..=loads.len()).collect();
    let mut t = target(&s);
    base_bdev(&mut t, "Bare0");
    t.call(
        "bdev_split_create",
        json!({"base_bdev": "Bare0", "split_count": hosts.len()}),
    );
    let bare_bdevs: Vec<String> = (0..hosts.len()).map(|k| format!("Bare0p{k}")).collect();
    expose_per_host(&mut t, &bare_bdevs, s.port);
    let ctrls: Vec<Controller> = hosts.iter().map(|&i| s.controller(i)).collect();
    const PLAIN: u32 = 1;
    const QOS: u32 = 2;
    // Issue 40 item 2: with QOS_IT_COOPERATIVE=1 the hosts of the QoS phases run the
    // initiator plugin (a `qos_ini` bdev over each QoS namespace): under
    // `operating_point` over circulation they are sent their allowances n_i* and hold
    // their excess themselves. The plain phases stay plain bdev_nvme.
    let cooperative = std::env::var("QOS_IT_COOPERATIVE").as_deref() == Ok("1");
    if cooperative {
        println!("  QoS phases: cooperative hosts (the initiator plugin over each QoS namespace)");
    }
    // `QOS_IT_INI_OPTS='{"pacing": false}'`: options of every initiator bdev (a JSON
    // object merged into `qos_ini_bdev_create`'s parameters), to take the cooperative
    // path's cost apart.
    // `QOS_IT_INI_LIB_B=<path>` and/or `QOS_IT_INI_OPTS_B='{...}'`: the QoS phases of
    // even rounds (2, 4, ...) run variant B (another build of the initiator plugin, other
    // options), the others A (the build found as usual, `QOS_IT_INI_OPTS`): two
    // cooperative paths side by side in one run, each against the plain phases around it.
    let opts_of = |var: &str| -> Option<serde_json::Map<String, Value>> {
        std::env::var(var).ok().map(|j| {
            serde_json::from_str(&j)
                .unwrap_or_else(|e| panic!("{var}={j}: not a JSON object ({e})"))
        })
    };
    let opts_a = opts_of("QOS_IT_INI_OPTS").unwrap_or_default();
    let lib_b = std::env::var("QOS_IT_INI_LIB_B")
        .ok()
        .map(std::path::PathBuf::from);
    let opts_b = opts_of("QOS_IT_INI_OPTS_B");
    // `QOS_IT_PASSTHRU_B=1`: variant B is SPDK's own passthru bdev over each QoS
    // namespace instead (no initiator plugin): what stacking a bdev costs by itself.
    let passthru_b = std::env::var("QOS_IT_PASSTHRU_B").as_deref() == Ok("1");
    let two_variants = cooperative && (lib_b.is_some() || opts_b.is_some() || passthru_b);
    let variants = [
        (s.ini_lib.clone(), opts_a.clone()),
        (
            lib_b.unwrap_or_else(|| s.ini_lib.clone()),
            opts_b.unwrap_or(opts_a),
        ),
    ];
    if cooperative {
        for (k, (lib, o)) in variants.iter().enumerate().take(1 + two_variants as usize) {
            if k == 1 && passthru_b {
                println!("  variant B: SPDK's passthru bdev over each QoS namespace (even rounds)");
                continue;
            }
            println!(
                "  variant {}: {} with options {}{}",
                ["A", "B"][k],
                lib.display(),
                Value::Object(o.clone()),
                if two_variants {
                    [" (odd rounds)", " (even rounds)"][k]
                } else {
                    ""
                }
            );
        }
    }
    // The hosts' IOPS on namespace `ns` for one phase, and the share of the phase the
    // target's poll group was busy; on the QoS namespaces also the domain's statistics
    // a second before the phase ends (the entitlements of the last period under load)
    // and, per host, the commands held at the initiator for its allowance and at the
    // target, and those the target admitted, over the phase until then.
    let phase_run = |t: &mut Target,
                     ns: u32,
                     variant: usize|
     -> (Vec<f64>, f64, Option<DomainStats>, Vec<[u64; 3]>) {
        let (ini_lib, ini_opts) = &variants[variant];
        let passthru = variant == 1 && passthru_b;
        let (b0, i0) = poll_group_ticks(t);
        let coop = cooperative && ns == QOS;
        let bdev = |c: &Controller| format!("{}n{ns}", c.name);
        let ini = |c: &Controller| format!("qi_{}", c.name);
        let dev = |c: &Controller| if coop { ini(c) } else { bdev(c) };
        let jobs = ctrls
            .iter()
            .zip(&loads)
            .map(|(c, l)| l.job(&dev(c)))
            .collect();
        let ini_bdevs: Vec<Value> = if coop {
            ctrls
                .iter()
                .map(|c| {
                    let mut p = json!({"name": ini(c), "base_bdev_name": bdev(c)});
                    for (k, v) in ini_opts {
                        p[k] = v.clone();
                    }
                    p
                })
                .collect()
        } else {
            Vec::new()
        };
        let before = (ns == QOS).then(|| t.compact_stats("d"));
        let mut stats = None;
        let mut ini_held = vec![0u64; ctrls.len()];
        let mut ini_state = vec![String::new(); ctrls.len()];
        let mut config = bdev_config(&ctrls, if passthru { &[] } else { &ini_bdevs });
        if coop && passthru {
            // Before `bdev_wait_for_examine`, the last entry.
            let c = config["subsystems"][0]["config"]
                .as_array_mut()
                .expect("bdev_config's list");
            for ctrl in &ctrls {
                c.insert(
                    c.len() - 1,
                    json!({"method": "bdev_passthru_create",
                           "params": {"name": ini(ctrl), "base_bdev_name": bdev(ctrl)}}),
                );
            }
        }
        let out = Bdevperf::start(
            &s.ini,
            &BdevperfOpts {
                plugin: (coop && !passthru).then(|| ini_lib.clone()),
                config,
                jobs,
                secs: phase,
                shm_id: shm_id(),
                core_mask: "0x2".into(),
                extra: Vec::new(),
            },
        )
        .unwrap_or_else(|e| panic!("{e}"))
        .run_polling(
                Duration::from_millis(500),
                Duration::from_secs(phase as u64 - 1),
                |b, _| {
                    if ns == QOS {
                        stats = Some(t.compact_stats("d"));
                    }
                    for (k, c) in ctrls.iter().enumerate().filter(|_| coop) {
                        if let Ok(v) = b.try_ini_bdev(&ini(c)) {
                            let st = &v["state"];
                            ini_held[k] = st["allowance_held_total"].as_u64().unwrap_or(0);
                            ini_state[k] = format!(
                                "allowance {} ({} applied, {} refused), {} reports, {} vendor commands, {} credits seen, {} held",
                                st["allowance"], st["allowances_applied"], st["allowances_refused"],
                                st["reports_sent"], st["vendor_sent"], st["credits_seen"], st["held_total"]
                            );
                        }
                    }
                },
            );
        if coop {
            println!("    initiators: {}", ini_state.join("; "));
        }
        let (b1, i1) = poll_group_ticks(t);
        let busy = (b1 - b0) as f64 / ((b1 - b0) + (i1 - i0)).max(1) as f64;
        let iops = ctrls
            .iter()
            .map(|c| out.jobs.get(&dev(c)).map_or(0.0, |r| r.iops))
            .collect();
        let held = match (&before, &stats) {
            (Some(a), Some(b)) => hosts
                .iter()
                .zip(&ini_held)
                .map(|(&i, &ini)| {
                    let n = host_nqn(i);
                    let (Some(x), Some(y)) = (a.host(&n), b.host(&n)) else {
                        return [ini, 0, 0];
                    };
                    // Why the target held them: the rules' counts over the phase.
                    if let Some(by) = y.held_by.as_object() {
                        let why: Vec<String> = by
                            .iter()
                            .map(|(k, v)| {
                                let was = x.held_by[k].as_u64().unwrap_or(0);
                                (k, v.as_u64().unwrap_or(0).saturating_sub(was))
                            })
                            .filter(|(_, d)| *d > 0)
                            .map(|(k, d)| format!("{k} {d}"))
                            .collect();
                        if !why.is_empty() {
                            println!("    {n} held at the target by: {}", why.join(", "));
                        }
                    }
                    [
                        ini,
                        y.throttled_ios.saturating_sub(x.throttled_ios),
                        y.admitted_ios_total.saturating_sub(x.admitted_ios_total),
                    ]
                })
                .collect(),
            _ => Vec::new(),
        };
        (iops, busy, stats, held)
    };
    let first: f64 = phase_run(&mut t, PLAIN, 0).0.iter().sum();
    // Over circulation (`operating_point` with `QOS_IT_OPERATING_IN_FLIGHT`, N*): a host
    // is entitled to n_i* / N* of the total, n_i* its part of N* (reservations first,
    // weights, capped at its queue depth), as the plugin's hold targets give it.
    let circulation = (std::env::var("QOS_IT_SHARING").as_deref() == Ok("operating_point"))
        .then(|| env_number("QOS_IT_OPERATING_IN_FLIGHT", "thousandths of a command"))
        .flatten()
        .map(|q| q.div_ceil(1000));
    if let Some(n) = circulation {
        println!("  over circulation, N* = {n}: each host against n_i* / N* of the QoS total");
    }
    let learned = over_circulation_learned() && circulation.is_none();
    if learned {
        println!(
            "  over circulation, N* learned for eta: each host against n_i* / N* of the QoS total, \
             N* as the target reports it after each phase"
        );
    }
    let mut monitor_vs_e: Vec<f64> = Vec::new();
    let capacity = (first * profile_factor()) as u64;
    let res: Vec<u64> = res_pct.iter().map(|p| capacity * p / 100).collect();
    println!("  first plain phase {first:.0} IOPS: capacity hint {capacity}, reservations {res:?}");
    domain(&mut t, capacity);
    for (k, &i) in hosts.iter().enumerate() {
        let mut host = json!({"domain": "d", "host_nqn": host_nqn(i), "weight": weights[k]});
        // A reservation of 0 % (QOS_IT_RES) is none: the plugin refuses min_iops 0.
        if res[k] > 0 {
            host["min_iops"] = json!(res[k]);
        }
        t.call("qos_host_set", host);
        let q = t.qos_bdev_for_host(i, "Malloc0", "d");
        t.call(
            "nvmf_subsystem_add_ns",
            json!({"nqn": subsys_nqn(i), "namespace": {"bdev_name": q}}),
        );
    }
    let warm: f64 = phase_run(&mut t, QOS, 0).0.iter().sum();
    println!("  QoS warm-up phase {warm:.0} IOPS");
    let (plain, mut plain_busy, ..) = phase_run(&mut t, PLAIN, 0);
    let mut bare = vec![plain.iter().sum::<f64>()];
    let mut ratios = Vec::new();
    let mut vs_e: Vec<Vec<f64>> = vec![Vec::new(); hosts.len()];
    for r in 0..rounds {
        let variant = if two_variants { r % 2 } else { 0 };
        let (q, qos_busy, during, held) = phase_run(&mut t, QOS, variant);
        let total: f64 = q.iter().sum();
        // Issue 40 item 2: who held the hosts' commands.
        println!(
            "    held in the phase (at the initiator for its allowance / at the target / admitted by the target): {}",
            held.iter()
                .zip(&hosts)
                .map(|(h, i)| format!(
                    "h{i} {} / {} / {} ({:.2} % at the target)",
                    h[0],
                    h[1],
                    h[2],
                    100.0 * h[1] as f64 / h[2].max(1) as f64
                ))
                .collect::<Vec<_>>()
                .join(", ")
        );
        // The monitor's own report (issue 26's yardstick): contending hosts against
        // their e_i, which caps a host at what its queue depth gives at L*.
        let during = during.expect("polled during the phase");
        let report: Vec<String> = hosts
            .iter()
            .map(|&i| {
                match during
                    .host(&host_nqn(i))
                    .and_then(|h| h.entitlement.clone())
                {
                    Some(e) if e.contending => {
                        let off = e.achieved as f64 / e.entitled.max(1) as f64 - 1.0;
                        monitor_vs_e.push(off);
                        format!(
                            "h{i} contending {:+.1}% of {:.1}K",
                            100.0 * off,
                            e.entitled as f64 / 1e3
                        )
                    }
                    Some(e) => format!(
                        "h{i} self-limited (held {:.0}%, needs QD {:.0})",
                        100.0 * e.held_fraction,
                        e.queue_depth_needed
                    ),
                    None => format!("h{i} -"),
                }
            })
            .collect();
        println!("    monitor's report in the phase: {}", report.join(", "));
        // How much of each host's circulation (its queue depth) the target sees: held
        // and at the base, mean and most at a check interval (issue 39 item 1).
        let seen: Vec<String> = hosts
            .iter()
            .zip(&qds)
            .map(|(&i, qd)| {
                let h = during.host(&host_nqn(i));
                match h.and_then(|h| h.entitlement.clone()) {
                    Some(e) => format!(
                        "h{i} QD {qd}: {:.1} mean, {} most (now {} held, {:.1} at the base)",
                        e.at_target,
                        e.at_target_peak,
                        h.map_or(0, |h| h.held),
                        h.map_or(0.0, |h| h.in_flight_at_base)
                    ),
                    None => format!("h{i} QD {qd}: -"),
                }
            })
            .collect();
        println!(
            "    commands the target sees (held + at the base): {}",
            seen.join(", ")
        );
        let st = t.compact_stats("d");
        let op = &st.operating_point;
        let curve: Vec<String> = op
            .depth_curve
            .iter()
            .map(|p| format!("{:.0}:{:.0}K", p.in_flight, p.ops_per_s as f64 / 1e3))
            .collect();
        println!(
            "    after it: capacity estimate {:?} IOPS; Q* {:.1}, C* {:.0}K, T(max) {:.0}K; curve {}",
            // The estimate is per period.
            st.capacity_estimate.ops.map(|o| o * 1000 / PERIOD_MS),
            op.in_flight.unwrap_or(0.0),
            op.ops_per_s.unwrap_or(0) as f64 / 1e3,
            op.max_ops_per_s.unwrap_or(0) as f64 / 1e3,
            curve.join(" ")
        );
        let busy_before = plain_busy;
        let (plain, busy, ..) = phase_run(&mut t, PLAIN, 0);
        plain_busy = busy;
        bare.push(plain.iter().sum());
        let around = (bare[r] + bare[r + 1]) / 2.0;
        ratios.push(total / around);
        let n_star = circulation.or_else(|| {
            learned
                .then(|| op.in_flight.map(|n| n.round() as u64))
                .flatten()
        });
        if learned {
            let l = op.circulation.as_ref().and_then(|c| c.learned.as_ref());
            println!(
                "    learned: N* {n_star:?}, held/open rate {:?} (last triplet {:?}, {} triplets)",
                l.and_then(|l| l.ratio),
                l.and_then(|l| l.last_ratio),
                l.map_or(0, |l| l.triplets)
            );
        }
        let e = match n_star {
            Some(n_star) => circulation_entitlements(total, &res, &weights, &qds, n_star),
            None => entitlements(total, &res, &weights),
        };
        for (k, v) in vs_e.iter_mut().enumerate() {
            v.push(q[k] / e[k] - 1.0);
        }
        println!(
            "  round {}: plain {:.0} / {:.0}, QoS {total:.0} ({:.1} % of their mean); target busy \
             {:.0} / {:.0} / {:.0} %; hosts {} (vs e_i {})",
            r + 1,
            bare[r],
            bare[r + 1],
            100.0 * total / around,
            100.0 * busy_before,
            100.0 * qos_busy,
            100.0 * plain_busy,
            show(&q),
            vs_e.iter()
                .map(|v| format!("{:+.1}%", 100.0 * v[r]))
                .collect::<Vec<_>>()
                .join(" ")
        );
    }
    let op = t.compact_stats("d").operating_point;
    t.stop(30);
    let (q1, med, q3) = quartiles(&ratios);
    println!(
        "  QoS total / plain: median {:.1} % (quartiles {:.1} - {:.1} %) over {rounds} rounds",
        100.0 * med,
        100.0 * q1,
        100.0 * q3
    );
    // Rounds whose plain phases before and after agree within 10 %: the machine kept
    // its speed through the QoS phase between them (as far as can be seen).
    let steady: Vec<f64> = (0..rounds)
        .filter(|&r| (bare[r] - bare[r + 1]).abs() <= 0.1 * bare[r].max(bare[r + 1]))
        .map(|r| ratios[r])
        .collect();
    let (s1, smed, s3) = quartiles(&steady);
    println!(
        "  in the {} of {rounds} rounds whose plain phases agree within 10 %: median {:.1} % \
         (quartiles {:.1} - {:.1} %)",
        steady.len(),
        100.0 * smed,
        100.0 * s1,
        100.0 * s3
    );
    if two_variants {
        for (k, name) in ["A", "B"].iter().enumerate() {
            let of = |steady_only: bool| -> Vec<f64> {
                (0..rounds)
                    .filter(|r| r % 2 == k)
                    .filter(|&r| {
                        !steady_only
                            || (bare[r] - bare[r + 1]).abs() <= 0.1 * bare[r].max(bare[r + 1])
                    })
                    .map(|r| ratios[r])
                    .collect()
            };
            let (all, st) = (of(false), of(true));
            let ((a1, am, a3), (s1, sm, s3)) = (quartiles(&all), quartiles(&st));
            println!(
                "  variant {name}: QoS total / plain median {:.1} % (quartiles {:.1} - {:.1} %, \
                 rounds {}) over {} rounds; steady {:.1} % ({:.1} - {:.1} %) over {}",
                100.0 * am,
                100.0 * a1,
                100.0 * a3,
                all.iter()
                    .map(|x| format!("{:.1}", 100.0 * x))
                    .collect::<Vec<_>>()
                    .join(" / "),
                all.len(),
                100.0 * sm,
                100.0 * s1,
                100.0 * s3,
                st.len()
            );
        }
    }
    for (k, v) in vs_e.iter().enumerate() {
        let (a, m, b) = quartiles(v);
        println!(
            "  h{} (QD {}, weight {}): vs e_i median {:+.1} % (quartiles {:+.1} - {:+.1} %)",
            k + 1,
            qds[k],
            weights[k],
            100.0 * m,
            100.0 * a,
            100.0 * b
        );
    }
    let (m1, mm, m3) = quartiles(&monitor_vs_e);
    println!(
        "  contending hosts against the monitor's e_i: median {:+.1} % (quartiles {:+.1} - \
         {:+.1} %, worst {:+.1} %) of {} host-phases",
        100.0 * mm,
        100.0 * m1,
        100.0 * m3,
        100.0
            * monitor_vs_e
                .iter()
                .copied()
                .fold(0.0f64, |a, x| if x.abs() > a.abs() { x } else { a }),
        monitor_vs_e.len()
    );
    println!(
        "  operating point at the end: Q* {:?} commands, C* {:?}, T(max) {:?} IOPS",
        op.in_flight, op.ops_per_s, op.max_ops_per_s
    );
    check(
        steady.len() >= 3 && smed >= 0.97,
        med > 0.0,
        format_args!(
            "QoS total {:.1} % of plain (median of {} steady rounds; >= 97 % of at least 3 asked)",
            100.0 * smed,
            steady.len()
        ),
    );
}

/// What the target does without QoS at several total queue depths, rotated through
/// rounds so that the machine's drift hits every depth alike: the bound on weighted
/// sharing's total. To give a host of queue depth q a share s of the target's
/// throughput, the target may hold no more than q / s commands in flight (Little's
/// law), and it is slower with fewer. Prints medians and ranges; asserts only that
/// every run did I/O.
#[test]
#[ignore = "measurement on a quiet machine: make accept"]
fn target_throughput_by_depth() {
    let Some(s) = setup_or_skip("the target's throughput by queue depth") else {
        return;
    };
    let per_host = [2u32, 4, 8, 16, 40];
    let rounds = 3;
    let mut totals: Vec<Vec<f64>> = vec![Vec::new(); per_host.len()];
    for round in 0..rounds {
        for k in 0..per_host.len() {
            // Rotate the order so no depth always runs first in a round.
            let d = (k + round) % per_host.len();
            let qds = [per_host[d]; 4];
            println!(
                "round {}/{rounds}, four hosts at queue depth {}:",
                round + 1,
                qds[0]
            );
            let (_, total) = bare(&s, &qds, 5);
            assert!(total > 0.0, "no I/O at queue depth {}", qds[0]);
            totals[d].push(total);
        }
    }
    let deepest = median(&totals[per_host.len() - 1]);
    println!("in flight | IOPS without QoS, median (min .. max) | share of the deepest");
    for (d, t) in totals.iter().enumerate() {
        let median = median(t);
        println!(
            "{:9} | {median:.0} ({:.0} .. {:.0}) | {:.1}%",
            4 * per_host[d],
            t.iter().copied().fold(f64::INFINITY, f64::min),
            t.iter().copied().fold(0.0, f64::max),
            100.0 * median / deepest
        );
    }
}

/// The entitlements at the operating point (`qos_core::entitlement::entitle`) of hosts
/// that are all backlogged, in `total`: `max(r_i, theta w_i)` adding up to `total`.
fn entitlements(total: f64, res: &[u64], weights: &[u32]) -> Vec<f64> {
    use qos_core::entitlement::{Claimant, entitle};
    let claims: Vec<Claimant> = weights
        .iter()
        .zip(res)
        .map(|(&w, &r)| Claimant {
            weight: u64::from(w),
            reservation: r,
            cap: u64::MAX,
        })
        .collect();
    let mut out = vec![0u64; claims.len()];
    entitle(total.max(0.0) as u64, &claims, &mut out);
    out.into_iter().map(|e| e as f64).collect()
}

/// Over circulation: `total` split as the hosts' parts of N* (`n_star` commands):
/// reservations first as the commands they need at `total` (Little's law), the rest by
/// weight, each capped at its queue depth (`qos_core`'s hold targets do the same).
fn circulation_entitlements(
    total: f64,
    res: &[u64],
    weights: &[u32],
    qds: &[u32],
    n_star: u64,
) -> Vec<f64> {
    use qos_core::entitlement::{Claimant, entitle};
    let claims: Vec<Claimant> = weights
        .iter()
        .zip(res)
        .zip(qds)
        .map(|((&w, &r), &qd)| Claimant {
            weight: u64::from(w),
            reservation: (r as f64 * n_star as f64 / total.max(1.0)).ceil() as u64,
            cap: u64::from(qd),
        })
        .collect();
    let mut out = vec![0u64; claims.len()];
    entitle(n_star, &claims, &mut out);
    let sum = out.iter().sum::<u64>().max(1) as f64;
    out.into_iter().map(|n| total * n as f64 / sum).collect()
}

/// Weighted max-min shares of `amount` among hosts that are all backlogged: in
/// proportion to weight.
fn shares_by_weight(amount: f64, weights: &[f64]) -> Vec<f64> {
    let sum: f64 = weights.iter().sum();
    weights
        .iter()
        .map(|w| amount * w / sum.max(f64::MIN_POSITIVE))
        .collect()
}

#[test]
#[ignore = "acceptance on a quiet machine: make accept"]
fn reservations_hold_when_capacity_drops() {
    let Some(s) = setup_or_skip("capacity drop on a real target") else {
        return;
    };
    let qds = [16u32, 32, 48, 64];
    let secs = 30;
    let (hog_at, hog_secs) = (12.0, 16u64);
    // `QOS_IT_CPU_QUOTA` (default 0.6): the target's share of its core from 12 s.
    let cpu_fraction = std::env::var("QOS_IT_CPU_QUOTA")
        .ok()
        .and_then(|v| v.parse::<f64>().ok())
        .filter(|f| *f > 0.05 && *f < 1.0)
        .unwrap_or(0.6);
    println!(
        "capacity drop: queue depths {qds:?}, the target held to {cpu_fraction} of its core (a CPU quota) from {hog_at} s"
    );
    // The case, in proportion to what the QoS'd target delivers: its
    // reservations (45 % of a configured capacity the target delivered under QoS) came
    // to about 60 % of the capacity left after the drop, the QD-16 host's (the largest)
    // to about 27 %. Weighted sharing delivers 65-80 % of the profile at these queue
    // depths (docs/benchmarks.md), so the same share of the profile would be far more of
    // the dropped target: 20 / 13 / 8 / 4 % of it asked the QD-16 host for 41-45 % of the
    // target during the drop, which by Little's law needs at most 39 commands there.
    // 12 / 8 / 5 / 3 % keeps the proportions; `QOS_IT_DROP_RES=a,b,c,d` sets
    // others (percent of the profile).
    let res_pct: [u64; 4] = percents("QOS_IT_DROP_RES", &[12, 8, 5, 3])
        .try_into()
        .expect("four percentages");
    let (_, res, mut t, mut b) = weighted_run(&s, &qds, res_pct, [4, 3, 2, 1], 8, secs);
    let quota = CpuQuota::attach(t.pid().expect("the target runs"))
        .expect("a CPU quota on the target (cgroup-v1 cpu controller)");
    let mut hog: Option<Instant> = None;
    let mut depth_trace = Vec::new();
    let (p, t0, jr) = run_polling(&mut t, &mut b, secs, |t, el| {
        depth_trace.push(depth_point(t, el));
        if hog.is_none() && el >= hog_at {
            assert!(quota.limit(cpu_fraction), "set the CPU quota");
            hog = Some(Instant::now());
        } else if hog.is_some_and(|at| at.elapsed().as_secs() >= hog_secs) {
            quota.limit(2.0);
        }
    });
    let hog_start = hog.expect("the quota was set");
    let throttled = quota.throttled_periods();
    drop(quota);
    println!("  the quota throttled the target in {throttled} periods of 10 ms");
    t.stop(30);
    let before = p.epochs(t0 + Duration::from_secs(6), hog_start);
    let during = p.epochs(hog_start, hog_start + Duration::from_secs(hog_secs - 2));
    let total = |e: &[u64]| (1..=4).map(|i| mean(&p.iops(&host_nqn(i), e))).sum::<f64>();
    println!(
        "  total before the quota {:.0} IOPS, during {:.0} ({:.0}% of before); reserved {} ({:.0}% of the total during; the QD-16 host's {:.0}%); estimate {:?} -> {:?}",
        total(&before),
        total(&during),
        100.0 * total(&during) / total(&before),
        res.iter().sum::<u64>(),
        100.0 * res.iter().sum::<u64>() as f64 / total(&during).max(1.0),
        100.0 * res[0] as f64 / total(&during).max(1.0),
        before.last().and_then(|e| estimate_at(&p, *e)),
        during.last().and_then(|e| estimate_at(&p, *e))
    );
    println!(
        "  estimator (offered/budget->next, K IOPS): {}",
        p.decisions_line()
    );
    println!(
        "  at the base each second (s: commands in flight / Q* of the depth curve, C* K IOPS): {}",
        depth_trace.join(" ")
    );
    assert!(
        during.len() >= 10,
        "only {} periods under load",
        during.len()
    );
    assert!(
        total(&during) < 0.9 * total(&before),
        "the CPU quota did not take capacity: {:.0} vs {:.0}",
        total(&during),
        total(&before)
    );
    // No estimate drop larger than the target's: the lowest estimate while the quota
    // holds, against the last before it, is compared with what the hosts got during
    // against before (the estimate is per period; the totals are IOPS).
    let real_drop = total(&during) / total(&before).max(1.0);
    let est_before = before.last().and_then(|e| estimate_at(&p, *e));
    let est_low = during.iter().filter_map(|e| estimate_at(&p, *e)).min();
    if let (Some(b), Some(low)) = (est_before, est_low) {
        let est_drop = low as f64 / b.max(1) as f64;
        println!(
            "  estimate {b} -> lowest {low} during the quota: {:.1} % of before; the hosts got {:.1} %",
            100.0 * est_drop,
            100.0 * real_drop
        );
        check(
            est_drop >= 0.95 * real_drop,
            est_drop >= 0.8 * real_drop,
            format_args!(
                "the estimate fell to {:.1} % of before, the target to {:.1} %",
                100.0 * est_drop,
                100.0 * real_drop
            ),
        );
    }
    for i in 1..=4 {
        let r = res[i - 1] as f64;
        let rates = p.iops(&host_nqn(i), &during);
        println!(
            "  h{i} (QD {}, reservation {}): {}; bdevperf {:.0} IOPS",
            qds[i - 1],
            res[i - 1],
            show(&rates),
            jr.get(&s.controller(i).bdev()).map_or(0.0, |r| r.iops)
        );
        let first_ok = rates.iter().position(|&x| x >= r).unwrap_or(rates.len());
        let missed = rates[first_ok..].iter().filter(|&&x| x < r).count();
        check(
            first_ok <= 3 && missed * 100 <= rates.len(),
            mean(&rates) >= 0.9 * r,
            format_args!(
                "h{i}: reservation {r} met again after {first_ok} periods, then missed {missed}; mean {:.0}",
                mean(&rates)
            ),
        );
        assert_eq!(
            jr.get(&s.controller(i).bdev()).map_or(0, |r| r.io_failed),
            0,
            "h{i}: failed I/O"
        );
    }
}

#[test]
#[ignore = "acceptance on a quiet machine: make accept"]
fn group_reservation_and_limit() {
    let Some(s) = setup_or_skip("tenant groups on a real target") else {
        return;
    };
    let qds = [16u32, 64, 32, 48];
    let secs = 24;
    println!("tenant groups: h1 and h2 in group g, h3 and h4 alone; queue depths {qds:?}");
    let (_, capacity) = profiled(&s, &qds, 8);
    let pct = |p: u64| capacity * p / 100;
    let (g_min, g_max) = (pct(40), pct(50));
    let mut t = target(&s);
    domain(&mut t, capacity);
    // Bad input first, each refused with what to change.
    t.refuse(
        "qos_group_create",
        json!({"domain": "d", "name": "g", "min_iops": g_max, "max_iops": g_min}),
        -22,
        "exceeds its limit",
    );
    t.call(
        "qos_group_create",
        json!({"domain": "d", "name": "g", "min_iops": g_min, "max_iops": g_max, "weight": 2}),
    );
    t.refuse(
        "qos_host_set",
        json!({"domain": "d", "host_nqn": host_nqn(1), "min_iops": 10, "group": "nope"}),
        -2,
        "create it first",
    );
    t.refuse(
        "qos_host_set",
        json!({"domain": "d", "host_nqn": host_nqn(1), "min_iops": g_min + 100, "group": "g"}),
        -28,
        "group level",
    );
    for (i, min, w, group) in [
        (1, pct(15), 1, Some("g")),
        (2, pct(5), 3, Some("g")),
        (3, pct(10), 1, None),
        (4, pct(5), 1, None),
    ] {
        let mut p = json!({"domain": "d", "host_nqn": host_nqn(i), "min_iops": min, "weight": w});
        if let Some(g) = group {
            p["group"] = json!(g);
        }
        t.call("qos_host_set", p);
    }
    t.refuse(
        "qos_group_delete",
        json!({"domain": "d", "name": "g"}),
        -16,
        "move them out first",
    );
    let saved = t.save_config();
    let text = saved.to_string();
    let pos = |m: &str| text.find(m).unwrap_or(usize::MAX);
    assert!(
        pos("qos_group_create") < pos("qos_host_set"),
        "save_config replays groups before hosts"
    );
    qos_bdevs(&s, &mut t, 4);
    let mut b = bdevperf(&s, &[1, 2, 3, 4], &qds, secs);
    // Mid-run, host 4 joins the group for a few seconds and leaves again: no I/O may
    // fail or be lost (bdevperf would not finish).
    let mut moved = 0;
    let (p, t0, jr) = run_polling(&mut t, &mut b, secs, |t, el| {
        let h4 = |g: Option<&str>| {
            let mut p = json!({"domain": "d", "host_nqn": host_nqn(4), "min_iops": pct(5)});
            if let Some(g) = g {
                p["group"] = json!(g);
            }
            p
        };
        if moved == 0 && el >= 16.0 {
            t.call("qos_host_set", h4(Some("g")));
            moved = 1;
        } else if moved == 1 && el >= 19.0 {
            t.call("qos_host_set", h4(None));
            moved = 2;
        }
    });
    t.stop(30);
    for (name, r) in &jr {
        assert_eq!(r.io_failed, 0, "{name}: failed I/O");
    }
    let epochs = p.epochs(t0 + Duration::from_secs(8), t0 + Duration::from_secs(15));
    assert!(epochs.len() >= 10, "only {} steady periods", epochs.len());
    let g_rates: Vec<f64> = (0..epochs.len())
        .map(|k| p.iops(&host_nqn(1), &epochs)[k] + p.iops(&host_nqn(2), &epochs)[k])
        .collect();
    println!(
        "  group g (min {g_min}, max {g_max}) per period: {}",
        show(&g_rates)
    );
    for i in 1..=4 {
        println!(
            "  h{i}: mean {:.0} IOPS in the steady periods; bdevperf {:.0} IOPS, {} failed",
            mean(&p.iops(&host_nqn(i), &epochs)),
            jr.get(&s.controller(i).bdev()).map_or(0.0, |r| r.iops),
            jr.get(&s.controller(i).bdev()).map_or(0, |r| r.io_failed)
        );
    }
    for (k, &g) in g_rates.iter().enumerate() {
        // The limit is enforced by tokens: it holds whatever the machine does.
        assert!(
            g <= 1.01 * g_max as f64,
            "period {k}: group got {g:.0} > {g_max} + 1%"
        );
    }
    let below = g_rates.iter().filter(|&&g| g < g_min as f64).count();
    check(
        below == 0,
        mean(&g_rates) >= 0.9 * g_min as f64,
        format_args!(
            "group below its reservation {g_min} in {below}/{} periods (mean {:.0})",
            g_rates.len(),
            mean(&g_rates)
        ),
    );
}

#[test]
#[ignore = "acceptance on a quiet machine: make accept"]
fn soft_guarantees_by_priority() {
    let Some(s) = setup_or_skip("priority classes on a real target") else {
        return;
    };
    let qds = [8u32, 16, 64, 64];
    let secs = 16;
    println!("priority classes: h1, h2 high (soft guarantees), h3, h4 low; queue depths {qds:?}");
    let (_, capacity) = profiled(&s, &qds, 8);
    let pct = |p: u64| capacity * p / 100;
    let soft = pct(25);
    let setup_hosts = |t: &mut Target| {
        domain(t, capacity);
        for i in 1..=2 {
            t.call(
                "qos_host_set",
                json!({"domain": "d", "host_nqn": host_nqn(i), "min_iops": pct(5),
                       "soft_min_iops": soft, "priority": "high"}),
            );
        }
        for i in 3..=4 {
            t.call(
                "qos_host_set",
                json!({"domain": "d", "host_nqn": host_nqn(i), "priority": "low"}),
            );
        }
        qos_bdevs(&s, t, 4);
    };
    // Everyone busy: the soft guarantees hold whatever the low-priority load.
    let mut t = target(&s);
    setup_hosts(&mut t);
    let mut b = bdevperf(&s, &[1, 2, 3, 4], &qds, secs);
    let (p, t0, _) = run_polling(&mut t, &mut b, secs, |_, _| {});
    t.stop(30);
    let epochs = p.epochs(
        t0 + Duration::from_secs(6),
        t0 + Duration::from_secs(secs as u64),
    );
    let busy_total: f64 = (1..=4).map(|i| mean(&p.iops(&host_nqn(i), &epochs))).sum();
    for i in 1..=2 {
        let rates = p.iops(&host_nqn(i), &epochs);
        let met = rates.iter().filter(|&&r| r >= soft as f64).count();
        println!(
            "  h{i} (high, soft {soft}): {}; met in {met}/{}",
            show(&rates),
            rates.len()
        );
        check(
            met * 100 >= rates.len() * 99,
            mean(&rates) >= 0.9 * soft as f64,
            format_args!(
                "h{i}: soft guarantee {soft} met in {met}/{} periods (mean {:.0})",
                rates.len(),
                mean(&rates)
            ),
        );
    }
    // The high-priority hosts idle (connected, no I/O): the low ones get it back.
    let mut t = target(&s);
    setup_hosts(&mut t);
    let mut b = bdevperf(&s, &[3, 4], &qds[2..], secs);
    let (p, t0, _) = run_polling(&mut t, &mut b, secs, |_, _| {});
    t.stop(30);
    let epochs = p.epochs(
        t0 + Duration::from_secs(6),
        t0 + Duration::from_secs(secs as u64),
    );
    let low: f64 = (3..=4).map(|i| mean(&p.iops(&host_nqn(i), &epochs))).sum();
    println!(
        "  all busy: {busy_total:.0} IOPS; high idle: the low-priority hosts get {low:.0} ({:.1}%)",
        100.0 * low / busy_total
    );
    check(
        low >= 0.95 * busy_total,
        low >= 0.85 * busy_total,
        format_args!("low priority with the high idle: {low:.0} of {busy_total:.0}"),
    );
}

/// A capacity configuration of `capacity_is_learned_not_guessed`.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Hint {
    /// No capacity given: learned.
    None,
    /// This factor of the bare total, as the estimator's starting hint.
    Factor(f64),
    /// Ten times the bare total with the estimator off: a budget that never binds, the
    /// plugin's own cost with the reservations' paced release (reference, not an
    /// acceptance case).
    NoBudget,
    /// As `NoBudget` with no reservations: the plugin's per-command cost alone.
    NoBudgetNoReservations,
}

impl Hint {
    fn name(self) -> String {
        match self {
            Hint::None => "none".into(),
            Hint::Factor(f) => format!("{f}x bare"),
            Hint::NoBudget => "no budget (reference)".into(),
            Hint::NoBudgetNoReservations => "no budget, no reservations (reference)".into(),
        }
    }
}

/// `QOS_IT_HINTS`: a comma list of factors of the bare total, `none`, `nobudget` or
/// `nores`; default `nores,nobudget,none,0.2,2,0.9`.
fn capacity_hints() -> Vec<Hint> {
    let v =
        std::env::var("QOS_IT_HINTS").unwrap_or_else(|_| "nores,nobudget,none,0.2,2,0.9".into());
    v.split(',')
        .map(|x| match x.trim() {
            "none" => Hint::None,
            "nobudget" => Hint::NoBudget,
            "nores" => Hint::NoBudgetNoReservations,
            f => Hint::Factor(
                f.parse::<f64>()
                    .ok()
                    .filter(|f| *f > 0.0 && *f <= 10.0)
                    .unwrap_or_else(|| {
                        panic!(
                            "QOS_IT_HINTS={v:?}: give factors in (0, 10], `none`, `nobudget` or `nores`, e.g. none,0.2,2"
                        )
                    }),
            ),
        })
        .collect()
}

/// One run of `capacity_is_learned_not_guessed`: the bare total before and after, the
/// total with QoS from the 5th period, and each host's periods with its reservation met.
struct HintRun {
    before: f64,
    after: f64,
    total: f64,
    met: Vec<(usize, usize)>,
    failed: u64,
}

impl HintRun {
    /// The machine's speed moved between the bare runs around it by more than 10 %:
    /// the ratio says more about the machine than about QoS.
    fn drifted(&self) -> bool {
        (self.before - self.after).abs() > 0.1 * self.before.max(self.after)
    }
    fn ratio(&self) -> f64 {
        self.total / ((self.before + self.after) / 2.0)
    }
}

/// Issue 26: a capacity the operator guessed wrong (5x too low, 2x too high) or did not
/// give costs little: from the 5th period after the load starts the total is >= 97 % of
/// the same load without QoS (measured right before and after) and every reservation is
/// met in >= 99 % of periods. Four hosts at queue depths 16 / 32 / 48 / 64 with the
/// default sharing (`first_come`), reservations 8 / 10 / 10 / 5 % of the bare total (the
/// issue's saturation case), none above 90 % of what its host does without QoS, scaled
/// to fit a hint below them. `QOS_IT_ROUNDS` (default 3) rounds of every hint; a run
/// whose bare totals before and after differ by more than 10 % is reported and left out
/// of the medians (this machine's speed moves by up to 2x within a minute).
/// `QOS_IT_SHARING` picks another sharing, `QOS_IT_HINTS` the hints.
#[test]
#[ignore = "acceptance on a quiet machine: make accept"]
fn capacity_is_learned_not_guessed() {
    let Some(s) = setup_or_skip("a capacity learned from the target") else {
        return;
    };
    let qds = [16u32, 32, 48, 64];
    let res_pct = [8u64, 10, 10, 5];
    let secs = 16u32;
    let rounds = env_number("QOS_IT_ROUNDS", "rounds, e.g. 3")
        .unwrap_or(3)
        .max(1);
    let sharing = std::env::var("QOS_IT_SHARING").unwrap_or_else(|_| "first_come".into());
    let hints = capacity_hints();
    println!(
        "capacity learned: queue depths {qds:?}, reservations {res_pct:?} % of bare, {sharing}, {rounds} rounds"
    );
    let mut runs: Vec<Vec<HintRun>> = hints.iter().map(|_| Vec::new()).collect();
    for round in 1..=rounds {
        for (k, &hint) in hints.iter().enumerate() {
            println!("round {round}/{rounds}, hint {}:", hint.name());
            runs[k].push(hint_run(&s, hint, &qds, &res_pct, secs, &sharing));
        }
    }
    println!(
        "hint | total / bare from the 5th period: median (quartiles) [runs left out] | reservations met (worst host, all runs)"
    );
    let mut checks: Vec<(bool, bool, String)> = Vec::new();
    for (hint, r) in hints.iter().zip(&runs) {
        let kept: Vec<f64> = r
            .iter()
            .filter(|x| !x.drifted())
            .map(HintRun::ratio)
            .collect();
        let left_out: Vec<String> = r
            .iter()
            .filter(|x| x.drifted())
            .map(|x| format!("{:.3}", x.ratio()))
            .collect();
        let (met, n) =
            r.iter()
                .flat_map(|x| x.met.iter())
                .fold((usize::MAX, 1usize), |(m, n), &(a, b)| {
                    if a * n < m.saturating_mul(b) {
                        (a, b)
                    } else {
                        (m, n)
                    }
                });
        let (q1, med, q3) = if kept.is_empty() {
            (f64::NAN, f64::NAN, f64::NAN)
        } else {
            quartiles(&kept)
        };
        println!(
            "{} | {med:.3} ({q1:.3} .. {q3:.3}) [{}] | {met}/{n}",
            hint.name(),
            left_out.join(" ")
        );
        let failed: u64 = r.iter().map(|x| x.failed).sum();
        assert_eq!(failed, 0, "hint {}: failed I/O", hint.name());
        if matches!(hint, Hint::NoBudget | Hint::NoBudgetNoReservations) {
            continue;
        }
        checks.push((
            met * 100 >= n * 99,
            met * 10 >= n * 5,
            format!(
                "hint {}: a reservation met in {met}/{n} periods",
                hint.name()
            ),
        ));
        checks.push((
            kept.is_empty() || med >= 0.97,
            kept.is_empty() || med >= 0.5,
            format!("hint {}: median total / bare {med:.3}", hint.name()),
        ));
    }
    for (strict, loose, what) in checks {
        check(strict, loose, format_args!("{what}"));
    }
}

/// One run of `capacity_is_learned_not_guessed` with `hint`: bare, QoS, bare.
fn hint_run(
    s: &Setup,
    hint: Hint,
    qds: &[u32; 4],
    res_pct: &[u64; 4],
    secs: u32,
    sharing: &str,
) -> HintRun {
    let (alone, before) = bare(s, qds, 6);
    // Reservations that fit within the hint (the issue: "with reservations that fit
    // within it"): scaled to 85 % of a hint below their sum. And none above 90 % of what
    // its host did without QoS: near what it gets at full load, as in the issue (the
    // QD-16 host's 8 % of this machine's total is about all it does without QoS).
    let fit = match hint {
        Hint::Factor(f) => (0.85 * f * 100.0 / res_pct.iter().sum::<u64>() as f64).min(1.0),
        _ => 1.0,
    };
    let res: Vec<u64> = res_pct
        .iter()
        .zip(&alone)
        .map(|(p, a)| (before * fit * *p as f64 / 100.0).min(0.9 * a) as u64)
        .collect();
    let mut t = target(s);
    let mut params = json!({"name": "d", "period_ms": PERIOD_MS, "sharing": sharing});
    let capacity = match hint {
        Hint::None => None,
        Hint::Factor(f) => Some((before * f) as u64),
        Hint::NoBudget | Hint::NoBudgetNoReservations => {
            params["estimator"] = json!(false);
            Some((before * 10.0) as u64)
        }
    };
    let res = if hint == Hint::NoBudgetNoReservations {
        vec![0; res.len()]
    } else {
        res
    };
    if let Some(c) = capacity {
        params["capacity_iops"] = json!(c);
        params["capacity_iops_stddev"] = json!(c / 20);
    }
    t.call("qos_domain_create", params);
    for i in 1..=4 {
        let mut host = json!({"domain": "d", "host_nqn": host_nqn(i)});
        if res[i - 1] > 0 {
            host["min_iops"] = json!(res[i - 1]);
        }
        t.call("qos_host_set", host);
    }
    qos_bdevs(s, &mut t, 4);
    let mut b = bdevperf(s, &[1, 2, 3, 4], qds, secs);
    let (p, t0, jr) = run_polling(&mut t, &mut b, secs, |_, _| {});
    t.stop(30);
    let (_, after) = bare(s, qds, 6);
    let load = p
        .first_busy(&host_nqn(1), 0, 0)
        .expect("host 1 did I/O through QoS");
    let steady: Vec<u64> = p
        .epochs(t0, t0 + Duration::from_secs(secs as u64))
        .into_iter()
        .filter(|&e| e >= load + 4)
        .collect();
    assert!(
        steady.len() >= 10,
        "only {} periods from the 5th",
        steady.len()
    );
    let per_period: Vec<f64> = steady
        .iter()
        .map(|&e| (1..=4).map(|i| p.iops(&host_nqn(i), &[e])[0]).sum())
        .collect();
    let run = HintRun {
        before,
        after,
        total: mean(&per_period),
        met: (1..=4)
            .map(|i| {
                let rates = p.iops(&host_nqn(i), &steady);
                let met = rates.iter().filter(|&&x| x >= res[i - 1] as f64).count();
                (met, rates.len())
            })
            .collect(),
        failed: (1..=4)
            .map(|i| jr.get(&s.controller(i).bdev()).map_or(0, |r| r.io_failed))
            .sum(),
    };
    println!(
        "  from the 5th period {:.0} IOPS = {:.3} of without ({before:.0} before, {after:.0} after{}); per period {}",
        run.total,
        run.ratio(),
        if run.drifted() {
            "; the machine's speed moved: left out"
        } else {
            ""
        },
        show(&per_period)
    );
    println!(
        "  estimator (offered/budget->next, K IOPS): {}",
        p.decisions_line()
    );
    for i in 1..=4 {
        let (met, n) = run.met[i - 1];
        println!(
            "    h{i} (QD {}, reservation {}): mean {:.0}, met in {met}/{n} periods",
            qds[i - 1],
            res[i - 1],
            mean(&p.iops(&host_nqn(i), &steady)),
        );
    }
    run
}
