//! The report of a generated fleet (`[fleet]`): figures over hosts rather than a row
//! per host. Per event the periods until each reserved host holds its reservation
//! again (p50, p99, max over hosts); the periods met once settled; hosts above their
//! limit; what the agents write to etcd per second and the records' sizes. The
//! division's measured time is a separate line ([`division_time_line`]): it is not
//! deterministic. [`etcd_latency_line`] says what etcd's answer times make of the
//! agents' intervals (both reports).

use std::fmt::Write as _;

use super::etcd::{AGENT_WRITES, MEMBER_READS};
use super::{ClusterRun, ClusterScenario, admission_line, recovery};

/// etcd refuses a request above this by default (`--max-request-bytes`).
const ETCD_MAX_REQUEST: u64 = 1536 * 1024;

/// `p50 a, p99 b, max c (never: n)` over the hosts' recovery figures.
fn percentiles(rec: &[Option<u32>]) -> String {
    let never = rec.iter().filter(|r| r.is_none()).count();
    let mut v: Vec<u32> = rec.iter().flatten().copied().collect();
    if v.is_empty() {
        return format!("no host settled (never: {never})");
    }
    v.sort_unstable();
    let at = |q: usize| v[(v.len() - 1) * q / 100];
    format!(
        "p50 {}, p99 {}, max {} (never: {never})",
        at(50),
        at(99),
        v[v.len() - 1]
    )
}

/// The report of a fleet scenario.
pub fn fleet_report(s: &ClusterScenario, run: &ClusterRun) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "{}", s.cluster.description);
    admission_line(&mut out, s);
    fleet_line(&mut out, s);
    let _ = writeln!(
        out,
        "\nperiods until each reserved host gets its reservation again (over hosts):"
    );
    event_lines(&mut out, s, run);
    let settle = 3;
    met_line(&mut out, s, run, settle);
    limit_lines(&mut out, s, run);
    etcd_lines(&mut out, s, run);
    out.push_str(&etcd_latency_line(s, run));
    out
}

fn fleet_line(out: &mut String, s: &ClusterScenario) {
    let c = &s.cluster;
    let reserved = s.hosts.iter().filter(|h| h.reservation_iops > 0).count();
    let paths = s.fleet.as_ref().map_or(0, |f| f.paths);
    let outages: Vec<String> = c
        .etcd_outages
        .iter()
        .map(|o| format!("[{}, {})", o.from, o.to))
        .collect();
    let _ = writeln!(
        out,
        "fleet: {} targets, {} hosts ({reserved} reserved), each reaching {}; {} periods of {} ms; demand window {} periods, division applied {} periods after it is made; lease {} periods; etcd away in periods {}",
        s.targets.len(),
        s.hosts.len(),
        if paths == 0 {
            "all targets".to_string()
        } else {
            format!("{paths} targets")
        },
        c.periods,
        c.interval_ms,
        c.demand_window_periods,
        c.apply_delay_periods,
        c.lease_periods,
        if outages.is_empty() {
            "none".into()
        } else if c.handover {
            format!("{} (the targets trade meanwhile)", outages.join(", "))
        } else {
            outages.join(", ")
        }
    );
}

