//! `nvmf_tgt` (with or without `LD_PRELOAD=libnvmf_qos_tgt.so`) on 127.0.0.1 over TCP,
//! and the subsystems the tests give each host.

use std::path::PathBuf;
use std::time::Duration;

use serde_json::{Value, json};

use crate::app::{App, Launch};
use crate::env::Spdk;
use crate::rpc::RpcError;

/// A running `nvmf_tgt`.
#[derive(Debug)]
pub struct Target {
    app: App,
    pub sock: PathBuf,
    pub shm_id: u32,
    pub log: PathBuf,
}

/// How to start a target.
#[derive(Debug, Clone)]
pub struct TargetOpts {
    /// The plugin to preload, if any.
    pub plugin: Option<PathBuf>,
    /// Shared-memory id (`-i`): distinct per concurrent SPDK process.
    pub shm_id: u32,
    pub core_mask: String,
    /// Hard bound on the target's lifetime.
    pub max_secs: u64,
    /// A JSON configuration to start from (`--json`).
    pub json_config: Option<PathBuf>,
}

impl Target {
    pub fn start(spdk: &Spdk, o: &TargetOpts) -> Result<Target, String> {
        let tag = format!("{}-{}", std::process::id(), o.shm_id);
        let mut args = vec!["-m".into(), o.core_mask.clone().into()];
        // `NVMF_QOS_IT_TARGET_JSON`: a startup configuration for every target a test
        // starts without one of its own (e.g. SPDK's `bdev_set_options`, which only a
        // configuration read at start can set).
        let startup = o.json_config.clone().or_else(|| {
            std::env::var_os("NVMF_QOS_IT_TARGET_JSON")
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
        });
        if let Some(j) = &startup {
            args.push("--json".into());
            args.push(j.clone().into());
        }
        let launch = Launch {
            bin: spdk.nvmf_tgt.clone(),
            args,
            preload: o.plugin.clone(),
            shm_id: o.shm_id,
            max_secs: o.max_secs,
            sock: PathBuf::from(format!("/var/tmp/nvmf-qos-it-{tag}.sock")),
            log: std::env::temp_dir().join(format!("nvmf-qos-it-tgt-{tag}.log")),
            cr_log: false,
        };
        let app = App::start(
            spdk,
            launch,
            "nvmf_tgt",
            "spdk_get_version",
            Duration::from_secs(30),
            30,
        )?;
        Ok(Target {
            sock: app.sock.clone(),
            log: app.log.clone(),
            shm_id: o.shm_id,
            app,
        })
    }

    /// Calls `method`; `Value::Null` params are omitted.
    pub fn rpc(&mut self, method: &str, params: Value) -> Result<Value, RpcError> {
        self.app.rpc(method, params, Duration::from_secs(30))
    }

    /// What `rpc.py save_config` writes: every subsystem's configuration.
    pub fn save_config(&mut self) -> Value {
        let subs = self.call("framework_get_subsystems", Value::Null);
        let mut out = Vec::new();
        for s in subs.as_array().into_iter().flatten() {
            let name = s["subsystem"].as_str().unwrap_or_default().to_string();
            let cfg = self.call("framework_get_config", json!({"name": name}));
            out.push(json!({"subsystem": name, "config": cfg}));
        }
        json!({"subsystems": out})
    }

    /// [`Target::save_config`] written to a file of the temporary directory named after
    /// `tag` (to start a target from, see `Setup::target_from`; the caller removes it).
    pub fn save_config_file(&mut self, tag: &str) -> PathBuf {
        let cfg = self.save_config();
        let file =
            std::env::temp_dir().join(format!("nvmf-qos-it-{tag}-{}.json", std::process::id()));
        let text = serde_json::to_vec_pretty(&cfg).unwrap_or_default();
        std::fs::write(&file, text).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        file
    }

    /// `rpc`, panicking with the method and error (test setup steps).
    pub fn call(&mut self, method: &str, params: Value) -> Value {
        match self.rpc(method, params.clone()) {
            Ok(v) => v,
            Err(e) => panic!(
                "{method} {params} failed: {e}\ntarget log:\n{}",
                self.log_tail(20)
            ),
        }
    }

