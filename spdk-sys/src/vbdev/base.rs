//! The bdev below a stacked bdev: its descriptor, opened read-write and claimed for the
//! upper module ([`Base`], shared by `Arc`: the node and every channel hold one, so the
//! descriptor is closed only after the last base channel is put), and one thread's
//! channel of it ([`BaseChannel`], put when dropped), through which upper I/O goes down.

use std::ffi::{CString, c_int, c_void};
use std::sync::Arc;

use crate::bdev_io::{BdevIo, IoStatus};
use crate::ffi::{self, spdk_bdev_io_type as T};
use crate::module::BdevModule;
use crate::rpc::{RpcError, code};
use crate::thread::Thread;

/// A raw SPDK pointer that may be sent between threads. SPDK objects are designed to be
/// referenced from several threads; which calls are allowed where is SPDK's contract,
/// stated at each use.
#[derive(PartialEq, Eq)]
pub(crate) struct SendPtr<T>(pub(crate) *mut T);
impl<T> Clone for SendPtr<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for SendPtr<T> {}
// SAFETY: see the type's documentation; the pointer is only dereferenced by SPDK calls
// made on the threads SPDK allows.
unsafe impl<T> Send for SendPtr<T> {}
// SAFETY: as above.
unsafe impl<T> Sync for SendPtr<T> {}

/// An open, claimed base bdev. Dropping the last handle releases the claim and closes
/// the descriptor on the app thread (where it was opened, as SPDK requires).
pub struct Base {
    name: String,
    bdev: SendPtr<ffi::spdk_bdev>,
    desc: SendPtr<ffi::spdk_bdev_desc>,
}

impl std::fmt::Debug for Base {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Base").field("name", &self.name).finish()
    }
}

/// Why a base could not be opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum BaseError {
    #[error("the base name contains NUL")]
    Nul,
    #[error("no such bdev")]
    Unknown,
    #[error("cannot open it read-write: error {0}")]
    Open(i32),
    #[error("already claimed: error {0}")]
    Claim(i32),
}

/// What a module tells the user when a base cannot be opened: hints appended to the
/// messages (`unknown bdev NAME (HINT)`, `base bdev NAME is already claimed HINT`).
#[derive(Debug, Clone, Copy)]
pub struct BaseHints {
    pub unknown: &'static str,
    pub claimed: &'static str,
    /// Said when opening for writing fails with EPERM (another writer holds a claim);
    /// `None`: reported as any other open error.
    pub open_claimed: Option<&'static str>,
}

impl BaseError {
    /// The JSON-RPC refusal for base `name`.
    pub fn refusal(self, name: &str, h: &BaseHints) -> RpcError {
        match self {
            BaseError::Nul => RpcError::invalid("base_bdev_name contains NUL"),
            BaseError::Unknown => RpcError::new(
                code::ENOENT,
                format!("unknown bdev {name:?} ({})", h.unknown),
            ),
            BaseError::Open(-1) if h.open_claimed.is_some() => RpcError::new(
                code::EBUSY,
                format!(
                    "base bdev {name:?} is already claimed {}",
                    h.open_claimed.unwrap_or_default()
                ),
            ),
            BaseError::Open(rc) => RpcError::new(
                rc.min(-1),
                format!("cannot open base bdev {name:?} read-write: error {rc}"),
            ),
            BaseError::Claim(rc) => RpcError::new(
                code::EBUSY,
                format!(
                    "base bdev {name:?} is already claimed {}; error {rc}",
                    h.claimed
                ),
            ),
        }
    }
}

impl Base {
    /// Opens bdev `name` read-write with `event` as its event callback (context: none)
    /// and claims it for `module` (the legacy exclusive-write claim). App thread.
    pub(crate) fn open(
        name: &str,
        module: &'static BdevModule,
        event: ffi::spdk_bdev_event_cb_t,
    ) -> Result<Arc<Base>, BaseError> {
        let cname = CString::new(name).map_err(|_| BaseError::Nul)?;
        let mut desc: *mut ffi::spdk_bdev_desc = std::ptr::null_mut();
        // SAFETY: app thread; `cname` outlives the call; the event callback takes no
        // context.
        let rc = unsafe {
            ffi::spdk_bdev_open_ext(cname.as_ptr(), true, event, std::ptr::null_mut(), &mut desc)
        };
        if rc == -19 {
            return Err(BaseError::Unknown);
        }
        if rc != 0 || desc.is_null() {
            return Err(BaseError::Open(rc));
        }
        // SAFETY: `desc` was just opened.
        let bdev = unsafe { ffi::spdk_bdev_desc_get_bdev(desc) };
        // SAFETY: live bdev and descriptor; the module descriptor is 'static.
        let rc = unsafe { ffi::spdk_bdev_module_claim_bdev(bdev, desc, module.as_ptr()) };
        if rc != 0 {
            // SAFETY: opened above on this thread, closed once.
            unsafe { ffi::spdk_bdev_close(desc) };
            return Err(BaseError::Claim(rc));
        }
        Ok(Arc::new(Base {
            name: name.to_string(),
            bdev: SendPtr(bdev),
            desc: SendPtr(desc),
        }))
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn bdev_ptr(&self) -> *mut ffi::spdk_bdev {
        self.bdev.0
    }

    /// The open base bdev (geometry, UUID).
    pub fn bdev(&self) -> &ffi::spdk_bdev {
        // SAFETY: the bdev stays alive while our descriptor is open (until drop).
        unsafe { &*self.bdev.0 }
    }

    /// Whether the base takes I/O of type `t`.
    pub fn supports(&self, t: T) -> bool {
        // SAFETY: the base is open while `self` lives.
        unsafe { ffi::spdk_bdev_io_type_supported(self.bdev.0, t) }
    }

    /// The base's memory domains (`spdk_bdev_get_memory_domains`).
    ///
    /// # Safety
    /// `domains` has room for `size` entries (or is null with `size` 0).
    pub(crate) unsafe fn memory_domains(
        &self,
        domains: *mut *mut ffi::spdk_memory_domain,
        size: c_int,
    ) -> c_int {
        // SAFETY: per the contract; the base is open.
        unsafe { ffi::spdk_bdev_get_memory_domains(self.bdev.0, domains, size) }
    }

    pub fn desc_ptr(&self) -> *mut ffi::spdk_bdev_desc {
        self.desc.0
    }
}

impl Drop for Base {
    fn drop(&mut self) {
        let (bdev, desc) = (self.bdev, self.desc);
        let close = move || {
            let (b, d) = (bdev, desc);
            // SAFETY: we claimed this bdev with our module and opened `desc` on the app
            // thread; both are released exactly once, here (the last handle), on the
            // app thread.
            unsafe {
                ffi::spdk_bdev_module_release_bdev(b.0);
                ffi::spdk_bdev_close(d.0);
            }
        };
        if Thread::on_app_thread() {
            close();
        } else if let Some(app) = Thread::app() {
            if app.send(close).is_err() {
                tracing::error!("cannot close a base descriptor: app thread gone");
            }
        }
    }
}

/// This thread's channel of a base (`spdk_bdev_get_io_channel`), put when dropped. It
/// keeps the base open. Not `Send`: got, used and put on one thread.
pub struct BaseChannel {
    ch: *mut ffi::spdk_io_channel,
    base: Arc<Base>,
}

impl std::fmt::Debug for BaseChannel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BaseChannel")
            .field("base", &self.base.name)
            .finish()
    }
}

