//! The initiator plugin in bdevperf (and fio's SPDK bdev ioengine) against `nvmf_tgt`
//! with the target plugin, over NVMe/TCP on 127.0.0.1: the target on core 0, the
//! initiator application on core 1. Prints `SKIPPED: ...` and passes when SPDK, bdevperf
//! or the plugins are not found.
//!
//! - `cooperative_initiators_meet_reservations`: four hosts (four bdev_nvme controllers
//!   with their own host NQN, each under an initiator QoS bdev, all in one bdevperf)
//!   with Zipf reservations and limits, as in the target plugin's test: every host meets
//!   its reservation in >= 95% of the periods and stays within its limit; the target's
//!   queue of held I/O is compared with the same load without the initiator plugin.
//! - `pacing_protects_a_small_reader_from_a_large_writer`: first a 1 MiB writer alone,
//!   plain and through its QoS bdev (sent whole: no small I/O), side by side; plain's
//!   best round is the real link (`link_mibps`), the writer's share beside one reader half of
//!   it (Justitia's 1/n). Then one host reads 4 KiB at queue depth 1, another writes
//!   1 MiB at queue depth 4, in alternating rounds without and with initiator QoS bdevs
//!   (chunks sized to the path, `chunk_auto`, and pacing): the reader's p99 must drop
//!   (the ratio is reported), and the writer must get what its pacer allowed (>= 85 %,
//!   median of the rounds): the tokens its chunks took while the pacer held it (a chunk
//!   refused and waiting) against U integrated over that time (`held_*` of the pacer's
//!   state, read 1 s into the round and 1 s before its end), in rounds where the pacer
//!   held it at least a tenth of the time; time in which the path held the writer is not
//!   judged. The writer's rate
//!   with against without in each round, and against its share, is printed. Last, the
//!   writer alone forced into chunks of the size the pacer picked (`split_always`, no
//!   rate limit) against plain, side by side: what chunks themselves cost.
//!   `QOS_IT_ROUNDS` sets the writer-alone rounds (default 5), `QOS_IT_CHUNK_BYTES` a
//!   fixed chunk for the QoS bdevs (`chunk_auto` off), `QOS_IT_LATENCY_TARGET_US` their
//!   `latency_target_us` (default 200), `QOS_IT_LATENCY_AUTO_MILLI` their
//!   `latency_target_auto_milli` (default 0: the fixed target). The target's TCP transport carries a
//!   chunk in one capsule (`in_capsule_data_size` 128 KiB, or `QOS_IT_CHUNK_BYTES`;
//!   `QOS_IT_IN_CAPSULE_BYTES` sets another). The reader alone gives the floor of its
//!   latency; the pacer group's target, base latency, chunk and the writer's chunk and
//!   hold counts are printed halfway through each round with the plugin.
//! - `robustness_*`, one test a case: chunked verify against a target without the plugin
//!   (fallback, one warning), bad RPC input and save_config replay, vendor-command
//!   time-outs, reset and controller reset with held and chunked I/O, delete under
//!   load, disconnect; all but the first against one host limited at the target.
//! - `fio_configs_run`: the jobs of `fio-configs/` run with fio's SPDK bdev ioengine and
//!   the plugin preloaded.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use initiator_it::*;
use serde_json::{Value, json};

/// `q` with the keys of `extra` set (options added to a QoS bdev's parameters).
fn merged(mut q: Value, extra: &Value) -> Value {
    for (k, v) in extra.as_object().into_iter().flatten() {
        q[k] = v.clone();
    }
    q
}

/// Runs the jobs to the end, reading QoS bdev `name`'s state `at` into the run.
fn run_sampling(b: &mut Bdevperf, name: &str, at: Duration) -> (Outcome, Value) {
    let run = b.start_tests();
    std::thread::sleep(at);
    let state = b.ini_bdev(name);
    (b.finish_tests(run), state)
}

// ---- reservations ----------------------------------------------------------------------

const HOSTS: usize = 4;
const PERIOD_MS: u64 = 500;

/// Runs `b` for `secs`, polling the target; returns the history, the start and the
/// outcome.
fn run_polling(t: &mut Target, b: &mut Bdevperf, secs: u32) -> (History, Instant, Outcome) {
    let mut hist = History::new("d");
    let t0 = Instant::now();
    let mut shown = false;
    let every = Duration::from_millis(1500);
    let out = b.run_polling(every, Duration::from_secs(secs as u64 + 1), |b, el| {
        hist.poll(t);
        if !shown && el > Duration::from_secs(secs as u64 / 2) {
            shown = true;
            show_initiators(b);
        }
    });
    hist.poll(t);
    (hist, t0, out)
}

/// The initiator side of a run (the RPC is slow on a busy core: once, mid-run).
fn show_initiators(b: &Bdevperf) {
    let Ok(v) = b.rpc("qos_ini_bdev_get", Value::Null, Duration::from_secs(20)) else {
        return;
    };
    for q in v.as_array().into_iter().flatten() {
        let s = &q["state"];
        println!(
            "  initiator {} (mid-run): mode {}, held now {}, held so far {}, vendor commands {} (late {}, errors {}), engine restarts {}",
            q["name"].as_str().unwrap_or("?"),
            s["mode"],
            s["held"],
            s["held_total"],
            s["vendor_sent"],
            s["vendor_late"],
            s["vendor_errors"],
            s["engine_restarts"]
        );
    }
}

