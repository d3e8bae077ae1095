//! What the monitor learns of the target: the depth curve's samples (commands in flight
//! against work served), where an ended period lies on the curve it started with, and
//! the capacity estimators fed with each period (Haechi's Algorithm 1 with the
//! project's evidence rules).

use super::Monitor;
use super::sharing::SharingPolicy;
use crate::config::DomainConfig;
use crate::cost::{Amount, Resource};
use crate::depth::DepthCurve;
use crate::estimator::{CapacityEstimator, EstimateStep, Evidence};
use crate::monitor::EstimatorRecord;
use crate::sync::POOL_MAX;
use crate::time::Nanos;

impl Monitor {
    /// Feeds the depth curve with the interval since the last sample: `work` the hosts
    /// completed and the time `service` it spent at the base (taken in the check
    /// interval's or the roll-over's pass over the hosts).
    pub(super) fn learn_depth(&mut self, now: Nanos, work: u64, service: u64) {
        let dt = now.saturating_sub(self.depth_at);
        self.depth_at = now;
        if self.depth.observe(now, dt, work, Nanos(service)) {
            let target = self.cfg.operating_target();
            self.policy
                .depth_learned(&mut self.depth, now, target, &self.shared);
        }
    }

    /// Whether the depth curve's next sample is due (they are gathered over
    /// [`crate::depth::MIN_WINDOW`] anyway: reading the counters for it at every check
    /// interval cost the interval 4 % at 256 hosts).
    pub(super) fn depth_due(&self, now: Nanos) -> bool {
        now.saturating_sub(self.depth_at) >= crate::depth::MIN_WINDOW
    }

    /// The depth curve's sample when no other pass reads the hosts' counters.
    pub(super) fn learn_depth_alone(&mut self, now: Nanos) {
        if !self.depth_due(now) {
            return;
        }
        let (mut work, mut service) = (0u64, 0u64);
        for h in &mut self.members.hosts {
            let (w, s) = h
                .activity
                .depth_sample(h.shared.completed_work_and_service());
            work = work.saturating_add(w);
            service = service.saturating_add(s);
        }
        self.learn_depth(now, work, service);
    }

    /// The depth curve learned so far.
    pub fn depth_curve(&self) -> &DepthCurve {
        &self.depth
    }

    /// Where the period ending at `end`, which completed `work` (operations, cost
    /// units) with `service_ns` spent at the base, lies on the depth curve as it was
    /// when the period started (see [`PeriodDepth`]).
    pub(super) fn period_depth(&self, end: Nanos, work: u64, service_ns: u64) -> PeriodDepth {
        let len = end.saturating_sub(self.period_start).0.max(1) as u128;
        let q_milli = (service_ns as u128 * 1000 / len) as u64;
        let rate = (work as u128 * 1_000_000_000 / len) as u64;
        match crate::depth::on_curve(&self.period_curve, q_milli, rate) {
            None => PeriodDepth::Unknown,
            Some(false) => PeriodDepth::BelowCurve,
            Some(true) => {
                let q_star =
                    crate::depth::operating_depth(&self.period_curve, self.cfg.operating_target());
                if q_star.is_some_and(|q| q_milli >= q) {
                    PeriodDepth::AtOperatingPoint
                } else {
                    PeriodDepth::OnCurve
                }
            }
        }
    }

    /// Feeds the ended period to the capacity estimators: `used` was completed,
    /// `offered_unused` handed out and left, `missed` per resource some active host
    /// missed its reservation, `evidence` what the period showed, `partial` whether
    /// a host started or stopped in it, and `limit_bound` whether some host's limit
    /// held its commands. Returns whether an estimate dropped.
    pub(super) fn estimate(
        &mut self,
        used: Amount,
        offered_unused: Amount,
        missed: [bool; 2],
        evidence: [Evidence; 2],
        (partial, limit_bound): (bool, bool),
    ) -> bool {
        let budget = self.budget;
        let mut dropped = false;
        for r in Resource::ALL {
            let i = r.index();
            let evidence = evidence[i];
            // What a policy handed out and the hosts still held when the period ended
            // was offered and not refused by the target: it counts as used.
            let offered = used
                .get(r)
                .saturating_add(offered_unused.get(r))
                .min(budget.get(r));
            // A capacity still to be learned is not learned from a period in which a
            // host started or stopped: the load was not there all period.
            // A period whose demand some host's limit capped (and that starved no
            // reservation) measured the contract, not the target: ignored, so limits
            // are never taken for capacity (admission would then refuse reservations
            // the target can carry).
            let limit_bound = limit_bound && evidence != Evidence::ReservationsStarved;
            let step = if (partial && self.estimators[i].is_learning()) || limit_bound {
                EstimateStep::Ignored
            } else {
                self.estimators[i].observe_served(offered, used.get(r), missed[i], evidence)
            };
            dropped |= step == EstimateStep::Dropped;
            let reserved = self
                .members
                .hosts
                .iter()
                .map(|h| h.budgets.reservation_total().get(r))
                .chain(self.members.groups.iter().map(|g| g.surplus.get(r)))
                .fold(0u64, u64::saturating_add);
            self.estimators[i].hold_at_least(reserved);
            if r == Resource::Ops {
                self.records.push_estimate(EstimatorRecord {
                    epoch: self.epoch,
                    budget: budget.ops,
                    used: used.ops,
                    offered,
                    evidence,
                    step,
                    next: self.estimators[i].current(),
                    longest_tick_gap_ns: self.longest_tick_gap.0,
                });
            }
        }
        dropped
    }
}

