//! The JSON-RPC methods (contract: `docs/rpc.md`). Every handler runs on the app
//! thread; every refusal is a JSON-RPC error with a negative errno code and a message
//! that names the object and the numbers.

use serde::Deserialize;
use serde_json::{Value, json};
use spdk_sys::rpc;
use spdk_sys::vbdev::{self, Node};

use crate::io::QosTgt;
use crate::params::{
    BdevParams, DomainUpdate, GroupKey, GroupParams, GroupQuery, GroupUpdate, HostKey, HostParams,
    HostQuery, HostUpdate, NameQuery, Refusal, StatsQuery, code, parse,
};
use crate::{qos_bdev, registry, stats};

/// Parameters that must name one object.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct NameReq {
    name: String,
}

fn domain_create(p: Value) -> Result<Value, Refusal> {
    rpc::apply("qos_domain_create", p, registry::create_domain)
}

fn domain_update(p: Value) -> Result<Value, Refusal> {
    rpc::apply("qos_domain_update", p, |u: DomainUpdate| {
        registry::update_domain(&u)
    })
}

fn domain_delete(p: Value) -> Result<Value, Refusal> {
    rpc::apply("qos_domain_delete", p, |n: NameReq| {
        registry::delete_domain(&n.name)
    })
}

fn domain_get(p: Value) -> Result<Value, Refusal> {
    let q: NameQuery = parse("qos_domain_get", p)?;
    registry::with(|r| match &q.name {
        Some(n) => Ok(json!([r.domain(n)?.params(n).to_json()])),
        None => Ok(Value::Array(
            r.domains
                .iter()
                .map(|(n, d)| d.params(n).to_json())
                .collect(),
        )),
    })
}

fn host_set(p: Value) -> Result<Value, Refusal> {
    rpc::apply("qos_host_set", p, |h: HostParams| registry::set_host(&h))
}

fn host_update(p: Value) -> Result<Value, Refusal> {
    rpc::apply("qos_host_update", p, |u: HostUpdate| {
        registry::update_host(&u)
    })
}

fn host_remove(p: Value) -> Result<Value, Refusal> {
    rpc::apply("qos_host_remove", p, |k: HostKey| {
        registry::remove_host(&k.domain, &k.host_nqn)
    })
}

fn host_get(p: Value) -> Result<Value, Refusal> {
    let q: HostQuery = parse("qos_host_get", p)?;
    registry::with(|r| {
        let hosts = registry::host_params(r, &q.domain)?;
        match &q.host_nqn {
            Some(n) => hosts
                .into_iter()
                .find(|h| &h.host_nqn == n)
                .map(|h| json!([h.to_json()]))
                .ok_or_else(|| {
                    Refusal::new(
                        code::ENOENT,
                        format!("host {n:?} is not configured in QoS domain {:?}", q.domain),
                    )
                }),
            None => Ok(Value::Array(
                hosts.iter().map(HostParams::to_json).collect(),
            )),
        }
    })
}

fn group_create(p: Value) -> Result<Value, Refusal> {
    rpc::apply("qos_group_create", p, |g: GroupParams| {
        registry::create_group(&g)
    })
}

fn group_update(p: Value) -> Result<Value, Refusal> {
    rpc::apply("qos_group_update", p, |u: GroupUpdate| {
        registry::update_group(&u)
    })
}

fn group_delete(p: Value) -> Result<Value, Refusal> {
    rpc::apply("qos_group_delete", p, |k: GroupKey| {
        registry::delete_group(&k.domain, &k.name)
    })
}

fn group_get(p: Value) -> Result<Value, Refusal> {
    let q: GroupQuery = parse("qos_group_get", p)?;
    registry::with(|r| match &q.name {
        Some(n) => Ok(json!([registry::group_param(r, &q.domain, n)?.to_json()])),
        None => Ok(Value::Array(
            registry::group_params(r, &q.domain)?
                .iter()
                .map(GroupParams::to_json)
                .collect(),
        )),
    })
}

fn bdev_create(p: Value) -> Result<Value, Refusal> {
    let b: BdevParams = parse("qos_bdev_create", p)?;
    Ok(json!(qos_bdev::create(b)?))
}

