//! A cluster of two real `nvmf_tgt` processes (issue 11): targets A and B on 127.0.0.1
//! (ports of their own, both on core 0), a real etcd (Debian's `etcd-server`), one
//! `nvmf-qos-agent run` per target, and one bdevperf on core 1 holding every host:
//! host X reaches both targets (a controller to each, one host NQN), host Y saturates A
//! and host Z saturates B (each with a local reservation). X's cluster-wide contract is
//! a reservation R = 0.22 C and a limit L = C/4 (C: what one target does, measured first)
//! set once with `nvmf-qos-agent host set`; its demand (C/2) at
//! each target is shaped at the initiator with SPDK's own bdev QoS
//! (`bdev_set_qos_limit` on bdevperf's bdevs), and moves mid-run.
//!
//! Phases, after a calibration that sizes the domains at 90 % of what each target does:
//! 1. demand 80/20, then 20/80: X's cluster-wide IOPS (summed over the targets, per
//!    window of one period) meet R in >= 99 % of the windows that start two periods
//!    after the move or later, and never exceed L by more than 2 %;
//! 2. etcd stopped for 10 s while the demand moves back: no window without X's I/O at
//!    either target, L still holds; the shares follow the move after etcd restarts;
//! 3. target A killed (SIGKILL): within two periods after its lease expires, B grants X
//!    its whole R and L, and X (now all at B) gets at least R and at most L + 2 %.
//!
//! `a_host_s_contract_held_while_etcd_s_raft_leader_is_killed` runs the same targets
//! and hosts against a three-member etcd cluster over TLS and kills its raft leader as
//! X's demand moves (issue 42); `a_writer_s_mibps_contract_held_across_two_targets`
//! divides a MiB/s contract.
//!
//! Always asserted: the limit, no stall while etcd is away, the failover bound, and the
//! reservation in >= 90 % of the steady windows; with `NVMF_QOS_ACCEPTANCE=1` (`make
//! accept`) the reservation in >= 99 % of them, also after the failover. While etcd is
//! away the shares cannot follow the move, and the reservation is not met then (the
//! test prints those windows). Prints `SKIPPED: ...` and passes without SPDK, the
//! plugins, the agent or etcd.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::json;
use target_it::etcd::{Etcd, etcd_or_skip, raft_leader};
use target_it::pki::Pki;
use target_it::*;

const PERIOD_MS: u64 = 500;
const LEASE_TTL_S: u64 = 2;
const INTERVAL_MS: u64 = 100;
/// How long etcd is away in the outage phase (issue 42's acceptance: 30 s).
const OUTAGE_S: f64 = 30.0;
const X: usize = 1;

/// A target with a QoS bdev for X and one for its local host `other`, each exposed to
/// its host only, in domain `d` at a capacity no load reaches (calibration).
fn target(s: &Setup, port: u16, other: usize) -> Target {
    let mut t = s.target(400);
    t.malloc("Malloc0", 131072, 512);
    t.call(
        "qos_domain_create",
        json!({"name": "d", "capacity_iops": 10_000_000u64, "period_ms": PERIOD_MS}),
    );
    t.call("nvmf_create_transport", json!({"trtype": "TCP"}));
    for i in [X, other] {
        let bdev = t.qos_bdev_for_host(i, "Malloc0", "d");
        t.expose_host(i, &bdev, port);
    }
    t
}

fn ctrl(name: &str, host: usize, port: u16) -> Controller {
    Controller {
        name: name.into(),
        subnqn: subsys_nqn(host),
        hostnqn: host_nqn(host),
        port,
    }
}

/// Targets A (host X and local host Y) and B (X and Z), and bdevperf's controllers:
/// XA, XB (one host NQN, one controller per target), Y, Z.
fn two_targets(s: &Setup) -> (Target, Target, [Controller; 4]) {
    let (port_a, port_b) = (s.port, free_port());
    let ta = target(s, port_a, 2);
    let tb = target(s, port_b, 3);
    let ctrls = [
        ctrl("XA", X, port_a),
        ctrl("XB", X, port_b),
        ctrl("Y", 2, port_a),
        ctrl("Z", 3, port_b),
    ];
    (ta, tb, ctrls)
}

/// Longest the agents may take to apply a new host's shares at both targets (s): about
/// a lease's time-to-live plus a few intervals on a quiet machine, with room for a
/// busy one.
const SHARES_IN_FORCE_S: u64 = 15;

/// `nvmf-qos-agent`, built by this workspace.
fn agent_bin() -> Result<PathBuf, String> {
    built_lib("nvmf-qos-agent", "NVMF_QOS_AGENT", "nvmf-qos-agent")
}

/// How the agents and the agent's CLI reach etcd: the members' client URLs (the first
/// called first) and, for an etcd that speaks TLS, the CA and client certificate flags.
struct EtcdAccess {
    args: Vec<String>,
}

impl EtcdAccess {
    /// One etcd over plain HTTP.
    fn single(etcd: &Etcd) -> EtcdAccess {
        EtcdAccess {
            args: vec!["--etcd".into(), etcd.url()],
        }
    }