    pub fn log_tail(&self, n: usize) -> String {
        self.app.log_tail(n)
    }

    /// `nvmf_tgt`'s process id (for `perf record`).
    pub fn pid(&self) -> Option<u32> {
        self.app.app_pid()
    }

    /// `nvmf_tgt`'s resident set in kB (see [`App::rss_kib`]).
    pub fn rss_kib(&self) -> Option<u64> {
        self.app.rss_kib()
    }

    /// Whether `nvmf_tgt` is still running.
    pub fn is_running(&mut self) -> bool {
        self.app.is_running()
    }

    /// Kills `nvmf_tgt` with SIGKILL (see [`App::kill_hard`]).
    pub fn kill_hard(&mut self) {
        self.app.kill_hard()
    }

    /// Stops the target with SIGTERM and waits (at most `secs`); returns how long it
    /// took, or `None` if it had to be killed.
    pub fn stop(&mut self, secs: u64) -> Option<Duration> {
        self.app.stop(secs, Duration::from_millis(20))
    }

    /// A malloc bdev `name`: `num_blocks` blocks of `block_size` bytes.
    pub fn malloc(&mut self, name: &str, num_blocks: u64, block_size: u32) {
        self.call(
            "bdev_malloc_create",
            json!({"name": name, "num_blocks": num_blocks, "block_size": block_size}),
        );
    }

    /// QoS bdev `qos<i>` over `base` for host `i` (1-based, [`host_nqn`]) in domain
    /// `domain`; returns its name.
    pub fn qos_bdev_for_host(&mut self, i: usize, base: &str, domain: &str) -> String {
        let name = format!("qos{i}");
        self.call(
            "qos_bdev_create",
            json!({"name": name, "base_bdev_name": base, "domain": domain,
                   "host_nqn": host_nqn(i)}),
        );
        name
    }

    /// Host `i`'s subsystem ([`subsys_nqn`]) with namespace `bdev`, for host `i` only,
    /// listening on 127.0.0.1:`port` (the TCP transport must exist).
    pub fn expose_host(&mut self, i: usize, bdev: &str, port: u16) {
        self.expose_to_host(&subsys_nqn(i), &host_nqn(i), bdev, port);
    }

    /// A subsystem `subnqn` that only `hostnqn` may use, with namespace `bdev`,
    /// listening on 127.0.0.1:`port` (the TCP transport must exist).
    pub fn expose_to_host(&mut self, subnqn: &str, hostnqn: &str, bdev: &str, port: u16) {
        self.call(
            "nvmf_create_subsystem",
            json!({"nqn": subnqn, "allow_any_host": false}),
        );
        self.call(
            "nvmf_subsystem_add_host",
            json!({"nqn": subnqn, "host": hostnqn}),
        );
        self.call(
            "nvmf_subsystem_add_ns",
            json!({"nqn": subnqn, "namespace": {"bdev_name": bdev}}),
        );
        self.call(
            "nvmf_subsystem_add_listener",
            json!({"nqn": subnqn, "listen_address": {"trtype": "TCP", "adrfam": "IPv4",
                   "traddr": "127.0.0.1", "trsvcid": port.to_string()}}),
        );
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        self.stop(15);
    }
}

/// Host and subsystem NQNs of host `i` (1-based) in the tests.
pub fn host_nqn(i: usize) -> String {
    format!("nqn.2014-08.io.nvmf-qos:it-host-{i}")
}
pub fn subsys_nqn(i: usize) -> String {
    format!("nqn.2016-06.io.spdk:nvmf-qos-it-{i}")
}

/// Sets up one subsystem per host, each allowing only its host, with namespace
/// `bdevs[i]`, listening on 127.0.0.1:`port`. Creates the TCP transport first.
pub fn expose_per_host(t: &mut Target, bdevs: &[String], port: u16) {
    t.call("nvmf_create_transport", json!({"trtype": "TCP"}));
    for (i, b) in bdevs.iter().enumerate() {
        t.expose_host(i + 1, b, port);
    }
}
