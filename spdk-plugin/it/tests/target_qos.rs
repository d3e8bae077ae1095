//! The target plugin in a real `nvmf_tgt` (SPDK at `SPDK_DIR`), over NVMe/TCP on
//! 127.0.0.1, with one `spdk_nvme_perf` per host (each with its own host NQN).
//! Prints `SKIPPED: ...` and passes when SPDK is not found.
//!
//! The QoS test runs the same load twice on the same machine (4 hosts, 4 KiB random
//! reads, queue depth 32 each except the aggressive host 2 at 128, in one bdevperf on
//! core 1 with a job per host, the target on core 0; four `spdk_nvme_perf` processes on
//! that core starved each other whenever anything else ran there, and a host whose
//! process was not scheduled missed its reservation):
//! 1. baseline, without the plugin (one malloc partition per host): the split follows
//!    the queue depths and the CPU scheduler, not the reservations, and nothing stops
//!    host 2. Its aggregate A is what the machine can do with this load;
//! 2. with the plugin: one QoS bdev per host over the shared malloc bdev, a domain with
//!    capacity C = min(A/4, 8000 IOPS) (clearly below what the machine can do), Zipf reservations
//!    adding up to 0.9 C, a limit on every host (1.2x to 2x its reservation),
//!    500 ms periods. From
//!    `qos_stats_get`'s per-period history: every host completes >= 99% of its
//!    reservation in >= 95% of the periods, and no limited host exceeds its limit by
//!    more than 1% (average over the window).
//!
//! The other tests check reconfiguration without disconnect, deletion and shutdown with
//! held I/O, the RPCs' refusals of bad input, and that over the hosts' circulation a
//! host that stops sending gets its held commands back within the bound on their wait.

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use target_it::*;

const HOSTS: usize = 4;
const QD: u32 = 32;
const PERIOD_MS: u64 = 500;

/// One bdevperf on core 1: 4 KiB random reads from each host (its own controller and
/// host NQN) at queue depth `qds[i - 1]` for `secs`.
fn load(s: &Setup, secs: u32, qds: &[u32]) -> Bdevperf {
    let hosts: Vec<usize> = (1..=HOSTS).collect();
    s.randread_per_host(&hosts, qds, secs)
}

/// Each host's result in `out`, host 1 first.
fn per_host(s: &Setup, out: &Outcome) -> Vec<JobResult> {
    (1..=HOSTS)
        .map(|i| out.job(&s.controller(i).bdev()).clone())
        .collect()
}

fn malloc(t: &mut Target) {
    t.malloc("Malloc0", 131072, 512);
}

/// Plain namespaces: the malloc bdev split in one partition per host.
fn plain_setup(t: &mut Target, port: u16) {
    malloc(t);
    t.call(
        "bdev_split_create",
        json!({"base_bdev": "Malloc0", "split_count": HOSTS}),
    );
    let bdevs: Vec<String> = (0..HOSTS).map(|i| format!("Malloc0p{i}")).collect();
    expose_per_host(t, &bdevs, port);
}

fn print_perf(title: &str, res: &[u64], r: &[JobResult]) {
    println!("{title}");
    println!("  host  reservation_iops  iops      avg_us");
    for (i, p) in r.iter().enumerate() {
        println!(
            "  h{}    {:>8}          {:>8.0}  {:>8.0}",
            i + 1,
            res[i],
            p.iops,
            p.avg_us
        );
    }
}

