//! Weighted max-min sharing (water-filling), the rule that splits the capacity nobody
//! reserved among hosts and tenant groups. Pure integer arithmetic on amounts of one
//! resource; the monitor calls it once per check interval and resource.
//!
//! Each claimant has a weight and a demand (what it can take now; `u64::MAX` when it is
//! backlogged without bound). A claimant that wants less than its weighted share gets its
//! demand and leaves the rest to the others; the others split what is left in proportion
//! to weight. That is work-conserving (nothing is left over while some demand is
//! unserved) and independent of how many commands each host keeps outstanding, since
//! only weights and demands enter.

/// One claimant of a share.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Claim {
    /// 1 ..= 1000 for hosts; groups use theirs. A weight of 0 gets nothing.
    pub weight: u64,
    /// Most it can use now; `u64::MAX` for "as much as it gets".
    pub demand: u64,
}

/// Splits `pot` among `claims` by weighted max-min fairness, writing each claimant's
/// part into `out` (same length as `claims`). Returns what is left over: non-zero only
/// when every demand is met. Never gives a claimant more than its demand, and the parts
/// add up to at most `pot`.
pub fn water_fill(pot: u64, claims: &[Claim], out: &mut [u64]) -> u64 {
    assert_eq!(claims.len(), out.len(), "one output per claim");
    out.fill(0);
    let mut order: Vec<usize> = (0..claims.len())
        .filter(|&i| claims[i].weight > 0 && claims[i].demand > 0)
        .collect();
    // Smallest demand per unit of weight first: those are the ones that saturate first.
    order.sort_by(|&a, &b| {
        let (ca, cb) = (claims[a], claims[b]);
        (ca.demand as u128 * cb.weight as u128).cmp(&(cb.demand as u128 * ca.weight as u128))
    });
    let mut left = pot;
    let mut weight_left: u128 = order.iter().map(|&i| claims[i].weight as u128).sum();
    let mut k = 0;
    while k < order.len() {
        let c = claims[order[k]];
        let fair = left as u128 * c.weight as u128 / weight_left;
        if (c.demand as u128) <= fair {
            out[order[k]] = c.demand;
            left -= c.demand;
            weight_left -= c.weight as u128;
            k += 1;
            continue;
        }
        // Every claimant from here on wants at least its fair share: split by weight.
        let mut given = 0u64;
        for &i in &order[k..] {
            let part = (left as u128 * claims[i].weight as u128 / weight_left) as u64;
            out[i] = part.min(claims[i].demand);
            given += out[i];
        }
        left -= given;
        // Rounding crumbs go one each to the heaviest unsatisfied claimants.
        for &i in order[k..].iter().rev() {
            if left == 0 {
                break;
            }
            if out[i] < claims[i].demand {
                out[i] += 1;
                left -= 1;
            }
        }
        return left;
    }
    left
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn fill(pot: u64, claims: &[(u64, u64)]) -> (Vec<u64>, u64) {
        let c: Vec<Claim> = claims
            .iter()
            .map(|&(weight, demand)| Claim { weight, demand })
            .collect();
        let mut out = vec![0; c.len()];
        let left = water_fill(pot, &c, &mut out);
        (out, left)
    }

    #[test]
    fn backlogged_claimants_split_by_weight() {
        let (out, left) = fill(
            1000,
            &[(4, u64::MAX), (3, u64::MAX), (2, u64::MAX), (1, u64::MAX)],
        );
        assert_eq!(out, vec![400, 300, 200, 100]);
        assert_eq!(left, 0);
    }

    #[test]
    fn a_small_demand_leaves_the_rest_to_the_others() {
        let (out, left) = fill(1000, &[(1, 100), (1, u64::MAX), (2, u64::MAX)]);
        assert_eq!(out, vec![100, 300, 600]);
        assert_eq!(left, 0);
    }

    #[test]
    fn all_satisfied_leaves_the_remainder() {
        let (out, left) = fill(1000, &[(1, 100), (5, 200)]);
        assert_eq!(out, vec![100, 200]);
        assert_eq!(left, 700);
    }

    #[test]
    fn zero_weight_or_demand_gets_nothing() {
        let (out, _) = fill(90, &[(0, u64::MAX), (1, 0), (1, u64::MAX)]);
        assert_eq!(out, vec![0, 0, 90]);
    }

    /// The allocation is the weighted max-min one: checked against its definition. No
    /// claimant above its demand; nothing left while someone is short; and a claimant
    /// short of its demand has at least the weighted share of every other claimant
    /// (`out_i / w_i >= out_j / w_j`, up to one unit of rounding).
    fn check(pot: u64, claims: &[(u64, u64)]) -> Result<(), TestCaseError> {
        let (out, left) = fill(pot, claims);
        let total: u64 = out.iter().sum();
        prop_assert_eq!(total + left, pot);
        let short = claims.iter().zip(&out).any(|(&(w, d), &o)| w > 0 && o < d);
        if short {
            prop_assert!(left == 0, "left {left} while a claimant is short");
        }
        for (i, (&(wi, di), &oi)) in claims.iter().zip(&out).enumerate() {
            prop_assert!(oi <= di);
            if wi == 0 || oi >= di {
                continue;
            }
            for (j, (&(wj, _), &oj)) in claims.iter().zip(&out).enumerate() {
                if i == j || wj == 0 {
                    continue;
                }
                // oi / wi + 1 >= oj / wj, in integers.
                prop_assert!(
                    (oi as u128 + 1) * wj as u128 + wj as u128 * wi as u128
                        >= oj as u128 * wi as u128,
                    "claimant {i} ({oi}/{wi}) below claimant {j} ({oj}/{wj})"
                );
            }
        }
        Ok(())
    }

    proptest! {
        #[test]
        fn is_weighted_max_min(
            pot in 0u64..10_000_000,
            claims in proptest::collection::vec(
                (0u64..=1000, prop_oneof![0u64..2_000_000, Just(u64::MAX)]),
                0..40,
            ),
        ) {
            check(pot, &claims)?;
        }
    }
}
