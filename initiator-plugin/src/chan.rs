//! The state of one initiator QoS bdev on one thread ([`IniChannel`]) and the types its
//! parts share: the per-I/O context, what waits in the channel ([`Item`]: an
//! application I/O or a chunk of a [`Parent`]), the engine admission, and the vendor
//! commands in flight. The behaviour is spread by concern over `io` (entry points,
//! sending to the base, the poller), `held` (the hold queue), `chunk` (carving and
//! parent completion) and `vendor` (token-protocol commands and orphans); each of
//! those imports this module and nothing of the others but `io`'s completion callback.
//!
//! Borrowing discipline: the channel state sits in a `RefCell`, borrowed only for short
//! stretches that make no SPDK call that could complete an upper I/O (a completion can
//! re-enter `submit_request` on this channel). Items are moved out of the state before
//! they are submitted or completed. The engine and the pacer are behind mutexes
//! (`state.rs`), never both held, never held across an SPDK call.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::ffi::c_void;
use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use qos_core::hold::{Admit, HoldQueue};
use qos_core::initiator::InitiatorEngine;
use qos_core::pacer::{Chunk, ChunkPlan};
use qos_core::{IoKind, Nanos};
use spdk_sys::bdev_io::{BaseIo, BdevIo};
use spdk_sys::dma::DmaBuf;
use spdk_sys::poller::Poller;
use spdk_sys::time::now_ns;
use spdk_sys::vbdev::{BaseChannel, Node};
use spdk_sys::{self as ffi};

use crate::split::{Cursor, Tracker};
use crate::state::{PacerGroup, Shared, Stats, StreamRef};

/// Set when the bdev layer starts to finish (application shutdown): nothing is held or
/// paced any more, so that shutdown never waits for tokens.
pub static SHUTDOWN: AtomicBool = AtomicBool::new(false);

/// What an initiator QoS bdev adds to its stacked-bdev node.
#[derive(Debug)]
pub struct IniPolicy {
    pub shared: Arc<Shared>,
    pub group: Arc<PacerGroup>,
    pub block_len: u32,
    /// Separate metadata per block (bytes), 0 when none or interleaved.
    pub md_len: u32,
    /// The base takes ABORT.
    pub base_abort: bool,
}

pub(crate) type IniNode = Node<IniPolicy>;

pub(crate) fn now() -> Nanos {
    Nanos(now_ns())
}

/// Per-I/O context in the bdev_io's `driver_ctx`.
#[repr(C)]
pub(crate) struct IoCtx {
    /// Our channel this I/O was submitted on.
    pub(crate) ch: *mut ffi::spdk_io_channel,
    /// The parent state while the I/O is being chunked, else null.
    pub(crate) parent: *mut Parent,
}

const _: () = assert!(std::mem::offset_of!(ffi::spdk_bdev_io, driver_ctx) % 8 == 0);

/// Bytes of `driver_ctx` the module asks for.
pub fn ctx_size() -> usize {
    std::mem::size_of::<IoCtx>()
}

pub(crate) fn ctx_of(io: *mut ffi::spdk_bdev_io) -> *mut IoCtx {
    // `driver_ctx` is 8-byte aligned (asserted above) and `ctx_size()` bytes long; the
    // pointer is only computed here, dereferenced by callers that own the I/O.
    // SAFETY: `io` is a live bdev_io of one of our bdevs (callers' contract); taking
    // the address of its trailing field does not read it.
    unsafe { std::ptr::addr_of_mut!((*io).driver_ctx).cast::<IoCtx>() }
}

pub(crate) fn ctx(io: &BdevIo) -> *mut IoCtx {
    ctx_of(io.as_ptr())
}

/// Something waiting for tokens or for the base.
pub(crate) enum Item {
    /// An I/O of the application, sent as is.
    Io(BdevIo),
    /// Chunk `index` of a parent.
    Chunk(NonNull<Parent>, usize),
}

pub(crate) struct ChunkBuf {
    pub(crate) chunk: Chunk,
    pub(crate) iovs: Vec<ffi::iovec>,
}