/// One line per move period, failure and etcd outage.
fn event_lines(out: &mut String, s: &ClusterScenario, run: &ClusterRun) {
    let mut move_periods: Vec<u32> = s
        .hosts
        .iter()
        .flat_map(|h| h.demand.iter().skip(1).map(|d| d.from))
        .collect();
    move_periods.sort_unstable();
    move_periods.dedup();
    let reserved = |k: &usize| s.hosts[*k].reservation_iops > 0;
    for p in move_periods {
        let movers: Vec<usize> = (0..s.hosts.len())
            .filter(|&k| s.hosts[k].demand.iter().skip(1).any(|d| d.from == p))
            .collect();
        let rec: Vec<Option<u32>> = movers
            .iter()
            .filter(|k| reserved(k))
            .map(|&k| recovery(s, run, k, p))
            .collect();
        let away = if s.cluster.etcd_up(p) {
            ""
        } else {
            " (etcd away)"
        };
        let _ = writeln!(
            out,
            "  period {p}: {} hosts' demand moves{away}; its {} reserved hosts: {}",
            movers.len(),
            rec.len(),
            percentiles(&rec)
        );
    }
    for (i, t) in s.targets.iter().enumerate() {
        let Some(f) = t.fail_at else { continue };
        let rec: Vec<Option<u32>> = (0..s.hosts.len())
            .filter(|k| reserved(k))
            .filter(|&k| s.hosts[k].paths.as_ref().is_none_or(|ps| ps.contains(&i)))
            .map(|k| recovery(s, run, k, f))
            .collect();
        let _ = writeln!(
            out,
            "  period {f}: target {} fails (its lease expires {} periods later); the {} reserved hosts that reach it: {}",
            t.name,
            s.cluster.lease_periods,
            rec.len(),
            percentiles(&rec)
        );
    }
    for o in &s.cluster.etcd_outages {
        let rec: Vec<Option<u32>> = (0..s.hosts.len())
            .filter(|k| reserved(k))
            .filter(|&k| {
                let h = &s.hosts[k];
                h.demand.iter().any(|d| d.from >= o.from && d.from < o.to)
            })
            .map(|k| recovery(s, run, k, o.to))
            .collect();
        let _ = writeln!(
            out,
            "  periods {}..{}: etcd away; from its return, the {} reserved hosts that moved meanwhile: {}",
            o.from,
            o.to,
            rec.len(),
            percentiles(&rec)
        );
    }
}

/// Host-periods in which a reserved host wanted at least its reservation and got
/// >= 99 % of it, from `settle` periods after each event on.
fn met_line(out: &mut String, s: &ClusterScenario, run: &ClusterRun, settle: u32) {
    let n = s.cluster.periods as usize;
    let mut unsettled = vec![false; n];
    let mut mark = |from: u32, len: u32| {
        for p in from..from.saturating_add(len).min(n as u32) {
            unsettled[p as usize] = true;
        }
    };
    for h in &s.hosts {
        for d in &h.demand {
            mark(d.from, settle);
        }
    }
    for t in &s.targets {
        if let Some(f) = t.fail_at {
            mark(f, s.cluster.lease_periods + settle);
        }
    }
    let (mut met, mut of) = (0u64, 0u64);
    for (p, row) in run.periods.iter().enumerate() {
        if unsettled[p] {
            continue;
        }
        for (h, hp) in s.hosts.iter().zip(row) {
            let r = h.reservation_iops;
            if r > 0 && hp.wanted >= r {
                of += 1;
                met += (hp.served * 100 >= r * 99) as u64;
            }
        }
    }
    let _ = writeln!(
        out,
        "\nreservations met in {met} of {of} settled host-periods ({:.2} %; from {settle} periods after each demand step and {} after each failure on)",
        met as f64 * 100.0 / of.max(1) as f64,
        s.cluster.lease_periods + settle
    );
}

fn limit_lines(out: &mut String, s: &ClusterScenario, run: &ClusterRun) {
    let mut above = 0;
    let mut worst = 0.0f64;
    for (k, h) in s.hosts.iter().enumerate() {
        let Some(l) = h.limit_iops else { continue };
        let most = run.periods.iter().map(|r| r[k].served).max().unwrap_or(0);
        above += (most > l) as usize;
        worst = worst.max(most as f64 / l as f64 - 1.0);
    }
    let _ = writeln!(
        out,
        "limits: {above} hosts got more than their limit in some period (most above: {:+.2} %); divisions with a host's limit shares above its limit + 1 per target: {}",
        worst * 100.0,
        run.limit_share_excess
    );
}