    /// The members of an etcd cluster over TLS with `pki`'s client certificate, member
    /// `first` first (the agents keep calling the member that answers them).
    fn cluster(members: &[Etcd], first: usize, pki: &Pki) -> EtcdAccess {
        let mut urls: Vec<String> = members.iter().map(Etcd::url).collect();
        urls.rotate_left(first);
        let path = |p: PathBuf| p.display().to_string();
        EtcdAccess {
            args: vec![
                "--etcd".into(),
                urls.join(","),
                "--etcd-ca".into(),
                path(pki.ca()),
                "--etcd-cert".into(),
                path(pki.client_cert()),
                "--etcd-key".into(),
                path(pki.client_key()),
            ],
        }
    }
}

/// An agent process, stopped (SIGTERM: it leaves the cluster) when dropped.
struct AgentProc {
    child: Child,
    log: PathBuf,
}

impl AgentProc {
    fn start(bin: &PathBuf, etcd: &EtcdAccess, name: &str, t: &Target) -> AgentProc {
        let log = std::env::temp_dir().join(format!(
            "nvmf-qos-it-agent-{}-{name}.log",
            std::process::id()
        ));
        let child = Command::new(bin)
            .args(&etcd.args)
            .args(["run", "--cluster", "it", "--target", name, "--domain", "d"])
            .arg("--rpc-socket")
            .arg(&t.sock)
            .args(["--interval-ms", &INTERVAL_MS.to_string()])
            .args(["--lease-ttl-s", &LEASE_TTL_S.to_string()])
            // Its handover report, for the other agent to trade by while etcd is away.
            .args(["--listen", "127.0.0.1:0"])
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("agent log"))
            .spawn()
            .expect("start nvmf-qos-agent");
        AgentProc { child, log }
    }

    fn log_tail(&self, n: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }
}

impl Drop for AgentProc {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .arg(self.child.id().to_string())
            .status();
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_secs(3) {
            if let Ok(Some(_)) = self.child.try_wait() {
                let _ = std::fs::remove_file(&self.log);
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An admin command of the agent's CLI. Its etcd calls may wait up to 5 s: both cores
/// busy-poll here (two targets on one, bdevperf on the other) and etcd, starved, once
/// took longer than the CLI's default 500 ms to answer `cluster create`.
fn agent_cmd(bin: &PathBuf, etcd: &EtcdAccess, args: &[&str]) -> String {
    let out = Command::new(bin)
        .args(&etcd.args)
        .args(["--etcd-timeout-ms", "5000"])
        .args(args)
        .output()
        .expect("run nvmf-qos-agent");
    assert!(
        out.status.success(),
        "nvmf-qos-agent {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into()
}

/// What a contract is in: operations or MiB per second.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Unit {
    Iops,
    Mibps,
}

impl Unit {
    /// How it is written: after a figure, and in the targets' parameter names
    /// (`min_iops`, `capacity_mibps`, the agent's `--min-mibps`).
    fn label(self) -> &'static str {
        match self {
            Unit::Iops => "IOPS",
            Unit::Mibps => "MiB/s",
        }
    }
    fn param(self) -> &'static str {
        match self {
            Unit::Iops => "iops",
            Unit::Mibps => "mibps",
        }
    }
    /// A host's completed work in this unit's numerator (operations, or MiB as a
    /// fraction).
    fn of(self, c: &target_it::stats::Work) -> f64 {
        match self {
            Unit::Iops => c.ops as f64,
            Unit::Mibps => c.bytes as f64 / (1u64 << 20) as f64,
        }
    }
}

/// Completed work of a host at a target (its counter since it was added, in `unit`),
/// or `None` when the target does not answer.
fn completed(t: &mut Target, host: usize, unit: Unit) -> Option<f64> {
    let s = t
        .try_stats(json!({"domain": "d", "host_nqn": host_nqn(host), "compact": true}))
        .ok()?;
    Some(unit.of(&s.hosts.first()?.completed_total))
}

/// All hosts' completed work at a target, in `unit`.
fn domain_completed(t: &mut Target, unit: Unit) -> f64 {
    let s = t.compact_stats("d");
    s.hosts.iter().map(|h| unit.of(&h.completed_total)).sum()
}

/// X's (reservation, limit) at one target; `None` while it has no limit there.
type Settings = Option<(u64, u64)>;

/// X's local settings at a target: (min, max) in `unit`.
fn x_settings(t: &mut Target, unit: Unit) -> Settings {
    let v = t
        .rpc(
            "qos_host_get",
            json!({"domain": "d", "host_nqn": host_nqn(X)}),
        )
        .ok()?;
    let p = unit.param();
    Some((
        v[0][format!("min_{p}")].as_u64().unwrap_or(0),
        v[0][format!("max_{p}")].as_u64()?,
    ))
}

/// Whether X's (reservation, limit) shares at A and B hold its contract as the agents
/// promise (cluster-agent's `PROMPT_MILLI` and `HYSTERESIS_MILLI`): the reservations
/// add up to at least the reservation (less 0.5 %) and at most 3 % more, the limits to
/// at most the limit (plus 0.5 %) and at least 3 % less; each bound two units wider (each
/// part is rounded).
fn adds_up(a: Settings, b: Settings, (r, l): (u64, u64)) -> bool {
    let Some(((ra, la), (rb, lb))) = a.zip(b) else {
        return false;
    };
    let within = |sum: u64, of: u64, below_milli: u64, above_milli: u64| {
        sum * 1000 + below_milli * of + 2000 >= of * 1000
            && sum * 1000 <= of * 1000 + above_milli * of + 2000
    };
    within(ra + rb, r, 5, 30) && within(la + lb, l, 30, 5)
}

/// X's shares at A and B, read until a pair holds the contract ([`adds_up`]) or ten
/// reads did not. The agents apply a division a few milliseconds apart and the
/// division moves with the demand every interval, so one pair of reads can straddle
/// two divisions; ten in a row 70 ms apart cannot, unless what the agents apply does
/// not hold the contract. Returns every read, for the failure message.
fn shares_read_until_held(
    ta: &mut Target,
    tb: &mut Target,
    unit: Unit,
    contract: (u64, u64),
) -> Vec<(Settings, Settings)> {
    let mut reads = Vec::new();
    for _ in 0..10 {
        let pair = (x_settings(ta, unit), x_settings(tb, unit));
        reads.push(pair);
        if adds_up(pair.0, pair.1, contract) {
            break;
        }
        std::thread::sleep(Duration::from_millis(70));
    }
    reads
}

/// X's rate (in `unit`) at A and B per window of one period, sampled by the test.
struct Windows {
    unit: Unit,
    /// (start, end, X's rate at A, at B).
    rows: Vec<(Instant, Instant, f64, f64)>,
    /// The last read at A and at B: when (the middle of its RPC) and what.
    last: Option<[(Instant, Option<f64>); 2]>,
}

/// `read`'s answer and the middle of the time it took: a read that waited on a busy
/// target counts what completed while it waited, so its time must be its own, not
/// the one before it started (one read late by 35 ms made a window 7 % above the
/// limit and the next 7 % below).
fn timed<T>(read: impl FnOnce() -> T) -> (Instant, T) {
    let t0 = Instant::now();
    let v = read();
    (t0 + t0.elapsed() / 2, v)
}

impl Windows {
    fn new(unit: Unit) -> Windows {
        Windows {
            unit,
            rows: Vec::new(),
            last: None,
        }
    }

