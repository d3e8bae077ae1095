//! The I/O path of a QoS bdev, on the nvmf poll-group threads: the policy a QoS bdev
//! adds to `spdk_sys::vbdev` ([`QosTgt`], its per-bdev state) and its channels.
//!
//! Each (QoS bdev, thread) pair has a [`QosChannel`]: the host's channel at the target
//! (`qos_core::TargetChannel`: token caches on this thread, a FIFO of held I/O, and
//! when held I/O is tried again, the same cadence the lab runs) and the base bdev's
//! channel; the skeleton's per-channel poller calls [`Core::poll`] every
//! `qos_core::channel::POLL_INTERVAL`, which releases held I/O as tokens come (period
//! roll-over, conversion) and publishes counters. Released I/O is resubmitted on its
//! own thread, by that poller or by the completion of another I/O. Under sharing
//! `operating_point` a completion also hands a freed slot of the domain's window to
//! the waiting channel of its thread with the smallest tag (`Core::hand_off`).
//!
//! What each I/O costs (the domain's cost model, `qos_core::CostModel`; defaults):
//!
//! | bdev I/O | charged as | cost | notes |
//! |---|---|---|---|
//! | READ | read | 1 op + its bytes | credit in completion dword 0 when it changed or commands are held, or the host's in-flight allowance when that changed (cooperative hosts) |
//! | WRITE | write | 1 op + its bytes (x write weight) | credit in completion dword 0 when it changed or commands are held, or the host's in-flight allowance when that changed (cooperative hosts) |
//! | COMPARE | other (read direction) | 1 op + its bytes | |
//! | FLUSH, UNMAP, WRITE_ZEROES | write direction | 1 op, 0 bytes (x write weight) | no data crosses the fabric |
//! | NVMe passthru forwarded to the base | other | 1 op + its data bytes | |
//! | vendor token commands (0xC2, 0xC6) | free | — | answered here |
//! | RESET, ABORT | free | — | |
//!
//! Borrowing discipline: the channel state sits in a `RefCell` and is borrowed only for
//! short stretches that call no SPDK function which could complete an upper I/O (a
//! completion can re-enter `submit_request` on this channel). Held or released I/O is
//! moved out of the state before it is submitted or completed.

use std::cell::{Cell, RefCell};
use std::ffi::c_int;
use std::rc::{Rc, Weak};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use qos_core::allowance::{self, AllowanceGate};
use qos_core::channel::POLL_INTERVAL;
use qos_core::window::{self, Handing, WindowWaiters};
use qos_core::wire::{self, CreditGate, RequestError, VendorCmd};
use qos_core::{ChannelTokens, DomainShared, HostShared, IoKind, Nanos, TargetChannel};
use spdk_sys::bdev_io::{BaseIo, IoStatus, nvme_cmd_dwords};
use spdk_sys::poller::PollStatus;
use spdk_sys::spdk_bdev_io_type as T;
use spdk_sys::thread::Thread;
use spdk_sys::time::now;
use spdk_sys::vbdev::{self, BaseChannel, Io, Node};

/// Set when `nvmf_tgt` shuts down (our event subsystem's fini, which runs before the
/// nvmf target's): channels stop holding I/O and release what they hold, so that qpair
/// teardown never waits for tokens.
pub static SHUTDOWN: AtomicBool = AtomicBool::new(false);

/// What a QoS bdev adds to its stacked-bdev node: its host's ledger in its domain.
#[derive(Debug)]
pub struct QosTgt {
    pub domain: String,
    pub host: String,
    pub domain_shared: Arc<DomainShared>,
    pub host_shared: Arc<HostShared>,
    /// The base accepts NVMe I/O passthru (unknown opcodes are forwarded to it).
    pub base_nvme_io: bool,
    /// The host has sent a valid token-protocol command: from then on successful reads
    /// and writes carry its credit in completion dword 0. Until then dword 0 stays 0,
    /// which keeps SPDK's NVMe/TCP "C2H success" optimisation (no response capsule after
    /// the data of a successful read) for hosts that do not use the credit.
    pub cooperative: AtomicBool,
}

