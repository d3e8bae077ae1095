//! State shared across threads: one [`Shared`] per QoS bdev (its host's token engine)
//! and one [`PacerGroup`] per pacer group (the link's pacer). Both are `Arc`s that the
//! I/O channels and the vendor commands in flight keep alive, so a late reply never
//! touches freed memory.
//!
//! Threading: `qos_core`'s [`InitiatorEngine`] and [`Pacer`] are not `Sync`; each sits
//! behind a `std::sync::Mutex`. The initiator applications this plugin serves (fio's
//! SPDK ioengine, bdevperf) run one to a few SPDK threads per QoS bdev, the critical
//! sections are a few hundred nanoseconds of integer arithmetic, and no SPDK call is
//! made while a lock is held, so the locks are short and rarely contended. Keeping the
//! engine on one thread instead would put a message hop (microseconds) on every
//! admission decision. Lock order: never both at once.

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU32, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

use qos_core::Nanos;
use qos_core::allowance::{AllowanceReceiver, ReportGate};
use qos_core::initiator::{InitiatorEngine, Mode};
use qos_core::pacer::{Pacer, StreamId, latency_sensitive_at, may_send_probe};
use serde_json::{Value, json};

use crate::params::{BdevOptions, PacerOptions, Refusal};

/// Locks `m`, ignoring poisoning (a panic aborts the process: `panic = "abort"`).
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Counters of one QoS bdev (relaxed atomics; for `qos_ini_bdev_get`).
#[derive(Debug, Default)]
pub struct Stats {
    pub ios: AtomicU64,
    pub large_ios: AtomicU64,
    /// Large transfers sent whole: no latency-sensitive I/O shared the path.
    pub large_whole_ios: AtomicU64,
    pub chunks: AtomicU64,
    /// Bytes of those chunks (their mean size is the chunk the transfers really used).
    pub chunk_bytes: AtomicU64,
    /// I/O (or chunks) waiting for tokens now, and how many ever waited.
    pub held: AtomicI64,
    pub held_total: AtomicU64,
    /// Time I/O and chunks spent held for tokens, ns (summed when they leave the queue).
    pub held_ns: AtomicU64,
    /// Time chunks of large I/O waited for the pacer, ns (from the parent's arrival or
    /// the previous chunk's release to the chunk's release).
    pub paced_ns: AtomicU64,
    pub vendor_sent: AtomicU64,
    pub vendor_errors: AtomicU64,
    /// Replies that arrived after their request had timed out (ignored).
    pub vendor_late: AtomicU64,
    pub vendor_submit_failed: AtomicU64,
    pub probes_sent: AtomicU64,
    /// Upper I/O completed with an error status by this bdev itself (reset/abort).
    pub aborted: AtomicU64,
    pub engine_restarts: AtomicU64,
    /// Completion credits received from the target (reads and writes), and applied to
    /// the engine (all of them from a target that sends them sparsely, a sample of
    /// them otherwise).
    pub credits_seen: AtomicU64,
    pub credits_applied: AtomicU64,
    /// ACQUIREs sent as GET_STATE because the base's path was down or resetting.
    pub acquire_deferred: AtomicU64,
    /// Shares held at the initiator (issue 40 item 2): I/O (or chunks) that entered
    /// the hold queue while the target's in-flight allowance was used up (the rest of
    /// `held_total` waited for tokens), the allowances applied, the allowance credits
    /// refused as bad input (malformed, stale, for another host, or from a target that
    /// did not announce them), and the circulation reports sent.
    pub allowance_held_total: AtomicU64,
    pub allowances_applied: AtomicU64,
    pub allowances_refused: AtomicU64,
    pub reports_sent: AtomicU64,
}

fn get(a: &AtomicU64) -> u64 {
    a.load(Ordering::Relaxed)
}

/// The token engine of one QoS bdev and what goes with it.
#[derive(Debug)]
pub struct EngineState {
    pub engine: InitiatorEngine,
    pub opts: BdevOptions,
    /// Sequence number of the engine's vendor command in flight (replies of others are
    /// ignored: they timed out already).
    pub outstanding: Option<u64>,
    pub seq: u64,
    /// When the engine was last (re)created.
    pub started: Nanos,
}

