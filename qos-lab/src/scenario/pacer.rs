//! `[pacer]`: the Justitia pacer at cooperative initiators, resolved with qos-core's
//! `PacerConfig` defaults and checked as qos-core checks it.

use qos_core::Nanos;

use super::ScenarioError;
use super::context::{Ctx, top};
use super::raw::RawPacer;
use crate::locate::FieldPath;

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

fn pp(k: &str) -> FieldPath {
    top("pacer").key(k)
}

/// `[pacer]`; a field left out takes qos-core's default.
pub(super) fn resolve_pacer(
    pr: Option<RawPacer>,
    ctx: &Ctx<'_>,
) -> Result<PacerSpec, ScenarioError> {
    let pr = pr.unwrap_or_default();
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
    Ok(PacerSpec {
        chunk_bytes: chunk_kib * 1024,
        chunk_auto: pr.chunk_auto.unwrap_or(defaults.chunk_auto),
        latency_target: ctx
            .positive(
                pr.latency_target_us,
                &pp("latency_target_us"),
                "the latency target",
            )?
            .map_or(defaults.latency_target, Nanos::from_micros),
        latency_target_auto_milli: resolve_auto_milli(pr.latency_target_auto_milli, ctx)?,
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
    })
}

/// `latency_target_auto_milli`, checked by qos-core's own check so that the lab and the
/// plugin take the same values.
fn resolve_auto_milli(v: Option<i64>, ctx: &Ctx<'_>) -> Result<u64, ScenarioError> {
    let defaults = qos_core::pacer::PacerConfig::default();
    match ctx.non_negative(
        v,
        &pp("latency_target_auto_milli"),
        "the automatic latency target",
    )? {
        None => Ok(defaults.latency_target_auto_milli),
        Some(m) => {
            qos_core::pacer::PacerConfig {
                latency_target_auto_milli: m,
                ..defaults
            }
            .validate()
            .map_err(|e| ctx.invalid(&pp("latency_target_auto_milli"), e.to_string()))?;
            Ok(m)
        }
    }
}