/// Where a period lies on the depth curve learned before it: what its shortfall, if
/// any, says about the target's capacity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum PeriodDepth {
    /// The curve does not reach down to the period's depth: nothing.
    Unknown,
    /// It served less than the curve says the target does at its depth: the target got
    /// slower (a busy CPU, a slower base).
    BelowCurve,
    /// On the curve, below the operating point's depth: what it served was bounded by
    /// the commands in flight (a reservation it missed was missed for lack of depth:
    /// the pool closed for a lagging host keeps commands from the base, and the target
    /// runs slower with fewer), not by the target.
    OnCurve,
    /// On the curve at or beyond the operating point's depth: the target was
    /// saturated, what it served is its capacity.
    AtOperatingPoint,
}

/// The estimators of a domain, as its sharing policy wants them (weighted sharing's
/// doubling probes); both keep Haechi's Algorithm 1 with the probe back-off, the
/// "reservations starved" evidence and the sudden-drop rule.
pub(super) fn make_estimators(
    cfg: &DomainConfig,
    policy: &dyn SharingPolicy,
) -> [CapacityEstimator; 2] {
    let cap = cfg.capacity_per_period();
    let ops = if cfg.capacity.iops.is_some() {
        CapacityEstimator::new(
            &cfg.estimator,
            cap.ops,
            cfg.per_period(cfg.capacity.iops_stddev),
        )
    } else {
        CapacityEstimator::learning(&cfg.estimator, POOL_MAX)
    };
    let bytes = CapacityEstimator::new(
        &crate::config::EstimatorConfig {
            enabled: cfg.estimator.enabled && cfg.capacity.mibps.is_some(),
            ..cfg.estimator
        },
        if cap.bytes == u64::MAX {
            POOL_MAX
        } else {
            cap.bytes
        },
        cfg.per_period(cfg.capacity.mibps_stddev.saturating_mul(crate::config::MIB)),
    );
    [policy.estimator(ops), policy.estimator(bytes)]
}

impl PeriodDepth {
    pub(super) fn at_operating_point(self) -> bool {
        self == PeriodDepth::AtOperatingPoint
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{ExcessSharing, ReservationRelease, test_domain};
    use crate::depth::CurvePoint;

    /// A monitor whose period started at 0 and whose depth curve, as the period began,
    /// was `curve` (commands in flight, operations per second).
    fn judged_on(curve: &[(u64, u64)]) -> Monitor {
        let cfg = test_domain(
            1_000_000,
            ReservationRelease::Paced,
            ExcessSharing::FirstCome,
        );
        let mut m = Monitor::new(cfg, Nanos::ZERO).unwrap();
        m.period_curve = curve
            .iter()
            .map(|&(q, rate)| CurvePoint {
                in_flight_milli: q * 1000,
                rate,
            })
            .collect();
        m
    }

    /// Where a 1 s period with `q` commands in flight on average that completed `rate`
    /// operations lies.
    fn period(m: &Monitor, q: u64, rate: u64) -> PeriodDepth {
        let len = Nanos::from_secs(1);
        m.period_depth(m.period_start.saturating_add(len), rate, q * len.0)
    }

    #[test]
    fn a_period_is_placed_on_the_curve_it_started_with() {
        // T(1) = 100 K, T(2) = 180 K, T(4) = 196 K, T(8) = 200 K: η 0.97 -> Q* = 4.
        let m = judged_on(&[(1, 100_000), (2, 180_000), (4, 196_000), (8, 200_000)]);
        // Fewer commands in flight, the rate the curve gives there: a shortfall of depth.
        assert_eq!(period(&m, 2, 175_000), PeriodDepth::OnCurve);
        // At the operating point's depth or deeper and on the curve: saturated.
        assert_eq!(period(&m, 4, 195_000), PeriodDepth::AtOperatingPoint);
        assert_eq!(period(&m, 30, 200_000), PeriodDepth::AtOperatingPoint);
        // As deep, a fifth slower: the target got slower (a drop).
        assert_eq!(period(&m, 8, 160_000), PeriodDepth::BelowCurve);
        assert_eq!(period(&m, 2, 150_000), PeriodDepth::BelowCurve);
        // Shallower than anything the curve knows: no judgement.
        assert_eq!(period(&m, 0, 1_000), PeriodDepth::Unknown);
        // No curve yet: no judgement either.
        assert_eq!(period(&judged_on(&[]), 4, 195_000), PeriodDepth::Unknown);
    }
}
