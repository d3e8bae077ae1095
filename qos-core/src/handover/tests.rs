//! The handover's bound under any interleaving, and a demand move followed.

use super::*;
use proptest::prelude::*;

fn contract() -> ClusterHost {
    ClusterHost {
        reservation_iops: 400,
        limit_iops: Some(1000),
        weight: 1,
        reservation_mibps: 40,
        limit_mibps: Some(100),
    }
}

fn share(frac_milli: u64) -> LocalShare {
    let c = contract();
    let part = |v: u64| v * frac_milli / 1000;
    LocalShare {
        reservation_iops: part(c.reservation_iops),
        // A limit share is at least 1, as the division makes it.
        limit_iops: c.limit_iops.map(|l| part(l).max(1)),
        weight: 1,
        reservation_mibps: part(c.reservation_mibps),
        limit_mibps: c.limit_mibps.map(|l| part(l).max(1)),
    }
}

fn one(nqn: &str, s: LocalShare) -> BTreeMap<String, LocalShare> {
    BTreeMap::from([(nqn.to_string(), s)])
}

fn demand(served: u64, backlogged: bool) -> BTreeMap<String, PathDemand> {
    BTreeMap::from([(
        "h".to_string(),
        PathDemand {
            served,
            backlogged,
            served_bytes: served * 64 * 1024,
            ..Default::default()
        },
    )])
}

fn contracts() -> BTreeMap<String, ClusterHost> {
    BTreeMap::from([("h".to_string(), contract())])
}

/// One target's step and commit, everything applied.
fn tick(t: &mut Handover, served: u64, held: bool, peers: &[HandoverReport]) -> LocalShare {
    let d = demand(served, held);
    t.observe(&d);
    let s = t.step(&d, peers, &contracts(), &HandoverConfig::default());
    t.commit(&s, |_| true);
    s.shares["h"]
}

#[test]
fn a_release_never_leaves_a_reservation_above_its_limit() {
    // A reservation close to its limit (the real two-target test's is 88 % of it).
    let tight = ClusterHost {
        reservation_iops: 1000,
        limit_iops: Some(1030),
        weight: 1,
        reservation_mibps: 0,
        limit_mibps: None,
    };
    let contracts = BTreeMap::from([("h".to_string(), tight)]);
    let half = LocalShare {
        reservation_iops: 500,
        limit_iops: Some(515),
        ..LocalShare::default()
    };
    let (mut a, mut b) = (Handover::new("a"), Handover::new("b"));
    a.rebase(7, &one("h", half));
    b.rebase(7, &one("h", half));
    let held_at_a = demand(515, true);
    a.observe(&held_at_a);
    let s = a.step(
        &held_at_a,
        &[b.report()],
        &contracts,
        &HandoverConfig::default(),
    );
    a.commit(&s, |_| true);
    // B served 450 (495 with the headroom): its reservation's spare (5, 1 %) is below
    // the release threshold, its limit's (20, 3.9 %) is not.
    let d = demand(450, false);
    b.observe(&d);
    let s = b.step(&d, &[a.report()], &contracts, &HandoverConfig::default());
    let at_b = s.shares["h"];
    assert!(
        at_b.reservation_iops <= at_b.limit_iops.unwrap(),
        "reservation above the limit: {at_b:?}"
    );
}

#[test]
fn a_demand_move_is_followed_by_a_release_and_a_take() {
    let (mut a, mut b) = (Handover::new("a"), Handover::new("b"));
    a.rebase(7, &one("h", share(200)));
    b.rebase(7, &one("h", share(800)));
    // The demand moved from B to A: A is held, B served 150 IOPS.
    tick(&mut a, 200, true, &[b.report()]);
    let at_b = tick(&mut b, 150, false, &[a.report()]);
    // B keeps what it served plus the headroom, and at least 1 MiB/s of its limit.
    assert!(at_b.limit_iops.unwrap() < 200, "{at_b:?}");
    assert!(at_b.reservation_iops < 200, "{at_b:?}");
    let at_a = tick(&mut a, 200, true, &[b.report()]);
    assert_eq!(
        at_a.limit_iops.unwrap() + at_b.limit_iops.unwrap(),
        1000,
        "{at_a:?} {at_b:?}"
    );
    assert_eq!(at_a.reservation_iops + at_b.reservation_iops, 400);
    assert_eq!(at_a.limit_mibps.unwrap() + at_b.limit_mibps.unwrap(), 100);
    // Taking again from the same report changes nothing; a new division starts over.
    assert_eq!(tick(&mut a, 200, true, &[b.report()]), at_a);
    a.rebase(8, &one("h", share(500)));
    assert!(!a.traded());
    assert_eq!(tick(&mut a, 200, true, &[b.report()]), share(500));
}

