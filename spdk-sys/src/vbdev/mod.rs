//! The skeleton of a stacked virtual bdev (one upper bdev on one base bdev), shaped
//! like SPDK's `module/bdev/passthru`. An upper module implements [`Vbdev`]: its
//! per-bdev policy state (the `Self` value inside each [`Node`]), its per-thread
//! [`Vbdev::Channel`], and what to do with each submitted I/O. This layer owns the
//! rest: the base descriptor and its claim ([`Base`], shared by the upper bdevs on one
//! base when the module asks for it), the bdev function table, geometry and UUID, the
//! io_device and its channels (with a per-channel poller), `dump_info_json` and
//! `write_config_json`, the list of live bdevs ([`Vbdevs`]), and the ordered delete:
//! mark deleting, drain every channel, unregister the bdev, unlink it at `destruct`,
//! unregister the io_device, free the node once its last channel is gone, and close
//! the base after its last channel.

mod base;
mod io;
mod split;

pub use base::{Base, BaseChannel, BaseError, BaseHints, RequestId};
pub use io::{BaseDone, Io, IoId, Retry, Victim};
pub use split::{PieceDone, PieceError, Seg, Split};

use std::cell::UnsafeCell;
use std::collections::BTreeMap;
use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};

use serde_json::{Value, json};

use crate::bdev_io::IoStatus;
use crate::ffi::{self, spdk_bdev_io_type as T};
use crate::io_device::{self, IoDevice};
use crate::json::JsonWriter;
use crate::module::{BdevModule, Loading};
use crate::poller::{PollStatus, Poller};
use crate::rpc::{RpcError, RpcRequest, check_name, code};

/// An upper module's policy: one value per upper bdev (shared by its channels, so
/// `Sync`), and one [`Vbdev::Channel`] per (bdev, thread).
pub trait Vbdev: Send + Sync + Sized + 'static {
    type Channel: 'static;
    /// The module's per-I/O context ([`Io::ctx`]), `Default` when the I/O is
    /// submitted. It lives in the bdev_io and is never dropped (no drop glue allowed),
    /// and is only ever borrowed shared: mutable fields are `Cell`s.
    type IoCtx: Default + 'static;
    /// Names the module's bdevs in messages ("QoS bdev").
    const KIND: &'static str;
    const PRODUCT: &'static CStr;
    /// Name space of the UUIDs derived from the base's UUID and the bdev's name.
    const UUID_NAMESPACE: &'static CStr;
    /// Key of the bdev's object in `bdev_get_bdevs` (`dump_info_json`).
    const INFO_KEY: &'static CStr;
    /// The RPC that re-creates a bdev in `save_config` (with [`Vbdev::create_params`]).
    const CREATE_METHOD: &'static str;
    /// One base descriptor for all upper bdevs on a base (else one bdev per base).
    const SHARED_BASE: bool;
    const BASE_HINTS: BaseHints;
    /// Logged when the base goes away and the bdev is deleted with it.
    const BASE_REMOVED: &'static str;
    /// The per-channel poller: name and period (0: every reactor iteration).
    const POLLER: &'static CStr;
    const POLL_US: u64;

    fn module() -> &'static BdevModule;
    /// Runs `f` on the module's list of bdevs (app thread; the caller holds no lock
    /// that `f`'s caller takes).
    fn with_vbdevs<R>(f: impl FnOnce(&mut Vbdevs<Self>) -> R) -> R;

    /// Builds this thread's channel on `base`; `None` fails the channel creation. The
    /// channel may keep the node (`Arc`).
    fn new_channel(node: &Arc<Node<Self>>, base: BaseChannel) -> Option<Self::Channel>;
    /// The base channel a channel sends I/O through.
    fn base_channel(ch: &Self::Channel) -> &BaseChannel;
    /// The channel's poller body.
    fn poll(ch: &Self::Channel) -> PollStatus;
    /// Called on the channel's thread when its last reference is put (its poller is
    /// already gone).
    fn drop_channel(node: &Node<Self>, ch: Box<Self::Channel>) {
        let _ = node;
        drop(ch);
    }
    /// Delete: this channel lets go of what it holds (the bdev is `deleting`).
    fn drain(ch: &Self::Channel);
    /// Handles one submitted I/O: completes it exactly once, now or later.
    fn submit(ch: &Self::Channel, io: Io<Self>);
    /// A READ sent through [`Io::get_read_buf`] has its buffer (`success`), or could
    /// not get one; on the I/O's channel.
    fn read_buf_ready(ch: &Self::Channel, io: Io<Self>, success: bool);
    /// I/O types beyond READ, WRITE, UNMAP, FLUSH, WRITE_ZEROES, COMPARE (as the base)
    /// and RESET (always).
    fn io_type_supported(node: &Node<Self>, t: T) -> bool;
    fn info_json(node: &Node<Self>) -> Value;
    /// Parameters of [`Vbdev::CREATE_METHOD`] that rebuild the bdev as it is now.
    fn create_params(node: &Node<Self>) -> Value;
    /// At `destruct`, once the bdev is unlinked: the module's own bookkeeping.
    fn destroyed(node: &Node<Self>) {
        let _ = node;
    }
    /// The module's `module_fini` (the bdev layer is finishing; its bdevs are gone).
    fn module_fini() {}
    /// The module's `fini_start` (the bdev layer starts to finish).
    fn fini_start() {}
    /// The module's own `save_config` lines (`{"method", "params"}` objects), written
    /// before the per-bdev section.
    fn module_config() -> Vec<Value> {
        Vec::new()
    }
}