    fn sample(&mut self, a: Option<&mut Target>, b: &mut Target) {
        let unit = self.unit;
        let now = [
            timed(|| a.and_then(|t| completed(t, X, unit))),
            timed(|| completed(b, X, unit)),
        ];
        if let Some(last) = self.last {
            let rate =
                |(t0, p): (Instant, Option<f64>), (t1, c): (Instant, Option<f64>)| match (p, c) {
                    (Some(p), Some(c)) => (c - p).max(0.0) / t1.duration_since(t0).as_secs_f64(),
                    _ => 0.0,
                };
            self.rows.push((
                last[0].0.min(last[1].0),
                now[0].0.max(now[1].0),
                rate(last[0], now[0]),
                rate(last[1], now[1]),
            ));
        }
        self.last = Some(now);
    }

    /// Windows that lie inside `[from, to]`.
    fn between(&self, from: Instant, to: Instant) -> Vec<(f64, f64)> {
        self.rows
            .iter()
            .filter(|(t0, t1, _, _)| *t0 >= from && *t1 <= to)
            .map(|&(_, _, a, b)| (a, b))
            .collect()
    }
}

/// Samples windows for `secs`.
fn run_for(w: &mut Windows, a: Option<&mut Target>, b: &mut Target, secs: f64) {
    let end = Instant::now() + Duration::from_secs_f64(secs);
    let mut a = a;
    while Instant::now() < end {
        std::thread::sleep(Duration::from_millis(PERIOD_MS));
        w.sample(a.as_deref_mut(), b);
    }
}

/// X's demand at A and B, shaped at the initiator by SPDK's bdev QoS (IOPS in
/// multiples of 1,000, MiB/s whole).
fn set_demand(bp: &Bdevperf, unit: Unit, a: u64, b: u64) {
    let key = match unit {
        Unit::Iops => "rw_ios_per_sec",
        Unit::Mibps => "rw_mbytes_per_sec",
    };
    for (bdev, rate) in [("XAn1", a), ("XBn1", b)] {
        bp.call("bdev_set_qos_limit", json!({"name": bdev, key: rate}));
    }
}

fn summarize(what: &str, unit: Unit, rows: &[(f64, f64)], r: u64, l: u64) -> (usize, usize, f64) {
    let totals: Vec<f64> = rows.iter().map(|(a, b)| a + b).collect();
    let met = totals.iter().filter(|&&t| t >= 0.99 * r as f64).count();
    let max = totals.iter().cloned().fold(0.0, f64::max);
    let u = unit.label();
    println!(
        "  {what}: {} windows, reservation ({r} {u}) met in {met}, most {max:.0} {u} ({:+.2} % of the limit {l}); per window A+B: {}",
        rows.len(),
        (max / l as f64 - 1.0) * 100.0,
        rows.iter()
            .map(|(a, b)| format!("{a:.0}+{b:.0}"))
            .collect::<Vec<_>>()
            .join(" ")
    );
    (rows.len(), met, max)
}

/// X's rate at A and at B over one window.
type WindowRates = (f64, f64);

/// What all hosts of each target do together, measured over 4 s after 2 s of warm-up,
/// in `unit`: the domains are then sized at 90 % of the slower target (C, returned).
fn calibrate(ta: &mut Target, tb: &mut Target, unit: Unit) -> u64 {
    std::thread::sleep(Duration::from_secs(2));
    let (a0, b0, t0) = (
        domain_completed(ta, unit),
        domain_completed(tb, unit),
        Instant::now(),
    );
    std::thread::sleep(Duration::from_secs(4));
    let dt = t0.elapsed().as_secs_f64();
    let cap_a = (domain_completed(ta, unit) - a0) / dt;
    let cap_b = (domain_completed(tb, unit) - b0) / dt;
    let c = (0.9 * cap_a.min(cap_b)) as u64;
    let u = unit.label();
    println!("  calibration: target A {cap_a:.0} {u}, B {cap_b:.0} {u}; domains at C = {c}");
    c
}

/// Both domains at capacity `c` (in `unit`), each target's local host reserving 2/5 of
/// it.
fn size_domains(ta: &mut Target, tb: &mut Target, unit: Unit, c: u64) {
    let p = unit.param();
    for (t, other) in [(ta, 2), (tb, 3)] {
        t.call(
            "qos_domain_update",
            json!({"name": "d", format!("capacity_{p}"): c, format!("capacity_{p}_stddev"): c / 20}),
        );
        t.call(
            "qos_host_set",
            json!({"domain": "d", "host_nqn": host_nqn(other), format!("min_{p}"): c * 2 / 5}),
        );
    }
}

/// The cluster around the two targets: the agent binary, etcd, and the unit of X's
/// contract.
struct Cluster<'a> {
    agent: &'a PathBuf,
    etcd: &'a EtcdAccess,
    unit: Unit,
}

