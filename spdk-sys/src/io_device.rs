//! io_devices whose per-thread channel context is a Rust value
//! ([`IoDevice::Channel`]), created on the thread that first asks for a channel and
//! dropped on it when the last reference is put.
//!
//! SPDK's context buffer holds a pointer to the boxed channel value, so its size and
//! alignment never depend on the Rust type.

use std::ffi::{CStr, c_int, c_void};
use std::ptr::NonNull;

use crate::ffi;

/// A device with one channel per SPDK thread.
pub trait IoDevice: Sync + 'static {
    type Channel: 'static;
    /// Builds this thread's channel; `None` fails the channel creation.
    fn create_channel(&self) -> Option<Self::Channel>;
    /// Called on the channel's thread when its last reference is put.
    fn destroy_channel(&self, channel: Self::Channel) {
        drop(channel);
    }
    /// Called (on the thread that unregistered the device) once SPDK no longer uses it:
    /// the device may be freed here.
    ///
    /// # Safety
    /// `this` is the pointer given to [`register`]; nothing else references it.
    unsafe fn unregistered(this: *const Self) {
        let _ = this;
    }
}

unsafe extern "C" fn create_cb<D: IoDevice>(dev: *mut c_void, buf: *mut c_void) -> c_int {
    // SAFETY: `dev` is the pointer given to `register`, valid until `unregistered`.
    let dev = unsafe { &*dev.cast::<D>() };
    match dev.create_channel() {
        Some(ch) => {
            let p = Box::into_raw(Box::new(ch));
            // SAFETY: `buf` is SPDK's context buffer of `size_of::<*mut _>()` bytes,
            // allocated with calloc (suitably aligned for a pointer).
            unsafe { buf.cast::<*mut D::Channel>().write(p) };
            0
        }
        None => -libc_enomem(),
    }
}

unsafe extern "C" fn destroy_cb<D: IoDevice>(dev: *mut c_void, buf: *mut c_void) {
    // SAFETY: as in `create_cb`; destroy runs only for channels whose create succeeded,
    // so the buffer holds the pointer written there.
    let (dev, p) = unsafe { (&*dev.cast::<D>(), buf.cast::<*mut D::Channel>().read()) };
    // SAFETY: `p` came from `Box::into_raw` in `create_cb` and is reclaimed once.
    let ch = unsafe { Box::from_raw(p) };
    dev.destroy_channel(*ch);
}

unsafe extern "C" fn unregister_cb<D: IoDevice>(dev: *mut c_void) {
    // SAFETY: SPDK is done with the device; forwarded to its owner.
    unsafe { D::unregistered(dev.cast::<D>()) };
}

const fn libc_enomem() -> c_int {
    12
}

/// Registers `dev` as an io_device named `name`.
///
/// # Safety
/// `dev` must stay at this address, alive, until [`IoDevice::unregistered`] is called
/// after [`unregister`].
pub unsafe fn register<D: IoDevice>(dev: *const D, name: &CStr) {
    // SAFETY: per the contract above; the context size is that of one pointer.
    unsafe {
        ffi::spdk_io_device_register(
            dev.cast_mut().cast(),
            Some(create_cb::<D>),
            Some(destroy_cb::<D>),
            std::mem::size_of::<*mut D::Channel>() as u32,
            name.as_ptr(),
        )
    }
}

/// Unregisters `dev`; [`IoDevice::unregistered`] follows once all channels are gone.
///
/// # Safety
/// `dev` was registered with [`register`] and is not unregistered twice.
pub unsafe fn unregister<D: IoDevice>(dev: *const D) {
    // SAFETY: per the contract above.
    unsafe { ffi::spdk_io_device_unregister(dev.cast_mut().cast(), Some(unregister_cb::<D>)) }
}

/// Gets (a reference on) this thread's channel of `dev`; put it with
/// `spdk_put_io_channel` (SPDK's bdev layer does so for bdev channels).
///
/// # Safety
/// `dev` is registered and the caller is on an SPDK thread.
pub unsafe fn get_channel<D: IoDevice>(dev: *const D) -> Option<NonNull<ffi::spdk_io_channel>> {
    // SAFETY: per the contract above.
    NonNull::new(unsafe { ffi::spdk_get_io_channel(dev.cast_mut().cast()) })
}

/// The channel value behind an SPDK channel of a `D` device.
///
/// # Safety
/// `ch` is a live channel of a device registered with [`register::<D>`], used on its
/// own thread, and stays alive for `'a` (the bdev layer keeps a bdev's channel alive
/// while its I/O is outstanding).
pub unsafe fn channel<'a, D: IoDevice>(ch: *mut ffi::spdk_io_channel) -> &'a D::Channel {
    // The context buffer follows the channel's header, as in SPDK's own static inline
    // `spdk_io_channel_get_ctx` (whose bindgen wrapper is a call per I/O that cannot
    // be inlined; this runs two or three times per I/O).
    // SAFETY: `ch` is live, so its context buffer starts SPDK_IO_CHANNEL_STRUCT_SIZE
    // bytes in, and the buffer of a `D` channel holds the pointer written by
    // `create_cb::<D>`, valid until `destroy_cb`.
    unsafe {
        &*ch.cast::<u8>()
            .add(ffi::SPDK_IO_CHANNEL_STRUCT_SIZE as usize)
            .cast::<*mut D::Channel>()
            .read()
    }
}

type PerChannel<D> = Box<dyn Fn(&D, &<D as IoDevice>::Channel) + Send + Sync>;

struct Iter<D: IoDevice> {
    per_channel: PerChannel<D>,
    done: Box<dyn FnOnce(i32)>,
}

/// Calls `per_channel` on every channel of `dev`, each on its own thread, one after the
/// other; then `done(status)` on the calling thread.
///
/// # Safety
/// `dev` is registered and stays alive until `done` runs; the caller is on an SPDK
/// thread.
pub unsafe fn for_each_channel<D: IoDevice>(
    dev: *const D,
    per_channel: impl Fn(&D, &D::Channel) + Send + Sync + 'static,
    done: impl FnOnce(i32) + 'static,
) {
    unsafe extern "C" fn visit<D: IoDevice>(i: *mut ffi::spdk_io_channel_iter) {
        // SAFETY: SPDK passes the iterator of the walk started below; its ctx is our
        // `Iter<D>`, its device our `D`, and its channel a live `D` channel of this thread.
        unsafe {
            let it = &*ffi::spdk_io_channel_iter_get_ctx(i).cast::<Iter<D>>();
            let dev = &*ffi::spdk_io_channel_iter_get_io_device(i).cast::<D>();
            let ch = channel::<D>(ffi::spdk_io_channel_iter_get_channel(i));
            (it.per_channel)(dev, ch);
            ffi::spdk_for_each_channel_continue(i, 0);
        }
    }
    unsafe extern "C" fn complete<D: IoDevice>(i: *mut ffi::spdk_io_channel_iter, status: c_int) {
        // SAFETY: the walk is over; the ctx is the box leaked below, reclaimed once.
        let it = unsafe { Box::from_raw(ffi::spdk_io_channel_iter_get_ctx(i).cast::<Iter<D>>()) };
        (it.done)(status);
    }
    let it = Box::into_raw(Box::new(Iter::<D> {
        per_channel: Box::new(per_channel),
        done: Box::new(done),
    }));
    // SAFETY: per the contract above; `it` is reclaimed by `complete::<D>`.
    unsafe {
        ffi::spdk_for_each_channel(
            dev.cast_mut().cast(),
            Some(visit::<D>),
            it.cast(),
            Some(complete::<D>),
        )
    }
}
