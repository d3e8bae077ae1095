//! The cooperative initiator's token engine (Haechi's client QoS engine, section II-D),
//! adapted to NVMe-oF: the target is authoritative and enforces anyway; the initiator
//! mirrors its host's tokens so that it only sends what the target will admit, and
//! holds the rest locally, keeping the target's queues short.
//!
//! - At each period it learns its reservation from the target (vendor "get state").
//! - Reservation tokens decay: the bound X = R (T - t) / T, and tokens above X are
//!   dropped, as the target drops them when it converts.
//! - With no reservation left it acquires global tokens in batches (vendor "acquire").
//! - Unless the global pool is open to the host with room to spare and no limit
//!   binds it ([`InitiatorEngine::pool_open`]): then it sends without global tokens and
//!   acquires none, and the target, which sees every command, is the backstop (it
//!   takes the tokens from its pool, as for a plain host, and holds what it cannot
//!   admit; a held count in a credit closes the pool here again).
//! - Completion credits (dword 0) reveal roll-overs and drift; the engine re-syncs.
//! - A target that does not speak the protocol (invalid opcode) turns the engine into a
//!   pass-through, with one warning; one that stops answering (time-out) never leaves
//!   I/O waiting: everything is sent until the target answers again.

use serde::{Deserialize, Serialize};

use crate::cost::{Amount, CostModel, IoKind, Resource};
use crate::hold::Admit;
use crate::time::{MonotonicClamp, Nanos, mul_div, mul_div_ceil};
use crate::wire::{self, Credit, Request, StateReply};

/// Settings of the initiator engine; every one has a default.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct InitiatorConfig {
    /// Global tokens asked for per acquisition. Default 256 operations, 16 MiB.
    pub acquire_ops: u64,
    pub acquire_bytes: u64,
    /// Ask for more before running dry: when global tokens fall below this fraction
    /// (thousandths) of a batch. Default 250.
    pub prefetch_milli: u64,
    /// A vendor command unanswered after this long has timed out. Default 10 ms.
    pub request_timeout: Nanos,
    /// After an acquisition granted nothing, wait this long before asking again (the
    /// target converts tokens at its check interval). Default 1 ms.
    pub retry_after: Nanos,
    /// Re-read the state at least this often even when credits look fine. Default 100 ms.
    pub refresh_interval: Nanos,
    /// Time-outs in a row, before the first answer, that make the engine give up and
    /// pass everything through. Default 3.
    pub probe_attempts: u32,
    /// The pool is open to a host without limits when an acquisition was granted in
    /// full and the target's global pool still held at least this many batches
    /// (`acquire_ops`) after it: then global tokens are not waited for (see
    /// [`InitiatorEngine::pool_open`]). 0: never (every command waits for a token).
    /// Default 0 (off): 64 made a lone reader wait for nothing, but failed the
    /// reader-beside-a-writer test once in two runs (docs/benchmarks.md).
    pub open_pool_batches: u64,
}

impl Default for InitiatorConfig {
    fn default() -> Self {
        InitiatorConfig {
            acquire_ops: 256,
            acquire_bytes: 16 << 20,
            prefetch_milli: 250,
            request_timeout: Nanos::from_millis(10),
            retry_after: Nanos::from_millis(1),
            refresh_interval: Nanos::from_millis(100),
            probe_attempts: 3,
            open_pool_batches: 0,
        }
    }
}

/// What the engine does with I/O.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// No answer from the target yet: I/O is sent (the target enforces).
    Probing,
    /// Mirroring the target's tokens; I/O without tokens waits here.
    Cooperative,
    /// The target does not speak the protocol: plain pass-through.
    PassThrough,
}

/// A failed vendor command, as the initiator plugin saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestFailure {
    /// The command completed with an NVMe error (status code type, status code).
    Status { sct: u8, sc: u8 },
    /// The reply did not decode.
    BadReply(wire::ReplyError),
}

/// What the engine wants the plugin to do now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Poll {
    /// A vendor command to send now (at most one is in flight).
    pub send: Option<Request>,
    /// Call [`InitiatorEngine::poll`] again no later than this.
    pub next_deadline: Nanos,
}

/// One host's engine. Not `Sync`: the initiator plugin owns it per QoS bdev.
#[derive(Debug)]
pub struct InitiatorEngine {
    cfg: InitiatorConfig,
    mode: Mode,
    clock: MonotonicClamp,
    cost: CostModel,
    epoch: u64,
    period: Nanos,
    /// Local time at which the target's current period started.
    period_start: Nanos,
    res_per_period: Amount,
    /// Reservation left, released or not (mirrors the target's pools).
    res_left: Amount,
    /// `Some(burst)` when the target releases reservations paced over the period.
    paced: Option<Nanos>,
    global: Amount,
    limit_left: Amount,
    in_flight: Option<(Request, Nanos)>,
    timeouts: u32,
    no_grant_until: Nanos,
    last_sync: Nanos,
    want_state: bool,
    warning: Option<String>,
    warned: bool,
    /// The target answered at least once.
    answered: bool,
    /// Commands of this host held at the target, as the last completion said: they
    /// are owed the next tokens the target releases.
    target_backlog: u8,
    limit_per_period: Amount,
    /// The target's global pool is open to this host with room to spare and no limit
    /// binds it: commands beyond the mirrored tokens are sent, not held.
    pool_open: bool,
    /// Evidence that the pool was not enough (commands held at the target): the pool
    /// is not taken for open again before this.
    closed_until: Nanos,
}

