//! The time I/O spent held, through the real path: a `HoldQueue`, the channel's
//! tokens and the monitor's statistics (an integration test, so that the
//! histogram module's own tests import nothing of the monitor: qos-core has no import
//! circle, test modules included).

use qos_core::histogram::HELD_BUCKETS_NS;
use qos_core::{
    DomainConfig, HoldQueue, HostConfig, IoKind, Monitor, Nanos, Rate, ReservationRelease,
};

/// Through the real path: a host reserved and limited to 10 commands per 1 s period
/// (released at the period start), its
/// commands going through a `HoldQueue` and `ChannelTokens`, the monitor's stats.
#[test]
fn held_commands_are_timed_and_periods_counted() {
    let cfg = DomainConfig {
        release: ReservationRelease::Start,
        ..DomainConfig::default()
    };
    let t0 = Nanos::from_secs(1);
    let mut m = Monitor::new(cfg, t0).unwrap();
    m.add_host(
        HostConfig::new("nqn.test:h")
            .with_reservation(Rate::iops(10))
            .with_limit(Rate::iops(10)),
        t0,
    )
    .unwrap();
    let mut ch = m.channel("nqn.test:h").unwrap();
    let mut q: HoldQueue<u32> = HoldQueue::new();
    let mut sent = 0;
    for i in 0..15 {
        if q.admit_or_hold(&mut ch, IoKind::Read, 4096, t0, i)
            .is_some()
        {
            sent += 1;
        }
    }
    assert_eq!(sent, 10, "the limit admits 10 commands in the first period");
    ch.flush();
    let s = m.stats(t0);
    let h = &s.hosts[0];
    assert_eq!(h.held_time.count(), 10);
    assert_eq!(h.held_time.cumulative[0], 10, "not delayed at all");
    assert_eq!(h.held_time.held_ios, 5);
    assert_eq!(h.held_time.sum_ns, 0);
    // The next period releases the other five after 1.2 s of waiting.
    let t1 = Nanos(t0.0 + 1_200_000_000);
    m.tick(t1);
    let released = q.release(&mut ch, t1, |_, _| {});
    assert_eq!(released, 5);
    ch.flush();
    let s = m.stats(t1);
    let h = &s.hosts[0];
    assert_eq!(h.held_time.count(), 15);
    let i_1s = HELD_BUCKETS_NS
        .iter()
        .position(|&b| b == 1_000_000_000)
        .unwrap();
    assert_eq!(
        h.held_time.cumulative[i_1s], 10,
        "1.2 s is above the 1 s bound"
    );
    assert_eq!(h.held_time.cumulative[i_1s + 1], 15);
    assert_eq!(h.held_time.sum_ns, 5 * 1_200_000_000);
    // One period ended: the host completed nothing (no completions recorded), so it
    // missed its reservation, backlogged.
    assert_eq!(h.period_counts.missed_backlogged, 1);
    assert_eq!(h.period_counts.met + h.period_counts.missed, 0);
    assert!(
        h.hold_events_total >= 1,
        "the first refused command at least"
    );
    // Only the filtered host is built.
    assert_eq!(m.stats_of(t1, Some("nqn.test:other")).hosts.len(), 0);
    assert_eq!(m.stats_of(t1, Some("nqn.test:h")).hosts.len(), 1);
}
