//! The operator's commands on a cluster's state in etcd: create and delete a cluster,
//! set and remove a host's cluster-wide contract (with the cluster's admission check),
//! and the view of every host's global and per-target figures.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use qos_core::cluster::{
    ClusterAdmissionError, ClusterConfigError, ClusterHost, DivideConfig, check_cluster_admission,
    cold_share,
};
use serde_json::{Value, json};
use thiserror::Error;

use crate::division;
use crate::keys::{
    ClusterRecord, DemandRecord, KEY_SCHEMA, Keys, MemberRecord, NameError, check_name, hosts_of,
    parse, parts_list_paths_only,
};
use crate::store::{Store, StoreError};

/// An operator command that did not go through.
#[derive(Debug, Error)]
pub enum AdminError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Name(#[from] NameError),
    #[error(transparent)]
    Config(#[from] ClusterConfigError),
    #[error(transparent)]
    Admission(#[from] ClusterAdmissionError),
    #[error("cluster {0} already exists; `cluster create --update` changes its settings")]
    Exists(String),
    #[error("cluster {0} does not exist; create it with `nvmf-qos-agent cluster create`")]
    NoCluster(String),
    #[error("cluster {cluster} still has {what}; {fix}")]
    NotEmpty {
        cluster: String,
        what: String,
        fix: &'static str,
    },
    #[error("host {nqn} is not in cluster {cluster}")]
    NoHost { cluster: String, nqn: String },
    #[error("host NQN {0:?}: use 1 ..= 223 printable ASCII characters without spaces or '/'")]
    BadNqn(String),
    #[error(
        "key schema {0}: this nvmf-qos-agent knows schemas 1 (one division record), 2 (a record per target) and 3 (a record per target listing the hosts with a path there); use --key-schema 3, or 2 or 1 for a cluster that agents older than that schema must still join"
    )]
    Schema(u32),
    #[error("{key} holds what this version cannot read: {detail}")]
    Corrupt { key: String, detail: String },
    #[error(
        "no target of cluster {cluster} is live after waiting {waited_s} s, so a reservation of {reserved_iops} IOPS cannot be checked against capacity. Each target's agent (`nvmf-qos-agent run --cluster {cluster}`) joins at its first interval once the cluster exists and its target answers; `nvmf-qos-agent show --cluster {cluster}` lists the live targets. Start the agents (or check their logs), then run this again (or give it longer: --wait-s)"
    )]
    NoLiveTargets {
        cluster: String,
        reserved_iops: u64,
        waited_s: u64,
    },
}

fn require_cluster(
    s: &mut dyn Store,
    k: &Keys,
    cluster: &str,
) -> Result<ClusterRecord, AdminError> {
    let text = s
        .get(&k.config())?
        .ok_or_else(|| AdminError::NoCluster(cluster.into()))?;
    ClusterRecord::read(&k.config(), &text).map_err(|detail| AdminError::Corrupt {
        key: k.config(),
        detail,
    })
}

/// `cluster create`: writes the cluster's settings; refused if it exists unless `update`.
/// A new cluster gets the newest key schema; an update keeps the cluster's.
pub fn cluster_create(
    s: &mut dyn Store,
    cluster: &str,
    divide: DivideConfig,
    update: bool,
) -> Result<(), AdminError> {
    cluster_create_with_schema(s, cluster, divide, update, None)
}

/// [`cluster_create`] with the key schema to create the cluster with, or (with
/// `update`) to move it to (`None`: the newest for a new cluster, the cluster's own
/// for an update). Moving a cluster to schema 2 is the migration of docs/cluster.md:
/// every agent upgraded first (an older agent refuses a schema-2 cluster and keeps its
/// target's shares).
pub fn cluster_create_with_schema(
    s: &mut dyn Store,
    cluster: &str,
    divide: DivideConfig,
    update: bool,
    schema: Option<u32>,
) -> Result<(), AdminError> {
    check_name("cluster", cluster)?;
    divide.validate()?;
    if let Some(n) = schema
        && !(1..=KEY_SCHEMA).contains(&n)
    {
        return Err(AdminError::Schema(n));
    }
    let k = Keys::new(cluster);
    if !update && s.get(&k.config())?.is_some() {
        return Err(AdminError::Exists(cluster.into()));
    }
    let mut rec = ClusterRecord::new(divide);
    if update {
        rec.schema = require_cluster(s, &k, cluster)?.schema;
    }
    if let Some(n) = schema {
        rec.schema = n;
    }
    s.put(
        &k.config(),
        &serde_json::to_string(&rec).expect("record"),
        None,
    )?;
    Ok(())
}

