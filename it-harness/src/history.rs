//! Per-period history of a QoS domain as the tests see it: completed operations per
//! host and epoch, merged from polls of `qos_stats_get`, the wall time each epoch
//! started, and the target's held I/O per host at each poll.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde_json::json;

use crate::target::Target;

/// What polls of one domain's `qos_stats_get` have shown.
#[derive(Debug, Default)]
pub struct History {
    /// Per host (in the order polled), completed operations by epoch.
    pub ops: Vec<BTreeMap<u64, u64>>,
    /// Wall time each epoch started.
    pub start: BTreeMap<u64, Instant>,
    pub period: Duration,
    /// Per host, the I/O the target held at each poll.
    pub held: Vec<Vec<i64>>,
}

impl History {
    /// Polls domain `domain` of `t` for `hosts` (host NQNs, in the order kept).
    pub fn poll(&mut self, t: &mut Target, domain: &str, hosts: &[String]) {
        let now = Instant::now();
        let s = t.call("qos_stats_get", json!({"domain": domain, "periods": 64}));
        let d = &s[0];
        let epoch = d["epoch"].as_u64().unwrap_or(0);
        let elapsed = Duration::from_nanos(d["elapsed_ns"].as_u64().unwrap_or(0));
        self.period = Duration::from_nanos(d["period_ns"].as_u64().unwrap_or(1));
        let cur = now.checked_sub(elapsed).unwrap_or(now);
        for back in 0..64u32 {
            let e = epoch.saturating_sub(back as u64);
            self.start
                .entry(e)
                .or_insert(cur.checked_sub(self.period * back).unwrap_or(cur));
        }
        if self.ops.is_empty() {
            self.ops = vec![BTreeMap::new(); hosts.len()];
            self.held = vec![Vec::new(); hosts.len()];
        }
        for h in d["hosts"].as_array().into_iter().flatten() {
            let nqn = h["host_nqn"].as_str().unwrap_or("");
            let Some(i) = hosts.iter().position(|x| x == nqn) else {
                continue;
            };
            self.held[i].push(h["held"].as_i64().unwrap_or(0));
            for p in h["periods"].as_array().into_iter().flatten() {
                if let (Some(e), Some(o)) = (p["epoch"].as_u64(), p["ops"].as_u64()) {
                    self.ops[i].insert(e, o);
                }
            }
        }
    }

    /// Ops per host for the epochs that lie entirely inside `[from, to]`.
    pub fn window(&self, from: Instant, to: Instant) -> Vec<Vec<u64>> {
        let epochs: Vec<u64> = self
            .start
            .iter()
            .filter(|(_, s)| **s >= from && **s + self.period <= to)
            .map(|(e, _)| *e)
            .collect();
        self.ops
            .iter()
            .map(|m| epochs.iter().filter_map(|e| m.get(e).copied()).collect())
            .collect()
    }
}
