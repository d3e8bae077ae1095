//! Burst credits (issue 28): a credit bucket per host or group that lets it run above
//! its limit, up to its burst rate, on what it left unused under the limit. This module
//! owns the bucket ([`BurstBucket`]), a pure state machine the monitor advances at
//! every check interval with the work the host (or group) was admitted. The
//! configuration ([`Burst`]) and its validated per-period form ([`BurstBudget`]) are
//! the configuration's (`config.rs`, which validates them with the other settings;
//! re-exported here), so that config.rs and this module do not import each other.
//!
//! The bucket is a token bucket over the limit: it earns the limit's rate and pays for
//! what the host was admitted, so a host under its limit earns the unused part and a
//! host above it spends. While it holds at least two check intervals of the burst's
//! excess (`burst - limit`) the host's effective limit is its burst rate; below one
//! interval's excess it is its limit again. The ledger enforces whichever is in effect
//! exactly as it enforces a limit, so a host is never above its burst rate, and the
//! excess is admitted from global tokens only (its own reservation, then the unreserved
//! capacity): a burst never takes from another host's reservation.

pub use crate::config::{Burst, BurstBudget, MAX_BURST_SECONDS};
use crate::cost::{Amount, RES, Resource};
use crate::time::Nanos;

impl BurstBudget {
    /// Burst rate less limit, per period.
    fn excess(&self, r: Resource) -> u128 {
        self.rate.get(r).saturating_sub(self.limit.get(r)) as u128
    }
    /// The bucket, in credit units (cost units times nanoseconds per period).
    fn bucket(&self, r: Resource) -> u128 {
        self.excess(r) * self.seconds.0 as u128
    }
    /// How far below zero the bucket may go, in credit units: what the ledger lets a
    /// host take ahead of its limit's schedule (a channel's cached allowance, one
    /// release burst, a counter flush) is not credit, and a bucket clamped at zero
    /// would turn that jitter into credit a host held at its limit never earned.
    fn debt_floor(&self, r: Resource, period: Nanos, check_interval: Nanos) -> u128 {
        let l = self.limit.get(r) as u128;
        let p = period.0.max(1) as u128;
        (l / 32).max(l * 4 * check_interval.0 as u128 / p) * p
    }
}

/// What one step of the bucket is given: the time since the last step, the work
/// admitted in it (cost units), whether commands were held in it, and the domain's
/// period and check interval.
#[derive(Debug, Clone, Copy)]
pub struct BurstStep {
    pub dt: Nanos,
    pub used: Amount,
    /// Commands were held (for tokens or the limit): the host was not under its limit
    /// by choice, so it earns nothing. A host held at its limit leaves a little of it
    /// unused (allowance released and not taken in time expires), and counted as
    /// credit that became a burst of a few check intervals every few seconds.
    pub held: bool,
    pub period: Nanos,
    pub check_interval: Nanos,
}

/// A host's (or group's) burst credit. Credit is kept in cost units times nanoseconds
/// per period (the limit's per-period amount times an interval's length is then exact),
/// signed: see [`BurstBudget::debt_floor`]; what is reported never goes below zero.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BurstBucket {
    credit: [i128; 2],
    /// Per resource: the limit in effect is the burst rate.
    raised: [bool; 2],
    /// In the last step it was admitted more than its limit allows (spending credit).
    spending: bool,
    burst_this_period: bool,
    /// Ended periods in which it burst in some check interval (monotonic).
    bursting_periods: u64,
}

impl BurstBucket {
    /// A bucket for `b`, full: a host created or replayed from `save_config` may burst
    /// at once (a boot storm is the case bursts are for), as a new AWS gp2 volume does.
    pub fn full(b: &BurstBudget) -> Self {
        let mut k = BurstBucket::default();
        for r in Resource::ALL {
            k.credit[r.index()] = b.bucket(r) as i128;
        }
        k
    }

    /// The burst changed from `old` to `new` (an update): a resource that had no burst
    /// starts full, the others keep their credit within the new bucket. Returns whether
    /// the effective limit may have changed.
    /// `periods` are the domain's period before and after (credit is kept in cost
    /// units across a change of period).
    pub fn rebudget(
        &mut self,
        old: &BurstBudget,
        new: &BurstBudget,
        periods: (Nanos, Nanos),
    ) -> bool {
        let before = self.raised;
        let (was, now) = (periods.0.0.max(1) as i128, periods.1.0.max(1) as i128);
        for r in Resource::ALL {
            let i = r.index();
            let bucket = new.bucket(r) as i128;
            self.credit[i] = if !new.is_on(r) {
                0
            } else if !old.is_on(r) {
                bucket
            } else {
                (self.credit[i] / was * now).min(bucket)
            };
            if !new.is_on(r) {
                self.raised[i] = false;
            }
        }
        before != self.raised || old != new
    }

