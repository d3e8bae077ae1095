//! A minimal ideal server for the core's own tests: capacity C per unit time shared by
//! backlogged hosts in round-robin (processor sharing), each host at most C_L, every
//! admitted command completes in the step it was admitted. Seeded; no clock.
#![allow(dead_code)]

use qos_core::{Amount, ChannelTokens, DomainConfig, HostConfig, IoKind, Monitor, Nanos};

pub struct SplitMix(pub u64);
impl SplitMix {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

pub struct SimHost {
    pub channels: Vec<ChannelTokens>,
    /// Admitted commands waiting at the server (channel index of each).
    pub queue: std::collections::VecDeque<usize>,
    /// Commands it wants per period; `None` is continuously backlogged.
    pub demand: Option<u64>,
    pub issued_this_period: u64,
    /// Completed commands per period.
    pub per_period: Vec<u64>,
    /// Admitted commands (tokens consumed) per period.
    pub admitted_per_period: Vec<u64>,
    last_admitted: u64,
}

/// Commands each host keeps outstanding (Haechi's burst pattern uses 64).
pub const QUEUE_DEPTH: usize = 16;

pub struct Sim {
    pub monitor: Monitor,
    pub hosts: Vec<SimHost>,
    pub now: Nanos,
    pub step: Nanos,
    pub per_host_max: u64,
    pub rng: SplitMix,
    pub next_tick: Nanos,
    /// Checked at every tick: tokens outstanding never exceed what the rest of the
    /// period can serve (or the residual reservations, whichever is larger).
    pub max_excess: i128,
}

impl Sim {
    pub fn new(
        cfg: DomainConfig,
        hosts: Vec<(HostConfig, Option<u64>)>,
        channels: usize,
        seed: u64,
    ) -> Self {
        Self::with_groups(cfg, Vec::new(), hosts, channels, seed)
    }

    /// As [`Sim::new`], with tenant groups created before the hosts.
    pub fn with_groups(
        cfg: DomainConfig,
        groups: Vec<qos_core::GroupConfig>,
        hosts: Vec<(HostConfig, Option<u64>)>,
        channels: usize,
        seed: u64,
    ) -> Self {
        let now = Nanos::from_secs(1);
        let mut monitor = Monitor::new(cfg.clone(), now).expect("valid domain");
        for g in groups {
            monitor.add_group(g, now).expect("admissible group");
        }
        let per_host_max = cfg
            .per_host_max
            .iops
            .or(cfg.capacity.iops)
            .unwrap_or(u64::MAX);
        let mut sim_hosts = Vec::new();
        for (h, demand) in hosts {
            let nqn = h.host_nqn.clone();
            monitor.add_host(h, now).expect("admissible host");
            let channels = (0..channels)
                .map(|_| monitor.channel(&nqn).unwrap())
                .collect();
            sim_hosts.push(SimHost {
                channels,
                queue: Default::default(),
                demand,
                issued_this_period: 0,
                per_period: Vec::new(),
                admitted_per_period: Vec::new(),
                last_admitted: 0,
            });
        }
        Sim {
            monitor,
            hosts: sim_hosts,
            now,
            step: Nanos::from_micros(100),
            per_host_max,
            rng: SplitMix(seed),
            next_tick: now,
            max_excess: i128::MIN,
        }
    }

    fn rate_in_step(&self, per_sec: u64, step_index: u64) -> u64 {
        // Exact over time: the k-th step gets floor((k+1) r dt) - floor(k r dt).
        let dt = self.step.0 as u128;
        let f = |k: u64| (k as u128 * dt * per_sec as u128 / 1_000_000_000) as u64;
        f(step_index + 1) - f(step_index)
    }

