//! Reliability (issues 9 and 29; results in docs/reliability.md). Nine tests against a
//! real `nvmf_tgt` with the target plugin:
//!
//! - `soak_with_churn_loses_nothing`: data-verifying hosts through QoS bdevs at
//!   saturation, with throttling active, while a seeded churn driver reconfigures,
//!   resets and disconnects them; then an audit that no I/O was lost, failed, corrupted
//!   or completed twice. `soak_with_churn_on_two_poll_groups_loses_nothing`: the same
//!   with the target on two cores and each host's I/O on two queue pairs.
//! - `restart_after_sigkill_restores_configuration_and_reservations`: `nvmf_tgt` killed
//!   with SIGKILL under load, restarted from its `save_config`; the hosts reconnect and
//!   meet their reservations again (the machine's slow spells excused: [`judged_periods`]).
//! - `hostile_host_gets_no_more_than_its_limit`: a host forging vendor commands,
//!   flooding reads and dropping connections with reads outstanding, next to a
//!   well-behaved host whose reservation is sized from what it does under that attack.
//! - `base_faults_reach_the_host_and_lose_nothing`: host 1's base (SPDK's error bdev)
//!   fails reads and writes, answers NOMEM, and is deleted under load; the failures
//!   reach host 1 exactly, each with the base's status (counted by status at the base,
//!   the QoS bdev and the host), nothing is lost or counted twice, the others'
//!   reservations hold (also around the removal), and the QoS bdev can be created
//!   again.
//! - `a_stalling_base_is_aborted_or_reset_and_loses_nothing`: host 1's base (SPDK's
//!   delay bdev) stops completing for a while; its host aborts, then resets, the
//!   commands that time out; nothing is lost or counted twice, the others go on.
//! - `an_impersonator_without_the_key_gets_nothing`: host 1's subsystem requires
//!   DH-HMAC-CHAP; a host claiming host 1's NQN without the key gets no controller and
//!   no command, while host 1 meets its reservation.
//! - `reservations_hold_over_tls`: hosts 1 and 2 over NVMe/TCP with TLS (a PSK each);
//!   host 1's reservation holds.
//! - `two_poll_groups_hold_reservations_and_limits`: the target on two cores under a
//!   CPU quota, hosts' I/O on both poll groups, against the same on one core; a limit
//!   holds, the books balance (reservation and limit accuracy compared under
//!   `NVMF_QOS_ACCEPTANCE=1`).
//!
//! Four hosts in one bdevperf process on core 1 (the target on core 0): hosts 1 and 2
//! plain NVMe/TCP, hosts 3 and 4 through the initiator plugin (token protocol), each
//! running bdevperf's `verify` (write, read back, compare) on its own QoS bdev over its
//! own split of one malloc bdev. Host 5 is the minimal NVMe/TCP host of it-harness in a
//! thread of this process, reading its own QoS bdev, which the churn deletes and
//! re-creates under it. The domain is sized at 90% of what the same load does through
//! the plugin with no throttling, reservations take 65% of it, two limits and a group
//! limit bind.
//!
//! Churn (one action every 1.5 to 4 s, from a seeded PRNG, `SOAK_SEED`): a host's
//! reservation and limit raised or lowered (`qos_host_set`), `qos_host_remove` and set
//! again, `qos_domain_update` (capacity, period, release mode), a host moved in or out
//! of the group, a controller reset at the initiator (`bdev_nvme_reset_controller`), a
//! host disconnected and reconnected (its listener removed and added back; bdev_nvme
//! reconnects and retries), host 5's QoS bdev deleted and created again, the domain's
//! bypass on for 0.3-1.5 s under load and off again (issue 38).
//!
//! Soak audit, after the run: 0 verify errors in bdevperf and no failed I/O but those
//! SPDK's controller reset fails by design (at most one queue depth per reset); host 5
//! saw no command hang; every QoS bdev's reads and writes (SPDK's iostat) equal its
//! base's (each I/O reached the base exactly once); every host's token books balance
//! (`admitted_ios_total == completed_total.ios`, nothing held, nothing in flight); no
//! I/O waited longer than [`wait_bound_us`]; the target did not crash and its RSS grew
//! at most 1% after warm-up; after each change that kept the reservations admissible,
//! the reservations are met from 2 periods on (reported; asserted under
//! `NVMF_QOS_ACCEPTANCE=1`, as the machine's other load can take capacity away).
//!
//! `SOAK_SECS` sets the soak's length (default 60; `make soak` runs 600);
//! `SOAK_IN_FLIGHT=N` runs it over the hosts' circulation at N thousandths of a command
//! (`operating_point`, issue 39) instead of weighted sharing. Each test
//! prints `SKIPPED: ...` and passes when SPDK, bdevperf or the plugins are not found.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use target_it::nvme_tcp::{Qpair, Sqe, connect_io};
use target_it::*;

/// Hosts in bdevperf; host 5 is the churned minimal host.
const HOSTS: usize = 4;
const CHURN_HOST: usize = 5;
const COOPERATIVE: [usize; 2] = [3, 4];
const QDS: [u32; HOSTS] = [16, 32, 16, 32];
const WEIGHTS: [u32; HOSTS] = [1, 4, 2, 1];
/// Reservations, % of the domain's capacity (90 % of what the four jobs do unthrottled).
/// A host of queue depth q among the four jobs' 96 commands gets about q / 96 of the
/// target when the QoS holds nobody back; a reservation well within that (QD 16: 12 %
/// of the capacity, 10.8 % of the unthrottled total against a 16.7 % share) stays
/// reachable however fast the machine is when the test calibrates. 25 % on the QD-16
/// host relied on the others being held and failed the restart test on runs where the
/// calibration came out fast (it varies from 260 K to 460 K IOPS here; the QD-16 hosts
/// then did 55-62 K IOPS for a 61-104 K reservation), and a cooperative QD-16 host at
/// 15 % fell 3-10 % short in such runs.
const RES_PCT: [u64; HOSTS] = [12, 16, 12, 12];
const GROUP: &str = "tenant";
/// The group's reservation and limit, % of the domain's capacity (hosts 3 and 4 reserve
/// 12 % each of their own).
const GROUP_MIN_PCT: u64 = 30;
const GROUP_MAX_PCT: u64 = 35;
/// bdev_nvme's reconnect delay after a lost connection (s).
const RECONNECT_DELAY_S: u64 = 1;
/// Longest the churn keeps a host disconnected (ms).
const MAX_DISCONNECT_MS: u64 = 1500;
const PERIODS_MS: [u64; 3] = [250, 500, 1000];

fn soak_secs() -> u64 {
    std::env::var("SOAK_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&s| s >= 20)
        .unwrap_or(60)
}

fn soak_seed() -> u64 {
    std::env::var("SOAK_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1)
}

/// The longest any I/O may wait (µs): two of the longest period (a command held for
/// want of tokens waits at most until the next period's tokens, and a limited host
/// until the period after), plus the longest disconnection and bdev_nvme's reconnect
/// delay, plus 2 s for the reconnection itself and the machine's noise.
fn wait_bound_us() -> f64 {
    let max_period = *PERIODS_MS.iter().max().unwrap_or(&1000);
    ((2 * max_period + MAX_DISCONNECT_MS + RECONNECT_DELAY_S * 1000 + 2000) * 1000) as f64
}

/// The soak's domain: weighted sharing, or over the hosts' circulation at
/// `SOAK_IN_FLIGHT` commands (thousandths; issue 39: `operating_point` with
/// `operating_in_flight_milli`).
fn soak_domain(capacity: u64) -> Value {
    let mut d = json!({"name": "d", "capacity_iops": capacity, "capacity_iops_stddev": capacity / 20,
                       "period_ms": 500, "sharing": "weighted"});
    if let Ok(v) = std::env::var("SOAK_IN_FLIGHT") {
        let n: u64 = v.parse().unwrap_or_else(|_| {
            panic!("SOAK_IN_FLIGHT={v:?}: give thousandths of a command, e.g. 40000")
        });
        d["sharing"] = json!("operating_point");
        d["operating_in_flight_milli"] = json!(n);
    }
    d
}

/// xorshift64*: the churn's schedule, reproducible from `SOAK_SEED`.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi - lo + 1)
    }
}

/// The bdev bdevperf's job `i` runs on: the namespace, or the initiator plugin's QoS
/// bdev over it for a cooperative host.
fn job_bdev(s: &Setup, i: usize) -> String {
    if COOPERATIVE.contains(&i) {
        format!("qi{i}")
    } else {
        s.controller(i).bdev()
    }
}

/// The bound on a target's lifetime.
fn max_secs() -> u64 {
    soak_secs() + 600
}

/// A target with the plugin: one 64 MiB malloc bdev split in four (one per bdevperf
/// host, so that verify jobs never write each other's blocks), an 8 MiB one for host
/// 5, domain `d` at `capacity` (reservations and group set when `capacity` is finite),
/// QoS bdevs `qos1..=5`, each exposed to its host only.
fn configured_target(s: &Setup, capacity: u64, throttled: bool) -> Target {
    configured_target_on(s, capacity, throttled, Host1Base::Split, Cores::One)
}

/// Blocks of each host's split of `Malloc0` (64 MiB of 512-byte blocks, in four).
const SPLIT_BLOCKS: u64 = 131072 / HOSTS as u64;

/// What stands under host 1's QoS bdev.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Host1Base {
    /// Its split of `Malloc0`, as for every host.
    Split,
    /// SPDK's error bdev over the split, which fails commands on request
    /// (`bdev_error_inject_error`).
    Error,
    /// SPDK's delay bdev over the split, no delay until `bdev_delay_update_latency`
    /// makes it stall.
    Delay,
}

impl Host1Base {
    /// The bdev under host `i`'s QoS bdev.
    fn of(self, i: usize) -> String {
        match (self, i) {
            (Host1Base::Error, 1) => "EE_Malloc0p0".into(),
            (Host1Base::Delay, 1) => "Delay0".into(),
            _ => format!("Malloc0p{}", i - 1),
        }
    }

    fn create(self, t: &mut Target) {
        match self {
            Host1Base::Split => {}
            Host1Base::Error => {
                t.call("bdev_error_create", json!({"base_name": "Malloc0p0"}));
            }
            Host1Base::Delay => {
                t.call(
                    "bdev_delay_create",
                    json!({"base_bdev_name": "Malloc0p0", "name": self.of(1),
                           "avg_read_latency": 0, "p99_read_latency": 0,
                           "avg_write_latency": 0, "p99_write_latency": 0}),
                );
            }
        }
    }
}

/// Where the target and bdevperf run.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Cores {
    /// The target on core 0, bdevperf's jobs on core 1.
    One,
    /// The target on both cores (a poll group on each), its reactor on core 1 under a
    /// CPU quota ([`Cores::reactor_quota`]); bdevperf on core 1 with each host's job
    /// split in two (half its queue depth and half its blocks each, a thread and so an
    /// I/O queue pair each), so that its I/O queue pairs can land on both poll groups.
    /// (bdevperf on both cores starved one host at about 2,000 IOPS, also with no QoS in
    /// the path: [`two_poll_groups_initiator_probe`].)
    Two,
}

impl Cores {
    fn target_mask(self) -> &'static str {
        match self {
            Cores::One => "0x1",
            Cores::Two => "0x3",
        }
    }

    fn bdevperf_mask(self) -> &'static str {
        match self {
            Cores::One | Cores::Two => "0x2",
        }
    }

    /// The CPU quota on the target's reactor on core 1 ([`PG_QUOTA_CPUS`]) where the
    /// target runs there, so that bdevperf keeps a known part of that core; lifted when
    /// dropped.
    fn reactor_quota(self, t: &Target) -> Option<CpuQuota> {
        match self {
            Cores::One => None,
            Cores::Two => {
                let q = CpuQuota::attach_threads(t.pid().expect("the target runs"), "reactor_1")
                    .expect("a CPU quota on the target's reactor_1 (cgroup-v1 cpu controller)");
                assert!(
                    q.limit_cpus(pg_quota_cpus(), PG_QUOTA_PERIOD_US),
                    "set the CPU quota"
                );
                Some(q)
            }
        }
    }

    /// Host `i`'s bdevperf jobs on `bdev`.
    fn jobs(self, bdev: &str, rw: &str, i: usize) -> Vec<Job> {
        let qd = QDS[i - 1];
        match self {
            Cores::One => vec![Job::new(bdev, rw, 4096, qd)],
            Cores::Two => {
                let half = SPLIT_BLOCKS / 2;
                vec![
                    Job::new(bdev, rw, 4096, qd / 2).on_blocks(0, half),
                    Job::new(bdev, rw, 4096, qd - qd / 2).on_blocks(half, half),
                ]
            }
        }
    }
}

/// [`configured_target`] with `base1` under host 1's QoS bdev and `nvmf_tgt` on
/// `cores`.
fn configured_target_on(
    s: &Setup,
    capacity: u64,
    throttled: bool,
    base1: Host1Base,
    cores: Cores,
) -> Target {
    let mut t = s.target_on(max_secs(), cores.target_mask());
    t.malloc("Malloc0", 131072, 512);
    t.call(
        "bdev_split_create",
        json!({"base_bdev": "Malloc0", "split_count": HOSTS}),
    );
    base1.create(&mut t);
    t.malloc("Malloc1", 16384, 512);
    t.call("qos_domain_create", soak_domain(capacity));
    if throttled {
        let cfg = HostCfg::initial(capacity);
        t.call(
            "qos_group_create",
            json!({"domain": "d", "name": GROUP, "min_iops": capacity * GROUP_MIN_PCT / 100,
                   "max_iops": capacity * GROUP_MAX_PCT / 100, "weight": 2}),
        );
        for (i, h) in cfg.iter().enumerate() {
            t.call("qos_host_set", h.params(i + 1));
        }
    }
    let bdevs: Vec<String> = (1..=CHURN_HOST)
        .map(|i| {
            let base = if i == CHURN_HOST {
                "Malloc1".to_string()
            } else {
                base1.of(i)
            };
            t.qos_bdev_for_host(i, &base, "d")
        })
        .collect();
    expose_per_host(&mut t, &bdevs, s.port);
    t
}

