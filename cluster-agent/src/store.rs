//! The agent's view of etcd: the few key-value and lease operations it needs
//! ([`Store`]), spoken over etcd's v3 JSON gateway (`/v3/kv/*`, `/v3/lease/*`, part of
//! every etcd server since 3.3) with a blocking HTTP client and short timeouts, so a
//! slow or absent etcd costs the agent a timeout per call and never more. Over TLS and
//! with etcd's user authentication when [`EtcdOptions`] say so (`connect`); a refusal
//! that a person can fix (wrong CA, no client certificate, http against https, wrong
//! password, no permission) comes back as its own [`StoreError`] saying what to do.

use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use thiserror::Error;

use crate::connect::{self, ConnectError, Credentials, EtcdOptions};

/// An etcd lease id.
pub type LeaseId = i64;

/// What one etcd request may hold: etcd refuses a request above `--max-request-bytes`
/// (1.5 MiB by default) and a transaction of more than `--max-txn-ops` operations (128
/// by default).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TxnLimit {
    /// Bytes of keys and values, each operation counted [`TxnLimit::OP_OVERHEAD`] more.
    pub max_bytes: usize,
    pub max_ops: usize,
}

impl TxnLimit {
    /// What an operation adds to a request beside its key and value (its protobuf
    /// framing: tags, lengths; a few bytes, counted generously).
    pub const OP_OVERHEAD: usize = 32;

    /// Two thirds of etcd's default request limit (the rest is margin for framing and
    /// for an etcd set lower), and its default operations per transaction.
    pub const ETCD_DEFAULT: TxnLimit = TxnLimit {
        max_bytes: 1 << 20,
        max_ops: 128,
    };

    /// `puts` in order, cut into runs that each fit in one request: a run ends before
    /// the operation that would take it over either limit. A record above `max_bytes`
    /// on its own is a run of its own (etcd may refuse it; nothing smaller can carry
    /// it). Concatenated, the runs are `puts`.
    pub fn batches<'a>(&self, puts: &'a [(String, String)]) -> Vec<&'a [(String, String)]> {
        let mut out = Vec::new();
        let (mut start, mut bytes) = (0, 0);
        for (i, (k, v)) in puts.iter().enumerate() {
            let size = k.len() + v.len() + Self::OP_OVERHEAD;
            let n = i - start;
            if n > 0 && (bytes + size > self.max_bytes || n >= self.max_ops) {
                out.push(&puts[start..i]);
                (start, bytes) = (i, 0);
            }
            bytes += size;
        }
        if start < puts.len() {
            out.push(&puts[start..]);
        }
        out
    }
}

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
    #[error("TLS with etcd at {endpoint} failed: {detail}; {fix}")]
    Tls {
        endpoint: String,
        detail: String,
        fix: &'static str,
    },
    #[error(
        "etcd at {endpoint} closed the connection without an answer ({answer}), as an etcd that serves TLS does to plain HTTP: use --etcd https://... with --etcd-ca (and --etcd-cert/--etcd-key if it checks client certificates)"
    )]
    NeedsTls { endpoint: String, answer: String },
    #[error(
        "etcd at {endpoint} requires authentication ({detail}): give --etcd-user and --etcd-password-file"
    )]
    NeedsAuth { endpoint: String, detail: String },
    #[error(
        "etcd at {endpoint} refused {path} to user {user:?}: {detail}; grant the user's role readwrite on the cluster's prefix (/nvmf-qos/) and the lease permissions"
    )]
    PermissionDenied {
        endpoint: String,
        path: String,
        user: String,
        detail: String,
    },
    #[error(
        "etcd at {endpoint} refused {path}: it checks client certificates and has authentication on, and then its JSON gateway (which the agent speaks) refuses every client certificate with a Common Name (CN), whatever the user and password (etcd's answer: {answer}). Give --etcd-cert a certificate without a CN (e.g. made with `openssl req -subj /O=nvmf-qos`) and authenticate with --etcd-user and --etcd-password-file (docs/cluster.md, \"TLS and authentication\")"
    )]
    CommonNameWithAuth {
        endpoint: String,
        path: String,
        answer: String,
    },
    #[error(transparent)]
    Auth(#[from] AuthError),
}

