//! A small JSON-RPC 2.0 client for an SPDK application's Unix socket (`rpc.py -s`): a
//! request written as one JSON object and a JSON object read back as its answer,
//! within a timeout, either on a connection of its own ([`call`]) or on one connection
//! a [`Client`] keeps, several requests at once ([`Client::call_many`]: SPDK's RPC
//! server reads and answers what it finds on a connection once per poll, every 4 ms,
//! so calls one after the other cost a poll or two each), or with the answer's result
//! read straight into a type of the caller's ([`Client::call_as`]: no JSON tree; at a
//! target of a thousand hosts the tree was most of the cluster agent's read). It owns
//! the wire format and
//! the errors ([`RpcError`]: the call did not get through, or the application refused
//! it); what the methods mean is the callers' (the cluster agent, the test harness).

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use serde::de::DeserializeOwned;
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
    /// The answer is JSON-RPC, but its result is not what the caller reads
    /// ([`Client::call_as`]).
    #[error("{}: the result of {method} is not what was expected: {source}", sock.display())]
    Unexpected {
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
            RpcError::Answer { source, .. } | RpcError::Unexpected { source, .. } => {
                source.to_string()
            }
            RpcError::Refused { message, .. } => message.clone(),
        }
    }
}

/// An SPDK application's JSON-RPC socket, over one connection kept open between
/// calls (opened at the first call, and again after the application closed it or a
/// call failed on it). Request ids count up from 1 per client.
#[derive(Debug)]
pub struct Client {
    sock: PathBuf,
    timeout: Duration,
    next_id: u64,
    conn: Option<BufReader<UnixStream>>,
    /// Connections opened so far.
    connects: u64,
    /// The text of [`Client::call_as`]'s last answer, its capacity kept for the next
    /// (an answer of 0.2 MB grown from nothing each call was a tenth of its read).
    text: Vec<u8>,
}

impl Client {
    /// A client of the socket at `sock`; each call waits at most `timeout` for its
    /// answer (and for its request to be written); zero: without bound.
    pub fn new(sock: impl Into<PathBuf>, timeout: Duration) -> Client {
        Client {
            sock: sock.into(),
            timeout,
            next_id: 1,
            conn: None,
            connects: 0,
            text: Vec::new(),
        }
    }

    pub fn sock(&self) -> &Path {
        &self.sock
    }

    /// How many connections this client opened.
    pub fn connects(&self) -> u64 {
        self.connects
    }

    /// Calls `method`; `Value::Null` params are left out of the request. Returns the
    /// answer's `result` (`Null` when it has none).
    pub fn call(&mut self, method: &str, params: Value) -> Result<Value, RpcError> {
        self.call_many(vec![(method.to_string(), params)])
            .pop()
            .expect("one answer per call")
    }

    /// Calls `method` on the kept connection and reads its answer's `result` straight
    /// into `T` (serde), without a JSON tree: the answer's text is cut off the stream
    /// ([`read_text`]), its id and error read first, then its result as `T`
    /// ([`parse_reply`]). As [`Client::call_many`]: an answer to an earlier call is
    /// skipped; a kept connection the application closed is opened again and the call
    /// sent again once; a timeout or an answer that is not JSON-RPC drops the
    /// connection. A result that is not a `T` is [`RpcError::Unexpected`].
    pub fn call_as<T: DeserializeOwned>(
        &mut self,
        method: &str,
        params: Value,
    ) -> Result<T, RpcError> {
        let mut text = std::mem::take(&mut self.text);
        let r = self.call_as_into(method, params, &mut text);
        self.text = text;
        r
    }

