//! Configuration of a QoS domain (one target's capacity shared by its hosts) and of each
//! host, with validation. Validation turns user-facing rates (IOPS, MiB/s, per second)
//! into per-period budgets in cost units ([`crate::Amount`]); every refusal is a typed
//! error that names the field, the value and the bound.

use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::cost::{Amount, CostModel, Direction, Resource, WEIGHT_ONE};
use crate::time::{Nanos, mul_div};

pub const MIB: u64 = 1 << 20;
/// NVMe limits an NQN to 223 bytes.
pub const MAX_NQN_LEN: usize = 223;
pub const MIN_PERIOD: Nanos = Nanos::from_millis(10);
pub const MAX_PERIOD: Nanos = Nanos::from_secs(60);
pub const MIN_CHECK_INTERVAL: Nanos = Nanos::from_micros(10);
pub const MAX_WEIGHT: u32 = 1000;

/// A rate in IOPS and MiB/s, each optional. Budgets that name neither leave that
/// resource unconstrained (for a limit) or unguaranteed (for a reservation).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Rate {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub iops: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mibps: Option<u64>,
}

impl Rate {
    pub const NONE: Rate = Rate {
        iops: None,
        mibps: None,
    };
    pub const fn iops(iops: u64) -> Self {
        Rate {
            iops: Some(iops),
            mibps: None,
        }
    }
    pub const fn mibps(mibps: u64) -> Self {
        Rate {
            iops: None,
            mibps: Some(mibps),
        }
    }
    pub const fn iops_opt(iops: Option<u64>) -> Self {
        Rate { iops, mibps: None }
    }
    pub fn is_none(&self) -> bool {
        self.iops.is_none() && self.mibps.is_none()
    }
    pub(crate) fn get(&self, r: Resource) -> Option<u64> {
        match r {
            Resource::Ops => self.iops,
            Resource::Bytes => self.mibps,
        }
    }
    /// Per-second amount in cost units (bytes for MiB/s).
    fn per_second(&self, r: Resource) -> Option<u64> {
        self.get(r).map(|v| {
            if r == Resource::Bytes {
                v.saturating_mul(MIB)
            } else {
                v
            }
        })
    }
}

/// A budget for reads and writes together (`total`) and/or apart (`read`, `write`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RateSet {
    #[serde(skip_serializing_if = "Rate::is_none")]
    pub total: Rate,
    #[serde(skip_serializing_if = "Rate::is_none")]
    pub read: Rate,
    #[serde(skip_serializing_if = "Rate::is_none")]
    pub write: Rate,
}

impl RateSet {
    pub const NONE: RateSet = RateSet {
        total: Rate::NONE,
        read: Rate::NONE,
        write: Rate::NONE,
    };
    pub const fn total(rate: Rate) -> Self {
        RateSet {
            total: rate,
            read: Rate::NONE,
            write: Rate::NONE,
        }
    }
    pub fn is_none(&self) -> bool {
        self.total.is_none() && self.read.is_none() && self.write.is_none()
    }
    fn class(&self, c: BudgetClass) -> &Rate {
        match c {
            BudgetClass::Total => &self.total,
            BudgetClass::Read => &self.read,
            BudgetClass::Write => &self.write,
        }
    }
}

/// Which I/O a budget counts: all of it, or one direction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BudgetClass {
    Total = 0,
    Read = 1,
    Write = 2,
}

impl BudgetClass {
    pub const ALL: [BudgetClass; 3] = [BudgetClass::Total, BudgetClass::Read, BudgetClass::Write];
    pub const fn of(d: Direction) -> BudgetClass {
        match d {
            Direction::Read => BudgetClass::Read,
            Direction::Write => BudgetClass::Write,
        }
    }
    pub const fn name(self) -> &'static str {
        match self {
            BudgetClass::Total => "total",
            BudgetClass::Read => "read",
            BudgetClass::Write => "write",
        }
    }
}

/// Priority classes for soft guarantees (seed 002): when capacity beyond the hard
/// reservations is scarce, soft reservations of a higher class are granted first.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum PriorityClass {
    Low,
    #[default]
    Medium,
    High,
    Urgent,
}

/// Estimated capacity of the target.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Capacity {
    /// Profiled saturated throughput C_G in IOPS (Haechi's Omega_prof), a starting
    /// hint for the estimator. `None`: learned from the target (issue 26): the first
    /// period with load runs without a budget for the excess, what it served is the
    /// first estimate, and the start-up search takes it from there
    /// ([`crate::estimator`]); reservations are then admitted without a domain-level
    /// check until the estimate is known (`qos_stats_get` flags them when they do not
    /// fit it). Needs the estimator.
    pub iops: Option<u64>,
    /// Standard deviation of the profiled IOPS; the estimator never goes below
    /// `iops - 3 * iops_stddev`.
    pub iops_stddev: u64,
    /// Profiled bandwidth in MiB/s; `None` leaves bytes unconstrained at the target.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mibps: Option<u64>,
    pub mibps_stddev: u64,
}

impl Default for Capacity {
    fn default() -> Self {
        Capacity {
            iops: Some(1_570_000),
            iops_stddev: 0,
            mibps: None,
            mibps_stddev: 0,
        }
    }
}

/// How many global tokens one acquisition takes (Haechi's batch B).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "mode")]
pub enum BatchSize {
    /// `capacity per period / 1024`, clamped to 1..=1000 operations (Haechi's 1000 at
    /// its 1.57 M IOPS), and to 4 KiB..=256 MiB for bytes. Small periods and small
    /// capacities then get small batches, so few tokens sit in caches.
    #[default]
    Auto,
    Fixed {
        ops: u64,
        bytes: u64,
    },
}