/// Per-QoS-bdev state shared by its channels.
#[derive(Debug)]
pub struct Shared {
    pub name: String,
    /// The pacer's flow id of this bdev (its host).
    pub flow: u64,
    pub eng: Mutex<EngineState>,
    /// Poll the engine no later than this (ns); 0: now.
    pub next_poll: AtomicU64,
    /// Bumped when the engine learns something (a reply): channels retry held I/O.
    pub version: AtomicU64,
    /// The engine's [`InitiatorEngine::pool_open`], copied after every call that may
    /// change it: while it is set and no allowance is in force, a channel with nothing
    /// held sends without taking the engine's lock (the engine would admit anyway).
    pub pool_open: AtomicBool,
    /// Fast-path copies of the options.
    pub token_protocol: AtomicBool,
    pub pacing: AtomicBool,
    /// The base takes NVMe I/O passthru (vendor commands and probes can be sent).
    pub base_nvme_io: bool,
    /// The target answers the probe (cleared when it refuses the opcode: probing such
    /// a target would only fill bdev_nvme's log with refused commands).
    pub probe_ok: AtomicBool,
    /// The last I/O completed by the base failed (path lost, controller resetting or
    /// failed) until one succeeds again; and resets of the base in progress. While
    /// either is set, ACQUIRE is sent as GET_STATE: bdev_nvme (v25.09) reads
    /// `u.bdev.accel_sequence` of a passthru I/O it fails without a path, which
    /// aliases the command's dwords 12-13, where ACQUIRE carries its amounts.
    pub path_down: AtomicBool,
    pub resetting: AtomicU32,
    /// The target's last state reply had `SPARSE_CREDIT`: it sends a completion credit
    /// only when the host's allowance changed, so every one is applied (otherwise they
    /// are sampled, at most one per thread every 10 us).
    pub sparse_credit: AtomicBool,
    /// Shares held at the initiator (issue 40 item 2; `qos_core::allowance`): the
    /// target's last state reply announced allowances (`flags::ALLOWANCE`), with the
    /// host tag it gave; the allowance in force (commands outstanding to the target,
    /// `u64::MAX`: none); the commands of this bdev at the base now (every channel);
    /// which allowance credits are news; when to report the circulation.
    pub allowance_on: AtomicBool,
    pub host_tag: AtomicU32,
    pub allowance: AtomicU64,
    pub in_flight: AtomicU64,
    pub allowance_rx: Mutex<AllowanceReceiver>,
    pub report_gate: Mutex<ReportGate>,
    /// The last admission refused was the allowance's (not the tokens'): for the
    /// attribution of holds (`allowance_held_total`).
    pub allowance_refusal: AtomicBool,
    pub stats: Stats,
}

impl Shared {
    pub fn new(name: &str, flow: u64, opts: BdevOptions, base_nvme_io: bool, now: Nanos) -> Self {
        Shared {
            name: name.to_string(),
            flow,
            eng: Mutex::new(EngineState {
                engine: InitiatorEngine::new(opts.engine_config(), now),
                opts,
                outstanding: None,
                seq: 0,
                started: now,
            }),
            next_poll: AtomicU64::new(0),
            version: AtomicU64::new(0),
            pool_open: AtomicBool::new(false),
            token_protocol: AtomicBool::new(opts.token_protocol),
            pacing: AtomicBool::new(opts.pacing),
            base_nvme_io,
            probe_ok: AtomicBool::new(base_nvme_io),
            path_down: AtomicBool::new(false),
            resetting: AtomicU32::new(0),
            sparse_credit: AtomicBool::new(false),
            allowance_on: AtomicBool::new(false),
            host_tag: AtomicU32::new(0),
            allowance: AtomicU64::new(u64::MAX),
            in_flight: AtomicU64::new(0),
            allowance_rx: Mutex::new(AllowanceReceiver::default()),
            report_gate: Mutex::new(ReportGate::default()),
            allowance_refusal: AtomicBool::new(false),
            stats: Stats::default(),
        }
    }

