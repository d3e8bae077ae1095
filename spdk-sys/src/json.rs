//! Between SPDK's JSON (`spdk_json_val` token arrays, `spdk_json_write_ctx` writers)
//! and `serde_json` values. Parameters are re-rendered by SPDK's own writer and parsed
//! by serde (no brace counting); results are written as one raw, already valid value.

use std::ffi::{CStr, c_int, c_void};

use crate::ffi;

#[derive(Debug, thiserror::Error)]
pub enum JsonError {
    #[error("out of memory rendering JSON")]
    NoMem,
    #[error("SPDK could not render the JSON value")]
    Render,
    #[error("invalid JSON: {0}")]
    Parse(#[from] serde_json::Error),
}

unsafe extern "C" fn append(ctx: *mut c_void, data: *const c_void, size: usize) -> c_int {
    // SAFETY: `ctx` is the `Vec<u8>` passed to `spdk_json_write_begin` below; SPDK gives
    // `size` readable bytes at `data`.
    unsafe {
        let out = &mut *ctx.cast::<Vec<u8>>();
        out.extend_from_slice(std::slice::from_raw_parts(data.cast::<u8>(), size));
    }
    0
}

/// Renders an SPDK JSON value (e.g. RPC params) and parses it; `null` when absent.
///
/// # Safety
/// `val` is null or points to a valid `spdk_json_val` token array (as SPDK passes to
/// RPC handlers), alive for the call.
pub unsafe fn value_from_spdk(
    val: *const ffi::spdk_json_val,
) -> Result<serde_json::Value, JsonError> {
    if val.is_null() {
        return Ok(serde_json::Value::Null);
    }
    let mut out: Vec<u8> = Vec::new();
    // SAFETY: `append` writes into `out`, which outlives the writer (ended below).
    let w = unsafe { ffi::spdk_json_write_begin(Some(append), (&raw mut out).cast(), 0) };
    if w.is_null() {
        return Err(JsonError::NoMem);
    }
    // SAFETY: `w` is a live writer; `val` is valid per the contract.
    let rc = unsafe { ffi::spdk_json_write_val(w, val) };
    // SAFETY: ends (and frees) the writer exactly once.
    let end = unsafe { ffi::spdk_json_write_end(w) };
    if rc != 0 || end != 0 {
        return Err(JsonError::Render);
    }
    Ok(serde_json::from_slice(&out)?)
}

/// An SPDK JSON writer borrowed for the duration of a callback (`config_json`,
/// `dump_info_json`, an RPC result).
#[derive(Debug)]
pub struct JsonWriter<'a> {
    w: *mut ffi::spdk_json_write_ctx,
    _life: std::marker::PhantomData<&'a mut ffi::spdk_json_write_ctx>,
}

impl JsonWriter<'_> {
    /// # Safety
    /// `w` is a live writer for the lifetime of the returned value.
    pub unsafe fn from_raw(w: *mut ffi::spdk_json_write_ctx) -> Self {
        JsonWriter {
            w,
            _life: std::marker::PhantomData,
        }
    }

    /// Writes `v` as the next value (array element, or value after a name). Any
    /// `Serialize` type: a typed answer is written without building a `Value` tree.
    pub fn value<T: serde::Serialize + ?Sized>(&mut self, v: &T) {
        let s = serde_json::to_string(v).unwrap_or_else(|_| "null".into());
        // SAFETY: live writer; `s` holds `len` bytes of valid JSON.
        unsafe { ffi::spdk_json_write_val_raw(self.w, s.as_ptr().cast(), s.len()) };
    }

    /// Writes `"name": v` inside an object.
    pub fn named_value(&mut self, name: &CStr, v: &serde_json::Value) {
        // SAFETY: live writer, NUL-terminated name.
        unsafe { ffi::spdk_json_write_name(self.w, name.as_ptr()) };
        self.value(v);
    }
}
