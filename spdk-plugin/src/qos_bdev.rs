//! The QoS bdev: one per (host, namespace), stacked on a base bdev. Several QoS bdevs
//! may share one base bdev: the first one opens the base read-write and claims it for
//! this module (an exclusive-write claim), the others reuse that descriptor, and the
//! last one to go releases the claim and closes it. This is what `lib/bdev/part.c`'s
//! `spdk_bdev_part_base` does; the part library itself is not used because it forces
//! `io_type_supported(NVME_IO)` to false, and the token protocol needs vendor NVMe I/O
//! commands to reach the QoS bdev.
//!
//! Lifecycle (app thread): `create` opens/claims the base, binds the host ledger,
//! registers an io_device and the bdev. `delete` (RPC or base hot-remove) marks the
//! node as deleting, aborts the I/O held in every channel, then unregisters the bdev;
//! SPDK calls `destruct` once every descriptor is closed, which drops the base
//! reference and unregisters the io_device, whose completion frees the node.

use std::cell::UnsafeCell;
use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use qos_core::{DomainShared, HostShared};
use serde_json::json;
use spdk_sys::io_device::{self, IoDevice};
use spdk_sys::json::JsonWriter;
use spdk_sys::module::BdevModule;
use spdk_sys::thread::Thread;
use spdk_sys::{self as ffi, spdk_bdev_io_type as T};

use crate::io;
use crate::params::{BdevParams, Refusal, check_name, code};
use crate::registry::{self, BdevEntry, Registry};

/// The bdev module descriptor (SPDK keeps it by address).
pub static MODULE: BdevModule = BdevModule::new();

/// Set when `nvmf_tgt` shuts down (our event subsystem's fini, which runs before the
/// nvmf target's): channels stop holding I/O and release what they hold, so that qpair
/// teardown never waits for tokens.
pub static SHUTDOWN: AtomicBool = AtomicBool::new(false);

/// Name-space UUID for QoS bdev UUIDs derived from the bdev name (SHA-1, RFC 4122 v5).
const UUID_NAMESPACE: &CStr = c"5c1d3f06-8f2a-4e0b-9b53-6e7a0b8f2c11";

/// A raw SPDK pointer that may be sent between threads: SPDK objects are designed to be
/// referenced from several threads; which calls are allowed where is SPDK's contract,
/// stated at each use.
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

/// A shared base descriptor.
#[derive(Debug)]
pub struct BaseEntry {
    pub bdev: SendPtr<ffi::spdk_bdev>,
    pub desc: SendPtr<ffi::spdk_bdev_desc>,
    /// QoS bdevs using it.
    pub users: usize,
}

/// One QoS bdev.
pub struct QosNode {
    /// The bdev SPDK sees; written before registration, then only by SPDK.
    bdev: UnsafeCell<ffi::spdk_bdev>,
    name: CString,
    pub base_name: String,
    pub base_desc: SendPtr<ffi::spdk_bdev_desc>,
    pub base_bdev: SendPtr<ffi::spdk_bdev>,
    pub domain: String,
    pub host: String,
    pub uuid: String,
    pub domain_shared: Arc<DomainShared>,
    pub host_shared: Arc<HostShared>,
    /// Deletion started: new I/O passes through without QoS.
    pub deleting: AtomicBool,
    /// The base accepts NVMe I/O passthru (unknown opcodes are forwarded to it).
    pub base_nvme_io: bool,
    /// The host has sent a valid token-protocol command: from then on successful reads
    /// and writes carry its credit in completion dword 0. Until then dword 0 stays 0,
    /// which keeps SPDK's NVMe/TCP "C2H success" optimisation (no response capsule after
    /// the data of a successful read) for hosts that do not use the credit.
    pub cooperative: AtomicBool,
}

// SAFETY: `bdev` is never read or written by Rust after registration (only its address
// is handed to SPDK, which synchronises its own fields); every other field is immutable
// after construction or atomic.
unsafe impl Sync for QosNode {}
// SAFETY: as above; the node is freed on the app thread after SPDK released it.
unsafe impl Send for QosNode {}

impl std::fmt::Debug for QosNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QosNode")
            .field("name", &self.name)
            .field("base", &self.base_name)
            .field("domain", &self.domain)
            .field("host", &self.host)
            .finish()
    }
}

impl QosNode {
    pub fn bdev_ptr(&self) -> *mut ffi::spdk_bdev {
        self.bdev.get()
    }
    pub fn name(&self) -> &str {
        self.name.to_str().unwrap_or("?")
    }
    pub fn params(&self) -> BdevParams {
        BdevParams {
            name: self.name().to_string(),
            base_bdev_name: self.base_name.clone(),
            domain: self.domain.clone(),
            host_nqn: self.host.clone(),
            uuid: Some(self.uuid.clone()),
        }
    }
}

