//! The monitor: the single-threaded half of the target's QoS (Haechi's QoS monitor). It
//! owns the domain and host configuration and, at each check interval, does what needs a
//! global view: token conversion (unused reservation beyond `R_i - rho_i(t)` returns to
//! the global pool, which becomes `max(C (T - t) - L, 0)`), period roll-over (fresh
//! reservation tokens, soft grants by priority, limits, a new global pool), capacity
//! estimation, and statistics. Plugins call [`Monitor::tick`] from a timer on their app
//! thread; the lab calls it from its event loop. Time is always an argument.

use std::collections::VecDeque;

use serde::Serialize;
use thiserror::Error;

use crate::admission::{AdmissionError, AdmissionReport, check_admission, local_shortfall};
use crate::config::{
    BudgetClass, ConfigError, DomainConfig, HostBudgets, HostConfig, PriorityClass,
    ReservationRelease, TokenMode, UNLIMITED,
};
use crate::cost::{Amount, Resource};
use crate::estimator::{CapacityEstimator, UnderuseCounter};
use crate::ledger::{
    ChannelTokens, CounterSnapshot, DomainShared, HostParams, HostShared, clamp_pool,
};
use crate::sync::{Arc, Ordering, POOL_MAX};
use crate::time::{MonotonicClamp, Nanos, mul_div, mul_div_ceil};

/// A host is idle (its unused reservation may be converted) after this many check
/// intervals with nothing outstanding and nothing admitted (at most 1% of the period,
/// at least one interval). One interval is too short: a backlogged host whose commands
/// arrive in bursts (a busy initiator, a slow network) often has nothing at the target
/// at one instant.
pub const IDLE_INTERVALS: u64 = 10;

/// How many past periods each host's history keeps for statistics.
pub const HISTORY_PERIODS: usize = 128;

#[derive(Debug, Error)]
pub enum NewDomainError {
    #[error(transparent)]
    Config(#[from] ConfigError),
}

#[derive(Debug, Error)]
pub enum AddHostError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Admission(#[from] AdmissionError),
    #[error("host {0} is already configured in this domain; update it instead")]
    Duplicate(String),
}

#[derive(Debug, Error)]
pub enum UpdateHostError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Admission(#[from] AdmissionError),
    #[error("host {0} is not configured in this domain")]
    Unknown(String),
}

#[derive(Debug, Error)]
#[error("host {0} is not configured in this domain")]
pub struct RemoveHostError(pub String);

#[derive(Debug, Error)]
pub enum UpdateDomainError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Admission(#[from] AdmissionError),
    #[error("host {host}: {source}")]
    Host { host: String, source: ConfigError },
    #[error("the cost model of a domain cannot change while it exists; create a new domain")]
    CostModelFixed,
}

/// One past period of one host.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct PeriodRecord {
    pub epoch: u64,
    pub completed: Amount,
    pub completed_ios: u64,
    /// Hard reservation of that period.
    pub reservation: Amount,
    pub soft_granted: Amount,
    /// Completed at least the hard reservation in every reserved resource.
    pub met: bool,
    /// Had I/O held for want of tokens or limit (it was backlogged).
    pub backlogged: bool,
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
    /// Per host, in the order of `host_nqns`.
    pub hosts: Vec<PeriodRecord>,
    /// The hosts' NQNs (shared between reports until the host set changes).
    pub host_nqns: std::sync::Arc<[String]>,
}

/// What [`Monitor::tick`] asks of its caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tick {
    /// Call `tick` again no later than this.
    pub next_deadline: Nanos,
    /// Set when a period ended during this tick.
    pub ended: Option<PeriodReport>,
}

#[derive(Debug)]
struct HostEntry {
    cfg: HostConfig,
    budgets: HostBudgets,
    shared: Arc<HostShared>,
    /// Reservation plus soft grant per pool for the current period (undecayed R').
    period_res: [Amount; 2],
    soft_granted: Amount,
    underuse: UnderuseCounter,
    soft_idle: UnderuseCounter,
    last: CounterSnapshot,
    /// Commands admitted as of the previous conversion tick.
    admitted_at_tick: u64,
    /// When it last had a command outstanding or admitted one.
    last_active: Nanos,
    /// Unused reservation its channels may hold in caches: not counted as lag.
    res_slack: Amount,
    history: VecDeque<PeriodRecord>,
    /// Ended periods since the host was added, by outcome (monotonic).
    period_counts: PeriodCounts,
}

/// Ended periods of one host since it was added, by outcome: reservation met or
/// missed, while backlogged (I/O held for tokens or limit) or not. A host without a
/// reservation meets it in every period.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct PeriodCounts {
    pub met: u64,
    pub missed: u64,
    pub met_backlogged: u64,
    pub missed_backlogged: u64,
}

