//! Tenant groups under admission by concurrency (`operating_point`, issue 26): on a
//! fluid target with a depth curve, saturated by closed-loop hosts, a group's hosts
//! split its weight by theirs, the group never goes above its limit, and it gets its
//! reservation together; each also over the hosts' circulation (issue 39: the group
//! nested in the hold targets).

mod fluid;

use fluid::{Host, domain, serve};
use qos_core::{ExcessSharing, GroupConfig, HostConfig, Monitor, Nanos, Rate, TargetChannel};

/// Seconds of load before periods are judged (the curve is learned in the first).
const WARMUP: u64 = 2;
/// Periods (1 s) judged.
const PERIODS: u64 = 6;

/// Adds `group`, then each host `(config, queue depth)`; serves them for the warm-up
/// and [`PERIODS`] periods, and returns each host's completions per judged period and
/// the report's C\*. The operating point is η on the curve at the base, or over the
/// hosts' circulation at `n_star` commands (issue 39).
fn run_at(
    group: GroupConfig,
    hosts: Vec<(HostConfig, u32)>,
    n_star: Option<u64>,
) -> (Vec<Vec<u64>>, f64) {
    let t0 = Nanos::from_secs(1);
    let mut cfg = domain(ExcessSharing::OperatingPoint);
    cfg.operating_in_flight_milli = n_star.map(|n| n * 1000);
    let mut m = Monitor::new(cfg, t0).unwrap();
    m.add_group(group, t0).unwrap();
    let mut served: Vec<Host> = hosts
        .into_iter()
        .map(|(cfg, depth)| {
            let nqn = cfg.host_nqn.clone();
            m.add_host(cfg, t0).unwrap();
            Host::new(TargetChannel::new(m.channel(&nqn).unwrap()), depth)
        })
        .collect();
    let counters: Vec<_> = served
        .iter_mut()
        .map(|h| h.ch.tokens().host().clone())
        .collect();
    let done = |i: usize| counters[i].counters().completed_ios;
    serve(&mut m, &mut served, (1, WARMUP));
    let mut per_period = vec![Vec::new(); served.len()];
    for p in 0..PERIODS {
        let before: Vec<u64> = (0..served.len()).map(done).collect();
        serve(&mut m, &mut served, (1 + WARMUP + p, 1));
        for (i, got) in per_period.iter_mut().enumerate() {
            got.push(done(i) - before[i]);
        }
    }
    let op = m
        .stats(Nanos::from_secs(1 + WARMUP + PERIODS))
        .operating_point
        .expect("the curve was learned");
    println!("operating point {op:?}");
    (per_period, op.rate as f64)
}

/// Per period, the sum over hosts `of`.
fn together(per_period: &[Vec<u64>], of: &[usize]) -> Vec<u64> {
    (0..PERIODS as usize)
        .map(|p| of.iter().map(|&i| per_period[i][p]).sum())
        .collect()
}

fn total(per_period: &[Vec<u64>]) -> Vec<u64> {
    together(per_period, &(0..per_period.len()).collect::<Vec<_>>())
}

fn host(nqn: &str, weight: u32) -> HostConfig {
    let mut c = HostConfig::new(nqn);
    c.group = Some("g".into());
    c.weight = weight;
    c
}

#[test]
fn a_group_s_hosts_split_its_weighted_share_by_their_weights() {
    split_by_weight(None);
}

#[test]
fn over_circulation_a_group_s_hosts_split_its_weighted_share_by_their_weights() {
    // N* = 40 of the 96 commands: g and c 20 each, a 5 and b 15.
    split_by_weight(Some(40));
}

/// The fluid target's rate with `n` commands at its base.
fn fluid_rate(n: u64) -> f64 {
    fluid::T_MAX * n as f64 / (n as f64 + fluid::HALF_DEPTH)
}

