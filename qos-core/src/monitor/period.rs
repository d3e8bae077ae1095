//! A period's end and the next one's start: the hosts' period totals, the estimators fed
//! and the reachable reservations confirmed (the roll-over), then fresh reservation,
//! limit and global pools armed (some ahead during the period, so the roll-over at a
//! thousand hosts only publishes the new epoch) and soft grants made.

use super::capacity::PeriodDepth;
use super::host::{PeriodTotals, PeriodView};
use super::{ARM_AHEAD_PER_TICK, Monitor, PeriodReport, soft};
use crate::config::ReservationRelease;
use crate::cost::{Amount, RES, Resource};
use crate::estimator::Evidence;
use crate::ledger::clamp_pool;
use crate::sync::{Arc, Ordering, POOL_MAX};
use crate::time::Nanos;

impl Monitor {
    /// Ends the current period at `start` (the new period's start) and arms the next.
    pub(super) fn roll_over_at(&mut self, start: Nanos) -> PeriodReport {
        let view = PeriodView {
            epoch: self.epoch,
            start,
            idle_after: self.idle_after(),
            period_ticks: self.period_ticks,
            count_offered: self.policy.counts_unused_as_offered(),
        };
        let mut t = PeriodTotals::default();
        let mut hosts = Vec::with_capacity(self.members.hosts.len());
        let mut in_vain = Vec::new();
        for (idx, h) in self.members.hosts.iter_mut().enumerate() {
            if let Some(v) = h.close_period(&view, &mut t, &mut hosts) {
                in_vain.push((idx, v));
            }
        }
        self.learn_depth(start, t.depth.0, t.depth.1);
        let (used, starved, partial) = (t.used, t.starved, t.partial);
        let report_budget = self.budget;
        // A reservation missed by a host that kept commands coming, in a period in which
        // some backlogged host lagged behind its schedule: the target served less than
        // it was asked, so what it served is its capacity now. Else what the policy saw
        // of demand; nothing when a host started or stopped in the period.
        let depth = self.period_depth(start, used.ops, t.service_ns);
        // The depth curve is of operations: it speaks for that resource only.
        let ops = Resource::Ops.index();
        let evidence: [Evidence; 2] = std::array::from_fn(|r| {
            let by_policy = self.policy.demand_evidence(r);
            if partial {
                Evidence::None
            } else if starved[r] && r == ops && depth == PeriodDepth::OnCurve {
                Evidence::DepthBound
            } else if starved[r] {
                Evidence::ReservationsStarved
            } else if r == ops && by_policy == Evidence::None && depth.at_operating_point() {
                Evidence::AtOperatingPoint
            } else {
                by_policy
            }
        });
        let dropped = self.estimate(
            used,
            t.offered_unused,
            t.missed,
            evidence,
            (partial, t.limit_bound),
        );
        // A host that lagged in vain is served what it can reach for a while (see
        // `host::Reach`), unless it met its reservation in the period before and the
        // estimate just dropped: then the target's drop, not its queue depth, made it
        // miss, and it keeps its reservation (a reach taken from the drop's period
        // shortchanged it for two periods more: Haechi's Set 4 in the lab). A host
        // bound by its queue depth missed the period before too.
        for (idx, lagged) in in_vain {
            if lagged.in_vain(t.used_global) && !(dropped && lagged.met_before) {
                self.members.hosts[idx].reach.confirm(lagged.completed);
            }
        }
        let (ended_epoch, ended_start) = (self.epoch, self.period_start);
        let hosts = std::sync::Arc::new(hosts);
        let host_nqns = self.members.nqns();
        self.records
            .push_period(ended_epoch, host_nqns.clone(), hosts.clone());
        self.start_period(start);
        PeriodReport {
            epoch: ended_epoch,
            start: ended_start,
            budget: report_budget,
            used,
            next_budget: self.budget,
            hosts,
            host_nqns,
        }
    }

