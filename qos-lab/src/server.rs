//! The emulated target's data path, in three stages every command goes through:
//!
//! 1. [`Pipe`]: the host's own pipeline, one command every `1 / C_L` seconds, in order
//!    (a client alone cannot exceed C_L and cannot saturate the target: Haechi Fig. 6
//!    and 7);
//! 2. [`Server`]: the target, processor sharing of capacity C_G among the commands it
//!    holds, so hosts with as many commands outstanding get equal shares (the bare
//!    system of Haechi Fig. 8(a) and 9), and a host with few commands takes little.
//!    Optionally the target is faster the more commands it holds (NVMe/TCP batches more
//!    per socket call): with a half depth k, n commands are served at C_G n / (n + k);
//! 3. [`Link`]: the target's link, a FIFO of bytes in which a large transfer delays the
//!    small ones queued behind it (head-of-line blocking, Justitia section 2).
//!
//! The server keeps one virtual clock (work done so far by any command that stayed),
//! so each command's finish tag is fixed on arrival and the next completion is the
//! smallest tag: a binary heap, O(log n) per command.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

#[derive(Debug, Clone, Copy)]
struct Tag {
    finish: f64,
    seq: u64,
    io: u32,
}

impl PartialEq for Tag {
    fn eq(&self, o: &Self) -> bool {
        self.cmp(o) == std::cmp::Ordering::Equal
    }
}
impl Eq for Tag {}
impl PartialOrd for Tag {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Tag {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        self.finish.total_cmp(&o.finish).then(self.seq.cmp(&o.seq))
    }
}

/// Processor sharing: work is in units of one mean command, capacity in commands per
/// nanosecond, shared equally by the commands present.
#[derive(Debug)]
pub struct Server {
    cap: f64,
    /// Commands at which the target does half of `cap` (0: `cap` at any depth).
    half_depth: f64,
    /// Work done per command present since the start.
    v: f64,
    last: u64,
    tags: BinaryHeap<Reverse<Tag>>,
    seq: u64,
    next: u64,
}

impl Server {
    /// `capacity` in commands per second.
    pub fn new(capacity: f64) -> Self {
        Server {
            cap: capacity / 1e9,
            half_depth: 0.0,
            v: 0.0,
            last: 0,
            tags: BinaryHeap::with_capacity(1024),
            seq: 0,
            next: u64::MAX,
        }
    }

    /// The target does `capacity * n / (n + half_depth)` with n commands present.
    pub fn with_half_depth(mut self, half_depth: f64) -> Self {
        self.half_depth = half_depth.max(0.0);
        self
    }

    fn rate(&self) -> f64 {
        if self.tags.is_empty() {
            0.0
        } else {
            self.cap / (self.tags.len() as f64 + self.half_depth)
        }
    }

    fn advance(&mut self, now: u64) {
        if now > self.last {
            self.v += (now - self.last) as f64 * self.rate();
        }
        self.last = self.last.max(now);
    }

    fn retime(&mut self) {
        self.next = match self.tags.peek() {
            None => u64::MAX,
            Some(Reverse(t)) => {
                let dt = ((t.finish - self.v) / self.rate()).max(0.0).ceil() as u64;
                self.last + dt
            }
        };
    }

    /// Command `io` of `work` units arrives at `now`.
    pub fn enqueue(&mut self, now: u64, io: u32, work: f64) {
        self.advance(now);
        self.seq += 1;
        self.tags.push(Reverse(Tag {
            finish: self.v + work,
            seq: self.seq,
            io,
        }));
        self.retime();
    }

    /// When the next command completes (`u64::MAX` when idle).
    #[inline]
    pub fn next_time(&self) -> u64 {
        self.next
    }

    /// Completes the next command (at `next_time`) and returns it.
    pub fn complete(&mut self, now: u64) -> u32 {
        self.advance(now);
        let Reverse(t) = self.tags.pop().expect("a command in service");
        self.v = self.v.max(t.finish);
        self.retime();
        t.io
    }

    /// Background load changes: the hosts now share `capacity` commands per second.
    pub fn set_capacity(&mut self, now: u64, capacity: f64) {
        self.advance(now);
        self.cap = capacity / 1e9;
        self.retime();
    }

    /// Commands at the server now.
    pub fn queued(&self) -> usize {
        self.tags.len()
    }
}

/// A host's pipeline: one command every `1 / C_L`, first in, first out.
#[derive(Debug, Clone, Copy)]
pub struct Pipe {
    per_command: f64,
    free_at: f64,
}

impl Pipe {
    /// `per_host_max` in commands per second.
    pub fn new(per_host_max: f64) -> Self {
        Pipe {
            per_command: 1e9 / per_host_max,
            free_at: 0.0,
        }
    }
    /// A command enters at `now`; returns when it leaves for the target.
    pub fn pass(&mut self, now: u64) -> u64 {
        self.free_at = self.free_at.max(now as f64) + self.per_command;
        self.free_at.ceil() as u64
    }
}

