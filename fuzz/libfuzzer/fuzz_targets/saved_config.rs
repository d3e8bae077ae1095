//! An SPDK `save_config` document (what `nvmf_tgt --json` and `load_config` replay
//! after a restart): its calls replayed in order by both plugins' handlers' parsing and
//! checks. The checks are the plugins' `params_fuzz::saved_config`.
#![no_main]

libfuzzer_sys::fuzz_target!(|input: &[u8]| {
    nvmf_qos_tgt::params_fuzz::saved_config(input);
    nvmf_qos_ini::params_fuzz::saved_config(input);
});
