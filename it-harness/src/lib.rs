//! The one integration-test harness of both plugins (`target-it`, `initiator-it`, and
//! the `target-bench` benchmark). It finds SPDK at `SPDK_DIR` (default `/opt/spdk`) and
//! the plugins' shared libraries ([`env`]), starts SPDK applications as bounded child
//! processes ([`app`]): `nvmf_tgt` ([`target`]), `spdk_nvme_perf` ([`perf`]) and
//! bdevperf ([`bdevperf`]) on their cores ([`setup`]), talks JSON-RPC to them ([`rpc`]), and speaks just enough
//! NVMe/TCP to look at raw completions ([`nvme_tcp`]). [`history`] records a QoS domain
//! period by period; [`numbers`] holds the small statistics the tests share; [`profile`]
//! runs Linux `perf` on the processes for the benchmarks.
//!
//! Nothing here links SPDK: on a machine without it the tests print a SKIPPED line.
//! Every item is also re-exported at the crate root (`use it_harness::*`).

pub mod app;
pub mod bdevperf;
pub mod env;
pub mod etcd;
pub mod history;
pub mod numbers;
pub mod nvme_tcp;
pub mod perf;
pub mod profile;
pub mod rpc;
pub mod setup;
pub mod target;

pub use bdevperf::*;
pub use env::*;
pub use history::*;
pub use numbers::*;
pub use perf::*;
pub use profile::*;
pub use rpc::*;
pub use setup::*;
pub use target::*;
