//! nvmf-qos initiator plugin (`libnvmf_qos_ini.so`): a QoS bdev over a bdev_nvme
//! namespace, loaded with `LD_PRELOAD` into SPDK initiator applications (fio's SPDK
//! bdev ioengine, bdevperf, any SPDK application with the bdev layer). It depends on
//! the bdev layer only, never on the nvmf target.
//!
//! An ELF constructor registers, before SPDK starts:
//! - the bdev module `qos_ini`, whose bdevs ([`node`]) each stand for one host (one
//!   base bdev, i.e. one controller with its own host NQN);
//! - the `qos_ini_*` JSON-RPC methods ([`rpc`], contract in `docs/rpc.md`).
//!
//! Each QoS bdev has a `qos_core::initiator::InitiatorEngine` ([`state`]) that mirrors
//! its host's tokens from the target plugin's token protocol and holds I/O locally when
//! it has none; QoS bdevs of a pacer group share a `qos_core::pacer::Pacer` that splits
//! large transfers into chunks and paces them ([`io`], [`chunk`], [`split`]). Design and
//! defaults: `docs/initiator-plugin.md`.
//!
//! Modules depend one way: `lib` → `rpc` → `node` (the bdev, on `spdk_sys::vbdev`) →
//! `io` (entry points, sending, the poller) → `held`, `chunk`, `vendor` (the hold
//! queue, chunking, vendor commands; `held` also names `io`'s completion callback) →
//! `chan` (the channel state and shared types) → `state`, `split`, `params` →
//! `spdk_sys`, `qos_core`.

// The registration entry points are only reachable from the constructor, which unit-test
// builds leave out (tests must not register with SPDK).
#![cfg_attr(test, allow(dead_code))]

pub mod chan;
pub mod chunk;
pub mod held;
pub mod io;
pub mod node;
pub mod params;
pub mod rpc;
pub mod split;
pub mod state;
pub mod vendor;

use std::ffi::c_int;
use std::sync::atomic::Ordering;

unsafe extern "C" fn module_init() -> c_int {
    0
}

unsafe extern "C" fn module_fini() {}

unsafe extern "C" fn fini_start() {
    // The application is stopping: nothing is held or paced from now on.
    chan::SHUTDOWN.store(true, Ordering::Release);
}

unsafe extern "C" fn get_ctx_size() -> c_int {
    chan::ctx_size() as c_int
}

/// Registers everything with SPDK; runs once, as an ELF constructor.
extern "C" fn register() {
    spdk_sys::log::install();
    // SAFETY: called once from the constructor below, before SPDK initialises anything;
    // the name is unique to this plugin.
    unsafe {
        node::MODULE.register(c"qos_ini", |m| {
            m.module_init = Some(module_init);
            m.module_fini = Some(module_fini);
            m.fini_start = Some(fini_start);
            m.get_ctx_size = Some(get_ctx_size);
        });
    }
    rpc::register_all();
}

#[cfg(not(test))]
#[used]
#[unsafe(link_section = ".init_array")]
static REGISTER: extern "C" fn() = register;
