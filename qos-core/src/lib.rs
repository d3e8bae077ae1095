//! nvmf-qos core: the QoS algorithms shared by the SPDK target plugin, the initiator
//! plugin and the lab. Sans-IO: no clock, no threads, no randomness of its own; time
//! ([`Nanos`]) and seeds are arguments and functions return deadlines instead of sleeping.
//!
//! # Modules, by role
//!
//! **The core's calling protocol** (what a target, the plugin or the lab, drives):
//! - [`config`]: domain, group and host settings, validated into per-period budgets.
//! - [`monitor`]: one domain's monitor: hosts and groups in and out, the check interval
//!   and the period roll-over ([`Monitor::tick`]), conversion, sharing of the excess (a
//!   policy), soft grants, capacity estimation, statistics ([`Monitor::stats`]).
//! - [`channel`]: a host's channel at the target on one thread (tokens, held I/O,
//!   release cadence), driven alike by the target plugin and the lab.
//! - [`hold`]: the FIFO of I/O waiting for tokens.
//! - [`time`]: time as a value ([`Nanos`]), deadlines, and the integer arithmetic on it.
//!
//! **Policies** (what is due to whom, decided by the monitor or at admission):
//! - [`admission`]: Haechi's aggregate and local capacity constraints.
//! - [`cost`]: what an I/O costs, in operations and bytes (the cost model).
//! - [`share`]: weighted max-min sharing (water-filling).
//! - [`entitlement`]: what each host is entitled to at the operating point.
//! - [`burst`]: burst credits, a bucket that lets a host or group exceed its limit.
//! - [`estimator`]: the adaptive capacity estimate (Haechi's Algorithm 1).
//! - [`depth`]: the target's depth curve learned online, and the operating point on it.
//! - [`circulation`]: N\*, the hosts' circulation for an efficiency, learned by toggling.
//! - [`cluster`]: one host's reservation and limit divided over a cluster of targets.
//!
//! **The I/O path's shared state** (lock-free, written by the poll-group threads and the
//! monitor; each struct's docs say who writes, who reads, and the memory ordering):
//! - [`ledger`]: the token ledger ([`DomainShared`], [`HostShared`]) and the per-I/O
//!   admission decision ([`ChannelTokens::try_admit`]).
//! - [`window`]: the window of commands in flight of sharing `operating_point`, and the
//!   dispatch of its freed slots ([`window::dispatch`]).
//! - [`sync`]: the atomics under both (loom's under `--cfg loom`), the period-tagged
//!   token pool and the sequence lock.
//!
//! **The initiator's side**:
//! - [`initiator`]: the cooperative initiator's token engine.
//! - [`pacer`]: Justitia's chunking and multi-resource pacing, AIMD, and DIRS.
//! - [`wire`]: the vendor-command protocol between the two plugins.
//! - [`allowance`]: shares held at the initiator: the in-flight allowance a target
//!   sends a cooperative host and the circulation the host reports.
//!
//! **Measurement**:
//! - [`histogram`]: the time I/O spent held, in fixed buckets (statistics).
//! - [`latency`]: latency windows for control loops and log-linear histograms for
//!   reports.
//!
//! # The calling protocol
//!
//! A domain's [`Monitor`] owns the shared state; each host's channel on each I/O
//! thread admits or holds commands against it, and the monitor's thread calls
//! [`Monitor::tick`] by the deadline it returns (check intervals and the period
//! roll-over happen there). A host reserved and limited to 10 IOPS, 10 commands in the
//! default period of 1 s:
//!
//! ```
//! use qos_core::{
//!     DomainConfig, HostConfig, IoKind, Monitor, Nanos, Rate, ReservationRelease,
//!     TargetChannel,
//! };
//!
//! let t0 = Nanos::from_secs(1);
//! let cfg = DomainConfig {
//!     release: ReservationRelease::Start, // a period's tokens all out at its start
//!     ..DomainConfig::default()
//! };
//! let mut monitor = Monitor::new(cfg, t0)?;
//! let host = HostConfig::new("nqn.2014-08.org.example:h1")
//!     .with_reservation(Rate::iops(10))
//!     .with_limit(Rate::iops(10));
//! monitor.add_host(host, t0)?;
//!
//! // One channel of the host on one I/O thread; `u32` stands for the caller's I/O.
//! let tokens = monitor.channel("nqn.2014-08.org.example:h1").expect("added");
//! let mut channel = TargetChannel::new(tokens);
//! let mut sent = Vec::new();
//! for io in 0..15u32 {
//!     // Admitted: the caller sends it on. Held: the channel keeps it.
//!     if let Some(io) = channel.admit(IoKind::Read, 4096, t0, io) {
//!         sent.push(io);
//!     }
//! }
//! assert_eq!((sent.len(), channel.held()), (10, 5), "the limit holds five");
//! channel.record_completion(IoKind::Read, 4096, Nanos::from_micros(100));
//!
//! // The monitor's thread ticks at the deadlines it asks for; the channel's poller
//! // releases what the tokens allow and publishes its counters.
//! let mut now = t0;
//! let report = loop {
//!     let tick = monitor.tick(now);
//!     channel.poll(now, |io| sent.push(io));
//!     if let Some(report) = tick.ended {
//!         break report;
//!     }
//!     now = tick.next_deadline;
//! };
//! assert_eq!(report.start, t0, "the first period ended");
//! channel.poll(now, |io| sent.push(io));
//! assert_eq!(sent.len(), 15, "the next period released the other five");
//!
//! let stats = monitor.stats(now);
//! assert_eq!(stats.hosts[0].held_time.count(), 15);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![forbid(unsafe_code)]
#![warn(clippy::too_many_lines)]

pub mod admission;
pub mod allowance;
pub mod burst;
pub mod channel;
pub mod circulation;
pub mod cluster;
pub mod config;
pub mod cost;
pub mod depth;
pub mod entitlement;
pub mod estimator;
pub mod handover;
pub mod histogram;
pub mod hold;
pub mod initiator;
pub mod latency;
pub mod ledger;
pub mod monitor;
pub mod pacer;
pub mod share;
pub mod sync;
pub mod time;
pub mod window;
pub mod wire;

pub use admission::{
    AdmissionError, AdmissionReport, Violation, check_admission, check_grouped_admission,
};
pub use channel::TargetChannel;
pub use config::{
    BatchSize, BudgetClass, Capacity, ConfigError, DomainConfig, EstimatorConfig, ExcessSharing,
    GroupBudgets, GroupConfig, HostBudgets, HostConfig, PriorityClass, Rate, RateSet,
    ReservationRelease, TokenMode,
};
pub use cost::{Amount, CostModel, Direction, IoKind, Resource};
pub use estimator::CapacityEstimator;
pub use hold::HoldQueue;
pub use ledger::{
    Admission, ChannelTokens, DomainShared, HoldCounts, HoldReason, HostShared, PeriodState,
};
pub use monitor::{
    BurstStats, CirculationStats, DomainStats, EstimatorRecord, GroupStats, HostStats, Monitor,
    PeriodRecord, PeriodReport, Tick,
};
pub use time::Nanos;
pub use window::{HostWindow, WindowShared};