impl PeriodCounts {
    fn count(&mut self, met: bool, backlogged: bool) {
        *match (met, backlogged) {
            (true, false) => &mut self.met,
            (false, false) => &mut self.missed,
            (true, true) => &mut self.met_backlogged,
            (false, true) => &mut self.missed_backlogged,
        } += 1;
    }
}

/// Token bookkeeping for the conservation checks: every token the monitor creates or
/// removes is counted, so `issued = pools + caches + consumed + expired` holds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Audit {
    /// Net tokens created (created minus removed by conversion), per resource.
    pub issued: [i128; 2],
    /// Tokens left in pools when a period ended.
    pub expired_at_rollover: [i128; 2],
}

/// The target-side QoS monitor of one domain.
#[derive(Debug)]
pub struct Monitor {
    cfg: DomainConfig,
    shared: Arc<DomainShared>,
    hosts: Vec<HostEntry>,
    /// Removed hosts whose channels may still run: kept best-effort and re-armed each period.
    detached: Vec<Arc<HostShared>>,
    next_host_id: u32,
    epoch: u64,
    period_start: Nanos,
    clock: MonotonicClamp,
    budget: Amount,
    estimators: [CapacityEstimator; 2],
    global_initial: Amount,
    converting: bool,
    audit: Audit,
    /// NQNs for period reports; dropped when hosts are added or removed.
    nqns_cache: Option<std::sync::Arc<[String]>>,
}

impl Monitor {
    /// A domain with no hosts; its first period starts at `now`.
    pub fn new(cfg: DomainConfig, now: Nanos) -> Result<Self, NewDomainError> {
        cfg.validate()?;
        let shared = Arc::new(DomainShared::new(
            cfg.cost,
            cfg.mode == TokenMode::Haechi,
            cfg.period,
        ));
        let estimators = make_estimators(&cfg);
        let mut m = Monitor {
            shared,
            hosts: Vec::new(),
            detached: Vec::new(),
            next_host_id: 0,
            epoch: 0,
            period_start: now,
            clock: MonotonicClamp::new(now),
            budget: Amount::ZERO,
            estimators,
            global_initial: Amount::ZERO,
            converting: false,
            audit: Audit::default(),
            nqns_cache: None,
            cfg,
        };
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
        self.audit
    }
    pub fn host_configs(&self) -> impl Iterator<Item = &HostConfig> {
        self.hosts.iter().map(|h| &h.cfg)
    }
    pub fn host(&self, nqn: &str) -> Option<&Arc<HostShared>> {
        self.find(nqn).map(|i| &self.hosts[i].shared)
    }
    /// History of `nqn`'s past periods, oldest first.
    pub fn history(&self, nqn: &str) -> Option<&VecDeque<PeriodRecord>> {
        self.find(nqn).map(|i| &self.hosts[i].history)
    }
    /// A channel (one thread's token cache) for a configured host.
    pub fn channel(&self, nqn: &str) -> Option<ChannelTokens> {
        self.host(nqn)
            .map(|h| ChannelTokens::new(self.shared.clone(), h.clone()))
    }

    /// The NQNs of the hosts, in order; rebuilt only when the host set changed.
    fn host_nqns(&mut self) -> std::sync::Arc<[String]> {
        self.nqns_cache
            .get_or_insert_with(|| self.hosts.iter().map(|h| h.cfg.host_nqn.clone()).collect())
            .clone()
    }

    fn find(&self, nqn: &str) -> Option<usize> {
        self.hosts.iter().position(|h| h.cfg.host_nqn == nqn)
    }

    /// Admission check of the current host set with one host replaced or added.
    fn admit(
        &self,
        replace: Option<(&str, &HostBudgets)>,
    ) -> Result<AdmissionReport, AdmissionError> {
        let mut list: Vec<(&str, &HostBudgets)> = self
            .hosts
            .iter()
            .filter(|h| replace.is_none_or(|(n, _)| n != h.cfg.host_nqn))
            .map(|h| (h.cfg.host_nqn.as_str(), &h.budgets))
            .collect();
        if let Some(r) = replace {
            list.push(r);
        }
        check_admission(&self.cfg, list)
    }

    /// Admission report of the current host set.
    pub fn admission(&self) -> Result<AdmissionReport, AdmissionError> {
        self.admit(None)
    }

