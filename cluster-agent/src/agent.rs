//! One agent's interval: read the target, report to etcd under the agent's lease, lead
//! the division when this agent holds the leader key, and apply this target's shares.
//! Every decision is a function of what was read ([`reconcile`], `qos_core::cluster::plan`);
//! the I/O goes through [`Store`] and [`TargetRpc`], so tests drive agents against an
//! in-memory store and stub targets as well as a real etcd and real targets.
//!
//! Failure rules: when etcd cannot be reached the target keeps the division's shares,
//! moved only by what the agents trade directly ([`qos_core::handover`]: a target
//! releases a host's unused share to a peer that holds the host back, which takes
//! exactly that), and I/O never waits on etcd; when the target cannot be reached the
//! agent stops renewing its lease, so the cluster gives its shares to the other targets
//! once the lease expires.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use qos_core::cluster::{
    ClusterHost, DivideConfig, LocalShare, PathDemand, Plan, cold_share, on_path, plan,
    with_cold_shares,
};
use qos_core::handover::{Handover, HandoverConfig, HandoverReport};

use crate::demand::DemandMeter;
use crate::division::{self, Written};
use crate::keys::{
    ClusterRecord, DemandRecord, Keys, MemberRecord, hosts_of, parse, parts_list_paths_only,
};
use crate::peers::Peers;
use crate::store::{LeaseId, Store, StoreError};
use crate::target::{LocalState, TargetError, TargetRpc};

/// What an agent is for.
#[derive(Debug, Clone)]
pub struct AgentConfig {
    pub cluster: String,
    /// This target's name in the cluster.
    pub target: String,
    /// The domain on this target that holds the cluster's hosts.
    pub domain: String,
    /// Lease time-to-live: how long after its last renewal a silent agent's target
    /// still counts as live.
    pub lease_ttl_s: u64,
    /// Window of the demand measurement; `None`: the domain's period.
    pub window_ms: Option<u64>,
    /// Where the other agents read this one's handover report (`http://ADDR/handover`);
    /// `None`: it serves none, and trades nothing while etcd is away.
    pub handover_url: Option<String>,
}

/// What one interval did.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TickReport {
    pub target_ok: bool,
    /// The interval finished its calls to etcd (its lease renewed, its records written).
    pub etcd_ok: bool,
    /// etcd answered this interval: `etcd_ok`, or, while the target cannot be read (the
    /// interval does not renew the lease then), a read of the cluster's settings.
    pub etcd_reachable: bool,
    pub leader: bool,
    /// Another agent's lease holds this target's name (its member record): this agent
    /// wrote nothing and applied no division.
    pub name_taken: bool,
    /// Shares written to the target (`qos_host_set`) and hosts given back
    /// (`qos_host_remove`).
    pub set: usize,
    pub removed: usize,
    /// The shares record applied (its `seq`), if this target is in it.
    pub shares_seq: Option<u64>,
    /// This target's part of that record: per host, the share it should hold. Shared
    /// with the agent's state and its metrics rather than copied (1,000 hosts at fleet
    /// size, every interval).
    pub shares: Arc<BTreeMap<String, LocalShare>>,
    /// The cluster's hosts and their cluster-wide contracts, as read this interval;
    /// shared as `shares` is.
    pub contracts: Arc<BTreeMap<String, ClusterHost>>,
    /// Hosts whose share the target refused this interval, with why (see
    /// [`Change::describe`]); not in `errors`.
    pub refused: BTreeMap<String, String>,
    /// With etcd away: the peers whose handover report was read, and the shares moved
    /// by trading (counted in `set` too).
    pub peers_read: usize,
    /// Of those, the peers on another division (`seq`): they trade nothing with this one.
    pub peers_other_division: usize,
    pub traded: usize,
    /// As leader: how long `plan` took this interval (measured, for the metrics): wall
    /// time, and the thread's CPU time (where the kernel gives it).
    pub division_time: Option<std::time::Duration>,
    pub division_cpu: Option<std::time::Duration>,
    /// As leader: the division records written this interval, when it wrote one.
    pub division_written: Option<division::WriteCount>,
    /// Where the interval's time went, in order.
    pub phases: Vec<Phase>,
    pub errors: Vec<String>,
}

/// A part of an interval (`target`: reading the target; `report`: its demand measured,
/// its lease renewed, the cluster's records read, this target's written; `listed`,
/// `plan`, `lead`: as leader, the records listed, the division computed, written;
/// `division`: this target's part read; `apply`: the shares set at the target) and
/// what it took.
#[derive(Debug, Clone, PartialEq)]
pub struct Phase {
    pub what: &'static str,
    pub wall: std::time::Duration,
    /// The agent's thread's CPU time in it (where the kernel gives it): what the
    /// interval's work costs, apart from what the scheduler gave others meanwhile.
    pub cpu: Option<std::time::Duration>,
}

/// Marks the end of an interval's phase in [`TickReport::phases`].
struct Clock {
    wall: std::time::Instant,
    cpu_ns: Option<u64>,
}

impl Clock {
    fn start() -> Clock {
        Clock {
            wall: std::time::Instant::now(),
            cpu_ns: crate::cpu::thread_cpu_ns(),
        }
    }

    fn lap(&mut self, r: &mut TickReport, what: &'static str) {
        let (wall, cpu_ns) = (std::time::Instant::now(), crate::cpu::thread_cpu_ns());
        r.phases.push(Phase {
            what,
            wall: wall - self.wall,
            cpu: self
                .cpu_ns
                .zip(cpu_ns)
                .map(|(a, b)| std::time::Duration::from_nanos(b.saturating_sub(a))),
        });
        (self.wall, self.cpu_ns) = (wall, cpu_ns);
    }
}

/// A change to make at the target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    Set(String, LocalShare),
    Remove(String),
}

impl Change {
    /// The host it is about.
    pub fn host(&self) -> &str {
        match self {
            Change::Set(nqn, _) | Change::Remove(nqn) => nqn,
        }
    }

    /// What the change is, for a person: `share of HOST (reservation 300 IOPS, limit 600
    /// IOPS, weight 1)` or `giving HOST back`.
    pub fn describe(&self) -> String {
        match self {
            Change::Set(nqn, s) => {
                let mibps = if s.reservation_mibps > 0 || s.limit_mibps.is_some() {
                    format!(
                        ", reservation {} MiB/s, {}",
                        s.reservation_mibps,
                        s.limit_mibps
                            .map_or("no MiB/s limit".into(), |l| format!("limit {l} MiB/s"))
                    )
                } else {
                    String::new()
                };
                format!(
                    "share of {nqn} (reservation {} IOPS, {}{mibps}, weight {})",
                    s.reservation_iops,
                    s.limit_iops
                        .map_or("no limit".into(), |l| format!("limit {l} IOPS")),
                    s.weight
                )
            }
            Change::Remove(nqn) => format!("giving {nqn} back (qos_host_remove)"),
        }
    }
}

