//! Completion dword 0 as the initiator plugin decodes it (a credit, or not ours).
//! The checks are `qos_fuzz::targets::credit`'s.
#![no_main]

libfuzzer_sys::fuzz_target!(|input: &[u8]| qos_fuzz::targets::credit(input));
