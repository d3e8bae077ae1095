//! The initiator plugin's integration tests (`tests/initiator_qos.rs`: bdevperf and
//! fio's SPDK bdev ioengine with `libnvmf_qos_ini.so`, against `nvmf_tgt` with the
//! target plugin) and benchmark (`initiator-bench`). Tests of the target plugin's own
//! features live in the target's test crate (`spdk-plugin/it`). The harness they use is
//! the workspace's one harness crate, `it-harness`, re-exported here whole; this crate
//! does not depend on the target's test crate.

pub use it_harness::*;
