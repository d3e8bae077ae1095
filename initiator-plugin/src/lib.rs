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
//! large transfers into chunks and paces them ([`channel`], [`split`]). Design and
//! defaults: `docs/initiator-plugin.md`.
//!
//! The I/O path is [`channel`]: one QoS bdev on one thread (`IniChannel`), its
//! behaviour by concern in `channel/` (`io`: entry points, sending, the poller; `held`:
//! the hold queue; `chunk`: large transfers; `vendor`: the token protocol); its module
//! doc maps which file owns what.
//!
//! Modules depend one way: `lib` → `rpc` → `node` (the bdev, on `spdk_sys::vbdev`) →
//! `channel::io` (entry points, sending, the poller) → `channel::held`,
//! `channel::chunk`, `channel::vendor` (the hold queue, chunking, vendor commands;
//! `held` also names `io`'s completion callback) → `channel` (the channel state and
//! shared types) → `state`, `split`, `params` → `spdk_sys`, `qos_core`.

// The registration entry points are only reachable from the constructor, which unit-test
// and fuzz builds leave out (tests and fuzz binaries must not register with SPDK).
#![cfg_attr(any(test, fuzzing), allow(dead_code))]

pub mod channel;
pub mod node;
pub mod params;
/// The RPC-parameter fuzz targets: the mutation fuzzer's test, and with the feature
/// `fuzzing` the coverage-guided targets of `fuzz/libfuzzer` (docs/reliability.md).
#[cfg(any(test, feature = "fuzzing"))]
pub mod params_fuzz;
pub mod rpc;
pub mod split;
pub mod state;

use spdk_sys::module::Loading;
use spdk_sys::vbdev;

/// Registers everything with SPDK, once, when the plugin is loaded.
fn register(loading: &Loading) {
    spdk_sys::log::install();
    spdk_sys::rpc::VersionInfo::of("initiator").log_loaded();
    vbdev::register_module::<channel::IniPolicy>(c"qos_ini", loading);
    rpc::register_all();
}

spdk_sys::at_load!(register);
