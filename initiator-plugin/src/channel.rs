//! The initiator's channel: one QoS bdev on one application thread ([`IniChannel`]),
//! its state, and everything it does, by concern. An initiator maintainer's room: the
//! bdev layer calls into [`io`], everything else is `impl IniChannel` in these files.
//!
//! | file | owns |
//! |---|---|
//! | `channel.rs` (this) | [`IniChannel`] and its state (`ChState`), the types the parts share: what waits (`Item`: an application I/O or a chunk of a `Parent`, carried by `spdk_sys::vbdev::Split`), the engine's admission (`EngineAdmit`), the vendor commands in flight; the channel's construction |
//! | [`io`] | the entry points from `spdk_sys::vbdev` (submit, channel destroy, the poller), sending to the base and its out-of-memory retries, reset, the completion of application I/O (`base_done`) |
//! | [`held`] | the hold queue: admission by the host's token engine, release in order as tokens come, abort, reset, delete and shutdown of what waits |
//! | [`chunk`] | large transfers: a parent carved into chunks, released by the pacer group, its completion after the last chunk |
//! | [`vendor`] | the token protocol: the engine's state requests and acquisitions, the pacer's probes, completion credits, the orphan (a destroyed channel with vendor commands in flight) |
//!
//! Each part imports this module and nothing of the others but `io`'s completion
//! callback (`held` completes through it). Outside this module: the bdev itself
//! (`node`), the state shared by a bdev's channels and its pacer group (`state`), the
//! scatter-gather arithmetic (`split`), the RPCs (`rpc`, `params`).
//!
//! Borrowing discipline: the channel state sits in a `RefCell`, borrowed only for short
//! stretches that make no SPDK call that could complete an upper I/O (a completion can
//! re-enter `submit_request` on this channel). Items are moved out of the state before
//! they are submitted or completed. The engine and the pacer are behind mutexes
//! (`state.rs`), never both held, never held across an SPDK call.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::rc::{Rc, Weak};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use qos_core::hold::{Admit, HoldQueue};
use qos_core::initiator::InitiatorEngine;
use qos_core::pacer::{Chunk, ChunkPlan};
use qos_core::{IoKind, Nanos};
use spdk_sys::bdev_io::BaseIo;
use spdk_sys::poller::LocalPoller;
pub(crate) use spdk_sys::time::now;
use spdk_sys::vbdev::{BaseChannel, Io, Node, RequestId, Split};

use crate::split::{Cursor, Tracker};
use crate::state::{PacerGroup, Shared, Stats, StreamRef};

pub mod chunk;
pub mod held;
pub mod io;
pub mod vendor;

/// Set when the bdev layer starts to finish (application shutdown): nothing is held or
/// paced any more, so that shutdown never waits for tokens.
pub static SHUTDOWN: AtomicBool = AtomicBool::new(false);

/// What an initiator QoS bdev adds to its stacked-bdev node.
#[derive(Debug)]
pub struct IniPolicy {
    pub shared: Arc<Shared>,
    pub group: Arc<PacerGroup>,
    pub block_len: u32,
    /// The base takes ABORT.
    pub base_abort: bool,
}

pub(crate) type IniNode = Node<IniPolicy>;

/// An I/O of an initiator QoS bdev.
pub(crate) type IniIo = Io<IniPolicy>;

/// A large transfer being chunked: the upper I/O and what is at the base
/// (`spdk_sys::vbdev::Split`, shared by every chunk in flight), with our state of it.
pub(crate) type ParentRef = Rc<Split<IniPolicy, RefCell<Parent>>>;

/// Something waiting for tokens or for the base.
pub(crate) enum Item {
    /// An I/O of the application, sent as is.
    Io(IniIo),
    /// Chunk `index` of a parent.
    Chunk(ParentRef, usize),
}

pub(crate) struct ChunkBuf {
    pub(crate) chunk: Chunk,
    /// Where its data starts in the parent's buffers (its segments are listed when it is
    /// sent, into the split's own iovec array: no allocation per chunk).
    pub(crate) start: Cursor,
}

/// Our state of a large transfer being chunked.
pub(crate) struct Parent {
    pub(crate) kind: IoKind,
    pub(crate) block_len: u64,
    pub(crate) plan: ChunkPlan,
    pub(crate) next: Option<Chunk>,
    pub(crate) lens: Vec<usize>,
    pub(crate) cursor: Cursor,
    /// Every carved chunk.
    pub(crate) chunks: Vec<ChunkBuf>,
    pub(crate) track: Tracker<BaseIo>,
    /// Since when its next chunk has been waiting for the pacer (ns).
    pub(crate) waiting_since: u64,
}

/// Admission by the engine (or by nobody when the protocol is off), counting holds.
pub(crate) struct EngineAdmit<'a> {
    pub(crate) engine: Option<&'a mut InitiatorEngine>,
    pub(crate) stats: &'a Stats,
    pub(crate) room: Room<'a>,
}

/// The target's in-flight allowance as admission sees it (issue 40 item 2; `None`
/// when the protocol is off): the bdev's commands at the base (every channel) plus
/// those admitted in this pass and not sent yet. Checked before the engine, which
/// takes tokens when it admits.
#[derive(Default)]
pub(crate) struct Room<'a> {
    pub(crate) shared: Option<&'a Shared>,
    pub(crate) pending: u64,
}

