//! What an I/O costs. Every budget in nvmf-qos (reservations, limits, the global pool,
//! the target's capacity) is counted in two resources: operations and bytes. The cost
//! model turns one command into an amount of each.
//!
//! Defaults are the identity: one command costs one operation and its transfer length in
//! bytes, so budgets read as IOPS and bytes per second. Operators whose device pays more
//! for writes or for large I/O (ReFlex charges a 4 KiB write 10x a read; Gimbal's write
//! cost ranges 1..9) set `write_weight` and `size_unit`, and budgets are then counted in
//! those weighted units.

use serde::{Deserialize, Serialize};

/// The two resources a token stands for (Justitia's multi-resource tokens).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Resource {
    Ops = 0,
    Bytes = 1,
}

/// The resources by index, for loops over the parallel per-resource arrays of the
/// ledger and the monitor.
pub(crate) const RES: [Resource; 2] = Resource::ALL;

impl Resource {
    pub const ALL: [Resource; 2] = [Resource::Ops, Resource::Bytes];
    pub const fn index(self) -> usize {
        self as usize
    }
    pub const fn name(self) -> &'static str {
        match self {
            Resource::Ops => "ops",
            Resource::Bytes => "bytes",
        }
    }
}

/// An amount of both resources.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub struct Amount {
    pub ops: u64,
    pub bytes: u64,
}

impl Amount {
    pub const ZERO: Amount = Amount { ops: 0, bytes: 0 };
    pub const fn new(ops: u64, bytes: u64) -> Self {
        Amount { ops, bytes }
    }
    pub const fn get(&self, r: Resource) -> u64 {
        match r {
            Resource::Ops => self.ops,
            Resource::Bytes => self.bytes,
        }
    }
    pub fn set(&mut self, r: Resource, v: u64) {
        match r {
            Resource::Ops => self.ops = v,
            Resource::Bytes => self.bytes = v,
        }
    }
    pub fn saturating_add(self, o: Amount) -> Amount {
        Amount::new(
            self.ops.saturating_add(o.ops),
            self.bytes.saturating_add(o.bytes),
        )
    }
    pub fn saturating_sub(self, o: Amount) -> Amount {
        Amount::new(
            self.ops.saturating_sub(o.ops),
            self.bytes.saturating_sub(o.bytes),
        )
    }
    pub fn is_zero(&self) -> bool {
        self.ops == 0 && self.bytes == 0
    }
}

/// Direction of a data transfer, for budgets that treat reads and writes apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Direction {
    Read = 0,
    Write = 1,
}

/// The kinds of command the target accounts. Flush, unmap and write-zeroes move no data
/// over the fabric, so they cost one operation and no bytes; they count as writes for
/// budgets split by direction, because they change the medium.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum IoKind {
    Read,
    Write,
    Flush,
    Unmap,
    WriteZeroes,
    /// Anything else that reaches the data path (compare, passthru...): one operation,
    /// its bytes, counted as a read.
    Other,
}

impl IoKind {
    pub const fn direction(self) -> Direction {
        match self {
            IoKind::Read | IoKind::Other => Direction::Read,
            IoKind::Write | IoKind::Flush | IoKind::Unmap | IoKind::WriteZeroes => Direction::Write,
        }
    }
    const fn moves_data(self) -> bool {
        matches!(self, IoKind::Read | IoKind::Write | IoKind::Other)
    }
}

/// Fixed-point scale of `CostModel::write_weight_milli`: 1000 means 1.0.
pub const WEIGHT_ONE: u64 = 1000;

/// Turns a command into an [`Amount`]. Immutable once a domain is built.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CostModel {
    /// Writes (and flush, unmap, write-zeroes) cost this many thousandths of a read.
    /// Default 1000 (a write costs what a read costs).
    pub write_weight_milli: u64,
    /// When non-zero, a data command costs one operation per started `size_unit` bytes
    /// (a 128 KiB read with a 4 KiB unit costs 32 operations). Default 0: one command is
    /// one operation whatever its size; large I/O is charged through the bytes resource.
    pub size_unit: u64,
}

impl Default for CostModel {
    fn default() -> Self {
        CostModel {
            write_weight_milli: WEIGHT_ONE,
            size_unit: 0,
        }
    }
}

impl CostModel {
    /// The cost of one command of `kind` moving `bytes`.
    #[inline]
    pub fn cost(&self, kind: IoKind, bytes: u64) -> Amount {
        let bytes = if kind.moves_data() { bytes } else { 0 };
        let ops = if self.size_unit > 0 && bytes > 0 {
            bytes.div_ceil(self.size_unit)
        } else {
            1
        };
        if kind.direction() == Direction::Write && self.write_weight_milli != WEIGHT_ONE {
            Amount::new(
                weigh(ops, self.write_weight_milli),
                weigh(bytes, self.write_weight_milli),
            )
        } else {
            Amount::new(ops, bytes)
        }
    }
}

/// `v * weight / 1000`, rounded up so that a weighted command never becomes free.
fn weigh(v: u64, weight_milli: u64) -> u64 {
    if v == 0 {
        return 0;
    }
    let w = (v as u128 * weight_milli as u128).div_ceil(WEIGHT_ONE as u128);
    w.clamp(1, u64::MAX as u128) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_cost_is_one_op_and_the_transfer_length() {
        let m = CostModel::default();
        assert_eq!(m.cost(IoKind::Read, 4096), Amount::new(1, 4096));
        assert_eq!(m.cost(IoKind::Write, 1 << 20), Amount::new(1, 1 << 20));
        assert_eq!(m.cost(IoKind::Flush, 0), Amount::new(1, 0));
        // Unmap names a range but moves nothing over the fabric.
        assert_eq!(m.cost(IoKind::Unmap, 1 << 30), Amount::new(1, 0));
    }

    #[test]
    fn write_weight_and_size_unit_scale_the_cost() {
        let m = CostModel {
            write_weight_milli: 2500,
            size_unit: 4096,
        };
        assert_eq!(
            m.cost(IoKind::Read, 128 * 1024),
            Amount::new(32, 128 * 1024)
        );
        assert_eq!(m.cost(IoKind::Write, 4096), Amount::new(3, 10240));
        assert_eq!(m.cost(IoKind::Read, 1), Amount::new(1, 1));
        assert_eq!(m.cost(IoKind::WriteZeroes, 1 << 20), Amount::new(3, 0));
    }

    #[test]
    fn a_tiny_weight_never_makes_a_write_free() {
        let m = CostModel {
            write_weight_milli: 1,
            size_unit: 0,
        };
        assert_eq!(m.cost(IoKind::Write, 10), Amount::new(1, 1));
    }
}
