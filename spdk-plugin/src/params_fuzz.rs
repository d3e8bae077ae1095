//! Fuzzing of the `qos_*` methods' parameters (`make fuzz`; a short run in `make test`):
//! mutated JSON-RPC calls go through the same `parse`, the same mapping to the core's
//! configuration and the same `Monitor` calls as the handlers in `registry`, on one
//! domain kept across calls, without SPDK running. Findings are panics: a parser or a
//! check that crashes, a refusal without a message, a refused call that changed the
//! state, or parameters that do not survive their own `save_config` form.
//!
//! [`rpc_session`] and [`saved_config`] are the coverage-guided targets
//! `target_rpc_params` and `saved_config` (`fuzz/libfuzzer`, feature `fuzzing`).

use qos_core::{Monitor, Nanos};
use qos_fuzz::{check_refusal, rpc_seeds, saved_config_calls, session_calls};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use crate::params::{
    BdevParams, DomainParams, DomainUpdate, GroupKey, GroupParams, GroupQuery, GroupUpdate,
    HostKey, HostParams, HostQuery, HostUpdate, NameQuery, Refusal, StatsQuery, parse,
};

/// The calls the fuzzers start from: every method, with every parameter somewhere.
pub fn seeds() -> Vec<Value> {
    rpc_seeds(&[
        (
            "qos_domain_create",
            json!({"name": "d", "capacity_iops": 100000, "capacity_iops_stddev": 5000,
                   "capacity_mibps": 2000, "per_host_max_iops": 60000, "period_ms": 500,
                   "check_interval_us": 1000, "batch_ops": 64, "batch_bytes": 262144,
                   "estimator": true, "mode": "haechi", "release": "paced", "release_burst_us": 2000,
                   "write_weight_milli": 1500, "size_unit": 4096, "sharing": "weighted"}),
        ),
        (
            "qos_domain_update",
            json!({"name": "d", "capacity_iops": 80000, "period_ms": 250, "release": "start",
                   "sharing": "first_come"}),
        ),
        (
            "qos_host_set",
            json!({"domain": "d", "host_nqn": "nqn.2014-08.org.example:h1", "min_iops": 20000,
                   "max_iops": 40000, "min_mibps": 100, "weight": 3, "priority": "high",
                   "soft_min_iops": 25000, "group": "g"}),
        ),
        (
            "qos_host_set",
            json!({"domain": "d", "host_nqn": "nqn.2014-08.org.example:h2",
                   "min_read_iops": 5000, "max_write_iops": 9000, "weight": 1}),
        ),
        (
            "qos_host_update",
            json!({"domain": "d", "host_nqn": "nqn.2014-08.org.example:h2", "max_iops": 0,
                   "min_read_iops": 6000, "group": ""}),
        ),
        (
            "qos_host_remove",
            json!({"domain": "d", "host_nqn": "nqn.2014-08.org.example:h1"}),
        ),
        (
            "qos_group_create",
            json!({"domain": "d", "name": "g", "min_iops": 30000, "max_iops": 50000, "min_mibps": 200,
                   "weight": 2}),
        ),
        (
            "qos_group_update",
            json!({"domain": "d", "name": "g", "max_iops": 0, "weight": 5}),
        ),
        ("qos_group_delete", json!({"domain": "d", "name": "g"})),
        ("qos_group_get", json!({"domain": "d", "name": "g"})),
        (
            "qos_host_get",
            json!({"domain": "d", "host_nqn": "nqn.2014-08.org.example:h1"}),
        ),
        ("qos_domain_get", json!({"name": "d"})),
        (
            "qos_stats_get",
            json!({"domain": "d", "periods": 8, "compact": true, "host_nqn": "nqn.x"}),
        ),
        (
            "qos_bdev_create",
            json!({"name": "qos1", "base_bdev_name": "Malloc0", "domain": "d",
                   "host_nqn": "nqn.2014-08.org.example:h1", "uuid": "0f7c1ad8-4b4d-4a5e-9c7a-1f2e3d4c5b6a"}),
        ),
    ])
}

/// Everything configured in the domain, to compare before and after a refused call.
fn state(d: &Domain) -> String {
    let s = d.monitor.stats(d.now);
    let hosts: Vec<String> = s.hosts.iter().map(|h| format!("{:?}", h.config)).collect();
    let groups: Vec<String> = d
        .monitor
        .group_configs()
        .map(|g| format!("{g:?}"))
        .collect();
    format!("{:?} {hosts:?} {groups:?}", d.params())
}

