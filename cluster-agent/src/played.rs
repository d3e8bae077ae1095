//! The other targets' agents, played: a load generator that writes to etcd, each
//! interval, what the agents of a fleet's other targets would write (member record,
//! demand record, lease keep-alive, the attempt at the leader key) and reads what they
//! would read (the division's head, their part when it changed), and a stand-in for a
//! target's JSON-RPC socket. For sizing a leader without a fleet:
//! `cluster-agent/tests/scale.rs` runs the real agent beside them, and `qos-lab cluster
//! FILE --play-leader N` runs the agent's interval beside them (docs/cluster.md).

use std::collections::BTreeMap;
use std::io::{BufReader, Write};
use std::os::unix::net::UnixListener;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use qos_core::cluster::{ClusterHost, LocalShare, PathDemand, cold_share};
use serde_json::{Value, json};

use crate::keys::{DemandRecord, DivisionRecord, Keys, MemberRecord, PartRecord, parse};
use crate::store::{EtcdGateway, LeaseId, Store};

/// The fleet the played agents report: its targets, its hosts' contracts, and what
/// each host wants at each target now (the caller moves it between intervals).
#[derive(Debug, Clone)]
pub struct PlayedFleet {
    /// Each target's name and capacity (IOPS), in the order the wants name them.
    pub targets: Vec<(String, u64)>,
    /// Each host's NQN and contract.
    pub hosts: Vec<(String, ClusterHost)>,
    /// Per host: the targets it wants something at, and how much (IOPS).
    pub wants: Vec<Vec<(usize, u64)>>,
    /// The agents' interval and the targets' QoS period, milliseconds.
    pub period_ms: u64,
    /// The domain that holds the cluster's hosts at every target.
    pub domain: String,
    /// Per host NQN: its cold share (where it has no path).
    cold: BTreeMap<String, LocalShare>,
}

impl PlayedFleet {
    /// A fleet whose hosts want nothing yet.
    pub fn new(
        targets: Vec<(String, u64)>,
        hosts: Vec<(String, ClusterHost)>,
        period_ms: u64,
    ) -> PlayedFleet {
        let cold = hosts
            .iter()
            .map(|(n, c)| (n.clone(), cold_share(c)))
            .collect();
        PlayedFleet {
            wants: vec![Vec::new(); hosts.len()],
            targets,
            hosts,
            period_ms,
            domain: "d".into(),
            cold,
        }
    }

    /// The hosts' contracts, put into the cluster's keys (as `host set` does), a
    /// transaction of 100 at a time (etcd takes at most 128 operations in one).
    pub fn put_contracts(
        &self,
        store: &mut dyn Store,
        keys: &Keys,
    ) -> Result<(), crate::store::StoreError> {
        let puts: Vec<(String, String)> = self
            .hosts
            .iter()
            .map(|(n, c)| (keys.host(n), serde_json::to_string(c).expect("json")))
            .collect();
        puts.chunks(100).try_for_each(|c| store.put_all(c))
    }

    /// What target `t` reports of each host that wants something there (the real
    /// agent leaves the idle ones out of its record) with the `shares` it applied
    /// (`None`: no division read yet, the hosts not configured and unlimited): served
    /// what it wants there up to its limit share, held (backlogged, 5 commands waiting)
    /// when it wants more. A host a division's part leaves out holds its cold share
    /// (limit 1), as at a real agent's target.
    pub fn demand_at(
        &self,
        t: usize,
        shares: Option<&BTreeMap<String, LocalShare>>,
    ) -> BTreeMap<String, PathDemand> {
        self.hosts
            .iter()
            .zip(&self.wants)
            .filter_map(|((nqn, _), wants)| {
                let want = wants.iter().find(|(at, _)| *at == t).map(|w| w.1)?;
                (want > 0).then_some((nqn, want))
            })
            .map(|(nqn, want)| {
                let limit = match shares {
                    None => None,
                    Some(part) => part
                        .get(nqn)
                        .or_else(|| self.cold.get(nqn))
                        .and_then(|s| s.limit_iops),
                }
                .unwrap_or(u64::MAX);
                let held = want > limit;
                let d = PathDemand {
                    served: want.min(limit),
                    backlogged: held,
                    held_milli: if held { 5000 } else { 0 },
                    served_bytes: 0,
                };
                (nqn.clone(), d)
            })
            .collect()
    }
}

