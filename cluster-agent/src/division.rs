//! The division's records in etcd: the leader writing a division and an agent reading
//! its target's part of it, in either key schema (docs/cluster.md, "Keys and records").
//!
//! - Schema 1 ([`SCHEMA_ONE_RECORD`]): one `shares` record holds every target's part.
//! - Schema 2 ([`SCHEMA_PER_TARGET`]): each target's part under `parts/<target>`,
//!   written when it changed, then the `division` head naming the division (`seq`) and
//!   the part of each member in it. An agent reads the head and its own part; it takes
//!   the part only when the part's `seq` and `leader` are those the head names, so a
//!   division is applied whole or not at all (a leader that dies between its parts and
//!   its head leaves the previous division in force), and the handover's "same
//!   division" is the head's `seq`, as it was the single record's.
//!
//! In both, a new leader numbers its first division above every division record it
//! finds (of either schema), so the sequence an agent sees never goes back and no two
//! divisions share a number.

use std::collections::BTreeMap;

use qos_core::cluster::{LocalShare, Plan};

use crate::keys::{DivisionRecord, Keys, PartRecord, SCHEMA_ONE_RECORD, SharesRecord, parse};
use crate::store::{Store, StoreError, TxnLimit};

/// A division as one agent reads it.
#[derive(Debug, Clone, PartialEq)]
pub struct Division {
    pub seq: u64,
    pub leader: String,
    pub members: Vec<String>,
    /// The members' handover URLs.
    pub peers: BTreeMap<String, String>,
    /// This target's part; `None` when the division does not include it yet, or (schema
    /// 2) when its part is not the one the head names (the leader is writing).
    pub mine: Option<BTreeMap<String, LocalShare>>,
}

/// A division as its leader wrote it: what the next one is compared with.
#[derive(Debug, Clone, PartialEq)]
pub struct Written {
    pub seq: u64,
    pub members: Vec<String>,
    pub plan: Plan,
    pub peers: BTreeMap<String, String>,
    /// Schema 2: per target, the division its part in etcd was written at (its content
    /// is `plan`'s entry).
    pub parts: BTreeMap<String, u64>,
}

/// What writing a division took: the records the leader wrote (parts and head, or the
/// one record) and the requests they went in.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WriteCount {
    /// Records written.
    pub puts: usize,
    /// Requests to etcd that carried them (schema 2: transactions of several parts, the
    /// head in the last).
    pub requests: usize,
    pub bytes: usize,
    /// The largest record written (etcd refuses requests above `--max-request-bytes`,
    /// 1.5 MiB by default).
    pub largest: usize,
}

/// The number of the last division written, of either schema (0: none), or of the
/// parts a leader wrote without their head (it stopped between two transactions): a
/// new leader numbers its division above both. Numbered from the head alone, it took
/// the number of the parts left behind, and a reader that read one of those parts and
/// then the new head (its own two calls straddling the new leader's writes) took the
/// old part as the new division's (found by the property test below).
pub fn last_seq(store: &mut dyn Store, keys: &Keys) -> Result<u64, StoreError> {
    let head = store
        .get(&keys.division())?
        .and_then(|t| parse::<DivisionRecord>("division", &t).ok())
        .map_or(0, |d| d.seq);
    let one = store
        .get(&keys.shares())?
        .and_then(|t| parse::<SharesRecord>("shares", &t).ok())
        .map_or(0, |s| s.seq);
    let parts = store
        .list(&keys.parts())?
        .iter()
        .filter_map(|(_, t)| parse::<PartRecord>("part", t).ok())
        .map(|p| p.seq)
        .max()
        .unwrap_or(0);
    Ok(head.max(one).max(parts))
}

/// Writes the division `plan` over `members` as `leader`, in key `schema`. `last`: what
/// this leader wrote before (`None` for its first division: every part is written, and
/// the number continues from the records found). Returns what was written and the
/// writes it took. Schema 2's parts and head go in as few etcd transactions as
/// [`TxnLimit::ETCD_DEFAULT`] allows, in key order, the head in the last: each
/// transaction lands whole, so the head still lands after (or with) every part it
/// names, and a leader that stops between two transactions leaves parts without their
/// head, which readers do not take (see [`read`]).
#[allow(clippy::too_many_arguments)]
pub fn write(
    store: &mut dyn Store,
    keys: &Keys,
    schema: u32,
    leader: &str,
    last: Option<&Written>,
    members: Vec<String>,
    plan: Plan,
    peers: BTreeMap<String, String>,
) -> Result<(Written, WriteCount), StoreError> {
    write_in(
        store,
        keys,
        schema,
        leader,
        last,
        members,
        plan,
        peers,
        TxnLimit::ETCD_DEFAULT,
    )
}