    /// Adds a host. Its reservation and limit start prorated to the rest of the period.
    pub fn add_host(
        &mut self,
        cfg: HostConfig,
        now: Nanos,
    ) -> Result<Arc<HostShared>, AddHostError> {
        let now = self.clock.observe(now);
        if self.find(&cfg.host_nqn).is_some() {
            return Err(AddHostError::Duplicate(cfg.host_nqn));
        }
        let budgets = cfg.budgets(&self.cfg)?;
        self.admit(Some((&cfg.host_nqn, &budgets)))?;
        let id = self.next_host_id;
        self.next_host_id += 1;
        let shared = Arc::new(HostShared::new(
            id,
            cfg.host_nqn.clone(),
            &HostParams::default(),
        ));
        let last = shared.counters();
        self.hosts.push(HostEntry {
            cfg,
            budgets,
            shared: shared.clone(),
            period_res: budgets.reservation,
            soft_granted: Amount::ZERO,
            underuse: UnderuseCounter::default(),
            soft_idle: UnderuseCounter::default(),
            last,
            admitted_at_tick: 0,
            last_active: now,
            res_slack: Amount::ZERO,
            history: VecDeque::new(),
            period_counts: PeriodCounts::default(),
        });
        self.nqns_cache = None;
        let i = self.hosts.len() - 1;
        let left = self.left_fraction(now);
        self.arm_host(i, left);
        // Its reservation comes out of the unreserved pool.
        let added = self.hosts[i].period_res[0].saturating_add(self.hosts[i].period_res[1]);
        for r in 0..2 {
            let v = mul_div(added.get(RES[r]), left.0, left.1);
            self.move_global(r, -(v as i128));
        }
        self.refresh_all_params();
        Ok(shared)
    }

    /// Changes a host's settings in place: connected hosts keep their queues, and the
    /// new reservation and limit apply, prorated, to the rest of the current period.
    pub fn update_host(&mut self, cfg: HostConfig, now: Nanos) -> Result<(), UpdateHostError> {
        let now = self.clock.observe(now);
        let i = self
            .find(&cfg.host_nqn)
            .ok_or_else(|| UpdateHostError::Unknown(cfg.host_nqn.clone()))?;
        let budgets = cfg.budgets(&self.cfg)?;
        self.admit(Some((&cfg.host_nqn, &budgets)))?;
        let (num, den) = self.left_fraction(now);
        let tag = self.tag();
        let h = &mut self.hosts[i];
        let old = h.budgets;
        let soft = Amount::new(
            h.soft_granted.ops.min(budgets.soft_extra.ops),
            h.soft_granted.bytes.min(budgets.soft_extra.bytes),
        );
        let new_pr = with_soft(&budgets, soft);
        let mut global_delta = [0i128; 2];
        // Adjust the live pools by the prorated difference, never below zero.
        for p in 0..2 {
            for r in Resource::ALL {
                let delta = mul_div(new_pr[p].get(r), num, den) as i128
                    - mul_div(h.period_res[p].get(r), num, den) as i128;
                let before = self.audit.issued[r.index()];
                adjust_pool(
                    &h.shared.res[p][r.index()],
                    tag,
                    delta,
                    &mut self.audit.issued[r.index()],
                );
                global_delta[r.index()] -= self.audit.issued[r.index()] - before;
            }
        }
        for c in BudgetClass::ALL {
            for r in Resource::ALL {
                let pool = &h.shared.limit[c as usize][r.index()];
                let new_l = budgets.limit[c as usize].get(r);
                let old_l = old.limit[c as usize].get(r);
                if new_l == UNLIMITED {
                    continue;
                }
                let prorated = mul_div(new_l, num, den);
                if old_l == UNLIMITED {
                    pool.replace(tag, clamp_pool(prorated));
                } else {
                    let delta = prorated as i128 - mul_div(old_l, num, den) as i128;
                    let mut ignored = 0;
                    adjust_pool(pool, tag, delta, &mut ignored);
                }
            }
        }
        h.period_res = new_pr;
        h.soft_granted = soft;
        h.budgets = budgets;
        h.cfg = cfg;
        // What the reservation gained comes out of the unreserved pool, and the reverse.
        for (r, d) in global_delta.into_iter().enumerate() {
            self.move_global(r, d);
        }
        self.refresh_all_params();
        Ok(())
    }

    /// Removes a host. Its reservation returns to the pool; channels still bound to it
    /// carry on best-effort (global tokens only, no limit), so held I/O is not stranded.
    pub fn remove_host(&mut self, nqn: &str, now: Nanos) -> Result<(), RemoveHostError> {
        self.clock.observe(now);
        let i = self
            .find(nqn)
            .ok_or_else(|| RemoveHostError(nqn.to_string()))?;
        let h = self.hosts.remove(i);
        self.nqns_cache = None;
        let tag = self.tag();
        for p in 0..2 {
            for r in 0..2 {
                let (t, c) = h.shared.res[p][r].replace(tag, 0);
                if t == tag {
                    // Its unused reservation becomes unreserved capacity.
                    self.audit.issued[r] -= c as i128;
                    self.move_global(r, c as i128);
                }
            }
        }
        h.shared.write_params(&self.best_effort_params());
        self.detached.push(h.shared);
        self.refresh_all_params();
        Ok(())
    }

