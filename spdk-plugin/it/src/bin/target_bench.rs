//! Benchmark of the target plugin, as ratios measured in one run on one machine:
//!
//! 1. overhead: bare `nvmf_tgt` (malloc namespace) against `nvmf_tgt` with the plugin
//!    and a domain whose capacity is far above demand (QoS bdev over the same malloc),
//!    4 KiB random reads at queue depth 32 from one `spdk_nvme_perf`; IOPS ratio and
//!    p99 latency difference; each round runs bare, SPDK's passthru vbdev and the
//!    plugin in a rotating order, without profiling; separate profiled runs give the
//!    target CPU time per I/O spent in the plugin and in the bdev layer;
//! 2. limit accuracy: the plugin's per-host limit (`max_iops`) against SPDK's
//!    `bdev_set_qos_limit` (`rw_ios_per_sec`) at the same limit, with a load that
//!    wants more: achieved/limit, average and p99 latency; the two alternate in each
//!    round (at most 3 rounds after the overhead part), medians with their range.
//!
//! Usage: `cargo run --release -p target-it --bin target-bench -- [rounds] [secs]`
//! (SPDK at `SPDK_DIR`, the plugin built with `cargo build --release -p spdk-plugin`).
//! `TARGET_BENCH=limits` runs only part 2 (`rounds` rounds); `TARGET_BENCH_PERIOD_MS`
//! sets the plugin's QoS period in it (default 100 ms).
//! Prints a Markdown table for docs/benchmarks.md.

use serde_json::json;
use target_it::*;

#[derive(Clone, Copy, PartialEq)]
enum Config {
    Bare,
    /// SPDK's own passthru vbdev on the malloc bdev: what any stacked bdev costs.
    Passthru,
    Plugin,
    PluginLimit(u64),
    BdevQosLimit(u64),
}

/// Share of the target's samples in the plugin and in SPDK's bdev layer, from
/// `perf record` on the running `nvmf_tgt` (when the `perf` tool is installed).
#[derive(Debug, Clone, Copy)]
struct Profile {
    plugin: f64,
    bdev: f64,
    /// CPU time of the target during the recording, ns.
    cpu_ns: f64,
}

fn profile_target(t: &Target, secs: u32) -> Option<Profile> {
    let report = Recording::record(&[t.pid()?], secs, 999)?.report(None, "dso")?;
    Some(Profile {
        plugin: report.share("libnvmf_qos_tgt"),
        bdev: report.share("libspdk_bdev.so"),
        cpu_ns: report.cpu_ns(),
    })
}

/// 4 KiB random reads from host `host` to its subsystem, `spdk_nvme_perf` on core 1,
/// with its latency summary; panics if perf fails.
fn randread(s: &Setup, host: usize, qd: u32, secs: u32) -> PerfRun {
    s.perf(&PerfJob {
        latency: true,
        ..s.perf_job(host, "randread", 4096, qd, secs)
    })
}

fn wait_ok(r: PerfRun) -> PerfResult {
    let r = r.wait();
    if !r.ok {
        panic!("perf failed:\n{}", r.output);
    }
    r
}

fn run(s: &Setup, c: Config, secs: u32, qd: u32) -> PerfResult {
    run_profiled(s, c, secs, qd, false).0
}

