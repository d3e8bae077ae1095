//! What the cluster agent reads from outside: etcd records and the target's answers.
//! The checks are `qos_fuzz::targets::agent_input`'s.
#![no_main]

libfuzzer_sys::fuzz_target!(|input: &[u8]| qos_fuzz::targets::agent_input(input));