/// An agent's state between intervals.
#[derive(Debug)]
pub struct Agent {
    cfg: AgentConfig,
    keys: Keys,
    lease: Option<LeaseId>,
    /// This agent held the leader key at its last interval that reached etcd.
    leading: bool,
    /// What this agent last wrote as leader.
    written: Option<Written>,
    /// Hosts this agent configured on its target (it removes only those).
    managed: BTreeSet<String>,
    last_refusal: Option<String>,
    meter: DemandMeter,
    handover: Handover,
    /// From the last division read: the peers' handover URLs, the contracts and the
    /// cluster's division settings, to trade by while etcd is away.
    peer_urls: BTreeMap<String, String>,
    contracts: Arc<BTreeMap<String, ClusterHost>>,
    divide: DivideConfig,
    /// This target's part of the last two divisions read (`seq`, shares), newest last:
    /// an agent that read a division its peers did not before etcd went away goes back
    /// to the one they share, to trade on it ([`Agent::trade`]).
    parts: Vec<(u64, Arc<BTreeMap<String, LocalShare>>)>,
    /// As leader: the members' and demand records last read, parsed.
    read: LeaderReads,
}

/// The members' and demand records a leader read, with what it took from each: a
/// record whose text is the one read at the last interval is not parsed again. Every
/// agent writes both every interval, mostly unchanged (the demand moves when a host's
/// does); at 64 targets x 1,000 hosts they are about 10 MB of JSON an interval, and
/// parsing them was most of the leader's own work beside `plan`. What the division
/// gets is what parsing every record would give (test
/// `the_leader_reads_what_it_parsed_before_only_when_the_text_is_the_same`).
#[derive(Debug, Default)]
struct LeaderReads {
    /// Per member: its record's text and the handover URL in it.
    members: BTreeMap<String, (String, Option<String>)>,
    /// Per target: its demand record's text, and why it does not parse.
    demand_text: BTreeMap<String, (String, Option<String>)>,
    /// Per target whose demand record parses: the demand in it.
    demand: BTreeMap<String, BTreeMap<String, PathDemand>>,
    /// Records parsed (not taken from the last interval's) so far.
    parsed: u64,
}

impl LeaderReads {
    /// The members (their names, in key order) and their handover URLs, from a listing
    /// of [`Keys::members`].
    fn members(
        &mut self,
        listing: Vec<(String, String)>,
        keys: &Keys,
    ) -> (Vec<String>, BTreeMap<String, String>) {
        refresh(
            &mut self.members,
            listing,
            &keys.members(),
            &mut self.parsed,
            |k, _, v| {
                parse::<MemberRecord>(k, v)
                    .ok()
                    .and_then(|m| m.handover_url)
            },
        );
        let names = self.members.keys().cloned().collect();
        let urls = self
            .members
            .iter()
            .filter_map(|(t, (_, url))| Some((t.clone(), url.clone()?)))
            .collect();
        (names, urls)
    }

    /// Every target's demand, from a listing of [`Keys::demands`]; a record that does
    /// not parse is named in `r.errors` (at every interval, as long as it is there).
    fn demand(
        &mut self,
        listing: Vec<(String, String)>,
        keys: &Keys,
        r: &mut TickReport,
    ) -> &BTreeMap<String, BTreeMap<String, PathDemand>> {
        let demand = &mut self.demand;
        refresh(
            &mut self.demand_text,
            listing,
            &keys.demands(),
            &mut self.parsed,
            |k, t, v| match parse::<DemandRecord>(k, v) {
                Ok(d) => {
                    demand.insert(t.to_string(), d.hosts);
                    None
                }
                Err(e) => {
                    demand.remove(t);
                    Some(e)
                }
            },
        );
        r.errors
            .extend(self.demand_text.values().filter_map(|(_, e)| e.clone()));
        let listed = &self.demand_text;
        self.demand.retain(|t, _| listed.contains_key(t));
        &self.demand
    }
}

/// Takes the records of `listing` under `prefix` into `cache` (per target: the record's
/// text and what was taken from it): a record whose text is the cached one keeps what
/// was taken from it, any other is given to `take(key, target, text)` (counted in
/// `parsed`); targets no longer listed leave the cache.
fn refresh<V>(
    cache: &mut BTreeMap<String, (String, V)>,
    listing: Vec<(String, String)>,
    prefix: &str,
    parsed: &mut u64,
    mut take: impl FnMut(&str, &str, &str) -> V,
) {
    let mut seen = BTreeMap::new();
    for (k, v) in listing {
        let Some(t) = k.strip_prefix(prefix) else {
            continue;
        };
        let taken = match cache.remove(t) {
            Some((text, taken)) if text == v => taken,
            _ => {
                *parsed += 1;
                take(&k, t, &v)
            }
        };
        seen.insert(t.to_string(), (v, taken));
    }
    *cache = seen;
}

/// Shares move at the target only when they change by more than this many thousandths
/// (or a limit appears or goes, or the weight changes): the figures the division starts
/// from move a little every interval, and each `qos_host_set` re-prorates the host's
/// period at the target. With a change applied at every 0.5 %, the two-target test met
/// the reservation in 32 of 35 windows; at 3 %, in 35 of 35.
pub const HYSTERESIS_MILLI: u64 = 30;

/// A reservation share that goes up, or a limit share that goes down, is applied from
/// this many thousandths on: when the division moves a share from one target to
/// another, the move toward the contract is applied at once and the other waits, so the
/// reservations the targets hold add up to at least the host's reservation (less this)
/// and the limits to at most its limit (plus this). The waiting side is what the
/// hysteresis costs: up to 3 % more reserved, or up to 3 % less allowed, than the
/// contract while the demand moves.
pub const PROMPT_MILLI: u64 = 5;

fn differs_by(a: u64, b: u64, milli: u64) -> bool {
    a.abs_diff(b) as u128 * 1000 > a.max(b) as u128 * milli as u128
}

fn share_differs(have: &LocalShare, want: &LocalShare) -> bool {
    have.weight != want.weight
        || amounts_differ(
            (have.reservation_iops, have.limit_iops),
            (want.reservation_iops, want.limit_iops),
        )
        || amounts_differ(
            (have.reservation_mibps, have.limit_mibps),
            (want.reservation_mibps, want.limit_mibps),
        )
}

/// A new division is written only when it moves a share as much as an agent applies
/// (`share_differs`), or adds or drops a target or host: the measured rates move a
/// little every interval, and a division written for each such move changed the
/// record's `seq` about once a second. While etcd is away only targets on the same
/// `seq` trade, so an outage that began right after one agent had read a new division
/// and the other had not saw no trade at all (real two-target runs, 2026-11-29). The
/// plan compared with is the one last written, so small moves that add up are written.
pub fn plan_moves(written: &Plan, new: &Plan) -> bool {
    written.len() != new.len()
        || written.iter().zip(new).any(|((t0, h0), (t1, h1))| {
            t0 != t1
                || h0.len() != h1.len()
                || h0
                    .iter()
                    .zip(h1)
                    .any(|((n0, s0), (n1, s1))| n0 != n1 || share_differs(s0, s1))
        })
}

