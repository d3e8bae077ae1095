//! nvmf-qos target plugin (`libnvmf_qos_tgt.so`): per-host storage QoS inside an
//! unmodified SPDK `nvmf_tgt` built with shared libraries, loaded with `LD_PRELOAD`.
//!
//! An ELF constructor registers, before SPDK starts:
//! - the bdev module `qos`, whose bdevs ("QoS bdevs", [`qos_bdev`], stacked bdevs of
//!   `spdk_sys::vbdev`) are each bound to one host NQN and stacked on a base bdev; made
//!   the namespace of a subsystem that only
//!   that host may use (or masked to it), every I/O they see is that host's;
//! - the `qos_*` JSON-RPC methods ([`rpc`], contract in `docs/rpc.md`);
//! - the event subsystem `nvmf_qos`, which depends on `nvmf`, so that its `fini` runs
//!   before the nvmf target's: from then on no I/O is held (shutdown never waits for
//!   tokens).
//!
//! Each QoS domain ([`registry`]) has a `qos_core::Monitor` ticked by a poller on the
//! app thread at the domain's check interval (conversion, period roll-over, capacity
//! estimation); each QoS bdev channel ([`io`]) admits, holds and releases I/O with the
//! host's `qos_core::ChannelTokens` and answers the token protocol's vendor commands.
//!
//! Modules depend one way: `lib` → `rpc` → `qos_bdev` (the bdev) → `registry` (domains,
//! hosts, the list of bdevs) → `io` (the policy and its channels) → `spdk_sys`,
//! `qos_core`; `stats` (used by `rpc`) reads `registry`; `params` imports nothing of ours.

// The registration entry points are only reachable from the constructor, which unit-test
// builds leave out (tests must not register with SPDK).
#![cfg_attr(test, allow(dead_code))]

pub mod io;
pub mod params;
pub mod qos_bdev;
pub mod registry;
pub mod rpc;
pub mod stats;

use std::ffi::c_int;
use std::sync::atomic::Ordering;

use spdk_sys::json::JsonWriter;
use spdk_sys::module::Subsystem;

/// The event subsystem that marks the start of shutdown.
static SUBSYSTEM: Subsystem = Subsystem::new();

unsafe extern "C" fn module_init() -> c_int {
    0
}

unsafe extern "C" fn module_fini() {
    // Every QoS bdev is gone by now (the bdev layer unregisters them first); stop the
    // monitors.
    registry::clear_domains();
}

unsafe extern "C" fn get_ctx_size() -> c_int {
    io::ctx_size() as c_int
}

unsafe extern "C" fn config_json(w: *mut spdk_sys::spdk_json_write_ctx) -> c_int {
    // SAFETY: SPDK passes a live writer positioned inside the bdev config array.
    let mut w = unsafe { JsonWriter::from_raw(w) };
    qos_bdev::module_config(&mut w);
    0
}

unsafe extern "C" fn subsystem_init() {
    // SAFETY: required continuation of a subsystem's init.
    unsafe { spdk_sys::spdk_subsystem_init_next(0) };
}

unsafe extern "C" fn subsystem_fini() {
    io::SHUTDOWN.store(true, Ordering::Release);
    tracing::info!("nvmf_tgt is stopping: QoS no longer holds I/O");
    // SAFETY: required continuation of a subsystem's fini.
    unsafe { spdk_sys::spdk_subsystem_fini_next() };
}

/// Registers everything with SPDK; runs once, as an ELF constructor.
extern "C" fn register() {
    spdk_sys::log::install();
    // SAFETY: called once from the constructor below, before SPDK initialises anything;
    // the names are unique to this plugin.
    unsafe {
        qos_bdev::MODULE.register(c"qos", |m| {
            m.module_init = Some(module_init);
            m.module_fini = Some(module_fini);
            m.config_json = Some(config_json);
            m.get_ctx_size = Some(get_ctx_size);
        });
        SUBSYSTEM.register(c"nvmf_qos", c"nvmf", subsystem_init, subsystem_fini);
    }
    rpc::register_all();
}

#[cfg(not(test))]
#[used]
#[unsafe(link_section = ".init_array")]
static REGISTER: extern "C" fn() = register;
