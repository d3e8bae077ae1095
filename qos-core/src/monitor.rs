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

use crate::admission::{AdmissionError, AdmissionReport, check_grouped_admission, local_shortfall};
use crate::config::{
    BudgetClass, ConfigError, DomainConfig, ExcessSharing, GroupBudgets, GroupConfig, HostBudgets,
    HostConfig, PriorityClass, ReservationRelease, TokenMode, UNLIMITED,
};
use crate::cost::{Amount, Resource};
use crate::estimator::{CapacityEstimator, EstimateStep, Evidence, UnderuseCounter};
use crate::ledger::{
    ChannelTokens, CounterSnapshot, DomainShared, HostParams, HostShared, clamp_pool,
};
use crate::share::{Claim, water_fill};
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

/// Ended periods whose estimator decisions are kept ([`Monitor::estimator_log`]).
pub const ESTIMATOR_LOG_PERIODS: usize = 64;

/// Hosts whose next-period pools a check interval arms at least (more when the period
/// has too few check intervals for all hosts to be armed by its middle).
const ARM_AHEAD_PER_TICK: usize = 64;

/// What the capacity estimator saw and did at the end of one period (operations), so an
/// operator can see why the estimate moved.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct EstimatorRecord {
    pub epoch: u64,
    /// The estimate that sized the period.
    pub budget: u64,
    /// Work completed by all hosts.
    pub used: u64,
    /// `used` plus what weighted sharing had handed out and the hosts still held.
    pub offered: u64,
    pub evidence: Evidence,
    pub step: EstimateStep,
    /// The estimate for the next period (after the floor of the reservations).
    pub next: u64,
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
    #[error("group {0} does not exist in this domain; create it first (qos_group_create)")]
    UnknownGroup(String),
}

#[derive(Debug, Error)]
pub enum UpdateHostError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Admission(#[from] AdmissionError),
    #[error("host {0} is not configured in this domain")]
    Unknown(String),
    #[error("group {0} does not exist in this domain; create it first (qos_group_create)")]
    UnknownGroup(String),
}

#[derive(Debug, Error)]
#[error("host {0} is not configured in this domain")]
pub struct RemoveHostError(pub String);

#[derive(Debug, Error)]
pub enum AddGroupError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Admission(#[from] AdmissionError),
    #[error("group {0} already exists in this domain; update it instead")]
    Duplicate(String),
    #[error("tenant groups need weighted sharing; set the domain's sharing to weighted first")]
    NeedsWeightedSharing,
}

#[derive(Debug, Error)]
pub enum UpdateGroupError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Admission(#[from] AdmissionError),
    #[error("group {0} does not exist in this domain")]
    Unknown(String),
}

#[derive(Debug, Error)]
pub enum RemoveGroupError {
    #[error("group {0} does not exist in this domain")]
    Unknown(String),
    #[error(
        "group {group} still has hosts ({}); move them out first (qos_host_set without --group, or with another group)",
        .hosts.join(", ")
    )]
    HasHosts { group: String, hosts: Vec<String> },
}

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
    #[error("the domain has tenant groups, which need weighted sharing; delete them first")]
    GroupsNeedWeightedSharing,
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
    /// Per host, in the order of `host_nqns` (shared with the monitor's history).
    pub hosts: std::sync::Arc<Vec<PeriodRecord>>,
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
    /// Commands admitted, and refusals, as of the previous conversion tick.
    admitted_at_tick: u64,
    held_at_tick: u64,
    /// When it last had a command outstanding or admitted one.
    last_active: Nanos,
    /// Unused reservation its channels may hold in caches: not counted as lag.
    res_slack: Amount,
    /// `period_res` as last published in its params.
    published_res: [Amount; 2],
    /// The epoch it was added in: older history frames are of an earlier host of the
    /// same name.
    since_epoch: u64,
    /// Index of its group in `Monitor::groups`.
    group: Option<usize>,
    /// Idle at the last check interval (its unused reservation may be converted).
    idle: bool,
    /// Check intervals of this period in which it was busy, and in which it lagged
    /// behind its reservation schedule.
    ticks_active: u32,
    lag_ticks: u32,
    /// Commands admitted and not completed: the most seen lately (decaying), and
    /// whether it had (nearly) that many out at the last check interval with none
    /// held: a closed loop at its queue depth, bounded by the target's latency.
    peak_in_flight: u64,
    window_bound: bool,
    /// Weighted sharing: most credit it may hold, and its counters at the last share.
    share_cap: Amount,
    share_batch: Amount,
    share_seen_global: [u64; 2],
    share_seen_res: [u64; 2],
    share_seen_held: u64,
    /// Fractions of a token (fixed point) owed to it by earlier shares.
    share_carry: [u64; 2],
    /// Global tokens given to it this period (its share of the excess, and of its
    /// group's surplus reservation).
    excess_granted: Amount,
    /// Ended periods since the host was added, by outcome (monotonic).
    period_counts: PeriodCounts,
    /// Closing the pool for it did not help: it lagged all of a period with the pool
    /// closed on its account and still missed its reservation (its queue depth cannot
    /// carry it at this target's latency). For this many more periods its lag does not
    /// close the pool to the others; `unreachable_backoff` doubles (2 ..= 16) each time
    /// a probe confirms it and resets when it meets its reservation.
    unreachable_periods: u32,
    unreachable_backoff: u32,
    /// It completed its reservation in the last ended period.
    met_last_period: bool,
    /// While its reservation is unreachable: what it completed in the period that
    /// showed it, with the pool closed to everybody else (the most it can do), less a
    /// sixteenth. It is served as its reservation until the next probe.
    reach: Amount,
    /// What its pools of the next period were armed with ahead of the roll-over, if
    /// they were: the roll-over re-arms them only when this no longer matches.
    armed_ahead: Option<ArmedPools>,
}

impl HostEntry {
    /// What its pools of period `epoch` are armed with, from its reservation and
    /// limits as they stand.
    fn pools_for(&self, epoch: u64) -> ArmedPools {
        ArmedPools {
            epoch,
            res: self.period_res,
            limit: self.budgets.limit,
        }
    }
}

/// The amounts a host's pools of one period were armed with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ArmedPools {
    epoch: u64,
    res: [Amount; 2],
    limit: [Amount; 3],
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

