//! The window of commands in flight (sharing `operating_point`): the lock-free state
//! the I/O path shares with the monitor, and the hand-off of freed slots to the
//! channels waiting for one ([`dispatch`]).
//!
//! Owned here: the domain's slot count and the parameters the monitor publishes
//! ([`WindowShared`]), each host's place in the weighted order ([`HostWindow`]), the
//! per-command decision (`WindowShared::admit`, called by
//! [`crate::ledger::ChannelTokens`]) and the dispatch both the target plugin and the
//! lab run at a completion. The policy that sets W, V and the slack (from the depth
//! curve, at every check interval) is the monitor's:
//! `monitor::sharing::operating_point`, whose module doc explains the order.
//!
//! Memory ordering: every access is `Relaxed`; no Release/Acquire pair is needed. The
//! slot count is only ever changed by read-modify-writes on its own word (one
//! modification order: a slot taken is counted once and given back once), and nothing
//! else is published through these words: W, V, the slack, a host's step and flags
//! are hints a channel reads afresh at each command, and a stale read costs at most
//! one command taken against the previous W, V or step (the monitor's next check
//! interval corrects it). Each struct says who writes and who reads.

use crate::sync::{AtomicU64, CachePadded, Ordering};
use crate::time::Nanos;

/// Tag units per operation of a host of weight 1 (weights are at most 1000, so a tag
/// step is at least 1048 units; 2^64 units are 2^44 operations).
pub(crate) const TAG_UNIT: u64 = 1 << 20;
/// [`WindowShared`]'s limit when the domain does not count slots (another policy).
const OFF: u64 = 0;
/// Its limit while the depth curve is not known.
pub(crate) const UNBOUNDED: u64 = u64::MAX;

/// The domain's window: one per domain, inside [`crate::DomainShared`].
///
/// Writers and readers: `params` is written by the monitor (W and the slack at its
/// check intervals and depth samples, V advanced there) and read by every channel at
/// each command; a channel admitting a host far ahead of V also moves V forward
/// (`fetch_max`). `in_flight` is read-modified-written by every channel on every
/// thread (taken at admission, given back at completion) and read by the monitor's
/// statistics and the dispatch. All `Relaxed` (see the module doc): the count is
/// exact by its read-modify-writes alone; the parameters are hints.
#[derive(Debug)]
pub struct WindowShared {
    /// Written by the monitor: W ([`OFF`]: no counting at all), V, the slack.
    params: CachePadded<WindowParams>,
    /// Commands admitted under the window and not yet completed, commands (reserved
    /// ones included). On its own cache line: every channel writes it.
    in_flight: CachePadded<AtomicU64>,
}

/// The window's parameters, written by the monitor (and V also by a channel, forward
/// only), read by every channel; on one cache line that changes at most once per check
/// interval.
#[derive(Debug)]
struct WindowParams {
    /// W, commands in flight; [`OFF`] (0): the domain does not count slots,
    /// [`UNBOUNDED`]: counting, but the depth curve is not known yet.
    limit: AtomicU64,
    /// V, the virtual clock, tag units ([`TAG_UNIT`] per operation of weight 1). Only
    /// moves forward (`fetch_max`), except when a test sets it.
    vclock: AtomicU64,
    /// How far a host's tag may run ahead of V and still take excess, tag units.
    slack: AtomicU64,
    /// 1 while the window is over the hosts' circulation (issue 39): a host's excess
    /// waits while fewer than its hold target ([`HostWindow`]) are held, and neither W
    /// nor the tags bind; 0: W counts commands at the base.
    over_circulation: AtomicU64,
}

impl Default for WindowShared {
    fn default() -> Self {
        WindowShared {
            params: CachePadded(WindowParams {
                limit: AtomicU64::new(OFF),
                vclock: AtomicU64::new(0),
                slack: AtomicU64::new(u64::MAX / 4),
                over_circulation: AtomicU64::new(0),
            }),
            in_flight: CachePadded(AtomicU64::new(0)),
        }
    }
}

