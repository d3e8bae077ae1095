//! The cluster model's period loop: each period the leader divides (with the real
//! `qos_core::cluster::plan`) from the reports in etcd, the division reaches the
//! targets `apply_delay_periods` later, each live target serves its hosts (reservation
//! shares first, then weighted max-min within limit shares) and reports the mean of
//! the last `demand_window_periods`; while etcd is away nothing is divided, read or
//! reported, and with `handover` the targets trade unused shares with the real
//! `qos_core::handover`. It also counts what the agents would write to etcd and times
//! `plan`.

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use qos_core::cluster::{ClusterHost, LocalShare, PathDemand, Plan, cold_share, on_path, plan};
use qos_core::handover::{Handover, HandoverConfig, HandoverReport};
use qos_core::share::{Claim, water_fill};

use super::etcd::{
    AGENT_WRITES, EtcdLoad, LEADER_READS, json_len, key_len, share_len, shares_map_len,
};

/// A host's key in etcd but its NQN (`/nvmf-qos/<cluster>/hosts/`, a short cluster name).
const HOSTS_KEY: &str = "/nvmf-qos/fleet/hosts/";
use super::{ClusterScenario, HostSpec};

/// One host in one period.
#[derive(Debug, Clone, Copy, Default)]
pub struct HostPeriod {
    /// What it wanted over the cluster (after failover) and what it got.
    pub wanted: u64,
    pub served: u64,
}

/// Shares kept per period only up to this many (target, host) pairs: a fleet's would
/// fill the memory.
const KEEP_SHARES_UP_TO: usize = 10_000;

/// The simulation's result: per period and host.
#[derive(Debug, Clone)]
pub struct ClusterRun {
    pub periods: Vec<Vec<HostPeriod>>,
    /// Per period, each target's (reservation share, limit share) of each host (empty
    /// for scenarios of more than 10,000 target-host pairs).
    pub shares: Vec<Vec<Vec<Option<LocalShare>>>>,
    /// What the agents would have written to etcd.
    pub etcd: EtcdLoad,
    /// The wall time of each call of `plan` (measured: not deterministic), and the
    /// thread's CPU time in it (where the kernel gives it).
    pub division_times: Vec<Duration>,
    pub division_cpu: Vec<Duration>,
    /// Divisions in which a host's limit shares added up to more than its limit plus
    /// one per member (a target refuses a limit of 0): 0 unless the division is wrong.
    pub limit_share_excess: usize,
}

/// Each target's share of each host, dense: `[target][host]`.
type Dense = Vec<Vec<Option<LocalShare>>>;