/// One host's configuration, as the churn keeps it.
#[derive(Debug, Clone)]
struct HostCfg {
    min: u64,
    max: Option<u64>,
    weight: u32,
    group: bool,
}

impl HostCfg {
    fn initial(capacity: u64) -> Vec<HostCfg> {
        (0..HOSTS)
            .map(|i| HostCfg {
                min: capacity * RES_PCT[i] / 100,
                // Host 2 (weight 4, QD 32) and host 4 meet their limits.
                max: match i {
                    1 => Some(capacity * 20 / 100),
                    3 => Some(capacity * 14 / 100),
                    _ => None,
                },
                weight: WEIGHTS[i],
                group: COOPERATIVE.contains(&(i + 1)),
            })
            .collect()
    }

    fn params(&self, host: usize) -> Value {
        let mut p = json!({"domain": "d", "host_nqn": host_nqn(host), "min_iops": self.min,
                           "weight": self.weight});
        if let Some(m) = self.max {
            p["max_iops"] = json!(m);
        }
        if self.group {
            p["group"] = json!(GROUP);
        }
        p
    }
}

fn bdevperf(s: &Setup, secs: u32, rw: &str) -> Bdevperf {
    bdevperf_on(s, secs, rw, &[1, 2, 3, 4])
}

/// bdevperf with a `rw` job for each of `hosts` (QD of [`QDS`]).
fn bdevperf_on(s: &Setup, secs: u32, rw: &str, hosts: &[usize]) -> Bdevperf {
    // bdev_nvme retries I/O failed by a lost connection or a reset for ever and
    // reconnects every RECONNECT_DELAY_S, so a disconnection delays I/O, never fails it.
    bdevperf_retrying(s, secs, rw, hosts, -1)
}

/// [`bdevperf_on`] with bdev_nvme's `bdev_retry_count` (0: an error the target returns
/// fails the I/O in bdevperf, where it is counted).
fn bdevperf_retrying(s: &Setup, secs: u32, rw: &str, hosts: &[usize], retry: i32) -> Bdevperf {
    bdevperf_with(
        s,
        secs,
        rw,
        hosts,
        json!({"bdev_retry_count": retry}),
        Cores::One,
    )
}

/// bdevperf with a `rw` job for each of `hosts` (QD of [`QDS`]) on `cores`, bdev_nvme
/// set up with `nvme_options` (`bdev_nvme_set_options`).
fn bdevperf_with(
    s: &Setup,
    secs: u32,
    rw: &str,
    hosts: &[usize],
    nvme_options: Value,
    cores: Cores,
) -> Bdevperf {
    let mut cfg: Vec<Value> =
        vec![json!({"method": "bdev_nvme_set_options", "params": nvme_options})];
    for &i in hosts {
        let mut a = s.controller(i).attach();
        a["params"]["ctrlr_loss_timeout_sec"] = json!(-1);
        a["params"]["reconnect_delay_sec"] = json!(RECONNECT_DELAY_S);
        cfg.push(a);
    }
    for i in COOPERATIVE.into_iter().filter(|i| hosts.contains(i)) {
        cfg.push(json!({"method": "qos_ini_bdev_create",
                        "params": {"name": job_bdev(s, i), "base_bdev_name": s.controller(i).bdev()}}));
    }
    cfg.push(json!({"method": "bdev_wait_for_examine"}));
    let jobs = hosts
        .iter()
        .flat_map(|&i| cores.jobs(&job_bdev(s, i), rw, i))
        .collect();
    let config = json!({"subsystems": [{"subsystem": "bdev", "config": cfg}]});
    // -f: a job goes on after a failed I/O (a controller reset fails what is in flight).
    s.bdevperf_on(true, config, jobs, secs, &["-f"], cores.bdevperf_mask())
}

/// What the same four jobs do through the plugin with no throttling (IOPS).
fn calibrate(s: &Setup, rw: &str, cores: Cores) -> f64 {
    let t = configured_target_on(s, 100_000_000, false, Host1Base::Split, cores);
    let _q = cores.reactor_quota(&t);
    let all = [1, 2, 3, 4];
    let nvme = json!({"bdev_retry_count": -1});
    let total = bdevperf_with(s, 5, rw, &all, nvme, cores)
        .run()
        .total_iops();
    println!("  unthrottled through the plugin: {total:.0} IOPS (4 {rw} hosts, {cores:?} core(s))");
    total
}

/// Host 5: the minimal NVMe/TCP host reading 4 KiB blocks one at a time, reconnecting
/// when its connection or namespace goes away. Counts reads that succeeded, failed
/// (namespace deleted under it), and hung (no completion within the socket's 10 s
/// timeout while connected).
#[derive(Default)]
struct ChurnHostCounts {
    ok: AtomicU64,
    errors: AtomicU64,
    reconnects: AtomicU64,
    hung: AtomicU64,
}

fn churn_host(port: u16, stop: Arc<AtomicBool>, c: Arc<ChurnHostCounts>) {
    let mut lba = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let Ok((_admin, mut io)) = connect_io(port, &subsys_nqn(CHURN_HOST), &host_nqn(CHURN_HOST))
        else {
            std::thread::sleep(Duration::from_millis(200));
            continue;
        };
        c.reconnects.fetch_add(1, Ordering::Relaxed);
        let mut buf = Vec::new();
        let mut failed_in_row = 0;
        while !stop.load(Ordering::Relaxed) && failed_in_row < 20 {
            lba = (lba + 8) % 16384;
            let sqe = Sqe::new(0x02, 1).cdw(10, lba as u32).cdw(11, 0).cdw(12, 7);
            match read_once(&mut io, sqe, &mut buf) {
                Ok(true) => {
                    failed_in_row = 0;
                    c.ok.fetch_add(1, Ordering::Relaxed);
                }
                Ok(false) => {
                    failed_in_row += 1;
                    c.errors.fetch_add(1, Ordering::Relaxed);
                    std::thread::sleep(Duration::from_millis(50));
                }
                Err(e) => {
                    if timed_out(&e) {
                        c.hung.fetch_add(1, Ordering::Relaxed);
                    }
                    break;
                }
            }
        }
    }
}

fn read_once(io: &mut Qpair, sqe: Sqe, buf: &mut Vec<u8>) -> std::io::Result<bool> {
    let c = io.command(sqe, 4096, buf)?;
    Ok(c.ok() && buf.len() == 4096)
}

/// One churn event: when (epoch of the domain when it happened) and whom it touched.
#[derive(Debug, Clone)]
struct Event {
    epoch: u64,
    what: String,
    /// Host touched (1-based); `None`: every host.
    host: Option<usize>,
    /// Periods after which the reservation must be met again.
    settle: u64,
}

/// The churn: applies one random action to the target or bdevperf, returns the event
/// (or `None` when the target refused it, e.g. a reservation that no longer fits).
struct Churn {
    rng: Rng,
    /// The target's port (listeners are removed and added back).
    port: u16,
    capacity: u64,
    period_ms: u64,
    hosts: Vec<HostCfg>,
    refused: u64,
    counts: BTreeMap<&'static str, u64>,
    /// Controller resets per host (index = host).
    resets: [u64; HOSTS + 1],
}

impl Churn {
    fn step(&mut self, t: &mut Target, b: &Bdevperf, epoch: u64) -> Option<Event> {
        let action = self.rng.below(8);
        let host = self.rng.range(1, HOSTS as u64) as usize;
        let settle = 2;
        let (name, ev): (&'static str, Option<Event>) = match action {
            0 => {
                // Reservation and limit up or down, within what the host's queue depth
                // carries with nobody held (QD 16: 16% of capacity, QD 32: 28%; more is a
                // reservation its queue depth may not reach, see RES_PCT; the soak checks
                // reservations only in settled periods).
                let mut h = self.hosts[host - 1].clone();
                let pct = self.rng.range(2, if QDS[host - 1] <= 16 { 16 } else { 28 });
                h.min = self.capacity * pct / 100;
                h.max = match self.rng.below(3) {
                    0 => None,
                    _ => Some(h.min + self.capacity * self.rng.range(3, 15) / 100),
                };
                if h.group && h.min > self.capacity * 15 / 100 {
                    h.min = self.capacity * 15 / 100;
                }
                let ok = t.rpc("qos_host_set", h.params(host)).is_ok();
                if ok {
                    self.hosts[host - 1] = h;
                }
                (
                    "host_set",
                    ok.then(|| self.event(epoch, "host_set", Some(host), settle)),
                )
            }
            1 => {
                let p = Duration::from_millis(self.period_ms);
                t.call(
                    "qos_host_remove",
                    json!({"domain": "d", "host_nqn": host_nqn(host)}),
                );
                std::thread::sleep(p);
                t.call("qos_host_set", self.hosts[host - 1].params(host));
                let e = self.event(epoch + 1, "host_remove_set", Some(host), settle + 1);
                ("host_remove_set", Some(e))
            }
            2 => {
                let cap = self.capacity * self.rng.range(85, 105) / 100;
                let period = PERIODS_MS[self.rng.below(3) as usize];
                let release = if self.rng.below(2) == 0 {
                    "paced"
                } else {
                    "start"
                };
                let ok = t
                    .rpc(
                        "qos_domain_update",
                        json!({"name": "d", "capacity_iops": cap, "period_ms": period,
                               "release": release}),
                    )
                    .is_ok();
                if ok {
                    self.period_ms = period;
                }
                (
                    "domain_update",
                    ok.then(|| self.event(epoch, "domain_update", None, settle)),
                )
            }
            3 => {
                // A cooperative host in or out of the group.
                let host = COOPERATIVE[self.rng.below(2) as usize];
                let mut h = self.hosts[host - 1].clone();
                h.group = !h.group;
                h.min = h.min.min(self.capacity * 15 / 100);
                let ok = t.rpc("qos_host_set", h.params(host)).is_ok();
                if ok {
                    self.hosts[host - 1] = h;
                }
                (
                    "group_move",
                    ok.then(|| self.event(epoch, "group_move", Some(host), settle)),
                )
            }
            4 => {
                let ok = b
                    .rpc(
                        "bdev_nvme_reset_controller",
                        json!({"name": Controller::of_host(host, self.port).name}),
                        Duration::from_secs(30),
                    )
                    .is_ok();
                self.resets[host] += ok as u64;
                let e = self.event(epoch, "ctrlr_reset", Some(host), settle + 2);
                ("ctrlr_reset", ok.then_some(e))
            }
            5 => {
                let listener = json!({"nqn": subsys_nqn(host), "listen_address": {
                    "trtype": "TCP", "adrfam": "IPv4", "traddr": "127.0.0.1",
                    "trsvcid": self.port.to_string()}});
                t.call("nvmf_subsystem_remove_listener", listener.clone());
                let down = self.rng.range(200, MAX_DISCONNECT_MS);
                std::thread::sleep(Duration::from_millis(down));
                t.call("nvmf_subsystem_add_listener", listener);
                // Reconnected within the reconnect delay, plus the periods to settle.
                let reconnect = (RECONNECT_DELAY_S * 1000 + down).div_ceil(self.period_ms) + 1;
                let e = self.event(epoch, "disconnect", Some(host), settle + reconnect);
                ("disconnect", Some(e))
            }
            6 => {
                // The bypass (issue 38) on for a moment under load, then off: every
                // held command goes at once and holding starts again, with nothing
                // lost or completed twice. The periods it covers are not judged.
                let on = self.rng.range(300, 1500);
                let flip = |t: &mut Target, bypass: bool| {
                    t.call("qos_domain_update", json!({"name": "d", "bypass": bypass}));
                };
                flip(t, true);
                std::thread::sleep(Duration::from_millis(on));
                flip(t, false);
                let e = self.event(
                    epoch,
                    "bypass",
                    None,
                    settle + on.div_ceil(self.period_ms) + 1,
                );
                ("bypass", Some(e))
            }
            _ => {
                t.call(
                    "qos_bdev_delete",
                    json!({"name": format!("qos{CHURN_HOST}")}),
                );
                t.call(
                    "qos_bdev_create",
                    json!({"name": format!("qos{CHURN_HOST}"), "base_bdev_name": "Malloc1",
                           "domain": "d", "host_nqn": host_nqn(CHURN_HOST)}),
                );
                t.call(
                    "nvmf_subsystem_add_ns",
                    json!({"nqn": subsys_nqn(CHURN_HOST),
                           "namespace": {"bdev_name": format!("qos{CHURN_HOST}")}}),
                );
                ("bdev_delete_create", None)
            }
        };
        *self.counts.entry(name).or_default() += 1;
        if ev.is_none() && name != "bdev_delete_create" {
            self.refused += 1;
        }
        ev
    }

    fn event(&self, epoch: u64, what: &str, host: Option<usize>, settle: u64) -> Event {
        Event {
            epoch,
            what: what.into(),
            host,
            settle,
        }
    }
}

/// Settled periods (from `settle` periods after each event touching a host to the
/// period before the next such event) and how many met the reservation: per host, and
/// per kind of the event they followed.
type MetOf = BTreeMap<String, (u64, u64)>;

fn settled_periods(
    h: &History,
    events: &[Event],
    last_epoch: u64,
) -> (BTreeMap<usize, (u64, u64)>, MetOf) {
    let mut out = BTreeMap::new();
    let mut by_kind = MetOf::new();
    for i in 1..=HOSTS {
        let touching: Vec<&Event> = events
            .iter()
            .filter(|e| e.host.is_none_or(|x| x == i))
            .collect();
        let (mut met, mut total) = (0u64, 0u64);
        for (k, e) in touching.iter().enumerate() {
            let from = e.epoch + e.settle + 1;
            let to = touching.get(k + 1).map_or(last_epoch, |n| n.epoch);
            let kind = by_kind.entry(e.what.clone()).or_default();
            for ep in from..to {
                if let Some(p) = h.of(&host_nqn(i)).get(&ep) {
                    total += 1;
                    met += p.met as u64;
                    kind.1 += 1;
                    kind.0 += p.met as u64;
                }
            }
        }
        out.insert(i, (met, total));
    }
    (out, by_kind)
}

fn iostat(t: &mut Target, bdev: &str) -> [u64; 4] {
    let v = t.call("bdev_get_iostat", json!({"name": bdev}));
    let b = &v["bdevs"][0];
    let g = |k: &str| b[k].as_u64().unwrap_or(0);
    [
        g("num_read_ops"),
        g("num_write_ops"),
        g("bytes_read"),
        g("bytes_written"),
    ]
}