impl Cluster<'_> {
    /// Creates the cluster, starts an agent per target, and sets X's contract
    /// (reservation `r`, limit `l`; `d` is its demand, for the log).
    /// Waits (up to 5 s) until both targets enforce a limit share of X: the windows
    /// measured after that are of the cluster's contract, not of X unlimited.
    fn start(&self, ta: &mut Target, tb: &mut Target, r: u64, l: u64, d: u64) -> [AgentProc; 2] {
        agent_cmd(
            self.agent,
            self.etcd,
            &["cluster", "create", "--cluster", "it"],
        );
        let agents = [
            AgentProc::start(self.agent, self.etcd, "a", ta),
            AgentProc::start(self.agent, self.etcd, "b", tb),
        ];
        std::thread::sleep(Duration::from_millis(1000));
        let p = self.unit.param();
        let (min, max) = (format!("--min-{p}"), format!("--max-{p}"));
        let nqn = host_nqn(X);
        let (r_s, l_s) = (r.to_string(), l.to_string());
        let args = [
            "host",
            "set",
            "--cluster",
            "it",
            "--host-nqn",
            &nqn,
            &min,
            &r_s,
            &max,
            &l_s,
        ];
        agent_cmd(self.agent, self.etcd, &args);
        let u = self.unit.label();
        println!("  X: reservation {r} {u}, limit {l} {u} over the cluster; demand {d} {u}");
        // The windows measure the shares from here on: without them in force at both
        // targets a target serves X unlimited (a run that went on after 5 s of waiting
        // measured 2.8x the limit at A for four windows).
        let set = Instant::now();
        let in_force = |ta: &mut Target, tb: &mut Target| {
            x_settings(ta, self.unit).is_some() && x_settings(tb, self.unit).is_some()
        };
        while set.elapsed() < Duration::from_secs(SHARES_IN_FORCE_S) && !in_force(ta, tb) {
            std::thread::sleep(Duration::from_millis(50));
        }
        assert!(
            in_force(ta, tb),
            "X's shares not in force at both targets {SHARES_IN_FORCE_S} s after host set; \
             agent logs:\n{}\n{}",
            agents[0].log_tail(20),
            agents[1].log_tail(20)
        );
        println!(
            "  X's shares in force at both targets {:?} after host set",
            set.elapsed()
        );
        agents
    }

    /// X's demand `d` 80/20 for 10 s, then 20/80 for 10 s: the windows from two
    /// periods after each move (steady), and every window.
    fn demand_moves(
        &self,
        w: &mut Windows,
        bp: &Bdevperf,
        ta: &mut Target,
        tb: &mut Target,
        d: u64,
    ) -> (Vec<WindowRates>, Vec<WindowRates>) {
        let delay = Duration::from_millis(2 * PERIOD_MS);
        set_demand(bp, self.unit, d * 4 / 5, d / 5);
        let p1 = Instant::now();
        run_for(w, Some(ta), tb, 10.0);
        let shares_8020 = (x_settings(ta, self.unit), x_settings(tb, self.unit));
        set_demand(bp, self.unit, d / 5, d * 4 / 5);
        let p2 = Instant::now();
        run_for(w, Some(ta), tb, 10.0);
        let shares_2080 = (x_settings(ta, self.unit), x_settings(tb, self.unit));
        for (name, t) in [("A", &mut *ta), ("B", &mut *tb)] {
            if let Ok(v) = t.rpc(
                "qos_stats_get",
                json!({"domain": "d", "host_nqn": host_nqn(X), "compact": true}),
            ) {
                println!(
                    "  X's held_by at {name} after 20/80: {}",
                    v[0]["hosts"][0]["held_by"]
                );
            }
        }
        println!("  X's (min, max) at A, B: 80/20 {shares_8020:?}; 20/80 {shares_2080:?}");
        println!(
            "{}",
            agent_cmd(self.agent, self.etcd, &["show", "--cluster", "it"])
        );
        let mut steady = w.between(p1 + delay, p2);
        steady.extend(w.between(p2 + delay, Instant::now()));
        (steady, w.between(p1, Instant::now()))
    }
}

