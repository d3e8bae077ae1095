//! The I/O path of an initiator QoS bdev, on the application's SPDK threads.
//!
//! Each (QoS bdev, thread) pair has an [`IniChannel`]: the base bdev's channel, a FIFO
//! of I/O waiting for tokens (`qos_core::HoldQueue`, admission by the bdev's shared
//! `InitiatorEngine`), the large transfers being chunked and paced on this thread, a
//! retry queue for the base's out-of-memory refusals, and a poller that runs every
//! reactor iteration (cheap when idle) to drive the engine (vendor commands and their
//! time-outs), the pacer (AIMD ticks and probes), and releases.
//!
//! An I/O takes one of two paths:
//! - **small** (at most `chunk_bytes`, or pacing off): never paced; a read or write
//!   marks the pacer group latency-sensitive. It is admitted by the engine or held.
//! - **large** (a read or write above `chunk_bytes`): a *parent* split into chunks
//!   (`qos_core::pacer::plan_chunks`). Chunks leave when the pacer allows (byte and
//!   operation tokens at the allowed rate), the channel's parents in round-robin, then
//!   pass the engine like small I/O (each chunk costs the target one command). The
//!   parent completes once, after its last chunk, with the first error
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
//! only private fields tell a 64 KiB chunk of a 1 MiB write from a 64 KiB read of the
//! application, which must not be paced; with our own split, a reset, abort or error
//! stops the transfer's remaining chunks instead of sending them, and the chunks of one
//! transfer are released in order.
//!
//! Borrowing discipline: the channel state sits in a `RefCell`, borrowed only for short
//! stretches that make no SPDK call that could complete an upper I/O (a completion can
//! re-enter `submit_request` on this channel). Items are moved out of the state before
//! they are submitted or completed. The engine and the pacer are behind mutexes
//! (`state.rs`), never both held, never held across an SPDK call.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::ffi::{c_int, c_void};
use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use qos_core::hold::{Admit, HoldQueue};
use qos_core::initiator::{InitiatorEngine, Mode, RequestFailure};
use qos_core::pacer::{Chunk, ChunkPlan, plan_chunks};
use qos_core::wire::{self, Request, StateReply};
use qos_core::{IoKind, Nanos};
use spdk_sys::bdev_io::{BaseIo, BdevIo, IoStatus, ext_io_opts, nvme_cmd_from_dwords};
use spdk_sys::dma::DmaBuf;
use spdk_sys::io_device;
use spdk_sys::poller::{PollStatus, Poller};
use spdk_sys::time::now_ns;
use spdk_sys::{self as ffi, spdk_bdev_io_type as T};

use crate::node::{BaseHandle, IniNode};
use crate::split::{Cursor, Failure, Stop, Tracker};
use crate::state::{PacerGroup, Shared, Stats, StreamRef, lock};

const ENOMEM: c_int = -12;
/// Held I/O is retried at least this often (reservation tokens are released with time).
const RELEASE_RETRY_NS: u64 = 20_000;
/// The engine is polled at least this often while I/O flows (prefetch of global tokens).
const ENGINE_POLL_NS: u64 = 20_000;
/// Completion credits are applied at most this often per thread.
const CREDIT_SAMPLE_NS: u64 = 10_000;
/// Credit marker of completion dword 0 (bits 31:28), see `docs/wire-protocol.md`.
const CREDIT_MARKER: u32 = 0xA;

fn now() -> Nanos {
    Nanos(now_ns())
}

/// Per-I/O context in the bdev_io's `driver_ctx`.
#[repr(C)]
struct IoCtx {
    /// Our channel this I/O was submitted on.
    ch: *mut ffi::spdk_io_channel,
    /// The parent state while the I/O is being chunked, else null.
    parent: *mut Parent,
}

const _: () = assert!(std::mem::offset_of!(ffi::spdk_bdev_io, driver_ctx) % 8 == 0);

/// Bytes of `driver_ctx` the module asks for.
pub fn ctx_size() -> usize {
    std::mem::size_of::<IoCtx>()
}

fn ctx_of(io: *mut ffi::spdk_bdev_io) -> *mut IoCtx {
    // `driver_ctx` is 8-byte aligned (asserted above) and `ctx_size()` bytes long; the
    // pointer is only computed here, dereferenced by callers that own the I/O.
    // SAFETY: `io` is a live bdev_io of one of our bdevs (callers' contract); taking
    // the address of its trailing field does not read it.
    unsafe { std::ptr::addr_of_mut!((*io).driver_ctx).cast::<IoCtx>() }
}

fn ctx(io: &BdevIo) -> *mut IoCtx {
    ctx_of(io.as_ptr())
}

/// Something waiting for tokens or for the base.
enum Item {
    /// An I/O of the application, sent as is.
    Io(BdevIo),
    /// Chunk `index` of a parent.
    Chunk(NonNull<Parent>, usize),
}

struct ChunkBuf {
    chunk: Chunk,
    iovs: Vec<ffi::iovec>,
}

