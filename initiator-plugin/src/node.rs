//! The initiator QoS bdev: one per host (base bdev), stacked on a bdev_nvme namespace
//! bdev. It opens its base read-write and claims it (exclusive write), so the
//! application uses the QoS bdev instead.
//!
//! Lifecycle (app thread): `create` opens and claims the base, joins (or creates) its
//! pacer group, registers an io_device and the bdev. `delete` (RPC, or hot removal of
//! the base, e.g. when bdev_nvme gives up a controller) marks the node as deleting, lets
//! every channel send what it holds to the base, then unregisters the bdev; SPDK calls
//! `destruct` once every descriptor is closed, which releases the base and unregisters
//! the io_device, whose completion frees the node.
//!
//! The registry of bdevs and pacer groups is touched only on the app thread (RPC
//! handlers and module callbacks).

use std::cell::UnsafeCell;
use std::collections::BTreeMap;
use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use serde_json::{Value, json};
use spdk_sys::io_device::{self, IoDevice};
use spdk_sys::json::JsonWriter;
use spdk_sys::module::BdevModule;
use spdk_sys::thread::Thread;
use spdk_sys::{self as ffi, spdk_bdev_io_type as T};

use crate::io;
use crate::params::{
    CheckedCreate, CreateParams, OptionsPatch, PacerOptions, Refusal, SetParams, check_chunk, code,
};
use crate::state::{PacerGroup, Shared, lock};

/// The bdev module descriptor (SPDK keeps it by address).
pub static MODULE: BdevModule = BdevModule::new();

/// Set when the bdev layer starts to finish (application shutdown): nothing is held or
/// paced any more, so that shutdown never waits for tokens.
pub static SHUTDOWN: AtomicBool = AtomicBool::new(false);

/// Name-space UUID for QoS bdev UUIDs derived from the base's UUID and the name.
const UUID_NAMESPACE: &CStr = c"9b0e7c62-3d1a-4f57-a1c4-2f6d8e5b7a90";

/// A raw SPDK pointer that may be sent between threads (SPDK objects are designed to be
/// referenced from several threads; which calls are allowed where is SPDK's contract,
/// stated at each use).
#[derive(PartialEq, Eq)]
pub struct SendPtr<T>(pub *mut T);
impl<T> std::fmt::Debug for SendPtr<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:p}", self.0)
    }
}
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

/// The open, claimed base bdev. The claim is released and the descriptor closed (on the
/// app thread) when the last holder drops it: the node, its channels, and channels torn
/// down while vendor commands were still in flight on the base.
#[derive(Debug)]
pub struct BaseHandle {
    pub bdev: SendPtr<ffi::spdk_bdev>,
    pub desc: SendPtr<ffi::spdk_bdev_desc>,
}

impl Drop for BaseHandle {
    fn drop(&mut self) {
        close_base(self.bdev, self.desc);
    }
}

/// One initiator QoS bdev.
pub struct IniNode {
    /// The bdev SPDK sees; written before registration, then only by SPDK.
    bdev: UnsafeCell<ffi::spdk_bdev>,
    name: CString,
    pub base_name: String,
    pub base_desc: SendPtr<ffi::spdk_bdev_desc>,
    pub base_bdev: SendPtr<ffi::spdk_bdev>,
    pub base: Arc<BaseHandle>,
    pub uuid: String,
    pub shared: Arc<Shared>,
    pub group: Arc<PacerGroup>,
    /// Deletion started: held I/O goes to the base, new I/O passes through.
    pub deleting: AtomicBool,
    pub block_len: u32,
    /// Separate metadata per block (bytes), 0 when none or interleaved.
    pub md_len: u32,
    /// The base takes ABORT.
    pub base_abort: bool,
}

// SAFETY: `bdev` is never read or written by Rust after registration (only its address
// is handed to SPDK); every other field is immutable after construction, atomic, or
// `Sync` itself.
unsafe impl Sync for IniNode {}
// SAFETY: as above; the node is freed once SPDK released it.
unsafe impl Send for IniNode {}

impl std::fmt::Debug for IniNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IniNode")
            .field("name", &self.name)
            .field("base", &self.base_name)
            .finish()
    }
}

