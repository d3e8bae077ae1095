//! The agents against a real etcd (Debian's `etcd-server`, started by the test on
//! 127.0.0.1) with stub targets, in real time: leases that really expire, an etcd that
//! really goes away for 10 s, and the command line. Skipped, saying so, without etcd.

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::{Cluster, NQN};
use it_harness::etcd::{Etcd, etcd_or_skip};
use nvmf_qos_agent::store::EtcdGateway;

fn sleep(_: &mut EtcdGateway, ms: u64) {
    std::thread::sleep(Duration::from_millis(ms));
}

fn cluster(e: &Etcd) -> Cluster<EtcdGateway> {
    let g = EtcdGateway::new(&e.url(), Duration::from_millis(500));
    Cluster::new(g, sleep, 3_000, 6_000, true)
}

#[test]
fn real_etcd_division_failover_and_outage() {
    let Some(bin) = etcd_or_skip("cluster agents against a real etcd") else {
        return;
    };
    let mut etcd = Etcd::start(bin).unwrap_or_else(|e| panic!("{e}"));
    let mut c = cluster(&etcd);

    // Demand moves from 80/20 to 20/80.
    c.want(8_000, 2_000);
    for _ in 0..8 {
        c.interval();
    }
    let before = c.limit_shares();
    assert_eq!(before.iter().sum::<u64>(), 6_000, "{before:?}");
    assert!(before[0] > before[1], "{before:?}");
    c.want(2_000, 8_000);
    for _ in 0..2 {
        c.interval();
    }
    let after = c.limit_shares();
    println!("limit shares 80/20: {before:?}, two intervals after the move to 20/80: {after:?}");
    assert!(
        after[1] > after[0] && c.served() >= 5_700,
        "{after:?}, served {}",
        c.served()
    );

    // etcd away for 10 s while the demand moves back: the agents trade the move
    // (the handover), never holding more than the contract together.
    etcd.stop();
    c.want(8_000, 2_000);
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(10) {
        c.interval();
        let l = c.limit_shares();
        assert!(
            l.iter().sum::<u64>() <= 6_000,
            "limits {l:?} over 6000 without etcd"
        );
    }
    let traded = c.limit_shares();
    assert!(
        traded[0] > traded[1] && c.served() >= 5_500,
        "the move was not followed without etcd: {traded:?}, served {}",
        c.served()
    );
    etcd.restart().unwrap_or_else(|e| panic!("{e}"));
    // etcd back: the division takes over from the traded shares, with no jump back and
    // never above the contract (+0.5 %, the agents' rule for a limit going down).
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(3) {
        c.interval();
        let l = c.limit_shares();
        assert!(
            l[0] > l[1] && l.iter().sum::<u64>() <= 6_030,
            "after etcd's restart: {l:?}"
        );
    }
    println!(
        "limit shares: 10 s without etcd after the move back to 80/20: {traded:?}; 3 s after its restart: {:?}",
        c.limit_shares()
    );

    // Target a dies: its agent stops renewing; the survivor gets the whole contract.
    c.targets[0].alive = false;
    let t0 = Instant::now();
    while c.targets[1].settings[NQN].limit_iops != Some(6_000) {
        c.interval();
        assert!(
            t0.elapsed() < Duration::from_secs(6),
            "survivor has {:?}",
            c.targets[1].settings[NQN]
        );
    }
    println!(
        "the survivor holds the whole contract {:?} after its peer's target died (lease TTL 2 s)",
        t0.elapsed()
    );
    assert_eq!(c.targets[1].settings[NQN].reservation_iops, 3_000);
}

fn agent_cmd(e: &Etcd, args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_nvmf-qos-agent"))
        .args(["--etcd", &e.url()])
        .args(args)
        .output()
        .expect("run nvmf-qos-agent");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into(),
        String::from_utf8_lossy(&out.stderr).into(),
    )
}