/// What etcd's gateway answers (HTTP 400) to a client certificate with a Common Name
/// when it checks client certificates and has authentication on (`embed/serve.go`):
/// the CN cannot cross the gateway as the user, so etcd refuses it outright.
const CN_THROUGH_GATEWAY: &str = "CommonName of client sending a request against gateway";

/// Authenticating to etcd (`/v3/auth/authenticate`) did not succeed.
#[derive(Debug, Error)]
pub enum AuthError {
    #[error(
        "etcd at {endpoint} refused user {user:?}: wrong user name or password ({detail}); check --etcd-user and the file of --etcd-password-file"
    )]
    Rejected {
        endpoint: String,
        user: String,
        detail: String,
    },
    #[error("etcd at {endpoint} answered authenticate without a token: {answer}")]
    NoToken { endpoint: String, answer: String },
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
    /// Writes every `(key, value)` of `puts`, without a lease, in one request that etcd
    /// applies whole (a transaction without conditions): a reader sees all of them or
    /// none. The caller keeps the request under etcd's limits ([`TxnLimit`]).
    fn put_all(&mut self, puts: &[(String, String)]) -> Result<(), StoreError>;
    /// Writes `key` under `lease` only if it does not exist; `true` when written.
    fn create(&mut self, key: &str, value: &str, lease: LeaseId) -> Result<bool, StoreError>;
    /// Writes `key` under `lease` when it does not exist or is under `lease` already, in
    /// one request; `false` (nothing written) when another lease holds it: another
    /// agent's, running with the same target name.
    fn claim(&mut self, key: &str, value: &str, lease: LeaseId) -> Result<bool, StoreError>;
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

/// etcd through its JSON gateway at `endpoint` (`http://127.0.0.1:2379`, or
/// `https://...` with the TLS files of [`EtcdOptions`]), authenticated when given a
/// user: the token of `/v3/auth/authenticate` goes in each call's `Authorization`
/// header and is fetched again when etcd no longer accepts it (simple tokens expire
/// after etcd's `--auth-token-ttl` without use, default 300 s; a restart of etcd
/// forgets them all). Given several members' URLs, a call that finds its member
/// unreachable or without a leader (HTTP 503) is tried at the next member, which the
/// gateway then keeps using.
#[derive(Debug)]
pub struct EtcdGateway {
    /// The member calls go to now, one of `endpoints`.
    endpoint: String,
    endpoints: Vec<String>,
    http: ureq::Agent,
    credentials: Option<Credentials>,
    token: Option<String>,
    /// Successful authentications so far (the first, then each refresh).
    authentications: u64,
    /// A client certificate is presented (to tell which refusal a closed connection is).
    client_cert: bool,
}

/// What a refusal of etcd's gateway says about authentication.
#[derive(Debug, PartialEq, Eq)]
enum AuthRefusal {
    /// No token, or one etcd no longer knows: authenticate (again) and retry.
    TokenMissingOrStale,
    PermissionDenied,
    WrongCredentials,
    NotEnabled,
}

fn auth_refusal(body: &str) -> Option<AuthRefusal> {
    // etcd's messages (etcdserver/api/v3rpc/rpctypes), as the gateway passes them on.
    if body.contains("invalid auth token") || body.contains("user name is empty") {
        Some(AuthRefusal::TokenMissingOrStale)
    } else if body.contains("permission denied") {
        Some(AuthRefusal::PermissionDenied)
    } else if body.contains("authentication failed") {
        Some(AuthRefusal::WrongCredentials)
    } else if body.contains("authentication is not enabled") {
        Some(AuthRefusal::NotEnabled)
    } else {
        None
    }
}

/// The rustls error somewhere in `e`'s chain of sources (through `std::io::Error`s,
/// which is how ureq passes TLS failures on).
fn tls_cause<'a>(e: &'a (dyn std::error::Error + 'static)) -> Option<&'a rustls::Error> {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        if let Some(t) = err.downcast_ref::<rustls::Error>() {
            return Some(t);
        }
        if let Some(io) = err.downcast_ref::<std::io::Error>()
            && let Some(inner) = io.get_ref()
            && let Some(t) = tls_cause(inner)
        {
            return Some(t);
        }
        cur = err.source();
    }
    None
}