/// A tenant group of the domain.
#[derive(Debug)]
struct GroupEntry {
    cfg: GroupConfig,
    budgets: GroupBudgets,
    /// The group's reservation beyond its hosts' own, per period (guaranteed to its
    /// hosts together, released paced and split by weight among the backlogged ones).
    surplus: Amount,
    /// Of `surplus`, what was released so far this period.
    surplus_released: [u64; 2],
    /// Tokens given to its hosts this period beyond their own reservations: counted
    /// against the group's limit.
    given: [u64; 2],
}

/// Shares are computed in 1/65536 of a token.
const FIXED_SHIFT: u32 = 16;

fn fixed(tokens: u64) -> u64 {
    tokens.saturating_mul(1 << FIXED_SHIFT)
}

/// Who a top-level claim of the weighted share stands for.
#[derive(Debug, Clone, Copy)]
enum Owner {
    Group(usize),
    Host(usize),
}

/// Scratch space of the weighted share, kept between check intervals.
#[derive(Debug, Default)]
struct ShareScratch {
    /// Per host: what it claims in the share, and what it can take now (room under its
    /// credit cap).
    demand: Vec<u64>,
    room: Vec<u64>,
    claims: Vec<Claim>,
    owners: Vec<Owner>,
    parts: Vec<u64>,
    members: Vec<usize>,
    member_claims: Vec<Claim>,
    member_parts: Vec<u64>,
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

impl Audit {
    /// Books the `old` tokens of tag `was` that arming a pool for period `tag` replaced:
    /// the same period's (armed ahead, armed again) were never handed out; another
    /// period's are an ended period's leftovers, expired.
    fn rearmed(&mut self, r: usize, tag: u16, was: u16, old: u64) {
        if was == tag {
            self.issued[r] -= old as i128;
        } else {
            self.expired_at_rollover[r] += old as i128;
        }
    }
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
    groups: Vec<GroupEntry>,
    /// When the weighted share last ran, and what it still owes the hosts (positive)
    /// or they owe it (negative), per resource, in fixed point.
    last_share: Nanos,
    share_balance: [i128; 2],
    /// Per resource, intervals of this period in which the weighted share ran, and in
    /// which the hosts claimed all of it (demand beyond what the target was offering).
    share_ticks: [[u32; 2]; 2],
    /// Bit r: some backlogged host lagged behind its reservation in resource r at some
    /// check interval of this period.
    lag_seen: u64,
    /// Check intervals of this period (conversion ticks).
    period_ticks: u32,
    /// Hosts before this index have their pools of the next period armed (or were
    /// passed over by a removal and are armed at the roll-over).
    arm_cursor: usize,
    scratch: ShareScratch,
    /// The last [`HISTORY_PERIODS`] ended periods, oldest first.
    history: VecDeque<HistoryFrame>,
    /// The estimator's decisions of the last [`ESTIMATOR_LOG_PERIODS`] periods, oldest first.
    estimator_log: VecDeque<EstimatorRecord>,
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
            groups: Vec::new(),
            last_share: now,
            share_balance: [0; 2],
            share_ticks: [[0; 2]; 2],
            lag_seen: 0,
            period_ticks: 0,
            arm_cursor: 0,
            scratch: ShareScratch::default(),
            history: VecDeque::with_capacity(HISTORY_PERIODS),
            estimator_log: VecDeque::with_capacity(ESTIMATOR_LOG_PERIODS),
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
    pub fn history(&self, nqn: &str) -> Option<Vec<PeriodRecord>> {
        self.find(nqn)
            .map(|i| self.records_of(i).copied().collect())
    }

    /// Host `i`'s records in the history frames, oldest first.
    fn records_of(&self, i: usize) -> impl DoubleEndedIterator<Item = &PeriodRecord> + '_ {
        let h = &self.hosts[i];
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

    /// Admission check of the current host and group set with one host (with its
    /// group) and/or one group replaced or added.
    fn admit(
        &self,
        host: Option<(&str, &HostBudgets, Option<&str>)>,
        group: Option<(&str, &GroupBudgets)>,
    ) -> Result<AdmissionReport, AdmissionError> {
        let mut list: Vec<(&str, &HostBudgets, Option<&str>)> = self
            .hosts
            .iter()
            .filter(|h| host.is_none_or(|(n, _, _)| n != h.cfg.host_nqn))
            .map(|h| (h.cfg.host_nqn.as_str(), &h.budgets, h.cfg.group.as_deref()))
            .collect();
        if let Some(r) = host {
            list.push(r);
        }
        let mut groups: Vec<(&str, &GroupBudgets)> = self
            .groups
            .iter()
            .filter(|g| group.is_none_or(|(n, _)| n != g.cfg.name))
            .map(|g| (g.cfg.name.as_str(), &g.budgets))
            .collect();
        if let Some(g) = group {
            groups.push(g);
        }
        check_grouped_admission(&self.cfg, list, &groups)
    }

    /// Admission report of the current host set.
    pub fn admission(&self) -> Result<AdmissionReport, AdmissionError> {
        self.admit(None, None)
    }

    fn find_group(&self, name: &str) -> Option<usize> {
        self.groups.iter().position(|g| g.cfg.name == name)
    }

    /// The groups' settings, in creation order.
    pub fn group_configs(&self) -> impl Iterator<Item = &GroupConfig> {
        self.groups.iter().map(|g| &g.cfg)
    }

    /// Creates a tenant group. Its reservation is set aside from the next check
    /// interval on (the global pool is recomputed then).
    pub fn add_group(&mut self, cfg: GroupConfig, now: Nanos) -> Result<(), AddGroupError> {
        self.clock.observe(now);
        if self.cfg.sharing != ExcessSharing::Weighted {
            return Err(AddGroupError::NeedsWeightedSharing);
        }
        if self.find_group(&cfg.name).is_some() {
            return Err(AddGroupError::Duplicate(cfg.name));
        }
        let budgets = cfg.budgets(&self.cfg)?;
        self.admit(None, Some((&cfg.name, &budgets)))?;
        self.groups.push(GroupEntry {
            cfg,
            budgets,
            surplus: Amount::ZERO,
            surplus_released: [0; 2],
            given: [0; 2],
        });
        self.refresh_groups();
        Ok(())
    }