#[test]
fn qos_meets_reservations_and_limits() {
    let Some(s) = setup_or_skip("target_qos::qos_meets_reservations_and_limits") else {
        return;
    };
    // Host 2 is the aggressive neighbour.
    let qds = [QD, 4 * QD, QD, QD];

    // 1. Baseline: no plugin. Its aggregate A is what the machine can do with this load.
    let base: Vec<JobResult> = {
        let mut t = s.bare_target(240);
        plain_setup(&mut t, s.port);
        per_host(&s, &load(&s, 8, &qds).run())
    };
    for (i, p) in base.iter().enumerate() {
        assert_eq!(p.io_failed, 0, "baseline: host {} failed I/O", i + 1);
    }
    let agg: f64 = base.iter().map(|p| p.iops).sum();
    // At most 8000 IOPS (chosen when the hosts were four perf processes sharing a
    // core: what they sustained steadily on a busy machine); at most A/4 when it is
    // slower still. The tests near saturation are in reliability.rs and weighted_qos.rs.
    let capacity = ((agg * 0.25 / 100.0).floor() as u64 * 100).clamp(1000, 8000);
    let res = zipf(HOSTS, capacity * 9 / 10);
    // Every host has a limit (tightest on the aggressive host 2). Without limits the
    // work-conserving pool lets the unlimited hosts take the whole machine, and on two
    // shared cores the busy-polling initiators then starve each other for CPU in bursts
    // that no target can compensate (see docs/target-plugin.md).
    let limits: Vec<Option<u64>> = vec![
        Some(res[0] * 2),
        Some(res[1] * 6 / 5),
        Some(res[2] * 3 / 2),
        Some(res[3] * 2),
    ];
    println!(
        "machine with this load, no QoS: {agg:.0} IOPS; QoS capacity {capacity} IOPS (min(A/4, 8000)); \
         reservations {res:?} (sum {}, Zipf, 90% of capacity); limits {limits:?}",
        res.iter().sum::<u64>()
    );
    print_perf("baseline without QoS (same load):", &res, &base);
    let ratios: Vec<f64> = base
        .iter()
        .zip(&res)
        .map(|(p, r)| p.iops / *r as f64)
        .collect();
    let spread = ratios.iter().cloned().fold(0.0, f64::max)
        / ratios.iter().cloned().fold(f64::MAX, f64::min).max(1e-9);
    let over: Vec<String> = (0..HOSTS)
        .filter_map(|i| {
            limits[i].map(|l| {
                format!(
                    "h{} at {:+.0}% of its limit",
                    i + 1,
                    (base[i].iops / l as f64 - 1.0) * 100.0
                )
            })
        })
        .collect();
    println!(
        "  served/reserved per host: {:?} (spread {spread:.1}x); {}",
        ratios.iter().map(|r| format!("{r:.2}")).collect::<Vec<_>>(),
        over.join(", ")
    );

    // 2. QoS.
    let secs = 24u32;
    let mut t = s.target(240);
    malloc(&mut t);
    t.call(
        "qos_domain_create",
        json!({"name": "d", "capacity_iops": capacity, "period_ms": PERIOD_MS,
               "check_interval_us": 1000, "estimator": false}),
    );
    let mut bdevs = Vec::new();
    for i in 1..=HOSTS {
        let mut p = json!({"domain": "d", "host_nqn": host_nqn(i), "min_iops": res[i - 1]});
        if let Some(l) = limits[i - 1] {
            p["max_iops"] = json!(l);
        }
        t.call("qos_host_set", p);
        bdevs.push(t.qos_bdev_for_host(i, "Malloc0", "d"));
    }
    expose_per_host(&mut t, &bdevs, s.port);
    let mut hist = History::new("d");
    let mut b = load(&s, secs, &qds);
    let t0 = Instant::now();
    let out = b.run_polling(
        Duration::from_millis(1500),
        Duration::from_secs(secs as u64 + 1),
        |_, _| hist.poll(&mut t),
    );
    hist.poll(&mut t);
    let qos = per_host(&s, &out);
    print_perf("with QoS:", &res, &qos);
    for (i, p) in qos.iter().enumerate() {
        assert_eq!(p.io_failed, 0, "with QoS: host {} failed I/O", i + 1);
    }
    let epochs = hist.epochs(
        t0 + Duration::from_secs(3),
        t0 + Duration::from_secs(secs as u64),
    );
    let per_period = |v: u64| v as f64 * PERIOD_MS as f64 / 1000.0;
    let mut failures = Vec::new();
    println!(
        "  host  periods  reservation/period  met>=99%  avg_ops/period  limit/period  limit_excess"
    );
    for i in 0..HOSTS {
        let ops = &hist.ops(&host_nqn(i + 1), &epochs);
        let need = per_period(res[i]) * 0.99;
        let met = ops.iter().filter(|o| **o as f64 >= need).count();
        let frac = met as f64 / ops.len().max(1) as f64;
        let avg = ops.iter().sum::<u64>() as f64 / ops.len().max(1) as f64;
        let (lim, excess) = match limits[i] {
            Some(l) => (per_period(l), avg / per_period(l) - 1.0),
            None => (f64::NAN, f64::NAN),
        };
        println!(
            "  h{}    {:>5}    {:>10.1}          {:>6.1}%   {:>10.1}      {:>10.1}    {:>+7.2}%",
            i + 1,
            ops.len(),
            per_period(res[i]),
            frac * 100.0,
            avg,
            lim,
            excess * 100.0
        );
        if ops.len() < 20 {
            failures.push(format!("h{}: only {} periods observed", i + 1, ops.len()));
        }
        if frac < 0.95 {
            failures.push(format!(
                "h{}: reservation met (>=99%) in {:.1}% of periods (< 95%); ops per period {ops:?}",
                i + 1,
                frac * 100.0
            ));
        }
        if excess > 0.01 {
            failures.push(format!(
                "h{}: exceeded its limit by {:.2}% (> 1%)",
                i + 1,
                excess * 100.0
            ));
        }
    }
    // A period whose monitor went long without running had the target's thread off
    // its core: what no QoS can serve in.
    let gaps: Vec<String> = epochs
        .iter()
        .map(|&e| {
            hist.longest_tick_gap(e)
                .map_or("-".into(), |g| format!("{:.1}", g.as_secs_f64() * 1000.0))
        })
        .collect();
    println!(
        "  the monitor's longest gap between runs, per period (ms): {}",
        gaps.join(" ")
    );
    let stats = t.call("qos_stats_get", json!({"domain": "d"}));
    drop(t);
    assert!(
        failures.is_empty(),
        "QoS targets missed:\n{}\nlast stats: {stats}",
        failures.join("\n")
    );
    assert!(
        spread > 1.5,
        "the baseline should show a split unrelated to reservations (spread {spread:.2})"
    );
}

