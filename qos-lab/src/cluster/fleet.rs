//! A generated fleet (`[fleet]` in a cluster scenario): N targets and M hosts drawn
//! from stated ranges with a seed, each host reaching `paths` consecutive targets (0:
//! all) with `primary_milli` of its demand on the first and the rest spread over the
//! others; events as fractions of hosts whose demand moves to their next path, and
//! targets failing. The same seed gives the same fleet.

use serde::Deserialize;

use super::{DemandStep, HostSpec, MAX_IOPS, TargetSpec};

/// The most target-host pairs a fleet may have: the model keeps a share per pair.
pub const MAX_PAIRS: u64 = 4_000_000;

/// From period `at` on, a `fraction` of the hosts (drawn with the seed) move their
/// demand's larger part to their next path.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FleetMove {
    pub at: u32,
    pub fraction: f64,
}

/// Target number `target` (0-based) dies in period `at`.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FleetFailure {
    pub at: u32,
    pub target: u32,
}

/// The `[fleet]` section: ranges are `[lowest, highest]`, drawn uniformly.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FleetSpec {
    pub seed: u64,
    pub targets: u32,
    pub hosts: u32,
    pub capacity_iops: [u64; 2],
    /// The fraction of hosts with a reservation.
    pub reserved_fraction: f64,
    pub reservation_iops: [u64; 2],
    /// Drawn, then raised to the host's reservation if below it.
    pub limit_iops: [u64; 2],
    pub weight: [u32; 2],
    pub demand_iops: [u64; 2],
    /// Targets each host reaches (0: all).
    #[serde(default = "default_paths")]
    pub paths: u32,
    /// The part of a host's demand on its first path, in thousandths.
    #[serde(default = "default_primary")]
    pub primary_milli: u32,
    #[serde(default)]
    pub moves: Vec<FleetMove>,
    #[serde(default)]
    pub failures: Vec<FleetFailure>,
}

fn default_paths() -> u32 {
    2
}
fn default_primary() -> u32 {
    800
}

/// splitmix64: small, seeded, the same everywhere.
struct Draw(u64);

impl Draw {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn range(&mut self, r: [u64; 2]) -> u64 {
        r[0] + self.next() % (r[1] - r[0] + 1)
    }
    /// True with probability `f`.
    fn chance(&mut self, f: f64) -> bool {
        ((self.next() >> 11) as f64 / (1u64 << 53) as f64) < f
    }
}

fn check_range(
    field: &str,
    r: [u64; 2],
    lowest: u64,
    highest: u64,
) -> Result<(), (String, String)> {
    if r[0] > r[1] || r[0] < lowest || r[1] > highest {
        return Err((
            format!("fleet.{field}"),
            format!("[lowest, highest] with {lowest} <= lowest <= highest <= {highest}"),
        ));
    }
    Ok(())
}

fn check_fraction(field: String, f: f64) -> Result<(), (String, String)> {
    if !(0.0..=1.0).contains(&f) {
        return Err((field, "a fraction, 0 ..= 1".into()));
    }
    Ok(())
}

