//! Admission control (Haechi Definition 2). A set of reservations is admitted only if the
//! target can serve them all (aggregate constraint, sum R_i <= T * C_G) and each host can
//! reach its own (local constraint, R_i - N_i(t) <= (T - t) * C_L, checked at t = 0 when
//! configuring and at every check interval while running). With tenant groups the
//! check has two levels: the group's hosts' reservations must fit in the group's
//! reservation (and limit), and the domain's sum counts each group at its reservation.

use serde::Serialize;
use thiserror::Error;

use crate::config::{DomainConfig, GroupBudgets, HostBudgets};
use crate::cost::{Amount, Resource};
use crate::depth::{CurvePoint, OperatingPoint, saturated};
use crate::time::{Nanos, mul_div};

/// One failed constraint, in per-second figures as the operator configured them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "constraint", rename_all = "snake_case")]
pub enum Violation {
    Aggregate {
        resource: Resource,
        reserved_per_sec: u64,
        capacity_per_sec: u64,
    },
    Local {
        host: String,
        resource: Resource,
        reservation_per_sec: u64,
        per_host_max_per_sec: u64,
    },
    /// The hosts of a group reserve more than the group.
    Group {
        group: String,
        resource: Resource,
        hosts_reserved_per_sec: u64,
        group_reservation_per_sec: u64,
    },
    /// The hosts of a group reserve more than the group's limit allows.
    GroupLimit {
        group: String,
        resource: Resource,
        hosts_reserved_per_sec: u64,
        group_limit_per_sec: u64,
    },
    /// The reservations would exceed what the target does at its operating point, C\*,
    /// on the depth curve it has learned (issue 26). Checked only once the curve has
    /// flattened (it was seen deeper than Q\*, so C\* is what the target can do, not
    /// what a light load has shown so far), and only against a change that reserves
    /// more.
    OperatingPoint {
        reserved_per_sec: u64,
        operating_per_sec: u64,
        max_per_sec: u64,
    },
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Violation::Aggregate {
                resource,
                reserved_per_sec,
                capacity_per_sec,
            } => write!(
                f,
                "domain level: the reservations add up to {} which exceeds the target capacity C_G = {}; lower a reservation or raise the capacity",
                show(*resource, *reserved_per_sec),
                show(*resource, *capacity_per_sec)
            ),
            Violation::Local {
                host,
                resource,
                reservation_per_sec,
                per_host_max_per_sec,
            } => write!(
                f,
                "reservation {} for host {host} exceeds the per-host capacity C_L = {}",
                show(*resource, *reservation_per_sec),
                show(*resource, *per_host_max_per_sec)
            ),
            Violation::Group {
                group,
                resource,
                hosts_reserved_per_sec,
                group_reservation_per_sec,
            } => write!(
                f,
                "group level: the hosts of group {group} reserve {} which exceeds the group's reservation {}; raise the group's reservation or lower a host's",
                show(*resource, *hosts_reserved_per_sec),
                show(*resource, *group_reservation_per_sec)
            ),
            Violation::GroupLimit {
                group,
                resource,
                hosts_reserved_per_sec,
                group_limit_per_sec,
            } => write!(
                f,
                "group level: the hosts of group {group} reserve {} which exceeds the group's limit {}; raise the group's limit or lower a host's reservation",
                show(*resource, *hosts_reserved_per_sec),
                show(*resource, *group_limit_per_sec)
            ),
            Violation::OperatingPoint {
                reserved_per_sec,
                operating_per_sec,
                max_per_sec,
            } => write!(
                f,
                "operating point: the reservations add up to {reserved_per_sec} IOPS (cost units) which exceeds C* = {operating_per_sec}, what the target does at its operating point on the depth curve it learned (the most it was seen to do: {max_per_sec}; qos_stats_get's operating_point); lower a reservation, or raise the domain's efficiency_milli (up to 1000: C* = the most)"
            ),
        }
    }
}

fn show(r: Resource, per_sec: u64) -> String {
    match r {
        Resource::Ops => format!("{per_sec} IOPS"),
        Resource::Bytes => format!("{} MiB/s", per_sec / crate::config::MIB),
    }
}

/// The reservations do not fit; every failed constraint is listed.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("admission refused: {}", .violations.iter().map(|v| v.to_string()).collect::<Vec<_>>().join("; "))]
pub struct AdmissionError {
    pub violations: Vec<Violation>,
}

/// What an admitted configuration uses, for `qos-lab check` and the stats RPC.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AdmissionReport {
    /// Sum of hard reservations per period.
    pub reserved: Amount,
    /// Capacity per period.
    pub capacity: Amount,
    /// Capacity left for the global pool per period.
    pub unreserved: Amount,
}

fn per_second(domain: &DomainConfig, per_period: u64) -> u64 {
    mul_div(per_period, Nanos::from_secs(1).0, domain.period.0)
}

