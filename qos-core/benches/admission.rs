//! The per-I/O admission decision (`ChannelTokens::try_admit`): one thread, and one
//! thread while a second thread hammers another channel of the same host (the shared
//! pools' cache lines bounce on every batch refill). Target: <= 30 ns median.

use std::hint::black_box;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use criterion::{Criterion, criterion_group, criterion_main};
use qos_core::{Capacity, DomainConfig, EstimatorConfig, HostConfig, IoKind, Monitor, Nanos, Rate};

/// Half-way through the 60 s period: half of the paced release is out.
const NOW: Nanos = Nanos::from_secs(30);

fn monitor(limited: bool) -> Monitor {
    let cfg = DomainConfig {
        period: Nanos::from_secs(60),
        check_interval: Nanos::from_millis(1),
        // Enough tokens that the benchmark never runs dry within a period.
        capacity: Capacity {
            iops: 1 << 40,
            mibps: Some(1 << 26),
            ..Capacity::default()
        },
        estimator: EstimatorConfig {
            enabled: false,
            ..Default::default()
        },
        ..DomainConfig::default()
    };
    let mut m = Monitor::new(cfg, Nanos::ZERO).unwrap();
    let mut h = HostConfig::new("nqn.bench").with_reservation(Rate::iops(1 << 30));
    if limited {
        h.limit.total = Rate {
            iops: Some(1 << 38),
            mibps: Some(1 << 25),
        };
        h.limit.read = Rate::iops(1 << 38);
    }
    m.add_host(h, Nanos::ZERO).unwrap();
    m
}

fn single_thread(c: &mut Criterion) {
    let mut g = c.benchmark_group("admission");
    for (name, limited) in [("reservation_only", false), ("with_limits", true)] {
        let m = monitor(limited);
        let mut ch = m.channel("nqn.bench").unwrap();
        let mut held = 0u64;
        g.bench_function(format!("one_thread/{name}"), |b| {
            b.iter(|| {
                let a = ch.try_admit(black_box(IoKind::Read), black_box(4096), NOW);
                held += !a.is_admitted() as u64;
                black_box(a)
            })
        });
        // The figure is of the admitted path: a held command is another (shorter) one.
        assert_eq!(held, 0, "one_thread/{name}: commands were held");
    }
    g.finish();
}

fn two_threads(c: &mut Criterion) {
    let mut g = c.benchmark_group("admission");
    let m = monitor(true);
    let stop = Arc::new(AtomicBool::new(false));
    let mut other = m.channel("nqn.bench").unwrap();
    let s = stop.clone();
    let contender = std::thread::spawn(move || {
        let mut n = 0u64;
        while !s.load(Ordering::Relaxed) {
            if other.try_admit(IoKind::Write, 4096, NOW).is_admitted() {
                n += 1;
            }
        }
        n
    });
    let mut ch = m.channel("nqn.bench").unwrap();
    let mut held = 0u64;
    g.bench_function("two_threads_same_host/with_limits", |b| {
        b.iter_custom(|iters| {
            let start = Instant::now();
            for _ in 0..iters {
                let a = ch.try_admit(black_box(IoKind::Read), black_box(4096), NOW);
                held += !a.is_admitted() as u64;
                black_box(a);
            }
            start.elapsed()
        })
    });
    assert_eq!(
        held, 0,
        "two_threads_same_host/with_limits: commands were held"
    );
    stop.store(true, Ordering::Relaxed);
    let n = contender.join().unwrap();
    assert!(n > 0, "the contending thread made progress");
    g.finish();
}

criterion_group!(benches, single_thread, two_threads);
criterion_main!(benches);