/// The IOPS tests' calibrated figures: C (the domains' capacity), X's demand `d`,
/// reservation `r` and limit `l`.
struct IopsContract {
    c: u64,
    d: u64,
    r: u64,
    l: u64,
}

/// The IOPS tests' hosts, 4 KiB random readers in bdevperf for `secs`, started and
/// calibrated: X keeps twice the local hosts' queue depth at each target, so that what
/// it can get there (first come: by queue depth) is above its limit and the limit
/// binds. X wants half of C; reservation 0.22 C, limit C/4 (about what it gets against
/// the saturating local hosts, so that the limit comes into play).
fn readers(
    s: &Setup,
    ctrls: &[Controller; 4],
    secs: u32,
    ta: &mut Target,
    tb: &mut Target,
) -> (Bdevperf, Running, IopsContract) {
    let jobs: Vec<Job> = ctrls
        .iter()
        .map(|c| {
            Job::new(
                &c.bdev(),
                "randread",
                4096,
                if c.hostnqn == host_nqn(X) { 128 } else { 64 },
            )
        })
        .collect();
    let bp = s.bdevperf(false, bdev_config(ctrls, &[]), jobs, secs, &["-f"]);
    // Calibration: X at 40,000 IOPS at most, 80/20, the others unbounded.
    set_demand(&bp, Unit::Iops, 32_000, 8_000);
    let perform = bp.start_tests();
    let c = calibrate(ta, tb, Unit::Iops);
    // SPDK's bdev QoS takes IOPS in thousands: the demand is a multiple of 5,000.
    let d = ((c as f64 * 0.5 / 5000.0).round() as u64).max(1) * 5000;
    let (r, l) = (c * 22 / 100, c / 4);
    (bp, perform, IopsContract { c, d, r, l })
}

