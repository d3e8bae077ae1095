//! Scenario files: the TOML schema, its validation, and the resolved [`Scenario`] the
//! simulator runs. Every refusal names the file, the line and the field, and says what
//! to change. Figures in a scenario are the operator's (or the paper's) real figures;
//! `scale` divides every rate when simulating (see [`Scenario::scale`]).
//!
//! The schema is documented field by field in `docs/lab.md`; the shipped scenarios in
//! `qos-lab/scenarios/` are commented examples.

use std::path::Path;

use qos_core::{
    DomainConfig, ExcessSharing, HostConfig, Nanos, Rate, ReservationRelease, TokenMode,
};
use serde::Deserialize;
use thiserror::Error;

use crate::locate::{FieldPath, line_col, locate, path_at};

/// Why a scenario could not be loaded.
#[derive(Debug, Error)]
pub enum ScenarioError {
    #[error("{file}: cannot read the scenario: {source}")]
    Io {
        file: String,
        #[source]
        source: std::io::Error,
    },
    /// The TOML does not parse or a field has the wrong type or name.
    #[error("{file}:{line}:{column}: {field}: {message}")]
    Parse {
        file: String,
        line: usize,
        column: usize,
        field: String,
        message: String,
    },
    /// The TOML parses but a value is impossible.
    #[error("{}", invalid_display(.file, .line, .column, .field, .message))]
    Invalid {
        file: String,
        line: Option<usize>,
        column: Option<usize>,
        field: String,
        message: String,
    },
}

fn invalid_display(
    file: &str,
    line: &Option<usize>,
    column: &Option<usize>,
    field: &str,
    message: &str,
) -> String {
    match (line, column) {
        (Some(l), Some(c)) => format!("{file}:{l}:{c}: {field}: {message}"),
        _ => format!("{file}: {field}: {message}"),
    }
}

impl ScenarioError {
    /// The field the error is about, when it is about one.
    pub fn field(&self) -> Option<&str> {
        match self {
            ScenarioError::Io { .. } => None,
            ScenarioError::Parse { field, .. } | ScenarioError::Invalid { field, .. } => {
                Some(field)
            }
        }
    }
    /// The 1-based line the error points at, when known.
    pub fn line(&self) -> Option<usize> {
        match self {
            ScenarioError::Io { .. } => None,
            ScenarioError::Parse { line, .. } => Some(*line),
            ScenarioError::Invalid { line, .. } => *line,
        }
    }
}