/// The model's one domain, kept as the registry keeps it: a name and a monitor.
struct Domain {
    name: String,
    monitor: Monitor,
    now: Nanos,
}

impl Domain {
    fn params(&self) -> DomainParams {
        DomainParams::from_config(&self.name, self.monitor.config())
    }
}

fn refused(r: &Refusal) {
    check_refusal(r.code, &r.message);
}

/// Parameters that parse must survive the form `save_config` and `*_get` print them in.
fn round_trip<T: Serialize + DeserializeOwned + PartialEq + std::fmt::Debug>(method: &str, p: &T) {
    let again: Result<T, _> = parse(method, serde_json::to_value(p).expect("serialisable"));
    assert_eq!(
        again.as_ref().ok(),
        Some(p),
        "{method}: its own form does not parse back"
    );
}

/// A domain's printed parameters (`qos_domain_get`, `save_config`, read off its
/// configuration) configure it as it is.
fn replays_as_configured(name: &str, cfg: &qos_core::DomainConfig) {
    let printed = DomainParams::from_config(name, cfg);
    assert_eq!(
        printed.to_config().as_ref().ok(),
        Some(cfg),
        "qos_domain_create: its printed form {printed:?} configures another domain"
    );
}

/// One call `{"method", "params"}`, as the handler would run it. An accepted
/// `qos_domain_create` replaces the model's one domain (the calls after it act on the
/// domain created last, as a saved configuration's hosts follow their domain).
fn call_value(d: &mut Domain, v: &Value) -> &'static str {
    let method = v["method"].as_str().unwrap_or_default().to_string();
    let params = v.get("params").cloned().unwrap_or(Value::Null);
    let before = state(d);
    d.now = d.now.saturating_add(Nanos::from_millis(1));
    let now = d.now;
    let outcome: Result<(), Refusal> = match method.as_str() {
        "qos_domain_create" => parse::<DomainParams>(&method, params).and_then(|p| {
            round_trip(&method, &p);
            let cfg = p.to_config()?;
            let monitor = Monitor::new(cfg, now).map_err(|e| Refusal::invalid(e.to_string()))?;
            replays_as_configured(&p.name, monitor.config());
            *d = Domain {
                name: p.name,
                monitor,
                now,
            };
            Ok(())
        }),
        "qos_domain_update" => parse::<DomainUpdate>(&method, params).and_then(|u| {
            let cfg = d.params().updated(&u).to_config()?;
            d.monitor
                .update_domain(cfg, now)
                .map_err(|e| Refusal::invalid(e.to_string()))?;
            replays_as_configured(&d.name, d.monitor.config());
            Ok(())
        }),
        "qos_host_set" => parse::<HostParams>(&method, params).and_then(|p| {
            round_trip(&method, &p);
            let cfg = p.to_config();
            if d.monitor.host(&p.host_nqn).is_some() {
                d.monitor
                    .update_host(cfg, now)
                    .map_err(|e| Refusal::invalid(e.to_string()))
            } else {
                d.monitor
                    .add_host(cfg, now)
                    .map(|_| ())
                    .map_err(|e| Refusal::invalid(e.to_string()))
            }
        }),
        "qos_host_update" => parse::<HostUpdate>(&method, params).and_then(|u| {
            let old = d
                .monitor
                .host_configs()
                .find(|h| h.host_nqn == u.host_nqn)
                .map(|h| HostParams::from_config(&u.domain, h))
                .ok_or_else(|| Refusal::invalid(format!("no host {:?}", u.host_nqn)))?;
            d.monitor
                .update_host(old.updated(&u).to_config(), now)
                .map_err(|e| Refusal::invalid(e.to_string()))
        }),
        "qos_host_remove" => parse::<HostKey>(&method, params).and_then(|k| {
            d.monitor
                .remove_host(&k.host_nqn, now)
                .map_err(|e| Refusal::invalid(e.to_string()))
        }),
        "qos_group_create" => parse::<GroupParams>(&method, params).and_then(|p| {
            round_trip(&method, &p);
            d.monitor
                .add_group(p.to_config(), now)
                .map_err(|e| Refusal::invalid(e.to_string()))
        }),
        "qos_group_update" => parse::<GroupUpdate>(&method, params).and_then(|u| {
            let old = d
                .monitor
                .group_configs()
                .find(|g| g.name == u.name)
                .map(|g| GroupParams::from_config(&u.domain, g))
                .ok_or_else(|| Refusal::invalid(format!("no group {:?}", u.name)))?;
            d.monitor
                .update_group(old.updated(&u).to_config(), now)
                .map_err(|e| Refusal::invalid(e.to_string()))
        }),
        "qos_group_delete" => parse::<GroupKey>(&method, params).and_then(|k| {
            d.monitor
                .remove_group(&k.name, now)
                .map_err(|e| Refusal::invalid(e.to_string()))
        }),
        "qos_group_get" => parse::<GroupQuery>(&method, params).map(|_| ()),
        "qos_host_get" => parse::<HostQuery>(&method, params).map(|_| ()),
        "qos_domain_get" => parse::<NameQuery>(&method, params).map(|_| ()),
        "qos_stats_get" => parse::<StatsQuery>(&method, params).map(|_| ()),
        "qos_bdev_create" => parse::<BdevParams>(&method, params).map(|p| round_trip(&method, &p)),
        _ => Ok(()),
    };
    match outcome {
        Ok(()) => {
            d.monitor.tick(now);
            let _ = d.monitor.stats(now);
            "accepted"
        }
        Err(r) => {
            refused(&r);
            assert_eq!(
                state(d),
                before,
                "{method}: a refused call changed the domain"
            );
            "refused"
        }
    }
}

