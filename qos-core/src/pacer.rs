//! Sender-side shaping of large transfers (Justitia, seed 001) with a safe start for
//! new streams (DIRS, seed 004).
//!
//! - [`plan_chunks`]: a transfer above the chunk size becomes roughly equal chunks, so
//!   the wire only ever carries chunk-sized data and a small, latency-sensitive command
//!   waits behind one chunk at most, never behind a whole 1 MiB transfer;
//!   [`plan_even_chunks`] (the initiator plugin's) takes fewer, equal chunks whose count
//!   divides the transfer when they are at most half as large again as the chunk (a
//!   1 MiB write as 8 × 128 KiB, bdev_nvme's own split, not 12 × 85 KiB). Only while
//!   latency-sensitive traffic shares the path ([`Pacer::should_split`],
//!   [`latency_sensitive_at`]): alone, a large transfer goes whole.
//! - [`MultiBucket`]: multi-resource tokens, bytes and operations, refilled at the
//!   allowed rate U (operations in the link's fixed ratio).
//! - AIMD on U: a reference probe measures small-command latency; when its p99 is above
//!   the target U halves (never below the sharing-incentive floor: the large streams
//!   together keep `n_h / (n_h + n_l)` of the link, Justitia's "each flow at least
//!   1/n"), otherwise U grows by a step. With no latency-sensitive traffic U is the link.
//! - Streams: each large transfer is a stream with its own rate, at most its fair share
//!   U / n. A new stream starts at the DIRS initial rate: the lowest of the active
//!   streams' rates, the virtual stream's rate (which remembers congestion signals that
//!   arrived when no stream was active, with recovery and reset timers), and the lowest
//!   rate of the last observation window.
//! - The chunk size ([`Pacer::chunk_bytes`], with `chunk_auto`, the default): the
//!   largest chunk a small command can wait behind and still meet the latency target,
//!   the target's slack over the probe's base latency times the link's rate, between
//!   the link's bytes per operation (a smaller chunk cannot fill the link: Justitia's
//!   5.1 takes the smallest chunk that still reaches the rate) and `chunk_bytes`. It
//!   follows the path: on NVMe/TCP loopback (base 20-46 us, target 1.5x) it came to
//!   40-92 KiB, on a 25 Gb/s RDMA path (base about 5 us) it would be 4-8 KiB, near
//!   Justitia's 5 KB. A chunk is a command, and each costs the target: a fixed 32 KiB
//!   was throughput lost where the path allowed more (docs/benchmarks.md, issue 30).
//!   With no latency-sensitive traffic the chunk is `chunk_bytes`; until the first
//!   probe has measured the path, 32 KiB (the fixed default before 2026-11-26).

use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::config::MIB;
use crate::latency::LatencyWindow;
use crate::time::{MonotonicClamp, Nanos, mul_div};

/// One chunk of a split transfer, in blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Chunk {
    pub offset_blocks: u64,
    pub num_blocks: u64,
}

/// Splits `num_blocks` blocks starting at `offset_blocks` into the fewest chunks of at
/// most `chunk_bytes`, as equal as possible (they differ by at most one block), in
/// order. A transfer that fits is one chunk. A chunk is at least one block.
pub fn plan_chunks(
    offset_blocks: u64,
    num_blocks: u64,
    block_size: u64,
    chunk_bytes: u64,
) -> ChunkPlan {
    let max_blocks = (chunk_bytes / block_size.max(1)).max(1);
    let n = num_blocks.div_ceil(max_blocks).max(1);
    ChunkPlan {
        next: offset_blocks,
        left: num_blocks,
        i: 0,
        n,
        base: num_blocks / n,
        extra: num_blocks % n,
    }
}

/// How far above the pacer's chunk [`plan_even_chunks`] lets an equal chunk go, in
/// thousandths: 1500, half as much again.
///
/// The pacer's chunk is the latency target's slack over the probe's base latency times
/// the link ([`chunk_for_slack`]); a small command waits behind the part of a chunk the
/// target's core has not taken in yet, and on the paths measured here (NVMe/TCP, one
/// core a side) that is a fraction of the chunk's whole time, so the formula is
/// conservative. Fewer commands are what keeps the link: a 1 MiB write in 12 chunks of
/// 85 KiB did 0.889-0.901 of plain bdev_nvme (8 commands of 128 KiB) alone, in two runs
/// of three (docs/benchmarks.md, issue 30).
pub const EVEN_CHUNK_STRETCH_MILLI: u64 = 1500;

/// Like [`plan_chunks`], but in equal chunks whose count divides the transfer, as the
/// base's own split of a large transfer into commands of its largest size does
/// (bdev_nvme: 8 × 128 KiB for 1 MiB), when that takes fewer chunks: the fewest equal
/// chunks of at most `chunk_bytes` × [`EVEN_CHUNK_STRETCH_MILLI`] / 1000 and at most
/// `largest` bytes (`PacerConfig::chunk_bytes`, the largest command the path carries in
/// one capsule), if they are fewer than [`plan_chunks`]' count. Otherwise (no such
/// count, or a transfer of one block) [`plan_chunks`] as is: never more chunks than it.
pub fn plan_even_chunks(
    offset_blocks: u64,
    num_blocks: u64,
    block_size: u64,
    chunk_bytes: u64,
    largest: u64,
) -> ChunkPlan {
    let plan = plan_chunks(offset_blocks, num_blocks, block_size, chunk_bytes);
    let fit = plan.n;
    if num_blocks == 0 || num_blocks % fit == 0 {
        return plan;
    }
    let bs = block_size.max(1);
    let stretched =
        mul_div(chunk_bytes, EVEN_CHUNK_STRETCH_MILLI, 1000).min(largest.max(chunk_bytes));
    let max_blocks = (stretched / bs).max(1);
    // Counts below `fit` (larger chunks), fewest first; a chunk count of at least half of
    // `fit` is all a 1.5 stretch can reach, so this loop is shorter than the plan.
    let Some(n) = (num_blocks.div_ceil(max_blocks).max(1)..fit).find(|&n| num_blocks % n == 0)
    else {
        return plan;
    };
    ChunkPlan {
        next: offset_blocks,
        left: num_blocks,
        i: 0,
        n,
        base: num_blocks / n,
        extra: 0,
    }
}

/// Iterator over the chunks of a plan.
#[derive(Debug, Clone)]
pub struct ChunkPlan {
    next: u64,
    left: u64,
    i: u64,
    n: u64,
    base: u64,
    extra: u64,
}

impl ChunkPlan {
    pub fn chunk_count(&self) -> u64 {
        if self.left == 0 && self.i == 0 {
            1
        } else {
            self.n
        }
    }
}

impl Iterator for ChunkPlan {
    type Item = Chunk;
    fn next(&mut self) -> Option<Chunk> {
        if self.i >= self.n {
            return None;
        }
        let len = self.base + u64::from(self.i < self.extra);
        let c = Chunk {
            offset_blocks: self.next,
            num_blocks: len,
        };
        self.next += len;
        self.left -= len;
        self.i += 1;
        Some(c)
    }
}

/// Units of a bucket level: amount times 1e9, so refill at `rate` per second over `dt`
/// nanoseconds is exact integer arithmetic.
const SCALE: u128 = 1_000_000_000;

/// A token bucket for one resource.
///
/// While a request it refused waits, the bucket fills up to twice its depth: the sender
/// releases a chunk when its core gets to it, often after the tokens were there, and
/// with the plain cap the time it came late was lost (on the real target the writer got
/// 86-89 % of the rate the pacer allowed, so less than its sharing floor). The credit
/// is only for lateness: a bucket nobody asked stays at its depth, so an idle stream
/// does not start with a burst.
#[derive(Debug, Clone)]
pub struct TokenBucket {
    rate: u64,
    depth: u64,
    level: u128,
    last: Nanos,
    /// A request was refused and has not been served yet.
    waiting: bool,
}

impl TokenBucket {
    /// Full bucket of `depth`, refilled at `rate` per second.
    pub fn new(rate: u64, depth: u64, now: Nanos) -> Self {
        TokenBucket {
            rate,
            depth: depth.max(1),
            level: depth.max(1) as u128 * SCALE,
            last: now,
            waiting: false,
        }
    }
    fn refill(&mut self, now: Nanos) {
        let dt = now.saturating_sub(self.last).0 as u128;
        self.last = self.last.max(now);
        let cap = if self.waiting {
            2 * self.depth
        } else {
            self.depth
        };
        self.level = (self.level + dt * self.rate as u128).min(cap as u128 * SCALE);
    }
    pub fn rate(&self) -> u64 {
        self.rate
    }
    pub fn set_rate(&mut self, rate: u64, now: Nanos) {
        self.refill(now);
        self.rate = rate;
    }
    /// A new depth (the chunk size changed); a level above it is cut at the next refill.
    pub fn set_depth(&mut self, depth: u64, now: Nanos) {
        self.refill(now);
        self.depth = depth.max(1);
    }
    /// When `n` tokens will be there (now if they are); `n` is capped at the depth.
    pub fn ready_at(&mut self, n: u64, now: Nanos) -> Nanos {
        self.refill(now);
        let need = n.min(self.depth) as u128 * SCALE;
        if self.level >= need {
            return now;
        }
        self.waiting = true;
        if self.rate == 0 {
            return Nanos::MAX;
        }
        let wait = (need - self.level).div_ceil(self.rate as u128);
        now.saturating_add(Nanos(wait.min(u64::MAX as u128) as u64))
    }
    /// Takes `n` (capped at the depth); the caller checked `ready_at`.
    fn take(&mut self, n: u64) {
        self.level = self.level.saturating_sub(n.min(self.depth) as u128 * SCALE);
        self.waiting = false;
    }
}

/// Justitia's multi-resource token: bytes and operations, both needed.
#[derive(Debug, Clone)]
pub struct MultiBucket {
    pub bytes: TokenBucket,
    pub ops: TokenBucket,
}

impl MultiBucket {
    pub fn new(
        bytes_rate: u64,
        ops_rate: u64,
        depth_bytes: u64,
        depth_ops: u64,
        now: Nanos,
    ) -> Self {
        MultiBucket {
            bytes: TokenBucket::new(bytes_rate, depth_bytes, now),
            ops: TokenBucket::new(ops_rate, depth_ops, now),
        }
    }
    /// A sender waits for these tokens (refused elsewhere): from `now` they keep the
    /// lateness credit ([`TokenBucket`]) until it takes them.
    fn wait(&mut self, now: Nanos) {
        for b in [&mut self.bytes, &mut self.ops] {
            b.refill(now);
            b.waiting = true;
        }
    }
    /// Takes `bytes` and `ops` now, or says when both will be there.
    pub fn try_take(&mut self, bytes: u64, ops: u64, now: Nanos) -> Result<(), Nanos> {
        let at = self
            .bytes
            .ready_at(bytes, now)
            .max(self.ops.ready_at(ops, now));
        if at > now {
            return Err(at);
        }
        self.bytes.take(bytes);
        self.ops.take(ops);
        Ok(())
    }
}

/// DIRS settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DirsConfig {
    pub enabled: bool,
    /// Late signals closer together than this count once (Delta). Default 1 ms.
    pub late_gap: Nanos,
    /// After this long without a signal the virtual stream's rate recovers by one
    /// additive step, and again each further interval. Default 10 ms.
    pub recovery: Nanos,
    /// After this long without a signal the virtual stream's rate resets to the link.
    /// Default 100 ms.
    pub reset: Nanos,
    /// Window of the "periodical lowest" rate. Default 10 ms.
    pub window: Nanos,
}

impl Default for DirsConfig {
    fn default() -> Self {
        DirsConfig {
            enabled: true,
            late_gap: Nanos::from_millis(1),
            recovery: Nanos::from_millis(10),
            reset: Nanos::from_millis(100),
            window: Nanos::from_millis(10),
        }
    }
}

/// DIRS's per-destination state: the virtual stream and the periodical lowest rate.
#[derive(Debug, Clone)]
pub struct Dirs {
    cfg: DirsConfig,
    line: u64,
    step: u64,
    vf_rate: u64,
    last_late: Option<Nanos>,
    recover_at: Option<Nanos>,
    reset_at: Option<Nanos>,
    window_start: Nanos,
    window_low: u64,
    periodic_low: u64,
}

