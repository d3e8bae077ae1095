//! `qos_stats_get` output: the monitor's statistics of a domain and its hosts, plus the
//! per-period history kept by the core (newest first), so that an operator (or the
//! integration test) can see in how many periods each host got its reservation; and the
//! monotonic counters a scraper turns into rates (completed work, held time histogram,
//! periods by outcome). `compact` leaves the history out and `host_nqn` builds one host
//! only, so a scrape of a target with a thousand hosts stays cheap on the app thread.

use qos_core::burst::Burst;
use qos_core::depth::OperatingTarget;
use qos_core::histogram::HELD_BUCKETS_NS;
use qos_core::monitor::{
    BurstStats, DomainStats, Entitlement, EstimatorRecord, GroupStats, HostStats, PeriodCounts,
    PeriodRecord,
};
use qos_core::sync::POOL_MAX;
use qos_core::{Amount, ExcessSharing, Rate};
use qos_core::{PriorityClass, RateSet};
use std::collections::BTreeSet;

use qos_core::{Monitor, Nanos};
use serde::Serialize;

use crate::registry::{Domain, now};

/// What a domain's statistics are built from: its monitor, which of its hosts no
/// `qos_host_set` configured, and the time (an argument, so that the forms can be
/// built and checked outside SPDK).
#[derive(Debug, Clone, Copy)]
pub struct Source<'a> {
    pub monitor: &'a Monitor,
    pub implicit: &'a BTreeSet<String>,
    pub now: Nanos,
}

impl<'a> Source<'a> {
    /// Domain `d` now.
    pub fn of(d: &'a Domain) -> Self {
        Source {
            monitor: &d.monitor,
            implicit: &d.implicit,
            now: now(),
        }
    }
}

/// A count, or `None` (`null`) where the core's value stands for "unlimited".
fn count(v: u64) -> Option<u64> {
    (v < POOL_MAX).then_some(v)
}

/// `{ops, bytes}` with `null` for "unlimited".
#[derive(Debug, Serialize)]
struct Amt {
    ops: Option<u64>,
    bytes: Option<u64>,
}

fn amt(a: Amount) -> Amt {
    Amt {
        ops: count(a.ops),
        bytes: count(a.bytes),
    }
}

/// A group's amounts: [`Amt`] with `bytes` first. The groups were built as JSON maps,
/// whose keys serde_json sorts; the order is kept so that the answer did not change
/// when they became typed.
#[derive(Debug, Serialize)]
struct GroupAmt {
    bytes: Option<u64>,
    ops: Option<u64>,
}

fn group_amt(a: Amount) -> GroupAmt {
    GroupAmt {
        bytes: count(a.bytes),
        ops: count(a.ops),
    }
}

#[derive(Debug, Serialize)]
struct Work {
    ops: u64,
    bytes: u64,
    ios: u64,
}

#[derive(Debug, Serialize)]
struct HeldJson<'a> {
    cumulative: &'a [u64],
    count: u64,
    sum_ns: u64,
}

/// One host of the compact form, serialised straight from the core's statistics (no
/// `Value` tree: with a thousand hosts the tree's allocations were most of the cost).
/// Every form's host has these fields ([`FullHost`] adds the history).
#[derive(Debug, Serialize)]
struct CompactHost<'a> {
    host_nqn: &'a str,
    configured: bool,
    min: &'a RateSet,
    max: &'a RateSet,
    weight: u32,
    priority: PriorityClass,
    reservation_per_period: Amt,
    completed_this_period: Work,
    completed_total: Work,
    admitted_ios_total: u64,
    in_flight: Amt,
    held: i64,
    group: &'a Option<String>,
    excess_granted_this_period: Amt,
    throttled_ios: u64,
    hold_events: u64,
    /// Commands that entered a hold queue by the rule that held them, and those the
    /// bypass let through (monotonic).
    held_by: qos_core::HoldCounts,
    held_time: HeldJson<'a>,
    periods_total: &'a PeriodCounts,
    reservation_met_fraction: f64,
    reservation_tokens: Amt,
    credit_tokens: Amt,
    limit_left: Amt,
    underuse_flag: bool,
    reservation_at_risk: bool,
    reservation_unreachable: bool,
    in_flight_at_base: f64,
    reservation_depth_needed: Option<f64>,
    entitlement: Option<EntitlementOut>,
    burst: Option<BurstOut>,
}