impl InitiatorEngine {
    pub fn new(cfg: InitiatorConfig, now: Nanos) -> Self {
        InitiatorEngine {
            cfg,
            mode: Mode::Probing,
            clock: MonotonicClamp::new(now),
            cost: CostModel::default(),
            epoch: 0,
            period: Nanos::from_secs(1),
            period_start: now,
            res_per_period: Amount::ZERO,
            res_left: Amount::ZERO,
            paced: None,
            global: Amount::ZERO,
            limit_left: Amount::new(u64::MAX, u64::MAX),
            in_flight: None,
            timeouts: 0,
            no_grant_until: Nanos::ZERO,
            last_sync: Nanos::ZERO,
            want_state: true,
            warning: None,
            warned: false,
            answered: false,
            target_backlog: 0,
            limit_per_period: Amount::new(u64::MAX, u64::MAX),
            pool_open: false,
            closed_until: Nanos::ZERO,
        }
    }

    pub fn mode(&self) -> Mode {
        self.mode
    }
    pub fn epoch(&self) -> u64 {
        self.epoch
    }
    /// Tokens the engine believes the host has: (reservation, global).
    pub fn tokens(&self) -> (Amount, Amount) {
        (self.res_left, self.global)
    }
    /// Whether the engine sends without global tokens: the host has no limit (the
    /// reply's `LIMITED` flag is clear), counts no bytes (no MiB/s reservation), its
    /// last acquisition was granted in full (the pool is open to it: not closed for a
    /// lagging reservation, not shared out as credit) and left at least
    /// `open_pool_batches` batches in the target's pool, and since then no state reply
    /// showed less and no credit reported a command of the host held at the target.
    ///
    /// Such a host's contract needs no wait at the initiator: the target takes its
    /// commands' tokens from the pool as it does for a plain host, and holds what it
    /// cannot admit. Waiting here for an acquisition instead held about 18 % of a lone
    /// reader's I/O for 100 us each (docs/benchmarks.md, issue 40 item 1).
    pub fn pool_open(&self) -> bool {
        self.pool_open
    }

    /// A warning to log once (fallback to pass-through), if any.
    pub fn take_warning(&mut self) -> Option<String> {
        self.warning.take()
    }

    fn warn_once(&mut self, msg: String) {
        if !self.warned {
            self.warned = true;
            self.warning = Some(msg);
        }
    }

    /// Applies local time: period roll-over (speculative until the target confirms)
    /// and the decay of reservation tokens to X = R (T - t) / T.
    fn advance(&mut self, now: Nanos) {
        if self.period.0 == 0 {
            return;
        }
        let end = self.period_start.saturating_add(self.period);
        if now >= end {
            let k = (now.0 - self.period_start.0) / self.period.0;
            self.period_start = Nanos(self.period_start.0 + k * self.period.0);
            self.epoch += k;
            self.res_left = self.res_per_period;
            self.global = Amount::ZERO;
            self.target_backlog = 0;
            // Unknown until the target answers; the target enforces meanwhile.
            self.limit_left = Amount::new(u64::MAX, u64::MAX);
            self.want_state = true;
        }
        if self.paced.is_some() {
            // With paced release the schedule already bounds what can be spent, and the
            // target decays only idle hosts (its credits and state replies tell us).
            return;
        }
        let t = now.saturating_sub(self.period_start).0.min(self.period.0);
        for r in Resource::ALL {
            let x = mul_div(self.res_per_period.get(r), self.period.0 - t, self.period.0);
            if self.res_left.get(r) > x {
                self.res_left.set(r, x);
            }
        }
    }

    /// With paced release, how much of `per_period` is not released at `now` (rounded
    /// as the target rounds: the released part up).
    fn unreleased(&self, per_period: u64, now: Nanos) -> u64 {
        let Some(burst) = self.paced else { return 0 };
        let t = now
            .saturating_sub(self.period_start)
            .saturating_add(burst)
            .0
            .min(self.period.0);
        per_period - mul_div_ceil(per_period, t, self.period.0).min(per_period)
    }

    /// Reservation tokens usable now: with paced release, the part of the period's
    /// reservation not released yet stays out of reach (as it does at the target).
    fn res_usable(&self, now: Nanos) -> Amount {
        let mut a = self.res_left;
        for r in Resource::ALL {
            let unreleased = self.unreleased(self.res_per_period.get(r), now);
            a.set(r, a.get(r).saturating_sub(unreleased));
        }
        a
    }

    /// Limit allowance usable now (paced like reservations at the target).
    fn limit_usable(&self, now: Nanos) -> Amount {
        let mut a = self.limit_left;
        for r in Resource::ALL {
            if a.get(r) != u64::MAX {
                let unreleased = self.unreleased(self.limit_per_period.get(r), now);
                a.set(r, a.get(r).saturating_sub(unreleased));
            }
        }
        a
    }

