//! The token protocol between a cooperative initiator and the target plugin, version 1:
//! two vendor-specific NVMe I/O commands and a credit field in the completion of reads
//! and writes. Documented for operators and implementers in `docs/wire-protocol.md`; this
//! module is the one encoder and decoder both plugins use.
//!
//! Vendor I/O commands reach the namespace's bdev (our QoS bdev) on the host's own
//! I/O queue pair, so they are authenticated by the namespace masking that binds the
//! QoS bdev to one host: a host can only ever see and move its own tokens.

use crate::time::Nanos;

/// NVMe generic status codes the target answers vendor commands with.
pub mod status {
    pub const SUCCESS: u8 = 0x00;
    pub const INVALID_OPCODE: u8 = 0x01;
    pub const INVALID_FIELD: u8 = 0x02;
    pub const DATA_SGL_LENGTH_INVALID: u8 = 0x0F;
}

pub const VERSION: u16 = 1;
/// `cdw10` of every vendor command: ASCII "QOS1", so that a stray vendor opcode of
/// another product is never mistaken for ours.
pub const CMD_MAGIC: u32 = u32::from_le_bytes(*b"QOS1");
/// First field of a [`StateReply`]: ASCII "QOSR".
pub const REPLY_MAGIC: u32 = u32::from_le_bytes(*b"QOSR");
/// Read the host's period state. Controller-to-host data (opcode bits 1:0 = 10).
pub const OPC_GET_STATE: u8 = 0xC2;
/// Acquire global tokens in a batch, then read the state. Controller-to-host data.
pub const OPC_ACQUIRE: u8 = 0xC6;
/// Length of the reply buffer both commands fill.
pub const REPLY_LEN: usize = 256;
/// Bytes in `cdw15` of an acquire are counted in units of this many bytes.
pub const ACQUIRE_BYTES_UNIT: u64 = 4096;

/// Flags of a [`StateReply`].
pub mod flags {
    /// The QoS bdev is bound to a host configured in a domain.
    pub const CONFIGURED: u16 = 1 << 0;
    /// A limit is enforced on the host.
    pub const LIMITED: u16 = 1 << 1;
    /// Token conversion is on (Haechi mode, not basic).
    pub const CONVERSION: u16 = 1 << 2;
    /// Reservations are released paced over the period (see `release_burst_ns`).
    pub const PACED: u16 = 1 << 3;
    /// The target sends completion credits sparsely ([`super::CreditGate`]): only when
    /// the host's allowance changed, so an initiator should apply every credit it gets
    /// (none is a sample it may skip). Version 1 targets before it sent one in every
    /// read and write.
    pub const SPARSE_CREDIT: u16 = 1 << 4;
    /// The target sends in-flight allowances (completion dword 0 with the marker
    /// `0xB`), reads a circulation report in GET_STATE's `cdw14`, and puts the host's
    /// tag in `host_tag` (see [`crate::allowance`]). Without it `host_tag` is 0.
    pub const ALLOWANCE: u16 = 1 << 5;
}

/// The command dwords 10..=15 of a vendor command.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct VendorCmd {
    pub cdw10: u32,
    pub cdw11: u32,
    pub cdw12: u32,
    pub cdw13: u32,
    pub cdw14: u32,
    pub cdw15: u32,
}

/// A decoded vendor command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Request {
    GetState,
    /// Ask for `ops` operations and `bytes` bytes of global tokens.
    Acquire {
        ops: u64,
        bytes: u64,
    },
}

/// Why a vendor command was refused; maps to an NVMe status code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    #[error("opcode {0:#04x} is not a nvmf-qos command")]
    UnknownOpcode(u8),
    #[error("cdw10 {0:#010x} is not the nvmf-qos magic")]
    BadMagic(u32),
    #[error("protocol version {0} is not supported (this target speaks {VERSION})")]
    BadVersion(u32),
    #[error("reply buffer of {0} bytes is shorter than {REPLY_LEN}")]
    ShortBuffer(usize),
}

