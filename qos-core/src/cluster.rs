//! Cluster division: one host's cluster-wide reservation and limit split into the local
//! shares that each target of a cluster enforces, from what the host did at each target
//! in its last period. Also the cluster's admission check. Sans-IO and deterministic:
//! the cluster agent's leader runs [`plan`] once per interval, the lab's cluster model
//! runs the same function.
//!
//! The rule, per host and per amount (its reservation, its limit), over its *paths*:
//! the live targets whose demand reports show the host there (all live targets when
//! none does yet). Elsewhere the host holds a fixed cold share ([`cold_share`]: no
//! reservation, a limit of 1), which a [`Plan`] leaves out, so at fleet size a target's
//! part of a division holds the hosts that use it and moves only when one of them
//! moves.
//!
//! 1. Every path gets a floor, `floor_milli` thousandths of the amount split evenly
//!    over the paths, so a cold path (a host that just failed over) can start.
//! 2. The rest goes by max-min fairness over the paths ([`crate::share::water_fill`],
//!    equal weights): a path where the host was *not* backlogged (nothing of it held
//!    for tokens or its limit) wants what it served plus `headroom_milli`; a
//!    backlogged path wants without bound, so backlogged paths split evenly what the
//!    others leave.
//! 3. Whatever nobody wants (every path got its demand) goes in proportion to what
//!    each path served, so the shares always add up to the amount exactly.
//!
//! Why this converges: a host whose demand moves from target A to target B is held at
//! B (B's share is too small there, so B reports it backlogged) and is not at A (A's
//! share is too large, so A reports what it served). The next division gives A what A
//! served and B the rest: one re-division after the measurement that showed the move.
//! A host backlogged everywhere gets an even split, every target uses all of its
//! share, and the cluster-wide amount is delivered whichever target delivers it; a
//! path that wants less than its even part is no longer held there and is given its
//! demand at the next division (max-min over the paths). Splitting backlogged paths
//! by what they served instead would keep any split for ever, however it came about.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::share::{Claim, water_fill};

/// What one host did at one target in its last ended period.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct PathDemand {
    /// Operations per second it completed there.
    pub served: u64,
    /// It had commands held there for tokens or its limit: it wanted more.
    pub backlogged: bool,
    /// Commands it had waiting in QoS there on average, in thousandths (what makes it
    /// count as backlogged; shown to operators).
    #[serde(default)]
    pub held_milli: u64,
    /// Bytes per second it completed there (0 from an agent older than the MiB/s
    /// division: its paths then split a MiB/s amount as cold paths do).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub served_bytes: u64,
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

/// The division's two knobs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct DivideConfig {
    /// Thousandths of an amount handed out evenly to all paths before the rest
    /// (0 ..= 1000). What a path the host does not use keeps of it is not delivered.
    pub floor_milli: u32,
    /// Thousandths added to what a non-backlogged path served when it is given its
    /// demand (0 ..= 10000): room to grow before it is held and reported backlogged.
    pub headroom_milli: u32,
}

impl Default for DivideConfig {
    fn default() -> Self {
        DivideConfig {
            floor_milli: 20,
            headroom_milli: 100,
        }
    }
}

impl DivideConfig {
    /// Checks the ranges; the message names the field.
    pub fn validate(&self) -> Result<(), ClusterConfigError> {
        if self.floor_milli > 1000 {
            return Err(ClusterConfigError::Floor(self.floor_milli));
        }
        if self.headroom_milli > 10_000 {
            return Err(ClusterConfigError::Headroom(self.headroom_milli));
        }
        Ok(())
    }
}

/// A cluster setting out of range.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ClusterConfigError {
    #[error("floor_milli {0} is above 1000: it is a fraction of the amount in thousandths")]
    Floor(u32),
    #[error("headroom_milli {0} is above 10000 (ten times what a path served)")]
    Headroom(u32),
}

/// Splits `amount` over `paths` (one share per path, in order). The shares add up to
/// `amount` exactly whenever there is at least one path.
pub fn divide(amount: u64, paths: &[PathDemand], cfg: &DivideConfig) -> Vec<u64> {
    let n = paths.len() as u64;
    if n == 0 {
        return Vec::new();
    }
    let floor_each = (amount as u128 * cfg.floor_milli.min(1000) as u128 / 1000 / n as u128) as u64;
    let pot = amount - floor_each * n;
    let claims: Vec<Claim> = paths
        .iter()
        .map(|p| Claim {
            weight: 1,
            demand: if p.backlogged {
                u64::MAX
            } else {
                let wanted = p.served as u128 * (1000 + cfg.headroom_milli as u128) / 1000;
                (wanted.min(u64::MAX as u128) as u64).saturating_sub(floor_each)
            },
        })
        .collect();
    let mut parts = vec![0; paths.len()];
    let left = water_fill(pot, &claims, &mut parts);
    let weights: Vec<u64> = paths.iter().map(|p| p.served.max(1)).collect();
    let extra = proportional(left, &weights);
    parts
        .iter()
        .zip(extra)
        .map(|(&p, e)| floor_each + p + e)
        .collect()
}

