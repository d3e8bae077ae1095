//! The leader agent's CPU per interval, predicted (issue 42, item 4): `plan`'s measured
//! time plus the interval's record handling, the bytes of records the lab counts
//! ([`LeaderBytes`]) times per-byte costs measured on this machine ([`ByteCosts`]) by a
//! calibration that does to records of the scenario's size what the agent does to
//! them, with the same libraries (serde_json, base64): decoding etcd's JSON answer
//! (records base64-encoded in it) and comparing each record with the text read the
//! interval before; parsing a record into the agent's types; serialising one into a
//! put's JSON; reading its target's answer to `qos_stats_get` in the counters form
//! (every host configured there, cut off a buffered stream and read straight into the
//! agent's types by the agent's own JSON-RPC client code, `rpc_client`); and each of
//! its etcd requests (HTTP on a kept connection, the answer's JSON, the kernel's part
//! on the agent's side), a CPU time per request measured on the agent's own etcd client
//! against a real etcd when its binary is on the machine, else against a stand-in of
//! etcd's gateway ([`request_ns`]), times the requests the lab counts; and its per-host
//! bookkeeping of an interval (demand meter, handover book, its records' filters, cold
//! shares, reconciliation, its metrics' record of the interval), timed with the agent's
//! functions ([`bookkeeping_ns`]). Not modelled: the target's `qos_host_set`s, the
//! agent's log line and its main loop.

// Calibrations count the calling thread's time on a CPU (the agent's own reader) rather
// than the wall clock: on a loaded machine the wall clock also counts the time other
// work had the core (lab runs at load 9.8 read 69-103 ms an interval where quiet ones
// read 7-12).
use nvmf_qos_agent::cpu::thread_cpu_ns;
use std::collections::{BTreeMap, BTreeSet};
use std::hint::black_box;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use qos_core::cluster::{ClusterHost, LocalShare, PathDemand, cold_share, with_cold_shares};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::etcd::LeaderBytes;
use super::{ClusterRun, ClusterScenario};

/// Nanoseconds per byte of record, measured.
#[derive(Debug, Clone, PartialEq)]
pub struct ByteCosts {
    /// The target's answer each interval (`qos_stats_get`'s counters form: every host
    /// configured at the target), read off the socket straight into the agent's types
    /// and then into its counters and settings.
    pub target_ns: f64,
    /// That answer's bytes per host configured at the target.
    pub target_bytes_per_host: f64,
    /// Hosts configured at the leader's target: every host of the scenario (a host
    /// holds at least its cold share at every target).
    pub hosts_at_target: u64,
    /// Listed: in etcd's JSON answer (base64), decoded, compared with the last text.
    pub listed_ns: f64,
    /// The hosts' contracts (a key each), listed and parsed, per byte of their keys and
    /// values: a listing of many small records costs more a byte than one of a few
    /// large ones.
    pub contracts_ns: f64,
    /// Parsed into the agent's types.
    pub parsed_ns: f64,
    /// Written: serialised, base64-encoded into the put's JSON.
    pub written_ns: f64,
    /// The agent's per-host bookkeeping of an interval ([`bookkeeping_ns`]),
    /// nanoseconds an interval; 0 when not measured.
    pub bookkeeping_ns: f64,
    /// One etcd request of the agent's client, beside its records' bytes (HTTP on a
    /// kept connection, the answer's JSON, the kernel's part on the agent's side),
    /// nanoseconds of the calling thread's CPU ([`request_ns`]); 0 when not measured.
    pub request_ns: f64,
    /// What answered those requests: a real etcd (its binary) or the stand-in.
    pub request_against: RequestsAgainst,
    /// `target_ns` was measured off a Unix socket (else from memory).
    pub target_over_socket: bool,
    /// That socket's stand-in target answered from one CPU and the answer was read on
    /// another (else where the scheduler put them).
    pub target_across_cores: bool,
}

/// What answered the per-request calibration ([`request_ns`]).
#[derive(Debug, Clone, PartialEq, Default)]
pub enum RequestsAgainst {
    /// Not measured.
    #[default]
    Nothing,
    /// A real etcd, started by the lab from this binary.
    Etcd(PathBuf),
    /// The lab's stand-in of etcd's gateway (no etcd binary, or it did not start).
    StandIn,
}

impl std::fmt::Display for RequestsAgainst {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RequestsAgainst::Nothing => write!(f, "not measured"),
            RequestsAgainst::Etcd(bin) => write!(f, "a real etcd, {}", bin.display()),
            RequestsAgainst::StandIn => write!(f, "the lab's stand-in for etcd"),
        }
    }
}

/// The agent's demand record (cluster-agent/src/keys.rs).
#[derive(Serialize, Deserialize)]
struct Demand {
    hosts: BTreeMap<String, PathDemand>,
}

/// The agent's member record.
#[derive(Serialize, Deserialize)]
struct Member {
    target: String,
    domain: String,
    capacity_iops: u64,
    period_ms: u64,
    applied: BTreeMap<String, LocalShare>,
    error: Option<String>,
    #[serde(default)]
    handover_url: Option<String>,
}

/// A host of the target plugin's counters form (spdk-plugin/src/stats.rs,
/// `CounterHost`; the agent's reader is `CountersHost` in cluster-agent/src/target.rs).
#[derive(Serialize, Deserialize)]
struct CounterHost {
    host_nqn: String,
    configured: bool,
    completed_total: Work,
    held_time: HeldSum,
    #[serde(skip_serializing_if = "Option::is_none")]
    min_iops: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_iops: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    min_mibps: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_mibps: Option<u64>,
    weight: u32,
}

