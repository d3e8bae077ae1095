//! One host of a domain as the monitor sees it, in named parts: its settings and
//! budgets, what it is given in the current period ([`PeriodBudget`]), how busy it is
//! ([`Activity`]), whether its reservation is within reach ([`Reach`]), how its
//! periods ended ([`Outcomes`]) and its part in sharing the excess ([`HostShare`]).

use crate::burst::BurstBucket;
use crate::config::{BudgetClass, HostBudgets, HostConfig, UNLIMITED};
use crate::cost::{Amount, RES, Resource};
use crate::estimator::UnderuseCounter;
use crate::ledger::{ChannelParams, CounterSnapshot, HostShared, clamp_pool};
use crate::sync::{Arc, Ordering};
use crate::time::{Nanos, mul_div, mul_div_ceil};

use super::books::Audit;
use super::outcome::{PeriodCounts, PeriodRecord};

/// A host of the domain.
#[derive(Debug)]
pub(crate) struct HostEntry {
    pub(crate) cfg: HostConfig,
    pub(crate) budgets: HostBudgets,
    pub(crate) shared: Arc<HostShared>,
    /// Index of its group in the domain's groups.
    pub(crate) group: Option<usize>,
    /// The epoch it was added in: older history frames are of an earlier host of the
    /// same name.
    pub(crate) since_epoch: u64,
    pub(crate) period: PeriodBudget,
    pub(crate) activity: Activity,
    pub(crate) reach: Reach,
    pub(crate) outcomes: Outcomes,
    pub(crate) share: HostShare,
    /// Its burst credit, and the work it was admitted (cost units) as of the bucket's
    /// last step.
    pub(crate) burst: BurstBucket,
    pub(crate) burst_seen: Amount,
    pub(crate) burst_seen_held: u64,
    /// The last ended period as the entitlement report reads it.
    pub(crate) window: Window,
    /// Over the hosts' circulation: the correction of its part of N* (see
    /// `sharing::operating_point`, "Shares by feedback").
    pub(crate) circulation: CirculationFeedback,
}

/// Over the hosts' circulation, what the monitor corrects a host's part of N* by:
/// Little's law splits N* by the commands each host keeps outside QoS, but a host's
/// round trip grows with its own commands in flight (they queue behind each other in
/// its connection), so the one-shot split favours the hosts with few.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CirculationFeedback {
    /// Its weight's multiplier in the split, thousandths (1000: none).
    pub(crate) gain_milli: u64,
    /// Its completed work as of the last correction.
    pub(crate) completed_at: u64,
}

impl Default for CirculationFeedback {
    fn default() -> Self {
        CirculationFeedback {
            gain_milli: 1000,
            completed_at: 0,
        }
    }
}

/// What a host did in the last ended period, for the entitlement report (issue 26):
/// whether QoS held its commands for at least half of it (contending) or not
/// (self-limited), and how many commands it had at the target.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Window {
    /// Check intervals of the period, and those in which it had commands held.
    pub(crate) ticks: u32,
    pub(crate) held_ticks: u32,
    /// Commands held, summed over the check intervals.
    pub(crate) held_sum: u64,
    /// The most commands it had at the target (held and at the base) at a check
    /// interval: a lower bound of its queue depth, reached while it waited with all of
    /// them here.
    pub(crate) at_target_peak: u64,
    /// Time its completed commands spent at the base (ns): over the period's length,
    /// their mean number in flight there.
    pub(crate) service_ns: u64,
    /// Work completed (operations, cost units).
    pub(crate) completed_ops: u64,
}

impl HostEntry {
    /// Its circulation as far as the target has seen it: the most commands it had
    /// held and at the base at one check interval, this period or the last. Its queue
    /// depth once QoS held all of them at once (on NVMe/TCP an unheld host's commands
    /// are mostly in the transport, where the QoS bdev does not see them).
    ///
    /// A host that holds its own excess (issue 40 item 2) reports its circulation
    /// (`allowance`): the target then sees at most its allowance of it, and its
    /// report is the rest.
    pub(crate) fn circulation_seen(&self) -> u64 {
        let seen = self
            .window
            .at_target_peak
            .max(self.activity.at_target_peak());
        self.shared
            .window
            .reported_circulation()
            .map_or(seen, |r| seen.max(r))
    }
}

impl Window {
    /// QoS held its commands in at least half of the check intervals.
    pub(crate) fn contending(&self) -> bool {
        self.ticks > 0 && self.held_ticks * 2 >= self.ticks
    }
}

/// What a host is given in the current period.
#[derive(Debug, Default)]
pub(crate) struct PeriodBudget {
    /// Reservation plus soft grant per pool (undecayed R').
    pub(crate) res: [Amount; 2],
    pub(crate) soft_granted: Amount,
    /// `res` as last published in its params.
    pub(crate) published_res: [Amount; 2],
    /// The limits in effect as last published (they move while it bursts).
    pub(crate) published_limit: [Amount; 3],
    /// Unused reservation its channels may hold in caches: not counted as lag.
    pub(crate) res_slack: Amount,
    /// What its pools of the next period were armed with ahead of the roll-over, if
    /// they were: the roll-over re-arms them only when this no longer matches.
    pub(crate) armed_ahead: Option<ArmedPools>,
}

