//! The monitor: the single-threaded half of the target's QoS (Haechi's QoS monitor). It
//! owns a domain's hosts and groups and, at each check interval, does what needs a
//! global view: token conversion (unused reservation beyond `R_i - rho_i(t)` returns to
//! the global pool, which becomes `max(C (T - t) - L, 0)`), sharing of the excess (a
//! [`sharing`] policy), period roll-over (fresh reservation tokens, soft grants by
//! priority, limits, a new global pool), capacity estimation, and statistics.
//!
//! The calling protocol: create a [`Monitor`] per domain; add hosts and groups
//! ([`membership`]) and hand each host's [`HostShared`] (or a [`ChannelTokens`] from
//! [`Monitor::channel`]) to the threads that admit its I/O; call [`Monitor::tick`] from
//! one thread (a timer on the plugin's app thread, the lab's event loop) no later than
//! the deadline it returns; read [`Monitor::stats`] and the [`PeriodReport`] of each
//! ended period. Time is always an argument, and the monitor never blocks the channels:
//! they see its decisions through the shared pools and parameters.
//!
//! By concern: [`host`] (one host's parts), [`membership`] (hosts, groups, the domain's
//! settings and their errors), [`sharing`] (the excess), [`soft`] (soft guarantees),
//! [`books`] (the token audit), [`report`] (records, history, statistics).

mod books;
mod host;
mod membership;
mod report;
pub(crate) mod sharing;
mod soft;

pub use books::Audit;
pub use membership::{
    AddGroupError, AddHostError, NewDomainError, RefusalKind, RemoveGroupError, RemoveHostError,
    UpdateDomainError, UpdateGroupError, UpdateHostError,
};
pub use report::{
    BurstStats, DomainStats, ESTIMATOR_LOG_PERIODS, Entitlement, EstimatorRecord, GroupStats,
    HISTORY_PERIODS, HostStats, PeriodCounts, PeriodRecord, PeriodReport,
};

use crate::burst::BurstStep;
use crate::config::{
    DomainConfig, GroupConfig, HostConfig, ReservationRelease, TokenMode, UNLIMITED,
};
use crate::cost::{Amount, RES, Resource};
use crate::depth::{CurvePoint, DepthCurve};
use crate::estimator::{CapacityEstimator, EstimateStep, Evidence};
use crate::ledger::{ChannelParams, ChannelTokens, DomainShared, HostShared, clamp_pool};
use crate::sync::{Arc, Ordering, POOL_MAX};
use crate::time::{MonotonicClamp, Nanos, mul_div};

use books::Books;
use host::{IntervalTotals, IntervalView, PeriodTotals, PeriodView};
use membership::Members;
use report::Records;
use sharing::{Interval, SharingPolicy};

/// A host is idle (its unused reservation may be converted) after this many check
/// intervals with nothing outstanding and nothing admitted (at most 1% of the period,
/// at least one interval). One interval is too short: a backlogged host whose commands
/// arrive in bursts (a busy initiator, a slow network) often has nothing at the target
/// at one instant.
pub const IDLE_INTERVALS: u64 = 10;

/// How long a depth-curve bucket not seen again still counts (the level follows a
/// slower or faster target within a few intervals; this is for the curve's shape).
pub const DEPTH_HORIZON: Nanos = Nanos::from_secs(30);

/// Hosts whose next-period pools a check interval arms at least (more when the period
/// has too few check intervals for all hosts to be armed by its middle).
const ARM_AHEAD_PER_TICK: usize = 64;

/// What [`Monitor::tick`] asks of its caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tick {
    /// Call `tick` again no later than this.
    pub next_deadline: Nanos,
    /// Set when a period ended during this tick.
    pub ended: Option<PeriodReport>,
}