    /// Records the outcome of an I/O at the base (see `path_down`).
    #[inline]
    pub fn base_outcome(&self, success: bool) {
        if success == self.path_down.load(Ordering::Relaxed) {
            self.path_down.store(!success, Ordering::Relaxed);
        }
    }

    /// A state reply: whether the target announces allowances, with this host's tag.
    /// A target that does not (an older one, or another after a reconnect) sets no
    /// allowance: what one set before is dropped.
    pub fn note_allowance(&self, r: &qos_core::wire::StateReply) {
        let on = r.flags & qos_core::wire::flags::ALLOWANCE != 0;
        self.host_tag.store(r.host_tag, Ordering::Relaxed);
        if !on && self.allowance_on.load(Ordering::Relaxed) {
            self.allowance.store(u64::MAX, Ordering::Relaxed);
            self.version.fetch_add(1, Ordering::Relaxed);
        }
        self.allowance_on.store(on, Ordering::Relaxed);
    }

    /// ACQUIRE may be sent now (see `path_down`).
    pub fn acquire_safe(&self) -> bool {
        !self.path_down.load(Ordering::Relaxed) && self.resetting.load(Ordering::Relaxed) == 0
    }

    /// The token engine is in use (protocol on and possible with this base).
    pub fn protocol_active(&self) -> bool {
        self.base_nvme_io && self.token_protocol.load(Ordering::Relaxed)
    }

    /// New bdev options; a changed engine setting restarts the engine (it re-reads the
    /// period state from the target within one round trip).
    pub fn set_options(&self, opts: BdevOptions, now: Nanos) {
        let mut e = lock(&self.eng);
        if e.opts.engine_config() != opts.engine_config() {
            e.engine = InitiatorEngine::new(opts.engine_config(), now);
            e.outstanding = None;
            e.started = now;
            self.pool_open.store(false, Ordering::Relaxed);
            self.stats.engine_restarts.fetch_add(1, Ordering::Relaxed);
        }
        e.opts = opts;
        self.token_protocol
            .store(opts.token_protocol, Ordering::Relaxed);
        self.pacing.store(opts.pacing, Ordering::Relaxed);
        self.next_poll.store(0, Ordering::Relaxed);
        self.version.fetch_add(1, Ordering::Relaxed);
    }

    pub fn options(&self) -> BdevOptions {
        lock(&self.eng).opts
    }

    /// The engine's state and the counters, for `qos_ini_bdev_get`.
    pub fn state_json(&self) -> Value {
        let (mode, epoch, (res, glob), pool_open) = {
            let e = lock(&self.eng);
            (
                e.engine.mode(),
                e.engine.epoch(),
                e.engine.tokens(),
                e.engine.pool_open(),
            )
        };
        let mode = if !self.protocol_active() {
            "off"
        } else {
            match mode {
                Mode::Probing => "probing",
                Mode::Cooperative => "cooperative",
                Mode::PassThrough => "pass_through",
            }
        };
        let s = &self.stats;
        json!({
            "mode": mode,
            "epoch": epoch,
            "reservation_ops": res.ops,
            "reservation_bytes": res.bytes,
            "global_ops": glob.ops,
            "global_bytes": glob.bytes,
            "pool_open": pool_open,
            "held": s.held.load(Ordering::Relaxed).max(0),
            "held_total": get(&s.held_total),
            "held_ns": get(&s.held_ns),
            "paced_ns": get(&s.paced_ns),
            "ios": get(&s.ios),
            "large_ios": get(&s.large_ios),
            "large_whole_ios": get(&s.large_whole_ios),
            "chunks": get(&s.chunks),
            "chunk_bytes_sent": get(&s.chunk_bytes),
            "vendor_sent": get(&s.vendor_sent),
            "vendor_errors": get(&s.vendor_errors),
            "vendor_late": get(&s.vendor_late),
            "vendor_submit_failed": get(&s.vendor_submit_failed),
            "probes_sent": get(&s.probes_sent),
            "probing": self.probe_ok.load(Ordering::Relaxed),
            "aborted": get(&s.aborted),
            "engine_restarts": get(&s.engine_restarts),
            "credits_seen": get(&s.credits_seen),
            "credits_applied": get(&s.credits_applied),
            "acquire_deferred": get(&s.acquire_deferred),
            "allowance": match self.allowance.load(Ordering::Relaxed) {
                u64::MAX => Value::Null,
                a => json!(a),
            },
            "in_flight": get(&self.in_flight),
            "allowance_held_total": get(&s.allowance_held_total),
            "allowances_applied": get(&s.allowances_applied),
            "allowances_refused": get(&s.allowances_refused),
            "reports_sent": get(&s.reports_sent),
        })
    }
}

