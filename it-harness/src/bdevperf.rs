//! bdevperf as an SPDK initiator application: its JSON configuration (bdev_nvme
//! controllers, then the initiator plugin's QoS bdevs) and job file, started with `-z`
//! and driven over its RPC socket (`perform_tests`), and its results.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use serde_json::{Value, json};

use crate::app::{App, Launch, tail};
use crate::env::Initiators;
use crate::rpc::{RpcError, rpc};
use crate::target::{host_nqn, subsys_nqn};

/// One bdev_nvme controller of the initiator (one host of the target).
#[derive(Debug, Clone)]
pub struct Controller {
    pub name: String,
    pub subnqn: String,
    pub hostnqn: String,
    pub port: u16,
}

impl Controller {
    /// Controller `Nvme<i>` of host `i` (1-based): [`host_nqn`]`(i)` to its own
    /// subsystem [`subsys_nqn`]`(i)` on 127.0.0.1:`port`.
    pub fn of_host(i: usize, port: u16) -> Controller {
        Controller {
            name: format!("Nvme{i}"),
            subnqn: subsys_nqn(i),
            hostnqn: host_nqn(i),
            port,
        }
    }
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
    /// The cores the job runs on (bdevperf's `cpumask`); `None`: bdevperf's choice.
    pub cpumask: Option<String>,
    /// The blocks the job uses, `(offset, length)` in the bdev's blocks; `None`: all
    /// of it. Two `verify` jobs on one bdev need ranges of their own, or each reads
    /// back what the other wrote.
    pub blocks: Option<(u64, u64)>,
    /// Percent of reads of a mixed job (`rw=randrw`; bdevperf's `rwmixread`).
    pub read_mix: Option<u32>,
}

impl Job {
    pub fn new(bdev: &str, rw: &str, bs: u64, qd: u32) -> Job {
        Job {
            bdev: bdev.into(),
            rw: rw.into(),
            bs,
            qd,
            cpumask: None,
            blocks: None,
            read_mix: None,
        }
    }

    /// A mixed job (`rw` `randrw`) with `percent` % reads.
    pub fn with_read_mix(mut self, percent: u32) -> Job {
        self.read_mix = Some(percent);
        self
    }

    /// The job on the cores of `mask` (e.g. `0x1`).
    pub fn on_cores(mut self, mask: &str) -> Job {
        self.cpumask = Some(mask.into());
        self
    }

