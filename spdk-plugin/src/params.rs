//! Parameters of the RPC methods (the contract in `docs/rpc.md`), and their mapping to
//! and from `qos-core`'s configuration. No FFI calls: unit-tested without a running SPDK.
//!
//! Unknown parameters are refused (`deny_unknown_fields`), so a typo is an error, not a
//! silently ignored setting.
//!
//! Domains, hosts and groups are each one field table ([`param_table!`]): a parameter
//! is declared once, with where it goes in the core's configuration, and the
//! `*Params` / `*Update` structs and both directions of the mapping follow from it.

use qos_core::config::BatchSize;
use qos_core::{
    DomainConfig, ExcessSharing, GroupConfig, HostConfig, PriorityClass, ReservationRelease,
    TokenMode,
};
use serde::{Deserialize, Serialize};

use crate::field_table::param_table;

/// Refusals, parameter parsing and name checks are shared with the initiator plugin.
pub use spdk_sys::rpc::{RpcError as Refusal, check_name, code, parse};

param_table! {
    params:
        /// `qos_domain_create` parameters; also what `qos_domain_get` and `save_config`
        /// print.
        #[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
        #[serde(deny_unknown_fields)]
        DomainParams;
    update:
        /// `qos_domain_update` parameters: `name` and whatever changes.
        #[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
        #[serde(deny_unknown_fields)]
        DomainUpdate;
    config: DomainConfig;
    defaults: domain_defaults;
    keys: name;
    fields {
        /// The target's capacity as a starting hint; absent: learned from the target.
        capacity_iops: optional u64 = same(capacity.iops);
        #[serde(default = "domain_defaults::capacity_iops_stddev")]
        capacity_iops_stddev: value u64 = same(capacity.iops_stddev);
        capacity_mibps: optional u64 = same(capacity.mibps);
        #[serde(default = "domain_defaults::capacity_mibps_stddev")]
        capacity_mibps_stddev: value u64 = same(capacity.mibps_stddev);
        per_host_max_iops: optional u64 = same(per_host_max.iops);
        per_host_max_mibps: optional u64 = same(per_host_max.mibps);
        #[serde(default = "domain_defaults::period_ms")]
        period_ms: value u64 = millis(period);
        #[serde(default = "domain_defaults::check_interval_us")]
        check_interval_us: value u64 = micros(check_interval);
        /// With `batch_bytes`, a fixed `global_batch`; neither: automatic.
        batch_ops: optional u64 = by_hand();
        batch_bytes: optional u64 = by_hand();
        #[serde(default = "domain_defaults::estimator")]
        estimator: value bool = same(estimator.enabled);
        #[serde(default = "domain_defaults::estimator_history")]
        estimator_history: value usize = same(estimator.history);
        #[serde(default = "domain_defaults::estimator_increment_milli")]
        estimator_increment_milli: value u64 = same(estimator.increment_milli);
        #[serde(default = "domain_defaults::estimator_probe_backoff")]
        estimator_probe_backoff: value u32 = same(estimator.probe_backoff_max);
        #[serde(default = "domain_defaults::estimator_drop_milli")]
        estimator_drop_milli: value u64 = same(estimator.drop_threshold_milli);
        #[serde(default = "domain_defaults::estimator_hold_milli")]
        estimator_hold_milli: value u64 = same(estimator.hold_milli);
        #[serde(default = "domain_defaults::underuse_periods")]
        underuse_periods: value u32 = same(estimator.underuse_periods);
        #[serde(default = "domain_defaults::mode")]
        mode: value TokenMode = same(mode);
        /// `paced` (default) or `start` (Haechi as published).
        #[serde(default = "domain_defaults::release")]
        release: value ReservationRelease = same(release);
        release_burst_us: optional u64 = opt_micros(release_burst);
        #[serde(default = "domain_defaults::write_weight_milli")]
        write_weight_milli: value u64 = same(cost.write_weight_milli);
        #[serde(default = "domain_defaults::size_unit")]
        size_unit: value u64 = same(cost.size_unit);
        /// `first_come` (default, `ExcessSharing`'s): Haechi's open global pool, deeper
        /// queues get more; `weighted`: the unreserved capacity split by weight among
        /// backlogged hosts and groups (tenant groups need it).
        #[serde(default = "domain_defaults::sharing")]
        sharing: value ExcessSharing = same(sharing);
        /// Efficiency η of the operating point, thousandths (1 ..= 1000, default 970):
        /// the depth curve's point reported in `qos_stats_get`.
        #[serde(default = "domain_defaults::efficiency_milli")]
        efficiency_milli: value u64 = same(efficiency_milli);
        /// The operating point by its depth instead of η: Q*, commands in flight at the
        /// base in thousandths. At most one of this and `operating_latency_us`.
        operating_in_flight_milli: optional u64 = same(operating_in_flight_milli);
        /// The operating point by its latency instead of η: L*, a command's time at the
        /// base in microseconds.
        operating_latency_us: optional u64 = opt_micros(operating_latency);
        /// η over the hosts' circulation (with `sharing` `operating_point`): N*,
        /// commands circulating outside QoS, learned online as the fewest that keep the
        /// target at η of what it does holding nothing (not with `operating_latency_us`).
        #[serde(default = "domain_defaults::operating_over_circulation", skip_serializing_if = "std::ops::Not::not")]
        operating_over_circulation: value bool = same(operating_over_circulation);
        /// Hold nothing (count and account only): an operator's switch in an incident,
        /// and the instrument's "A". Changing only this starts no new period.
        #[serde(default = "domain_defaults::bypass", skip_serializing_if = "std::ops::Not::not")]
        bypass: value bool = same(bypass);
    }
}