/// Haechi's Algorithm 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EstimatorConfig {
    pub enabled: bool,
    /// Increment eta added to the estimate when a period used all its tokens, in
    /// thousandths of the profiled capacity. Default 10 (1%).
    pub increment_milli: u64,
    /// History window M (periods). Default 4: after a capacity drop the estimate
    /// follows within about M periods (with 8, the host with the largest reservation
    /// of Haechi's Set 4 took 8-14 periods to meet it again, over 5 seeds).
    pub history: usize,
    /// A period counts as "all tokens used" when completed work is within this many
    /// thousandths of the estimate. Default 5 (0.5%): batches cached at the end of a
    /// period make exact equality rare.
    pub saturation_tolerance_milli: u64,
    /// Periods in a row a host may use less than its reservation before it is flagged
    /// (and loses soft grants). Default 3.
    pub underuse_periods: u32,
    /// After a probe (a raised estimate) that was not used while a host missed its
    /// reservation, the periods to wait before the next probe double, up to this many.
    /// Default 2 (4 slowed the climb after Set 4's capacity rise by 5 periods); 0 probes
    /// whenever a period is saturated, as Algorithm 1 does.
    pub probe_backoff_max: u32,
    /// A period in which reservations starved and which served this many thousandths
    /// less than the estimate restarts the estimator's window at what it served (a
    /// sudden capacity drop). Default 50 (5 %); 0 averages it like any period.
    pub drop_threshold_milli: u64,
    /// With weighted sharing: a period in which the hosts claimed every slice they were
    /// offered ([`crate::estimator::Evidence::Backlogged`]) and used all but this many
    /// thousandths of the estimate counts as saturated (a probe follows), and a probe
    /// that falls that short goes back to the estimate before it, instead of being
    /// averaged in (slices a host bound by its queue depth cannot use make such
    /// periods fall a little short, and averaging them walked the estimate down).
    /// Default 0 (off): the higher estimate keeps more commands at the target, and a
    /// host bound by its queue depth then gets less than its weighted share (on the
    /// real target 31-34 % of the excess for a weight of 40 %, against 38 % without;
    /// docs/benchmarks.md). 30 (3 %) trades that for about four points of throughput.
    pub hold_milli: u64,
    /// Start-up search (ours, BBR's start-up): from the first period until one does not
    /// use its estimate, a used estimate doubles instead of growing by eta, and the first
    /// doubling not used restarts the window at what the target served. A hint 5x too
    /// low is then left in three periods instead of a hundred and sixty. Default on.
    pub startup: bool,
}

impl Default for EstimatorConfig {
    fn default() -> Self {
        EstimatorConfig {
            enabled: true,
            increment_milli: 10,
            history: 4,
            saturation_tolerance_milli: 5,
            underuse_periods: 3,
            probe_backoff_max: 2,
            drop_threshold_milli: 50,
            hold_milli: 0,
            startup: true,
        }
    }
}

/// Token conversion on or off.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TokenMode {
    /// Haechi: unused reservation is converted into global tokens at each check interval.
    #[default]
    Haechi,
    /// "Basic Haechi": no conversion, unused reservation is wasted. For comparison.
    Basic,
}

/// When a period's reservation tokens become usable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReservationRelease {
    /// Haechi: all of R_i at the start of the period.
    Start,
    /// Reservation released in proportion to the time elapsed, plus a burst: by time t
    /// a host may have used `R_i (t + burst) / T` of it. And while a backlogged host
    /// lags behind that schedule (it is not being served at its reservation rate),
    /// the global pool closes, so global-token users cannot take its share of the
    /// target. Nobody spends the period's capacity early at everyone else's expense,
    /// so a large reservation is met even when its host could not make it up alone at
    /// the end of the period (Haechi's local constraint, Example 2).
    #[default]
    Paced,
}

/// How the capacity nobody reserved is shared among the hosts that want it.
///
/// The default is still `FirstCome`: weighted sharing meets its targets in the lab, but
/// on a real `nvmf_tgt` at about 390 K IOPS it cost a third of the throughput when a
/// reservation was out of reach of its host's queue depth (docs/benchmarks.md), so it is
/// opt-in until that is fixed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ExcessSharing {
    /// Weighted max-min: at every check interval the monitor splits the released part
    /// of the global pool among the backlogged hosts (and tenant groups) in proportion
    /// to weight, into each host's own credit; hosts never take from the global pool
    /// directly. What a host gets does not depend on how many commands it keeps
    /// outstanding. Tenant groups need it.
    Weighted,
    /// Haechi as published: any host takes global tokens in batches, first come first
    /// served, so hosts with deeper queues get more (`weight` scales the batch).
    #[default]
    FirstCome,
    /// Admission by concurrency (issue 26): first come's tokens, and excess admitted
    /// only while the domain's commands in flight at the base are below `Q*` of the
    /// learned depth curve (unbounded until it is known), in weighted start-time order
    /// among the hosts it holds; reserved work never waits for it. No tenant groups.
    OperatingPoint,
}

/// Everything about one QoS domain except its hosts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DomainConfig {
    /// QoS period T. Default 1 s; 10 ms ..= 60 s.
    pub period: Nanos,
    /// Monitor check interval. Default 1 ms; 10 us ..= period / 4.
    pub check_interval: Nanos,
    pub capacity: Capacity,
    /// Most one host can do alone (Haechi's C_L); `None` entries mean "the target's".
    pub per_host_max: Rate,
    pub global_batch: BatchSize,
    pub estimator: EstimatorConfig,
    pub mode: TokenMode,
    pub release: ReservationRelease,
    /// With paced release, how far ahead of the release schedule hosts may run.
    /// `None` (default): one check interval. Larger bursts let every host spend a
    /// slice of its reservation at once, and at the end of a period, when every
    /// schedule is complete, they compete with a host that is catching up.
    /// At most the period.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub release_burst: Option<Nanos>,
    pub cost: CostModel,
    /// How unreserved capacity is shared. Default first come (see [`ExcessSharing`]).
    pub sharing: ExcessSharing,
    /// Efficiency η of the operating point, in thousandths (1 ..= 1000; default 970):
    /// the target runs at the fewest commands in flight that give η of the most its
    /// depth curve shows ([`crate::depth`]).
    pub efficiency_milli: u64,
    /// The operating point by its depth instead of η: Q\*, commands in flight at the base
    /// in thousandths (the deepest point of the curve not above it). At most one of this
    /// and `operating_latency`; either replaces η.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub operating_in_flight_milli: Option<u64>,
    /// The operating point by its latency instead of η: L\*, a command's time at the
    /// base (the deepest point of the curve whose latency is not above it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub operating_latency: Option<Nanos>,
    /// η over the hosts' circulation (issue 39 item 1): the operating point is N\*,
    /// commands circulating outside QoS, learned online as the fewest that keep what the
    /// target completes at η of what it completes holding nothing
    /// ([`crate::circulation`]), rather than Q\* at the base. With
    /// `operating_in_flight_milli` (N\* given) it changes nothing; with
    /// `operating_latency` it is refused.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub operating_over_circulation: bool,
    /// Hold nothing: channels count and account as usual, and a command the contract
    /// would hold goes at once (an operator's switch in an incident, and the "A" of
    /// the side-by-side instrument). Changing only this does not start a new period.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub bypass: bool,
}

/// Default [`DomainConfig::efficiency_milli`].
pub const DEFAULT_EFFICIENCY_MILLI: u64 = 970;

