//! Per-period history of a QoS domain as the tests see it, merged from polls of
//! `qos_stats_get` (read by [`crate::stats`]): every host's completed periods by epoch,
//! the wall time each epoch started, the target's held I/O per host at each poll, and the
//! capacity estimator's figures.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::stats::{DomainStats, EstimatorRecord, PeriodRec};
use crate::target::Target;

/// What polls of one domain's statistics have shown.
#[derive(Debug)]
pub struct History {
    domain: String,
    /// Per host NQN, its completed periods by epoch.
    pub hosts: BTreeMap<String, BTreeMap<u64, PeriodRec>>,
    /// Wall time each epoch started (as estimated at the first poll that saw it).
    pub start: BTreeMap<u64, Instant>,
    /// The domain's period at the last poll.
    pub period: Duration,
    /// The period in progress at the last poll.
    pub epoch: u64,
    /// The capacity estimate (operations per period) at each poll, by the epoch then.
    pub estimate: BTreeMap<u64, u64>,
    /// The estimator's decision at the end of each period.
    pub decisions: BTreeMap<u64, EstimatorRecord>,
    /// Per host NQN, the I/O the target held at each poll.
    pub held: BTreeMap<String, Vec<i64>>,
}

static NO_PERIODS: BTreeMap<u64, PeriodRec> = BTreeMap::new();

impl History {
    /// Past periods asked for at each poll: poll more often than this many periods.
    pub const PERIODS: u32 = 64;

    /// An empty history of domain `domain`.
    pub fn new(domain: &str) -> History {
        History {
            domain: domain.into(),
            hosts: BTreeMap::new(),
            start: BTreeMap::new(),
            period: Duration::from_secs(1),
            epoch: 0,
            estimate: BTreeMap::new(),
            decisions: BTreeMap::new(),
            held: BTreeMap::new(),
        }
    }

    /// Polls the domain at `t` (panics if the target refuses).
    pub fn poll(&mut self, t: &mut Target) {
        let s = t.stats(&self.domain, Self::PERIODS as usize);
        self.record(&s, Instant::now());
    }

    /// Polls the domain at `t`; false (nothing recorded) when the target does not
    /// answer, e.g. while it restarts.
    pub fn try_poll(&mut self, t: &mut Target) -> bool {
        let params = serde_json::json!({"domain": self.domain, "periods": Self::PERIODS});
        match t.try_stats(params) {
            Ok(s) => {
                self.record(&s, Instant::now());
                true
            }
            Err(_) => false,
        }
    }

    /// Merges statistics `s` read at `now`.
    pub fn record(&mut self, s: &DomainStats, now: Instant) {
        self.epoch = s.epoch;
        self.period = Duration::from_nanos(s.period_ns.max(1));
        let cur = now
            .checked_sub(Duration::from_nanos(s.elapsed_ns))
            .unwrap_or(now);
        for back in 0..Self::PERIODS {
            self.start
                .entry(s.epoch.saturating_sub(back.into()))
                .or_insert(cur.checked_sub(self.period * back).unwrap_or(cur));
        }
        self.estimate
            .insert(s.epoch, s.capacity_estimate.ops.unwrap_or(0));
        for e in &s.estimator_periods {
            self.decisions.insert(e.epoch, e.clone());
        }
        for h in &s.hosts {
            self.held
                .entry(h.host_nqn.clone())
                .or_default()
                .push(h.held);
            let m = self.hosts.entry(h.host_nqn.clone()).or_default();
            for p in &h.periods {
                m.insert(p.epoch, *p);
            }
        }
    }

    /// Host `nqn`'s periods by epoch (empty when never seen).
    pub fn of(&self, nqn: &str) -> &BTreeMap<u64, PeriodRec> {
        self.hosts.get(nqn).unwrap_or(&NO_PERIODS)
    }

    /// The epochs that started at or after `from` and ended by `to`, in order, that every
    /// host seen has a record of.
    pub fn epochs(&self, from: Instant, to: Instant) -> Vec<u64> {
        self.start
            .iter()
            .filter(|(e, s)| {
                **s >= from
                    && **s + self.period <= to
                    && self.hosts.values().all(|m| m.contains_key(e))
            })
            .map(|(e, _)| *e)
            .collect()
    }

    /// Host `nqn`'s operations in each of `epochs` (0 where it has no record).
    pub fn ops(&self, nqn: &str, epochs: &[u64]) -> Vec<u64> {
        let m = self.of(nqn);
        epochs
            .iter()
            .map(|e| m.get(e).map_or(0, |p| p.ops))
            .collect()
    }

    /// Host `nqn`'s rate (operations per second) in each of `epochs`.
    pub fn iops(&self, nqn: &str, epochs: &[u64]) -> Vec<f64> {
        let per_s = 1.0 / self.period.as_secs_f64();
        self.ops(nqn, epochs)
            .into_iter()
            .map(|o| o as f64 * per_s)
            .collect()
    }