impl IniNode {
    pub fn bdev_ptr(&self) -> *mut ffi::spdk_bdev {
        self.bdev.get()
    }
    pub fn name(&self) -> &str {
        self.name.to_str().unwrap_or("?")
    }
    pub fn is_deleting(&self) -> bool {
        self.deleting.load(Ordering::Relaxed) || SHUTDOWN.load(Ordering::Relaxed)
    }

    /// The creation parameters that rebuild this bdev as it is now (`save_config`).
    pub fn params(&self) -> CreateParams {
        let full = OptionsPatch::full(&self.shared.options(), &self.group.options());
        CreateParams {
            uuid: Some(self.uuid.clone()),
            pacer_group: Some(self.group.name.clone()),
            ..CreateParams::new(self.name().to_string(), self.base_name.clone())
        }
        .with_options(&full)
    }

    pub fn info_json(&self) -> Value {
        let mut v = serde_json::to_value(self.params()).unwrap_or(Value::Null);
        v["deleting"] = json!(self.deleting.load(Ordering::Relaxed));
        v["state"] = self.shared.state_json();
        v["pacer"] = self.group.state_json();
        v
    }
}

/// A pointer to a live node, kept by the registry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodePtr(pub *const IniNode);
// SAFETY: nodes are `Sync`; the registry drops its pointer in `destruct`, before the
// node is freed.
unsafe impl Send for NodePtr {}
// SAFETY: as above.
unsafe impl Sync for NodePtr {}

impl NodePtr {
    /// # Safety
    /// The node is alive (it is in the registry, or SPDK is calling into it).
    pub unsafe fn get<'a>(self) -> &'a IniNode {
        // SAFETY: per the contract above.
        unsafe { &*self.0 }
    }
}

/// A group with its member count.
#[derive(Debug)]
struct GroupEntry {
    group: Arc<PacerGroup>,
    members: usize,
}

#[derive(Debug)]
struct BdevEntry {
    node: NodePtr,
    deleting: bool,
}

#[derive(Debug, Default)]
struct Registry {
    bdevs: BTreeMap<String, BdevEntry>,
    groups: BTreeMap<String, GroupEntry>,
    next_flow: u64,
}

static REGISTRY: Mutex<Registry> = Mutex::new(Registry {
    bdevs: BTreeMap::new(),
    groups: BTreeMap::new(),
    next_flow: 1,
});

fn with<R>(f: impl FnOnce(&mut Registry) -> R) -> R {
    f(&mut lock(&REGISTRY))
}

fn now() -> qos_core::Nanos {
    qos_core::Nanos(spdk_sys::time::now_ns())
}

impl IoDevice for IniNode {
    type Channel = io::IniChannel;
    fn create_channel(&self) -> Option<io::IniChannel> {
        io::IniChannel::new(self)
    }
    fn destroy_channel(&self, channel: io::IniChannel) {
        channel.destroy(self);
    }
    unsafe fn unregistered(this: *const Self) {
        // SAFETY: SPDK no longer references the node (bdev destructed, io_device gone):
        // reclaim the box leaked in `create`.
        drop(unsafe { Box::from_raw(this.cast_mut()) });
    }
}

static FN_TABLE: ffi::spdk_bdev_fn_table = ffi::spdk_bdev_fn_table {
    destruct: Some(destruct),
    submit_request: Some(io::submit_request),
    io_type_supported: Some(io_type_supported),
    get_io_channel: Some(get_io_channel),
    dump_info_json: Some(dump_info_json),
    write_config_json: Some(write_config_json),
    get_spin_time: None,
    get_module_ctx: None,
    get_memory_domains: Some(get_memory_domains),
    reset_device_stat: None,
    dump_device_stat_json: None,
    accel_sequence_supported: None,
};

/// # Safety
/// `ctx` is the `ctxt` of one of our bdevs.
unsafe fn node<'a>(ctx: *mut c_void) -> &'a IniNode {
    // SAFETY: our bdevs' `ctxt` is their node, alive while SPDK calls the fn table.
    unsafe { &*ctx.cast::<IniNode>() }
}

