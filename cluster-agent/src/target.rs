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
}

impl SocketTarget {
    pub fn new(sock: PathBuf, timeout: Duration) -> SocketTarget {
        SocketTarget {
            client: rpc_client::Client::new(sock, timeout),
        }
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
    let d = v
        .as_array()
        .and_then(|a| a.first())
        .ok_or_else(|| malformed(m, "no domain in the answer"))?;
    let d = StatsDomain::deserialize(d).map_err(|e| malformed(m, e.to_string()))?;
    if d.period_ns == 0 {
        return Err(malformed(m, "no period_ns"));
    }
    // A target still learning its capacity has no estimate yet: its unbounded budget is
    // no capacity to admit cluster reservations against.
    let ops = if d.capacity_learning {
        0
    } else {
        d.capacity_estimate.ops.unwrap_or(0)
    };
    let capacity = (ops as u128 * 1_000_000_000 / d.period_ns as u128).min(u64::MAX as u128) as u64;
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

    #[test]
    fn a_missing_socket_names_it() {
        let mut t = SocketTarget::new("/nonexistent/x.sock".into(), Duration::from_millis(100));
        let e = t.read("d").unwrap_err();
        assert!(e.to_string().contains("/nonexistent/x.sock"), "{e}");
    }
}
