//! The atomics the ledger is built on, and the tagged token pool. Under `--cfg loom`
//! the same code runs on loom's model-checked atomics.

#[cfg(loom)]
pub(crate) use loom::sync::Arc;
#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicU64, Ordering, fence};
#[cfg(not(loom))]
pub(crate) use std::sync::Arc;
#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{AtomicU64, Ordering, fence};

/// Keeps `T` on cache lines of its own, so that threads writing neighbouring state
/// (another pool, the counters) do not invalidate the line every command reads.
#[derive(Debug, Default)]
#[repr(align(64))]
pub struct CachePadded<T>(pub T);

impl<T> std::ops::Deref for CachePadded<T> {
    type Target = T;
    #[inline]
    fn deref(&self) -> &T {
        &self.0
    }
}

/// Largest count a pool holds (48 bits): 256 TiB, more than any target moves in the
/// longest period (60 s).
pub const POOL_MAX: u64 = (1 << 48) - 1;
const COUNT_MASK: u64 = POOL_MAX;

#[inline]
const fn pack(tag: u16, count: u64) -> u64 {
    ((tag as u64) << 48)
        | (if count > COUNT_MASK {
            COUNT_MASK
        } else {
            count
        })
}
#[inline]
const fn unpack(w: u64) -> (u16, u64) {
    ((w >> 48) as u16, w & COUNT_MASK)
}

/// A count of tokens tagged with the period (epoch) they belong to, in one atomic word.
/// Takes name the period they expect, so that a channel can never take tokens of a new
/// period believing they are of the old one (or the reverse): the roll-over that
/// retags a pool and every take are ordered by the same compare-and-swap.
///
/// The word: the period's tag in the top 16 bits, the count (tokens, cost units) in
/// the low 48 ([`POOL_MAX`]). Channels take and give, the monitor re-arms
/// (`replace`) and caps; every change is an `AcqRel` read-modify-write and every load
/// an Acquire, so the word's modification order alone orders takes against a re-arm.
/// What else a re-arm publishes (the period's start, the other pools) is published by
/// the domain's epoch, not by this word (see `ledger::DomainShared`).
#[derive(Debug)]
pub struct TokenPool(AtomicU64);

impl Default for TokenPool {
    fn default() -> Self {
        TokenPool(AtomicU64::new(0))
    }
}

impl TokenPool {
    pub fn new(tag: u16, count: u64) -> Self {
        TokenPool(AtomicU64::new(pack(tag, count)))
    }

    /// `(tag, count)` now.
    #[inline]
    pub fn load(&self) -> (u16, u64) {
        unpack(self.0.load(Ordering::Acquire))
    }

    /// Takes up to `want` tokens of period `tag`; returns how many it took (0 when the
    /// pool is of another period). Fetch-and-add semantics without overdraft.
    #[inline]
    pub fn take(&self, tag: u16, want: u64) -> u64 {
        self.take_above(tag, want, 0)
    }

    /// Takes up to `want` tokens of period `tag` while leaving at least `floor` in the
    /// pool (tokens not released yet); returns how many it took.
    #[inline]
    pub fn take_above(&self, tag: u16, want: u64, floor: u64) -> u64 {
        self.take_carry(tag, want, floor, u64::MAX)
    }

    /// Like [`TokenPool::take_above`], but first gives up for good what lies above
    /// `floor + carry`: released tokens beyond `carry` that nobody took in time expire,
    /// so a rate limit cannot be saved up and spent in a burst. Returns how many it took.
    #[inline]
    pub fn take_carry(&self, tag: u16, want: u64, floor: u64, carry: u64) -> u64 {
        let mut cur = self.0.load(Ordering::Acquire);
        loop {
            let (t, c) = unpack(cur);
            if t != tag {
                return 0;
            }
            let top = c.min(floor.saturating_add(carry));
            let got = if top <= floor {
                0
            } else {
                want.min(top - floor)
            };
            if top == c && got == 0 {
                return 0;
            }
            match self.0.compare_exchange_weak(
                cur,
                pack(t, top - got),
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return got,
                Err(actual) => cur = actual,
            }
        }
    }

    /// Adds tokens of period `tag`; returns false (and adds nothing) when the pool has
    /// moved to another period, in which case the caller's tokens have expired.
    pub fn give(&self, tag: u16, n: u64) -> bool {
        let mut cur = self.0.load(Ordering::Acquire);
        loop {
            let (t, c) = unpack(cur);
            if t != tag {
                return false;
            }
            match self.0.compare_exchange_weak(
                cur,
                pack(t, c.saturating_add(n)),
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return true,
                Err(actual) => cur = actual,
            }
        }
    }