    /// Changes a group's reservation, limit or weight in place.
    pub fn update_group(&mut self, cfg: GroupConfig, now: Nanos) -> Result<(), UpdateGroupError> {
        self.clock.observe(now);
        let g = self
            .find_group(&cfg.name)
            .ok_or_else(|| UpdateGroupError::Unknown(cfg.name.clone()))?;
        let budgets = cfg.budgets(&self.cfg)?;
        self.admit(None, Some((&cfg.name, &budgets)))?;
        self.groups[g].cfg = cfg;
        self.groups[g].budgets = budgets;
        self.refresh_groups();
        Ok(())
    }

    /// Deletes a group that has no hosts left.
    pub fn remove_group(&mut self, name: &str, now: Nanos) -> Result<(), RemoveGroupError> {
        self.clock.observe(now);
        let g = self
            .find_group(name)
            .ok_or_else(|| RemoveGroupError::Unknown(name.to_string()))?;
        let hosts: Vec<String> = self
            .hosts
            .iter()
            .filter(|h| h.group == Some(g))
            .map(|h| h.cfg.host_nqn.clone())
            .collect();
        if !hosts.is_empty() {
            return Err(RemoveGroupError::HasHosts {
                group: name.to_string(),
                hosts,
            });
        }
        self.groups.remove(g);
        self.refresh_groups();
        Ok(())
    }

    /// Re-resolves every host's group index and each group's surplus reservation
    /// (after any change of hosts or groups).
    fn refresh_groups(&mut self) {
        for g in &mut self.groups {
            g.surplus = g.budgets.reservation;
        }
        for h in &mut self.hosts {
            h.group = h
                .cfg
                .group
                .as_deref()
                .and_then(|n| self.groups.iter().position(|g| g.cfg.name == n));
            if let Some(g) = h.group {
                let s = &mut self.groups[g].surplus;
                *s = s.saturating_sub(h.budgets.reservation_total());
            }
        }
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
        if let Some(g) = cfg.group.as_deref()
            && self.find_group(g).is_none()
        {
            return Err(AddHostError::UnknownGroup(g.to_string()));
        }
        self.admit(Some((&cfg.host_nqn, &budgets, cfg.group.as_deref())), None)?;
        let id = self.next_host_id;
        self.next_host_id += 1;
        let shared = Arc::new(HostShared::new(
            id,
            cfg.host_nqn.clone(),
            self.shared.clone(),
            &HostParams::default(),
            self.tag(),
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
            held_at_tick: 0,
            last_active: now,
            res_slack: Amount::ZERO,
            published_res: [Amount::ZERO; 2],
            since_epoch: self.epoch,
            period_counts: PeriodCounts::default(),
            group: None,
            idle: false,
            ticks_active: 0,
            lag_ticks: 0,
            peak_in_flight: 0,
            window_bound: false,
            share_cap: Amount::ZERO,
            share_batch: Amount::ZERO,
            share_seen_global: [0; 2],
            share_seen_res: [0; 2],
            share_seen_held: 0,
            share_carry: [0; 2],
            excess_granted: Amount::ZERO,
            unreachable_periods: 0,
            unreachable_backoff: 0,
            met_last_period: false,
            reach: Amount::ZERO,
            armed_ahead: None,
        });
        self.nqns_cache = None;
        self.refresh_groups();
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
        if let Some(g) = cfg.group.as_deref()
            && self.find_group(g).is_none()
        {
            return Err(UpdateHostError::UnknownGroup(g.to_string()));
        }
        self.admit(Some((&cfg.host_nqn, &budgets, cfg.group.as_deref())), None)?;
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
        self.refresh_groups();
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
        // Pools armed ahead for the next period are taken back: a detached host has
        // no reservation (the roll-over arms only its credit).
        let next = (self.epoch + 1) as u16;
        for r in 0..2 {
            for pool in [
                &h.shared.res[0][r],
                &h.shared.res[1][r],
                &h.shared.credit[r],
            ] {
                let (t, c) = pool.replace(next, 0);
                self.audit.rearmed(r, next, t, c);
            }
        }
        h.shared.write_params(&self.best_effort_params());
        self.detached.push(h.shared);
        self.refresh_groups();
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
        if cfg.sharing != ExcessSharing::Weighted && !self.groups.is_empty() {
            return Err(UpdateDomainError::GroupsNeedWeightedSharing);
        }
        let mut group_budgets = Vec::with_capacity(self.groups.len());
        for g in &self.groups {
            group_budgets.push(
                g.cfg
                    .budgets(&cfg)
                    .map_err(|source| UpdateDomainError::Host {
                        host: format!("group {}", g.cfg.name),
                        source,
                    })?,
            );
        }
        let groups: Vec<(&str, &GroupBudgets)> = self
            .groups
            .iter()
            .zip(&group_budgets)
            .map(|(g, b)| (g.cfg.name.as_str(), b))
            .collect();
        check_grouped_admission(
            &cfg,
            self.hosts
                .iter()
                .zip(&budgets)
                .map(|(h, b)| (h.cfg.host_nqn.as_str(), b, h.cfg.group.as_deref())),
            &groups,
        )?;
        let capacity_changed = cfg.capacity != self.cfg.capacity
            || cfg.period != self.cfg.period
            || cfg.sharing != self.cfg.sharing;
        self.cfg = cfg;
        if capacity_changed {
            self.estimators = make_estimators(&self.cfg);
        }
        for (h, b) in self.hosts.iter_mut().zip(budgets) {
            h.budgets = b;
        }
        for (g, b) in self.groups.iter_mut().zip(group_budgets) {
            g.budgets = b;
        }
        self.refresh_groups();
        self.shared
            .period
            .store(self.cfg.period.0, Ordering::Release);
        self.shared.conversion.store(
            (self.cfg.mode == TokenMode::Haechi) as u64,
            Ordering::Release,
        );
        self.roll_over_at(now);
        self.refresh_all_params();
        for h in &self.detached {
            h.write_params(&self.best_effort_params());
        }
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
            self.arm_ahead();
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
        let weighted = self.cfg.sharing == ExcessSharing::Weighted;
        // Weighted sharing moves global tokens to the hosts itself: always convert.
        if conversion && weighted {
            self.converting = true;
        }
        if conversion && !self.converting {
            // Step S2: nothing to convert until some host has dipped into the pool.
            let avail = self.shared.global_available();
            if avail.ops < self.global_initial.ops || avail.bytes < self.global_initial.bytes {
                self.converting = true;
            }
        }
        let convert = conversion && self.converting;
        if !convert && !paced && !weighted {
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
        self.period_ticks += 1;
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
            // A command refused since the last tick counts too: the host is asking.
            if c.outstanding() > 0
                || c.admitted_ios != h.admitted_at_tick
                || c.held_events != h.held_at_tick
            {
                h.last_active = now;
            }
            h.admitted_at_tick = c.admitted_ios;
            h.held_at_tick = c.held_events;
            let idle = now.saturating_sub(h.last_active) >= idle_after;
            h.idle = idle;
            h.ticks_active += !idle as u32;
            let in_flight_ios = c.admitted_ios.saturating_sub(c.completed_ios);
            h.peak_in_flight = in_flight_ios.max(h.peak_in_flight - h.peak_in_flight / 256);
            h.window_bound = !idle
                && c.held_now == 0
                && in_flight_ios >= 2
                && in_flight_ios * 4 >= h.peak_in_flight * 3;
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
                        h.shared.res[p][r].count(tag)
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
            h.lag_ticks += (lag != 0) as u32;
            if h.shared.lagging.load(Ordering::Relaxed) != lag {
                h.shared.lagging.store(lag, Ordering::Release);
            }
            closed |= lag;
            let cached = c.cached_res.saturating_add(c.cached_global);
            for (r, out) in outstanding.iter_mut().enumerate() {
                *out = out
                    .saturating_add(h.shared.credit[r].count(tag))
                    .saturating_add(in_flight.get(RES[r]))
                    .saturating_add(cached.get(RES[r]));
                in_flight_all[r] = in_flight_all[r].saturating_add(in_flight.get(RES[r]));
            }
        }
        self.shared.global_closed.store(closed, Ordering::Release);
        self.lag_seen |= closed;
        // Group reservations not released yet are promised, like hosts' residuals.
        for g in &self.groups {
            for (r, out) in outstanding.iter_mut().enumerate() {
                *out = out.saturating_add(mul_div(g.surplus.get(RES[r]), num, den));
            }
        }
        if convert {
            self.set_global_pool(num, den, outstanding, in_flight_all, used);
        }
        if weighted {
            self.share_excess(now, (num, den), closed);
        }
    }

