//! A fluid target with a depth curve, `T(Q) = T_MAX Q / (Q + HALF_DEPTH)`, served by
//! closed-loop hosts through a monitor's channels: the test bed of the operating-point
//! tests (entitlements, groups).
#![allow(dead_code)] // each test file uses part of it

use qos_core::allowance::{AllowanceGate, AllowanceReceiver, Received, ReportGate, fold_tag};
use qos_core::{
    Capacity, DomainConfig, EstimatorConfig, ExcessSharing, IoKind, Monitor, Nanos, TargetChannel,
};

/// A domain on the fluid target: a capacity hint of 400 K (twice what it does, so the
/// budget does not bind), the estimator off.
pub fn domain(sharing: ExcessSharing) -> DomainConfig {
    DomainConfig {
        capacity: Capacity {
            iops: Some(400_000),
            ..Capacity::default()
        },
        estimator: EstimatorConfig {
            enabled: false,
            ..Default::default()
        },
        sharing,
        ..DomainConfig::default()
    }
}

/// The target's depth curve: T(Q) = T_MAX Q / (Q + HALF_DEPTH) operations per second.
pub const T_MAX: f64 = 200_000.0;
pub const HALF_DEPTH: f64 = 4.0;

/// A closed-loop host: `depth` commands outstanding, each at the base or held.
pub struct Host {
    pub ch: TargetChannel<()>,
    pub depth: u32,
    pub at_base: u32,
    /// Completions owed from fractions of earlier milliseconds.
    carry: f64,
    /// A cooperative host (issue 40 item 2): it keeps what its allowance does not let
    /// out itself.
    pub coop: Option<Coop>,
}

/// A cooperative host's initiator: the allowance it was sent (through its channel's
/// completions, as the target plugin sends it), its reports, and the commands it held
/// itself.
#[derive(Debug, Default)]
pub struct Coop {
    pub host_tag: u32,
    pub allowance: Option<u64>,
    gate: AllowanceGate,
    rx: AllowanceReceiver,
    report: ReportGate,
    /// Commands waiting at the initiator now, and summed over the steps (a mean
    /// over time: divide by the steps).
    pub waiting: u32,
    pub waiting_sum: u64,
    pub allowances_applied: u64,
}

impl Coop {
    pub fn new(host_tag: u32) -> Self {
        Coop {
            host_tag,
            ..Coop::default()
        }
    }
}

/// Step of the simulation: well under a command's latency, so that the target is
/// not limited to one completion per command and step.
pub const STEP: Nanos = Nanos(10_000);

/// Serves `hosts` for `secs` seconds in steps of [`STEP`]: the target completes T(Q)
/// per second over the Q commands at its base, in proportion to each host's; a host
/// sends a new command for each completed one, which QoS admits or holds. Channels
/// poll every 100 µs and the monitor ticks every millisecond, as in the plugin.
pub fn serve(m: &mut Monitor, hosts: &mut [Host], (from, secs): (u64, u64)) {
    serve_at(m, hosts, (from, secs), 1.0);
}

/// [`serve`] on a target `speed` times as fast (a CPU quota, a slower base: the same
/// rate takes more commands in flight).
pub fn serve_at(m: &mut Monitor, hosts: &mut [Host], (from, secs): (u64, u64), speed: f64) {
    serve_span(
        m,
        hosts,
        Nanos::from_secs(from),
        Nanos::from_secs(secs),
        (speed, 1.0),
    );
}

/// [`serve`] on a target that serves a host's commands at the base in proportion to
/// their number to the power `skew` (below 1: a host's commands queue behind each
/// other, as in its NVMe/TCP connection, so a host with many gets less per command).
pub fn serve_skewed(m: &mut Monitor, hosts: &mut [Host], (from, secs): (u64, u64), skew: f64) {
    serve_span(
        m,
        hosts,
        Nanos::from_secs(from),
        Nanos::from_secs(secs),
        (1.0, skew),
    );
}

/// [`serve`] from `t0` (a whole millisecond) for `len` (whole milliseconds).
pub fn serve_for(m: &mut Monitor, hosts: &mut [Host], t0: Nanos, len: Nanos) {
    serve_span(m, hosts, t0, len, (1.0, 1.0));
}

fn serve_span(
    m: &mut Monitor,
    hosts: &mut [Host],
    t0: Nanos,
    len: Nanos,
    (speed, skew): (f64, f64),
) {
    let steps_per_ms = 1_000_000 / STEP.0;
    for step in 1..=len.0 / STEP.0 {
        let now = t0.saturating_add(Nanos(step * STEP.0));
        let q: u32 = hosts.iter().map(|h| h.at_base).sum();
        let rate = speed * T_MAX * q as f64 / (q as f64 + HALF_DEPTH);
        let part = |n: u32| (n as f64).powf(skew);
        let parts: f64 = hosts.iter().map(|h| part(h.at_base)).sum();
        for h in hosts.iter_mut() {
            if h.at_base == 0 {
                continue;
            }
            h.carry += rate * STEP.0 as f64 / 1e9 * part(h.at_base) / parts;
            // Every command at the base spent this step there.
            h.ch.tokens()
                .record_service(Nanos(h.at_base as u64 * STEP.0));
            let done = (h.carry as u32).min(h.at_base);
            h.carry -= done as f64;
            h.at_base -= done;
            let mut sent = 0;
            for _ in 0..done {
                h.ch.record_completion(IoKind::Read, 4096, Nanos::ZERO);
                sent += h.ch.on_completion(|| now, |_| ()) as u32;
            }
            h.at_base += sent;
            if let Some(c) = h.coop.as_mut().filter(|_| done > 0) {
                // A completion carries the allowance when the target's gate says so.
                let word = h.ch.tokens().host().window().allowance_word();
                if let Some(cdw0) = c.gate.should_send(word, fold_tag(c.host_tag), now)
                    && let Received::Applied(a) = c.rx.receive(cdw0, Some(c.host_tag), now)
                {
                    c.allowance = a;
                    c.allowances_applied += 1;
                }
            }
        }
        for h in hosts.iter_mut() {
            let outstanding = h.at_base + h.ch.held() as u32;
            let mut room = u32::MAX;
            if let Some(c) = h.coop.as_mut() {
                // Its circulation is its depth (closed loop): reported when due.
                if c.report.due(h.depth as u64, now) {
                    h.ch.tokens()
                        .host()
                        .window()
                        .report_circulation(h.depth as u64, now);
                }
                let cap = c.allowance.map_or(u32::MAX, |a| a as u32);
                room = cap.saturating_sub(outstanding);
            }
            for _ in outstanding..h.depth {
                if room == 0 {
                    break;
                }
                room -= 1;
                if h.ch.admit(IoKind::Read, 4096, now, ()).is_some() {
                    h.at_base += 1;
                }
            }
            let at_target = h.at_base + h.ch.held() as u32;
            if let Some(c) = h.coop.as_mut() {
                c.waiting = h.depth.saturating_sub(at_target);
                c.waiting_sum += c.waiting as u64;
            }
            if step % 10 == 0 {
                h.at_base += h.ch.poll(now, |_| ()) as u32;
            }
        }
        if step % steps_per_ms == 0 {
            m.tick(now);
        }
    }
}

impl Host {
    /// A host with `depth` commands to keep outstanding on channel `ch`.
    pub fn new(ch: TargetChannel<()>, depth: u32) -> Self {
        Host {
            ch,
            depth,
            at_base: 0,
            carry: 0.0,
            coop: None,
        }
    }
}
