//! An I/O submitted to one of a module's stacked bdevs, typed by the module ([`Io`]):
//! an owned handle, completed exactly once (every completion consumes it), whose
//! per-I/O context ([`Vbdev::IoCtx`]) and buffers are reached through borrows of the
//! handle, and whose trips to the base bdev (forward, reset, abort, wait for a
//! bdev_io) come back to the module as the same handle, with its channel.
//!
//! The bdev_io's `driver_ctx` holds a [`Header`]: the SPDK channel the I/O was
//! submitted on (written before the module sees the I/O), the completion the module
//! named for the I/O's trip to the base, the wait entry for `spdk_bdev_queue_io_wait`,
//! and the module's context.

use std::ffi::{c_int, c_void};
use std::marker::PhantomData;

use crate::bdev_io::{BaseIo, BdevIo, IoStatus};
use crate::ffi::{self, spdk_bdev_io_type as T};

use super::{Node, Vbdev, channel};

/// What the module does when its I/O comes back from the base: the channel it was
/// submitted on, the I/O, the base's child I/O (for its status), and success.
pub type BaseDone<P> = fn(&<P as Vbdev>::Channel, Io<P>, BaseIo, bool);
/// What the module does when a bdev_io of the base is free again
/// ([`Io::queue_wait`]).
pub type Retry<P> = fn(&<P as Vbdev>::Channel, Io<P>);

/// The start of `driver_ctx`.
#[repr(C)]
struct Header<P: Vbdev> {
    /// The channel of the upper bdev this I/O was submitted on.
    ch: *mut ffi::spdk_io_channel,
    done: Option<BaseDone<P>>,
    retry: Option<Retry<P>>,
    /// Written by [`Io::queue_wait`] before SPDK sees it; left unwritten on the
    /// common path (a store of its 40 bytes per I/O saved).
    wait: std::mem::MaybeUninit<ffi::spdk_bdev_io_wait_entry>,
    ctx: P::IoCtx,
}

/// Bytes of `driver_ctx` a module built on [`Vbdev`] asks for (`get_ctx_size`).
pub(crate) const fn ctx_size<P: Vbdev>() -> usize {
    std::mem::size_of::<Header<P>>()
}

const _: () = assert!(std::mem::offset_of!(ffi::spdk_bdev_io, driver_ctx) % 8 == 0);

/// The address of a bdev_io, to compare (e.g. with [`Io::abort_target`]); never
/// dereferenced.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct IoId(pub(crate) usize);

/// A callback argument of I/O sent to the base, by which the base's ABORT finds it
/// (`spdk_bdev_abort` aborts every I/O sent with that argument). Only compared by
/// SPDK, never dereferenced, so a stale one is harmless.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Victim(pub(crate) usize);

impl IoId {
    /// The victim of a base ABORT that names this I/O as it was sent to the base by
    /// [`Io::forward`] (its callback argument is the I/O itself).
    pub fn as_victim(self) -> Victim {
        Victim(self.0)
    }
}

/// An I/O of one of `P`'s bdevs, not yet completed. Not `Clone`, not `Send`: used on
/// the channel's thread, completed once (dropping it completes it with a failure).
pub struct Io<P: Vbdev> {
    io: BdevIo,
    _p: PhantomData<fn() -> P>,
}

impl<P: Vbdev> std::fmt::Debug for Io<P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Io").field(&self.io.as_ptr()).finish()
    }
}

