//! The agent's view of etcd: the few key-value and lease operations it needs
//! ([`Store`]), spoken over etcd's v3 JSON gateway (`/v3/kv/*`, `/v3/lease/*`, part of
//! every etcd server since 3.3) with a blocking HTTP client and short timeouts, so a
//! slow or absent etcd costs the agent a timeout per call and never more.

use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use serde_json::{Value, json};
use thiserror::Error;

/// An etcd lease id.
pub type LeaseId = i64;

/// A call to etcd that did not succeed.
#[derive(Debug, Error)]
pub enum StoreError {
    #[error("etcd at {endpoint} is unreachable: {detail}")]
    Unreachable { endpoint: String, detail: String },
    #[error("etcd at {endpoint} answered {path} with HTTP {status}: {body}")]
    Refused {
        endpoint: String,
        path: String,
        status: u16,
        body: String,
    },
    #[error("etcd at {endpoint} answered {path} with what is not etcd's JSON: {detail}")]
    Malformed {
        endpoint: String,
        path: String,
        detail: String,
    },
}

/// The operations the agent and the admin commands need. Values are UTF-8 JSON.
pub trait Store {
    /// A new lease of `ttl_s` seconds.
    fn grant(&mut self, ttl_s: u64) -> Result<LeaseId, StoreError>;
    /// Renews a lease; `false` when etcd no longer knows it (it expired).
    fn keep_alive(&mut self, lease: LeaseId) -> Result<bool, StoreError>;
    /// Gives a lease up; the keys under it go at once.
    fn revoke(&mut self, lease: LeaseId) -> Result<(), StoreError>;
    /// Writes `key`, under `lease` when given.
    fn put(&mut self, key: &str, value: &str, lease: Option<LeaseId>) -> Result<(), StoreError>;
    /// Writes `key` under `lease` only if it does not exist; `true` when written.
    fn create(&mut self, key: &str, value: &str, lease: LeaseId) -> Result<bool, StoreError>;
    /// Every key starting with `prefix`, with its value, in key order.
    fn list(&mut self, prefix: &str) -> Result<Vec<(String, String)>, StoreError>;
    /// One key's value.
    fn get(&mut self, key: &str) -> Result<Option<String>, StoreError> {
        Ok(self
            .list(key)?
            .into_iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v))
    }
    /// Deletes every key starting with `prefix`.
    fn delete_prefix(&mut self, prefix: &str) -> Result<(), StoreError>;
    /// Deletes one key.
    fn delete(&mut self, key: &str) -> Result<(), StoreError>;
}

/// etcd through its JSON gateway at `endpoint` (`http://127.0.0.1:2379`).
#[derive(Debug)]
pub struct EtcdGateway {
    endpoint: String,
    http: ureq::Agent,
}

impl EtcdGateway {
    /// Calls time out after `timeout`.
    pub fn new(endpoint: &str, timeout: Duration) -> EtcdGateway {
        EtcdGateway {
            endpoint: endpoint.trim_end_matches('/').to_string(),
            http: ureq::AgentBuilder::new().timeout(timeout).build(),
        }
    }

    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    fn call(&self, path: &str, body: Value) -> Result<Value, StoreError> {
        let url = format!("{}{}", self.endpoint, path);
        let resp = match self.http.post(&url).send_json(body) {
            Ok(r) => r,
            Err(ureq::Error::Status(status, r)) => {
                return Err(StoreError::Refused {
                    endpoint: self.endpoint.clone(),
                    path: path.into(),
                    status,
                    body: r.into_string().unwrap_or_default(),
                });
            }
            Err(e) => {
                return Err(StoreError::Unreachable {
                    endpoint: self.endpoint.clone(),
                    detail: e.to_string(),
                });
            }
        };
        // A streaming method (lease keep-alive) answers one JSON object per message.
        let text = resp.into_string().map_err(|e| StoreError::Unreachable {
            endpoint: self.endpoint.clone(),
            detail: e.to_string(),
        })?;
        let first = serde_json::Deserializer::from_str(&text)
            .into_iter::<Value>()
            .next()
            .unwrap_or(Ok(Value::Null));
        first.map_err(|e| self.malformed(path, e.to_string()))
    }

