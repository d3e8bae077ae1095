//! Entitlements at the operating point (issue 26): what each host should get when the
//! target runs at C\*, the rate of the operating point on its learned depth curve.
//!
//! A claimant (a host, or a tenant group at the domain's level) has a reservation `r`,
//! a weight `w` and a cap `c`: the most it can take (its limit, and for a host with
//! commands held by QoS the rate its commands at the target give at the operating
//! point's latency, Little's law: `N / L*`; for a self-limited host what it took). Its
//! entitlement is `e = min(c, max(min(r, c), θ w))`, with θ such that the entitlements
//! add up to `min(pot, Σ c)`: reservations first (as far as the claimant can take them),
//! the rest by weight, nobody above what it can take. When the reservations alone
//! exceed the pot each claimant gets `min(r, c)` (admission is what keeps that from
//! happening). Rates are operations (cost units) per second.
//!
//! This is dmClock's sharing by weight at a chosen operating point, written as the
//! weighted max-min fairness (water-filling) of [`crate::share`] with a floor.

/// One claimant of an entitlement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Claimant {
    pub weight: u64,
    /// Reserved rate.
    pub reservation: u64,
    /// The most it can take; `u64::MAX` without bound.
    pub cap: u64,
}

impl Claimant {
    fn floor(&self) -> u64 {
        self.reservation.min(self.cap)
    }

    /// What it gets at water level `theta` (rate per unit of weight).
    fn at(&self, theta: f64) -> u64 {
        let by_weight = theta * self.weight as f64;
        let level = if by_weight >= u64::MAX as f64 {
            u64::MAX
        } else {
            by_weight as u64
        };
        level.max(self.floor()).min(self.cap)
    }
}