    /// The first epoch from `from` on in which host `nqn` did more than `ops` operations.
    pub fn first_busy(&self, nqn: &str, from: u64, ops: u64) -> Option<u64> {
        self.of(nqn)
            .range(from..)
            .find(|(_, p)| p.ops > ops)
            .map(|(e, _)| *e)
    }

    /// The estimator's decisions, one `epoch:offered/budget->next step(evidence)` per
    /// period, in thousands of operations per second.
    /// The longest gap between two runs of the target's monitor in period `epoch` (its
    /// thread not scheduled that long), when the period was polled.
    pub fn longest_tick_gap(&self, epoch: u64) -> Option<Duration> {
        self.decisions
            .get(&epoch)
            .map(|d| Duration::from_nanos(d.longest_tick_gap_ns))
    }

    pub fn decisions_line(&self) -> String {
        let k = |v: u64| v as f64 / self.period.as_secs_f64() / 1000.0;
        self.decisions
            .iter()
            .map(|(e, d)| {
                format!(
                    "{e}:{:.0}/{:.0}->{:.0} {}({})",
                    k(d.offered),
                    k(d.budget),
                    k(d.next),
                    d.step,
                    d.evidence
                )
            })
            .collect::<Vec<_>>()
            .join(" ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::parse_stats;
    use serde_json::{Value, json};

    fn answer(epoch: u64, recs: &[(&str, &[(u64, u64)])]) -> DomainStats {
        let host = |nqn: &str, periods: &[(u64, u64)]| {
            json!({
                "host_nqn": nqn, "configured": true, "min": {}, "max": {}, "weight": 1,
                "priority": "normal", "reservation_per_period": {"ops": 0, "bytes": 0},
                "completed_this_period": {"ops": 0, "bytes": 0, "ios": 0},
                "completed_total": {"ops": 0, "bytes": 0, "ios": 0}, "admitted_ios_total": 0,
                "in_flight": {"ops": 0, "bytes": 0}, "held": 1, "group": null,
                "excess_granted_this_period": {"ops": 0, "bytes": 0}, "throttled_ios": 0,
                "hold_events": 0, "held_time": {"cumulative": [0], "count": 0, "sum_ns": 0},
                "periods_total": {"met": 0, "missed": 0, "met_backlogged": 0,
                                  "missed_backlogged": 0},
                "reservation_met_fraction": null, "reservation_tokens": {"ops": 0, "bytes": 0},
                "credit_tokens": {"ops": 0, "bytes": 0}, "limit_left": {"ops": null, "bytes": null},
                "underuse_flag": false, "reservation_at_risk": false,
                "reservation_unreachable": false, "in_flight_at_base": 0.0,
                "reservation_depth_needed": null,
                "periods": periods.iter().map(|&(e, ops)| json!({"epoch": e, "ops": ops,
                    "bytes": 0, "ios": ops, "met": ops >= 10, "backlogged": false}))
                    .collect::<Vec<_>>(),
            })
        };
        let hosts: Vec<Value> = recs.iter().map(|(n, p)| host(n, p)).collect();
        parse_stats(
            json!([{"name": "d", "epoch": epoch, "period_ns": 100_000_000u64,
            "elapsed_ns": 0, "capacity_estimate": {"ops": 50, "bytes": null},
            "global_available": {"ops": 0, "bytes": null}, "sharing": "weighted",
            "operating_point": {"efficiency_milli": 970, "depth_curve": []},
            "held_time_bounds_ns": [], "hosts": hosts, "groups": []}]),
        )
        .remove(0)
    }

    #[test]
    fn merges_polls_and_keeps_whole_epochs_every_host_has() {
        let mut h = History::new("d");
        let t0 = Instant::now() + Duration::from_secs(10);
        h.record(
            &answer(3, &[("a", &[(1, 5), (2, 12)]), ("b", &[(2, 3)])]),
            t0,
        );
        let t1 = t0 + Duration::from_millis(200);
        h.record(
            &answer(5, &[("a", &[(4, 11)]), ("b", &[(3, 9), (4, 10)])]),
            t1,
        );
        assert_eq!(h.epoch, 5);
        // Epoch 2 started at t0 - 100 ms; epochs 2..=4 end by t1. Host b has no epoch 1,
        // host a no epoch 3.
        let e = h.epochs(t0 - Duration::from_millis(150), t1);
        assert_eq!(e, [2, 4]);
        assert_eq!(h.ops("a", &e), [12, 11]);
        assert_eq!(h.iops("b", &e), [30.0, 100.0]);
        assert_eq!(h.ops("nobody", &e), [0, 0]);
        assert!(h.of("a")[&2].met && !h.of("b")[&2].met);
        assert_eq!(h.held["a"], [1, 1]);
        assert_eq!(h.first_busy("b", 0, 5), Some(3));
        assert_eq!(h.estimate[&5], 50);
    }
}