impl Dirs {
    pub fn new(cfg: DirsConfig, line: u64, step: u64, now: Nanos) -> Self {
        Dirs {
            cfg,
            line,
            step,
            vf_rate: line,
            last_late: None,
            recover_at: None,
            reset_at: None,
            window_start: now,
            window_low: line,
            periodic_low: line,
        }
    }
    pub fn virtual_rate(&self) -> u64 {
        self.vf_rate
    }
    /// DIRS Algorithm 1: a congestion signal that no active stream can act on.
    pub fn on_late_signal(&mut self, now: Nanos) {
        if let Some(t) = self.last_late
            && now.saturating_sub(t) <= self.cfg.late_gap
        {
            return;
        }
        self.vf_rate = (self.vf_rate / 2).max(1);
        self.recover_at = Some(now.saturating_add(self.cfg.recovery));
        self.reset_at = Some(now.saturating_add(self.cfg.reset));
        self.last_late = Some(now);
    }
    /// Timers and the observation window; `active_low` is the lowest active stream rate.
    pub fn tick(&mut self, active_low: Option<u64>, now: Nanos) {
        if let Some(t) = self.reset_at
            && now >= t
        {
            self.vf_rate = self.line;
            self.reset_at = None;
            self.recover_at = None;
        }
        if let Some(t) = self.recover_at
            && now >= t
        {
            self.vf_rate = self.vf_rate.saturating_add(self.step).min(self.line);
            self.recover_at = Some(now.saturating_add(self.cfg.recovery));
        }
        let low = active_low.unwrap_or(self.line).min(self.vf_rate);
        self.window_low = self.window_low.min(low);
        if now.saturating_sub(self.window_start) >= self.cfg.window {
            self.periodic_low = self.window_low;
            self.window_low = low;
            self.window_start = now;
        }
    }
    /// Initial rate for a new stream: min(instantaneous lowest, periodical lowest).
    pub fn initial_rate(&self, active_low: Option<u64>) -> u64 {
        if !self.cfg.enabled {
            return self.line;
        }
        active_low
            .unwrap_or(self.line)
            .min(self.vf_rate)
            .min(self.periodic_low)
            .max(1)
    }
    fn next_timer(&self) -> Option<Nanos> {
        [self.reset_at, self.recover_at].into_iter().flatten().min()
    }
}

/// Pacer settings; every one has a default.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PacerConfig {
    /// Transfers above the chunk size are split into chunks of at most that size. With
    /// `chunk_auto` this is the largest chunk, else the chunk. Default 128 KiB (the
    /// largest command capsule of SPDK's TCP transport by default: a larger chunk of a
    /// write waits for an R2T).
    pub chunk_bytes: u64,
    /// The chunk follows the latency target and the path ([`Pacer::chunk_bytes`]).
    /// Default true; false: always `chunk_bytes`.
    pub chunk_auto: bool,
    /// Link bandwidth in MiB/s (the C of Justitia). Default 2800 (about 25 Gb/s).
    pub link_mibps: u64,
    /// Link operation rate. Default 1,000,000.
    pub link_iops: u64,
    /// p99 latency target of small commands. Default 200 us. With
    /// `latency_target_auto_milli` it is the ceiling of the target that follows the path.
    pub latency_target: Nanos,
    /// When non-zero, the latency target follows the path: this many thousandths of the
    /// probe's base latency (the lowest probe latency of the last `probe_window` to
    /// 2 × `probe_window` probes), never above `latency_target`. Justitia sets its target
    /// to a latency-sensitive flow's latency alone; the base latency is that, measured
    /// by the probe in the gaps pacing leaves, so the same setting suits RDMA's
    /// microseconds and TCP's tens of them. Default 0 (the fixed `latency_target`,
    /// since 2026-11-29; 1500, 1.5 × the base latency, from 2026-11-25): AIMD compares
    /// the probe's p99 with the target, and the base latency is the probe's *lowest*
    /// latency. On NVMe/TCP loopback the small command's p99 alone was 2-4.6 × its
    /// lowest (reader alone: p50 9-10 us, p99 20-47 us), and beside a paced writer most of
    /// it is the wait behind the writer's chunks: with 1.5 × (18-43 us) 79-96 % of AIMD's
    /// decisions were congestion, with 6 × (63-69 us) still 65-78 %, so the writer sat
    /// at its sharing floor (0.48-0.56 of its unpaced rate); with the fixed 200 us
    /// 5-10 % (0.60-0.72, reader's p99 14-22x lower: docs/benchmarks.md).
    pub latency_target_auto_milli: u64,
    /// The reference probe is sent this often. Default 500 us (Justitia).
    pub probe_interval: Nanos,
    /// Probe samples kept for the p99 estimate. Default 1000.
    pub probe_window: usize,
    /// AIMD decision interval. Default 1 ms.
    pub aimd_interval: Nanos,
    /// Additive increase per interval, thousandths of the link. Default 20 (2%).
    pub increase_milli: u64,
    /// Latency-sensitive traffic is considered gone after this long without any.
    /// Default 100 ms.
    pub latency_idle: Nanos,
    /// Split and pace large transfers also when no latency-sensitive traffic is seen
    /// (for a link shared with traffic this pacer does not see). Default false:
    /// Justitia's trigger, large transfers alone go whole.
    pub split_always: bool,
    pub dirs: DirsConfig,
    /// The most the sharing floor is raised (thousandths) to make up for chunks a
    /// backlogged writer sends late (see [`DELIVERY_WINDOW`]); 1000 turns the
    /// correction off. Default 1125, at most 2000.
    pub floor_boost_max_milli: u64,
    /// With `chunk_auto`, the chunk is at least what the link moves in this many
    /// thousandths of the probe's base latency ([`chunk_floor_for_base`]), and the
    /// automatic latency target leaves a small command room to wait behind one such
    /// chunk ([`target_for_path`]). The base latency is a small command's round trip on
    /// the idle path: what a command costs both stacks, an upper bound of the fixed cost
    /// a chunk pays besides its data. A chunk that takes less time on the link than that
    /// cost spends the target's core on commands, not data (on 2026-11-29: base 12-13
    /// us, chunks of 12-16 KiB, the writer alone in them 0.87-0.90 of plain). Default
    /// 2000 (two base latencies); 0: no such floor (the slack alone sizes the chunk).
    pub chunk_floor_base_milli: u64,
}

impl Default for PacerConfig {
    fn default() -> Self {
        PacerConfig {
            chunk_bytes: 128 * 1024,
            chunk_auto: true,
            link_mibps: 2800,
            link_iops: 1_000_000,
            latency_target: Nanos::from_micros(200),
            latency_target_auto_milli: 0,
            probe_interval: Nanos::from_micros(500),
            probe_window: 1000,
            aimd_interval: Nanos::from_millis(1),
            increase_milli: 20,
            latency_idle: Nanos::from_millis(100),
            split_always: false,
            dirs: DirsConfig::default(),
            floor_boost_max_milli: 1125,
            chunk_floor_base_milli: 2000,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum PacerConfigError {
    #[error("chunk size {0} bytes must be 4 KiB ..= 16 MiB")]
    ChunkSize(u64),
    #[error(
        "link bandwidth and operation rate must be at least 1 (got {mibps} MiB/s, {iops} IOPS)"
    )]
    Link { mibps: u64, iops: u64 },
    #[error("{what} must be at least 1 us (got {got})")]
    Interval { what: &'static str, got: Nanos },
    #[error("additive increase {0}/1000 of the link is outside 1 ..= 1000")]
    Increase(u64),
    #[error("probe window must hold 1 ..= 100000 samples (got {0})")]
    Window(usize),
    #[error(
        "automatic latency target {0}/1000 of the base latency is outside 1000 ..= 100000 (0 turns it off)"
    )]
    AutoTarget(u64),
    #[error("the sharing floor's correction {0}/1000 is outside 1000 ..= 2000 (1000 turns it off)")]
    FloorBoost(u64),
    #[error(
        "the chunk floor of {0}/1000 of the base latency is outside 100 ..= 100000 (0 turns it off)"
    )]
    ChunkFloorBase(u64),
}

impl PacerConfig {
    pub fn validate(&self) -> Result<(), PacerConfigError> {
        if !(1000..=2000).contains(&self.floor_boost_max_milli) {
            return Err(PacerConfigError::FloorBoost(self.floor_boost_max_milli));
        }
        if !(4096..=16 * MIB).contains(&self.chunk_bytes) {
            return Err(PacerConfigError::ChunkSize(self.chunk_bytes));
        }
        if self.link_mibps == 0 || self.link_iops == 0 {
            return Err(PacerConfigError::Link {
                mibps: self.link_mibps,
                iops: self.link_iops,
            });
        }
        for (what, got) in [
            ("probe interval", self.probe_interval),
            ("AIMD interval", self.aimd_interval),
            ("latency target", self.latency_target),
            ("DIRS late gap", self.dirs.late_gap),
            ("DIRS recovery", self.dirs.recovery),
            ("DIRS reset", self.dirs.reset),
            ("DIRS window", self.dirs.window),
        ] {
            if got < Nanos::from_micros(1) {
                return Err(PacerConfigError::Interval { what, got });
            }
        }
        if self.increase_milli == 0 || self.increase_milli > 1000 {
            return Err(PacerConfigError::Increase(self.increase_milli));
        }
        if self.probe_window == 0 || self.probe_window > 100_000 {
            return Err(PacerConfigError::Window(self.probe_window));
        }
        let cf = self.chunk_floor_base_milli;
        if cf != 0 && !(100..=100_000).contains(&cf) {
            return Err(PacerConfigError::ChunkFloorBase(cf));
        }
        let auto = self.latency_target_auto_milli;
        if auto != 0 && !(1000..=100_000).contains(&auto) {
            return Err(PacerConfigError::AutoTarget(auto));
        }
        Ok(())
    }
    fn link_bytes(&self) -> u64 {
        self.link_mibps.saturating_mul(MIB)
    }
    /// The smallest chunk `chunk_auto` picks: the link's bytes per operation (a smaller
    /// chunk runs out of operations before it fills the link), at least 4 KiB, at most
    /// `chunk_bytes`.
    pub fn chunk_floor(&self) -> u64 {
        self.link_bytes()
            .div_ceil(self.link_iops.max(1))
            .next_multiple_of(CHUNK_GRAIN)
            .max(CHUNK_GRAIN)
            .min(self.chunk_bytes)
    }
}

/// `chunk_auto` picks multiples of this.
const CHUNK_GRAIN: u64 = 4096;

/// The chunk `chunk_auto` uses with latency-sensitive traffic before a probe has measured
/// the path's base latency.
pub const CHUNK_BEFORE_PROBE: u64 = 32 * 1024;

/// How long the pacer measures what the large streams really sent before it corrects
/// the sharing floor ([`Pacer::floor_boost_milli`]).
pub const DELIVERY_WINDOW: Nanos = Nanos::from_millis(20);

/// What the large streams sent in the current delivery window, and the correction of
/// the sharing floor it led to. A paced sender does not take every token when it is
/// due: it sends a chunk when one of its commands completes and its core gets to it,
/// and the bucket's lateness credit covers only two chunks. On the real target the
/// writer got 92-98 % of what the pacer allowed, so a writer held at its floor (half
/// the link beside a reader) kept 46-49 % of the link instead of Justitia's 1/n. While
/// the floor binds and the streams were refused tokens (they wanted more), the floor is
/// scaled by what was allowed over what was sent, halfway each window, within
/// `1000 ..=` [`PacerConfig::floor_boost_max_milli`].
#[derive(Debug, Clone, Copy)]
struct Delivery {
    since: Nanos,
    sent: u64,
    /// A send was refused in the window (the streams were backlogged at the pacer).
    refused: bool,
    /// The floor bound the allowed rate at every AIMD step of the window.
    pinned: bool,
    boost_milli: u64,
}

impl Delivery {
    fn new(now: Nanos) -> Self {
        Delivery {
            since: now,
            sent: 0,
            refused: false,
            pinned: true,
            boost_milli: 1000,
        }
    }

