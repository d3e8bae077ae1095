//! The one prologue of the plugin tests: [`setup_or_skip`]. It finds SPDK's applications
//! and both plugins (or skips the test, saying why), serialises the SPDK tests of one
//! test binary, reserves hugepages and picks a free TCP port; the [`Setup`] then starts
//! the processes every test runs, placed on the two cores: `nvmf_tgt` on core 0, the
//! initiator process (bdevperf, `spdk_nvme_perf`) on core 1, each with a shared-memory id
//! of its own.

use std::collections::BTreeSet;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, MutexGuard};

use serde_json::{Value, json};

use crate::bdevperf::{Bdevperf, BdevperfOpts, Controller, Job, bdev_config};
use crate::env::{Hugepages, Initiators, ensure_hugepages, ini_lib, initiators_or_skip, tgt_lib};
use crate::perf::{PerfJob, PerfRun};
use crate::target::{Target, TargetOpts, expose_per_host, host_nqn, subsys_nqn};

/// SPDK processes of the tests must not overlap (cores, hugepages, ports): every
/// [`Setup`] holds this lock while it lives, so the tests of one binary run one at a
/// time whatever `--test-threads` says.
static SERIAL: Mutex<()> = Mutex::new(());

/// What a test runs with: SPDK's initiators and both plugins' libraries, hugepages
/// reserved and the tests' lock held while it lives (declare it before the processes
/// that use them, so it is dropped after), and the port its targets listen on.
#[derive(Debug)]
pub struct Setup {
    pub ini: Initiators,
    pub tgt_lib: PathBuf,
    pub ini_lib: PathBuf,
    /// The TCP port of the test's target (free when the setup was made); a test with a
    /// second target takes another from [`free_port`].
    pub port: u16,
    _hugepages: Hugepages,
    // Last: released after the hugepages are given back.
    _serial: MutexGuard<'static, ()>,
}

/// The setup, or `None` after printing `SKIPPED: <what>: ...` when SPDK, bdevperf or a
/// plugin is missing. Waits for the other tests of this binary to end; reserves 1024
/// hugepages until it is dropped. (Take one per test: a second in the same test waits
/// for ever.)
pub fn setup_or_skip(what: &str) -> Option<Setup> {
    let ini = initiators_or_skip(what)?;
    let libs = tgt_lib().and_then(|t| ini_lib().map(|i| (t, i)));
    let (tgt_lib, ini_lib) = libs.unwrap_or_else(|e| panic!("{e}"));
    let serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let hugepages = ensure_hugepages(1024).unwrap_or_else(|e| panic!("{e}"));
    Some(Setup {
        ini,
        tgt_lib,
        ini_lib,
        port: free_port(),
        _hugepages: hugepages,
        _serial: serial,
    })
}

/// A TCP port on 127.0.0.1 free now and not handed out before by this process (the
/// kernel may give the same free port twice in a row, and a port is handed out before
/// the process that binds it starts).
pub fn free_port() -> u16 {
    static HANDED_OUT: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());
    loop {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("a free port on 127.0.0.1");
        if HANDED_OUT
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(port)
        {
            return port;
        }
    }
}

/// A shared-memory id (`-i`) no other SPDK process of this test binary has had: SPDK
/// names its hugepage files and trace buffer by it.
pub fn shm_id() -> u32 {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    40 + NEXT.fetch_add(1, Ordering::Relaxed) % 900
}

impl Setup {
    /// `nvmf_tgt` with the target plugin, killed after `max_secs` whatever happens.
    pub fn target(&self, max_secs: u64) -> Target {
        self.start_target(true, max_secs, None, "0x1")
    }

    /// [`Setup::target`] on the cores of `core_mask` (e.g. `0x3`: a poll group on each
    /// of two cores; the tests' initiators then share a core with it).
    pub fn target_on(&self, max_secs: u64, core_mask: &str) -> Target {
        self.start_target(true, max_secs, None, core_mask)
    }

    /// `nvmf_tgt` without the plugin.
    pub fn bare_target(&self, max_secs: u64) -> Target {
        self.start_target(false, max_secs, None, "0x1")
    }

    /// `nvmf_tgt` with the plugin, started from a JSON configuration (`--json`, e.g. what
    /// [`Target::save_config`] gave).
    pub fn target_from(&self, config: &Path, max_secs: u64) -> Target {
        self.start_target(true, max_secs, Some(config.to_path_buf()), "0x1")
    }

