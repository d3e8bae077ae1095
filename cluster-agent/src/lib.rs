//! nvmf-qos cluster agent: one per `nvmf_tgt`, it holds each host's cluster-wide
//! reservation and limit across a cluster of targets, coordinated through etcd
//! (docs/cluster.md). The agent talks to etcd on one side and to its target's JSON-RPC
//! socket on the other, so no SPDK reactor ever waits on the network.
//!
//! - [`connect`]: the etcd URL, TLS files and credentials, checked at start-up.
//! - [`store`]: the etcd operations the agent needs, over etcd's JSON gateway; an
//!   in-memory store for tests.
//! - [`keys`]: the key layout and the records stored at each key.
//! - [`division`]: the leader writing a division and an agent reading its part, in
//!   either key schema.
//! - [`target`]: reading counters and capacity from the target, applying shares to it.
//! - [`demand`]: the hosts' demand at the target, over a sliding window.
//! - [`agent`]: one interval of an agent (report, lead, apply; trade while etcd is
//!   away).
//! - [`peers`]: reading the other agents' handover reports over HTTP.
//! - [`admin`]: the operator's commands (create a cluster, set hosts, show).
//! - [`metrics`]: the agent's own metrics and health, served for Prometheus.
//! - [`cpu`]: the calling thread's CPU time, for timing the division as CPU.
//! - [`played`]: the other targets' agents played into etcd and a stand-in target,
//!   for sizing a leader without a fleet (the scale test, the lab's played leader).

pub mod admin;
pub mod agent;
pub mod connect;
pub mod cpu;
pub mod demand;
pub mod division;
pub mod keys;
pub mod metrics;
pub mod peers;
pub mod played;
pub mod store;
pub mod target;