#[derive(Serialize, Deserialize)]
struct Work {
    ops: u64,
    bytes: u64,
    ios: u64,
}

#[derive(Serialize, Deserialize)]
struct HeldSum {
    sum_ns: u64,
}

/// A domain of the counters form.
#[derive(Serialize, Deserialize)]
struct CountersDomain {
    name: String,
    epoch: u64,
    period_ns: u64,
    capacity_estimate: BTreeMap<String, Option<u64>>,
    capacity_learning: bool,
    hosts: Vec<CounterHost>,
}

/// The target's JSON-RPC answer to `qos_stats_get` in the counters form for `nqns`
/// (each with a share and counters that moved), as the agent receives it.
fn counters_answer(nqns: &[&str]) -> String {
    let domain = CountersDomain {
        name: "d".into(),
        epoch: 123_456,
        period_ns: 1_000_000_000,
        capacity_estimate: [
            ("bytes".to_string(), None),
            ("ops".to_string(), Some(200_000)),
        ]
        .into_iter()
        .collect(),
        capacity_learning: false,
        hosts: nqns
            .iter()
            .enumerate()
            .map(|(k, n)| {
                let ops = 1_000_000 + k as u64 * 7919;
                CounterHost {
                    host_nqn: n.to_string(),
                    configured: true,
                    completed_total: Work {
                        ops,
                        bytes: ops * 4096,
                        ios: ops,
                    },
                    held_time: HeldSum {
                        sum_ns: k as u64 * 1_234_567,
                    },
                    min_iops: (k % 2 == 0).then_some(200 + k as u64 % 1400),
                    max_iops: Some(1000 + (k as u64 * 31) % 5000),
                    min_mibps: None,
                    max_mibps: None,
                    weight: 1 + (k as u32 % 10),
                }
            })
            .collect(),
    };
    json!({ "jsonrpc": "2.0", "id": 7, "result": [domain] }).to_string()
}

/// What the agent does with the target's answer (`rpc_client::Client::call_as` and
/// `target::counters_state`, the agent's own code): the answer's text cut off a buffered
/// stream, its id and error read, its result read straight into the agent's types,
/// then its counters and settings. `text` keeps its capacity from one read to the
/// next, as the agent's client keeps it.
fn read_counters(answer: &[u8], text: &mut Vec<u8>) -> nvmf_qos_agent::target::LocalState {
    use nvmf_qos_agent::target::{CountersDomain, counters_state};
    let mut stream = std::io::BufReader::new(answer);
    assert!(rpc_client::read_text(&mut stream, text).expect("an answer"));
    let rpc_client::Reply::Result(domains) =
        rpc_client::parse_reply::<Vec<CountersDomain>>(text, 7).expect("json-rpc")
    else {
        panic!("not the counters form")
    };
    let d = domains.into_iter().next().expect("a domain");
    counters_state(d).expect("the counters form")
}

/// The calling thread held to one CPU until this is dropped, when it gets back the CPUs
/// it was allowed before.
struct PinnedThread {
    allowed_before: rustix::thread::CpuSet,
}

impl PinnedThread {
    /// Holds the calling thread to `cpu`; `None` (the thread left as it was) where the
    /// kernel refuses.
    fn to(cpu: usize) -> Option<PinnedThread> {
        let allowed_before = rustix::thread::sched_getaffinity(None).ok()?;
        let mut only = rustix::thread::CpuSet::new();
        only.set(cpu);
        rustix::thread::sched_setaffinity(None, &only).ok()?;
        Some(PinnedThread { allowed_before })
    }
}

impl Drop for PinnedThread {
    fn drop(&mut self) {
        let _ = rustix::thread::sched_setaffinity(None, &self.allowed_before);
    }
}

/// Two different CPUs the calling thread may run on, for the stand-in target and for
/// the reader of its answer, as `nvmf_tgt`'s reactor and the agent run: the first and
/// the last allowed. `None` on one CPU.
fn target_and_reader_cpus() -> Option<(usize, usize)> {
    let allowed = rustix::thread::sched_getaffinity(None).ok()?;
    let mut cpus = (0..rustix::thread::CpuSet::MAX_CPU).filter(|&c| allowed.is_set(c));
    let first = cpus.next()?;
    let last = cpus.next_back()?;
    Some((first, last))
}

/// A stand-in for the target's JSON-RPC socket: a Unix socket in the temporary
/// directory, served by a thread of the lab (held to `cpu` where given) that answers
/// each request on the first connection made to it with `answer` (a counters-form
/// answer, [`counters_answer`]), under the request's id, until that connection closes.
/// Returns the socket's path (removed once the connection is made).
fn stand_in_target(answer: String, cpu: Option<usize>) -> std::io::Result<PathBuf> {
    use std::io::Write;
    let sock = std::env::temp_dir().join(format!(
        "qos-lab-target-{}-{:?}.sock",
        std::process::id(),
        std::thread::current().id()
    ));
    let _ = std::fs::remove_file(&sock);
    let listener = std::os::unix::net::UnixListener::bind(&sock)?;
    let path = sock.clone();
    // The answer's text around its id, which is the request's.
    let (head, tail) = answer.split_once("\"id\":7").expect("an id");
    let (head, tail) = (head.to_string(), tail.to_string());
    std::thread::spawn(move || {
        let _pinned = cpu.and_then(PinnedThread::to);
        let Ok((conn, _)) = listener.accept() else {
            return;
        };
        let _ = std::fs::remove_file(&path);
        let mut w = conn.try_clone().expect("a socket");
        let mut r = std::io::BufReader::new(conn);
        let mut text = Vec::new();
        while let Ok(true) = rpc_client::read_text(&mut r, &mut text) {
            let id = serde_json::from_slice::<Value>(&text)
                .ok()
                .and_then(|v| v["id"].as_u64())
                .unwrap_or(0);
            let reply = format!("{head}\"id\":{id}{tail}");
            if w.write_all(reply.as_bytes()).is_err() {
                return;
            }
        }
    });
    Ok(sock)
}