unsafe extern "C" fn io_type_supported(ctx: *mut c_void, t: T) -> bool {
    // SAFETY: called by SPDK on one of our bdevs.
    let n = unsafe { node(ctx) };
    match t {
        T::SPDK_BDEV_IO_TYPE_READ
        | T::SPDK_BDEV_IO_TYPE_WRITE
        | T::SPDK_BDEV_IO_TYPE_UNMAP
        | T::SPDK_BDEV_IO_TYPE_FLUSH
        | T::SPDK_BDEV_IO_TYPE_WRITE_ZEROES
        | T::SPDK_BDEV_IO_TYPE_COMPARE
        | T::SPDK_BDEV_IO_TYPE_NVME_IO => {
            // SAFETY: the base bdev is open (we hold a descriptor) while the node lives.
            unsafe { ffi::spdk_bdev_io_type_supported(n.base_bdev.0, t) }
        }
        T::SPDK_BDEV_IO_TYPE_RESET => true,
        T::SPDK_BDEV_IO_TYPE_ABORT => n.base_abort,
        _ => false,
    }
}

unsafe extern "C" fn get_io_channel(ctx: *mut c_void) -> *mut ffi::spdk_io_channel {
    // SAFETY: our node is a registered io_device; the bdev layer calls this on an SPDK
    // thread and puts the channel when done.
    unsafe {
        let n: *const IniNode = node(ctx);
        io_device::get_channel(n).map_or(std::ptr::null_mut(), |c| c.as_ptr())
    }
}

unsafe extern "C" fn get_memory_domains(
    ctx: *mut c_void,
    domains: *mut *mut ffi::spdk_memory_domain,
    size: c_int,
) -> c_int {
    // SAFETY: the QoS bdev moves no data itself (chunks carry sub-ranges of the same
    // buffers), so it supports the base's memory domains; SPDK's arguments pass through.
    unsafe { ffi::spdk_bdev_get_memory_domains(node(ctx).base_bdev.0, domains, size) }
}

unsafe extern "C" fn dump_info_json(ctx: *mut c_void, w: *mut ffi::spdk_json_write_ctx) -> c_int {
    // SAFETY: called by SPDK on one of our bdevs with a live writer inside an object.
    let (n, mut w) = unsafe { (node(ctx), JsonWriter::from_raw(w)) };
    w.named_value(c"qos_ini", &n.info_json());
    0
}

/// `save_config`: one `qos_ini_bdev_create` per QoS bdev with every option, in the
/// per-bdev section, which SPDK writes after every module's own lines (so after
/// bdev_nvme's `bdev_nvme_attach_controller`).
unsafe extern "C" fn write_config_json(
    bdev: *mut ffi::spdk_bdev,
    w: *mut ffi::spdk_json_write_ctx,
) {
    // SAFETY: `bdev` is one of ours; its `ctxt` is the node. The writer is live and
    // positioned inside the config array.
    let (n, mut w) = unsafe { (node((*bdev).ctxt), JsonWriter::from_raw(w)) };
    w.value(&json!({"method": "qos_ini_bdev_create", "params": n.params()}));
}

unsafe extern "C" fn destruct(ctx: *mut c_void) -> c_int {
    let ptr = ctx.cast::<IniNode>().cast_const();
    // SAFETY: called by SPDK once, when every descriptor of the bdev is closed; the node
    // is alive until `unregistered` frees it.
    let n = unsafe { &*ptr };
    let name = n.name().to_string();
    let group = n.group.name.clone();
    with(|r| {
        r.bdevs.remove(&name);
        if let Some(g) = r.groups.get_mut(&group) {
            g.members = g.members.saturating_sub(1);
            if g.members == 0 {
                r.groups.remove(&group);
            }
        }
    });
    // The base is closed when the node and its channels have dropped their handles.
    tracing::info!(bdev = name.as_str(), "initiator QoS bdev destroyed");
    // SAFETY: registered in `create`, unregistered once here; `unregistered` frees it.
    unsafe { io_device::unregister(ptr) };
    0
}