    /// Replaces the domain settings (capacity, period, batch, estimator...). The
    /// current period ends now and a new one starts with the new settings.
    pub fn update_domain(
        &mut self,
        cfg: DomainConfig,
        now: Nanos,
    ) -> Result<(), UpdateDomainError> {
        let now = self.clock.observe(now);
        cfg.validate()?;
        if cfg.cost != self.cfg.cost {
            return Err(UpdateDomainError::CostModelFixed);
        }
        let mut budgets = Vec::with_capacity(self.hosts.len());
        for h in &self.hosts {
            let b = h
                .cfg
                .budgets(&cfg)
                .map_err(|source| UpdateDomainError::Host {
                    host: h.cfg.host_nqn.clone(),
                    source,
                })?;
            budgets.push(b);
        }
        check_admission(
            &cfg,
            self.hosts
                .iter()
                .zip(&budgets)
                .map(|(h, b)| (h.cfg.host_nqn.as_str(), b)),
        )?;
        let capacity_changed = cfg.capacity != self.cfg.capacity || cfg.period != self.cfg.period;
        self.cfg = cfg;
        if capacity_changed {
            self.estimators = make_estimators(&self.cfg);
        }
        for (h, b) in self.hosts.iter_mut().zip(budgets) {
            h.budgets = b;
        }
        self.shared
            .period
            .store(self.cfg.period.0, Ordering::Release);
        self.shared.conversion.store(
            (self.cfg.mode == TokenMode::Haechi) as u64,
            Ordering::Release,
        );
        self.roll_over_at(now);
        Ok(())
    }

    fn tag(&self) -> u16 {
        self.epoch as u16
    }