    fn call_as_into<T: DeserializeOwned>(
        &mut self,
        method: &str,
        params: Value,
        text: &mut Vec<u8>,
    ) -> Result<T, RpcError> {
        let id = self.next_id;
        self.next_id += 1;
        let mut req = json!({"jsonrpc": "2.0", "method": method, "id": id});
        if !params.is_null() {
            req["params"] = params;
        }
        let request = req.to_string() + "\n";
        loop {
            let fresh = self.conn.is_none();
            if fresh {
                let c = self.connect().map_err(|source| RpcError::Connect {
                    sock: self.sock.clone(),
                    source,
                })?;
                self.conn = Some(c);
            }
            let conn = self.conn.as_mut().expect("connected");
            if let Err(source) = conn.get_mut().write_all(request.as_bytes()) {
                self.conn = None;
                if fresh {
                    return Err(RpcError::Send {
                        sock: self.sock.clone(),
                        method: method.into(),
                        source,
                    });
                }
                continue;
            }
            let answer = loop {
                match read_text(conn, text) {
                    Ok(true) => match parse_reply::<T>(text, id) {
                        Ok(Reply::NotOurs) => continue,
                        other => break Some(other),
                    },
                    Ok(false) => break None,
                    Err(e) if closed_io(&e) => break None,
                    Err(e) => break Some(Err(serde_json::Error::io(e))),
                }
            };
            let Some(answer) = answer else {
                // Closed: a kept connection the application let go is opened again.
                self.conn = None;
                if fresh {
                    return Err(RpcError::Closed {
                        sock: self.sock.clone(),
                        method: method.into(),
                    });
                }
                continue;
            };
            return match answer {
                Ok(Reply::Result(r)) => Ok(r),
                Ok(Reply::Refused { code, message }) => Err(RpcError::Refused {
                    method: method.into(),
                    code,
                    message,
                }),
                Ok(Reply::Unreadable(source)) => Err(RpcError::Unexpected {
                    sock: self.sock.clone(),
                    method: method.into(),
                    source,
                }),
                Ok(Reply::NotOurs) => unreachable!("skipped above"),
                Err(source) => {
                    self.conn = None;
                    Err(RpcError::Answer {
                        sock: self.sock.clone(),
                        method: method.into(),
                        source,
                    })
                }
            };
        }
    }

    /// Sends every call at once on the kept connection, then reads their answers
    /// (matched by id); one result per call, in order. When the application closes
    /// the connection before answering them all, the unanswered calls are sent again
    /// on a new connection, once per connection that answered something or had been
    /// used before (an application that answers one request per connection still
    /// answers them all; one that answers none fails them). A call may then run twice
    /// at the application: the callers' methods set values, so running one again
    /// changes nothing. A timeout or an answer that is not JSON fails every call not
    /// answered yet, and the connection is dropped.
    pub fn call_many(&mut self, calls: Vec<(String, Value)>) -> Vec<Result<Value, RpcError>> {
        let n = calls.len();
        let mut out: Vec<Option<Result<Value, RpcError>>> = (0..n).map(|_| None).collect();
        let ids: Vec<u64> = (0..n as u64).map(|i| self.next_id + i).collect();
        self.next_id += n as u64;
        let requests: Vec<String> = calls
            .iter()
            .zip(&ids)
            .map(|((method, params), id)| {
                let mut req = json!({"jsonrpc": "2.0", "method": method, "id": id});
                if !params.is_null() {
                    req["params"] = params.clone();
                }
                req.to_string() + "\n"
            })
            .collect();
        let method = |i: usize| calls[i].0.clone();
        loop {
            let open: Vec<usize> = (0..n).filter(|&i| out[i].is_none()).collect();
            if open.is_empty() {
                break;
            }
            let fresh = self.conn.is_none();
            if fresh {
                match self.connect() {
                    Ok(c) => self.conn = Some(c),
                    Err(e) => {
                        for &i in &open {
                            out[i] = Some(Err(RpcError::Connect {
                                sock: self.sock.clone(),
                                source: std::io::Error::new(e.kind(), e.to_string()),
                            }));
                        }
                        break;
                    }
                }
            }
            let conn = self.conn.as_mut().expect("connected");
            let text: String = open.iter().map(|&i| requests[i].as_str()).collect();
            if let Err(e) = conn.get_mut().write_all(text.as_bytes()) {
                self.conn = None;
                if fresh {
                    for &i in &open {
                        out[i] = Some(Err(RpcError::Send {
                            sock: self.sock.clone(),
                            method: method(i),
                            source: std::io::Error::new(e.kind(), e.to_string()),
                        }));
                    }
                    break;
                }
                continue;
            }
            let mut answered = 0;
            let mut waiting = open.len();
            while waiting > 0 {
                let next = serde_json::Deserializer::from_reader(&mut *conn)
                    .into_iter::<Value>()
                    .next();
                match next {
                    Some(Ok(answer)) => {
                        let id = answer.get("id").and_then(Value::as_u64);
                        // An answer to an earlier call (one that timed out) is skipped.
                        let Some(i) = id.and_then(|id| ids.iter().position(|&x| x == id)) else {
                            continue;
                        };
                        if out[i].is_none() {
                            out[i] = Some(result_of(&calls[i].0, answer));
                            answered += 1;
                            waiting -= 1;
                        }
                    }
                    Some(Err(source)) if !closed(&source) => {
                        self.conn = None;
                        let detail = source.to_string();
                        let mut source = Some(source);
                        for i in (0..n).filter(|&i| out[i].is_none()).collect::<Vec<_>>() {
                            let source = source.take().unwrap_or_else(|| {
                                serde_json::Error::io(std::io::Error::other(detail.clone()))
                            });
                            out[i] = Some(Err(RpcError::Answer {
                                sock: self.sock.clone(),
                                method: method(i),
                                source,
                            }));
                        }
                        break;
                    }
                    // Closed: at its end, or with requests unread (a reset).
                    None | Some(Err(_)) => {
                        self.conn = None;
                        if fresh && answered == 0 {
                            for i in (0..n).filter(|&i| out[i].is_none()).collect::<Vec<_>>() {
                                out[i] = Some(Err(RpcError::Closed {
                                    sock: self.sock.clone(),
                                    method: method(i),
                                }));
                            }
                        }
                        break;
                    }
                }
            }
        }
        out.into_iter()
            .map(|r| r.expect("every call answered or failed"))
            .collect()
    }

