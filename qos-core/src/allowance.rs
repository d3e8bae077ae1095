//! Shares held at the initiator (issue 40 item 2): the in-flight allowance a target
//! sends a cooperative host, and the circulation the host reports back. This module
//! owns the protocol's pure decisions on both sides (documented in
//! `docs/wire-protocol.md`, "In-flight allowance"):
//! - the allowance credit in completion dword 0 (marker `0xB`, beside the token credit's
//!   `0xA`) and when a target channel sends one ([`AllowanceGate`]);
//! - the circulation report in GET_STATE's `cdw14` and when an initiator sends one
//!   ([`ReportGate`]);
//! - which allowance credits an initiator applies ([`AllowanceReceiver`]): malformed,
//!   stale (replayed or reordered) and foreign ones are refused, never applied.
//!
//! Why: under `operating_point` over circulation the target splits N* into parts n_i*
//! and holds what a host circulates beyond its part. A host that is told n_i* keeps the
//! rest itself, so the target receives, parses and parks none of it. The target still
//! caps what such a host has at the base at n_i* (`window.rs`): a host that sends more
//! is held there, as any host.

use crate::time::Nanos;
use crate::wire::{self, OPC_GET_STATE, Request, VendorCmd};

/// Marker of an allowance credit in completion dword 0 (bits 31:28).
pub const ALLOWANCE_MARK: u32 = 0xB;
/// The allowance field's value for "no allowance": keep what you like outstanding.
pub const NO_CAP: u16 = 0xFFFF;
/// The largest allowance the field carries.
pub const MAX_CAP: u64 = 0xFFFE;
/// A target channel sends the current allowance again after this long (same sequence
/// number), so an initiator that refused one as stale, or started after it was sent,
/// learns it.
pub const ALLOWANCE_REFRESH: Nanos = Nanos::from_millis(100);
/// An initiator applies a credit whose sequence number looks older than its last one
/// when it applied nothing for this long: it is the target's current allowance (sent
/// again by [`ALLOWANCE_REFRESH`]), not a late copy.
pub const STALE_AFTER: Nanos = Nanos::from_millis(250);
/// A report is sent at most this often while the circulation moves...
pub const REPORT_MIN_GAP: Nanos = Nanos::from_millis(1);
/// ... and again this long after the last one while the host circulates anything.
pub const REPORT_REFRESH: Nanos = Nanos::from_millis(100);
/// The target forgets a report older than this: the host stopped reporting (it died,
/// or an older initiator took its place), and its circulation is again what the target
/// sees of it.
pub const REPORT_TTL: Nanos = Nanos::from_millis(500);

/// The 32-bit tag of a host NQN (FNV-1a), in the state reply; its folded low byte is in
/// every allowance credit, so an initiator refuses a credit meant for another host.
pub fn host_tag(nqn: &str) -> u32 {
    nqn.bytes().fold(0x811c_9dc5u32, |h, b| {
        (h ^ b as u32).wrapping_mul(0x0100_0193)
    })
}

/// The tag's byte in an allowance credit.
pub fn fold_tag(tag: u32) -> u8 {
    (tag ^ tag >> 8 ^ tag >> 16 ^ tag >> 24) as u8
}

/// An allowance credit (completion dword 0):
/// - bits 31..28: the marker `0xB`;
/// - bits 27..24: the low 4 bits of the allowance's sequence number (it moves at each
///   change of the allowance);
/// - bits 23..8: commands the host may have outstanding to this target, `1..=0xFFFE`,
///   or `0xFFFF`: no allowance (0 is malformed: a host that may send nothing would
///   never hear of a new allowance, which comes with completions);
/// - bits 7..0: the folded tag of the host NQN it is meant for ([`fold_tag`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AllowanceCredit {
    pub seq: u8,
    /// `None`: no allowance.
    pub cap: Option<u16>,
    pub host_tag: u8,
}

/// An allowance credit that does not decode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum AllowanceError {
    #[error("allowance credit {0:#010x} allows no command")]
    Zero(u32),
}

impl AllowanceCredit {
    pub fn encode(self) -> u32 {
        let cap = self.cap.map_or(NO_CAP, |c| c.clamp(1, MAX_CAP as u16));
        ALLOWANCE_MARK << 28
            | (self.seq as u32 & 0xF) << 24
            | (cap as u32) << 8
            | self.host_tag as u32
    }

