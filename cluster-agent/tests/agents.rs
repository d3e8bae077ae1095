//! Agents of a two-target cluster, driven interval by interval against the in-memory
//! store and stub targets: the rules of docs/cluster.md, deterministically. The same
//! cases against a real etcd are in `tests/etcd.rs`, against real targets in
//! `tests/cluster.rs`.

mod common;

use common::{Cluster, NQN, StubTarget};
use nvmf_qos_agent::admin;
use nvmf_qos_agent::agent::{Agent, AgentConfig};
use nvmf_qos_agent::store::{MemStore, Store};
use qos_core::cluster::{ClusterHost, DivideConfig};

fn mem(reservation: u64, limit: u64) -> Cluster<MemStore> {
    Cluster::new(
        MemStore::default(),
        |s, ms| s.advance(ms),
        reservation,
        limit,
        true,
    )
}

#[test]
fn shares_follow_a_demand_that_moves_within_three_intervals() {
    let mut c = mem(3_000, 6_000);
    c.want(8_000, 2_000);
    for _ in 0..10 {
        c.interval();
    }
    let s = c.limit_shares();
    assert_eq!(s.iter().sum::<u64>(), 6_000, "limit shares add up: {s:?}");
    assert!(
        c.served() >= 5_800,
        "the host gets its limit: {s:?}, {}",
        c.served()
    );
    c.want(2_000, 8_000);
    let mut after = Vec::new();
    for _ in 0..6 {
        c.interval();
        after.push(c.served());
        let s = c.limit_shares();
        assert!(s.iter().sum::<u64>() <= 6_000 * 1005 / 1000, "{s:?}");
    }
    println!(
        "served per interval after the move: {after:?}, shares {:?}",
        c.limit_shares()
    );
    // The demand window is a period (two intervals) and the leader (a) divides before
    // b has reported the interval: the third division after the move follows it.
    assert!(
        after[2..].iter().all(|&x| x >= 5_700),
        "served per interval after the move: {after:?}"
    );
}

#[test]
fn a_dead_target_s_shares_go_to_the_survivor_once_its_lease_expires() {
    let mut c = mem(3_000, 6_000);
    c.want(8_000, 8_000);
    for _ in 0..8 {
        c.interval();
    }
    assert!(
        c.limit_shares().iter().all(|&s| s > 1_000),
        "{:?}",
        c.limit_shares()
    );
    c.targets[0].alive = false;
    // TTL 2 s = 8 intervals, then the survivor's next interval divides and applies.
    let mut n = 0;
    while c.targets[1].settings[NQN].limit_iops != Some(6_000) {
        c.interval();
        n += 1;
        assert!(n <= 10, "survivor has {:?}", c.targets[1].settings[NQN]);
    }
    assert_eq!(c.targets[1].settings[NQN].reservation_iops, 3_000);
    assert!(n >= 7, "not before the lease expired ({n} intervals)");
}

#[test]
fn with_etcd_down_and_no_handover_targets_keep_their_shares_and_resume_after() {
    let mut c = Cluster::new(
        MemStore::default(),
        |s, ms| s.advance(ms),
        3_000,
        6_000,
        false,
    );
    c.want(8_000, 2_000);
    for _ in 0..8 {
        c.interval();
    }
    let before = c.limit_shares();
    c.store.down = true;
    c.want(2_000, 8_000);
    for _ in 0..40 {
        c.interval();
        assert_eq!(
            c.limit_shares(),
            before,
            "nothing changes while etcd is down"
        );
    }
    c.store.down = false;
    for _ in 0..4 {
        c.interval();
    }
    let s = c.limit_shares();
    assert!(s[1] > s[0], "the move is followed once etcd is back: {s:?}");
    assert!(c.served() >= 5_700);
}

#[test]
fn with_etcd_down_the_targets_trade_the_move_without_exceeding_the_contract() {
    let mut c = mem(3_000, 6_000);
    c.want(8_000, 2_000);
    for _ in 0..8 {
        c.interval();
    }
    let before = c.limit_shares();
    assert!(before[0] > before[1], "{before:?}");
    c.store.down = true;
    c.want(2_000, 8_000);
    let mut followed = None;
    for i in 0..40 {
        c.interval();
        let (r, l) = (c.reservation_shares(), c.limit_shares());
        assert!(
            r.iter().sum::<u64>() <= 3_000,
            "reservations {r:?} over 3000"
        );
        assert!(l.iter().sum::<u64>() <= 6_000, "limits {l:?} over 6000");
        if followed.is_none() && l[1] > l[0] {
            followed = Some(i + 1);
        }
    }
    let during = c.limit_shares();
    // One interval for the demand window to show the move, one for A's release, one
    // for B's take.
    assert!(
        followed.is_some_and(|n| n <= 4),
        "followed after {followed:?} intervals: {during:?}"
    );
    assert!(c.served() >= 5_500, "served {} of 6000", c.served());
    // Both paths use their reservation share (each serves 2000 or more): none moves.
    assert_eq!(c.reservation_shares().iter().sum::<u64>(), 3_000);
    // etcd back: the next division takes over from the traded shares, with no jump back.
    c.store.down = false;
    for _ in 0..6 {
        c.interval();
        let l = c.limit_shares();
        assert!(l[1] > l[0], "jumped back to the old division: {l:?}");
        assert!(l.iter().sum::<u64>() <= 6_000 * 1005 / 1000 + 2, "{l:?}");
    }
    assert!(c.served() >= 5_700);
}

