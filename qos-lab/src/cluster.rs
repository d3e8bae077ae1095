//! The lab's cluster of targets (`qos-lab cluster FILE`): a fluid, period-by-period
//! model of several targets that share hosts, each host's cluster-wide reservation and
//! limit divided among the live targets by the cluster agents' own rule
//! (`qos_core::cluster::plan`) from what each target reported for the period before.
//! Each target serves, per period, the hosts' reservation shares first (scaled down if
//! its capacity cannot carry them), then what is left by weighted max-min within each
//! host's limit share. Demand can move between targets and targets can fail; a failed
//! target keeps its shares until its lease expires (`lease_periods`), and its hosts'
//! demand moves to the live targets (multipath). It answers what an operator planning
//! a cluster asks: do the reservations fit, also with any one target down; how many
//! periods until a host's reservation holds again after its demand moves or a target
//! fails; does any host ever exceed its limit.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use qos_core::cluster::{ClusterHost, DivideConfig, LocalShare, PathDemand, plan};
use qos_core::share::{Claim, water_fill};
use serde::Deserialize;
use thiserror::Error;

/// The largest rate a cluster scenario takes (a million million IOPS): sums over
/// targets and hosts stay far from overflowing.
pub const MAX_IOPS: u64 = 1_000_000_000_000;

/// A cluster scenario that cannot be used; the message names the field.
#[derive(Debug, Error)]
pub enum ClusterScenarioError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("{path}: {message}")]
    Parse { path: String, message: String },
    #[error("{path}: {field}: {message}")]
    Invalid {
        path: String,
        field: String,
        message: String,
    },
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterSettings {
    #[serde(default)]
    pub description: String,
    /// Periods simulated.
    pub periods: u32,
    /// Periods after its failure that a dead target still holds its shares (its agent's
    /// lease time-to-live, in periods).
    #[serde(default = "default_lease")]
    pub lease_periods: u32,
    #[serde(default = "default_floor")]
    pub floor_milli: u32,
    #[serde(default = "default_headroom")]
    pub headroom_milli: u32,
}

fn default_lease() -> u32 {
    4
}
fn default_floor() -> u32 {
    DivideConfig::default().floor_milli
}
fn default_headroom() -> u32 {
    DivideConfig::default().headroom_milli
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TargetSpec {
    pub name: String,
    pub capacity_iops: u64,
    /// The period the target dies in (it serves nothing from then on).
    pub fail_at: Option<u32>,
}

/// From period `from` on, the host wants `iops[i]` at target `i`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DemandStep {
    pub from: u32,
    pub iops: Vec<u64>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostSpec {
    pub nqn: String,
    #[serde(default)]
    pub reservation_iops: u64,
    pub limit_iops: Option<u64>,
    #[serde(default = "default_weight")]
    pub weight: u32,
    pub demand: Vec<DemandStep>,
    /// The host reaches every target (multipath): what it wanted at a failed target
    /// moves evenly to the live ones. `false`: it is lost with the target.
    #[serde(default = "default_multipath")]
    pub multipath: bool,
}

fn default_multipath() -> bool {
    true
}

fn default_weight() -> u32 {
    1
}

/// A cluster scenario file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterScenario {
    pub cluster: ClusterSettings,
    #[serde(rename = "target")]
    pub targets: Vec<TargetSpec>,
    #[serde(rename = "host")]
    pub hosts: Vec<HostSpec>,
}