/// `pot` split in proportion to `weights` (all non-zero), exactly: the remainder goes one
/// unit each to the largest fractional parts, ties to the earlier index.
fn proportional(pot: u64, weights: &[u64]) -> Vec<u64> {
    let total: u128 = weights.iter().map(|&w| w as u128).sum();
    if pot == 0 || total == 0 {
        return vec![0; weights.len()];
    }
    let mut out = Vec::with_capacity(weights.len());
    let mut rems = Vec::with_capacity(weights.len());
    for (i, &w) in weights.iter().enumerate() {
        let exact = pot as u128 * w as u128;
        out.push((exact / total) as u64);
        rems.push((exact % total, i));
    }
    let mut left = pot - out.iter().sum::<u64>();
    rems.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    for &(_, i) in &rems {
        if left == 0 {
            break;
        }
        out[i] += 1;
        left -= 1;
    }
    out
}

/// Lowers each reservation share to its limit share and moves what it took off to
/// the paths with room under their limit share, in order: the limit shares add up to at
/// least the reservation, so nothing is lost (the two divisions differ where a path's
/// limit got headroom its reservation did not).
fn fit_under(res: &mut [u64], lim: &[u64]) {
    let mut spill: u64 = res
        .iter_mut()
        .zip(lim)
        .map(|(r, &l)| {
            let over = r.saturating_sub(l);
            *r -= over;
            over
        })
        .sum();
    for (r, &l) in res.iter_mut().zip(lim) {
        if spill == 0 {
            break;
        }
        let room = l.saturating_sub(*r).min(spill);
        *r += room;
        spill -= room;
    }
}

/// A host's cluster-wide contract, as the operator set it. The MiB/s amounts are left
/// out of the record when unset, so a record without them reads as before.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterHost {
    /// Reservation, operations per second over the whole cluster (0: none).
    pub reservation_iops: u64,
    /// Limit, operations per second over the whole cluster (`None`: none).
    pub limit_iops: Option<u64>,
    /// Weight of the host at every target (1 ..= 1000).
    pub weight: u32,
    /// Reservation, MiB per second over the whole cluster (0: none).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub reservation_mibps: u64,
    /// Limit, MiB per second over the whole cluster (`None`: none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit_mibps: Option<u64>,
}

impl Default for ClusterHost {
    /// No reservation, no limit, weight 1.
    fn default() -> Self {
        ClusterHost {
            reservation_iops: 0,
            limit_iops: None,
            weight: 1,
            reservation_mibps: 0,
            limit_mibps: None,
        }
    }
}

/// One target's share of one host's contract.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct LocalShare {
    /// 0: no reservation at this target.
    pub reservation_iops: u64,
    /// `None`: no limit.
    pub limit_iops: Option<u64>,
    pub weight: u32,
    /// 0: no MiB/s reservation at this target.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub reservation_mibps: u64,
    /// `None`: no MiB/s limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit_mibps: Option<u64>,
}

impl Default for LocalShare {
    /// Nothing reserved, nothing limited, weight 1.
    fn default() -> Self {
        LocalShare {
            reservation_iops: 0,
            limit_iops: None,
            weight: 1,
            reservation_mibps: 0,
            limit_mibps: None,
        }
    }
}

/// The live targets' shares: target -> host NQN -> share. A host left out of a
/// target's map holds its [`cold_share`] there (see [`plan`]); [`with_cold_shares`]
/// fills them in.
pub type Plan = BTreeMap<String, BTreeMap<String, LocalShare>>;

/// Whether `d` shows the host on a path at its target: it did work there, or had
/// commands held or waiting there. An idle entry (a host configured at the target that
/// sent nothing over the demand window) is no path.
pub fn on_path(d: &PathDemand) -> bool {
    d.served > 0 || d.backlogged || d.held_milli > 0 || d.served_bytes > 0
}

/// A host's share at a target where it has no path (a [`Plan`] leaves it out): no
/// reservation, the smallest limit a target takes (1 IOPS, 1 MiB/s) for each limit the
/// contract has, the contract's weight. Fixed by the contract alone, so a target's part
/// of a division does not move when a host elsewhere moves, and an agent fills it in
/// without knowing anything of the division. A host that comes to the target (a new
/// path, a failover) is held there at once, is seen on a path at the next demand
/// report, and gets its share by the division after it.
pub fn cold_share(host: &ClusterHost) -> LocalShare {
    LocalShare {
        reservation_iops: 0,
        limit_iops: host.limit_iops.map(|_| 1),
        weight: host.weight,
        reservation_mibps: 0,
        limit_mibps: host.limit_mibps.map(|_| 1),
    }
}