impl<P: Vbdev> Io<P> {
    /// Takes charge of a freshly submitted I/O and writes its header.
    ///
    /// # Safety
    /// `raw` is a live bdev_io of one of `P`'s bdevs, just submitted to the module on
    /// channel `ch` (a channel of that bdev), owned by nobody else; its `driver_ctx`
    /// has [`ctx_size::<P>`] bytes.
    pub(crate) unsafe fn start(raw: *mut ffi::spdk_bdev_io, ch: *mut ffi::spdk_io_channel) -> Self {
        const { assert!(std::mem::align_of::<Header<P>>() <= 8) };
        const { assert!(!std::mem::needs_drop::<P::IoCtx>()) };
        // SAFETY: per the contract.
        let io = unsafe { BdevIo::from_raw(raw) };
        let h = io.driver_ctx().cast::<Header<P>>();
        // SAFETY: `driver_ctx` is 8-byte aligned (asserted above, and the header's
        // alignment is at most 8) and `ctx_size::<P>()` bytes long (the module's
        // `get_ctx_size`); nothing reads it before this write.
        unsafe {
            h.write(Header {
                ch,
                done: None,
                retry: None,
                wait: std::mem::MaybeUninit::uninit(),
                ctx: P::IoCtx::default(),
            })
        };
        Io {
            io,
            _p: PhantomData,
        }
    }

    /// Takes an I/O back from a callback argument.
    ///
    /// # Safety
    /// `raw` was given up by [`Io::into_raw`] (so its header is written) and is taken
    /// back once.
    pub(crate) unsafe fn resume(raw: *mut ffi::spdk_bdev_io) -> Self {
        Io {
            // SAFETY: per the contract.
            io: unsafe { BdevIo::from_raw(raw) },
            _p: PhantomData,
        }
    }

    fn into_raw(self) -> *mut ffi::spdk_bdev_io {
        self.io.into_raw()
    }

    fn header(&self) -> *mut Header<P> {
        self.io.driver_ctx().cast::<Header<P>>()
    }

    /// The SPDK channel it was submitted on.
    pub(crate) fn raw_channel(&self) -> *mut ffi::spdk_io_channel {
        // SAFETY: the header was written when the I/O was submitted (`start`), and the
        // field is never written again.
        unsafe { (*self.header()).ch }
    }

    /// The module's channel the I/O was submitted on.
    pub(crate) fn channel(&self) -> &P::Channel {
        // SAFETY: the bdev layer keeps an upper bdev's channel alive while it has an
        // I/O outstanding, and this one is (the borrow of `self`); on its thread (`Io`
        // is not `Send`).
        unsafe { channel::<P>(self.raw_channel()) }
    }

    /// The module's context of this I/O (`Default` at submission). Shared only: the
    /// context mutates through `Cell`s, so borrows of it never conflict.
    pub fn ctx(&self) -> &P::IoCtx {
        // SAFETY: written at submission; the field is never written again, and the
        // reference lives no longer than the I/O (the borrow of `self`).
        unsafe { &(*self.header()).ctx }
    }

    /// The bdev it was submitted to.
    pub fn node(&self) -> &Node<P> {
        // SAFETY: the bdev's `ctxt` is its node (set in `register`), alive while the
        // bdev has I/O outstanding (the node is freed after the bdev is destructed).
        unsafe { &*(*self.io.bdev()).ctxt.cast::<Node<P>>() }
    }

    /// Identity (address), e.g. to match an ABORT's target.
    pub fn id(&self) -> IoId {
        IoId(self.io.as_ptr() as usize)
    }

    pub fn io_type(&self) -> T {
        self.io.io_type()
    }

    /// See [`BdevIo::block`].
    pub fn block(&self) -> Option<&ffi::spdk_bdev_io_block_params> {
        self.io.block()
    }

    /// Bytes a block I/O covers; 0 for other types.
    pub fn block_bytes(&self) -> u64 {
        self.io.block_bytes()
    }

    /// The data buffers of a READ, WRITE or COMPARE (empty without buffers).
    pub fn iovs(&self) -> &[ffi::iovec] {
        self.io.iovs()
    }

    /// A READ, WRITE or COMPARE has a first data buffer.
    pub fn has_buffers(&self) -> bool {
        self.iovs().first().is_some_and(|v| !v.iov_base.is_null())
    }

    /// See [`BdevIo::nvme_passthru`].
    pub fn nvme_passthru(&self) -> Option<&ffi::spdk_bdev_io_nvme_passthru_params> {
        self.io.nvme_passthru()
    }