#[test]
fn with_etcd_down_between_two_agents_reading_a_division_they_trade_on_the_one_before() {
    let mut c = mem(3_000, 6_000);
    c.want(8_000, 2_000);
    for _ in 0..8 {
        c.interval();
    }
    // The demand moves; etcd goes away right after one agent has read the division
    // that follows it and before the other has.
    c.want(2_000, 8_000);
    let mut seqs = [None, None];
    let mut split = false;
    for _ in 0..10 {
        c.pass_interval();
        let mut peers = c.reports();
        for i in 0..2 {
            if !split && seqs[0].is_some() && seqs[0] != seqs[1] {
                c.store.down = true;
                split = true;
            }
            seqs[i] = c.tick_one(i, &mut peers).shares_seq.or(seqs[i]);
        }
        if split {
            break;
        }
    }
    assert!(split, "no new division within 10 intervals: {seqs:?}");
    let mut other_division = 0;
    for _ in 0..20 {
        let reports = c.interval();
        other_division += reports
            .iter()
            .map(|r| r.peers_other_division)
            .sum::<usize>();
        let (r, l) = (c.reservation_shares(), c.limit_shares());
        assert!(
            r.iter().sum::<u64>() <= 3_000,
            "reservations {r:?} over 3000"
        );
        assert!(l.iter().sum::<u64>() <= 6_000, "limits {l:?} over 6000");
    }
    assert!(
        other_division > 0,
        "the agents never saw the split: {seqs:?}"
    );
    let l = c.limit_shares();
    assert!(
        l[1] > l[0],
        "the move was not followed while etcd was away: {l:?}"
    );
}

#[test]
fn a_removed_host_is_given_back_and_bad_commands_are_refused() {
    let mut c = mem(3_000, 6_000);
    c.want(1_000, 1_000);
    for _ in 0..4 {
        c.interval();
    }
    assert!(c.targets.iter().all(|t| t.settings.contains_key(NQN)));
    admin::host_remove(&mut c.store, "c1", NQN).unwrap();
    for _ in 0..2 {
        c.interval();
    }
    assert!(c.targets.iter().all(|t| !t.settings.contains_key(NQN)));

    let e = admin::host_remove(&mut c.store, "c1", NQN).unwrap_err();
    assert!(e.to_string().contains("is not in cluster c1"), "{e}");
    let e = admin::cluster_create(&mut c.store, "c1", DivideConfig::default(), false).unwrap_err();
    assert!(e.to_string().contains("already exists"), "{e}");
    let big = ClusterHost {
        reservation_iops: 250_000,
        limit_iops: None,
        weight: 1,
        ..Default::default()
    };
    // Two live stub targets estimate 100,000 IOPS each.
    let e = admin::host_set(&mut c.store, "c1", "h2", big).unwrap_err();
    assert!(e.to_string().contains("cluster level"), "{e}");
    let e = admin::host_set(
        &mut c.store,
        "nope",
        "h2",
        ClusterHost {
            reservation_iops: 1,
            limit_iops: None,
            weight: 1,
            ..Default::default()
        },
    )
    .unwrap_err();
    assert!(e.to_string().contains("does not exist"), "{e}");
    let e = admin::cluster_delete(&mut c.store, "c1", false).unwrap_err();
    assert!(e.to_string().contains("live targets"), "{e}");
    assert!(c.store.list("/nvmf-qos/c1/").unwrap().len() > 3);
    admin::cluster_delete(&mut c.store, "c1", true).unwrap();
    assert!(c.store.list("/nvmf-qos/c1/").unwrap().is_empty());
}

#[test]
fn a_host_holds_its_cold_share_where_it_has_no_path_and_a_share_once_it_comes() {
    let mut c = mem(3_000, 6_000);
    c.want(8_000, 0);
    for _ in 0..10 {
        c.interval();
    }
    let cold = &c.targets[1].settings[NQN];
    assert_eq!(
        (cold.reservation_iops, cold.limit_iops),
        (0, Some(1)),
        "{cold:?}"
    );
    let path = &c.targets[0].settings[NQN];
    assert_eq!(
        (path.reservation_iops, path.limit_iops),
        (3_000, Some(6_000))
    );
    // It fails over to b: held at b's cold share, b becomes a path, a is left cold.
    c.want(0, 8_000);
    let mut n = 0;
    while c.targets[1].settings[NQN].limit_iops < Some(5_000) {
        c.interval();
        n += 1;
        let s = c.limit_shares();
        assert!(s.iter().sum::<u64>() <= 6_000 + 2, "{s:?}");
        assert!(n <= 8, "b has {:?}", c.targets[1].settings[NQN]);
    }
    for _ in 0..6 {
        c.interval();
    }
    assert_eq!(c.reservation_shares(), [0, 3_000]);
    assert_eq!(c.limit_shares(), [1, 6_000]);
    println!("b took the host's contract {n} intervals after the failover");
}

