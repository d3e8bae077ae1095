//! Admission by concurrency (`operating_point`, issue 26 item 2; opt-in): the excess is
//! not a budget of operations per period but room in a window of commands in flight at
//! the base, `W = Q*` of the learned depth curve (unbounded until the curve is known).
//!
//! - **Reservations first.** A command paid from its host's reservation is admitted as
//!   under first come (reservation tokens) and never waits for the window; it takes a
//!   slot all the same (it is in flight at the base), so excess is admitted only while
//!   the domain's commands in flight, reserved ones included, are below `W`. Hence
//!   `in flight <= W + reserved commands in flight`, whatever the threads do.
//! - **The slot count** is one atomic word of the domain
//!   ([`crate::window::WindowShared`]: the window's shared state is the I/O path's,
//!   in `window.rs`; this file is the policy that sets it): a channel
//!   takes a slot at admission (a compare-and-swap that never goes past `W` for
//!   excess), remembers how many it holds, and gives one back at each completion it
//!   books (`ChannelTokens::record_completion`), so a slot is returned exactly once and
//!   the count never goes below zero, also across a change of the domain's sharing.
//! - **Weighted order among contending hosts: start-time fair queueing with a virtual
//!   clock V** (dmClock's proportional tags, without banking). Every admission of host
//!   i moves its tag to `max(tag_i, V) + cost / w_i` (reserved ones too, so a host
//!   whose reservation is above its weighted share gets its reservation and no excess:
//!   `max(r_i, theta w_i)`, what `entitle` promises). An excess admission needs
//!   `tag_i <= V + slack`. V is advanced by the monitor at every check interval to the
//!   smallest tag of the hosts that were held by the window since the last one: SFQ's
//!   virtual time is the start tag of the backlogged flow served next, and a host held
//!   by the window is the backlogged flow here. Hosts that were not held (self-limited)
//!   stay at or below V, so they are eligible at once and take released slots first;
//!   hosts that ran ahead by more than `slack` (a few check intervals of the target's
//!   work, divided among the waiting weights) wait for V. Why not V advanced by each
//!   admission (`cost / sum of contending weights`)? A self-limited host's admissions
//!   would move V too, V would run ahead of every contending host and the order would
//!   fall back to whoever retries first; and it is one more shared read-modify-write
//!   per command. Why not DRR over held queues? The held queues are per channel, on
//!   several threads: a round over them needs a dispatcher the plugin does not have.
//! - **Retrying on a completion.** A slot frees at a completion, not at a check
//!   interval: `TargetChannel::on_completion` does not skip its try while the channel
//!   waits for the window, and the lab retries every host's held commands in tag order
//!   at each completion (a dispatcher over all channels). The plugin's channels only
//!   see their own completions (docs/architecture.md, "Admission by concurrency").
//! - **No spiral.** With the window at `Q*` the curve only sees depths up to `Q*`; its
//!   buckets above would age out, T(max) fall, and Q* with it. While the window binds
//!   (some host was held by it in the last depth sample's intervals) the buckets above
//!   it are kept ([`crate::depth::DepthCurve::keep_above`]); their level still follows
//!   a slower or faster target through the curve's drift rescale.
//! - Tokens for the excess are first come's (Haechi's global pool), so the capacity
//!   estimate still bounds a period; the window decides who goes first and how deep
//!   the target runs.
//! - **Tenant groups** (domain -> group -> host). Order: a host of group g moves its
//!   tag by `cost * A_g / (W_g * w_i)`, `A_g` the weights of g's hosts that are not
//!   idle, so g's hosts together move at g's weight and split it by theirs. Exact
//!   while all of them are held; a self-limited host of g takes what it uses on top of
//!   what the others of g get at g's weight, so g then gets a little more than its
//!   weighted share (dmClock's flat tags do the same). The group's limit: at every
//!   check interval, once its hosts were admitted what the limit released so far
//!   (`L_g (t + burst) / T`, reserved work included) their excess waits (a flag per
//!   host, not the window's count, so V does not wait for them) until the limit
//!   releases more: one check interval of overshoot at most. Its reservation: while
//!   its hosts lag behind what it released so far with commands held, the global
//!   pool is closed to everybody else, as for a host lagging behind its own; its
//!   hosts take the excess (and the window's slots) meanwhile. Its reservation beyond
//!   its hosts' own is kept out of the global pool until released, as under the other
//!   policies.

use crate::circulation::{CirculationProbe, ProbeReport};
use crate::config::UNLIMITED;
use crate::cost::{Amount, RES};
use crate::depth::{DepthCurve, OperatingTarget};
use crate::entitlement::{Claimant, entitle};
use crate::ledger::DomainShared;
use crate::sync::Ordering;
use crate::time::{Nanos, mul_div, mul_div_ceil};
use crate::window::{HostWindow, TAG_UNIT};

use super::{Interval, SharingPolicy};