impl ClusterScenario {
    pub fn load(path: &Path) -> Result<ClusterScenario, ClusterScenarioError> {
        let p = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| ClusterScenarioError::Read {
            path: p.clone(),
            source,
        })?;
        Self::parse(&text, &p)
    }

    pub fn parse(text: &str, path: &str) -> Result<ClusterScenario, ClusterScenarioError> {
        let s: ClusterScenario = toml::from_str(text).map_err(|e| ClusterScenarioError::Parse {
            path: path.into(),
            message: e.to_string(),
        })?;
        let bad = |field: String, message: String| ClusterScenarioError::Invalid {
            path: path.into(),
            field,
            message,
        };
        if s.cluster.periods == 0 {
            return Err(bad("cluster.periods".into(), "at least 1".into()));
        }
        DivideConfig {
            floor_milli: s.cluster.floor_milli,
            headroom_milli: s.cluster.headroom_milli,
        }
        .validate()
        .map_err(|e| bad("cluster".into(), e.to_string()))?;
        if s.targets.is_empty() {
            return Err(bad("target".into(), "at least one [[target]]".into()));
        }
        for (i, t) in s.targets.iter().enumerate() {
            if t.capacity_iops == 0 || t.capacity_iops > MAX_IOPS {
                return Err(bad(
                    format!("target[{i}].capacity_iops"),
                    format!("1 ..= {MAX_IOPS}"),
                ));
            }
        }
        for (i, h) in s.hosts.iter().enumerate() {
            let f = |x: &str| format!("host[{i}] ({}).{x}", h.nqn);
            if !(1..=1000).contains(&h.weight) {
                return Err(bad(f("weight"), "1 ..= 1000".into()));
            }
            let too_big = format!("at most {MAX_IOPS} IOPS");
            if h.reservation_iops > MAX_IOPS || h.limit_iops.is_some_and(|l| l > MAX_IOPS) {
                return Err(bad(f("reservation_iops / limit_iops"), too_big));
            }
            if h.limit_iops.is_some_and(|l| l < h.reservation_iops) {
                return Err(bad(f("limit_iops"), "below the reservation".into()));
            }
            if h.demand.is_empty() || h.demand[0].from != 0 {
                return Err(bad(f("demand"), "the first step must be `from = 0`".into()));
            }
            for (k, d) in h.demand.iter().enumerate() {
                if d.iops.len() != s.targets.len() {
                    return Err(bad(
                        f(&format!("demand[{k}].iops")),
                        format!(
                            "one figure per target ({}), got {}",
                            s.targets.len(),
                            d.iops.len()
                        ),
                    ));
                }
                if d.iops.iter().any(|&w| w > MAX_IOPS) {
                    return Err(bad(f(&format!("demand[{k}].iops")), too_big.clone()));
                }
                if k > 0 && d.from <= h.demand[k - 1].from {
                    return Err(bad(
                        f(&format!("demand[{k}].from")),
                        "steps must be in increasing order".into(),
                    ));
                }
            }
        }
        Ok(s)
    }

    fn divide_config(&self) -> DivideConfig {
        DivideConfig {
            floor_milli: self.cluster.floor_milli,
            headroom_milli: self.cluster.headroom_milli,
        }
    }
}

/// One host in one period.
#[derive(Debug, Clone, Copy, Default)]
pub struct HostPeriod {
    /// What it wanted over the cluster (after failover) and what it got.
    pub wanted: u64,
    pub served: u64,
}

/// The simulation's result: per period and host.
#[derive(Debug, Clone)]
pub struct ClusterRun {
    pub periods: Vec<Vec<HostPeriod>>,
    /// Per period, each target's (reservation share, limit share) of each host.
    pub shares: Vec<Vec<Vec<Option<LocalShare>>>>,
}

/// What a host wants at each target in period `p`, with a dead target's demand moved
/// evenly to the alive ones.
fn wanted_at(s: &ClusterScenario, h: &HostSpec, p: u32, alive: &[bool]) -> Vec<u64> {
    let step = h
        .demand
        .iter()
        .rev()
        .find(|d| d.from <= p)
        .expect("from = 0 checked");
    let n_alive = alive.iter().filter(|&&a| a).count() as u64;
    let moved: u64 = if !h.multipath {
        0
    } else {
        step.iops
            .iter()
            .zip(alive)
            .filter(|(_, a)| !**a)
            .map(|(w, _)| *w)
            .sum()
    };
    (0..s.targets.len())
        .map(|i| {
            if !alive[i] || n_alive == 0 {
                0
            } else {
                step.iops[i] + moved / n_alive
            }
        })
        .collect()
}

/// One target's period: reservation shares first, then weighted max-min within limits.
fn serve(capacity: u64, wants: &[u64], shares: &[Option<LocalShare>]) -> Vec<u64> {
    let cap_of = |k: usize| shares[k].and_then(|s| s.limit_iops).unwrap_or(u64::MAX);
    let res: Vec<u64> = (0..wants.len())
        .map(|k| {
            let r = shares[k].map_or(0, |s| s.reservation_iops);
            wants[k].min(r).min(cap_of(k))
        })
        .collect();
    let total_res: u64 = res.iter().sum();
    let mut served: Vec<u64> = if total_res > capacity {
        res.iter()
            .map(|&r| (r as u128 * capacity as u128 / total_res as u128) as u64)
            .collect()
    } else {
        res
    };
    let left = capacity - served.iter().sum::<u64>().min(capacity);
    let claims: Vec<Claim> = (0..wants.len())
        .map(|k| Claim {
            weight: shares[k].map_or(1, |s| s.weight as u64),
            demand: wants[k].min(cap_of(k)).saturating_sub(served[k]),
        })
        .collect();
    let mut extra = vec![0; wants.len()];
    water_fill(left, &claims, &mut extra);
    for (s, e) in served.iter_mut().zip(extra) {
        *s += e;
    }
    served
}

