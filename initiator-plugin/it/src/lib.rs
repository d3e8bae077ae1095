//! Harness for the initiator plugin's integration tests: finds bdevperf and fio's SPDK
//! bdev plugin next to the SPDK build at `SPDK_DIR` (the target side, `nvmf_tgt` with
//! the target plugin, comes from `target_it`), starts bdevperf (with or without
//! `LD_PRELOAD=libnvmf_qos_ini.so`) with a JSON configuration and a job file, drives it
//! over its RPC socket (`-z` + `perform_tests`), and parses its results. Every process
//! is bounded in time and killed when its handle drops.
//!
//! Nothing here links SPDK: on a machine without it the tests print a SKIPPED line.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
pub use target_it::{NICE, RpcError, Spdk, Target, TargetOpts, ensure_hugepages, rpc, zipf};

/// SPDK's initiator applications.
#[derive(Debug, Clone)]
pub struct Initiators {
    pub spdk: Spdk,
    pub bdevperf: PathBuf,
    /// fio's SPDK bdev ioengine and a fio binary, when both are present.
    pub fio: Option<(PathBuf, PathBuf)>,
}

/// Finds SPDK (target side) and bdevperf, or says why not.
pub fn detect() -> Result<Initiators, String> {
    let spdk = target_it::detect_spdk()?;
    let bdevperf = spdk.dir.join("build/examples/bdevperf");
    if !bdevperf.exists() {
        return Err(format!(
            "bdevperf not found at {} (SPDK built without examples?)",
            bdevperf.display()
        ));
    }
    let plugin = spdk.dir.join("build/fio/spdk_bdev");
    let fio = which("fio");
    let fio = match (plugin.exists(), fio) {
        (true, Some(f)) => Some((plugin, f)),
        _ => None,
    };
    Ok(Initiators {
        spdk,
        bdevperf,
        fio,
    })
}

fn which(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|p| {
        std::env::split_paths(&p)
            .map(|d| d.join(name))
            .find(|f| f.is_file())
    })
}

/// The initiators, or `None` after printing the SKIPPED line.
/// Also skips (never panics) where SPDK is present but a plugin was not built.
pub fn initiators_or_skip(what: &str) -> Option<Initiators> {
    match detect().and_then(|s| ini_lib().and(tgt_lib()).map(|_| s)) {
        Ok(s) => Some(s),
        Err(why) => {
            let _ = writeln!(std::io::stderr(), "SKIPPED: {what}: {why}");
            None
        }
    }
}

/// A shared library built by this workspace: `$env`, else `<target dir>/release/`
/// then the test executable's own profile, then `debug/`.
pub fn built_lib(lib: &str, env: &str, package: &str) -> Result<PathBuf, String> {
    if let Ok(p) = std::env::var(env) {
        return Ok(PathBuf::from(p));
    }
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let ancestors: Vec<&Path> = exe.ancestors().skip(1).take(3).collect();
    let mut candidates = Vec::new();
    if let Ok(t) = std::env::var("CARGO_TARGET_DIR") {
        candidates.push(Path::new(&t).join("release").join(lib));
    }
    candidates.extend(ancestors.iter().map(|a| a.join("release").join(lib)));
    candidates.extend(ancestors.iter().map(|a| a.join(lib)));
    candidates.extend(ancestors.iter().map(|a| a.join("debug").join(lib)));
    candidates.into_iter().find(|p| p.is_file()).ok_or_else(|| {
        format!(
            "{lib} not found: build it first with `cargo build --release -p {package}` \
             (same CARGO_TARGET_DIR) or set {env}"
        )
    })
}

/// `libnvmf_qos_ini.so`.
pub fn ini_lib() -> Result<PathBuf, String> {
    built_lib("libnvmf_qos_ini.so", "NVMF_QOS_INI_LIB", "initiator-plugin")
}

/// `libnvmf_qos_tgt.so`.
pub fn tgt_lib() -> Result<PathBuf, String> {
    target_it::plugin_lib()
}

/// One bdev_nvme controller of the initiator (one host of the target).
#[derive(Debug, Clone)]
pub struct Controller {
    pub name: String,
    pub subnqn: String,
    pub hostnqn: String,
    pub port: u16,
}