type QosNode = Node<QosTgt>;

/// Period of the per-channel poller that releases held I/O and publishes counters.
pub const CHANNEL_POLL_US: u64 = POLL_INTERVAL.0 / 1000;

const ENOMEM: c_int = -12;
const SCT_GENERIC: u8 = 0;

/// One command in this many sent to the base reads the clock when it goes and when it
/// completes, for the time it spent there (the depth curve, `qos_core::depth`), and
/// counts for this many: a clock read on every completion cost the target 0.8 % of its
/// IOPS side by side (target-bench), and the depth curve's 10 ms samples hold thousands
/// of completions.
const SERVICE_SAMPLE: u32 = 8;

/// Channels of one OS thread a completion's hand-off of a window slot looks at (each
/// pick scans them: a bound on the work of one completion).
const HAND_OFF_MAX: usize = 64;

/// Per-I/O context (in the bdev_io, through `spdk_sys::vbdev::Io::ctx`).
#[derive(Debug)]
pub struct IoCtx {
    bytes: Cell<u64>,
    kind: Cell<IoKind>,
    /// Admitted with tokens: its completion is recorded in the ledger.
    accounted: Cell<bool>,
    /// When it went to the base (ns; 0: not one of the [`SERVICE_SAMPLE`]), for the time
    /// it spent there (the depth curve).
    sent_at: Cell<u64>,
}

impl Default for IoCtx {
    fn default() -> Self {
        IoCtx {
            bytes: Cell::new(0),
            kind: Cell::new(IoKind::Other),
            accounted: Cell::new(false),
            sent_at: Cell::new(0),
        }
    }
}

/// An I/O of a QoS bdev.
pub type QosIo = Io<QosTgt>;

/// One QoS bdev on one thread (the skeleton's channel): its state is shared with this
/// OS thread's list of channels ([`CHANNELS`]), so that a completion on one channel can
/// hand a freed slot of the operating point's window to another.
#[derive(Debug)]
pub struct QosChannel {
    core: Rc<Core>,
}

/// The state of one QoS bdev on one thread.
#[derive(Debug)]
pub struct Core {
    node: Arc<QosNode>,
    base: BaseChannel,
    st: RefCell<TargetChannel<QosIo>>,
    /// Commands sent to the base, counted for [`SERVICE_SAMPLE`].
    sends: Cell<u32>,
    /// An empty list kept for the next release ([`Core::send_all`]).
    released: RefCell<Vec<QosIo>>,
    /// Which completions of a cooperative host's reads and writes on this channel
    /// carry its credit (a credit costs NVMe/TCP a response PDU per read).
    credit_gate: Cell<CreditGate>,
    /// Which of them carry its in-flight allowance instead (issue 40 item 2: the first
    /// after each change, and a refresh), and the folded tag of its NQN they carry.
    allowance_gate: Cell<AllowanceGate>,
    host_tag: u8,
    /// The SPDK thread it belongs to: a hand-off only goes to channels of the
    /// completing channel's thread.
    thread: Option<Thread>,
}

thread_local! {
    /// The QoS channels created on this OS thread (a reactor), of every domain.
    static CHANNELS: RefCell<Vec<Weak<Core>>> = const { RefCell::new(Vec::new()) };
}

/// The channels of `.0`'s thread and domain (the first [`HAND_OFF_MAX`] of this
/// thread's list), for [`window::dispatch`]: channel `k` is the list's `k`-th.
struct ThreadWaiters<'a>(&'a Core);

impl ThreadWaiters<'_> {
    /// Channel `k`, if alive and of the same thread and domain as `.0`.
    fn chan(&self, k: usize, list: &[Weak<Core>]) -> Option<Rc<Core>> {
        let ch = list.get(k)?.upgrade()?;
        let me = self.0;
        (ch.thread == me.thread && Arc::ptr_eq(&ch.node.domain_shared, &me.node.domain_shared))
            .then_some(ch)
    }
}

