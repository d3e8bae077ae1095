//! Results of a run: the JSON summary (schema in `docs/lab.md`) and the readable table.
//! Figures are in the scenario's own units: counts simulated at `1/scale` of every rate
//! are multiplied back by `scale`.

use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use crate::scenario::{HostSpec, Scenario};
use crate::sim::{HostOperating, HostOutcome, Outcome};

/// What the table's columns and the policies are; printed after every table and by
/// `qos-lab run --help`.
pub const LEGEND: &str = "\
Columns (per host; counts in the scenario's units):
  reservation, limit   the host's reservation and limit, I/O per period (- : none)
  min/mean/max/period  completed I/O per measured period: the smallest, the mean, the largest
  MiB/s                mean data rate over the measured periods
  met                  share of measured periods in which the host completed at least its reservation
  p50, p99, p99.9      latency from issue to completion, including time held by QoS at the
                       initiator or the target (at scale 1/N: of the simulation, see the note)
Policies (the target plugin's settings as SHARING[/RELEASE][/MODE]):
  bare                    no QoS at all
  ns-limit                SPDK's bdev QoS: one IOPS limit for the namespace, shared by all hosts
  weighted                nvmf-qos: reservations released paced over the period, conversion,
                          the unreserved capacity shared by weight (--sharing weighted)
  first_come              the same with the unreserved capacity first come, first served
  first_come/start        Haechi as published: whole reservation released at the period start
  first_come/start/basic  Haechi's tokens without conversion of unused reservations
  operating_point         first come's tokens; excess admitted only while the commands in
                          flight are below Q* of the learned depth curve, by weighted
                          start tags (issue 26); each host's entitlement e_i is shown
  +pacing                 cooperative hosts split and pace transfers above the chunk size (Justitia)
Verdict: how many hosts with a reservation met it in every measured period, and the total
throughput against the bare target's in the same run.
";

/// The summary of one `qos-lab run`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    pub scenario: String,
    pub seed: u64,
    /// Rates were divided by this in the simulation; counts below are multiplied back.
    pub scale: u64,
    pub period_ms: u64,
    pub warmup_periods: u32,
    pub measured_periods: u32,
    pub policies: Vec<PolicySummary>,
}

/// One policy (in one variant of the scenario).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PolicySummary {
    pub policy: String,
    /// The `[[variant]]` this run belongs to, if the scenario has variants.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub variant: Option<String>,
    /// Mean completed I/O per second over the measured periods, all hosts.
    pub total_iops: f64,
    /// Mean MiB/s over the measured periods, all hosts.
    pub total_mib_per_s: f64,
    /// The monitor's capacity estimate (Omega_t) per measured period, IOPS; Haechi only.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub capacity_estimate_iops: Vec<u64>,
    /// Where the depth curve the monitor learned puts the operating point (the
    /// target's policies only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub depth: Option<DepthSummary>,
    /// Over the hosts' circulation: what the hold targets acted on (issue 39).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub circulation: Option<CirculationSummary>,
    pub hosts: Vec<HostSummary>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
}

/// Over the hosts' circulation, the measured periods' ends as the monitor saw them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CirculationSummary {
    /// N: commands the hosts circulate, mean over the measured periods' ends.
    pub commands: f64,
    /// H\*: commands the hold targets keep held, mean.
    pub hold_target: f64,
    /// N\* at the run's end: given (`operating_in_flight`) or learned for η.
    pub n_star: Option<u64>,
    /// Learned for η (`learned` is absent when N\* was given).
    pub learned: bool,
    /// The learner's smoothed held / open ratio at the run's end, thousandths.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ratio_milli: Option<u64>,
}

impl CirculationSummary {
    fn of(o: &Outcome) -> Option<Self> {
        let last = o.circulation.last()?;
        let n = o.circulation.len() as f64;
        let mean = |f: fn(&qos_core::CirculationStats) -> u64| {
            round1(o.circulation.iter().map(|c| f(c) as f64).sum::<f64>() / n)
        };
        let commands = mean(|c| c.commands);
        let hold_target = mean(|c| c.hold_target);
        Some(match last.learned {
            Some(l) => CirculationSummary {
                commands,
                hold_target,
                n_star: l.n_star,
                learned: true,
                ratio_milli: l.ratio_milli,
            },
            None => CirculationSummary {
                commands,
                hold_target,
                n_star: Some(last.commands.saturating_sub(last.hold_target)),
                learned: false,
                ratio_milli: None,
            },
        })
    }
}