/// Host 1 alone, limited to `max_iops`, in a domain far above that (200 ms periods).
fn one_host_with_plugin(s: &Setup, max_iops: u64) -> Target {
    s.one_host_target(
        240,
        (131072, 512),
        json!({"capacity_iops": 100000, "period_ms": 200, "estimator": false}),
        json!({"min_iops": (max_iops / 2).min(50), "max_iops": max_iops}),
    )
}

/// Host 1's statistics with its last 8 periods.
fn host_stats(t: &mut Target) -> HostStats {
    t.stats("d", 8)
        .host(&host_nqn(1))
        .cloned()
        .unwrap_or_else(|| panic!("no host 1 in domain d"))
}

#[test]
fn reconfigure_delete_and_shutdown_with_held_io() {
    let Some(s) = setup_or_skip("target_qos::reconfigure_delete_and_shutdown_with_held_io") else {
        return;
    };
    let mut t = one_host_with_plugin(&s, 500);
    let job = s.perf_job(1, "randread", 4096, QD, 9);
    let run = s.perf(&job);
    std::thread::sleep(Duration::from_secs(3));
    let before = host_stats(&mut t);
    assert!(
        before.held > 0,
        "a host at its limit should have held I/O: {before:?}"
    );
    // Raise the limit without disconnecting the host.
    t.call(
        "qos_host_set",
        json!({"domain": "d", "host_nqn": host_nqn(1), "min_iops": 50, "max_iops": 2000}),
    );
    std::thread::sleep(Duration::from_secs(2));
    let after = host_stats(&mut t);
    // The three periods before the one in progress.
    let last = |h: &HostStats| h.last_periods.iter().skip(1).take(3).sum::<u64>() / 3;
    let (b, a) = (last(&before), last(&after));
    println!("ops per 200 ms period: {b} at max_iops 500, {a} at max_iops 2000");
    assert!(b <= 101, "limit 500 IOPS allows 100 per period, saw {b}");
    assert!(
        a > 2 * b,
        "raising the limit should raise the rate ({b} -> {a})"
    );
    // Back to a low limit so that I/O is held, then delete the QoS bdev under load.
    t.call(
        "qos_host_set",
        json!({"domain": "d", "host_nqn": host_nqn(1), "min_iops": 10, "max_iops": 20}),
    );
    std::thread::sleep(Duration::from_millis(700));
    let held = host_stats(&mut t).held;
    assert!(held > 0, "expected held I/O before the delete");
    let d0 = Instant::now();
    t.call("qos_bdev_delete", json!({"name": "qos1"}));
    let took = d0.elapsed();
    println!("qos_bdev_delete with {held} held I/O took {took:?}");
    assert!(took < Duration::from_secs(3));
    assert_eq!(t.call("qos_bdev_get", Value::Null), json!([]));
    assert_eq!(host_stats(&mut t).held, 0);
    let r = run.wait();
    assert!(
        r.output.contains("error") || !r.ok,
        "the host should have seen its held I/O aborted"
    );
    // Shutdown with held I/O: must not wait for tokens.
    drop(t);
    let mut t = one_host_with_plugin(&s, 20);
    let run = s.perf(&job);
    std::thread::sleep(Duration::from_secs(3));
    let held = host_stats(&mut t).held;
    assert!(held > 0, "expected held I/O before shutdown");
    let took = t.stop(20);
    println!("nvmf_tgt shutdown with {held} held I/O took {took:?}");
    assert!(
        took.is_some_and(|d| d < Duration::from_secs(10)),
        "shutdown with held I/O hung"
    );
    drop(run);
}

