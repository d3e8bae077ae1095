//! `nvmf-qos-agent run --listen`: the binary against a real etcd over mutual TLS and a
//! stub target on a Unix socket (the target plugin's JSON-RPC methods the agent calls),
//! scraped as Prometheus would: its share of a host's contract, leadership, lease and
//! last etcd contact in /metrics, and /healthz 200 while etcd answers, 503 once it has
//! been away longer than the lease TTL. Skipped, saying so, without etcd.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use it_harness::etcd::{Etcd, EtcdTls, etcd_or_skip};
use it_harness::pki::Pki;
use it_harness::setup::free_port;
use serde_json::{Value, json};

const NQN: &str = "nqn.2014-08.org.example:metrics-host";

/// What the stub target does: answer, refuse `qos_host_set`, or drop every connection
/// unanswered (a dead target).
const ANSWER: u8 = 0;
const REFUSE: u8 = 1;
const DEAD: u8 = 2;

/// A target that answers `qos_stats_get` (capacity 50,000 IOPS, 500 ms periods, no
/// I/O) and keeps what `qos_host_set` gives it for `qos_host_get`; or, as `mode` says,
/// refuses `qos_host_set` (-28, as its admission check does) or is dead.
fn stub_target(sock: &Path) -> Arc<AtomicU8> {
    let listener = UnixListener::bind(sock).expect("bind the stub target's socket");
    let settings: Arc<Mutex<BTreeMap<String, Value>>> = Arc::default();
    let mode = Arc::new(AtomicU8::new(ANSWER));
    let m = Arc::clone(&mode);
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut c) = conn else { return };
            if m.load(Ordering::SeqCst) == DEAD {
                continue;
            }
            let Some(Ok(req)) = serde_json::Deserializer::from_reader(&mut c)
                .into_iter::<Value>()
                .next()
            else {
                continue;
            };
            let mut s = settings.lock().unwrap();
            let result = match req["method"].as_str().unwrap_or("") {
                "qos_stats_get" => json!([{
                    "period_ns": 500_000_000u64,
                    "capacity_estimate": {"ops": 25_000},
                    "hosts": [],
                }]),
                "qos_host_get" => Value::Array(s.values().cloned().collect()),
                "qos_host_set" if m.load(Ordering::SeqCst) == REFUSE => {
                    let answer = json!({"jsonrpc": "2.0", "id": req["id"], "error": {
                        "code": -28,
                        "message": "reservation of 1000 IOPS exceeds the domain's capacity estimate",
                    }});
                    let _ = c.write_all(answer.to_string().as_bytes());
                    continue;
                }
                "qos_host_set" => {
                    let p = req["params"].clone();
                    s.insert(p["host_nqn"].as_str().unwrap_or("").into(), p);
                    json!(true)
                }
                "qos_host_remove" => {
                    s.remove(req["params"]["host_nqn"].as_str().unwrap_or(""));
                    json!(true)
                }
                m => panic!("the agent called {m}"),
            };
            let answer = json!({"jsonrpc": "2.0", "id": req["id"], "result": result});
            let _ = c.write_all(answer.to_string().as_bytes());
        }
    });
    mode
}

