//! Large transfers (reads and writes above `chunk_bytes` while pacing is on and
//! latency-sensitive I/O shares the path, `PacerGroup::shapes_large`): a
//! *parent* split into chunks (`qos_core::pacer::plan_even_chunks`: equal chunks whose
//! count divides the transfer when that takes fewer), each carved out of the
//! parent's scatter-gather list, released by the pacer group (byte and operation tokens
//! at the allowed rate, the channel's parents in round-robin), admitted like small I/O,
//! and sent to the base; the parent completes once, after its last chunk, with the
//! first error (`split::Tracker`).

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::atomic::Ordering;

use qos_core::pacer::{Chunk, plan_even_chunks};
use qos_core::{IoKind, Nanos};
use spdk_sys::bdev_io::{BaseIo, IoStatus};
use spdk_sys::vbdev::{PieceError, Seg, Split};

use super::{ChunkBuf, IniChannel, IniIo, Item, Parent, ParentRef, now};
use crate::split::{Cursor, Failure, Stop, Tracker};

impl Parent {
    /// Carves the scatter-gather list of `c` out of the parent's; returns its index.
    pub(crate) fn carve(&mut self, c: Chunk) -> Option<usize> {
        let start = self.cursor.advance(&self.lens, self.chunk_len(c)).ok()?;
        self.chunks.push(ChunkBuf { chunk: c, start });
        Some(self.chunks.len() - 1)
    }

    fn chunk_len(&self, c: Chunk) -> usize {
        (c.num_blocks * self.block_len) as usize
    }
}

impl IniChannel {
    /// A read or write (buffers present): small path or chunked.
    pub(crate) fn rw(&self, io: IniIo, kind: IoKind, now: Nanos) {
        self.shared.stats.ios.fetch_add(1, Ordering::Relaxed);
        let bytes = io.block_bytes();
        let pacing = self.pacing() && !self.bypass();
        if pacing && bytes > self.group.chunk_bytes.load(Ordering::Relaxed) {
            // Justitia's trigger: chunks only cost a large transfer throughput, so it
            // is split and paced only while latency-sensitive I/O shares the path.
            if self.group.shapes_large(now) {
                return self.start_large(io, kind, now);
            }
            self.shared
                .stats
                .large_whole_ios
                .fetch_add(1, Ordering::Relaxed);
        } else if pacing {
            self.group.note_small(now);
            self.last_small.set(now.0);
        }
        self.admit(Item::Io(io), kind, bytes, now);
    }

    pub(crate) fn start_large(&self, io: IniIo, kind: IoKind, now: Nanos) {
        let chunk_bytes = self.group.chunk_bytes.load(Ordering::Relaxed);
        let (offset, blocks) = io
            .block()
            .map_or((0, 0), |b| (b.offset_blocks, b.num_blocks));
        let lens: Vec<usize> = io.iovs().iter().map(|v| v.iov_len).collect();
        let largest = self.group.largest_chunk.load(Ordering::Relaxed);
        let mut plan = plan_even_chunks(offset, blocks, self.block_len, chunk_bytes, largest);
        let total = plan.chunk_count();
        let next = plan.next();
        let parent = Parent {
            kind,
            block_len: self.block_len,
            plan,
            next,
            lens,
            cursor: Cursor::default(),
            chunks: Vec::with_capacity(total as usize),
            track: Tracker::new(total),
            waiting_since: now.0,
        };
        let p = match Split::with_pieces(io, RefCell::new(parent), chunk_done, total as usize) {
            Ok(p) => p,
            Err(io) => {
                tracing::error!(
                    bdev = self.shared.name.as_str(),
                    "I/O buffers shorter than its blocks: failing it"
                );
                return io.complete(IoStatus::Failed);
            }
        };
        self.shared.stats.large_ios.fetch_add(1, Ordering::Relaxed);
        {
            let mut st = self.st.borrow_mut();
            st.parents.push(p.clone());
            st.streams.push_back(p);
        }
        self.pump(now);
    }

