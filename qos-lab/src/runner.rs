//! Runs every policy (and variant) of a scenario, in parallel on a few threads, and
//! returns the outcomes in the scenario's order whatever the thread count: each run is
//! an independent deterministic simulation.

use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::scenario::{Policy, Scenario};
use crate::sim::{Outcome, RunError, RunOptions, simulate};

/// One unit of work: a variant (index into `Scenario::runs`) under one policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Job {
    pub run: usize,
    pub policy: Policy,
}

/// The jobs of a scenario, variant by variant, policies in the scenario's order.
pub fn jobs(scenario: &Scenario) -> Vec<Job> {
    let mut out = Vec::new();
    for run in 0..scenario.runs.len() {
        for &policy in &scenario.policies {
            out.push(Job { run, policy });
        }
    }
    out
}

/// Runs all jobs on `threads` threads. `tick` is called (from any thread) with the
/// number of newly simulated periods, for a progress bar.
pub fn run_all(
    scenario: &Scenario,
    opts: RunOptions,
    threads: usize,
    tick: &(dyn Fn(u64) + Sync),
) -> Result<Vec<Outcome>, RunError> {
    let jobs = jobs(scenario);
    let next = AtomicUsize::new(0);
    let results: Mutex<Vec<Option<Result<Outcome, RunError>>>> =
        Mutex::new((0..jobs.len()).map(|_| None).collect());
    let threads = threads.clamp(1, jobs.len().max(1));
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(job) = jobs.get(i) else {
                        break;
                    };
                    let mut last = 0u32;
                    let mut progress = |k: u32| {
                        if k > last {
                            tick(u64::from(k - last));
                            last = k;
                        }
                    };
                    let r = simulate(
                        scenario,
                        &scenario.runs[job.run],
                        job.policy,
                        opts,
                        &mut progress,
                    );
                    results.lock().expect("no thread panics holding it")[i] = Some(r);
                }
            });
        }
    });
    results
        .into_inner()
        .expect("no thread panics holding it")
        .into_iter()
        .map(|r| r.expect("every job ran"))
        .collect()
}

/// Periods simulated in total (for the progress bar's length).
pub fn total_periods(scenario: &Scenario, opts: RunOptions) -> u64 {
    let per = u64::from(
        opts.periods.unwrap_or(scenario.periods)
            + opts.warmup_periods.unwrap_or(scenario.warmup_periods),
    );
    per * jobs(scenario).len() as u64
}