    /// Ends the window at `now` if it is over; `floor` is the unboosted floor, `max` the
    /// most it may be raised.
    fn close(&mut self, now: Nanos, floor: u64, max: u64) {
        let dt = now.saturating_sub(self.since);
        if dt < DELIVERY_WINDOW {
            return;
        }
        if self.pinned && self.refused && self.sent > 0 && floor > 0 {
            let rate = mul_div(self.sent, 1_000_000_000, dt.0).max(1);
            let want = mul_div(self.boost_milli, floor, rate).clamp(1000, max);
            self.boost_milli = (self.boost_milli + want).div_ceil(2);
        }
        *self = Delivery {
            boost_milli: self.boost_milli,
            ..Delivery::new(now)
        };
    }
}

/// The largest chunk a small command can wait behind within `target` on a path of
/// `base` latency whose link moves `link_bytes` per second: the slack `target - base`
/// times the link's rate, in multiples of 4 KiB, within `floor ..= ceiling`.
pub fn chunk_for_slack(
    target: Nanos,
    base: Nanos,
    link_bytes: u64,
    floor: u64,
    ceiling: u64,
) -> u64 {
    let slack = target.saturating_sub(base);
    let bytes = mul_div(slack.0, link_bytes, 1_000_000_000);
    (bytes / CHUNK_GRAIN * CHUNK_GRAIN).clamp(floor.min(ceiling), ceiling)
}

/// The smallest chunk that keeps the link on a path of `base` latency: the bytes the
/// link (`link_bytes` per second) moves in `milli` thousandths of `base`, rounded up to
/// 4 KiB (0 when `milli` is 0). A command's fixed cost, both stacks' work on it, is at
/// most its round trip on the idle path (the probe's base latency); a chunk whose data
/// takes that long on the link at least spends the path's time mostly on data.
pub fn chunk_floor_for_base(base: Nanos, link_bytes: u64, milli: u64) -> u64 {
    let t = mul_div(base.0, milli, 1000);
    mul_div(t, link_bytes, 1_000_000_000).next_multiple_of(CHUNK_GRAIN)
}

/// The automatic latency target on a path of `base` latency: `auto_milli` thousandths
/// of `base`, but at least `base` plus the time the link (`link_bytes` per second)
/// takes for one chunk of `floor` bytes (a small command that arrives behind the
/// smallest chunk the link needs waits that long, and a target below it would call
/// every such wait congestion: on 2026-11-29, with a target of 1.5 base = 18-20 us,
/// 92-96 % of AIMD's decisions did), never above `ceiling` (the fixed target). At
/// least 1 ns.
pub fn target_for_path(
    base: Nanos,
    auto_milli: u64,
    floor: u64,
    link_bytes: u64,
    ceiling: Nanos,
) -> Nanos {
    let scaled = Nanos(mul_div(base.0, auto_milli, 1000));
    let behind_floor = base.saturating_add(Nanos(mul_div(floor, 1_000_000_000, link_bytes.max(1))));
    scaled.max(behind_floor).max(Nanos(1)).min(ceiling)
}

/// Whether latency-sensitive traffic shares the path at `now`: a small command was sent
/// (`last_small`) less than `idle` ago. Shaping large transfers pays only then; the
/// initiator plugin applies the same rule on its submit path, from an atomic copy of
/// `last_small`, without taking the pacer's lock.
pub fn latency_sensitive_at(last_small: Option<Nanos>, now: Nanos, idle: Nanos) -> bool {
    last_small.is_some_and(|t| now.saturating_sub(t) < idle)
}

/// May a sender (a connection of the path) send the probe that has been due since
/// `due_since`? Yes if it sent latency-sensitive traffic less than `idle` ago
/// (`last_small_here`, [`latency_sensitive_at`]): the probe then shares the queue of the
/// traffic it stands for. On a large stream's connection it waits behind that stream's
/// own chunks in the same queue, which the latency-sensitive traffic does not (on
/// 2026-11-29 about 28 % of the probes went on the writer's connection). Any sender may
/// once the probe has waited `2 × interval`, so a path whose latency-sensitive senders
/// cannot probe is still measured.
pub fn may_send_probe(
    last_small_here: Option<Nanos>,
    due_since: Nanos,
    now: Nanos,
    idle: Nanos,
    interval: Nanos,
) -> bool {
    latency_sensitive_at(last_small_here, now, idle)
        || now.saturating_sub(due_since) >= interval.saturating_add(interval)
}

/// The minimum of the last `block` to `2 × block` samples, in O(1) per sample: the
/// minimum of the block being filled and of the one before it. A path that becomes
/// slower for good raises it within two blocks.
#[derive(Debug, Clone)]
struct BaseLatency {
    block: usize,
    filled: usize,
    current: Option<Nanos>,
    previous: Option<Nanos>,
}

impl BaseLatency {
    fn new(block: usize) -> Self {
        BaseLatency {
            block: block.max(1),
            filled: 0,
            current: None,
            previous: None,
        }
    }
    fn record(&mut self, latency: Nanos) {
        if self.filled == self.block {
            self.previous = self.current.take();
            self.filled = 0;
        }
        self.filled += 1;
        self.current = Some(self.current.map_or(latency, |c| c.min(latency)));
    }
    fn min(&self) -> Option<Nanos> {
        match (self.current, self.previous) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}

/// Identifies an open stream; stale ids (of closed streams) are refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct StreamId {
    index: u32,
    generation: u32,
}

#[derive(Debug, Clone)]
struct Stream {
    generation: u32,
    /// The flow (host, queue pair, application) the transfer belongs to.
    flow: u64,
    rate: u64,
    bucket: TokenBucket,
    /// Its last request was refused and it has not sent since: it is held by the pacer.
    held: bool,
    /// When it last sent a chunk that ended a hold (sends at that same instant, from the
    /// lateness credit, belong to the hold too).
    held_tail: Option<Nanos>,
}

/// What the large streams were allowed and sent while the pacer held them
/// ([`Pacer::held_delivery`]): a sender gets what its pacer allows when, over the time
/// it had a chunk refused and waiting, it sent what the allowed rate U and the tokens
/// already there came to. Time in which every chunk was already sent (the path, not the
/// pacer, held the sender) is not in it: beside a reader, U is often above what the
/// path gives a writer, and the writer's rate over a whole round against U's mean over
/// it mixes the two (on 2026-11-29 the reader/writer test's check against one snapshot
/// of U failed in three runs of five).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct HeldDelivery {
    /// Time during which at least one stream was held, ns.
    pub held_ns: u64,
    /// U over that time, bytes.
    pub allowed_bytes: u64,
    /// The held streams' own rates over that time, bytes: below
    /// `allowed_bytes` where a stream's rate (DIRS, AIMD per stream) was below U.
    pub stream_allowed_bytes: u64,
    /// Bytes of the chunks that ended a hold (and those sent at the same instant by the
    /// same stream).
    pub sent_bytes: u64,
    /// The tokens those chunks took: a chunk above the buckets' depth (the chunk size)
    /// takes the depth. [`plan_even_chunks`] stretches chunks up to half as much again
    /// (1 MiB as 8 × 128 KiB where the chunk is 88 KiB), so `sent_bytes` can be above
    /// `allowed_bytes` by that much; this is what the pacer's own books say it let go.
    pub charged_bytes: u64,
}

/// What [`Pacer::tick`] asks of its caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PacerTick {
    /// Call `tick` again no later than this.
    pub next_deadline: Nanos,
    /// Send a reference probe now and report its latency with [`Pacer::on_probe`].
    pub send_probe: bool,
}

/// The pacer for one destination (one target).
#[derive(Debug, Clone)]
pub struct Pacer {
    cfg: PacerConfig,
    clock: MonotonicClamp,
    link: u64,
    step: u64,
    allowed: u64,
    aggregate: MultiBucket,
    streams: Vec<Option<Stream>>,
    free: Vec<u32>,
    generations: Vec<u32>,
    active: usize,
    /// Open streams per flow: fairness and the sharing floor count flows, not
    /// transfers, so a flow with eight transfers in flight is still one flow.
    flows: Vec<(u64, u32)>,
    dirs: Dirs,
    probes: LatencyWindow,
    base: BaseLatency,
    last_latency_io: Option<Nanos>,
    next_aimd: Nanos,
    next_probe: Nanos,
    delivery: Delivery,
    aimd: AimdCounts,
    /// U integrated since the pacer was built up to `u_last`, in bytes × 1e9 (rate per
    /// second times nanoseconds).
    u_total: u128,
    u_last: Nanos,
    /// Streams held now, since when (and `u_total` then).
    held_streams: usize,
    /// The held streams' rates integrated (as `u_total`) while any was held.
    held_rates_total: u128,
    held_from: (Nanos, u128, u128),
    held: HeldDelivery,
    /// Counts the changes of the buckets' rates and depths ([`Pacer::rates_version`]).
    rates_version: u64,
}

/// What AIMD decided while latency-sensitive traffic was about, since the pacer was
/// built (for the plugin's state: how often the probe's p99 was above the target).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AimdCounts {
    /// Decisions taken with latency-sensitive traffic about.
    pub steps: u64,
    /// Of those, the probe's p99 was above the target (U halved, or held at the floor).
    pub congested: u64,
    /// The probe's p99 at the last decision that had samples.
    pub last_p99: Option<Nanos>,
}

impl Pacer {
    pub fn new(cfg: PacerConfig, now: Nanos) -> Result<Self, PacerConfigError> {
        cfg.validate()?;
        let link = cfg.link_bytes();
        let step = mul_div(link, cfg.increase_milli, 1000).max(1);
        let ops_per_chunk = mul_div(cfg.chunk_bytes, cfg.link_iops, link).max(1);
        let aggregate = MultiBucket::new(link, cfg.link_iops, cfg.chunk_bytes, ops_per_chunk, now);
        Ok(Pacer {
            cfg,
            clock: MonotonicClamp::new(now),
            link,
            step,
            allowed: link,
            aggregate,
            streams: Vec::new(),
            free: Vec::new(),
            generations: Vec::new(),
            active: 0,
            flows: Vec::new(),
            dirs: Dirs::new(cfg.dirs, link, step, now),
            probes: LatencyWindow::new(cfg.probe_window),
            base: BaseLatency::new(cfg.probe_window),
            last_latency_io: None,
            next_aimd: now.saturating_add(cfg.aimd_interval),
            next_probe: now,
            delivery: Delivery::new(now),
            aimd: AimdCounts::default(),
            u_total: 0,
            u_last: now,
            held_streams: 0,
            held_rates_total: 0,
            held_from: (now, 0, 0),
            held: HeldDelivery::default(),
            rates_version: 0,
        })
    }