impl FleetSpec {
    /// The section's figures: (field, what is wrong).
    pub fn check(&self) -> Result<(), (String, String)> {
        if !(1..=1024).contains(&self.targets) {
            return Err(("fleet.targets".into(), "1 ..= 1024".into()));
        }
        if !(1..=1_000_000).contains(&self.hosts) {
            return Err(("fleet.hosts".into(), "1 ..= 1000000".into()));
        }
        if self.targets as u64 * self.hosts as u64 > MAX_PAIRS {
            return Err((
                "fleet.hosts".into(),
                format!("at most {MAX_PAIRS} target-host pairs (targets x hosts)"),
            ));
        }
        check_range("capacity_iops", self.capacity_iops, 1, MAX_IOPS)?;
        check_range("reservation_iops", self.reservation_iops, 0, MAX_IOPS)?;
        check_range("limit_iops", self.limit_iops, 1, MAX_IOPS)?;
        check_range("demand_iops", self.demand_iops, 0, MAX_IOPS)?;
        let w = [self.weight[0] as u64, self.weight[1] as u64];
        check_range("weight", w, 1, 1000)?;
        check_fraction("fleet.reserved_fraction".into(), self.reserved_fraction)?;
        if self.paths > self.targets {
            return Err(("fleet.paths".into(), "0 (all) ..= targets".into()));
        }
        if self.primary_milli > 1000 {
            return Err(("fleet.primary_milli".into(), "0 ..= 1000".into()));
        }
        for (i, m) in self.moves.iter().enumerate() {
            check_fraction(format!("fleet.moves[{i}].fraction"), m.fraction)?;
            if m.at == 0 || (i > 0 && m.at <= self.moves[i - 1].at) {
                return Err((
                    format!("fleet.moves[{i}].at"),
                    "at least 1, in increasing order".into(),
                ));
            }
        }
        for (i, f) in self.failures.iter().enumerate() {
            if f.target >= self.targets {
                return Err((
                    format!("fleet.failures[{i}].target"),
                    format!(
                        "0 ..= {} (the targets are numbered from 0)",
                        self.targets - 1
                    ),
                ));
            }
        }
        Ok(())
    }

    /// The targets and hosts, drawn with the seed.
    pub fn generate(&self) -> (Vec<TargetSpec>, Vec<HostSpec>) {
        let mut draw = Draw(self.seed);
        let n = self.targets as usize;
        let targets = (0..n)
            .map(|i| TargetSpec {
                name: format!("t{i:03}"),
                capacity_iops: draw.range(self.capacity_iops),
                fail_at: self
                    .failures
                    .iter()
                    .filter(|f| f.target as usize == i)
                    .map(|f| f.at)
                    .min(),
            })
            .collect();
        let hosts = (0..self.hosts).map(|k| self.host(k, &mut draw)).collect();
        (targets, hosts)
    }

    fn host(&self, k: u32, draw: &mut Draw) -> HostSpec {
        let n = self.targets as usize;
        let reservation = if draw.chance(self.reserved_fraction) {
            draw.range(self.reservation_iops)
        } else {
            0
        };
        let limit = draw.range(self.limit_iops).max(reservation);
        let w = [self.weight[0] as u64, self.weight[1] as u64];
        let weight = draw.range(w) as u32;
        let want = draw.range(self.demand_iops);
        let k_paths = if self.paths == 0 {
            n
        } else {
            self.paths as usize
        };
        let first = (draw.next() % n as u64) as usize;
        let paths: Vec<usize> = (0..k_paths).map(|j| (first + j) % n).collect();
        let mut primary = 0;
        let mut demand = vec![DemandStep {
            from: 0,
            iops: self.split(want, &paths, primary),
        }];
        for m in &self.moves {
            if draw.chance(m.fraction) && k_paths > 1 {
                primary = (primary + 1) % k_paths;
                demand.push(DemandStep {
                    from: m.at,
                    iops: self.split(want, &paths, primary),
                });
            }
        }
        HostSpec {
            nqn: format!("nqn.2026-11.io.lab:host-{k:06}"),
            reservation_iops: reservation,
            limit_iops: Some(limit),
            weight,
            demand,
            multipath: true,
            paths: Some(paths),
        }
    }