/// A host's entitlement at the operating point, as the stats RPC shows it (rates in
/// operations per second, commands as decimals, `cap` null without a bound).
#[derive(Debug, Serialize)]
struct EntitlementOut {
    contending: bool,
    held_fraction: f64,
    at_target: f64,
    at_target_peak: u64,
    cap: Option<u64>,
    entitled: u64,
    achieved: u64,
    shortfall: u64,
    queue_depth_needed: f64,
}

fn entitlement_out(e: &Option<Entitlement>) -> Option<EntitlementOut> {
    e.map(|e| EntitlementOut {
        contending: e.contending,
        held_fraction: milli(e.held_fraction_milli),
        at_target: milli(e.at_target_milli),
        at_target_peak: e.at_target_peak,
        cap: (e.cap != u64::MAX).then_some(e.cap),
        entitled: e.entitled,
        achieved: e.achieved,
        shortfall: e.shortfall,
        queue_depth_needed: milli(e.queue_depth_needed_milli),
    })
}

/// Host `h` of the compact form; `implicit`: the hosts no `qos_host_set` configured.
fn compact_host<'a>(implicit: &BTreeSet<String>, h: &'a HostStats) -> CompactHost<'a> {
    CompactHost {
        host_nqn: &h.host_nqn,
        configured: !implicit.contains(&h.host_nqn),
        min: &h.config.reservation,
        max: &h.config.limit,
        weight: h.config.weight,
        priority: h.config.priority,
        reservation_per_period: amt(h.reservation_per_period),
        completed_this_period: Work {
            ops: h.completed_this_period.ops,
            bytes: h.completed_this_period.bytes,
            ios: h.completed_ios_this_period,
        },
        completed_total: Work {
            ops: h.completed_total.ops,
            bytes: h.completed_total.bytes,
            ios: h.completed_ios_total,
        },
        admitted_ios_total: h.admitted_ios_total,
        in_flight: amt(h.in_flight),
        held: h.held_now,
        group: &h.group,
        excess_granted_this_period: amt(h.excess_granted),
        throttled_ios: h.held_time.held_ios,
        hold_events: h.hold_events_total,
        held_by: h.holds,
        held_time: HeldJson {
            cumulative: &h.held_time.cumulative,
            count: h.held_time.count(),
            sum_ns: h.held_time.sum_ns,
        },
        periods_total: &h.period_counts,
        reservation_met_fraction: h.reservation_met_fraction,
        reservation_tokens: amt(h.reservation_tokens),
        credit_tokens: amt(h.credit_tokens),
        limit_left: amt(h.limit_left),
        underuse_flag: h.underuse_flag,
        reservation_at_risk: h.reservation_at_risk,
        reservation_unreachable: h.reservation_unreachable,
        in_flight_at_base: milli(h.in_flight_at_base_milli),
        reservation_depth_needed: h.reservation_depth_needed_milli.map(milli),
        entitlement: entitlement_out(&h.entitlement),
        burst: burst(&h.config.burst, h.burst.as_ref()),
    }
}

/// A burst's configuration and its credit now (the keys in alphabetical order, as the
/// JSON map it was built as had them).
#[derive(Debug, Serialize)]
struct BurstOut {
    bursting: bool,
    /// Ended periods in which it burst (monotonic).
    bursting_periods: u64,
    /// Seconds at the burst rate the credit left lasts.
    credit_seconds: f64,
    iops: Option<u64>,
    mibps: Option<u64>,
    /// How long a full bucket lasts at the burst rate.
    seconds: Option<u64>,
}

/// A burst's configuration and its credit now; `None` (`null`) without a burst.
fn burst(cfg: &Burst, now: Option<&BurstStats>) -> Option<BurstOut> {
    now.map(|b| BurstOut {
        bursting: b.bursting,
        bursting_periods: b.bursting_periods,
        credit_seconds: b.credit_seconds,
        iops: cfg.iops,
        mibps: cfg.mibps,
        seconds: cfg.seconds,
    })
}