/// The target's link: FIFO, so the completion time of a transfer is known when it is
/// queued. A transfer occupies it for `per_command_ns` plus its bytes at the link's rate.
#[derive(Debug, Clone, Copy)]
pub struct Link {
    bytes_per_s: u64,
    per_command_ns: u64,
    free_at: u64,
}

impl Link {
    pub fn new(bytes_per_s: u64, per_command_ns: u64) -> Self {
        Link {
            bytes_per_s: bytes_per_s.max(1),
            per_command_ns,
            free_at: 0,
        }
    }
    /// Queues `bytes` at `now`; returns when the transfer ends.
    pub fn transfer(&mut self, now: u64, bytes: u64) -> u64 {
        let dur = self.per_command_ns
            + (bytes as u128 * 1_000_000_000).div_ceil(self.bytes_per_s as u128) as u64;
        let start = self.free_at.max(now);
        self.free_at = start + dur;
        self.free_at
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn drain(s: &mut Server) -> Vec<(u64, u32)> {
        let mut out = Vec::new();
        while s.next_time() != u64::MAX {
            let t = s.next_time();
            out.push((t, s.complete(t)));
        }
        out
    }

    #[test]
    fn a_command_costs_the_link_its_bytes_and_its_fixed_part() {
        // 1 GB/s and 2 us a command: 1 MiB whole takes 1048.6 + 2 us; in 32 chunks of
        // 32 KiB, 64 us more.
        let mut whole = Link::new(1_000_000_000, 2_000);
        assert_eq!(whole.transfer(0, 1 << 20), 1_048_576 + 2_000);
        let mut chunked = Link::new(1_000_000_000, 2_000);
        let end = (0..32).fold(0, |_, _| chunked.transfer(0, 32 << 10));
        assert_eq!(end, 1_048_576 + 64_000);
    }

    #[test]
    fn commands_share_the_capacity_equally() {
        // 1000 commands/s shared by 4 commands of one unit: all done at 4 ms.
        let mut s = Server::new(1000.0);
        for i in 0..4 {
            s.enqueue(0, i, 1.0);
        }
        let done = drain(&mut s);
        assert_eq!(done.len(), 4);
        assert!(done.iter().all(|&(t, _)| t == 4_000_000), "{done:?}");
    }

    #[test]
    fn a_short_command_leaves_early_and_the_rest_speed_up() {
        let mut s = Server::new(1000.0);
        s.enqueue(0, 1, 0.5);
        s.enqueue(0, 2, 1.0);
        // Two at 500/s: the first is done at 1 ms; then the second alone: 0.5 unit at
        // 1000/s, done at 1.5 ms.
        let done = drain(&mut s);
        assert_eq!(done, vec![(1_000_000, 1), (1_500_000, 2)]);
    }

    #[test]
    fn a_capacity_drop_slows_everyone() {
        let mut s = Server::new(1000.0);
        for i in 0..4 {
            s.enqueue(0, i, 1.0);
        }
        s.set_capacity(2_000_000, 500.0);
        // 2 ms at 250/s = 0.5 unit done; the other 0.5 at 125/s = 4 ms.
        let t = s.next_time();
        assert!((5_999_000..=6_001_000).contains(&t), "{t}");
    }

    #[test]
    fn with_a_half_depth_few_commands_are_served_slower() {
        // Half depth 4: one command alone at 1000 * 1/5 = 200/s: 5 ms; four at
        // 1000 * 4/8 = 500/s together: all done at 8 ms.
        let mut s = Server::new(1000.0).with_half_depth(4.0);
        s.enqueue(0, 1, 1.0);
        assert_eq!(drain(&mut s), vec![(5_000_000, 1)]);
        let mut s = Server::new(1000.0).with_half_depth(4.0);
        for i in 0..4 {
            s.enqueue(0, i, 1.0);
        }
        assert!(drain(&mut s).iter().all(|&(t, _)| t == 8_000_000));
    }

    #[test]
    fn the_pipe_caps_one_host() {
        let mut p = Pipe::new(400.0);
        assert_eq!(p.pass(0), 2_500_000);
        assert_eq!(p.pass(0), 5_000_000);
        assert_eq!(p.pass(10_000_000), 12_500_000);
    }

    #[test]
    fn link_is_fifo() {
        let mut l = Link::new(1_000_000_000, 0);
        assert_eq!(l.transfer(0, 1_000_000), 1_000_000);
        assert_eq!(l.transfer(10, 4096), 1_004_096);
        assert_eq!(l.transfer(5_000_000, 1000), 5_001_000);
    }
}