// ---------------------------------------------------------------------------------------
// Raw schema (what serde reads).

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawScenario {
    name: Option<String>,
    description: Option<String>,
    seed: Option<i64>,
    periods: Option<i64>,
    warmup_periods: Option<i64>,
    scale: Option<i64>,
    policies: Option<Vec<String>>,
    target: Option<RawTarget>,
    qos: Option<RawQos>,
    pacer: Option<RawPacer>,
    reservations: Option<RawReservations>,
    defaults: Option<RawHost>,
    #[serde(default)]
    host: Vec<RawHost>,
    #[serde(default)]
    group: Vec<RawGroup>,
    #[serde(default)]
    variant: Vec<RawVariant>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawGroup {
    name: String,
    reservation_iops: Option<i64>,
    limit_iops: Option<i64>,
    weight: Option<i64>,
    burst_iops: Option<i64>,
    burst_seconds: Option<i64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTarget {
    capacity_iops: Option<i64>,
    per_host_max_iops: Option<i64>,
    service: Option<String>,
    base_latency_us: Option<f64>,
    half_depth: Option<f64>,
    link_gbps: Option<f64>,
    link_command_us: Option<f64>,
    channels_per_host: Option<i64>,
    #[serde(default)]
    capacity_change: Vec<RawCapChange>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCapChange {
    at_s: f64,
    factor: f64,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawQos {
    period_ms: Option<i64>,
    check_interval_us: Option<i64>,
    profiled_iops: Option<i64>,
    profiled_stddev_iops: Option<i64>,
    estimator: Option<bool>,
    ns_limit_iops: Option<i64>,
    ns_limit_mibps: Option<i64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPacer {
    chunk_kib: Option<i64>,
    chunk_auto: Option<bool>,
    latency_target_us: Option<i64>,
    latency_target_auto_milli: Option<i64>,
    link_iops: Option<i64>,
    probe_interval_us: Option<i64>,
    aimd_interval_us: Option<i64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawReservations {
    distribution: String,
    reserved_fraction: Option<f64>,
    zipf_exponent: Option<f64>,
    groups: Option<i64>,
    iops: Option<Vec<i64>>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
enum RawDemand {
    Count(i64),
    Word(String),
    Relative(RawRelDemand),
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRelDemand {
    of_reservation: Option<f64>,
    plus_unreserved: Option<bool>,
}

#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawHost {
    name: Option<String>,
    count: Option<i64>,
    first_index: Option<i64>,
    machine: Option<String>,
    pattern: Option<String>,
    queue_depth: Option<i64>,
    io_kib: Option<i64>,
    read_fraction: Option<f64>,
    demand: Option<RawDemand>,
    cooperative: Option<bool>,
    reservation_iops: Option<i64>,
    limit_iops: Option<i64>,
    reservation_mibps: Option<i64>,
    limit_mibps: Option<i64>,
    weight: Option<i64>,
    start_s: Option<f64>,
    stop_s: Option<f64>,
    group: Option<String>,
    priority: Option<String>,
    soft_reservation_iops: Option<i64>,
    burst_iops: Option<i64>,
    burst_seconds: Option<i64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawVariant {
    name: String,
    pattern: Option<String>,
    reserved_fraction: Option<f64>,
    distribution: Option<String>,
    /// `false`: the hosts' bursts are left out in this variant.
    burst: Option<bool>,
}

// ---------------------------------------------------------------------------------------
// Resolved scenario.

/// Who enforces what at the target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Enforcement {
    /// No QoS at all.
    Bare,
    /// SPDK's bdev QoS: one rate limit per namespace, shared by all its hosts.
    NsLimit,
    /// nvmf-qos's target plugin with these domain settings.
    Qos(QosSettings),
}

/// The domain settings a QoS policy runs with: the product's `mode`, `release` and
/// `sharing` (docs/rpc.md, `qos_domain_create`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QosSettings {
    pub mode: TokenMode,
    pub release: ReservationRelease,
    pub sharing: ExcessSharing,
}

/// A policy compared in a run: an enforcement, with or without chunk pacing at the
/// cooperative initiators.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    pub enforcement: Enforcement,
    pub pacing: bool,
}

/// Policy names of earlier versions of the lab, and what they are called now.
const RENAMED: [(&str, &str); 4] = [
    ("haechi", "weighted"),
    ("haechi-fcfs", "first_come"),
    ("haechi-start", "first_come/start"),
    ("basic-haechi", "first_come/start/basic"),
];

impl Policy {
    /// The names of the policies the lab knows best (any `SHARING[/start][/basic]`
    /// parses, each optionally followed by `+pacing`).
    pub const NAMES: [&'static str; 6] = [
        "bare",
        "ns-limit",
        "first_come/start/basic",
        "first_come/start",
        "first_come",
        "weighted",
    ];

    /// Parses `bare`, `ns-limit`, or the product's settings as `SHARING[/RELEASE][/MODE]`
    /// (`first_come` or `weighted`; `paced` or `start`, default `paced`; `haechi` or
    /// `basic`, default `haechi`), each optionally followed by `+pacing`.
    pub fn parse(s: &str) -> Option<Policy> {
        let (base, pacing) = match s.strip_suffix("+pacing") {
            Some(b) => (b, true),
            None => (s, false),
        };
        let enforcement = match base {
            "bare" => Enforcement::Bare,
            "ns-limit" => Enforcement::NsLimit,
            _ => Enforcement::Qos(QosSettings::parse(base)?),
        };
        Some(Policy {
            enforcement,
            pacing,
        })
    }

    /// For a name that does not parse: the name it has now, if it is an earlier one.
    pub fn renamed(s: &str) -> Option<String> {
        let (base, pacing) = match s.strip_suffix("+pacing") {
            Some(b) => (b, "+pacing"),
            None => (s, ""),
        };
        RENAMED
            .iter()
            .find(|(old, _)| *old == base)
            .map(|(_, new)| format!("{new}{pacing}"))
    }

    pub fn name(&self) -> String {
        let base = match self.enforcement {
            Enforcement::Bare => "bare".to_string(),
            Enforcement::NsLimit => "ns-limit".to_string(),
            Enforcement::Qos(q) => q.name(),
        };
        if self.pacing {
            format!("{base}+pacing")
        } else {
            base
        }
    }

    /// The target plugin's settings, for the policies that run it.
    pub fn qos(&self) -> Option<QosSettings> {
        match self.enforcement {
            Enforcement::Qos(q) => Some(q),
            _ => None,
        }
    }

    /// Haechi's token ledger runs at the target.
    pub fn uses_tokens(&self) -> bool {
        self.qos().is_some()
    }
}

impl QosSettings {
    fn parse(s: &str) -> Option<QosSettings> {
        let mut parts = s.split('/');
        let sharing = match parts.next()? {
            "first_come" => ExcessSharing::FirstCome,
            "weighted" => ExcessSharing::Weighted,
            "operating_point" => ExcessSharing::OperatingPoint,
            _ => return None,
        };
        let mut q = QosSettings {
            mode: TokenMode::Haechi,
            release: ReservationRelease::Paced,
            sharing,
        };
        let (mut release_given, mut mode_given) = (false, false);
        for part in parts {
            match part {
                "start" | "paced" if !release_given => {
                    release_given = true;
                    if part == "start" {
                        q.release = ReservationRelease::Start;
                    }
                }
                "basic" | "haechi" if !mode_given => {
                    mode_given = true;
                    if part == "basic" {
                        q.mode = TokenMode::Basic;
                    }
                }
                _ => return None,
            }
        }
        Some(q)
    }

    /// `SHARING[/start][/basic]`: the product's defaults (paced release, Haechi's
    /// conversion) are left out.
    fn name(&self) -> String {
        let mut n = match self.sharing {
            ExcessSharing::FirstCome => "first_come",
            ExcessSharing::Weighted => "weighted",
            ExcessSharing::OperatingPoint => "operating_point",
        }
        .to_string();
        if self.release == ReservationRelease::Start {
            n.push_str("/start");
        }
        if self.mode == TokenMode::Basic {
            n.push_str("/basic");
        }
        n
    }
}

/// Distribution of the work one command costs the target, in units of its mean.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Service {
    Exponential,
    Deterministic,
}

/// How a host issues its I/O.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pattern {
    /// Keeps `queue_depth` commands outstanding while it has demand (Haechi's "burst").
    Burst,
    /// Spreads its per-period demand evenly over the period (Haechi's "constant-rate");
    /// at most `queue_depth` outstanding, the rest waits in the application.
    ConstantRate,
}

impl Pattern {
    fn parse(s: &str) -> Option<Pattern> {
        match s {
            "burst" => Some(Pattern::Burst),
            "constant-rate" => Some(Pattern::ConstantRate),
            _ => None,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            Pattern::Burst => "burst",
            Pattern::ConstantRate => "constant-rate",
        }
    }
}

/// The emulated target.
#[derive(Debug, Clone, PartialEq)]
pub struct TargetSpec {
    /// C_G: the target's saturated throughput, IOPS.
    pub capacity_iops: u64,
    /// C_L: most one host can do alone, IOPS.
    pub per_host_max_iops: u64,
    pub service: Service,
    /// Fabric round trip added to every command outside the target's queues.
    pub base_latency: Nanos,
    /// Commands in flight at which the target does half of `capacity_iops` (it does
    /// `capacity_iops * n / (n + half_depth)` with n); 0: `capacity_iops` at any depth.
    pub half_depth: f64,
    /// The target's link in bytes per second; `None` leaves bytes unconstrained.
    pub link_bytes_per_s: Option<u64>,
    /// What one command costs the link besides its bytes (NVMe/TCP: a PDU, a copy, a
    /// completion): a chunked transfer pays it per chunk. Zero by default.
    pub link_command: Nanos,
    pub channels_per_host: usize,
    /// (time, factor of C_G available to the hosts from then on): background load.
    pub capacity_changes: Vec<(Nanos, f64)>,
}

/// The QoS domain settings (Haechi) and the namespace limit (SPDK bdev QoS).
#[derive(Debug, Clone, PartialEq)]
pub struct QosSpec {
    pub period: Nanos,
    pub check_interval: Nanos,
    /// Omega_prof: the profiled capacity the monitor starts from.
    pub profiled_iops: u64,
    /// sigma of the profile; the estimator ignores periods below Omega_prof - 3 sigma.
    pub profiled_stddev_iops: u64,
    pub estimator: bool,
    pub ns_limit_iops: Option<u64>,
    pub ns_limit_mibps: Option<u64>,
}

/// Settings of the Justitia pacer at cooperative initiators.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PacerSpec {
    /// The largest chunk with `chunk_auto`, else the chunk.
    pub chunk_bytes: u64,
    /// The chunk follows the latency target and the path (qos-core's `PacerConfig`).
    pub chunk_auto: bool,
    pub latency_target: Nanos,
    /// 0: the fixed `latency_target`; else that many thousandths of the probe's base
    /// latency, at most `latency_target` (qos-core's `PacerConfig`).
    pub latency_target_auto_milli: u64,
    pub link_iops: u64,
    pub probe_interval: Nanos,
    pub aimd_interval: Nanos,
}

/// One host, as the scenario describes it (real figures, before `scale`).
#[derive(Debug, Clone, PartialEq)]
pub struct HostSpec {
    pub name: String,
    /// Hosts on the same machine share one pacer (Justitia's per-machine daemon).
    pub machine: String,
    pub pattern: Pattern,
    pub queue_depth: u32,
    pub io_bytes: u64,
    pub read_fraction: f64,
    /// I/O per period it wants; `None` is always backlogged.
    pub demand: Option<u64>,
    pub cooperative: bool,
    pub reservation_iops: Option<u64>,
    pub limit_iops: Option<u64>,
    pub reservation_mibps: Option<u64>,
    pub limit_mibps: Option<u64>,
    pub weight: u32,
    pub start: Nanos,
    pub stop: Option<Nanos>,
    /// Tenant group (one of the scenario's `[[group]]`s).
    pub group: Option<String>,
    pub priority: qos_core::PriorityClass,
    /// Soft guarantee (seed 002), IOPS; at least the hard reservation.
    pub soft_reservation_iops: Option<u64>,
    /// Burst above `limit_iops` on credit (issue 28), IOPS, and the bucket in seconds.
    pub burst_iops: Option<u64>,
    pub burst_seconds: Option<u64>,
}

/// A tenant group of the scenario (real figures, before `scale`).
#[derive(Debug, Clone, PartialEq)]
pub struct GroupSpec {
    pub name: String,
    pub reservation_iops: Option<u64>,
    pub limit_iops: Option<u64>,
    pub weight: u32,
    pub burst_iops: Option<u64>,
    pub burst_seconds: Option<u64>,
}

/// A burst of `iops` (divided by `scale`) for `seconds` (not scaled: time is not).
fn burst_of(iops: Option<u64>, seconds: Option<u64>, scale: u64) -> qos_core::burst::Burst {
    qos_core::burst::Burst {
        iops: iops.map(|v| (v / scale).max(1)),
        mibps: None,
        seconds,
    }
}

impl GroupSpec {
    /// The core's configuration of this group, with rates divided by `scale`.
    pub fn group_config(&self, scale: u64) -> qos_core::GroupConfig {
        let s = |v: Option<u64>| v.map(|v| (v / scale).max(1));
        qos_core::GroupConfig {
            name: self.name.clone(),
            reservation: Rate::iops_opt(s(self.reservation_iops)),
            limit: Rate::iops_opt(s(self.limit_iops)),
            weight: self.weight,
            burst: burst_of(self.burst_iops, self.burst_seconds, scale),
        }
    }
}

impl HostSpec {
    /// The core's configuration of this host, with rates divided by `scale`.
    pub fn host_config(&self, scale: u64) -> HostConfig {
        let s = |v: Option<u64>| v.map(|v| (v / scale).max(1));
        let mut h = HostConfig::new(self.nqn());
        h.reservation.total = Rate {
            iops: s(self.reservation_iops),
            mibps: s(self.reservation_mibps),
        };
        h.limit.total = Rate {
            iops: s(self.limit_iops),
            mibps: s(self.limit_mibps),
        };
        h.weight = self.weight;
        h.group = self.group.clone();
        h.priority = self.priority;
        h.soft_reservation = Rate {
            iops: s(self.soft_reservation_iops),
            mibps: None,
        };
        h.burst = burst_of(self.burst_iops, self.burst_seconds, scale);
        h
    }
    /// The host NQN the lab gives this host.
    pub fn nqn(&self) -> String {
        format!("nqn.2026-11.io.nvmf-qos.lab:{}", self.name)
    }
}

/// One set of hosts to run (the scenario itself, or one of its variants).
#[derive(Debug, Clone, PartialEq)]
pub struct RunSpec {
    pub variant: Option<String>,
    pub hosts: Vec<HostSpec>,
}

/// A validated scenario.
#[derive(Debug, Clone, PartialEq)]
pub struct Scenario {
    pub name: String,
    pub description: String,
    /// The file it came from (as given), for messages.
    pub file: String,
    pub seed: u64,
    /// Periods measured (after the warm-up).
    pub periods: u32,
    pub warmup_periods: u32,
    /// Every rate (capacities, reservations, limits, demands, link bandwidth) is divided
    /// by `scale` in the simulation; periods, I/O sizes and latencies are not. Results are
    /// multiplied back, so they read in the scenario's own units.
    pub scale: u64,
    pub policies: Vec<Policy>,
    pub target: TargetSpec,
    pub qos: QosSpec,
    pub pacer: PacerSpec,
    /// One entry without a variant name, or one per `[[variant]]`.
    pub runs: Vec<RunSpec>,
    /// Tenant groups (`[[group]]`), created before the hosts.
    pub groups: Vec<GroupSpec>,
}

impl Scenario {
    /// Reads and validates a scenario file.
    pub fn load(path: &Path) -> Result<Scenario, ScenarioError> {
        let file = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| ScenarioError::Io {
            file: file.clone(),
            source,
        })?;
        let stem = path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "scenario".into());
        Scenario::parse(&text, &file, &stem)
    }

    /// Validates scenario `text`; `file` names it in messages, `default_name` is used
    /// when it has no `name`.
    pub fn parse(text: &str, file: &str, default_name: &str) -> Result<Scenario, ScenarioError> {
        let ctx = Ctx { text, file };
        let raw: RawScenario = toml::from_str(text).map_err(|e| ctx.parse_error(&e))?;
        resolve(raw, &ctx, default_name)
    }

    /// The core's domain configuration, with rates divided by `scale`, for `mode` and
    /// `release`.
    pub fn domain_config(
        &self,
        scale: u64,
        mode: qos_core::TokenMode,
        release: qos_core::ReservationRelease,
        sharing: qos_core::ExcessSharing,
    ) -> DomainConfig {
        let q = &self.qos;
        DomainConfig {
            period: q.period,
            check_interval: q.check_interval,
            capacity: qos_core::Capacity {
                iops: Some((q.profiled_iops / scale).max(1)),
                iops_stddev: q.profiled_stddev_iops / scale,
                mibps: None,
                mibps_stddev: 0,
            },
            per_host_max: Rate::iops((self.target.per_host_max_iops / scale).max(1)),
            estimator: qos_core::EstimatorConfig {
                enabled: q.estimator,
                ..qos_core::EstimatorConfig::default()
            },
            mode,
            release,
            sharing,
            ..DomainConfig::default()
        }
    }
}

