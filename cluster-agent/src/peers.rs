//! Reading the other agents' handover reports (`GET /handover` on their `--listen`)
//! while etcd is away: [`Peers`] for the agent, [`HttpPeers`] over plain HTTP with
//! short timeouts (an unreachable peer costs one interval at most that long), and
//! [`parse_response`], the parser of what a peer answers.

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

use qos_core::handover::HandoverReport;

/// Where an agent reads its peers' reports.
pub trait Peers {
    /// The report at `url` (`http://ADDR:PORT/handover`); the error says why not.
    fn fetch(&mut self, url: &str) -> Result<HandoverReport, String>;
}

/// Peers over HTTP/1.0, one connection a request.
#[derive(Debug, Clone)]
pub struct HttpPeers {
    /// For the connection, and for each read and write.
    pub timeout: Duration,
}

/// A peer's answer larger than this is refused (a report is about 100 bytes a host).
pub const MAX_RESPONSE: usize = 16 << 20;

impl Peers for HttpPeers {
    fn fetch(&mut self, url: &str) -> Result<HandoverReport, String> {
        let rest = url
            .strip_prefix("http://")
            .ok_or_else(|| format!("{url}: only http:// peers are read"))?;
        let (host, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, "/"),
        };
        let addr = host
            .to_socket_addrs()
            .map_err(|e| format!("{url}: {e}"))?
            .next()
            .ok_or_else(|| format!("{url}: {host} resolves to no address"))?;
        let mut c =
            TcpStream::connect_timeout(&addr, self.timeout).map_err(|e| format!("{url}: {e}"))?;
        let io = |e: std::io::Error| format!("{url}: {e}");
        c.set_read_timeout(Some(self.timeout)).map_err(io)?;
        c.set_write_timeout(Some(self.timeout)).map_err(io)?;
        write!(c, "GET {path} HTTP/1.0\r\nHost: {host}\r\n\r\n").map_err(io)?;
        let mut body = Vec::new();
        c.take(MAX_RESPONSE as u64 + 1)
            .read_to_end(&mut body)
            .map_err(io)?;
        parse_response(&body).map_err(|e| format!("{url}: {e}"))
    }
}

/// A peer's HTTP answer: status 200 and a JSON [`HandoverReport`] after the headers.
pub fn parse_response(bytes: &[u8]) -> Result<HandoverReport, String> {
    if bytes.len() > MAX_RESPONSE {
        return Err(format!("answer longer than {MAX_RESPONSE} bytes"));
    }
    let split = bytes
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or("no end of headers in the answer")?;
    let head = String::from_utf8_lossy(&bytes[..split]);
    let status = head.lines().next().unwrap_or("");
    if status.split_whitespace().nth(1) != Some("200") {
        return Err(format!("answered {status:?}"));
    }
    serde_json::from_slice(&bytes[split + 4..]).map_err(|e| format!("not a handover report: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_parses_or_says_why_not() {
        let ok = b"HTTP/1.1 200 OK\r\nContent-Length: 30\r\n\r\n{\"target\":\"a\",\"seq\":3,\"hosts\":{}}";
        let r = parse_response(ok).unwrap();
        assert_eq!((r.target.as_str(), r.seq), ("a", Some(3)));
        for (bad, why) in [
            (&b"HTTP/1.1 404 Not Found\r\n\r\nx"[..], "answered"),
            (b"HTTP/1.1 200 OK\r\n", "no end of headers"),
            (
                b"HTTP/1.1 200 OK\r\n\r\n{\"target\":1}",
                "not a handover report",
            ),
            (b"", "no end of headers"),
        ] {
            let e = parse_response(bad).unwrap_err();
            assert!(e.contains(why), "{e}");
        }
    }

    #[test]
    fn an_unreachable_peer_is_an_error_within_the_timeout() {
        let mut p = HttpPeers {
            timeout: Duration::from_millis(200),
        };
        // A port nobody listens on (bound, then closed).
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let e = p
            .fetch(&format!("http://127.0.0.1:{port}/handover"))
            .unwrap_err();
        assert!(e.contains("127.0.0.1"), "{e}");
        assert!(
            p.fetch("https://x/handover")
                .unwrap_err()
                .contains("only http://")
        );
    }
}