/// A pointer to a live node, kept by the registry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodePtr(pub *const QosNode);
// SAFETY: nodes are `Sync`; the registry drops its pointer in `destruct`, before the
// node is freed.
unsafe impl Send for NodePtr {}
// SAFETY: as above.
unsafe impl Sync for NodePtr {}

impl NodePtr {
    /// # Safety
    /// The node is alive (it is in the registry, or SPDK is calling into it).
    pub unsafe fn get<'a>(self) -> &'a QosNode {
        // SAFETY: per the contract above.
        unsafe { &*self.0 }
    }
}

impl IoDevice for QosNode {
    type Channel = io::QosChannel;
    fn create_channel(&self) -> Option<io::QosChannel> {
        io::QosChannel::new(self)
    }
    fn destroy_channel(&self, channel: io::QosChannel) {
        channel.destroy();
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
unsafe fn node<'a>(ctx: *mut c_void) -> &'a QosNode {
    // SAFETY: our bdevs' `ctxt` is their node, alive while SPDK calls the fn table.
    unsafe { &*ctx.cast::<QosNode>() }
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
        | T::SPDK_BDEV_IO_TYPE_COMPARE => {
            // SAFETY: the base bdev is open (we hold a descriptor) while the node lives.
            unsafe { ffi::spdk_bdev_io_type_supported(n.base_bdev.0, t) }
        }
        // Vendor NVMe I/O commands (the token protocol) must reach us; NVME_ADMIN must
        // not be claimed, or nvmf would send us Identify Namespace.
        T::SPDK_BDEV_IO_TYPE_RESET | T::SPDK_BDEV_IO_TYPE_ABORT | T::SPDK_BDEV_IO_TYPE_NVME_IO => {
            true
        }
        _ => false,
    }
}

unsafe extern "C" fn get_io_channel(ctx: *mut c_void) -> *mut ffi::spdk_io_channel {
    // SAFETY: our node is a registered io_device; the bdev layer calls this on an SPDK
    // thread and puts the channel when done.
    unsafe {
        let n: *const QosNode = node(ctx);
        io_device::get_channel(n).map_or(std::ptr::null_mut(), |c| c.as_ptr())
    }
}

unsafe extern "C" fn get_memory_domains(
    ctx: *mut c_void,
    domains: *mut *mut ffi::spdk_memory_domain,
    size: c_int,
) -> c_int {
    // SAFETY: the QoS bdev moves no data itself, so it supports the base's memory
    // domains (as passthru does); the arguments are SPDK's, passed through.
    unsafe { ffi::spdk_bdev_get_memory_domains(node(ctx).base_bdev.0, domains, size) }
}

unsafe extern "C" fn dump_info_json(ctx: *mut c_void, w: *mut ffi::spdk_json_write_ctx) -> c_int {
    // SAFETY: called by SPDK on one of our bdevs with a live writer inside an object.
    let (n, mut w) = unsafe { (node(ctx), JsonWriter::from_raw(w)) };
    w.named_value(
        c"qos",
        &json!({
            "name": n.name(),
            "base_bdev_name": n.base_name,
            "domain": n.domain,
            "host_nqn": n.host,
        }),
    );
    0
}

/// `save_config`: one `qos_bdev_create` per QoS bdev, in the per-bdev section, which
/// SPDK writes in registration order (after the base bdev's own creation, and after the
/// module's `qos_domain_create`/`qos_host_set` lines).
unsafe extern "C" fn write_config_json(
    bdev: *mut ffi::spdk_bdev,
    w: *mut ffi::spdk_json_write_ctx,
) {
    // SAFETY: `bdev` is one of ours (SPDK calls our fn table only for our bdevs); its
    // `ctxt` is the node. The writer is live and positioned inside the config array.
    let (n, mut w) = unsafe { (node((*bdev).ctxt), JsonWriter::from_raw(w)) };
    w.value(&json!({"method": "qos_bdev_create", "params": n.params()}));
}

unsafe extern "C" fn destruct(ctx: *mut c_void) -> c_int {
    let ptr = ctx.cast::<QosNode>().cast_const();
    // SAFETY: called by SPDK once, when every descriptor of the bdev is closed; the node
    // is alive until `unregistered` below frees it.
    let n = unsafe { &*ptr };
    let name = n.name().to_string();
    let (domain, host, base) = (n.domain.clone(), n.host.clone(), n.base_name.clone());
    let release = registry::with(|r| {
        r.bdevs.remove(&name);
        r.unbind_host(&domain, &host);
        drop_base_user(r, &base)
    });
    close_base(release);
    tracing::info!(bdev = name.as_str(), "QoS bdev destroyed");
    // SAFETY: registered in `create`, unregistered once here; `unregistered` frees it.
    unsafe { io_device::unregister(ptr) };
    0
}

/// Takes one user off a base; returns the base to close when it was the last.
fn drop_base_user(r: &mut Registry, base: &str) -> Option<BaseEntry> {
    let e = r.bases.get_mut(base)?;
    e.users = e.users.saturating_sub(1);
    if e.users == 0 {
        r.bases.remove(base)
    } else {
        None
    }
}

/// Releases the claim on a base and closes its descriptor, on the app thread (where it
/// was opened, as SPDK requires).
fn close_base(base: Option<BaseEntry>) {
    let Some(b) = base else { return };
    let close = move || {
        let b = b;
        // SAFETY: we claimed this bdev with this module and opened `desc` on the app
        // thread; both are released exactly once, here, on the app thread.
        unsafe {
            ffi::spdk_bdev_module_release_bdev(b.bdev.0);
            ffi::spdk_bdev_close(b.desc.0);
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
            let names: Vec<String> = registry::with(|r| {
                r.bdevs
                    .iter()
                    // SAFETY: nodes in the registry are alive.
                    .filter(|(_, e)| !e.deleting && unsafe { e.node.get() }.base_bdev.0 == bdev)
                    .map(|(n, _)| n.clone())
                    .collect()
            });
            for name in names {
                tracing::warn!(bdev = name.as_str(), "base bdev removed: deleting QoS bdev");
                delete(&name, |_| {});
            }
        }
        other => tracing::info!("base bdev event {} ignored", other.0),
    }
}

fn base_open(r: &mut Registry, name: &str) -> Result<(), Refusal> {
    if r.bases.contains_key(name) {
        return Ok(());
    }
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
        return Err(if rc == -19 {
            Refusal::new(
                code::ENOENT,
                format!("unknown bdev {name:?} (base_bdev_name)"),
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
                "base bdev {name:?} is already claimed by another module (e.g. it is an nvmf namespace or has a passthru/lvol on it); error {rc}"
            ),
        ));
    }
    r.bases.insert(
        name.to_string(),
        BaseEntry {
            bdev: SendPtr(bdev),
            desc: SendPtr(desc),
            users: 0,
        },
    );
    Ok(())
}

