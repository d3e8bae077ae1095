//! Admission by concurrency (`operating_point`, issue 26 item 2; opt-in): the excess is
//! not a budget of operations per period but room in a window of commands in flight at
//! the base, `W = Q*` of the learned depth curve (unbounded until the curve is known).
//!
//! - **Reservations first.** A command paid from its host's reservation is admitted as
//!   under first come (reservation tokens) and never waits for the window; it takes a
//!   slot all the same (it is in flight at the base), so excess is admitted only while
//!   the domain's commands in flight, reserved ones included, are below `W`. Hence
//!   `in flight <= W + reserved commands in flight`, whatever the threads do.
//! - **The slot count** is one atomic word of the domain ([`WindowShared`]): a channel
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

use crate::config::UNLIMITED;
use crate::cost::{Amount, RES};
use crate::depth::{DepthCurve, OperatingTarget};
use crate::ledger::DomainShared;
use crate::sync::{AtomicU64, CachePadded, Ordering};
use crate::time::{Nanos, mul_div, mul_div_ceil};

use super::{Interval, SharingPolicy};

/// Tag units per operation of a host of weight 1 (weights are at most 1000, so a tag
/// step is at least 1048 units; 2^64 units are 2^44 operations).
pub(crate) const TAG_UNIT: u64 = 1 << 20;
/// [`WindowShared`]'s limit when the domain does not count slots (another policy).
const OFF: u64 = 0;
/// Its limit while the depth curve is not known.
pub(crate) const UNBOUNDED: u64 = u64::MAX;

/// The domain's window: read by every channel, the count written by all of them.
#[derive(Debug)]
pub struct WindowShared {
    /// Written by the monitor: W ([`OFF`]: no counting at all), V, the slack.
    params: CachePadded<WindowParams>,
    /// Commands admitted under the window and not yet completed.
    in_flight: CachePadded<AtomicU64>,
}

#[derive(Debug)]
struct WindowParams {
    limit: AtomicU64,
    vclock: AtomicU64,
    slack: AtomicU64,
}

impl Default for WindowShared {
    fn default() -> Self {
        WindowShared {
            params: CachePadded(WindowParams {
                limit: AtomicU64::new(OFF),
                vclock: AtomicU64::new(0),
                slack: AtomicU64::new(u64::MAX / 4),
            }),
            in_flight: CachePadded(AtomicU64::new(0)),
        }
    }
}

/// One host's place in the window's order.
#[derive(Debug)]
pub struct HostWindow {
    /// Start tag (virtual time) of its next command.
    tag: AtomicU64,
    /// Tag units per operation: [`TAG_UNIT`] / weight.
    step: AtomicU64,
    /// Set by a channel held by the window; taken by the monitor at each interval.
    waiting: AtomicU64,
    /// Set by the monitor while the host's tenant group has used what its limit
    /// released so far: its excess waits (its reserved work does not).
    blocked: AtomicU64,
}

impl Default for HostWindow {
    fn default() -> Self {
        HostWindow {
            tag: AtomicU64::new(0),
            step: AtomicU64::new(TAG_UNIT),
            waiting: AtomicU64::new(0),
            blocked: AtomicU64::new(0),
        }
    }
}

impl HostWindow {
    /// Its tag (the lab's dispatcher orders its retries by it).
    pub fn tag(&self) -> u64 {
        self.tag.load(Ordering::Relaxed)
    }

    /// `max(tag, v) + ops * step`: no banking of idle time. A load and a store, not a
    /// read-modify-write: two channels of one host on two threads charging at the same
    /// instant may lose one command's step (the order's precision, not the window's
    /// count), and the tag costs no locked instruction per command.
    #[inline]
    fn charge(&self, v: u64, ops: u64) {
        let add = ops.max(1).saturating_mul(self.step.load(Ordering::Relaxed));
        let t = self.tag.load(Ordering::Relaxed);
        self.tag
            .store(t.max(v).saturating_add(add), Ordering::Relaxed);
    }
}

/// What the window decided for one command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Slot {
    /// The domain does not count slots.
    Off,
    /// A slot was taken: give it back at completion.
    Taken,
    /// Excess that must wait (window full, or its host ran ahead of V).
    Wait,
}

impl WindowShared {
    /// Whether this domain counts slots.
    #[inline]
    pub(crate) fn is_on(&self) -> bool {
        self.params.limit.load(Ordering::Relaxed) != OFF
    }