#[test]
fn rpcs_refuse_bad_input() {
    let Some(s) = setup_or_skip("target_qos::rpcs_refuse_bad_input") else {
        return;
    };
    let mut t = s.target(240);
    malloc(&mut t);
    let h1 = host_nqn(1);
    // The plugin says which it is.
    let v = t.call("qos_version_get", Value::Null);
    assert_eq!(v["plugin"], "target", "{v}");
    assert_eq!(v["version"], env!("CARGO_PKG_VERSION"), "{v}");
    assert_eq!(v["wire_protocol"], 1, "{v}");
    t.refuse("qos_version_get", json!({"x": 1}), -22, "x");
    for p in [
        // No capacity is fine (learned), but not without the estimator to learn it.
        json!({"name": "d", "estimator": false}),
        json!({"name": "d", "capacity_iops": 1000, "typo": 1}),
        json!({"name": "d", "capacity_iops": 0}),
    ] {
        t.refuse("qos_domain_create", p, -22, "");
    }
    t.refuse(
        "qos_domain_create",
        json!({"name": "d", "operating_in_flight_milli": 4000, "operating_latency_us": 50}),
        -22,
        "not by two of them",
    );
    t.call(
        "qos_domain_create",
        json!({"name": "learned", "operating_latency_us": 50}),
    );
    let st = t.call("qos_stats_get", json!({"domain": "learned"}));
    assert_eq!(st[0]["capacity_learning"], true, "{st}");
    assert_eq!(
        st[0]["operating_point"]["by"],
        json!({"latency": 50_000}),
        "{st}"
    );
    t.call("qos_domain_delete", json!({"name": "learned"}));
    t.call(
        "qos_domain_create",
        json!({"name": "d", "capacity_iops": 1000}),
    );
    t.refuse(
        "qos_domain_create",
        json!({"name": "d", "capacity_iops": 1000}),
        -17,
        "",
    );
    // Reservation above limit; admission refused with the numbers; unknown domain.
    let e = t.refuse(
        "qos_host_set",
        json!({"domain": "d", "host_nqn": h1, "min_iops": 500, "max_iops": 100}),
        -22,
        "500",
    );
    assert!(e.message.contains("100"), "{}", e.message);
    let e = t.refuse(
        "qos_host_set",
        json!({"domain": "d", "host_nqn": h1, "min_iops": 1500}),
        -28,
        "1500",
    );
    assert!(e.message.contains("1000"), "{}", e.message);
    t.refuse(
        "qos_host_set",
        json!({"domain": "nope", "host_nqn": h1}),
        -2,
        "",
    );
    t.refuse(
        "qos_host_remove",
        json!({"domain": "d", "host_nqn": "nqn.unknown"}),
        -2,
        "",
    );
    // qos_host_update changes what it is given and keeps the rest; a host never set is
    // refused with the method that sets it; the result is checked like qos_host_set's.
    t.refuse(
        "qos_host_update",
        json!({"domain": "d", "host_nqn": h1, "max_iops": 900}),
        -2,
        "qos_host_set",
    );
    t.call(
        "qos_host_set",
        json!({"domain": "d", "host_nqn": h1, "min_iops": 200, "weight": 3}),
    );
    // Host 1's settings after an update with `changes`.
    let updated = |t: &mut Target, changes: Value| {
        let mut p = json!({"domain": "d", "host_nqn": host_nqn(1)});
        p.as_object_mut()
            .expect("an object")
            .extend(changes.as_object().expect("an object").clone());
        t.call("qos_host_update", p);
        t.call(
            "qos_host_get",
            json!({"domain": "d", "host_nqn": host_nqn(1)}),
        )
    };
    let h = updated(&mut t, json!({"max_iops": 900}));
    assert_eq!(
        (&h[0]["min_iops"], &h[0]["max_iops"], &h[0]["weight"]),
        (&json!(200), &json!(900), &json!(3)),
        "{h}"
    );
    t.refuse(
        "qos_host_update",
        json!({"domain": "d", "host_nqn": h1, "max_iops": 100}),
        -22,
        "200",
    );
    let h = updated(&mut t, json!({"min_iops": 0, "max_iops": 0}));
    assert!(
        h[0].get("min_iops").is_none() && h[0].get("max_iops").is_none(),
        "{h}"
    );
    t.call("qos_host_remove", json!({"domain": "d", "host_nqn": h1}));
    // Unknown base bdev, duplicate bdev name, domain in use, bad NQN.
    let b = |n: &str, base: &str, host: &str| json!({"name": n, "base_bdev_name": base, "domain": "d", "host_nqn": host});
    t.refuse("qos_bdev_create", b("q1", "NoSuchBdev", &h1), -2, "");
    t.refuse("qos_bdev_create", b("q1", "Malloc0", "bad nqn"), -22, "");
    t.call("qos_bdev_create", b("q1", "Malloc0", &h1));
    t.refuse("qos_bdev_create", b("q1", "Malloc0", &h1), -17, "");
    t.refuse("qos_bdev_create", b("Malloc0", "Malloc0", &h1), -17, "");
    // A second host shares the base descriptor.
    t.call("qos_bdev_create", b("q2", "Malloc0", &host_nqn(2)));
    t.refuse("qos_domain_delete", json!({"name": "d"}), -16, "");
    t.refuse("qos_bdev_delete", json!({"name": "nope"}), -2, "");
    t.refuse("qos_bdev_get", json!({"name": "nope"}), -2, "");
    t.refuse("qos_stats_get", json!({"domain": "nope"}), -2, "");
    // save_config lines: domain, hosts, then bdevs after their base.
    let cfg = t.call("framework_get_config", json!({"name": "bdev"}));
    let methods = config_methods(&cfg);
    let pos = |m: &str| methods.iter().position(|x| *x == m);
    assert!(
        pos("qos_domain_create") < pos("bdev_malloc_create"),
        "{methods:?}"
    );
    assert!(
        pos("bdev_malloc_create") < pos("qos_bdev_create"),
        "{methods:?}"
    );
    // save_config replays to the same state.
    t.call(
        "qos_host_set",
        json!({"domain": "d", "host_nqn": h1, "min_iops": 300, "max_iops": 600,
               "weight": 5, "priority": "high"}),
    );
    let state = |t: &mut Target| {
        (
            t.call("qos_domain_get", Value::Null),
            t.call("qos_host_get", json!({"domain": "d"})),
            t.call("qos_bdev_get", Value::Null),
        )
    };
    let before = state(&mut t);
    let file = t.save_config_file("target_qos");
    let bdev_cfg = t.call("framework_get_config", json!({"name": "bdev"}));
    println!("saved bdev section: {:?}", config_methods(&bdev_cfg));
    drop(t);
    let mut t2 = s.target_from(&file, 60);
    let after = state(&mut t2);
    let _ = std::fs::remove_file(&file);
    assert_eq!(
        before, after,
        "save_config did not replay to the same state"
    );
    println!(
        "save_config replayed: {} QoS bdevs, hosts {}",
        after.2.as_array().map_or(0, Vec::len),
        after.1
    );
    t2.call("qos_bdev_delete", json!({"name": "q1"}));
    t2.call("qos_bdev_delete", json!({"name": "q2"}));
    t2.call("qos_domain_delete", json!({"name": "d"}));
    assert_eq!(t2.call("qos_domain_get", Value::Null), json!([]));
}