    /// Runs whole periods; returns completed commands per host per period.
    pub fn run_periods(&mut self, periods: usize) {
        let period = self.monitor.config().period;
        let steps_per_period = period.0 / self.step.0;
        let cap = self.monitor.config().capacity.iops.unwrap_or(u64::MAX);
        let mut k = 0u64;
        let mut ended = 0;
        while ended < periods {
            if self.now >= self.next_tick {
                let t = self.monitor.tick(self.now);
                self.next_tick = t.next_deadline;
                if let Some(rep) = t.ended {
                    for (i, rec) in rep.hosts.iter().enumerate() {
                        let h = &mut self.hosts[i];
                        h.per_period.push(rec.completed_ios);
                        let admitted = h.channels[0].host().counters().admitted_ios;
                        h.admitted_per_period.push(admitted - h.last_admitted);
                        h.last_admitted = admitted;
                        h.issued_this_period = 0;
                    }
                    ended += 1;
                    if ended == periods {
                        break;
                    }
                }
                self.check_outstanding();
            }
            // Hosts top up their queue depth with whatever the ledger admits.
            let n = self.hosts.len();
            let start = self.rng.below(n as u64) as usize;
            for j in 0..n {
                let h = &mut self.hosts[(start + j) % n];
                while h.queue.len() < QUEUE_DEPTH
                    && h.demand.is_none_or(|d| h.issued_this_period < d)
                {
                    let c = self.rng.below(h.channels.len() as u64) as usize;
                    if !h.channels[c]
                        .try_admit(IoKind::Read, 4096, self.now)
                        .is_admitted()
                    {
                        break;
                    }
                    h.issued_this_period += 1;
                    h.queue.push_back(c);
                }
            }
            // The server: C per step, at most C_L per host, round-robin among hosts
            // with queued commands (processor sharing).
            let mut budget = self.rate_in_step(cap, k);
            let local = self.rate_in_step(self.per_host_max, k).max(1);
            let mut served = vec![0u64; n];
            loop {
                let mut progressed = false;
                for j in 0..n {
                    let i = (start + j) % n;
                    if budget == 0 {
                        break;
                    }
                    let h = &mut self.hosts[i];
                    if served[i] >= local {
                        continue;
                    }
                    if let Some(c) = h.queue.pop_front() {
                        h.channels[c].record_completion(IoKind::Read, 4096);
                        served[i] += 1;
                        budget -= 1;
                        progressed = true;
                    }
                }
                if !progressed || budget == 0 {
                    break;
                }
            }
            for h in &mut self.hosts {
                for c in &mut h.channels {
                    c.flush();
                }
            }
            k = (k + 1) % steps_per_period.max(1);
            self.now = self.now.saturating_add(self.step);
        }
    }

    fn check_outstanding(&mut self) {
        let cfg = self.monitor.config();
        let t = self
            .now
            .saturating_sub(self.monitor.period_start())
            .0
            .min(cfg.period.0);
        let left = cfg.period.0 - t;
        let remaining =
            (self.monitor.budget().ops as u128 * left as u128 / cfg.period.0 as u128) as i128;
        let mut res = 0i128;
        let mut cached = 0i128;
        for h in &self.hosts {
            let shared = h.channels[0].host();
            res +=
                shared.reservation_available().ops as i128 + shared.credit_available().ops as i128;
            for c in &h.channels {
                let (r, g) = c.cached();
                cached += (r.ops + g.ops) as i128;
            }
        }
        let global = self.monitor.shared().global_available().ops as i128;
        // Caches hold at most a batch per channel: Haechi's clients hold batches too.
        // Weighted sharing hands each check interval's slice out at its start, and a
        // slice the pool cut short is owed to the next interval, so the hosts' credit
        // may run up to two intervals of capacity ahead of the clock.
        let ahead = if cfg.sharing == qos_core::ExcessSharing::Weighted {
            (2 * self.monitor.budget().ops as u128 * cfg.check_interval.0 as u128
                / cfg.period.0 as u128) as i128
        } else {
            0
        };
        let bound = remaining.max(res) + ahead;
        self.max_excess = self.max_excess.max(global + res - bound);
        let _ = cached;
    }

    /// `issued - (pools + caches + consumed + expired)`, per resource: must be zero.
    pub fn audit_gap(&self) -> [i128; 2] {
        let a = self.monitor.audit();
        let mut held = [0i128; 2];
        let g = self.monitor.shared().global_available();
        held[0] += g.ops as i128;
        held[1] += g.bytes as i128;
        for h in &self.hosts {
            let s = h.channels[0].host();
            let r = s.pooled();
            let c = s.counters();
            held[0] += (r.ops + c.consumed_res.ops + c.consumed_global.ops + c.expired.ops) as i128;
            held[1] += (r.bytes + c.consumed_res.bytes + c.consumed_global.bytes + c.expired.bytes)
                as i128;
            for ch in &h.channels {
                let (cr, cg) = ch.cached();
                held[0] += (cr.ops + cg.ops) as i128;
                held[1] += (cr.bytes + cg.bytes) as i128;
            }
        }
        [
            a.issued[0] - held[0] - a.expired_at_rollover[0],
            a.issued[1] - held[1] - a.expired_at_rollover[1],
        ]
    }
}

pub fn amount_ops(a: Amount) -> u64 {
    a.ops
}
