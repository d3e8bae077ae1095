//! How the capacity nobody reserved is shared: a policy object with one hook for each
//! place the monitor's behaviour depends on it. A new way of sharing is one file in
//! `sharing/`, one variant of [`ExcessSharing`] and one arm in [`policy_for`].
//!
//! - [`FirstCome`] (`first_come`): Haechi's global pool; channels take tokens from it
//!   in batches scaled by weight, so the excess follows demand and queue depth.
//! - [`Weighted`] (`weighted`): the monitor moves the pool into the hosts' credit at
//!   every check interval by weighted max-min fairness, groups nested.
//! - [`OperatingPoint`] (`operating_point`): first come's tokens, and excess admitted
//!   only while the commands in flight at the base are below `Q*` of the learned depth
//!   curve, in weighted start-time order among the hosts it holds.

mod first_come;
pub(crate) mod operating_point;
mod weighted;

use std::fmt;

pub(crate) use first_come::FirstCome;
pub(crate) use operating_point::OperatingPoint;
pub(crate) use weighted::Weighted;

use crate::config::{DomainConfig, ExcessSharing};
use crate::cost::Amount;
use crate::depth::{DepthCurve, OperatingTarget};
use crate::estimator::{CapacityEstimator, Evidence};
use crate::ledger::DomainShared;
use crate::time::Nanos;

use super::books::Books;
use super::members::Members;

/// The policy of a sharing mode.
pub(crate) fn policy_for(sharing: ExcessSharing) -> Box<dyn SharingPolicy> {
    match sharing {
        ExcessSharing::FirstCome => Box::new(FirstCome::default()),
        ExcessSharing::Weighted => Box::new(Weighted::default()),
        ExcessSharing::OperatingPoint => Box::new(OperatingPoint::default()),
    }
}

/// What a policy may read and change at a check interval.
#[derive(Debug)]
pub(crate) struct Interval<'a> {
    pub(crate) now: Nanos,
    /// `(T - t, T)` of the period.
    pub(crate) left: (u64, u64),
    /// Of `T`, how much of a paced reservation is released by now: the time elapsed
    /// plus the release burst, at most `T`.
    pub(crate) released: u64,
    /// Of `T`, how far a backlogged claimant may fall behind its released reservation
    /// before it is lagging (see the monitor's `IntervalView`).
    pub(crate) lag_slack: u64,
    /// Bit r: the global pool of resource r is closed to hosts that do not lag behind
    /// their reservation (reservations first).
    pub(crate) closed: u64,
    /// Bit r: some host with commands at the target now is behind its reservation
    /// schedule at all (see the monitor's `IntervalTotals`).
    pub(crate) behind_backlogged: u64,
    /// Bit r: some host is behind its schedule at all, with commands at the target or
    /// not.
    pub(crate) behind: u64,
    /// Per resource, how far the furthest behind host with commands at the target is
    /// behind its schedule (ns of the period).
    pub(crate) behind_ns: [u64; 2],
    /// Bit r: some host with commands at the target is within a few check intervals
    /// ahead of its schedule.
    pub(crate) close: u64,
    /// Work the hosts paid with global tokens (or credit) since the period started.
    pub(crate) used_global: [u64; 2],
    /// Haechi's global pool now: what the rest of the period can serve by the
    /// estimate beyond what is promised or in flight.
    pub(crate) haechi_bound: [u64; 2],
    /// The current period's pool tag.
    pub(crate) tag: u16,
    /// The capacity estimate sizing the period.
    pub(crate) budget: Amount,
    pub(crate) cfg: &'a DomainConfig,
    pub(crate) shared: &'a DomainShared,
    pub(crate) members: &'a mut Members,
    pub(crate) books: &'a mut Books,
}

/// A way of sharing the excess. Defaults describe a policy that leaves the global pool
/// to the channels (first come).
pub(crate) trait SharingPolicy: fmt::Debug + Send {
    /// It becomes the domain's policy: by default the domain's window of commands in
    /// flight is off (no slot is counted; slots taken before are still given back).
    fn attach(&mut self, shared: &DomainShared) {
        shared.window.disable();
        shared.probe_open.store(0, crate::sync::Ordering::Release);
    }

    /// The depth curve took a sample at `now` (the operating point may have moved).
    fn depth_learned(
        &mut self,
        _curve: &mut DepthCurve,
        _now: Nanos,
        _target: OperatingTarget,
        _shared: &DomainShared,
    ) {
    }

    /// Tenant groups can be used with it.
    fn supports_groups(&self) -> bool {
        false
    }

    /// Over the hosts' circulation by η: what the learner of N\* reports.
    fn circulation_probe(&self) -> Option<crate::circulation::ProbeReport> {
        None
    }

    /// Bit r: global tokens of resource r reach channels only as credit the policy
    /// hands out, never from the pool directly (the ledger's capability).
    /// `bytes_metered`: the domain has a bandwidth capacity.
    fn credit_only(&self, _bytes_metered: bool) -> u64 {
        0
    }

    /// It sets the global pool itself at every check interval (in [`SharingPolicy::share`])
    /// when reservations are `paced`: the monitor's conversion leaves the pool alone and
    /// never closes it for a lagging host (the policy protects reservations its own way).
    fn owns_pool(&self, _paced: bool) -> bool {
        false
    }

