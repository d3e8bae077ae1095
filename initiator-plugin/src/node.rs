//! The initiator QoS bdev: one per host (base bdev), stacked on a bdev_nvme namespace
//! bdev with `spdk_sys::vbdev`, which owns the bdev mechanics (base open and claim,
//! function table, channels, JSON, the ordered delete). It claims its base (exclusive
//! write), so the application uses the QoS bdev instead.
//!
//! What is this module's own: the registry of pacer groups and the flow ids; `create`
//! (app thread) joins (or creates) the bdev's pacer group and builds its token engine
//! before the bdev is registered; `delete` (RPC, or hot removal of the base, e.g. when
//! bdev_nvme gives up a controller) lets every channel send what it holds to the base
//! before the bdev is unregistered; `destruct` leaves the pacer group.
//!
//! The registry is touched only on the app thread (RPC handlers and module callbacks).

use std::collections::BTreeMap;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use serde_json::{Value, json};
use spdk_sys::module::BdevModule;
use spdk_sys::poller::PollStatus;
use spdk_sys::spdk_bdev_io_type as T;
use spdk_sys::vbdev::{self, BaseChannel, BaseHints, Node, Vbdev, Vbdevs};

use crate::channel::{IniChannel, IniIo, IniPolicy, SHUTDOWN, io, now};
use crate::params::{
    CheckedCreate, CreateParams, OptionsPatch, PacerOptions, Refusal, SetParams, check_chunk, code,
};
use crate::state::{PacerGroup, Shared, lock};

/// The bdev module descriptor (SPDK keeps it by address).
pub static MODULE: BdevModule = BdevModule::new();

type IniNode = Node<IniPolicy>;

/// The creation parameters that rebuild `n` as it is now (`save_config`).
pub fn params(n: &IniNode) -> CreateParams {
    let full = OptionsPatch::full(&n.shared.options(), &n.group.options());
    CreateParams {
        uuid: Some(n.uuid().to_string()),
        pacer_group: Some(n.group.name.clone()),
        ..CreateParams::new(n.name().to_string(), n.base_name().to_string())
    }
    .with_options(&full)
}

fn info_json(n: &IniNode) -> Value {
    let mut v = serde_json::to_value(params(n)).unwrap_or(Value::Null);
    v["deleting"] = json!(n.is_deleting());
    v["state"] = n.shared.state_json();
    v["pacer"] = n.group.state_json(spdk_sys::time::now());
    v
}

/// A group with its member count.
#[derive(Debug)]
struct GroupEntry {
    group: Arc<PacerGroup>,
    members: usize,
}

#[derive(Debug)]
struct IniRegistry {
    bdevs: Vbdevs<IniPolicy>,
    groups: BTreeMap<String, GroupEntry>,
    next_flow: u64,
}

static INI_REGISTRY: Mutex<IniRegistry> = Mutex::new(IniRegistry {
    bdevs: Vbdevs::new(),
    groups: BTreeMap::new(),
    next_flow: 1,
});

fn with<R>(f: impl FnOnce(&mut IniRegistry) -> R) -> R {
    f(&mut lock(&INI_REGISTRY))
}

impl IniRegistry {
    /// One member fewer in `group`; the group goes with its last member.
    fn leave_group(&mut self, group: &str) {
        if let Some(g) = self.groups.get_mut(group) {
            g.members = g.members.saturating_sub(1);
            if g.members == 0 {
                self.groups.remove(group);
            }
        }
    }
}

impl Vbdev for IniPolicy {
    /// Shared with the vendor commands in flight, which keep a destroyed channel on
    /// (an orphan) until they complete.
    type Channel = Rc<IniChannel>;
    type IoCtx = ();
    const KIND: &'static str = "initiator QoS bdev";
    const PRODUCT: &'static std::ffi::CStr = c"nvmf-qos initiator";
    /// Name-space UUID for QoS bdev UUIDs derived from the base's UUID and the name.
    const UUID_NAMESPACE: &'static std::ffi::CStr = c"9b0e7c62-3d1a-4f57-a1c4-2f6d8e5b7a90";
    const INFO_KEY: &'static std::ffi::CStr = c"qos_ini";
    /// In the per-bdev section, which SPDK writes after every module's own lines (so
    /// after bdev_nvme's `bdev_nvme_attach_controller`).
    const CREATE_METHOD: &'static str = "qos_ini_bdev_create";
    const SHARED_BASE: bool = false;
    const BASE_HINTS: BaseHints = BaseHints {
        unknown: "base_bdev_name; attach the controller with bdev_nvme_attach_controller first",
        claimed: "(another QoS bdev or module uses it)",
        open_claimed: Some("(another QoS bdev or module uses it): cannot open it read-write"),
    };
    const BASE_REMOVED: &'static str =
        "base bdev removed (controller gone?): deleting the initiator QoS bdev";
    const POLLER: &'static std::ffi::CStr = c"qos_ini_channel";
    const POLL_US: u64 = 0;