    fn connect(&mut self) -> std::io::Result<BufReader<UnixStream>> {
        let s = UnixStream::connect(&self.sock)?;
        // A zero timeout waits without bound (the socket refuses a zero timeout).
        let bound = Some(self.timeout).filter(|t| !t.is_zero());
        s.set_read_timeout(bound)?;
        s.set_write_timeout(bound)?;
        self.connects += 1;
        Ok(BufReader::new(s))
    }
}

/// A read that failed because the application closed the connection (Linux resets a
/// Unix socket whose peer closed with requests it had not read).
fn closed(e: &serde_json::Error) -> bool {
    use std::io::ErrorKind as K;
    matches!(
        e.io_error_kind(),
        Some(K::ConnectionReset | K::BrokenPipe | K::UnexpectedEof)
    )
}

fn closed_io(e: &std::io::Error) -> bool {
    use std::io::ErrorKind as K;
    matches!(
        e.kind(),
        K::ConnectionReset | K::BrokenPipe | K::UnexpectedEof
    )
}

/// Reads the text of one JSON object or array (as JSON-RPC answers are) off `r` into
/// `out` (cleared first), by its brackets, strings and escapes, without parsing it:
/// `Ok(false)` when `r` ends before it starts (only whitespace), an `UnexpectedEof`
/// error when it ends inside it, `InvalidData` when the text starts with anything but
/// `{` or `[`. What follows the value stays in `r`.
pub fn read_text(r: &mut impl BufRead, out: &mut Vec<u8>) -> std::io::Result<bool> {
    out.clear();
    let (mut depth, mut in_str, mut escaped) = (0usize, false, false);
    loop {
        let buf = r.fill_buf()?;
        if buf.is_empty() {
            return if depth == 0 {
                Ok(false)
            } else {
                Err(std::io::ErrorKind::UnexpectedEof.into())
            };
        }
        let mut end = None;
        let mut skip = 0;
        for (i, &b) in buf.iter().enumerate() {
            if in_str {
                if escaped {
                    escaped = false;
                } else if b == b'\\' {
                    escaped = true;
                } else if b == b'"' {
                    in_str = false;
                }
                continue;
            }
            match b {
                b'"' if depth > 0 => in_str = true,
                b'{' | b'[' => depth += 1,
                b'}' | b']' if depth > 0 => {
                    depth -= 1;
                    if depth == 0 {
                        end = Some(i + 1);
                        break;
                    }
                }
                b' ' | b'\n' | b'\r' | b'\t' if depth == 0 => skip = i + 1,
                _ if depth == 0 => {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::InvalidData,
                        "not a JSON object or array",
                    ));
                }
                _ => {}
            }
        }
        let n = end.unwrap_or(buf.len());
        out.extend_from_slice(&buf[skip.min(n)..n]);
        r.consume(n);
        if end.is_some() {
            return Ok(true);
        }
    }
}