#[test]
fn the_command_line_refuses_bad_input_with_a_fix() {
    let Some(bin) = etcd_or_skip("the agent's command line against a real etcd") else {
        return;
    };
    let etcd = Etcd::start(bin).unwrap_or_else(|e| panic!("{e}"));
    let host_set = |extra: &[&str]| {
        let base = ["host", "set", "--cluster", "c", "--host-nqn", "h"];
        agent_cmd(&etcd, &[&base[..], extra].concat())
    };
    let (ok, _, err) = host_set(&[]);
    assert!(!ok && err.contains("create it with"), "{err}");
    assert!(agent_cmd(&etcd, &["cluster", "create", "--cluster", "c"]).0);
    let (ok, _, err) = agent_cmd(&etcd, &["cluster", "create", "--cluster", "c"]);
    assert!(!ok && err.contains("already exists"), "{err}");
    let (ok, _, err) = agent_cmd(&etcd, &["cluster", "create", "--cluster", "a/b"]);
    assert!(!ok && err.contains("letters, digits"), "{err}");
    let (ok, _, err) = host_set(&["--min-iops", "10", "--max-iops", "5"]);
    assert!(!ok && err.contains("lower the reservation"), "{err}");
    // No agent joined the cluster: refused after --wait-s, saying what to do.
    let t0 = std::time::Instant::now();
    let (ok, _, err) = host_set(&["--min-iops", "10", "--wait-s", "1"]);
    assert!(
        !ok && err.contains("no target of cluster c is live after waiting 1 s")
            && err.contains("Start the agents"),
        "{err}"
    );
    assert!(t0.elapsed() >= std::time::Duration::from_secs(1));
    // Without a reservation no capacity is needed.
    let (ok, _, err) = host_set(&["--max-iops", "500"]);
    assert!(ok, "{err}");
    let (ok, out, _) = agent_cmd(&etcd, &["show", "--cluster", "c"]);
    assert!(
        ok && out.contains("host h") && out.contains("limit 500 IOPS"),
        "{out}"
    );
    let (ok, _, err) = agent_cmd(&etcd, &["cluster", "delete", "--cluster", "c"]);
    assert!(!ok && err.contains("1 hosts"), "{err}");
    assert!(
        agent_cmd(
            &etcd,
            &["host", "remove", "--cluster", "c", "--host-nqn", "h"]
        )
        .0
    );
    assert!(agent_cmd(&etcd, &["cluster", "delete", "--cluster", "c"]).0);
    let (ok, _, err) = agent_cmd(&etcd, &["show", "--cluster", "c"]);
    assert!(!ok && err.contains("does not exist"), "{err}");
}

/// `claim` against a real etcd (its nested transaction and the LEASE comparison): a key
/// absent is claimed, claimed again under the same lease, refused under another lease
/// (the value stays the first's), and free again once the first lease is revoked.
#[test]
fn a_claimed_key_is_refused_to_another_lease_until_the_first_ends() {
    use nvmf_qos_agent::store::Store;
    let Some(bin) = etcd_or_skip("claiming a key in a real etcd") else {
        return;
    };
    let etcd = Etcd::start(bin).unwrap_or_else(|e| panic!("{e}"));
    let mut g = EtcdGateway::new(&etcd.url(), Duration::from_millis(2000));
    let (first, second) = (g.grant(10).unwrap(), g.grant(10).unwrap());
    let k = "/nvmf-qos/claim-test/members/a";
    assert!(g.claim(k, "first", first).unwrap(), "absent: claimed");
    assert!(g.claim(k, "first again", first).unwrap(), "same lease");
    assert!(!g.claim(k, "second", second).unwrap(), "another lease");
    assert_eq!(g.get(k).unwrap().as_deref(), Some("first again"));
    g.revoke(first).unwrap();
    assert!(
        g.claim(k, "second", second).unwrap(),
        "free after the revoke"
    );
    assert_eq!(g.get(k).unwrap().as_deref(), Some("second"));
}