    /// Adds `delta` tokens to (or takes them from) the global pool of this period.
    fn move_global(&mut self, r: usize, delta: i128) {
        let tag = self.tag();
        let pool = &self.shared.global[r];
        if delta > 0 {
            if pool.give(tag, delta as u64) {
                self.audit.issued[r] += delta;
            }
        } else if delta < 0 {
            let taken = pool.take(tag, (-delta) as u64);
            self.audit.issued[r] -= taken as i128;
        }
        self.global_initial.set(RES[r], pool.load().1);
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

    /// Runs the check interval. Returns when to call again and, if a period ended,
    /// its report.
    pub fn tick(&mut self, now: Nanos) -> Tick {
        let now = self.clock.observe(now);
        let end = self.period_start.saturating_add(self.cfg.period);
        let ended = if now >= end {
            // Keep periods on their grid even if ticks were late.
            let k = (now.0 - self.period_start.0) / self.cfg.period.0;
            let start = Nanos(self.period_start.0 + k * self.cfg.period.0);
            Some(self.roll_over_at(start))
        } else {
            self.convert(now);
            None
        };
        let end = self.period_start.saturating_add(self.cfg.period);
        Tick {
            next_deadline: now.saturating_add(self.cfg.check_interval).min(end),
            ended,
        }
    }

    /// Token conversion at time `now` (Haechi step T2), adapted to a target that sees
    /// demand: a host's unused reservation beyond `R_i (T - t) / T` is reclaimed only
    /// while it has no command outstanding (none in flight, none held). Haechi infers
    /// "insufficient demand" from consumption because one-sided I/O is invisible to its
    /// server; here a backlogged host whose commands are merely slow to be served keeps
    /// its tokens, so others' global tokens cannot crowd it out of its reservation. The
    /// global pool is what the rest of the period can serve after the residual
    /// reservations, the credit already granted, the tokens sitting in channel caches
    /// and the work still in flight.
    fn convert(&mut self, now: Nanos) {
        let tag = self.tag();
        let paced = self.cfg.release == ReservationRelease::Paced;
        let conversion = self.cfg.mode == TokenMode::Haechi;
        if conversion && !self.converting {
            // Step S2: nothing to convert until some host has dipped into the pool.
            let avail = self.shared.global_available();
            if avail.ops < self.global_initial.ops || avail.bytes < self.global_initial.bytes {
                self.converting = true;
            }
        }
        let convert = conversion && self.converting;
        if !convert && !paced {
            return;
        }
        let (num, den) = self.left_fraction(now);
        // Paced release: a backlogged host is lagging when more of its released
        // reservation is unused than the burst plus two check intervals of schedule:
        // it is not being served at its reservation rate.
        let t = den - num;
        let release_num = t.saturating_add(self.cfg.release_burst().0).min(den);
        // Two check intervals beyond the burst: a host whose commands reach the
        // target a little late (network jitter, an initiator mirroring the schedule on
        // its own clock) is not lagging.
        let lag_slack = self
            .cfg
            .release_burst()
            .0
            .saturating_add((2 * self.cfg.check_interval.0).min(self.cfg.period.0 / 200));
        let mut closed = 0u64;
        let idle_after = self.idle_after();
        let mut outstanding = [0u64; 2];
        let mut in_flight_all = [0u64; 2];
        let mut used = [0u64; 2];
        for h in &mut self.hosts {
            let c = h.shared.counters();
            let spent = c.consumed_res.saturating_add(c.consumed_global);
            let spent_before = h.last.consumed_res.saturating_add(h.last.consumed_global);
            for r in 0..2 {
                used[r] = used[r]
                    .saturating_add(spent.get(RES[r]).saturating_sub(spent_before.get(RES[r])));
            }
            // Idle: nothing outstanding and nothing admitted for IDLE_INTERVALS check
            // intervals (a host whose commands are still on their way is not idle).
            if c.outstanding() > 0 || c.admitted_ios != h.admitted_at_tick {
                h.last_active = now;
            }
            h.admitted_at_tick = c.admitted_ios;
            let idle = now.saturating_sub(h.last_active) >= idle_after;
            let in_flight = c.in_flight();
            let pools = if h.budgets.together { 1 } else { 2 };
            let mut lag = 0u64;
            for p in 0..pools {
                for r in 0..2 {
                    let left = if convert && idle {
                        let bound = mul_div(h.period_res[p].get(RES[r]), num, den);
                        let (removed, left) = h.shared.res[p][r].cap(tag, bound);
                        self.audit.issued[r] -= removed as i128;
                        left
                    } else {
                        h.shared.res[p][r].load().1
                    };
                    let per = h.period_res[p].get(RES[r]);
                    if paced && !idle && per > 0 {
                        let unreleased = per - mul_div_ceil(per, release_num, den).min(per);
                        let usable = left.saturating_sub(unreleased);
                        if usable > mul_div(per, lag_slack, den).max(1) + h.res_slack.get(RES[r]) {
                            lag |= 1 << r;
                        }
                    }
                    outstanding[r] = outstanding[r].saturating_add(left);
                }
            }
            if h.shared.lagging.load(Ordering::Relaxed) != lag {
                h.shared.lagging.store(lag, Ordering::Release);
            }
            closed |= lag;
            let cached = c.cached_res.saturating_add(c.cached_global);
            for (r, out) in outstanding.iter_mut().enumerate() {
                *out = out
                    .saturating_add(h.shared.credit[r].load().1)
                    .saturating_add(in_flight.get(RES[r]))
                    .saturating_add(cached.get(RES[r]));
                in_flight_all[r] = in_flight_all[r].saturating_add(in_flight.get(RES[r]));
            }
        }
        self.shared.global_closed.store(closed, Ordering::Release);
        if !convert {
            return;
        }
        for r in 0..2 {
            let remaining = mul_div(self.budget.get(RES[r]), num, den);
            // Never more in a period than its budget: a target faster than its
            // configured capacity must not turn every check interval's
            // `C (T - t) - L` into fresh tokens on top of what was already spent.
            let held = outstanding[r].saturating_sub(in_flight_all[r]);
            let unspent = self
                .budget
                .get(RES[r])
                .saturating_sub(used[r])
                .saturating_sub(held);
            let g = clamp_pool(remaining.saturating_sub(outstanding[r]).min(unspent));
            if let Some(old) = self.shared.global[r].set_in_period(tag, g) {
                self.audit.issued[r] += g as i128 - old as i128;
            }
        }
    }

    /// Ends the current period at `start` (the new period's start) and arms the next.
    fn roll_over_at(&mut self, start: Nanos) -> PeriodReport {
        let mut used = Amount::ZERO;
        let mut hosts = Vec::with_capacity(self.hosts.len());
        // Per resource: a host still active at the end of the period completed less
        // than its reservation.
        let mut reservation_missed = [false; 2];
        let idle_after = self.idle_after();
        for h in &mut self.hosts {
            let now_c = h.shared.counters();
            let completed = now_c.completed.saturating_sub(h.last.completed);
            let backlogged = now_c.held_events > h.last.held_events;
            let hard = h.budgets.reservation_total();
            let met = Resource::ALL
                .iter()
                .all(|&r| completed.get(r) >= hard.get(r));
            let rec = PeriodRecord {
                epoch: self.epoch,
                completed,
                completed_ios: now_c.completed_ios - h.last.completed_ios,
                reservation: hard,
                soft_granted: h.soft_granted,
                met,
                backlogged,
            };
            let active =
                start.saturating_sub(h.last_active) < idle_after || now_c.outstanding() > 0;
            if active {
                for r in Resource::ALL {
                    if completed.get(r) < hard.get(r) {
                        reservation_missed[r.index()] = true;
                    }
                }
            }
            h.underuse.observe(met);
            let soft_total = hard.saturating_add(h.budgets.soft_extra);
            h.soft_idle
                .observe(backlogged || completed.ops.saturating_mul(2) >= soft_total.ops);
            if h.history.len() == HISTORY_PERIODS {
                h.history.pop_front();
            }
            h.history.push_back(rec);
            h.period_counts.count(met, backlogged);
            h.last = now_c;
            used = used.saturating_add(completed);
            hosts.push(rec);
        }
        let report_budget = self.budget;
        for r in Resource::ALL {
            self.estimators[r.index()].observe(used.get(r), reservation_missed[r.index()]);
        }
        let ended_epoch = self.epoch;
        let ended_start = self.period_start;
        self.start_period(start);
        PeriodReport {
            epoch: ended_epoch,
            start: ended_start,
            budget: report_budget,
            used,
            next_budget: self.budget,
            hosts,
            host_nqns: self.host_nqns(),
        }
    }

    /// Arms period `epoch + 1` starting at `start`.
    fn start_period(&mut self, start: Nanos) {
        self.epoch += 1;
        self.period_start = start;
        let tag = self.tag();
        let cap = self.cfg.capacity_per_period();
        self.budget = Amount::new(
            clamp_pool(self.estimators[0].current()),
            if cap.bytes == u64::MAX {
                POOL_MAX
            } else {
                clamp_pool(self.estimators[1].current())
            },
        );
        self.grant_soft();
        let reserved = self.hosts.iter().fold(Amount::ZERO, |a, h| {
            a.saturating_add(h.period_res[0])
                .saturating_add(h.period_res[1])
        });
        let global = self.budget.saturating_sub(reserved);
        // The global pool first, so a channel that already sees the new period finds it.
        for r in 0..2 {
            let (t, old) = self.shared.global[r].replace(tag, global.get(RES[r]));
            if t != tag {
                self.audit.expired_at_rollover[r] += old as i128;
            }
            self.audit.issued[r] += global.get(RES[r]) as i128;
            self.shared.budget[r].store(self.budget.get(RES[r]), Ordering::Release);
        }
        self.global_initial = global;
        self.converting = false;
        self.shared.global_closed.store(0, Ordering::Release);
        for h in &self.hosts {
            h.shared.lagging.store(0, Ordering::Release);
        }
        let burst = match self.cfg.release {
            ReservationRelease::Start => u64::MAX,
            ReservationRelease::Paced => self.cfg.release_burst().0,
        };
        self.shared.release_burst.store(burst, Ordering::Release);
        self.shared.epoch.store(self.epoch, Ordering::Release);
        self.shared.period_start.store(start.0, Ordering::Release);
        for i in 0..self.hosts.len() {
            self.arm_host(i, (1, 1));
        }
        let be = self.best_effort_params();
        self.detached.retain(|h| Arc::strong_count(h) > 1);
        for h in &self.detached {
            for r in 0..2 {
                let (t, old) = h.credit[r].replace(tag, 0);
                if t != tag {
                    self.audit.expired_at_rollover[r] += old as i128;
                }
            }
            h.write_params(&be);
        }
        self.refresh_all_params();
    }

    /// Fills host `i`'s pools for the current period, scaled by `num/den` of a period.
    /// Whatever the pools held before (tokens of an ended period) has expired.
    fn arm_host(&mut self, i: usize, (num, den): (u64, u64)) {
        let tag = self.tag();
        let h = &self.hosts[i];
        for r in 0..2 {
            for p in 0..2 {
                let v = clamp_pool(mul_div(h.period_res[p].get(RES[r]), num, den));
                let (_, old) = h.shared.res[p][r].replace(tag, v);
                self.audit.expired_at_rollover[r] += old as i128;
                self.audit.issued[r] += v as i128;
            }
            let (_, old) = h.shared.credit[r].replace(tag, 0);
            self.audit.expired_at_rollover[r] += old as i128;
            for c in 0..3 {
                let l = h.budgets.limit[c].get(RES[r]);
                let v = if l == UNLIMITED {
                    0
                } else {
                    clamp_pool(mul_div(l, num, den))
                };
                h.shared.limit[c][r].replace(tag, v);
            }
        }
    }

    /// Soft guarantees (seed 002): capacity beyond the hard reservations goes to soft
    /// reservations class by class, highest first; within a class in proportion to
    /// weight times the soft amount. A host that was neither backlogged nor used half of
    /// its soft total for `underuse_periods` periods in a row gets none until it is busy
    /// again, so an idle host does not pin capacity and a busy one does not thrash.
    fn grant_soft(&mut self) {
        let threshold = self.cfg.estimator.underuse_periods;
        let hard = self.hosts.iter().fold(Amount::ZERO, |a, h| {
            a.saturating_add(h.budgets.reservation_total())
        });
        let mut avail = self.budget.saturating_sub(hard);
        for h in &mut self.hosts {
            h.soft_granted = Amount::ZERO;
        }
        for class in [
            PriorityClass::Urgent,
            PriorityClass::High,
            PriorityClass::Medium,
            PriorityClass::Low,
        ] {
            let members: Vec<usize> = (0..self.hosts.len())
                .filter(|&i| {
                    let h = &self.hosts[i];
                    h.budgets.priority == class
                        && !h.budgets.soft_extra.is_zero()
                        && !h.soft_idle.flagged(threshold)
                })
                .collect();
            for r in Resource::ALL {
                let demand: u128 = members
                    .iter()
                    .map(|&i| self.hosts[i].budgets.soft_extra.get(r) as u128)
                    .sum();
                if demand == 0 {
                    continue;
                }
                let weighted: u128 = members
                    .iter()
                    .map(|&i| {
                        self.hosts[i].budgets.soft_extra.get(r) as u128
                            * self.hosts[i].budgets.weight as u128
                    })
                    .sum();
                let pot = avail.get(r) as u128;
                let mut given = 0u64;
                for &i in &members {
                    let h = &mut self.hosts[i];
                    let want = h.budgets.soft_extra.get(r);
                    let g = if demand <= pot {
                        want
                    } else {
                        ((pot * want as u128 * h.budgets.weight as u128) / weighted)
                            .min(want as u128) as u64
                    };
                    h.soft_granted.set(r, g);
                    given += g;
                }
                avail.set(r, avail.get(r).saturating_sub(given));
            }
        }
        for h in &mut self.hosts {
            h.period_res = with_soft(&h.budgets, h.soft_granted);
        }
    }

    fn best_effort_params(&self) -> HostParams {
        let batch = self.cfg.batch();
        HostParams {
            epoch: self.epoch,
            together: true,
            limit_mask: 0,
            limit: [Amount::new(UNLIMITED, UNLIMITED); 3],
            res_batch: Amount::ZERO,
            global_batch: batch,
            limit_batch: Amount::ZERO,
            capacity: self.clamp_capacity(),
            credit_cap: Amount::new(batch.ops.saturating_mul(4), batch.bytes.saturating_mul(4)),
            pool_res: [Amount::ZERO; 2],
            configured: false,
        }
    }

    fn clamp_capacity(&self) -> Amount {
        let c = self.cfg.capacity_per_period();
        Amount::new(clamp_pool(c.ops).max(1), clamp_pool(c.bytes).max(1))
    }

    /// Recomputes and publishes every host's params (batches depend on the host set).
    fn refresh_all_params(&mut self) {
        let batch = self.cfg.batch();
        let max_w = self
            .hosts
            .iter()
            .map(|h| h.budgets.weight)
            .max()
            .unwrap_or(1)
            .max(1) as u64;
        let capacity = self.clamp_capacity();
        for h in &mut self.hosts {
            let b = &h.budgets;
            let mut mask = 0u8;
            let mut limit_batch = Amount::ZERO;
            for c in BudgetClass::ALL {
                for r in Resource::ALL {
                    let l = b.limit[c as usize].get(r);
                    if l != UNLIMITED {
                        mask |= 1 << (c as usize * 2 + r.index());
                        let lb = (l / 64).clamp(1, batch.get(r));
                        limit_batch.set(r, limit_batch.get(r).max(lb));
                    }
                }
            }
            let global_batch = Amount::new(
                mul_div(batch.ops, b.weight as u64, max_w).max(1),
                mul_div(batch.bytes, b.weight as u64, max_w).max(1),
            );
            let mut res_batch = Amount::ZERO;
            for r in Resource::ALL {
                let biggest = h.period_res[0].get(r).max(h.period_res[1].get(r));
                if biggest > 0 {
                    // Small: tokens cached on a thread when the period ends are lost
                    // to the host's reservation.
                    res_batch.set(r, (biggest / 1024).clamp(1, batch.get(r)));
                }
            }
            // Channels may each hold a batch: that much unused reservation is not lag.
            h.res_slack = Amount::new(
                res_batch.ops.saturating_mul(4),
                res_batch.bytes.saturating_mul(4),
            );
            let p = HostParams {
                epoch: self.epoch,
                together: b.together,
                limit_mask: mask,
                limit: b.limit,
                res_batch,
                global_batch,
                limit_batch,
                capacity,
                credit_cap: Amount::new(
                    global_batch.ops.saturating_mul(4),
                    global_batch.bytes.saturating_mul(4),
                ),
                pool_res: h.period_res,
                configured: true,
            };
            h.shared.write_params(&p);
        }
    }

    /// Statistics for the stats RPC and the lab.
    pub fn stats(&self, now: Nanos) -> DomainStats {
        self.stats_of(now, None)
    }

    /// Statistics with only host `only` (all hosts with `None`; none when it is not
    /// configured here), so a scraper asking for one host costs one host.
    pub fn stats_of(&self, now: Nanos, only: Option<&str>) -> DomainStats {
        let elapsed = now.saturating_sub(self.period_start).min(self.cfg.period);
        let hosts = self
            .hosts
            .iter()
            .filter(|h| only.is_none_or(|n| n == h.cfg.host_nqn))
            .map(|h| {
                let c = h.shared.counters();
                let res_left = h.shared.reservation_available();
                let met = h.history.iter().filter(|r| r.met).count();
                let n = h.history.len();
                HostStats {
                    host_nqn: h.cfg.host_nqn.clone(),
                    config: h.cfg.clone(),
                    completed_this_period: c.completed.saturating_sub(h.last.completed),
                    completed_ios_this_period: c.completed_ios - h.last.completed_ios,
                    last_periods: h
                        .history
                        .iter()
                        .rev()
                        .take(16)
                        .map(|r| r.completed)
                        .collect(),
                    reservation_met_fraction: if n == 0 { 1.0 } else { met as f64 / n as f64 },
                    reservation_per_period: h.budgets.reservation_total(),
                    soft_granted: h.soft_granted,
                    reservation_tokens: res_left,
                    credit_tokens: h.shared.credit_available(),
                    limit_left: h.shared.limit_available(BudgetClass::Total),
                    held_now: c.held_now as i64,
                    underuse_flag: h.underuse.flagged(self.cfg.estimator.underuse_periods),
                    reservation_at_risk: Resource::ALL
                        .iter()
                        .any(|&r| local_shortfall(&self.cfg, res_left.get(r), r, elapsed) > 0),
                    completed_total: c.completed,
                    completed_ios_total: c.completed_ios,
                    hold_events_total: c.held_events,
                    held_time: h.shared.held_time(),
                    period_counts: h.period_counts,
                }
            })
            .collect();
        DomainStats {
            epoch: self.epoch,
            period_ns: self.cfg.period.0,
            elapsed_ns: elapsed.0,
            budget: self.budget,
            global_available: self.shared.global_available(),
            hosts,
        }
    }

    /// Every host's history of past periods (oldest first), in the order of
    /// [`Monitor::stats`]'s hosts.
    pub fn histories(&self) -> impl Iterator<Item = (&str, &VecDeque<PeriodRecord>)> {
        self.hosts
            .iter()
            .map(|h| (h.cfg.host_nqn.as_str(), &h.history))
    }
}

/// A host's reservation per pool for a period: the hard reservation plus its soft
/// grant, which is split between the read and write pools like the hard one.
fn with_soft(b: &HostBudgets, soft: Amount) -> [Amount; 2] {
    let mut pr = b.reservation;
    if b.together {
        pr[0] = pr[0].saturating_add(soft);
        return pr;
    }
    for r in Resource::ALL {
        let (rd, wr) = (b.reservation[0].get(r), b.reservation[1].get(r));
        let g = soft.get(r);
        let to_read = if rd.saturating_add(wr) == 0 {
            g / 2
        } else {
            mul_div(g, rd, rd + wr)
        };
        pr[0].set(r, rd.saturating_add(to_read));
        pr[1].set(r, wr.saturating_add(g - to_read));
    }
    pr
}

fn adjust_pool(pool: &crate::sync::TokenPool, tag: u16, delta: i128, issued: &mut i128) {
    if delta > 0 {
        if pool.give(tag, delta as u64) {
            *issued += delta;
        }
    } else if delta < 0 {
        let taken = pool.take(tag, (-delta) as u64);
        *issued -= taken as i128;
    }
}

fn make_estimators(cfg: &DomainConfig) -> [CapacityEstimator; 2] {
    let cap = cfg.capacity_per_period();
    [
        CapacityEstimator::new(
            &cfg.estimator,
            cap.ops,
            cfg.per_period(cfg.capacity.iops_stddev),
        ),
        CapacityEstimator::new(
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
        ),
    ]
}

const RES: [Resource; 2] = [Resource::Ops, Resource::Bytes];

/// Statistics of a domain.
#[derive(Debug, Clone, Serialize)]
pub struct DomainStats {
    pub epoch: u64,
    pub period_ns: u64,
    pub elapsed_ns: u64,
    /// Capacity estimate for this period (tokens per period).
    pub budget: Amount,
    pub global_available: Amount,
    pub hosts: Vec<HostStats>,
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
    /// Admission attempts that found no tokens or no limit allowance (monotonic; a
    /// held command counts once per attempt).
    pub hold_events_total: u64,
    /// Time its commands spent held, as a histogram (monotonic).
    pub held_time: crate::histogram::HeldTimeSnapshot,
    /// Ended periods by outcome (monotonic).
    pub period_counts: PeriodCounts,
}
