//! Judging a host's reservation over a run's periods on a machine whose speed moves:
//! which periods count. A period in which all the hosts together completed clearly less
//! than the machine was expected to serve (the bare rate measured in the same run, or
//! the run's median period) is a slow spell of the machine (the target's core, or the
//! initiators', shared with other jobs): every reservation can fall short in it
//! whatever the QoS does, so it is excused, met or not. Every other period counts: a
//! host that missed while the target served at its expected rate got less than its
//! reservation because the others got more, which is a reservation QoS broke. (Whether
//! the QoS held the host's I/O does not tell them apart: the token release is paced
//! through the period, so a busy host is held in nearly every period.) Except where the
//! machine's speed was hardly more than the reservations: a period whose hosts' used
//! reservations (each counted up to what its host completed) took more than
//! [`SLOW_FRACTION`] of what they completed together left the QoS no excess to move, so a
//! host that missed in it missed because the machine ran below what its reservations
//! need (a local CI run had its four hosts at 54 % of the capacity, with 52 % reserved);
//! such a period is excused too. A tenant group's reservation counts toward it as its
//! members hold it: the larger of their own reservations and the group's, each up to
//! what they completed (a group reserved above its members' sum left a reliability
//! test's host 2 missing by 0.5-2 % in periods its own judge called loose).

use std::collections::BTreeMap;

use crate::history::History;

/// A period is slow when the hosts together completed less than this fraction of what
/// they were expected to (the machine's speed moves 10-25 % within a minute; a drop
/// within 10 % of the expected is not a slow spell).
pub const SLOW_FRACTION: f64 = 0.9;

/// Below this fraction of the capacity the domain was sized for (from the bare rate
/// measured in the same run) as the hosts' median period, the machine ran slower than
/// it was calibrated at throughout the run (other jobs on its cores). Quiet runs of the
/// reliability tests had their four hosts at 52-67 % (base faults, stalling base) and
/// 65-95 % (restart) of the capacity (limits and queue depths bound them), runs under
/// other engineers' builds at 18-42 % (base faults) and 46-81 % (restart).
pub const LOADED_FRACTION: f64 = 0.45;

/// What hosts whose median period was `median` operations, in a domain sized for
/// `capacity` operations a period, are expected to complete in a period, and whether
/// the machine was slow throughout: the median (or the capacity, if less), so that only
/// slow spells are excused; the capacity when the median is below [`LOADED_FRACTION`]
/// of it, so that only the periods the machine ran at its calibrated speed are judged.
pub fn expected_served(median: u64, capacity: u64) -> (u64, bool) {
    if (median as f64) < LOADED_FRACTION * capacity as f64 {
        (capacity, true)
    } else {
        (median.min(capacity), false)
    }
}

/// A reservation hosts hold together (a tenant group): `members` index the hosts
/// judged among, `ops` the group's reservation, operations a period.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupReservation {
    pub members: Vec<usize>,
    pub ops: u64,
}

/// One host's reservation over a span of periods.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Judged {
    /// Periods that count, and how many of them met the reservation.
    pub judged: u64,
    pub met: u64,
    /// Periods excused as slow spells (all hosts together completed less than
    /// [`SLOW_FRACTION`] of `expected`) or as too tight (their used reservations more
    /// than [`SLOW_FRACTION`] of what they completed), by epoch: whether the reservation
    /// was met in it.
    pub excused: BTreeMap<u64, bool>,
    /// Of `excused`, the periods too tight to judge.
    pub tight: u64,
    /// The judged periods in which the reservation was missed.
    pub missed: Vec<u64>,
    /// What all hosts together were expected to complete in a period.
    pub expected: u64,
}

impl Judged {
    /// The epochs excused in which the reservation was missed.
    pub fn excused_missed(&self) -> Vec<u64> {
        self.excused
            .iter()
            .filter(|(_, met)| !**met)
            .map(|(e, _)| *e)
            .collect()
    }
}

impl History {
    /// What hosts `nqns` completed together in `epoch` (operations; 0 for a host with
    /// no record of it).
    pub fn served(&self, nqns: &[String], epoch: u64) -> u64 {
        nqns.iter()
            .map(|n| self.of(n).get(&epoch).map_or(0, |p| p.ops))
            .sum()
    }

    /// The median over `epochs` of what hosts `nqns` completed together in a period: the
    /// rate to expect of the machine when no bare rate was measured.
    pub fn median_served(&self, nqns: &[String], epochs: &[u64]) -> u64 {
        let mut totals: Vec<u64> = epochs.iter().map(|&e| self.served(nqns, e)).collect();
        totals.sort_unstable();
        totals.get(totals.len() / 2).copied().unwrap_or(0)
    }

