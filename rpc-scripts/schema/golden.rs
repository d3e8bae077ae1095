//! A committed schema file against what the code writes now (tests only; included with
//! `#[path]` by `probe.rs` and `stats_probe.rs`): `UPDATE_SCHEMA=1` rewrites it, else
//! the two are handed back for the caller to name their differences.

use serde_json::Value;

/// `None` when the file at `path` holds `text` (or was just rewritten with
/// `UPDATE_SCHEMA=1`); else the committed and the new document (`Null` for a missing
/// or unreadable file).
pub fn differs(path: &std::path::Path, text: &str) -> Option<(Value, Value)> {
    if std::env::var_os("UPDATE_SCHEMA").is_some_and(|v| v == "1") {
        std::fs::write(path, text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        eprintln!("wrote {}", path.display());
        return None;
    }
    let committed = std::fs::read_to_string(path).unwrap_or_default();
    if committed == text {
        return None;
    }
    let old: Value = serde_json::from_str(&committed).unwrap_or(Value::Null);
    let new: Value = serde_json::from_str(text).expect("JSON");
    Some((old, new))
}
