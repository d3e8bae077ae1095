//! Fuzzing of the `qos_ini_*` methods' parameters (`make fuzz`; a short run in `make
//! test`): mutated JSON-RPC calls through the same `parse` and checks as the handlers,
//! then, for what passes, the token engine and the pacer built from the options (as
//! `state` builds them), and set-options patches applied to the options of a QoS bdev.
//! Findings are panics: a crash, a refusal without a message, options that pass the
//! checks but that the core refuses, or parameters that do not survive their own
//! `save_config` form.

use qos_core::Nanos;
use qos_core::initiator::InitiatorEngine;
use qos_core::pacer::Pacer;
use qos_fuzz::{check_refusal, fuzz_rpc, rpc_seeds};
use serde_json::{Value, json};

use crate::params::{
    BdevOptions, CreateParams, NameParams, NameQuery, PacerOptions, Refusal, SetParams, parse,
};

fn seeds() -> Vec<Value> {
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

fn call(input: &[u8]) -> &'static str {
    let Ok(v) = serde_json::from_slice::<Value>(input) else {
        return "not JSON";
    };
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

#[test]
fn fuzz_ini_rpc_params() {
    fuzz_rpc("ini_rpc_params", &seeds(), call);
}
