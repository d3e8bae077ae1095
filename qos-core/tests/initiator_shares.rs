//! Shares held at the initiator (issue 40 item 2) on the fluid target: four cooperative
//! hosts, weights 4/3/2/1 at queue depths 16/32/48/64 under `operating_point` over
//! circulation (N* = 110), are sent their in-flight allowances n_i* through their
//! completions (`qos_core::allowance`, the gate the target plugin runs) and report their
//! circulation; each keeps at most its allowance at the target and holds the rest
//! itself. They get the shares the target computes for them, and the target holds
//! (almost) none of their commands. A host that stops cooperating (its reports stop,
//! it sends its whole depth) is held at the target again.

mod fluid;

use fluid::{Coop, Host, domain, serve};
use qos_core::allowance::host_tag;
use qos_core::{ExcessSharing, HostConfig, Monitor, Nanos, TargetChannel};

const N_STAR: u64 = 110;
const SPEC: [(u32, u32); 4] = [(4, 16), (3, 32), (2, 48), (1, 64)];

/// n_i*: N* = 110 by weight 4/3/2/1 capped at the depths: 16 and 32 are capped,
/// the 62 left split 2:1 (docs/benchmarks.md, issue 39).
const PARTS: [f64; 4] = [16.0, 32.0, 62.0 * 2.0 / 3.0, 62.0 / 3.0];

fn setup(cooperative: bool) -> (Monitor, Vec<Host>) {
    let t0 = Nanos::from_secs(1);
    let mut cfg = domain(ExcessSharing::OperatingPoint);
    cfg.operating_in_flight_milli = Some(N_STAR * 1000);
    let mut m = Monitor::new(cfg, t0).unwrap();
    let hs = SPEC
        .iter()
        .enumerate()
        .map(|(i, &(weight, depth))| {
            let nqn = format!("h{i}");
            let mut c = HostConfig::new(&nqn);
            c.weight = weight;
            m.add_host(c, t0).unwrap();
            let mut h = Host::new(TargetChannel::new(m.channel(&nqn).unwrap()), depth);
            if cooperative {
                h.coop = Some(Coop::new(host_tag(&nqn)));
            }
            h
        })
        .collect();
    (m, hs)
}

/// (completed, held at the target, admitted) per host over `secs` seconds from `from`.
fn measure(m: &mut Monitor, hs: &mut [Host], from: u64, secs: u64) -> Vec<(u64, u64, u64)> {
    let snap = |hs: &mut [Host]| -> Vec<(u64, u64, u64)> {
        hs.iter_mut()
            .map(|h| {
                let c = h.ch.tokens().host().counters();
                (c.completed_ios, c.held_events, c.admitted_ios)
            })
            .collect()
    };
    let a = snap(hs);
    serve(m, hs, (from, secs));
    let b = snap(hs);
    a.iter()
        .zip(&b)
        .map(|(a, b)| (b.0 - a.0, b.1 - a.1, b.2 - a.2))
        .collect()
}

#[test]
fn cooperative_hosts_hold_their_own_excess_and_get_their_parts() {
    let (mut m, mut hs) = setup(true);
    serve(&mut m, &mut hs, (1, 3));
    let got = measure(&mut m, &mut hs, 4, 1);
    let total: u64 = got.iter().map(|g| g.0).sum();
    let allowances: Vec<_> = hs
        .iter()
        .map(|h| h.coop.as_ref().unwrap().allowance)
        .collect();
    println!(
        "cooperative: {got:?} (completed, held at the target, admitted), allowances {allowances:?}"
    );
    for (i, g) in got.iter().enumerate() {
        let e = PARTS[i] / N_STAR as f64;
        let share = g.0 as f64 / total as f64;
        assert!(
            (share - e).abs() <= 0.1 * e,
            "host {i}: {share:.3} of the target, e_i {e:.3} ({got:?})"
        );
        assert!(
            g.1 * 100 <= g.2,
            "host {i}: the target held {} of its {} admitted commands",
            g.1,
            g.2
        );
        let a = allowances[i].expect("an allowance was applied");
        assert!(
            a.abs_diff(PARTS[i].round() as u64) <= 2,
            "host {i}: allowance {a}, its part {:.1}",
            PARTS[i]
        );
    }
    // The QD-64 host keeps about 64 - 21 of its commands itself.
    let c = hs[3].coop.as_ref().unwrap();
    assert!(
        c.waiting >= 40,
        "waiting at the QD-64 initiator: {}",
        c.waiting
    );

    // It stops cooperating (a plain host with the same NQN): no more reports, its whole
    // depth sent. Once its report expires the target holds its excess again, as for
    // any host, and it is back to its part.
    hs[3].coop = None;
    serve(&mut m, &mut hs, (5, 1));
    let got = measure(&mut m, &mut hs, 6, 1);
    let total: u64 = got.iter().map(|g| g.0).sum();
    println!("host 3 plain: {got:?}, held now {}", hs[3].ch.held());
    assert!(
        hs[3].ch.held() >= 30,
        "held at the target: {}",
        hs[3].ch.held()
    );
    let share = got[3].0 as f64 / total as f64;
    let e = PARTS[3] / N_STAR as f64;
    assert!(
        (share - e).abs() <= 0.1 * e,
        "host 3 plain: {share:.3}, e_i {e:.3}"
    );
}

/// The same hosts without the initiator's help: the target holds their excess (the
/// comparison the test above is judged against: shares alike, holds not).
#[test]
fn plain_hosts_are_held_at_the_target() {
    let (mut m, mut hs) = setup(false);
    serve(&mut m, &mut hs, (1, 3));
    let got = measure(&mut m, &mut hs, 4, 1);
    println!("plain: {got:?}");
    let held: u64 = got.iter().map(|g| g.1).sum();
    let admitted: u64 = got.iter().map(|g| g.2).sum();
    assert!(held * 10 >= admitted, "held {held} of {admitted}");
}