    /// Lowers the count of period `tag` to at most `max`; returns `(removed, left)`.
    /// Nothing happens if the pool is of another period.
    pub fn cap(&self, tag: u16, max: u64) -> (u64, u64) {
        let mut cur = self.0.load(Ordering::Acquire);
        loop {
            let (t, c) = unpack(cur);
            if t != tag || c <= max {
                return (0, if t == tag { c } else { 0 });
            }
            match self.0.compare_exchange_weak(
                cur,
                pack(t, max),
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return (c - max, max),
                Err(actual) => cur = actual,
            }
        }
    }

    /// Sets the pool to `count` tokens of period `tag`; returns the previous `(tag, count)`.
    pub fn replace(&self, tag: u16, count: u64) -> (u16, u64) {
        unpack(self.0.swap(pack(tag, count), Ordering::AcqRel))
    }

    /// Sets the count of period `tag` to `count` if the pool is of that period; returns
    /// the previous count, or `None` if the pool is of another period.
    pub fn set_in_period(&self, tag: u16, count: u64) -> Option<u64> {
        let mut cur = self.0.load(Ordering::Acquire);
        loop {
            let (t, c) = unpack(cur);
            if t != tag {
                return None;
            }
            match self.0.compare_exchange_weak(
                cur,
                pack(t, count),
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return Some(c),
                Err(actual) => cur = actual,
            }
        }
    }
}

/// A token pool per period parity: the current period's tokens in one slot, the next
/// period's in the other, armed ahead by the monitor during the period, so that the
/// roll-over itself only publishes the new epoch instead of retagging every host's
/// pools. Every operation names its period (tag) and works on that period's slot, whose
/// own tag check still refuses tokens of another period: a channel that is one period
/// behind finds the slot retagged (or not yet armed) and takes nothing.
///
/// Slot `tag & 1` holds period `tag`'s tokens. Writers and readers, and the ordering,
/// are [`TokenPool`]'s, slot by slot.
#[derive(Debug, Default)]
pub struct EpochPool([TokenPool; 2]);

impl EpochPool {
    /// A pool holding `count` tokens of period `tag` (the other slot empty).
    pub fn new(tag: u16, count: u64) -> Self {
        let p = EpochPool::default();
        p.slot(tag).replace(tag, count);
        p
    }

    #[inline]
    fn slot(&self, tag: u16) -> &TokenPool {
        &self.0[(tag & 1) as usize]
    }

    /// Tokens of period `tag` (0 when its slot holds another period's).
    #[inline]
    pub fn count(&self, tag: u16) -> u64 {
        let (t, c) = self.slot(tag).load();
        if t == tag { c } else { 0 }
    }

    /// Tokens in both slots, whatever their period: an ended period's leftovers stay in
    /// their slot until it is armed for the period after next, and the next period's
    /// tokens sit in theirs once armed. What the audit counts as pooled.
    pub fn held(&self) -> u64 {
        self.0[0].load().1.saturating_add(self.0[1].load().1)
    }

    /// See [`TokenPool::take`].
    #[inline]
    pub fn take(&self, tag: u16, want: u64) -> u64 {
        self.slot(tag).take(tag, want)
    }
    /// See [`TokenPool::take_above`].
    #[inline]
    pub fn take_above(&self, tag: u16, want: u64, floor: u64) -> u64 {
        self.slot(tag).take_above(tag, want, floor)
    }
    /// See [`TokenPool::take_carry`].
    #[inline]
    pub fn take_carry(&self, tag: u16, want: u64, floor: u64, carry: u64) -> u64 {
        self.slot(tag).take_carry(tag, want, floor, carry)
    }
    /// See [`TokenPool::give`].
    pub fn give(&self, tag: u16, n: u64) -> bool {
        self.slot(tag).give(tag, n)
    }
    /// See [`TokenPool::cap`].
    pub fn cap(&self, tag: u16, max: u64) -> (u64, u64) {
        self.slot(tag).cap(tag, max)
    }
    /// Arms period `tag`'s slot with `count` tokens; returns what the slot held before
    /// (`(tag, n)`: tokens of that same period, armed earlier; another tag: an ended
    /// period's leftovers, now expired).
    pub fn replace(&self, tag: u16, count: u64) -> (u16, u64) {
        self.slot(tag).replace(tag, count)
    }
}