impl RequestError {
    /// The NVMe status code (generic command status type) to complete with.
    pub fn status_code(self) -> u8 {
        match self {
            RequestError::UnknownOpcode(_) => status::INVALID_OPCODE,
            RequestError::BadMagic(_) | RequestError::BadVersion(_) => status::INVALID_FIELD,
            RequestError::ShortBuffer(_) => status::DATA_SGL_LENGTH_INVALID,
        }
    }
}

/// Whether `opcode` is one of ours (the plugin forwards every other opcode).
pub fn is_qos_opcode(opcode: u8) -> bool {
    opcode == OPC_GET_STATE || opcode == OPC_ACQUIRE
}

/// Decodes a vendor command; `buf_len` is the length of its data buffer.
pub fn decode_request(
    opcode: u8,
    cmd: &VendorCmd,
    buf_len: usize,
) -> Result<Request, RequestError> {
    if !is_qos_opcode(opcode) {
        return Err(RequestError::UnknownOpcode(opcode));
    }
    if cmd.cdw10 != CMD_MAGIC {
        return Err(RequestError::BadMagic(cmd.cdw10));
    }
    if cmd.cdw11 != VERSION as u32 {
        return Err(RequestError::BadVersion(cmd.cdw11));
    }
    if buf_len < REPLY_LEN {
        return Err(RequestError::ShortBuffer(buf_len));
    }
    Ok(match opcode {
        OPC_GET_STATE => Request::GetState,
        _ => Request::Acquire {
            ops: cmd.cdw14 as u64,
            bytes: cmd.cdw15 as u64 * ACQUIRE_BYTES_UNIT,
        },
    })
}

/// Encodes a request (initiator side). Byte counts round up to the 4 KiB unit.
pub fn encode_request(req: Request) -> (u8, VendorCmd) {
    let mut cmd = VendorCmd {
        cdw10: CMD_MAGIC,
        cdw11: VERSION as u32,
        ..VendorCmd::default()
    };
    match req {
        Request::GetState => (OPC_GET_STATE, cmd),
        Request::Acquire { ops, bytes } => {
            // Dwords 12 and 13 stay zero: SPDK v25.09's bdev_nvme reads them as an
            // accel sequence when it fails a passthru command before sending it.
            cmd.cdw14 = ops.min(u32::MAX as u64) as u32;
            cmd.cdw15 = bytes.div_ceil(ACQUIRE_BYTES_UNIT).min(u32::MAX as u64) as u32;
            (OPC_ACQUIRE, cmd)
        }
    }
}

/// The 256-byte reply of both vendor commands (little-endian): an 8-byte header
/// (magic, version, flags) and 31 64-bit words, of which the last 13 are reserved (0).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StateReply {
    pub flags: u16,
    pub epoch: u64,
    pub period_ns: u64,
    pub elapsed_ns: u64,
    pub reservation_left_ops: u64,
    pub reservation_left_bytes: u64,
    pub credit_ops: u64,
    pub credit_bytes: u64,
    pub limit_left_ops: u64,
    pub limit_left_bytes: u64,
    pub reservation_per_period_ops: u64,
    pub reservation_per_period_bytes: u64,
    pub granted_ops: u64,
    pub granted_bytes: u64,
    pub global_available_ops: u64,
    /// The target's cost model, so the initiator counts tokens as the target does.
    pub write_weight_milli: u32,
    pub size_unit: u32,
    /// With paced release, how far ahead of its reservation rate the host may run.
    pub release_burst_ns: u64,
    /// The host's limit per period (total class; `u64::MAX` when unlimited): with
    /// paced release the allowance comes out over the period like the reservation.
    pub limit_per_period_ops: u64,
    pub limit_per_period_bytes: u64,
    /// With `flags::ALLOWANCE`: the tag of the host NQN the QoS bdev is bound to
    /// ([`crate::allowance::host_tag`]), at offset 152 (bytes the first version-1
    /// targets leave 0).
    pub host_tag: u32,
}

/// Offset of `host_tag` in the reply: the first reserved byte of version 1.
const HOST_TAG_AT: usize = 152;

/// A reply that does not decode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ReplyError {
    #[error("reply of {0} bytes is shorter than {REPLY_LEN}")]
    Short(usize),
    #[error("reply magic {0:#010x} is wrong: the target does not speak nvmf-qos")]
    BadMagic(u32),
    #[error("reply version {0} is not supported")]
    BadVersion(u16),
}

