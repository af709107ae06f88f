//! The executor's side of removing a condemned replica: each step of
//! [`crate::plan::scale_in`] as Kubernetes calls and ClickHouse statements. No step waits: the
//! shard's sync is given a few seconds, and when it needs more the step is reported as waiting
//! and run again next pass.

use std::time::Duration;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Pod};
use kube::ResourceExt;
use kube::api::{DeleteParams, Patch, PatchParams};
use serde_json::json;

use super::done::{Done, SERVER_STEP_BUDGET, bounded, normal};
use super::observe::ch_client;
use super::{DELETE_PVC_LABEL, Error, api, noted, noted_deletion};
use crate::api::{ClickHouseCluster, ReplicaName, ShardIndex};
use crate::clickhouse::{self, replica as chreplica};
use crate::controller::Context;
use crate::controller::kube::ignore_not_found;
use crate::model::{labels, names};
use crate::plan::facts::Kind;
use crate::plan::scale_in::ScaleInAction;
use crate::plan::{EventType, PlannedEvent, World};

/// How long one pass lets `SYSTEM SYNC REPLICA` run before it looks again next pass.
const SYNC_STEP: Duration = Duration::from_secs(4);

fn event(reason: &'static str, message: String) -> Done {
    normal(reason, "ScaleIn", message)
}

fn warning(reason: &'static str, message: String) -> Done {
    Done::Finished(Some(PlannedEvent {
        kind: EventType::Warning,
        reason,
        action: "ScaleIn",
        message,
    }))
}

pub async fn run(
    cluster: &ClickHouseCluster,
    world: &World,
    a: &ScaleInAction,
    ctx: &Context,
    connections: &clickhouse::Connections,
) -> Result<Done, Error> {
    let ns = cluster.namespace().unwrap_or_default();
    match a {
        ScaleInAction::LeaveTraffic { replica } => {
            let unlabel: serde_json::Map<String, serde_json::Value> = labels::TRAFFIC
                .iter()
                .map(|l| (l.to_string(), serde_json::Value::Null))
                .collect();
            ignore_not_found(noted(
                ctx,
                cluster,
                Kind::Pod,
                api::<Pod>(ctx, &ns)
                    .patch(
                        &names::replica_pod(replica),
                        &PatchParams::default(),
                        &Patch::Merge(json!({"metadata": {"labels": unlabel}})),
                    )
                    .await,
            ))?;
            Ok(event(
                "LeftTraffic",
                format!("{replica} is out of the client Service and the topology spread"),
            ))
        }
        ScaleInAction::SyncShard { replica, backup } => {
            sync_shard(cluster, world, replica, backup.as_deref(), connections).await
        }
        ScaleInAction::DropObjects { replica } => {
            bounded(
                &format!("dropping the tables of {replica}"),
                SERVER_STEP_BUDGET,
                drop_objects(cluster, world, replica, connections),
            )
            .await
        }
        ScaleInAction::DeleteStatefulSet { replica } => {
            ignore_not_found(noted_deletion(
                ctx,
                cluster,
                Kind::StatefulSet,
                replica,
                None,
                api::<StatefulSet>(ctx, &ns)
                    .delete(replica, &DeleteParams::background())
                    .await,
            ))?;
            let config = names::replica_config(replica);
            ignore_not_found(noted_deletion(
                ctx,
                cluster,
                Kind::ConfigMap,
                &config,
                None,
                api::<ConfigMap>(ctx, &ns)
                    .delete(&config, &DeleteParams::background())
                    .await,
            ))?;
            Ok(event(
                "ReplicaDeleted",
                format!("StatefulSet {replica} deleted"),
            ))
        }
        ScaleInAction::DropKeeperMetadata {
            replica,
            shard,
            survivors,
            others,
        } => {
            bounded(
                &format!("dropping the Keeper metadata of {replica}"),
                SERVER_STEP_BUDGET,
                drop_keeper_metadata(
                    cluster,
                    world,
                    replica,
                    *shard,
                    survivors,
                    others,
                    connections,
                ),
            )
            .await
        }
        ScaleInAction::LabelPvcsAndForget { replica } => {
            label_pvcs(ctx, cluster, world, |p| {
                p.metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get(labels::REPLICA))
                    .map(String::as_str)
                    == Some(replica)
                    || p.metadata.name.as_deref() == Some(&names::data_pvc(replica))
            })
            .await?;
            Ok(event(
                "ReplicaRemoved",
                format!("{replica} removed; its PVCs are labelled {DELETE_PVC_LABEL}"),
            ))
        }
    }
}

