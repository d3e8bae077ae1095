//! Scenario files: the TOML schema, its validation, and the resolved [`Scenario`] the
//! simulator runs. Every refusal names the file, the line and the field, and says what
//! to change. Figures in a scenario are the operator's (or the paper's) real figures;
//! `scale` divides every rate when simulating (see [`Scenario::scale`]).
//!
//! The schema is documented field by field in `docs/lab.md`; the shipped scenarios in
//! `qos-lab/scenarios/` are commented examples.
//!
//! This module owns the error type, the resolved [`Scenario`] and the order in which a
//! file is resolved; each section of the file has its own room:
//!
//! - `raw`: the file as serde reads it;
//! - `context`: errors that name file, line and field, and the checks of a number;
//! - [`policy`]: the `policies` list;
//! - [`target`]: the `[target]` table;
//! - [`qos`]: the `[qos]` table, and the core's validation of the domain;
//! - [`pacer`]: the `[pacer]` table;
//! - [`hosts`]: the `[[host]]`, `[defaults]` and `[[group]]` tables, and the core's
//!   validation of hosts and groups;
//! - `reservations`: the `[reservations]` table;
//! - [`variants`]: the `[[variant]]` tables, the runs.

use std::path::Path;

use qos_core::{DomainConfig, Rate};
use thiserror::Error;

mod context;
pub mod hosts;
pub mod pacer;
pub mod policy;
pub mod qos;
mod raw;
mod reservations;
pub mod target;
pub mod variants;

pub use hosts::{GroupSpec, HostSpec, Pattern};
pub use pacer::PacerSpec;
pub use policy::{Enforcement, Policy, QosSettings};
pub use qos::QosSpec;
pub use target::{Service, SpeedNoise, TargetSpec};
pub use variants::RunSpec;

use context::{Ctx, top};
use raw::RawScenario;

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
            operating_in_flight_milli: q.operating_in_flight.map(|n| n.saturating_mul(1000)),
            efficiency_milli: q
                .efficiency_milli
                .unwrap_or(DomainConfig::default().efficiency_milli),
            operating_over_circulation: q.over_circulation,
            ..DomainConfig::default()
        }
    }
}

/// The run's own settings: `seed`, `periods`, `warmup_periods` and `scale`.
struct RunSettings {
    seed: u64,
    periods: u64,
    warmup: u64,
    scale: u64,
}

fn resolve_run_settings(raw: &RawScenario, ctx: &Ctx<'_>) -> Result<RunSettings, ScenarioError> {
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
    Ok(RunSettings {
        seed,
        periods,
        warmup,
        scale,
    })
}

/// Resolves the sections in the file's order of concerns (so the first refusal is the
/// same whatever the layout), then lets the core validate the domain, the groups and
/// the hosts.
fn resolve(raw: RawScenario, ctx: &Ctx<'_>, default_name: &str) -> Result<Scenario, ScenarioError> {
    let settings = resolve_run_settings(&raw, ctx)?;
    let policies = policy::resolve_policies(raw.policies.as_ref(), ctx)?;
    let target = target::resolve_target(raw.target, ctx)?;
    let qos = qos::resolve_qos(raw.qos, ctx, target.capacity_iops)?;
    let pacer = pacer::resolve_pacer(raw.pacer, ctx)?;
    let templates = hosts::expand_hosts(ctx, &raw.host, raw.defaults.as_ref())?;
    let groups = hosts::resolve_groups(ctx, &raw.group)?;
    let runs = variants::resolve_runs(
        ctx,
        &raw.variant,
        &templates,
        raw.reservations.as_ref(),
        target.capacity_iops,
        &groups,
    )?;
    let scenario = Scenario {
        name: raw.name.unwrap_or_else(|| default_name.to_string()),
        description: raw.description.unwrap_or_default(),
        file: ctx.file.to_string(),
        seed: settings.seed,
        periods: settings.periods as u32,
        warmup_periods: settings.warmup as u32,
        scale: settings.scale,
        policies,
        target,
        qos,
        pacer,
        runs,
        groups,
    };
    let domain = qos::validate_domain(&scenario, ctx)?;
    hosts::check_groups_with_core(&scenario, &domain, ctx)?;
    hosts::check_hosts_with_core(&scenario, &domain, &templates, ctx)?;
    Ok(scenario)
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
        assert_eq!(s.pacer.latency_target_auto_milli, 0, "qos-core's default");
        let s = Scenario::parse(&with("1500"), "x.toml", "x").unwrap();
        assert_eq!(s.pacer.latency_target_auto_milli, 1500);
        let e = Scenario::parse(&with("500"), "x.toml", "x").unwrap_err();
        assert_eq!(e.field(), Some("pacer.latency_target_auto_milli"));
        assert!(e.to_string().contains("1000 ..= 100000"), "{e}");
    }
}