/// The operating point on the depth curve learned during a run, beside the model's own
/// rate there (the lab knows its target: `capacity_iops n / (n + half_depth)`, times
/// the capacity factor in force at the run's end).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DepthSummary {
    /// η, thousandths.
    pub efficiency_milli: u64,
    /// Q*: commands in flight at the operating point.
    pub in_flight: f64,
    /// C*: IOPS there, as learned.
    pub iops: u64,
    /// The most the curve saw, IOPS.
    pub max_iops: u64,
    /// The model's IOPS with `in_flight` commands in flight.
    pub model_iops: u64,
    /// The model has no depth curve (`half_depth` 0): as fast at any depth, which
    /// overstates what weighted sharing can give on a real target.
    pub model_flat: bool,
    /// The learned curve, each point with the model's rate beside it.
    pub curve: Vec<DepthPoint>,
}

/// One point of a learned depth curve.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct DepthPoint {
    pub in_flight: f64,
    pub iops: u64,
    pub model_iops: u64,
}

/// One host under one policy.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HostSummary {
    pub host: String,
    pub reservation_iops: Option<u64>,
    pub limit_iops: Option<u64>,
    /// Completed I/O in each measured period.
    pub periods: Vec<u64>,
    /// Mean completed I/O per second.
    pub mean_iops: f64,
    pub mib_per_s: f64,
    /// Fraction of measured periods in which the host completed at least its
    /// reservation; `null` for a host without one.
    pub reservation_met_fraction: Option<f64>,
    pub latency_us: LatencySummary,
    /// Sharing `operating_point`: the monitor's entitlement report over the measured
    /// periods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operating: Option<OperatingSummary>,
}

/// A host's entitlement at the operating point over the measured periods (issue 26).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct OperatingSummary {
    /// Contending (held by QoS in at least half of the period) in this fraction of the
    /// measured periods; a host contending in at least half is judged against e_i.
    pub contending_fraction: f64,
    /// e_i, the mean over the measured periods of what the report said (IOPS).
    pub entitled_iops: f64,
    /// `mean_iops / entitled_iops - 1`.
    pub vs_entitled: f64,
    /// Mean time a command waited in QoS (µs of the simulation: at scale 1/N about N
    /// times the real figure), and as a fraction of its p50 latency.
    pub mean_wait_us: f64,
    pub wait_vs_p50: f64,
}

/// Latency from issue to completion, microseconds (`null` when nothing completed).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct LatencySummary {
    pub p50: Option<f64>,
    pub p99: Option<f64>,
    pub p999: Option<f64>,
}

fn round1(v: f64) -> f64 {
    (v * 10.0).round() / 10.0
}

impl PolicySummary {
    /// One outcome of `scenario`, `measured` periods of `period_ns` at `scale`.
    fn new(
        scenario: &Scenario,
        o: &Outcome,
        scale: u64,
        measured: u32,
        period_ns: u64,
    ) -> PolicySummary {
        let run = scenario
            .runs
            .iter()
            .find(|r| r.variant == o.variant)
            .expect("outcome of a run of this scenario");
        let hosts: Vec<HostSummary> = o
            .hosts
            .iter()
            .zip(&run.hosts)
            .map(|(h, spec)| HostSummary::new(h, spec, scale, measured, period_ns))
            .collect();
        PolicySummary {
            policy: o.policy.name(),
            variant: o.variant.clone(),
            total_iops: round1(hosts.iter().map(|h| h.mean_iops).sum()),
            total_mib_per_s: round1(hosts.iter().map(|h| h.mib_per_s).sum()),
            capacity_estimate_iops: o
                .capacity_estimate
                .iter()
                .map(|e| ((*e as u128 * scale as u128 * 1_000_000_000) / period_ns as u128) as u64)
                .collect(),
            depth: depth_summary(scenario, o, scale, period_ns),
            circulation: CirculationSummary::of(o),
            hosts,
            warnings: o.warnings.clone(),
        }
    }
}

