//! The agent's view of its target: each host's counters (work completed, holds), the
//! target's capacity estimate, and the hosts' local settings, read and written through
//! the target plugin's JSON-RPC methods (`qos_stats_get`, `qos_host_get`,
//! `qos_host_set`, `qos_host_remove`) on the target's Unix socket ([`TargetRpc`],
//! through the workspace's JSON-RPC client, `rpc-client`, over one connection it keeps,
//! the shares of an interval sent several at once).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use qos_core::cluster::LocalShare;
use serde::Deserialize;
use serde_json::{Value, json};
use thiserror::Error;

/// A call to the target that did not succeed.
#[derive(Debug, Error)]
pub enum TargetError {
    #[error("target's RPC socket {sock}: {detail} (is nvmf_tgt running with the plugin?)")]
    Unreachable { sock: String, detail: String },
    #[error("target refused {method}: {message} (code {code})")]
    Refused {
        method: String,
        code: i64,
        message: String,
    },
    #[error("target answered {method} with what the agent cannot read: {detail}")]
    Malformed { method: String, detail: String },
}

/// A host's monotonic counters at the target (`qos_stats_get`'s `completed_total.ops`
/// and `.bytes`, and `held_time.sum_ns`): the agent turns their changes over a window
/// into demand.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct HostCounters {
    /// Work completed since the host was added, operations.
    pub completed_ops: u64,
    /// Work completed since the host was added, bytes.
    pub completed_bytes: u64,
    /// Time its admitted commands waited in QoS, summed, nanoseconds.
    pub held_ns: u64,
}

/// What the agent reads off its target each interval.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct LocalState {
    /// The domain's capacity estimate, operations per second.
    pub capacity_iops: u64,
    /// The domain's QoS period.
    pub period_ms: u64,
    /// Per host: its counters now.
    pub counters: BTreeMap<String, HostCounters>,
    /// Per configured host: its local settings now.
    pub settings: BTreeMap<String, LocalShare>,
}

/// The target operations the agent needs.
pub trait TargetRpc {
    fn read(&mut self, domain: &str) -> Result<LocalState, TargetError>;
    fn host_set(&mut self, domain: &str, nqn: &str, share: &LocalShare) -> Result<(), TargetError>;
    fn host_remove(&mut self, domain: &str, nqn: &str) -> Result<(), TargetError>;
    /// Sets every share of `sets`, one result each, in order; a target that can take
    /// several calls at once takes them so ([`SocketTarget`]: sent together on one
    /// connection); by default one after the other.
    fn host_set_many(
        &mut self,
        domain: &str,
        sets: &[(String, LocalShare)],
    ) -> Vec<Result<(), TargetError>> {
        sets.iter()
            .map(|(nqn, s)| self.host_set(domain, nqn, s))
            .collect()
    }
}

/// The target at a JSON-RPC Unix socket, over one connection kept open between calls
/// (`rpc_client::Client`).
#[derive(Debug)]
pub struct SocketTarget {
    client: rpc_client::Client,
    /// Whether the target answers `qos_stats_get`'s counters form (`None`: not asked
    /// yet; a plugin from before it refuses the parameter, and the agent then reads the
    /// compact form and `qos_host_get`, as it did).
    counters_form: Option<bool>,
}

impl SocketTarget {
    pub fn new(sock: PathBuf, timeout: Duration) -> SocketTarget {
        SocketTarget {
            client: rpc_client::Client::new(sock, timeout),
            counters_form: None,
        }
    }

    /// Whether the target answered the counters form (`None` before the first read).
    pub fn reads_counters_form(&self) -> Option<bool> {
        self.counters_form
    }

    /// One JSON-RPC 2.0 call.
    pub fn call(&mut self, method: &str, params: Value) -> Result<Value, TargetError> {
        let r = self.client.call(method, params);
        r.map_err(|e| self.error(e))
    }

    /// Connections opened to the target so far.
    pub fn connects(&self) -> u64 {
        self.client.connects()
    }

    fn error(&self, e: rpc_client::RpcError) -> TargetError {
        match e {
            rpc_client::RpcError::Refused {
                method,
                code,
                message,
            } => TargetError::Refused {
                method,
                code,
                message,
            },
            rpc_client::RpcError::Unexpected { method, source, .. } => TargetError::Malformed {
                method,
                detail: source.to_string(),
            },
            e => TargetError::Unreachable {
                sock: self.client.sock().display().to_string(),
                detail: e.detail(),
            },
        }
    }
}