/// [`write`], each transaction within `limit`.
#[allow(clippy::too_many_arguments)]
pub fn write_in(
    store: &mut dyn Store,
    keys: &Keys,
    schema: u32,
    leader: &str,
    last: Option<&Written>,
    members: Vec<String>,
    plan: Plan,
    peers: BTreeMap<String, String>,
    limit: TxnLimit,
) -> Result<(Written, WriteCount), StoreError> {
    let seq = match last {
        Some(w) => w.seq,
        None => last_seq(store, keys)?,
    } + 1;
    let mut count = WriteCount::default();
    let mut records: Vec<(String, String)> = Vec::new();
    let mut parts = BTreeMap::new();
    if schema <= SCHEMA_ONE_RECORD {
        let rec = SharesRecord {
            seq,
            leader: leader.into(),
            members: members.clone(),
            plan: plan.clone(),
            peers: peers.clone(),
        };
        records.push((keys.shares(), json(&rec)));
    } else {
        for (t, shares) in &plan {
            let kept = last.and_then(|w| {
                let at = *w.parts.get(t)?;
                (w.plan.get(t) == Some(shares)).then_some(at)
            });
            let at = match kept {
                Some(at) => at,
                None => {
                    let rec = PartRecord {
                        seq,
                        leader: leader.into(),
                        target: t.clone(),
                        shares: shares.clone(),
                    };
                    records.push((keys.part(t), json(&rec)));
                    seq
                }
            };
            parts.insert(t.clone(), at);
        }
        let head = DivisionRecord {
            seq,
            leader: leader.into(),
            members: members.clone(),
            parts: parts.clone(),
            peers: peers.clone(),
        };
        records.push((keys.division(), json(&head)));
    }
    for (_, text) in &records {
        count.puts += 1;
        count.bytes += text.len();
        count.largest = count.largest.max(text.len());
    }
    if let [(key, text)] = records.as_slice() {
        count.requests = 1;
        store.put(key, text, None)?;
    } else {
        for run in limit.batches(&records) {
            count.requests += 1;
            store.put_all(run)?;
        }
    }
    if schema > SCHEMA_ONE_RECORD && last.is_none() {
        // A cluster moved from schema 1: its old record is read by nobody now.
        store.delete(&keys.shares())?;
    }
    Ok((
        Written {
            seq,
            members,
            plan,
            peers,
            parts,
        },
        count,
    ))
}

/// Reads the division and `target`'s part of it, in key `schema`; `None` before the
/// first division. A record that does not parse, or a part that claims another target,
/// is named in `errors` and read as no division (the target keeps its shares).
pub fn read(
    store: &mut dyn Store,
    keys: &Keys,
    schema: u32,
    target: &str,
    errors: &mut Vec<String>,
) -> Result<Option<Division>, StoreError> {
    if schema <= SCHEMA_ONE_RECORD {
        let Some(text) = store.get(&keys.shares())? else {
            return Ok(None);
        };
        return Ok(match parse::<SharesRecord>(&keys.shares(), &text) {
            Ok(s) => Some(Division {
                mine: s.plan.get(target).cloned(),
                seq: s.seq,
                leader: s.leader,
                members: s.members,
                peers: s.peers,
            }),
            Err(e) => {
                errors.push(e);
                None
            }
        });
    }
    let Some(mut head) = read_head(store, keys, errors)? else {
        return Ok(None);
    };
    let Some(&named) = head.parts.get(target) else {
        return Ok(Some(division(head, None)));
    };
    let part = match store.get(&keys.part(target))? {
        None => None,
        Some(text) => match parse::<PartRecord>(&keys.part(target), &text) {
            Ok(p) if p.target != target => {
                errors.push(format!(
                    "{}: the part is {}'s, not {target}'s: ignored",
                    keys.part(target),
                    p.target
                ));
                return Ok(None);
            }
            Ok(p) => Some(p),
            Err(e) => {
                errors.push(e);
                return Ok(None);
            }
        },
    };
    let Some(part) = part else {
        return Ok(Some(division(head, None)));
    };
    // The leader wrote the next division's part between the two reads: its head is
    // there now, or about to be.
    if part.seq > named
        && let Some(newer) = read_head(store, keys, errors)?
    {
        head = newer;
    }
    let fits = head.parts.get(target) == Some(&part.seq) && part.leader == head.leader;
    let mine = fits.then_some(part.shares);
    Ok(Some(division(head, mine)))
}