#[test]
fn cooperative_initiators_meet_reservations() {
    let Some(s) = setup_or_skip("initiator_qos::cooperative_initiators_meet_reservations") else {
        return;
    };
    let mut t = s.target(300);
    t.malloc("Malloc0", 131072, 512);
    // Measure first: the same load through QoS bdevs of best-effort hosts in a domain
    // far above what the machine does (the target admits everything).
    t.call(
        "qos_domain_create",
        json!({"name": "d", "capacity_iops": 10_000_000, "period_ms": PERIOD_MS,
               "check_interval_us": 1000, "estimator": false}),
    );
    let bdevs: Vec<String> = (1..=HOSTS)
        .map(|i| t.qos_bdev_for_host(i, "Malloc0", "d"))
        .collect();
    expose_per_host(&mut t, &bdevs, s.port);
    let ctrls: Vec<Controller> = (1..=HOSTS).map(|i| s.controller(i)).collect();
    let qds = [32u32, 128, 32, 32];
    let plain_jobs: Vec<Job> = ctrls
        .iter()
        .zip(qds)
        .map(|(c, q)| Job::new(&c.bdev(), "randread", 4096, q))
        .collect();
    let plain_cfg = bdev_config(&ctrls, &[]);
    let base = s
        .bdevperf(false, plain_cfg.clone(), plain_jobs.clone(), 5, &[])
        .run();
    let agg = base.total_iops();
    let capacity = ((agg * 0.25 / 100.0).floor() as u64 * 100).clamp(1000, 8000);
    let res = zipf(HOSTS, capacity * 9 / 10);
    let limits = [res[0] * 2, res[1] * 6 / 5, res[2] * 3 / 2, res[3] * 2];
    println!(
        "machine with this load, no QoS: {agg:.0} IOPS; capacity {capacity} IOPS (min(A/4, 8000)); \
         reservations {res:?} (Zipf, 90%); limits {limits:?}; {PERIOD_MS} ms periods"
    );
    t.call(
        "qos_domain_update",
        json!({"name": "d", "capacity_iops": capacity}),
    );
    for i in 1..=HOSTS {
        t.call(
            "qos_host_set",
            json!({"domain": "d", "host_nqn": host_nqn(i), "min_iops": res[i - 1],
                   "max_iops": limits[i - 1]}),
        );
    }
    let qos: Vec<Value> = ctrls
        .iter()
        .enumerate()
        .map(|(k, c)| json!({"name": format!("qi{}", k + 1), "base_bdev_name": c.bdev()}))
        .collect();
    let qos_jobs: Vec<Job> = (1..=HOSTS)
        .zip(qds)
        .map(|(i, q)| Job::new(&format!("qi{i}"), "randread", 4096, q))
        .collect();
    let secs = 20u32;
    let mut summary = Vec::new();
    let mut failures = Vec::new();
    // Same load twice: plain initiators (the target holds their excess), then
    // cooperative ones (the initiator plugin holds it).
    for (label, plugin, cfg, jobs) in [
        ("plain initiators", false, plain_cfg, plain_jobs),
        (
            "cooperative initiators",
            true,
            bdev_config(&ctrls, &qos),
            qos_jobs,
        ),
    ] {
        let mut b = s.bdevperf(plugin, cfg, jobs, secs, &[]);
        let (hist, t0, out) = run_polling(&mut t, &mut b, secs);
        let epochs = hist.epochs(
            t0 + Duration::from_secs(3),
            t0 + Duration::from_secs(secs as u64),
        );
        let per_period = |v: u64| v as f64 * PERIOD_MS as f64 / 1000.0;
        println!("{label}:");
        println!(
            "  host  periods  reservation/period  met>=99%  avg_ops/period  limit/period  vs_limit  target_held(avg/max)  failed"
        );
        let mut held_all = Vec::new();
        let failed = out.failed();
        for i in 1..=HOSTS {
            let nqn = host_nqn(i);
            let ops = hist.ops(&nqn, &epochs);
            let need = per_period(res[i - 1]) * 0.99;
            let met = ops.iter().filter(|o| **o as f64 >= need).count();
            let frac = met as f64 / ops.len().max(1) as f64;
            let avg = ops.iter().sum::<u64>() as f64 / ops.len().max(1) as f64;
            let lim = per_period(limits[i - 1]);
            let held = hist.held.get(&nqn).cloned().unwrap_or_default();
            let havg = held.iter().sum::<i64>() as f64 / held.len().max(1) as f64;
            let hmax = held.iter().copied().max().unwrap_or(0);
            held_all.push(havg);
            println!(
                "  h{i}    {:>5}    {:>10.1}          {:>6.1}%   {:>10.1}      {:>8.1}    {:>+6.2}%   {:>6.1}/{:<6}           {failed}",
                ops.len(),
                per_period(res[i - 1]),
                frac * 100.0,
                avg,
                lim,
                (avg / lim - 1.0) * 100.0,
                havg,
                hmax
            );
            if plugin {
                if ops.len() < 20 {
                    failures.push(format!("h{i}: only {} periods observed", ops.len()));
                }
                if frac < 0.95 {
                    failures.push(format!(
                        "h{i}: reservation met in {:.1}% of periods (< 95%): {ops:?}",
                        frac * 100.0
                    ));
                }
                if avg > lim * 1.01 {
                    failures.push(format!("h{i}: {avg:.1} ops/period over its limit {lim}"));
                }
                if failed > 0 {
                    failures.push(format!("{failed} I/O failed"));
                }
            }
        }
        summary.push((label, held_all.iter().sum::<f64>()));
    }
    let st = t.call("qos_stats_get", json!({"domain": "d"}));
    drop(t);
    println!(
        "target's held I/O (sum over hosts of the average): {}",
        summary
            .iter()
            .map(|(l, h)| format!("{l} {h:.1}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    assert!(
        failures.is_empty(),
        "QoS targets missed:\n{}\nlast stats: {st}",
        failures.join("\n")
    );
    assert!(
        summary[1].1 < summary[0].1,
        "cooperative initiators should keep the target's queues shorter: {summary:?}"
    );
}

// ---- reader and writer -----------------------------------------------------------------

/// Host 1 reads, host 2 writes, each through its QoS bdev at a target whose domain is
/// far above what the machine does (the target only keeps the books here).
fn rw_target(s: &Setup) -> Target {
    let mut t = s.target(300);
    t.malloc("Malloc0", 65536, 4096);
    t.call(
        "qos_domain_create",
        json!({"name": "d", "capacity_iops": 2_000_000, "period_ms": 200, "estimator": false}),
    );
    let mut bdevs = Vec::new();
    for i in [1, 2] {
        t.call(
            "qos_host_set",
            json!({"domain": "d", "host_nqn": host_nqn(i), "min_iops": 1000}),
        );
        bdevs.push(t.qos_bdev_for_host(i, "Malloc0", "d"));
    }
    // A paced chunk in one capsule: with SPDK's default of 4 KiB in capsule, every chunk
    // of a write waits for an R2T and goes as a separate data PDU (docs/rpc.md).
    let in_capsule = env_number("QOS_IT_IN_CAPSULE_BYTES", "bytes, e.g. 32768")
        .or_else(|| env_number("QOS_IT_CHUNK_BYTES", "bytes, e.g. 32768"))
        .unwrap_or(128 * 1024);
    println!("target: TCP transport with in_capsule_data_size {in_capsule}");
    t.call(
        "nvmf_create_transport",
        json!({"trtype": "TCP", "in_capsule_data_size": in_capsule}),
    );
    for (k, b) in bdevs.iter().enumerate() {
        t.expose_host(k + 1, b, s.port);
    }
    t
}

#[test]
fn pacing_protects_a_small_reader_from_a_large_writer() {
    let Some(s) =
        setup_or_skip("initiator_qos::pacing_protects_a_small_reader_from_a_large_writer")
    else {
        return;
    };
    let t = rw_target(&s);
    let ctrls = [s.controller(1), s.controller(2)];
    let WriterAlone { link, steady } = writer_alone(&s, &ctrls);
    // Justitia's guarantee with one latency-sensitive flow: half the link the writer
    // really has, its rate alone and whole.
    let share = link as f64 / 2.0;
    println!(
        "link_mibps = {link} (the writer alone, plain bdev_nvme, best round: the real link); the writer's \
         share beside one latency-sensitive reader: link/2 = {share:.0} MiB/s"
    );
    let plain_cfg = bdev_config(&ctrls, &[]);
    let qos_cfg = bdev_config(
        &ctrls,
        &[
            with_chunk(
                json!({"name": "qr", "base_bdev_name": ctrls[0].bdev(), "link_mibps": link}),
            ),
            with_chunk(json!({"name": "qw", "base_bdev_name": ctrls[1].bdev()})),
        ],
    );
    let secs = 8u32;
    // The floor: the reader alone, no writer, plain bdev_nvme.
    let reader = vec![Job::new(&ctrls[0].bdev(), "randread", 4096, 1)];
    let out = s.bdevperf(false, plain_cfg.clone(), reader, 4, &[]).run();
    let alone = out.job(&ctrls[0].bdev());
    println!(
        "reader alone (plain, no writer): {:.0} IOPS p50 {:.1} us p99 {:.1} us",
        alone.iops,
        alone.p50_us.unwrap_or(0.0),
        alone.p99_us.unwrap_or(0.0)
    );
    let mut rows: Vec<Row> = Vec::new();
    let mut chunks = Vec::new();
    for round in 0..3 {
        let order: [bool; 2] = if round % 2 == 0 {
            [false, true]
        } else {
            [true, false]
        };
        for qos in order {
            let (cfg, r, w) = if qos {
                (qos_cfg.clone(), "qr".to_string(), "qw".to_string())
            } else {
                (plain_cfg.clone(), ctrls[0].bdev(), ctrls[1].bdev())
            };
            let jobs = vec![
                Job::new(&r, "randread", 4096, 1),
                Job::new(&w, "write", 1 << 20, 4),
            ];
            let mut b = s.bdevperf(qos, cfg, jobs, secs, &[]);
            // With QoS: the writer's pacer group 1 s in and 1 s before the end (what
            // it allowed and what the writer sent while it held it, in between), and
            // the QoS bdevs' state halfway through.
            let (out, state, r_state, ends) = if qos {
                let run = b.start_tests();
                let ms = u64::from(secs) * 1000;
                std::thread::sleep(Duration::from_millis(1000));
                let first = b.ini_bdev(&w)["pacer"].clone();
                std::thread::sleep(Duration::from_millis(ms / 2 - 1000));
                let (ws, rs) = (b.ini_bdev(&w), b.ini_bdev(&r));
                std::thread::sleep(Duration::from_millis(ms / 2 - 1000));
                let last = b.ini_bdev(&w)["pacer"].clone();
                (b.finish_tests(run), ws, rs, Some((first, last)))
            } else {
                (b.run(), Value::Null, Value::Null, None)
            };
            let (rr, wr) = (out.job(&r), out.job(&w));
            assert!(
                rr.io_failed == 0 && wr.io_failed == 0,
                "failed I/O:\n{}",
                out.tail(20)
            );
            let p99 = rr
                .p99_us
                .unwrap_or_else(|| panic!("no p99 in:\n{}", out.tail(30)));
            println!(
                "round {round} {:<22} reader {:>8.0} IOPS p50 {:>7.1} us p99 {:>8.1} us | writer {:>6.0} MiB/s",
                if qos {
                    "with initiator QoS:"
                } else {
                    "without:"
                },
                rr.iops,
                rr.p50_us.unwrap_or(0.0),
                p99,
                wr.mibps
            );
            let mut held = None;
            if let Some((a, z)) = &ends {
                let d = |k: &str| {
                    let (a, z) = (a[k].as_u64(), z[k].as_u64());
                    let (a, z) = a
                        .zip(z)
                        .unwrap_or_else(|| panic!("no {k} in {a:?} / {z:?}"));
                    z.saturating_sub(a) as f64
                };
                let span = d("now_ns").max(1.0);
                let h = Held {
                    fraction: d("held_ns") / span,
                    allowed: d("held_allowed_bytes"),
                    stream_allowed: d("held_stream_allowed_bytes"),
                    charged: d("held_charged_bytes"),
                    sent: d("held_sent_bytes"),
                    mean_mibps: d("allowed_bytes_total") / span * 1e9 / (1u64 << 20) as f64,
                };
                println!(
                    "    over {:.1} s: pacer allowed {:.0} MiB/s on average (U's integral); the \
                     writer held by it {:.0} % of the time, and then it sent {:.3} of what \
                     U allowed ({:.3} of its stream's own rate; {:.3} in its chunks' bytes: \
                     chunks above the chunk size take the chunk size's tokens)",
                    span / 1e9,
                    h.mean_mibps,
                    h.fraction * 100.0,
                    h.charged / h.allowed.max(1.0),
                    h.charged / h.stream_allowed.max(1.0),
                    h.sent / h.allowed.max(1.0),
                );
                held = Some(h);
            }
            if qos {
                let (pacer, w) = (&state["pacer"], &state["state"]);
                let us = |k: &str| pacer[k].as_u64().map_or(0.0, |n| n as f64 / 1000.0);
                let n = |k: &str| w[k].as_u64().unwrap_or(0);
                let allowed = pacer["allowed_mibps"].as_f64().unwrap_or(0.0);
                // The chunk the writer really used (the pacer's chunk is at most its
                // size; `plan_even_chunks` may take fewer, larger equal ones), in 4 KiB.
                let (sent, count) = (n("chunk_bytes_sent"), n("chunks"));
                if count > 0 {
                    chunks.push(sent.div_ceil(count).next_multiple_of(4096));
                }
                println!(
                    "    halfway: pacer allowed {allowed} MiB/s, chunk {} KiB (the writer's \
                     mean {:.1} KiB), latency target {:.1} us, probe base latency {:.1} us; \
                     writer so far {} chunks, {} held for tokens ({:.1} ms held, {:.1} ms \
                     paced in all)",
                    pacer["chunk_bytes"].as_u64().unwrap_or(0) / 1024,
                    n("chunk_bytes_sent") as f64 / n("chunks").max(1) as f64 / 1024.0,
                    us("latency_target_ns"),
                    us("base_latency_ns"),
                    n("chunks"),
                    n("held_total"),
                    n("held_ns") as f64 / 1e6,
                    n("paced_ns") as f64 / 1e6,
                );
                println!(
                    "    halfway: AIMD {} of {} steps congested, probe p99 {:.1} us at the last; \
                     probes sent on the reader's connection {}, on the writer's {}",
                    pacer["aimd_congested"],
                    pacer["aimd_steps"],
                    us("probe_p99_ns"),
                    r_state["state"]["probes_sent"],
                    w["probes_sent"],
                );
            }
            rows.push(Row {
                round,
                qos,
                p99,
                writer: wr.mibps,
                held,
            });
        }
    }
    let pick = |q: bool, f: fn(&Row) -> f64| -> Vec<f64> {
        rows.iter().filter(|r| r.qos == q).map(f).collect()
    };
    let in_round = |f: fn(&Row) -> f64| -> Vec<f64> {
        (0..3)
            .filter_map(|k| {
                let p = rows.iter().find(|r| r.round == k && !r.qos)?;
                let q = rows.iter().find(|r| r.round == k && r.qos)?;
                Some(f(p) / f(q).max(1e-9))
            })
            .collect()
    };
    let p99_plain = median(&pick(false, |r| r.p99));
    let p99_qos = median(&pick(true, |r| r.p99));
    let w_plain = median(&pick(false, |r| r.writer));
    let w_qos = median(&pick(true, |r| r.writer));
    let p99_ratios = in_round(|r| r.p99);
    // The writer with QoS against the writer without, in the same round.
    let kept: Vec<f64> = in_round(|r| r.writer).iter().map(|x| 1.0 / x).collect();
    let of_allowed: Vec<f64> = rows
        .iter()
        .filter_map(|r| Some(r.writer / r.held.as_ref()?.mean_mibps.max(1e-9)))
        .collect();
    let ratio = p99_plain / p99_qos;
    println!(
        "reader p99 (median of 3): {p99_plain:.1} us without, {p99_qos:.1} us with initiator QoS: \
         ratio {ratio:.2} (rounds {})",
        fmt_all(&p99_ratios)
    );
    println!(
        "writer (median): {w_plain:.0} MiB/s without, {w_qos:.0} MiB/s with = {:.0}% of its share \
         of the real link ({share:.0} MiB/s); with / without in each round: {} (median {:.2}); \
         against U's mean over the round: {}",
        w_qos / share * 100.0,
        fmt_all(&kept),
        median(&kept),
        fmt_all(&of_allowed),
    );
    assert!(
        ratio > 1.0,
        "chunking and pacing should lower the reader's p99 (ratio {ratio:.2})"
    );
    // The writer gets what its pacer allows: while the pacer held it (a chunk refused and
    // waiting for tokens), it sent at least 85 % of what U allowed over that time (the
    // tokens its chunks took against U's integral; median of the rounds). Time in which
    // all its chunks were sent and it waited on the path is not judged: beside a reader U
    // is often above what the path gives the writer, and against one snapshot of U (which
    // AIMD moves every millisecond) this check failed in three runs of five on
    // 2026-11-29. Judged in rounds where the pacer held the writer at least a tenth of the
    // time; a pacer that starves the writer (late releases, stream rates below U) holds
    // it all the more.
    let judged: Vec<f64> = rows
        .iter()
        .filter_map(|r| r.held.as_ref())
        .filter(|h| h.fraction >= 0.1)
        .map(|h| h.charged / h.allowed.max(1.0))
        .collect();
    println!(
        "writer's delivery while its pacer held it (tokens sent / allowed, rounds held >= 10 % \
         of the time): {}",
        fmt_all(&judged)
    );
    if judged.is_empty() {
        println!(
            "the writer's delivery is not judged: its pacer held it less than a tenth of the \
             time in every round"
        );
    } else {
        assert!(
            median(&judged) >= 0.85,
            "the writer should get what its pacer allows (>= 85 % while it held it): {}",
            fmt_all(&judged)
        );
    }
    chunked_writer_alone(&s, &ctrls, median_u64(&chunks));
    drop(t);
    // The writer without the plugin, round by round: the machine's speed in the rounds
    // themselves (a slow spell there leaves the writer short of an allowance set from
    // the fast link, whatever the pacer does: 0.80-0.83 of it in one such run).
    let without = pick(false, |r| r.writer);
    let (lo, hi) = (
        without.iter().copied().fold(f64::INFINITY, f64::min),
        without.iter().copied().fold(0.0, f64::max),
    );
    // ...and at the speed the link was measured at: a slow spell through all the paired
    // rounds (writer without the plugin 2066 MiB/s against a link of 4474) left the writer
    // at 0.82-0.87 of an allowance it could not reach.
    if !steady || hi > 1.25 * lo || median(&without) < 0.75 * link as f64 {
        println!(
            "the machine's speed moved: its rounds alone, or without the plugin \
             ({lo:.0}-{hi:.0} MiB/s against a link of {link}), moved by more than 25 %"
        );
    }
}

/// What the writer's pacer allowed and the writer sent while the pacer held it, between
/// two readings of its group's state in a round with QoS.
struct Held {
    /// Of the time between the readings, the pacer held the writer this much.
    fraction: f64,
    /// U over the time it held the writer, bytes.
    allowed: f64,
    /// Its stream's own rate over that time (as `allowed`), bytes.
    stream_allowed: f64,
    /// The tokens the writer's chunks took meanwhile, bytes.
    charged: f64,
    /// The bytes those chunks carried.
    sent: f64,
    /// U's mean between the readings, MiB/s.
    mean_mibps: f64,
}

/// One rate of the reader/writer rounds.
struct Row {
    round: usize,
    qos: bool,
    p99: f64,
    writer: f64,
    /// The writer's pacer between 1 s in and 1 s before the end (with QoS).
    held: Option<Held>,
}

fn fmt_all(v: &[f64]) -> String {
    let parts: Vec<String> = v.iter().map(|x| format!("{x:.2}")).collect();
    parts.join(" / ")
}

fn median_u64(v: &[u64]) -> u64 {
    let mut v = v.to_vec();
    v.sort_unstable();
    v.get(v.len() / 2).copied().unwrap_or(0)
}

/// The writer alone, forced into chunks of the size it used beside the reader (its mean
/// chunk, `split_always`, a fixed `chunk`, no rate limit: only what chunks cost), against
/// plain bdev_nvme, side by side in `QOS_IT_ROUNDS` rounds: the ratio is printed.
fn chunked_writer_alone(s: &Setup, ctrls: &[Controller; 2], chunk: u64) {
    if chunk == 0 {
        println!("the pacer reported no chunk size: chunks alone not measured");
        return;
    }
    let extra = json!({"split_always": true, "chunk_auto": false, "chunk_bytes": chunk,
                       "link_mibps": 100_000});
    let (ratios, _) = alone_rounds(s, ctrls, &[("QoS bdev, split_always", Some(extra))]);
    let (q1, m, q3) = quartiles(&ratios[0]);
    println!(
        "writer alone in chunks of {} KiB (its chunks beside the reader) / plain \
         bdev_nvme = {m:.3} (quartiles {q1:.3}-{q3:.3})",
        chunk / 1024
    );
}

/// `q` with `chunk_bytes` from `QOS_IT_CHUNK_BYTES` (a fixed chunk: `chunk_auto` off),
/// `latency_target_us` from `QOS_IT_LATENCY_TARGET_US` and `latency_target_auto_milli`
/// from `QOS_IT_LATENCY_AUTO_MILLI` when set (the plugin's defaults otherwise), for
/// trying other settings in the reader/writer test.
fn with_chunk(mut q: Value) -> Value {
    for (var, key) in [
        ("QOS_IT_CHUNK_BYTES", "chunk_bytes"),
        ("QOS_IT_LATENCY_TARGET_US", "latency_target_us"),
        ("QOS_IT_LATENCY_AUTO_MILLI", "latency_target_auto_milli"),
    ] {
        if let Some(v) = env_number(var, "a whole number") {
            q[key] = json!(v);
            if key == "chunk_bytes" {
                q["chunk_auto"] = json!(false);
            }
        }
    }
    q
}

/// Rounds of a 1 MiB writer at QD 4 alone, side by side (order rotating): plain
/// bdev_nvme and each of `variants` (a QoS bdev with those options). Checks that a
/// variant with `split_always` split every write and one without sent them whole
/// (Justitia's trigger: no small I/O). Returns each variant's ratios to plain, round by
/// round, and plain's MiB/s.
fn alone_rounds(
    s: &Setup,
    ctrls: &[Controller; 2],
    variants: &[(&str, Option<Value>)],
) -> (Vec<Vec<f64>>, Vec<f64>) {
    let rounds = env_number("QOS_IT_ROUNDS", "a number of rounds, e.g. 5")
        .unwrap_or(5)
        .max(1) as usize;
    let mut all: Vec<(&str, Option<Value>)> = vec![("plain", None)];
    all.extend(variants.iter().cloned());
    let mut mibps = vec![Vec::new(); all.len()];
    for round in 0..rounds {
        let mut line = format!("writer alone, round {round}:");
        for k in 0..all.len() {
            let v = (k + round) % all.len();
            let (label, extra) = &all[v];
            let (bdev, cfg) = match extra {
                None => (ctrls[1].bdev(), bdev_config(ctrls, &[])),
                Some(e) => {
                    let q = with_chunk(json!({"name": "qw", "base_bdev_name": ctrls[1].bdev()}));
                    ("qw".to_string(), bdev_config(ctrls, &[merged(q, e)]))
                }
            };
            let writer = vec![Job::new(&bdev, "write", 1 << 20, 4)];
            let mut b = s.bdevperf(extra.is_some(), cfg, writer, 4, &[]);
            let run = b.start_tests();
            // The QoS bdev's counters 1.5 s and 2.5 s in: the bdev layer's examine reads
            // at start-up are small I/O, so the first writes (within `latency_idle`,
            // 100 ms) are split; after that, none may be.
            let mut states = Vec::new();
            for wait_ms in [1500, 1000] {
                std::thread::sleep(Duration::from_millis(wait_ms));
                if extra.is_some() {
                    states.push(b.ini_bdev("qw"));
                }
            }
            if let [a, b] = &states[..]
                && a["state"]["ios"] == b["state"]["ios"]
            {
                // Printed before waiting for the jobs: a stalled pacer would hang there.
                eprintln!("the QoS bdev took no I/O in 1 s: {a} then {b}");
            }
            let out = b.finish_tests(run);
            let r = out.job(&bdev);
            assert_eq!(r.io_failed, 0, "failed I/O:\n{}", out.tail(20));
            if let ([a, b], Some(e)) = (&states[..], extra) {
                let count = |st: &Value, k: &str| st["state"][k].as_u64().unwrap_or(0);
                let split = count(b, "large_ios") - count(a, "large_ios");
                let whole = count(b, "large_whole_ios") - count(a, "large_whole_ios");
                if e["split_always"] == json!(true) {
                    assert!(
                        split > 0 && whole == 0,
                        "split_always should split every write: {a} then {b}"
                    );
                } else {
                    assert!(
                        split == 0 && whole > 0,
                        "with no small I/O the writes should go whole: {a} then {b}"
                    );
                }
            }
            line += &format!(" {label} {:.0} MiB/s;", r.mibps);
            mibps[v].push(r.mibps);
        }
        println!("{line}");
    }
    let ratios = (1..all.len())
        .map(|v| {
            mibps[v]
                .iter()
                .zip(&mibps[0])
                .map(|(q, p)| q / p.max(1.0))
                .collect()
        })
        .collect();
    (ratios, mibps.swap_remove(0))
}

/// A 1 MiB writer at QD 4 alone, plain bdev_nvme and through its QoS bdev (Justitia's
/// trigger: no small I/O, so sent whole), side by side in `QOS_IT_ROUNDS` rounds
/// (default 5): prints the ratio (median, quartiles) and returns plain's best MiB/s,
/// the link the writer really has, and whether plain's rounds were steady.
fn writer_alone(s: &Setup, ctrls: &[Controller; 2]) -> WriterAlone {
    let (ratios, plain) = alone_rounds(s, ctrls, &[("QoS bdev", Some(json!({})))]);
    let (q1, m, q3) = quartiles(&ratios[0]);
    println!(
        "writer alone: QoS bdev (whole) / plain bdev_nvme MiB/s = {m:.3} (quartiles \
         {q1:.3}-{q3:.3}, {} rounds)",
        plain.len()
    );
    let lo = plain.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = plain.iter().copied().fold(0.0, f64::max);
    // The link is the best round: this machine's noise only ever takes from it, and a
    // link measured in a slow spell sizes the chunks small (they cost the writer) and
    // sets its share low.
    WriterAlone {
        link: (hi as u64).max(50),
        steady: hi <= 1.25 * lo,
    }
}

/// What `writer_alone` measured: plain's best MiB/s (the real link), and whether its
/// rounds held within 25 % of each other (this machine's speed can move by 2x within a
/// minute; the share is then no measure to hold the writer to).
struct WriterAlone {
    link: u64,
    steady: bool,
}

// ---- robustness ----------------------------------------------------------------------

/// A target with the plugin and one limited host (host 1: 100 to 500 IOPS), its QoS
/// bdev exposed: I/O is held at the initiator.
fn limited_host_target(s: &Setup) -> Target {
    s.one_host_target(
        300,
        (65536, 4096),
        json!({"capacity_iops": 200000, "period_ms": 200, "estimator": false}),
        json!({"min_iops": 100, "max_iops": 500}),
    )
}

/// bdevperf's configuration: host 1's controller and QoS bdev `qa` over it, with the
/// options of `extra`.
fn qa_config(s: &Setup, extra: Value) -> Value {
    let c = s.controller(1);
    let q = merged(json!({"name": "qa", "base_bdev_name": c.bdev()}), &extra);
    bdev_config(std::slice::from_ref(&c), &[q])
}

/// bdevperf running `rw` of 256 KiB at queue depth `qd` for `secs` on QoS bdev `qa`,
/// which splits every I/O in chunks (`split_always`); jobs go on after a failed I/O.
fn chunked_load(s: &Setup, rw: &str, qd: u32, secs: u32) -> Bdevperf {
    let cfg = qa_config(s, json!({"split_always": true}));
    let jobs = vec![Job::new("qa", rw, 256 << 10, qd)];
    s.bdevperf(true, cfg, jobs, secs, &["-f"])
}

/// QoS bdev `qa`'s I/O held for tokens now, and so far.
fn qa_held(b: &Bdevperf) -> (i64, u64) {
    let st = &b.ini_bdev("qa")["state"];
    (
        st["held"].as_i64().unwrap_or(0),
        st["held_total"].as_u64().unwrap_or(0),
    )
}

/// A target without the plugin: the QoS bdev falls back to pass-through with one
/// warning; the chunked data path verified (1 MiB writes and reads in 32 KiB chunks; a
/// verify job alone sends no small I/O, so `split_always` makes the pacer split it).
#[test]
fn robustness_fallback_without_the_target_plugin() {
    let Some(s) = setup_or_skip("initiator_qos::robustness_fallback_without_the_target_plugin")
    else {
        return;
    };
    let mut t = s.bare_target(300);
    t.malloc("Malloc0", 65536, 4096);
    expose_per_host(&mut t, &["Malloc0".into()], s.port);
    let c = s.controller(1);
    let cfg = bdev_config(
        std::slice::from_ref(&c),
        &[json!({"name": "qp", "base_bdev_name": c.bdev(), "split_always": true})],
    );
    let mut b = s.bdevperf(
        true,
        cfg,
        vec![Job::new("qp", "verify", 1 << 20, 8)],
        4,
        &[],
    );
    let (out, st) = run_sampling(&mut b, "qp", Duration::from_secs(2));
    let qp = out.job("qp");
    let warnings = out
        .log
        .matches("target does not support nvmf-qos vendor commands")
        .count();
    println!(
        "plain target: mode {}, {} chunks, verify of 1 MiB I/O: {:.0} MiB/s, {} failed; warnings logged: {warnings}",
        st["state"]["mode"], st["state"]["chunks"], qp.mibps, qp.io_failed
    );
    assert_eq!(st["state"]["mode"], "pass_through");
    assert!(st["state"]["chunks"].as_u64().unwrap_or(0) > 0);
    assert_eq!(qp.io_failed, 0, "{}", out.tail(20));
    assert!(qp.iops > 0.0);
    assert_eq!(warnings, 1, "one warning per QoS bdev:\n{}", out.tail(30));
}

/// Bad input, and save_config replay (bdevperf waits for perform_tests: RPCs only).
#[test]
fn robustness_bad_input_and_save_config_replay() {
    let Some(s) = setup_or_skip("initiator_qos::robustness_bad_input_and_save_config_replay")
    else {
        return;
    };
    let _t = limited_host_target(&s);
    let base = s.controller(1).bdev();
    let job = || vec![Job::new("qa", "randread", 4096, 1)];
    let b = s.bdevperf(
        true,
        qa_config(&s, json!({"chunk_bytes": 131072})),
        job(),
        1,
        &[],
    );
    println!("bad input:");
    for (method, params, code, text) in [
        (
            "qos_ini_bdev_create",
            json!({"name": "x", "base_bdev_name": "nope"}),
            -2,
            "unknown bdev",
        ),
        (
            "qos_ini_bdev_create",
            json!({"name": "qa", "base_bdev_name": base}),
            -17,
            "already exists",
        ),
        (
            "qos_ini_bdev_create",
            json!({"name": "x", "base_bdev_name": base}),
            -16,
            "claimed",
        ),
        (
            "qos_ini_bdev_create",
            json!({"name": "x", "base_bdev_name": "qa", "chunk_bytes": 100}),
            -22,
            "chunk",
        ),
        (
            "qos_ini_bdev_create",
            json!({"name": "x", "base_bdev_name": "qa", "chunk_bytes": 65536}),
            -22,
            "pacer group \"default\" already exists",
        ),
        (
            "qos_ini_bdev_create",
            json!({"name": "x", "base_bdev_name": "qa", "chunk": 1}),
            -22,
            "unknown field",
        ),
        (
            "qos_ini_bdev_set_options",
            json!({"name": "nope", "pacing": false}),
            -2,
            "unknown",
        ),
        (
            "qos_ini_bdev_set_options",
            json!({"name": "qa", "request_timeout_us": 0}),
            -22,
            "request_timeout_us",
        ),
        (
            "qos_ini_bdev_delete",
            json!({"name": "nope"}),
            -2,
            "unknown",
        ),
    ] {
        b.refuse(method, params, code, text);
    }
    b.call(
        "qos_ini_bdev_set_options",
        json!({"name": "qa", "latency_target_us": 300, "acquire_ops": 64}),
    );
    let cfgs = b.call("framework_get_config", json!({"name": "bdev"}));
    let methods = config_methods(&cfgs);
    let attach = methods
        .iter()
        .position(|m| *m == "bdev_nvme_attach_controller");
    let create = methods.iter().position(|m| *m == "qos_ini_bdev_create");
    assert!(
        attach.is_some() && create > attach,
        "save_config order: {methods:?}"
    );
    let saved = json!({"subsystems": [{"subsystem": "bdev", "config": cfgs}]});
    let before = b.ini_bdev("qa");
    drop(b);
    let b = s.bdevperf(true, saved, job(), 1, &[]);
    let after = b.ini_bdev("qa");
    for k in [
        "chunk_bytes",
        "latency_target_us",
        "acquire_ops",
        "uuid",
        "pacer_group",
    ] {
        assert_eq!(before[k], after[k], "{k} after replay");
    }
    println!(
        "save_config replays qos_ini_bdev_create after bdev_nvme_attach_controller; options kept"
    );
}

/// Vendor commands that time out (a 10 us time-out, shorter than any round trip): I/O
/// never waits for them; late replies are ignored.
#[test]
fn robustness_vendor_command_time_outs() {
    let Some(s) = setup_or_skip("initiator_qos::robustness_vendor_command_time_outs") else {
        return;
    };
    let _t = limited_host_target(&s);
    let cfg = qa_config(&s, json!({"request_timeout_us": 10}));
    let mut b = s.bdevperf(
        true,
        cfg,
        vec![Job::new("qa", "randread", 4096, 16)],
        4,
        &[],
    );
    let (out, st) = run_sampling(&mut b, "qa", Duration::from_secs(3));
    let qa = out.job("qa");
    println!(
        "time-outs: {:.0} IOPS, {} failed, mode {}, late replies {}, engine restarts {}",
        qa.iops,
        qa.io_failed,
        st["state"]["mode"],
        st["state"]["vendor_late"],
        st["state"]["engine_restarts"]
    );
    assert_eq!(qa.io_failed, 0, "{}", out.tail(20));
    assert!(st["state"]["vendor_late"].as_u64().unwrap_or(0) > 0);
}

/// Reset (bdevperf's reset workload: verify plus a bdev reset at 10 s) and a controller
/// reset (bdev_nvme_reset_controller at 3 s), with I/O held (the host's limit is 500
/// IOPS) and chunked (256 KiB I/O, 32 KiB chunks).
#[test]
fn robustness_resets_with_held_and_chunked_io() {
    let Some(s) = setup_or_skip("initiator_qos::robustness_resets_with_held_and_chunked_io") else {
        return;
    };
    let _t = limited_host_target(&s);
    let mut b = chunked_load(&s, "reset", 16, 12);
    let run = b.start_tests();
    std::thread::sleep(Duration::from_secs(3));
    let (held, held_total) = qa_held(&b);
    let t0 = Instant::now();
    let rc = b.rpc(
        "bdev_nvme_reset_controller",
        json!({"name": s.controller(1).name}),
        Duration::from_secs(30),
    );
    println!(
        "controller reset with {held} I/O held at the initiator ({held_total} held so far): {:?} in {:?}",
        rc.map(|_| "ok"),
        t0.elapsed()
    );
    let out = b.finish_tests(run);
    let qa = out.job("qa");
    println!(
        "reset workload: {:.0} IOPS, {} failed (aborted by the resets; bdevperf's reset \
         workload on the plain bdev_nvme bdev fails as many); bdevperf exited",
        qa.iops, qa.io_failed
    );
    assert!(held_total > 0, "expected I/O held at the initiator");
    assert!(qa.iops > 0.0);
    assert!(!out.log.contains("Reset blockdev"), "{}", out.tail(20));
}

/// Delete under load with held and chunked I/O: everything completes, quickly.
#[test]
fn robustness_delete_under_load() {
    let Some(s) = setup_or_skip("initiator_qos::robustness_delete_under_load") else {
        return;
    };
    let _t = limited_host_target(&s);
    let mut b = chunked_load(&s, "randrw", 32, 20);
    let run = b.start_tests();
    std::thread::sleep(Duration::from_secs(2));
    let (held, held_total) = qa_held(&b);
    let t0 = Instant::now();
    let r = b.rpc(
        "qos_ini_bdev_delete",
        json!({"name": "qa"}),
        Duration::from_secs(30),
    );
    let took = t0.elapsed();
    let (perf, _) = b.end_tests(run, 60);
    println!(
        "delete with {held} I/O held ({held_total} held so far): {:?} in {took:?}; bdevperf ended: {}",
        r,
        perf.as_ref().map_or("with an error", |_| "normally")
    );
    assert_eq!(r.ok(), Some(json!(true)));
    assert!(held_total > 0);
    assert!(took < Duration::from_secs(10));
}

/// Disconnect: the target drops the host's subsystem under load; bdev_nvme gives the
/// controller up, the QoS bdev goes with its base, and bdevperf ends.
#[test]
fn robustness_disconnect() {
    let Some(s) = setup_or_skip("initiator_qos::robustness_disconnect") else {
        return;
    };
    let mut t = limited_host_target(&s);
    let jobs = vec![Job::new("qa", "randread", 256 << 10, 32)];
    let mut b = s.bdevperf(true, qa_config(&s, json!({})), jobs, 20, &["-f"]);
    let run = b.start_tests();
    std::thread::sleep(Duration::from_secs(2));
    let t0 = Instant::now();
    t.call("nvmf_delete_subsystem", json!({"nqn": subsys_nqn(1)}));
    let _ = run.wait();
    let took = t0.elapsed();
    let out = b
        .finish(90)
        .unwrap_or_else(|| panic!("bdevperf hung after disconnect; log:\n{}", b.log_tail(30)));
    let removed = out.contains("base bdev removed");
    println!(
        "disconnect (the host's subsystem deleted at the target under load): the jobs ended {took:?} later; \
         QoS bdev deleted with its base: {removed}; bdevperf exited"
    );
    if !removed {
        let lines: Vec<&str> = out
            .lines()
            .filter(|l| l.contains("bdev_nvme") || l.contains("nvmf_qos_ini"))
            .take(12)
            .collect();
        println!("  {}", lines.join("\n  "));
    }
}

// ---- fio ---------------------------------------------------------------------------------

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// A copy of `fio-configs/<name>` in the temporary directory with the test's port.
fn config_copy(s: &Setup, name: &str) -> PathBuf {
    let src = repo().join("fio-configs").join(name);
    let text = std::fs::read_to_string(&src).unwrap_or_else(|e| panic!("{name}: {e}"));
    let dst = std::env::temp_dir().join(format!("nvmf-qos-ini-it-{}-{name}", std::process::id()));
    std::fs::write(&dst, text.replace("\"4420\"", &format!("\"{}\"", s.port)))
        .expect("write config copy");
    dst
}

/// Copies `fio-configs/<job>` with its JSON config copied (test port), every job on
/// core 1 and the run time shortened; runs fio with the SPDK plugin and ours
/// preloaded; returns fio's JSON.
fn fio(s: &Setup, job: &str, secs: u32) -> Value {
    let (plugin, fio) = s.ini.fio.clone().expect("fio present");
    let dir = repo().join("fio-configs");
    let text = std::fs::read_to_string(dir.join(job)).unwrap_or_else(|e| panic!("{job}: {e}"));
    let mut out = String::new();
    for l in text.lines() {
        if let Some(v) = l.strip_prefix("spdk_json_conf=") {
            out.push_str(&format!("spdk_json_conf={}\n", config_copy(s, v).display()));
        } else if l.starts_with("cpus_allowed=") {
            out.push_str("cpus_allowed=1\n");
        } else if l.starts_with("runtime=") {
            out.push_str(&format!("runtime={secs}\n"));
        } else if l.starts_with("ramp_time=") {
            out.push_str("ramp_time=0\n");
        } else {
            out.push_str(l);
            out.push('\n');
        }
    }
    let tmp = std::env::temp_dir().join(format!("nvmf-qos-ini-it-{}-{job}", std::process::id()));
    std::fs::write(&tmp, out).expect("write job");
    let o = std::process::Command::new("timeout")
        .args(["-s", "KILL", &(secs + 60).to_string()])
        .args(["nice", "-n", NICE])
        .arg("env")
        .arg(format!("LD_LIBRARY_PATH={}", s.ini.spdk.lib_dir.display()))
        .arg(format!(
            "LD_PRELOAD={} {}",
            plugin.display(),
            s.ini_lib.display()
        ))
        .arg(&fio)
        .arg("--output-format=json")
        .arg(&tmp)
        .output()
        .expect("run fio");
    let _ = std::fs::remove_file(&tmp);
    let stdout = String::from_utf8_lossy(&o.stdout);
    let start = stdout.find('{').unwrap_or(0);
    serde_json::from_str(&stdout[start..]).unwrap_or_else(|e| {
        panic!(
            "fio {job} ({}): no JSON ({e}):\n{}\n{}",
            o.status,
            tail(&stdout, 20),
            tail(&String::from_utf8_lossy(&o.stderr), 20)
        )
    })
}

#[test]
fn fio_configs_run() {
    let Some(s) = setup_or_skip("initiator_qos::fio_configs_run") else {
        return;
    };
    if s.ini.fio.is_none() {
        let _ = std::io::Write::write_all(
            &mut std::io::stderr(),
            b"SKIPPED: initiator_qos::fio_configs_run: fio or SPDK's fio plugin (build/fio/spdk_bdev) not found\n",
        );
        return;
    }
    let t = s.target_from(&config_copy(&s, "target.json"), 120);
    for (job, want) in [
        ("reservation.fio", vec!["qh1"]),
        ("reader-writer.fio", vec!["reader", "writer"]),
    ] {
        let v = fio(&s, job, 4);
        let jobs = v["jobs"].as_array().cloned().unwrap_or_default();
        let mut names = Vec::new();
        for j in &jobs {
            let name = j["jobname"].as_str().unwrap_or("").to_string();
            let iops = j["read"]["iops"].as_f64().unwrap_or(0.0)
                + j["write"]["iops"].as_f64().unwrap_or(0.0);
            let err = j["error"].as_i64().unwrap_or(-1);
            println!("fio {job}: job {name}: {iops:.0} IOPS, error {err}");
            assert_eq!(err, 0, "{job} {name}");
            assert!(iops > 0.0, "{job} {name}");
            names.push(name);
        }
        for w in want {
            assert!(names.iter().any(|n| n == w), "{job}: jobs {names:?}");
        }
    }
    drop(t);
}
