//! The I/O path of an initiator QoS bdev, on the application's SPDK threads: the entry
//! points from `spdk_sys::vbdev` (submit, channel destroy, the poller), sending to the
//! base, and the completion of application I/O.
//!
//! Each (QoS bdev, thread) pair has an [`IniChannel`] (`channel.rs`): the base bdev's
//! channel, a FIFO of I/O waiting for tokens (`held.rs`: `qos_core::HoldQueue`,
//! admission by the bdev's shared `InitiatorEngine`), the large transfers being chunked
//! and paced on this thread (`chunk.rs`), a retry queue for the base's out-of-memory
//! refusals, and a poller that runs every reactor iteration (cheap when idle) to drive
//! the engine (`vendor.rs`: vendor commands and their time-outs), the pacer (AIMD ticks
//! and probes), and releases.
//!
//! An I/O takes one of two paths:
//! - **small** (at most `chunk_bytes`, or pacing off): never paced; a read or write
//!   marks the pacer group latency-sensitive. It is admitted by the engine or held.
//! - **large** (a read or write above `chunk_bytes`, while a small read or write was
//!   sent within the pacer's `latency_idle`, Justitia's trigger; otherwise it goes
//!   whole, admitted like small I/O, since chunks only cost it throughput): a *parent*
//!   split into chunks (`qos_core::pacer::plan_chunks`). Chunks leave when the pacer
//!   allows (byte and operation tokens at the allowed rate), the channel's parents in
//!   round-robin, then pass the engine like small I/O (each chunk costs the target one
//!   command). The parent completes once, after its last chunk, with the first error
//!   (`split::Tracker`).
//!
//! Pacer streams are per (QoS bdev, thread): a channel opens a stream when it gets a
//! large transfer and has none open, and closes it when no transfer has chunks left to
//! release. A stream is thus one host's flow of bulk data on one queue pair, as in
//! DIRS (a new flow starts at the DIRS initial rate), and the flow keeps its share of
//! the link however its transfers come and go. (One stream per transfer was tried
//! first: with a queue of 1 MiB transfers each stream is capped at its own halved rate
//! and the gaps between transfers are never refilled, so the writer fell to 65% of its
//! sharing floor in the reader/writer test.)
//!
//! Why the plugin splits itself rather than setting `max_rw_size` and letting the bdev
//! layer split: the bdev layer's children reach `submit_request` as ordinary I/O, and
//! only private fields tell a 32 KiB chunk of a 1 MiB write from a 32 KiB read of the
//! application, which must not be paced; with our own split, a reset, abort or error
//! stops the transfer's remaining chunks instead of sending them, and the chunks of one
//! transfer are released in order.

use std::ffi::c_int;
use std::rc::Rc;
use std::sync::atomic::Ordering;

use qos_core::wire::Request;
use qos_core::{IoKind, Nanos};
use spdk_sys::bdev_io::{BaseIo, IoStatus};
use spdk_sys::poller::PollStatus;
use spdk_sys::time::now_ns;
use spdk_sys::{spdk_bdev_io_type as T, vbdev};

use super::{IniChannel, IniIo, Item, VendorKind, now};
use crate::split::Stop;

const ENOMEM: c_int = -12;
/// Held I/O is retried at least this often (reservation tokens are released with time).
const RELEASE_RETRY_NS: u64 = 20_000;
/// The engine is polled at least this often while I/O flows (prefetch of global tokens).
const ENGINE_POLL_NS: u64 = 20_000;

/// io_device destroy callback. The bdev layer keeps a channel while it has I/O, so
/// nothing of the application is left; vendor commands may still be in flight, and
/// then the channel lives on as an orphan (`vendor.rs`).
pub fn destroy(ch: Rc<IniChannel>) {
    // Anything left (never expected) goes to the base rather than being lost.
    ch.release_everything();
    if ch.vendor.borrow().is_empty() {
        // Dropping it (the last handle) puts the base channel.
        return;
    }
    // The vendor commands in flight hold it on.
    ch.orphan();
}