/// One upper bdev: the `spdk_bdev` SPDK sees, its base, and the module's policy value
/// (reached through `Deref`). Its address is the bdev's `ctxt` and the io_device id. It
/// lives in an `Arc`: SPDK's reference is released when the io_device is gone, and a
/// channel may hold another ([`Node::arc`]).
pub struct Node<P: Vbdev> {
    /// Written before registration, then only by SPDK.
    bdev: UnsafeCell<ffi::spdk_bdev>,
    fn_table: ffi::spdk_bdev_fn_table,
    name: CString,
    base: Arc<Base>,
    uuid: String,
    deleting: AtomicBool,
    policy: P,
}

// SAFETY: `bdev` is never read or written by Rust after registration (only its address
// is handed to SPDK, which synchronises its own fields); every other field is immutable
// after construction, atomic, or `Sync` itself (`P: Sync`).
unsafe impl<P: Vbdev> Sync for Node<P> {}
// SAFETY: as above; the node is freed once SPDK has released it.
unsafe impl<P: Vbdev> Send for Node<P> {}

impl<P: Vbdev> std::fmt::Debug for Node<P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Node")
            .field("name", &self.name)
            .field("base", &self.base.name())
            .finish()
    }
}

impl<P: Vbdev> std::ops::Deref for Node<P> {
    type Target = P;
    fn deref(&self) -> &P {
        &self.policy
    }
}

impl<P: Vbdev> Node<P> {
    pub fn name(&self) -> &str {
        self.name.to_str().unwrap_or("?")
    }
    pub fn base(&self) -> &Arc<Base> {
        &self.base
    }
    pub fn base_name(&self) -> &str {
        self.base.name()
    }
    pub fn uuid(&self) -> &str {
        &self.uuid
    }
    /// Deletion has started: the policy lets new I/O through and holds nothing.
    pub fn is_deleting(&self) -> bool {
        self.deleting.load(Ordering::Relaxed)
    }
    fn bdev_ptr(&self) -> *mut ffi::spdk_bdev {
        self.bdev.get()
    }
    /// Block size, separate metadata bytes per block, and whether metadata is
    /// interleaved (the base's, copied at registration).
    pub(crate) fn geometry(&self) -> (u32, u32, bool) {
        let b = self.bdev_ptr();
        // SAFETY: these fields are written before registration and never changed by
        // SPDK afterwards; read by value through the raw pointer (no reference to a
        // struct SPDK updates).
        unsafe { ((*b).blocklen, (*b).md_len, (*b).md_interleave) }
    }
    /// Another handle on this node.
    pub fn arc(&self) -> Arc<Node<P>> {
        let p: *const Node<P> = self;
        // SAFETY: every node is built by `register` inside an `Arc` whose strong count
        // stays at least 1 until `unregistered`, and `&self` proves it is not there yet;
        // the count is incremented before the new handle is made.
        unsafe {
            Arc::increment_strong_count(p);
            Arc::from_raw(p)
        }
    }
}