/// A sequence lock over `N` words: one writer (the monitor) publishes a whole record,
/// many readers (channels) copy it out and retry or give up if a write overlapped.
/// All words are atomics, so a torn read is detected, never undefined behaviour.
///
/// Memory ordering (the classic sequence lock): the writer makes the generation odd
/// (`Relaxed`), then a Release fence, the words (`Relaxed`), and the even generation
/// (Release). A reader loads the generation (Acquire, pairing with the writer's final
/// Release store: it sees the words of that write or newer), the words (`Relaxed`),
/// then an Acquire fence (pairing with the writer's Release fence: if it read a word of
/// a later write, it sees that write's odd generation) and the generation again: equal
/// and even, the copy is one write's.
#[derive(Debug)]
pub struct SeqLock<const N: usize> {
    /// Even when no write is under way; +2 per write.
    gen_: AtomicU64,
    /// The record.
    words: [AtomicU64; N],
}

impl<const N: usize> SeqLock<N> {
    pub fn new(words: [u64; N]) -> Self {
        SeqLock {
            gen_: AtomicU64::new(0),
            words: words.map(AtomicU64::new),
        }
    }

    /// The generation: it changes with every write (odd while one is under way).
    #[inline]
    pub fn generation(&self) -> u64 {
        self.gen_.load(Ordering::Acquire)
    }

    /// Single writer only.
    pub fn write(&self, words: &[u64; N]) {
        let g = self.gen_.load(Ordering::Relaxed);
        self.gen_.store(g.wrapping_add(1), Ordering::Relaxed);
        fence(Ordering::Release);
        for (w, v) in self.words.iter().zip(words) {
            w.store(*v, Ordering::Relaxed);
        }
        self.gen_.store(g.wrapping_add(2), Ordering::Release);
    }

    /// A consistent copy and its generation, or `None` while a write is under way.
    pub fn try_read(&self) -> Option<(u64, [u64; N])> {
        let g1 = self.gen_.load(Ordering::Acquire);
        if g1 & 1 == 1 {
            return None;
        }
        let mut out = [0u64; N];
        for (o, w) in out.iter_mut().zip(&self.words) {
            *o = w.load(Ordering::Relaxed);
        }
        fence(Ordering::Acquire);
        (self.gen_.load(Ordering::Relaxed) == g1).then_some((g1, out))
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn take_never_overdraws_and_respects_the_tag() {
        let p = TokenPool::new(7, 10);
        assert_eq!(p.take(7, 4), 4);
        assert_eq!(p.take(7, 100), 6);
        assert_eq!(p.take(7, 1), 0);
        assert_eq!(p.take(8, 1), 0);
        assert!(p.give(7, 3));
        assert!(!p.give(6, 3));
        assert_eq!(p.load(), (7, 3));
    }

    #[test]
    fn take_above_leaves_the_floor() {
        let p = TokenPool::new(1, 10);
        assert_eq!(p.take_above(1, 8, 4), 6);
        assert_eq!(p.take_above(1, 8, 4), 0);
        assert_eq!(p.take_above(2, 8, 0), 0);
        assert_eq!(p.load(), (1, 4));
    }

    #[test]
    fn take_carry_expires_what_was_saved_up() {
        let p = TokenPool::new(1, 100);
        // Floor 40 (not released), carry 10: 50 expire, 5 taken.
        assert_eq!(p.take_carry(1, 5, 40, 10), 5);
        assert_eq!(p.load(), (1, 45));
        assert_eq!(p.take_carry(1, 50, 40, 10), 5);
        assert_eq!(p.take_carry(1, 5, 40, 10), 0);
        assert_eq!(p.take_carry(2, 5, 0, 10), 0);
        assert_eq!(p.load(), (1, 40));
    }

    #[test]
    fn cap_and_replace() {
        let p = TokenPool::new(1, 100);
        assert_eq!(p.cap(1, 40), (60, 40));
        assert_eq!(p.cap(1, 50), (0, 40));
        assert_eq!(p.cap(2, 0), (0, 0));
        assert_eq!(p.replace(2, 5), (1, 40));
        assert_eq!(p.set_in_period(1, 9), None);
        assert_eq!(p.set_in_period(2, 9), Some(5));
        assert_eq!(p.load(), (2, 9));
    }

    #[test]
    fn epoch_pool_keeps_the_next_period_apart() {
        let p = EpochPool::new(4, 10);
        // The next period armed ahead: the current one is untouched.
        assert_eq!(p.replace(5, 7), (0, 0));
        assert_eq!(p.count(4), 10);
        assert_eq!(p.count(5), 7);
        assert_eq!(p.held(), 17);
        assert_eq!(p.take(4, 3), 3);
        assert_eq!(p.take(5, 100), 7);
        // Period 6 shares period 4's slot: arming it expires 4's leftovers.
        assert_eq!(p.count(6), 0);
        assert_eq!(p.take(6, 1), 0);
        assert!(!p.give(6, 1));
        assert_eq!(p.replace(6, 2), (4, 7));
        assert_eq!(p.count(4), 0);
        assert_eq!(p.take(4, 1), 0);
        assert!(
            !p.give(4, 1),
            "a channel one period behind takes and gives nothing"
        );
        assert_eq!(p.cap(6, 1), (1, 1));
        assert_eq!(p.held(), 1);
    }

    #[test]
    fn counts_saturate_at_48_bits() {
        let p = TokenPool::new(0xffff, u64::MAX);
        assert_eq!(p.load(), (0xffff, POOL_MAX));
        assert!(p.give(0xffff, 10));
        assert_eq!(p.load().1, POOL_MAX);
    }
}

/// Model-checked interleavings (run with `RUSTFLAGS="--cfg loom" cargo test -p qos-core
/// --release --lib loom`): every ordering of two channels taking tokens while the
/// monitor rolls the period over or converts keeps the books exact.
#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use loom::thread;

