//! What the agent tests share: stub targets (each serves a host what it wants there, up
//! to the limit share it holds) and a two-target cluster of agents over any [`Store`],
//! moved one interval at a time, each reading the others' handover reports as they were
//! at the end of the last interval.
#![allow(dead_code)]

use std::collections::BTreeMap;

use nvmf_qos_agent::admin;
use nvmf_qos_agent::agent::{Agent, AgentConfig, TickReport};
use nvmf_qos_agent::peers::Peers;
use nvmf_qos_agent::store::Store;
use nvmf_qos_agent::target::{HostCounters, LocalState, TargetError, TargetRpc};
use qos_core::cluster::{ClusterHost, DivideConfig, LocalShare};
use qos_core::handover::HandoverReport;

pub const NQN: &str = "nqn.2014-08.org.nvmexpress:uuid:host-x";

/// The agents' interval (the stub targets' period is 500 ms: the demand window is one
/// interval).
pub const INTERVAL_MS: u64 = 250;

/// A target that serves each host `min(want, limit share)`: its counters move by that
/// rate over each interval, with five commands held all interval when it wanted more.
#[derive(Debug, Default)]
pub struct StubTarget {
    pub alive: bool,
    pub want: BTreeMap<String, u64>,
    pub settings: BTreeMap<String, LocalShare>,
    counters: BTreeMap<String, HostCounters>,
    sets: usize,
}

impl StubTarget {
    pub fn served(&self, nqn: &str) -> u64 {
        let want = self.want.get(nqn).copied().unwrap_or(0);
        let lim = self
            .settings
            .get(nqn)
            .and_then(|s| s.limit_iops)
            .unwrap_or(u64::MAX);
        want.min(lim)
    }
}

impl TargetRpc for StubTarget {
    fn read(&mut self, _domain: &str) -> Result<LocalState, TargetError> {
        if !self.alive {
            return Err(TargetError::Unreachable {
                sock: "stub".into(),
                detail: "killed".into(),
            });
        }
        // Each read ends one interval of service at the current settings.
        let nqns: Vec<String> = self.want.keys().cloned().collect();
        for n in nqns {
            let (want, served) = (self.want[&n], self.served(&n));
            let c = self.counters.entry(n).or_default();
            c.completed_ops += served * INTERVAL_MS / 1000;
            // Held: five commands waiting all interval long.
            c.held_ns += if want > served {
                5 * INTERVAL_MS * 1_000_000
            } else {
                0
            };
        }
        Ok(LocalState {
            capacity_iops: 100_000,
            period_ms: 500,
            counters: self.counters.clone(),
            settings: self.settings.clone(),
        })
    }
    fn host_set(&mut self, _d: &str, nqn: &str, share: &LocalShare) -> Result<(), TargetError> {
        self.settings.insert(nqn.into(), *share);
        self.sets += 1;
        Ok(())
    }
    fn host_remove(&mut self, _d: &str, nqn: &str) -> Result<(), TargetError> {
        self.settings.remove(nqn);
        Ok(())
    }
}

/// The agents' handover reports by URL (`mem://a`); a peer not in it is unreachable.
#[derive(Debug, Default)]
pub struct MemPeers(pub BTreeMap<String, HandoverReport>);

impl Peers for MemPeers {
    fn fetch(&mut self, url: &str) -> Result<HandoverReport, String> {
        self.0
            .get(url)
            .cloned()
            .ok_or_else(|| format!("{url}: unreachable"))
    }
}

pub struct Cluster<S: Store> {
    pub store: S,
    pub agents: Vec<Agent>,
    pub targets: Vec<StubTarget>,
    /// Lets an interval pass: moves a memory store's clock, or sleeps.
    pub pass: fn(&mut S, u64),
    /// The agents' clock.
    pub now_ms: u64,
}

impl<S: Store> Cluster<S> {
    /// Two agents; `handover`: each serves its handover report (`--listen`), so the
    /// two trade while etcd is away.
    pub fn new(
        mut store: S,
        pass: fn(&mut S, u64),
        reservation: u64,
        limit: u64,
        handover: bool,
    ) -> Cluster<S> {
        admin::cluster_create(&mut store, "c1", DivideConfig::default(), false).unwrap();
        let mut agents: Vec<Agent> = ["a", "b"]
            .iter()
            .map(|t| {
                Agent::new(AgentConfig {
                    cluster: "c1".into(),
                    target: t.to_string(),
                    domain: "d".into(),
                    lease_ttl_s: 2,
                    window_ms: None,
                    handover_url: handover.then(|| format!("mem://{t}")),
                })
            })
            .collect();
        let mut targets: Vec<StubTarget> = (0..2)
            .map(|_| StubTarget {
                alive: true,
                ..Default::default()
            })
            .collect();
        let host = ClusterHost {
            reservation_iops: reservation,
            limit_iops: Some(limit),
            weight: 1,
            ..Default::default()
        };
        let e = admin::host_set(&mut store, "c1", NQN, host.clone()).unwrap_err();
        assert!(
            e.to_string().contains("start the targets' agents first"),
            "{e}"
        );
        // The targets join (capacity estimates published), then the host is admitted.
        for (a, t) in agents.iter_mut().zip(&mut targets) {
            a.tick(0, &mut store, t, &mut MemPeers::default());
        }
        admin::host_set(&mut store, "c1", NQN, host).unwrap();
        Cluster {
            store,
            agents,
            targets,
            pass,
            now_ms: 0,
        }
    }

    pub fn want(&mut self, a: u64, b: u64) {
        self.targets[0].want.insert(NQN.into(), a);
        self.targets[1].want.insert(NQN.into(), b);
    }

    /// One interval: the clock moves, then every agent ticks; what each did.
    pub fn interval(&mut self) -> Vec<TickReport> {
        self.pass_interval();
        let mut peers = self.reports();
        (0..self.agents.len())
            .map(|i| self.tick_one(i, &mut peers))
            .collect()
    }

    /// Moves the clock by one interval.
    pub fn pass_interval(&mut self) {
        (self.pass)(&mut self.store, INTERVAL_MS);
        self.now_ms += INTERVAL_MS;
    }

    /// The agents' handover reports as they stand now.
    pub fn reports(&self) -> MemPeers {
        MemPeers(
            self.agents
                .iter()
                .filter_map(|a| Some((a.config().handover_url.clone()?, a.handover_report())))
                .collect(),
        )
    }

    /// Agent `i`'s tick within the current interval, reading `peers`.
    pub fn tick_one(&mut self, i: usize, peers: &mut MemPeers) -> TickReport {
        self.agents[i].tick(self.now_ms, &mut self.store, &mut self.targets[i], peers)
    }

    pub fn reservation_shares(&self) -> Vec<u64> {
        self.targets
            .iter()
            .map(|t| t.settings.get(NQN).map_or(0, |s| s.reservation_iops))
            .collect()
    }

    pub fn limit_shares(&self) -> Vec<u64> {
        self.targets
            .iter()
            .map(|t| t.settings.get(NQN).and_then(|s| s.limit_iops).unwrap_or(0))
            .collect()
    }

    pub fn served(&self) -> u64 {
        self.targets.iter().map(|t| t.served(NQN)).sum()
    }
}