/// A pointer to a live node, kept in the module's [`Vbdevs`].
struct NodePtr<P: Vbdev>(*const Node<P>);
impl<P: Vbdev> Clone for NodePtr<P> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<P: Vbdev> Copy for NodePtr<P> {}
// SAFETY: nodes are `Sync`; the list drops its pointer at `destruct`, before the node
// is freed.
unsafe impl<P: Vbdev> Send for NodePtr<P> {}

struct Entry<P: Vbdev> {
    node: NodePtr<P>,
    deleting: bool,
}

/// The module's live bdevs by name, and (with [`Vbdev::SHARED_BASE`]) its open bases.
/// Kept by the module (in its own registry) and reached through
/// [`Vbdev::with_vbdevs`]; app thread only.
pub struct Vbdevs<P: Vbdev> {
    bdevs: BTreeMap<String, Entry<P>>,
    bases: BTreeMap<String, Weak<Base>>,
}

impl<P: Vbdev> std::fmt::Debug for Vbdevs<P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.bdevs.keys()).finish()
    }
}

impl<P: Vbdev> Default for Vbdevs<P> {
    fn default() -> Self {
        Self::new()
    }
}

impl<P: Vbdev> Vbdevs<P> {
    pub const fn new() -> Self {
        Vbdevs {
            bdevs: BTreeMap::new(),
            bases: BTreeMap::new(),
        }
    }

    /// A live bdev by name.
    pub fn get(&self, name: &str) -> Option<&Node<P>> {
        // SAFETY: listed nodes are alive: a node is unlinked (at `destruct`, under the
        // same borrow discipline) before it is freed, and freeing runs on the app thread,
        // which is the one borrowing `self`.
        self.bdevs.get(name).map(|e| unsafe { &*e.node.0 })
    }

    pub fn contains(&self, name: &str) -> bool {
        self.bdevs.contains_key(name)
    }

    /// Every live bdev, by name, with whether its deletion has started.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Node<P>, bool)> {
        // SAFETY: as in `get`.
        self.bdevs
            .iter()
            .map(|(n, e)| (n.as_str(), unsafe { &*e.node.0 }, e.deleting))
    }
}

// ---- the function table ---------------------------------------------------------

/// # Safety
/// `ctx` is the `ctxt` of one of `P`'s bdevs.
unsafe fn node<'a, P: Vbdev>(ctx: *mut c_void) -> &'a Node<P> {
    // SAFETY: our bdevs' `ctxt` is their node, alive while SPDK calls the fn table.
    unsafe { &*ctx.cast::<Node<P>>() }
}

unsafe extern "C" fn submit_request<P: Vbdev>(
    ch: *mut ffi::spdk_io_channel,
    raw: *mut ffi::spdk_bdev_io,
) {
    // SAFETY: SPDK passes a fresh I/O of one of our bdevs (its `driver_ctx` sized by
    // the module's `get_ctx_size`, `ctx_size::<P>`), which we own until completed, and
    // a live channel of its io_device on this thread.
    let (io, c) = unsafe { (Io::<P>::start(raw, ch), channel::<P>(ch)) };
    P::submit(c, io);
}

unsafe extern "C" fn io_type_supported<P: Vbdev>(ctx: *mut c_void, t: T) -> bool {
    // SAFETY: called by SPDK on one of our bdevs.
    let n = unsafe { node::<P>(ctx) };
    match t {
        T::SPDK_BDEV_IO_TYPE_READ
        | T::SPDK_BDEV_IO_TYPE_WRITE
        | T::SPDK_BDEV_IO_TYPE_UNMAP
        | T::SPDK_BDEV_IO_TYPE_FLUSH
        | T::SPDK_BDEV_IO_TYPE_WRITE_ZEROES
        | T::SPDK_BDEV_IO_TYPE_COMPARE => n.base.supports(t),
        T::SPDK_BDEV_IO_TYPE_RESET => true,
        _ => P::io_type_supported(n, t),
    }
}