    /// The global pool becomes what the rest of the period can serve beyond what is
    /// promised or in flight (`outstanding`), and never more than the period's unspent
    /// budget.
    fn set_global_pool(
        &mut self,
        num: u64,
        den: u64,
        outstanding: [u64; 2],
        in_flight_all: [u64; 2],
        used: [u64; 2],
    ) {
        let tag = self.tag();
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
            // Weighted sharing paces the pool by the target's rate itself, so the pool
            // only bounds the period: work in flight is not subtracted again (it
            // would leave the last intervals of every period without a slice).
            let promised = if self.cfg.sharing == ExcessSharing::Weighted {
                held
            } else {
                outstanding[r]
            };
            let g = clamp_pool(remaining.saturating_sub(promised).min(unspent));
            if let Some(old) = self.shared.global[r].set_in_period(tag, g) {
                self.audit.issued[r] += g as i128 - old as i128;
            }
        }
    }

    /// Weighted sharing (one check interval): what the target can serve in the next
    /// interval beyond what reservations used in the last one (never more than the
    /// global pool) is split by weighted max-min fairness into the hosts' credit: first
    /// each group's surplus reservation among its hosts, then the slice among groups
    /// and lone hosts by their weights, then each group's part among its hosts by
    /// theirs, within the group's limit. A host's claim is what it can hold while it has
    /// commands held (it is backlogged); unbounded while all its commands are out (a
    /// closed loop at its queue depth, which would go faster on a less busy target);
    /// else twice what it took in the last interval plus a batch (so it can grow). A
    /// host that wants less leaves the rest to the others. While a backlogged host lags
    /// behind its reservation, only lagging hosts get anything (reservations first).
    /// Shares are computed in 1/65536 of a token and the fractions carried per host, so
    /// small slices still split by weight.
    fn share_excess(&mut self, now: Nanos, (num, den): (u64, u64), closed: u64) {
        let dt = now.saturating_sub(self.last_share).0;
        self.last_share = now;
        let mask = self.shared.weighted.load(Ordering::Relaxed);
        if dt == 0 || mask == 0 {
            return;
        }
        let tag = self.tag();
        let elapsed = den - num;
        let burst = self.cfg.release_burst().0;
        let mut sc = std::mem::take(&mut self.scratch);
        let snaps: Vec<CounterSnapshot> = self.hosts.iter().map(|h| h.shared.counters()).collect();
        let mut res_used = [0u64; 2];
        for (h, c) in self.hosts.iter().zip(&snaps) {
            for (r, used) in res_used.iter_mut().enumerate() {
                *used += c
                    .consumed_res
                    .get(RES[r])
                    .saturating_sub(h.share_seen_res[r]);
            }
        }
        for r in 0..2 {
            if mask & (1 << r) == 0 {
                continue;
            }
            sc.demand.clear();
            sc.room.clear();
            for (h, c) in self.hosts.iter().zip(&snaps) {
                let lag_ok = closed & (1 << r) == 0
                    || h.shared.lagging.load(Ordering::Relaxed) & (1 << r) != 0;
                if h.idle || !lag_ok {
                    sc.demand.push(0);
                    sc.room.push(0);
                    continue;
                }
                let took = c.consumed_global.get(RES[r]) - h.share_seen_global[r];
                let held = c.held_now > 0 || c.held_events != h.share_seen_held;
                let have = h.shared.credit[r]
                    .count(tag)
                    .saturating_add(c.cached_global.get(RES[r]));
                let room = h.share_cap.get(RES[r]).saturating_sub(have);
                // Its limit, beyond its reservation, bounds what it can use.
                let headroom = if h.budgets.is_limited(BudgetClass::Total, RES[r]) {
                    let l = h.budgets.limit[BudgetClass::Total as usize].get(RES[r]);
                    let own = h.period_res[0].get(RES[r]) + h.period_res[1].get(RES[r]);
                    mul_div(l.saturating_sub(own), 2 * dt, den)
                        .saturating_add(h.share_batch.get(RES[r]))
                } else {
                    u64::MAX
                };
                let want = if held {
                    room
                } else if h.window_bound {
                    // What it cannot take now goes to nobody this interval: otherwise
                    // hosts with deeper queues take it, keep the target busy, and the
                    // excess follows queue depth.
                    u64::MAX
                } else {
                    took.saturating_mul(2)
                        .saturating_add(h.share_batch.get(RES[r]))
                        .min(room)
                };
                sc.demand.push(fixed(want.min(headroom)));
                sc.room.push(fixed(room.min(headroom)));
            }
            // Each group's surplus reservation, released paced, to its own hosts.
            let mut surplus_given = 0u64;
            for g in 0..self.groups.len() {
                let surplus = self.groups[g].surplus.get(RES[r]);
                if surplus == 0 {
                    continue;
                }
                let due = mul_div_ceil(surplus, elapsed.saturating_add(burst).min(den), den);
                let slice = due.saturating_sub(self.groups[g].surplus_released[r]);
                self.groups[g].surplus_released[r] = due.max(self.groups[g].surplus_released[r]);
                if slice == 0 {
                    continue;
                }
                let given = self.fill_group(g, r, fixed(slice), tag, &mut sc, false);
                surplus_given += given;
                // What nobody of the group can use now joins the unreserved pool.
                self.move_global(r, (fixed(slice) - given) as i128 >> FIXED_SHIFT);
            }
            // The slice, in fixed point: the target's capacity over the interval less
            // what reservations used, plus what earlier intervals owe (reservations
            // that ran ahead are paid back; fractions are kept).
            let tick_fp = (self.budget.get(RES[r]) as i128)
                .saturating_mul(dt as i128)
                .saturating_mul(1 << FIXED_SHIFT)
                / den as i128;
            let balance = self.share_balance[r] + tick_fp
                - fixed(res_used[r]) as i128
                - surplus_given as i128;
            let pool = self.shared.global[r].load().1;
            let pot = balance.clamp(0, fixed(pool) as i128) as u64;
            if pot == 0 {
                self.share_balance[r] = balance.clamp(-tick_fp, 0);
                continue;
            }
            sc.claims.clear();
            sc.owners.clear();
            for (g, ge) in self.groups.iter().enumerate() {
                let lim = ge.budgets.limit.get(RES[r]);
                let room = if lim == UNLIMITED {
                    u64::MAX
                } else {
                    let own: u64 = self
                        .hosts
                        .iter()
                        .filter(|h| h.group == Some(g))
                        .map(|h| h.period_res[0].get(RES[r]) + h.period_res[1].get(RES[r]))
                        .sum();
                    let allowed = mul_div(
                        lim.saturating_sub(own),
                        elapsed.saturating_add(burst).min(den),
                        den,
                    );
                    allowed.saturating_sub(ge.given[r])
                };
                let want = self
                    .hosts
                    .iter()
                    .zip(&sc.demand)
                    .filter(|(h, _)| h.group == Some(g))
                    .fold(0u64, |a, (_, &d)| a.saturating_add(d));
                sc.claims.push(Claim {
                    weight: ge.budgets.weight as u64,
                    demand: want.min(fixed(room)),
                });
                sc.owners.push(Owner::Group(g));
            }
            for (i, h) in self.hosts.iter().enumerate() {
                if h.group.is_none() {
                    sc.claims.push(Claim {
                        weight: h.budgets.weight as u64,
                        demand: sc.demand[i],
                    });
                    sc.owners.push(Owner::Host(i));
                }
            }
            sc.parts.clear();
            sc.parts.resize(sc.claims.len(), 0);
            let unclaimed = water_fill(pot, &sc.claims, &mut sc.parts);
            self.share_ticks[r][0] += 1;
            if unclaimed == 0 {
                self.share_ticks[r][1] += 1;
            }
            // What nobody claimed is not owed to anyone later.
            self.share_balance[r] =
                (balance - (pot - unclaimed) as i128).clamp(-tick_fp, tick_fp.max(0));
            for k in 0..sc.owners.len() {
                let part = sc.parts[k];
                if part == 0 {
                    continue;
                }
                match sc.owners[k] {
                    Owner::Group(g) => {
                        self.fill_group(g, r, part, tag, &mut sc, true);
                    }
                    Owner::Host(i) => {
                        self.grant(i, r, part.min(sc.room[i]), tag, true);
                    }
                }
            }
        }
        for (h, c) in self.hosts.iter_mut().zip(&snaps) {
            h.share_seen_global = [c.consumed_global.ops, c.consumed_global.bytes];
            h.share_seen_res = [c.consumed_res.ops, c.consumed_res.bytes];
            h.share_seen_held = c.held_events;
        }
        self.scratch = sc;
    }

