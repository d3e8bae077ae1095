//! The target's token ledger, shared by the poll-group threads that carry one domain's
//! I/O. Three owners:
//!
//! - [`DomainShared`]: the global pool (per resource) and the period clock, read by all.
//! - [`HostShared`]: one host's reservation pools, its credit (global tokens already
//!   granted to it), its limit allowances, and its counters. Written by its channels
//!   with atomics; re-armed by the monitor at every period roll-over.
//! - [`ChannelTokens`]: one host on one thread. The per-I/O decision runs here on plain
//!   integers: tokens and limit allowance are fetched from the shared pools in batches
//!   (Haechi's batched fetch-and-add), so a thread touches shared cache lines once per
//!   batch, not once per I/O.
//!
//! Every pool word carries the period it belongs to ([`TokenPool`]), so a token can
//! never cross a period boundary unseen; tokens cached by a channel when its period ends
//! are counted as expired. A host's pools have a slot per period parity
//! ([`EpochPool`]): the monitor arms the next period's slots during the period, so the
//! roll-over publishes the new epoch without retagging every pool. The identity checked
//! by the tests is `issued = in pools + in caches + consumed + expired`.

use crate::config::{BudgetClass, UNLIMITED};
use crate::cost::{Amount, CostModel, Direction, IoKind, RES, Resource};
use crate::histogram::{HeldTime, HeldTimeSnapshot, SharedHeldTime};
use crate::sync::{Arc, AtomicU64, CachePadded, EpochPool, Ordering, POOL_MAX, SeqLock, TokenPool};
use crate::time::Nanos;
use crate::window::{HostWindow, Slot, WindowShared};
use crate::wire;

/// Shared state of a domain: one per domain, behind an `Arc` held by the monitor and
/// by every channel of its hosts.
///
/// **Who writes, who reads.** The monitor writes (one thread: its check intervals, the
/// period roll-over, configuration changes; the operating-point policy also at its
/// check intervals); every channel, on every poll-group thread, reads. The exceptions
/// are the pools, which channels take from and give back to, and the window's slot
/// count (see [`WindowShared`]).
///
/// **Memory ordering.**
/// - The roll-over publishes a period with one Release store of `epoch`, last, after
///   the global pools are re-armed (`global`), the hosts' pools for the period armed,
///   and `period_start`, `release_burst`, `credit_only`, `global_closed` (0) and the
///   hosts' `lagging` (0) stored. A channel's Acquire load of `epoch`
///   (`ChannelTokens::sync`, `HostShared::current_tag`) pairs with it: a channel that
///   sees the new period finds its tokens armed and its start.
/// - `global_closed`: the monitor stores each lagging host's
///   `HostShared::lagging` (Release) before it closes the pool with its own Release
///   store (or `fetch_or` under `operating_point`); the channel's Acquire load in
///   `global_open_to` pairs with it, then its Acquire load of its host's `lagging`, so
///   a lagging host that finds the pool closed also finds itself lagging.
/// - `period_start`: Release store, Acquire loads (the release schedule): the same
///   pairing as `epoch` for a channel that reads the start without the epoch.
/// - The pools' words ([`TokenPool`]): every take and give is an `AcqRel`
///   compare-and-swap and the roll-over's re-arm an `AcqRel` swap, on the word that
///   also carries the period's tag: a take and a re-arm are ordered by the word itself.
/// - `conversion`, `credit_only`, `pool_paced`, `bypass` are stored with Release but
///   read `Relaxed`: flags read for themselves, which publish nothing else (the Release
///   pairs with no Acquire; a stale read costs one command's decision). Statistics read
///   `global_closed` and `pool_paced` `Relaxed` too.
#[derive(Debug)]
pub struct DomainShared {
    /// What an I/O costs (operations and bytes); fixed for the domain's life.
    pub(crate) cost: CostModel,
    /// 1 when hosts' unused reservations convert to global tokens (Haechi's mode), 0
    /// otherwise.
    pub(crate) conversion: AtomicU64,
    /// Paced release burst in ns; `u64::MAX` when reservations are released at once.
    pub(crate) release_burst: AtomicU64,
    /// The global pool per resource (`[ops, bytes]`, cost units), tagged with its
    /// period: the work nobody reserved, first come or handed out by the policy.
    pub(crate) global: [CachePadded<TokenPool>; 2],
    /// The current period's number (its low 16 bits tag the pools); the roll-over's
    /// publication, stored last.
    pub(crate) epoch: AtomicU64,
    /// When the current period started, ns on the monitor's clock.
    pub(crate) period_start: AtomicU64,
    /// The period's length, ns (set when the domain is made).
    pub(crate) period: AtomicU64,
    /// The period's capacity estimate per resource (`[ops, bytes]`, cost units),
    /// stored at each roll-over (read by nobody at present).
    pub(crate) budget: [AtomicU64; 2],
    /// Bit r is set by the monitor (paced release only) while some backlogged host
    /// lags behind its reservation schedule in resource r: the global pool of r then
    /// closes to every host that is not lagging itself, until the laggards catch up, so
    /// global-token users cannot take their share of the target.
    pub(crate) global_closed: AtomicU64,
    /// Bit r is set while the first-come policy paces the global pool of r for a
    /// lagging reservation (instead of leaving it open): commands held for global
    /// tokens then wait for that reservation (the held-reason statistics).
    pub(crate) pool_paced: AtomicU64,
    /// Bit r is set when global tokens of resource r reach channels only as credit
    /// (the sharing policy's capability, `SharingPolicy::credit_only`): the monitor
    /// moves them into the hosts' credit at every check interval, and no channel takes
    /// them from the global pool itself.
    pub(crate) credit_only: AtomicU64,
    /// 1 while the domain is bypassed (`DomainConfig::bypass`): channels count and
    /// account as usual but hold nothing; a command that would wait goes at once.
    pub(crate) bypass: AtomicU64,
    /// 1 during the open spell of the learner of N\* (`crate::circulation`): what the
    /// contract holds for others (a reservation behind, the pool) goes at once, as
    /// under `bypass`, so the spell measures the target holding nothing; a host's own
    /// limit and burst still hold. Set by the operating-point policy only, cleared when
    /// any policy attaches.
    pub(crate) probe_open: AtomicU64,
    /// Commands in flight at the base against the operating point's window (sharing
    /// `operating_point`; off otherwise). Its own ordering: see [`WindowShared`].
    pub(crate) window: WindowShared,
}

impl DomainShared {
    pub(crate) fn new(cost: CostModel, conversion: bool, period: Nanos) -> Self {
        DomainShared {
            cost,
            conversion: AtomicU64::new(conversion as u64),
            release_burst: AtomicU64::new(u64::MAX),
            global: [
                CachePadded(TokenPool::new(0, 0)),
                CachePadded(TokenPool::new(0, 0)),
            ],
            epoch: AtomicU64::new(0),
            period_start: AtomicU64::new(0),
            period: AtomicU64::new(period.0),
            budget: [AtomicU64::new(0), AtomicU64::new(0)],
            global_closed: AtomicU64::new(0),
            pool_paced: AtomicU64::new(0),
            credit_only: AtomicU64::new(0),
            bypass: AtomicU64::new(0),
            probe_open: AtomicU64::new(0),
            window: WindowShared::default(),
        }
    }

