//! CPU profiles of running processes with Linux `perf` (`perf record`, then `perf
//! report`), for the benchmarks: which share of a process's samples a shared library
//! (or symbol) takes, and how much CPU time the recording covered, so that a share can
//! be turned into nanoseconds per I/O. Everything returns `None` when `perf` is missing
//! or fails: a benchmark then reports without its profile.

use std::path::PathBuf;
use std::process::{Command, Stdio};

/// One `perf record` of one or more processes; its data file goes with it.
#[derive(Debug)]
pub struct Recording {
    data: PathBuf,
}

impl Recording {
    /// Records `pids` for `secs` seconds at `freq` samples per second (one recorder for
    /// all of them: on two cores a second one would take a core from the processes).
    pub fn record(pids: &[u32], secs: u32, freq: u32) -> Option<Recording> {
        let data = std::env::temp_dir().join(format!(
            "nvmf-qos-profile-{}-{}.perf",
            std::process::id(),
            pids.first().copied().unwrap_or(0)
        ));
        let pids: Vec<String> = pids.iter().map(u32::to_string).collect();
        let ok = Command::new("perf")
            .args([
                "record",
                "-q",
                "-F",
                &freq.to_string(),
                "-p",
                &pids.join(","),
                "-o",
            ])
            .arg(&data)
            .args(["--", "sleep", &secs.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .ok()?
            .success();
        let rec = Recording { data };
        ok.then_some(rec)
    }

    /// `perf report` sorted by `sort` (`dso`, `dso,sym`) of the samples of `pid` (all
    /// when `None`), shares relative to those samples.
    pub fn report(&self, pid: Option<u32>, sort: &str) -> Option<Report> {
        let mut c = Command::new("perf");
        c.args([
            "report",
            "--stdio",
            "--no-children",
            "--percentage",
            "relative",
        ])
        .args(["--sort", sort]);
        if let Some(p) = pid {
            c.args(["--pid", &p.to_string()]);
        }
        let out = c.arg("-i").arg(&self.data).output().ok()?;
        out.status.success().then(|| Report {
            text: String::from_utf8_lossy(&out.stdout).into_owned(),
        })
    }
}

impl Drop for Recording {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.data);
    }
}

/// The text of one `perf report --stdio`.
#[derive(Debug, Clone)]
pub struct Report {
    pub text: String,
}

impl Report {
    /// The report's rows (its comment and blank lines left out).
    pub fn rows(&self) -> impl Iterator<Item = &str> {
        self.text
            .lines()
            .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
    }

    /// The rows that contain `needle` (a DSO or symbol name).
    pub fn rows_with<'a>(&'a self, needle: &'a str) -> impl Iterator<Item = &'a str> {
        self.rows().filter(move |l| l.contains(needle))
    }

    /// The summed share (%) of the rows that contain `needle`.
    pub fn share(&self, needle: &str) -> f64 {
        self.rows_with(needle)
            .filter_map(|l| {
                l.split_whitespace()
                    .next()?
                    .trim_end_matches('%')
                    .parse::<f64>()
                    .ok()
            })
            .fold(0.0, |a, b| a + b)
    }

    /// The rows of a `dso,sym` report as (share %, DSO, symbol).
    pub fn symbols(&self) -> Vec<(f64, String, String)> {
        self.rows()
            .filter_map(|l| {
                let mut w = l.split_whitespace();
                let share = w.next()?.trim_end_matches('%').parse::<f64>().ok()?;
                let dso = w.next()?.to_string();
                let _kind = w.next()?;
                let sym = w.collect::<Vec<_>>().join(" ");
                Some((share, dso, sym))
            })
            .collect()
    }

    /// The CPU time the reported samples cover, ns (for the cpu-clock event, perf's
    /// "Event count" is in nanoseconds); 0 when the report does not say.
    pub fn cpu_ns(&self) -> f64 {
        self.text
            .lines()
            .find(|l| l.contains("Event count (approx.):"))
            .and_then(|l| l.rsplit(':').next())
            .and_then(|n| n.trim().parse::<f64>().ok())
            .unwrap_or(0.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_and_cpu_time_from_a_report() {
        let r = Report {
            text: "# Samples: 8K of event 'cpu-clock:ppp'\n\
                   # Event count (approx.): 4000250000\n\
                   #\n\
                   \x20   12.50%  libspdk_bdev.so.18.0   [.] bdev_io_submit\n\
                   \x20    1.25%  libnvmf_qos_tgt.so     [.] admit\n\
                   \x20    0.75%  libnvmf_qos_tgt.so     [.] base_done\n\
                   \n"
            .into(),
        };
        assert_eq!(r.rows().count(), 3);
        assert!((r.share("libnvmf_qos_tgt") - 2.0).abs() < 1e-9);
        assert!((r.share("libspdk_bdev.so") - 12.5).abs() < 1e-9);
        // 0.0, not the -0.0 of an empty f64 sum (which prints as "-0.0").
        assert_eq!(format!("{:.1}", r.share("absent")), "0.0");
        assert_eq!(r.cpu_ns(), 4_000_250_000.0);
        let syms = r.symbols();
        assert_eq!(syms.len(), 3);
        assert_eq!(
            syms[1],
            (1.25, "libnvmf_qos_tgt.so".to_string(), "admit".to_string())
        );
        assert_eq!(r.rows_with("base_done").count(), 1);
    }
}
