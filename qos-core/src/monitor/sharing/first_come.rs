//! First come (`first_come`, the default): Haechi's global pool. Channels take global
//! tokens in batches scaled by their host's weight, so the excess goes to whoever asks
//! first and most often: by queue depth.
//!
//! Work-conserving (with paced reservations, the default): the pool does not bind while
//! no reservation is at risk. Every check interval it holds a whole period's estimate,
//! which the target cannot serve in one interval, so no command waits for global
//! tokens whatever the estimate says (unless it is off by more than the period's count
//! of check intervals). While a host with commands at the target is behind its
//! reservation's schedule, a controller on that lag paces the pool instead of closing
//! it (PARDA's spirit, additive increase and multiplicative decrease): from the global
//! work the others did while the pool was open it shrinks by a sixteenth per check
//! interval of schedule the host is behind (at most three quarters an interval, never
//! below 1/64 of that rate, never above Haechi's bound), grows by 1/32 of that rate per
//! interval while a host is close to its schedule (by halves once nobody is, or the
//! host behind has nothing at the target), and opens the pool again when it reaches
//! the open rate. The host behind gets what it is behind as credit meanwhile. The
//! pipeline never empties at once, and it holds by about the least that lets the
//! laggard keep up (docs/architecture.md, "Holding only what the contract needs").
//! With reservations released at the period's start (Haechi's `start`) there is no
//! schedule to lag behind: the pool is the estimate less the reservations, as in the
//! paper.

use crate::config::ReservationRelease;
use crate::cost::{Amount, RES};
use crate::sync::Ordering;
use crate::time::{Nanos, mul_div};

use super::{Interval, SharingPolicy, four};

/// While a backlogged host is behind, the pace shrinks by a sixteenth per check
/// interval of schedule it is behind, at most by this many sixteenths per interval
/// (three quarters): a deep lag is caught up before the period ends, a shallow one
/// costs the others little.
const MAX_SHRINK_16THS: u64 = 12;
/// The pace never goes below this fraction of the open rate (1/64): a laggard that
/// cannot catch up (bound by its own queue depth) does not stop the others' excess
/// altogether; the monitor's `reservation_unreachable` rule takes over after a period.
/// An eighth was too much for a reservation of 36 % at queue depth 16 among deeper
/// hosts (the lab's `qd-weights`: met in no period).
const FLOOR_DIV: u64 = 64;
/// Once nobody is behind but a host is close to its schedule, the pace grows by this
/// fraction of the open rate per check interval (1/32), and the pool opens when it
/// reaches the open rate: the level that let the laggard keep up is kept within a few
/// steps (additive increase, multiplicative decrease).
const GROW_DIV: u64 = 32;
/// While the host behind has no command at the target (it stopped, or it is between
/// commands), or when every host is well ahead of its schedule, the pace closes this
/// part of its gap to the open rate per interval (1/2): holding the others gains
/// nothing. It opens once within this fraction of the open rate (1/64).
const RECOVER_DIV: u64 = 2;
const OPEN_WITHIN_DIV: u64 = 64;
/// Weight of a new interval in the open rate's moving mean (1/8).
const OPEN_RATE_DIV: u64 = 8;

/// What the hosts' reservations say at a check interval, for one resource.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Schedule {
    /// Every host with commands at the target is well ahead of its reservation's
    /// schedule, or has none.
    OnTime,
    /// A host with commands at the target keeps up, but by less than a few check
    /// intervals: the pace that got it there is near.
    Close,
    /// A host is behind, with no command at the target now.
    BehindIdle,
    /// A host with commands at the target is behind, by this many check intervals of
    /// its schedule (at least 1): the others wait for it.
    Behind(u64),
}

#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct FirstCome {
    pools: [PoolPace; 2],
    last_interval: Option<Nanos>,
}

/// The pace of one resource's global pool.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct PoolPace {
    /// The hosts' work paid with global tokens since the period started, as the last
    /// check interval saw it, with the period's tag.
    seen: Option<(u16, u64)>,
    /// Global work per second the hosts did while the pool was open (moving mean).
    pub(crate) open_rate: u64,
    /// Tokens per second the pool is paced at while a reservation lags; `None`: open.
    pub(crate) paced: Option<u64>,
    /// Fractions of a token the paced slices left (in ns·tokens per second).
    carry: u64,
}