    /// The window of commands in flight (sharing `operating_point`).
    pub fn window(&self) -> &WindowShared {
        &self.window
    }

    /// Whether `host` may take global tokens of resource `r` now: not while another
    /// backlogged host lags behind its reservation schedule (reservations first).
    #[inline]
    pub(crate) fn global_open_to(&self, host: &HostShared, r: usize) -> bool {
        if self.credit_only.load(Ordering::Relaxed) & (1 << r) != 0 {
            return false;
        }
        self.global_closed.load(Ordering::Acquire) & (1 << r) == 0
            || host.lagging.load(Ordering::Acquire) & (1 << r) != 0
    }

    /// Of `per_period` tokens, how many are not released yet at `now` (paced
    /// release: `per_period (t + burst) / T` are out by time t into the period). The
    /// release is continuous, computed from the clock, so no tick releases a burst.
    #[inline]
    pub fn unreleased(&self, per_period: u64, now: Nanos) -> u64 {
        self.unreleased_ahead(per_period, now, true)
    }

    /// Like [`DomainShared::unreleased`], without the burst ahead when `ahead` is false:
    /// `per_period t / T` are out by time t. A limit is released so: released a burst
    /// ahead, a period's allowance is all out one burst before its end, and a host held
    /// at its limit then waits a burst plus the roll-over for the next period's, once a
    /// period (at 100 ms periods, p99 latency at a limit 18 % above SPDK's bdev QoS).
    #[inline]
    pub fn unreleased_ahead(&self, per_period: u64, now: Nanos, ahead: bool) -> u64 {
        let burst = self.release_burst.load(Ordering::Relaxed);
        if burst == u64::MAX || per_period == 0 {
            return 0;
        }
        let start = self.period_start.load(Ordering::Acquire);
        let period = self.period.load(Ordering::Relaxed).max(1);
        let t = now
            .0
            .saturating_sub(start)
            .saturating_add(if ahead { burst } else { 0 })
            .min(period);
        let released = (per_period as u128 * t as u128).div_ceil(period as u128) as u64;
        per_period - released.min(per_period)
    }
    /// Of `per_period` tokens, how many are released over one release burst: what a
    /// limited host may have saved up and not yet taken (`u64::MAX` without paced
    /// release, where a period's limit is all out at its start).
    #[inline]
    pub fn carry(&self, per_period: u64) -> u64 {
        self.carry_over(per_period, 0)
    }

    /// Like [`DomainShared::carry`], plus what is released over `waited` ns: what a
    /// limited host that has had commands waiting that long may have saved up.
    #[inline]
    pub fn carry_over(&self, per_period: u64, waited: u64) -> u64 {
        let burst = self.release_burst.load(Ordering::Relaxed);
        if burst == u64::MAX {
            return u64::MAX;
        }
        let period = self.period.load(Ordering::Relaxed).max(1);
        let span = burst.saturating_add(waited).min(period);
        (per_period as u128 * span as u128).div_ceil(period as u128) as u64
    }

    /// Why a command short of reservation and global tokens of resource `r` waits:
    /// for a share (the policy hands the excess out as credit), for a lagging
    /// reservation (the pool is closed or paced for it), else for the budget.
    #[cold]
    pub(crate) fn tokens_hold_reason(&self, r: usize) -> HoldReason {
        let bit = 1 << r;
        if self.credit_only.load(Ordering::Relaxed) & bit != 0 {
            HoldReason::Share
        } else if (self.global_closed.load(Ordering::Relaxed)
            | self.pool_paced.load(Ordering::Relaxed))
            & bit
            != 0
        {
            HoldReason::Reservation
        } else {
            HoldReason::Budget
        }
    }

    /// Whether the domain is bypassed (holds nothing).
    pub fn bypassed(&self) -> bool {
        self.bypass.load(Ordering::Relaxed) != 0
    }

    /// Global tokens left in the pool now.
    pub fn global_available(&self) -> Amount {
        Amount::new(self.global[0].load().1, self.global[1].load().1)
    }
    pub fn cost_model(&self) -> CostModel {
        self.cost
    }
}

/// A channel's shortage of one limit (ns on the monitor's clock): since when the pool
/// has been short for it, and the instant the first fetch after that succeeded (the
/// fetches of that instant are still owed the span; later ones are not).
#[derive(Debug, Clone, Copy, Default)]
struct LimitShortage {
    since: Option<u64>,
    settled_at: Option<u64>,
}

/// What a channel needs to know about its host, copied out of [`HostShared`] under a
/// sequence lock whenever the host's generation changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct ChannelParams {
    /// One reservation pool for reads and writes together (else one per direction).
    pub(crate) together: bool,
    /// Bit `class * 2 + resource` is set when that limit is enforced.
    pub(crate) limit_mask: u8,
    /// Limit per period and class (total, read, write), cost units.
    pub(crate) limit: [Amount; 3],
    /// How much a channel fetches at once from the host's reservation pool, the
    /// domain's global pool and the host's limit allowance, cost units.
    pub(crate) res_batch: Amount,
    pub(crate) global_batch: Amount,
    pub(crate) limit_batch: Amount,
    /// Capacity per period: no single command is charged more than this.
    pub(crate) capacity: Amount,
    /// Most credit a host may hold (cooperative acquisitions).
    pub(crate) credit_cap: Amount,
    /// Reservation per period and pool (hard plus soft grant).
    pub(crate) pool_res: [Amount; 2],
    /// False for a removed host that carries on best-effort.
    pub(crate) configured: bool,
    /// A burst raised its total limit (a command held at the limit is held at its
    /// burst rate).
    pub(crate) bursting: bool,
}

/// Words of [`ChannelParams`] in its sequence lock.
const PARAM_WORDS: usize = 21;

impl ChannelParams {
    fn to_words(self) -> [u64; PARAM_WORDS] {
        let flags = self.together as u64
            | (self.limit_mask as u64) << 1
            | (self.configured as u64) << 9
            | (self.bursting as u64) << 10;
        let a = |x: Amount| [x.ops, x.bytes];
        let mut w = [0u64; PARAM_WORDS];
        w[0] = flags;
        let pairs = [
            a(self.limit[0]),
            a(self.limit[1]),
            a(self.limit[2]),
            a(self.res_batch),
            a(self.global_batch),
            a(self.limit_batch),
            a(self.capacity),
            a(self.credit_cap),
            a(self.pool_res[0]),
            a(self.pool_res[1]),
        ];
        for (i, p) in pairs.iter().enumerate() {
            w[1 + 2 * i] = p[0];
            w[2 + 2 * i] = p[1];
        }
        w
    }

    fn from_words(w: &[u64; PARAM_WORDS]) -> Self {
        let a = |i: usize| Amount::new(w[1 + 2 * i], w[2 + 2 * i]);
        ChannelParams {
            together: w[0] & 1 == 1,
            limit_mask: ((w[0] >> 1) & 0xff) as u8,
            configured: (w[0] >> 9) & 1 == 1,
            bursting: (w[0] >> 10) & 1 == 1,
            limit: [a(0), a(1), a(2)],
            res_batch: a(3),
            global_batch: a(4),
            limit_batch: a(5),
            capacity: a(6),
            credit_cap: a(7),
            pool_res: [a(8), a(9)],
        }
    }