    /// One step: the bucket earns the limit over `s.dt` (unless commands were held)
    /// and pays what was admitted, then decides whether the host bursts (at least two check intervals of the
    /// excess in the bucket) or holds to its limit (less than one). Returns whether
    /// that decision changed for some resource.
    pub fn advance(&mut self, b: &BurstBudget, s: BurstStep) -> bool {
        let mut changed = false;
        let p = s.period.0.max(1) as i128;
        self.spending = false;
        for r in Resource::ALL {
            let i = r.index();
            if !b.is_on(r) {
                continue;
            }
            let paid = s.used.get(r) as i128 * p;
            let allowed = b.limit.get(r) as i128 * s.dt.0 as i128;
            self.spending |= self.raised[i] && paid > allowed;
            // Held at its own limit, a host earns nothing (see `BurstStep::held`); while
            // its limit is raised it earns and pays step by step, so that what it was
            // refused in one step (held for tokens) and took in the next nets out.
            let earned = if s.held && !self.raised[i] {
                allowed.min(paid)
            } else {
                allowed
            };
            let floor = -(b.debt_floor(r, s.period, s.check_interval) as i128);
            self.credit[i] = (self.credit[i] + earned - paid).clamp(floor, b.bucket(r) as i128);
            let interval = (b.excess(r) * s.check_interval.0 as u128) as i128;
            let raised = if self.raised[i] {
                self.credit[i] >= interval
            } else {
                b.excess(r) > 0 && self.credit[i] >= 2 * interval
            };
            changed |= raised != self.raised[i];
            self.raised[i] = raised;
        }
        self.burst_this_period |= self.spending;
        changed
    }

    /// The limit in effect: the burst rate where it bursts, else `limit`.
    pub fn effective_limit(&self, b: &BurstBudget, limit: Amount) -> Amount {
        let mut out = limit;
        for r in Resource::ALL {
            if self.raised[r.index()] {
                out.set(r, b.rate.get(r));
            }
        }
        out
    }

    /// Whether it bursts now: its limit is raised and in the last step it was admitted
    /// more than the limit allows (an idle host with credit has its limit raised but
    /// does not burst).
    pub fn bursting(&self) -> bool {
        self.spending
    }

    /// Credit left, in cost units (never negative).
    pub fn credit(&self, period: Nanos) -> Amount {
        let p = period.0.max(1) as i128;
        let mut a = Amount::ZERO;
        for r in Resource::ALL {
            a.set(r, (self.credit[r.index()].max(0) / p) as u64);
        }
        a
    }

    /// Seconds at the burst rate the credit left lasts (the least over the resources
    /// with a burst); `None` without a burst.
    pub fn credit_seconds(&self, b: &BurstBudget) -> Option<f64> {
        RES.iter()
            .filter(|&&r| b.is_on(r) && b.excess(r) > 0)
            .map(|&r| self.credit[r.index()].max(0) as f64 / (b.excess(r) as f64 * 1e9))
            .reduce(f64::min)
            .or(b.any().then_some(0.0))
    }

    /// Ends a period: counts it if it burst in it.
    pub fn end_period(&mut self) {
        self.bursting_periods += self.burst_this_period as u64;
        self.burst_this_period = false;
    }