/// The target-side QoS monitor of one domain.
#[derive(Debug)]
pub struct Monitor {
    cfg: DomainConfig,
    shared: Arc<DomainShared>,
    members: Members,
    policy: Box<dyn SharingPolicy>,
    clock: MonotonicClamp,
    epoch: u64,
    period_start: Nanos,
    /// The capacity estimate sizing the current period, and its estimators.
    budget: Amount,
    estimators: [CapacityEstimator; 2],
    books: Books,
    /// Haechi's step S2: conversion started this period (some host dipped into the
    /// global pool, or the policy converts always).
    converting: bool,
    /// Check intervals of this period.
    period_ticks: u32,
    /// Hosts before this index have their pools of the next period armed (or were
    /// passed over by a removal and are armed at the roll-over).
    arm_cursor: usize,
    records: Records,
    /// The target's depth curve (operations, cost units) and when it last had a sample.
    depth: DepthCurve,
    depth_at: Nanos,
    /// The curve as it was when the current period started: what the period's served
    /// work is judged against (by its end the curve has learned the period itself).
    period_curve: Vec<CurvePoint>,
    /// When the burst buckets were last stepped.
    burst_at: Nanos,
    /// When [`Monitor::tick`] last ran, and the longest time between two of its runs in
    /// the current period (the gap that reached into the period's end counts for it):
    /// how long the target's thread went without running the monitor, which a period's
    /// reservations cannot make up for.
    last_tick: Nanos,
    longest_tick_gap: Nanos,
}

impl Monitor {
    /// A domain with no hosts; its first period starts at `now`.
    pub fn new(cfg: DomainConfig, now: Nanos) -> Result<Self, NewDomainError> {
        let policy = sharing::policy_for(cfg.sharing);
        Self::with_policy(cfg, now, policy)
    }

    /// A domain whose excess is shared by `policy` rather than `cfg.sharing`'s.
    pub(crate) fn with_policy(
        cfg: DomainConfig,
        now: Nanos,
        policy: Box<dyn SharingPolicy>,
    ) -> Result<Self, NewDomainError> {
        cfg.validate()?;
        let shared = Arc::new(DomainShared::new(
            cfg.cost,
            cfg.mode == TokenMode::Haechi,
            cfg.period,
        ));
        let mut m = Monitor {
            shared,
            members: Members::default(),
            estimators: make_estimators(&cfg, policy.as_ref()),
            policy,
            clock: MonotonicClamp::new(now),
            epoch: 0,
            period_start: now,
            budget: Amount::ZERO,
            books: Books::default(),
            converting: false,
            period_ticks: 0,
            arm_cursor: 0,
            records: Records::new(),
            depth: DepthCurve::new(DEPTH_HORIZON),
            depth_at: now,
            period_curve: Vec::new(),
            burst_at: now,
            last_tick: now,
            longest_tick_gap: Nanos::ZERO,
            cfg,
        };
        m.shared
            .bypass
            .store(m.cfg.bypass as u64, Ordering::Release);
        m.policy.attach(&m.shared);
        m.start_period(now);
        Ok(m)
    }

    pub fn config(&self) -> &DomainConfig {
        &self.cfg
    }
    pub fn shared(&self) -> &Arc<DomainShared> {
        &self.shared
    }
    pub fn epoch(&self) -> u64 {
        self.epoch
    }
    pub fn period_start(&self) -> Nanos {
        self.period_start
    }
    /// Capacity estimate sizing the current period, per period.
    pub fn budget(&self) -> Amount {
        self.budget
    }
    pub fn audit(&self) -> Audit {
        self.books.audit
    }
    pub fn host_configs(&self) -> impl Iterator<Item = &HostConfig> {
        self.members.hosts.iter().map(|h| &h.cfg)
    }
    /// The groups' settings, in creation order.
    pub fn group_configs(&self) -> impl Iterator<Item = &GroupConfig> {
        self.members.groups.iter().map(|g| &g.cfg)
    }
    pub fn host(&self, nqn: &str) -> Option<&Arc<HostShared>> {
        self.members
            .find(nqn)
            .map(|i| &self.members.hosts[i].shared)
    }
    /// A channel (one thread's token cache) for a configured host.
    pub fn channel(&self, nqn: &str) -> Option<ChannelTokens> {
        self.host(nqn)
            .map(|h| ChannelTokens::new(self.shared.clone(), h.clone()))
    }

