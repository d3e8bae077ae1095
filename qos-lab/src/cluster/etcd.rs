//! What the cluster agents would write to etcd in a lab run, counted from the records
//! the real agents write (cluster-agent/src/keys.rs, agent.rs): every interval each
//! live agent puts its demand record and its member record under its lease, renews the
//! lease and tries to create the leader key; when the division or the members changed
//! the leader puts the part of each target whose shares changed, then the division's
//! head (key schema 2, a new cluster's). Sizes are the records' JSON lengths.

use std::collections::BTreeMap;
use std::io::Write;

use qos_core::cluster::{LocalShare, PathDemand};
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

pub(super) fn json_len<T: Serialize>(v: &T) -> u64 {
    let mut c = Count(0);
    serde_json::to_writer(&mut c, v).expect("records serialise");
    c.0
}

/// Decimal digits of `v`.
fn digits(v: u64) -> u64 {
    v.checked_ilog10().map_or(1, |d| d as u64 + 1)
}

/// The JSON length of a string (quoted, escaped).
pub(super) fn key_len(k: &str) -> u64 {
    if k.bytes().all(|b| b >= 0x20 && b != b'"' && b != b'\\') {
        k.len() as u64 + 2
    } else {
        json_len(&k)
    }
}

/// The JSON length of a share, counted rather than written: a fleet's records hold
/// hundreds of thousands of them every interval.
pub(super) fn share_len(s: &LocalShare) -> u64 {
    let mut n = r#"{"reservation_iops":,"limit_iops":,"weight":}"#.len() as u64;
    n += digits(s.reservation_iops) + s.limit_iops.map_or(4, digits) + digits(s.weight as u64);
    if s.reservation_mibps != 0 {
        n += r#","reservation_mibps":"#.len() as u64 + digits(s.reservation_mibps);
    }
    if let Some(l) = s.limit_mibps {
        n += r#","limit_mibps":"#.len() as u64 + digits(l);
    }
    n
}

/// The JSON length of a map of NQN to share.
pub(super) fn shares_map_len<'a>(entries: impl Iterator<Item = (&'a str, &'a LocalShare)>) -> u64 {
    let (mut n, mut count) = (2u64, 0u64);
    for (k, s) in entries {
        n += key_len(k) + 1 + share_len(s);
        count += 1;
    }
    n + count.saturating_sub(1)
}

/// The JSON length of a plan, from each target's name and its map's length.
#[cfg(test)]
fn plan_len(maps: &[(&str, u64)]) -> u64 {
    let inner: u64 = maps.iter().map(|(t, m)| key_len(t) + 1 + m).sum();
    2 + inner + (maps.len() as u64).saturating_sub(1)
}

/// The agent's `DemandRecord`.
#[derive(Serialize)]
struct DemandRecord<'a> {
    hosts: &'a BTreeMap<String, PathDemand>,
}

/// The JSON length of a demand record holding `demand` (the hosts on a path at the
/// target: the agent leaves the idle ones out).
fn demand_len(demand: &BTreeMap<String, PathDemand>) -> u64 {
    json_len(&DemandRecord { hosts: demand })
}

/// The agent's `MemberRecord` (domain and error as an agent without them writes them).
#[derive(Serialize)]
struct MemberRecord<'a> {
    target: &'a str,
    domain: &'a str,
    capacity_iops: u64,
    period_ms: u64,
    /// Left empty: its length is counted apart ([`shares_map_len`]).
    applied: BTreeMap<&'a str, LocalShare>,
    error: Option<String>,
}

/// The leader's `PartRecord`, its shares left empty (counted apart).
#[derive(Serialize)]
struct PartRecord<'a> {
    seq: u64,
    leader: &'a str,
    target: &'a str,
    shares: BTreeMap<&'a str, LocalShare>,
}

/// The leader's `DivisionRecord`, the head of a division.
#[derive(Serialize)]
struct DivisionRecord<'a> {
    seq: u64,
    leader: &'a str,
    members: &'a [String],
    parts: &'a BTreeMap<&'a str, u64>,
}