unsafe extern "C" fn get_io_channel<P: Vbdev>(ctx: *mut c_void) -> *mut ffi::spdk_io_channel {
    // SAFETY: our node is a registered io_device; the bdev layer calls this on an SPDK
    // thread and puts the channel when done.
    unsafe {
        let n: *const Node<P> = node::<P>(ctx);
        io_device::get_channel(n).map_or(std::ptr::null_mut(), |c| c.as_ptr())
    }
}

unsafe extern "C" fn get_memory_domains<P: Vbdev>(
    ctx: *mut c_void,
    domains: *mut *mut ffi::spdk_memory_domain,
    size: c_int,
) -> c_int {
    // SAFETY: a stacked bdev moves no data itself (it passes the upper buffers, or
    // sub-ranges of them, down), so it supports the base's memory domains, as passthru
    // does; SPDK's arguments pass through.
    unsafe { node::<P>(ctx).base.memory_domains(domains, size) }
}

unsafe extern "C" fn dump_info_json<P: Vbdev>(
    ctx: *mut c_void,
    w: *mut ffi::spdk_json_write_ctx,
) -> c_int {
    // SAFETY: called by SPDK on one of our bdevs with a live writer inside an object.
    let (n, mut w) = unsafe { (node::<P>(ctx), JsonWriter::from_raw(w)) };
    w.named_value(P::INFO_KEY, &P::info_json(n));
    0
}

/// `save_config`: one create call per bdev, in the per-bdev section, which SPDK writes
/// after every module's own lines (so after the base's creation).
unsafe extern "C" fn write_config_json<P: Vbdev>(
    bdev: *mut ffi::spdk_bdev,
    w: *mut ffi::spdk_json_write_ctx,
) {
    // SAFETY: `bdev` is one of ours (SPDK calls our fn table only for our bdevs); its
    // `ctxt` is the node. The writer is live and positioned inside the config array.
    let (n, mut w) = unsafe { (node::<P>((*bdev).ctxt), JsonWriter::from_raw(w)) };
    w.value(&json!({"method": P::CREATE_METHOD, "params": P::create_params(n)}));
}

/// Synchronous: everything it does is done when it returns 0, so SPDK's
/// `spdk_bdev_destruct_done` (for a destruct that returns 1 and finishes later) is not
/// used; what outlives it (the io_device, the node, the base) is released by the
/// io_device's unregistration and the handles.
unsafe extern "C" fn destruct<P: Vbdev>(ctx: *mut c_void) -> c_int {
    let ptr = ctx.cast::<Node<P>>().cast_const();
    // SAFETY: called by SPDK once, when every descriptor of the bdev is closed; the node
    // is alive until `unregistered` frees it.
    let n = unsafe { &*ptr };
    P::with_vbdevs(|v| v.bdevs.remove(n.name()));
    P::destroyed(n);
    // The base is closed when the node and its channels have dropped their handles.
    tracing::info!(bdev = n.name(), "{} destroyed", P::KIND);
    // SAFETY: registered in `register`, unregistered once here; `unregistered` frees it.
    unsafe { io_device::unregister(ptr) };
    0
}

const fn fn_table<P: Vbdev>() -> ffi::spdk_bdev_fn_table {
    ffi::spdk_bdev_fn_table {
        destruct: Some(destruct::<P>),
        submit_request: Some(submit_request::<P>),
        io_type_supported: Some(io_type_supported::<P>),
        get_io_channel: Some(get_io_channel::<P>),
        dump_info_json: Some(dump_info_json::<P>),
        write_config_json: Some(write_config_json::<P>),
        get_spin_time: None,
        get_module_ctx: None,
        get_memory_domains: Some(get_memory_domains::<P>),
        reset_device_stat: None,
        dump_device_stat_json: None,
        accel_sequence_supported: None,
    }
}

// ---- channels ---------------------------------------------------------------------

/// What the io_device keeps per thread: the module's channel (boxed: its address is
/// stable for the poller and for callbacks) and its poller.
pub struct Slot<P: Vbdev> {
    /// Declared first: dropped (unregistered) before the channel.
    poller: Option<Poller>,
    ch: Option<Box<P::Channel>>,
}

impl<P: Vbdev> std::fmt::Debug for Slot<P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Slot").finish_non_exhaustive()
    }
}

