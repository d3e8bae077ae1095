//! What targets trade while etcd is away: a host's demand that moves from one target to
//! another is followed without the division. The target the demand left *releases* the
//! part of the host's share it holds unused, addressed to one target that holds the host
//! back; that target *takes* exactly what was released to it. Sans-IO: the cluster
//! agent reads its peers' [`HandoverReport`]s (over HTTP) and its target, calls
//! [`Handover::step`], applies the shares, and [`Handover::commit`]s what it applied.
//!
//! The bound. At every target `t` and for each amount (reservation or limit, IOPS or
//! MiB/s) of a host, `share_t = base_t − released_t + taken_t`, where `base_t` is the
//! last division's share, `released_t` what `t` released so far (to anyone) and
//! `taken_t` what it took so far. Releases are cumulative counters, published only after
//! the lowered share was applied at the target; a target takes from a peer at most the
//! counter that peer publishes for it. So at any instant Σ taken ≤ Σ released and
//! Σ_t share_t ≤ Σ_t base_t: the targets never hold more than the division gave them
//! together, which adds up to the host's contract. A release is never more than the
//! share holds unused, so no share goes below zero. Only targets on the same division
//! (`seq`) trade; a new division starts every counter over (the agent calls
//! [`Handover::rebase`]). A forged peer report can raise one target's share, but never
//! above the host's whole contract (the shares are clamped to it).
//!
//! What it costs: a reservation released at one target is short at both until the
//! other takes it (one agent interval), and a release keeps `headroom_milli` of what
//! the host served (the division's headroom) for the host's own growth there.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::cluster::{ClusterHost, LocalShare, PathDemand};

/// One host's four amounts at one target, as whole units (IOPS and MiB/s).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Amounts {
    #[serde(default)]
    pub reservation_iops: u64,
    #[serde(default)]
    pub limit_iops: u64,
    #[serde(default)]
    pub reservation_mibps: u64,
    #[serde(default)]
    pub limit_mibps: u64,
}

impl Amounts {
    fn plus(self, o: Amounts) -> Amounts {
        Amounts {
            reservation_iops: self.reservation_iops.saturating_add(o.reservation_iops),
            limit_iops: self.limit_iops.saturating_add(o.limit_iops),
            reservation_mibps: self.reservation_mibps.saturating_add(o.reservation_mibps),
            limit_mibps: self.limit_mibps.saturating_add(o.limit_mibps),
        }
    }

    /// Each amount the larger of the two (counters only grow).
    fn max(self, o: Amounts) -> Amounts {
        Amounts {
            reservation_iops: self.reservation_iops.max(o.reservation_iops),
            limit_iops: self.limit_iops.max(o.limit_iops),
            reservation_mibps: self.reservation_mibps.max(o.reservation_mibps),
            limit_mibps: self.limit_mibps.max(o.limit_mibps),
        }
    }

    fn is_zero(&self) -> bool {
        *self == Amounts::default()
    }

    fn sum<'a>(it: impl Iterator<Item = &'a Amounts>) -> Amounts {
        it.fold(Amounts::default(), |a, b| a.plus(*b))
    }
}

/// One host as a target publishes it to its peers.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct HostHandover {
    /// The host is held here (commands waiting for tokens or its limit): it wants more.
    pub held: bool,
    /// What this target released so far of the host's share, per receiving target
    /// (cumulative since the division `seq`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub released: BTreeMap<String, Amounts>,
}

/// What one target publishes to its peers (the agent's `GET /handover`).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct HandoverReport {
    pub target: String,
    /// The division (shares record `seq`) its counters count from; `None` before the
    /// agent read one.
    pub seq: Option<u64>,
    pub hosts: BTreeMap<String, HostHandover>,
}

/// Release and take settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HandoverConfig {
    /// Thousandths added to what the host served here before the rest of its share
    /// counts as unused (the division's `headroom_milli`).
    pub headroom_milli: u32,
    /// A release smaller than this many thousandths of the share is not made: each
    /// change re-prorates the host's period at the target.
    pub min_release_milli: u64,
}

impl Default for HandoverConfig {
    fn default() -> Self {
        HandoverConfig {
            headroom_milli: crate::cluster::DivideConfig::default().headroom_milli,
            min_release_milli: 30,
        }
    }
}

/// What [`Handover::step`] decided: the shares to hold, and the counters to publish once
/// they are applied.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct HandoverStep {
    /// Per host, the share this target should hold now.
    pub shares: BTreeMap<String, LocalShare>,
    released: BTreeMap<String, BTreeMap<String, Amounts>>,
    taken: BTreeMap<String, BTreeMap<String, Amounts>>,
}

