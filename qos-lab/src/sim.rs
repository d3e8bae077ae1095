//! The discrete-event simulation of one run: one scenario (or variant), one policy, one
//! seed. It owns the event heap and the emulated hosts, and drives the qos-core objects
//! exactly as the plugins do:
//!
//! - target side: a [`Monitor`] ticked at its deadlines, one [`TargetChannel`] per host
//!   and poll-group thread (the plugin's own type): held commands tried again after
//!   completions at the channel's cadence and by a poller every
//!   [`qos_core::channel::POLL_INTERVAL`], which also publishes the counters the monitor
//!   reads;
//! - cooperative initiators: an [`InitiatorEngine`] whose vendor requests are answered
//!   by `ChannelTokens::serve_request` and whose completions carry `credit_hint`, with
//!   an initiator-side [`HoldQueue`]; and, with pacing, a Justitia [`Pacer`] per machine
//!   that splits large transfers with [`plan_even_chunks`] (as the initiator plugin
//!   does) and releases chunks with
//!   `try_send`, fed by a reference probe.
//!
//! No policy is implemented here: the lab only moves commands between these objects,
//! the emulated server and link ([`crate::server`]), and SPDK's namespace limit
//! ([`crate::nslimit`], the baseline).
//!
//! Determinism: one seed, per-host random streams, an event heap ordered by time and
//! then by a sequence number, and no hash maps or clocks.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

use qos_core::channel::POLL_INTERVAL;
use qos_core::depth::{CurvePoint, OperatingPoint};
use qos_core::hold::HoldQueue;
use qos_core::initiator::InitiatorEngine;
use qos_core::latency::LatencyHistogram;
use qos_core::pacer::{ChunkPlan, Pacer, StreamId, plan_even_chunks};
use qos_core::window::{self, Handing, WindowWaiters};
use qos_core::wire::{Request, StateReply};
use qos_core::{IoKind, Monitor, Nanos, TargetChannel};
use thiserror::Error;

use crate::nslimit::{NsLimit, TIMESLICE_NS};
use crate::scenario::{Enforcement, Pattern, Policy, RunSpec, Scenario, Service};
use crate::server::{Link, Pipe, Server};

mod build;

/// Why a run could not start.
#[derive(Debug, Error)]
pub enum RunError {
    #[error("{file}: the QoS domain is invalid: {source}")]
    Domain {
        file: String,
        #[source]
        source: Box<qos_core::monitor::NewDomainError>,
    },
    #[error(
        "{file}: host {host} was refused: {source}. Run `qos-lab check {file}` to see which reservations fit"
    )]
    AddHost {
        file: String,
        host: String,
        #[source]
        source: Box<qos_core::monitor::AddHostError>,
    },
    #[error(
        "{file}: group {group} was refused: {source}. Run `qos-lab check {file}` to see which reservations fit"
    )]
    AddGroup {
        file: String,
        group: String,
        #[source]
        source: Box<qos_core::monitor::AddGroupError>,
    },
    #[error("{file}: at scale {scale}, {what} becomes 0; use a smaller scale (--scale)")]
    Scale {
        file: String,
        scale: u64,
        what: String,
    },
    #[error(
        "{file}: policy {policy} paces chunks, which needs the target's link bandwidth; set target.link_gbps or drop +pacing"
    )]
    PacingWithoutLink { file: String, policy: String },
    #[error("{file}: the pacer settings are invalid: {source}")]
    Pacer {
        file: String,
        #[source]
        source: qos_core::pacer::PacerConfigError,
    },
}

/// Overrides of a scenario's own length, scale and seed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RunOptions {
    pub seed: Option<u64>,
    pub periods: Option<u32>,
    pub warmup_periods: Option<u32>,
    pub scale: Option<u64>,
}

/// What one host did in the measured periods.
#[derive(Debug, Clone)]
pub struct HostOutcome {
    pub name: String,
    /// Application I/O completed per measured period (simulated units).
    pub completed: Vec<u64>,
    /// Bytes completed per measured period (simulated units).
    pub bytes: Vec<u64>,
    /// Latency from issue to completion of every application I/O in the measured
    /// periods.
    pub latency: LatencyHistogram,
    /// Sharing `operating_point` only: what the monitor's entitlement report said of
    /// it at the end of each measured period, and its time held by QoS.
    pub operating: Option<HostOperating>,
}

