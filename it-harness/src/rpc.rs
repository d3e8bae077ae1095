//! A JSON-RPC client for SPDK applications: one Unix-socket connection per call.

use std::io::{BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};

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

/// Calls `method` on the JSON-RPC server at `sock` (one connection per call);
/// `Value::Null` params are omitted.
pub fn rpc(sock: &Path, method: &str, params: Value, timeout: Duration) -> Result<Value, RpcError> {
    let err = |m: String| RpcError {
        code: 0,
        message: m,
    };
    let mut s = UnixStream::connect(sock).map_err(|e| err(format!("connect: {e}")))?;
    s.set_read_timeout(Some(timeout)).ok();
    let mut req = json!({"jsonrpc": "2.0", "method": method, "id": 1});
    if !params.is_null() {
        req["params"] = params;
    }
    s.write_all(req.to_string().as_bytes())
        .map_err(|e| err(format!("send: {e}")))?;
    let mut de = serde_json::Deserializer::from_reader(BufReader::new(s)).into_iter::<Value>();
    let resp = de
        .next()
        .ok_or_else(|| err("no response".into()))?
        .map_err(|e| err(format!("bad response: {e}")))?;
    if let Some(e) = resp.get("error") {
        return Err(RpcError {
            code: e["code"].as_i64().unwrap_or(0),
            message: e["message"].as_str().unwrap_or("").to_string(),
        });
    }
    Ok(resp.get("result").cloned().unwrap_or(Value::Null))
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