impl HostSummary {
    /// Host `h` of an outcome, described by `spec`, in the scenario's units.
    fn new(
        h: &HostOutcome,
        spec: &HostSpec,
        scale: u64,
        measured: u32,
        period_ns: u64,
    ) -> HostSummary {
        let n = measured.max(1) as f64;
        let period_s = period_ns as f64 / 1e9;
        let periods: Vec<u64> = h.completed.iter().map(|c| c * scale).collect();
        let total: u64 = periods.iter().sum();
        let bytes: u64 = h.bytes.iter().map(|b| b * scale).sum();
        // Met is judged in simulated units, against the reservation the simulated
        // target enforced.
        let met = spec.reservation_iops.map(|r| {
            let per_period = ((r / scale) as u128 * period_ns as u128 / 1_000_000_000) as u64;
            let ok = h.completed.iter().filter(|&&c| c >= per_period).count();
            (ok as f64 / h.completed.len().max(1) as f64 * 1e4).round() / 1e4
        });
        let q = |p: f64| h.latency.quantile(p).map(|v| round1(v.0 as f64 / 1e3));
        let mean_iops = round1(total as f64 / n / period_s);
        let operating = h
            .operating
            .as_ref()
            .map(|o| OperatingSummary::new(o, scale, mean_iops, q(0.5).unwrap_or(0.0)));
        HostSummary {
            host: h.name.clone(),
            reservation_iops: spec.reservation_iops,
            limit_iops: spec.limit_iops,
            periods,
            mean_iops,
            mib_per_s: round1(bytes as f64 / n / period_s / (1u64 << 20) as f64),
            reservation_met_fraction: met,
            latency_us: LatencySummary {
                p50: q(0.5),
                p99: q(0.99),
                p999: q(0.999),
            },
            operating,
        }
    }
}

impl OperatingSummary {
    /// A host's entitlement report `o` against its `mean_iops` and its `p50` latency
    /// (µs).
    fn new(o: &HostOperating, scale: u64, mean_iops: f64, p50: f64) -> OperatingSummary {
        let known: Vec<u64> = o.entitled.iter().flatten().copied().collect();
        let e = known.iter().sum::<u64>() as f64 / known.len().max(1) as f64 * scale as f64;
        let contending =
            o.contending.iter().filter(|&&c| c).count() as f64 / o.contending.len().max(1) as f64;
        let wait_us = o.held_ns as f64 / o.admitted.max(1) as f64 / 1e3;
        OperatingSummary {
            contending_fraction: (contending * 1e4).round() / 1e4,
            entitled_iops: round1(e),
            vs_entitled: if e > 0.0 {
                ((mean_iops / e - 1.0) * 1e4).round() / 1e4
            } else {
                0.0
            },
            mean_wait_us: (wait_us * 100.0).round() / 100.0,
            wait_vs_p50: if p50 > 0.0 {
                (wait_us / p50 * 1e4).round() / 1e4
            } else {
                0.0
            },
        }
    }
}

impl Summary {
    /// Builds the summary of `outcomes` (in the order they should appear).
    pub fn new(scenario: &Scenario, outcomes: &[Outcome]) -> Summary {
        let first = outcomes.first();
        let scale = first.map_or(scenario.scale, |o| o.scale);
        let seed = first.map_or(scenario.seed, |o| o.seed);
        let measured = first.map_or(0, |o| {
            o.hosts.first().map_or(0, |h| h.completed.len() as u32)
        });
        let period_ns = scenario.qos.period.0;
        let policies = outcomes
            .iter()
            .map(|o| PolicySummary::new(scenario, o, scale, measured, period_ns))
            .collect();
        Summary {
            scenario: scenario.name.clone(),
            seed,
            scale,
            period_ms: period_ns / 1_000_000,
            warmup_periods: scenario.warmup_periods,
            measured_periods: measured,
            policies,
        }
    }