    /// What hosts `all`, reserved `reserved` operations a period each (in the same
    /// order) and `groups` together, used of their reservations in `epoch`: each
    /// host's reservation up to what it completed; a group's members the larger of
    /// that and the group's reservation up to what they completed together.
    pub fn reservations_used(
        &self,
        all: &[String],
        reserved: &[u64],
        groups: &[GroupReservation],
        epoch: u64,
    ) -> u64 {
        let did = |k: usize| self.of(&all[k]).get(&epoch).map_or(0, |p| p.ops);
        let own = |k: usize| did(k).min(reserved[k]);
        let grouped = |k: usize| groups.iter().any(|g| g.members.contains(&k));
        let alone: u64 = (0..all.len()).filter(|&k| !grouped(k)).map(own).sum();
        let by_groups: u64 = groups
            .iter()
            .map(|g| {
                let members_own: u64 = g.members.iter().map(|&k| own(k)).sum();
                let together: u64 = g.members.iter().map(|&k| did(k)).sum();
                members_own.max(together.min(g.ops))
            })
            .sum();
        alone + by_groups
    }

    /// Host `nqn`'s reservation over `epochs` (those it has a record of), hosts `all`
    /// (reserved `reserved` operations a period each, in the same order) expected to
    /// complete `expected` operations a period together: see the module's doc.
    pub fn judge_reservation(
        &self,
        nqn: &str,
        (all, reserved, groups): (&[String], &[u64], &[GroupReservation]),
        epochs: &[u64],
        expected: u64,
    ) -> Judged {
        assert_eq!(all.len(), reserved.len(), "a reservation for each host");
        assert!(
            groups
                .iter()
                .flat_map(|g| &g.members)
                .all(|&k| k < all.len()),
            "group members index the hosts"
        );
        let recs = self.of(nqn);
        let slow = (expected as f64 * SLOW_FRACTION) as u64;
        let mut j = Judged {
            expected,
            ..Judged::default()
        };
        for e in epochs.iter().filter(|e| recs.contains_key(e)) {
            let p = recs[e];
            let served = self.served(all, *e);
            if served < slow {
                j.excused.insert(*e, p.met);
            } else if self.reservations_used(all, reserved, groups, *e) as f64
                > SLOW_FRACTION * served as f64
            {
                j.excused.insert(*e, p.met);
                j.tight += 1;
            } else {
                j.judged += 1;
                j.met += p.met as u64;
                if !p.met {
                    j.missed.push(*e);
                }
            }
        }
        j
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::PeriodRec;

    /// Hosts "a" and "b" over epochs 0..20, each doing `ops(host, epoch)`, met when
    /// `met(host, epoch)`, backlogged when `held(host, epoch)`.
    fn history(
        ops: impl Fn(&str, u64) -> u64,
        met: impl Fn(&str, u64) -> bool,
        held: impl Fn(&str, u64) -> bool,
    ) -> History {
        let mut h = History::new("d");
        for n in ["a", "b"] {
            let m = h.hosts.entry(n.into()).or_default();
            for e in 0..20 {
                m.insert(
                    e,
                    PeriodRec {
                        epoch: e,
                        ops: ops(n, e),
                        bytes: 0,
                        ios: ops(n, e),
                        met: met(n, e),
                        backlogged: held(n, e),
                    },
                );
            }
        }
        h
    }

    fn all() -> Vec<String> {
        vec!["a".into(), "b".into()]
    }

    /// Host a's reservation, the machine expected at its median.
    fn judge(h: &History) -> Judged {
        let expected = h.median_served(&all(), &EPOCHS);
        h.judge_reservation("a", (&all(), &NONE_RESERVED, &[]), &EPOCHS, expected)
    }

    /// Reservations too small to make any period tight.
    const NONE_RESERVED: [u64; 2] = [0, 0];

    const EPOCHS: [u64; 20] = [
        0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19,
    ];

    #[test]
    fn a_slow_spell_that_hits_everyone_is_excused() {
        // Epochs 15..20: the machine at half speed, both hosts miss.
        let slow = |e: u64| e >= 15;
        let h = history(
            |_, e| if slow(e) { 500 } else { 1000 },
            |_, e| !slow(e),
            |_, _| true,
        );
        let j = judge(&h);
        assert_eq!((j.met, j.judged), (15, 15));
        assert_eq!(j.excused_missed(), [15, 16, 17, 18, 19]);
        assert_eq!(j.expected, 2000);
        // A dip within 10 % is no slow spell: counted.
        let h = history(
            |_, e| if slow(e) { 920 } else { 1000 },
            |_, e| !slow(e),
            |_, _| true,
        );
        assert_eq!((judge(&h).met, judge(&h).judged), (15, 20));
    }

    #[test]
    fn a_reservation_broken_at_the_usual_rate_counts() {
        // From epoch 10 host b takes what host a should have had; the target serves as
        // much as ever: counted, whether the QoS held a or not.
        let broken = |e: u64| e >= 10;
        for held in [false, true] {
            let h = history(
                |n, e| match (n, broken(e)) {
                    ("a", true) => 300,
                    ("b", true) => 1700,
                    _ => 1000,
                },
                |n, e| n == "b" || !broken(e),
                |_, _| held,
            );
            let j = judge(&h);
            assert_eq!((j.met, j.judged), (10, 20));
            assert!(j.excused.is_empty());
            // Against the bare rate too.
            let j = h.judge_reservation("a", (&all(), &NONE_RESERVED, &[]), &EPOCHS, 2000);
            assert_eq!((j.met, j.judged), (10, 20));
        }
    }

    #[test]
    fn the_median_is_expected_unless_the_run_was_slow_throughout() {
        assert_eq!(expected_served(1300, 2000), (1300, false));
        assert_eq!(expected_served(2100, 2000), (2000, false));
        assert_eq!(expected_served(899, 2000), (2000, true));
        assert_eq!(expected_served(901, 2000), (901, false));
        // A run slow throughout judges only the periods at the calibrated speed.
        let h = history(
            |_, e| if e < 3 { 1000 } else { 400 },
            |_, _| false,
            |_, _| true,
        );
        let median = h.median_served(&all(), &EPOCHS);
        let (expected, slow) = expected_served(median, 2000);
        assert!(slow);
        let j = h.judge_reservation("a", (&all(), &NONE_RESERVED, &[]), &EPOCHS, expected);
        assert_eq!((j.met, j.judged, j.excused.len()), (0, 3, 17));
    }

    #[test]
    fn a_run_slower_than_the_bare_rate_throughout_is_excused_against_it_only() {
        // Measured at 1000 a host bare; the whole run at 400 a host, both missing:
        // excused against the bare rate (nothing judged), judged against the run's own
        // median (as a QoS that admitted too little would be).
        let h = history(|_, _| 400, |_, _| false, |_, _| true);
        let j = h.judge_reservation("a", (&all(), &NONE_RESERVED, &[]), &EPOCHS, 2000);
        assert_eq!((j.met, j.judged, j.excused.len()), (0, 0, 20));
        let j = judge(&h);
        assert_eq!((j.met, j.judged), (0, 20));
    }

    #[test]
    fn a_period_with_no_excess_over_the_reservations_is_excused_as_tight() {
        // Each host reserved 480 a period; the machine at its usual 1,000 a host, then
        // from epoch 10 at 515 a host: a misses by 10 (470), b takes 560. 2 x 480 used
        // of 1,030 is more than 90 %: no excess to move, excused. At the usual rate the
        // same miss (a 470, b 1,530) counts.
        let reserved = [480, 480];
        let late = |e: u64| e >= 10;
        // From epoch 10 a does 470 (missing by 10) and b does `b_late`.
        let run = |b_late: u64| {
            history(
                move |n, e| match (n, late(e)) {
                    ("a", true) => 470,
                    ("b", true) => b_late,
                    _ => 1000,
                },
                move |n, e| n == "b" || !late(e),
                |_, _| true,
            )
        };
        let h = run(560);
        let j = h.judge_reservation("a", (&all(), &reserved, &[]), &EPOCHS, 1030);
        assert_eq!((j.met, j.judged, j.tight), (10, 10, 10));
        assert_eq!(j.excused_missed(), (10..20).collect::<Vec<u64>>());
        let h = run(1530);
        let j = h.judge_reservation("a", (&all(), &reserved, &[]), &EPOCHS, 2000);
        assert_eq!((j.met, j.judged, j.tight), (10, 20, 0));
    }

    #[test]
    fn a_group_reservation_counts_toward_a_tight_period() {
        // a reserves 480, b 200 of its own and 900 as its group's only member. From
        // epoch 10 the machine does 1,370: a 470 (a miss), b 900. By the hosts' own
        // reservations 670 of 1,370 were reserved and the miss would count; with the
        // group's, all of it was, and the period is excused as tight.
        let h = history(
            |n, e| match (n, e >= 10) {
                ("a", true) => 470,
                ("b", true) => 900,
                _ => 1000,
            },
            |n, e| n == "b" || e < 10,
            |_, _| true,
        );
        let reserved = [480, 200];
        let alone = h.judge_reservation("a", (&all(), &reserved, &[]), &EPOCHS, 1370);
        assert_eq!((alone.judged, alone.tight, alone.missed.len()), (20, 0, 10));
        let group = [GroupReservation {
            members: vec![1],
            ops: 900,
        }];
        let grouped = h.judge_reservation("a", (&all(), &reserved, &group), &EPOCHS, 1370);
        assert_eq!((grouped.judged, grouped.tight, grouped.met), (10, 10, 10));
    }
}