/// A stream handle tagged with the pacer generation it belongs to (the pacer is
/// rebuilt when its options change; stale handles are then ignored).
pub type StreamRef = Option<(u64, StreamId)>;

/// The pacer of one pacer group and its probe.
#[derive(Debug)]
pub struct GroupState {
    pub opts: PacerOptions,
    pub pacer: Pacer,
    pub generation: u64,
    /// The probe in flight: sequence number and when it was sent.
    pub probe: Option<(u64, Nanos)>,
    probe_seq: u64,
    /// A probe is due since then and waits for a channel that sent small I/O
    /// (`qos_core::pacer::may_send_probe`).
    probe_due: Option<Nanos>,
    applied_small: u64,
    pub probes_lost: u64,
    /// The pacer's `rates_version` last published in `rates_epoch`.
    published_rates: u64,
}

/// A pacer group: the QoS bdevs sharing one link (by default, all of the process).
#[derive(Debug)]
pub struct PacerGroup {
    pub name: String,
    st: Mutex<GroupState>,
    /// Time (ns) of the latest small I/O; applied to the pacer at its next tick.
    pub last_small: AtomicU64,
    /// Fast-path copy of the pacer's chunk size (`Pacer::chunk_bytes`), refreshed at
    /// every tick: it follows the path while small I/O shares it.
    pub chunk_bytes: AtomicU64,
    /// Fast-path copy of the option `chunk_bytes`: the largest chunk
    /// (`qos_core::pacer::plan_even_chunks`).
    pub largest_chunk: AtomicU64,
    /// Fast-path copies of `latency_idle` (ns) and `split_always`.
    latency_idle_ns: AtomicU64,
    split_always: AtomicBool,
    /// When the pacer next wants a tick (ns).
    pub next_tick: AtomicU64,
    /// A probe is due and no channel that may send it has ticked yet: a channel that
    /// sent small I/O ticks at its next poll.
    pub probe_due: AtomicBool,
    /// Changes when the pacer's rates change or it is rebuilt: a channel whose chunks
    /// wait for the time a refusal gave pumps again then (`Pacer::rates_version`).
    pub rates_epoch: AtomicU64,
}

impl PacerGroup {
    pub fn new(name: &str, opts: PacerOptions, now: Nanos) -> Result<PacerGroup, Refusal> {
        let pacer = Pacer::new(opts.pacer_config(), now)
            .map_err(|e| Refusal::invalid(format!("pacer options: {e}")))?;
        Ok(PacerGroup {
            name: name.to_string(),
            st: Mutex::new(GroupState {
                opts,
                pacer,
                generation: 0,
                probe: None,
                probe_seq: 0,
                probe_due: None,
                applied_small: 0,
                probes_lost: 0,
                published_rates: 0,
            }),
            last_small: AtomicU64::new(0),
            chunk_bytes: AtomicU64::new(opts.chunk_bytes),
            largest_chunk: AtomicU64::new(opts.chunk_bytes),
            latency_idle_ns: AtomicU64::new(opts.pacer_config().latency_idle.0),
            split_always: AtomicBool::new(opts.split_always),
            next_tick: AtomicU64::new(0),
            probe_due: AtomicBool::new(false),
            rates_epoch: AtomicU64::new(0),
        })
    }

    pub fn options(&self) -> PacerOptions {
        lock(&self.st).opts
    }

