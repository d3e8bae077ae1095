//! The one typed reader of the target plugin's statistics: `qos_stats_get`'s answer as
//! [`DomainStats`], [`HostStats`] and [`GroupStats`]. They mirror the JSON that
//! `spdk-plugin/src/stats.rs` builds from the core's `qos_core::monitor::{DomainStats,
//! HostStats, GroupStats}` (with the plugin's own names: `held`, `throttled_ios`,
//! `{ops, bytes}` amounts with `null` for unlimited, the per-period history), so a test
//! reads fields, not string keys, and an answer that does not match stops the test with
//! the field that differs. Fields only the full form carries (`periods`,
//! `last_periods`, `estimator_periods`, ...) are empty in the compact form. A test
//! checks these types against `rpc-scripts/schema/stats.json`, which the plugin's tests
//! write from the types that build the answer.

use serde::Deserialize;
use serde_json::{Value, json};

use crate::rpc::RpcError;
use crate::target::Target;

/// An amount of work per resource; `None` where the plugin says `null` (unlimited).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
pub struct Amount {
    pub ops: Option<u64>,
    pub bytes: Option<u64>,
}

/// Work done: operations (cost units), bytes, and commands.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
pub struct Work {
    pub ops: u64,
    pub bytes: u64,
    pub ios: u64,
}

/// How long held commands waited: cumulative counts per bucket of the domain's
/// `held_time_bounds_ns` (the last entry: every observation).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct HeldTime {
    pub cumulative: Vec<u64>,
    pub count: u64,
    pub sum_ns: u64,
}

/// Completed periods by outcome, since the host was added.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
pub struct PeriodTotals {
    pub met: u64,
    pub missed: u64,
    pub met_backlogged: u64,
    pub missed_backlogged: u64,
}

/// One completed period of a host (full form, newest first).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
pub struct PeriodRec {
    pub epoch: u64,
    pub ops: u64,
    pub bytes: u64,
    pub ios: u64,
    /// The host got its reservation in that period.
    pub met: bool,
    /// The host had work waiting in that period.
    pub backlogged: bool,
}

/// A host's entitlement at the operating point (docs/rpc.md, `qos_stats_get`).
#[derive(Debug, Clone, Deserialize)]
pub struct Entitlement {
    pub contending: bool,
    pub held_fraction: f64,
    pub at_target: f64,
    /// The most commands at the target at one check interval (a lower bound of the
    /// host's queue depth).
    pub at_target_peak: u64,
    /// None: no bound.
    pub cap: Option<u64>,
    pub entitled: u64,
    pub achieved: u64,
    pub shortfall: u64,
    pub queue_depth_needed: f64,
}

/// One host of a domain.
#[derive(Debug, Clone, Deserialize)]
pub struct HostStats {
    pub host_nqn: String,
    /// Set by `qos_host_set` (else a best-effort host the plugin added itself).
    pub configured: bool,
    /// The reservation and limit as configured (`RateSet`s).
    pub min: Value,
    pub max: Value,
    pub weight: u32,
    pub priority: String,
    pub reservation_per_period: Amount,
    pub completed_this_period: Work,
    pub completed_total: Work,
    pub admitted_ios_total: u64,
    pub in_flight: Amount,
    /// Commands the target holds now.
    pub held: i64,
    pub group: Option<String>,
    pub excess_granted_this_period: Amount,
    /// Commands held at least once, since the host was added.
    pub throttled_ios: u64,
    pub hold_events: u64,
    /// Commands that entered a hold queue, by the rule that held them (monotonic):
    /// `{"limit": n, ..., "window": n, "bypassed": n}`.
    #[serde(default)]
    pub held_by: serde_json::Value,
    pub held_time: HeldTime,
    pub periods_total: PeriodTotals,
    pub reservation_met_fraction: Option<f64>,
    pub reservation_tokens: Amount,
    pub credit_tokens: Amount,
    pub limit_left: Amount,
    pub underuse_flag: bool,
    pub reservation_at_risk: bool,
    pub reservation_unreachable: bool,
    /// Its commands in flight at the base bdev, on average over the period so far.
    pub in_flight_at_base: f64,
    /// Commands it needs at the base for its reservation at the operating point.
    pub reservation_depth_needed: Option<f64>,
    /// Its entitlement at the operating point over the last ended period (none before
    /// the depth curve has a sample).
    #[serde(default)]
    pub entitlement: Option<Entitlement>,
    /// Full form: operations in the last periods, newest first.
    #[serde(default)]
    pub last_periods: Vec<u64>,
    /// Full form: the last periods, newest first (as many as asked).
    #[serde(default)]
    pub periods: Vec<PeriodRec>,
    #[serde(default)]
    pub reservation_met_fraction_backlogged: Option<f64>,
    #[serde(default)]
    pub soft_granted: Option<Amount>,
    /// Its burst and the credit left (issue 28); none without a burst.
    #[serde(default)]
    pub burst: Option<Burst>,
}

