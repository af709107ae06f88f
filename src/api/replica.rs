//! The two identities a replica travels by: its name and its shard's index. Each is its own
//! type, so that a replica's name is never taken for a pod's or an object's, nor a shard's index
//! for a replica's creation index; on the wire (the status, the agents' settings) they are the
//! plain string and integer.

use std::borrow::Borrow;
use std::fmt;
use std::ops::Deref;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A server replica's name: its StatefulSet's name, `<cluster>-<shard>-<index>`. Its pod is
/// `<name>-0`, its data volume `data-<name>-0`.
#[derive(
    Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, JsonSchema,
)]
#[serde(transparent)]
pub struct ReplicaName(String);

impl ReplicaName {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl Deref for ReplicaName {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

impl Borrow<str> for ReplicaName {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl AsRef<str> for ReplicaName {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for ReplicaName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<String> for ReplicaName {
    fn from(s: String) -> Self {
        ReplicaName(s)
    }
}

impl From<&str> for ReplicaName {
    fn from(s: &str) -> Self {
        ReplicaName(s.to_string())
    }
}

impl From<&String> for ReplicaName {
    fn from(s: &String) -> Self {
        ReplicaName(s.clone())
    }
}

impl From<ReplicaName> for String {
    fn from(n: ReplicaName) -> Self {
        n.0
    }
}

impl PartialEq<str> for ReplicaName {
    fn eq(&self, other: &str) -> bool {
        self.0 == other
    }
}

impl PartialEq<&str> for ReplicaName {
    fn eq(&self, other: &&str) -> bool {
        self.0 == *other
    }
}

impl PartialEq<String> for ReplicaName {
    fn eq(&self, other: &String) -> bool {
        &self.0 == other
    }
}

impl PartialEq<ReplicaName> for String {
    fn eq(&self, other: &ReplicaName) -> bool {
        *self == other.0
    }
}

impl PartialEq<ReplicaName> for str {
    fn eq(&self, other: &ReplicaName) -> bool {
        self == other.0
    }
}

impl PartialEq<ReplicaName> for &str {
    fn eq(&self, other: &ReplicaName) -> bool {
        *self == other.0
    }
}

/// A shard's index, from 0: `spec.shards` shards are `0..spec.shards`.
#[derive(
    Serialize,
    Deserialize,
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    JsonSchema,
)]
#[serde(transparent)]
pub struct ShardIndex(pub i32);

impl ShardIndex {
    pub fn get(self) -> i32 {
        self.0
    }

    /// The shards `0..n`.
    pub fn all(n: i32) -> impl Iterator<Item = ShardIndex> {
        (0..n.max(0)).map(ShardIndex)
    }
}

impl fmt::Display for ShardIndex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl From<i32> for ShardIndex {
    fn from(i: i32) -> Self {
        ShardIndex(i)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// On the wire a replica's name and a shard's index are the plain string and integer, so
    /// that the stored status reads as before.
    #[test]
    fn names_and_shards_are_plain_on_the_wire() {
        let n = ReplicaName::from("c1-0-3");
        assert_eq!(
            serde_json::to_value(&n).unwrap(),
            serde_json::json!("c1-0-3")
        );
        assert_eq!(
            serde_json::from_value::<ShardIndex>(serde_json::json!(2)).unwrap(),
            ShardIndex(2)
        );
        let map: std::collections::BTreeMap<ReplicaName, ShardIndex> =
            serde_json::from_str(r#"{"c1-1-0": 1}"#).unwrap();
        assert_eq!(map.get("c1-1-0"), Some(&ShardIndex(1)));
    }
}
