//! Large transfers (reads and writes above `chunk_bytes` while pacing is on): a
//! *parent* split into chunks (`qos_core::pacer::plan_chunks`), each carved out of the
//! parent's scatter-gather list, released by the pacer group (byte and operation tokens
//! at the allowed rate, the channel's parents in round-robin), admitted like small I/O,
//! and sent to the base; the parent completes once, after its last chunk, with the
//! first error (`split::Tracker`).

use std::ffi::{c_int, c_void};
use std::ptr::NonNull;
use std::sync::atomic::Ordering;

use qos_core::pacer::{Chunk, plan_chunks};
use qos_core::{IoKind, Nanos};
use spdk_sys::bdev_io::{BaseIo, BdevIo, IoStatus, ext_io_opts};
use spdk_sys::{self as ffi, vbdev};

use crate::chan::{ChunkBuf, IniChannel, IniPolicy, Item, Parent, ctx, now};
use crate::split::{Cursor, Failure, Stop, Tracker};

impl Parent {
    /// Builds the scatter-gather list of `c`; returns its index.
    pub(crate) fn carve(&mut self, c: Chunk) -> Option<usize> {
        let len = (c.num_blocks * self.block_len) as usize;
        let segs = self.cursor.take(&self.lens, len).ok()?;
        let iovs = segs
            .iter()
            .map(|s| ffi::iovec {
                // Address arithmetic only (as the bdev layer's own split does); the
                // memory belongs to the application's I/O, alive until it completes.
                iov_base: self.bases[s.index]
                    .cast::<u8>()
                    .wrapping_add(s.offset)
                    .cast(),
                iov_len: s.len,
            })
            .collect();
        self.chunks.push(ChunkBuf { chunk: c, iovs });
        Some(self.chunks.len() - 1)
    }
}

impl IniChannel {
    /// A read or write (buffers present): small path or chunked.
    pub(crate) fn rw(&self, io: BdevIo, kind: IoKind) {
        let now = now();
        self.shared.stats.ios.fetch_add(1, Ordering::Relaxed);
        // SAFETY: READ/WRITE carry `u.bdev`.
        let bytes = unsafe { io.block_bytes() };
        let pacing = self.pacing() && !self.bypass();
        if pacing && bytes > self.group.chunk_bytes.load(Ordering::Relaxed) {
            return self.start_large(io, kind, now);
        }
        if pacing {
            self.group.note_small(now);
        }
        self.admit(Item::Io(io), kind, bytes, now);
    }

    pub(crate) fn start_large(&self, io: BdevIo, kind: IoKind, now: Nanos) {
        let chunk_bytes = self.group.chunk_bytes.load(Ordering::Relaxed);
        // SAFETY: READ/WRITE carry `u.bdev`; its iovs are the application's buffers,
        // `iovcnt` entries, alive until the I/O completes.
        let (offset, blocks, lens, bases, md_buf) = unsafe {
            let b = io.block();
            let iovs = std::slice::from_raw_parts(b.iovs, b.iovcnt.max(0) as usize);
            (
                b.offset_blocks,
                b.num_blocks,
                iovs.iter().map(|v| v.iov_len).collect::<Vec<_>>(),
                iovs.iter().map(|v| v.iov_base).collect::<Vec<_>>(),
                b.md_buf,
            )
        };
        let mut plan = plan_chunks(offset, blocks, self.block_len, chunk_bytes);
        let total = plan.chunk_count();
        let next = plan.next();
        let ch = {
            // SAFETY: our driver context, initialised at submit.
            unsafe { (*ctx(&io)).ch }
        };
        let p = Box::new(Parent {
            ch,
            kind,
            block_len: self.block_len,
            offset_blocks: offset,
            plan,
            next,
            lens,
            bases,
            cursor: Cursor::default(),
            chunks: Vec::with_capacity(total as usize),
            track: Tracker::new(total),
            md_buf,
            md_len: self.md_len,
            io: None,
            waiting_since: now.0,
        });
        let p = NonNull::from(Box::leak(p));
        // SAFETY: our driver context; `p` is the fresh parent, freed by `finish`.
        unsafe {
            (*ctx(&io)).parent = p.as_ptr();
            (*p.as_ptr()).io = Some(io);
        }
        self.shared.stats.large_ios.fetch_add(1, Ordering::Relaxed);
        self.st.borrow_mut().streams.push_back(p);
        self.pump(now);
    }

