//! `qos-lab check`: admission control only (Haechi Definition 2, as qos-core implements
//! it): which reservations fit the target, and why not. Nothing is simulated.

use std::fmt::Write as _;

use qos_core::{
    DomainConfig, ExcessSharing, GroupBudgets, ReservationRelease, TokenMode,
    check_grouped_admission,
};

use crate::report::thousands;
use crate::scenario::{RunSpec, Scenario};

/// The outcome of a check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckReport {
    /// Readable explanation, one block per variant.
    pub text: String,
    /// Every variant's reservations were admitted.
    pub admitted: bool,
}

/// Checks every run (variant) of `scenario` with the scenario's real figures.
pub fn check(scenario: &Scenario) -> CheckReport {
    let domain = scenario.domain_config(
        1,
        TokenMode::Haechi,
        ReservationRelease::Paced,
        ExcessSharing::Weighted,
    );
    let group_configs: Vec<_> = scenario.groups.iter().map(|g| g.group_config(1)).collect();
    let group_budgets: Vec<_> = group_configs
        .iter()
        .map(|g| {
            g.budgets(&domain)
                .expect("validated when the scenario was loaded")
        })
        .collect();
    let groups: Vec<_> = group_configs
        .iter()
        .zip(&group_budgets)
        .map(|(g, b)| (g.name.as_str(), b))
        .collect();
    // The lab's targets are always profiled (`profiled_iops` is required).
    let c_g = domain.capacity.iops.unwrap_or(u64::MAX);
    let c_l = scenario.target.per_host_max_iops;
    let mut text = String::new();
    let mut admitted = true;
    let _ = writeln!(
        text,
        "scenario {}: C_G = {} IOPS (profiled capacity), C_L = {} IOPS per host, period {} ms",
        scenario.name,
        thousands(c_g as f64),
        thousands(c_l as f64),
        domain.period.0 / 1_000_000
    );
    for run in &scenario.runs {
        admitted &= check_run(&mut text, run, &domain, &groups, c_g, c_l);
    }
    let _ = writeln!(
        text,
        "\nThis is the static check at the start of a period. Whether a host reaches its reservation at run time also depends on its request pattern: `qos-lab run` shows it."
    );
    CheckReport { text, admitted }
}

/// One run's block: the local constraint host by host, the aggregate one, and the
/// core's grouped admission. Returns whether the run's reservations were admitted.
fn check_run(
    text: &mut String,
    run: &RunSpec,
    domain: &DomainConfig,
    groups: &[(&str, &GroupBudgets)],
    c_g: u64,
    c_l: u64,
) -> bool {
    let _ = writeln!(text);
    if let Some(v) = &run.variant {
        let _ = writeln!(text, "variant {v}:");
    }
    let configs: Vec<_> = run.hosts.iter().map(|h| h.host_config(1)).collect();
    let budgets: Vec<_> = configs
        .iter()
        .map(|c| {
            c.budgets(domain)
                .expect("validated when the scenario was loaded")
        })
        .collect();
    let reserved = local_constraints(text, run, c_l);
    let _ = writeln!(
        text,
        "  aggregate constraint (sum R <= C_G): {} of {} IOPS reserved ({:.1}%)",
        thousands(reserved as f64),
        thousands(c_g as f64),
        reserved as f64 * 100.0 / c_g as f64
    );
    match check_grouped_admission(
        domain,
        configs
            .iter()
            .zip(&budgets)
            .map(|(c, b)| (c.host_nqn.as_str(), b, c.group.as_deref())),
        groups,
    ) {
        Ok(rep) => {
            let _ = writeln!(
                text,
                "  admitted: {} IOPS left unreserved for the global pool",
                thousands(rep.unreserved.ops as f64 * 1e9 / domain.period.0 as f64)
            );
            true
        }
        Err(e) => {
            let _ = writeln!(text, "  REFUSED:");
            for v in &e.violations {
                let _ = writeln!(text, "  - {v}");
            }
            false
        }
    }
}

/// The table of hosts with their reservation against C_L; returns the sum reserved.
fn local_constraints(text: &mut String, run: &RunSpec, c_l: u64) -> u64 {
    let width = run
        .hosts
        .iter()
        .map(|h| h.name.len())
        .max()
        .unwrap_or(4)
        .max(4);
    let _ = writeln!(
        text,
        "  {:<width$} {:>12} {:>12}  local constraint (R <= C_L)",
        "host", "reservation", "limit"
    );
    let mut reserved = 0u64;
    for h in &run.hosts {
        let r = h.reservation_iops.unwrap_or(0);
        reserved += r;
        let fits = if r == 0 {
            "no reservation".to_string()
        } else if r <= c_l {
            format!("fits ({:.0}% of C_L)", r as f64 * 100.0 / c_l as f64)
        } else {
            format!(
                "does NOT fit: {} IOPS above C_L",
                thousands((r - c_l) as f64)
            )
        };
        let show = |v: Option<u64>| v.map_or("-".into(), |v| thousands(v as f64));
        let _ = writeln!(
            text,
            "  {:<width$} {:>12} {:>12}  {fits}",
            h.name,
            show(h.reservation_iops),
            show(h.limit_iops)
        );
    }
    reserved
}