/// One host's place in the window's order: one per host, inside [`crate::HostShared`].
///
/// Writers and readers: `tag` is written by the host's channels (a load and a store
/// at each admission: see `charge`) and read by them, by the dispatch
/// and by the monitor; `step` and `blocked` are written by the monitor at its check
/// intervals and read by the channels at each command; `waiting` is set by a channel
/// the window refuses and taken (swapped to 0) by the monitor at each interval. All
/// `Relaxed` (see the module doc): no other data is published through them.
#[derive(Debug)]
pub struct HostWindow {
    /// Start tag (virtual time) of its next command, tag units.
    tag: AtomicU64,
    /// Tag units per operation: [`TAG_UNIT`] / weight (nested in its group's).
    step: AtomicU64,
    /// 1 once a channel of the host was refused by the window since the monitor's
    /// last check interval, else 0.
    waiting: AtomicU64,
    /// 1 while the host's tenant group has used what its limit released so far (set
    /// by the monitor): its excess waits (its reserved work does not); else 0.
    blocked: AtomicU64,
    /// Its commands in hold queues now, any reason (exact: every queue adds what
    /// enters and leaves it, `ChannelTokens::note_held`).
    held: AtomicU64,
    /// Over circulation: how many of its commands to keep held, h_i = N_i - n_i*
    /// (set by the monitor): its excess waits while fewer are held, so it circulates
    /// n_i* outside QoS and, by Little's law, gets n_i* / N* of the target.
    hold_target: AtomicU64,
    /// Over circulation: how long (ns) one of its commands may wait for its hold
    /// target before it goes anyway (set by the monitor, a few times the wait one in,
    /// one out gives it). A held command is otherwise released only by its host's next
    /// arrival; a host that stops sending would keep its last h_i commands waiting.
    hold_for: AtomicU64,
    /// Slots its commands hold now (all its channels): its commands at the base that
    /// the window counted. Compared with its allowance.
    in_flight: AtomicU64,
    /// Over circulation, its in-flight allowance n_i* as the monitor last set it
    /// ([`crate::allowance::allowance_word`]: sequence number and allowance; 0: never
    /// set). Sent to a cooperative host in completions; while the host reports its
    /// circulation, its excess waits here only beyond the allowance (instead of its
    /// hold target).
    allowance: AtomicU64,
    /// Its last circulation report plus one (0: none or expired), and when it came
    /// (ns).
    reported: AtomicU64,
    reported_at: AtomicU64,
}

impl Default for HostWindow {
    fn default() -> Self {
        HostWindow {
            tag: AtomicU64::new(0),
            step: AtomicU64::new(TAG_UNIT),
            waiting: AtomicU64::new(0),
            blocked: AtomicU64::new(0),
            held: AtomicU64::new(0),
            hold_target: AtomicU64::new(0),
            hold_for: AtomicU64::new(u64::MAX),
            in_flight: AtomicU64::new(0),
            allowance: AtomicU64::new(0),
            reported: AtomicU64::new(0),
            reported_at: AtomicU64::new(0),
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
    /// reservation (then it never waits); `held_for`: how long it has been held, `None`
    /// for a command that just came (not in a hold queue, so not in its host's count).
    #[inline]
    pub(crate) fn admit(
        &self,
        host: &HostWindow,
        ops: u64,
        reserved: bool,
        held_for: Option<Nanos>,
    ) -> Slot {
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
            if p.over_circulation.load(Ordering::Relaxed) != 0 {
                // Over circulation: the host's excess waits while fewer than its hold
                // target are held; once that many are, what comes goes (one in, one
                // out: the commands held keep its circulation at n_i*). A command held
                // longer than the host's bound goes anyway: its host stopped sending.
                let held = host.held.load(Ordering::Relaxed);
                // What stays held if this one goes (a held one counts itself).
                let others = held.saturating_sub(held_for.is_some() as u64);
                let waited = held_for.map_or(0, |w| w.0);
                // A host that holds its own excess (it reports its circulation and was
                // sent its allowance) waits here only beyond the allowance: obeying,
                // none of its commands is held here (no census either: its report is
                // its circulation).
                let wait = match host.cap() {
                    Some(cap) => host.in_flight.load(Ordering::Relaxed) >= cap,
                    None => others < host.hold_target.load(Ordering::Relaxed),
                };
                if wait && waited < host.hold_for.load(Ordering::Relaxed) {
                    host.waiting.store(1, Ordering::Relaxed);
                    return Slot::Wait;
                }
                self.in_flight.fetch_add(1, Ordering::Relaxed);
            } else {
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
                    // Half the window is free: nobody waits for the slot it takes, so
                    // V moves up to it rather than leave the target half idle until
                    // the monitor's next interval.
                    p.vclock
                        .fetch_max(host.tag().saturating_sub(slack), Ordering::Relaxed);
                }
            }
        }
        host.charge(v, ops);
        host.in_flight.fetch_add(1, Ordering::Relaxed);
        Slot::Taken
    }

