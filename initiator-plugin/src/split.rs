//! The pure parts of splitting one large I/O ("parent") into chunks: carving the
//! parent's scatter-gather list into one list per chunk, and counting chunks so that
//! the parent completes exactly once, after its last chunk, with the right status
//! (success only if every chunk succeeded; otherwise the first error wins). No SPDK
//! here; `io.rs` maps these onto `iovec`s and bdev_ios.

/// One piece of a chunk's scatter-gather list: `len` bytes at `offset` into the
/// parent's element `index`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segment {
    pub index: usize,
    pub offset: usize,
    pub len: usize,
}

/// The parent's scatter-gather list ran out before the chunk was complete.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the I/O's buffers hold {missing} bytes fewer than its blocks need")]
pub struct ShortBuffers {
    pub missing: usize,
}

/// A position in a scatter-gather list; chunks are carved in order.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Cursor {
    index: usize,
    offset: usize,
}

impl Cursor {
    /// Takes the next `len` bytes of the list whose element lengths are `lens`.
    /// Zero-length elements are skipped.
    pub fn take(&mut self, lens: &[usize], len: usize) -> Result<Vec<Segment>, ShortBuffers> {
        let start = self.advance(lens, len)?;
        Ok(start.segments(lens, len).collect())
    }

    /// Moves past the next `len` bytes without listing them; returns where they start
    /// (list them with [`Cursor::segments`] when the chunk is sent: a chunk costs no
    /// allocation). On error the cursor is unchanged.
    pub fn advance(&mut self, lens: &[usize], len: usize) -> Result<Cursor, ShortBuffers> {
        let start = *self;
        let mut at = *self;
        let mut left = len;
        while left > 0 {
            let Some(&elen) = lens.get(at.index) else {
                return Err(ShortBuffers { missing: left });
            };
            let n = elen.saturating_sub(at.offset).min(left);
            left -= n;
            at.offset += n;
            if at.offset >= elen {
                at.index += 1;
                at.offset = 0;
            }
        }
        *self = at;
        Ok(start)
    }

    /// The segments of the `len` bytes from here, in order; `len` must have been
    /// checked with [`Cursor::advance`] (the iterator ends where the list does).
    pub fn segments(self, lens: &[usize], len: usize) -> Segments<'_> {
        Segments {
            lens,
            at: self,
            left: len,
        }
    }
}

/// The segments of one chunk ([`Cursor::segments`]).
#[derive(Debug, Clone)]
pub struct Segments<'a> {
    lens: &'a [usize],
    at: Cursor,
    left: usize,
}

impl Iterator for Segments<'_> {
    type Item = Segment;
    fn next(&mut self) -> Option<Segment> {
        while self.left > 0 {
            let elen = *self.lens.get(self.at.index)?;
            let avail = elen.saturating_sub(self.at.offset);
            if avail == 0 {
                self.at.index += 1;
                self.at.offset = 0;
                continue;
            }
            let n = avail.min(self.left);
            let seg = Segment {
                index: self.at.index,
                offset: self.at.offset,
                len: n,
            };
            self.at.offset += n;
            self.left -= n;
            if self.at.offset == elen {
                self.at.index += 1;
                self.at.offset = 0;
            }
            return Some(seg);
        }
        None
    }
}

/// Why the plugin itself ended a parent early.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// Reset, abort, deletion: the parent completes *aborted*.
    Aborted,
    /// A chunk could not be formed or submitted: the parent completes *failed*.
    Failed,
}

/// How a parent ends when it is not a success: the first chunk error (`E`, e.g. the
/// failed child I/O, whose status the parent copies), or the plugin's own stop.
#[derive(Debug, PartialEq, Eq)]
pub enum Failure<E> {
    Chunk(E),
    Own(Stop),
}

/// Chunk accounting of one parent.
///
/// A chunk is *released* when it leaves the pacer (it then waits for tokens or is at
/// the base) and *finished* when its completion arrives or it is dropped unsent. The
/// parent is done when no chunk is outstanding and either every chunk was released or
/// the parent was stopped; then [`Tracker::outcome`] gives its status, once.
#[derive(Debug)]
pub struct Tracker<E> {
    total: u64,
    released: u64,
    finished: u64,
    stopped: bool,
    failure: Option<Failure<E>>,
    taken: bool,
}

