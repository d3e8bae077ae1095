//! The inputs that once crashed a fuzz target (`fuzz/regressions/<target>/`, where
//! `make fuzz-cov` puts what libFuzzer finds), replayed on stable so that what was fixed
//! stays fixed. The SPDK-linked targets' folders are replayed by the plugins' tests.

use qos_fuzz::replay_regressions;
use qos_fuzz::targets::{SPDK_TARGETS, TARGETS};

#[test]
fn every_crash_input_stays_fixed() {
    for (target, check) in TARGETS {
        let n = replay_regressions(target, check);
        println!("{target}: {n} crash inputs replayed");
    }
}

/// A folder named after no target would never be replayed: a renamed target must take
/// its crash inputs along.
#[test]
fn every_regressions_folder_names_a_target() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("regressions");
    for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
        if !entry.path().is_dir() {
            continue;
        }
        let name = entry.file_name().to_string_lossy().into_owned();
        assert!(
            TARGETS.iter().any(|(t, _)| *t == name) || SPDK_TARGETS.contains(&name.as_str()),
            "fuzz/regressions/{name} names no fuzz target"
        );
    }
}