/// The target's answer for `nqns` read as the agent reads it (nanoseconds per byte,
/// bytes per host), `hosts` configured at the target; the record costs left at 0.
/// Read by the agent's own `target::SocketTarget` off a Unix socket from a stand-in of
/// the target ([`stand_in_target`]): the request, the reads of 0.2 MB off the socket
/// and the wake-ups are the agent's too (read from memory, the answer cost about 6-10
/// ns/B where the agent's profile gave about 9.5), each read after its caches were swept
/// ([`time_cold`]). The stand-in answers from one CPU and the reader reads on another
/// where there are two (`target_across_cores`): `nvmf_tgt`'s reactor writes the answer
/// on its core and the agent reads it on the other. (On one core the lab read it at
/// 6.3-7.3 ns/B every run; across cores at 7.0-11.1, with the machine's speed of the
/// moment: docs/cluster.md, "Across cores, the agent's CPU by phase".) From memory where
/// the socket cannot be made (`target_over_socket` false).
fn target_costs(nqns: &[&str], hosts: u64) -> ByteCosts {
    let answer = counters_answer(nqns);
    let cpus = target_and_reader_cpus();
    let reader_pinned = cpus.and_then(|(_, reader)| PinnedThread::to(reader));
    let target_across_cores = reader_pinned.is_some();
    let target_cpu = cpus.filter(|_| target_across_cores).map(|(t, _)| t);
    let over_socket = stand_in_target(answer.clone(), target_cpu)
        .ok()
        .and_then(|sock| {
            use nvmf_qos_agent::target::{SocketTarget, TargetRpc};
            let mut t = SocketTarget::new(sock, Duration::from_secs(5));
            // The connection made and the counters form asked for, as at the agent's
            // first interval.
            t.read("d").ok()?;
            let mut ok = true;
            // The agent reads its target first thing in an interval, after a second's
            // sleep in which etcd and other work had the core: its caches are cold then
            // (a profile of the agent put the read at about twice a warm loop's time).
            let ns = time_cold(|| {
                ok &= black_box(t.read("d")).is_ok();
            })?;
            ok.then_some(ns)
        });
    let target_over_socket = over_socket.is_some();
    let ns = over_socket.unwrap_or_else(|| {
        let mut text = Vec::new();
        time(|| {
            black_box(read_counters(black_box(answer.as_bytes()), &mut text));
        })
    });
    ByteCosts {
        target_ns: ns / answer.len() as f64,
        target_bytes_per_host: answer.len() as f64 / nqns.len().max(1) as f64,
        hosts_at_target: hosts,
        listed_ns: 0.0,
        contracts_ns: 0.0,
        parsed_ns: 0.0,
        written_ns: 0.0,
        request_ns: 0.0,
        request_against: RequestsAgainst::Nothing,
        target_over_socket,
        target_across_cores: target_over_socket && target_across_cores,
        bookkeeping_ns: 0.0,
    }
}

/// The agent's per-host bookkeeping of an interval, with its own functions, over up to
/// 1,000 of `s`'s hosts (all configured at its target, holding their cold shares; its
/// part lists the hosts with a path there, two targets' worth of the hosts over the
/// scenario's targets): the demand meter over the target's counters
/// (`demand::DemandMeter`, `held_near_a_limit`), the handover book's view of the
/// demand, its demand and member records' filters over the hosts
/// (`agent::demand_record`, `agent::member_applied`), its part with the other hosts'
/// cold shares (`with_cold_shares`), the reconciliation against the target's settings
/// (`agent::reconcile`) and its metrics' record of the interval
/// (`metrics::AgentStatus::record`, `set_handover`). Nanoseconds an interval (the
/// counters moved by a few additions each, within the timing).
fn bookkeeping_ns(s: &ClusterScenario) -> f64 {
    use nvmf_qos_agent::agent::{
        AgentConfig, TickReport, demand_record, member_applied, reconcile,
    };
    use nvmf_qos_agent::demand::{DemandMeter, held_near_a_limit};
    use nvmf_qos_agent::metrics::AgentStatus;
    use nvmf_qos_agent::target::HostCounters;
    let contracts: Arc<BTreeMap<String, ClusterHost>> =
        Arc::new(super::engine::contracts(s).into_iter().take(1000).collect());
    let n = contracts.len().max(1);
    let settings: BTreeMap<String, LocalShare> = contracts
        .iter()
        .map(|(k, c)| (k.clone(), cold_share(c)))
        .collect();
    let on_path = (n * 2 / s.targets.len().max(1)).max(1);
    let part: BTreeMap<String, LocalShare> = contracts
        .iter()
        .step_by((n / on_path).max(1))
        .map(|(k, c)| {
            let share = LocalShare {
                reservation_iops: c.reservation_iops / 2,
                limit_iops: c.limit_iops.map(|l| l / 2),
                weight: c.weight,
                ..Default::default()
            };
            (k.clone(), share)
        })
        .collect();
    let managed: BTreeSet<String> = contracts.keys().cloned().collect();
    let mut counters: BTreeMap<String, HostCounters> = contracts
        .keys()
        .map(|k| (k.clone(), HostCounters::default()))
        .collect();
    let mut meter = DemandMeter::default();
    let mut handover = qos_core::handover::Handover::new("t000");
    let mut status = AgentStatus::new(&AgentConfig {
        cluster: "fleet".into(),
        target: "t000".into(),
        domain: "d".into(),
        lease_ttl_s: 4,
        window_ms: None,
        handover_url: Some("http://127.0.0.1:9100/handover".into()),
    });
    let mut now_ms = 0u64;
    time(|| {
        now_ms += 1000;
        for (i, c) in counters.values_mut().enumerate() {
            let ops = (i as u64 % 7) * 100;
            c.completed_ops += ops;
            c.completed_bytes += ops * 4096;
            c.held_ns += (i as u64 % 3) * 1_000_000;
        }
        let mut demand = meter.observe(now_ms, &counters, 1000);
        held_near_a_limit(&mut demand, &settings);
        handover.observe(&demand);
        black_box(demand_record(&demand, &contracts));
        black_box(member_applied(
            &settings,
            &contracts,
            nvmf_qos_agent::keys::KEY_SCHEMA,
        ));
        let mine = Arc::new(with_cold_shares(&part, &contracts));
        black_box(reconcile(Some(&mine), &contracts, &settings, &managed));
        let r = TickReport {
            target_ok: true,
            etcd_ok: true,
            etcd_reachable: true,
            leader: true,
            shares_seq: Some(now_ms),
            shares: mine,
            contracts: Arc::clone(&contracts),
            ..Default::default()
        };
        status.record(&r, true, Instant::now(), std::time::SystemTime::now());
        status.set_handover(&handover.report());
    })
}