/// `cluster delete`: refused while hosts are set or targets are live unless `force`.
pub fn cluster_delete(s: &mut dyn Store, cluster: &str, force: bool) -> Result<(), AdminError> {
    check_name("cluster", cluster)?;
    let k = Keys::new(cluster);
    require_cluster(s, &k, cluster)?;
    if !force {
        let hosts = s.list(&k.hosts())?.len();
        if hosts > 0 {
            return Err(AdminError::NotEmpty {
                cluster: cluster.into(),
                what: format!("{hosts} hosts"),
                fix: "remove them with `host remove` first, or pass --force",
            });
        }
        let members = s.list(&k.members())?.len();
        if members > 0 {
            return Err(AdminError::NotEmpty {
                cluster: cluster.into(),
                what: format!("{members} live targets"),
                fix: "stop their agents first (SIGTERM makes an agent leave), or pass --force",
            });
        }
    }
    s.delete_prefix(&k.all())?;
    Ok(())
}

fn check_nqn(nqn: &str) -> Result<(), AdminError> {
    let ok =
        (1..=223).contains(&nqn.len()) && nqn.bytes().all(|b| b.is_ascii_graphic() && b != b'/');
    if ok {
        Ok(())
    } else {
        Err(AdminError::BadNqn(nqn.into()))
    }
}

/// The live targets' records.
fn members(s: &mut dyn Store, k: &Keys) -> Result<Vec<MemberRecord>, AdminError> {
    s.list(&k.members())?
        .into_iter()
        .map(|(key, v)| parse(&key, &v).map_err(|detail| AdminError::Corrupt { key, detail }))
        .collect()
}

/// `host set`: a host's cluster-wide contract, checked against the others' and the live
/// targets' capacity estimates before it is written.
pub fn host_set(
    s: &mut dyn Store,
    cluster: &str,
    nqn: &str,
    host: ClusterHost,
) -> Result<(), AdminError> {
    check_name("cluster", cluster)?;
    check_nqn(nqn)?;
    let k = Keys::new(cluster);
    require_cluster(s, &k, cluster)?;
    let mut bad = Vec::new();
    let mut hosts = hosts_of(&k, s.list(&k.hosts())?, &mut bad);
    hosts.insert(nqn.to_string(), host.clone());
    let caps: Vec<u64> = members(s, &k)?.iter().map(|m| m.capacity_iops).collect();
    check_cluster_admission(&hosts, &caps)?;
    s.put(
        &k.host(nqn),
        &serde_json::to_string(&host).expect("record"),
        None,
    )?;
    Ok(())
}

/// `host set` as the command runs it: [`host_set`], retried every `poll` for up to
/// `wait` while no target of the cluster is live yet (right after `cluster create` the
/// agents join at their next interval), then refused saying what to do.
pub fn host_set_waiting(
    s: &mut dyn Store,
    cluster: &str,
    nqn: &str,
    host: ClusterHost,
    wait: std::time::Duration,
    poll: std::time::Duration,
) -> Result<(), AdminError> {
    let until = std::time::Instant::now() + wait;
    loop {
        match host_set(s, cluster, nqn, host.clone()) {
            Err(AdminError::Admission(ClusterAdmissionError::NoTargets { reserved_iops })) => {
                if std::time::Instant::now() >= until {
                    return Err(AdminError::NoLiveTargets {
                        cluster: cluster.into(),
                        reserved_iops,
                        waited_s: wait.as_secs(),
                    });
                }
                std::thread::sleep(poll);
            }
            r => return r,
        }
    }
}

/// `host remove`: the agents give the host back to each target's own settings (they
/// remove it from their domains) at their next interval.
pub fn host_remove(s: &mut dyn Store, cluster: &str, nqn: &str) -> Result<(), AdminError> {
    check_name("cluster", cluster)?;
    let k = Keys::new(cluster);
    require_cluster(s, &k, cluster)?;
    if s.get(&k.host(nqn))?.is_none() {
        return Err(AdminError::NoHost {
            cluster: cluster.into(),
            nqn: nqn.into(),
        });
    }
    s.delete(&k.host(nqn))?;
    Ok(())
}