    pub fn config(&self) -> &PacerConfig {
        &self.cfg
    }
    /// The allowed aggregate rate U of large streams, bytes per second.
    pub fn allowed_rate(&self) -> u64 {
        self.allowed
    }
    /// U integrated from the pacer's start to `now`, bytes: its difference over a
    /// time span is the mean allowance over that span (U moves every AIMD interval).
    pub fn allowed_bytes_total(&self, now: Nanos) -> u64 {
        let dt = now.saturating_sub(self.u_last).0 as u128;
        let total = self.u_total + dt * self.allowed as u128;
        (total / SCALE).min(u64::MAX as u128) as u64
    }
    /// What the large streams were allowed and sent while the pacer held them, since the
    /// pacer was built ([`HeldDelivery`]); a hold still going on counts up to `now`.
    pub fn held_delivery(&self, now: Nanos) -> HeldDelivery {
        let mut h = self.held;
        if self.held_streams > 0 {
            let (from, u0, r0) = self.held_from;
            let now = now.max(self.u_last);
            h.held_ns = h.held_ns.saturating_add(now.saturating_sub(from).0);
            let u = self.u_total + now.saturating_sub(self.u_last).0 as u128 * self.allowed as u128;
            h.allowed_bytes = h
                .allowed_bytes
                .saturating_add(((u - u0) / SCALE).min(u64::MAX as u128) as u64);
            let r = self.held_rates_total
                + now.saturating_sub(self.u_last).0 as u128 * self.held_rates();
            h.stream_allowed_bytes = h
                .stream_allowed_bytes
                .saturating_add(((r - r0) / SCALE).min(u64::MAX as u128) as u64);
        }
        h
    }
    /// Integrates U up to `now` (before U changes, and where a hold begins or ends).
    fn advance_u(&mut self, now: Nanos) {
        let dt = now.saturating_sub(self.u_last).0 as u128;
        self.u_total += dt * self.allowed as u128;
        if self.held_streams > 0 {
            self.held_rates_total += dt * self.held_rates();
        }
        self.u_last = self.u_last.max(now);
    }
    /// The held streams' own rates together (bytes per second, scaled).
    fn held_rates(&self) -> u128 {
        self.streams
            .iter()
            .flatten()
            .filter(|s| s.held)
            .map(|s| s.bucket.rate() as u128)
            .sum()
    }
    /// Stream `index` was refused at `now`: a hold begins unless it was held already.
    fn hold(&mut self, index: usize, now: Nanos) {
        if !matches!(self.streams.get(index), Some(Some(s)) if !s.held) {
            return;
        }
        self.advance_u(now);
        let Some(Some(s)) = self.streams.get_mut(index) else {
            return;
        };
        s.held = true;
        self.held_streams += 1;
        if self.held_streams == 1 {
            // The tokens already there are not counted: a hold mostly begins at the
            // instant the last one ended, and what that one left in the bucket was
            // counted in its U (counting it again read 0.80-0.83 on the real target
            // where the writer got all it was allowed). A run of holds that begins
            // after a pause gets up to one chunk it is not charged for, and one that
            // ends leaves up to one it was: an error of a chunk per run each way.
            self.held_from = (now, self.u_total, self.held_rates_total);
        }
    }
    /// Stream `index` is no longer held at `now` (it sent, or closed).
    fn unhold(&mut self, index: usize, now: Nanos) {
        if !matches!(self.streams.get(index), Some(Some(s)) if s.held) {
            return;
        }
        self.advance_u(now);
        let Some(Some(s)) = self.streams.get_mut(index) else {
            return;
        };
        s.held = false;
        s.held_tail = Some(now);
        self.held_streams -= 1;
        if self.held_streams == 0 {
            let (from, u0, r0) = self.held_from;
            self.held.held_ns = self.held.held_ns.saturating_add(now.saturating_sub(from).0);
            let allowed = ((self.u_total - u0) / SCALE).min(u64::MAX as u128) as u64;
            self.held.allowed_bytes = self.held.allowed_bytes.saturating_add(allowed);
            let own = ((self.held_rates_total - r0) / SCALE).min(u64::MAX as u128) as u64;
            self.held.stream_allowed_bytes = self.held.stream_allowed_bytes.saturating_add(own);
        }
    }
    pub fn active_streams(&self) -> usize {
        self.active
    }
    pub fn dirs(&self) -> &Dirs {
        &self.dirs
    }
    /// The lowest recent probe latency (the path's latency without pacer-visible load).
    pub fn base_latency(&self) -> Option<Nanos> {
        self.base.min()
    }
    /// The p99 target AIMD holds the probe to now: the fixed `latency_target`, or with
    /// `latency_target_auto_milli` that multiple of the base latency (at most the fixed
    /// one; the fixed one until a probe has completed).
    ///
    /// The automatic target is at least the base latency plus one chunk of
    /// [`Self::chunk_floor`] on the link ([`target_for_path`]).
    pub fn latency_target(&self) -> Nanos {
        let fixed = self.cfg.latency_target;
        match (self.cfg.latency_target_auto_milli, self.base.min()) {
            (0, _) | (_, None) => fixed,
            (milli, Some(base)) => {
                // The whole floor (the link's bytes per operation too), so the chunk
                // `chunk_auto` picks always fits in the slack.
                let floor = if self.cfg.chunk_auto {
                    self.chunk_floor()
                } else {
                    0
                };
                target_for_path(base, milli, floor, self.link, fixed)
            }
        }
    }

    /// The chunk floor from the base latency alone ([`chunk_floor_for_base`]), at most
    /// `chunk_bytes`.
    fn base_floor(&self, base: Nanos) -> u64 {
        chunk_floor_for_base(base, self.link, self.cfg.chunk_floor_base_milli)
            .min(self.cfg.chunk_bytes)
    }

    /// The smallest chunk `chunk_auto` picks now: the link's bytes per operation
    /// ([`PacerConfig::chunk_floor`]) or, once a probe has measured the path, what the
    /// link moves in `chunk_floor_base_milli` of its base latency if more
    /// ([`chunk_floor_for_base`]); at most `chunk_bytes`.
    pub fn chunk_floor(&self) -> u64 {
        let ops = self.cfg.chunk_floor();
        match self.base.min() {
            None => ops,
            Some(base) => ops.max(self.base_floor(base)),
        }
    }
    pub fn stream_rate(&self, id: StreamId) -> Option<u64> {
        self.stream(id).map(|s| s.rate)
    }
    /// A transfer of `bytes` sent at `now` is split and paced: it is larger than a chunk
    /// and latency-sensitive traffic shares the path (Justitia's trigger; alone, a large
    /// transfer goes whole, since chunks only cost it throughput).
    pub fn should_split(&self, bytes: u64, now: Nanos) -> bool {
        bytes > self.chunk_bytes(now) && (self.cfg.split_always || self.latency_sensitive(now))
    }

    /// The chunk size at `now`: `chunk_bytes`, or with `chunk_auto` and latency-sensitive
    /// traffic the largest chunk that keeps a small command's wait behind it within the
    /// latency target ([`chunk_for_slack`]; [`CHUNK_BEFORE_PROBE`] until a probe has
    /// measured the base latency).
    pub fn chunk_bytes(&self, now: Nanos) -> u64 {
        let c = &self.cfg;
        if !c.chunk_auto || !self.latency_sensitive(now) {
            return c.chunk_bytes;
        }
        let floor = self.chunk_floor();
        match self.base.min() {
            None => CHUNK_BEFORE_PROBE.clamp(floor, c.chunk_bytes),
            Some(base) => {
                chunk_for_slack(self.latency_target(), base, self.link, floor, c.chunk_bytes)
            }
        }
    }

    fn stream(&self, id: StreamId) -> Option<&Stream> {
        self.streams
            .get(id.index as usize)?
            .as_ref()
            .filter(|s| s.generation == id.generation)
    }

    /// Latency-sensitive traffic shares the path at `now` (as the pacer last heard of
    /// it: [`Self::note_latency_sensitive`]).
    pub fn latency_sensitive_now(&self, now: Nanos) -> bool {
        self.latency_sensitive(now)
    }

    fn latency_sensitive(&self, now: Nanos) -> bool {
        latency_sensitive_at(self.last_latency_io, now, self.cfg.latency_idle)
    }

    /// Number of flows with a large transfer in progress.
    pub fn active_flows(&self) -> usize {
        self.flows.len()
    }

    /// The sharing floor, corrected for chunks sent late ([`Self::floor_boost_milli`]).
    fn floor(&self, now: Nanos) -> u64 {
        mul_div(self.fair_floor(now), self.delivery.boost_milli, 1000).min(self.link)
    }

    /// Justitia's sharing floor: the large flows together keep `n_h / (n_h + n_l)` of
    /// the link.
    fn fair_floor(&self, now: Nanos) -> u64 {
        let n_l = u64::from(self.latency_sensitive(now));
        let n_h = (self.flows.len() as u64).max(1);
        mul_div(self.link, n_h, n_h + n_l)
    }

    /// How much the sharing floor is raised (thousandths) so that what the large streams
    /// really send at their floor is the floor: see [`DELIVERY_WINDOW`].
    pub fn floor_boost_milli(&self) -> u64 {
        self.delivery.boost_milli
    }

    /// AIMD's decisions so far ([`AimdCounts`]).
    pub fn aimd_counts(&self) -> AimdCounts {
        self.aimd
    }

    fn streams_of(&self, flow: u64) -> u64 {
        self.flows
            .iter()
            .find(|f| f.0 == flow)
            .map_or(1, |f| f.1 as u64)
            .max(1)
    }

    fn active_low(&self) -> Option<u64> {
        self.streams.iter().flatten().map(|s| s.rate).min()
    }

    fn apply_shares(&mut self, now: Nanos) {
        // The streams' rates change here.
        self.advance_u(now);
        // Each flow gets U / flows, split among its transfers; a transfer paces at its
        // own rate (DIRS, AIMD) within that, but never under its part of the flow's
        // sharing floor: a flow's transfers come and go (one ends, the application
        // sends the next), and rates halved while there were four must not leave three
        // to run the flow under its floor. (The floor is Justitia's guarantee against
        // latency-sensitive traffic; without any, DIRS alone sets where a stream starts.)
        let flows = self.flows.len().max(1) as u64;
        let per_flow = (self.allowed / flows).max(1);
        let floor_per_flow = if self.latency_sensitive(now) {
            (self.floor(now) / flows).max(1)
        } else {
            1
        };
        let rates: Vec<u64> = self
            .streams
            .iter()
            .map(|s| {
                s.as_ref().map_or(0, |s| {
                    let n = self.streams_of(s.flow);
                    let share = (per_flow / n).max(1);
                    s.rate.min(share).max(floor_per_flow / n)
                })
            })
            .collect();
        // Every bucket holds one chunk (two while late): a deeper one would let a burst
        // of chunks go at once, and the small commands wait behind all of them.
        let chunk = self.chunk_bytes(now);
        let mut changed = false;
        let mut set = |b: &mut TokenBucket, rate: u64, depth: u64| {
            changed |= b.rate() != rate || b.depth != depth;
            b.set_rate(rate, now);
            b.set_depth(depth, now);
        };
        for (s, rate) in self.streams.iter_mut().zip(rates) {
            if let Some(s) = s {
                set(&mut s.bucket, rate, chunk);
            }
        }
        set(&mut self.aggregate.bytes, self.allowed, chunk);
        set(
            &mut self.aggregate.ops,
            mul_div(self.allowed, self.cfg.link_iops, self.link).max(1),
            mul_div(chunk, self.cfg.link_iops, self.link).max(1),
        );
        self.rates_version += u64::from(changed);
    }

    /// Changes whenever a bucket's rate or depth changes (AIMD, DIRS, a stream opened or
    /// closed, the chunk size). A refusal's time ([`Pacer::try_send`]'s `Err`) holds
    /// only while this stays the same: a sender that waits for it must ask again when
    /// this changes (a stream refused at a rate a late signal had cut waits for hours
    /// at that rate, and AIMD lifts it within a millisecond).
    pub fn rates_version(&self) -> u64 {
        self.rates_version
    }

    /// A large transfer of `flow` begins: a new stream at the DIRS initial rate.
    pub fn open_stream(&mut self, flow: u64, now: Nanos) -> StreamId {
        let now = self.clock.observe(now);
        let rate = self.dirs.initial_rate(self.active_low());
        let index = match self.free.pop() {
            Some(i) => i,
            None => {
                self.streams.push(None);
                self.generations.push(0);
                (self.streams.len() - 1) as u32
            }
        };
        let generation = self.generations[index as usize];
        let bucket = TokenBucket::new(rate, self.chunk_bytes(now), now);
        self.streams[index as usize] = Some(Stream {
            generation,
            flow,
            rate,
            bucket,
            held: false,
            held_tail: None,
        });
        self.active += 1;
        match self.flows.iter_mut().find(|f| f.0 == flow) {
            Some(f) => f.1 += 1,
            None => self.flows.push((flow, 1)),
        }
        self.apply_shares(now);
        StreamId { index, generation }
    }

    /// The transfer is done (all chunks sent). Unknown ids are ignored.
    pub fn close_stream(&mut self, id: StreamId, now: Nanos) {
        let now = self.clock.observe(now);
        let Some(flow) = self.stream(id).map(|s| s.flow) else {
            return;
        };
        self.unhold(id.index as usize, now);
        if let Some(i) = self.flows.iter().position(|f| f.0 == flow) {
            self.flows[i].1 -= 1;
            if self.flows[i].1 == 0 {
                self.flows.swap_remove(i);
            }
        }
        self.streams[id.index as usize] = None;
        self.generations[id.index as usize] = id.generation.wrapping_add(1);
        self.free.push(id.index);
        self.active -= 1;
        self.apply_shares(now);
    }

