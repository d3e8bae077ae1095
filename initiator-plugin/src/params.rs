//! Parameters of the `qos_ini_*` RPC methods (contract: `docs/rpc.md`, section
//! "Initiator plugin"), their defaults, their validation, and their mapping to
//! `qos-core`'s [`InitiatorConfig`] and [`PacerConfig`]. No FFI calls: unit-tested without
//! a running SPDK.
//!
//! Options are of two kinds:
//! - **bdev options** (the token engine of one QoS bdev, i.e. one host): `token_protocol`,
//!   `pacing`, `acquire_*`, `prefetch_milli`, `request_timeout_us`, `retry_after_us`,
//!   `refresh_interval_us`, `probe_attempts`, `open_pool_batches`;
//! - **pacer options** (the pacer shared by every QoS bdev of a *pacer group*, i.e. one
//!   link): `chunk_bytes`, `link_*`, `latency_target_us`, `probe_*`, `aimd_interval_us`,
//!   `increase_milli`, `latency_idle_us`, `split_always`, `dirs*`.
//!
//! Unknown parameters are refused, so a typo is an error, not an ignored setting.

use qos_core::Nanos;
use qos_core::initiator::InitiatorConfig;
use qos_core::pacer::{DirsConfig, PacerConfig};
use serde::{Deserialize, Serialize};

/// The pacer group of QoS bdevs created without `pacer_group`: one link per process.
pub const DEFAULT_GROUP: &str = "default";

/// Refusals, parameter parsing and name checks are shared with the target plugin.
pub use spdk_sys::rpc::{RpcError as Refusal, check_name, code, parse};

/// The options of one QoS bdev's token engine, all resolved.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct BdevOptions {
    /// Speak the token protocol with the target (vendor commands, credits). Off: no
    /// token holding, the bdev only chunks and paces. Default true.
    pub token_protocol: bool,
    /// Split I/O larger than `chunk_bytes` and pace the chunks. Off: I/O goes out as
    /// submitted (token holding only). Default true.
    pub pacing: bool,
    /// Global tokens asked for per ACQUIRE. Defaults 256 operations and 16 MiB (the
    /// engine mirrors and asks for bytes only for a host with a MiB/s reservation).
    pub acquire_ops: u64,
    pub acquire_bytes: u64,
    /// Ask for more global tokens when they fall below this many thousandths of a
    /// batch. Default 250.
    pub prefetch_milli: u64,
    /// A vendor command unanswered this long has timed out. Default 10 ms.
    pub request_timeout_us: u64,
    /// After an ACQUIRE that granted nothing, wait this long. Default 1 ms.
    pub retry_after_us: u64,
    /// Re-read the period state at least this often. Default 100 ms.
    pub refresh_interval_us: u64,
    /// Unanswered state requests, before the first answer, that make the bdev give up
    /// the protocol and pass I/O through. Default 3.
    pub probe_attempts: u64,
    /// A host without limits sends without global tokens (acquiring none) while the
    /// target's pool is open to it and, at its last reply, held at least this many
    /// batches of `acquire_ops` (`qos_core::InitiatorEngine::pool_open`); 0: every
    /// command waits for a token. Default 0.
    pub open_pool_batches: u64,
}

impl Default for BdevOptions {
    fn default() -> Self {
        let c = InitiatorConfig::default();
        BdevOptions {
            token_protocol: true,
            pacing: true,
            acquire_ops: c.acquire_ops,
            acquire_bytes: c.acquire_bytes,
            prefetch_milli: c.prefetch_milli,
            request_timeout_us: c.request_timeout.0 / 1000,
            retry_after_us: c.retry_after.0 / 1000,
            refresh_interval_us: c.refresh_interval.0 / 1000,
            probe_attempts: c.probe_attempts as u64,
            open_pool_batches: c.open_pool_batches,
        }
    }
}

impl BdevOptions {
    pub fn engine_config(&self) -> InitiatorConfig {
        InitiatorConfig {
            acquire_ops: self.acquire_ops,
            acquire_bytes: self.acquire_bytes,
            prefetch_milli: self.prefetch_milli,
            request_timeout: Nanos::from_micros(self.request_timeout_us),
            retry_after: Nanos::from_micros(self.retry_after_us),
            refresh_interval: Nanos::from_micros(self.refresh_interval_us),
            probe_attempts: self.probe_attempts as u32,
            open_pool_batches: self.open_pool_batches,
        }
    }