fn malformed(method: &str, detail: impl Into<String>) -> TargetError {
    TargetError::Malformed {
        method: method.into(),
        detail: detail.into(),
    }
}

/// What the agent reads of one domain of `qos_stats_get`'s answer; the tests check
/// these fields against `rpc-scripts/schema/stats.json` (written from the plugin's
/// types). Every field but the period and the host's NQN may be missing (read as 0).
#[derive(Debug, Deserialize)]
struct StatsDomain {
    #[serde(default)]
    period_ns: u64,
    /// A target still learning its capacity (created without one) has no estimate yet.
    #[serde(default)]
    capacity_learning: bool,
    #[serde(default)]
    capacity_estimate: StatsAmount,
    #[serde(default)]
    hosts: Vec<StatsHost>,
}

/// `{ops, bytes}`, `null` for unlimited; the agent reads the operations.
#[derive(Debug, Default, Deserialize)]
struct StatsAmount {
    #[serde(default)]
    ops: Option<u64>,
}

#[derive(Debug, Deserialize)]
struct StatsHost {
    host_nqn: String,
    #[serde(default)]
    completed_total: StatsWork,
    #[serde(default)]
    held_time: StatsHeldTime,
}

#[derive(Debug, Default, Deserialize)]
struct StatsWork {
    #[serde(default)]
    ops: u64,
    #[serde(default)]
    bytes: u64,
}

#[derive(Debug, Default, Deserialize)]
struct StatsHeldTime {
    #[serde(default)]
    sum_ns: u64,
}

/// Reads `qos_stats_get`'s answer for one domain: the capacity estimate per second, the
/// period, each host's counters (the settings are left empty: they come from
/// `qos_host_get`).
pub fn parse_stats(v: &Value) -> Result<LocalState, TargetError> {
    let m = "qos_stats_get";
    let d: StatsDomain = first_domain(v, m)?;
    if d.period_ns == 0 {
        return Err(malformed(m, "no period_ns"));
    }
    // A target still learning its capacity has no estimate yet: its unbounded budget is
    // no capacity to admit cluster reservations against.
    let capacity = capacity_per_s(d.capacity_learning, d.capacity_estimate.ops, d.period_ns);
    let counters = d
        .hosts
        .into_iter()
        .map(|h| {
            let counters = HostCounters {
                completed_ops: h.completed_total.ops,
                completed_bytes: h.completed_total.bytes,
                held_ns: h.held_time.sum_ns,
            };
            (h.host_nqn, counters)
        })
        .collect();
    Ok(LocalState {
        capacity_iops: capacity,
        period_ms: d.period_ns / 1_000_000,
        counters,
        settings: BTreeMap::new(),
    })
}

/// One domain of `qos_stats_get`'s counters form (`"counters": true`): per host its
/// counters and its settings, what the compact form and `qos_host_get` give the agent
/// together, in a tenth of the bytes.
#[derive(Debug, Deserialize)]
pub struct CountersDomain {
    #[serde(default)]
    period_ns: u64,
    #[serde(default)]
    capacity_learning: bool,
    #[serde(default)]
    capacity_estimate: StatsAmount,
    #[serde(default)]
    hosts: Vec<CountersHost>,
}

#[derive(Debug, Deserialize)]
struct CountersHost {
    host_nqn: String,
    /// A host no `qos_host_set` configured (it connected) has counters but no
    /// settings (`qos_host_get` leaves it out).
    #[serde(default = "yes")]
    configured: bool,
    #[serde(default)]
    completed_total: StatsWork,
    #[serde(default)]
    held_time: StatsHeldTime,
    #[serde(default)]
    min_iops: Option<u64>,
    #[serde(default)]
    max_iops: Option<u64>,
    #[serde(default)]
    min_mibps: Option<u64>,
    #[serde(default)]
    max_mibps: Option<u64>,
    #[serde(default)]
    weight: Option<u64>,
}

fn yes() -> bool {
    true
}

/// The first domain of `method`'s answer (the agent's target has one).
fn first_domain<'a, T: Deserialize<'a>>(v: &'a Value, method: &str) -> Result<T, TargetError> {
    let d = v
        .as_array()
        .and_then(|a| a.first())
        .ok_or_else(|| malformed(method, "no domain in the answer"))?;
    T::deserialize(d).map_err(|e| malformed(method, e.to_string()))
}