    fn start_target(
        &self,
        plugin: bool,
        max_secs: u64,
        json_config: Option<PathBuf>,
        core_mask: &str,
    ) -> Target {
        Target::start(
            &self.ini.spdk,
            &TargetOpts {
                plugin: plugin.then(|| self.tgt_lib.clone()),
                shm_id: shm_id(),
                core_mask: core_mask.into(),
                max_secs,
                json_config: json_config.clone(),
            },
        )
        .unwrap_or_else(|e| match json_config {
            Some(c) => panic!("nvmf_tgt from {}: {e}", c.display()),
            None => panic!("{e}"),
        })
    }

    /// A target with the plugin and one host: malloc bdev `Malloc0` of `blocks` blocks
    /// of `block_size` bytes, domain `d` created with `domain` (its parameters but the
    /// name), host 1 set with `host` (its parameters but domain and NQN), and host 1's
    /// QoS bdev `qos1` over `Malloc0`, exposed to it on the setup's port.
    pub fn one_host_target(
        &self,
        max_secs: u64,
        (blocks, block_size): (u64, u32),
        domain: Value,
        host: Value,
    ) -> Target {
        let mut t = self.target(max_secs);
        t.malloc("Malloc0", blocks, block_size);
        let mut d = json!({"name": "d"});
        let mut h = json!({"domain": "d", "host_nqn": host_nqn(1)});
        for (to, from) in [(&mut d, &domain), (&mut h, &host)] {
            for (k, v) in from.as_object().into_iter().flatten() {
                to[k] = v.clone();
            }
        }
        t.call("qos_domain_create", d);
        t.call("qos_host_set", h);
        let bdev = t.qos_bdev_for_host(1, "Malloc0", "d");
        expose_per_host(&mut t, &[bdev], self.port);
        t
    }

    /// bdevperf (`-z`: waiting for `perform_tests`) with the initiator plugin when
    /// `plugin`, running `jobs` on the bdevs of `config` for `secs`; `extra` arguments
    /// (e.g. `-f`: jobs go on after a failed I/O).
    pub fn bdevperf(
        &self,
        plugin: bool,
        config: Value,
        jobs: Vec<Job>,
        secs: u32,
        extra: &[&str],
    ) -> Bdevperf {
        self.bdevperf_on(plugin, config, jobs, secs, extra, "0x2")
    }

    /// bdevperf on core 1 with one 4 KiB random-read job per host of `hosts` (each its
    /// own controller and host NQN), host `hosts[k]` at queue depth `qds[k]`, for `secs`:
    /// every initiator of a test in one process, so that none starves another.
    pub fn randread_per_host(&self, hosts: &[usize], qds: &[u32], secs: u32) -> Bdevperf {
        let ctrls: Vec<Controller> = hosts.iter().map(|&i| self.controller(i)).collect();
        let jobs = ctrls
            .iter()
            .zip(qds)
            .map(|(c, &qd)| Job::new(&c.bdev(), "randread", 4096, qd))
            .collect();
        self.bdevperf(false, bdev_config(&ctrls, &[]), jobs, secs, &[])
    }

    /// [`Setup::bdevperf`] on the cores of `core_mask` (a job goes to the cores of its
    /// own `cpumask` when it has one).
    pub fn bdevperf_on(
        &self,
        plugin: bool,
        config: Value,
        jobs: Vec<Job>,
        secs: u32,
        extra: &[&str],
        core_mask: &str,
    ) -> Bdevperf {
        Bdevperf::start(
            &self.ini,
            &BdevperfOpts {
                plugin: plugin.then(|| self.ini_lib.clone()),
                config,
                jobs,
                secs,
                shm_id: shm_id(),
                core_mask: core_mask.into(),
                extra: extra.iter().map(|e| e.to_string()).collect(),
            },
        )
        .unwrap_or_else(|e| panic!("{e}"))
    }

    /// Controller `Nvme<i>` of host `i` (1-based) to its subsystem on the setup's port.
    pub fn controller(&self, i: usize) -> Controller {
        Controller::of_host(i, self.port)
    }

    /// Starts `spdk_nvme_perf` with `job`.
    pub fn perf(&self, job: &PerfJob) -> PerfRun {
        job.spawn(&self.ini.spdk).unwrap_or_else(|e| panic!("{e}"))
    }

    /// `spdk_nvme_perf` as host `i` (1-based) on its subsystem at the setup's port, on
    /// core 1: `pattern` (e.g. `randread`) of `io_size` bytes at queue depth `qd`.
    pub fn perf_job(&self, i: usize, pattern: &str, io_size: u32, qd: u32, secs: u32) -> PerfJob {
        PerfJob {
            host_nqn: host_nqn(i),
            subnqn: subsys_nqn(i),
            port: self.port,
            qd,
            io_size,
            pattern: pattern.into(),
            secs,
            core_mask: "0x2".into(),
            shm_id: shm_id(),
            latency: false,
        }
    }
}