    /// `want` over the targets: `primary_milli` on `paths[primary]`, the rest evenly on
    /// the other paths.
    fn split(&self, want: u64, paths: &[usize], primary: usize) -> Vec<u64> {
        let mut iops = vec![0; self.targets as usize];
        if paths.len() == 1 {
            iops[paths[0]] = want;
            return iops;
        }
        let main = want * self.primary_milli as u64 / 1000;
        let rest = (want - main) / (paths.len() as u64 - 1);
        for (j, &t) in paths.iter().enumerate() {
            iops[t] = if j == primary { main } else { rest };
        }
        iops
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::super::{ClusterScenario, fleet_report, recovery, simulate};

    /// 4 targets, 200 hosts, a move and a target failure (also played:
    /// `played_leader`'s tests).
    pub(in crate::cluster) const SMALL: &str = r#"
[cluster]
periods = 40
lease_periods = 4
demand_window_periods = 2
apply_delay_periods = 1
[fleet]
seed = 7
targets = 4
hosts = 200
capacity_iops = [150000, 200000]
reserved_fraction = 0.5
reservation_iops = [200, 1000]
limit_iops = [1000, 4000]
weight = [1, 5]
demand_iops = [500, 3000]
paths = 2
moves = [ { at = 10, fraction = 0.2 } ]
failures = [ { at = 25, target = 1 } ]
"#;

    fn percentile99(mut v: Vec<u32>) -> u32 {
        v.sort_unstable();
        v[(v.len() - 1) * 99 / 100]
    }

    #[test]
    fn a_seeded_fleet_settles_and_keeps_its_limits() {
        let s = ClusterScenario::parse(SMALL, "t").unwrap();
        assert_eq!((s.targets.len(), s.hosts.len()), (4, 200));
        let again = ClusterScenario::parse(SMALL, "t").unwrap();
        assert_eq!(
            format!("{:?}", s.hosts),
            format!("{:?}", again.hosts),
            "the seed gives the same fleet"
        );
        let run = simulate(&s);
        let reserved: Vec<usize> = (0..200)
            .filter(|&k| s.hosts[k].reservation_iops > 0)
            .collect();
        let movers: Vec<usize> = reserved
            .iter()
            .copied()
            .filter(|&k| s.hosts[k].demand.len() > 1)
            .collect();
        assert!(!movers.is_empty());
        let after_move: Vec<u32> = movers
            .iter()
            .map(|&k| recovery(&s, &run, k, 10).expect("settles"))
            .collect();
        assert!(percentile99(after_move.clone()) <= 3, "{after_move:?}");
        let after_failure: Vec<u32> = reserved
            .iter()
            .map(|&k| recovery(&s, &run, k, 25).expect("settles"))
            .collect();
        assert!(
            percentile99(after_failure.clone()) <= 4 + 2,
            "{after_failure:?}"
        );
        // Σ limit shares never above a host's limit + 1 per target; nobody above its limit.
        assert_eq!(run.limit_share_excess, 0);
        for (p, shares) in run.shares.iter().enumerate() {
            for (k, h) in s.hosts.iter().enumerate() {
                let sum: u64 = shares.iter().filter_map(|t| t[k]?.limit_iops).sum();
                let limit = h.limit_iops.unwrap();
                assert!(sum <= limit + 4, "period {p} host {k}: {sum} > {limit}");
                assert!(run.periods[p][k].served <= limit);
            }
        }
        let text = fleet_report(&s, &run);
        assert!(text.contains("period 10: "), "{text}");
        assert!(text.contains("target t001 fails"), "{text}");
        assert!(text.contains("0 hosts got more than their limit"), "{text}");
    }

    #[test]
    fn bad_fleets_name_the_field() {
        let cases = [
            ("paths = 2", "paths = 5", "fleet.paths"),
            ("[200, 1000]", "[1000, 200]", "fleet.reservation_iops"),
            ("weight = [1, 5]", "weight = [0, 5]", "fleet.weight"),
            (
                "fraction = 0.2",
                "fraction = 1.5",
                "fleet.moves[0].fraction",
            ),
            ("target = 1 }", "target = 4 }", "fleet.failures[0].target"),
            ("hosts = 200", "hosts = 2000000", "fleet.hosts"),
            (
                "reserved_fraction = 0.5",
                "reserved_fraction = -1",
                "fleet.reserved_fraction",
            ),
        ];
        for (from, to, field) in cases {
            let text = SMALL.replace(from, to);
            let e = ClusterScenario::parse(&text, "f").unwrap_err().to_string();
            assert!(e.contains(field), "{to}: {e}");
        }
        let with_target = format!("{SMALL}[[target]]\nname = \"a\"\ncapacity_iops = 1\n");
        let e = ClusterScenario::parse(&with_target, "f")
            .unwrap_err()
            .to_string();
        assert!(e.contains("fleet") && e.contains("no [[target]]"), "{e}");
    }
}
