//! Setting up one run: the scenario's figures divided by the scale, the emulated hosts,
//! the target side's QoS (the monitor, its groups and hosts, one channel per host and
//! poll-group thread, the cooperative initiators' engines), SPDK's namespace limit, the
//! pacers, and the first events. Each step refuses what the run cannot start with.

use std::collections::{BinaryHeap, VecDeque};

use qos_core::channel::POLL_INTERVAL;
use qos_core::hold::HoldQueue;
use qos_core::initiator::{InitiatorConfig, InitiatorEngine};
use qos_core::latency::LatencyHistogram;
use qos_core::pacer::{Pacer, PacerConfig};
use qos_core::{Monitor, Nanos, TargetChannel};

use super::{Ev, Host, Machine, RunError, RunOptions, Sim, Slab, SplitMix, scaled};
use crate::nslimit::{NsLimit, TIMESLICE_NS};
use crate::scenario::{Enforcement, HostSpec, Policy, RunSpec, Scenario};
use crate::server::{Link, Pipe, Server};

/// The run's length, seed and scale (the scenario's, or the options'), and the target's
/// figures divided by the scale.
struct Figures {
    scale: u64,
    seed: u64,
    periods: u32,
    warmup: u32,
    /// C_G and C_L, scaled.
    capacity: u64,
    per_host_max: u64,
    link_bytes_per_s: Option<u64>,
}

impl Figures {
    fn new(sc: &Scenario, opts: RunOptions) -> Result<Figures, RunError> {
        let scale = opts.scale.unwrap_or(sc.scale).max(1);
        let figures = Figures {
            scale,
            seed: opts.seed.unwrap_or(sc.seed),
            periods: opts.periods.unwrap_or(sc.periods).max(1),
            warmup: opts.warmup_periods.unwrap_or(sc.warmup_periods),
            capacity: scaled(sc.target.capacity_iops, scale),
            per_host_max: scaled(sc.target.per_host_max_iops, scale),
            link_bytes_per_s: sc.target.link_bytes_per_s.map(|b| scaled(b, scale)),
        };
        if figures.capacity == 0 || figures.per_host_max == 0 {
            return Err(figures.zero(sc, "the target capacity".into()));
        }
        if figures.link_bytes_per_s == Some(0) {
            return Err(figures.zero(sc, "the link bandwidth".into()));
        }
        Ok(figures)
    }

    /// `what` becomes 0 at this scale.
    fn zero(&self, sc: &Scenario, what: String) -> RunError {
        RunError::Scale {
            file: sc.file.clone(),
            scale: self.scale,
            what,
        }
    }
}

impl Sim {
    pub(super) fn build(
        sc: &Scenario,
        run: &RunSpec,
        policy: Policy,
        opts: RunOptions,
    ) -> Result<Sim, RunError> {
        let fig = Figures::new(sc, opts)?;
        let (mut hosts, machine_count) = emulated_hosts(sc, run, &fig)?;
        let (monitor, estimates) = match policy.qos() {
            Some(_) => {
                let m = target_qos(sc, run, policy, fig.scale, &mut hosts)?;
                (Some(m.0), vec![m.1])
            }
            None => (None, Vec::new()),
        };
        let ns = (policy.enforcement == Enforcement::NsLimit).then(|| ns_limit(sc, fig.scale));
        // A CPU-bound target pays the QoS path on every command, held or not.
        let capacity = match policy.qos() {
            Some(_) => fig.capacity as f64 / (1.0 + sc.target.qos_path_cost_pct / 100.0),
            None => fig.capacity as f64,
        };
        let machines = pacers(sc, policy, &fig, machine_count)?;
        let period = sc.qos.period.0;
        let mut sim = Sim {
            now: 0,
            end: period * (fig.warmup + fig.periods) as u64,
            period,
            warmup: fig.warmup,
            measured: fig.periods,
            heap: BinaryHeap::with_capacity(4096),
            seq: 0,
            server: Server::new(capacity).with_half_depth(sc.target.half_depth),
            // Times stretch by the scale as rates shrink by it.
            link: fig
                .link_bytes_per_s
                .map(|b| Link::new(b, sc.target.link_command.0.saturating_mul(fig.scale))),
            base_latency: sc.target.base_latency.0,
            service: sc.target.service,
            svc_rng: SplitMix::new(fig.seed.wrapping_mul(0x2545_F491_4F6C_DD1D) ^ 0x5EED),
            capacity,
            capacity_changes: match sc.target.speed_noise {
                Some(n) => speed_spells(n, fig.seed, period * (fig.warmup + fig.periods) as u64),
                None => sc
                    .target
                    .capacity_changes
                    .iter()
                    .map(|&(t, f)| (t.0, f))
                    .collect(),
            },
            ios: Slab::new(),
            parents: Slab::new(),
            hosts,
            machines,
            monitor,
            check_interval: sc.qos.check_interval.0,
            ns,
            policy,
            scratch: Vec::new(),
            estimates,
            warnings: Vec::new(),
            events: 0,
            window: policy
                .qos()
                .is_some_and(|q| q.sharing == qos_core::ExcessSharing::OperatingPoint),
            ended: 0,
            operating: Vec::new(),
            held_at_start: Vec::new(),
            circulation: Vec::new(),
        };
        sim.schedule_first_events();
        Ok(sim)
    }