    /// Splits `amount` (fixed point) of resource `r` among group `g`'s hosts by weight
    /// and their claims, from the global pool when `from_global`, else newly issued
    /// (the group's surplus reservation). Returns what it gave (fixed point).
    fn fill_group(
        &mut self,
        g: usize,
        r: usize,
        amount: u64,
        tag: u16,
        sc: &mut ShareScratch,
        from_global: bool,
    ) -> u64 {
        sc.members.clear();
        sc.member_claims.clear();
        for (i, h) in self.hosts.iter().enumerate() {
            if h.group == Some(g) {
                sc.members.push(i);
                sc.member_claims.push(Claim {
                    weight: h.budgets.weight as u64,
                    demand: sc.demand[i],
                });
            }
        }
        sc.member_parts.clear();
        sc.member_parts.resize(sc.members.len(), 0);
        water_fill(amount, &sc.member_claims, &mut sc.member_parts);
        let mut given = 0;
        for k in 0..sc.members.len() {
            let (i, part) = (sc.members[k], sc.member_parts[k]);
            let share = part.min(sc.room[i]);
            let got = self.grant(i, r, share, tag, from_global);
            sc.demand[i] = sc.demand[i].saturating_sub(share);
            sc.room[i] = sc.room[i].saturating_sub(share);
            self.groups[g].given[r] += got;
            given += share;
        }
        given
    }

    /// Gives host `i` its `part` (fixed point) of resource `r` as credit: the whole
    /// tokens of it plus its carried fraction, from the global pool or newly issued.
    /// Returns the whole tokens given.
    fn grant(&mut self, i: usize, r: usize, part: u64, tag: u16, from_global: bool) -> u64 {
        let h = &mut self.hosts[i];
        let exact = part.saturating_add(h.share_carry[r]);
        let want = exact >> FIXED_SHIFT;
        h.share_carry[r] = exact & ((1 << FIXED_SHIFT) - 1);
        if want == 0 {
            return 0;
        }
        let got = if from_global {
            self.shared.global[r].take(tag, want)
        } else {
            want
        };
        if got == 0 {
            return 0;
        }
        if !h.shared.credit[r].give(tag, got) {
            if from_global {
                self.shared.global[r].give(tag, got);
            }
            return 0;
        }
        if !from_global {
            self.audit.issued[r] += got as i128;
        }
        h.excess_granted
            .set(RES[r], h.excess_granted.get(RES[r]) + got);
        got
    }

