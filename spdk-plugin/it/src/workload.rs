//! The hosts' loads of the side-by-side test and the instrument (`QOS_IT_WORKLOAD`,
//! `QOS_IT_QDS`, `QOS_IT_RES`): issue 26's and issue 38's acceptance configurations, one
//! bdevperf job per host.

use it_harness::Job;

/// One host's load in the side-by-side test.
#[derive(Debug, Clone, Copy)]
pub struct HostLoad {
    pub qd: u32,
    /// bdevperf's `rw`, and the percent of reads of a mixed one.
    pub rw: &'static str,
    pub read_mix: Option<u32>,
    pub bs: u64,
    pub weight: u32,
    /// Reservation, percent of the capacity hint.
    pub res_pct: u64,
}

impl HostLoad {
    pub fn job(&self, bdev: &str) -> Job {
        let j = Job::new(bdev, self.rw, self.bs, self.qd);
        match self.read_mix {
            Some(m) => j.with_read_mix(m),
            None => j,
        }
    }

    pub fn describe(&self) -> String {
        let mix = self
            .read_mix
            .map_or(String::new(), |m| format!(" {m}% reads"));
        format!("QD {} {} {} KiB{mix}", self.qd, self.rw, self.bs / 1024)
    }
}

/// The side-by-side test's hosts, by `QOS_IT_WORKLOAD` (issue 26's acceptance
/// configurations): `four` (default: QD 16/32/48/64 4 KiB random reads, weights
/// 4/3/2/1 or `QOS_IT_WEIGHTS`, reservations `default_res` %; `QOS_IT_QDS` and
/// `QOS_IT_RES` apply), `eight`
/// (QD 4 to 128, weights and reservations of the lab's `op-depth-8hosts`; eight
/// `QOS_IT_RES` apply), `rw` (the
/// four with 70/30 random reads and writes), `big` (the four, hosts 2 and 4 reading
/// 128 KiB).
pub fn side_by_side_workload(default_res: [u64; 4]) -> (String, Vec<HostLoad>) {
    let name = std::env::var("QOS_IT_WORKLOAD").unwrap_or_else(|_| "four".into());
    let four = |rw: &'static str, read_mix, big: bool| -> Vec<HostLoad> {
        let (qds, res, weights) = (
            queue_depths([16, 32, 48, 64]),
            percents("QOS_IT_RES", &default_res),
            weights([4, 3, 2, 1]),
        );
        (0..4)
            .map(|k| HostLoad {
                qd: qds[k],
                rw,
                read_mix,
                bs: if big && k % 2 == 1 { 128 * 1024 } else { 4096 },
                weight: weights[k],
                res_pct: res[k],
            })
            .collect()
    };
    let loads = match name.as_str() {
        "four" => four("randread", None, false),
        "rw" => four("randrw", Some(70), false),
        "big" => four("randread", None, true),
        "eight" => {
            let res = percents("QOS_IT_RES", &[2, 3, 5, 5, 10, 8, 5, 3]);
            [
                (4, 8),
                (8, 1),
                (16, 4),
                (24, 2),
                (32, 3),
                (48, 1),
                (64, 2),
                (128, 1),
            ]
            .into_iter()
            .zip(res)
            .map(|((qd, weight), res_pct)| HostLoad {
                qd,
                rw: "randread",
                read_mix: None,
                bs: 4096,
                weight,
                res_pct,
            })
            .collect()
        }
        other => panic!("QOS_IT_WORKLOAD={other:?}: give four, eight, rw or big"),
    };
    (name, loads)
}

/// The four hosts' weights: `default`, or `QOS_IT_WEIGHTS` (four numbers, commas).
pub fn weights(default: [u32; 4]) -> [u32; 4] {
    let Ok(v) = std::env::var("QOS_IT_WEIGHTS") else {
        return default;
    };
    let w: Vec<u32> = v.split(',').filter_map(|x| x.trim().parse().ok()).collect();
    match <[u32; 4]>::try_from(w) {
        Ok(w) if w.iter().all(|&x| (1..=1000).contains(&x)) => w,
        _ => panic!("QOS_IT_WEIGHTS={v:?}: give four weights 1..=1000, e.g. 1,1,4,8"),
    }
}

/// The four hosts' queue depths: `default`, or `QOS_IT_QDS` (four numbers, commas).
pub fn queue_depths(default: [u32; 4]) -> [u32; 4] {
    let Ok(v) = std::env::var("QOS_IT_QDS") else {
        return default;
    };
    let qds: Vec<u32> = v.split(',').filter_map(|x| x.trim().parse().ok()).collect();
    match <[u32; 4]>::try_from(qds) {
        Ok(q) if q.iter().all(|&d| (1..=1024).contains(&d)) => q,
        _ => panic!("QOS_IT_QDS={v:?}: give four queue depths 1..=1024, e.g. 64,128,192,256"),
    }
}

/// As many percentages as `default` has (one per host) from environment variable
/// `var`, or `default`.
pub fn percents(var: &str, default: &[u64]) -> Vec<u64> {
    let Ok(v) = std::env::var(var) else {
        return default.to_vec();
    };
    let p: Vec<u64> = v.split(',').filter_map(|x| x.trim().parse().ok()).collect();
    if p.len() == default.len() && p.iter().sum::<u64>() <= 100 {
        return p;
    }
    let example: Vec<String> = default.iter().map(u64::to_string).collect();
    panic!(
        "{var}={v:?}: give {} percentages (one per host) summing to at most 100, e.g. {}",
        default.len(),
        example.join(",")
    )
}