    /// A command of `ops` operations wants to go; `reserved` when paid from its host's
    /// reservation (then it never waits).
    #[inline]
    pub(crate) fn admit(&self, host: &HostWindow, ops: u64, reserved: bool) -> Slot {
        let p = &self.params;
        let limit = p.limit.load(Ordering::Relaxed);
        if limit == OFF {
            return Slot::Off;
        }
        let v = p.vclock.load(Ordering::Relaxed);
        if reserved {
            self.in_flight.fetch_add(1, Ordering::Relaxed);
        } else {
            if host.blocked.load(Ordering::Relaxed) != 0 {
                // Its group's limit, not the window: V does not wait for it.
                return Slot::Wait;
            }
            let slack = p.slack.load(Ordering::Relaxed);
            let ahead = host.tag() > v.saturating_add(slack);
            if self
                .in_flight
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                    (n < limit && (!ahead || n < limit / 2)).then_some(n + 1)
                })
                .is_err()
            {
                host.waiting.store(1, Ordering::Relaxed);
                return Slot::Wait;
            }
            if ahead {
                // Half the window is free: nobody waits for the slot it takes, so V
                // moves up to it rather than leave the target half idle until the
                // monitor's next interval.
                p.vclock
                    .fetch_max(host.tag().saturating_sub(slack), Ordering::Relaxed);
            }
        }
        host.charge(v, ops);
        Slot::Taken
    }

    /// A command that took a slot completed.
    #[inline]
    pub(crate) fn put(&self) {
        self.in_flight.fetch_sub(1, Ordering::Relaxed);
    }

    /// Commands in flight under the window now.
    pub fn in_flight(&self) -> u64 {
        self.in_flight.load(Ordering::Relaxed)
    }
    /// W now (`u64::MAX` while unbounded, 0 when the domain does not use the window).
    pub fn limit(&self) -> u64 {
        self.params.limit.load(Ordering::Relaxed)
    }
    /// The virtual clock V.
    pub fn vclock(&self) -> u64 {
        self.params.vclock.load(Ordering::Relaxed)
    }

    /// Another policy: no counting (slots held now are still given back).
    pub(crate) fn disable(&self) {
        self.params.limit.store(OFF, Ordering::Relaxed);
    }
    fn set_limit(&self, w: u64) {
        self.params.limit.store(w.max(1), Ordering::Relaxed);
    }
}

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
}

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
        let Some(op) = curve.operating_point(now, target) else {
            self.window = 0;
            shared
                .window
                .params
                .limit
                .store(UNBOUNDED, Ordering::Relaxed);
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
                let b = &h.shared.window.blocked;
                if b.load(Ordering::Relaxed) != blocked as u64 {
                    b.store(blocked as u64, Ordering::Relaxed);
                }
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
    if w.blocked.load(Ordering::Relaxed) != 0 {
        w.blocked.store(0, Ordering::Relaxed);
    }
}

impl SharingPolicy for OperatingPoint {
    fn attach(&mut self, shared: &DomainShared) {
        if !shared.window.is_on() {
            shared
                .window
                .params
                .limit
                .store(UNBOUNDED, Ordering::Relaxed);
        }
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

    /// Holds each tenant group to its limit and ahead of the others while it lags
    /// behind its reservation, publishes each host's tag step (its weight, nested in
    /// its group's), advances V to the smallest tag of the hosts the window held, and
    /// sets the slack.
    fn share(&mut self, iv: Interval<'_>) {
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
            if hw.step.load(Ordering::Relaxed) != step {
                hw.step.store(step, Ordering::Relaxed);
            }
            let weight = (TAG_UNIT / step).max(1);
            w.all_weight += weight;
            if hw.waiting.swap(0, Ordering::Relaxed) != 0 {
                let t = hw.tag();
                w.min_tag = Some(w.min_tag.map_or(t, |m: u64| m.min(t)));
                w.weight += weight;
            }
        }
        let p = &iv.shared.window.params;
        if let Some(t) = w.min_tag {
            self.bound_ticks += 1;
            p.vclock.fetch_max(t, Ordering::Relaxed);
        }
        let per_tick = mul_div(
            iv.budget.ops,
            iv.cfg.check_interval.0,
            iv.cfg.period.0.max(1),
        );
        let s = slack(per_tick.min(self.window.max(64) * 64), self.window, w);
        if p.slack.load(Ordering::Relaxed) != s {
            p.slack.store(s, Ordering::Relaxed);
        }
    }

