//! A vendor command as the target plugin decodes it (opcode, dwords 10..15, buffer length).
//! The checks are `qos_fuzz::targets::vendor_command`'s.
#![no_main]

libfuzzer_sys::fuzz_target!(|input: &[u8]| qos_fuzz::targets::vendor_command(input));