fn etcd_lines(out: &mut String, s: &ClusterScenario, run: &ClusterRun) {
    let e = &run.etcd;
    let secs = (e.intervals * s.cluster.interval_ms) as f64 / 1000.0;
    let per_s = |x: u64| x as f64 / secs.max(1e-9);
    let writes: u64 = e.writes.iter().sum();
    let bytes: u64 = e.bytes.iter().sum();
    let agents = e.writes.len().max(1) as u64;
    let max_w = e.writes.iter().copied().max().unwrap_or(0);
    let max_b = e.bytes.iter().copied().max().unwrap_or(0);
    let mib = |b: f64| b / (1024.0 * 1024.0);
    let _ = writeln!(
        out,
        "\netcd, over the {} intervals it answered in: {:.1} writes/s and {:.2} MiB/s in all; per agent {:.2} writes/s and {:.3} MiB/s on average, the busiest (the leader) {:.2} writes/s and {:.3} MiB/s",
        e.intervals,
        per_s(writes),
        mib(per_s(bytes)),
        per_s(writes) / agents as f64,
        mib(per_s(bytes)) / agents as f64,
        per_s(max_w),
        mib(per_s(max_b)),
    );
    let largest = |v: &[u64]| v.iter().copied().max().unwrap_or(0);
    let over = |b: u64| {
        if b > ETCD_MAX_REQUEST {
            " (ABOVE etcd's default request limit of 1.5 MiB)"
        } else {
            ""
        }
    };
    let _ = writeln!(
        out,
        "records: division parts up to {} bytes{} ({} written over {} divisions, {} bytes each on average), heads up to {} bytes; largest demand record {} bytes, largest member record {} bytes{}",
        e.part_largest,
        over(e.part_largest),
        e.part_writes,
        e.shares_writes,
        e.part_bytes / e.part_writes.max(1),
        e.head_largest,
        largest(&e.demand_largest),
        largest(&e.member_largest),
        over(largest(&e.member_largest)),
    );
}

/// What etcd's answer times (`[cluster] etcd_read_ms`, `etcd_write_ms`) make of the
/// agents' intervals; empty when etcd answers at once. A target's agent (not the
/// leader) makes [`MEMBER_READS`] reads and [`AGENT_WRITES`] writes an interval.
pub fn etcd_latency_line(s: &ClusterScenario, run: &ClusterRun) -> String {
    let c = &s.cluster;
    if c.etcd_read_ms == 0.0 && c.etcd_write_ms == 0.0 {
        return String::new();
    }
    let e = &run.etcd;
    let calls = &e.leader_calls_ms;
    let mean = calls.iter().sum::<f64>() / calls.len().max(1) as f64;
    let max = calls.iter().copied().fold(0.0, f64::max);
    let member = MEMBER_READS as f64 * c.etcd_read_ms + AGENT_WRITES as f64 * c.etcd_write_ms;
    let landed = match e.overrun_divisions {
        0 => "no division lands late".to_string(),
        n if n == calls.len() as u64 && e.overrun_intervals == n => {
            "each division lands 1 interval late".to_string()
        }
        n => format!(
            "{n} of {} divisions land late, by {} intervals in all",
            calls.len(),
            e.overrun_intervals
        ),
    };
    format!(
        "etcd answering reads in {} ms and writes in {} ms: the leader's calls take {mean:.0} ms an interval on average, {max:.0} ms at most ({} ms intervals: {landed}); another target's agent's {member:.0} ms\n",
        c.etcd_read_ms, c.etcd_write_ms, c.interval_ms
    )
}

/// The leader's division time, measured on this machine: its own line, as it differs
/// from run to run.
pub fn division_time_line(run: &ClusterRun) -> String {
    let mut t: Vec<f64> = run
        .division_times
        .iter()
        .map(|d| d.as_secs_f64() * 1000.0)
        .collect();
    if t.is_empty() {
        return "leader's division time per interval (measured, not deterministic): no division"
            .into();
    }
    t.sort_by(f64::total_cmp);
    let mean = t.iter().sum::<f64>() / t.len() as f64;
    let cpu = match run.division_cpu.len() {
        0 => String::new(),
        n => format!(
            "; the thread's CPU time in it: mean {:.1} ms",
            run.division_cpu
                .iter()
                .map(|d| d.as_secs_f64() * 1000.0)
                .sum::<f64>()
                / n as f64
        ),
    };
    format!(
        "leader's division time per interval (qos_core::cluster::plan, measured on this machine, not deterministic): mean {mean:.1} ms, p99 {:.1} ms, max {:.1} ms over {} divisions{cpu}",
        t[(t.len() - 1) * 99 / 100],
        t[t.len() - 1],
        t.len()
    )
}