/// serde's "invalid type: floating point `1570000.0`, expected i64" in words: TOML
/// reads `1.57e6` as a float, and every rate and count here is a whole number.
fn float_for_integer(message: &str) -> Option<String> {
    let rest = message.strip_prefix("invalid type: floating point `")?;
    let value = &rest[..rest.find('`')?];
    let v: f64 = value.parse().ok()?;
    let hint = if v.fract() == 0.0 && v.abs() < 1e18 {
        format!("; write {} (or with _ separators)", v as i64)
    } else {
        String::new()
    };
    Some(format!(
        "expected a whole number, got the floating-point number {value} (TOML reads forms like 1.57e6 as floating point){hint}"
    ))
}

struct Ctx<'a> {
    text: &'a str,
    file: &'a str,
}

impl Ctx<'_> {
    fn parse_error(&self, e: &toml::de::Error) -> ScenarioError {
        let offset = e.span().map_or(0, |s| s.start);
        let (line, column) = line_col(self.text, offset);
        let field = path_at(self.text, offset)
            .map(|p| p.to_string())
            .unwrap_or_else(|| "(syntax)".into());
        let mut message = e.message().trim().to_string();
        if field.ends_with("demand") && message.contains("untagged") {
            message = "expected an I/O count per period (e.g. 158000), \"unlimited\", or a table such as { of_reservation = 0.5, plus_unreserved = true }".into();
        }
        if let Some(m) = float_for_integer(&message) {
            message = m;
        }
        ScenarioError::Parse {
            file: self.file.to_string(),
            line,
            column,
            field,
            message,
        }
    }

    fn invalid(&self, path: &FieldPath, message: impl Into<String>) -> ScenarioError {
        let pos = locate(self.text, path).map(|r| line_col(self.text, r.start));
        ScenarioError::Invalid {
            file: self.file.to_string(),
            line: pos.map(|p| p.0),
            column: pos.map(|p| p.1),
            field: path.to_string(),
            message: message.into(),
        }
    }

    /// A non-negative integer (a rate or a count); `what` says what it is.
    fn non_negative(
        &self,
        v: Option<i64>,
        path: &FieldPath,
        what: &str,
    ) -> Result<Option<u64>, ScenarioError> {
        match v {
            Some(x) if x < 0 => Err(self.invalid(
                path,
                format!("{what} cannot be negative (got {x}); write a value of 0 or more"),
            )),
            Some(x) => Ok(Some(x as u64)),
            None => Ok(None),
        }
    }

    /// A positive integer.
    fn positive(
        &self,
        v: Option<i64>,
        path: &FieldPath,
        what: &str,
    ) -> Result<Option<u64>, ScenarioError> {
        match v {
            Some(x) if x < 0 => Err(self.invalid(
                path,
                format!("{what} cannot be negative (got {x}); write a positive number"),
            )),
            Some(0) => Err(self.invalid(
                path,
                format!(
                    "{what} must be at least 1 (got 0); write a positive number or remove the field"
                ),
            )),
            Some(x) => Ok(Some(x as u64)),
            None => Ok(None),
        }
    }

    fn fraction(&self, v: f64, path: &FieldPath, what: &str) -> Result<f64, ScenarioError> {
        if !(0.0..=1.0).contains(&v) || v.is_nan() {
            return Err(self.invalid(
                path,
                format!("{what} must be between 0 and 1 (got {v}); 0.9 means 90%"),
            ));
        }
        Ok(v)
    }

    fn seconds(&self, v: f64, path: &FieldPath, what: &str) -> Result<Nanos, ScenarioError> {
        if !(0.0..=1e6).contains(&v) {
            return Err(self.invalid(
                path,
                format!("{what} must be a time in seconds between 0 and 1000000 (got {v})"),
            ));
        }
        Ok(Nanos((v * 1e9).round() as u64))
    }
}