/// A target's part of a [`Plan`] with every host of `hosts` in it: those left out hold
/// their [`cold_share`]. Shares of hosts not in `hosts` are kept as they are.
pub fn with_cold_shares(
    part: &BTreeMap<String, LocalShare>,
    hosts: &BTreeMap<String, ClusterHost>,
) -> BTreeMap<String, LocalShare> {
    let mut out = part.clone();
    for (nqn, h) in hosts {
        out.entry(nqn.clone()).or_insert_with(|| cold_share(h));
    }
    out
}

/// The shares of `hosts` (NQN -> contract) over `targets` (the live members), from
/// `demand` (target -> NQN -> what the host did there; a missing entry counts as an
/// idle one).
///
/// Each host is divided over its *paths*, the targets whose demand shows it there
/// ([`on_path`]); at the others it holds its [`cold_share`], which the plan leaves
/// out. A host on no path (seen nowhere yet, or idle everywhere) is divided over every
/// target and listed at each, as before paths were known. So a target's part holds
/// the hosts that use it, and a division changes only the parts of the targets where
/// a host's shares moved.
///
/// Per host, the reservation shares at its paths add up to its reservation and the
/// limit shares to its limit (a limit share is at least 1 operation per second: a
/// target refuses a limit of 0), and no reservation share is above its limit share.
/// The cold shares hold no reservation and a limit of 1 each, beyond the contract:
/// over all targets the limit shares add up to at most the limit plus 1 per target,
/// the bound the minimum of 1 already set. MiB/s amounts likewise, in whole MiB/s
/// (paths weighed by the KiB/s they served).
pub fn plan(
    hosts: &BTreeMap<String, ClusterHost>,
    targets: &[String],
    demand: &BTreeMap<String, BTreeMap<String, PathDemand>>,
    cfg: &DivideConfig,
) -> Plan {
    let mut out: Plan = targets
        .iter()
        .map(|t| (t.clone(), BTreeMap::new()))
        .collect();
    if targets.is_empty() {
        return out;
    }
    // Each host's paths, from one pass over the reports (each lists every host
    // configured at its target, most of them idle there at fleet size).
    let mut seen: BTreeMap<&str, Vec<(usize, PathDemand)>> = BTreeMap::new();
    for (i, t) in targets.iter().enumerate() {
        for (nqn, d) in demand.get(t).into_iter().flatten() {
            if on_path(d) && hosts.contains_key(nqn) {
                seen.entry(nqn.as_str()).or_default().push((i, *d));
            }
        }
    }
    let everywhere: Vec<usize> = (0..targets.len()).collect();
    for (nqn, host) in hosts {
        let (at, paths): (Vec<usize>, Vec<PathDemand>) = match seen.get(nqn.as_str()) {
            Some(on) => on.iter().copied().unzip(),
            None => (
                everywhere.clone(),
                vec![PathDemand::default(); targets.len()],
            ),
        };
        let (res, lim) = split(host.reservation_iops, host.limit_iops, &paths, cfg);
        let (res_mib, lim_mib) = if host.reservation_mibps == 0 && host.limit_mibps.is_none() {
            // No MiB/s contract: nothing to divide (what dividing 0 and no limit gives).
            (vec![0; paths.len()], None)
        } else {
            split_mibps(host, &paths, cfg)
        };
        for (j, &i) in at.iter().enumerate() {
            let (reservation_iops, limit_iops) = share_at(&res, &lim, j);
            let (reservation_mibps, limit_mibps) = share_at(&res_mib, &lim_mib, j);
            out.get_mut(&targets[i])
                .expect("one entry per target")
                .insert(
                    nqn.clone(),
                    LocalShare {
                        reservation_iops,
                        limit_iops,
                        weight: host.weight,
                        reservation_mibps,
                        limit_mibps,
                    },
                );
        }
    }
    out
}

/// KiB in a MiB: the MiB/s division's working unit is KiB/s.
const KIB: u64 = 1024;