/// What the poller closure holds: the channel's heap address.
struct ChannelPtr<C>(*const C);
// SAFETY: the poller runs only on the thread that registered it, which is the
// channel's thread; the pointer is never dereferenced elsewhere.
unsafe impl<C> Send for ChannelPtr<C> {}
impl<C> ChannelPtr<C> {
    fn get(&self) -> *const C {
        self.0
    }
}

impl<P: Vbdev> IoDevice for Node<P> {
    type Channel = Slot<P>;
    fn create_channel(&self) -> Option<Slot<P>> {
        let Some(base) = BaseChannel::get(&self.base) else {
            tracing::error!(bdev = self.name(), "cannot get a channel of the base bdev");
            return None;
        };
        let ch = Box::new(P::new_channel(&self.arc(), base)?);
        let p = ChannelPtr::<P::Channel>(&*ch);
        match Poller::new(P::POLLER, P::POLL_US, move || {
            // SAFETY: the poller is dropped (unregistered) before the channel is dropped
            // or handed to `drop_channel`, and runs on this channel's thread only.
            P::poll(unsafe { &*p.get() })
        }) {
            Ok(poller) => Some(Slot {
                poller: Some(poller),
                ch: Some(ch),
            }),
            Err(e) => {
                tracing::error!(bdev = self.name(), "channel poller: {e}");
                None
            }
        }
    }
    fn destroy_channel(&self, mut slot: Slot<P>) {
        slot.poller.take();
        if let Some(ch) = slot.ch.take() {
            P::drop_channel(self, ch);
        }
    }
    unsafe fn unregistered(this: *const Self) {
        // SAFETY: SPDK no longer references the node (bdev destructed, io_device gone):
        // release the `Arc` handle given up in `register` (channels may hold others).
        drop(unsafe { Arc::from_raw(this) });
    }
}

/// The module's channel behind an SPDK channel of one of `P`'s bdevs.
///
/// # Safety
/// `ch` is a live channel of a `P` bdev's io_device, used on its own thread, alive for
/// `'a` (the bdev layer keeps a bdev's channel alive while its I/O is outstanding).
pub(crate) unsafe fn channel<'a, P: Vbdev>(ch: *mut ffi::spdk_io_channel) -> &'a P::Channel {
    // SAFETY: per the contract.
    let slot = unsafe { io_device::channel::<Node<P>>(ch) };
    slot.ch
        .as_deref()
        .expect("a live channel has its module state")
}

/// Calls `f` on every channel of `node`, each on its own thread; then `done` on the
/// calling thread.
pub fn for_each_channel<P: Vbdev>(
    node: &Node<P>,
    f: fn(&P::Channel),
    done: impl FnOnce(i32) + 'static,
) {
    let ptr: *const Node<P> = node;
    // SAFETY: the node is a registered io_device, alive until `done`: it is freed only
    // after its io_device is unregistered, which SPDK defers past a running walk.
    unsafe {
        io_device::for_each_channel(
            ptr,
            move |_, slot: &Slot<P>| {
                if let Some(c) = slot.ch.as_deref() {
                    f(c)
                }
            },
            done,
        )
    }
}

/// RESET: `drain` every channel (what they hold is completed), then reset the base
/// from the channel the reset came on, with `done` as completion. Returns at once;
/// `refused` runs on the reset's channel when the base refused it (and `io` was
/// completed).
pub fn reset<P: Vbdev>(
    io: Io<P>,
    drain: fn(&P::Channel),
    done: BaseDone<P>,
    refused: fn(&P::Channel),
) {
    let node = io.node().arc();
    for_each_channel(&node, drain, move |_| {
        if let Err((io, rc)) = io.reset_base(done) {
            refused(io.channel());
            // A base without reset (-ENOTSUP) has nothing to reset.
            io.complete(if rc == -95 {
                IoStatus::Success
            } else {
                IoStatus::Failed
            });
        }
    });
}

// ---- create, delete, hot remove -----------------------------------------------------