/// One played target's agent: its own connection to etcd and lease, and the part of
/// the division it applied.
#[derive(Debug)]
pub struct Played {
    t: usize,
    g: EtcdGateway,
    lease: Option<LeaseId>,
    lease_ttl_s: u64,
    /// The part it applied, and the division `seq` of that part.
    applied: (u64, BTreeMap<String, LocalShare>),
    /// Its calls that write (puts, transactions, lease grants and keep-alives).
    pub writes: u64,
    /// Bytes of its records written.
    pub bytes: u64,
    /// Calls etcd did not answer in time (the gateway's timeout).
    pub failed: u64,
    /// Leases that expired between two of its intervals (granted again: the target
    /// left the members and came back, and the leader divided over the others meanwhile).
    pub lapsed: u64,
}

impl Played {
    /// One interval of a real agent's calls to etcd: the division's head and, when it
    /// names a new part, the part; the lease's keep-alive; the member and demand
    /// records under the lease; the attempt at the leader key.
    fn interval(&mut self, keys: &Keys, fleet: &PlayedFleet) {
        let g = &mut self.g;
        let name = &fleet.targets[self.t].0;
        if let Ok(Some(text)) = g.get(&keys.division())
            && let Ok(head) = parse::<DivisionRecord>(&keys.division(), &text)
            && let Some(&at) = head.parts.get(name)
            && at != self.applied.0
            && let Ok(Some(text)) = g.get(&keys.part(name))
            && let Ok(p) = parse::<PartRecord>("part", &text)
        {
            self.applied = (p.seq, p.shares);
        }
        let kept = match self.lease {
            Some(l) => match g.keep_alive(l) {
                Ok(true) => Some(l),
                Ok(false) => {
                    self.lapsed += 1;
                    None
                }
                Err(_) => None,
            },
            None => None,
        };
        let lease = match kept {
            Some(l) => l,
            None => match g.grant(self.lease_ttl_s) {
                Ok(l) => {
                    self.lease = Some(l);
                    l
                }
                Err(_) => {
                    // etcd did not answer in time: this target misses an interval.
                    self.failed += 1;
                    return;
                }
            },
        };
        self.writes += 1;
        let shares = &self.applied.1;
        let hosts = fleet.demand_at(self.t, (self.applied.0 > 0).then_some(shares));
        let demand = serde_json::to_string(&DemandRecord { hosts }).expect("json");
        // The shares it holds but the cold ones, as the real agent's record lists them.
        let applied = shares
            .iter()
            .filter(|(n, s)| fleet.cold.get(*n) != Some(*s))
            .map(|(n, s)| (n.clone(), *s))
            .collect();
        let member = serde_json::to_string(&MemberRecord {
            target: name.clone(),
            domain: fleet.domain.clone(),
            capacity_iops: fleet.targets[self.t].1,
            period_ms: fleet.period_ms,
            applied,
            error: None,
            handover_url: None,
        })
        .expect("json");
        self.bytes += (demand.len() + member.len() + name.len()) as u64;
        // As the agent writes them: its member record claimed under its lease (one
        // transaction), then its demand record.
        let calls = [
            g.claim(&keys.member(name), &member, lease).map(|_| ()),
            g.put(&keys.demand(name), &demand, Some(lease)),
            g.create(&keys.leader(), name, lease).map(|_| ()),
        ];
        self.failed += calls.iter().filter(|c| c.is_err()).count() as u64;
        self.writes += 3;
    }
}

