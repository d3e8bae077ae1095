//! SPDK's monotonic tick counter, converted to nanoseconds (the unit of `qos-core`).

use std::sync::OnceLock;

use crate::ffi;

/// `1e9 * 2^32 / hz`, computed once: the per-call conversion is then a multiply and a
/// shift instead of a 128-bit division (this runs for every I/O).
static MULT: OnceLock<u64> = OnceLock::new();

/// [`now_ns`] as the core's time: the clock every decision of both plugins is given.
#[inline]
pub fn now() -> qos_core::Nanos {
    qos_core::Nanos(now_ns())
}

/// Nanoseconds on SPDK's tick clock (`spdk_get_ticks() * 1e9 / spdk_get_ticks_hz()`).
/// Only meaningful after SPDK's environment is initialised; returns 0 before.
#[inline]
pub fn now_ns() -> u64 {
    // SAFETY: reads the TSC; takes no pointers and is callable from any thread.
    ticks_as_ns(unsafe { ffi::spdk_get_ticks() })
}

/// `ticks` of SPDK's tick clock in nanoseconds (0 before SPDK's environment is up).
#[inline]
fn ticks_as_ns(ticks: u64) -> u64 {
    let mult = match MULT.get() {
        Some(m) => *m,
        None => {
            // SAFETY: reads a constant set at env init.
            let hz = unsafe { ffi::spdk_get_ticks_hz() };
            if hz == 0 {
                return 0;
            }
            *MULT.get_or_init(|| mult_for(hz))
        }
    };
    scale(ticks, mult)
}

fn mult_for(hz: u64) -> u64 {
    ((1_000_000_000u128 << 32) / hz as u128).min(u64::MAX as u128) as u64
}

#[inline]
fn scale(ticks: u64, mult: u64) -> u64 {
    ((ticks as u128 * mult as u128) >> 32).min(u64::MAX as u128) as u64
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
    fn multiply_shift_matches_division() {
        for hz in [1_000_000_000u64, 2_399_987_000, 3_000_000_000] {
            let m = mult_for(hz);
            for ticks in [0u64, 1, 12_345_678_901, 1 << 50] {
                let exact = ticks_to_ns(ticks, hz);
                let fast = scale(ticks, m);
                assert!(
                    exact.abs_diff(fast) <= 1 + exact / 1_000_000_000,
                    "{hz} {ticks}"
                );
            }
        }
    }

    #[test]
    fn conversion_is_exact_and_does_not_overflow() {
        assert_eq!(ticks_to_ns(3_000_000_000, 3_000_000_000), 1_000_000_000);
        assert_eq!(ticks_to_ns(1, 2_000_000_000), 0);
        assert_eq!(ticks_to_ns(u64::MAX, 1), u64::MAX);
        assert_eq!(ticks_to_ns(5, 0), 0);
    }
}
