//! A bdev_io handed to a bdev module, as a value that must be completed exactly once.
//!
//! [`BdevIo`] is neither `Clone` nor `Copy`; every completion method takes it by value,
//! and dropping one that was never completed completes it with a failure (and logs),
//! so an I/O can be neither lost nor completed twice. [`BaseIo`] is the child bdev_io a
//! module got back from the bdev below it; dropping it frees it.

use std::ffi::{c_int, c_void};
use std::ptr::NonNull;

use crate::ffi;
use crate::ffi::spdk_bdev_io_type as T;

/// Options of a `*_blocks_ext` call that pass an upper I/O's block parameters (memory
/// domain, DIF checks, NVMe cdw12/13) through, with `md` as the metadata buffer.
pub fn ext_io_opts(
    b: &ffi::spdk_bdev_io_block_params,
    md: *mut c_void,
) -> ffi::spdk_bdev_ext_io_opts {
    // SAFETY: all-zero is the documented starting point of the options (C code memsets
    // them), and `size` is then set.
    let mut o: ffi::spdk_bdev_ext_io_opts = unsafe { std::mem::zeroed() };
    o.size = std::mem::size_of::<ffi::spdk_bdev_ext_io_opts>();
    o.memory_domain = b.memory_domain;
    o.memory_domain_ctx = b.memory_domain_ctx;
    o.metadata = md;
    o.dif_check_flags_exclude_mask = !b.dif_check_flags;
    o.nvme_cdw12 = b.nvme_cdw12;
    o.nvme_cdw13 = b.nvme_cdw13;
    o
}

/// Final status of a bdev_io.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IoStatus {
    Success,
    Failed,
    Aborted,
    /// Ask the bdev layer to retry later.
    NoMem,
}

impl IoStatus {
    fn raw(self) -> ffi::spdk_bdev_io_status {
        match self {
            IoStatus::Success => ffi::spdk_bdev_io_status::SPDK_BDEV_IO_STATUS_SUCCESS,
            IoStatus::Failed => ffi::spdk_bdev_io_status::SPDK_BDEV_IO_STATUS_FAILED,
            IoStatus::Aborted => ffi::spdk_bdev_io_status::SPDK_BDEV_IO_STATUS_ABORTED,
            IoStatus::NoMem => ffi::spdk_bdev_io_status::SPDK_BDEV_IO_STATUS_NOMEM,
        }
    }
}

/// A bdev_io submitted to this module and not yet completed.
#[derive(Debug)]
pub struct BdevIo(NonNull<ffi::spdk_bdev_io>);

impl BdevIo {
    /// Takes charge of `io`.
    ///
    /// # Safety
    /// `io` is a live bdev_io submitted to this module, not yet completed, and no other
    /// `BdevIo` for it exists (including one turned into a raw pointer that will be
    /// taken back).
    pub unsafe fn from_raw(io: *mut ffi::spdk_bdev_io) -> BdevIo {
        BdevIo(NonNull::new(io).expect("bdev layer passed a null bdev_io"))
    }

    /// Gives up the value without completing it, e.g. to pass it as a callback argument;
    /// take it back with [`BdevIo::from_raw`].
    pub fn into_raw(self) -> *mut ffi::spdk_bdev_io {
        let p = self.0.as_ptr();
        std::mem::forget(self);
        p
    }

    pub fn as_ptr(&self) -> *mut ffi::spdk_bdev_io {
        self.0.as_ptr()
    }

    fn raw(&self) -> &ffi::spdk_bdev_io {
        // SAFETY: live until completed, and completion consumes `self`.
        unsafe { self.0.as_ref() }
    }

    pub fn io_type(&self) -> ffi::spdk_bdev_io_type {
        ffi::spdk_bdev_io_type(self.raw().type_ as u32)
    }

    /// The bdev this I/O was submitted to.
    pub fn bdev(&self) -> *mut ffi::spdk_bdev {
        self.raw().bdev
    }

    /// Block size of the bdev this I/O was submitted to.
    pub fn block_len(&self) -> u32 {
        // SAFETY: the bdev outlives its I/O.
        unsafe { (*self.raw().bdev).blocklen }
    }

    /// Block parameters, for the I/O types that carry them (`u.bdev`): READ, WRITE,
    /// UNMAP, FLUSH, WRITE_ZEROES, COMPARE, COMPARE_AND_WRITE; `None` for the others.
    pub fn block(&self) -> Option<&ffi::spdk_bdev_io_block_params> {
        match self.io_type() {
            T::SPDK_BDEV_IO_TYPE_READ
            | T::SPDK_BDEV_IO_TYPE_WRITE
            | T::SPDK_BDEV_IO_TYPE_UNMAP
            | T::SPDK_BDEV_IO_TYPE_FLUSH
            | T::SPDK_BDEV_IO_TYPE_WRITE_ZEROES
            | T::SPDK_BDEV_IO_TYPE_COMPARE
            | T::SPDK_BDEV_IO_TYPE_COMPARE_AND_WRITE => {
                // SAFETY: the bdev layer fills `u.bdev` for these types (bdev.c), and the
                // parameters live as long as the I/O, which `&self` borrows.
                Some(unsafe { self.raw().u.bdev.as_ref() })
            }
            _ => None,
        }
    }

