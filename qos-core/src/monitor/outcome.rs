//! What an ended period left of a host: its record (kept in the monitor's history and
//! the period's report) and its counts of periods by outcome (in its statistics). Apart
//! from the report so that a host's own code can write them without importing the
//! report's readers.

use serde::Serialize;

use crate::cost::Amount;

/// One past period of one host.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct PeriodRecord {
    pub epoch: u64,
    pub completed: Amount,
    pub completed_ios: u64,
    /// Hard reservation of that period.
    pub reservation: Amount,
    pub soft_granted: Amount,
    /// Completed at least the hard reservation in every reserved resource.
    pub met: bool,
    /// Had I/O held for want of tokens or limit (it was backlogged).
    pub backlogged: bool,
}

/// Ended periods of one host since it was added, by outcome: reservation met or
/// missed, while backlogged (I/O held for tokens or limit) or not. A host without a
/// reservation meets it in every period.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct PeriodCounts {
    pub met: u64,
    pub missed: u64,
    pub met_backlogged: u64,
    pub missed_backlogged: u64,
}

impl PeriodCounts {
    pub(crate) fn count(&mut self, met: bool, backlogged: bool) {
        *match (met, backlogged) {
            (true, false) => &mut self.met,
            (false, false) => &mut self.missed,
            (true, true) => &mut self.met_backlogged,
            (false, true) => &mut self.missed_backlogged,
        } += 1;
    }
}
