//! What the monitor tells about itself: the record of each ended period per host, the
//! history of the last periods, the estimator's decisions, and the statistics of the
//! stats RPC and the lab.

use std::collections::VecDeque;

use serde::Serialize;

use crate::admission::local_shortfall;
use crate::burst::{BurstBucket, BurstBudget};
use crate::config::{BudgetClass, DomainConfig, ExcessSharing, GroupConfig, HostConfig};
use crate::cost::{Amount, Resource};
use crate::depth::{CurvePoint, OperatingPoint};
use crate::entitlement::{Claimant, entitle};
use crate::estimator::{EstimateStep, Evidence};
use crate::sync::Ordering;
use crate::time::Nanos;

use super::Monitor;
use super::host::HostEntry;
use super::members::{GroupEntry, Members};
use super::outcome::{PeriodCounts, PeriodRecord};

/// How many past periods each host's history keeps for statistics.
pub const HISTORY_PERIODS: usize = 128;

/// Ended periods whose estimator decisions are kept ([`super::Monitor::estimator_log`]).
pub const ESTIMATOR_LOG_PERIODS: usize = 64;

/// What the capacity estimator saw and did at the end of one period (operations), so an
/// operator can see why the estimate moved.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct EstimatorRecord {
    pub epoch: u64,
    /// The estimate that sized the period.
    pub budget: u64,
    /// Work completed by all hosts.
    pub used: u64,
    /// `used` plus what the sharing policy had handed out and the hosts still held.
    pub offered: u64,
    pub evidence: Evidence,
    pub step: EstimateStep,
    /// The estimate for the next period (after the floor of the reservations).
    pub next: u64,
    /// The longest time between two runs of the monitor in the period (nanoseconds; a
    /// run late for the period's end counts for it). At the check interval normally;
    /// much longer when the target's thread was not scheduled (other work on its core,
    /// the hypervisor): time in which no host could be served, which a period's
    /// reservations do not make up for.
    pub longest_tick_gap_ns: u64,
}

/// What happened in a period that just ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PeriodReport {
    pub epoch: u64,
    pub start: Nanos,
    /// Capacity estimate that sized the period (Omega_t).
    pub budget: Amount,
    /// Work completed by all hosts.
    pub used: Amount,
    /// Estimate for the next period (Omega_t+1).
    pub next_budget: Amount,
    /// Per host, in the order of `host_nqns` (shared with the monitor's history).
    pub hosts: std::sync::Arc<Vec<PeriodRecord>>,
    /// The hosts' NQNs (shared between reports until the host set changes).
    pub host_nqns: std::sync::Arc<[String]>,
}

/// One ended period of every host: the records of its [`PeriodReport`], shared with
/// it. The history is kept per period rather than per host so that the roll-over
/// writes one contiguous array instead of a cold line in each host's ring (at 1024
/// hosts the per-host rings were nearly half of the roll-over's time).
#[derive(Debug)]
struct HistoryFrame {
    epoch: u64,
    nqns: std::sync::Arc<[String]>,
    records: std::sync::Arc<Vec<PeriodRecord>>,
}

/// The last [`HISTORY_PERIODS`] ended periods and the estimator's last
/// [`ESTIMATOR_LOG_PERIODS`] decisions, oldest first.
#[derive(Debug)]
pub(crate) struct Records {
    history: VecDeque<HistoryFrame>,
    estimator_log: VecDeque<EstimatorRecord>,
}

impl Records {
    pub(crate) fn new() -> Self {
        Records {
            history: VecDeque::with_capacity(HISTORY_PERIODS),
            estimator_log: VecDeque::with_capacity(ESTIMATOR_LOG_PERIODS),
        }
    }

    /// Keeps the records of an ended period.
    pub(crate) fn push_period(
        &mut self,
        epoch: u64,
        nqns: std::sync::Arc<[String]>,
        records: std::sync::Arc<Vec<PeriodRecord>>,
    ) {
        if self.history.len() == HISTORY_PERIODS {
            self.history.pop_front();
        }
        self.history.push_back(HistoryFrame {
            epoch,
            nqns,
            records,
        });
    }

