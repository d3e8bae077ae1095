//! One agent's handover step while etcd is away (`Handover::step`), at the sizes of the
//! lab's fleet: a target holding shares of 1,000 or 10,000 hosts, 63 peers whose
//! reports name the 5 % of the hosts held at them (a third of those with a release
//! addressed to this target). What a real agent would spend per interval on the
//! decision (the peers' HTTP and the target's RPCs come on top).

use std::collections::BTreeMap;
use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use qos_core::cluster::{ClusterHost, LocalShare, PathDemand};
use qos_core::handover::{Amounts, Handover, HandoverConfig, HandoverReport, HostHandover};

const PEERS: usize = 63;

fn nqn(k: usize) -> String {
    format!("nqn.2014-08.org.example:host-{k:05}")
}

/// This target's book, the contracts, its hosts' demand and the peers' reports.
fn setup(
    hosts: usize,
) -> (
    Handover,
    BTreeMap<String, ClusterHost>,
    BTreeMap<String, PathDemand>,
    Vec<HandoverReport>,
) {
    let contract = ClusterHost {
        reservation_iops: 1_000,
        limit_iops: Some(4_000),
        weight: 1,
        ..Default::default()
    };
    let share = LocalShare {
        reservation_iops: 500,
        limit_iops: Some(2_000),
        weight: 1,
        ..Default::default()
    };
    let contracts: BTreeMap<String, ClusterHost> =
        (0..hosts).map(|k| (nqn(k), contract.clone())).collect();
    let mine: BTreeMap<String, LocalShare> = (0..hosts).map(|k| (nqn(k), share)).collect();
    let mut book = Handover::new("t00");
    book.rebase(7, &mine);
    // Half the hosts use this target (served 300 IOPS, not held): their spare shares
    // are released where a peer holds them.
    let demand: BTreeMap<String, PathDemand> = (0..hosts)
        .step_by(2)
        .map(|k| {
            let d = PathDemand {
                served: 300,
                ..Default::default()
            };
            (nqn(k), d)
        })
        .collect();
    let reports = (1..=PEERS)
        .map(|p| {
            let held = (0..hosts).filter(|k| k % 20 == p % 20);
            HandoverReport {
                target: format!("t{p:02}"),
                seq: Some(7),
                hosts: held
                    .map(|k| {
                        let mut h = HostHandover {
                            held: true,
                            ..Default::default()
                        };
                        if k % 3 == 0 {
                            let a = Amounts {
                                limit_iops: 100,
                                ..Default::default()
                            };
                            h.released.insert("t00".into(), a);
                        }
                        (nqn(k), h)
                    })
                    .collect(),
            }
        })
        .collect();
    (book, contracts, demand, reports)
}

fn bench(c: &mut Criterion) {
    for hosts in [1_000, 10_000] {
        let (book, contracts, demand, reports) = setup(hosts);
        let cfg = HandoverConfig::default();
        c.bench_function(&format!("handover_step/{hosts}_hosts_{PEERS}_peers"), |b| {
            b.iter(|| {
                black_box(book.step(black_box(&demand), black_box(&reports), &contracts, &cfg))
            })
        });
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
