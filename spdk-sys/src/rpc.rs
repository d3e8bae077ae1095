//! JSON-RPC methods written in Rust: a type implementing [`RpcMethod`] is one method,
//! registered by name with [`register`]; its handler gets the parameters as a
//! `serde_json::Value` and an [`RpcRequest`] that must be answered exactly once
//! (dropping it unanswered sends an internal error).

use std::ffi::{CStr, CString};
use std::ptr::NonNull;

use crate::ffi;
use crate::json::{JsonWriter, value_from_spdk};

/// Method may be called before subsystems are initialised (`--wait-for-rpc`).
pub const STARTUP: u32 = ffi::SPDK_RPC_STARTUP;
/// Method may be called once the application runs.
pub const RUNTIME: u32 = ffi::SPDK_RPC_RUNTIME;

/// Error codes (negative errno, as SPDK's own methods use).
pub mod code {
    pub const EINVAL: i32 = -22;
    pub const ENOENT: i32 = -2;
    pub const EEXIST: i32 = -17;
    pub const ENOSPC: i32 = -28;
    pub const EBUSY: i32 = -16;
    pub const ENOMEM: i32 = -12;
}

/// Longest object name (bdev, domain, group) a method accepts.
pub const MAX_NAME_LEN: usize = 255;

/// A JSON-RPC error, a method's refusal: SPDK's methods use negative errno values as
/// codes; the message says what to change.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct RpcError {
    pub code: i32,
    pub message: String,
}

impl RpcError {
    pub fn new(code: i32, message: impl Into<String>) -> Self {
        RpcError {
            code,
            message: message.into(),
        }
    }

    /// Invalid parameters (-EINVAL).
    pub fn invalid(message: impl Into<String>) -> Self {
        RpcError::new(code::EINVAL, message)
    }
}

/// Parses `params` (absent params are `{}`) into `T`, refusing with -EINVAL.
pub fn parse<T: for<'de> serde::Deserialize<'de>>(
    method: &str,
    params: serde_json::Value,
) -> Result<T, RpcError> {
    let params = if params.is_null() {
        serde_json::json!({})
    } else {
        params
    };
    // The path names the parameter at fault ("bypass: invalid type: ..."); a fault of
    // the whole object (an unknown or missing field) has none.
    serde_path_to_error::deserialize(params).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        if path == "." {
            RpcError::invalid(format!("{method}: invalid parameters: {inner}"))
        } else {
            RpcError::invalid(format!("{method}: invalid parameters: {path}: {inner}"))
        }
    })
}

/// A method that changes something: parses `params` as `T` for `method`, runs `f`, and
/// answers `true`.
pub fn apply<T: for<'de> serde::Deserialize<'de>>(
    method: &str,
    params: serde_json::Value,
    f: impl FnOnce(T) -> Result<(), RpcError>,
) -> Result<serde_json::Value, RpcError> {
    f(parse(method, params)?)?;
    Ok(serde_json::Value::Bool(true))
}

/// The parameters of a method that takes none (`*_version_get`): `{}` or absent.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NoParams {}

/// What a plugin says of itself (`qos_version_get`, `qos_ini_version_get`, its load log
/// line and the exporter's `nvmf_qos_build_info`): the workspace's version (one for every
/// crate), the token protocol's version, and whether it is a release build.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct VersionInfo {
    /// `target` or `initiator`.
    pub plugin: String,
    pub version: String,
    pub wire_protocol: u16,
    /// `release` or `debug`.
    pub profile: String,
}

impl VersionInfo {
    pub fn of(plugin: &str) -> Self {
        VersionInfo {
            plugin: plugin.to_string(),
            version: env!("CARGO_PKG_VERSION").to_string(),
            wire_protocol: qos_core::wire::VERSION,
            profile: if cfg!(debug_assertions) {
                "debug"
            } else {
                "release"
            }
            .to_string(),
        }
    }

    /// The line a plugin logs when it is loaded.
    pub fn log_loaded(&self) {
        tracing::info!(
            "nvmf-qos {} plugin {} loaded (token protocol version {}, {} build)",
            self.plugin,
            self.version,
            self.wire_protocol,
            self.profile
        );
    }
}

/// Checks an object name: 1 ..= [`MAX_NAME_LEN`] printable ASCII characters, no spaces.
/// `what` names the field in the message ("bdev name", "pacer_group").
pub fn check_name(what: &str, name: &str) -> Result<(), RpcError> {
    if name.is_empty() || name.len() > MAX_NAME_LEN || !name.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(RpcError::invalid(format!(
            "{what} {name:?} must be 1 ..= {MAX_NAME_LEN} printable ASCII characters without spaces"
        )));
    }
    Ok(())
}

