//! A state reply as the initiator plugin decodes it.
//! The checks are `qos_fuzz::targets::state_reply`'s.
#![no_main]

libfuzzer_sys::fuzz_target!(|input: &[u8]| qos_fuzz::targets::state_reply(input));
