//! Small helpers the tests share: Zipf-distributed amounts, medians, log lines.

use std::io::{BufRead, BufReader};
use std::path::Path;

/// Reservations that follow Zipf's law (1, 1/2, 1/3, ...) and add up to `total`.
pub fn zipf(n: usize, total: u64) -> Vec<u64> {
    let h: f64 = (1..=n).map(|i| 1.0 / i as f64).sum();
    (1..=n)
        .map(|i| (total as f64 / (i as f64 * h)).floor() as u64)
        .collect()
}

/// The median of `v` (0 when empty).
pub fn median(v: &[f64]) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    let n = s.len();
    if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    }
}

/// Reads lines of a file (for logs in failure messages).
pub fn read_lines(p: &Path) -> Vec<String> {
    std::fs::File::open(p)
        .map(|f| BufReader::new(f).lines().map_while(Result::ok).collect())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zipf_sums_to_at_most_the_total() {
        let z = zipf(4, 9000);
        assert_eq!(z.len(), 4);
        assert!(z.iter().sum::<u64>() <= 9000);
        assert!(z[0] > 2 * z[1] - 2 && z[1] > z[2] && z[2] > z[3]);
    }
}