#[test]
fn token_protocol_over_nvme_tcp() {
    use qos_core::wire::{self, Credit, Request, StateReply};
    use target_it::nvme_tcp::{Qpair, Sqe, connect_io};
    let Some(s) = setup_or_skip("target_qos::token_protocol_over_nvme_tcp") else {
        return;
    };
    let mut t = s.target(240);
    malloc(&mut t);
    t.call(
        "qos_domain_create",
        json!({"name": "d", "capacity_iops": 100000, "period_ms": 1000, "estimator": false}),
    );
    let mut bdevs = Vec::new();
    for (i, min) in [(1, 1000), (2, 3000)] {
        t.call(
            "qos_host_set",
            json!({"domain": "d", "host_nqn": host_nqn(i), "min_iops": min, "max_iops": 50000}),
        );
        bdevs.push(t.qos_bdev_for_host(i, "Malloc0", "d"));
    }
    expose_per_host(&mut t, &bdevs, s.port);

    // Host 2 cannot reach host 1's QoS bdev (its subsystem allows host 1 only).
    let (_q, c) = Qpair::connect(s.port, &subsys_nqn(1), &host_nqn(2), 0, 0xFFFF)
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(!c.ok(), "host 2 must not connect to host 1's subsystem");
    println!(
        "host 2 -> host 1's subsystem: refused (sct {} sc {:#x})",
        c.sct, c.sc
    );

    let (_admin, mut io) =
        connect_io(s.port, &subsys_nqn(1), &host_nqn(1)).unwrap_or_else(|e| panic!("{e}"));
    let mut buf = Vec::new();
    let read = Sqe::new(0x02, 1).cdw(10, 0).cdw(11, 0).cdw(12, 7); // 8 x 512 B
    // Before the host speaks the protocol, reads complete plainly (C2H success).
    let c = io
        .command(read, 4096, &mut buf)
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(c.ok() && buf.len() == 4096, "{c:?}");
    assert_eq!(c.cdw0, 0, "no credit before the host speaks the protocol");

    let vendor = Sqe::vendor;
    let c = io
        .command(vendor(Request::GetState), 4096, &mut buf)
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(c.ok(), "GET_STATE failed: {c:?}");
    let r = StateReply::decode(&buf).unwrap_or_else(|e| panic!("{e}"));
    println!("GET_STATE: {r:?}; cdw0 {:#010x}", c.cdw0);
    assert!(r.flags & wire::flags::CONFIGURED != 0);
    assert!(r.flags & wire::flags::SPARSE_CREDIT != 0);
    assert_eq!(r.reservation_per_period_ops, 1000);
    assert_eq!(r.period_ns, 1_000_000_000);
    assert!(
        c.cdw0 == 0 && c.implied,
        "the state is in the reply: its completion is the data PDU's SUCCESS flag: {c:?}"
    );

    let c = io
        .command(
            vendor(Request::Acquire { ops: 50, bytes: 0 }),
            wire::REPLY_LEN as _,
            &mut buf,
        )
        .unwrap_or_else(|e| panic!("{e}"));
    let a = StateReply::decode(&buf).unwrap_or_else(|e| panic!("{e}"));
    println!(
        "ACQUIRE 50: granted {} credit {}",
        a.granted_ops, a.credit_ops
    );
    assert!(c.ok() && a.granted_ops == 50 && a.credit_ops >= 50, "{a:?}");

    // Now the first read carries the credit in dword 0 (so SPDK sends a response
    // capsule); the next one, with nothing changed, completes plainly (C2H success).
    let c = io
        .command(read, 4096, &mut buf)
        .unwrap_or_else(|e| panic!("{e}"));
    let credit = Credit::decode(c.cdw0).unwrap_or_else(|| panic!("no credit in {c:?}"));
    println!(
        "READ after the protocol: cdw0 {:#010x} = {credit:?}",
        c.cdw0
    );
    assert!(c.ok() && !c.implied && credit.available_ops > 0);
    // (Within three reads: one may fall into the next period, whose credit is news.)
    let plain = (0..3).find_map(|_| {
        let c = io
            .command(read, 4096, &mut buf)
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(c.ok(), "{c:?}");
        (c.implied && c.cdw0 == 0).then_some(c)
    });
    assert!(plain.is_some(), "a credit that is no news is not sent");

    // Bad fields get NVMe errors.
    let bad_version = vendor(Request::GetState).cdw(11, 2);
    let c = io
        .command(bad_version, wire::REPLY_LEN as _, &mut buf)
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        (c.sct, c.sc),
        (0, wire::status::INVALID_FIELD),
        "bad version: {c:?}"
    );
    let bad_magic = vendor(Request::GetState).cdw(10, 0x1234);
    let c = io
        .command(bad_magic, wire::REPLY_LEN as _, &mut buf)
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        (c.sct, c.sc),
        (0, wire::status::INVALID_FIELD),
        "bad magic: {c:?}"
    );
    let c = io
        .command(vendor(Request::GetState), 64, &mut buf)
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        (c.sct, c.sc),
        (0, wire::status::DATA_SGL_LENGTH_INVALID),
        "short buffer: {c:?}"
    );
    let c = io
        .command(Sqe::new(0xC4, 1), 0, &mut buf)
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        (c.sct, c.sc),
        (0, wire::status::INVALID_OPCODE),
        "unknown opcode: {c:?}"
    );

    // Host 2's commands see host 2's ledger.
    let (_admin2, mut io2) =
        connect_io(s.port, &subsys_nqn(2), &host_nqn(2)).unwrap_or_else(|e| panic!("{e}"));
    let c = io2
        .command(vendor(Request::GetState), wire::REPLY_LEN as _, &mut buf)
        .unwrap_or_else(|e| panic!("{e}"));
    let r2 = StateReply::decode(&buf).unwrap_or_else(|e| panic!("{e}"));
    assert!(
        c.ok() && r2.reservation_per_period_ops == 3000 && r2.credit_ops == 0,
        "{r2:?}"
    );
}