/// etcd's answer to a range of `records` (key, value): each in base64 with the
/// revisions, version and lease etcd gives beside them.
fn range_answer<'a>(records: impl Iterator<Item = (&'a str, &'a str)>) -> String {
    let kvs: Vec<Value> = records
        .map(|(k, v)| {
            json!({
                "key": B64.encode(k),
                "create_revision": "1234",
                "mod_revision": "12345",
                "version": "17",
                "value": B64.encode(v),
                "lease": "7587882338938063366",
            })
        })
        .collect();
    json!({
        "header": {"cluster_id": "14841639068965178418", "member_id": "10276657743932975437",
                   "revision": "12345", "raft_term": "2"},
        "kvs": kvs,
        "count": kvs.len().to_string(),
    })
    .to_string()
}

/// What the agent does with a listing (`nvmf_qos_agent::store`): etcd's answer read
/// from its bytes into its keys and values, decoded.
fn list(answer: &str) -> Vec<(String, String)> {
    serde_json::from_slice::<nvmf_qos_agent::store::Range>(answer.as_bytes())
        .expect("json")
        .records()
        .expect("base64")
}

/// The contracts of up to 1,000 of `s`'s hosts listed and parsed as the agent does
/// (its listing, then `keys::hosts_of`), nanoseconds per byte of their keys and values.
fn contracts_ns(s: &ClusterScenario) -> f64 {
    let keys = nvmf_qos_agent::keys::Keys::new("fleet");
    let texts: Vec<(String, String)> = super::engine::contracts(s)
        .iter()
        .take(1000)
        .map(|(n, c)| (keys.host(n), serde_json::to_string(c).expect("json")))
        .collect();
    let bytes: usize = texts.iter().map(|(k, v)| k.len() + v.len()).sum();
    let answer = range_answer(texts.iter().map(|(k, v)| (k.as_str(), v.as_str())));
    let ns = time(|| {
        let mut bad = Vec::new();
        let hosts = nvmf_qos_agent::keys::hosts_of(&keys, list(black_box(&answer)), &mut bad);
        black_box((hosts, bad));
    });
    ns / bytes.max(1) as f64
}

