//! What a new user meets at the command line: refused arguments with a message a person
//! can act on, a verdict per policy, the legend, and latencies that say at what scale
//! they were simulated.

use std::process::{Command, Output};

use qos_lab::Summary;
use qos_lab::plot::small_and_large;

fn qos_lab(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_qos-lab"))
        .args(args)
        .output()
        .unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn zero_periods_and_zero_scale_are_refused() {
    for (flag, value) in [("--periods", "0"), ("--scale", "0")] {
        let o = qos_lab(&["run", "haechi-1c-uniform", flag, value]);
        assert_eq!(o.status.code(), Some(2), "{flag} {value}: {}", stderr(&o));
        let e = stderr(&o);
        assert!(e.contains(flag) && e.contains("0 is not in 1.."), "{e}");
    }
}

#[test]
fn a_float_capacity_is_refused_in_words() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("f.toml");
    std::fs::write(
        &f,
        "[target]\ncapacity_iops = 1.57e6\n[[host]]\nname = \"a\"\n",
    )
    .unwrap();
    let o = qos_lab(&["run", f.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    let e = stderr(&o);
    assert!(
        e.contains("f.toml:2:17: target.capacity_iops: expected a whole number"),
        "{e}"
    );
    assert!(e.contains("write 1570000"), "{e}");
    assert!(
        !e.contains("i64") && !e.contains("u64"),
        "no Rust type names: {e}"
    );
}

#[test]
fn a_plot_in_a_missing_folder_is_refused_before_simulating() {
    let dir = tempfile::tempdir().unwrap();
    let png = dir.path().join("no/such/folder/x.png");
    let o = qos_lab(&[
        "run",
        "haechi-1c-uniform",
        "--periods",
        "1",
        "--scale",
        "100",
        "--plot",
        png.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(1));
    let e = stderr(&o);
    assert!(
        e.contains("the folder") && e.contains("does not exist"),
        "{e}"
    );
    assert!(!e.contains("BackendError"), "{e}");
    assert!(o.stdout.is_empty(), "nothing was simulated");
}

#[test]
fn an_unknown_scenario_points_to_list() {
    let o = qos_lab(&["run", "haechi-2a-zpif"]);
    assert_eq!(o.status.code(), Some(2));
    let e = stderr(&o);
    assert!(e.contains("qos-lab list"), "{e}");
    let o = qos_lab(&["check", "nope.toml"]);
    assert!(stderr(&o).contains("qos-lab list"));
}

#[test]
fn the_table_has_a_verdict_per_policy_the_legend_and_labelled_latencies() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("s.json");
    let o = qos_lab(&[
        "run",
        "haechi-2a-zipf",
        "--periods",
        "2",
        "--scale",
        "100",
        "--json",
        json.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = String::from_utf8(o.stdout).unwrap();
    let sum: Summary = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let verdicts: Vec<&str> = out
        .lines()
        .filter(|l| l.trim_start().starts_with("verdict: "))
        .collect();
    assert_eq!(verdicts.len(), sum.policies.len(), "{out}");
    // The verdict's numbers are the summary's: bare's own line has no comparison, the
    // others compare with bare.
    for (v, p) in verdicts.iter().zip(&sum.policies) {
        assert_eq!(v.trim_start(), format!("verdict: {}", sum.verdict(p)));
        assert_eq!(v.contains("% of bare"), p.policy != "bare", "{v}");
    }
    assert!(
        out.contains("p99@1/100"),
        "latencies say their scale: {out}"
    );
    assert!(out.contains("NOT of the real target"), "{out}");
    assert!(out.contains("MiB/s"), "{out}");
    for word in ["Columns", "first_come/start", "ns-limit", "+pacing", "met "] {
        assert!(out.contains(word), "legend explains {word}: {out}");
    }
    let help = qos_lab(&["run", "--help"]);
    assert!(String::from_utf8_lossy(&help.stdout).contains("Policies ("));
}

#[test]
fn verdict_counts_hosts_that_always_met_their_reservation() {
    let text = r#"{"scenario":"x","seed":1,"scale":1,"period_ms":1000,"warmup_periods":0,
      "measured_periods":2,"policies":[
       {"policy":"bare","total_iops":1000.0,"total_mib_per_s":4.0,"hosts":[
         {"host":"a","reservation_iops":10,"limit_iops":null,"periods":[5,20],"mean_iops":12.5,
          "mib_per_s":0.1,"reservation_met_fraction":0.5,"latency_us":{"p50":1.0,"p99":2.0,"p999":3.0}}]},
       {"policy":"weighted","total_iops":990.0,"total_mib_per_s":4.0,"hosts":[
         {"host":"a","reservation_iops":10,"limit_iops":null,"periods":[15,20],"mean_iops":17.5,
          "mib_per_s":0.1,"reservation_met_fraction":1.0,"latency_us":{"p50":1.0,"p99":2.0,"p999":3.0}}]}]}"#;
    let s: Summary = serde_json::from_str(text).unwrap();
    assert_eq!(
        s.verdict(&s.policies[0]),
        "0 of 1 hosts with a reservation met it in every period (worst: a in 50.0%); total 1,000 IOPS"
    );
    assert_eq!(
        s.verdict(&s.policies[1]),
        "all 1 hosts with a reservation met it in 100% of periods; total 990 IOPS = 99.0% of bare"
    );
    assert_eq!(small_and_large(&s), None, "no pacing policy");
}

#[test]
fn reader_writer_plot_picks_the_reader_and_the_writer() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("rw.json");
    let o = qos_lab(&[
        "run",
        "reader-writer",
        "--periods",
        "1",
        "--scale",
        "10",
        "--json",
        json.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let s: Summary = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let (r, w) = small_and_large(&s).expect("a pacing scenario");
    assert_eq!(s.policies[0].hosts[r].host, "reader");
    assert_eq!(s.policies[0].hosts[w].host, "writer");
    let png = dir.path().join("rw.png");
    qos_lab::plot::render_with(&s, &png, false).unwrap();
    assert!(std::fs::metadata(&png).unwrap().len() > 1000);
}