#[test]
fn a_host_s_contract_held_across_two_targets() {
    let what = "cluster of two targets";
    let Some(etcd_bin) = etcd_or_skip(what) else {
        return;
    };
    let Some(s) = setup_or_skip(what) else {
        return;
    };
    let agent = agent_bin().unwrap_or_else(|e| panic!("{e}"));
    let mut etcd = Etcd::start(etcd_bin).unwrap_or_else(|e| panic!("{e}"));
    let access = EtcdAccess::single(&etcd);
    let (mut ta, mut tb, ctrls) = two_targets(&s);
    let (bp, perform, IopsContract { c, d, r, l }) = readers(&s, &ctrls, 90, &mut ta, &mut tb);
    let cl = Cluster {
        agent: &agent,
        etcd: &access,
        unit: Unit::Iops,
    };
    size_domains(&mut ta, &mut tb, Unit::Iops, c);
    let agents = cl.start(&mut ta, &mut tb, r, l, d);

    // Phase 1: 80/20, then 20/80.
    let mut w = Windows::new(Unit::Iops);
    let delay = Duration::from_millis(2 * PERIOD_MS);
    let (steady, every) = cl.demand_moves(&mut w, &bp, &mut ta, &mut tb, d);
    let (n, met, max) = summarize("80/20 then 20/80, steady", Unit::Iops, &steady, r, l);
    let (_, _, max_all) = summarize("the same, every window", Unit::Iops, &every, r, l);

    // Phase 2: etcd away for 30 s while the demand moves back to 80/20: the agents
    // trade the move (docs/cluster.md, "While etcd is away").
    let before_outage = (
        x_settings(&mut ta, Unit::Iops),
        x_settings(&mut tb, Unit::Iops),
    );
    etcd.stop();
    set_demand(&bp, Unit::Iops, d * 4 / 5, d / 5);
    let p3 = Instant::now();
    run_for(&mut w, Some(&mut ta), &mut tb, OUTAGE_S);
    let outage = w.between(p3, Instant::now());
    let outage_steady = w.between(p3 + delay, Instant::now());
    let during_outage = (
        x_settings(&mut ta, Unit::Iops),
        x_settings(&mut tb, Unit::Iops),
    );
    etcd.restart().unwrap_or_else(|e| panic!("{e}"));
    let p4 = Instant::now();
    let mut resumed = None;
    let mut trace = Vec::new();
    while p4.elapsed() < Duration::from_secs(8) {
        run_for(&mut w, Some(&mut ta), &mut tb, 0.5);
        let (a, b) = (
            x_settings(&mut ta, Unit::Iops),
            x_settings(&mut tb, Unit::Iops),
        );
        trace.push(format!(
            "{:.1} s: A {a:?} B {b:?}",
            p4.elapsed().as_secs_f64()
        ));
        if resumed.is_none() && a.map(|s| s.1) > b.map(|s| s.1) {
            resumed = Some(p4.elapsed());
        }
    }
    if resumed.is_none() {
        // What the leader divided from (each path's demand, backlogged or not) and X's
        // windows, for the failure below (seen once in ~10 runs, not reproduced).
        println!(
            "  X's (min, max) after etcd restarted: {}",
            trace.join("; ")
        );
        summarize(
            "after etcd restarted",
            Unit::Iops,
            &w.between(p4, Instant::now()),
            r,
            l,
        );
        println!(
            "{}",
            agent_cmd(&agent, &access, &["show", "--cluster", "it"])
        );
    }
    let (_, _, max_outage) = summarize(
        "etcd stopped, demand back to 80/20",
        Unit::Iops,
        &outage,
        r,
        l,
    );
    let (no, meto, _) = summarize(
        "the same, from two periods after the move",
        Unit::Iops,
        &outage_steady,
        r,
        l,
    );
    println!(
        "  X's (min, max) before the outage {before_outage:?}, at its end {during_outage:?}; shares followed {resumed:?} after etcd restarted"
    );

    // Phase 3: target A dies; X fails over to B (the test moves its demand).
    ta.kill_hard();
    let killed = Instant::now();
    set_demand(&bp, Unit::Iops, 1000, d);
    let mut failed_over = None;
    while killed.elapsed() < Duration::from_secs(LEASE_TTL_S + 6) {
        std::thread::sleep(Duration::from_millis(50));
        if failed_over.is_none() && x_settings(&mut tb, Unit::Iops) == Some((r, l)) {
            failed_over = Some(killed.elapsed());
        }
        if failed_over.is_some() {
            break;
        }
    }
    let p5 = Instant::now();
    run_for(&mut w, None, &mut tb, 6.0);
    let after_kill = w.between(p5 + delay, Instant::now());
    let (nk, metk, maxk) = summarize(
        "after A was killed, all at B",
        Unit::Iops,
        &after_kill,
        r,
        l,
    );
    println!(
        "  B held X's whole contract {failed_over:?} after A's SIGKILL (lease TTL {LEASE_TTL_S} s)"
    );
    for (name, a) in ["a", "b"].iter().zip(&agents) {
        println!("  agent {name} log:\n{}", a.log_tail(12));
    }
    drop(agents);
    let _ = perform.wait();
    drop(bp);

    // Issue 11's thresholds with NVMF_QOS_ACCEPTANCE=1 (`make accept`); on a busy
    // machine two targets sharing one core miss a window now and then.
    // Always: the limit (the targets enforce their shares, which add up to it), no
    // stall while etcd is away, the failover.
    assert!(
        max_all <= 1.02 * l as f64,
        "limit exceeded: {max_all:.0} > {l} + 2 %"
    );
    assert!(
        max_outage <= 1.02 * l as f64,
        "limit exceeded during the outage: {max_outage:.0}"
    );
    assert!(
        maxk <= 1.02 * l as f64,
        "limit exceeded after the failover: {maxk:.0}"
    );
    assert!(
        outage.iter().all(|&(a, b)| a > 0.0 && b > 0.0),
        "a window without X's I/O at a target while etcd was away: {outage:?}"
    );
    assert!(
        resumed.is_some(),
        "shares did not follow the demand after etcd came back"
    );
    let fo = failed_over.expect("B never held X's whole contract after A died");
    assert!(
        fo <= Duration::from_millis(LEASE_TTL_S * 1000 + 2 * PERIOD_MS + 2 * INTERVAL_MS),
        "failover took {fo:?}"
    );
    if acceptance() {
        assert!(
            met * 100 >= n * 99,
            "reservation met in {met} of {n} steady windows"
        );
        assert!(
            metk * 100 >= nk * 99,
            "after failover: met in {metk} of {nk}"
        );
        assert!(
            meto * 100 >= no * 90,
            "etcd away: reservation met in {meto} of {no} windows from two periods after the move"
        );
    } else {
        assert!(
            met * 10 >= n * 9,
            "reservation met in {met} of {n} steady windows"
        );
        // Without the handover it was 0-1 of them; with it, every window in seven runs.
        assert!(
            meto * 4 >= no * 3,
            "etcd away: reservation met in {meto} of {no} windows from two periods after the move"
        );
    }
    println!("  steady windows: most {max:.0} IOPS for the limit {l}");
}

