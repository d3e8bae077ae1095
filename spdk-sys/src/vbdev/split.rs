//! An upper READ or WRITE that the module sends to the base in pieces ([`Split`]): the
//! module decides which blocks go when (pacing, admission), this type owns what must
//! outlive the pieces at the base: the upper I/O (so its buffers), each piece's
//! scatter-gather list, and the count of pieces out. It is shared by `Rc`: every piece
//! at the base holds one, so the split outlives its pieces, and the upper I/O can be
//! taken out (to complete it) only when no piece is out.
//!
//! Every piece is sent with the split's address as callback argument, so one base
//! ABORT ([`Split::victim`]) names all of them.

use std::cell::{Cell, RefCell};
use std::ffi::{c_int, c_void};
use std::rc::Rc;

use crate::bdev_io::{BaseIo, ext_io_opts};
use crate::ffi::{self, spdk_bdev_io_type as T};

use super::io::{Io, IoId, Victim};
use super::{Vbdev, channel};

/// What the module does when a piece comes back from the base: its channel, the split,
/// the base's child I/O and success.
pub type PieceDone<P, S> = fn(&<P as Vbdev>::Channel, Rc<Split<P, S>>, BaseIo, bool);

/// Why a piece was not sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PieceError {
    #[error("the piece is not inside the I/O's blocks and buffers")]
    OutOfRange,
    #[error("the I/O was already taken out of the split")]
    Finished,
    /// SPDK refused it (e.g. -ENOMEM: no bdev_io free at the base).
    #[error("the base refused the piece: error {0}")]
    Refused(c_int),
}

/// One segment of a piece: `len` bytes at `offset` in the upper I/O's buffer `index`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Seg {
    pub index: usize,
    pub offset: usize,
    pub len: usize,
}

/// See the module documentation. `S` is the module's own state of the transfer.
pub struct Split<P: Vbdev, S> {
    io: RefCell<Option<Io<P>>>,
    /// The upper channel (the I/O's), for completions.
    ch: *mut ffi::spdk_io_channel,
    write: bool,
    block_len: u64,
    offset_blocks: u64,
    num_blocks: u64,
    /// Separate metadata and its bytes per block (null / 0 when none or interleaved).
    md_buf: *mut c_void,
    md_len: u64,
    /// The pieces' iovecs, one after another. Reserved once for the pieces announced to
    /// [`Split::with_pieces`] and never grown past that, so it never moves: the
    /// iovecs of a piece at the base stay where SPDK was told they are.
    iovs: RefCell<Vec<ffi::iovec>>,
    /// The iovec arrays of pieces that did not fit (more pieces than announced, or
    /// resent ones), each boxed on its own, kept until the split drops.
    overflow: RefCell<Vec<Box<[ffi::iovec]>>>,
    at_base: Cell<u64>,
    done: PieceDone<P, S>,
    state: S,
}

impl<P: Vbdev, S> std::fmt::Debug for Split<P, S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Split")
            .field("offset_blocks", &self.offset_blocks)
            .field("num_blocks", &self.num_blocks)
            .field("at_base", &self.at_base.get())
            .finish_non_exhaustive()
    }
}

impl<P: Vbdev, S> Split<P, S> {
    /// Takes charge of a READ or WRITE with its buffers; `done` gets each piece back.
    /// Any other I/O comes back.
    pub fn new(io: Io<P>, state: S, done: PieceDone<P, S>) -> Result<Rc<Self>, Io<P>> {
        Self::with_pieces(io, state, done, 0)
    }

