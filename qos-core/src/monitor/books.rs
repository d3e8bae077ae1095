//! The monitor's token books: every token it creates or removes is counted, so that
//! `issued = pools + caches + consumed + expired` holds ([`Audit`]), and the global
//! pool of the period is only ever changed through them ([`Books`]).

use crate::cost::{Amount, RES};
use crate::ledger::DomainShared;
use crate::sync::{EpochPool, TokenPool};

/// Token bookkeeping for the conservation checks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Audit {
    /// Net tokens created (created minus removed by conversion), per resource.
    pub issued: [i128; 2],
    /// Tokens left in pools when a period ended.
    pub expired_at_rollover: [i128; 2],
}

impl Audit {
    /// Books the `old` tokens of tag `was` that arming a pool for period `tag` replaced:
    /// the same period's (armed ahead, armed again) were never handed out; another
    /// period's are an ended period's leftovers, expired.
    pub(crate) fn rearmed(&mut self, r: usize, tag: u16, was: u16, old: u64) {
        if was == tag {
            self.issued[r] -= old as i128;
        } else {
            self.expired_at_rollover[r] += old as i128;
        }
    }

    /// Adds `delta` tokens to `pool` of period `tag` (or takes them, never below zero),
    /// booking what really moved in resource `r`.
    pub(crate) fn adjust(&mut self, pool: &impl Pool, r: usize, tag: u16, delta: i128) {
        if delta > 0 {
            if pool.give(tag, delta as u64) {
                self.issued[r] += delta;
            }
        } else if delta < 0 {
            let taken = pool.take(tag, (-delta) as u64);
            self.issued[r] -= taken as i128;
        }
    }
}

/// The audit and the global pool's size as the period's conversion last left it.
#[derive(Debug, Default)]
pub(crate) struct Books {
    pub(crate) audit: Audit,
    /// The global pool as last set: Haechi's step S2 converts only once some host
    /// has dipped below it.
    pub(crate) global_initial: Amount,
}

impl Books {
    /// Adds `delta` tokens to (or takes them from) the global pool of period `tag`.
    pub(crate) fn move_global(&mut self, shared: &DomainShared, tag: u16, r: usize, delta: i128) {
        let pool = &shared.global[r];
        self.audit.adjust(&**pool, r, tag, delta);
        self.global_initial.set(RES[r], pool.load().1);
    }
}

/// A pool the books can add tokens to or take them from.
pub(crate) trait Pool {
    fn give(&self, tag: u16, n: u64) -> bool;
    fn take(&self, tag: u16, want: u64) -> u64;
}

impl Pool for TokenPool {
    fn give(&self, tag: u16, n: u64) -> bool {
        TokenPool::give(self, tag, n)
    }
    fn take(&self, tag: u16, want: u64) -> u64 {
        TokenPool::take(self, tag, want)
    }
}

impl Pool for EpochPool {
    fn give(&self, tag: u16, n: u64) -> bool {
        EpochPool::give(self, tag, n)
    }
    fn take(&self, tag: u16, want: u64) -> u64 {
        EpochPool::take(self, tag, want)
    }
}
