//! N\*, the hosts' circulation the target runs at, learned online for an efficiency η
//! (issue 39 item 1; `operating_over_circulation`): the fewest commands circulating
//! outside QoS that keep what the target completes at η of what it completes holding
//! nothing.
//!
//! **Why toggling, not a curve of absolute rates.** These machines change speed by up
//! to 2x within seconds: a rate at one circulation and another at a second circulation
//! seconds apart say more about the machine than about the circulations, and holding
//! costs a CPU-bound NVMe/TCP target in batching as well as in circulation (a plain
//! host's sweep is not the held target's curve). So the instrument's lesson, in BBR's
//! gain-cycle spirit: once per [`CYCLE`] the hold targets are lifted for an open spell,
//! and the rate there is compared with the rate at N\* just before and just after it,
//! adjacent spans of [`MEASURE`] each:
//! `r = mean(T_before, T_after) / T_open`. The mean of the two held spans cancels a
//! speed change that is linear over the triplet. `r` is smoothed over cycles
//! ([`RATIO_WEIGHT`]); N\* steps down by 1/16 while the smoothed ratio is above η +
//! [`BAND`] (by 1/8 when [`FAR`] above) and up by 1/8 while it is below η (by 1/4 when
//! [`FAR`] below), within 1 ..=
//! the circulation: holding too much costs the total, holding too little only the
//! weights, so a noisy ratio's walk leans to holding less. The open spells are the
//! "periods with nothing held" that give T(N) for free; they take [`SETTLE`] +
//! [`MEASURE`] of every cycle, about 11 % of the time, during which the hosts' shares
//! follow their queue depths.
//!
//! **Why spans of 100 ms a second, not 10 ms every census cycle.** With 12-ms open
//! spells the learner read the held spans within 2 % of the open one at N\* = 59 while
//! the sustained total was 70 % of plain (real target, 2026-11-30): after the held
//! commands go, the hosts' commands take longer than such a spell to spread back over
//! the transport and the initiators, and the held spans beside it borrow from it. The
//! toggle instrument's 1-s phases showed the cost (B/A 0.970 at N\* = 110); spans of
//! 100 ms are the shortest near that scale that keep the time open near a tenth.
//!
//! Sans-IO: the caller passes the time, the offset into the cycle, the circulation and
//! a way to read the work completed (read only when a span starts or ends).

use serde::Serialize;

use crate::time::Nanos;

/// One triplet per cycle; the learner's cycle starts at its first check interval (and
/// again after a bypass).
pub const CYCLE: Nanos = Nanos::from_millis(1000);
/// Each of the three spans whose rates are compared.
pub const MEASURE: Nanos = Nanos::from_millis(100);
/// Left out after each switch: the held commands going at the open spell's start, and
/// the hosts' arrivals gathering in the hold queues at its end.
pub const SETTLE: Nanos = Nanos::from_millis(10);
/// Where in the cycle the triplet starts.
pub const TRIPLET_AT: Nanos = Nanos::from_millis(300);
/// Weight of a new triplet's ratio in the smoothed one, in 1/8 (about 4 cycles, 4 s, to
/// follow a change): a 12-ms triplet's ratio moved by 0.74-1.03 between cycles on the
/// real target with the load steady; spans of 100 ms average ten times as long.
pub const RATIO_WEIGHT: u64 = 2;
/// The smoothed ratio must be this far above η (thousandths) for N\* to go down, so it
/// settles within [η, η + band] rather than oscillating across η.
pub const BAND: u64 = 10;
/// A ratio this far below η (thousandths) moves N\* up by a quarter rather than an
/// eighth (a host that joined, a faster target); this far above, down by an eighth
/// rather than a sixteenth. With one triplet a second, steps of 1/32 took a minute from
/// 160 to the 25 of η = 0.80 (real target: 115 to 62 in 24 triplets).
pub const FAR: u64 = 50;

/// The held spans before and after the open spell (rates `before`, `after`) are within
/// half of each other and neither is empty: the load was steady over the triplet. A load that starts or stops
/// (the hosts' phases on the real target: triplets across them read 0.5-1.3) or a step
/// in the machine's speed is not linear over the triplet, and its ratio says nothing of
/// holding: the triplet is left out.
pub fn steady(before: u64, after: u64) -> bool {
    let (lo, hi) = (before.min(after), before.max(after));
    lo > 0 && hi.saturating_mul(2) <= lo.saturating_mul(3)
}