/// One target's trade book since its last division.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Handover {
    target: String,
    seq: Option<u64>,
    base: BTreeMap<String, LocalShare>,
    /// Per host, per receiving target: released so far (applied at this target).
    released: BTreeMap<String, BTreeMap<String, Amounts>>,
    /// Per host, per releasing target: taken so far (applied at this target).
    taken: BTreeMap<String, BTreeMap<String, Amounts>>,
    /// Per host: held here at the last step.
    held: BTreeMap<String, bool>,
}

const MIB: u64 = 1 << 20;

impl Handover {
    pub fn new(target: &str) -> Handover {
        Handover {
            target: target.to_string(),
            ..Default::default()
        }
    }

    /// The division this target's book counts from.
    pub fn seq(&self) -> Option<u64> {
        self.seq
    }

    /// A new division (`seq`, this target's part): every counter starts over. The same
    /// `seq` again changes nothing.
    pub fn rebase(&mut self, seq: u64, mine: &BTreeMap<String, LocalShare>) {
        if self.seq == Some(seq) {
            return;
        }
        self.seq = Some(seq);
        self.base = mine.clone();
        self.released.clear();
        self.taken.clear();
    }

    /// Whether this target traded anything since its division.
    pub fn traded(&self) -> bool {
        self.released
            .values()
            .chain(self.taken.values())
            .any(|m| !m.is_empty())
    }

    /// What to publish to peers: the hosts held here or released from here (a host
    /// that is neither is left out: at fleet size most hosts are).
    pub fn report(&self) -> HandoverReport {
        let mut hosts: BTreeMap<String, HostHandover> = BTreeMap::new();
        for (nqn, _) in self.held.iter().filter(|(_, h)| **h) {
            hosts.entry(nqn.clone()).or_default().held = true;
        }
        for (nqn, to) in &self.released {
            hosts.entry(nqn.clone()).or_default().released = to.clone();
        }
        HandoverReport {
            target: self.target.clone(),
            seq: self.seq,
            hosts,
        }
    }

    /// The shares this target holds by its book (the division's, moved by what it
    /// traded), for the hosts in `contracts`.
    pub fn shares(
        &self,
        contracts: &BTreeMap<String, ClusterHost>,
    ) -> BTreeMap<String, LocalShare> {
        let none = BTreeMap::new();
        self.base
            .iter()
            .filter_map(|(nqn, base)| {
                let c = contracts.get(nqn)?;
                let released = self.released.get(nqn).unwrap_or(&none);
                let taken = self.taken.get(nqn).unwrap_or(&none);
                Some((nqn.clone(), book_share(base, released, taken, c)))
            })
            .collect()
    }

    /// Records whether each host is held here (published while etcd answers too, so the
    /// peers know where a host wants more the moment etcd goes away).
    pub fn observe(&mut self, demand: &BTreeMap<String, PathDemand>) {
        self.held = demand
            .iter()
            .map(|(n, d)| (n.clone(), d.backlogged))
            .collect();
    }

    /// The shares this target holds by its book, and the releases and takes of this
    /// interval, from what the host did here (`demand`), the peers' reports and the
    /// hosts' contracts. Nothing changes until [`Handover::commit`].
    pub fn step(
        &self,
        demand: &BTreeMap<String, PathDemand>,
        peers: &[HandoverReport],
        contracts: &BTreeMap<String, ClusterHost>,
        cfg: &HandoverConfig,
    ) -> HandoverStep {
        let mut out = HandoverStep {
            released: self.released.clone(),
            taken: self.taken.clone(),
            ..Default::default()
        };
        // (The hosts of the book are all stepped below; these keep the counters of
        // hosts that left the contracts.)
        let Some(seq) = self.seq else {
            return out;
        };
        // Per host, what the peers on this division say of it (one pass over the
        // reports: a fleet's hosts are mostly in none).
        let mut said: BTreeMap<&str, Vec<(&str, &HostHandover)>> = BTreeMap::new();
        for p in peers
            .iter()
            .filter(|p| p.seq == Some(seq) && p.target != self.target)
        {
            for (nqn, h) in &p.hosts {
                said.entry(nqn.as_str()).or_default().push((&p.target, h));
            }
        }
        let nobody = Vec::new();
        for (nqn, base) in &self.base {
            let Some(contract) = contracts.get(nqn) else {
                continue;
            };
            // Most hosts trade nothing: no map is made for them.
            let said = said.get(nqn.as_str()).unwrap_or(&nobody);
            let mut taken = self.taken.get(nqn).cloned().unwrap_or_default();
            for (from, h) in said {
                if let Some(offered) = h.released.get(&self.target).filter(|a| !a.is_zero()) {
                    let t = taken.entry(from.to_string()).or_default();
                    *t = t.max(*offered);
                }
            }
            let mut released = self.released.get(nqn).cloned().unwrap_or_default();
            let mut share = book_share(base, &released, &taken, contract);
            let d = demand.get(nqn).copied().unwrap_or_default();
            let to = said
                .iter()
                .filter(|(_, h)| h.held)
                .map(|(t, _)| *t)
                .min()
                .map(str::to_string);
            if let (false, Some(to)) = (d.backlogged, to) {
                let give = unused(&share, &d, cfg);
                if !give.is_zero() {
                    let r = released.entry(to).or_default();
                    *r = r.plus(give);
                    share = book_share(base, &released, &taken, contract);
                }
            }
            if !taken.is_empty() {
                out.taken.insert(nqn.clone(), taken);
            }
            if !released.is_empty() {
                out.released.insert(nqn.clone(), released);
            }
            out.shares.insert(nqn.clone(), share);
        }
        out
    }