    #[inline]
    fn pool(&self, dir: Direction) -> usize {
        if self.together { 0 } else { dir as usize }
    }
    #[inline]
    fn limited(&self, class: usize, r: usize) -> bool {
        self.limit_mask & (1 << (class * 2 + r)) != 0
    }
}

/// Shared state of one host: one per host and domain, behind an `Arc` held by the
/// monitor and by the host's channels (one per poll-group thread and QoS bdev).
///
/// **Who writes, who reads.** The monitor writes the parameters (`params`, a sequence
/// lock with the monitor as its only writer), arms the pools for each period, moves
/// credit, and sets `lagging` and the window's step and flags; the host's channels take
/// from and give back to the pools, add to `counters` and `held_time` when they flush,
/// and read everything else. The monitor's statistics read the counters.
///
/// **Memory ordering.**
/// - `params`: [`SeqLock`]'s own pairing (the writer's Release fence and Release store
///   of the generation, the readers' Acquire load and Acquire fence); a channel copies
///   the parameters whenever the generation changed.
/// - The pools (`res`, `credit`, `limit`): `AcqRel` compare-and-swaps on words tagged
///   with their period, as the domain's (see [`DomainShared`]); which slot is current
///   is the domain's `epoch` (Acquire), stored after the slots are armed (Release).
/// - `lagging`: the monitor's Release store (or `fetch_or`) comes before its Release
///   store that closes the domain's global pool; a channel's Acquire loads of the
///   domain's `global_closed` and then of `lagging` pair with them (see
///   [`DomainShared`]).
/// - `counters`: channels add with `AcqRel` read-modify-writes; the monitor loads with
///   Acquire. Each counter is exact by its read-modify-writes alone; the pairing orders
///   nothing else (the monitor reads the counters one by one, so sums across them are
///   exact only when the channels are quiet, as in the audit's tests).
/// - `held_time`: `Relaxed` adds and loads (statistics only).
/// - `window`: `Relaxed`, see [`HostWindow`].
#[derive(Debug)]
pub struct HostShared {
    /// The host's index in its domain (order of arrival).
    pub(crate) id: u32,
    /// The host's NQN.
    pub(crate) nqn: String,
    /// Its domain, whose epoch says which slot of each pool is the current period's.
    domain: Arc<DomainShared>,
    /// What a channel needs of the host's configuration ([`ChannelParams`] as words),
    /// written by the monitor.
    params: CachePadded<SeqLock<PARAM_WORDS>>,
    /// Reservation tokens per pool (one, or reads and writes apart) and resource
    /// (`[ops, bytes]`), cost units.
    pub(crate) res: CachePadded<[[EpochPool; 2]; 2]>,
    /// Global tokens granted to this host ahead of its I/O (cooperative initiators),
    /// per resource, cost units.
    pub(crate) credit: CachePadded<[EpochPool; 2]>,
    /// Limit allowance per class (total, read, write) and resource, cost units.
    pub(crate) limit: CachePadded<[[EpochPool; 2]; 3]>,
    /// Monotonic counters and gauges its channels publish (units per field).
    pub(crate) counters: CachePadded<HostCounters>,
    /// Time its commands spent held (published by channels when they flush).
    pub(crate) held_time: CachePadded<SharedHeldTime>,
    /// Bit r: the monitor found this host behind its reservation schedule in resource r.
    pub(crate) lagging: AtomicU64,
    /// Its place in the window's weighted order (sharing `operating_point`).
    pub(crate) window: CachePadded<HostWindow>,
}

/// Monotonic counters, published by channels when they flush. In this order (`repr(C)`)
/// so that what the monitor reads at every check interval fills two cache lines and
/// `expired`, which only the token audit reads, is the one field beyond them.
///
/// Written by the host's channels (`AcqRel` adds at each flush), read by the monitor
/// and the statistics (Acquire loads); the pairing orders nothing beyond each counter
/// (see [`HostShared`]). Pairs are `[ops, bytes]` in cost units.
#[derive(Debug, Default)]
#[repr(C)]
pub struct HostCounters {
    /// Work completed, cost units.
    pub(crate) completed: [AtomicU64; 2],
    /// Commands completed.
    pub(crate) completed_ios: AtomicU64,
    /// Time the completed commands spent at the base, summed (ns): by Little's law, its
    /// growth over an interval's length is the mean number of commands in flight.
    pub(crate) service_ns: AtomicU64,
    /// Commands admitted.
    pub(crate) admitted_ios: AtomicU64,
    /// Reservation tokens consumed by admitted commands, cost units.
    pub(crate) consumed_res: [AtomicU64; 2],
    /// Global tokens (and credit) consumed by admitted commands, cost units.
    pub(crate) consumed_global: [AtomicU64; 2],
    /// Refusals: a command held, and every failed retry of a held command.
    pub(crate) held_events: AtomicU64,
    /// I/O waiting in hold queues now (a gauge kept as wrapping sum of deltas).
    pub(crate) held_now: AtomicU64,
    /// Reservation tokens cached in channels now, cost units (a gauge, as of their
    /// last flush).
    pub(crate) cached_res: [AtomicU64; 2],
    /// Global tokens cached in channels now, cost units (a gauge, likewise).
    pub(crate) cached_global: [AtomicU64; 2],
    /// Tokens that expired in channels, cost units: cached when their period ended, or
    /// caught between two pools by a roll-over.
    pub(crate) expired: [AtomicU64; 2],
    /// Commands that entered a hold queue, by [`HoldReason`] (read by the statistics
    /// only, so beyond the lines the monitor reads at every check interval).
    pub(crate) held_by: [AtomicU64; HoldReason::COUNT],
    /// Commands that would have waited and went at once because the domain is
    /// bypassed.
    pub(crate) bypassed: AtomicU64,
}

/// A snapshot of [`HostCounters`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CounterSnapshot {
    pub completed: Amount,
    pub completed_ios: u64,
    /// Time the completed commands spent at the base, summed (ns).
    pub service_ns: u64,
    pub admitted_ios: u64,
    pub consumed_res: Amount,
    pub consumed_global: Amount,
    pub expired: Amount,
    pub held_events: u64,
    pub held_now: u64,
    /// Reservation and global tokens sitting in channel caches (as of their flushes).
    pub cached_res: Amount,
    pub cached_global: Amount,
}

fn load2(a: &[AtomicU64; 2]) -> Amount {
    Amount::new(a[0].load(Ordering::Acquire), a[1].load(Ordering::Acquire))
}

impl CounterSnapshot {
    /// Commands admitted and not yet completed, plus commands held: the host's demand
    /// that the target has seen and not yet served.
    pub fn outstanding(&self) -> u64 {
        self.admitted_ios
            .saturating_sub(self.completed_ios)
            .saturating_add(self.held_now)
    }
    /// Work admitted and not yet completed, in cost units.
    pub fn in_flight(&self) -> Amount {
        self.consumed_res
            .saturating_add(self.consumed_global)
            .saturating_sub(self.completed)
    }
}

impl HostCounters {
    /// Every counter but `expired` (zero here): what the monitor reads at every check
    /// interval, without the third cache line.
    pub(crate) fn snapshot_hot(&self) -> CounterSnapshot {
        self.snapshot_with(|_| Amount::ZERO)
    }

