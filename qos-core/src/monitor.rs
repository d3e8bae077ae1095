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
//! settings and their errors), [`conversion`] (the check interval's pass), [`sharing`]
//! (the excess), [`period`] (roll-over and arming), [`publish`] (the channels' params),
//! [`capacity`] (the depth curve and the estimators), [`soft`] (soft guarantees),
//! [`books`] (the token audit), [`report`] (records, history, statistics).

mod books;
mod capacity;
mod conversion;
mod host;
mod members;
mod membership;
mod outcome;
mod period;
mod publish;
mod report;
pub(crate) mod sharing;
mod soft;

pub use books::Audit;
pub use membership::{
    AddGroupError, AddHostError, NewDomainError, RefusalKind, RemoveGroupError, RemoveHostError,
    UpdateDomainError, UpdateGroupError, UpdateHostError,
};
pub use outcome::{PeriodCounts, PeriodRecord};
pub use report::{
    BurstStats, CirculationStats, DomainStats, ESTIMATOR_LOG_PERIODS, Entitlement, EstimatorRecord,
    GroupStats, HISTORY_PERIODS, HostStats, PeriodReport,
};

use crate::burst::BurstStep;
use crate::config::{DomainConfig, GroupConfig, HostConfig, TokenMode};
use crate::cost::{Amount, RES};
use crate::depth::{CurvePoint, DepthCurve};
use crate::estimator::CapacityEstimator;
use crate::ledger::{ChannelTokens, DomainShared, HostShared};
use crate::sync::{Arc, Ordering};
use crate::time::{MonotonicClamp, Nanos};

use books::Books;
use capacity::make_estimators;
use members::Members;
use report::Records;
use sharing::SharingPolicy;

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
        self.publish_allowances(now);
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

    /// Over circulation, each host's in-flight allowance n_i* = N_i - h_i (what its
    /// hold target leaves outside QoS), at least one command (a host allowed none
    /// would never hear of a new allowance: it comes with completions); during a
    /// census (hold target `u64::MAX`) the last one stands. Otherwise none. A
    /// cooperative host is sent it (`allowance`, `window.rs`); reports older than
    /// [`crate::allowance::REPORT_TTL`] are forgotten here.
    fn publish_allowances(&mut self, now: Nanos) {
        let over = self.shared.window.is_over_circulation();
        for h in &self.members.hosts {
            let w = &h.shared.window;
            w.expire_report(now, crate::allowance::REPORT_TTL);
            if !over {
                w.set_allowance(None);
                continue;
            }
            let t = w.hold_target();
            if t != u64::MAX {
                w.set_allowance(Some(h.circulation_seen().saturating_sub(t).max(1)));
            }
        }
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
}