/// A large transfer being chunked.
struct Parent {
    io: Option<BdevIo>,
    /// Our channel (the parent's), for completions.
    ch: *mut ffi::spdk_io_channel,
    kind: IoKind,
    block_len: u64,
    offset_blocks: u64,
    plan: ChunkPlan,
    next: Option<Chunk>,
    lens: Vec<usize>,
    bases: Vec<*mut c_void>,
    cursor: Cursor,
    /// Every chunk's scatter-gather list, alive until the parent completes (the base
    /// keeps the pointer while the chunk is outstanding).
    chunks: Vec<ChunkBuf>,
    track: Tracker<BaseIo>,
    md_buf: *mut c_void,
    md_len: u64,
    /// Since when its next chunk has been waiting for the pacer (ns).
    waiting_since: u64,
}

impl Parent {
    /// Builds the scatter-gather list of `c`; returns its index.
    fn carve(&mut self, c: Chunk) -> Option<usize> {
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

/// Admission by the engine (or by nobody when the protocol is off), counting holds.
struct EngineAdmit<'a> {
    engine: Option<&'a mut InitiatorEngine>,
    stats: &'a Stats,
}

impl Admit for EngineAdmit<'_> {
    fn admit(&mut self, kind: IoKind, bytes: u64, now: Nanos) -> bool {
        match self.engine.as_deref_mut() {
            Some(e) => e.decide(kind, bytes, now),
            None => true,
        }
    }
    fn left_after(&mut self, waited: Nanos) {
        if waited.0 > 0 {
            self.stats.held_ns.fetch_add(waited.0, Ordering::Relaxed);
        }
    }
    fn held_changed(&mut self, delta: i64) {
        self.stats.held.fetch_add(delta, Ordering::Relaxed);
        if delta > 0 {
            self.stats
                .held_total
                .fetch_add(delta as u64, Ordering::Relaxed);
        }
    }
}

#[derive(Default)]
struct ChState {
    held: HoldQueue<Item>,
    /// Parents with chunks not yet released by the pacer, in round-robin order.
    streams: VecDeque<NonNull<Parent>>,
    /// Items the base refused for lack of bdev_ios; resent from the poller.
    retry: VecDeque<Item>,
    /// Earliest time a paced chunk may go.
    pace_wake: u64,
    /// This channel's pacer stream, open while `streams` is not empty.
    stream: StreamRef,
}

/// What the poller closure holds: the channel's heap address.
struct InnerPtr(*const Inner);
// SAFETY: the poller runs only on the thread that registered it, which is the
// channel's thread; the pointer is never dereferenced elsewhere.
unsafe impl Send for InnerPtr {}
impl InnerPtr {
    fn get(&self) -> *const Inner {
        self.0
    }
}

/// A vendor command in flight: the engine's (a state request or an acquisition) or the
/// pacer's probe. Its buffer lives here until the command completes.
struct VendorReq {
    kind: VendorKind,
    sent: Nanos,
    buf: DmaBuf,
    inner: *const Inner,
    shared: Arc<Shared>,
    group: Arc<PacerGroup>,
}

#[derive(Clone, Copy)]
enum VendorKind {
    Engine(u64),
    Probe(u64),
}

struct Inner {
    /// The node; valid until the channel is destroyed (never used by an orphan).
    node: *const IniNode,
    shared: Arc<Shared>,
    group: Arc<PacerGroup>,
    base_desc: *mut ffi::spdk_bdev_desc,
    base_ch: *mut ffi::spdk_io_channel,
    /// Keeps the base descriptor open while this channel (or its orphan) lives.
    _base: Arc<BaseHandle>,
    /// The base takes ABORT (stragglers of an orphan are aborted).
    base_abort: bool,
    block_len: u64,
    md_len: u64,
    st: RefCell<ChState>,
    /// Vendor commands in flight on `base_ch`.
    vendor: RefCell<Vec<*mut VendorReq>>,
    /// The channel was destroyed with vendor commands in flight: the last completion
    /// (of those and of the aborts sent for them) puts `base_ch` and frees this.
    orphan: Cell<bool>,
    /// Aborts the orphan's vendor commands once they are overdue.
    orphan_poller: RefCell<Option<Poller>>,
    /// Vendor commands an abort was sent for, and aborts in flight.
    aborted: RefCell<Vec<*mut VendorReq>>,
    aborts: Cell<u32>,
    seen_version: Cell<u64>,
    last_release: Cell<u64>,
    last_engine_poll: Cell<u64>,
    last_credit: Cell<u64>,
}

/// One QoS bdev on one thread.
pub struct IniChannel {
    /// Declared first: dropped (unregistered) before `inner`.
    poller: Option<Poller>,
    inner: Option<Box<Inner>>,
}

impl std::fmt::Debug for IniChannel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IniChannel").finish_non_exhaustive()
    }
}

