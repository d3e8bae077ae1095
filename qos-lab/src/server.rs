//! The emulated target's data path: a processor-sharing server of capacity C_G in which
//! every host with commands at the target gets an equal share, capped at C_L (one host
//! alone cannot saturate the target: Haechi Fig. 7), and the target's link, a FIFO of
//! bytes in which a large transfer delays the small ones queued behind it (head-of-line
//! blocking, Justitia section 2).
//!
//! Each host's commands are served in order (one at a time, at the host's share), so the
//! server keeps one virtual clock: the work done so far by any host that stayed active.
//! Completion times are computed on demand, not kept in the event heap, so a change in
//! the number of active hosts costs one pass over the hosts and never a heap rebuild.

use std::collections::VecDeque;

/// Work is in units of one mean command; rates in commands per nanosecond.
#[derive(Debug)]
pub struct Server {
    cap_g: f64,
    cap_l: f64,
    /// Work done per active host since the start.
    v: f64,
    last: u64,
    rate: f64,
    queues: Vec<VecDeque<(u32, f64)>>,
    finish: Vec<f64>,
    active: usize,
    next: (u64, usize),
}

impl Server {
    /// `capacity` and `per_host_max` in commands per second.
    pub fn new(hosts: usize, capacity: f64, per_host_max: f64) -> Self {
        Server {
            cap_g: capacity / 1e9,
            cap_l: per_host_max / 1e9,
            v: 0.0,
            last: 0,
            rate: 0.0,
            queues: (0..hosts).map(|_| VecDeque::with_capacity(64)).collect(),
            finish: vec![0.0; hosts],
            active: 0,
            next: (u64::MAX, 0),
        }
    }

    fn advance(&mut self, now: u64) {
        if self.rate > 0.0 && now > self.last {
            self.v += (now - self.last) as f64 * self.rate;
        }
        self.last = self.last.max(now);
    }

    fn retime(&mut self) {
        self.rate = if self.active == 0 {
            0.0
        } else {
            self.cap_l.min(self.cap_g / self.active as f64)
        };
        self.next = (u64::MAX, 0);
        if self.active == 0 {
            return;
        }
        for (h, q) in self.queues.iter().enumerate() {
            if q.is_empty() {
                continue;
            }
            let dt = ((self.finish[h] - self.v) / self.rate).max(0.0).ceil() as u64;
            let t = self.last + dt;
            if t < self.next.0 {
                self.next = (t, h);
            }
        }
    }

    /// A command of `work` units from `host` arrives at `now`.
    pub fn enqueue(&mut self, now: u64, host: usize, io: u32, work: f64) {
        let q = &mut self.queues[host];
        q.push_back((io, work));
        if q.len() == 1 {
            self.advance(now);
            self.finish[host] = self.v + work;
            self.active += 1;
            self.retime();
        }
    }

    /// When the next command completes (`u64::MAX` when idle).
    #[inline]
    pub fn next_time(&self) -> u64 {
        self.next.0
    }

    /// Completes the next command (at `next_time`): returns its host and id.
    pub fn complete(&mut self, now: u64) -> (usize, u32) {
        let h = self.next.1;
        self.advance(now);
        let (io, _) = self.queues[h].pop_front().expect("a command in service");
        self.v = self.v.max(self.finish[h]);
        match self.queues[h].front() {
            Some(&(_, w)) => self.finish[h] = self.v + w,
            None => self.active -= 1,
        }
        self.retime();
        (h, io)
    }

    /// Background load changes: the hosts now share `capacity` commands per second.
    pub fn set_capacity(&mut self, now: u64, capacity: f64) {
        self.advance(now);
        self.cap_g = capacity / 1e9;
        self.retime();
    }

    /// Commands at the server now (all hosts).
    pub fn queued(&self) -> usize {
        self.queues.iter().map(VecDeque::len).sum()
    }
}

/// The target's link: FIFO, so the completion time of a transfer is known when it is
/// queued.
#[derive(Debug, Clone, Copy)]
pub struct Link {
    bytes_per_s: u64,
    free_at: u64,
}

impl Link {
    pub fn new(bytes_per_s: u64) -> Self {
        Link {
            bytes_per_s: bytes_per_s.max(1),
            free_at: 0,
        }
    }
    /// Queues `bytes` at `now`; returns when the transfer ends.
    pub fn transfer(&mut self, now: u64, bytes: u64) -> u64 {
        let dur = (bytes as u128 * 1_000_000_000).div_ceil(self.bytes_per_s as u128) as u64;
        let start = self.free_at.max(now);
        self.free_at = start + dur;
        self.free_at
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn drain(s: &mut Server, until: u64) -> Vec<(u64, usize)> {
        let mut out = Vec::new();
        while s.next_time() <= until {
            let t = s.next_time();
            let (h, _) = s.complete(t);
            out.push((t, h));
        }
        out
    }

    #[test]
    fn one_host_alone_runs_at_its_cap() {
        // C_G = 1000/s, C_L = 400/s: one host does a unit of work in 2.5 ms.
        let mut s = Server::new(2, 1000.0, 400.0);
        for i in 0..4 {
            s.enqueue(0, 0, i, 1.0);
        }
        let done = drain(&mut s, u64::MAX);
        assert_eq!(done.len(), 4);
        assert_eq!(done[3].0, 10_000_000);
    }

    #[test]
    fn many_hosts_share_the_capacity_equally() {
        let mut s = Server::new(5, 1000.0, 400.0);
        for h in 0..5 {
            for i in 0..10 {
                s.enqueue(0, h, (h * 10 + i) as u32, 1.0);
            }
        }
        // Five hosts at 200/s each: 10 units each take 50 ms.
        let done = drain(&mut s, u64::MAX);
        assert_eq!(done.len(), 50);
        let last = done.last().unwrap().0;
        assert!((49_999_000..=50_001_000).contains(&last), "{last}");
    }

    #[test]
    fn a_capacity_drop_slows_everyone() {
        let mut s = Server::new(4, 1000.0, 1000.0);
        for h in 0..4 {
            s.enqueue(0, h, h as u32, 1.0);
        }
        s.set_capacity(2_000_000, 500.0);
        // 2 ms at 250/s = 0.5 unit done; the other 0.5 at 125/s = 4 ms.
        let t = s.next_time();
        assert!((5_999_000..=6_001_000).contains(&t), "{t}");
    }

    #[test]
    fn link_is_fifo() {
        let mut l = Link::new(1_000_000_000);
        assert_eq!(l.transfer(0, 1_000_000), 1_000_000);
        assert_eq!(l.transfer(10, 4096), 1_004_096);
        assert_eq!(l.transfer(5_000_000, 1000), 5_001_000);
    }
}
