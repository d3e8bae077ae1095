//! Benchmark of the initiator plugin's per-I/O cost (issue 10, goal 2), as ratios
//! measured side by side in one run: one host reads 4 KiB at random from `nvmf_tgt`
//! (target plugin loaded, a domain far above demand, so the target never holds a
//! command) through bdevperf on core 1, in four configurations that differ only in the
//! initiator's bdev stack:
//!
//! - `plain`: the bdev_nvme bdev itself;
//! - `layer`: an initiator QoS bdev with the token protocol and pacing off (the cost of
//!   a second bdev layer);
//! - `protocol`: the token protocol on (cooperative: the engine admits every I/O from
//!   its reservation and global tokens, acquired in batches), pacing off;
//! - `default`: the QoS bdev as created without options (protocol and pacing on).
//!
//! Each round runs the four in a rotating order, one bdevperf process each, so slow
//! drifts of the shared machine fall on all alike; the ratios to `plain` are per round,
//! reported as median and quartiles. The QoS bdev's counters give the vendor commands
//! per thousand I/O (they cost the initiator a round trip each).
//!
//! The configurations without the token protocol (`plain`, `layer`) connect as host 2,
//! those with it as host 1: the target treats a host as cooperative from its first
//! token command on, so a plain run as host 1 after a protocol run would be answered
//! like a cooperative one. Both hosts have the same contract. Over the middle of each
//! run the bench also reads the target's side: commands per second of the host's QoS
//! bdev (`bdev_get_iostat`) and, with `perf` installed, `nvmf_tgt`'s `sendmsg` calls
//! per command (a tracepoint: one per flush of a connection's queued PDUs; a response
//! that needs its own capsule PDU shows here). `INITIATOR_BENCH_VARIANTS=protocol`
//! (a comma-separated list) runs only those configurations beside `plain`;
//! `INITIATOR_BENCH_QOS_EXTRA` (a JSON object) adds parameters to the QoS bdevs;
//! `INITIATOR_BENCH_DUMP=1` prints the QoS bdev's state at the end of each span. With `perf` installed,
//! `INITIATOR_BENCH_PROFILE=1` records bdevperf in one extra run per configuration and
//! prints where its CPU time goes (top symbols).
//!
//! Usage: `cargo run --release -p initiator-it --bin initiator-bench -- [rounds] [secs]
//! [qd]` (defaults 9, 3, 32; issue 40's lone cooperative reader:
//! `INITIATOR_BENCH_VARIANTS=protocol ... -- 5 6 128`; SPDK at `SPDK_DIR`, both plugins built with `cargo build
//! --release -p spdk-plugin -p initiator-plugin`). Prints a Markdown table for
//! docs/benchmarks.md.

use std::time::Duration;

use initiator_it::*;
use serde_json::{Value, json};

const QOS_BDEV: &str = "qb";
/// The target's syscall tracepoint counted per command.
const SENDMSG: &str = "syscalls:sys_enter_sendmsg";

/// The configurations, in the order of the table; `None`: the plain bdev_nvme bdev.
const VARIANTS: [(&str, Option<(bool, bool)>); 4] = [
    ("plain", None),
    ("layer", Some((false, false))),
    ("protocol", Some((true, false))),
    ("default", Some((true, true))),
];

/// Hosts 1 and 2 (the same contract, their QoS bdevs `qos1` and `qos2` over one malloc
/// bdev) at a target whose domain is far above what the machine does (the target keeps
/// the books and never holds).
fn target(s: &Setup, max_secs: u64) -> Target {
    let mut t = s.target(max_secs);
    t.malloc("Malloc0", 65536, 4096);
    t.call(
        "qos_domain_create",
        json!({"name": "d", "capacity_iops": 5_000_000, "period_ms": 100, "estimator": false}),
    );
    let mut bdevs = Vec::new();
    for i in [1, 2] {
        t.call(
            "qos_host_set",
            json!({"domain": "d", "host_nqn": host_nqn(i), "min_iops": 10_000}),
        );
        bdevs.push(t.qos_bdev_for_host(i, "Malloc0", "d"));
    }
    expose_per_host(&mut t, &bdevs, s.port);
    t
}

/// `q` with the parameters of `INITIATOR_BENCH_QOS_EXTRA` (a JSON object, e.g.
/// `{"acquire_ops": 4096}`) set, for trying other options of the QoS bdevs.
fn qos_extra(mut q: Value) -> Value {
    if let Ok(text) = std::env::var("INITIATOR_BENCH_QOS_EXTRA") {
        let extra: Value = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("INITIATOR_BENCH_QOS_EXTRA is not JSON: {e}"));
        for (k, v) in extra.as_object().into_iter().flatten() {
            q[k] = v.clone();
        }
    }
    q
}