fn bdev_get(p: Value) -> Result<Value, Refusal> {
    let q: NameQuery = parse("qos_bdev_get", p)?;
    registry::with(|r| {
        let one = |n: &Node<QosTgt>, deleting: bool| {
            let mut v = serde_json::to_value(qos_bdev::params(n)).unwrap_or(Value::Null);
            v["deleting"] = json!(deleting);
            v
        };
        match &q.name {
            Some(n) => r
                .bdevs
                .iter()
                .find(|(name, _, _)| name == n)
                .map(|(_, b, d)| json!([one(b, d)]))
                .ok_or_else(|| Refusal::new(code::ENOENT, format!("unknown QoS bdev {n:?}"))),
            None => Ok(Value::Array(
                r.bdevs.iter().map(|(_, b, d)| one(b, d)).collect(),
            )),
        }
    })
}

/// `qos_stats_get`: every form is serialised typed, per domain (no `Value` tree).
fn stats_get(p: Value) -> Result<Vec<Box<serde_json::value::RawValue>>, Refusal> {
    let q: StatsQuery = parse("qos_stats_get", p)?;
    let periods = q
        .periods_or_default()
        .min(qos_core::monitor::HISTORY_PERIODS);
    let shape = stats::Shape {
        periods,
        compact: q.compact,
        counters: q.counters,
        host_nqn: q.host_nqn.as_deref(),
    };
    let raw = |n: &str, d: &registry::Domain| {
        serde_json::value::RawValue::from_string(stats::domain(n, &stats::Source::of(d), shape))
            .map_err(|e| Refusal::new(code::EINVAL, format!("qos_stats_get: {e}")))
    };
    registry::with(|r| match &q.domain {
        Some(n) => Ok(vec![raw(n, r.domain(n)?)?]),
        None => r.domains.iter().map(|(n, d)| raw(n, d)).collect(),
    })
}

const ANY: u32 = rpc::STARTUP | rpc::RUNTIME;

/// `qos_version_get`: the plugin's version, its token protocol's and its build.
fn version_get(p: Value) -> Result<Value, Refusal> {
    let _: rpc::NoParams = parse("qos_version_get", p)?;
    Ok(json!(rpc::VersionInfo::of("target")))
}

spdk_sys::rpc_methods! {
    MDomainCreate = c"qos_domain_create", ANY, |q, p| q.reply(domain_create(p));
    MDomainUpdate = c"qos_domain_update", rpc::RUNTIME, |q, p| q.reply(domain_update(p));
    MDomainDelete = c"qos_domain_delete", rpc::RUNTIME, |q, p| q.reply(domain_delete(p));
    MDomainGet = c"qos_domain_get", rpc::RUNTIME, |q, p| q.reply(domain_get(p));
    MHostSet = c"qos_host_set", ANY, |q, p| q.reply(host_set(p));
    MHostUpdate = c"qos_host_update", rpc::RUNTIME, |q, p| q.reply(host_update(p));
    MHostRemove = c"qos_host_remove", rpc::RUNTIME, |q, p| q.reply(host_remove(p));
    MHostGet = c"qos_host_get", rpc::RUNTIME, |q, p| q.reply(host_get(p));
    MGroupCreate = c"qos_group_create", ANY, |q, p| q.reply(group_create(p));
    MGroupUpdate = c"qos_group_update", rpc::RUNTIME, |q, p| q.reply(group_update(p));
    MGroupDelete = c"qos_group_delete", rpc::RUNTIME, |q, p| q.reply(group_delete(p));
    MGroupGet = c"qos_group_get", rpc::RUNTIME, |q, p| q.reply(group_get(p));
    MBdevCreate = c"qos_bdev_create", rpc::RUNTIME, |q, p| q.reply(bdev_create(p));
    MBdevDelete = c"qos_bdev_delete", rpc::RUNTIME, |q, p| {
        vbdev::rpc_delete::<QosTgt>("qos_bdev_delete", q, p)
    };
    MBdevGet = c"qos_bdev_get", rpc::RUNTIME, |q, p| q.reply(bdev_get(p));
    MStatsGet = c"qos_stats_get", rpc::RUNTIME, |q, p| q.reply_with(stats_get(p));
    MVersionGet = c"qos_version_get", ANY, |q, p| q.reply(version_get(p));
}
