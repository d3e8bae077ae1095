//! The token protocol's vendor commands on an initiator channel: the engine's state
//! requests and acquisitions and the pacer's probes (sent on the channel's base
//! channel, replies decoded into the engine or the pacer), completion credits, the
//! in-flight allowance and the circulation reports (issue 40 item 2), and the
//! orphan: a channel destroyed while vendor commands are in flight keeps its base
//! channel until they complete, and aborts those overdue.

use std::rc::{Rc, Weak};
use std::sync::atomic::Ordering;

use qos_core::Nanos;
use qos_core::allowance::{self, Received};
use qos_core::initiator::{InitiatorEngine, Mode, RequestFailure};
use qos_core::wire::{self, Request, StateReply};
use spdk_sys::bdev_io::{BaseIo, nvme_cmd_from_dwords};
use spdk_sys::dma::DmaBuf;
use spdk_sys::poller::{LocalPoller, PollStatus};
use spdk_sys::vbdev::RequestId;

use super::{IniChannel, VendorKind, VendorReq, now};
use crate::state::lock;

/// Completion credits of a target that sends one in every read and write (version 1
/// without `SPARSE_CREDIT`) are applied at most this often per thread.
const CREDIT_SAMPLE_NS: u64 = 10_000;
/// Credit marker of completion dword 0 (bits 31:28), see `docs/wire-protocol.md`.
const CREDIT_MARKER: u32 = 0xA;

impl IniChannel {
    /// Completion dword 0 of a successful read or write: the target's credit, if it
    /// sends one (a dword 0 without the marker, 0 in particular, is no news).
    pub(crate) fn on_credit(&self, cdw0: u32, now: Nanos) {
        if !self.shared.protocol_active() {
            return;
        }
        if cdw0 >> 28 == allowance::ALLOWANCE_MARK {
            return self.on_allowance(cdw0, now);
        }
        if cdw0 >> 28 != CREDIT_MARKER {
            return;
        }
        self.shared
            .stats
            .credits_seen
            .fetch_add(1, Ordering::Relaxed);
        // A target that sends credits sparsely sends only news: apply each. One that
        // sends one in every completion is sampled: a credit corrects drift, one every
        // few microseconds per thread is plenty, and at hundreds of thousands of
        // completions per second the engine's lock is not.
        if !self.shared.sparse_credit.load(Ordering::Relaxed)
            && now.0.saturating_sub(self.last_credit.get()) < CREDIT_SAMPLE_NS
        {
            return;
        }
        self.last_credit.set(now.0);
        self.shared
            .stats
            .credits_applied
            .fetch_add(1, Ordering::Relaxed);
        let mut e = lock(&self.shared.eng);
        if e.engine.mode() == Mode::PassThrough {
            // The target speaks the protocol after all (it gave up after time-outs,
            // e.g. during a reconnect): probe again, at most once per refresh interval.
            let every = Nanos::from_micros(e.opts.refresh_interval_us);
            if now.saturating_sub(e.started) >= every {
                e.engine = InitiatorEngine::new(e.opts.engine_config(), now);
                e.outstanding = None;
                e.started = now;
                self.shared.pool_open.store(false, Ordering::Relaxed);
                self.shared.next_poll.store(0, Ordering::Relaxed);
                self.shared
                    .stats
                    .engine_restarts
                    .fetch_add(1, Ordering::Relaxed);
            }
            return;
        }
        e.engine.on_completion(cdw0, now);
        self.shared
            .pool_open
            .store(e.engine.pool_open(), Ordering::Relaxed);
    }

    /// Completion dword 0 with the allowance marker: the target's in-flight allowance
    /// for this host (issue 40 item 2). Applied once when it is news; bad input
    /// (malformed, stale, another host's, unannounced) is refused, counted and logged
    /// (the first, then at each power of two: a broken target would flood the log).
    pub(crate) fn on_allowance(&self, cdw0: u32, now: Nanos) {
        let sh = &self.shared;
        let announced = sh
            .allowance_on
            .load(Ordering::Relaxed)
            .then(|| sh.host_tag.load(Ordering::Relaxed));
        let got = lock(&sh.allowance_rx).receive(cdw0, announced, now);
        match got {
            Received::Applied(cap) => {
                sh.allowance
                    .store(cap.unwrap_or(u64::MAX), Ordering::Relaxed);
                sh.stats.allowances_applied.fetch_add(1, Ordering::Relaxed);
                // Held I/O on every channel may go (a larger allowance).
                sh.version.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(bdev = sh.name.as_str(), "in-flight allowance {cap:?}");
            }
            Received::Duplicate => {}
            bad => {
                let n = sh.stats.allowances_refused.fetch_add(1, Ordering::Relaxed) + 1;
                if n.is_power_of_two() {
                    tracing::warn!(
                        bdev = sh.name.as_str(),
                        "allowance credit {cdw0:#010x} ignored ({bad:?}); {n} ignored so far"
                    );
                }
            }
        }
    }

