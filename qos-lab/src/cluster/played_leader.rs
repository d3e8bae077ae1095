//! The leader agent's CPU per interval, played (issue 42, item 4): the agent's own
//! interval (`nvmf_qos_agent::agent::Agent::tick` and its metrics' record of it, with
//! the agent's etcd and target clients) run in the lab as the first target's agent of
//! the scenario's fleet, against a real etcd the lab starts, a stand-in target on a
//! Unix socket, and the other targets' agents played into that etcd
//! (`nvmf_qos_agent::played`: each interval, what each would write and read, the
//! scenario's demand as its targets would report it). Both keep the scenario's
//! interval in real time, as the agent and the scale test's load generator do, so the
//! agent's reads meet etcd while the others write. Measured: the calling thread's CPU
//! time of each interval once the agent leads and has set every host at its target,
//! and by the interval's phases.
//!
//! Where [`super::agent_cpu`] adds up per-byte costs measured on the agent's libraries,
//! this runs the agent's code on the scenario's records: what the per-byte model leaves
//! out (the allocator's state across an interval, caches shared with etcd and the load)
//! is counted as it comes. Not played: target failures and etcd outages (the scenario's
//! demand moves only), the target's own CPU, the agent's log line.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use nvmf_qos_agent::admin;
use nvmf_qos_agent::agent::{Agent, AgentConfig, TickReport};
use nvmf_qos_agent::cpu::thread_cpu_ns;
use nvmf_qos_agent::keys::Keys;
use nvmf_qos_agent::metrics::AgentStatus;
use nvmf_qos_agent::peers::HttpPeers;
use nvmf_qos_agent::played::{Generator, PlayedFleet, StubTarget};
use nvmf_qos_agent::store::{EtcdGateway, StoreError};
use nvmf_qos_agent::target::SocketTarget;
use thiserror::Error;

use super::ClusterScenario;
use super::agent_cpu::{RealEtcd, etcd_binary};
use super::engine::{contracts, wanted_at};