/// Issue 42's MiB/s acceptance: a 1 MiB writer's MiB/s contract (reservation 0.22 C,
/// limit C/4, C in MiB/s) divided over the two targets by the agents as the IOPS one
/// is, its demand (C/2) moving 80/20 then 20/80; each target's local host writes
/// 128 KiB commands against a local MiB/s reservation. Always asserted: the shares add
/// up and the limit holds (+2 %, and one 1 MiB command per target and window). With
/// `NVMF_QOS_ACCEPTANCE=1`: the reservation in at least 99 % of the steady windows,
/// which is not met yet: at the target its demand left, the writer (served just under
/// its shares there, its 1 MiB commands waiting for paced reservation and limit tokens:
/// about 4 waiting on average) counts as held by the agent's rule, so the division
/// splits evenly instead of following the move (docs/cluster.md, "Not built"); the
/// test prints the windows and the hold reasons.
#[test]
fn a_writer_s_mibps_contract_held_across_two_targets() {
    let what = "cluster of two targets, MiB/s";
    let Some(etcd_bin) = etcd_or_skip(what) else {
        return;
    };
    let Some(s) = setup_or_skip(what) else {
        return;
    };
    let agent = agent_bin().unwrap_or_else(|e| panic!("{e}"));
    let etcd = Etcd::start(etcd_bin).unwrap_or_else(|e| panic!("{e}"));
    let access = EtcdAccess::single(&etcd);
    let (mut ta, mut tb, ctrls) = two_targets(&s);
    let jobs = ctrls
        .iter()
        .map(|c| match c.hostnqn == host_nqn(X) {
            true => Job::new(&c.bdev(), "write", 1 << 20, 16),
            false => Job::new(&c.bdev(), "write", 128 << 10, 16),
        })
        .collect();
    let bp = s.bdevperf(false, bdev_config(&ctrls, &[]), jobs, 36, &["-f"]);
    let perform = bp.start_tests();
    let c = calibrate(&mut ta, &mut tb, Unit::Mibps);
    let d = (c / 2).max(2);
    let (r, l) = (c * 22 / 100, c / 4);
    size_domains(&mut ta, &mut tb, Unit::Mibps, c);
    let cl = Cluster {
        agent: &agent,
        etcd: &access,
        unit: Unit::Mibps,
    };
    let agents = cl.start(&mut ta, &mut tb, r, l, d);
    let mut w = Windows::new(Unit::Mibps);
    let (steady, every) = cl.demand_moves(&mut w, &bp, &mut ta, &mut tb, d);
    let (n, met, _) = summarize("80/20 then 20/80, steady", Unit::Mibps, &steady, r, l);
    let (_, _, max_all) = summarize("the same, every window", Unit::Mibps, &every, r, l);
    for (name, a) in ["a", "b"].iter().zip(&agents) {
        println!("  agent {name} log:\n{}", a.log_tail(6));
    }
    // The shares while both agents are in the cluster (a stopped agent leaves it).
    let reads = shares_read_until_held(&mut ta, &mut tb, Unit::Mibps, (r, l));
    drop(agents);
    let _ = perform.wait();
    drop(bp);
    // A target admits whole commands: a window of half a second can hold one 1 MiB
    // command more per target than its share (2 MiB/s each), beside the IOPS test's 2 %.
    let slack = 2.0 * 2.0;
    assert!(
        max_all <= 1.02 * l as f64 + slack,
        "MiB/s limit exceeded: {max_all:.1} > {l} + 2 % + {slack} MiB/s"
    );
    assert!(
        reads.last().is_some_and(|&(a, b)| adds_up(a, b, (r, l))),
        "X's MiB/s shares at (A, B) never held ({r}, {l}) in {} reads: {reads:?}",
        reads.len()
    );
    if acceptance() {
        assert!(
            met * 100 >= n * 99,
            "MiB/s reservation met in {met} of {n} steady windows"
        );
    }
}