/// Refuses a name that is taken (by any bdev, or by one of ours being created).
pub fn check_new_name<P: Vbdev>(name: &str) -> Result<CString, RpcError> {
    check_name("bdev name", name)?;
    let cname = CString::new(name).map_err(|_| RpcError::invalid("name contains NUL"))?;
    // SAFETY: app thread; the name is a valid C string.
    if !unsafe { ffi::spdk_bdev_get_by_name(cname.as_ptr()) }.is_null()
        || P::with_vbdevs(|v| v.contains(name))
    {
        return Err(RpcError::new(
            code::EEXIST,
            format!("bdev {name:?} already exists"),
        ));
    }
    Ok(cname)
}

/// Opens and claims base `name` (app thread), or, with [`Vbdev::SHARED_BASE`], reuses
/// the descriptor another of the module's bdevs holds.
pub fn open_base<P: Vbdev>(name: &str) -> Result<Arc<Base>, RpcError> {
    if P::SHARED_BASE
        && let Some(b) = P::with_vbdevs(|v| v.bases.get(name).and_then(Weak::upgrade))
    {
        return Ok(b);
    }
    let b = Base::open(name, P::module(), Some(base_event::<P>))
        .map_err(|e| e.refusal(name, &P::BASE_HINTS))?;
    if P::SHARED_BASE {
        P::with_vbdevs(|v| {
            v.bases.retain(|_, w| w.strong_count() > 0);
            v.bases.insert(name.to_string(), Arc::downgrade(&b));
        });
    }
    Ok(b)
}

/// The UUID of a new bdev: `uuid` if given, else SHA-1 of the module's name space, the
/// base's UUID and `name`.
pub fn make_uuid<P: Vbdev>(
    uuid: Option<&str>,
    name: &str,
    base: &Base,
) -> Result<ffi::spdk_uuid, RpcError> {
    let mut u = ffi::spdk_uuid::default();
    match uuid {
        Some(s) => {
            let c = CString::new(s).map_err(|_| RpcError::invalid("uuid contains NUL"))?;
            // SAFETY: valid out-pointer and C string.
            if unsafe { ffi::spdk_uuid_parse(&mut u, c.as_ptr()) } != 0 {
                return Err(RpcError::invalid(format!("uuid {s:?} is not a UUID")));
            }
        }
        None => {
            let mut ns = ffi::spdk_uuid::default();
            // SAFETY: every bit pattern of the UUID union is a valid byte array; valid
            // pointers; the seed holds `len` bytes.
            unsafe {
                let mut seed = Vec::from(base.bdev().uuid.u.raw);
                seed.extend_from_slice(name.as_bytes());
                ffi::spdk_uuid_parse(&mut ns, P::UUID_NAMESPACE.as_ptr());
                ffi::spdk_uuid_generate_sha1(
                    &mut u,
                    &mut ns,
                    seed.as_ptr().cast::<c_char>(),
                    seed.len(),
                );
            }
        }
    }
    Ok(u)
}

fn uuid_string(u: &ffi::spdk_uuid) -> String {
    let mut buf = [0 as c_char; 40];
    // SAFETY: `buf` is larger than SPDK_UUID_STRING_LEN (37).
    unsafe { ffi::spdk_uuid_fmt_lower(buf.as_mut_ptr(), buf.len(), u) };
    // SAFETY: NUL-terminated by spdk_uuid_fmt_lower.
    unsafe { CStr::from_ptr(buf.as_ptr()) }
        .to_string_lossy()
        .into_owned()
}