impl Room<'_> {
    pub(crate) fn of(shared: &Shared) -> Room<'_> {
        Room {
            shared: Some(shared),
            pending: 0,
        }
    }

    /// The allowance is used up: what comes waits here, FIFO.
    fn full(&self) -> bool {
        self.shared.is_some_and(|s| {
            let a = s.allowance.load(Ordering::Relaxed);
            a != u64::MAX && s.in_flight.load(Ordering::Relaxed) + self.pending >= a
        })
    }

    /// Records why the oldest held item was last refused (`allowance`: the allowance,
    /// else tokens).
    fn refused(&self, allowance: bool) {
        if let Some(s) = self.shared {
            s.allowance_refusal.store(allowance, Ordering::Relaxed);
        }
    }

    /// An item held now waits for the allowance: it is used up, or the oldest held
    /// item was last refused by it (a command that comes while the queue is not empty
    /// waits behind it, even when a completion has just freed a place for the oldest).
    fn binds(&self) -> bool {
        self.full()
            || self
                .shared
                .is_some_and(|s| s.allowance_refusal.load(Ordering::Relaxed))
    }
}

impl Admit for EngineAdmit<'_> {
    fn admit(&mut self, kind: IoKind, bytes: u64, now: Nanos) -> bool {
        if self.room.full() {
            self.room.refused(true);
            return false;
        }
        let ok = match self.engine.as_deref_mut() {
            Some(e) => e.decide(kind, bytes, now),
            None => true,
        };
        self.room.pending += ok as u64;
        self.room.refused(false);
        ok
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
            // Held for the allowance: the target's share, held here.
            if self.room.binds() {
                self.stats
                    .allowance_held_total
                    .fetch_add(delta as u64, Ordering::Relaxed);
            }
        }
    }
}

#[derive(Default)]
pub(crate) struct ChState {
    pub(crate) held: HoldQueue<Item>,
    /// Parents with chunks not yet released by the pacer, in round-robin order.
    pub(crate) streams: VecDeque<ParentRef>,
    /// Every parent of this channel not yet finished (an ABORT finds its target here).
    pub(crate) parents: Vec<ParentRef>,
    /// Items the base refused for lack of bdev_ios; resent from the poller.
    pub(crate) retry: VecDeque<Item>,
    /// Earliest time a paced chunk may go, while the pacer group's `rates_epoch` is
    /// `pace_epoch` (a change of rates voids it).
    pub(crate) pace_wake: u64,
    pub(crate) pace_epoch: u64,
    /// This channel's pacer stream, open while `streams` is not empty.
    pub(crate) stream: StreamRef,
}

/// A vendor command in flight: the engine's (a state request or an acquisition) or the
/// pacer's probe. It keeps its channel (even once destroyed: an orphan) until it
/// completes; its buffer is kept by `spdk_sys`.
pub(crate) struct VendorReq {
    pub(crate) kind: VendorKind,
    pub(crate) sent: Nanos,
    pub(crate) chan: Rc<IniChannel>,
}

#[derive(Clone, Copy)]
pub(crate) enum VendorKind {
    Engine(u64),
    Probe(u64),
    /// A circulation report (issue 40 item 2): a GET_STATE whose reply only refreshes
    /// what the target announces.
    Report,
}

/// One QoS bdev on one thread, shared (`Rc`) by the skeleton's channel slot and by its
/// vendor commands and their aborts in flight.
pub struct IniChannel {
    /// This channel, for the vendor commands it sends.
    pub(crate) me: Weak<IniChannel>,
    pub(crate) node: Arc<IniNode>,
    pub(crate) shared: Arc<Shared>,
    pub(crate) group: Arc<PacerGroup>,
    /// This thread's channel of the base; keeps the base open while this channel (or
    /// its orphan) lives.
    pub(crate) base: BaseChannel,
    /// The base takes ABORT (stragglers of an orphan are aborted).
    pub(crate) base_abort: bool,
    pub(crate) block_len: u64,
    pub(crate) st: RefCell<ChState>,
    /// Vendor commands in flight on `base`, with when they were sent.
    pub(crate) vendor: RefCell<Vec<(RequestId, Nanos)>>,
    /// The channel was destroyed with vendor commands in flight: it lives on until the
    /// last of those (and of the aborts sent for them) completes.
    pub(crate) orphan: Cell<bool>,
    /// Aborts the orphan's vendor commands once they are overdue.
    pub(crate) orphan_poller: RefCell<Option<LocalPoller>>,
    /// Vendor commands an abort was sent for.
    pub(crate) aborted: RefCell<Vec<RequestId>>,
    pub(crate) seen_version: Cell<u64>,
    pub(crate) last_release: Cell<u64>,
    pub(crate) last_engine_poll: Cell<u64>,
    pub(crate) last_credit: Cell<u64>,
    /// When this channel last sent small I/O (ns, 0: never): the group's probes go on
    /// channels that did (`qos_core::pacer::may_send_probe`).
    pub(crate) last_small: Cell<u64>,
}

impl std::fmt::Debug for IniChannel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IniChannel").finish_non_exhaustive()
    }
}

impl IniChannel {
    /// Builds the channel on the current thread (io_device create callback).
    pub fn new(node: &Arc<IniNode>, base: BaseChannel) -> Rc<IniChannel> {
        Rc::new_cyclic(|me| IniChannel {
            me: me.clone(),
            node: node.clone(),
            shared: node.shared.clone(),
            group: node.group.clone(),
            base,
            base_abort: node.base_abort,
            block_len: node.block_len as u64,
            st: RefCell::new(ChState::default()),
            vendor: RefCell::new(Vec::new()),
            orphan: Cell::new(false),
            orphan_poller: RefCell::new(None),
            aborted: RefCell::new(Vec::new()),
            seen_version: Cell::new(0),
            last_release: Cell::new(0),
            last_engine_poll: Cell::new(0),
            last_credit: Cell::new(0),
            last_small: Cell::new(0),
        })
    }

    pub(crate) fn node(&self) -> &IniNode {
        &self.node
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
