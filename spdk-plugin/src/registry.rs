//! The plugin's configuration state: QoS domains (each a `qos_core::Monitor` ticked by
//! a poller on the app thread), their hosts, and the QoS bdevs (the stacked-bdev
//! skeleton's list, which also keeps the shared base descriptors). It lives in one global, touched only on SPDK's app thread (RPC
//! handlers, module callbacks, the monitor pollers); the I/O path never touches it.
//!
//! Hosts are *explicit* (set by `qos_host_set`) or *implicit*: a QoS bdev bound to a
//! host that no `qos_host_set` configured gets a best-effort host entry (no
//! reservation, no limit: global tokens only), so that every channel always has a
//! host ledger and none ever changes under it. `qos_host_set` turns an implicit host
//! into an explicit one in place; `qos_host_remove` on a host that still has QoS bdevs
//! turns it back into an implicit best-effort one (held I/O is then released by global
//! tokens); an implicit host disappears with its last QoS bdev.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, MutexGuard, TryLockError};

use qos_core::monitor::RefusalKind;
use qos_core::{DomainShared, HostConfig, HostShared, Monitor, Nanos};
use spdk_sys::poller::{PollStatus, Poller};
pub use spdk_sys::time::now;
use spdk_sys::vbdev::Vbdevs;

use crate::io::QosTgt;
use crate::params::{
    DomainParams, DomainUpdate, GroupParams, GroupUpdate, HostParams, HostUpdate, Refusal, code,
};

/// One QoS domain. Its settings are the monitor's configuration (as hosts' and
/// groups' are): [`Domain::params`] prints them back.
#[derive(Debug)]
pub struct Domain {
    pub monitor: Monitor,
    /// Hosts added on behalf of a QoS bdev, not by `qos_host_set`.
    pub implicit: BTreeSet<String>,
    /// Ticks the monitor at the check interval; dropped with the domain.
    poller: Option<Poller>,
}

/// Everything the plugin has configured.
#[derive(Debug, Default)]
pub struct Registry {
    pub domains: BTreeMap<String, Domain>,
    /// The QoS bdevs (and their shared base descriptors).
    pub bdevs: Vbdevs<QosTgt>,
}

static REGISTRY: Mutex<Registry> = Mutex::new(Registry {
    domains: BTreeMap::new(),
    bdevs: Vbdevs::new(),
});

/// Runs `f` on the registry. Only the app thread calls this, so the lock is never
/// contended; a nested call would be a re-entrancy bug and is reported as one instead
/// of deadlocking.
pub fn with<R>(f: impl FnOnce(&mut Registry) -> R) -> R {
    let mut g: MutexGuard<'_, Registry> = match REGISTRY.try_lock() {
        Ok(g) => g,
        Err(TryLockError::Poisoned(p)) => p.into_inner(),
        Err(TryLockError::WouldBlock) => {
            if spdk_sys::thread::Thread::on_app_thread() {
                panic!("nvmf-qos: registry re-entered on the app thread (bug)");
            }
            REGISTRY.lock().unwrap_or_else(|p| p.into_inner())
        }
    };
    f(&mut g)
}

fn unknown_domain(name: &str) -> Refusal {
    Refusal::new(code::ENOENT, format!("unknown QoS domain {name:?}"))
}

impl Domain {
    /// The domain's `qos_domain_create` parameters, as `qos_domain_get` and
    /// `save_config` print them.
    pub fn params(&self, name: &str) -> DomainParams {
        DomainParams::from_config(name, self.monitor.config())
    }
}

impl Registry {
    pub fn domain(&self, name: &str) -> Result<&Domain, Refusal> {
        self.domains.get(name).ok_or_else(|| unknown_domain(name))
    }
    pub fn domain_mut(&mut self, name: &str) -> Result<&mut Domain, Refusal> {
        self.domains
            .get_mut(name)
            .ok_or_else(|| unknown_domain(name))
    }

    /// QoS bdevs bound to `host` in `domain`.
    pub fn bdevs_of_host(&self, domain: &str, host: &str) -> usize {
        self.bdevs
            .iter()
            .filter(|(_, b, _)| b.domain == domain && b.host == host)
            .count()
    }

    /// The ledger handles a new QoS bdev of `host` in `domain` needs, adding an
    /// implicit best-effort host when the host is not configured.
    pub fn bind_host(
        &mut self,
        domain: &str,
        host: &str,
    ) -> Result<(Arc<DomainShared>, Arc<HostShared>), Refusal> {
        let d = self.domain_mut(domain)?;
        let shared = d.monitor.shared().clone();
        if let Some(h) = d.monitor.host(host) {
            return Ok((shared, h.clone()));
        }
        let h = d
            .monitor
            .add_host(HostConfig::new(host), now())
            .map_err(|e| Refusal::invalid(format!("host_nqn {host:?}: {e}")))?;
        d.implicit.insert(host.to_string());
        Ok((shared, h))
    }