/// Issue 42's etcd-cluster acceptance on real targets: the agents reach a three-member
/// etcd cluster (Debian's `etcd-server`, clients over TLS with client certificates, the
/// members to each other over TLS), calling the raft leader first; X's demand moves
/// from 80/20 to 20/80 as the raft leader is killed (SIGKILL). The agents go on through
/// the election (another member, the handover while no member answers): no window
/// without X's I/O at either target, never above the limit (+2 %), X's reservation met
/// in the windows from two periods after the new raft leader (always in >= 90 % of
/// them, with `NVMF_QOS_ACCEPTANCE=1` in >= 99 %), the shares at A and B add up to the
/// contract at the end, and the division each agent applies (its log's `shares #N`,
/// interval by interval) never goes back: none is lost to the election.
#[test]
fn a_host_s_contract_held_while_etcd_s_raft_leader_is_killed() {
    let what = "cluster of two targets over a three-member etcd";
    let Some(etcd_bin) = etcd_or_skip(what) else {
        return;
    };
    let Some(s) = setup_or_skip(what) else {
        return;
    };
    let agent = agent_bin().unwrap_or_else(|e| panic!("{e}"));
    let pki = Pki::new("it-etcd3");
    let (mut members, leader) =
        Etcd::tls_cluster(etcd_bin, &pki, 3).unwrap_or_else(|e| panic!("{e}"));
    // The agents call the leader first: killing it makes them move to another member.
    let access = EtcdAccess::cluster(&members, leader, &pki);
    let (mut ta, mut tb, ctrls) = two_targets(&s);
    let (bp, perform, IopsContract { c, d, r, l }) = readers(&s, &ctrls, 45, &mut ta, &mut tb);
    size_domains(&mut ta, &mut tb, Unit::Iops, c);
    let cl = Cluster {
        agent: &agent,
        etcd: &access,
        unit: Unit::Iops,
    };
    let agents = cl.start(&mut ta, &mut tb, r, l, d);
    let mut w = Windows::new(Unit::Iops);
    let delay = Duration::from_millis(2 * PERIOD_MS);
    set_demand(&bp, Unit::Iops, d * 4 / 5, d / 5);
    let p1 = Instant::now();
    run_for(&mut w, Some(&mut ta), &mut tb, 6.0);
    let before = w.between(p1 + delay, Instant::now());

    // The move and the raft leader's death together.
    set_demand(&bp, Unit::Iops, d / 5, d * 4 / 5);
    members[leader].kill();
    let killed = Instant::now();
    let (mut new_leader, mut followed) = (None, None);
    while killed.elapsed() < Duration::from_secs(14) {
        run_for(&mut w, Some(&mut ta), &mut tb, 0.5);
        if new_leader.is_none() {
            new_leader = raft_leader(&members).map(|m| (m, killed.elapsed()));
        }
        let (a, b) = (
            x_settings(&mut ta, Unit::Iops),
            x_settings(&mut tb, Unit::Iops),
        );
        if followed.is_none() && a.map(|s| s.1) < b.map(|s| s.1) {
            followed = Some(killed.elapsed());
        }
    }
    let reads = shares_read_until_held(&mut ta, &mut tb, Unit::Iops, (r, l));
    let after_kill = w.between(killed, Instant::now());
    let (n0, met0, max0) = summarize("80/20, steady, before", Unit::Iops, &before, r, l);
    let (_, _, max_kill) = summarize(
        "20/80 from the raft leader's kill",
        Unit::Iops,
        &after_kill,
        r,
        l,
    );
    let elected = new_leader.map(|(_, at)| at);
    let steady = elected
        .map(|at| w.between(killed + at + delay, Instant::now()))
        .unwrap_or_default();
    let (n, met, _) = summarize(
        "from two periods after the new raft leader",
        Unit::Iops,
        &steady,
        r,
        l,
    );
    let logs: Vec<String> = agents
        .iter()
        .map(|a| std::fs::read_to_string(&a.log).unwrap_or_default())
        .collect();
    let down_intervals: Vec<usize> = logs
        .iter()
        .map(|l| l.matches("etcd DOWN").count())
        .collect();
    // The division each agent applied, interval by interval (`shares #N` in its log):
    // none lost to the election means the numbers never go back.
    let applied: Vec<Vec<u64>> = logs
        .iter()
        .map(|l| {
            l.split("shares #")
                .skip(1)
                .filter_map(|rest| rest.split(' ').next()?.parse().ok())
                .collect()
        })
        .collect();
    let went_back: Vec<bool> = applied
        .iter()
        .map(|seqs| seqs.windows(2).any(|w| w[1] < w[0]))
        .collect();
    println!(
        "  raft leader {} killed: new leader {:?} after {elected:?}; X's shares followed the move {followed:?} after the kill; intervals without etcd (agents a, b): {down_intervals:?}; divisions applied (a, b): {:?} .. {:?}, {:?} .. {:?}",
        members[leader].name(),
        new_leader.map(|(m, _)| members[m].name().to_string()),
        applied[0].first(),
        applied[0].last(),
        applied[1].first(),
        applied[1].last(),
    );
    for (name, a) in ["a", "b"].iter().zip(&agents) {
        println!("  agent {name} log:\n{}", a.log_tail(8));
    }
    drop(agents);
    let _ = perform.wait();
    drop(bp);

    assert!(elected.is_some(), "no new raft leader within 14 s");
    assert!(
        applied.iter().all(|seqs| seqs.len() > 10) && !went_back.contains(&true),
        "the divisions the agents applied (a, b): {applied:?}"
    );
    assert!(
        after_kill.iter().all(|&(a, b)| a > 0.0 && b > 0.0),
        "a window without X's I/O at a target after the raft leader was killed: {after_kill:?}"
    );
    let max = max0.max(max_kill);
    assert!(
        max <= 1.02 * l as f64,
        "limit exceeded: {max:.0} > {l} + 2 %"
    );
    assert!(followed.is_some(), "the shares did not follow the move");
    assert!(
        reads.last().is_some_and(|&(a, b)| adds_up(a, b, (r, l))),
        "X's shares at (A, B) never held ({r}, {l}) after the election: {reads:?}"
    );
    assert!(n > 0, "no window from two periods after the new leader");
    let (share, of) = if acceptance() { (99, 100) } else { (9, 10) };
    assert!(
        met * of >= n * share && met0 * of >= n0 * share,
        "reservation met in {met} of {n} windows from two periods after the new raft leader \
         ({met0} of {n0} before the kill)"
    );
}