    /// Every interleaving with up to 3 preemptions (loom's recommended bound: bugs
    /// need few preemptions, and the full space of the CAS loops is astronomically large).
    fn bounded(f: impl Fn() + Sync + Send + 'static) {
        let mut b = loom::model::Builder::new();
        b.preemption_bound = Some(3);
        b.check(f);
    }

    #[test]
    fn takes_racing_a_roll_over_lose_and_create_nothing() {
        bounded(|| {
            let pool = Arc::new(TokenPool::new(1, 5));
            let spawn = |p: Arc<TokenPool>| {
                thread::spawn(move || {
                    // A channel that believes it is in period 1, then learns period 2.
                    let old = p.take(1, 3);
                    let new = p.take(2, 3);
                    (old, new)
                })
            };
            let a = spawn(pool.clone());
            let b = spawn(pool.clone());
            // The monitor ends period 1: what is left expires, 4 fresh tokens appear.
            let (tag, expired) = pool.replace(2, 4);
            assert_eq!(tag, 1);
            let (a_old, a_new) = a.join().unwrap();
            let (b_old, b_new) = b.join().unwrap();
            let left = pool.load().1;
            assert_eq!(
                a_old + b_old + expired,
                5,
                "period 1 tokens: taken or expired"
            );
            assert_eq!(a_new + b_new + left, 4, "period 2 tokens: taken or left");
        });
    }

    /// A channel that sees the epoch the monitor published after arming the next
    /// period's slot ahead finds that period's tokens there, while a channel still in
    /// the old period takes only the old period's.
    #[test]
    fn a_published_epoch_finds_its_pools_armed_ahead() {
        bounded(|| {
            let epoch = Arc::new(AtomicU64::new(1));
            let pool = Arc::new(EpochPool::new(1, 2));
            let (e2, p2) = (epoch.clone(), pool.clone());
            let channel = thread::spawn(move || {
                let mut taken = [0u64; 3];
                for _ in 0..2 {
                    let e = e2.load(Ordering::Acquire);
                    let got = p2.take(e as u16, 2);
                    if e == 2 && taken[2] == 0 {
                        assert_eq!(got, 2, "the new period's slot was armed before its epoch");
                    }
                    taken[e as usize] += got;
                }
                taken
            });
            assert_eq!(pool.replace(2, 3), (0, 0));
            epoch.store(2, Ordering::Release);
            let taken = channel.join().unwrap();
            assert_eq!(
                taken[2] + pool.count(2),
                3,
                "period 2 tokens: taken or left"
            );
            assert_eq!(
                taken[1] + pool.count(1),
                2,
                "period 1 tokens: taken or left"
            );
        });
    }

    /// A reader never sees a mix of two records.
    #[test]
    fn seqlock_reads_are_whole() {
        loom::model(|| {
            let l = Arc::new(SeqLock::new([1, 1, 1]));
            let l2 = l.clone();
            let reader = thread::spawn(move || l2.try_read());
            l.write(&[2, 2, 2]);
            if let Some((g, w)) = reader.join().unwrap() {
                assert!(w == [1, 1, 1] || w == [2, 2, 2], "torn read: {w:?}");
                assert_eq!(g % 2, 0);
            }
        });
    }

    #[test]
    fn conversion_cap_and_give_back_conserve() {
        bounded(|| {
            let pool = Arc::new(TokenPool::new(7, 10));
            let p2 = pool.clone();
            let t = thread::spawn(move || {
                let got = p2.take(7, 4);
                let back = got / 2;
                assert!(p2.give(7, back));
                got - back
            });
            let (removed, _) = pool.cap(7, 6);
            let kept = t.join().unwrap();
            assert_eq!(kept + removed + pool.load().1, 10);
        });
    }
}
