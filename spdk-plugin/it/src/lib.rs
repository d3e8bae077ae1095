//! The target plugin's integration tests and benchmark (`target-bench`), against a real
//! `nvmf_tgt`: `tests/target_qos.rs` (reservations and limits, reconfiguration, the
//! RPCs, the token protocol over NVMe/TCP), `tests/weighted_qos.rs` (weighted sharing,
//! capacity drops, tenant groups, priority classes: `make accept`),
//! `tests/reliability.rs` (soak with churn, SIGKILL and restart, a hostile host),
//! `tests/burst.rs` (burst credits near saturation) and `tests/cluster.rs` (two targets
//! and their agents). Their hosts are `spdk_nvme_perf`,
//! bdevperf (plain bdev_nvme, some through the initiator plugin) and it-harness's
//! minimal NVMe/TCP host. The harness they use is the workspace's one harness crate,
//! `it-harness`, re-exported here whole; [`workload`] holds the hosts' loads the
//! side-by-side test and the instrument (`tests/instrument.rs`, issue 38) share.

pub use it_harness::*;

pub mod workload;
pub use workload::*;