    pub(crate) fn push_estimate(&mut self, rec: EstimatorRecord) {
        if self.estimator_log.len() == ESTIMATOR_LOG_PERIODS {
            self.estimator_log.pop_front();
        }
        self.estimator_log.push_back(rec);
    }

    pub(crate) fn estimator_log(&self) -> impl DoubleEndedIterator<Item = &EstimatorRecord> + '_ {
        self.estimator_log.iter()
    }

    /// The records of host `h`, at index `i` of the host list, oldest first.
    pub(crate) fn of<'a>(
        &'a self,
        i: usize,
        h: &'a HostEntry,
    ) -> impl DoubleEndedIterator<Item = &'a PeriodRecord> + Clone + 'a {
        let nqn = h.cfg.host_nqn.as_str();
        let since = h.since_epoch;
        self.history
            .iter()
            .filter(move |f| f.epoch >= since)
            .filter_map(move |f| {
                // The host set rarely changes: the host is usually at the same index.
                let at = if f.nqns.get(i).is_some_and(|n| n == nqn) {
                    i
                } else {
                    f.nqns.iter().position(|n| n == nqn)?
                };
                f.records.get(at)
            })
    }
}

/// Statistics of a domain.
#[derive(Debug, Clone, Serialize)]
pub struct DomainStats {
    pub epoch: u64,
    pub period_ns: u64,
    pub elapsed_ns: u64,
    /// Capacity estimate for this period (tokens per period).
    pub budget: Amount,
    /// No capacity was given and no period with load has been seen yet: the budget is
    /// unbounded (see [`crate::config::Capacity::iops`]).
    pub capacity_learning: bool,
    /// The hard reservations admitted, hosts' and groups' (per period): above `budget`
    /// they do not fit the target as estimated (admission checked them against the
    /// capacity given, or not at all while the capacity was being learned).
    pub reserved: Amount,
    pub global_available: Amount,
    /// The domain holds nothing (`DomainConfig::bypass`).
    pub bypass: bool,
    /// First come paces its global pool for a reservation that is behind (operations),
    /// instead of leaving it open.
    pub pool_paced: bool,
    pub sharing: ExcessSharing,
    /// The operating point's efficiency η (thousandths) and where it lies on the depth
    /// curve learned so far (none before the curve has a sample), in operations (cost
    /// units) per second.
    pub efficiency_milli: u64,
    /// What placed the operating point: η, or the Q\* or L\* the domain gives instead.
    pub operating_target: crate::depth::OperatingTarget,
    pub operating_point: Option<OperatingPoint>,
    /// Over the hosts' circulation (issue 39), what the hold targets act on now; `None`
    /// in the other modes.
    pub circulation: Option<CirculationStats>,
    /// The depth curve: commands in flight and operations per second there.
    pub depth_curve: Vec<CurvePoint>,
    pub hosts: Vec<HostStats>,
    pub groups: Vec<GroupStats>,
}

/// Over the hosts' circulation: the commands the hosts circulate as far as the target
/// saw (N, each host's `at_target_peak` this period or the last), what the hold targets
/// keep held (H\* = Σ h_i = Σ (N_i - n_i\*)), and what is held now (any reason).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct CirculationStats {
    pub commands: u64,
    pub hold_target: u64,
    pub held: u64,
    /// Over circulation by η: the learner of N\* ([`crate::circulation`]).
    pub learned: Option<crate::circulation::ProbeReport>,
}

/// Statistics of one tenant group.
#[derive(Debug, Clone, Serialize)]
pub struct GroupStats {
    pub name: String,
    pub config: GroupConfig,
    /// Its hosts' NQNs.
    pub hosts: Vec<String>,
    pub completed_this_period: Amount,
    pub reservation_per_period: Amount,
    /// `u64::MAX` per resource where no limit is set.
    pub limit_per_period: Amount,
    /// Given to its hosts this period beyond their own reservations (its surplus
    /// reservation and its share of the excess).
    pub given_this_period: Amount,
    /// Its burst (issue 28); `None` without one.
    pub burst: Option<BurstStats>,
}