impl PoolPace {
    /// One check interval of `dt`: the hosts did `taken` work with global tokens since
    /// the last one (`None` when unknown: a new period), `schedule` what the reservations say now.
    /// Returns the pool for the next interval, `open` being the pool when nothing is
    /// at risk. `estimate` (tokens per second, 0 when unknown) stands in for the open
    /// rate before one is measured.
    pub(crate) fn step(
        &mut self,
        dt: Nanos,
        taken: Option<u64>,
        schedule: Schedule,
        open: u64,
        estimate: u64,
    ) -> u64 {
        let rate = taken.map(|t| mul_div(t, 1_000_000_000, dt.0.max(1)));
        let floor = self.open_rate / FLOOR_DIV;
        self.paced = match (self.paced, schedule) {
            (None, Schedule::Behind(by)) => {
                // The open rate's moving mean, or this interval's work if more (a host
                // that just started is not in the mean yet); before any is measured
                // (a pool open for one interval at a time), the estimate's rate.
                let mut base = self.open_rate.max(rate.unwrap_or(0));
                if base == 0 {
                    base = estimate;
                }
                // What the pace grows back to.
                self.open_rate = base;
                self.carry = 0;
                Some(shrink(base, by))
            }
            (None, _) => {
                if let Some(rate) = rate {
                    self.open_rate = if self.open_rate == 0 {
                        rate
                    } else {
                        self.open_rate - self.open_rate / OPEN_RATE_DIV + rate / OPEN_RATE_DIV
                    };
                }
                None
            }
            (Some(p), Schedule::Behind(by)) => Some(shrink(p, by).max(floor)),
            (Some(p), Schedule::BehindIdle | Schedule::OnTime) => {
                let p = p + self.open_rate.saturating_sub(p) / RECOVER_DIV + 1;
                (p + self.open_rate / OPEN_WITHIN_DIV < self.open_rate).then_some(p)
            }
            (Some(p), Schedule::Close) => {
                let p = p + self.open_rate / GROW_DIV + 1;
                (p < self.open_rate).then_some(p)
            }
        };
        match self.paced {
            None => open,
            Some(p) => {
                let due = (p as u128 * dt.0 as u128 + self.carry as u128) as u64;
                self.carry = due % 1_000_000_000;
                (due / 1_000_000_000).min(open)
            }
        }
    }
}

/// The pace after an interval with a host `by` check intervals behind.
fn shrink(pace: u64, by: u64) -> u64 {
    pace * (16 - by.clamp(1, MAX_SHRINK_16THS)) / 16
}

/// While the pool is paced (bit r of `paced`), a host behind its schedule gets what it
/// is behind as credit, which its channels take before the pool: the pace holds the
/// others, never the host it holds them for (a host whose reservation tokens come only
/// as fast as the schedule would otherwise stay behind for good, the pool paced to
/// nothing on its account).
fn credit_the_hosts_behind(iv: &mut Interval<'_>, paced: u64) {
    for h in &iv.members.hosts {
        for r in 0..2 {
            let behind = h.activity.behind_by[r];
            if paced & (1 << r) == 0 || behind == 0 {
                continue;
            }
            let want = behind.saturating_sub(h.shared.credit[r].count(iv.tag));
            if want > 0 && h.shared.credit[r].give(iv.tag, want) {
                iv.books.audit.issued[r] += want as i128;
            }
        }
    }
}

impl SharingPolicy for FirstCome {
    fn owns_pool(&self, paced: bool) -> bool {
        paced
    }

    fn share(&mut self, mut iv: Interval<'_>) {
        if iv.cfg.release != ReservationRelease::Paced {
            return;
        }
        let dt = self
            .last_interval
            .map_or(iv.cfg.check_interval, |t| iv.now.saturating_sub(t));
        self.last_interval = Some(iv.now);
        let mut protecting = 0u64;
        for r in 0..2 {
            let budget = iv.budget.get(RES[r]);
            let pace = &mut self.pools[r];
            let pool = &iv.shared.global[r];
            // What the hosts did with global tokens, not what left the pool: channels
            // take batches and give idle caches back, so the pool's depletion is not
            // the hosts' rate (in the lab it read twice the target's capacity).
            let global = iv.used_global[r];
            let taken = match pace.seen {
                Some((t, seen)) if t == iv.tag => Some(global.saturating_sub(seen)),
                _ => None,
            };
            pace.seen = Some((iv.tag, global));
            // A whole period's estimate: the target cannot serve that in one check
            // interval unless the estimate is off by the period's count of intervals.
            let open = crate::ledger::clamp_pool(budget.max(1));
            let bit = 1 << r;
            let schedule = if iv.behind_backlogged & bit != 0 {
                Schedule::Behind(iv.behind_ns[r] / iv.cfg.check_interval.0.max(1))
            } else if iv.behind & bit != 0 {
                Schedule::BehindIdle
            } else if iv.close & bit != 0 {
                Schedule::Close
            } else {
                Schedule::OnTime
            };
            // The estimate per second, unless it is still being learned (unbounded).
            let estimate = if budget >= crate::sync::POOL_MAX / 2 {
                0
            } else {
                mul_div(budget, 1_000_000_000, iv.cfg.period.0.max(1))
            };
            let mut g = pace.step(dt, taken, schedule, open, estimate);
            if matches!(schedule, Schedule::Behind(_)) {
                // While a reservation is behind, never more than Haechi's pool: what
                // the rest of the period can serve by the estimate beyond what is
                // promised (the pace alone reacts within a few intervals; this holds
                // the reservation from the first).
                g = g.min(iv.haechi_bound[r]);
            }
            protecting |= (pace.paced.is_some() as u64) << r;
            if let Some(old) = pool.set_in_period(iv.tag, g) {
                iv.books.audit.issued[r] += g as i128 - old as i128;
            }
        }
        if protecting != 0 {
            credit_the_hosts_behind(&mut iv, protecting);
        }
        if iv.shared.pool_paced.load(Ordering::Relaxed) != protecting {
            iv.shared.pool_paced.store(protecting, Ordering::Release);
        }
    }