    /// Releases the chunks the pacer allows now, streams in round-robin order, and
    /// admits them.
    pub(crate) fn pump(&self, now: Nanos) {
        let bypass = self.bypass() || !self.pacing();
        let mut admit: Vec<(Item, IoKind, u64)> = Vec::new();
        let mut finish: Vec<ParentRef> = Vec::new();
        {
            let mut st = self.st.borrow_mut();
            // Read before asking: a change of rates while we ask voids what we are told.
            st.pace_epoch = self.group.rates_epoch.load(Ordering::Relaxed);
            let mut earliest = u64::MAX;
            loop {
                let mut progressed = false;
                for _ in 0..st.streams.len() {
                    let Some(pp) = st.streams.pop_front() else {
                        break;
                    };
                    let mut p = pp.state().borrow_mut();
                    let Some(c) = p.next.filter(|_| p.track.may_release()) else {
                        // Stopped (or done): it leaves the deque; its last completion
                        // (or this) finishes it.
                        if p.track.is_done() {
                            drop(p);
                            finish.push(pp);
                        }
                        continue;
                    };
                    let bytes = c.num_blocks * p.block_len;
                    if !bypass
                        && let Err(t) =
                            self.group
                                .try_send(&mut st.stream, self.shared.flow, bytes, now)
                    {
                        earliest = earliest.min(t.0);
                        drop(p);
                        st.streams.push_back(pp);
                        continue;
                    }
                    let Some(index) = p.carve(c) else {
                        tracing::error!(
                            bdev = self.shared.name.as_str(),
                            "I/O buffers shorter than its blocks: failing it"
                        );
                        p.track.stop(Stop::Failed);
                        if p.track.is_done() {
                            drop(p);
                            finish.push(pp);
                        }
                        continue;
                    };
                    p.track.release();
                    let paced = now.0.saturating_sub(p.waiting_since);
                    if paced > 0 {
                        self.shared
                            .stats
                            .paced_ns
                            .fetch_add(paced, Ordering::Relaxed);
                    }
                    p.waiting_since = now.0;
                    p.next = p.plan.next();
                    let more = p.next.is_some();
                    let kind = p.kind;
                    drop(p);
                    if more {
                        st.streams.push_back(pp.clone());
                    }
                    progressed = true;
                    self.shared.stats.chunks.fetch_add(1, Ordering::Relaxed);
                    self.shared
                        .stats
                        .chunk_bytes
                        .fetch_add(bytes, Ordering::Relaxed);
                    admit.push((Item::Chunk(pp, index), kind, bytes));
                }
                if !progressed || st.streams.is_empty() {
                    break;
                }
            }
            st.pace_wake = earliest;
            if st.streams.is_empty() {
                self.group.close(&mut st.stream, now);
            }
        }
        for (item, kind, bytes) in admit {
            self.admit(item, kind, bytes, now);
        }
        for p in finish {
            self.finish(&p);
        }
    }

    /// Completes a parent whose chunks are all done: exactly once.
    pub(crate) fn finish(&self, pp: &ParentRef) {
        {
            let mut st = self.st.borrow_mut();
            st.streams.retain(|x| !Rc::ptr_eq(x, pp));
            st.parents.retain(|x| !Rc::ptr_eq(x, pp));
            if st.streams.is_empty() && st.stream.is_some() {
                self.group.close(&mut st.stream, now());
            }
        }
        let Some(outcome) = pp.state().borrow_mut().track.outcome() else {
            // Not done (caller bug): leave it to its chunks.
            tracing::error!("a chunked I/O was finished early; keeping it");
            return;
        };
        let Some(io) = pp.take_io() else { return };
        match outcome {
            Ok(()) => io.complete(IoStatus::Success),
            Err(Failure::Chunk(base)) => {
                io.complete_like(&base);
                drop(base);
            }
            Err(Failure::Own(why)) => {
                self.shared.stats.aborted.fetch_add(1, Ordering::Relaxed);
                io.complete(match why {
                    Stop::Aborted => IoStatus::Aborted,
                    Stop::Failed => IoStatus::Failed,
                })
            }
        }
    }

    /// Issues chunk `i` of `pp` to the base, with `chunk_done` as completion and the
    /// parent as callback argument (so a base abort of the parent matches all its
    /// chunks). Returns 0, or the error code of the refusal.
    pub(crate) fn submit_chunk(&self, pp: &ParentRef, i: usize) -> i32 {
        let p = pp.state().borrow();
        let Some(c) = p.chunks.get(i) else {
            return -22;
        };
        let segs = c
            .start
            .segments(&p.lens, p.chunk_len(c.chunk))
            .map(|s| Seg {
                index: s.index,
                offset: s.offset,
                len: s.len,
            });
        match pp.send(c.chunk.offset_blocks, c.chunk.num_blocks, segs) {
            Ok(()) => 0,
            Err(PieceError::Refused(rc)) => rc,
            Err(e) => {
                tracing::error!(bdev = self.shared.name.as_str(), "chunk not sent: {e}");
                -22
            }
        }
    }
}

/// Completion of a chunk at the base.
fn chunk_done(inner: &Rc<IniChannel>, pp: ParentRef, base: BaseIo, success: bool) {
    let now = now();
    inner.shared.base_outcome(success);
    inner.shared.in_flight.fetch_sub(1, Ordering::Relaxed);
    let done = {
        let mut p = pp.state().borrow_mut();
        if success {
            let cdw0 = base.nvme_status().cdw0;
            drop(base);
            if cdw0 != 0 {
                inner.on_credit(cdw0, now);
            }
            p.track.chunk_ok();
        } else {
            drop(p.track.chunk_failed(base));
        }
        p.track.is_done()
    };
    if done {
        inner.finish(&pp);
    }
    inner.after_completion(now);
}
