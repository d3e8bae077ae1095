//! SPDK's monotonic tick counter, converted to nanoseconds (the unit of `qos-core`).

use crate::ffi;

/// Nanoseconds on SPDK's tick clock (`spdk_get_ticks() * 1e9 / spdk_get_ticks_hz()`,
/// in 128-bit arithmetic). Only meaningful after SPDK's environment is initialised;
/// returns 0 before.
#[inline]
pub fn now_ns() -> u64 {
    // SAFETY: both functions only read the TSC and a constant set at env init; they
    // take no pointers and are callable from any thread.
    let (ticks, hz) = unsafe { (ffi::spdk_get_ticks(), ffi::spdk_get_ticks_hz()) };
    ticks_to_ns(ticks, hz)
}

/// `ticks * 1e9 / hz` without overflow; 0 when `hz` is 0.
pub fn ticks_to_ns(ticks: u64, hz: u64) -> u64 {
    if hz == 0 {
        return 0;
    }
    let ns = ticks as u128 * 1_000_000_000 / hz as u128;
    ns.min(u64::MAX as u128) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conversion_is_exact_and_does_not_overflow() {
        assert_eq!(ticks_to_ns(3_000_000_000, 3_000_000_000), 1_000_000_000);
        assert_eq!(ticks_to_ns(1, 2_000_000_000), 0);
        assert_eq!(ticks_to_ns(u64::MAX, 1), u64::MAX);
        assert_eq!(ticks_to_ns(5, 0), 0);
    }
}
