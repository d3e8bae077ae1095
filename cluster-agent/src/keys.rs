//! The cluster's state in etcd: the key layout under `/nvmf-qos/<cluster>/` and the
//! JSON record stored at each key (docs/cluster.md lists them with their timing).

use std::collections::BTreeMap;

use qos_core::cluster::{ClusterHost, DivideConfig, LocalShare, PathDemand, Plan};
use serde::{Deserialize, Serialize};
use thiserror::Error;

/// Every key of the project starts with this.
pub const ROOT: &str = "/nvmf-qos";

/// A cluster or target name the agent refuses.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum NameError {
    #[error(
        "{what} {name:?}: use 1 ..= 64 letters, digits and - _ . : (it becomes part of etcd keys)"
    )]
    Bad { what: &'static str, name: String },
}

/// Checks a cluster or target name.
pub fn check_name(what: &'static str, name: &str) -> Result<(), NameError> {
    let ok = (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.:".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(NameError::Bad {
            what,
            name: name.into(),
        })
    }
}

/// The keys of one cluster.
#[derive(Debug, Clone)]
pub struct Keys {
    base: String,
}

impl Keys {
    pub fn new(cluster: &str) -> Keys {
        Keys {
            base: format!("{ROOT}/{cluster}/"),
        }
    }
    /// Everything of the cluster.
    pub fn all(&self) -> String {
        self.base.clone()
    }
    /// [`ClusterRecord`], written by `cluster create`.
    pub fn config(&self) -> String {
        format!("{}config", self.base)
    }
    /// Prefix of the hosts' contracts ([`ClusterHost`] per NQN).
    pub fn hosts(&self) -> String {
        format!("{}hosts/", self.base)
    }
    pub fn host(&self, nqn: &str) -> String {
        format!("{}{nqn}", self.hosts())
    }
    /// Prefix of the live targets ([`MemberRecord`], under each agent's lease).
    pub fn members(&self) -> String {
        format!("{}members/", self.base)
    }
    pub fn member(&self, target: &str) -> String {
        format!("{}{target}", self.members())
    }
    /// Prefix of the demand reports ([`DemandRecord`], under each agent's lease).
    pub fn demands(&self) -> String {
        format!("{}demand/", self.base)
    }
    pub fn demand(&self, target: &str) -> String {
        format!("{}{target}", self.demands())
    }
    /// The leader's target name, under its lease.
    pub fn leader(&self) -> String {
        format!("{}leader", self.base)
    }
    /// [`SharesRecord`], written by the leader (key schema 1: the whole division).
    pub fn shares(&self) -> String {
        format!("{}shares", self.base)
    }
    /// [`DivisionRecord`], written by the leader (key schema 2: the division's head).
    pub fn division(&self) -> String {
        format!("{}division", self.base)
    }
    /// Prefix of the division's parts ([`PartRecord`] per target, key schema 2).
    pub fn parts(&self) -> String {
        format!("{}parts/", self.base)
    }
    pub fn part(&self, target: &str) -> String {
        format!("{}{target}", self.parts())
    }
}

/// The newest layout and records of the keys this agent reads and writes (it reads and
/// writes every older one too); a cluster of a larger one is refused rather than
/// misread. A new cluster is created with it.
pub const KEY_SCHEMA: u32 = SCHEMA_PATHS;

/// Key schema 1: the leader writes the whole division as one record ([`Keys::shares`]),
/// which every agent reads. At 64 targets and 1,000 hosts it is several MB, above
/// etcd's request limit (1.5 MiB by default).
pub const SCHEMA_ONE_RECORD: u32 = 1;

/// Key schema 2: the leader writes each target's part of the division under the
/// target's own key ([`Keys::part`]) when it changed, then a small head naming the
/// division and the part of each target in it ([`Keys::division`]); each agent reads
/// the head and its own part only.
pub const SCHEMA_PER_TARGET: u32 = 2;

/// Key schema 3: as schema 2, but a part lists only the hosts with a path at its
/// target (and those seen nowhere yet); a host it leaves out holds its cold share there
/// (`qos_core::cluster::cold_share`: no reservation, limit 1). An agent of schema 2
/// would leave such a host at whatever it held: it refuses the cluster instead.
pub const SCHEMA_PATHS: u32 = 3;

/// Whether a part of a division in key `schema` may leave hosts out (they hold their
/// cold share); in older schemas a part lists every host.
pub fn parts_list_paths_only(schema: u32) -> bool {
    schema >= SCHEMA_PATHS
}

fn schema_before_versions() -> u32 {
    1
}

/// The cluster's own settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterRecord {
    #[serde(flatten)]
    pub divide: DivideConfig,
    /// The key schema the cluster was created with (absent before schemas: 1).
    #[serde(default = "schema_before_versions")]
    pub schema: u32,
}

impl ClusterRecord {
    /// A new cluster's settings, of the newest key schema.
    pub fn new(divide: DivideConfig) -> Self {
        ClusterRecord {
            divide,
            schema: KEY_SCHEMA,
        }
    }