/// The operating-point policy's state on the monitor's side.
#[derive(Debug, Default)]
pub(crate) struct OperatingPoint {
    /// Check intervals since the last depth sample in which some host was held by the
    /// window.
    bound_ticks: u32,
    /// W, commands.
    window: u64,
    /// Depth samples left in the current probe below the operating point, and since
    /// the last one.
    probe_left: u32,
    since_probe: u32,
    /// The tenant groups at the last check interval.
    groups: Vec<GroupTick>,
    /// Over circulation: when the last census began (see [`CENSUS_EVERY`]).
    census_at: Nanos,
    /// Over circulation: the hosts' claims on N* and their hold targets (reused).
    claims: Vec<CirculationClaim>,
    uncorrected: Vec<CirculationClaim>,
    /// When the hosts' parts were last corrected by what they got.
    corrected_at: Nanos,
    group_claims: Vec<GroupClaim>,
    parts: Vec<u64>,
    /// Whether the window is over the hosts' circulation (the operating point given
    /// as commands in circulation), as of the last check interval.
    over_circulation: bool,
    /// Over circulation by η: N\* learned by toggling (`None` in the other modes).
    probe: Option<CirculationProbe>,
    /// Over circulation, the global pool is first come's: work-conserving while no
    /// reservation is at risk, paced while one is behind; the hold targets decide how
    /// deep the target runs and who gets what. Haechi's pool, bound at the capacity
    /// estimate, held what the target could serve: on the real target it bound the
    /// side-by-side total at the estimate, 0.69-0.75 of plain (2026-11-29). With W at
    /// the base the pool stays Haechi's: opened, the window bound less and the lab's
    /// shares came apart (op-depth-8hosts: worst contending host 64 % off e_i).
    pool: super::FirstCome,
}

/// Over circulation, how often every host's excess is held for [`CENSUS_FOR`] whatever
/// its hold target says: the hosts' commands then gather in the hold queues, so the
/// target sees how many each circulates (on NVMe/TCP an unheld host's commands are
/// mostly in the transport, where the QoS bdev does not see them; a circulation never
/// seen would cap the host's part of N* at what is at the base). About 0.4 % of the
/// time.
const CENSUS_EVERY: Nanos = Nanos::from_millis(250);
/// How long a census holds: several of the transport's round trips (tens of
/// microseconds on loopback).
const CENSUS_FOR: Nanos = Nanos::from_millis(1);

/// Depth samples (about 10 ms each) a probe below the operating point lasts: the first
/// is mostly the drain to the lower depth.
const PROBE_SAMPLES: u32 = 2;
/// Depth samples between probes once the curve is known below the operating point.
const PROBE_EVERY: u32 = 100;

/// Of the hosts held by the window in the last interval: the smallest tag and their
/// weights; the weights of all hosts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Waiting {
    pub(crate) min_tag: Option<u64>,
    pub(crate) weight: u64,
    pub(crate) all_weight: u64,
}

/// The slack of the window's order: how far (tag units) a host may run ahead of V.
/// About four check intervals of the target's work (`per_tick`, operations) or two
/// windows, whichever is more, divided among the waiting weights.
pub(crate) fn slack(per_tick: u64, window: u64, waiting: Waiting) -> u64 {
    let weight = if waiting.weight > 0 {
        waiting.weight
    } else {
        waiting.all_weight
    }
    .max(1);
    let work = per_tick
        .saturating_mul(4)
        .max(window.saturating_mul(2))
        .max(8);
    mul_div(work, TAG_UNIT, weight)
}

impl OperatingPoint {
    /// The window for the operating point `target` picks on `curve` now; keeps the
    /// buckets above it while it binds.
    pub(crate) fn learn(
        &mut self,
        curve: &mut DepthCurve,
        now: Nanos,
        target: OperatingTarget,
        shared: &DomainShared,
    ) {
        let bound = std::mem::take(&mut self.bound_ticks) > 0;
        if let OperatingTarget::InFlight(_) | OperatingTarget::Circulation(_) = target {
            // Over the hosts' circulation (`share` sets the hold targets): W does not
            // bind.
            self.window = 0;
            shared.window.set_unbounded();
            return;
        }
        let Some(op) = curve.operating_point(now, target) else {
            self.window = 0;
            shared.window.set_unbounded();
            return;
        };
        if bound || self.probe_left > 0 {
            curve.keep_above(op.in_flight_milli, now);
        }
        let w = op.in_flight_milli.div_ceil(1000).max(1);
        // The curve knows nothing below the operating point (a load that always had the
        // same depth): Q* is only where the hosts put the target, so look below it, a
        // bucket (a quarter octave) lower, until a probe falls short of eta; then now
        // and then.
        let shallowest = curve
            .curve(now)
            .first()
            .is_some_and(|p| p.in_flight_milli >= op.in_flight_milli);
        self.since_probe = self.since_probe.saturating_add(1);
        if self.probe_left == 0 && (shallowest || self.since_probe >= PROBE_EVERY) && w > 1 {
            self.probe_left = PROBE_SAMPLES;
            self.since_probe = 0;
        }
        let w = if self.probe_left > 0 {
            self.probe_left -= 1;
            (w * 27 / 32).max(1)
        } else {
            w
        };
        self.window = w;
        shared.window.set_limit(w);
    }
}

/// A tenant group at one check interval.
#[derive(Debug, Clone, Copy, Default)]
struct GroupTick {
    /// The weights of its hosts that are not idle.
    active_weight: u64,
    /// What its hosts were admitted this period (reserved and excess), per resource.
    used: [u64; 2],
    /// Some host of it has commands held by QoS now.
    backlogged: bool,
}

