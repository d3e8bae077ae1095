//! The agent's own state for Prometheus and for health checks: [`AgentStatus`] is
//! updated after every interval from its [`TickReport`], and [`serve`] answers
//! `GET /metrics` (Prometheus text format: this target's share of each host's cluster
//! contract, lease, leadership, last etcd contact, errors) and `GET /healthz` (200
//! while etcd was reached within the lease TTL, 503 otherwise) on a small HTTP listener
//! of its own thread, so a slow scrape never delays an interval. It also answers
//! `GET /handover`, the report the other agents trade by while etcd is away
//! ([`qos_core::handover`]).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use qos_core::cluster::{ClusterHost, LocalShare};
use thiserror::Error;

use crate::agent::{AgentConfig, TickReport};

/// Why a kind of error was counted: the interval could not read the target, could not
/// finish with etcd, or something else went wrong (a share the target refused, a record
/// the agent cannot read).
pub const ERROR_KINDS: [&str; 3] = ["target", "etcd", "other"];

/// What the agent's last intervals showed.
#[derive(Debug)]
pub struct AgentStatus {
    cluster: String,
    target: String,
    domain: String,
    lease_ttl: Duration,
    intervals: u64,
    target_up: bool,
    etcd_up: bool,
    leader: bool,
    holds_lease: bool,
    /// Another agent holds this target's name ([`TickReport::name_taken`]).
    name_taken: bool,
    /// The last interval that finished its etcd part, by both clocks (the wall clock's
    /// for the timestamp, the monotonic one for the age).
    last_etcd_contact: Option<(SystemTime, Instant)>,
    division_seq: Option<u64>,
    /// Shared with the agent's interval report (not copied: 1,000 hosts each at fleet
    /// size, every interval).
    shares: Arc<BTreeMap<String, LocalShare>>,
    contracts: Arc<BTreeMap<String, ClusterHost>>,
    /// Hosts whose share the target refused at the last interval that got that far.
    refused: BTreeMap<String, String>,
    errors: BTreeMap<&'static str, u64>,
    set_total: u64,
    removed_total: u64,
    /// The agent's handover report, as JSON.
    handover: String,
    traded_total: u64,
    /// As leader: the divisions computed and the time `plan` took in all; the
    /// division records written and their bytes.
    divisions_total: u64,
    division_seconds_total: f64,
    division_cpu_seconds_total: f64,
    division_puts_total: u64,
    division_requests_total: u64,
    division_bytes_total: u64,
    /// The agent's thread's CPU time in each part of its intervals
    /// ([`crate::agent::Phase`]), in all.
    phase_cpu_seconds_total: BTreeMap<&'static str, f64>,
}

impl AgentStatus {
    pub fn new(cfg: &AgentConfig) -> AgentStatus {
        AgentStatus {
            cluster: cfg.cluster.clone(),
            target: cfg.target.clone(),
            domain: cfg.domain.clone(),
            lease_ttl: Duration::from_secs(cfg.lease_ttl_s),
            intervals: 0,
            target_up: false,
            etcd_up: false,
            leader: false,
            holds_lease: false,
            name_taken: false,
            last_etcd_contact: None,
            division_seq: None,
            shares: Arc::default(),
            contracts: Arc::default(),
            refused: BTreeMap::new(),
            errors: ERROR_KINDS.iter().map(|&k| (k, 0)).collect(),
            set_total: 0,
            removed_total: 0,
            handover: "{}".into(),
            traded_total: 0,
            divisions_total: 0,
            division_seconds_total: 0.0,
            division_cpu_seconds_total: 0.0,
            division_puts_total: 0,
            division_requests_total: 0,
            division_bytes_total: 0,
            phase_cpu_seconds_total: BTreeMap::new(),
        }
    }

    /// What `GET /handover` answers from now on.
    pub fn set_handover(&mut self, report: &qos_core::handover::HandoverReport) {
        self.handover = serde_json::to_string(report).expect("a report serialises");
    }