impl IniChannel {
    /// Builds the channel on the current thread (io_device create callback).
    pub fn new(node: &IniNode) -> Option<IniChannel> {
        // SAFETY: the base descriptor is open while the node lives; we are on an SPDK
        // thread; the channel is put in `destroy` (or by the last vendor completion).
        let base_ch = unsafe { ffi::spdk_bdev_get_io_channel(node.base_desc.0) };
        if base_ch.is_null() {
            tracing::error!(bdev = node.name(), "cannot get a channel of the base bdev");
            return None;
        }
        let inner = Box::new(Inner {
            node,
            shared: node.shared.clone(),
            group: node.group.clone(),
            base_desc: node.base_desc.0,
            base_ch,
            _base: node.base.clone(),
            base_abort: node.base_abort,
            block_len: node.block_len as u64,
            md_len: node.md_len as u64,
            st: RefCell::new(ChState::default()),
            vendor: RefCell::new(Vec::new()),
            orphan: Cell::new(false),
            orphan_poller: RefCell::new(None),
            aborted: RefCell::new(Vec::new()),
            aborts: Cell::new(0),
            seen_version: Cell::new(0),
            last_release: Cell::new(0),
            last_engine_poll: Cell::new(0),
            last_credit: Cell::new(0),
        });
        let p = InnerPtr(&*inner);
        let poller = Poller::new(c"qos_ini_channel", 0, move || {
            // SAFETY: the poller is dropped (unregistered) before `inner` is freed or
            // orphaned, and runs on this channel's thread only.
            unsafe { (*p.get()).poll() }
        });
        match poller {
            Ok(poller) => Some(IniChannel {
                poller: Some(poller),
                inner: Some(inner),
            }),
            Err(e) => {
                tracing::error!(bdev = node.name(), "channel poller: {e}");
                // SAFETY: got above on this thread, put once.
                unsafe { ffi::spdk_put_io_channel(base_ch) };
                None
            }
        }
    }

    fn inner(&self) -> &Inner {
        self.inner.as_deref().expect("a live channel has its state")
    }

    /// io_device destroy callback. The bdev layer keeps a channel while it has I/O, so
    /// nothing of the application is left; vendor commands may still be in flight.
    pub fn destroy(mut self, _node: &IniNode) {
        self.poller.take();
        let Some(inner) = self.inner.take() else {
            return;
        };
        // Anything left (never expected) goes to the base rather than being lost.
        inner.release_everything();
        if inner.vendor.borrow().is_empty() {
            // SAFETY: got in `new` on this thread, put once.
            unsafe { ffi::spdk_put_io_channel(inner.base_ch) };
            return;
        }
        // Vendor commands in flight keep the base channel (their completions run on
        // it). A responsive target answers them within a round trip; commands overdue
        // by the request time-out are aborted, so a silent target cannot keep the base
        // channel (and with it shutdown) waiting. The last completion frees the rest.
        inner.orphan.set(true);
        let raw = Box::into_raw(inner);
        let p = InnerPtr(raw);
        let poller = Poller::new(c"qos_ini_orphan", 1000, move || {
            // SAFETY: the orphan is freed only after this poller is dropped (in
            // `free_orphan`, on this thread).
            unsafe { (*p.get()).abort_overdue() };
            PollStatus::Idle
        });
        // SAFETY: `raw` is the orphan, alive until `free_orphan`.
        unsafe {
            match poller {
                Ok(pl) => *(*raw).orphan_poller.borrow_mut() = Some(pl),
                Err(e) => tracing::error!("orphan poller: {e}"),
            }
        }
    }

    /// Sends everything held or waiting for the pacer to the base (delete).
    pub fn release_all(&self) {
        self.inner().release_everything();
    }
}

impl Inner {
    fn node(&self) -> &IniNode {
        // SAFETY: the node outlives its io_device's channels; orphans never call this.
        unsafe { &*self.node }
    }

    fn bypass(&self) -> bool {
        self.node().is_deleting()
    }

    fn protocol(&self) -> bool {
        self.shared.protocol_active() && !self.bypass()
    }

    fn pacing(&self) -> bool {
        self.shared.pacing.load(Ordering::Relaxed)
    }

    /// Orphan: aborts vendor commands older than the request time-out (once each).
    fn abort_overdue(&self) {
        if !self.base_abort {
            return;
        }
        let timeout = Nanos::from_micros(lock(&self.shared.eng).opts.request_timeout_us);
        let now = now();
        let overdue: Vec<*mut VendorReq> = {
            let aborted = self.aborted.borrow();
            self.vendor
                .borrow()
                .iter()
                .copied()
                // SAFETY: requests in the list are alive (removed before they are freed).
                .filter(|r| now.saturating_sub(unsafe { (**r).sent }) >= timeout)
                .filter(|r| !aborted.contains(r))
                .collect()
        };
        for r in overdue {
            // SAFETY: valid descriptor (kept open by `base`) and channel on this thread;
            // the abort matches the vendor command by its callback argument; its
            // completion `abort_done` gets this orphan.
            let rc = unsafe {
                ffi::spdk_bdev_abort(
                    self.base_desc,
                    self.base_ch,
                    r.cast(),
                    Some(abort_done),
                    (self as *const Inner).cast_mut().cast(),
                )
            };
            self.aborted.borrow_mut().push(r);
            if rc == 0 {
                self.aborts.set(self.aborts.get() + 1);
            }
        }
    }

    /// Frees an orphan once nothing of it is in flight.
    ///
    /// # Safety
    /// `this` is an orphan leaked by `IniChannel::destroy`, on its thread, not borrowed.
    unsafe fn free_orphan_if_idle(this: *const Inner) {
        // SAFETY: per the contract.
        let inner = unsafe { &*this };
        if !inner.orphan.get() || !inner.vendor.borrow().is_empty() || inner.aborts.get() > 0 {
            return;
        }
        inner.orphan_poller.borrow_mut().take();
        // SAFETY: nothing is in flight on the base channel any more; it was got on this
        // thread and is put once; the orphan was leaked once and is reclaimed once.
        unsafe {
            ffi::spdk_put_io_channel(inner.base_ch);
            drop(Box::from_raw(this.cast_mut()));
        }
    }

    // ---- admission -----------------------------------------------------------------

