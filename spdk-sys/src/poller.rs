//! Pollers owned by a Rust value: the closure runs on the SPDK thread that registered
//! it, every `period` microseconds (0: on every reactor iteration), until the
//! [`Poller`] is dropped.

use std::ffi::{CStr, c_int, c_void};

use crate::ffi;
use crate::thread::Thread;

/// A registered poller. Dropping it unregisters the poller (on its own thread: a drop
/// elsewhere is forwarded there by message) and frees the closure by a later message
/// on that thread, so that a drop from inside the closure itself is sound.
#[derive(Debug)]
pub struct Poller {
    raw: *mut ffi::spdk_poller,
    ctx: *mut c_void,
    free: unsafe fn(*mut c_void),
    thread: Thread,
}

// SAFETY: the closure is `Send`, and the raw pointers are only used on the poller's
// thread: `Drop` on another thread forwards them there by message.
unsafe impl Send for Poller {}

/// What the closure reports to SPDK's poller accounting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PollStatus {
    Busy,
    Idle,
}

#[derive(Debug, thiserror::Error)]
pub enum PollerError {
    #[error("pollers can only be registered on an SPDK thread")]
    NoThread,
    #[error("spdk_poller_register failed")]
    Register,
}

impl Poller {
    /// Registers `f` on the current SPDK thread.
    pub fn new<F>(name: &CStr, period_us: u64, f: F) -> Result<Poller, PollerError>
    where
        F: FnMut() -> PollStatus + Send + 'static,
    {
        unsafe extern "C" fn trampoline<F: FnMut() -> PollStatus>(arg: *mut c_void) -> c_int {
            // SAFETY: `arg` is the `F` leaked in `Poller::new`; it is freed only by a
            // message after the poller is unregistered (see `Drop`), and SPDK calls a
            // poller on its own thread only, so this is the sole reference.
            let f = unsafe { &mut *arg.cast::<F>() };
            match f() {
                PollStatus::Busy => ffi::spdk_thread_poller_rc::SPDK_POLLER_BUSY.0 as c_int,
                PollStatus::Idle => ffi::spdk_thread_poller_rc::SPDK_POLLER_IDLE.0 as c_int,
            }
        }
        unsafe fn free<F>(arg: *mut c_void) {
            // SAFETY: called once, with the pointer leaked in `Poller::new`.
            drop(unsafe { Box::from_raw(arg.cast::<F>()) });
        }
        let thread = Thread::current().ok_or(PollerError::NoThread)?;
        let ctx = Box::into_raw(Box::new(f)).cast::<c_void>();
        // SAFETY: `ctx` stays valid until `Drop` frees it after unregistering; `name` is
        // copied by SPDK.
        let raw = unsafe {
            ffi::spdk_poller_register_named(Some(trampoline::<F>), ctx, period_us, name.as_ptr())
        };
        if raw.is_null() {
            // SAFETY: not registered, so the context is still ours alone.
            unsafe { free::<F>(ctx) };
            return Err(PollerError::Register);
        }
        Ok(Poller {
            raw,
            ctx,
            free: free::<F>,
            thread,
        })
    }
}

/// Unregisters and frees on the poller's own thread.
///
/// # Safety
/// Must run on the thread that registered `raw`; `ctx`/`free` are the poller's context
/// and its destructor.
unsafe fn unregister_here(
    mut raw: *mut ffi::spdk_poller,
    ctx: *mut c_void,
    free: unsafe fn(*mut c_void),
) {
    // SAFETY: the caller runs on the poller's thread, as SPDK requires.
    unsafe { ffi::spdk_poller_unregister(&mut raw) };
    let thread = Thread::current();
    struct SendCtx(*mut c_void, unsafe fn(*mut c_void));
    // SAFETY: the context is only touched on this same thread, by the message below.
    unsafe impl Send for SendCtx {}
    let deferred = SendCtx(ctx, free);
    // Free after the current callback (if any) has returned: a message runs only once
    // the poller that may be on the stack has finished.
    let sent = thread.map(|t| {
        t.send(move || {
            let d = deferred;
            // SAFETY: unregistered above, and messages never run inside a poller
            // callback, so nothing references the context any more.
            unsafe { (d.1)(d.0) }
        })
    });
    if !matches!(sent, Some(Ok(()))) {
        // No SPDK thread or the message failed (the thread is exiting): leak the small
        // context rather than risk freeing it under a running callback.
        crate::log::leak_note("poller context");
    }
}

impl Drop for Poller {
    fn drop(&mut self) {
        let (raw, ctx, free) = (self.raw, self.ctx, self.free);
        if Thread::current() == Some(self.thread) {
            // SAFETY: we are on the poller's thread.
            unsafe { unregister_here(raw, ctx, free) };
            return;
        }
        struct SendPoller(*mut ffi::spdk_poller, *mut c_void, unsafe fn(*mut c_void));
        // SAFETY: the pointers are used only on the poller's thread, by the message.
        unsafe impl Send for SendPoller {}
        let p = SendPoller(raw, ctx, free);
        let r = self.thread.send(move || {
            let p = p;
            // SAFETY: this message runs on the poller's thread.
            unsafe { unregister_here(p.0, p.1, p.2) };
        });
        if r.is_err() {
            crate::log::leak_note("poller (its thread is gone)");
        }
    }
}

/// A poller whose closure need not be `Send` (it may hold `Rc`s of its thread): the
/// [`LocalPoller`] itself is not `Send`, so it is dropped on the thread that registered
/// it, and the closure never leaves that thread.
#[derive(Debug)]
pub struct LocalPoller {
    _inner: Poller,
    _not_send: std::marker::PhantomData<*const ()>,
}

impl LocalPoller {
    /// Registers `f` on the current SPDK thread.
    pub fn new<F>(name: &CStr, period_us: u64, f: F) -> Result<LocalPoller, PollerError>
    where
        F: FnMut() -> PollStatus + 'static,
    {
        struct OnThisThread<F>(F);
        // SAFETY: the closure is created here, run by the poller on this thread only,
        // and freed by `Poller`'s drop, which runs on this thread (a `LocalPoller` is
        // not `Send`) and frees it by a message to this same thread: it never crosses a
        // thread.
        unsafe impl<F> Send for OnThisThread<F> {}
        impl<F: FnMut() -> PollStatus> OnThisThread<F> {
            fn call(&mut self) -> PollStatus {
                (self.0)()
            }
        }
        let mut f = OnThisThread(f);
        Ok(LocalPoller {
            _inner: Poller::new(name, period_us, move || f.call())?,
            _not_send: std::marker::PhantomData,
        })
    }
}