/// The amounts a host's pools of one period were armed with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ArmedPools {
    epoch: u64,
    res: [Amount; 2],
    limit: [Amount; 3],
}

/// How busy a host is, as of the last check interval.
#[derive(Debug)]
pub(crate) struct Activity {
    /// Commands admitted, and refusals, as of the previous check interval.
    admitted_at_tick: u64,
    held_at_tick: u64,
    /// When it last had a command outstanding or admitted one.
    pub(crate) last_active: Nanos,
    /// Idle at the last check interval (its unused reservation may be converted).
    pub(crate) idle: bool,
    /// Check intervals of this period in which it was busy, and in which it lagged
    /// behind its reservation schedule.
    pub(crate) ticks_active: u32,
    pub(crate) lag_ticks: u32,
    /// Per resource, how much work it is behind its reservation's schedule with
    /// commands at the target, as of the last check interval (0: not behind).
    pub(crate) behind_by: [u64; 2],
    /// Check intervals of this period, those with commands held, and the commands held
    /// summed over them.
    ticks: u32,
    held_ticks: u32,
    held_sum: u64,
    /// The most commands held and at the base at one check interval of this period.
    at_target_peak: u64,
    /// Commands admitted and not completed: the most seen lately (decaying), and
    /// whether it had (nearly) that many out at the last check interval with none
    /// held: a closed loop at its queue depth, bounded by the target's latency.
    peak_in_flight: u64,
    pub(crate) window_bound: bool,
    /// Work completed and time spent at the base as of the last check interval (the
    /// depth curve's samples).
    seen_work: u64,
    seen_service: u64,
}

/// Whether a host's reservation is within its reach. Closing the pool for it may not
/// help: it lagged all of a period with the pool closed on its account and still
/// missed its reservation (its queue depth cannot carry it at this target's latency).
/// For `periods` more periods its lag does not close the pool to the others;
/// `backoff` doubles (2 ..= 16) each time a probe confirms it and resets when it meets
/// its reservation.
#[derive(Debug, Default)]
pub(crate) struct Reach {
    pub(crate) periods: u32,
    pub(crate) backoff: u32,
    /// It completed its reservation in the last ended period.
    pub(crate) met_last_period: bool,
    /// While its reservation is unreachable: what it completed in the period that
    /// showed it, with the pool closed to everybody else (the most it can do), less a
    /// sixteenth. It is served as its reservation until the next probe.
    pub(crate) amount: Amount,
}

/// How a host's periods ended.
#[derive(Debug)]
pub(crate) struct Outcomes {
    /// Its counters when the current period started.
    pub(crate) at_start: CounterSnapshot,
    /// Ended periods since the host was added, by outcome (monotonic).
    pub(crate) counts: PeriodCounts,
    pub(crate) underuse: UnderuseCounter,
    pub(crate) soft_idle: UnderuseCounter,
    /// Its commands held at its limit or burst rate when the current period started.
    pub(crate) limit_held_at_start: u64,
}

/// A host's part in sharing the excess: its batch, the most credit it may hold, what
/// it was given, and its counters as of the last share.
#[derive(Debug, Default)]
pub(crate) struct HostShare {
    pub(crate) cap: Amount,
    pub(crate) batch: Amount,
    pub(crate) seen_global: [u64; 2],
    pub(crate) seen_res: [u64; 2],
    pub(crate) seen_held: u64,
    /// Fractions of a token (fixed point) owed to it by earlier shares.
    pub(crate) carry: [u64; 2],
    /// Global tokens given to it this period (its share of the excess, and of its
    /// group's surplus reservation).
    pub(crate) excess_granted: Amount,
}

/// What one check interval needs to judge a host's reservation.
#[derive(Debug, Clone, Copy)]
pub(crate) struct IntervalView {
    pub(crate) tag: u16,
    pub(crate) now: Nanos,
    /// `(T - t, T)` of the period.
    pub(crate) left: (u64, u64),
    /// Its unused reservation beyond `R (T - t) / T` is reclaimed while it is idle.
    pub(crate) convert: bool,
    /// Paced release: a host behind the schedule by more than `lag_slack` (ns of the
    /// period) lags; `release_num / T` of a period's reservation is out.
    pub(crate) paced: bool,
    pub(crate) release_num: u64,
    pub(crate) lag_slack: u64,
    /// The release burst (ns of the period): a host is behind at all when its work
    /// lags a steady schedule that has the whole reservation two bursts before the
    /// period ends, or with two pools, when more of its released reservation is unused
    /// than one burst and its channels' caches.
    pub(crate) behind_slack: u64,
    /// The check interval (ns).
    pub(crate) interval: u64,
    pub(crate) idle_after: Nanos,
    /// Take the depth curve's sample in this interval (one in [`crate::depth::MIN_WINDOW`]).
    pub(crate) sample_depth: bool,
}

