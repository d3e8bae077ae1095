//! The fuzz targets that build without SPDK, each a function of the raw input that
//! panics on a finding: the token protocol as the target decodes it (vendor commands)
//! and as the initiator decodes it (state replies, completion credits), and the lab's
//! scenario files (parsed, then built into a monitor with their groups and hosts).

use qos_core::wire::{self, Credit, Request, StateReply, VendorCmd};
use qos_core::{ExcessSharing, Monitor, Nanos, ReservationRelease, TokenMode};
use qos_lab::scenario::Scenario;

fn u32_at(b: &[u8], i: usize) -> u32 {
    let mut w = [0u8; 4];
    for (k, x) in w.iter_mut().enumerate() {
        *x = b.get(i + k).copied().unwrap_or(0);
    }
    u32::from_le_bytes(w)
}

/// A vendor command as the target plugin sees it: byte 0 the opcode, bytes 1..25 the
/// dwords 10..15, bytes 25..27 the data buffer's length. What decodes re-encodes to the
/// same request; what does not maps to an NVMe status of ours.
pub fn vendor_command(b: &[u8]) {
    let opcode = b.first().copied().unwrap_or(0);
    let cmd = VendorCmd {
        cdw10: u32_at(b, 1),
        cdw11: u32_at(b, 5),
        cdw12: u32_at(b, 9),
        cdw13: u32_at(b, 13),
        cdw14: u32_at(b, 17),
        cdw15: u32_at(b, 21),
    };
    let buf_len = (u32_at(b, 25) & 0xFFFF) as usize;
    match wire::decode_request(opcode, &cmd, buf_len) {
        Ok(req) => {
            let (opc, again) = wire::encode_request(req);
            let round = wire::decode_request(opc, &again, buf_len);
            assert_eq!(round, Ok(req), "re-encoding {req:?} changed it");
            if let Request::Acquire { bytes, .. } = req {
                assert_eq!(bytes % wire::ACQUIRE_BYTES_UNIT, 0);
            }
        }
        Err(e) => {
            let sc = e.status_code();
            assert!(
                [
                    wire::status::INVALID_OPCODE,
                    wire::status::INVALID_FIELD,
                    wire::status::DATA_SGL_LENGTH_INVALID
                ]
                .contains(&sc),
                "{e}: status {sc:#x}"
            );
            assert!(!e.to_string().is_empty());
        }
    }
}

/// A state reply as the initiator decodes it: what decodes re-encodes to a reply that
/// decodes to the same.
pub fn state_reply(b: &[u8]) {
    if let Ok(r) = StateReply::decode(b) {
        let mut buf = [0u8; wire::REPLY_LEN];
        r.encode(&mut buf).expect("a full-size buffer");
        assert_eq!(StateReply::decode(&buf), Ok(r));
    }
}

/// Completion dword 0 as the initiator decodes it (a credit, or not ours).
pub fn credit(b: &[u8]) {
    let cdw0 = u32_at(b, 0);
    if let Some(c) = Credit::decode(cdw0) {
        assert_eq!(Credit::decode(c.encode()), Some(c), "{cdw0:#010x}");
        assert!(c.epoch_low < 16 && c.available_ops <= wire::CREDIT_MAX_OPS);
    }
}

/// A lab scenario file: parsed (an error names a line or a field), then every run's
/// domain, groups and hosts built into a monitor (refusals are fine, panics are not).
pub fn scenario(b: &[u8]) {
    let text = String::from_utf8_lossy(b);
    let s = match Scenario::parse(&text, "fuzz.toml", "fuzz") {
        Ok(s) => s,
        Err(e) => {
            assert!(!e.to_string().is_empty());
            return;
        }
    };
    let t0 = Nanos::from_secs(1);
    for sharing in [ExcessSharing::Weighted, ExcessSharing::FirstCome] {
        let cfg = s.domain_config(
            s.scale.max(1),
            TokenMode::Haechi,
            ReservationRelease::Paced,
            sharing,
        );
        let Ok(mut m) = Monitor::new(cfg, t0) else {
            continue;
        };
        for g in &s.groups {
            let _ = m.add_group(g.group_config(s.scale.max(1)), t0);
        }
        for run in &s.runs {
            for h in &run.hosts {
                let _ = m.add_host(h.host_config(s.scale.max(1)), t0);
            }
        }
        m.tick(Nanos::from_secs(2));
    }
}