impl DomainParams {
    /// The core configuration, refusing what the core refuses.
    pub fn to_config(&self) -> Result<DomainConfig, Refusal> {
        check_name("domain name", &self.name)?;
        let global_batch = match (self.batch_ops, self.batch_bytes) {
            (None, None) => BatchSize::Auto,
            (Some(ops), Some(bytes)) => BatchSize::Fixed { ops, bytes },
            _ => {
                return Err(Refusal::invalid(
                    "give batch_ops and batch_bytes together, or neither (automatic batch)",
                ));
            }
        };
        let mut cfg = DomainConfig {
            global_batch,
            ..DomainConfig::default()
        };
        self.write_fields(&mut cfg);
        cfg.validate()
            .map_err(|e| Refusal::invalid(format!("domain {}: {e}", self.name)))?;
        Ok(cfg)
    }

    /// The parameters that configure `cfg` as domain `name` (inverse of
    /// [`Self::to_config`]): what `qos_domain_get` and `save_config` print.
    pub fn from_config(name: &str, cfg: &DomainConfig) -> DomainParams {
        let mut p = DomainParams::from_fields(name.to_string(), cfg);
        (p.batch_ops, p.batch_bytes) = match cfg.global_batch {
            BatchSize::Auto => (None, None),
            BatchSize::Fixed { ops, bytes } => (Some(ops), Some(bytes)),
        };
        p
    }

    /// These parameters with `u`'s changes applied.
    pub fn updated(&self, u: &DomainUpdate) -> DomainParams {
        let mut p = self.clone();
        // The operating point is given one way: whichever way an update gives replaces
        // the others (η stays as the value the others replace).
        if u.efficiency_milli.is_some() || u.operating_in_flight_milli.is_some() {
            p.operating_latency_us = None;
        }
        if u.efficiency_milli.is_some() || u.operating_latency_us.is_some() {
            p.operating_in_flight_milli = None;
        }
        p.apply_update(u);
        p
    }
}

param_table! {
    params:
        /// `qos_host_set` parameters; also what `qos_host_get` and `save_config` print.
        #[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
        #[serde(deny_unknown_fields)]
        HostParams;
    update:
        /// `qos_host_update` parameters: `domain`, `host_nqn` and whatever changes (a rate
        /// of 0 removes it, a `group` of `""` makes the host a lone host again).
        /// `qos_host_set` replaces every setting; this keeps what it is not given.
        #[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
        #[serde(deny_unknown_fields)]
        HostUpdate;
    config: HostConfig;
    keys: domain, host_nqn;
    fields {
        min_iops: rate u64 = same(reservation.total.iops);
        min_mibps: rate u64 = same(reservation.total.mibps);
        min_read_iops: rate u64 = same(reservation.read.iops);
        min_read_mibps: rate u64 = same(reservation.read.mibps);
        min_write_iops: rate u64 = same(reservation.write.iops);
        min_write_mibps: rate u64 = same(reservation.write.mibps);
        max_iops: rate u64 = same(limit.total.iops);
        max_mibps: rate u64 = same(limit.total.mibps);
        max_read_iops: rate u64 = same(limit.read.iops);
        max_read_mibps: rate u64 = same(limit.read.mibps);
        max_write_iops: rate u64 = same(limit.write.iops);
        max_write_mibps: rate u64 = same(limit.write.mibps);
        weight: optional u32 = weight(weight);
        priority: optional PriorityClass = or_default(priority);
        soft_min_iops: rate u64 = same(soft_reservation.iops);
        soft_min_mibps: rate u64 = same(soft_reservation.mibps);
        /// Tenant group (created by `qos_group_create`); none: a lone host.
        group: hand String = same(group);
        /// Burst above `max_iops` / `max_mibps` on credit earned under them (issue 28).
        burst_iops: rate u64 = same(burst.iops);
        burst_mibps: rate u64 = same(burst.mibps);
        /// How long a full bucket lasts at the burst rate.
        burst_seconds: rate u64 = same(burst.seconds);
    }
}