/// What a check interval found of the hosts, summed over them (each host adds its
/// part in place: a pass over a thousand hosts copies nothing per host).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct IntervalTotals {
    /// Bit r: some host lags behind its reservation schedule in resource r.
    pub(crate) lag: u64,
    /// Bit r: some host with commands at the target now is behind its reservation
    /// schedule at all in resource r (`behind_slack`, no jitter allowance): what the
    /// first-come pool's pace follows. A host that just stopped is not idle yet for
    /// [`IDLE_INTERVALS`](super::IDLE_INTERVALS) intervals, and holding the others for
    /// it gains nothing; a lag below the jitter allowance still costs a reservation at
    /// the period's end, and a shallow one shrinks the pace by only a sixteenth.
    pub(crate) behind_backlogged: u64,
    /// Bit r: some host is behind at all in resource r, with commands at the target or
    /// not.
    pub(crate) behind: u64,
    /// Per resource, how far the furthest behind of those with commands at the
    /// target is behind its schedule (ns of the period).
    pub(crate) behind_ns: [u64; 2],
    /// Bit r: some host with commands at the target is on its schedule by less than
    /// [`CLOSE_INTERVALS`] check intervals ahead (the pace that let it keep up is near).
    pub(crate) close: u64,
    /// Work promised to the hosts or on its way, per resource: reservation left,
    /// credit, in flight, cached in channels.
    pub(crate) outstanding: [u64; 2],
    pub(crate) in_flight: [u64; 2],
    /// Work they completed since the period started.
    pub(crate) used: [u64; 2],
    /// Of it, work paid with global tokens (including credit).
    pub(crate) used_global: [u64; 2],
    /// Work (operations, cost units) they completed and the time that work spent at
    /// the base since the last sample of the depth curve.
    pub(crate) depth: (u64, u64),
}

impl HostEntry {
    pub(crate) fn new(
        cfg: HostConfig,
        budgets: HostBudgets,
        shared: Arc<HostShared>,
        now: Nanos,
        epoch: u64,
    ) -> Self {
        let at_start = shared.counters();
        let limit_held_at_start = shared.counters.holds().at_limit();
        let burst_seen = at_start
            .consumed_res
            .saturating_add(at_start.consumed_global);
        let burst = BurstBucket::full(&budgets.burst);
        let mut activity = Activity::new(now);
        activity.depth_sample(shared.completed_work_and_service());
        HostEntry {
            cfg,
            budgets,
            shared,
            group: None,
            since_epoch: epoch,
            period: PeriodBudget {
                res: budgets.reservation,
                ..PeriodBudget::default()
            },
            activity,
            reach: Reach::default(),
            outcomes: Outcomes {
                at_start,
                counts: PeriodCounts::default(),
                underuse: UnderuseCounter::default(),
                soft_idle: UnderuseCounter::default(),
                limit_held_at_start,
            },
            share: HostShare::default(),
            window: Window::default(),
            circulation: CirculationFeedback::default(),
            burst,
            burst_seen,
            burst_seen_held: at_start.held_events,
        }
    }

    /// The limits in effect now: its limits, the total one at its burst rate while it
    /// bursts.
    pub(crate) fn limit(&self) -> [Amount; 3] {
        let mut l = self.budgets.limit;
        let total = BudgetClass::Total as usize;
        l[total] = self.burst.effective_limit(&self.budgets.burst, l[total]);
        l
    }

    /// Work it was admitted since the last call (cost units), and whether it had
    /// commands held meanwhile (it was not under its limit by choice).
    pub(crate) fn admitted_since_last(&mut self) -> (Amount, bool) {
        let c = self.shared.counters_hot();
        let spent = c.consumed_res.saturating_add(c.consumed_global);
        let used = spent.saturating_sub(self.burst_seen);
        let held = c.held_now > 0 || c.held_events != self.burst_seen_held;
        self.burst_seen = spent;
        self.burst_seen_held = c.held_events;
        (used, held)
    }

    /// Moves its live limit pools from limits `old` to `new` for the rest of the
    /// period (`left` is `(T - t, T)`): a limit switched on starts prorated, a changed
    /// one moves by the prorated difference, never below zero. Limits are not tokens
    /// of the books.
    pub(crate) fn retarget_limits(
        &self,
        old: &[Amount; 3],
        new: &[Amount; 3],
        (num, den): (u64, u64),
        tag: u16,
    ) {
        for c in BudgetClass::ALL {
            for r in Resource::ALL {
                let pool = &self.shared.limit[c as usize][r.index()];
                let new_l = new[c as usize].get(r);
                let old_l = old[c as usize].get(r);
                if new_l == UNLIMITED {
                    continue;
                }
                let prorated = mul_div(new_l, num, den);
                if old_l == UNLIMITED {
                    pool.replace(tag, clamp_pool(prorated));
                } else {
                    let delta = prorated as i128 - mul_div(old_l, num, den) as i128;
                    Audit::default().adjust(pool, r.index(), tag, delta);
                }
            }
        }
    }

    /// What its pools of period `epoch` are armed with, from its reservation and
    /// limits as they stand.
    pub(crate) fn pools_for(&self, epoch: u64) -> ArmedPools {
        ArmedPools {
            epoch,
            res: self.period.res,
            limit: self.limit(),
        }
    }

    /// Its reservation of the period, both pools.
    pub(crate) fn reserved(&self) -> Amount {
        self.period.res[0].saturating_add(self.period.res[1])
    }