    fn host_batches(
        &self,
        batch: Amount,
        weight: u64,
        max_weight: u64,
        four_intervals: Amount,
    ) -> (Amount, Amount) {
        super::FirstCome::default().host_batches(batch, weight, max_weight, four_intervals)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sync::Arc;

    fn on(w: u64) -> WindowShared {
        let s = WindowShared::default();
        s.set_limit(w);
        s
    }

    #[test]
    fn excess_waits_for_a_slot_reserved_work_never() {
        let s = on(2);
        let h = HostWindow::default();
        assert_eq!(s.admit(&h, 1, false), Slot::Taken);
        assert_eq!(s.admit(&h, 1, false), Slot::Taken);
        assert_eq!(s.admit(&h, 1, false), Slot::Wait);
        assert_eq!(h.waiting.load(Ordering::Relaxed), 1);
        // Reserved work goes past the window.
        assert_eq!(s.admit(&h, 1, true), Slot::Taken);
        assert_eq!(s.in_flight(), 3);
        s.put();
        s.put();
        // One command in flight (the reserved one): room for one more.
        assert_eq!(s.admit(&h, 1, false), Slot::Taken);
        assert_eq!(s.admit(&h, 1, false), Slot::Wait);
    }

    #[test]
    fn an_off_window_counts_nothing() {
        let s = WindowShared::default();
        let h = HostWindow::default();
        assert_eq!(s.admit(&h, 1, false), Slot::Off);
        assert_eq!(s.in_flight(), 0);
        assert_eq!(h.tag(), 0);
    }

    #[test]
    fn tags_advance_by_cost_over_weight_and_do_not_bank_idle_time() {
        let s = on(100);
        let h = HostWindow::default();
        h.step.store(TAG_UNIT / 4, Ordering::Relaxed);
        assert_eq!(s.admit(&h, 2, false), Slot::Taken);
        assert_eq!(h.tag(), TAG_UNIT / 2);
        // V moves past it while it is idle: its next command starts at V.
        s.params.vclock.store(10 * TAG_UNIT, Ordering::Relaxed);
        assert_eq!(s.admit(&h, 1, true), Slot::Taken);
        assert_eq!(h.tag(), 10 * TAG_UNIT + TAG_UNIT / 4);
    }

    #[test]
    fn a_blocked_host_waits_for_excess_only_and_does_not_hold_v_back() {
        let s = on(100);
        let h = HostWindow::default();
        h.blocked.store(1, Ordering::Relaxed);
        assert_eq!(s.admit(&h, 1, false), Slot::Wait);
        assert_eq!(
            h.waiting.load(Ordering::Relaxed),
            0,
            "not held by the window"
        );
        assert_eq!(s.admit(&h, 1, true), Slot::Taken, "reserved work goes");
        h.blocked.store(0, Ordering::Relaxed);
        assert_eq!(s.admit(&h, 1, false), Slot::Taken);
        assert_eq!(s.in_flight(), 2);
    }

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
    fn a_host_ahead_of_v_by_more_than_the_slack_waits_for_v_while_half_the_window_is_used() {
        let s = on(8);
        s.params.slack.store(3 * TAG_UNIT, Ordering::Relaxed);
        let h = HostWindow::default();
        for _ in 0..4 {
            assert_eq!(s.admit(&h, 1, false), Slot::Taken);
        }
        assert_eq!(s.admit(&h, 1, false), Slot::Wait, "tag 4 > V 0 + slack 3");
        assert_eq!(h.waiting.load(Ordering::Relaxed), 1);
        // Reserved work still goes (and still moves its tag, to 5).
        assert_eq!(s.admit(&h, 1, true), Slot::Taken);
        s.params.vclock.store(TAG_UNIT, Ordering::Relaxed);
        assert_eq!(s.admit(&h, 1, false), Slot::Wait, "tag 5 > V 1 + slack 3");
        // Fewer than half the window's slots in use: nobody waits for the one it
        // takes, so it goes and V moves up to its tag less the slack.
        for _ in 0..3 {
            s.put();
        }
        assert_eq!(s.in_flight(), 2);
        assert_eq!(s.admit(&h, 1, false), Slot::Taken);
        assert_eq!(s.vclock(), 2 * TAG_UNIT, "tag 5 - slack 3");
        assert_eq!(h.tag(), 6 * TAG_UNIT);
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

    mod props {
        use super::*;
        use proptest::prelude::*;

        #[derive(Debug, Clone)]
        enum Op {
            /// Host, reserved.
            Admit(usize, bool),
            /// Complete the oldest command of a host.
            Complete(usize),
            /// The monitor advances V by that many units.
            Tick(u64),
        }

        fn op() -> impl Strategy<Value = Op> {
            prop_oneof![
                4 => (0..3usize, any::<bool>()).prop_map(|(h, r)| Op::Admit(h, r)),
                3 => (0..3usize).prop_map(Op::Complete),
                1 => (0..8 * TAG_UNIT).prop_map(Op::Tick),
            ]
        }

        proptest! {
            /// In flight never below zero nor above W + reserved commands in flight;
            /// every slot given back exactly once; tags never go back.
            #[test]
            fn the_window_books_balance(w in 1u64..12, ops in prop::collection::vec(op(), 1..400)) {
                let s = on(w);
                s.params.slack.store(4 * TAG_UNIT, Ordering::Relaxed);
                let hosts: Vec<HostWindow> = (1..=3u64)
                    .map(|k| {
                        let h = HostWindow::default();
                        h.step.store(TAG_UNIT / k, Ordering::Relaxed);
                        h
                    })
                    .collect();
                // Per host, commands in flight: reserved or not.
                let mut flying: Vec<std::collections::VecDeque<bool>> = vec![Default::default(); 3];
                let mut last_tag = [0u64; 3];
                for o in ops {
                    match o {
                        Op::Admit(h, r) => {
                            let before = s.in_flight();
                            match s.admit(&hosts[h], 1, r) {
                                Slot::Taken => {
                                    if !r { prop_assert!(before < w); }
                                    flying[h].push_back(r);
                                }
                                Slot::Wait => prop_assert!(!r),
                                Slot::Off => prop_assert!(false, "the window is on"),
                            }
                        }
                        Op::Complete(h) => {
                            if flying[h].pop_front().is_some() {
                                s.put();
                            }
                        }
                        Op::Tick(d) => {
                            let v = s.vclock().saturating_add(d);
                            s.params.vclock.store(v, Ordering::Relaxed);
                        }
                    }
                    let total: usize = flying.iter().map(|f| f.len()).sum();
                    let reserved: usize = flying.iter().map(|f| f.iter().filter(|&&r| r).count()).sum();
                    prop_assert_eq!(s.in_flight(), total as u64);
                    prop_assert!(s.in_flight() <= w + reserved as u64);
                    for (k, h) in hosts.iter().enumerate() {
                        prop_assert!(h.tag() >= last_tag[k]);
                        last_tag[k] = h.tag();
                    }
                }
                for f in &mut flying {
                    while f.pop_front().is_some() {
                        s.put();
                    }
                }
                prop_assert_eq!(s.in_flight(), 0);
            }
        }
    }

    /// A thread races for the only slot of a window of one while another books the
    /// completion of the command holding it: never more than one excess command in
    /// flight, and the count ends at zero. (Three threads took 87 s of loom.)
    #[cfg(loom)]
    #[test]
    fn loom_window_slots_are_taken_and_given_back_once() {
        loom::model(|| {
            let s = Arc::new(on(1));
            let h = Arc::new(HostWindow::default());
            assert_eq!(s.admit(&h, 1, false), Slot::Taken);
            let (s1, h1) = (s.clone(), h.clone());
            let t = loom::thread::spawn(move || {
                let got = s1.admit(&h1, 1, false) == Slot::Taken;
                assert!(s1.in_flight() <= 1);
                got
            });
            s.put();
            let taken = t.join().unwrap();
            assert_eq!(s.in_flight(), taken as u64);
            if taken {
                s.put();
            }
            assert_eq!(s.in_flight(), 0);
        });
    }

    /// Two hosts ahead of V take a slot at once while half the window is free: each
    /// moves V up to its tag less the slack, V never goes back, and the count stays
    /// within the window.
    #[cfg(loom)]
    #[test]
    fn loom_hosts_ahead_move_v_forward_only() {
        loom::model(|| {
            let s = Arc::new(on(4));
            let hosts: Vec<Arc<HostWindow>> = (1..=2)
                .map(|k| {
                    let h = HostWindow::default();
                    h.tag.store(k * 10 * TAG_UNIT, Ordering::Relaxed);
                    Arc::new(h)
                })
                .collect();
            s.params.slack.store(TAG_UNIT, Ordering::Relaxed);
            let (s1, h1) = (s.clone(), hosts[1].clone());
            let t = loom::thread::spawn(move || s1.admit(&h1, 1, false));
            let mine = s.admit(&hosts[0], 1, false);
            let theirs = t.join().unwrap();
            let taken = [mine, theirs].iter().filter(|&&x| x == Slot::Taken).count();
            assert!(taken >= 1, "the first to come finds the window empty");
            assert_eq!(s.in_flight(), taken as u64);
            // The later tag's move wins whatever the order, if it went.
            let v = s.vclock();
            let want = if theirs == Slot::Taken { 19 } else { 9 };
            assert_eq!(v, want * TAG_UNIT);
        });
    }

    #[cfg(not(loom))]
    #[test]
    fn threads_never_take_more_than_the_window() {
        let s = Arc::new(on(3));
        let hs: Vec<Arc<HostWindow>> = (0..4).map(|_| Arc::new(HostWindow::default())).collect();
        let max = Arc::new(AtomicU64::new(0));
        std::thread::scope(|sc| {
            for h in &hs {
                let (s, h, max) = (&s, h, &max);
                sc.spawn(move || {
                    for _ in 0..20_000 {
                        if s.admit(h, 1, false) == Slot::Taken {
                            max.fetch_max(s.in_flight(), Ordering::Relaxed);
                            s.put();
                        }
                    }
                });
            }
        });
        assert_eq!(s.in_flight(), 0);
        assert!(max.load(Ordering::Relaxed) <= 3);
    }
}