impl HostParams {
    /// The core's host configuration (validated later against the domain).
    pub fn to_config(&self) -> HostConfig {
        let mut cfg = HostConfig::new(self.host_nqn.clone());
        self.write_fields(&mut cfg);
        cfg
    }

    /// The parameters that configure `cfg` in `domain` (inverse of [`Self::to_config`]).
    pub fn from_config(domain: &str, cfg: &HostConfig) -> HostParams {
        HostParams::from_fields(domain.to_string(), cfg.host_nqn.clone(), cfg)
    }

    /// These parameters with `u`'s changes applied.
    pub fn updated(&self, u: &HostUpdate) -> HostParams {
        let mut p = self.clone();
        p.apply_update(u);
        clear_bucket_without_burst(&mut p.burst_seconds, p.burst_iops, p.burst_mibps);
        match u.group.as_deref() {
            Some("") => p.group = None,
            Some(g) => p.group = Some(g.to_string()),
            None => {}
        }
        p
    }
}

/// An update that clears both burst rates (0) clears the bucket with them, rather than
/// leaving a `burst_seconds` the next validation refuses.
fn clear_bucket_without_burst(seconds: &mut Option<u64>, iops: Option<u64>, mibps: Option<u64>) {
    if iops.is_none() && mibps.is_none() {
        *seconds = None;
    }
}

param_table! {
    params:
        /// `qos_group_create` parameters; also what `qos_group_get` and `save_config`
        /// print.
        #[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
        #[serde(deny_unknown_fields)]
        GroupParams;
    update:
        /// `qos_group_update` parameters: `domain`, `name` and whatever changes (a rate of
        /// 0 removes it).
        #[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
        #[serde(deny_unknown_fields)]
        GroupUpdate;
    config: GroupConfig;
    keys: domain, name;
    fields {
        min_iops: rate u64 = same(reservation.iops);
        min_mibps: rate u64 = same(reservation.mibps);
        max_iops: rate u64 = same(limit.iops);
        max_mibps: rate u64 = same(limit.mibps);
        weight: optional u32 = weight(weight);
        /// Burst above the group's limit on credit it earned under it (issue 28).
        burst_iops: rate u64 = same(burst.iops);
        burst_mibps: rate u64 = same(burst.mibps);
        burst_seconds: rate u64 = same(burst.seconds);
    }
}

impl GroupParams {
    /// The core's group configuration (validated later against the domain).
    pub fn to_config(&self) -> GroupConfig {
        let mut cfg = GroupConfig::new(self.name.clone());
        self.write_fields(&mut cfg);
        cfg
    }

    /// The parameters that configure `cfg` in `domain`.
    pub fn from_config(domain: &str, cfg: &GroupConfig) -> GroupParams {
        GroupParams::from_fields(domain.to_string(), cfg.name.clone(), cfg)
    }

    /// These parameters with `u`'s changes applied (0 clears a rate).
    pub fn updated(&self, u: &GroupUpdate) -> GroupParams {
        let mut p = self.clone();
        p.apply_update(u);
        clear_bucket_without_burst(&mut p.burst_seconds, p.burst_iops, p.burst_mibps);
        p
    }
}

/// `qos_group_delete` parameters.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GroupKey {
    pub domain: String,
    pub name: String,
}

/// `qos_group_get` parameters.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GroupQuery {
    pub domain: String,
    #[serde(default)]
    pub name: Option<String>,
}

/// `qos_host_remove` parameters.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostKey {
    pub domain: String,
    pub host_nqn: String,
}

/// `qos_host_get` parameters.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostQuery {
    pub domain: String,
    #[serde(default)]
    pub host_nqn: Option<String>,
}

/// `qos_bdev_create` parameters; also what `save_config` prints.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BdevParams {
    pub name: String,
    pub base_bdev_name: String,
    pub domain: String,
    pub host_nqn: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uuid: Option<String>,
}

/// Parameters that name one object, or none for all (`*_get`, `*_delete`).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NameQuery {
    #[serde(default)]
    pub name: Option<String>,
}

/// `qos_domain_delete` parameters (`rpc.rs`'s `NameReq`, and spdk-sys's for
/// `qos_bdev_delete`, have this shape): one object's name.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NameParams {
    pub name: String,
}