/// Tag units per operation of a host of weight `weight` in a group of weight
/// `group_weight` whose hosts that are not idle weigh `active` together: the group's
/// share split among them by weight, `TAG_UNIT * active / (group_weight * weight)`
/// (start-time fair queueing with the nested weights flattened; exact while all of the
/// group's active hosts are held, an approximation otherwise, see the module's doc).
fn nested_step(weight: u32, group_weight: u32, active: u64) -> u64 {
    let w = u64::from(weight.max(1));
    let den = u64::from(group_weight.max(1)).saturating_mul(w);
    mul_div(TAG_UNIT, active.max(w), den).max(1)
}

impl OperatingPoint {
    /// Per tenant group: its hosts' excess waits while the group has used what its
    /// limit released so far (`L_g (t + burst) / T`, plus a burst's excess over the
    /// time it burst), and while it lags behind its released reservation with
    /// commands held the global pool is closed to everybody else, as for a host
    /// lagging behind its own (reservations first).
    fn hold_groups(&mut self, iv: &Interval<'_>) {
        let (groups, hosts) = (&iv.members.groups, &iv.members.hosts);
        self.groups.clear();
        self.groups.resize(groups.len(), GroupTick::default());
        for h in hosts {
            let Some(g) = h.group else {
                unblock(&h.shared.window);
                continue;
            };
            let t = &mut self.groups[g];
            if !h.activity.idle {
                t.active_weight += u64::from(h.cfg.weight.max(1));
            }
            let (c, s) = (h.shared.counters_hot(), &h.outcomes.at_start);
            for (r, used) in t.used.iter_mut().enumerate() {
                let now = c.consumed_res.get(RES[r]) + c.consumed_global.get(RES[r]);
                let then = s.consumed_res.get(RES[r]) + s.consumed_global.get(RES[r]);
                *used = used.saturating_add(now.saturating_sub(then));
            }
            t.backlogged |= c.held_now > 0;
        }
        let den = iv.left.1.max(1);
        // A group is due what was released, and the slack a host may lag by on top (a
        // host gets the rest from its reservation tokens at the end; a group has none,
        // so it runs ahead of its release by that slack).
        let res_due = iv.released.saturating_add(iv.lag_slack).min(den);
        for (g, ge) in groups.iter().enumerate() {
            let t = self.groups[g];
            let (mut blocked, mut lag) = (false, 0u64);
            for r in 0..2 {
                let lim = ge.budgets.limit.get(RES[r]);
                if lim != UNLIMITED {
                    let excess = ge.budgets.burst.rate.get(RES[r]).saturating_sub(lim);
                    let allowed = mul_div(lim, iv.released, den).saturating_add(mul_div(
                        excess,
                        ge.burst_ns[r],
                        den,
                    ));
                    blocked |= t.used[r] >= allowed;
                }
                let res = ge.budgets.reservation.get(RES[r]);
                if res > 0 && t.backlogged && mul_div_ceil(res, res_due, den) > t.used[r] {
                    lag |= 1 << r;
                }
            }
            for h in hosts.iter().filter(|h| h.group == Some(g)) {
                h.shared.window.set_blocked(blocked);
                if lag != 0 {
                    h.shared.lagging.fetch_or(lag, Ordering::Release);
                }
            }
            if lag != 0 {
                iv.shared.global_closed.fetch_or(lag, Ordering::Release);
            }
        }
    }
}

fn unblock(w: &HostWindow) {
    w.set_blocked(false);
}

impl OperatingPoint {
    /// Over circulation (the operating point given as commands in circulation,
    /// `operating_in_flight`, N*): each host's hold target h_i = N_i - n_i*, where N_i is
    /// what it circulates as far as the target saw it
    /// ([`super::super::host::HostEntry::circulation_seen`]) and n_i* its part of N*:
    /// N* split by [`entitle`] (reservations first, as the commands they need at the
    /// estimate's rate, the rest by weight, each capped at N_i). By Little's law a host
    /// that keeps n_i* of its commands outside QoS gets n_i* / N* of the target: no
    /// order of tags is needed, and the target runs at N*. Returns whether the window
    /// is over circulation (`false` for the other operating targets: W counts commands
    /// at the base).
    fn hold_targets(&mut self, iv: &mut Interval<'_>) -> bool {
        let Some(given) = self.circulation_target(iv) else {
            return false;
        };
        let hosts = &iv.members.hosts;
        let since = iv.now.saturating_sub(self.census_at);
        if since >= CENSUS_EVERY {
            self.census_at = iv.now;
        }
        if since >= CENSUS_EVERY || since < CENSUS_FOR {
            for h in hosts {
                h.shared.window.set_hold_target(u64::MAX);
            }
            return true;
        }
        self.claims.clear();
        self.claims.extend(hosts.iter().map(|h| CirculationClaim {
            weight: u64::from(h.cfg.weight.max(1)),
            reservation_ops: h.budgets.reservation_total().ops,
            limit_ops: h.limit()[crate::config::BudgetClass::Total as usize].ops,
            seen: h.circulation_seen(),
            group: h.group,
            gain_milli: h.circulation.gain_milli,
        }));
        self.group_claims.clear();
        self.group_claims
            .extend(iv.members.groups.iter().map(|g| GroupClaim {
                weight: u64::from(g.budgets.weight.max(1)),
                reservation_ops: g.budgets.reservation.ops,
                limit_ops: g.budgets.limit.ops,
            }));
        // C, to turn rates into commands at N*: what the target did at N* in the last
        // ended period (the capacity estimate before one has, or with no work in it;
        // a hint far above what the target does would cap a limit at too few
        // commands).
        let done: u64 = hosts.iter().map(|h| h.window.completed_ops).sum();
        let rate_ops = if done > 0 { done } else { iv.budget.ops };
        let n_star = given.unwrap_or_else(|| self.learned_n_star(iv));
        hold_targets(
            n_star,
            rate_ops,
            (&self.claims, &self.group_claims),
            &mut self.parts,
        );
        let open = self.probe.as_ref().is_some_and(CirculationProbe::is_open);
        if !open && iv.now.saturating_sub(self.corrected_at) >= CORRECT_EVERY {
            self.correct(iv, n_star, rate_ops);
        }
        let hosts = &iv.members.hosts;
        for (h, &t) in hosts.iter().zip(&self.parts) {
            h.shared.window.set_hold_target(t);
            h.shared
                .window
                .set_hold_for(hold_bound(t, h.window.completed_ops, iv.cfg.period));
        }
        true
    }
}

