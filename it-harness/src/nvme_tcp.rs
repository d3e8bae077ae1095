//! A minimal NVMe/TCP host, enough to send the token protocol's vendor commands and a
//! few reads to a target on 127.0.0.1 and to look at the raw completions (status and
//! dword 0), which `spdk_nvme_perf` does not show. No digests, in-capsule data only for
//! Connect, controller-to-host data only; one command at a time.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

const ICREQ: u8 = 0x00;
const ICRESP: u8 = 0x01;
const CAPSULE_CMD: u8 = 0x04;
const CAPSULE_RESP: u8 = 0x05;
const C2H_DATA: u8 = 0x07;
const C2H_SUCCESS: u8 = 0x08;
const FABRICS: u8 = 0x7F;

/// An NVMe completion as the host sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Completion {
    pub cdw0: u32,
    pub sct: u8,
    pub sc: u8,
    /// The target sent no response capsule (NVMe/TCP C2H "success" flag): an implied
    /// success with dword 0 = 0.
    pub implied: bool,
}

impl Completion {
    pub fn ok(&self) -> bool {
        self.sct == 0 && self.sc == 0
    }
}

/// One queue pair over one TCP connection.
#[derive(Debug)]
pub struct Qpair {
    s: TcpStream,
    cid: u16,
}

/// A 64-byte submission queue entry under construction.
#[derive(Debug, Clone, Copy)]
pub struct Sqe(pub [u8; 64]);

impl Sqe {
    pub fn new(opcode: u8, nsid: u32) -> Sqe {
        let mut b = [0u8; 64];
        b[0] = opcode;
        b[1] = 0x40; // PSDT: SGL (required on fabrics)
        b[4..8].copy_from_slice(&nsid.to_le_bytes());
        Sqe(b)
    }
    /// A token-protocol vendor command on namespace 1 (`qos_core::wire`'s encoding).
    pub fn vendor(req: qos_core::wire::Request) -> Sqe {
        let (opc, v) = qos_core::wire::encode_request(req);
        Sqe::new(opc, 1)
            .cdw(10, v.cdw10)
            .cdw(11, v.cdw11)
            .cdw(12, v.cdw12)
            .cdw(13, v.cdw13)
            .cdw(14, v.cdw14)
            .cdw(15, v.cdw15)
    }
    pub fn cdw(mut self, n: usize, v: u32) -> Sqe {
        self.0[n * 4..n * 4 + 4].copy_from_slice(&v.to_le_bytes());
        self
    }
    fn sgl(mut self, len: u32, id: u8) -> Sqe {
        self.0[24..32].fill(0);
        self.0[32..36].copy_from_slice(&len.to_le_bytes());
        self.0[36..39].fill(0);
        self.0[39] = id;
        self
    }
}

fn io_err(m: impl Into<String>) -> std::io::Error {
    std::io::Error::other(m.into())
}

impl Qpair {
    /// Connects queue `qid` of controller `cntlid` (0xFFFF: a new controller) of
    /// subsystem `subnqn` as host `hostnqn`; returns the queue pair and the connect
    /// completion (dword 0 holds the controller id).
    pub fn connect(
        port: u16,
        subnqn: &str,
        hostnqn: &str,
        qid: u16,
        cntlid: u16,
    ) -> std::io::Result<(Qpair, Completion)> {
        let s = TcpStream::connect(("127.0.0.1", port))?;
        s.set_read_timeout(Some(Duration::from_secs(10)))?;
        s.set_nodelay(true)?;
        let mut q = Qpair { s, cid: 0 };
        let mut ic = [0u8; 128];
        ic[0] = ICREQ;
        ic[2] = 128;
        ic[4..8].copy_from_slice(&128u32.to_le_bytes());
        q.s.write_all(&ic)?;
        let r = q.read_pdu()?;
        if r[0] != ICRESP {
            return Err(io_err(format!("expected ICResp, got PDU type {}", r[0])));
        }
        let mut data = vec![0u8; 1024];
        data[..16].copy_from_slice(b"nvmf-qos-it-host");
        data[16..18].copy_from_slice(&cntlid.to_le_bytes());
        data[256..256 + subnqn.len()].copy_from_slice(subnqn.as_bytes());
        data[512..512 + hostnqn.len()].copy_from_slice(hostnqn.as_bytes());
        let mut sqe = Sqe::new(FABRICS, 0).sgl(1024, 0x01);
        sqe.0[4] = 0x01; // fctype: Connect
        sqe.0[42..44].copy_from_slice(&qid.to_le_bytes());
        sqe.0[44..46].copy_from_slice(&31u16.to_le_bytes()); // sqsize, 0-based
        let cpl = q.submit(sqe, Some(&data), None)?;
        Ok((q, cpl))
    }