/// The body of an error answer, also when reading it ends in an error: the gateway
/// sends its errors chunked with HTTP trailers, which ureq's reader refuses after the
/// JSON it needs.
fn error_body(r: ureq::Response) -> String {
    use std::io::Read;
    let mut buf = Vec::new();
    let _ = r.into_reader().take(64 * 1024).read_to_end(&mut buf);
    String::from_utf8_lossy(&buf).into_owned()
}

/// The server closed the connection before answering anything (TLS-only etcd to a plain
/// request, plain etcd to a TLS handshake).
fn closed_without_answer(t: &ureq::Transport) -> bool {
    // ureq says so in a message of its own when the status line never came.
    if t.kind() == ureq::ErrorKind::Io && t.to_string().contains("Unexpected EOF") {
        return true;
    }
    let mut cur: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(t);
    while let Some(err) = cur {
        if let Some(io) = err.downcast_ref::<std::io::Error>()
            && matches!(
                io.kind(),
                std::io::ErrorKind::UnexpectedEof
                    | std::io::ErrorKind::ConnectionReset
                    | std::io::ErrorKind::BrokenPipe
            )
        {
            return true;
        }
        cur = err.source();
    }
    false
}

/// What to do about a failed TLS handshake with etcd.
/// `client_cert`: a client certificate was presented (Go's etcd answers a missing one
/// and an untrusted one with the same alert).
fn tls_fix(e: &rustls::Error, client_cert: bool) -> &'static str {
    use rustls::{AlertDescription as A, CertificateError as C, Error as E};
    match e {
        E::InvalidCertificate(C::UnknownIssuer | C::BadSignature) => {
            "etcd's certificate is not signed by the CA of --etcd-ca: give the CA that signed it (etcd's --cert-file)"
        }
        E::InvalidCertificate(C::NotValidForName | C::NotValidForNameContext { .. }) => {
            "etcd's certificate is not for the host name of --etcd: use a name or address its certificate lists, or reissue it with that one"
        }
        E::InvalidCertificate(C::Expired | C::ExpiredContext { .. } | C::NotValidYet) => {
            "etcd's certificate is outside its validity dates: renew it (or check this machine's clock)"
        }
        E::AlertReceived(
            A::CertificateRequired | A::BadCertificate | A::UnknownCA | A::CertificateUnknown,
        ) if !client_cert => {
            "etcd requires a client certificate (--client-cert-auth): give --etcd-cert and --etcd-key"
        }
        E::AlertReceived(A::BadCertificate | A::UnknownCA | A::CertificateUnknown) => {
            "etcd refused the client certificate: give one signed by etcd's --trusted-ca-file (--etcd-cert and --etcd-key)"
        }
        E::InvalidMessage(_) => {
            "etcd does not speak TLS at this address: use --etcd http://... (and drop the TLS files), or start etcd with --cert-file and --key-file"
        }
        _ => "check --etcd-ca, --etcd-cert and --etcd-key against etcd's TLS settings",
    }
}

impl EtcdGateway {
    /// Plain HTTP, no authentication; calls time out after `timeout`. `endpoint` may
    /// list several members, separated by commas.
    pub fn new(endpoint: &str, timeout: Duration) -> EtcdGateway {
        let endpoints: Vec<String> = endpoint
            .split(',')
            .map(|u| u.trim().trim_end_matches('/').to_string())
            .filter(|u| !u.is_empty())
            .collect();
        EtcdGateway {
            endpoint: endpoints.first().cloned().unwrap_or_default(),
            endpoints,
            http: ureq::AgentBuilder::new().timeout(timeout).build(),
            credentials: None,
            token: None,
            authentications: 0,
            client_cert: false,
        }
    }

    /// The gateway `opts` describe, its files read and checked now; no call is made
    /// (the first call authenticates, when a user is given).
    pub fn connect(opts: &EtcdOptions) -> Result<EtcdGateway, ConnectError> {
        let http = connect::http_agent(opts)?;
        let credentials = connect::credentials(opts)?;
        if credentials.is_some() && !connect::is_tls(&opts.endpoint)? {
            tracing::warn!(
                endpoint = opts.endpoint,
                "the etcd password goes over plain http: use https:// outside a test"
            );
        }
        let endpoints = connect::endpoints(&opts.endpoint)?;
        Ok(EtcdGateway {
            endpoint: endpoints[0].clone(),
            endpoints,
            http,
            credentials,
            token: None,
            authentications: 0,
            client_cert: opts.cert.is_some(),
        })
    }