/// A large transfer being chunked.
pub(crate) struct Parent {
    pub(crate) io: Option<BdevIo>,
    /// Our channel (the parent's), for completions.
    pub(crate) ch: *mut ffi::spdk_io_channel,
    pub(crate) kind: IoKind,
    pub(crate) block_len: u64,
    pub(crate) offset_blocks: u64,
    pub(crate) plan: ChunkPlan,
    pub(crate) next: Option<Chunk>,
    pub(crate) lens: Vec<usize>,
    pub(crate) bases: Vec<*mut c_void>,
    pub(crate) cursor: Cursor,
    /// Every chunk's scatter-gather list, alive until the parent completes (the base
    /// keeps the pointer while the chunk is outstanding).
    pub(crate) chunks: Vec<ChunkBuf>,
    pub(crate) track: Tracker<BaseIo>,
    pub(crate) md_buf: *mut c_void,
    pub(crate) md_len: u64,
    /// Since when its next chunk has been waiting for the pacer (ns).
    pub(crate) waiting_since: u64,
}

/// Admission by the engine (or by nobody when the protocol is off), counting holds.
pub(crate) struct EngineAdmit<'a> {
    pub(crate) engine: Option<&'a mut InitiatorEngine>,
    pub(crate) stats: &'a Stats,
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
pub(crate) struct ChState {
    pub(crate) held: HoldQueue<Item>,
    /// Parents with chunks not yet released by the pacer, in round-robin order.
    pub(crate) streams: VecDeque<NonNull<Parent>>,
    /// Items the base refused for lack of bdev_ios; resent from the poller.
    pub(crate) retry: VecDeque<Item>,
    /// Earliest time a paced chunk may go.
    pub(crate) pace_wake: u64,
    /// This channel's pacer stream, open while `streams` is not empty.
    pub(crate) stream: StreamRef,
}

/// A vendor command in flight: the engine's (a state request or an acquisition) or the
/// pacer's probe. Its buffer lives here until the command completes.
pub(crate) struct VendorReq {
    pub(crate) kind: VendorKind,
    pub(crate) sent: Nanos,
    pub(crate) buf: DmaBuf,
    pub(crate) inner: *const IniChannel,
    pub(crate) shared: Arc<Shared>,
    pub(crate) group: Arc<PacerGroup>,
}

#[derive(Clone, Copy)]
pub(crate) enum VendorKind {
    Engine(u64),
    Probe(u64),
}

/// One QoS bdev on one thread.
pub struct IniChannel {
    /// The node; valid until the channel is destroyed (never used by an orphan).
    pub(crate) node: *const IniNode,
    pub(crate) shared: Arc<Shared>,
    pub(crate) group: Arc<PacerGroup>,
    /// This thread's channel of the base; keeps the base open while this channel (or
    /// its orphan) lives.
    pub(crate) base: BaseChannel,
    /// The base takes ABORT (stragglers of an orphan are aborted).
    pub(crate) base_abort: bool,
    pub(crate) block_len: u64,
    pub(crate) md_len: u64,
    pub(crate) st: RefCell<ChState>,
    /// Vendor commands in flight on `base`.
    pub(crate) vendor: RefCell<Vec<*mut VendorReq>>,
    /// The channel was destroyed with vendor commands in flight: the last completion
    /// (of those and of the aborts sent for them) frees this (and puts `base`).
    pub(crate) orphan: Cell<bool>,
    /// Aborts the orphan's vendor commands once they are overdue.
    pub(crate) orphan_poller: RefCell<Option<Poller>>,
    /// Vendor commands an abort was sent for, and aborts in flight.
    pub(crate) aborted: RefCell<Vec<*mut VendorReq>>,
    pub(crate) aborts: Cell<u32>,
    pub(crate) seen_version: Cell<u64>,
    pub(crate) last_release: Cell<u64>,
    pub(crate) last_engine_poll: Cell<u64>,
    pub(crate) last_credit: Cell<u64>,
}

impl std::fmt::Debug for IniChannel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IniChannel").finish_non_exhaustive()
    }
}

impl IniChannel {
    /// Builds the channel on the current thread (io_device create callback).
    pub fn new(node: &IniNode, base: BaseChannel) -> IniChannel {
        IniChannel {
            node,
            shared: node.shared.clone(),
            group: node.group.clone(),
            base,
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
        }
    }

    pub(crate) fn node(&self) -> &IniNode {
        // SAFETY: the node outlives its io_device's channels; orphans never call this.
        unsafe { &*self.node }
    }

    pub(crate) fn bypass(&self) -> bool {
        self.node().is_deleting() || SHUTDOWN.load(Ordering::Relaxed)
    }

    pub(crate) fn protocol(&self) -> bool {
        self.shared.protocol_active() && !self.bypass()
    }

    pub(crate) fn pacing(&self) -> bool {
        self.shared.pacing.load(Ordering::Relaxed)
    }
}