impl OperatingPoint {
    /// Over circulation: `Some(Some(N*))` given, `Some(None)` learned for η (the
    /// learner is set up), `None` in the other modes (W counts commands at the base).
    fn circulation_target(&mut self, iv: &Interval<'_>) -> Option<Option<u64>> {
        let given = match iv.cfg.operating_target() {
            OperatingTarget::InFlight(q) => Some(Some(q.div_ceil(1000))),
            OperatingTarget::Circulation(eta) => {
                self.probe
                    .get_or_insert_with(|| CirculationProbe::new(eta))
                    .set_eta(eta);
                return Some(None);
            }
            _ => None,
        };
        self.probe = None;
        iv.shared.probe_open.store(0, Ordering::Release);
        given
    }

    /// N\* from the learner at this check interval (`self.claims` are this interval's:
    /// what the hosts circulate). The open spell measures the target holding nothing:
    /// the pool's holds for others' reservations go too (a host's own limit still
    /// holds); what the hosts complete from the spell's start until they are held again
    /// follows their queue depths, not their parts, so the shares' correction leaves it
    /// out.
    fn learned_n_star(&mut self, iv: &mut Interval<'_>) -> u64 {
        let circulating = self.claims.iter().map(|c| c.seen).sum();
        let Some(p) = self.probe.as_mut() else {
            return circulating;
        };
        let hosts = &mut iv.members.hosts;
        let n_star = if iv.cfg.bypass {
            p.pause(circulating)
        } else {
            p.tick(iv.now, circulating, || {
                hosts
                    .iter()
                    .map(|h| h.shared.completed_work_and_service().0)
                    .fold(0, u64::saturating_add)
            })
        };
        iv.shared
            .probe_open
            .store(p.is_open() as u64, Ordering::Release);
        if p.is_unsettled() {
            for h in hosts.iter_mut() {
                h.circulation.completed_at = h.shared.completed_work_and_service().0;
            }
        }
        n_star
    }
}

/// How often the hosts' parts of N* are corrected by what they got (several thousand
/// completions of a small host at these rates: a share to about 2 %).
const CORRECT_EVERY: Nanos = Nanos::from_millis(100);
/// A part's correction stays within these multiples of its weight (thousandths).
const GAIN_MIN: u64 = 250;
const GAIN_MAX: u64 = 4000;

impl OperatingPoint {
    /// **Shares by feedback.** Little's law splits N* by the commands each host keeps
    /// outside QoS, assuming every host's commands take the same round trip; on NVMe/TCP
    /// a host's round trip grows with its own commands in flight (they queue behind
    /// each other in its connection), so hosts with few got up to 30 % more than their
    /// part, hosts with many up to 20 % less (docs/benchmarks.md). Every
    /// [`CORRECT_EVERY`], among the hosts held (their part below what they circulate),
    /// each one's weight in the split is multiplied by the square root of (its part of
    /// their uncorrected split) / (its part of what they completed), the multipliers
    /// kept at a mean of one over them, within [`GAIN_MIN`]..=[`GAIN_MAX`]: a fixed
    /// point where the held hosts' completions split as their uncorrected parts do.
    /// Hosts not held keep no correction (QoS does not hold them: self-limited).
    fn correct(&mut self, iv: &mut Interval<'_>, n_star: u64, rate_ops: u64) {
        let first = self.corrected_at == Nanos::ZERO;
        self.corrected_at = iv.now;
        // The split without corrections: what each host is entitled to.
        self.uncorrected.clear();
        self.uncorrected
            .extend(self.claims.iter().map(|c| CirculationClaim {
                gain_milli: 1000,
                ..*c
            }));
        let mut plain = Vec::new();
        hold_targets(
            n_star,
            rate_ops,
            (&self.uncorrected, &self.group_claims),
            &mut plain,
        );
        let hosts = &mut iv.members.hosts;
        let mut held: Vec<(usize, u64, u64)> = Vec::new();
        for (i, h) in hosts.iter_mut().enumerate() {
            let done_now = h.shared.completed_work_and_service().0;
            let done = done_now.saturating_sub(h.circulation.completed_at);
            h.circulation.completed_at = done_now;
            let entitled = self.claims[i].seen.saturating_sub(plain[i]);
            if self.parts[i] > 0 && done > 0 && entitled > 0 {
                held.push((i, entitled, done));
            } else {
                h.circulation.gain_milli = 1000;
            }
        }
        if first || held.len() < 2 {
            for &(i, ..) in &held {
                hosts[i].circulation.gain_milli = 1000;
            }
            return;
        }
        let (want, got) = held
            .iter()
            .fold((0u64, 0u64), |(w, g), &(_, e, d)| (w + e, g + d));
        let mut gains: Vec<f64> = held
            .iter()
            .map(|&(i, e, d)| {
                let ratio = (e as f64 / want as f64) / (d as f64 / got as f64);
                hosts[i].circulation.gain_milli as f64 * ratio.sqrt()
            })
            .collect();
        let mean = gains.iter().sum::<f64>() / gains.len() as f64;
        for ((i, ..), g) in held.iter().zip(&mut gains) {
            *g = (*g * 1000.0 / mean).clamp(GAIN_MIN as f64, GAIN_MAX as f64);
            hosts[*i].circulation.gain_milli = *g as u64;
        }
    }
}