/// The unit tests' domain: `iops` of capacity, global tokens one operation at a time,
/// no estimator, the given release and sharing.
#[cfg(test)]
pub(crate) fn test_domain(
    iops: u64,
    release: ReservationRelease,
    sharing: ExcessSharing,
) -> DomainConfig {
    DomainConfig {
        capacity: Capacity {
            iops: Some(iops),
            ..Capacity::default()
        },
        global_batch: BatchSize::Fixed {
            ops: 1,
            bytes: 1 << 40,
        },
        estimator: EstimatorConfig {
            enabled: false,
            ..Default::default()
        },
        release,
        sharing,
        ..DomainConfig::default()
    }
}

impl Default for DomainConfig {
    fn default() -> Self {
        DomainConfig {
            period: Nanos::from_secs(1),
            check_interval: Nanos::from_millis(1),
            capacity: Capacity::default(),
            per_host_max: Rate::NONE,
            global_batch: BatchSize::Auto,
            estimator: EstimatorConfig::default(),
            mode: TokenMode::Haechi,
            release: ReservationRelease::Paced,
            release_burst: None,
            cost: CostModel::default(),
            sharing: ExcessSharing::FirstCome,
            efficiency_milli: DEFAULT_EFFICIENCY_MILLI,
            operating_in_flight_milli: None,
            operating_latency: None,
            operating_over_circulation: false,
            bypass: false,
        }
    }
}

/// One host (identified by host NQN) of a domain.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostConfig {
    pub host_nqn: String,
    /// Guaranteed minimum per period (hard guarantee). Reads and writes together
    /// (`total`) or apart (`read` and `write`), not both.
    #[serde(default, skip_serializing_if = "RateSet::is_none")]
    pub reservation: RateSet,
    /// Maximum per period, for any combination of total, read and write.
    #[serde(default, skip_serializing_if = "RateSet::is_none")]
    pub limit: RateSet,
    /// Share of the unreserved pool relative to other hosts. 1 ..= 1000, default 1.
    #[serde(default = "default_weight")]
    pub weight: u32,
    #[serde(default)]
    pub priority: PriorityClass,
    /// Soft guarantee (seed 002): served from unreserved capacity, by priority class,
    /// when the host keeps using it. Total only; at least the hard reservation.
    #[serde(default, skip_serializing_if = "Rate::is_none")]
    pub soft_reservation: Rate,
    /// Tenant group the host belongs to (at most one); `None`: the host stands alone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// Burst above the total limit on credit earned under it (issue 28).
    #[serde(default, skip_serializing_if = "Burst::is_none")]
    pub burst: Burst,
}

/// A tenant group: hosts with an aggregate reservation, limit and weight (the hierarchy
/// is domain -> group -> host). The group's reservation is guaranteed to its hosts
/// together: each keeps its own reservation, and the rest of the group's (`reservation`
/// minus the sum of theirs) goes to its backlogged hosts by their weights. Its share of
/// the unreserved capacity (by `weight` among groups and lone hosts) is split among its
/// backlogged hosts by their weights, and `limit` caps them together. Totals only
/// (reads and writes together).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GroupConfig {
    pub name: String,
    #[serde(default, skip_serializing_if = "Rate::is_none")]
    pub reservation: Rate,
    #[serde(default, skip_serializing_if = "Rate::is_none")]
    pub limit: Rate,
    /// Share of the unreserved pool relative to other groups and lone hosts. 1 ..= 1000.
    #[serde(default = "default_weight")]
    pub weight: u32,
    /// Burst above the limit on credit the group earned under it (issue 28).
    #[serde(default, skip_serializing_if = "Burst::is_none")]
    pub burst: Burst,
}

/// A group's validated budgets, per period, in cost units.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GroupBudgets {
    pub reservation: Amount,
    /// `u64::MAX` per resource where no limit is set.
    pub limit: Amount,
    pub weight: u32,
    pub burst: BurstBudget,
}

/// Most bytes of a group name (it is a label in metrics and a key in RPCs).
pub const MAX_GROUP_NAME_LEN: usize = 64;

impl GroupConfig {
    pub fn new(name: impl Into<String>) -> Self {
        GroupConfig {
            name: name.into(),
            reservation: Rate::NONE,
            limit: Rate::NONE,
            weight: 1,
            burst: Burst::NONE,
        }
    }

    /// Validates the group against its domain and returns its per-period budgets.
    pub fn budgets(&self, domain: &DomainConfig) -> Result<GroupBudgets, ConfigError> {
        let group = || self.name.clone();
        if self.name.is_empty()
            || self.name.len() > MAX_GROUP_NAME_LEN
            || !self
                .name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.:".contains(&b))
        {
            return Err(ConfigError::GroupName(self.name.clone()));
        }
        if self.weight == 0 || self.weight > MAX_WEIGHT {
            return Err(ConfigError::GroupWeight {
                group: group(),
                weight: self.weight,
            });
        }
        let mut reservation = Amount::ZERO;
        let mut limit = Amount::new(UNLIMITED, UNLIMITED);
        for r in Resource::ALL {
            for (what, rate) in [("reservation", &self.reservation), ("limit", &self.limit)] {
                if rate.get(r) == Some(0) {
                    return Err(ConfigError::ZeroRate {
                        what: format!("group {}: {what} {}", group(), unit(r)),
                    });
                }
            }
            if domain.capacity.mibps.is_none() && self.reservation.mibps.is_some() {
                return Err(ConfigError::BandwidthWithoutCapacity {
                    host: format!("group {}", group()),
                    what: "reservation",
                });
            }
            if let (Some(res), Some(l)) = (self.reservation.get(r), self.limit.get(r))
                && res > l
            {
                return Err(ConfigError::GroupReservationAboveLimit {
                    group: group(),
                    reservation: res,
                    limit: l,
                    unit: unit(r),
                });
            }
            let what = |w: &str| format!("group {} {w}", group());
            if let Some(v) = domain.per_period_of(&self.reservation, r, || what("reservation"))? {
                reservation.set(r, v);
            }
            if let Some(v) = domain.per_period_of(&self.limit, r, || what("limit"))? {
                limit.set(r, v);
            }
        }
        let burst = self
            .burst
            .budget(&format!("group {}", self.name), &self.limit, domain)?;
        Ok(GroupBudgets {
            reservation,
            limit,
            weight: self.weight,
            burst,
        })
    }
}

fn default_weight() -> u32 {
    1
}

impl HostConfig {
    pub fn new(host_nqn: impl Into<String>) -> Self {
        HostConfig {
            host_nqn: host_nqn.into(),
            reservation: RateSet::NONE,
            limit: RateSet::NONE,
            weight: 1,
            priority: PriorityClass::Medium,
            soft_reservation: Rate::NONE,
            group: None,
            burst: Burst::NONE,
        }
    }
    pub fn with_reservation(mut self, r: Rate) -> Self {
        self.reservation = RateSet::total(r);
        self
    }
    pub fn with_limit(mut self, l: Rate) -> Self {
        self.limit = RateSet::total(l);
        self
    }
}

