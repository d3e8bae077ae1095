//! Small helpers the tests share: Zipf-distributed amounts, medians, log lines, numeric
//! knobs from the environment.

use std::io::{BufRead, BufReader};
use std::path::Path;

/// Reservations that follow Zipf's law (1, 1/2, 1/3, ...) and add up to `total`.
pub fn zipf(n: usize, total: u64) -> Vec<u64> {
    let h: f64 = (1..=n).map(|i| 1.0 / i as f64).sum();
    (1..=n)
        .map(|i| (total as f64 / (i as f64 * h)).floor() as u64)
        .collect()
}

/// A test's numeric knob: `var` from the environment, `None` when unset. A value that
/// is not a whole number stops the test with a message saying what to give (`what`),
/// rather than being ignored.
pub fn env_number(var: &str, what: &str) -> Option<u64> {
    let v = std::env::var(var).ok()?;
    Some(
        v.parse()
            .unwrap_or_else(|_| panic!("{var}={v:?}: give {what}")),
    )
}

/// The mean of `v` (0 when empty).
pub fn mean(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len().max(1) as f64
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

/// First quartile, median and third quartile of `v` (medians of the lower and upper
/// halves; zeros when empty).
pub fn quartiles(v: &[f64]) -> (f64, f64, f64) {
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    let n = s.len();
    let half = n / 2;
    (
        median(&s[..half.max(n.min(1))]),
        median(&s),
        median(&s[n - half.max(n.min(1))..]),
    )
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
    fn quartiles_of_odd_and_even_counts() {
        assert_eq!(quartiles(&[5.0, 1.0, 3.0, 2.0, 4.0]), (1.5, 3.0, 4.5));
        assert_eq!(quartiles(&[4.0, 1.0, 3.0, 2.0]), (1.5, 2.5, 3.5));
        assert_eq!(quartiles(&[7.0]), (7.0, 7.0, 7.0));
        assert_eq!(quartiles(&[]), (0.0, 0.0, 0.0));
    }

    #[test]
    fn zipf_sums_to_at_most_the_total() {
        let z = zipf(4, 9000);
        assert_eq!(z.len(), 4);
        assert!(z.iter().sum::<u64>() <= 9000);
        assert!(z[0] > 2 * z[1] - 2 && z[1] > z[2] && z[2] > z[3]);
    }
}