impl<E> Tracker<E> {
    pub fn new(total: u64) -> Self {
        Tracker {
            total: total.max(1),
            released: 0,
            finished: 0,
            stopped: false,
            failure: None,
            taken: false,
        }
    }
    pub fn total(&self) -> u64 {
        self.total
    }
    pub fn released(&self) -> u64 {
        self.released
    }
    pub fn outstanding(&self) -> u64 {
        self.released - self.finished
    }
    /// No more chunks will be released (stopped, or all released).
    pub fn closed(&self) -> bool {
        self.stopped || self.released == self.total
    }
    pub fn is_stopped(&self) -> bool {
        self.stopped
    }
    /// A chunk may still be released.
    pub fn may_release(&self) -> bool {
        !self.closed()
    }

    /// A chunk leaves the pacer. Refused (false) once closed.
    pub fn release(&mut self) -> bool {
        if self.closed() {
            return false;
        }
        self.released += 1;
        true
    }

    /// A released chunk completed successfully.
    pub fn chunk_ok(&mut self) {
        self.finish_one();
    }

    /// A released chunk failed with `e`; the first failure is kept, later ones are
    /// returned to the caller (to free). A failed chunk stops the parent: the chunks
    /// not yet released are never sent.
    pub fn chunk_failed(&mut self, e: E) -> Option<E> {
        self.finish_one();
        self.stopped = true;
        if self.failure.is_none() {
            self.failure = Some(Failure::Chunk(e));
            None
        } else {
            Some(e)
        }
    }

    /// A released chunk was dropped before it reached the base (held chunk aborted,
    /// submission refused): it counts as finished with the plugin's status.
    pub fn chunk_dropped(&mut self, why: Stop) {
        self.finish_one();
        self.stopped = true;
        if self.failure.is_none() {
            self.failure = Some(Failure::Own(why));
        }
    }

    /// No more chunks: the parent ends with `why` unless a chunk failed first. Once
    /// every chunk has been released this changes nothing: the parent's status is
    /// then its chunks'.
    pub fn stop(&mut self, why: Stop) {
        if self.closed() {
            return;
        }
        self.stopped = true;
        if self.failure.is_none() {
            self.failure = Some(Failure::Own(why));
        }
    }

    fn finish_one(&mut self) {
        debug_assert!(
            self.finished < self.released,
            "more completions than chunks"
        );
        self.finished = (self.finished + 1).min(self.released);
    }

    /// Every chunk that will ever be sent has finished.
    pub fn is_done(&self) -> bool {
        self.closed() && self.outstanding() == 0
    }