/// The capacity per second of a domain's estimate per period (0 while learning).
fn capacity_per_s(learning: bool, ops: Option<u64>, period_ns: u64) -> u64 {
    let ops = if learning { 0 } else { ops.unwrap_or(0) };
    (ops as u128 * 1_000_000_000 / period_ns as u128).min(u64::MAX as u128) as u64
}

/// Reads `qos_stats_get`'s counters form for one domain: what [`parse_stats`] and
/// [`parse_hosts`] read from the compact form and `qos_host_get`, from one answer.
pub fn parse_counters(v: &Value) -> Result<LocalState, TargetError> {
    counters_state(first_domain(v, "qos_stats_get")?)
}

/// The agent's counters and settings from a domain of the counters form (as the agent
/// reads it off the socket, straight into the types: [`SocketTarget`]'s `read`). Public
/// for the lab, which times this very reader (`qos-lab`'s `agent_cpu`).
pub fn counters_state(d: CountersDomain) -> Result<LocalState, TargetError> {
    let m = "qos_stats_get";
    if d.period_ns == 0 {
        return Err(malformed(m, "no period_ns"));
    }
    let mut counters = BTreeMap::new();
    let mut settings = BTreeMap::new();
    for h in d.hosts {
        counters.insert(
            h.host_nqn.clone(),
            HostCounters {
                completed_ops: h.completed_total.ops,
                completed_bytes: h.completed_total.bytes,
                held_ns: h.held_time.sum_ns,
            },
        );
        if h.configured {
            let share = LocalShare {
                reservation_iops: h.min_iops.unwrap_or(0),
                limit_iops: h.max_iops,
                weight: h.weight.unwrap_or(1) as u32,
                reservation_mibps: h.min_mibps.unwrap_or(0),
                limit_mibps: h.max_mibps,
            };
            settings.insert(h.host_nqn, share);
        }
    }
    Ok(LocalState {
        capacity_iops: capacity_per_s(d.capacity_learning, d.capacity_estimate.ops, d.period_ns),
        period_ms: d.period_ns / 1_000_000,
        counters,
        settings,
    })
}

/// Reads `qos_host_get`'s answer: each configured host's IOPS and MiB/s settings.
pub fn parse_hosts(v: &Value) -> Result<BTreeMap<String, LocalShare>, TargetError> {
    let m = "qos_host_get";
    let mut out = BTreeMap::new();
    for h in v.as_array().ok_or_else(|| malformed(m, "not an array"))? {
        let nqn = h["host_nqn"]
            .as_str()
            .ok_or_else(|| malformed(m, "a host without host_nqn"))?;
        out.insert(
            nqn.to_string(),
            LocalShare {
                reservation_iops: h["min_iops"].as_u64().unwrap_or(0),
                limit_iops: h["max_iops"].as_u64(),
                weight: h["weight"].as_u64().unwrap_or(1) as u32,
                reservation_mibps: h["min_mibps"].as_u64().unwrap_or(0),
                limit_mibps: h["max_mibps"].as_u64(),
            },
        );
    }
    Ok(out)
}

/// `qos_host_set`'s parameters for a share.
pub fn host_set_params(domain: &str, nqn: &str, s: &LocalShare) -> Value {
    let mut p = json!({ "domain": domain, "host_nqn": nqn, "weight": s.weight });
    if s.reservation_iops > 0 {
        p["min_iops"] = json!(s.reservation_iops);
    }
    if let Some(l) = s.limit_iops {
        p["max_iops"] = json!(l);
    }
    if s.reservation_mibps > 0 {
        p["min_mibps"] = json!(s.reservation_mibps);
    }
    if let Some(l) = s.limit_mibps {
        p["max_mibps"] = json!(l);
    }
    p
}

impl TargetRpc for SocketTarget {
    fn read(&mut self, domain: &str) -> Result<LocalState, TargetError> {
        if self.counters_form != Some(false) {
            let params = json!({ "domain": domain, "counters": true });
            // Read straight into the types: a JSON tree of 1,000 hosts' counters was
            // most of the agent's target read (2026-11-30, perf).
            let r = self
                .client
                .call_as::<Vec<CountersDomain>>("qos_stats_get", params)
                .map_err(|e| self.error(e));
            match r {
                Ok(domains) => {
                    self.counters_form = Some(true);
                    let d = domains
                        .into_iter()
                        .next()
                        .ok_or_else(|| malformed("qos_stats_get", "no domain in the answer"))?;
                    return counters_state(d);
                }
                // A plugin from before the counters form refuses the parameter.
                Err(TargetError::Refused { message, .. })
                    if message.contains("unknown field `counters`") =>
                {
                    self.counters_form = Some(false);
                }
                Err(e) => return Err(e),
            }
        }
        let stats = self.call(
            "qos_stats_get",
            json!({ "domain": domain, "compact": true }),
        )?;
        let mut state = parse_stats(&stats)?;
        state.settings = parse_hosts(&self.call("qos_host_get", json!({ "domain": domain }))?)?;
        Ok(state)
    }

