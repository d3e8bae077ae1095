//! DMA-able memory from SPDK's environment (`spdk_dma_zmalloc`), owned by a Rust value:
//! dropping a [`DmaBuf`] frees it with `spdk_dma_free`.
//!
//! A buffer lent to a device (its pointer passed to an NVMe command) must not be read or
//! dropped before that command completes; the `unsafe` submission call that takes the
//! pointer carries that obligation.

use std::ptr::NonNull;

use crate::ffi;

/// A zero-initialised, DMA-able buffer.
#[derive(Debug)]
pub struct DmaBuf {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: plain memory owned by this value; SPDK's allocator may free it from any thread.
unsafe impl Send for DmaBuf {}

impl DmaBuf {
    /// Allocates `len` zeroed bytes aligned to `align` (a power of two, or 0 for the
    /// allocator's default). `None` when SPDK's memory is exhausted or `len` is 0.
    pub fn zeroed(len: usize, align: usize) -> Option<DmaBuf> {
        if len == 0 || (align != 0 && !align.is_power_of_two()) {
            return None;
        }
        // SAFETY: plain allocation; a null `unused` pointer is allowed by env.h.
        let p = unsafe { ffi::spdk_dma_zmalloc(len, align, std::ptr::null_mut()) };
        NonNull::new(p.cast::<u8>()).map(|ptr| DmaBuf { ptr, len })
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The buffer's address, to lend to a device (see the module documentation).
    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// The buffer's contents (zeroed at allocation, or what a completed command wrote).
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `len` initialised (zeroed) bytes owned by `self`.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for DmaBuf {
    fn drop(&mut self) {
        // SAFETY: allocated by spdk_dma_zmalloc in `zeroed`, freed exactly once here.
        unsafe { ffi::spdk_dma_free(self.ptr.as_ptr().cast()) };
    }
}
