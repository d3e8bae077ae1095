//! A lab cluster scenario file (TOML): parsed, then simulated for at most 50 periods.
//! The checks are `qos_fuzz::targets::cluster_scenario`'s.
#![no_main]

libfuzzer_sys::fuzz_target!(|input: &[u8]| qos_fuzz::targets::cluster_scenario(input));