fn top(k: &str) -> FieldPath {
    FieldPath::root().key(k)
}

fn resolve(raw: RawScenario, ctx: &Ctx<'_>, default_name: &str) -> Result<Scenario, ScenarioError> {
    let seed = ctx
        .non_negative(raw.seed, &top("seed"), "the seed")?
        .unwrap_or(1);
    let periods = ctx
        .positive(raw.periods, &top("periods"), "the number of periods")?
        .unwrap_or(30);
    if periods > 100_000 {
        return Err(ctx.invalid(&top("periods"), "at most 100000 periods"));
    }
    let warmup = ctx
        .non_negative(raw.warmup_periods, &top("warmup_periods"), "the warm-up")?
        .unwrap_or(1);
    if warmup > 1000 {
        return Err(ctx.invalid(&top("warmup_periods"), "at most 1000 warm-up periods"));
    }
    let scale = ctx
        .positive(raw.scale, &top("scale"), "the scale")?
        .unwrap_or(1);
    if scale > 1_000_000 {
        return Err(ctx.invalid(&top("scale"), "the scale must be at most 1000000"));
    }
    let policies = match &raw.policies {
        None => vec![
            Policy::parse("bare").expect("known"),
            Policy::parse("ns-limit").expect("known"),
            Policy::parse("first_come/start/basic").expect("known"),
            Policy::parse("weighted").expect("known"),
        ],
        Some(list) => {
            if list.is_empty() {
                return Err(ctx.invalid(
                    &top("policies"),
                    "name at least one policy: bare, ns-limit, first_come or weighted (each may end in +pacing)",
                ));
            }
            let mut out = Vec::new();
            for (i, s) in list.iter().enumerate() {
                let p = Policy::parse(s).ok_or_else(|| {
                    let hint = match Policy::renamed(s) {
                        Some(now) => format!("policy {s:?} is called {now:?} now"),
                        None => format!(
                            "unknown policy {s:?}; use bare, ns-limit, or the target's settings \
                             as SHARING[/start][/basic] (first_come or weighted; reservations \
                             released at the period start; no conversion), each optionally \
                             followed by +pacing"
                        ),
                    };
                    ctx.invalid(&top("policies").index(i), hint)
                })?;
                if out.contains(&p) {
                    return Err(ctx.invalid(
                        &top("policies").index(i),
                        format!("policy {s:?} is listed twice; remove one"),
                    ));
                }
                out.push(p);
            }
            out
        }
    };

    // Target.
    let t = raw.target.unwrap_or_default();
    let tp = |k: &str| top("target").key(k);
    let capacity_iops = ctx
        .positive(
            t.capacity_iops,
            &tp("capacity_iops"),
            "the target capacity C_G",
        )?
        .unwrap_or(1_570_000);
    let per_host_max_iops = ctx
        .positive(
            t.per_host_max_iops,
            &tp("per_host_max_iops"),
            "the per-host maximum C_L",
        )?
        .unwrap_or(capacity_iops);
    let service = match t.service.as_deref() {
        None | Some("exponential") => Service::Exponential,
        Some("deterministic") => Service::Deterministic,
        Some(other) => {
            return Err(ctx.invalid(
                &tp("service"),
                format!("unknown service distribution {other:?}; use \"exponential\" or \"deterministic\""),
            ));
        }
    };
    let base_latency_us = t.base_latency_us.unwrap_or(5.0);
    if !(0.0..=1e6).contains(&base_latency_us) {
        return Err(ctx.invalid(
            &tp("base_latency_us"),
            format!("the base latency must be 0 ..= 1000000 us (got {base_latency_us})"),
        ));
    }
    let half_depth = t.half_depth.unwrap_or(0.0);
    if !(0.0..=100_000.0).contains(&half_depth) {
        return Err(ctx.invalid(
            &tp("half_depth"),
            format!("the half depth must be 0 ..= 100000 commands (got {half_depth}); 0 or no field: the capacity whatever the depth"),
        ));
    }
    let link_bytes_per_s = match t.link_gbps {
        None => None,
        Some(g) if g.is_nan() || g <= 0.0 || g > 100_000.0 => {
            return Err(ctx.invalid(
                &tp("link_gbps"),
                format!("the link bandwidth must be more than 0 and at most 100000 Gb/s (got {g}); remove the field for an unconstrained link"),
            ));
        }
        Some(g) => Some((g * 1e9 / 8.0).round() as u64),
    };
    let link_command = match t.link_command_us {
        None => Nanos::ZERO,
        Some(_) if link_bytes_per_s.is_none() => {
            return Err(ctx.invalid(
                &tp("link_command_us"),
                "a command's cost on the link needs a link: set link_gbps too",
            ));
        }
        Some(u) if u.is_nan() || !(0.0..=10_000.0).contains(&u) => {
            return Err(ctx.invalid(
                &tp("link_command_us"),
                format!("a command's cost on the link must be 0 ..= 10000 us (got {u})"),
            ));
        }
        Some(u) => Nanos((u * 1000.0).round() as u64),
    };
    let channels = ctx
        .positive(
            t.channels_per_host,
            &tp("channels_per_host"),
            "the number of channels per host",
        )?
        .unwrap_or(1);
    if channels > 64 {
        return Err(ctx.invalid(
            &tp("channels_per_host"),
            "at most 64 channels (poll-group threads) per host",
        ));
    }
    let mut capacity_changes = Vec::new();
    for (i, c) in t.capacity_change.iter().enumerate() {
        let p = tp("capacity_change").index(i);
        let at = ctx.seconds(c.at_s, &p.clone().key("at_s"), "at_s")?;
        if !(c.factor > 0.0 && c.factor <= 10.0) {
            return Err(ctx.invalid(
                &p.key("factor"),
                format!("the capacity factor must be more than 0 and at most 10 (got {}); 0.8 means background load takes 20%", c.factor),
            ));
        }
        capacity_changes.push((at, c.factor));
    }
    capacity_changes.sort_by_key(|c| c.0);

    // QoS domain.
    let q = raw.qos.unwrap_or_default();
    let qp = |k: &str| top("qos").key(k);
    let period_ms = ctx
        .positive(q.period_ms, &qp("period_ms"), "the QoS period")?
        .unwrap_or(1000);
    let check_us = ctx
        .positive(
            q.check_interval_us,
            &qp("check_interval_us"),
            "the check interval",
        )?
        .unwrap_or(1000);
    let profiled_iops = ctx
        .positive(
            q.profiled_iops,
            &qp("profiled_iops"),
            "the profiled capacity",
        )?
        .unwrap_or(capacity_iops);
    let stddev = ctx
        .non_negative(
            q.profiled_stddev_iops,
            &qp("profiled_stddev_iops"),
            "the profiled standard deviation",
        )?
        .unwrap_or(0);
    let ns_limit_iops =
        ctx.positive(q.ns_limit_iops, &qp("ns_limit_iops"), "the namespace limit")?;
    let ns_limit_mibps = ctx.positive(
        q.ns_limit_mibps,
        &qp("ns_limit_mibps"),
        "the namespace limit",
    )?;
    let qos = QosSpec {
        period: Nanos::from_millis(period_ms),
        check_interval: Nanos::from_micros(check_us),
        profiled_iops,
        profiled_stddev_iops: stddev,
        estimator: q.estimator.unwrap_or(false),
        ns_limit_iops,
        ns_limit_mibps,
    };

    // Pacer.
    let pr = raw.pacer.unwrap_or_default();
    let pp = |k: &str| top("pacer").key(k);
    let defaults = qos_core::pacer::PacerConfig::default();
    let chunk_kib = ctx
        .positive(pr.chunk_kib, &pp("chunk_kib"), "the chunk size")?
        .unwrap_or(defaults.chunk_bytes / 1024);
    if !(4..=16 * 1024).contains(&chunk_kib) {
        return Err(ctx.invalid(
            &pp("chunk_kib"),
            format!("the chunk size must be 4 ..= 16384 KiB (got {chunk_kib})"),
        ));
    }
    let pacer = PacerSpec {
        chunk_bytes: chunk_kib * 1024,
        chunk_auto: pr.chunk_auto.unwrap_or(defaults.chunk_auto),
        latency_target: ctx
            .positive(
                pr.latency_target_us,
                &pp("latency_target_us"),
                "the latency target",
            )?
            .map_or(defaults.latency_target, Nanos::from_micros),
        latency_target_auto_milli: match ctx.non_negative(
            pr.latency_target_auto_milli,
            &pp("latency_target_auto_milli"),
            "the automatic latency target",
        )? {
            None => defaults.latency_target_auto_milli,
            Some(m) => {
                // qos-core's own check, so that the lab and the plugin take the same values.
                qos_core::pacer::PacerConfig {
                    latency_target_auto_milli: m,
                    ..defaults
                }
                .validate()
                .map_err(|e| ctx.invalid(&pp("latency_target_auto_milli"), e.to_string()))?;
                m
            }
        },
        link_iops: ctx
            .positive(pr.link_iops, &pp("link_iops"), "the link operation rate")?
            .unwrap_or(defaults.link_iops),
        probe_interval: ctx
            .positive(
                pr.probe_interval_us,
                &pp("probe_interval_us"),
                "the probe interval",
            )?
            .map_or(defaults.probe_interval, Nanos::from_micros),
        aimd_interval: ctx
            .positive(
                pr.aimd_interval_us,
                &pp("aimd_interval_us"),
                "the AIMD interval",
            )?
            .map_or(defaults.aimd_interval, Nanos::from_micros),
    };

    // Hosts (templates, before reservations).
    if raw.host.is_empty() {
        return Err(ctx.invalid(
            &top("host"),
            "the scenario defines no host; add at least one [[host]] table",
        ));
    }
    let dflt = raw.defaults.clone().unwrap_or_default();
    if dflt.name.is_some() || dflt.count.is_some() || dflt.first_index.is_some() {
        return Err(ctx.invalid(
            &top("defaults"),
            "[defaults] cannot set name, count or first_index; set them in each [[host]]",
        ));
    }
    let mut templates: Vec<(usize, RawHost)> = Vec::new();
    for (j, h) in raw.host.iter().enumerate() {
        let count = ctx
            .positive(h.count, &top("host").index(j).key("count"), "count")?
            .unwrap_or(1);
        if count > 1024 {
            return Err(ctx.invalid(
                &top("host").index(j).key("count"),
                "at most 1024 copies of one host",
            ));
        }
        let base_name = h.name.clone().unwrap_or_else(|| format!("h{}", j + 1));
        let first = ctx
            .non_negative(
                h.first_index,
                &top("host").index(j).key("first_index"),
                "first_index",
            )?
            .unwrap_or(1);
        for k in 0..count {
            let mut m = merge(&dflt, h);
            m.name = Some(if count == 1 && h.first_index.is_none() {
                base_name.clone()
            } else {
                format!("{base_name}{}", first + k)
            });
            templates.push((j, m));
        }
    }
    if templates.len() > 4096 {
        return Err(ctx.invalid(&top("host"), "at most 4096 hosts"));
    }
    let mut seen = std::collections::BTreeSet::new();
    for (j, h) in &templates {
        let name = h.name.as_deref().unwrap_or("");
        if name.is_empty()
            || !name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
        {
            return Err(ctx.invalid(
                &top("host").index(*j).key("name"),
                format!("host name {name:?} must be non-empty and use only letters, digits, '-', '_' and '.'"),
            ));
        }
        if !seen.insert(name.to_string()) {
            return Err(ctx.invalid(
                &top("host").index(*j).key("name"),
                format!("two hosts are named {name:?}; give each host a distinct name"),
            ));
        }
    }

    let reservations = raw.reservations.as_ref();
    let variants: Vec<Option<&RawVariant>> = if raw.variant.is_empty() {
        vec![None]
    } else {
        raw.variant.iter().map(Some).collect()
    };
    let mut groups = Vec::new();
    for (gi, g) in raw.group.iter().enumerate() {
        let gp = |k: &str| top("group").index(gi).key(k);
        if groups.iter().any(|x: &GroupSpec| x.name == g.name) {
            return Err(ctx.invalid(
                &gp("name"),
                format!(
                    "two groups are named {:?}; give each group a distinct name",
                    g.name
                ),
            ));
        }
        let weight = ctx
            .positive(g.weight, &gp("weight"), "the weight")?
            .unwrap_or(1);
        if weight > u64::from(qos_core::config::MAX_WEIGHT) {
            return Err(ctx.invalid(
                &gp("weight"),
                format!("the weight must be 1 ..= {}", qos_core::config::MAX_WEIGHT),
            ));
        }
        groups.push(GroupSpec {
            name: g.name.clone(),
            reservation_iops: ctx.positive(
                g.reservation_iops,
                &gp("reservation_iops"),
                "a reservation",
            )?,
            limit_iops: ctx.positive(g.limit_iops, &gp("limit_iops"), "a limit")?,
            weight: weight as u32,
            burst_iops: ctx.positive(g.burst_iops, &gp("burst_iops"), "a burst")?,
            burst_seconds: ctx.positive(g.burst_seconds, &gp("burst_seconds"), "a burst bucket")?,
        });
    }
    let group_names: Vec<String> = groups.iter().map(|g| g.name.clone()).collect();
    let mut names = std::collections::BTreeSet::new();
    let mut runs = Vec::new();
    for (vi, v) in variants.iter().enumerate() {
        if let Some(v) = v
            && !names.insert(v.name.clone())
        {
            return Err(ctx.invalid(
                &top("variant").index(vi).key("name"),
                format!("two variants are named {:?}", v.name),
            ));
        }
        let hosts = resolve_hosts(
            ctx,
            &templates,
            reservations,
            v.map(|v| (vi, v)),
            capacity_iops,
            &group_names,
        )?;
        runs.push(RunSpec {
            variant: v.map(|v| v.name.clone()),
            hosts,
        });
    }

    let scenario = Scenario {
        name: raw.name.unwrap_or_else(|| default_name.to_string()),
        description: raw.description.unwrap_or_default(),
        file: ctx.file.to_string(),
        seed,
        periods: periods as u32,
        warmup_periods: warmup as u32,
        scale,
        policies,
        target: TargetSpec {
            capacity_iops,
            per_host_max_iops,
            service,
            base_latency: Nanos((base_latency_us * 1000.0).round() as u64),
            half_depth,
            link_bytes_per_s,
            link_command,
            channels_per_host: channels as usize,
            capacity_changes,
        },
        qos,
        pacer,
        runs,
        groups,
    };
    // The core validates the domain and every host; map its refusals to fields.
    let domain = scenario.domain_config(
        1,
        qos_core::TokenMode::Haechi,
        qos_core::ReservationRelease::Paced,
        qos_core::ExcessSharing::Weighted,
    );
    domain.validate().map_err(|e| {
        let field = match e {
            qos_core::ConfigError::Period { .. } => qp("period_ms"),
            qos_core::ConfigError::CheckInterval { .. } => qp("check_interval_us"),
            _ => top("qos"),
        };
        ctx.invalid(&field, e.to_string())
    })?;
    for (gi, g) in scenario.groups.iter().enumerate() {
        if let Err(e) = g.group_config(1).budgets(&domain) {
            let key = match e {
                qos_core::ConfigError::GroupReservationAboveLimit { .. } => "reservation_iops",
                qos_core::ConfigError::BurstSeconds { .. } => "burst_seconds",
                ref e if is_burst_error(e) => "burst_iops",
                _ => "name",
            };
            return Err(ctx.invalid(&top("group").index(gi).key(key), e.to_string()));
        }
    }
    for run in &scenario.runs {
        for (i, h) in run.hosts.iter().enumerate() {
            if let Err(e) = h.host_config(1).budgets(&domain) {
                let j = templates[i].0;
                let key = match e {
                    qos_core::ConfigError::ReservationAboveLimit { .. } => "reservation_iops",
                    qos_core::ConfigError::Weight { .. } => "weight",
                    qos_core::ConfigError::SoftBelowHard { .. }
                    | qos_core::ConfigError::SoftAboveLimit { .. } => "soft_reservation_iops",
                    qos_core::ConfigError::BurstSeconds { .. } => "burst_seconds",
                    ref e if is_burst_error(e) => "burst_iops",
                    _ => "name",
                };
                let mut msg = e.to_string();
                if key == "reservation_iops" {
                    msg.push_str("; lower the reservation or raise the limit");
                }
                return Err(ctx.invalid(&top("host").index(j).key(key), msg));
            }
        }
    }
    Ok(scenario)
}

