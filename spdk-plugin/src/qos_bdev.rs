//! The QoS bdev: one per (host, namespace), stacked on a base bdev with
//! `spdk_sys::vbdev`, which owns the bdev mechanics (function table, channels, JSON,
//! the ordered delete). Several QoS bdevs may share one base bdev: the first one opens
//! the base read-write and claims it for this module (an exclusive-write claim), the
//! others reuse that descriptor, and it is closed after the last one's last channel.
//! This is what `lib/bdev/part.c`'s `spdk_bdev_part_base` does; the part library itself
//! is not used because it forces `io_type_supported(NVME_IO)` to false, and the token
//! protocol needs vendor NVMe I/O commands to reach the QoS bdev.
//!
//! What is this module's own: `create` (app thread) binds the host ledger of the
//! domain ([`registry`]) before the bdev is registered; `delete` (RPC or base
//! hot-remove) aborts the I/O held in every channel before the bdev is unregistered;
//! `destruct` drops an implicit host that no QoS bdev uses any more.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use serde_json::{Value, json};
use spdk_sys::module::BdevModule;
use spdk_sys::poller::PollStatus;
use spdk_sys::spdk_bdev_io_type as T;
use spdk_sys::vbdev::{self, BaseChannel, BaseHints, Node, Vbdev, Vbdevs};

use crate::io::{self, IoCtx, QosChannel, QosIo, QosTgt};
use crate::params::{BdevParams, Refusal};
use crate::registry;

/// The bdev module descriptor (SPDK keeps it by address).
pub static MODULE: BdevModule = BdevModule::new();

impl Vbdev for QosTgt {
    type Channel = QosChannel;
    type IoCtx = IoCtx;
    const KIND: &'static str = "QoS bdev";
    const PRODUCT: &'static std::ffi::CStr = c"nvmf-qos";
    /// Name-space UUID for QoS bdev UUIDs derived from the bdev name (SHA-1, RFC 4122 v5).
    const UUID_NAMESPACE: &'static std::ffi::CStr = c"5c1d3f06-8f2a-4e0b-9b53-6e7a0b8f2c11";
    const INFO_KEY: &'static std::ffi::CStr = c"qos";
    const CREATE_METHOD: &'static str = "qos_bdev_create";
    const SHARED_BASE: bool = true;
    const BASE_HINTS: BaseHints = BaseHints {
        unknown: "base_bdev_name",
        claimed: "by another module (e.g. it is an nvmf namespace or has a passthru/lvol on it)",
        open_claimed: None,
    };
    const BASE_REMOVED: &'static str = "base bdev removed: deleting QoS bdev";
    const POLLER: &'static std::ffi::CStr = c"qos_channel";
    const POLL_US: u64 = io::CHANNEL_POLL_US;

    fn module() -> &'static BdevModule {
        &MODULE
    }
    fn with_vbdevs<R>(f: impl FnOnce(&mut Vbdevs<Self>) -> R) -> R {
        registry::with(|r| f(&mut r.bdevs))
    }
    fn new_channel(node: &Arc<Node<Self>>, base: BaseChannel) -> Option<QosChannel> {
        Some(QosChannel::new(node.clone(), base))
    }
    fn base_channel(ch: &QosChannel) -> &BaseChannel {
        ch.base()
    }
    fn poll(ch: &QosChannel) -> PollStatus {
        ch.poll()
    }
    fn drop_channel(_node: &Node<Self>, ch: Box<QosChannel>) {
        (*ch).destroy();
    }
    fn drain(ch: &QosChannel) {
        ch.abort_all_held();
    }
    fn submit(ch: &QosChannel, io: QosIo) {
        io::submit(ch, io)
    }
    fn read_buf_ready(ch: &QosChannel, io: QosIo, success: bool) {
        ch.read_buf_ready(io, success)
    }
    fn io_type_supported(_node: &Node<Self>, t: T) -> bool {
        // Vendor NVMe I/O commands (the token protocol) must reach us; NVME_ADMIN must
        // not be claimed, or nvmf would send us Identify Namespace.
        matches!(t, T::SPDK_BDEV_IO_TYPE_ABORT | T::SPDK_BDEV_IO_TYPE_NVME_IO)
    }
    fn info_json(n: &Node<Self>) -> Value {
        json!({
            "name": n.name(),
            "base_bdev_name": n.base_name(),
            "domain": n.domain,
            "host_nqn": n.host,
        })
    }
    /// `save_config`: the per-bdev section, which SPDK writes in registration order
    /// (after the base bdev's own creation, and after the module's
    /// `qos_domain_create`/`qos_host_set` lines).
    fn create_params(n: &Node<Self>) -> Value {
        serde_json::to_value(params(n)).unwrap_or(Value::Null)
    }
    fn destroyed(n: &Node<Self>) {
        registry::with(|r| r.unbind_host(&n.domain, &n.host));
    }
    fn module_fini() {
        // Every QoS bdev is gone by now (the bdev layer unregisters them first); stop
        // the monitors.
        registry::clear_domains();
    }
    /// The module's `save_config` lines: domains, their groups, then explicit hosts.
    /// QoS bdevs follow in the per-bdev section ([`Vbdev::create_params`]).
    fn module_config() -> Vec<Value> {
        registry::with(|r| {
            let mut out = Vec::new();
            for (name, d) in &r.domains {
                out.push(
                    json!({"method": "qos_domain_create", "params": d.params(name).to_json()}),
                );
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
        })
    }
}

/// The creation parameters of a QoS bdev.
pub fn params(n: &Node<QosTgt>) -> BdevParams {
    BdevParams {
        name: n.name().to_string(),
        base_bdev_name: n.base_name().to_string(),
        domain: n.domain.clone(),
        host_nqn: n.host.clone(),
        uuid: Some(n.uuid().to_string()),
    }
}

/// `qos_bdev_create` (app thread). Returns the new bdev's name.
pub fn create(p: BdevParams) -> Result<String, Refusal> {
    let cname = vbdev::check_new_name::<QosTgt>(&p.name)?;
    registry::with(|r| r.domain(&p.domain).map(|_| ()))?;
    let base = vbdev::open_base::<QosTgt>(&p.base_bdev_name)?;
    // On the refusals below, dropping `base` closes it again (if no other QoS bdev
    // uses it).
    let (domain_shared, host_shared) = registry::with(|r| r.bind_host(&p.domain, &p.host_nqn))?;
    let undo = |p: &BdevParams| registry::with(|r| r.unbind_host(&p.domain, &p.host_nqn));
    let uuid = match vbdev::make_uuid::<QosTgt>(p.uuid.as_deref(), &p.name, &base) {
        Ok(u) => u,
        Err(e) => {
            undo(&p);
            return Err(e);
        }
    };
    let policy = QosTgt {
        domain: p.domain.clone(),
        host: p.host_nqn.clone(),
        base_nvme_io: base.supports(T::SPDK_BDEV_IO_TYPE_NVME_IO),
        domain_shared,
        host_shared,
        cooperative: AtomicBool::new(false),
    };
    if let Err(e) = vbdev::register(cname, base, uuid, policy) {
        undo(&p);
        return Err(e);
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