    pub fn validate(&self) -> Result<(), Refusal> {
        range("acquire_ops", self.acquire_ops, 1, u32::MAX as u64)?;
        range(
            "acquire_bytes",
            self.acquire_bytes,
            0,
            u32::MAX as u64 * qos_core::wire::ACQUIRE_BYTES_UNIT,
        )?;
        range("prefetch_milli", self.prefetch_milli, 0, 1000)?;
        range(
            "request_timeout_us",
            self.request_timeout_us,
            10,
            60_000_000,
        )?;
        range("retry_after_us", self.retry_after_us, 1, 60_000_000)?;
        range(
            "refresh_interval_us",
            self.refresh_interval_us,
            1000,
            3_600_000_000,
        )?;
        range("probe_attempts", self.probe_attempts, 1, 1000)?;
        range("open_pool_batches", self.open_pool_batches, 0, 1 << 20)?;
        Ok(())
    }
}

/// The options of a pacer group, all resolved.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PacerOptions {
    /// Transfers above the chunk size are split into chunks of at most that size. With
    /// `chunk_auto` the largest chunk, else the chunk. Default 128 KiB.
    pub chunk_bytes: u64,
    /// The chunk follows the latency target and the path: the target's slack over the
    /// probe's base latency times `link_mibps`, at least the link's bytes per operation
    /// (`link_mibps` / `link_iops`), at most `chunk_bytes` (`qos_core::pacer`). Default
    /// true.
    pub chunk_auto: bool,
    /// The link's bandwidth and operation rate. Defaults 2800 MiB/s, 1,000,000 IOPS.
    pub link_mibps: u64,
    pub link_iops: u64,
    /// p99 latency target of the probe. Default 200 us; with
    /// `latency_target_auto_milli`, the ceiling of the target that follows the path.
    pub latency_target_us: u64,
    /// Non-zero: the target is this many thousandths of the probe's base latency (its
    /// lowest over the recent probes), at most `latency_target_us`; 0: the fixed target.
    /// Default 0 (since 2026-11-29: the probe's p99 is far above 1.5 x its lowest latency
    /// on NVMe/TCP, and AIMD held a writer at its floor; `qos_core::pacer`).
    pub latency_target_auto_milli: u64,
    /// The probe (a GET_STATE vendor command) is sent this often while small I/O is
    /// active. Default 500 us.
    pub probe_interval_us: u64,
    /// Probe samples kept for the p99. Default 1000.
    pub probe_window: u64,
    /// AIMD decision interval. Default 1 ms.
    pub aimd_interval_us: u64,
    /// Additive increase per interval, thousandths of the link. Default 20.
    pub increase_milli: u64,
    /// Small I/O counts as gone after this long without any. Default 100 ms.
    pub latency_idle_us: u64,
    /// Split and pace large I/O also while no small I/O is seen. Default false.
    pub split_always: bool,
    /// DIRS initial rate for new streams. Default true.
    pub dirs: bool,
    /// DIRS timers: late-signal gap 1 ms, recovery 10 ms, reset 100 ms, window 10 ms.
    pub dirs_late_gap_us: u64,
    pub dirs_recovery_us: u64,
    pub dirs_reset_us: u64,
    pub dirs_window_us: u64,
}

impl Default for PacerOptions {
    fn default() -> Self {
        let c = PacerConfig::default();
        PacerOptions {
            chunk_bytes: c.chunk_bytes,
            chunk_auto: c.chunk_auto,
            link_mibps: c.link_mibps,
            link_iops: c.link_iops,
            latency_target_us: c.latency_target.0 / 1000,
            latency_target_auto_milli: c.latency_target_auto_milli,
            probe_interval_us: c.probe_interval.0 / 1000,
            probe_window: c.probe_window as u64,
            aimd_interval_us: c.aimd_interval.0 / 1000,
            increase_milli: c.increase_milli,
            latency_idle_us: c.latency_idle.0 / 1000,
            split_always: c.split_always,
            dirs: c.dirs.enabled,
            dirs_late_gap_us: c.dirs.late_gap.0 / 1000,
            dirs_recovery_us: c.dirs.recovery.0 / 1000,
            dirs_reset_us: c.dirs.reset.0 / 1000,
            dirs_window_us: c.dirs.window.0 / 1000,
        }
    }
}