/// Reads and writes of each host's QoS bdev and of its base, now.
type IoCounts = BTreeMap<usize, ([u64; 4], [u64; 4])>;

fn io_counts(t: &mut Target, hosts: &[usize]) -> IoCounts {
    io_counts_with(t, hosts, Host1Base::Split)
}

/// [`io_counts`] with `base1` under host 1's QoS bdev.
fn io_counts_with(t: &mut Target, hosts: &[usize], base1: Host1Base) -> IoCounts {
    hosts
        .iter()
        .map(|&i| {
            let q = iostat(t, &format!("qos{i}"));
            (i, (q, iostat(t, &base1.of(i))))
        })
        .collect()
}

/// The audit once everything is quiet: since `start` (counts taken before the run: the
/// base has its own reads, of bdev examination), each QoS bdev did as many reads and
/// writes as its base, and every host's token books balance. Returns the failures.
fn audit(t: &mut Target, start: &IoCounts) -> Vec<String> {
    audit_with(t, start, Host1Base::Split)
}

/// [`audit`] with `base1` under host 1's QoS bdev.
fn audit_with(t: &mut Target, start: &IoCounts, base1: Host1Base) -> Vec<String> {
    let mut bad = Vec::new();
    let hosts: Vec<usize> = start.keys().copied().collect();
    let now = io_counts_with(t, &hosts, base1);
    for (&i, (q1, b1)) in &now {
        let (q0, b0) = start[&i];
        let q: Vec<u64> = q1.iter().zip(q0).map(|(a, b)| a - b).collect();
        let b: Vec<u64> = b1.iter().zip(b0).map(|(a, b)| a - b).collect();
        println!(
            "  audit qos{i}: reads {} writes {} | base reads {} writes {}",
            q[0], q[1], b[0], b[1]
        );
        if q != b {
            bad.push(format!("qos{i} iostat {q:?} != its base's {b:?}"));
        }
    }
    for h in t.compact_stats("d").hosts {
        let nqn = &h.host_nqn;
        let (admitted, completed) = (h.admitted_ios_total, h.completed_total.ios);
        let in_flight = h.in_flight;
        println!(
            "  books {nqn}: admitted {admitted} completed {completed} held {} in flight {:?} \
             ops {:?} bytes",
            h.held, in_flight.ops, in_flight.bytes
        );
        if admitted != completed {
            bad.push(format!(
                "{nqn}: admitted {admitted} != completed {completed}"
            ));
        }
        if h.held != 0 || in_flight.ops != Some(0) || in_flight.bytes != Some(0) {
            bad.push(format!(
                "{nqn}: held {}, in flight {in_flight:?} after the run",
                h.held
            ));
        }
    }
    bad
}

/// What a run polled from domain `d`: its periods, and the span to judge them over
/// (from the first period that began 2 s into the run to the one before the last that
/// ended: the load ends in or just after that one).
struct Polled {
    hist: History,
    from: u64,
    last: u64,
}

impl Polled {
    /// Host `i`'s periods in the span, with their epochs.
    fn periods(&self, i: usize) -> impl Iterator<Item = (u64, &PeriodRec)> {
        let recs = self.hist.of(&host_nqn(i));
        (self.from..self.last).filter_map(move |e| recs.get(&e).map(|p| (e, p)))
    }

    /// Host `i`'s reservation in the span: (periods met, periods).
    fn met(&self, i: usize) -> (u64, u64) {
        self.periods(i)
            .fold((0, 0), |(m, n), (_, p)| (m + p.met as u64, n + 1))
    }

    /// Host `i`'s reservation in the span with the machine's slow spells excused
    /// ([`judged_periods`], the four hosts expected to do `capacity` IOPS together),
    /// printed as `who`'s.
    fn judged(&self, who: &str, i: usize, capacity: u64) -> Judged {
        let all: Vec<usize> = (1..=HOSTS).collect();
        self.judged_among(who, i, &all, capacity)
    }

    /// As [`Polled::judged`], the machine's speed read from hosts `among` alone (expected
    /// to do their part of the domain's `capacity` IOPS together): for a run in which
    /// another host stops by design, whose gap is not a slow spell.
    fn judged_among(&self, who: &str, i: usize, among: &[usize], capacity: u64) -> Judged {
        let epochs: Vec<u64> = (self.from..self.last).collect();
        judged_periods(&self.hist, who, i, among, &epochs, capacity)
    }
}

/// Host `i`'s reservation over `epochs` of `h`, printed as `who`'s, not counting the
/// periods that were a slow spell of the machine (it-harness's judge.rs): those in
/// which hosts `among` together completed less than 90 % of what they did in the run's
/// median period (or of their part of the domain's `capacity` IOPS, 90 % of the bare
/// rate measured in the same run, if less). When that median is below
/// [`LOADED_FRACTION`] of their part the whole run was slow: only periods at >= 90 % of
/// it are judged. Nor are the periods too tight to judge: those in which their
/// reservations (as [`configured_target`] sets them) took more than 90 % of what they
/// did. A period at the expected rate counts: a host short in it got less because the
/// others got more.
fn judged_periods(
    h: &History,
    who: &str,
    i: usize,
    among: &[usize],
    epochs: &[u64],
    capacity: u64,
) -> Judged {
    let nqns: Vec<String> = among.iter().map(|&i| host_nqn(i)).collect();
    let per_period = |iops: u64| (iops as f64 * h.period.as_secs_f64()) as u64;
    let cap = per_period(capacity * among.len() as u64 / HOSTS as u64);
    let cfg = HostCfg::initial(capacity);
    let reserved: Vec<u64> = among.iter().map(|&i| per_period(cfg[i - 1].min)).collect();
    // The tenant group's reservation, as `configured_target_on` sets it, over the
    // members judged here (it is above their own: 30 % against 12 + 12 %).
    let members: Vec<usize> = (0..among.len())
        .filter(|&k| cfg[among[k] - 1].group)
        .collect();
    let groups: Vec<GroupReservation> = if members.is_empty() {
        Vec::new()
    } else {
        vec![GroupReservation {
            members,
            ops: per_period(capacity * GROUP_MIN_PCT / 100),
        }]
    };
    let median = h.median_served(&nqns, epochs);
    let (expected, loaded) = expected_served(median, cap);
    let j = h.judge_reservation(&host_nqn(i), (&nqns, &reserved, &groups), epochs, expected);
    let (met, n) = epochs
        .iter()
        .filter_map(|e| h.of(&host_nqn(i)).get(e))
        .fold((0, 0), |(m, n), p| (m + p.met as u64, n + 1));
    println!(
        "  {who}: reservation met in {} of {} periods judged ({met} of {n} in all); hosts \
         {among:?}' median {median} ops a period, {:.0} % of the capacity's {cap}{}; {} \
         excused as slow (below 90 % of {} ops) and {} as too tight (of reservations of {} \
         ops and the group's {:?}, each counted up to what its hosts did, more than 90 % of \
         what the hosts did), missed in {:?}",
        j.met,
        j.judged,
        median as f64 * 100.0 / cap.max(1) as f64,
        if loaded {
            " (the machine slow throughout)"
        } else {
            ""
        },
        j.excused.len() as u64 - j.tight,
        j.expected,
        j.tight,
        reserved.iter().sum::<u64>(),
        groups.first().map(|g| g.ops),
        j.excused_missed()
    );
    // What a judged miss looked like, for the log of a failing run.
    let limit = cfg[i - 1].max.map(per_period);
    for e in &j.missed {
        let ops = h.of(&host_nqn(i)).get(e).map_or(0, |p| p.ops);
        println!(
            "    judged miss in epoch {e}: host {i} did {ops} ops of its {} reserved (limit \
             {limit:?}); hosts {among:?} did {} together",
            per_period(cfg[i - 1].min),
            h.served(&nqns, *e)
        );
    }
    j
}

/// [`judge_reservation`] over the periods `j` judged. With none judged (the machine
/// slow throughout the run: other jobs on its cores) the reservation cannot be judged:
/// said, and a failure under `NVMF_QOS_ACCEPTANCE=1`, where at least half the periods
/// must be judged.
fn judge_excused(bad: &mut Vec<String>, who: &str, j: &Judged) {
    let periods = j.judged + j.excused.len() as u64;
    if acceptance() && j.judged * 2 < periods {
        bad.push(format!(
            "{who}: only {} of {periods} periods judged (the machine slow in the others)",
            j.judged
        ));
    }
    if j.judged == 0 && periods > 0 {
        println!(
            "  {who}: reservation not judged: the machine was slow in all {periods} periods \
             (the four hosts below 90 % of {} ops)",
            j.expected
        );
        return;
    }
    judge_reservation(bad, who, (j.met, j.judged));
}

/// Polls domain `d` every 250 ms for `secs` seconds, calling `each` after every poll
/// with the time since the call and the latest period's epoch.
fn poll_run(t: &mut Target, secs: u32, mut each: impl FnMut(&mut Target, Duration, u64)) -> Polled {
    let t0 = Instant::now();
    let mut hist = History::new("d");
    let mut from = None;
    while t0.elapsed() < Duration::from_secs(secs as u64) {
        std::thread::sleep(Duration::from_millis(250));
        hist.try_poll(t);
        let elapsed = t0.elapsed();
        if elapsed > Duration::from_secs(2) && from.is_none() {
            from = Some(hist.epoch + 1);
        }
        each(t, elapsed, hist.epoch);
    }
    Polled {
        last: hist.epoch.saturating_sub(1),
        from: from.unwrap_or(2),
        hist,
    }
}

/// A reservation met in `met` of `n` periods: a failure in `bad` below 90 % of them
/// (99 % under `NVMF_QOS_ACCEPTANCE=1`, as the machine's other load can take capacity).
fn judge_reservation(bad: &mut Vec<String>, who: &str, (met, n): (u64, u64)) {
    let frac = met as f64 / n.max(1) as f64;
    let need = if acceptance() { 0.99 } else { 0.9 };
    if n == 0 || frac < need {
        bad.push(format!(
            "{who}'s reservation met in {:.1}% of periods (< {:.0}%)",
            frac * 100.0,
            need * 100.0
        ));
    }
}

#[test]
fn soak_with_churn_loses_nothing() {
    if let Some(s) = setup_or_skip("soak") {
        soak(&s, Cores::One);
    }
}

/// The soak with the target on two poll groups and each host's I/O on two queue pairs
/// (issue 29): the same churn and audit.
#[test]
fn soak_with_churn_on_two_poll_groups_loses_nothing() {
    if let Some(s) = setup_or_skip("soak on two poll groups") {
        soak(&s, Cores::Two);
    }
}