    /// The first period's end, the monitor's first tick and the channels' pollers, the
    /// namespace limit's timeslice, the capacity changes, the pacers' ticks; then every
    /// host starts issuing.
    fn schedule_first_events(&mut self) {
        self.schedule(self.period, Ev::Period);
        if self.monitor.is_some() {
            self.schedule(self.check_interval, Ev::Tick);
            // Each channel's poller, started at its own offset (channels are created
            // at different times on a real target).
            let mut k = 0u64;
            for h in 0..self.hosts.len() {
                for c in 0..self.hosts[h].chans.len() {
                    let offset = (k * 37_000 + 13_000) % POLL_INTERVAL.0;
                    self.schedule(offset + 1, Ev::ChannelPoll(h as u16, c as u16));
                    k += 1;
                }
            }
        }
        if self.ns.is_some() {
            self.schedule(TIMESLICE_NS, Ev::Timeslice);
        }
        for i in 0..self.capacity_changes.len() {
            let t = self.capacity_changes[i].0;
            self.schedule(t, Ev::Capacity(i as u16));
        }
        for m in 0..self.machines.len() {
            self.machines[m].tick_at = 0;
            self.schedule(0, Ev::PacerTick(m as u16));
        }
        for h in 0..self.hosts.len() {
            if self.hosts[h].engine.is_some() {
                self.engine_service(h);
            }
            self.try_issue(h);
        }
    }
}

/// The emulated hosts of `run`, and how many machines they are on (hosts on one machine
/// share its pacer).
fn emulated_hosts(
    sc: &Scenario,
    run: &RunSpec,
    fig: &Figures,
) -> Result<(Vec<Host>, usize), RunError> {
    let mut machine_names: Vec<String> = Vec::new();
    let mut hosts = Vec::with_capacity(run.hosts.len());
    for (i, h) in run.hosts.iter().enumerate() {
        let demand = match h.demand {
            Some(d) => {
                let d = scaled(d, fig.scale);
                if d == 0 {
                    return Err(fig.zero(sc, format!("the demand of host {}", h.name)));
                }
                Some(d)
            }
            None => None,
        };
        if h.reservation_iops
            .is_some_and(|r| scaled(r, fig.scale) == 0)
        {
            return Err(fig.zero(sc, format!("the reservation of host {}", h.name)));
        }
        if h.limit_iops.is_some_and(|r| scaled(r, fig.scale) == 0) {
            return Err(fig.zero(sc, format!("the limit of host {}", h.name)));
        }
        let machine = match machine_names.iter().position(|m| *m == h.machine) {
            Some(m) => m,
            None => {
                machine_names.push(h.machine.clone());
                machine_names.len() - 1
            }
        };
        hosts.push(Host::new(h, i, demand, machine, fig));
    }
    Ok((hosts, machine_names.len()))
}

impl Host {
    /// Host `i` of the run, idle, with its own random stream; `demand` is scaled.
    fn new(h: &HostSpec, i: usize, demand: Option<u64>, machine: usize, fig: &Figures) -> Host {
        let periods_total = (fig.warmup + fig.periods) as usize;
        Host {
            name: h.name.clone(),
            pattern: h.pattern,
            qd: h.queue_depth,
            io_bytes: h.io_bytes,
            read_fraction: h.read_fraction,
            demand,
            cooperative: h.cooperative,
            start: h.start.0,
            stop: h.stop.map_or(u64::MAX, |s| s.0),
            machine,
            rng: SplitMix::new(fig.seed ^ (i as u64 + 1).wrapping_mul(0xA076_1D64_78BD_642F)),
            pipe: Pipe::new(fig.per_host_max as f64),
            outstanding: 0,
            issued_period: 0,
            period_start: 0,
            wake_at: u64::MAX,
            chans: Vec::new(),
            next_chan: 0,
            engine: None,
            ihold: HoldQueue::new(),
            poll_at: u64::MAX,
            pending_req: None,
            pending_reply: None,
            completed: vec![0; periods_total],
            bytes: vec![0; periods_total],
            latency: LatencyHistogram::default(),
        }
    }
}

