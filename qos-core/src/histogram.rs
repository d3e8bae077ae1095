//! Time I/O spent held by QoS, as a histogram with fixed buckets (Prometheus style:
//! each bucket counts observations up to its bound). A channel records into its own
//! [`HeldTime`] (plain integers, one add per command) and publishes it into the host's
//! [`SharedHeldTime`] (atomics) when it flushes its other counters, so statistics cost
//! the I/O path nothing shared. Every admitted command is one observation: those
//! admitted at once wait zero and land in the first bucket, so quantiles over the
//! histogram are the latency QoS added to all of a host's I/O.

use serde::Serialize;

use crate::sync::{AtomicU64, Ordering};
use crate::time::Nanos;

/// Upper bounds of the buckets in nanoseconds (inclusive), then one for everything
/// above the last bound. Zero has a bucket of its own: the commands QoS did not delay.
pub const HELD_BUCKETS_NS: [u64; 18] = [
    0,
    10_000,
    25_000,
    50_000,
    100_000,
    250_000,
    500_000,
    1_000_000,
    2_500_000,
    5_000_000,
    10_000_000,
    25_000_000,
    50_000_000,
    100_000_000,
    250_000_000,
    500_000_000,
    1_000_000_000,
    2_500_000_000,
];

/// Buckets including the last one (above every bound).
pub const HELD_BUCKET_COUNT: usize = HELD_BUCKETS_NS.len() + 1;

#[inline]
fn bucket(ns: u64) -> usize {
    // Most commands are not held at all; the rest are rare enough for a short scan.
    if ns == 0 {
        return 0;
    }
    HELD_BUCKETS_NS
        .iter()
        .position(|&b| ns <= b)
        .unwrap_or(HELD_BUCKETS_NS.len())
}

/// One channel's unpublished observations.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HeldTime {
    counts: [u64; HELD_BUCKET_COUNT],
    sum_ns: u64,
    /// Commands that entered the hold queue (throttled).
    entered: u64,
}

impl HeldTime {
    /// A command leaves QoS after waiting `waited` (zero: admitted at once).
    #[inline]
    pub fn record(&mut self, waited: Nanos) {
        self.counts[bucket(waited.0)] += 1;
        self.sum_ns = self.sum_ns.saturating_add(waited.0);
    }
    /// A command was queued for want of tokens or limit.
    #[inline]
    pub fn entered(&mut self, n: u64) {
        self.entered += n;
    }
    pub fn is_empty(&self) -> bool {
        self.entered == 0 && self.counts.iter().all(|&c| c == 0)
    }
    /// Observations so far.
    pub fn count(&self) -> u64 {
        self.counts.iter().sum()
    }
}

/// A host's published observations (monotonic counters, shared by its channels).
///
/// Written by the host's channels when they flush (adds), read by the statistics; all
/// `Relaxed`: each counter is exact by its adds alone and publishes nothing else, so a
/// snapshot taken while channels flush may mix two flushes (statistics only).
#[derive(Debug, Default)]
pub struct SharedHeldTime {
    /// Commands that left QoS, per bucket of the time they waited ([`HELD_BUCKETS_NS`]).
    counts: [AtomicU64; HELD_BUCKET_COUNT],
    /// The time they waited, summed, ns.
    sum_ns: AtomicU64,
    /// Commands that entered a hold queue.
    entered: AtomicU64,
}

impl SharedHeldTime {
    /// Adds `local` and clears it.
    pub fn publish(&self, local: &mut HeldTime) {
        if local.is_empty() {
            return;
        }
        for (a, c) in self.counts.iter().zip(local.counts.iter_mut()) {
            if *c != 0 {
                a.fetch_add(std::mem::take(c), Ordering::Relaxed);
            }
        }
        if local.sum_ns != 0 {
            self.sum_ns
                .fetch_add(std::mem::take(&mut local.sum_ns), Ordering::Relaxed);
        }
        if local.entered != 0 {
            self.entered
                .fetch_add(std::mem::take(&mut local.entered), Ordering::Relaxed);
        }
    }

    pub fn snapshot(&self) -> HeldTimeSnapshot {
        let mut cumulative = Vec::with_capacity(HELD_BUCKET_COUNT);
        let mut acc = 0u64;
        for a in &self.counts {
            acc += a.load(Ordering::Relaxed);
            cumulative.push(acc);
        }
        HeldTimeSnapshot {
            cumulative,
            sum_ns: self.sum_ns.load(Ordering::Relaxed),
            held_ios: self.entered.load(Ordering::Relaxed),
        }
    }
}

/// What a host's held-time histogram says now.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct HeldTimeSnapshot {
    /// Per bucket of [`HELD_BUCKETS_NS`] (and the last, unbounded one): observations at
    /// most that long, cumulative. The last entry is the number of observations.
    pub cumulative: Vec<u64>,
    /// Total time held, over every observation.
    pub sum_ns: u64,
    /// Commands that were queued (throttled) at least once.
    pub held_ios: u64,
}

impl HeldTimeSnapshot {
    pub fn count(&self) -> u64 {
        self.cumulative.last().copied().unwrap_or(0)
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_inclusive_upper_bounds() {
        assert_eq!(bucket(0), 0);
        assert_eq!(bucket(1), 1);
        assert_eq!(bucket(10_000), 1);
        assert_eq!(bucket(10_001), 2);
        assert_eq!(bucket(2_500_000_000), HELD_BUCKETS_NS.len() - 1);
        assert_eq!(bucket(2_500_000_001), HELD_BUCKETS_NS.len());
        assert_eq!(bucket(u64::MAX), HELD_BUCKETS_NS.len());
        assert!(HELD_BUCKETS_NS.windows(2).all(|w| w[0] < w[1]));
    }

    #[test]
    fn publish_adds_and_clears_and_snapshot_is_cumulative() {
        let shared = SharedHeldTime::default();
        let mut a = HeldTime::default();
        a.record(Nanos(0));
        a.record(Nanos(0));
        a.record(Nanos(30_000));
        a.entered(1);
        let mut b = HeldTime::default();
        b.record(Nanos(3_000_000_000));
        b.entered(1);
        shared.publish(&mut a);
        shared.publish(&mut b);
        assert!(a.is_empty() && b.is_empty());
        let s = shared.snapshot();
        assert_eq!(s.cumulative.len(), HELD_BUCKET_COUNT);
        assert_eq!(s.cumulative[0], 2);
        assert_eq!(s.cumulative[2], 2, "30 us is above the 25 us bound");
        assert_eq!(s.cumulative[3], 3);
        assert_eq!(s.cumulative[HELD_BUCKETS_NS.len() - 1], 3);
        assert_eq!(s.count(), 4);
        assert_eq!(s.sum_ns, 3_000_030_000);
        assert_eq!(s.held_ios, 2);
        assert!(s.cumulative.windows(2).all(|w| w[0] <= w[1]));
        // Publishing again adds nothing: the local histogram was cleared.
        shared.publish(&mut a);
        assert_eq!(shared.snapshot(), s);
    }
}