/// A refused domain or host setting.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ConfigError {
    #[error("QoS period {got} is outside {min} ..= {max}")]
    Period { got: Nanos, min: Nanos, max: Nanos },
    #[error("check interval {got} must be between {min} and a quarter of the period ({max})")]
    CheckInterval { got: Nanos, min: Nanos, max: Nanos },
    #[error(
        "target capacity must be at least 1 IOPS (got {0}); profile the target and give its saturated IOPS"
    )]
    ZeroCapacity(u64),
    #[error(
        "a domain without a capacity learns it with the capacity estimator; turn the estimator on or give the target's capacity (IOPS)"
    )]
    NothingToLearnWith,
    #[error(
        "capacity standard deviation {stddev} {unit} is larger than the capacity {capacity} {unit}"
    )]
    Stddev {
        stddev: u64,
        capacity: u64,
        unit: &'static str,
    },
    #[error("{what} must be at least 1 when given (got 0); omit it instead to leave it unset")]
    ZeroRate { what: String },
    #[error(
        "{what} of {given} {unit} is less than one command per QoS period of {period}; give at least {min} {unit} or lengthen the domain's period"
    )]
    BelowOnePerPeriod {
        what: String,
        given: u64,
        min: u64,
        unit: &'static str,
        period: Nanos,
    },
    #[error("global batch must be at least 1 operation and 1 byte (got {ops} ops, {bytes} bytes)")]
    Batch { ops: u64, bytes: u64 },
    #[error("estimator history must be 1 ..= 1000 periods (got {0})")]
    History(usize),
    #[error("estimator probe back-off must be 0 ..= 1000 periods (got {0})")]
    ProbeBackoff(u32),
    #[error(
        "estimator drop threshold must be 0 (off) ..= 1000 thousandths of the estimate (got {0})"
    )]
    DropThreshold(u64),
    #[error("estimator hold band must be 0 (off) ..= 500 thousandths of the estimate (got {0})")]
    HoldBand(u64),
    #[error("write weight {0}/1000 is outside 1 ..= 100000")]
    WriteWeight(u64),
    #[error("size unit {0} bytes must be 0 (off) or at least 512")]
    SizeUnit(u64),
    #[error(
        "efficiency {0} is outside 1 ..= 1000 thousandths of what the target does at most (970 is the default; lower gives shallow queues more of their share at the cost of throughput)"
    )]
    Efficiency(u64),
    #[error(
        "give the operating point by efficiency, by commands in flight or by latency, not by two of them"
    )]
    OperatingPointTwice,
    #[error(
        "the operating point's {0} must be above 0 (in flight: thousandths of a command, at least 1; latency: at least 1 us)"
    )]
    OperatingPointZero(&'static str),
    #[error(
        "an operating point by latency is at the base; over the hosts' circulation give it by efficiency (eta) or by commands (operating_in_flight_milli)"
    )]
    LatencyOverCirculation,
    #[error("release burst {got} must be at most the period {period}")]
    ReleaseBurst { got: Nanos, period: Nanos },
    #[error("host NQN must be 1 ..= {MAX_NQN_LEN} bytes of printable ASCII (got {0:?})")]
    HostNqn(String),
    #[error("host {host}: weight {weight} is outside 1 ..= {MAX_WEIGHT}")]
    Weight { host: String, weight: u32 },
    #[error(
        "host {host}: give the reservation for reads and writes together (total) or apart (read and write), not both"
    )]
    MixedReservation { host: String },
    #[error(
        "host {host}: {class} reservation {reservation} {unit} exceeds its {limit_class} limit {limit} {unit}"
    )]
    ReservationAboveLimit {
        host: String,
        class: &'static str,
        limit_class: &'static str,
        reservation: u64,
        limit: u64,
        unit: &'static str,
    },
    #[error(
        "host {host}: soft reservation {soft} {unit} is below its hard reservation {hard} {unit}"
    )]
    SoftBelowHard {
        host: String,
        soft: u64,
        hard: u64,
        unit: &'static str,
    },
    #[error("host {host}: soft reservation {soft} {unit} exceeds its limit {limit} {unit}")]
    SoftAboveLimit {
        host: String,
        soft: u64,
        limit: u64,
        unit: &'static str,
    },
    #[error(
        "host {host}: a MiB/s {what} needs the target's bandwidth; set the domain capacity mibps first"
    )]
    BandwidthWithoutCapacity { host: String, what: &'static str },
    #[error("host {0} appears twice in the domain")]
    DuplicateHost(String),
    #[error(
        "group name must be 1 ..= {MAX_GROUP_NAME_LEN} bytes of letters, digits and - _ . : (got {0:?})"
    )]
    GroupName(String),
    #[error("group {group}: weight {weight} is outside 1 ..= {MAX_WEIGHT}")]
    GroupWeight { group: String, weight: u32 },
    #[error(
        "group {group}: reservation {reservation} {unit} exceeds its limit {limit} {unit}; lower the reservation or raise the limit"
    )]
    GroupReservationAboveLimit {
        group: String,
        reservation: u64,
        limit: u64,
        unit: &'static str,
    },
    #[error(
        "{who}: a burst of {burst} {unit} needs a limit to burst above; set {field} (the rate it holds to without credit) or drop the burst"
    )]
    BurstWithoutLimit {
        who: String,
        burst: u64,
        unit: &'static str,
        field: &'static str,
    },
    #[error(
        "{who}: burst {burst} {unit} is below its limit {limit} {unit}; give a burst at or above the limit, or lower the limit"
    )]
    BurstBelowLimit {
        who: String,
        burst: u64,
        limit: u64,
        unit: &'static str,
    },
    #[error(
        "{who}: a burst bucket of {got} s is outside {min} ..= 86400 s (at least one QoS period of {period}, at most a day); give burst_seconds in that range"
    )]
    BurstSeconds {
        who: String,
        got: u64,
        min: u64,
        period: Nanos,
    },
    #[error(
        "{who}: a burst rate needs burst_seconds, how long a full bucket lasts at that rate (1 ..= 86400)"
    )]
    BurstWithoutSeconds { who: String },
    #[error(
        "{who}: burst_seconds is given without a burst rate; give burst_iops or burst_mibps above the limit, or drop burst_seconds"
    )]
    BurstSecondsAlone { who: String },
}

pub(crate) fn unit(r: Resource) -> &'static str {
    match r {
        Resource::Ops => "IOPS",
        Resource::Bytes => "MiB/s",
    }
}