/// How long one command may wait for its host's hold target, at least.
const HOLD_FOR_MIN: Nanos = Nanos::from_millis(2);
/// ... and at most (also while the host's rate is not known yet).
const HOLD_FOR_MAX: Nanos = Nanos::from_millis(50);
/// The bound, in multiples of the wait one in, one out gives a command.
const HOLD_FOR_WAITS: u64 = 4;

/// How long a command of a host with hold target `held` may wait for it: one in, one
/// out, it waits for `held` arrivals of its host, about `held / X_i` with X_i its rate
/// (`completed_ops` in the last `period`); [`HOLD_FOR_WAITS`] times that, within
/// [`HOLD_FOR_MIN`]..=[`HOLD_FOR_MAX`]. Longer, the host has stopped sending (the end
/// of a job): its last commands go rather than wait for arrivals that do not come.
pub(crate) fn hold_bound(held: u64, completed_ops: u64, period: Nanos) -> Nanos {
    if completed_ops == 0 {
        return HOLD_FOR_MAX;
    }
    let wait = mul_div(held.saturating_mul(HOLD_FOR_WAITS), period.0, completed_ops);
    Nanos(wait.clamp(HOLD_FOR_MIN.0, HOLD_FOR_MAX.0))
}

/// A host's claim on the circulation N*: its weight, its reservation (operations per
/// period), the commands it circulates as far as the target saw, and its tenant group.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct CirculationClaim {
    pub(crate) weight: u64,
    pub(crate) reservation_ops: u64,
    /// Its limit, operations per period ([`UNLIMITED`]: none).
    pub(crate) limit_ops: u64,
    pub(crate) seen: u64,
    pub(crate) group: Option<usize>,
    /// Its weight's (and reservation's) correction, thousandths (see
    /// `OperatingPoint::correct`).
    pub(crate) gain_milli: u64,
}

/// [`entitle`] in whole commands: the units its rounding down leaves (at most one per
/// claimant) go to the claimants below their caps, the least served per unit of weight
/// first, so the parts add up to `min(pot, Σ caps)` (a command lost to rounding would
/// be one more held: a host of weight 1 among 4 with 4 commands of N* got 0).
fn entitle_commands(pot: u64, claims: &[Claimant], out: &mut [u64]) {
    entitle(pot, claims, out);
    let caps = claims.iter().map(|c| c.cap).fold(0, u64::saturating_add);
    let mut left = pot.min(caps).saturating_sub(out.iter().sum());
    if left == 0 {
        return;
    }
    let mut order: Vec<usize> = (0..claims.len()).collect();
    // The least served per unit of weight first.
    order.sort_by_key(|&i| ordered_share(claims[i].weight.max(1), out[i]));
    while left > 0 {
        let before = left;
        for &i in &order {
            if left > 0 && out[i] < claims[i].cap {
                out[i] += 1;
                left -= 1;
            }
        }
        if left == before {
            break;
        }
    }
}

/// A sort key that orders claimants by `out / weight` (fixed point, 2^20 per unit).
fn ordered_share(weight: u64, out: u64) -> u128 {
    ((out as u128) << 20) / weight as u128
}

/// A tenant group's claim on N*: its weight and reservation (operations per period);
/// it can take what its hosts circulate together.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct GroupClaim {
    pub(crate) weight: u64,
    pub(crate) reservation_ops: u64,
    /// Its limit, operations per period ([`UNLIMITED`]: none).
    pub(crate) limit_ops: u64,
}