fn soak(s: &Setup, cores: Cores) {
    let secs = soak_secs();
    let seed = soak_seed();
    println!("soak: {secs} s, churn seed {seed}, {cores:?} core(s)");
    let unthrottled = calibrate(s, "verify", cores);
    let capacity = (unthrottled * 0.9) as u64;
    let mut t = configured_target_on(s, capacity, true, Host1Base::Split, cores);
    let _quota = cores.reactor_quota(&t);
    let all = [1, 2, 3, 4];
    let start_counts = io_counts(&mut t, &all);
    let nvme = json!({"bdev_retry_count": -1});
    let mut b = bdevperf_with(s, secs as u32, "verify", &all, nvme, cores);
    let stop = Arc::new(AtomicBool::new(false));
    let counts = Arc::new(ChurnHostCounts::default());
    let host5 = {
        let (stop, counts) = (stop.clone(), counts.clone());
        let port = s.port;
        std::thread::spawn(move || churn_host(port, stop, counts))
    };
    let mut churn = Churn {
        rng: Rng::new(seed),
        port: s.port,
        capacity,
        period_ms: 500,
        hosts: HostCfg::initial(capacity),
        refused: 0,
        counts: BTreeMap::new(),
        resets: [0; HOSTS + 1],
    };
    let mut hist = History::new("d");
    let mut events: Vec<Event> = Vec::new();
    let mut rss: Vec<(f64, u64)> = Vec::new();
    let t0 = Instant::now();
    let run = b.start_tests();
    let mut next_churn = t0 + Duration::from_secs(3);
    let mut next_report = t0 + Duration::from_secs(30);
    let end = t0 + Duration::from_secs(secs);
    while Instant::now() < end {
        std::thread::sleep(Duration::from_millis(250));
        hist.try_poll(&mut t);
        if let Some(r) = t.rss_kib() {
            rss.push((t0.elapsed().as_secs_f64(), r));
        }
        assert!(t.is_running(), "nvmf_tgt died; log:\n{}", t.log_tail(40));
        let now = Instant::now();
        // No churn in the last 5 s: the run ends settled.
        if now >= next_churn && now + Duration::from_secs(5) < end {
            if let Some(e) = churn.step(&mut t, &b, hist.epoch) {
                events.push(e);
            }
            next_churn = Instant::now() + Duration::from_millis(churn.rng.range(1500, 4000));
        }
        if now >= next_report {
            println!(
                "  [{:>5.0} s] epoch {} | churn {:?} (refused {}) | host 5: {} reads, {} \
                 errors, {} connects | RSS {} kB",
                t0.elapsed().as_secs_f64(),
                hist.epoch,
                churn.counts,
                churn.refused,
                counts.ok.load(Ordering::Relaxed),
                counts.errors.load(Ordering::Relaxed),
                counts.reconnects.load(Ordering::Relaxed),
                rss.last().map_or(0, |r| r.1),
            );
            next_report += Duration::from_secs(30);
        }
    }
    // The period bdevperf ends in is partial: settled periods end before it.
    let last_epoch = hist.epoch;
    let out = b.finish_tests(run);
    stop.store(true, Ordering::Relaxed);
    host5.join().expect("host 5 thread");
    hist.try_poll(&mut t);
    std::thread::sleep(Duration::from_millis(500));
    let jr = &out.jobs;

    println!("soak results ({secs} s, seed {seed}, capacity {capacity} IOPS):");
    println!(
        "  churn actions {:?}, refused {}",
        churn.counts, churn.refused
    );
    let bound = wait_bound_us();
    let mut bad = Vec::new();
    for i in 1..=HOSTS {
        let r = jr.get(&job_bdev(s, i)).cloned().unwrap_or_default();
        println!(
            "  host {i} ({}, QD {}): {:.0} IOPS, failed {}, max latency {:.0} us",
            if COOPERATIVE.contains(&i) {
                "cooperative"
            } else {
                "plain"
            },
            QDS[i - 1],
            r.iops,
            r.io_failed,
            r.max_us
        );
        if r.iops <= 0.0 {
            bad.push(format!("host {i} did no I/O"));
        }
        // SPDK's bdev_nvme fails the I/O in flight when asked to reset a controller
        // (it sets "do not retry" on them, by design); nothing else may fail.
        let may_fail = churn.resets[i] * QDS[i - 1] as u64;
        if r.io_failed > may_fail {
            bad.push(format!(
                "host {i}: {} failed I/O, more than its {} resets x QD {} can explain",
                r.io_failed,
                churn.resets[i],
                QDS[i - 1]
            ));
        }
        if r.max_us > bound {
            bad.push(format!(
                "host {i}: an I/O waited {:.0} us > bound {bound:.0}",
                r.max_us
            ));
        }
    }
    let lower = out.log.to_lowercase();
    for word in ["mismatch", "miscompare"] {
        if lower.contains(word) {
            bad.push(format!("bdevperf reported a verify error ({word})"));
        }
    }
    let (ok5, err5, hung5) = (
        counts.ok.load(Ordering::Relaxed),
        counts.errors.load(Ordering::Relaxed),
        counts.hung.load(Ordering::Relaxed),
    );
    println!(
        "  host 5 (minimal host, bdev deleted under it {} times): {ok5} reads, {err5} \
         refused while its namespace was gone, {} connections, {hung5} hung",
        churn.counts.get("bdev_delete_create").copied().unwrap_or(0),
        counts.reconnects.load(Ordering::Relaxed)
    );
    if hung5 > 0 {
        bad.push(format!("host 5: {hung5} reads never completed"));
    }
    if ok5 == 0 {
        bad.push("host 5 never read".into());
    }
    let held_long = t.compact_stats("d").held_longer_than(2 * 1_000_000_000);
    println!("  commands held longer than 2 s at the target: {held_long}");
    if held_long > 0 {
        bad.push(format!("{held_long} commands held longer than 2 s"));
    }
    bad.extend(audit(&mut t, &start_counts));
    // RSS: after warm-up (the first fifth of the run, at least 30 s: the 600 s run
    // shows it settling by then) it stays flat. On two poll groups it settles later
    // (a 150 s run: 42,360 kB at 30 s, then +344, +124, 0, +64 kB every 30 s), so
    // from 90 s: a 60 s run there prints it and does not judge it.
    let settled_after = match cores {
        Cores::One => 30.0,
        Cores::Two => 90.0,
    };
    let warm = (secs as f64 / 5.0).max(settled_after);
    let after: Vec<u64> = rss.iter().filter(|r| r.0 >= warm).map(|r| r.1).collect();
    if after.len() < 2 {
        let (first, last) = (
            rss.first().map_or(0, |r| r.1),
            rss.last().map_or(0, |r| r.1),
        );
        println!(
            "  nvmf_tgt RSS: {first} kB at the start, {last} kB at the end (not judged: the \
             run ends before {warm:.0} s of warm-up)"
        );
    }
    if let (Some(&first), Some(&max)) = (after.first(), after.iter().max()) {
        let growth = (max as f64 - first as f64) / first as f64;
        println!(
            "  nvmf_tgt RSS: {first} kB after warm-up, peak {max} kB ({:+.2}%)",
            growth * 100.0
        );
        if growth > 0.01 {
            bad.push(format!(
                "nvmf_tgt RSS grew {:.2}% after warm-up",
                growth * 100.0
            ));
        }
    }
    let (settled, by_kind) = settled_periods(&hist, &events, last_epoch);
    let (mut met, mut total) = (0, 0);
    for (i, (m, n)) in &settled {
        println!("  host {i}: reservation met in {m} of {n} settled periods");
        met += m;
        total += n;
    }
    for (k, (m, n)) in &by_kind {
        println!("  after {k}: met in {m} of {n} settled periods");
    }
    let frac = if total == 0 {
        1.0
    } else {
        met as f64 / total as f64
    };
    println!(
        "  reservations met in {met} of {total} settled periods ({:.1}%), {} events",
        frac * 100.0,
        events.len()
    );
    if acceptance() && frac < 0.99 {
        bad.push(format!(
            "reservations met in {:.1}% of settled periods (< 99%)",
            frac * 100.0
        ));
    }
    assert!(t.is_running(), "nvmf_tgt died; log:\n{}", t.log_tail(40));
    t.stop(30);
    assert!(bad.is_empty(), "soak failed:\n  {}", bad.join("\n  "));
}

#[test]
fn restart_after_sigkill_restores_configuration_and_reservations() {
    let Some(s) = setup_or_skip("restart after SIGKILL") else {
        return;
    };
    // Reads only: a malloc bdev comes back empty, so a verify job would see the blocks it
    // wrote before the crash as zeros.
    let unthrottled = calibrate(&s, "randread", Cores::One);
    let capacity = (unthrottled * 0.9) as u64;
    let mut t = configured_target(&s, capacity, true);
    let cfg_path = t.save_config_file("restart");
    let before = (
        t.call("qos_domain_get", json!({"name": "d"})),
        t.call("qos_host_get", json!({"domain": "d"})),
        t.call("qos_group_get", json!({"domain": "d"})),
    );
    let secs = 30u32;
    let mut b = bdevperf(&s, secs, "randread");
    let t0 = Instant::now();
    let run = b.start_tests();
    let mut hist = History::new("d");
    while t0.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(250));
        hist.try_poll(&mut t);
    }
    let crash_epoch = hist.epoch;
    t.kill_hard();
    let killed = Instant::now();
    drop(t);
    let mut t = s.target_from(&cfg_path, max_secs());
    let restarted = killed.elapsed();
    let after = (
        t.call("qos_domain_get", json!({"name": "d"})),
        t.call("qos_host_get", json!({"domain": "d"})),
        t.call("qos_group_get", json!({"domain": "d"})),
    );
    let mut hist = History::new("d");
    while t0.elapsed() < Duration::from_secs(secs as u64) {
        std::thread::sleep(Duration::from_millis(250));
        hist.try_poll(&mut t);
    }
    let last = hist.epoch;
    let out = b.finish_tests(run);
    hist.try_poll(&mut t);
    let _ = std::fs::remove_file(&cfg_path);
    let jr = &out.jobs;
    println!(
        "restart: killed at epoch {crash_epoch} after 10 s under load, nvmf_tgt answering \
         RPCs again {:.2} s after SIGKILL (from its save_config)",
        restarted.as_secs_f64()
    );
    let mut bad = Vec::new();
    let res_per_period: Vec<u64> = HostCfg::initial(capacity)
        .iter()
        .map(|h| h.min / 2)
        .collect();
    println!("  reservations per period: {res_per_period:?}");
    if before != after {
        bad.push(format!(
            "configuration differs after restart:\n{before:?}\n{after:?}"
        ));
    }
    for i in 1..=HOSTS {
        let r = jr.get(&job_bdev(&s, i)).cloned().unwrap_or_default();
        if r.io_failed > 0 {
            bad.push(format!("host {i}: {} failed I/O", r.io_failed));
        }
        // Busy: more than the few reads of the target's own bdev examination at start.
        let Some(back) = hist.first_busy(&host_nqn(i), 0, 100) else {
            bad.push(format!("host {i} never reconnected"));
            continue;
        };
        // The first period with I/O is the one it reconnected in (partial): met again
        // within 2 periods means from the second period after it on. Slow spells of the
        // machine are excused (judged_periods: a run failed once with all four hosts
        // short at once in its last 5 periods).
        let recs = hist.of(&host_nqn(i));
        let settled: Vec<u64> = recs.range(back + 2..last).map(|(e, _)| *e).collect();
        let who = format!("host {i} after the restart");
        let all: Vec<usize> = (1..=HOSTS).collect();
        let j = judged_periods(&hist, &who, i, &all, &settled, capacity);
        let missed_first: Vec<u64> = settled
            .iter()
            .filter(|e| !recs[e].met && !j.excused.contains_key(e))
            .copied()
            .take(5)
            .collect();
        let first: Vec<String> = recs
            .range(..8)
            .map(|(e, p)| format!("{e}:{}{}", p.ops, if p.met { "" } else { "!" }))
            .collect();
        println!(
            "  host {i}: ops per period after the restart (! = missed): {}",
            first.join(" ")
        );
        println!(
            "  host {i}: back at epoch {back} of the new target; judged from epoch {} \
             (missed: {missed_first:?}); failed I/O {}, max latency {:.0} us",
            back + 2,
            r.io_failed,
            r.max_us
        );
        if settled.is_empty() {
            bad.push(format!("host {i}: no settled period after the restart"));
        } else if acceptance() && j.met < j.judged {
            // Every period judged under NVMF_QOS_ACCEPTANCE=1 (and at least half judged).
            bad.push(format!(
                "host {i}: reservation missed after the restart at {missed_first:?}"
            ));
        }
        judge_excused(&mut bad, &who, &j);
    }
    t.stop(30);
    assert!(bad.is_empty(), "restart failed:\n  {}", bad.join("\n  "));
}

/// What the hostile host's threads saw.
#[derive(Default)]
struct AttackCounts {
    /// Vendor commands answered, by NVMe status code.
    vendor_status: Mutex<BTreeMap<u8, u64>>,
    /// Largest ACQUIRE grant in one reply (ops).
    max_granted: AtomicU64,
    reads: AtomicU64,
    /// Connections dropped with commands outstanding.
    dropped_with_io: AtomicU64,
    /// A command the target never answered (socket timeout on a live connection).
    hung: AtomicU64,
}

/// Host 2's attack, running until dropped or stopped: vendor commands, a read flood,
/// and a read flood that drops its connection every 20 ms with reads outstanding.
struct Attack {
    stop: Arc<AtomicBool>,
    counts: Arc<AttackCounts>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Attack {
    /// Attacks the target at `port`.
    fn start(port: u16) -> Attack {
        let stop = Arc::new(AtomicBool::new(false));
        let counts = Arc::new(AttackCounts::default());
        let mut threads = Vec::new();
        let (st, c) = (stop.clone(), counts.clone());
        threads.push(std::thread::spawn(move || vendor_flood(port, st, c)));
        let (st, c) = (stop.clone(), counts.clone());
        threads.push(std::thread::spawn(move || {
            read_flood(port, st, c, 31, None)
        }));
        let (st, c) = (stop.clone(), counts.clone());
        threads.push(std::thread::spawn(move || {
            read_flood(port, st, c, 31, Some(Duration::from_millis(20)))
        }));
        Attack {
            stop,
            counts,
            threads,
        }
    }
    /// Stops the threads and returns what they saw.
    fn stop(mut self) -> Arc<AttackCounts> {
        self.stop.store(true, Ordering::Relaxed);
        for a in self.threads.drain(..) {
            a.join().expect("attacker thread");
        }
        self.counts.clone()
    }
}

impl Drop for Attack {
    /// A test that fails while attacking leaves no thread sending.
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// The forged and hostile vendor commands host 2 cycles through: a huge ACQUIRE, an
/// unknown version, a wrong magic, reserved dwords set, a namespace it does not have,
/// a too-short reply buffer, an unknown vendor opcode, and GET_STATE.
/// A socket read that timed out on a live connection: the target never answered.
fn timed_out(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
    )
}

impl AttackCounts {
    fn count_hang(&self, e: &std::io::Error) {
        if timed_out(e) {
            self.hung.fetch_add(1, Ordering::Relaxed);
        }
    }
}

fn forged_commands() -> Vec<(Sqe, u32)> {
    use qos_core::wire::{self, Request};
    let vendor = Sqe::vendor;
    let huge = Request::Acquire {
        ops: u32::MAX as u64,
        bytes: u64::MAX,
    };
    let len = wire::REPLY_LEN as u32;
    vec![
        (vendor(huge), len),
        (vendor(huge).cdw(11, 7), len),
        (vendor(huge).cdw(10, 0xDEAD_BEEF), len),
        (vendor(huge).cdw(12, u32::MAX).cdw(13, u32::MAX), len),
        (vendor(Request::GetState), len),
        (
            {
                let mut q = vendor(huge);
                q.0[4..8].copy_from_slice(&2u32.to_le_bytes());
                q
            },
            len,
        ),
        (vendor(huge), 64),
        (Sqe::new(0xC4, 1).cdw(10, wire::CMD_MAGIC), len),
        (vendor(Request::GetState), len),
    ]
}

fn vendor_flood(port: u16, stop: Arc<AtomicBool>, c: Arc<AttackCounts>) {
    use qos_core::wire::StateReply;
    let cmds = forged_commands();
    let mut buf = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        let Ok((_admin, mut io)) = connect_io(port, &subsys_nqn(2), &host_nqn(2)) else {
            std::thread::sleep(Duration::from_millis(100));
            continue;
        };
        'conn: while !stop.load(Ordering::Relaxed) {
            for &(sqe, len) in &cmds {
                match io.command(sqe, len, &mut buf) {
                    Ok(cpl) => {
                        *c.vendor_status
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .entry(cpl.sc)
                            .or_default() += 1;
                        if cpl.ok()
                            && let Ok(r) = StateReply::decode(&buf)
                        {
                            c.max_granted.fetch_max(r.granted_ops, Ordering::Relaxed);
                        }
                    }
                    Err(e) => {
                        c.count_hang(&e);
                        break 'conn;
                    }
                }
            }
        }
    }
}

