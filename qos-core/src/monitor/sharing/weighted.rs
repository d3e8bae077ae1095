//! Weighted sharing (`weighted`): at every check interval, what the target can serve in
//! the next interval beyond what reservations used in the last one (never more than
//! the global pool) is split by weighted max-min fairness into the hosts' credit:
//! first each group's surplus reservation among its hosts, then the slice among groups
//! and lone hosts by their weights, then each group's part among its hosts by theirs,
//! within the group's limit. A host's claim is what it can hold while it has commands
//! held (it is backlogged); unbounded while all its commands are out (a closed loop at
//! its queue depth, which would go faster on a less busy target); else twice what it
//! took in the last interval plus a batch (so it can grow). A host that wants less
//! leaves the rest to the others. While a backlogged host lags behind its reservation,
//! only lagging hosts get anything (reservations first). Shares are computed in
//! 1/65536 of a token and the fractions carried per host, so small slices still split
//! by weight.

use crate::config::{BudgetClass, UNLIMITED};
use crate::cost::{Amount, RES};
use crate::estimator::{CapacityEstimator, Evidence};
use crate::ledger::CounterSnapshot;
use crate::share::{Claim, water_fill};
use crate::sync::Ordering;
use crate::time::{Nanos, mul_div, mul_div_ceil};

use super::{Interval, SharingPolicy, four};

/// Shares are computed in 1/65536 of a token.
const FIXED_SHIFT: u32 = 16;

fn fixed(tokens: u64) -> u64 {
    tokens.saturating_mul(1 << FIXED_SHIFT)
}

/// Who a top-level claim of the share stands for.
#[derive(Debug, Clone, Copy)]
enum Owner {
    Group(usize),
    Host(usize),
}

/// Scratch space of the share, kept between check intervals.
#[derive(Debug, Default)]
struct Scratch {
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

/// Intervals of a period in which the share ran, and in which the hosts claimed all of
/// it (demand beyond what the target was offering).
#[derive(Debug, Clone, Copy, Default)]
struct ShareTicks {
    ran: u32,
    claimed_all: u32,
}

#[derive(Debug, Default)]
pub(crate) struct Weighted {
    /// When the share last ran, and what it still owes the hosts (positive) or they
    /// owe it (negative), per resource, in fixed point.
    last_share: Nanos,
    balance: [i128; 2],
    ticks: [ShareTicks; 2],
    scratch: Scratch,
}

/// One resource's share at one check interval.
#[derive(Debug, Clone, Copy)]
struct Slice {
    r: usize,
    /// Nanoseconds since the last share, and of the period so far plus the release
    /// burst (at most the period).
    dt: u64,
    released: u64,
}

impl SharingPolicy for Weighted {
    fn supports_groups(&self) -> bool {
        true
    }
    fn credit_only(&self, bytes_metered: bool) -> u64 {
        1 | (bytes_metered as u64) << 1
    }
    fn converts_always(&self) -> bool {
        true
    }
    /// The policy paces the pool by the target's rate itself, so the pool only bounds
    /// the period: work in flight is not subtracted again (it would leave the last
    /// intervals of every period without a slice).
    fn promised(&self, _outstanding: u64, held: u64) -> u64 {
        held
    }
    fn counts_unused_as_offered(&self) -> bool {
        true
    }
    /// The hosts claimed every slice they were offered in nine intervals of ten.
    fn demand_evidence(&self, r: usize) -> Evidence {
        let t = self.ticks[r];
        if t.ran >= 10 && t.claimed_all * 10 >= t.ran * 9 {
            Evidence::Backlogged
        } else {
            Evidence::None
        }
    }
    fn estimator(&self, e: CapacityEstimator) -> CapacityEstimator {
        e.with_fast_probes()
    }
    /// Batches stay whole (the monitor shares by weight); a host may hold at least four
    /// intervals of the whole capacity.
    fn host_batches(
        &self,
        batch: Amount,
        _: u64,
        _: u64,
        four_intervals: Amount,
    ) -> (Amount, Amount) {
        let f = four(batch);
        (
            batch,
            Amount::new(
                f.ops.max(four_intervals.ops),
                f.bytes.max(four_intervals.bytes),
            ),
        )
    }
    fn start_period(&mut self, start: Nanos) {
        self.last_share = start;
        self.balance = [0; 2];
        self.ticks = [ShareTicks::default(); 2];
    }