    /// One check interval (token conversion, Haechi step T2, adapted to a target that
    /// sees demand): updates its activity, reclaims its unused reservation beyond
    /// `R (T - t) / T` while it is idle (`convert`), and tells whether it lags behind
    /// its reservation schedule and what it has outstanding.
    #[inline]
    pub(crate) fn check_interval(
        &mut self,
        v: &IntervalView,
        audit: &mut Audit,
        t: &mut IntervalTotals,
    ) {
        let c = self.shared.counters_hot();
        if v.sample_depth {
            let (w, s) = self.activity.depth_sample((c.completed.ops, c.service_ns));
            t.depth = (t.depth.0.saturating_add(w), t.depth.1.saturating_add(s));
        }
        let used = self.used_this_period(&c, t);
        let mut lag = 0u64;
        let mut behind = 0u64;
        let mut behind_ns = [0u64; 2];
        let mut late_work = [0u64; 2];
        let mut close = 0u64;
        let idle = self.activity.observe(&c, v.now, v.idle_after);
        let (num, den) = v.left;
        let pools = if self.budgets.together { 1 } else { 2 };
        for p in 0..pools {
            for r in 0..2 {
                let left = if v.convert && idle {
                    let bound = mul_div(self.period.res[p].get(RES[r]), num, den);
                    let (removed, left) = self.shared.res[p][r].cap(v.tag, bound);
                    audit.issued[r] -= removed as i128;
                    left
                } else {
                    self.shared.res[p][r].count(v.tag)
                };
                let per = self.period.res[p].get(RES[r]);
                if v.paced && !idle && per > 0 {
                    let s = self.on_schedule(v, per, r, left, used[r], pools);
                    lag |= (s.lagging as u64) << r;
                    if s.late_by > 0 {
                        late_work[r] = late_work[r].max(s.late_by);
                        behind |= 1 << r;
                        behind_ns[r] = behind_ns[r].max(mul_div(s.late_by, den, per));
                    }
                    close |= (s.close as u64) << r;
                }
                t.outstanding[r] = t.outstanding[r].saturating_add(left);
            }
        }
        self.activity.lag_ticks += (lag != 0) as u32;
        if self.shared.lagging.load(Ordering::Relaxed) != lag {
            self.shared.lagging.store(lag, Ordering::Release);
        }
        t.lag |= lag;
        t.behind |= behind;
        self.activity.behind_by = if c.outstanding() > 0 {
            late_work
        } else {
            [0; 2]
        };
        if c.outstanding() > 0 {
            t.close |= close;
            t.behind_backlogged |= behind;
            for r in 0..2 {
                t.behind_ns[r] = t.behind_ns[r].max(behind_ns[r]);
            }
        }
        let in_flight = c.in_flight();
        let cached = c.cached_res.saturating_add(c.cached_global);
        for r in 0..2 {
            t.outstanding[r] = t.outstanding[r]
                .saturating_add(self.shared.credit[r].count(v.tag))
                .saturating_add(in_flight.get(RES[r]))
                .saturating_add(cached.get(RES[r]));
            t.in_flight[r] = t.in_flight[r].saturating_add(in_flight.get(RES[r]));
        }
    }

    /// The work it consumed this period so far, per resource (reservation and global
    /// tokens; tokens cached in channels are not work), added to `t`'s totals.
    fn used_this_period(&self, c: &CounterSnapshot, t: &mut IntervalTotals) -> [u64; 2] {
        let spent = c.consumed_res.saturating_add(c.consumed_global);
        let s = &self.outcomes.at_start;
        let spent_before = s.consumed_res.saturating_add(s.consumed_global);
        let mut used = [0u64; 2];
        for r in 0..2 {
            used[r] = spent.get(RES[r]).saturating_sub(spent_before.get(RES[r]));
            t.used[r] = t.used[r].saturating_add(used[r]);
            let global = c.consumed_global.get(RES[r]);
            t.used_global[r] = t.used_global[r]
                .saturating_add(global.saturating_sub(s.consumed_global.get(RES[r])));
        }
        used
    }

    /// Where a busy host stands against its paced reservation schedule in resource
    /// `r` of a pool of `per` per period with `left` tokens, having done `used`.
    fn on_schedule(
        &self,
        v: &IntervalView,
        per: u64,
        r: usize,
        left: u64,
        used: u64,
        pools: usize,
    ) -> OnSchedule {
        let (num, den) = v.left;
        let unreleased = per - mul_div_ceil(per, v.release_num, den).min(per);
        let usable = left.saturating_sub(unreleased);
        let cached = self.period.res_slack.get(RES[r]);
        let lagging = usable > mul_div(per, v.lag_slack, den).max(1) + cached;
        // Behind at all: one pool's work is what the host did this period (tokens
        // cached in channels are not work), against a schedule that reaches the whole
        // reservation two bursts before the period ends (one left periods a few tokens
        // short), at one steady rate from nothing at the period's start. So a host that
        // keeps its reservation's rate (and 2 bursts a period more) is never behind and
        // nobody is held for it: the schedule used to run two bursts ahead, ramping up
        // at twice the reservation's rate over the period's first two bursts, which
        // found every host doing less than twice its reservation behind for a few ms
        // of each period and held the others for it (0.6-0.9 % of their commands with
        // eight hosts, none of it needed). Two pools go by the pool, less what channels
        // may cache.
        let burst = mul_div(per, v.behind_slack, den);
        let late_by = if pools == 1 {
            let elapsed = den - num;
            let horizon = den.saturating_sub(v.behind_slack.saturating_mul(2)).max(1);
            let due = mul_div(per, elapsed.min(horizon), horizon);
            due.saturating_sub(used).saturating_sub(1)
        } else {
            usable.saturating_sub(burst.max(1) + cached)
        };
        let margin = mul_div(per, v.interval.saturating_mul(CLOSE_INTERVALS), den);
        let close = if pools == 1 {
            used < (per - unreleased).saturating_add(margin)
        } else {
            usable + margin > burst + cached
        };
        OnSchedule {
            lagging,
            late_by,
            close,
        }
    }
}