    /// Arms period `epoch + 1` starting at `start`.
    pub(super) fn start_period(&mut self, start: Nanos) {
        self.epoch += 1;
        self.period_start = start;
        self.period_curve = self.depth.curve(start);
        let tag = self.tag();
        let cap = self.cfg.capacity_per_period();
        let bytes_metered = cap.bytes != u64::MAX;
        self.budget = Amount::new(
            clamp_pool(self.estimators[0].current()),
            if bytes_metered {
                clamp_pool(self.estimators[1].current())
            } else {
                POOL_MAX
            },
        );
        let m = &mut self.members;
        soft::grant_soft(
            &mut m.hosts,
            self.budget,
            self.cfg.estimator.underuse_periods,
        );
        let reserved = m
            .hosts
            .iter()
            .fold(Amount::ZERO, |a, h| a.saturating_add(h.reserved()));
        let reserved = m
            .groups
            .iter()
            .fold(reserved, |a, g| a.saturating_add(g.surplus));
        let global = self.budget.saturating_sub(reserved);
        for g in &mut m.groups {
            g.given = [0; 2];
            g.surplus_released = [0; 2];
            g.burst_ns = [0; 2];
            g.burst.end_period();
        }
        for h in &mut m.hosts {
            h.share.excess_granted = Amount::ZERO;
            h.activity.start_period();
            h.burst.end_period();
        }
        self.policy.start_period(start);
        self.period_ticks = 0;
        self.longest_tick_gap = Nanos::ZERO;
        let credit_only = self.policy.credit_only(bytes_metered);
        self.shared
            .credit_only
            .store(credit_only, Ordering::Release);
        // The global pool first, so a channel that already sees the new period finds it.
        for r in 0..2 {
            let (t, old) = self.shared.global[r].replace(tag, global.get(RES[r]));
            if t != tag {
                self.books.audit.expired_at_rollover[r] += old as i128;
            }
            self.books.audit.issued[r] += global.get(RES[r]) as i128;
            self.shared.budget[r].store(self.budget.get(RES[r]), Ordering::Release);
        }
        self.books.global_initial = global;
        self.converting = false;
        self.shared.global_closed.store(0, Ordering::Release);
        for h in &self.members.hosts {
            // Most hosts are not lagging: leave their line alone.
            if h.shared.lagging.load(Ordering::Relaxed) != 0 {
                h.shared.lagging.store(0, Ordering::Release);
            }
        }
        let burst = match self.cfg.release {
            ReservationRelease::Start => u64::MAX,
            ReservationRelease::Paced => self.cfg.release_burst().0,
        };
        self.shared.release_burst.store(burst, Ordering::Release);
        self.shared.period_start.store(start.0, Ordering::Release);
        self.arm_period();
        // Only what changed with the period (a soft grant, a reservation served as
        // unreachable) is published per host; the new period itself is published once,
        // below, after every pool is armed, so a channel that sees it finds its tokens.
        self.refresh_params(true);
        self.shared.epoch.store(self.epoch, Ordering::Release);
    }

    /// Arms the new period's pools: those armed ahead during the last period stand if
    /// the host's reservation and limits are still what they were armed with (the
    /// usual case); the rest are armed now. Detached hosts get their credit back to 0.
    pub(super) fn arm_period(&mut self) {
        let tag = self.tag();
        self.arm_cursor = 0;
        for h in &mut self.members.hosts {
            let armed = h.period.armed_ahead.take();
            if armed != Some(h.pools_for(self.epoch)) {
                h.arm_pools(tag, (1, 1), &mut self.books.audit);
            }
        }
        self.members.detached.retain(|h| Arc::strong_count(h) > 1);
        for h in &self.members.detached {
            for r in 0..2 {
                let (t, old) = h.credit[r].replace(tag, 0);
                if t != tag {
                    self.books.audit.expired_at_rollover[r] += old as i128;
                }
            }
        }
    }

    /// Arms the next period's pools of a few more hosts, so that by the middle of the
    /// period all are armed and the roll-over only publishes the new epoch (issue 10:
    /// the roll-over at 1024 hosts was memory-bound on retagging every pool).
    pub(super) fn arm_ahead(&mut self) {
        let n = self.members.hosts.len();
        if self.arm_cursor >= n {
            return;
        }
        let per_half_period = (self.cfg.period.0 / 2 / self.cfg.check_interval.0.max(1)).max(1);
        let per_tick = ARM_AHEAD_PER_TICK.max(n.div_ceil(per_half_period as usize));
        let next = self.epoch + 1;
        let end = n.min(self.arm_cursor + per_tick);
        for h in &mut self.members.hosts[self.arm_cursor..end] {
            h.arm_pools(next as u16, (1, 1), &mut self.books.audit);
            h.period.armed_ahead = Some(h.pools_for(next));
        }
        self.arm_cursor = end;
    }
}
