//! The monitor's check interval with 16, 256 and 1024 hosts: a conversion tick (every
//! host's reservation capped, the global pool recomputed) and a period roll-over, both
//! back to back (nothing armed ahead: every host's pools armed by the roll-over) and
//! after the period's check intervals have armed the next period's pools (the usual
//! case). Target: <= 50 us per tick at 1024 hosts.

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use qos_core::{Capacity, DomainConfig, HostConfig, IoKind, Monitor, Nanos, Rate};

fn setup(hosts: usize) -> Monitor {
    let cfg = DomainConfig {
        period: Nanos::from_secs(60),
        capacity: Capacity {
            iops: Some(100_000_000),
            iops_stddev: 1_000_000,
            ..Capacity::default()
        },
        ..DomainConfig::default()
    };
    let mut m = Monitor::new(cfg, Nanos::ZERO).unwrap();
    for i in 0..hosts {
        let h = HostConfig::new(format!("nqn.2026-11.io.bench:host{i}"))
            .with_reservation(Rate::iops(50_000_000 / hosts as u64))
            .with_limit(Rate::iops(90_000_000 / hosts as u64));
        m.add_host(h, Nanos::ZERO).unwrap();
    }
    // One host dips into the global pool, so every tick converts (Haechi step S2).
    let mut ch = m.channel("nqn.2026-11.io.bench:host0").unwrap();
    for _ in 0..100_000 {
        ch.try_admit(IoKind::Read, 4096, Nanos::from_secs(30));
        ch.record_completion(IoKind::Read, 4096);
    }
    ch.flush();
    m
}

fn ticks(c: &mut Criterion) {
    let mut g = c.benchmark_group("monitor_tick");
    for hosts in [16usize, 256, 1024] {
        let mut m = setup(hosts);
        let mut now = Nanos::from_millis(1);
        g.bench_with_input(BenchmarkId::new("conversion", hosts), &hosts, |b, _| {
            b.iter(|| {
                // Stay inside the 60 s period: 1 us steps.
                now = now.saturating_add(Nanos::from_micros(1));
                black_box(m.tick(now))
            })
        });
        let mut m = setup(hosts);
        let mut period_end = Nanos::from_secs(60);
        g.bench_with_input(BenchmarkId::new("roll_over", hosts), &hosts, |b, _| {
            b.iter(|| {
                let t = m.tick(period_end);
                period_end = period_end.saturating_add(Nanos::from_secs(60));
                black_box(t)
            })
        });
    }
    g.finish();
    // Each measured roll-over follows the check intervals that arm the next period's
    // pools (64 hosts per interval; untimed), so every iteration also runs a few
    // conversion ticks: fewer, shorter samples keep the run to seconds.
    let mut g = c.benchmark_group("monitor_tick");
    g.sample_size(20)
        .warm_up_time(Duration::from_millis(200))
        .measurement_time(Duration::from_millis(800));
    for hosts in [16usize, 256, 1024] {
        let mut m = setup(hosts);
        let mut period_start = Nanos::ZERO;
        let arming_ticks = hosts.div_ceil(64) as u64 + 1;
        g.bench_with_input(
            BenchmarkId::new("roll_over_armed_ahead", hosts),
            &hosts,
            |b, _| {
                b.iter_custom(|iters| {
                    let mut timed = Duration::ZERO;
                    for _ in 0..iters {
                        for k in 1..=arming_ticks {
                            let t = period_start.saturating_add(Nanos::from_millis(k));
                            assert!(m.tick(t).ended.is_none());
                        }
                        period_start = period_start.saturating_add(Nanos::from_secs(60));
                        let start = Instant::now();
                        let t = m.tick(period_start);
                        timed += start.elapsed();
                        assert!(t.ended.is_some());
                        black_box(t);
                    }
                    timed
                })
            },
        );
    }
    g.finish();
}

criterion_group!(benches, ticks);
criterion_main!(benches);