    /// Releases the chunks the pacer allows now, streams in round-robin order, and
    /// admits them.
    pub(crate) fn pump(&self, now: Nanos) {
        let bypass = self.bypass() || !self.pacing();
        let mut admit: Vec<(Item, IoKind, u64)> = Vec::new();
        let mut finish: Vec<NonNull<Parent>> = Vec::new();
        {
            let mut st = self.st.borrow_mut();
            let mut earliest = u64::MAX;
            loop {
                let mut progressed = false;
                for _ in 0..st.streams.len() {
                    let Some(pp) = st.streams.pop_front() else {
                        break;
                    };
                    // SAFETY: parents in the deque are alive (freed only by `finish`,
                    // which unlinks them first) and used on this thread only.
                    let p = unsafe { &mut *pp.as_ptr() };
                    let Some(c) = p.next.filter(|_| p.track.may_release()) else {
                        // Stopped (or done): it leaves the deque; its last completion
                        // (or this) finishes it.
                        if p.track.is_done() {
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
                    if p.next.is_some() {
                        st.streams.push_back(pp);
                    }
                    progressed = true;
                    self.shared.stats.chunks.fetch_add(1, Ordering::Relaxed);
                    admit.push((Item::Chunk(pp, index), p.kind, bytes));
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
            self.finish(p);
        }
    }

    /// Completes a parent whose chunks are all done: exactly once.
    pub(crate) fn finish(&self, pp: NonNull<Parent>) {
        {
            let mut st = self.st.borrow_mut();
            st.streams.retain(|x| *x != pp);
            if st.streams.is_empty() && st.stream.is_some() {
                self.group.close(&mut st.stream, now());
            }
        }
        // SAFETY: leaked in `start_large`, reclaimed once: `outcome` below is `Some`
        // only once, and nothing references a done parent (no chunk outstanding, no
        // held item, unlinked above).
        let mut p = unsafe { Box::from_raw(pp.as_ptr()) };
        let Some(outcome) = p.track.outcome() else {
            // Not done (caller bug): keep it alive rather than free it under use.
            tracing::error!("a chunked I/O was finished early; keeping it");
            let _ = Box::into_raw(p);
            return;
        };
        let Some(io) = p.io.take() else { return };
        // SAFETY: our driver context; the parent is gone.
        unsafe { (*ctx(&io)).parent = std::ptr::null_mut() };
        drop(p);
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

    /// Issues chunk `i` of `pp` to the base, with `chunk_done` as callback and the
    /// parent as its argument (so a base abort of the parent matches all its chunks).
    ///
    /// # Safety
    /// `pp` is alive and chunk `i` was carved.
    pub(crate) unsafe fn submit_chunk(&self, pp: NonNull<Parent>, i: usize) -> c_int {
        // SAFETY: per the contract.
        let p = unsafe { &mut *pp.as_ptr() };
        let Some(io) = p.io.as_ref() else {
            return -22;
        };
        let cb =
            Some(chunk_done as unsafe extern "C" fn(*mut ffi::spdk_bdev_io, bool, *mut c_void));
        let arg = pp.as_ptr().cast::<c_void>();
        let md = if p.md_buf.is_null() || p.md_len == 0 {
            p.md_buf
        } else {
            let skip = (p.chunks[i].chunk.offset_blocks - p.offset_blocks) * p.md_len;
            p.md_buf.cast::<u8>().wrapping_add(skip as usize).cast()
        };
        let write = p.kind == IoKind::Write;
        let c = &mut p.chunks[i];
        // SAFETY: the upper I/O's block parameters (READ/WRITE); the chunk's iovecs live
        // in the parent until it completes, which is after this chunk completes; the
        // parent reaches `chunk_done` through `arg` when the call returns 0.
        unsafe {
            let b = io.block();
            let mut opts = ext_io_opts(b, md);
            let f = if write {
                ffi::spdk_bdev_writev_blocks_ext
            } else {
                ffi::spdk_bdev_readv_blocks_ext
            };
            f(
                self.base.desc_ptr(),
                self.base.as_ptr(),
                c.iovs.as_mut_ptr(),
                c.iovs.len() as c_int,
                c.chunk.offset_blocks,
                c.chunk.num_blocks,
                cb,
                arg,
                &mut opts,
            )
        }
    }
}

/// Completion of a chunk at the base.
unsafe extern "C" fn chunk_done(base: *mut ffi::spdk_bdev_io, success: bool, arg: *mut c_void) {
    // SAFETY: `arg` is the parent handed over in `submit_chunk`, alive while this chunk
    // is outstanding; its `ch` is our channel, alive while the parent's I/O is.
    let (base, pp, inner) = unsafe {
        let pp = NonNull::new_unchecked(arg.cast::<Parent>());
        let inner = vbdev::channel::<IniPolicy>((*pp.as_ptr()).ch);
        (BaseIo::from_raw(base), pp, inner)
    };
    let now = now();
    // SAFETY: as above; used on this thread only.
    let p = unsafe { &mut *pp.as_ptr() };
    inner.shared.base_outcome(success);
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
    if p.track.is_done() {
        inner.finish(pp);
    }
    inner.after_completion(now);
}
