//! Who belongs to a domain: hosts, tenant groups and the domain's own settings, with
//! the admission check of every change and the errors a change can be refused with
//! (each with one [`RefusalKind`], which a plugin maps to an errno in one place).

use thiserror::Error;

use crate::admission::{
    AdmissionError, AdmissionReport, check_grouped_admission, check_operating_point,
};
use crate::burst::BurstBucket;
use crate::config::{
    ConfigError, DomainConfig, GroupBudgets, GroupConfig, HostBudgets, HostConfig, TokenMode,
};
use crate::cost::{Amount, RES};
use crate::ledger::{ChannelParams, HostShared};
use crate::sync::{Arc, Ordering};
use crate::time::{Nanos, mul_div};

use super::Monitor;
use super::capacity::make_estimators;
use super::host::{HostEntry, with_soft};
use super::members::{GroupEntry, Members};
use super::sharing;

/// What kind of refusal a change is: the caller's one mapping to its own error codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RefusalKind {
    /// A setting is out of range or does not fit the domain's settings.
    Invalid,
    /// The reservations would not fit the target (admission control).
    NoRoom,
    /// The host or group named does not exist.
    NotFound,
    /// The host or group exists already.
    Exists,
    /// The group still has hosts.
    Busy,
}

#[derive(Debug, Error)]
pub enum NewDomainError {
    #[error(transparent)]
    Config(#[from] ConfigError),
}

#[derive(Debug, Error)]
pub enum AddHostError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Admission(#[from] AdmissionError),
    #[error("host {0} is already configured in this domain; update it instead")]
    Duplicate(String),
    #[error("group {0} does not exist in this domain; create it first (qos_group_create)")]
    UnknownGroup(String),
}

#[derive(Debug, Error)]
pub enum UpdateHostError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Admission(#[from] AdmissionError),
    #[error("host {0} is not configured in this domain")]
    Unknown(String),
    #[error("group {0} does not exist in this domain; create it first (qos_group_create)")]
    UnknownGroup(String),
}

#[derive(Debug, Error)]
#[error("host {0} is not configured in this domain")]
pub struct RemoveHostError(pub String);

#[derive(Debug, Error)]
pub enum AddGroupError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Admission(#[from] AdmissionError),
    #[error("group {0} already exists in this domain; update it instead")]
    Duplicate(String),
    #[error(
        "tenant groups need sharing by weight; set the domain's sharing to operating_point or weighted first"
    )]
    NeedsSharingByWeight,
}

#[derive(Debug, Error)]
pub enum UpdateGroupError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Admission(#[from] AdmissionError),
    #[error("group {0} does not exist in this domain")]
    Unknown(String),
}

#[derive(Debug, Error)]
pub enum RemoveGroupError {
    #[error("group {0} does not exist in this domain")]
    Unknown(String),
    #[error(
        "group {group} still has hosts ({}); move them out first (qos_host_set without --group, or with another group)",
        .hosts.join(", ")
    )]
    HasHosts { group: String, hosts: Vec<String> },
}

#[derive(Debug, Error)]
pub enum UpdateDomainError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Admission(#[from] AdmissionError),
    #[error("host {host}: {source}")]
    Host { host: String, source: ConfigError },
    #[error("the cost model of a domain cannot change while it exists; create a new domain")]
    CostModelFixed,
    #[error(
        "the domain has tenant groups, which need sharing by weight (operating_point or weighted); delete them first"
    )]
    GroupsNeedSharingByWeight,
}