    /// The member calls go to now.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// Every member's URL, as given.
    pub fn endpoints(&self) -> &[String] {
        &self.endpoints
    }

    /// How many times this gateway authenticated (0 without a user).
    pub fn authentications(&self) -> u64 {
        self.authentications
    }

    /// Fetches a token for the credentials; `None` when etcd has authentication off
    /// (calls then go without one, and authenticate again once etcd asks for one).
    fn authenticate(&mut self) -> Result<Option<String>, StoreError> {
        let Some(c) = &self.credentials else {
            return Ok(None);
        };
        let (user, body) = (
            c.user.clone(),
            json!({ "name": c.user, "password": c.password }),
        );
        let path = "/v3/auth/authenticate";
        let r: Value = match self.post(path, body, None) {
            Ok(r) => r,
            Err(StoreError::Refused { body, .. }) => {
                return match auth_refusal(&body) {
                    Some(AuthRefusal::NotEnabled) => {
                        tracing::warn!(
                            endpoint = self.endpoint,
                            "etcd has authentication off: calls go without a token"
                        );
                        Ok(None)
                    }
                    _ => Err(AuthError::Rejected {
                        endpoint: self.endpoint.clone(),
                        user,
                        detail: body,
                    }
                    .into()),
                };
            }
            Err(e) => return Err(e),
        };
        let Some(token) = r["token"].as_str() else {
            return Err(AuthError::NoToken {
                endpoint: self.endpoint.clone(),
                answer: r.to_string(),
            }
            .into());
        };
        self.authentications += 1;
        tracing::debug!(endpoint = self.endpoint, user, "authenticated to etcd");
        Ok(Some(token.to_string()))
    }

    /// A call at the member in use, then at each other member in turn while the
    /// answer says the member cannot serve it (see [`EtcdGateway`]).
    fn call<T: DeserializeOwned>(&mut self, path: &str, body: Value) -> Result<T, StoreError> {
        let first = self.call_here(path, body.clone());
        if !member_cannot_serve(&first) || self.endpoints.len() < 2 {
            return first;
        }
        let was = self.endpoint.clone();
        let at = self.endpoints.iter().position(|e| *e == was).unwrap_or(0);
        for k in 1..self.endpoints.len() {
            self.endpoint = self.endpoints[(at + k) % self.endpoints.len()].clone();
            // A simple token is known only to the member that issued it.
            self.token = None;
            let r = self.call_here(path, body.clone());
            if !member_cannot_serve(&r) {
                tracing::info!("etcd: {was} does not serve; now using {}", self.endpoint);
                return r;
            }
        }
        self.endpoint = was;
        first
    }

    fn call_here<T: DeserializeOwned>(&mut self, path: &str, body: Value) -> Result<T, StoreError> {
        if self.credentials.is_some() && self.token.is_none() {
            self.token = self.authenticate()?;
        }
        let first = self.post(path, body.clone(), self.token.as_deref());
        let refusal = match &first {
            Err(StoreError::Refused { body, .. }) => auth_refusal(body),
            _ => None,
        };
        match refusal {
            Some(AuthRefusal::TokenMissingOrStale) if self.credentials.is_some() => {
                tracing::debug!(
                    endpoint = self.endpoint,
                    path,
                    "etcd no longer accepts the token: authenticating again"
                );
                self.token = self.authenticate()?;
                let again = self.post(path, body, self.token.as_deref());
                self.explain(path, again)
            }
            _ => self.explain(path, first),
        }
    }

    /// Turns a refusal about authentication into the error that says what to do.
    fn explain<T>(&self, path: &str, r: Result<T, StoreError>) -> Result<T, StoreError> {
        let Err(StoreError::Refused { body, .. }) = &r else {
            return r;
        };
        match auth_refusal(body) {
            Some(AuthRefusal::TokenMissingOrStale) => Err(StoreError::NeedsAuth {
                endpoint: self.endpoint.clone(),
                detail: body.clone(),
            }),
            Some(AuthRefusal::PermissionDenied) => Err(StoreError::PermissionDenied {
                endpoint: self.endpoint.clone(),
                path: path.into(),
                user: self
                    .credentials
                    .as_ref()
                    .map_or_else(String::new, |c| c.user.clone()),
                detail: body.clone(),
            }),
            _ => r,
        }
    }

