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
//!   plain, through its QoS bdev (sent whole: no small I/O) and with `split_always`,
//!   side by side (ratios printed; whole and split counted); then one host reads 4 KiB at queue
//!   depth 1, another writes 1 MiB at queue depth 4; in alternating rounds without and
//!   with initiator QoS bdevs (chunking and pacing): the reader's p99 must drop (the
//!   ratio is reported) and the writer keep >= 90% of its share of the link.
//!   `QOS_IT_ROUNDS` sets the writer-alone rounds (default 5), `QOS_IT_CHUNK_BYTES`
//!   the QoS bdevs' `chunk_bytes` (default: the plugin's, 32 KiB),
//!   `QOS_IT_LATENCY_TARGET_US` their `latency_target_us` (default 200),
//!   `QOS_IT_LATENCY_AUTO_MILLI` their `latency_target_auto_milli` (default 1500). The
//!   target's TCP transport carries a chunk in one capsule (`in_capsule_data_size` =
//!   the chunk size; `QOS_IT_IN_CAPSULE_BYTES` sets another).
//!   The reader alone gives the floor of its latency; the pacer group's target, base
//!   latency and the writer's chunk and hold counts are printed halfway through each
//!   round with the plugin.
//! - `robustness`: bad RPC input, save_config replay, chunked verify against a target
//!   without the plugin (fallback, one warning), vendor-command time-outs, reset and
//!   controller reset with held and chunked I/O, delete under load, disconnect.
//! - `fio_configs_run`: the jobs of `fio-configs/` run with fio's SPDK bdev ioengine and
//!   the plugin preloaded.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use initiator_it::*;
use serde_json::{Value, json};

/// SPDK processes of the tests must not overlap (cores, hugepages, ports).
static SERIAL: Mutex<()> = Mutex::new(());

const PORT: u16 = 4453;
const TGT_SHM: u32 = 61;
const BP_SHM: u32 = 62;

fn host(i: &str) -> String {
    format!("nqn.2014-08.io.nvmf-qos:ini-it-{i}")
}
fn subsys(i: &str) -> String {
    format!("nqn.2016-06.io.spdk:nvmf-qos-ini-it-{i}")
}
fn ctrl(i: &str) -> Controller {
    Controller {
        name: format!("Nvme{i}"),
        subnqn: subsys(i),
        hostnqn: host(i),
        port: PORT,
    }
}

fn setup(what: &str) -> Option<Setup> {
    setup_or_skip(what)
}

fn target(s: &Setup, plugin: bool) -> Target {
    s.target(TGT_SHM, plugin, 300, None)
}

/// One subsystem per host (only that host allowed) with namespace `bdev`.
fn expose(t: &mut Target, hosts: &[(&str, &str)]) {
    expose_on(t, json!({"trtype": "TCP"}), hosts);
}

/// [`expose`] over a TCP transport created with `transport` (its `nvmf_create_transport`
/// parameters).
fn expose_on(t: &mut Target, transport: Value, hosts: &[(&str, &str)]) {
    t.call("nvmf_create_transport", transport);
    for (h, bdev) in hosts {
        t.expose_to_host(&subsys(h), &host(h), bdev, PORT);
    }
}

fn bdevperf(s: &Setup, plugin: bool, config: Value, jobs: Vec<Job>, secs: u32) -> Bdevperf {
    s.bdevperf(BP_SHM, plugin, config, jobs, secs, &[])
}

/// Runs the jobs to the end; returns results by bdev and the output.
fn run(b: &mut Bdevperf) -> (BTreeMap<String, JobResult>, String) {
    let h = b.perform_tests();
    finish_run(b, h)
}

/// Waits for the `perform_tests` call `h` and bdevperf's exit; its job results and log.
fn finish_run(
    b: &mut Bdevperf,
    h: std::thread::JoinHandle<Result<Value, RpcError>>,
) -> (BTreeMap<String, JobResult>, String) {
    let res = h.join().expect("perform_tests thread");
    let out = b
        .finish(60)
        .unwrap_or_else(|| panic!("bdevperf did not exit; log:\n{}", b.log_tail(30)));
    let res = res.unwrap_or_else(|e| panic!("perform_tests: {e}\n{}", tail(&out, 30)));
    (job_results(&res, &out), out)
}

/// As [`run`], and the state of QoS bdev `name` (with its pacer group's) halfway
/// through `secs`.
fn run_sampling_state(
    b: &mut Bdevperf,
    name: &str,
    secs: u32,
) -> (BTreeMap<String, JobResult>, String, Value) {
    let h = b.perform_tests();
    std::thread::sleep(Duration::from_millis(u64::from(secs) * 500));
    let state = get_state(b, name);
    let (res, out) = finish_run(b, h);
    (res, out, state)
}