/// Past periods `qos_stats_get` lists per host when `periods` is not given.
pub const DEFAULT_STATS_PERIODS: usize = 16;

/// `qos_stats_get` parameters.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StatsQuery {
    #[serde(default)]
    pub domain: Option<String>,
    /// How many past periods to list per host (default [`DEFAULT_STATS_PERIODS`]; at
    /// most the monitor's history, 128, are listed: a larger number is not refused).
    #[serde(default)]
    pub periods: Option<usize>,
    /// Only this host (the domain's other hosts are not even looked at).
    #[serde(default)]
    pub host_nqn: Option<String>,
    /// Counters and gauges only, no per-period history (what a scraper reads).
    #[serde(default)]
    pub compact: bool,
    /// Per host only what the cluster agent reads every interval: its counters
    /// (completed work, held time) and its IOPS and MiB/s settings; per domain its
    /// period and capacity estimate (about a fifth of the compact form's bytes a host).
    #[serde(default)]
    pub counters: bool,
}

impl StatsQuery {
    /// How many past periods to list per host, before the history's bound.
    pub fn periods_or_default(&self) -> usize {
        self.periods.unwrap_or(DEFAULT_STATS_PERIODS)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use qos_core::Nanos;
    use serde_json::{Value, json};

    fn domain(v: Value) -> Result<DomainParams, Refusal> {
        parse("qos_domain_create", v)
    }

    #[test]
    fn domain_defaults_follow_the_contract() {
        let p = domain(json!({"name": "d", "capacity_iops": 400000})).unwrap();
        assert_eq!(p.period_ms, 1000);
        assert_eq!(p.check_interval_us, 1000);
        assert!(p.estimator);
        assert_eq!(p.mode, TokenMode::Haechi);
        let c = p.to_config().unwrap();
        assert_eq!(c.period, Nanos::from_secs(1));
        assert_eq!(c.capacity.iops, Some(400000));
        assert_eq!(c.global_batch, BatchSize::Auto);
        // No capacity: learned from the target, with the estimator; without it refused.
        let p = domain(json!({"name": "d"})).unwrap();
        assert_eq!(p.to_config().unwrap().capacity.iops, None);
        assert!(
            !p.to_json()
                .as_object()
                .unwrap()
                .contains_key("capacity_iops")
        );
        let p = domain(json!({"name": "d", "estimator": false})).unwrap();
        let e = p.to_config().unwrap_err();
        assert_eq!(e.code, code::EINVAL);
        assert!(e.message.contains("turn the estimator on"), "{e}");
    }

    #[test]
    fn domain_refusals_name_the_problem() {
        let e = domain(json!({"capacity_iops": 1000})).unwrap_err();
        assert_eq!(e.code, code::EINVAL);
        assert!(e.message.contains("name"), "{e}");
        let e = domain(json!({"name": "d", "capacity_iops": 0})).unwrap();
        assert!(
            e.to_config()
                .unwrap_err()
                .message
                .contains("at least 1 IOPS")
        );
        let e = domain(json!({"name": "d", "capacity_iops": 1, "bogus": 2})).unwrap_err();
        assert!(e.message.contains("bogus"), "{e}");
        let e = domain(json!({"name": "d", "capacity_iops": -5})).unwrap_err();
        assert_eq!(e.code, code::EINVAL);
        let p = domain(json!({"name": "d", "capacity_iops": 1000, "period_ms": 5})).unwrap();
        let e = p.to_config().unwrap_err();
        assert!(e.message.contains("period"), "{e}");
        let p = domain(json!({"name": "d", "capacity_iops": 1000, "batch_ops": 5})).unwrap();
        assert!(p.to_config().unwrap_err().message.contains("batch_bytes"));
        let p = domain(json!({"name": "a b", "capacity_iops": 1000})).unwrap();
        assert!(p.to_config().is_err());
    }

    #[test]
    fn domain_update_changes_only_what_is_given() {
        let p = domain(json!({"name": "d", "capacity_iops": 1000, "capacity_mibps": 50})).unwrap();
        let u: DomainUpdate =
            parse("qos_domain_update", json!({"name": "d", "period_ms": 200})).unwrap();
        let q = p.updated(&u);
        assert_eq!(q.period_ms, 200);
        assert_eq!(q.capacity_mibps, Some(50));
        assert_eq!(q.capacity_iops, Some(1000));
    }

    #[test]
    fn host_update_keeps_what_it_is_not_given() {
        let p: HostParams = parse(
            "qos_host_set",
            json!({"domain": "d", "host_nqn": "h", "min_iops": 100, "max_iops": 500,
                   "weight": 3, "group": "g"}),
        )
        .unwrap();
        let u: HostUpdate = parse(
            "qos_host_update",
            json!({"domain": "d", "host_nqn": "h", "max_iops": 900}),
        )
        .unwrap();
        let q = p.updated(&u);
        assert_eq!(
            (q.min_iops, q.max_iops, q.weight, q.group.as_deref()),
            (Some(100), Some(900), Some(3), Some("g"))
        );
        // 0 clears a rate, "" leaves the group.
        let u: HostUpdate = parse(
            "qos_host_update",
            json!({"domain": "d", "host_nqn": "h", "min_iops": 0, "group": ""}),
        )
        .unwrap();
        let q = p.updated(&u);
        assert_eq!((q.min_iops, q.group), (None, None));
        assert!(parse::<HostUpdate>("qos_host_update", json!({"domain": "d"})).is_err());
    }

    #[test]
    fn a_burst_survives_save_config_and_clearing_its_rates_clears_its_bucket() {
        let set = json!({"domain": "d", "host_nqn": "h", "max_iops": 1000, "burst_iops": 3000,
                         "burst_seconds": 20});
        let p: HostParams = parse("qos_host_set", set.clone()).unwrap();
        // save_config prints from_config of the running configuration; replayed, it is
        // the same call.
        let printed = HostParams::from_config("d", &p.to_config()).to_json();
        assert_eq!(printed["burst_iops"], 3000);
        assert_eq!(printed["burst_seconds"], 20);
        let replayed: HostParams = parse("qos_host_set", printed).unwrap();
        assert_eq!(replayed.to_config().burst, p.to_config().burst);
        let u: HostUpdate = parse(
            "qos_host_update",
            json!({"domain": "d", "host_nqn": "h", "burst_iops": 0}),
        )
        .unwrap();
        let q = p.updated(&u);
        assert_eq!((q.burst_iops, q.burst_seconds), (None, None));
        let g: GroupParams = parse(
            "qos_group_create",
            json!({"domain": "d", "name": "g", "max_mibps": 10, "burst_mibps": 40,
                   "burst_seconds": 5}),
        )
        .unwrap();
        let printed = GroupParams::from_config("d", &g.to_config());
        assert_eq!(
            printed,
            GroupParams {
                weight: Some(1),
                ..g
            }
        );
    }

    #[test]
    fn the_operating_point_is_given_one_way() {
        let p = domain(json!({"name": "d", "operating_in_flight_milli": 40000})).unwrap();
        let c = p.to_config().unwrap();
        assert_eq!(
            c.operating_target(),
            qos_core::depth::OperatingTarget::InFlight(40000)
        );
        let both =
            domain(json!({"name": "d", "operating_in_flight_milli": 4, "operating_latency_us": 5}));
        let e = both.unwrap().to_config().unwrap_err();
        assert!(e.message.contains("not by two"), "{e}");
        let e = domain(json!({"name": "d", "operating_latency_us": 0}))
            .unwrap()
            .to_config()
            .unwrap_err();
        assert!(e.message.contains("above 0"), "{e}");
        // An update by latency replaces the depth; by η, both.
        let u: DomainUpdate = parse(
            "qos_domain_update",
            json!({"name": "d", "operating_latency_us": 50}),
        )
        .unwrap();
        let q = p.updated(&u);
        assert_eq!(
            (q.operating_in_flight_milli, q.operating_latency_us),
            (None, Some(50))
        );
        let u: DomainUpdate = parse(
            "qos_domain_update",
            json!({"name": "d", "efficiency_milli": 800}),
        )
        .unwrap();
        let q = q.updated(&u);
        assert_eq!(
            (q.operating_in_flight_milli, q.operating_latency_us),
            (None, None)
        );
        assert_eq!(q.to_config().unwrap().efficiency_milli, 800);
    }

    #[test]
    fn the_bypass_is_a_boolean_kept_in_save_config_only_when_on() {
        let p: DomainParams = parse("qos_domain_create", json!({"name": "d"})).unwrap();
        assert!(!p.to_config().unwrap().bypass);
        assert!(p.to_json().get("bypass").is_none(), "off is the default");
        let u: DomainUpdate =
            parse("qos_domain_update", json!({"name": "d", "bypass": true})).unwrap();
        let on = p.updated(&u);
        assert!(on.to_config().unwrap().bypass);
        assert_eq!(on.to_json()["bypass"], json!(true));
        let replayed: DomainParams = parse("qos_domain_create", on.to_json()).unwrap();
        assert_eq!(replayed, on, "save_config replays it");
        // Left out: kept; a non-boolean: refused with the parameter's name.
        let u: DomainUpdate =
            parse("qos_domain_update", json!({"name": "d", "period_ms": 500})).unwrap();
        assert!(on.updated(&u).bypass);
        let e = parse::<DomainUpdate>("qos_domain_update", json!({"name": "d", "bypass": "yes"}))
            .unwrap_err();
        assert!(e.message.contains("bypass"), "{e}");
    }

    /// The registry keeps a domain's configuration only: what `qos_domain_get` and
    /// `save_config` print is read off it, and must be what configured it.
    #[test]
    fn a_domain_prints_back_the_parameters_that_configured_it() {
        let every = json!({"name": "d", "capacity_iops": 100000, "capacity_iops_stddev": 5000,
            "capacity_mibps": 2000, "capacity_mibps_stddev": 10, "per_host_max_iops": 60000,
            "per_host_max_mibps": 900, "period_ms": 500, "check_interval_us": 2000,
            "batch_ops": 64, "batch_bytes": 262144, "estimator": false,
            "estimator_history": 7, "estimator_increment_milli": 20,
            "estimator_probe_backoff": 5, "estimator_drop_milli": 60,
            "estimator_hold_milli": 30, "underuse_periods": 9, "mode": "basic",
            "release": "start", "release_burst_us": 3000, "write_weight_milli": 1500,
            "size_unit": 4096, "sharing": "weighted", "efficiency_milli": 800,
            "operating_latency_us": 250, "bypass": true});
        let given = [
            json!({"name": "d"}),
            json!({"name": "d", "operating_in_flight_milli": 40000}),
            every.clone(),
        ];
        for v in given {
            let p = domain(v.clone()).unwrap();
            let printed = DomainParams::from_config("d", &p.to_config().unwrap());
            assert_eq!(printed, p, "{v}");
        }
        let p = domain(every).unwrap();
        assert_eq!(
            DomainParams::from_config("d", &p.to_config().unwrap()).to_json(),
            p.to_json(),
            "every parameter given and printed"
        );
        // A latency beyond the nanosecond clock (584 years) saturates it, and is
        // printed as the largest number.
        let p = domain(json!({"name": "d", "operating_latency_us": u64::MAX})).unwrap();
        let c = p.to_config().unwrap();
        assert_eq!(DomainParams::from_config("d", &c), p);
    }

    #[test]
    fn domain_params_round_trip_through_json() {
        let p = domain(json!({"name": "d", "capacity_iops": 1000, "batch_ops": 4, "batch_bytes": 4096, "mode": "basic"}))
            .unwrap();
        let back: DomainParams = parse("x", p.to_json()).unwrap();
        assert_eq!(back, p);
    }

    #[test]
    fn host_params_map_to_core_and_back() {
        let h: HostParams = parse(
            "qos_host_set",
            json!({"domain": "d", "host_nqn": "nqn.h1", "min_iops": 100, "max_iops": 200,
                   "max_read_mibps": 10, "weight": 3, "priority": "high"}),
        )
        .unwrap();
        let c = h.to_config();
        assert_eq!(c.reservation.total.iops, Some(100));
        assert_eq!(c.limit.read.mibps, Some(10));
        assert_eq!(c.weight, 3);
        assert_eq!(c.priority, PriorityClass::High);
        let back = HostParams::from_config("d", &c);
        assert_eq!(back.to_config(), c);
        let again: HostParams = parse("x", back.to_json()).unwrap();
        assert_eq!(again, back);
    }

    #[test]
    fn host_refuses_unknown_fields_and_bad_priority() {
        let e = parse::<HostParams>(
            "qos_host_set",
            json!({"domain": "d", "host_nqn": "h", "reservation": 1}),
        )
        .unwrap_err();
        assert!(e.message.contains("reservation"), "{e}");
        assert!(
            parse::<HostParams>(
                "qos_host_set",
                json!({"domain": "d", "host_nqn": "h", "priority": "max"})
            )
            .is_err()
        );
    }

    #[test]
    fn names_are_checked() {
        assert!(check_name("bdev name", "qos0").is_ok());
        assert!(check_name("bdev name", "").is_err());
        assert!(check_name("bdev name", &"x".repeat(300)).is_err());
    }
}

// The schema of the `qos_*` methods' parameters, read off the structs above and the
// checks their handlers make: compared with `rpc-scripts/schema/target.json`, which
// `rpc-scripts/tests/test_schema.py` compares with `qos_rpc.py`.
#[cfg(test)]
#[path = "../../rpc-scripts/schema/probe.rs"]
mod schema_probe;

#[cfg(test)]
mod schema {
    use super::schema_probe::{Method, Omitted, check_golden, check_registered, parse_as, render};
    use super::*;
    use qos_core::{Monitor, Nanos};
    use serde_json::{Value, json};