    /// A command that took a slot completed.
    #[inline]
    pub(crate) fn put(&self) {
        self.in_flight.fetch_sub(1, Ordering::Relaxed);
    }

    /// A command of `host` that took a slot completed (its count too: every slot a
    /// channel holds was taken by [`WindowShared::admit`] for its host).
    #[inline]
    pub(crate) fn put_for(&self, host: &HostWindow) {
        self.put();
        host.in_flight.fetch_sub(1, Ordering::Relaxed);
    }

    /// Whether the window is over the hosts' circulation (else W counts commands at
    /// the base).
    pub fn is_over_circulation(&self) -> bool {
        self.params.over_circulation.load(Ordering::Relaxed) != 0
    }
    /// The monitor: over the hosts' circulation or not (stored only when it changed).
    pub(crate) fn set_over_circulation(&self, on: bool) {
        let p = &self.params.over_circulation;
        if p.load(Ordering::Relaxed) != on as u64 {
            p.store(on as u64, Ordering::Relaxed);
        }
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
        self.set_over_circulation(false);
    }
    /// The monitor: counting, with no bound until the depth curve is known.
    pub(crate) fn set_unbounded(&self) {
        self.params.limit.store(UNBOUNDED, Ordering::Relaxed);
    }
    /// The monitor: W is `w` commands (at least one).
    pub(crate) fn set_limit(&self, w: u64) {
        self.params.limit.store(w.max(1), Ordering::Relaxed);
    }
    /// The monitor: V moves up to `tag` (never back).
    pub(crate) fn advance_vclock(&self, tag: u64) {
        self.params.vclock.fetch_max(tag, Ordering::Relaxed);
    }
    /// The monitor: the slack, tag units (stored only when it changed, so the
    /// parameters' cache line stays shared between the channels' cores).
    pub(crate) fn set_slack(&self, slack: u64) {
        let p = &self.params.slack;
        if p.load(Ordering::Relaxed) != slack {
            p.store(slack, Ordering::Relaxed);
        }
    }
}

impl HostWindow {
    /// `delta` of its commands entered (positive) or left a hold queue.
    #[inline]
    pub(crate) fn note_held(&self, delta: i64) {
        if delta >= 0 {
            self.held.fetch_add(delta as u64, Ordering::Relaxed);
        } else {
            self.held.fetch_sub(delta.unsigned_abs(), Ordering::Relaxed);
        }
    }
    /// Its commands held now.
    pub fn held(&self) -> u64 {
        self.held.load(Ordering::Relaxed)
    }
    /// Over circulation: how many of its commands it keeps held (`u64::MAX` during a
    /// census).
    pub fn hold_target(&self) -> u64 {
        self.hold_target.load(Ordering::Relaxed)
    }
    /// Commands of the host the window counts at the base now.
    pub fn in_flight(&self) -> u64 {
        self.in_flight.load(Ordering::Relaxed)
    }

    /// The target: the host reported `circulation` (commands outstanding and waiting
    /// at its initiator) at `now`.
    pub fn report_circulation(&self, circulation: u64, now: Nanos) {
        self.reported_at.store(now.0, Ordering::Relaxed);
        self.reported
            .store(circulation.saturating_add(1), Ordering::Relaxed);
    }

    /// Its last report, unless expired.
    pub fn reported_circulation(&self) -> Option<u64> {
        self.reported.load(Ordering::Relaxed).checked_sub(1)
    }

    /// The monitor: forgets a report older than `ttl`.
    pub(crate) fn expire_report(&self, now: Nanos, ttl: Nanos) {
        let at = Nanos(self.reported_at.load(Ordering::Relaxed));
        if self.reported.load(Ordering::Relaxed) != 0 && now.saturating_sub(at) >= ttl {
            self.reported.store(0, Ordering::Relaxed);
        }
    }

    /// Its allowance word ([`crate::allowance::allowance_word`]; 0: never set).
    pub fn allowance_word(&self) -> u64 {
        self.allowance.load(Ordering::Relaxed)
    }

