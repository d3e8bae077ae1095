//! What the cluster agents would write to etcd in a lab run, counted from the records
//! the real agents write (cluster-agent/src/keys.rs, agent.rs): every interval each
//! live agent puts its demand record and its member record under its lease, renews the
//! lease and tries to create the leader key; the leader puts the shares record when the
//! division or the members changed. Sizes are the records' JSON lengths.

use std::collections::BTreeMap;
use std::io::Write;

use qos_core::cluster::{LocalShare, PathDemand, Plan};
use serde::Serialize;

use super::ClusterScenario;

/// A writer that only counts.
struct Count(u64);

impl Write for Count {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0 += buf.len() as u64;
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn json_len<T: Serialize>(v: &T) -> u64 {
    let mut c = Count(0);
    serde_json::to_writer(&mut c, v).expect("records serialise");
    c.0
}

/// The agent's `DemandRecord`.
#[derive(Serialize)]
struct DemandRecord<'a> {
    hosts: &'a BTreeMap<String, PathDemand>,
}

/// The agent's `MemberRecord` (domain and error as an agent without them writes them).
#[derive(Serialize)]
struct MemberRecord<'a> {
    target: &'a str,
    domain: &'a str,
    capacity_iops: u64,
    period_ms: u64,
    applied: BTreeMap<&'a str, LocalShare>,
    error: Option<String>,
}

/// The leader's `SharesRecord`.
#[derive(Serialize)]
struct SharesRecord<'a> {
    seq: u64,
    leader: &'a str,
    members: &'a [String],
    plan: &'a Plan,
}

/// Writes and bytes, per agent and for the shares record.
#[derive(Debug, Clone, Default)]
pub struct EtcdLoad {
    /// Per target: writes (puts, lease renewals, leader-key attempts) and bytes put.
    pub writes: Vec<u64>,
    pub bytes: Vec<u64>,
    /// The intervals etcd answered in.
    pub intervals: u64,
    /// Shares records written, and the largest one's size.
    pub shares_writes: u64,
    pub shares_largest: u64,
    /// Per target, the largest demand and member record.
    pub demand_largest: Vec<u64>,
    pub member_largest: Vec<u64>,
    /// Per target, the size of its member record while its shares do not change.
    member_size: Vec<Option<u64>>,
    last_seq: u64,
}

impl EtcdLoad {
    pub fn new(targets: usize) -> Self {
        EtcdLoad {
            writes: vec![0; targets],
            bytes: vec![0; targets],
            demand_largest: vec![0; targets],
            member_largest: vec![0; targets],
            member_size: vec![None; targets],
            ..Default::default()
        }
    }

    /// The leader (target `leader`) puts a new shares record.
    pub fn shares_written(&mut self, leader: (usize, &str), members: &[String], plan: &Plan) {
        let (leader, leader_name) = leader;
        self.last_seq += 1;
        let len = json_len(&SharesRecord {
            seq: self.last_seq,
            leader: leader_name,
            members,
            plan,
        });
        self.shares_writes += 1;
        self.shares_largest = self.shares_largest.max(len);
        self.writes[leader] += 1;
        self.bytes[leader] += len;
    }

    /// The targets' applied shares changed: their member records change size.
    pub fn applied_changed(&mut self) {
        self.member_size.fill(None);
    }

    /// Target `i`'s interval with etcd up: its demand record, its member record, the
    /// lease renewal and the leader-key attempt.
    pub fn agent_interval(
        &mut self,
        i: usize,
        name: &str,
        s: &ClusterScenario,
        demand: &BTreeMap<String, PathDemand>,
        applied: &[Option<LocalShare>],
    ) {
        let d = json_len(&DemandRecord { hosts: demand });
        let m = *self.member_size[i].get_or_insert_with(|| {
            json_len(&MemberRecord {
                target: name,
                domain: "",
                capacity_iops: s.targets[i].capacity_iops,
                period_ms: s.cluster.interval_ms,
                applied: s
                    .hosts
                    .iter()
                    .zip(applied)
                    .filter_map(|(h, a)| a.map(|a| (h.nqn.as_str(), a)))
                    .collect(),
                error: None,
            })
        });
        self.demand_largest[i] = self.demand_largest[i].max(d);
        self.member_largest[i] = self.member_largest[i].max(m);
        // Two puts, the lease's keep-alive, the leader key's create transaction.
        self.writes[i] += 4;
        self.bytes[i] += d + m + name.len() as u64;
    }
}