fn read_head(
    store: &mut dyn Store,
    keys: &Keys,
    errors: &mut Vec<String>,
) -> Result<Option<DivisionRecord>, StoreError> {
    let Some(text) = store.get(&keys.division())? else {
        return Ok(None);
    };
    Ok(parse::<DivisionRecord>(&keys.division(), &text)
        .map_err(|e| errors.push(e))
        .ok())
}

fn division(head: DivisionRecord, mine: Option<BTreeMap<String, LocalShare>>) -> Division {
    Division {
        seq: head.seq,
        leader: head.leader,
        members: head.members,
        peers: head.peers,
        mine,
    }
}

/// The whole division, every target's part, for `show`: the number and the plan (a
/// part that is not the one the head names is left out).
pub fn read_all(
    store: &mut dyn Store,
    keys: &Keys,
    schema: u32,
    errors: &mut Vec<String>,
) -> Result<Option<(u64, Plan)>, StoreError> {
    if schema <= SCHEMA_ONE_RECORD {
        let Some(text) = store.get(&keys.shares())? else {
            return Ok(None);
        };
        return Ok(parse::<SharesRecord>(&keys.shares(), &text)
            .map_err(|e| errors.push(e))
            .ok()
            .map(|s| (s.seq, s.plan)));
    }
    let Some(head) = read_head(store, keys, errors)? else {
        return Ok(None);
    };
    let prefix = keys.parts();
    let mut plan = Plan::new();
    for (k, v) in store.list(&prefix)? {
        let Some(t) = k.strip_prefix(&prefix) else {
            continue;
        };
        match parse::<PartRecord>(&k, &v) {
            Ok(p)
                if p.target == t
                    && head.parts.get(t) == Some(&p.seq)
                    && p.leader == head.leader =>
            {
                plan.insert(t.to_string(), p.shares);
            }
            Ok(_) => {}
            Err(e) => errors.push(e),
        }
    }
    Ok(Some((head.seq, plan)))
}