    pub fn snapshot(&self) -> CounterSnapshot {
        self.snapshot_with(load2)
    }

    /// Commands that entered a hold queue, by reason (indexed by [`HoldReason::index`]),
    /// and those a bypass let through.
    pub fn holds(&self) -> HoldCounts {
        HoldCounts {
            held_by: std::array::from_fn(|i| self.held_by[i].load(Ordering::Acquire)),
            bypassed: self.bypassed.load(Ordering::Acquire),
        }
    }

    fn snapshot_with(&self, expired: impl Fn(&[AtomicU64; 2]) -> Amount) -> CounterSnapshot {
        CounterSnapshot {
            completed: load2(&self.completed),
            completed_ios: self.completed_ios.load(Ordering::Acquire),
            service_ns: self.service_ns.load(Ordering::Acquire),
            admitted_ios: self.admitted_ios.load(Ordering::Acquire),
            consumed_res: load2(&self.consumed_res),
            consumed_global: load2(&self.consumed_global),
            expired: expired(&self.expired),
            held_events: self.held_events.load(Ordering::Acquire),
            held_now: self.held_now.load(Ordering::Acquire),
            cached_res: load2(&self.cached_res),
            cached_global: load2(&self.cached_global),
        }
    }
}

impl HostShared {
    /// Its part of the domain's window (hold target, in-flight allowance, circulation
    /// report): the target plugin reads the allowance and stores the report.
    pub fn window(&self) -> &HostWindow {
        &self.window
    }

    /// A host whose pools start in period `tag`.
    pub(crate) fn new(
        id: u32,
        nqn: String,
        domain: Arc<DomainShared>,
        params: &ChannelParams,
        tag: u16,
    ) -> Self {
        let h = HostShared {
            id,
            nqn,
            domain,
            params: CachePadded(SeqLock::new(params.to_words())),
            res: Default::default(),
            credit: CachePadded([EpochPool::new(tag, 0), EpochPool::new(tag, 0)]),
            limit: Default::default(),
            counters: CachePadded::default(),
            held_time: CachePadded::default(),
            lagging: AtomicU64::new(0),
            window: CachePadded(HostWindow::default()),
        };
        h.write_params(params);
        h
    }

    pub fn host_nqn(&self) -> &str {
        &self.nqn
    }
    pub fn id(&self) -> u32 {
        self.id
    }
    pub fn counters(&self) -> CounterSnapshot {
        self.counters.snapshot()
    }
    /// [`HostShared::counters`] without `expired` (zero), for the monitor's passes.
    pub(crate) fn counters_hot(&self) -> CounterSnapshot {
        self.counters.snapshot_hot()
    }
    /// Work completed (operations in cost units) and the time the completed commands
    /// spent at the base (ns), both monotonic: what the depth curve is learned from.
    pub fn completed_work_and_service(&self) -> (u64, u64) {
        let c = &self.counters;
        (
            c.completed[0].load(Ordering::Acquire),
            c.service_ns.load(Ordering::Acquire),
        )
    }
    /// The held-time histogram of its commands (as of its channels' last flushes).
    pub fn held_time(&self) -> HeldTimeSnapshot {
        self.held_time.snapshot()
    }
    /// The tag of the period its domain has published.
    #[inline]
    fn current_tag(&self) -> u16 {
        self.domain.epoch.load(Ordering::Acquire) as u16
    }
    /// Reservation tokens of the current period left in the shared pools (not counting
    /// channel caches).
    pub fn reservation_available(&self) -> Amount {
        let tag = self.current_tag();
        let mut a = Amount::ZERO;
        for pool in self.res.iter() {
            a = a.saturating_add(Amount::new(pool[0].count(tag), pool[1].count(tag)));
        }
        a
    }
    /// Global tokens of the current period granted to it and not yet taken.
    pub fn credit_available(&self) -> Amount {
        let tag = self.current_tag();
        Amount::new(self.credit[0].count(tag), self.credit[1].count(tag))
    }
    /// Tokens in its reservation and credit pools, of any period (an ended period's
    /// leftovers until their slot is re-armed, the next period's once armed): what the
    /// conservation audit counts as pooled.
    pub fn pooled(&self) -> Amount {
        let mut a = Amount::ZERO;
        for pool in self.res.iter().chain(std::iter::once(&*self.credit)) {
            a = a.saturating_add(Amount::new(pool[0].held(), pool[1].held()));
        }
        a
    }
    /// Limit allowance left for `class` (`u64::MAX` where no limit is enforced).
    pub fn limit_available(&self, class: BudgetClass) -> Amount {
        let p = self.read_params();
        let c = class as usize;
        let tag = self.current_tag();
        let mut a = Amount::ZERO;
        for r in Resource::ALL {
            let v = if p.limited(c, r.index()) {
                self.limit[c][r.index()].count(tag)
            } else {
                UNLIMITED
            };
            a.set(r, v);
        }
        a
    }

    /// Monitor only (single writer): publishes new params and bumps the generation.
    pub(crate) fn write_params(&self, p: &ChannelParams) {
        self.params.write(&p.to_words());
    }

    /// Reads the params consistently; `None` while the monitor is writing them.
    pub(crate) fn try_read_params(&self) -> Option<(u64, ChannelParams)> {
        self.params
            .try_read()
            .map(|(g, w)| (g, ChannelParams::from_words(&w)))
    }

    /// The params' generation: channels compare it on every command.
    #[inline]
    pub(crate) fn generation(&self) -> u64 {
        self.params.generation()
    }

    pub(crate) fn read_params(&self) -> ChannelParams {
        loop {
            if let Some((_, p)) = self.try_read_params() {
                return p;
            }
            std::hint::spin_loop();
        }
    }
}

/// Why an I/O could not be admitted now: the rule of the contract that held it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HoldReason {
    /// The host reached its limit's rate.
    Limit,
    /// The host reached its burst rate (a burst raised its limit and it is at that).
    Burst,
    /// A backlogged host lags behind its reservation: the global pool is closed or
    /// paced for it, and this host does not lag.
    Reservation,
    /// The sharing policy hands the excess out by weight, and this host has taken its
    /// share for now (`weighted`: credit only).
    Share,
    /// The global pool is empty: the period's capacity estimate is spent (no
    /// reservation at risk, no share owed; with work-conserving first come this is
    /// rare, as the pool then holds a whole period's estimate every check interval).
    Budget,
    /// Excess waiting for room in the operating point's window of commands in flight.
    Window,
}

impl HoldReason {
    pub const COUNT: usize = 6;
    pub const ALL: [HoldReason; HoldReason::COUNT] = [
        HoldReason::Limit,
        HoldReason::Burst,
        HoldReason::Reservation,
        HoldReason::Share,
        HoldReason::Budget,
        HoldReason::Window,
    ];

    /// Its place in [`HoldCounts::held_by`].
    pub const fn index(self) -> usize {
        self as usize
    }

    /// Its name in the statistics (`qos_stats_get`'s `held_by`, the exporter's label).
    pub const fn name(self) -> &'static str {
        match self {
            HoldReason::Limit => "limit",
            HoldReason::Burst => "burst",
            HoldReason::Reservation => "reservation",
            HoldReason::Share => "share",
            HoldReason::Budget => "budget",
            HoldReason::Window => "window",
        }
    }
}