/// One past period of a host in the full form (newest first).
#[derive(Debug, Serialize)]
struct PeriodOut {
    epoch: u64,
    ops: u64,
    bytes: u64,
    ios: u64,
    met: bool,
    backlogged: bool,
}

/// One host of the full form: the compact form's fields and its history, serialised
/// straight from the core's statistics like the compact form (building it as a
/// `Value` tree cost 111 ms of the app thread at a thousand hosts).
#[derive(Debug, Serialize)]
struct FullHost<'a> {
    #[serde(flatten)]
    common: CompactHost<'a>,
    /// Completed operations of the last periods, newest first.
    last_periods: Vec<u64>,
    periods: Vec<PeriodOut>,
    /// Null when the host was never backlogged in the kept history.
    reservation_met_fraction_backlogged: Option<f64>,
    soft_granted: Amt,
}

/// Host `h` of the full form, `hist` its history (oldest first), `n` past periods.
fn full_host<'a>(
    implicit: &BTreeSet<String>,
    h: &'a HostStats,
    hist: &[PeriodRecord],
    n: usize,
) -> FullHost<'a> {
    let periods = hist
        .iter()
        .rev()
        .take(n)
        .map(|p| PeriodOut {
            epoch: p.epoch,
            ops: p.completed.ops,
            bytes: p.completed.bytes,
            ios: p.completed_ios,
            met: p.met,
            backlogged: p.backlogged,
        })
        .collect();
    let (backlogged, met_backlogged) = hist
        .iter()
        .filter(|p| p.backlogged)
        .fold((0u64, 0u64), |(b, m), p| (b + 1, m + p.met as u64));
    FullHost {
        common: compact_host(implicit, h),
        last_periods: h.last_periods.iter().map(|a| a.ops).collect(),
        periods,
        reservation_met_fraction_backlogged: (backlogged > 0)
            .then(|| met_backlogged as f64 / backlogged as f64),
        soft_granted: amt(h.soft_granted),
    }
}

/// The hosts of a domain's answer, in the form asked for.
#[derive(Debug, Serialize)]
#[serde(untagged)]
enum Hosts<'a> {
    Compact(Vec<CompactHost<'a>>),
    Full(Vec<FullHost<'a>>),
}

/// One domain of `qos_stats_get`'s answer. Every part is a typed struct (no `json!`):
/// `rpc-scripts/schema/stats.json` is read off these types.
#[derive(Debug, Serialize)]
struct DomainOut<'a> {
    name: &'a str,
    epoch: u64,
    period_ns: u64,
    elapsed_ns: u64,
    capacity_estimate: Amt,
    capacity_learning: bool,
    reserved: Amt,
    global_available: Amt,
    bypass: bool,
    pool_paced: bool,
    sharing: ExcessSharing,
    operating_point: OperatingPointOut,
    held_time_bounds_ns: &'a [u64],
    hosts: Hosts<'a>,
    groups: Vec<GroupOut<'a>>,
    /// What the estimator did in the last periods (newest first), as many as
    /// asked; the full form only.
    #[serde(skip_serializing_if = "Option::is_none")]
    estimator_periods: Option<Vec<&'a EstimatorRecord>>,
}

/// Domain `name`'s answer from its statistics `s`, its hosts in the form asked for and
/// the estimator's records (the full form).
fn domain_out<'a>(
    name: &'a str,
    s: &'a DomainStats,
    hosts: Hosts<'a>,
    estimator_periods: Option<Vec<&'a EstimatorRecord>>,
) -> DomainOut<'a> {
    DomainOut {
        name,
        epoch: s.epoch,
        period_ns: s.period_ns,
        elapsed_ns: s.elapsed_ns,
        capacity_estimate: amt(s.budget),
        capacity_learning: s.capacity_learning,
        reserved: amt(s.reserved),
        global_available: amt(s.global_available),
        bypass: s.bypass,
        pool_paced: s.pool_paced,
        sharing: s.sharing,
        operating_point: operating_point(s),
        held_time_bounds_ns: &HELD_BUCKETS_NS,
        hosts,
        groups: s.groups.iter().map(group_out).collect(),
        estimator_periods,
    }
}

