//! A small JSON-RPC 2.0 client for an SPDK application's Unix socket (`rpc.py -s`):
//! one connection per call, a request written as one JSON object and the first JSON
//! object read back as its answer, within a timeout. It owns the wire format and the
//! errors ([`RpcError`]: the call did not get through, or the application refused it);
//! what the methods mean is the callers' (the cluster agent, the test harness).

use std::io::{BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{Value, json};
use thiserror::Error;

/// JSON-RPC's code for a method the application does not know (a plugin not loaded).
pub const METHOD_NOT_FOUND: i64 = -32601;

/// A call that did not succeed.
#[derive(Debug, Error)]
pub enum RpcError {
    /// Nothing listens at the socket (the application is not running, or uses another
    /// socket: its `-r`).
    #[error("{}: cannot connect: {source}", sock.display())]
    Connect {
        sock: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The request could not be written (the application closed the connection).
    #[error("{}: sending {method}: {source}", sock.display())]
    Send {
        sock: PathBuf,
        method: String,
        #[source]
        source: std::io::Error,
    },
    /// The application closed the connection without answering.
    #[error("{}: closed without answering {method}", sock.display())]
    Closed { sock: PathBuf, method: String },
    /// No complete answer within the timeout, or the answer is not JSON.
    #[error("{}: no readable answer to {method}: {source}", sock.display())]
    Answer {
        sock: PathBuf,
        method: String,
        #[source]
        source: serde_json::Error,
    },
    /// The application answered with a JSON-RPC error.
    #[error("{method} refused: {message} (code {code})")]
    Refused {
        method: String,
        code: i64,
        message: String,
    },
}

impl RpcError {
    /// The JSON-RPC error code of a refusal; `None` when the call did not get through.
    pub fn code(&self) -> Option<i64> {
        match self {
            RpcError::Refused { code, .. } => Some(*code),
            _ => None,
        }
    }

    /// What went wrong, without the socket or method (for callers that name them
    /// themselves): the I/O or parse error, or the application's message.
    pub fn detail(&self) -> String {
        match self {
            RpcError::Connect { source, .. } | RpcError::Send { source, .. } => source.to_string(),
            RpcError::Closed { .. } => "closed without answering".into(),
            RpcError::Answer { source, .. } => source.to_string(),
            RpcError::Refused { message, .. } => message.clone(),
        }
    }
}

/// An SPDK application's JSON-RPC socket. Request ids count up from 1 per client.
#[derive(Debug)]
pub struct Client {
    sock: PathBuf,
    timeout: Duration,
    next_id: u64,
}

impl Client {
    /// A client of the socket at `sock`; each call waits at most `timeout` for its
    /// answer (and for its request to be written); zero: without bound.
    pub fn new(sock: impl Into<PathBuf>, timeout: Duration) -> Client {
        Client {
            sock: sock.into(),
            timeout,
            next_id: 1,
        }
    }

    pub fn sock(&self) -> &Path {
        &self.sock
    }

    /// Calls `method` on a connection of its own; `Value::Null` params are left out
    /// of the request. Returns the answer's `result` (`Null` when it has none).
    pub fn call(&mut self, method: &str, params: Value) -> Result<Value, RpcError> {
        let id = self.next_id;
        self.next_id += 1;
        call_with_id(&self.sock, method, params, self.timeout, id)
    }
}

/// One call on a connection of its own (request id 1); see [`Client::call`].
pub fn call(
    sock: &Path,
    method: &str,
    params: Value,
    timeout: Duration,
) -> Result<Value, RpcError> {
    call_with_id(sock, method, params, timeout, 1)
}

fn call_with_id(
    sock: &Path,
    method: &str,
    params: Value,
    timeout: Duration,
    id: u64,
) -> Result<Value, RpcError> {
    let mut s = UnixStream::connect(sock).map_err(|source| RpcError::Connect {
        sock: sock.into(),
        source,
    })?;
    let send = |source| RpcError::Send {
        sock: sock.into(),
        method: method.into(),
        source,
    };
    // A zero timeout waits without bound (the socket refuses a zero timeout).
    let bound = Some(timeout).filter(|t| !t.is_zero());
    s.set_read_timeout(bound).map_err(send)?;
    s.set_write_timeout(bound).map_err(send)?;
    let mut req = json!({"jsonrpc": "2.0", "method": method, "id": id});
    if !params.is_null() {
        req["params"] = params;
    }
    s.write_all(req.to_string().as_bytes()).map_err(send)?;
    let answer = serde_json::Deserializer::from_reader(BufReader::new(s))
        .into_iter::<Value>()
        .next()
        .ok_or_else(|| RpcError::Closed {
            sock: sock.into(),
            method: method.into(),
        })?
        .map_err(|source| RpcError::Answer {
            sock: sock.into(),
            method: method.into(),
            source,
        })?;
    if let Some(e) = answer.get("error") {
        return Err(RpcError::Refused {
            method: method.into(),
            code: e["code"].as_i64().unwrap_or(0),
            message: e["message"].as_str().unwrap_or("").to_string(),
        });
    }
    Ok(answer.get("result").cloned().unwrap_or(Value::Null))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::os::unix::net::UnixListener;
    use std::sync::mpsc;

    /// What the fake server does with one connection.
    #[derive(Clone, Copy)]
    enum Reply {
        /// Answers `{"result": params}` (or its error for method "fail"), in two writes.
        Echo,
        /// Reads the request, then closes.
        Close,
        /// Reads the request and answers nothing (keeps the connection open).
        Silent,
        /// Answers with text that is not JSON.
        Garbage,
    }

    /// A fake SPDK application on a socket of its own in a temporary directory: serves
    /// `replies.len()` connections, one reply each, and sends each request it read.
    fn server(replies: Vec<Reply>) -> (PathBuf, mpsc::Receiver<Value>) {
        let dir = std::env::temp_dir().join(format!(
            "rpc-client-test-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("spdk.sock");
        let listener = UnixListener::bind(&path).unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for reply in replies {
                let (mut c, _) = listener.accept().unwrap();
                let req = serde_json::Deserializer::from_reader(&mut c)
                    .into_iter::<Value>()
                    .next()
                    .unwrap()
                    .unwrap();
                tx.send(req.clone()).unwrap();
                match reply {
                    Reply::Echo => {
                        let a = if req["method"] == "fail" {
                            json!({"jsonrpc": "2.0", "id": req["id"],
                                   "error": {"code": METHOD_NOT_FOUND, "message": "Method not found"}})
                        } else {
                            json!({"jsonrpc": "2.0", "id": req["id"], "result": req.get("params")})
                        };
                        let text = a.to_string();
                        let (one, two) = text.split_at(text.len() / 2);
                        c.write_all(one.as_bytes()).unwrap();
                        std::thread::sleep(Duration::from_millis(20));
                        c.write_all(two.as_bytes()).unwrap();
                    }
                    Reply::Close => {}
                    Reply::Silent => {
                        let mut rest = Vec::new();
                        let _ = c.read_to_end(&mut rest);
                    }
                    Reply::Garbage => c.write_all(b"<html>not json</html>").unwrap(),
                }
            }
        });
        (path, rx)
    }

    const T: Duration = Duration::from_secs(5);

    #[test]
    fn a_call_sends_a_request_and_returns_its_result() {
        let (sock, reqs) = server(vec![Reply::Echo, Reply::Echo]);
        let mut c = Client::new(&sock, T);
        let r = c.call("qos_stats_get", json!({"compact": true})).unwrap();
        assert_eq!(r, json!({"compact": true}));
        let req = reqs.recv().unwrap();
        assert_eq!(req["jsonrpc"], "2.0");
        assert_eq!(req["method"], "qos_stats_get");
        assert_eq!(req["id"], 1);
        // Null params are left out; ids count up; an answer without result is Null.
        assert_eq!(
            c.call("spdk_get_version", Value::Null).unwrap(),
            Value::Null
        );
        let req = reqs.recv().unwrap();
        assert_eq!(req["id"], 2);
        assert!(req.get("params").is_none(), "{req}");
    }

    #[test]
    fn a_refusal_carries_the_code_and_message() {
        let (sock, _reqs) = server(vec![Reply::Echo]);
        let e = call(&sock, "fail", json!({}), T).unwrap_err();
        assert_eq!(e.code(), Some(METHOD_NOT_FOUND));
        assert_eq!(e.detail(), "Method not found");
        assert_eq!(
            e.to_string(),
            "fail refused: Method not found (code -32601)"
        );
    }

    #[test]
    fn transport_failures_say_what_happened() {
        let (sock, _reqs) = server(vec![Reply::Close, Reply::Garbage, Reply::Silent]);
        let e = call(&sock, "m", Value::Null, T).unwrap_err();
        assert!(matches!(e, RpcError::Closed { .. }), "{e}");
        assert_eq!(e.code(), None);
        assert!(
            e.to_string()
                .ends_with("spdk.sock: closed without answering m"),
            "{e}"
        );
        let e = call(&sock, "m", Value::Null, T).unwrap_err();
        assert!(matches!(e, RpcError::Answer { .. }), "{e}");
        let t0 = std::time::Instant::now();
        let e = call(&sock, "m", Value::Null, Duration::from_millis(200)).unwrap_err();
        assert!(matches!(e, RpcError::Answer { .. }), "{e}");
        assert!(t0.elapsed() < Duration::from_secs(3), "{:?}", t0.elapsed());
        let _ = std::fs::remove_file(&sock);
        let e = call(&sock, "m", Value::Null, T).unwrap_err();
        assert!(matches!(e, RpcError::Connect { .. }), "{e}");
        assert!(e.to_string().contains("cannot connect"), "{e}");
    }
}
