//! Demand as the agent measures it: each host's completed work and the time its
//! commands waited in QoS at its target, turned into a rate and a "held" flag over a
//! sliding window (the domain's period by default), from counter samples the agent
//! takes every interval. A window shorter than a period lets the division follow a move
//! within a period instead of waiting for the target's period to end.
//!
//! Held means wanting more than the target gives: commands waited in QoS over the
//! window, at least one at a time on average and at least a millisecond each.
//! A host that gets all it asks has commands held now and then, for microseconds, when
//! a burst meets the paced release; counting any hold (the target's per-period
//! `backlogged` flag) made every path look held, and the division then splits evenly
//! whatever the demand.

use std::collections::{BTreeMap, VecDeque};

use qos_core::cluster::{LocalShare, PathDemand};

use crate::target::HostCounters;

/// A host counts as held (wanting more than it gets) when, over the window, at least
/// one of its commands waited in QoS on average and its commands waited at least
/// [`HELD_WAIT_NS`] each on average (Little's law: the mean wait is the average number
/// waiting over the rate). A host whose commands come in bursts (an initiator's own
/// rate limit releases them per millisecond) at a share just above its rate has a few
/// waiting now and then, for a fraction of a millisecond each (0.1-0.4 ms in the
/// two-target test); one held for good waits for several milliseconds (about 100
/// commands of its 128 waiting at 17,000 IOPS there: 6 ms).
pub const HELD_MILLI: u64 = 1000;
/// See [`HELD_MILLI`]: one millisecond.
pub const HELD_WAIT_NS: u64 = 1_000_000;

/// A host with a MiB/s limit share at this target counts as held only when it was
/// served at least this many thousandths of one of its limit shares here (950): a
/// large command waits for its own size of paced tokens (1 MiB: 20-30 ms at tens of
/// MiB/s), so a writer served below its share has commands waiting too, and the wait
/// rule alone called every path of a MiB/s writer held (docs/cluster.md, "Not
/// built", until 2026-11-29). A path the division gave its demand plus headroom (10 %
/// by default) is served at about 91 % of its share; one held at its limit at 99-100 %.
pub const NEAR_LIMIT_MILLI: u64 = 950;

/// Applies [`NEAR_LIMIT_MILLI`] to `demand` with the hosts' `settings` here: a host
/// with a MiB/s limit share stays held only if it was served near that share, or near
/// its IOPS limit share if it has one. Hosts without a MiB/s limit keep the wait rule.
pub fn held_near_a_limit(
    demand: &mut BTreeMap<String, PathDemand>,
    settings: &BTreeMap<String, LocalShare>,
) {
    let near =
        |served: u64, share: u64| served as u128 * 1000 >= share as u128 * NEAR_LIMIT_MILLI as u128;
    for (nqn, d) in demand.iter_mut() {
        let Some(s) = settings.get(nqn) else { continue };
        let Some(mibps) = s.limit_mibps else { continue };
        let at_bytes = near(d.served_bytes, mibps << 20);
        let at_ops = s.limit_iops.is_some_and(|l| near(d.served, l));
        d.backlogged &= at_bytes || at_ops;
    }
}

/// Counter samples per host, newest last.
#[derive(Debug, Default)]
pub struct DemandMeter {
    samples: BTreeMap<String, VecDeque<(u64, HostCounters)>>,
}

