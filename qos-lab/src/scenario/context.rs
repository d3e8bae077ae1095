//! Reading a scenario's text: serde's refusals and the lab's own turned into
//! [`ScenarioError`]s that name the file, the line and the field, and the checks of a
//! number (non-negative, positive, a fraction, seconds) that every section uses.

use qos_core::Nanos;

use super::ScenarioError;
use crate::locate::{FieldPath, line_col, locate, path_at};

/// serde's "invalid type: floating point `1570000.0`, expected i64" in words: TOML
/// reads `1.57e6` as a float, and every rate and count here is a whole number.
fn float_for_integer(message: &str) -> Option<String> {
    let rest = message.strip_prefix("invalid type: floating point `")?;
    let value = &rest[..rest.find('`')?];
    let v: f64 = value.parse().ok()?;
    let hint = if v.fract() == 0.0 && v.abs() < 1e18 {
        format!("; write {} (or with _ separators)", v as i64)
    } else {
        String::new()
    };
    Some(format!(
        "expected a whole number, got the floating-point number {value} (TOML reads forms like 1.57e6 as floating point){hint}"
    ))
}

/// The text and the file name of the scenario being read: every refusal points into it.
pub(super) struct Ctx<'a> {
    pub(super) text: &'a str,
    pub(super) file: &'a str,
}

impl Ctx<'_> {
    pub(super) fn parse_error(&self, e: &toml::de::Error) -> ScenarioError {
        let offset = e.span().map_or(0, |s| s.start);
        let (line, column) = line_col(self.text, offset);
        let field = path_at(self.text, offset)
            .map(|p| p.to_string())
            .unwrap_or_else(|| "(syntax)".into());
        let mut message = e.message().trim().to_string();
        if field.ends_with("demand") && message.contains("untagged") {
            message = "expected an I/O count per period (e.g. 158000), \"unlimited\", or a table such as { of_reservation = 0.5, plus_unreserved = true }".into();
        }
        if let Some(m) = float_for_integer(&message) {
            message = m;
        }
        ScenarioError::Parse {
            file: self.file.to_string(),
            line,
            column,
            field,
            message,
        }
    }

    pub(super) fn invalid(&self, path: &FieldPath, message: impl Into<String>) -> ScenarioError {
        let pos = locate(self.text, path).map(|r| line_col(self.text, r.start));
        ScenarioError::Invalid {
            file: self.file.to_string(),
            line: pos.map(|p| p.0),
            column: pos.map(|p| p.1),
            field: path.to_string(),
            message: message.into(),
        }
    }

    /// A non-negative integer (a rate or a count); `what` says what it is.
    pub(super) fn non_negative(
        &self,
        v: Option<i64>,
        path: &FieldPath,
        what: &str,
    ) -> Result<Option<u64>, ScenarioError> {
        match v {
            Some(x) if x < 0 => Err(self.invalid(
                path,
                format!("{what} cannot be negative (got {x}); write a value of 0 or more"),
            )),
            Some(x) => Ok(Some(x as u64)),
            None => Ok(None),
        }
    }

    /// A positive integer.
    pub(super) fn positive(
        &self,
        v: Option<i64>,
        path: &FieldPath,
        what: &str,
    ) -> Result<Option<u64>, ScenarioError> {
        match v {
            Some(x) if x < 0 => Err(self.invalid(
                path,
                format!("{what} cannot be negative (got {x}); write a positive number"),
            )),
            Some(0) => Err(self.invalid(
                path,
                format!(
                    "{what} must be at least 1 (got 0); write a positive number or remove the field"
                ),
            )),
            Some(x) => Ok(Some(x as u64)),
            None => Ok(None),
        }
    }

    pub(super) fn fraction(
        &self,
        v: f64,
        path: &FieldPath,
        what: &str,
    ) -> Result<f64, ScenarioError> {
        if !(0.0..=1.0).contains(&v) || v.is_nan() {
            return Err(self.invalid(
                path,
                format!("{what} must be between 0 and 1 (got {v}); 0.9 means 90%"),
            ));
        }
        Ok(v)
    }

    pub(super) fn seconds(
        &self,
        v: f64,
        path: &FieldPath,
        what: &str,
    ) -> Result<Nanos, ScenarioError> {
        if !(0.0..=1e6).contains(&v) {
            return Err(self.invalid(
                path,
                format!("{what} must be a time in seconds between 0 and 1000000 (got {v})"),
            ));
        }
        Ok(Nanos((v * 1e9).round() as u64))
    }
}

/// The path of the top-level key `k`.
pub(super) fn top(k: &str) -> FieldPath {
    FieldPath::root().key(k)
}