/// A host's or group's burst credit now (issue 28).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct BurstStats {
    /// Seconds at the burst rate the credit left lasts (the least over the resources
    /// with a burst); from 0 to the bucket's seconds.
    pub credit_seconds: f64,
    /// Credit left, in cost units.
    pub credit: Amount,
    /// Its limit is at its burst rate now.
    pub bursting: bool,
    /// Ended periods in which it burst (monotonic).
    pub bursting_periods: u64,
}

impl BurstStats {
    fn of(bucket: &BurstBucket, b: &BurstBudget, period: Nanos) -> Option<Self> {
        Some(BurstStats {
            credit_seconds: bucket.credit_seconds(b)?,
            credit: bucket.credit(period),
            bursting: bucket.bursting(),
            bursting_periods: bucket.bursting_periods(),
        })
    }
}

/// Statistics of one host.
#[derive(Debug, Clone, Serialize)]
pub struct HostStats {
    pub host_nqn: String,
    pub config: HostConfig,
    pub completed_this_period: Amount,
    pub completed_ios_this_period: u64,
    /// Completed work of the last periods, newest first (up to 16).
    pub last_periods: Vec<Amount>,
    /// Fraction of the kept history in which the reservation was met.
    pub reservation_met_fraction: f64,
    pub reservation_per_period: Amount,
    pub soft_granted: Amount,
    pub reservation_tokens: Amount,
    pub credit_tokens: Amount,
    pub limit_left: Amount,
    pub held_now: i64,
    pub underuse_flag: bool,
    /// The local constraint fails now: the residual reservation cannot be served at
    /// the per-host maximum rate in the time left.
    pub reservation_at_risk: bool,
    /// Work completed since the host was added (cost units; monotonic).
    pub completed_total: Amount,
    /// Commands completed since the host was added (monotonic).
    pub completed_ios_total: u64,
    /// Commands admitted with tokens since the host was added (monotonic). Once the
    /// host is quiet, it equals `completed_ios_total`: every admitted command completed
    /// exactly once.
    pub admitted_ios_total: u64,
    /// Work admitted and not completed yet (tokens consumed minus work completed, cost
    /// units): 0 once the host is quiet, or the token books do not balance.
    pub in_flight: Amount,
    /// Admission attempts that found no tokens or no limit allowance (monotonic; a
    /// held command counts once per attempt).
    pub hold_events_total: u64,
    /// Commands that entered a hold queue, by the rule that held them, and those a
    /// bypass let through (monotonic).
    pub holds: crate::ledger::HoldCounts,
    /// Time its commands spent held, as a histogram (monotonic).
    pub held_time: crate::histogram::HeldTimeSnapshot,
    /// Ended periods by outcome (monotonic).
    pub period_counts: PeriodCounts,
    pub group: Option<String>,
    /// Global tokens given to it this period by the sharing policy.
    pub excess_granted: Amount,
    /// Closing the excess to the others did not bring its reservation within reach
    /// (its queue depth cannot carry it at this target's latency): its lag no longer
    /// holds the others back; retried after a back-off of 2 to 16 periods.
    pub reservation_unreachable: bool,
    /// Its commands in flight at the base bdev, on average over the period so far
    /// (thousandths; Little's law over the time they spent there).
    pub in_flight_at_base_milli: u64,
    /// Commands it needs in flight at the base to complete its reservation at the
    /// operating point (reservation rate x L*, thousandths); none before the depth
    /// curve has a sample, or without a reservation. A host that keeps fewer cannot
    /// reach its reservation at this target's latency, whatever QoS does.
    pub reservation_depth_needed_milli: Option<u64>,
    /// Its burst (issue 28); `None` without one.
    pub burst: Option<BurstStats>,
    /// What it is entitled to at the operating point, over the last ended period;
    /// none before the depth curve has a sample or a period has ended.
    pub entitlement: Option<Entitlement>,
}