    /// Ended periods in which it burst (monotonic).
    pub fn bursting_periods(&self) -> u64 {
        self.bursting_periods
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const T: Nanos = Nanos::from_secs(1);
    const CI: Nanos = Nanos::from_millis(1);

    fn budget(limit: u64, rate: u64, seconds: u64) -> BurstBudget {
        BurstBudget {
            rate: Amount::new(rate, 0),
            limit: Amount::new(limit, 0),
            seconds: Nanos::from_secs(seconds),
        }
    }

    fn step(used: u64) -> BurstStep {
        BurstStep {
            dt: CI,
            used: Amount::new(used, 0),
            held: false,
            period: T,
            check_interval: CI,
        }
    }

    #[test]
    fn a_full_bucket_lasts_its_seconds_at_the_burst_rate_then_the_limit_holds() {
        // Limit 1,000 IOPS, burst 3,000 for 2 s: a host that takes all it is allowed
        // runs 2 s (to one check interval) at 3,000, then at 1,000.
        let b = budget(1000, 3000, 2);
        let mut k = BurstBucket::full(&b);
        let mut ms_bursting = 0u64;
        for _ in 0..5000 {
            let allowed = k.effective_limit(&b, b.limit).ops; // per period = per second
            k.advance(&b, step(allowed / 1000));
            ms_bursting += k.bursting() as u64;
        }
        assert!((1998..=2000).contains(&ms_bursting), "{ms_bursting} ms");
        assert_eq!(k.effective_limit(&b, b.limit).ops, 1000);
        assert_eq!(k.credit_seconds(&b), Some(0.0));
    }

    #[test]
    fn an_idle_host_earns_its_unused_limit_up_to_the_bucket() {
        let b = budget(1000, 3000, 2);
        let mut k = BurstBucket::default();
        for _ in 0..1000 {
            k.advance(&b, step(0));
        }
        // 1 s idle earns 1,000 operations: half a second of the 2,000 excess.
        assert_eq!(k.credit(T).ops, 1000);
        assert_eq!(k.credit_seconds(&b), Some(0.5));
        for _ in 0..10_000 {
            k.advance(&b, step(0));
        }
        assert_eq!(k.credit(T).ops, 4000, "capped at the bucket");
    }

    #[test]
    fn an_idle_host_with_credit_has_its_limit_raised_but_does_not_burst() {
        let b = budget(1000, 3000, 2);
        let mut k = BurstBucket::full(&b);
        k.advance(&b, step(0));
        assert_eq!(k.effective_limit(&b, b.limit).ops, 3000);
        assert!(!k.bursting());
        k.advance(&b, step(1));
        assert!(!k.bursting(), "at its limit it spends nothing");
        k.advance(&b, step(2));
        assert!(k.bursting());
        k.end_period();
        k.advance(&b, step(0));
        k.end_period();
        assert_eq!(k.bursting_periods(), 1);
    }

    #[test]
    fn jitter_at_the_limit_earns_no_credit() {
        // A host held at its limit takes its allowance in batches: 0 then a batch.
        let b = budget(64_000, 128_000, 10);
        let mut k = BurstBucket::default();
        for i in 0..100_000u64 {
            // It fetches a batch of allowance ahead of its schedule (at most one batch).
            let used = if i % 16 == 0 { 64 * 16 } else { 0 };
            k.advance(&b, step(used));
            assert_eq!(k.effective_limit(&b, b.limit), b.limit, "raised at {i}");
        }
    }

    #[test]
    fn an_update_keeps_credit_within_the_new_bucket_and_a_new_burst_starts_full() {
        let old = budget(1000, 3000, 2);
        let mut k = BurstBucket::full(&old);
        let smaller = budget(1000, 2000, 1);
        k.rebudget(&old, &smaller, (T, T));
        assert_eq!(k.credit(T).ops, 1000);
        let none = BurstBudget::default();
        k.rebudget(&smaller, &none, (T, T));
        assert_eq!(k.credit(T).ops, 0);
        k.rebudget(&none, &old, (T, T));
        assert_eq!(k.credit(T).ops, 4000);
    }

    proptest! {
        /// Whatever the host asks, within what the ledger admits: credit is never
        /// reported negative nor above the bucket; the host is never allowed above its
        /// burst rate; and with less than one interval of credit it is held to its limit.
        #[test]
        fn credit_stays_in_the_bucket_and_the_limit_holds_without_it(
            limit in 1u64..1_000_000,
            extra in 0u64..2_000_000,
            seconds in 1u64..100,
            demand in proptest::collection::vec(0u64..4_000_000, 1..400),
        ) {
            let b = budget(limit, limit + extra, seconds);
            let mut k = BurstBucket::full(&b);
            let bucket = extra as u128 * seconds as u128; // cost units at T = 1 s
            for want in demand {
                let before = k.credit(T).ops as u128;
                let allowed = k.effective_limit(&b, b.limit).ops;
                prop_assert!(allowed <= limit + extra);
                if (before + 1) * 1000 <= extra as u128 {
                    // Less than one interval (1/1000 s) of the excess: the limit.
                    prop_assert_eq!(allowed, limit);
                }
                // The ledger admits at most the effective limit over the interval.
                let used = want.min(allowed.div_ceil(1000));
                k.advance(&b, step(used));
                let c = k.credit(T).ops as u128;
                prop_assert!(c <= bucket, "credit {} above bucket {}", c, bucket);
                if let Some(s) = k.credit_seconds(&b) {
                    prop_assert!(s >= 0.0 && s <= seconds as f64 + 1e-9);
                }
            }
        }
    }
}