impl DomainConfig {
    /// Checks every field. Called by [`crate::Monitor::new`] and by the plugins before
    /// they apply a change.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.period < MIN_PERIOD || self.period > MAX_PERIOD {
            return Err(ConfigError::Period {
                got: self.period,
                min: MIN_PERIOD,
                max: MAX_PERIOD,
            });
        }
        let max_check = Nanos(self.period.0 / 4);
        if self.check_interval < MIN_CHECK_INTERVAL || self.check_interval > max_check {
            return Err(ConfigError::CheckInterval {
                got: self.check_interval,
                min: MIN_CHECK_INTERVAL,
                max: max_check,
            });
        }
        self.validate_capacity()?;
        self.validate_knobs()
    }

    fn validate_capacity(&self) -> Result<(), ConfigError> {
        let c = &self.capacity;
        match c.iops {
            Some(0) => return Err(ConfigError::ZeroCapacity(0)),
            Some(iops) if c.iops_stddev > iops => {
                return Err(ConfigError::Stddev {
                    stddev: c.iops_stddev,
                    capacity: iops,
                    unit: "IOPS",
                });
            }
            None if !self.estimator.enabled => return Err(ConfigError::NothingToLearnWith),
            _ => {}
        }
        if let Some(m) = c.mibps {
            if m == 0 {
                return Err(ConfigError::ZeroRate {
                    what: "capacity mibps".into(),
                });
            }
            if c.mibps_stddev > m {
                return Err(ConfigError::Stddev {
                    stddev: c.mibps_stddev,
                    capacity: m,
                    unit: "MiB/s",
                });
            }
        }
        for r in Resource::ALL {
            if self.per_host_max.get(r) == Some(0) {
                return Err(ConfigError::ZeroRate {
                    what: format!("per-host max {}", unit(r)),
                });
            }
        }
        Ok(())
    }

    /// Batches, the estimator's knobs, the cost model and the release burst.
    fn validate_knobs(&self) -> Result<(), ConfigError> {
        if let BatchSize::Fixed { ops, bytes } = self.global_batch
            && (ops == 0 || bytes == 0)
        {
            return Err(ConfigError::Batch { ops, bytes });
        }
        if self.estimator.history == 0 || self.estimator.history > 1000 {
            return Err(ConfigError::History(self.estimator.history));
        }
        if self.estimator.probe_backoff_max > 1000 {
            return Err(ConfigError::ProbeBackoff(self.estimator.probe_backoff_max));
        }
        if self.estimator.hold_milli > 500 {
            return Err(ConfigError::HoldBand(self.estimator.hold_milli));
        }
        if self.estimator.drop_threshold_milli > 1000 {
            return Err(ConfigError::DropThreshold(
                self.estimator.drop_threshold_milli,
            ));
        }
        if self.cost.write_weight_milli == 0 || self.cost.write_weight_milli > 100 * WEIGHT_ONE {
            return Err(ConfigError::WriteWeight(self.cost.write_weight_milli));
        }
        if self.cost.size_unit != 0 && self.cost.size_unit < 512 {
            return Err(ConfigError::SizeUnit(self.cost.size_unit));
        }
        if self.efficiency_milli == 0 || self.efficiency_milli > 1000 {
            return Err(ConfigError::Efficiency(self.efficiency_milli));
        }
        match (self.operating_in_flight_milli, self.operating_latency) {
            (Some(_), Some(_)) => return Err(ConfigError::OperatingPointTwice),
            (Some(0), _) => return Err(ConfigError::OperatingPointZero("in flight")),
            (_, Some(l)) if l == Nanos::ZERO => {
                return Err(ConfigError::OperatingPointZero("latency"));
            }
            (_, Some(_)) if self.operating_over_circulation => {
                return Err(ConfigError::LatencyOverCirculation);
            }
            _ => {}
        }
        if let Some(b) = self.release_burst
            && b > self.period
        {
            return Err(ConfigError::ReleaseBurst {
                got: b,
                period: self.period,
            });
        }
        Ok(())
    }

    /// What defines the operating point on the depth curve: η, or Q\* or L\* when given.
    pub fn operating_target(&self) -> crate::depth::OperatingTarget {
        use crate::depth::OperatingTarget;
        match (self.operating_in_flight_milli, self.operating_latency) {
            (Some(q), _) => OperatingTarget::InFlight(q),
            (_, Some(l)) => OperatingTarget::Latency(l),
            _ if self.operating_over_circulation => {
                OperatingTarget::Circulation(self.efficiency_milli)
            }
            _ => OperatingTarget::Efficiency(self.efficiency_milli),
        }
    }

    /// Turns a per-second amount into a per-period amount.
    pub fn per_period(&self, per_second: u64) -> u64 {
        mul_div(per_second, self.period.0, Nanos::from_secs(1).0)
    }

    /// The per-period amount of a rate a user gave (`rate`'s `r`), refused when it
    /// rounds down to nothing: a limit would have to become one command per period,
    /// more than was asked, and a reservation would silently vanish.
    pub(crate) fn per_period_of(
        &self,
        rate: &Rate,
        r: Resource,
        what: impl FnOnce() -> String,
    ) -> Result<Option<u64>, ConfigError> {
        let (Some(given), Some(per_second)) = (rate.get(r), rate.per_second(r)) else {
            return Ok(None);
        };
        match self.per_period(per_second) {
            0 => Err(ConfigError::BelowOnePerPeriod {
                what: what(),
                given,
                // Bandwidth is given in MiB/s, so only IOPS can fall below one per period.
                min: Nanos::from_secs(1).0.div_ceil(self.period.0.max(1)),
                unit: unit(r),
                period: self.period,
            }),
            v => Ok(Some(v)),
        }
    }

    /// Capacity per period, in cost units; `u64::MAX` operations when the capacity is
    /// learned, and bytes when bandwidth is unset.
    pub fn capacity_per_period(&self) -> Amount {
        Amount::new(
            self.capacity.iops.map_or(u64::MAX, |c| self.per_period(c)),
            self.capacity
                .mibps
                .map_or(u64::MAX, |m| self.per_period(m.saturating_mul(MIB))),
        )
    }

    /// Per-host maximum per period (C_L times T); the target's capacity where unset.
    pub fn per_host_max_per_period(&self) -> Amount {
        let cap = self.capacity_per_period();
        let mut out = cap;
        for r in Resource::ALL {
            if let Some(v) = self.per_host_max.per_second(r) {
                out.set(r, self.per_period(v).min(cap.get(r)));
            }
        }
        out
    }

    /// The paced-release burst in effect.
    pub fn release_burst(&self) -> Nanos {
        self.release_burst.unwrap_or(self.check_interval)
    }

    /// The global batch in cost units.
    pub fn batch(&self) -> Amount {
        match self.global_batch {
            BatchSize::Fixed { ops, bytes } => Amount::new(ops, bytes),
            BatchSize::Auto => {
                let cap = self.capacity_per_period();
                let bytes = if cap.bytes == u64::MAX {
                    64 * MIB
                } else {
                    cap.bytes / 1024
                };
                Amount::new(
                    (cap.ops / 1024).clamp(1, 1000),
                    bytes.clamp(4096, 256 * MIB),
                )
            }
        }
    }
}