fn run_profiled(
    s: &Setup,
    c: Config,
    secs: u32,
    qd: u32,
    profile: bool,
) -> (PerfResult, Option<Profile>) {
    let max_secs = secs as u64 + 60;
    let mut t = if matches!(c, Config::Plugin | Config::PluginLimit(_)) {
        s.target(max_secs)
    } else {
        s.bare_target(max_secs)
    };
    t.malloc("Malloc0", 131072, 512);
    let ns = if matches!(c, Config::Plugin | Config::PluginLimit(_)) {
        t.call(
            "qos_domain_create",
            // 100 ms periods: a perf run starts at an arbitrary point of a period and may
            // use that period's whole allowance, so the error of a rate measured over
            // `secs` is at most one period's allowance (1.25% of 8 s).
            json!({"name": "d", "capacity_iops": 10_000_000u64, "period_ms": period_ms(),
                   "estimator": false}),
        );
        let mut h = json!({"domain": "d", "host_nqn": host_nqn(1)});
        if let Config::PluginLimit(l) = c {
            h["max_iops"] = json!(l);
        }
        t.call("qos_host_set", h);
        t.qos_bdev_for_host(1, "Malloc0", "d")
    } else if c == Config::Passthru {
        t.call(
            "bdev_passthru_create",
            json!({"base_bdev_name": "Malloc0", "name": "pt0"}),
        );
        "pt0".to_string()
    } else {
        if let Config::BdevQosLimit(l) = c {
            t.call(
                "bdev_set_qos_limit",
                json!({"name": "Malloc0", "rw_ios_per_sec": l}),
            );
        }
        "Malloc0".to_string()
    };
    expose_per_host(&mut t, &[ns], s.port);
    let running = randread(s, 1, qd, secs);
    let prof = if profile && secs > 4 {
        std::thread::sleep(std::time::Duration::from_secs(2));
        profile_target(&t, secs - 3)
    } else {
        None
    };
    (wait_ok(running), prof)
}

/// The three configurations side by side in one `nvmf_tgt` (the plugin loaded): host 1
/// reads a malloc bdev directly, host 2 through SPDK's passthru vbdev, host 3 through a
/// QoS bdev in a domain far above demand, each malloc bdev its own. `spdk_nvme_perf`
/// runs against one subsystem at a time, `rounds` times each in a rotating order, so
/// that process start-up (memory placement) and slow drifts of the shared VM's speed
/// fall on all three alike. Returns the runs per configuration, in round order.
fn side_by_side(s: &Setup, rounds: usize, secs: u32) -> [Vec<PerfResult>; 3] {
    let mut t = s.target((rounds as u64 * 3) * (secs as u64 + 10) + 60);
    for m in ["Malloc0", "Malloc1", "Malloc2"] {
        t.malloc(m, 131072, 512);
    }
    t.call(
        "bdev_passthru_create",
        json!({"base_bdev_name": "Malloc1", "name": "pt0"}),
    );
    t.call(
        "qos_domain_create",
        json!({"name": "d", "capacity_iops": 10_000_000u64, "period_ms": 100,
               "estimator": false}),
    );
    t.call(
        "qos_host_set",
        json!({"domain": "d", "host_nqn": host_nqn(3)}),
    );
    let qos3 = t.qos_bdev_for_host(3, "Malloc2", "d");
    expose_per_host(&mut t, &["Malloc0".into(), "pt0".into(), qos3], s.port);
    let mut out: [Vec<PerfResult>; 3] = Default::default();
    for round in 0..rounds {
        for k in 0..3 {
            let i = (round + k) % 3;
            out[i].push(wait_ok(randread(s, i + 1, 32, secs)));
        }
        eprint!("\rside by side: round {}/{rounds}", round + 1);
    }
    eprintln!();
    out
}

/// The `q` quantile (nearest rank) of `v`.
fn quantile(mut v: Vec<f64>, q: f64) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    if v.is_empty() {
        return f64::NAN;
    }
    let i = ((v.len() - 1) as f64 * q).round() as usize;
    v[i.min(v.len() - 1)]
}