/// Where a host stands against its paced reservation schedule (one pool, one resource).
struct OnSchedule {
    /// More of its released reservation is unused than the lag slack allows: the pool
    /// closes for it (policies that do not own the pool).
    lagging: bool,
    /// Work it is behind the schedule two bursts ahead (0: not behind).
    late_by: u64,
    /// Less than [`CLOSE_INTERVALS`] check intervals of schedule ahead.
    close: bool,
}

/// A host less than this many check intervals of its schedule ahead is close to it.
pub(crate) const CLOSE_INTERVALS: u64 = 4;

/// What the end of a period found of the hosts, summed over them in place.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct PeriodTotals {
    /// Work completed by all hosts.
    pub(crate) used: Amount,
    /// Work the hosts were admitted with global tokens (credit included): what
    /// holding them could have freed for a host behind its reservation.
    pub(crate) used_global: Amount,
    /// Some host was busy during part of the period only (it started or stopped in
    /// it): the period is no measurement of the target.
    pub(crate) partial: bool,
    /// Per resource: a host still active at the end completed less than its
    /// reservation.
    pub(crate) missed: [bool; 2],
    /// Per resource: a host busy all period, lagging at some point, missed its
    /// reservation.
    pub(crate) starved: [bool; 2],
    /// Offered to the hosts and left (credit they hold, the unreachable part of a
    /// reservation), where the sharing policy counts that as offered.
    pub(crate) offered_unused: Amount,
    /// As [`IntervalTotals::depth`].
    pub(crate) depth: (u64, u64),
    /// Time the period's completed commands spent at the base, summed (Little's law:
    /// over the period's length, the mean number in flight).
    pub(crate) service_ns: u64,
    /// Some host had commands held at its limit or burst rate: its demand was capped by
    /// the contract, so what the target served says nothing of its capacity.
    pub(crate) limit_bound: bool,
}

/// What the end of a period needs to judge a host.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PeriodView {
    pub(crate) epoch: u64,
    /// The next period's start.
    pub(crate) start: Nanos,
    pub(crate) idle_after: Nanos,
    pub(crate) period_ticks: u32,
    pub(crate) count_offered: bool,
}

/// A host that lagged nearly all period and still fell more than 1 % short of its
/// reservation: what its period's end saw.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LaggedShort {
    /// What it completed.
    pub(crate) completed: Amount,
    /// It met its reservation the period before.
    pub(crate) met_before: bool,
    /// Its reservation less what it completed.
    pub(crate) shortfall: Amount,
    /// What it was admitted with global tokens (credit included).
    pub(crate) own_global: Amount,
}

impl LaggedShort {
    /// It lagged in vain: in a resource it missed, the others' global work of the
    /// period (`all_global` less its own) was less than its shortfall, so holding
    /// every one of them could not have closed the gap; its own queue depth bounds it.
    /// Otherwise the hold was too loose (a first-come pool is paced, not closed, and
    /// a server need not share itself evenly), and backing its reservation off would
    /// miss it for the back-off's periods.
    pub(crate) fn in_vain(&self, all_global: Amount) -> bool {
        let others = all_global.saturating_sub(self.own_global);
        Resource::ALL
            .iter()
            .any(|&r| self.shortfall.get(r) > 0 && others.get(r) < self.shortfall.get(r))
    }
}

