//! A real etcd server (Debian's `etcd-server`) for the cluster tests: started on
//! 127.0.0.1 on ports of its own with a fresh data directory, stopped (and its
//! directory removed) when dropped, also when the test fails. It can be stopped and
//! started again on the same ports and data, as the etcd-outage test needs.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::env::or_skip;
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

/// A running (or stopped) etcd.
#[derive(Debug)]
pub struct Etcd {
    bin: PathBuf,
    pub client_port: u16,
    peer_port: u16,
    dir: PathBuf,
    child: Option<Child>,
}

impl Etcd {
    /// Starts etcd and waits until it answers (at most 20 s).
    pub fn start(bin: PathBuf) -> Result<Etcd, String> {
        let dir = std::env::temp_dir().join(format!(
            "nvmf-qos-it-etcd-{}-{}",
            std::process::id(),
            free_port()
        ));
        let mut e = Etcd {
            bin,
            client_port: free_port(),
            peer_port: free_port(),
            dir,
            child: None,
        };
        e.restart()?;
        Ok(e)
    }

    /// The client URL.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.client_port)
    }

    /// Starts it again (after [`Etcd::stop`]) on the same ports and data.
    pub fn restart(&mut self) -> Result<(), String> {
        let client = self.url();
        let peer = format!("http://127.0.0.1:{}", self.peer_port);
        let log =
            std::fs::File::create(self.dir.with_extension("log")).map_err(|e| e.to_string())?;
        let child = Command::new(&self.bin)
            .args(["--name", "it", "--data-dir"])
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
            .args(["--initial-cluster", &format!("it={peer}")])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(|e| format!("starting {}: {e}", self.bin.display()))?;
        self.child = Some(child);
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_secs(20) {
            if self.answers() {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Err(format!("etcd did not answer on {} within 20 s", self.url()))
    }

    /// `GET /version` answers.
    pub fn answers(&self) -> bool {
        use std::io::{Read, Write};
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

impl Drop for Etcd {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
        let _ = std::fs::remove_file(self.dir.with_extension("log"));
    }
}