/// `held_time` of the counters form: the sum only.
#[derive(Debug, Serialize)]
struct HeldSum {
    sum_ns: u64,
}

/// One host of the counters form (`counters: true`): what the cluster agent reads of
/// it every interval, its monotonic counters and its total IOPS and MiB/s settings
/// (those of `qos_host_get`'s `min_iops`, `max_iops`, `weight`, `min_mibps` and
/// `max_mibps`; a setting it does not have is left out), under the names of the other
/// forms and of `qos_host_get`.
#[derive(Debug, Serialize)]
struct CounterHost<'a> {
    host_nqn: &'a str,
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

fn counter_host<'a>(implicit: &BTreeSet<String>, h: &'a HostStats) -> CounterHost<'a> {
    let (min, max) = (&h.config.reservation.total, &h.config.limit.total);
    CounterHost {
        host_nqn: &h.host_nqn,
        configured: !implicit.contains(&h.host_nqn),
        completed_total: Work {
            ops: h.completed_total.ops,
            bytes: h.completed_total.bytes,
            ios: h.completed_ios_total,
        },
        held_time: HeldSum {
            sum_ns: h.held_time.sum_ns,
        },
        min_iops: min.iops,
        max_iops: max.iops,
        min_mibps: min.mibps,
        max_mibps: max.mibps,
        weight: h.config.weight,
    }
}

/// One domain of the counters form: its period and capacity estimate, its hosts'
/// counters and settings.
#[derive(Debug, Serialize)]
struct CountersDomainOut<'a> {
    name: &'a str,
    epoch: u64,
    period_ns: u64,
    capacity_estimate: Amt,
    capacity_learning: bool,
    hosts: Vec<CounterHost<'a>>,
}

/// A domain's statistics in the shape asked for, serialised.
pub fn domain(name: &str, d: &Source<'_>, shape: Shape<'_>) -> String {
    let s = d.monitor.stats_of(d.now, shape.host_nqn);
    if shape.counters {
        let out = CountersDomainOut {
            name,
            epoch: s.epoch,
            period_ns: s.period_ns,
            capacity_estimate: amt(s.budget),
            capacity_learning: s.capacity_learning,
            hosts: s
                .hosts
                .iter()
                .map(|h| counter_host(d.implicit, h))
                .collect(),
        };
        return serde_json::to_string(&out).unwrap_or_else(|_| "null".into());
    }
    let implicit = d.implicit;
    let hosts = if shape.compact {
        Hosts::Compact(s.hosts.iter().map(|h| compact_host(implicit, h)).collect())
    } else if shape.host_nqn.is_some() {
        Hosts::Full(
            s.hosts
                .iter()
                .map(|h| {
                    let hist = d.monitor.history(&h.host_nqn).unwrap_or_default();
                    full_host(implicit, h, &hist, shape.periods)
                })
                .collect(),
        )
    } else {
        // Same order as the stats: no lookup per host.
        Hosts::Full(
            s.hosts
                .iter()
                .zip(d.monitor.histories())
                .map(|(h, (nqn, hist))| {
                    debug_assert_eq!(nqn, h.host_nqn);
                    full_host(implicit, h, &hist, shape.periods)
                })
                .collect(),
        )
    };
    let estimator_periods = (!shape.compact).then(|| {
        d.monitor
            .estimator_log()
            .rev()
            .take(shape.periods)
            .collect()
    });
    let out = domain_out(name, &s, hosts, estimator_periods);
    serde_json::to_string(&out).unwrap_or_else(|_| "null".into())
}

/// Thousandths as a number with three decimals.
fn milli(v: u64) -> f64 {
    v as f64 / 1000.0
}

/// Where the learned depth curve puts the operating point, and the curve itself:
/// operations (cost units) per second. The keys are in alphabetical order, as the JSON
/// map it was built as had them.
#[derive(Debug, Serialize)]
struct OperatingPointOut {
    /// `{"efficiency": milli}`, `{"in_flight": milli}` or `{"latency": ns}`.
    by: OperatingTarget,
    /// Over the hosts' circulation only: N, H\* and what is held now.
    #[serde(skip_serializing_if = "Option::is_none")]
    circulation: Option<CirculationOut>,
    depth_curve: Vec<CurvePointOut>,
    efficiency_milli: u64,
    /// The point; absent before the curve has a sample.
    #[serde(flatten)]
    point: Option<PointOut>,
}