    /// The job on `length` blocks of its bdev from block `offset`.
    pub fn on_blocks(mut self, offset: u64, length: u64) -> Job {
        self.blocks = Some((offset, length));
        self
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
    app: App,
    pub sock: PathBuf,
    pub log: PathBuf,
    dir: PathBuf,
    secs: u32,
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
            if let Some(m) = &j.cpumask {
                jobs.push_str(&format!("cpumask={m}\n"));
            }
            if let Some((offset, length)) = j.blocks {
                jobs.push_str(&format!("offset={offset}\nlength={length}\n"));
            }
            if let Some(m) = j.read_mix {
                jobs.push_str(&format!("rwmixread={m}\n"));
            }
        }
        std::fs::write(&jobf, jobs).map_err(|e| e.to_string())?;
        let mut args: Vec<std::ffi::OsString> = vec!["--json".into(), cfg.into()];
        args.extend(["-j".into(), jobf.into()]);
        for a in ["-t", &o.secs.to_string(), "-l", "-z", "-m", &o.core_mask] {
            args.push(a.into());
        }
        args.extend(o.extra.iter().map(Into::into));
        let launch = Launch {
            bin: ini.bdevperf.clone(),
            args,
            preload: o.plugin.clone(),
            shm_id: o.shm_id,
            max_secs: o.secs as u64 + 90,
            sock: PathBuf::from(format!("/var/tmp/nvmf-qos-ini-it-{tag}.sock")),
            log: dir.join("bdevperf.log"),
            cr_log: true,
        };
        let app = App::start(
            &ini.spdk,
            launch,
            "bdevperf",
            "bdev_get_bdevs",
            Duration::from_secs(10),
            60,
        )?;
        Ok(Bdevperf {
            sock: app.sock.clone(),
            log: app.log.clone(),
            app,
            dir,
            secs: o.secs,
        })
    }

    pub fn rpc(&self, method: &str, params: Value, timeout: Duration) -> Result<Value, RpcError> {
        self.app.rpc(method, params, timeout)
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

    /// Starts the jobs in the background (`perform_tests`); [`Bdevperf::finish_tests`]
    /// or [`Bdevperf::end_tests`] waits for them.
    pub fn start_tests(&self) -> Running {
        let sock = self.sock.clone();
        let t = Duration::from_secs(self.secs as u64 + 60);
        Running(std::thread::spawn(move || {
            rpc(&sock, "perform_tests", Value::Null, t)
        }))
    }

    /// Waits for the jobs started by `r` to end and for bdevperf to exit (at most 120 s
    /// more): their results and bdevperf's output. Panics with the output's tail when
    /// bdevperf hangs (an I/O that never completed?) or `perform_tests` failed.
    pub fn finish_tests(&mut self, r: Running) -> Outcome {
        let (res, log) = self.end_tests(r, 120);
        let res = res.unwrap_or_else(|e| panic!("perform_tests: {e}\n{}", tail(&log, 30)));
        Outcome {
            jobs: job_results(&res, &log),
            log,
        }
    }

    /// Waits for the jobs started by `r` and for bdevperf's exit (at most `secs` more)
    /// whatever `perform_tests` answered (a run the test cut short): that answer and
    /// bdevperf's output. Panics with the output's tail when bdevperf hangs.
    pub fn end_tests(&mut self, r: Running, secs: u64) -> (Result<Value, RpcError>, String) {
        let res = r.wait();
        let log = self.finish(secs).unwrap_or_else(|| {
            panic!(
                "bdevperf did not exit (an I/O never completed?); log:\n{}",
                self.log_tail(40)
            )
        });
        (res, log)
    }

    /// Runs the jobs to the end ([`Bdevperf::start_tests`], then
    /// [`Bdevperf::finish_tests`]).
    pub fn run(&mut self) -> Outcome {
        let r = self.start_tests();
        self.finish_tests(r)
    }

    /// Runs the jobs to the end, calling `poll` with the time since they started every
    /// `every` until `until` has passed.
    pub fn run_polling(
        &mut self,
        every: Duration,
        until: Duration,
        mut poll: impl FnMut(&Bdevperf, Duration),
    ) -> Outcome {
        let t0 = std::time::Instant::now();
        let r = self.start_tests();
        while t0.elapsed() < until {
            std::thread::sleep(every);
            poll(self, t0.elapsed());
        }
        self.finish_tests(r)
    }

    /// The initiator plugin's QoS bdev `name` as `qos_ini_bdev_get` shows it (its
    /// options, `state` and `pacer`); panics if bdevperf refuses.
    pub fn ini_bdev(&self, name: &str) -> Value {
        self.try_ini_bdev(name)
            .unwrap_or_else(|e| panic!("qos_ini_bdev_get {name}: {e}"))
    }

    /// As [`Bdevperf::ini_bdev`], `Err` when bdevperf refuses or does not answer.
    pub fn try_ini_bdev(&self, name: &str) -> Result<Value, RpcError> {
        let v = self.rpc(
            "qos_ini_bdev_get",
            json!({"name": name}),
            Duration::from_secs(30),
        )?;
        Ok(v[0].clone())
    }

    /// Stops bdevperf after its tests (with `-z` it waits for more after a successful
    /// run): SIGTERM, then waits at most `secs` for it to exit (application shutdown,
    /// which unregisters the QoS bdevs). Returns its output, or `None` if it had to be
    /// killed (a hang).
    pub fn finish(&mut self, secs: u64) -> Option<String> {
        if self.app.is_running() {
            self.app.term();
        }
        self.wait_exit(secs)
    }

    /// Waits for bdevperf to exit; returns its output, or `None` if it had to be killed
    /// after `secs`.
    pub fn wait_exit(&mut self, secs: u64) -> Option<String> {
        self.app
            .wait_exit(secs, Duration::from_millis(50))
            .map(|_| self.log_text())
    }

    pub fn log_text(&self) -> String {
        self.app.log_text()
    }

    pub fn log_tail(&self, n: usize) -> String {
        self.app.log_tail(n)
    }

    /// The bdevperf process's pid (for `perf record`), while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.app.app_pid()
    }

    /// Stops bdevperf with SIGTERM (through `timeout`) and waits at most `secs`.
    pub fn stop(&mut self, secs: u64) -> Option<Duration> {
        self.app.stop(secs, Duration::from_millis(50))
    }
}