/// One resource's (reservation, limit) moved enough to apply: see [`HYSTERESIS_MILLI`]
/// and [`PROMPT_MILLI`].
fn amounts_differ(have: (u64, Option<u64>), want: (u64, Option<u64>)) -> bool {
    let reservation_milli = if want.0 > have.0 {
        PROMPT_MILLI
    } else {
        HYSTERESIS_MILLI
    };
    differs_by(have.0, want.0, reservation_milli)
        || match (have.1, want.1) {
            (Some(a), Some(b)) if b < a => differs_by(a, b, PROMPT_MILLI),
            (Some(a), Some(b)) => differs_by(a, b, HYSTERESIS_MILLI),
            (None, None) => false,
            _ => true,
        }
}

/// Sets `want` for `nqn`. When the target refuses it and a reservation in it went up
/// (the target's admission control: the reservations would exceed what it reckons it
/// can serve, e.g. the depth curve's operating point after a slow spell), sets `want`
/// with the reservations `have` holds instead, so that the new limit and weight apply:
/// a refused raise must not also keep a lowered limit in force (while etcd was away a
/// refused take kept the host at its old limit at the target its demand moved to, and
/// its reservation was missed for the whole outage). Returns the refusal and whether
/// that fallback is in force.
fn set_share(
    tgt: &mut dyn TargetRpc,
    domain: &str,
    nqn: &str,
    want: &LocalShare,
    have: Option<&LocalShare>,
) -> Result<(), (TargetError, bool)> {
    let res = tgt.host_set(domain, nqn, want);
    after_set(tgt, domain, nqn, want, have, res)
}

/// What [`set_share`] does once the target answered `res` to `want`: the fallback when
/// it refused a raise.
fn after_set(
    tgt: &mut dyn TargetRpc,
    domain: &str,
    nqn: &str,
    want: &LocalShare,
    have: Option<&LocalShare>,
    res: Result<(), TargetError>,
) -> Result<(), (TargetError, bool)> {
    let Err(e) = res else {
        return Ok(());
    };
    let (Some(have), TargetError::Refused { .. }) = (have, &e) else {
        return Err((e, false));
    };
    if want.reservation_iops <= have.reservation_iops
        && want.reservation_mibps <= have.reservation_mibps
    {
        return Err((e, false));
    }
    let kept = LocalShare {
        reservation_iops: want.reservation_iops.min(have.reservation_iops),
        reservation_mibps: want.reservation_mibps.min(have.reservation_mibps),
        ..*want
    };
    let fallback = tgt.host_set(domain, nqn, &kept).is_ok();
    Err((e, fallback))
}

/// Shares sent to the target at once ([`TargetRpc::host_set_many`]): about 16 KB of
/// requests, half of what SPDK's RPC server reads from a connection per poll; the
/// lease is renewed between two such runs when due.
pub const SETS_AT_ONCE: usize = 64;

/// What a refusal reads as in the log and the member record.
fn refusal_text(c: &Change, e: &TargetError, fallback: bool) -> String {
    if fallback {
        format!(
            "{}: {e}; its limit and weight applied with the reservation held before",
            c.describe()
        )
    } else {
        format!("{}: {e}", c.describe())
    }
}

/// The changes that bring the target's `settings` to `mine` (this target's part of the
/// division; `None` when the division does not include this target yet: nothing
/// changes), removing the `managed` hosts that left the cluster's `hosts`.
pub fn reconcile(
    mine: Option<&BTreeMap<String, LocalShare>>,
    hosts: &BTreeMap<String, ClusterHost>,
    settings: &BTreeMap<String, LocalShare>,
    managed: &BTreeSet<String>,
) -> Vec<Change> {
    let Some(mine) = mine else {
        return Vec::new();
    };
    let mut out: Vec<Change> = mine
        .iter()
        .filter(|(nqn, want)| {
            hosts.contains_key(*nqn)
                && settings
                    .get(*nqn)
                    .is_none_or(|have| share_differs(have, want))
        })
        .map(|(nqn, s)| Change::Set(nqn.clone(), *s))
        .collect();
    out.extend(
        managed
            .iter()
            .filter(|n| !hosts.contains_key(*n) && settings.contains_key(*n))
            .map(|n| Change::Remove(n.clone())),
    );
    out
}

/// The agent's demand record: what `measured` (this target's demand meter) says of the
/// cluster's `hosts` that have a path here. Only those: the division reads a host left
/// out as an idle one (every version of it), and at fleet size most hosts configured at
/// a target hold their cold share there and send it nothing (at 64 x 10,000 the record
/// listed 10,000 hosts, 0.8 MB an interval, for about 300 on a path). Public so that
/// the lab times it (qos-lab's `agent_cpu`).
pub fn demand_record(
    measured: &BTreeMap<String, PathDemand>,
    hosts: &BTreeMap<String, ClusterHost>,
) -> DemandRecord {
    DemandRecord {
        hosts: joined(measured, hosts)
            .filter(|(_, d, _)| on_path(d))
            .map(|(n, &d, _)| (n.clone(), d))
            .collect(),
    }
}

/// The shares of the cluster's `hosts` the target holds (`settings`), as its member
/// record lists them: in key schema 3 a host holding its cold share here is left out,
/// as in the division's part (`show` prints it as the cold share). Public so that the
/// lab times it.
pub fn member_applied(
    settings: &BTreeMap<String, LocalShare>,
    hosts: &BTreeMap<String, ClusterHost>,
    schema: u32,
) -> BTreeMap<String, LocalShare> {
    let paths_only = parts_list_paths_only(schema);
    joined(settings, hosts)
        .filter(|(_, s, h)| !paths_only || **s != cold_share(h))
        .map(|(n, s, _)| (n.clone(), *s))
        .collect()
}

/// The entries of `a` whose key `b` has too, with `b`'s value, in key order: one walk
/// over both maps side by side. Both hold 1,000 hosts at fleet size, whose names share
/// a long prefix: a lookup in `b` per entry of `a` compared about ten names each.
fn joined<'a, A, B>(
    a: &'a BTreeMap<String, A>,
    b: &'a BTreeMap<String, B>,
) -> impl Iterator<Item = (&'a String, &'a A, &'a B)> {
    let mut b = b.iter().peekable();
    a.iter().filter_map(move |(k, va)| {
        while let Some((kb, _)) = b.peek() {
            match kb.as_str().cmp(k.as_str()) {
                std::cmp::Ordering::Less => {
                    b.next();
                }
                std::cmp::Ordering::Equal => {
                    let (_, vb) = b.next()?;
                    return Some((k, va, vb));
                }
                std::cmp::Ordering::Greater => return None,
            }
        }
        None
    })
}

/// The agent's store during an interval: renews the agent's lease before a call
/// whenever a third of its time to live has passed since it was last renewed, and
/// between the shares applied ([`Agent::apply`]). An interval at fleet size can outlast
/// the lease: set one at a time, a target's RPC took a connection and a poll of its RPC
/// server per call (about 10 ms at a real `nvmf_tgt`), so setting 1,000 hosts took about
/// 10 s (sent [`SETS_AT_ONCE`] at a time over one connection now: about 0.15 s); the
/// leader's division was a put per target's part (64 of 83 KB at 64 x 1,000), seconds
/// when etcd is busy (a few transactions now). An agent that renewed once an interval
/// lost its lease meanwhile: its member and demand records went, and the leader key
/// with them, to another target (the agent at scale's first real runs, 2026-11-29).
struct Renewing<'a> {
    inner: &'a mut dyn Store,
    lease: LeaseId,
    every: std::time::Duration,
    renewed: std::time::Instant,
    /// etcd no longer knows the lease: the next interval grants a new one.
    lapsed: bool,
    errors: Vec<String>,
}

