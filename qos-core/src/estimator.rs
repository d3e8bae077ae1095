//! Adaptive capacity estimation, exactly Haechi's Algorithm 1, for one resource.
//!
//! After each period the work completed by all hosts, U, is compared with the estimate
//! Omega_t that sized the period's tokens:
//! - U reached Omega_t (all tokens were used): the target may do more; add eta.
//! - Omega_min <= U < Omega_t: record U in a window of the last M such periods and use
//!   the window's mean.
//! - U < Omega_min (a low-demand period): keep the estimate; such periods say nothing
//!   about capacity.
//!
//! Omega_min = Omega_prof - 3 sigma keeps idle periods from dragging the estimate down.

use std::collections::VecDeque;

use crate::config::EstimatorConfig;
use crate::time::mul_div;

#[derive(Debug, Clone)]
pub struct CapacityEstimator {
    enabled: bool,
    floor: u64,
    eta: u64,
    tolerance_milli: u64,
    window: VecDeque<u64>,
    window_len: usize,
    current: u64,
}

/// What the estimator did with a period's figure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EstimateStep {
    /// All tokens were used: raised by eta.
    Raised,
    /// Recorded in the window; estimate is the window mean.
    Averaged,
    /// Below the floor: ignored.
    Ignored,
    /// Estimation is off.
    Fixed,
}

impl CapacityEstimator {
    /// `profiled` and `stddev` are per period, in cost units.
    pub fn new(cfg: &EstimatorConfig, profiled: u64, stddev: u64) -> Self {
        CapacityEstimator {
            enabled: cfg.enabled,
            floor: profiled.saturating_sub(stddev.saturating_mul(3)),
            eta: mul_div(profiled, cfg.increment_milli, 1000).max(1),
            tolerance_milli: cfg.saturation_tolerance_milli,
            window: VecDeque::with_capacity(cfg.history),
            window_len: cfg.history.max(1),
            current: profiled,
        }
    }

    /// The estimate Omega_t for the coming period.
    pub fn current(&self) -> u64 {
        self.current
    }
    pub fn floor(&self) -> u64 {
        self.floor
    }

    /// Feeds the work `used` in the period that was sized by `current()`.
    pub fn observe(&mut self, used: u64) -> EstimateStep {
        if !self.enabled {
            return EstimateStep::Fixed;
        }
        let tolerance = mul_div(self.current, self.tolerance_milli, 1000);
        if used.saturating_add(tolerance) >= self.current {
            self.current = self.current.saturating_add(self.eta);
            EstimateStep::Raised
        } else if used >= self.floor {
            if self.window.len() == self.window_len {
                self.window.pop_front();
            }
            self.window.push_back(used);
            let sum: u128 = self.window.iter().map(|&u| u as u128).sum();
            self.current = (sum / self.window.len() as u128) as u64;
            EstimateStep::Averaged
        } else {
            EstimateStep::Ignored
        }
    }

    /// Replaces the profile (operator re-profiled the target); forgets the history.
    pub fn reset(&mut self, cfg: &EstimatorConfig, profiled: u64, stddev: u64) {
        *self = CapacityEstimator::new(cfg, profiled, stddev);
    }
}

/// Haechi's reservation-use alarm: counts the periods in a row in which a host used less
/// than its reservation, and flags it once the count reaches a threshold.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct UnderuseCounter {
    pub periods: u32,
}

impl UnderuseCounter {
    pub fn observe(&mut self, used_reservation: bool) {
        if used_reservation {
            self.periods = 0;
        } else {
            self.periods = self.periods.saturating_add(1);
        }
    }
    pub fn flagged(&self, threshold: u32) -> bool {
        threshold > 0 && self.periods >= threshold
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> EstimatorConfig {
        EstimatorConfig {
            history: 3,
            increment_milli: 10,
            saturation_tolerance_milli: 0,
            ..Default::default()
        }
    }

    #[test]
    fn saturated_period_raises_by_eta() {
        let mut e = CapacityEstimator::new(&cfg(), 1000, 50);
        assert_eq!(e.floor(), 850);
        assert_eq!(e.observe(1000), EstimateStep::Raised);
        assert_eq!(e.current(), 1010);
    }

    #[test]
    fn window_mean_of_the_last_m_periods_above_the_floor() {
        let mut e = CapacityEstimator::new(&cfg(), 1000, 50);
        assert_eq!(e.observe(900), EstimateStep::Averaged);
        assert_eq!(e.current(), 900);
        assert_eq!(e.observe(870), EstimateStep::Averaged);
        assert_eq!(e.current(), 885);
        e.observe(870);
        e.observe(860); // 900 falls out of the window of 3
        assert_eq!(e.current(), (870 + 870 + 860) / 3);
    }

    #[test]
    fn low_demand_periods_are_ignored() {
        let mut e = CapacityEstimator::new(&cfg(), 1000, 50);
        assert_eq!(e.observe(10), EstimateStep::Ignored);
        assert_eq!(e.current(), 1000);
    }

    #[test]
    fn disabled_estimator_keeps_the_profile() {
        let mut e = CapacityEstimator::new(
            &EstimatorConfig {
                enabled: false,
                ..cfg()
            },
            1000,
            0,
        );
        assert_eq!(e.observe(1000), EstimateStep::Fixed);
        assert_eq!(e.current(), 1000);
    }

    #[test]
    fn underuse_flag_needs_consecutive_periods() {
        let mut u = UnderuseCounter::default();
        u.observe(false);
        u.observe(false);
        assert!(!u.flagged(3));
        u.observe(false);
        assert!(u.flagged(3));
        u.observe(true);
        assert!(!u.flagged(3));
        assert!(!u.flagged(0));
    }
}