    /// The monitor: its allowance is `cap` (`None`: none). Moves the sequence number
    /// only when it changed; a host never given one is left without.
    pub(crate) fn set_allowance(&self, cap: Option<u64>) {
        let cur = self.allowance.load(Ordering::Relaxed);
        let next = crate::allowance::allowance_word((cur >> 32) as u32, cap);
        if (cur == 0 && cap.is_none()) || (cur != 0 && cur as u32 == next as u32) {
            return;
        }
        let seq = ((cur >> 32) as u32).wrapping_add(1).max(1);
        self.allowance.store(
            crate::allowance::allowance_word(seq, cap),
            Ordering::Relaxed,
        );
    }

    /// The allowance its excess waits for here: while it reports its circulation and
    /// has an allowance.
    #[inline]
    fn cap(&self) -> Option<u64> {
        if self.reported.load(Ordering::Relaxed) == 0 {
            return None;
        }
        let w = self.allowance.load(Ordering::Relaxed);
        (w != 0 && w as u32 != u32::MAX).then_some(w as u32 as u64)
    }

    /// The monitor: keep `n` of its commands held (over circulation).
    pub(crate) fn set_hold_target(&self, n: u64) {
        if self.hold_target.load(Ordering::Relaxed) != n {
            self.hold_target.store(n, Ordering::Relaxed);
        }
    }
    /// The monitor: a command of this host held longer than `bound` goes whatever its
    /// hold target says (stored only when changed).
    pub(crate) fn set_hold_for(&self, bound: Nanos) {
        if self.hold_for.load(Ordering::Relaxed) != bound.0 {
            self.hold_for.store(bound.0, Ordering::Relaxed);
        }
    }
    /// The monitor: tag units per operation of this host (stored only when changed).
    pub(crate) fn set_step(&self, step: u64) {
        if self.step.load(Ordering::Relaxed) != step {
            self.step.store(step, Ordering::Relaxed);
        }
    }
    /// The monitor: whether the window refused the host since the last call (and
    /// clears it).
    pub(crate) fn take_waiting(&self) -> bool {
        self.waiting.swap(0, Ordering::Relaxed) != 0
    }
    /// The monitor: the host's excess waits for its tenant group's limit, or not
    /// (stored only when changed).
    pub(crate) fn set_blocked(&self, blocked: bool) {
        if self.blocked.load(Ordering::Relaxed) != blocked as u64 {
            self.blocked.store(blocked as u64, Ordering::Relaxed);
        }
    }
}

/// The channels a [`dispatch`] may hand freed slots to: one thread's channels of a
/// domain (the target plugin, whose channels submit on their own thread only) or all
/// of a domain's channels (the lab).
pub trait WindowWaiters {
    /// Calls `visit(k, tag)`, in increasing `k`, for each channel `k` that waits for
    /// the window and can try now, with its host's start tag ([`HostWindow::tag`]).
    fn each_waiting(&self, visit: &mut dyn FnMut(usize, u64));
    /// Channel `k` tries its held commands again and sends what it releases.
    fn retry(&mut self, k: usize);
}

/// How far a [`dispatch`] goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handing {
    /// While the window has room (the target plugin, at each completion: the channels
    /// of other threads see the slot at their own completion or poll).
    WhileRoom,
    /// Every waiting channel tries once, room or not (the lab, a dispatcher over all
    /// channels: a channel the window refuses again marks its host as held by the
    /// window for the monitor's V).
    EveryWaiting,
}

/// Channels a dispatch has tried: bits, inline for the first 256 (the plugin scans at
/// most 64 of a thread's channels: no allocation), in a vector beyond (the lab).
#[derive(Debug, Default)]
struct Tried {
    first: [u64; 4],
    more: Vec<u64>,
}

impl Tried {
    fn word(&self, k: usize) -> u64 {
        match k / 64 {
            w if w < 4 => self.first[w],
            w => self.more.get(w - 4).copied().unwrap_or(0),
        }
    }
    fn contains(&self, k: usize) -> bool {
        self.word(k) & (1 << (k % 64)) != 0
    }
    fn insert(&mut self, k: usize) {
        let bit = 1 << (k % 64);
        match k / 64 {
            w if w < 4 => self.first[w] |= bit,
            w => {
                if self.more.len() <= w - 4 {
                    self.more.resize(w - 3, 0);
                }
                self.more[w - 4] |= bit;
            }
        }
    }
}