fn make_uuid(p: &BdevParams, base: *mut ffi::spdk_bdev) -> Result<ffi::spdk_uuid, Refusal> {
    let mut u = ffi::spdk_uuid::default();
    match &p.uuid {
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
                seed.extend_from_slice(p.name.as_bytes());
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

/// `qos_bdev_create` (app thread). Returns the new bdev's name.
pub fn create(p: BdevParams) -> Result<String, Refusal> {
    check_name("bdev name", &p.name)?;
    let cname = CString::new(p.name.clone()).map_err(|_| Refusal::invalid("name contains NUL"))?;
    // SAFETY: app thread; the name is a valid C string.
    if !unsafe { ffi::spdk_bdev_get_by_name(cname.as_ptr()) }.is_null()
        || registry::with(|r| r.bdevs.contains_key(&p.name))
    {
        return Err(Refusal::new(
            code::EEXIST,
            format!("bdev {:?} already exists", p.name),
        ));
    }
    let bound = registry::with(|r| {
        r.domain(&p.domain).map_err(|e| (e, None))?;
        base_open(r, &p.base_bdev_name).map_err(|e| (e, None))?;
        let b = &r.bases[&p.base_bdev_name];
        let (bdev, desc) = (b.bdev, b.desc);
        match r.bind_host(&p.domain, &p.host_nqn) {
            Ok((d, h)) => {
                if let Some(b) = r.bases.get_mut(&p.base_bdev_name) {
                    b.users += 1;
                }
                Ok((d, h, bdev, desc))
            }
            Err(e) => {
                // A base opened for this bdev alone is closed again.
                let unused = r.bases.get(&p.base_bdev_name).is_some_and(|b| b.users == 0);
                Err((
                    e,
                    if unused {
                        r.bases.remove(&p.base_bdev_name)
                    } else {
                        None
                    },
                ))
            }
        }
    });
    let (dshared, hshared, base_bdev, base_desc) = match bound {
        Ok(b) => b,
        Err((e, base)) => {
            close_base(base);
            return Err(e);
        }
    };
    let undo = |p: &BdevParams| {
        let b = registry::with(|r| {
            r.bdevs.remove(&p.name);
            r.unbind_host(&p.domain, &p.host_nqn);
            drop_base_user(r, &p.base_bdev_name)
        });
        close_base(b);
    };
    let uuid = match make_uuid(&p, base_bdev.0) {
        Ok(u) => u,
        Err(e) => {
            undo(&p);
            return Err(e);
        }
    };
    // SAFETY: the base bdev is open.
    let base_nvme_io =
        unsafe { ffi::spdk_bdev_io_type_supported(base_bdev.0, T::SPDK_BDEV_IO_TYPE_NVME_IO) };
    let node = Box::new(QosNode {
        // SAFETY: an all-zero `spdk_bdev` is the blank bdev SPDK modules start from
        // (calloc in C); the fields that matter are set below.
        bdev: UnsafeCell::new(unsafe { std::mem::zeroed() }),
        name: cname,
        base_name: p.base_bdev_name.clone(),
        base_desc,
        base_bdev,
        domain: p.domain.clone(),
        host: p.host_nqn.clone(),
        uuid: uuid_string(&uuid),
        domain_shared: dshared,
        host_shared: hshared,
        deleting: AtomicBool::new(false),
        base_nvme_io,
        cooperative: AtomicBool::new(false),
    });
    let ptr: *const QosNode = Box::into_raw(node);
    // SAFETY: `ptr` is the fresh node; its bdev is not registered yet, so nothing else
    // accesses it. The base bdev is open, so reading its properties is valid.
    unsafe {
        let n = &*ptr;
        let b = &mut *n.bdev.get();
        let base = &*base_bdev.0;
        b.name = n.name.as_ptr().cast_mut();
        b.product_name = c"nvmf-qos".as_ptr().cast_mut();
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
    registry::with(|r| {
        r.bdevs.insert(
            p.name.clone(),
            BdevEntry {
                node: NodePtr(ptr),
                base: p.base_bdev_name.clone(),
                domain: p.domain.clone(),
                host: p.host_nqn.clone(),
                deleting: false,
            },
        )
    });
    // SAFETY: the bdev is filled in and its node stays alive until destruct.
    let rc = unsafe { ffi::spdk_bdev_register((*ptr).bdev_ptr()) };
    if rc != 0 {
        undo(&p);
        // SAFETY: registered above and never exposed; `unregistered` frees the node.
        unsafe { io_device::unregister(ptr) };
        return Err(Refusal::new(
            rc.min(-1),
            format!("cannot register bdev {:?}: error {rc}", p.name),
        ));
    }
    tracing::info!(
        bdev = p.name.as_str(),
        base = p.base_bdev_name.as_str(),
        domain = p.domain.as_str(),
        host = p.host_nqn.as_str(),
        "QoS bdev created"
    );
    Ok(p.name)
}

fn abort_held(_node: &QosNode, ch: &io::QosChannel) {
    ch.abort_all_held();
}

/// Deletes a QoS bdev: aborts its held I/O on every channel, then unregisters it.
/// `done` gets the outcome (on the app thread).
pub fn delete(name: &str, done: impl FnOnce(Result<(), Refusal>) + 'static) {
    let found = registry::with(|r| match r.bdevs.get_mut(name) {
        None => Err(Refusal::new(
            code::ENOENT,
            format!("unknown QoS bdev {name:?}"),
        )),
        Some(e) if e.deleting => Err(Refusal::new(
            code::EBUSY,
            format!("QoS bdev {name:?} is already being deleted"),
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
        io_device::for_each_channel(node.0, abort_held, move |_| {
            unregister(node, name, done);
        })
    };
}

fn unregister(node: NodePtr, name: String, done: impl FnOnce(Result<(), Refusal>) + 'static) {
    tracing::info!(bdev = name.as_str(), "unregistering QoS bdev");
    // SAFETY: app thread; the node's bdev is registered and, `deleting` being set, is
    // unregistered only here.
    unsafe { spdk_sys::module::unregister_bdev(node.get().bdev_ptr(), done) };
}

/// The module's `config_json` (`save_config`): domains, their groups, then explicit
/// hosts. QoS bdevs
/// follow in the per-bdev section ([`write_config_json`]).
pub fn module_config(w: &mut JsonWriter<'_>) {
    let lines = registry::with(|r| {
        let mut out = Vec::new();
        for (name, d) in &r.domains {
            out.push(json!({"method": "qos_domain_create", "params": d.params.to_json()}));
            // Groups before hosts: a host names its group.
            if let Ok(groups) = registry::group_params(r, name) {
                for g in groups {
                    out.push(json!({"method": "qos_group_create", "params": g.to_json()}));
                }
            }
            if let Ok(hosts) = registry::host_params(r, name) {
                for h in hosts {
                    out.push(json!({"method": "qos_host_set", "params": h.to_json()}));
                }
            }
        }
        out
    });
    for l in &lines {
        w.value(l);
    }
}
