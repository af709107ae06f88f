//! `schemaPolicy` normalisation: values are matched case-insensitively and stored in canonical
//! case; an unknown value falls back to the default `All` and is reported, never rejected.

use std::fmt;

use super::cluster::{EffectiveSchemaPolicy, SchemaPolicySpec};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReplicaPolicy {
    None,
    All,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ShardPolicy {
    None,
    All,
    DistributedTablesOnly,
}

impl fmt::Display for ReplicaPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ReplicaPolicy::None => "None",
            ReplicaPolicy::All => "All",
        })
    }
}

impl fmt::Display for ShardPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ShardPolicy::None => "None",
            ShardPolicy::All => "All",
            ShardPolicy::DistributedTablesOnly => "DistributedTablesOnly",
        })
    }
}

/// The schema policy in force.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SchemaPolicy {
    pub replica: ReplicaPolicy,
    pub shard: ShardPolicy,
}

impl Default for SchemaPolicy {
    fn default() -> Self {
        SchemaPolicy {
            replica: ReplicaPolicy::All,
            shard: ShardPolicy::All,
        }
    }
}

/// A value of `schemaPolicy` that was not understood and was replaced by the default.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplacedValue {
    pub field: &'static str,
    pub given: String,
    pub used: String,
}

impl fmt::Display for ReplacedValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "unknown value {:?} for {}, using {}",
            self.given, self.field, self.used
        )
    }
}

impl SchemaPolicy {
    /// Normalises the user's spelling. Returns the policy and the values that were replaced.
    pub fn normalise(spec: &SchemaPolicySpec) -> (SchemaPolicy, Vec<ReplacedValue>) {
        let mut replaced = Vec::new();
        let replica = match spec
            .replica
            .as_deref()
            .map(str::to_ascii_lowercase)
            .as_deref()
        {
            None => ReplicaPolicy::All,
            Some("none") => ReplicaPolicy::None,
            Some("all") => ReplicaPolicy::All,
            Some(_) => {
                replaced.push(ReplacedValue {
                    field: "spec.schemaPolicy.replica",
                    given: spec.replica.clone().unwrap_or_default(),
                    used: ReplicaPolicy::All.to_string(),
                });
                ReplicaPolicy::All
            }
        };
        let shard = match spec
            .shard
            .as_deref()
            .map(str::to_ascii_lowercase)
            .as_deref()
        {
            None => ShardPolicy::All,
            Some("none") => ShardPolicy::None,
            Some("all") => ShardPolicy::All,
            Some("distributedtablesonly") => ShardPolicy::DistributedTablesOnly,
            Some(_) => {
                replaced.push(ReplacedValue {
                    field: "spec.schemaPolicy.shard",
                    given: spec.shard.clone().unwrap_or_default(),
                    used: ShardPolicy::All.to_string(),
                });
                ShardPolicy::All
            }
        };
        (SchemaPolicy { replica, shard }, replaced)
    }

    pub fn effective(&self) -> EffectiveSchemaPolicy {
        EffectiveSchemaPolicy {
            replica: self.replica.to_string(),
            shard: self.shard.to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(replica: Option<&str>, shard: Option<&str>) -> SchemaPolicySpec {
        SchemaPolicySpec {
            replica: replica.map(str::to_string),
            shard: shard.map(str::to_string),
        }
    }

    /// S1-24: without the field the operator maintains both replicated and distributed tables.
    #[test]
    fn missing_policy_defaults_to_all_all() {
        let (p, replaced) = SchemaPolicy::normalise(&SchemaPolicySpec::default());
        assert_eq!(p, SchemaPolicy::default());
        assert_eq!(p.effective().replica, "All");
        assert_eq!(p.effective().shard, "All");
        assert!(replaced.is_empty());
    }

    /// S1-26: every spelling is matched case-insensitively and stored in canonical case.
    #[test]
    fn every_spelling_normalises_case_insensitively() {
        let replica_cases = [
            ("None", ReplicaPolicy::None),
            ("none", ReplicaPolicy::None),
            ("NONE", ReplicaPolicy::None),
            ("nOnE", ReplicaPolicy::None),
            ("All", ReplicaPolicy::All),
            ("all", ReplicaPolicy::All),
            ("ALL", ReplicaPolicy::All),
        ];
        for (given, want) in replica_cases {
            let (p, replaced) = SchemaPolicy::normalise(&spec(Some(given), None));
            assert_eq!(p.replica, want, "replica {given}");
            assert!(replaced.is_empty(), "replica {given} must not be reported");
        }
        let shard_cases = [
            ("None", ShardPolicy::None),
            ("none", ShardPolicy::None),
            ("All", ShardPolicy::All),
            ("aLL", ShardPolicy::All),
            ("DistributedTablesOnly", ShardPolicy::DistributedTablesOnly),
            ("distributedtablesonly", ShardPolicy::DistributedTablesOnly),
            ("DISTRIBUTEDTABLESONLY", ShardPolicy::DistributedTablesOnly),
        ];
        for (given, want) in shard_cases {
            let (p, replaced) = SchemaPolicy::normalise(&spec(None, Some(given)));
            assert_eq!(p.shard, want, "shard {given}");
            assert!(replaced.is_empty());
        }
        let (p, _) = SchemaPolicy::normalise(&spec(Some("nOnE"), Some("distributedTABLESonly")));
        assert_eq!(p.effective().replica, "None");
        assert_eq!(p.effective().shard, "DistributedTablesOnly");
    }

    /// S1-26 / decision 10: unknown values fall back to All and are reported by field.
    #[test]
    fn unknown_values_fall_back_to_all_and_are_reported() {
        let (p, replaced) = SchemaPolicy::normalise(&spec(Some("bogus"), Some("")));
        assert_eq!(p, SchemaPolicy::default());
        assert_eq!(replaced.len(), 2);
        assert_eq!(replaced[0].field, "spec.schemaPolicy.replica");
        assert_eq!(replaced[0].given, "bogus");
        assert_eq!(replaced[1].field, "spec.schemaPolicy.shard");
        assert!(replaced[0].to_string().contains("\"bogus\""));
        // A replica-only value is not valid for shard and vice versa.
        let (p, replaced) =
            SchemaPolicy::normalise(&spec(Some("DistributedTablesOnly"), Some("None")));
        assert_eq!(p.replica, ReplicaPolicy::All);
        assert_eq!(p.shard, ShardPolicy::None);
        assert_eq!(replaced.len(), 1);
    }
}