/// Scale-in step 4 (S0-26): the leaving replica's tables, dictionaries and databases dropped
/// on it; without a running pod, a survivor cleans Keeper instead.
async fn drop_objects(
    cluster: &ClickHouseCluster,
    world: &World,
    replica: &str,
    connections: &clickhouse::Connections,
) -> Result<Done, Error> {
    match ch_client(cluster, world, replica, connections) {
        Ok(client) => {
            let dropped = chreplica::drop_leaving_objects(&client)
                .await
                .map_err(|e| Error::clickhouse(&format!("dropping the tables of {replica}"), e))?;
            Ok(event(
                "ObjectsDropped",
                format!(
                    "{replica}: dropped {} table(s), {} dictionar(ies), {} database(s)",
                    dropped.tables.len(),
                    dropped.dictionaries.len(),
                    dropped.databases.len()
                ),
            ))
        }
        Err(_) => Ok(warning(
            "ObjectsNotDropped",
            format!(
                "{replica} has no running pod: its tables were not dropped on it; a survivor drops its Keeper metadata where the server version has SYSTEM DROP REPLICA, else the status names what stays"
            ),
        )),
    }
}

/// Scale-in step 3 (S0-25): the shard's replicated tables synced on its backup replica.
async fn sync_shard(
    cluster: &ClickHouseCluster,
    world: &World,
    replica: &str,
    backup: Option<&str>,
    connections: &clickhouse::Connections,
) -> Result<Done, Error> {
    let Some(backup) = backup else {
        return Ok(event(
            "Synced",
            format!("{replica}: its whole shard is removed, nothing to sync to"),
        ));
    };
    let client = ch_client(cluster, world, backup, connections)?;
    match chreplica::sync_shard(&client, SYNC_STEP).await {
        Ok(tables) => Ok(event(
            "Synced",
            format!(
                "{} replicated table(s) synced on {backup} before removing {replica}",
                tables.len()
            ),
        )),
        Err(e) if e.is_timeout() => Ok(Done::Waiting(format!(
            "scale-in of {replica} waits for {backup} to catch up with its shard"
        ))),
        // Keeper unreachable, a session being re-established, a read-only table: heals by
        // itself; the pass is not a failure (no backoff), the step is looked at again next pass.
        Err(e) if e.is_retryable() => Ok(Done::Waiting(format!(
            "scale-in of {replica} waits for {backup} to sync its shard: {e}"
        ))),
        Err(e) => Err(Error::clickhouse(
            &format!("syncing the shard of {replica} on {backup}"),
            e,
        )),
    }
}