/// Runs the scenario.
pub fn simulate(s: &ClusterScenario) -> ClusterRun {
    let names: Vec<String> = s.targets.iter().map(|t| t.name.clone()).collect();
    let hosts: BTreeMap<String, ClusterHost> = s
        .hosts
        .iter()
        .map(|h| {
            (
                h.nqn.clone(),
                ClusterHost {
                    reservation_iops: h.reservation_iops,
                    limit_iops: h.limit_iops,
                    weight: h.weight,
                    // The lab's cluster model is of operations only.
                    ..Default::default()
                },
            )
        })
        .collect();
    let cfg = s.divide_config();
    let mut reports: BTreeMap<String, BTreeMap<String, PathDemand>> = BTreeMap::new();
    let mut periods = Vec::new();
    let mut all_shares = Vec::new();
    for p in 0..s.cluster.periods {
        let alive: Vec<bool> = s
            .targets
            .iter()
            .map(|t| t.fail_at.is_none_or(|f| p < f))
            .collect();
        let members: Vec<String> = s
            .targets
            .iter()
            .filter(|t| t.fail_at.is_none_or(|f| p < f + s.cluster.lease_periods))
            .map(|t| t.name.clone())
            .collect();
        let division = plan(&hosts, &members, &reports, &cfg);
        let wants: Vec<Vec<u64>> = s.hosts.iter().map(|h| wanted_at(s, h, p, &alive)).collect();
        let mut row = vec![HostPeriod::default(); s.hosts.len()];
        let mut shares_row = Vec::new();
        // A dead target's last report stays in etcd under its lease, as its shares do.
        reports.retain(|t, _| {
            members.contains(t) && !alive[names.iter().position(|n| n == t).expect("known")]
        });
        for (i, t) in s.targets.iter().enumerate() {
            let shares: Vec<Option<LocalShare>> = s
                .hosts
                .iter()
                .map(|h| division.get(&names[i]).and_then(|d| d.get(&h.nqn)).copied())
                .collect();
            shares_row.push(shares.clone());
            if !alive[i] {
                continue;
            }
            let w: Vec<u64> = wants.iter().map(|w| w[i]).collect();
            let served = serve(t.capacity_iops, &w, &shares);
            let rep = reports.entry(names[i].clone()).or_default();
            for (k, h) in s.hosts.iter().enumerate() {
                row[k].wanted += w[k];
                row[k].served += served[k];
                rep.insert(
                    h.nqn.clone(),
                    PathDemand {
                        served: served[k],
                        backlogged: served[k] < w[k],
                        ..Default::default()
                    },
                );
            }
        }
        periods.push(row);
        all_shares.push(shares_row);
    }
    ClusterRun {
        periods,
        shares: all_shares,
    }
}

/// The periods from which a reservation counts: not within `settle` periods after a
/// demand step, nor within the lease and `settle` more after a target failure (what the
/// table reports separately as recovery).
fn settled(s: &ClusterScenario, p: u32, settle: u32) -> bool {
    let steps = s
        .hosts
        .iter()
        .flat_map(|h| h.demand.iter().map(|d| (d.from, settle)));
    let failures = s
        .targets
        .iter()
        .filter_map(|t| t.fail_at.map(|f| (f, s.cluster.lease_periods + settle)));
    !steps.chain(failures).any(|(e, n)| p >= e && p < e + n)
}

/// Per host: periods in which it wanted at least its reservation and got >= 99 % of it,
/// out of such periods, counting only periods at least `settle` after every event.
pub fn reservation_periods(
    s: &ClusterScenario,
    run: &ClusterRun,
    k: usize,
    settle: u32,
) -> (usize, usize) {
    let r = s.hosts[k].reservation_iops;
    let mut met = 0;
    let mut of = 0;
    for (p, row) in run.periods.iter().enumerate() {
        let hp = row[k];
        if r == 0 || hp.wanted < r || !settled(s, p as u32, settle) {
            continue;
        }
        of += 1;
        met += (hp.served * 100 >= r * 99) as usize;
    }
    (met, of)
}