    /// Runs the check interval. Returns when to call again and, if a period ended,
    /// its report.
    pub fn tick(&mut self, now: Nanos) -> Tick {
        let now = self.clock.observe(now);
        let gap = now.saturating_sub(self.last_tick);
        self.last_tick = now;
        self.longest_tick_gap = self.longest_tick_gap.max(gap);
        let end = self.period_start.saturating_add(self.cfg.period);
        let ended = if now >= end {
            // Keep periods on their grid even if ticks were late.
            let k = (now.0 - self.period_start.0) / self.cfg.period.0;
            let start = Nanos(self.period_start.0 + k * self.cfg.period.0);
            Some(self.roll_over_at(start))
        } else {
            self.convert(now);
            self.arm_ahead();
            None
        };
        self.step_bursts(now);
        let end = self.period_start.saturating_add(self.cfg.period);
        Tick {
            next_deadline: now.saturating_add(self.cfg.check_interval).min(end),
            ended,
        }
    }

    /// Steps every burst bucket with what its host (or group) was admitted since the
    /// last step, and moves the limits of the hosts whose burst started or ended.
    fn step_bursts(&mut self, now: Nanos) {
        let dt = now.saturating_sub(self.burst_at);
        self.burst_at = now;
        if !self.members.bursts || dt == Nanos::ZERO {
            return;
        }
        let step = |(used, held)| BurstStep {
            dt,
            used,
            held,
            period: self.cfg.period,
            check_interval: self.cfg.check_interval,
        };
        let (left, tag) = (self.left_fraction(now), self.tag());
        let m = &mut self.members;
        let mut group_used = vec![(Amount::ZERO, false); m.groups.len()];
        let mut moved = false;
        for h in &mut m.hosts {
            let group = h.group.filter(|&g| m.groups[g].budgets.burst.any());
            if !h.budgets.burst.any() && group.is_none() {
                continue;
            }
            let used = h.admitted_since_last();
            if let Some(g) = group {
                let (sum, held) = &mut group_used[g];
                *sum = sum.saturating_add(used.0);
                *held |= used.1;
            }
            if h.budgets.burst.any() {
                let before = h.limit();
                if h.burst.advance(&h.budgets.burst, step(used)) {
                    h.retarget_limits(&before, &h.limit(), left, tag);
                    moved = true;
                }
            }
        }
        for (g, used) in m.groups.iter_mut().zip(group_used) {
            if g.budgets.burst.any() {
                g.burst.advance(&g.budgets.burst, step(used));
                let limit = g.burst.effective_limit(&g.budgets.burst, g.budgets.limit);
                for r in 0..2 {
                    if limit.get(RES[r]) != g.budgets.limit.get(RES[r]) {
                        g.burst_ns[r] = g.burst_ns[r].saturating_add(dt.0);
                    }
                }
            }
        }
        if moved {
            self.refresh_params(true);
        }
    }