/// Everything `show` prints, as JSON: the settings, the live targets, and per host its
/// contract, its share and demand at each target and what it did in all.
pub fn show(s: &mut dyn Store, cluster: &str) -> Result<Value, AdminError> {
    check_name("cluster", cluster)?;
    let k = Keys::new(cluster);
    let rec = require_cluster(s, &k, cluster)?;
    let mut bad = Vec::new();
    let hosts = hosts_of(&k, s.list(&k.hosts())?, &mut bad);
    let members = members(s, &k)?;
    let dprefix = k.demands();
    let demand: BTreeMap<String, DemandRecord> = s
        .list(&dprefix)?
        .into_iter()
        .filter_map(|(key, v)| {
            let t = key.strip_prefix(&dprefix)?.to_string();
            parse(&key, &v)
                .map_err(|e| bad.push(e))
                .ok()
                .map(|d| (t, d))
        })
        .collect();
    let shares = division::read_all(s, &k, rec.schema, &mut bad)?;
    let leader = s.get(&k.leader())?;
    let host_rows: Vec<Value> = hosts
        .iter()
        .map(|(nqn, h)| {
            let mut served = 0u64;
            let per_target: Vec<Value> = members
                .iter()
                .map(|m| {
                    let d = demand.get(&m.target).and_then(|d| d.hosts.get(nqn)).copied();
                    served += d.map_or(0, |d| d.served);
                    json!({
                        "target": m.target,
                        // A part of schema 3 leaves out the hosts without a path there.
                        "share": shares.as_ref().and_then(|(_, p)| p.get(&m.target)).and_then(|p| match p.get(nqn) {
                            Some(s) => Some(*s),
                            None => parts_list_paths_only(rec.schema).then(|| cold_share(h)),
                        }),
                        // A member record of schema 3 leaves out the cold shares too.
                        "applied": m.applied.get(nqn).copied().or_else(|| {
                            parts_list_paths_only(rec.schema).then(|| cold_share(h))
                        }),
                        "served_iops": d.map(|d| d.served),
                        "served_mibps": d.map(|d| d.served_bytes as f64 / (1u64 << 20) as f64),
                        "backlogged": d.map(|d| d.backlogged),
                        "held": d.map(|d| d.held_milli as f64 / 1000.0),
                    })
                })
                .collect();
            json!({
                "host_nqn": nqn,
                "reservation_iops": h.reservation_iops,
                "limit_iops": h.limit_iops,
                "reservation_mibps": h.reservation_mibps,
                "limit_mibps": h.limit_mibps,
                "weight": h.weight,
                "served_iops": served,
                "targets": per_target,
            })
        })
        .collect();
    Ok(json!({
        "cluster": cluster,
        "settings": rec,
        "leader": leader,
        "shares_seq": shares.as_ref().map(|(seq, _)| *seq),
        "targets": members,
        "hosts": host_rows,
        "unreadable": bad,
    }))
}