fn fresh() -> Domain {
    let params: DomainParams = parse(
        "qos_domain_create",
        json!({"name": "d", "capacity_iops": 100000, "capacity_mibps": 2000,
               "period_ms": 500, "sharing": "weighted"}),
    )
    .expect("seed domain");
    let now = Nanos::from_secs(1);
    let monitor = Monitor::new(params.to_config().expect("seed domain"), now).expect("monitor");
    Domain {
        name: params.name,
        monitor,
        now,
    }
}

/// The coverage-guided target `target_rpc_params`: `input` as one session of calls
/// (see [`qos_fuzz::session_calls`]) on a fresh domain.
pub fn rpc_session(input: &[u8]) {
    let mut d = fresh();
    for v in session_calls(input) {
        call_value(&mut d, &v);
    }
}

/// The target plugin's part of the coverage-guided target `saved_config`: the calls of
/// an SPDK `save_config` document replayed in order on a fresh domain (the bdev layer's
/// own methods, and the initiator's, pass through as unknown).
pub fn saved_config(input: &[u8]) {
    let mut d = fresh();
    for v in saved_config_calls(input) {
        call_value(&mut d, &v);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use qos_fuzz::{check_session_seed, fuzz_rpc, replay_regressions};

    /// One call as the mutation fuzzer makes it (JSON text), as the handler would run it.
    fn call(d: &mut Domain, input: &[u8]) -> &'static str {
        match serde_json::from_slice::<Value>(input) {
            Ok(v) => call_value(d, &v),
            Err(_) => "not JSON",
        }
    }

    #[test]
    fn the_session_seed_is_the_mutation_seeds() {
        check_session_seed("target_rpc_params", &seeds());
    }

    #[test]
    fn fuzz_regressions_stay_fixed() {
        let sessions = replay_regressions("target_rpc_params", rpc_session);
        let configs = replay_regressions("saved_config", saved_config);
        println!("replayed {sessions} RPC sessions and {configs} saved configs that once crashed");
    }

    /// The saved configuration seed starts the fuzzer deep: every call in it accepted.
    #[test]
    fn the_saved_config_seed_replays_its_domain_hosts_and_bdev() {
        let calls = qos_fuzz::saved_config_seed();
        let mut d = fresh();
        let refused: Vec<&Value> = calls
            .iter()
            .filter(|v| call_value(&mut d, v) != "accepted")
            .collect();
        assert!(refused.is_empty(), "refused: {refused:?}");
        assert_eq!(d.name, "d");
        assert!(d.monitor.host("nqn.2014-08.org.example:h1").is_some());
        assert!(calls.iter().any(|v| v["method"] == "qos_bdev_create"));
    }

    #[test]
    fn fuzz_rpc_params() {
        let mut d = fresh();
        let mut n = 0u64;
        fuzz_rpc("target_rpc_params", &seeds(), |input| {
            n += 1;
            // A fresh domain now and then, so states far from the seed are reached from
            // many starting points.
            if n % 512 == 0 {
                d = fresh();
            }
            call(&mut d, input)
        });
    }
}
