//! A CPU quota on a process (the target) or on some of its threads (one reactor),
//! through the cgroup-v1 `cpu` controller: how the tests take part of the target's
//! capacity away without a busy loop, which on these two-core machines starved every
//! other process too (`shared/notes/spdk-build.md`), and how they leave an initiator a
//! known part of a core the target also runs on. The quota is lifted and the cgroup
//! removed when the [`CpuQuota`] is dropped.

use std::path::{Path, PathBuf};

/// The cgroup-v1 `cpu` hierarchy.
const CPU_ROOT: &str = "/sys/fs/cgroup/cpu";
/// The quota's accounting period, µs (10 ms: short enough that a reactor throttled for
/// part of it looks slower, not stopped, to a 500 ms QoS period).
const PERIOD_US: u64 = 10_000;

/// Process `pid` (all its threads) in a cgroup of its own with a CPU quota.
#[derive(Debug)]
pub struct CpuQuota {
    dir: PathBuf,
    pid: u32,
}

impl CpuQuota {
    /// Moves `pid` and its threads into a new cgroup, unthrottled; `None` (with the
    /// reason printed) where the cgroup-v1 `cpu` controller is not mounted or writable.
    pub fn attach(pid: u32) -> Option<CpuQuota> {
        let q = CpuQuota::attach_none(pid)?;
        q.move_threads(&q.dir.join("tasks")).then_some(q)
    }

    /// As [`CpuQuota::attach`], for the threads of `pid` named `comm` only (e.g.
    /// `reactor_1`, one SPDK reactor): a quota on one core's reactor leaves the others
    /// running freely. `None` where no thread has that name.
    pub fn attach_threads(pid: u32, comm: &str) -> Option<CpuQuota> {
        let q = CpuQuota::attach_none(pid)?;
        let tasks = q.dir.join("tasks");
        let mut moved = 0;
        for tid in std::fs::read_dir(format!("/proc/{pid}/task"))
            .ok()?
            .flatten()
        {
            let name = std::fs::read_to_string(tid.path().join("comm")).unwrap_or_default();
            if name.trim() == comm
                && std::fs::write(&tasks, tid.file_name().to_string_lossy().as_bytes()).is_ok()
            {
                moved += 1;
            }
        }
        if moved == 0 {
            println!("no CPU quota: process {pid} has no thread named {comm}");
            return None;
        }
        Some(q)
    }

    /// An empty cgroup for `pid`'s threads, unthrottled.
    fn attach_none(pid: u32) -> Option<CpuQuota> {
        let root = Path::new(CPU_ROOT);
        if !root.join("cpu.cfs_quota_us").exists() {
            println!("no CPU quota: the cgroup-v1 cpu controller is not mounted at {CPU_ROOT}");
            return None;
        }
        let dir = root.join(format!("nvmf-qos-it-{}-{pid}", std::process::id()));
        if let Err(e) = std::fs::create_dir_all(&dir) {
            println!("no CPU quota: cannot create {}: {e}", dir.display());
            return None;
        }
        let q = CpuQuota { dir, pid };
        (q.write("cpu.cfs_period_us", &PERIOD_US.to_string()) && q.write("cpu.cfs_quota_us", "-1"))
            .then_some(q)
    }

    /// Limits the process to `fraction` of one core (0 < fraction; above 1 lifts it).
    pub fn limit(&self, fraction: f64) -> bool {
        let quota = if fraction >= 1.0 {
            "-1".to_string()
        } else {
            ((PERIOD_US as f64 * fraction).max(1000.0) as u64).to_string()
        };
        self.write("cpu.cfs_quota_us", &quota)
    }

    /// Limits the cgroup's threads to `cpus` CPUs in all, over however many cores they run on,
    /// accounted over `period_us` (1,000 ..= 1,000,000; 1.2 CPUs at 1,000 µs: 1.2 ms of
    /// CPU time per 1 ms, spread over its threads); `cpus` of 0 or less lifts it. A
    /// short period keeps each stop of a throttled thread short (at most about the
    /// period): a reactor stopped for milliseconds misses paced releases.
    pub fn limit_cpus(&self, cpus: f64, period_us: u64) -> bool {
        if cpus <= 0.0 {
            return self.write("cpu.cfs_quota_us", "-1");
        }
        let quota = ((period_us as f64 * cpus) as u64).max(1000);
        self.write("cpu.cfs_quota_us", "-1")
            && self.write("cpu.cfs_period_us", &period_us.to_string())
            && self.write("cpu.cfs_quota_us", &quota.to_string())
    }

    /// Periods in which the quota throttled the process (`cpu.stat`).
    pub fn throttled_periods(&self) -> u64 {
        std::fs::read_to_string(self.dir.join("cpu.stat"))
            .ok()
            .and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("nr_throttled ")?.trim().parse().ok())
            })
            .unwrap_or(0)
    }

    fn write(&self, file: &str, value: &str) -> bool {
        match std::fs::write(self.dir.join(file), value) {
            Ok(()) => true,
            Err(e) => {
                println!("CPU quota: writing {value} to {file}: {e}");
                false
            }
        }
    }

    /// Writes every thread of the process to `tasks` (a cgroup's task list).
    fn move_threads(&self, tasks: &Path) -> bool {
        let Ok(rd) = std::fs::read_dir(format!("/proc/{}/task", self.pid)) else {
            println!("CPU quota: process {} is gone", self.pid);
            return false;
        };
        for tid in rd.flatten() {
            // A thread may end meanwhile: that is no failure.
            let _ = std::fs::write(tasks, tid.file_name().to_string_lossy().as_bytes());
        }
        true
    }
}

impl Drop for CpuQuota {
    fn drop(&mut self) {
        self.limit(2.0);
        self.move_threads(&Path::new(CPU_ROOT).join("tasks"));
        let _ = std::fs::remove_dir(&self.dir);
    }
}