/// The host a configuration connects as: 1 with the token protocol, 2 without.
fn host_of(variant: usize) -> usize {
    match VARIANTS[variant].1 {
        Some((true, _)) => 1,
        _ => 2,
    }
}

/// What one run measured.
struct Run {
    iops: f64,
    p99_us: f64,
    /// Vendor commands and I/O counted by the QoS bdev between two reads of its state.
    vendor_per_kio: Option<f64>,
    /// Completion credits the QoS bdev received per 1,000 I/O, same span.
    credits_per_kio: Option<f64>,
    /// I/O that waited for tokens per 1,000 I/O, and their mean wait (us), same span.
    held_per_kio: Option<(f64, f64)>,
    mode: Option<String>,
    /// The target's side over the same span: the host's commands per second, and
    /// nvmf_tgt's sendmsg calls per command (`None`: perf could not count).
    target_iops: Option<f64>,
    sendmsg_per_cmd: Option<f64>,
}

/// The target's clock and host `i`'s QoS bdev's commands.
fn target_ops(t: &mut Target, i: usize) -> (u64, u64, u64) {
    let (ticks, rate, ops) =
        iostat_ops(&t.call("bdev_get_iostat", json!({})), &[format!("qos{i}")]);
    (ticks, rate, ops[0])
}

fn state(b: &Bdevperf) -> Option<Value> {
    b.try_ini_bdev(QOS_BDEV).ok().map(|v| v["state"].clone())
}

fn one_run(
    s: &Setup,
    t: &mut Target,
    variant: usize,
    secs: u32,
    qd: u32,
    profile: Option<u32>,
) -> (Run, Option<(Vec<Profile>, u32)>) {
    let host = host_of(variant);
    let ctrl = s.controller(host);
    let (bdev, cfg) = match VARIANTS[variant].1 {
        None => (ctrl.bdev(), bdev_config(std::slice::from_ref(&ctrl), &[])),
        Some((protocol, pacing)) => (
            QOS_BDEV.to_string(),
            bdev_config(
                std::slice::from_ref(&ctrl),
                &[qos_extra(
                    json!({"name": QOS_BDEV, "base_bdev_name": ctrl.bdev(),
                                   "token_protocol": protocol, "pacing": pacing}),
                )],
            ),
        ),
    };
    let qos = VARIANTS[variant].1.is_some();
    // The plugin is preloaded in every configuration, so that the processes differ only
    // in their bdev stack.
    let mut b = s.bdevperf(
        true,
        cfg,
        vec![Job::new(&bdev, "randread", 4096, qd)],
        secs,
        &[],
    );
    let run = b.start_tests();
    // The engine's counters over the middle of the run (past its first state request).
    let mut states = Vec::new();
    let mut prof = None;
    let mut target_side = (None, None);
    {
        std::thread::sleep(Duration::from_millis(1000));
        if qos {
            states.push(state(&b));
        }
        let span = secs.saturating_sub(2).max(1);
        if profile.is_none() {
            let pid = t.pid().expect("nvmf_tgt's pid");
            let a = target_ops(t, host);
            let sendmsg = match count_events(pid, &[SENDMSG], span as f64) {
                Ok(c) => c[0],
                Err(e) => {
                    eprintln!("sendmsg not counted: {e}");
                    None
                }
            };
            let z = target_ops(t, host);
            let cmds = z.2.saturating_sub(a.2) as f64;
            let secs = z.0.saturating_sub(a.0) as f64 / a.1.max(1) as f64;
            target_side = (
                (secs > 0.0).then(|| cmds / secs),
                sendmsg.filter(|_| cmds > 0.0).map(|n| n as f64 / cmds),
            );
        } else if let Some(tgt) = profile {
            let procs = b
                .pid()
                .map(|ini| [(tgt, "libnvmf_qos_tgt"), (ini, "libnvmf_qos_ini")]);
            prof = procs
                .and_then(|p| profile_pids(&p, span))
                .map(|p| (p, span));
        }
        if qos {
            states.push(state(&b));
        }
    }
    let out = b.finish_tests(run);
    let r = out.job(&bdev);
    assert_eq!(
        r.io_failed,
        0,
        "failed I/O in {}:\n{}",
        VARIANTS[variant].0,
        out.tail(30)
    );
    let (vendor_per_kio, credits_per_kio, held_per_kio, mode) = match &states[..] {
        [Some(a), Some(b)] => {
            if std::env::var("INITIATOR_BENCH_DUMP").is_ok() {
                println!("state: {b}");
            }
            let n = |st: &Value, k: &str| st[k].as_u64().unwrap_or(0) as f64;
            let ios = n(b, "ios") - n(a, "ios");
            let vendor = n(b, "vendor_sent") - n(a, "vendor_sent");
            let held = n(b, "held_total") - n(a, "held_total");
            let held_us = (n(b, "held_ns") - n(a, "held_ns")) / 1000.0;
            let credits = n(b, "credits_seen") - n(a, "credits_seen");
            (
                (ios > 0.0).then(|| vendor / ios * 1000.0),
                (ios > 0.0).then(|| credits / ios * 1000.0),
                (ios > 0.0).then(|| (held / ios * 1000.0, held_us / held.max(1.0))),
                b["mode"].as_str().map(str::to_string),
            )
        }
        _ => (None, None, None, None),
    };
    (
        Run {
            iops: r.iops,
            p99_us: r.p99_us.unwrap_or(f64::NAN),
            vendor_per_kio,
            credits_per_kio,
            held_per_kio,
            mode,
            target_iops: target_side.0,
            sendmsg_per_cmd: target_side.1,
        },
        prof,
    )
}