impl WindowWaiters for ThreadWaiters<'_> {
    fn each_waiting(&self, visit: &mut dyn FnMut(usize, u64)) {
        CHANNELS.with(|c| {
            let list = c.borrow();
            for k in 0..list.len().min(HAND_OFF_MAX) {
                let Some(ch) = self.chan(k, &list) else {
                    continue;
                };
                // A channel borrowed now is up the stack (a completion inside its own
                // submission): it tries when that returns.
                if let Ok(st) = ch.st.try_borrow()
                    && st.waits_for_window()
                {
                    visit(k, st.window_tag());
                }
            }
        });
    }

    fn retry(&mut self, k: usize) {
        // Out of the list's borrow: a retry sends, and a completion inside it may
        // dispatch again.
        let ch = CHANNELS.with(|c| self.chan(k, &c.borrow()));
        if let Some(ch) = ch {
            ch.retry_window();
        }
    }
}

impl std::ops::Deref for QosChannel {
    type Target = Core;
    fn deref(&self) -> &Core {
        &self.core
    }
}

impl QosChannel {
    /// Builds the channel on the current thread (io_device create callback).
    pub fn new(node: Arc<QosNode>, base: BaseChannel) -> QosChannel {
        let tokens = ChannelTokens::new(node.domain_shared.clone(), node.host_shared.clone());
        let thread = Thread::current();
        let core = Rc::new(Core {
            host_tag: allowance::fold_tag(allowance::host_tag(&node.host)),
            node,
            base,
            st: RefCell::new(TargetChannel::new(tokens)),
            sends: Cell::new(0),
            released: RefCell::new(Vec::new()),
            credit_gate: Cell::new(CreditGate::default()),
            allowance_gate: Cell::new(AllowanceGate::default()),
            thread,
        });
        CHANNELS.with(|c| {
            let mut c = c.borrow_mut();
            c.retain(|w| w.strong_count() > 0);
            c.push(Rc::downgrade(&core));
        });
        QosChannel { core }
    }

    /// io_device destroy callback: nothing can be held any more (the bdev layer keeps a
    /// channel while it has I/O), but anything left is aborted rather than lost. The
    /// base channel is put when `self` drops.
    pub fn destroy(self) {
        self.abort_all_held();
        self.st.borrow_mut().flush();
        let me = Rc::downgrade(&self.core);
        CHANNELS.with(|c| {
            c.borrow_mut()
                .retain(|w| w.strong_count() > 0 && !w.ptr_eq(&me))
        });
    }
}

impl Core {
    pub fn base(&self) -> &BaseChannel {
        &self.base
    }

    /// Completes every held I/O with an abort status (reset, delete).
    pub fn abort_all_held(&self) {
        for io in self.take_all_held() {
            io.complete(IoStatus::Aborted);
        }
    }

    fn node(&self) -> &QosNode {
        &self.node
    }

    /// The time of the I/O path's decisions: the clock. (The start of the thread's
    /// poll, `spdk_thread_get_last_tsc`, saves a clock read per command, but with it
    /// the soak on two poll groups held commands for up to 15 s under churn: not
    /// understood, so not used.)
    #[inline]
    fn clock(&self) -> Nanos {
        now()
    }

    /// Takes every held I/O out (never admitted, so not accounted).
    fn take_all_held(&self) -> Vec<QosIo> {
        let all = self.st.borrow_mut().drain();
        for io in &all {
            io.ctx().accounted.set(false);
        }
        all
    }

    /// The admission decision: send now, or hold.
    fn admit(&self, io: QosIo, kind: IoKind, bytes: u64) {
        let node = self.node();
        if SHUTDOWN.load(Ordering::Relaxed) || node.is_deleting() {
            return self.send(io);
        }
        let c = io.ctx();
        c.kind.set(kind);
        c.bytes.set(bytes);
        c.accounted.set(true);
        let t = self.clock();
        let out = self.st.borrow_mut().admit(kind, bytes, t, io);
        if let Some(io) = out {
            self.send(io);
        }
    }