    fn host_set(&mut self, domain: &str, nqn: &str, share: &LocalShare) -> Result<(), TargetError> {
        self.call("qos_host_set", host_set_params(domain, nqn, share))
            .map(|_| ())
    }

    fn host_remove(&mut self, domain: &str, nqn: &str) -> Result<(), TargetError> {
        self.call(
            "qos_host_remove",
            json!({ "domain": domain, "host_nqn": nqn }),
        )
        .map(|_| ())
    }

    fn host_set_many(
        &mut self,
        domain: &str,
        sets: &[(String, LocalShare)],
    ) -> Vec<Result<(), TargetError>> {
        let calls = sets
            .iter()
            .map(|(nqn, s)| ("qos_host_set".to_string(), host_set_params(domain, nqn, s)))
            .collect();
        let answers = self.client.call_many(calls);
        answers
            .into_iter()
            .map(|r| r.map(|_| ()).map_err(|e| self.error(e)))
            .collect()
    }
}

#[cfg(test)]
#[path = "../../rpc-scripts/schema/stats_check.rs"]
mod stats_check;

#[cfg(test)]
mod tests {
    use super::*;

    /// What the agent reads is in `rpc-scripts/schema/stats.json`, with the types it
    /// takes: a field the plugin renames (and regenerates the schema for) fails here.
    #[test]
    fn the_stats_reader_reads_what_the_schema_says() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../rpc-scripts/schema/stats.json"
        );
        let schema = stats_check::load(path.as_ref());
        if let Err(e) = stats_check::check::<Vec<StatsDomain>>(&schema) {
            panic!("the agent's qos_stats_get reader disagrees with the schema:\n{e}");
        }
    }

    #[test]
    fn a_malformed_answer_is_refused() {
        let no_period = json!([{ "name": "d", "hosts": [] }]);
        assert!(matches!(
            parse_stats(&no_period),
            Err(TargetError::Malformed { .. })
        ));
        let no_nqn = json!([{ "name": "d", "period_ns": 1, "hosts": [{}] }]);
        let e = parse_stats(&no_nqn).unwrap_err().to_string();
        assert!(e.contains("host_nqn"), "{e}");
        assert!(parse_stats(&json!([])).is_err());
    }

    #[test]
    fn stats_become_counters_and_a_capacity_per_second() {
        let v = json!([{
            "name": "d", "period_ns": 500_000_000u64,
            "capacity_estimate": { "ops": 50_000, "bytes": null },
            "hosts": [
                { "host_nqn": "h1", "completed_total": { "ops": 1000, "bytes": 0, "ios": 1000 },
                  "held_time": { "sum_ns": 7, "count": 1 } },
                { "host_nqn": "h2" }
            ]
        }]);
        let st = parse_stats(&v).unwrap();
        assert_eq!((st.capacity_iops, st.period_ms), (100_000, 500));
        assert_eq!(
            st.counters["h1"],
            HostCounters {
                completed_ops: 1000,
                completed_bytes: 0,
                held_ns: 7
            }
        );
        assert_eq!(st.counters["h2"], HostCounters::default());
        // Still learning: no capacity yet, whatever the budget says.
        let mut v = v;
        v[0]["capacity_learning"] = json!(true);
        v[0]["capacity_estimate"]["ops"] = json!(u64::MAX / 2);
        assert_eq!(parse_stats(&v).unwrap().capacity_iops, 0);
    }

    #[test]
    fn a_share_without_reservation_or_limit_leaves_them_out() {
        let p = host_set_params(
            "d",
            "h",
            &LocalShare {
                weight: 3,
                ..Default::default()
            },
        );
        assert_eq!(p, json!({ "domain": "d", "host_nqn": "h", "weight": 3 }));
        let p = host_set_params(
            "d",
            "h",
            &LocalShare {
                reservation_mibps: 40,
                limit_mibps: Some(90),
                ..Default::default()
            },
        );
        assert_eq!(
            p,
            json!({ "domain": "d", "host_nqn": "h", "weight": 1, "min_mibps": 40, "max_mibps": 90 })
        );
    }

    /// A target's hosts in the compact form and `qos_host_get`'s answer, and the same
    /// in the counters form: h1 with I/O and IOPS settings, h2 with MiB/s ones and a
    /// weight, h3 connected but not configured (counters, no settings).
    fn one_target_both_ways() -> (Value, Value, Value) {
        let compact = json!([{
            "name": "d", "epoch": 9, "period_ns": 500_000_000u64,
            "capacity_estimate": { "ops": 50_000, "bytes": null }, "capacity_learning": false,
            "hosts": [
                { "host_nqn": "h1", "configured": true, "min": {"total": {"iops": 100}},
                  "completed_total": { "ops": 1000, "bytes": 4096000, "ios": 1000 },
                  "held_time": { "cumulative": [1, 2], "sum_ns": 7, "count": 2 } },
                { "host_nqn": "h2", "configured": true,
                  "completed_total": { "ops": 5, "bytes": 5242880, "ios": 5 },
                  "held_time": { "cumulative": [0, 0], "sum_ns": 0, "count": 0 } },
                { "host_nqn": "h3", "configured": false,
                  "completed_total": { "ops": 3, "bytes": 12288, "ios": 3 },
                  "held_time": { "cumulative": [0, 1], "sum_ns": 11, "count": 1 } }
            ]
        }]);
        let hosts = json!([
            { "domain": "d", "host_nqn": "h1", "min_iops": 100, "max_iops": 500, "weight": 1 },
            { "domain": "d", "host_nqn": "h2", "min_mibps": 40, "max_mibps": 90, "weight": 3 }
        ]);
        let counters = json!([{
            "name": "d", "epoch": 9, "period_ns": 500_000_000u64,
            "capacity_estimate": { "ops": 50_000, "bytes": null }, "capacity_learning": false,
            "hosts": [
                { "host_nqn": "h1", "configured": true,
                  "completed_total": { "ops": 1000, "bytes": 4096000, "ios": 1000 },
                  "held_time": { "sum_ns": 7 }, "min_iops": 100, "max_iops": 500, "weight": 1 },
                { "host_nqn": "h2", "configured": true,
                  "completed_total": { "ops": 5, "bytes": 5242880, "ios": 5 },
                  "held_time": { "sum_ns": 0 }, "min_mibps": 40, "max_mibps": 90, "weight": 3 },
                { "host_nqn": "h3", "configured": false,
                  "completed_total": { "ops": 3, "bytes": 12288, "ios": 3 },
                  "held_time": { "sum_ns": 11 }, "weight": 1 }
            ]
        }]);
        (compact, hosts, counters)
    }

    #[test]
    fn the_counters_form_reads_as_the_compact_form_and_the_hosts_settings() {
        let (compact, hosts, counters) = one_target_both_ways();
        let mut before = parse_stats(&compact).unwrap();
        before.settings = parse_hosts(&hosts).unwrap();
        let now = parse_counters(&counters).unwrap();
        assert_eq!(now, before);
        assert_eq!(now.counters.len(), 3);
        assert_eq!(now.settings.len(), 2, "h3 is not configured");
        assert_eq!(
            now.settings["h2"],
            LocalShare {
                reservation_mibps: 40,
                limit_mibps: Some(90),
                weight: 3,
                ..Default::default()
            }
        );
        assert!(matches!(
            parse_counters(&json!([{ "name": "d", "hosts": [] }])),
            Err(TargetError::Malformed { .. })
        ));
    }

    /// A JSON-RPC target on a Unix socket answering from `answer` (method and params to
    /// result or error) on one kept connection; the calls it got are sent on the channel.
    fn target_at(
        answer: impl Fn(&str, &Value) -> Result<Value, (i64, String)> + Send + 'static,
    ) -> (PathBuf, std::sync::mpsc::Receiver<(String, Value)>) {
        use std::io::Write;
        let dir = std::env::temp_dir().join(format!(
            "nvmf-qos-agent-target-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let _ = std::fs::create_dir_all(&dir);
        let sock = dir.join("rpc.sock");
        let _ = std::fs::remove_file(&sock);
        let listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(mut conn) = conn else { return };
                let reader = conn.try_clone().unwrap();
                for req in serde_json::Deserializer::from_reader(reader).into_iter::<Value>() {
                    let Ok(req) = req else { break };
                    let method = req["method"].as_str().unwrap_or("").to_string();
                    let params = req["params"].clone();
                    let reply = match answer(&method, &params) {
                        Ok(r) => json!({"jsonrpc": "2.0", "id": req["id"], "result": r}),
                        Err((code, message)) => json!({"jsonrpc": "2.0", "id": req["id"],
                            "error": {"code": code, "message": message}}),
                    };
                    let _ = tx.send((method, params));
                    let _ = conn.write_all(reply.to_string().as_bytes());
                }
            }
        });
        (sock, rx)
    }

    #[test]
    fn a_target_with_the_counters_form_is_read_in_one_call() {
        let (_, _, counters) = one_target_both_ways();
        // Read off the socket straight into the types, it is what the tree gives.
        let want = parse_counters(&counters).unwrap();
        let (sock, calls) = target_at(move |m, p| match m {
            "qos_stats_get" if p["counters"] == json!(true) => Ok(counters.clone()),
            _ => Err((-32601, "not this".into())),
        });
        let mut t = SocketTarget::new(sock, Duration::from_secs(5));
        assert_eq!(t.reads_counters_form(), None);
        for _ in 0..2 {
            let st = t.read("d").unwrap();
            assert_eq!(st.counters.len(), 3);
            assert_eq!(st.settings.len(), 2);
            assert_eq!(st, want);
        }
        assert_eq!(t.reads_counters_form(), Some(true));
        let got: Vec<(String, Value)> = calls.try_iter().collect();
        assert_eq!(got.len(), 2, "one call an interval: {got:?}");
        assert!(
            got.iter()
                .all(|(_, p)| p == &json!({"domain": "d", "counters": true}))
        );
    }

    /// A plugin from before the counters form refuses the parameter (as its
    /// `deny_unknown_fields` words it): the agent reads the compact form and
    /// `qos_host_get`, and asks for the counters form no more.
    #[test]
    fn an_older_target_is_read_through_the_compact_form_and_its_hosts() {
        let (compact, hosts, _) = one_target_both_ways();
        let (sock, calls) = target_at(move |m, p| match m {
            "qos_stats_get" if p.get("counters").is_some() => Err((
                -22,
                "qos_stats_get: invalid parameters: unknown field `counters`, expected one of \
                 `domain`, `periods`, `host_nqn`, `compact`"
                    .into(),
            )),
            "qos_stats_get" => Ok(compact.clone()),
            "qos_host_get" => Ok(hosts.clone()),
            _ => Err((-32601, "not this".into())),
        });
        let mut t = SocketTarget::new(sock, Duration::from_secs(5));
        let (c, h, _) = one_target_both_ways();
        let mut want = parse_stats(&c).unwrap();
        want.settings = parse_hosts(&h).unwrap();
        assert_eq!(t.read("d").unwrap(), want);
        assert_eq!(t.reads_counters_form(), Some(false));
        assert_eq!(t.read("d").unwrap(), want);
        let methods: Vec<String> = calls.try_iter().map(|(m, _)| m).collect();
        assert_eq!(
            methods,
            [
                "qos_stats_get",
                "qos_stats_get",
                "qos_host_get",
                "qos_stats_get",
                "qos_host_get"
            ]
        );
    }

    #[test]
    fn a_counters_answer_of_another_shape_is_malformed() {
        let (sock, _calls) = target_at(move |_, _| Ok(json!([{ "period_ns": "soon" }])));
        let mut t = SocketTarget::new(sock, Duration::from_secs(5));
        let e = t.read("d").unwrap_err();
        assert!(matches!(e, TargetError::Malformed { .. }), "{e}");
        let (sock, _calls) = target_at(move |_, _| Ok(json!([])));
        let mut t = SocketTarget::new(sock, Duration::from_secs(5));
        let e = t.read("d").unwrap_err();
        assert!(e.to_string().contains("no domain"), "{e}");
    }

    /// Any other refusal is the target's answer, not an older plugin.
    #[test]
    fn another_refusal_of_the_counters_form_is_an_error() {
        let (sock, _) = target_at(|_, _| Err((-19, "domain \"d\" does not exist".into())));
        let mut t = SocketTarget::new(sock, Duration::from_secs(5));
        let e = t.read("d").unwrap_err();
        assert!(matches!(e, TargetError::Refused { code: -19, .. }), "{e}");
        assert_eq!(t.reads_counters_form(), None);
    }

    #[test]
    fn a_missing_socket_names_it() {
        let mut t = SocketTarget::new("/nonexistent/x.sock".into(), Duration::from_millis(100));
        let e = t.read("d").unwrap_err();
        assert!(e.to_string().contains("/nonexistent/x.sock"), "{e}");
    }
}