fn split_by_weight(n_star: Option<u64>) {
    // g (weight 1): a (weight 1) and b (weight 3); c alone (weight 1). All at QD 32:
    // g and c get half each, a an eighth, b three eighths.
    let mut c = HostConfig::new("c");
    c.weight = 1;
    let (got, c_star) = run_at(
        GroupConfig::new("g"),
        vec![(host("a", 1), 32), (host("b", 3), 32), (c, 32)],
        n_star,
    );
    // Over circulation the report's C* is what the target did; judge the total
    // against what the fluid target does at N*.
    let c_star = n_star.map_or(c_star, fluid_rate);
    let all = total(&got);
    for p in 0..PERIODS as usize {
        let t = all[p] as f64;
        let share = |i: usize| got[i][p] as f64 / t;
        println!(
            "period {p}: total {} a {:.3} b {:.3} c {:.3}",
            all[p],
            share(0),
            share(1),
            share(2)
        );
        for (i, want) in [(0, 0.125), (1, 0.375), (2, 0.5)] {
            assert!(
                (share(i) - want).abs() <= 0.1 * want,
                "period {p}: host {i} got {:.3} of {t}, wants {want}",
                share(i)
            );
        }
        assert!(t >= 0.95 * c_star, "period {p}: total {t}, C* {c_star}");
    }
}

#[test]
fn a_group_never_goes_above_its_limit_and_the_others_take_the_rest() {
    group_limit(None);
}

#[test]
fn over_circulation_a_group_never_goes_above_its_limit_and_the_others_take_the_rest() {
    group_limit(Some(40));
}

fn group_limit(n_star: Option<u64>) {
    // g (weight 3, limit 60 K) would get three quarters of the target by weight.
    let limit = 60_000;
    let group = GroupConfig {
        limit: Rate::iops(limit),
        weight: 3,
        ..GroupConfig::new("g")
    };
    let (got, c_star) = run_at(
        group,
        vec![
            (host("a", 1), 32),
            (host("b", 1), 32),
            (HostConfig::new("c"), 32),
        ],
        n_star,
    );
    let c_star = n_star.map_or(c_star, fluid_rate);
    let (g, all) = (together(&got, &[0, 1]), total(&got));
    println!("group per period {g:?}, total {all:?}");
    for p in 0..PERIODS as usize {
        assert!(
            g[p] * 100 <= limit * 101,
            "period {p}: group {} > {limit} + 1%",
            g[p]
        );
        assert!(
            g[p] * 100 >= limit * 97,
            "period {p}: group {} well under its limit {limit} while backlogged",
            g[p]
        );
        let t = all[p] as f64;
        assert!(t >= 0.95 * c_star, "period {p}: total {t}, C* {c_star}");
    }
}

#[test]
fn a_group_gets_its_reservation_together_beside_a_heavier_host() {
    group_reservation(None);
}

#[test]
fn over_circulation_a_group_gets_its_reservation_together_beside_a_heavier_host() {
    group_reservation(Some(40));
}

fn group_reservation(n_star: Option<u64>) {
    // g (weight 1, reservation 90 K of the ~190 K the target does) against c (weight
    // 8): by weight g would get a ninth. b has 10 K of its own inside g's 90 K.
    let reservation = 90_000;
    let group = GroupConfig {
        reservation: Rate::iops(reservation),
        ..GroupConfig::new("g")
    };
    let mut c = HostConfig::new("c");
    c.weight = 8;
    let (got, c_star) = run_at(
        group,
        vec![
            (host("a", 1), 32),
            (host("b", 1).with_reservation(Rate::iops(10_000)), 32),
            (c, 64),
        ],
        n_star,
    );
    let c_star = n_star.map_or(c_star, fluid_rate);
    let (g, all) = (together(&got, &[0, 1]), total(&got));
    println!("group per period {g:?}, total {all:?}");
    for p in 0..PERIODS as usize {
        assert!(
            g[p] >= reservation,
            "period {p}: group {} < its reservation {reservation}",
            g[p]
        );
        // Reservations first, not the group first: c keeps the rest.
        assert!(
            got[2][p] as f64 >= 0.9 * (all[p] - reservation) as f64 * 0.9,
            "period {p}: c got {} of {}",
            got[2][p],
            all[p]
        );
        let t = all[p] as f64;
        assert!(t >= 0.95 * c_star, "period {p}: total {t}, C* {c_star}");
    }
}
