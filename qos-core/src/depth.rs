//! The target's depth curve, learned online: T(Q), the rate at which the target
//! completes work with Q commands in flight, and the operating point an operator's
//! efficiency η picks on it (issue 26, `docs/architecture.md` "The operating point").
//!
//! Each check interval the monitor measures, over all hosts, the work completed and the
//! time the completed commands spent at the base; by Little's law their sum over the
//! interval's length is the mean number of commands in flight, `Q`, and the completed
//! work per second is `T(Q)` (cost units, so reads, writes and sizes count as the domain
//! charges them). Samples go to buckets a quarter octave wide (Q from 1/64 to 2^16: on a
//! fast base, a malloc bdev, commands spend a microsecond or two there and Q stays below
//! one even when the hosts keep hundreds outstanding), each
//! an exponentially weighted mean that forgets a bucket not seen for `horizon`. The curve
//! read from the buckets is their running maximum over Q (a target does not get slower
//! with more commands in flight, within what it was seen to do), so a noisy bucket
//! cannot make the operating point jump back and forth.
//!
//! A slower target (a busy CPU, a slower base) shows as a lower rate at the same Q before
//! the other buckets are seen again: when [`DRIFT_SAMPLES`] samples in a row in one known
//! bucket fall below the curve by more than [`DRIFT_MILLI`], every bucket is scaled by
//! their mean ratio to it (the shape is kept, the level follows), and the same up, so a
//! recovery is followed as fast. This is the depth-curve counterpart of blk-iocost's
//! `vrate` and BBR's bandwidth filter. (A run that moved between buckets rescaled the
//! real target's curve by 0.75 while a load went from queue depth 32 to 128.)
//!
//! The operating point for efficiency η: `Q*`, the fewest commands in flight with
//! `T(Q*) ≥ η T(max)`; `C* = T(Q*)`; `L* = Q* / C*`, the latency a command sees there.

use serde::Serialize;

use crate::time::Nanos;

/// Buckets per doubling of Q.
const PER_OCTAVE: usize = 4;
/// Octaves below one command in flight.
const BELOW_ONE: usize = 6;
/// Q from 2^-6 up to 2^16 commands in flight.
const BUCKETS: usize = (BELOW_ONE + 16) * PER_OCTAVE + 1;
/// Weight of a new sample in its bucket's mean, in 1/256.
const SAMPLE_WEIGHT: u64 = 32;
/// Samples a bucket needs before it counts in the curve.
const MIN_SAMPLES: u32 = 4;
/// A bucket's mean this far (thousandths) below or above the curve in
/// [`DRIFT_SAMPLES`] samples in a row rescales the whole curve.
pub const DRIFT_MILLI: u64 = 100;
/// See [`DRIFT_MILLI`].
pub const DRIFT_SAMPLES: u32 = 8;
/// Samples with less than this mean number of commands in flight (in 1/1000: the first
/// bucket's floor) say nothing about the curve.
const MIN_Q_MILLI: u64 = 15;
/// Check intervals are gathered into a sample of at least this long and this much
/// work: the channels publish their counters every 100 µs, so a 1 ms interval counts
/// up to a tenth too much or too little, and an interval that happens to count more
/// completions also counts more time at the base, which would put the high rates in
/// the high buckets.
pub const MIN_WINDOW: Nanos = Nanos::from_millis(10);
const MIN_WINDOW_WORK: u64 = 256;
/// A sample is taken after this long whatever the work (a slow target).
const MAX_WINDOW: Nanos = Nanos::from_millis(100);

/// One bucket of the curve.
#[derive(Debug, Clone, Copy, Default)]
struct Bucket {
    /// Mean rate, work per second.
    rate: u64,
    /// Mean number of commands in flight of its samples, thousandths.
    q_milli: u64,
    samples: u32,
    last_seen: Nanos,
}

/// The depth curve of one target and resource.
#[derive(Debug, Clone)]
pub struct DepthCurve {
    buckets: [Bucket; BUCKETS],
    /// A bucket not seen for this long no longer counts.
    horizon: Nanos,
    /// Samples in a row that fell below (negative) or above (positive) the curve by
    /// more than [`DRIFT_MILLI`], their ratio to it (thousandths) and their rates,
    /// summed.
    drift_run: i32,
    drift_ratio_sum: u64,
    drift_rate_sum: u64,
    /// The bucket of the run: a run is in one bucket (a load that moves between depths
    /// passes through buckets at rates that say nothing of a drift).
    drift_bucket: usize,
    /// The sample being gathered: its length, work and time at the base.
    pending: (Nanos, u64, u64),
}