impl Drop for Bdevperf {
    fn drop(&mut self) {
        if self.app.has_child() {
            self.stop(15);
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// `perform_tests` under way (see [`Bdevperf::start_tests`]).
#[derive(Debug)]
#[must_use = "wait for the jobs with finish_tests or end_tests"]
pub struct Running(std::thread::JoinHandle<Result<Value, RpcError>>);

impl Running {
    /// Waits for `perform_tests`'s answer alone (bdevperf keeps running).
    pub fn wait(self) -> Result<Value, RpcError> {
        self.0.join().expect("perform_tests thread")
    }
}

/// What a bdevperf run gave: its jobs' results by bdev name, and its output.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub jobs: BTreeMap<String, JobResult>,
    pub log: String,
}

impl Outcome {
    /// The results of the job on `bdev`; panics (with the output's tail) when bdevperf
    /// reported none.
    pub fn job(&self, bdev: &str) -> &JobResult {
        self.jobs
            .get(bdev)
            .unwrap_or_else(|| panic!("no results for {bdev}:\n{}", self.tail(30)))
    }

    /// Every job's IOPS, added up.
    pub fn total_iops(&self) -> f64 {
        self.jobs.values().map(|r| r.iops).sum()
    }

    /// Failed I/O of every job.
    pub fn failed(&self) -> u64 {
        self.jobs.values().map(|r| r.io_failed).sum()
    }

    /// The last `n` lines of bdevperf's output.
    pub fn tail(&self, n: usize) -> String {
        tail(&self.log, n)
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
/// Jobs on the same bdev (e.g. one per core) add up: IOPS, MiB/s and failures are
/// summed, the latencies are the last job's (the maximum: the largest).
pub fn job_results(perform: &Value, output: &str) -> BTreeMap<String, JobResult> {
    let pct = latency_summary(output);
    let mut out: BTreeMap<String, JobResult> = BTreeMap::new();
    for r in perform["results"].as_array().into_iter().flatten() {
        let name = r["job"].as_str().unwrap_or("").to_string();
        let p = pct.get(&name);
        let this = JobResult {
            iops: r["iops"].as_f64().unwrap_or(0.0),
            mibps: r["mibps"].as_f64().unwrap_or(0.0),
            io_failed: r["io_failed"].as_u64().unwrap_or(0),
            avg_us: r["avg_latency_us"].as_f64().unwrap_or(0.0),
            max_us: r["max_latency_us"].as_f64().unwrap_or(0.0),
            p50_us: p.and_then(|m| m.get("50.00000").copied()),
            p99_us: p.and_then(|m| m.get("99.00000").copied()),
        };
        match out.get_mut(&name) {
            Some(prev) => {
                prev.iops += this.iops;
                prev.mibps += this.mibps;
                prev.io_failed += this.io_failed;
                prev.max_us = prev.max_us.max(this.max_us);
                prev.avg_us = this.avg_us;
            }
            None => {
                out.insert(name, this);
            }
        }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::numbers::median;
    use serde_json::json;

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