    fn host_batches(
        &self,
        batch: Amount,
        weight: u64,
        max_weight: u64,
        _four_intervals: Amount,
    ) -> (Amount, Amount) {
        // Weight scales the batch: a heavier host asks for more at a time.
        let b = Amount::new(
            mul_div(batch.ops, weight, max_weight).max(1),
            mul_div(batch.bytes, weight, max_weight).max(1),
        );
        (b, four(b))
    }

    fn start_period(&mut self, _start: Nanos) {
        for p in &mut self.pools {
            p.seen = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Nanos = Nanos::from_millis(1);
    const OPEN: u64 = 1_000_000;

    /// Open for `n` intervals taking `per_ms`: the rate it learns.
    fn opened(n: usize, per_ms: u64) -> PoolPace {
        let mut p = PoolPace::default();
        for _ in 0..n {
            assert_eq!(p.step(MS, Some(per_ms), Schedule::OnTime, OPEN, 0), OPEN);
        }
        p
    }

    #[test]
    fn the_pool_stays_open_while_nothing_lags() {
        let p = opened(100, 500);
        assert_eq!(p.paced, None);
        assert_eq!(p.open_rate, 500_000);
    }

    #[test]
    fn a_lag_paces_the_pool_a_little_below_what_was_taken_and_shrinks_it_gently() {
        let mut p = opened(50, 500);
        // First interval of lag: 15/16 of 500 per ms.
        let g = p.step(MS, Some(500), Schedule::Behind(1), OPEN, 0);
        assert_eq!(g, 468);
        let mut last = g;
        for _ in 0..10 {
            let g = p.step(MS, Some(last), Schedule::Behind(1), OPEN, 0);
            assert!(g < last && g * 16 + 32 >= last * 15, "{g} after {last}");
            last = g;
        }
        // Never below 1/64 of the open rate, however long the lag lasts.
        for _ in 0..200 {
            last = p.step(MS, Some(last), Schedule::Behind(1), OPEN, 0);
        }
        // 7,812 a second: 7 and 8 a millisecond in turn.
        assert_eq!(p.paced, Some(500_000 / FLOOR_DIV));
        assert!((7..=8).contains(&last), "{last}");
    }

    /// Intervals until the pool opens again after 20 intervals behind.
    fn intervals_to_open(schedule: Schedule) -> usize {
        let mut p = opened(50, 500);
        for _ in 0..20 {
            p.step(MS, Some(300), Schedule::Behind(1), OPEN, 0);
        }
        let mut intervals = 0;
        while p.step(MS, Some(300), schedule, OPEN, 0) != OPEN {
            intervals += 1;
            assert!(intervals < 100, "the pool never opened again");
        }
        assert_eq!(p.paced, None);
        intervals
    }

    #[test]
    fn once_nobody_is_behind_the_pace_grows_back_step_by_step() {
        let n = intervals_to_open(Schedule::Close);
        // From 15/16^20 (0.275) of the open rate by 1/32 a step.
        assert!((20..=24).contains(&n), "{n} intervals");
    }

    #[test]
    fn a_laggard_with_nothing_at_the_target_releases_the_others_at_once() {
        let n = intervals_to_open(Schedule::BehindIdle);
        assert!(n <= 10, "{n} intervals");
        let n = intervals_to_open(Schedule::OnTime);
        assert!(n <= 10, "{n} intervals");
    }

    #[test]
    fn paced_slices_carry_their_fractions() {
        let mut p = opened(50, 24);
        // At the floor: 375 tokens per second, a third of a token per slice.
        p.paced = Some(24_000 / FLOOR_DIV);
        let mut total = 0;
        for _ in 0..1000 {
            total += p.step(Nanos(333_333), None, Schedule::Behind(1), OPEN, 0);
        }
        // 375 per second over a third of a second, to one token.
        assert!((124..=126).contains(&total), "{total}");
    }
}