    fn malformed(&self, path: &str, detail: String) -> StoreError {
        StoreError::Malformed {
            endpoint: self.endpoint.clone(),
            path: path.into(),
            detail,
        }
    }

    fn decode(&self, path: &str, v: &Value) -> Result<String, StoreError> {
        let s = v.as_str().unwrap_or("");
        let bytes = B64
            .decode(s)
            .map_err(|e| self.malformed(path, format!("base64: {e}")))?;
        String::from_utf8(bytes).map_err(|e| self.malformed(path, format!("utf-8: {e}")))
    }
}

fn b64(s: &str) -> String {
    B64.encode(s.as_bytes())
}

/// The key just after every key that starts with `prefix` (etcd's `range_end`).
fn prefix_end(prefix: &str) -> String {
    let mut bytes = prefix.as_bytes().to_vec();
    while let Some(last) = bytes.pop() {
        if last < 0xff {
            bytes.push(last + 1);
            return B64.encode(&bytes);
        }
    }
    B64.encode([0u8])
}

/// etcd writes 64-bit integers as JSON strings.
fn int(v: &Value) -> Option<i64> {
    match v {
        Value::String(s) => s.parse().ok(),
        Value::Number(n) => n.as_i64(),
        _ => None,
    }
}

impl Store for EtcdGateway {
    fn grant(&mut self, ttl_s: u64) -> Result<LeaseId, StoreError> {
        let path = "/v3/lease/grant";
        let r = self.call(path, json!({ "TTL": ttl_s.to_string() }))?;
        int(&r["ID"]).ok_or_else(|| self.malformed(path, format!("no lease ID in {r}")))
    }

    fn keep_alive(&mut self, lease: LeaseId) -> Result<bool, StoreError> {
        let r = self.call("/v3/lease/keepalive", json!({ "ID": lease.to_string() }))?;
        Ok(int(&r["result"]["TTL"]).unwrap_or(0) > 0)
    }

    fn revoke(&mut self, lease: LeaseId) -> Result<(), StoreError> {
        match self.call("/v3/lease/revoke", json!({ "ID": lease.to_string() })) {
            Ok(_) => Ok(()),
            // Already gone: what revoking wanted.
            Err(StoreError::Refused { body, .. }) if body.contains("not found") => Ok(()),
            Err(e) => Err(e),
        }
    }

    fn put(&mut self, key: &str, value: &str, lease: Option<LeaseId>) -> Result<(), StoreError> {
        let mut body = json!({ "key": b64(key), "value": b64(value) });
        if let Some(l) = lease {
            body["lease"] = json!(l.to_string());
        }
        self.call("/v3/kv/put", body).map(|_| ())
    }

    fn create(&mut self, key: &str, value: &str, lease: LeaseId) -> Result<bool, StoreError> {
        let body = json!({
            "compare": [{
                "key": b64(key), "result": "EQUAL", "target": "CREATE", "create_revision": "0"
            }],
            "success": [{
                "request_put": { "key": b64(key), "value": b64(value), "lease": lease.to_string() }
            }],
        });
        let r = self.call("/v3/kv/txn", body)?;
        Ok(r["succeeded"].as_bool().unwrap_or(false))
    }

    fn list(&mut self, prefix: &str) -> Result<Vec<(String, String)>, StoreError> {
        let path = "/v3/kv/range";
        let r = self.call(
            path,
            json!({ "key": b64(prefix), "range_end": prefix_end(prefix) }),
        )?;
        let empty = Vec::new();
        let kvs = r["kvs"].as_array().unwrap_or(&empty);
        kvs.iter()
            .map(|kv| {
                Ok((
                    self.decode(path, &kv["key"])?,
                    self.decode(path, &kv["value"])?,
                ))
            })
            .collect()
    }

    fn delete_prefix(&mut self, prefix: &str) -> Result<(), StoreError> {
        self.call(
            "/v3/kv/deleterange",
            json!({ "key": b64(prefix), "range_end": prefix_end(prefix) }),
        )
        .map(|_| ())
    }

    fn delete(&mut self, key: &str) -> Result<(), StoreError> {
        self.call("/v3/kv/deleterange", json!({ "key": b64(key) }))
            .map(|_| ())
    }
}

