//! A session of `qos_ini_*` calls on the initiator plugin, through the handlers'
//! parsing and checks, then the token engine and pacer built from what passes. The
//! checks are `nvmf_qos_ini::params_fuzz::rpc_session`'s.
#![no_main]

libfuzzer_sys::fuzz_target!(|input: &[u8]| nvmf_qos_ini::params_fuzz::rpc_session(input));