    /// Ends the current period at `start` (the new period's start) and arms the next.
    fn roll_over_at(&mut self, start: Nanos) -> PeriodReport {
        let mut used = Amount::ZERO;
        let mut hosts = Vec::with_capacity(self.hosts.len());
        // Per resource: a host still active at the end of the period completed less
        // than its reservation.
        let mut reservation_missed = [false; 2];
        // A host busy all period, lagging at some point, missed its reservation.
        let mut starved = [false; 2];
        let mut hosts_changed = false;
        let mut offered_unused = Amount::ZERO;
        let idle_after = self.idle_after();
        let mut in_vain = Vec::new();
        for (idx, h) in self.hosts.iter_mut().enumerate() {
            let now_c = h.shared.counters();
            if self.cfg.sharing == ExcessSharing::Weighted {
                offered_unused = offered_unused
                    .saturating_add(h.shared.credit_available())
                    .saturating_add(now_c.cached_global);
            }
            let completed = now_c.completed.saturating_sub(h.last.completed);
            let backlogged = now_c.held_events > h.last.held_events;
            let hard = h.budgets.reservation_total();
            if self.cfg.sharing == ExcessSharing::Weighted && h.unreachable_periods > 0 {
                // The part of its reservation it cannot reach was offered and left:
                // without it the budget would stay at the reservations (they are
                // what the estimate is held at) and nobody could have the rest.
                offered_unused = offered_unused.saturating_add(hard.saturating_sub(completed));
            }
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
            // Busy at every check interval of the period (or idle at all of them): a
            // host that started or stopped during it makes the period no measurement.
            let whole = h.ticks_active + 1 >= self.period_ticks;
            if h.ticks_active > 0 && !whole {
                hosts_changed = true;
            }
            let mut lagged_in_vain = false;
            if active {
                for r in Resource::ALL {
                    if completed.get(r) < hard.get(r) {
                        reservation_missed[r.index()] = true;
                        // A host known not to reach its reservation even with the
                        // pool closed (until it meets it again) is no evidence about
                        // the target's capacity.
                        if whole && h.lag_ticks > 0 && h.unreachable_backoff == 0 {
                            starved[r.index()] = true;
                        }
                        // Lagging at nine check intervals of ten closed the pool to
                        // everybody else nearly all period: if it still fell more than
                        // 1 % short, its own queue depth bounds it, not the others.
                        if whole
                            && h.unreachable_periods == 0
                            && h.lag_ticks * 10 >= self.period_ticks * 9
                            && completed.get(r).saturating_mul(100) < hard.get(r).saturating_mul(99)
                        {
                            lagged_in_vain = true;
                        }
                    }
                }
            }
            if lagged_in_vain {
                // Decided after the estimator: if the target's capacity dropped in this
                // period, the drop explains the miss, not the host's queue depth.
                in_vain.push((idx, completed, h.met_last_period));
            } else if met || !active {
                h.unreachable_backoff = 0;
                h.unreachable_periods = 0;
            } else {
                h.unreachable_periods = h.unreachable_periods.saturating_sub(1);
            }
            h.met_last_period = met;
            h.underuse.observe(met);
            let soft_total = hard.saturating_add(h.budgets.soft_extra);
            h.soft_idle
                .observe(backlogged || completed.ops.saturating_mul(2) >= soft_total.ops);
            h.period_counts.count(met, backlogged);
            h.last = now_c;
            used = used.saturating_add(completed);
            hosts.push(rec);
        }
        let report_budget = self.budget;
        let mut dropped = false;
        for r in Resource::ALL {
            let i = r.index();
            // A reservation missed by a host that kept commands coming, in a period in
            // which some backlogged host lagged behind its schedule: the target served
            // less than it was asked, so what it served is its capacity now. Or, with
            // weighted sharing: the hosts claimed every slice they were offered in nine
            // intervals of ten (their demand exceeded the offer all period long).
            let [ran, claimed] = self.share_ticks[i];
            let weighted = self.cfg.sharing == ExcessSharing::Weighted;
            let evidence = if hosts_changed {
                Evidence::None
            } else if starved[i] {
                Evidence::ReservationsStarved
            } else if weighted && ran >= 10 && claimed * 10 >= ran * 9 {
                Evidence::Backlogged
            } else {
                Evidence::None
            };
            // Weighted sharing hands the excess to the hosts a slice at a time: what they
            // still held when the period ended was offered and not refused by the
            // target, so it counts towards "every token was used".
            let offered = used
                .get(r)
                .saturating_add(offered_unused.get(r))
                .min(report_budget.get(r));
            let step = self.estimators[i].observe_served(
                offered,
                used.get(r),
                reservation_missed[i],
                evidence,
            );
            dropped |= step == EstimateStep::Dropped;
            let reserved = self
                .hosts
                .iter()
                .map(|h| h.budgets.reservation_total().get(r))
                .chain(self.groups.iter().map(|g| g.surplus.get(r)))
                .fold(0u64, u64::saturating_add);
            self.estimators[i].hold_at_least(reserved);
            if r == Resource::Ops {
                if self.estimator_log.len() == ESTIMATOR_LOG_PERIODS {
                    self.estimator_log.pop_front();
                }
                self.estimator_log.push_back(EstimatorRecord {
                    epoch: self.epoch,
                    budget: report_budget.ops,
                    used: used.ops,
                    offered,
                    evidence,
                    step,
                    next: self.estimators[i].current(),
                });
            }
        }
        // A host that lagged in vain is served what it can reach for a while (see
        // `HostEntry::unreachable_periods`), unless it met its reservation in the
        // period before and the estimate just dropped: then the target's drop, not its
        // queue depth, made it miss, and it keeps its reservation (a reach taken from
        // the drop's period shortchanged it for two periods more: Haechi's Set 4 in the
        // lab). A host bound by its queue depth missed the period before too.
        for (idx, completed, met_before) in in_vain {
            if dropped && met_before {
                continue;
            }
            let h = &mut self.hosts[idx];
            h.unreachable_backoff = (h.unreachable_backoff * 2).clamp(2, 16);
            h.unreachable_periods = h.unreachable_backoff;
            h.reach = Amount::new(
                completed.ops - completed.ops / 16,
                completed.bytes - completed.bytes / 16,
            );
        }
        let ended_epoch = self.epoch;
        let ended_start = self.period_start;
        let hosts = std::sync::Arc::new(hosts);
        let host_nqns = self.host_nqns();
        if self.history.len() == HISTORY_PERIODS {
            self.history.pop_front();
        }
        self.history.push_back(HistoryFrame {
            epoch: ended_epoch,
            nqns: host_nqns.clone(),
            records: hosts.clone(),
        });
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
        let reserved = self
            .groups
            .iter()
            .fold(reserved, |a, g| a.saturating_add(g.surplus));
        let global = self.budget.saturating_sub(reserved);
        for g in &mut self.groups {
            g.given = [0; 2];
            g.surplus_released = [0; 2];
        }
        for h in &mut self.hosts {
            h.excess_granted = Amount::ZERO;
            h.ticks_active = 0;
            h.lag_ticks = 0;
        }
        self.last_share = start;
        self.share_balance = [0; 2];
        self.share_ticks = [[0; 2]; 2];
        self.lag_seen = 0;
        self.period_ticks = 0;
        let weighted = if self.cfg.sharing == ExcessSharing::Weighted {
            1 | ((cap.bytes != u64::MAX) as u64) << 1
        } else {
            0
        };
        self.shared.weighted.store(weighted, Ordering::Release);
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
        // Pools armed ahead during the period stand if the host's reservation and
        // limits are still what they were armed with (the usual case); the rest are
        // armed now.
        self.arm_cursor = 0;
        for i in 0..self.hosts.len() {
            let h = &mut self.hosts[i];
            let armed = h.armed_ahead.take();
            if armed != Some(h.pools_for(self.epoch)) {
                self.arm_host(i, (1, 1));
            }
        }
        self.detached.retain(|h| Arc::strong_count(h) > 1);
        for h in &self.detached {
            for r in 0..2 {
                let (t, old) = h.credit[r].replace(tag, 0);
                if t != tag {
                    self.audit.expired_at_rollover[r] += old as i128;
                }
            }
        }
        // Only what changed with the period (a soft grant, a reservation served as
        // unreachable) is published per host; the new period itself is published once,
        // below, after every pool is armed, so a channel that sees it finds its tokens.
        self.refresh_params(true);
        self.shared.epoch.store(self.epoch, Ordering::Release);
    }