impl HostEntry {
    /// Ends the period for this host: its record (pushed to `records`), what it says
    /// of the target (added to `t`), and the host's own outcome counters. Returns, when
    /// it lagged nearly all period on its account and still fell more than 1 % short,
    /// what the roll-over needs to judge whether it lagged in vain ([`LaggedShort`]).
    #[inline]
    pub(crate) fn close_period(
        &mut self,
        v: &PeriodView,
        t: &mut PeriodTotals,
        records: &mut Vec<PeriodRecord>,
    ) -> Option<LaggedShort> {
        let now_c = self.shared.counters_hot();
        let (w, s) = self
            .activity
            .depth_sample((now_c.completed.ops, now_c.service_ns));
        t.depth = (t.depth.0.saturating_add(w), t.depth.1.saturating_add(s));
        let last = &self.outcomes.at_start;
        let completed = now_c.completed.saturating_sub(last.completed);
        let service_ns = now_c.service_ns.wrapping_sub(last.service_ns);
        t.service_ns = t.service_ns.saturating_add(service_ns);
        let backlogged = now_c.held_events > last.held_events;
        let limit_held = self.shared.counters.holds().at_limit();
        t.limit_bound |= limit_held > self.outcomes.limit_held_at_start;
        self.outcomes.limit_held_at_start = limit_held;
        let hard = self.budgets.reservation_total();
        if v.count_offered {
            let offered = self.offered_unused(&now_c, hard, completed);
            t.offered_unused = t.offered_unused.saturating_add(offered);
        }
        let met = Resource::ALL
            .iter()
            .all(|&r| completed.get(r) >= hard.get(r));
        t.used = t.used.saturating_add(completed);
        let own_global = now_c.consumed_global.saturating_sub(last.consumed_global);
        t.used_global = t.used_global.saturating_add(own_global);
        records.push(PeriodRecord {
            epoch: v.epoch,
            completed,
            completed_ios: now_c.completed_ios - last.completed_ios,
            reservation: hard,
            soft_granted: self.period.soft_granted,
            met,
            backlogged,
        });
        let a = &self.activity;
        let active =
            v.start.saturating_sub(a.last_active) < v.idle_after || now_c.outstanding() > 0;
        // Busy at every check interval of the period (or idle at all of them): a host
        // that started or stopped during it makes the period no measurement.
        let whole = a.ticks_active + 1 >= v.period_ticks;
        t.partial |= a.ticks_active > 0 && !whole;
        let in_vain = if active {
            self.judge_missed(v, completed, whole, t)
                .map(|met_before| LaggedShort {
                    completed,
                    met_before,
                    shortfall: hard.saturating_sub(completed),
                    own_global,
                })
        } else {
            None
        };
        self.reach.after_period(met, active, in_vain.is_some());
        let o = &mut self.outcomes;
        o.underuse.observe(met);
        let soft_total = hard.saturating_add(self.budgets.soft_extra);
        o.soft_idle
            .observe(backlogged || completed.ops.saturating_mul(2) >= soft_total.ops);
        o.counts.count(met, backlogged);
        o.at_start = now_c;
        let a = &self.activity;
        self.window = Window {
            ticks: a.ticks,
            held_ticks: a.held_ticks,
            held_sum: a.held_sum,
            at_target_peak: a.at_target_peak,
            service_ns,
            completed_ops: completed.ops,
        };
        in_vain
    }

    /// What it was offered and left at a period's end: the credit it holds, the global
    /// tokens its channels cache, and the part of its reservation it cannot reach.
    fn offered_unused(&self, now_c: &CounterSnapshot, hard: Amount, completed: Amount) -> Amount {
        let offered = self
            .shared
            .credit_available()
            .saturating_add(now_c.cached_global);
        if self.reach.periods > 0 {
            // The part of its reservation it cannot reach was offered and left:
            // without it the budget would stay at the reservations (they are
            // what the estimate is held at) and nobody could have the rest.
            return offered.saturating_add(hard.saturating_sub(completed));
        }
        offered
    }

    /// An active host's missed reservation, per resource, judged into `t` (missed,
    /// starved); returns whether it met the period before when it lagged nearly all
    /// period and still fell short (see [`HostEntry::close_period`]).
    fn judge_missed(
        &self,
        v: &PeriodView,
        completed: Amount,
        whole: bool,
        t: &mut PeriodTotals,
    ) -> Option<bool> {
        let hard = self.budgets.reservation_total();
        let a = &self.activity;
        let mut in_vain = None;
        for r in Resource::ALL {
            if completed.get(r) >= hard.get(r) {
                continue;
            }
            t.missed[r.index()] = true;
            // A host known not to reach its reservation even with the pool closed
            // (until it meets it again) is no evidence about the target's capacity.
            if whole && a.lag_ticks > 0 && self.reach.backoff == 0 {
                t.starved[r.index()] = true;
            }
            // Lagging at nine check intervals of ten held everybody else's global
            // tokens nearly all period: if it still fell more than 1 % short, its
            // own queue depth may bound it, not the others (the roll-over checks
            // that holding them could not have freed what it missed).
            if whole
                && self.reach.periods == 0
                && a.lag_ticks * 10 >= v.period_ticks * 9
                && completed.get(r).saturating_mul(100) < hard.get(r).saturating_mul(99)
            {
                in_vain = Some(self.reach.met_last_period);
            }
        }
        in_vain
    }

    /// Fills its pools of period `tag` (the current one, or the next one ahead of the
    /// roll-over), scaled by `num/den` of a period. Whatever a slot held before (tokens
    /// of an ended period) has expired.
    pub(crate) fn arm_pools(&self, tag: u16, (num, den): (u64, u64), audit: &mut Audit) {
        let shared = &self.shared;
        let part = |v: u64| if num == den { v } else { mul_div(v, num, den) };
        for r in 0..2 {
            for p in 0..2 {
                let v = clamp_pool(part(self.period.res[p].get(RES[r])));
                let (t, old) = shared.res[p][r].replace(tag, v);
                audit.rearmed(r, tag, t, old);
                audit.issued[r] += v as i128;
            }
            let (t, old) = shared.credit[r].replace(tag, 0);
            audit.rearmed(r, tag, t, old);
            let limit = self.limit();
            for c in 0..3 {
                let l = limit[c].get(RES[r]);
                // Channels never touch the pool of a limit that is not enforced, and
                // update_host arms it when the limit is switched on.
                if l != UNLIMITED {
                    shared.limit[c][r].replace(tag, clamp_pool(part(l)));
                }
            }
        }
    }