#[test]
fn host_abort_of_held_io() {
    use target_it::nvme_tcp::{Sqe, connect_io};
    let Some(s) = setup_or_skip("target_qos::host_abort_of_held_io") else {
        return;
    };
    let mut t = one_host_with_plugin(&s, 20);
    let (mut admin, mut io) =
        connect_io(s.port, &subsys_nqn(1), &host_nqn(1)).unwrap_or_else(|e| panic!("{e}"));
    // 40 reads against a limit of 20 IOPS (4 per 200 ms period): most are held.
    let read = Sqe::new(0x02, 1).cdw(12, 7);
    let cids: Vec<u16> = (0..40)
        .map(|_| io.send(read, 4096).unwrap_or_else(|e| panic!("{e}")))
        .collect();
    std::thread::sleep(Duration::from_millis(100));
    // (SPDK's examine reads of the new bdev used the first period's small allowance.)
    let held = host_stats(&mut t).held;
    assert!(held > 10, "expected held reads, stats say {held}");
    // Abort the last one: SQID 1, its CID.
    let victim = *cids.last().unwrap_or(&0);
    let abort = Sqe::new(0x08, 0).cdw(10, 1 | (victim as u32) << 16);
    let mut buf = Vec::new();
    let c = admin
        .command(abort, 0, &mut buf)
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(c.ok(), "abort command failed: {c:?}");
    assert_eq!(
        c.cdw0 & 1,
        0,
        "the held read should have been aborted: {c:?}"
    );
    // The victim completes at once with "aborted by request"; nothing else is lost.
    let mut done = 0;
    let mut ok = 0;
    let (cid, cpl) = loop {
        let (cid, cpl) = io.recv().unwrap_or_else(|e| panic!("{e}"));
        done += 1;
        if cid == victim {
            break (cid, cpl);
        }
        ok += cpl.ok() as usize;
    };
    println!(
        "abort of held read cid {cid}: abort cdw0 {}, read status sct {} sc {:#x}",
        c.cdw0, cpl.sct, cpl.sc
    );
    assert_eq!((cpl.sct, cpl.sc), (0, 0x07), "aborted read status");
    // Delete the QoS bdev: the remaining held reads complete (aborted), none is lost.
    t.call("qos_bdev_delete", json!({"name": "qos1"}));
    let mut aborted = 0;
    while done < cids.len() {
        match io.recv() {
            Ok((_, c)) => {
                done += 1;
                if c.ok() {
                    ok += 1;
                } else {
                    assert_eq!((c.sct, c.sc), (0, 0x07), "held reads end aborted: {c:?}");
                    aborted += 1;
                }
            }
            Err(e) => panic!("after {done} completions: {e}"),
        }
    }
    println!(
        "all {done} reads completed: {ok} served, 1 aborted by the host, {aborted} aborted by qos_bdev_delete"
    );
}

