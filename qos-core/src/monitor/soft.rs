//! Soft guarantees (seed 002): at each period's start, capacity beyond the hard
//! reservations goes to soft reservations class by class, highest first; within a
//! class in proportion to weight times the soft amount. A host that was neither
//! backlogged nor used half of its soft total for `underuse_periods` periods in a row
//! gets none until it is busy again, so an idle host does not pin capacity and a busy
//! one does not thrash.

use crate::config::PriorityClass;
use crate::cost::{Amount, Resource};

use super::host::{HostEntry, with_soft, within_reach};

/// Grants the soft reservations of a period whose capacity estimate is `budget`, and
/// sets every host's reservation of the period (hard, soft, within reach).
pub(crate) fn grant_soft(hosts: &mut [HostEntry], budget: Amount, underuse_periods: u32) {
    let hard = hosts.iter().fold(Amount::ZERO, |a, h| {
        a.saturating_add(h.budgets.reservation_total())
    });
    let mut avail = budget.saturating_sub(hard);
    for h in hosts.iter_mut() {
        h.period.soft_granted = Amount::ZERO;
    }
    for class in [
        PriorityClass::Urgent,
        PriorityClass::High,
        PriorityClass::Medium,
        PriorityClass::Low,
    ] {
        let members: Vec<usize> = (0..hosts.len())
            .filter(|&i| {
                let h = &hosts[i];
                h.budgets.priority == class
                    && !h.budgets.soft_extra.is_zero()
                    && !h.outcomes.soft_idle.flagged(underuse_periods)
            })
            .collect();
        for r in Resource::ALL {
            let given = grant_class(hosts, &members, r, avail.get(r));
            avail.set(r, avail.get(r).saturating_sub(given));
        }
    }
    for h in hosts.iter_mut() {
        h.period.res = with_soft(&h.budgets, h.period.soft_granted);
        if h.reach.periods > 0 {
            h.period.res = within_reach(h.period.res, h.reach.amount);
        }
    }
}

/// Grants one class's soft reservations of resource `r` from `pot`; returns what it gave.
fn grant_class(hosts: &mut [HostEntry], members: &[usize], r: Resource, pot: u64) -> u64 {
    let demand: u128 = members
        .iter()
        .map(|&i| hosts[i].budgets.soft_extra.get(r) as u128)
        .sum();
    if demand == 0 {
        return 0;
    }
    let weighted: u128 = members
        .iter()
        .map(|&i| hosts[i].budgets.soft_extra.get(r) as u128 * hosts[i].budgets.weight as u128)
        .sum();
    let pot = pot as u128;
    let mut given = 0u64;
    for &i in members {
        let h = &mut hosts[i];
        let want = h.budgets.soft_extra.get(r);
        let g = if demand <= pot {
            want
        } else {
            ((pot * want as u128 * h.budgets.weight as u128) / weighted).min(want as u128) as u64
        };
        h.period.soft_granted.set(r, g);
        given += g;
    }
    given
}