/// A transaction's limits in the agent (`TxnLimit::ETCD_DEFAULT`): bytes of keys and
/// values, each record counted 32 bytes more, and records.
pub(super) const TXN_BYTES: u64 = 1 << 20;
pub(super) const TXN_OPS: u64 = 128;
const OP_OVERHEAD: u64 = 32;
/// A part's key but the target's name, and the head's key (a short cluster name).
const PART_KEY: &str = "/nvmf-qos/fleet/parts/";
const HEAD_KEY: &str = "/nvmf-qos/fleet/division";

/// The transactions a run of records goes in, cut as the agent cuts them.
#[derive(Debug, Default)]
struct Txns {
    requests: u64,
    bytes: u64,
    ops: u64,
}

impl Txns {
    /// The next record, of `len` bytes of key and value.
    fn add(&mut self, len: u64) {
        let size = len + OP_OVERHEAD;
        if self.ops == 0 || self.bytes + size > TXN_BYTES || self.ops >= TXN_OPS {
            self.requests += 1;
            (self.bytes, self.ops) = (0, 0);
        }
        self.bytes += size;
        self.ops += 1;
    }
}

/// Writes and bytes, per agent and for the shares record.
#[derive(Debug, Clone, Default)]
pub struct EtcdLoad {
    /// Per target: writes (puts, lease renewals, leader-key attempts) and bytes put.
    pub writes: Vec<u64>,
    pub bytes: Vec<u64>,
    /// The intervals etcd answered in.
    pub intervals: u64,
    /// Divisions written; the parts written with them, the largest part's size; the
    /// largest head.
    pub shares_writes: u64,
    pub part_writes: u64,
    pub part_largest: u64,
    /// The parts' bytes, in all.
    pub part_bytes: u64,
    pub head_largest: u64,
    /// Per target, the largest demand and member record.
    pub demand_largest: Vec<u64>,
    pub member_largest: Vec<u64>,
    /// Per target, the size of its member record while its shares do not change.
    member_size: Vec<Option<u64>>,
    last_seq: u64,
    /// Per target name: the division its part was last written at.
    parts: BTreeMap<String, u64>,
    /// Per target name: its part's size as last written; the last head's size.
    part_size: BTreeMap<String, u64>,
    head_size: u64,
    /// Per target: its demand record's size now, and the bytes of its records (demand,
    /// member) that changed since the leader last listed them.
    demand_size: Vec<u64>,
    dirty: Vec<u64>,
    /// Per target: its member record changed (its applied shares did).
    member_dirty: Vec<bool>,
    /// The leader agent's record handling, summed over its intervals.
    pub leader_bytes: LeaderBytes,
    /// The target that led at the last division.
    leader_now: Option<usize>,
    /// Per division interval: how long the leader's calls to etcd took
    /// (`[cluster] etcd_read_ms`, `etcd_write_ms`; all 0 when etcd answers at once).
    pub leader_calls_ms: Vec<f64>,
    /// The divisions that landed later than `apply_delay_periods` because the
    /// leader's calls overran its interval, and the intervals they lost in all.
    pub overrun_divisions: u64,
    pub overrun_intervals: u64,
}

/// What the leader agent's intervals handle, in bytes of records (JSON), summed over
/// the intervals it divided in (docs/cluster.md, "The agent at scale"): the inputs of
/// the lab's prediction of its CPU ([`super::agent_cpu`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LeaderBytes {
    pub intervals: u64,
    /// Every member's and demand record listed (read from etcd each interval).
    pub listed: u64,
    /// Of those, the records whose text changed since the last listing (parsed).
    pub parsed: u64,
    /// Its own part and the division's head, read and parsed each interval.
    pub part_read: u64,
    /// The hosts' contracts, listed and parsed each interval.
    pub contracts: u64,
    /// Records it wrote: its demand and member records, the division's parts and head.
    pub written: u64,
    /// Its requests to etcd (as the agent's interval makes them: the cluster's record,
    /// the contracts, the leader key's read, the members' and demand listings, the
    /// head and its part; its two puts, the lease's keep-alive, the leader key's
    /// transaction; the division's transactions).
    pub requests: u64,
}