    const NOW: Nanos = Nanos::from_secs(1);

    /// Domains are probed with the largest period and capacities, so that a range is
    /// the parameter's own, not one another parameter's value sets; and with a fixed
    /// batch (`batch_ops` goes with `batch_bytes`).
    fn domain_context() -> Value {
        json!({"name": "d", "capacity_iops": u64::MAX, "capacity_mibps": u64::MAX,
               "period_ms": 60000, "batch_ops": 64, "batch_bytes": 1048576})
    }

    fn monitor(p: &DomainParams) -> Result<Monitor, String> {
        let cfg = p.to_config().map_err(|e| e.message)?;
        Monitor::new(cfg, NOW).map_err(|e| e.to_string())
    }

    /// The domain `d` hosts and groups are probed in: the probing context with
    /// weighted sharing, and a group `g` without rates.
    fn base() -> (DomainParams, Monitor) {
        base_with(domain_context())
    }

    /// [`base`] at a period of 1 s (the default), where hosts and groups are probed:
    /// a burst's bucket is at least one period, and rpc.py's bound is the default's.
    fn base_of_hosts() -> (DomainParams, Monitor) {
        let mut v = domain_context();
        v["period_ms"] = json!(1000);
        base_with(v)
    }

    fn base_with(mut v: Value) -> (DomainParams, Monitor) {
        v["sharing"] = json!("weighted");
        let p: DomainParams = parse_as(&v).expect("base domain");
        let mut m = monitor(&p).expect("base domain");
        let g = GroupParams {
            domain: "d".into(),
            name: "g".into(),
            ..GroupParams::default()
        };
        m.add_group(g.to_config(), NOW).expect("base group");
        (p, m)
    }