/// Checks the aggregate and the local constraint at the start of a period.
pub fn check_admission<'a>(
    domain: &DomainConfig,
    hosts: impl IntoIterator<Item = (&'a str, &'a HostBudgets)>,
) -> Result<AdmissionReport, AdmissionError> {
    check_grouped_admission(domain, hosts.into_iter().map(|(n, b)| (n, b, None)), &[])
}

/// [`check_admission`] with tenant groups: each host names its group (or none), and
/// `groups` lists every group. A group counts in the domain's sum at its reservation
/// (or at its hosts' sum, if that is larger, so that every violation is reported).
/// A host naming a group not in `groups` counts as a lone host (the monitor refuses
/// unknown groups before it gets here).
pub fn check_grouped_admission<'a>(
    domain: &DomainConfig,
    hosts: impl IntoIterator<Item = (&'a str, &'a HostBudgets, Option<&'a str>)>,
    groups: &[(&str, &GroupBudgets)],
) -> Result<AdmissionReport, AdmissionError> {
    let capacity = domain.capacity_per_period();
    let local_max = domain.per_host_max_per_period();
    let mut reserved = Amount::ZERO;
    let mut violations = Vec::new();
    let mut in_group = vec![Amount::ZERO; groups.len()];
    for (nqn, b, group) in hosts {
        if let Some(g) = group.and_then(|g| groups.iter().position(|(n, _)| *n == g)) {
            in_group[g] = in_group[g].saturating_add(b.reservation_total());
            check_local(domain, nqn, b, local_max, &mut violations);
            continue;
        }
        check_local(domain, nqn, b, local_max, &mut violations);
        reserved = reserved.saturating_add(b.reservation_total());
    }
    for ((name, g), hosts_sum) in groups.iter().zip(in_group) {
        for res in Resource::ALL {
            if hosts_sum.get(res) > g.reservation.get(res) {
                violations.push(Violation::Group {
                    group: name.to_string(),
                    resource: res,
                    hosts_reserved_per_sec: per_second(domain, hosts_sum.get(res)),
                    group_reservation_per_sec: per_second(domain, g.reservation.get(res)),
                });
            }
            if hosts_sum.get(res) > g.limit.get(res) {
                violations.push(Violation::GroupLimit {
                    group: name.to_string(),
                    resource: res,
                    hosts_reserved_per_sec: per_second(domain, hosts_sum.get(res)),
                    group_limit_per_sec: per_second(domain, g.limit.get(res)),
                });
            }
            let counted = g.reservation.get(res).max(hosts_sum.get(res));
            reserved.set(res, reserved.get(res).saturating_add(counted));
        }
    }
    for res in Resource::ALL {
        if reserved.get(res) > capacity.get(res) {
            violations.push(Violation::Aggregate {
                resource: res,
                reserved_per_sec: per_second(domain, reserved.get(res)),
                capacity_per_sec: per_second(domain, capacity.get(res)),
            });
        }
    }
    if violations.is_empty() {
        Ok(AdmissionReport {
            reserved,
            capacity,
            unreserved: capacity.saturating_sub(reserved),
        })
    } else {
        Err(AdmissionError { violations })
    }
}

/// The operating-point check of issue 26: a change that raises the hard reservations
/// (per period, operations in cost units) from `before` to `after` is refused when
/// `after` exceeds `op`'s rate C\* and `curve` shows the target saturated
/// ([`crate::depth::saturated`]: seen at least twice as deep as Q\*). Before that the
/// curve's maximum is only what the load so far has shown, and the configured capacity
/// (if any) is the check.
pub fn check_operating_point(
    domain: &DomainConfig,
    (before, after): (u64, u64),
    op: &OperatingPoint,
    curve: &[CurvePoint],
) -> Result<(), AdmissionError> {
    let reserved_per_sec = per_second(domain, after);
    if after <= before || !saturated(curve, op) || reserved_per_sec <= op.rate {
        return Ok(());
    }
    Err(AdmissionError {
        violations: vec![Violation::OperatingPoint {
            reserved_per_sec,
            operating_per_sec: op.rate,
            max_per_sec: op.max_rate,
        }],
    })
}

fn check_local(
    domain: &DomainConfig,
    nqn: &str,
    b: &HostBudgets,
    local_max: Amount,
    violations: &mut Vec<Violation>,
) {
    let r = b.reservation_total();
    for res in Resource::ALL {
        if r.get(res) > local_max.get(res) {
            violations.push(Violation::Local {
                host: nqn.to_string(),
                resource: res,
                reservation_per_sec: per_second(domain, r.get(res)),
                per_host_max_per_sec: per_second(domain, local_max.get(res)),
            });
        }
    }
}