/// The leader's reads of an interval (cluster-agent/src/agent.rs, `sync_renewing`,
/// `lead`, `division::read`): the cluster's record, the contracts' listing, the leader
/// key, the members' and demand listings, the division's head and its part.
pub const LEADER_READS: u64 = 7;

/// Another target's agent's reads of an interval (cluster-agent/src/agent.rs): the
/// cluster's record, the contracts' listing, the leader key, the division's head and
/// its part.
pub const MEMBER_READS: u64 = 5;

/// Every agent's writes of an interval (as [`EtcdLoad::agent_interval`] counts them):
/// its demand and member records, the lease's keep-alive, the leader key's transaction.
pub const AGENT_WRITES: u64 = 4;

impl EtcdLoad {
    pub fn new(targets: usize) -> Self {
        EtcdLoad {
            writes: vec![0; targets],
            bytes: vec![0; targets],
            demand_largest: vec![0; targets],
            member_largest: vec![0; targets],
            member_size: vec![None; targets],
            demand_size: vec![0; targets],
            dirty: vec![0; targets],
            member_dirty: vec![true; targets],
            ..Default::default()
        }
    }

    /// The leader (target `leader`) writes a new division over `members`: the parts
    /// in `changed` (each member's name and the JSON length of its map of shares),
    /// then the head, in as few transactions as etcd's limits allow (as the agent's
    /// `division::write`: up to [`TXN_BYTES`] of keys and values and [`TXN_OPS`]
    /// records each; a write is a request).
    /// Returns the requests the write took.
    pub fn shares_written(
        &mut self,
        leader: (usize, &str),
        members: &[String],
        changed: &[(&str, u64)],
    ) -> u64 {
        let (leader, leader_name) = leader;
        self.last_seq += 1;
        let seq = self.last_seq;
        let mut txn = Txns::default();
        for &(t, map) in changed {
            let len = json_len(&PartRecord {
                seq,
                leader: leader_name,
                target: t,
                shares: BTreeMap::new(),
            }) - 2
                + map;
            self.parts.insert(t.to_string(), seq);
            self.part_size.insert(t.to_string(), len);
            self.leader_bytes.written += len;
            self.part_writes += 1;
            self.part_largest = self.part_largest.max(len);
            self.part_bytes += len;
            txn.add(PART_KEY.len() as u64 + t.len() as u64 + len);
            self.bytes[leader] += len;
        }
        let parts: BTreeMap<&str, u64> = members
            .iter()
            .filter_map(|m| Some((m.as_str(), *self.parts.get(m)?)))
            .collect();
        let len = json_len(&DivisionRecord {
            seq,
            leader: leader_name,
            members,
            parts: &parts,
        });
        self.shares_writes += 1;
        self.head_largest = self.head_largest.max(len);
        self.head_size = len;
        self.leader_bytes.written += len;
        txn.add(HEAD_KEY.len() as u64 + len);
        self.writes[leader] += txn.requests;
        self.writes[leader] += 1;
        self.leader_bytes.requests += txn.requests + 1;
        self.bytes[leader] += len;
        txn.requests + 1
    }

    /// The targets' applied shares changed (`changed[i]`: target `i`'s did): their
    /// member records change.
    pub fn applied_changed(&mut self, changed: &[bool]) {
        self.member_size.fill(None);
        for (d, &c) in self.member_dirty.iter_mut().zip(changed) {
            *d |= c;
        }
    }

    /// The leader (target `leader`) divides: it lists the `members`' member and demand
    /// records (parsing those that changed since its last listing), the hosts'
    /// contracts (`contracts`: their records' JSON length), and reads its own part
    /// and the head.
    pub fn leader_interval(
        &mut self,
        leader: usize,
        leader_name: &str,
        members: &[usize],
        contracts: u64,
    ) {
        self.leader_now = Some(leader);
        let b = &mut self.leader_bytes;
        b.intervals += 1;
        b.requests += LEADER_READS;
        b.contracts += contracts;
        for &i in members {
            b.listed += self.demand_size[i] + self.member_size[i].unwrap_or(0);
            b.parsed += std::mem::take(&mut self.dirty[i]);
        }
        b.part_read += self.part_size.get(leader_name).copied().unwrap_or(0) + self.head_size;
    }