impl StateReply {
    pub fn encode(&self, out: &mut [u8]) -> Result<(), RequestError> {
        if out.len() < REPLY_LEN {
            return Err(RequestError::ShortBuffer(out.len()));
        }
        out[..4].copy_from_slice(&REPLY_MAGIC.to_le_bytes());
        out[4..6].copy_from_slice(&VERSION.to_le_bytes());
        out[6..8].copy_from_slice(&self.flags.to_le_bytes());
        for (i, v) in self.words().iter().enumerate() {
            out[8 + i * 8..16 + i * 8].copy_from_slice(&v.to_le_bytes());
        }
        out[8 + 18 * 8..REPLY_LEN].fill(0);
        out[HOST_TAG_AT..HOST_TAG_AT + 4].copy_from_slice(&self.host_tag.to_le_bytes());
        Ok(())
    }

    pub fn decode(buf: &[u8]) -> Result<StateReply, ReplyError> {
        if buf.len() < REPLY_LEN {
            return Err(ReplyError::Short(buf.len()));
        }
        let magic = u32::from_le_bytes(buf[..4].try_into().expect("4 bytes"));
        if magic != REPLY_MAGIC {
            return Err(ReplyError::BadMagic(magic));
        }
        let version = u16::from_le_bytes(buf[4..6].try_into().expect("2 bytes"));
        if version != VERSION {
            return Err(ReplyError::BadVersion(version));
        }
        let w =
            |i: usize| u64::from_le_bytes(buf[8 + i * 8..16 + i * 8].try_into().expect("8 bytes"));
        Ok(StateReply {
            flags: u16::from_le_bytes(buf[6..8].try_into().expect("2 bytes")),
            epoch: w(0),
            period_ns: w(1),
            elapsed_ns: w(2),
            reservation_left_ops: w(3),
            reservation_left_bytes: w(4),
            credit_ops: w(5),
            credit_bytes: w(6),
            limit_left_ops: w(7),
            limit_left_bytes: w(8),
            reservation_per_period_ops: w(9),
            reservation_per_period_bytes: w(10),
            granted_ops: w(11),
            granted_bytes: w(12),
            global_available_ops: w(13),
            write_weight_milli: w(14) as u32,
            size_unit: (w(14) >> 32) as u32,
            release_burst_ns: w(15),
            limit_per_period_ops: w(16),
            limit_per_period_bytes: w(17),
            host_tag: u32::from_le_bytes(
                buf[HOST_TAG_AT..HOST_TAG_AT + 4]
                    .try_into()
                    .expect("4 bytes"),
            ),
        })
    }

    fn words(&self) -> [u64; 18] {
        [
            self.epoch,
            self.period_ns,
            self.elapsed_ns,
            self.reservation_left_ops,
            self.reservation_left_bytes,
            self.credit_ops,
            self.credit_bytes,
            self.limit_left_ops,
            self.limit_left_bytes,
            self.reservation_per_period_ops,
            self.reservation_per_period_bytes,
            self.granted_ops,
            self.granted_bytes,
            self.global_available_ops,
            self.write_weight_milli as u64 | (self.size_unit as u64) << 32,
            self.release_burst_ns,
            self.limit_per_period_ops,
            self.limit_per_period_bytes,
        ]
    }
}

/// The credit a target piggybacks in completion dword 0 of reads and writes:
/// - bits 31..28: the marker 0xA (a target without the plugin returns 0);
/// - bits 27..24: the low 4 bits of the period epoch, so the initiator notices a
///   roll-over without asking;
/// - bits 23..8: the host's tokens at the target (reservation left plus credit,
///   operations), saturating at 65535 ("at least that many");
/// - bits 7..0: commands of the host held at the target now, saturating at 255. A
///   cooperative initiator that sees a backlog stops sending until it has drained: its
///   token count cannot see commands the target has not admitted yet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Credit {
    pub epoch_low: u8,
    pub available_ops: u32,
    pub held: u8,
}

const CREDIT_MARK: u32 = 0xA;
pub const CREDIT_MAX_OPS: u32 = (1 << 16) - 1;