/// A host's or group's burst as `qos_stats_get` shows it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Deserialize)]
pub struct Burst {
    pub iops: Option<u64>,
    pub mibps: Option<u64>,
    pub seconds: Option<u64>,
    /// Seconds at the burst rate the credit left lasts.
    pub credit_seconds: f64,
    pub bursting: bool,
    /// Ended periods in which it burst.
    pub bursting_periods: u64,
}

/// A tenant group of a domain.
#[derive(Debug, Clone, Deserialize)]
pub struct GroupStats {
    pub name: String,
    pub hosts: Vec<String>,
    pub min: Value,
    pub max: Value,
    pub weight: u32,
    pub reservation_per_period: Amount,
    pub limit_per_period: Amount,
    pub completed_this_period: Amount,
    pub given_this_period: Amount,
    #[serde(default)]
    pub burst: Option<Burst>,
}

/// What the capacity estimator did at the end of a period (full form).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct EstimatorRecord {
    pub epoch: u64,
    pub budget: u64,
    pub used: u64,
    pub offered: u64,
    pub evidence: String,
    pub step: String,
    pub next: u64,
    /// The longest gap between two runs of the target's monitor in the period.
    #[serde(default)]
    pub longest_tick_gap_ns: u64,
}

/// Where the target's learned depth curve puts the operating point, and the curve
/// (operations per second, cost units). The point's fields are `None` until the curve
/// has a sample.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub struct OperatingPoint {
    pub efficiency_milli: u64,
    #[serde(default)]
    pub in_flight: Option<f64>,
    #[serde(default)]
    pub ops_per_s: Option<u64>,
    #[serde(default)]
    pub max_ops_per_s: Option<u64>,
    #[serde(default)]
    pub latency_ns: Option<u64>,
    pub depth_curve: Vec<CurvePoint>,
    /// Over the hosts' circulation only (issue 39).
    #[serde(default)]
    pub circulation: Option<Circulation>,
}

/// Over the hosts' circulation: N, H\*, what is held now, and the learner of N\* when it
/// is learned for η.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub struct Circulation {
    pub commands: u64,
    pub hold_target: u64,
    pub held: u64,
    #[serde(default)]
    pub learned: Option<Learned>,
}

/// The learner of N\* (`qos_core::circulation`).
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub struct Learned {
    #[serde(default)]
    pub n_star: Option<u64>,
    #[serde(default)]
    pub ratio: Option<f64>,
    #[serde(default)]
    pub last_ratio: Option<f64>,
    pub triplets: u64,
}

/// One point of the depth curve.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
pub struct CurvePoint {
    pub in_flight: f64,
    pub ops_per_s: u64,
}

/// One domain's statistics.
#[derive(Debug, Clone, Deserialize)]
pub struct DomainStats {
    pub name: String,
    /// The period in progress.
    pub epoch: u64,
    pub period_ns: u64,
    /// Time into the period in progress.
    pub elapsed_ns: u64,
    pub capacity_estimate: Amount,
    pub global_available: Amount,
    pub sharing: String,
    pub operating_point: OperatingPoint,
    pub held_time_bounds_ns: Vec<u64>,
    pub hosts: Vec<HostStats>,
    pub groups: Vec<GroupStats>,
    /// Full form: the estimator's decisions, newest first.
    #[serde(default)]
    pub estimator_periods: Vec<EstimatorRecord>,
}