/// What a host wants at each target in period `p`, with a dead target's demand moved
/// evenly to the alive targets among its paths.
pub(super) fn wanted_at(h: &HostSpec, n_targets: usize, p: u32, alive: &[bool]) -> Vec<u64> {
    let step = h
        .demand
        .iter()
        .rev()
        .find(|d| d.from <= p)
        .expect("from = 0 checked");
    let mut path_mask = vec![h.paths.is_none(); n_targets];
    for &i in h.paths.iter().flatten() {
        path_mask[i] = true;
    }
    let on_path = |i: usize| path_mask[i];
    let n_alive = (0..n_targets).filter(|&i| alive[i] && on_path(i)).count() as u64;
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
    (0..n_targets)
        .map(|i| {
            if !alive[i] || n_alive == 0 {
                0
            } else if on_path(i) {
                step.iops[i] + moved / n_alive
            } else {
                step.iops[i]
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

/// The loop's state between periods.
struct Engine<'a> {
    s: &'a ClusterScenario,
    names: Vec<String>,
    contracts: BTreeMap<String, ClusterHost>,
    /// The JSON length of the hosts' contracts as etcd holds them (key and value).
    contracts_len: u64,
    /// The hosts in NQN order (the order of every map of a division), those of one
    /// NQN together, and each NQN's JSON length.
    groups: Vec<Vec<usize>>,
    nqn_len: Vec<u64>,
    /// Per target, the hosts that can ever want something there, in host order.
    at: Vec<Vec<usize>>,
    /// Per target, per local host, the served figures of the last periods (a ring), and
    /// whether it got less than it wanted in the last one.
    history: Vec<Vec<VecDeque<u64>>>,
    held: Vec<Vec<bool>>,
    /// Per target, its handover book (with `handover`), the divisions applied, and
    /// whether the books still start from an older one (they are rebased when a trade
    /// needs them: copying every share every period would be most of a fleet's run).
    books: Option<Vec<Handover>>,
    seq: u64,
    books_behind: bool,
    reports: BTreeMap<String, BTreeMap<String, PathDemand>>,
    pending: VecDeque<(u32, Dense)>,
    applied: Dense,
    /// The members, the division and the leader of the last division written.
    written: Option<(Vec<String>, Plan, usize)>,
    run: ClusterRun,
}

impl<'a> Engine<'a> {
    fn new(s: &'a ClusterScenario) -> Self {
        let n = s.targets.len();
        let at: Vec<Vec<usize>> = (0..n)
            .map(|i| {
                (0..s.hosts.len())
                    .filter(|&k| {
                        let h = &s.hosts[k];
                        let on_path = h.paths.as_ref().is_none_or(|ps| ps.contains(&i));
                        h.demand.iter().any(|d| d.iops[i] > 0) || (h.multipath && on_path)
                    })
                    .collect()
            })
            .collect();
        let history = at
            .iter()
            .map(|hs| vec![VecDeque::new(); hs.len()])
            .collect();
        let held = at.iter().map(|hs| vec![false; hs.len()]).collect();
        let books = s
            .cluster
            .handover
            .then(|| s.targets.iter().map(|t| Handover::new(&t.name)).collect());
        let mut groups: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
        for (k, h) in s.hosts.iter().enumerate() {
            groups.entry(h.nqn.as_str()).or_default().push(k);
        }
        Engine {
            s,
            names: s.targets.iter().map(|t| t.name.clone()).collect(),
            contracts: contracts(s),
            contracts_len: contracts(s)
                .iter()
                .map(|(n, c)| json_len(c) + HOSTS_KEY.len() as u64 + n.len() as u64)
                .sum(),
            groups: groups.values().cloned().collect(),
            nqn_len: groups.keys().map(|n| key_len(n)).collect(),
            at,
            history,
            held,
            books,
            seq: 0,
            books_behind: false,
            reports: BTreeMap::new(),
            pending: VecDeque::new(),
            applied: vec![vec![None; s.hosts.len()]; n],
            written: None,
            run: ClusterRun {
                periods: Vec::new(),
                shares: Vec::new(),
                etcd: EtcdLoad::new(n),
                division_times: Vec::new(),
                division_cpu: Vec::new(),
                limit_share_excess: 0,
            },
        }
    }

    /// The leader's interval: divide, count the write if the division changed, and
    /// queue it for the targets.
    fn divide(&mut self, p: u32, members: &[String]) {
        // Timed as the agent times it (wall, and the thread's CPU).
        let (division, wall, cpu) = nvmf_qos_agent::cpu::timed(|| {
            plan(
                &self.contracts,
                members,
                &self.reports,
                &self.s.divide_config(),
            )
        });
        self.run.division_times.push(wall);
        self.run.division_cpu.extend(cpu);
        let leader = self.leader(p);
        let member_ix: Vec<usize> = (0..self.names.len())
            .filter(|&i| members.contains(&self.names[i]))
            .collect();
        let leader_name = self.names[leader].clone();
        self.run
            .etcd
            .leader_interval(leader, &leader_name, &member_ix, self.contracts_len);
        let changed = self
            .written
            .as_ref()
            .is_none_or(|(m, old, l)| m != members || *old != division || *l != leader);
        let dense = self.densify(&division);
        self.run.limit_share_excess += self.limit_excess(&dense, members.len() as u64);
        let mut division_writes = 0;
        if changed {
            let name = self.names[leader].clone();
            let leader = self.leader(p);
            // A new leader writes every part (so does one back from an outage: it
            // forgot what it wrote); then only the parts that changed.
            let fresh = self.written.as_ref().is_none_or(|(_, _, l)| *l != leader);
            let maps: Vec<(&str, u64)> = (0..self.names.len())
                .filter(|&i| members.contains(&self.names[i]))
                .filter(|&i| {
                    let t = &self.names[i];
                    fresh
                        || self
                            .written
                            .as_ref()
                            .is_none_or(|(_, old, _)| old.get(t) != division.get(t))
                })
                .map(|i| {
                    // The part lists the hosts with a path there (key schema 3).
                    let part = division.get(&self.names[i]).expect("a member's part");
                    (
                        self.names[i].as_str(),
                        shares_map_len(part.iter().map(|(n, s)| (n.as_str(), s))),
                    )
                })
                .collect();
            division_writes = self
                .run
                .etcd
                .shares_written((leader, &name), members, &maps);
            self.written = Some((members.to_vec(), division, leader));
        }
        let overrun = self.leader_calls(division_writes);
        if self.run.division_times.len() == 1 {
            // The run starts with the cluster already divided: the targets hold the
            // first division from the start (with no shares they would limit nobody).
            self.apply(dense.clone());
        }
        self.pending
            .push_back((p + self.s.cluster.apply_delay_periods + overrun, dense));
        while self.pending.front().is_some_and(|(at, _)| *at <= p) {
            let d = self.pending.pop_front().expect("checked").1;
            self.apply(d);
        }
    }

    /// The leader's calls to etcd this interval, timed by `[cluster] etcd_read_ms` and
    /// `etcd_write_ms` (its reads, its own writes and `division_writes`): the whole
    /// intervals they overrun, by which its division lands later. The model keeps the
    /// leader dividing every period; the agent's next interval would start late.
    fn leader_calls(&mut self, division_writes: u64) -> u32 {
        let c = &self.s.cluster;
        let ms = LEADER_READS as f64 * c.etcd_read_ms
            + (AGENT_WRITES + division_writes) as f64 * c.etcd_write_ms;
        let overrun = (ms / c.interval_ms as f64).floor() as u32;
        let e = &mut self.run.etcd;
        e.leader_calls_ms.push(ms);
        if overrun > 0 {
            e.overrun_divisions += 1;
            e.overrun_intervals += overrun as u64;
        }
        overrun
    }

    /// The targets apply a division; their handover books start over from it.
    fn apply(&mut self, dense: Dense) {
        let changed: Vec<bool> = self
            .applied
            .iter()
            .zip(&dense)
            .map(|(a, b)| a != b)
            .collect();
        self.applied = dense;
        self.run.etcd.applied_changed(&changed);
        self.seq += 1;
        self.books_behind = true;
    }

    /// The books start from the division the targets hold.
    fn rebase_books(&mut self) {
        let Some(books) = &mut self.books else {
            return;
        };
        self.books_behind = false;
        for (i, book) in books.iter_mut().enumerate() {
            let mine: BTreeMap<String, LocalShare> = self
                .groups
                .iter()
                .filter_map(|g| Some((self.s.hosts[g[0]].nqn.clone(), self.applied[i][g[0]]?)))
                .collect();
            book.rebase(self.seq, &mine);
        }
    }

    /// With etcd away and `handover`: each live target trades from what its hosts did
    /// (as its report would say) and its peers' reports of the period before.
    fn trade(&mut self, alive: &[bool], members: u64) {
        if self.books_behind {
            self.rebase_books();
        }
        // Out of `self` while they trade: each step reads what the target's hosts did.
        let Some(mut books) = self.books.take() else {
            return;
        };
        let reports: Vec<HandoverReport> = books
            .iter()
            .zip(alive)
            .filter(|(_, a)| **a)
            .map(|(b, _)| b.report())
            .collect();
        let cfg = HandoverConfig {
            headroom_milli: self.s.cluster.headroom_milli,
            ..HandoverConfig::default()
        };
        for i in (0..books.len()).filter(|&i| alive[i]) {
            let demand = self.demand_at(i);
            books[i].observe(&demand);
            let step = books[i].step(&demand, &reports, &self.contracts, &cfg);
            books[i].commit(&step, |_| true);
            for g in &self.groups {
                if let Some(share) = step.shares.get(&self.s.hosts[g[0]].nqn) {
                    for &k in g {
                        self.applied[i][k] = Some(*share);
                    }
                }
            }
        }
        self.books = Some(books);
        self.run.etcd.applied_changed(alive);
        self.run.limit_share_excess += self.limit_excess(&self.applied, members);
    }

    /// The leader: the first live target.
    fn leader(&self, p: u32) -> usize {
        (0..self.names.len())
            .find(|&i| self.s.targets[i].fail_at.is_none_or(|f| p < f))
            .unwrap_or(0)
    }

    /// The division as `[target][host]`, as the agents apply it: a member's map holds
    /// the hosts with a path there, every other contract holds its cold share there
    /// (`qos_core::cluster::cold_share`).
    fn densify(&self, division: &Plan) -> Dense {
        let mut dense = vec![vec![None; self.s.hosts.len()]; self.names.len()];
        for (i, name) in self.names.iter().enumerate() {
            let Some(m) = division.get(name) else {
                continue;
            };
            for ((nqn, c), g) in self.contracts.iter().zip(&self.groups) {
                let share = m.get(nqn).copied().unwrap_or_else(|| cold_share(c));
                for &k in g {
                    dense[i][k] = Some(share);
                }
            }
        }
        dense
    }

    /// The hosts whose limit shares in `dense` add up to more than their limit plus one
    /// per member.
    fn limit_excess(&self, dense: &Dense, members: u64) -> usize {
        self.groups
            .iter()
            .filter(|g| {
                // The contract of an NQN given twice is the last one's.
                let k = *g.last().expect("a group has a host");
                self.s.hosts[k].limit_iops.is_some_and(|limit| {
                    let sum: u64 = dense.iter().filter_map(|d| d[k]?.limit_iops).sum();
                    sum > limit + members
                })
            })
            .count()
    }

    /// Target `i` serves period `p`; returns what each of its hosts wanted and got.
    fn serve_target(&mut self, i: usize, wants: &[Vec<u64>]) -> Vec<(usize, u64, u64)> {
        let hs = &self.at[i];
        let w: Vec<u64> = hs.iter().map(|&k| wants[k][i]).collect();
        let shares: Vec<Option<LocalShare>> = hs.iter().map(|&k| self.applied[i][k]).collect();
        let served = serve(self.s.targets[i].capacity_iops, &w, &shares);
        let window = self.s.cluster.demand_window_periods as usize;
        for (j, &got) in served.iter().enumerate() {
            self.held[i][j] = got < w[j];
            let ring = &mut self.history[i][j];
            ring.push_back(got);
            if ring.len() > window {
                ring.pop_front();
            }
        }
        hs.iter()
            .zip(w)
            .zip(served)
            .map(|((&k, w), got)| (k, w, got))
            .collect()
    }

    /// Target `i` writes its demand report: each host's mean over the demand window,
    /// held if it got less than it wanted in the last period.
    /// Returns whether it differs from its last one.
    fn report(&mut self, i: usize) -> bool {
        let demand = self.demand_at(i);
        let old = self.reports.insert(self.names[i].clone(), demand);
        old.as_ref() != self.reports.get(&self.names[i])
    }

    /// What target `i`'s hosts did, as its agent measures it: each host's mean over the
    /// demand window, held if it got less than it wanted in the last period.
    fn demand_at(&self, i: usize) -> BTreeMap<String, PathDemand> {
        self.at[i]
            .iter()
            .enumerate()
            .map(|(j, &k)| {
                let ring = &self.history[i][j];
                let d = PathDemand {
                    served: ring.iter().sum::<u64>() / ring.len().max(1) as u64,
                    backlogged: self.held[i][j],
                    ..Default::default()
                };
                (self.s.hosts[k].nqn.clone(), d)
            })
            .collect()
    }

    fn period(&mut self, p: u32) {
        let s = self.s;
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
        let etcd_up = s.cluster.etcd_up(p);
        if etcd_up {
            self.run.etcd.intervals += 1;
            // After an outage the leader divides from its second interval on (as the
            // agents do): the targets write their reports in the first.
            if p == 0 || s.cluster.etcd_up(p - 1) {
                self.divide(p, &members);
            }
            // A dead target's last report stays in etcd under its lease, as its shares do.
            let names = &self.names;
            self.reports.retain(|t, _| {
                members.contains(t) && !alive[names.iter().position(|n| n == t).expect("known")]
            });
        } else {
            // The leader's agent forgets what it wrote (it writes anew, every part,
            // when etcd is back).
            self.written = None;
            self.trade(&alive, members.len() as u64);
        }
        let n = s.targets.len();
        let wants: Vec<Vec<u64>> = s.hosts.iter().map(|h| wanted_at(h, n, p, &alive)).collect();
        let mut row = vec![HostPeriod::default(); s.hosts.len()];
        for i in (0..n).filter(|&i| alive[i]) {
            let served = self.serve_target(i, &wants);
            for &(k, w, got) in &served {
                row[k].wanted += w;
                row[k].served += got;
            }
            if etcd_up {
                let changed = self.report(i);
                let rep = &self.reports[&self.names[i]];
                // The agent's demand record lists the hosts on a path at its target.
                let rep: BTreeMap<String, PathDemand> = rep
                    .iter()
                    .filter(|(_, d)| on_path(d))
                    .map(|(n, d)| (n.clone(), *d))
                    .collect();
                let (groups, lens, row) = (&self.groups, &self.nqn_len, &self.applied[i]);
                let contracts = &self.contracts;
                let applied = || applied_len(groups, lens, contracts, row);
                self.run
                    .etcd
                    .agent_interval(i, &self.names[i], s, (&rep, changed), applied);
            }
        }
        self.run.periods.push(row);
        if n * s.hosts.len() <= KEEP_SHARES_UP_TO {
            self.run.shares.push(self.applied.clone());
        }
    }
}

/// The JSON length of a target's member record's `applied` map (NQN -> share): the
/// shares its `row` holds, in NQN order (`groups`, each NQN's JSON length in
/// `nqn_len`), but the cold shares (`qos_core::cluster::cold_share` of each contract),
/// which the real agent leaves out (key schema 3), as it leaves them out of its part.
fn applied_len(
    groups: &[Vec<usize>],
    nqn_len: &[u64],
    contracts: &BTreeMap<String, ClusterHost>,
    row: &[Option<LocalShare>],
) -> u64 {
    let (mut n, mut count) = (2u64, 0u64);
    for ((g, len), c) in groups.iter().zip(nqn_len).zip(contracts.values()) {
        if let Some(s) = &row[g[0]]
            && *s != cold_share(c)
        {
            n += len + 1 + share_len(s);
            count += 1;
        }
    }
    n + count.saturating_sub(1)
}

/// The hosts' cluster-wide contracts, as the operator set them.
pub(super) fn contracts(s: &ClusterScenario) -> BTreeMap<String, ClusterHost> {
    s.hosts
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
        .collect()
}

/// Runs the scenario.
pub fn simulate(s: &ClusterScenario) -> ClusterRun {
    simulate_with_progress(s, &mut |_| {})
}

/// Runs the scenario, calling `progress` after each period.
pub fn simulate_with_progress(s: &ClusterScenario, progress: &mut dyn FnMut(u32)) -> ClusterRun {
    let mut e = Engine::new(s);
    for p in 0..s.cluster.periods {
        e.period(p);
        progress(p);
    }
    e.run
}
