//! `[qos]`: the QoS domain's settings (period, check interval, profiled capacity,
//! estimator) and SPDK's namespace limit, resolved with their defaults; and the core's
//! own validation of the resulting domain, its refusals mapped to `[qos]` fields.

use qos_core::{DomainConfig, Nanos};

use super::context::{Ctx, top};
use super::raw::RawQos;
use super::{Scenario, ScenarioError};
use crate::locate::FieldPath;

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
    /// Sharing `operating_point`: N\* (or Q\* at the base without `over_circulation`)
    /// given, in commands; `None`: chosen by η.
    pub operating_in_flight: Option<u64>,
    /// Sharing `operating_point`: η in thousandths (the product's default when absent).
    pub efficiency_milli: Option<u64>,
    /// Sharing `operating_point`: N\* over the hosts' circulation, learned for η
    /// unless given (`operating_over_circulation`).
    pub over_circulation: bool,
}

fn qp(k: &str) -> FieldPath {
    top("qos").key(k)
}

/// `[qos]`; the profiled capacity defaults to the target's `capacity_iops`.
pub(super) fn resolve_qos(
    q: Option<RawQos>,
    ctx: &Ctx<'_>,
    capacity_iops: u64,
) -> Result<QosSpec, ScenarioError> {
    let q = q.unwrap_or_default();
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
    let operating_in_flight = ctx.positive(
        q.operating_in_flight,
        &qp("operating_in_flight"),
        "the operating point's commands in flight",
    )?;
    let efficiency_milli = match q.efficiency {
        None => None,
        Some(e) if e > 0.0 && e <= 1.0 => Some(((e * 1000.0).round() as u64).max(1)),
        Some(e) => {
            return Err(ctx.invalid(
                &qp("efficiency"),
                format!("the efficiency eta must be in (0, 1] (got {e})"),
            ));
        }
    };
    Ok(QosSpec {
        period: Nanos::from_millis(period_ms),
        check_interval: Nanos::from_micros(check_us),
        profiled_iops,
        profiled_stddev_iops: stddev,
        estimator: q.estimator.unwrap_or(false),
        ns_limit_iops,
        ns_limit_mibps,
        operating_in_flight,
        efficiency_milli,
        over_circulation: q.over_circulation.unwrap_or(false),
    })
}

/// The core validates the scenario's domain (unscaled, with the product's defaults);
/// its refusals are mapped to the `[qos]` field they are about. The domain is returned
/// for the core's checks of groups and hosts.
pub(super) fn validate_domain(
    scenario: &Scenario,
    ctx: &Ctx<'_>,
) -> Result<DomainConfig, ScenarioError> {
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
    Ok(domain)
}