impl DomainStats {
    /// Host `nqn`, if the domain has it.
    pub fn host(&self, nqn: &str) -> Option<&HostStats> {
        self.hosts.iter().find(|h| h.host_nqn == nqn)
    }

    /// Commands of all hosts held longer than `bound_ns` (to the histogram's
    /// resolution: counted from the first bucket whose bound is at least `bound_ns`).
    pub fn held_longer_than(&self, bound_ns: u64) -> u64 {
        let Some(k) = self.held_time_bounds_ns.iter().position(|&b| b >= bound_ns) else {
            return 0;
        };
        self.hosts
            .iter()
            .map(|h| {
                let c = &h.held_time.cumulative;
                let all = c.last().copied().unwrap_or(0);
                c.get(k).map_or(0, |within| all - within)
            })
            .sum()
    }
}

/// `qos_stats_get`'s answer, typed; panics with the answer when it does not parse (the
/// plugin and this reader disagree: fix the reader or the plugin).
pub fn parse_stats(answer: Value) -> Vec<DomainStats> {
    serde_json::from_value(answer.clone()).unwrap_or_else(|e| {
        panic!("qos_stats_get's answer does not read as it-harness's DomainStats: {e}\n{answer}")
    })
}

impl Target {
    /// `qos_stats_get` with `params` (which name one domain), typed; `Err` when the
    /// target refuses or does not answer.
    pub fn try_stats(&mut self, params: Value) -> Result<DomainStats, RpcError> {
        let answer = self.rpc("qos_stats_get", params.clone())?;
        parse_stats(answer)
            .into_iter()
            .next()
            .ok_or_else(|| RpcError {
                code: 0,
                message: format!("qos_stats_get {params}: no domain in the answer"),
            })
    }

    /// Domain `domain` with the last `periods` periods of every host (full form).
    pub fn stats(&mut self, domain: &str, periods: usize) -> DomainStats {
        self.stats_with(json!({"domain": domain, "periods": periods}))
    }

    /// Domain `domain`'s counters and gauges only (compact form).
    pub fn compact_stats(&mut self, domain: &str) -> DomainStats {
        self.stats_with(json!({"domain": domain, "compact": true}))
    }

    fn stats_with(&mut self, params: Value) -> DomainStats {
        self.try_stats(params.clone()).unwrap_or_else(|e| {
            panic!(
                "qos_stats_get {params}: {e}\ntarget log:\n{}",
                self.log_tail(20)
            )
        })
    }
}

#[cfg(test)]
#[path = "../../rpc-scripts/schema/stats_check.rs"]
mod stats_check;

#[cfg(test)]
mod tests {
    use super::*;

    /// A host as `spdk-plugin/src/stats.rs` writes it (`CompactHost`, and `FullHost`'s
    /// history for the full form).
    fn host(nqn: &str, full: bool) -> Value {
        let amount = |o: Option<u64>| json!({"ops": o, "bytes": null});
        let mut h = json!({
            "host_nqn": nqn, "configured": true, "min": {"total": {"iops": 100}}, "max": {},
            "weight": 2, "priority": "normal", "reservation_per_period": amount(Some(50)),
            "completed_this_period": {"ops": 3, "bytes": 12288, "ios": 3},
            "completed_total": {"ops": 900, "bytes": 3686400, "ios": 900},
            "admitted_ios_total": 904, "in_flight": amount(Some(4)), "held": 2,
            "group": null, "excess_granted_this_period": amount(Some(0)),
            "throttled_ios": 17, "hold_events": 20,
            "held_time": {"cumulative": [1, 5, 9], "count": 9, "sum_ns": 123},
            "periods_total": {"met": 10, "missed": 1, "met_backlogged": 4,
                              "missed_backlogged": 1},
            "reservation_met_fraction": 0.9, "reservation_tokens": amount(Some(7)),
            "credit_tokens": amount(Some(0)), "limit_left": amount(None),
            "underuse_flag": false, "reservation_at_risk": false,
            "reservation_unreachable": false, "in_flight_at_base": 1.5,
            "reservation_depth_needed": 0.25,
        });
        if full {
            h["last_periods"] = json!([51, 50]);
            h["periods"] = json!([
                {"epoch": 12, "ops": 51, "bytes": 208896, "ios": 51, "met": true, "backlogged": true},
                {"epoch": 11, "ops": 40, "bytes": 163840, "ios": 40, "met": false, "backlogged": false},
            ]);
            h["reservation_met_fraction_backlogged"] = Value::Null;
            h["soft_granted"] = amount(Some(0));
        }
        h
    }