    /// Target `i`'s interval with etcd up: its demand record, its member record, the
    /// lease renewal and the leader-key attempt. The demand record holds `demand.0`
    /// (`demand.1`: it differs from the target's last).
    pub fn agent_interval(
        &mut self,
        i: usize,
        name: &str,
        s: &ClusterScenario,
        demand: (&BTreeMap<String, PathDemand>, bool),
        applied_len: impl FnOnce() -> u64,
    ) {
        let (demand, demand_changed) = demand;
        let d = demand_len(demand);
        let m = *self.member_size[i].get_or_insert_with(|| {
            let head = json_len(&MemberRecord {
                target: name,
                domain: "",
                capacity_iops: s.targets[i].capacity_iops,
                period_ms: s.cluster.interval_ms,
                applied: BTreeMap::new(),
                error: None,
            });
            head - 2 + applied_len()
        });
        self.demand_largest[i] = self.demand_largest[i].max(d);
        self.member_largest[i] = self.member_largest[i].max(m);
        if demand_changed || d != self.demand_size[i] {
            self.dirty[i] += d;
        }
        if std::mem::take(&mut self.member_dirty[i]) {
            self.dirty[i] += m;
        }
        self.demand_size[i] = d;
        if self.leader_now == Some(i) {
            self.leader_bytes.written += d + m;
            self.leader_bytes.requests += AGENT_WRITES;
        }
        // The demand record's put, the member record's claim (a transaction), the
        // lease's keep-alive, the leader key's create transaction.
        self.writes[i] += AGENT_WRITES;
        self.bytes[i] += d + m + name.len() as u64;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use qos_core::cluster::Plan;

    #[test]
    fn counted_lengths_are_the_json_lengths() {
        let shares = [
            LocalShare::default(),
            LocalShare {
                reservation_iops: 1_000_000_007,
                limit_iops: Some(9),
                weight: 1000,
                reservation_mibps: 12,
                limit_mibps: Some(0),
            },
            LocalShare {
                reservation_iops: 10,
                limit_iops: Some(100),
                weight: 7,
                reservation_mibps: 0,
                limit_mibps: Some(10_000),
            },
        ];
        for s in &shares {
            assert_eq!(share_len(s), json_len(s), "{s:?}");
        }
        let mut plan = Plan::new();
        for (t, n) in [("a", 0), ("t\"x", 1), ("t001", 3)] {
            let m: BTreeMap<String, LocalShare> = (0..n)
                .map(|k| (format!("nqn.h\u{1}{k}"), shares[k % 3]))
                .collect();
            plan.insert(t.to_string(), m);
        }
        let maps: Vec<(&str, u64)> = plan
            .iter()
            .map(|(t, m)| {
                let entries = m.iter().map(|(k, s)| (k.as_str(), s));
                (t.as_str(), shares_map_len(entries))
            })
            .collect();
        assert_eq!(plan_len(&maps), json_len(&plan));
        assert_eq!(plan_len(&[]), json_len(&Plan::new()));
    }

    #[test]
    fn records_go_in_transactions_as_the_agent_cuts_them() {
        let mut t = Txns::default();
        // 54 parts of 83 KB and a head: 12 parts fit in 1 MiB, so five transactions.
        for _ in 0..54 {
            t.add(83_000);
        }
        t.add(1_100);
        assert_eq!(t.requests, 5);
        // 200 small records: 128 at most in one.
        let mut t = Txns::default();
        (0..200).for_each(|_| t.add(10));
        assert_eq!(t.requests, 2);
        // One above the limit goes alone.
        let mut t = Txns::default();
        [10, TXN_BYTES * 2, 10].into_iter().for_each(|l| t.add(l));
        assert_eq!(t.requests, 3);
    }
}