    /// Bytes the I/O covers (`num_blocks * block_len`); 0 for types without block
    /// parameters.
    pub fn block_bytes(&self) -> u64 {
        self.block()
            .map_or(0, |b| b.num_blocks.saturating_mul(self.block_len() as u64))
    }

    /// The data buffers of a READ, WRITE or COMPARE (empty when the bdev layer has not
    /// attached any yet), borrowed for as long as the I/O.
    pub fn iovs(&self) -> &[ffi::iovec] {
        match self.block() {
            Some(b)
                if matches!(
                    self.io_type(),
                    T::SPDK_BDEV_IO_TYPE_READ
                        | T::SPDK_BDEV_IO_TYPE_WRITE
                        | T::SPDK_BDEV_IO_TYPE_COMPARE
                ) && !b.iovs.is_null()
                    && b.iovcnt > 0 =>
            {
                // SAFETY: for these types `iovs` holds `iovcnt` entries owned by the
                // submitter until the I/O completes, which `&self` outlives.
                unsafe { std::slice::from_raw_parts(b.iovs, b.iovcnt as usize) }
            }
            _ => &[],
        }
    }

    /// NVMe passthru parameters (`NVME_IO`, `NVME_IO_MD`, `NVME_IOV_MD`); `None` for
    /// other types.
    pub fn nvme_passthru(&self) -> Option<&ffi::spdk_bdev_io_nvme_passthru_params> {
        match self.io_type() {
            T::SPDK_BDEV_IO_TYPE_NVME_IO
            | T::SPDK_BDEV_IO_TYPE_NVME_IO_MD
            | T::SPDK_BDEV_IO_TYPE_NVME_IOV_MD => {
                // SAFETY: the bdev layer fills `u.nvme_passthru` for these types; they
                // live as long as the I/O.
                Some(unsafe { self.raw().u.nvme_passthru.as_ref() })
            }
            _ => None,
        }
    }

    /// Issues this I/O, unchanged, to the bdev below: `desc` and its channel `ch`, with
    /// `cb(arg)` as completion. Forwards READ, WRITE, UNMAP, FLUSH, WRITE_ZEROES,
    /// COMPARE and NVMe passthru (with and without metadata); any other type gets
    /// -EINVAL. Returns what SPDK's submit call returned (0: `cb` will run).
    ///
    /// # Safety
    /// On `ch`'s thread, `ch` a channel of `desc`; a READ has its buffers; this I/O is
    /// not completed before `cb` runs when the call returns 0 (SPDK never completes
    /// inside the submit call).
    pub(crate) unsafe fn forward(
        &self,
        desc: *mut ffi::spdk_bdev_desc,
        ch: *mut ffi::spdk_io_channel,
        cb: ffi::spdk_bdev_io_completion_cb,
        arg: *mut c_void,
    ) -> c_int {
        let (b, p) = (self.block(), self.nvme_passthru());
        // SAFETY: (all arms) per the contract above; each arm reads the parameters of
        // its own I/O type, which stay valid until this I/O completes.
        unsafe {
            match (self.io_type(), b, p) {
                (T::SPDK_BDEV_IO_TYPE_READ | T::SPDK_BDEV_IO_TYPE_WRITE, Some(b), _) => {
                    let mut opts = ext_io_opts(b, b.md_buf);
                    let submit = if self.io_type() == T::SPDK_BDEV_IO_TYPE_READ {
                        ffi::spdk_bdev_readv_blocks_ext
                    } else {
                        ffi::spdk_bdev_writev_blocks_ext
                    };
                    submit(
                        desc,
                        ch,
                        b.iovs,
                        b.iovcnt,
                        b.offset_blocks,
                        b.num_blocks,
                        cb,
                        arg,
                        &mut opts,
                    )
                }
                (T::SPDK_BDEV_IO_TYPE_UNMAP, Some(b), _) => {
                    ffi::spdk_bdev_unmap_blocks(desc, ch, b.offset_blocks, b.num_blocks, cb, arg)
                }
                (T::SPDK_BDEV_IO_TYPE_FLUSH, Some(b), _) => {
                    ffi::spdk_bdev_flush_blocks(desc, ch, b.offset_blocks, b.num_blocks, cb, arg)
                }
                (T::SPDK_BDEV_IO_TYPE_WRITE_ZEROES, Some(b), _) => {
                    ffi::spdk_bdev_write_zeroes_blocks(
                        desc,
                        ch,
                        b.offset_blocks,
                        b.num_blocks,
                        cb,
                        arg,
                    )
                }
                (T::SPDK_BDEV_IO_TYPE_COMPARE, Some(b), _) => ffi::spdk_bdev_comparev_blocks(
                    desc,
                    ch,
                    b.iovs,
                    b.iovcnt,
                    b.offset_blocks,
                    b.num_blocks,
                    cb,
                    arg,
                ),
                (T::SPDK_BDEV_IO_TYPE_NVME_IO, _, Some(p)) => {
                    ffi::spdk_bdev_nvme_io_passthru(desc, ch, &p.cmd, p.buf, p.nbytes, cb, arg)
                }
                (T::SPDK_BDEV_IO_TYPE_NVME_IO_MD, _, Some(p)) => {
                    ffi::spdk_bdev_nvme_io_passthru_md(
                        desc, ch, &p.cmd, p.buf, p.nbytes, p.md_buf, p.md_len, cb, arg,
                    )
                }
                (T::SPDK_BDEV_IO_TYPE_NVME_IOV_MD, _, Some(p)) => {
                    ffi::spdk_bdev_nvme_iov_passthru_md(
                        desc, ch, &p.cmd, p.iovs, p.iovcnt, p.nbytes, p.md_buf, p.md_len, cb, arg,
                    )
                }
                _ => -22,
            }
        }
    }

