//! The `qos_ini_*` JSON-RPC methods (contract: `docs/rpc.md`, "Initiator plugin").
//! Every handler runs on the app thread; every refusal is a JSON-RPC error with a
//! negative errno code and a message that names the object and the numbers.

use std::ffi::CStr;

use serde_json::{Value, json};
use spdk_sys::rpc::{self, RpcError, RpcMethod, RpcRequest};

use crate::node;
use crate::params::{CreateParams, NameParams, NameQuery, Refusal, SetParams, parse};

fn answer(req: RpcRequest, r: Result<Value, Refusal>) {
    req.reply(r.map_err(|e| RpcError::new(e.code, e.message)));
}

fn create(p: Value) -> Result<Value, Refusal> {
    let c: CreateParams = parse("qos_ini_bdev_create", p)?;
    Ok(json!(node::create(c)?))
}

fn set_options(p: Value) -> Result<Value, Refusal> {
    let s: SetParams = parse("qos_ini_bdev_set_options", p)?;
    node::set_options(s)?;
    Ok(json!(true))
}

fn get(p: Value) -> Result<Value, Refusal> {
    let q: NameQuery = parse("qos_ini_bdev_get", p)?;
    node::get(q.name.as_deref())
}

macro_rules! methods {
    ($( $ty:ident = $name:literal, $state:expr, $body:expr; )*) => {
        $(
            struct $ty;
            impl RpcMethod for $ty {
                const NAME: &'static CStr = $name;
                const STATE: u32 = $state;
                fn call(req: RpcRequest, params: Value) {
                    #[allow(clippy::redundant_closure_call)]
                    ($body)(req, params)
                }
            }
        )*
        /// Registers every method (from the plugin's constructor).
        pub fn register_all() {
            $( rpc::register::<$ty>(); )*
        }
    };
}

// `qos_ini_bdev_create` is RUNTIME only: when a JSON configuration is loaded, SPDK runs
// the STARTUP-capable methods before the bdev layer exists (and before the base's own
// `bdev_nvme_attach_controller`), so a STARTUP create could never find its base. In
// the RUNTIME phase the bdev section is replayed in order: the attach comes first.
methods! {
    MCreate = c"qos_ini_bdev_create", rpc::RUNTIME, |q, p| answer(q, create(p));
    MDelete = c"qos_ini_bdev_delete", rpc::RUNTIME, |q: RpcRequest, p| {
        match parse::<NameParams>("qos_ini_bdev_delete", p) {
            Ok(n) => node::delete(&n.name, move |r| answer(q, r.map(|()| json!(true)))),
            Err(e) => answer(q, Err(e)),
        }
    };
    MGet = c"qos_ini_bdev_get", rpc::RUNTIME, |q, p| answer(q, get(p));
    MSetOptions = c"qos_ini_bdev_set_options", rpc::RUNTIME, |q, p| answer(q, set_options(p));
}