/// What an answer's text holds for the call of id `id`.
#[derive(Debug)]
pub enum Reply<T> {
    /// The answer to another call (one that timed out).
    NotOurs,
    /// Its result, read as a `T`.
    Result(T),
    /// Its JSON-RPC error.
    Refused { code: i64, message: String },
    /// Its result (or its lack of one), which is not a `T`.
    Unreadable(serde_json::Error),
}

/// A JSON-RPC answer's id and error, the rest skipped unread.
#[derive(Deserialize)]
struct Head {
    #[serde(default)]
    id: Value,
    #[serde(default)]
    error: Option<ErrorObject>,
}

#[derive(Deserialize)]
struct ErrorObject {
    #[serde(default)]
    code: i64,
    #[serde(default)]
    message: String,
}

/// A JSON-RPC answer's result, the rest skipped unread.
#[derive(Deserialize)]
#[serde(bound = "T: DeserializeOwned")]
struct WithResult<T> {
    result: T,
}

/// Reads the answer `text` (as [`read_text`] cut it) for the call of id `id`: its id
/// and error first, then, when it is the call's answer without an error, its result
/// straight into `T`. An error when `text` is not a JSON-RPC answer.
pub fn parse_reply<T: DeserializeOwned>(
    text: &[u8],
    id: u64,
) -> Result<Reply<T>, serde_json::Error> {
    let head: Head = serde_json::from_slice(text)?;
    if head.id.as_u64() != Some(id) {
        return Ok(Reply::NotOurs);
    }
    if let Some(e) = head.error {
        return Ok(Reply::Refused {
            code: e.code,
            message: e.message,
        });
    }
    Ok(match serde_json::from_slice::<WithResult<T>>(text) {
        Ok(w) => Reply::Result(w.result),
        Err(e) => Reply::Unreadable(e),
    })
}