/// A slot of the window may have freed (a completion): the channels waiting for one
/// try again, one at a time, the smallest start tag first (the first `k` on a tie;
/// start-time fair queueing: the host furthest behind its weighted share goes first),
/// each at most once, until none is left (or, [`Handing::WhileRoom`], the window is
/// full). The tags are read afresh before each pick: a retry moves its host's tag,
/// which another channel of that host shares.
pub fn dispatch(window: &WindowShared, handing: Handing, waiters: &mut impl WindowWaiters) {
    let mut tried = Tried::default();
    loop {
        // Another sharing: the limit is 0, so the window is never found with room (the
        // first check at every completion of the other modes).
        if handing == Handing::WhileRoom && window.in_flight() >= window.limit() {
            return;
        }
        if window.is_over_circulation() {
            // No slot to hand: a host's held commands go at its own arrivals.
            return;
        }
        let mut best: Option<(u64, usize)> = None;
        waiters.each_waiting(&mut |k, tag| {
            if !tried.contains(k) && best.is_none_or(|b| tag < b.0) {
                best = Some((tag, k));
            }
        });
        let Some((_, k)) = best else { return };
        tried.insert(k);
        waiters.retry(k);
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
        assert_eq!(s.admit(&h, 1, false, None), Slot::Taken);
        assert_eq!(s.admit(&h, 1, false, None), Slot::Taken);
        assert_eq!(s.admit(&h, 1, false, None), Slot::Wait);
        assert_eq!(h.waiting.load(Ordering::Relaxed), 1);
        // Reserved work goes past the window.
        assert_eq!(s.admit(&h, 1, true, None), Slot::Taken);
        assert_eq!(s.in_flight(), 3);
        s.put();
        s.put();
        // One command in flight (the reserved one): room for one more.
        assert_eq!(s.admit(&h, 1, false, None), Slot::Taken);
        assert_eq!(s.admit(&h, 1, false, None), Slot::Wait);
    }

    #[test]
    fn over_circulation_a_host_keeps_its_hold_target_held_and_the_rest_goes() {
        let s = on(2);
        s.set_unbounded();
        s.set_over_circulation(true);
        let (a, b) = (HostWindow::default(), HostWindow::default());
        a.set_hold_target(2);
        // Host a: its excess waits until two of its commands are held; W does not bind.
        assert_eq!(s.admit(&a, 1, false, None), Slot::Wait);
        a.note_held(1);
        assert_eq!(s.admit(&a, 1, false, None), Slot::Wait);
        a.note_held(1);
        assert_eq!(
            s.admit(&a, 1, false, None),
            Slot::Taken,
            "two held: the next one goes"
        );
        // Its reserved work never waits; host b (target 0) is never held.
        assert_eq!(s.admit(&a, 1, true, None), Slot::Taken);
        for _ in 0..5 {
            assert_eq!(s.admit(&b, 1, false, None), Slot::Taken);
        }
        assert_eq!(s.in_flight(), 7);
        // A lower target lets a held command go (one in, one out).
        a.set_hold_target(1);
        assert_eq!(s.admit(&a, 1, false, None), Slot::Taken);
        a.note_held(-1);
        assert_eq!(a.held(), 1);
        assert_eq!(
            s.admit(&a, 1, false, None),
            Slot::Taken,
            "one held, target one"
        );
        a.note_held(-1);
        assert_eq!(s.admit(&a, 1, false, None), Slot::Wait);
        // A command held longer than its host's bound goes (its host stopped sending).
        a.set_hold_for(Nanos::from_millis(8));
        assert_eq!(
            s.admit(&a, 1, false, Some(Nanos::from_millis(7))),
            Slot::Wait
        );
        assert_eq!(
            s.admit(&a, 1, false, Some(Nanos::from_millis(8))),
            Slot::Taken
        );
        // Another sharing: the cap goes with the window.
        s.disable();
        assert!(!s.is_over_circulation());
        assert_eq!(s.admit(&a, 1, false, None), Slot::Off);
    }

    /// Issue 40 item 2: a host that reports its circulation and has an allowance is
    /// held here only beyond the allowance, whatever its hold target (a census's
    /// `u64::MAX` included); its slots count against it until they are put back; once
    /// its report expires, its hold target rules again.
    #[test]
    fn over_circulation_a_reporting_host_waits_only_beyond_its_allowance() {
        let s = on(2);
        s.set_unbounded();
        s.set_over_circulation(true);
        let a = HostWindow::default();
        a.set_hold_target(u64::MAX);
        a.set_allowance(Some(3));
        assert_eq!(a.allowance_word() >> 32, 1, "first allowance: sequence 1");
        assert_eq!(
            s.admit(&a, 1, false, None),
            Slot::Wait,
            "not reporting: census"
        );
        a.report_circulation(10, Nanos::from_secs(1));
        for _ in 0..3 {
            assert_eq!(s.admit(&a, 1, false, None), Slot::Taken);
        }
        assert_eq!(a.in_flight(), 3);
        assert_eq!(
            s.admit(&a, 1, false, None),
            Slot::Wait,
            "beyond the allowance"
        );
        s.put_for(&a);
        assert_eq!(
            s.admit(&a, 1, false, Some(Nanos(1))),
            Slot::Taken,
            "one out, one in"
        );
        // The same allowance again moves nothing; a new one moves the sequence.
        a.set_allowance(Some(3));
        assert_eq!(a.allowance_word() >> 32, 1);
        a.set_allowance(Some(4));
        assert_eq!(a.allowance_word() >> 32, 2);
        assert_eq!(s.admit(&a, 1, false, None), Slot::Taken);
        a.expire_report(
            Nanos::from_secs(1).saturating_add(Nanos(10)),
            Nanos::from_secs(1),
        );
        assert_eq!(a.reported_circulation(), Some(10), "not expired yet");
        a.expire_report(Nanos::from_secs(2), Nanos::from_secs(1));
        assert_eq!(a.reported_circulation(), None);
        assert_eq!(s.admit(&a, 1, false, None), Slot::Wait, "hold target again");
        // A host never given an allowance is left without one.
        let b = HostWindow::default();
        b.set_allowance(None);
        assert_eq!(b.allowance_word(), 0);
    }

    #[test]
    fn an_off_window_counts_nothing() {
        let s = WindowShared::default();
        let h = HostWindow::default();
        assert_eq!(s.admit(&h, 1, false, None), Slot::Off);
        assert_eq!(s.in_flight(), 0);
        assert_eq!(h.tag(), 0);
    }

    #[test]
    fn tags_advance_by_cost_over_weight_and_do_not_bank_idle_time() {
        let s = on(100);
        let h = HostWindow::default();
        h.step.store(TAG_UNIT / 4, Ordering::Relaxed);
        assert_eq!(s.admit(&h, 2, false, None), Slot::Taken);
        assert_eq!(h.tag(), TAG_UNIT / 2);
        // V moves past it while it is idle: its next command starts at V.
        s.params.vclock.store(10 * TAG_UNIT, Ordering::Relaxed);
        assert_eq!(s.admit(&h, 1, true, None), Slot::Taken);
        assert_eq!(h.tag(), 10 * TAG_UNIT + TAG_UNIT / 4);
    }

    #[test]
    fn a_blocked_host_waits_for_excess_only_and_does_not_hold_v_back() {
        let s = on(100);
        let h = HostWindow::default();
        h.blocked.store(1, Ordering::Relaxed);
        assert_eq!(s.admit(&h, 1, false, None), Slot::Wait);
        assert_eq!(
            h.waiting.load(Ordering::Relaxed),
            0,
            "not held by the window"
        );
        assert_eq!(
            s.admit(&h, 1, true, None),
            Slot::Taken,
            "reserved work goes"
        );
        h.blocked.store(0, Ordering::Relaxed);
        assert_eq!(s.admit(&h, 1, false, None), Slot::Taken);
        assert_eq!(s.in_flight(), 2);
    }

    #[test]
    fn a_host_ahead_of_v_by_more_than_the_slack_waits_for_v_while_half_the_window_is_used() {
        let s = on(8);
        s.params.slack.store(3 * TAG_UNIT, Ordering::Relaxed);
        let h = HostWindow::default();
        for _ in 0..4 {
            assert_eq!(s.admit(&h, 1, false, None), Slot::Taken);
        }
        assert_eq!(
            s.admit(&h, 1, false, None),
            Slot::Wait,
            "tag 4 > V 0 + slack 3"
        );
        assert_eq!(h.waiting.load(Ordering::Relaxed), 1);
        // Reserved work still goes (and still moves its tag, to 5).
        assert_eq!(s.admit(&h, 1, true, None), Slot::Taken);
        s.params.vclock.store(TAG_UNIT, Ordering::Relaxed);
        assert_eq!(
            s.admit(&h, 1, false, None),
            Slot::Wait,
            "tag 5 > V 1 + slack 3"
        );
        // Fewer than half the window's slots in use: nobody waits for the one it
        // takes, so it goes and V moves up to its tag less the slack.
        for _ in 0..3 {
            s.put();
        }
        assert_eq!(s.in_flight(), 2);
        assert_eq!(s.admit(&h, 1, false, None), Slot::Taken);
        assert_eq!(s.vclock(), 2 * TAG_UNIT, "tag 5 - slack 3");
        assert_eq!(h.tag(), 6 * TAG_UNIT);
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
                            match s.admit(&hosts[h], 1, r, None) {
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
            assert_eq!(s.admit(&h, 1, false, None), Slot::Taken);
            let (s1, h1) = (s.clone(), h.clone());
            let t = loom::thread::spawn(move || {
                let got = s1.admit(&h1, 1, false, None) == Slot::Taken;
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
            let t = loom::thread::spawn(move || s1.admit(&h1, 1, false, None));
            let mine = s.admit(&hosts[0], 1, false, None);
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

    /// Channels of hosts with one held command each, the window's way.
    struct Chans<'a> {
        window: &'a WindowShared,
        hosts: &'a [HostWindow],
        /// Per channel: its host, and whether it waits with a command held.
        chans: Vec<(usize, bool)>,
        tried: Vec<usize>,
    }

    impl WindowWaiters for Chans<'_> {
        fn each_waiting(&self, visit: &mut dyn FnMut(usize, u64)) {
            for (k, &(h, waits)) in self.chans.iter().enumerate() {
                if waits {
                    visit(k, self.hosts[h].tag());
                }
            }
        }
        fn retry(&mut self, k: usize) {
            self.tried.push(k);
            let h = self.chans[k].0;
            if self.window.admit(&self.hosts[h], 1, false, None) == Slot::Taken {
                self.chans[k].1 = false;
            }
        }
    }

    #[test]
    fn dispatch_hands_slots_smallest_tag_first_with_tags_read_afresh() {
        let s = on(2);
        let hosts: Vec<HostWindow> = (0..3).map(|_| HostWindow::default()).collect();
        hosts[0].tag.store(5 * TAG_UNIT, Ordering::Relaxed);
        hosts[1].tag.store(TAG_UNIT, Ordering::Relaxed);
        hosts[2].tag.store(3 * TAG_UNIT, Ordering::Relaxed);
        // Host 1 has two channels: once its first took a slot, its tag (2) is still
        // below host 2's (3) and its second goes next; the window is then full.
        let chans = vec![(0, true), (1, true), (2, true), (1, true)];
        let mut c = Chans {
            window: &s,
            hosts: &hosts,
            chans: chans.clone(),
            tried: Vec::new(),
        };
        dispatch(&s, Handing::WhileRoom, &mut c);
        assert_eq!(c.tried, [1, 3]);
        assert_eq!(s.in_flight(), 2);
        // Every waiting channel tries once, room or not, in tag order.
        c.tried.clear();
        dispatch(&s, Handing::EveryWaiting, &mut c);
        assert_eq!(c.tried, [2, 0]);
        assert_eq!(s.in_flight(), 2);
        // The window off: nothing to hand.
        let off = WindowShared::default();
        let mut c = Chans {
            window: &off,
            hosts: &hosts,
            chans,
            tried: Vec::new(),
        };
        dispatch(&off, Handing::WhileRoom, &mut c);
        assert!(c.tried.is_empty());
    }

    #[test]
    fn the_tried_set_holds_any_channel_index() {
        let mut t = Tried::default();
        for k in [0, 63, 64, 255, 256, 1000] {
            assert!(!t.contains(k));
            t.insert(k);
            assert!(t.contains(k));
        }
        assert!(!t.contains(1) && !t.contains(320) && !t.contains(5000));
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
                        if s.admit(h, 1, false, None) == Slot::Taken {
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
