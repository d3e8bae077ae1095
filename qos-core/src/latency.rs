//! Latency bookkeeping: a sliding window of recent samples for control loops (the p99
//! of the reference probe that drives AIMD), and a log-linear histogram for reports
//! over millions of samples (p50, p99, p99.9 in the lab).

use std::collections::VecDeque;

use crate::time::Nanos;

/// The last `capacity` samples; quantiles are exact over the window.
#[derive(Debug, Clone)]
pub struct LatencyWindow {
    samples: VecDeque<u64>,
    capacity: usize,
    scratch: Vec<u64>,
}

impl LatencyWindow {
    pub fn new(capacity: usize) -> Self {
        let capacity = capacity.max(1);
        LatencyWindow {
            samples: VecDeque::with_capacity(capacity),
            capacity,
            scratch: Vec::new(),
        }
    }
    pub fn record(&mut self, latency: Nanos) {
        if self.samples.len() == self.capacity {
            self.samples.pop_front();
        }
        self.samples.push_back(latency.0);
    }
    pub fn len(&self) -> usize {
        self.samples.len()
    }
    pub fn is_empty(&self) -> bool {
        self.samples.is_empty()
    }
    pub fn clear(&mut self) {
        self.samples.clear();
    }
    /// The `q`-quantile (0.0 ..= 1.0) of the window, nearest rank; `None` when empty.
    pub fn quantile(&mut self, q: f64) -> Option<Nanos> {
        if self.samples.is_empty() {
            return None;
        }
        self.scratch.clear();
        self.scratch.extend(self.samples.iter().copied());
        let rank = ((q.clamp(0.0, 1.0) * self.scratch.len() as f64).ceil() as usize)
            .clamp(1, self.scratch.len());
        let (_, v, _) = self.scratch.select_nth_unstable(rank - 1);
        Some(Nanos(*v))
    }
}

/// Sub-buckets per power of two: relative error below 1/64.
const SUB_BITS: u32 = 6;
const SUB: usize = 1 << SUB_BITS;

/// A log-linear histogram of nanosecond latencies (HDR-style), mergeable.
#[derive(Debug, Clone)]
pub struct LatencyHistogram {
    counts: Vec<u64>,
    total: u64,
    max: u64,
}

impl Default for LatencyHistogram {
    fn default() -> Self {
        LatencyHistogram {
            counts: vec![0; (64 - SUB_BITS as usize + 1) * SUB],
            total: 0,
            max: 0,
        }
    }
}

fn bucket_of(v: u64) -> usize {
    if v < SUB as u64 {
        return v as usize;
    }
    let msb = 63 - v.leading_zeros();
    let shift = msb - SUB_BITS;
    let sub = ((v >> shift) as usize) & (SUB - 1);
    ((shift as usize + 1) << SUB_BITS) + sub
}

fn bucket_upper(i: usize) -> u64 {
    if i < SUB {
        return i as u64;
    }
    let shift = (i >> SUB_BITS) as u32 - 1;
    let sub = (i & (SUB - 1)) as u64;
    ((SUB as u64 + sub + 1) << shift).saturating_sub(1)
}

impl LatencyHistogram {
    pub fn record(&mut self, latency: Nanos) {
        self.counts[bucket_of(latency.0)] += 1;
        self.total += 1;
        self.max = self.max.max(latency.0);
    }
    pub fn count(&self) -> u64 {
        self.total
    }
    pub fn merge(&mut self, other: &LatencyHistogram) {
        for (a, b) in self.counts.iter_mut().zip(&other.counts) {
            *a += b;
        }
        self.total += other.total;
        self.max = self.max.max(other.max);
    }
    /// The `q`-quantile, reported as its bucket's upper bound (never below the true value
    /// by more than 1/64); `None` when empty.
    pub fn quantile(&self, q: f64) -> Option<Nanos> {
        if self.total == 0 {
            return None;
        }
        let rank = ((q.clamp(0.0, 1.0) * self.total as f64).ceil() as u64).clamp(1, self.total);
        let mut seen = 0;
        for (i, c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return Some(Nanos(bucket_upper(i).min(self.max)));
            }
        }
        Some(Nanos(self.max))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn window_quantiles_are_exact() {
        let mut w = LatencyWindow::new(100);
        for v in 1..=200u64 {
            w.record(Nanos(v));
        }
        assert_eq!(w.len(), 100);
        assert_eq!(w.quantile(0.5), Some(Nanos(150)));
        assert_eq!(w.quantile(0.99), Some(Nanos(199)));
        assert_eq!(w.quantile(1.0), Some(Nanos(200)));
        assert_eq!(LatencyWindow::new(4).quantile(0.5), None);
    }

    proptest! {
        #[test]
        fn histogram_quantile_is_within_one_sixty_fourth(mut v in proptest::collection::vec(1u64..10_000_000_000, 1..400), q in 0.0f64..1.0) {
            let mut h = LatencyHistogram::default();
            for &x in &v { h.record(Nanos(x)); }
            v.sort_unstable();
            let rank = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len());
            let exact = v[rank - 1];
            let got = h.quantile(q).unwrap().0;
            prop_assert!(got >= exact, "got {got} < exact {exact}");
            prop_assert!(got as f64 <= exact as f64 * (1.0 + 1.0 / 64.0) + 1.0, "got {got} exact {exact}");
        }
    }
}