/// Commands that entered a hold queue by reason, and those a bypass let through
/// (monotonic counters of one host).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct HoldCounts {
    pub held_by: [u64; HoldReason::COUNT],
    pub bypassed: u64,
}

/// As `{"limit": n, "burst": n, ..., "window": n, "bypassed": n}`.
impl serde::Serialize for HoldCounts {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut m = s.serialize_map(Some(HoldReason::COUNT + 1))?;
        for r in HoldReason::ALL {
            m.serialize_entry(r.name(), &self.held_by[r.index()])?;
        }
        m.serialize_entry("bypassed", &self.bypassed)?;
        m.end()
    }
}

impl HoldCounts {
    /// All commands that entered a hold queue.
    pub fn held(&self) -> u64 {
        self.held_by.iter().sum()
    }

    /// Those held at the host's limit or burst rate: its demand capped by the contract.
    pub fn at_limit(&self) -> u64 {
        self.held_by[HoldReason::Limit.index()] + self.held_by[HoldReason::Burst.index()]
    }
}

/// The per-I/O decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// Send it. `reserved` when its operation was paid from the host's reservation.
    Admitted { reserved: bool },
    /// Keep it until tokens arrive (next check interval or next period).
    Held(HoldReason),
}

impl Admission {
    #[inline]
    pub fn is_admitted(self) -> bool {
        matches!(self, Admission::Admitted { .. })
    }
}

/// Where a host stands in the current period: the reply to the vendor "get state"
/// command, and what cooperative initiators mirror.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PeriodState {
    pub epoch: u64,
    pub period: Nanos,
    pub elapsed: Nanos,
    /// Reservation tokens the host has left (shared pools plus this channel's cache).
    pub reservation_left: Amount,
    /// Global tokens already granted to the host.
    pub credit: Amount,
    /// Limit allowance left (total class; `u64::MAX` when unlimited).
    pub limit_left: Amount,
    /// Global tokens left in the domain's pool.
    pub global_available: Amount,
}

/// One host on one thread: local token caches and counters. Not `Sync`: each poll-group
/// thread owns its own. Dropping it returns cached tokens to their pools.
#[derive(Debug)]
pub struct ChannelTokens {
    domain: Arc<DomainShared>,
    host: Arc<HostShared>,
    cost: CostModel,
    gen_: u64,
    params: ChannelParams,
    /// The period this channel's caches belong to (the domain's epoch when it last
    /// looked): the monitor publishes a new period once, to the domain, not per host.
    epoch: u64,
    res: [[u64; 2]; 2],
    glob: [u64; 2],
    lim: [[u64; 2]; 3],
    // Unpublished counters.
    completed: [u64; 2],
    completed_ios: u64,
    service_ns: u64,
    admitted_ios: u64,
    consumed_res: [u64; 2],
    consumed_global: [u64; 2],
    expired: [u64; 2],
    held_events: u64,
    held_delta: i64,
    /// Why its last command was refused, and commands that entered its hold queue by
    /// reason since the last flush (a command queued behind a held one counts under
    /// the reason the queue's head was last refused for).
    last_hold: HoldReason,
    held_by: [u64; HoldReason::COUNT],
    bypassed: u64,
    held_time: HeldTime,
    /// Commands this channel holds now.
    held_here: u64,
    /// When this channel last found the limit's pool short, per [class][resource]:
    /// while commands are held here, what was released since is theirs to take, however
    /// long this thread did not run (see [`ChannelTokens::refill_limit`]).
    lim_short: [[LimitShortage; 2]; 3],
    /// Cache sizes last published to the host's gauges: [reservation, global][resource].
    published: [[u64; 2]; 2],
    /// When to look for released reservation again although cached global tokens would
    /// do (ns; `u64::MAX`: the host has no reservation in that pool and resource).
    res_retry_at: [[u64; 2]; 2],
    /// Commands admitted or held since the last flush: a channel that saw none is idle
    /// and gives its cached tokens back, so they are not stranded on a quiet thread.
    active: bool,
    /// Window slots its commands hold (given back one per completion), and whether its
    /// last refusal was the window's.
    slots: u64,
    window_wait: bool,
}

impl ChannelTokens {
    pub fn new(domain: Arc<DomainShared>, host: Arc<HostShared>) -> Self {
        let params = host.read_params();
        let gen_ = host.generation();
        let cost = domain.cost;
        let epoch = domain.epoch.load(Ordering::Acquire);
        let mut ch = ChannelTokens {
            domain,
            host,
            cost,
            gen_,
            params,
            epoch,
            res: [[0; 2]; 2],
            glob: [0; 2],
            lim: [[0; 2]; 3],
            completed: [0; 2],
            completed_ios: 0,
            service_ns: 0,
            admitted_ios: 0,
            consumed_res: [0; 2],
            consumed_global: [0; 2],
            expired: [0; 2],
            held_events: 0,
            held_delta: 0,
            last_hold: HoldReason::Budget,
            held_by: [0; HoldReason::COUNT],
            bypassed: 0,
            held_here: 0,
            lim_short: [[LimitShortage::default(); 2]; 3],
            held_time: HeldTime::default(),
            published: [[0; 2]; 2],
            res_retry_at: [[0; 2]; 2],
            active: false,
            slots: 0,
            window_wait: false,
        };
        for c in 0..3 {
            for r in 0..2 {
                if !ch.params.limited(c, r) {
                    ch.lim[c][r] = u64::MAX;
                }
            }
        }
        ch
    }

    pub fn host(&self) -> &Arc<HostShared> {
        &self.host
    }
    pub fn domain(&self) -> &Arc<DomainShared> {
        &self.domain
    }

    #[inline]
    fn tag(&self) -> u16 {
        self.epoch as u16
    }

    /// Picks up a roll-over or a reconfiguration published by the monitor.
    #[inline]
    fn sync(&mut self) {
        if self.domain.epoch.load(Ordering::Acquire) != self.epoch
            || self.host.generation() != self.gen_
        {
            self.refresh();
        }
    }

    #[cold]
    fn refresh(&mut self) {
        // The epoch is stored after the new period's pools are armed: a channel that
        // sees it finds them.
        let epoch = self.domain.epoch.load(Ordering::Acquire);
        if epoch != self.epoch {
            self.expire_caches();
            self.epoch = epoch;
            // A limit that is not enforced never runs out (its allowance is unbounded),
            // so the per-command check needs no branch on which limits are on.
            for c in 0..3 {
                for r in 0..2 {
                    if !self.params.limited(c, r) {
                        self.lim[c][r] = u64::MAX;
                    }
                }
            }
            // A new period: look for released reservation again.
            self.res_retry_at = [[0; 2]; 2];
        }
        if self.host.generation() == self.gen_ {
            return;
        }
        let Some((g, p)) = self.host.try_read_params() else {
            return;
        };
        for c in 0..3 {
            for r in 0..2 {
                if !p.limited(c, r) {
                    self.lim[c][r] = u64::MAX;
                } else if !self.params.limited(c, r) {
                    self.lim[c][r] = 0;
                }
            }
        }
        self.params = p;
        self.gen_ = g;
        // New limits: what the old ones owed is not owed under them.
        self.lim_short = [[LimitShortage::default(); 2]; 3];
        // New reservations: look for released reservation again.
        self.res_retry_at = [[0; 2]; 2];
    }