    fn share(&mut self, mut iv: Interval<'_>) {
        let dt = iv.now.saturating_sub(self.last_share).0;
        self.last_share = iv.now;
        let mask = iv.shared.credit_only.load(Ordering::Relaxed);
        if dt == 0 || mask == 0 {
            return;
        }
        let released = iv.released;
        let snaps: Vec<CounterSnapshot> = iv
            .members
            .hosts
            .iter()
            .map(|h| h.shared.counters_hot())
            .collect();
        let mut res_used = [0u64; 2];
        for (h, c) in iv.members.hosts.iter().zip(&snaps) {
            for (r, used) in res_used.iter_mut().enumerate() {
                *used += c
                    .consumed_res
                    .get(RES[r])
                    .saturating_sub(h.share.seen_res[r]);
            }
        }
        let mut sc = std::mem::take(&mut self.scratch);
        for r in 0..2 {
            if mask & (1 << r) != 0 {
                let s = Slice { r, dt, released };
                self.demands(&iv, &snaps, s, &mut sc);
                let surplus_given = release_surplus(&mut iv, s, &mut sc);
                self.split(&mut iv, s, res_used[r], surplus_given, &mut sc);
            }
        }
        for (h, c) in iv.members.hosts.iter_mut().zip(&snaps) {
            h.share.seen_global = [c.consumed_global.ops, c.consumed_global.bytes];
            h.share.seen_res = [c.consumed_res.ops, c.consumed_res.bytes];
            h.share.seen_held = c.held_events;
        }
        self.scratch = sc;
    }
}

impl Weighted {
    /// Every host's claim in the share of resource `s.r` and the room it has now.
    fn demands(&self, iv: &Interval<'_>, snaps: &[CounterSnapshot], s: Slice, sc: &mut Scratch) {
        let r = s.r;
        let den = iv.left.1;
        sc.demand.clear();
        sc.room.clear();
        for (h, c) in iv.members.hosts.iter().zip(snaps) {
            let lag_ok = iv.closed & (1 << r) == 0
                || h.shared.lagging.load(Ordering::Relaxed) & (1 << r) != 0;
            if h.activity.idle || !lag_ok {
                sc.demand.push(0);
                sc.room.push(0);
                continue;
            }
            let took = c.consumed_global.get(RES[r]) - h.share.seen_global[r];
            let held = c.held_now > 0 || c.held_events != h.share.seen_held;
            let have = h.shared.credit[r]
                .count(iv.tag)
                .saturating_add(c.cached_global.get(RES[r]));
            let room = h.share.cap.get(RES[r]).saturating_sub(have);
            // Its limit, beyond its reservation, bounds what it can use.
            let headroom = if h.budgets.is_limited(BudgetClass::Total, RES[r]) {
                // The limit in effect: its burst rate while it bursts.
                let l = h.limit()[BudgetClass::Total as usize].get(RES[r]);
                mul_div(l.saturating_sub(h.reserved().get(RES[r])), 2 * s.dt, den)
                    .saturating_add(h.share.batch.get(RES[r]))
            } else {
                u64::MAX
            };
            let want = if held {
                room
            } else if h.activity.window_bound {
                // What it cannot take now goes to nobody this interval: otherwise
                // hosts with deeper queues take it, keep the target busy, and the
                // excess follows queue depth.
                u64::MAX
            } else {
                took.saturating_mul(2)
                    .saturating_add(h.share.batch.get(RES[r]))
                    .min(room)
            };
            sc.demand.push(fixed(want.min(headroom)));
            sc.room.push(fixed(room.min(headroom)));
        }
    }