/// The rounds' figures, each as `show` writes it, comma-separated.
fn per_round(v: &[f64], show: impl Fn(f64) -> String) -> String {
    v.iter().map(|&r| show(r)).collect::<Vec<_>>().join(", ")
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let rounds: usize = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(5);
    let secs: u32 = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(8);
    let Some(s) = setup_or_skip("target-bench") else {
        return;
    };
    if std::env::var("TARGET_BENCH").is_ok_and(|v| v == "limits") {
        return limit_accuracy(&s, rounds, secs);
    }
    println!(
        "target-bench: {rounds} rounds of {secs} s, 4 KiB randread QD32, nvmf_tgt on core 0, \
         spdk_nvme_perf on core 1, NVMe/TCP 127.0.0.1, malloc bdev"
    );

    // 1a. Overhead, the three configurations side by side in one target.
    let sbs_rounds = (rounds * 3).max(9);
    let [sb, sp, sq] = side_by_side(&s, sbs_rounds, secs.min(3));
    let sbs_ratio: Vec<f64> = sb.iter().zip(&sq).map(|(b, q)| q.iops / b.iops).collect();
    let sbs_pt: Vec<f64> = sb.iter().zip(&sp).map(|(b, p)| p.iops / b.iops).collect();
    // Goal 4's plugin/passthru, round by round: what the QoS logic costs beyond stacking.
    let sbs_qp: Vec<f64> = sp.iter().zip(&sq).map(|(p, q)| q.iops / p.iops).collect();
    let sbs_dp99: Vec<f64> = sb
        .iter()
        .zip(&sq)
        .map(|(b, q)| q.p99_us.unwrap_or(f64::NAN) - b.p99_us.unwrap_or(f64::NAN))
        .collect();
    for (i, ((b, p), q)) in sb.iter().zip(&sp).zip(&sq).enumerate() {
        println!(
            "side by side {}: bare {:.0} IOPS p99 {:.1} us | passthru {:.0} | plugin {:.0} IOPS p99 {:.1} us | plugin/bare {:.3}",
            i + 1,
            b.iops,
            b.p99_us.unwrap_or(f64::NAN),
            p.iops,
            q.iops,
            q.p99_us.unwrap_or(f64::NAN),
            q.iops / b.iops
        );
    }

    // 1b. Overhead, separate targets: an unmodified nvmf_tgt against one with the plugin.
    let mut ratios = Vec::new();
    let mut p99_diff = Vec::new();
    let mut rows = Vec::new();
    let mut profs = Vec::new();
    let mut pt_ratios = Vec::new();
    let mut over_pt = Vec::new();
    for round in 1..=rounds {
        // `perf record` takes CPU from the target or the initiator on a two-core
        // machine, so throughput is measured without it; the order rotates each round
        // so that no configuration always runs first or last.
        let order = [Config::Bare, Config::Passthru, Config::Plugin];
        let mut measured = Vec::new();
        for k in 0..order.len() {
            let c = order[(round + k) % order.len()];
            measured.push((c, run(&s, c, secs, 32)));
        }
        let pick = |c: Config| {
            measured
                .iter()
                .find(|(m, _)| *m == c)
                .map(|(_, r)| r.clone())
                .expect("every configuration runs each round")
        };
        let (b, pt, p) = (
            pick(Config::Bare),
            pick(Config::Passthru),
            pick(Config::Plugin),
        );
        let ratio = p.iops / b.iops;
        pt_ratios.push(pt.iops / b.iops);
        over_pt.push(p.iops / pt.iops);
        println!(
            "round {round}: passthru vbdev {:.0} IOPS p99 {:.1} us (passthru/bare {:.3}, plugin/passthru {:.3})",
            pt.iops,
            pt.p99_us.unwrap_or(f64::NAN),
            pt.iops / b.iops,
            p.iops / pt.iops
        );
        let d = p.p99_us.unwrap_or(f64::NAN) - b.p99_us.unwrap_or(f64::NAN);
        println!(
            "round {round}: bare {:.0} IOPS p99 {:.1} us | plugin {:.0} IOPS p99 {:.1} us | ratio {ratio:.3}, p99 {d:+.1} us",
            b.iops,
            b.p99_us.unwrap_or(f64::NAN),
            p.iops,
            p.p99_us.unwrap_or(f64::NAN)
        );
        ratios.push(ratio);
        p99_diff.push(d);
        rows.push((b, p));
    }
    let ratio = median(&ratios);
    let dp99 = median(&p99_diff);

    // CPU per I/O from separate profiled runs (bare, then the plugin).
    for round in 1..=rounds.min(3) {
        let (b, pb) = run_profiled(&s, Config::Bare, secs, 32, true);
        let (p, pp) = run_profiled(&s, Config::Plugin, secs, 32, true);
        if let (Some(pb), Some(pp)) = (pb, pp) {
            // CPU time per I/O in a DSO: its share of the samples times the target's CPU
            // time during the recording, over the I/O completed meanwhile.
            let psecs = (secs - 3) as f64;
            let ns =
                |share: f64, pr: &Profile, iops: f64| share / 100.0 * pr.cpu_ns / (iops * psecs);
            let (bdev_b, bdev_p, plug) = (
                ns(pb.bdev, &pb, b.iops),
                ns(pp.bdev, &pp, p.iops),
                ns(pp.plugin, &pp, p.iops),
            );
            println!(
                "profile {round}: target CPU per I/O: bdev layer {bdev_b:.0} ns (bare) vs {bdev_p:.0} ns (plugin, two layers); plugin code {plug:.0} ns"
            );
            profs.push((plug, bdev_p - bdev_b, 1e9 / b.iops));
        }
    }

    println!("\n| measurement | value |\n|---|---|");
    println!(
        "| side by side in one target: plugin/bare IOPS ratio (median of {}; target >= 0.98) | {:.3} (quartiles {:.3}-{:.3}) |",
        sbs_ratio.len(),
        median(&sbs_ratio),
        quantile(sbs_ratio.clone(), 0.25),
        quantile(sbs_ratio.clone(), 0.75)
    );
    println!(
        "| side by side: passthru/bare IOPS ratio (median) | {:.3} |",
        median(&sbs_pt)
    );
    println!(
        "| side by side: plugin/passthru IOPS ratio (median of {}; target >= 0.995) | {:.3} (quartiles {:.3}-{:.3}) |",
        sbs_qp.len(),
        median(&sbs_qp),
        quantile(sbs_qp.clone(), 0.25),
        quantile(sbs_qp, 0.75)
    );
    println!(
        "| side by side: p99 latency, plugin minus bare (median) | {:+.1} us |",
        median(&sbs_dp99)
    );
    println!(
        "| side by side: bare / plugin IOPS (medians) | {:.0} / {:.0} |",
        median(&sb.iter().map(|r| r.iops).collect::<Vec<_>>()),
        median(&sq.iter().map(|r| r.iops).collect::<Vec<_>>())
    );
    println!(
        "| separate targets: plugin/bare IOPS ratio (median of {rounds}) | {ratio:.3} (rounds: {}) |",
        per_round(&ratios, |r| format!("{r:.3}"))
    );
    println!(
        "| separate targets: SPDK passthru vbdev/bare IOPS ratio (median) | {:.3} |",
        median(&pt_ratios)
    );
    println!(
        "| separate targets: plugin/passthru IOPS ratio (median) | {:.3} |",
        median(&over_pt)
    );
    println!(
        "| separate targets: p99 latency, plugin minus bare (median) | {dp99:+.1} us (rounds: {}) |",
        per_round(&p99_diff, |r| format!("{r:+.1}"))
    );
    let mid = ratios
        .iter()
        .position(|r| *r == ratio)
        .unwrap_or(rows.len() / 2);
    let (b, p) = &rows[mid];
    println!(
        "| separate targets: bare / plugin, median round | {:.0} / {:.0} IOPS, p99 {:.1} / {:.1} us |",
        b.iops,
        p.iops,
        b.p99_us.unwrap_or(f64::NAN),
        p.p99_us.unwrap_or(f64::NAN)
    );
    if !profs.is_empty() {
        let plug = median(&profs.iter().map(|p| p.0).collect::<Vec<_>>());
        let layer = median(&profs.iter().map(|p| p.1).collect::<Vec<_>>());
        let bare = median(&profs.iter().map(|p| p.2).collect::<Vec<_>>());
        println!(
            "| target CPU per I/O added (perf record, median of {}): plugin code + second bdev layer | {plug:.0} ns + {layer:.0} ns (bare: {bare:.0} ns of wall time per I/O) |",
            profs.len()
        );
    }
    limit_accuracy(&s, rounds.min(3), secs);
}