    /// May the next chunk (`bytes`) of stream `id` go now? `Err(t)`: not before `t`.
    /// An unknown stream is paced by the aggregate bucket only.
    pub fn try_send(&mut self, id: StreamId, bytes: u64, now: Nanos) -> Result<(), Nanos> {
        let now = self.clock.observe(now);
        let known = self.stream(id).is_some();
        let index = id.index as usize;
        let own = match self.streams.get_mut(index).and_then(|s| s.as_mut()) {
            Some(s) if known => s.bucket.ready_at(bytes, now),
            _ => now,
        };
        if own > now {
            self.delivery.refused = true;
            if known {
                self.hold(index, now);
                // Refused on its own rate, the stream waits on the aggregate too, which
                // keeps the same lateness credit: capped at one chunk meanwhile, it threw
                // away what a late sender's own bucket kept, and a single stream (its rate
                // is U's, its bucket asked first) got 0.83 of U when it came most of a
                // chunk time late at every other chunk (0.80-0.86 on the real target).
                self.aggregate.wait(now);
            }
            return Err(own);
        }
        let charged = bytes.min(self.aggregate.bytes.depth);
        if let Err(t) = self.aggregate.try_take(bytes, 1, now) {
            self.delivery.refused = true;
            if known {
                self.hold(index, now);
            }
            // The stream's own tokens are there: waiting on the aggregate, it is as late
            // as a refused stream and keeps what it accrues meanwhile.
            if let Some(Some(s)) = self.streams.get_mut(id.index as usize)
                && s.generation == id.generation
            {
                s.bucket.waiting = true;
            }
            return Err(t);
        }
        if let Some(Some(s)) = self.streams.get_mut(index)
            && known
        {
            s.bucket.take(bytes);
            // A send that ends a hold, or follows one at the same instant (the lateness
            // credit), was held.
            if s.held || s.held_tail == Some(now) {
                self.held.sent_bytes = self.held.sent_bytes.saturating_add(bytes);
                self.held.charged_bytes = self.held.charged_bytes.saturating_add(charged);
            }
            self.unhold(index, now);
        }
        self.delivery.sent = self.delivery.sent.saturating_add(bytes);
        Ok(())
    }

    /// A small, latency-sensitive command was sent (it is never paced).
    pub fn note_latency_sensitive(&mut self, now: Nanos) {
        let now = self.clock.observe(now);
        self.last_latency_io = Some(now);
    }

    /// Latency of a reference probe.
    pub fn on_probe(&mut self, latency: Nanos, now: Nanos) {
        self.clock.observe(now);
        self.probes.record(latency);
        self.base.record(latency);
    }

    /// Latency of a probe that failed or was lost: it counts against the target (a slow
    /// or failing path is congestion) but not for the base latency, since an error can
    /// come back before the command reached the target's queues and would set the
    /// automatic target far too low.
    pub fn on_failed_probe(&mut self, latency: Nanos, now: Nanos) {
        self.clock.observe(now);
        self.probes.record(latency);
    }

    /// Runs AIMD and the DIRS timers when due.
    pub fn tick(&mut self, now: Nanos) -> PacerTick {
        let now = self.clock.observe(now);
        let low = self.active_low();
        self.dirs.tick(low, now);
        if now >= self.next_aimd {
            self.next_aimd = now.saturating_add(self.cfg.aimd_interval);
            self.advance_u(now);
            self.aimd(now);
        }
        let send_probe = self.latency_sensitive(now) && now >= self.next_probe;
        if send_probe {
            self.next_probe = now.saturating_add(self.cfg.probe_interval);
        }
        let mut next = self.next_aimd;
        if self.latency_sensitive(now) {
            next = next.min(self.next_probe);
        }
        if let Some(t) = self.dirs.next_timer() {
            next = next.min(t);
        }
        PacerTick {
            next_deadline: next.max(now.saturating_add(Nanos(1))),
            send_probe,
        }
    }

