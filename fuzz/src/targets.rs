//! The fuzz targets that build without SPDK, each a function of the raw input that
//! panics on a finding: the token protocol as the target decodes it (vendor commands)
//! and as the initiator decodes it (state replies, completion credits), and the lab's
//! scenario files (parsed, then built into a monitor with their groups and hosts), the
//! lab's cluster scenarios and what the cluster agent reads from outside. The stable
//! harness (`qos-fuzz`) and the coverage-guided targets (`fuzz/libfuzzer`) both run
//! these functions; [`TARGETS`] names them.

use qos_core::allowance::{self, AllowanceCredit, AllowanceReceiver, Received};
use qos_core::wire::{self, Credit, Request, StateReply, VendorCmd};
use qos_core::{ExcessSharing, Monitor, Nanos, ReservationRelease, TokenMode};
use qos_lab::scenario::Scenario;

/// A fuzz target: a function of the raw input that panics on a finding.
pub type Target = fn(&[u8]);

/// Every target here by name (the name of its seed corpus, of its libFuzzer target and
/// of its folder of crash inputs in `fuzz/regressions/`).
pub const TARGETS: &[(&str, Target)] = &[
    ("vendor_command", vendor_command),
    ("state_reply", state_reply),
    ("credit", credit),
    ("allowance_credit", allowance_credit),
    ("scenario", scenario),
    ("cluster_scenario", cluster_scenario),
    ("agent_input", agent_input),
];