/// A host's validated budgets, per period, in cost units.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostBudgets {
    /// Reservation tokens per pool: with `together`, pool 0 serves every direction;
    /// otherwise pool 0 serves reads and pool 1 writes.
    pub reservation: [Amount; 2],
    pub together: bool,
    /// Per-period limit per [`BudgetClass`] and resource; `u64::MAX` is "no limit".
    pub limit: [Amount; 3],
    /// Soft reservation beyond the hard one, per period (total).
    pub soft_extra: Amount,
    pub weight: u32,
    pub priority: PriorityClass,
    /// Burst above the total limit (rate 0 where none).
    pub burst: BurstBudget,
}

pub const UNLIMITED: u64 = u64::MAX;

impl HostBudgets {
    /// Pool serving `dir`.
    #[inline]
    pub const fn pool(&self, dir: Direction) -> usize {
        if self.together { 0 } else { dir as usize }
    }
    /// Hard reservation per period, all pools.
    pub fn reservation_total(&self) -> Amount {
        self.reservation[0].saturating_add(self.reservation[1])
    }
    pub fn is_limited(&self, class: BudgetClass, r: Resource) -> bool {
        self.limit[class as usize].get(r) != UNLIMITED
    }
}

impl HostConfig {
    /// Its NQN and weight.
    fn check_identity(&self) -> Result<(), ConfigError> {
        let host = || self.host_nqn.clone();
        if self.host_nqn.is_empty()
            || self.host_nqn.len() > MAX_NQN_LEN
            || !self.host_nqn.bytes().all(|b| b.is_ascii_graphic())
        {
            return Err(ConfigError::HostNqn(self.host_nqn.clone()));
        }
        if self.weight == 0 || self.weight > MAX_WEIGHT {
            return Err(ConfigError::Weight {
                host: host(),
                weight: self.weight,
            });
        }
        Ok(())
    }

    /// Reservations given either in total or per direction, no zero rates, bandwidth
    /// only where the domain has a bandwidth capacity. Returns whether the reservation
    /// is per direction.
    fn check_rates(&self, domain: &DomainConfig) -> Result<bool, ConfigError> {
        let host = || self.host_nqn.clone();
        let res = &self.reservation;
        let apart = !res.read.is_none() || !res.write.is_none();
        if apart && !res.total.is_none() {
            return Err(ConfigError::MixedReservation { host: host() });
        }
        let no_bw = domain.capacity.mibps.is_none();
        for (what, set) in [("reservation", &self.reservation), ("limit", &self.limit)] {
            for class in BudgetClass::ALL {
                for r in Resource::ALL {
                    if set.class(class).get(r) == Some(0) {
                        return Err(ConfigError::ZeroRate {
                            what: format!("host {}: {} {} {}", host(), class.name(), what, unit(r)),
                        });
                    }
                }
                if what == "reservation" && no_bw && set.class(class).mibps.is_some() {
                    return Err(ConfigError::BandwidthWithoutCapacity { host: host(), what });
                }
            }
        }
        if no_bw && self.soft_reservation.mibps.is_some() {
            return Err(ConfigError::BandwidthWithoutCapacity {
                host: host(),
                what: "soft reservation",
            });
        }
        Ok(apart)
    }

    /// Reservations within limits and soft reservations between the hard one and the
    /// limit, on the user's per-second figures so that messages quote them.
    fn check_per_second(&self, apart: bool) -> Result<(), ConfigError> {
        let host = || self.host_nqn.clone();
        let res = &self.reservation;
        // Checks are made on the user's per-second figures so that messages quote them.
        for r in Resource::ALL {
            let lim = |c: BudgetClass| self.limit.class(c).get(r);
            let check = |class: BudgetClass, value: Option<u64>, limit_class: BudgetClass| match (
                value,
                lim(limit_class),
            ) {
                (Some(v), Some(l)) if v > l => Err(ConfigError::ReservationAboveLimit {
                    host: host(),
                    class: class.name(),
                    limit_class: limit_class.name(),
                    reservation: v,
                    limit: l,
                    unit: unit(r),
                }),
                _ => Ok(()),
            };
            if apart {
                let rd = res.read.get(r);
                let wr = res.write.get(r);
                check(BudgetClass::Read, rd, BudgetClass::Read)?;
                check(BudgetClass::Write, wr, BudgetClass::Write)?;
                let sum = match (rd, wr) {
                    (None, None) => None,
                    (a, b) => Some(a.unwrap_or(0).saturating_add(b.unwrap_or(0))),
                };
                check(BudgetClass::Total, sum, BudgetClass::Total)?;
            } else {
                check(BudgetClass::Total, res.total.get(r), BudgetClass::Total)?;
            }
            let hard = if apart {
                res.read
                    .get(r)
                    .unwrap_or(0)
                    .saturating_add(res.write.get(r).unwrap_or(0))
            } else {
                res.total.get(r).unwrap_or(0)
            };
            if let Some(soft) = self.soft_reservation.get(r) {
                if soft < hard {
                    return Err(ConfigError::SoftBelowHard {
                        host: host(),
                        soft,
                        hard,
                        unit: unit(r),
                    });
                }
                if let Some(l) = lim(BudgetClass::Total)
                    && soft > l
                {
                    return Err(ConfigError::SoftAboveLimit {
                        host: host(),
                        soft,
                        limit: l,
                        unit: unit(r),
                    });
                }
            }
        }
        Ok(())
    }