impl PacerOptions {
    pub fn pacer_config(&self) -> PacerConfig {
        let us = Nanos::from_micros;
        PacerConfig {
            chunk_bytes: self.chunk_bytes,
            chunk_auto: self.chunk_auto,
            link_mibps: self.link_mibps,
            link_iops: self.link_iops,
            latency_target: us(self.latency_target_us),
            latency_target_auto_milli: self.latency_target_auto_milli,
            probe_interval: us(self.probe_interval_us),
            probe_window: self.probe_window.min(usize::MAX as u64) as usize,
            aimd_interval: us(self.aimd_interval_us),
            increase_milli: self.increase_milli,
            latency_idle: us(self.latency_idle_us),
            split_always: self.split_always,
            dirs: DirsConfig {
                enabled: self.dirs,
                late_gap: us(self.dirs_late_gap_us),
                recovery: us(self.dirs_recovery_us),
                reset: us(self.dirs_reset_us),
                window: us(self.dirs_window_us),
            },
            ..PacerConfig::default()
        }
    }

    pub fn validate(&self) -> Result<(), Refusal> {
        range("link_mibps", self.link_mibps, 1, 100_000_000)?;
        range("link_iops", self.link_iops, 1, 1_000_000_000)?;
        for (n, v) in [
            ("latency_target_us", self.latency_target_us),
            ("probe_interval_us", self.probe_interval_us),
            ("aimd_interval_us", self.aimd_interval_us),
            ("latency_idle_us", self.latency_idle_us),
            ("dirs_late_gap_us", self.dirs_late_gap_us),
            ("dirs_recovery_us", self.dirs_recovery_us),
            ("dirs_reset_us", self.dirs_reset_us),
            ("dirs_window_us", self.dirs_window_us),
        ] {
            range(n, v, 1, 3_600_000_000)?;
        }
        self.pacer_config()
            .validate()
            .map_err(|e| Refusal::invalid(format!("pacer options: {e}")))
    }
}

fn range(name: &str, v: u64, lo: u64, hi: u64) -> Result<(), Refusal> {
    if v < lo || v > hi {
        return Err(Refusal::invalid(format!(
            "{name} = {v} is outside {lo} ..= {hi}"
        )));
    }
    Ok(())
}