/// What `perf record` showed of one process.
struct Profile {
    /// The plugin's share of the process's samples, %.
    plugin_pct: f64,
    /// The process's CPU time sampled, ns (the cpu-clock event counts nanoseconds).
    cpu_ns: f64,
    /// The plugin's top symbols, as perf prints them.
    text: String,
}

/// `perf record` of `nvmf_tgt` and bdevperf together for `secs`; per process, the
/// share of `dso` (its plugin).
fn profile_pids(procs: &[(u32, &str)], secs: u32) -> Option<Vec<Profile>> {
    let pids: Vec<u32> = procs.iter().map(|p| p.0).collect();
    let rec = Recording::record(&pids, secs, 1999)?;
    procs
        .iter()
        .map(|&(pid, dso)| {
            let r = rec.report(Some(pid), "dso,sym")?;
            Some(Profile {
                plugin_pct: r.share(dso),
                cpu_ns: r.cpu_ns(),
                text: r.rows_with(dso).take(10).collect::<Vec<_>>().join("\n"),
            })
        })
        .collect()
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let rounds: usize = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(9).max(1);
    let secs: u32 = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(3).max(2);
    let qd: u32 = args
        .get(3)
        .and_then(|a| a.parse().ok())
        .unwrap_or(32)
        .max(1);
    let profile = std::env::var("INITIATOR_BENCH_PROFILE").is_ok_and(|v| v == "1");
    let Some(s) = setup_or_skip("initiator-bench") else {
        return;
    };
    println!(
        "initiator-bench: {rounds} rounds of {secs} s, 4 KiB randread QD {qd}, nvmf_tgt (target \
         plugin, domain far above demand) on core 0, bdevperf on core 1, NVMe/TCP 127.0.0.1"
    );
    // `plain` always; the others as `INITIATOR_BENCH_VARIANTS` says (all by default).
    let chosen: Vec<usize> = match std::env::var("INITIATOR_BENCH_VARIANTS") {
        Ok(list) => {
            let names: Vec<&str> = list.split(',').map(str::trim).collect();
            for n in &names {
                assert!(
                    VARIANTS.iter().any(|v| v.0 == *n),
                    "INITIATOR_BENCH_VARIANTS: unknown configuration {n}"
                );
            }
            (0..VARIANTS.len())
                .filter(|&v| v == 0 || names.contains(&VARIANTS[v].0))
                .collect()
        }
        Err(_) => (0..VARIANTS.len()).collect(),
    };
    let runs_total = rounds * chosen.len() + if profile { chosen.len() } else { 0 };
    let mut t = target(&s, runs_total as u64 * (secs as u64 + 15) + 120);
    let mut runs: Vec<Vec<Run>> = VARIANTS.iter().map(|_| Vec::new()).collect();
    for round in 0..rounds {
        let mut line = format!("round {}:", round + 1);
        for k in 0..chosen.len() {
            let v = chosen[(round + k) % chosen.len()];
            let (r, _) = one_run(&s, &mut t, v, secs, qd, None);
            line += &format!(
                " {} {:.0} (target {:.0}, sendmsg/cmd {});",
                VARIANTS[v].0,
                r.iops,
                r.target_iops.unwrap_or(f64::NAN),
                r.sendmsg_per_cmd
                    .map_or("-".to_string(), |x| format!("{x:.4}"))
            );
            runs[v].push(r);
        }
        println!("{line} IOPS");
    }
    println!(
        "\n| configuration (QD {qd}) | IOPS (median) | / plain per round: median (quartiles) | target's commands/s, / plain per round: median (quartiles) | target's sendmsg per command (median), / plain per round (median) | p99 us (median) | vendor commands per 1,000 I/O | completion credits per 1,000 I/O | held for tokens per 1,000 I/O (mean wait) | engine mode |\n|---|---|---|---|---|---|---|---|---|---|"
    );
    for &v in &chosen {
        let name = VARIANTS[v].0;
        let per_round = |f: fn(&Run) -> Option<f64>| -> Vec<f64> {
            runs[v]
                .iter()
                .zip(&runs[0])
                .filter_map(|(r, p)| Some(f(r)? / f(p)?.max(1e-9)))
                .collect()
        };
        let tgt_ratio = per_round(|r| r.target_iops);
        let tgt = if tgt_ratio.is_empty() {
            "-".to_string()
        } else {
            let (q1, m, q3) = quartiles(&tgt_ratio);
            format!("{m:.3} ({q1:.3}-{q3:.3})")
        };
        let spc: Vec<f64> = runs[v].iter().filter_map(|r| r.sendmsg_per_cmd).collect();
        let spc_ratio = per_round(|r| r.sendmsg_per_cmd);
        let spc = if spc.is_empty() {
            "-".to_string()
        } else {
            format!("{:.4}, {:.3}", median(&spc), median(&spc_ratio))
        };
        let iops: Vec<f64> = runs[v].iter().map(|r| r.iops).collect();
        let ratios: Vec<f64> = runs[v]
            .iter()
            .zip(&runs[0])
            .map(|(r, p)| r.iops / p.iops.max(1.0))
            .collect();
        let (q1, m, q3) = quartiles(&ratios);
        let p99 = median(&runs[v].iter().map(|r| r.p99_us).collect::<Vec<_>>());
        let per_kio = |f: fn(&Run) -> Option<f64>| {
            let x: Vec<f64> = runs[v].iter().filter_map(f).collect();
            if x.is_empty() {
                "-".to_string()
            } else {
                format!("{:.2}", median(&x))
            }
        };
        let vendor = per_kio(|r| r.vendor_per_kio);
        let credits = per_kio(|r| r.credits_per_kio);
        let held: Vec<(f64, f64)> = runs[v].iter().filter_map(|r| r.held_per_kio).collect();
        let held = if held.is_empty() {
            "-".to_string()
        } else {
            format!(
                "{:.1} ({:.0} us)",
                median(&held.iter().map(|h| h.0).collect::<Vec<_>>()),
                median(&held.iter().map(|h| h.1).collect::<Vec<_>>())
            )
        };
        let mut modes: Vec<&str> = runs[v].iter().filter_map(|r| r.mode.as_deref()).collect();
        modes.sort_unstable();
        modes.dedup();
        println!(
            "| {name} | {:.0} | {m:.3} ({q1:.3}-{q3:.3}) | {tgt} | {spc} | {p99:.0} | {vendor} | {credits} | {held} | {} |",
            median(&iops),
            if modes.is_empty() {
                "-".to_string()
            } else {
                modes.join(", ")
            }
        );
    }
    if profile {
        // Each plugin's CPU time per I/O: its share of its process's samples times the
        // process's CPU time in the recording, over the I/O of the recording (the run's
        // rate times its length). The target's core is the bottleneck on this machine;
        // on the initiator, as a share of IOPS on a core doing 300 K IOPS (3.33 us per
        // I/O). The initiator's share includes its poller's calls while bdevperf spins
        // idle, so it is an upper bound.
        let tgt = t.pid().expect("nvmf_tgt's pid");
        for &v in &chosen {
            let name = VARIANTS[v].0;
            let (r, prof) = one_run(&s, &mut t, v, secs.max(6), qd, Some(tgt));
            let Some((p, span)) = prof else {
                println!("\nprofile, {name}: perf record failed (is perf installed?)");
                continue;
            };
            let ns = |p: &Profile| p.plugin_pct / 100.0 * p.cpu_ns / (r.iops * span as f64);
            let (nt, ni) = (ns(&p[0]), ns(&p[1]));
            println!(
                "\nprofile, {name}: {:.0} IOPS; target plugin {:.1} % of nvmf_tgt's samples, {nt:.0} ns per I/O; \
                 initiator plugin {:.1} % of bdevperf's, {ni:.0} ns per I/O ({:.1} % of IOPS at 300 K IOPS on one core)\n\
                 target plugin's top symbols:\n{}\ninitiator plugin's top symbols:\n{}",
                r.iops,
                p[0].plugin_pct,
                p[1].plugin_pct,
                ni * 300_000.0 / 1e9 * 100.0,
                p[0].text,
                p[1].text
            );
        }
    }
}