/// A refusal of a burst's rate (its bucket's has its own key).
fn is_burst_error(e: &qos_core::ConfigError) -> bool {
    use qos_core::ConfigError as E;
    matches!(
        e,
        E::BurstWithoutLimit { .. }
            | E::BurstBelowLimit { .. }
            | E::BurstWithoutSeconds { .. }
            | E::BurstSecondsAlone { .. }
    )
}

fn merge(d: &RawHost, h: &RawHost) -> RawHost {
    RawHost {
        name: h.name.clone(),
        count: h.count,
        first_index: h.first_index,
        machine: h.machine.clone().or_else(|| d.machine.clone()),
        pattern: h.pattern.clone().or_else(|| d.pattern.clone()),
        queue_depth: h.queue_depth.or(d.queue_depth),
        io_kib: h.io_kib.or(d.io_kib),
        read_fraction: h.read_fraction.or(d.read_fraction),
        demand: h.demand.clone().or_else(|| d.demand.clone()),
        cooperative: h.cooperative.or(d.cooperative),
        reservation_iops: h.reservation_iops.or(d.reservation_iops),
        limit_iops: h.limit_iops.or(d.limit_iops),
        reservation_mibps: h.reservation_mibps.or(d.reservation_mibps),
        limit_mibps: h.limit_mibps.or(d.limit_mibps),
        weight: h.weight.or(d.weight),
        start_s: h.start_s.or(d.start_s),
        stop_s: h.stop_s.or(d.stop_s),
        group: h.group.clone().or_else(|| d.group.clone()),
        priority: h.priority.clone().or_else(|| d.priority.clone()),
        soft_reservation_iops: h.soft_reservation_iops.or(d.soft_reservation_iops),
        burst_iops: h.burst_iops.or(d.burst_iops),
        burst_seconds: h.burst_seconds.or(d.burst_seconds),
    }
}