    /// Validates the host against its domain and returns its per-period budgets.
    pub fn budgets(&self, domain: &DomainConfig) -> Result<HostBudgets, ConfigError> {
        self.check_identity()?;
        let apart = self.check_rates(domain)?;
        self.check_per_second(apart)?;
        let host = || self.host_nqn.clone();
        let res = &self.reservation;
        let amount = |rate: &Rate, what: &str| -> Result<Amount, ConfigError> {
            let mut a = Amount::ZERO;
            for r in Resource::ALL {
                let v = domain.per_period_of(rate, r, || format!("host {} {what}", host()))?;
                a.set(r, v.unwrap_or(0));
            }
            Ok(a)
        };
        let reservation = if apart {
            [
                amount(&res.read, "read reservation")?,
                amount(&res.write, "write reservation")?,
            ]
        } else {
            [amount(&res.total, "reservation")?, Amount::ZERO]
        };
        let mut limit = [Amount::new(UNLIMITED, UNLIMITED); 3];
        for class in BudgetClass::ALL {
            let what = match class {
                BudgetClass::Total => "limit".to_string(),
                c => format!("{} limit", c.name()),
            };
            for r in Resource::ALL {
                let rate = self.limit.class(class);
                if let Some(v) =
                    domain.per_period_of(rate, r, || format!("host {} {what}", host()))?
                {
                    limit[class as usize].set(r, v);
                }
            }
        }
        let hard = reservation[0].saturating_add(reservation[1]);
        let soft_extra = amount(&self.soft_reservation, "soft reservation")?.saturating_sub(hard);
        let burst = self.burst.budget(
            &format!("host {}", self.host_nqn),
            &self.limit.total,
            domain,
        )?;
        Ok(HostBudgets {
            reservation,
            together: !apart,
            limit,
            soft_extra,
            weight: self.weight,
            priority: self.priority,
            burst,
        })
    }
}

// Bursts (the bucket itself is `burst.rs`'s).

/// The largest bucket: a day of burst.
pub const MAX_BURST_SECONDS: u64 = 86_400;

/// A burst above the total limit, as the user gives it: a rate (IOPS and/or MiB/s, each
/// above the limit of the same resource) and the bucket's size in seconds at that rate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Burst {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub iops: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mibps: Option<u64>,
    /// How long a full bucket lasts at the burst rate.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seconds: Option<u64>,
}

/// A validated burst, per period and in cost units. A resource without a burst has a
/// rate of 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct BurstBudget {
    /// The burst rate per period (0 where none).
    pub rate: Amount,
    /// The limit it bursts above, per period (the total limit).
    pub limit: Amount,
    /// The bucket's length: how long a full bucket lasts at the burst rate.
    pub seconds: Nanos,
}

impl Burst {
    pub const NONE: Burst = Burst {
        iops: None,
        mibps: None,
        seconds: None,
    };
    pub fn is_none(&self) -> bool {
        *self == Burst::NONE
    }
    fn rate(&self) -> Rate {
        Rate {
            iops: self.iops,
            mibps: self.mibps,
        }
    }

    /// Validates the burst of `who` (`host NQN` or `group NAME`) above its total
    /// `limit` and returns it per period.
    pub(crate) fn budget(
        &self,
        who: &str,
        limit: &Rate,
        domain: &DomainConfig,
    ) -> Result<BurstBudget, ConfigError> {
        if self.is_none() {
            return Ok(BurstBudget::default());
        }
        let rate = self.rate();
        if rate.is_none() {
            return Err(ConfigError::BurstSecondsAlone { who: who.into() });
        }
        let Some(seconds) = self.seconds else {
            return Err(ConfigError::BurstWithoutSeconds { who: who.into() });
        };
        let min = domain.period.0.div_ceil(Nanos::from_secs(1).0).max(1);
        if seconds < min || seconds > MAX_BURST_SECONDS {
            return Err(ConfigError::BurstSeconds {
                who: who.into(),
                got: seconds,
                min,
                period: domain.period,
            });
        }
        let mut out = BurstBudget {
            seconds: Nanos::from_secs(seconds),
            ..BurstBudget::default()
        };
        for r in Resource::ALL {
            let Some(burst) = rate.get(r) else { continue };
            let Some(l) = limit.get(r) else {
                return Err(ConfigError::BurstWithoutLimit {
                    who: who.into(),
                    burst,
                    unit: unit(r),
                    field: match r {
                        Resource::Ops => "max_iops",
                        Resource::Bytes => "max_mibps",
                    },
                });
            };
            if burst < l {
                return Err(ConfigError::BurstBelowLimit {
                    who: who.into(),
                    burst,
                    limit: l,
                    unit: unit(r),
                });
            }
            let what = || format!("{who} burst");
            let per_period = |v| domain.per_period_of(&rate_of(r, v), r, what);
            out.rate.set(r, per_period(burst)?.unwrap_or(0));
            out.limit.set(
                r,
                domain.per_period_of(&rate_of(r, l), r, what)?.unwrap_or(0),
            );
        }
        Ok(out)
    }
}

fn rate_of(r: Resource, v: u64) -> Rate {
    match r {
        Resource::Ops => Rate::iops(v),
        Resource::Bytes => Rate::mibps(v),
    }
}

