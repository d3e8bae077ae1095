//! The leader agent's CPU per interval, predicted (issue 42, item 4): `plan`'s measured
//! time plus the interval's record handling, the bytes of records the lab counts
//! ([`LeaderBytes`]) times per-byte costs measured on this machine ([`ByteCosts`]) by a
//! calibration that does to records of the scenario's size what the agent does to
//! them, with the same libraries (serde_json, base64): decoding etcd's JSON answer
//! (records base64-encoded in it) and comparing each record with the text read the
//! interval before; parsing a record into the agent's types; serialising one into a
//! put's JSON. Not modelled: the target's RPC answers (`qos_stats_get`,
//! `qos_host_get`) and its `qos_host_set`s, HTTP and the kernel's part of each call,
//! the agent's log and metrics.

use std::collections::BTreeMap;
use std::hint::black_box;
use std::time::Instant;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use qos_core::cluster::{LocalShare, PathDemand};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::etcd::LeaderBytes;
use super::{ClusterRun, ClusterScenario};

/// Nanoseconds per byte of record, measured.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ByteCosts {
    /// Listed: in etcd's JSON answer (base64), decoded, compared with the last text.
    pub listed_ns: f64,
    /// Parsed into the agent's types.
    pub parsed_ns: f64,
    /// Written: serialised, base64-encoded into the put's JSON.
    pub written_ns: f64,
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

/// Nanoseconds per call of `f`, the median of 5 rounds of at least 20 ms each.
fn time(mut f: impl FnMut()) -> f64 {
    let mut rounds: Vec<f64> = (0..5)
        .map(|_| {
            let (t0, mut n) = (Instant::now(), 0u64);
            while n == 0 || t0.elapsed().as_millis() < 20 {
                f();
                n += 1;
            }
            t0.elapsed().as_nanos() as f64 / n as f64
        })
        .collect();
    rounds.sort_by(f64::total_cmp);
    rounds[2]
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
        let answer = json!({ "kvs": texts.iter().enumerate().map(|(k, t)| json!({
            "key": B64.encode(format!("/nvmf-qos/fleet/demand/t{k:03}")),
            "value": B64.encode(t),
            "mod_revision": "12345",
        })).collect::<Vec<_>>() })
        .to_string();
        let listed = time(|| {
            let v: Value = serde_json::from_str(black_box(&answer)).expect("json");
            for (kv, kept) in v["kvs"].as_array().expect("kvs").iter().zip(&texts) {
                let raw = B64
                    .decode(kv["value"].as_str().expect("value"))
                    .expect("b64");
                let text = String::from_utf8(raw).expect("utf-8");
                black_box(text == *kept);
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
        ByteCosts {
            listed_ns: listed / bytes,
            parsed_ns: parsed / bytes,
            written_ns: written / bytes,
        }
    }

    /// The leader's record handling per interval, milliseconds, from what it handled
    /// over its intervals.
    pub fn per_interval_ms(&self, b: &LeaderBytes) -> RecordHandling {
        let per = |bytes: u64| bytes as f64 / b.intervals.max(1) as f64;
        let ms = |bytes: f64, ns: f64| bytes * ns / 1e6;
        RecordHandling {
            listed_ms: ms(per(b.listed), self.listed_ns),
            parsed_ms: ms(per(b.parsed), self.parsed_ns),
            // Its part and the head (one answer each), the contracts (one listing):
            // listed and parsed every interval.
            read_ms: ms(
                per(b.part_read + b.contracts),
                self.listed_ns + self.parsed_ns,
            ),
            written_ms: ms(per(b.written), self.written_ns),
        }
    }
}

/// The leader's record handling per interval, predicted, milliseconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RecordHandling {
    pub listed_ms: f64,
    pub parsed_ms: f64,
    pub read_ms: f64,
    pub written_ms: f64,
}

impl RecordHandling {
    pub fn total_ms(&self) -> f64 {
        self.listed_ms + self.parsed_ms + self.read_ms + self.written_ms
    }
}

/// The leader's predicted CPU per interval, with its parts: its own line, as the costs
/// are measured on this machine and the division time with them.
pub fn agent_cpu_line(run: &ClusterRun, costs: &ByteCosts) -> String {
    let b = &run.etcd.leader_bytes;
    if b.intervals == 0 {
        return "leader agent's CPU per interval (predicted): no division".into();
    }
    let plan_ms = run
        .division_times
        .iter()
        .map(|d| d.as_secs_f64() * 1000.0)
        .sum::<f64>()
        / run.division_times.len().max(1) as f64;
    let h = costs.per_interval_ms(b);
    let mb = |bytes: u64| bytes as f64 / b.intervals as f64 / 1e6;
    format!(
        "leader agent's CPU per interval (predicted, measured costs on this machine, not deterministic): {:.1} ms = plan {plan_ms:.1} ms + listing {:.1} ms ({:.2} MB of member and demand records at {:.2} ns/B) + parsing {:.1} ms ({:.2} MB changed, {:.2} ns/B) + its part, head and the contracts {:.1} ms ({:.2} MB) + writing {:.1} ms ({:.2} MB, {:.2} ns/B); not modelled: the target's RPCs, HTTP, the kernel",
        plan_ms + h.total_ms(),
        h.listed_ms,
        mb(b.listed),
        costs.listed_ns,
        h.parsed_ms,
        mb(b.parsed),
        costs.parsed_ns,
        h.read_ms,
        mb(b.part_read + b.contracts),
        h.written_ms,
        mb(b.written),
        costs.written_ns,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handling_is_the_bytes_per_interval_times_their_cost() {
        let costs = ByteCosts {
            listed_ns: 2.0,
            parsed_ns: 5.0,
            written_ns: 3.0,
        };
        let b = LeaderBytes {
            intervals: 4,
            listed: 4_000_000,
            parsed: 400_000,
            part_read: 200_000,
            contracts: 200_000,
            written: 800_000,
        };
        let h = costs.per_interval_ms(&b);
        // Per interval: 1 MB listed (2 ms), 0.1 MB parsed (0.5 ms), 0.1 MB read and
        // parsed (0.7 ms), 0.2 MB written (0.6 ms).
        let close = |a: f64, b: f64| (a - b).abs() < 1e-9;
        assert!(close(h.listed_ms, 2.0), "{h:?}");
        assert!(close(h.parsed_ms, 0.5), "{h:?}");
        assert!(close(h.read_ms, 0.7), "{h:?}");
        assert!(close(h.written_ms, 0.6), "{h:?}");
        assert!(close(h.total_ms(), 3.8));
    }
}