/// Registers bdev `name` over `base` with the base's geometry, `uuid` and `policy`
/// (app thread, after [`check_new_name`]). On failure nothing of it is left but
/// `policy`, dropped.
pub fn register<P: Vbdev>(
    name: CString,
    base: Arc<Base>,
    uuid: ffi::spdk_uuid,
    policy: P,
) -> Result<(), RpcError> {
    let node = Arc::new(Node {
        // SAFETY: an all-zero `spdk_bdev` is the blank bdev SPDK modules start from
        // (calloc in C); the fields that matter are set below.
        bdev: UnsafeCell::new(unsafe { std::mem::zeroed() }),
        fn_table: fn_table::<P>(),
        name,
        base,
        uuid: uuid_string(&uuid),
        deleting: AtomicBool::new(false),
        policy,
    });
    // SPDK's handle, released in `unregistered`.
    let ptr: *const Node<P> = Arc::into_raw(node);
    // SAFETY: `ptr` is the fresh node, whose only handle is ours; its bdev is not
    // registered yet, so nothing else accesses it. The base bdev is open, so reading its
    // properties is valid.
    unsafe {
        let n = &*ptr;
        let b = &mut *n.bdev.get();
        let base = n.base.bdev();
        b.name = n.name.as_ptr().cast_mut();
        b.product_name = P::PRODUCT.as_ptr().cast_mut();
        b.write_cache = base.write_cache;
        b.required_alignment = base.required_alignment;
        b.optimal_io_boundary = base.optimal_io_boundary;
        b.blocklen = base.blocklen;
        b.phys_blocklen = base.phys_blocklen;
        b.blockcnt = base.blockcnt;
        b.acwu = base.acwu;
        b.md_interleave = base.md_interleave;
        b.md_len = base.md_len;
        b.dif_type = base.dif_type;
        b.dif_is_head_of_md = base.dif_is_head_of_md;
        b.dif_check_flags = base.dif_check_flags;
        b.dif_pi_format = base.dif_pi_format;
        b.uuid = uuid;
        b.ctxt = ptr.cast_mut().cast();
        b.fn_table = &n.fn_table;
        b.module = P::module().as_ptr();
        io_device::register(ptr, &n.name);
    }
    // SAFETY: the node is alive (freed only through the io_device).
    let n = unsafe { &*ptr };
    P::with_vbdevs(|v| {
        v.bdevs.insert(
            n.name().to_string(),
            Entry {
                node: NodePtr(ptr),
                deleting: false,
            },
        )
    });
    // SAFETY: the bdev is filled in and its node stays alive until destruct.
    let rc = unsafe { ffi::spdk_bdev_register(n.bdev_ptr()) };
    if rc != 0 {
        let msg = format!("cannot register bdev {:?}: error {rc}", n.name());
        P::with_vbdevs(|v| v.bdevs.remove(n.name()));
        // SAFETY: registered above and never exposed; `unregistered` releases the node
        // (and with it the base handle).
        unsafe { io_device::unregister(ptr) };
        return Err(RpcError::new(rc.min(-1), msg));
    }
    Ok(())
}

/// Deletes one of `P`'s bdevs: marks it deleting, lets every channel drain
/// ([`Vbdev::drain`]), then unregisters it. `done` gets the outcome (app thread).
pub fn delete<P: Vbdev>(name: &str, done: impl FnOnce(Result<(), RpcError>) + 'static) {
    let kind = P::KIND;
    let found = P::with_vbdevs(|v| match v.bdevs.get_mut(name) {
        None => Err(RpcError::new(
            code::ENOENT,
            format!("unknown {kind} {name:?}"),
        )),
        Some(e) if e.deleting => Err(RpcError::new(
            code::EBUSY,
            format!("{kind} {name:?} is already being deleted"),
        )),
        Some(e) => {
            e.deleting = true;
            Ok(e.node)
        }
    });
    let node = match found {
        Ok(n) => n,
        Err(e) => return done(Err(e)),
    };
    // SAFETY: the node was listed, hence alive until its destruct, which cannot run
    // before the unregister below.
    let n = unsafe { &*node.0 };
    n.deleting.store(true, Ordering::Release);
    let name = name.to_string();
    for_each_channel(n, P::drain, move |_| {
        tracing::info!(bdev = name.as_str(), "unregistering {kind}");
        // SAFETY: app thread; the bdev is registered and, being marked deleting, is
        // unregistered only here; the node is alive (see above).
        unsafe { crate::module::unregister_bdev((*node.0).bdev_ptr(), done) };
    });
}

/// Event on a base: on REMOVE, every bdev of `P` on it is deleted (its creation
/// parameters are gone with it).
unsafe extern "C" fn base_event<P: Vbdev>(
    t: ffi::spdk_bdev_event_type,
    bdev: *mut ffi::spdk_bdev,
    _ctx: *mut c_void,
) {
    match t {
        ffi::spdk_bdev_event_type::SPDK_BDEV_EVENT_REMOVE => {
            let names: Vec<String> = P::with_vbdevs(|v| {
                v.iter()
                    .filter(|(_, n, deleting)| !deleting && n.base.bdev_ptr() == bdev)
                    .map(|(name, _, _)| name.to_string())
                    .collect()
            });
            for name in names {
                tracing::warn!(bdev = name.as_str(), "{}", P::BASE_REMOVED);
                delete::<P>(&name, |_| {});
            }
        }
        other => tracing::info!("base bdev event {} ignored", other.0),
    }
}

