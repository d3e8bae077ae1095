//! A small model of SPDK's bdev QoS (`bdev_set_qos_limit`), the baseline that ships with
//! SPDK: one rate limit per namespace (bdev), shared by every host that reaches it, with
//! no notion of hosts and no reservation. SPDK divides time into 1 ms timeslices; each
//! timeslice allows `limit / 1000` commands (and bytes). A command is sent while the
//! timeslice has quota left (it may overdraw the byte quota, and the overdraft is taken
//! from the next timeslice); otherwise it waits in one FIFO until a later timeslice.
//! This is SPDK's algorithm, not ours: it lives here only as a comparison.

use std::collections::VecDeque;

/// SPDK's `SPDK_BDEV_QOS_TIMESLICE_IN_USEC`.
pub const TIMESLICE_NS: u64 = 1_000_000;

#[derive(Debug)]
pub struct NsLimit {
    max_ios: i64,
    max_bytes: i64,
    rem_ios: i64,
    rem_bytes: i64,
    queue: VecDeque<(u32, u64)>,
}

impl NsLimit {
    /// Limits per second; `None` is unlimited.
    pub fn new(iops: Option<u64>, bytes_per_s: Option<u64>) -> Self {
        let per_slice = |v: Option<u64>, min: u64| {
            v.map_or(i64::MAX / 4, |v| {
                ((v as u128 * TIMESLICE_NS as u128 / 1_000_000_000) as u64).max(min) as i64
            })
        };
        let max_ios = per_slice(iops, 1);
        let max_bytes = per_slice(bytes_per_s, 512);
        NsLimit {
            max_ios,
            max_bytes,
            rem_ios: max_ios,
            rem_bytes: max_bytes,
            queue: VecDeque::new(),
        }
    }

    fn take(&mut self, bytes: u64) -> bool {
        if self.rem_ios > 0 && self.rem_bytes > 0 {
            self.rem_ios -= 1;
            self.rem_bytes -= bytes as i64;
            true
        } else {
            false
        }
    }

    /// A command arrives: `true` sends it now, `false` queues it.
    pub fn submit(&mut self, io: u32, bytes: u64) -> bool {
        if self.queue.is_empty() && self.take(bytes) {
            return true;
        }
        self.queue.push_back((io, bytes));
        false
    }

    /// A new timeslice: refill (keeping overdrafts) and send queued commands in order.
    pub fn timeslice(&mut self, mut send: impl FnMut(u32)) {
        self.rem_ios = self.rem_ios.min(0) + self.max_ios;
        self.rem_bytes = self.rem_bytes.min(0) + self.max_bytes;
        while let Some(&(io, bytes)) = self.queue.front() {
            if !self.take(bytes) {
                break;
            }
            self.queue.pop_front();
            send(io);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quota_per_timeslice_and_fifo() {
        let mut n = NsLimit::new(Some(2000), None); // 2 per ms
        assert!(n.submit(1, 4096));
        assert!(n.submit(2, 4096));
        assert!(!n.submit(3, 4096));
        assert!(!n.submit(4, 4096));
        assert!(!n.submit(5, 4096));
        let mut sent = Vec::new();
        n.timeslice(|io| sent.push(io));
        assert_eq!(sent, vec![3, 4]);
        sent.clear();
        n.timeslice(|io| sent.push(io));
        assert_eq!(sent, vec![5]);
    }

    #[test]
    fn byte_overdraft_is_carried() {
        let mut n = NsLimit::new(None, Some(1_000_000)); // 1000 bytes per ms
        assert!(n.submit(1, 3000)); // overdraws by 2000
        assert!(!n.submit(2, 10));
        let mut sent = Vec::new();
        n.timeslice(|io| sent.push(io)); // -2000 + 1000
        assert!(sent.is_empty());
        n.timeslice(|io| sent.push(io)); // -1000 + 1000 = 0: still nothing
        assert!(sent.is_empty());
        n.timeslice(|io| sent.push(io));
        assert_eq!(sent, vec![2]);
    }
}