/// The target learns its depth curve from what it serves (issue 26): one host reads at
/// queue depths 2, 8, 32 and 128 in turn, without limits; after each step the curve
/// must have a point whose rate is what `spdk_nvme_perf` measured at that step (the
/// rate is counted exactly; the commands in flight are those at the base bdev, which on
/// a malloc base are far fewer than the host's queue depth), the curve must never fall
/// with depth, and the operating point must give at least η of its most.
#[test]
fn the_target_learns_its_depth_curve() {
    let Some(s) = setup_or_skip("target_qos::the_target_learns_its_depth_curve") else {
        return;
    };
    let mut t = s.one_host_target(
        240,
        (131072, 512),
        json!({"capacity_iops": 1_000_000, "period_ms": 500, "estimator": false}),
        json!({}),
    );
    println!("qd  perf_iops  curve (in flight at the base -> ops/s)");
    let mut best = 0f64;
    let mut judged = 0;
    for qd in [2u32, 8, 32, 128] {
        let first_epoch = t.stats("d", 1).epoch;
        let r = s.perf(&s.perf_job(1, "randread", 4096, qd, 4)).wait();
        assert!(r.ok, "perf at QD {qd} failed:\n{}", r.output);
        best = best.max(r.iops);
        let st = t.stats("d", 16);
        // The step's whole periods (500 ms): this machine's speed can move by 2x within a
        // second, and then the curve's buckets (what the target did last) and perf's
        // mean over the step say different things; such a step is printed, not judged.
        let rates: Vec<u64> = st
            .hosts
            .first()
            .map(|h| {
                h.periods
                    .iter()
                    .filter(|p| p.epoch > first_epoch && p.epoch < st.epoch)
                    .map(|p| p.ops * 2)
                    .collect()
            })
            .unwrap_or_default();
        let (lo, hi) = (
            rates.iter().copied().min().unwrap_or(0),
            rates.iter().copied().max().unwrap_or(0),
        );
        let steady = rates.len() >= 4 && hi as f64 <= 1.25 * lo as f64;
        let op = st.operating_point;
        let curve: Vec<(f64, u64)> = op
            .depth_curve
            .iter()
            .map(|p| (p.in_flight, p.ops_per_s))
            .collect();
        println!("{qd:>3}  {:>9.0}  {curve:?}", r.iops);
        assert!(
            op.depth_curve
                .windows(2)
                .all(|w| w[0].ops_per_s <= w[1].ops_per_s),
            "the curve falls: {curve:?}"
        );
        // Within a quarter of what perf measured: the step's own point (the curve's
        // running maximum may hold an earlier, faster step's rate).
        let near = op
            .depth_curve
            .iter()
            .any(|p| (p.ops_per_s as f64 - r.iops).abs() <= 0.25 * r.iops);
        let top = op.depth_curve.last().map_or(0, |p| p.ops_per_s) as f64;
        if !steady {
            println!(
                "     not judged: the target's rate moved {lo} .. {hi} per second over the step's periods"
            );
            continue;
        }
        judged += 1;
        assert!(
            near || top >= r.iops,
            "no point of the curve near perf's {:.0} IOPS at QD {qd}: {curve:?}",
            r.iops
        );
    }
    let op = t.stats("d", 1).operating_point;
    let (Some(q), Some(rate), Some(max)) = (op.in_flight, op.ops_per_s, op.max_ops_per_s) else {
        panic!("no operating point after four loads: {op:?}");
    };
    println!(
        "operating point at eta {}: {q:.3} commands in flight at the base, {rate} ops/s of {max} \
         (perf's best {best:.0} IOPS), latency {} ns",
        op.efficiency_milli,
        op.latency_ns.unwrap_or(0)
    );
    assert!(rate * 1000 >= max * op.efficiency_milli);
    // Admission at the operating point: the target was seen saturated (the curve at
    // least twice as deep as Q*), so a reservation above C* is refused although the
    // capacity given (1 M) has room.
    let deepest = op.depth_curve.last().map_or(0.0, |p| p.in_flight);
    println!("deepest point of the curve: {deepest:.3} commands in flight at the base");
    if deepest >= 2.0 * q {
        let over = rate + rate / 5;
        let e = t
            .rpc(
                "qos_host_set",
                json!({"domain": "d", "host_nqn": "nqn.2014-08.io.nvmf-qos:over", "min_iops": over}),
            )
            .expect_err("a reservation above C* on a flat curve is refused");
        println!("reservation of {over} IOPS above C* {rate}: {e}");
        assert_eq!(e.code, -28, "{e}");
        assert!(e.message.contains("operating point"), "{e}");
    }
    // The entitlement report over a period of load: QoS holds nothing here (no limit,
    // a budget far above the target), so the host is self-limited, entitled to what it
    // took, and needs what it had at the target for it.
    let run = s.perf(&s.perf_job(1, "randread", 4096, 32, 3));
    std::thread::sleep(Duration::from_millis(2200));
    let st = t.stats("d", 1);
    let e = st.hosts.first().and_then(|h| h.entitlement.clone());
    let c_star = st.operating_point.ops_per_s.unwrap_or(0);
    let r = run.wait();
    println!(
        "entitlement during a QD 32 load of {:.0} IOPS (C* {c_star}): {e:?}",
        r.iops
    );
    let e = e.expect("an entitlement once the curve has samples and a period has ended");
    assert!(!e.contending && e.held_fraction == 0.0, "{e:?}");
    // Entitled to what it took, or to C* if it took more (the operating point is where
    // the domain's entitlements add up to).
    assert_eq!(
        (e.entitled, e.shortfall),
        (e.achieved.min(c_star), 0),
        "{e:?}"
    );
    assert!(e.achieved > 0, "{e:?}");
    if judged < 4 {
        println!("{judged} of 4 steps steady: the curve's most against perf's best is not judged");
        return;
    }
    assert!(
        (max as f64) <= 1.25 * best && (max as f64) >= 0.75 * best,
        "the curve's most ({max}) is not what perf measured at best ({best:.0})"
    );
}