    /// One POST to the gateway; its answer read into `T` (a `Value`, or a type that
    /// reads only what the caller needs: [`Range`]).
    fn post<T: DeserializeOwned>(
        &self,
        path: &str,
        body: Value,
        token: Option<&str>,
    ) -> Result<T, StoreError> {
        let url = format!("{}{}", self.endpoint, path);
        let mut req = self.http.post(&url);
        if let Some(t) = token {
            req = req.set("Authorization", t);
        }
        let resp = match req.send_json(body) {
            Ok(r) => r,
            Err(ureq::Error::Status(status, r)) => {
                let body = error_body(r);
                // Go's TLS server answers a plain HTTP request with this 400.
                if body.contains("HTTP request to an HTTPS server") {
                    return Err(StoreError::NeedsTls {
                        endpoint: self.endpoint.clone(),
                        answer: body.trim().to_string(),
                    });
                }
                if body.contains(CN_THROUGH_GATEWAY) {
                    return Err(StoreError::CommonNameWithAuth {
                        endpoint: self.endpoint.clone(),
                        path: path.into(),
                        answer: body.trim().to_string(),
                    });
                }
                return Err(StoreError::Refused {
                    endpoint: self.endpoint.clone(),
                    path: path.into(),
                    status,
                    body,
                });
            }
            Err(ureq::Error::Transport(t)) => {
                if let Some(tls) = tls_cause(&t) {
                    return Err(StoreError::Tls {
                        endpoint: self.endpoint.clone(),
                        detail: tls.to_string(),
                        fix: tls_fix(tls, self.client_cert),
                    });
                }
                if closed_without_answer(&t) {
                    let tls = self.endpoint.starts_with("https://");
                    // In TLS 1.3 the client's handshake ends before the server checks
                    // the client's certificate: a refusal shows as a connection the
                    // server closes once the request is sent.
                    let in_handshake = t.kind() == ureq::ErrorKind::ConnectionFailed;
                    let fix = if in_handshake {
                        "etcd closed the connection in the TLS handshake, as a plain-HTTP etcd does: if it does not serve TLS, use --etcd http://... (and drop the TLS files)"
                    } else if self.client_cert {
                        "etcd closed the connection after the TLS handshake, as it does to a client certificate it does not trust: give one signed by etcd's --trusted-ca-file (--etcd-cert and --etcd-key)"
                    } else {
                        "etcd closed the connection after the TLS handshake, as it does when it requires a client certificate (--client-cert-auth): give --etcd-cert and --etcd-key"
                    };
                    return Err(if tls {
                        StoreError::Tls {
                            endpoint: self.endpoint.clone(),
                            detail: t.to_string(),
                            fix,
                        }
                    } else {
                        StoreError::NeedsTls {
                            endpoint: self.endpoint.clone(),
                            answer: t.to_string(),
                        }
                    });
                }
                return Err(StoreError::Unreachable {
                    endpoint: self.endpoint.clone(),
                    detail: t.to_string(),
                });
            }
        };
        // Read as bytes and parsed from them: `into_string` checked the whole answer as
        // UTF-8 a character at a time (`String::from_utf8_lossy`), about 0.8 ms an
        // interval of the leader's listings at 64 x 1,000 (7 % of its CPU, perf,
        // 2026-11-30); serde_json checks each string it reads instead. The same limit
        // as `into_string`'s.
        let mut body = Vec::new();
        let read = std::io::Read::read_to_end(
            &mut std::io::Read::take(resp.into_reader(), ANSWER_LIMIT + 1),
            &mut body,
        );
        if let Err(e) = read {
            return Err(StoreError::Unreachable {
                endpoint: self.endpoint.clone(),
                detail: e.to_string(),
            });
        }
        if body.len() as u64 > ANSWER_LIMIT {
            return Err(self.malformed(path, format!("an answer longer than {ANSWER_LIMIT} bytes")));
        }
        // A streaming method (lease keep-alive) answers one JSON object per message.
        let first = serde_json::Deserializer::from_slice(&body)
            .into_iter::<T>()
            .next()
            .unwrap_or_else(|| T::deserialize(Value::Null));
        first.map_err(|e| self.malformed(path, e.to_string()))
    }