/// Why the leader could not be played.
#[derive(Debug, Error)]
pub enum PlayLeaderError {
    #[error(
        "no etcd binary (Debian's etcd-server: apt-get install etcd-server; or NVMF_QOS_LAB_ETCD=PATH)"
    )]
    NoEtcd,
    #[error("etcd ({0}) did not answer within 20 s of its start")]
    EtcdDidNotStart(String),
    #[error("the stand-in target's socket: {0}")]
    StandIn(#[from] std::io::Error),
    #[error("creating the cluster in etcd: {0}")]
    Create(#[from] nvmf_qos_agent::admin::AdminError),
    #[error("putting the hosts' contracts into etcd: {0}")]
    Contracts(#[from] StoreError),
    #[error("the played agent did not lead and apply a division within {0} intervals: {1}")]
    NoLead(u32, String),
    #[error("the scenario has {0} targets: a leader needs another to play")]
    TooFewTargets(usize),
}

/// What the played leader measured.
#[derive(Debug, Clone, Default)]
pub struct PlayedLeader {
    /// The calling thread's CPU per measured interval, milliseconds.
    pub cpu_ms: Vec<f64>,
    /// Per phase of the interval (the agent's own names), mean milliseconds of CPU.
    pub phases: Vec<(&'static str, f64)>,
    /// Intervals before the measured ones: until it led and applied a division.
    pub warmup: u32,
    /// Intervals of the measured ones in which it wrote a division.
    pub divisions: u32,
    /// Errors its intervals reported (none expected).
    pub errors: Vec<String>,
    /// Hosts the leader's stand-in target held at the end.
    pub hosts_at_target: usize,
    /// The played agents' calls etcd did not answer in time, and leases that lapsed.
    pub played_failed: u64,
    pub played_lapsed: u64,
}

impl PlayedLeader {
    pub fn mean_ms(&self) -> f64 {
        self.cpu_ms.iter().sum::<f64>() / self.cpu_ms.len().max(1) as f64
    }
}

/// The scenario's fleet as the played agents report it, its hosts in the scenario's
/// order (the order [`set_wants`] gives their wants in).
fn played_fleet(s: &ClusterScenario) -> PlayedFleet {
    let targets = s
        .targets
        .iter()
        .map(|t| (t.name.clone(), t.capacity_iops))
        .collect();
    let mut contracts = contracts(s);
    let hosts = s
        .hosts
        .iter()
        .filter_map(|h| contracts.remove_entry(&h.nqn))
        .collect();
    PlayedFleet::new(targets, hosts, s.cluster.interval_ms)
}

/// The hosts' wants in period `p` (every target alive).
fn set_wants(fleet: &mut PlayedFleet, s: &ClusterScenario, p: u32) {
    let alive = vec![true; s.targets.len()];
    for (h, w) in s.hosts.iter().zip(fleet.wants.iter_mut()) {
        *w = wanted_at(h, s.targets.len(), p, &alive)
            .into_iter()
            .enumerate()
            .filter(|(_, iops)| *iops > 0)
            .collect();
    }
}

/// The played agent with what it talks to, and its metrics' state (as the agent's main
/// loop keeps them).
struct Leader {
    agent: Agent,
    status: AgentStatus,
    etcd: EtcdGateway,
    tgt: SocketTarget,
    /// Never read: the agent reads its peers only while etcd is away and with a
    /// handover URL of its own, and the played one has neither.
    peers: HttpPeers,
    started: Instant,
}

impl Leader {
    /// One interval as the agent's main loop runs it (its log line aside), and the
    /// calling thread's CPU time in it, milliseconds (`None` where the kernel does not
    /// give it).
    fn interval(&mut self) -> (TickReport, Option<f64>) {
        let now_ms = self.started.elapsed().as_millis() as u64;
        let c0 = thread_cpu_ns();
        let r = self
            .agent
            .tick(now_ms, &mut self.etcd, &mut self.tgt, &mut self.peers);
        let now = (Instant::now(), std::time::SystemTime::now());
        self.status
            .record(&r, self.agent.holds_lease(), now.0, now.1);
        self.status.set_handover(&self.agent.handover_report());
        let c1 = thread_cpu_ns();
        let ms = c0.zip(c1).map(|(a, b)| b.saturating_sub(a) as f64 / 1e6);
        (r, ms)
    }
}

/// Sleeps until `next`, then moves it on by `interval`.
fn wait(next: &mut Instant, interval: Duration) {
    *next += interval;
    if let Some(wait) = next.checked_duration_since(Instant::now()) {
        std::thread::sleep(wait);
    }
}

/// Intervals at most until the agent leads (before the load), and until it has set its
/// hosts (with the load).
const WARMUP_AT_MOST: u32 = 30;

/// Plays the first target's agent as the fleet's leader for `intervals` measured
/// intervals (after a warm-up of at most 30 intervals until it leads, and 60 until it
/// has set its hosts), `progress` told of each measured interval.
pub fn play_leader(
    s: &ClusterScenario,
    intervals: u32,
    progress: &mut dyn FnMut(u32, u32),
) -> Result<PlayedLeader, PlayLeaderError> {
    if s.targets.len() < 2 {
        return Err(PlayLeaderError::TooFewTargets(s.targets.len()));
    }
    let bin = etcd_binary().ok_or(PlayLeaderError::NoEtcd)?;
    let etcd = RealEtcd::start(&bin)
        .ok_or_else(|| PlayLeaderError::EtcdDidNotStart(bin.display().to_string()))?;
    let cluster = "lab";
    let keys = Keys::new(cluster);
    let interval = Duration::from_millis(s.cluster.interval_ms.max(1));
    let lease_ttl_s = (s.cluster.interval_ms * u64::from(s.cluster.lease_periods))
        .div_ceil(1000)
        .max(1);
    let mut fleet = played_fleet(s);
    let mut g = EtcdGateway::new(&etcd.url, Duration::from_secs(5));
    admin::cluster_create(&mut g, cluster, s.divide_config(), false)?;
    fleet.put_contracts(&mut g, &keys)?;
    let stub = StubTarget::start(s.targets[0].capacity_iops, s.cluster.interval_ms)?;
    let cfg = AgentConfig {
        cluster: cluster.into(),
        target: s.targets[0].name.clone(),
        domain: fleet.domain.clone(),
        lease_ttl_s,
        window_ms: Some(s.cluster.interval_ms * u64::from(s.cluster.demand_window_periods.max(1))),
        handover_url: None,
    };
    let mut leader = Leader {
        status: AgentStatus::new(&cfg),
        agent: Agent::new(cfg),
        etcd: g,
        tgt: SocketTarget::new(stub.sock.clone(), Duration::from_secs(5)),
        peers: HttpPeers {
            timeout: Duration::from_secs(1),
        },
        started: Instant::now(),
    };
    let mut load = Generator::new(&keys, &etcd.url, 1..s.targets.len(), lease_ttl_s);
    set_wants(&mut fleet, s, 0);
    let played = take_the_lead(&mut leader, interval).and_then(|k| {
        play(
            &mut leader,
            &mut load,
            &mut fleet,
            s,
            k,
            intervals,
            progress,
        )
    });
    let _ = leader.agent.leave(&mut leader.etcd);
    let mut out = played?;
    out.played_failed = load.sum(|p| p.failed);
    out.played_lapsed = load.sum(|p| p.lapsed);
    out.hosts_at_target = leader
        .tgt
        .call("qos_host_get", serde_json::json!({"domain": fleet.domain}))
        .ok()
        .and_then(|v| v.as_array().map(Vec::len))
        .unwrap_or(0);
    Ok(out)
}

/// The agent takes the leader key before the others are played (they try it every
/// interval, as real agents do), as in the scale test, where it starts first. Returns
/// the intervals it took.
fn take_the_lead(leader: &mut Leader, interval: Duration) -> Result<u32, PlayLeaderError> {
    let mut next = Instant::now();
    let mut k = 0;
    loop {
        let (r, _) = leader.interval();
        k += 1;
        if r.leader {
            return Ok(k);
        }
        if k == WARMUP_AT_MOST {
            return Err(PlayLeaderError::NoLead(k, format!("errors {:?}", r.errors)));
        }
        wait(&mut next, interval);
    }
}

/// The leader's intervals beside the load: the warm-up until it has set every host,
/// then the measured ones. The load keeps its own interval in a thread of its own, as
/// the other agents do on their machines.
fn play(
    leader: &mut Leader,
    load: &mut Generator,
    fleet: &mut PlayedFleet,
    s: &ClusterScenario,
    mut k: u32,
    intervals: u32,
    progress: &mut dyn FnMut(u32, u32),
) -> Result<PlayedLeader, PlayLeaderError> {
    let interval = Duration::from_millis(s.cluster.interval_ms.max(1));
    let stop = AtomicBool::new(false);
    let mut out = PlayedLeader::default();
    let mut phase_ms: Vec<(&'static str, f64)> = Vec::new();
    std::thread::scope(|sc| {
        sc.spawn(|| {
            let mut next = Instant::now();
            let mut p = 0;
            while !stop.load(Ordering::Relaxed) {
                set_wants(fleet, s, p.min(s.cluster.periods.saturating_sub(1)));
                load.interval(fleet);
                p += 1;
                wait(&mut next, interval);
            }
        });
        let outcome = (|| {
            let mut next = Instant::now();
            let (mut set, mut measured) = (0u64, 0u32);
            loop {
                let (r, cpu_ms) = leader.interval();
                set += r.set as u64;
                k += 1;
                if out.warmup == 0 {
                    if r.leader && set >= s.hosts.len() as u64 && k >= 5 {
                        out.warmup = k;
                    } else if k >= 2 * WARMUP_AT_MOST {
                        let why = format!(
                            "leader {}, shares set {set}, errors {:?}",
                            r.leader, r.errors
                        );
                        return Err(PlayLeaderError::NoLead(k, why));
                    }
                } else {
                    out.cpu_ms.extend(cpu_ms);
                    for p in &r.phases {
                        let ms = p.cpu.unwrap_or(p.wall).as_secs_f64() * 1000.0;
                        match phase_ms.iter_mut().find(|(w, _)| *w == p.what) {
                            Some((_, sum)) => *sum += ms,
                            None => phase_ms.push((p.what, ms)),
                        }
                    }
                    out.divisions += u32::from(r.division_written.is_some());
                    out.errors.extend(r.errors.iter().cloned());
                    // Counted apart from the CPU times: where the kernel gives none,
                    // the run still ends (with no figure).
                    measured += 1;
                    progress(measured, intervals);
                    if measured >= intervals {
                        return Ok(());
                    }
                }
                wait(&mut next, interval);
            }
        })();
        stop.store(true, Ordering::Relaxed);
        outcome
    })?;
    // The phases were summed over every measured interval, with or without a CPU time.
    let n = intervals.max(1) as f64;
    out.phases = phase_ms.into_iter().map(|(w, ms)| (w, ms / n)).collect();
    Ok(out)
}

/// The played leader's line: mean CPU per measured interval, its median and range, by
/// phase, and what the run was.
pub fn played_leader_line(p: &PlayedLeader) -> String {
    let mut sorted = p.cpu_ms.clone();
    sorted.sort_by(f64::total_cmp);
    let median = sorted.get(sorted.len() / 2).copied().unwrap_or(0.0);
    let phases: Vec<String> = p
        .phases
        .iter()
        .map(|(w, ms)| format!("{w} {ms:.2}"))
        .collect();
    format!(
        "leader agent's CPU per interval (played: the agent's interval against a real etcd, a stand-in target and the other agents played; measured on this machine, not deterministic): {:.1} ms (mean of {} intervals after {} of warm-up; median {median:.1}, from {:.1} to {:.1}); by phase {}; {} divisions written, {} hosts at its target, errors {}; the played agents: {} calls unanswered, {} leases lapsed",
        p.mean_ms(),
        p.cpu_ms.len(),
        p.warmup,
        sorted.first().copied().unwrap_or(0.0),
        sorted.last().copied().unwrap_or(0.0),
        phases.join(", "),
        p.divisions,
        p.hosts_at_target,
        p.errors.len(),
        p.played_failed,
        p.played_lapsed,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The fleet tests' 4 targets and 200 hosts, at 200 ms intervals: the agent's
    /// interval played over a few seconds.
    fn small() -> String {
        super::super::fleet::tests::SMALL.replace("[fleet]", "interval_ms = 200\n[fleet]")
    }

    #[test]
    fn the_played_leader_leads_applies_and_counts_each_interval() {
        let s = ClusterScenario::parse(&small(), "t").unwrap();
        if etcd_binary().is_none() {
            println!("SKIPPED: the played leader: no etcd binary (apt-get install etcd-server)");
            return;
        }
        let mut told = Vec::new();
        let p = play_leader(&s, 4, &mut |k, of| told.push((k, of))).expect("played");
        assert_eq!(told, [(1, 4), (2, 4), (3, 4), (4, 4)]);
        assert_eq!(p.cpu_ms.len(), 4);
        assert!(p.cpu_ms.iter().all(|&ms| ms > 0.0), "{:?}", p.cpu_ms);
        assert!(p.warmup >= 5);
        assert_eq!(p.errors, Vec::<String>::new());
        // Every host of the cluster holds at least its cold share at the leader's target.
        assert_eq!(p.hosts_at_target, 200);
        let names: Vec<&str> = p.phases.iter().map(|(w, _)| *w).collect();
        for phase in ["target", "report", "plan", "apply"] {
            assert!(names.contains(&phase), "{names:?}");
        }
        let line = played_leader_line(&p);
        assert!(
            line.starts_with("leader agent's CPU per interval (played: "),
            "{line}"
        );
    }

    #[test]
    fn a_fleet_of_one_target_has_no_leader_to_play() {
        let mut s = ClusterScenario::parse(&small(), "t").unwrap();
        s.targets.truncate(1);
        let e = play_leader(&s, 1, &mut |_, _| {}).unwrap_err();
        assert!(matches!(e, PlayLeaderError::TooFewTargets(1)), "{e}");
    }
}
