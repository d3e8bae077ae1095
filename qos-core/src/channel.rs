//! One host's channel at the target on one thread: its token caches
//! ([`ChannelTokens`]), the FIFO of commands held for tokens ([`HoldQueue`]), and the
//! cadence at which held commands are tried again: on the completions of the
//! channel's own commands (after a try that released nothing, the next
//! [`COMPLETIONS_BETWEEN_TRIES`] completions do not try), and on a poller every
//! [`POLL_INTERVAL`], which also publishes the channel's counters. The target plugin
//! and the lab both drive this type, so the lab releases held commands when the
//! plugin does.

use crate::cost::IoKind;
use crate::hold::HoldQueue;
use crate::ledger::ChannelTokens;
use crate::time::Nanos;

/// Period of a channel's poller (release held commands, publish counters).
pub const POLL_INTERVAL: Nanos = Nanos(100_000);

/// After a completion's try at the held queue released nothing, the next completions
/// that do not try. Tokens come with the monitor's ticks and the paced release, not
/// with completions: under weighted sharing most commands are held and every
/// completion tried and failed (about 3 % of the target's CPU at 250 K IOPS, `perf`).
/// The poller still tries every [`POLL_INTERVAL`].
pub const COMPLETIONS_BETWEEN_TRIES: u32 = 8;

/// A host's channel on one thread. `T` is the caller's handle of a command (a
/// bdev_io in the plugin, a request id in the lab); every handle that enters leaves
/// exactly once, through [`TargetChannel::admit`], a release, [`TargetChannel::remove_first`]
/// or [`TargetChannel::drain`].
///
/// Not shared: the thread that owns it calls every method (`&mut self`), so it has no
/// memory ordering of its own; what it shares with the other threads and the monitor
/// is its tokens' ledger ([`crate::ledger::DomainShared`], [`crate::ledger::HostShared`]).
#[derive(Debug)]
pub struct TargetChannel<T> {
    /// The host's token caches on this thread, and its share of the ledger.
    tokens: ChannelTokens,
    /// Commands waiting for tokens (or the window), in arrival order.
    held: HoldQueue<T>,
    /// Completions still to pass before one tries the held queue again.
    completions_to_skip: u32,
}

impl<T> TargetChannel<T> {
    pub fn new(tokens: ChannelTokens) -> Self {
        TargetChannel {
            tokens,
            held: HoldQueue::new(),
            completions_to_skip: 0,
        }
    }

    /// The token caches (vendor commands, credit hints).
    pub fn tokens(&mut self) -> &mut ChannelTokens {
        &mut self.tokens
    }

    /// Commands held now.
    pub fn held(&self) -> usize {
        self.held.len()
    }

    /// Admits `item` now (returns it: send it) or holds it (returns `None`). A command
    /// never overtakes one already held.
    #[inline]
    pub fn admit(&mut self, kind: IoKind, bytes: u64, now: Nanos, item: T) -> Option<T> {
        if !self.held.is_empty() && self.tokens.releases_on_arrival() {
            // One in, one out here, in the caller's own batch: the command that comes
            // is held and the oldest goes to the base in its place (the I/O path then
            // sees the same batches as with nothing held; released at a later
            // completion's try, the target read and answered in smaller batches).
            return self
                .held
                .hold_and_release_one(&mut self.tokens, kind, bytes, now, item)
                .map(|(item, _)| item);
        }
        self.held
            .admit_or_hold(&mut self.tokens, kind, bytes, now, item)
    }

    /// Books the completion of an admitted command that spent `service` at the base
    /// (zero for one that failed before it: its tokens were spent all the same).
    #[inline]
    pub fn record_completion(&mut self, kind: IoKind, bytes: u64, service: Nanos) {
        self.tokens.record_completion(kind, bytes);
        self.tokens.record_service(service);
    }

    /// After a completion: tries the held queue, unless a try released nothing within
    /// the last [`COMPLETIONS_BETWEEN_TRIES`] completions. `now` is called only when it
    /// tries (a clock read per completion shows in the target's IOPS); `send` gets each
    /// released command; returns how many.
    pub fn on_completion(&mut self, now: impl FnOnce() -> Nanos, send: impl FnMut(T)) -> usize {
        if self.held.is_empty() || self.tokens.releases_on_arrival() {
            // Over circulation a completion frees nothing a held command waits for:
            // arrivals release (one in, one out) and the poller lets go what waited
            // too long or what a lowered hold target frees.
            return 0;
        }
        // A completion frees a slot of the operating point's window: a channel that
        // waits for one tries at once.
        if self.completions_to_skip > 0 && !self.tokens.waits_for_window() {
            self.completions_to_skip -= 1;
            return 0;
        }
        self.release(now(), send)
    }

