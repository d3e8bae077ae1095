//! Allowance credits (completion dword 0, marker 0xB) as the initiator plugin receives
//! them. The checks are `qos_fuzz::targets::allowance_credit`'s.
#![no_main]

libfuzzer_sys::fuzz_target!(|input: &[u8]| qos_fuzz::targets::allowance_credit(input));
