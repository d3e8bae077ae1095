//! The common start of the plugin tests: SPDK's initiator applications and both
//! plugins found (or the test skipped, saying why), hugepages reserved, and the two
//! processes every test runs placed on the two cores: `nvmf_tgt` on core 0, the one
//! initiator process (bdevperf) on core 1.

use std::path::PathBuf;

use serde_json::Value;

use crate::bdevperf::{Bdevperf, BdevperfOpts, Job};
use crate::env::{Hugepages, Initiators, ensure_hugepages, ini_lib, initiators_or_skip, tgt_lib};
use crate::target::{Target, TargetOpts};

/// SPDK's initiators and both plugins' libraries, with hugepages reserved while it
/// lives (declare it before the processes that use them, so it is dropped after).
#[derive(Debug)]
pub struct Setup {
    pub ini: Initiators,
    pub tgt_lib: PathBuf,
    pub ini_lib: PathBuf,
    _hugepages: Hugepages,
}

/// The setup, or `None` after printing `SKIPPED: <what>: ...` when SPDK, bdevperf or a
/// plugin is missing. Reserves 1024 hugepages until it is dropped.
pub fn setup_or_skip(what: &str) -> Option<Setup> {
    let ini = initiators_or_skip(what)?;
    let libs = tgt_lib().and_then(|t| ini_lib().map(|i| (t, i)));
    let (tgt_lib, ini_lib) = libs.unwrap_or_else(|e| panic!("{e}"));
    let hugepages = ensure_hugepages(1024).unwrap_or_else(|e| panic!("{e}"));
    Some(Setup {
        ini,
        tgt_lib,
        ini_lib,
        _hugepages: hugepages,
    })
}

impl Setup {
    /// `nvmf_tgt` on core 0, with the target plugin when `plugin`, from `json_config`
    /// when given; killed after `max_secs` whatever happens.
    pub fn target(
        &self,
        shm_id: u32,
        plugin: bool,
        max_secs: u64,
        json_config: Option<PathBuf>,
    ) -> Target {
        Target::start(
            &self.ini.spdk,
            &TargetOpts {
                plugin: plugin.then(|| self.tgt_lib.clone()),
                shm_id,
                core_mask: "0x1".into(),
                max_secs,
                json_config,
            },
        )
        .unwrap_or_else(|e| panic!("{e}"))
    }

    /// bdevperf on core 1 (`-z`: waiting for `perform_tests`), with the initiator
    /// plugin when `plugin`.
    pub fn bdevperf(
        &self,
        shm_id: u32,
        plugin: bool,
        config: Value,
        jobs: Vec<Job>,
        secs: u32,
        extra: &[&str],
    ) -> Bdevperf {
        Bdevperf::start(
            &self.ini,
            &BdevperfOpts {
                plugin: plugin.then(|| self.ini_lib.clone()),
                config,
                jobs,
                secs,
                shm_id,
                core_mask: "0x2".into(),
                extra: extra.iter().map(|e| e.to_string()).collect(),
            },
        )
        .unwrap_or_else(|e| panic!("{e}"))
    }
}
