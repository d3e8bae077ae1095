//! `qos-fuzz [TARGET...] [--runs N] [--seed S]`: runs the fuzz targets that build
//! without SPDK (default: all) for N inputs each (default 1,000,000), printing inputs
//! per second. Seeds come from `fuzz/corpus/<target>/` and, for scenarios,
//! from the lab's shipped scenario files (cluster scenarios from `scenarios/cluster/`).

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use qos_fuzz::{Rng, corpus, mutate_bytes, mutate_text, run, targets};

/// The names of [`targets::TARGETS`].
fn target_names() -> Vec<&'static str> {
    targets::TARGETS.iter().map(|(name, _)| *name).collect()
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).to_path_buf()
}

/// Where a target's seeds are: its corpus under `fuzz/corpus/`, or for scenarios the
/// lab's shipped scenario files.
fn seed_dirs(target: &str) -> Vec<PathBuf> {
    let lab = root().join("../qos-lab/scenarios");
    match target {
        "scenario" => vec![lab],
        "cluster_scenario" => vec![lab.join("cluster")],
        t => vec![root().join("corpus").join(t)],
    }
}

/// Every seed of `target`. A seed directory that is missing or empty is an error: a
/// moved corpus must not turn quietly into no seeds at all.
fn seeds(target: &str) -> Result<Vec<Vec<u8>>, String> {
    let mut s = Vec::new();
    for dir in seed_dirs(target) {
        let found = corpus(&dir);
        if found.is_empty() {
            return Err(format!("{target}: no seeds in {}", dir.display()));
        }
        s.extend(found);
    }
    Ok(s)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut runs = 1_000_000u64;
    let mut seed = 1u64;
    let mut chosen = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--runs" => runs = it.next().and_then(|v| v.parse().ok()).unwrap_or(runs),
            "--seed" => seed = it.next().and_then(|v| v.parse().ok()).unwrap_or(seed),
            "-h" | "--help" => {
                println!(
                    "usage: qos-fuzz [TARGET...] [--runs N] [--seed S]; targets: {:?}",
                    target_names()
                );
                return ExitCode::SUCCESS;
            }
            t if target_names().contains(&t) => chosen.push(t.to_string()),
            other => {
                eprintln!(
                    "unknown target or option {other:?}; targets: {:?}",
                    target_names()
                );
                return ExitCode::from(2);
            }
        }
    }
    if chosen.is_empty() {
        chosen = target_names().iter().map(|t| t.to_string()).collect();
    }
    for t in &chosen {
        let s = match seeds(t) {
            Ok(s) => s,
            Err(e) => {
                eprintln!("{e}");
                return ExitCode::FAILURE;
            }
        };
        let Some(&(_, check)) = targets::TARGETS.iter().find(|(name, _)| name == t) else {
            unreachable!("{t} was checked against the targets' names");
        };
        let texts: Vec<String> = s
            .iter()
            .map(|b| String::from_utf8_lossy(b).into_owned())
            .collect();
        let is_text = matches!(t.as_str(), "scenario" | "cluster_scenario" | "agent_input");
        let gen_input = |rng: &mut Rng| {
            let i = rng.below(s.len());
            let j = rng.below(s.len());
            let other = &s[j];
            if is_text {
                mutate_text(rng, &texts[i], &texts[j])
            } else if rng.chance(8) {
                (0..rng.below(300)).map(|_| rng.next_u64() as u8).collect()
            } else {
                let mut b = s[i].clone();
                mutate_bytes(rng, &mut b, other);
                b
            }
        };
        let r = run(t, runs, seed, &s, gen_input, check);
        println!(
            "{:<15} {:>10} inputs in {:>6.1} s: {:>10.0} inputs/s, no finding",
            r.target,
            r.runs,
            r.secs,
            r.per_sec()
        );
    }
    ExitCode::SUCCESS
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_target_has_seeds() {
        for t in target_names() {
            let s = seeds(t).unwrap_or_else(|e| panic!("{e}"));
            assert!(!s.is_empty(), "{t}");
        }
    }
}
