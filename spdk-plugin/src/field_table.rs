//! The field table behind the RPC parameter structs: [`param_table!`] turns one list of
//! fields into an object's `*Params` struct (what its create method takes and its get
//! method and `save_config` print), its `*Update` struct (what its update method
//! takes), and their mapping to and from `qos-core`'s configuration, so that a field is
//! declared once. The tables themselves are in `params.rs`; `codec` holds the unit
//! conversions a row can name.

/// Declares an object's parameter structs from one table of fields.
///
/// ```text
/// param_table! {
///     params: /// docs, derives, serde attributes
///             DomainParams;
///     update: /// docs, derives, serde attributes
///             DomainUpdate;
///     config: DomainConfig;
///     defaults: domain_defaults;         // optional: needs `Config: Default`
///     keys: name;                        // String fields that name the object
///     fields {
///         /// docs and serde attributes of the Params field
///         #[serde(default = "domain_defaults::period_ms")]
///         period_ms: value u64 = millis(period);
///         capacity_iops: optional u64 = same(capacity.iops);
///         batch_ops: optional u64 = by_hand();
///     }
/// }
/// ```
///
/// A row is `name: kind Type = codec(path in the config);`. The kind says what the
/// field is in each struct and what an update does with it:
///
/// | kind       | in `*Params`                     | an update that gives it       |
/// |------------|----------------------------------|-------------------------------|
/// | `value`    | `Type`, serde attributes its own | replaces it                   |
/// | `optional` | `Option<Type>`, left out if none | replaces it                   |
/// | `rate`     | `Option<Type>`, left out if none | 0 clears it, else replaces it |
/// | `hand`     | `Option<Type>`, left out if none | nothing: the caller's rule    |
///
/// With `defaults: m;`, module `m` has a function per `value` row giving the field's
/// value in `Config::default()`, for the row's `#[serde(default = "m::field")]`: the
/// parameter's default is the core's. In `*Update` every field is `Option<Type>`
/// (absent: keep). The codec (a module of
/// [`codec`]) converts between the field and the config at the path; `by_hand()` leaves
/// the field to the caller both ways (fields that map to one config value together).
///
/// Emitted on `*Params`: `write_fields(&self, &mut Config)` (every row but the
/// by-hand ones), `from_fields(keys.., &Config) -> Self` (by-hand rows at their
/// `Default`), `apply_update(&mut self, &Update)` (every row whose kind has a rule) and
/// `to_json`.
macro_rules! param_table {
    (
        params: $(#[$pa:meta])* $params:ident;
        update: $(#[$ua:meta])* $update:ident;
        config: $config:ty;
        $(defaults: $defaults:ident;)?
        keys: $($key:ident),+;
        fields {
            $(
                $(#[$fa:meta])*
                $field:ident : $kind:ident $ty:ty = $codec:ident ( $($path:tt)* );
            )*
        }
    ) => {
        $crate::field_table::param_table!(@params [$(#[$pa])*] $params [$(pub $key: String,)*]
            $( $(#[$fa])* $field : $kind $ty ; )*);

        $crate::field_table::param_table!(@defaults [$($defaults)?] $config;
            $( $field : $kind $ty = $codec ($($path)*) ; )*);

        $(#[$ua])*
        pub struct $update {
            $(pub $key: String,)*
            $(pub $field: Option<$ty>,)*
        }

        impl $params {
            /// The table's fields written into `cfg` (by-hand rows are the caller's).
            fn write_fields(&self, cfg: &mut $config) {
                $( $crate::field_table::param_table!(@to cfg self.$field, $codec ($($path)*)); )*
            }

            /// The parameters of `cfg` (by-hand rows at their `Default`).
            fn from_fields($($key: String,)* cfg: &$config) -> Self {
                $params {
                    $($key,)*
                    $( $field: $crate::field_table::param_table!(@from cfg, $codec ($($path)*)), )*
                }
            }

            /// `u`'s changes to the fields whose kind has a rule.
            fn apply_update(&mut self, u: &$update) {
                $( $crate::field_table::param_table!(@update $kind self.$field, u.$field); )*
            }

            /// The printed form (get methods, `save_config`).
            pub fn to_json(&self) -> ::serde_json::Value {
                ::serde_json::to_value(self).unwrap_or(::serde_json::Value::Null)
            }
        }
    };

    // The Params struct, field by field (the attributes depend on the kind).
    (@params [$(#[$pa:meta])*] $params:ident [$($done:tt)*]) => {
        $(#[$pa])*
        pub struct $params { $($done)* }
    };
    (@params [$(#[$pa:meta])*] $params:ident [$($done:tt)*]
        $(#[$fa:meta])* $field:ident : value $ty:ty ; $($rest:tt)*) => {
        $crate::field_table::param_table!(@params [$(#[$pa])*] $params
            [$($done)* $(#[$fa])* pub $field: $ty,] $($rest)*);
    };
    (@params [$(#[$pa:meta])*] $params:ident [$($done:tt)*]
        $(#[$fa:meta])* $field:ident : $kind:ident $ty:ty ; $($rest:tt)*) => {
        $crate::field_table::param_table!(@params [$(#[$pa])*] $params
            [$($done)* $(#[$fa])* #[serde(default, skip_serializing_if = "Option::is_none")]
             pub $field: Option<$ty>,] $($rest)*);
    };

    // The config's default of each `value` row, as a function serde can name.
    (@defaults [] $($rows:tt)*) => {};
    (@defaults [$defaults:ident] $config:ty;
        $( $field:ident : $kind:ident $ty:ty = $codec:ident ($($path:tt)*) ; )*) => {
        /// Each `value` field's default: its value in the core's default configuration.
        mod $defaults {
            #[allow(unused_imports)]
            use super::*;
            $( $crate::field_table::param_table!(@default_fn $config, $field : $kind $ty = $codec ($($path)*)); )*
        }
    };
    (@default_fn $config:ty, $field:ident : value $ty:ty = $codec:ident ($($path:tt)+)) => {
        pub fn $field() -> $ty {
            $crate::field_table::codec::$codec::from(&<$config as Default>::default().$($path)+)
        }
    };
    (@default_fn $($row:tt)*) => {};

    (@to $cfg:ident $value:expr, by_hand ()) => {};
    (@to $cfg:ident $value:expr, $codec:ident ($($path:tt)+)) => {
        $cfg.$($path)+ = $crate::field_table::codec::$codec::to(&$value)
    };
    (@from $cfg:ident, by_hand ()) => { Default::default() };
    (@from $cfg:ident, $codec:ident ($($path:tt)+)) => {
        $crate::field_table::codec::$codec::from(&$cfg.$($path)+)
    };

    (@update value $old:expr, $new:expr) => {
        if let Some(v) = $new {
            $old = v;
        }
    };
    (@update optional $old:expr, $new:expr) => {
        if $new.is_some() {
            $old = $new;
        }
    };
    (@update rate $old:expr, $new:expr) => {
        $old = $crate::field_table::updated_rate($old, $new)
    };
    (@update hand $old:expr, $new:expr) => {};
}
pub(crate) use param_table;

/// A rate after an update: 0 clears it, a value sets it, absent keeps it.
pub fn updated_rate(old: Option<u64>, new: Option<u64>) -> Option<u64> {
    match new {
        Some(0) => None,
        Some(v) => Some(v),
        None => old,
    }
}

/// Conversions between a parameter (`to`'s argument) and its config value (`from`'s).
/// Each is exact on what the core accepts: `to_config` then `from_config` gives back
/// what was given.
pub mod codec {
    use qos_core::Nanos;

    /// The same value in both.
    pub mod same {
        pub fn to<T: Clone>(v: &T) -> T {
            v.clone()
        }
        pub fn from<T: Clone>(c: &T) -> T {
            c.clone()
        }
    }

    /// Milliseconds and a duration (periods: at most 60 s, so never saturated).
    pub mod millis {
        use super::Nanos;
        pub fn to(ms: &u64) -> Nanos {
            Nanos::from_millis(*ms)
        }
        pub fn from(d: &Nanos) -> u64 {
            d.0 / 1_000_000
        }
    }

    /// Microseconds and a duration. A number of microseconds too large for the
    /// nanosecond clock saturates it, and reads back as the largest number (`u64::MAX`
    /// given, `u64::MAX` printed).
    pub mod micros {
        use super::Nanos;
        pub fn to(us: &u64) -> Nanos {
            Nanos::from_micros(*us)
        }
        pub fn from(d: &Nanos) -> u64 {
            if d.0 == u64::MAX {
                u64::MAX
            } else {
                d.0 / 1_000
            }
        }
    }

    /// [`micros`] of an optional duration.
    pub mod opt_micros {
        use super::{Nanos, micros};
        pub fn to(us: &Option<u64>) -> Option<Nanos> {
            us.as_ref().map(micros::to)
        }
        pub fn from(d: &Option<Nanos>) -> Option<u64> {
            d.as_ref().map(micros::from)
        }
    }

    /// An optional parameter whose absence is the config's `Default` (always printed).
    pub mod or_default {
        pub fn to<T: Copy + Default>(v: &Option<T>) -> T {
            v.unwrap_or_default()
        }
        pub fn from<T: Copy>(c: &T) -> Option<T> {
            Some(*c)
        }
    }

    /// A weight: absent is 1 (always printed).
    pub mod weight {
        pub fn to(v: &Option<u32>) -> u32 {
            v.unwrap_or(1)
        }
        pub fn from(c: &u32) -> Option<u32> {
            Some(*c)
        }
    }
}