impl Credit {
    pub fn new(epoch: u64, available_ops: u64, held: u64) -> Self {
        Credit {
            epoch_low: (epoch & 0xF) as u8,
            available_ops: available_ops.min(CREDIT_MAX_OPS as u64) as u32,
            held: held.min(u8::MAX as u64) as u8,
        }
    }
    pub fn encode(self) -> u32 {
        CREDIT_MARK << 28
            | ((self.epoch_low as u32 & 0xF) << 24)
            | ((self.available_ops & CREDIT_MAX_OPS) << 8)
            | self.held as u32
    }
    /// `None` when dword 0 carries no credit (a plain target, or another command).
    pub fn decode(cdw0: u32) -> Option<Credit> {
        (cdw0 >> 28 == CREDIT_MARK).then_some(Credit {
            epoch_low: ((cdw0 >> 24) & 0xF) as u8,
            available_ops: (cdw0 >> 8) & CREDIT_MAX_OPS,
            held: (cdw0 & 0xFF) as u8,
        })
    }
}

/// A credit that differs from the last one sent only in its available operations is
/// sent this long after it (drift correction; see [`CreditGate`]).
pub const CREDIT_REFRESH: Nanos = Nanos::from_millis(50);

/// Which read and write completions of a cooperative host carry its credit, on one
/// (QoS bdev, thread) channel of the target. A non-zero dword 0 costs NVMe/TCP a
/// capsule-response PDU after a read's data (the C2H SUCCESS flag needs dword 0 and 1
/// zero), so the credit goes out only when it tells the initiator something it cannot
/// work out itself; otherwise dword 0 stays 0, which an initiator takes as "no news".
/// Sent when, against the last credit sent on this channel:
/// - none was sent yet;
/// - the epoch's low bits changed (a period roll-over);
/// - commands of the host are held at the target now, on every completion, or the held
///   count changed (so also the completion that sees the backlog drained);
/// - the available operations differ, unsaturated, and [`CREDIT_REFRESH`] passed.
///
/// Why every completion while commands are held: a held command is the one sign the
/// target has that the initiator's view of the host's tokens is ahead of its own (its
/// copy of the paced schedule runs early, it ignored a credit of the next period
/// because its own period had not rolled over yet, or it rolled over first and forgot
/// the backlog). Each command it sends on that view is held too, so until the
/// initiator has the held count and the lower allowance it must hear them at once, as
/// it did when every completion carried a credit (a first version sent only changes of
/// the held count, and an unchanged one every 5 ms). A host with commands held is
/// being held back by its tokens, not by the fabric, so the PDU these credits cost it
/// takes nothing it could have used.
///
/// Otherwise silence is right even when the allowance is low: available operations
/// that fall are no news by themselves (the host's own commands take them, and its
/// initiator deducts each command when it sends it, so its view is already lower than
/// the target's by what is in transit), and the count includes the reservation not yet
/// released, so with paced release it is low only near a period's end, not when the
/// next command would be held. What the initiator cannot see either makes the target
/// hold commands, reported from the next completion on, or is corrected within
/// [`CREDIT_REFRESH`]. A host with nothing held gets about one credit per period and
/// one per [`CREDIT_REFRESH`] per channel: at hundreds of thousands of reads per
/// second, well under one read in a thousand.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CreditGate {
    last: Option<Credit>,
    sent_at: Nanos,
}

