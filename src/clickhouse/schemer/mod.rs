//! Schema migration on scale-out (S1-01…S1-15, S1-24…S1-27).
//!
//! A new replica gets, from the other replicas of its shard, the databases, tables, views,
//! dictionaries and user-defined functions they have (the "replicated" batch); then, from the
//! other replicas of the cluster, the Distributed tables and the local tables they point to
//! (the "distributed" batch, which is all a new shard gets under `DistributedTablesOnly`).
//! `schemaPolicy` decides which batches run ([`should_create_replicated`],
//! [`should_create_distributed`]). Every statement is `CREATE … IF NOT EXISTS`, so the
//! migration is re-entrant (S1-27), and both batches are attempted even if the other fails
//! (S1-06).
//!
//! Order (decision 11): functions, databases, tables, then views, materialized views and
//! dictionaries in dependency order; Distributed tables (and views over them) come in the
//! distributed batch, after all of these.
//!
//! Discovery reads `system.*` tables: cluster-wide through `clusterAllReplicas` with
//! `skip_unavailable_shards = 1` where the version has it (S1-09, S1-15), otherwise (18.16,
//! decision 17) each source replica directly, skipping those that do not answer as long as
//! one does.
//!
//! Its parts: `objects`, the schema as discovered and the objects to create; `references`,
//! what a table reads from (engine arguments, names in a query); `batches`, the two batches
//! in decision 11 order; `discover`, the reading of the sources; this file, the policy
//! decisions and the migration itself.

mod batches;
mod discover;
mod objects;
mod references;

use std::collections::BTreeSet;

use crate::api::schema_policy::{ReplicaPolicy, SchemaPolicy, ShardPolicy};

use super::client::{Client, Error, QueryOptions};
use super::sql::ClusterName;
use discover::{DiscoveryScope, discover};

pub use batches::{distributed_objects, order, replicated_objects};
pub use objects::{
    DiscoveredDatabase, DiscoveredFunction, DiscoveredTable, ObjectKind, ObjectName, SchemaObject,
    SourceSchema,
};
pub use references::{distributed_target, engine_target};

/// S1-07 then S1-08: does a new host get the replicated objects?
///
/// `hosts` counts every host of the cluster and `shard_replicas` every replica of the new
/// host's shard, the new host included in both.
pub fn should_create_replicated(policy: SchemaPolicy, hosts: usize, shard_replicas: usize) -> bool {
    if policy.shard == ShardPolicy::All && hosts >= 2 {
        return true;
    }
    if policy.replica == ReplicaPolicy::None {
        return false;
    }
    shard_replicas > 1
}

/// S1-13: does a new host get the distributed objects (Distributed tables and their local
/// tables)? `hosts` counts every host of the cluster, the new one included.
pub fn should_create_distributed(policy: SchemaPolicy, hosts: usize) -> bool {
    policy.shard != ShardPolicy::None && hosts > 1
}

/// The replicas a new host copies its schema from.
#[derive(Clone, Copy, Debug)]
pub struct MigrationSources<'a> {
    /// The cluster (`remote_servers`) name, for `clusterAllReplicas`.
    pub cluster: &'a ClusterName,
    /// The other replicas of the new host's shard.
    pub shard_peers: &'a [Client],
    /// The replicas of the other shards.
    pub other_shards: &'a [Client],
}

/// Where the new host stands in the cluster, for the policy decisions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Topology {
    /// Hosts of the cluster, the new one included.
    pub hosts: usize,
    /// Replicas of the new host's shard, the new one included.
    pub shard_replicas: usize,
}

/// A statement that failed on the new host, after its retries.
#[derive(Debug)]
pub struct FailedStatement {
    /// The object it should have created.
    pub object: ObjectName,
    /// Why.
    pub error: Error,
}

/// What one batch did.
#[derive(Debug, Default)]
pub struct BatchOutcome {
    /// Objects created (or found existing: `IF NOT EXISTS`), in execution order.
    pub created: Vec<ObjectName>,
    /// Statements that failed; the others still ran.
    pub failed: Vec<FailedStatement>,
    /// Discovery failed: no statement ran.
    pub discovery: Option<Error>,
}

impl BatchOutcome {
    /// Whether everything in the batch succeeded.
    pub fn is_ok(&self) -> bool {
        self.failed.is_empty() && self.discovery.is_none()
    }
}

/// What a migration did: both batches, each attempted whatever the other did (S1-06).
#[derive(Debug, Default)]
pub struct MigrationOutcome {
    /// `None`: the policy said no replicated objects (S1-07/08).
    pub replicated: Option<BatchOutcome>,
    /// `None`: the policy said no distributed objects (S1-13).
    pub distributed: Option<BatchOutcome>,
}

/// A migration in which something failed; it keeps what was created.
#[derive(Debug, thiserror::Error)]
#[error("schema migration failed: {summary}")]
pub struct MigrationError {
    /// Everything that happened.
    pub outcome: MigrationOutcome,
    /// The first failure, for the status message.
    pub summary: String,
}

impl MigrationOutcome {
    /// Every object created, replicated batch first.
    pub fn created(&self) -> Vec<&ObjectName> {
        [&self.replicated, &self.distributed]
            .into_iter()
            .flatten()
            .flat_map(|b| b.created.iter())
            .collect()
    }