    /// Parses the record at `key`, refusing one of a key schema this agent does not know.
    pub fn read(key: &str, value: &str) -> Result<ClusterRecord, String> {
        let rec: ClusterRecord = parse(key, value)?;
        if rec.schema > KEY_SCHEMA {
            return Err(format!(
                "{key}: the cluster was created with key schema {} by a newer nvmf-qos-agent; this agent reads schema {KEY_SCHEMA}: upgrade it (nothing was read or changed)",
                rec.schema
            ));
        }
        Ok(rec)
    }
}

impl Default for ClusterRecord {
    fn default() -> Self {
        ClusterRecord::new(DivideConfig::default())
    }
}

/// A live target, as its agent last wrote it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MemberRecord {
    pub target: String,
    pub domain: String,
    /// The target's capacity estimate, operations per second.
    pub capacity_iops: u64,
    pub period_ms: u64,
    /// What the target holds for each cluster host now (read back from it).
    pub applied: BTreeMap<String, LocalShare>,
    /// The last refusal of the target, if its share could not be applied.
    pub error: Option<String>,
    /// Where its peers read its handover report (`http://ADDR/handover`) while etcd is
    /// away; absent when the agent serves no HTTP.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub handover_url: Option<String>,
}

/// What each host did at one target in its last ended period.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct DemandRecord {
    pub hosts: BTreeMap<String, PathDemand>,
}

/// The division the leader made.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SharesRecord {
    /// Counts the leader's writes (each new leader starts above the last one).
    pub seq: u64,
    pub leader: String,
    /// The live targets the division was made over.
    pub members: Vec<String>,
    pub plan: Plan,
    /// The members' handover URLs, for the agents to trade by while etcd is away.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub peers: BTreeMap<String, String>,
}

/// The head of a division (key schema 2): which division it is and, per target, the
/// `seq` its part ([`PartRecord`]) was written at. The leader writes it after the
/// parts, so a part the head names is there; an agent applies its part only when the
/// part's `seq` and `leader` are the ones the head names (otherwise the leader is
/// writing the next division, or a former leader's part was left over: it waits).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DivisionRecord {
    /// The division's number: counts the leader's divisions, each new leader starting
    /// above the last one (also above a schema-1 record's `seq`).
    pub seq: u64,
    pub leader: String,
    /// The live targets the division was made over.
    pub members: Vec<String>,
    /// Per member: the division whose part it holds (a part that did not change is not
    /// written again).
    pub parts: BTreeMap<String, u64>,
    /// The members' handover URLs, for the agents to trade by while etcd is away.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub peers: BTreeMap<String, String>,
}

/// One target's part of a division (key schema 2): its share of every host.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PartRecord {
    /// The division it was written for.
    pub seq: u64,
    pub leader: String,
    /// The target it is for (a part under another target's key is refused).
    pub target: String,
    pub shares: BTreeMap<String, LocalShare>,
}

/// Parses a record; the message names the key.
pub fn parse<T: serde::de::DeserializeOwned>(key: &str, value: &str) -> Result<T, String> {
    serde_json::from_str(value).map_err(|e| format!("{key}: {e}"))
}

/// The hosts' contracts from a listing of [`Keys::hosts`]; unreadable entries are skipped
/// and named in `bad`.
pub fn hosts_of(
    keys: &Keys,
    listing: Vec<(String, String)>,
    bad: &mut Vec<String>,
) -> BTreeMap<String, ClusterHost> {
    let prefix = keys.hosts();
    listing
        .into_iter()
        .filter_map(|(k, v)| {
            let nqn = k.strip_prefix(&prefix)?.to_string();
            parse(&k, &v)
                .map_err(|e| bad.push(e))
                .ok()
                .map(|h| (nqn, h))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cluster_of_a_newer_key_schema_is_refused_with_the_fix() {
        let k = Keys::new("c").config();
        let now = serde_json::to_string(&ClusterRecord::default()).unwrap();
        assert!(now.contains("\"schema\":3"), "{now}");
        assert_eq!(
            ClusterRecord::read(&k, &now).unwrap(),
            ClusterRecord::default()
        );
        // Written before schemas: read as schema 1.
        let old = now.replace(",\"schema\":3", "");
        assert!(!old.contains("schema"), "{old}");
        assert_eq!(ClusterRecord::read(&k, &old).unwrap().schema, 1);
        let two = now.replace("\"schema\":3", "\"schema\":2");
        assert_eq!(ClusterRecord::read(&k, &two).unwrap().schema, 2);
        let future = now.replace("\"schema\":3", "\"schema\":4");
        let e = ClusterRecord::read(&k, &future).unwrap_err();
        assert!(e.contains("schema 4") && e.contains("upgrade"), "{e}");
    }

    #[test]
    fn names_are_checked() {
        assert!(check_name("cluster", "c-1.a:b_2").is_ok());
        assert!(check_name("cluster", "").is_err());
        let e = check_name("target", "a/b").unwrap_err();
        assert!(e.to_string().contains("letters, digits"), "{e}");
    }

    #[test]
    fn cluster_record_reads_its_defaults_flat() {
        let r: ClusterRecord = parse("k", r#"{"floor_milli":20,"headroom_milli":100}"#).unwrap();
        assert_eq!(
            r,
            ClusterRecord {
                schema: SCHEMA_ONE_RECORD,
                ..ClusterRecord::default()
            }
        );
    }
}