    /// Tries the held queue now (a slot of the window freed elsewhere: the lab's
    /// dispatcher); returns how many were released.
    pub fn retry(&mut self, now: Nanos, send: impl FnMut(T)) -> usize {
        if self.held.is_empty() {
            return 0;
        }
        self.release(now, send)
    }

    /// Its host's start tag in the window's weighted order, and whether it waits for
    /// the window (see [`ChannelTokens::window_tag`]).
    pub fn window_tag(&self) -> u64 {
        self.tokens.window_tag()
    }
    pub fn waits_for_window(&self) -> bool {
        !self.held.is_empty() && self.tokens.waits_for_window()
    }

    /// The poller: releases what tokens allow and publishes the counters.
    pub fn poll(&mut self, now: Nanos, send: impl FnMut(T)) -> usize {
        let n = if self.held.is_empty() {
            0
        } else {
            self.release(now, send)
        };
        self.tokens.flush();
        n
    }

    /// Publishes the counters without trying the held queue (a channel going away).
    pub fn flush(&mut self) {
        self.tokens.flush();
    }

    fn release(&mut self, now: Nanos, mut send: impl FnMut(T)) -> usize {
        let n = self
            .held
            .release(&mut self.tokens, now, |item, _| send(item));
        self.completions_to_skip = if n == 0 { COMPLETIONS_BETWEEN_TRIES } else { 0 };
        n
    }

    /// Takes out the first held command that `matches` (an abort), without tokens.
    pub fn remove_first(&mut self, matches: impl FnMut(&T) -> bool) -> Option<T> {
        self.held.remove_first(&mut self.tokens, matches)
    }