    /// The domain `d` the registry would find, or its refusal.
    fn domain_named(name: &str) -> Result<Monitor, String> {
        match name {
            "d" => Ok(base_of_hosts().1),
            _ => Err(format!("unknown QoS domain {name:?}")),
        }
    }

    /// A burst needs a limit and a bucket, and the bucket a burst rate: each is probed
    /// with the others (1 IOPS or MiB/s limits, a 1 s bucket, a 1 IOPS burst).
    trait ProbingBursts {
        fn probing_bursts(self) -> Self;
    }

    impl ProbingBursts for Method {
        fn probing_bursts(self) -> Self {
            self.probing_with("burst_iops", json!({"max_iops": 1, "burst_seconds": 1}))
                .probing_with("burst_mibps", json!({"max_mibps": 1, "burst_seconds": 1}))
                .probing_with("burst_seconds", json!({"max_iops": 1, "burst_iops": 1}))
        }
    }

    fn resolved<T: Serialize>(p: &T) -> Value {
        serde_json::to_value(p).expect("serialisable")
    }

    fn methods() -> Vec<Method> {
        let host = json!({"domain": "d", "host_nqn": "nqn.2014-08.org.example:h1"});
        vec![
            Method::new::<DomainParams>(
                "qos_domain_create",
                "DomainParams",
                domain_context(),
                |v| monitor(&parse_as::<DomainParams>(v)?).map(|_| ()),
                Omitted::Default(Box::new(|v| {
                    parse_as::<DomainParams>(v).expect("minimal call").to_json()
                })),
            )
            .checking_names(),
            Method::new::<DomainUpdate>(
                "qos_domain_update",
                "DomainUpdate",
                domain_context(),
                |v| {
                    let u: DomainUpdate = parse_as(v)?;
                    let (p, mut m) = base();
                    if u.name != p.name {
                        return Err(format!("unknown QoS domain {:?}", u.name));
                    }
                    let cfg = p.updated(&u).to_config().map_err(|e| e.message)?;
                    m.update_domain(cfg, NOW).map_err(|e| e.to_string())
                },
                Omitted::Keep(Box::new(|v| {
                    let (p, _) = base();
                    p.updated(&parse_as(v).expect("minimal call")) == p
                })),
            ),
            Method::query::<NameParams>("qos_domain_delete", "NameReq", json!({"name": "d"})),
            Method::query::<NameQuery>("qos_domain_get", "NameQuery", json!({})),
            Method::new::<HostParams>(
                "qos_host_set",
                "HostParams",
                host.clone(),
                |v| {
                    let h: HostParams = parse_as(v)?;
                    let mut m = domain_named(&h.domain)?;
                    m.add_host(h.to_config(), NOW)
                        .map(|_| ())
                        .map_err(|e| e.to_string())
                },
                Omitted::Default(Box::new(|v| {
                    let h: HostParams = parse_as(v).expect("minimal call");
                    HostParams::from_config(&h.domain, &h.to_config()).to_json()
                })),
            )
            .checking_names()
            .probing_bursts(),
            Method::new::<HostUpdate>(
                "qos_host_update",
                "HostUpdate",
                host.clone(),
                |v| {
                    let u: HostUpdate = parse_as(v)?;
                    let mut m = domain_named(&u.domain)?;
                    // The registry refuses a host that is not configured; here it is.
                    let old = HostConfig::new(u.host_nqn.clone());
                    m.add_host(old.clone(), NOW).map_err(|e| e.to_string())?;
                    let old = HostParams::from_config(&u.domain, &old);
                    m.update_host(old.updated(&u).to_config(), NOW)
                        .map_err(|e| e.to_string())
                },
                Omitted::Keep(Box::new(|v| {
                    let u: HostUpdate = parse_as(v).expect("minimal call");
                    let old =
                        HostParams::from_config(&u.domain, &HostConfig::new(u.host_nqn.clone()));
                    old.updated(&u) == old
                })),
            )
            .checking_names()
            .probing_bursts(),
            Method::query::<HostKey>("qos_host_remove", "HostKey", host),
            Method::query::<HostQuery>("qos_host_get", "HostQuery", json!({"domain": "d"})),
            Method::new::<GroupParams>(
                "qos_group_create",
                "GroupParams",
                json!({"domain": "d", "name": "t"}),
                |v| {
                    let g: GroupParams = parse_as(v)?;
                    let mut m = domain_named(&g.domain)?;
                    m.add_group(g.to_config(), NOW).map_err(|e| e.to_string())
                },
                Omitted::Default(Box::new(|v| {
                    let g: GroupParams = parse_as(v).expect("minimal call");
                    GroupParams::from_config(&g.domain, &g.to_config()).to_json()
                })),
            )
            .checking_names()
            .probing_bursts(),
            Method::new::<GroupUpdate>(
                "qos_group_update",
                "GroupUpdate",
                json!({"domain": "d", "name": "g"}),
                |v| {
                    let u: GroupUpdate = parse_as(v)?;
                    let mut m = domain_named(&u.domain)?;
                    let old = m
                        .group_configs()
                        .find(|g| g.name == u.name)
                        .map(|g| GroupParams::from_config(&u.domain, g))
                        .ok_or_else(|| format!("unknown group {:?}", u.name))?;
                    m.update_group(old.updated(&u).to_config(), NOW)
                        .map_err(|e| e.to_string())
                },
                Omitted::Keep(Box::new(|v| {
                    let u: GroupUpdate = parse_as(v).expect("minimal call");
                    let (_, m) = base();
                    let old = m.group_configs().find(|g| g.name == u.name).expect("g");
                    let old = GroupParams::from_config(&u.domain, old);
                    old.updated(&u) == old
                })),
            )
            .probing_bursts(),
            Method::query::<GroupKey>(
                "qos_group_delete",
                "GroupKey",
                json!({"domain": "d", "name": "g"}),
            ),
            Method::query::<GroupQuery>("qos_group_get", "GroupQuery", json!({"domain": "d"})),
            Method::query::<BdevParams>(
                "qos_bdev_create",
                "BdevParams",
                json!({"name": "q", "base_bdev_name": "b", "domain": "d",
                       "host_nqn": "nqn.2014-08.org.example:h1"}),
            ),
            Method::query::<NameParams>(
                "qos_bdev_delete",
                "vbdev::rpc_delete",
                json!({"name": "q"}),
            ),
            Method::query::<NameQuery>("qos_bdev_get", "NameQuery", json!({})),
            Method::new::<StatsQuery>(
                "qos_stats_get",
                "StatsQuery",
                json!({}),
                |v| parse_as::<StatsQuery>(v).map(|_| ()),
                Omitted::Default(Box::new(|v| {
                    let q: StatsQuery = parse_as(v).expect("minimal call");
                    let mut r = resolved(&q);
                    r["periods"] = json!(q.periods_or_default());
                    r
                })),
            ),
            Method::query::<spdk_sys::rpc::NoParams>("qos_version_get", "rpc::NoParams", json!({})),
        ]
    }

    #[test]
    fn params_schema_matches_rpc_scripts_schema() {
        let methods = methods();
        check_registered(
            include_str!("rpc.rs"),
            &[("registry", include_str!("registry.rs"))],
            &methods,
        );
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../rpc-scripts/schema/target.json");
        check_golden(
            &path,
            &render("spdk-plugin", &methods),
            "SPDK_DIR=/opt/spdk cargo test -p spdk-plugin params_schema",
        );
    }
}
