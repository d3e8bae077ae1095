//! `[[variant]]`: the runs of a scenario. Without variants there is one run of the
//! scenario's hosts; each variant is a run of the same hosts with its pattern, its
//! reservations' distribution or share, or its bursts changed. This module resolves
//! every run's hosts and says where a variant's change is written.

use super::ScenarioError;
use super::context::{Ctx, top};
use super::hosts::{GroupSpec, HostSpec, RunContext, Template, resolve_host};
use super::raw::{RawReservations, RawVariant};
use super::reservations::reservations;
use crate::locate::FieldPath;

/// One set of hosts to run (the scenario itself, or one of its variants).
#[derive(Debug, Clone, PartialEq)]
pub struct RunSpec {
    pub variant: Option<String>,
    pub hosts: Vec<HostSpec>,
}

fn variant_path(vi: usize, k: &str) -> FieldPath {
    top("variant").index(vi).key(k)
}

/// One run without variants, else one per variant, each name given once.
pub(super) fn resolve_runs(
    ctx: &Ctx<'_>,
    raw_variants: &[RawVariant],
    templates: &[Template],
    reservations: Option<&RawReservations>,
    capacity_iops: u64,
    groups: &[GroupSpec],
) -> Result<Vec<RunSpec>, ScenarioError> {
    let variants: Vec<Option<&RawVariant>> = if raw_variants.is_empty() {
        vec![None]
    } else {
        raw_variants.iter().map(Some).collect()
    };
    let group_names: Vec<String> = groups.iter().map(|g| g.name.clone()).collect();
    let mut names = std::collections::BTreeSet::new();
    let mut runs = Vec::new();
    for (vi, v) in variants.iter().enumerate() {
        if let Some(v) = v
            && !names.insert(v.name.clone())
        {
            return Err(ctx.invalid(
                &variant_path(vi, "name"),
                format!("two variants are named {:?}", v.name),
            ));
        }
        let hosts = run_hosts(
            ctx,
            templates,
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
    Ok(runs)
}

/// The hosts of one run: reservations first (demands may depend on them), then each
/// host.
fn run_hosts(
    ctx: &Ctx<'_>,
    templates: &[Template],
    reservations_table: Option<&RawReservations>,
    variant: Option<(usize, &RawVariant)>,
    capacity_iops: u64,
    group_names: &[String],
) -> Result<Vec<HostSpec>, ScenarioError> {
    let table = reservations_of_run(ctx, reservations_table, variant)?;
    let res = reservations(ctx, templates, table.as_ref(), variant, capacity_iops)?;
    let total_reserved: u64 = res.iter().flatten().sum();
    let run = RunContext {
        variant,
        unreserved: capacity_iops.saturating_sub(total_reserved),
        group_names,
        bursts: variant.is_none_or(|(_, v)| v.burst != Some(false)),
    };
    let mut hosts = Vec::with_capacity(templates.len());
    for (i, template) in templates.iter().enumerate() {
        hosts.push(resolve_host(ctx, template, res[i], &run)?);
    }
    Ok(hosts)
}

/// `[reservations]` as the run sees it: with the variant's `distribution` if it has one
/// (which needs a `[reservations]` table to change).
fn reservations_of_run(
    ctx: &Ctx<'_>,
    table: Option<&RawReservations>,
    variant: Option<(usize, &RawVariant)>,
) -> Result<Option<RawReservations>, ScenarioError> {
    match (table, variant.and_then(|(_, v)| v.distribution.clone())) {
        (Some(r), Some(d)) => Ok(Some(RawReservations {
            distribution: d,
            ..r.clone()
        })),
        (None, Some(_)) => {
            let (vi, _) = variant.expect("a variant");
            Err(ctx.invalid(
                &variant_path(vi, "distribution"),
                "a variant can change the distribution only of a [reservations] table; add one",
            ))
        }
        (r, None) => Ok(r.cloned()),
    }
}

/// The reserved share of the capacity, the variant's if it gives one, and where it is
/// written.
pub(super) fn reserved_fraction(
    variant: Option<(usize, &RawVariant)>,
    r: &RawReservations,
) -> (Option<f64>, FieldPath) {
    match variant {
        Some((vi, v)) if v.reserved_fraction.is_some() => {
            (v.reserved_fraction, variant_path(vi, "reserved_fraction"))
        }
        _ => (
            r.reserved_fraction,
            top("reservations").key("reserved_fraction"),
        ),
    }
}

/// The request pattern the variant gives every host, if it gives one.
pub(super) fn pattern(variant: Option<(usize, &RawVariant)>) -> Option<String> {
    variant.and_then(|(_, v)| v.pattern.clone())
}

/// Where the variant's pattern is written, if it gives one.
pub(super) fn pattern_path(variant: Option<(usize, &RawVariant)>) -> Option<FieldPath> {
    match variant {
        Some((vi, v)) if v.pattern.is_some() => Some(variant_path(vi, "pattern")),
        _ => None,
    }
}
