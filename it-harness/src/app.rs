//! One SPDK application as a child process: started under `timeout -s KILL` (a hard
//! bound on its lifetime) and `nice`, with SPDK's libraries on its library path and
//! optionally a plugin preloaded; ready once its JSON-RPC socket answers; stopped with
//! SIGTERM (killed after a grace period); its socket, the socket's lock, its trace buffer
//! and its hugepage files removed after.

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::env::{NICE, Spdk};
use crate::rpc::{RpcError, rpc};

/// How to start an application.
#[derive(Debug, Clone)]
pub struct Launch {
    /// The binary and its arguments; `-i <shm_id>`, `-u`, `--disable-cpumask-locks` and
    /// `-r <socket>` are added.
    pub bin: PathBuf,
    pub args: Vec<OsString>,
    pub preload: Option<PathBuf>,
    pub shm_id: u32,
    pub max_secs: u64,
    pub sock: PathBuf,
    pub log: PathBuf,
    /// The log is bdevperf's progress output: carriage returns end lines, blank lines
    /// are dropped from tails.
    pub cr_log: bool,
}

/// A running application.
#[derive(Debug)]
pub struct App {
    child: Option<Child>,
    pub sock: PathBuf,
    pub log: PathBuf,
    pub shm_id: u32,
    cr_log: bool,
}

impl App {
    /// Starts the application and waits (at most `ready_secs`) until `probe` answers.
    pub fn start(
        spdk: &Spdk,
        l: Launch,
        what: &str,
        probe: &str,
        probe_timeout: Duration,
        ready_secs: u64,
    ) -> Result<App, String> {
        let _ = std::fs::remove_file(&l.sock);
        let logf = std::fs::File::create(&l.log).map_err(|e| e.to_string())?;
        let mut cmd = Command::new("timeout");
        cmd.args(["-s", "KILL", &l.max_secs.to_string()])
            .args(["nice", "-n", NICE])
            .arg("env")
            .arg(format!("LD_LIBRARY_PATH={}", spdk.lib_dir.display()));
        if let Some(p) = &l.preload {
            // Through `env`, so that only the application (not `timeout`) preloads it.
            cmd.arg(format!("LD_PRELOAD={}", p.display()));
        }
        cmd.arg(&l.bin)
            .args(&l.args)
            .args(["-i", &l.shm_id.to_string()])
            .args(["-u", "--disable-cpumask-locks", "-r"])
            .arg(&l.sock)
            .stdout(logf.try_clone().map_err(|e| e.to_string())?)
            .stderr(logf)
            .stdin(Stdio::null());
        let child = cmd.spawn().map_err(|e| format!("spawn {what}: {e}"))?;
        let mut a = App {
            child: Some(child),
            sock: l.sock,
            log: l.log,
            shm_id: l.shm_id,
            cr_log: l.cr_log,
        };
        let deadline = Instant::now() + Duration::from_secs(ready_secs);
        loop {
            if a.sock.exists() && a.rpc(probe, Value::Null, probe_timeout).is_ok() {
                return Ok(a);
            }
            if let Some(c) = a.child.as_mut()
                && let Ok(Some(st)) = c.try_wait()
            {
                return Err(format!(
                    "{what} exited ({st}) at startup; log:\n{}",
                    a.log_tail(30)
                ));
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "{what} did not answer RPCs in {ready_secs} s; log:\n{}",
                    a.log_tail(30)
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Calls `method`; `Value::Null` params are omitted.
    pub fn rpc(&self, method: &str, params: Value, timeout: Duration) -> Result<Value, RpcError> {
        rpc(&self.sock, method, params, timeout)
    }

    pub fn is_running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    pub fn has_child(&self) -> bool {
        self.child.is_some()
    }

    /// The application's own process id: the child of `timeout` (`nice` and `env` exec
    /// into the application).
    pub fn app_pid(&self) -> Option<u32> {
        let t = self.child.as_ref()?.id();
        let kids = std::fs::read_to_string(format!("/proc/{t}/task/{t}/children")).ok()?;
        kids.split_whitespace().next()?.parse().ok()
    }

    /// The application's resident set (kB, `VmRSS`; hugepages are not in it).
    pub fn rss_kib(&self) -> Option<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.app_pid()?)).ok()?;
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
    }

    /// SIGKILL to the application (a crash: no shutdown path runs), then reaps it and
    /// removes what it left (socket, hugepage files).
    pub fn kill_hard(&mut self) {
        if let Some(pid) = self.app_pid() {
            let _ = Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .status();
        }
        self.wait_exit(10, Duration::from_millis(20));
    }

    /// Sends SIGTERM (`timeout` forwards it to the application).
    pub fn term(&self) {
        if let Some(c) = &self.child {
            let _ = Command::new("kill")
                .arg("-TERM")
                .arg(c.id().to_string())
                .status();
        }
    }

    /// Waits for the application to exit; returns how long that took, or `None` if it
    /// had to be killed after `secs` (or was not running).
    pub fn wait_exit(&mut self, secs: u64, poll: Duration) -> Option<Duration> {
        let mut child = self.child.take()?;
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(secs) {
            if let Ok(Some(_)) = child.try_wait() {
                self.cleanup();
                return Some(start.elapsed());
            }
            std::thread::sleep(poll);
        }
        let _ = Command::new("pkill")
            .args(["-KILL", "-P", &child.id().to_string()])
            .status();
        let _ = child.kill();
        let _ = child.wait();
        self.cleanup();
        None
    }

    /// SIGTERM, then [`App::wait_exit`].
    pub fn stop(&mut self, secs: u64, poll: Duration) -> Option<Duration> {
        let start = Instant::now();
        self.term();
        self.wait_exit(secs, poll).map(|_| start.elapsed())
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn log_tail(&self, n: usize) -> String {
        let text = self.log_text();
        if self.cr_log {
            tail(&text, n)
        } else {
            let lines: Vec<&str> = text.lines().collect();
            lines[lines.len().saturating_sub(n)..].join("\n")
        }
    }

    fn cleanup(&self) {
        let _ = std::fs::remove_file(&self.sock);
        // The RPC server's lock file and the trace buffer (`/dev/shm/<app>_trace.<shm
        // id>`) outlive a process that did not shut down (`kill_hard`, a hang).
        let mut lock = self.sock.clone().into_os_string();
        lock.push(".lock");
        let _ = std::fs::remove_file(lock);
        remove_matching("/dev/shm", |n| {
            n.ends_with(&format!("_trace.{}", self.shm_id))
        });
        // Pages of a killed process stay reserved while its files exist.
        let prefix = format!("spdk{}map_", self.shm_id);
        remove_matching("/dev/hugepages", |n| n.starts_with(&prefix));
    }
}

/// The last `n` lines of a progress output such as bdevperf's or fio's: carriage
/// returns end lines, blank lines are dropped.
pub fn tail(text: &str, n: usize) -> String {
    let text = text.replace('\r', "\n");
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Removes the files of `dir` whose names `matches` accepts (best effort).
fn remove_matching(dir: &str, matches: impl Fn(&str) -> bool) {
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            if matches(&e.file_name().to_string_lossy()) {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
}