impl Renewing<'_> {
    fn renew_if_due(&mut self) {
        if self.lapsed || self.renewed.elapsed() < self.every {
            return;
        }
        match self.inner.keep_alive(self.lease) {
            Ok(true) => {}
            Ok(false) => {
                self.lapsed = true;
                self.errors
                    .push("the lease expired during the interval".into());
            }
            // Tried again a third of the time to live later.
            Err(e) => self.errors.push(e.to_string()),
        }
        self.renewed = std::time::Instant::now();
    }
}

impl Store for Renewing<'_> {
    fn grant(&mut self, ttl_s: u64) -> Result<LeaseId, StoreError> {
        self.inner.grant(ttl_s)
    }
    fn keep_alive(&mut self, lease: LeaseId) -> Result<bool, StoreError> {
        self.inner.keep_alive(lease)
    }
    fn revoke(&mut self, lease: LeaseId) -> Result<(), StoreError> {
        self.inner.revoke(lease)
    }
    fn put(&mut self, key: &str, value: &str, lease: Option<LeaseId>) -> Result<(), StoreError> {
        self.renew_if_due();
        self.inner.put(key, value, lease)
    }
    fn put_all(&mut self, puts: &[(String, String)]) -> Result<(), StoreError> {
        self.renew_if_due();
        self.inner.put_all(puts)
    }
    fn create(&mut self, key: &str, value: &str, lease: LeaseId) -> Result<bool, StoreError> {
        self.renew_if_due();
        self.inner.create(key, value, lease)
    }
    fn claim(&mut self, key: &str, value: &str, lease: LeaseId) -> Result<bool, StoreError> {
        self.renew_if_due();
        self.inner.claim(key, value, lease)
    }
    fn list(&mut self, prefix: &str) -> Result<Vec<(String, String)>, StoreError> {
        self.renew_if_due();
        self.inner.list(prefix)
    }
    fn get(&mut self, key: &str) -> Result<Option<String>, StoreError> {
        self.renew_if_due();
        self.inner.get(key)
    }
    fn delete_prefix(&mut self, prefix: &str) -> Result<(), StoreError> {
        self.renew_if_due();
        self.inner.delete_prefix(prefix)
    }
    fn delete(&mut self, key: &str) -> Result<(), StoreError> {
        self.renew_if_due();
        self.inner.delete(key)
    }
}

impl Agent {
    pub fn new(cfg: AgentConfig) -> Agent {
        let keys = Keys::new(&cfg.cluster);
        let handover = Handover::new(&cfg.target);
        Agent {
            cfg,
            keys,
            lease: None,
            leading: false,
            written: None,
            managed: BTreeSet::new(),
            last_refusal: None,
            meter: DemandMeter::default(),
            handover,
            peer_urls: BTreeMap::new(),
            contracts: Arc::default(),
            divide: DivideConfig::default(),
            parts: Vec::new(),
            read: LeaderReads::default(),
        }
    }

    /// What this agent publishes to its peers (`GET /handover`).
    pub fn handover_report(&self) -> HandoverReport {
        self.handover.report()
    }

    pub fn config(&self) -> &AgentConfig {
        &self.cfg
    }

    /// The agent holds a lease (granted or renewed by its last successful interval;
    /// etcd may have let it expire since).
    pub fn holds_lease(&self) -> bool {
        self.lease.is_some()
    }

    /// One interval, at `now_ms` (any monotonic clock in milliseconds); `peers` is read
    /// only while etcd is away.
    pub fn tick(
        &mut self,
        now_ms: u64,
        store: &mut dyn Store,
        tgt: &mut dyn TargetRpc,
        peers: &mut dyn Peers,
    ) -> TickReport {
        let mut r = TickReport::default();
        let mut clock = Clock::start();
        let local = tgt.read(&self.cfg.domain);
        clock.lap(&mut r, "target");
        let local = match local {
            Ok(l) => l,
            Err(e) => {
                // Not renewing the lease is how a dead target leaves the cluster. etcd
                // is only asked whether it answers, so that the agent's etcd metric
                // says what etcd does, not what the target does.
                r.errors.push(e.to_string());
                match store.get(&self.keys.config()) {
                    Ok(_) => r.etcd_reachable = true,
                    Err(e) => r.errors.push(e.to_string()),
                }
                return r;
            }
        };
        r.target_ok = true;
        let window = self.cfg.window_ms.unwrap_or(local.period_ms).max(1);
        let mut demand = self.meter.observe(now_ms, &local.counters, window);
        crate::demand::held_near_a_limit(&mut demand, &local.settings);
        self.handover.observe(&demand);
        match self.sync(store, tgt, &local, &demand, &mut clock, &mut r) {
            Ok(()) => {
                r.etcd_ok = true;
                r.etcd_reachable = true;
            }
            Err(e) => {
                r.errors.push(e.to_string());
                // A leader that lost etcd waits an interval when it is back, then
                // writes a new division, even an equal one: it starts the trade books
                // over.
                self.leading = false;
                self.written = None;
                self.trade(&demand, &local, tgt, peers, &mut r);
            }
        }
        r
    }

    /// With etcd away: reads the peers' reports, releases and takes, and applies the
    /// shares exactly (a lowered share must be in force before its release is
    /// published). Nothing before the agent read a division.
    fn trade(
        &mut self,
        demand: &BTreeMap<String, PathDemand>,
        local: &LocalState,
        tgt: &mut dyn TargetRpc,
        peers: &mut dyn Peers,
        r: &mut TickReport,
    ) {
        if self.handover.seq().is_none() || self.cfg.handover_url.is_none() {
            return;
        }
        let mut reports = Vec::new();
        for (t, url) in &self.peer_urls {
            if *t == self.cfg.target {
                continue;
            }
            match peers.fetch(url) {
                Ok(rep) if rep.target == *t => reports.push(rep),
                Ok(rep) => r.errors.push(format!(
                    "the handover report at {url} is {}'s, not {t}'s: ignored",
                    rep.target
                )),
                Err(e) => r.errors.push(format!("peer {t}: {e}")),
            }
        }
        r.peers_read = reports.len();
        // Read a division the peers did not (etcd went away between the leader's write
        // and their read): go back to the one before, which they all trade on. The
        // targets then hold one division again (this target its part of the older
        // one, applied exactly below), which is what the bound needs; the division
        // after etcd's return takes over from there.
        if let [(older, part), (newer, _)] = self.parts.as_slice()
            && self.handover.seq() == Some(*newer)
            && !reports.is_empty()
            && reports.iter().all(|p| p.seq == Some(*older))
        {
            self.handover.rebase(*older, part);
        }
        r.peers_other_division = reports
            .iter()
            .filter(|p| p.seq != self.handover.seq())
            .count();
        let cfg = HandoverConfig {
            headroom_milli: self.divide.headroom_milli,
            ..HandoverConfig::default()
        };
        let step = self.handover.step(demand, &reports, &self.contracts, &cfg);
        let mut applied = BTreeSet::new();
        for (nqn, want) in &step.shares {
            if local.settings.get(nqn) == Some(want) {
                applied.insert(nqn.clone());
                continue;
            }
            let c = Change::Set(nqn.clone(), *want);
            match set_share(tgt, &self.cfg.domain, nqn, want, local.settings.get(nqn)) {
                Ok(()) => {
                    applied.insert(nqn.clone());
                    r.set += 1;
                    r.traded += 1;
                }
                Err((e, fallback)) => {
                    // With the fallback in force the take is booked: the target holds
                    // less reservation than the book says, never more.
                    if fallback {
                        applied.insert(nqn.clone());
                        r.set += 1;
                        r.traded += 1;
                    }
                    r.refused
                        .insert(nqn.clone(), refusal_text(&c, &e, fallback));
                }
            }
        }
        self.handover.commit(&step, |n| applied.contains(n));
    }

