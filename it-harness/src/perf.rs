//! `spdk_nvme_perf` as the hosts of the target tests (each with its own host NQN),
//! and its results.

use std::process::{Child, Command, Stdio};

use crate::env::{NICE, Spdk};

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
}