/// The played agents, each in a thread of its own at each interval (as agents on
/// separate machines call etcd at once: etcd batches their writes; one thread calling
/// for 63 of them in turn took 2.6 s an interval, and leases lapsed).
#[derive(Debug)]
pub struct Generator {
    keys: Keys,
    /// The played agents, by target.
    pub played: Vec<Played>,
    /// Time the intervals took, in all (from the first call to the last answer).
    pub busy: Duration,
    /// Intervals played.
    pub rounds: u64,
}

impl Generator {
    /// Plays the agents of `targets` (indices into the fleet's targets), each with its
    /// own connection to etcd at `url`.
    pub fn new(
        keys: &Keys,
        url: &str,
        targets: impl IntoIterator<Item = usize>,
        lease_ttl_s: u64,
    ) -> Generator {
        Generator {
            keys: keys.clone(),
            played: targets
                .into_iter()
                .map(|t| Played {
                    t,
                    g: EtcdGateway::new(url, Duration::from_secs(5)),
                    lease: None,
                    lease_ttl_s,
                    applied: (0, BTreeMap::new()),
                    writes: 0,
                    bytes: 0,
                    failed: 0,
                    lapsed: 0,
                })
                .collect(),
            busy: Duration::ZERO,
            rounds: 0,
        }
    }

    /// One interval of every played agent, at once.
    pub fn interval(&mut self, fleet: &PlayedFleet) {
        let started = Instant::now();
        let keys = &self.keys;
        std::thread::scope(|s| {
            for p in &mut self.played {
                s.spawn(move || p.interval(keys, fleet));
            }
        });
        self.busy += started.elapsed();
        self.rounds += 1;
    }

    /// A sum over the played agents.
    pub fn sum(&self, f: impl Fn(&Played) -> u64) -> u64 {
        self.played.iter().map(f).sum()
    }
}

/// A stand-in for `nvmf_tgt` with the plugin: a JSON-RPC server on a Unix socket
/// answering the methods the agent calls (`qos_stats_get` in either form,
/// `qos_host_get`, `qos_host_set`, `qos_host_remove`), holding the hosts' settings and
/// reporting no I/O. The agent's side (its reads, its `qos_host_set`s, its JSON) is the
/// same as against a real target; the target's own CPU is not there. The socket is
/// removed when dropped (its threads end with the process).
#[derive(Debug)]
pub struct StubTarget {
    pub sock: PathBuf,
}

impl StubTarget {
    /// Listens at a fresh socket in the temporary directory.
    pub fn start(capacity_iops: u64, period_ms: u64) -> std::io::Result<StubTarget> {
        static STARTED: AtomicU64 = AtomicU64::new(0);
        let sock = std::env::temp_dir().join(format!(
            "nvmf-qos-stub-target-{}-{}.sock",
            std::process::id(),
            STARTED.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_file(&sock);
        let listener = UnixListener::bind(&sock)?;
        let hosts: Arc<Mutex<BTreeMap<String, Value>>> = Default::default();
        // As SPDK's RPC server: any number of requests on a connection (the agent keeps
        // one), answered in order; connections served at once.
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(mut conn) = conn else { continue };
                let Ok(reader) = conn.try_clone() else {
                    continue;
                };
                let hosts = Arc::clone(&hosts);
                std::thread::spawn(move || {
                    let de = serde_json::Deserializer::from_reader(BufReader::new(reader))
                        .into_iter::<Value>();
                    for req in de {
                        let Ok(req) = req else { break };
                        let mut hosts = hosts.lock().unwrap_or_else(|p| p.into_inner());
                        let result = answer(&req, &mut hosts, capacity_iops, period_ms);
                        let reply = json!({"jsonrpc": "2.0", "id": req["id"], "result": result});
                        if conn.write_all(reply.to_string().as_bytes()).is_err() {
                            break;
                        }
                    }
                });
            }
        });
        Ok(StubTarget { sock })
    }
}