impl NewDomainError {
    pub fn kind(&self) -> RefusalKind {
        RefusalKind::Invalid
    }
}
impl AddHostError {
    pub fn kind(&self) -> RefusalKind {
        match self {
            Self::Config(_) => RefusalKind::Invalid,
            Self::Admission(_) => RefusalKind::NoRoom,
            Self::Duplicate(_) => RefusalKind::Exists,
            Self::UnknownGroup(_) => RefusalKind::NotFound,
        }
    }
}
impl UpdateHostError {
    pub fn kind(&self) -> RefusalKind {
        match self {
            Self::Config(_) => RefusalKind::Invalid,
            Self::Admission(_) => RefusalKind::NoRoom,
            Self::Unknown(_) | Self::UnknownGroup(_) => RefusalKind::NotFound,
        }
    }
}
impl RemoveHostError {
    pub fn kind(&self) -> RefusalKind {
        RefusalKind::NotFound
    }
}
impl AddGroupError {
    pub fn kind(&self) -> RefusalKind {
        match self {
            Self::Config(_) | Self::NeedsSharingByWeight => RefusalKind::Invalid,
            Self::Admission(_) => RefusalKind::NoRoom,
            Self::Duplicate(_) => RefusalKind::Exists,
        }
    }
}
impl UpdateGroupError {
    pub fn kind(&self) -> RefusalKind {
        match self {
            Self::Config(_) => RefusalKind::Invalid,
            Self::Admission(_) => RefusalKind::NoRoom,
            Self::Unknown(_) => RefusalKind::NotFound,
        }
    }
}
impl RemoveGroupError {
    pub fn kind(&self) -> RefusalKind {
        match self {
            Self::Unknown(_) => RefusalKind::NotFound,
            Self::HasHosts { .. } => RefusalKind::Busy,
        }
    }
}
impl UpdateDomainError {
    pub fn kind(&self) -> RefusalKind {
        match self {
            Self::Admission(_) => RefusalKind::NoRoom,
            _ => RefusalKind::Invalid,
        }
    }
}