/// The target plugin of a QoS policy: its monitor with the scenario's groups (when the
/// sharing is by weight) and hosts, each host's channels, and the cooperative hosts'
/// initiator engines. Returns the monitor and its first budget estimate.
fn target_qos(
    sc: &Scenario,
    run: &RunSpec,
    policy: Policy,
    scale: u64,
    hosts: &mut [Host],
) -> Result<(Monitor, u64), RunError> {
    use qos_core::ExcessSharing::{OperatingPoint, Weighted};
    let q = policy.qos().expect("a QoS policy");
    let groups = matches!(q.sharing, Weighted | OperatingPoint);
    let domain = sc.domain_config(scale, q.mode, q.release, q.sharing);
    let mut m = Monitor::new(domain, Nanos::ZERO).map_err(|source| RunError::Domain {
        file: sc.file.clone(),
        source: Box::new(source),
    })?;
    if groups {
        for g in &sc.groups {
            m.add_group(g.group_config(scale), Nanos::ZERO)
                .map_err(|source| RunError::AddGroup {
                    file: sc.file.clone(),
                    group: g.name.clone(),
                    source: Box::new(source),
                })?;
        }
    }
    for (h, host) in run.hosts.iter().zip(hosts.iter_mut()) {
        let mut cfg = h.host_config(scale);
        if !groups {
            // Policies without sharing by weight have no tenant groups.
            cfg.group = None;
        }
        m.add_host(cfg, Nanos::ZERO)
            .map_err(|source| RunError::AddHost {
                file: sc.file.clone(),
                host: h.name.clone(),
                source: Box::new(source),
            })?;
        connect(&m, h, host, sc.target.channels_per_host);
    }
    let estimate = m.budget().ops;
    Ok((m, estimate))
}

/// Host `h`, just added to the monitor: its channels (one per poll-group thread) and, if
/// cooperative, its initiator engine.
fn connect(m: &Monitor, h: &HostSpec, host: &mut Host, channels: usize) {
    let nqn = h.nqn();
    for _ in 0..channels {
        let tokens = m.channel(&nqn).expect("host just added");
        host.chans.push(TargetChannel::new(tokens));
    }
    if h.cooperative {
        let cfg = InitiatorConfig {
            acquire_ops: m.config().batch().ops.max(1),
            acquire_bytes: 0,
            ..InitiatorConfig::default()
        };
        host.engine = Some(InitiatorEngine::new(cfg, Nanos::ZERO));
    }
}

/// SPDK's namespace limit, the baseline policy: the scenario's, else the capacity.
fn ns_limit(sc: &Scenario, scale: u64) -> NsLimit {
    NsLimit::new(
        Some(
            scaled(
                sc.qos.ns_limit_iops.unwrap_or(sc.target.capacity_iops),
                scale,
            )
            .max(1),
        ),
        sc.qos.ns_limit_mibps.map(|m| scaled(m << 20, scale).max(1)),
    )
}

/// With pacing, one pacer for every machine, including a machine without cooperative
/// hosts; pacing needs the link's bandwidth.
fn pacers(
    sc: &Scenario,
    policy: Policy,
    fig: &Figures,
    machine_count: usize,
) -> Result<Vec<Machine>, RunError> {
    let mut machines = Vec::new();
    if !policy.pacing {
        return Ok(machines);
    }
    let Some(bps) = fig.link_bytes_per_s else {
        return Err(RunError::PacingWithoutLink {
            file: sc.file.clone(),
            policy: policy.name(),
        });
    };
    let cfg = PacerConfig {
        chunk_bytes: sc.pacer.chunk_bytes,
        chunk_auto: sc.pacer.chunk_auto,
        link_mibps: (bps >> 20).max(1),
        link_iops: scaled(sc.pacer.link_iops, fig.scale).max(1),
        latency_target: sc.pacer.latency_target,
        latency_target_auto_milli: sc.pacer.latency_target_auto_milli,
        probe_interval: sc.pacer.probe_interval,
        aimd_interval: sc.pacer.aimd_interval,
        ..PacerConfig::default()
    };
    for _ in 0..machine_count {
        let pacer = Pacer::new(cfg, Nanos::ZERO).map_err(|source| RunError::Pacer {
            file: sc.file.clone(),
            source,
        })?;
        machines.push(Machine {
            pacer,
            streams: VecDeque::new(),
            wake_at: u64::MAX,
            tick_at: u64::MAX,
        });
    }
    Ok(machines)
}

/// The machine's own speed over `[0, end)` ns: spells uniform in `[spell / 6, spell]`,
/// each at a factor uniform in `[min, 1]`, drawn from the run's seed (every policy of
/// a run sees the same machine). At most `u16::MAX` spells (the event's index).
fn speed_spells(n: crate::scenario::SpeedNoise, seed: u64, end: u64) -> Vec<(u64, f64)> {
    let mut rng = SplitMix::new(seed ^ 0x5EED_5EED_u64.wrapping_mul(0x9E37_79B9));
    let shortest = (n.spell.0 / 6).max(1);
    let mut t = 0u64;
    let mut out = Vec::new();
    while t < end && out.len() < u16::MAX as usize {
        out.push((t, n.min + (1.0 - n.min) * rng.unit()));
        t += shortest + (rng.unit() * (n.spell.0 - shortest) as f64) as u64;
    }
    out
}