/// 4 KiB reads on host 2's namespace, `depth` outstanding; with `drop_after`, the
/// connection is dropped with them outstanding after that long (and made again).
fn read_flood(
    port: u16,
    stop: Arc<AtomicBool>,
    c: Arc<AttackCounts>,
    depth: u16,
    drop_after: Option<Duration>,
) {
    let mut lba = 0u32;
    while !stop.load(Ordering::Relaxed) {
        let Ok((_admin, mut io)) = connect_io(port, &subsys_nqn(2), &host_nqn(2)) else {
            std::thread::sleep(Duration::from_millis(100));
            continue;
        };
        let start = Instant::now();
        let mut outstanding = 0u16;
        let read = |lba: u32| Sqe::new(0x02, 1).cdw(10, lba).cdw(11, 0).cdw(12, 7);
        loop {
            while outstanding < depth {
                lba = (lba + 8) % 32760;
                if io.send(read(lba), 4096).is_err() {
                    break;
                }
                outstanding += 1;
            }
            if stop.load(Ordering::Relaxed) {
                break;
            }
            if drop_after.is_some_and(|d| start.elapsed() >= d) {
                c.dropped_with_io.fetch_add(1, Ordering::Relaxed);
                break;
            }
            match io.recv() {
                Ok(_) => {
                    outstanding -= 1;
                    c.reads.fetch_add(1, Ordering::Relaxed);
                }
                Err(e) => {
                    c.count_hang(&e);
                    break;
                }
            }
        }
        // Dropping the queue pairs closes the connections with whatever is outstanding.
    }
}

#[test]
fn hostile_host_gets_no_more_than_its_limit() {
    let Some(s) = setup_or_skip("hostile host") else {
        return;
    };
    // What the target does for host 1 (plain, bdevperf QD 16) while host 2 attacks,
    // nothing throttled. The attack costs the target CPU that no IOPS budget counts (a
    // connection made and dropped every 20 ms, vendor commands by the thousand): host 1
    // did 37-50 % of what it does alone, varying from run to run, so a reservation set
    // from host 1 alone (40 % of 90 % of it) was decided by how costly the attack was
    // that run (met in 40 of 45 periods once, at 1.7 % above the reservation). A
    // reservation is a promise within the target's capacity; under attack that is this.
    let under_attack = {
        let _t = configured_target(&s, 100_000_000, false);
        let attack = Attack::start(s.port);
        let out = bdevperf_on(&s, 5, "randread", &[1]).run();
        attack.stop();
        if std::env::var("QOS_IT_PG_DEBUG").is_ok() {
            println!("{}", out.tail(60));
        }
        out.total_iops()
    };
    let capacity = (under_attack * 0.9) as u64;
    // Host 1 reserves half of that: the domain hands out at most its capacity, so host
    // 1 gets at most what host 2 leaves of it, and the attack's cost still moves
    // between runs (host 2's reads, unlimited while calibrating, are held to its limit
    // below). With QoS holding its commands, host 1 (QD 16) did 137-140 K IOPS in four
    // runs whatever the calibration said (200-226 K): 60 % of a 226 K calibration
    // (122 K) left it 14 % above its reservation on average and it missed 12 of 44
    // periods; 60 % of 200 K had left it 29 % (44 of 44). What QoS costs a host at
    // saturation is issue 26's subject, not this test's.
    let (good_min, bad_min, bad_max) = (capacity / 2, capacity / 20, capacity / 10);
    let mut t = configured_target(&s, capacity, false);
    t.call(
        "qos_host_set",
        json!({"domain": "d", "host_nqn": host_nqn(1), "min_iops": good_min}),
    );
    t.call(
        "qos_host_set",
        json!({"domain": "d", "host_nqn": host_nqn(2), "min_iops": bad_min,
               "max_iops": bad_max}),
    );
    println!(
        "hostile host: capacity {capacity} IOPS (90% of host 1 under attack, unthrottled, \
         {under_attack:.0}); host 1 reserves {good_min}; host 2 reserves {bad_min}, limited \
         to {bad_max}"
    );
    // Host 2 cannot reach host 1's subsystem, whatever it sends.
    let (_q, c) = Qpair::connect(s.port, &subsys_nqn(1), &host_nqn(2), 0, 0xFFFF)
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(!c.ok(), "host 2 connected to host 1's subsystem");

    let secs = 25u32;
    let start_counts = io_counts(&mut t, &[1, 2]);
    let mut b = bdevperf_on(&s, secs, "randread", &[1]);
    let attack = Attack::start(s.port);
    let run = b.start_tests();
    let polled = poll_run(&mut t, secs, |_, _, _| {});
    let out = b.finish_tests(run);
    let counts = attack.stop();
    std::thread::sleep(Duration::from_millis(1500));
    let jr = &out.jobs;
    let good = jr.get(&job_bdev(&s, 1)).cloned().unwrap_or_default();
    let per_period = |v: u64| v / 2; // period_ms 500
    let (met, n) = polled.met(1);
    let mut over = Vec::new();
    let mut bad_max_seen = 0;
    for (e, p) in polled.periods(2) {
        bad_max_seen = bad_max_seen.max(p.ops);
        if p.ops as f64 > per_period(bad_max) as f64 * 1.01 {
            over.push((e, p.ops));
        }
    }
    let status = counts
        .vendor_status
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    println!(
        "  host 1: {:.0} IOPS, reservation met in {met} of {n} periods under attack, \
         failed {}",
        good.iops, good.io_failed
    );
    println!(
        "  host 2: at most {bad_max_seen} ops in a period (limit {} per period); {} reads \
         completed; {} connections dropped with reads outstanding; vendor replies by status \
         {status:?}; largest ACQUIRE grant {} ops; {} commands never answered",
        per_period(bad_max),
        counts.reads.load(Ordering::Relaxed),
        counts.dropped_with_io.load(Ordering::Relaxed),
        counts.max_granted.load(Ordering::Relaxed),
        counts.hung.load(Ordering::Relaxed),
    );
    let mut bad = Vec::new();
    if !over.is_empty() {
        bad.push(format!("host 2 exceeded its limit in periods {over:?}"));
    }
    if counts.hung.load(Ordering::Relaxed) > 0 {
        bad.push("the target left a command of host 2 unanswered".into());
    }
    if good.io_failed > 0 {
        bad.push(format!("host 1: {} failed I/O", good.io_failed));
    }
    judge_reservation(&mut bad, "host 1 (under attack)", (met, n));
    bad.extend(audit(&mut t, &start_counts));
    assert!(t.is_running(), "nvmf_tgt died; log:\n{}", t.log_tail(40));
    t.stop(30);
    assert!(bad.is_empty(), "hostile host:\n  {}", bad.join("\n  "));
}

/// The base under a QoS bdev misbehaving (issue 29): host 1's QoS bdev stands on SPDK's
/// error bdev. In one run of the four hosts near saturation (the domain at 90 % of what
/// they do unthrottled, reservations and limits as in the soak), the base fails 300
/// reads and 300 writes, then answers 1,000 commands with NOMEM (the bdev layer queues
/// and retries those); in a second run it is deleted under load (hot remove: the QoS
/// bdev goes with it); then both are created again and host 1 runs clean.
/// Checked: host 1 sees exactly the injected failures (bdev_nvme does not retry here),
/// the others none; every I/O reached the base once (iostat), the token books balance
/// with nothing held or in flight after each run; the other hosts' reservations are met
/// (>= 99 % of periods under `NVMF_QOS_ACCEPTANCE=1`, else >= 90 %); nvmf_tgt lives.
/// The errors bdev `bdev` of the target completed, by SPDK status (`bdev_get_iostat`'s
/// `io_error`: "failed", "aborted", ...; the bdev layer counts each I/O's final status).
fn io_errors(t: &mut Target, bdev: &str) -> BTreeMap<String, u64> {
    let v = t.call("bdev_get_iostat", json!({"name": bdev}));
    status_counts(&v["bdevs"][0]["io_error"])
}

/// The NVMe statuses the host's namespace bdev `bdev` in bdevperf got, by status code
/// (bdev_nvme's `nvme_error` counts, kept with `nvme_error_stat`; names as bdev_nvme
/// writes them, e.g. "internal_device_error"); `None` when bdevperf did not answer.
fn nvme_errors(b: &Bdevperf, bdev: &str) -> Option<BTreeMap<String, u64>> {
    let v = b
        .rpc(
            "bdev_get_iostat",
            json!({"name": bdev}),
            Duration::from_secs(5),
        )
        .ok()?;
    Some(status_counts(
        &v["bdevs"][0]["driver_specific"]["nvme_error"]["status_code"],
    ))
}

fn status_counts(v: &Value) -> BTreeMap<String, u64> {
    v.as_object()
        .map(|o| {
            o.iter()
                .filter_map(|(k, n)| Some((k.clone(), n.as_u64()?)))
                .filter(|(_, n)| *n > 0)
                .collect()
        })
        .unwrap_or_default()
}

/// Counts `now` less counts `then`, the zeros left out.
fn status_delta(
    now: &BTreeMap<String, u64>,
    then: &BTreeMap<String, u64>,
) -> BTreeMap<String, u64> {
    now.iter()
        .map(|(k, n)| (k.clone(), n - then.get(k).copied().unwrap_or(0)))
        .filter(|(_, n)| *n > 0)
        .collect()
}

/// The NVMe status nvmf answers a command with when its bdev I/O completed with SPDK
/// status `status` (`spdk_bdev_io_get_nvme_status`), as bdev_nvme names it; `None` for
/// a status that carries its own NVMe status (`nvme_error`) or has no fixed one.
fn nvme_status_of(status: &str) -> Option<&'static str> {
    match status {
        "failed" => Some("internal_device_error"),
        "aborted" => Some("aborted_by_request"),
        _ => None,
    }
}

#[test]
fn base_faults_reach_the_host_and_lose_nothing() {
    const ERROR: Host1Base = Host1Base::Error;
    let Some(s) = setup_or_skip("base faults") else {
        return;
    };
    let rw = "randrw";
    let all = [1, 2, 3, 4];
    let total = {
        let _t = configured_target_on(&s, 100_000_000, false, ERROR, Cores::One);
        let out = bdevperf_retrying(&s, 5, rw, &all, 0).run();
        out.total_iops()
    };
    let capacity = (total * 0.9) as u64;
    let mut t = configured_target_on(&s, capacity, true, ERROR, Cores::One);
    println!("base faults: unthrottled {total:.0} IOPS, capacity {capacity} IOPS");
    let mut bad = Vec::new();

    // Run 1: failures, then NOMEM. bdev_nvme at the hosts counts the NVMe status of
    // every error it gets (`nvme_error_stat`), read during the run (bdevperf exits at
    // its end); the target's bdev layer counts each bdev's errors by SPDK status.
    let start = io_counts_with(&mut t, &all, ERROR);
    let base_errors0 = io_errors(&mut t, &ERROR.of(1));
    let qos_errors0: Vec<_> = all
        .iter()
        .map(|i| io_errors(&mut t, &format!("qos{i}")))
        .collect();
    let secs = 14u32;
    let nvme = json!({"bdev_retry_count": 0, "nvme_error_stat": true});
    let mut b = bdevperf_with(&s, secs, rw, &all, nvme, Cores::One);
    let run = b.start_tests();
    let mut injected = Vec::new();
    let mut host_errors: BTreeMap<usize, BTreeMap<String, u64>> = BTreeMap::new();
    let steps: [(u64, &str, &str, u32); 4] = [
        (3, "read", "failure", 300),
        (3, "write", "failure", 300),
        (7, "read", "nomem", 500),
        (7, "write", "nomem", 500),
    ];
    let polled = poll_run(&mut t, secs, |t, elapsed, _| {
        for &(at, io_type, error_type, num) in &steps {
            let key = (at, io_type, error_type);
            if elapsed >= Duration::from_secs(at) && !injected.contains(&key) {
                t.call(
                    "bdev_error_inject_error",
                    json!({"name": ERROR.of(1), "io_type": io_type, "error_type": error_type,
                           "num": num}),
                );
                println!(
                    "  {:.1} s: {num} {io_type} {error_type}",
                    elapsed.as_secs_f64()
                );
                injected.push(key);
            }
        }
        // The hosts' counts from 10 s on (every failure injected has long reached its
        // host by then; the last reading before bdevperf exits is kept).
        if elapsed >= Duration::from_secs(10) {
            for i in all {
                if let Some(e) = nvme_errors(&b, &s.controller(i).bdev()) {
                    host_errors.insert(i, e);
                }
            }
        }
    });
    let out = b.finish_tests(run);
    std::thread::sleep(Duration::from_millis(1500));
    // The status each error left the base with, the QoS bdev with, and the host got.
    let base_errors = status_delta(&io_errors(&mut t, &ERROR.of(1)), &base_errors0);
    println!(
        "  host 1's base {}: errors by SPDK status {base_errors:?}",
        ERROR.of(1)
    );
    let want_host1: BTreeMap<String, u64> = base_errors
        .iter()
        .map(|(k, n)| {
            let nvme = nvme_status_of(k).map_or_else(|| format!("(base status {k})"), String::from);
            (nvme, *n)
        })
        .collect();
    for (k, &i) in all.iter().enumerate() {
        let qos = status_delta(&io_errors(&mut t, &format!("qos{i}")), &qos_errors0[k]);
        let host = host_errors.get(&i);
        println!(
            "  host {i}: qos{i} errors by SPDK status {qos:?}; NVMe statuses host {i} got: {host:?}"
        );
        let (want_qos, want_host) = if i == 1 {
            (base_errors.clone(), want_host1.clone())
        } else {
            (BTreeMap::new(), BTreeMap::new())
        };
        if qos != want_qos {
            bad.push(format!(
                "qos{i} completed errors {qos:?}, its base {want_qos:?} (each with the base's status)"
            ));
        }
        if host != Some(&want_host) {
            bad.push(format!(
                "host {i} got NVMe statuses {host:?}, expected {want_host:?} (what nvmf answers for the base's statuses)"
            ));
        }
    }
    if base_errors.values().sum::<u64>() != 600 {
        bad.push(format!(
            "host 1's base failed {base_errors:?}, 600 failures injected"
        ));
    }
    for i in all {
        let j = out.job(&job_bdev(&s, i));
        println!("  host {i}: {:.0} IOPS, failed {}", j.iops, j.io_failed);
        let want = if i == 1 { 600 } else { 0 };
        if j.io_failed != want {
            bad.push(format!(
                "host {i}: {} failed I/O, expected {want} (the injected failures reach host 1 only, each once)",
                j.io_failed
            ));
        }
    }
    println!("  estimator: {}", polled.hist.decisions_line());
    for i in [2, 3, 4] {
        let who = format!("host {i} (host 1's base failing)");
        judge_excused(&mut bad, &who, &polled.judged(&who, i, capacity));
    }
    bad.extend(audit_with(&mut t, &start, ERROR));

    // Run 2: the base deleted under load, 5 s into a 12 s run; the others'
    // reservations judged over the run as in run 1, and shown before, around (the
    // period of the removal and the next) and after it.
    let others = [2, 3, 4];
    let start = io_counts(&mut t, &others);
    let secs = 12u32;
    let mut b = bdevperf_retrying(&s, secs, rw, &all, 0);
    let run = b.start_tests();
    let mut removed = None;
    let polled = poll_run(&mut t, secs, |t, elapsed, epoch| {
        if elapsed >= Duration::from_secs(5) && removed.is_none() {
            t.call("bdev_error_delete", json!({"name": ERROR.of(1)}));
            removed = Some(epoch);
        }
    });
    let gone = t.rpc("bdev_get_bdevs", json!({"name": "qos1"})).is_err();
    println!("  base deleted under load in epoch {removed:?}: qos1 gone with it: {gone}");
    if !gone {
        bad.push("qos1 outlived its base".into());
    }
    let out = b.finish_tests(run);
    std::thread::sleep(Duration::from_millis(1500));
    let h1 = out.job(&job_bdev(&s, 1));
    println!(
        "  host 1: {:.0} IOPS, failed {} (its namespace went away)",
        h1.iops, h1.io_failed
    );
    for i in others {
        let j = out.job(&job_bdev(&s, i));
        if j.io_failed != 0 {
            bad.push(format!(
                "host {i}: {} failed I/O after host 1's base went",
                j.io_failed
            ));
        }
        let phase = |e: u64| match removed {
            Some(r) if e < r => 0,
            Some(r) if e <= r + 1 => 1,
            _ => 2,
        };
        let mut by_phase = [(0, 0); 3];
        for (e, p) in polled.periods(i) {
            let (met, n) = &mut by_phase[phase(e)];
            *met += p.met as u64;
            *n += 1;
        }
        println!(
            "  host {i}: reservation met in {by_phase:?} (met, periods) before, around and \
             after the removal"
        );
        let who = format!("hot remove: host {i}");
        judge_excused(&mut bad, &who, &polled.judged(&who, i, capacity));
    }
    bad.extend(audit(&mut t, &start));

    // Created again: host 1 runs clean.
    t.call("bdev_error_create", json!({"base_name": "Malloc0p0"}));
    t.call(
        "qos_bdev_create",
        json!({"name": "qos1", "base_bdev_name": ERROR.of(1), "domain": "d",
               "host_nqn": host_nqn(1)}),
    );
    t.call(
        "nvmf_subsystem_add_ns",
        json!({"nqn": subsys_nqn(1), "namespace": {"bdev_name": "qos1"}}),
    );
    let start = io_counts_with(&mut t, &[1], ERROR);
    let out = bdevperf_retrying(&s, 3, rw, &[1], 0).run();
    std::thread::sleep(Duration::from_millis(1500));
    let h1 = out.job(&job_bdev(&s, 1));
    println!(
        "  recreated: host 1 {:.0} IOPS, failed {}",
        h1.iops, h1.io_failed
    );
    if h1.io_failed != 0 || h1.iops <= 0.0 {
        bad.push(format!(
            "host 1 after the base and its QoS bdev were created again: {:.0} IOPS, {} failed",
            h1.iops, h1.io_failed
        ));
    }
    bad.extend(audit_with(&mut t, &start, ERROR));
    assert!(t.is_running(), "nvmf_tgt died; log:\n{}", t.log_tail(40));
    t.stop(30);
    assert!(bad.is_empty(), "base faults:\n  {}", bad.join("\n  "));
}

