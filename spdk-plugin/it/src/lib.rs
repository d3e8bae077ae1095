//! The target plugin's integration test (`tests/target_qos.rs`) and benchmark
//! (`target-bench`). The harness they use (SPDK detection, `nvmf_tgt`,
//! `spdk_nvme_perf`, JSON-RPC, the minimal NVMe/TCP host) is the workspace's one
//! harness crate, `it-harness`, re-exported here whole.

pub use it_harness::*;