    fn first_failure(&self) -> Option<String> {
        [&self.replicated, &self.distributed]
            .into_iter()
            .flatten()
            .find_map(|b| {
                b.discovery
                    .as_ref()
                    .map(|e| format!("discovery: {e}"))
                    .or_else(|| b.failed.first().map(|f| f.error.to_string()))
            })
    }
}

/// Brings a new host's schema up to its cluster's (S1-01): the
/// replicated batch, then the distributed batch, each as the policy allows, each statement
/// retried and logged. Returns what was created, or an error that still carries it.
pub async fn migrate_new_host(
    target: &Client,
    sources: MigrationSources<'_>,
    policy: SchemaPolicy,
    topology: Topology,
) -> Result<MigrationOutcome, MigrationError> {
    let mut outcome = MigrationOutcome::default();
    if should_create_replicated(policy, topology.hosts, topology.shard_replicas) {
        let from = if sources.shard_peers.is_empty() {
            sources.other_shards
        } else {
            sources.shard_peers
        };
        let batch = match discover(from, sources.cluster, DiscoveryScope::Replicated).await {
            Ok(schema) => execute(target, replicated_objects(&schema)).await,
            Err(e) => BatchOutcome {
                discovery: Some(e),
                ..BatchOutcome::default()
            },
        };
        outcome.replicated = Some(batch);
    }
    if should_create_distributed(policy, topology.hosts) {
        let all: Vec<Client> = sources
            .shard_peers
            .iter()
            .chain(sources.other_shards)
            .cloned()
            .collect();
        let batch = match discover(&all, sources.cluster, DiscoveryScope::Distributed).await {
            Ok(schema) => {
                let done: BTreeSet<ObjectName> = outcome
                    .replicated
                    .iter()
                    .flat_map(|b| b.created.iter().cloned())
                    .collect();
                let objects = distributed_objects(&schema, outcome.replicated.is_some())
                    .into_iter()
                    .filter(|o| !done.contains(&o.name))
                    .collect();
                execute(target, objects).await
            }
            Err(e) => BatchOutcome {
                discovery: Some(e),
                ..BatchOutcome::default()
            },
        };
        outcome.distributed = Some(batch);
    }
    match outcome.first_failure() {
        None => Ok(outcome),
        Some(summary) => Err(MigrationError { outcome, summary }),
    }
}

async fn execute(target: &Client, objects: Vec<SchemaObject>) -> BatchOutcome {
    let mut batch = BatchOutcome::default();
    let options = QueryOptions::new().retry(true);
    for o in objects {
        match target.exec(&o.statement, &options).await {
            Ok(()) => {
                tracing::info!(endpoint = %target.endpoint(), object = ?o.name, "schema object created");
                batch.created.push(o.name);
            }
            Err(error) => {
                tracing::warn!(endpoint = %target.endpoint(), object = ?o.name, %error, "schema object not created");
                batch.failed.push(FailedStatement {
                    object: o.name,
                    error,
                });
            }
        }
    }
    batch
}

#[cfg(test)]
mod fixtures;

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(replica: ReplicaPolicy, shard: ShardPolicy) -> SchemaPolicy {
        SchemaPolicy { replica, shard }
    }

    /// S1-07 / S1-08: the replicated-objects decision table, rule 1 first.
    #[test]
    fn replicated_objects_follow_the_policy_table_shard_all_first() {
        use ReplicaPolicy as R;
        use ShardPolicy as S;
        // (replica, shard, hosts, shard_replicas) -> create?
        let cases = [
            // S1-07: shard All and >= 2 hosts: always, even with replica None.
            (R::None, S::All, 2, 1, true),
            (R::None, S::All, 4, 2, true),
            (R::All, S::All, 2, 1, true),
            // S1-07 falls through with 1 host to S1-08.
            (R::All, S::All, 1, 1, false),
            (R::None, S::All, 1, 1, false),
            // S1-08: replica None gives none.
            (R::None, S::None, 4, 2, false),
            (R::None, S::DistributedTablesOnly, 4, 2, false),
            // S1-08: a shard of one replica has no source.
            (R::All, S::None, 4, 1, false),
            (R::All, S::DistributedTablesOnly, 4, 1, false),
            // Otherwise created.
            (R::All, S::None, 3, 3, true),
            (R::All, S::DistributedTablesOnly, 4, 2, true),
        ];
        for (r, s, hosts, shard, want) in cases {
            assert_eq!(
                should_create_replicated(policy(r, s), hosts, shard),
                want,
                "{r:?} {s:?} hosts={hosts} shard={shard}"
            );
        }
    }

    /// S1-13: the distributed-objects decision table.
    #[test]
    fn distributed_objects_need_a_shard_policy_and_two_hosts() {
        use ReplicaPolicy as R;
        use ShardPolicy as S;
        let cases = [
            (R::All, S::None, 4, false),
            (R::None, S::None, 4, false),
            (R::All, S::All, 1, false),
            (R::All, S::DistributedTablesOnly, 1, false),
            (R::All, S::All, 2, true),
            (R::None, S::All, 2, true),
            (R::None, S::DistributedTablesOnly, 3, true),
        ];
        for (r, s, hosts, want) in cases {
            assert_eq!(
                should_create_distributed(policy(r, s), hosts),
                want,
                "{r:?} {s:?} {hosts}"
            );
        }
    }
}
