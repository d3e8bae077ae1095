//! First come (`first_come`, the default): Haechi's global pool. Channels take global
//! tokens in batches scaled by their host's weight, so the excess goes to whoever asks
//! first and most often: by queue depth.

use crate::cost::Amount;
use crate::time::mul_div;

use super::{SharingPolicy, four};

#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct FirstCome;

impl SharingPolicy for FirstCome {
    fn host_batches(
        &self,
        batch: Amount,
        weight: u64,
        max_weight: u64,
        _four_intervals: Amount,
    ) -> (Amount, Amount) {
        // Weight scales the batch: a heavier host asks for more at a time.
        let b = Amount::new(
            mul_div(batch.ops, weight, max_weight).max(1),
            mul_div(batch.bytes, weight, max_weight).max(1),
        );
        (b, four(b))
    }
}
