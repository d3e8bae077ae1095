//! I/O waiting for tokens. One queue per channel, strictly first in, first out: once one
//! command waits, later ones wait behind it, so a host's commands leave in the order
//! they came and a large command is not starved by small ones slipping past it.

use std::collections::VecDeque;

use crate::cost::IoKind;
use crate::ledger::ChannelTokens;
use crate::time::Nanos;

/// Whatever decides whether a command may go now: the target's [`ChannelTokens`] or
/// the initiator's [`crate::initiator::InitiatorEngine`].
pub trait Admit {
    /// Consumes tokens and returns true when the command may be sent now.
    fn admit(&mut self, kind: IoKind, bytes: u64, now: Nanos) -> bool;
    /// [`Admit::admit`] for the oldest held command, which has waited `waited`.
    #[inline]
    fn admit_held(&mut self, kind: IoKind, bytes: u64, now: Nanos, _waited: Nanos) -> bool {
        self.admit(kind, bytes, now)
    }
    /// The hold queue's length changed by `delta` (for statistics).
    fn held_changed(&mut self, _delta: i64) {}
    /// A command admitted after waiting `waited` in the queue (zero: admitted at once),
    /// for the held-time statistics.
    #[inline]
    fn left_after(&mut self, _waited: Nanos) {}
}

impl Admit for ChannelTokens {
    #[inline]
    fn admit(&mut self, kind: IoKind, bytes: u64, now: Nanos) -> bool {
        self.try_admit(kind, bytes, now).is_admitted()
    }
    #[inline]
    fn admit_held(&mut self, kind: IoKind, bytes: u64, now: Nanos, waited: Nanos) -> bool {
        self.try_admit_held(kind, bytes, now, waited).is_admitted()
    }
    fn held_changed(&mut self, delta: i64) {
        self.note_held(delta);
    }
    #[inline]
    fn left_after(&mut self, waited: Nanos) {
        self.record_held_time(waited);
    }
}

#[derive(Debug)]
struct Held<T> {
    kind: IoKind,
    bytes: u64,
    since: Nanos,
    item: T,
}

/// A FIFO of held commands of one channel. `T` is the caller's handle (a bdev_io in
/// the plugin, a request id in the lab). Every item that enters leaves exactly once:
/// through [`HoldQueue::release`], [`HoldQueue::remove_first`] or [`HoldQueue::drain`].
#[derive(Debug)]
pub struct HoldQueue<T> {
    q: VecDeque<Held<T>>,
}

impl<T> Default for HoldQueue<T> {
    fn default() -> Self {
        HoldQueue { q: VecDeque::new() }
    }
}

impl<T> HoldQueue<T> {
    pub fn new() -> Self {
        Self::default()
    }
    pub fn len(&self) -> usize {
        self.q.len()
    }
    pub fn is_empty(&self) -> bool {
        self.q.is_empty()
    }
    /// How long the oldest command has waited.
    pub fn oldest_wait(&self, now: Nanos) -> Option<Nanos> {
        self.q.front().map(|h| now.saturating_sub(h.since))
    }

    /// Admits `item` now (returns it: send it) or queues it (returns `None`). A command
    /// never overtakes one already waiting.
    #[inline]
    pub fn admit_or_hold(
        &mut self,
        tokens: &mut impl Admit,
        kind: IoKind,
        bytes: u64,
        now: Nanos,
        item: T,
    ) -> Option<T> {
        if self.q.is_empty() && tokens.admit(kind, bytes, now) {
            tokens.left_after(Nanos(0));
            return Some(item);
        }
        self.hold(tokens, kind, bytes, now, item);
        None
    }

    /// Queues `item` behind the others.
    #[inline]
    fn hold(&mut self, tokens: &mut impl Admit, kind: IoKind, bytes: u64, now: Nanos, item: T) {
        self.q.push_back(Held {
            kind,
            bytes,
            since: now,
            item,
        });
        tokens.held_changed(1);
    }

    /// Releases waiting commands in order while tokens allow; `send` gets each with the
    /// time it waited. Returns how many were released.
    pub fn release(
        &mut self,
        tokens: &mut impl Admit,
        now: Nanos,
        mut send: impl FnMut(T, Nanos),
    ) -> usize {
        let mut n = 0;
        while let Some((item, waited)) = self.release_front(tokens, now) {
            send(item, waited);
            n += 1;
        }
        n
    }

    /// Holds `item` behind the others and releases the oldest if tokens allow: one in,
    /// one out in a single call (the window over circulation, where a host's arrival is
    /// what lets its oldest held command go). Returns the command to send, if any, with
    /// the time it waited.
    #[inline]
    pub fn hold_and_release_one(
        &mut self,
        tokens: &mut impl Admit,
        kind: IoKind,
        bytes: u64,
        now: Nanos,
        item: T,
    ) -> Option<(T, Nanos)> {
        self.hold(tokens, kind, bytes, now, item);
        self.release_front(tokens, now)
    }

    /// The oldest held command, if tokens admit it now.
    #[inline]
    fn release_front(&mut self, tokens: &mut impl Admit, now: Nanos) -> Option<(T, Nanos)> {
        let front = self.q.front()?;
        let waited = now.saturating_sub(front.since);
        if !tokens.admit_held(front.kind, front.bytes, now, waited) {
            return None;
        }
        let h = self.q.pop_front().expect("front exists");
        tokens.held_changed(-1);
        tokens.left_after(waited);
        Some((h.item, waited))
    }

    /// Takes out the first waiting command that `matches` (an abort), without tokens.
    pub fn remove_first(
        &mut self,
        tokens: &mut impl Admit,
        mut matches: impl FnMut(&T) -> bool,
    ) -> Option<T> {
        let i = self.q.iter().position(|h| matches(&h.item))?;
        let h = self.q.remove(i)?;
        tokens.held_changed(-1);
        Some(h.item)
    }

    /// Takes out every waiting command (reset, delete, shutdown), oldest first; the
    /// caller completes each with an error or an abort status.
    pub fn drain(&mut self, tokens: &mut impl Admit) -> impl Iterator<Item = T> + '_ {
        tokens.held_changed(-(self.q.len() as i64));
        self.q.drain(..).map(|h| h.item)
    }
}