    /// Admits `item` through the engine, or holds it.
    fn admit(&self, item: Item, kind: IoKind, bytes: u64, now: Nanos) {
        if !self.protocol() {
            return self.send(item);
        }
        let out = {
            let mut st = self.st.borrow_mut();
            let mut e = lock(&self.shared.eng);
            let mut a = EngineAdmit {
                engine: Some(&mut e.engine),
                stats: &self.shared.stats,
            };
            let out = st.held.admit_or_hold(&mut a, kind, bytes, now, item);
            if out.is_none() {
                // Something waits: let the engine ask for tokens now.
                self.shared.next_poll.store(0, Ordering::Relaxed);
            }
            out
        };
        if let Some(item) = out {
            self.send(item);
        }
    }

    /// Releases held items while the engine allows, in order.
    fn release_held(&self, now: Nanos) {
        let ready = {
            let mut st = self.st.borrow_mut();
            if st.held.is_empty() {
                return;
            }
            let protocol = self.protocol();
            let mut e = lock(&self.shared.eng);
            let mut a = EngineAdmit {
                engine: protocol.then_some(&mut e.engine),
                stats: &self.shared.stats,
            };
            let mut v = Vec::new();
            st.held.release(&mut a, now, |it, _| v.push(it));
            v
        };
        self.last_release.set(now.0);
        for it in ready {
            self.send(it);
        }
    }

    // ---- submission ----------------------------------------------------------------