    /// New options: the pacer is rebuilt (open streams continue in the new pacer).
    pub fn set_options(&self, opts: PacerOptions, now: Nanos) -> Result<(), Refusal> {
        let pacer = Pacer::new(opts.pacer_config(), now)
            .map_err(|e| Refusal::invalid(format!("pacer options: {e}")))?;
        let mut g = lock(&self.st);
        if g.opts != opts {
            g.pacer = pacer;
            g.generation += 1;
            g.opts = opts;
            g.probe = None;
            g.probe_due = None;
            self.probe_due.store(false, Ordering::Relaxed);
            self.chunk_bytes.store(opts.chunk_bytes, Ordering::Relaxed);
            self.largest_chunk
                .store(opts.chunk_bytes, Ordering::Relaxed);
            self.latency_idle_ns
                .store(opts.pacer_config().latency_idle.0, Ordering::Relaxed);
            self.split_always
                .store(opts.split_always, Ordering::Relaxed);
            self.next_tick.store(0, Ordering::Relaxed);
            g.published_rates = g.pacer.rates_version();
            self.rates_epoch.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }

    /// A small, latency-sensitive I/O was sent (lock-free; applied at the next tick).
    #[inline]
    pub fn note_small(&self, now: Nanos) {
        self.last_small.store(now.0, Ordering::Relaxed);
    }

    /// Large transfers are split and paced now: a small I/O was sent less than
    /// `latency_idle` ago (`qos_core::pacer::latency_sensitive_at`, Justitia's trigger;
    /// the pacer's own copy of `last_small` is updated at its next tick, this one now),
    /// or the group splits always.
    #[inline]
    pub fn shapes_large(&self, now: Nanos) -> bool {
        if self.split_always.load(Ordering::Relaxed) {
            return true;
        }
        let last = self.last_small.load(Ordering::Relaxed);
        latency_sensitive_at(
            (last != 0).then_some(Nanos(last)),
            now,
            Nanos(self.latency_idle_ns.load(Ordering::Relaxed)),
        )
    }

    /// How long a probe may stay unanswered before it counts as lost (its age is then
    /// recorded as a sample: a probe that late is a congestion signal).
    fn probe_timeout(opts: &PacerOptions) -> Nanos {
        Nanos::from_micros(opts.latency_target_us.saturating_mul(20).max(10_000))
    }

    /// Small I/O was sent at `last_small` (ns, 0: never) less than `latency_idle` ago.
    #[inline]
    pub fn small_recently(&self, last_small: u64, now: Nanos) -> bool {
        latency_sensitive_at(
            (last_small != 0).then_some(Nanos(last_small)),
            now,
            Nanos(self.latency_idle_ns.load(Ordering::Relaxed)),
        )
    }

    /// AIMD and DIRS timers; returns the sequence number of a probe to send now, from
    /// the ticking channel, whose own small I/O was last sent at `small_here` (ns, 0:
    /// never): a due probe goes on a channel that sent small I/O
    /// (`qos_core::pacer::may_send_probe`).
    pub fn tick(&self, now: Nanos, small_here: u64) -> Option<u64> {
        let mut g = lock(&self.st);
        let small = self.last_small.load(Ordering::Relaxed);
        if small > g.applied_small {
            g.applied_small = small;
            g.pacer.note_latency_sensitive(Nanos(small));
        }
        if let Some((_, sent)) = g.probe
            && now.saturating_sub(sent) > Self::probe_timeout(&g.opts)
        {
            g.probe = None;
            g.probes_lost += 1;
            g.pacer.on_failed_probe(now.saturating_sub(sent), now);
        }
        let t = g.pacer.tick(now);
        self.publish_rates(&mut g);
        self.next_tick.store(t.next_deadline.0, Ordering::Relaxed);
        self.chunk_bytes
            .store(g.pacer.chunk_bytes(now), Ordering::Relaxed);
        if t.send_probe && g.probe_due.is_none() {
            g.probe_due = Some(now);
        }
        let due = g.probe_due?;
        if !g.pacer.latency_sensitive_now(now) {
            // The small I/O is gone: no probe.
            g.probe_due = None;
            self.probe_due.store(false, Ordering::Relaxed);
            return None;
        }
        let here = (small_here != 0).then_some(Nanos(small_here));
        let cfg = g.pacer.config();
        if g.probe.is_none() && may_send_probe(here, due, now, cfg.latency_idle, cfg.probe_interval)
        {
            g.probe_due = None;
            self.probe_due.store(false, Ordering::Relaxed);
            g.probe_seq += 1;
            let seq = g.probe_seq;
            g.probe = Some((seq, now));
            return Some(seq);
        }
        self.probe_due.store(g.probe.is_none(), Ordering::Relaxed);
        None
    }

    /// The probe `seq` completed (or failed: a failed probe still measured a round trip,
    /// which counts for the p99 but not for the base latency of the automatic target).
    pub fn probe_done(&self, seq: u64, success: bool, latency: Nanos, now: Nanos) {
        let mut g = lock(&self.st);
        if g.probe.is_some_and(|(s, _)| s == seq) {
            g.probe = None;
            if success {
                g.pacer.on_probe(latency, now);
            } else {
                g.pacer.on_failed_probe(latency, now);
            }
        }
    }

    /// The probe `seq` could not be sent.
    pub fn probe_not_sent(&self, seq: u64) {
        let mut g = lock(&self.st);
        if g.probe.is_some_and(|(s, _)| s == seq) {
            g.probe = None;
        }
    }

    /// A large transfer of `flow` begins: a new stream at the DIRS initial rate.
    pub fn open(&self, flow: u64, now: Nanos) -> StreamRef {
        let mut g = lock(&self.st);
        let id = g.pacer.open_stream(flow, now);
        self.publish_rates(&mut g);
        Some((g.generation, id))
    }

    /// May the next chunk of `stream` go now? `Err(t)`: not before `t`. A stream of an
    /// older pacer is reopened in the current one.
    pub fn try_send(
        &self,
        stream: &mut StreamRef,
        flow: u64,
        bytes: u64,
        now: Nanos,
    ) -> Result<(), Nanos> {
        let mut g = lock(&self.st);
        let id = match *stream {
            Some((g0, id)) if g0 == g.generation => id,
            _ => {
                let id = g.pacer.open_stream(flow, now);
                *stream = Some((g.generation, id));
                self.publish_rates(&mut g);
                id
            }
        };
        g.pacer.try_send(id, bytes, now)
    }

    /// Tells the channels when the pacer's rates changed (`rates_epoch`).
    fn publish_rates(&self, g: &mut GroupState) {
        let v = g.pacer.rates_version();
        if v != g.published_rates {
            g.published_rates = v;
            self.rates_epoch.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The transfer left the pacer (or ended early).
    pub fn close(&self, stream: &mut StreamRef, now: Nanos) {
        if let Some((g0, id)) = stream.take() {
            let mut g = lock(&self.st);
            if g0 == g.generation {
                g.pacer.close_stream(id, now);
                self.publish_rates(&mut g);
            }
        }
    }

    /// The group's state at `now` (the held delivery and U's integral count up to it).
    pub fn state_json(&self, now: Nanos) -> Value {
        let g = lock(&self.st);
        let mib = 1u64 << 20;
        let held = g.pacer.held_delivery(now);
        json!({
            "now_ns": now.0,
            "allowed_bytes_total": g.pacer.allowed_bytes_total(now),
            "held_ns": held.held_ns,
            "held_allowed_bytes": held.allowed_bytes,
            "held_stream_allowed_bytes": held.stream_allowed_bytes,
            "held_sent_bytes": held.sent_bytes,
            "held_charged_bytes": held.charged_bytes,
            "name": self.name,
            "allowed_mibps": g.pacer.allowed_rate() / mib,
            "allowed_bytes_per_sec": g.pacer.allowed_rate(),
            "active_streams": g.pacer.active_streams(),
            "active_flows": g.pacer.active_flows(),
            "dirs_virtual_mibps": g.pacer.dirs().virtual_rate() / mib,
            "latency_target_ns": g.pacer.latency_target().0,
            "chunk_bytes": self.chunk_bytes.load(Ordering::Relaxed),
            "floor_boost_milli": g.pacer.floor_boost_milli(),
            "aimd_steps": g.pacer.aimd_counts().steps,
            "aimd_congested": g.pacer.aimd_counts().congested,
            "probe_p99_ns": g.pacer.aimd_counts().last_p99.map(|n| n.0),
            "base_latency_ns": g.pacer.base_latency().map(|n| n.0),
            "probes_lost": g.probes_lost,
        })
    }
}