/// Calls a handler written as a closure in [`rpc_methods!`] (which gives its argument
/// types).
pub fn run_handler(
    req: RpcRequest,
    params: serde_json::Value,
    handler: impl FnOnce(RpcRequest, serde_json::Value),
) {
    handler(req, params)
}

/// Declares JSON-RPC methods and a `register_all()` that registers them, each
/// `Type = c"method_name", STATE, |request, params| { ... };`.
#[macro_export]
macro_rules! rpc_methods {
    ($( $ty:ident = $name:literal, $state:expr, $body:expr; )*) => {
        $(
            struct $ty;
            impl $crate::rpc::RpcMethod for $ty {
                const NAME: &'static ::std::ffi::CStr = $name;
                const STATE: u32 = $state;
                fn call(req: $crate::rpc::RpcRequest, params: ::serde_json::Value) {
                    $crate::rpc::run_handler(req, params, $body)
                }
            }
        )*
        /// Registers every method (from the plugin's constructor).
        pub fn register_all() {
            $( $crate::rpc::register::<$ty>(); )*
        }
    };
}

/// A request waiting for its one response.
#[derive(Debug)]
pub struct RpcRequest(NonNull<ffi::spdk_jsonrpc_request>);

impl RpcRequest {
    fn into_raw(self) -> *mut ffi::spdk_jsonrpc_request {
        let p = self.0.as_ptr();
        std::mem::forget(self);
        p
    }

    /// Sends `result` (a `serde_json::Value` or any `Serialize` type).
    pub fn ok<T: serde::Serialize + ?Sized>(self, result: &T) {
        let r = self.into_raw();
        // SAFETY: `r` is an unanswered request; begin/end are paired. A null writer
        // means a notification (no response expected), which SPDK then frees itself.
        unsafe {
            let w = ffi::spdk_jsonrpc_begin_result(r);
            if !w.is_null() {
                JsonWriter::from_raw(w).value(result);
                ffi::spdk_jsonrpc_end_result(r, w);
            }
        }
    }

    /// Sends an error.
    pub fn err(self, e: &RpcError) {
        let msg = CString::new(e.message.replace('\0', " ")).unwrap_or_default();
        let r = self.into_raw();
        // SAFETY: `r` is an unanswered request; the message is NUL-terminated and copied.
        unsafe { ffi::spdk_jsonrpc_send_error_response(r, e.code, msg.as_ptr()) };
    }

    /// Sends `result` or the error.
    pub fn reply(self, result: Result<serde_json::Value, RpcError>) {
        match result {
            Ok(v) => self.ok(&v),
            Err(e) => self.err(&e),
        }
    }

    /// Sends a typed `result` or the error.
    pub fn reply_with<T: serde::Serialize>(self, result: Result<T, RpcError>) {
        match result {
            Ok(v) => self.ok(&v),
            Err(e) => self.err(&e),
        }
    }
}

impl Drop for RpcRequest {
    fn drop(&mut self) {
        // SAFETY: never answered (every answering method forgets `self`).
        unsafe {
            ffi::spdk_jsonrpc_send_error_response(
                self.0.as_ptr(),
                ffi::SPDK_JSONRPC_ERROR_INTERNAL_ERROR,
                c"internal error: the method did not answer".as_ptr(),
            )
        };
    }
}

/// One JSON-RPC method.
pub trait RpcMethod {
    const NAME: &'static CStr;
    /// [`STARTUP`], [`RUNTIME`] or both.
    const STATE: u32;
    /// Handles one call, on the application thread. Answer `req` now or later.
    fn call(req: RpcRequest, params: serde_json::Value);
}

unsafe extern "C" fn handler<M: RpcMethod>(
    req: *mut ffi::spdk_jsonrpc_request,
    params: *const ffi::spdk_json_val,
) {
    let Some(req) = NonNull::new(req).map(RpcRequest) else {
        return;
    };
    // SAFETY: SPDK passes null or a valid token array for the duration of the call.
    match unsafe { value_from_spdk(params) } {
        Ok(p) => M::call(req, p),
        Err(e) => req.err(&RpcError::new(
            ffi::SPDK_JSONRPC_ERROR_INVALID_PARAMS,
            format!("{}: cannot read parameters: {e}", M::NAME.to_string_lossy()),
        )),
    }
}

/// Registers method `M`. Call from an ELF constructor: SPDK checks the method table
/// when its RPC server starts, and refuses duplicate names.
pub fn register<M: RpcMethod>() {
    // SAFETY: the name is 'static and the handler a valid function for `M`.
    unsafe { ffi::spdk_rpc_register_method(M::NAME.as_ptr(), Some(handler::<M>), M::STATE) };
}