    fn malformed(&self, path: &str, detail: String) -> StoreError {
        StoreError::Malformed {
            endpoint: self.endpoint.clone(),
            path: path.into(),
            detail,
        }
    }
}

/// The longest answer read from etcd, bytes (what ureq's `into_string` allowed).
const ANSWER_LIMIT: u64 = 10 * 1024 * 1024;

/// An answer that says the member cannot serve the call (unreachable, or a 503: no
/// leader, or a leader election under way), so another member may.
fn member_cannot_serve<T>(r: &Result<T, StoreError>) -> bool {
    matches!(
        r,
        Err(StoreError::Unreachable { .. } | StoreError::Refused { status: 503, .. })
    )
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

/// What the agent reads of etcd's answer to a range: each key and value (base64), the
/// rest (revisions, versions, leases, the header) skipped unread. Read straight into
/// these types, not a JSON tree: at 1,000 hosts the contracts' listing (a key each)
/// as a tree was a sixth of the agent's CPU (2026-11-30, perf).
#[derive(Debug, Default, Deserialize)]
pub struct Range {
    #[serde(default)]
    kvs: Vec<RangeKv>,
}

#[derive(Debug, Deserialize)]
struct RangeKv {
    #[serde(default)]
    key: String,
    #[serde(default)]
    value: String,
}

impl Range {
    /// Each key and value, decoded (base64, then UTF-8), in the answer's order.
    pub fn records(&self) -> Result<Vec<(String, String)>, String> {
        self.kvs
            .iter()
            .map(|kv| Ok((decode(&kv.key)?, decode(&kv.value)?)))
            .collect()
    }
}

fn decode(s: &str) -> Result<String, String> {
    let bytes = B64.decode(s).map_err(|e| format!("base64: {e}"))?;
    String::from_utf8(bytes).map_err(|e| format!("utf-8: {e}"))
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
        let r: Value = self.call(path, json!({ "TTL": ttl_s.to_string() }))?;
        int(&r["ID"]).ok_or_else(|| self.malformed(path, format!("no lease ID in {r}")))
    }

    fn keep_alive(&mut self, lease: LeaseId) -> Result<bool, StoreError> {
        let r: Value = self.call("/v3/lease/keepalive", json!({ "ID": lease.to_string() }))?;
        Ok(int(&r["result"]["TTL"]).unwrap_or(0) > 0)
    }

    fn revoke(&mut self, lease: LeaseId) -> Result<(), StoreError> {
        match self.call::<Value>("/v3/lease/revoke", json!({ "ID": lease.to_string() })) {
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
        self.call::<Value>("/v3/kv/put", body).map(|_| ())
    }

    fn put_all(&mut self, puts: &[(String, String)]) -> Result<(), StoreError> {
        let success: Vec<Value> = puts
            .iter()
            .map(|(k, v)| json!({ "request_put": { "key": b64(k), "value": b64(v) } }))
            .collect();
        self.call::<Value>("/v3/kv/txn", json!({ "success": success }))
            .map(|_| ())
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
        let r: Value = self.call("/v3/kv/txn", body)?;
        Ok(r["succeeded"].as_bool().unwrap_or(false))
    }

    /// A transaction whose failure branch is a second transaction (etcd >= 3.3): the
    /// key under this lease, or else the key absent, then the put.
    fn claim(&mut self, key: &str, value: &str, lease: LeaseId) -> Result<bool, StoreError> {
        let put = json!([{
            "request_put": { "key": b64(key), "value": b64(value), "lease": lease.to_string() }
        }]);
        let body = json!({
            "compare": [{
                "key": b64(key), "result": "EQUAL", "target": "LEASE", "lease": lease.to_string()
            }],
            "success": put,
            "failure": [{ "request_txn": {
                "compare": [{
                    "key": b64(key), "result": "EQUAL", "target": "CREATE", "create_revision": "0"
                }],
                "success": put,
            }}],
        });
        let r: Value = self.call("/v3/kv/txn", body)?;
        let inner = &r["responses"][0]["response_txn"]["succeeded"];
        Ok(r["succeeded"].as_bool().unwrap_or(false) || inner.as_bool().unwrap_or(false))
    }

    fn list(&mut self, prefix: &str) -> Result<Vec<(String, String)>, StoreError> {
        let path = "/v3/kv/range";
        let r: Range = self.call(
            path,
            json!({ "key": b64(prefix), "range_end": prefix_end(prefix) }),
        )?;
        r.records().map_err(|e| self.malformed(path, e))
    }

    /// One key by an exact range (the trait's default lists the prefix: every part of
    /// a division whose target's name starts with this one's, and more).
    fn get(&mut self, key: &str) -> Result<Option<String>, StoreError> {
        let path = "/v3/kv/range";
        let r: Range = self.call(path, json!({ "key": b64(key) }))?;
        match r.kvs.first() {
            Some(kv) => Ok(Some(
                decode(&kv.value).map_err(|e| self.malformed(path, e))?,
            )),
            None => Ok(None),
        }
    }

    fn delete_prefix(&mut self, prefix: &str) -> Result<(), StoreError> {
        self.call::<Value>(
            "/v3/kv/deleterange",
            json!({ "key": b64(prefix), "range_end": prefix_end(prefix) }),
        )
        .map(|_| ())
    }

    fn delete(&mut self, key: &str) -> Result<(), StoreError> {
        self.call::<Value>("/v3/kv/deleterange", json!({ "key": b64(key) }))
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
    fn put_all(&mut self, puts: &[(String, String)]) -> Result<(), StoreError> {
        self.up()?;
        for (k, v) in puts {
            self.kv.insert(k.clone(), (v.clone(), None));
        }
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
    fn claim(&mut self, key: &str, value: &str, lease: LeaseId) -> Result<bool, StoreError> {
        self.up()?;
        if self.kv.get(key).is_some_and(|(_, l)| *l != Some(lease)) {
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

/// Test doubles built on [`MemStore`].
#[cfg(test)]
pub(crate) mod hooked {
    use super::{LeaseId, MemStore, Store, StoreError};

    /// The call a [`Hooked`] store is about to pass to its [`MemStore`].
    #[derive(Debug, Clone, Copy)]
    pub(crate) enum Call<'a> {
        KeepAlive,
        List(&'a str),
        Other,
    }

    /// A [`MemStore`] that runs `hook` on its state before each call: a test's counter or
    /// fault writes only what it adds.
    pub(crate) struct Hooked<S> {
        pub(crate) inner: MemStore,
        pub(crate) state: S,
        hook: fn(&mut S, &mut MemStore, Call<'_>) -> Result<(), StoreError>,
    }

    impl<S> Hooked<S> {
        pub(crate) fn new(
            state: S,
            hook: fn(&mut S, &mut MemStore, Call<'_>) -> Result<(), StoreError>,
        ) -> Self {
            Hooked {
                inner: MemStore::default(),
                state,
                hook,
            }
        }
        fn before(&mut self, call: Call<'_>) -> Result<(), StoreError> {
            (self.hook)(&mut self.state, &mut self.inner, call)
        }
    }

    impl<S> Store for Hooked<S> {
        fn grant(&mut self, ttl_s: u64) -> Result<LeaseId, StoreError> {
            self.before(Call::Other)?;
            self.inner.grant(ttl_s)
        }
        fn keep_alive(&mut self, lease: LeaseId) -> Result<bool, StoreError> {
            self.before(Call::KeepAlive)?;
            self.inner.keep_alive(lease)
        }
        fn revoke(&mut self, lease: LeaseId) -> Result<(), StoreError> {
            self.before(Call::Other)?;
            self.inner.revoke(lease)
        }
        fn put(&mut self, k: &str, v: &str, lease: Option<LeaseId>) -> Result<(), StoreError> {
            self.before(Call::Other)?;
            self.inner.put(k, v, lease)
        }
        fn put_all(&mut self, puts: &[(String, String)]) -> Result<(), StoreError> {
            self.before(Call::Other)?;
            self.inner.put_all(puts)
        }
        fn create(&mut self, k: &str, v: &str, lease: LeaseId) -> Result<bool, StoreError> {
            self.before(Call::Other)?;
            self.inner.create(k, v, lease)
        }
        fn claim(&mut self, k: &str, v: &str, lease: LeaseId) -> Result<bool, StoreError> {
            self.before(Call::Other)?;
            self.inner.claim(k, v, lease)
        }
        fn list(&mut self, prefix: &str) -> Result<Vec<(String, String)>, StoreError> {
            self.before(Call::List(prefix))?;
            self.inner.list(prefix)
        }
        fn delete_prefix(&mut self, prefix: &str) -> Result<(), StoreError> {
            self.before(Call::Other)?;
            self.inner.delete_prefix(prefix)
        }
        fn delete(&mut self, key: &str) -> Result<(), StoreError> {
            self.before(Call::Other)?;
            self.inner.delete(key)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// etcd's gateway answers a range with each key's revisions, version and lease
    /// beside its key and value, and leaves an empty value out (proto3 JSON): the
    /// agent reads the keys and values, in order.
    #[test]
    fn a_range_answer_reads_as_its_keys_and_values() {
        let text = format!(
            r#"{{"header":{{"cluster_id":"1","member_id":"2","revision":"9","raft_term":"2"}},"kvs":[{{"key":"{}","create_revision":"4","mod_revision":"9","version":"3","value":"{}","lease":"77"}},{{"key":"{}","create_revision":"5","mod_revision":"5","version":"1"}}],"count":"2"}}"#,
            b64("/c/hosts/a"),
            b64(r#"{"weight":1}"#),
            b64("/c/hosts/b")
        );
        let r: Range = serde_json::from_str(&text).unwrap();
        assert_eq!(
            r.records().unwrap(),
            [
                ("/c/hosts/a".to_string(), r#"{"weight":1}"#.to_string()),
                ("/c/hosts/b".to_string(), String::new())
            ]
        );
        let none: Range = serde_json::from_str(r#"{"header":{},"count":"0"}"#).unwrap();
        assert!(none.records().unwrap().is_empty());
        let bad: Range = serde_json::from_str(r#"{"kvs":[{"key":"!!"}]}"#).unwrap();
        assert!(bad.records().unwrap_err().starts_with("base64"));
    }

    #[test]
    fn prefix_end_is_the_next_key() {
        assert_eq!(B64.decode(prefix_end("/a/")).unwrap(), b"/a0");
        assert_eq!(B64.decode(prefix_end("a\u{7f}")).unwrap(), b"a\x80");
    }

    fn records(sizes: &[usize]) -> Vec<(String, String)> {
        sizes
            .iter()
            .enumerate()
            .map(|(i, &n)| (format!("k{i}"), "x".repeat(n)))
            .collect()
    }

    #[test]
    fn batches_keep_the_order_and_each_fits_in_a_request() {
        // 2-byte keys: each record counts its value + 2 + OP_OVERHEAD.
        let o = 2 + TxnLimit::OP_OVERHEAD;
        let limit = TxnLimit {
            max_bytes: 100 + 2 * o,
            max_ops: 3,
        };
        let puts = records(&[50, 50, 1, 20, 20, 40, 40, 300, 1, 1, 1, 1]);
        let b = limit.batches(&puts);
        let sizes: Vec<Vec<usize>> = b
            .iter()
            .map(|run| run.iter().map(|(_, v)| v.len()).collect())
            .collect();
        assert_eq!(
            sizes,
            vec![
                vec![50, 50],    // a third record would take it over the bytes
                vec![1, 20, 20], // three operations: the most
                vec![40, 40],    // the next would take it over the bytes
                vec![300],       // too large for any request: alone
                vec![1, 1, 1],   // operations again
                vec![1],
            ]
        );
        let again: Vec<&(String, String)> = b.iter().flat_map(|r| r.iter()).collect();
        assert_eq!(
            again,
            puts.iter().collect::<Vec<_>>(),
            "in order, each once"
        );
        for run in &b {
            let bytes: usize = run
                .iter()
                .map(|(k, v)| k.len() + v.len() + TxnLimit::OP_OVERHEAD)
                .sum();
            assert!(run.len() <= limit.max_ops);
            assert!(run.len() == 1 || bytes <= limit.max_bytes, "{bytes}");
        }
        assert!(limit.batches(&[]).is_empty());
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