    /// A read or write (buffers present): small path or chunked.
    fn rw(&self, io: BdevIo, kind: IoKind) {
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

    fn start_large(&self, io: BdevIo, kind: IoKind, now: Nanos) {
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
    fn pump(&self, now: Nanos) {
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
    fn finish(&self, pp: NonNull<Parent>) {
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

    /// Sends an admitted item to the base.
    fn send(&self, item: Item) {
        let rc = match &item {
            Item::Io(io) => self.submit_io(io),
            // SAFETY: the parent is alive while it has an outstanding chunk (this one).
            Item::Chunk(p, i) => unsafe { self.submit_chunk(*p, *i) },
        };
        if rc == 0 {
            if let Item::Io(io) = item {
                // `base_done` owns it now.
                let _ = io.into_raw();
            }
            return;
        }
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
                // SAFETY: alive while this chunk is outstanding.
                let p = unsafe { &mut *pp.as_ptr() };
                p.track.chunk_dropped(Stop::Failed);
                if p.track.is_done() {
                    self.finish(pp);
                }
            }
        }
    }

    /// Issues the base I/O for an application I/O, with `base_done` as callback and the
    /// I/O as its argument.
    fn submit_io(&self, io: &BdevIo) -> c_int {
        // SAFETY: the descriptor and channel are valid on this thread; a READ reaches
        // here only with its buffer (`submit_request`, `read_buf_ready`); `io` goes to
        // `base_done` through `arg` only when the call returns 0 (see `send`).
        unsafe {
            io.forward(
                self.base_desc,
                self.base_ch,
                Some(base_done),
                io.as_ptr().cast(),
            )
        }
    }

    /// Issues chunk `i` of `pp` to the base, with `chunk_done` as callback and the
    /// parent as its argument (so a base abort of the parent matches all its chunks).
    ///
    /// # Safety
    /// `pp` is alive and chunk `i` was carved.
    unsafe fn submit_chunk(&self, pp: NonNull<Parent>, i: usize) -> c_int {
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
                self.base_desc,
                self.base_ch,
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

    // ---- completions -----------------------------------------------------------------

    /// Completion dword 0 of a successful read or write (or vendor command): the
    /// target's credit, if it sends one.
    fn on_credit(&self, cdw0: u32, now: Nanos) {
        if cdw0 >> 28 != CREDIT_MARKER || !self.shared.protocol_active() {
            return;
        }
        // A credit corrects drift; one every few microseconds per thread is plenty, and
        // at hundreds of thousands of completions per second the engine's lock is not.
        if now.0.saturating_sub(self.last_credit.get()) < CREDIT_SAMPLE_NS {
            return;
        }
        self.last_credit.set(now.0);
        let mut e = lock(&self.shared.eng);
        if e.engine.mode() == Mode::PassThrough {
            // The target speaks the protocol after all (it gave up after time-outs,
            // e.g. during a reconnect): probe again, at most once per refresh interval.
            let every = Nanos::from_micros(e.opts.refresh_interval_us);
            if now.saturating_sub(e.started) >= every {
                e.engine = InitiatorEngine::new(e.opts.engine_config(), now);
                e.outstanding = None;
                e.started = now;
                self.shared.next_poll.store(0, Ordering::Relaxed);
                self.shared
                    .stats
                    .engine_restarts
                    .fetch_add(1, Ordering::Relaxed);
            }
            return;
        }
        e.engine.on_completion(cdw0, now);
    }

    /// After any completion: held I/O, chunks and retries may go now.
    fn after_completion(&self, now: Nanos) {
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

    fn resend(&self) {
        let items: Vec<Item> = self.st.borrow_mut().retry.drain(..).collect();
        for it in items {
            self.send(it);
        }
    }

    // ---- the poller ----------------------------------------------------------------

    fn poll(&self) -> PollStatus {
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
        if self.pacing()
            && t >= self.group.next_tick.load(Ordering::Relaxed)
            && let Some(seq) = self.group.tick(now)
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
            (
                !st.held.is_empty(),
                !st.streams.is_empty(),
                !st.retry.is_empty(),
                st.pace_wake,
            )
        };
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

    /// Lets the engine send its next vendor command; returns whether it sent one.
    fn poll_engine(&self, now: Nanos) -> bool {
        let (send, warning) = {
            let mut e = lock(&self.shared.eng);
            let p = e.engine.poll(now);
            self.shared
                .next_poll
                .store(p.next_deadline.0, Ordering::Relaxed);
            let send = p.send.map(|r| {
                e.seq += 1;
                e.outstanding = Some(e.seq);
                (r, e.seq)
            });
            (send, e.engine.take_warning())
        };
        if let Some(w) = warning {
            tracing::warn!(bdev = self.shared.name.as_str(), "{w}");
        }
        match send {
            Some((req, seq)) => {
                self.send_vendor(req, VendorKind::Engine(seq), now);
                true
            }
            None => false,
        }
    }

    /// Sends a token-protocol command on this thread's base channel.
    fn send_vendor(&self, req: Request, kind: VendorKind, now: Nanos) {
        let req = match req {
            Request::Acquire { .. } if !self.shared.acquire_safe() => {
                // The engine takes the state reply as an empty grant and retries later.
                self.shared
                    .stats
                    .acquire_deferred
                    .fetch_add(1, Ordering::Relaxed);
                Request::GetState
            }
            r => r,
        };
        let (opc, c) = wire::encode_request(req);
        let mut dw = [0u32; 16];
        dw[0] = opc as u32;
        dw[10..16].copy_from_slice(&[c.cdw10, c.cdw11, c.cdw12, c.cdw13, c.cdw14, c.cdw15]);
        let cmd = nvme_cmd_from_dwords(dw);
        let stats = &self.shared.stats;
        let Some(buf) = DmaBuf::zeroed(wire::REPLY_LEN, 64) else {
            stats.vendor_submit_failed.fetch_add(1, Ordering::Relaxed);
            if let VendorKind::Probe(seq) = kind {
                self.group.probe_not_sent(seq);
            }
            return;
        };
        let r = Box::into_raw(Box::new(VendorReq {
            kind,
            sent: now,
            buf,
            inner: self,
            shared: self.shared.clone(),
            group: self.group.clone(),
        }));
        // SAFETY: valid descriptor and channel on this thread; `cmd` is copied by the
        // driver; the buffer (REPLY_LEN DMA-able bytes) lives in `*r` until
        // `vendor_done` reclaims `r`, which happens only when the call returns 0; it is
        // not read before that.
        let rc = unsafe {
            ffi::spdk_bdev_nvme_io_passthru(
                self.base_desc,
                self.base_ch,
                &cmd,
                (*r).buf.as_mut_ptr().cast(),
                wire::REPLY_LEN,
                Some(vendor_done),
                r.cast(),
            )
        };
        if rc != 0 {
            // SAFETY: not submitted, so still ours.
            drop(unsafe { Box::from_raw(r) });
            stats.vendor_submit_failed.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(
                bdev = self.shared.name.as_str(),
                "vendor command not submitted: error {rc}"
            );
            // An engine command is then left to time out; a probe is forgotten.
            if let VendorKind::Probe(seq) = kind {
                self.group.probe_not_sent(seq);
            }
            return;
        }
        match kind {
            VendorKind::Engine(_) => stats.vendor_sent.fetch_add(1, Ordering::Relaxed),
            VendorKind::Probe(_) => stats.probes_sent.fetch_add(1, Ordering::Relaxed),
        };
        self.vendor.borrow_mut().push(r);
    }

    // ---- reset, abort, delete ------------------------------------------------------

    /// Completes everything held here as aborted and stops every transfer (reset).
    fn abort_everything(&self) {
        let (held, retry, streams) = {
            let mut st = self.st.borrow_mut();
            let ChState {
                held,
                retry,
                streams,
                stream,
                ..
            } = &mut *st;
            let mut a = EngineAdmit {
                engine: None,
                stats: &self.shared.stats,
            };
            let h: Vec<Item> = held.drain(&mut a).collect();
            let r: Vec<Item> = retry.drain(..).collect();
            let s: Vec<NonNull<Parent>> = streams.drain(..).collect();
            self.group.close(stream, now());
            (h, r, s)
        };
        for it in held.into_iter().chain(retry) {
            self.drop_item(it, Stop::Aborted);
        }
        for pp in streams {
            // SAFETY: parents in the deque are alive.
            let p = unsafe { &mut *pp.as_ptr() };
            p.track.stop(Stop::Aborted);
            if p.track.is_done() {
                self.finish(pp);
            }
        }
    }

    /// Completes an item that will not be sent.
    fn drop_item(&self, it: Item, why: Stop) {
        match it {
            Item::Io(io) => {
                self.shared.stats.aborted.fetch_add(1, Ordering::Relaxed);
                io.complete(match why {
                    Stop::Aborted => IoStatus::Aborted,
                    Stop::Failed => IoStatus::Failed,
                })
            }
            Item::Chunk(pp, _) => {
                // SAFETY: alive while this chunk is outstanding.
                let p = unsafe { &mut *pp.as_ptr() };
                p.track.chunk_dropped(why);
                if p.track.is_done() {
                    self.finish(pp);
                }
            }
        }
    }

    /// Sends everything held, waiting for the pacer, or retried, to the base (delete,
    /// shutdown: `bypass()` is true, so nothing is held again).
    fn release_everything(&self) {
        let items: Vec<Item> = {
            let mut st = self.st.borrow_mut();
            let ChState { held, retry, .. } = &mut *st;
            let mut a = EngineAdmit {
                engine: None,
                stats: &self.shared.stats,
            };
            let mut v: Vec<Item> = held.drain(&mut a).collect();
            v.extend(retry.drain(..));
            v
        };
        for it in items {
            self.send(it);
        }
        if !self.st.borrow().streams.is_empty() {
            self.pump(now());
        }
    }

    fn reset(&self, io: BdevIo, ch: *mut ffi::spdk_io_channel) {
        let node = self.node;
        // Until the base's reset completes (`reset_done`), no ACQUIRE goes out.
        self.shared.resetting.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the node is a registered io_device, alive while its bdev has I/O (this
        // reset); `ch` stays alive while the reset is outstanding.
        unsafe {
            io_device::for_each_channel(
                node,
                |_, c: &IniChannel| c.inner().abort_everything(),
                move |_| {
                    let inner = io_device::channel::<IniNode>(ch).inner();
                    let raw = io.into_raw();
                    let rc = ffi::spdk_bdev_reset(
                        inner.base_desc,
                        inner.base_ch,
                        Some(reset_done),
                        raw.cast(),
                    );
                    if rc != 0 {
                        inner.shared.resetting.fetch_sub(1, Ordering::Relaxed);
                        let io = BdevIo::from_raw(raw);
                        io.complete(if rc == -95 {
                            IoStatus::Success
                        } else {
                            IoStatus::Failed
                        });
                    }
                },
            )
        };
    }

    fn abort(&self, io: BdevIo) {
        // SAFETY: an ABORT's parameters are `u.abort`.
        let target = unsafe { io.abort_target() };
        // 1. Held (or waiting to be retried) here: complete it aborted.
        let victim = {
            let mut st = self.st.borrow_mut();
            let ChState { held, retry, .. } = &mut *st;
            let mut a = EngineAdmit {
                engine: None,
                stats: &self.shared.stats,
            };
            let is = |it: &Item| matches!(it, Item::Io(x) if x.as_ptr() == target);
            held.remove_first(&mut a, is).or_else(|| {
                let i = retry.iter().position(is)?;
                retry.remove(i)
            })
        };
        if let Some(v) = victim {
            self.drop_item(v, Stop::Aborted);
            return io.complete(IoStatus::Success);
        }
        // 2. A transfer being chunked: stop it, drop its waiting chunks, and abort its
        // chunks at the base (they carry the parent as callback argument).
        // SAFETY: `target` is an outstanding I/O of our bdev on this channel (the bdev
        // layer submits an abort on the channel of the I/O it aborts), so its driver
        // context is ours and initialised.
        let parent = unsafe { (*ctx_of(target)).parent };
        if let Some(pp) = NonNull::new(parent) {
            let dropped: Vec<Item> = {
                let mut st = self.st.borrow_mut();
                let ChState { held, retry, .. } = &mut *st;
                let mut a = EngineAdmit {
                    engine: None,
                    stats: &self.shared.stats,
                };
                let mine = |it: &Item| matches!(it, Item::Chunk(p, _) if *p == pp);
                let mut v = Vec::new();
                while let Some(it) = held.remove_first(&mut a, mine) {
                    v.push(it);
                }
                while let Some(i) = retry.iter().position(mine) {
                    if let Some(it) = retry.remove(i) {
                        v.push(it);
                    }
                }
                v
            };
            // SAFETY: the parent is alive (its upper I/O is outstanding).
            let at_base = unsafe {
                let t = &mut (*pp.as_ptr()).track;
                t.stop(Stop::Aborted);
                t.outstanding() - dropped.len() as u64
            };
            if dropped.is_empty() && at_base == 0 {
                self.finish(pp);
            }
            // The last dropped chunk finishes the parent when nothing is at the base;
            // after that neither the parent nor the target may be touched.
            for it in dropped {
                self.drop_item(it, Stop::Aborted);
            }
            if at_base == 0 {
                return io.complete(IoStatus::Success);
            }
            let raw = io.into_raw();
            // SAFETY: valid descriptor/channel on this thread; `raw` goes to `base_done`
            // when the call returns 0.
            let rc = unsafe {
                ffi::spdk_bdev_abort(
                    self.base_desc,
                    self.base_ch,
                    pp.as_ptr().cast(),
                    Some(base_done),
                    raw.cast(),
                )
            };
            if rc != 0 {
                // SAFETY: not submitted, so still ours. The chunks finish on their own.
                unsafe { BdevIo::from_raw(raw) }.complete(IoStatus::Success);
            }
            return;
        }
        // 3. At the base: the base matches it by the callback argument we gave it (the
        // upper bdev_io).
        let raw = io.into_raw();
        // SAFETY: as above.
        let rc = unsafe {
            ffi::spdk_bdev_abort(
                self.base_desc,
                self.base_ch,
                target.cast(),
                Some(base_done),
                raw.cast(),
            )
        };
        if rc != 0 {
            // SAFETY: not submitted, so still ours.
            unsafe { BdevIo::from_raw(raw) }.complete(IoStatus::Failed);
        }
    }
}

/// Ext-I/O options forwarding the upper I/O's memory domain, metadata and DIF
/// settings, as passthru does.
/// The bdev layer's entry point for our bdevs.
///
/// # Safety
/// Called by SPDK with one of our channels and a bdev_io of one of our bdevs.
pub unsafe extern "C" fn submit_request(
    ch: *mut ffi::spdk_io_channel,
    raw: *mut ffi::spdk_bdev_io,
) {
    // SAFETY: per the contract: a fresh I/O we own, and a live channel of our device on
    // this thread.
    let (io, qch) = unsafe { (BdevIo::from_raw(raw), io_device::channel::<IniNode>(ch)) };
    let inner = qch.inner();
    // SAFETY: our driver context (ctx_size bytes), written in full before any read.
    unsafe {
        let c = ctx(&io);
        std::ptr::addr_of_mut!((*c).ch).write(ch);
        std::ptr::addr_of_mut!((*c).parent).write(std::ptr::null_mut());
    }
    let now = now();
    match io.io_type() {
        T::SPDK_BDEV_IO_TYPE_READ => {
            // SAFETY: READ carries `u.bdev`.
            let (no_buf, len) = unsafe {
                let b = io.block();
                (
                    b.iovcnt < 1 || b.iovs.is_null() || (*b.iovs).iov_base.is_null(),
                    io.block_bytes(),
                )
            };
            if no_buf {
                // SAFETY: ownership moves to `read_buf_ready`, called once (now or later).
                unsafe { ffi::spdk_bdev_io_get_buf(io.into_raw(), Some(read_buf_ready), len) };
            } else {
                inner.rw(io, IoKind::Read);
            }
        }
        T::SPDK_BDEV_IO_TYPE_WRITE => inner.rw(io, IoKind::Write),
        T::SPDK_BDEV_IO_TYPE_COMPARE => {
            // SAFETY: COMPARE carries `u.bdev`.
            let b = unsafe { io.block_bytes() };
            inner.admit(Item::Io(io), IoKind::Other, b, now)
        }
        T::SPDK_BDEV_IO_TYPE_UNMAP => inner.admit(Item::Io(io), IoKind::Unmap, 0, now),
        T::SPDK_BDEV_IO_TYPE_FLUSH => inner.admit(Item::Io(io), IoKind::Flush, 0, now),
        T::SPDK_BDEV_IO_TYPE_WRITE_ZEROES => inner.admit(Item::Io(io), IoKind::WriteZeroes, 0, now),
        T::SPDK_BDEV_IO_TYPE_NVME_IO => {
            // SAFETY: NVME_IO carries `u.nvme_passthru`.
            let n = unsafe { io.nvme_passthru().nbytes } as u64;
            inner.admit(Item::Io(io), IoKind::Other, n, now)
        }
        T::SPDK_BDEV_IO_TYPE_RESET => inner.reset(io, ch),
        T::SPDK_BDEV_IO_TYPE_ABORT => inner.abort(io),
        _ => io.complete(IoStatus::Failed),
    }
}

/// The read's buffer is ready.
unsafe extern "C" fn read_buf_ready(
    ch: *mut ffi::spdk_io_channel,
    raw: *mut ffi::spdk_bdev_io,
    success: bool,
) {
    // SAFETY: `raw` was handed over by `submit_request` with `into_raw`; `ch` is our
    // channel the read was submitted on.
    let (io, inner) = unsafe {
        (
            BdevIo::from_raw(raw),
            io_device::channel::<IniNode>(ch).inner(),
        )
    };
    if !success {
        // Larger than the bdev layer's largest buffer: it cannot be served without one.
        return io.complete(IoStatus::Failed);
    }
    inner.rw(io, IoKind::Read);
}

/// Completion of an application I/O at the base.
unsafe extern "C" fn base_done(base: *mut ffi::spdk_bdev_io, success: bool, arg: *mut c_void) {
    // SAFETY: `base` is the completed child (freed by `BaseIo`), `arg` the upper I/O
    // handed over at submit; its context names our channel, alive while it is outstanding.
    let (base, io, inner) = unsafe {
        let io = BdevIo::from_raw(arg.cast());
        let inner = io_device::channel::<IniNode>((*ctx(&io)).ch).inner();
        (BaseIo::from_raw(base), io, inner)
    };
    let now = now();
    inner.shared.base_outcome(success);
    if success {
        let t = io.io_type();
        if t == T::SPDK_BDEV_IO_TYPE_READ || t == T::SPDK_BDEV_IO_TYPE_WRITE {
            let cdw0 = base.nvme_status().cdw0;
            if cdw0 != 0 {
                inner.on_credit(cdw0, now);
            }
        }
    }
    io.complete_like(&base);
    drop(base);
    inner.after_completion(now);
}

/// Completion of the base's reset (forwarded from ours).
unsafe extern "C" fn reset_done(base: *mut ffi::spdk_bdev_io, success: bool, arg: *mut c_void) {
    // SAFETY: as for `base_done`: `arg` is our RESET, whose context names our channel.
    unsafe {
        let io = BdevIo::from_raw(arg.cast());
        let inner = io_device::channel::<IniNode>((*ctx(&io)).ch).inner();
        inner.shared.resetting.fetch_sub(1, Ordering::Relaxed);
        base_done(base, success, io.into_raw().cast());
    }
}

/// Completion of a chunk at the base.
unsafe extern "C" fn chunk_done(base: *mut ffi::spdk_bdev_io, success: bool, arg: *mut c_void) {
    // SAFETY: `arg` is the parent handed over in `submit_chunk`, alive while this chunk
    // is outstanding; its `ch` is our channel, alive while the parent's I/O is.
    let (base, pp, inner) = unsafe {
        let pp = NonNull::new_unchecked(arg.cast::<Parent>());
        let inner = io_device::channel::<IniNode>((*pp.as_ptr()).ch).inner();
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

/// Completion of a vendor command (the engine's, or a probe).
unsafe extern "C" fn vendor_done(base: *mut ffi::spdk_bdev_io, success: bool, arg: *mut c_void) {
    // SAFETY: `arg` is the request leaked in `send_vendor`, reclaimed once here; `base`
    // the completed child.
    let (r, base) = unsafe {
        (
            Box::from_raw(arg.cast::<VendorReq>()),
            BaseIo::from_raw(base),
        )
    };
    let status = base.nvme_status();
    drop(base);
    let now = now();
    // SAFETY: the channel state outlives its vendor commands (an orphan is freed by the
    // last one, below); same thread.
    let inner = unsafe { &*r.inner };
    inner
        .vendor
        .borrow_mut()
        .retain(|x| !std::ptr::eq(*x, arg.cast::<VendorReq>()));
    let shared = &r.shared;
    // A refused opcode is an answer: the path works.
    shared.base_outcome(success || (status.sct == 0 && status.sc == wire::status::INVALID_OPCODE));
    match r.kind {
        VendorKind::Engine(seq) => {
            if !success {
                shared.stats.vendor_errors.fetch_add(1, Ordering::Relaxed);
            }
            let mut e = lock(&shared.eng);
            if e.outstanding == Some(seq) {
                e.outstanding = None;
                let reply = if success {
                    StateReply::decode(r.buf.as_slice())
                        .map(mirror_for_engine)
                        .map_err(RequestFailure::BadReply)
                } else {
                    // The engine tells "invalid opcode" (a target without the plugin)
                    // from path or transport errors, which it treats like a time-out.
                    Err(RequestFailure::Status {
                        sct: status.sct,
                        sc: status.sc,
                    })
                };
                e.engine.on_reply(reply, now);
                shared.next_poll.store(0, Ordering::Relaxed);
                shared.version.fetch_add(1, Ordering::Relaxed);
            } else {
                shared.stats.vendor_late.fetch_add(1, Ordering::Relaxed);
            }
        }
        VendorKind::Probe(seq) => {
            // Any completion measured a round trip through the target's queues.
            r.group.probe_done(seq, now.saturating_sub(r.sent), now);
            if !success
                && status.sct == 0
                && status.sc == wire::status::INVALID_OPCODE
                && shared.probe_ok.swap(false, Ordering::Relaxed)
            {
                tracing::warn!(
                    bdev = shared.name.as_str(),
                    "the target refuses the nvmf-qos probe (invalid opcode): this bdev sends no more probes; the pacer gets no latency signal from it"
                );
            }
        }
    }
    if inner.orphan.get() {
        inner
            .aborted
            .borrow_mut()
            .retain(|x| !std::ptr::eq(*x, arg.cast::<VendorReq>()));
        // SAFETY: an orphan on its thread, not borrowed here.
        unsafe { Inner::free_orphan_if_idle(r.inner) };
        return;
    }
    inner.release_held(now);
}

/// Reservation tokens the engine may have released ahead of consumption, at least.
const MIN_RELEASED_OPS: u64 = 4;

/// Adjusts the target's state for `InitiatorEngine` (see `docs/initiator-plugin.md`,
/// "Mirroring paced reservations").
///
/// With `PACED`, the engine allows `R * burst / T` reservation tokens at a time (it
/// decays its tokens to Haechi's `X = R (T - t) / T` on every decision and subtracts
/// the part of `R` not released yet), rounded down twice: below one token it allows
/// none, and a host whose reservation is under one operation per burst (432 per 500 ms
/// with the target's 1 ms burst) never uses its reservation at all (integration test:
/// 271 of 432 operations per period, from global tokens only). The burst the engine
/// sees is therefore widened to release at least `MIN_RELEASED_OPS` operations. The
/// target keeps its own burst; what comes early waits there.
fn mirror_for_engine(mut r: StateReply) -> StateReply {
    if r.flags & wire::flags::PACED != 0 && r.reservation_per_period_ops > 0 {
        let min = (r.period_ns as u128 * MIN_RELEASED_OPS as u128)
            .div_ceil(r.reservation_per_period_ops as u128)
            .min(r.period_ns as u128) as u64;
        r.release_burst_ns = r.release_burst_ns.max(min);
    }
    r
}

/// Completion of an abort of an orphan's vendor command.
unsafe extern "C" fn abort_done(base: *mut ffi::spdk_bdev_io, _success: bool, arg: *mut c_void) {
    // SAFETY: the completed abort's bdev_io, freed once here; `arg` is the orphan that
    // sent it, alive while its aborts are in flight.
    unsafe {
        drop(BaseIo::from_raw(base));
        let inner = &*arg.cast::<Inner>().cast_const();
        inner.aborts.set(inner.aborts.get().saturating_sub(1));
        Inner::free_orphan_if_idle(inner);
    }
}