/// Where a cycle is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Stage {
    /// Held at N\*, nothing measured.
    Steady,
    /// Held at N\*, the span before the open spell.
    Before,
    /// Open, settling.
    OpenSettle,
    /// Open: nothing held for circulation, measured.
    Open,
    /// Held again, settling.
    HeldSettle,
    /// Held at N\*, the span after.
    After,
}

impl Stage {
    /// The stage at `offset` into the cycle.
    pub fn at(offset: Nanos) -> Stage {
        let o = offset.saturating_sub(TRIPLET_AT);
        if offset < TRIPLET_AT {
            return Stage::Steady;
        }
        let ends = [
            (MEASURE, Stage::Before),
            (SETTLE, Stage::OpenSettle),
            (MEASURE, Stage::Open),
            (SETTLE, Stage::HeldSettle),
            (MEASURE, Stage::After),
        ];
        let mut end = Nanos::ZERO;
        for (len, stage) in ends {
            end = end.saturating_add(len);
            if o < end {
                return stage;
            }
        }
        Stage::Steady
    }

    /// Nothing is held for circulation.
    pub fn open(self) -> bool {
        matches!(self, Stage::OpenSettle | Stage::Open)
    }
}

/// The learner's state (one per domain).
#[derive(Debug, Clone)]
pub struct CirculationProbe {
    eta_milli: u64,
    /// N\*, commands; `None` before the first triplet (nothing held).
    n_star: Option<u64>,
    stage: Stage,
    /// When the current span started and the work completed then.
    mark: Option<(Nanos, u64)>,
    before: Option<u64>,
    open: Option<u64>,
    /// Smoothed held/open ratio, thousandths.
    ratio_milli: Option<u64>,
    /// The last triplet's.
    last_ratio_milli: Option<u64>,
    triplets: u64,
    /// When the learner's cycle started (`None`: at the next check interval).
    cycle_start: Option<Nanos>,
}

/// What the learner reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct ProbeReport {
    /// N\* now (`None`: not learned yet, nothing held).
    pub n_star: Option<u64>,
    /// The smoothed ratio of the rate at N\* to the rate holding nothing, thousandths.
    pub ratio_milli: Option<u64>,
    /// The last triplet's ratio.
    pub last_ratio_milli: Option<u64>,
    /// Triplets measured.
    pub triplets: u64,
}

impl CirculationProbe {
    /// A learner for efficiency `eta_milli` (thousandths, 1 ..= 1000).
    pub fn new(eta_milli: u64) -> Self {
        CirculationProbe {
            eta_milli: eta_milli.clamp(1, 1000),
            n_star: None,
            stage: Stage::Steady,
            mark: None,
            before: None,
            open: None,
            ratio_milli: None,
            last_ratio_milli: None,
            triplets: 0,
            cycle_start: None,
        }
    }

    /// A new η keeps what was learned (N\* moves from where it is).
    pub fn set_eta(&mut self, eta_milli: u64) {
        self.eta_milli = eta_milli.clamp(1, 1000);
    }

    /// While the domain is bypassed (it holds nothing, so a triplet would compare the
    /// target with itself): no span is measured, N\* stays, and the cycle's triplet
    /// starts afresh. Returns N\* as [`Self::tick`] would hold it.
    pub fn pause(&mut self, circulating: u64) -> u64 {
        self.stage = Stage::Steady;
        self.mark = None;
        self.before = None;
        self.open = None;
        self.cycle_start = None;
        self.n_star
            .map_or(circulating, |n| n.clamp(1, circulating.max(1)))
    }

    /// In the open spell: nothing is held for circulation (the hosts' shares follow
    /// their queue depths, so what they complete now says nothing of their parts).
    pub fn is_open(&self) -> bool {
        self.stage.open()
    }

    /// From the open spell's start until the hosts are held again (the settling after
    /// it): what the hosts complete follows their queue depths.
    pub fn is_unsettled(&self) -> bool {
        matches!(
            self.stage,
            Stage::OpenSettle | Stage::Open | Stage::HeldSettle
        )
    }