/// The local constraint at time `elapsed` into a period: can a host that still has
/// `residual` reservation to serve get it done at the per-host maximum rate in the time
/// left? Returns the shortfall (0 when it can).
pub fn local_shortfall(
    domain: &DomainConfig,
    residual: u64,
    resource: Resource,
    elapsed: Nanos,
) -> u64 {
    let left = domain.period.saturating_sub(elapsed);
    let reachable = mul_div(
        domain.per_host_max_per_period().get(resource),
        left.0,
        domain.period.0,
    );
    residual.saturating_sub(reachable)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Capacity, HostConfig, Rate};

    /// Haechi Example 2: C_G = 100 IOPS, C_L = 50 IOPS, R_1 = 40, R_2..5 = 10.
    fn example2() -> (DomainConfig, Vec<(String, HostBudgets)>) {
        let d = DomainConfig {
            capacity: Capacity {
                iops: Some(100),
                ..Capacity::default()
            },
            per_host_max: Rate::iops(50),
            ..DomainConfig::default()
        };
        let hosts = [40, 10, 10, 10, 10]
            .iter()
            .enumerate()
            .map(|(i, r)| {
                let nqn = format!("nqn.example2:c{}", i + 1);
                let b = HostConfig::new(&nqn)
                    .with_reservation(Rate::iops(*r))
                    .budgets(&d)
                    .unwrap();
                (nqn, b)
            })
            .collect();
        (d, hosts)
    }

    #[test]
    fn the_operating_point_refuses_more_reserved_only_once_the_target_was_saturated() {
        // 1 s periods: per period = per second.
        let d = DomainConfig::default();
        let op = OperatingPoint {
            in_flight_milli: 40_000,
            rate: 100_000,
            max_rate: 103_000,
            latency: Nanos::from_micros(400),
        };
        let point = |q: u64| CurvePoint {
            in_flight_milli: q,
            rate: 100_000,
        };
        let seen_deep = [point(40_000), point(80_000)];
        let per = |v: u64| d.per_period(v);
        // Seen twice as deep as Q*: more than C* is refused, with the numbers.
        let e =
            check_operating_point(&d, (per(50_000), per(100_001)), &op, &seen_deep).unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.contains("100001 IOPS") && msg.contains("C* = 100000"),
            "{msg}"
        );
        assert!(msg.contains("103000"), "{msg}");
        // Up to C*, or a change that reserves less or the same, passes.
        check_operating_point(&d, (per(50_000), per(100_000)), &op, &seen_deep).unwrap();
        check_operating_point(&d, (per(120_000), per(110_000)), &op, &seen_deep).unwrap();
        check_operating_point(&d, (per(120_000), per(120_000)), &op, &seen_deep).unwrap();
        // Seen only up to 1.5 Q* (a paced load's depth moving with its latency): no check.
        let near = [point(40_000), point(60_000)];
        check_operating_point(&d, (0, per(500_000)), &op, &near).unwrap();
    }

    #[test]
    fn haechi_example_2_is_admitted_at_t0() {
        let (d, hosts) = example2();
        let rep = check_admission(&d, hosts.iter().map(|(n, b)| (n.as_str(), b))).unwrap();
        assert_eq!(rep.reserved.ops, 80);
        assert_eq!(rep.unreserved.ops, 20);
    }

    #[test]
    fn haechi_example_2_local_constraint_fails_at_half_period() {
        // All five send a burst of R_i at t = 0 and share C_G equally: N_i(0.5) = 10.
        // Client 1 still needs 30, but at C_L = 50 IOPS only 25 fit in 0.5 s.
        let (d, _) = example2();
        let half = Nanos::from_millis(500);
        assert_eq!(local_shortfall(&d, 40 - 10, Resource::Ops, half), 5);
        for _ in 2..=5 {
            assert_eq!(local_shortfall(&d, 10 - 10, Resource::Ops, half), 0);
        }
    }

    #[test]
    fn aggregate_and_local_violations_are_all_listed_with_numbers() {
        let d = DomainConfig {
            capacity: Capacity {
                iops: Some(1_570_000),
                ..Capacity::default()
            },
            per_host_max: Rate::iops(400_000),
            ..DomainConfig::default()
        };
        let a = HostConfig::new("nqn.a")
            .with_reservation(Rate::iops(500_000))
            .budgets(&d)
            .unwrap();
        let b = HostConfig::new("nqn.b")
            .with_reservation(Rate::iops(1_100_000))
            .budgets(&d)
            .unwrap();
        let e = check_admission(&d, [("nqn.a", &a), ("nqn.b", &b)]).unwrap_err();
        assert_eq!(e.violations.len(), 3);
        let msg = e.to_string();
        assert!(
            msg.contains("reservation 500000 IOPS for host nqn.a exceeds the per-host capacity C_L = 400000 IOPS"),
            "{msg}"
        );
        assert!(
            msg.contains(
                "add up to 1600000 IOPS which exceeds the target capacity C_G = 1570000 IOPS"
            ),
            "{msg}"
        );
    }
}