impl Controller {
    /// The namespace bdev bdev_nvme creates for it.
    pub fn bdev(&self) -> String {
        format!("{}n1", self.name)
    }
    pub fn attach(&self) -> Value {
        json!({"method": "bdev_nvme_attach_controller", "params": {
            "name": self.name, "trtype": "TCP", "adrfam": "IPv4", "traddr": "127.0.0.1",
            "trsvcid": self.port.to_string(), "subnqn": self.subnqn, "hostnqn": self.hostnqn}})
    }
}

/// An SPDK JSON configuration: the controllers, then `qos_ini_bdev_create` with each of
/// `qos` (parameters), then `bdev_wait_for_examine`.
pub fn bdev_config(ctrls: &[Controller], qos: &[Value]) -> Value {
    let mut cfg: Vec<Value> = ctrls.iter().map(Controller::attach).collect();
    for q in qos {
        cfg.push(json!({"method": "qos_ini_bdev_create", "params": q}));
    }
    cfg.push(json!({"method": "bdev_wait_for_examine"}));
    json!({"subsystems": [{"subsystem": "bdev", "config": cfg}]})
}

/// One bdevperf job (a section of its job file).
#[derive(Debug, Clone)]
pub struct Job {
    pub bdev: String,
    pub rw: String,
    pub bs: u64,
    pub qd: u32,
}

impl Job {
    pub fn new(bdev: &str, rw: &str, bs: u64, qd: u32) -> Job {
        Job {
            bdev: bdev.into(),
            rw: rw.into(),
            bs,
            qd,
        }
    }
}

/// How to start bdevperf.
#[derive(Debug, Clone)]
pub struct BdevperfOpts {
    /// Preload the initiator plugin.
    pub plugin: Option<PathBuf>,
    pub config: Value,
    pub jobs: Vec<Job>,
    pub secs: u32,
    pub shm_id: u32,
    pub core_mask: String,
    /// Extra arguments (e.g. `-f` to continue after failures).
    pub extra: Vec<String>,
}

/// A running bdevperf, waiting for `perform_tests` (started with `-z`).
#[derive(Debug)]
pub struct Bdevperf {
    child: Option<Child>,
    pub sock: PathBuf,
    pub log: PathBuf,
    dir: PathBuf,
    secs: u32,
    shm_id: u32,
}