    /// The summary as pretty JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("summaries serialize")
    }

    /// The readable table: one block per policy, one row per host.
    pub fn table(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "scenario {}: seed {}, {} measured periods of {} ms after {} warm-up",
            self.scenario, self.seed, self.measured_periods, self.period_ms, self.warmup_periods
        );
        if self.scale > 1 {
            let _ = writeln!(
                s,
                "scale 1/{0}: simulated with every rate divided by {0}; counts are shown multiplied back by {0}.\n\
                 NOTE: latencies (p50@1/{0} ...) are those of the slowed-down simulation, NOT of the real target: \
                 service and queueing times are about {0}x longer than at full rate. `--scale 1` gives real-scale latencies ({0}x more events).",
                self.scale
            );
        }
        for p in &self.policies {
            self.policy_block(&mut s, p);
        }
        let _ = write!(s, "\n{LEGEND}");
        s
    }

    /// One policy's block of the table: its totals and verdict, then its hosts.
    fn policy_block(&self, s: &mut String, p: &PolicySummary) {
        let _ = writeln!(s);
        let title = match &p.variant {
            Some(v) => format!("{} [{}]", p.policy, v),
            None => p.policy.clone(),
        };
        let _ = write!(s, "policy {title}: total {} IOPS", thousands(p.total_iops));
        if p.total_mib_per_s >= 1.0 {
            let _ = write!(s, ", {:.0} MiB/s", p.total_mib_per_s);
        }
        let _ = writeln!(s);
        let _ = writeln!(s, "  verdict: {}", self.verdict(p));
        if let (Some(first), Some(last)) = (
            p.capacity_estimate_iops.first(),
            p.capacity_estimate_iops.last(),
        ) {
            let _ = writeln!(
                s,
                "  capacity estimate: {} IOPS in the first measured period, {} in the last",
                thousands(*first as f64),
                thousands(*last as f64)
            );
        }
        if let Some(d) = &p.depth {
            let _ = writeln!(s, "  {}", depth_line(d));
        }
        if let Some(c) = &p.circulation {
            let _ = writeln!(s, "  {}", circulation_line(c));
        }
        let width = p
            .hosts
            .iter()
            .map(|h| h.host.len())
            .max()
            .unwrap_or(4)
            .max(4);
        self.host_rows(s, p, width);
        if p.hosts.iter().any(|h| h.operating.is_some()) {
            s.push_str(&self.operating_block(p, width));
        }
        for w in &p.warnings {
            let _ = writeln!(s, "  warning: {w}");
        }
    }

    /// The header and one row per host of a policy's block.
    fn host_rows(&self, s: &mut String, p: &PolicySummary, width: usize) {
        let lat = |q: &str| {
            if self.scale > 1 {
                format!("{q}@1/{}", self.scale)
            } else {
                q.to_string()
            }
        };
        let _ = writeln!(
            s,
            "  {:<width$} {:>11} {:>11} {:>11} {:>11} {:>11} {:>8} {:>7} {:>11} {:>11} {:>11}",
            "host",
            "reservation",
            "limit",
            "min/period",
            "mean/period",
            "max/period",
            "MiB/s",
            "met",
            lat("p50"),
            lat("p99"),
            lat("p99.9")
        );
        for h in &p.hosts {
            let per_period = |v: Option<u64>| {
                v.map_or("-".to_string(), |r| {
                    thousands(r as f64 * self.period_ms as f64 / 1000.0)
                })
            };
            let min = h.periods.iter().min().copied().unwrap_or(0);
            let max = h.periods.iter().max().copied().unwrap_or(0);
            let mean = h.periods.iter().sum::<u64>() as f64 / h.periods.len().max(1) as f64;
            let met = h
                .reservation_met_fraction
                .map_or("-".to_string(), |m| format!("{:.1}%", m * 100.0));
            let _ = writeln!(
                s,
                "  {:<width$} {:>11} {:>11} {:>11} {:>11} {:>11} {:>8} {:>7} {:>11} {:>11} {:>11}",
                h.host,
                per_period(h.reservation_iops),
                per_period(h.limit_iops),
                thousands(min as f64),
                thousands(mean),
                thousands(max as f64),
                format!("{:.1}", h.mib_per_s),
                met,
                latency(h.latency_us.p50),
                latency(h.latency_us.p99),
                latency(h.latency_us.p999),
            );
        }
    }

    /// Sharing `operating_point`: each host against its entitlement, and issue 26's
    /// acceptance checked: total >= 97 % of bare, every contending host within 10 % of
    /// e_i, self-limited hosts' wait in QoS (at most 5 % of their p50 latency),
    /// reservations met in >= 99 % of periods.
    fn operating_block(&self, p: &PolicySummary, width: usize) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "  {:<width$} {:>10} {:>11} {:>11} {:>8} {:>10} {:>9}",
            "entitled", "contending", "e_i/s", "achieved/s", "vs e_i", "wait", "wait/p50"
        );
        let (mut worst_dev, mut worst_wait) = (None::<(f64, &str)>, None::<(f64, &str)>);
        for h in &p.hosts {
            let Some(o) = h.operating else { continue };
            let contending = o.contending_fraction >= 0.5;
            let _ = writeln!(
                s,
                "  {:<width$} {:>10} {:>11} {:>11} {:>+7.1}% {:>8.1}us {:>8.1}%",
                h.host,
                format!("{:.0}%", o.contending_fraction * 100.0),
                thousands(o.entitled_iops),
                thousands(h.mean_iops),
                o.vs_entitled * 100.0,
                o.mean_wait_us,
                o.wait_vs_p50 * 100.0
            );
            if contending {
                if worst_dev.is_none_or(|(d, _)| o.vs_entitled.abs() > d) {
                    worst_dev = Some((o.vs_entitled.abs(), &h.host));
                }
            } else if worst_wait.is_none_or(|(w, _)| o.wait_vs_p50 > w) {
                worst_wait = Some((o.wait_vs_p50, &h.host));
            }
        }
        let mut checks = Vec::new();
        let bare = self
            .policies
            .iter()
            .find(|b| b.policy == "bare" && b.variant == p.variant && b.total_iops > 0.0);
        if let Some(b) = bare {
            let r = p.total_iops / b.total_iops;
            checks.push(format!(
                "total {:.1}% of bare ({})",
                r * 100.0,
                if r >= 0.97 { "ok" } else { "below 97%" }
            ));
        }
        checks.push(match worst_dev {
            Some((d, h)) => format!(
                "contending hosts within {:.1}% of e_i (worst {h}: {})",
                d * 100.0,
                if d <= 0.10 { "ok" } else { "beyond 10%" }
            ),
            None => "no contending host".to_string(),
        });
        if let Some((w, h)) = worst_wait {
            checks.push(format!(
                "self-limited wait at most {:.1}% of p50 (worst {h}: {})",
                w * 100.0,
                if w <= 0.05 { "ok" } else { "beyond 5%" }
            ));
        }
        let met: Vec<f64> = p
            .hosts
            .iter()
            .filter_map(|h| h.reservation_met_fraction)
            .collect();
        if let Some(m) = met.iter().copied().reduce(f64::min) {
            checks.push(format!(
                "reservations met in >= {:.1}% of periods ({})",
                m * 100.0,
                if m >= 0.99 { "ok" } else { "below 99%" }
            ));
        }
        let _ = writeln!(s, "  check: {}", checks.join("; "));
        s
    }

    /// One line: did the hosts get their reservations, and at what cost in throughput.
    pub fn verdict(&self, p: &PolicySummary) -> String {
        let reserved: Vec<&HostSummary> = p
            .hosts
            .iter()
            .filter(|h| h.reservation_met_fraction.is_some())
            .collect();
        let mut out = if reserved.is_empty() {
            "no host has a reservation".to_string()
        } else {
            let always = reserved
                .iter()
                .filter(|h| h.reservation_met_fraction == Some(1.0))
                .count();
            let worst = reserved
                .iter()
                .min_by(|a, b| {
                    a.reservation_met_fraction
                        .unwrap_or(0.0)
                        .total_cmp(&b.reservation_met_fraction.unwrap_or(0.0))
                })
                .expect("not empty");
            if always == reserved.len() {
                format!(
                    "all {} hosts with a reservation met it in 100% of periods",
                    reserved.len()
                )
            } else {
                format!(
                    "{always} of {} hosts with a reservation met it in every period (worst: {} in {:.1}%)",
                    reserved.len(),
                    worst.host,
                    worst.reservation_met_fraction.unwrap_or(0.0) * 100.0
                )
            }
        };
        let _ = write!(out, "; total {} IOPS", thousands(p.total_iops));
        let bare = self
            .policies
            .iter()
            .find(|b| b.policy == "bare" && b.variant == p.variant);
        if let Some(b) = bare.filter(|b| b.total_iops > 0.0 && b.policy != p.policy) {
            let _ = write!(
                out,
                " = {:.1}% of bare",
                p.total_iops / b.total_iops * 100.0
            );
        }
        out
    }
}