    fn expire_caches(&mut self) {
        for r in 0..2 {
            self.expired[r] += self.res[0][r] + self.res[1][r] + self.glob[r];
        }
        self.res = [[0; 2]; 2];
        self.glob = [0; 2];
        self.lim = [[0; 2]; 3];
        // A new period's pools: nothing of the last one is owed to anyone.
        self.lim_short = [[LimitShortage::default(); 2]; 3];
    }

    /// The admission decision for one command. On `Admitted` the tokens are consumed
    /// and the caller must send the command; on `Held` nothing is consumed and the caller
    /// queues it (see [`crate::HoldQueue`]) and asks again later. `now` is on the
    /// monitor's clock; it is read only when a batch is fetched (paced release).
    #[inline]
    pub fn try_admit(&mut self, kind: IoKind, bytes: u64, now: Nanos) -> Admission {
        self.decide(kind, bytes, now, None)
    }

    /// [`Self::try_admit`] for a command that has been held for `waited` (the window
    /// over circulation lets a command its host's hold target kept too long go).
    #[inline]
    pub fn try_admit_held(
        &mut self,
        kind: IoKind,
        bytes: u64,
        now: Nanos,
        waited: Nanos,
    ) -> Admission {
        self.decide(kind, bytes, now, Some(waited))
    }

    /// The decision; `held_for`: how long the command has been held, `None` for one
    /// that just came.
    #[inline]
    fn decide(
        &mut self,
        kind: IoKind,
        bytes: u64,
        now: Nanos,
        held_for: Option<Nanos>,
    ) -> Admission {
        self.sync();
        self.active = true;
        let cost = self.cost.cost(kind, bytes);
        let dir = kind.direction();
        let cap = self.params.capacity;
        // No command is charged more than a whole period's capacity or limit, so that
        // every command is admitted at the latest at the start of some period.
        let need = [cost.ops.min(cap.ops), cost.bytes.min(cap.bytes)];
        let classes = [BudgetClass::Total as usize, BudgetClass::of(dir) as usize];
        let mut charged = [[0u64; 2]; 2];
        let p = self.params.pool(dir);
        if self.params.limit_mask != 0 {
            for (i, &c) in classes.iter().enumerate() {
                for r in 0..2 {
                    let n = need[r].min(self.params.limit[c].get(RES[r]));
                    if self.lim[c][r] < n && !self.refill_limit(c, r, n, p, now) {
                        let reason = if self.params.bursting {
                            HoldReason::Burst
                        } else {
                            HoldReason::Limit
                        };
                        return self.refuse(classes, charged, reason, p, need);
                    }
                    self.lim[c][r] -= n;
                    charged[i][r] = n;
                }
            }
        }
        for r in 0..2 {
            // Reservation before global tokens: even when cached global tokens would
            // cover the command, fetch released reservation first (at most once per
            // release interval when there is none), so a host spends its reservation.
            let short = self.res[p][r] + self.glob[r] < need[r];
            let res_due = self.res[p][r] < need[r] && now.0 >= self.res_retry_at[p][r];
            if (short || res_due) && !self.refill_tokens(p, r, need[r], now) {
                let reason = self.domain.tokens_hold_reason(r);
                return self.refuse(classes, charged, reason, p, need);
            }
        }
        let reserved = self.res[p][0] >= need[0];
        match self
            .domain
            .window
            .admit(&self.host.window, need[0], reserved, held_for)
        {
            Slot::Off => {}
            Slot::Taken => {
                self.slots += 1;
                self.window_wait = false;
            }
            Slot::Wait => {
                self.window_wait = true;
                return self.refuse(classes, charged, HoldReason::Window, p, need);
            }
        }
        self.consume(p, need);
        Admission::Admitted { reserved }
    }

    /// Takes a command's tokens from the caches, reservation first, as far as they
    /// go (admitted, they cover it; bypassed, what they do not cover is counted
    /// nowhere, so the books stay exact).
    #[inline]
    fn consume(&mut self, p: usize, need: [u64; 2]) {
        for r in 0..2 {
            let from_res = self.res[p][r].min(need[r]);
            let from_glob = self.glob[r].min(need[r] - from_res);
            self.res[p][r] -= from_res;
            self.glob[r] -= from_glob;
            self.consumed_res[r] += from_res;
            self.consumed_global[r] += from_glob;
        }
        self.admitted_ios += 1;
    }

    /// A command the contract holds for `reason`: held, unless the domain is bypassed
    /// (or in the open spell of the learner of N\*, for a reason other than the host's
    /// own limit or burst), in which case it goes at once, paid with what tokens the caches have and the
    /// limit charged so far. What no token covered is counted in `bypassed` only (the
    /// token books stay exact; the host's work in flight reads that much low while
    /// the bypass lasts).
    #[cold]
    fn refuse(
        &mut self,
        classes: [usize; 2],
        charged: [[u64; 2]; 2],
        reason: HoldReason,
        p: usize,
        need: [u64; 2],
    ) -> Admission {
        let probing = || {
            self.domain.probe_open.load(Ordering::Relaxed) != 0
                && !matches!(reason, HoldReason::Limit | HoldReason::Burst)
        };
        if self.domain.bypass.load(Ordering::Relaxed) != 0 || probing() {
            self.bypassed += 1;
            self.consume(p, need);
            return Admission::Admitted { reserved: false };
        }
        self.uncharge_limits(classes, charged);
        self.held_events += 1;
        self.last_hold = reason;
        Admission::Held(reason)
    }

    /// Gives back limit allowance charged to a command that is held after all.
    #[cold]
    fn uncharge_limits(&mut self, classes: [usize; 2], charged: [[u64; 2]; 2]) {
        for (i, &c) in classes.iter().enumerate() {
            for r in 0..2 {
                self.lim[c][r] = self.lim[c][r].saturating_add(charged[i][r]);
            }
        }
    }

    #[cold]
    fn refill_limit(&mut self, c: usize, r: usize, need: u64, p: usize, now: Nanos) -> bool {
        let want = need - self.lim[c][r] + self.params.limit_batch.get(RES[r]);
        // Paced release applies to the limit too: the allowance of a period comes out
        // over the period, so a limit is a rate, not a burst at every period start,
        // and what was released but not taken expires beyond one burst (plus this
        // fetch), so a host that was idle cannot catch up in a burst either.
        // The pool holds at most POOL_MAX: the floor is of what it was armed with.
        // But a host is not idle while this channel holds its commands: what was
        // released since this channel last looked is kept for them, so a thread that
        // did not run for a while (a reactor sharing its core, a CPU quota) does not
        // cost the host its limit. Another channel of the host may have taken it
        // meanwhile; the pool never gives more than was released.
        // Only the fetches at the instant of the first success after a shortage (the
        // release of the held commands it unblocks) are owed that span: later ones
        // find the host no longer short.
        // Nor does the limit withhold what the host's reservation owes it: reservation
        // released and not yet spent (in the pool, or cached here) may be spent at once
        // however long the host was away (its initiator starved of CPU, a controller
        // reset), so a host reserved close to its limit still gets its reservation in
        // the period. The reservation is within the limit, so the period's total stays
        // within it too.
        let res_per_period = clamp_pool(self.params.pool_res[p].get(RES[r]));
        let res_owed = self.res[p][r].saturating_add(
            self.host.res[p][r]
                .count(self.tag())
                .saturating_sub(self.domain.unreleased(res_per_period, now)),
        );
        let per_period = clamp_pool(self.params.limit[c].get(RES[r]));
        let floor = self.domain.unreleased_ahead(per_period, now, false);
        let short = &mut self.lim_short[c][r];
        if short.settled_at.is_some_and(|t| now.0 > t) {
            *short = LimitShortage::default();
        }
        let waited = match short.since {
            Some(since) if self.held_here > 0 => now.0.saturating_sub(since),
            _ => 0,
        };
        let carry = self
            .domain
            .carry_over(per_period, waited)
            .saturating_add(want)
            .saturating_add(res_owed);
        self.lim[c][r] += self.host.limit[c][r].take_carry(self.tag(), want, floor, carry);
        let short = &mut self.lim_short[c][r];
        if self.lim[c][r] >= need {
            if short.since.is_some() {
                short.settled_at = Some(now.0);
            }
            return true;
        }
        // Short: it took all there was, so from now on what is released is new.
        *short = LimitShortage {
            since: Some(now.0),
            settled_at: None,
        };
        false
    }