impl CreditGate {
    /// Whether the completion at `now` carries credit `c`; records it when it does.
    pub fn should_send(&mut self, c: Credit, now: Nanos) -> bool {
        let send = match self.last {
            None => true,
            Some(l) => {
                l.epoch_low != c.epoch_low
                    || c.held > 0
                    || l.held != c.held
                    || (l.available_ops != c.available_ops
                        && (c.available_ops < CREDIT_MAX_OPS || l.available_ops < CREDIT_MAX_OPS)
                        && now.saturating_sub(self.sent_at) >= CREDIT_REFRESH)
            }
        };
        if send {
            self.last = Some(c);
            self.sent_at = now;
        }
        send
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn opcodes_transfer_controller_to_host() {
        const { assert!(OPC_GET_STATE & 0b11 == 0b10 && OPC_ACQUIRE & 0b11 == 0b10) };
        const { assert!(OPC_GET_STATE >= 0x80 && OPC_ACQUIRE >= 0x80) };
    }

    #[test]
    fn request_round_trip_and_refusals() {
        let (op, cmd) = encode_request(Request::Acquire {
            ops: 1000,
            bytes: 5000,
        });
        assert_eq!(
            decode_request(op, &cmd, REPLY_LEN),
            Ok(Request::Acquire {
                ops: 1000,
                bytes: 8192
            })
        );
        let (op, cmd) = encode_request(Request::GetState);
        assert_eq!(decode_request(op, &cmd, 4096), Ok(Request::GetState));
        assert_eq!(
            decode_request(op, &cmd, 64),
            Err(RequestError::ShortBuffer(64))
        );
        assert_eq!(
            decode_request(0xC4, &cmd, REPLY_LEN)
                .unwrap_err()
                .status_code(),
            status::INVALID_OPCODE
        );
        let bad = VendorCmd { cdw10: 7, ..cmd };
        assert_eq!(
            decode_request(op, &bad, REPLY_LEN)
                .unwrap_err()
                .status_code(),
            status::INVALID_FIELD
        );
        let bad = VendorCmd { cdw11: 2, ..cmd };
        assert_eq!(
            decode_request(op, &bad, REPLY_LEN),
            Err(RequestError::BadVersion(2))
        );
    }

    #[test]
    fn reply_refuses_foreign_data() {
        assert_eq!(
            StateReply::decode(&[0u8; REPLY_LEN]),
            Err(ReplyError::BadMagic(0))
        );
        assert_eq!(StateReply::decode(&[0u8; 12]), Err(ReplyError::Short(12)));
    }

    #[test]
    fn plain_completion_has_no_credit() {
        assert_eq!(Credit::decode(0), None);
        assert_eq!(Credit::decode(0x1234), None);
    }

    proptest! {
        #[test]
        fn reply_round_trips(words in proptest::array::uniform14(any::<u64>()), fl in any::<u16>()) {
            let r = StateReply {
                flags: fl, epoch: words[0], period_ns: words[1], elapsed_ns: words[2],
                reservation_left_ops: words[3], reservation_left_bytes: words[4], credit_ops: words[5],
                credit_bytes: words[6], limit_left_ops: words[7], limit_left_bytes: words[8],
                reservation_per_period_ops: words[9], reservation_per_period_bytes: words[10],
                granted_ops: words[11], granted_bytes: words[12], global_available_ops: words[13],
                write_weight_milli: fl as u32 * 3, size_unit: words[0] as u32,
                release_burst_ns: words[1] ^ words[2],
                limit_per_period_ops: words[3] ^ words[4],
                limit_per_period_bytes: words[5] ^ words[6],
                host_tag: words[7] as u32,
            };
            let mut buf = [0u8; REPLY_LEN];
            r.encode(&mut buf).unwrap();
            prop_assert_eq!(StateReply::decode(&buf), Ok(r));
        }

        #[test]
        fn credit_round_trips(epoch in any::<u64>(), ops in any::<u64>(), held in any::<u64>()) {
            let c = Credit::new(epoch, ops, held);
            let d = Credit::decode(c.encode()).unwrap();
            prop_assert_eq!(d, c);
            prop_assert_eq!(d.available_ops as u64, ops.min(CREDIT_MAX_OPS as u64));
            prop_assert_eq!(d.epoch_low as u64, epoch & 0xF);
            prop_assert_eq!(d.held as u64, held.min(255));
        }

        /// Whatever the sequence, a credit that differs from the last one sent in its
        /// epoch or held count is sent, every completion while commands are held carries
        /// one, any change is sent within `CREDIT_REFRESH`, and nothing else is.
        #[test]
        fn credit_gate_never_hides_epoch_or_held(
            steps in prop::collection::vec((0u64..3, 0u64..70_000, 0u64..4, 0u64..20_000_000), 1..200)
        ) {
            let mut g = CreditGate::default();
            let mut now = Nanos(0);
            let mut last_sent: Option<(Credit, Nanos)> = None;
            for (epoch, avail, held, dt) in steps {
                now = now.saturating_add(Nanos(dt));
                let c = Credit::new(epoch, avail, held);
                let sent = g.should_send(c, now);
                match last_sent {
                    None => prop_assert!(sent),
                    Some((l, at)) => {
                        let since = now.saturating_sub(at);
                        if l.epoch_low != c.epoch_low || l.held != c.held {
                            prop_assert!(sent);
                        }
                        if c.held > 0 {
                            prop_assert!(sent);
                        }
                        if c != l && c.available_ops < CREDIT_MAX_OPS && since >= CREDIT_REFRESH {
                            prop_assert!(sent);
                        }
                        if c.held == 0 && l.held == 0 && c.epoch_low == l.epoch_low
                            && (c == l || since < CREDIT_REFRESH)
                        {
                            prop_assert!(!sent);
                        }
                    }
                }
                if sent {
                    last_sent = Some((c, now));
                }
            }
        }
    }

    #[test]
    fn a_steady_saturated_credit_goes_once_per_epoch() {
        let mut g = CreditGate::default();
        let mut sent = 0;
        for k in 0..100_000u64 {
            // 1 us apart, a new epoch every 10 ms; 70,000 ops saturate the field.
            let now = Nanos(k * 1000);
            let c = Credit::new(k / 10_000, 70_000 - (k % 10_000) / 4, 0);
            sent += g.should_send(c, now) as u32;
        }
        assert_eq!(sent, 10);
    }

    #[test]
    fn a_falling_allowance_goes_once_per_refresh() {
        let mut g = CreditGate::default();
        let mut sent = Vec::new();
        // One completion per us, each taking an operation: 100 ms, one epoch.
        for k in 0..100_000u64 {
            let c = Credit::new(7, 100_000 - k, 0);
            if g.should_send(c, Nanos(k * 1000)) {
                sent.push(k);
            }
        }
        // The first, then once the field is unsaturated and the refresh passed.
        assert_eq!(sent, vec![0, 50_000]);
    }

    #[test]
    fn every_completion_carries_the_credit_while_commands_are_held() {
        let mut g = CreditGate::default();
        let quiet = Credit::new(1, 5000, 0);
        assert!(g.should_send(quiet, Nanos(0)));
        assert!(!g.should_send(Credit::new(1, 4990, 0), Nanos(1000)));
        // The target holds a command: this completion and every one after it carries
        // the credit, unchanged or not, 1 us apart.
        let held = Credit::new(1, 0, 3);
        for k in 2..100u64 {
            assert!(g.should_send(held, Nanos(k * 1000)), "completion {k}");
        }
        assert!(g.should_send(Credit::new(1, 0, 1), Nanos(100_000)));
        // The backlog drained: sent at once, then silent while nothing changes.
        let idle = Credit::new(1, 100, 0);
        assert!(g.should_send(idle, Nanos(101_000)));
        assert!(!g.should_send(idle, Nanos(102_000)));
        assert!(!g.should_send(Credit::new(1, 40, 0), Nanos(103_000)));
        assert!(!g.should_send(idle, Nanos(1_000_000_000)));
        // A new epoch is sent at once, an allowance that moved only after the refresh.
        assert!(g.should_send(Credit::new(2, 100, 0), Nanos(1_000_000_001)));
        assert!(!g.should_send(Credit::new(2, 60, 0), Nanos(1_000_000_002)));
        assert!(g.should_send(Credit::new(2, 50, 0), Nanos(1_050_000_001)));
    }

    #[test]
    fn a_busy_host_with_nothing_held_stays_sparse_even_near_zero() {
        // 100,000 completions 1 us apart, each taking an operation, the allowance
        // running down to 0 and staying there (a reader between two acquisitions):
        // nothing held, so no credit but the first and one per refresh.
        let mut g = CreditGate::default();
        let mut sent = 0;
        for k in 0..100_000u64 {
            let c = Credit::new(3, 20_000u64.saturating_sub(k), 0);
            sent += g.should_send(c, Nanos(k * 1000)) as u32;
        }
        assert_eq!(sent, 2);
    }
}
