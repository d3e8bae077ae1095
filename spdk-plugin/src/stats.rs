//! `qos_stats_get` output: the monitor's statistics of a domain and its hosts, plus the
//! per-period history kept by the core (newest first), so that an operator (or the
//! integration test) can see in how many periods each host got its reservation; and the
//! monotonic counters a scraper turns into rates (completed work, held time histogram,
//! periods by outcome). `compact` leaves the history out and `host_nqn` builds one host
//! only, so a scrape of a target with a thousand hosts stays cheap on the app thread.

use std::collections::VecDeque;

use qos_core::Amount;
use qos_core::histogram::HELD_BUCKETS_NS;
use qos_core::monitor::{HostStats, PeriodRecord};
use qos_core::sync::POOL_MAX;
use serde_json::{Value, json};

use crate::registry::{Domain, now};

/// A count, or `null` where the core's value stands for "unlimited".
fn count(v: u64) -> Value {
    if v >= POOL_MAX { Value::Null } else { json!(v) }
}

fn amount(a: Amount) -> Value {
    json!({"ops": count(a.ops), "bytes": count(a.bytes)})
}

/// What to put in the answer.
#[derive(Debug, Clone, Copy)]
pub struct Shape<'a> {
    /// Past periods per host (full form only).
    pub periods: usize,
    /// Counters and gauges only.
    pub compact: bool,
    /// One host only.
    pub host_nqn: Option<&'a str>,
}

/// The counters every form carries.
fn host_common(d: &Domain, h: &HostStats) -> Value {
    let p = &h.period_counts;
    json!({
        "host_nqn": h.host_nqn,
        "configured": !d.implicit.contains(&h.host_nqn),
        "min": h.config.reservation,
        "max": h.config.limit,
        "weight": h.config.weight,
        "priority": h.config.priority,
        "reservation_per_period": amount(h.reservation_per_period),
        "completed_this_period": {
            "ops": h.completed_this_period.ops,
            "bytes": h.completed_this_period.bytes,
            "ios": h.completed_ios_this_period,
        },
        "completed_total": {
            "ops": h.completed_total.ops,
            "bytes": h.completed_total.bytes,
            "ios": h.completed_ios_total,
        },
        "held": h.held_now,
        "group": h.group,
        "excess_granted_this_period": amount(h.excess_granted),
        "throttled_ios": h.held_time.held_ios,
        "hold_events": h.hold_events_total,
        "held_time": {
            "cumulative": h.held_time.cumulative,
            "count": h.held_time.count(),
            "sum_ns": h.held_time.sum_ns,
        },
        "periods_total": {
            "met": p.met,
            "missed": p.missed,
            "met_backlogged": p.met_backlogged,
            "missed_backlogged": p.missed_backlogged,
        },
        "reservation_met_fraction": h.reservation_met_fraction,
        "reservation_tokens": amount(h.reservation_tokens),
        "credit_tokens": amount(h.credit_tokens),
        "limit_left": amount(h.limit_left),
        "underuse_flag": h.underuse_flag,
        "reservation_at_risk": h.reservation_at_risk,
    })
}

/// The history part of the full form.
fn add_history(v: &mut Value, h: &HostStats, hist: Option<&VecDeque<PeriodRecord>>, n: usize) {
    let recs: Vec<Value> = hist
        .map(|hist| {
            hist.iter()
                .rev()
                .take(n)
                .map(|p| {
                    json!({
                        "epoch": p.epoch,
                        "ops": p.completed.ops,
                        "bytes": p.completed.bytes,
                        "ios": p.completed_ios,
                        "met": p.met,
                        "backlogged": p.backlogged,
                    })
                })
                .collect()
        })
        .unwrap_or_default();
    let (backlogged, met_backlogged) = hist.map_or((0, 0), |hist| {
        hist.iter()
            .filter(|p| p.backlogged)
            .fold((0u64, 0u64), |(b, m), p| (b + 1, m + p.met as u64))
    });
    v["last_periods"] = json!(h.last_periods.iter().map(|a| a.ops).collect::<Vec<_>>());
    v["periods"] = Value::Array(recs);
    v["reservation_met_fraction_backlogged"] = if backlogged == 0 {
        Value::Null
    } else {
        json!(met_backlogged as f64 / backlogged as f64)
    };
    v["soft_granted"] = amount(h.soft_granted);
}

/// Statistics of domain `name`.
pub fn domain(name: &str, d: &Domain, shape: Shape<'_>) -> Value {
    let s = d.monitor.stats_of(now(), shape.host_nqn);
    let hosts: Vec<Value> = if shape.compact {
        s.hosts.iter().map(|h| host_common(d, h)).collect()
    } else if shape.host_nqn.is_some() {
        s.hosts
            .iter()
            .map(|h| {
                let mut v = host_common(d, h);
                add_history(&mut v, h, d.monitor.history(&h.host_nqn), shape.periods);
                v
            })
            .collect()
    } else {
        // Same order as the stats: no lookup per host.
        s.hosts
            .iter()
            .zip(d.monitor.histories())
            .map(|(h, (nqn, hist))| {
                debug_assert_eq!(nqn, h.host_nqn);
                let mut v = host_common(d, h);
                add_history(&mut v, h, Some(hist), shape.periods);
                v
            })
            .collect()
    };
    json!({
        "name": name,
        "epoch": s.epoch,
        "period_ns": s.period_ns,
        "elapsed_ns": s.elapsed_ns,
        "capacity_estimate": amount(s.budget),
        "global_available": amount(s.global_available),
        "sharing": s.sharing,
        "held_time_bounds_ns": HELD_BUCKETS_NS,
        "hosts": hosts,
        "groups": s.groups.iter().map(|g| json!({
            "name": g.name,
            "hosts": g.hosts,
            "min": g.config.reservation,
            "max": g.config.limit,
            "weight": g.config.weight,
            "reservation_per_period": amount(g.reservation_per_period),
            "limit_per_period": amount(g.limit_per_period),
            "completed_this_period": amount(g.completed_this_period),
            "given_this_period": amount(g.given_this_period),
        })).collect::<Vec<_>>(),
    })
}