/// Periods after `event` until host `k` next gets >= 99 % of its reservation (`None`:
/// never within the run).
pub fn recovery(s: &ClusterScenario, run: &ClusterRun, k: usize, event: u32) -> Option<u32> {
    let r = s.hosts[k].reservation_iops;
    (event..s.cluster.periods)
        .find(|&p| {
            let hp = run.periods[p as usize][k];
            hp.wanted < r || hp.served * 100 >= r * 99
        })
        .map(|p| p - event)
}

/// What the hosts that still reach a live target reserve when target `f` is down:
/// multipath hosts, and the others that want something at another target.
fn survivors_need(s: &ClusterScenario, f: usize) -> u64 {
    s.hosts
        .iter()
        .filter(|h| {
            h.multipath
                || h.demand
                    .iter()
                    .any(|d| d.iops.iter().enumerate().any(|(i, &w)| i != f && w > 0))
        })
        .map(|h| h.reservation_iops)
        .sum()
}

/// The table `qos-lab cluster` prints.
pub fn report(s: &ClusterScenario, run: &ClusterRun) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "{}", s.cluster.description);
    admission_line(&mut out, s);
    let events = cluster_events(s);
    let settle = 3;
    host_rows(&mut out, s, run, settle);
    if !events.is_empty() {
        let _ = writeln!(
            out,
            "\nperiods until each reserved host gets its reservation again:"
        );
        for (p, what) in &events {
            let rec: Vec<String> = s
                .hosts
                .iter()
                .enumerate()
                .filter(|(_, h)| h.reservation_iops > 0)
                .map(|(k, h)| match recovery(s, run, k, *p) {
                    Some(n) => format!("{} {n}", h.nqn),
                    None => format!("{} never", h.nqn),
                })
                .collect();
            let _ = writeln!(out, "  period {p}: {what}: {}", rec.join(", "));
        }
    }
    let _ = writeln!(
        out,
        "\n(met: periods in which the host wanted at least its reservation and got >= 99 % of it, from {settle} periods after each demand step and {} after each failure on)",
        s.cluster.lease_periods + settle
    );
    out
}

/// Whether the reservations fit the cluster, and with any one target down.
fn admission_line(out: &mut String, s: &ClusterScenario) {
    let total_cap: u64 = s.targets.iter().map(|t| t.capacity_iops).sum();
    let reserved: u64 = s.hosts.iter().map(|h| h.reservation_iops).sum();
    let worst = (0..s.targets.len())
        .map(|f| {
            (
                f,
                survivors_need(s, f),
                total_cap - s.targets[f].capacity_iops,
            )
        })
        .find(|&(_, need, cap)| need > cap);
    let _ = writeln!(
        out,
        "admission: reservations {reserved} IOPS of {total_cap} IOPS over {} targets ({}); with any one target down: {}",
        s.targets.len(),
        if reserved <= total_cap {
            "fit"
        } else {
            "DO NOT FIT"
        },
        match worst {
            None => "fit".to_string(),
            Some((f, need, cap)) => format!(
                "do not fit (target {} down: the hosts that still reach a target reserve {need} IOPS of the {cap} IOPS left)",
                s.targets[f].name
            ),
        }
    );
}

/// The scenario's events in period order: demand steps and target failures.
fn cluster_events(s: &ClusterScenario) -> Vec<(u32, String)> {
    let mut events: Vec<(u32, String)> = Vec::new();
    for h in &s.hosts {
        for d in h.demand.iter().skip(1) {
            events.push((d.from, format!("{}'s demand moves to {:?}", h.nqn, d.iops)));
        }
    }
    for t in &s.targets {
        if let Some(f) = t.fail_at {
            events.push((
                f,
                format!(
                    "target {} fails (its lease expires {} periods later)",
                    t.name, s.cluster.lease_periods
                ),
            ));
        }
    }
    events.sort();
    events
}