/// A host's entitlement at the operating point (issue 26), over the last ended period.
/// Rates are operations (cost units) per second.
///
/// Entitlements split C\* (the operating point's rate) by
/// [`crate::entitlement::entitle`]: reservations first, the rest by weight, each host
/// capped at its limit and at what it can take. A contending host (QoS held its
/// commands in at least half of the period's check intervals) can take what its
/// commands at the target give at the operating point's latency (`N / L*`, Little's
/// law); a self-limited host takes what it took. Tenant groups nest: a group is one
/// claimant at the domain's level (its reservation, limit and weight, capped at what
/// its hosts can take), its entitlement split among its hosts the same way.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Entitlement {
    /// QoS held its commands in at least half of the period: it gets its entitlement;
    /// a self-limited host is never held back by QoS.
    pub contending: bool,
    /// Check intervals with commands held, in thousandths of the period's.
    pub held_fraction_milli: u64,
    /// Commands it had at the target on average (held and at the base), thousandths.
    pub at_target_milli: u64,
    /// The most commands it had at the target at one check interval (held and at the
    /// base): a lower bound of its queue depth, its circulation as far as the target
    /// sees it. Reached when all its commands waited here at once; on NVMe/TCP most
    /// of an unheld host's commands are in the transport, which the QoS bdev does not see.
    pub at_target_peak: u64,
    /// The most it can take (`u64::MAX`: no bound).
    pub cap: u64,
    /// e_i.
    pub entitled: u64,
    /// What it completed.
    pub achieved: u64,
    /// `entitled - achieved` where it got less.
    pub shortfall: u64,
    /// Commands it needs at the target to get its entitlement at the operating point
    /// (e_i x L\*, thousandths): "keep at least this many outstanding".
    pub queue_depth_needed_milli: u64,
}

impl HostStats {
    /// Host `h`'s statistics `elapsed` into the period; `records` are its history.
    pub(crate) fn of<'a>(
        h: &HostEntry,
        records: impl DoubleEndedIterator<Item = &'a PeriodRecord> + Clone,
        cfg: &DomainConfig,
        (elapsed, op): (Nanos, Option<&OperatingPoint>),
        entitlement: Option<Entitlement>,
    ) -> Self {
        let c = h.shared.counters();
        let start = &h.outcomes.at_start;
        let at_base = c.service_ns.wrapping_sub(start.service_ns) as u128 * 1000;
        let reserved_per_s =
            h.budgets.reservation_total().ops as u128 * 1_000_000_000 / cfg.period.0.max(1) as u128;
        let needed = op
            .filter(|_| reserved_per_s > 0)
            .map(|op| (reserved_per_s * op.latency.0 as u128 / 1_000_000) as u64);
        let res_left = h.shared.reservation_available();
        let (met, n) = records
            .clone()
            .fold((0usize, 0usize), |(m, n), r| (m + r.met as usize, n + 1));
        HostStats {
            host_nqn: h.cfg.host_nqn.clone(),
            config: h.cfg.clone(),
            completed_this_period: c.completed.saturating_sub(start.completed),
            completed_ios_this_period: c.completed_ios - start.completed_ios,
            last_periods: records.rev().take(16).map(|r| r.completed).collect(),
            reservation_met_fraction: if n == 0 { 1.0 } else { met as f64 / n as f64 },
            reservation_per_period: h.budgets.reservation_total(),
            soft_granted: h.period.soft_granted,
            reservation_tokens: res_left,
            credit_tokens: h.shared.credit_available(),
            limit_left: h.shared.limit_available(BudgetClass::Total),
            held_now: c.held_now as i64,
            underuse_flag: h.outcomes.underuse.flagged(cfg.estimator.underuse_periods),
            reservation_at_risk: Resource::ALL
                .iter()
                .any(|&r| local_shortfall(cfg, res_left.get(r), r, elapsed) > 0),
            completed_total: c.completed,
            completed_ios_total: c.completed_ios,
            admitted_ios_total: c.admitted_ios,
            in_flight: c.in_flight(),
            hold_events_total: c.held_events,
            holds: h.shared.counters.holds(),
            held_time: h.shared.held_time(),
            period_counts: h.outcomes.counts,
            group: h.cfg.group.clone(),
            excess_granted: h.share.excess_granted,
            reservation_unreachable: h.reach.periods > 0,
            in_flight_at_base_milli: (at_base / elapsed.0.max(1) as u128) as u64,
            reservation_depth_needed_milli: needed,
            entitlement,
            burst: BurstStats::of(&h.burst, &h.budgets.burst, cfg.period),
        }
    }
}

