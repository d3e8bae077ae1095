//! The arithmetic of the toggle instrument (issue 38, `tests/instrument.rs` of
//! target-it): segments of one run measured alternately in state A (the domain's bypass
//! on) and B (the configuration under test), the ratio of each B segment to the mean of
//! the A segments on either side, the filter that drops triplets whose two A's disagree,
//! the median with a seeded bootstrap interval, and the readers of the counters it
//! takes: `bdev_get_iostat`, `thread_get_pollers`, `thread_get_stats` and `perf stat -x,`
//! interval output. Pure functions, unit-tested here without SPDK, but for
//! [`count_events`] (one `perf stat` of a process).

use serde_json::Value;

use crate::numbers::median;

/// One measured segment of a toggle run.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Segment {
    /// Measured with the bypass on (state A).
    pub bypass: bool,
    /// Commands completed by the QoS bdevs in the measured window, per host bdev.
    pub ops: Vec<u64>,
    /// The window's length by the target's own clock (ticks / tick rate), seconds.
    pub secs: f64,
}

impl Segment {
    /// All hosts' commands per second of the window.
    pub fn rate(&self) -> f64 {
        self.ops.iter().sum::<u64>() as f64 / self.secs.max(1e-9)
    }

    /// Host `k`'s share of the segment's commands.
    pub fn share(&self, k: usize) -> f64 {
        let all: u64 = self.ops.iter().sum();
        self.ops.get(k).copied().unwrap_or(0) as f64 / all.max(1) as f64
    }
}

/// One B segment between two A segments.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Triplet {
    /// Index of the B segment in the run's segments.
    pub b: usize,
    /// B's rate over the mean of the two A's.
    pub ratio: f64,
    /// The two A's differ by no more than the tolerance.
    pub kept: bool,
}

/// Every B segment whose neighbours are both A segments, as a triplet: r_k = B_k /
/// mean(A_{k-1}, A_{k+1}) of their rates, kept when |A_{k-1} - A_{k+1}| <= `tolerance`
/// x the larger of the two (0.1: the 10 %).
pub fn triplets(segs: &[Segment], tolerance: f64) -> Vec<Triplet> {
    (1..segs.len().saturating_sub(1))
        .filter(|&k| !segs[k].bypass && segs[k - 1].bypass && segs[k + 1].bypass)
        .map(|k| {
            let (a0, a1) = (segs[k - 1].rate(), segs[k + 1].rate());
            Triplet {
                b: k,
                ratio: segs[k].rate() / ((a0 + a1) / 2.0).max(1e-9),
                kept: agree(a0, a1, tolerance),
            }
        })
        .collect()
}

/// Whether two measurements of the same thing (the A's around a B, the plain phases
/// around a QoS phase) differ by no more than `tolerance` x the larger: the machine kept
/// its speed between them, as far as can be seen.
pub fn agree(a: f64, b: f64, tolerance: f64) -> bool {
    (a - b).abs() <= tolerance * a.max(b)
}

/// Host `host`'s share in each kept triplet's B segment over its mean share in the two
/// A's.
pub fn share_ratios(segs: &[Segment], trips: &[Triplet], host: usize) -> Vec<f64> {
    trips
        .iter()
        .filter(|t| t.kept)
        .map(|t| {
            let a = (segs[t.b - 1].share(host) + segs[t.b + 1].share(host)) / 2.0;
            segs[t.b].share(host) / a.max(1e-12)
        })
        .collect()
}

/// SplitMix64: a small deterministic generator for the bootstrap (no dependency).
#[derive(Debug, Clone)]
pub struct SplitMix64(pub u64);

impl SplitMix64 {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (n > 0; the modulo bias is below 2^-40 for the sizes here).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
}

/// The median of `v` and its percentile-bootstrap interval at `level` (e.g. 0.95):
/// `resamples` resamples with replacement drawn by [`SplitMix64`] from `seed`, so the
/// same values and seed give the same interval. `(median, low, high)`; zeros when empty.
pub fn bootstrap_median(v: &[f64], resamples: usize, seed: u64, level: f64) -> (f64, f64, f64) {
    if v.is_empty() {
        return (0.0, 0.0, 0.0);
    }
    let mut rng = SplitMix64(seed);
    let mut meds: Vec<f64> = (0..resamples.max(1))
        .map(|_| {
            let s: Vec<f64> = (0..v.len()).map(|_| v[rng.below(v.len())]).collect();
            median(&s)
        })
        .collect();
    meds.sort_by(|a, b| a.total_cmp(b));
    let q = |p: f64| meds[((p * (meds.len() - 1) as f64).round() as usize).min(meds.len() - 1)];
    let tail = (1.0 - level) / 2.0;
    (median(v), q(tail), q(1.0 - tail))
}