/// How long a stalled command of host 1 waits at its base.
const STALL_US: u64 = 5_000_000;
/// bdev_nvme's command timeout in the stall test: a stalled command times out, and a
/// command QoS holds does not (it waits at most about two 500 ms periods).
const HOST_TIMEOUT_US: u64 = 2_000_000;

/// 500 ms periods after the stall ends by which host 1 does I/O again. An abort ends
/// a stalled command when it times out ([`HOST_TIMEOUT_US`]). A reset does not: the
/// target frees the host's old queue pairs only once the base has completed their
/// commands, and a command sent just before the stall ended is [`STALL_US`] at the base.
/// Either way the host may connect again [`RECONNECT_DELAY_S`] after that (bdev_nvme
/// resets the controller when an abort fails). Plus a second of noise.
/// (With the timeout as the bound for both, a reset run in CI went again 6 s after the
/// stall, 2 s after the bound.)
fn recovery_periods(action: &str) -> u64 {
    let held_us = if action == "abort" {
        HOST_TIMEOUT_US
    } else {
        STALL_US.max(HOST_TIMEOUT_US)
    } + RECONNECT_DELAY_S * 1_000_000;
    (held_us / 1_000_000 + 1) * 2
}

/// Host 1's base stalls: SPDK's delay bdev under its QoS bdev goes from no delay to
/// [`STALL_US`] a command (`bdev_delay_update_latency`) 5 s into a run under load near
/// saturation (4 hosts at 90 % of what they do unthrottled, reservations and limits as
/// in the soak), and back to none 3 s later. Twice, as a host configured either way reacts to
/// commands that do not come back: bdev_nvme's timeout ([`HOST_TIMEOUT_US`]) answered
/// by an NVMe Abort of the command (`action_on_timeout: abort`: nvmf asks the QoS bdev,
/// which aborts a held command itself and passes the abort to the base for one it sent
/// there, and the delay bdev completes that as aborted), then by a controller reset
/// (`reset`: the host drops its queue pairs and connects again; the target frees the
/// old ones once the base has completed their commands).
/// Checked: host 1's timed-out commands fail at host 1 (bdev_nvme does not retry here)
/// and no abort failed (bdev_nvme resets the controller when one does); the other hosts
/// fail nothing and meet their reservations (>= 99 % of periods under
/// `NVMF_QOS_ACCEPTANCE=1`, else >= 90 %; the machine's slow spells excused, read from
/// the three of them); host 1 does I/O again after the stall ([`recovery_periods`]); every
/// I/O reached the base once (iostat), the books balance with nothing held or in
/// flight; nvmf_tgt lives.
#[test]
fn a_stalling_base_is_aborted_or_reset_and_loses_nothing() {
    const DELAY: Host1Base = Host1Base::Delay;
    let Some(s) = setup_or_skip("stalling base") else {
        return;
    };
    let (rw, all) = ("randrw", [1, 2, 3, 4]);
    let total = {
        let _t = configured_target_on(&s, 100_000_000, false, DELAY, Cores::One);
        bdevperf_retrying(&s, 5, rw, &all, 0).run().total_iops()
    };
    let capacity = (total * 0.9) as u64;
    let mut t = configured_target_on(&s, capacity, true, DELAY, Cores::One);
    println!("stalling base: unthrottled {total:.0} IOPS, capacity {capacity} IOPS");
    let set_latency = |t: &mut Target, us: u64| {
        for kind in ["p99_read", "p99_write", "avg_read", "avg_write"] {
            t.call(
                "bdev_delay_update_latency",
                json!({"delay_bdev_name": DELAY.of(1), "latency_type": kind, "latency_us": us}),
            );
        }
    };
    let mut bad = Vec::new();
    for action in ["abort", "reset"] {
        let start = io_counts_with(&mut t, &all, DELAY);
        let secs = 22u32;
        // With an abort, a timed-out command fails once at the host (retry count 0); a
        // reset fails what is in flight (bdev_nvme's "do not retry" on them) and
        // bdev_nvme queues the rest while it connects again (retries without end: with
        // none it fails them at once and bdevperf resubmits them in a loop).
        let retry = if action == "abort" { 0 } else { -1 };
        let nvme = json!({"bdev_retry_count": retry, "timeout_us": HOST_TIMEOUT_US,
                          "action_on_timeout": action});
        let mut b = bdevperf_with(&s, secs, rw, &all, nvme, Cores::One);
        let run = b.start_tests();
        let (stall_from, stall_to) = (Duration::from_secs(5), Duration::from_secs(8));
        let (mut stalled, mut recovered_from) = (None, None);
        let polled = poll_run(&mut t, secs, |t, elapsed, epoch| {
            if elapsed >= stall_from && stalled.is_none() {
                stalled = Some(epoch + 1);
                set_latency(t, STALL_US);
            }
            if elapsed >= stall_to && stalled.is_some() && recovered_from.is_none() {
                set_latency(t, 0);
                recovered_from = Some(epoch + recovery_periods(action));
            }
        });
        let out = b.finish_tests(run);
        std::thread::sleep(Duration::from_millis(1500));
        let log = b.log_text();
        let timeouts = log.matches("Detected a timeout").count();
        let failed_aborts = log.matches("Abort failed").count();
        let resets = log.matches("Resetting controller successful").count();
        println!(
            "  {action} on timeout: {timeouts} commands timed out at host 1, {failed_aborts} \
             aborts failed, {resets} controller resets"
        );
        for i in all {
            let j = out.job(&job_bdev(&s, i));
            println!(
                "  host {i}: {:.0} IOPS, failed {}, max latency {:.0} us",
                j.iops, j.io_failed, j.max_us
            );
            if i == 1 && timeouts == 0 {
                bad.push(format!(
                    "{action}: host 1 saw no stall (no command timed out)"
                ));
            }
            // Each aborted command fails once; a reset fails at most what was in flight.
            let may_fail = if action == "abort" {
                timeouts as u64
            } else {
                resets as u64 * QDS[0] as u64
            };
            if i == 1 && (j.io_failed > may_fail || (action == "abort" && j.io_failed == 0)) {
                bad.push(format!(
                    "{action}: host 1 failed {} I/O for {timeouts} timeouts and {resets} resets",
                    j.io_failed
                ));
            }
            if i != 1 && j.io_failed != 0 {
                bad.push(format!(
                    "{action}: host {i}: {} failed I/O while host 1's base stalled",
                    j.io_failed
                ));
            }
        }
        if action == "abort" && failed_aborts > 0 {
            bad.push(format!(
                "{failed_aborts} of host 1's aborts failed (bdev_nvme then resets the controller)"
            ));
        }
        let phase = |e: u64| match (stalled, recovered_from) {
            (Some(s), _) if e < s => 0,
            (_, Some(r)) if e >= r => 2,
            _ => 1,
        };
        for i in [2, 3, 4] {
            let mut by_phase = [(0, 0); 3];
            for (e, p) in polled.periods(i) {
                let (met, n) = &mut by_phase[phase(e)];
                *met += p.met as u64;
                *n += 1;
            }
            println!(
                "  host {i}: reservation met in {:?} (met, periods) before, during and after \
                 the stall",
                by_phase
            );
            // Host 1 stops by design: the machine's speed is read from the other three,
            // sized for their part of the capacity.
            let who = format!("{action}: host {i}");
            judge_excused(
                &mut bad,
                &who,
                &polled.judged_among(&who, i, &[2, 3, 4], capacity),
            );
        }
        let after: Vec<u64> = polled
            .periods(1)
            .filter(|(e, _)| recovered_from.is_some_and(|r| *e >= r))
            .map(|(_, p)| p.ops)
            .collect();
        println!("  host 1 after the stall: {after:?} ops a period");
        println!(
            "  estimator (stall from epoch {stalled:?}, over from {recovered_from:?}): {}",
            polled.hist.decisions_line()
        );
        if after.is_empty() || after.contains(&0) {
            bad.push(format!(
                "{action}: host 1 did not get going again after the stall: {after:?}"
            ));
        }
        bad.extend(audit_with(&mut t, &start, DELAY));
    }
    assert!(t.is_running(), "nvmf_tgt died; log:\n{}", t.log_tail(40));
    t.stop(30);
    assert!(bad.is_empty(), "stalling base:\n  {}", bad.join("\n  "));
}

/// A DH-HMAC-CHAP secret in the NVMe key format (`DHHC-1:00:<base64 of the secret and
/// its CRC-32>:`, no transformation), from `seed`.
fn dhchap_key(seed: u64) -> String {
    interchange_key("DHHC-1:00", seed)
}

/// A TLS pre-shared key in the NVMe/TCP interchange format (`NVMeTLSkey-1:01:...:`,
/// SHA-256), from `seed`.
fn tls_psk(seed: u64) -> String {
    interchange_key("NVMeTLSkey-1:01", seed)
}