    #[cold]
    fn refill_tokens(&mut self, p: usize, r: usize, need: u64, now: Nanos) -> bool {
        let tag = self.tag();
        let deficit = |s: &Self| need.saturating_sub(s.res[p][r] + s.glob[r]);
        let res_batch = self.params.res_batch.get(RES[r]);
        if res_batch > 0 && self.res[p][r] < need {
            let want = need - self.res[p][r] + res_batch;
            // Paced release: what is not released yet stays in the pool.
            let per_period = clamp_pool(self.params.pool_res[p].get(RES[r]));
            let unreleased = self.domain.unreleased(per_period, now);
            let got = self.host.res[p][r].take_above(tag, want, unreleased);
            self.res[p][r] += got;
            if got < want {
                // None (or too few) released: look again after about one token's
                // release time, not on every command.
                let period = self.domain.period.load(Ordering::Relaxed);
                let interval = (period / per_period.max(1)).clamp(1_000, 1_000_000);
                self.res_retry_at[p][r] = now.0.saturating_add(interval);
            }
        } else if res_batch == 0 {
            self.res_retry_at[p][r] = u64::MAX;
        }
        let batch = self.params.global_batch.get(RES[r]);
        if deficit(self) > 0 {
            let d = deficit(self);
            self.glob[r] += self.host.credit[r].take(tag, d + batch);
        }
        if deficit(self) > 0 && self.domain.global_open_to(&self.host, r) {
            let d = deficit(self);
            // A paced pool's slice is small: no batch ahead, so one channel does not
            // take what the others' commands would have gone with.
            let ahead = if self.domain.pool_paced.load(Ordering::Relaxed) & (1 << r) != 0 {
                0
            } else {
                batch
            };
            self.glob[r] += self.domain.global[r].take(tag, d + ahead);
        }
        deficit(self) == 0
    }

    /// Records a completed command (for the per-period counts and the capacity
    /// estimator). Published on the next [`ChannelTokens::flush`].
    #[inline]
    pub fn record_completion(&mut self, kind: IoKind, bytes: u64) {
        let c = self.cost.cost(kind, bytes);
        self.completed[0] += c.ops;
        self.completed[1] += c.bytes;
        self.completed_ios += 1;
        if self.slots > 0 {
            self.slots -= 1;
            self.domain.window.put_for(&self.host.window);
        }
    }

    /// Its last refusal was the window's and no slot was taken since: a completion
    /// (a slot freed) is worth a try of the held queue.
    #[inline]
    pub fn waits_for_window(&self) -> bool {
        self.window_wait
    }

    /// The window is over the hosts' circulation: a held command waits for its
    /// host's arrivals (one in, one out: [`crate::TargetChannel::admit`]) or for the
    /// poller, never for a completion.
    #[inline]
    pub fn releases_on_arrival(&self) -> bool {
        self.domain.window.is_over_circulation()
    }

    /// Its host's start tag in the window's weighted order (the lab retries held
    /// commands in this order when a slot frees).
    pub fn window_tag(&self) -> u64 {
        self.host.window.tag()
    }

    /// Records the time a completed command spent at the base (for the depth curve).
    /// Published on the next [`ChannelTokens::flush`].
    #[inline]
    pub fn record_service(&mut self, service: Nanos) {
        self.service_ns = self.service_ns.wrapping_add(service.0);
    }

    /// Tracks the hold-queue gauge published in the host's stats.
    pub(crate) fn note_held(&mut self, delta: i64) {
        self.host.window.note_held(delta);
        self.held_delta += delta;
        self.held_here = self.held_here.saturating_add_signed(delta);
        if delta > 0 {
            self.held_time.entered(delta as u64);
            self.held_by[self.last_hold.index()] += delta as u64;
        }
    }

    /// Records how long an admitted command waited in the hold queue (zero: admitted at
    /// once). Published on the next [`ChannelTokens::flush`].
    #[inline]
    pub fn record_held_time(&mut self, waited: Nanos) {
        self.held_time.record(waited);
    }

    /// Publishes local counters to the host (call from the channel's poller; cheap when
    /// nothing changed). A channel that admitted nothing since the last flush returns
    /// its cached tokens to the pools.
    pub fn flush(&mut self) {
        self.sync();
        if !std::mem::take(&mut self.active) {
            self.return_caches();
        }
        let c = &self.host.counters;
        for r in 0..2 {
            add(&c.completed[r], &mut self.completed[r]);
            add(&c.consumed_res[r], &mut self.consumed_res[r]);
            add(&c.consumed_global[r], &mut self.consumed_global[r]);
            add(&c.expired[r], &mut self.expired[r]);
        }
        add(&c.completed_ios, &mut self.completed_ios);
        add(&c.service_ns, &mut self.service_ns);
        add(&c.admitted_ios, &mut self.admitted_ios);
        add(&c.held_events, &mut self.held_events);
        for (shared, local) in c.held_by.iter().zip(self.held_by.iter_mut()) {
            add(shared, local);
        }
        add(&c.bypassed, &mut self.bypassed);
        if self.held_delta != 0 {
            c.held_now
                .fetch_add(self.held_delta as u64, Ordering::AcqRel);
            self.held_delta = 0;
        }
        self.host.held_time.publish(&mut self.held_time);
        for r in 0..2 {
            let now = [self.res[0][r] + self.res[1][r], self.glob[r]];
            for (k, gauge) in [&c.cached_res[r], &c.cached_global[r]]
                .into_iter()
                .enumerate()
            {
                if now[k] != self.published[k][r] {
                    gauge.fetch_add(now[k].wrapping_sub(self.published[k][r]), Ordering::AcqRel);
                    self.published[k][r] = now[k];
                }
            }
        }
    }