/// A host's entitlement report over the measured periods (sharing `operating_point`).
#[derive(Debug, Clone, Default)]
pub struct HostOperating {
    /// e_i per measured period (simulated units per second); `None` before the depth
    /// curve had a sample.
    pub entitled: Vec<Option<u64>>,
    /// Contending (held in at least half of the period) per measured period.
    pub contending: Vec<bool>,
    /// Commands admitted in the measured periods (held or not) and the time they waited
    /// in QoS, summed (simulated ns).
    pub admitted: u64,
    pub held_ns: u64,
}

/// What one policy did.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub policy: Policy,
    pub variant: Option<String>,
    pub scale: u64,
    pub seed: u64,
    pub period: Nanos,
    pub hosts: Vec<HostOutcome>,
    /// The monitor's capacity estimate (Omega_t) per measured period, simulated units.
    pub capacity_estimate: Vec<u64>,
    /// The depth curve the monitor learned by the run's end (simulated units), and the
    /// operating point on it for the domain's efficiency; none without a monitor.
    pub depth_curve: Vec<CurvePoint>,
    pub operating_point: Option<OperatingPoint>,
    pub efficiency_milli: u64,
    /// Over the hosts' circulation (`[qos] over_circulation` or `operating_in_flight`
    /// with sharing `operating_point`): the monitor's view at the end of each measured
    /// period; empty in the other modes.
    pub circulation: Vec<qos_core::CirculationStats>,
    /// Warnings of initiator engines (fallbacks), deduplicated.
    pub warnings: Vec<String>,
    /// Events processed (for performance reports).
    pub events: u64,
}

const NONE: u32 = u32::MAX;

#[derive(Debug, Clone, Copy)]
enum Ev {
    Tick,
    /// The poller of host `.0`'s channel `.1`.
    ChannelPoll(u16, u16),
    Period,
    Timeslice,
    Capacity(u16),
    Wake(u16),
    PipeDone(u32),
    LinkDone(u32),
    Deliver(u32),
    EnginePoll(u16),
    VendorAtTarget(u16),
    VendorReply(u16),
    PacerWake(u16),
    PacerTick(u16),
    Probe(u16, u64),
}

#[derive(Debug, Clone, Copy)]
struct Event {
    t: u64,
    seq: u64,
    ev: Ev,
}

impl PartialEq for Event {
    fn eq(&self, o: &Self) -> bool {
        (self.t, self.seq) == (o.t, o.seq)
    }
}
impl Eq for Event {}
impl PartialOrd for Event {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Event {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        (self.t, self.seq).cmp(&(o.t, o.seq))
    }
}

/// SplitMix64: small, fast, and good enough for workloads.
#[derive(Debug, Clone)]
pub struct SplitMix(u64);