/// Operations per period as a rate per second.
fn per_second(ops_per_period: u64, period: Nanos) -> u64 {
    if ops_per_period == u64::MAX {
        return u64::MAX;
    }
    (ops_per_period as u128 * 1_000_000_000 / period.0.max(1) as u128).min(u64::MAX as u128) as u64
}

/// One host's claim on the operating point's capacity (its weight, reservation and
/// cap: its limit, and while it contends what its commands at the target can carry at
/// the pipeline's latency, else what it achieved) and its report so far, from its last
/// ended period.
/// Over the hosts' circulation (`circulation`), what a contending host can carry is
/// what it circulates (`HostEntry::circulation_seen`) at the circulating pipeline's
/// latency, not what it had at the target.
fn host_claim(
    h: &HostEntry,
    latency: u128,
    period: Nanos,
    circulation: bool,
) -> (Claimant, Entitlement) {
    let w = &h.window;
    let ticks = w.ticks.max(1) as u128;
    let at_base = w.service_ns as u128 * 1000 / period.0.max(1) as u128;
    let at_target = at_base + w.held_sum as u128 * 1000 / ticks;
    let achieved = per_second(w.completed_ops, period);
    // The limit in effect: the burst rate while the host bursts.
    let limit = per_second(h.limit()[BudgetClass::Total as usize].ops, period);
    let cap = if w.contending() {
        let carried = if circulation {
            h.circulation_seen() as u128 * 1000
        } else {
            at_target
        };
        let by_depth = carried * 1_000_000 / latency;
        limit.min(by_depth.min(u64::MAX as u128) as u64)
    } else {
        achieved
    };
    let claim = Claimant {
        weight: h.budgets.weight as u64,
        reservation: per_second(h.budgets.reservation_total().ops, period),
        cap,
    };
    let report = Entitlement {
        contending: w.contending(),
        held_fraction_milli: w.held_ticks as u64 * 1000 / ticks as u64,
        at_target_milli: at_target.min(u64::MAX as u128) as u64,
        at_target_peak: w.at_target_peak,
        cap,
        entitled: 0,
        achieved,
        shortfall: 0,
        queue_depth_needed_milli: 0,
    };
    (claim, report)
}

/// Every host's [`Entitlement`] at `op` (in the order of `m.hosts`), from the last
/// ended period of each; none before a period has ended. `flat`: the curve shows the
/// target saturated ([`crate::depth::saturated`]), so C\* is what the target can do;
/// before that it is only what the
/// load so far has shown, and the entitlements are not bounded by it (each claimant is
/// entitled to its cap: no contention for the target is known).
fn entitlements(
    m: &Members,
    op: &OperatingPoint,
    (flat, circulation): (bool, bool),
    period: Nanos,
) -> Vec<Option<Entitlement>> {
    let latency = op.latency.0.max(1) as u128;
    let reports: Vec<(Claimant, Entitlement)> = m
        .hosts
        .iter()
        .map(|h| host_claim(h, latency, period, circulation))
        .collect();
    // The domain's claimants: hosts without a group, then the groups (each capped at
    // what its hosts can take together).
    let mut lone: Vec<usize> = Vec::new();
    let mut members: Vec<Vec<usize>> = vec![Vec::new(); m.groups.len()];
    for (i, h) in m.hosts.iter().enumerate() {
        match h.group {
            Some(g) => members[g].push(i),
            None => lone.push(i),
        }
    }
    let mut top: Vec<Claimant> = lone.iter().map(|&i| reports[i].0).collect();
    for (ge, hosts) in m.groups.iter().zip(&members) {
        let hosts_cap: u128 = hosts.iter().map(|&i| reports[i].0.cap as u128).sum();
        let limit = per_second(ge.budgets.limit.ops, period);
        top.push(Claimant {
            weight: ge.budgets.weight as u64,
            reservation: per_second(ge.budgets.reservation.ops, period),
            cap: limit.min(hosts_cap.min(u64::MAX as u128) as u64),
        });
    }
    let mut top_out = vec![0; top.len()];
    entitle(if flat { op.rate } else { u64::MAX }, &top, &mut top_out);
    let mut entitled = vec![0u64; m.hosts.len()];
    for (&i, &e) in lone.iter().zip(&top_out) {
        entitled[i] = e;
    }
    for (hosts, &pot) in members.iter().zip(&top_out[lone.len()..]) {
        let claims: Vec<Claimant> = hosts.iter().map(|&i| reports[i].0).collect();
        let mut out = vec![0; claims.len()];
        entitle(pot, &claims, &mut out);
        for (&i, e) in hosts.iter().zip(out) {
            entitled[i] = e;
        }
    }
    reports
        .into_iter()
        .zip(&m.hosts)
        .zip(entitled)
        .map(|(((_, mut r), h), e)| {
            if h.window.ticks == 0 {
                return None;
            }
            r.entitled = e;
            r.shortfall = e.saturating_sub(r.achieved);
            r.queue_depth_needed_milli =
                (e as u128 * latency / 1_000_000).min(u64::MAX as u128) as u64;
            Some(r)
        })
        .collect()
}