    fn module() -> &'static BdevModule {
        &MODULE
    }
    fn with_vbdevs<R>(f: impl FnOnce(&mut Vbdevs<Self>) -> R) -> R {
        with(|r| f(&mut r.bdevs))
    }
    fn new_channel(node: &Arc<IniNode>, base: BaseChannel) -> Option<Rc<IniChannel>> {
        Some(IniChannel::new(node, base))
    }
    fn base_channel(ch: &Rc<IniChannel>) -> &BaseChannel {
        &ch.base
    }
    fn poll(ch: &Rc<IniChannel>) -> PollStatus {
        ch.poll()
    }
    fn drop_channel(_node: &IniNode, ch: Box<Rc<IniChannel>>) {
        io::destroy(*ch);
    }
    fn drain(ch: &Rc<IniChannel>) {
        ch.release_everything();
    }
    fn submit(ch: &Rc<IniChannel>, io: IniIo) {
        io::submit(ch, io)
    }
    fn read_buf_ready(ch: &Rc<IniChannel>, io: IniIo, success: bool) {
        ch.read_buf_ready(io, success)
    }
    fn io_type_supported(n: &IniNode, t: T) -> bool {
        match t {
            T::SPDK_BDEV_IO_TYPE_NVME_IO => n.base().supports(t),
            T::SPDK_BDEV_IO_TYPE_ABORT => n.base_abort,
            _ => false,
        }
    }
    fn info_json(n: &IniNode) -> Value {
        info_json(n)
    }
    fn create_params(n: &IniNode) -> Value {
        serde_json::to_value(params(n)).unwrap_or(Value::Null)
    }
    fn destroyed(n: &IniNode) {
        with(|r| r.leave_group(&n.group.name));
    }
    fn fini_start() {
        // The application is stopping: nothing is held or paced from now on.
        SHUTDOWN.store(true, Ordering::Release);
    }
}

/// Finds or creates the pacer group for a new bdev. An existing group keeps its
/// options; options given for it must match them.
fn join_group(r: &mut IniRegistry, c: &CheckedCreate) -> Result<Arc<PacerGroup>, Refusal> {
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
    let cname = vbdev::check_new_name::<IniPolicy>(&c.name)?;
    let group = with(|r| join_group(r, &c))?;
    let base = vbdev::open_base::<IniPolicy>(&c.base_bdev_name)?;
    let block_len = base.bdev().blocklen;
    // On the refusals below, dropping `base` closes it again.
    check_chunk(group.options().chunk_bytes, block_len)?;
    let uuid = vbdev::make_uuid::<IniPolicy>(c.uuid.as_deref(), &c.name, &base)?;
    let base_nvme_io = base.supports(T::SPDK_BDEV_IO_TYPE_NVME_IO);
    let base_abort = base.supports(T::SPDK_BDEV_IO_TYPE_ABORT);
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
    let policy = IniPolicy {
        shared: Arc::new(Shared::new(&c.name, flow, c.bdev, base_nvme_io, now())),
        group: group.clone(),
        block_len,
        base_abort,
    };
    with(|r| {
        r.groups
            .entry(c.group.clone())
            .or_insert(GroupEntry {
                group: group.clone(),
                members: 0,
            })
            .members += 1;
    });
    if let Err(e) = vbdev::register(cname, base, uuid, policy) {
        with(|r| r.leave_group(&c.group));
        return Err(e);
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
    with(|r| {
        let n = match r.bdevs.iter().find(|(name, _, _)| *name == p.name) {
            Some((_, n, false)) => n,
            Some(_) => {
                return Err(Refusal::new(
                    code::EBUSY,
                    format!("initiator QoS bdev {:?} is being deleted", p.name),
                ));
            }
            None => {
                return Err(Refusal::new(
                    code::ENOENT,
                    format!("unknown initiator QoS bdev {:?}", p.name),
                ));
            }
        };
        let mut b = n.shared.options();
        patch.apply_bdev(&mut b);
        b.validate()?;
        let mut g = n.group.options();
        patch.apply_pacer(&mut g);
        g.validate()?;
        check_chunk(g.chunk_bytes, n.block_len)?;
        // Every member of the group must accept the new chunk size.
        if patch.chunk_bytes.is_some() {
            for (_, m, _) in r.bdevs.iter() {
                if Arc::ptr_eq(&m.group, &n.group) {
                    check_chunk(g.chunk_bytes, m.block_len)?;
                }
            }
        }
        let t = now();
        n.group.set_options(g, t)?;
        n.shared.set_options(b, t);
        tracing::info!(bdev = p.name.as_str(), "initiator QoS options changed");
        Ok(())
    })
}

/// `qos_ini_bdev_get` (app thread).
pub fn get(name: Option<&str>) -> Result<Value, Refusal> {
    with(|r| match name {
        Some(n) => r
            .bdevs
            .get(n)
            .map(|b| json!([info_json(b)]))
            .ok_or_else(|| Refusal::new(code::ENOENT, format!("unknown initiator QoS bdev {n:?}"))),
        None => Ok(Value::Array(
            r.bdevs.iter().map(|(_, b, _)| info_json(b)).collect(),
        )),
    })
}