    /// Send or hold one command. In cooperative mode, a `true` consumes the tokens.
    pub fn decide(&mut self, kind: IoKind, bytes: u64, now: Nanos) -> bool {
        let now = self.clock.observe(now);
        if self.mode != Mode::Cooperative {
            return true;
        }
        self.advance(now);
        let cost = self.cost.cost(kind, bytes);
        // The target enforces limits exactly (and lets a command larger than a whole
        // period's allowance pass at a period start); here we only stop sending once the
        // released allowance is gone, so no command can wait forever on the initiator.
        let limit = self.limit_usable(now);
        if (cost.ops > 0 && limit.ops == 0) || (cost.bytes > 0 && limit.bytes == 0) {
            return false;
        }
        let usable = self.res_usable(now);
        let mut from_res = Amount::ZERO;
        for r in Resource::ALL {
            let mut have = usable.get(r).saturating_add(self.global.get(r));
            if r == Resource::Ops {
                // Commands held at the target will take the next tokens it releases:
                // we sent them believing they were there. Leave those tokens to them,
                // or the target's queue never drains (it only grows at each period
                // boundary or clock skew).
                have = have.saturating_sub(self.target_backlog as u64);
            }
            // Resources the target does not count for this host (no reservation, no
            // bytes batch) never hold a command here: the target decides those; nor
            // do global tokens while the pool is open to the host (the target takes
            // them from its pool).
            if have < cost.get(r) && self.counts(r) && !self.pool_open {
                return false;
            }
            from_res.set(r, usable.get(r).min(cost.get(r)));
        }
        for r in Resource::ALL {
            let c = cost.get(r);
            let fr = from_res.get(r);
            self.res_left.set(r, self.res_left.get(r) - fr);
            self.global
                .set(r, self.global.get(r).saturating_sub(c - fr));
            if self.limit_left.get(r) != u64::MAX {
                self.limit_left
                    .set(r, self.limit_left.get(r).saturating_sub(c));
            }
        }
        true
    }

    /// Whether the engine mirrors resource `r`: operations always; bytes only for a
    /// host with a MiB/s reservation (otherwise the target's byte budget is a plain
    /// shared pool, and mirroring it would only add round trips).
    fn counts(&self, r: Resource) -> bool {
        match r {
            Resource::Ops => true,
            Resource::Bytes => self.res_per_period.bytes > 0,
        }
    }

    /// What to send now, and when to call again.
    pub fn poll(&mut self, now: Nanos) -> Poll {
        let now = self.clock.observe(now);
        if let Some((_, sent)) = self.in_flight
            && now.saturating_sub(sent) >= self.cfg.request_timeout
        {
            self.in_flight = None;
            self.on_timeout();
        }
        if self.mode == Mode::Cooperative {
            self.advance(now);
        }
        let mut send = None;
        if self.in_flight.is_none() && self.mode != Mode::PassThrough {
            let stale = now.saturating_sub(self.last_sync) >= self.cfg.refresh_interval;
            if self.want_state || stale || self.mode == Mode::Probing {
                send = Some(Request::GetState);
            } else if now >= self.no_grant_until && self.low_on_global(now) {
                let a = self.acquire_amount();
                send = Some(Request::Acquire {
                    ops: a.ops,
                    bytes: a.bytes,
                });
            }
            if let Some(req) = send {
                self.in_flight = Some((req, now));
            }
        }
        let mut next = now.saturating_add(self.cfg.refresh_interval);
        if let Some((_, sent)) = self.in_flight {
            next = next.min(sent.saturating_add(self.cfg.request_timeout));
        }
        if self.mode == Mode::Cooperative {
            next = next.min(self.period_start.saturating_add(self.period));
            if self.no_grant_until > now {
                next = next.min(self.no_grant_until);
            }
        }
        Poll {
            send,
            next_deadline: next.max(now.saturating_add(Nanos(1))),
        }
    }

    /// Time to ask for global tokens: for some resource the engine counts, no
    /// reservation is usable and the global tokens are below the prefetch mark.
    fn low_on_global(&self, now: Nanos) -> bool {
        if self.pool_open || self.limit_usable(now).ops == 0 {
            return false;
        }
        let usable = self.res_usable(now);
        Resource::ALL.iter().any(|&r| {
            let batch = self.acquire_amount().get(r);
            self.counts(r)
                && batch > 0
                && usable.get(r) == 0
                && self.global.get(r) <= mul_div(batch, self.cfg.prefetch_milli, 1000)
        })
    }

    /// What one acquisition asks for: bytes only when the engine counts them.
    fn acquire_amount(&self) -> Amount {
        let bytes = if self.counts(Resource::Bytes) {
            self.cfg.acquire_bytes
        } else {
            0
        };
        Amount::new(self.cfg.acquire_ops, bytes)
    }

    fn on_timeout(&mut self) {
        self.timeouts += 1;
        self.pool_open = false;
        match self.mode {
            // Give up only on a target that never answered; one that answered before
            // and went quiet is probed again (I/O passes meanwhile).
            Mode::Probing if !self.answered && self.timeouts >= self.cfg.probe_attempts => {
                self.mode = Mode::PassThrough;
                self.warn_once(format!(
                    "target did not answer {} nvmf-qos state requests: passing I/O through without initiator-side QoS",
                    self.timeouts
                ));
            }
            Mode::Cooperative => {
                // Never leave I/O waiting on a silent target.
                self.mode = Mode::Probing;
                self.want_state = true;
            }
            _ => {}
        }
    }