/// Each host's hold target `seen - n_i*` into `out`: N* (`n_star` commands) split by
/// [`entitle`], a reservation first as the commands it needs at the target's rate
/// (`rate_ops` per period: `r_i N* / C`, Little's law at the operating point), the
/// rest by weight, each host capped at what it circulates and at what its limit needs
/// (`l_i N* / C`: what a limit leaves unused goes to the others). Tenant groups nest,
/// as in the entitlement report: a group is one claimant beside the lone hosts (its
/// weight, its reservation, capped at its hosts' circulation together and at its
/// limit), and its part is split among its hosts the same way.
pub(crate) fn hold_targets(
    n_star: u64,
    rate_ops: u64,
    (claims, groups): (&[CirculationClaim], &[GroupClaim]),
    out: &mut Vec<u64>,
) {
    let rate = rate_ops.max(1);
    let commands = |ops: u64| mul_div_ceil(ops, n_star, rate);
    let limited = |limit_ops: u64| {
        if limit_ops == UNLIMITED {
            u64::MAX
        } else {
            commands(limit_ops)
        }
    };
    let host = |c: &CirculationClaim| Claimant {
        weight: c.weight.max(1).saturating_mul(c.gain_milli.max(1)),
        reservation: mul_div(commands(c.reservation_ops), c.gain_milli, 1000),
        cap: c.seen.min(limited(c.limit_ops)),
    };
    // The top level: lone hosts, then the groups.
    let mut top: Vec<Claimant> = claims
        .iter()
        .filter(|c| c.group.is_none())
        .map(host)
        .collect();
    let lone = top.len();
    top.extend(groups.iter().enumerate().map(|(g, gc)| {
        Claimant {
            // In the hosts' unit: their weights carry their corrections (thousandths).
            weight: gc.weight.max(1).saturating_mul(1000),
            reservation: commands(gc.reservation_ops),
            cap: claims
                .iter()
                .filter(|c| c.group == Some(g))
                .map(|c| host(c).cap)
                .fold(0, u64::saturating_add)
                .min(limited(gc.limit_ops)),
        }
    }));
    let mut top_out = vec![0; top.len()];
    entitle_commands(n_star, &top, &mut top_out);
    out.clear();
    out.resize(claims.len(), 0);
    let mut lone_parts = top_out[..lone].iter();
    for (o, c) in out.iter_mut().zip(claims) {
        if c.group.is_none() {
            *o = *lone_parts.next().expect("one part per lone host");
        }
    }
    for (g, &pot) in top_out[lone..].iter().enumerate() {
        let members: Vec<usize> = (0..claims.len())
            .filter(|&i| claims[i].group == Some(g))
            .collect();
        let parts: Vec<Claimant> = members.iter().map(|&i| host(&claims[i])).collect();
        let mut got = vec![0; parts.len()];
        entitle_commands(pot, &parts, &mut got);
        for (&i, n) in members.iter().zip(got) {
            out[i] = n;
        }
    }
    for (o, c) in out.iter_mut().zip(claims) {
        *o = c.seen.saturating_sub(*o);
    }
}

impl SharingPolicy for OperatingPoint {
    fn attach(&mut self, shared: &DomainShared) {
        if !shared.window.is_on() {
            shared.window.set_unbounded();
        }
        shared.probe_open.store(0, Ordering::Release);
    }

    fn depth_learned(
        &mut self,
        curve: &mut DepthCurve,
        now: Nanos,
        target: OperatingTarget,
        shared: &DomainShared,
    ) {
        self.learn(curve, now, target, shared);
    }

    fn supports_groups(&self) -> bool {
        true
    }

    fn circulation_probe(&self) -> Option<ProbeReport> {
        self.probe.as_ref().map(CirculationProbe::report)
    }

    fn owns_pool(&self, paced: bool) -> bool {
        self.over_circulation && self.pool.owns_pool(paced)
    }

    fn start_period(&mut self, start: Nanos) {
        self.pool.start_period(start);
    }

    /// Holds each tenant group to its limit and ahead of the others while it lags
    /// behind its reservation, publishes each host's tag step (its weight, nested in
    /// its group's), advances V to the smallest tag of the hosts the window held, and
    /// sets the slack.
    fn share(&mut self, mut iv: Interval<'_>) {
        self.hold_groups(&iv);
        let mut w = Waiting::default();
        for h in &iv.members.hosts {
            let hw = &h.shared.window;
            let step = match h.group {
                Some(g) => nested_step(
                    h.cfg.weight,
                    iv.members.groups[g].budgets.weight,
                    self.groups[g].active_weight,
                ),
                None => TAG_UNIT / u64::from(h.cfg.weight.max(1)),
            };
            hw.set_step(step);
            let weight = (TAG_UNIT / step).max(1);
            w.all_weight += weight;
            if hw.take_waiting() {
                let t = hw.tag();
                w.min_tag = Some(w.min_tag.map_or(t, |m: u64| m.min(t)));
                w.weight += weight;
            }
        }
        let window = &iv.shared.window;
        self.over_circulation = self.hold_targets(&mut iv);
        window.set_over_circulation(self.over_circulation);
        if let Some(t) = w.min_tag {
            self.bound_ticks += 1;
            window.advance_vclock(t);
        }
        let per_tick = mul_div(
            iv.budget.ops,
            iv.cfg.check_interval.0,
            iv.cfg.period.0.max(1),
        );
        let s = slack(per_tick.min(self.window.max(64) * 64), self.window, w);
        window.set_slack(s);
        if self.over_circulation {
            self.pool.share(iv);
        }
    }