impl DemandMeter {
    /// Takes the samples of `now_ms` and returns each host's demand over the last
    /// `window_ms` or more (hosts sampled for less than that are left out: a cold path).
    /// Counters that went backwards (the host was removed and added again, the target
    /// restarted) start the host's window afresh.
    pub fn observe(
        &mut self,
        now_ms: u64,
        counters: &BTreeMap<String, HostCounters>,
        window_ms: u64,
    ) -> BTreeMap<String, PathDemand> {
        self.samples.retain(|n, _| counters.contains_key(n));
        let mut out = BTreeMap::new();
        for (nqn, &c) in counters {
            // The name is cloned only for a host seen for the first time (at 1,000
            // hosts an entry() a host was 1,000 allocations an interval for nothing).
            if !self.samples.contains_key(nqn) {
                self.samples.insert(nqn.clone(), VecDeque::new());
            }
            let q = self.samples.get_mut(nqn).expect("inserted above");
            if q.back().is_some_and(|&(t, last)| {
                t > now_ms || last.completed_ops > c.completed_ops || last.held_ns > c.held_ns
            }) {
                q.clear();
            }
            q.push_back((now_ms, c));
            // Keep the newest sample at least a window old, and what came after it.
            while q.len() > 2 && now_ms - q[1].0 >= window_ms {
                q.pop_front();
            }
            let (t0, c0) = q[0];
            let dt = now_ms - t0;
            if dt < window_ms.max(1) {
                continue;
            }
            let ops = c.completed_ops - c0.completed_ops;
            let bytes = c.completed_bytes.saturating_sub(c0.completed_bytes);
            // Summed wait over the window's length: commands waiting on average.
            let held_milli = ((c.held_ns - c0.held_ns) as u128 / (dt as u128 * 1000))
                .min(u64::MAX as u128) as u64;
            out.insert(
                nqn.clone(),
                PathDemand {
                    served: (ops as u128 * 1000 / dt as u128).min(u64::MAX as u128) as u64,
                    backlogged: held_milli >= HELD_MILLI
                        && (c.held_ns - c0.held_ns) >= ops.saturating_mul(HELD_WAIT_NS),
                    held_milli,
                    served_bytes: (bytes as u128 * 1000 / dt as u128).min(u64::MAX as u128) as u64,
                },
            );
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(ops: u64, held_ms: u64) -> BTreeMap<String, HostCounters> {
        BTreeMap::from([(
            "h".to_string(),
            HostCounters {
                completed_ops: ops,
                completed_bytes: ops * 4096,
                held_ns: held_ms * 1_000_000,
            },
        )])
    }

    #[test]
    fn rate_and_held_over_the_window() {
        let mut m = DemandMeter::default();
        assert!(m.observe(0, &at(0, 0), 250).is_empty(), "no window yet");
        assert!(m.observe(100, &at(100, 0), 250).is_empty());
        assert!(m.observe(200, &at(200, 0), 250).is_empty());
        let d = m.observe(300, &at(300, 0), 250);
        assert_eq!(
            (d["h"].served, d["h"].held_milli, d["h"].backlogged),
            (1000, 0, false)
        );
        assert_eq!(d["h"].served_bytes, 1000 * 4096);
        // A burst held briefly (3 ms waited in 300 ms) is not wanting more.
        let d = m.observe(400, &at(350, 3), 250);
        assert_eq!(
            (d["h"].served, d["h"].held_milli, d["h"].backlogged),
            (833, 10, false)
        );
        // Held from then on: about five commands waiting at any time.
        for t in [500, 600, 700] {
            m.observe(t, &at(350 + (t - 400) / 2, 3 + 5 * (t - 400)), 250);
        }
        let d = m.observe(800, &at(550, 2003), 250);
        assert_eq!(
            (d["h"].served, d["h"].held_milli, d["h"].backlogged),
            (500, 5000, true)
        );
    }

    #[test]
    fn many_waiting_briefly_at_a_high_rate_is_not_held() {
        let mut m = DemandMeter::default();
        m.observe(0, &at(0, 0), 1000);
        // 100,000 ops in a second with 5 s of waits summed: 5 waiting, 50 us each.
        let d = m.observe(1000, &at(100_000, 5000), 1000);
        assert_eq!((d["h"].held_milli, d["h"].backlogged), (5000, false));
        // The same waits at 1,000 ops: 5 ms each.
        let mut m = DemandMeter::default();
        m.observe(0, &at(0, 0), 1000);
        let d = m.observe(1000, &at(1000, 5000), 1000);
        assert!(d["h"].backlogged);
    }

    #[test]
    fn a_mibps_writer_waiting_below_its_limit_share_is_not_held() {
        let held = |served_mib: u64, served_ops: u64| PathDemand {
            served: served_ops,
            backlogged: true,
            held_milli: 4000,
            served_bytes: served_mib << 20,
        };
        let share = |mibps: Option<u64>, iops: Option<u64>| LocalShare {
            limit_mibps: mibps,
            limit_iops: iops,
            ..LocalShare::default()
        };
        let mut d = BTreeMap::from([
            ("below".to_string(), held(91, 91)),
            ("at".to_string(), held(99, 99)),
            ("ops".to_string(), held(50, 990)),
            ("iops-only".to_string(), held(10, 10)),
            ("unknown".to_string(), held(10, 10)),
        ]);
        let settings = BTreeMap::from([
            ("below".to_string(), share(Some(100), None)),
            ("at".to_string(), share(Some(100), None)),
            ("ops".to_string(), share(Some(100), Some(1000))),
            ("iops-only".to_string(), share(None, Some(1000))),
        ]);
        held_near_a_limit(&mut d, &settings);
        let backlogged: Vec<bool> = ["below", "at", "ops", "iops-only", "unknown"]
            .iter()
            .map(|n| d[*n].backlogged)
            .collect();
        assert_eq!(backlogged, [false, true, true, true, true]);
    }

    #[test]
    fn counters_that_go_back_start_afresh_and_gone_hosts_are_dropped() {
        let mut m = DemandMeter::default();
        m.observe(0, &at(1000, 0), 100);
        assert_eq!(m.observe(100, &at(1100, 0), 100)["h"].served, 1000);
        assert!(m.observe(200, &at(5, 0), 100).is_empty(), "restarted");
        assert!(m.observe(300, &BTreeMap::new(), 100).is_empty());
        assert!(m.samples.is_empty());
    }
}