    /// Releases held I/O while tokens allow, in order: after a completion
    /// (`after_completion`; at the channel's cadence) or from the poller, which also
    /// publishes the counters.
    fn release(&self, after_completion: bool) -> usize {
        let mut ready = self.released.take();
        {
            let mut st = self.st.borrow_mut();
            if after_completion {
                st.on_completion(|| self.clock(), |io| ready.push(io));
            } else {
                st.poll(self.clock(), |io| ready.push(io));
            }
        }
        let n = ready.len();
        self.send_all(ready);
        n
    }

    /// Sends `ready` (released commands) in order, then keeps the emptied list for the
    /// next release: a release allocated a list every time (malloc and free showed in
    /// the target's profile with a limited host). A send that re-enters a release
    /// finds no list kept and makes its own.
    fn send_all(&self, mut ready: Vec<QosIo>) {
        for io in ready.drain(..) {
            self.send(io);
        }
        self.keep_list(ready);
    }

    /// Keeps `empty` for the next release (the list it replaces is empty too: only
    /// drained lists are kept).
    fn keep_list(&self, empty: Vec<QosIo>) {
        let old = self.released.replace(empty);
        debug_assert!(old.is_empty());
    }

    /// After a completion on this channel (sharing `operating_point`): while the
    /// domain's window has room, the channels of this thread whose held I/O waits for
    /// it try again, smallest window tag first (start-time fair queueing: the host
    /// furthest behind its weighted share goes first), so a slot freed here goes to
    /// the host owed it, not only to this channel's own held I/O or to whichever
    /// poller comes next (every `CHANNEL_POLL_US`). Hosts of one thread only: another
    /// thread's channels are not ours to submit on; they still see the slot at their
    /// next completion or poll. Allocates nothing: each pick is a scan of this thread's
    /// channels (the first [`HAND_OFF_MAX`]; beyond them, channels wait for their own
    /// completions and poller as before). The dispatch is the core's
    /// (`qos_core::window::dispatch`), which the lab's dispatcher runs too.
    fn hand_off(&self) {
        let window = self.node.domain_shared.window();
        window::dispatch(window, Handing::WhileRoom, &mut ThreadWaiters(self));
    }

    /// Tries the held I/O again now (a slot of the window freed on another channel of
    /// this thread); sends what it releases.
    fn retry_window(&self) {
        let mut ready = self.released.take();
        match self.st.try_borrow_mut() {
            Ok(mut st) => {
                st.retry(self.clock(), |io| ready.push(io));
            }
            Err(_) => return self.keep_list(ready),
        }
        self.send_all(ready);
    }

    /// The per-channel poller (every `CHANNEL_POLL_US`).
    pub fn poll(&self) -> PollStatus {
        let mut busy = 0;
        if SHUTDOWN.load(Ordering::Relaxed) {
            // nvmf_tgt is stopping: let everything through, so no qpair waits for tokens.
            for io in self.take_all_held() {
                busy += 1;
                self.send(io);
            }
        }
        busy += self.release(false);
        if busy > 0 {
            PollStatus::Busy
        } else {
            PollStatus::Idle
        }
    }

    /// Completes an I/O that will not reach the base, recording it if it was admitted.
    fn fail(&self, io: QosIo, status: IoStatus) {
        let c = io.ctx();
        if c.accounted.get() {
            self.st
                .borrow_mut()
                .record_completion(c.kind.get(), c.bytes.get(), Nanos(0));
        }
        io.complete(status);
    }

    /// Sends an admitted (or unaccounted) I/O to the base bdev.
    fn send(&self, io: QosIo) {
        let n = self.sends.get().wrapping_add(1);
        self.sends.set(n);
        io.ctx()
            .sent_at
            .set(if n % SERVICE_SAMPLE == 0 { now().0 } else { 0 });
        let t = io.io_type();
        if t == T::SPDK_BDEV_IO_TYPE_READ {
            // Make sure the read has a buffer we own before the base sees it.
            return io.get_read_buf();
        }
        self.submit_base(io);
    }

