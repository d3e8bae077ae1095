//! The agents against a real three-member etcd cluster (Debian's `etcd-server`, three
//! processes on 127.0.0.1, clients over TLS with client certificates, the members to
//! each other over TLS with peer certificates), with stub
//! targets, in real time: the raft leader is killed (SIGKILL) while a host's demand
//! moves. The agents' gateway, whose first member was that leader, moves to another
//! member; the division goes on through the election, none is lost (the division's
//! sequence never goes back at either agent, and goes on after the election), none is
//! applied twice (a number an agent reads again holds the same part) and the shares
//! never add up to more than the contract. Skipped, saying so, without etcd.

mod common;

use std::time::{Duration, Instant};

use common::Cluster;
use it_harness::etcd::{Etcd, etcd_or_skip, raft_leader};
use it_harness::pki::Pki;
use nvmf_qos_agent::connect::EtcdOptions;
use nvmf_qos_agent::store::EtcdGateway;

fn sleep(_: &mut EtcdGateway, ms: u64) {
    std::thread::sleep(Duration::from_millis(ms));
}

fn options(endpoints: &[String], pki: &Pki) -> EtcdOptions {
    EtcdOptions {
        endpoint: endpoints.join(","),
        timeout: Duration::from_millis(500),
        ca: Some(pki.ca()),
        cert: Some(pki.client_cert()),
        key: Some(pki.client_key()),
        ..Default::default()
    }
}

#[test]
fn the_raft_leader_killed_during_a_demand_move() {
    let Some(bin) = etcd_or_skip("the agents against a three-member etcd cluster") else {
        return;
    };
    let pki = Pki::new("etcd3");
    let (mut members, leader) = Etcd::tls_cluster(bin, &pki, 3).unwrap_or_else(|e| panic!("{e}"));
    // The gateway starts at the leader: killing it makes the agents move members too.
    let mut urls: Vec<String> = members.iter().map(Etcd::url).collect();
    urls.rotate_left(leader);
    let g = EtcdGateway::connect(&options(&urls, &pki)).unwrap_or_else(|e| panic!("{e}"));
    let mut c = Cluster::new(g, sleep, 3_000, 6_000, true);
    c.want(8_000, 2_000);
    let t0 = Instant::now();
    while c.limit_shares()[0] <= c.limit_shares()[1] {
        c.interval();
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "no division: {:?}",
            c.limit_shares()
        );
    }
    let mut last_seq = vec![None; 2];
    for _ in 0..4 {
        for (i, r) in c.interval().iter().enumerate() {
            last_seq[i] = r.shares_seq.or(last_seq[i]);
        }
    }
    let before = last_seq.clone();

    c.want(2_000, 8_000);
    members[leader].kill();
    let killed = Instant::now();
    let (mut followed, mut failed_intervals, mut trace) = (None, 0, Vec::new());
    let mut parts = std::collections::BTreeMap::new();
    while killed.elapsed() < Duration::from_secs(8) {
        let reports = c.interval();
        let l = c.limit_shares();
        assert!(
            l.iter().sum::<u64>() <= 6_030,
            "limits {l:?} above the contract"
        );
        for (i, r) in reports.iter().enumerate() {
            if !r.etcd_ok {
                failed_intervals += 1;
            }
            if let Some(s) = r.shares_seq {
                assert!(
                    last_seq[i].is_none_or(|l| s >= l),
                    "agent {i} went back from division #{:?} to #{s}",
                    last_seq[i]
                );
                last_seq[i] = Some(s);
                // One number, one division: a division applied again under its number
                // is the same division.
                let part = parts.entry((i, s)).or_insert_with(|| r.shares.clone());
                assert_eq!(*part, r.shares, "agent {i}: two divisions numbered #{s}");
            }
        }
        trace.push(format!(
            "{:.2} s {l:?} #{:?} ok {:?}",
            killed.elapsed().as_secs_f64(),
            last_seq,
            reports.iter().map(|r| r.etcd_ok).collect::<Vec<_>>()
        ));
        if followed.is_none() && l[1] > l[0] {
            followed = Some(killed.elapsed());
        }
    }
    let new_leader = raft_leader(&members);
    println!(
        "raft leader m{leader} killed: new leader {:?}; the gateway moved from {} to {}; {failed_intervals} agent intervals did not finish with etcd; the move followed after {followed:?}; divisions #{before:?} before, #{last_seq:?} after",
        new_leader.map(|l| members[l].name().to_string()),
        urls[0],
        c.store.endpoint()
    );
    assert_ne!(
        c.store.endpoint(),
        urls[0],
        "the gateway still calls the dead member"
    );
    assert!(
        new_leader.is_some_and(|l| l != leader),
        "no new raft leader"
    );
    assert!(
        last_seq.iter().zip(&before).all(|(a, b)| a > b),
        "no division after the election: {before:?} -> {last_seq:?}\n{}",
        trace.join("\n")
    );
    let f = followed.unwrap_or_else(|| panic!("the move was not followed:\n{}", trace.join("\n")));
    // An election takes about a second (etcd's default election timeout); then a
    // division (the leader agent's second interval back) and its apply.
    assert!(f < Duration::from_secs(5), "{}", trace.join("\n"));
}
