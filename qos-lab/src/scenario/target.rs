//! `[target]`: the emulated target (its capacity, service distribution, latency, link,
//! channels and background load), resolved with its defaults.

use qos_core::Nanos;

use super::ScenarioError;
use super::context::{Ctx, top};
use super::raw::{RawCapChange, RawTarget};
use crate::locate::FieldPath;

/// Distribution of the work one command costs the target, in units of its mean.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Service {
    Exponential,
    Deterministic,
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
    /// What the QoS path adds to the target's CPU per command, in % of a command's cost
    /// without it (a CPU-bound target then does `1 / (1 + pct / 100)` of its capacity
    /// under a QoS policy, whatever it holds): a profile's figure, 0 by default.
    pub qos_path_cost_pct: f64,
    /// The machine's speed moving on its own (`speed_noise_min`): the lab draws
    /// spells of random length, each at a random factor of C_G (the same draws for
    /// every policy of a run). `None`: a steady machine.
    pub speed_noise: Option<SpeedNoise>,
    /// (time, factor of C_G available to the hosts from then on): background load.
    pub capacity_changes: Vec<(Nanos, f64)>,
}

/// A machine whose speed moves by itself, as the shared test machines do (up to 2x
/// within seconds): spells uniform in `[spell / 6, spell]`, each at a factor of C_G
/// uniform in `[min, 1]`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SpeedNoise {
    pub min: f64,
    pub spell: Nanos,
}

fn tp(k: &str) -> FieldPath {
    top("target").key(k)
}

/// `[target]`, checked field by field in the order of the table.
pub(super) fn resolve_target(
    t: Option<RawTarget>,
    ctx: &Ctx<'_>,
) -> Result<TargetSpec, ScenarioError> {
    let t = t.unwrap_or_default();
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
    let service = resolve_service(t.service.as_deref(), ctx)?;
    let (base_latency, half_depth) = resolve_latency(&t, ctx)?;
    let (link_bytes_per_s, link_command) = resolve_link(&t, ctx)?;
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
    let qos_path_cost_pct = t.qos_path_cost_pct.unwrap_or(0.0);
    if !(0.0..=1000.0).contains(&qos_path_cost_pct) {
        return Err(ctx.invalid(
            &tp("qos_path_cost_pct"),
            format!(
                "the QoS path's cost must be 0 ..= 1000 % of a command's (got {qos_path_cost_pct})"
            ),
        ));
    }
    let capacity_changes = resolve_capacity_changes(&t.capacity_change, ctx)?;
    let speed_noise = resolve_speed_noise(&t, ctx)?;
    if speed_noise.is_some() && !capacity_changes.is_empty() {
        return Err(ctx.invalid(
            &tp("speed_noise_min"),
            "speed noise and [[target.capacity_change]] together are not supported; keep one",
        ));
    }
    Ok(TargetSpec {
        capacity_iops,
        per_host_max_iops,
        service,
        base_latency,
        half_depth,
        link_bytes_per_s,
        link_command,
        channels_per_host: channels as usize,
        qos_path_cost_pct,
        speed_noise,
        capacity_changes,
    })
}

fn resolve_service(service: Option<&str>, ctx: &Ctx<'_>) -> Result<Service, ScenarioError> {
    match service {
        None | Some("exponential") => Ok(Service::Exponential),
        Some("deterministic") => Ok(Service::Deterministic),
        Some(other) => Err(ctx.invalid(
            &tp("service"),
            format!(
                "unknown service distribution {other:?}; use \"exponential\" or \"deterministic\""
            ),
        )),
    }
}

/// `base_latency_us` and `half_depth`.
fn resolve_latency(t: &RawTarget, ctx: &Ctx<'_>) -> Result<(Nanos, f64), ScenarioError> {
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
    Ok((Nanos((base_latency_us * 1000.0).round() as u64), half_depth))
}

/// `link_gbps` (bytes per second) and `link_command_us`, which needs a link.
fn resolve_link(t: &RawTarget, ctx: &Ctx<'_>) -> Result<(Option<u64>, Nanos), ScenarioError> {
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
    Ok((link_bytes_per_s, link_command))
}

/// `speed_noise_min` and `speed_noise_spell_ms` (600 ms by default).
fn resolve_speed_noise(t: &RawTarget, ctx: &Ctx<'_>) -> Result<Option<SpeedNoise>, ScenarioError> {
    let Some(min) = t.speed_noise_min else {
        if t.speed_noise_spell_ms.is_some() {
            return Err(ctx.invalid(
                &tp("speed_noise_spell_ms"),
                "a spell length without speed_noise_min; set both",
            ));
        }
        return Ok(None);
    };
    if !(min > 0.0 && min <= 1.0) {
        return Err(ctx.invalid(
            &tp("speed_noise_min"),
            format!("the slowest speed must be in (0, 1] of C_G (got {min}); 0.5: down to half"),
        ));
    }
    let spell_ms = t.speed_noise_spell_ms.unwrap_or(600.0);
    if !(1.0..=60_000.0).contains(&spell_ms) {
        return Err(ctx.invalid(
            &tp("speed_noise_spell_ms"),
            format!("a spell must be 1 ..= 60000 ms (got {spell_ms})"),
        ));
    }
    Ok(Some(SpeedNoise {
        min,
        spell: Nanos((spell_ms * 1e6) as u64),
    }))
}

/// `[[target.capacity_change]]`, in time order.
fn resolve_capacity_changes(
    changes: &[RawCapChange],
    ctx: &Ctx<'_>,
) -> Result<Vec<(Nanos, f64)>, ScenarioError> {
    let mut capacity_changes = Vec::new();
    for (i, c) in changes.iter().enumerate() {
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
    Ok(capacity_changes)
}