impl IniChannel {
    /// The read's buffer is ready (`Io::get_read_buf`).
    pub(crate) fn read_buf_ready(&self, io: IniIo, success: bool) {
        if !success {
            // Larger than the bdev layer's largest buffer: it cannot be served without one.
            return io.complete(IoStatus::Failed);
        }
        self.rw(io, IoKind::Read, now());
    }

    /// Sends an admitted item to the base. Every item at the base counts in the bdev's
    /// `in_flight` (against the target's allowance) until its completion
    /// (`base_done`, `chunk_done`) or the base's refusal.
    pub(crate) fn send(&self, item: Item) {
        self.shared.in_flight.fetch_add(1, Ordering::Relaxed);
        let refused = match item {
            // A READ reaches here only with its buffer (`submit`, `get_read_buf`).
            Item::Io(io) => io.forward(base_done).map_err(|(io, rc)| (Item::Io(io), rc)),
            Item::Chunk(p, i) => match self.submit_chunk(&p, i) {
                0 => Ok(()),
                rc => Err((Item::Chunk(p, i), rc)),
            },
        };
        let Err((item, rc)) = refused else {
            return;
        };
        self.shared.in_flight.fetch_sub(1, Ordering::Relaxed);
        if rc == ENOMEM {
            self.st.borrow_mut().retry.push_back(item);
            return;
        }
        tracing::error!(
            bdev = self.shared.name.as_str(),
            "base bdev refused an I/O: error {rc}"
        );
        match item {
            Item::Io(io) => io.complete(IoStatus::Failed),
            Item::Chunk(pp, _) => {
                let done = {
                    let mut p = pp.state().borrow_mut();
                    p.track.chunk_dropped(Stop::Failed);
                    p.track.is_done()
                };
                if done {
                    self.finish(&pp);
                }
            }
        }
    }

    /// After any completion: held I/O, chunks and retries may go now.
    pub(crate) fn after_completion(&self, now: Nanos) {
        self.release_held(now);
        let (streams, retry) = {
            let st = self.st.borrow();
            (!st.streams.is_empty(), !st.retry.is_empty())
        };
        if streams {
            self.pump(now);
        }
        if retry {
            self.resend();
        }
    }

    pub(crate) fn resend(&self) {
        let items: Vec<Item> = self.st.borrow_mut().retry.drain(..).collect();
        for it in items {
            self.send(it);
        }
    }

    /// The per-channel poller (every reactor iteration).
    pub fn poll(&self) -> PollStatus {
        let t = now_ns();
        let now = Nanos(t);
        let mut busy = false;
        if self.bypass() {
            // Deleting or shutting down: nothing is held or paced.
            let pending = {
                let st = self.st.borrow();
                !st.held.is_empty() || !st.streams.is_empty() || !st.retry.is_empty()
            };
            if pending {
                self.release_everything();
                busy = true;
            }
            return if busy {
                PollStatus::Busy
            } else {
                PollStatus::Idle
            };
        }
        if self.shared.protocol_active()
            && (t >= self.shared.next_poll.load(Ordering::Relaxed)
                || t.saturating_sub(self.last_engine_poll.get()) >= ENGINE_POLL_NS)
        {
            self.last_engine_poll.set(t);
            busy |= self.poll_engine(now);
        }
        // A due probe waits for a channel that sent small I/O (it ticks at once).
        if self.pacing()
            && (t >= self.group.next_tick.load(Ordering::Relaxed)
                || (self.group.probe_due.load(Ordering::Relaxed)
                    && self.group.small_recently(self.last_small.get(), now)))
            && let Some(seq) = self.group.tick(now, self.last_small.get())
        {
            if self.shared.probe_ok.load(Ordering::Relaxed) {
                self.send_vendor(Request::GetState, VendorKind::Probe(seq), now);
            } else {
                self.group.probe_not_sent(seq);
            }
            busy = true;
        }
        let (held, streams, retry, wake) = {
            let st = self.st.borrow();
            let rates_changed = st.pace_epoch != self.group.rates_epoch.load(Ordering::Relaxed);
            (
                !st.held.is_empty(),
                !st.streams.is_empty(),
                !st.retry.is_empty(),
                if rates_changed { 0 } else { st.pace_wake },
            )
        };
        if self.shared.allowance_on.load(Ordering::Relaxed) && self.protocol() {
            busy |= self.report_circulation(now);
        }
        if held {
            let v = self.shared.version.load(Ordering::Relaxed);
            if v != self.seen_version.get()
                || t.saturating_sub(self.last_release.get()) >= RELEASE_RETRY_NS
            {
                self.seen_version.set(v);
                self.release_held(now);
                busy = true;
            }
        }
        if streams && t >= wake {
            self.pump(now);
            busy = true;
        }
        if retry {
            self.resend();
            busy = true;
        }
        if busy {
            PollStatus::Busy
        } else {
            PollStatus::Idle
        }
    }

