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

fn json_len<T: Serialize>(v: &T) -> u64 {
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
#[cfg(test)]
fn shares_map_len<'a>(entries: impl Iterator<Item = (&'a str, &'a LocalShare)>) -> u64 {
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

/// The JSON length of a demand record holding `demand` and `idle.0` idle entries more
/// (`PathDemand::default()`), whose NQNs' JSON lengths add up to `idle.1`.
fn demand_len(demand: &BTreeMap<String, PathDemand>, idle: (u64, u64)) -> u64 {
    let (count, names) = idle;
    let d = json_len(&DemandRecord { hosts: demand });
    if count == 0 {
        return d;
    }
    // `"nqn":{...}` each, and a comma between any two entries.
    let entry = json_len(&PathDemand::default()) + 1;
    let commas = if demand.is_empty() { count - 1 } else { count };
    d + names + count * entry + commas
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
    pub head_largest: u64,
    /// Per target, the largest demand and member record.
    pub demand_largest: Vec<u64>,
    pub member_largest: Vec<u64>,
    /// Per target, the size of its member record while its shares do not change.
    member_size: Vec<Option<u64>>,
    last_seq: u64,
    /// Per target name: the division its part was last written at.
    parts: BTreeMap<String, u64>,
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

    /// The leader (target `leader`) writes a new division over `members`: the parts
    /// in `changed` (each member's name and the JSON length of its map of shares),
    /// then the head.
    pub fn shares_written(
        &mut self,
        leader: (usize, &str),
        members: &[String],
        changed: &[(&str, u64)],
    ) {
        let (leader, leader_name) = leader;
        self.last_seq += 1;
        let seq = self.last_seq;
        for &(t, map) in changed {
            let len = json_len(&PartRecord {
                seq,
                leader: leader_name,
                target: t,
                shares: BTreeMap::new(),
            }) - 2
                + map;
            self.parts.insert(t.to_string(), seq);
            self.part_writes += 1;
            self.part_largest = self.part_largest.max(len);
            self.writes[leader] += 1;
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
        self.writes[leader] += 1;
        self.bytes[leader] += len;
    }

    /// The targets' applied shares changed: their member records change size.
    pub fn applied_changed(&mut self) {
        self.member_size.fill(None);
    }

    /// Target `i`'s interval with etcd up: its demand record, its member record, the
    /// lease renewal and the leader-key attempt. The demand record holds `demand` and
    /// `idle.0` idle entries more (hosts configured at the target without demand there,
    /// as the real agent lists them; `idle.1` their NQNs' JSON lengths, quoted).
    pub fn agent_interval(
        &mut self,
        i: usize,
        name: &str,
        s: &ClusterScenario,
        demand: &BTreeMap<String, PathDemand>,
        idle: (u64, u64),
        applied_len: impl FnOnce() -> u64,
    ) {
        let d = demand_len(demand, idle);
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
        // Two puts, the lease's keep-alive, the leader key's create transaction.
        self.writes[i] += 4;
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
    fn idle_entries_count_as_the_real_agent_writes_them() {
        let busy = PathDemand {
            served: 1234,
            backlogged: true,
            held_milli: 5000,
            served_bytes: 0,
        };
        for (with, idle) in [(0, 0), (0, 3), (2, 0), (2, 5)] {
            let demand: BTreeMap<String, PathDemand> =
                (0..with).map(|k| (format!("nqn.busy-{k}"), busy)).collect();
            let names: Vec<String> = (0..idle).map(|k| format!("nqn.idle-{k}")).collect();
            let mut all = demand.clone();
            all.extend(names.iter().map(|n| (n.clone(), PathDemand::default())));
            let lens = names.iter().map(|n| key_len(n)).sum();
            assert_eq!(
                demand_len(&demand, (idle, lens)),
                json_len(&DemandRecord { hosts: &all }),
                "{with} busy, {idle} idle"
            );
        }
    }
}
