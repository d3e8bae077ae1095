//! `[reservations]`: the hosts' reservations spread over the target's capacity
//! (uniform, Zipf, a list, or each host's own `reservation_iops`), for one run.

use super::ScenarioError;
use super::context::{Ctx, top};
use super::hosts::Template;
use super::raw::{RawReservations, RawVariant};
use super::variants;
use crate::locate::FieldPath;

fn rp(k: &str) -> FieldPath {
    top("reservations").key(k)
}

/// The reservation of each host of a run (`None`: no reservation): from the
/// distribution of `[reservations]` if there is one, then from each host's own
/// `reservation_iops`.
pub(super) fn reservations(
    ctx: &Ctx<'_>,
    templates: &[Template],
    reservations: Option<&RawReservations>,
    variant: Option<(usize, &RawVariant)>,
    capacity_iops: u64,
) -> Result<Vec<Option<u64>>, ScenarioError> {
    let mut res = match reservations {
        None => vec![None; templates.len()],
        Some(r) => distribute(ctx, templates, r, variant, capacity_iops)?,
    };
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
    Ok(res)
}

/// The reservations `r`'s distribution gives each host (`None` for all with
/// `explicit`); a host's own `reservation_iops` is refused unless explicit.
fn distribute(
    ctx: &Ctx<'_>,
    templates: &[Template],
    r: &RawReservations,
    variant: Option<(usize, &RawVariant)>,
    capacity_iops: u64,
) -> Result<Vec<Option<u64>>, ScenarioError> {
    let n = templates.len();
    let (fraction, fraction_path) = variants::reserved_fraction(variant, r);
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
        "explicit" => Ok(vec![None; n]),
        "uniform" => {
            let f = need_fraction(ctx)?;
            let each = (reserved(f) / n as f64).floor() as u64;
            Ok(vec![(each > 0).then_some(each); n])
        }
        "zipf" => {
            let f = need_fraction(ctx)?;
            zipf(ctx, r, n, reserved(f))
        }
        "list" => list(ctx, r, n),
        other => Err(ctx.invalid(
            &rp("distribution"),
            format!("unknown distribution {other:?}; use \"uniform\", \"zipf\", \"list\" or \"explicit\""),
        )),
    }
}

/// `reserved` IOPS over `n` hosts in `groups` equal groups, group k getting a share in
/// proportion to 1 / k^s.
fn zipf(
    ctx: &Ctx<'_>,
    r: &RawReservations,
    n: usize,
    reserved: f64,
) -> Result<Vec<Option<u64>>, ScenarioError> {
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
    let mut res = vec![None; n];
    for (i, slot) in res.iter_mut().enumerate() {
        let g = i / per;
        let each = (reserved * w[g] / sum / per as f64).floor() as u64;
        *slot = (each > 0).then_some(each);
    }
    Ok(res)
}

/// `iops = [...]`: one reservation per host, 0 for none.
fn list(ctx: &Ctx<'_>, r: &RawReservations, n: usize) -> Result<Vec<Option<u64>>, ScenarioError> {
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
            format!(
                "reservations.iops lists {} values for {n} hosts; give one per host (0 for none)",
                list.len()
            ),
        ));
    }
    let mut res = vec![None; n];
    for (i, v) in list.iter().enumerate() {
        let v = ctx
            .non_negative(Some(*v), &rp("iops").index(i), "a reservation")?
            .unwrap_or(0);
        res[i] = (v > 0).then_some(v);
    }
    Ok(res)
}