    /// Reports the bdev's circulation (commands at the base plus those waiting here)
    /// when [`allowance::ReportGate`] says so; returns whether it sent a report.
    pub(crate) fn report_circulation(&self, now: Nanos) -> bool {
        let sh = &self.shared;
        let circulation = sh
            .in_flight
            .load(Ordering::Relaxed)
            .saturating_add(sh.stats.held.load(Ordering::Relaxed).max(0) as u64);
        if !lock(&sh.report_gate).due(circulation, now) {
            return false;
        }
        let (opc, c) = allowance::encode_report(circulation);
        self.send_cmd(opc, c, VendorKind::Report, now);
        true
    }

    /// Lets the engine send its next vendor command; returns whether it sent one.
    pub(crate) fn poll_engine(&self, now: Nanos) -> bool {
        let (send, warning) = {
            let mut e = lock(&self.shared.eng);
            let p = e.engine.poll(now);
            self.shared
                .pool_open
                .store(e.engine.pool_open(), Ordering::Relaxed);
            self.shared
                .next_poll
                .store(p.next_deadline.0, Ordering::Relaxed);
            let send = p.send.map(|r| {
                e.seq += 1;
                e.outstanding = Some(e.seq);
                (r, e.seq)
            });
            (send, e.engine.take_warning())
        };
        if let Some(w) = warning {
            tracing::warn!(bdev = self.shared.name.as_str(), "{w}");
        }
        match send {
            Some((req, seq)) => {
                self.send_vendor(req, VendorKind::Engine(seq), now);
                true
            }
            None => false,
        }
    }

    /// Sends a token-protocol command on this thread's base channel.
    pub(crate) fn send_vendor(&self, req: Request, kind: VendorKind, now: Nanos) {
        let req = match req {
            Request::Acquire { .. } if !self.shared.acquire_safe() => {
                // The engine takes the state reply as an empty grant and retries later.
                self.shared
                    .stats
                    .acquire_deferred
                    .fetch_add(1, Ordering::Relaxed);
                Request::GetState
            }
            r => r,
        };
        let (opc, c) = wire::encode_request(req);
        self.send_cmd(opc, c, kind, now);
    }

    /// Sends an encoded vendor command on this thread's base channel.
    fn send_cmd(&self, opc: u8, c: wire::VendorCmd, kind: VendorKind, now: Nanos) {
        let mut dw = [0u32; 16];
        dw[0] = opc as u32;
        dw[10..16].copy_from_slice(&[c.cdw10, c.cdw11, c.cdw12, c.cdw13, c.cdw14, c.cdw15]);
        let cmd = nvme_cmd_from_dwords(dw);
        let stats = &self.shared.stats;
        let Some(buf) = DmaBuf::zeroed(wire::REPLY_LEN, 64) else {
            stats.vendor_submit_failed.fetch_add(1, Ordering::Relaxed);
            if let VendorKind::Probe(seq) = kind {
                self.group.probe_not_sent(seq);
            }
            return;
        };
        let Some(chan) = self.me.upgrade() else {
            return;
        };
        let req = VendorReq {
            kind,
            sent: now,
            chan,
        };
        // The buffer (REPLY_LEN DMA-able bytes) is kept with the request until
        // `vendor_done`, and read only there.
        let id = match self
            .base
            .nvme_io_passthru(&cmd, buf, wire::REPLY_LEN, req, vendor_done)
        {
            Ok(id) => id,
            Err((_req, _buf, rc)) => {
                stats.vendor_submit_failed.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(
                    bdev = self.shared.name.as_str(),
                    "vendor command not submitted: error {rc}"
                );
                // An engine command is then left to time out; a probe is forgotten.
                if let VendorKind::Probe(seq) = kind {
                    self.group.probe_not_sent(seq);
                }
                return;
            }
        };
        match kind {
            VendorKind::Engine(_) => stats.vendor_sent.fetch_add(1, Ordering::Relaxed),
            VendorKind::Probe(_) => stats.probes_sent.fetch_add(1, Ordering::Relaxed),
            VendorKind::Report => stats.reports_sent.fetch_add(1, Ordering::Relaxed),
        };
        self.vendor.borrow_mut().push((id, now));
    }

    /// The channel is destroyed with vendor commands in flight: they keep the base
    /// channel (their completions run on it). A responsive target answers them within
    /// a round trip; commands overdue by the request time-out are aborted, so a silent
    /// target cannot keep the base channel (and with it shutdown) waiting. The last
    /// completion frees the rest.
    pub(crate) fn orphan(self: &Rc<Self>) {
        self.orphan.set(true);
        let me: Weak<IniChannel> = Rc::downgrade(self);
        let poller = LocalPoller::new(c"qos_ini_orphan", 1000, move || {
            if let Some(c) = me.upgrade() {
                c.abort_overdue();
            }
            PollStatus::Idle
        });
        match poller {
            Ok(pl) => *self.orphan_poller.borrow_mut() = Some(pl),
            Err(e) => tracing::error!("orphan poller: {e}"),
        }
    }

