//! The `qos-lab` command: `run` a scenario (all its policies) and print the per-host
//! table, optionally writing the JSON summary and a PNG plot; `check` a scenario's
//! reservations with admission control only; `list` the shipped scenarios.
#![warn(clippy::too_many_lines)]

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use clap::{Parser, Subcommand};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use qos_lab::runner::{run_all, total_periods};
use qos_lab::{
    Outcome, RunError, RunOptions, Scenario, ScenarioError, Summary, check, plot, shipped,
};

#[derive(Debug, Parser)]
#[command(
    name = "qos-lab",
    version,
    about = "Emulated NVMe-oF target driving the nvmf-qos core: try hosts, reservations and limits, or reproduce the Haechi and Justitia experiments"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Simulate every policy of a scenario and print a table per policy and host.
    #[command(after_long_help = qos_lab::report::LEGEND)]
    Run {
        /// A scenario file, or the name of a shipped scenario (see `list`).
        scenario: String,
        /// Seed of the random streams (default: the scenario's).
        #[arg(long)]
        seed: Option<u64>,
        /// Measured periods, at least 1 (default: the scenario's).
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
        periods: Option<u32>,
        /// Warm-up periods, not measured (default: the scenario's).
        #[arg(long)]
        warmup: Option<u32>,
        /// Divide every rate by this, at least 1 (default: the scenario's `scale`).
        #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
        scale: Option<u64>,
        /// Write the JSON summary here.
        #[arg(long, value_name = "PATH")]
        json: Option<PathBuf>,
        /// Write a PNG plot here.
        #[arg(long, value_name = "PATH.png")]
        plot: Option<PathBuf>,
        /// Simulation threads (default: the machine's cores, at most 8).
        #[arg(long)]
        threads: Option<usize>,
    },
    /// Admission control only: which reservations fit the target, and why not.
    Check {
        /// A scenario file, or the name of a shipped scenario.
        scenario: String,
    },
    /// List the shipped scenarios.
    List,
    /// A cluster of targets sharing hosts: each host's reservation and limit divided
    /// among the targets by the cluster agents' rule, demand moves and target failures,
    /// the agents' timing and etcd outages, or a generated fleet of targets and hosts
    /// (docs/cluster.md, "Planning in the lab").
    Cluster {
        /// A cluster scenario file (qos-lab/scenarios/cluster/*.toml).
        file: PathBuf,
        /// With a generated fleet: also play the first target's agent as the leader for
        /// N intervals, in real time (the agent's own interval against a real etcd the
        /// lab starts, a stand-in target and the other agents played; needs Debian's
        /// etcd-server), and print its CPU per interval (docs/cluster.md).
        #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=3600))]
        play_leader: Option<u32>,
    },
}

fn load(arg: &str) -> Result<Scenario, String> {
    let path = Path::new(arg);
    if !path.exists() {
        let name = arg.trim_end_matches(".toml");
        return match shipped::find(name) {
            Some(text) => {
                Scenario::parse(text, &shipped::path_of(name), name).map_err(|e| e.to_string())
            }
            None => Err(format!(
                "no scenario file {arg:?} and no shipped scenario named {name:?}; \
                 `qos-lab list` shows the shipped scenarios"
            )),
        };
    }
    Scenario::load(path).map_err(|e: ScenarioError| e.to_string())
}

/// Refuses an output path whose folder does not exist, before any simulation runs.
fn check_output(p: &Path, what: &str) -> Result<(), String> {
    match p.parent() {
        Some(dir) if !dir.as_os_str().is_empty() && !dir.is_dir() => Err(format!(
            "cannot write the {what} to {}: the folder {} does not exist",
            p.display(),
            dir.display()
        )),
        _ => Ok(()),
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Cluster { file, play_leader } => cluster(&file, play_leader),
        Command::List => list(),
        Command::Check { scenario } => check_scenario(&scenario),
        Command::Run {
            scenario,
            seed,
            periods,
            warmup,
            scale,
            json,
            plot: plot_path,
            threads,
        } => {
            let opts = RunOptions {
                seed,
                periods,
                warmup_periods: warmup,
                scale,
            };
            run(&scenario, opts, json, plot_path, threads)
        }
    }
}