/// An in-memory [`Store`] with leases on a clock the caller moves
/// ([`MemStore::advance`]): for tests of the agents' rules, deterministic and without
/// etcd, and for the lab's cluster model. `down` makes every call fail as an
/// unreachable etcd would.
#[derive(Debug, Default)]
pub struct MemStore {
    now_ms: u64,
    next_lease: LeaseId,
    /// Lease -> (expiry, ttl).
    leases: std::collections::BTreeMap<LeaseId, (u64, u64)>,
    kv: std::collections::BTreeMap<String, (String, Option<LeaseId>)>,
    pub down: bool,
}

impl MemStore {
    /// Moves the clock; expired leases take their keys with them.
    pub fn advance(&mut self, ms: u64) {
        self.now_ms += ms;
        let now = self.now_ms;
        let dead: Vec<LeaseId> = self
            .leases
            .iter()
            .filter(|(_, (exp, _))| *exp <= now)
            .map(|(&l, _)| l)
            .collect();
        for l in dead {
            self.drop_lease(l);
        }
    }

    fn drop_lease(&mut self, l: LeaseId) {
        self.leases.remove(&l);
        self.kv.retain(|_, (_, lease)| *lease != Some(l));
    }

    fn up(&self) -> Result<(), StoreError> {
        if self.down {
            return Err(StoreError::Unreachable {
                endpoint: "memory".into(),
                detail: "down".into(),
            });
        }
        Ok(())
    }
}

impl Store for MemStore {
    fn grant(&mut self, ttl_s: u64) -> Result<LeaseId, StoreError> {
        self.up()?;
        self.next_lease += 1;
        self.leases
            .insert(self.next_lease, (self.now_ms + ttl_s * 1000, ttl_s));
        Ok(self.next_lease)
    }
    fn keep_alive(&mut self, lease: LeaseId) -> Result<bool, StoreError> {
        self.up()?;
        let now = self.now_ms;
        Ok(match self.leases.get_mut(&lease) {
            Some((exp, ttl)) => {
                *exp = now + *ttl * 1000;
                true
            }
            None => false,
        })
    }
    fn revoke(&mut self, lease: LeaseId) -> Result<(), StoreError> {
        self.up()?;
        self.drop_lease(lease);
        Ok(())
    }
    fn put(&mut self, key: &str, value: &str, lease: Option<LeaseId>) -> Result<(), StoreError> {
        self.up()?;
        self.kv.insert(key.into(), (value.into(), lease));
        Ok(())
    }
    fn create(&mut self, key: &str, value: &str, lease: LeaseId) -> Result<bool, StoreError> {
        self.up()?;
        if self.kv.contains_key(key) {
            return Ok(false);
        }
        self.kv.insert(key.into(), (value.into(), Some(lease)));
        Ok(true)
    }
    fn list(&mut self, prefix: &str) -> Result<Vec<(String, String)>, StoreError> {
        self.up()?;
        Ok(self
            .kv
            .range(prefix.to_string()..)
            .take_while(|(k, _)| k.starts_with(prefix))
            .map(|(k, (v, _))| (k.clone(), v.clone()))
            .collect())
    }
    fn delete_prefix(&mut self, prefix: &str) -> Result<(), StoreError> {
        self.up()?;
        self.kv.retain(|k, _| !k.starts_with(prefix));
        Ok(())
    }
    fn delete(&mut self, key: &str) -> Result<(), StoreError> {
        self.up()?;
        self.kv.remove(key);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_end_is_the_next_key() {
        assert_eq!(B64.decode(prefix_end("/a/")).unwrap(), b"/a0");
        assert_eq!(B64.decode(prefix_end("a\u{7f}")).unwrap(), b"a\x80");
    }

    #[test]
    fn integers_come_as_strings_or_numbers() {
        assert_eq!(int(&json!("42")), Some(42));
        assert_eq!(int(&json!(7)), Some(7));
        assert_eq!(int(&json!(null)), None);
    }

    #[test]
    fn an_absent_etcd_is_reported_by_its_address() {
        // Port 9 (discard) on loopback: nothing listens there in the test machines.
        let mut g = EtcdGateway::new("http://127.0.0.1:9", Duration::from_millis(300));
        let e = g.list("/x/").unwrap_err();
        assert!(matches!(e, StoreError::Unreachable { .. }), "{e}");
        assert!(e.to_string().contains("127.0.0.1:9"), "{e}");
    }
}