    /// Keeps the step's counters for the hosts whose share the target now holds
    /// (`applied`); the others keep their old counters and are stepped again.
    pub fn commit(&mut self, step: &HandoverStep, applied: impl Fn(&str) -> bool) {
        for nqn in step.shares.keys().filter(|n| applied(n)) {
            for (book, new) in [
                (&mut self.released, &step.released),
                (&mut self.taken, &step.taken),
            ] {
                match new.get(nqn) {
                    Some(m) => {
                        book.insert(nqn.clone(), m.clone());
                    }
                    None => {
                        book.remove(nqn);
                    }
                }
            }
        }
    }
}

/// base − released + taken, each amount, clamped to the host's contract.
fn book_share(
    base: &LocalShare,
    released: &BTreeMap<String, Amounts>,
    taken: &BTreeMap<String, Amounts>,
    contract: &ClusterHost,
) -> LocalShare {
    let out = Amounts::sum(released.values());
    let inn = Amounts::sum(taken.values());
    // In then out: a target may release what it took.
    let at = |b: u64, o: u64, i: u64, cap: u64| b.saturating_add(i).saturating_sub(o).min(cap);
    // A limit share stays a limit (and at least 1); no limit stays none.
    let limit = |b: Option<u64>, o: u64, i: u64, cap: Option<u64>| {
        b.map(|b| at(b, o, i, cap.unwrap_or(u64::MAX)).max(1))
    };
    // A reservation above its limit is cut to the limit: the target refuses it, and
    // the cut only lowers what the targets hold. (Reservation and limit are released
    // and taken apart, each with its own threshold, so trades can leave a small share
    // with more reservation than limit: a property test found 2 against 1.)
    let within = |r: u64, l: Option<u64>| l.map_or(r, |l| r.min(l));
    let limit_iops = limit(
        base.limit_iops,
        out.limit_iops,
        inn.limit_iops,
        contract.limit_iops,
    );
    let limit_mibps = limit(
        base.limit_mibps,
        out.limit_mibps,
        inn.limit_mibps,
        contract.limit_mibps,
    );
    LocalShare {
        reservation_iops: within(
            at(
                base.reservation_iops,
                out.reservation_iops,
                inn.reservation_iops,
                contract.reservation_iops,
            ),
            limit_iops,
        ),
        limit_iops,
        weight: base.weight,
        reservation_mibps: within(
            at(
                base.reservation_mibps,
                out.reservation_mibps,
                inn.reservation_mibps,
                contract.reservation_mibps,
            ),
            limit_mibps,
        ),
        limit_mibps,
    }
}

/// What of `share` the host leaves unused here: the share above what it served plus
/// the headroom, each amount only when that is at least `min_release_milli` of it. A
/// limit keeps at least 1.
fn unused(share: &LocalShare, d: &PathDemand, cfg: &HandoverConfig) -> Amounts {
    let grown = |v: u64| v.saturating_mul(1000 + cfg.headroom_milli as u64) / 1000;
    let want_iops = grown(d.served);
    let want_mibps = grown(d.served_bytes).div_ceil(MIB);
    let spare = |have: u64, want: u64, keep: u64| {
        let s = have.saturating_sub(want.max(keep));
        if s as u128 * 1000 >= have as u128 * cfg.min_release_milli as u128 && s > 0 {
            s
        } else {
            0
        }
    };
    // A limit keeps at least the reservation that stays: a reservation whose spare is
    // below the release threshold stays whole while its limit's may not (a target
    // refuses a reservation above the limit).
    let reservation_iops = spare(share.reservation_iops, want_iops, 0);
    let reservation_mibps = spare(share.reservation_mibps, want_mibps, 0);
    let kept = |r: u64, spared: u64| (r - spared).max(1);
    Amounts {
        reservation_iops,
        limit_iops: share.limit_iops.map_or(0, |l| {
            spare(l, want_iops, kept(share.reservation_iops, reservation_iops))
        }),
        reservation_mibps,
        limit_mibps: share.limit_mibps.map_or(0, |l| {
            spare(
                l,
                want_mibps,
                kept(share.reservation_mibps, reservation_mibps),
            )
        }),
    }
}

#[cfg(test)]
mod tests;
