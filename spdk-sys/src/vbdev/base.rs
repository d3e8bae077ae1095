//! The bdev below a stacked bdev: its descriptor, opened read-write and claimed for the
//! upper module ([`Base`], shared by `Arc`: the node and every channel hold one, so the
//! descriptor is closed only after the last base channel is put), and one thread's
//! channel of it ([`BaseChannel`], put when dropped), through which upper I/O goes down.

use std::ffi::{CString, c_int, c_void};
use std::rc::Rc;
use std::sync::Arc;

use crate::bdev_io::BaseIo;
use crate::dma::DmaBuf;
use crate::ffi::{self, spdk_bdev_io_type as T};
use crate::module::BdevModule;
use crate::rpc::{RpcError, code};
use crate::thread::Thread;

use super::io::Victim;

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

/// This thread's channel of a base (`spdk_bdev_get_io_channel`), put when the last
/// clone drops. It keeps the base open. Not `Send`: got, used and put on one thread.
/// Every request this layer sends through it on the module's behalf holds a clone, so
/// the channel outlives what is in flight on it.
#[derive(Clone)]
pub struct BaseChannel(Rc<ChannelInner>);

struct ChannelInner {
    ch: *mut ffi::spdk_io_channel,
    base: Arc<Base>,
}

impl std::fmt::Debug for BaseChannel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BaseChannel")
            .field("base", &self.0.base.name)
            .finish()
    }
}

/// Identity of a request sent with [`BaseChannel::nvme_io_passthru`]: the victim of an
/// ABORT of it, and a key for the module's own bookkeeping.
pub type RequestId = Victim;

/// A request in flight on a base channel: the channel (kept), the buffer the device
/// writes (kept), the module's context and completion.
struct Pending<C> {
    _ch: BaseChannel,
    buf: Option<DmaBuf>,
    ctx: C,
    done: PendingDone<C>,
}

enum PendingDone<C> {
    Passthru(fn(RequestId, C, DmaBuf, BaseIo, bool)),
    Abort(fn(C, BaseIo, bool)),
}

impl BaseChannel {
    /// Gets the current thread's channel of `base`; `None` when SPDK has none to give.
    pub(crate) fn get(base: &Arc<Base>) -> Option<BaseChannel> {
        // SAFETY: the descriptor is open (we hold the base); the caller is on an SPDK
        // thread (io_device channel creation); the channel is put when the last clone
        // drops.
        let ch = unsafe { ffi::spdk_bdev_get_io_channel(base.desc.0) };
        (!ch.is_null()).then(|| {
            BaseChannel(Rc::new(ChannelInner {
                ch,
                base: base.clone(),
            }))
        })
    }

    pub fn base(&self) -> &Arc<Base> {
        &self.0.base
    }

    pub(crate) fn as_ptr(&self) -> *mut ffi::spdk_io_channel {
        self.0.ch
    }

    pub(crate) fn desc_ptr(&self) -> *mut ffi::spdk_bdev_desc {
        self.0.base.desc.0
    }

    /// Sends an NVMe I/O command (`spdk_bdev_nvme_io_passthru`) whose data, `len` bytes
    /// from the controller, lands in `buf`; `done` gets the request's id, `ctx`, the
    /// buffer (now holding the data), the child I/O and success. The request keeps a
    /// clone of this channel and the buffer until then. On a refusal `ctx` and `buf`
    /// come back with SPDK's error code (-EINVAL when `len` exceeds the buffer).
    #[allow(clippy::type_complexity)]
    pub fn nvme_io_passthru<C: 'static>(
        &self,
        cmd: &ffi::spdk_nvme_cmd,
        mut buf: DmaBuf,
        len: usize,
        ctx: C,
        done: fn(RequestId, C, DmaBuf, BaseIo, bool),
    ) -> Result<RequestId, (C, DmaBuf, c_int)> {
        if len > buf.len() {
            return Err((ctx, buf, -22));
        }
        let data = buf.as_mut_ptr();
        let p = Box::into_raw(Box::new(Pending {
            _ch: self.clone(),
            buf: Some(buf),
            ctx,
            done: PendingDone::Passthru(done),
        }));
        // SAFETY: valid descriptor and channel on this thread (`BaseChannel` is not
        // `Send`); `cmd` is copied by the driver; the buffer (`len` of its bytes, checked
        // above) is owned by the pending request until `pending_done::<C>` reclaims it,
        // which happens once, only when the call returns 0.
        let rc = unsafe {
            ffi::spdk_bdev_nvme_io_passthru(
                self.desc_ptr(),
                self.as_ptr(),
                cmd,
                data.cast(),
                len,
                Some(pending_done::<C>),
                p.cast(),
            )
        };
        if rc != 0 {
            // SAFETY: not submitted, so still ours.
            let p = unsafe { Box::from_raw(p) };
            let Pending { buf, ctx, .. } = *p;
            return Err((ctx, buf.expect("a passthru keeps its buffer"), rc));
        }
        Ok(Victim(p as usize))
    }

    /// Asks the base to abort what was sent through it with callback argument `victim`
    /// (e.g. a [`RequestId`]); `done` gets `ctx`, the abort's child I/O and success. The
    /// abort keeps a clone of this channel until then. On a refusal `ctx` comes back.
    pub fn abort<C: 'static>(
        &self,
        victim: Victim,
        ctx: C,
        done: fn(C, BaseIo, bool),
    ) -> Result<(), (C, c_int)> {
        let p = Box::into_raw(Box::new(Pending {
            _ch: self.clone(),
            buf: None,
            ctx,
            done: PendingDone::Abort(done),
        }));
        // SAFETY: valid descriptor and channel on this thread; the victim is only
        // compared by SPDK; `p` goes to `pending_done::<C>` when the call returns 0.
        let rc = unsafe {
            ffi::spdk_bdev_abort(
                self.desc_ptr(),
                self.as_ptr(),
                victim.0 as *mut c_void,
                Some(pending_done::<C>),
                p.cast(),
            )
        };
        if rc != 0 {
            // SAFETY: not submitted, so still ours.
            let p = unsafe { Box::from_raw(p) };
            return Err((p.ctx, rc));
        }
        Ok(())
    }
}

unsafe extern "C" fn pending_done<C>(
    base: *mut ffi::spdk_bdev_io,
    success: bool,
    arg: *mut c_void,
) {
    // SAFETY: `arg` is the pending request leaked by `nvme_io_passthru` or `abort`,
    // reclaimed once here; `base` is the completed child, freed by `BaseIo`.
    let (p, base) = unsafe {
        (
            Box::from_raw(arg.cast::<Pending<C>>()),
            BaseIo::from_raw(base),
        )
    };
    let id = Victim(arg as usize);
    // The channel clone in `p` is put after the module's completion has run.
    let Pending {
        _ch,
        buf,
        ctx,
        done,
    } = *p;
    match (done, buf) {
        (PendingDone::Passthru(f), Some(buf)) => f(id, ctx, buf, base, success),
        (PendingDone::Abort(f), _) => f(ctx, base, success),
        (PendingDone::Passthru(_), None) => unreachable!("a passthru keeps its buffer"),
    }
    drop(_ch);
}

impl Drop for ChannelInner {
    fn drop(&mut self) {
        // SAFETY: got in `BaseChannel::get` on this thread (the type is not `Send`), put
        // once, when the last clone drops.
        unsafe { ffi::spdk_put_io_channel(self.ch) };
    }
}