    /// Feeds the depth curve with the interval since the last sample: `work` the hosts
    /// completed and the time `service` it spent at the base (taken in the check
    /// interval's or the roll-over's pass over the hosts).
    fn learn_depth(&mut self, now: Nanos, work: u64, service: u64) {
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
    fn depth_due(&self, now: Nanos) -> bool {
        now.saturating_sub(self.depth_at) >= crate::depth::MIN_WINDOW
    }

    /// The depth curve's sample when no other pass reads the hosts' counters.
    fn learn_depth_alone(&mut self, now: Nanos) {
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

    fn tag(&self) -> u16 {
        self.epoch as u16
    }

    /// How long a host must have had nothing outstanding and admitted nothing to count
    /// as idle: IDLE_INTERVALS check intervals, at most 1% of the period.
    fn idle_after(&self) -> Nanos {
        Nanos(
            self.cfg
                .check_interval
                .0
                .saturating_mul(IDLE_INTERVALS)
                .min(self.cfg.period.0 / 100)
                .max(self.cfg.check_interval.0),
        )
    }

    /// `(T - t, T)` for the current period.
    fn left_fraction(&self, now: Nanos) -> (u64, u64) {
        let t = now
            .saturating_sub(self.period_start)
            .0
            .min(self.cfg.period.0);
        (self.cfg.period.0 - t, self.cfg.period.0)
    }

    /// Token conversion at time `now` (Haechi step T2), adapted to a target that sees
    /// demand: a host's unused reservation beyond `R_i (T - t) / T` is reclaimed only
    /// while it has no command outstanding (none in flight, none held). Haechi infers
    /// "insufficient demand" from consumption because one-sided I/O is invisible to its
    /// server; here a backlogged host whose commands are merely slow to be served keeps
    /// its tokens, so others' global tokens cannot crowd it out of its reservation. The
    /// global pool is what the rest of the period can serve after the residual
    /// reservations, the credit already granted, the tokens sitting in channel caches
    /// and the work still in flight. Then the sharing policy has its turn.
    fn convert(&mut self, now: Nanos) {
        let paced = self.cfg.release == ReservationRelease::Paced;
        let conversion = self.cfg.mode == TokenMode::Haechi;
        let shares = self.policy.converts_always();
        if conversion && shares {
            self.converting = true;
        }
        if conversion && !self.converting {
            // Step S2: nothing to convert until some host has dipped into the pool.
            let avail = self.shared.global_available();
            let initial = self.books.global_initial;
            if avail.ops < initial.ops || avail.bytes < initial.bytes {
                self.converting = true;
            }
        }
        let convert = conversion && self.converting;
        if !convert && !paced && !shares {
            self.learn_depth_alone(now);
            return;
        }
        let (num, den) = self.left_fraction(now);
        self.period_ticks += 1;
        let view = IntervalView {
            tag: self.tag(),
            now,
            left: (num, den),
            convert,
            paced,
            // Paced release: a backlogged host is lagging when more of its released
            // reservation is unused than the burst plus two check intervals of
            // schedule (a host whose commands reach the target a little late, by
            // network jitter or an initiator mirroring the schedule on its own clock,
            // is not lagging).
            release_num: (den - num)
                .saturating_add(self.cfg.release_burst().0)
                .min(den),
            lag_slack: self
                .cfg
                .release_burst()
                .0
                .saturating_add((2 * self.cfg.check_interval.0).min(self.cfg.period.0 / 200)),
            behind_slack: self.cfg.release_burst().0,
            interval: self.cfg.check_interval.0,
            idle_after: self.idle_after(),
            sample_depth: self.depth_due(now),
        };
        let mut t = IntervalTotals::default();
        for h in &mut self.members.hosts {
            h.check_interval(&view, &mut self.books.audit, &mut t);
        }
        let (closed, mut outstanding) = (t.lag, t.outstanding);
        let owns_pool = self.policy.owns_pool(paced);
        // A policy that owns the pool protects reservations its own way, not by
        // closing the pool to everybody who does not lag.
        let close = if owns_pool { 0 } else { closed };
        if self.shared.global_closed.load(Ordering::Relaxed) != close {
            self.shared.global_closed.store(close, Ordering::Release);
        }
        if view.sample_depth {
            self.learn_depth(now, t.depth.0, t.depth.1);
        }
        // Group reservations not released yet are promised, like hosts' residuals.
        for g in &self.members.groups {
            for (r, out) in outstanding.iter_mut().enumerate() {
                *out = out.saturating_add(mul_div(g.surplus.get(RES[r]), num, den));
            }
        }
        let haechi_bound = self.global_bound((num, den), outstanding, t.in_flight, t.used);
        if convert && !owns_pool {
            self.set_global_pool(haechi_bound);
        }
        self.policy.share(Interval {
            now,
            left: (num, den),
            released: view.release_num,
            lag_slack: view.lag_slack,
            closed,
            behind_backlogged: t.behind_backlogged,
            behind: t.behind,
            behind_ns: t.behind_ns,
            close: t.close,
            haechi_bound,
            used_global: t.used_global,
            tag: self.epoch as u16,
            budget: self.budget,
            cfg: &self.cfg,
            shared: &self.shared,
            members: &mut self.members,
            books: &mut self.books,
        });
    }

    /// Haechi's global pool: what the rest of the period can serve beyond what is
    /// promised or in flight (`outstanding`, as the policy counts it), and never more
    /// than the period's unspent budget.
    fn global_bound(
        &self,
        (num, den): (u64, u64),
        outstanding: [u64; 2],
        in_flight: [u64; 2],
        used: [u64; 2],
    ) -> [u64; 2] {
        std::array::from_fn(|r| {
            let remaining = mul_div(self.budget.get(RES[r]), num, den);
            // Never more in a period than its budget: a target faster than its
            // configured capacity must not turn every check interval's
            // `C (T - t) - L` into fresh tokens on top of what was already spent.
            let held = outstanding[r].saturating_sub(in_flight[r]);
            let unspent = self
                .budget
                .get(RES[r])
                .saturating_sub(used[r])
                .saturating_sub(held);
            let promised = self.policy.promised(outstanding[r], held);
            clamp_pool(remaining.saturating_sub(promised).min(unspent))
        })
    }

    /// The global pool becomes `bound` (see [`Monitor::global_bound`]).
    fn set_global_pool(&mut self, bound: [u64; 2]) {
        let tag = self.tag();
        for (r, g) in bound.into_iter().enumerate() {
            if let Some(old) = self.shared.global[r].set_in_period(tag, g) {
                self.books.audit.issued[r] += g as i128 - old as i128;
            }
        }
    }

    /// Ends the current period at `start` (the new period's start) and arms the next.
    fn roll_over_at(&mut self, start: Nanos) -> PeriodReport {
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
        for (idx, (completed, met_before)) in in_vain {
            if !(dropped && met_before) {
                self.members.hosts[idx].reach.confirm(completed);
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

    /// Where the period ending at `end`, which completed `work` (operations, cost
    /// units) with `service_ns` spent at the base, lies on the depth curve as it was
    /// when the period started (see [`PeriodDepth`]).
    fn period_depth(&self, end: Nanos, work: u64, service_ns: u64) -> PeriodDepth {
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
    fn estimate(
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

impl Monitor {
    /// Arms period `epoch + 1` starting at `start`.
    fn start_period(&mut self, start: Nanos) {
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
    fn arm_period(&mut self) {
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
    fn arm_ahead(&mut self) {
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

    /// What a removed host's channels carry on with: global tokens only, no limit.
    fn best_effort_params(&self) -> ChannelParams {
        let batch = self.cfg.batch();
        ChannelParams {
            together: true,
            limit_mask: 0,
            limit: [Amount::new(UNLIMITED, UNLIMITED); 3],
            res_batch: Amount::ZERO,
            global_batch: batch,
            limit_batch: Amount::ZERO,
            capacity: self.clamp_capacity(),
            credit_cap: sharing::four(batch),
            pool_res: [Amount::ZERO; 2],
            configured: false,
            bursting: false,
        }
    }

    fn clamp_capacity(&self) -> Amount {
        let c = self.cfg.capacity_per_period();
        Amount::new(clamp_pool(c.ops).max(1), clamp_pool(c.bytes).max(1))
    }

    /// Recomputes and publishes every host's params (batches depend on the host set).
    fn refresh_all_params(&mut self) {
        self.refresh_params(false);
    }

    /// The largest weight of the hosts (1 without hosts): the first-come policy scales
    /// every host's batch by its weight over this one.
    fn max_weight(&self) -> u64 {
        self.members
            .hosts
            .iter()
            .map(|h| h.budgets.weight)
            .max()
            .unwrap_or(1)
            .max(1) as u64
    }

    /// Publishes what a change of one host needs: host `changed`'s params (none for a
    /// removal), or every host's when the largest weight is no longer
    /// `max_weight_before`. A host's params depend on the domain's settings, its own
    /// budgets and the largest weight only, so at a thousand hosts a `qos_host_set`
    /// does not rewrite a thousand hosts' params.
    fn refresh_params_after_host_change(&mut self, changed: Option<usize>, max_weight_before: u64) {
        let max_w = self.max_weight();
        if max_w != max_weight_before {
            return self.refresh_all_params();
        }
        let (batch, capacity, four_intervals) = self.params_inputs();
        if let Some(h) = changed.and_then(|i| self.members.hosts.get_mut(i)) {
            let w = h.budgets.weight as u64;
            let batches = self.policy.host_batches(batch, w, max_w, four_intervals);
            h.publish_params(batch, capacity, batches);
        }
    }

    /// What every host's params are computed from besides its own budgets and the
    /// largest weight: the global batch, the capacity and four check intervals of it.
    fn params_inputs(&self) -> (Amount, Amount, Amount) {
        let capacity = self.clamp_capacity();
        let four = |c: u64| mul_div(c, 4 * self.cfg.check_interval.0, self.cfg.period.0);
        let four_intervals = Amount::new(four(capacity.ops), four(capacity.bytes));
        (self.cfg.batch(), capacity, four_intervals)
    }

    /// Recomputes every host's params and publishes them, or with `only_changed` only
    /// those of hosts whose reservation of the period changed since they were last
    /// published (the rest depends on the configuration and the host set, whose
    /// changes publish everything).
    fn refresh_params(&mut self, only_changed: bool) {
        let (batch, capacity, four_intervals) = self.params_inputs();
        let max_w = self.max_weight();
        for h in self.members.hosts.iter_mut() {
            if only_changed
                && h.period.published_res == h.period.res
                && h.period.published_limit == h.limit()
            {
                continue;
            }
            let w = h.budgets.weight as u64;
            let batches = self.policy.host_batches(batch, w, max_w, four_intervals);
            h.publish_params(batch, capacity, batches);
        }
    }
}

/// Where a period lies on the depth curve learned before it: what its shortfall, if
/// any, says about the target's capacity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PeriodDepth {
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

impl PeriodDepth {
    fn at_operating_point(self) -> bool {
        self == PeriodDepth::AtOperatingPoint
    }
}

/// The estimators of a domain, as its sharing policy wants them (weighted sharing's
/// doubling probes); both keep Haechi's Algorithm 1 with the probe back-off, the
/// "reservations starved" evidence and the sudden-drop rule.
fn make_estimators(cfg: &DomainConfig, policy: &dyn SharingPolicy) -> [CapacityEstimator; 2] {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{ExcessSharing, ReservationRelease, test_domain};

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
    fn a_host_change_republishes_the_others_only_when_the_largest_weight_moves() {
        let cfg = DomainConfig {
            global_batch: crate::config::BatchSize::Fixed {
                ops: 64,
                bytes: 1 << 20,
            },
            ..test_domain(
                1_000_000,
                ReservationRelease::Paced,
                ExcessSharing::FirstCome,
            )
        };
        let mut m = Monitor::new(cfg, Nanos::ZERO).unwrap();
        let host = |n: &str, weight: u32| HostConfig {
            weight,
            ..HostConfig::new(n)
        };
        m.add_host(host("a", 1), Nanos::ZERO).unwrap();
        m.add_host(host("b", 2), Nanos::ZERO).unwrap();
        let batch_of = |m: &Monitor, n: &str| m.host(n).unwrap().read_params().global_batch.ops;
        // First come scales a host's batch by its weight over the largest.
        assert_eq!((batch_of(&m, "a"), batch_of(&m, "b")), (32, 64));
        // A heavier host: every batch is rescaled.
        m.add_host(host("c", 4), Nanos::ZERO).unwrap();
        assert_eq!(
            (batch_of(&m, "a"), batch_of(&m, "b"), batch_of(&m, "c")),
            (16, 32, 64)
        );
        // The heaviest made lighter, then removed: back each time.
        m.update_host(host("c", 1), Nanos::ZERO).unwrap();
        assert_eq!(
            (batch_of(&m, "a"), batch_of(&m, "b"), batch_of(&m, "c")),
            (32, 64, 32)
        );
        m.update_host(host("c", 4), Nanos::ZERO).unwrap();
        m.remove_host("c", Nanos::ZERO).unwrap();
        assert_eq!((batch_of(&m, "a"), batch_of(&m, "b")), (32, 64));
        // A change below the largest weight touches that host only, and is published.
        m.update_host(host("a", 2), Nanos::ZERO).unwrap();
        assert_eq!((batch_of(&m, "a"), batch_of(&m, "b")), (64, 64));
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