    fn reset(&self, io: IniIo) {
        // Until the base's reset completes (`reset_done`), no ACQUIRE goes out.
        self.shared.resetting.fetch_add(1, Ordering::Relaxed);
        vbdev::reset(
            io,
            |c| c.abort_everything(),
            reset_done,
            |c| {
                c.shared.resetting.fetch_sub(1, Ordering::Relaxed);
            },
        );
    }
}

/// The bdev layer's entry point for our bdevs (through the skeleton).
pub(crate) fn submit(inner: &IniChannel, io: IniIo) {
    let now = now();
    match io.io_type() {
        T::SPDK_BDEV_IO_TYPE_READ => {
            if io.has_buffers() {
                inner.rw(io, IoKind::Read, now);
            } else {
                io.get_read_buf();
            }
        }
        T::SPDK_BDEV_IO_TYPE_WRITE => inner.rw(io, IoKind::Write, now),
        T::SPDK_BDEV_IO_TYPE_COMPARE => {
            let b = io.block_bytes();
            inner.admit(Item::Io(io), IoKind::Other, b, now)
        }
        T::SPDK_BDEV_IO_TYPE_UNMAP => inner.admit(Item::Io(io), IoKind::Unmap, 0, now),
        T::SPDK_BDEV_IO_TYPE_FLUSH => inner.admit(Item::Io(io), IoKind::Flush, 0, now),
        T::SPDK_BDEV_IO_TYPE_WRITE_ZEROES => inner.admit(Item::Io(io), IoKind::WriteZeroes, 0, now),
        T::SPDK_BDEV_IO_TYPE_NVME_IO => {
            let n = io.nvme_passthru().map_or(0, |p| p.nbytes as u64);
            inner.admit(Item::Io(io), IoKind::Other, n, now)
        }
        T::SPDK_BDEV_IO_TYPE_RESET => inner.reset(io),
        T::SPDK_BDEV_IO_TYPE_ABORT => inner.abort(io),
        _ => io.complete(IoStatus::Failed),
    }
}

/// Completion of an application I/O at the base.
pub(crate) fn base_done(inner: &Rc<IniChannel>, io: IniIo, base: BaseIo, success: bool) {
    let now = now();
    inner.shared.base_outcome(success);
    let t = io.io_type();
    if t != T::SPDK_BDEV_IO_TYPE_RESET && t != T::SPDK_BDEV_IO_TYPE_ABORT {
        // An item of `send` (resets and aborts complete here too, never counted).
        inner.shared.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
    if success && (t == T::SPDK_BDEV_IO_TYPE_READ || t == T::SPDK_BDEV_IO_TYPE_WRITE) {
        let cdw0 = base.nvme_status().cdw0;
        if cdw0 != 0 {
            inner.on_credit(cdw0, now);
        }
    }
    io.complete_like(&base);
    drop(base);
    inner.after_completion(now);
}

/// Completion of the base's reset (forwarded from ours).
fn reset_done(inner: &Rc<IniChannel>, io: IniIo, base: BaseIo, success: bool) {
    inner.shared.resetting.fetch_sub(1, Ordering::Relaxed);
    base_done(inner, io, base, success);
}