/// `1234567.8` as `1,234,568`.
pub fn thousands(v: f64) -> String {
    let n = v.round() as i64;
    let digits = n.unsigned_abs().to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    if n < 0 { format!("-{out}") } else { out }
}

fn latency(us: Option<f64>) -> String {
    match us {
        None => "-".into(),
        Some(v) if v >= 10_000.0 => format!("{:.1}ms", v / 1000.0),
        Some(v) if v >= 1000.0 => format!("{:.2}ms", v / 1000.0),
        Some(v) => format!("{v:.0}us"),
    }
}

/// The depth summary of outcome `o` (rates scaled back by `scale`).
fn depth_summary(sc: &Scenario, o: &Outcome, scale: u64, period_ns: u64) -> Option<DepthSummary> {
    let op = o.operating_point?;
    let t = &sc.target;
    let end_s = (sc.warmup_periods + o.hosts.first().map_or(0, |h| h.completed.len() as u32))
        as f64
        * period_ns as f64
        / 1e9;
    let factor = t
        .capacity_changes
        .iter()
        .rfind(|(at, _)| at.0 as f64 / 1e9 <= end_s)
        .map_or(1.0, |&(_, f)| f);
    let model = |n: f64| -> u64 {
        let c = t.capacity_iops as f64 * factor;
        let r = if t.half_depth > 0.0 {
            c * n / (n + t.half_depth)
        } else {
            c
        };
        r.round() as u64
    };
    let commands = |milli: u64| (milli as f64 / 100.0).round() / 10.0;
    Some(DepthSummary {
        efficiency_milli: o.efficiency_milli,
        in_flight: commands(op.in_flight_milli),
        iops: op.rate * scale,
        max_iops: op.max_rate * scale,
        model_iops: model(commands(op.in_flight_milli)),
        model_flat: t.half_depth == 0.0,
        curve: o
            .depth_curve
            .iter()
            .map(|p| DepthPoint {
                in_flight: commands(p.in_flight_milli),
                iops: p.rate * scale,
                model_iops: model(commands(p.in_flight_milli)),
            })
            .collect(),
    })
}