    /// The address of the I/O an `ABORT` asks to abort; `None` for other types. Only an
    /// address, to compare: it may name an I/O this module never saw.
    pub fn abort_target(&self) -> Option<usize> {
        (self.io_type() == T::SPDK_BDEV_IO_TYPE_ABORT).then(|| {
            // SAFETY: the bdev layer fills `u.abort` for ABORT; only the pointer's value
            // is read, never what it points to.
            unsafe { self.raw().u.abort.as_ref().bio_to_abort as usize }
        })
    }

    /// The module's per-I/O context (`get_ctx_size` bytes, 8-byte aligned).
    pub(crate) fn driver_ctx(&self) -> *mut u8 {
        // SAFETY: `driver_ctx` is the flexible array at the end of the live bdev_io;
        // only its address is taken.
        unsafe { std::ptr::addr_of_mut!((*self.0.as_ptr()).driver_ctx).cast::<u8>() }
    }

    pub fn complete(self, status: IoStatus) {
        let p = self.into_raw();
        // SAFETY: completed once: `self` was consumed.
        unsafe { ffi::spdk_bdev_io_complete(p, status.raw()) };
    }

    /// Completes with an NVMe status and completion dword 0 (which nvmf copies into the
    /// NVMe completion it sends to the host).
    pub fn complete_nvme(self, cdw0: u32, sct: u8, sc: u8) {
        let p = self.into_raw();
        // SAFETY: completed once: `self` was consumed.
        unsafe { ffi::spdk_bdev_io_complete_nvme_status(p, cdw0, sct as c_int, sc as c_int) };
    }

    /// Completes with the status of the child I/O `base` (including NVMe status and
    /// dword 0 when the base reported them).
    pub fn complete_like(self, base: &BaseIo) {
        let p = self.into_raw();
        // SAFETY: completed once; `base` is alive (freed when the `BaseIo` drops).
        unsafe { ffi::spdk_bdev_io_complete_base_io_status(p, base.0.as_ptr()) };
    }

    /// Copies `data` into the data buffer of an NVMe passthru I/O (`iovs`, or `buf` for
    /// `NVME_IO`), up to `limit` bytes; returns how many bytes were copied (0 for other
    /// types). The buffer is the submitter's, which owns it for the I/O's lifetime.
    pub fn copy_to_passthru_buf(&mut self, data: &[u8], limit: usize) -> usize {
        let Some(p) = self.nvme_passthru() else {
            return 0;
        };
        let mut left = &data[..data.len().min(limit)];
        let mut copied = 0;
        if !p.iovs.is_null() && p.iovcnt > 0 {
            // SAFETY: `iovs` has `iovcnt` entries, owned by the submitter until the I/O
            // completes (after this call: `&mut self`).
            let iovs = unsafe { std::slice::from_raw_parts(p.iovs, p.iovcnt as usize) };
            for iov in iovs {
                if left.is_empty() {
                    break;
                }
                let n = left.len().min(iov.iov_len);
                if n > 0 && !iov.iov_base.is_null() {
                    // SAFETY: `n` bytes fit in this iovec, a writable buffer of the
                    // submitter; `data` is ours, so the regions are distinct.
                    unsafe {
                        std::ptr::copy_nonoverlapping(left.as_ptr(), iov.iov_base.cast::<u8>(), n)
                    };
                    left = &left[n..];
                    copied += n;
                }
            }
        } else if !p.buf.is_null() {
            let n = left.len().min(p.nbytes);
            // SAFETY: `buf` holds `nbytes` writable bytes of the submitter, distinct from
            // `data`.
            unsafe { std::ptr::copy_nonoverlapping(left.as_ptr(), p.buf.cast::<u8>(), n) };
            copied = n;
        }
        copied
    }