    /// `Ok(None)` when dword 0 is not an allowance credit.
    pub fn decode(cdw0: u32) -> Result<Option<AllowanceCredit>, AllowanceError> {
        if cdw0 >> 28 != ALLOWANCE_MARK {
            return Ok(None);
        }
        let cap = ((cdw0 >> 8) & 0xFFFF) as u16;
        if cap == 0 {
            return Err(AllowanceError::Zero(cdw0));
        }
        Ok(Some(AllowanceCredit {
            seq: ((cdw0 >> 24) & 0xF) as u8,
            cap: (cap != NO_CAP).then_some(cap),
            host_tag: cdw0 as u8,
        }))
    }
}

/// A GET_STATE that reports the host's circulation: its commands outstanding to the
/// target plus those waiting at the initiator, in `cdw14` plus one (0, what every
/// GET_STATE sent before, is "no report").
pub fn encode_report(circulation: u64) -> (u8, VendorCmd) {
    let (opc, mut cmd) = wire::encode_request(Request::GetState);
    cmd.cdw14 = circulation.min(u32::MAX as u64 - 1) as u32 + 1;
    (opc, cmd)
}

/// The circulation a vendor command reports, if it is a GET_STATE with one (the
/// caller has decoded the command: magic and version are checked).
pub fn decode_report(opcode: u8, cmd: &VendorCmd) -> Option<u64> {
    (opcode == OPC_GET_STATE && cmd.cdw14 != 0).then(|| cmd.cdw14 as u64 - 1)
}

/// The allowance word of a host at the target (`window::HostWindow`): its sequence
/// number in the high 32 bits, the allowance in the low ones (`u32::MAX`: none); 0 while
/// it was never set.
pub fn allowance_word(seq: u32, cap: Option<u64>) -> u64 {
    let cap = cap.map_or(u32::MAX, |c| c.clamp(1, MAX_CAP) as u32);
    (seq as u64) << 32 | cap as u64
}

/// Which read and write completions of a cooperative host carry its allowance, on one
/// (QoS bdev, thread) channel of the target: the first after each change of the
/// allowance, and one every [`ALLOWANCE_REFRESH`]. A credit costs NVMe/TCP a response
/// PDU; the allowance moves with the operating point, a few times a second at most.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AllowanceGate {
    last_seq: Option<u32>,
    sent_at: Nanos,
}

impl AllowanceGate {
    /// The credit the completion at `now` carries, if any, for the host's allowance
    /// `word` ([`allowance_word`]); records it when it does.
    pub fn should_send(&mut self, word: u64, host_tag: u8, now: Nanos) -> Option<u32> {
        if word == 0 {
            return None;
        }
        let seq = (word >> 32) as u32;
        if self.last_seq == Some(seq) && now.saturating_sub(self.sent_at) < ALLOWANCE_REFRESH {
            return None;
        }
        self.last_seq = Some(seq);
        self.sent_at = now;
        let cap = word as u32;
        Some(
            AllowanceCredit {
                seq: seq as u8 & 0xF,
                cap: (cap != u32::MAX).then_some(cap.min(MAX_CAP as u32) as u16),
                host_tag,
            }
            .encode(),
        )
    }
}

/// What an initiator did with an allowance credit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Received {
    /// Applied: the new allowance (`None`: none).
    Applied(Option<u64>),
    /// Another channel's copy of the allowance it has: nothing to do.
    Duplicate,
    /// Refused: its sequence number is older than the last one applied (a replayed or
    /// reordered credit).
    Stale,
    /// Refused: meant for another host NQN.
    Foreign,
    /// Refused: it does not decode, or contradicts the last one (same sequence number,
    /// another allowance).
    Malformed,
    /// Refused: the target did not announce allowances (`flags::ALLOWANCE`).
    Unannounced,
}

impl Received {
    /// A credit refused as bad input (logged and counted by the initiator).
    pub fn is_refusal(self) -> bool {
        !matches!(self, Received::Applied(_) | Received::Duplicate)
    }
}

/// An initiator's view of its allowance credits: applies each new one once, in order.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AllowanceReceiver {
    last: Option<(u8, Option<u16>)>,
    applied_at: Nanos,
}