    /// The read's buffer is ready: send it to the base.
    pub fn read_buf_ready(&self, io: QosIo, success: bool) {
        if !success {
            return self.fail(io, IoStatus::NoMem);
        }
        self.submit_base(io);
    }

    /// Issues the base I/O for `io`, with `base_done` as completion.
    fn submit_base(&self, io: QosIo) {
        match io.forward(base_done) {
            Ok(()) => {}
            Err((io, ENOMEM)) => self.queue_wait(io),
            Err((io, rc)) => {
                tracing::error!(
                    bdev = self.node().name(),
                    "base bdev refused an I/O: error {rc}"
                );
                self.fail(io, IoStatus::Failed);
            }
        }
    }

    /// The base is out of bdev_ios: retry when one frees up.
    fn queue_wait(&self, io: QosIo) {
        if let Err(io) = io.queue_wait(|ch, io| ch.send(io)) {
            self.fail(io, IoStatus::Failed);
        }
    }

    fn reset(&self, io: QosIo) {
        // Abort what every channel holds (like vbdev_delay), then reset the base.
        vbdev::reset(io, |ch: &QosChannel| ch.abort_all_held(), base_done, |_| {});
    }

    fn abort(&self, io: QosIo) {
        let Some(target) = io.abort_target() else {
            return io.complete(IoStatus::Failed);
        };
        let victim = self.st.borrow_mut().remove_first(|h| h.id() == target);
        if let Some(v) = victim {
            v.complete(IoStatus::Aborted);
            io.complete(IoStatus::Success);
            return;
        }
        // Not held here: it is at the base (or gone); the base matches it by the callback
        // argument we gave it, which is the upper bdev_io.
        io.abort_at_base(target.as_victim(), base_done, IoStatus::Failed);
    }

    /// NVMe I/O passthru: the token protocol's vendor commands are answered here; other
    /// opcodes go to the base when it takes NVMe passthru.
    fn passthru(&self, mut io: QosIo) {
        let node = self.node();
        let Some(p) = io.nvme_passthru() else {
            return io.complete(IoStatus::Failed);
        };
        let (dw, nbytes, len) = (
            nvme_cmd_dwords(&p.cmd),
            p.nbytes as u64,
            io.passthru_buf_len(),
        );
        let opc = (dw[0] & 0xff) as u8;
        if !wire::is_qos_opcode(opc) {
            return if node.base_nvme_io {
                self.admit(io, IoKind::Other, nbytes)
            } else {
                io.complete_nvme(0, SCT_GENERIC, wire::status::INVALID_OPCODE)
            };
        }
        let cmd = VendorCmd {
            cdw10: dw[10],
            cdw11: dw[11],
            cdw12: dw[12],
            cdw13: dw[13],
            cdw14: dw[14],
            cdw15: dw[15],
        };
        match wire::decode_request(opc, &cmd, len) {
            Ok(req) => {
                if !node.cooperative.load(Ordering::Relaxed) {
                    node.cooperative.store(true, Ordering::Relaxed);
                }
                let t = now();
                if let Some(c) = allowance::decode_report(opc, &cmd) {
                    // The host holds its own excess: its circulation as it counts it.
                    node.host_shared.window().report_circulation(c, t);
                }
                let mut reply = self.st.borrow_mut().tokens().serve_request(req, t);
                // Reads and writes carry credits only through `credit_gate`, and the
                // reply's dword 0 is 0: the reply carries the state, and a non-zero
                // dword 0 would cost its data PDU the C2H SUCCESS flag (a second PDU).
                reply.flags |= wire::flags::SPARSE_CREDIT | wire::flags::ALLOWANCE;
                reply.host_tag = allowance::host_tag(&node.host);
                let mut buf = [0u8; wire::REPLY_LEN];
                match reply.encode(&mut buf) {
                    Ok(()) => {
                        // A controller-to-host passthru with at least REPLY_LEN bytes
                        // (checked by decode_request).
                        io.copy_to_passthru_buf(&buf, len);
                        io.complete_nvme(0, SCT_GENERIC, wire::status::SUCCESS);
                    }
                    Err(e) => io.complete_nvme(0, SCT_GENERIC, e.status_code()),
                }
            }
            // Another product's command that happens to use the same opcode.
            Err(RequestError::BadMagic(_)) if node.base_nvme_io => {
                self.admit(io, IoKind::Other, nbytes)
            }
            Err(e) => {
                tracing::debug!(bdev = node.name(), "vendor command refused: {e}");
                io.complete_nvme(0, SCT_GENERIC, e.status_code())
            }
        }
    }
}