/// `host`'s MiB/s reservation and limit split over `paths`: like IOPS, over what each
/// path served in KiB/s (a MiB is too coarse a unit to weigh paths by), then rounded
/// to whole MiB/s.
fn split_mibps(
    host: &ClusterHost,
    paths: &[PathDemand],
    cfg: &DivideConfig,
) -> (Vec<u64>, Option<Vec<u64>>) {
    let by_bytes: Vec<PathDemand> = paths
        .iter()
        .map(|p| PathDemand {
            served: p.served_bytes / KIB,
            ..*p
        })
        .collect();
    let (res_kib, lim_kib) = split(
        host.reservation_mibps.saturating_mul(KIB),
        host.limit_mibps.map(|l| l.saturating_mul(KIB)),
        &by_bytes,
        cfg,
    );
    let mut res_mib = in_units(&res_kib, KIB);
    let lim_mib = lim_kib.map(|l| in_units(&l, KIB));
    if let Some(lim) = &lim_mib {
        // Rounded apart, a reservation share may have rounded up past its limit's.
        fit_under(&mut res_mib, lim);
    }
    (res_mib, lim_mib)
}

/// One resource's reservation and limit split over `paths`: the reservation without
/// headroom (a reservation share above what the host uses at a target is lost to it at
/// the others; a limit share above it is not lost, the limits only cap: its bursts
/// above the share compete for the target's excess), then fitted under the limit
/// shares.
fn split(
    reservation: u64,
    limit: Option<u64>,
    paths: &[PathDemand],
    cfg: &DivideConfig,
) -> (Vec<u64>, Option<Vec<u64>>) {
    let res_cfg = DivideConfig {
        headroom_milli: 0,
        ..*cfg
    };
    let mut res = divide(reservation, paths, &res_cfg);
    let lim = limit.map(|l| divide(l, paths, cfg));
    if let Some(lim) = &lim {
        fit_under(&mut res, lim);
    }
    (res, lim)
}

/// Path `i`'s reservation and limit: a limit share is at least 1 (a target refuses a
/// limit of 0), and the reservation never above it.
fn share_at(res: &[u64], lim: &Option<Vec<u64>>, i: usize) -> (u64, Option<u64>) {
    let limit = lim.as_ref().map(|l| l[i].max(1));
    let reservation = match limit {
        Some(l) => res[i].min(l),
        None => res[i],
    };
    (reservation, limit)
}

/// `parts` (adding up to a multiple of `unit`) in whole units, adding up to the same
/// total: each part rounded down, the units left over one each to the largest
/// remainders, ties to the earlier index. A part below half a unit may round to 0.
fn in_units(parts: &[u64], unit: u64) -> Vec<u64> {
    let total = parts.iter().fold(0u64, |a, &p| a.saturating_add(p)) / unit;
    let mut out: Vec<u64> = parts.iter().map(|&p| p / unit).collect();
    let mut order: Vec<(u64, usize)> = parts.iter().map(|&p| p % unit).zip(0..).collect();
    order.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    let mut left = total.saturating_sub(out.iter().sum::<u64>());
    for &(_, i) in &order {
        if left == 0 {
            break;
        }
        out[i] += 1;
        left -= 1;
    }
    out
}

/// A contract the cluster cannot take.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ClusterAdmissionError {
    #[error(
        "host {nqn}: reservation {reservation} {unit} is above its limit {limit} {unit}; lower the reservation or raise the limit"
    )]
    ReservationAboveLimit {
        nqn: String,
        reservation: u64,
        limit: u64,
        /// `IOPS` or `MiB/s`.
        unit: &'static str,
    },
    #[error("host {nqn}: weight {weight} is outside 1 ..= 1000")]
    Weight { nqn: String, weight: u32 },
    #[error(
        "cluster level: no target of the cluster is live, so a reservation of {reserved_iops} IOPS cannot be checked against capacity; start the targets' agents first"
    )]
    NoTargets { reserved_iops: u64 },
    #[error(
        "cluster level: the hosts reserve {reserved_iops} IOPS together, above the {capacity_iops} IOPS the {targets} live targets estimate together; lower a reservation or add a target"
    )]
    Capacity {
        reserved_iops: u64,
        capacity_iops: u64,
        targets: usize,
    },
}

