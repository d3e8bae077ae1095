//! nvmf-qos core: the QoS algorithms shared by the SPDK target plugin, the initiator
//! plugin and the lab. Sans-IO: no clock, no threads, no randomness of its own; time
//! ([`Nanos`]) and seeds are arguments and functions return deadlines instead of sleeping.
//!
//! - [`burst`]: burst credits, a bucket that lets a host or group exceed its limit.
//! - [`config`]: domain and host settings, validated into per-period budgets.
//! - [`admission`]: Haechi's aggregate and local capacity constraints.
//! - [`depth`]: the target's depth curve learned online, and the operating point on it.
//! - [`ledger`]: the lock-free token ledger the target's poll-group threads share, and
//!   the per-I/O admission decision ([`ChannelTokens::try_admit`]).
//! - [`monitor`]: conversion, sharing of the excess (a policy), tenant groups, roll-over,
//!   soft grants, capacity estimation, statistics.
//! - [`cluster`]: one host's reservation and limit divided over a cluster of targets.
//! - [`share`]: weighted max-min sharing (water-filling).
//! - [`hold`]: the FIFO of I/O waiting for tokens.
//! - [`channel`]: a host's channel at the target (tokens, held I/O, release cadence),
//!   driven alike by the target plugin and the lab.
//! - [`histogram`]: the time I/O spent held, in fixed buckets (statistics).
//! - [`initiator`]: the cooperative initiator's token engine.
//! - [`pacer`]: Justitia's chunking and multi-resource pacing, AIMD, and DIRS.
//! - [`wire`]: the vendor-command protocol between the two plugins.
#![forbid(unsafe_code)]

pub mod admission;
pub mod burst;
pub mod channel;
pub mod cluster;
pub mod config;
pub mod cost;
pub mod depth;
pub mod entitlement;
pub mod estimator;
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
    BurstStats, DomainStats, EstimatorRecord, GroupStats, HostStats, Monitor, PeriodRecord,
    PeriodReport, Tick,
};
pub use time::Nanos;
pub use window::{HostWindow, WindowShared};