/// Fills `out` (one per claimant) with the entitlements of `claims` in `pot`. The
/// parts add up to `min(pot, Σ caps)` less at most one unit per claimant (rounding
/// down), or to the floors when those alone exceed `pot`.
pub fn entitle(pot: u64, claims: &[Claimant], out: &mut [u64]) {
    assert_eq!(claims.len(), out.len(), "one output per claim");
    let floors: u128 = claims.iter().map(|c| c.floor() as u128).sum();
    let caps: u128 = claims.iter().map(|c| c.cap as u128).sum();
    let target = caps.min(pot as u128);
    if floors >= target {
        for (o, c) in out.iter_mut().zip(claims) {
            *o = c.floor();
        }
        return;
    }
    let total = |theta: f64| -> u128 { claims.iter().map(|c| c.at(theta) as u128).sum() };
    // The water level lies between 0 and the level at which every weighted claimant
    // is at its cap or alone fills the target.
    let hi = claims
        .iter()
        .filter(|c| c.weight > 0)
        .map(|c| c.cap.min(target as u64) as f64 / c.weight as f64)
        .fold(0.0f64, f64::max);
    let (mut lo, mut hi) = (0.0f64, hi);
    if total(hi) < target {
        // Every weighted claimant is at its cap there (weight-0 ones get their
        // floors only): the target cannot be reached.
        lo = hi;
    }
    while lo < hi {
        let mid = lo + (hi - lo) / 2.0;
        if mid <= lo || mid >= hi {
            break;
        }
        if total(mid) < target {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    for (o, c) in out.iter_mut().zip(claims) {
        *o = c.at(lo);
    }
    // Below the level and rounded down, the parts miss the target by less than one
    // unit per claimant on the level: one more unit each to those, largest fraction
    // first (the largest-remainder rule), so the parts reach the target.
    let mut left = target.saturating_sub(out.iter().map(|&e| e as u128).sum());
    let mut on_level: Vec<(f64, usize)> = claims
        .iter()
        .enumerate()
        .filter(|(i, c)| c.weight > 0 && out[*i] > c.floor() && out[*i] < c.cap)
        .map(|(i, c)| {
            let exact = lo * c.weight as f64;
            (exact - exact.floor(), i)
        })
        .collect();
    on_level.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
    for (_, i) in on_level {
        if left == 0 {
            break;
        }
        out[i] += 1;
        left -= 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn claim(weight: u64, reservation: u64, cap: u64) -> Claimant {
        Claimant {
            weight,
            reservation,
            cap,
        }
    }

    fn run(pot: u64, claims: &[Claimant]) -> Vec<u64> {
        let mut out = vec![0; claims.len()];
        entitle(pot, claims, &mut out);
        out
    }

    #[test]
    fn the_excess_goes_by_weight_above_the_reservations() {
        // 150 K, reservations 40/27/15/8 % (60/40.5/22.5/12 K), weights 4/3/2/1:
        // the level θ = 15 K per unit of weight gives 60/45/30/15 K, each at or above
        // its reservation.
        let m = u64::MAX;
        let claims = [
            claim(4, 60_000, m),
            claim(3, 40_500, m),
            claim(2, 22_500, m),
            claim(1, 12_000, m),
        ];
        let e = run(150_000, &claims);
        assert_eq!(e, vec![60_000, 45_000, 30_000, 15_000]);
    }

    #[test]
    fn a_capped_host_leaves_the_rest_to_the_others() {
        let m = u64::MAX;
        let e = run(
            100_000,
            &[claim(1, 0, 10_000), claim(1, 0, m), claim(2, 0, m)],
        );
        assert_eq!(e, vec![10_000, 30_000, 60_000]);
    }

    #[test]
    fn a_reservation_above_what_the_host_can_take_counts_at_its_cap() {
        let m = u64::MAX;
        let e = run(100_000, &[claim(1, 50_000, 20_000), claim(1, 0, m)]);
        assert_eq!(e, vec![20_000, 80_000]);
    }

    #[test]
    fn reservations_above_the_pot_get_their_floors() {
        let e = run(100, &[claim(1, 80, 1000), claim(1, 70, 50)]);
        assert_eq!(e, vec![80, 50]);
    }

    #[test]
    fn nothing_beyond_what_everybody_can_take() {
        let e = run(1_000_000, &[claim(1, 10, 100), claim(5, 0, 200)]);
        assert_eq!(e, vec![100, 200]);
    }

    #[test]
    fn weight_zero_gets_its_reservation_only() {
        let m = u64::MAX;
        let e = run(1000, &[claim(0, 100, m), claim(1, 0, m)]);
        assert_eq!(e, vec![100, 900]);
        let e = run(1000, &[claim(0, 100, m)]);
        assert_eq!(e, vec![100]);
    }

    fn claimant() -> impl Strategy<Value = Claimant> {
        (
            0u64..20,
            0u64..200_000,
            prop_oneof![Just(u64::MAX), 0u64..300_000],
        )
            .prop_map(|(weight, reservation, cap)| Claimant {
                weight,
                reservation,
                cap,
            })
    }

    proptest! {
        #[test]
        fn entitlements_are_floored_capped_and_fill_the_pot(
            pot in 0u64..2_000_000,
            claims in prop::collection::vec(claimant(), 0..12),
        ) {
            let e = run(pot, &claims);
            let floors: u128 = claims.iter().map(|c| c.floor() as u128).sum();
            let caps: u128 = claims.iter().map(|c| c.cap as u128).sum();
            let target = caps.min(pot as u128);
            let sum: u128 = e.iter().map(|&x| x as u128).sum();
            for (x, c) in e.iter().zip(&claims) {
                // Never above what it can take, never below its reservation as far
                // as it can take it.
                prop_assert!(*x <= c.cap);
                prop_assert!(*x >= c.floor());
            }
            if floors >= target {
                prop_assert_eq!(sum, floors);
            } else if claims.iter().any(|c| c.weight > 0) {
                let weighted_room: u128 = claims
                    .iter()
                    .filter(|c| c.weight > 0)
                    .map(|c| c.cap as u128)
                    .sum::<u128>()
                    + claims.iter().filter(|c| c.weight == 0).map(|c| c.floor() as u128).sum::<u128>();
                prop_assert_eq!(sum, target.min(weighted_room));
            }
            // Weighted max-min: a claimant above its floor and below its cap has at
            // most (its weight's share of) what any other claimant above its floor
            // has per unit of weight, within the rounding.
            for (i, a) in claims.iter().enumerate() {
                for (j, b) in claims.iter().enumerate() {
                    if i == j || a.weight == 0 || b.weight == 0 {
                        continue;
                    }
                    let (ea, eb) = (e[i] as f64, e[j] as f64);
                    let a_free = e[i] > a.floor() && e[i] < a.cap;
                    let b_above = e[j] > b.floor();
                    if a_free && b_above {
                        // b is above its floor, so it is at the level or capped below it.
                        prop_assert!(eb / b.weight as f64 <= ea / a.weight as f64 + 2.0,
                            "{i}: {ea} w {} vs {j}: {eb} w {}", a.weight, b.weight);
                    }
                }
            }
        }
    }
}