    /// As [`Split::new`], with room for the iovecs of `pieces` pieces reserved at once:
    /// pieces cut in order from the I/O's buffers need at most `pieces` + the number of
    /// its buffers iovecs together, and then sending one allocates nothing.
    pub fn with_pieces(
        io: Io<P>,
        state: S,
        done: PieceDone<P, S>,
        pieces: usize,
    ) -> Result<Rc<Self>, Io<P>> {
        let write = match io.io_type() {
            T::SPDK_BDEV_IO_TYPE_WRITE => true,
            T::SPDK_BDEV_IO_TYPE_READ => false,
            _ => return Err(io),
        };
        let Some(b) = io.block() else {
            return Err(io);
        };
        let (offset_blocks, num_blocks, md_buf) = (b.offset_blocks, b.num_blocks, b.md_buf);
        if io.iovs().is_empty() {
            return Err(io);
        }
        let (block_len, md_len, md_interleave) = io.node().geometry();
        let md_len = if md_interleave || md_buf.is_null() {
            0
        } else {
            md_len as u64
        };
        let block_len = block_len as u64;
        let room = if pieces == 0 {
            0
        } else {
            pieces.saturating_add(io.iovs().len())
        };
        Ok(Rc::new(Split {
            ch: io.raw_channel(),
            io: RefCell::new(Some(io)),
            write,
            block_len,
            offset_blocks,
            num_blocks,
            md_buf,
            md_len,
            iovs: RefCell::new(Vec::with_capacity(room)),
            overflow: RefCell::new(Vec::new()),
            at_base: Cell::new(0),
            done,
            state,
        }))
    }

    /// The module's state of the transfer.
    pub fn state(&self) -> &S {
        &self.state
    }

    /// Whether `id` is this split's upper I/O (while it is inside).
    pub fn is(&self, id: IoId) -> bool {
        self.io.borrow().as_ref().is_some_and(|io| io.id() == id)
    }

    /// The callback argument of every piece sent to the base.
    pub fn victim(self: &Rc<Self>) -> Victim {
        Victim(Rc::as_ptr(self) as usize)
    }

    /// Pieces at the base now.
    pub fn at_base(&self) -> u64 {
        self.at_base.get()
    }

    /// The upper I/O, to complete it, once no piece is at the base (else `None`, and
    /// it stays inside); `None` as well once it was taken.
    pub fn take_io(&self) -> Option<Io<P>> {
        if self.at_base.get() > 0 {
            return None;
        }
        self.io.borrow_mut().take()
    }