/// Scale-in step 5 (S0-27): the leaving replica's Keeper metadata dropped from every surviving
/// replica of its shard (each knows its own tables; a survivor that fails does not keep the
/// others from cleaning, and the step is retried after them), or, when the whole shard goes,
/// from the first replica of another shard that answers, by the paths the shard's tables had.
async fn drop_keeper_metadata(
    cluster: &ClickHouseCluster,
    world: &World,
    replica: &str,
    shard: ShardIndex,
    survivors: &[ReplicaName],
    others: &[ReplicaName],
    connections: &clickhouse::Connections,
) -> Result<Done, Error> {
    let leaving = chreplica::LeavingReplica {
        shard: clickhouse::sql::ShardMacro(shard.to_string()),
        replica: clickhouse::sql::ReplicaMacro(replica.to_string()),
    };
    // its own shard's survivors, every one; else the first server of another shard that answers
    let same_shard = !survivors.is_empty();
    let servers = if same_shard { survivors } else { others };
    let mut cleanup = chreplica::KeeperCleanup::default();
    let mut asked = Vec::new();
    let mut failure = None;
    for server in servers {
        let result = match ch_client(cluster, world, server, connections) {
            Ok(client) if same_shard => chreplica::drop_replica_metadata(&client, &leaving).await,
            Ok(client) => chreplica::drop_shard_replica_metadata(&client, &leaving).await,
            Err(e) => {
                failure.get_or_insert(e);
                continue;
            }
        };
        match result {
            Ok(c) => {
                merge(&mut cleanup, c);
                asked.push(server.as_str());
                if !same_shard {
                    break;
                }
            }
            Err(e) => {
                tracing::warn!(%replica, %server, error = %e, "cannot drop the Keeper metadata from this server");
                failure.get_or_insert(Error::clickhouse(
                    &format!("dropping the Keeper metadata of {replica} from {server}"),
                    e,
                ));
            }
        }
    }
    // every survivor must have answered; of the other shards, one
    if let Some(e) = failure
        && (same_shard || asked.is_empty())
    {
        return Err(e);
    }
    if asked.is_empty() {
        return Ok(event(
            "KeeperCleaned",
            format!("{replica}: no server is left to drop its Keeper metadata from"),
        ));
    }
    let from = asked.join(", ");
    if !cleanup.is_clean() {
        let shown: Vec<&str> = cleanup
            .left_paths
            .iter()
            .take(5)
            .map(String::as_str)
            .collect();
        let more = cleanup.left_paths.len().saturating_sub(shown.len());
        return Ok(warning(
            crate::plan::status::KEEPER_METADATA_LEFT,
            format!(
                "{replica} left the cluster, but this ClickHouse version has no SYSTEM DROP REPLICA and its tables were not dropped on it: its Keeper metadata stays for {} table(s), at {}{}; remove those nodes by hand",
                cleanup.left_behind.len(),
                shown.join(", "),
                if more > 0 {
                    format!(" and {more} more")
                } else {
                    String::new()
                }
            ),
        ));
    }
    let (tables, databases) = (
        cleanup.dropped.len(),
        cleanup.dropped_database_replicas.len(),
    );
    let message = if tables + databases == 0 {
        format!(
            "{replica}: nothing of it was left in Keeper to drop from {from} (dropping its tables removed their Keeper metadata)"
        )
    } else {
        format!(
            "{replica}: Keeper metadata dropped from {from} for {tables} table(s) and {databases} replicated database(s)"
        )
    };
    Ok(event("KeeperCleaned", message))
}

/// `more` added to `into`, each table and path once; what one server could not drop and another
/// (a newer one) dropped is not left.
fn merge(into: &mut chreplica::KeeperCleanup, more: chreplica::KeeperCleanup) {
    for t in more.dropped {
        if !into.dropped.contains(&t) {
            into.dropped.push(t);
        }
    }
    for d in more.dropped_database_replicas {
        if !into.dropped_database_replicas.contains(&d) {
            into.dropped_database_replicas.push(d);
        }
    }
    let left = std::mem::take(&mut into.left_behind)
        .into_iter()
        .zip(std::mem::take(&mut into.left_paths))
        .chain(more.left_behind.into_iter().zip(more.left_paths));
    for (table, path) in left {
        if !into.dropped.contains(&table) && !into.left_paths.contains(&path) {
            into.left_behind.push(table);
            into.left_paths.push(path);
        }
    }
}

/// Hands the selected PVCs to the PVC cleaner.
pub async fn label_pvcs(
    ctx: &Context,
    cluster: &ClickHouseCluster,
    world: &World,
    select: impl Fn(&PersistentVolumeClaim) -> bool,
) -> Result<(), Error> {
    let ns = &cluster.namespace().unwrap_or_default();
    for (pvc, p) in &world.observed.pvcs {
        if select(p) {
            // the label says what is meant, the proof that the operator means it (decision 39)
            let uid = p.metadata.uid.clone().unwrap_or_default();
            let proof = crate::controller::pvc_cleaner::proof(&ctx.pvc_delete_key, ns, pvc, &uid);
            ignore_not_found(noted(
                ctx,
                cluster,
                Kind::PersistentVolumeClaim,
                api::<PersistentVolumeClaim>(ctx, ns)
                    .patch(
                        pvc,
                        &PatchParams::default(),
                        &Patch::Merge(json!({"metadata": {
                            "labels": {DELETE_PVC_LABEL: "true"},
                            "annotations": {crate::controller::pvc_cleaner::PROOF_ANNOTATION: proof},
                            "uid": uid,
                        }})),
                    )
                    .await,
            ))?;
        }
    }
    Ok(())
}