    /// Computes its channel parameters and publishes them. `global_batch` and
    /// `credit_cap` are the sharing policy's.
    pub(crate) fn publish_params(
        &mut self,
        batch: Amount,
        capacity: Amount,
        (global_batch, credit_cap): (Amount, Amount),
    ) {
        self.period.published_res = self.period.res;
        let limit = self.limit();
        self.period.published_limit = limit;
        let b = &self.budgets;
        let mut mask = 0u8;
        let mut limit_batch = Amount::ZERO;
        for c in BudgetClass::ALL {
            for r in Resource::ALL {
                let l = limit[c as usize].get(r);
                if l != UNLIMITED {
                    mask |= 1 << (c as usize * 2 + r.index());
                    let lb = (l / 64).clamp(1, batch.get(r));
                    limit_batch.set(r, limit_batch.get(r).max(lb));
                }
            }
        }
        self.share.batch = global_batch;
        self.share.cap = credit_cap;
        let mut res_batch = Amount::ZERO;
        for r in Resource::ALL {
            let biggest = self.period.res[0].get(r).max(self.period.res[1].get(r));
            if biggest > 0 {
                // Small: tokens cached on a thread when the period ends are lost to
                // the host's reservation.
                res_batch.set(r, (biggest / 1024).clamp(1, batch.get(r)));
            }
        }
        // Channels may each hold a batch: that much unused reservation is not lag.
        self.period.res_slack = Amount::new(
            res_batch.ops.saturating_mul(4),
            res_batch.bytes.saturating_mul(4),
        );
        self.shared.write_params(&ChannelParams {
            together: b.together,
            limit_mask: mask,
            limit,
            res_batch,
            global_batch,
            limit_batch,
            capacity,
            credit_cap,
            pool_res: self.period.res,
            configured: true,
            bursting: limit[BudgetClass::Total as usize] != b.limit[BudgetClass::Total as usize],
        });
    }
}

impl Activity {
    fn new(now: Nanos) -> Self {
        Activity {
            admitted_at_tick: 0,
            held_at_tick: 0,
            last_active: now,
            idle: false,
            ticks_active: 0,
            lag_ticks: 0,
            behind_by: [0; 2],
            ticks: 0,
            held_ticks: 0,
            held_sum: 0,
            at_target_peak: 0,
            peak_in_flight: 0,
            window_bound: false,
            seen_work: 0,
            seen_service: 0,
        }
    }

    /// What the host completed since the last call, and the time it spent at the base.
    pub(crate) fn depth_sample(&mut self, (work, service): (u64, u64)) -> (u64, u64) {
        let d = (
            work.wrapping_sub(self.seen_work),
            service.wrapping_sub(self.seen_service),
        );
        (self.seen_work, self.seen_service) = (work, service);
        d
    }

    /// Updates what the check interval at `now` sees; returns whether the host is idle:
    /// nothing outstanding and nothing admitted for `idle_after` (a host whose
    /// commands are still on their way is not idle). A command refused since the last
    /// interval counts too: the host is asking.
    #[inline]
    fn observe(&mut self, c: &CounterSnapshot, now: Nanos, idle_after: Nanos) -> bool {
        if c.outstanding() > 0
            || c.admitted_ios != self.admitted_at_tick
            || c.held_events != self.held_at_tick
        {
            self.last_active = now;
        }
        self.admitted_at_tick = c.admitted_ios;
        self.held_at_tick = c.held_events;
        let idle = now.saturating_sub(self.last_active) >= idle_after;
        self.idle = idle;
        self.ticks_active += !idle as u32;
        self.ticks += 1;
        self.held_ticks += (c.held_now > 0) as u32;
        self.held_sum = self.held_sum.saturating_add(c.held_now);
        let in_flight_ios = c.admitted_ios.saturating_sub(c.completed_ios);
        self.at_target_peak = self
            .at_target_peak
            .max(in_flight_ios.saturating_add(c.held_now));
        self.peak_in_flight = in_flight_ios.max(self.peak_in_flight - self.peak_in_flight / 256);
        self.window_bound = !idle
            && c.held_now == 0
            && in_flight_ios >= 2
            && in_flight_ios * 4 >= self.peak_in_flight * 3;
        idle
    }

    /// The most commands held and at the base at one check interval so far this period.
    pub(crate) fn at_target_peak(&self) -> u64 {
        self.at_target_peak
    }

    /// A new period starts.
    pub(crate) fn start_period(&mut self) {
        self.ticks_active = 0;
        self.lag_ticks = 0;
        self.ticks = 0;
        self.held_ticks = 0;
        self.held_sum = 0;
        self.at_target_peak = 0;
    }
}

impl Reach {
    /// The period ended: met (or idle) resets the back-off; a period of lagging in
    /// vain is confirmed after the estimator ([`Reach::confirm`]); otherwise one
    /// period of the back-off passes.
    fn after_period(&mut self, met: bool, active: bool, in_vain: bool) {
        if in_vain {
            // Decided after the estimator: if the target's capacity dropped in this
            // period, the drop explains the miss, not the host's queue depth.
        } else if met || !active {
            self.backoff = 0;
            self.periods = 0;
        } else {
            self.periods = self.periods.saturating_sub(1);
        }
        self.met_last_period = met;
    }