    /// Sends blocks `offset_blocks .. offset_blocks + num_blocks` of the upper I/O to
    /// the base as one piece, with the data at `segs` (which must cover exactly those
    /// blocks' bytes, inside the upper buffers).
    pub fn send(
        self: &Rc<Self>,
        offset_blocks: u64,
        num_blocks: u64,
        segs: impl IntoIterator<Item = Seg>,
    ) -> Result<(), PieceError> {
        let (iov_ptr, mut opts) = {
            let g = self.io.borrow();
            let io = g.as_ref().ok_or(PieceError::Finished)?;
            let upper = io.iovs();
            let in_blocks = offset_blocks >= self.offset_blocks
                && num_blocks > 0
                && offset_blocks - self.offset_blocks + num_blocks <= self.num_blocks;
            if !in_blocks {
                return Err(PieceError::OutOfRange);
            }
            let mut arena = self.iovs.borrow_mut();
            let first = arena.len();
            // Pushed into the arena while it has room (so it never reallocates), else
            // into a vector of their own.
            let mut spill: Option<Vec<ffi::iovec>> = None;
            let mut total = 0usize;
            for s in segs {
                let Some(v) = upper.get(s.index) else {
                    arena.truncate(first);
                    return Err(PieceError::OutOfRange);
                };
                if s.offset
                    .checked_add(s.len)
                    .is_none_or(|end| end > v.iov_len)
                {
                    arena.truncate(first);
                    return Err(PieceError::OutOfRange);
                }
                total += s.len;
                let iov = ffi::iovec {
                    // Inside the upper buffer (checked above); address arithmetic only.
                    iov_base: v.iov_base.cast::<u8>().wrapping_add(s.offset).cast(),
                    iov_len: s.len,
                };
                match spill.as_mut() {
                    Some(own) => own.push(iov),
                    None if arena.len() < arena.capacity() => arena.push(iov),
                    None => {
                        let mut own: Vec<ffi::iovec> = arena.drain(first..).collect();
                        own.push(iov);
                        spill = Some(own);
                    }
                }
            }
            if total as u64 != num_blocks * self.block_len {
                arena.truncate(first);
                return Err(PieceError::OutOfRange);
            }
            let md = if self.md_len == 0 {
                self.md_buf
            } else {
                let skip = (offset_blocks - self.offset_blocks) * self.md_len;
                self.md_buf.cast::<u8>().wrapping_add(skip as usize).cast()
            };
            let b = io.block().ok_or(PieceError::Finished)?;
            let iov_ptr = match spill {
                None => {
                    let n = arena.len() - first;
                    (arena[first..].as_mut_ptr(), n as c_int)
                }
                Some(own) => {
                    let mut own = own.into_boxed_slice();
                    let ptr = (own.as_mut_ptr(), own.len() as c_int);
                    self.overflow.borrow_mut().push(own);
                    ptr
                }
            };
            (iov_ptr, ext_io_opts(b, md))
        };
        // SAFETY: the upper channel is alive while its I/O (inside, checked above) is
        // outstanding; on its thread (`Split` is not `Send`).
        let c = unsafe { channel::<P>(self.ch) };
        let base = P::base_channel(c);
        let arg = Rc::into_raw(self.clone()).cast_mut().cast::<c_void>();
        self.at_base.set(self.at_base.get() + 1);
        let submit = if self.write {
            ffi::spdk_bdev_writev_blocks_ext
        } else {
            ffi::spdk_bdev_readv_blocks_ext
        };
        // SAFETY: valid descriptor and channel on this thread. The iovecs lie inside
        // the upper I/O's buffers (checked above), which live until the upper I/O is
        // completed, which `take_io` refuses while this piece is out. The iovec array is
        // either in `iovs`, which is only ever pushed to below its reserved capacity
        // (so it never reallocates) and never shrunk below a sent piece (a failed piece
        // truncates only its own entries, pushed after every sent one), or a boxed
        // slice kept in `overflow` (never removed); both live until the split drops,
        // which the `Rc` in `arg` defers past this piece's completion.
        // `piece_done::<P, S>` takes that `Rc` back once, and only when the call
        // returns 0.
        let rc = unsafe {
            submit(
                base.desc_ptr(),
                base.as_ptr(),
                iov_ptr.0,
                iov_ptr.1,
                offset_blocks,
                num_blocks,
                Some(piece_done::<P, S>),
                arg,
                &mut opts,
            )
        };
        if rc != 0 {
            self.at_base.set(self.at_base.get() - 1);
            // SAFETY: not submitted: the `Rc` given up above is still ours.
            drop(unsafe { Rc::from_raw(arg.cast::<Split<P, S>>().cast_const()) });
            return Err(PieceError::Refused(rc));
        }
        Ok(())
    }
}

unsafe extern "C" fn piece_done<P: Vbdev, S>(
    base: *mut ffi::spdk_bdev_io,
    success: bool,
    arg: *mut c_void,
) {
    // SAFETY: `arg` is the `Rc` given up in `send` for this piece, taken back once here;
    // `base` is the completed child, freed by `BaseIo`.
    let (split, base) = unsafe {
        (
            Rc::from_raw(arg.cast::<Split<P, S>>().cast_const()),
            BaseIo::from_raw(base),
        )
    };
    split.at_base.set(split.at_base.get().saturating_sub(1));
    // SAFETY: the upper I/O is still inside (it cannot be taken while a piece is out),
    // so its channel is alive; same thread.
    let ch = unsafe { channel::<P>(split.ch) };
    let done = split.done;
    done(ch, split, base, success);
}