    /// Called when a QoS bdev of `host` went away: drops an implicit host that no
    /// QoS bdev uses any more.
    pub fn unbind_host(&mut self, domain: &str, host: &str) {
        if self.bdevs_of_host(domain, host) > 0 {
            return;
        }
        if let Some(d) = self.domains.get_mut(domain)
            && d.implicit.remove(host)
        {
            let _ = d.monitor.remove_host(host, now());
        }
    }
}

/// Creates a domain and starts its monitor poller (app thread).
pub fn create_domain(p: DomainParams) -> Result<(), Refusal> {
    let cfg = p.to_config()?;
    let name = p.name.clone();
    with(|r| {
        if r.domains.contains_key(&name) {
            return Err(Refusal::new(
                code::EEXIST,
                format!("QoS domain {name:?} already exists"),
            ));
        }
        let monitor = Monitor::new(cfg, now())
            .map_err(|e| Refusal::invalid(format!("domain {name}: {e}")))?;
        r.domains.insert(
            name.clone(),
            Domain {
                monitor,
                implicit: BTreeSet::new(),
                poller: None,
            },
        );
        Ok(())
    })?;
    start_monitor(&name)
}

/// Most the monitor's tick may come after its deadline (a period's end included), µs.
const MONITOR_SLACK_US: u64 = 100;

/// (Re)registers the domain's monitor poller. It runs every `MONITOR_SLACK_US` (or the
/// check interval, if shorter) and ticks the monitor when the deadline the last tick
/// gave has passed: a period rolls over within that slack of its end, not up to a
/// whole check interval late (hosts held at a limit waited for it once a period).
fn start_monitor(name: &str) -> Result<(), Refusal> {
    let interval = with(|r| r.domain(name).map(|d| d.params(name).check_interval_us))?;
    let key = name.to_string();
    let mut due = Nanos(0);
    let poller = Poller::new(c"qos_monitor", interval.min(MONITOR_SLACK_US), move || {
        let at = now();
        if at < due {
            return PollStatus::Idle;
        }
        with(|r| match r.domains.get_mut(&key) {
            Some(d) => {
                let t = d.monitor.tick(at);
                due = t.next_deadline;
                if let Some(rep) = t.ended {
                    tracing::trace!(
                        domain = key.as_str(),
                        epoch = rep.epoch,
                        used_ops = rep.used.ops,
                        budget_ops = rep.budget.ops,
                        "QoS period ended"
                    );
                }
                PollStatus::Busy
            }
            None => PollStatus::Idle,
        })
    })
    .map_err(|e| Refusal::new(code::ENOMEM, format!("domain {name}: monitor poller: {e}")))?;
    // Replacing the old poller drops (unregisters) it.
    let old = with(|r| {
        r.domains
            .get_mut(name)
            .and_then(|d| d.poller.replace(poller))
    });
    drop(old);
    Ok(())
}

/// Applies `qos_domain_update`.
pub fn update_domain(u: &DomainUpdate) -> Result<(), Refusal> {
    let restart = with(|r| {
        let d = r.domain_mut(&u.name)?;
        let cfg = d.params(&u.name).updated(u).to_config()?;
        let restart = cfg.check_interval != d.monitor.config().check_interval;
        d.monitor
            .update_domain(cfg, now())
            .map_err(|e| refused(e.kind(), format!("domain {}: {e}", u.name)))?;
        if u.capacity_iops.is_some() || u.capacity_mibps.is_some() {
            // A capacity given again, even the same one, restarts the estimate there.
            d.monitor.reset_estimate();
        }
        Ok::<_, Refusal>(restart)
    })?;
    if restart {
        start_monitor(&u.name)?;
    }
    Ok(())
}

/// Deletes a domain that no QoS bdev uses.
pub fn delete_domain(name: &str) -> Result<(), Refusal> {
    let dropped = with(|r| {
        r.domain(name)?;
        let users: Vec<&str> = r
            .bdevs
            .iter()
            .filter(|(_, b, _)| b.domain == name)
            .map(|(n, _, _)| n)
            .collect();
        if !users.is_empty() {
            return Err(Refusal::new(
                code::EBUSY,
                format!(
                    "QoS domain {name:?} is used by QoS bdev(s) {}; delete them first",
                    users.join(", ")
                ),
            ));
        }
        Ok(r.domains.remove(name))
    })?;
    // The poller is unregistered outside the registry lock.
    drop(dropped);
    Ok(())
}

/// Applies `qos_host_set`: adds the host or replaces its settings in place.
pub fn set_host(p: &HostParams) -> Result<(), Refusal> {
    let cfg = p.to_config();
    with(|r| {
        let d = r.domain_mut(&p.domain)?;
        let res = if d.monitor.host(&p.host_nqn).is_some() {
            d.monitor
                .update_host(cfg, now())
                .map_err(|e| refused(e.kind(), e.to_string()))
        } else {
            d.monitor
                .add_host(cfg, now())
                .map(|_| ())
                .map_err(|e| refused(e.kind(), e.to_string()))
        };
        res?;
        d.implicit.remove(&p.host_nqn);
        Ok(())
    })
}