/// A point of the learned curve: commands in flight (thousandths: on a fast base it is
/// below one) and the rate there (work per second).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct CurvePoint {
    pub in_flight_milli: u64,
    pub rate: u64,
}

/// The operating point for an efficiency.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct OperatingPoint {
    /// Commands in flight at the operating point (Q*), thousandths.
    pub in_flight_milli: u64,
    /// The rate there (C*, work per second).
    pub rate: u64,
    /// The most the target was seen to do (T(max), work per second).
    pub max_rate: u64,
    /// The latency of a command there (L* = Q* / C*).
    pub latency: Nanos,
}

/// Lower edge of bucket `b`, in thousandths of a command: 2^(b / PER_OCTAVE - 6).
fn bucket_floor_milli(b: usize) -> u64 {
    // In 1/64000 of a command, from a table of the quarter-octave steps.
    const STEPS: [u64; PER_OCTAVE] = [1000, 1189, 1414, 1682];
    ((STEPS[b % PER_OCTAVE] << (b / PER_OCTAVE)) >> BELOW_ONE).max(1)
}

/// The bucket of a mean of `q_milli` thousandths of a command in flight.
fn bucket_of(q_milli: u64) -> usize {
    let mut b = 0;
    while b + 1 < BUCKETS && bucket_floor_milli(b + 1) <= q_milli {
        b += 1;
    }
    b
}

impl DepthCurve {
    /// An empty curve whose buckets count for `horizon` after they were last seen.
    pub fn new(horizon: Nanos) -> Self {
        DepthCurve {
            buckets: [Bucket::default(); BUCKETS],
            horizon,
            drift_run: 0,
            drift_ratio_sum: 0,
            drift_rate_sum: 0,
            drift_bucket: 0,
            pending: (Nanos::ZERO, 0, 0),
        }
    }

    /// One interval of `dt` ending at `now`: `work` completed, whose commands spent
    /// `service` at the base in all (the sum over the completed commands). Intervals
    /// are gathered into samples of at least [`MIN_WINDOW`]; true when this one closed
    /// a sample.
    pub fn observe(&mut self, now: Nanos, dt: Nanos, work: u64, service: Nanos) -> bool {
        let p = &mut self.pending;
        p.0 = p.0.saturating_add(dt);
        p.1 = p.1.saturating_add(work);
        p.2 = p.2.saturating_add(service.0);
        if p.0 < MIN_WINDOW || (p.1 < MIN_WINDOW_WORK && p.0 < MAX_WINDOW) {
            return false;
        }
        let (dt, work, service) = std::mem::replace(p, (Nanos::ZERO, 0, 0));
        self.sample(now, dt, work, Nanos(service));
        true
    }

    /// Keeps the buckets deeper than `q_milli` commands in flight (those seen, not
    /// aged out yet) as if seen at `now`: while admission holds the target at that
    /// depth (the operating point's window) it cannot see them again, and letting them
    /// age out would lower T(max), the operating point and the window with it, period
    /// after period. Their level still follows a drift of the target (the rescale
    /// scales every bucket).
    pub fn keep_above(&mut self, q_milli: u64, now: Nanos) {
        let from = bucket_of(q_milli) + 1;
        for b in from..BUCKETS {
            if self.is_live(b, now) {
                self.buckets[b].last_seen = now;
            }
        }
    }

    /// One sample: `work` completed over `dt`, its commands `service` at the base.
    fn sample(&mut self, now: Nanos, dt: Nanos, work: u64, service: Nanos) {
        if dt.0 == 0 || work == 0 {
            return;
        }
        let q_milli = (service.0 as u128 * 1000 / dt.0 as u128) as u64;
        if q_milli < MIN_Q_MILLI {
            return;
        }
        let rate = (work as u128 * 1_000_000_000 / dt.0 as u128) as u64;
        let b = bucket_of(q_milli);
        // Only a bucket seen enough can tell a drift from a depth not seen before.
        let expected = self
            .is_live(b, now)
            .then(|| self.rate_at_bucket(b, now))
            .flatten();
        self.buckets[b] = self.updated(b, now, rate, q_milli);
        self.track_drift(b, rate, expected);
    }