impl GroupStats {
    /// Group `g`'s statistics; `hosts` are all the domain's hosts.
    pub(crate) fn of(g: usize, ge: &GroupEntry, hosts: &[HostEntry], period: Nanos) -> Self {
        let members: Vec<&HostEntry> = hosts.iter().filter(|h| h.group == Some(g)).collect();
        GroupStats {
            name: ge.cfg.name.clone(),
            config: ge.cfg.clone(),
            hosts: members.iter().map(|h| h.cfg.host_nqn.clone()).collect(),
            completed_this_period: members.iter().fold(Amount::ZERO, |a, h| {
                let c = h.shared.counters();
                a.saturating_add(c.completed.saturating_sub(h.outcomes.at_start.completed))
            }),
            reservation_per_period: ge.budgets.reservation,
            limit_per_period: ge.budgets.limit,
            given_this_period: Amount::new(ge.given[0], ge.given[1]),
            burst: BurstStats::of(&ge.burst, &ge.budgets.burst, period),
        }
    }
}

impl Monitor {
    /// Statistics for the stats RPC and the lab.
    pub fn stats(&self, now: Nanos) -> DomainStats {
        self.stats_of(now, None)
    }

    /// Statistics with only host `only` (all hosts with `None`; none when it is not
    /// configured here), so a scraper asking for one host costs one host.
    pub fn stats_of(&self, now: Nanos, only: Option<&str>) -> DomainStats {
        let elapsed = now.saturating_sub(self.period_start).min(self.cfg.period);
        let m = &self.members;
        let curve = self.depth.curve(now);
        let circulation = self.circulation_point(&curve);
        let circulating = self.circulation_point_on().then(|| {
            m.hosts.iter().fold(
                CirculationStats {
                    commands: 0,
                    hold_target: 0,
                    held: 0,
                    learned: self.policy.circulation_probe(),
                },
                |c, h| {
                    let w = &h.shared.window;
                    CirculationStats {
                        learned: c.learned,
                        commands: c.commands + h.circulation_seen(),
                        // u64::MAX during a census: count what is held.
                        hold_target: c.hold_target + w.hold_target().min(h.circulation_seen()),
                        held: c.held + w.held(),
                    }
                },
            )
        });
        let op =
            circulation.or_else(|| self.depth.operating_point(now, self.cfg.operating_target()));
        let entitled = op.as_ref().map(|op| {
            // Over circulation the target ran at N* all period: C* is what it did.
            let flat = circulation.is_some() || crate::depth::saturated(&curve, op);
            entitlements(m, op, (flat, circulation.is_some()), self.cfg.period)
        });
        let hosts = m
            .hosts
            .iter()
            .enumerate()
            .filter(|(_, h)| only.is_none_or(|n| n == h.cfg.host_nqn))
            .map(|(i, h)| {
                let at = (elapsed, op.as_ref());
                let e = entitled.as_ref().and_then(|e| e[i]);
                HostStats::of(h, self.records.of(i, h), &self.cfg, at, e)
            })
            .collect();
        let groups = m
            .groups
            .iter()
            .enumerate()
            .map(|(g, ge)| GroupStats::of(g, ge, &m.hosts, self.cfg.period))
            .collect();
        DomainStats {
            epoch: self.epoch,
            period_ns: self.cfg.period.0,
            elapsed_ns: elapsed.0,
            budget: self.budget,
            capacity_learning: self.estimators[0].is_learning(),
            reserved: m
                .hosts
                .iter()
                .map(|h| h.budgets.reservation_total())
                .chain(m.groups.iter().map(|g| g.surplus))
                .fold(Amount::ZERO, Amount::saturating_add),
            global_available: self.shared.global_available(),
            bypass: self.cfg.bypass,
            pool_paced: self.shared.pool_paced.load(Ordering::Relaxed) & 1 != 0,
            sharing: self.cfg.sharing,
            efficiency_milli: self.cfg.efficiency_milli,
            operating_target: self.cfg.operating_target(),
            operating_point: op,
            circulation: circulating,
            depth_curve: curve,
            hosts,
            groups,
        }
    }