    /// Moves up to `want` global tokens from the domain's pool into the host's credit
    /// (the vendor "acquire" command of cooperative initiators), bounded so that one
    /// host cannot hoard the pool. Returns what was granted.
    pub fn acquire_credit(&mut self, want: Amount) -> Amount {
        self.sync();
        let tag = self.tag();
        let mut granted = Amount::ZERO;
        for r in Resource::ALL {
            let i = r.index();
            if !self.domain.global_open_to(&self.host, i) {
                // Another host lags behind its reservation, or the monitor shares the
                // pool by weight (the host's share is in its credit already): nothing
                // beyond the credit for now.
                continue;
            }
            let have = self.host.credit[i].count(tag);
            let room = self.params.credit_cap.get(r).saturating_sub(have);
            let got = self.domain.global[i].take(tag, want.get(r).min(room));
            if got > 0 && !self.host.credit[i].give(tag, got) {
                // The period ended between the two steps: the tokens expired with it.
                self.expired[i] += got;
                continue;
            }
            granted.set(r, got);
        }
        if (0..2).any(|i| granted.get(RES[i]) < want.get(RES[i])) {
            // A cooperative host holds its commands at the initiator: an acquisition
            // left short is its admission refused for want of tokens, and tells the
            // monitor it is backlogged (not idle), as a held command would.
            self.held_events += 1;
            self.active = true;
        }
        granted
    }

    /// The host's standing in the current period, as seen from this channel.
    pub fn period_state(&mut self, now: Nanos) -> PeriodState {
        self.sync();
        let start = self.domain.period_start.load(Ordering::Acquire);
        let res = self
            .host
            .reservation_available()
            .saturating_add(self.cached().0);
        PeriodState {
            epoch: self.epoch,
            period: Nanos(self.domain.period.load(Ordering::Acquire)),
            elapsed: Nanos(now.0.saturating_sub(start)),
            reservation_left: res,
            credit: self
                .host
                .credit_available()
                .saturating_add(Amount::new(self.glob[0], self.glob[1])),
            limit_left: self.host.limit_available(BudgetClass::Total),
            global_available: self.domain.global_available(),
        }
    }

    /// Answers a vendor command of the token protocol (see [`crate::wire`]).
    pub fn serve_request(&mut self, req: wire::Request, now: Nanos) -> wire::StateReply {
        let granted = match req {
            wire::Request::GetState => Amount::ZERO,
            wire::Request::Acquire { ops, bytes } => self.acquire_credit(Amount::new(ops, bytes)),
        };
        let s = self.period_state(now);
        let p = &self.params;
        let mut flags = 0;
        if p.configured {
            flags |= wire::flags::CONFIGURED;
        }
        if p.limit_mask != 0 {
            flags |= wire::flags::LIMITED;
        }
        if self.domain.conversion.load(Ordering::Relaxed) == 1 {
            flags |= wire::flags::CONVERSION;
        }
        if self.domain.release_burst.load(Ordering::Relaxed) != u64::MAX {
            flags |= wire::flags::PACED;
        }
        wire::StateReply {
            flags,
            epoch: s.epoch,
            period_ns: s.period.0,
            elapsed_ns: s.elapsed.0,
            reservation_left_ops: s.reservation_left.ops,
            reservation_left_bytes: s.reservation_left.bytes,
            credit_ops: s.credit.ops,
            credit_bytes: s.credit.bytes,
            limit_left_ops: s.limit_left.ops,
            limit_left_bytes: s.limit_left.bytes,
            reservation_per_period_ops: p.pool_res[0].ops + p.pool_res[1].ops,
            reservation_per_period_bytes: p.pool_res[0].bytes + p.pool_res[1].bytes,
            release_burst_ns: self.domain.release_burst.load(Ordering::Relaxed),
            limit_per_period_ops: if p.limited(BudgetClass::Total as usize, 0) {
                p.limit[0].ops
            } else {
                u64::MAX
            },
            limit_per_period_bytes: if p.limited(BudgetClass::Total as usize, 1) {
                p.limit[0].bytes
            } else {
                u64::MAX
            },
            granted_ops: granted.ops,
            granted_bytes: granted.bytes,
            global_available_ops: s.global_available.ops,
            write_weight_milli: self.cost.write_weight_milli.min(u32::MAX as u64) as u32,
            size_unit: self.cost.size_unit.min(u32::MAX as u64) as u32,
            // The target plugin sets it with `flags::ALLOWANCE` (it knows the NQN).
            host_tag: 0,
        }
    }

    /// The credit to piggyback in completion dword 0 of a read or write: the host's
    /// operations left (reservation plus credit, shared and cached here) and its
    /// commands held at the target (as of the channels' last flush, plus this one's).
    pub fn credit_hint(&self) -> wire::Credit {
        let (res, glob) = self.cached();
        let avail = self
            .host
            .reservation_available()
            .ops
            .saturating_add(self.host.credit[0].count(self.tag()))
            .saturating_add(res.ops)
            .saturating_add(glob.ops);
        let held = (self.host.counters.held_now.load(Ordering::Relaxed) as i64)
            .saturating_add(self.held_delta)
            .max(0) as u64;
        wire::Credit::new(self.epoch, avail, held)
    }

    /// Tokens cached in this channel (reservation, global), for audits and tests.
    pub fn cached(&self) -> (Amount, Amount) {
        (
            Amount::new(
                self.res[0][0] + self.res[1][0],
                self.res[0][1] + self.res[1][1],
            ),
            Amount::new(self.glob[0], self.glob[1]),
        )
    }
}

fn add(a: &AtomicU64, local: &mut u64) {
    if *local != 0 {
        a.fetch_add(*local, Ordering::AcqRel);
        *local = 0;
    }
}

impl ChannelTokens {
    /// Returns cached tokens to the pools they came from (global tokens to the host's
    /// credit), or counts them expired if their period is over.
    fn return_caches(&mut self) {
        let tag = self.tag();
        for r in 0..2 {
            for p in 0..2 {
                let n = std::mem::take(&mut self.res[p][r]);
                if n > 0 && !self.host.res[p][r].give(tag, n) {
                    self.expired[r] += n;
                }
            }
            let n = std::mem::take(&mut self.glob[r]);
            if n > 0 && !self.host.credit[r].give(tag, n) {
                self.expired[r] += n;
            }
            for c in 0..3 {
                if !self.params.limited(c, r) {
                    continue;
                }
                let n = std::mem::take(&mut self.lim[c][r]);
                if n > 0 {
                    self.host.limit[c][r].give(tag, n);
                }
            }
        }
    }
}

impl Drop for ChannelTokens {
    fn drop(&mut self) {
        self.sync();
        self.return_caches();
        self.active = true;
        self.flush();
        // Commands it let in can no longer be booked here: their slots go back.
        for _ in 0..std::mem::take(&mut self.slots) {
            self.domain.window.put_for(&self.host.window);
        }
    }
}

/// Keeps pool counts representable.
pub(crate) fn clamp_pool(v: u64) -> u64 {
    v.min(POOL_MAX)
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn params_round_trip_through_the_seqlock_words() {
        let p = ChannelParams {
            together: false,
            limit_mask: 0b10_0101,
            limit: [Amount::new(1, 2), Amount::new(3, 4), Amount::new(5, 6)],
            res_batch: Amount::new(7, 8),
            global_batch: Amount::new(9, 10),
            limit_batch: Amount::new(11, 12),
            capacity: Amount::new(13, 14),
            credit_cap: Amount::new(15, 16),
            pool_res: [Amount::new(17, 18), Amount::new(19, 20)],
            configured: true,
            bursting: true,
        };
        assert_eq!(ChannelParams::from_words(&p.to_words()), p);
    }
}