/// The cluster's admission check: each contract consistent (IOPS and MiB/s), and the
/// sum of the IOPS reservations within the sum of the live targets' capacity estimates
/// (operations per second; the targets estimate no MiB/s capacity unless configured
/// with one, so MiB/s reservations are checked by each target when its share is
/// applied). Each target then checks its local share itself when the share is applied.
pub fn check_cluster_admission(
    hosts: &BTreeMap<String, ClusterHost>,
    capacities_iops: &[u64],
) -> Result<(), ClusterAdmissionError> {
    for (nqn, h) in hosts {
        if !(1..=1000).contains(&h.weight) {
            return Err(ClusterAdmissionError::Weight {
                nqn: nqn.clone(),
                weight: h.weight,
            });
        }
        for (reservation, limit, unit) in [
            (h.reservation_iops, h.limit_iops, "IOPS"),
            (h.reservation_mibps, h.limit_mibps, "MiB/s"),
        ] {
            if let Some(limit) = limit
                && reservation > limit
            {
                return Err(ClusterAdmissionError::ReservationAboveLimit {
                    nqn: nqn.clone(),
                    reservation,
                    limit,
                    unit,
                });
            }
        }
    }
    let reserved: u128 = hosts.values().map(|h| h.reservation_iops as u128).sum();
    let capacity: u128 = capacities_iops.iter().map(|&c| c as u128).sum();
    if reserved > 0 && capacities_iops.is_empty() {
        return Err(ClusterAdmissionError::NoTargets {
            reserved_iops: reserved.min(u64::MAX as u128) as u64,
        });
    }
    if reserved > capacity {
        return Err(ClusterAdmissionError::Capacity {
            reserved_iops: reserved.min(u64::MAX as u128) as u64,
            capacity_iops: capacity.min(u64::MAX as u128) as u64,
            targets: capacities_iops.len(),
        });
    }
    Ok(())
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn p(served: u64, backlogged: bool) -> PathDemand {
        PathDemand {
            served,
            backlogged,
            ..Default::default()
        }
    }

    const NO_FLOOR: DivideConfig = DivideConfig {
        floor_milli: 0,
        headroom_milli: 0,
    };

    #[test]
    fn backlogged_paths_split_evenly() {
        assert_eq!(
            divide(1000, &[p(300, true), p(100, true)], &NO_FLOOR),
            vec![500, 500]
        );
    }

    #[test]
    fn a_path_that_was_not_held_gets_what_it_served_and_the_held_one_the_rest() {
        let cfg = DivideConfig {
            floor_milli: 0,
            headroom_milli: 100,
        };
        assert_eq!(
            divide(1000, &[p(200, false), p(500, true)], &cfg),
            vec![220, 780]
        );
    }

    #[test]
    fn what_nobody_wants_goes_by_what_each_served() {
        // 300 + 100 wanted of 1000: the 600 left go 3:1.
        let shares = divide(1000, &[p(300, false), p(100, false)], &NO_FLOOR);
        assert_eq!(shares.iter().sum::<u64>(), 1000);
        assert!(shares[0] > 700 && shares[1] > 200, "{shares:?}");
    }

    #[test]
    fn a_cold_path_gets_its_floor() {
        let cfg = DivideConfig {
            floor_milli: 100,
            headroom_milli: 0,
        };
        // 10 % of 1000 over two paths: 50 each, then the rest to the busy one.
        assert_eq!(
            divide(1000, &[p(900, true), p(0, false)], &cfg),
            vec![950, 50]
        );
    }

    #[test]
    fn a_demand_that_moves_is_followed_in_one_division() {
        // 80/20 of a 1000 IOPS limit: B, not held, gets what it served and a little.
        let cfg = DivideConfig::default();
        let before = divide(1000, &[p(790, true), p(200, false)], &cfg);
        assert_eq!(before, vec![780, 220]);
        // The host now wants 20/80: A serves 200 of its 800 unheld, B is held at 200.
        let after = divide(1000, &[p(200, false), p(200, true)], &cfg);
        assert_eq!(after.iter().sum::<u64>(), 1000);
        assert!(after[1] >= 780, "B gets the rest: {after:?}");
    }

    #[test]
    fn no_paths_no_shares_and_zero_amounts_are_zero() {
        assert!(divide(1000, &[], &DivideConfig::default()).is_empty());
        assert_eq!(
            divide(0, &[p(5, true), p(0, false)], &DivideConfig::default()),
            vec![0, 0]
        );
    }

    fn hosts(list: &[(&str, u64, Option<u64>)]) -> BTreeMap<String, ClusterHost> {
        list.iter()
            .map(|&(n, r, l)| {
                (
                    n.to_string(),
                    ClusterHost {
                        reservation_iops: r,
                        limit_iops: l,
                        ..Default::default()
                    },
                )
            })
            .collect()
    }

    #[test]
    fn a_lone_survivor_gets_the_whole_contract() {
        let h = hosts(&[("h1", 4000, Some(9000))]);
        let plan = plan(
            &h,
            &["b".into()],
            &BTreeMap::new(),
            &DivideConfig::default(),
        );
        assert_eq!(
            plan["b"]["h1"],
            LocalShare {
                reservation_iops: 4000,
                limit_iops: Some(9000),
                ..Default::default()
            }
        );
    }

    #[test]
    fn a_host_without_limit_has_none_anywhere() {
        let h = hosts(&[("h1", 100, None)]);
        let targets = ["a".to_string(), "b".to_string()];
        let plan = plan(&h, &targets, &BTreeMap::new(), &DivideConfig::default());
        assert!(plan.values().all(|t| t["h1"].limit_iops.is_none()));
        assert_eq!(
            plan.values().map(|t| t["h1"].reservation_iops).sum::<u64>(),
            100
        );
    }

    /// Reports of `(target, host, served, held)`.
    fn reports(list: &[(&str, &str, u64, bool)]) -> BTreeMap<String, BTreeMap<String, PathDemand>> {
        let mut out: BTreeMap<String, BTreeMap<String, PathDemand>> = BTreeMap::new();
        for &(t, h, s, b) in list {
            out.entry(t.into()).or_default().insert(h.into(), p(s, b));
        }
        out
    }

    #[test]
    fn a_host_is_divided_over_its_paths_and_holds_its_cold_share_elsewhere() {
        let h = hosts(&[("x", 400, Some(1000)), ("y", 100, Some(500))]);
        let targets: Vec<String> = ["a", "b", "c"].map(String::from).to_vec();
        // x reaches a and b; y was seen nowhere (its entries are idle).
        let d = reports(&[
            ("a", "x", 600, true),
            ("b", "x", 200, false),
            ("c", "x", 0, false),
            ("c", "y", 0, false),
        ]);
        let plan = plan(&h, &targets, &d, &DivideConfig::default());
        assert!(!plan["c"].contains_key("x"), "no path: left out ({plan:?})");
        let (a, b) = (plan["a"]["x"], plan["b"]["x"]);
        assert_eq!(a.reservation_iops + b.reservation_iops, 400);
        assert_eq!(a.limit_iops.unwrap() + b.limit_iops.unwrap(), 1000);
        let cold = with_cold_shares(&plan["c"], &h)["x"];
        assert_eq!((cold.reservation_iops, cold.limit_iops), (0, Some(1)));
        // y, seen nowhere, is divided over all three as before paths were known.
        let y: Vec<LocalShare> = targets.iter().map(|t| plan[t]["y"]).collect();
        assert_eq!(y.iter().map(|s| s.reservation_iops).sum::<u64>(), 100);
        assert_eq!(y.iter().map(|s| s.limit_iops.unwrap()).sum::<u64>(), 500);
    }

    #[test]
    fn a_move_changes_only_the_parts_of_the_targets_the_host_uses() {
        let h = hosts(&[("x", 400, Some(1000)), ("y", 300, Some(900))]);
        let targets: Vec<String> = ["a", "b", "c", "d"].map(String::from).to_vec();
        let before = reports(&[
            ("a", "x", 700, false),
            ("b", "x", 100, false),
            ("c", "y", 500, true),
            ("d", "y", 100, false),
        ]);
        // x's demand moves from a to b and drops; y does the same as before.
        let after = reports(&[
            ("a", "x", 50, false),
            ("b", "x", 300, false),
            ("c", "y", 500, true),
            ("d", "y", 100, false),
        ]);
        let cfg = DivideConfig::default();
        let (p0, p1) = (
            plan(&h, &targets, &before, &cfg),
            plan(&h, &targets, &after, &cfg),
        );
        let moved: Vec<&String> = targets.iter().filter(|t| p0[*t] != p1[*t]).collect();
        assert_eq!(moved, ["a", "b"]);
        assert!(p1["b"]["x"].limit_iops > p0["b"]["x"].limit_iops);
        // Divided over every target (before paths were known), x's shares at c and d
        // moved too: what nobody wants goes by what each served, at least 1 each.
        let everywhere = |a: u64, b: u64| {
            divide(
                1000,
                &[p(a, false), p(b, false), p(0, false), p(0, false)],
                &cfg,
            )
        };
        assert_ne!(everywhere(700, 100)[2], everywhere(50, 300)[2]);
    }

    #[test]
    fn admission_names_what_to_change() {
        let h = hosts(&[("h1", 600, Some(1000)), ("h2", 600, None)]);
        let e = check_cluster_admission(&h, &[500, 600]).unwrap_err();
        assert!(e.to_string().contains("1200 IOPS together"), "{e}");
        assert!(check_cluster_admission(&h, &[600, 600]).is_ok());
        let h = hosts(&[("h1", 600, Some(500))]);
        let e = check_cluster_admission(&h, &[10_000]).unwrap_err();
        assert!(e.to_string().contains("lower the reservation"), "{e}");
    }

    #[test]
    fn mibps_is_divided_like_iops_over_what_each_path_served_in_bytes() {
        let h = BTreeMap::from([(
            "w".to_string(),
            ClusterHost {
                reservation_mibps: 300,
                limit_mibps: Some(1000),
                ..Default::default()
            },
        )]);
        let targets = ["a".to_string(), "b".to_string()];
        // The writer moved to b: a served 100 MiB/s, not held; b is held at its share.
        let at = |mib: u64, held: bool| PathDemand {
            served: mib * 4,
            backlogged: held,
            served_bytes: mib << 20,
            ..Default::default()
        };
        let demand = BTreeMap::from([
            (
                "a".to_string(),
                BTreeMap::from([("w".to_string(), at(100, false))]),
            ),
            (
                "b".to_string(),
                BTreeMap::from([("w".to_string(), at(400, true))]),
            ),
        ]);
        let plan = plan(&h, &targets, &demand, &DivideConfig::default());
        let (a, b) = (plan["a"]["w"], plan["b"]["w"]);
        assert_eq!(a.reservation_mibps + b.reservation_mibps, 300);
        assert_eq!(a.limit_mibps.unwrap() + b.limit_mibps.unwrap(), 1000);
        // a gets what it served (and headroom for the limit), b the rest.
        assert_eq!(a.reservation_mibps, 100, "{plan:?}");
        assert_eq!(a.limit_mibps, Some(110), "{plan:?}");
        // No IOPS contract, none divided.
        assert_eq!((a.reservation_iops, a.limit_iops), (0, None));
    }

    #[test]
    fn records_without_mibps_read_and_write_as_before() {
        let old = r#"{"reservation_iops":100,"limit_iops":200,"weight":2}"#;
        let h: ClusterHost = serde_json::from_str(old).unwrap();
        assert_eq!((h.reservation_mibps, h.limit_mibps), (0, None));
        assert_eq!(serde_json::to_string(&h).unwrap(), old);
        let share = r#"{"reservation_iops":5,"limit_iops":null,"weight":1}"#;
        let s: LocalShare = serde_json::from_str(share).unwrap();
        assert_eq!(serde_json::to_string(&s).unwrap(), share);
        let d = r#"{"served":7,"backlogged":false,"held_milli":0}"#;
        let p: PathDemand = serde_json::from_str(d).unwrap();
        assert_eq!(serde_json::to_string(&p).unwrap(), d);
    }

    #[test]
    fn admission_checks_mibps_too() {
        let h = BTreeMap::from([(
            "h1".to_string(),
            ClusterHost {
                reservation_mibps: 600,
                limit_mibps: Some(500),
                ..Default::default()
            },
        )]);
        let e = check_cluster_admission(&h, &[10_000]).unwrap_err();
        assert!(
            e.to_string()
                .contains("600 MiB/s is above its limit 500 MiB/s"),
            "{e}"
        );
    }

    #[test]
    fn whole_units_add_up_to_the_whole() {
        assert_eq!(in_units(&[1536, 512, 1024], 1024), vec![2, 0, 1]);
        assert_eq!(in_units(&[512, 512], 1024), vec![1, 0]);
        assert_eq!(in_units(&[], 1024), Vec::<u64>::new());
    }

    fn paths() -> impl Strategy<Value = Vec<PathDemand>> {
        proptest::collection::vec(
            (0u64..2_000_000, any::<bool>()).prop_map(|(s, b)| p(s, b)),
            1..8,
        )
    }

    proptest! {
        /// The shares always add up to the amount, and a non-backlogged path never gets
        /// less than it served (plus headroom) when the amount covers every such path.
        #[test]
        fn shares_add_up(amount in 0u64..10_000_000, paths in paths(),
                         floor in 0u32..=1000, headroom in 0u32..=1000) {
            let cfg = DivideConfig { floor_milli: floor, headroom_milli: headroom };
            let s = divide(amount, &paths, &cfg);
            prop_assert_eq!(s.len(), paths.len());
            prop_assert_eq!(s.iter().sum::<u64>(), amount);
        }

        /// A plan's reservation never exceeds its limit at any target; over the host's
        /// paths the limit shares add up to the limit (up to the 1 IOPS minimum) and the
        /// reservation shares to the reservation; the targets it has no path to are
        /// left out of the plan and hold its cold share (no reservation, limit 1), so
        /// over every target the limit shares stay within the limit + 1 per target.
        #[test]
        fn plan_keeps_each_contract(r in 0u64..1_000_000, extra in 0u64..1_000_000,
                                    d in proptest::collection::vec((0u64..2_000_000, any::<bool>()), 1..5)) {
            let h = hosts(&[("h", r, Some(r + extra))]);
            let targets: Vec<String> = (0..d.len()).map(|i| format!("t{i}")).collect();
            let demand = targets.iter().zip(&d)
                .map(|(t, &(s, b))| (t.clone(), BTreeMap::from([("h".to_string(), p(s, b))])))
                .collect();
            let plan = plan(&h, &targets, &demand, &DivideConfig::default());
            let seen_nowhere = d.iter().all(|&(s, b)| s == 0 && !b);
            let (mut res, mut lim, mut path_lim) = (0, 0, 0);
            for (t, &(s, b)) in targets.iter().zip(&d) {
                let listed = plan[t].get("h");
                prop_assert_eq!(listed.is_some(), seen_nowhere || s > 0 || b, "{}", t);
                let share = with_cold_shares(&plan[t], &h)["h"];
                let l = share.limit_iops.unwrap();
                prop_assert!(share.reservation_iops <= l);
                res += share.reservation_iops;
                lim += l;
                if listed.is_some() {
                    path_lim += l;
                } else {
                    prop_assert_eq!(share, cold_share(&h["h"]));
                }
            }
            let paths = plan.values().filter(|m| m.contains_key("h")).count() as u64;
            prop_assert!(path_lim >= r + extra && path_lim <= r + extra + paths);
            prop_assert!(lim <= r + extra + targets.len() as u64);
            prop_assert_eq!(res, r);
        }

        /// Many hosts over many targets, each seen on some of them (or on none): every
        /// host's reservation shares add up to its reservation, none above its limit
        /// share, never over-committed; its limit shares over its paths to its limit (+1
        /// per path at most, the minimum share), over every target to at most its limit
        /// + 1 per target; a target's part lists exactly the hosts with a path there
        /// (every target lists a host seen nowhere).
        #[test]
        fn plan_divides_each_host_over_its_paths(
            n in 1usize..12,
            seen in proptest::collection::vec(
                (0u64..100_000, 0u64..100_000, proptest::collection::vec((0u64..12, 0u64..50_000, any::<bool>()), 0..5)),
                1..20),
        ) {
            let targets: Vec<String> = (0..n).map(|i| format!("t{i:02}")).collect();
            let mut h = BTreeMap::new();
            let mut demand: BTreeMap<String, BTreeMap<String, PathDemand>> = BTreeMap::new();
            for (k, (r, extra, at)) in seen.iter().enumerate() {
                let nqn = format!("h{k:02}");
                h.insert(nqn.clone(), ClusterHost {
                    reservation_iops: *r,
                    limit_iops: Some(r + extra),
                    ..Default::default()
                });
                for &(t, served, held) in at {
                    // Reports of targets outside the members are not the plan's.
                    let t = format!("t{t:02}");
                    demand.entry(t).or_default().insert(nqn.clone(), p(served, held));
                }
            }
            let plan = plan(&h, &targets, &demand, &DivideConfig::default());
            for (nqn, c) in &h {
                let on: Vec<&String> = targets.iter()
                    .filter(|t| demand.get(*t).and_then(|d| d.get(nqn)).is_some_and(on_path))
                    .collect();
                let limit = c.limit_iops.unwrap();
                let (mut res, mut path_lim, mut lim) = (0, 0, 0);
                for t in &targets {
                    let listed = plan[t].contains_key(nqn);
                    prop_assert_eq!(listed, on.is_empty() || on.contains(&t), "{} at {}", nqn, t);
                    let s = with_cold_shares(&plan[t], &h)[nqn];
                    let l = s.limit_iops.unwrap();
                    prop_assert!(s.reservation_iops <= l);
                    res += s.reservation_iops;
                    lim += l;
                    if listed {
                        path_lim += l;
                    }
                }
                let paths = if on.is_empty() { n } else { on.len() } as u64;
                prop_assert_eq!(res, c.reservation_iops, "{}", nqn);
                prop_assert!(path_lim >= limit && path_lim <= limit + paths, "{}: {} of {}", nqn, path_lim, limit);
                prop_assert!(lim <= limit + n as u64, "{}: {} of {}", nqn, lim, limit);
            }
        }

        /// The same for MiB/s, in whole MiB/s, whatever the paths served in bytes.
        #[test]
        fn plan_keeps_each_mibps_contract(r in 0u64..100_000, extra in 0u64..100_000,
                                          d in proptest::collection::vec((0u64..(1 << 34), any::<bool>()), 1..5)) {
            let h = BTreeMap::from([("h".to_string(), ClusterHost {
                reservation_mibps: r,
                limit_mibps: Some(r + extra),
                ..Default::default()
            })]);
            let targets: Vec<String> = (0..d.len()).map(|i| format!("t{i}")).collect();
            let demand = targets.iter().zip(&d)
                .map(|(t, &(bytes, b))| (t.clone(), BTreeMap::from([("h".to_string(), PathDemand {
                    backlogged: b,
                    served_bytes: bytes,
                    ..Default::default()
                })])))
                .collect();
            let plan = plan(&h, &targets, &demand, &DivideConfig::default());
            let (mut res, mut lim) = (0, 0);
            for t in &targets {
                let s = with_cold_shares(&plan[t], &h)["h"];
                let l = s.limit_mibps.unwrap();
                prop_assert!(s.reservation_mibps <= l);
                res += s.reservation_mibps;
                lim += l;
            }
            prop_assert!(lim >= r + extra && lim <= r + extra + targets.len() as u64);
            prop_assert_eq!(res, r);
        }
    }
}