    /// Leaves the cluster at once (on SIGTERM): the lease goes, and with it this
    /// target's member and demand keys and, if held, the leadership.
    pub fn leave(&mut self, store: &mut dyn Store) -> Result<(), StoreError> {
        match self.lease.take() {
            Some(l) => store.revoke(l),
            None => Ok(()),
        }
    }

    fn ensure_lease(&mut self, store: &mut dyn Store) -> Result<LeaseId, StoreError> {
        if let Some(l) = self.lease {
            if store.keep_alive(l)? {
                return Ok(l);
            }
            self.lease = None;
        }
        let l = store.grant(self.cfg.lease_ttl_s)?;
        self.lease = Some(l);
        Ok(l)
    }

    fn sync(
        &mut self,
        store: &mut dyn Store,
        tgt: &mut dyn TargetRpc,
        local: &LocalState,
        measured: &BTreeMap<String, PathDemand>,
        clock: &mut Clock,
        r: &mut TickReport,
    ) -> Result<(), StoreError> {
        let lease = self.ensure_lease(store)?;
        let mut renewing = Renewing {
            inner: store,
            lease,
            every: std::time::Duration::from_millis(self.cfg.lease_ttl_s.max(1) * 1000 / 3),
            renewed: std::time::Instant::now(),
            lapsed: false,
            errors: Vec::new(),
        };
        let res = self.sync_renewing(&mut renewing, tgt, local, measured, clock, r);
        r.errors.append(&mut renewing.errors);
        res
    }

    fn sync_renewing(
        &mut self,
        store: &mut Renewing,
        tgt: &mut dyn TargetRpc,
        local: &LocalState,
        measured: &BTreeMap<String, PathDemand>,
        clock: &mut Clock,
        r: &mut TickReport,
    ) -> Result<(), StoreError> {
        let lease = store.lease;
        let Some(cfg_text) = store.get(&self.keys.config())? else {
            r.errors.push(format!(
                "cluster {} does not exist in etcd: create it with `nvmf-qos-agent cluster create`",
                self.cfg.cluster
            ));
            return Ok(());
        };
        let cluster = match ClusterRecord::read(&self.keys.config(), &cfg_text) {
            Ok(c) => c,
            Err(e) => {
                r.errors.push(e);
                return Ok(());
            }
        };
        let hosts = Arc::new(hosts_of(
            &self.keys,
            store.list(&self.keys.hosts())?,
            &mut r.errors,
        ));
        r.contracts = Arc::clone(&hosts);

        // Only the hosts on a path here ([`demand_record`] says why).
        let demand = demand_record(measured, &hosts);
        let member = MemberRecord {
            target: self.cfg.target.clone(),
            domain: self.cfg.domain.clone(),
            capacity_iops: local.capacity_iops,
            period_ms: local.period_ms,
            applied: member_applied(&local.settings, &hosts, cluster.schema),
            error: self.last_refusal.clone(),
            handover_url: self.cfg.handover_url.clone(),
        };
        // The target's name is this agent's while its member record is under its lease.
        // A second agent started with the same `--target` would otherwise report,
        // lead and apply the same part at another target: the hosts' shares there
        // would add up to more than their contracts.
        let member_key = self.keys.member(&self.cfg.target);
        if !store.claim(&member_key, &json(&member), lease)? {
            r.errors.push(format!(
                "target name {} is taken: {member_key} is under another agent's lease; this \
                 agent writes nothing and applies no division (its target keeps its shares) \
                 until that lease ends. Give each target's agent its own --target",
                self.cfg.target
            ));
            r.name_taken = true;
            self.leading = false;
            self.written = None;
            return Ok(());
        }
        store.put(
            &self.keys.demand(&self.cfg.target),
            &json(&demand),
            Some(lease),
        )?;

        store.create(&self.keys.leader(), &self.cfg.target, lease)?;
        let leads = store.get(&self.keys.leader())?.as_deref() == Some(self.cfg.target.as_str());
        clock.lap(r, "report");
        if leads {
            r.leader = true;
            // A new leader divides from its second interval on: the live targets whose
            // leases expired while etcd was away re-join in this one, and a division
            // over the first to come back would give it every host's whole contract.
            if self.leading {
                self.lead(store, &cluster, &hosts, clock, r)?;
            }
            self.leading = true;
        } else {
            self.leading = false;
            self.written = None;
        }

        clock.lap(r, "lead");
        let shares = division::read(
            store,
            &self.keys,
            cluster.schema,
            &self.cfg.target,
            &mut r.errors,
        )?;
        clock.lap(r, "division");
        let Some(shares) = shares else {
            return Ok(());
        };
        // A part of key schema 3 lists the hosts with a path at this target: every
        // other host holds its cold share here (a host added since the division, too).
        let mine = shares.mine.map(|m| {
            Arc::new(if parts_list_paths_only(cluster.schema) {
                with_cold_shares(&m, &hosts)
            } else {
                m
            })
        });
        self.peer_urls = shares.peers;
        self.contracts = Arc::clone(&hosts);
        self.divide = cluster.divide;
        // What this target traded while etcd was away stands until the next division
        // (made from the demand the traded shares let through): no jump back.
        let book;
        let mine = match &mine {
            Some(m) => {
                r.shares_seq = Some(shares.seq);
                r.shares = Arc::clone(m);
                if self.parts.last().is_none_or(|(seq, _)| *seq != shares.seq) {
                    self.parts.push((shares.seq, Arc::clone(m)));
                    if self.parts.len() > 2 {
                        self.parts.remove(0);
                    }
                }
                self.handover.rebase(shares.seq, m);
                if self.handover.traded() {
                    book = self.handover.shares(&hosts);
                    Some(&book)
                } else {
                    Some(&**m)
                }
            }
            None => None,
        };
        self.apply(
            reconcile(mine, &hosts, &local.settings, &self.managed),
            &local.settings,
            tgt,
            Some(store),
            r,
        );
        clock.lap(r, "apply");
        Ok(())
    }

