//! Harness for the target plugin's integration test and benchmark: finds SPDK at
//! `SPDK_DIR` (default `/opt/spdk`), starts `nvmf_tgt` (with or without
//! `LD_PRELOAD=libnvmf_qos_tgt.so`) on 127.0.0.1 over TCP, talks JSON-RPC to it over its
//! Unix socket, runs `spdk_nvme_perf` as hosts with their own host NQN, and parses the
//! results. Every process is bounded in time and killed when its handle drops.
//!
//! Nothing here links SPDK: on a machine without it the test prints a SKIPPED line.

pub mod nvme_tcp;

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

/// An SPDK v25.09 shared-library build.
#[derive(Debug, Clone)]
pub struct Spdk {
    pub dir: PathBuf,
    pub nvmf_tgt: PathBuf,
    pub perf: PathBuf,
    pub lib_dir: PathBuf,
}

/// What "SPDK present" means, shared with the Makefile: paths under `SPDK_DIR`.
pub const SPDK_PRESENT_LIST: &str = include_str!("../../../spdk-present.list");

/// The paths of [`SPDK_PRESENT_LIST`] missing under `dir` (empty: SPDK is present).
pub fn spdk_missing(dir: &Path, list: &str) -> Vec<PathBuf> {
    list.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| dir.join(l))
        .filter(|p| !p.exists())
        .collect()
}

/// Finds SPDK, or says why not (the caller prints it as the skip reason).
pub fn detect_spdk() -> Result<Spdk, String> {
    let dir = PathBuf::from(std::env::var("SPDK_DIR").unwrap_or_else(|_| "/opt/spdk".into()));
    let s = Spdk {
        nvmf_tgt: dir.join("build/bin/nvmf_tgt"),
        perf: dir.join("build/bin/spdk_nvme_perf"),
        lib_dir: dir.join("build/lib"),
        dir: dir.clone(),
    };
    let missing = spdk_missing(&dir, SPDK_PRESENT_LIST);
    if !missing.is_empty() {
        return Err(format!(
            "SPDK not present at {} (missing {}; set SPDK_DIR to an SPDK v25.09 shared-library build, \
             see spdk-present.list)",
            dir.display(),
            missing
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    Ok(s)
}

/// SPDK, or `None` after printing the SKIPPED line.
/// Also skips (never panics) where SPDK is present but the plugin was not built:
/// `make test-spdk` builds it first.
pub fn spdk_or_skip(what: &str) -> Option<Spdk> {
    match detect_spdk().and_then(|s| plugin_lib().map(|_| s)) {
        Ok(s) => Some(s),
        Err(why) => {
            // Straight to the process's stderr, past the test harness's capture, so the
            // skip is visible in CI logs.
            let _ = writeln!(std::io::stderr(), "SKIPPED: {what}: {why}");
            None
        }
    }
}

/// The plugin's shared library: `$NVMF_QOS_TGT_LIB`, else `<target dir>/release/` then
/// `<target dir>/debug/` next to this executable.
pub fn plugin_lib() -> Result<PathBuf, String> {
    if let Ok(p) = std::env::var("NVMF_QOS_TGT_LIB") {
        let p = PathBuf::from(p);
        return if p.is_file() {
            Ok(p)
        } else {
            Err(format!("NVMF_QOS_TGT_LIB={}: no such file", p.display()))
        };
    }
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    // <target>/<profile>/deps/<test> or <target>/<profile>/<bin>: the release build
    // first, then the executable's own profile, then debug.
    let lib = "libnvmf_qos_tgt.so";
    let ancestors: Vec<&Path> = exe.ancestors().skip(1).take(3).collect();
    let mut candidates = Vec::new();
    if let Ok(t) = std::env::var("CARGO_TARGET_DIR") {
        candidates.push(Path::new(&t).join("release").join(lib));
    }
    candidates.extend(ancestors.iter().map(|a| a.join("release").join(lib)));
    candidates.extend(ancestors.iter().map(|a| a.join(lib)));
    candidates.extend(ancestors.iter().map(|a| a.join("debug").join(lib)));
    candidates.into_iter().find(|p| p.is_file()).ok_or_else(|| {
        "libnvmf_qos_tgt.so not found: build it first with `cargo build --release -p spdk-plugin` \
         (same CARGO_TARGET_DIR) or set NVMF_QOS_TGT_LIB"
            .to_string()
    })
}

/// Makes sure 2 MiB hugepages are available (root can raise them) and mounted.
pub fn ensure_hugepages(pages: u64) -> Result<(), String> {
    let path = "/proc/sys/vm/nr_hugepages";
    let have: u64 = std::fs::read_to_string(path)
        .map_err(|e| format!("{path}: {e}"))?
        .trim()
        .parse()
        .unwrap_or(0);
    if have < pages {
        std::fs::write(path, pages.to_string()).map_err(|e| {
            format!("need {pages} hugepages (have {have}); as root: echo {pages} > {path}: {e}")
        })?;
    }
    let mounted = std::fs::read_to_string("/proc/mounts")
        .map(|m| m.lines().any(|l| l.contains("hugetlbfs")))
        .unwrap_or(false);
    if !mounted {
        let _ = std::fs::create_dir_all("/dev/hugepages");
        let ok = Command::new("mount")
            .args(["-t", "hugetlbfs", "nodev", "/dev/hugepages"])
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        if !ok {
            return Err("cannot mount hugetlbfs on /dev/hugepages".into());
        }
    }
    Ok(())
}

/// Niceness of the SPDK processes: the machine is shared (2 cores), and busy-polling
/// processes lose badly to any other runnable process on their core. A small boost
/// (bounded by the tests' run time) keeps measurements meaningful; `nice` ignores it
/// when not permitted.
pub const NICE: &str = "-10";

/// A JSON-RPC error from the target.
#[derive(Debug, Clone, PartialEq)]
pub struct RpcError {
    pub code: i64,
    pub message: String,
}

impl std::fmt::Display for RpcError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "JSON-RPC error {}: {}", self.code, self.message)
    }
}