/// The targets that link SPDK, in the plugins' `params_fuzz` (their tests replay these
/// targets' crash inputs).
pub const SPDK_TARGETS: &[&str] = &["target_rpc_params", "ini_rpc_params", "saved_config"];

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
            // A circulation report only ever rides a GET_STATE, and re-encodes.
            if let Some(c) = allowance::decode_report(opcode, &cmd) {
                assert_eq!(req, Request::GetState);
                let (opc, again) = allowance::encode_report(c);
                assert_eq!(allowance::decode_report(opc, &again), Some(c));
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

/// A stream of completion dwords 0 with the allowance marker as the initiator
/// receives them: 8 bytes each, dword 0 and the time since the last one (µs, low 16
/// bits of the next word; the host tag announced is the first word). Only a credit
/// that decodes, for this host, is applied; what is applied is what it carries, within
/// the field's range; nothing panics.
pub fn allowance_credit(b: &[u8]) {
    let tag = u32_at(b, 0);
    let mut rx = AllowanceReceiver::default();
    let mut now = Nanos::from_secs(1);
    for i in (4..b.len()).step_by(8) {
        let cdw0 = u32_at(b, i);
        now = now.saturating_add(Nanos::from_micros(u64::from(u32_at(b, i + 4) & 0xFFFF)));
        let decoded = AllowanceCredit::decode(cdw0);
        if let Ok(Some(c)) = decoded {
            assert_eq!(
                AllowanceCredit::decode(c.encode()),
                Ok(Some(c)),
                "{cdw0:#010x}"
            );
        }
        match rx.receive(cdw0, Some(tag), now) {
            Received::Applied(cap) => {
                let c = decoded.ok().flatten().expect("applied: decodes");
                assert_eq!(c.host_tag, allowance::fold_tag(tag));
                assert_eq!(cap, c.cap.map(u64::from));
                assert!(cap.is_none_or(|a| (1..=allowance::MAX_CAP).contains(&a)));
            }
            Received::Foreign => {
                let c = decoded.ok().flatten().expect("foreign: decodes");
                assert_ne!(c.host_tag, allowance::fold_tag(tag));
            }
            r => assert!(r == Received::Duplicate || r.is_refusal()),
        }
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

/// The target's answers as the agent reads them off its RPC socket
/// (`rpc_client::Client::call_as`): each JSON text cut off the stream by
/// `rpc_client::read_text` through a buffer of 1-7 bytes (so that every value and
/// string straddles reads), its id and error read, its result straight into the
/// counters form, then into the agent's counters and settings. Whatever the bytes,
/// every cut text is whole: it starts with `{` or `[`, and ends with `}` or `]`.
fn socket_answers(b: &[u8]) {
    use nvmf_qos_agent::target::{CountersDomain, counters_state};
    use rpc_client::{Reply, parse_reply, read_text};
    let mut r = std::io::BufReader::with_capacity(1 + b.len() % 7, b);
    let mut text = Vec::new();
    while let Ok(true) = read_text(&mut r, &mut text) {
        assert!(
            matches!(text.first(), Some(b'{' | b'[')) && matches!(text.last(), Some(b'}' | b']')),
            "read_text cut {:?}",
            String::from_utf8_lossy(&text)
        );
        if let Ok(Reply::Result(d)) = parse_reply::<Vec<CountersDomain>>(&text, 7) {
            for d in d {
                let _ = counters_state(d);
            }
        }
    }
}

/// What the cluster agent reads from outside (etcd's records and range answers, a
/// target's answers, a peer's handover report): a JSON text tried as every record and
/// answer, and cut off a stream as the agent's RPC client cuts it; what parses
/// is then divided by `qos_core::cluster::plan` (any numbers: the shares must still add
/// up) and traded against (the shares never above the contract).
pub fn agent_input(b: &[u8]) {
    use nvmf_qos_agent::keys::{
        ClusterRecord, DemandRecord, DivisionRecord, MemberRecord, PartRecord, SharesRecord, parse,
    };
    use nvmf_qos_agent::target::{parse_hosts, parse_stats};
    use qos_core::cluster::{ClusterHost, DivideConfig, divide, plan, with_cold_shares};
    use std::collections::BTreeMap;
    socket_answers(b);
    let text = String::from_utf8_lossy(b);
    if let Ok(r) = serde_json::from_str::<nvmf_qos_agent::store::Range>(&text) {
        let _ = r.records();
    }
    let _ = parse::<MemberRecord>("k", &text);
    let _ = parse::<SharesRecord>("k", &text);
    let _ = parse::<DivisionRecord>("k", &text);
    let _ = parse::<PartRecord>("k", &text);
    let cfg = parse::<ClusterRecord>("k", &text).map_or(DivideConfig::default(), |c| c.divide);
    let Ok(v) = serde_json::from_str::<serde_json::Value>(&text) else {
        return;
    };
    let _ = parse_hosts(&v);
    // The counters as a second sample a window after zero: rates from any numbers.
    let counters = parse_stats(&v).map(|s| s.counters).unwrap_or_default();
    let mut meter = nvmf_qos_agent::demand::DemandMeter::default();
    let zero = counters
        .keys()
        .map(|n| (n.clone(), Default::default()))
        .collect();
    meter.observe(0, &zero, 250);
    let demand = meter.observe(250, &counters, 250);
    let mut reports: BTreeMap<String, BTreeMap<String, qos_core::cluster::PathDemand>> =
        BTreeMap::new();
    reports.insert("a".into(), demand);
    if let Ok(d) = parse::<DemandRecord>("k", &text) {
        reports.insert("b".into(), d.hosts);
    }
    let host = parse::<ClusterHost>("k", &text).unwrap_or(ClusterHost {
        reservation_iops: u64::MAX / 3,
        limit_iops: Some(u64::MAX),
        weight: 1,
        reservation_mibps: u64::MAX / 5,
        limit_mibps: Some(u64::MAX / 2),
    });
    let cfg = DivideConfig {
        floor_milli: cfg.floor_milli.min(1000),
        headroom_milli: cfg.headroom_milli.min(10_000),
    };
    let nqns: Vec<String> = reports.values().flat_map(|m| m.keys().cloned()).collect();
    let hosts: BTreeMap<String, ClusterHost> =
        nqns.iter().map(|n| (n.clone(), host.clone())).collect();
    let targets = vec!["a".to_string(), "b".to_string()];
    // As the agents apply it: a host a part leaves out holds its cold share there.
    let p: qos_core::cluster::Plan = plan(&hosts, &targets, &reports, &cfg)
        .into_iter()
        .map(|(t, part)| {
            let full = with_cold_shares(&part, &hosts);
            (t, full)
        })
        .collect();
    for (nqn, h) in &hosts {
        let res: u128 = p.values().map(|t| t[nqn].reservation_iops as u128).sum();
        assert!(
            res <= h.reservation_iops as u128,
            "{nqn}: {res} > {}",
            h.reservation_iops
        );
        let res: u128 = p.values().map(|t| t[nqn].reservation_mibps as u128).sum();
        assert!(
            res <= h.reservation_mibps as u128,
            "{nqn}: {res} MiB/s > {}",
            h.reservation_mibps
        );
        for t in p.values() {
            let s = t[nqn];
            assert!(
                s.limit_mibps.is_none_or(|l| s.reservation_mibps <= l),
                "{s:?}"
            );
        }
    }
    for d in reports.values() {
        let paths: Vec<_> = d.values().copied().collect();
        let s = divide(host.reservation_iops, &paths, &cfg);
        if !paths.is_empty() {
            assert_eq!(
                s.iter().map(|&x| x as u128).sum::<u128>(),
                host.reservation_iops as u128
            );
        }
    }
    handover_from(b, &p, &hosts, &reports);
}

/// A peer's `/handover` answer (the bytes as they came, and as the body of a 200):
/// parsed, then traded against by target "a" on the division `p`, its shares never
/// above a host's contract whatever the report says.
fn handover_from(
    b: &[u8],
    p: &qos_core::cluster::Plan,
    hosts: &std::collections::BTreeMap<String, qos_core::cluster::ClusterHost>,
    reports: &std::collections::BTreeMap<
        String,
        std::collections::BTreeMap<String, qos_core::cluster::PathDemand>,
    >,
) {
    use nvmf_qos_agent::peers::parse_response;
    use qos_core::handover::{Handover, HandoverConfig};
    let _ = parse_response(b);
    let Ok(peer) = parse_response(&[&b"HTTP/1.1 200 OK\r\n\r\n"[..], b].concat()) else {
        return;
    };
    let mut book = Handover::new("a");
    book.rebase(peer.seq.unwrap_or(0), &p["a"]);
    let demand = reports.get("a").cloned().unwrap_or_default();
    book.observe(&demand);
    let step = book.step(&demand, &[peer], hosts, &HandoverConfig::default());
    for (nqn, s) in &step.shares {
        let c = &hosts[nqn];
        assert!(s.reservation_iops <= c.reservation_iops, "{nqn}: {s:?}");
        assert!(
            s.limit_iops <= c.limit_iops.map(|l| l.max(1)),
            "{nqn}: {s:?}"
        );
        assert!(s.reservation_mibps <= c.reservation_mibps, "{nqn}: {s:?}");
        assert!(
            s.limit_mibps <= c.limit_mibps.map(|l| l.max(1)),
            "{nqn}: {s:?}"
        );
    }
    book.commit(&step, |_| true);
    let _ = serde_json::to_string(&book.report()).expect("a report serialises");
}

/// A lab cluster scenario file: parsed (errors name a field), then simulated for at
/// most 50 periods (a generated fleet only up to 4,096 target-host pairs: a big one
/// takes seconds per period).
pub fn cluster_scenario(b: &[u8]) {
    use qos_lab::cluster::{ClusterScenario, fleet_report, report, simulate};
    let text = String::from_utf8_lossy(b);
    match ClusterScenario::parse(&text, "fuzz.toml") {
        Ok(s) if s.fleet.is_some() && s.targets.len() * s.hosts.len() > 4096 => {}
        Ok(mut s) => {
            s.cluster.periods = s.cluster.periods.min(50);
            let run = simulate(&s);
            assert!(!report(&s, &run).is_empty());
            assert!(!fleet_report(&s, &run).is_empty());
        }
        Err(e) => assert!(!e.to_string().is_empty()),
    }
}