fn resolve_hosts(
    ctx: &Ctx<'_>,
    templates: &[(usize, RawHost)],
    reservations: Option<&RawReservations>,
    variant: Option<(usize, &RawVariant)>,
    capacity_iops: u64,
    group_names: &[String],
) -> Result<Vec<HostSpec>, ScenarioError> {
    let n = templates.len();
    let bursts = variant.is_none_or(|(_, v)| v.burst != Some(false));
    let rp = |k: &str| top("reservations").key(k);
    // Reservations first: demands may depend on them.
    let mut res: Vec<Option<u64>> = vec![None; n];
    let overridden;
    let reservations = match (
        reservations,
        variant.and_then(|(_, v)| v.distribution.clone()),
    ) {
        (Some(r), Some(d)) => {
            overridden = RawReservations {
                distribution: d,
                reserved_fraction: r.reserved_fraction,
                zipf_exponent: r.zipf_exponent,
                groups: r.groups,
                iops: r.iops.clone(),
            };
            Some(&overridden)
        }
        (None, Some(_)) => {
            let (vi, _) = variant.expect("a variant");
            return Err(ctx.invalid(
                &top("variant").index(vi).key("distribution"),
                "a variant can change the distribution only of a [reservations] table; add one",
            ));
        }
        (r, None) => r,
    };
    match reservations {
        None => {}
        Some(r) => {
            let fraction_path = match variant {
                Some((vi, v)) if v.reserved_fraction.is_some() => {
                    top("variant").index(vi).key("reserved_fraction")
                }
                _ => rp("reserved_fraction"),
            };
            let fraction = variant
                .and_then(|(_, v)| v.reserved_fraction)
                .or(r.reserved_fraction);
            let need_fraction = |ctx: &Ctx<'_>| -> Result<f64, ScenarioError> {
                let f = fraction.ok_or_else(|| {
                    ctx.invalid(
                        &top("reservations"),
                        "this distribution needs reserved_fraction (share of C_G reserved, e.g. 0.9)",
                    )
                })?;
                ctx.fraction(f, &fraction_path, "reserved_fraction")
            };
            for (j, h) in templates {
                if h.reservation_iops.is_some() && r.distribution != "explicit" {
                    return Err(ctx.invalid(
                        &top("host").index(*j).key("reservation_iops"),
                        format!("reservations come from [reservations] distribution = {:?}; remove this reservation_iops or use distribution = \"explicit\"", r.distribution),
                    ));
                }
            }
            let reserved = |f: f64| (capacity_iops as f64 * f).floor();
            match r.distribution.as_str() {
                "explicit" => {}
                "uniform" => {
                    let f = need_fraction(ctx)?;
                    let each = (reserved(f) / n as f64).floor() as u64;
                    res = vec![(each > 0).then_some(each); n];
                }
                "zipf" => {
                    let f = need_fraction(ctx)?;
                    let s = r.zipf_exponent.unwrap_or(1.0);
                    if !(0.0..=10.0).contains(&s) {
                        return Err(ctx.invalid(
                            &rp("zipf_exponent"),
                            format!("the Zipf exponent must be 0 ..= 10 (got {s})"),
                        ));
                    }
                    let groups = ctx
                        .positive(r.groups, &rp("groups"), "the number of groups")?
                        .unwrap_or(n as u64) as usize;
                    if groups > n {
                        return Err(ctx.invalid(
                            &rp("groups"),
                            format!("{groups} groups need at least {groups} hosts, but the scenario defines {n}; lower groups or add hosts"),
                        ));
                    }
                    if n % groups != 0 {
                        return Err(ctx.invalid(
                            &rp("groups"),
                            format!("the scenario's {n} hosts do not split evenly into {groups} groups; change groups to a divisor of {n}"),
                        ));
                    }
                    let per = n / groups;
                    let w: Vec<f64> = (1..=groups).map(|k| 1.0 / (k as f64).powf(s)).collect();
                    let sum: f64 = w.iter().sum();
                    for i in 0..n {
                        let g = i / per;
                        let each = (reserved(f) * w[g] / sum / per as f64).floor() as u64;
                        res[i] = (each > 0).then_some(each);
                    }
                }
                "list" => {
                    let list = r.iops.as_ref().ok_or_else(|| {
                        ctx.invalid(
                            &top("reservations"),
                            "distribution = \"list\" needs iops = [ ... ] with one reservation per host (0 for none)",
                        )
                    })?;
                    if list.len() > n {
                        return Err(ctx.invalid(
                            &rp("iops"),
                            format!("reservations.iops lists {} values but the scenario defines only {n} hosts; remove {} values or add hosts", list.len(), list.len() - n),
                        ));
                    }
                    if list.len() < n {
                        return Err(ctx.invalid(
                            &rp("iops"),
                            format!("reservations.iops lists {} values for {n} hosts; give one per host (0 for none)", list.len()),
                        ));
                    }
                    for (i, v) in list.iter().enumerate() {
                        let v = ctx
                            .non_negative(Some(*v), &rp("iops").index(i), "a reservation")?
                            .unwrap_or(0);
                        res[i] = (v > 0).then_some(v);
                    }
                }
                other => {
                    return Err(ctx.invalid(
                        &rp("distribution"),
                        format!("unknown distribution {other:?}; use \"uniform\", \"zipf\", \"list\" or \"explicit\""),
                    ));
                }
            }
        }
    }
    for (i, (j, h)) in templates.iter().enumerate() {
        let p = top("host").index(*j);
        if let Some(v) = ctx.non_negative(
            h.reservation_iops,
            &p.clone().key("reservation_iops"),
            "a reservation",
        )? {
            res[i] = (v > 0).then_some(v);
        }
    }
    let total_reserved: u64 = res.iter().flatten().sum();
    let unreserved = capacity_iops.saturating_sub(total_reserved);

    let mut hosts = Vec::with_capacity(n);
    for (i, (j, h)) in templates.iter().enumerate() {
        let p = |k: &str| top("host").index(*j).key(k);
        let pattern_src = variant
            .and_then(|(_, v)| v.pattern.clone())
            .or(h.pattern.clone());
        let pattern = match pattern_src.as_deref() {
            None => Pattern::Burst,
            Some(s) => Pattern::parse(s).ok_or_else(|| {
                let path = match variant {
                    Some((vi, v)) if v.pattern.is_some() => top("variant").index(vi).key("pattern"),
                    _ => p("pattern"),
                };
                ctx.invalid(
                    &path,
                    format!("unknown request pattern {s:?}; use \"burst\" or \"constant-rate\""),
                )
            })?,
        };
        let queue_depth = ctx
            .positive(h.queue_depth, &p("queue_depth"), "the queue depth")?
            .unwrap_or(match pattern {
                Pattern::Burst => 64,
                Pattern::ConstantRate => 1024,
            });
        if queue_depth > 65_536 {
            return Err(ctx.invalid(&p("queue_depth"), "the queue depth must be at most 65536"));
        }
        let io_kib = ctx
            .positive(h.io_kib, &p("io_kib"), "the I/O size")?
            .unwrap_or(4);
        if io_kib > 16 * 1024 {
            return Err(ctx.invalid(&p("io_kib"), "the I/O size must be at most 16384 KiB"));
        }
        let read_fraction = ctx.fraction(
            h.read_fraction.unwrap_or(1.0),
            &p("read_fraction"),
            "read_fraction",
        )?;
        let demand = match &h.demand {
            None => None,
            Some(RawDemand::Word(w)) if w == "unlimited" => None,
            Some(RawDemand::Word(w)) => {
                return Err(ctx.invalid(
                    &p("demand"),
                    format!("unknown demand {w:?}; use a count per period, \"unlimited\", or {{ of_reservation = .., plus_unreserved = .. }}"),
                ));
            }
            Some(RawDemand::Count(c)) => Some(
                ctx.positive(Some(*c), &p("demand"), "a demand")?
                    .unwrap_or(1),
            ),
            Some(RawDemand::Relative(r)) => {
                let f = r.of_reservation.unwrap_or(0.0);
                if !(0.0..=100.0).contains(&f) {
                    return Err(ctx.invalid(
                        &p("demand").key("of_reservation"),
                        format!("of_reservation must be 0 ..= 100 (got {f})"),
                    ));
                }
                let mut d = (res[i].unwrap_or(0) as f64 * f).floor() as u64;
                if r.plus_unreserved.unwrap_or(false) {
                    d += unreserved;
                }
                if d == 0 {
                    return Err(ctx.invalid(
                        &p("demand"),
                        "this demand works out to 0 I/O per period (no reservation to take a fraction of); give a count instead",
                    ));
                }
                Some(d)
            }
        };
        if pattern == Pattern::ConstantRate && demand.is_none() {
            return Err(ctx.invalid(
                &p("demand"),
                "a constant-rate host needs a finite demand per period (its rate); set demand = <I/O per period>",
            ));
        }
        let weight = ctx
            .positive(h.weight, &p("weight"), "the weight")?
            .unwrap_or(1);
        if weight > u64::from(qos_core::config::MAX_WEIGHT) {
            return Err(ctx.invalid(
                &p("weight"),
                format!("the weight must be 1 ..= {}", qos_core::config::MAX_WEIGHT),
            ));
        }
        let start = ctx.seconds(h.start_s.unwrap_or(0.0), &p("start_s"), "start_s")?;
        let stop = match h.stop_s {
            None => None,
            Some(s) => {
                let t = ctx.seconds(s, &p("stop_s"), "stop_s")?;
                if t <= start {
                    return Err(
                        ctx.invalid(&p("stop_s"), format!("stop_s ({s}) must be after start_s"))
                    );
                }
                Some(t)
            }
        };
        let limit_iops = ctx.positive(h.limit_iops, &p("limit_iops"), "a limit")?;
        let reservation_mibps = ctx.positive(
            h.reservation_mibps,
            &p("reservation_mibps"),
            "a reservation",
        )?;
        if reservation_mibps.is_some() {
            return Err(ctx.invalid(
                &p("reservation_mibps"),
                "bandwidth reservations need a target bandwidth capacity, which the lab does not model yet; reserve IOPS instead",
            ));
        }
        let limit_mibps = ctx.positive(h.limit_mibps, &p("limit_mibps"), "a limit")?;
        let priority = match h.priority.as_deref() {
            None | Some("medium") => qos_core::PriorityClass::Medium,
            Some("low") => qos_core::PriorityClass::Low,
            Some("high") => qos_core::PriorityClass::High,
            Some("urgent") => qos_core::PriorityClass::Urgent,
            Some(other) => {
                return Err(ctx.invalid(
                    &p("priority"),
                    format!("unknown priority {other:?}; use \"low\", \"medium\", \"high\" or \"urgent\""),
                ));
            }
        };
        let soft_reservation_iops = ctx.positive(
            h.soft_reservation_iops,
            &p("soft_reservation_iops"),
            "a soft reservation",
        )?;
        if let Some(g) = &h.group
            && !group_names.iter().any(|n| n == g)
        {
            return Err(ctx.invalid(
                &p("group"),
                format!("unknown group {g:?}; define it in a [[group]] table (name = {g:?})"),
            ));
        }
        let name = h.name.clone().expect("named above");
        hosts.push(HostSpec {
            machine: h.machine.clone().unwrap_or_else(|| name.clone()),
            name,
            pattern,
            queue_depth: queue_depth as u32,
            io_bytes: io_kib * 1024,
            read_fraction,
            demand,
            cooperative: h.cooperative.unwrap_or(false),
            reservation_iops: res[i],
            limit_iops,
            reservation_mibps,
            limit_mibps,
            weight: weight as u32,
            start,
            stop,
            group: h.group.clone(),
            priority,
            soft_reservation_iops,
            burst_iops: ctx
                .positive(h.burst_iops, &p("burst_iops"), "a burst")?
                .filter(|_| bursts),
            burst_seconds: ctx
                .positive(h.burst_seconds, &p("burst_seconds"), "a burst bucket")?
                .filter(|_| bursts),
        });
    }
    Ok(hosts)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINI: &str = r#"