/// From `bdev_get_iostat`'s answer: the target's clock (`ticks`, `tick_rate`) and the
/// commands (reads + writes) of each of `bdevs`, in their order (0 for one missing).
pub fn iostat_ops(answer: &Value, bdevs: &[String]) -> (u64, u64, Vec<u64>) {
    let all = answer["bdevs"].as_array().cloned().unwrap_or_default();
    let ops = bdevs
        .iter()
        .map(|name| {
            all.iter()
                .find(|b| b["name"].as_str() == Some(name))
                .map_or(0, |b| {
                    b["num_read_ops"].as_u64().unwrap_or(0)
                        + b["num_write_ops"].as_u64().unwrap_or(0)
                })
        })
        .collect();
    (
        answer["ticks"].as_u64().unwrap_or(0),
        answer["tick_rate"].as_u64().unwrap_or(0),
        ops,
    )
}

/// The poller names whose runs the instrument counts: the NVMe-oF transport poll
/// group's poller (`nvmf_TCP` in SPDK v25.09, lib/nvmf/transport.c: one run per reactor
/// iteration, busy when a socket of the group had work) and the accel framework's
/// completion poller (`accel_comp_poll`, busy when a copy of the malloc base completed:
/// the per-iteration batch of the base).
pub const POLLERS: [&str; 2] = ["nvmf_TCP", "accel_comp_poll"];

/// From `thread_get_pollers`' answer: `(run_count, busy_count)` of the active pollers
/// named `name`, summed over the threads whose name starts with `nvmf_tgt_poll_group`.
pub fn poller_counts(answer: &Value, name: &str) -> (u64, u64) {
    poll_group_threads(answer)
        .flat_map(|th| th["active_pollers"].as_array().cloned().unwrap_or_default())
        .filter(|p| p["name"].as_str() == Some(name))
        .fold((0, 0), |(r, b), p| {
            (
                r + p["run_count"].as_u64().unwrap_or(0),
                b + p["busy_count"].as_u64().unwrap_or(0),
            )
        })
}

/// From `thread_get_stats`' answer: `(busy, idle)` ticks summed over the poll-group
/// threads.
pub fn poll_group_busy_idle(answer: &Value) -> (u64, u64) {
    poll_group_threads(answer).fold((0, 0), |(b, i), th| {
        (
            b + th["busy"].as_u64().unwrap_or(0),
            i + th["idle"].as_u64().unwrap_or(0),
        )
    })
}