    /// Over the hosts' circulation (`operating_point` with `operating_in_flight`,
    /// issue 39): the operating point the hosts ran at in the last ended period, N\*
    /// commands circulating at C\* = what the target completed then, L\* = N\* / C\*
    /// (Little's law). `None` in the other modes, and before a period with work ended.
    fn circulation_point(&self, curve: &[CurvePoint]) -> Option<OperatingPoint> {
        if !self.circulation_point_on() {
            return None;
        }
        let n_star = match self.cfg.operating_target() {
            crate::depth::OperatingTarget::InFlight(n_star) => n_star,
            // Learned: N* now, or what the hosts circulate before it is.
            _ => {
                let learned = self.policy.circulation_probe().and_then(|p| p.n_star);
                learned.unwrap_or_else(|| {
                    self.members
                        .hosts
                        .iter()
                        .map(|h| h.circulation_seen())
                        .sum()
                }) * 1000
            }
        };
        let done: u64 = self
            .members
            .hosts
            .iter()
            .map(|h| h.window.completed_ops)
            .sum();
        let rate = per_second(done, self.cfg.period);
        if rate == 0 {
            return None;
        }
        Some(OperatingPoint {
            in_flight_milli: n_star,
            rate,
            max_rate: curve.last().map_or(rate, |p| p.rate.max(rate)),
            latency: Nanos((n_star as u128 * 1_000_000 / rate as u128) as u64),
        })
    }

    /// The domain's operating point is over the hosts' circulation.
    fn circulation_point_on(&self) -> bool {
        self.cfg.sharing == ExcessSharing::OperatingPoint
            && matches!(
                self.cfg.operating_target(),
                crate::depth::OperatingTarget::InFlight(_)
                    | crate::depth::OperatingTarget::Circulation(_)
            )
    }

    /// History of `nqn`'s past periods, oldest first.
    pub fn history(&self, nqn: &str) -> Option<Vec<PeriodRecord>> {
        let i = self.members.find(nqn)?;
        Some(
            self.records
                .of(i, &self.members.hosts[i])
                .copied()
                .collect(),
        )
    }

    /// Every host's history of past periods (oldest first), in the order of
    /// [`Monitor::stats`]'s hosts.
    pub fn histories(&self) -> impl Iterator<Item = (&str, Vec<PeriodRecord>)> {
        let hosts = self.members.hosts.iter().enumerate();
        hosts.map(|(i, h)| {
            (
                h.cfg.host_nqn.as_str(),
                self.records.of(i, h).copied().collect(),
            )
        })
    }

    /// The estimator's decisions for operations in the last periods, oldest first.
    pub fn estimator_log(&self) -> impl DoubleEndedIterator<Item = &EstimatorRecord> + '_ {
        self.records.estimator_log()
    }
}