    /// The answer to the command sent by [`InitiatorEngine::poll`].
    pub fn on_reply(&mut self, reply: Result<StateReply, RequestFailure>, now: Nanos) {
        let now = self.clock.observe(now);
        let Some((req, sent)) = self.in_flight.take() else {
            return;
        };
        let r = match reply {
            Ok(r) => r,
            Err(RequestFailure::Status { sct: 0, sc }) if sc == wire::status::INVALID_OPCODE => {
                self.mode = Mode::PassThrough;
                self.warn_once(
                    "target does not support nvmf-qos vendor commands (invalid opcode): passing I/O through".into(),
                );
                return;
            }
            Err(_) => {
                self.on_timeout();
                return;
            }
        };
        if r.flags & wire::flags::CONFIGURED == 0 {
            self.mode = Mode::PassThrough;
            self.warn_once(
                "the target's QoS bdev is not bound to a configured host: passing I/O through"
                    .into(),
            );
            return;
        }
        self.timeouts = 0;
        self.answered = true;
        self.mode = Mode::Cooperative;
        self.last_sync = now;
        self.want_state = false;
        self.cost = CostModel {
            write_weight_milli: if r.write_weight_milli == 0 {
                1000
            } else {
                r.write_weight_milli as u64
            },
            size_unit: r.size_unit as u64,
        };
        self.epoch = r.epoch;
        self.period = Nanos(r.period_ns.max(1));
        // The target measured `elapsed` about half a round trip ago: align our copy of
        // its clock with that, so our release schedule does not trail the target's.
        let half_rtt = Nanos(now.saturating_sub(sent).0 / 2);
        let elapsed = Nanos(r.elapsed_ns.min(r.period_ns)).saturating_add(half_rtt);
        self.period_start = now.saturating_sub(elapsed);
        self.res_per_period =
            Amount::new(r.reservation_per_period_ops, r.reservation_per_period_bytes);
        self.res_left = Amount::new(r.reservation_left_ops, r.reservation_left_bytes);
        self.paced = (r.flags & wire::flags::PACED != 0).then_some(Nanos(r.release_burst_ns));
        self.global = Amount::new(r.credit_ops, r.credit_bytes);
        self.limit_left = Amount::new(r.limit_left_ops, r.limit_left_bytes);
        self.limit_per_period = Amount::new(r.limit_per_period_ops, r.limit_per_period_bytes);
        if let Request::Acquire { .. } = req
            && r.granted_ops == 0
        {
            self.no_grant_until = now.saturating_add(self.cfg.retry_after);
        }
        self.pool_open = self.open_after(req, &r, now);
    }

    /// Whether the pool is open to the host after reply `r` to `req`
    /// ([`InitiatorEngine::pool_open`]): an acquisition granted in full opens it, a
    /// state reply only keeps it open; either needs no limit, no counted bytes, and
    /// `open_pool_batches` batches left in the target's pool.
    fn open_after(&self, req: Request, r: &StateReply, now: Nanos) -> bool {
        let room = self
            .cfg
            .acquire_ops
            .saturating_mul(self.cfg.open_pool_batches);
        let unconstrained = self.cfg.open_pool_batches > 0
            && r.flags & wire::flags::LIMITED == 0
            && r.limit_left_ops == u64::MAX
            && r.limit_left_bytes == u64::MAX
            && !self.counts(Resource::Bytes)
            && r.global_available_ops >= room
            && now >= self.closed_until;
        unconstrained
            && match req {
                Request::Acquire { ops, .. } => r.granted_ops >= ops,
                Request::GetState => self.pool_open,
            }
    }

    /// Dword 0 of a read or write completion.
    pub fn on_completion(&mut self, cdw0: u32, now: Nanos) {
        let now = self.clock.observe(now);
        let Some(c) = Credit::decode(cdw0) else {
            return;
        };
        if self.mode != Mode::Cooperative {
            return;
        }
        if c.held > 0 && self.pool_open {
            // The target holds commands of ours: the pool did not cover them (or it
            // closed). Mirror tokens again, and do not take it for open before a
            // refresh interval has passed.
            self.pool_open = false;
            self.closed_until = now.saturating_add(self.cfg.refresh_interval);
        }
        self.advance(now);
        if c.epoch_low != (self.epoch & 0xF) as u8 {
            self.want_state = true;
            return;
        }
        self.target_backlog = c.held;
        // The target is authoritative; we only ever lower our view (our own in-flight
        // commands are already deducted here but not there).
        let ours = self.res_left.ops.saturating_add(self.global.ops);
        let theirs = c.available_ops as u64;
        if theirs < ours && c.available_ops < wire::CREDIT_MAX_OPS {
            let mut excess = ours - theirs;
            let g = self.global.ops.min(excess);
            self.global.ops -= g;
            excess -= g;
            self.res_left.ops -= excess.min(self.res_left.ops);
        }
    }
}