    fn lead(
        &mut self,
        store: &mut dyn Store,
        cluster: &ClusterRecord,
        hosts: &BTreeMap<String, ClusterHost>,
        clock: &mut Clock,
        r: &mut TickReport,
    ) -> Result<(), StoreError> {
        let (members, peers) = self
            .read
            .members(store.list(&self.keys.members())?, &self.keys);
        let demand = self
            .read
            .demand(store.list(&self.keys.demands())?, &self.keys, r);
        clock.lap(r, "listed");
        let (mut p, wall, cpu) =
            crate::cpu::timed(|| plan(hosts, &members, demand, &cluster.divide));
        (r.division_time, r.division_cpu) = (Some(wall), cpu);
        if !parts_list_paths_only(cluster.schema) {
            // Agents of schemas 1 and 2 take a host left out of their part as nothing
            // to change: every part lists every host.
            for part in p.values_mut() {
                *part = with_cold_shares(part, hosts);
            }
        }
        clock.lap(r, "plan");
        if let Some(w) = &self.written
            && w.members == members
            && !plan_moves(&w.plan, &p)
            && w.peers == peers
        {
            return Ok(());
        }
        let (w, count) = division::write(
            store,
            &self.keys,
            cluster.schema,
            &self.cfg.target,
            self.written.as_ref(),
            members,
            p,
            peers,
        )?;
        r.division_written = Some(count);
        self.written = Some(w);
        Ok(())
    }

    /// Applies `changes` at the target, one `qos_host_set` or `qos_host_remove` each,
    /// the sets up to [`SETS_AT_ONCE`] at a time, renewing the lease between them when
    /// it is due (see [`Renewing`]).
    fn apply(
        &mut self,
        changes: Vec<Change>,
        settings: &BTreeMap<String, LocalShare>,
        tgt: &mut dyn TargetRpc,
        mut renew: Option<&mut Renewing>,
        r: &mut TickReport,
    ) {
        let mut rest = changes.as_slice();
        while let Some(c) = rest.first() {
            if let Some(store) = renew.as_mut() {
                store.renew_if_due();
            }
            let sets: Vec<(String, LocalShare)> = rest
                .iter()
                .take(SETS_AT_ONCE)
                .map_while(|c| match c {
                    Change::Set(nqn, s) => Some((nqn.clone(), *s)),
                    Change::Remove(_) => None,
                })
                .collect();
            if sets.is_empty() {
                let Change::Remove(nqn) = c else {
                    unreachable!("a set starts a run")
                };
                match tgt.host_remove(&self.cfg.domain, nqn) {
                    Ok(()) => {
                        self.managed.remove(nqn);
                        r.removed += 1;
                    }
                    Err(e) => {
                        r.refused.insert(nqn.clone(), refusal_text(c, &e, false));
                    }
                }
                rest = &rest[1..];
                continue;
            }
            let answers = tgt.host_set_many(&self.cfg.domain, &sets);
            for ((nqn, s), res) in sets.iter().zip(answers) {
                let res = after_set(tgt, &self.cfg.domain, nqn, s, settings.get(nqn), res);
                if matches!(res, Ok(()) | Err((_, true))) {
                    self.managed.insert(nqn.clone());
                    r.set += 1;
                }
                if let Err((e, fallback)) = res {
                    let c = Change::Set(nqn.clone(), *s);
                    r.refused
                        .insert(nqn.clone(), refusal_text(&c, &e, fallback));
                }
            }
            rest = &rest[sets.len()..];
        }
        // Published in this target's member record (`show` prints it), one line a host.
        self.last_refusal = (!r.refused.is_empty())
            .then(|| r.refused.values().cloned().collect::<Vec<_>>().join("\n"));
    }
}

/// How often a refusal that lasts is logged again.
pub const REFUSAL_LOG_EVERY: std::time::Duration = std::time::Duration::from_secs(60);

/// What to log about refused shares: each refusal when it starts, once a
/// [`REFUSAL_LOG_EVERY`] while it lasts (the agent retries at every interval: logging
/// each would be 4-8 lines a second), and its end.
#[derive(Debug, Default)]
pub struct RefusalLog {
    /// Per host: when it was last logged, and the refusals since.
    open: BTreeMap<String, (std::time::Instant, u64)>,
}

/// A line for the log: a warning, or news that something cleared.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LogLine {
    Warn(String),
    Info(String),
}

impl RefusalLog {
    /// The lines to log after interval `r`, at `now`.
    pub fn note(&mut self, r: &TickReport, now: std::time::Instant) -> Vec<LogLine> {
        let mut out = Vec::new();
        for (nqn, why) in &r.refused {
            match self.open.get_mut(nqn) {
                None => {
                    out.push(LogLine::Warn(format!(
                        "the target refused the {why}; retrying every interval (logged again every {} s while it lasts)",
                        REFUSAL_LOG_EVERY.as_secs()
                    )));
                    self.open.insert(nqn.clone(), (now, 0));
                }
                Some((at, n)) => {
                    *n += 1;
                    if now.saturating_duration_since(*at) >= REFUSAL_LOG_EVERY {
                        out.push(LogLine::Warn(format!(
                            "still refused ({n} more times in {} s): {why}",
                            now.saturating_duration_since(*at).as_secs()
                        )));
                        *at = now;
                        *n = 0;
                    }
                }
            }
        }
        // Only an interval that got to applying shares says a refusal ended.
        if r.target_ok && r.etcd_ok {
            self.open.retain(|nqn, _| {
                let open = r.refused.contains_key(nqn);
                if !open {
                    out.push(LogLine::Info(format!(
                        "the target no longer refuses the share of {nqn}"
                    )));
                }
                open
            });
        }
        out
    }
}