/// `<prefix>:<base64 of 32 secret bytes from seed and their CRC-32, little-endian>:`,
/// the interchange format of NVMe's DH-HMAC-CHAP secrets and TLS PSKs.
fn interchange_key(prefix: &str, seed: u64) -> String {
    let mut x = seed | 1;
    let secret: Vec<u8> = (0..32)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    let mut crc = !0u32;
    for &b in &secret {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ 0xEDB8_8320
            } else {
                crc >> 1
            };
        }
    }
    let mut raw = secret;
    raw.extend_from_slice(&(!crc).to_le_bytes());
    const B64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for c in raw.chunks(3) {
        let n = (u32::from(c[0]) << 16)
            | (u32::from(*c.get(1).unwrap_or(&0)) << 8)
            | u32::from(*c.get(2).unwrap_or(&0));
        for k in 0..4 {
            if k <= c.len() {
                out.push(B64[((n >> (18 - 6 * k)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    format!("{prefix}:{out}:")
}

/// Writes `text` to a key file of mode 0600 in `dir` (SPDK's file keyring refuses
/// others); returns its path.
fn key_file(dir: &std::path::Path, name: &str, text: &str) -> String {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(dir).expect("key directory");
    let path = dir.join(name);
    std::fs::write(&path, text).expect("key file");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).expect("key file mode");
    path.to_string_lossy().to_string()
}

/// bdevperf's configuration for hosts 1 and 2: `keys` (`keyring_file_add_key` calls)
/// in its keyring, then each host's controller, as `attach` leaves its parameters.
fn keyed_config(s: &Setup, keys: Vec<Value>, attach: impl Fn(usize, &mut Value)) -> Value {
    let mut cfg: Vec<Value> = Vec::new();
    for i in [1, 2] {
        let mut a = s.controller(i).attach();
        attach(i, &mut a["params"]);
        cfg.push(a);
    }
    cfg.push(json!({"method": "bdev_wait_for_examine"}));
    json!({"subsystems": [
        {"subsystem": "keyring", "config": keys},
        {"subsystem": "bdev", "config": cfg}]})
}

/// Hosts 1 and 2 reading 4 KiB at random (queue depths of [`QDS`]) in one bdevperf.
fn two_readers(s: &Setup, config: &Value, secs: u32) -> Bdevperf {
    let jobs = [1, 2]
        .iter()
        .map(|&i| Job::new(&s.controller(i).bdev(), "randread", 4096, QDS[i - 1]))
        .collect();
    s.bdevperf(false, config.clone(), jobs, secs, &["-f"])
}

/// A target set up by `prepare` (keys, hosts, listeners) with host 1 reserving 30 % of
/// a domain at 90 % of what [`two_readers`] did unthrottled on such a target (measured
/// first, 5 s); returns it, that rate, the capacity and the reservation. 30 %: this
/// machine's speed can halve between the calibration and the run, and a reservation
/// must stay within what a slow spell leaves (60 % missed 7 of 25 periods in one, host
/// 1 at 250 K IOPS for 251 K).
fn reserved_two_readers(
    s: &Setup,
    config: &Value,
    prepare: impl Fn(&mut Target),
) -> (Target, f64, u64, u64) {
    let unthrottled = {
        let mut t = configured_target(s, 100_000_000, false);
        prepare(&mut t);
        two_readers(s, config, 5).run().total_iops()
    };
    let capacity = (unthrottled * 0.9) as u64;
    let reserved = capacity * 3 / 10;
    let mut t = configured_target(s, capacity, false);
    prepare(&mut t);
    t.call(
        "qos_host_set",
        json!({"domain": "d", "host_nqn": host_nqn(1), "min_iops": reserved}),
    );
    (t, unthrottled, capacity, reserved)
}

/// QoS identity bound to an authenticated host (issue 29, part 4): host 1's subsystem
/// requires DH-HMAC-CHAP with host 1's key (SPDK's keyring on both sides). Host 1
/// (bdevperf, with the key) reserves 30 % of a domain at 90 % of what hosts 1 and 2 do
/// unthrottled, host 2 loads the target beside it; meanwhile an impersonator (the
/// test's own NVMe/TCP host, without the key) connects again and again as host 1's NQN
/// to host 1's subsystem. Checked: the impersonator never gets a controller enabled or
/// a command served (the target answers "authentication required"), host 1 meets its
/// reservation (>= 99 % of periods under `NVMF_QOS_ACCEPTANCE=1`, else >= 90 %) with no
/// failed I/O, and the books balance.
#[test]
fn an_impersonator_without_the_key_gets_nothing() {
    let Some(s) = setup_or_skip("impersonator") else {
        return;
    };
    let dir = std::env::temp_dir().join(format!("nvmf-qos-auth-{}", std::process::id()));
    let key_file = key_file(&dir, "host1.key", &dhchap_key(0x5EED_0001));
    let requiring_auth = |t: &mut Target| {
        t.call(
            "keyring_file_add_key",
            json!({"name": "key1", "path": key_file}),
        );
        t.call(
            "nvmf_subsystem_remove_host",
            json!({"nqn": subsys_nqn(1), "host": host_nqn(1)}),
        );
        t.call(
            "nvmf_subsystem_add_host",
            json!({"nqn": subsys_nqn(1), "host": host_nqn(1), "dhchap_key": "key1"}),
        );
    };
    let config = keyed_config(
        &s,
        vec![json!({"method": "keyring_file_add_key",
                    "params": {"name": "key1", "path": key_file}})],
        |i, a| {
            if i == 1 {
                a["dhchap_key"] = json!("key1");
            }
        },
    );
    let (mut t, unthrottled, capacity, reserved) =
        reserved_two_readers(&s, &config, requiring_auth);
    println!(
        "impersonator: hosts 1 (with its key) and 2 unthrottled {unthrottled:.0} IOPS; \
         capacity {capacity}; host 1 reserves {reserved}"
    );
    let start_counts = io_counts(&mut t, &[1, 2]);
    let secs = 15u32;
    let mut b = two_readers(&s, &config, secs);
    let run = b.start_tests();
    let stop = Arc::new(AtomicBool::new(false));
    let tries = Arc::new(AtomicU64::new(0));
    let served = Arc::new(AtomicU64::new(0));
    let refusals = Arc::new(Mutex::new(BTreeMap::<String, u64>::new()));
    let port = s.port;
    let imp = {
        let (stop, tries, served, refusals) = (
            stop.clone(),
            tries.clone(),
            served.clone(),
            refusals.clone(),
        );
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                tries.fetch_add(1, Ordering::Relaxed);
                let why = match connect_io(port, &subsys_nqn(1), &host_nqn(1)) {
                    Err(e) => e.to_string(),
                    Ok((_admin, mut io)) => {
                        let mut buf = Vec::new();
                        match io.command(Sqe::new(0x02, 1).cdw(12, 7), 4096, &mut buf) {
                            Ok(c) if c.ok() => {
                                served.fetch_add(1, Ordering::Relaxed);
                                "a read served".into()
                            }
                            Ok(c) => format!("read refused: sct {} sc {:#x}", c.sct, c.sc),
                            Err(e) => format!("read: {e}"),
                        }
                    }
                };
                *refusals
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .entry(why)
                    .or_default() += 1;
                std::thread::sleep(Duration::from_millis(50));
            }
        })
    };
    let polled = poll_run(&mut t, secs, |_, _, _| {});
    let out = b.finish_tests(run);
    stop.store(true, Ordering::Relaxed);
    let _ = imp.join();
    std::thread::sleep(Duration::from_millis(1500));
    let h1 = out.job(&s.controller(1).bdev());
    let (met, n) = polled.met(1);
    let refusals = refusals.lock().unwrap_or_else(|e| e.into_inner()).clone();
    println!(
        "  host 1: {:.0} IOPS, failed {}, reservation met in {met} of {n} periods",
        h1.iops, h1.io_failed
    );
    println!(
        "  impersonator: {} attempts, {} commands served; outcomes {refusals:?}",
        tries.load(Ordering::Relaxed),
        served.load(Ordering::Relaxed)
    );
    let log = t.log_tail(400);
    let auth: Vec<&str> = log
        .lines()
        .filter(|l| l.to_lowercase().contains("auth"))
        .collect();
    println!(
        "  target log lines about authentication (last 400 lines): {}, e.g. {:?}",
        auth.len(),
        auth.first()
    );
    let mut bad = Vec::new();
    if served.load(Ordering::Relaxed) > 0 || refusals.keys().any(|k| k.starts_with("read")) {
        bad.push(format!(
            "the impersonator got an enabled controller or a command served: {refusals:?}"
        ));
    }
    if tries.load(Ordering::Relaxed) == 0 {
        bad.push("the impersonator never tried".into());
    }
    if h1.io_failed > 0 || h1.iops <= 0.0 {
        bad.push(format!(
            "host 1 with its key: {:.0} IOPS, {} failed",
            h1.iops, h1.io_failed
        ));
    }
    judge_reservation(&mut bad, "host 1", (met, n));
    bad.extend(audit(&mut t, &start_counts));
    assert!(t.is_running(), "nvmf_tgt died; log:\n{}", t.log_tail(40));
    t.stop(30);
    let _ = std::fs::remove_dir_all(&dir);
    assert!(bad.is_empty(), "impersonator:\n  {}", bad.join("\n  "));
}

/// QoS over NVMe/TCP with TLS (issue 29, part 4): hosts 1 and 2 reach their subsystems
/// only through a `secure_channel` listener with a pre-shared key each (SPDK's keyring
/// on both sides; bdevperf attaches with `psk`). Host 1 reserves 30 % of a domain at 90 %
/// of what the two do unthrottled over TLS, host 2 loads the target beside it. Checked:
/// host 1 meets its reservation (>= 99 % of periods under `NVMF_QOS_ACCEPTANCE=1`, else
/// >= 90 %), no failed I/O, books and iostat balance.
#[test]
fn reservations_hold_over_tls() {
    let Some(s) = setup_or_skip("TLS") else {
        return;
    };
    let dir = std::env::temp_dir().join(format!("nvmf-qos-tls-{}", std::process::id()));
    let psks: Vec<String> = [1u64, 2]
        .iter()
        .map(|&i| key_file(&dir, &format!("psk{i}"), &tls_psk(0x7150_0000 + i)))
        .collect();
    // A port of its own: the one after the plain listener's may be any connection's
    // local port (CI once found 37170 taken that way).
    let tls_port = free_port();
    let over_tls = |t: &mut Target| {
        for i in [1usize, 2] {
            t.call(
                "keyring_file_add_key",
                json!({"name": format!("psk{i}"), "path": psks[i - 1]}),
            );
            t.call(
                "nvmf_subsystem_remove_host",
                json!({"nqn": subsys_nqn(i), "host": host_nqn(i)}),
            );
            t.call(
                "nvmf_subsystem_add_host",
                json!({"nqn": subsys_nqn(i), "host": host_nqn(i), "psk": format!("psk{i}")}),
            );
            t.call(
                "nvmf_subsystem_add_listener",
                json!({"nqn": subsys_nqn(i), "secure_channel": true,
                       "listen_address": {"trtype": "TCP", "adrfam": "IPv4",
                       "traddr": "127.0.0.1", "trsvcid": tls_port.to_string()}}),
            );
        }
    };
    let keys = [1usize, 2]
        .map(|i| {
            json!({"method": "keyring_file_add_key",
                   "params": {"name": format!("psk{i}"), "path": psks[i - 1]}})
        })
        .to_vec();
    let config = keyed_config(&s, keys, |i, a| {
        a["psk"] = json!(format!("psk{i}"));
        a["trsvcid"] = json!(tls_port.to_string());
    });
    let (mut t, unthrottled, capacity, reserved) = reserved_two_readers(&s, &config, over_tls);
    println!(
        "TLS: hosts 1 and 2 over TLS unthrottled {unthrottled:.0} IOPS; capacity {capacity}; \
         host 1 reserves {reserved}"
    );
    let start_counts = io_counts(&mut t, &[1, 2]);
    let secs = 12u32;
    let mut b = two_readers(&s, &config, secs);
    let run = b.start_tests();
    let polled = poll_run(&mut t, secs, |_, _, _| {});
    let out = b.finish_tests(run);
    std::thread::sleep(Duration::from_millis(1500));
    let (met, n) = polled.met(1);
    let mut bad = Vec::new();
    for i in [1usize, 2] {
        let j = out.job(&s.controller(i).bdev());
        println!(
            "  host {i}: {:.0} IOPS over TLS, failed {}",
            j.iops, j.io_failed
        );
        if j.io_failed > 0 || j.iops <= 0.0 {
            bad.push(format!(
                "host {i}: {:.0} IOPS, {} failed",
                j.iops, j.io_failed
            ));
        }
    }
    println!("  host 1: reservation met in {met} of {n} periods");
    judge_reservation(&mut bad, "host 1 (over TLS)", (met, n));
    bad.extend(audit(&mut t, &start_counts));
    assert!(t.is_running(), "nvmf_tgt died; log:\n{}", t.log_tail(40));
    t.stop(30);
    let _ = std::fs::remove_dir_all(&dir);
    assert!(bad.is_empty(), "TLS:\n  {}", bad.join("\n  "));
}

/// Two poll groups (issue 29, part 2): `nvmf_tgt` on cores 0 and 1 (a poll group on
/// each), bdevperf on core 1 with two jobs per host (QD 8 each, a thread and so an I/O
/// queue pair each), which the target hands to its poll groups in turn, so that a host
/// has an I/O queue pair on each poll group (checked with `nvmf_subsystem_get_qpairs`)
/// and its QoS bdev is used from two threads at once. Host 1 reserves 25 % of a domain
/// at 90 % of what the three hosts do unthrottled, host 2 (QD 128 a job,
/// [`pg_host2_qd`]) is limited to 10 %, host 3 takes the rest.
///
/// The target's reactor on core 1 runs under a CPU quota ([`CpuQuota`],
/// [`PG_QUOTA_CPUS`]), so that bdevperf keeps a known part of core 1, and the same setup
/// runs first with the target on core 0 only (one poll group) as the reference. bdevperf
/// on both cores starved one host at about 2,000 IOPS even with no QoS in the path
/// ([`two_poll_groups_initiator_probe`]). Always checked, in both runs: host 2 never
/// above its limit (+1 %) in a period; no failed I/O; books and iostat balance; in the
/// two-core run at least one host on both poll groups (which ones depends on the order
/// the connections arrive in). Under `NVMF_QOS_ACCEPTANCE=1` also "as on one": host 2
/// within +-1 % of its limit in every period it had work waiting, host 1's reservation
/// met in >= 99 % of the periods it had work waiting, on two poll groups; when the
/// one-core reference misses them itself, the test fails saying the run was not judged.
#[test]
fn two_poll_groups_hold_reservations_and_limits() {
    let Some(s) = setup_or_skip("two poll groups") else {
        return;
    };
    let one = poll_groups_run(&s, Cores::One, None);
    let two = poll_groups_run(&s, Cores::Two, Some(pg_quota_cpus()));
    println!("two poll groups vs one:");
    for r in [&one, &two] {
        r.print();
    }
    let mut bad: Vec<String> = one.bad.iter().chain(&two.bad).cloned().collect();
    if acceptance() {
        // "As on one": the reference must meet the figures itself, or the machine was
        // too slow at the time to judge two poll groups against it.
        let reference = one.acceptance();
        if reference.is_empty() {
            bad.extend(two.acceptance());
        } else {
            bad.push(
                "not judged: the one-poll-group reference itself missed (the machine was \
                 too slow or busy to compare against it)"
                    .to_string(),
            );
            bad.extend(reference);
        }
    }
    assert!(bad.is_empty(), "two poll groups:\n  {}", bad.join("\n  "));
}

/// The CPU quota of the target's reactor on core 1 in the two-poll-group test, in CPUs
/// (`QOS_IT_PG_QUOTA`; 0 lifts it): at 0.5 it runs at most half of each 10 ms, so
/// bdevperf gets at least half of core 1. The reactor on core 0 runs freely, as the
/// one-core reference's does. A quota of 1.0 CPUs on the whole target instead stopped
/// both reactors together for about half of every 10 ms, longer than the limit's paced
/// release carries over (host 2 at 80-87 % of its limit, backlogged, in every period).
const PG_QUOTA_CPUS: f64 = 0.5;

fn pg_quota_cpus() -> f64 {
    std::env::var("QOS_IT_PG_QUOTA")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(PG_QUOTA_CPUS)
}

/// Host 2's queue depth per job (`QOS_IT_PG_HOST2_QD`, default 128). bdevperf shares
/// core 1 with the target's reactor there and stops for milliseconds at a time; a host
/// whose commands all complete meanwhile has nothing waiting at the target, looks idle
/// to it, and what its limit released then expires (by design: an idle host does not
/// catch up in a burst). At QD 16 a job (32 commands, under 2 ms at its limit) host 2
/// did 87-99.7 % of its limit on two poll groups; at 64, 98.9-100 %; at 128 (about 20
/// ms of its limit), within 1 % in every period, as on one poll group.
fn pg_host2_qd() -> u32 {
    env_number("QOS_IT_PG_HOST2_QD", "a queue depth, e.g. 128")
        .map_or(128, |qd| qd.clamp(1, 4096) as u32)
}

/// The quota's accounting period (µs). 1,000 µs cost the target most of its rate on two
/// cores (42,149 IOPS unthrottled, against 133,311 at 10,000 µs in the run before).
const PG_QUOTA_PERIOD_US: u64 = 10_000;

/// What one run of the poll-group test measured.
struct PgRun {
    cores: Cores,
    /// The quota of the reactor on core 1 (CPUs), if any.
    quota: Option<f64>,
    unthrottled: f64,
    capacity: u64,
    reserved: u64,
    /// Host 2's limit in ops per period.
    per_period: u64,
    /// Host 1: periods met, periods with work waiting (or met), periods short without.
    met: u64,
    n: u64,
    idle: u64,
    /// Host 2: periods with work waiting, those outside +-1 % of the limit (epoch, ops),
    /// the most ops in a period.
    limited: u64,
    off: Vec<(u64, u64)>,
    least: u64,
    most: u64,
    iops: Vec<f64>,
    threads: BTreeMap<usize, std::collections::BTreeSet<String>>,
    throttled: u64,
    /// Always-asserted failures.
    bad: Vec<String>,
}

impl PgRun {
    fn label(&self) -> String {
        match self.quota {
            Some(q) => format!("{:?} poll group(s), reactor_1 quota {q} CPUs", self.cores),
            None => format!("{:?} poll group(s), no quota", self.cores),
        }
    }

    fn print(&self) {
        let pct = |a: u64, b: u64| a as f64 * 100.0 / b.max(1) as f64;
        println!(
            "  {}: unthrottled {:.0}, capacity {}, host IOPS {:?}; host 1 ({} reserved/s) met \
             {} of {} periods with work waiting ({:.1} %; {} short without); host 2 within \
             +-1 % of {} in {} of {} periods with work waiting ({:.1} %), {}..{} ops; \
             quota throttled {} periods of 10 ms",
            self.label(),
            self.unthrottled,
            self.capacity,
            self.iops
                .iter()
                .map(|x| x.round() as u64)
                .collect::<Vec<_>>(),
            self.reserved,
            self.met,
            self.n,
            pct(self.met, self.n),
            self.idle,
            self.per_period,
            self.limited - self.off.len() as u64,
            self.limited,
            pct(self.limited - self.off.len() as u64, self.limited),
            self.least,
            self.most,
            self.throttled,
        );
        if !self.off.is_empty() {
            println!("    host 2 outside +-1 % (epoch, ops): {:?}", self.off);
        }
    }

    /// The comparison "as on one", asserted under `NVMF_QOS_ACCEPTANCE=1`.
    fn acceptance(&self) -> Vec<String> {
        let mut bad = Vec::new();
        if self.n < 5 || self.met as f64 / (self.n as f64) < 0.99 {
            bad.push(format!(
                "{}: host 1's reservation met in {} of {} periods with work waiting (< 99 %)",
                self.label(),
                self.met,
                self.n
            ));
        }
        if self.limited < 5 || !self.off.is_empty() {
            bad.push(format!(
                "{}: host 2 outside +-1 % of its limit in {} of {} periods with work waiting",
                self.label(),
                self.off.len(),
                self.limited
            ));
        }
        bad
    }
}

/// One run of the poll-group test with the target on `cores`, its reactor on core 1
/// under a CPU quota of `quota` CPUs: calibration (5 s), then 14 s with host 1's
/// reservation and host 2's limit, audited.
fn poll_groups_run(s: &Setup, cores: Cores, quota: Option<f64>) -> PgRun {
    let hosts = [1usize, 2, 3];
    let config = {
        let mut cfg: Vec<Value> = hosts.iter().map(|&i| s.controller(i).attach()).collect();
        cfg.push(json!({"method": "bdev_wait_for_examine"}));
        json!({"subsystems": [{"subsystem": "bdev", "config": cfg}]})
    };
    let jobs = |secs: u32| -> Bdevperf {
        let jobs = hosts
            .iter()
            .flat_map(|&i| {
                // Host 2 keeps work waiting at its limit throughout ([`pg_host2_qd`]).
                let qd = if i == 2 { pg_host2_qd() } else { 8 };
                [0, 1].map(|_| Job::new(&s.controller(i).bdev(), "randread", 4096, qd))
            })
            .collect();
        s.bdevperf_on(false, config.clone(), jobs, secs, &["-f"], "0x2")
    };
    let quota_on = |t: &Target| cores.reactor_quota(t);
    let unthrottled = {
        let t = configured_target_on(s, 100_000_000, false, Host1Base::Split, cores);
        let _q = quota_on(&t);
        let out = jobs(5).run();
        let each: Vec<u64> = hosts
            .iter()
            .map(|&i| out.job(&s.controller(i).bdev()).iops as u64)
            .collect();
        println!("  {cores:?} poll group(s), quota {quota:?}: unthrottled, hosts 1/2/3 {each:?}");
        out.total_iops()
    };
    let capacity = (unthrottled * 0.9) as u64;
    // Host 2's limit must bind also when the domain is congested: there hosts 2 and 3
    // (equal weights) each get a third of what is left after host 1's reservation, and
    // a limit of 15 % was above that share on two poll groups (host 2 then did exactly
    // host 3's rate, under its limit: weighted sharing, not the limit, held it).
    let (reserved, limit) = (capacity / 4, capacity / 10);
    let mut t = configured_target_on(s, capacity, false, Host1Base::Split, cores);
    let q = quota_on(&t);
    if let Some(us) = std::env::var("QOS_IT_PG_BURST_US")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
    {
        // Diagnosis: how far hosts may run ahead of the paced release (default: the
        // check interval, 1 ms).
        t.call(
            "qos_domain_update",
            json!({"name": "d", "release_burst_us": us}),
        );
    }
    t.call(
        "qos_host_set",
        json!({"domain": "d", "host_nqn": host_nqn(1), "min_iops": reserved}),
    );
    t.call(
        "qos_host_set",
        json!({"domain": "d", "host_nqn": host_nqn(2), "max_iops": limit}),
    );
    let start_counts = io_counts(&mut t, &hosts);
    let secs = 14u32;
    let mut b = jobs(secs);
    let run = b.start_tests();
    let mut threads: BTreeMap<usize, std::collections::BTreeSet<String>> = BTreeMap::new();
    let mut looked = false;
    let polled = poll_run(&mut t, secs, |t, elapsed, _| {
        if elapsed > Duration::from_secs(2) && !looked {
            looked = true;
            for &i in &hosts {
                let q = t.call("nvmf_subsystem_get_qpairs", json!({"nqn": subsys_nqn(i)}));
                for qp in q.as_array().into_iter().flatten() {
                    if qp["qid"].as_u64().unwrap_or(0) > 0 {
                        threads
                            .entry(i)
                            .or_default()
                            .insert(qp["thread"].as_str().unwrap_or("").to_string());
                    }
                }
            }
        }
    });
    let out = b.finish_tests(run);
    std::thread::sleep(Duration::from_millis(1500));
    let throttled = q.as_ref().map_or(0, |q| q.throttled_periods());
    let per_period = limit / 2; // period_ms 500
    let mut r = PgRun {
        cores,
        quota,
        unthrottled,
        capacity,
        reserved,
        per_period,
        met: 0,
        n: 0,
        idle: 0,
        limited: 0,
        off: Vec::new(),
        least: u64::MAX,
        most: 0,
        iops: Vec::new(),
        threads,
        throttled,
        bad: Vec::new(),
    };
    // A period counts against the reservation only when host 1 had work waiting at the
    // target (a host starved at the initiator looks idle to it).
    for (_, p) in polled.periods(1) {
        if p.met || p.backlogged {
            r.n += 1;
            r.met += p.met as u64;
        } else {
            r.idle += 1;
        }
    }
    let mut over = Vec::new();
    for (e, p) in polled.periods(2) {
        r.most = r.most.max(p.ops);
        if p.ops as f64 > per_period as f64 * 1.01 {
            over.push((e, p.ops));
        }
        if p.backlogged {
            r.least = r.least.min(p.ops);
            r.limited += 1;
            if (p.ops as f64 - per_period as f64).abs() > per_period as f64 * 0.01 {
                r.off.push((e, p.ops));
            }
        }
    }
    // Each period's ops per host ('*': work waiting at the target), to tell a starved
    // initiator from a slow target.
    let trace: Vec<String> = polled
        .periods(1)
        .map(|(e, _)| {
            let of = |i: usize| {
                polled
                    .periods(i)
                    .find(|&(x, _)| x == e)
                    .map(|(_, p)| format!("{}{}", p.ops, if p.backlogged { "*" } else { "" }))
                    .unwrap_or_default()
            };
            format!("{}/{}/{}", of(1), of(2), of(3))
        })
        .collect();
    println!(
        "  {}: ops per period, hosts 1/2/3: {}",
        r.label(),
        trace.join(" ")
    );
    if !over.is_empty() {
        r.bad.push(format!(
            "{}: host 2 above its limit (+1 %) in periods {over:?}",
            r.label()
        ));
    }
    for &i in &hosts {
        let j = out.job(&s.controller(i).bdev());
        r.iops.push(j.iops);
        if j.io_failed > 0 {
            r.bad.push(format!(
                "{}: host {i}: {} failed I/O",
                r.label(),
                j.io_failed
            ));
        }
    }
    // The target hands new queue pairs to its poll groups in turn, in the order the
    // connections arrive, so which hosts end up on both depends on that order (in one
    // run hosts 2 and 3 each landed on one); the two-core run needs a host that does.
    let spanning: Vec<usize> = hosts
        .iter()
        .copied()
        .filter(|i| r.threads.get(i).is_some_and(|t| t.len() >= 2))
        .collect();
    println!(
        "  {}: I/O queue pairs' threads {:?}; hosts on both poll groups: {spanning:?}",
        r.label(),
        r.threads
    );
    if cores == Cores::Two && spanning.is_empty() {
        r.bad.push(format!(
            "no host has I/O queue pairs on both poll groups: {:?}",
            r.threads
        ));
    }
    drop(q);
    let label = r.label();
    let audit = audit(&mut t, &start_counts);
    r.bad
        .extend(audit.into_iter().map(|a| format!("{label}: {a}")));
    assert!(t.is_running(), "nvmf_tgt died; log:\n{}", t.log_tail(40));
    t.stop(30);
    r
}

/// Why bdevperf runs on core 1 only in [`two_poll_groups_hold_reservations_and_limits`]
/// (run by hand: `--ignored`): the target on both cores, the same CPU quota, with
/// no QoS bdevs (each host's split of a malloc bdev exposed as it is), the test's three
/// hosts with two QD-8 `randread` jobs each, three 5 s runs. `QOS_IT_PG_JOB_CORES`
/// (default `0x1,0x2`: a job of each host on each core) places the jobs; bdevperf runs
/// on their cores together. With jobs on both cores one host did about 2,000 IOPS in
/// most runs while the others did 50,000-130,000, with no QoS in the path.
#[test]
#[ignore]
fn two_poll_groups_initiator_probe() {
    let Some(s) = setup_or_skip("two poll groups probe") else {
        return;
    };
    let hosts = [1usize, 2, 3];
    let config = {
        let mut cfg: Vec<Value> = hosts.iter().map(|&i| s.controller(i).attach()).collect();
        cfg.push(json!({"method": "bdev_wait_for_examine"}));
        json!({"subsystems": [{"subsystem": "bdev", "config": cfg}]})
    };
    let cores = std::env::var("QOS_IT_PG_JOB_CORES").unwrap_or_else(|_| "0x1,0x2".into());
    let cores: Vec<&str> = cores.split(',').collect();
    let mask = cores
        .iter()
        .filter_map(|c| u64::from_str_radix(c.trim_start_matches("0x"), 16).ok())
        .fold(0, |a, m| a | m);
    for round in 0..3 {
        let mut t = s.target_on(max_secs(), "0x3");
        t.malloc("Malloc0", 131072, 512);
        t.call(
            "bdev_split_create",
            json!({"base_bdev": "Malloc0", "split_count": HOSTS}),
        );
        let splits: Vec<String> = (0..3).map(|i| format!("Malloc0p{i}")).collect();
        expose_per_host(&mut t, &splits, s.port);
        let q = CpuQuota::attach_threads(t.pid().expect("the target runs"), "reactor_1")
            .expect("a CPU quota on the target's reactor_1 (cgroup-v1 cpu controller)");
        assert!(q.limit_cpus(pg_quota_cpus(), PG_QUOTA_PERIOD_US));
        let mut jobs = Vec::new();
        for &i in &hosts {
            for &c in &cores {
                jobs.push(Job::new(&s.controller(i).bdev(), "randread", 4096, 8).on_cores(c));
            }
        }
        let out = s
            .bdevperf_on(
                false,
                config.clone(),
                jobs,
                5,
                &["-f"],
                &format!("{mask:#x}"),
            )
            .run();
        let each: Vec<u64> = hosts
            .iter()
            .map(|&i| out.job(&s.controller(i).bdev()).iops as u64)
            .collect();
        println!("jobs on cores {cores:?}, round {round}: hosts 1/2/3 {each:?} IOPS");
        drop(q);
        t.stop(30);
    }
}
