//! Time as a value: the core never reads a clock. Callers pass `Nanos` (nanoseconds on a
//! monotonic clock of their choosing) and receive deadlines back.

use serde::{Deserialize, Serialize};

/// A point in time or a duration, in nanoseconds. Arithmetic saturates: no input can
/// make it overflow or panic.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct Nanos(pub u64);

impl Nanos {
    pub const ZERO: Nanos = Nanos(0);
    pub const MAX: Nanos = Nanos(u64::MAX);

    pub const fn from_micros(us: u64) -> Self {
        Nanos(us.saturating_mul(1_000))
    }
    pub const fn from_millis(ms: u64) -> Self {
        Nanos(ms.saturating_mul(1_000_000))
    }
    pub const fn from_secs(s: u64) -> Self {
        Nanos(s.saturating_mul(1_000_000_000))
    }
    pub const fn as_nanos(self) -> u64 {
        self.0
    }
    pub fn as_secs_f64(self) -> f64 {
        self.0 as f64 / 1e9
    }
    pub const fn saturating_add(self, other: Nanos) -> Nanos {
        Nanos(self.0.saturating_add(other.0))
    }
    pub const fn saturating_sub(self, other: Nanos) -> Nanos {
        Nanos(self.0.saturating_sub(other.0))
    }
}

impl std::fmt::Display for Nanos {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let n = self.0;
        if n >= 1_000_000_000 && n % 1_000_000 == 0 {
            write!(f, "{}ms", n / 1_000_000)
        } else if n >= 1_000_000 && n % 1_000 == 0 {
            write!(f, "{}us", n / 1_000)
        } else {
            write!(f, "{n}ns")
        }
    }
}

/// `amount * num / den` without overflow (128-bit intermediate), rounded down; 0 when
/// `den` is 0.
///
/// Runs for every command on both plugins' paths (paced releases, limits), so the
/// product is divided in 64 bits when it fits: a 128-bit division is a call to
/// `__udivti3`, several times the cost of the hardware's 64-bit one.
#[inline]
pub(crate) fn mul_div(amount: u64, num: u64, den: u64) -> u64 {
    if den == 0 {
        return 0;
    }
    if let Some(p) = amount.checked_mul(num) {
        return p / den;
    }
    let v = (amount as u128) * (num as u128) / (den as u128);
    v.min(u64::MAX as u128) as u64
}

/// `amount * num / den` rounded up; 0 when `den` is 0.
#[inline]
pub(crate) fn mul_div_ceil(amount: u64, num: u64, den: u64) -> u64 {
    if den == 0 {
        return 0;
    }
    if let Some(p) = amount.checked_mul(num) {
        return p.div_ceil(den);
    }
    let v = ((amount as u128) * (num as u128)).div_ceil(den as u128);
    v.min(u64::MAX as u128) as u64
}

/// A clock reading that never goes backwards: a reading older than the last one is
/// taken as the last one. Hosts, pollers and the simulator all feed their clocks through it.
#[derive(Debug, Clone, Copy, Default)]
pub struct MonotonicClamp {
    last: Nanos,
}

impl MonotonicClamp {
    pub fn new(start: Nanos) -> Self {
        Self { last: start }
    }
    /// Returns `now`, or the previous reading if `now` went backwards.
    pub fn observe(&mut self, now: Nanos) -> Nanos {
        if now > self.last {
            self.last = now;
        }
        self.last
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mul_div_does_not_overflow() {
        assert_eq!(mul_div(u64::MAX, u64::MAX, u64::MAX), u64::MAX);
        assert_eq!(mul_div(10, 3, 4), 7);
        assert_eq!(mul_div(10, 3, 0), 0);
    }

    proptest::proptest! {
        /// The 64-bit fast path gives what the 128-bit arithmetic gives.
        #[test]
        fn fast_path_matches_wide_arithmetic(
            amount in proptest::prop_oneof![0u64..1 << 40, proptest::num::u64::ANY],
            num in proptest::prop_oneof![0u64..1 << 34, proptest::num::u64::ANY],
            den in proptest::num::u64::ANY,
        ) {
            let wide = |ceil: bool| -> u64 {
                if den == 0 {
                    return 0;
                }
                let p = amount as u128 * num as u128;
                let v = if ceil { p.div_ceil(den as u128) } else { p / den as u128 };
                v.min(u64::MAX as u128) as u64
            };
            proptest::prop_assert_eq!(mul_div(amount, num, den), wide(false));
            proptest::prop_assert_eq!(mul_div_ceil(amount, num, den), wide(true));
        }
    }

    #[test]
    fn clamp_tolerates_time_going_backwards() {
        let mut c = MonotonicClamp::new(Nanos(100));
        assert_eq!(c.observe(Nanos(50)), Nanos(100));
        assert_eq!(c.observe(Nanos(150)), Nanos(150));
        assert_eq!(c.observe(Nanos(120)), Nanos(150));
    }

    #[test]
    fn display_picks_a_readable_unit() {
        assert_eq!(Nanos::from_secs(1).to_string(), "1000ms");
        assert_eq!(Nanos::from_micros(1500).to_string(), "1500us");
        assert_eq!(Nanos(7).to_string(), "7ns");
    }
}
