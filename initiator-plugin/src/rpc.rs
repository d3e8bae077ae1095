//! The `qos_ini_*` JSON-RPC methods (contract: `docs/rpc.md`, "Initiator plugin").
//! Every handler runs on the app thread; every refusal is a JSON-RPC error with a
//! negative errno code and a message that names the object and the numbers.

use serde_json::{Value, json};
use spdk_sys::rpc;
use spdk_sys::vbdev;

use crate::channel::IniPolicy;
use crate::node;
use crate::params::{CreateParams, NameQuery, Refusal, parse};

fn create(p: Value) -> Result<Value, Refusal> {
    let c: CreateParams = parse("qos_ini_bdev_create", p)?;
    Ok(json!(node::create(c)?))
}

fn set_options(p: Value) -> Result<Value, Refusal> {
    rpc::apply("qos_ini_bdev_set_options", p, node::set_options)
}

fn get(p: Value) -> Result<Value, Refusal> {
    let q: NameQuery = parse("qos_ini_bdev_get", p)?;
    node::get(q.name.as_deref())
}

/// The statistics part of `qos_ini_bdev_get` (no options): what a scraper reads.
fn stats(p: Value) -> Result<Value, Refusal> {
    let q: NameQuery = parse("qos_ini_stats_get", p)?;
    let all = node::get(q.name.as_deref())?;
    let keep = ["name", "pacer_group", "deleting", "state", "pacer"];
    Ok(Value::Array(
        all.as_array()
            .into_iter()
            .flatten()
            .map(|b| {
                Value::Object(
                    keep.iter()
                        .filter_map(|k| b.get(*k).map(|v| (k.to_string(), v.clone())))
                        .collect(),
                )
            })
            .collect(),
    ))
}

/// `qos_ini_version_get`: the plugin's version, its token protocol's and its build.
fn version_get(p: Value) -> Result<Value, Refusal> {
    let _: rpc::NoParams = parse("qos_ini_version_get", p)?;
    Ok(json!(rpc::VersionInfo::of("initiator")))
}

// `qos_ini_bdev_create` is RUNTIME only: when a JSON configuration is loaded, SPDK runs
// the STARTUP-capable methods before the bdev layer exists (and before the base's own
// `bdev_nvme_attach_controller`), so a STARTUP create could never find its base. In
// the RUNTIME phase the bdev section is replayed in order: the attach comes first.
spdk_sys::rpc_methods! {
    MCreate = c"qos_ini_bdev_create", rpc::RUNTIME, |q, p| q.reply(create(p));
    MDelete = c"qos_ini_bdev_delete", rpc::RUNTIME, |q, p| {
        vbdev::rpc_delete::<IniPolicy>("qos_ini_bdev_delete", q, p)
    };
    MGet = c"qos_ini_bdev_get", rpc::RUNTIME, |q, p| q.reply(get(p));
    MSetOptions = c"qos_ini_bdev_set_options", rpc::RUNTIME, |q, p| q.reply(set_options(p));
    MStats = c"qos_ini_stats_get", rpc::RUNTIME, |q, p| q.reply(stats(p));
    MVersion = c"qos_ini_version_get", rpc::STARTUP | rpc::RUNTIME, |q, p| q.reply(version_get(p));
}