    /// The global pool is recomputed at every check interval, not only once some host
    /// has dipped into it (Haechi's step S2).
    fn converts_always(&self) -> bool {
        false
    }

    /// Of the work promised (reservations left, credit, caches: `outstanding`, of
    /// which `held` is not in flight), what the global pool must leave room for.
    fn promised(&self, outstanding: u64, _held: u64) -> u64 {
        outstanding
    }

    /// Runs at every check interval, after conversion.
    fn share(&mut self, _iv: Interval<'_>) {}

    /// What it handed out and the hosts still held at the period's end counts as
    /// offered to them (for the capacity estimator).
    fn counts_unused_as_offered(&self) -> bool {
        false
    }

    /// Evidence of demand beyond the offer in resource `r` over the ended period.
    fn demand_evidence(&self, _r: usize) -> Evidence {
        Evidence::None
    }

    /// The capacity estimator it works with.
    fn estimator(&self, e: CapacityEstimator) -> CapacityEstimator {
        e
    }

    /// A host's global batch and the most credit it may hold, from the domain's
    /// `batch`, the host's weight against the heaviest one's, and four check
    /// intervals of the whole capacity (`four_intervals`).
    fn host_batches(
        &self,
        batch: Amount,
        weight: u64,
        max_weight: u64,
        four_intervals: Amount,
    ) -> (Amount, Amount);

    /// A period starts at `start`.
    fn start_period(&mut self, _start: Nanos) {}
}

/// Four of `batch`: the credit a host may hold for cooperative acquisitions.
pub(crate) fn four(batch: Amount) -> Amount {
    Amount::new(batch.ops.saturating_mul(4), batch.bytes.saturating_mul(4))
}

#[cfg(test)]
mod tests {
    //! A policy is one type: this one, written here as a new mode would be in its own
    //! file, gives nobody the excess (reservations only).
    use super::*;
    use crate::config::{HostConfig, Rate, ReservationRelease, test_domain};
    use crate::cost::IoKind;
    use crate::monitor::{AddGroupError, Monitor, RefusalKind};

    #[derive(Debug)]
    struct ReservationsOnly;

    impl SharingPolicy for ReservationsOnly {
        fn credit_only(&self, bytes_metered: bool) -> u64 {
            1 | (bytes_metered as u64) << 1
        }
        fn host_batches(&self, batch: Amount, _: u64, _: u64, _: Amount) -> (Amount, Amount) {
            (batch, four(batch))
        }
    }

    fn domain(sharing: ExcessSharing) -> DomainConfig {
        test_domain(10_000, ReservationRelease::Start, sharing)
    }

    /// Two hosts ask for all they can get for one 1 s period; returns what each got.
    fn one_period(mut m: Monitor) -> (u64, u64, Monitor) {
        let t0 = Nanos::from_secs(10);
        let mut chans = [m.channel("res").unwrap(), m.channel("greedy").unwrap()];
        let mut got = [0u64; 2];
        for ms in 1..1000 {
            let now = t0.saturating_add(Nanos::from_millis(ms));
            for (k, ch) in chans.iter_mut().enumerate() {
                for _ in 0..40 {
                    if ch.try_admit(IoKind::Read, 4096, now).is_admitted() {
                        ch.record_completion(IoKind::Read, 4096);
                        got[k] += 1;
                    }
                }
                ch.flush();
            }
            m.tick(now);
        }
        (got[0], got[1], m)
    }

    fn two_hosts(m: &mut Monitor) {
        let t0 = Nanos::from_secs(10);
        let res = HostConfig::new("res").with_reservation(Rate::iops(3000));
        m.add_host(res, t0).unwrap();
        m.add_host(HostConfig::new("greedy"), t0).unwrap();
    }

    #[test]
    fn a_policy_of_its_own_decides_who_gets_the_excess() {
        let t0 = Nanos::from_secs(10);
        let mut m = Monitor::with_policy(
            domain(ExcessSharing::FirstCome),
            t0,
            Box::new(ReservationsOnly),
        )
        .unwrap();
        two_hosts(&mut m);
        let (res, greedy, _) = one_period(m);
        assert!((2990..=3000).contains(&res), "reserved host got {res}");
        assert_eq!(greedy, 0, "nobody shares the excess under this policy");

        // The same hosts under first come: the excess is taken.
        let mut m = Monitor::new(domain(ExcessSharing::FirstCome), t0).unwrap();
        two_hosts(&mut m);
        let (res, greedy, _) = one_period(m);
        assert!(res >= 2990, "reserved host got {res}");
        assert!(res + greedy > 9_000, "first come served {}", res + greedy);
    }

    #[test]
    fn groups_need_a_policy_that_supports_them() {
        let t0 = Nanos::from_secs(10);
        let group = crate::config::GroupConfig::new("g");
        let mut m = Monitor::new(domain(ExcessSharing::FirstCome), t0).unwrap();
        let e = m.add_group(group.clone(), t0).unwrap_err();
        assert!(matches!(e, AddGroupError::NeedsSharingByWeight));
        assert_eq!(e.kind(), RefusalKind::Invalid);
        let mut m = Monitor::new(domain(ExcessSharing::Weighted), t0).unwrap();
        m.add_group(group.clone(), t0).unwrap();
        let e = m.add_group(group, t0).unwrap_err();
        assert_eq!(e.kind(), RefusalKind::Exists);
    }
}