/// Applies `qos_host_update`: the given fields change, the others stay (a host that
/// `qos_host_set` did not configure is refused: it has nothing to keep).
pub fn update_host(u: &HostUpdate) -> Result<(), Refusal> {
    let old = with(|r| {
        host_params(r, &u.domain)?
            .into_iter()
            .find(|h| h.host_nqn == u.host_nqn)
            .ok_or_else(|| {
                Refusal::new(
                    code::ENOENT,
                    format!(
                        "host {:?} is not configured in QoS domain {:?}; configure it with qos_host_set",
                        u.host_nqn, u.domain
                    ),
                )
            })
    })?;
    set_host(&old.updated(u))
}

/// Applies `qos_host_remove`.
pub fn remove_host(domain: &str, host: &str) -> Result<(), Refusal> {
    with(|r| {
        let in_use = r.bdevs_of_host(domain, host) > 0;
        let d = r.domain_mut(domain)?;
        if d.monitor.host(host).is_none() || d.implicit.contains(host) {
            return Err(Refusal::new(
                code::ENOENT,
                format!("host {host:?} is not configured in QoS domain {domain:?}"),
            ));
        }
        if in_use {
            // Its QoS bdevs carry on best-effort with the same ledger.
            d.monitor
                .update_host(HostConfig::new(host), now())
                .map_err(|e| Refusal::invalid(e.to_string()))?;
            d.implicit.insert(host.to_string());
        } else {
            d.monitor
                .remove_host(host, now())
                .map_err(|e| refused(e.kind(), e.to_string()))?;
        }
        Ok(())
    })
}

/// Applies `qos_group_create`.
pub fn create_group(p: &GroupParams) -> Result<(), Refusal> {
    with(|r| {
        let d = r.domain_mut(&p.domain)?;
        d.monitor
            .add_group(p.to_config(), now())
            .map_err(|e| refused(e.kind(), format!("domain {}: {e}", p.domain)))
    })
}

/// Applies `qos_group_update`: the given fields change, the others stay.
pub fn update_group(u: &GroupUpdate) -> Result<(), Refusal> {
    with(|r| {
        let d = r.domain_mut(&u.domain)?;
        let old = d
            .monitor
            .group_configs()
            .find(|g| g.name == u.name)
            .map(|g| GroupParams::from_config(&u.domain, g))
            .ok_or_else(|| unknown_group(&u.domain, &u.name))?;
        d.monitor
            .update_group(old.updated(u).to_config(), now())
            .map_err(|e| refused(e.kind(), format!("domain {}: {e}", u.domain)))
    })
}

/// Applies `qos_group_delete` (refused while hosts belong to the group).
pub fn delete_group(domain: &str, name: &str) -> Result<(), Refusal> {
    with(|r| {
        let d = r.domain_mut(domain)?;
        d.monitor
            .remove_group(name, now())
            .map_err(|e| refused(e.kind(), format!("domain {domain}: {e}")))
    })
}

/// The one mapping of the monitor's refusals to errno values.
fn refused(kind: RefusalKind, message: String) -> Refusal {
    let c = match kind {
        RefusalKind::Invalid => code::EINVAL,
        RefusalKind::NoRoom => code::ENOSPC,
        RefusalKind::NotFound => code::ENOENT,
        RefusalKind::Exists => code::EEXIST,
        RefusalKind::Busy => code::EBUSY,
    };
    Refusal::new(c, message)
}

fn unknown_group(domain: &str, name: &str) -> Refusal {
    Refusal::new(
        code::ENOENT,
        format!("group {name:?} does not exist in QoS domain {domain:?}"),
    )
}

/// Groups of a domain, as `qos_group_create` parameters.
pub fn group_params(r: &Registry, domain: &str) -> Result<Vec<GroupParams>, Refusal> {
    let d = r.domain(domain)?;
    Ok(d.monitor
        .group_configs()
        .map(|g| GroupParams::from_config(domain, g))
        .collect())
}

/// One group of a domain.
pub fn group_param(r: &Registry, domain: &str, name: &str) -> Result<GroupParams, Refusal> {
    group_params(r, domain)?
        .into_iter()
        .find(|g| g.name == name)
        .ok_or_else(|| unknown_group(domain, name))
}

/// Explicit hosts of a domain, as `qos_host_set` parameters.
pub fn host_params(r: &Registry, domain: &str) -> Result<Vec<HostParams>, Refusal> {
    let d = r.domain(domain)?;
    Ok(d.monitor
        .host_configs()
        .filter(|c| !d.implicit.contains(&c.host_nqn))
        .map(|c| HostParams::from_config(domain, c))
        .collect())
}

/// Drops every domain (module fini, app thread): stops the monitor pollers.
pub fn clear_domains() {
    let all = with(|r| std::mem::take(&mut r.domains));
    drop(all);
}