/// A stand-in for etcd's JSON gateway on 127.0.0.1 (a thread of this process, one
/// kept HTTP/1.1 connection at a time): answers each call with a fixed answer of the
/// shape etcd gives (its header, a lease's TTL, a transaction's outcome, one key).
fn stand_in_gateway() -> std::io::Result<String> {
    use std::io::{BufRead, BufReader, Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    let url = format!("http://{}", listener.local_addr()?);
    std::thread::spawn(move || {
        let header = r#"{"cluster_id":"14841639068965178418","member_id":"10276657743932975437","revision":"4242","raft_term":"2"}"#;
        let value = B64.encode(r#"{"schema":3,"divide":{"headroom_milli":50}}"#);
        for conn in listener.incoming() {
            let Ok(conn) = conn else { return };
            let mut w = conn.try_clone().expect("a socket");
            let mut r = BufReader::new(conn);
            loop {
                let (mut path, mut len, mut line) = (String::new(), 0usize, String::new());
                loop {
                    line.clear();
                    if r.read_line(&mut line).unwrap_or(0) == 0 {
                        return;
                    }
                    let l = line.trim_end();
                    if l.is_empty() {
                        break;
                    }
                    if path.is_empty() {
                        path = l.split(' ').nth(1).unwrap_or("").to_string();
                    } else if let Some((k, v)) = l.split_once(':')
                        && k.eq_ignore_ascii_case("content-length")
                    {
                        len = v.trim().parse().unwrap_or(0);
                    }
                }
                let mut body = vec![0; len];
                if r.read_exact(&mut body).is_err() {
                    break;
                }
                let answer = match path.as_str() {
                    "/v3/lease/grant" => {
                        format!(r#"{{"header":{header},"ID":"7587882338938063366","TTL":"600"}}"#)
                    }
                    "/v3/lease/keepalive" => format!(
                        r#"{{"result":{{"header":{header},"ID":"7587882338938063366","TTL":"4"}}}}"#
                    ),
                    "/v3/kv/txn" => format!(
                        r#"{{"header":{header},"responses":[{{"response_put":{{"header":{{"revision":"4242"}}}}}}]}}"#
                    ),
                    "/v3/kv/range" => format!(
                        r#"{{"header":{header},"kvs":[{{"key":"L252bWYtcW9zL2ZsZWV0L2NvbmZpZw==","create_revision":"5","mod_revision":"5","version":"1","value":"{value}"}}],"count":"1"}}"#
                    ),
                    _ => format!(r#"{{"header":{header}}}"#),
                };
                let reply = format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nGrpc-Metadata-Content-Type: application/grpc\r\nDate: Mon, 30 Nov 2026 12:00:00 GMT\r\nContent-Length: {}\r\n\r\n{answer}",
                    answer.len()
                );
                if w.write_all(reply.as_bytes()).is_err() {
                    break;
                }
            }
        }
    });
    Ok(url)
}

/// Where etcd's binary is: `$NVMF_QOS_LAB_ETCD`, else Debian's (`/usr/bin/etcd`) or
/// `/usr/local/bin/etcd`; `None` when none is there.
pub(super) fn etcd_binary() -> Option<PathBuf> {
    match std::env::var_os("NVMF_QOS_LAB_ETCD") {
        Some(p) => Some(PathBuf::from(p)),
        None => ["/usr/bin/etcd", "/usr/local/bin/etcd"]
            .iter()
            .map(PathBuf::from)
            .find(|p| p.exists()),
    }
    .filter(|p| p.exists())
}

/// A real etcd for the per-request calibration: a single member on 127.0.0.1 (ports the
/// kernel hands out, a fresh data directory under the temporary directory), with
/// etcd's default settings as the agent at scale's test starts it. Killed and its
/// directory removed when dropped.
pub(super) struct RealEtcd {
    child: std::process::Child,
    dir: PathBuf,
    pub(super) url: String,
}

impl RealEtcd {
    /// Starts `bin` and waits until it answers a read (at most 20 s); `None` when it
    /// does not.
    pub(super) fn start(bin: &std::path::Path) -> Option<RealEtcd> {
        use nvmf_qos_agent::store::{EtcdGateway, Store};
        let port = || {
            std::net::TcpListener::bind("127.0.0.1:0")
                .and_then(|l| l.local_addr())
                .map(|a| a.port())
                .ok()
        };
        let (client, peer) = (port()?, port()?);
        let url = format!("http://127.0.0.1:{client}");
        let peer_url = format!("http://127.0.0.1:{peer}");
        let dir =
            std::env::temp_dir().join(format!("qos-lab-etcd-{}-{client}", std::process::id()));
        let child = std::process::Command::new(bin)
            .args(["--name", "lab", "--data-dir"])
            .arg(&dir)
            .args([
                "--listen-client-urls",
                &url,
                "--advertise-client-urls",
                &url,
            ])
            .args([
                "--listen-peer-urls",
                &peer_url,
                "--initial-advertise-peer-urls",
                &peer_url,
            ])
            .args(["--initial-cluster", &format!("lab={peer_url}")])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .ok()?;
        let etcd = RealEtcd { child, dir, url };
        let mut g = EtcdGateway::new(&etcd.url, Duration::from_secs(1));
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_secs(20) {
            if g.get("/nvmf-qos/lab").is_ok() {
                return Some(etcd);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        None
    }
}

impl Drop for RealEtcd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// CPU of one etcd request of the agent's own client (`nvmf_qos_agent::store::
/// EtcdGateway`), beside its records' bytes, nanoseconds, and what answered it: rounds of
/// the small calls of an agent's interval (a lease keep-alive, a get, a put of a short
/// value under the lease, the leader key's transaction) against a real etcd started
/// from its binary when there is one ([`etcd_binary`]; the agent's requests wait for
/// an etcd that answers from another process, and the wait and wake-up are part of
/// their cost: against the stand-in, which answers at once from a thread of the lab,
/// a request cost 22-46 us where the agent's profile gave about 110 us against the real
/// etcd), else against [`stand_in_gateway`]. For at least `at_least` of the calling
/// thread's CPU ([`thread_cpu_ns`]), the median of 3 such. `None` where the thread's CPU
/// time or the socket is not there.
pub fn request_ns() -> Option<(f64, RequestsAgainst)> {
    if let Some(bin) = etcd_binary()
        && let Some(etcd) = RealEtcd::start(&bin)
    {
        // Its writes go to disk (as the test's etcd's): fewer rounds than the stand-in's.
        if let Some(ns) = request_ns_at(&etcd.url, Duration::from_millis(100)) {
            return Some((ns, RequestsAgainst::Etcd(bin)));
        }
    }
    let url = stand_in_gateway().ok()?;
    let ns = request_ns_at(&url, Duration::from_millis(300))?;
    Some((ns, RequestsAgainst::StandIn))
}

/// [`request_ns`]'s rounds against the gateway at `url`.
fn request_ns_at(url: &str, at_least: Duration) -> Option<f64> {
    use nvmf_qos_agent::store::{EtcdGateway, Store};
    let mut g = EtcdGateway::new(url, Duration::from_secs(5));
    let lease = g.grant(600).ok()?;
    let config = r#"{"schema":3,"divide":{"headroom_milli":50}}"#;
    g.put("/nvmf-qos/fleet/config", config, None).ok()?;
    let value = r#"{"target":"t000","domain":"d","capacity_iops":200000,"period_ms":1000}"#;
    let mut round = || -> Option<()> {
        g.keep_alive(lease).ok()?;
        g.get("/nvmf-qos/fleet/config").ok()?;
        g.put("/nvmf-qos/fleet/member/t000", value, Some(lease))
            .ok()?;
        g.create("/nvmf-qos/fleet/leader", "t000", lease).ok()?;
        Some(())
    };
    // Warm: the connection made, the allocator's pools filled.
    for _ in 0..20 {
        round()?;
    }
    let at_least = at_least.as_nanos() as u64;
    let mut runs = Vec::new();
    for _ in 0..3 {
        let (t0, mut n) = (thread_cpu_ns()?, 0u64);
        while thread_cpu_ns()? - t0 < at_least {
            for _ in 0..8 {
                round()?;
            }
            n += 32;
        }
        let ns = thread_cpu_ns()? - t0;
        runs.push(ns as f64 / n as f64);
    }
    runs.sort_by(f64::total_cmp);
    Some(runs[1])
}

/// Nanoseconds of the thread's CPU per call of `f` ([`thread_cpu_ns`]; the wall clock
/// where that is not there), the median of 5 rounds of at least 20 ms each.
fn time(mut f: impl FnMut()) -> f64 {
    let clock = || thread_cpu_ns();
    let mut rounds: Vec<f64> = (0..5)
        .map(|_| {
            let wall = Instant::now();
            let cpu = clock();
            let mut n = 0u64;
            let spent = |n: u64| match (cpu, clock()) {
                (Some(a), Some(b)) if n > 0 => b.saturating_sub(a),
                _ => wall.elapsed().as_nanos() as u64,
            };
            // Batches doubling in size: the clock is read a few times a round, not
            // once a call.
            let mut batch = 1u64;
            loop {
                for _ in 0..batch {
                    f();
                }
                n += batch;
                if spent(n) >= 20_000_000 {
                    break;
                }
                batch *= 2;
            }
            spent(n) as f64 / n as f64
        })
        .collect();
    rounds.sort_by(f64::total_cmp);
    rounds[2]
}

/// Bytes swept between the calls of [`time_cold`]: more than a core's L1 and L2 (4 MiB
/// of L2 a core here), which a second of other work on the core refills; the shared L3
/// (260 MiB here) is left as other work would mostly leave it.
const COLD_SWEEP: usize = 16 << 20;

/// Nanoseconds of the thread's CPU per call of `f`, each call after an untimed sweep
/// over [`COLD_SWEEP`] bytes: the median of 5 rounds of 20 calls, each call timed alone
/// (the thread's CPU clock is exact to the call). `None` without that clock.
fn time_cold(mut f: impl FnMut()) -> Option<f64> {
    let mut sweep = vec![0u8; COLD_SWEEP];
    let mut rounds = Vec::new();
    for round in 0..5u8 {
        let mut spent = 0u64;
        for call in 0..20u8 {
            for line in sweep.chunks_mut(64) {
                line[0] = round ^ call;
            }
            black_box(&mut sweep);
            let t0 = thread_cpu_ns()?;
            f();
            spent += thread_cpu_ns()?.saturating_sub(t0);
        }
        rounds.push(spent as f64 / 20.0);
    }
    rounds.sort_by(f64::total_cmp);
    Some(rounds[2])
}

impl ByteCosts {
    /// Measures the costs on a demand and a member record of up to 1,000 of `s`'s
    /// hosts (a target's records hold every host configured there).
    pub fn calibrate(s: &ClusterScenario) -> ByteCosts {
        let nqns: Vec<&str> = s.hosts.iter().take(1000).map(|h| h.nqn.as_str()).collect();
        let demand = Demand {
            hosts: nqns
                .iter()
                .enumerate()
                .map(|(k, n)| {
                    let d = PathDemand {
                        served: (k as u64 * 37) % 4000,
                        backlogged: k % 3 == 0,
                        held_milli: (k as u64 * 13) % 5000,
                        served_bytes: 0,
                    };
                    (n.to_string(), d)
                })
                .collect(),
        };
        let member = Member {
            target: "t000".into(),
            domain: "d".into(),
            capacity_iops: 200_000,
            period_ms: 1000,
            applied: nqns
                .iter()
                .enumerate()
                .map(|(k, n)| {
                    let sh = LocalShare {
                        reservation_iops: (k as u64 * 7) % 800,
                        limit_iops: Some(1 + (k as u64 * 31) % 6000),
                        weight: 1 + (k as u32 % 10),
                        ..Default::default()
                    };
                    (n.to_string(), sh)
                })
                .collect(),
            error: None,
            handover_url: None,
        };
        let texts = [
            serde_json::to_string(&demand).expect("json"),
            serde_json::to_string(&member).expect("json"),
        ];
        let bytes = (texts[0].len() + texts[1].len()) as f64;
        // etcd's answer to a range: each record's key and value in base64.
        let names = [
            "/nvmf-qos/fleet/demand/t000",
            "/nvmf-qos/fleet/members/t001",
        ];
        let answer = range_answer(names.into_iter().zip(texts.iter().map(String::as_str)));
        let listed = time(|| {
            for ((_, text), kept) in list(black_box(&answer)).iter().zip(&texts) {
                black_box(text == kept);
            }
        });
        let parsed = time(|| {
            black_box(serde_json::from_str::<Demand>(black_box(&texts[0])).expect("json"));
            black_box(serde_json::from_str::<Member>(black_box(&texts[1])).expect("json"));
        });
        let written = time(|| {
            for t in [
                serde_json::to_string(black_box(&demand)).expect("json"),
                serde_json::to_string(black_box(&member)).expect("json"),
            ] {
                let body =
                    json!({ "key": B64.encode("/nvmf-qos/fleet/x"), "value": B64.encode(t) });
                black_box(body.to_string());
            }
        });
        let (request_ns, request_against) = request_ns().unwrap_or_default();
        ByteCosts {
            listed_ns: listed / bytes,
            parsed_ns: parsed / bytes,
            written_ns: written / bytes,
            request_ns,
            request_against,
            bookkeeping_ns: bookkeeping_ns(s),
            contracts_ns: contracts_ns(s),
            ..target_costs(&nqns, s.hosts.len() as u64)
        }
    }

    /// The leader's record handling per interval, milliseconds, from what it handled
    /// over its intervals.
    pub fn per_interval_ms(&self, b: &LeaderBytes) -> RecordHandling {
        let per = |bytes: u64| bytes as f64 / b.intervals.max(1) as f64;
        let ms = |bytes: f64, ns: f64| bytes * ns / 1e6;
        RecordHandling {
            target_ms: ms(self.target_bytes(), self.target_ns),
            listed_ms: ms(per(b.listed), self.listed_ns),
            parsed_ms: ms(per(b.parsed), self.parsed_ns),
            // Its part and the head (one answer each), the contracts (one listing):
            // listed and parsed every interval.
            read_ms: ms(per(b.part_read), self.listed_ns + self.parsed_ns)
                + ms(per(b.contracts), self.contracts_ns),
            written_ms: ms(per(b.written), self.written_ns),
            requests_ms: per(b.requests) * self.request_ns / 1e6,
            bookkeeping_ms: self.bookkeeping_ns / 1e6,
        }
    }
}

impl ByteCosts {
    /// The target's answer an interval, bytes.
    pub fn target_bytes(&self) -> f64 {
        self.target_bytes_per_host * self.hosts_at_target as f64
    }
}

/// The leader's record handling per interval, predicted, milliseconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RecordHandling {
    /// The target's answer (its hosts' counters and settings).
    pub target_ms: f64,
    pub listed_ms: f64,
    pub parsed_ms: f64,
    pub read_ms: f64,
    pub written_ms: f64,
    /// Its etcd requests, beside their records' bytes.
    pub requests_ms: f64,
    /// Its per-host bookkeeping.
    pub bookkeeping_ms: f64,
}

impl RecordHandling {
    pub fn total_ms(&self) -> f64 {
        self.target_ms
            + self.listed_ms
            + self.parsed_ms
            + self.read_ms
            + self.written_ms
            + self.requests_ms
            + self.bookkeeping_ms
    }
}

/// The leader's predicted CPU per interval, with its parts: its own line, as the costs
/// are measured on this machine and the division time with them.
pub fn agent_cpu_line(run: &ClusterRun, costs: &ByteCosts) -> String {
    let b = &run.etcd.leader_bytes;
    if b.intervals == 0 {
        return "leader agent's CPU per interval (predicted): no division".into();
    }
    // `plan`'s CPU time where the kernel gives it (a CPU prediction), else its wall time.
    let times = match run.division_cpu.len() {
        0 => &run.division_times,
        _ => &run.division_cpu,
    };
    let plan_ms =
        times.iter().map(|d| d.as_secs_f64() * 1000.0).sum::<f64>() / times.len().max(1) as f64;
    let h = costs.per_interval_ms(b);
    let mb = |bytes: u64| bytes as f64 / b.intervals as f64 / 1e6;
    format!(
        "leader agent's CPU per interval (predicted, measured costs on this machine, not deterministic): {:.1} ms = plan {plan_ms:.1} ms + its target's counters {:.1} ms ({} hosts, {:.2} MB at {:.2} ns/B, read {}) + listing {:.1} ms ({:.2} MB of member and demand records at {:.2} ns/B) + parsing {:.1} ms ({:.2} MB changed, {:.2} ns/B) + its part, head and the contracts {:.1} ms ({:.2} MB, the contracts at {:.2} ns/B) + writing {:.1} ms ({:.2} MB, {:.2} ns/B) + etcd requests {:.1} ms ({:.1} an interval at {:.0} us of the agent's client, measured against {}) + per-host bookkeeping {:.1} ms ({} hosts: demand meter, handover book, records' filters, cold shares, reconciliation, metrics); not modelled: the target's qos_host_sets, the agent's log line and main loop",
        plan_ms + h.total_ms(),
        h.target_ms,
        costs.hosts_at_target,
        costs.target_bytes() / 1e6,
        costs.target_ns,
        match (costs.target_over_socket, costs.target_across_cores) {
            (true, true) => "off a Unix socket from another core, caches cold",
            (true, false) => "off a Unix socket, caches cold",
            (false, _) => "from memory",
        },
        h.listed_ms,
        mb(b.listed),
        costs.listed_ns,
        h.parsed_ms,
        mb(b.parsed),
        costs.parsed_ns,
        h.read_ms,
        mb(b.part_read + b.contracts),
        costs.contracts_ns,
        h.written_ms,
        mb(b.written),
        costs.written_ns,
        h.requests_ms,
        b.requests as f64 / b.intervals as f64,
        costs.request_ns / 1e3,
        costs.request_against,
        h.bookkeeping_ms,
        costs.hosts_at_target.min(1000),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handling_is_the_bytes_per_interval_times_their_cost() {
        let costs = ByteCosts {
            target_ns: 4.0,
            target_bytes_per_host: 250.0,
            hosts_at_target: 1000,
            listed_ns: 2.0,
            contracts_ns: 7.0,
            parsed_ns: 5.0,
            written_ns: 3.0,
            request_ns: 100_000.0,
            request_against: RequestsAgainst::StandIn,
            target_over_socket: true,
            target_across_cores: true,
            bookkeeping_ns: 500_000.0,
        };
        let b = LeaderBytes {
            intervals: 4,
            listed: 4_000_000,
            parsed: 400_000,
            part_read: 200_000,
            contracts: 200_000,
            written: 800_000,
            requests: 48,
        };
        let h = costs.per_interval_ms(&b);
        // Per interval: 1 MB listed (2 ms), 0.1 MB parsed (0.5 ms), 0.1 MB read and
        // parsed (0.7 ms), 0.2 MB written (0.6 ms).
        let close = |a: f64, b: f64| (a - b).abs() < 1e-9;
        assert!(close(h.listed_ms, 2.0), "{h:?}");
        assert!(close(h.parsed_ms, 0.5), "{h:?}");
        assert!(close(h.read_ms, 0.7), "{h:?}");
        assert!(close(h.written_ms, 0.6), "{h:?}");
        // The target's answer: 1,000 hosts of 250 bytes at 4 ns/B, 1 ms.
        assert!(close(h.target_ms, 1.0), "{h:?}");
        // 12 requests an interval at 0.1 ms.
        assert!(close(h.requests_ms, 1.2), "{h:?}");
        // The bookkeeping, 0.5 ms an interval.
        assert!(close(h.bookkeeping_ms, 0.5), "{h:?}");
        assert!(close(h.total_ms(), 6.5));
    }

    #[test]
    fn an_etcd_request_of_the_agents_client_is_measured_on_the_stand_in() {
        let url = stand_in_gateway().expect("a socket");
        let ns = request_ns_at(&url, Duration::from_millis(50)).expect("measured");
        // Microseconds, not nanoseconds nor seconds.
        assert!((1_000.0..10_000_000.0).contains(&ns), "{ns} ns");
    }

    #[test]
    fn an_etcd_request_of_the_agents_client_is_measured_on_a_real_etcd_when_there_is_one() {
        let Some(bin) = etcd_binary() else {
            println!("SKIPPED: no etcd binary (apt-get install etcd-server)");
            return;
        };
        let etcd = RealEtcd::start(&bin).expect("etcd answers");
        let ns = request_ns_at(&etcd.url, Duration::from_millis(20)).expect("measured");
        assert!((1_000.0..10_000_000.0).contains(&ns), "{ns} ns");
        let dir = etcd.dir.clone();
        drop(etcd);
        assert!(!dir.exists(), "its data removed");
    }

    #[test]
    fn the_stand_in_target_answers_the_agents_reads_as_read_from_memory() {
        use nvmf_qos_agent::target::{SocketTarget, TargetRpc};
        let nqns = ["nqn.a", "nqn.b", "nqn.c"];
        let answer = counters_answer(&nqns);
        let want = read_counters(answer.as_bytes(), &mut Vec::new());
        let sock = stand_in_target(answer, None).expect("a socket");
        let mut t = SocketTarget::new(sock, Duration::from_secs(5));
        for _ in 0..3 {
            assert_eq!(t.read("d").expect("read"), want);
        }
        let allowed = rustix::thread::sched_getaffinity(None).expect("affinity");
        let c = target_costs(&nqns, 3);
        assert!(c.target_over_socket && c.target_ns > 0.0, "{c:?}");
        assert_eq!(
            c.target_across_cores,
            target_and_reader_cpus().is_some(),
            "read across cores wherever there are two: {c:?}"
        );
        assert_eq!(
            rustix::thread::sched_getaffinity(None).expect("affinity"),
            allowed,
            "the thread's CPUs given back"
        );
    }

    #[test]
    fn a_thread_pinned_runs_on_its_cpu_and_gets_its_cpus_back() {
        let allowed = rustix::thread::sched_getaffinity(None).expect("affinity");
        let Some((_, reader)) = target_and_reader_cpus() else {
            return; // one CPU: nothing to pin apart
        };
        {
            let _pinned = PinnedThread::to(reader).expect("pinned");
            assert_eq!(rustix::thread::sched_getcpu(), reader);
        }
        assert_eq!(
            rustix::thread::sched_getaffinity(None).expect("affinity"),
            allowed
        );
    }

    #[test]
    fn the_calibrations_target_answer_reads_as_the_agent_reads_it() {
        let nqns = ["nqn.a", "nqn.b", "nqn.c"];
        let answer = counters_answer(&nqns);
        let state = read_counters(answer.as_bytes(), &mut Vec::new());
        let (counters, settings) = (&state.counters, &state.settings);
        assert_eq!(counters.len(), 3);
        let b = &counters["nqn.b"];
        assert_eq!(
            [b.completed_ops, b.completed_bytes, b.held_ns],
            [1_007_919, 1_007_919 * 4096, 1_234_567]
        );
        assert_eq!(settings["nqn.a"].reservation_iops, 200);
        assert_eq!(
            settings["nqn.b"].reservation_iops, 0,
            "odd hosts reserve nothing"
        );
        assert_eq!(settings["nqn.c"].weight, 3);
        // The plugin's field names (spdk-plugin/src/stats.rs, `CounterHost`).
        let v: Value = serde_json::from_str(&answer).unwrap();
        let h = &v["result"][0]["hosts"][1];
        for k in [
            "host_nqn",
            "configured",
            "completed_total",
            "held_time",
            "max_iops",
            "weight",
        ] {
            assert!(!h[k].is_null(), "{k}: {h}");
        }
        assert!(h.get("min_iops").is_none(), "left out when not set: {h}");
    }
}
