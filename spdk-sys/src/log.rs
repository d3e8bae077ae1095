//! SPDK's log fed from `tracing`: [`install`] sets a global `tracing` subscriber that
//! formats each event and hands it to `spdk_log`, so plugin messages appear with SPDK's
//! own, honour its `--logflag`-independent print level (`-L`/`spdk_log_set_print_level`)
//! and go to syslog like the rest. Spans are not recorded.
//!
//! Levels: `error` → ERROR, `warn` → WARN, `info` → NOTICE (printed by default),
//! `debug` → INFO, `trace` → DEBUG.

use std::ffi::CString;
use std::fmt::Write as _;

use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Level, Metadata, Subscriber};

use crate::ffi;

fn spdk_level(l: &Level) -> ffi::spdk_log_level {
    match *l {
        Level::ERROR => ffi::spdk_log_level::SPDK_LOG_ERROR,
        Level::WARN => ffi::spdk_log_level::SPDK_LOG_WARN,
        Level::INFO => ffi::spdk_log_level::SPDK_LOG_NOTICE,
        Level::DEBUG => ffi::spdk_log_level::SPDK_LOG_INFO,
        Level::TRACE => ffi::spdk_log_level::SPDK_LOG_DEBUG,
    }
}

/// The subscriber; see the module documentation.
#[derive(Debug, Default)]
pub struct SpdkLog;

struct Fields(String);

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.0.insert_str(0, value);
        } else {
            let _ = write!(self.0, " {}={}", field.name(), value);
        }
    }
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            let s = format!("{value:?}");
            self.0.insert_str(0, &s);
        } else {
            let _ = write!(self.0, " {}={:?}", field.name(), value);
        }
    }
}

impl Subscriber for SpdkLog {
    fn enabled(&self, meta: &Metadata<'_>) -> bool {
        let l = spdk_level(meta.level());
        // SAFETY: plain getters of SPDK's global log levels.
        let (print, log) = unsafe { (ffi::spdk_log_get_print_level(), ffi::spdk_log_get_level()) };
        l.0 <= print.0.max(log.0)
    }
    fn new_span(&self, _: &Attributes<'_>) -> Id {
        Id::from_u64(1)
    }
    fn record(&self, _: &Id, _: &Record<'_>) {}
    fn record_follows_from(&self, _: &Id, _: &Id) {}
    fn event(&self, event: &Event<'_>) {
        let meta = event.metadata();
        let mut f = Fields(String::new());
        event.record(&mut f);
        let msg = CString::new(f.0.replace('\0', " ")).unwrap_or_default();
        let file = CString::new(meta.file().unwrap_or("")).unwrap_or_default();
        let func = CString::new(meta.target()).unwrap_or_default();
        let line = meta.line().map_or(0, |l| l as i32);
        // SAFETY: all strings are NUL-terminated and live across the call; the format
        // is a literal "%s" taking exactly one C string.
        unsafe {
            ffi::spdk_log(
                spdk_level(meta.level()),
                file.as_ptr(),
                line,
                func.as_ptr(),
                c"%s\n".as_ptr(),
                msg.as_ptr(),
            )
        };
    }
    fn enter(&self, _: &Id) {}
    fn exit(&self, _: &Id) {}
}

/// Installs [`SpdkLog`] as the process's global `tracing` subscriber. Returns false if
/// another subscriber was installed first (e.g. by another plugin in the same process).
pub fn install() -> bool {
    tracing::subscriber::set_global_default(SpdkLog).is_ok()
}

pub(crate) fn leak_note(what: &str) {
    tracing::warn!("leaking a {what}: its SPDK thread cannot run the release");
}
