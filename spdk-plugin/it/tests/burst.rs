//! Burst credits (issue 28) on a real `nvmf_tgt` near saturation. Three plain NVMe/TCP
//! hosts in one bdevperf process on core 1, the target on core 0, 4 KiB random reads.
//! The same load first runs without QoS; the domain's capacity C is 0.9 of that total
//! (an operator's profile under what the target does; `QOS_IT_PROFILE` sets another
//! fraction), 500 ms periods, first come.
//!
//! - host 1: limit 10 % of C, burst to 30 % of C for 4 s (a bucket of 8 periods);
//! - hosts 2 and 3: reservation 30 % of C each, limited to 32 %, so that the burst fits
//!   in what is left of C (94 % in all) and the test measures the burst, not the
//!   sharing. (With the burst taking all of the unreserved capacity, the lag rule cut it
//!   to nothing in any period in which a reserved host fell behind.)
//!
//! Two runs of 12 s with 10 s idle between them (the bucket refills in 8 s at the
//! limit's rate). In each, host 1 runs at its burst rate for the bucket's seconds, then
//! at its limit, and hosts 2 and 3 meet their reservations in every period of the burst.
//! Then `save_config` is replayed into a new target: the burst is kept and the bucket
//! starts full.
//!
//! What holds whatever the machine does (tokens) is asserted always: host 1 never above
//! its burst rate (+1 %), and the work it did above its limit, net of what it left under
//! it, never more than its bucket (+1 period at the burst's excess). The issue's
//! acceptance figures (burst rate +-2 % for the bucket's seconds +-1 period, then the
//! limit +-1 %, reservations met in >= 99 % of the burst's periods) need the machine to
//! serve C all along: asserted with `NVMF_QOS_ACCEPTANCE=1`, printed otherwise. Prints `SKIPPED: ...` and passes when
//! SPDK, bdevperf or the plugins are not found.

use std::time::{Duration, Instant};

use serde_json::json;
use target_it::*;

const PERIOD_MS: u64 = 500;
/// Each host deep enough to do more than a third of the bare total (above the 32 % of C
/// hosts 2 and 3 may take). With 64/32/32 a QD-32 host did about a quarter of bare
/// (129 K of 515 K) against a reservation of 30 % of C (139 K): it reached it only while
/// host 1 was held, so it lagged, the lag rule closed the pool to host 1, and the
/// starts of second runs went that way for up to 7 periods.
const QDS: [u32; 3] = [64, 64, 64];
const BUCKET_SECS: u64 = 4;
const RUN_SECS: u32 = 12;

/// bdevperf on core 1, one 4 KiB random-read job per host at its queue depth.
fn bdevperf(s: &Setup, secs: u32) -> Bdevperf {
    let hosts: Vec<usize> = (1..=QDS.len()).collect();
    s.randread_per_host(&hosts, &QDS, secs)
}

/// The load's total IOPS without QoS (one malloc partition per host).
fn bare_total(s: &Setup) -> f64 {
    let mut t = s.target(120);
    t.malloc("Malloc0", 131072, 512);
    t.call(
        "bdev_split_create",
        json!({"base_bdev": "Malloc0", "split_count": QDS.len()}),
    );
    let bdevs: Vec<String> = (0..QDS.len()).map(|i| format!("Malloc0p{i}")).collect();
    expose_per_host(&mut t, &bdevs, s.port);
    let total = bdevperf(s, 8).run().total_iops();
    t.stop(30);
    total
}

/// A burst below the limit, without a limit, and buckets of 0 s and above a day: each
/// refused with what to change.
fn refuse_bad_bursts(
    t: &mut Target,
    h1: &dyn Fn(serde_json::Value) -> serde_json::Value,
    limit: u64,
    burst: u64,
) {
    t.refuse(
        "qos_host_set",
        h1(json!({"max_iops": limit, "burst_iops": limit / 2, "burst_seconds": 4})),
        -22,
        "give a burst at or above the limit",
    );
    t.refuse(
        "qos_host_set",
        h1(json!({"burst_iops": burst, "burst_seconds": 4})),
        -22,
        "set max_iops",
    );
    for secs in [0, 86_401] {
        t.refuse(
            "qos_host_set",
            h1(json!({"max_iops": limit, "burst_iops": burst, "burst_seconds": secs})),
            -22,
            "give burst_seconds in that range",
        );
    }
}