    /// Fills host `i`'s pools for the current period, scaled by `num/den` of a period.
    fn arm_host(&mut self, i: usize, fraction: (u64, u64)) {
        self.arm_pools(i, self.tag(), fraction);
    }

    /// Fills host `i`'s pools of period `tag` (the current one, or the next one ahead
    /// of the roll-over), scaled by `num/den` of a period. Whatever the slot held
    /// before (tokens of an ended period) has expired.
    fn arm_pools(&mut self, i: usize, tag: u16, (num, den): (u64, u64)) {
        let h = &self.hosts[i];
        let shared = &h.shared;
        let part = |v: u64| if num == den { v } else { mul_div(v, num, den) };
        for r in 0..2 {
            for p in 0..2 {
                let v = clamp_pool(part(h.period_res[p].get(RES[r])));
                let (t, old) = shared.res[p][r].replace(tag, v);
                self.audit.rearmed(r, tag, t, old);
                self.audit.issued[r] += v as i128;
            }
            let (t, old) = shared.credit[r].replace(tag, 0);
            self.audit.rearmed(r, tag, t, old);
            for c in 0..3 {
                let l = h.budgets.limit[c].get(RES[r]);
                // Channels never touch the pool of a limit that is not enforced, and
                // update_host arms it when the limit is switched on.
                if l != UNLIMITED {
                    shared.limit[c][r].replace(tag, clamp_pool(part(l)));
                }
            }
        }
    }