    /// Fabrics Property Set (4 bytes).
    pub fn property_set(&mut self, offset: u32, value: u32) -> std::io::Result<Completion> {
        let mut sqe = Sqe::new(FABRICS, 0);
        sqe.0[4] = 0x00;
        sqe.0[40] = 0;
        sqe.0[44..48].copy_from_slice(&offset.to_le_bytes());
        sqe.0[48..52].copy_from_slice(&value.to_le_bytes());
        self.submit(sqe, None, None)
    }

    /// Fabrics Property Get (4 bytes): the value is in dword 0.
    pub fn property_get(&mut self, offset: u32) -> std::io::Result<Completion> {
        let mut sqe = Sqe::new(FABRICS, 0);
        sqe.0[4] = 0x04;
        sqe.0[44..48].copy_from_slice(&offset.to_le_bytes());
        self.submit(sqe, None, None)
    }

    /// Sends `sqe`, with in-capsule data, or asking for `c2h_len` bytes back; returns
    /// the completion and fills `out` with the data received.
    pub fn command(
        &mut self,
        sqe: Sqe,
        c2h_len: u32,
        out: &mut Vec<u8>,
    ) -> std::io::Result<Completion> {
        let sqe = if c2h_len > 0 {
            sqe.sgl(c2h_len, 0x5A)
        } else {
            sqe.sgl(0, 0x5A)
        };
        out.clear();
        self.submit(sqe, None, Some(out))
    }

    /// Sends a command asking for `c2h_len` bytes back, without waiting; returns its
    /// command id. Collect completions with [`Qpair::recv`].
    pub fn send(&mut self, sqe: Sqe, c2h_len: u32) -> std::io::Result<u16> {
        let mut sqe = sqe.sgl(c2h_len, 0x5A);
        self.cid = self.cid.wrapping_add(1);
        sqe.0[2..4].copy_from_slice(&self.cid.to_le_bytes());
        let mut pdu = vec![0u8; 72];
        pdu[0] = CAPSULE_CMD;
        pdu[2] = 72;
        pdu[4..8].copy_from_slice(&72u32.to_le_bytes());
        pdu[8..72].copy_from_slice(&sqe.0);
        self.s.write_all(&pdu)?;
        Ok(self.cid)
    }

    /// The next completion on this queue pair, with its command id (data is dropped).
    pub fn recv(&mut self) -> std::io::Result<(u16, Completion)> {
        loop {
            let p = self.read_pdu()?;
            match p[0] {
                C2H_DATA if p.len() >= 24 && p[1] & C2H_SUCCESS != 0 => {
                    let cid = u16::from_le_bytes([p[8], p[9]]);
                    let c = Completion {
                        cdw0: 0,
                        sct: 0,
                        sc: 0,
                        implied: true,
                    };
                    return Ok((cid, c));
                }
                C2H_DATA => {}
                CAPSULE_RESP if p.len() >= 24 => {
                    let st = u16::from_le_bytes([p[22], p[23]]);
                    let c = Completion {
                        cdw0: u32::from_le_bytes([p[8], p[9], p[10], p[11]]),
                        sc: ((st >> 1) & 0xFF) as u8,
                        sct: ((st >> 9) & 0x7) as u8,
                        implied: false,
                    };
                    return Ok((u16::from_le_bytes([p[20], p[21]]), c));
                }
                t => return Err(io_err(format!("unexpected PDU type {t:#x}"))),
            }
        }
    }

