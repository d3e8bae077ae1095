//! The domain's hosts and tenant groups as the monitor keeps them: lookup by name, the
//! admission check of the set with one member changed, and the groups' links to their
//! hosts. The changes themselves (add, update, remove) and their errors are in
//! [`super::membership`].

use crate::admission::{AdmissionError, AdmissionReport, check_grouped_admission};
use crate::burst::BurstBucket;
use crate::config::{DomainConfig, GroupBudgets, GroupConfig, HostBudgets};
use crate::cost::Amount;
use crate::ledger::HostShared;
use crate::sync::Arc;

use super::host::HostEntry;

/// A tenant group of the domain.
#[derive(Debug)]
pub(crate) struct GroupEntry {
    pub(crate) cfg: GroupConfig,
    pub(crate) budgets: GroupBudgets,
    /// The group's reservation beyond its hosts' own, per period (guaranteed to its
    /// hosts together, released paced and split by weight among the backlogged ones).
    pub(crate) surplus: Amount,
    /// Of `surplus`, what was released so far this period.
    pub(crate) surplus_released: [u64; 2],
    /// Tokens given to its hosts this period beyond their own reservations: counted
    /// against the group's limit.
    pub(crate) given: [u64; 2],
    /// Its burst credit, and how long it burst this period per resource (its limit
    /// allows the burst's excess over that time on top of the limit's).
    pub(crate) burst: BurstBucket,
    pub(crate) burst_ns: [u64; 2],
}

/// The domain's hosts and groups.
#[derive(Debug, Default)]
pub(crate) struct Members {
    pub(crate) hosts: Vec<HostEntry>,
    pub(crate) groups: Vec<GroupEntry>,
    /// Removed hosts whose channels may still run: kept best-effort and re-armed each
    /// period.
    pub(crate) detached: Vec<Arc<HostShared>>,
    pub(super) next_host_id: u32,
    /// NQNs for period reports; dropped when hosts are added or removed.
    pub(super) nqns_cache: Option<std::sync::Arc<[String]>>,
    /// Some host or group has a burst: the monitor steps burst buckets.
    pub(crate) bursts: bool,
}

impl Members {
    pub(crate) fn find(&self, nqn: &str) -> Option<usize> {
        self.hosts.iter().position(|h| h.cfg.host_nqn == nqn)
    }

    pub(crate) fn find_group(&self, name: &str) -> Option<usize> {
        self.groups.iter().position(|g| g.cfg.name == name)
    }

    /// The NQNs of the hosts, in order; rebuilt only when the host set changed.
    pub(crate) fn nqns(&mut self) -> std::sync::Arc<[String]> {
        self.nqns_cache
            .get_or_insert_with(|| self.hosts.iter().map(|h| h.cfg.host_nqn.clone()).collect())
            .clone()
    }

    /// Admission check of the current host and group set with one host (with its
    /// group) and/or one group replaced or added.
    pub(crate) fn admit(
        &self,
        cfg: &DomainConfig,
        host: Option<(&str, &HostBudgets, Option<&str>)>,
        group: Option<(&str, &GroupBudgets)>,
    ) -> Result<AdmissionReport, AdmissionError> {
        let mut list: Vec<(&str, &HostBudgets, Option<&str>)> = self
            .hosts
            .iter()
            .filter(|h| host.is_none_or(|(n, _, _)| n != h.cfg.host_nqn))
            .map(|h| (h.cfg.host_nqn.as_str(), &h.budgets, h.cfg.group.as_deref()))
            .collect();
        list.extend(host);
        let mut groups: Vec<(&str, &GroupBudgets)> = self
            .groups
            .iter()
            .filter(|g| group.is_none_or(|(n, _)| n != g.cfg.name))
            .map(|g| (g.cfg.name.as_str(), &g.budgets))
            .collect();
        groups.extend(group);
        check_grouped_admission(cfg, list, &groups)
    }

    /// Re-resolves every host's group index and each group's surplus reservation
    /// (after any change of hosts or groups).
    pub(crate) fn refresh_groups(&mut self) {
        for g in &mut self.groups {
            g.surplus = g.budgets.reservation;
        }
        self.bursts = self.hosts.iter().any(|h| h.budgets.burst.any())
            || self.groups.iter().any(|g| g.budgets.burst.any());
        for h in &mut self.hosts {
            h.group = h
                .cfg
                .group
                .as_deref()
                .and_then(|n| self.groups.iter().position(|g| g.cfg.name == n));
            if let Some(g) = h.group {
                let s = &mut self.groups[g].surplus;
                *s = s.saturating_sub(h.budgets.reservation_total());
            }
        }
    }
}