fn json<T: serde::Serialize>(v: &T) -> String {
    serde_json::to_string(v).expect("records serialise")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::hooked::{Call, Hooked};

    fn share(r: u64, l: Option<u64>) -> LocalShare {
        LocalShare {
            reservation_iops: r,
            limit_iops: l,
            weight: 1,
            ..Default::default()
        }
    }

    fn host() -> ClusterHost {
        ClusterHost {
            reservation_iops: 100,
            limit_iops: Some(200),
            weight: 1,
            ..Default::default()
        }
    }

    #[test]
    fn the_leader_reads_what_it_parsed_before_only_when_the_text_is_the_same() {
        let keys = Keys::new("c");
        let member = |t: &str, url: Option<&str>| {
            let m = MemberRecord {
                target: t.into(),
                domain: "d".into(),
                capacity_iops: 1000,
                period_ms: 500,
                applied: BTreeMap::new(),
                error: None,
                handover_url: url.map(String::from),
            };
            (keys.member(t), json(&m))
        };
        let demand = |t: &str, served: u64| {
            let d = DemandRecord {
                hosts: BTreeMap::from([(
                    "h".to_string(),
                    PathDemand {
                        served,
                        ..Default::default()
                    },
                )]),
            };
            (keys.demand(t), json(&d))
        };
        let garbled = |t: &str| (keys.demand(t), "{\"hosts\":".to_string());
        // The listings of four intervals: unchanged, changed, gone, back, unreadable.
        let intervals = [
            (
                vec![member("a", Some("http://a")), member("b", None)],
                vec![demand("a", 10), demand("b", 20)],
            ),
            (
                vec![member("a", Some("http://a")), member("b", Some("http://b"))],
                vec![demand("a", 10), demand("b", 30)],
            ),
            (
                vec![member("b", Some("http://b"))],
                vec![demand("b", 30), garbled("c")],
            ),
            (
                vec![member("a", None), member("b", Some("http://b"))],
                vec![demand("a", 10), demand("b", 30), garbled("c")],
            ),
        ];
        let mut kept = LeaderReads::default();
        let mut parsed = Vec::new();
        for (members, demands) in intervals {
            let mut fresh = LeaderReads::default();
            let (mut r1, mut r2) = (TickReport::default(), TickReport::default());
            assert_eq!(
                kept.members(members.clone(), &keys),
                fresh.members(members, &keys)
            );
            assert_eq!(
                kept.demand(demands.clone(), &keys, &mut r1),
                fresh.demand(demands, &keys, &mut r2)
            );
            assert_eq!(r1.errors, r2.errors);
            parsed.push(kept.parsed);
        }
        // Parsed: 4; then b's member and demand records; c's new one; a's two records
        // again (c's, unchanged, not: its error is named again all the same).
        assert_eq!(parsed, vec![4, 6, 7, 9]);
    }

    #[test]
    fn the_records_filters_walk_both_maps_as_lookups_would() {
        // Hosts at the target, in the cluster, or both, interleaved in key order.
        let hosts: BTreeMap<String, ClusterHost> = ["a", "c", "d", "f", "h"]
            .into_iter()
            .map(|n| (n.to_string(), host()))
            .collect();
        let measured: BTreeMap<String, PathDemand> = ["b", "c", "d", "e", "h", "i"]
            .into_iter()
            .enumerate()
            .map(|(i, n)| {
                let d = PathDemand {
                    served: (i as u64 % 3) * 10,
                    ..Default::default()
                };
                (n.to_string(), d)
            })
            .collect();
        let want: BTreeMap<String, PathDemand> = measured
            .iter()
            .filter(|(n, d)| hosts.contains_key(*n) && on_path(d))
            .map(|(n, &d)| (n.clone(), d))
            .collect();
        assert_eq!(demand_record(&measured, &hosts).hosts, want);
        let settings: BTreeMap<String, LocalShare> = ["0", "a", "b", "d", "h", "z"]
            .into_iter()
            .enumerate()
            .map(|(i, n)| {
                let s = if i % 2 == 0 {
                    cold_share(&host())
                } else {
                    share(50, Some(100))
                };
                (n.to_string(), s)
            })
            .collect();
        for schema in [crate::keys::KEY_SCHEMA, 1] {
            let want: BTreeMap<String, LocalShare> = settings
                .iter()
                .filter(|(n, s)| {
                    hosts
                        .get(*n)
                        .is_some_and(|h| !parts_list_paths_only(schema) || **s != cold_share(h))
                })
                .map(|(n, s)| (n.clone(), *s))
                .collect();
            assert_eq!(
                member_applied(&settings, &hosts, schema),
                want,
                "schema {schema}"
            );
        }
        assert!(!want.is_empty());
    }

    /// A target whose admission control refuses a reservation above `admits`.
    struct Admitting {
        admits: u64,
        settings: BTreeMap<String, LocalShare>,
    }

    impl TargetRpc for Admitting {
        fn read(&mut self, _: &str) -> Result<LocalState, TargetError> {
            unreachable!("not read in this test")
        }
        fn host_set(&mut self, _: &str, nqn: &str, s: &LocalShare) -> Result<(), TargetError> {
            if s.reservation_iops > self.admits {
                return Err(TargetError::Refused {
                    method: "qos_host_set".into(),
                    code: -28,
                    message: "admission refused".into(),
                });
            }
            self.settings.insert(nqn.into(), *s);
            Ok(())
        }
        fn host_remove(&mut self, _: &str, nqn: &str) -> Result<(), TargetError> {
            self.settings.remove(nqn);
            Ok(())
        }
    }

    #[test]
    fn a_refused_reservation_raise_still_applies_the_new_limit() {
        let have = BTreeMap::from([("h".to_string(), share(100, Some(300)))]);
        let mut tgt = Admitting {
            admits: 150,
            settings: have.clone(),
        };
        let mut agent = Agent::new(AgentConfig {
            cluster: "c".into(),
            target: "t".into(),
            domain: "d".into(),
            lease_ttl_s: 2,
            window_ms: None,
            handover_url: None,
        });
        let mut r = TickReport::default();
        let raise = vec![Change::Set("h".into(), share(200, Some(500)))];
        agent.apply(raise, &have, &mut tgt, None, &mut r);
        assert_eq!(tgt.settings["h"], share(100, Some(500)), "limit applied");
        assert!(r.refused["h"].contains("reservation held before"), "{r:?}");
        assert!(agent.managed.contains("h"));
        // A refused change that raises no reservation is not retried.
        tgt.admits = 0;
        let mut r = TickReport::default();
        let lower = vec![Change::Set("h".into(), share(50, Some(400)))];
        agent.apply(lower, &tgt.settings.clone(), &mut tgt, None, &mut r);
        assert_eq!(tgt.settings["h"], share(100, Some(500)), "nothing applied");
        assert!(!r.refused["h"].contains("reservation held before"));
    }

    /// A target that takes `each` per `qos_host_set`, as a real one takes ~10 ms.
    struct Slow {
        each: std::time::Duration,
        sets: u64,
    }

    impl TargetRpc for Slow {
        fn read(&mut self, _: &str) -> Result<LocalState, TargetError> {
            unreachable!("not read in this test")
        }
        fn host_set(&mut self, _: &str, _: &str, _: &LocalShare) -> Result<(), TargetError> {
            std::thread::sleep(self.each);
            self.sets += 1;
            Ok(())
        }
        fn host_remove(&mut self, _: &str, _: &str) -> Result<(), TargetError> {
            unreachable!("nothing removed in this test")
        }
    }

    /// A [`MemStore`] that counts the renewals of its leases (in its state).
    fn renewals() -> Hooked<u64> {
        Hooked::new(0, |renewed, _, call| {
            *renewed += matches!(call, Call::KeepAlive) as u64;
            Ok(())
        })
    }

    #[test]
    fn a_long_apply_renews_the_lease_every_third_of_its_time_to_live() {
        let mut agent = Agent::new(AgentConfig {
            cluster: "c".into(),
            target: "t".into(),
            domain: "d".into(),
            lease_ttl_s: 1,
            window_ms: None,
            handover_url: None,
        });
        let mut store = renewals();
        let lease = agent.ensure_lease(&mut store).unwrap();
        // 300 sets of 3 ms: at least 0.9 s, where the lease lives 1 s.
        let mut tgt = Slow {
            each: std::time::Duration::from_millis(3),
            sets: 0,
        };
        let changes: Vec<Change> = (0..300)
            .map(|i| Change::Set(format!("h{i}"), share(1, Some(2))))
            .collect();
        let started = std::time::Instant::now();
        let mut renewing = Renewing {
            inner: &mut store,
            lease,
            every: std::time::Duration::from_millis(333),
            renewed: started,
            lapsed: false,
            errors: Vec::new(),
        };
        let mut r = TickReport::default();
        agent.apply(
            changes,
            &BTreeMap::new(),
            &mut tgt,
            Some(&mut renewing),
            &mut r,
        );
        assert!(renewing.errors.is_empty(), "{:?}", renewing.errors);
        let took = started.elapsed();
        assert_eq!((tgt.sets, r.set), (300, 300));
        // Once each 333 ms that passed (the first at 333 ms), never more.
        let most = took.as_millis() as u64 / 333;
        assert!(
            store.state >= 2 && store.state <= most,
            "{} renewals in {took:?}",
            store.state
        );
    }

    #[test]
    fn the_interval_s_calls_renew_the_lease_when_due_and_a_lapsed_one_is_left() {
        let mut store = renewals();
        let lease = store.grant(1).unwrap();
        let mut renewing = Renewing {
            inner: &mut store,
            lease,
            every: std::time::Duration::from_secs(3600),
            renewed: std::time::Instant::now(),
            lapsed: false,
            errors: Vec::new(),
        };
        // Not due: the put renews nothing; one renewal by hand.
        renewing.put("k", "v", Some(lease)).unwrap();
        assert!(renewing.inner.keep_alive(lease).unwrap());
        // Due at every call from now on.
        renewing.every = std::time::Duration::ZERO;
        renewing.put("k", "v", Some(lease)).unwrap();
        renewing.list("k").unwrap();
        assert!(renewing.errors.is_empty());
        renewing.inner.revoke(lease).unwrap();
        renewing.get("k").unwrap();
        renewing.get("k").unwrap();
        assert!(renewing.lapsed);
        assert_eq!(renewing.errors.len(), 1, "{:?}", renewing.errors);
        // 1 by hand, 2 due, 1 that found the lease gone, none after.
        assert_eq!(store.state, 4);
    }

    #[test]
    fn a_division_that_moves_no_share_as_much_as_an_agent_applies_is_not_written() {
        let of = |r: u64, l: u64| -> Plan {
            BTreeMap::from([(
                "t".to_string(),
                BTreeMap::from([("h".to_string(), share(r, Some(l)))]),
            )])
        };
        let written = of(1000, 2000);
        assert!(!plan_moves(&written, &of(1001, 2010)), "a rate's noise");
        assert!(
            plan_moves(&written, &of(1100, 2000)),
            "a reservation up 10 %"
        );
        assert!(plan_moves(&written, &of(1000, 1980)), "a limit down 1 %");
        let mut more = of(1000, 2000);
        more.get_mut("t")
            .unwrap()
            .insert("g".into(), share(1, Some(1)));
        assert!(plan_moves(&written, &more), "a new host");
        let mut other = of(1000, 2000);
        other.insert("u".into(), BTreeMap::new());
        assert!(plan_moves(&written, &other), "a new target");
    }

    #[test]
    fn small_moves_are_not_applied_and_large_ones_are() {
        let hosts = BTreeMap::from([("h".to_string(), host())]);
        let have = BTreeMap::from([("h".to_string(), share(1000, Some(2000)))]);
        let moves = |r: u64, l: Option<u64>| {
            let mine = BTreeMap::from([("h".to_string(), share(r, l))]);
            reconcile(Some(&mine), &hosts, &have, &BTreeSet::new()).len()
        };
        assert_eq!(
            moves(1020, Some(2000)),
            1,
            "reservation +2 %: applied at once"
        );
        assert_eq!(moves(1004, Some(2000)), 0, "reservation +0.4 %");
        assert_eq!(moves(980, Some(2000)), 0, "reservation -2 %");
        assert_eq!(moves(960, Some(2000)), 1, "reservation -4 %");
        assert_eq!(moves(1000, Some(2040)), 0, "limit +2 %");
        assert_eq!(moves(1000, Some(1980)), 1, "limit -1 %: applied at once");
        assert_eq!(moves(1000, Some(1995)), 0, "limit -0.25 %");
        assert_eq!(moves(1000, None), 1, "limit gone");
    }

    #[test]
    fn a_target_outside_the_division_keeps_what_it_has() {
        let hosts = BTreeMap::new();
        let have = BTreeMap::from([("h".to_string(), share(1000, None))]);
        let managed = BTreeSet::from(["h".to_string()]);
        assert!(reconcile(None, &hosts, &have, &managed).is_empty());
        // In the division, a managed host that left the cluster is given back.
        let mine = BTreeMap::new();
        assert_eq!(
            reconcile(Some(&mine), &hosts, &have, &managed),
            vec![Change::Remove("h".into())]
        );
        // A host the operator set by hand is not the agent's to remove.
        assert!(reconcile(Some(&mine), &hosts, &have, &BTreeSet::new()).is_empty());
    }

    #[test]
    fn a_refusal_reads_as_the_share_and_is_logged_once_a_minute() {
        let c = Change::Set("h1".into(), share(300, Some(600)));
        assert_eq!(
            c.describe(),
            "share of h1 (reservation 300 IOPS, limit 600 IOPS, weight 1)"
        );
        assert_eq!(
            Change::Set("h1".into(), share(0, None)).describe(),
            "share of h1 (reservation 0 IOPS, no limit, weight 1)"
        );
        let mut log = RefusalLog::default();
        let t0 = std::time::Instant::now();
        let r = TickReport {
            target_ok: true,
            etcd_ok: true,
            refused: BTreeMap::from([("h1".to_string(), format!("{}: ENOSPC", c.describe()))]),
            ..Default::default()
        };
        let first = log.note(&r, t0);
        assert!(
            matches!(&first[..], [LogLine::Warn(l)] if l.contains("refused the share of h1 (reservation 300 IOPS")),
            "{first:?}"
        );
        // Eight intervals a second for 59 s: nothing more.
        for i in 1..(59 * 8) {
            let t = t0 + std::time::Duration::from_millis(125 * i);
            assert!(log.note(&r, t).is_empty());
        }
        let again = log.note(&r, t0 + REFUSAL_LOG_EVERY);
        assert!(
            matches!(&again[..], [LogLine::Warn(l)] if l.starts_with("still refused (472 more times in 60 s)")),
            "{again:?}"
        );
        // A target that cannot be read says nothing about the refusal.
        let down = TickReport::default();
        assert!(log.note(&down, t0 + REFUSAL_LOG_EVERY).is_empty());
        let ok = TickReport {
            target_ok: true,
            etcd_ok: true,
            ..Default::default()
        };
        assert_eq!(
            log.note(&ok, t0 + REFUSAL_LOG_EVERY),
            vec![LogLine::Info(
                "the target no longer refuses the share of h1".into()
            )]
        );
    }
}