    /// Takes in one interval's report, made at `now` (`wall`: the same moment by the
    /// wall clock); `holds_lease`: the agent has a lease after it.
    pub fn record(&mut self, r: &TickReport, holds_lease: bool, now: Instant, wall: SystemTime) {
        self.intervals += 1;
        self.target_up = r.target_ok;
        // Whether etcd answered, also while the target is down (the agent then only
        // reads from etcd: it does not renew its lease).
        self.etcd_up = r.etcd_reachable;
        self.leader = r.leader;
        self.holds_lease = holds_lease;
        self.name_taken = r.name_taken;
        if r.etcd_ok {
            self.last_etcd_contact = Some((wall, now));
            self.division_seq = r.shares_seq;
            self.shares = Arc::clone(&r.shares);
            self.contracts = Arc::clone(&r.contracts);
            self.refused = r.refused.clone();
        }
        // A failed target read ends the interval with that error (and the failed etcd
        // check's); a failed etcd call ends it with its error last.
        let mut others = r.errors.len();
        if !r.target_ok {
            *self.errors.entry("target").or_default() += 1;
            others = others.saturating_sub(1);
        }
        if !r.etcd_reachable {
            *self.errors.entry("etcd").or_default() += 1;
            others = others.saturating_sub(1);
        }
        *self.errors.entry("other").or_default() += (others + r.refused.len()) as u64;
        self.set_total += r.set as u64;
        self.removed_total += r.removed as u64;
        self.traded_total += r.traded as u64;
        if let Some(t) = r.division_time {
            self.divisions_total += 1;
            self.division_seconds_total += t.as_secs_f64();
        }
        if let Some(t) = r.division_cpu {
            self.division_cpu_seconds_total += t.as_secs_f64();
        }
        for p in &r.phases {
            if let Some(cpu) = p.cpu {
                *self.phase_cpu_seconds_total.entry(p.what).or_default() += cpu.as_secs_f64();
            }
        }
        if let Some(w) = r.division_written {
            self.division_puts_total += w.puts as u64;
            self.division_requests_total += w.requests as u64;
            self.division_bytes_total += w.bytes as u64;
        }
    }

    /// Time since etcd was last reached, `None` before the first time.
    pub fn etcd_age(&self, now: Instant) -> Option<Duration> {
        self.last_etcd_contact
            .map(|(_, at)| now.saturating_duration_since(at))
    }

    /// etcd was reached within the lease TTL: the agent's lease is still alive, so the
    /// cluster counts this target (and the target's name is this agent's).
    pub fn healthy(&self, now: Instant) -> bool {
        !self.name_taken && self.etcd_age(now).is_some_and(|a| a <= self.lease_ttl)
    }

    /// The `/healthz` answer: status code and a line saying why.
    pub fn health(&self, now: Instant) -> (u16, String) {
        let ttl = self.lease_ttl.as_secs_f64();
        if self.name_taken {
            return (
                503,
                format!(
                    "target name {} is taken by another agent's lease: this agent writes and applies nothing; give each target's agent its own --target\n",
                    self.target
                ),
            );
        }
        match self.etcd_age(now) {
            None => (503, "etcd not reached yet\n".into()),
            Some(a) if self.healthy(now) => (
                200,
                format!(
                    "ok: etcd reached {:.1} s ago (lease TTL {ttl} s)\n",
                    a.as_secs_f64()
                ),
            ),
            Some(a) => (
                503,
                format!(
                    "etcd last reached {:.1} s ago, more than the lease TTL ({ttl} s): the cluster no longer counts this target\n",
                    a.as_secs_f64()
                ),
            ),
        }
    }

