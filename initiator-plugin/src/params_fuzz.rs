//! Fuzzing of the `qos_ini_*` methods' parameters (`make fuzz`; a short run in `make
//! test`): mutated JSON-RPC calls through the same `parse` and checks as the handlers,
//! then, for what passes, the token engine and the pacer built from the options (as
//! `state` builds them), and set-options patches applied to the options of a QoS bdev.
//! Findings are panics: a crash, a refusal without a message, options that pass the
//! checks but that the core refuses, or parameters that do not survive their own
//! `save_config` form.
//!
//! [`rpc_session`] and [`saved_config`] are the coverage-guided targets
//! `ini_rpc_params` and `saved_config` (`fuzz/libfuzzer`, feature `fuzzing`).

use qos_core::Nanos;
use qos_core::initiator::InitiatorEngine;
use qos_core::pacer::Pacer;
use qos_fuzz::{check_refusal, rpc_seeds, saved_config_calls, session_calls};
use serde_json::{Value, json};

use crate::params::{
    BdevOptions, CreateParams, NameParams, NameQuery, PacerOptions, Refusal, SetParams, parse,
};

/// The calls the fuzzers start from: every method, with every parameter somewhere.
pub fn seeds() -> Vec<Value> {
    rpc_seeds(&[
        (
            "qos_ini_bdev_create",
            json!({"name": "qi1", "base_bdev_name": "Nvme0n1", "pacer_group": "link0",
                   "token_protocol": true, "pacing": true, "acquire_ops": 256,
                   "acquire_bytes": 16777216, "prefetch_milli": 250,
                   "request_timeout_us": 10000, "retry_after_us": 1000,
                   "refresh_interval_us": 100000, "probe_attempts": 3,
                   "chunk_bytes": 131072, "link_iops": 1000000, "link_mibps": 2800,
                   "latency_target_us": 200, "probe_interval_us": 500, "probe_window": 1000,
                   "aimd_interval_us": 1000, "increase_milli": 20, "latency_idle_us": 100000,
                   "split_always": false,
                   "dirs": true, "dirs_window_us": 10000, "dirs_late_gap_us": 1000,
                   "dirs_recovery_us": 10000, "dirs_reset_us": 100000}),
        ),
        (
            "qos_ini_bdev_set_options",
            json!({"name": "qi1", "acquire_ops": 64, "pacing": false, "chunk_bytes": 65536}),
        ),
        ("qos_ini_bdev_delete", json!({"name": "qi1"})),
        ("qos_ini_bdev_get", json!({"name": "qi1"})),
        ("qos_ini_stats_get", json!({})),
    ])
}

fn refused(r: &Refusal) {
    check_refusal(r.code, &r.message);
}

/// Options that passed the checks must build an engine and a pacer.
fn build(b: &BdevOptions, p: &PacerOptions) {
    let now = Nanos::from_secs(1);
    let _ = InitiatorEngine::new(b.engine_config(), now);
    if let Err(e) = Pacer::new(p.pacer_config(), now) {
        panic!("pacer options passed the checks but the pacer refuses them: {e} ({p:?})");
    }
}

/// One call `{"method", "params"}`, as the handler would run it.
fn call_value(v: &Value) -> &'static str {
    let method = v["method"].as_str().unwrap_or_default().to_string();
    let params = v.get("params").cloned().unwrap_or(Value::Null);
    let outcome: Result<(), Refusal> = match method.as_str() {
        "qos_ini_bdev_create" => parse::<CreateParams>(&method, params).and_then(|c| {
            let again: Result<CreateParams, _> =
                parse(&method, serde_json::to_value(&c).expect("serialisable"));
            assert_eq!(
                again.as_ref().ok(),
                Some(&c),
                "its own form does not parse back"
            );
            let checked = c.check()?;
            let mut p = PacerOptions::default();
            checked.patch.apply_pacer(&mut p);
            build(&checked.bdev, &p);
            Ok(())
        }),
        "qos_ini_bdev_set_options" => parse::<SetParams>(&method, params).and_then(|s| {
            let patch = s.options();
            let (mut b, mut p) = (BdevOptions::default(), PacerOptions::default());
            patch.apply_bdev(&mut b);
            patch.apply_pacer(&mut p);
            b.validate()?;
            p.validate()?;
            build(&b, &p);
            Ok(())
        }),
        "qos_ini_bdev_delete" => parse::<NameParams>(&method, params).map(|_| ()),
        "qos_ini_bdev_get" | "qos_ini_stats_get" => parse::<NameQuery>(&method, params).map(|_| ()),
        _ => Ok(()),
    };
    match outcome {
        Ok(()) => "accepted",
        Err(r) => {
            refused(&r);
            "refused"
        }
    }
}

/// The coverage-guided target `ini_rpc_params`: `input` as one session of calls (see
/// [`qos_fuzz::session_calls`]); each call stands alone, as the initiator's checks keep
/// no state between calls.
pub fn rpc_session(input: &[u8]) {
    for v in session_calls(input) {
        call_value(&v);
    }
}

/// The initiator plugin's part of the coverage-guided target `saved_config`: every call
/// of an SPDK `save_config` document (the target's and the bdev layer's methods pass
/// through as unknown).
pub fn saved_config(input: &[u8]) {
    for v in saved_config_calls(input) {
        call_value(&v);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use qos_fuzz::{check_session_seed, fuzz_rpc, replay_regressions};

    /// One call as the mutation fuzzer makes it (JSON text), as the handler would run it.
    fn call(input: &[u8]) -> &'static str {
        match serde_json::from_slice::<Value>(input) {
            Ok(v) => call_value(&v),
            Err(_) => "not JSON",
        }
    }

    #[test]
    fn the_session_seed_is_the_mutation_seeds() {
        check_session_seed("ini_rpc_params", &seeds());
    }

    #[test]
    fn fuzz_regressions_stay_fixed() {
        let sessions = replay_regressions("ini_rpc_params", rpc_session);
        let configs = replay_regressions("saved_config", saved_config);
        println!("replayed {sessions} RPC sessions and {configs} saved configs that once crashed");
    }

    /// The saved configuration seed starts the fuzzer deep: its QoS bdev accepted.
    #[test]
    fn the_saved_config_seed_creates_its_qos_bdev() {
        let calls = qos_fuzz::saved_config_seed();
        let created: Vec<&str> = calls
            .iter()
            .filter(|v| v["method"] == "qos_ini_bdev_create")
            .map(call_value)
            .collect();
        assert_eq!(created, ["accepted"]);
    }

    #[test]
    fn fuzz_ini_rpc_params() {
        fuzz_rpc("ini_rpc_params", &seeds(), call);
    }
}