name = "mini"
periods = 3
[target]
capacity_iops = 1000
per_host_max_iops = 400
[reservations]
distribution = "zipf"
reserved_fraction = 0.9
zipf_exponent = 0.6
groups = 2
[[host]]
name = "a"
count = 4
"#;

    #[test]
    fn zipf_groups_get_equal_reservations_within_a_group() {
        let s = Scenario::parse(MINI, "mini.toml", "mini").unwrap();
        let h = &s.runs[0].hosts;
        assert_eq!(h.len(), 4);
        assert_eq!(h[0].name, "a1");
        assert_eq!(h[0].reservation_iops, h[1].reservation_iops);
        assert!(h[0].reservation_iops > h[2].reservation_iops);
        let sum: u64 = h.iter().filter_map(|h| h.reservation_iops).sum();
        assert!((895..=900).contains(&sum), "{sum}");
    }

    #[test]
    fn policies_parse_and_print() {
        for n in Policy::NAMES
            .iter()
            .chain(&["ns-limit+pacing", "weighted/start+pacing"])
        {
            assert_eq!(Policy::parse(n).unwrap().name(), *n);
        }
        assert_eq!(
            Policy::parse("first_come/paced/haechi").unwrap().name(),
            "first_come"
        );
        assert_eq!(
            Policy::parse("first_come/basic/start").unwrap().name(),
            "first_come/start/basic"
        );
        for bad in [
            "fair",
            "haechi",
            "weighted/start/start",
            "weighted/",
            "first_come/fast",
        ] {
            assert!(Policy::parse(bad).is_none(), "{bad}");
        }
        assert_eq!(
            Policy::renamed("haechi+pacing").as_deref(),
            Some("weighted+pacing")
        );
    }

    #[test]
    fn negative_rate_names_line_and_field() {
        let text = MINI.replace("capacity_iops = 1000", "capacity_iops = -5");
        let e = Scenario::parse(&text, "x.toml", "x").unwrap_err();
        assert_eq!(e.field(), Some("target.capacity_iops"));
        assert_eq!(e.line(), Some(5));
        assert!(e.to_string().contains("cannot be negative"), "{e}");
    }

    #[test]
    fn the_automatic_latency_target_is_a_multiple_of_at_least_one_or_off() {
        let with = |v: &str| format!("{MINI}[pacer]\nlatency_target_auto_milli = {v}\n");
        let s = Scenario::parse(MINI, "x.toml", "x").unwrap();
        assert_eq!(
            s.pacer.latency_target_auto_milli, 1500,
            "qos-core's default"
        );
        let s = Scenario::parse(&with("0"), "x.toml", "x").unwrap();
        assert_eq!(s.pacer.latency_target_auto_milli, 0);
        let e = Scenario::parse(&with("500"), "x.toml", "x").unwrap_err();
        assert_eq!(e.field(), Some("pacer.latency_target_auto_milli"));
        assert!(e.to_string().contains("1000 ..= 100000"), "{e}");
    }
}