    /// Length of the data buffer of an NVMe passthru I/O: the smaller of `nbytes` and
    /// the buffer actually attached (0 for other types).
    pub fn passthru_buf_len(&self) -> usize {
        let Some(p) = self.nvme_passthru() else {
            return 0;
        };
        if !p.iovs.is_null() && p.iovcnt > 0 {
            // SAFETY: `iovs` has `iovcnt` entries while the I/O lives.
            let iovs = unsafe { std::slice::from_raw_parts(p.iovs, p.iovcnt as usize) };
            iovs.iter().map(|v| v.iov_len).sum::<usize>().min(p.nbytes)
        } else if !p.buf.is_null() {
            p.nbytes
        } else {
            0
        }
    }
}

impl Drop for BdevIo {
    fn drop(&mut self) {
        tracing::error!(
            "bdev_io {:p} dropped without completion; failing it",
            self.0.as_ptr()
        );
        // SAFETY: never completed (every completion path forgets `self`).
        unsafe {
            ffi::spdk_bdev_io_complete(
                self.0.as_ptr(),
                ffi::spdk_bdev_io_status::SPDK_BDEV_IO_STATUS_FAILED,
            )
        };
    }
}

/// The 16 command dwords of an NVMe command (dword 0 holds the opcode in bits 7:0).
pub fn nvme_cmd_dwords(cmd: &ffi::spdk_nvme_cmd) -> [u32; 16] {
    const { assert!(std::mem::size_of::<ffi::spdk_nvme_cmd>() == 64) };
    // SAFETY: `spdk_nvme_cmd` is a plain 64-byte C struct (asserted above); every bit
    // pattern is a valid `[u32; 16]`, and the read is unaligned-tolerant.
    unsafe { std::ptr::read_unaligned((cmd as *const ffi::spdk_nvme_cmd).cast::<[u32; 16]>()) }
}

/// An NVMe command with the given 16 dwords (dword 0: opcode in bits 7:0, flags and
/// command id above; the driver fills the command id, and bdev_nvme the NSID).
pub fn nvme_cmd_from_dwords(dw: [u32; 16]) -> ffi::spdk_nvme_cmd {
    const { assert!(std::mem::size_of::<ffi::spdk_nvme_cmd>() == 64) };
    // SAFETY: `spdk_nvme_cmd` is a plain 64-byte C struct of integers, integer unions and
    // integer bitfields (asserted size), so every bit pattern is a valid value.
    unsafe { std::mem::transmute::<[u32; 16], ffi::spdk_nvme_cmd>(dw) }
}

/// The NVMe view of a completed I/O's status (`spdk_bdev_io_get_nvme_status`): a
/// non-NVMe failure reads as generic Internal Device Error, an abort as generic
/// Aborted by Request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct NvmeStatus {
    pub cdw0: u32,
    /// Status code type (0: generic command status).
    pub sct: u8,
    pub sc: u8,
}

/// A child bdev_io this module submitted to another bdev, handed back in its
/// completion callback. Dropping it frees it (`spdk_bdev_free_io`).
#[derive(Debug)]
pub struct BaseIo(NonNull<ffi::spdk_bdev_io>);

impl BaseIo {
    /// # Safety
    /// `io` is the bdev_io passed to a completion callback, freed by nobody else.
    pub unsafe fn from_raw(io: *mut ffi::spdk_bdev_io) -> BaseIo {
        BaseIo(NonNull::new(io).expect("bdev layer passed a null bdev_io"))
    }
}

impl BaseIo {
    pub fn as_ptr(&self) -> *mut ffi::spdk_bdev_io {
        self.0.as_ptr()
    }

    /// Its status as NVMe status and completion dword 0.
    pub fn nvme_status(&self) -> NvmeStatus {
        let (mut cdw0, mut sct, mut sc) = (0u32, 0 as c_int, 0 as c_int);
        // SAFETY: a completed bdev_io, alive until this value drops; valid out-pointers.
        unsafe { ffi::spdk_bdev_io_get_nvme_status(self.0.as_ptr(), &mut cdw0, &mut sct, &mut sc) };
        NvmeStatus {
            cdw0,
            sct: sct as u8,
            sc: sc as u8,
        }
    }
}

impl Drop for BaseIo {
    fn drop(&mut self) {
        // SAFETY: completed child I/O, freed exactly once here.
        unsafe { ffi::spdk_bdev_free_io(self.0.as_ptr()) };
    }
}