/// In a cluster of key schema 2 (agents older than schema 3 may be in it) every part
/// lists every host, the cold shares written out; moved to schema 3 (`cluster create
/// --update --key-schema 3`), the parts list the hosts with a path only.
#[test]
fn parts_list_every_host_in_schema_2_and_the_paths_only_in_schema_3() {
    use nvmf_qos_agent::division;
    use nvmf_qos_agent::keys::Keys;
    let mut c = mem(3_000, 6_000);
    admin::cluster_create_with_schema(&mut c.store, "c1", DivideConfig::default(), true, Some(2))
        .unwrap();
    c.want(8_000, 0);
    for _ in 0..10 {
        c.interval();
    }
    let k = Keys::new("c1");
    let part_of_b = |c: &mut Cluster<MemStore>, schema| {
        let (_, plan) = division::read_all(&mut c.store, &k, schema, &mut Vec::new())
            .unwrap()
            .unwrap();
        plan["b"].get(NQN).copied()
    };
    let cold = part_of_b(&mut c, 2).expect("schema 2: every host in every part");
    assert_eq!((cold.reservation_iops, cold.limit_iops), (0, Some(1)));
    admin::cluster_create_with_schema(&mut c.store, "c1", DivideConfig::default(), true, Some(3))
        .unwrap();
    for _ in 0..4 {
        c.interval();
    }
    assert_eq!(
        part_of_b(&mut c, 3),
        None,
        "schema 3: no path at b, left out"
    );
    let held = &c.targets[1].settings[NQN];
    assert_eq!((held.reservation_iops, held.limit_iops), (0, Some(1)));
}

/// A second agent started with target a's name (a copy-paste of a's `--target`) finds
/// a's member record under another lease: it writes nothing, leads nothing and applies
/// nothing, so the host's shares over the three targets still add up to its contract.
/// Once a's agent is gone (its lease expired), the name is free and the second agent
/// takes a's place.
#[test]
fn a_second_agent_with_a_target_s_name_writes_and_applies_nothing_while_it_is_taken() {
    let mut c = mem(3_000, 6_000);
    c.want(8_000, 2_000);
    for _ in 0..6 {
        c.interval();
    }
    c.agents.push(Agent::new(AgentConfig {
        cluster: "c1".into(),
        target: "a".into(),
        domain: "d".into(),
        lease_ttl_s: 2,
        window_ms: None,
        handover_url: None,
    }));
    let mut intruder = StubTarget::default();
    intruder.alive = true;
    intruder.want.insert(NQN.into(), 8_000);
    c.targets.push(intruder);
    let demand_key = nvmf_qos_agent::keys::Keys::new("c1").demand("a");
    for _ in 0..6 {
        let r = c.interval();
        assert!(
            r[2].errors
                .iter()
                .any(|e| e.contains("target name a is taken")),
            "{:?}",
            r[2].errors
        );
        assert!(
            r[2].name_taken && !r[2].leader && r[2].shares_seq.is_none(),
            "{:?}",
            r[2]
        );
        assert!(c.targets[2].settings.is_empty(), "nothing applied");
        let s = c.limit_shares();
        assert!(s.iter().sum::<u64>() <= 6_000, "limit shares {s:?}");
    }
    // a's demand record is still a's: what a's target served (its limit share), not the
    // second target's 8,000 unlimited.
    let text = c
        .store
        .get(&demand_key)
        .unwrap()
        .expect("a's demand record");
    let d: nvmf_qos_agent::keys::DemandRecord = serde_json::from_str(&text).unwrap();
    assert!(d.hosts[NQN].served < 6_000, "{d:?}");
    // a's agent stops (no SIGTERM: its lease runs out); the second takes the name.
    let mut took = None;
    for i in 0..20 {
        c.pass_interval();
        let mut peers = c.reports();
        c.tick_one(1, &mut peers);
        let r = c.tick_one(2, &mut peers);
        if took.is_none() && r.errors.is_empty() && r.shares_seq.is_some() {
            took = Some(i);
        }
    }
    assert!(took.is_some(), "the name never came free");
    let (b, second) = (&c.targets[1], &c.targets[2]);
    let limits: Vec<u64> = [b, second]
        .iter()
        .map(|t| t.settings.get(NQN).and_then(|s| s.limit_iops).unwrap_or(0))
        .collect();
    assert!(
        limits.iter().sum::<u64>() <= 6_000 && limits[1] > 0,
        "b and the second agent's target: {limits:?} (took the name after {took:?} intervals)"
    );
}