/// The result of `method` from its `answer`: its `result`, or its JSON-RPC error.
fn result_of(method: &str, mut answer: Value) -> Result<Value, RpcError> {
    if let Some(e) = answer.get("error") {
        return Err(RpcError::Refused {
            method: method.into(),
            code: e["code"].as_i64().unwrap_or(0),
            message: e["message"].as_str().unwrap_or("").to_string(),
        });
    }
    // Taken, not cloned: at a target of a thousand hosts the clone of its statistics
    // was a fifth of the cluster agent's CPU (2026-11-30, perf).
    Ok(answer.get_mut("result").map_or(Value::Null, Value::take))
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
    result_of(method, answer)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::os::unix::net::UnixListener;
    use std::sync::mpsc;

    /// What the fake server does with one connection.
    #[derive(Clone, Copy, Debug)]
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

    /// A socket of this test's own in a fresh temporary directory (`kind` names it).
    fn listen(kind: &str) -> (PathBuf, UnixListener) {
        let dir = std::env::temp_dir().join(format!(
            "rpc-client-{kind}-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("spdk.sock");
        let listener = UnixListener::bind(&path).unwrap();
        (path, listener)
    }

    /// A fake SPDK application on a socket of its own in a temporary directory: serves
    /// `replies.len()` connections, one reply each, and sends each request it read.
    fn server(replies: Vec<Reply>) -> (PathBuf, mpsc::Receiver<Value>) {
        let (path, listener) = listen("test");
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

    /// A fake SPDK application that serves one connection, as SPDK's RPC server does:
    /// reads the number of requests `batches` says, then answers them, the last first
    /// when `reversed`; then the next batch. Sends the number of requests it read in
    /// each batch.
    fn pipelined_server(batches: Vec<usize>, reversed: bool) -> (PathBuf, mpsc::Receiver<usize>) {
        let (path, listener) = listen("pipe");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let (c, _) = listener.accept().unwrap();
            let mut w = c.try_clone().unwrap();
            let mut reqs =
                serde_json::Deserializer::from_reader(BufReader::new(c)).into_iter::<Value>();
            for batch in batches {
                let got: Vec<Value> = reqs.by_ref().take(batch).map_while(Result::ok).collect();
                if got.is_empty() {
                    return;
                }
                tx.send(got.len()).unwrap();
                let mut answers: Vec<Value> = got
                    .iter()
                    .map(|r| json!({"jsonrpc": "2.0", "id": r["id"], "result": r["params"]}))
                    .collect();
                if reversed {
                    answers.reverse();
                }
                for a in answers {
                    w.write_all((a.to_string() + "\n").as_bytes()).unwrap();
                }
            }
        });
        (path, rx)
    }

    fn numbered(n: u64) -> Vec<(String, Value)> {
        (0..n)
            .map(|i| ("qos_host_set".to_string(), json!({ "n": i })))
            .collect()
    }

    #[test]
    fn calls_share_one_connection_and_go_out_together() {
        let (sock, batches) = pipelined_server(vec![50, 1, 1], true);
        let mut c = Client::new(&sock, T);
        let r = c.call_many(numbered(50));
        // All 50 were read before any was answered (one batch), answered last first,
        // and each result is its own call's.
        assert_eq!(batches.recv().unwrap(), 50);
        let got: Vec<Value> = r.into_iter().map(Result::unwrap).collect();
        assert_eq!(got, (0..50).map(|i| json!({ "n": i })).collect::<Vec<_>>());
        // Single calls after it go on the same connection.
        assert_eq!(c.call("m", json!(7)).unwrap(), json!(7));
        assert_eq!(c.call("m", json!(8)).unwrap(), json!(8));
        assert_eq!(c.connects(), 1);
        assert!(c.call_many(Vec::new()).is_empty());
    }

    #[derive(Debug, PartialEq, Deserialize)]
    struct N {
        n: u64,
    }

    #[test]
    fn a_typed_call_reads_its_result_into_the_type_on_the_kept_connection() {
        let (sock, batches) = pipelined_server(vec![1, 1, 1], false);
        let mut c = Client::new(&sock, T);
        assert_eq!(c.call_as::<N>("m", json!({ "n": 3 })).unwrap(), N { n: 3 });
        assert_eq!(batches.recv().unwrap(), 1);
        // Not a `N`: said so, and the connection stays.
        let e = c.call_as::<N>("m", json!({ "m": 1 })).unwrap_err();
        assert!(matches!(e, RpcError::Unexpected { .. }), "{e}");
        assert!(e.to_string().contains("missing field `n`"), "{e}");
        assert_eq!(
            c.call_as::<Vec<N>>("m", json!([{ "n": 1 }, { "n": 2, "x": [1, "]}"] }]))
                .unwrap(),
            vec![N { n: 1 }, N { n: 2 }]
        );
        assert_eq!(c.connects(), 1);
    }

    #[test]
    fn a_typed_call_takes_refusals_and_skips_other_calls_answers() {
        let (sock, _reqs) = server(vec![Reply::Echo, Reply::Garbage, Reply::Close]);
        let mut c = Client::new(&sock, T);
        let e = c.call_as::<N>("fail", json!({})).unwrap_err();
        assert_eq!(e.code(), Some(METHOD_NOT_FOUND), "{e}");
        // The server answered once and closed: the next call goes on a new connection,
        // which answers garbage.
        let e = c.call_as::<N>("m", json!({ "n": 1 })).unwrap_err();
        assert!(matches!(e, RpcError::Answer { .. }), "{e}");
        let e = c.call_as::<N>("m", json!({ "n": 1 })).unwrap_err();
        assert!(matches!(e, RpcError::Closed { .. }), "{e}");
        // An answer of another id comes before the call's own.
        let two = br#" {"jsonrpc":"2.0","id":4,"result":{"n":9}}
{"jsonrpc":"2.0","id":5,"result":{"n":"a\"}{["}}  {"id":6}"#;
        let mut r = BufReader::new(&two[..]);
        let mut text = Vec::new();
        assert!(read_text(&mut r, &mut text).unwrap());
        assert!(matches!(
            parse_reply::<N>(&text, 5).unwrap(),
            super::Reply::NotOurs
        ));
        assert!(read_text(&mut r, &mut text).unwrap());
        let super::Reply::Unreadable(e) = parse_reply::<N>(&text, 5).unwrap() else {
            panic!("a string is not a number")
        };
        assert!(e.to_string().contains("invalid type"), "{e}");
        assert!(read_text(&mut r, &mut text).unwrap());
        assert_eq!(text, br#"{"id":6}"#);
        assert!(!read_text(&mut r, &mut text).unwrap());
        let mut cut = BufReader::new(&br#"{"id":1,"#[..]);
        let e = read_text(&mut cut, &mut text).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::UnexpectedEof);
    }

    #[test]
    fn an_application_that_answers_once_per_connection_still_answers_every_call() {
        let (sock, reqs) = server(vec![Reply::Echo; 3]);
        let mut c = Client::new(&sock, T);
        let r = c.call_many(numbered(3));
        let got: Vec<Value> = r.into_iter().map(Result::unwrap).collect();
        assert_eq!(got, (0..3).map(|i| json!({ "n": i })).collect::<Vec<_>>());
        assert_eq!(c.connects(), 3);
        // The server read the first request of each connection: 0, then 1, then 2.
        let first: Vec<Value> = reqs.try_iter().map(|r| r["params"]["n"].clone()).collect();
        assert_eq!(first, vec![json!(0), json!(1), json!(2)]);
    }

    #[test]
    fn an_application_that_answers_nothing_fails_every_call() {
        let (sock, _reqs) = server(vec![Reply::Close, Reply::Silent]);
        let mut c = Client::new(&sock, T);
        let r = c.call_many(numbered(2));
        assert!(
            r.iter().all(|r| matches!(r, Err(RpcError::Closed { .. }))),
            "{r:?}"
        );
        let mut c = Client::new(&sock, Duration::from_millis(200));
        let r = c.call_many(numbered(2));
        assert!(
            r.iter().all(|r| matches!(r, Err(RpcError::Answer { .. }))),
            "{r:?}"
        );
    }

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

    /// `read_text` cuts answers off a stream by their brackets by hand (the agent reads
    /// its target's answers with it): strings holding brackets, quotes and escapes, any
    /// whitespace between answers and any read size give back each answer's text
    /// exactly, then the end; arbitrary bytes give an answer, the end or an error,
    /// never a panic.
    mod read_text_props {
        use super::*;
        use proptest::prelude::*;

        fn value() -> impl Strategy<Value = Value> {
            let leaf = prop_oneof![
                Just(Value::Null),
                any::<bool>().prop_map(Value::Bool),
                any::<i64>().prop_map(|n| json!(n)),
                "[\\[\\]{}\"\\\\a ,:\\n\\t\\u{e9}]{0,12}".prop_map(Value::String),
            ];
            leaf.prop_recursive(4, 32, 4, |inner| {
                prop_oneof![
                    prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                    prop::collection::btree_map("[a-z\\]\\}\"]{1,4}", inner, 0..4)
                        .prop_map(|m| Value::Object(m.into_iter().collect())),
                ]
            })
        }

        proptest! {
            #[test]
            fn answers_come_back_whole_whatever_the_reads(
                answers in prop::collection::vec(
                    (prop_oneof![
                        prop::collection::vec(value(), 0..3).prop_map(Value::Array),
                        value().prop_map(|v| json!({ "result": v })),
                    ], any::<bool>(), "[ \\n\\r\\t]{0,3}"),
                    1..4,
                ),
                read_size in 1usize..9,
            ) {
                let mut stream = Vec::new();
                let mut texts = Vec::new();
                for (v, pretty, gap) in &answers {
                    let t = if *pretty {
                        serde_json::to_string_pretty(v).unwrap()
                    } else {
                        v.to_string()
                    };
                    stream.extend_from_slice(gap.as_bytes());
                    stream.extend_from_slice(t.as_bytes());
                    texts.push(t);
                }
                stream.extend_from_slice(b"\n");
                let mut r = std::io::BufReader::with_capacity(read_size, stream.as_slice());
                let mut out = Vec::new();
                for t in &texts {
                    prop_assert!(read_text(&mut r, &mut out).unwrap());
                    prop_assert_eq!(std::str::from_utf8(&out).unwrap(), t.as_str());
                }
                prop_assert!(!read_text(&mut r, &mut out).unwrap());
            }

            #[test]
            fn any_bytes_are_an_answer_the_end_or_an_error(
                bytes in prop::collection::vec(any::<u8>(), 0..64),
                read_size in 1usize..9,
            ) {
                let mut r = std::io::BufReader::with_capacity(read_size, bytes.as_slice());
                let mut out = Vec::new();
                for _ in 0..bytes.len() + 1 {
                    match read_text(&mut r, &mut out) {
                        Ok(true) => prop_assert!(!out.is_empty()),
                        Ok(false) | Err(_) => break,
                    }
                }
            }
        }
    }
}
