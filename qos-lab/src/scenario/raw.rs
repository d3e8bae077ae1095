//! The scenario file as serde reads it: every field optional (defaults are applied when
//! resolving), unknown fields refused. Nothing here is validated; the sibling modules
//! turn these into the resolved specs.

use serde::Deserialize;

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawScenario {
    pub(super) name: Option<String>,
    pub(super) description: Option<String>,
    pub(super) seed: Option<i64>,
    pub(super) periods: Option<i64>,
    pub(super) warmup_periods: Option<i64>,
    pub(super) scale: Option<i64>,
    pub(super) policies: Option<Vec<String>>,
    pub(super) target: Option<RawTarget>,
    pub(super) qos: Option<RawQos>,
    pub(super) pacer: Option<RawPacer>,
    pub(super) reservations: Option<RawReservations>,
    pub(super) defaults: Option<RawHost>,
    #[serde(default)]
    pub(super) host: Vec<RawHost>,
    #[serde(default)]
    pub(super) group: Vec<RawGroup>,
    #[serde(default)]
    pub(super) variant: Vec<RawVariant>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawGroup {
    pub(super) name: String,
    pub(super) reservation_iops: Option<i64>,
    pub(super) limit_iops: Option<i64>,
    pub(super) weight: Option<i64>,
    pub(super) burst_iops: Option<i64>,
    pub(super) burst_seconds: Option<i64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawTarget {
    pub(super) capacity_iops: Option<i64>,
    pub(super) per_host_max_iops: Option<i64>,
    pub(super) service: Option<String>,
    pub(super) base_latency_us: Option<f64>,
    pub(super) half_depth: Option<f64>,
    pub(super) link_gbps: Option<f64>,
    pub(super) link_command_us: Option<f64>,
    pub(super) channels_per_host: Option<i64>,
    pub(super) qos_path_cost_pct: Option<f64>,
    pub(super) speed_noise_min: Option<f64>,
    pub(super) speed_noise_spell_ms: Option<f64>,
    #[serde(default)]
    pub(super) capacity_change: Vec<RawCapChange>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawCapChange {
    pub(super) at_s: f64,
    pub(super) factor: f64,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawQos {
    pub(super) period_ms: Option<i64>,
    pub(super) check_interval_us: Option<i64>,
    pub(super) profiled_iops: Option<i64>,
    pub(super) profiled_stddev_iops: Option<i64>,
    pub(super) estimator: Option<bool>,
    pub(super) ns_limit_iops: Option<i64>,
    pub(super) ns_limit_mibps: Option<i64>,
    pub(super) operating_in_flight: Option<i64>,
    pub(super) efficiency: Option<f64>,
    pub(super) over_circulation: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawPacer {
    pub(super) chunk_kib: Option<i64>,
    pub(super) chunk_auto: Option<bool>,
    pub(super) latency_target_us: Option<i64>,
    pub(super) latency_target_auto_milli: Option<i64>,
    pub(super) link_iops: Option<i64>,
    pub(super) probe_interval_us: Option<i64>,
    pub(super) aimd_interval_us: Option<i64>,
}

#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawReservations {
    pub(super) distribution: String,
    pub(super) reserved_fraction: Option<f64>,
    pub(super) zipf_exponent: Option<f64>,
    pub(super) groups: Option<i64>,
    pub(super) iops: Option<Vec<i64>>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub(super) enum RawDemand {
    Count(i64),
    Word(String),
    Relative(RawRelDemand),
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRelDemand {
    pub(super) of_reservation: Option<f64>,
    pub(super) plus_unreserved: Option<bool>,
}

#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawHost {
    pub(super) name: Option<String>,
    pub(super) count: Option<i64>,
    pub(super) first_index: Option<i64>,
    pub(super) machine: Option<String>,
    pub(super) pattern: Option<String>,
    pub(super) queue_depth: Option<i64>,
    pub(super) io_kib: Option<i64>,
    pub(super) read_fraction: Option<f64>,
    pub(super) demand: Option<RawDemand>,
    pub(super) cooperative: Option<bool>,
    pub(super) reservation_iops: Option<i64>,
    pub(super) limit_iops: Option<i64>,
    pub(super) reservation_mibps: Option<i64>,
    pub(super) limit_mibps: Option<i64>,
    pub(super) weight: Option<i64>,
    pub(super) start_s: Option<f64>,
    pub(super) stop_s: Option<f64>,
    pub(super) group: Option<String>,
    pub(super) priority: Option<String>,
    pub(super) soft_reservation_iops: Option<i64>,
    pub(super) burst_iops: Option<i64>,
    pub(super) burst_seconds: Option<i64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawVariant {
    pub(super) name: String,
    pub(super) pattern: Option<String>,
    pub(super) reserved_fraction: Option<f64>,
    pub(super) distribution: Option<String>,
    /// `false`: the hosts' bursts are left out in this variant.
    pub(super) burst: Option<bool>,
}

/// A `[[host]]` with the `[defaults]` filled in where it leaves a field out.
pub(super) fn merge(d: &RawHost, h: &RawHost) -> RawHost {
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
