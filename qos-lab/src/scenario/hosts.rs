//! `[[host]]`, `[defaults]` and `[[group]]`: the hosts as the scenario describes them
//! (copies expanded and named, the defaults filled in), each host's fields resolved for
//! one run, the tenant groups, and the core's own validation of every host and group,
//! its refusals mapped to fields. Reservations come from `super::reservations`.

use qos_core::{HostConfig, Nanos, Rate};

use super::context::{Ctx, top};
use super::raw::{RawDemand, RawGroup, RawHost, RawVariant, merge};
use super::{Scenario, ScenarioError, variants};
use crate::locate::FieldPath;

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

/// A host of the scenario before its run is resolved: the index of the `[[host]]` table
/// it comes from (for messages), and its fields with the defaults filled in.
pub(super) type Template = (usize, RawHost);

fn host_path(j: usize, k: &str) -> FieldPath {
    top("host").index(j).key(k)
}

/// Every `[[host]]`, `count` times each, named and with `[defaults]` merged in.
pub(super) fn expand_hosts(
    ctx: &Ctx<'_>,
    raw_hosts: &[RawHost],
    defaults: Option<&RawHost>,
) -> Result<Vec<Template>, ScenarioError> {
    if raw_hosts.is_empty() {
        return Err(ctx.invalid(
            &top("host"),
            "the scenario defines no host; add at least one [[host]] table",
        ));
    }
    let dflt = defaults.cloned().unwrap_or_default();
    if dflt.name.is_some() || dflt.count.is_some() || dflt.first_index.is_some() {
        return Err(ctx.invalid(
            &top("defaults"),
            "[defaults] cannot set name, count or first_index; set them in each [[host]]",
        ));
    }
    let mut templates: Vec<Template> = Vec::new();
    for (j, h) in raw_hosts.iter().enumerate() {
        let count = ctx
            .positive(h.count, &host_path(j, "count"), "count")?
            .unwrap_or(1);
        if count > 1024 {
            return Err(ctx.invalid(&host_path(j, "count"), "at most 1024 copies of one host"));
        }
        let base_name = h.name.clone().unwrap_or_else(|| format!("h{}", j + 1));
        let first = ctx
            .non_negative(h.first_index, &host_path(j, "first_index"), "first_index")?
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
    check_host_names(ctx, &templates)?;
    Ok(templates)
}

/// Every host name is usable in an NQN and given once.
fn check_host_names(ctx: &Ctx<'_>, templates: &[Template]) -> Result<(), ScenarioError> {
    let mut seen = std::collections::BTreeSet::new();
    for (j, h) in templates {
        let name = h.name.as_deref().unwrap_or("");
        if name.is_empty()
            || !name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
        {
            return Err(ctx.invalid(
                &host_path(*j, "name"),
                format!("host name {name:?} must be non-empty and use only letters, digits, '-', '_' and '.'"),
            ));
        }
        if !seen.insert(name.to_string()) {
            return Err(ctx.invalid(
                &host_path(*j, "name"),
                format!("two hosts are named {name:?}; give each host a distinct name"),
            ));
        }
    }
    Ok(())
}

/// A weight: 1 by default, at most the core's `MAX_WEIGHT`.
fn resolve_weight(ctx: &Ctx<'_>, v: Option<i64>, path: &FieldPath) -> Result<u32, ScenarioError> {
    let weight = ctx.positive(v, path, "the weight")?.unwrap_or(1);
    if weight > u64::from(qos_core::config::MAX_WEIGHT) {
        return Err(ctx.invalid(
            path,
            format!("the weight must be 1 ..= {}", qos_core::config::MAX_WEIGHT),
        ));
    }
    Ok(weight as u32)
}

/// Every `[[group]]`, each name given once.
pub(super) fn resolve_groups(
    ctx: &Ctx<'_>,
    raw_groups: &[RawGroup],
) -> Result<Vec<GroupSpec>, ScenarioError> {
    let mut groups = Vec::new();
    for (gi, g) in raw_groups.iter().enumerate() {
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
        let weight = resolve_weight(ctx, g.weight, &gp("weight"))?;
        groups.push(GroupSpec {
            name: g.name.clone(),
            reservation_iops: ctx.positive(
                g.reservation_iops,
                &gp("reservation_iops"),
                "a reservation",
            )?,
            limit_iops: ctx.positive(g.limit_iops, &gp("limit_iops"), "a limit")?,
            weight,
            burst_iops: ctx.positive(g.burst_iops, &gp("burst_iops"), "a burst")?,
            burst_seconds: ctx.positive(g.burst_seconds, &gp("burst_seconds"), "a burst bucket")?,
        });
    }
    Ok(groups)
}

/// What a host's run decides besides its own fields: its reservation, the capacity no
/// host reserved, the groups it may join, and whether bursts are kept.
pub(super) struct RunContext<'a> {
    pub(super) variant: Option<(usize, &'a RawVariant)>,
    pub(super) unreserved: u64,
    pub(super) group_names: &'a [String],
    pub(super) bursts: bool,
}

/// One host of a run, its fields checked in the order of the table.
pub(super) fn resolve_host(
    ctx: &Ctx<'_>,
    (j, h): &Template,
    reservation: Option<u64>,
    run: &RunContext<'_>,
) -> Result<HostSpec, ScenarioError> {
    let j = *j;
    let p = |k: &str| host_path(j, k);
    let pattern = host_pattern(ctx, j, h, run.variant)?;
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
    let demand = host_demand(ctx, j, h, reservation, run.unreserved)?;
    if pattern == Pattern::ConstantRate && demand.is_none() {
        return Err(ctx.invalid(
            &p("demand"),
            "a constant-rate host needs a finite demand per period (its rate); set demand = <I/O per period>",
        ));
    }
    let weight = resolve_weight(ctx, h.weight, &p("weight"))?;
    let (start, stop) = host_times(ctx, j, h)?;
    let rates = host_rates(ctx, j, h)?;
    let priority = host_priority(ctx, j, h)?;
    let soft_reservation_iops = ctx.positive(
        h.soft_reservation_iops,
        &p("soft_reservation_iops"),
        "a soft reservation",
    )?;
    check_group(ctx, j, h, run.group_names)?;
    let name = h.name.clone().expect("named above");
    Ok(HostSpec {
        machine: h.machine.clone().unwrap_or_else(|| name.clone()),
        name,
        pattern,
        queue_depth: queue_depth as u32,
        io_bytes: io_kib * 1024,
        read_fraction,
        demand,
        cooperative: h.cooperative.unwrap_or(false),
        reservation_iops: reservation,
        limit_iops: rates.limit_iops,
        reservation_mibps: rates.reservation_mibps,
        limit_mibps: rates.limit_mibps,
        weight,
        start,
        stop,
        group: h.group.clone(),
        priority,
        soft_reservation_iops,
        burst_iops: ctx
            .positive(h.burst_iops, &p("burst_iops"), "a burst")?
            .filter(|_| run.bursts),
        burst_seconds: ctx
            .positive(h.burst_seconds, &p("burst_seconds"), "a burst bucket")?
            .filter(|_| run.bursts),
    })
}

/// The host's pattern, or its variant's; `burst` by default.
fn host_pattern(
    ctx: &Ctx<'_>,
    j: usize,
    h: &RawHost,
    variant: Option<(usize, &RawVariant)>,
) -> Result<Pattern, ScenarioError> {
    let Some(s) = variants::pattern(variant).or(h.pattern.clone()) else {
        return Ok(Pattern::Burst);
    };
    Pattern::parse(&s).ok_or_else(|| {
        let path = variants::pattern_path(variant).unwrap_or_else(|| host_path(j, "pattern"));
        ctx.invalid(
            &path,
            format!("unknown request pattern {s:?}; use \"burst\" or \"constant-rate\""),
        )
    })
}

/// The host's demand per period: a count, `unlimited` (`None`), or a share of its
/// reservation, plus what no host reserved if asked.
fn host_demand(
    ctx: &Ctx<'_>,
    j: usize,
    h: &RawHost,
    reservation: Option<u64>,
    unreserved: u64,
) -> Result<Option<u64>, ScenarioError> {
    let p = |k: &str| host_path(j, k);
    match &h.demand {
        None => Ok(None),
        Some(RawDemand::Word(w)) if w == "unlimited" => Ok(None),
        Some(RawDemand::Word(w)) => Err(ctx.invalid(
            &p("demand"),
            format!("unknown demand {w:?}; use a count per period, \"unlimited\", or {{ of_reservation = .., plus_unreserved = .. }}"),
        )),
        Some(RawDemand::Count(c)) => Ok(Some(
            ctx.positive(Some(*c), &p("demand"), "a demand")?
                .unwrap_or(1),
        )),
        Some(RawDemand::Relative(r)) => {
            let f = r.of_reservation.unwrap_or(0.0);
            if !(0.0..=100.0).contains(&f) {
                return Err(ctx.invalid(
                    &p("demand").key("of_reservation"),
                    format!("of_reservation must be 0 ..= 100 (got {f})"),
                ));
            }
            let mut d = (reservation.unwrap_or(0) as f64 * f).floor() as u64;
            if r.plus_unreserved.unwrap_or(false) {
                d += unreserved;
            }
            if d == 0 {
                return Err(ctx.invalid(
                    &p("demand"),
                    "this demand works out to 0 I/O per period (no reservation to take a fraction of); give a count instead",
                ));
            }
            Ok(Some(d))
        }
    }
}

/// `start_s` (0 by default) and `stop_s`, which must come after it.
fn host_times(
    ctx: &Ctx<'_>,
    j: usize,
    h: &RawHost,
) -> Result<(Nanos, Option<Nanos>), ScenarioError> {
    let p = |k: &str| host_path(j, k);
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
    Ok((start, stop))
}

/// A host's limits and bandwidth reservation, real figures.
struct HostRates {
    limit_iops: Option<u64>,
    reservation_mibps: Option<u64>,
    limit_mibps: Option<u64>,
}

/// `limit_iops`, and `reservation_mibps` (refused: the lab has no bandwidth capacity)
/// and `limit_mibps`.
fn host_rates(ctx: &Ctx<'_>, j: usize, h: &RawHost) -> Result<HostRates, ScenarioError> {
    let p = |k: &str| host_path(j, k);
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
    Ok(HostRates {
        limit_iops,
        reservation_mibps,
        limit_mibps,
    })
}

/// The host's group, if it names one, is one of the scenario's `[[group]]`s.
fn check_group(
    ctx: &Ctx<'_>,
    j: usize,
    h: &RawHost,
    group_names: &[String],
) -> Result<(), ScenarioError> {
    if let Some(g) = &h.group
        && !group_names.iter().any(|n| n == g)
    {
        return Err(ctx.invalid(
            &host_path(j, "group"),
            format!("unknown group {g:?}; define it in a [[group]] table (name = {g:?})"),
        ));
    }
    Ok(())
}

fn host_priority(
    ctx: &Ctx<'_>,
    j: usize,
    h: &RawHost,
) -> Result<qos_core::PriorityClass, ScenarioError> {
    match h.priority.as_deref() {
        None | Some("medium") => Ok(qos_core::PriorityClass::Medium),
        Some("low") => Ok(qos_core::PriorityClass::Low),
        Some("high") => Ok(qos_core::PriorityClass::High),
        Some("urgent") => Ok(qos_core::PriorityClass::Urgent),
        Some(other) => Err(ctx.invalid(
            &host_path(j, "priority"),
            format!("unknown priority {other:?}; use \"low\", \"medium\", \"high\" or \"urgent\""),
        )),
    }
}

/// The core validates every group against the domain; its refusals are mapped to the
/// group's fields.
pub(super) fn check_groups_with_core(
    scenario: &Scenario,
    domain: &qos_core::DomainConfig,
    ctx: &Ctx<'_>,
) -> Result<(), ScenarioError> {
    for (gi, g) in scenario.groups.iter().enumerate() {
        if let Err(e) = g.group_config(1).budgets(domain) {
            let key = match e {
                qos_core::ConfigError::GroupReservationAboveLimit { .. } => "reservation_iops",
                qos_core::ConfigError::BurstSeconds { .. } => "burst_seconds",
                ref e if is_burst_error(e) => "burst_iops",
                _ => "name",
            };
            return Err(ctx.invalid(&top("group").index(gi).key(key), e.to_string()));
        }
    }
    Ok(())
}

/// The core validates every host of every run against the domain; its refusals are
/// mapped to the fields of the `[[host]]` the host comes from.
pub(super) fn check_hosts_with_core(
    scenario: &Scenario,
    domain: &qos_core::DomainConfig,
    templates: &[Template],
    ctx: &Ctx<'_>,
) -> Result<(), ScenarioError> {
    for run in &scenario.runs {
        for (i, h) in run.hosts.iter().enumerate() {
            if let Err(e) = h.host_config(1).budgets(domain) {
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
                return Err(ctx.invalid(&host_path(j, key), msg));
            }
        }
    }
    Ok(())
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