/// One line on the operating point over the hosts' circulation.
fn circulation_line(c: &CirculationSummary) -> String {
    let n_star = match (c.n_star, c.learned) {
        (Some(n), true) => format!("N* {n} learned"),
        (None, true) => "N* not learned yet".to_string(),
        (Some(n), false) => format!("N - H* {n} at the end (N* given)"),
        (None, false) => "N* unknown".to_string(),
    };
    let ratio = c
        .ratio_milli
        .map(|r| format!(", held / open {:.3}", r as f64 / 1000.0))
        .unwrap_or_default();
    format!(
        "over circulation: N {:.1} commands, hold targets H* {:.1} (means of the measured periods' ends); {n_star}{ratio}",
        c.commands, c.hold_target
    )
}

/// One line on the operating point for the table.
fn depth_line(d: &DepthSummary) -> String {
    let model = if d.model_flat {
        "the model has no depth curve (as fast at any depth: it overstates what weighted \
         sharing can give on a real target)"
            .to_string()
    } else {
        format!("the model does {} there", thousands(d.model_iops as f64))
    };
    format!(
        "depth curve: {:.1} commands in flight give {} IOPS, {:.1} % of the most seen ({}; eta {:.1} %); {model}",
        d.in_flight,
        thousands(d.iops as f64),
        d.iops as f64 * 100.0 / d.max_iops.max(1) as f64,
        thousands(d.max_iops as f64),
        d.efficiency_milli as f64 / 10.0,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thousands_groups_digits() {
        assert_eq!(thousands(0.0), "0");
        assert_eq!(thousands(999.0), "999");
        assert_eq!(thousands(1000.0), "1,000");
        assert_eq!(thousands(1_570_000.4), "1,570,000");
        assert_eq!(thousands(-12345.0), "-12,345");
    }

    #[test]
    fn latency_picks_a_unit() {
        assert_eq!(latency(Some(12.3)), "12us");
        assert_eq!(latency(Some(1234.0)), "1.23ms");
        assert_eq!(latency(Some(23456.0)), "23.5ms");
        assert_eq!(latency(None), "-");
    }
}