    /// It lagged in vain: it is served what it completed, less a sixteenth, for a
    /// back-off of 2 to 16 periods.
    pub(crate) fn confirm(&mut self, completed: Amount) {
        self.backoff = (self.backoff * 2).clamp(2, 16);
        self.periods = self.backoff;
        self.amount = Amount::new(
            completed.ops - completed.ops / 16,
            completed.bytes - completed.bytes / 16,
        );
    }
}

/// A host's reservation per pool for a period: the hard reservation plus its soft
/// grant, which is split between the read and write pools like the hard one.
pub(crate) fn with_soft(b: &HostBudgets, soft: Amount) -> [Amount; 2] {
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

/// Per-pool reservations scaled down together so they add up to at most `reach`.
pub(crate) fn within_reach(mut pr: [Amount; 2], reach: Amount) -> [Amount; 2] {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shortfall_is_in_vain_only_when_holding_the_others_could_not_have_closed_it() {
        let lagged = |shortfall: u64, own_global: u64| LaggedShort {
            completed: Amount::new(2_748, 0),
            met_before: false,
            shortfall: Amount::new(shortfall, 0),
            own_global: Amount::new(own_global, 0),
        };
        // The others did 523 with global tokens; it missed 28: holding them would do.
        assert!(!lagged(28, 0).in_vain(Amount::new(523, 0)));
        // It missed 1,000: even all of theirs would not have been enough.
        assert!(lagged(1_000, 0).in_vain(Amount::new(523, 0)));
        // Its own global work is not the others' to give up.
        assert!(lagged(28, 500).in_vain(Amount::new(523, 0)));
        // Bytes it missed count as much as operations.
        let bytes = LaggedShort {
            shortfall: Amount::new(0, 1 << 20),
            ..lagged(0, 0)
        };
        assert!(bytes.in_vain(Amount::new(523, 4096)));
        assert!(!bytes.in_vain(Amount::new(0, 2 << 20)));
    }

    #[test]
    fn an_unreachable_reservation_backs_off_from_2_to_16_periods_and_resets_when_met() {
        let mut reach = Reach::default();
        let mut seen = Vec::new();
        for _ in 0..5 {
            reach.confirm(Amount::new(1600, 0));
            seen.push(reach.periods);
        }
        assert_eq!(seen, [2, 4, 8, 16, 16]);
        assert_eq!(
            reach.amount,
            Amount::new(1500, 0),
            "served a sixteenth under it"
        );
        reach.after_period(false, true, false);
        assert_eq!(reach.periods, 15, "a missed period counts down");
        reach.after_period(true, true, false);
        assert_eq!(
            (reach.periods, reach.backoff),
            (0, 0),
            "met: probe again at once"
        );
    }

    #[test]
    fn activity_is_idle_only_after_the_idle_time_with_nothing_asked() {
        let mut a = Activity::new(Nanos(0));
        let quiet = CounterSnapshot::default();
        let after = Nanos::from_millis(10);
        assert!(!a.observe(&quiet, Nanos::from_millis(5), after));
        assert!(a.observe(&quiet, Nanos::from_millis(10), after));
        let asking = CounterSnapshot {
            held_events: 1,
            ..CounterSnapshot::default()
        };
        assert!(
            !a.observe(&asking, Nanos::from_millis(11), after),
            "a refusal is asking"
        );
        assert_eq!(a.ticks_active, 2);
    }

    #[test]
    fn the_peak_at_the_target_counts_held_and_in_flight_and_restarts_each_period() {
        let mut a = Activity::new(Nanos(0));
        let after = Nanos::from_millis(10);
        let at = |admitted_ios, completed_ios, held_now| CounterSnapshot {
            admitted_ios,
            completed_ios,
            held_now,
            ..CounterSnapshot::default()
        };
        a.observe(&at(10, 4, 3), Nanos::from_millis(1), after);
        a.observe(&at(30, 26, 20), Nanos::from_millis(2), after);
        a.observe(&at(40, 38, 1), Nanos::from_millis(3), after);
        assert_eq!(a.at_target_peak, 24, "6 + 3, 4 + 20, 2 + 1: the most is 24");
        a.start_period();
        a.observe(&at(41, 40, 0), Nanos::from_millis(4), after);
        assert_eq!(a.at_target_peak, 1);
    }

    #[test]
    fn a_soft_grant_splits_like_the_hard_reservation_and_reach_scales_both_pools() {
        let b = HostBudgets {
            reservation: [Amount::new(300, 0), Amount::new(100, 0)],
            together: false,
            limit: [Amount::new(UNLIMITED, UNLIMITED); 3],
            soft_extra: Amount::new(400, 0),
            weight: 1,
            priority: crate::config::PriorityClass::default(),
            burst: crate::burst::BurstBudget::default(),
        };
        let pr = with_soft(&b, Amount::new(400, 0));
        assert_eq!([pr[0].ops, pr[1].ops], [600, 200]);
        let r = within_reach(pr, Amount::new(400, 1));
        assert_eq!([r[0].ops, r[1].ops], [300, 100]);
    }
}