    /// See [`BdevIo::passthru_buf_len`].
    pub fn passthru_buf_len(&self) -> usize {
        self.io.passthru_buf_len()
    }

    /// See [`BdevIo::copy_to_passthru_buf`].
    pub fn copy_to_passthru_buf(&mut self, data: &[u8], limit: usize) -> usize {
        self.io.copy_to_passthru_buf(data, limit)
    }

    /// The I/O an ABORT asks to abort (`None` for other types).
    pub fn abort_target(&self) -> Option<IoId> {
        self.io.abort_target().map(IoId)
    }

    pub fn complete(self, status: IoStatus) {
        self.io.complete(status)
    }

    /// See [`BdevIo::complete_nvme`].
    pub fn complete_nvme(self, cdw0: u32, sct: u8, sc: u8) {
        self.io.complete_nvme(cdw0, sct, sc)
    }

    /// See [`BdevIo::complete_like`].
    pub fn complete_like(self, base: &BaseIo) {
        self.io.complete_like(base)
    }

    fn set_done(&mut self, done: BaseDone<P>) {
        // SAFETY: the header is written; `&mut self` excludes every other access to the
        // I/O, and no reference to this field is ever handed out.
        unsafe { std::ptr::addr_of_mut!((*self.header()).done).write(Some(done)) };
    }

    /// Sends this I/O, unchanged, to the base (through its channel's
    /// [`Vbdev::base_channel`]); `done` gets it back when the base completes it. On a
    /// refusal the I/O comes back with SPDK's error code. A READ without buffers is
    /// sent as it is (the base allocates its own: give it ours first with
    /// [`Io::get_read_buf`] when the data must land in the upper buffers).
    pub fn forward(mut self, done: BaseDone<P>) -> Result<(), (Io<P>, c_int)> {
        self.set_done(done);
        let base = P::base_channel(self.channel());
        // SAFETY: on the channel's thread (`Io` is not `Send`); `base_done::<P>` takes
        // the I/O back from its argument, which is the I/O itself, once, and only when
        // SPDK accepted it (rc 0).
        let rc = unsafe {
            self.io.forward(
                base.desc_ptr(),
                base.as_ptr(),
                Some(base_done::<P>),
                self.io.as_ptr().cast(),
            )
        };
        if rc == 0 {
            let _ = self.into_raw();
            Ok(())
        } else {
            Err((self, rc))
        }
    }

    /// Resets the base with this RESET; `done` gets it back. When the base refuses, the
    /// RESET comes back with SPDK's error code.
    pub fn reset_base(mut self, done: BaseDone<P>) -> Result<(), (Io<P>, c_int)> {
        self.set_done(done);
        let base = P::base_channel(self.channel());
        let (desc, ch) = (base.desc_ptr(), base.as_ptr());
        let raw = self.into_raw();
        // SAFETY: valid descriptor and channel on this thread; `raw` goes to
        // `base_done::<P>` when the call returns 0.
        let rc = unsafe { ffi::spdk_bdev_reset(desc, ch, Some(base_done::<P>), raw.cast()) };
        if rc != 0 {
            // SAFETY: not submitted, so still ours.
            return Err((unsafe { Io::<P>::resume(raw) }, rc));
        }
        Ok(())
    }

    /// Asks the base to abort what was sent with callback argument `victim`; `done`
    /// gets this ABORT back. When the base refuses, completes it here with `refused`.
    pub fn abort_at_base(mut self, victim: Victim, done: BaseDone<P>, refused: IoStatus) {
        self.set_done(done);
        let base = P::base_channel(self.channel());
        let (desc, ch) = (base.desc_ptr(), base.as_ptr());
        let raw = self.into_raw();
        // SAFETY: valid descriptor and channel on this thread; the victim is only
        // compared by SPDK; `raw` goes to `base_done::<P>` when the call returns 0.
        let rc = unsafe {
            ffi::spdk_bdev_abort(
                desc,
                ch,
                victim.0 as *mut c_void,
                Some(base_done::<P>),
                raw.cast(),
            )
        };
        if rc != 0 {
            // SAFETY: not submitted, so still ours.
            unsafe { Io::<P>::resume(raw) }.complete(refused);
        }
    }

