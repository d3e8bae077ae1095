//! What the monitor tells each host's channels: their [`ChannelParams`] (batches, limits,
//! the capacity), recomputed and published when the configuration, the host set or a
//! host's reservation of the period changes, and the params a removed host's channels
//! carry on with.

use super::{Monitor, sharing};
use crate::config::UNLIMITED;
use crate::cost::Amount;
use crate::ledger::{ChannelParams, clamp_pool};
use crate::time::mul_div;

impl Monitor {
    /// What a removed host's channels carry on with: global tokens only, no limit.
    pub(super) fn best_effort_params(&self) -> ChannelParams {
        let batch = self.cfg.batch();
        ChannelParams {
            together: true,
            limit_mask: 0,
            limit: [Amount::new(UNLIMITED, UNLIMITED); 3],
            res_batch: Amount::ZERO,
            global_batch: batch,
            limit_batch: Amount::ZERO,
            capacity: self.clamp_capacity(),
            credit_cap: sharing::four(batch),
            pool_res: [Amount::ZERO; 2],
            configured: false,
            bursting: false,
        }
    }

    pub(super) fn clamp_capacity(&self) -> Amount {
        let c = self.cfg.capacity_per_period();
        Amount::new(clamp_pool(c.ops).max(1), clamp_pool(c.bytes).max(1))
    }

    /// Recomputes and publishes every host's params (batches depend on the host set).
    pub(super) fn refresh_all_params(&mut self) {
        self.refresh_params(false);
    }

    /// The largest weight of the hosts (1 without hosts): the first-come policy scales
    /// every host's batch by its weight over this one.
    pub(super) fn max_weight(&self) -> u64 {
        self.members
            .hosts
            .iter()
            .map(|h| h.budgets.weight)
            .max()
            .unwrap_or(1)
            .max(1) as u64
    }

    /// Publishes what a change of one host needs: host `changed`'s params (none for a
    /// removal), or every host's when the largest weight is no longer
    /// `max_weight_before`. A host's params depend on the domain's settings, its own
    /// budgets and the largest weight only, so at a thousand hosts a `qos_host_set`
    /// does not rewrite a thousand hosts' params.
    pub(super) fn refresh_params_after_host_change(
        &mut self,
        changed: Option<usize>,
        max_weight_before: u64,
    ) {
        let max_w = self.max_weight();
        if max_w != max_weight_before {
            return self.refresh_all_params();
        }
        let (batch, capacity, four_intervals) = self.params_inputs();
        if let Some(h) = changed.and_then(|i| self.members.hosts.get_mut(i)) {
            let w = h.budgets.weight as u64;
            let batches = self.policy.host_batches(batch, w, max_w, four_intervals);
            h.publish_params(batch, capacity, batches);
        }
    }

    /// What every host's params are computed from besides its own budgets and the
    /// largest weight: the global batch, the capacity and four check intervals of it.
    pub(super) fn params_inputs(&self) -> (Amount, Amount, Amount) {
        let capacity = self.clamp_capacity();
        let four = |c: u64| mul_div(c, 4 * self.cfg.check_interval.0, self.cfg.period.0);
        let four_intervals = Amount::new(four(capacity.ops), four(capacity.bytes));
        (self.cfg.batch(), capacity, four_intervals)
    }

    /// Recomputes every host's params and publishes them, or with `only_changed` only
    /// those of hosts whose reservation of the period changed since they were last
    /// published (the rest depends on the configuration and the host set, whose
    /// changes publish everything).
    pub(super) fn refresh_params(&mut self, only_changed: bool) {
        let (batch, capacity, four_intervals) = self.params_inputs();
        let max_w = self.max_weight();
        for h in self.members.hosts.iter_mut() {
            if only_changed
                && h.period.published_res == h.period.res
                && h.period.published_limit == h.limit()
            {
                continue;
            }
            let w = h.budgets.weight as u64;
            let batches = self.policy.host_batches(batch, w, max_w, four_intervals);
            h.publish_params(batch, capacity, batches);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{DomainConfig, ExcessSharing, HostConfig, ReservationRelease, test_domain};
    use crate::time::Nanos;

    #[test]
    fn a_host_change_republishes_the_others_only_when_the_largest_weight_moves() {
        let cfg = DomainConfig {
            global_batch: crate::config::BatchSize::Fixed {
                ops: 64,
                bytes: 1 << 20,
            },
            ..test_domain(
                1_000_000,
                ReservationRelease::Paced,
                ExcessSharing::FirstCome,
            )
        };
        let mut m = Monitor::new(cfg, Nanos::ZERO).unwrap();
        let host = |n: &str, weight: u32| HostConfig {
            weight,
            ..HostConfig::new(n)
        };
        m.add_host(host("a", 1), Nanos::ZERO).unwrap();
        m.add_host(host("b", 2), Nanos::ZERO).unwrap();
        let batch_of = |m: &Monitor, n: &str| m.host(n).unwrap().read_params().global_batch.ops;
        // First come scales a host's batch by its weight over the largest.
        assert_eq!((batch_of(&m, "a"), batch_of(&m, "b")), (32, 64));
        // A heavier host: every batch is rescaled.
        m.add_host(host("c", 4), Nanos::ZERO).unwrap();
        assert_eq!(
            (batch_of(&m, "a"), batch_of(&m, "b"), batch_of(&m, "c")),
            (16, 32, 64)
        );
        // The heaviest made lighter, then removed: back each time.
        m.update_host(host("c", 1), Nanos::ZERO).unwrap();
        assert_eq!(
            (batch_of(&m, "a"), batch_of(&m, "b"), batch_of(&m, "c")),
            (32, 64, 32)
        );
        m.update_host(host("c", 4), Nanos::ZERO).unwrap();
        m.remove_host("c", Nanos::ZERO).unwrap();
        assert_eq!((batch_of(&m, "a"), batch_of(&m, "b")), (32, 64));
        // A change below the largest weight touches that host only, and is published.
        m.update_host(host("a", 2), Nanos::ZERO).unwrap();
        assert_eq!((batch_of(&m, "a"), batch_of(&m, "b")), (64, 64));
    }
}