    /// Bucket `b` with a sample of `rate` at `now`.
    fn updated(&self, b: usize, now: Nanos, rate: u64, q_milli: u64) -> Bucket {
        let mut k = self.buckets[b];
        if k.samples == 0 || now.saturating_sub(k.last_seen) > self.horizon {
            k.rate = rate;
            k.q_milli = q_milli;
            k.samples = 1;
        } else {
            let mean = |old: u64, new: u64| {
                ((old as u128 * (256 - SAMPLE_WEIGHT) as u128
                    + new as u128 * SAMPLE_WEIGHT as u128)
                    / 256) as u64
            };
            k.rate = mean(k.rate, rate);
            k.q_milli = mean(k.q_milli, q_milli);
            k.samples = k.samples.saturating_add(1);
        }
        k.last_seen = now;
        k
    }

    /// Counts samples far from the curve; after [`DRIFT_SAMPLES`] in a row on the same
    /// side, scales every other bucket by their mean ratio to it, and sets bucket `b`
    /// (the last sample's) to their mean rate.
    fn track_drift(&mut self, b: usize, rate: u64, expected: Option<u64>) {
        let Some(expected) = expected.filter(|&e| e > 0) else {
            return;
        };
        let ratio = (rate as u128 * 1000 / expected as u128) as u64;
        let side = if ratio + DRIFT_MILLI < 1000 {
            -1
        } else if ratio > 1000 + DRIFT_MILLI {
            1
        } else {
            0
        };
        let same_run =
            self.drift_run != 0 && self.drift_run.signum() == side && self.drift_bucket == b;
        if side == 0 || !same_run {
            self.drift_run = side;
            self.drift_bucket = b;
            (self.drift_ratio_sum, self.drift_rate_sum) =
                if side == 0 { (0, 0) } else { (ratio, rate) };
            return;
        }
        self.drift_run += side;
        self.drift_ratio_sum += ratio;
        self.drift_rate_sum += rate;
        let n = self.drift_run.unsigned_abs();
        if n >= DRIFT_SAMPLES {
            let mean = self.drift_ratio_sum / n as u64;
            for k in &mut self.buckets {
                k.rate = (k.rate as u128 * mean as u128 / 1000) as u64;
            }
            self.buckets[b].rate = self.drift_rate_sum / n as u64;
            self.drift_run = 0;
            self.drift_ratio_sum = 0;
            self.drift_rate_sum = 0;
        }
    }

    fn is_live(&self, b: usize, now: Nanos) -> bool {
        let k = &self.buckets[b];
        k.samples >= MIN_SAMPLES && now.saturating_sub(k.last_seen) <= self.horizon
    }

    /// The curve at bucket `b`: the most any live bucket up to `b` does.
    fn rate_at_bucket(&self, b: usize, now: Nanos) -> Option<u64> {
        self.live(now)
            .take_while(|&(i, _)| i <= b)
            .map(|(_, k)| k.rate)
            .max()
    }

    fn live(&self, now: Nanos) -> impl Iterator<Item = (usize, &Bucket)> + '_ {
        (0..BUCKETS)
            .filter(move |&b| self.is_live(b, now))
            .map(|b| (b, &self.buckets[b]))
    }

    /// The learned curve: for each bucket seen, the mean number of commands its
    /// samples had in flight and the running maximum of the rate up to it.
    pub fn curve(&self, now: Nanos) -> Vec<CurvePoint> {
        let mut best = 0;
        let mut out: Vec<CurvePoint> = Vec::new();
        for (_, k) in self.live(now) {
            best = best.max(k.rate);
            out.push(CurvePoint {
                in_flight_milli: k.q_milli.max(1),
                rate: best,
            });
        }
        out
    }

    /// The operating point `target` picks, once the curve has a live bucket.
    pub fn operating_point(&self, now: Nanos, target: OperatingTarget) -> Option<OperatingPoint> {
        let curve = self.curve(now);
        let max_rate = curve.last()?.rate;
        let p = point_for(&curve, target)?;
        Some(OperatingPoint {
            in_flight_milli: p.in_flight_milli,
            rate: p.rate,
            max_rate,
            latency: latency(p),
        })
    }
}

/// How much deeper than Q\* the curve must have been seen for C\* to count as what the
/// target can do ([`saturated`]).
pub const SATURATION_DEPTH_FACTOR: u64 = 2;