/// The plugin's QoS period in the limit runs: 100 ms, or `TARGET_BENCH_PERIOD_MS`.
fn period_ms() -> u64 {
    std::env::var("TARGET_BENCH_PERIOD_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&ms: &u64| (1..=60_000).contains(&ms))
        .unwrap_or(100)
}

/// Part 2, limit accuracy: the plugin's `max_iops` against `bdev_set_qos_limit`,
/// alternating in each of `rounds` rounds; medians with the rounds' range.
fn limit_accuracy(s: &Setup, rounds: usize, secs: u32) {
    println!(
        "\n| measurement (plugin period {} ms) | value |\n|---|---|",
        period_ms()
    );
    for limit in [5_000u64, 20_000] {
        let (mut q, mut b) = (Vec::new(), Vec::new());
        for round in 0..rounds.max(1) {
            // Alternate which runs first, so neither always gets the quieter slot.
            let (first, second) = if round % 2 == 0 {
                (Config::PluginLimit(limit), Config::BdevQosLimit(limit))
            } else {
                (Config::BdevQosLimit(limit), Config::PluginLimit(limit))
            };
            let r1 = run(s, first, secs, 32);
            let r2 = run(s, second, secs, 32);
            let (rq, rb) = if round % 2 == 0 { (r1, r2) } else { (r2, r1) };
            eprintln!(
                "limit {limit}, round {}: plugin {:.0} IOPS p99 {:.0} us | bdev_set_qos_limit {:.0} IOPS p99 {:.0} us",
                round + 1,
                rq.iops,
                rq.p99_us.unwrap_or(f64::NAN),
                rb.iops,
                rb.p99_us.unwrap_or(f64::NAN)
            );
            q.push(rq);
            b.push(rb);
        }
        let col = |v: &[PerfResult], f: &dyn Fn(&PerfResult) -> f64, digits: usize| -> String {
            let xs: Vec<f64> = v.iter().map(f).collect();
            let lo = xs.iter().copied().fold(f64::INFINITY, f64::min);
            let hi = xs.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            format!("{:.digits$} ({lo:.digits$}-{hi:.digits$})", median(&xs))
        };
        let lim = limit as f64;
        println!(
            "| limit {limit} IOPS: achieved/limit, plugin vs bdev_set_qos_limit (median, range of {}) | {} vs {} |",
            q.len(),
            col(&q, &|r| r.iops / lim, 4),
            col(&b, &|r| r.iops / lim, 4)
        );
        let p99 = |r: &PerfResult| r.p99_us.unwrap_or(f64::NAN);
        println!(
            "| limit {limit} IOPS: p99 latency us, plugin vs bdev_set_qos_limit (median, range) | {} vs {} |",
            col(&q, &p99, 0),
            col(&b, &p99, 0)
        );
        let ratio: Vec<f64> = q.iter().zip(&b).map(|(x, y)| p99(x) / p99(y)).collect();
        println!(
            "| limit {limit} IOPS: p99 plugin / bdev_set_qos_limit, per round (median) | {:.3} ({}) |",
            median(&ratio),
            per_round(&ratio, |r| format!("{r:.3}"))
        );
        println!(
            "| limit {limit} IOPS: avg latency us, plugin vs bdev_set_qos_limit (median) | {:.0} vs {:.0} |",
            median(&q.iter().map(|r| r.avg_us).collect::<Vec<_>>()),
            median(&b.iter().map(|r| r.avg_us).collect::<Vec<_>>())
        );
    }
}