/// The operating point on the curve (see [`OperatingPointOut`]).
#[derive(Debug, Serialize)]
struct PointOut {
    in_flight: f64,
    latency_ns: u64,
    max_ops_per_s: u64,
    ops_per_s: u64,
}

/// Over the hosts' circulation (issue 39): the commands the hosts circulate as far as
/// the target saw (N), what the hold targets keep held (H\*), what is held now.
#[derive(Debug, Serialize)]
struct CirculationOut {
    commands: u64,
    held: u64,
    hold_target: u64,
    /// Over circulation by η (`operating_over_circulation`): the learner of N\*.
    #[serde(skip_serializing_if = "Option::is_none")]
    learned: Option<LearnedOut>,
}

/// The learner of N\* ([`qos_core::circulation`]): N\* now (absent before its first
/// triplet: nothing held), the rate held at N\* against the rate holding nothing
/// (smoothed, and the last triplet's), and the triplets measured.
#[derive(Debug, Serialize)]
struct LearnedOut {
    #[serde(skip_serializing_if = "Option::is_none")]
    last_ratio: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    n_star: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    ratio: Option<f64>,
    triplets: u64,
}

/// One point of the depth curve.
#[derive(Debug, Serialize)]
struct CurvePointOut {
    in_flight: f64,
    ops_per_s: u64,
}

fn operating_point(s: &DomainStats) -> OperatingPointOut {
    OperatingPointOut {
        by: s.operating_target,
        circulation: s.circulation.map(|c| CirculationOut {
            commands: c.commands,
            held: c.held,
            hold_target: c.hold_target,
            learned: c.learned.map(|l| LearnedOut {
                last_ratio: l.last_ratio_milli.map(milli),
                n_star: l.n_star,
                ratio: l.ratio_milli.map(milli),
                triplets: l.triplets,
            }),
        }),
        depth_curve: s
            .depth_curve
            .iter()
            .map(|p| CurvePointOut {
                in_flight: milli(p.in_flight_milli),
                ops_per_s: p.rate,
            })
            .collect(),
        efficiency_milli: s.efficiency_milli,
        point: s.operating_point.map(|op| PointOut {
            in_flight: milli(op.in_flight_milli),
            latency_ns: op.latency.0,
            max_ops_per_s: op.max_rate,
            ops_per_s: op.rate,
        }),
    }
}

/// A tenant group (the keys in alphabetical order, as the JSON map it was built as had
/// them).
#[derive(Debug, Serialize)]
struct GroupOut<'a> {
    burst: Option<BurstOut>,
    completed_this_period: GroupAmt,
    given_this_period: GroupAmt,
    /// Its hosts' NQNs.
    hosts: &'a [String],
    limit_per_period: GroupAmt,
    max: &'a Rate,
    min: &'a Rate,
    name: &'a str,
    reservation_per_period: GroupAmt,
    weight: u32,
}

fn group_out(g: &GroupStats) -> GroupOut<'_> {
    GroupOut {
        burst: burst(&g.config.burst, g.burst.as_ref()),
        completed_this_period: group_amt(g.completed_this_period),
        given_this_period: group_amt(g.given_this_period),
        hosts: &g.hosts,
        limit_per_period: group_amt(g.limit_per_period),
        max: &g.config.limit,
        min: &g.config.reservation,
        name: &g.name,
        reservation_per_period: group_amt(g.reservation_per_period),
        weight: g.config.weight,
    }
}

/// What to put in the answer.
#[derive(Debug, Clone, Copy)]
pub struct Shape<'a> {
    /// Past periods per host (full form only).
    pub periods: usize,
    /// Counters and gauges only.
    pub compact: bool,
    /// Per host its counters and settings only (the cluster agent's form; over
    /// `compact`).
    pub counters: bool,
    /// One host only.
    pub host_nqn: Option<&'a str>,
}

#[cfg(test)]
#[path = "stats_tests.rs"]
mod tests;
