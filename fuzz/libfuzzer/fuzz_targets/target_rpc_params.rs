//! A session of `qos_*` calls on the target plugin, replayed on a fresh domain through
//! the handlers' parsing, checks and `Monitor` calls. The checks are
//! `nvmf_qos_tgt::params_fuzz::rpc_session`'s.
#![no_main]

libfuzzer_sys::fuzz_target!(|input: &[u8]| nvmf_qos_tgt::params_fuzz::rpc_session(input));