/// The domain's capacity as a fraction of what the load did without QoS: 0.9, or
/// `QOS_IT_PROFILE` (a smaller one leaves room for a machine that slows down).
fn profile_factor() -> f64 {
    std::env::var("QOS_IT_PROFILE")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|f: &f64| *f > 0.0 && *f <= 1.0)
        .unwrap_or(0.9)
}

/// One run of the load, the target polled every second. Returns the full periods of
/// the run (the first, partial one left out).
fn run(s: &Setup, t: &mut Target, p: &mut History) -> Vec<u64> {
    let mut b = bdevperf(s, RUN_SECS);
    let t0 = Instant::now();
    let out = b.run_polling(
        Duration::from_secs(1),
        Duration::from_secs(RUN_SECS as u64 + 1),
        |_, _| p.poll(t),
    );
    p.poll(t);
    for (name, r) in &out.jobs {
        assert_eq!(r.io_failed, 0, "{name}: failed I/O");
    }
    println!("  bdevperf: {:.0} IOPS in all", out.total_iops());
    // The periods the jobs ran through (not the one they stopped in).
    p.epochs(t0, t0 + Duration::from_secs(RUN_SECS as u64))
}

#[test]
fn a_full_bucket_bursts_for_its_seconds_then_the_limit_holds_and_reservations_are_met() {
    let Some(s) = setup_or_skip("burst credits on a real target") else {
        return;
    };
    let bare = bare_total(&s);
    let capacity = (bare * profile_factor()) as u64;
    let pct = |p: u64| capacity * p / 100;
    let (limit, burst, reserved, reserved_max) = (pct(10), pct(30), pct(30), pct(32));
    println!(
        "burst credits: without QoS {bare:.0} IOPS; C = {capacity}; host 1 limit {limit} burst \
         {burst} for {BUCKET_SECS} s; hosts 2, 3 reserve {reserved} each (limit {reserved_max}); \
         {PERIOD_MS} ms periods"
    );
    let mut t = s.target(300);
    t.malloc("Malloc0", 131072, 512);
    let sharing = std::env::var("QOS_IT_SHARING").unwrap_or_else(|_| "first_come".into());
    t.call(
        "qos_domain_create",
        json!({"name": "d", "capacity_iops": capacity, "period_ms": PERIOD_MS,
               "estimator": false, "sharing": sharing}),
    );
    // QOS_IT_BURST=0: the same load with host 1 at its limit alone (a comparison, which
    // also runs against a plugin without bursts: NVMF_QOS_TGT_LIB).
    let with_burst = std::env::var("QOS_IT_BURST").map_or(true, |v| v != "0");
    // Bad input first, each refused with what to change.
    let h1 = |extra: serde_json::Value| {
        let mut p = json!({"domain": "d", "host_nqn": host_nqn(1)});
        for (k, v) in extra.as_object().into_iter().flatten() {
            p[k] = v.clone();
        }
        p
    };
    if with_burst {
        refuse_bad_bursts(&mut t, &h1, limit, burst);
    }
    t.call(
        "qos_host_set",
        if with_burst {
            h1(json!({"max_iops": limit, "burst_iops": burst, "burst_seconds": BUCKET_SECS}))
        } else {
            h1(json!({"max_iops": limit}))
        },
    );
    for i in 2..=3 {
        t.call(
            "qos_host_set",
            json!({"domain": "d", "host_nqn": host_nqn(i), "min_iops": reserved,
                   "max_iops": reserved_max}),
        );
    }
    let bdevs: Vec<String> = (1..=QDS.len())
        .map(|i| t.qos_bdev_for_host(i, "Malloc0", "d"))
        .collect();
    expose_per_host(&mut t, &bdevs, s.port);

    let per_period = |rate: u64| rate * PERIOD_MS / 1000;
    let (limit_pp, burst_pp, reserved_pp) =
        (per_period(limit), per_period(burst), per_period(reserved));
    let bucket_ops = (burst - limit) * BUCKET_SECS;
    let expected_periods = (BUCKET_SECS * 1000 / PERIOD_MS) as usize;
    let mut p = History::new("d");
    let mut figures = Vec::new();
    for round in 1..=2 {
        let epochs = run(&s, &mut t, &mut p);
        let h1_ops = p.ops(&host_nqn(1), &epochs);
        let others: Vec<Vec<u64>> = (2..=3).map(|i| p.ops(&host_nqn(i), &epochs)).collect();
        println!("  run {round}: host 1 per period {h1_ops:?}");
        println!("           hosts 2, 3 per period {others:?}");
        // Tokens: never above the burst rate, and never more above the limit than the
        // bucket holds (one period of the excess for the period it ends in).
        for (k, &o) in h1_ops.iter().enumerate() {
            assert!(
                o * 100 <= burst_pp * 101,
                "run {round} period {k}: {o} above the burst rate {burst_pp}"
            );
        }
        // Net of the periods under the limit: a host starved under its limit while its
        // limit is raised (the lag rule closing the pool for a reserved host) earns
        // credit back and may burst again once it is let through.
        let net: i64 = h1_ops.iter().map(|&o| o as i64 - limit_pp as i64).sum();
        let slack = per_period(burst - limit);
        assert!(
            net <= (bucket_ops + slack) as i64,
            "run {round}: {net} operations above the limit net, bucket {bucket_ops}"
        );
        // Acceptance. The burst phase: the periods before the first one at the limit
        // (+-1 %); in it, the periods at the burst rate (+-2 %: the first period may be
        // the jobs' ramp and the last the change-over, so the bucket's 8 periods are
        // judged +-1); after it, every period at the limit.
        let near = |o: u64, rate: u64, pct: u64| o.abs_diff(rate) * 100 <= rate * pct;
        let phase = h1_ops
            .iter()
            .position(|&o| near(o, limit_pp, 1))
            .unwrap_or(h1_ops.len());
        let at_burst = h1_ops[..phase]
            .iter()
            .filter(|&&o| near(o, burst_pp, 2))
            .count();
        // Inside the phase (without its first and last period) every period at the rate.
        let interior = phase.saturating_sub(2);
        let interior_at_burst = h1_ops[..phase]
            .iter()
            .skip(1)
            .take(interior)
            .filter(|&&o| near(o, burst_pp, 2))
            .count();
        let after: Vec<u64> = h1_ops[phase..].to_vec();
        let at_limit = after.iter().filter(|&&o| near(o, limit_pp, 1)).count();
        let burst_epochs = &epochs[..phase.max(1)];
        let met: usize = (2..=3)
            .map(|i| {
                p.ops(&host_nqn(i), burst_epochs)
                    .iter()
                    .filter(|&&o| o * 100 >= reserved_pp * 99)
                    .count()
            })
            .sum();
        let periods = 2 * burst_epochs.len();
        println!(
            "  run {round}: {at_burst} of {phase} periods of the burst at the burst rate \
             {burst_pp} +-2 % (bucket: {expected_periods}), then {at_limit}/{} at the limit \
             {limit_pp} +-1 %; reservations met in {met}/{periods} burst periods",
            after.len()
        );
        check(
            phase.abs_diff(expected_periods) <= 1 && interior_at_burst == interior,
            true,
            format_args!(
                "run {round}: a burst of {phase} periods, {interior_at_burst} of its \
                 {interior} inner ones at the burst rate"
            ),
        );
        check(
            !after.is_empty() && at_limit == after.len(),
            true,
            format_args!("run {round}: after the burst {after:?}, limit {limit_pp}"),
        );
        check(
            met * 100 >= periods * 99,
            true,
            format_args!("run {round}: reservations met in {met}/{periods}"),
        );
        figures.push((at_burst, at_limit, after.len(), met, periods));
        if round == 1 {
            // The bucket refills at the limit's rate while the host is idle: 8 s.
            std::thread::sleep(Duration::from_secs(10));
            let h = t.compact_stats("d");
            let b = h.host(&host_nqn(1)).and_then(|h| h.burst).expect("a burst");
            println!(
                "  idle 10 s: credit {:.2} s of {BUCKET_SECS}",
                b.credit_seconds
            );
            check(
                b.credit_seconds >= BUCKET_SECS as f64 * 0.99,
                b.credit_seconds > 0.0,
                format_args!("credit after 10 s idle: {b:?}"),
            );
        }
    }
    // save_config keeps the burst, and a replayed target starts with a full bucket.
    let file = t.save_config_file("burst");
    t.stop(30);
    let mut r = s.target_from(&file, 60);
    let stats = r.compact_stats("d");
    let b = stats
        .host(&host_nqn(1))
        .and_then(|h| h.burst)
        .expect("the burst survives save_config");
    assert_eq!((b.iops, b.seconds), (Some(burst), Some(BUCKET_SECS)));
    assert!(
        (b.credit_seconds - BUCKET_SECS as f64).abs() < 1e-6 && !b.bursting,
        "replayed bucket {b:?}"
    );
    r.stop(30);
    let _ = std::fs::remove_file(file);
    println!("  figures (burst periods, at limit, after, reservations met, of): {figures:?}");
}