impl BaseChannel {
    /// Gets the current thread's channel of `base`; `None` when SPDK has none to give.
    pub(crate) fn get(base: &Arc<Base>) -> Option<BaseChannel> {
        // SAFETY: the descriptor is open (we hold the base); the caller is on an SPDK
        // thread (io_device channel creation); the channel is put in `drop`.
        let ch = unsafe { ffi::spdk_bdev_get_io_channel(base.desc.0) };
        (!ch.is_null()).then(|| BaseChannel {
            ch,
            base: base.clone(),
        })
    }

    pub fn base(&self) -> &Arc<Base> {
        &self.base
    }

    pub fn as_ptr(&self) -> *mut ffi::spdk_io_channel {
        self.ch
    }

    pub fn desc_ptr(&self) -> *mut ffi::spdk_bdev_desc {
        self.base.desc.0
    }

    /// Issues `io`, unchanged, to the base with `cb(io)` as completion
    /// ([`BdevIo::forward`]). On a refusal `io` comes back with SPDK's error code.
    ///
    /// # Safety
    /// On this channel's thread; a READ has its buffers; `cb` takes `io` back from its
    /// argument ([`BdevIo::from_raw`]) and completes it.
    pub unsafe fn forward(
        &self,
        io: BdevIo,
        cb: ffi::spdk_bdev_io_completion_cb,
    ) -> Result<(), (BdevIo, c_int)> {
        // SAFETY: per the contract; `io` goes to `cb` only when the call returns 0.
        let rc = unsafe { io.forward(self.base.desc.0, self.ch, cb, io.as_ptr().cast()) };
        if rc == 0 {
            let _ = io.into_raw();
            Ok(())
        } else {
            Err((io, rc))
        }
    }

    /// Resets the base with `cb(io)` as completion; when the base refuses, completes
    /// `io` itself (success when the base has no reset, -ENOTSUP).
    ///
    /// # Safety
    /// As for [`BaseChannel::forward`]; `io` is a RESET.
    pub unsafe fn reset(&self, io: BdevIo, cb: ffi::spdk_bdev_io_completion_cb) -> bool {
        let raw = io.into_raw();
        // SAFETY: valid descriptor and channel on this thread; `raw` goes to `cb` when
        // the call returns 0.
        let rc = unsafe { ffi::spdk_bdev_reset(self.base.desc.0, self.ch, cb, raw.cast()) };
        if rc != 0 {
            // SAFETY: not submitted, so still ours.
            let io = unsafe { BdevIo::from_raw(raw) };
            io.complete(if rc == -95 {
                IoStatus::Success
            } else {
                IoStatus::Failed
            });
            return false;
        }
        true
    }

    /// Asks the base to abort the I/O it got with callback argument `victim`, with
    /// `cb(io)` as completion; when the base refuses, completes `io` with `refused`.
    ///
    /// # Safety
    /// As for [`BaseChannel::forward`]; `io` is an ABORT.
    pub unsafe fn abort(
        &self,
        io: BdevIo,
        victim: *mut c_void,
        cb: ffi::spdk_bdev_io_completion_cb,
        refused: IoStatus,
    ) {
        let raw = io.into_raw();
        // SAFETY: valid descriptor and channel on this thread; `raw` goes to `cb` when
        // the call returns 0.
        let rc = unsafe { ffi::spdk_bdev_abort(self.base.desc.0, self.ch, victim, cb, raw.cast()) };
        if rc != 0 {
            // SAFETY: not submitted, so still ours.
            unsafe { BdevIo::from_raw(raw) }.complete(refused);
        }
    }
}

impl Drop for BaseChannel {
    fn drop(&mut self) {
        // SAFETY: got in `get` on this thread (the type is not `Send`), put once.
        unsafe { ffi::spdk_put_io_channel(self.ch) };
    }
}