/// The stand-in target's answer to one request.
fn answer(
    req: &Value,
    hosts: &mut BTreeMap<String, Value>,
    capacity: u64,
    period_ms: u64,
) -> Value {
    let params = &req["params"];
    match req["method"].as_str().unwrap_or("") {
        // The counters form (`counters`): the plugin's fields (spdk-plugin/src/
        // stats.rs, `CountersDomainOut`), each host's settings added; without it, the
        // counters alone.
        "qos_stats_get" => {
            let counters = params["counters"] == json!(true);
            let hosts: Vec<Value> = hosts
                .iter()
                .map(|(n, set)| {
                    let mut h = serde_json::Map::new();
                    h.insert("host_nqn".into(), json!(n));
                    h.insert("configured".into(), json!(true));
                    h.insert(
                        "completed_total".into(),
                        json!({"ops": 0, "bytes": 0, "ios": 0}),
                    );
                    h.insert("held_time".into(), json!({"sum_ns": 0}));
                    if counters {
                        for k in ["min_iops", "max_iops", "min_mibps", "max_mibps"] {
                            if !set[k].is_null() {
                                h.insert(k.into(), set[k].clone());
                            }
                        }
                        h.insert(
                            "weight".into(),
                            set.get("weight").cloned().unwrap_or(json!(1)),
                        );
                    }
                    Value::Object(h)
                })
                .collect();
            json!([{
                "name": params["domain"].as_str().unwrap_or("d"),
                "epoch": 1,
                "period_ns": period_ms * 1_000_000,
                "capacity_estimate": {"ops": capacity * period_ms / 1000},
                "capacity_learning": false,
                "hosts": hosts,
            }])
        }
        "qos_host_get" => json!(hosts.values().collect::<Vec<_>>()),
        "qos_host_set" => {
            let nqn = params["host_nqn"].as_str().unwrap_or("").to_string();
            hosts.insert(nqn, params.clone());
            json!(true)
        }
        "qos_host_remove" => {
            hosts.remove(params["host_nqn"].as_str().unwrap_or(""));
            json!(true)
        }
        _ => json!(true),
    }
}

impl Drop for StubTarget {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.sock);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::target::{SocketTarget, TargetRpc};

    fn fleet() -> PlayedFleet {
        let host = |n: &str, limit| {
            let c = ClusterHost {
                reservation_iops: 100,
                limit_iops: Some(limit),
                weight: 1,
                ..Default::default()
            };
            (n.to_string(), c)
        };
        let mut f = PlayedFleet::new(
            vec![("t0".into(), 1000), ("t1".into(), 1000)],
            vec![host("a", 500), host("b", 500)],
            1000,
        );
        f.wants = vec![vec![(0, 300), (1, 100)], vec![(1, 900)]];
        f
    }

    #[test]
    fn a_played_target_reports_what_its_hosts_want_up_to_their_limit_shares() {
        let f = fleet();
        let d0 = f.demand_at(0, None);
        assert_eq!(d0.keys().collect::<Vec<_>>(), ["a"]);
        assert_eq!(d0["a"].served, 300);
        assert!(!d0["a"].backlogged);
        let part: BTreeMap<String, LocalShare> = [(
            "b".to_string(),
            LocalShare {
                limit_iops: Some(400),
                ..Default::default()
            },
        )]
        .into();
        let d1 = f.demand_at(1, Some(&part));
        assert_eq!((d1["b"].served, d1["b"].backlogged), (400, true));
        // `a` is not in the part: its cold share (limit 1) holds it.
        assert_eq!((d1["a"].served, d1["a"].backlogged), (1, true));
    }

    #[test]
    fn the_stand_in_target_keeps_the_hosts_it_is_given_and_reports_them() {
        let stub = StubTarget::start(10_000, 1000).expect("stand-in");
        let mut t = SocketTarget::new(stub.sock.clone(), Duration::from_secs(5));
        let share = LocalShare {
            reservation_iops: 10,
            limit_iops: Some(20),
            weight: 3,
            ..Default::default()
        };
        t.host_set("d", "h1", &share).expect("set");
        let state = t.read("d").expect("read");
        assert_eq!(state.period_ms, 1000);
        assert_eq!(state.settings.get("h1"), Some(&share));
        let sock = stub.sock.clone();
        drop(stub);
        assert!(!sock.exists(), "the socket is removed");
    }
}
