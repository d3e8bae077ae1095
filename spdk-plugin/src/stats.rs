//! `qos_stats_get` output: the monitor's statistics of a domain and its hosts, plus the
//! per-period history kept by the core (newest first), so that an operator (or the
//! integration test) can see in how many periods each host got its reservation.

use qos_core::Amount;
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

/// Statistics of domain `name`, with up to `periods` past periods per host.
pub fn domain(name: &str, d: &Domain, periods: usize) -> Value {
    let s = d.monitor.stats(now());
    let hosts: Vec<Value> = s
        .hosts
        .iter()
        .map(|h| {
            let history = d.monitor.history(&h.host_nqn);
            let recs: Vec<Value> = history
                .map(|hist| {
                    hist.iter()
                        .rev()
                        .take(periods)
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
            let (backlogged, met_backlogged) = history.map_or((0, 0), |hist| {
                hist.iter()
                    .filter(|p| p.backlogged)
                    .fold((0u64, 0u64), |(b, m), p| (b + 1, m + p.met as u64))
            });
            json!({
                "host_nqn": h.host_nqn,
                "configured": !d.implicit.contains(&h.host_nqn),
                "min": h.config.reservation,
                "max": h.config.limit,
                "weight": h.config.weight,
                "priority": h.config.priority,
                "completed_this_period": {
                    "ops": h.completed_this_period.ops,
                    "bytes": h.completed_this_period.bytes,
                    "ios": h.completed_ios_this_period,
                },
                "last_periods": h.last_periods.iter().map(|a| a.ops).collect::<Vec<_>>(),
                "periods": recs,
                "reservation_met_fraction": h.reservation_met_fraction,
                "reservation_met_fraction_backlogged": if backlogged == 0 {
                    Value::Null
                } else {
                    json!(met_backlogged as f64 / backlogged as f64)
                },
                "reservation_per_period": amount(h.reservation_per_period),
                "soft_granted": amount(h.soft_granted),
                "reservation_tokens": amount(h.reservation_tokens),
                "credit_tokens": amount(h.credit_tokens),
                "limit_left": amount(h.limit_left),
                "held": h.held_now,
                "group": h.group,
                "excess_granted_this_period": amount(h.excess_granted),
                "underuse_flag": h.underuse_flag,
                "reservation_at_risk": h.reservation_at_risk,
            })
        })
        .collect();
    json!({
        "name": name,
        "epoch": s.epoch,
        "period_ns": s.period_ns,
        "elapsed_ns": s.elapsed_ns,
        "capacity_estimate": amount(s.budget),
        "global_available": amount(s.global_available),
        "sharing": s.sharing,
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