/// One row per host: what it got against its reservation and limit.
fn host_rows(out: &mut String, s: &ClusterScenario, run: &ClusterRun, settle: u32) {
    let _ = writeln!(
        out,
        "\n{:<28} {:>9} {:>9} {:>10} {:>10} {:>12} {:>14}",
        "host", "reserved", "limit", "mean got", "most got", "vs limit", "met (settled)"
    );
    for (k, h) in s.hosts.iter().enumerate() {
        let served: Vec<u64> = run.periods.iter().map(|r| r[k].served).collect();
        let mean = served.iter().sum::<u64>() / served.len().max(1) as u64;
        let most = served.iter().copied().max().unwrap_or(0);
        let vs = h.limit_iops.map_or("-".into(), |l| {
            format!("{:+.2} %", (most as f64 / l as f64 - 1.0) * 100.0)
        });
        let (met, of) = reservation_periods(s, run, k, settle);
        let _ = writeln!(
            out,
            "{:<28} {:>9} {:>9} {:>10} {:>10} {:>12} {:>14}",
            h.nqn,
            h.reservation_iops,
            h.limit_iops.map_or("-".into(), |l| l.to_string()),
            mean,
            most,
            vs,
            format!("{met}/{of}")
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MOVE: &str = r#"
[cluster]
periods = 30
[[target]]
name = "a"
capacity_iops = 100000
[[target]]
name = "b"
capacity_iops = 100000
fail_at = 20
[[host]]
nqn = "x"
reservation_iops = 30000
limit_iops = 40000
demand = [ { from = 0, iops = [40000, 10000] }, { from = 10, iops = [10000, 40000] } ]
[[host]]
nqn = "y"
reservation_iops = 70000
demand = [ { from = 0, iops = [100000, 0] } ]
multipath = false
[[host]]
nqn = "z"
reservation_iops = 70000
demand = [ { from = 0, iops = [0, 100000] } ]
multipath = false
"#;

    #[test]
    fn a_move_is_followed_in_two_periods_and_the_limit_holds() {
        let s = ClusterScenario::parse(MOVE, "t").unwrap();
        let run = simulate(&s);
        assert!(
            recovery(&s, &run, 0, 10).unwrap() <= 2,
            "{:?}",
            recovery(&s, &run, 0, 10)
        );
        let (met, of) = reservation_periods(&s, &run, 0, 3);
        assert_eq!(
            met, of,
            "x met its reservation in {met} of {of} settled periods"
        );
        assert!(run.periods.iter().all(|r| r[0].served <= 40_000));
        let text = report(&s, &run);
        assert!(text.contains("period 10: x's demand moves"), "{text}");
    }

    #[test]
    fn a_failure_is_survived_when_the_reservations_fit_the_rest() {
        let s = ClusterScenario::parse(MOVE, "t").unwrap();
        let run = simulate(&s);
        // b fails at 20; its shares move at 24 (lease 4), served from the next period.
        let rec = recovery(&s, &run, 0, 20).unwrap();
        assert!((4..=6).contains(&rec), "x back after {rec} periods");
        let shares = &run.shares[29];
        assert_eq!(
            shares[0][0].unwrap().reservation_iops,
            30_000,
            "a holds x's whole reservation"
        );
        assert!(
            report(&s, &run).contains("with any one target down: fit"),
            "{}",
            report(&s, &run)
        );
        // The same with z reaching a as well: a cannot carry all three reservations.
        let s = ClusterScenario::parse(
            &MOVE.replacen("multipath = false", "multipath = true", 2),
            "t",
        )
        .unwrap();
        let run = simulate(&s);
        assert_eq!(
            recovery(&s, &run, 0, 20),
            None,
            "x cannot get its reservation back"
        );
    }

    #[test]
    fn bad_files_name_the_field() {
        let e =
            ClusterScenario::parse(&MOVE.replace("[40000, 10000]", "[1]"), "f.toml").unwrap_err();
        assert!(e.to_string().contains("host[0] (x).demand[0].iops"), "{e}");
        let e = ClusterScenario::parse(&MOVE.replace("limit_iops = 40000", "limit_iops = 1"), "f")
            .unwrap_err();
        assert!(e.to_string().contains("below the reservation"), "{e}");
        let e = ClusterScenario::parse(
            &MOVE.replace("capacity_iops = 100000", "capacity_iops = 10000000000000"),
            "f",
        )
        .unwrap_err();
        assert!(e.to_string().contains("target[0].capacity_iops"), "{e}");
        let e = ClusterScenario::parse("[cluster]\nperiods = 1\nbogus = 2\n", "f").unwrap_err();
        assert!(e.to_string().contains("bogus"), "{e}");
    }
}
