//! JSON-RPC calls to SPDK applications, through the workspace's client (`rpc-client`:
//! one Unix-socket connection per call), with the harness's error type.

use std::path::Path;
use std::time::Duration;

use serde_json::Value;

/// A JSON-RPC error from an SPDK application (code 0: the call did not get through).
#[derive(Debug, Clone, PartialEq)]
pub struct RpcError {
    pub code: i64,
    pub message: String,
}

impl std::fmt::Display for RpcError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "JSON-RPC error {}: {}", self.code, self.message)
    }
}

impl From<rpc_client::RpcError> for RpcError {
    fn from(e: rpc_client::RpcError) -> RpcError {
        use rpc_client::RpcError as E;
        let message = match &e {
            E::Connect { source, .. } => format!("connect: {source}"),
            E::Send { source, .. } => format!("send: {source}"),
            E::Closed { .. } => "no response".into(),
            E::Answer { source, .. } => format!("bad response: {source}"),
            E::Unexpected { source, .. } => format!("unexpected result: {source}"),
            E::Refused { message, .. } => message.clone(),
        };
        RpcError {
            code: e.code().unwrap_or(0),
            message,
        }
    }
}

/// Calls `method` on the JSON-RPC server at `sock` (one connection per call);
/// `Value::Null` params are omitted.
pub fn rpc(sock: &Path, method: &str, params: Value, timeout: Duration) -> Result<Value, RpcError> {
    Ok(rpc_client::call(sock, method, params, timeout)?)
}

/// The methods of a subsystem's configuration (`framework_get_config`'s answer), in
/// order.
pub fn config_methods(config: &Value) -> Vec<&str> {
    config
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c["method"].as_str())
        .collect()
}