    fn aimd(&mut self, now: Nanos) {
        if !self.latency_sensitive(now) {
            // Justitia: with no latency-sensitive traffic, U is the whole link.
            self.allowed = self.link;
            self.probes.clear();
            for s in self.streams.iter_mut().flatten() {
                s.rate = s.rate.saturating_add(self.step).min(self.link);
            }
        } else {
            let target = self.latency_target();
            let p99 = self.probes.quantile(0.99);
            let congested = p99.is_some_and(|p99| p99 > target);
            self.aimd.steps += 1;
            self.aimd.congested += u64::from(congested);
            if p99.is_some() {
                self.aimd.last_p99 = p99;
            }
            let floor = self.floor(now);
            if congested {
                self.allowed = (self.allowed / 2).max(floor);
                if self.active == 0 {
                    self.dirs.on_late_signal(now);
                }
                let share_floor = floor / self.active.max(1) as u64;
                // (per transfer: the flow's share is split among its transfers)
                for s in self.streams.iter_mut().flatten() {
                    s.rate = (s.rate / 2).max(share_floor).max(1);
                }
                // Decide on fresh samples next time.
                self.probes.clear();
            } else {
                self.allowed = self.allowed.saturating_add(self.step).min(self.link);
                for s in self.streams.iter_mut().flatten() {
                    s.rate = s.rate.saturating_add(self.step).min(self.link);
                }
            }
        }
        // The floor binds: the allowed rate is at it or within an additive step or so
        // (AIMD moves between the floor and a little above while a reader is about).
        let pinned = self.active > 0
            && self.latency_sensitive(now)
            && self.allowed <= self.floor(now).saturating_mul(5) / 4;
        self.delivery.pinned &= pinned;
        let max = self.cfg.floor_boost_max_milli;
        self.delivery.close(now, self.fair_floor(now), max);
        self.apply_shares(now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn a_chunk_plan_covers_the_io_exactly_once_in_order(
            offset in 0u64..1 << 40, blocks in 0u64..100_000, bs_shift in 9u32..13, chunk_kib in 4u64..2048
        ) {
            let bs = 1u64 << bs_shift;
            let chunk = chunk_kib * 1024;
            let plan = plan_chunks(offset, blocks, bs, chunk);
            let chunks: Vec<Chunk> = plan.collect();
            let mut next = offset;
            for c in &chunks {
                prop_assert_eq!(c.offset_blocks, next, "in order, no gap, no overlap");
                prop_assert!(c.num_blocks * bs <= chunk.max(bs), "chunk within the size");
                next += c.num_blocks;
            }
            prop_assert_eq!(next, offset + blocks, "covers everything");
            if blocks > 0 {
                let min = chunks.iter().map(|c| c.num_blocks).min().unwrap();
                let max = chunks.iter().map(|c| c.num_blocks).max().unwrap();
                prop_assert!(max - min <= 1, "roughly equal");
                prop_assert!(min >= 1);
            }
        }
    }

    proptest! {
        #[test]
        fn even_chunks_cover_the_io_in_equal_chunks_never_more_than_plan_chunks(
            offset in 0u64..1 << 40, blocks in 0u64..5_000, bs_shift in 9u32..13,
            chunk_kib in 4u64..256, largest_kib in 4u64..512
        ) {
            let bs = 1u64 << bs_shift;
            let (chunk, largest) = (chunk_kib * 1024, largest_kib * 1024);
            let near = plan_chunks(offset, blocks, bs, chunk).chunk_count();
            let plan = plan_even_chunks(offset, blocks, bs, chunk, largest);
            let n = plan.chunk_count();
            let chunks: Vec<Chunk> = plan.collect();
            prop_assert!(n <= near, "never more chunks than plan_chunks");
            let mut next = offset;
            for c in &chunks {
                prop_assert_eq!(c.offset_blocks, next);
                // A zero-block transfer is one empty chunk, as in plan_chunks.
                prop_assert!(c.num_blocks >= 1 || blocks == 0);
                next += c.num_blocks;
            }
            prop_assert_eq!(next, offset + blocks);
            if n < near {
                // Fewer than plan_chunks: equal chunks, within the stretch and `largest`.
                let len = chunks[0].num_blocks;
                prop_assert!(chunks.iter().all(|c| c.num_blocks == len));
                let cap = (chunk * EVEN_CHUNK_STRETCH_MILLI / 1000).min(largest.max(chunk));
                prop_assert!(len * bs <= cap.max(bs));
            }
        }
    }

    #[test]
    fn one_mib_in_chunks_of_85k_becomes_eight_of_128k() {
        let near: Vec<_> = plan_chunks(0, 256, 4096, 92 * 1024).collect();
        assert_eq!(near.len(), 12, "plan_chunks: 12 chunks of 21-22 blocks");
        let even: Vec<_> = plan_even_chunks(0, 256, 4096, 92 * 1024, 128 * 1024).collect();
        assert_eq!(even.len(), 8);
        assert!(even.iter().all(|c| c.num_blocks == 32));
        // 44 KiB stretches to 64 KiB (16 chunks, not 24); 40 KiB does not (26 stay).
        assert_eq!(
            plan_even_chunks(0, 256, 4096, 44 * 1024, 128 * 1024).count(),
            16
        );
        assert_eq!(
            plan_even_chunks(0, 256, 4096, 40 * 1024, 128 * 1024).count(),
            26
        );
        // Never above `largest` (nor stretched when the chunk is already above it).
        assert_eq!(
            plan_even_chunks(0, 256, 4096, 100 * 1024, 96 * 1024).count(),
            11
        );
        // A count that divides already is kept; a transfer that fits is one chunk.
        assert_eq!(
            plan_even_chunks(0, 256, 4096, 64 * 1024, 128 * 1024).count(),
            16
        );
        assert_eq!(
            plan_even_chunks(7, 8, 4096, 64 * 1024, 128 * 1024).count(),
            1
        );
    }

    #[test]
    fn one_mib_becomes_sixteen_chunks_of_64k() {
        let c: Vec<_> = plan_chunks(0, 256, 4096, 64 * 1024).collect();
        assert_eq!(c.len(), 16);
        assert!(c.iter().all(|c| c.num_blocks == 16));
        let c: Vec<_> = plan_chunks(10, 8, 4096, 64 * 1024).collect();
        assert_eq!(
            c,
            vec![Chunk {
                offset_blocks: 10,
                num_blocks: 8
            }]
        );
    }

    #[test]
    fn bucket_waits_exactly_for_its_rate() {
        let t0 = Nanos::from_secs(1);
        let mut b = TokenBucket::new(1_000_000, 1000, t0);
        assert_eq!(b.ready_at(1000, t0), t0);
        b.take(1000);
        assert_eq!(
            b.ready_at(500, t0),
            t0.saturating_add(Nanos::from_micros(500))
        );
        let mut m = MultiBucket::new(1_000, 10, 1_000, 1, t0);
        assert!(m.try_take(100, 1, t0).is_ok());
        // Bytes are there but the single operation token is spent: 100 ms per op.
        assert_eq!(
            m.try_take(100, 1, t0),
            Err(t0.saturating_add(Nanos::from_millis(100)))
        );
    }

    fn pacer(now: Nanos) -> Pacer {
        Pacer::new(
            PacerConfig {
                link_mibps: 1000,
                ..PacerConfig::default()
            },
            now,
        )
        .unwrap()
    }

    #[test]
    fn congestion_halves_the_allowed_rate_down_to_the_sharing_floor() {
        let mut t = Nanos::from_secs(1);
        let mut p = pacer(t);
        let link = 1000 * MIB;
        let s = p.open_stream(1, t);
        p.note_latency_sensitive(t);
        t = congest(&mut p, t, Nanos::from_millis(5), 10);
        // One large stream and latency-sensitive traffic: the floor is half the link.
        assert_eq!(p.allowed_rate(), link / 2);
        assert!(p.stream_rate(s).unwrap() >= link / 2);
        // Latency back under target: additive increase.
        p.on_probe(Nanos::from_micros(10), t);
        t = t.saturating_add(Nanos::from_millis(1));
        p.tick(t);
        assert_eq!(p.allowed_rate(), link / 2 + link / 50);
    }

    /// The initiator's hang of 2026-11-30 (CI, `pacing_protects_a_small_reader_...`): late
    /// signals while no stream was open cut the virtual stream to a few bytes a second;
    /// once the small I/O had gone (no sharing floor) but before DIRS reset, a stream
    /// started there and its refusal said "hours"; AIMD lifted its rate a millisecond
    /// later, but the channel slept until the refusal's time. The version tells it to
    /// ask again.
    #[test]
    fn a_refusal_holds_only_until_the_rates_change() {
        let mut t = Nanos::from_secs(1);
        let mut p = pacer(t);
        let link = 1000 * MIB;
        t = congest(&mut p, t, Nanos::from_millis(5), 80);
        // A late probe's signal just before the small I/O's idle time ends.
        t = t.saturating_add(Nanos::from_millis(99));
        p.dirs.on_late_signal(t);
        t = t.saturating_add(Nanos::from_millis(2));
        p.tick(t);
        assert!(!p.latency_sensitive_now(t));
        assert!(
            p.dirs().virtual_rate() < link >> 20,
            "{}",
            p.dirs().virtual_rate()
        );
        let s = p.open_stream(1, t);
        assert!(
            p.try_send(s, 128 * 1024, t).is_ok(),
            "a new bucket holds one chunk"
        );
        let refused_until = p.try_send(s, 128 * 1024, t).unwrap_err();
        assert!(refused_until > t.saturating_add(Nanos::from_secs(1)));
        let before = p.rates_version();
        t = t.saturating_add(Nanos::from_millis(1));
        p.tick(t);
        assert_ne!(p.rates_version(), before, "AIMD lifted the stream");
        let wait = match p.try_send(s, 128 * 1024, t) {
            Ok(()) => Nanos(0),
            Err(at) => at.saturating_sub(t),
        };
        assert!(wait < Nanos::from_millis(10), "{wait:?}");
        // Nothing changes once the rates are at the link: the version stays.
        t = t.saturating_add(Nanos::from_millis(200));
        for _ in 0..60 {
            t = t.saturating_add(Nanos::from_millis(1));
            p.tick(t);
        }
        let settled = p.rates_version();
        t = t.saturating_add(Nanos::from_millis(1));
        p.tick(t);
        assert_eq!(p.rates_version(), settled);
    }

    /// `rounds` AIMD intervals with latency-sensitive traffic and a probe of `probe`
    /// before each; returns the time after them.
    fn congest(p: &mut Pacer, mut t: Nanos, probe: Nanos, rounds: usize) -> Nanos {
        for _ in 0..rounds {
            p.note_latency_sensitive(t);
            p.on_probe(probe, t);
            t = t.saturating_add(Nanos::from_millis(1));
            p.note_latency_sensitive(t);
            p.tick(t);
        }
        t
    }

    /// The rate the buckets of `flow`'s transfers release chunks at, together.
    fn flow_pace(p: &Pacer, flow: u64) -> u64 {
        p.streams
            .iter()
            .flatten()
            .filter(|s| s.flow == flow)
            .map(|s| s.bucket.rate())
            .sum()
    }

    #[test]
    fn chunks_released_late_still_go_at_the_allowed_rate() {
        let mut t = Nanos::from_secs(1);
        let mut p = pacer(t);
        let chunk = p.config().chunk_bytes;
        let s = p.open_stream(1, t);
        let rate = p.allowed_rate();
        let chunk_time = chunk * 1_000_000_000 / rate;
        let start = t;
        let mut sent = 0u64;
        // The sender gets to every other chunk 40 % of a chunk time after it was due.
        for k in 0.. {
            match p.try_send(s, chunk, t) {
                Ok(()) => sent += chunk,
                Err(at) => t = at,
            }
            if k % 2 == 1 {
                t = t.saturating_add(Nanos(chunk_time * 2 / 5));
            }
            if t.saturating_sub(start) >= Nanos::from_secs(1) {
                break;
            }
        }
        let got = sent as f64 / t.saturating_sub(start).as_secs_f64();
        assert!(got >= 0.98 * rate as f64, "{got:.0} B/s of {rate}");
        assert!(got <= 1.01 * rate as f64, "{got:.0} B/s of {rate}");
        // The credit is for lateness only: after a pause with nothing to send (its last
        // request was served: a refused one is a sender that waits, and late), one chunk
        // goes at once and the next waits its time.
        while let Err(at) = p.try_send(s, chunk, t) {
            t = at;
        }
        t = t.saturating_add(Nanos::from_secs(1));
        assert!(p.try_send(s, chunk, t).is_ok());
        assert!(p.try_send(s, chunk, t).is_err());
    }

    /// One writer held at its floor beside a reader for `secs`. Its sender is ready for
    /// the next chunk at once, except after every fourth, when it pauses `gap_pct` % of
    /// a chunk time (a queue-depth-bound writer sends when a command completes, and its
    /// completions come in bursts). Returns what it sent per second over the last
    /// second, the floor, and the pacer.
    fn bursty_writer_at_its_floor(gap_pct: u64, secs: u64, boost_max: u64) -> (f64, u64, Pacer) {
        let mut t = Nanos::from_secs(1);
        let mut p = pacer(t);
        p.cfg.floor_boost_max_milli = boost_max;
        let s = p.open_stream(1, t);
        let floor = p.link / 2;
        // The chunk the pacer picks for this path once the reader is about.
        p.note_latency_sensitive(t);
        p.on_probe(Nanos::from_millis(5), t);
        let chunk = p.chunk_bytes(t);
        let chunk_time = chunk * 1_000_000_000 / floor;
        let end = Nanos::from_secs(1 + secs);
        let last = end.saturating_sub(Nanos::from_secs(1));
        let (mut sent_last, mut k) = (0u64, 0u64);
        while t < end {
            // The reader's probes stay above the target: AIMD holds the floor.
            p.note_latency_sensitive(t);
            p.on_probe(Nanos::from_millis(5), t);
            p.tick(t);
            assert_eq!(p.chunk_bytes(t), chunk);
            match p.try_send(s, chunk, t) {
                Ok(()) => {
                    if t >= last {
                        sent_last += chunk;
                    }
                    k += 1;
                    if k % 4 == 0 {
                        t = t.saturating_add(Nanos(chunk_time * gap_pct / 100));
                    }
                }
                Err(at) => t = at.min(t.saturating_add(Nanos::from_micros(100))),
            }
        }
        (sent_last as f64, floor, p)
    }

    /// A writer held at its floor beside a reader for 2 s, with the floor's correction
    /// off. After a refusal its sender asks again `late_pct` % of a chunk time after the
    /// pacer said; after every fourth chunk it has nothing to send for `idle_pct` % of a
    /// chunk time (its commands are on the path) and does not ask. Up to 100 %, the
    /// lateness is at every other refusal only. Returns what it sent
    /// (bytes) over the whole run, U over the run, and the held delivery.
    fn held_writer(late_pct: u64, idle_pct: u64) -> (u64, u64, HeldDelivery) {
        let mut t = Nanos::from_secs(1);
        let mut p = pacer(t);
        p.cfg.floor_boost_max_milli = 1000;
        let s = p.open_stream(1, t);
        p.note_latency_sensitive(t);
        p.on_probe(Nanos::from_millis(5), t);
        let chunk = p.chunk_bytes(t);
        let chunk_time = chunk * 1_000_000_000 / (p.link / 2);
        let (start, end) = (t, Nanos::from_secs(3));
        let (u0, h0) = (p.allowed_bytes_total(t), p.held_delivery(t));
        let (mut sent, mut k, mut refusals) = (0u64, 0u64, 0u64);
        while t < end {
            p.note_latency_sensitive(t);
            p.on_probe(Nanos::from_millis(5), t);
            p.tick(t);
            match p.try_send(s, chunk, t) {
                Ok(()) => {
                    sent += chunk;
                    k += 1;
                    if k % 4 == 0 {
                        t = t.saturating_add(Nanos(chunk_time * idle_pct / 100));
                    }
                }
                Err(at) => {
                    // Late by `late_pct` at every other refusal (a reactor's lateness
                    // varies), or at every one with `late_pct` above 100.
                    refusals += 1;
                    let late = if late_pct > 100 || refusals % 2 == 0 {
                        late_pct
                    } else {
                        0
                    };
                    let at = at.saturating_add(Nanos(chunk_time * late / 100));
                    t = at.min(t.saturating_add(Nanos::from_micros(100)).max(at));
                }
            }
        }
        assert!(t >= start);
        let h = p.held_delivery(t);
        let d = HeldDelivery {
            held_ns: h.held_ns - h0.held_ns,
            allowed_bytes: h.allowed_bytes - h0.allowed_bytes,
            stream_allowed_bytes: h.stream_allowed_bytes - h0.stream_allowed_bytes,
            sent_bytes: h.sent_bytes - h0.sent_bytes,
            charged_bytes: h.charged_bytes - h0.charged_bytes,
        };
        (sent, p.allowed_bytes_total(t) - u0, d)
    }

    #[test]
    fn held_delivery_is_what_a_held_writer_sent_against_what_it_was_allowed() {
        let ratio = |d: &HeldDelivery| d.charged_bytes as f64 / d.allowed_bytes.max(1) as f64;
        // Prompt and always backlogged: held all the time, and it gets U.
        let (sent, u, d) = held_writer(0, 0);
        println!(
            "prompt: held {} ms, {:.3} of U held, {:.3} over the run",
            d.held_ns / 1_000_000,
            ratio(&d),
            sent as f64 / u as f64
        );
        assert!(d.held_ns >= 1_900_000_000, "{d:?}");
        assert!((0.97..=1.02).contains(&ratio(&d)), "{d:?}");
        assert_eq!(
            d.sent_bytes, d.charged_bytes,
            "chunks of the bucket's depth"
        );
        // One stream at the floor: its own rate is U.
        assert!(
            d.stream_allowed_bytes.abs_diff(d.allowed_bytes) * 100 <= d.allowed_bytes,
            "{d:?}"
        );
        // With gaps in which it has nothing to send (the path holds it), the whole run's
        // rate against U's mean is low, but while held it got U: the gaps are not held.
        let (sent, u, d) = held_writer(0, 400);
        let whole = sent as f64 / u as f64;
        println!(
            "idle gaps: held {} ms, {:.3} of U held, {whole:.3} over the run",
            d.held_ns / 1_000_000,
            ratio(&d)
        );
        assert!(whole < 0.85, "{whole:.3}");
        assert!(d.held_ns < 1_500_000_000, "{d:?}");
        assert!((0.97..=1.02).contains(&ratio(&d)), "{d:?}");
        // A sender that comes late to tokens it was told of loses what the lateness
        // credit (one chunk) does not cover: here two chunk times a refusal.
        // Most of a chunk time late at every other refusal, within the credit: it loses
        // nothing, and the tokens a hold leaves for the next are counted once.
        let (_, _, d) = held_writer(80, 0);
        println!("late within the credit: {:.3} of U held", ratio(&d));
        assert!((0.97..=1.02).contains(&ratio(&d)), "{d:?}");
        let (_, _, d) = held_writer(200, 0);
        println!(
            "late: held {} ms, {:.3} of U held",
            d.held_ns / 1_000_000,
            ratio(&d)
        );
        assert!(d.held_ns >= 1_900_000_000, "{d:?}");
        assert!(ratio(&d) < 0.75, "{d:?}");
    }

    #[test]
    fn a_stream_the_pacer_never_refused_was_never_held() {
        let t = Nanos::from_secs(1);
        let mut p = pacer(t);
        let s = p.open_stream(1, t);
        let chunk = p.config().chunk_bytes;
        let every = Nanos(chunk * 1_000_000_000 / p.allowed_rate() * 2);
        let mut now = t;
        for _ in 0..100 {
            assert!(p.try_send(s, chunk, now).is_ok());
            now = now.saturating_add(every);
        }
        assert_eq!(p.held_delivery(now), HeldDelivery::default());
        // No reader about: U is the link, and its integral is the link times the time.
        let total = p.allowed_bytes_total(now);
        let want = mul_div(p.link, now.saturating_sub(t).0, 1_000_000_000);
        assert!(total.abs_diff(want) <= 1, "{total} {want}");
        p.close_stream(s, now);
    }

    #[test]
    fn a_writer_that_sends_in_bursts_gets_closer_to_its_sharing_floor() {
        // A pause of 1.5 chunk times after every fourth chunk (nobody asked meanwhile, so
        // no lateness credit accrues): 4 chunks in 4.5 chunk times, 0.89 of the floor.
        let (plain, floor, p) = bursty_writer_at_its_floor(150, 3, 1000);
        assert_eq!(p.floor_boost_milli(), 1000, "off");
        let (got, _, p) = bursty_writer_at_its_floor(150, 3, 1125);
        let boost = p.floor_boost_milli();
        println!(
            "bursty writer: {:.3} of its floor without the correction, {:.3} with (boost {boost})",
            plain / floor as f64,
            got / floor as f64
        );
        assert!(plain < 0.9 * floor as f64, "{plain:.0} of {floor}");
        assert!(boost > 1100 && boost <= 1125, "{boost}");
        assert!(
            got > 1.05 * plain && got <= 1.01 * floor as f64,
            "{got:.0} of {floor}"
        );
        // A pause it can make up for in full: 1.3 chunk times after every fourth (0.93 of
        // the floor uncorrected, like the real target's writer: 0.92-0.98).
        let (plain, _, _) = bursty_writer_at_its_floor(130, 3, 1000);
        let (got, _, p) = bursty_writer_at_its_floor(130, 3, 1125);
        println!(
            "small pauses: {:.3} without, {:.3} with (boost {})",
            plain / floor as f64,
            got / floor as f64,
            p.floor_boost_milli()
        );
        assert!(plain < 0.95 * floor as f64, "{plain:.0}");
        assert!(
            got >= 0.98 * floor as f64 && got <= 1.02 * floor as f64,
            "{got:.0}"
        );
        // A writer that keeps up needs no correction.
        let (got, _, p) = bursty_writer_at_its_floor(0, 2, 1125);
        assert!(got >= 0.99 * floor as f64, "{got:.0} of {floor}");
        assert!(p.floor_boost_milli() <= 1010, "{}", p.floor_boost_milli());
    }

    #[test]
    fn a_flow_keeps_its_floor_while_its_transfers_come_and_go() {
        let mut t = Nanos::from_secs(1);
        let mut p = pacer(t);
        let link = 1000 * MIB;
        // A writer with four transfers in flight and a latency-sensitive reader.
        let ids: Vec<StreamId> = (0..4).map(|_| p.open_stream(7, t)).collect();
        t = congest(&mut p, t, Nanos::from_millis(5), 10);
        assert_eq!(p.allowed_rate(), link / 2);
        assert!(flow_pace(&p, 7) >= link / 2 - 4);
        // One transfer ends before the application sends the next: the other three
        // still carry the flow's floor (halved per-transfer rates left them at a
        // quarter of it each, three quarters together).
        p.close_stream(ids[0], t);
        assert!(
            flow_pace(&p, 7) >= link / 2 - 3,
            "{} of {}",
            flow_pace(&p, 7),
            link / 2
        );
        // A new transfer starts at the DIRS rate and the flow is at its floor again.
        p.open_stream(7, t);
        assert!(flow_pace(&p, 7) >= link / 2 - 4);
    }

    #[test]
    fn the_automatic_target_follows_the_probes_base_latency() {
        let mut t = Nanos::from_secs(1);
        // (The target alone: no chunk floor from the base latency, which raises it.)
        let cfg = PacerConfig {
            link_mibps: 1000,
            probe_window: 4,
            latency_target_auto_milli: 1500,
            chunk_floor_base_milli: 0,
            ..PacerConfig::default()
        };
        let mut p = Pacer::new(cfg, t).unwrap();
        let link = 1000 * MIB;
        // No probe yet: the fixed target (the ceiling); a failed probe (an error that
        // may never have reached the target) sets no base either.
        assert_eq!(p.latency_target(), cfg.latency_target);
        p.on_failed_probe(Nanos::from_micros(2), t);
        assert_eq!(p.base_latency(), None);
        assert_eq!(p.latency_target(), cfg.latency_target);
        p.open_stream(1, t);
        p.note_latency_sensitive(t);
        // A 20 us path: the target is 30 us; 40 us probes are congestion, though far
        // under the fixed 200 us.
        p.on_probe(Nanos::from_micros(20), t);
        assert_eq!(p.base_latency(), Some(Nanos::from_micros(20)));
        assert_eq!(p.latency_target(), Nanos::from_micros(30));
        t = congest(&mut p, t, Nanos::from_micros(40), 4);
        assert_eq!(
            p.allowed_rate(),
            link / 2,
            "halved down to the sharing floor"
        );
        // The same probes under a fixed target of 200 us: additive increase.
        let mut fixed = Pacer::new(
            PacerConfig {
                latency_target_auto_milli: 0,
                ..cfg
            },
            t,
        )
        .unwrap();
        fixed.open_stream(1, t);
        fixed.note_latency_sensitive(t);
        fixed.on_probe(Nanos::from_micros(40), t);
        fixed.tick(t.saturating_add(Nanos::from_millis(1)));
        assert_eq!(fixed.allowed_rate(), link);
        // The path becomes slower for good: within two windows the base follows it.
        for _ in 0..8 {
            p.on_probe(Nanos::from_micros(100), t);
        }
        assert_eq!(p.base_latency(), Some(Nanos::from_micros(100)));
        assert_eq!(p.latency_target(), Nanos::from_micros(150));
        // Never above the fixed target.
        for _ in 0..8 {
            p.on_probe(Nanos::from_millis(1), t);
        }
        assert_eq!(p.latency_target(), cfg.latency_target);
        // Factors under 1 (a target below the path's own latency) are refused.
        for bad in [1, 999, 100_001] {
            assert_eq!(
                PacerConfig {
                    latency_target_auto_milli: bad,
                    ..cfg
                }
                .validate(),
                Err(PacerConfigError::AutoTarget(bad))
            );
        }
    }

    #[test]
    fn large_transfers_are_split_only_while_latency_sensitive_traffic_is_about() {
        let t = Nanos::from_secs(1);
        let mut p = pacer(t);
        let idle = p.config().latency_idle;
        // A writer alone: nothing to protect, the transfer goes whole.
        assert!(!p.should_split(MIB, t));
        // A small command was sent: from then on large transfers are chunked and paced...
        p.note_latency_sensitive(t);
        let chunk = p.chunk_bytes(t);
        assert!(p.should_split(MIB, t));
        assert!(p.should_split(chunk + 1, t.saturating_add(Nanos(idle.0 - 1))));
        // ...but never one that fits in a chunk...
        assert!(!p.should_split(chunk, t));
        // ...until the small traffic has been gone for `latency_idle`.
        assert!(!p.should_split(MIB, t.saturating_add(idle)));
        assert!(!latency_sensitive_at(None, t, idle));
        assert!(latency_sensitive_at(Some(t), t, idle));
        // Unless told to split always (traffic on the link this pacer does not see).
        let always = Pacer::new(
            PacerConfig {
                split_always: true,
                ..*p.config()
            },
            t,
        )
        .unwrap();
        let whole = always.config().chunk_bytes;
        assert!(always.should_split(MIB, t) && !always.should_split(whole, t));
    }

    #[test]
    fn no_latency_sensitive_traffic_means_the_whole_link() {
        let t = Nanos::from_secs(1);
        let mut p = pacer(t);
        p.tick(t.saturating_add(Nanos::from_millis(2)));
        assert_eq!(p.allowed_rate(), 1000 * MIB);
        assert!(!p.tick(t.saturating_add(Nanos::from_millis(3))).send_probe);
    }

    #[test]
    fn new_stream_starts_at_the_lowest_active_rate() {
        let mut t = Nanos::from_secs(1);
        let mut p = pacer(t);
        let a = p.open_stream(1, t);
        p.note_latency_sensitive(t);
        p.on_probe(Nanos::from_millis(1), t);
        t = t.saturating_add(Nanos::from_millis(1));
        p.tick(t);
        let ra = p.stream_rate(a).unwrap();
        assert!(ra < 1000 * MIB);
        let b = p.open_stream(1, t);
        assert_eq!(p.stream_rate(b), Some(ra));
    }

    #[test]
    fn late_signal_lowers_the_virtual_stream_then_it_recovers_and_resets() {
        let mut t = Nanos::from_secs(1);
        let mut p = pacer(t);
        let link = 1000 * MIB;
        p.note_latency_sensitive(t);
        p.on_probe(Nanos::from_millis(1), t);
        t = t.saturating_add(Nanos::from_millis(1));
        p.tick(t); // no active stream: a late signal
        assert_eq!(p.dirs().virtual_rate(), link / 2);
        let s = p.open_stream(1, t);
        assert_eq!(p.stream_rate(s), Some(link / 2));
        p.close_stream(s, t);
        // A second late signal within Delta is discarded.
        p.dirs.on_late_signal(t);
        assert_eq!(p.dirs().virtual_rate(), link / 2);
        p.tick(t.saturating_add(Nanos::from_millis(11)));
        assert_eq!(p.dirs().virtual_rate(), link / 2 + link / 50);
        p.tick(t.saturating_add(Nanos::from_millis(101)));
        assert_eq!(p.dirs().virtual_rate(), link);
    }

    #[test]
    fn the_sharing_floor_counts_flows_not_transfers() {
        let mut t = Nanos::from_secs(1);
        let mut p = pacer(t);
        let link = 1000 * MIB;
        // One writer flow with eight transfers in flight, against a latency-sensitive
        // reader: the writer's floor is half the link, not 8/9 of it.
        let streams: Vec<_> = (0..8).map(|_| p.open_stream(7, t)).collect();
        assert_eq!(p.active_flows(), 1);
        t = congest(&mut p, t, Nanos::from_millis(5), 10);
        assert_eq!(p.allowed_rate(), link / 2);
        for s in streams {
            p.close_stream(s, t);
        }
        assert_eq!(p.active_flows(), 0);
    }

    #[test]
    fn stale_stream_ids_are_ignored() {
        let t = Nanos::from_secs(1);
        let mut p = pacer(t);
        let a = p.open_stream(1, t);
        p.close_stream(a, t);
        let b = p.open_stream(1, t);
        assert_eq!(p.stream_rate(a), None);
        assert!(p.stream_rate(b).is_some());
        p.close_stream(a, t);
        assert_eq!(p.active_streams(), 1);
    }

    #[test]
    fn chunks_are_paced_at_the_stream_share() {
        let t0 = Nanos::from_secs(1);
        let mut p = Pacer::new(
            PacerConfig {
                link_mibps: 64,
                chunk_bytes: 64 * 1024,
                ..Default::default()
            },
            t0,
        )
        .unwrap();
        let s = p.open_stream(1, t0);
        assert!(p.try_send(s, 64 * 1024, t0).is_ok());
        let next = p.try_send(s, 64 * 1024, t0).unwrap_err();
        // 64 KiB at 64 MiB/s: about 976 us.
        assert!((900_000..1_100_000).contains(&(next.0 - t0.0)), "{next}");
    }

    #[test]
    fn the_chunk_is_the_slack_times_the_link() {
        let mib = MIB;
        // NVMe/TCP loopback: base 30 us, target 1.5x = 45 us, link 4500 MiB/s: 15 us of
        // the link is 70,778 bytes, 69,632 in 4 KiB grains.
        let tcp = chunk_for_slack(
            Nanos::from_micros(45),
            Nanos::from_micros(30),
            4500 * mib,
            4096,
            256 * 1024,
        );
        assert_eq!(tcp, 69_632);
        // 25 Gb/s RDMA: base 5 us, target 7.5 us, 2980 MiB/s: 2.5 us is 7.8 KB.
        let rdma = chunk_for_slack(
            Nanos(7500),
            Nanos::from_micros(5),
            2980 * mib,
            4096,
            256 * 1024,
        );
        assert_eq!(rdma, 4096);
        // No slack (the target at or below the base): the floor; a wide one: the ceiling.
        let at = |t: u64, b: u64| {
            chunk_for_slack(
                Nanos::from_micros(t),
                Nanos::from_micros(b),
                4500 * mib,
                8192,
                131_072,
            )
        };
        assert_eq!(at(30, 30), 8192);
        assert_eq!(at(20, 30), 8192);
        assert_eq!(at(1000, 30), 131_072);
    }

    #[test]
    fn the_default_target_is_fixed_and_the_chunk_the_largest_on_a_fast_path() {
        // 2026-11-29's path: base 12.5 us, 2500 MiB/s. The fixed 200 us leaves 187.5 us
        // of slack: the largest chunk, 128 KiB.
        let mut t = Nanos::from_secs(1);
        let cfg = PacerConfig {
            link_mibps: 2500,
            ..PacerConfig::default()
        };
        assert_eq!(cfg.latency_target_auto_milli, 0);
        let mut p = Pacer::new(cfg, t).unwrap();
        p.note_latency_sensitive(t);
        t = congest(&mut p, t, Nanos(12_500), 2);
        assert_eq!(p.latency_target(), Nanos::from_micros(200));
        assert_eq!(p.chunk_bytes(t), 128 * 1024);
    }

    #[test]
    fn the_chunk_follows_the_path_only_while_small_commands_share_it() {
        let mut t = Nanos::from_secs(1);
        // (The slack alone: no chunk floor from the base latency.)
        let cfg = PacerConfig {
            link_mibps: 4500,
            link_iops: 150_000,
            latency_target_auto_milli: 1500,
            chunk_floor_base_milli: 0,
            ..PacerConfig::default()
        };
        let mut p = Pacer::new(cfg, t).unwrap();
        // Alone, large transfers go in the largest chunk (and are not split at all
        // unless split_always).
        assert_eq!(p.chunk_bytes(t), 128 * 1024);
        // A reader appears: before a probe measured the path, 32 KiB.
        p.note_latency_sensitive(t);
        assert_eq!(p.chunk_bytes(t), CHUNK_BEFORE_PROBE);
        // Probes of 30 us: target 45 us, slack 15 us of 4500 MiB/s.
        t = congest(&mut p, t, Nanos::from_micros(30), 3);
        assert_eq!(p.latency_target(), Nanos::from_micros(45));
        assert_eq!(p.chunk_bytes(t), 69_632);
        assert!(p.should_split(69_632 + 4096, t) && !p.should_split(69_632, t));
        // A slower path (base 50 us for two probe windows) takes larger chunks: 25 us.
        for _ in 0..2 * cfg.probe_window {
            p.on_probe(Nanos::from_micros(50), t);
        }
        assert_eq!(p.chunk_bytes(t), 114_688);
        // ...up to the ceiling.
        for _ in 0..2 * cfg.probe_window {
            p.on_probe(Nanos::from_micros(90), t);
        }
        assert_eq!(p.chunk_bytes(t), 128 * 1024);
        // The reader leaves: the largest chunk again.
        t = t.saturating_add(cfg.latency_idle);
        assert_eq!(p.chunk_bytes(t), 128 * 1024);
        // chunk_auto off: the chunk is chunk_bytes whatever the path.
        let mut fixed = Pacer::new(
            PacerConfig {
                chunk_auto: false,
                chunk_bytes: 32 * 1024,
                ..cfg
            },
            t,
        )
        .unwrap();
        fixed.note_latency_sensitive(t);
        congest(&mut fixed, t, Nanos::from_micros(30), 3);
        assert_eq!(fixed.chunk_bytes(t), 32 * 1024);
    }

    #[test]
    fn the_chunk_never_goes_below_the_links_bytes_per_operation() {
        // 4500 MiB/s at 150,000 operations per second: 31,457 bytes per operation, so
        // chunks of 32 KiB at least (a smaller chunk could not fill the link).
        let cfg = PacerConfig {
            link_mibps: 4500,
            link_iops: 150_000,
            latency_target_auto_milli: 1500,
            ..PacerConfig::default()
        };
        assert_eq!(cfg.chunk_floor(), 32 * 1024);
        let mut t = Nanos::from_secs(1);
        let mut p = Pacer::new(cfg, t).unwrap();
        p.note_latency_sensitive(t);
        t = congest(&mut p, t, Nanos::from_micros(2), 3);
        assert_eq!(p.chunk_bytes(t), 32 * 1024);
    }

    #[test]
    fn the_chunk_floor_follows_the_base_latency() {
        let mib = MIB;
        // 2026-11-29's path: base 12.5 us, link 2500 MiB/s. Two base latencies of the
        // link are 65,536 bytes: 64 KiB, where the slack alone (1.5 x base) gave 16 KiB.
        assert_eq!(
            chunk_floor_for_base(Nanos(12_500), 2500 * mib, 2000),
            64 * 1024
        );
        // Rounded up to 4 KiB; 0 thousandths: no floor.
        assert_eq!(chunk_floor_for_base(Nanos(1000), 1000 * mib, 1000), 4096);
        assert_eq!(chunk_floor_for_base(Nanos(12_500), 2500 * mib, 0), 0);
        // The target leaves room for one such chunk: base + 25 us = 37.5 us, not 1.5 x
        // 12.5 = 18.75 us.
        let ceiling = Nanos::from_micros(200);
        let t = target_for_path(Nanos(12_500), 1500, 64 * 1024, 2500 * mib, ceiling);
        assert_eq!(t, Nanos(37_500));
        // A slow path (base 100 us): 1.5 x base is more than base + the chunk.
        let t = target_for_path(Nanos::from_micros(100), 1500, 8192, 2500 * mib, ceiling);
        assert_eq!(t, Nanos::from_micros(150));
        // Never above the fixed target.
        let t = target_for_path(Nanos::from_micros(150), 1500, 8192, 2500 * mib, ceiling);
        assert_eq!(t, ceiling);

        let mut t = Nanos::from_secs(1);
        let cfg = PacerConfig {
            link_mibps: 2500,
            probe_window: 4,
            latency_target_auto_milli: 1500,
            ..PacerConfig::default()
        };
        assert_eq!(cfg.chunk_floor_base_milli, 2000);
        let mut p = Pacer::new(cfg, t).unwrap();
        p.note_latency_sensitive(t);
        // Before a probe: the link's bytes per operation and 32 KiB, as before.
        assert_eq!(p.chunk_floor(), cfg.chunk_floor());
        assert_eq!(p.chunk_bytes(t), CHUNK_BEFORE_PROBE);
        t = congest(&mut p, t, Nanos(12_500), 2);
        assert_eq!(p.chunk_floor(), 64 * 1024);
        assert_eq!(p.latency_target(), Nanos(37_500));
        assert_eq!(p.chunk_bytes(t), 64 * 1024);
        // Probes behind one such chunk (36 us) are not congestion; behind two they are.
        let link = 2500 * MIB;
        let s = p.open_stream(1, t);
        let _ = s;
        p.note_latency_sensitive(t);
        let before = p.aimd_counts();
        t = congest(&mut p, t, Nanos::from_micros(36), 3);
        assert_eq!(p.aimd_counts().congested, before.congested);
        assert_eq!(p.allowed_rate(), link);
        congest(&mut p, t, Nanos::from_micros(60), 1);
        assert_eq!(p.aimd_counts().congested, before.congested + 1);
        // A path of 60 us: the floor reaches the largest chunk.
        let mut q = Pacer::new(cfg, t).unwrap();
        q.note_latency_sensitive(t);
        let t = congest(&mut q, t, Nanos::from_micros(60), 2);
        assert_eq!(q.chunk_bytes(t), cfg.chunk_bytes);
        assert_eq!(q.chunk_floor(), cfg.chunk_bytes);
        // chunk_auto off: the fixed chunk, and the target is 1.5 x base.
        let mut f = Pacer::new(
            PacerConfig {
                chunk_auto: false,
                chunk_bytes: 16 * 1024,
                ..cfg
            },
            t,
        )
        .unwrap();
        f.note_latency_sensitive(t);
        let t = congest(&mut f, t, Nanos(12_500), 2);
        assert_eq!(f.chunk_bytes(t), 16 * 1024);
        assert_eq!(f.latency_target(), Nanos(18_750));
        // Out of range is refused.
        for bad in [1, 99, 100_001] {
            assert_eq!(
                PacerConfig {
                    chunk_floor_base_milli: bad,
                    ..cfg
                }
                .validate(),
                Err(PacerConfigError::ChunkFloorBase(bad))
            );
        }
    }

    #[test]
    fn a_due_probe_goes_with_the_small_traffic() {
        let (idle, interval) = (Nanos::from_millis(100), Nanos::from_micros(500));
        let due = Nanos::from_secs(1);
        let at = |us: u64| due.saturating_add(Nanos::from_micros(us));
        // The reader's connection sent small I/O 10 us ago: it probes at once.
        assert!(may_send_probe(Some(at(0)), due, at(10), idle, interval));
        // The writer's connection never did: not before the probe waited 1 ms...
        assert!(!may_send_probe(None, due, at(10), idle, interval));
        assert!(!may_send_probe(None, due, at(999), idle, interval));
        assert!(may_send_probe(None, due, at(1000), idle, interval));
        // ...nor with small I/O older than the idle time.
        let old = Some(due.saturating_sub(idle));
        assert!(!may_send_probe(old, due, at(0), idle, interval));
    }

    proptest! {
        /// The chunk the base latency asks for fits in the slack the target leaves:
        /// whatever the path, the automatic chunk is at least the floor, and a small
        /// command behind one floor chunk is within the target (unless the fixed
        /// ceiling binds).
        #[test]
        fn the_target_leaves_room_for_the_chunk_floor(
            base_ns in 1000u64..500_000, auto in 1000u64..5000, link_mibps in 100u64..20_000,
            floor_milli in prop_oneof![Just(0u64), 100u64..10_000], ceiling_kib in 4u64..2048,
        ) {
            let cfg = PacerConfig {
                chunk_bytes: ceiling_kib * 1024,
                link_mibps,
                latency_target_auto_milli: auto,
                chunk_floor_base_milli: floor_milli,
                ..PacerConfig::default()
            };
            let mut t = Nanos::from_secs(1);
            let mut p = Pacer::new(cfg, t).unwrap();
            p.note_latency_sensitive(t);
            t = congest(&mut p, t, Nanos(base_ns), 2);
            let floor = p.chunk_floor();
            let c = p.chunk_bytes(t);
            prop_assert!(floor >= cfg.chunk_floor() && floor <= cfg.chunk_bytes);
            prop_assert!(c >= floor && c <= cfg.chunk_bytes, "{c} {floor}");
            let link = link_mibps * MIB;
            let want = chunk_floor_for_base(Nanos(base_ns), link, floor_milli);
            prop_assert_eq!(floor, cfg.chunk_floor().max(want.min(cfg.chunk_bytes)));
            let target = p.latency_target();
            prop_assert!(target <= cfg.latency_target);
            let behind = Nanos(base_ns).saturating_add(Nanos(mul_div(floor, 1_000_000_000, link)));
            prop_assert!(target >= behind.min(cfg.latency_target), "{target} {behind}");
            prop_assert!(target.0 >= mul_div(base_ns, auto, 1000).min(cfg.latency_target.0));
        }

        /// Whatever the path, the chunk is within the floor and the ceiling, and the
        /// buckets hold one chunk: a stream released after a long pause sends one chunk
        /// and waits for the next (two while it was late).
        #[test]
        fn the_chunk_stays_within_its_bounds(
            base_us in 1u64..2000, auto in 1000u64..5000, link_mibps in 100u64..20_000,
            link_kiops in 10u64..2000, ceiling_kib in 4u64..2048,
        ) {
            let cfg = PacerConfig {
                chunk_bytes: ceiling_kib * 1024,
                link_mibps,
                link_iops: link_kiops * 1000,
                latency_target_auto_milli: auto,
                ..PacerConfig::default()
            };
            let mut t = Nanos::from_secs(1);
            let mut p = Pacer::new(cfg, t).unwrap();
            p.note_latency_sensitive(t);
            t = congest(&mut p, t, Nanos::from_micros(base_us), 2);
            let c = p.chunk_bytes(t);
            prop_assert!(c >= cfg.chunk_floor() && c <= cfg.chunk_bytes, "{c}");
            prop_assert!(c % 4096 == 0 || c == cfg.chunk_bytes);
            let s = p.open_stream(1, t);
            t = t.saturating_add(Nanos::from_secs(1));
            p.note_latency_sensitive(t);
            prop_assert!(p.try_send(s, c, t).is_ok());
            prop_assert!(p.try_send(s, c, t).is_err());
        }
    }

    #[test]
    fn bad_config_is_refused() {
        assert!(matches!(
            Pacer::new(
                PacerConfig {
                    chunk_bytes: 100,
                    ..Default::default()
                },
                Nanos::ZERO
            ),
            Err(PacerConfigError::ChunkSize(100))
        ));
        assert!(
            Pacer::new(
                PacerConfig {
                    link_iops: 0,
                    ..Default::default()
                },
                Nanos::ZERO
            )
            .is_err()
        );
    }
}
