//! The check interval's pass over the hosts: Haechi's token conversion (an idle host's
//! unused reservation returns to the global pool, which becomes `max(C (T - t) - L, 0)`),
//! the pool's close for lagging hosts, and then the sharing policy's turn.

use super::Monitor;
use super::host::{IntervalTotals, IntervalView};
use super::sharing::Interval;
use crate::config::{ReservationRelease, TokenMode};
use crate::cost::RES;
use crate::ledger::clamp_pool;
use crate::sync::Ordering;
use crate::time::{Nanos, mul_div};

impl Monitor {
    /// Token conversion at time `now` (Haechi step T2), adapted to a target that sees
    /// demand: a host's unused reservation beyond `R_i (T - t) / T` is reclaimed only
    /// while it has no command outstanding (none in flight, none held). Haechi infers
    /// "insufficient demand" from consumption because one-sided I/O is invisible to its
    /// server; here a backlogged host whose commands are merely slow to be served keeps
    /// its tokens, so others' global tokens cannot crowd it out of its reservation. The
    /// global pool is what the rest of the period can serve after the residual
    /// reservations, the credit already granted, the tokens sitting in channel caches
    /// and the work still in flight. Then the sharing policy has its turn.
    pub(super) fn convert(&mut self, now: Nanos) {
        let paced = self.cfg.release == ReservationRelease::Paced;
        let shares = self.policy.converts_always();
        let convert = self.conversion_started(shares);
        if !convert && !paced && !shares {
            self.learn_depth_alone(now);
            return;
        }
        let (num, den) = self.left_fraction(now);
        self.period_ticks += 1;
        let view = self.interval_view(now, convert, paced);
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

    /// Whether token conversion runs at this check interval (Haechi's step S2: not
    /// until some host has dipped into the global pool, unless the policy converts
    /// always).
    fn conversion_started(&mut self, shares: bool) -> bool {
        if self.cfg.mode != TokenMode::Haechi {
            return false;
        }
        if shares {
            self.converting = true;
        }
        if !self.converting {
            let avail = self.shared.global_available();
            let initial = self.books.global_initial;
            if avail.ops < initial.ops || avail.bytes < initial.bytes {
                self.converting = true;
            }
        }
        self.converting
    }

    /// What every host's check interval is judged with at `now`.
    fn interval_view(&self, now: Nanos, convert: bool, paced: bool) -> IntervalView {
        let (num, den) = self.left_fraction(now);
        IntervalView {
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
        }
    }

    /// Haechi's global pool: what the rest of the period can serve beyond what is
    /// promised or in flight (`outstanding`, as the policy counts it), and never more
    /// than the period's unspent budget.
    pub(super) fn global_bound(
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
    pub(super) fn set_global_pool(&mut self, bound: [u64; 2]) {
        let tag = self.tag();
        for (r, g) in bound.into_iter().enumerate() {
            if let Some(old) = self.shared.global[r].set_in_period(tag, g) {
                self.books.audit.issued[r] += g as i128 - old as i128;
            }
        }
    }
}