/// Releases the claim on the base and closes its descriptor, on the app thread (where
/// it was opened, as SPDK requires).
fn close_base(bdev: SendPtr<ffi::spdk_bdev>, desc: SendPtr<ffi::spdk_bdev_desc>) {
    let close = move || {
        let (b, d) = (bdev, desc);
        // SAFETY: we claimed this bdev with this module and opened `desc` on the app
        // thread; both are released exactly once, here, on the app thread.
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

unsafe extern "C" fn base_event(
    t: ffi::spdk_bdev_event_type,
    bdev: *mut ffi::spdk_bdev,
    _ctx: *mut c_void,
) {
    match t {
        ffi::spdk_bdev_event_type::SPDK_BDEV_EVENT_REMOVE => {
            let names: Vec<String> = with(|r| {
                r.bdevs
                    .iter()
                    // SAFETY: nodes in the registry are alive.
                    .filter(|(_, e)| !e.deleting && unsafe { e.node.get() }.base_bdev.0 == bdev)
                    .map(|(n, _)| n.clone())
                    .collect()
            });
            for name in names {
                tracing::warn!(
                    bdev = name.as_str(),
                    "base bdev removed (controller gone?): deleting the initiator QoS bdev"
                );
                delete(&name, |_| {});
            }
        }
        other => tracing::info!("base bdev event {} ignored", other.0),
    }
}

/// Opens and claims the base.
fn open_base(name: &str) -> Result<Arc<BaseHandle>, Refusal> {
    let cname = CString::new(name).map_err(|_| Refusal::invalid("base_bdev_name contains NUL"))?;
    let mut desc: *mut ffi::spdk_bdev_desc = std::ptr::null_mut();
    // SAFETY: app thread; `cname` outlives the call; `base_event` takes no context.
    let rc = unsafe {
        ffi::spdk_bdev_open_ext(
            cname.as_ptr(),
            true,
            Some(base_event),
            std::ptr::null_mut(),
            &mut desc,
        )
    };
    if rc != 0 || desc.is_null() {
        return Err(if rc == -1 {
            // EPERM: claimed for writing by another module (or QoS bdev).
            Refusal::new(
                code::EBUSY,
                format!(
                    "base bdev {name:?} is already claimed (another QoS bdev or module uses it): cannot open it read-write"
                ),
            )
        } else if rc == -19 {
            Refusal::new(
                code::ENOENT,
                format!(
                    "unknown bdev {name:?} (base_bdev_name; attach the controller with bdev_nvme_attach_controller first)"
                ),
            )
        } else {
            Refusal::new(
                rc.min(-1),
                format!("cannot open base bdev {name:?} read-write: error {rc}"),
            )
        });
    }
    // SAFETY: `desc` was just opened.
    let bdev = unsafe { ffi::spdk_bdev_desc_get_bdev(desc) };
    // SAFETY: live bdev and descriptor; the module descriptor is 'static.
    let rc = unsafe { ffi::spdk_bdev_module_claim_bdev(bdev, desc, MODULE.as_ptr()) };
    if rc != 0 {
        // SAFETY: opened above on this thread, closed once.
        unsafe { ffi::spdk_bdev_close(desc) };
        return Err(Refusal::new(
            code::EBUSY,
            format!(
                "base bdev {name:?} is already claimed (another QoS bdev or module uses it); error {rc}"
            ),
        ));
    }
    Ok(Arc::new(BaseHandle {
        bdev: SendPtr(bdev),
        desc: SendPtr(desc),
    }))
}

fn make_uuid(
    uuid: &Option<String>,
    name: &str,
    base: *mut ffi::spdk_bdev,
) -> Result<ffi::spdk_uuid, Refusal> {
    let mut u = ffi::spdk_uuid::default();
    match uuid {
        Some(s) => {
            let c = CString::new(s.as_str()).map_err(|_| Refusal::invalid("uuid contains NUL"))?;
            // SAFETY: valid out-pointer and C string.
            if unsafe { ffi::spdk_uuid_parse(&mut u, c.as_ptr()) } != 0 {
                return Err(Refusal::invalid(format!("uuid {s:?} is not a UUID")));
            }
        }
        None => {
            let mut ns = ffi::spdk_uuid::default();
            // SAFETY: valid pointers; the base bdev is open.
            unsafe {
                ffi::spdk_uuid_parse(&mut ns, UUID_NAMESPACE.as_ptr());
                let mut seed = Vec::from((*base).uuid.u.raw);
                seed.extend_from_slice(name.as_bytes());
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

/// Finds or creates the pacer group for a new bdev. An existing group keeps its
/// options; options given for it must match them.
fn join_group(r: &mut Registry, c: &CheckedCreate) -> Result<Arc<PacerGroup>, Refusal> {
    if let Some(g) = r.groups.get(&c.group) {
        let conflicts = c.patch.pacer_conflicts(&g.group.options());
        if !conflicts.is_empty() {
            return Err(Refusal::invalid(format!(
                "pacer group {:?} already exists with other pacer options: {}; change the group with qos_ini_bdev_set_options or name another pacer_group",
                c.group,
                conflicts.join(", ")
            )));
        }
        return Ok(g.group.clone());
    }
    let mut opts = PacerOptions::default();
    c.patch.apply_pacer(&mut opts);
    Ok(Arc::new(PacerGroup::new(&c.group, opts, now())?))
}

/// `qos_ini_bdev_create` (app thread). Returns the new bdev's name.
pub fn create(p: CreateParams) -> Result<String, Refusal> {
    let c = p.check()?;
    let cname = CString::new(c.name.clone()).map_err(|_| Refusal::invalid("name contains NUL"))?;
    // SAFETY: app thread; the name is a valid C string.
    if !unsafe { ffi::spdk_bdev_get_by_name(cname.as_ptr()) }.is_null()
        || with(|r| r.bdevs.contains_key(&c.name))
    {
        return Err(Refusal::new(
            code::EEXIST,
            format!("bdev {:?} already exists", c.name),
        ));
    }
    let group = with(|r| join_group(r, &c))?;
    let base = open_base(&c.base_bdev_name)?;
    let (base_bdev, base_desc) = (base.bdev, base.desc);
    // SAFETY: the base bdev is open; reading its properties is valid.
    let (block_len, md_len, md_interleave) = unsafe {
        let b = &*base_bdev.0;
        (b.blocklen, b.md_len, b.md_interleave)
    };
    // On the refusals below, dropping `base` closes it again.
    check_chunk(group.options().chunk_bytes, block_len)?;
    let uuid = make_uuid(&c.uuid, &c.name, base_bdev.0)?;
    // SAFETY: the base bdev is open.
    let (base_nvme_io, base_abort) = unsafe {
        (
            ffi::spdk_bdev_io_type_supported(base_bdev.0, T::SPDK_BDEV_IO_TYPE_NVME_IO),
            ffi::spdk_bdev_io_type_supported(base_bdev.0, T::SPDK_BDEV_IO_TYPE_ABORT),
        )
    };
    if !base_nvme_io {
        tracing::warn!(
            bdev = c.name.as_str(),
            base = c.base_bdev_name.as_str(),
            "the base bdev does not take NVMe I/O passthru (not a bdev_nvme namespace?): no token protocol and no probe; chunking only"
        );
    }
    let flow = with(|r| {
        r.next_flow += 1;
        r.next_flow
    });
    let shared = Arc::new(Shared::new(&c.name, flow, c.bdev, base_nvme_io, now()));
    let node = Box::new(IniNode {
        // SAFETY: an all-zero `spdk_bdev` is the blank bdev SPDK modules start from
        // (calloc in C); the fields that matter are set below.
        bdev: UnsafeCell::new(unsafe { std::mem::zeroed() }),
        name: cname,
        base_name: c.base_bdev_name.clone(),
        base_desc,
        base_bdev,
        base,
        uuid: uuid_string(&uuid),
        shared,
        group: group.clone(),
        deleting: AtomicBool::new(false),
        block_len,
        md_len: if md_interleave { 0 } else { md_len },
        base_abort,
    });
    let ptr: *const IniNode = Box::into_raw(node);
    // SAFETY: `ptr` is the fresh node; its bdev is not registered yet, so nothing else
    // accesses it. The base bdev is open, so reading its properties is valid.
    unsafe {
        let n = &*ptr;
        let b = &mut *n.bdev.get();
        let base = &*base_bdev.0;
        b.name = n.name.as_ptr().cast_mut();
        b.product_name = c"nvmf-qos initiator".as_ptr().cast_mut();
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
        b.fn_table = &FN_TABLE;
        b.module = MODULE.as_ptr();
        io_device::register(ptr, &n.name);
    }
    with(|r| {
        r.bdevs.insert(
            c.name.clone(),
            BdevEntry {
                node: NodePtr(ptr),
                deleting: false,
            },
        );
        r.groups
            .entry(c.group.clone())
            .or_insert(GroupEntry {
                group: group.clone(),
                members: 0,
            })
            .members += 1;
    });
    // SAFETY: the bdev is filled in and its node stays alive until destruct.
    let rc = unsafe { ffi::spdk_bdev_register((*ptr).bdev_ptr()) };
    if rc != 0 {
        with(|r| {
            r.bdevs.remove(&c.name);
            if let Some(g) = r.groups.get_mut(&c.group) {
                g.members = g.members.saturating_sub(1);
                if g.members == 0 {
                    r.groups.remove(&c.group);
                }
            }
        });
        // SAFETY: registered above and never exposed; `unregistered` frees the node
        // (and with it the base handle).
        unsafe { io_device::unregister(ptr) };
        return Err(Refusal::new(
            rc.min(-1),
            format!("cannot register bdev {:?}: error {rc}", c.name),
        ));
    }
    tracing::info!(
        bdev = c.name.as_str(),
        base = c.base_bdev_name.as_str(),
        pacer_group = c.group.as_str(),
        "initiator QoS bdev created"
    );
    Ok(c.name)
}

/// `qos_ini_bdev_set_options` (app thread).
pub fn set_options(p: SetParams) -> Result<(), Refusal> {
    let patch = p.options();
    let node = with(|r| match r.bdevs.get(&p.name) {
        Some(e) if !e.deleting => Ok(e.node),
        Some(_) => Err(Refusal::new(
            code::EBUSY,
            format!("initiator QoS bdev {:?} is being deleted", p.name),
        )),
        None => Err(Refusal::new(
            code::ENOENT,
            format!("unknown initiator QoS bdev {:?}", p.name),
        )),
    })?;
    // SAFETY: in the registry, hence alive (app thread; destruct also runs there).
    let n = unsafe { node.get() };
    let mut b = n.shared.options();
    patch.apply_bdev(&mut b);
    b.validate()?;
    let mut g = n.group.options();
    patch.apply_pacer(&mut g);
    g.validate()?;
    check_chunk(g.chunk_bytes, n.block_len)?;
    // Every member of the group must accept the new chunk size.
    if patch.chunk_bytes.is_some() {
        with(|r| {
            for e in r.bdevs.values() {
                // SAFETY: nodes in the registry are alive.
                let m = unsafe { e.node.get() };
                if Arc::ptr_eq(&m.group, &n.group) {
                    check_chunk(g.chunk_bytes, m.block_len)?;
                }
            }
            Ok::<(), Refusal>(())
        })?;
    }
    let t = now();
    n.group.set_options(g, t)?;
    n.shared.set_options(b, t);
    tracing::info!(bdev = p.name.as_str(), "initiator QoS options changed");
    Ok(())
}

/// `qos_ini_bdev_get` (app thread).
pub fn get(name: Option<&str>) -> Result<Value, Refusal> {
    with(|r| match name {
        Some(n) => r
            .bdevs
            .get(n)
            // SAFETY: nodes in the registry are alive.
            .map(|e| json!([unsafe { e.node.get() }.info_json()]))
            .ok_or_else(|| Refusal::new(code::ENOENT, format!("unknown initiator QoS bdev {n:?}"))),
        None => Ok(Value::Array(
            r.bdevs
                .values()
                // SAFETY: as above.
                .map(|e| unsafe { e.node.get() }.info_json())
                .collect(),
        )),
    })
}

fn release_held(_node: &IniNode, ch: &io::IniChannel) {
    ch.release_all();
}

/// Deletes a QoS bdev: every channel sends what it holds to the base, then the bdev is
/// unregistered. `done` gets the outcome (on the app thread).
pub fn delete(name: &str, done: impl FnOnce(Result<(), Refusal>) + 'static) {
    let found = with(|r| match r.bdevs.get_mut(name) {
        None => Err(Refusal::new(
            code::ENOENT,
            format!("unknown initiator QoS bdev {name:?}"),
        )),
        Some(e) if e.deleting => Err(Refusal::new(
            code::EBUSY,
            format!("initiator QoS bdev {name:?} is already being deleted"),
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
    // SAFETY: the node is in the registry, hence alive until its destruct, which cannot
    // run before the unregister below.
    let n = unsafe { node.get() };
    n.deleting.store(true, Ordering::Release);
    let name = name.to_string();
    // SAFETY: the node is a registered io_device, alive until `done` (see above).
    unsafe {
        io_device::for_each_channel(node.0, release_held, move |_| {
            unregister(node, name, done);
        })
    };
}

fn unregister(node: NodePtr, name: String, done: impl FnOnce(Result<(), Refusal>) + 'static) {
    tracing::info!(bdev = name.as_str(), "unregistering initiator QoS bdev");
    // SAFETY: app thread; the node's bdev is registered and, `deleting` being set, is
    // unregistered only here.
    unsafe { spdk_sys::module::unregister_bdev(node.get().bdev_ptr(), done) };
}