    /// The metrics in Prometheus' text format.
    pub fn render(&self, now: Instant) -> String {
        let mut m = Metrics::default();
        let info = format!(
            "cluster=\"{}\",target=\"{}\",domain=\"{}\",version=\"{}\"",
            escape(&self.cluster),
            escape(&self.target),
            escape(&self.domain),
            env!("CARGO_PKG_VERSION")
        );
        m.one(
            "info",
            "gauge",
            "the agent's cluster, target and domain",
            &info,
            1.0,
        );
        let flag = |b: bool| if b { 1.0 } else { 0.0 };
        m.one(
            "target_up",
            "gauge",
            "1 when the last interval read the target",
            "",
            flag(self.target_up),
        );
        m.one(
            "etcd_up",
            "gauge",
            "1 when etcd answered the last interval (while the target is down the agent only checks that it answers)",
            "",
            flag(self.etcd_up),
        );
        m.one(
            "leader",
            "gauge",
            "1 when this agent holds the cluster's leader key (it divides)",
            "",
            flag(self.leader),
        );
        m.one(
            "lease_held",
            "gauge",
            "1 when the agent holds a lease etcd renewed within its TTL (the cluster counts this target)",
            "",
            flag(self.holds_lease && self.healthy(now)),
        );
        m.one(
            "name_taken",
            "gauge",
            "1 when another agent's lease holds this target's name (its member record): this agent writes and applies nothing",
            "",
            flag(self.name_taken),
        );
        m.one(
            "lease_ttl_seconds",
            "gauge",
            "the lease time-to-live (--lease-ttl-s)",
            "",
            self.lease_ttl.as_secs_f64(),
        );
        if let Some((wall, _)) = self.last_etcd_contact {
            let ts = wall
                .duration_since(SystemTime::UNIX_EPOCH)
                .map_or(0.0, |d| d.as_secs_f64());
            m.one(
                "etcd_last_contact_timestamp_seconds",
                "gauge",
                "when an interval last finished its calls to etcd (Unix time)",
                "",
                ts,
            );
        }
        if let Some(age) = self.etcd_age(now) {
            m.one(
                "etcd_last_contact_age_seconds",
                "gauge",
                "seconds since an interval last finished its calls to etcd",
                "",
                age.as_secs_f64(),
            );
        }
        m.one(
            "intervals_total",
            "counter",
            "intervals run",
            "",
            self.intervals as f64,
        );
        m.head(
            "errors_total",
            "counter",
            "intervals that failed to read the target or to reach etcd, and other errors (refused shares, unreadable records)",
        );
        for (kind, n) in &self.errors {
            m.row("errors_total", &format!("kind=\"{kind}\""), *n as f64);
        }
        m.head(
            "share_changes_total",
            "counter",
            "shares written to the target (set) and hosts given back (remove)",
        );
        m.row(
            "share_changes_total",
            "change=\"set\"",
            self.set_total as f64,
        );
        m.row(
            "share_changes_total",
            "change=\"remove\"",
            self.removed_total as f64,
        );
        m.one(
            "handover_traded_total",
            "counter",
            "shares moved by trading with the other agents while etcd was away",
            "",
            self.traded_total as f64,
        );
        m.one(
            "divisions_total",
            "counter",
            "divisions this agent computed as leader (one an interval)",
            "",
            self.divisions_total as f64,
        );
        m.one(
            "division_seconds_total",
            "counter",
            "time the leader's divisions took (qos_core::cluster::plan), in all (wall time)",
            "",
            self.division_seconds_total,
        );
        m.one(
            "division_cpu_seconds_total",
            "counter",
            "the leader's thread's CPU time in its divisions (qos_core::cluster::plan), in all: the wall time less what the scheduler gave others",
            "",
            self.division_cpu_seconds_total,
        );
        m.head(
            "interval_cpu_seconds_total",
            "counter",
            "the agent's thread's CPU time in each part of its intervals, in all (target: reading the target; report: its demand measured, its lease renewed, the cluster's records read, this target's written; listed, plan, lead: as leader, the records listed, the division computed, written; division: this target's part read; apply: shares set at the target)",
        );
        for (phase, s) in &self.phase_cpu_seconds_total {
            m.row(
                "interval_cpu_seconds_total",
                &format!("phase=\"{phase}\""),
                *s,
            );
        }
        m.one(
            "division_records_written_total",
            "counter",
            "division records (a target's part, the head) the leader wrote to etcd",
            "",
            self.division_puts_total as f64,
        );
        m.one(
            "division_requests_total",
            "counter",
            "requests to etcd (transactions of several records) that carried the division records",
            "",
            self.division_requests_total as f64,
        );
        m.one(
            "division_bytes_written_total",
            "counter",
            "bytes of the division records the leader wrote to etcd",
            "",
            self.division_bytes_total as f64,
        );
        if let Some(seq) = self.division_seq {
            m.one(
                "division_seq",
                "gauge",
                "sequence number of the division applied (this target in it)",
                "",
                seq as f64,
            );
        }
        // Every host of the division or of the cluster, once.
        let nqns: std::collections::BTreeSet<&String> = self
            .shares
            .keys()
            .chain(self.contracts.keys())
            .chain(self.refused.keys())
            .collect();
        let hosts = |m: &mut Metrics, name, help, f: &dyn Fn(&str) -> Option<u64>| {
            m.head(name, "gauge", help);
            for nqn in &nqns {
                if let Some(v) = f(nqn) {
                    m.row(name, &format!("host_nqn=\"{}\"", escape(nqn)), v as f64);
                }
            }
        };
        let share = |nqn: &str| self.shares.get(nqn);
        let contract = |nqn: &str| self.contracts.get(nqn);
        hosts(
            &mut m,
            "share_reservation_iops",
            "this target's share of the host's cluster reservation, from the division",
            &|nqn| share(nqn).map(|s| s.reservation_iops),
        );
        hosts(
            &mut m,
            "share_limit_iops",
            "this target's share of the host's cluster limit, from the division (absent: no limit)",
            &|nqn| share(nqn).and_then(|s| s.limit_iops),
        );
        hosts(
            &mut m,
            "host_reservation_iops",
            "the host's reservation over the whole cluster",
            &|nqn| contract(nqn).map(|c| c.reservation_iops),
        );
        hosts(
            &mut m,
            "host_limit_iops",
            "the host's limit over the whole cluster (absent: no limit)",
            &|nqn| contract(nqn).and_then(|c| c.limit_iops),
        );
        hosts(
            &mut m,
            "share_reservation_mibps",
            "this target's share of the host's cluster MiB/s reservation (absent: none)",
            &|nqn| share(nqn).map(|s| s.reservation_mibps).filter(|&v| v > 0),
        );
        hosts(
            &mut m,
            "share_limit_mibps",
            "this target's share of the host's cluster MiB/s limit (absent: no limit)",
            &|nqn| share(nqn).and_then(|s| s.limit_mibps),
        );
        hosts(
            &mut m,
            "host_reservation_mibps",
            "the host's MiB/s reservation over the whole cluster (absent: none)",
            &|nqn| {
                contract(nqn)
                    .map(|c| c.reservation_mibps)
                    .filter(|&v| v > 0)
            },
        );
        hosts(
            &mut m,
            "host_limit_mibps",
            "the host's MiB/s limit over the whole cluster (absent: no limit)",
            &|nqn| contract(nqn).and_then(|c| c.limit_mibps),
        );
        hosts(
            &mut m,
            "share_refused",
            "1 when the target refused this host's share at the last interval (qos_host_set failed; the agent retries every interval)",
            &|nqn| Some(u64::from(self.refused.contains_key(nqn))),
        );
        m.text
    }
}

