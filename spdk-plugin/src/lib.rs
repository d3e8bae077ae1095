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
//! `qos_core`; `stats` (used by `rpc`) reads `registry`; `params` imports only `field_table` (the
//! table its parameter structs are declared with).

// The registration entry points are only reachable from the constructor, which unit-test
// and fuzz builds leave out (tests and fuzz binaries must not register with SPDK).
#![cfg_attr(any(test, fuzzing), allow(dead_code))]

#[cfg(test)]
mod control_plane_tests;
pub mod field_table;
pub mod io;
pub mod params;
/// The RPC-parameter fuzz targets: the mutation fuzzer's test, and with the feature
/// `fuzzing` the coverage-guided targets of `fuzz/libfuzzer` (docs/reliability.md).
#[cfg(any(test, feature = "fuzzing"))]
pub mod params_fuzz;
pub mod qos_bdev;
pub mod registry;
pub mod rpc;
pub mod stats;

use std::sync::atomic::Ordering;

use spdk_sys::module::{Loading, Subsystem, SubsystemHooks, register_subsystem};
use spdk_sys::vbdev;

/// The event subsystem that marks the start of shutdown.
static SUBSYSTEM: Subsystem = Subsystem::new();

/// `nvmf_qos`: finished before the nvmf target, so that from then on no I/O is held.
struct Shutdown;

impl SubsystemHooks for Shutdown {
    const NAME: &'static std::ffi::CStr = c"nvmf_qos";
    const DEPENDS_ON: &'static std::ffi::CStr = c"nvmf";
    fn descriptor() -> &'static Subsystem {
        &SUBSYSTEM
    }
    fn fini() {
        io::SHUTDOWN.store(true, Ordering::Release);
        tracing::info!("nvmf_tgt is stopping: QoS no longer holds I/O");
    }
}

/// Registers everything with SPDK, once, when the plugin is loaded.
fn register(loading: &Loading) {
    spdk_sys::log::install();
    spdk_sys::rpc::VersionInfo::of("target").log_loaded();
    vbdev::register_module::<io::QosTgt>(c"qos", loading);
    register_subsystem::<Shutdown>(loading);
    rpc::register_all();
}

spdk_sys::at_load!(register);