impl Members {
    /// Every host's and group's budgets under domain settings `cfg`, checked for
    /// admission.
    fn budgets_under(
        &self,
        cfg: &DomainConfig,
    ) -> Result<(Vec<HostBudgets>, Vec<GroupBudgets>, AdmissionReport), UpdateDomainError> {
        let refused = |who: String| move |source| UpdateDomainError::Host { host: who, source };
        let hosts = self
            .hosts
            .iter()
            .map(|h| h.cfg.budgets(cfg).map_err(refused(h.cfg.host_nqn.clone())))
            .collect::<Result<Vec<_>, _>>()?;
        let groups = self
            .groups
            .iter()
            .map(|g| {
                g.cfg
                    .budgets(cfg)
                    .map_err(refused(format!("group {}", g.cfg.name)))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let named: Vec<(&str, &GroupBudgets)> = self
            .groups
            .iter()
            .zip(&groups)
            .map(|(g, b)| (g.cfg.name.as_str(), b))
            .collect();
        let report = check_grouped_admission(
            cfg,
            self.hosts
                .iter()
                .zip(&hosts)
                .map(|(h, b)| (h.cfg.host_nqn.as_str(), b, h.cfg.group.as_deref())),
            &named,
        )?;
        Ok((hosts, groups, report))
    }
}

impl Monitor {
    /// Admission report of the current host set.
    pub fn admission(&self) -> Result<AdmissionReport, AdmissionError> {
        self.members.admit(&self.cfg, None, None)
    }

    /// [`Members::admit`] under domain settings `cfg`, and, for a change that reserves
    /// more, the operating point's C\* on the curve learned by `now`
    /// ([`check_operating_point`]).
    fn admit_change(
        &self,
        cfg: &DomainConfig,
        now: Nanos,
        host: Option<(&str, &HostBudgets, Option<&str>)>,
        group: Option<(&str, &GroupBudgets)>,
    ) -> Result<AdmissionReport, AdmissionError> {
        let report = self.members.admit(cfg, host, group)?;
        if let Some(op) = self.depth.operating_point(now, cfg.operating_target()) {
            let before = self.admission().map_or(u64::MAX, |r| r.reserved.ops);
            let curve = self.depth.curve(now);
            check_operating_point(cfg, (before, report.reserved.ops), &op, &curve)?;
        }
        Ok(report)
    }

    /// Creates a tenant group. Its reservation is set aside from the next check
    /// interval on (the global pool is recomputed then).
    pub fn add_group(&mut self, cfg: GroupConfig, now: Nanos) -> Result<(), AddGroupError> {
        self.clock.observe(now);
        if !self.policy.supports_groups() {
            return Err(AddGroupError::NeedsSharingByWeight);
        }
        if self.members.find_group(&cfg.name).is_some() {
            return Err(AddGroupError::Duplicate(cfg.name));
        }
        let budgets = cfg.budgets(&self.cfg)?;
        self.admit_change(&self.cfg, now, None, Some((&cfg.name, &budgets)))?;
        self.members.groups.push(GroupEntry {
            cfg,
            burst: BurstBucket::full(&budgets.burst),
            budgets,
            surplus: Amount::ZERO,
            surplus_released: [0; 2],
            given: [0; 2],
            burst_ns: [0; 2],
        });
        self.members.refresh_groups();
        Ok(())
    }

    /// Changes a group's reservation, limit or weight in place.
    pub fn update_group(&mut self, cfg: GroupConfig, now: Nanos) -> Result<(), UpdateGroupError> {
        self.clock.observe(now);
        let g = self
            .members
            .find_group(&cfg.name)
            .ok_or_else(|| UpdateGroupError::Unknown(cfg.name.clone()))?;
        let budgets = cfg.budgets(&self.cfg)?;
        self.admit_change(&self.cfg, now, None, Some((&cfg.name, &budgets)))?;
        let period = self.cfg.period;
        let ge = &mut self.members.groups[g];
        ge.burst
            .rebudget(&ge.budgets.burst, &budgets.burst, (period, period));
        ge.cfg = cfg;
        ge.budgets = budgets;
        // What its hosts were admitted before its burst was switched on is not paid for.
        for h in &mut self.members.hosts {
            if h.group == Some(g) {
                h.admitted_since_last();
            }
        }
        self.members.refresh_groups();
        Ok(())
    }

    /// Deletes a group that has no hosts left.
    pub fn remove_group(&mut self, name: &str, now: Nanos) -> Result<(), RemoveGroupError> {
        self.clock.observe(now);
        let g = self
            .members
            .find_group(name)
            .ok_or_else(|| RemoveGroupError::Unknown(name.to_string()))?;
        let hosts: Vec<String> = self
            .members
            .hosts
            .iter()
            .filter(|h| h.group == Some(g))
            .map(|h| h.cfg.host_nqn.clone())
            .collect();
        if !hosts.is_empty() {
            return Err(RemoveGroupError::HasHosts {
                group: name.to_string(),
                hosts,
            });
        }
        self.members.groups.remove(g);
        self.members.refresh_groups();
        Ok(())
    }

    /// Adds a host. Its reservation and limit start prorated to the rest of the period.
    pub fn add_host(
        &mut self,
        cfg: HostConfig,
        now: Nanos,
    ) -> Result<Arc<HostShared>, AddHostError> {
        let now = self.clock.observe(now);
        if self.members.find(&cfg.host_nqn).is_some() {
            return Err(AddHostError::Duplicate(cfg.host_nqn));
        }
        let budgets = cfg.budgets(&self.cfg)?;
        if let Some(g) = cfg.group.as_deref()
            && self.members.find_group(g).is_none()
        {
            return Err(AddHostError::UnknownGroup(g.to_string()));
        }
        self.admit_change(
            &self.cfg,
            now,
            Some((&cfg.host_nqn, &budgets, cfg.group.as_deref())),
            None,
        )?;
        let id = self.members.next_host_id;
        self.members.next_host_id += 1;
        let shared = Arc::new(HostShared::new(
            id,
            cfg.host_nqn.clone(),
            self.shared.clone(),
            &ChannelParams::default(),
            self.tag(),
        ));
        let entry = HostEntry::new(cfg, budgets, shared.clone(), now, self.epoch);
        let max_weight_before = self.max_weight();
        self.members.hosts.push(entry);
        self.members.nqns_cache = None;
        self.members.refresh_groups();
        let left = self.left_fraction(now);
        let h = self.members.hosts.last().expect("just added");
        h.arm_pools(self.tag(), left, &mut self.books.audit);
        // Its reservation comes out of the unreserved pool.
        let added = h.reserved();
        for r in 0..2 {
            let v = mul_div(added.get(RES[r]), left.0, left.1);
            self.books
                .move_global(&self.shared, self.epoch as u16, r, -(v as i128));
        }
        self.refresh_params_after_host_change(
            Some(self.members.hosts.len() - 1),
            max_weight_before,
        );
        Ok(shared)
    }

    /// Changes a host's settings in place: connected hosts keep their queues, and the
    /// new reservation and limit apply, prorated, to the rest of the current period.
    pub fn update_host(&mut self, cfg: HostConfig, now: Nanos) -> Result<(), UpdateHostError> {
        let now = self.clock.observe(now);
        let i = self
            .members
            .find(&cfg.host_nqn)
            .ok_or_else(|| UpdateHostError::Unknown(cfg.host_nqn.clone()))?;
        let budgets = cfg.budgets(&self.cfg)?;
        if let Some(g) = cfg.group.as_deref()
            && self.members.find_group(g).is_none()
        {
            return Err(UpdateHostError::UnknownGroup(g.to_string()));
        }
        self.admit_change(
            &self.cfg,
            now,
            Some((&cfg.host_nqn, &budgets, cfg.group.as_deref())),
            None,
        )?;
        let max_weight_before = self.max_weight();
        let (num, den) = self.left_fraction(now);
        let tag = self.tag();
        let audit = &mut self.books.audit;
        let h = &mut self.members.hosts[i];
        let soft = Amount::new(
            h.period.soft_granted.ops.min(budgets.soft_extra.ops),
            h.period.soft_granted.bytes.min(budgets.soft_extra.bytes),
        );
        let new_pr = with_soft(&budgets, soft);
        let mut global_delta = [0i128; 2];
        // Adjust the live pools by the prorated difference, never below zero.
        for p in 0..2 {
            for r in 0..2 {
                let delta = mul_div(new_pr[p].get(RES[r]), num, den) as i128
                    - mul_div(h.period.res[p].get(RES[r]), num, den) as i128;
                let before = audit.issued[r];
                audit.adjust(&h.shared.res[p][r], r, tag, delta);
                global_delta[r] -= audit.issued[r] - before;
            }
        }
        let old_limit = h.limit();
        let period = self.cfg.period;
        h.burst
            .rebudget(&h.budgets.burst, &budgets.burst, (period, period));
        // What it was admitted before its burst was switched on is not paid for.
        h.admitted_since_last();
        h.period.res = new_pr;
        h.period.soft_granted = soft;
        h.budgets = budgets;
        h.cfg = cfg;
        h.retarget_limits(&old_limit, &h.limit(), (num, den), tag);
        // What the reservation gained comes out of the unreserved pool, and the reverse.
        for (r, d) in global_delta.into_iter().enumerate() {
            self.books.move_global(&self.shared, tag, r, d);
        }
        self.members.refresh_groups();
        self.refresh_params_after_host_change(Some(i), max_weight_before);
        Ok(())
    }

    /// Removes a host. Its reservation returns to the pool; channels still bound to it
    /// carry on best-effort (global tokens only, no limit), so held I/O is not stranded.
    pub fn remove_host(&mut self, nqn: &str, now: Nanos) -> Result<(), RemoveHostError> {
        self.clock.observe(now);
        let i = self
            .members
            .find(nqn)
            .ok_or_else(|| RemoveHostError(nqn.to_string()))?;
        let max_weight_before = self.max_weight();
        let h = self.members.hosts.remove(i);
        self.members.nqns_cache = None;
        let tag = self.tag();
        for p in 0..2 {
            for r in 0..2 {
                let (t, c) = h.shared.res[p][r].replace(tag, 0);
                if t == tag {
                    // Its unused reservation becomes unreserved capacity.
                    self.books.audit.issued[r] -= c as i128;
                    self.books.move_global(&self.shared, tag, r, c as i128);
                }
            }
        }
        // Pools armed ahead for the next period are taken back: a detached host has
        // no reservation (the roll-over arms only its credit).
        let next = (self.epoch + 1) as u16;
        for r in 0..2 {
            for pool in [
                &h.shared.res[0][r],
                &h.shared.res[1][r],
                &h.shared.credit[r],
            ] {
                let (t, c) = pool.replace(next, 0);
                self.books.audit.rearmed(r, next, t, c);
            }
        }
        h.shared.write_params(&self.best_effort_params());
        self.members.detached.push(h.shared);
        self.members.refresh_groups();
        self.refresh_params_after_host_change(None, max_weight_before);
        Ok(())
    }

    /// Forgets what the capacity estimators learned: they start again from the
    /// capacity given (an operator who sends the same capacity again means it).
    pub fn reset_estimate(&mut self) {
        self.estimators = make_estimators(&self.cfg, self.policy.as_ref());
    }

    fn set_bypass(&mut self, bypass: bool) {
        self.cfg.bypass = bypass;
        self.shared.bypass.store(bypass as u64, Ordering::Release);
    }

    /// Replaces the domain settings (capacity, period, batch, estimator, sharing...).
    /// The current period ends now and a new one starts with the new settings.
    pub fn update_domain(
        &mut self,
        cfg: DomainConfig,
        now: Nanos,
    ) -> Result<(), UpdateDomainError> {
        let now = self.clock.observe(now);
        cfg.validate()?;
        // Only the bypass changed: the period, the estimate and the pools go on (an
        // operator may flip it under load, the instrument every second).
        let bypass_only = DomainConfig {
            bypass: self.cfg.bypass,
            ..cfg.clone()
        } == self.cfg;
        if bypass_only {
            self.set_bypass(cfg.bypass);
            return Ok(());
        }
        if cfg.cost != self.cfg.cost {
            return Err(UpdateDomainError::CostModelFixed);
        }
        let policy = sharing::policy_for(cfg.sharing);
        if !policy.supports_groups() && !self.members.groups.is_empty() {
            return Err(UpdateDomainError::GroupsNeedSharingByWeight);
        }
        let (host_budgets, group_budgets, report) = self.members.budgets_under(&cfg)?;
        // The operating point: a new one (or more reserved) must still hold the
        // reservations. Compared per second (the period may change).
        if let Some(op) = self.depth.operating_point(now, cfg.operating_target()) {
            let curve = self.depth.curve(now);
            let per_sec = |c: &DomainConfig, v: u64| mul_div(v, Nanos::from_secs(1).0, c.period.0);
            let before = if cfg.operating_target() != self.cfg.operating_target() {
                0
            } else {
                self.admission()
                    .map_or(u64::MAX, |r| per_sec(&self.cfg, r.reserved.ops))
            };
            let after = per_sec(&cfg, report.reserved.ops);
            check_operating_point(
                &cfg,
                (cfg.per_period(before), cfg.per_period(after)),
                &op,
                &curve,
            )?;
        }
        let capacity_changed = cfg.capacity != self.cfg.capacity
            || cfg.period != self.cfg.period
            || cfg.sharing != self.cfg.sharing;
        if cfg.sharing != self.cfg.sharing {
            self.policy = policy;
            self.policy.attach(&self.shared);
        }
        let periods = (self.cfg.period, cfg.period);
        self.set_bypass(cfg.bypass);
        self.cfg = cfg;
        if capacity_changed {
            self.estimators = make_estimators(&self.cfg, self.policy.as_ref());
        }
        for (h, b) in self.members.hosts.iter_mut().zip(host_budgets) {
            h.burst.rebudget(&h.budgets.burst, &b.burst, periods);
            h.budgets = b;
        }
        for (g, b) in self.members.groups.iter_mut().zip(group_budgets) {
            g.burst.rebudget(&g.budgets.burst, &b.burst, periods);
            g.budgets = b;
        }
        self.members.refresh_groups();
        self.shared
            .period
            .store(self.cfg.period.0, Ordering::Release);
        self.shared.conversion.store(
            (self.cfg.mode == TokenMode::Haechi) as u64,
            Ordering::Release,
        );
        self.roll_over_at(now);
        self.refresh_all_params();
        for h in &self.members.detached {
            h.write_params(&self.best_effort_params());
        }
        Ok(())
    }
}