/// Over the hosts' circulation (issue 39: `operating_point` with
/// `operating_in_flight_milli`), a host keeps the commands beyond its part of N* held,
/// one in, one out at its arrivals. When it stops sending (the end of `spdk_nvme_perf`'s
/// run) no arrival lets them go: each waits at most a few times its one-in-one-out wait
/// (2-50 ms), not until the monitor stops seeing its circulation (a period or more,
/// 500 ms here). One host at QD 64 with N* = 16: 48 held all along.
#[test]
fn over_circulation_a_host_that_stops_is_not_kept_waiting() {
    let Some(s) =
        setup_or_skip("target_qos::over_circulation_a_host_that_stops_is_not_kept_waiting")
    else {
        return;
    };
    let mut t = s.one_host_target(
        120,
        (131072, 512),
        json!({"capacity_iops": 1_000_000, "period_ms": 500, "estimator": false,
               "sharing": "operating_point", "operating_in_flight_milli": 16000}),
        json!({}),
    );
    let started = Instant::now();
    let r = s.perf(&s.perf_job(1, "randread", 4096, 64, 3)).wait();
    let took = started.elapsed();
    assert!(r.ok, "perf failed:\n{}", r.output);
    let st = t.stats("d", 1);
    let h = st.host(&host_nqn(1)).expect("host 1");
    let over_100ms = st.held_longer_than(100_000_000);
    println!(
        "perf {:.0} IOPS in {took:?}; {} commands held ({} hold events), {} of them over 100 ms; \
         held now {}",
        r.iops, h.held_time.count, h.hold_events, over_100ms, h.held
    );
    assert!(
        h.held_time.count > 1000,
        "the mode held nothing: {} held commands",
        h.held_time.count
    );
    assert_eq!(
        over_100ms, 0,
        "commands waited over 100 ms for arrivals that did not come"
    );
    assert_eq!(h.held, 0, "commands still held after the host stopped");
}