fn tail(s: &str, n: usize) -> String {
    let t = s.replace('\r', "\n");
    let l: Vec<&str> = t.lines().filter(|l| !l.trim().is_empty()).collect();
    l[l.len().saturating_sub(n)..].join("\n")
}

// ---- reservations ----------------------------------------------------------------------

const HOSTS: [&str; 4] = ["h1", "h2", "h3", "h4"];
const PERIOD_MS: u64 = 500;

/// Runs `b` for `secs`, polling the target; returns the history and the results.
fn run_polling(
    t: &mut Target,
    b: &mut Bdevperf,
    hosts: &[String],
    secs: u32,
) -> (History, Instant, BTreeMap<String, JobResult>) {
    let mut hist = History::default();
    let t0 = Instant::now();
    let h = b.perform_tests();
    let mut shown = false;
    while t0.elapsed() < Duration::from_secs(secs as u64 + 1) {
        std::thread::sleep(Duration::from_millis(1500));
        hist.poll(t, "d", hosts);
        if !shown && t0.elapsed() > Duration::from_secs(secs as u64 / 2) {
            shown = true;
            // The initiator side, once, mid-run (the RPC is slow on a busy core).
            if let Ok(v) = b.rpc("qos_ini_bdev_get", Value::Null, Duration::from_secs(20)) {
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
        }
    }
    let res = h.join().expect("perform_tests thread");
    hist.poll(t, "d", hosts);
    let out = b
        .finish(60)
        .unwrap_or_else(|| panic!("bdevperf did not exit; log:\n{}", b.log_tail(30)));
    let res = res.unwrap_or_else(|e| panic!("perform_tests: {e}\n{}", tail(&out, 30)));
    (hist, t0, job_results(&res, &out))
}

#[test]
fn cooperative_initiators_meet_reservations() {
    let Some(s) = setup("initiator_qos::cooperative_initiators_meet_reservations") else {
        return;
    };
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let mut t = target(&s, true);
    t.call(
        "bdev_malloc_create",
        json!({"name": "Malloc0", "num_blocks": 131072, "block_size": 512}),
    );
    // Measure first: the same load through QoS bdevs of best-effort hosts in a domain
    // far above what the machine does (the target admits everything).
    t.call(
        "qos_domain_create",
        json!({"name": "d", "capacity_iops": 10_000_000, "period_ms": PERIOD_MS,
               "check_interval_us": 1000, "estimator": false}),
    );
    for h in HOSTS {
        t.call(
            "qos_bdev_create",
            json!({"name": format!("qos_{h}"), "base_bdev_name": "Malloc0", "domain": "d",
                   "host_nqn": host(h)}),
        );
    }
    let ns: Vec<(String, String)> = HOSTS
        .iter()
        .map(|h| (h.to_string(), format!("qos_{h}")))
        .collect();
    let ns_ref: Vec<(&str, &str)> = ns.iter().map(|(a, b)| (a.as_str(), b.as_str())).collect();
    expose(&mut t, &ns_ref);
    let ctrls: Vec<Controller> = HOSTS.iter().map(|h| ctrl(h)).collect();
    let qds = [32u32, 128, 32, 32];
    let plain_jobs: Vec<Job> = ctrls
        .iter()
        .zip(qds)
        .map(|(c, q)| Job::new(&c.bdev(), "randread", 4096, q))
        .collect();
    let (base, _) = run(&mut bdevperf(
        &s,
        false,
        bdev_config(&ctrls, &[]),
        plain_jobs.clone(),
        5,
    ));
    let agg: f64 = base.values().map(|r| r.iops).sum();
    let capacity = ((agg * 0.25 / 100.0).floor() as u64 * 100).clamp(1000, 8000);
    let res = zipf(HOSTS.len(), capacity * 9 / 10);
    let limits = [res[0] * 2, res[1] * 6 / 5, res[2] * 3 / 2, res[3] * 2];
    println!(
        "machine with this load, no QoS: {agg:.0} IOPS; capacity {capacity} IOPS (min(A/4, 8000)); \
         reservations {res:?} (Zipf, 90%); limits {limits:?}; {PERIOD_MS} ms periods"
    );
    t.call(
        "qos_domain_update",
        json!({"name": "d", "capacity_iops": capacity}),
    );
    for (i, h) in HOSTS.iter().enumerate() {
        t.call(
            "qos_host_set",
            json!({"domain": "d", "host_nqn": host(h), "min_iops": res[i], "max_iops": limits[i]}),
        );
    }
    let hosts: Vec<String> = HOSTS.iter().map(|h| host(h)).collect();
    let qos: Vec<Value> = HOSTS
        .iter()
        .map(|h| json!({"name": format!("qi_{h}"), "base_bdev_name": ctrl(h).bdev()}))
        .collect();
    let qos_jobs: Vec<Job> = HOSTS
        .iter()
        .zip(qds)
        .map(|(h, q)| Job::new(&format!("qi_{h}"), "randread", 4096, q))
        .collect();
    let secs = 20u32;
    let mut summary = Vec::new();
    let mut failures = Vec::new();
    // Same load twice: plain initiators (the target holds their excess), then
    // cooperative ones (the initiator plugin holds it).
    for (label, plugin, cfg, jobs) in [
        (
            "plain initiators",
            false,
            bdev_config(&ctrls, &[]),
            plain_jobs,
        ),
        (
            "cooperative initiators",
            true,
            bdev_config(&ctrls, &qos),
            qos_jobs,
        ),
    ] {
        let mut b = bdevperf(&s, plugin, cfg, jobs, secs);
        let (hist, t0, results) = run_polling(&mut t, &mut b, &hosts, secs);
        let win = hist.window(
            t0 + Duration::from_secs(3),
            t0 + Duration::from_secs(secs as u64),
        );
        let per_period = |v: u64| v as f64 * PERIOD_MS as f64 / 1000.0;
        println!("{label}:");
        println!(
            "  host  periods  reservation/period  met>=99%  avg_ops/period  limit/period  vs_limit  target_held(avg/max)  failed"
        );
        let mut held_all = Vec::new();
        for (i, h) in HOSTS.iter().enumerate() {
            let ops = &win[i];
            let need = per_period(res[i]) * 0.99;
            let met = ops.iter().filter(|o| **o as f64 >= need).count();
            let frac = met as f64 / ops.len().max(1) as f64;
            let avg = ops.iter().sum::<u64>() as f64 / ops.len().max(1) as f64;
            let lim = per_period(limits[i]);
            let held = &hist.held[i];
            let havg = held.iter().sum::<i64>() as f64 / held.len().max(1) as f64;
            let hmax = held.iter().copied().max().unwrap_or(0);
            held_all.push(havg);
            let failed = results.values().map(|r| r.io_failed).sum::<u64>();
            println!(
                "  {h}    {:>5}    {:>10.1}          {:>6.1}%   {:>10.1}      {:>8.1}    {:>+6.2}%   {:>6.1}/{:<6}           {failed}",
                ops.len(),
                per_period(res[i]),
                frac * 100.0,
                avg,
                lim,
                (avg / lim - 1.0) * 100.0,
                havg,
                hmax
            );
            if plugin {
                if ops.len() < 20 {
                    failures.push(format!("{h}: only {} periods observed", ops.len()));
                }
                if frac < 0.95 {
                    failures.push(format!(
                        "{h}: reservation met in {:.1}% of periods (< 95%): {ops:?}",
                        frac * 100.0
                    ));
                }
                if avg > lim * 1.01 {
                    failures.push(format!("{h}: {avg:.1} ops/period over its limit {lim}"));
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

fn rw_target(s: &Setup) -> Target {
    let mut t = target(s, true);
    t.call(
        "bdev_malloc_create",
        json!({"name": "Malloc0", "num_blocks": 65536, "block_size": 4096}),
    );
    // Far above what the machine does: the target only keeps the books here.
    t.call(
        "qos_domain_create",
        json!({"name": "d", "capacity_iops": 2_000_000, "period_ms": 200, "estimator": false}),
    );
    for h in ["r", "w"] {
        t.call(
            "qos_host_set",
            json!({"domain": "d", "host_nqn": host(h), "min_iops": 1000}),
        );
        t.call(
            "qos_bdev_create",
            json!({"name": format!("qos_{h}"), "base_bdev_name": "Malloc0", "domain": "d",
                   "host_nqn": host(h)}),
        );
    }
    // A paced chunk in one capsule: with SPDK's default of 4 KiB in capsule, every chunk
    // of a write waits for an R2T and goes as a separate data PDU (docs/rpc.md).
    let in_capsule = env_number("QOS_IT_IN_CAPSULE_BYTES", "bytes, e.g. 32768")
        .or_else(|| env_number("QOS_IT_CHUNK_BYTES", "bytes, e.g. 32768"))
        .unwrap_or(32 * 1024);
    println!("target: TCP transport with in_capsule_data_size {in_capsule}");
    expose_on(
        &mut t,
        json!({"trtype": "TCP", "in_capsule_data_size": in_capsule}),
        &[("r", "qos_r"), ("w", "qos_w")],
    );
    t
}

#[test]
fn pacing_protects_a_small_reader_from_a_large_writer() {
    let Some(s) = setup("initiator_qos::pacing_protects_a_small_reader_from_a_large_writer") else {
        return;
    };
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let t = rw_target(&s);
    let ctrls = [ctrl("r"), ctrl("w")];
    let link = writer_alone(&s, &ctrls);
    let share = link as f64 / 2.0;
    println!(
        "link_mibps = {link} (the writer alone in chunks, split_always); \
         the writer's share with one latency-sensitive reader: link/2 = {share:.0} MiB/s"
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
    let (res, _) = run(&mut bdevperf(
        &s,
        false,
        plain_cfg.clone(),
        vec![Job::new(&ctrls[0].bdev(), "randread", 4096, 1)],
        4,
    ));
    let alone = &res[&ctrls[0].bdev()];
    println!(
        "reader alone (plain, no writer): {:.0} IOPS p50 {:.1} us p99 {:.1} us",
        alone.iops,
        alone.p50_us.unwrap_or(0.0),
        alone.p99_us.unwrap_or(0.0)
    );
    let mut rows = Vec::new();
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
            let mut b = bdevperf(&s, qos, cfg, jobs, secs);
            let (res, out, state) = if qos {
                run_sampling_state(&mut b, &w, secs)
            } else {
                let (res, out) = run(&mut b);
                (res, out, Value::Null)
            };
            let (rr, wr) = (&res[&r], &res[&w]);
            assert!(
                rr.io_failed == 0 && wr.io_failed == 0,
                "failed I/O:\n{}",
                tail(&out, 20)
            );
            let p99 = rr
                .p99_us
                .unwrap_or_else(|| panic!("no p99 in:\n{}", tail(&out, 30)));
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
            if qos {
                let (pacer, w) = (&state["pacer"], &state["state"]);
                let us = |k: &str| pacer[k].as_u64().map_or(0.0, |n| n as f64 / 1000.0);
                let n = |k: &str| w[k].as_u64().unwrap_or(0);
                println!(
                    "    halfway: pacer allowed {} MiB/s, latency target {:.1} us, probe base \
                     latency {:.1} us; writer so far {} chunks, {} held for tokens ({:.1} ms \
                     held, {:.1} ms paced in all)",
                    pacer["allowed_mibps"],
                    us("latency_target_ns"),
                    us("base_latency_ns"),
                    n("chunks"),
                    n("held_total"),
                    n("held_ns") as f64 / 1e6,
                    n("paced_ns") as f64 / 1e6,
                );
            }
            rows.push((round, qos, p99, wr.mibps));
        }
    }
    let pick = |q: bool, f: fn(&(usize, bool, f64, f64)) -> f64| -> Vec<f64> {
        rows.iter().filter(|r| r.1 == q).map(f).collect()
    };
    let p99_plain = median(&pick(false, |r| r.2));
    let p99_qos = median(&pick(true, |r| r.2));
    let w_plain = median(&pick(false, |r| r.3));
    let w_qos = median(&pick(true, |r| r.3));
    let per_round: Vec<String> = (0..3)
        .map(|k| {
            let p = rows.iter().find(|r| r.0 == k && !r.1).map_or(0.0, |r| r.2);
            let q = rows.iter().find(|r| r.0 == k && r.1).map_or(1.0, |r| r.2);
            format!("{:.2}", p / q)
        })
        .collect();
    let ratio = p99_plain / p99_qos;
    println!(
        "reader p99 (median of 3): {p99_plain:.1} us without, {p99_qos:.1} us with initiator QoS: \
         ratio {ratio:.2} (rounds {per_round:?})"
    );
    println!(
        "writer (median): {w_plain:.0} MiB/s without, {w_qos:.0} MiB/s with = {:.0}% of its share \
         ({share:.0} MiB/s), {:.0}% of its unpaced throughput",
        w_qos / share * 100.0,
        w_qos / w_plain * 100.0
    );
    drop(t);
    assert!(
        ratio > 1.0,
        "chunking and pacing should lower the reader's p99 (ratio {ratio:.2})"
    );
    assert!(
        w_qos >= 0.9 * share,
        "the writer should keep >= 90% of its share: {w_qos:.0} of {share:.0} MiB/s"
    );
}

/// `q` with `chunk_bytes` from `QOS_IT_CHUNK_BYTES`, `latency_target_us` from
/// `QOS_IT_LATENCY_TARGET_US` and `latency_target_auto_milli` from
/// `QOS_IT_LATENCY_AUTO_MILLI` when set (the plugin's defaults otherwise), for trying
/// other settings in the reader/writer test.
fn with_chunk(mut q: Value) -> Value {
    for (var, key) in [
        ("QOS_IT_CHUNK_BYTES", "chunk_bytes"),
        ("QOS_IT_LATENCY_TARGET_US", "latency_target_us"),
        ("QOS_IT_LATENCY_AUTO_MILLI", "latency_target_auto_milli"),
    ] {
        if let Some(v) = env_number(var, "a whole number") {
            q[key] = json!(v);
        }
    }
    q
}

/// A 1 MiB writer at QD 4 alone, side by side in each round (order rotating): plain
/// bdev_nvme, through its QoS bdev (Justitia's trigger: no small I/O, so sent whole),
/// and through its QoS bdev with `split_always` (in chunks, paced: the behaviour
/// before the trigger). Checks that the trigger sent every write whole and
/// `split_always` split them; prints the ratios to plain (median and quartiles of
/// `QOS_IT_ROUNDS` rounds, default 5) and returns the median MiB/s of `split_always`:
/// the link's capacity for chunked traffic, which is all the pacer paces (Justitia's C).
fn writer_alone(s: &Setup, ctrls: &[Controller; 2]) -> u64 {
    let rounds = env_number("QOS_IT_ROUNDS", "a number of rounds, e.g. 5")
        .unwrap_or(5)
        .max(1) as usize;
    let variants = [
        ("plain", None),
        ("QoS bdev", Some(json!({}))),
        (
            "QoS bdev, split_always",
            Some(json!({"split_always": true})),
        ),
    ];
    let mut mibps = vec![Vec::new(); variants.len()];
    for round in 0..rounds {
        let mut line = format!("writer alone, round {round}:");
        for k in 0..variants.len() {
            let v = (k + round) % variants.len();
            let (label, extra) = &variants[v];
            let (bdev, cfg) = match extra {
                None => (ctrls[1].bdev(), bdev_config(ctrls, &[])),
                Some(e) => {
                    let mut q =
                        with_chunk(json!({"name": "qw", "base_bdev_name": ctrls[1].bdev()}));
                    for (key, val) in e.as_object().into_iter().flatten() {
                        q[key] = val.clone();
                    }
                    ("qw".to_string(), bdev_config(ctrls, &[q]))
                }
            };
            let mut b = bdevperf(
                s,
                extra.is_some(),
                cfg,
                vec![Job::new(&bdev, "write", 1 << 20, 4)],
                4,
            );
            let h = b.perform_tests();
            // The QoS bdev's counters 1.5 s and 2.5 s in: the bdev layer's examine reads
            // at start-up are small I/O, so the first writes (within `latency_idle`,
            // 100 ms) are split; after that, none may be.
            let mut states = Vec::new();
            for wait_ms in [1500, 1000] {
                std::thread::sleep(Duration::from_millis(wait_ms));
                if extra.is_some() {
                    states.push(get_state(&b, "qw")["state"].clone());
                }
            }
            let perform = h.join().expect("perform_tests thread");
            let out = b
                .finish(60)
                .unwrap_or_else(|| panic!("bdevperf did not exit; log:\n{}", b.log_tail(30)));
            let perform =
                perform.unwrap_or_else(|e| panic!("perform_tests: {e}\n{}", tail(&out, 30)));
            let res = job_results(&perform, &out);
            let r = &res[&bdev];
            assert_eq!(r.io_failed, 0, "failed I/O:\n{}", tail(&out, 20));
            if let [a, b] = &states[..] {
                let count = |st: &Value, k: &str| st[k].as_u64().unwrap_or(0);
                let split = count(b, "large_ios") - count(a, "large_ios");
                let whole = count(b, "large_whole_ios") - count(a, "large_whole_ios");
                if v == 1 {
                    assert!(
                        split == 0 && whole > 0,
                        "with no small I/O the writes should go whole: {a} then {b}"
                    );
                } else {
                    assert!(
                        split > 0 && whole == 0,
                        "split_always should split every write: {a} then {b}"
                    );
                }
            }
            line += &format!(" {label} {:.0} MiB/s;", r.mibps);
            mibps[v].push(r.mibps);
        }
        println!("{line}");
    }
    for v in 1..variants.len() {
        let ratios: Vec<f64> = mibps[v]
            .iter()
            .zip(&mibps[0])
            .map(|(q, p)| q / p.max(1.0))
            .collect();
        let (q1, m, q3) = quartiles(&ratios);
        println!(
            "writer alone: {} / plain bdev_nvme MiB/s = {m:.3} (quartiles {q1:.3}-{q3:.3}, {rounds} rounds)",
            variants[v].0
        );
    }
    (median(&mibps[2]) as u64).max(50)
}

// ---- robustness ----------------------------------------------------------------------

fn get_state(b: &Bdevperf, name: &str) -> Value {
    let v = b
        .rpc(
            "qos_ini_bdev_get",
            json!({"name": name}),
            Duration::from_secs(30),
        )
        .unwrap_or_else(|e| panic!("qos_ini_bdev_get: {e}"));
    v[0].clone()
}

fn expect_err(b: &Bdevperf, method: &str, params: Value, code: i64, text: &str) {
    match b.rpc(method, params.clone(), Duration::from_secs(30)) {
        Ok(v) => panic!("{method} {params} should fail, returned {v}"),
        Err(e) => {
            assert_eq!(e.code, code, "{method} {params}: {e}");
            assert!(
                e.message.contains(text),
                "{method} {params}: message {:?} should mention {text:?}",
                e.message
            );
            println!("  refused as expected: {method} -> {}", e.message);
        }
    }
}

#[test]
fn robustness() {
    let Some(s) = setup("initiator_qos::robustness") else {
        return;
    };
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());

    // 1. A target without the plugin: fallback to pass-through with one warning; the
    // chunked data path verified (1 MiB writes and reads in 32 KiB chunks; a verify job
    // alone sends no small I/O, so `split_always` makes the pacer split it).
    {
        let mut t = target(&s, false);
        t.call(
            "bdev_malloc_create",
            json!({"name": "Malloc0", "num_blocks": 65536, "block_size": 4096}),
        );
        expose(&mut t, &[("p", "Malloc0")]);
        let c = ctrl("p");
        let mut b = bdevperf(
            &s,
            true,
            bdev_config(
                std::slice::from_ref(&c),
                &[json!({"name": "qp", "base_bdev_name": c.bdev(), "split_always": true})],
            ),
            vec![Job::new("qp", "verify", 1 << 20, 8)],
            4,
        );
        let h = b.perform_tests();
        std::thread::sleep(Duration::from_secs(2));
        let st = get_state(&b, "qp");
        let r = h.join().expect("thread").expect("perform_tests");
        let out = b.finish(60).expect("bdevperf exits");
        let res = job_results(&r, &out);
        let warnings = out
            .matches("target does not support nvmf-qos vendor commands")
            .count();
        println!(
            "plain target: mode {}, {} chunks, verify of 1 MiB I/O: {:.0} MiB/s, {} failed; warnings logged: {warnings}",
            st["state"]["mode"], st["state"]["chunks"], res["qp"].mibps, res["qp"].io_failed
        );
        assert_eq!(st["state"]["mode"], "pass_through");
        assert!(st["state"]["chunks"].as_u64().unwrap_or(0) > 0);
        assert_eq!(res["qp"].io_failed, 0, "{}", tail(&out, 20));
        assert!(res["qp"].iops > 0.0);
        assert_eq!(warnings, 1, "one warning per QoS bdev:\n{}", tail(&out, 30));
    }

    // The target with the plugin, one limited host: I/O is held at the initiator.
    let mut t = target(&s, true);
    t.call(
        "bdev_malloc_create",
        json!({"name": "Malloc0", "num_blocks": 65536, "block_size": 4096}),
    );
    t.call(
        "qos_domain_create",
        json!({"name": "d", "capacity_iops": 200000, "period_ms": 200, "estimator": false}),
    );
    t.call(
        "qos_host_set",
        json!({"domain": "d", "host_nqn": host("a"), "min_iops": 100, "max_iops": 500}),
    );
    t.call(
        "qos_bdev_create",
        json!({"name": "qos_a", "base_bdev_name": "Malloc0", "domain": "d", "host_nqn": host("a")}),
    );
    expose(&mut t, &[("a", "qos_a")]);
    let c = ctrl("a");
    let cfg = |extra: Value| {
        let mut q = json!({"name": "qa", "base_bdev_name": c.bdev()});
        for (k, v) in extra.as_object().into_iter().flatten() {
            q[k] = v.clone();
        }
        bdev_config(std::slice::from_ref(&c), &[q])
    };

    // 2. Bad input, and save_config replay (bdevperf waits for perform_tests: RPCs only).
    {
        let b = bdevperf(
            &s,
            true,
            cfg(json!({"chunk_bytes": 131072})),
            vec![Job::new("qa", "randread", 4096, 1)],
            1,
        );
        println!("bad input:");
        expect_err(
            &b,
            "qos_ini_bdev_create",
            json!({"name": "x", "base_bdev_name": "nope"}),
            -2,
            "unknown bdev",
        );
        expect_err(
            &b,
            "qos_ini_bdev_create",
            json!({"name": "qa", "base_bdev_name": c.bdev()}),
            -17,
            "already exists",
        );
        expect_err(
            &b,
            "qos_ini_bdev_create",
            json!({"name": "x", "base_bdev_name": c.bdev()}),
            -16,
            "claimed",
        );
        expect_err(
            &b,
            "qos_ini_bdev_create",
            json!({"name": "x", "base_bdev_name": "qa", "chunk_bytes": 100}),
            -22,
            "chunk",
        );
        expect_err(
            &b,
            "qos_ini_bdev_create",
            json!({"name": "x", "base_bdev_name": "qa", "chunk_bytes": 65536}),
            -22,
            "pacer group \"default\" already exists",
        );
        expect_err(
            &b,
            "qos_ini_bdev_create",
            json!({"name": "x", "base_bdev_name": "qa", "chunk": 1}),
            -22,
            "unknown field",
        );
        expect_err(
            &b,
            "qos_ini_bdev_set_options",
            json!({"name": "nope", "pacing": false}),
            -2,
            "unknown",
        );
        expect_err(
            &b,
            "qos_ini_bdev_set_options",
            json!({"name": "qa", "request_timeout_us": 0}),
            -22,
            "request_timeout_us",
        );
        expect_err(
            &b,
            "qos_ini_bdev_delete",
            json!({"name": "nope"}),
            -2,
            "unknown",
        );
        b.call(
            "qos_ini_bdev_set_options",
            json!({"name": "qa", "latency_target_us": 300, "acquire_ops": 64}),
        );
        let cfgs = b.call("framework_get_config", json!({"name": "bdev"}));
        let methods: Vec<&str> = cfgs
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|m| m["method"].as_str())
            .collect();
        let attach = methods
            .iter()
            .position(|m| *m == "bdev_nvme_attach_controller");
        let create = methods.iter().position(|m| *m == "qos_ini_bdev_create");
        assert!(
            attach.is_some() && create > attach,
            "save_config order: {methods:?}"
        );
        let saved = json!({"subsystems": [{"subsystem": "bdev", "config": cfgs}]});
        let before = get_state(&b, "qa");
        drop(b);
        let b = bdevperf(
            &s,
            true,
            saved,
            vec![Job::new("qa", "randread", 4096, 1)],
            1,
        );
        let after = get_state(&b, "qa");
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

    // 3. Vendor commands that time out (a 10 us time-out, shorter than any round trip):
    // I/O never waits for them; late replies are ignored.
    {
        let mut b = bdevperf(
            &s,
            true,
            cfg(json!({"request_timeout_us": 10})),
            vec![Job::new("qa", "randread", 4096, 16)],
            4,
        );
        let (res, out) = run_keep(&mut b, 3, "qa");
        let st = &res.1;
        println!(
            "time-outs: {:.0} IOPS, {} failed, mode {}, late replies {}, engine restarts {}",
            res.0["qa"].iops,
            res.0["qa"].io_failed,
            st["state"]["mode"],
            st["state"]["vendor_late"],
            st["state"]["engine_restarts"]
        );
        assert_eq!(res.0["qa"].io_failed, 0, "{}", tail(&out, 20));
        assert!(st["state"]["vendor_late"].as_u64().unwrap_or(0) > 0);
    }

    // 4. Reset (bdevperf's reset workload: verify plus a bdev reset at 10 s) and a
    // controller reset (bdev_nvme_reset_controller at 3 s), with I/O held (the host's
    // limit is 500 IOPS) and chunked (256 KiB I/O, 32 KiB chunks).
    {
        let mut b = s.bdevperf(
            BP_SHM,
            true,
            cfg(json!({"split_always": true})),
            vec![Job::new("qa", "reset", 256 << 10, 16)],
            12,
            &["-f"],
        );
        let h = b.perform_tests();
        std::thread::sleep(Duration::from_secs(3));
        let st = get_state(&b, "qa")["state"].clone();
        let (held, held_total) = (
            st["held"].as_i64().unwrap_or(0),
            st["held_total"].as_u64().unwrap_or(0),
        );
        let t0 = Instant::now();
        let rc = b.rpc(
            "bdev_nvme_reset_controller",
            json!({"name": c.name}),
            Duration::from_secs(30),
        );
        println!(
            "controller reset with {held} I/O held at the initiator ({held_total} held so far): {:?} in {:?}",
            rc.map(|_| "ok"),
            t0.elapsed()
        );
        let r = h.join().expect("thread");
        let out = b
            .finish(60)
            .unwrap_or_else(|| panic!("bdevperf hung after resets; log:\n{}", b.log_tail(30)));
        let r = r.unwrap_or_else(|e| panic!("perform_tests: {e}\n{}", tail(&out, 30)));
        let res = job_results(&r, &out);
        println!(
            "reset workload: {:.0} IOPS, {} failed (aborted by the resets; bdevperf's reset \
             workload on the plain bdev_nvme bdev fails as many); bdevperf exited",
            res["qa"].iops, res["qa"].io_failed
        );
        assert!(held_total > 0, "expected I/O held at the initiator");
        assert!(res["qa"].iops > 0.0);
        assert!(!out.contains("Reset blockdev"), "{}", tail(&out, 20));
    }

    // 5. Delete under load with held and chunked I/O: everything completes, quickly.
    {
        let mut b = s.bdevperf(
            BP_SHM,
            true,
            cfg(json!({"split_always": true})),
            vec![Job::new("qa", "randrw", 256 << 10, 32)],
            20,
            &["-f"],
        );
        let h = b.perform_tests();
        std::thread::sleep(Duration::from_secs(2));
        let st = get_state(&b, "qa")["state"].clone();
        let held = st["held"].as_i64().unwrap_or(0);
        let held_total = st["held_total"].as_u64().unwrap_or(0);
        let t0 = Instant::now();
        let r = b.rpc(
            "qos_ini_bdev_delete",
            json!({"name": "qa"}),
            Duration::from_secs(30),
        );
        let took = t0.elapsed();
        let perf = h.join().expect("thread");
        b.finish(60)
            .unwrap_or_else(|| panic!("bdevperf hung after delete; log:\n{}", b.log_tail(30)));
        println!(
            "delete with {held} I/O held ({held_total} held so far): {:?} in {took:?}; bdevperf ended: {}",
            r,
            perf.as_ref().map_or("with an error", |_| "normally")
        );
        assert_eq!(r.ok(), Some(json!(true)));
        assert!(held_total > 0);
        assert!(took < Duration::from_secs(10));
    }

    // 6. Disconnect: the target drops the host's listener; bdev_nvme gives the
    // controller up, the QoS bdev goes with its base, and bdevperf ends.
    {
        let mut b = s.bdevperf(
            BP_SHM,
            true,
            cfg(json!({})),
            vec![Job::new("qa", "randread", 256 << 10, 32)],
            20,
            &["-f"],
        );
        let h = b.perform_tests();
        std::thread::sleep(Duration::from_secs(2));
        let t0 = Instant::now();
        t.call("nvmf_delete_subsystem", json!({"nqn": subsys("a")}));
        let _ = h.join();
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
    drop(t);
}

/// Runs to the end, fetching the state of QoS bdev `name` `at` seconds in.
fn run_keep(
    b: &mut Bdevperf,
    at: u64,
    name: &str,
) -> ((BTreeMap<String, JobResult>, Value), String) {
    let h = b.perform_tests();
    std::thread::sleep(Duration::from_secs(at));
    let st = get_state(b, name);
    let r = h.join().expect("thread");
    let out = b.finish(60).expect("bdevperf exits");
    let r = r.unwrap_or_else(|e| panic!("perform_tests: {e}\n{}", tail(&out, 30)));
    ((job_results(&r, &out), st), out)
}

// ---- fio ---------------------------------------------------------------------------------

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// A copy of `fio-configs/<name>` in the temporary directory with the test's port.
fn config_copy(name: &str) -> PathBuf {
    let src = repo().join("fio-configs").join(name);
    let text = std::fs::read_to_string(&src).unwrap_or_else(|e| panic!("{name}: {e}"));
    let dst = std::env::temp_dir().join(format!("nvmf-qos-ini-it-{}-{name}", std::process::id()));
    std::fs::write(&dst, text.replace("\"4420\"", &format!("\"{PORT}\"")))
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
            out.push_str(&format!("spdk_json_conf={}\n", config_copy(v).display()));
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
    let Some(s) = setup("initiator_qos::fio_configs_run") else {
        return;
    };
    if s.ini.fio.is_none() {
        let _ = std::io::Write::write_all(
            &mut std::io::stderr(),
            b"SKIPPED: initiator_qos::fio_configs_run: fio or SPDK's fio plugin (build/fio/spdk_bdev) not found\n",
        );
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let t = Target::start(
        &s.ini.spdk,
        &TargetOpts {
            plugin: Some(s.tgt_lib.clone()),
            shm_id: TGT_SHM,
            core_mask: "0x1".into(),
            max_secs: 120,
            json_config: Some(config_copy("target.json")),
        },
    )
    .unwrap_or_else(|e| panic!("target from fio-configs/target.json: {e}"));
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