    /// Splits the interval's slice of resource `s.r` among groups and lone hosts.
    fn split(
        &mut self,
        iv: &mut Interval<'_>,
        s: Slice,
        res_used: u64,
        surplus_given: u64,
        sc: &mut Scratch,
    ) {
        let (r, den) = (s.r, iv.left.1);
        // The slice, in fixed point: the target's capacity over the interval less what
        // reservations used, plus what earlier intervals owe (reservations that ran
        // ahead are paid back; fractions are kept).
        let tick_fp = (iv.budget.get(RES[r]) as i128)
            .saturating_mul(s.dt as i128)
            .saturating_mul(1 << FIXED_SHIFT)
            / den as i128;
        let balance = self.balance[r] + tick_fp - fixed(res_used) as i128 - surplus_given as i128;
        let pool = iv.shared.global[r].load().1;
        let pot = balance.clamp(0, fixed(pool) as i128) as u64;
        if pot == 0 {
            self.balance[r] = balance.clamp(-tick_fp, 0);
            return;
        }
        top_level_claims(iv, s, sc);
        sc.parts.clear();
        sc.parts.resize(sc.claims.len(), 0);
        let unclaimed = water_fill(pot, &sc.claims, &mut sc.parts);
        self.ticks[r].ran += 1;
        if unclaimed == 0 {
            self.ticks[r].claimed_all += 1;
        }
        // What nobody claimed is not owed to anyone later.
        self.balance[r] = (balance - (pot - unclaimed) as i128).clamp(-tick_fp, tick_fp.max(0));
        for k in 0..sc.owners.len() {
            let part = sc.parts[k];
            if part == 0 {
                continue;
            }
            match sc.owners[k] {
                Owner::Group(g) => {
                    fill_group(iv, g, r, part, sc, true);
                }
                Owner::Host(i) => {
                    let room = sc.room[i];
                    grant(iv, i, r, part.min(room), true);
                }
            }
        }
    }
}

/// The claims of groups (what their hosts claim, within the group's limit) and of
/// hosts in no group.
fn top_level_claims(iv: &Interval<'_>, s: Slice, sc: &mut Scratch) {
    let (r, den) = (s.r, iv.left.1);
    let hosts = &iv.members.hosts;
    sc.claims.clear();
    sc.owners.clear();
    for (g, ge) in iv.members.groups.iter().enumerate() {
        let lim = ge.budgets.limit.get(RES[r]);
        let room = if lim == UNLIMITED {
            u64::MAX
        } else {
            let own: u64 = hosts
                .iter()
                .filter(|h| h.group == Some(g))
                .map(|h| h.reserved().get(RES[r]))
                .sum();
            // While it bursts, the burst's excess over the time it burst comes on top.
            let excess = ge.budgets.burst.rate.get(RES[r]).saturating_sub(lim);
            let allowed = mul_div(lim.saturating_sub(own), s.released, den)
                .saturating_add(mul_div(excess, ge.burst_ns[r], den));
            allowed.saturating_sub(ge.given[r])
        };
        let want = hosts
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
    for (i, h) in hosts.iter().enumerate() {
        if h.group.is_none() {
            sc.claims.push(Claim {
                weight: h.budgets.weight as u64,
                demand: sc.demand[i],
            });
            sc.owners.push(Owner::Host(i));
        }
    }
}

/// Releases each group's surplus reservation, paced, to its own hosts; what none of
/// them can use now joins the unreserved pool. Returns what was given (fixed point).
fn release_surplus(iv: &mut Interval<'_>, s: Slice, sc: &mut Scratch) -> u64 {
    let (r, den) = (s.r, iv.left.1);
    let mut surplus_given = 0u64;
    for g in 0..iv.members.groups.len() {
        let ge = &mut iv.members.groups[g];
        let surplus = ge.surplus.get(RES[r]);
        if surplus == 0 {
            continue;
        }
        let due = mul_div_ceil(surplus, s.released, den);
        let slice = due.saturating_sub(ge.surplus_released[r]);
        ge.surplus_released[r] = due.max(ge.surplus_released[r]);
        if slice == 0 {
            continue;
        }
        let given = fill_group(iv, g, r, fixed(slice), sc, false);
        surplus_given += given;
        let unused = (fixed(slice) - given) as i128 >> FIXED_SHIFT;
        iv.books.move_global(iv.shared, iv.tag, r, unused);
    }
    surplus_given
}

/// Splits `amount` (fixed point) of resource `r` among group `g`'s hosts by weight and
/// their claims, from the global pool when `from_global`, else newly issued (the
/// group's surplus reservation). Returns what it gave (fixed point).
fn fill_group(
    iv: &mut Interval<'_>,
    g: usize,
    r: usize,
    amount: u64,
    sc: &mut Scratch,
    from_global: bool,
) -> u64 {
    sc.members.clear();
    sc.member_claims.clear();
    for (i, h) in iv.members.hosts.iter().enumerate() {
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
        let got = grant(iv, i, r, share, from_global);
        sc.demand[i] = sc.demand[i].saturating_sub(share);
        sc.room[i] = sc.room[i].saturating_sub(share);
        iv.members.groups[g].given[r] += got;
        given += share;
    }
    given
}

/// Gives host `i` its `part` (fixed point) of resource `r` as credit: the whole tokens
/// of it plus its carried fraction, from the global pool or newly issued. Returns the
/// whole tokens given.
fn grant(iv: &mut Interval<'_>, i: usize, r: usize, part: u64, from_global: bool) -> u64 {
    let (tag, global) = (iv.tag, &iv.shared.global[r]);
    let h = &mut iv.members.hosts[i];
    let exact = part.saturating_add(h.share.carry[r]);
    let want = exact >> FIXED_SHIFT;
    h.share.carry[r] = exact & ((1 << FIXED_SHIFT) - 1);
    if want == 0 {
        return 0;
    }
    let got = if from_global {
        global.take(tag, want)
    } else {
        want
    };
    if got == 0 {
        return 0;
    }
    if !h.shared.credit[r].give(tag, got) {
        if from_global {
            global.give(tag, got);
        }
        return 0;
    }
    if !from_global {
        iv.books.audit.issued[r] += got as i128;
    }
    let granted = &mut h.share.excess_granted;
    granted.set(RES[r], granted.get(RES[r]) + got);
    got
}