/// `qos-lab cluster FILE [--play-leader N]`.
fn cluster(file: &Path, play_leader: Option<u32>) -> ExitCode {
    match qos_lab::cluster::ClusterScenario::load(file) {
        Ok(s) if s.fleet.is_some() => {
            let started = std::time::Instant::now();
            let periods = s.cluster.periods;
            let run = qos_lab::cluster::simulate_with_progress(&s, &mut |p| {
                if (p + 1) % 10 == 0 || p + 1 == periods {
                    eprintln!(
                        "period {} of {periods} ({:.1} s)",
                        p + 1,
                        started.elapsed().as_secs_f64()
                    );
                }
            });
            print!("{}", qos_lab::cluster::fleet_report(&s, &run));
            println!("{}", qos_lab::cluster::division_time_line(&run));
            let costs = qos_lab::cluster::ByteCosts::calibrate(&s);
            println!("{}", qos_lab::cluster::agent_cpu_line(&run, &costs));
            println!("simulated in {:.1} s", started.elapsed().as_secs_f64());
            let Some(n) = play_leader else {
                return ExitCode::SUCCESS;
            };
            eprintln!(
                "playing the leader agent: {} targets, {} hosts, {n} intervals of {} ms after its warm-up",
                s.targets.len(),
                s.hosts.len(),
                s.cluster.interval_ms
            );
            let played = qos_lab::cluster::play_leader(&s, n, &mut |k, of| {
                if k % 10 == 0 || k == of {
                    eprintln!("played interval {k} of {of}");
                }
            });
            match played {
                Ok(p) => {
                    println!("{}", qos_lab::cluster::played_leader_line(&p));
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("error: playing the leader: {e}");
                    ExitCode::from(1)
                }
            }
        }
        Ok(_) if play_leader.is_some() => {
            eprintln!(
                "error: --play-leader plays a generated fleet's leader: {} has no [fleet]",
                file.display()
            );
            ExitCode::from(2)
        }
        Ok(s) => {
            let run = qos_lab::cluster::simulate(&s);
            print!("{}", qos_lab::cluster::report(&s, &run));
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}

/// `qos-lab list`.
fn list() -> ExitCode {
    let width = shipped::SHIPPED
        .iter()
        .map(|(n, _)| n.len())
        .max()
        .unwrap_or(0);
    for (name, text) in shipped::SHIPPED {
        let desc = Scenario::parse(text, &shipped::path_of(name), name)
            .map(|s| s.description)
            .unwrap_or_else(|e| format!("(invalid: {e})"));
        println!("{name:<width$}  {desc}");
    }
    println!("\nRun one with `qos-lab run NAME` or `qos-lab run qos-lab/scenarios/NAME.toml`.");
    ExitCode::SUCCESS
}

/// `qos-lab check SCENARIO`.
fn check_scenario(scenario: &str) -> ExitCode {
    match load(scenario) {
        Ok(s) => {
            let rep = check::check(&s);
            print!("{}", rep.text);
            if rep.admitted {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            }
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}

/// `qos-lab run SCENARIO`: every policy simulated, the table printed, the JSON summary
/// and the plot written if asked.
fn run(
    scenario: &str,
    opts: RunOptions,
    json: Option<PathBuf>,
    plot_path: Option<PathBuf>,
    threads: Option<usize>,
) -> ExitCode {
    let s = match load(scenario) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    for (p, what) in [(&json, "JSON summary"), (&plot_path, "plot")] {
        if let Some(p) = p
            && let Err(e) = check_output(p, what)
        {
            eprintln!("error: {e}");
            return ExitCode::from(1);
        }
    }
    let threads = threads.unwrap_or_else(|| {
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
            .min(8)
    });
    let started = Instant::now();
    let outcomes = match simulate_with_progress(&s, opts, threads) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let elapsed = started.elapsed();
    let summary = Summary::new(&s, &outcomes);
    print!("{}", summary.table());
    let events: u64 = outcomes.iter().map(|o| o.events).sum();
    println!(
        "\nsimulated {} runs, {:.1} M events in {:.1} s on {} threads",
        outcomes.len(),
        events as f64 / 1e6,
        elapsed.as_secs_f64(),
        threads
    );
    write_outputs(&summary, json, plot_path)
}

/// Every policy of `s` on `threads` threads, with a progress bar on stderr.
fn simulate_with_progress(
    s: &Scenario,
    opts: RunOptions,
    threads: usize,
) -> Result<Vec<Outcome>, RunError> {
    let bar =
        ProgressBar::with_draw_target(Some(total_periods(s, opts)), ProgressDrawTarget::stderr());
    bar.set_style(
        ProgressStyle::with_template(
            "{prefix} [{elapsed_precise}] {wide_bar} {pos}/{len} periods (eta {eta})",
        )
        .expect("valid template"),
    );
    bar.set_prefix(s.name.clone());
    let outcomes = run_all(s, opts, threads, &|n| bar.inc(n));
    bar.finish_and_clear();
    outcomes
}

/// The JSON summary and the plot, where asked.
fn write_outputs(summary: &Summary, json: Option<PathBuf>, plot_path: Option<PathBuf>) -> ExitCode {
    if let Some(p) = json {
        if let Err(e) = std::fs::write(&p, summary.to_json() + "\n") {
            eprintln!("error: cannot write {}: {e}", p.display());
            return ExitCode::from(1);
        }
        println!("JSON summary written to {}", p.display());
    }
    if let Some(p) = plot_path {
        let with_text = plot::font().is_some();
        if let Err(e) = plot::render(summary, &p) {
            eprintln!("error: cannot draw the plot {}: {e}", p.display());
            return ExitCode::from(1);
        }
        if with_text {
            println!("plot written to {}", p.display());
        } else {
            println!(
                "plot written to {} without text: no font found (install fonts-dejavu-core or set QOS_LAB_FONT to a .ttf file)",
                p.display()
            );
        }
    }
    ExitCode::SUCCESS
}