/// Whether `curve` shows the target saturated at `op`: it was seen at least
/// [`SATURATION_DEPTH_FACTOR`] times deeper than Q\* (more commands in flight gave less
/// than 1/η more). A curve seen only near one depth is flat too, but says nothing:
/// a load paced by QoS or by its hosts' queue depths keeps its rate while its depth at
/// the base moves with the latency (samples a bucket or two apart at the same rate), so
/// its "Q\*" lies just below its deepest point.
pub fn saturated(curve: &[CurvePoint], op: &OperatingPoint) -> bool {
    curve.last().is_some_and(|p| {
        p.in_flight_milli >= op.in_flight_milli.saturating_mul(SATURATION_DEPTH_FACTOR)
    })
}

/// The rate `curve` (as [`DepthCurve::curve`] reads it) gives with `q_milli` commands
/// in flight: the most it does up to that depth (a quarter octave of slack, a bucket's
/// width), `None` below its first point.
pub fn rate_at(curve: &[CurvePoint], q_milli: u64) -> Option<u64> {
    let upto = q_milli.saturating_mul(1189) / 1000;
    curve
        .iter()
        .take_while(|p| p.in_flight_milli <= upto)
        .map(|p| p.rate)
        .max()
}

/// What places the operating point on the curve (`DomainConfig::operating_target`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum OperatingTarget {
    /// Efficiency η, thousandths: the fewest commands in flight that give η of the most.
    Efficiency(u64),
    /// Q\*, thousandths of a command: the deepest point not above it.
    InFlight(u64),
    /// L\*: the deepest point whose latency (Q / T(Q)) is not above it.
    Latency(Nanos),
    /// Efficiency η over the hosts' circulation, thousandths: N\* learned by toggling
    /// ([`crate::circulation`]). On this (the base's) curve it reads as `Efficiency`.
    Circulation(u64),
}

/// The operating point's depth on `curve` (commands in flight, thousandths).
pub fn operating_depth(curve: &[CurvePoint], target: OperatingTarget) -> Option<u64> {
    point_for(curve, target).map(|p| p.in_flight_milli)
}

/// The point of `curve` that `target` picks; the shallowest when none qualifies (a Q\*
/// or L\* below everything the curve has seen).
fn point_for(curve: &[CurvePoint], target: OperatingTarget) -> Option<&CurvePoint> {
    let first = curve.first()?;
    let deepest_with =
        |ok: &dyn Fn(&CurvePoint) -> bool| curve.iter().filter(|p| ok(p)).last().or(Some(first));
    match target {
        OperatingTarget::Efficiency(eta_milli) | OperatingTarget::Circulation(eta_milli) => {
            let max_rate = curve.last()?.rate;
            let want = (max_rate as u128 * eta_milli.min(1000) as u128).div_ceil(1000) as u64;
            curve.iter().find(|p| p.rate >= want)
        }
        OperatingTarget::InFlight(q) => deepest_with(&|p| p.in_flight_milli <= q),
        OperatingTarget::Latency(l) => deepest_with(&|p| latency(p) <= l),
    }
}

/// A command's latency at point `p`: Q / T(Q).
fn latency(p: &CurvePoint) -> Nanos {
    Nanos((p.in_flight_milli as u128 * 1_000_000 / p.rate.max(1) as u128) as u64)
}

