//! The policies a scenario compares (`policies = [...]`): their names, what each
//! enforces at the target, and the names of earlier versions of the lab.

use qos_core::{ExcessSharing, ReservationRelease, TokenMode};

use super::ScenarioError;
use super::context::{Ctx, top};

/// Who enforces what at the target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Enforcement {
    /// No QoS at all.
    Bare,
    /// SPDK's bdev QoS: one rate limit per namespace, shared by all its hosts.
    NsLimit,
    /// nvmf-qos's target plugin with these domain settings.
    Qos(QosSettings),
}

/// The domain settings a QoS policy runs with: the product's `mode`, `release` and
/// `sharing` (docs/rpc.md, `qos_domain_create`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QosSettings {
    pub mode: TokenMode,
    pub release: ReservationRelease,
    pub sharing: ExcessSharing,
}

/// A policy compared in a run: an enforcement, with or without chunk pacing at the
/// cooperative initiators.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    pub enforcement: Enforcement,
    pub pacing: bool,
}

/// Policy names of earlier versions of the lab, and what they are called now.
const RENAMED: [(&str, &str); 4] = [
    ("haechi", "weighted"),
    ("haechi-fcfs", "first_come"),
    ("haechi-start", "first_come/start"),
    ("basic-haechi", "first_come/start/basic"),
];

impl Policy {
    /// The names of the policies the lab knows best (any `SHARING[/start][/basic]`
    /// parses, each optionally followed by `+pacing`).
    pub const NAMES: [&'static str; 6] = [
        "bare",
        "ns-limit",
        "first_come/start/basic",
        "first_come/start",
        "first_come",
        "weighted",
    ];

    /// Parses `bare`, `ns-limit`, or the product's settings as `SHARING[/RELEASE][/MODE]`
    /// (`first_come` or `weighted`; `paced` or `start`, default `paced`; `haechi` or
    /// `basic`, default `haechi`), each optionally followed by `+pacing`.
    pub fn parse(s: &str) -> Option<Policy> {
        let (base, pacing) = match s.strip_suffix("+pacing") {
            Some(b) => (b, true),
            None => (s, false),
        };
        let enforcement = match base {
            "bare" => Enforcement::Bare,
            "ns-limit" => Enforcement::NsLimit,
            _ => Enforcement::Qos(QosSettings::parse(base)?),
        };
        Some(Policy {
            enforcement,
            pacing,
        })
    }

    /// For a name that does not parse: the name it has now, if it is an earlier one.
    pub fn renamed(s: &str) -> Option<String> {
        let (base, pacing) = match s.strip_suffix("+pacing") {
            Some(b) => (b, "+pacing"),
            None => (s, ""),
        };
        RENAMED
            .iter()
            .find(|(old, _)| *old == base)
            .map(|(_, new)| format!("{new}{pacing}"))
    }

    pub fn name(&self) -> String {
        let base = match self.enforcement {
            Enforcement::Bare => "bare".to_string(),
            Enforcement::NsLimit => "ns-limit".to_string(),
            Enforcement::Qos(q) => q.name(),
        };
        if self.pacing {
            format!("{base}+pacing")
        } else {
            base
        }
    }

    /// The target plugin's settings, for the policies that run it.
    pub fn qos(&self) -> Option<QosSettings> {
        match self.enforcement {
            Enforcement::Qos(q) => Some(q),
            _ => None,
        }
    }

    /// Haechi's token ledger runs at the target.
    pub fn uses_tokens(&self) -> bool {
        self.qos().is_some()
    }
}

impl QosSettings {
    fn parse(s: &str) -> Option<QosSettings> {
        let mut parts = s.split('/');
        let sharing = match parts.next()? {
            "first_come" => ExcessSharing::FirstCome,
            "weighted" => ExcessSharing::Weighted,
            "operating_point" => ExcessSharing::OperatingPoint,
            _ => return None,
        };
        let mut q = QosSettings {
            mode: TokenMode::Haechi,
            release: ReservationRelease::Paced,
            sharing,
        };
        let (mut release_given, mut mode_given) = (false, false);
        for part in parts {
            match part {
                "start" | "paced" if !release_given => {
                    release_given = true;
                    if part == "start" {
                        q.release = ReservationRelease::Start;
                    }
                }
                "basic" | "haechi" if !mode_given => {
                    mode_given = true;
                    if part == "basic" {
                        q.mode = TokenMode::Basic;
                    }
                }
                _ => return None,
            }
        }
        Some(q)
    }

    /// `SHARING[/start][/basic]`: the product's defaults (paced release, Haechi's
    /// conversion) are left out.
    fn name(&self) -> String {
        let mut n = match self.sharing {
            ExcessSharing::FirstCome => "first_come",
            ExcessSharing::Weighted => "weighted",
            ExcessSharing::OperatingPoint => "operating_point",
        }
        .to_string();
        if self.release == ReservationRelease::Start {
            n.push_str("/start");
        }
        if self.mode == TokenMode::Basic {
            n.push_str("/basic");
        }
        n
    }
}

/// `policies`: the listed ones in order, or bare, ns-limit, first_come/start/basic and
/// weighted when the field is left out.
pub(super) fn resolve_policies(
    list: Option<&Vec<String>>,
    ctx: &Ctx<'_>,
) -> Result<Vec<Policy>, ScenarioError> {
    let Some(list) = list else {
        return Ok(vec![
            Policy::parse("bare").expect("known"),
            Policy::parse("ns-limit").expect("known"),
            Policy::parse("first_come/start/basic").expect("known"),
            Policy::parse("weighted").expect("known"),
        ]);
    };
    if list.is_empty() {
        return Err(ctx.invalid(
            &top("policies"),
            "name at least one policy: bare, ns-limit, first_come or weighted (each may end in +pacing)",
        ));
    }
    let mut out = Vec::new();
    for (i, s) in list.iter().enumerate() {
        let p = Policy::parse(s).ok_or_else(|| {
            let hint = match Policy::renamed(s) {
                Some(now) => format!("policy {s:?} is called {now:?} now"),
                None => format!(
                    "unknown policy {s:?}; use bare, ns-limit, or the target's settings \
                     as SHARING[/start][/basic] (first_come or weighted; reservations \
                     released at the period start; no conversion), each optionally \
                     followed by +pacing"
                ),
            };
            ctx.invalid(&top("policies").index(i), hint)
        })?;
        if out.contains(&p) {
            return Err(ctx.invalid(
                &top("policies").index(i),
                format!("policy {s:?} is listed twice; remove one"),
            ));
        }
        out.push(p);
    }
    Ok(out)
}