    pub fn report(&self) -> ProbeReport {
        ProbeReport {
            n_star: self.n_star,
            ratio_milli: self.ratio_milli,
            last_ratio_milli: self.last_ratio_milli,
            triplets: self.triplets,
        }
    }

    /// A check interval at `now`, with the hosts circulating `circulating` commands in
    /// all; `work` reads the work the hosts completed so far (called only when a span
    /// starts or ends). Returns N\* to hold the hosts at now: `circulating` (nothing
    /// held for circulation) during the open spell and before anything was learned.
    pub fn tick(&mut self, now: Nanos, circulating: u64, work: impl FnOnce() -> u64) -> u64 {
        let start = *self.cycle_start.get_or_insert(now);
        let offset = Nanos(now.saturating_sub(start).0 % CYCLE.0);
        let stage = Stage::at(offset);
        if stage != self.stage {
            self.switch(now, stage, circulating, work());
        }
        match self.n_star {
            Some(n) if !stage.open() => n.clamp(1, circulating.max(1)),
            _ => circulating,
        }
    }

    fn switch(&mut self, now: Nanos, to: Stage, circulating: u64, work: u64) {
        let rate = self.mark.and_then(|(at, w)| {
            let dt = now.saturating_sub(at).0;
            (dt > 0).then(|| (work.saturating_sub(w) as u128 * 1_000_000_000 / dt as u128) as u64)
        });
        match (self.stage, to) {
            (Stage::Before, Stage::OpenSettle) => self.before = rate,
            (Stage::Open, Stage::HeldSettle) => self.open = rate,
            (Stage::After, _) => {
                let (before, open) = (self.before.take(), self.open.take());
                if let (Some(b), Some(o), Some(a)) = (before, open, rate)
                    && o > 0
                    && steady(b, a)
                {
                    self.learn(((b + a) / 2) as u128 * 1000 / o as u128, circulating);
                }
            }
            _ => {}
        }
        // A span is measured only when the stage before it was the one it follows (a
        // tick that jumps over a stage, a check interval longer than a span, leaves it
        // out).
        let follows = matches!(
            (self.stage, to),
            (Stage::Steady, Stage::Before)
                | (Stage::OpenSettle, Stage::Open)
                | (Stage::HeldSettle, Stage::After)
        );
        if to == Stage::Steady || to == Stage::Before {
            self.open = None;
            if to == Stage::Steady {
                self.before = None;
            }
        }
        self.mark = follows.then_some((now, work));
        self.stage = to;
    }