impl Admit for InitiatorEngine {
    fn admit(&mut self, kind: IoKind, bytes: u64, now: Nanos) -> bool {
        self.decide(kind, bytes, now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply(epoch: u64, elapsed_ms: u64, res: u64, credit: u64) -> StateReply {
        StateReply {
            flags: wire::flags::CONFIGURED | wire::flags::CONVERSION,
            epoch,
            period_ns: Nanos::from_secs(1).0,
            elapsed_ns: Nanos::from_millis(elapsed_ms).0,
            reservation_left_ops: res,
            reservation_per_period_ops: 1000,
            credit_ops: credit,
            limit_left_ops: u64::MAX,
            limit_left_bytes: u64::MAX,
            ..StateReply::default()
        }
    }

    fn cooperative(now: Nanos) -> InitiatorEngine {
        let mut e = InitiatorEngine::new(
            InitiatorConfig {
                acquire_bytes: 0,
                open_pool_batches: 64,
                ..Default::default()
            },
            now,
        );
        let p = e.poll(now);
        assert_eq!(p.send, Some(Request::GetState));
        e.on_reply(Ok(reply(5, 0, 1000, 0)), now);
        assert_eq!(e.mode(), Mode::Cooperative);
        e
    }

    #[test]
    fn a_completion_without_the_marker_is_no_news() {
        let t0 = Nanos::from_secs(10);
        let mut e = cooperative(t0);
        e.on_completion(Credit::new(5, 10, 3).encode(), t0);
        assert_eq!(e.target_backlog, 3);
        let before = (e.tokens(), e.target_backlog, e.want_state);
        // A sparse target completes most reads with dword 0 = 0.
        for cdw0 in [0, 0x0FFF_FFFF, 0x5A00_0000] {
            e.on_completion(cdw0, t0);
            assert_eq!((e.tokens(), e.target_backlog, e.want_state), before);
        }
    }

    #[test]
    fn probing_sends_everything_then_mirrors_reservation() {
        let t0 = Nanos::from_secs(10);
        let mut e = InitiatorEngine::new(InitiatorConfig::default(), t0);
        assert!(e.decide(IoKind::Read, 4096, t0));
        let mut e = cooperative(t0);
        for _ in 0..1000 {
            assert!(e.decide(IoKind::Read, 4096, t0));
        }
        assert!(
            !e.decide(IoKind::Read, 4096, t0),
            "reservation spent, no global tokens"
        );
        let p = e.poll(t0);
        assert_eq!(p.send, Some(Request::Acquire { ops: 256, bytes: 0 }));
    }

    #[test]
    fn reservation_decays_like_haechi_x() {
        let t0 = Nanos::from_secs(10);
        let mut e = cooperative(t0);
        // 600 ms into the period with no I/O: X = 1000 * 0.4 = 400.
        let t = t0.saturating_add(Nanos::from_millis(600));
        assert!(e.decide(IoKind::Read, 0, t));
        assert_eq!(e.tokens().0.ops, 399);
    }

    #[test]
    fn local_roll_over_refills_and_asks_for_state() {
        let t0 = Nanos::from_secs(10);
        let mut e = cooperative(t0);
        for _ in 0..1000 {
            e.decide(IoKind::Read, 4096, t0);
        }
        let t1 = t0.saturating_add(Nanos::from_millis(1000));
        assert!(e.decide(IoKind::Read, 4096, t1));
        assert_eq!(e.epoch(), 6);
        assert_eq!(e.poll(t1).send, Some(Request::GetState));
    }

    #[test]
    fn empty_grant_backs_off() {
        let t0 = Nanos::from_secs(10);
        let mut e = cooperative(t0);
        for _ in 0..1000 {
            e.decide(IoKind::Read, 4096, t0);
        }
        assert!(matches!(e.poll(t0).send, Some(Request::Acquire { .. })));
        let mut r = reply(5, 0, 0, 0);
        r.granted_ops = 0;
        e.on_reply(Ok(r), t0);
        assert_eq!(e.poll(t0).send, None);
        let later = t0.saturating_add(Nanos::from_millis(1));
        assert!(matches!(e.poll(later).send, Some(Request::Acquire { .. })));
        let mut r = reply(5, 1, 0, 256);
        r.granted_ops = 256;
        e.on_reply(Ok(r), later);
        assert!(e.decide(IoKind::Read, 4096, later));
    }

    #[test]
    fn invalid_opcode_means_pass_through_with_one_warning() {
        let t0 = Nanos::from_secs(1);
        let mut e = InitiatorEngine::new(InitiatorConfig::default(), t0);
        e.poll(t0);
        e.on_reply(
            Err(RequestFailure::Status {
                sct: 0,
                sc: wire::status::INVALID_OPCODE,
            }),
            t0,
        );
        assert_eq!(e.mode(), Mode::PassThrough);
        assert!(e.take_warning().is_some());
        assert!(e.take_warning().is_none());
        assert!(e.decide(IoKind::Write, 1 << 20, t0));
        assert_eq!(e.poll(t0).send, None);
    }

    #[test]
    fn silent_target_never_strands_io() {
        let t0 = Nanos::from_secs(1);
        let mut e = cooperative(t0);
        for _ in 0..1000 {
            e.decide(IoKind::Read, 4096, t0);
        }
        assert!(!e.decide(IoKind::Read, 4096, t0));
        e.poll(t0); // acquire goes out and is never answered
        let late = t0.saturating_add(Nanos::from_millis(10));
        e.poll(late);
        assert_eq!(e.mode(), Mode::Probing);
        assert!(
            e.decide(IoKind::Read, 4096, late),
            "sent while the target is silent"
        );
        // It answered before, so it is probed again rather than given up on.
        for i in 1..=5 {
            let t = late.saturating_add(Nanos::from_millis(10 * i));
            assert_eq!(e.poll(t).send, Some(Request::GetState));
        }
        assert_eq!(e.mode(), Mode::Probing);
        let back = late.saturating_add(Nanos::from_millis(55));
        e.on_reply(Ok(reply(5, 100, 500, 0)), back);
        assert_eq!(e.mode(), Mode::Cooperative);
    }

    #[test]
    fn a_target_that_never_answers_means_pass_through() {
        let t0 = Nanos::from_secs(1);
        let mut e = InitiatorEngine::new(InitiatorConfig::default(), t0);
        for i in 0..=3 {
            e.poll(t0.saturating_add(Nanos::from_millis(10 * i)));
        }
        assert_eq!(e.mode(), Mode::PassThrough);
        assert!(e.take_warning().is_some());
    }

    #[test]
    fn paced_release_does_not_decay_and_small_reservations_still_flow() {
        let t0 = Nanos::from_secs(10);
        let mut e = InitiatorEngine::new(InitiatorConfig::default(), t0);
        e.poll(t0);
        // 432 per 500 ms with a 1 ms burst: less than one operation per burst.
        let mut r = reply(5, 0, 432, 0);
        r.flags |= wire::flags::PACED;
        r.period_ns = Nanos::from_millis(500).0;
        r.reservation_per_period_ops = 432;
        r.release_burst_ns = Nanos::from_millis(1).0;
        e.on_reply(Ok(r), t0);
        let mut sent = 0;
        for ms in 0..500 {
            let now = t0.saturating_add(Nanos::from_millis(ms));
            while e.decide(IoKind::Read, 4096, now) {
                sent += 1;
            }
        }
        assert!(sent >= 430, "{sent} of 432 sent from the reservation");
    }

    #[test]
    fn bytes_are_acquired_when_a_byte_reservation_runs_out() {
        let t0 = Nanos::from_secs(10);
        let mut e = InitiatorEngine::new(InitiatorConfig::default(), t0);
        e.poll(t0);
        let mut r = reply(5, 0, 1000, 0);
        r.reservation_per_period_bytes = 8192;
        r.reservation_left_bytes = 8192;
        e.on_reply(Ok(r), t0);
        assert!(e.decide(IoKind::Read, 8192, t0));
        assert!(!e.decide(IoKind::Read, 8192, t0), "bytes spent");
        assert_eq!(
            e.poll(t0).send,
            Some(Request::Acquire {
                ops: 256,
                bytes: 16 << 20
            })
        );
    }

    #[test]
    fn completion_credit_lowers_drift_and_spots_roll_over() {
        let t0 = Nanos::from_secs(1);
        let mut e = cooperative(t0);
        e.on_completion(Credit::new(5, 600, 0).encode(), t0);
        assert_eq!(e.tokens().0.ops, 600);
        e.on_completion(Credit::new(5, 900, 0).encode(), t0);
        assert_eq!(e.tokens().0.ops, 600, "never raised by a credit");
        e.on_completion(Credit::new(6, 900, 0).encode(), t0);
        assert_eq!(e.poll(t0).send, Some(Request::GetState));
        e.on_completion(0, t0); // plain target completion: ignored
    }

    #[test]
    fn a_backlog_at_the_target_is_owed_the_next_tokens() {
        let t0 = Nanos::from_secs(1);
        let mut e = cooperative(t0);
        // 1000 reservation tokens; the target says 995 commands of ours wait there.
        e.on_completion(Credit::new(5, 1000, 255).encode(), t0);
        let mut sent = 0;
        while e.decide(IoKind::Read, 4096, t0) {
            sent += 1;
        }
        assert_eq!(
            sent,
            1000 - 255,
            "the last 255 tokens are left to the held commands"
        );
        e.on_completion(Credit::new(5, 1000, 0).encode(), t0);
        assert!(
            e.decide(IoKind::Read, 4096, t0),
            "sending resumes once the target drained"
        );
    }

    /// A cooperative engine that spent its reservation and sent an ACQUIRE, answered
    /// with `granted` of 256 and `pool` left in the target's global pool.
    fn after_acquire(now: Nanos, granted: u64, pool: u64, flags: u16) -> InitiatorEngine {
        let mut e = cooperative(now);
        for _ in 0..1000 {
            assert!(e.decide(IoKind::Read, 4096, now));
        }
        assert!(matches!(
            e.poll(now).send,
            Some(Request::Acquire { ops: 256, .. })
        ));
        let mut r = reply(5, 0, 0, granted);
        r.flags |= flags;
        r.granted_ops = granted;
        r.global_available_ops = pool;
        e.on_reply(Ok(r), now);
        e
    }

    #[test]
    fn an_open_pool_is_not_waited_for() {
        let t0 = Nanos::from_secs(10);
        let mut e = after_acquire(t0, 256, 1 << 20, 0);
        assert!(e.pool_open());
        for _ in 0..10_000 {
            assert!(
                e.decide(IoKind::Read, 4096, t0),
                "no wait for global tokens"
            );
        }
        assert_eq!(e.tokens().1.ops, 0);
        assert_eq!(e.poll(t0).send, None, "and no acquisition");
        // The refresh keeps it open while the pool has room.
        let t1 = t0.saturating_add(Nanos::from_millis(100));
        assert_eq!(e.poll(t1).send, Some(Request::GetState));
        let mut r = reply(5, 100, 0, 0);
        r.global_available_ops = 1 << 20;
        e.on_reply(Ok(r), t1);
        assert!(e.pool_open());
        assert!(e.decide(IoKind::Read, 4096, t1));
        // One showing less closes it: tokens are waited for again.
        let t2 = t1.saturating_add(Nanos::from_millis(100));
        assert_eq!(e.poll(t2).send, Some(Request::GetState));
        let mut r = reply(5, 200, 0, 0);
        r.global_available_ops = 64 * 256 - 1;
        e.on_reply(Ok(r), t2);
        assert!(!e.pool_open());
        assert!(!e.decide(IoKind::Read, 4096, t2));
        assert!(matches!(e.poll(t2).send, Some(Request::Acquire { .. })));
    }

    #[test]
    fn a_limit_a_short_grant_or_a_small_pool_keeps_it_closed() {
        let t0 = Nanos::from_secs(10);
        for (granted, pool, flags) in [
            (256, 1 << 20, wire::flags::LIMITED),
            (255, 1 << 20, 0),
            (0, 1 << 20, 0),
            (256, 64 * 256 - 1, 0),
        ] {
            let mut e = after_acquire(t0, granted, pool, flags);
            assert!(!e.pool_open(), "{granted} {pool} {flags}");
            let mut sent = 0;
            while e.decide(IoKind::Read, 4096, t0) {
                sent += 1;
            }
            assert_eq!(sent, granted, "only what was granted");
        }
        // A limit left in the reply, and a host that counts bytes, too.
        let mut e = cooperative(t0);
        for _ in 0..1000 {
            e.decide(IoKind::Read, 4096, t0);
        }
        e.poll(t0);
        let mut r = reply(5, 0, 0, 256);
        r.granted_ops = 256;
        r.global_available_ops = 1 << 20;
        r.limit_left_ops = 1 << 30;
        e.on_reply(Ok(r), t0);
        assert!(!e.pool_open());
        let mut r = reply(5, 0, 0, 256);
        r.granted_ops = 256;
        r.global_available_ops = 1 << 20;
        r.reservation_per_period_bytes = 1 << 20;
        e.poll(t0.saturating_add(Nanos::from_millis(100)));
        e.on_reply(Ok(r), t0.saturating_add(Nanos::from_millis(100)));
        assert!(!e.pool_open());
        // Switched off.
        let mut e = InitiatorEngine::new(
            InitiatorConfig {
                acquire_bytes: 0,
                open_pool_batches: 0,
                ..Default::default()
            },
            t0,
        );
        e.poll(t0);
        let mut r = reply(5, 0, 0, 256);
        r.granted_ops = 256;
        r.global_available_ops = u64::MAX;
        e.on_reply(Ok(r), t0);
        assert!(!e.pool_open());
    }

    #[test]
    fn a_state_reply_never_opens_the_pool() {
        let t0 = Nanos::from_secs(10);
        let mut e = cooperative(t0);
        let t1 = t0.saturating_add(Nanos::from_millis(100));
        assert_eq!(e.poll(t1).send, Some(Request::GetState));
        let mut r = reply(5, 100, 1000, 0);
        r.global_available_ops = 1 << 20;
        e.on_reply(Ok(r), t1);
        assert!(
            !e.pool_open(),
            "only an acquisition granted in full opens it"
        );
    }

    #[test]
    fn a_command_held_at_the_target_closes_the_pool() {
        let t0 = Nanos::from_secs(10);
        let mut e = after_acquire(t0, 256, 1 << 20, 0);
        for _ in 0..300 {
            assert!(e.decide(IoKind::Read, 4096, t0));
        }
        e.on_completion(Credit::new(5, 0, 0).encode(), t0);
        assert!(e.pool_open(), "no command held: still open");
        e.on_completion(Credit::new(5, 0, 2).encode(), t0);
        assert!(!e.pool_open());
        assert!(!e.decide(IoKind::Read, 4096, t0), "waits for tokens again");
        // An acquisition granted in full within the refresh interval does not reopen it.
        let t1 = t0.saturating_add(Nanos::from_millis(50));
        assert!(matches!(e.poll(t1).send, Some(Request::Acquire { .. })));
        let mut r = reply(5, 50, 0, 256);
        r.granted_ops = 256;
        r.global_available_ops = 1 << 20;
        e.on_reply(Ok(r), t1);
        assert!(!e.pool_open());
        let mut sent = 0;
        while e.decide(IoKind::Read, 4096, t1) {
            sent += 1;
        }
        assert_eq!(sent, 256 - 2, "the held commands' tokens left to them");
        // After it, one does.
        e.on_completion(Credit::new(5, 0, 0).encode(), t1);
        let t2 = t0.saturating_add(Nanos::from_millis(100));
        assert!(matches!(e.poll(t2).send, Some(Request::Acquire { .. })));
        let mut r = reply(5, 100, 0, 256);
        r.granted_ops = 256;
        r.global_available_ops = 1 << 20;
        e.on_reply(Ok(r), t2);
        assert!(e.pool_open());
    }

    #[test]
    fn a_silent_target_closes_the_pool() {
        let t0 = Nanos::from_secs(10);
        let mut e = after_acquire(t0, 256, 1 << 20, 0);
        let t1 = t0.saturating_add(Nanos::from_millis(100));
        assert_eq!(e.poll(t1).send, Some(Request::GetState));
        e.poll(t1.saturating_add(Nanos::from_millis(10)));
        assert_eq!(e.mode(), Mode::Probing);
        assert!(!e.pool_open());
    }

    mod open_pool {
        //! Property: whatever the replies, credits and time, the pool is open exactly
        //! when the rule says (model below), an open engine never holds a command and
        //! never acquires, and a closed one sends no more than its tokens.
        use super::*;
        use proptest::prelude::*;

        #[derive(Debug, Clone)]
        enum Ev {
            Io(u8),
            Poll,
            Reply {
                grant_full: bool,
                pool: u64,
                limited: bool,
            },
            Credit {
                held: u8,
            },
            Wait(u16),
        }

        fn ev() -> impl Strategy<Value = Ev> {
            prop_oneof![
                (1u8..50).prop_map(Ev::Io),
                Just(Ev::Poll),
                (any::<bool>(), 0u64..40_000, prop::bool::weighted(0.2)).prop_map(
                    |(grant_full, pool, limited)| Ev::Reply {
                        grant_full,
                        pool,
                        limited
                    }
                ),
                prop_oneof![Just(0u8), 1u8..4].prop_map(|held| Ev::Credit { held }),
                (1u16..20_000).prop_map(Ev::Wait),
            ]
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(256))]
            #[test]
            fn open_exactly_by_the_rule(evs in prop::collection::vec(ev(), 1..200)) {
                let mut now = Nanos::from_secs(10);
                let mut e = cooperative(now);
                let room = 64 * 256;
                let mut model = false;
                let mut closed_until = Nanos::ZERO;
                let mut in_flight: Option<Request> = None;
                for ev in evs {
                    match ev {
                        Ev::Io(n) => {
                            for _ in 0..n {
                                let (res, glob) = e.tokens();
                                let had = res.ops + glob.ops;
                                let sent = e.decide(IoKind::Read, 4096, now);
                                if model {
                                    prop_assert!(sent, "an open pool never holds");
                                } else if sent && e.mode() == Mode::Cooperative {
                                    prop_assert!(had > 0, "closed: sent without a token");
                                }
                            }
                        }
                        Ev::Poll => {
                            let p = e.poll(now);
                            if let Some(req) = p.send {
                                if model {
                                    prop_assert_eq!(req, Request::GetState);
                                }
                                in_flight = Some(req);
                            }
                            if e.mode() != Mode::Cooperative {
                                model = false;
                            }
                        }
                        Ev::Reply { grant_full, pool, limited } => {
                            let Some(req) = in_flight.take() else { continue };
                            let elapsed = now.0 % Nanos::from_secs(1).0 / 1_000_000;
                            let mut r = reply(e.epoch(), elapsed, 0, 0);
                            if limited {
                                r.flags |= wire::flags::LIMITED;
                            }
                            r.global_available_ops = pool;
                            if let Request::Acquire { ops, .. } = req {
                                r.granted_ops = if grant_full { ops } else { ops / 2 };
                                r.credit_ops = r.granted_ops;
                            }
                            e.on_reply(Ok(r), now);
                            let ok = !limited && pool >= room && now >= closed_until;
                            model = ok && match req {
                                Request::Acquire { .. } => grant_full,
                                Request::GetState => model,
                            };
                        }
                        Ev::Credit { held } => {
                            let epoch = e.epoch();
                            e.on_completion(Credit::new(epoch, 100, held.into()).encode(), now);
                            if held > 0 && model {
                                model = false;
                                closed_until = now.saturating_add(Nanos::from_millis(100));
                            }
                        }
                        Ev::Wait(us) => now = now.saturating_add(Nanos::from_micros(us as u64)),
                    }
                    if e.mode() != Mode::Cooperative {
                        model = false;
                    }
                    prop_assert_eq!(e.pool_open(), model);
                }
            }
        }
    }

    #[test]
    fn unconfigured_host_passes_through() {
        let t0 = Nanos::from_secs(1);
        let mut e = InitiatorEngine::new(InitiatorConfig::default(), t0);
        e.poll(t0);
        e.on_reply(Ok(StateReply::default()), t0);
        assert_eq!(e.mode(), Mode::PassThrough);
    }
}