impl AllowanceReceiver {
    /// Decides on dword 0 of a completion that carries the allowance marker.
    /// `announced`: the host tag of the target's last state reply, if it announced
    /// allowances.
    pub fn receive(&mut self, cdw0: u32, announced: Option<u32>, now: Nanos) -> Received {
        let c = match AllowanceCredit::decode(cdw0) {
            Ok(Some(c)) => c,
            Ok(None) | Err(_) => return Received::Malformed,
        };
        let Some(tag) = announced else {
            return Received::Unannounced;
        };
        if c.host_tag != fold_tag(tag) {
            return Received::Foreign;
        }
        if let Some((seq, cap)) = self.last {
            let ahead = c.seq.wrapping_sub(seq) & 0xF;
            if ahead == 0 {
                return if cap == c.cap {
                    Received::Duplicate
                } else {
                    Received::Malformed
                };
            }
            if ahead >= 8 && now.saturating_sub(self.applied_at) < STALE_AFTER {
                return Received::Stale;
            }
        }
        self.last = Some((c.seq, c.cap));
        self.applied_at = now;
        Received::Applied(c.cap.map(u64::from))
    }
}

/// When an initiator reports its circulation: when it moved by a sixteenth or more
/// (at least one command), at most every [`REPORT_MIN_GAP`], and every
/// [`REPORT_REFRESH`] while it is not zero (the target forgets a report after
/// [`REPORT_TTL`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReportGate {
    last: Option<u64>,
    sent_at: Nanos,
}