/// The bdev layer's entry point for our bdevs (through the skeleton).
pub(crate) fn submit(inner: &QosChannel, io: QosIo) {
    let t = io.io_type();
    match t {
        T::SPDK_BDEV_IO_TYPE_READ => {
            let b = io.block_bytes();
            inner.admit(io, IoKind::Read, b)
        }
        T::SPDK_BDEV_IO_TYPE_WRITE => {
            let b = io.block_bytes();
            inner.admit(io, IoKind::Write, b)
        }
        T::SPDK_BDEV_IO_TYPE_COMPARE => {
            let b = io.block_bytes();
            inner.admit(io, IoKind::Other, b)
        }
        T::SPDK_BDEV_IO_TYPE_UNMAP => inner.admit(io, IoKind::Unmap, 0),
        T::SPDK_BDEV_IO_TYPE_FLUSH => inner.admit(io, IoKind::Flush, 0),
        T::SPDK_BDEV_IO_TYPE_WRITE_ZEROES => inner.admit(io, IoKind::WriteZeroes, 0),
        T::SPDK_BDEV_IO_TYPE_RESET => inner.reset(io),
        T::SPDK_BDEV_IO_TYPE_ABORT => inner.abort(io),
        T::SPDK_BDEV_IO_TYPE_NVME_IO
        | T::SPDK_BDEV_IO_TYPE_NVME_IO_MD
        | T::SPDK_BDEV_IO_TYPE_NVME_IOV_MD => inner.passthru(io),
        _ => io.complete(IoStatus::Failed),
    }
}

/// Completion of a base I/O: record it, complete the upper I/O (with the host's credit
/// in dword 0 for successful reads and writes when [`CreditGate`] says it is news;
/// otherwise as the base completed it, dword 0 being 0), and release held I/O.
fn base_done(inner: &QosChannel, io: QosIo, base: BaseIo, success: bool) {
    let c = io.ctx();
    let t = io.io_type();
    let credit = if c.accounted.get() {
        let mut st = inner.st.borrow_mut();
        let service = match c.sent_at.get() {
            0 => Nanos(0),
            sent => Nanos(
                now()
                    .0
                    .saturating_sub(sent)
                    .saturating_mul(SERVICE_SAMPLE as u64),
            ),
        };
        st.record_completion(c.kind.get(), c.bytes.get(), service);
        if success
            && (t == T::SPDK_BDEV_IO_TYPE_READ || t == T::SPDK_BDEV_IO_TYPE_WRITE)
            && inner.node().cooperative.load(Ordering::Relaxed)
        {
            let now = inner.clock();
            // The allowance first: it changes a few times a second at most, and the
            // token credit that waits is sent with the next completion.
            let mut ag = inner.allowance_gate.get();
            let word = inner.node().host_shared.window().allowance_word();
            let allowed = ag.should_send(word, inner.host_tag, now);
            inner.allowance_gate.set(ag);
            allowed.or_else(|| {
                let hint = st.tokens().credit_hint();
                let mut gate = inner.credit_gate.get();
                let send = gate.should_send(hint, now);
                inner.credit_gate.set(gate);
                send.then(|| hint.encode())
            })
        } else {
            None
        }
    } else {
        None
    };
    match credit {
        Some(cdw0) => {
            drop(base);
            io.complete_nvme(cdw0, SCT_GENERIC, wire::status::SUCCESS);
        }
        None => {
            io.complete_like(&base);
            drop(base);
        }
    }
    // The window's weighted order first (a freed slot to the smallest tag on this
    // thread), then this channel's own cadence (tokens).
    inner.hand_off();
    inner.release(true);
}