impl Bdevperf {
    pub fn start(ini: &Initiators, o: &BdevperfOpts) -> Result<Bdevperf, String> {
        let tag = format!("{}-{}", std::process::id(), o.shm_id);
        let dir = std::env::temp_dir().join(format!("nvmf-qos-ini-it-{tag}"));
        std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
        let cfg = dir.join("bdev.json");
        std::fs::write(
            &cfg,
            serde_json::to_vec_pretty(&o.config).unwrap_or_default(),
        )
        .map_err(|e| e.to_string())?;
        let jobf = dir.join("jobs.conf");
        let mut jobs = String::new();
        for (i, j) in o.jobs.iter().enumerate() {
            jobs.push_str(&format!(
                "[job{i}]\nfilename={}\nrw={}\nbs={}\niodepth={}\n",
                j.bdev, j.rw, j.bs, j.qd
            ));
        }
        std::fs::write(&jobf, jobs).map_err(|e| e.to_string())?;
        let sock = PathBuf::from(format!("/var/tmp/nvmf-qos-ini-it-{tag}.sock"));
        let _ = std::fs::remove_file(&sock);
        let log = dir.join("bdevperf.log");
        let logf = std::fs::File::create(&log).map_err(|e| e.to_string())?;
        let mut cmd = Command::new("timeout");
        cmd.args(["-s", "KILL", &(o.secs + 90).to_string()])
            .args(["nice", "-n", NICE])
            .arg("env")
            .arg(format!("LD_LIBRARY_PATH={}", ini.spdk.lib_dir.display()));
        if let Some(p) = &o.plugin {
            cmd.arg(format!("LD_PRELOAD={}", p.display()));
        }
        cmd.arg(&ini.bdevperf)
            .arg("--json")
            .arg(&cfg)
            .arg("-j")
            .arg(&jobf)
            .args(["-t", &o.secs.to_string(), "-l", "-z"])
            .args(["-m", &o.core_mask, "-i", &o.shm_id.to_string()])
            .args(["-u", "--disable-cpumask-locks", "-r"])
            .arg(&sock)
            .args(&o.extra)
            .stdout(logf.try_clone().map_err(|e| e.to_string())?)
            .stderr(logf)
            .stdin(Stdio::null());
        let child = cmd.spawn().map_err(|e| format!("spawn bdevperf: {e}"))?;
        let mut b = Bdevperf {
            child: Some(child),
            sock,
            log,
            dir,
            secs: o.secs,
            shm_id: o.shm_id,
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if b.sock.exists()
                && b.rpc("bdev_get_bdevs", Value::Null, Duration::from_secs(10))
                    .is_ok()
            {
                return Ok(b);
            }
            if let Some(c) = b.child.as_mut()
                && let Ok(Some(st)) = c.try_wait()
            {
                return Err(format!(
                    "bdevperf exited ({st}) at startup; log:\n{}",
                    b.log_tail(30)
                ));
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "bdevperf did not answer RPCs in 60 s; log:\n{}",
                    b.log_tail(30)
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    pub fn rpc(&self, method: &str, params: Value, timeout: Duration) -> Result<Value, RpcError> {
        rpc(&self.sock, method, params, timeout)
    }

    /// `rpc`, panicking with the method and error (setup steps).
    pub fn call(&self, method: &str, params: Value) -> Value {
        match self.rpc(method, params.clone(), Duration::from_secs(30)) {
            Ok(v) => v,
            Err(e) => panic!(
                "{method} {params} failed: {e}\nbdevperf log:\n{}",
                self.log_tail(20)
            ),
        }
    }

    /// Starts the jobs in the background; the returned handle gets the results.
    pub fn perform_tests(&self) -> std::thread::JoinHandle<Result<Value, RpcError>> {
        let sock = self.sock.clone();
        let t = Duration::from_secs(self.secs as u64 + 60);
        std::thread::spawn(move || rpc(&sock, "perform_tests", Value::Null, t))
    }

    /// Stops bdevperf after its tests (with `-z` it waits for more after a successful
    /// run): SIGTERM, then waits at most `secs` for it to exit (application shutdown,
    /// which unregisters the QoS bdevs). Returns its output, or `None` if it had to be
    /// killed (a hang).
    pub fn finish(&mut self, secs: u64) -> Option<String> {
        if let Some(c) = self.child.as_mut()
            && matches!(c.try_wait(), Ok(None))
        {
            let _ = Command::new("kill")
                .arg("-TERM")
                .arg(c.id().to_string())
                .status();
        }
        self.wait_exit(secs)
    }

    /// Waits for bdevperf to exit; returns its output, or `None` if it had to be killed
    /// after `secs`.
    pub fn wait_exit(&mut self, secs: u64) -> Option<String> {
        let mut child = self.child.take()?;
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(secs) {
            if let Ok(Some(_)) = child.try_wait() {
                self.cleanup();
                return Some(std::fs::read_to_string(&self.log).unwrap_or_default());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = Command::new("pkill")
            .args(["-KILL", "-P", &child.id().to_string()])
            .status();
        let _ = child.kill();
        let _ = child.wait();
        self.cleanup();
        None
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn log_tail(&self, n: usize) -> String {
        let text = self.log_text().replace('\r', "\n");
        let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }

    /// Stops bdevperf with SIGTERM (through `timeout`) and waits at most `secs`.
    pub fn stop(&mut self, secs: u64) -> Option<Duration> {
        let child = self.child.as_ref()?;
        let start = Instant::now();
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(child.id().to_string())
            .status();
        self.wait_exit(secs).map(|_| start.elapsed())
    }

    fn cleanup(&self) {
        let _ = std::fs::remove_file(&self.sock);
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

impl Drop for Bdevperf {
    fn drop(&mut self) {
        if self.child.is_some() {
            self.stop(15);
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// One job's results: `perform_tests`'s JSON plus the p99 from the latency summary.
#[derive(Debug, Clone, Default)]
pub struct JobResult {
    pub iops: f64,
    pub mibps: f64,
    pub io_failed: u64,
    pub avg_us: f64,
    pub max_us: f64,
    pub p50_us: Option<f64>,
    pub p99_us: Option<f64>,
}

/// Results by bdev name, from `perform_tests`'s result and bdevperf's output (`-l`).
pub fn job_results(perform: &Value, output: &str) -> BTreeMap<String, JobResult> {
    let pct = latency_summary(output);
    let mut out = BTreeMap::new();
    for r in perform["results"].as_array().into_iter().flatten() {
        let name = r["job"].as_str().unwrap_or("").to_string();
        let p = pct.get(&name);
        out.insert(
            name,
            JobResult {
                iops: r["iops"].as_f64().unwrap_or(0.0),
                mibps: r["mibps"].as_f64().unwrap_or(0.0),
                io_failed: r["io_failed"].as_u64().unwrap_or(0),
                avg_us: r["avg_latency_us"].as_f64().unwrap_or(0.0),
                max_us: r["max_latency_us"].as_f64().unwrap_or(0.0),
                p50_us: p.and_then(|m| m.get("50.00000").copied()),
                p99_us: p.and_then(|m| m.get("99.00000").copied()),
            },
        );
    }
    out
}

/// Parses bdevperf's "Latency summary": job name -> percentile -> microseconds.
pub fn latency_summary(output: &str) -> BTreeMap<String, BTreeMap<String, f64>> {
    let text = output.replace('\r', "\n");
    let mut out: BTreeMap<String, BTreeMap<String, f64>> = BTreeMap::new();
    let mut in_summary = false;
    let mut job: Option<String> = None;
    for line in text.lines() {
        let l = line.trim();
        if l.starts_with("Latency summary") {
            in_summary = true;
            continue;
        }
        if l.starts_with("Latency histogram") {
            in_summary = false;
        }
        if !in_summary {
            continue;
        }
        if let Some(rest) = l.strip_prefix("Job: ") {
            job = rest.split(" (").next().map(str::to_string);
            continue;
        }
        if let (Some(j), Some((p, v))) = (&job, l.split_once("% :"))
            && let Ok(v) = v.trim().trim_end_matches("us").trim().parse::<f64>()
        {
            out.entry(j.clone())
                .or_default()
                .insert(p.trim().to_string(), v);
        }
    }
    out
}

/// The median of `v` (0 when empty).
pub fn median(v: &[f64]) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    let n = s.len();
    if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_latency_summary_per_job() {
        let out = "\
\r Total                       :               8191.43      32.00       0.00     0.00    3904.41      89.09   10420.22

 Latency summary
\r =============================================
\r Job: qr (Core Mask 0x2)
 50.00000% :   103.936us
 99.00000% :   339.968us

\r =============================================
\r Job: qw (Core Mask 0x2)
 50.00000% :  3325.952us
 99.00000% :  8454.144us
";
        let s = latency_summary(out);
        assert_eq!(s["qr"]["99.00000"], 339.968);
        assert_eq!(s["qw"]["50.00000"], 3325.952);
        let perform = json!({"results": [{"job": "qr", "iops": 10.5, "mibps": 1.0, "io_failed": 0,
            "avg_latency_us": 5.0, "max_latency_us": 9.0}]});
        let r = job_results(&perform, out);
        assert_eq!(r["qr"].p99_us, Some(339.968));
        assert_eq!(r["qr"].iops, 10.5);
    }

    #[test]
    fn config_attaches_then_creates() {
        let c = Controller {
            name: "N1".into(),
            subnqn: "s".into(),
            hostnqn: "h".into(),
            port: 4420,
        };
        let v = bdev_config(&[c], &[json!({"name": "q", "base_bdev_name": "N1n1"})]);
        let cfg = v["subsystems"][0]["config"].as_array().unwrap();
        assert_eq!(cfg[0]["method"], "bdev_nvme_attach_controller");
        assert_eq!(cfg[1]["method"], "qos_ini_bdev_create");
        assert_eq!(cfg[2]["method"], "bdev_wait_for_examine");
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0]), 2.5);
    }
}