fn json<T: serde::Serialize>(v: &T) -> String {
    serde_json::to_string(v).expect("records serialise")
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;

    use proptest::prelude::*;

    use super::*;
    use crate::keys::SCHEMA_PER_TARGET;
    use crate::store::{LeaseId, MemStore};

    fn share(r: u64) -> LocalShare {
        LocalShare {
            reservation_iops: r,
            limit_iops: Some(r * 2 + 1),
            ..Default::default()
        }
    }

    fn plan_of(parts: &[(&str, &[(&str, u64)])]) -> Plan {
        parts
            .iter()
            .map(|(t, hosts)| {
                let m = hosts
                    .iter()
                    .map(|(h, r)| (h.to_string(), share(*r)))
                    .collect();
                (t.to_string(), m)
            })
            .collect()
    }

    fn names(plan: &Plan) -> Vec<String> {
        plan.keys().cloned().collect()
    }

    fn mine(
        s: &mut dyn Store,
        k: &Keys,
        t: &str,
    ) -> Option<(u64, Option<BTreeMap<String, LocalShare>>)> {
        let mut errors = Vec::new();
        let d = read(s, k, SCHEMA_PER_TARGET, t, &mut errors).unwrap();
        assert!(errors.is_empty(), "{errors:?}");
        d.map(|d| (d.seq, d.mine))
    }

    #[test]
    fn each_target_reads_its_own_part_and_unchanged_parts_are_not_written_again() {
        let (mut s, k) = (MemStore::default(), Keys::new("c"));
        let p1 = plan_of(&[("a", &[("h", 10), ("g", 5)]), ("b", &[("h", 20), ("g", 6)])]);
        let (w1, n1) = write(
            &mut s,
            &k,
            2,
            "a",
            None,
            names(&p1),
            p1.clone(),
            BTreeMap::new(),
        )
        .unwrap();
        assert_eq!((w1.seq, n1.puts), (1, 3), "two parts and the head");
        assert_eq!(mine(&mut s, &k, "a"), Some((1, Some(p1["a"].clone()))));
        assert_eq!(mine(&mut s, &k, "b"), Some((1, Some(p1["b"].clone()))));
        assert_eq!(mine(&mut s, &k, "c"), Some((1, None)), "not a member");
        // Only b's part moves: b's part and the head are written.
        let p2 = plan_of(&[("a", &[("h", 10), ("g", 5)]), ("b", &[("h", 30), ("g", 6)])]);
        let (w2, n2) = write(
            &mut s,
            &k,
            2,
            "a",
            Some(&w1),
            names(&p2),
            p2.clone(),
            BTreeMap::new(),
        )
        .unwrap();
        assert_eq!((w2.seq, n2.puts), (2, 2));
        assert_eq!(w2.parts, BTreeMap::from([("a".into(), 1), ("b".into(), 2)]));
        assert_eq!(mine(&mut s, &k, "a"), Some((2, Some(p2["a"].clone()))));
        assert_eq!(mine(&mut s, &k, "b"), Some((2, Some(p2["b"].clone()))));
        // `show` puts the parts together again.
        assert_eq!(
            read_all(&mut s, &k, 2, &mut Vec::new()).unwrap(),
            Some((2, p2))
        );
    }

    #[test]
    fn a_cluster_moved_from_one_record_continues_its_numbers_and_drops_the_record() {
        let (mut s, k) = (MemStore::default(), Keys::new("c"));
        let p = plan_of(&[("a", &[("h", 10)]), ("b", &[("h", 20)])]);
        let mut last = None;
        for _ in 0..7 {
            let w = write(
                &mut s,
                &k,
                1,
                "a",
                last.as_ref(),
                names(&p),
                p.clone(),
                BTreeMap::new(),
            );
            last = Some(w.unwrap().0);
        }
        let mut errors = Vec::new();
        let d = read(&mut s, &k, 1, "b", &mut errors).unwrap().unwrap();
        assert_eq!((d.seq, d.mine), (7, Some(p["b"].clone())));
        assert!(s.get(&k.division()).unwrap().is_none());
        // `cluster create --update --key-schema 2`; the leader's next division (the
        // same agent: it writes anew after reading the new schema, as any new leader).
        let (w, n) = write(
            &mut s,
            &k,
            2,
            "b",
            None,
            names(&p),
            p.clone(),
            BTreeMap::new(),
        )
        .unwrap();
        assert_eq!((w.seq, n.puts), (8, 3));
        assert!(
            s.get(&k.shares()).unwrap().is_none(),
            "the old record is gone"
        );
        assert_eq!(mine(&mut s, &k, "a"), Some((8, Some(p["a"].clone()))));
    }

    #[test]
    fn a_part_under_another_targets_key_or_that_does_not_parse_is_refused() {
        let (mut s, k) = (MemStore::default(), Keys::new("c"));
        let p = plan_of(&[("a", &[("h", 10)]), ("b", &[("h", 20)])]);
        write(
            &mut s,
            &k,
            2,
            "a",
            None,
            names(&p),
            p.clone(),
            BTreeMap::new(),
        )
        .unwrap();
        let forged = PartRecord {
            seq: 1,
            leader: "a".into(),
            target: "a".into(),
            shares: p["a"].clone(),
        };
        s.put(&k.part("b"), &json(&forged), None).unwrap();
        let mut errors = Vec::new();
        assert_eq!(read(&mut s, &k, 2, "b", &mut errors).unwrap(), None);
        assert!(errors[0].contains("a's, not b's"), "{errors:?}");
        s.put(&k.part("b"), "{\"seq\":", None).unwrap();
        let mut errors = Vec::new();
        assert_eq!(read(&mut s, &k, 2, "b", &mut errors).unwrap(), None);
        assert!(errors[0].contains("parts/b"), "{errors:?}");
    }

    /// 64 targets and 1,000 hosts, each host reaching 2 of them (the real agent's test
    /// at scale, tests/scale.rs): the division as one record is above etcd's request
    /// limit, each target's part well below it; in key schema 3 a part lists the 30
    /// hosts with a path at its target, not all 1,000.
    #[test]
    fn at_64_targets_and_1000_hosts_every_record_fits_in_an_etcd_request() {
        use qos_core::cluster::{ClusterHost, DivideConfig, PathDemand, plan, with_cold_shares};
        const LIMIT: usize = 3 << 19; // etcd's --max-request-bytes default, 1.5 MiB
        let targets: Vec<String> = (0..64).map(|i| format!("t{i:03}")).collect();
        let nqn = |h: usize| format!("nqn.2014-08.org.example:scale-host-{h:05}");
        let hosts: BTreeMap<String, ClusterHost> = (0..1000)
            .map(|h| {
                let c = ClusterHost {
                    reservation_iops: (h as u64 % 2) * (200 + h as u64 % 1400),
                    limit_iops: Some(1000 + (h as u64 * 37) % 5000),
                    weight: 1 + (h as u32 % 10),
                    ..Default::default()
                };
                (nqn(h), c)
            })
            .collect();
        let mut demand: BTreeMap<String, BTreeMap<String, PathDemand>> = BTreeMap::new();
        for h in 0..1000 {
            for (j, share) in [(0, 800), (1, 200)] {
                let d = PathDemand {
                    served: (500 + h as u64 % 3500) * share / 1000,
                    ..Default::default()
                };
                demand
                    .entry(targets[(h + j) % 64].clone())
                    .or_default()
                    .insert(nqn(h), d);
            }
        }
        let paths = plan(&hosts, &targets, &demand, &DivideConfig::default());
        // Schemas 1 and 2 list every host in every part (as the leader writes them).
        let p: Plan = paths
            .iter()
            .map(|(t, part)| (t.clone(), with_cold_shares(part, &hosts)))
            .collect();
        let one_record = json(&SharesRecord {
            seq: 1,
            leader: "t000".into(),
            members: targets.clone(),
            plan: p.clone(),
            peers: BTreeMap::new(),
        });
        assert!(one_record.len() > LIMIT, "{} bytes", one_record.len());
        println!("one record: {} bytes", one_record.len());
        let (mut s, k) = (MemStore::default(), Keys::new("c"));
        let mut rec = Recorder {
            inner: &mut s,
            ops: Vec::new(),
        };
        let (_, n) = write(
            &mut rec,
            &k,
            2,
            "t000",
            None,
            targets.clone(),
            p,
            BTreeMap::new(),
        )
        .unwrap();
        let requests = rec.ops;
        assert_eq!(n.puts, 65);
        assert!(
            n.largest * 10 < LIMIT,
            "the largest record: {} bytes",
            n.largest
        );
        println!("the largest part: {} bytes", n.largest);
        // The 65 records in a few transactions, each within etcd's limits, the head
        // last (the delete of a schema-1 record after it, in a request of its own).
        let (writes, delete) = requests.split_at(requests.len() - 1);
        assert_eq!(delete, [vec![(k.shares(), None)]]);
        assert_eq!(n.requests, writes.len());
        assert!((2..=8).contains(&writes.len()), "{} requests", writes.len());
        for w in writes {
            let bytes: usize = w
                .iter()
                .map(|(k, v)| k.len() + v.as_ref().unwrap().len())
                .sum();
            assert!(bytes < LIMIT && w.len() <= 128, "{bytes} bytes");
        }
        let order: Vec<&String> = writes.iter().flatten().map(|(k, _)| k).collect();
        assert_eq!(order.len(), 65);
        assert_eq!(*order[64], k.division(), "the head last");
        println!("{} records in {} transactions", n.puts, n.requests);
        for (key, v) in writes.iter().flatten() {
            s.put(key, v.as_ref().unwrap(), None).unwrap();
        }
        assert!(mine(&mut s, &k, "t063").unwrap().1.unwrap().len() == 1000);

        // Schema 3: the same division, each part holding the hosts with a path there.
        let (mut s3, full_part) = (MemStore::default(), n.largest);
        let (_, n) = write(
            &mut s3,
            &k,
            3,
            "t000",
            None,
            targets.clone(),
            paths,
            BTreeMap::new(),
        )
        .unwrap();
        assert_eq!(n.puts, 65);
        assert!(n.largest * 20 < full_part, "{} of {full_part}", n.largest);
        println!("the largest part listing paths only: {} bytes", n.largest);
        assert_eq!(mine(&mut s3, &k, "t063").unwrap().1.unwrap().len(), 30);
    }

    /// A write to etcd: the records one request carries (`None`: a delete), landing
    /// together.
    type Request = Vec<(String, Option<String>)>;

    /// A store that records the leader's writes instead of making them (reads go to
    /// the store it wraps): the test then lets them land one request at a time.
    struct Recorder<'a> {
        inner: &'a mut MemStore,
        ops: Vec<Request>,
    }

    impl Store for Recorder<'_> {
        fn grant(&mut self, _: u64) -> Result<LeaseId, StoreError> {
            unreachable!()
        }
        fn keep_alive(&mut self, _: LeaseId) -> Result<bool, StoreError> {
            unreachable!()
        }
        fn revoke(&mut self, _: LeaseId) -> Result<(), StoreError> {
            unreachable!()
        }
        fn put(&mut self, key: &str, value: &str, _: Option<LeaseId>) -> Result<(), StoreError> {
            self.ops.push(vec![(key.into(), Some(value.into()))]);
            Ok(())
        }
        fn put_all(&mut self, puts: &[(String, String)]) -> Result<(), StoreError> {
            let request = puts.iter().map(|(k, v)| (k.clone(), Some(v.clone())));
            self.ops.push(request.collect());
            Ok(())
        }
        fn create(&mut self, _: &str, _: &str, _: LeaseId) -> Result<bool, StoreError> {
            unreachable!()
        }
        fn claim(&mut self, _: &str, _: &str, _: LeaseId) -> Result<bool, StoreError> {
            unreachable!()
        }
        fn list(&mut self, prefix: &str) -> Result<Vec<(String, String)>, StoreError> {
            self.inner.list(prefix)
        }
        fn delete_prefix(&mut self, _: &str) -> Result<(), StoreError> {
            unreachable!()
        }
        fn delete(&mut self, key: &str) -> Result<(), StoreError> {
            self.ops.push(vec![(key.into(), None)]);
            Ok(())
        }
    }

    /// The truth in etcd, the leader's writes not landed yet, and what each landed
    /// head numbered.
    struct World {
        mem: MemStore,
        pending: VecDeque<Request>,
        /// The plan each division numbered was for.
        heads: BTreeMap<u64, Plan>,
        /// Per pending request: the plan of the head it carries.
        landing: VecDeque<Option<Plan>>,
    }

    impl World {
        /// Lands the next pending request whole; a head's division is then complete.
        fn land(&mut self, keys: &Keys) {
            let Some(request) = self.pending.pop_front() else {
                return;
            };
            let mut plan = self.landing.pop_front().flatten();
            for (k, v) in request {
                match v {
                    Some(v) => {
                        if k == keys.division() {
                            let head: DivisionRecord = parse("h", &v).unwrap();
                            let plan = plan.take().expect("a head carries its plan");
                            if let Some(before) = self.heads.get(&head.seq) {
                                assert_eq!(before, &plan, "two divisions numbered #{}", head.seq);
                            }
                            self.heads.insert(head.seq, plan);
                        }
                        self.mem.put(&k, &v, None).unwrap();
                    }
                    None => self.mem.delete(&k).unwrap(),
                }
            }
        }
    }

    /// A reader's store: before each call, lets `steps` more of the leader's writes
    /// land (a read of the head and then the part may straddle the leader's writes).
    struct Straddling<'a> {
        world: &'a mut World,
        keys: &'a Keys,
        steps: VecDeque<usize>,
    }

    impl Straddling<'_> {
        fn step(&mut self) {
            for _ in 0..self.steps.pop_front().unwrap_or(0) {
                self.world.land(self.keys);
            }
        }
    }

    impl Store for Straddling<'_> {
        fn grant(&mut self, _: u64) -> Result<LeaseId, StoreError> {
            unreachable!()
        }
        fn keep_alive(&mut self, _: LeaseId) -> Result<bool, StoreError> {
            unreachable!()
        }
        fn revoke(&mut self, _: LeaseId) -> Result<(), StoreError> {
            unreachable!()
        }
        fn put(&mut self, _: &str, _: &str, _: Option<LeaseId>) -> Result<(), StoreError> {
            unreachable!()
        }
        fn put_all(&mut self, _: &[(String, String)]) -> Result<(), StoreError> {
            unreachable!()
        }
        fn create(&mut self, _: &str, _: &str, _: LeaseId) -> Result<bool, StoreError> {
            unreachable!()
        }
        fn claim(&mut self, _: &str, _: &str, _: LeaseId) -> Result<bool, StoreError> {
            unreachable!()
        }
        fn list(&mut self, prefix: &str) -> Result<Vec<(String, String)>, StoreError> {
            self.step();
            self.world.mem.list(prefix)
        }
        fn delete_prefix(&mut self, _: &str) -> Result<(), StoreError> {
            unreachable!()
        }
        fn delete(&mut self, _: &str) -> Result<(), StoreError> {
            unreachable!()
        }
    }

    const TARGETS: [&str; 4] = ["t0", "t1", "t10", "t2"];

    proptest! {
        /// Whatever the leaders write (members and shares changing, a leader stopping
        /// after any of its requests, another taking over; a division's records in
        /// requests of 1 to 4 records, `max_ops`) and whenever the targets read
        /// (between any two writes, also between a read's own two or three calls), a
        /// target that reads a part reads exactly its part of the division the head
        /// numbered (no division mixed, none numbered twice), the numbers a target
        /// reads never go back, and once the writes have landed every member reads its
        /// part of the last complete division.
        #[test]
        fn a_division_is_read_whole_numbered_once_and_never_back(
            events in proptest::collection::vec(
                (0usize..3, 0u64..4, 1usize..16, 0usize..4, 0usize..4, 0usize..6), 1..60),
            max_ops in 1usize..5,
        ) {
            let keys = Keys::new("c");
            let mut world = World {
                mem: MemStore::default(),
                pending: VecDeque::new(),
                heads: BTreeMap::new(),
                landing: VecDeque::new(),
            };
            // (leader, what it last wrote, all of it landed).
            let mut leader: Option<(String, Written)> = None;
            let mut seen: BTreeMap<&str, u64> = BTreeMap::new();
            for (round, (kind, who, members_bits, cut, reader, steps)) in
                (1u64..).zip(events)
            {
                match kind {
                    // A leader's division: earlier writes have landed (its calls
                    // returned), this one may stop after any write (`cut`).
                    0 | 1 => {
                        while !world.pending.is_empty() {
                            world.land(&keys);
                        }
                        let name = format!("l{who}");
                        let members: Vec<String> = TARGETS
                            .iter()
                            .enumerate()
                            .filter(|(i, _)| members_bits & (1 << i) != 0)
                            .map(|(_, t)| t.to_string())
                            .collect();
                        let plan: Plan = members
                            .iter()
                            .enumerate()
                            .map(|(i, t)| {
                                let r = (round * (i as u64 + 1)) % 3 + who;
                                (t.clone(), BTreeMap::from([("h".to_string(), share(r))]))
                            })
                            .collect();
                        let last = leader
                            .as_ref()
                            .filter(|(n, _)| *n == name)
                            .map(|(_, w)| w.clone());
                        let mut rec = Recorder { inner: &mut world.mem, ops: Vec::new() };
                        let limit = TxnLimit { max_bytes: usize::MAX / 2, max_ops };
                        let (w, _) = write_in(
                            &mut rec, &keys, 2, &name, last.as_ref(), members, plan.clone(),
                            BTreeMap::new(), limit,
                        ).unwrap();
                        let mut ops = rec.ops;
                        let complete = kind == 0 || cut >= ops.len();
                        if !complete {
                            ops.truncate(cut);
                        }
                        for request in ops {
                            let head = request.iter().any(|(k, _)| *k == keys.division());
                            world.landing.push_back(head.then(|| plan.clone()));
                            world.pending.push_back(request);
                        }
                        // A leader that stopped part-way writes anew when it leads again.
                        leader = complete.then_some((name, w));
                    }
                    // A target reads, the leader's writes landing around its calls.
                    _ => {
                        let t = TARGETS[reader];
                        let mut st = Straddling {
                            world: &mut world,
                            keys: &keys,
                            steps: VecDeque::from([steps % 3, steps / 3, steps % 2]),
                        };
                        let mut errors = Vec::new();
                        let d = read(&mut st, &keys, 2, t, &mut errors).unwrap();
                        prop_assert!(errors.is_empty(), "{errors:?}");
                        if let Some(d) = d && let Some(m) = d.mine {
                            let whole = &world.heads[&d.seq];
                            prop_assert_eq!(Some(&m), whole.get(t), "#{} at {}", d.seq, t);
                            let before = seen.insert(t, d.seq).unwrap_or(0);
                            prop_assert!(d.seq >= before, "{t}: #{before} then #{}", d.seq);
                        }
                    }
                }
            }
            while !world.pending.is_empty() {
                world.land(&keys);
            }
            if let Some((_, w)) = &leader {
                for t in &w.members {
                    let d = mine(&mut world.mem, &keys, t).unwrap();
                    prop_assert_eq!(d, (w.seq, Some(w.plan[t].clone())));
                }
            }
        }
    }
}