    /// Arms the next period's pools of a few more hosts, so that by the middle of the
    /// period all are armed and the roll-over only publishes the new epoch (issue 10:
    /// the roll-over at 1024 hosts was memory-bound on retagging every pool).
    fn arm_ahead(&mut self) {
        let n = self.hosts.len();
        if self.arm_cursor >= n {
            return;
        }
        let per_half_period = (self.cfg.period.0 / 2 / self.cfg.check_interval.0.max(1)).max(1);
        let per_tick = ARM_AHEAD_PER_TICK.max(n.div_ceil(per_half_period as usize));
        let next = self.epoch + 1;
        let end = n.min(self.arm_cursor + per_tick);
        for i in self.arm_cursor..end {
            self.arm_pools(i, next as u16, (1, 1));
            let h = &mut self.hosts[i];
            h.armed_ahead = Some(h.pools_for(next));
        }
        self.arm_cursor = end;
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
            if h.unreachable_periods > 0 {
                h.period_res = within_reach(h.period_res, h.reach);
            }
        }
    }

    fn best_effort_params(&self) -> HostParams {
        let batch = self.cfg.batch();
        HostParams {
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
        self.refresh_params(false);
    }

    /// Recomputes every host's params and publishes them, or with `only_changed` only
    /// those of hosts whose reservation of the period changed since they were last
    /// published (the rest depends on the configuration and the host set, whose
    /// changes publish everything).
    fn refresh_params(&mut self, only_changed: bool) {
        let batch = self.cfg.batch();
        let max_w = self
            .hosts
            .iter()
            .map(|h| h.budgets.weight)
            .max()
            .unwrap_or(1)
            .max(1) as u64;
        let capacity = self.clamp_capacity();
        // Four check intervals of the whole capacity: a host may hold that much credit.
        let per_tick = Amount::new(
            mul_div(
                capacity.ops,
                4 * self.cfg.check_interval.0,
                self.cfg.period.0,
            ),
            mul_div(
                capacity.bytes,
                4 * self.cfg.check_interval.0,
                self.cfg.period.0,
            ),
        );
        for h in &mut self.hosts {
            if only_changed && h.published_res == h.period_res {
                continue;
            }
            h.published_res = h.period_res;
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
            // First come: weight scales the batch (a heavier host asks for more at a
            // time). Weighted: the monitor shares by weight; batches stay whole.
            let global_batch = if self.cfg.sharing == ExcessSharing::Weighted {
                batch
            } else {
                Amount::new(
                    mul_div(batch.ops, b.weight as u64, max_w).max(1),
                    mul_div(batch.bytes, b.weight as u64, max_w).max(1),
                )
            };
            h.share_batch = global_batch;
            // Most credit a host may hold: four batches (cooperative acquisitions), and
            // with weighted sharing at least four intervals of the whole capacity.
            let four = Amount::new(
                global_batch.ops.saturating_mul(4),
                global_batch.bytes.saturating_mul(4),
            );
            h.share_cap = if self.cfg.sharing == ExcessSharing::Weighted {
                Amount::new(four.ops.max(per_tick.ops), four.bytes.max(per_tick.bytes))
            } else {
                four
            };
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
                together: b.together,
                limit_mask: mask,
                limit: b.limit,
                res_batch,
                global_batch,
                limit_batch,
                capacity,
                credit_cap: h.share_cap,
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
            .enumerate()
            .filter(|(_, h)| only.is_none_or(|n| n == h.cfg.host_nqn))
            .map(|(i, h)| {
                let c = h.shared.counters();
                let res_left = h.shared.reservation_available();
                let (met, n) = self
                    .records_of(i)
                    .fold((0usize, 0usize), |(m, n), r| (m + r.met as usize, n + 1));
                HostStats {
                    host_nqn: h.cfg.host_nqn.clone(),
                    config: h.cfg.clone(),
                    completed_this_period: c.completed.saturating_sub(h.last.completed),
                    completed_ios_this_period: c.completed_ios - h.last.completed_ios,
                    last_periods: self
                        .records_of(i)
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
                    admitted_ios_total: c.admitted_ios,
                    in_flight: c.in_flight(),
                    hold_events_total: c.held_events,
                    held_time: h.shared.held_time(),
                    period_counts: h.period_counts,
                    group: h.cfg.group.clone(),
                    excess_granted: h.excess_granted,
                    reservation_unreachable: h.unreachable_periods > 0,
                }
            })
            .collect();
        let groups = self
            .groups
            .iter()
            .enumerate()
            .map(|(g, ge)| {
                let members: Vec<&HostEntry> =
                    self.hosts.iter().filter(|h| h.group == Some(g)).collect();
                GroupStats {
                    name: ge.cfg.name.clone(),
                    config: ge.cfg.clone(),
                    hosts: members.iter().map(|h| h.cfg.host_nqn.clone()).collect(),
                    completed_this_period: members.iter().fold(Amount::ZERO, |a, h| {
                        let c = h.shared.counters();
                        a.saturating_add(c.completed.saturating_sub(h.last.completed))
                    }),
                    reservation_per_period: ge.budgets.reservation,
                    limit_per_period: ge.budgets.limit,
                    given_this_period: Amount::new(ge.given[0], ge.given[1]),
                }
            })
            .collect();
        DomainStats {
            epoch: self.epoch,
            period_ns: self.cfg.period.0,
            elapsed_ns: elapsed.0,
            budget: self.budget,
            global_available: self.shared.global_available(),
            sharing: self.cfg.sharing,
            hosts,
            groups,
        }
    }

    /// The estimator's decisions for operations in the last periods, oldest first.
    pub fn estimator_log(&self) -> impl DoubleEndedIterator<Item = &EstimatorRecord> + '_ {
        self.estimator_log.iter()
    }

    /// Every host's history of past periods (oldest first), in the order of
    /// [`Monitor::stats`]'s hosts.
    pub fn histories(&self) -> impl Iterator<Item = (&str, Vec<PeriodRecord>)> {
        self.hosts.iter().enumerate().map(|(i, h)| {
            (
                h.cfg.host_nqn.as_str(),
                self.records_of(i).copied().collect(),
            )
        })
    }
}

/// A host's reservation per pool for a period: the hard reservation plus its soft
/// grant, which is split between the read and write pools like the hard one.
/// Per-pool reservations scaled down together so they add up to at most `reach`.
fn within_reach(mut pr: [Amount; 2], reach: Amount) -> [Amount; 2] {
    for r in Resource::ALL {
        let total = pr[0].get(r).saturating_add(pr[1].get(r));
        if total > reach.get(r) {
            for pool in &mut pr {
                pool.set(r, mul_div(pool.get(r), reach.get(r), total));
            }
        }
    }
    pr
}

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

fn adjust_pool(pool: &crate::sync::EpochPool, tag: u16, delta: i128, issued: &mut i128) {
    if delta > 0 {
        if pool.give(tag, delta as u64) {
            *issued += delta;
        }
    } else if delta < 0 {
        let taken = pool.take(tag, (-delta) as u64);
        *issued -= taken as i128;
    }
}

/// The estimators of a domain. Doubling probes and the "backlogged" evidence are
/// weighted sharing's; first come keeps Haechi's Algorithm 1 with the probe back-off,
/// the "reservations starved" evidence and the sudden-drop rule (both sharings).
fn make_estimators(cfg: &DomainConfig) -> [CapacityEstimator; 2] {
    let cap = cfg.capacity_per_period();
    let make = |e: CapacityEstimator| {
        if cfg.sharing == ExcessSharing::Weighted {
            e.with_fast_probes()
        } else {
            e
        }
    };
    [
        make(CapacityEstimator::new(
            &cfg.estimator,
            cap.ops,
            cfg.per_period(cfg.capacity.iops_stddev),
        )),
        make(CapacityEstimator::new(
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
        )),
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
    pub sharing: ExcessSharing,
    pub hosts: Vec<HostStats>,
    pub groups: Vec<GroupStats>,
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
    /// Time its commands spent held, as a histogram (monotonic).
    pub held_time: crate::histogram::HeldTimeSnapshot,
    /// Ended periods by outcome (monotonic).
    pub period_counts: PeriodCounts,
    pub group: Option<String>,
    /// Global tokens given to it this period by weighted sharing.
    pub excess_granted: Amount,
    /// Closing the excess to the others did not bring its reservation within reach
    /// (its queue depth cannot carry it at this target's latency): its lag no longer
    /// holds the others back; retried after a back-off of 2 to 16 periods.
    pub reservation_unreachable: bool,
}
