//! qos-lab: an emulated NVMe-oF target shared by N hosts, as a deterministic
//! discrete-event simulation, driving the same qos-core code that the SPDK plugins load.
//! It reproduces the Haechi and Justitia experiments and lets an operator try a set of
//! hosts, reservations and limits before applying them.
//!
//! - [`scenario`]: the TOML scenario files, validated (errors name file, line, field).
//! - [`server`]: the emulated target: a processor-sharing server with a per-host cap,
//!   and a FIFO link.
//! - [`nslimit`]: SPDK's per-namespace bdev QoS limit, the baseline policy.
//! - [`sim`]: the event loop that moves commands between hosts, qos-core and the target.
//! - [`runner`]: all policies of a scenario, in parallel, deterministically.
//! - [`report`]: the JSON summary and the table.
//! - [`plot`]: PNG figures in the style of the papers.
//! - [`check`]: admission control only (`qos-lab check`).
//! - [`cluster`]: a cluster of targets sharing hosts (`qos-lab cluster`).
//! - [`shipped`]: the scenarios shipped in `qos-lab/scenarios/`.
//! - [`locate`]: file positions and field paths for error messages.
#![forbid(unsafe_code)]
#![warn(clippy::too_many_lines)]

pub mod check;
pub mod cluster;
pub mod locate;
pub mod nslimit;
pub mod plot;
pub mod report;
pub mod runner;
pub mod scenario;
pub mod server;
pub mod shipped;
pub mod sim;

pub use report::Summary;
pub use scenario::{Policy, Scenario, ScenarioError};
pub use sim::{Outcome, RunError, RunOptions};