/// A running `nvmf_tgt`.
#[derive(Debug)]
pub struct Target {
    child: Option<Child>,
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

/// Calls `method` on the JSON-RPC server at `sock` (one connection per call);
/// `Value::Null` params are omitted.
pub fn rpc(sock: &Path, method: &str, params: Value, timeout: Duration) -> Result<Value, RpcError> {
    let err = |m: String| RpcError {
        code: 0,
        message: m,
    };
    let mut s = UnixStream::connect(sock).map_err(|e| err(format!("connect: {e}")))?;
    s.set_read_timeout(Some(timeout)).ok();
    let mut req = json!({"jsonrpc": "2.0", "method": method, "id": 1});
    if !params.is_null() {
        req["params"] = params;
    }
    s.write_all(req.to_string().as_bytes())
        .map_err(|e| err(format!("send: {e}")))?;
    let mut de = serde_json::Deserializer::from_reader(BufReader::new(s)).into_iter::<Value>();
    let resp = de
        .next()
        .ok_or_else(|| err("no response".into()))?
        .map_err(|e| err(format!("bad response: {e}")))?;
    if let Some(e) = resp.get("error") {
        return Err(RpcError {
            code: e["code"].as_i64().unwrap_or(0),
            message: e["message"].as_str().unwrap_or("").to_string(),
        });
    }
    Ok(resp.get("result").cloned().unwrap_or(Value::Null))
}

impl Target {
    pub fn start(spdk: &Spdk, o: &TargetOpts) -> Result<Target, String> {
        let sock = PathBuf::from(format!(
            "/var/tmp/nvmf-qos-it-{}-{}.sock",
            std::process::id(),
            o.shm_id
        ));
        let _ = std::fs::remove_file(&sock);
        let log = std::env::temp_dir().join(format!(
            "nvmf-qos-it-tgt-{}-{}.log",
            std::process::id(),
            o.shm_id
        ));
        let logf = std::fs::File::create(&log).map_err(|e| e.to_string())?;
        let mut cmd = Command::new("timeout");
        cmd.arg("-s")
            .arg("KILL")
            .arg(o.max_secs.to_string())
            .args(["nice", "-n", NICE])
            .arg("env")
            .arg(format!("LD_LIBRARY_PATH={}", spdk.lib_dir.display()));
        if let Some(p) = &o.plugin {
            // Through `env`, so that only nvmf_tgt (not `timeout`) preloads the plugin.
            cmd.arg(format!("LD_PRELOAD={}", p.display()));
        }
        cmd.arg(&spdk.nvmf_tgt)
            .args([
                "-m",
                &o.core_mask,
                "-i",
                &o.shm_id.to_string(),
                "-u",
                "--disable-cpumask-locks",
                "-r",
            ])
            .arg(&sock);
        if let Some(j) = &o.json_config {
            cmd.arg("--json").arg(j);
        }
        cmd.stdout(logf.try_clone().map_err(|e| e.to_string())?)
            .stderr(logf)
            .stdin(Stdio::null());
        let child = cmd.spawn().map_err(|e| format!("spawn nvmf_tgt: {e}"))?;
        let mut t = Target {
            child: Some(child),
            sock,
            shm_id: o.shm_id,
            log,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if t.sock.exists() && t.rpc("spdk_get_version", Value::Null).is_ok() {
                break;
            }
            if let Some(c) = t.child.as_mut()
                && let Ok(Some(st)) = c.try_wait()
            {
                return Err(format!(
                    "nvmf_tgt exited ({st}) at startup; log:\n{}",
                    t.log_tail(30)
                ));
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "nvmf_tgt did not answer RPCs in 30 s; log:\n{}",
                    t.log_tail(30)
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(t)
    }

    /// Calls `method`; `Value::Null` params are omitted.
    pub fn rpc(&mut self, method: &str, params: Value) -> Result<Value, RpcError> {
        rpc(&self.sock, method, params, Duration::from_secs(30))
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
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }

    /// Stops the target with SIGTERM and waits (at most `secs`); returns how long it
    /// took, or `None` if it had to be killed.
    pub fn stop(&mut self, secs: u64) -> Option<Duration> {
        let mut child = self.child.take()?;
        let start = Instant::now();
        // `timeout` forwards SIGTERM to nvmf_tgt.
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(child.id().to_string())
            .status();
        while start.elapsed() < Duration::from_secs(secs) {
            if let Ok(Some(_)) = child.try_wait() {
                self.cleanup();
                return Some(start.elapsed());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = Command::new("pkill")
            .args(["-KILL", "-P", &child.id().to_string()])
            .status();
        let _ = child.kill();
        let _ = child.wait();
        self.cleanup();
        None
    }

    fn cleanup(&self) {
        let _ = std::fs::remove_file(&self.sock);
        // Pages of a killed process stay reserved while its files exist.
        if let Ok(rd) = std::fs::read_dir("/dev/hugepages") {
            let prefix = format!("spdk{}map_", self.shm_id);
            for e in rd.flatten() {
                if e.file_name().to_string_lossy().starts_with(&prefix) {
                    let _ = std::fs::remove_file(e.path());
                }
            }
        }
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        self.stop(15);
    }
}

/// One host's load.
#[derive(Debug, Clone)]
pub struct PerfJob {
    pub host_nqn: String,
    pub subnqn: String,
    pub port: u16,
    pub qd: u32,
    pub io_size: u32,
    pub pattern: String,
    pub secs: u32,
    pub core_mask: String,
    pub shm_id: u32,
    /// Ask perf for a latency summary (`-L`), for p99.
    pub latency: bool,
}

/// What perf reported.
#[derive(Debug, Clone, Default)]
pub struct PerfResult {
    pub iops: f64,
    pub mibps: f64,
    pub avg_us: f64,
    pub max_us: f64,
    pub p99_us: Option<f64>,
    pub output: String,
    pub ok: bool,
}

/// A running perf.
#[derive(Debug)]
pub struct PerfRun {
    child: Option<Child>,
    job: PerfJob,
}

impl PerfJob {
    pub fn spawn(&self, spdk: &Spdk) -> Result<PerfRun, String> {
        let trid = format!(
            "trtype:TCP adrfam:IPv4 traddr:127.0.0.1 trsvcid:{} subnqn:{} hostnqn:{}",
            self.port, self.subnqn, self.host_nqn
        );
        let mut cmd = Command::new("timeout");
        cmd.args(["-s", "KILL", &(self.secs + 30).to_string()])
            .args(["nice", "-n", NICE])
            .arg(&spdk.perf)
            .env("LD_LIBRARY_PATH", &spdk.lib_dir)
            .args(["-r", &trid])
            .args(["-q", &self.qd.to_string(), "-o", &self.io_size.to_string()])
            .args(["-w", &self.pattern, "-t", &self.secs.to_string()])
            .args(["-c", &self.core_mask, "-i", &self.shm_id.to_string()])
            .args(["--no-huge", "-s", "256"]);
        if self.latency {
            cmd.arg("-L");
        }
        let child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .stdin(Stdio::null())
            .spawn()
            .map_err(|e| format!("spawn spdk_nvme_perf: {e}"))?;
        Ok(PerfRun {
            child: Some(child),
            job: self.clone(),
        })
    }
}

impl PerfRun {
    pub fn job(&self) -> &PerfJob {
        &self.job
    }
    pub fn wait(mut self) -> PerfResult {
        let Some(child) = self.child.take() else {
            return PerfResult::default();
        };
        match child.wait_with_output() {
            Ok(out) => {
                let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
                text.push_str(&String::from_utf8_lossy(&out.stderr));
                let mut r = parse_perf(&text);
                r.ok = out.status.success() && r.iops > 0.0;
                r
            }
            Err(e) => PerfResult {
                output: e.to_string(),
                ..PerfResult::default()
            },
        }
    }
}

impl Drop for PerfRun {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Parses spdk_nvme_perf's `Total` line and, with `-L`, its 99th percentile.
pub fn parse_perf(text: &str) -> PerfResult {
    let mut r = PerfResult {
        output: text.to_string(),
        ..PerfResult::default()
    };
    for line in text.lines() {
        let l = line.trim();
        if l.starts_with("Total") {
            let nums: Vec<f64> = l
                .split(':')
                .nth(1)
                .unwrap_or("")
                .split_whitespace()
                .filter_map(|w| w.parse().ok())
                .collect();
            if nums.len() >= 5 {
                r.iops = nums[0];
                r.mibps = nums[1];
                r.avg_us = nums[2];
                r.max_us = nums[4];
            }
        }
        if r.p99_us.is_none() && l.starts_with("99.00000%") {
            r.p99_us = l
                .split(':')
                .nth(1)
                .map(|v| v.trim().trim_end_matches("us").trim())
                .and_then(|v| v.parse().ok());
        }
    }
    r
}

/// Reservations that follow Zipf's law (1, 1/2, 1/3, ...) and add up to `total`.
pub fn zipf(n: usize, total: u64) -> Vec<u64> {
    let h: f64 = (1..=n).map(|i| 1.0 / i as f64).sum();
    (1..=n)
        .map(|i| (total as f64 / (i as f64 * h)).floor() as u64)
        .collect()
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
        let (h, s) = (host_nqn(i + 1), subsys_nqn(i + 1));
        t.call(
            "nvmf_create_subsystem",
            json!({"nqn": s, "allow_any_host": false}),
        );
        t.call("nvmf_subsystem_add_host", json!({"nqn": s, "host": h}));
        t.call(
            "nvmf_subsystem_add_ns",
            json!({"nqn": s, "namespace": {"bdev_name": b}}),
        );
        t.call(
            "nvmf_subsystem_add_listener",
            json!({"nqn": s, "listen_address": {"trtype": "TCP", "adrfam": "IPv4",
                   "traddr": "127.0.0.1", "trsvcid": port.to_string()}}),
        );
    }
}

/// Reads lines of a file (for logs in failure messages).
pub fn read_lines(p: &Path) -> Vec<String> {
    std::fs::File::open(p)
        .map(|f| BufReader::new(f).lines().map_while(Result::ok).collect())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_perf_totals_and_p99() {
        let out = "\
Device Information : IOPS MiB/s Average min max
TCP (addr:127.0.0.1 subnqn:x) NSID 1 from core  1:    8211.43      32.08    3944.02      69.68  301537.58
========================================================
Total                                                                 :    8211.43      32.08    3944.02      69.68  301537.58

Summary latency data for TCP (addr:127.0.0.1 subnqn:x) NSID 1 from core 1:
=================================================================================
  1.00000% :   100.000us
 99.00000% :  1234.567us
";
        let r = parse_perf(out);
        assert_eq!(r.iops, 8211.43);
        assert_eq!(r.avg_us, 3944.02);
        assert_eq!(r.p99_us, Some(1234.567));
    }

    #[test]
    fn zipf_sums_to_at_most_the_total() {
        let z = zipf(4, 9000);
        assert_eq!(z.len(), 4);
        assert!(z.iter().sum::<u64>() <= 9000);
        assert!(z[0] > 2 * z[1] - 2 && z[1] > z[2] && z[2] > z[3]);
    }

    #[test]
    fn spdk_present_is_every_listed_path() {
        let dir = std::env::temp_dir().join(format!("spdk-present-{}", std::process::id()));
        let list = "# comment\nbuild/bin/nvmf_tgt\n\nbuild/lib/libspdk_nvmf.so\n";
        std::fs::create_dir_all(dir.join("build/bin")).unwrap();
        std::fs::write(dir.join("build/bin/nvmf_tgt"), "").unwrap();
        assert_eq!(
            spdk_missing(&dir, list),
            vec![dir.join("build/lib/libspdk_nvmf.so")]
        );
        std::fs::create_dir_all(dir.join("build/lib")).unwrap();
        std::fs::write(dir.join("build/lib/libspdk_nvmf.so"), "").unwrap();
        assert!(spdk_missing(&dir, list).is_empty());
        std::fs::remove_dir_all(&dir).unwrap();
        // The shipped list names the libraries the Makefile used to test for.
        assert!(SPDK_PRESENT_LIST.contains("build/lib/libspdk_nvmf.so"));
    }
}