impl ReportGate {
    /// Whether to report `circulation` at `now`; records it when so.
    pub fn due(&mut self, circulation: u64, now: Nanos) -> bool {
        let since = now.saturating_sub(self.sent_at);
        let due = match self.last {
            None => circulation > 0,
            Some(l) => {
                let moved = l.abs_diff(circulation) >= (l / 16).max(1);
                (moved && since >= REPORT_MIN_GAP)
                    || ((l > 0 || circulation > 0) && since >= REPORT_REFRESH)
            }
        };
        if due {
            self.last = Some(circulation);
            self.sent_at = now;
        }
        due
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const TAG: u32 = 0x1234_5678;

    fn credit(seq: u8, cap: u16) -> u32 {
        AllowanceCredit {
            seq,
            cap: Some(cap),
            host_tag: fold_tag(TAG),
        }
        .encode()
    }

    #[test]
    fn the_token_credit_is_no_allowance_and_zero_is_malformed() {
        let token = wire::Credit::new(3, 100, 0).encode();
        assert_eq!(AllowanceCredit::decode(token), Ok(None));
        assert_eq!(AllowanceCredit::decode(0), Ok(None));
        assert!(AllowanceCredit::decode(0xB000_00AA).is_err());
        let mut r = AllowanceReceiver::default();
        assert_eq!(
            r.receive(0xB000_00AA, Some(TAG), Nanos(1)),
            Received::Malformed
        );
        assert_eq!(r.receive(token, Some(TAG), Nanos(1)), Received::Malformed);
    }

    #[test]
    fn a_report_is_a_get_state_and_zero_is_none() {
        let (op, cmd) = encode_report(0);
        assert_eq!(
            wire::decode_request(op, &cmd, wire::REPLY_LEN),
            Ok(Request::GetState)
        );
        assert_eq!(decode_report(op, &cmd), Some(0));
        assert_eq!(decode_report(op, &encode_report(64).1), Some(64));
        let (op, plain) = wire::encode_request(Request::GetState);
        assert_eq!(decode_report(op, &plain), None);
        // An ACQUIRE's cdw14 is operations wanted, never a report.
        let (op, acq) = wire::encode_request(Request::Acquire { ops: 5, bytes: 0 });
        assert_eq!(decode_report(op, &acq), None);
    }

    #[test]
    fn the_receiver_applies_news_once_and_refuses_the_rest() {
        let mut r = AllowanceReceiver::default();
        let t = Nanos::from_millis(1);
        assert_eq!(r.receive(credit(1, 20), None, t), Received::Unannounced);
        let other = AllowanceCredit {
            seq: 1,
            cap: Some(20),
            host_tag: fold_tag(TAG) ^ 1,
        };
        assert_eq!(r.receive(other.encode(), Some(TAG), t), Received::Foreign);
        assert_eq!(
            r.receive(credit(1, 20), Some(TAG), t),
            Received::Applied(Some(20))
        );
        assert_eq!(r.receive(credit(1, 20), Some(TAG), t), Received::Duplicate);
        assert_eq!(r.receive(credit(1, 21), Some(TAG), t), Received::Malformed);
        assert_eq!(
            r.receive(credit(2, 30), Some(TAG), t),
            Received::Applied(Some(30))
        );
        // Replayed: the first again.
        assert_eq!(r.receive(credit(1, 20), Some(TAG), t), Received::Stale);
        // Wraps: 15 -> 0 is news.
        let mut r = AllowanceReceiver::default();
        assert_eq!(
            r.receive(credit(15, 5), Some(TAG), t),
            Received::Applied(Some(5))
        );
        assert_eq!(
            r.receive(credit(0, 6), Some(TAG), t),
            Received::Applied(Some(6))
        );
        // A refresh after a long silence is the target's current allowance.
        assert_eq!(
            r.receive(credit(14, 7), Some(TAG), t.saturating_add(STALE_AFTER)),
            Received::Applied(Some(7))
        );
        let none = AllowanceCredit {
            seq: 15,
            cap: None,
            host_tag: fold_tag(TAG),
        };
        assert_eq!(
            r.receive(none.encode(), Some(TAG), t.saturating_add(STALE_AFTER)),
            Received::Applied(None)
        );
    }

    #[test]
    fn the_gate_sends_each_change_once_per_channel_and_refreshes() {
        let mut g = AllowanceGate::default();
        let t = Nanos::from_secs(1);
        assert_eq!(g.should_send(0, 7, t), None, "never set: nothing");
        let w = allowance_word(1, Some(20));
        let c = g.should_send(w, 7, t).expect("first");
        assert_eq!(
            AllowanceCredit::decode(c),
            Ok(Some(AllowanceCredit {
                seq: 1,
                cap: Some(20),
                host_tag: 7
            }))
        );
        assert_eq!(g.should_send(w, 7, t.saturating_add(Nanos(1))), None);
        let w2 = allowance_word(2, None);
        let c2 = g
            .should_send(w2, 7, t.saturating_add(Nanos(2)))
            .expect("change");
        assert_eq!(AllowanceCredit::decode(c2).unwrap().unwrap().cap, None);
        assert_eq!(
            g.should_send(w2, 7, t.saturating_add(ALLOWANCE_REFRESH)),
            None
        );
        assert!(
            g.should_send(
                w2,
                7,
                t.saturating_add(Nanos(2)).saturating_add(ALLOWANCE_REFRESH)
            )
            .is_some()
        );
    }

    #[test]
    fn reports_follow_the_circulation_sparsely() {
        let mut g = ReportGate::default();
        let t = Nanos::from_secs(1);
        assert!(!g.due(0, t), "nothing to report yet");
        assert!(g.due(64, t));
        assert!(
            !g.due(61, t.saturating_add(REPORT_MIN_GAP)),
            "less than a sixteenth"
        );
        assert!(!g.due(40, t.saturating_add(Nanos(10))), "too soon");
        assert!(g.due(40, t.saturating_add(REPORT_MIN_GAP)));
        assert!(
            g.due(
                40,
                t.saturating_add(REPORT_MIN_GAP)
                    .saturating_add(REPORT_REFRESH)
            )
        );
        assert!(
            g.due(0, t.saturating_add(Nanos::from_secs(1))),
            "idle is news"
        );
        assert!(
            !g.due(0, t.saturating_add(Nanos::from_secs(2))),
            "and stays quiet"
        );
        assert!(g.due(1, t.saturating_add(Nanos::from_secs(3))));
    }

    proptest! {
        /// Every credit the gate encodes decodes to what it was given, and the
        /// receiver applies a sequence of changes in order, each once.
        #[test]
        fn gate_and_receiver_agree(caps in proptest::collection::vec(proptest::option::of(1u64..100_000), 1..40)) {
            let mut r = AllowanceReceiver::default();
            let mut now = Nanos::from_secs(1);
            let tag = host_tag("nqn.2014-08.org.example:h1");
            for (i, cap) in caps.iter().enumerate() {
                let mut g = AllowanceGate::default();
                let w = allowance_word(i as u32 + 1, *cap);
                let c = g.should_send(w, fold_tag(tag), now).expect("news");
                let want = cap.map(|c| c.min(MAX_CAP));
                prop_assert_eq!(r.receive(c, Some(tag), now), Received::Applied(want));
                prop_assert_eq!(r.receive(c, Some(tag), now), Received::Duplicate);
                now = now.saturating_add(Nanos(1000));
            }
        }

        /// Any dword 0 is decided without a panic; only the marker's are candidates.
        #[test]
        fn any_dword_is_safe(cdw0 in any::<u32>()) {
            let mut r = AllowanceReceiver::default();
            let got = r.receive(cdw0, Some(TAG), Nanos(5));
            if cdw0 >> 28 != ALLOWANCE_MARK {
                prop_assert_eq!(got, Received::Malformed);
            }
        }
    }
}
