//! The scenarios shipped in `qos-lab/scenarios/`, compiled in so that `qos-lab list`
//! and `qos-lab run NAME` work from anywhere, and so the test suite runs every one.

/// (name, file text) of every shipped scenario, in the order `list` prints them.
pub const SHIPPED: &[(&str, &str)] = &[
    (
        "haechi-1c-uniform",
        include_str!("../scenarios/haechi-1c-uniform.toml"),
    ),
    (
        "haechi-1c-spike",
        include_str!("../scenarios/haechi-1c-spike.toml"),
    ),
    (
        "haechi-2a-uniform",
        include_str!("../scenarios/haechi-2a-uniform.toml"),
    ),
    (
        "haechi-2a-zipf",
        include_str!("../scenarios/haechi-2a-zipf.toml"),
    ),
    (
        "haechi-2b-uniform",
        include_str!("../scenarios/haechi-2b-uniform.toml"),
    ),
    (
        "haechi-2b-zipf",
        include_str!("../scenarios/haechi-2b-zipf.toml"),
    ),
    (
        "haechi-2c-zipf",
        include_str!("../scenarios/haechi-2c-zipf.toml"),
    ),
    (
        "haechi-3-spike",
        include_str!("../scenarios/haechi-3-spike.toml"),
    ),
    (
        "haechi-4-over",
        include_str!("../scenarios/haechi-4-over.toml"),
    ),
    (
        "haechi-4-under",
        include_str!("../scenarios/haechi-4-under.toml"),
    ),
    (
        "reader-writer",
        include_str!("../scenarios/reader-writer.toml"),
    ),
    ("qd-weights", include_str!("../scenarios/qd-weights.toml")),
    (
        "qd-unreachable",
        include_str!("../scenarios/qd-unreachable.toml"),
    ),
    (
        "qd-weights-depth",
        include_str!("../scenarios/qd-weights-depth.toml"),
    ),
    (
        "op-weights-depth",
        include_str!("../scenarios/op-weights-depth.toml"),
    ),
    (
        "op-weights-depth-inverse",
        include_str!("../scenarios/op-weights-depth-inverse.toml"),
    ),
    (
        "op-depth-8hosts",
        include_str!("../scenarios/op-depth-8hosts.toml"),
    ),
    (
        "op-circulation",
        include_str!("../scenarios/op-circulation.toml"),
    ),
    (
        "op-circulation-inverse",
        include_str!("../scenarios/op-circulation-inverse.toml"),
    ),
    (
        "op-circulation-eta",
        include_str!("../scenarios/op-circulation-eta.toml"),
    ),
    (
        "op-circulation-eta-noisy",
        include_str!("../scenarios/op-circulation-eta-noisy.toml"),
    ),
    (
        "qd-capacity-drop",
        include_str!("../scenarios/qd-capacity-drop.toml"),
    ),
    ("groups", include_str!("../scenarios/groups.toml")),
    (
        "priority-soft",
        include_str!("../scenarios/priority-soft.toml"),
    ),
    ("boot-storm", include_str!("../scenarios/boot-storm.toml")),
];

/// The text of the shipped scenario `name`.
pub fn find(name: &str) -> Option<&'static str> {
    SHIPPED.iter().find(|(n, _)| *n == name).map(|(_, t)| *t)
}

/// The path a shipped scenario has in the repository, for messages.
pub fn path_of(name: &str) -> String {
    format!("qos-lab/scenarios/{name}.toml")
}
