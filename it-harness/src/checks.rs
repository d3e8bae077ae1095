//! How the tests judge: the acceptance thresholds that hold only on a quiet machine
//! (`NVMF_QOS_ACCEPTANCE=1`, `make accept`) beside the looser bounds that must hold
//! whatever else runs, and refusals of bad RPC input.

use serde_json::Value;

use crate::bdevperf::Bdevperf;
use crate::rpc::RpcError;
use crate::target::Target;

/// Whether the acceptance thresholds are asserted (`NVMF_QOS_ACCEPTANCE=1`).
pub fn acceptance() -> bool {
    std::env::var("NVMF_QOS_ACCEPTANCE").is_ok_and(|v| v == "1")
}

/// Asserts `strict` in acceptance runs (printing what would have failed otherwise) and
/// `loose` always.
pub fn check(strict: bool, loose: bool, what: std::fmt::Arguments<'_>) {
    if acceptance() {
        assert!(strict, "acceptance: {what}");
    } else if !strict {
        println!("  (acceptance would fail: {what})");
    }
    assert!(loose, "{what}");
}

/// The error of call `method` `params`, which must have been refused with `code` and a
/// message that contains `text` (any message when `text` is empty, but never none);
/// printed, and returned for more checks. Panics otherwise.
pub fn refused(
    method: &str,
    params: &Value,
    answer: Result<Value, RpcError>,
    code: i64,
    text: &str,
) -> RpcError {
    match answer {
        Ok(v) => panic!("{method} {params} should have been refused, returned {v}"),
        Err(e) => {
            assert_eq!(e.code, code, "{method} {params}: {e}");
            assert!(
                !e.message.is_empty() && e.message.contains(text),
                "{method} {params}: message {:?} should say {text:?}",
                e.message
            );
            println!("  refused as expected: {method}: {} {}", e.code, e.message);
            e
        }
    }
}

impl Target {
    /// Calls `method`, which must be refused (see [`refused`]).
    pub fn refuse(&mut self, method: &str, params: Value, code: i64, text: &str) -> RpcError {
        let answer = self.rpc(method, params.clone());
        refused(method, &params, answer, code, text)
    }
}

impl Bdevperf {
    /// Calls `method`, which must be refused (see [`refused`]).
    pub fn refuse(&self, method: &str, params: Value, code: i64, text: &str) -> RpcError {
        let answer = self.rpc(method, params.clone(), std::time::Duration::from_secs(30));
        refused(method, &params, answer, code, text)
    }
}