/// `show`'s table for a terminal.
pub fn show_text(v: &Value) -> String {
    let mut out = String::new();
    let opt = |v: &Value| match v.as_u64() {
        Some(n) => n.to_string(),
        None => "-".into(),
    };
    let _ = writeln!(
        out,
        "cluster {}  leader {}  division #{}",
        v["cluster"].as_str().unwrap_or("?"),
        v["leader"].as_str().unwrap_or("(none)"),
        opt(&v["shares_seq"])
    );
    for t in v["targets"].as_array().into_iter().flatten() {
        let _ = writeln!(
            out,
            "  target {:<16} domain {:<12} capacity {:>9} IOPS  period {} ms",
            t["target"].as_str().unwrap_or("?"),
            t["domain"].as_str().unwrap_or("?"),
            opt(&t["capacity_iops"]),
            opt(&t["period_ms"]),
        );
        // What the target refused at its agent's last interval, a line each.
        for e in t["error"].as_str().into_iter().flat_map(str::lines) {
            let _ = writeln!(out, "    REFUSED {e}");
        }
    }
    for h in v["hosts"].as_array().into_iter().flatten() {
        let _ = writeln!(
            out,
            "host {}  reservation {} IOPS  limit {} IOPS  weight {}  served {} IOPS",
            h["host_nqn"].as_str().unwrap_or("?"),
            opt(&h["reservation_iops"]),
            opt(&h["limit_iops"]),
            opt(&h["weight"]),
            opt(&h["served_iops"])
        );
        // A MiB/s contract gets a line of its own, its shares beside the IOPS ones.
        let mibps = h["reservation_mibps"].as_u64().unwrap_or(0) > 0 || h["limit_mibps"].is_u64();
        if mibps {
            let _ = writeln!(
                out,
                "     reservation {} MiB/s  limit {} MiB/s",
                opt(&h["reservation_mibps"]),
                opt(&h["limit_mibps"]),
            );
        }
        for t in h["targets"].as_array().into_iter().flatten() {
            let _ = writeln!(
                out,
                "    at {:<16} share {:>9} / {:>9}  applied {:>9} / {:>9}  served {:>9}  held {:>7}{}",
                t["target"].as_str().unwrap_or("?"),
                opt(&t["share"]["reservation_iops"]),
                opt(&t["share"]["limit_iops"]),
                opt(&t["applied"]["reservation_iops"]),
                opt(&t["applied"]["limit_iops"]),
                opt(&t["served_iops"]),
                t["held"].as_f64().map_or("-".into(), |h| format!("{h:.1}")),
                if t["backlogged"].as_bool() == Some(true) {
                    "  backlogged"
                } else {
                    ""
                }
            );
            if mibps {
                let _ = writeln!(
                    out,
                    "       {:<16} MiB/s {:>9} / {:>9}          {:>9} / {:>9}  served {:>9}",
                    "",
                    opt(&t["share"]["reservation_mibps"]),
                    opt(&t["share"]["limit_mibps"]),
                    opt(&t["applied"]["reservation_mibps"]),
                    opt(&t["applied"]["limit_mibps"]),
                    t["served_mibps"]
                        .as_f64()
                        .map_or("-".into(), |m| format!("{m:.1}")),
                );
            }
        }
    }
    for b in v["unreadable"].as_array().into_iter().flatten() {
        let _ = writeln!(out, "unreadable: {}", b.as_str().unwrap_or("?"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::hooked::{Call, Hooked};
    use std::time::{Duration, Instant};

    /// A store in which a target's agent joins (writes its member record) at the
    /// `join_after`-th listing of the members: an agent's first interval after the
    /// cluster was created. State: (member listings so far, join_after).
    fn joining(join_after: u32) -> Hooked<(u32, u32)> {
        Hooked::new((0, join_after), |(lists, join_after), inner, call| {
            let k = Keys::new("c");
            if !matches!(call, Call::List(p) if p == k.members()) {
                return Ok(());
            }
            *lists += 1;
            if *lists == *join_after {
                let m = MemberRecord {
                    target: "t1".into(),
                    domain: "d".into(),
                    capacity_iops: 100_000,
                    period_ms: 1000,
                    applied: BTreeMap::new(),
                    error: None,
                    handover_url: None,
                };
                let v = serde_json::to_string(&m).unwrap();
                inner.put(&k.member("t1"), &v, None)?;
            }
            Ok(())
        })
    }

    fn host() -> ClusterHost {
        ClusterHost {
            reservation_iops: 1000,
            limit_iops: None,
            weight: 1,
            ..Default::default()
        }
    }

    #[test]
    fn host_set_right_after_cluster_create_waits_for_an_agent_to_join() {
        let mut s = joining(3);
        cluster_create(&mut s, "c", DivideConfig::default(), false).unwrap();
        let poll = Duration::from_millis(10);
        host_set_waiting(&mut s, "c", "h", host(), Duration::from_secs(5), poll).unwrap();
        assert_eq!(s.state.0, 3, "retried until the agent joined");
        assert!(s.inner.get(&Keys::new("c").host("h")).unwrap().is_some());
    }

    #[test]
    fn host_set_without_any_agent_says_what_to_do_after_its_wait() {
        let mut s = joining(u32::MAX);
        cluster_create(&mut s, "c", DivideConfig::default(), false).unwrap();
        let t0 = Instant::now();
        let wait = Duration::from_millis(300);
        let e = host_set_waiting(&mut s, "c", "h", host(), wait, Duration::from_millis(20))
            .unwrap_err();
        assert!(t0.elapsed() >= wait);
        let text = e.to_string();
        for part in [
            "no target of cluster c is live after waiting 0 s",
            "`nvmf-qos-agent run --cluster c`",
            "`nvmf-qos-agent show --cluster c`",
            "--wait-s",
        ] {
            assert!(text.contains(part), "{part} not in: {text}");
        }
        // Without a reservation nothing waits.
        let free = ClusterHost {
            reservation_iops: 0,
            ..host()
        };
        let t0 = Instant::now();
        host_set_waiting(
            &mut s,
            "c",
            "h2",
            free,
            Duration::from_secs(5),
            Duration::from_millis(20),
        )
        .unwrap();
        assert!(t0.elapsed() < Duration::from_secs(1));
    }
}