/// Text of Prometheus' exposition format, every name prefixed `nvmf_qos_agent_`.
#[derive(Debug, Default)]
struct Metrics {
    text: String,
}

impl Metrics {
    fn head(&mut self, name: &str, kind: &str, help: &str) {
        let _ = writeln!(self.text, "# HELP nvmf_qos_agent_{name} {help}");
        let _ = writeln!(self.text, "# TYPE nvmf_qos_agent_{name} {kind}");
    }
    fn row(&mut self, name: &str, labels: &str, v: f64) {
        if labels.is_empty() {
            let _ = writeln!(self.text, "nvmf_qos_agent_{name} {v}");
        } else {
            let _ = writeln!(self.text, "nvmf_qos_agent_{name}{{{labels}}} {v}");
        }
    }
    fn one(&mut self, name: &str, kind: &str, help: &str, labels: &str, v: f64) {
        self.head(name, kind, help);
        self.row(name, labels, v);
    }
}

fn escape(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// The metrics listener could not start.
#[derive(Debug, Error)]
pub enum ServeError {
    #[error(
        "cannot listen on {addr} for /metrics: {source}; give --listen another address:port (or free this one)"
    )]
    Bind {
        addr: String,
        source: std::io::Error,
    },
}

/// Listens on `addr` (`127.0.0.1:9635`) and answers `/metrics` and `/healthz` from
/// `status` on a thread of its own, one connection at a time (a scraper and a health
/// check are the only clients). Returns the address bound (port 0: the one chosen).
pub fn serve(addr: &str, status: Arc<Mutex<AgentStatus>>) -> Result<SocketAddr, ServeError> {
    let listener = TcpListener::bind(addr).map_err(|source| ServeError::Bind {
        addr: addr.into(),
        source,
    })?;
    let bound = listener.local_addr().map_err(|source| ServeError::Bind {
        addr: addr.into(),
        source,
    })?;
    std::thread::Builder::new()
        .name("metrics".into())
        .spawn(move || {
            for conn in listener.incoming() {
                match conn {
                    Ok(c) => {
                        if let Err(e) = answer(c, &status) {
                            tracing::debug!("metrics request: {e}");
                        }
                    }
                    Err(e) => tracing::warn!("metrics listener: {e}"),
                }
            }
        })
        .map_err(|source| ServeError::Bind {
            addr: addr.into(),
            source,
        })?;
    Ok(bound)
}