    /// The base is out of bdev_ios: `retry` gets this I/O back when one is free. When
    /// SPDK cannot queue the wait, the I/O comes back.
    pub fn queue_wait(self, retry: Retry<P>) -> Result<(), Io<P>> {
        let base = P::base_channel(self.channel());
        let (bdev, ch) = (base.base().bdev_ptr(), base.as_ptr());
        let h = self.header();
        let raw = self.into_raw();
        // SAFETY: the header (with the wait entry) lives in the I/O, which stays ours
        // until `retry_io::<P>` takes it back from the entry's argument; the entry names
        // the base bdev whose channel we queue on, as SPDK requires.
        let rc = unsafe {
            (*h).retry = Some(retry);
            let mut entry: ffi::spdk_bdev_io_wait_entry = std::mem::zeroed();
            entry.bdev = bdev;
            entry.cb_fn = Some(retry_io::<P>);
            entry.cb_arg = raw.cast();
            let wait = (*h).wait.write(entry);
            ffi::spdk_bdev_queue_io_wait(bdev, ch, wait)
        };
        if rc != 0 {
            // SAFETY: not queued, so still ours.
            return Err(unsafe { Io::<P>::resume(raw) });
        }
        Ok(())
    }

    /// Gives a READ a data buffer of the bdev layer when it came without one, then
    /// hands it to [`Vbdev::read_buf_ready`] on its channel, now or later.
    pub fn get_read_buf(self) {
        let len = self.block_bytes();
        // SAFETY: ownership of the I/O moves to `read_buf_ready::<P>`, which SPDK calls
        // once (now or later) on the I/O's channel.
        unsafe { ffi::spdk_bdev_io_get_buf(self.into_raw(), Some(read_buf_ready::<P>), len) };
    }
}

unsafe extern "C" fn base_done<P: Vbdev>(
    base: *mut ffi::spdk_bdev_io,
    success: bool,
    arg: *mut c_void,
) {
    // SAFETY: `arg` is an upper I/O given up by `forward`, `reset_base` or
    // `abort_at_base` (which set its `done`), taken back once here; `base` is the
    // completed child, freed by `BaseIo`.
    let (io, base) = unsafe { (Io::<P>::resume(arg.cast()), BaseIo::from_raw(base)) };
    // SAFETY: the header is written; nothing else accesses the I/O now.
    let done = unsafe { (*io.header()).done.take() };
    let done = done.expect("an I/O sent to the base names its completion");
    // SAFETY: the upper channel is alive while its I/O is outstanding; same thread.
    let ch = unsafe { channel::<P>(io.raw_channel()) };
    done(ch, io, base, success);
}

unsafe extern "C" fn retry_io<P: Vbdev>(arg: *mut c_void) {
    // SAFETY: `arg` is the I/O given up by `queue_wait`, taken back once here.
    let io = unsafe { Io::<P>::resume(arg.cast()) };
    // SAFETY: `queue_wait` set `retry` before queueing.
    let retry = unsafe { (*io.header()).retry.take() };
    let retry = retry.expect("a waiting I/O names its retry");
    // SAFETY: as in `base_done`.
    let ch = unsafe { channel::<P>(io.raw_channel()) };
    retry(ch, io);
}

unsafe extern "C" fn read_buf_ready<P: Vbdev>(
    ch: *mut ffi::spdk_io_channel,
    raw: *mut ffi::spdk_bdev_io,
    success: bool,
) {
    // SAFETY: `raw` was handed over by `get_read_buf`; `ch` is the channel of one of
    // `P`'s bdevs the read was submitted on (alive while the read is outstanding).
    let (io, c) = unsafe { (Io::<P>::resume(raw), channel::<P>(ch)) };
    P::read_buf_ready(c, io, success);
}