impl SplitMix {
    pub fn new(seed: u64) -> Self {
        SplitMix(seed)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

#[derive(Debug, Clone, Copy)]
struct Io {
    host: u16,
    chan: u16,
    write: bool,
    bytes: u64,
    issued: u64,
    /// When it reached the base (the server), for the time it spent there.
    at_base: u64,
    parent: u32,
    cdw0: u32,
}

impl Io {
    fn kind(&self) -> IoKind {
        if self.write {
            IoKind::Write
        } else {
            IoKind::Read
        }
    }
}

#[derive(Debug)]
struct Parent {
    host: u16,
    write: bool,
    bytes: u64,
    issued: u64,
    left: u32,
    plan: ChunkPlan,
    next_chunk: Option<u64>,
    stream: Option<StreamId>,
}

/// A free-list slab: no allocation per I/O once warm.
#[derive(Debug)]
struct Slab<T> {
    items: Vec<Option<T>>,
    free: Vec<u32>,
}

impl<T> Slab<T> {
    fn new() -> Self {
        Slab {
            items: Vec::new(),
            free: Vec::new(),
        }
    }
    fn insert(&mut self, v: T) -> u32 {
        match self.free.pop() {
            Some(i) => {
                self.items[i as usize] = Some(v);
                i
            }
            None => {
                self.items.push(Some(v));
                (self.items.len() - 1) as u32
            }
        }
    }
    fn get(&self, i: u32) -> &T {
        self.items[i as usize].as_ref().expect("live slab entry")
    }
    fn get_mut(&mut self, i: u32) -> &mut T {
        self.items[i as usize].as_mut().expect("live slab entry")
    }
    fn remove(&mut self, i: u32) -> T {
        let v = self.items[i as usize].take().expect("live slab entry");
        self.free.push(i);
        v
    }
}

#[derive(Debug)]
struct Host {
    name: String,
    pattern: Pattern,
    qd: u32,
    io_bytes: u64,
    read_fraction: f64,
    demand: Option<u64>,
    cooperative: bool,
    start: u64,
    stop: u64,
    machine: usize,
    rng: SplitMix,
    pipe: Pipe,
    outstanding: u32,
    issued_period: u64,
    period_start: u64,
    wake_at: u64,
    chans: Vec<TargetChannel<u32>>,
    next_chan: usize,
    engine: Option<InitiatorEngine>,
    ihold: HoldQueue<u32>,
    poll_at: u64,
    pending_req: Option<Request>,
    pending_reply: Option<StateReply>,
    completed: Vec<u64>,
    bytes: Vec<u64>,
    latency: LatencyHistogram,
}

#[derive(Debug)]
struct Machine {
    pacer: Pacer,
    streams: VecDeque<u32>,
    wake_at: u64,
    tick_at: u64,
}

/// One run in progress.
#[derive(Debug)]
struct Sim {
    now: u64,
    end: u64,
    period: u64,
    warmup: u32,
    measured: u32,
    heap: BinaryHeap<Reverse<Event>>,
    seq: u64,
    server: Server,
    link: Option<Link>,
    base_latency: u64,
    service: Service,
    svc_rng: SplitMix,
    capacity: f64,
    capacity_changes: Vec<(u64, f64)>,
    ios: Slab<Io>,
    parents: Slab<Parent>,
    hosts: Vec<Host>,
    machines: Vec<Machine>,
    monitor: Option<Monitor>,
    check_interval: u64,
    ns: Option<NsLimit>,
    policy: Policy,
    scratch: Vec<u32>,
    estimates: Vec<u64>,
    warnings: Vec<String>,
    events: u64,
    /// Sharing `operating_point`: periods ended so far, each host's report, and its
    /// held-time counters (admitted, held time) when the measured periods began.
    window: bool,
    ended: u32,
    operating: Vec<HostOperating>,
    held_at_start: Vec<(u64, u64)>,
    circulation: Vec<qos_core::CirculationStats>,
}

fn scaled(v: u64, scale: u64) -> u64 {
    v / scale
}

/// Runs `policy` on `run` of `scenario`. `progress` is called with the number of
/// periods simulated so far (warm-up included).
pub fn simulate(
    scenario: &Scenario,
    run: &RunSpec,
    policy: Policy,
    opts: RunOptions,
    progress: &mut dyn FnMut(u32),
) -> Result<Outcome, RunError> {
    let mut sim = Sim::build(scenario, run, policy, opts)?;
    sim.run(progress);
    Ok(sim.finish(scenario, run, policy, opts))
}

impl Sim {
    #[inline]
    fn schedule(&mut self, t: u64, ev: Ev) {
        self.seq += 1;
        self.heap.push(Reverse(Event {
            t,
            seq: self.seq,
            ev,
        }));
    }

    fn run(&mut self, progress: &mut dyn FnMut(u32)) {
        loop {
            let th = self.heap.peek().map_or(u64::MAX, |e| e.0.t);
            let ts = self.server.next_time();
            let t = th.min(ts);
            if t >= self.end {
                break;
            }
            self.now = t;
            self.events += 1;
            if ts <= th {
                let io = self.server.complete(t);
                self.server_done(io);
                continue;
            }
            let Reverse(e) = self.heap.pop().expect("peeked");
            self.handle(e.ev, t, progress);
        }
    }

    /// One event of the heap, at its time `t`.
    #[inline]
    fn handle(&mut self, ev: Ev, t: u64, progress: &mut dyn FnMut(u32)) {
        match ev {
            Ev::Period => self.period_end(t, progress),
            Ev::Tick => self.tick(),
            Ev::ChannelPoll(h, c) => self.channel_poll(h as usize, c as usize),
            Ev::Timeslice => self.timeslice(t),
            Ev::Capacity(i) => {
                let f = self.capacity_changes[i as usize].1;
                self.server.set_capacity(t, self.capacity * f);
            }
            Ev::Wake(h) => {
                let h = h as usize;
                if self.hosts[h].wake_at == t {
                    self.hosts[h].wake_at = u64::MAX;
                    self.try_issue(h);
                }
            }
            Ev::PipeDone(io) => self.target_admit(io),
            Ev::LinkDone(io) => self.target_done(io),
            Ev::Deliver(io) => self.deliver(io),
            Ev::EnginePoll(h) => {
                let h = h as usize;
                if self.hosts[h].poll_at == t {
                    self.hosts[h].poll_at = u64::MAX;
                    self.engine_service(h);
                }
            }
            Ev::VendorAtTarget(h) => self.vendor_at_target(h as usize),
            Ev::VendorReply(h) => {
                let h = h as usize;
                let host = &mut self.hosts[h];
                if let (Some(r), Some(e)) = (host.pending_reply.take(), host.engine.as_mut()) {
                    e.on_reply(Ok(r), Nanos(t));
                }
                self.engine_service(h);
            }
            Ev::PacerWake(m) => {
                let m = m as usize;
                if self.machines[m].wake_at == t {
                    self.machines[m].wake_at = u64::MAX;
                    self.pacer_pump(m);
                }
            }
            Ev::PacerTick(m) => {
                let m = m as usize;
                if self.machines[m].tick_at == t {
                    self.pacer_tick(m);
                }
            }
            Ev::Probe(m, sent) => {
                self.machines[m as usize]
                    .pacer
                    .on_probe(Nanos(t - sent), Nanos(t));
            }
        }
    }

    /// A period ends at `t`: every host's demand is new again.
    fn period_end(&mut self, t: u64, progress: &mut dyn FnMut(u32)) {
        let k = (t / self.period) as u32;
        progress(k);
        for h in 0..self.hosts.len() {
            self.hosts[h].issued_period = 0;
            self.hosts[h].period_start = t;
            self.try_issue(h);
        }
        self.schedule(t + self.period, Ev::Period);
    }

    /// SPDK's namespace limit releases what its new timeslice allows.
    fn timeslice(&mut self, t: u64) {
        let mut out = std::mem::take(&mut self.scratch);
        if let Some(ns) = self.ns.as_mut() {
            ns.timeslice(|io| out.push(io));
        }
        for &io in &out {
            self.server_enqueue(io);
        }
        out.clear();
        self.scratch = out;
        self.schedule(t + TIMESLICE_NS, Ev::Timeslice);
    }

    /// The monitor's check interval (it reads the counters the channels' pollers
    /// published).
    fn tick(&mut self) {
        let now = self.now;
        let monitor = self.monitor.as_mut().expect("ticks only with a monitor");
        let tick = monitor.tick(Nanos(now));
        if let Some(rep) = tick.ended {
            self.estimates.push(rep.next_budget.ops);
            if self.window {
                self.ended += 1;
                self.record_entitlements();
            }
        }
        let next = tick.next_deadline.0.max(now + 1);
        self.schedule(next, Ev::Tick);
    }

    /// Sharing `operating_point`: at the end of each period, each host's entitlement
    /// report (measured periods only) and its held time at the start of measurement.
    fn record_entitlements(&mut self) {
        let monitor = self.monitor.as_ref().expect("ticks only with a monitor");
        let stats = monitor.stats(Nanos(self.now));
        let held = |h: &qos_core::monitor::HostStats| (h.held_time.count(), h.held_time.sum_ns);
        if self.ended == self.warmup {
            self.held_at_start = stats.hosts.iter().map(held).collect();
            self.operating = vec![HostOperating::default(); stats.hosts.len()];
        } else if self.ended > self.warmup && self.ended <= self.warmup + self.measured {
            self.circulation.extend(stats.circulation);
            for (i, h) in stats.hosts.iter().enumerate() {
                let o = &mut self.operating[i];
                o.entitled.push(h.entitlement.map(|e| e.entitled));
                o.contending
                    .push(h.entitlement.is_some_and(|e| e.contending));
                let (n0, t0) = self.held_at_start[i];
                let (n, t) = held(h);
                o.admitted = n - n0;
                o.held_ns = t - t0;
            }
        }
    }

    /// Sharing `operating_point`: a slot of the window may have freed; the channels
    /// waiting for one try again, lowest start tag first (a dispatcher over all
    /// channels, which the plugin's per-thread channels do not have; the dispatch is
    /// the core's, as the plugin's).
    fn dispatch_window(&mut self) {
        let Some(m) = self.monitor.as_ref() else {
            return;
        };
        let mut out = std::mem::take(&mut self.scratch);
        let mut waiters = LabWaiters {
            hosts: &mut self.hosts,
            now: Nanos(self.now),
            out: &mut out,
        };
        window::dispatch(m.shared().window(), Handing::EveryWaiting, &mut waiters);
        self.enqueue_released(&mut out);
        self.scratch = out;
    }

    /// A channel's poller: releases held commands and publishes its counters.
    fn channel_poll(&mut self, h: usize, c: usize) {
        let mut out = std::mem::take(&mut self.scratch);
        self.hosts[h].chans[c].poll(Nanos(self.now), |io| out.push(io));
        self.enqueue_released(&mut out);
        self.scratch = out;
        self.schedule(
            self.now + POLL_INTERVAL.0,
            Ev::ChannelPoll(h as u16, c as u16),
        );
    }

    /// Sends commands a channel released to the server.
    fn enqueue_released(&mut self, out: &mut Vec<u32>) {
        for &io in out.iter() {
            self.server_enqueue(io);
        }
        out.clear();
    }

    /// How many I/O host `h` may have issued by `now` in this period.
    fn due(&self, h: usize) -> u64 {
        let host = &self.hosts[h];
        if self.now < host.start || self.now >= host.stop {
            return 0;
        }
        match (host.pattern, host.demand) {
            (_, None) => u64::MAX,
            (Pattern::Burst, Some(d)) => d,
            (Pattern::ConstantRate, Some(d)) => {
                let since = self.now - host.period_start;
                let k = (since as u128 * d as u128 / self.period as u128) as u64 + 1;
                k.min(d)
            }
        }
    }

    fn try_issue(&mut self, h: usize) {
        let due = self.due(h);
        while self.hosts[h].outstanding < self.hosts[h].qd && self.hosts[h].issued_period < due {
            self.hosts[h].issued_period += 1;
            self.hosts[h].outstanding += 1;
            self.issue_one(h);
        }
        let host = &self.hosts[h];
        let now = self.now;
        let wake = if now < host.start {
            Some(host.start)
        } else if host.pattern == Pattern::ConstantRate
            && now < host.stop
            && host.outstanding < host.qd
            && let Some(d) = host.demand
            && host.issued_period < d
        {
            // The k-th I/O of the period is due at start + k T / D.
            let k = host.issued_period as u128;
            let at = host.period_start + (k * self.period as u128).div_ceil(d as u128) as u64;
            Some(at.max(now + 1))
        } else {
            None
        };
        if let Some(at) = wake
            && (at < host.wake_at || host.wake_at <= now)
        {
            self.hosts[h].wake_at = at;
            self.schedule(at, Ev::Wake(h as u16));
        }
    }

    fn issue_one(&mut self, h: usize) {
        let now = self.now;
        let host = &mut self.hosts[h];
        let write = host.read_fraction < 1.0 && host.rng.unit() >= host.read_fraction;
        let bytes = host.io_bytes;
        let pace = self.policy.pacing && host.cooperative;
        if pace
            && self.machines[host.machine]
                .pacer
                .should_split(bytes, Nanos(now))
        {
            let m = host.machine;
            let blocks = bytes.div_ceil(4096);
            let chunk = self.machines[m].pacer.chunk_bytes(Nanos(now));
            let largest = self.machines[m].pacer.config().chunk_bytes;
            let mut plan = plan_even_chunks(0, blocks, 4096, chunk, largest);
            let left = plan.chunk_count() as u32;
            let next_chunk = plan.next().map(|c| c.num_blocks * 4096);
            let stream = self.machines[m].pacer.open_stream(h as u64, Nanos(now));
            let pid = self.parents.insert(Parent {
                host: h as u16,
                write,
                bytes,
                issued: now,
                left,
                plan,
                next_chunk,
                stream: Some(stream),
            });
            self.machines[m].streams.push_back(pid);
            self.pacer_pump(m);
            return;
        }
        if pace {
            let m = host.machine;
            self.machines[m].pacer.note_latency_sensitive(Nanos(now));
        }
        let io = self.new_io(h, write, bytes, now, NONE);
        self.submit(io);
    }

    fn new_io(&mut self, h: usize, write: bool, bytes: u64, issued: u64, parent: u32) -> u32 {
        let host = &mut self.hosts[h];
        let chans = host.chans.len().max(1);
        let chan = (host.next_chan % chans) as u16;
        host.next_chan = host.next_chan.wrapping_add(1);
        self.ios.insert(Io {
            host: h as u16,
            chan,
            write,
            bytes,
            issued,
            at_base: issued,
            parent,
            cdw0: 0,
        })
    }

    /// Initiator side: the cooperative engine decides, or the command goes out.
    fn submit(&mut self, io: u32) {
        let (h, kind, bytes) = {
            let i = self.ios.get(io);
            (i.host as usize, i.kind(), i.bytes)
        };
        let now = Nanos(self.now);
        let host = &mut self.hosts[h];
        if let Some(engine) = host.engine.as_mut() {
            match host.ihold.admit_or_hold(engine, kind, bytes, now, io) {
                Some(io) => self.send(io),
                None => self.engine_service(h),
            }
        } else {
            self.send(io);
        }
    }

    /// The command leaves the host through its pipeline (at most C_L per second).
    fn send(&mut self, io: u32) {
        let h = self.ios.get(io).host as usize;
        let at = self.hosts[h].pipe.pass(self.now);
        self.schedule(at, Ev::PipeDone(io));
    }

    /// Target side: the policy's admission.
    fn target_admit(&mut self, io: u32) {
        let i = *self.ios.get(io);
        match self.policy.enforcement {
            Enforcement::Bare => self.server_enqueue(io),
            Enforcement::NsLimit => {
                if self.ns.as_mut().expect("ns-limit").submit(io, i.bytes) {
                    self.server_enqueue(io);
                }
            }
            Enforcement::Qos(_) => {
                let ch = &mut self.hosts[i.host as usize].chans[i.chan as usize];
                if let Some(io) = ch.admit(i.kind(), i.bytes, Nanos(self.now), io) {
                    self.server_enqueue(io);
                }
            }
        }
    }

    fn server_enqueue(&mut self, io: u32) {
        let work = match self.service {
            Service::Deterministic => 1.0,
            Service::Exponential => -(1.0 - self.svc_rng.unit()).ln(),
        };
        self.ios.get_mut(io).at_base = self.now;
        self.server.enqueue(self.now, io, work);
    }

    fn server_done(&mut self, io: u32) {
        match self.link.as_mut() {
            Some(link) => {
                let bytes = self.ios.get(io).bytes;
                let at = link.transfer(self.now, bytes);
                self.schedule(at, Ev::LinkDone(io));
            }
            None => self.target_done(io),
        }
    }

    /// The command is complete at the target (data moved).
    fn target_done(&mut self, io: u32) {
        let i = *self.ios.get(io);
        let host = &mut self.hosts[i.host as usize];
        if let Some(c) = host.chans.get_mut(i.chan as usize) {
            c.record_completion(i.kind(), i.bytes, Nanos(self.now - i.at_base));
            if host.engine.is_some() {
                self.ios.get_mut(io).cdw0 = c.tokens().credit_hint().encode();
            }
            let mut out = std::mem::take(&mut self.scratch);
            let now = Nanos(self.now);
            if !(self.window && c.waits_for_window()) {
                c.on_completion(|| now, |io| out.push(io));
            }
            self.enqueue_released(&mut out);
            self.scratch = out;
            if self.window {
                self.dispatch_window();
            }
        }
        let at = self.now + self.base_latency;
        self.schedule(at, Ev::Deliver(io));
    }

    /// The completion reaches the host.
    fn deliver(&mut self, io: u32) {
        let i = self.ios.remove(io);
        let h = i.host as usize;
        if let Some(e) = self.hosts[h].engine.as_mut() {
            e.on_completion(i.cdw0, Nanos(self.now));
        }
        if i.parent != NONE {
            let p = self.parents.get_mut(i.parent);
            p.left -= 1;
            if p.left > 0 {
                return;
            }
            let p = self.parents.remove(i.parent);
            self.app_done(p.host as usize, p.bytes, p.issued);
        } else {
            self.app_done(h, i.bytes, i.issued);
        }
    }

    fn app_done(&mut self, h: usize, bytes: u64, issued: u64) {
        let now = self.now;
        let k = (now / self.period) as usize;
        let host = &mut self.hosts[h];
        if k < host.completed.len() {
            host.completed[k] += 1;
            host.bytes[k] += bytes;
            if k >= self.warmup as usize {
                host.latency.record(Nanos(now - issued));
            }
        }
        host.outstanding -= 1;
        self.try_issue(h);
    }

    fn engine_service(&mut self, h: usize) {
        let now = self.now;
        let half = self.base_latency / 2;
        let host = &mut self.hosts[h];
        let Some(engine) = host.engine.as_mut() else {
            return;
        };
        let p = engine.poll(Nanos(now));
        if let Some(w) = engine.take_warning()
            && !self.warnings.contains(&w)
        {
            self.warnings.push(format!("host {}: {w}", host.name));
        }
        let mut out = std::mem::take(&mut self.scratch);
        host.ihold.release(engine, Nanos(now), |io, _| out.push(io));
        let next = p.next_deadline.0.max(now + 1);
        let reschedule = next < host.poll_at || host.poll_at <= now;
        if reschedule {
            host.poll_at = next;
        }
        if let Some(req) = p.send {
            host.pending_req = Some(req);
            self.schedule(now + half, Ev::VendorAtTarget(h as u16));
        }
        if reschedule {
            self.schedule(next, Ev::EnginePoll(h as u16));
        }
        for &io in &out {
            self.send(io);
        }
        out.clear();
        self.scratch = out;
    }

    fn vendor_at_target(&mut self, h: usize) {
        let now = self.now;
        let host = &mut self.hosts[h];
        let Some(req) = host.pending_req.take() else {
            return;
        };
        let reply = host.chans[0].tokens().serve_request(req, Nanos(now));
        host.pending_reply = Some(reply);
        let at = now + self.base_latency / 2;
        self.schedule(at, Ev::VendorReply(h as u16));
    }

    fn pacer_tick(&mut self, m: usize) {
        let now = self.now;
        let t = self.machines[m].pacer.tick(Nanos(now));
        if t.send_probe {
            let done = match self.link.as_mut() {
                Some(l) => l.transfer(now, 64),
                None => now,
            };
            self.schedule(done + self.base_latency, Ev::Probe(m as u16, now));
        }
        let next = t.next_deadline.0.max(now + 1);
        self.machines[m].tick_at = next;
        self.schedule(next, Ev::PacerTick(m as u16));
        self.pacer_pump(m);
    }

    /// Releases the chunks the pacer allows now, streams in round-robin order.
    fn pacer_pump(&mut self, m: usize) {
        let now = self.now;
        let mut earliest = u64::MAX;
        loop {
            let mut progressed = false;
            let n = self.machines[m].streams.len();
            for _ in 0..n {
                let Some(pid) = self.machines[m].streams.pop_front() else {
                    break;
                };
                let (stream, chunk) = {
                    let p = self.parents.get(pid);
                    (
                        p.stream.expect("open stream"),
                        p.next_chunk.expect("a chunk"),
                    )
                };
                match self.machines[m].pacer.try_send(stream, chunk, Nanos(now)) {
                    Ok(()) => {
                        progressed = true;
                        let (h, write, issued, more) = {
                            let p = self.parents.get_mut(pid);
                            p.next_chunk = p.plan.next().map(|c| c.num_blocks * 4096);
                            (p.host as usize, p.write, p.issued, p.next_chunk.is_some())
                        };
                        if more {
                            self.machines[m].streams.push_back(pid);
                        } else {
                            self.parents.get_mut(pid).stream = None;
                            self.machines[m].pacer.close_stream(stream, Nanos(now));
                        }
                        let io = self.new_io(h, write, chunk, issued, pid);
                        self.submit(io);
                    }
                    Err(t) => {
                        earliest = earliest.min(t.0);
                        self.machines[m].streams.push_back(pid);
                    }
                }
            }
            if !progressed || self.machines[m].streams.is_empty() {
                break;
            }
        }
        let mc = &mut self.machines[m];
        if earliest != u64::MAX
            && !mc.streams.is_empty()
            && (earliest < mc.wake_at || mc.wake_at <= now)
        {
            let at = earliest.max(now + 1);
            mc.wake_at = at;
            self.schedule(at, Ev::PacerWake(m as u16));
        }
    }

    fn finish(self, sc: &Scenario, run: &RunSpec, policy: Policy, opts: RunOptions) -> Outcome {
        let w = self.warmup as usize;
        let mut operating = self.operating.into_iter();
        let window = self.window;
        let hosts = self
            .hosts
            .into_iter()
            .map(|h| HostOutcome {
                name: h.name,
                completed: h.completed[w..].to_vec(),
                bytes: h.bytes[w..].to_vec(),
                latency: h.latency,
                operating: if window { operating.next() } else { None },
            })
            .collect();
        let m = self.measured as usize;
        let capacity_estimate = self.estimates.iter().skip(w).take(m).copied().collect();
        let now = Nanos(self.now);
        let (depth_curve, operating_point, efficiency_milli) = match &self.monitor {
            Some(mon) => {
                let cfg = mon.config();
                let d = mon.depth_curve();
                let op = d.operating_point(now, cfg.operating_target());
                (d.curve(now), op, cfg.efficiency_milli)
            }
            None => (Vec::new(), None, 0),
        };
        Outcome {
            policy,
            variant: run.variant.clone(),
            scale: opts.scale.unwrap_or(sc.scale).max(1),
            seed: opts.seed.unwrap_or(sc.seed),
            period: sc.qos.period,
            hosts,
            capacity_estimate,
            depth_curve,
            operating_point,
            efficiency_milli,
            circulation: self.circulation,
            warnings: self.warnings,
            events: self.events,
        }
    }
}

/// Every channel of the domain, for [`window::dispatch`]: channel `k` counts the
/// hosts' channels in order; what a retry releases goes to `out`.
struct LabWaiters<'a> {
    hosts: &'a mut [Host],
    now: Nanos,
    out: &'a mut Vec<u32>,
}

impl WindowWaiters for LabWaiters<'_> {
    fn each_waiting(&self, visit: &mut dyn FnMut(usize, u64)) {
        let chans = self.hosts.iter().flat_map(|h| &h.chans);
        for (k, ch) in chans.enumerate() {
            if ch.waits_for_window() {
                visit(k, ch.window_tag());
            }
        }
    }
    fn retry(&mut self, k: usize) {
        let mut chans = self.hosts.iter_mut().flat_map(|h| &mut h.chans);
        if let Some(ch) = chans.nth(k) {
            ch.retry(self.now, |io| self.out.push(io));
        }
    }
}
