//! The scenarios shipped in `qos-lab/scenarios/`, compiled in so that `qos-lab list`
//! and `qos-lab run NAME` work from anywhere, and so the test suite runs every one.

/// (name, file text) of every shipped scenario, in the order `list` prints them.
pub const SHIPPED: &[(&str, &str)] = &[(
    "haechi-2a-zipf",
    include_str!("../scenarios/haechi-2a-zipf.toml"),
)];

/// The text of the shipped scenario `name`.
pub fn find(name: &str) -> Option<&'static str> {
    SHIPPED.iter().find(|(n, _)| *n == name).map(|(_, t)| *t)
}

/// The path a shipped scenario has in the repository, for messages.
pub fn path_of(name: &str) -> String {
    format!("qos-lab/scenarios/{name}.toml")
}