/// Whether a stretch that completed at `rate` with `q_milli` commands in flight on
/// average lies on `curve` (within [`DRIFT_MILLI`] below it, or above it): `None` when
/// the curve does not reach down to that depth.
pub fn on_curve(curve: &[CurvePoint], q_milli: u64, rate: u64) -> Option<bool> {
    let expected = rate_at(curve, q_milli)?;
    Some(rate as u128 * 1000 >= expected as u128 * (1000 - DRIFT_MILLI) as u128)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A target whose rate with q commands in flight is `peak q / (q + half)`.
    fn ideal(peak: u64, half: u64, q: u64) -> u64 {
        peak * q / (q + half)
    }

    /// Feeds `n` intervals of 1 ms at depths from `depths`, the target as `ideal`.
    /// Feeds `n` samples of [`MIN_WINDOW`] at depths from `depths`, the target as
    /// `ideal`.
    fn feed(
        c: &mut DepthCurve,
        t0: Nanos,
        depths: &[u64],
        peak: u64,
        half: u64,
        n: usize,
    ) -> Nanos {
        let dt = MIN_WINDOW;
        let mut now = t0;
        for i in 0..n {
            // A load keeps its depth for a while (16 samples), as real loads do.
            let q = depths[(i / 16) % depths.len()];
            let rate = ideal(peak, half, q);
            let work = rate / 100;
            // Little's law: the commands in flight spend q x dt at the base together.
            let service = Nanos(q * dt.0);
            now = now.saturating_add(dt);
            c.observe(now, dt, work, service);
        }
        now
    }

    #[test]
    fn a_stretch_is_judged_against_the_curve_at_its_depth() {
        let curve = [
            CurvePoint {
                in_flight_milli: 1000,
                rate: 100,
            },
            CurvePoint {
                in_flight_milli: 2000,
                rate: 180,
            },
            CurvePoint {
                in_flight_milli: 4000,
                rate: 196,
            },
            CurvePoint {
                in_flight_milli: 8000,
                rate: 200,
            },
        ];
        assert_eq!(rate_at(&curve, 500), None);
        assert_eq!(rate_at(&curve, 1000), Some(100));
        // A quarter octave of slack: 1.7 commands reads the point at 2.
        assert_eq!(rate_at(&curve, 1700), Some(180));
        assert_eq!(rate_at(&curve, 100_000), Some(200));
        // Fewer commands in flight and the rate the curve gives there: on it.
        assert_eq!(on_curve(&curve, 2000, 170), Some(true));
        // The same depth and a tenth less and more: the target got slower.
        assert_eq!(on_curve(&curve, 2000, 160), Some(false));
        assert_eq!(on_curve(&curve, 16_000, 150), Some(false));
        assert_eq!(on_curve(&curve, 100, 10), None);
        // η 0.97 of 200 is 194: four commands; η 0.9: two.
        let eta = OperatingTarget::Efficiency;
        assert_eq!(operating_depth(&curve, eta(970)), Some(4000));
        assert_eq!(operating_depth(&curve, eta(900)), Some(2000));
        assert_eq!(operating_depth(&[], eta(970)), None);
        // By depth: the deepest point not above Q*; by latency: the deepest point whose
        // Q / T(Q) is not above L* (T(4) = 196/s: 20.4 ms; T(8) = 200/s: 40 ms).
        let q = OperatingTarget::InFlight;
        assert_eq!(operating_depth(&curve, q(3000)), Some(2000));
        assert_eq!(operating_depth(&curve, q(100_000)), Some(8000));
        assert_eq!(
            operating_depth(&curve, q(500)),
            Some(1000),
            "below the curve: its first"
        );
        let l = |us| OperatingTarget::Latency(Nanos::from_micros(us));
        assert_eq!(operating_depth(&curve, l(25_000)), Some(4000));
        assert_eq!(operating_depth(&curve, l(40_000)), Some(8000));
        assert_eq!(operating_depth(&curve, l(1)), Some(1000));
    }

    #[test]
    fn buckets_are_a_quarter_octave_wide() {
        let one = BELOW_ONE * PER_OCTAVE;
        assert_eq!(bucket_of(15), 0);
        assert_eq!(bucket_of(1000), one);
        assert_eq!(bucket_of(1188), one);
        assert_eq!(bucket_of(1189), one + 1);
        assert_eq!(bucket_of(2000), one + 4);
        assert_eq!(bucket_of(16_000), one + 16);
        assert_eq!(bucket_of(500), one - 4);
        assert_eq!(bucket_of(u64::MAX), BUCKETS - 1);
    }

    #[test]
    fn the_operating_point_is_the_fewest_commands_that_give_eta_of_the_most() {
        let mut c = DepthCurve::new(Nanos::from_secs(10));
        let depths: Vec<u64> = (0..=8).map(|k| 1 << k).collect();
        let now = feed(&mut c, Nanos::ZERO, &depths, 800_000, 15, 16 * 9 * 4);
        let op = c
            .operating_point(now, OperatingTarget::Efficiency(970))
            .unwrap();
        // 800 K q / (q + 15): 256 -> 755.7 K (the most), 128 -> 716 K (0.947), so 256.
        assert_eq!(op.in_flight_milli, 256_000);
        // Work is counted in whole commands per 10 ms sample: 7,557 of 7,557.1.
        assert_eq!(op.max_rate, ideal(800_000, 15, 256) / 100 * 100);
        let op80 = c
            .operating_point(now, OperatingTarget::Efficiency(800))
            .unwrap();
        // 0.8 of 755.7 K = 604.6 K: 64 does 648 K, 32 does 545 K.
        assert_eq!(op80.in_flight_milli, 64_000);
        assert_eq!(op80.latency, Nanos(64_000 * 1_000_000 / op80.rate));
    }

    #[test]
    fn a_slower_target_is_followed_within_a_few_intervals_and_a_recovery_as_fast() {
        let mut c = DepthCurve::new(Nanos::from_secs(10));
        let depths = [16, 32, 64, 128];
        let now = feed(&mut c, Nanos::ZERO, &depths, 800_000, 15, 400);
        let before = c
            .operating_point(now, OperatingTarget::Efficiency(970))
            .unwrap()
            .max_rate;
        // The target drops to 60 % while the load stays at 64 commands.
        let now = feed(&mut c, now, &[64], 480_000, 15, 3 * DRIFT_SAMPLES as usize);
        let after = c
            .operating_point(now, OperatingTarget::Efficiency(970))
            .unwrap()
            .max_rate;
        let ratio = after as f64 / before as f64;
        assert!((0.55..0.68).contains(&ratio), "{before} -> {after}");
        let now = feed(&mut c, now, &[64], 800_000, 15, 3 * DRIFT_SAMPLES as usize);
        let back = c
            .operating_point(now, OperatingTarget::Efficiency(970))
            .unwrap()
            .max_rate;
        assert!(back as f64 > 0.93 * before as f64, "{before} -> {back}");
    }

    #[test]
    fn an_idle_target_and_stale_buckets_say_nothing() {
        let mut c = DepthCurve::new(Nanos::from_millis(100));
        assert!(
            c.operating_point(Nanos::ZERO, OperatingTarget::Efficiency(970))
                .is_none()
        );
        // Less than 1/64 of a command in flight on average: no sample.
        c.observe(MIN_WINDOW, MIN_WINDOW, 1000, Nanos(MIN_WINDOW.0 / 100));
        assert!(c.curve(MIN_WINDOW).is_empty());
        // Intervals shorter than the window are gathered.
        let mut g = DepthCurve::new(Nanos::from_secs(1));
        for ms in 1..=40 {
            let t = Nanos::from_millis(ms);
            g.observe(t, Nanos::from_millis(1), 1000, Nanos::from_millis(8));
        }
        let curve = g.curve(Nanos::from_millis(40));
        assert_eq!(curve.len(), 1);
        assert_eq!(
            curve[0],
            CurvePoint {
                in_flight_milli: 8000,
                rate: 1_000_000
            }
        );
        let now = feed(&mut c, Nanos::ZERO, &[8], 100_000, 8, 5);
        assert_eq!(c.curve(now).len(), 1);
        assert!(
            c.curve(now.saturating_add(Nanos::from_millis(101)))
                .is_empty()
        );
    }

    proptest! {
        /// On an ideal server the learned curve is the server's within 5 % at every
        /// bucket seen, never decreasing, and the operating point gives at least η of
        /// the most the curve saw.
        #[test]
        fn the_learned_curve_is_the_servers(
            peak in 10_000u64..5_000_000,
            half in 1u64..200,
            depths in proptest::collection::vec(1u64..2000, 1..12),
            eta in 500u64..=1000,
        ) {
            let mut c = DepthCurve::new(Nanos::from_secs(60));
            let now = feed(&mut c, Nanos::ZERO, &depths, peak, half, 64 * depths.len());
            let curve = c.curve(now);
            prop_assert!(!curve.is_empty());
            for w in curve.windows(2) {
                prop_assert!(w[0].rate <= w[1].rate);
                prop_assert!(w[0].in_flight_milli < w[1].in_flight_milli);
            }
            let best = depths.iter().map(|&q| ideal(peak, half, q)).max().unwrap();
            let last = curve.last().unwrap().rate;
            prop_assert!((last as f64 - best as f64).abs() <= 0.05 * best as f64 + 1000.0,
                "{last} vs {best}");
            let op = c.operating_point(now, OperatingTarget::Efficiency(eta)).unwrap();
            prop_assert!(op.rate as u128 * 1000 >= op.max_rate as u128 * eta as u128);
        }
    }
}