/// Declares the optional-field structs of the RPCs and how they patch the options.
macro_rules! patch {
    (
        bdev { $($b:ident : $bt:ty),* $(,)? }
        pacer { $($p:ident : $pt:ty),* $(,)? }
    ) => {
        /// Options given in a call; absent ones keep their value (or default).
        #[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
        #[serde(deny_unknown_fields)]
        pub struct OptionsPatch {
            $( #[serde(default, skip_serializing_if = "Option::is_none")] pub $b: Option<$bt>, )*
            $( #[serde(default, skip_serializing_if = "Option::is_none")] pub $p: Option<$pt>, )*
        }

        impl OptionsPatch {
            pub fn apply_bdev(&self, o: &mut BdevOptions) {
                $( if let Some(v) = self.$b { o.$b = v; } )*
            }
            pub fn apply_pacer(&self, o: &mut PacerOptions) {
                $( if let Some(v) = self.$p { o.$p = v; } )*
            }
            /// Whether any pacer option is given.
            pub fn has_pacer(&self) -> bool {
                false $( || self.$p.is_some() )*
            }
            /// Whether any bdev option is given.
            pub fn has_bdev(&self) -> bool {
                false $( || self.$b.is_some() )*
            }
            /// The pacer options given that differ from `o`, as `name=given (has x)`.
            pub fn pacer_conflicts(&self, o: &PacerOptions) -> Vec<String> {
                let mut v = Vec::new();
                $( if let Some(x) = self.$p { if x != o.$p {
                    v.push(format!("{}={} (the group has {})", stringify!($p), x, o.$p));
                } } )*
                v
            }
            /// Every option, resolved, as a patch (for `save_config`).
            pub fn full(b: &BdevOptions, p: &PacerOptions) -> OptionsPatch {
                OptionsPatch {
                    $( $b: Some(b.$b), )*
                    $( $p: Some(p.$p), )*
                }
            }
        }

        /// `qos_ini_bdev_create` parameters.
        #[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
        #[serde(deny_unknown_fields)]
        pub struct CreateParams {
            pub name: String,
            pub base_bdev_name: String,
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub uuid: Option<String>,
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub pacer_group: Option<String>,
            $( #[serde(default, skip_serializing_if = "Option::is_none")] pub $b: Option<$bt>, )*
            $( #[serde(default, skip_serializing_if = "Option::is_none")] pub $p: Option<$pt>, )*
        }

        impl CreateParams {
            /// Parameters with no option given.
            pub fn new(name: String, base_bdev_name: String) -> Self {
                CreateParams {
                    name,
                    base_bdev_name,
                    uuid: None,
                    pacer_group: None,
                    $( $b: None, )*
                    $( $p: None, )*
                }
            }
            pub fn options(&self) -> OptionsPatch {
                OptionsPatch {
                    $( $b: self.$b, )*
                    $( $p: self.$p, )*
                }
            }
            pub fn with_options(mut self, o: &OptionsPatch) -> Self {
                $( self.$b = o.$b; )*
                $( self.$p = o.$p; )*
                self
            }
        }

        /// `qos_ini_bdev_set_options` parameters.
        #[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
        #[serde(deny_unknown_fields)]
        pub struct SetParams {
            pub name: String,
            $( #[serde(default, skip_serializing_if = "Option::is_none")] pub $b: Option<$bt>, )*
            $( #[serde(default, skip_serializing_if = "Option::is_none")] pub $p: Option<$pt>, )*
        }

        impl SetParams {
            pub fn options(&self) -> OptionsPatch {
                OptionsPatch {
                    $( $b: self.$b, )*
                    $( $p: self.$p, )*
                }
            }
        }
    };
}

patch! {
    bdev {
        token_protocol: bool,
        pacing: bool,
        acquire_ops: u64,
        acquire_bytes: u64,
        prefetch_milli: u64,
        request_timeout_us: u64,
        retry_after_us: u64,
        refresh_interval_us: u64,
        probe_attempts: u64,
        open_pool_batches: u64,
    }
    pacer {
        chunk_bytes: u64,
        chunk_auto: bool,
        link_mibps: u64,
        link_iops: u64,
        latency_target_us: u64,
        latency_target_auto_milli: u64,
        probe_interval_us: u64,
        probe_window: u64,
        aimd_interval_us: u64,
        increase_milli: u64,
        latency_idle_us: u64,
        split_always: bool,
        dirs: bool,
        dirs_late_gap_us: u64,
        dirs_recovery_us: u64,
        dirs_reset_us: u64,
        dirs_window_us: u64,
    }
}

/// Parameters that name one QoS bdev (`qos_ini_bdev_delete`).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NameParams {
    pub name: String,
}

/// Optional name (`qos_ini_bdev_get`).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NameQuery {
    #[serde(default)]
    pub name: Option<String>,
}

/// A creation request, checked: names, options of the bdev, and the pacer options it
/// asks for its group (resolved against defaults; the caller resolves them against an
/// existing group instead).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckedCreate {
    pub name: String,
    pub base_bdev_name: String,
    pub uuid: Option<String>,
    pub group: String,
    pub bdev: BdevOptions,
    pub patch: OptionsPatch,
}

impl CreateParams {
    /// Checks what can be checked without SPDK.
    pub fn check(self) -> Result<CheckedCreate, Refusal> {
        check_name("bdev name", &self.name)?;
        check_name("base_bdev_name", &self.base_bdev_name)?;
        let group = self
            .pacer_group
            .clone()
            .unwrap_or_else(|| DEFAULT_GROUP.to_string());
        check_name("pacer_group", &group)?;
        if self.name == self.base_bdev_name {
            return Err(Refusal::invalid(format!(
                "a QoS bdev cannot be stacked on itself ({:?})",
                self.name
            )));
        }
        let patch = self.options();
        let mut bdev = BdevOptions::default();
        patch.apply_bdev(&mut bdev);
        bdev.validate()?;
        // The pacer options asked for must be valid on their own (against defaults).
        let mut p = PacerOptions::default();
        patch.apply_pacer(&mut p);
        p.validate()?;
        Ok(CheckedCreate {
            name: self.name,
            base_bdev_name: self.base_bdev_name,
            uuid: self.uuid,
            group,
            bdev,
            patch,
        })
    }
}

/// Checks that `chunk_bytes` holds at least one block of the base bdev.
pub fn check_chunk(chunk_bytes: u64, block_len: u32) -> Result<(), Refusal> {
    if chunk_bytes < block_len as u64 {
        return Err(Refusal::invalid(format!(
            "chunk_bytes = {chunk_bytes} is smaller than the base bdev's block ({block_len} bytes)"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    fn create(v: Value) -> Result<CheckedCreate, Refusal> {
        parse::<CreateParams>("qos_ini_bdev_create", v)?.check()
    }

    #[test]
    fn defaults_come_from_qos_core() {
        let c = create(json!({"name": "q", "base_bdev_name": "Nvme0n1"})).unwrap();
        assert_eq!(c.group, DEFAULT_GROUP);
        assert_eq!(c.bdev.engine_config(), InitiatorConfig::default());
        assert_eq!(
            PacerOptions::default().pacer_config(),
            PacerConfig::default()
        );
        assert!(c.bdev.token_protocol && c.bdev.pacing);
        assert!(!c.patch.has_pacer() && !c.patch.has_bdev());
    }

    #[test]
    fn options_are_applied_and_serialised_back() {
        let c = create(
            json!({"name": "q", "base_bdev_name": "b", "pacer_group": "g1",
            "chunk_bytes": 131072, "acquire_ops": 64, "pacing": false, "dirs": false}),
        )
        .unwrap();
        assert_eq!(c.bdev.acquire_ops, 64);
        assert!(!c.bdev.pacing);
        let mut p = PacerOptions::default();
        c.patch.apply_pacer(&mut p);
        assert_eq!(p.chunk_bytes, 131072);
        assert!(!p.dirs);
        let full = OptionsPatch::full(&c.bdev, &p);
        let back = CreateParams {
            pacer_group: Some("g1".into()),
            ..CreateParams::new("q".into(), "b".into())
        }
        .with_options(&full);
        let v = serde_json::to_value(&back).unwrap();
        assert_eq!(v["chunk_bytes"], 131072);
        assert_eq!(v["latency_target_us"], 200);
        assert_eq!(v["latency_target_auto_milli"], 0);
        let again = parse::<CreateParams>("x", v).unwrap().check().unwrap();
        assert_eq!(again.bdev, c.bdev);
    }

    #[test]
    fn bad_input_is_refused_with_a_message() {
        let cases = [
            (json!({"base_bdev_name": "b"}), "name"),
            (json!({"name": "q"}), "base_bdev_name"),
            (json!({"name": "", "base_bdev_name": "b"}), "printable"),
            (json!({"name": "a b", "base_bdev_name": "b"}), "printable"),
            (json!({"name": "q", "base_bdev_name": "q"}), "itself"),
            (
                json!({"name": "q", "base_bdev_name": "b", "chunk_bytes": 100}),
                "chunk",
            ),
            (
                json!({"name": "q", "base_bdev_name": "b", "chunk_bytes": 1u64 << 40}),
                "chunk",
            ),
            (
                json!({"name": "q", "base_bdev_name": "b", "link_mibps": 0}),
                "link_mibps",
            ),
            (
                json!({"name": "q", "base_bdev_name": "b", "acquire_ops": 0}),
                "acquire_ops",
            ),
            (
                json!({"name": "q", "base_bdev_name": "b", "request_timeout_us": 0}),
                "request_timeout_us",
            ),
            (
                json!({"name": "q", "base_bdev_name": "b", "refresh_interval_us": 5}),
                "refresh_interval_us",
            ),
            (
                json!({"name": "q", "base_bdev_name": "b", "probe_window": 0}),
                "probe window",
            ),
            (
                json!({"name": "q", "base_bdev_name": "b", "increase_milli": 2000}),
                "increase",
            ),
            (
                json!({"name": "q", "base_bdev_name": "b", "latency_target_us": 0}),
                "latency_target_us",
            ),
            (
                json!({"name": "q", "base_bdev_name": "b", "latency_target_auto_milli": 500}),
                "automatic latency target",
            ),
            (
                json!({"name": "q", "base_bdev_name": "b", "chunk_size": 65536}),
                "unknown field",
            ),
            (
                json!({"name": "q", "base_bdev_name": "b", "pacing": "yes"}),
                "invalid type",
            ),
            (
                json!({"name": "q", "base_bdev_name": "b", "acquire_ops": -1}),
                "invalid value",
            ),
            (
                json!({"name": "q", "base_bdev_name": "b", "pacer_group": ""}),
                "pacer_group",
            ),
        ];
        for (v, want) in cases {
            let e = create(v.clone()).expect_err(&v.to_string());
            assert_eq!(e.code, code::EINVAL);
            assert!(e.message.contains(want), "{v}: {}", e.message);
        }
        assert!(check_chunk(4096, 4096).is_ok());
        assert!(check_chunk(4096, 8192).is_err());
    }

    #[test]
    fn conflicts_with_a_group_are_named() {
        let p = PacerOptions::default();
        let patch = OptionsPatch {
            chunk_bytes: Some(p.chunk_bytes),
            link_mibps: Some(1000),
            ..OptionsPatch::default()
        };
        let c = patch.pacer_conflicts(&p);
        assert_eq!(c, vec!["link_mibps=1000 (the group has 2800)".to_string()]);
    }

    #[test]
    fn set_params_patch_only_what_is_given() {
        let s: SetParams = parse(
            "qos_ini_bdev_set_options",
            json!({"name": "q", "latency_target_us": 500}),
        )
        .unwrap();
        let o = s.options();
        assert!(o.has_pacer() && !o.has_bdev());
        let mut p = PacerOptions::default();
        o.apply_pacer(&mut p);
        assert_eq!(p.latency_target_us, 500);
        assert_eq!(p.chunk_bytes, 128 * 1024);
        assert!(p.chunk_auto);
        assert!(parse::<SetParams>("x", json!({"name": "q", "nope": 1})).is_err());
    }
}

// The schema of the `qos_ini_*` methods' parameters, read off the structs above and the
// checks their handlers make: compared with `rpc-scripts/schema/initiator.json`, which
// `rpc-scripts/tests/test_schema.py` compares with `qos_rpc.py`.
#[cfg(test)]
#[path = "../../rpc-scripts/schema/probe.rs"]
mod schema_probe;

#[cfg(test)]
mod schema {
    use super::schema_probe::{Method, Omitted, check_golden, check_registered, parse_as, render};
    use super::*;
    use serde_json::{Value, json};

    /// Options as `node::set_options` checks them (short of the base's block size).
    fn set_options(s: &SetParams) -> Result<(), String> {
        let patch = s.options();
        let mut b = BdevOptions::default();
        patch.apply_bdev(&mut b);
        b.validate().map_err(|e| e.message)?;
        let mut p = PacerOptions::default();
        patch.apply_pacer(&mut p);
        p.validate().map_err(|e| e.message)
    }

    /// Every parameter of a create call, resolved: the options its bdev and a new pacer
    /// group take.
    fn resolve_create(v: &Value) -> Value {
        let c = parse_as::<CreateParams>(v)
            .expect("minimal call")
            .check()
            .expect("minimal call");
        let mut pacer = PacerOptions::default();
        c.patch.apply_pacer(&mut pacer);
        let full = OptionsPatch::full(&c.bdev, &pacer);
        let resolved = CreateParams {
            uuid: c.uuid,
            pacer_group: Some(c.group),
            ..CreateParams::new(c.name, c.base_bdev_name)
        }
        .with_options(&full);
        serde_json::to_value(resolved).expect("serialisable")
    }

    fn methods() -> Vec<Method> {
        vec![
            Method::new::<CreateParams>(
                "qos_ini_bdev_create",
                "CreateParams",
                json!({"name": "q", "base_bdev_name": "b"}),
                |v| {
                    parse_as::<CreateParams>(v)?
                        .check()
                        .map(|_| ())
                        .map_err(|e| e.message)
                },
                Omitted::Default(Box::new(resolve_create)),
            )
            .checking_names(),
            Method::query::<NameParams>(
                "qos_ini_bdev_delete",
                "vbdev::rpc_delete",
                json!({"name": "q"}),
            ),
            Method::query::<NameQuery>("qos_ini_bdev_get", "NameQuery", json!({})),
            Method::new::<SetParams>(
                "qos_ini_bdev_set_options",
                "SetParams",
                json!({"name": "q"}),
                |v| set_options(&parse_as(v)?),
                Omitted::Keep(Box::new(|v| {
                    let o = parse_as::<SetParams>(v).expect("minimal call").options();
                    !o.has_bdev() && !o.has_pacer()
                })),
            ),
            Method::query::<NameQuery>("qos_ini_stats_get", "NameQuery", json!({})),
            Method::query::<spdk_sys::rpc::NoParams>(
                "qos_ini_version_get",
                "rpc::NoParams",
                json!({}),
            ),
        ]
    }

    #[test]
    fn params_schema_matches_rpc_scripts_schema() {
        let methods = methods();
        check_registered(
            include_str!("rpc.rs"),
            &[("node", include_str!("node.rs"))],
            &methods,
        );
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../rpc-scripts/schema/initiator.json");
        check_golden(
            &path,
            &render("initiator-plugin", &methods),
            "SPDK_DIR=/opt/spdk cargo test -p initiator-plugin params_schema",
        );
    }
}