fn poll_group_threads(answer: &Value) -> impl Iterator<Item = Value> {
    answer["threads"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .filter(|th| {
            th["name"]
                .as_str()
                .is_some_and(|n| n.starts_with("nvmf_tgt_poll_group"))
        })
}

/// One interval line of `perf stat -I <ms> -x,`: the end of the interval (seconds since
/// perf started counting), the event, and its count (`None`: `<not counted>` or `<not
/// supported>`).
#[derive(Debug, Clone, PartialEq)]
pub struct PerfSample {
    pub t: f64,
    pub event: String,
    pub count: Option<u64>,
}

/// Parses `perf stat -I <ms> -x,` output (`time,count,unit,event,run time,percent,...`;
/// comment lines start with `#`). Lines that do not read so are skipped.
pub fn parse_perf_intervals(text: &str) -> Vec<PerfSample> {
    text.lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .filter_map(|l| {
            let f: Vec<&str> = l.split(',').map(str::trim).collect();
            if f.len() < 4 {
                return None;
            }
            let t: f64 = f[0].parse().ok()?;
            if f[3].is_empty() {
                return None;
            }
            Some(PerfSample {
                t,
                event: f[3].to_string(),
                count: f[1].parse().ok(),
            })
        })
        .collect()
}

/// The count of `event` per second over the window `[from, to]` (seconds on perf's
/// clock), from the intervals of `interval` seconds lying wholly inside it; `None` when
/// none does or one was not counted.
pub fn perf_rate_in(
    samples: &[PerfSample],
    event: &str,
    interval: f64,
    from: f64,
    to: f64,
) -> Option<f64> {
    let inside: Vec<&PerfSample> = samples
        .iter()
        .filter(|s| s.event == event && s.t - interval >= from - 1e-3 && s.t <= to + 1e-3)
        .collect();
    if inside.is_empty() {
        return None;
    }
    let mut n = 0u64;
    for s in &inside {
        n += s.count?;
    }
    Some(n as f64 / (inside.len() as f64 * interval))
}

/// Counts `events` (tracepoints such as `syscalls:sys_enter_sendmsg`: they need no
/// hardware counters) in process `pid` for `secs`, with one `perf stat`; blocks that
/// long. Returns the counts in the order of `events` (`None`: not counted), or why perf
/// could not count.
pub fn count_events(pid: u32, events: &[&str], secs: f64) -> Result<Vec<Option<u64>>, String> {
    let o = std::process::Command::new("perf")
        .args([
            "stat",
            "-x,",
            "-e",
            &events.join(","),
            "-p",
            &pid.to_string(),
        ])
        .args(["--", "sleep", &format!("{secs:.3}")])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .output()
        .map_err(|e| format!("cannot run perf ({e}); install linux-perf"))?;
    let text = String::from_utf8_lossy(&o.stderr);
    if !o.status.success() {
        return Err(format!("perf stat failed: {}", text.trim()));
    }
    Ok(parse_perf_totals(&text, events))
}

/// Parses `perf stat -x,` output without intervals (`count,unit,event,...`): the count
/// of each of `events`, in their order (`None`: missing or `<not counted>`).
pub fn parse_perf_totals(text: &str, events: &[&str]) -> Vec<Option<u64>> {
    let lines: Vec<Vec<&str>> = text
        .lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .map(|l| l.split(',').map(str::trim).collect())
        .filter(|f: &Vec<&str>| f.len() >= 3)
        .collect();
    events
        .iter()
        .map(|e| {
            lines
                .iter()
                .find(|f| f[2] == *e)
                .and_then(|f| f[0].parse().ok())
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn perf_totals_read_counts_in_the_order_asked() {
        let text = "# started on Sun Nov 29\n\n\
                    1234,,syscalls:sys_enter_sendmsg,3000123456,100.00,,\n\
                    <not counted>,,syscalls:sys_enter_readv,0,0.00,,\n";
        let ev = [
            "syscalls:sys_enter_readv",
            "syscalls:sys_enter_sendmsg",
            "x",
        ];
        assert_eq!(parse_perf_totals(text, &ev), vec![None, Some(1234), None]);
    }

    fn seg(bypass: bool, ops: u64) -> Segment {
        Segment {
            bypass,
            ops: vec![ops / 4, ops - ops / 4],
            secs: 0.8,
        }
    }

    #[test]
    fn triplet_ratios_and_the_ten_percent_filter() {
        // A 100, B 99, A 102, B 90, A 120 (A's 102 vs 120: 15 % apart), B 110, A 118.
        let s = [
            seg(true, 80_000),
            seg(false, 79_200),
            seg(true, 81_600),
            seg(false, 72_000),
            seg(true, 96_000),
            seg(false, 88_000),
            seg(true, 94_400),
        ];
        let t = triplets(&s, 0.1);
        assert_eq!(t.len(), 3);
        assert_eq!(t.iter().map(|t| t.b).collect::<Vec<_>>(), [1, 3, 5]);
        assert!((t[0].ratio - 99.0 / 101.0).abs() < 1e-9, "{t:?}");
        assert!(t[0].kept && !t[1].kept && t[2].kept, "{t:?}");
        assert!((t[2].ratio - 110.0 / 119.0).abs() < 1e-9);
        assert!(agree(100.0, 110.0, 0.1) && agree(110.0, 100.0, 0.1));
        assert!(!agree(100.0, 111.2, 0.1) && !agree(111.2, 100.0, 0.1));
        // A B segment at either end, or next to another B, makes no triplet.
        let t = triplets(
            &[seg(false, 1), seg(true, 1), seg(false, 1), seg(false, 1)],
            0.1,
        );
        assert!(t.is_empty(), "{t:?}");
        // Shares: host 0 has a quarter everywhere, so its B/A share ratio is 1.
        let r = share_ratios(&s, &triplets(&s, 0.1), 0);
        assert_eq!(r.len(), 2);
        assert!(r.iter().all(|x| (x - 1.0).abs() < 1e-3), "{r:?}");
    }

    #[test]
    fn bootstrap_is_seeded_and_brackets_the_median() {
        let mut g = SplitMix64(7);
        let v: Vec<f64> = (0..60)
            .map(|_| 0.98 + (g.next_u64() % 1000) as f64 / 25_000.0)
            .collect();
        let (m, lo, hi) = bootstrap_median(&v, 2000, 1, 0.95);
        assert_eq!((m, lo, hi), bootstrap_median(&v, 2000, 1, 0.95));
        assert!(lo <= m && m <= hi && lo < hi, "{lo} {m} {hi}");
        assert!(
            hi - lo < 0.02,
            "60 values 4 % wide: a narrow interval ({lo}..{hi})"
        );
        // Another seed: another interval, close by.
        let (_, lo2, hi2) = bootstrap_median(&v, 2000, 2, 0.95);
        assert!((lo2 - lo).abs() < 0.005 && (hi2 - hi).abs() < 0.005);
        assert_eq!(bootstrap_median(&[], 10, 1, 0.95), (0.0, 0.0, 0.0));
        assert_eq!(bootstrap_median(&[2.0], 10, 1, 0.95), (2.0, 2.0, 2.0));
        // SplitMix64's reference output for seed 0.
        assert_eq!(SplitMix64(0).next_u64(), 0xE220_A839_7B1D_CDAF);
    }

    #[test]
    fn reads_iostat_pollers_and_thread_stats() {
        let io = json!({"tick_rate": 2_000_000_000u64, "ticks": 5000, "bdevs": [
            {"name": "qos2", "num_read_ops": 7, "num_write_ops": 3},
            {"name": "qos1", "num_read_ops": 10, "num_write_ops": 0}]});
        let names = ["qos1".to_string(), "qos2".into(), "qos3".into()];
        assert_eq!(
            iostat_ops(&io, &names),
            (5000, 2_000_000_000, vec![10, 10, 0])
        );
        let pollers = json!({"tick_rate": 1, "threads": [
            {"name": "app_thread", "active_pollers": [
                {"name": "nvmf_TCP", "run_count": 1000, "busy_count": 1000}]},
            {"name": "nvmf_tgt_poll_group_000", "active_pollers": [
                {"name": "nvmf_TCP", "run_count": 50, "busy_count": 20},
                {"name": "accel_comp_poll", "run_count": 50, "busy_count": 5}]},
            {"name": "nvmf_tgt_poll_group_001", "active_pollers": [
                {"name": "nvmf_TCP", "run_count": 30, "busy_count": 10}]}]});
        assert_eq!(poller_counts(&pollers, POLLERS[0]), (80, 30));
        assert_eq!(poller_counts(&pollers, "accel_comp_poll"), (50, 5));
        let stats = json!({"threads": [
            {"name": "app_thread", "busy": 9, "idle": 9},
            {"name": "nvmf_tgt_poll_group_000", "busy": 30, "idle": 70}]});
        assert_eq!(poll_group_busy_idle(&stats), (30, 70));
    }

    #[test]
    fn parses_perf_stat_interval_csv() {
        let out = "# started on Sun Nov 29 04:20:00 2026\n\
                   \n\
                   \x20    0.100123456,1200,,syscalls:sys_enter_sendmsg,100051234,100.00,,\n\
                   \x20    0.100123456,800,,syscalls:sys_enter_readv,100051234,100.00,,\n\
                   \x20    0.200234567,1400,,syscalls:sys_enter_sendmsg,100047000,100.00,,\n\
                   \x20    0.200234567,<not counted>,,syscalls:sys_enter_readv,0,100.00,,\n\
                   \x20    0.300300000,1000,,syscalls:sys_enter_sendmsg,100047000,100.00,,\n";
        let s = parse_perf_intervals(out);
        assert_eq!(s.len(), 5);
        assert_eq!(s[0].event, "syscalls:sys_enter_sendmsg");
        assert_eq!(s[0].count, Some(1200));
        assert_eq!(s[3].count, None);
        assert!((s[2].t - 0.200234567).abs() < 1e-12);
        let ev = "syscalls:sys_enter_sendmsg";
        // [0.1, 0.31]: the intervals ending at 0.2 and 0.3 lie inside.
        let r = perf_rate_in(&s, ev, 0.1, 0.1, 0.31).unwrap();
        assert!((r - 12_000.0).abs() < 1e-6, "{r}");
        assert_eq!(perf_rate_in(&s, ev, 0.1, 0.5, 0.9), None);
        // A window with an uncounted interval says nothing rather than too little.
        assert_eq!(
            perf_rate_in(&s, "syscalls:sys_enter_readv", 0.1, 0.0, 0.25),
            None
        );
    }
}
