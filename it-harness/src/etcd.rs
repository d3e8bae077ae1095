//! A real etcd server (Debian's `etcd-server`) for the cluster tests: started on
//! 127.0.0.1 on ports of its own with a fresh data directory, stopped (and its
//! directory removed) when dropped, also when the test fails. It can be stopped and
//! started again on the same ports and data, as the etcd-outage test needs. With
//! [`EtcdTls`] it serves its clients over TLS (`https://`), checking their certificates
//! when asked to, and [`Etcd::start_with`] passes further flags (`--auth-token-ttl`).
//! [`Etcd::cluster`] starts several members of one etcd cluster, and [`Etcd::kill`]
//! takes one down without a word (SIGKILL: a leader stopped by SIGTERM hands its
//! leadership over first). Every member also serves its metrics over plain HTTP on a
//! port of its own, so that a test can ask which member leads the raft group
//! ([`raft_leader`]) whatever TLS its clients speak.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::env::or_skip;
use crate::pki::Pki;
use crate::setup::free_port;

/// Where etcd is, or `None`.
pub fn etcd_binary() -> Option<PathBuf> {
    ["/usr/bin/etcd", "/usr/local/bin/etcd"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
}

/// The etcd binary, or `None` after printing `SKIPPED: <what>: ...`.
pub fn etcd_or_skip(what: &str) -> Option<PathBuf> {
    or_skip(
        what,
        etcd_binary()
            .ok_or_else(|| "no etcd binary (apt-get install etcd-server; .ci/run does)".into()),
    )
}

/// The TLS files of an etcd that serves its clients over TLS (PEM files).
#[derive(Debug, Clone)]
pub struct EtcdTls {
    pub cert: PathBuf,
    pub key: PathBuf,
    /// With `--client-cert-auth`: only clients with a certificate signed by this CA.
    pub client_ca: Option<PathBuf>,
}

/// A running (or stopped) etcd.
#[derive(Debug)]
pub struct Etcd {
    bin: PathBuf,
    pub client_port: u16,
    peer_port: u16,
    /// `--listen-metrics-urls`: `/metrics` over plain HTTP, TLS or not on the clients'.
    metrics_port: u16,
    dir: PathBuf,
    child: Option<Child>,
    tls: Option<EtcdTls>,
    extra_args: Vec<String>,
    /// Its member name, and the cluster's `--initial-cluster` (itself alone when
    /// `None`).
    name: String,
    initial_cluster: Option<String>,
    /// The members speak to each other over TLS too (`https://` peer URLs, each
    /// checking the other's certificate against the clients' CA).
    peer_tls: bool,
}

impl Etcd {
    /// Starts etcd and waits until it answers (at most 20 s).
    pub fn start(bin: PathBuf) -> Result<Etcd, String> {
        Etcd::start_with(bin, None, &[])
    }

    /// Starts etcd serving its clients over `tls` (when given) with `extra_args` added
    /// to its command line.
    pub fn start_with(
        bin: PathBuf,
        tls: Option<EtcdTls>,
        extra_args: &[&str],
    ) -> Result<Etcd, String> {
        let dir = std::env::temp_dir().join(format!(
            "nvmf-qos-it-etcd-{}-{}",
            std::process::id(),
            free_port()
        ));
        let mut e = Etcd {
            bin,
            client_port: free_port(),
            peer_port: free_port(),
            metrics_port: free_port(),
            dir,
            child: None,
            tls,
            extra_args: extra_args.iter().map(|a| a.to_string()).collect(),
            name: "it".into(),
            initial_cluster: None,
            peer_tls: false,
        };
        e.restart()?;
        Ok(e)
    }

    /// Starts the `n` members of one etcd cluster (`m0`, `m1`, ...; on 127.0.0.1,
    /// clients over `tls` when given; the members to each other over TLS too when `tls`
    /// has a client CA: `--peer-client-cert-auth`, each member's certificate checked
    /// against that CA, so `tls.cert` must allow client authentication as well) and
    /// waits until each answers (at most 20 s).
    pub fn cluster(bin: PathBuf, tls: Option<EtcdTls>, n: usize) -> Result<Vec<Etcd>, String> {
        let peer_tls = tls.as_ref().is_some_and(|t| t.client_ca.is_some());
        let mut members: Vec<Etcd> = (0..n)
            .map(|i| Etcd {
                bin: bin.clone(),
                client_port: free_port(),
                peer_port: free_port(),
                metrics_port: free_port(),
                dir: std::env::temp_dir().join(format!(
                    "nvmf-qos-it-etcd-{}-m{i}-{}",
                    std::process::id(),
                    free_port()
                )),
                child: None,
                tls: tls.clone(),
                extra_args: Vec::new(),
                name: format!("m{i}"),
                initial_cluster: None,
                peer_tls,
            })
            .collect();
        let initial = members
            .iter()
            .map(|m| format!("{}={}", m.name, m.peer_url()))
            .collect::<Vec<_>>()
            .join(",");
        for m in &mut members {
            m.initial_cluster = Some(initial.clone());
            // A member of a new cluster answers only once a quorum runs: start all first.
            m.spawn()?;
        }
        for m in &members {
            m.wait_answer()?;
        }
        Ok(members)
    }

    /// `n` members of one etcd cluster over TLS throughout (clients with client
    /// certificates, members to each other), with `pki`'s certificates, once they have
    /// elected a raft leader (at most 20 s more): the members, and which one leads.
    pub fn tls_cluster(bin: PathBuf, pki: &Pki, n: usize) -> Result<(Vec<Etcd>, usize), String> {
        let tls = EtcdTls {
            cert: pki.server_cert(),
            key: pki.server_key(),
            client_ca: Some(pki.ca()),
        };
        let members = Etcd::cluster(bin, Some(tls), n)?;
        let t0 = Instant::now();
        loop {
            if let Some(l) = raft_leader(&members) {
                return Ok((members, l));
            }
            if t0.elapsed() > Duration::from_secs(20) {
                return Err(format!(
                    "the {n} etcd members elected no raft leader in 20 s"
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn peer_url(&self) -> String {
        let scheme = if self.peer_tls { "https" } else { "http" };
        format!("{scheme}://127.0.0.1:{}", self.peer_port)
    }

    /// Its member name (`it`, or `m0`, `m1`, ... in a cluster).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The client URL (`https://` when it serves TLS).
    pub fn url(&self) -> String {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        format!("{scheme}://127.0.0.1:{}", self.client_port)
    }

    fn log_path(&self) -> PathBuf {
        self.dir.with_extension("log")
    }

    /// Starts it again (after [`Etcd::stop`]) on the same ports and data.
    pub fn restart(&mut self) -> Result<(), String> {
        self.spawn()?;
        self.wait_answer()
    }

    fn spawn(&mut self) -> Result<(), String> {
        let client = self.url();
        let peer = self.peer_url();
        let initial = self
            .initial_cluster
            .clone()
            .unwrap_or_else(|| format!("{}={peer}", self.name));
        let log = std::fs::File::create(self.log_path()).map_err(|e| e.to_string())?;
        let mut cmd = Command::new(&self.bin);
        if let Some(t) = &self.tls {
            cmd.arg("--cert-file").arg(&t.cert);
            cmd.arg("--key-file").arg(&t.key);
            if let Some(ca) = &t.client_ca {
                cmd.arg("--client-cert-auth")
                    .arg("--trusted-ca-file")
                    .arg(ca);
                if self.peer_tls {
                    cmd.arg("--peer-cert-file").arg(&t.cert);
                    cmd.arg("--peer-key-file").arg(&t.key);
                    cmd.arg("--peer-client-cert-auth")
                        .arg("--peer-trusted-ca-file")
                        .arg(ca);
                }
            }
        }
        let child = cmd
            .args(["--name", &self.name, "--data-dir"])
            .arg(&self.dir)
            .args([
                "--listen-client-urls",
                &client,
                "--advertise-client-urls",
                &client,
            ])
            .args([
                "--listen-peer-urls",
                &peer,
                "--initial-advertise-peer-urls",
                &peer,
            ])
            .args(["--initial-cluster", &initial])
            .args([
                "--listen-metrics-urls",
                &format!("http://127.0.0.1:{}", self.metrics_port),
            ])
            .args(&self.extra_args)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(|e| format!("starting {}: {e}", self.bin.display()))?;
        self.child = Some(child);
        Ok(())
    }

    fn wait_answer(&self) -> Result<(), String> {
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_secs(20) {
            if self.answers() {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Err(format!("etcd did not answer on {} within 20 s", self.url()))
    }

    /// `GET /version` answers; over TLS (which this harness does not speak), etcd's log
    /// says it serves its clients.
    pub fn answers(&self) -> bool {
        use std::io::{Read, Write};
        if self.tls.is_some() {
            return std::fs::read_to_string(self.log_path())
                .is_ok_and(|l| l.contains("serving client requests"));
        }
        let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", self.client_port)) else {
            return false;
        };
        let _ = s.set_read_timeout(Some(Duration::from_secs(1)));
        let req = "GET /version HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
        let mut out = String::new();
        s.write_all(req.as_bytes()).is_ok()
            && s.read_to_string(&mut out).is_ok()
            && out.starts_with("HTTP/1.0 200")
            && out.contains("etcdserver")
    }

    /// A gauge of its `/metrics` (e.g. `etcd_server_is_leader`), read over the plain
    /// metrics port; `None` when it does not answer (stopped, killed, starting).
    pub fn gauge(&self, name: &str) -> Option<f64> {
        use std::io::{Read, Write};
        // A stopped member's port may be another process's by now.
        self.child.as_ref()?;
        let mut s = std::net::TcpStream::connect(("127.0.0.1", self.metrics_port)).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(1))).ok()?;
        s.write_all(b"GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
            .ok()?;
        let mut out = String::new();
        s.read_to_string(&mut out).ok()?;
        out.lines()
            .filter_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
            .find_map(|v| v.trim().parse().ok())
    }

    /// SIGKILL: gone at once, as a crashed member or host.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM, then SIGKILL after 5 s.
    pub fn stop(&mut self) {
        let Some(mut c) = self.child.take() else {
            return;
        };
        let _ = Command::new("kill").arg(c.id().to_string()).status();
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_secs(5) {
            if let Ok(Some(_)) = c.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = c.kill();
        let _ = c.wait();
    }
}

/// The member that leads the raft group now: the one member of those that answer whose
/// `etcd_server_is_leader` is 1, while every other that answers has a leader
/// (`etcd_server_has_leader`); `None` during an election or when no member answers.
pub fn raft_leader(members: &[Etcd]) -> Option<usize> {
    let mut leaders = Vec::new();
    for (i, m) in members.iter().enumerate() {
        let Some(is_leader) = m.gauge("etcd_server_is_leader") else {
            continue;
        };
        if m.gauge("etcd_server_has_leader") != Some(1.0) {
            return None;
        }
        if is_leader == 1.0 {
            leaders.push(i);
        }
    }
    match leaders[..] {
        [one] => Some(one),
        _ => None,
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
        let _ = std::fs::remove_file(self.log_path());
    }
}