fn answer(mut c: TcpStream, status: &Mutex<AgentStatus>) -> std::io::Result<()> {
    // A client that sends nothing must not hold the listener for long.
    c.set_read_timeout(Some(Duration::from_secs(2)))?;
    c.set_write_timeout(Some(Duration::from_secs(2)))?;
    let mut req = Vec::new();
    let mut buf = [0u8; 1024];
    while !req.windows(4).any(|w| w == b"\r\n\r\n") && req.len() < 8192 {
        let n = c.read(&mut buf)?;
        if n == 0 {
            break;
        }
        req.extend_from_slice(&buf[..n]);
    }
    let line = String::from_utf8_lossy(&req);
    let mut parts = line.split_whitespace();
    let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let path = target.split('?').next().unwrap_or("");
    let now = Instant::now();
    let (code, ctype, body) = match (method, path) {
        ("GET", "/metrics") => {
            let s = status.lock().unwrap_or_else(|p| p.into_inner());
            (
                200,
                "text/plain; version=0.0.4; charset=utf-8",
                s.render(now),
            )
        }
        ("GET", "/healthz") => {
            let s = status.lock().unwrap_or_else(|p| p.into_inner());
            let (code, text) = s.health(now);
            (code, "text/plain; charset=utf-8", text)
        }
        ("GET", "/handover") => {
            let s = status.lock().unwrap_or_else(|p| p.into_inner());
            (200, "application/json", s.handover.clone())
        }
        ("GET", _) => (
            404,
            "text/plain",
            "try /metrics, /healthz or /handover\n".into(),
        ),
        _ => (405, "text/plain", "GET only\n".into()),
    };
    let reason = match code {
        200 => "OK",
        404 => "Not Found",
        405 => "Method Not Allowed",
        _ => "Service Unavailable",
    };
    write!(
        c,
        "HTTP/1.1 {code} {reason}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )?;
    c.flush()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> AgentConfig {
        AgentConfig {
            cluster: "c".into(),
            target: "a".into(),
            domain: "d".into(),
            lease_ttl_s: 2,
            window_ms: None,
            handover_url: None,
        }
    }

    #[test]
    fn health_follows_the_last_etcd_contact_against_the_lease_ttl() {
        let mut s = AgentStatus::new(&cfg());
        let t0 = Instant::now();
        assert_eq!(s.health(t0).0, 503, "before any contact");
        let ok = TickReport {
            target_ok: true,
            etcd_ok: true,
            etcd_reachable: true,
            ..Default::default()
        };
        s.record(&ok, true, t0, SystemTime::now());
        assert_eq!(s.health(t0 + Duration::from_millis(1900)).0, 200);
        let down = TickReport {
            target_ok: true,
            etcd_ok: false,
            errors: vec!["etcd down".into()],
            ..Default::default()
        };
        s.record(&down, true, t0 + Duration::from_secs(1), SystemTime::now());
        assert_eq!(s.health(t0 + Duration::from_millis(1900)).0, 200);
        let (code, why) = s.health(t0 + Duration::from_millis(2100));
        assert_eq!(code, 503, "{why}");
        assert!(why.contains("lease TTL"), "{why}");
    }

    #[test]
    fn a_taken_target_name_is_unhealthy_and_shown() {
        let mut s = AgentStatus::new(&cfg());
        let t0 = Instant::now();
        let taken = TickReport {
            target_ok: true,
            etcd_ok: true,
            etcd_reachable: true,
            name_taken: true,
            errors: vec!["target name t is taken: ...".into()],
            ..Default::default()
        };
        s.record(&taken, true, t0, SystemTime::now());
        let (code, why) = s.health(t0);
        assert_eq!(code, 503, "{why}");
        assert!(why.contains("is taken"), "{why}");
        assert!(s.render(t0).contains("nvmf_qos_agent_name_taken 1"));
        let ok = TickReport {
            name_taken: false,
            ..taken
        };
        s.record(&ok, true, t0, SystemTime::now());
        assert_eq!(s.health(t0).0, 200);
        assert!(s.render(t0).contains("nvmf_qos_agent_name_taken 0"));
    }

    #[test]
    fn the_phases_cpu_time_is_summed_by_phase() {
        use crate::agent::Phase;
        let mut s = AgentStatus::new(&cfg());
        let t0 = Instant::now();
        let phase = |what, cpu_ms| Phase {
            what,
            wall: Duration::from_millis(cpu_ms + 1),
            cpu: Some(Duration::from_millis(cpu_ms)),
        };
        let r = TickReport {
            target_ok: true,
            phases: vec![phase("target", 2), phase("apply", 1)],
            ..Default::default()
        };
        s.record(&r, true, t0, SystemTime::now());
        s.record(&r, true, t0, SystemTime::now());
        let no_clock = TickReport {
            phases: vec![Phase {
                cpu: None,
                ..phase("target", 5)
            }],
            ..Default::default()
        };
        s.record(&no_clock, true, t0, SystemTime::now());
        let text = s.render(t0);
        for line in [
            "nvmf_qos_agent_interval_cpu_seconds_total{phase=\"target\"} 0.004",
            "nvmf_qos_agent_interval_cpu_seconds_total{phase=\"apply\"} 0.002",
        ] {
            assert!(text.contains(line), "{line} in\n{text}");
        }
    }

    #[test]
    fn errors_are_counted_by_kind_and_shares_by_host() {
        let mut s = AgentStatus::new(&cfg());
        let t0 = Instant::now();
        let target_down = TickReport {
            etcd_reachable: true,
            errors: vec!["socket".into()],
            ..Default::default()
        };
        s.record(&target_down, false, t0, SystemTime::now());
        let refused = TickReport {
            target_ok: true,
            etcd_ok: true,
            etcd_reachable: true,
            leader: true,
            shares_seq: Some(7),
            shares: Arc::new(BTreeMap::from([(
                "h\"1".to_string(),
                LocalShare {
                    reservation_iops: 300,
                    limit_iops: None,
                    weight: 1,
                    ..Default::default()
                },
            )])),
            refused: BTreeMap::from([("h2".to_string(), "share of h2 (...): ENOSPC".to_string())]),
            ..Default::default()
        };
        s.record(&refused, true, t0, SystemTime::now());
        let text = s.render(t0);
        for line in [
            "nvmf_qos_agent_errors_total{kind=\"target\"} 1",
            "nvmf_qos_agent_errors_total{kind=\"etcd\"} 0",
            "nvmf_qos_agent_errors_total{kind=\"other\"} 1",
            "nvmf_qos_agent_leader 1",
            "nvmf_qos_agent_lease_held 1",
            "nvmf_qos_agent_division_seq 7",
            "nvmf_qos_agent_share_reservation_iops{host_nqn=\"h\\\"1\"} 300",
            "nvmf_qos_agent_intervals_total 2",
            "nvmf_qos_agent_share_refused{host_nqn=\"h2\"} 1",
            "nvmf_qos_agent_share_refused{host_nqn=\"h\\\"1\"} 0",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} not in\n{text}");
        }
        assert!(!text.contains("share_limit_iops{"), "no limit, no row");
    }

    #[test]
    fn a_dead_target_does_not_make_etcd_look_unreachable() {
        let mut s = AgentStatus::new(&cfg());
        let t0 = Instant::now();
        let lines = |s: &AgentStatus| s.render(t0);
        // The target does not answer; etcd does (the agent checked).
        let r = TickReport {
            etcd_reachable: true,
            errors: vec!["target's RPC socket".into()],
            ..Default::default()
        };
        s.record(&r, false, t0, SystemTime::now());
        let text = lines(&s);
        for line in [
            "nvmf_qos_agent_target_up 0",
            "nvmf_qos_agent_etcd_up 1",
            "nvmf_qos_agent_errors_total{kind=\"target\"} 1",
            "nvmf_qos_agent_errors_total{kind=\"etcd\"} 0",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} not in\n{text}");
        }
        // Both down: both counted, etcd_up 0.
        let r = TickReport {
            errors: vec!["target's RPC socket".into(), "etcd unreachable".into()],
            ..Default::default()
        };
        s.record(&r, false, t0, SystemTime::now());
        let text = lines(&s);
        for line in [
            "nvmf_qos_agent_etcd_up 0",
            "nvmf_qos_agent_errors_total{kind=\"target\"} 2",
            "nvmf_qos_agent_errors_total{kind=\"etcd\"} 1",
            "nvmf_qos_agent_errors_total{kind=\"other\"} 0",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} not in\n{text}");
        }
    }
}