/// `GET path` on 127.0.0.1:port: status code and body.
fn get(port: u16, path: &str) -> (u16, String) {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect to --listen");
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    write!(s, "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let code = out
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = out.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    (code, body.to_string())
}

/// The value of the metric line that starts with `series ` (name and labels).
fn value(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

/// Polls `f` every 100 ms until it returns `Some`, at most `secs`.
fn wait_for<T>(secs: u64, what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let t0 = Instant::now();
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(t0.elapsed() < Duration::from_secs(secs), "{what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The agent process, stopped (SIGKILL) when dropped, also when the test fails.
struct AgentProcess(Child);

impl Drop for AgentProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn metrics_and_health_over_a_tls_etcd() {
    let Some(bin) = etcd_or_skip("the agent's /metrics and /healthz against a real etcd") else {
        return;
    };
    let pki = Pki::new("metrics");
    let tls = EtcdTls {
        cert: pki.server_cert(),
        key: pki.server_key(),
        client_ca: Some(pki.ca()),
    };
    let mut etcd = Etcd::start_with(bin, Some(tls), &[]).unwrap_or_else(|e| panic!("{e}"));
    let sock: PathBuf = pki.dir.join("target.sock");
    let _ = stub_target(&sock);
    let etcd_args: Vec<String> = [
        "--etcd".to_string(),
        etcd.url(),
        "--etcd-ca".into(),
        pki.ca().display().to_string(),
        "--etcd-cert".into(),
        pki.client_cert().display().to_string(),
        "--etcd-key".into(),
        pki.client_key().display().to_string(),
    ]
    .into();
    let agent = env!("CARGO_BIN_EXE_nvmf-qos-agent");
    let admin = |args: &[&str]| {
        let out = Command::new(agent)
            .args(&etcd_args)
            .args(args)
            .output()
            .unwrap();
        assert!(out.status.success(), "{args:?}: {out:?}");
    };
    admin(&["cluster", "create", "--cluster", "m"]);

    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let _agent = AgentProcess(
        Command::new(agent)
            .args(&etcd_args)
            .args(["run", "--cluster", "m", "--target", "a", "--domain", "d"])
            .args([
                "--interval-ms",
                "100",
                "--lease-ttl-s",
                "2",
                "--listen",
                &listen,
            ])
            .arg("--rpc-socket")
            .arg(&sock)
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start nvmf-qos-agent run"),
    );
    // Once the agent is a member, the host is admitted against its capacity.
    wait_for(10, "/healthz never answered 200", || {
        std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
        (get(port, "/healthz").0 == 200).then_some(())
    });
    admin(&[
        "host",
        "set",
        "--cluster",
        "m",
        "--host-nqn",
        NQN,
        "--min-iops",
        "1000",
        "--max-iops",
        "4000",
    ]);
    let share = format!("nvmf_qos_agent_share_reservation_iops{{host_nqn=\"{NQN}\"}}");
    let text = wait_for(10, "the share never appeared in /metrics", || {
        let (code, text) = get(port, "/metrics");
        assert_eq!(code, 200, "{text}");
        value(&text, &share).map(|_| text)
    });
    println!("{text}");
    // The only target holds the whole contract, leads and holds its lease.
    for (series, want) in [
        (share.as_str(), 1000.0),
        (
            &format!("nvmf_qos_agent_share_limit_iops{{host_nqn=\"{NQN}\"}}"),
            4000.0,
        ),
        (
            &format!("nvmf_qos_agent_host_reservation_iops{{host_nqn=\"{NQN}\"}}"),
            1000.0,
        ),
        ("nvmf_qos_agent_leader", 1.0),
        ("nvmf_qos_agent_lease_held", 1.0),
        ("nvmf_qos_agent_etcd_up", 1.0),
        ("nvmf_qos_agent_target_up", 1.0),
        ("nvmf_qos_agent_errors_total{kind=\"etcd\"}", 0.0),
    ] {
        assert_eq!(value(&text, series), Some(want), "{series} in\n{text}");
    }
    let age = value(&text, "nvmf_qos_agent_etcd_last_contact_age_seconds").unwrap();
    assert!(age < 1.0, "last contact {age} s ago");
    assert!(text.contains("nvmf_qos_agent_info{cluster=\"m\",target=\"a\",domain=\"d\""));

    // etcd goes away: healthy within the lease TTL, then 503 with the reason.
    let stopped = Instant::now();
    etcd.stop();
    let (code, why) = wait_for(10, "/healthz stayed 200 without etcd", || {
        let (code, why) = get(port, "/healthz");
        (code != 200).then_some((code, why))
    });
    let after = stopped.elapsed();
    println!("/healthz {code} {after:?} after etcd stopped: {why}");
    assert_eq!(code, 503);
    assert!(why.contains("lease TTL"), "{why}");
    assert!(
        after >= Duration::from_millis(1500),
        "503 only after about the lease TTL (2 s), not {after:?}"
    );
    let (_, text) = get(port, "/metrics");
    assert_eq!(value(&text, "nvmf_qos_agent_etcd_up"), Some(0.0), "{text}");
    assert_eq!(
        value(&text, "nvmf_qos_agent_lease_held"),
        Some(0.0),
        "{text}"
    );
    assert!(
        value(&text, "nvmf_qos_agent_errors_total{kind=\"etcd\"}").unwrap() >= 1.0,
        "{text}"
    );
    assert_eq!(get(port, "/nothing").0, 404);
}

#[test]
fn a_refused_share_and_a_dead_target_over_a_plain_etcd() {
    let Some(bin) = etcd_or_skip("the agent's refused shares and dead target against a real etcd")
    else {
        return;
    };
    let etcd = Etcd::start(bin).unwrap_or_else(|e| panic!("{e}"));
    let dir = std::env::temp_dir().join(format!("qos-agent-refused-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let sock = dir.join("target.sock");
    let mode = stub_target(&sock);
    let agent = env!("CARGO_BIN_EXE_nvmf-qos-agent");
    let admin = |args: &[&str]| {
        Command::new(agent)
            .args(["--etcd", &etcd.url()])
            .args(args)
            .output()
            .unwrap()
    };
    assert!(
        admin(&["cluster", "create", "--cluster", "r"])
            .status
            .success()
    );
    let port = free_port();
    let log_path = dir.join("agent.log");
    let _agent = AgentProcess(
        Command::new(agent)
            .args(["--etcd", &etcd.url()])
            .args(["run", "--cluster", "r", "--target", "a", "--domain", "d"])
            .args(["--interval-ms", "100", "--lease-ttl-s", "2"])
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .arg("--rpc-socket")
            .arg(&sock)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log_path).unwrap())
            .spawn()
            .expect("start nvmf-qos-agent run"),
    );
    // Right after the agent starts: `host set` waits for it to join instead of failing.
    mode.store(REFUSE, Ordering::SeqCst);
    let out = admin(&[
        "host",
        "set",
        "--cluster",
        "r",
        "--host-nqn",
        NQN,
        "--min-iops",
        "1000",
    ]);
    assert!(out.status.success(), "{out:?}");
    let refused = format!("nvmf_qos_agent_share_refused{{host_nqn=\"{NQN}\"}}");
    wait_for(10, "the refusal never showed in /metrics", || {
        std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
        (value(&get(port, "/metrics").1, &refused) == Some(1.0)).then_some(())
    });
    // Refused at every interval for 3 s: logged once, shown readably.
    std::thread::sleep(Duration::from_secs(3));
    let show = String::from_utf8(admin(&["show", "--cluster", "r"]).stdout).unwrap();
    let want = format!(
        "    REFUSED share of {NQN} (reservation 1000 IOPS, no limit, weight 1): target refused qos_host_set: reservation of 1000 IOPS exceeds the domain's capacity estimate (code -28)"
    );
    assert!(show.lines().any(|l| l == want), "{want}\nnot in\n{show}");
    let log = std::fs::read_to_string(&log_path).unwrap();
    assert_eq!(
        log.matches("refused the share of").count(),
        1,
        "one line for a refusal that lasts 3 s:\n{log}"
    );
    assert!(!log.contains("LocalShare"), "{log}");
    // Accepted again: the gauge goes back to 0 and the log says so.
    mode.store(ANSWER, Ordering::SeqCst);
    wait_for(5, "the refusal never cleared", || {
        (value(&get(port, "/metrics").1, &refused) == Some(0.0)).then_some(())
    });
    // The target dies; etcd is fine, and the agent says so.
    mode.store(DEAD, Ordering::SeqCst);
    wait_for(5, "target_up never went to 0", || {
        (value(&get(port, "/metrics").1, "nvmf_qos_agent_target_up") == Some(0.0)).then_some(())
    });
    std::thread::sleep(Duration::from_secs(1));
    let (_, text) = get(port, "/metrics");
    assert_eq!(value(&text, "nvmf_qos_agent_etcd_up"), Some(1.0), "{text}");
    assert_eq!(
        value(&text, "nvmf_qos_agent_errors_total{kind=\"etcd\"}"),
        Some(0.0),
        "{text}"
    );
    assert!(
        value(&text, "nvmf_qos_agent_errors_total{kind=\"target\"}").unwrap() >= 5.0,
        "{text}"
    );
    let log = std::fs::read_to_string(&log_path).unwrap();
    assert!(
        log.contains("the target no longer refuses the share of"),
        "{log}"
    );
    assert!(
        log.contains("etcd answers (lease not renewed: the target is down)"),
        "{log}"
    );
    println!("{log}");
    let _ = std::fs::remove_dir_all(&dir);
}
