//! The one integration-test harness of both plugins (`target-it`, `initiator-it`, and
//! the `target-bench` and `initiator-bench` benchmarks). Every test starts with the same
//! prologue, [`setup_or_skip`] ([`setup`]): SPDK found at `SPDK_DIR` (default
//! `/opt/spdk`) with the plugins' shared libraries ([`env`]), the tests of one binary
//! serialised, hugepages reserved, a free port; the [`Setup`] starts SPDK applications as
//! bounded child processes ([`app`]): `nvmf_tgt` ([`target`]), `spdk_nvme_perf`
//! ([`perf`]) and bdevperf with its runners ([`bdevperf`]), talks JSON-RPC to them
//! ([`rpc`]), and speaks just enough NVMe/TCP to look at raw completions ([`nvme_tcp`]).
//! [`stats`] reads the target plugin's `qos_stats_get` into typed statistics, [`history`]
//! records a QoS domain period by period from them, [`judge`] tells which of those
//! periods a host's reservation is judged in; [`checks`] holds the acceptance
//! thresholds and expected refusals, [`numbers`] the small statistics the tests share;
//! [`etcd`] runs a real etcd (one, or the members of an etcd cluster) for the cluster
//! tests, [`pki`] makes their TLS certificates; [`profile`] runs Linux `perf` on the
//! processes for the benchmarks; [`cgroup`] puts a CPU quota on the target; [`toggle`]
//! holds the toggle instrument's arithmetic and counter readers (issue 38).
//!
//! Nothing here links SPDK: on a machine without it the tests print a SKIPPED line.
//! Every item is also re-exported at the crate root (`use it_harness::*`).

pub mod app;
pub mod bdevperf;
pub mod cgroup;
pub mod checks;
pub mod env;
pub mod etcd;
pub mod history;
pub mod judge;
pub mod numbers;
pub mod nvme_tcp;
pub mod perf;
pub mod pki;
pub mod profile;
pub mod rpc;
pub mod setup;
pub mod stats;
pub mod target;
pub mod toggle;

pub use app::tail;
pub use bdevperf::*;
pub use cgroup::*;
pub use checks::*;
pub use env::*;
pub use history::*;
pub use judge::*;
pub use numbers::*;
pub use perf::*;
pub use profile::*;
pub use rpc::*;
pub use setup::*;
pub use stats::*;
pub use target::*;
pub use toggle::*;