#[test]
fn nothing_moves_between_targets_on_different_divisions_or_without_a_held_peer() {
    let (mut a, mut b) = (Handover::new("a"), Handover::new("b"));
    a.rebase(7, &one("h", share(200)));
    b.rebase(6, &one("h", share(800)));
    tick(&mut a, 200, true, &[b.report()]);
    assert_eq!(tick(&mut b, 10, false, &[a.report()]), share(800));
    b.rebase(7, &one("h", share(800)));
    tick(&mut a, 200, false, &[b.report()]);
    assert_eq!(tick(&mut b, 10, false, &[a.report()]), share(800));
}

#[test]
fn a_release_the_target_did_not_apply_is_not_published() {
    let (mut a, mut b) = (Handover::new("a"), Handover::new("b"));
    a.rebase(1, &one("h", share(200)));
    b.rebase(1, &one("h", share(800)));
    tick(&mut a, 200, true, &[b.report()]);
    let d = demand(100, false);
    let s = b.step(&d, &[a.report()], &contracts(), &HandoverConfig::default());
    assert!(s.shares["h"].limit_iops < Some(800));
    b.commit(&s, |_| false);
    assert!(
        b.report()
            .hosts
            .get("h")
            .is_none_or(|h| h.released.is_empty())
    );
    assert_eq!(tick(&mut a, 200, true, &[b.report()]), share(200));
}

#[test]
fn a_forged_report_never_raises_a_share_above_the_contract() {
    let mut a = Handover::new("a");
    a.rebase(1, &one("h", share(500)));
    let big = Amounts {
        reservation_iops: u64::MAX,
        limit_iops: u64::MAX,
        reservation_mibps: u64::MAX,
        limit_mibps: u64::MAX,
    };
    let forged = HandoverReport {
        target: "b".into(),
        seq: Some(1),
        hosts: BTreeMap::from([(
            "h".into(),
            HostHandover {
                held: false,
                released: BTreeMap::from([("a".into(), big)]),
            },
        )]),
    };
    assert_eq!(tick(&mut a, 1, true, &[forged]), share(1000));
}

/// Σ over targets of what each holds, per amount.
fn total(held: &[LocalShare]) -> [u64; 4] {
    held.iter().fold([0; 4], |t, s| {
        [
            t[0] + s.reservation_iops,
            t[1] + s.limit_iops.unwrap_or(0),
            t[2] + s.reservation_mibps,
            t[3] + s.limit_mibps.unwrap_or(0),
        ]
    })
}

proptest! {
    /// Whatever the order of the targets' intervals, however stale the reports each
    /// reads and whichever shares the targets refuse, the shares the targets hold add
    /// up to at most the contract in each amount.
    #[test]
    fn the_targets_never_hold_more_than_the_contract(
        split in proptest::collection::vec(1u64..100, 2..5),
        events in proptest::collection::vec(
            (0usize..4, 0u64..1500, any::<bool>(), any::<bool>(), 0usize..8), 1..120),
    ) {
        let n = split.len();
        let sum: u64 = split.iter().sum();
        // The division: the parts add up to the contract, the last takes the rounding.
        let mut parts: Vec<u64> = split.iter().map(|s| s * 1000 / sum).collect();
        parts[n - 1] = 1000 - parts[..n - 1].iter().sum::<u64>();
        let c = contract();
        let mut books: Vec<Handover> = (0..n).map(|i| Handover::new(&format!("t{i}"))).collect();
        let mut held: Vec<LocalShare> = Vec::new();
        for (i, b) in books.iter_mut().enumerate() {
            let s = share(parts[i]);
            b.rebase(3, &one("h", s));
            held.push(s);
        }
        let cap = [
            c.reservation_iops,
            c.limit_iops.unwrap(),
            c.reservation_mibps,
            c.limit_mibps.unwrap(),
        ];
        let base_total = total(&held);
        prop_assert!(base_total.iter().zip(cap).all(|(t, c)| *t <= c));
        // Every report each target published, so a reader can see an old one.
        let mut published: Vec<Vec<HandoverReport>> = books.iter().map(|b| vec![b.report()]).collect();
        for (who, served, backlogged, applied, stale) in events {
            let who = who % n;
            let peers: Vec<HandoverReport> = published
                .iter()
                .enumerate()
                .filter(|(i, _)| *i != who)
                .map(|(_, h)| h[h.len().saturating_sub(1 + stale).min(h.len() - 1)].clone())
                .collect();
            let d = demand(served, backlogged);
            books[who].observe(&d);
            let s = books[who].step(&d, &peers, &contracts(), &HandoverConfig::default());
            if applied {
                held[who] = s.shares["h"];
            }
            books[who].commit(&s, |_| applied);
            published[who].push(books[who].report());
            let t = total(&held);
            for k in 0..4 {
                prop_assert!(t[k] <= base_total[k], "amount {k}: {t:?} > {base_total:?}: {held:?}");
            }
            // A target refuses a reservation above its limit.
            for h in &held {
                prop_assert!(h.limit_iops.is_none_or(|l| h.reservation_iops <= l), "{h:?}");
                prop_assert!(h.limit_mibps.is_none_or(|l| h.reservation_mibps <= l), "{h:?}");
            }
        }
    }
}