// ---- the module descriptor and the delete RPC ----------------------------------------

/// SPDK's per-thread `bdev_io` cache below which a stacked bdev is told to raise it
/// (SPDK's default is 256): every command through a stacked bdev takes two `bdev_io`s,
/// and past the cache each comes from the global mempool and colder memory (eight hosts
/// at 324 commands on one poll group: 71 % of bare with 256, 87 % with 2,048).
const ADVISED_BDEV_IO_CACHE: u32 = 1024;

unsafe extern "C" fn module_init<P: Vbdev>() -> c_int {
    let cache = bdev_io_cache_size();
    if cache < ADVISED_BDEV_IO_CACHE {
        tracing::info!(
            "SPDK's bdev_io cache holds {cache} per thread: each command through a {} \
             takes two bdev_ios, so with hundreds of commands outstanding per poll group \
             raise bdev_io_cache_size to {ADVISED_BDEV_IO_CACHE} or more (bdev_set_options \
             in the startup configuration; nvmf-qos docs/operations.md)",
            P::KIND
        );
    }
    0
}

/// SPDK's `bdev_io_cache_size` (`bdev_set_options`), as the bdev layer runs with it.
fn bdev_io_cache_size() -> u32 {
    let mut opts = std::mem::MaybeUninit::<ffi::spdk_bdev_opts>::zeroed();
    let size = std::mem::size_of::<ffi::spdk_bdev_opts>();
    // SAFETY: `opts` is ours and `size` bytes long; spdk_bdev_get_opts writes at most
    // `opts_size` bytes of the options into it and reads nothing from it.
    unsafe { ffi::spdk_bdev_get_opts(opts.as_mut_ptr(), size) };
    // SAFETY: every field of spdk_bdev_opts is an integer or a bool, for which all
    // zero bytes are valid, and spdk_bdev_get_opts wrote valid values over them.
    unsafe { opts.assume_init() }.bdev_io_cache_size
}

unsafe extern "C" fn module_fini<P: Vbdev>() {
    P::module_fini();
}

unsafe extern "C" fn fini_start<P: Vbdev>() {
    P::fini_start();
}

unsafe extern "C" fn get_ctx_size<P: Vbdev>() -> c_int {
    io::ctx_size::<P>() as c_int
}

unsafe extern "C" fn config_json<P: Vbdev>(w: *mut ffi::spdk_json_write_ctx) -> c_int {
    // SAFETY: SPDK passes a live writer positioned inside the bdev config array.
    let mut w = unsafe { JsonWriter::from_raw(w) };
    for line in P::module_config() {
        w.value(&line);
    }
    0
}

/// Registers `P`'s bdev module as `name` ([`Vbdev::module`]), at load time: its init,
/// fini and `fini_start` hooks, its `save_config` lines, and the size of its per-I/O
/// context.
pub fn register_module<P: Vbdev>(name: &'static CStr, loading: &Loading) {
    P::module().register(name, loading, |m| {
        m.module_init = Some(module_init::<P>);
        m.module_fini = Some(module_fini::<P>);
        m.fini_start = Some(fini_start::<P>);
        m.config_json = Some(config_json::<P>);
        m.get_ctx_size = Some(get_ctx_size::<P>);
    });
}

/// Parameters of a module's delete method.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct DeleteParams {
    name: String,
}

/// A module's delete method (`{"name"}`, answering `true`): [`delete`] over JSON-RPC.
pub fn rpc_delete<P: Vbdev>(method: &str, req: RpcRequest, params: Value) {
    match crate::rpc::parse::<DeleteParams>(method, params) {
        Ok(n) => delete::<P>(&n.name, move |r| req.reply(r.map(|()| json!(true)))),
        Err(e) => req.reply(Err(e)),
    }
}
