//! SPDK threads (`struct spdk_thread`) and messages between them.

use std::ffi::c_void;
use std::ptr::NonNull;

use crate::ffi;

/// A handle on an SPDK thread. SPDK threads live until the application stops; the
/// handle is only used to send messages to them, which SPDK allows from any thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Thread(NonNull<ffi::spdk_thread>);

// SAFETY: the only operation on a `Thread` from another thread is
// `spdk_thread_send_msg`, which SPDK documents as callable from any thread (a lockless
// multi-producer ring).
unsafe impl Send for Thread {}
// SAFETY: as above; the handle is an immutable pointer.
unsafe impl Sync for Thread {}

/// The target thread refused the message (it is exiting, or out of memory).
#[derive(Debug, thiserror::Error)]
#[error("spdk_thread_send_msg failed with {0}")]
pub struct SendError(pub i32);

impl Thread {
    /// The SPDK thread running the caller, if any.
    pub fn current() -> Option<Thread> {
        // SAFETY: reads a thread-local; no arguments.
        NonNull::new(unsafe { ffi::spdk_get_thread() }).map(Thread)
    }

    /// The application thread (the one running RPCs, module init and `save_config`).
    pub fn app() -> Option<Thread> {
        // SAFETY: reads a global set at thread-library init; no arguments.
        NonNull::new(unsafe { ffi::spdk_thread_get_app_thread() }).map(Thread)
    }

    /// Whether the caller runs on the application thread.
    pub fn on_app_thread() -> bool {
        // SAFETY: a null argument means "the current thread", as documented in thread.h.
        unsafe { ffi::spdk_thread_is_app_thread(std::ptr::null_mut()) }
    }

    pub fn as_ptr(self) -> *mut ffi::spdk_thread {
        self.0.as_ptr()
    }

    /// Runs `f` on this thread, later (never inline). On error `f` is dropped unrun.
    pub fn send<F: FnOnce() + Send + 'static>(self, f: F) -> Result<(), SendError> {
        unsafe extern "C" fn trampoline<F: FnOnce()>(arg: *mut c_void) {
            // SAFETY: `arg` is the `Box<F>` leaked by `send` below and SPDK calls each
            // message exactly once.
            let f = unsafe { Box::from_raw(arg.cast::<F>()) };
            f();
        }
        let arg = Box::into_raw(Box::new(f)).cast::<c_void>();
        // SAFETY: the thread pointer is valid for the application's lifetime; `arg` is a
        // valid leaked box that `trampoline::<F>` reclaims.
        let rc = unsafe { ffi::spdk_thread_send_msg(self.as_ptr(), Some(trampoline::<F>), arg) };
        if rc != 0 {
            // SAFETY: SPDK did not take the message, so the box is still ours.
            drop(unsafe { Box::from_raw(arg.cast::<F>()) });
            return Err(SendError(rc));
        }
        Ok(())
    }
}