    /// Takes out every held command (reset, delete, shutdown), oldest first; the
    /// caller completes or sends each (never admitted, so not booked).
    pub fn drain(&mut self) -> Vec<T> {
        self.held.drain(&mut self.tokens).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{ExcessSharing, HostConfig, Rate, ReservationRelease, test_domain};
    use crate::monitor::Monitor;

    /// A host limited to 1,000 IOPS (1 per ms) on a domain with nothing else.
    fn limited() -> (Monitor, TargetChannel<u32>) {
        let d = test_domain(100_000, ReservationRelease::Paced, ExcessSharing::FirstCome);
        let mut m = Monitor::new(d, Nanos(0)).unwrap();
        let h = HostConfig::new("h").with_limit(Rate::iops(1000));
        m.add_host(h, Nanos(0)).unwrap();
        let ch = TargetChannel::new(m.channel("h").unwrap());
        (m, ch)
    }

    #[test]
    fn a_completion_that_released_nothing_skips_the_next_tries_and_the_poller_still_releases() {
        let (_m, mut ch) = limited();
        let mut sent = Vec::new();
        let t = Nanos::from_millis(500);
        for i in 0..200 {
            if let Some(x) = ch.admit(IoKind::Read, 4096, t, i) {
                sent.push(x);
            }
        }
        assert!(ch.held() > 0, "the limit holds some");
        let held = ch.held();
        // Nothing new is released at the same instant: the first completion tries, the
        // next eight do not.
        assert_eq!(ch.on_completion(|| t, |x| sent.push(x)), 0);
        for _ in 0..COMPLETIONS_BETWEEN_TRIES {
            assert_eq!(
                ch.on_completion(|| Nanos::from_millis(900), |x| sent.push(x)),
                0
            );
        }
        // The ninth tries again, with the limit's allowance of 400 ms more.
        assert!(ch.on_completion(|| Nanos::from_millis(900), |x| sent.push(x)) > 0);
        let later = ch.poll(Nanos::from_millis(999), |x| sent.push(x));
        assert!(later > 0 || ch.held() == 0);
        let drained = ch.drain();
        assert_eq!(
            sent.len() + drained.len(),
            200,
            "every command leaves exactly once"
        );
        let mut all: Vec<u32> = sent.into_iter().chain(drained).collect();
        all.sort_unstable();
        assert!(all.iter().copied().eq(0..200));
        assert!(held > 0);
    }

    /// Sends what the channel releases at `at_ms` (its poller).
    fn poll_at(ch: &mut TargetChannel<u32>, at_ms: u64) -> usize {
        ch.poll(Nanos::from_millis(at_ms), |_| {})
    }

    /// [`limited`] with 100 commands offered at 100 ms and polled at 101 ms: the limit
    /// holds most of them.
    fn held_at_its_limit() -> (Monitor, TargetChannel<u32>) {
        let (m, mut ch) = limited();
        for i in 0..100 {
            ch.admit(IoKind::Read, 4096, Nanos::from_millis(100), i);
        }
        poll_at(&mut ch, 101);
        let held = ch.held();
        assert!(held > 20, "the limit holds most: {held} held");
        (m, ch)
    }

    #[test]
    fn a_channel_that_holds_commands_keeps_the_limit_released_while_its_thread_did_not_run() {
        // 1 per ms. A reactor under a CPU quota stops for milliseconds at a time; the
        // host's held commands must not lose what was released meanwhile.
        let (_m, mut ch) = held_at_its_limit();
        // The thread is stopped for 10 ms: the next poll releases about 10.
        let got = poll_at(&mut ch, 111);
        assert!((9..=12).contains(&got), "released {got} after 10 ms away");
        // Polled on time, it releases at the rate and no faster.
        let got: usize = (112..=131).map(|ms| poll_at(&mut ch, ms)).sum();
        assert!((19..=21).contains(&got), "released {got} over 20 ms");
    }

    #[test]
    fn a_channel_that_held_nothing_does_not_catch_up_on_the_time_it_was_idle() {
        let (_m, mut ch) = held_at_its_limit();
        ch.drain();
        // Idle for 50 ms: only about one release burst (1 ms) is saved up for it.
        let mut admitted = 0;
        for i in 0..100 {
            if ch
                .admit(IoKind::Read, 4096, Nanos::from_millis(151), i)
                .is_some()
            {
                admitted += 1;
            }
        }
        assert!(
            admitted <= 4,
            "an idle channel caught up {admitted} commands"
        );
    }

    #[test]
    fn a_host_reserved_close_to_its_limit_catches_up_its_reservation_after_being_away() {
        // Limit 1,000 and reservation 800 a 1-s period. The host sends nothing for
        // half the period (its initiator starved of CPU, a controller reset), then
        // keeps 64 commands waiting: its released reservation (400) is not withheld by
        // the limit's rate, so it gets its reservation in the period, and never more
        // than the limit.
        for reserved in [800, 0] {
            let d = test_domain(100_000, ReservationRelease::Paced, ExcessSharing::FirstCome);
            let mut m = Monitor::new(d, Nanos(0)).unwrap();
            let mut h = HostConfig::new("h").with_limit(Rate::iops(1000));
            if reserved > 0 {
                h = h.with_reservation(Rate::iops(reserved));
            }
            m.add_host(h, Nanos(0)).unwrap();
            let mut ch = TargetChannel::new(m.channel("h").unwrap());
            let (mut sent, mut id) = (0usize, 0u32);
            for ms in 500..1000u64 {
                let t = Nanos::from_millis(ms);
                while ch.held() < 64 {
                    if ch.admit(IoKind::Read, 4096, t, id).is_some() {
                        sent += 1;
                    }
                    id += 1;
                }
                sent += ch.poll(t, |_| {});
            }
            assert!(
                sent <= 1000,
                "reserved {reserved}: {sent} sent, limit 1,000"
            );
            if reserved > 0 {
                assert!(sent >= 800, "{sent} sent of a reservation of 800");
            } else {
                // Unreserved, the limit is a rate: no catching up on the time away.
                assert!(sent <= 510, "{sent} sent in half a period at 1 a ms");
            }
        }
    }

    #[test]
    fn two_channels_of_a_host_whose_threads_take_turns_get_the_limit_and_no_more() {
        // Channel a's thread runs in the first 5 ms of every 10, b's in the other 5
        // (two reactors, each stopped half the time); both always hold commands. And
        // seeded random schedules where either thread stops for up to 20 ms at a time,
        // or both: never more than the limit in the period.
        for seed in 0..20u64 {
            let (m, mut a) = limited();
            let mut b = TargetChannel::new(m.channel("h").unwrap());
            let (mut sent, mut id, mut rng) = (0usize, 0u32, seed.wrapping_add(1));
            let (mut a_until, mut b_until) = (0u64, 0u64);
            for ms in 1..1000u64 {
                let t = Nanos::from_millis(ms);
                let (a_runs, b_runs) = if seed == 0 {
                    (ms % 10 < 5, ms % 10 >= 5)
                } else {
                    rng ^= rng << 13;
                    rng ^= rng >> 7;
                    rng ^= rng << 17;
                    if ms >= a_until && rng % 7 == 0 {
                        a_until = ms + rng % 20;
                    }
                    if ms >= b_until && (rng >> 8) % 7 == 0 {
                        b_until = ms + (rng >> 16) % 20;
                    }
                    (ms >= a_until, ms >= b_until)
                };
                for (ch, runs) in [(&mut a, a_runs), (&mut b, b_runs)] {
                    if !runs {
                        continue;
                    }
                    while ch.held() < 16 {
                        if ch.admit(IoKind::Read, 4096, t, id).is_some() {
                            sent += 1;
                        }
                        id += 1;
                    }
                    sent += ch.poll(t, |_| {});
                }
            }
            assert!(sent <= 1000, "seed {seed}: {sent} sent, limit 1,000");
            if seed == 0 {
                assert!(sent >= 990, "taking turns: {sent} sent of 1,000");
            }
        }
    }
}