    /// The parent's outcome, exactly once, when done: `Some(Ok(()))` or
    /// `Some(Err(..))`; `None` before it is done or after it was taken.
    pub fn outcome(&mut self) -> Option<Result<(), Failure<E>>> {
        if !self.is_done() || self.taken {
            return None;
        }
        self.taken = true;
        Some(match self.failure.take() {
            None => Ok(()),
            Some(f) => Err(f),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn carving_follows_the_list_across_elements() {
        let lens = [4096, 0, 8192, 4096];
        let mut c = Cursor::default();
        assert_eq!(
            c.take(&lens, 6144).unwrap(),
            vec![
                Segment {
                    index: 0,
                    offset: 0,
                    len: 4096
                },
                Segment {
                    index: 2,
                    offset: 0,
                    len: 2048
                }
            ]
        );
        assert_eq!(
            c.take(&lens, 6144).unwrap(),
            vec![Segment {
                index: 2,
                offset: 2048,
                len: 6144
            }]
        );
        assert_eq!(c.take(&lens, 8192), Err(ShortBuffers { missing: 4096 }));
    }

    #[test]
    fn a_chunk_is_carved_by_its_start_and_listed_when_sent() {
        let lens = [4096, 0, 8192, 4096];
        let mut c = Cursor::default();
        let first = c.advance(&lens, 6144).unwrap();
        let second = c.advance(&lens, 6144).unwrap();
        assert_eq!(first, Cursor::default());
        let listed: Vec<Segment> = second.segments(&lens, 6144).collect();
        assert_eq!(
            listed,
            vec![Segment {
                index: 2,
                offset: 2048,
                len: 6144
            }]
        );
        // Too long: refused, and the cursor stays where it was.
        let before = c;
        assert_eq!(c.advance(&lens, 8192), Err(ShortBuffers { missing: 4096 }));
        assert_eq!(c, before);
        assert_eq!(c.advance(&lens, 4096).map(|_| c.index), Ok(4));
    }

    proptest! {
        #[test]
        fn chunks_cover_the_buffers_exactly_once_in_order(
            lens in proptest::collection::vec(0usize..20_000, 1..12),
            chunk in 1usize..30_000,
        ) {
            let total: usize = lens.iter().sum();
            let mut c = Cursor::default();
            let mut pos = vec![0usize; lens.len()];
            let mut left = total;
            while left > 0 {
                let n = chunk.min(left);
                let segs = c.take(&lens, n).unwrap();
                prop_assert_eq!(segs.iter().map(|s| s.len).sum::<usize>(), n);
                for s in segs {
                    prop_assert!(s.len > 0);
                    prop_assert_eq!(s.offset, pos[s.index], "contiguous within an element");
                    pos[s.index] += s.len;
                    prop_assert!(pos[s.index] <= lens[s.index]);
                }
                left -= n;
            }
            prop_assert_eq!(pos, lens);
        }

        /// Whatever the order of releases, completions, failures and stops, the parent
        /// completes exactly once, after its last outstanding chunk, and succeeds only
        /// if every chunk was released and succeeded.
        #[test]
        fn a_parent_completes_exactly_once_with_the_first_error(
            total in 1u64..20,
            ops in proptest::collection::vec(0u8..6, 0..80),
        ) {
            let mut t = Tracker::<u32>::new(total);
            let mut in_flight: Vec<u32> = Vec::new();
            let mut next_id = 0u32;
            let mut first_err: Option<Failure<u32>> = None;
            let mut outcomes = 0;
            let mut all_ok = true;
            let check = |t: &mut Tracker<u32>, outcomes: &mut i32| {
                if let Some(o) = t.outcome() {
                    *outcomes += 1;
                    prop_assert_eq!(t.outstanding(), 0);
                    Ok(Some(o))
                } else { Ok(None) }
            };
            let mut result = None;
            for op in ops {
                match op {
                    0 | 1 => {
                        if t.release() { in_flight.push(next_id); next_id += 1; }
                    }
                    2 => if let Some(_id) = in_flight.pop() { t.chunk_ok(); },
                    3 => if let Some(id) = in_flight.pop() {
                        all_ok = false;
                        if first_err.is_none() { first_err = Some(Failure::Chunk(id)); }
                        t.chunk_failed(id);
                    },
                    4 => if let Some(_id) = in_flight.pop() {
                        all_ok = false;
                        if first_err.is_none() { first_err = Some(Failure::Own(Stop::Aborted)); }
                        t.chunk_dropped(Stop::Aborted);
                    },
                    _ => {
                        if !t.closed() {
                            all_ok = false;
                            if first_err.is_none() { first_err = Some(Failure::Own(Stop::Failed)); }
                        }
                        t.stop(Stop::Failed);
                    }
                }
                if let Some(o) = check(&mut t, &mut outcomes)? { result = Some(o); }
            }
            // Drain: finish everything outstanding and release nothing more.
            while in_flight.pop().is_some() {
                t.chunk_ok();
                if let Some(o) = check(&mut t, &mut outcomes)? { result = Some(o); }
            }
            if !t.closed() {
                all_ok = false;
                if first_err.is_none() { first_err = Some(Failure::Own(Stop::Aborted)); }
                t.stop(Stop::Aborted);
                if let Some(o) = check(&mut t, &mut outcomes)? { result = Some(o); }
            }
            prop_assert_eq!(outcomes, 1, "exactly once");
            prop_assert!(t.outcome().is_none());
            let r = result.unwrap();
            if all_ok {
                prop_assert_eq!(r, Ok(()));
            } else {
                prop_assert_eq!(r, Err(first_err.unwrap()));
            }
        }
    }

    #[test]
    fn a_stop_after_a_chunk_error_keeps_the_chunk_error() {
        let mut t = Tracker::<&str>::new(4);
        assert!(t.release() && t.release());
        assert_eq!(t.chunk_failed("media error"), None);
        assert!(!t.release(), "no chunk after a failure");
        t.stop(Stop::Aborted);
        assert_eq!(t.outcome(), None, "one chunk still outstanding");
        assert_eq!(t.chunk_failed("aborted"), Some("aborted"));
        assert_eq!(t.outcome(), Some(Err(Failure::Chunk("media error"))));
        assert_eq!(t.outcome(), None);
    }

    #[test]
    fn success_needs_every_chunk() {
        let mut t = Tracker::<()>::new(2);
        t.release();
        t.chunk_ok();
        assert_eq!(t.outcome(), None);
        t.release();
        assert_eq!(t.outcome(), None);
        t.chunk_ok();
        assert_eq!(t.outcome(), Some(Ok(())));
    }
}