    /// Orphan: aborts vendor commands older than the request time-out (once each).
    pub(crate) fn abort_overdue(&self) {
        if !self.base_abort {
            return;
        }
        let timeout = Nanos::from_micros(lock(&self.shared.eng).opts.request_timeout_us);
        let now = now();
        let overdue: Vec<RequestId> = {
            let aborted = self.aborted.borrow();
            self.vendor
                .borrow()
                .iter()
                .filter(|(_, sent)| now.saturating_sub(*sent) >= timeout)
                .map(|(id, _)| *id)
                .filter(|id| !aborted.contains(id))
                .collect()
        };
        let Some(me) = self.me.upgrade() else {
            return;
        };
        for id in overdue {
            // The abort matches the vendor command by its callback argument; it keeps
            // this orphan until it completes.
            let _ = self.base.abort(id, me.clone(), abort_done);
            self.aborted.borrow_mut().push(id);
        }
    }
}

/// Completion of a vendor command (the engine's, or a probe).
fn vendor_done(id: RequestId, r: VendorReq, buf: DmaBuf, base: BaseIo, success: bool) {
    let status = base.nvme_status();
    drop(base);
    let now = now();
    let inner = &r.chan;
    inner.vendor.borrow_mut().retain(|(x, _)| *x != id);
    let shared = &inner.shared;
    // A refused opcode is an answer: the path works.
    shared.base_outcome(success || (status.sct == 0 && status.sc == wire::status::INVALID_OPCODE));
    match r.kind {
        VendorKind::Engine(seq) => {
            if !success {
                shared.stats.vendor_errors.fetch_add(1, Ordering::Relaxed);
            }
            let mut e = lock(&shared.eng);
            if e.outstanding == Some(seq) {
                e.outstanding = None;
                let reply = if success {
                    StateReply::decode(buf.as_slice())
                        .inspect(|r| {
                            let sparse = r.flags & wire::flags::SPARSE_CREDIT != 0;
                            shared.sparse_credit.store(sparse, Ordering::Relaxed);
                            shared.note_allowance(r);
                        })
                        .map(mirror_for_engine)
                        .map_err(RequestFailure::BadReply)
                } else {
                    // The engine tells "invalid opcode" (a target without the plugin)
                    // from path or transport errors, which it treats like a time-out.
                    Err(RequestFailure::Status {
                        sct: status.sct,
                        sc: status.sc,
                    })
                };
                e.engine.on_reply(reply, now);
                shared
                    .pool_open
                    .store(e.engine.pool_open(), Ordering::Relaxed);
                shared.next_poll.store(0, Ordering::Relaxed);
                shared.version.fetch_add(1, Ordering::Relaxed);
            } else {
                shared.stats.vendor_late.fetch_add(1, Ordering::Relaxed);
            }
        }
        VendorKind::Report => {
            if let Some(r) = success
                .then(|| StateReply::decode(buf.as_slice()).ok())
                .flatten()
            {
                shared.note_allowance(&r);
            }
        }
        VendorKind::Probe(seq) => {
            // Any completion measured a round trip (a failed one only for the p99: its
            // error may not have crossed the target's queues).
            inner
                .group
                .probe_done(seq, success, now.saturating_sub(r.sent), now);
            if !success
                && status.sct == 0
                && status.sc == wire::status::INVALID_OPCODE
                && shared.probe_ok.swap(false, Ordering::Relaxed)
            {
                tracing::warn!(
                    bdev = shared.name.as_str(),
                    "the target refuses the nvmf-qos probe (invalid opcode): this bdev sends no more probes; the pacer gets no latency signal from it"
                );
            }
        }
    }
    if inner.orphan.get() {
        inner.aborted.borrow_mut().retain(|x| *x != id);
        // Dropping `r` lets the orphan go once nothing else of it is in flight.
        return;
    }
    inner.release_held(now);
}

/// Reservation tokens the engine may have released ahead of consumption, at least.
const MIN_RELEASED_OPS: u64 = 4;

/// Adjusts the target's state for `InitiatorEngine` (see `docs/initiator-plugin.md`,
/// "Mirroring paced reservations").
///
/// With `PACED`, the engine allows `R * burst / T` reservation tokens at a time (it
/// decays its tokens to Haechi's `X = R (T - t) / T` on every decision and subtracts
/// the part of `R` not released yet), rounded down twice: below one token it allows
/// none, and a host whose reservation is under one operation per burst (432 per 500 ms
/// with the target's 1 ms burst) never uses its reservation at all (integration test:
/// 271 of 432 operations per period, from global tokens only). The burst the engine
/// sees is therefore widened to release at least `MIN_RELEASED_OPS` operations. The
/// target keeps its own burst; what comes early waits there.
fn mirror_for_engine(mut r: StateReply) -> StateReply {
    if r.flags & wire::flags::PACED != 0 && r.reservation_per_period_ops > 0 {
        let min = (r.period_ns as u128 * MIN_RELEASED_OPS as u128)
            .div_ceil(r.reservation_per_period_ops as u128)
            .min(r.period_ns as u128) as u64;
        r.release_burst_ns = r.release_burst_ns.max(min);
    }
    r
}

/// Completion of an abort of an orphan's vendor command: the orphan is let go once
/// nothing else of it is in flight (dropping `_orphan`).
fn abort_done(_orphan: Rc<IniChannel>, base: BaseIo, _success: bool) {
    drop(base);
}