impl BurstBudget {
    pub fn is_on(&self, r: Resource) -> bool {
        self.rate.get(r) != 0
    }
    pub fn any(&self) -> bool {
        self.is_on(Resource::Ops) || self.is_on(Resource::Bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn domain() -> DomainConfig {
        DomainConfig {
            capacity: Capacity {
                iops: Some(100_000),
                mibps: Some(1000),
                ..Capacity::default()
            },
            ..DomainConfig::default()
        }
    }

    #[test]
    fn eta_over_the_circulation_is_its_own_target_and_latency_is_refused_there() {
        use crate::depth::OperatingTarget;
        let mut d = domain();
        d.operating_over_circulation = true;
        d.efficiency_milli = 800;
        assert_eq!(d.operating_target(), OperatingTarget::Circulation(800));
        d.validate().unwrap();
        // N* given: the circulation's too, and nothing to learn.
        d.operating_in_flight_milli = Some(40_000);
        assert_eq!(d.operating_target(), OperatingTarget::InFlight(40_000));
        d.validate().unwrap();
        d.operating_in_flight_milli = None;
        d.operating_latency = Some(Nanos::from_micros(200));
        let e = d.validate().unwrap_err();
        assert!(matches!(e, ConfigError::LatencyOverCirculation), "{e}");
        assert!(e.to_string().contains("operating_in_flight_milli"), "{e}");
        d.operating_over_circulation = false;
        d.validate().unwrap();
    }

    #[test]
    fn default_domain_is_valid_and_has_haechi_batch() {
        let d = DomainConfig::default();
        d.validate().unwrap();
        assert_eq!(d.batch().ops, 1000);
    }

    #[test]
    fn batch_scales_with_small_capacity_and_period() {
        let d = DomainConfig {
            period: Nanos::from_millis(10),
            capacity: Capacity {
                iops: Some(50_000),
                ..Capacity::default()
            },
            ..DomainConfig::default()
        };
        d.validate().unwrap();
        assert_eq!(d.capacity_per_period().ops, 500);
        assert_eq!(d.batch().ops, 1);
    }

    #[test]
    fn bad_domain_fields_are_refused_with_the_bound() {
        let d = DomainConfig {
            period: Nanos::from_millis(5),
            ..DomainConfig::default()
        };
        let e = d.validate().unwrap_err();
        assert!(matches!(e, ConfigError::Period { .. }));
        assert!(e.to_string().contains("5000us"), "{e}");
        let d = DomainConfig {
            check_interval: Nanos::from_millis(300),
            ..DomainConfig::default()
        };
        assert!(matches!(
            d.validate(),
            Err(ConfigError::CheckInterval { .. })
        ));
        let d = DomainConfig {
            capacity: Capacity {
                iops: Some(0),
                ..Capacity::default()
            },
            ..DomainConfig::default()
        };
        assert!(matches!(d.validate(), Err(ConfigError::ZeroCapacity(_))));
    }

    #[test]
    fn together_budgets_are_per_period() {
        let d = DomainConfig {
            period: Nanos::from_millis(100),
            ..domain()
        };
        let h = HostConfig::new("nqn.2014-08.org.nvmexpress:uuid:a")
            .with_reservation(Rate {
                iops: Some(10_000),
                mibps: Some(40),
            })
            .with_limit(Rate::iops(20_000));
        let b = h.budgets(&d).unwrap();
        assert!(b.together);
        assert_eq!(b.reservation[0], Amount::new(1_000, 4 * MIB));
        assert_eq!(b.limit[0].ops, 2_000);
        assert!(!b.is_limited(BudgetClass::Total, Resource::Bytes));
        assert!(!b.is_limited(BudgetClass::Read, Resource::Ops));
    }

    #[test]
    fn reservation_above_limit_names_host_and_numbers() {
        let h = HostConfig::new("nqn.h1")
            .with_reservation(Rate::iops(500))
            .with_limit(Rate::iops(400));
        let e = h.budgets(&domain()).unwrap_err();
        assert_eq!(
            e.to_string(),
            "host nqn.h1: total reservation 500 IOPS exceeds its total limit 400 IOPS"
        );
    }

    #[test]
    fn apart_reservation_checks_each_direction_and_the_sum() {
        let mut h = HostConfig::new("nqn.h1");
        h.reservation.read = Rate::iops(300);
        h.reservation.write = Rate::iops(300);
        h.limit.total = Rate::iops(500);
        let e = h.budgets(&domain()).unwrap_err();
        assert!(
            matches!(e, ConfigError::ReservationAboveLimit { class: "total", .. }),
            "{e}"
        );
        h.limit.total = Rate::iops(600);
        let b = h.budgets(&domain()).unwrap();
        assert!(!b.together);
        assert_eq!(b.pool(Direction::Write), 1);
        h.reservation.total = Rate::iops(1);
        assert!(matches!(
            h.budgets(&domain()),
            Err(ConfigError::MixedReservation { .. })
        ));
    }

    #[test]
    fn bandwidth_reservation_needs_target_bandwidth() {
        let d = DomainConfig::default();
        let h = HostConfig::new("nqn.h1").with_reservation(Rate::mibps(10));
        assert!(matches!(
            h.budgets(&d),
            Err(ConfigError::BandwidthWithoutCapacity { .. })
        ));
    }

    #[test]
    fn rates_below_one_command_per_period_are_refused() {
        // 100 ms periods: 9 IOPS is 0.9 commands per period.
        let d = DomainConfig {
            period: Nanos::from_millis(100),
            ..domain()
        };
        let refused = |h: HostConfig| match h.budgets(&d) {
            Err(e @ ConfigError::BelowOnePerPeriod { .. }) => e.to_string(),
            other => panic!("expected a refusal, got {other:?}"),
        };
        let msg = refused(HostConfig::new("nqn.h1").with_limit(Rate::iops(9)));
        assert!(
            msg.contains("host nqn.h1 limit of 9 IOPS") && msg.contains("at least 10 IOPS"),
            "{msg}"
        );
        refused(HostConfig::new("nqn.h1").with_reservation(Rate::iops(1)));
        let mut h = HostConfig::new("nqn.h1");
        h.limit.read = Rate::iops(5);
        assert!(refused(h).contains("read limit"));
        let mut h = HostConfig::new("nqn.h1");
        h.soft_reservation = Rate::iops(3);
        refused(h);
        let mut g = GroupConfig::new("g");
        g.limit = Rate::iops(2);
        assert!(matches!(
            g.budgets(&d),
            Err(ConfigError::BelowOnePerPeriod { .. })
        ));
        // One command per period is the smallest rate kept, exactly.
        let b = HostConfig::new("nqn.h1")
            .with_limit(Rate::iops(10))
            .budgets(&d)
            .unwrap();
        assert_eq!(b.limit[BudgetClass::Total as usize].ops, 1);
    }

    #[test]
    fn soft_reservation_bounds() {
        let mut h = HostConfig::new("nqn.h1")
            .with_reservation(Rate::iops(100))
            .with_limit(Rate::iops(1000));
        h.soft_reservation = Rate::iops(50);
        assert!(matches!(
            h.budgets(&domain()),
            Err(ConfigError::SoftBelowHard { .. })
        ));
        h.soft_reservation = Rate::iops(2000);
        assert!(matches!(
            h.budgets(&domain()),
            Err(ConfigError::SoftAboveLimit { .. })
        ));
        h.soft_reservation = Rate::iops(300);
        assert_eq!(h.budgets(&domain()).unwrap().soft_extra.ops, 200);
    }

    #[test]
    fn bad_nqn_and_weight_are_refused() {
        assert!(matches!(
            HostConfig::new("").budgets(&domain()),
            Err(ConfigError::HostNqn(_))
        ));
        assert!(matches!(
            HostConfig::new("a b").budgets(&domain()),
            Err(ConfigError::HostNqn(_))
        ));
        let mut h = HostConfig::new("nqn.x");
        h.weight = 0;
        assert!(matches!(
            h.budgets(&domain()),
            Err(ConfigError::Weight { .. })
        ));
    }

    #[test]
    fn zero_rates_are_refused() {
        let h = HostConfig::new("nqn.x").with_limit(Rate::iops(0));
        assert!(matches!(
            h.budgets(&domain()),
            Err(ConfigError::ZeroRate { .. })
        ));
    }

    #[test]
    fn host_config_round_trips_through_json() {
        let mut h = HostConfig::new("nqn.x").with_reservation(Rate::iops(5));
        h.limit.read = Rate::mibps(7);
        let s = serde_json::to_string(&h).unwrap();
        let back: HostConfig = serde_json::from_str(&s).unwrap();
        assert_eq!(back, h);
        assert!(serde_json::from_str::<HostConfig>(r#"{"host_nqn":"a","bogus":1}"#).is_err());
    }
}
