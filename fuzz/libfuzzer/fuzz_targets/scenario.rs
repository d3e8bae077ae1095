//! A lab scenario file (TOML): parsed, then built into a monitor and ticked.
//! The checks are `qos_fuzz::targets::scenario`'s.
#![no_main]

libfuzzer_sys::fuzz_target!(|input: &[u8]| qos_fuzz::targets::scenario(input));