    fn learn(&mut self, ratio: u128, circulating: u64) {
        let ratio = ratio.min(u64::MAX as u128) as u64;
        self.triplets += 1;
        self.last_ratio_milli = Some(ratio);
        let smooth = match self.ratio_milli {
            None => ratio,
            Some(old) => (old * (8 - RATIO_WEIGHT) + ratio * RATIO_WEIGHT) / 8,
        };
        self.ratio_milli = Some(smooth);
        let prev = self.n_star.unwrap_or(circulating).max(1);
        let n = prev;
        let down = |d: u64| n - (n / d).max(1).min(n - 1);
        let n = if smooth > self.eta_milli + FAR {
            down(8)
        } else if smooth > self.eta_milli + BAND {
            down(16)
        } else if smooth + FAR < self.eta_milli {
            n + (n / 4).max(1)
        } else if smooth < self.eta_milli {
            n + (n / 8).max(1)
        } else {
            n
        };
        // N\* does not fall with a circulation that dips (a phase's start, a host
        // reconnecting): on the real target it fell from 160 to 8 that way and took
        // more than a 6-s phase to climb back (the hold target is capped at what
        // circulates anyway). It does not grow beyond what circulates.
        self.n_star = Some(n.min(circulating.max(prev)).max(1));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A target whose rate at `n` commands circulating is `peak * n / (n + half)`,
    /// times `speed` (thousandths) at time `t`.
    struct Target {
        peak: u64,
        half: u64,
    }

    /// A knee near 40 commands: at 160 circulating, 0.97 of T(160) needs about 90.
    fn knee() -> Target {
        Target {
            peak: 700_000,
            half: 4,
        }
    }

    impl Target {
        fn rate(&self, n: u64) -> u64 {
            self.peak * n / (n + self.half)
        }
    }

    /// Runs the learner for `cycles` of its cycles with 1 ms check intervals against
    /// `target` with `circulating` commands; `speed(t_ms)` scales the machine.
    fn run(
        p: &mut Clocked,
        target: &Target,
        circulating: u64,
        cycles: u64,
        speed: &dyn Fn(u64) -> u64,
    ) {
        let mut work: u64 = 0;
        let mut n = circulating;
        for ms in 0..cycles * CYCLE.0 / 1_000_000 {
            p.clock_ms += 1;
            let now = Nanos::from_millis(p.clock_ms);
            work += target.rate(n) * speed(ms) / 1000 / 1000;
            n = p.tick(now, circulating, || work);
        }
    }

    /// A learner and the test's clock (ms).
    struct Clocked {
        probe: CirculationProbe,
        clock_ms: u64,
    }

    impl std::ops::Deref for Clocked {
        type Target = CirculationProbe;
        fn deref(&self) -> &CirculationProbe {
            &self.probe
        }
    }

    impl std::ops::DerefMut for Clocked {
        fn deref_mut(&mut self) -> &mut CirculationProbe {
            &mut self.probe
        }
    }

    fn probe(eta_milli: u64) -> Clocked {
        Clocked {
            probe: CirculationProbe::new(eta_milli),
            clock_ms: 0,
        }
    }

    fn fewest_at(target: &Target, circulating: u64, eta_milli: u64) -> u64 {
        let full = target.rate(circulating);
        (1..=circulating)
            .find(|&n| target.rate(n) * 1000 >= full * eta_milli)
            .unwrap()
    }

    #[test]
    fn the_stages_follow_each_other_once_a_cycle() {
        let at = |ms| Stage::at(Nanos::from_millis(ms));
        assert_eq!(at(0), Stage::Steady);
        assert_eq!(at(299), Stage::Steady);
        assert_eq!(at(300), Stage::Before);
        assert_eq!(at(400), Stage::OpenSettle);
        assert_eq!(at(410), Stage::Open);
        assert_eq!(at(510), Stage::HeldSettle);
        assert_eq!(at(520), Stage::After);
        assert_eq!(at(620), Stage::Steady);
        assert_eq!(at(999), Stage::Steady);
    }

    #[test]
    fn nothing_is_held_before_a_triplet_and_during_the_open_spell() {
        let mut p = probe(970);
        assert_eq!(p.tick(Nanos::from_millis(1), 160, || 0), 160);
        p.clock_ms = 1;
        let target = Target {
            peak: 700_000,
            half: 8,
        };
        run(&mut p, &target, 160, 8, &|_| 1000);
        let n = p.report().n_star.unwrap();
        assert!(n < 160, "{:?}", p.report());
        // The cycle started at 1 ms: its open spell is 401-511 ms into each second.
        let at = |ms: u64| Nanos::from_millis(8001 + ms);
        assert_eq!(p.tick(at(450), 160, || 0), 160);
        assert_eq!(p.tick(at(700), 160, || 0), n);
    }

    #[test]
    fn n_star_settles_where_the_held_rate_is_eta_of_the_open_rate() {
        // A knee near 40 commands: at 160 circulating, 0.97 of T(160) needs about 90.
        let target = knee();
        for eta in [970, 900, 800] {
            let mut p = probe(eta);
            run(&mut p, &target, 160, 160, &|_| 1000);
            let n = p.report().n_star.unwrap();
            let want = fewest_at(&target, 160, eta);
            let got = target.rate(n) * 1000 / target.rate(160);
            assert!(
                got >= eta - 5 && got <= eta + BAND + 15,
                "eta {eta}: N* {n} (fewest {want}) gives {got}"
            );
        }
    }

    #[test]
    fn a_flat_curve_holds_a_lot_and_a_steep_one_nothing() {
        let mut flat = probe(970);
        run(
            &mut flat,
            &Target {
                peak: 700_000,
                half: 1,
            },
            160,
            200,
            &|_| 1000,
        );
        assert!(flat.report().n_star.unwrap() < 60, "{:?}", flat.report());
        let mut steep = probe(970);
        // Linear over the circulation (1.1 M/s at 160: the fluid sum counts whole
        // commands a millisecond, so a slower target would read flat).
        run(
            &mut steep,
            &Target {
                peak: 700_000_000,
                half: 100_000,
            },
            160,
            60,
            &|_| 1000,
        );
        assert!(
            steep.report().n_star.unwrap() >= 150,
            "{:?}",
            steep.report()
        );
    }

    #[test]
    fn a_machine_changing_speed_does_not_move_n_star_far() {
        let target = knee();
        // Speed steps between 1x and 0.5x every 700 ms (out of phase with the cycle).
        let mut p = probe(970);
        run(&mut p, &target, 160, 160, &|ms| {
            if (ms / 700) % 2 == 0 { 1000 } else { 500 }
        });
        let n = p.report().n_star.unwrap();
        let got = target.rate(n) * 1000 / target.rate(160);
        assert!((950..=1000).contains(&got), "N* {n} gives {got}");
    }

    #[test]
    fn a_bypass_pauses_the_learning() {
        let target = knee();
        let mut p = probe(970);
        run(&mut p, &target, 160, 100, &|_| 1000);
        let before = p.report();
        // A second bypassed: every check interval pauses; nothing is measured.
        for ms in 0..1000 {
            p.clock_ms += 1;
            assert_eq!(p.pause(160), before.n_star.unwrap(), "at {ms} ms");
        }
        assert_eq!(p.report(), before);
        assert!(!p.is_open());
    }

    #[test]
    fn more_hosts_raise_n_star_within_a_few_cycles() {
        let target = knee();
        let mut p = probe(970);
        run(&mut p, &target, 80, 100, &|_| 1000);
        let low = p.report().n_star.unwrap();
        // Held far below what 320 commands need: the ratio falls, N* climbs.
        run(&mut p, &target, 320, 40, &|_| 1000);
        let high = p.report().n_star.unwrap();
        let got = target.rate(high) * 1000 / target.rate(320);
        assert!(high > low && got >= 960, "{low} -> {high}: {got}");
    }

    #[test]
    fn a_load_that_stops_or_starts_within_a_triplet_teaches_nothing() {
        assert!(steady(100, 149) && steady(149, 100) && !steady(100, 151) && !steady(0, 5));
        assert!(!steady(0, 0), "no load at all is not a load to learn from");
        let target = knee();
        let mut p = probe(970);
        run(&mut p, &target, 160, 60, &|_| 1000);
        let learned = p.report();
        // The load stops 450 ms into each cycle (in the open spell) and comes back at
        // the next cycle's start: every triplet's after span is empty.
        run(&mut p, &target, 160, 20, &|ms| {
            if ms % 1000 < 450 { 1000 } else { 0 }
        });
        assert_eq!(p.report().n_star, learned.n_star);
        assert_eq!(p.report().triplets, learned.triplets);
    }

    #[test]
    fn a_circulation_that_dips_leaves_n_star_where_it_was() {
        let target = knee();
        let mut p = probe(970);
        run(&mut p, &target, 160, 100, &|_| 1000);
        let learned = p.report().n_star.unwrap();
        assert!(learned > 20, "{:?}", p.report());
        // Two cycles with only 8 commands circulating (a phase starting): nothing can be
        // held, the learner measures open against open.
        run(&mut p, &target, 8, 2, &|_| 1000);
        // (The open-against-open triplets step it down by 1/32 each, as any ratio above
        // the band; before, it fell to the 8 circulating.)
        let after_dip = p.report().n_star.unwrap();
        assert!(after_dip * 8 >= learned * 7, "{learned} -> {after_dip}");
        run(&mut p, &target, 160, 1, &|_| 1000);
        let back = p.report().n_star.unwrap();
        assert!(
            back * 8 >= learned * 7,
            "{learned} -> {after_dip} -> {back}"
        );
    }

    proptest! {
        #[test]
        fn n_star_stays_within_one_and_the_circulation(
            ratios in proptest::collection::vec(0u128..3000, 1..200),
            circulating in 1u64..10_000,
            eta in 1u64..=1000,
        ) {
            let mut p = CirculationProbe::new(eta);
            for r in ratios {
                p.learn(r, circulating);
                let n = p.report().n_star.unwrap();
                prop_assert!((1..=circulating).contains(&n));
            }
        }
    }
}