    fn host_batches(
        &self,
        batch: Amount,
        weight: u64,
        max_weight: u64,
        four_intervals: Amount,
    ) -> (Amount, Amount) {
        self.pool
            .host_batches(batch, weight, max_weight, four_intervals)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::window::UNBOUNDED;

    #[test]
    fn a_group_s_hosts_split_its_weight_among_those_not_idle() {
        // Group of weight 2, hosts of weight 1 and 3, both active: 2 * 1/4 and 2 * 3/4.
        assert_eq!(nested_step(1, 2, 4), TAG_UNIT * 2);
        assert_eq!(nested_step(3, 2, 4), TAG_UNIT * 4 / 6);
        // The weight-3 host alone: the group's whole weight.
        assert_eq!(nested_step(3, 2, 3), TAG_UNIT / 2);
        // An idle host is not counted, and a step is never 0.
        assert_eq!(nested_step(1, 2, 0), TAG_UNIT / 2);
        assert!(nested_step(1000, 1000, 1) >= 1);
    }

    #[test]
    fn the_slack_is_a_few_intervals_of_work_among_the_waiting_weights() {
        let w = Waiting {
            min_tag: Some(0),
            weight: 4,
            all_weight: 10,
        };
        assert_eq!(slack(100, 50, w), 100 * TAG_UNIT);
        let none = Waiting {
            all_weight: 10,
            ..Waiting::default()
        };
        assert_eq!(slack(0, 50, none), 10 * TAG_UNIT);
    }

    #[test]
    fn the_mode_turns_the_window_on_and_off_and_takes_groups() {
        use crate::config::{ExcessSharing, ReservationRelease, test_domain};
        use crate::monitor::{Monitor, UpdateDomainError};
        let t0 = Nanos::from_secs(1);
        let d = |s| test_domain(10_000, ReservationRelease::Paced, s);
        let mut m = Monitor::new(d(ExcessSharing::OperatingPoint), t0).unwrap();
        assert_eq!(m.shared().window().limit(), UNBOUNDED, "no curve yet");
        m.add_group(crate::config::GroupConfig::new("g"), t0)
            .unwrap();
        // First come cannot hold a group to anything.
        let e = m
            .update_domain(d(ExcessSharing::FirstCome), t0)
            .unwrap_err();
        assert!(
            matches!(e, UpdateDomainError::GroupsNeedSharingByWeight),
            "{e}"
        );
        m.update_domain(d(ExcessSharing::Weighted), t0).unwrap();
        assert!(!m.shared().window().is_on());
        m.update_domain(d(ExcessSharing::OperatingPoint), t0)
            .unwrap();
        assert!(m.shared().window().is_on());
        let m = Monitor::new(d(ExcessSharing::FirstCome), t0).unwrap();
        assert!(!m.shared().window().is_on());
    }

    #[test]
    fn a_held_command_waits_a_few_of_its_host_s_arrivals_at_most() {
        let second = Nanos::from_secs(1);
        // 40 held at 20,000 a second: 2 ms one in, one out; bound 8 ms.
        assert_eq!(hold_bound(40, 20_000, second), Nanos::from_millis(8));
        // Nothing held, or a fast host: the floor (a census holds for less).
        assert_eq!(hold_bound(0, 20_000, second), HOLD_FOR_MIN);
        assert!(CENSUS_FOR < HOLD_FOR_MIN);
        // A slow host, or one whose rate is not known yet: the ceiling.
        assert_eq!(hold_bound(40, 100, second), HOLD_FOR_MAX);
        assert_eq!(hold_bound(40, 0, second), HOLD_FOR_MAX);
    }

    #[test]
    fn hold_targets_split_the_circulation_by_weight_within_what_each_host_circulates() {
        let claim = |weight, seen| CirculationClaim {
            gain_milli: 1000,
            group: None,
            limit_ops: UNLIMITED,
            weight,
            reservation_ops: 0,
            seen,
        };
        // QD 16/32/48/64, weights 4/3/2/1, N* = 110: the QD-16 and QD-32 hosts keep all
        // theirs (their weighted parts are above their depths); 62 left split 2:1.
        let claims = [claim(4, 16), claim(3, 32), claim(2, 48), claim(1, 64)];
        let mut out = Vec::new();
        hold_targets(110, 1000, (&claims, &[]), &mut out);
        let parts: Vec<u64> = claims.iter().zip(&out).map(|(c, t)| c.seen - t).collect();
        assert_eq!(parts.iter().sum::<u64>(), 110);
        assert_eq!(&parts[..2], &[16, 32]);
        assert!(
            (41..=42).contains(&parts[2]) && (20..=21).contains(&parts[3]),
            "{parts:?}"
        );
        // Nothing to hold when the hosts circulate no more than N*.
        hold_targets(200, 1000, (&claims, &[]), &mut out);
        assert_eq!(out, [0, 0, 0, 0]);
        // A reservation is a floor in commands: 300 of a 1,000-op period at N* = 100 is
        // 30 commands, above what weight 1 of 10 would give.
        let claims = [
            CirculationClaim {
                weight: 1,
                reservation_ops: 300,
                limit_ops: UNLIMITED,
                seen: 64,
                group: None,
                gain_milli: 1000,
            },
            claim(9, 100),
        ];
        hold_targets(100, 1000, (&claims, &[]), &mut out);
        assert_eq!(out, [34, 30], "30 and 70 of N*: 34 and 30 held");
        // A group of weight 1 (hosts of weight 1 and 3) beside a lone host of weight 1,
        // everybody at QD 64, N* = 40: the group gets 20 and splits it 5 / 15.
        let member = |weight, group| CirculationClaim {
            gain_milli: 1000,
            weight,
            reservation_ops: 0,
            limit_ops: UNLIMITED,
            seen: 64,
            group,
        };
        let claims = [member(1, Some(0)), member(1, None), member(3, Some(0))];
        let group = GroupClaim {
            weight: 1,
            reservation_ops: 0,
            limit_ops: UNLIMITED,
        };
        hold_targets(40, 1000, (&claims, &[group]), &mut out);
        assert_eq!(out, [64 - 5, 64 - 20, 64 - 15]);
        // The group's reservation comes first: 300 of 1,000 ops at N* = 40 is 12
        // commands for the group, more than weight alone gives it when the lone host
        // weighs 9: 12 against 28, split 3 / 9 inside.
        let claims = [member(1, Some(0)), member(9, None), member(3, Some(0))];
        let group = GroupClaim {
            weight: 1,
            reservation_ops: 300,
            limit_ops: UNLIMITED,
        };
        hold_targets(40, 1000, (&claims, &[group]), &mut out);
        assert_eq!(out, [64 - 3, 64 - 28, 64 - 9]);
        // Its limit caps it: 100 of 1,000 ops is 4 commands (1 / 3 inside); the lone
        // host takes the rest of N*.
        let group = GroupClaim {
            weight: 1,
            reservation_ops: 0,
            limit_ops: 100,
        };
        let claims = [member(1, Some(0)), member(1, None), member(3, Some(0))];
        hold_targets(40, 1000, (&claims, &[group]), &mut out);
        assert_eq!(out, [64 - 1, 64 - 36, 64 - 3]);
    }

    proptest::proptest! {
        /// Whole commands: N* is handed out in full (up to what the claimants can
        /// take), nobody above its cap, and never less than `entitle` gave.
        #[test]
        fn whole_commands_add_up_to_n_star(
            pot in 0u64..400,
            claims in proptest::collection::vec((1u64..20, 0u64..30, 0u64..130), 1..12),
        ) {
            let claims: Vec<Claimant> = claims
                .into_iter()
                .map(|(weight, reservation, cap)| Claimant { weight, reservation, cap })
                .collect();
            let mut plain = vec![0; claims.len()];
            entitle(pot, &claims, &mut plain);
            let mut whole = vec![0; claims.len()];
            entitle_commands(pot, &claims, &mut whole);
            let floors: u64 = claims.iter().map(|c| c.reservation.min(c.cap)).sum();
            let caps: u64 = claims.iter().map(|c| c.cap).sum();
            if floors < pot.min(caps) {
                proptest::prop_assert_eq!(whole.iter().sum::<u64>(), pot.min(caps));
            }
            for ((w, p), c) in whole.iter().zip(&plain).zip(&claims) {
                proptest::prop_assert!(w >= p && *w <= c.cap.max(*p));
            }
        }
    }

    /// The target `800 K q / (q + 15)` with `q` commands in flight: one depth sample.
    fn sample(c: &mut DepthCurve, now: Nanos, q: u64) {
        let dt = crate::depth::MIN_WINDOW;
        let rate = 800_000 * q / (q + 15);
        c.observe(now, dt, rate / 100, Nanos(q * dt.0));
    }

    /// The spiral: held at W = Q*, the curve sees no deeper depth, its deeper buckets
    /// age out (30 s), T(max) falls and Q* with it. While the window binds they are
    /// kept, so W holds for a minute of samples at the window's own depth.
    #[test]
    fn a_binding_window_does_not_spiral_down() {
        let horizon = Nanos::from_secs(30);
        let shared =
            DomainShared::new(crate::cost::CostModel::default(), true, Nanos::from_secs(1));
        let target = OperatingTarget::Efficiency(970);
        let run = |keep: bool| {
            let mut c = DepthCurve::new(horizon);
            let mut p = OperatingPoint::default();
            let mut now = Nanos::ZERO;
            // A load that went through every depth up to 512 first.
            for k in 0..=9 {
                for _ in 0..8 {
                    now = now.saturating_add(crate::depth::MIN_WINDOW);
                    sample(&mut c, now, 1 << k);
                }
            }
            p.learn(&mut c, now, target, &shared);
            let first = c.operating_point(now, target).unwrap().in_flight_milli;
            // Then a minute held by the window (the hosts want more: it binds), the mean
            // depth a tenth below it (commands come and go).
            for _ in 0..6000 {
                now = now.saturating_add(crate::depth::MIN_WINDOW);
                sample(
                    &mut c,
                    now,
                    (shared.window.limit().min(512) * 9 / 10).max(1),
                );
                if keep {
                    p.bound_ticks = 10;
                    p.learn(&mut c, now, target, &shared);
                } else {
                    let op = c.operating_point(now, target).unwrap();
                    shared.window.set_limit(op.in_flight_milli.div_ceil(1000));
                }
            }
            (
                first,
                c.operating_point(now, target).unwrap().in_flight_milli,
            )
        };
        let (first, kept) = run(true);
        assert!(first >= 256_000, "Q* of the whole curve: {first}");
        assert!(kept * 10 >= first * 9, "kept: Q* {first} -> {kept}");
        let (first, aged) = run(false);
        assert!(
            aged < first,
            "without keeping, Q* {first} -> {aged}: the window falls"
        );
    }
}