    fn domain(full: bool) -> Value {
        let mut d = json!({
            "name": "d", "epoch": 13, "period_ns": 500_000_000u64, "elapsed_ns": 1000,
            "capacity_estimate": {"ops": 4000, "bytes": null},
            "global_available": {"ops": 10, "bytes": null}, "sharing": "first_come",
            "operating_point": {"efficiency_milli": 970, "in_flight": 64, "ops_per_s": 500_000,
                                "max_ops_per_s": 510_000, "latency_ns": 128_000,
                                "depth_curve": [{"in_flight": 64, "ops_per_s": 500_000}]},
            "held_time_bounds_ns": [1000, 2_000_000_000u64],
            "hosts": [host("h1", full), host("h2", full)],
            "groups": [{"name": "g", "hosts": ["h1"], "min": {}, "max": {}, "weight": 1,
                        "reservation_per_period": {"ops": 0, "bytes": 0},
                        "limit_per_period": {"ops": null, "bytes": null},
                        "completed_this_period": {"ops": 3, "bytes": 0},
                        "given_this_period": {"ops": 0, "bytes": 0}}],
        });
        if full {
            d["estimator_periods"] = json!([{"epoch": 12, "budget": 4000, "used": 3900,
                "offered": 4100, "evidence": "saturated", "step": "hold", "next": 4000}]);
        }
        json!([d])
    }

    #[test]
    fn reads_the_full_and_the_compact_form() {
        let full = parse_stats(domain(true)).remove(0);
        let h = full.host("h1").expect("h1");
        assert_eq!(
            (h.held, h.throttled_ios, h.completed_total.ios),
            (2, 17, 900)
        );
        assert_eq!(h.periods[0].epoch, 12);
        assert!(h.periods[0].met && !h.periods[1].met);
        assert_eq!(h.limit_left.ops, None);
        assert_eq!(
            (h.in_flight_at_base, h.reservation_depth_needed),
            (1.5, Some(0.25))
        );
        assert_eq!(full.estimator_periods[0].step, "hold");
        assert_eq!(full.groups[0].hosts, ["h1"]);
        assert_eq!(full.operating_point.in_flight, Some(64.0));
        assert_eq!(full.operating_point.depth_curve[0].ops_per_s, 500_000);
        let compact = parse_stats(domain(false)).remove(0);
        assert!(compact.hosts[1].periods.is_empty() && compact.estimator_periods.is_empty());
        // Bucket 1 (2 s) is the first at least 1.5 s: 9 - 5 held longer, per host.
        assert_eq!(compact.held_longer_than(1_500_000_000), 8);
    }

    /// Every field the reader takes is in `rpc-scripts/schema/stats.json` (which the
    /// plugin's stats test writes from the types that build the answer), with a type the
    /// reader takes: a field renamed there fails here, without SPDK, rather than in a
    /// real-target test.
    #[test]
    fn the_reader_reads_what_the_schema_says() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../rpc-scripts/schema/stats.json"
        );
        let schema = stats_check::load(path.as_ref());
        if let Err(e) = stats_check::check::<Vec<DomainStats>>(&schema) {
            panic!("it-harness's qos_stats_get reader disagrees with the schema:\n{e}");
        }
    }

    #[test]
    #[should_panic(expected = "missing field `held`")]
    fn an_answer_that_differs_names_the_field() {
        let mut d = domain(false);
        d[0]["hosts"][0]
            .as_object_mut()
            .expect("object")
            .remove("held");
        parse_stats(d);
    }
}