    fn submit(
        &mut self,
        mut sqe: Sqe,
        data: Option<&[u8]>,
        mut out: Option<&mut Vec<u8>>,
    ) -> std::io::Result<Completion> {
        self.cid = self.cid.wrapping_add(1);
        sqe.0[2..4].copy_from_slice(&self.cid.to_le_bytes());
        let dlen = data.map_or(0, |d| d.len());
        let mut pdu = vec![0u8; 72];
        pdu[0] = CAPSULE_CMD;
        pdu[2] = 72;
        pdu[3] = if dlen > 0 { 72 } else { 0 };
        pdu[4..8].copy_from_slice(&((72 + dlen) as u32).to_le_bytes());
        pdu[8..72].copy_from_slice(&sqe.0);
        if let Some(d) = data {
            pdu.extend_from_slice(d);
        }
        self.s.write_all(&pdu)?;
        loop {
            let p = self.read_pdu()?;
            let u32_at = |o: usize| u32::from_le_bytes([p[o], p[o + 1], p[o + 2], p[o + 3]]);
            match p[0] {
                C2H_DATA if p.len() >= 24 => {
                    let (pdo, datal) = (p[3] as usize, u32_at(16) as usize);
                    if let Some(o) = out.as_deref_mut()
                        && let Some(d) = p.get(pdo..pdo + datal)
                    {
                        o.extend_from_slice(d);
                    }
                    if p[1] & C2H_SUCCESS != 0 {
                        return Ok(Completion {
                            cdw0: 0,
                            sct: 0,
                            sc: 0,
                            implied: true,
                        });
                    }
                }
                CAPSULE_RESP if p.len() >= 24 => {
                    let st = u16::from_le_bytes([p[22], p[23]]);
                    return Ok(Completion {
                        cdw0: u32_at(8),
                        sc: ((st >> 1) & 0xFF) as u8,
                        sct: ((st >> 9) & 0x7) as u8,
                        implied: false,
                    });
                }
                t => return Err(io_err(format!("unexpected PDU type {t:#x}"))),
            }
        }
    }

    /// Reads one whole PDU.
    fn read_pdu(&mut self) -> std::io::Result<Vec<u8>> {
        let mut pdu = vec![0u8; 8];
        self.s.read_exact(&mut pdu)?;
        let plen = u32::from_le_bytes([pdu[4], pdu[5], pdu[6], pdu[7]]) as usize;
        if !(8..=1 << 20).contains(&plen) {
            return Err(io_err(format!("bad PDU length {plen}")));
        }
        pdu.resize(plen, 0);
        self.s.read_exact(&mut pdu[8..])?;
        Ok(pdu)
    }
}

/// Connects an admin queue, enables the controller and connects I/O queue 1.
pub fn connect_io(port: u16, subnqn: &str, hostnqn: &str) -> std::io::Result<(Qpair, Qpair)> {
    let (mut admin, c) = Qpair::connect(port, subnqn, hostnqn, 0, 0xFFFF)?;
    if !c.ok() {
        return Err(io_err(format!(
            "admin connect refused: sct {} sc {:#x}",
            c.sct, c.sc
        )));
    }
    let cntlid = (c.cdw0 & 0xFFFF) as u16;
    // CC: IOSQES 6, IOCQES 4, EN.
    let c = admin.property_set(0x14, 0x0046_0001)?;
    if !c.ok() {
        return Err(io_err(format!("CC.EN refused: sc {:#x}", c.sc)));
    }
    for _ in 0..100 {
        if admin.property_get(0x1C)?.cdw0 & 1 == 1 {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let (io, c) = Qpair::connect(port, subnqn, hostnqn, 1, cntlid)?;
    if !c.ok() {
        return Err(io_err(format!(
            "I/O queue connect refused: sct {} sc {:#x}",
            c.sct, c.sc
        )));
    }
    Ok((admin, io))
}
