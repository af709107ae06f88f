//! Act: runs a plan's steps in order and reports what happened as an [`Outcome`]. It decides
//! nothing: the status after the steps comes from the pure [`plan::report::report`], and is
//! written once, after the pass. A step that changes the ReplicaStateMap (a schema copy, a
//! scale-in step) is recorded in the cluster the later steps read; a crash before the pass's
//! status write repeats it, and every step is idempotent (decision 3). No step waits: a step
//! whose work is not finished yet (a shard still syncing) is reported as waiting and looked at
//! again next pass.

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod, Secret};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{
    DeleteParams, DynamicObject, Patch, PatchParams, PostParams, Preconditions, PropagationPolicy,
};
use rand::Rng;
use serde_json::json;
use tracing::{debug, info, warn};

use super::done::{Done, SERVER_STEP_BUDGET, bounded, normal};
use super::observe::ch_client;
use super::{Error, KIND, api, dynamic, noted, noted_deletion, scale_in};
use crate::api::{ClickHouseCluster, ShardIndex};
use crate::clickhouse::sql::{ClusterName, TableName};
use crate::clickhouse::{self, replica as chreplica, schemer};
use crate::controller::kube::{ignore_gone, ignore_not_found};
use crate::controller::{Context, MANAGER, StepPoint};
use crate::model::{self, Password, labels, names};
use crate::plan::facts::Kind;
use crate::plan::step::{Outcome, Step};
use crate::plan::{self, EventType, FailureReason, Plan, PlannedEvent, World};
use crate::runtime::metrics::KindLabels;

/// A best-effort DNS cache drop waits no longer than this for its server.
const DNS_DROP_BUDGET: Duration = Duration::from_secs(2);
/// A table's `SYSTEM RESTART REPLICA` (decision 45) waits no longer than this for its server.
const RESTART_REPLICA_BUDGET: Duration = Duration::from_secs(5);

/// Runs the plan's steps in order. Stops at the first failure, except that the steps of other
/// condemned replicas go on (each replica's chain stops at its own first failure or wait).
/// `current` is the cluster the pass planned from; the status it holds records each step that
/// changes the replica map (not written: the pass writes the status once, after its steps).
pub async fn act(
    current: &mut ClickHouseCluster,
    world: &World,
    plan: &Plan,
    ctx: &Context,
    connections: &clickhouse::Connections,
) -> Result<Outcome, Error> {
    let mut outcome = Outcome::default();
    let mut stopped_chains = BTreeSet::new();
    for (i, step) in plan.steps.iter().enumerate() {
        if let Step::ScaleIn(a) = step
            && stopped_chains.contains(a.replica())
        {
            continue;
        }
        debug!(cluster = %current.name_any(), step = %step.describe(), "acting");
        crash_at(ctx, StepPoint::Before, step)?;
        let result = run(current, world, step, ctx, connections).await;
        if step.writes_kubernetes() {
            ctx.metrics
                .writes
                .get_or_create(&KindLabels { kind: KIND.into() })
                .inc();
        }
        if result.is_ok() {
            crash_at(ctx, StepPoint::After, step)?;
        }
        match result {
            Ok(Done::Finished(event)) => {
                log_done(step, event.as_ref());
                outcome.done.push(i);
                outcome.events.extend(event);
                if step.records_progress() {
                    let (status, _) = plan::report::report(
                        plan,
                        &outcome,
                        current.metadata.generation,
                        Timestamp::now(),
                    );
                    current.status = Some(status);
                }
            }
            Ok(Done::Waiting(why)) => {
                if let Step::ScaleIn(a) = step {
                    stopped_chains.insert(a.replica().to_string());
                }
                outcome.waiting.push(why);
            }
            Err(e) => {
                warn!(cluster = %current.name_any(), step = %step.describe(), error = %e, "step failed");
                if outcome.failure.is_none() {
                    outcome.failure = Some(plan::Failure {
                        reason: e.reason(),
                        message: format!("{} failed: {e}", step.describe()),
                    });
                }
                match step {
                    Step::ScaleIn(a) => {
                        stopped_chains.insert(a.replica().to_string());
                    }
                    _ => break,
                }
            }
        }
    }
    Ok(outcome)
}

/// The log trail: one info line for each step that changed something, with why; the pass's
/// span adds the namespace and the cluster. A DNS cache drop, best effort and frequent while
/// pods move, stays at debug.
fn log_done(step: &Step, event: Option<&PlannedEvent>) {
    let (reason, message) = event.map_or(("", ""), |e| (e.reason, e.message.as_str()));
    match step {
        Step::DropDnsCache { .. } => {
            debug!(step = %step.describe(), why = step.why(), "done")
        }
        _ => info!(step = %step.describe(), why = step.why(), reason, message, "done"),
    }
}

/// The fault-injection hook ([`crate::controller::AfterStep`]).
fn crash_at(ctx: &Context, point: StepPoint, step: &Step) -> Result<(), Error> {
    match &ctx.faults.after_step {
        Some(hook) if hook(point, step) => Err(Error::Stopped(format!(
            "stopped {point:?} {} (fault injection)",
            step.describe()
        ))),
        _ => Ok(()),
    }
}

/// Runs one step: each kind of step has its function.
async fn run(
    cluster: &ClickHouseCluster,
    world: &World,
    step: &Step,
    ctx: &Context,
    connections: &clickhouse::Connections,
) -> Result<Done, Error> {
    let ns = cluster.namespace().unwrap_or_default();
    match step {
        Step::CreateOperatorSecret => create_operator_secret(cluster, ctx).await,
        Step::AdoptOperatorSecret => adopt_operator_secret(cluster, ctx).await,
        Step::AddExporterPassword => add_exporter_password(cluster, ctx).await,
        Step::PublishExporterCredentials => {
            publish_exporter_credentials(cluster, world, ctx).await;
            Ok(Done::Finished(None))
        }
        Step::Apply {
            kind,
            name,
            object,
            create: false,
        } => apply(ctx, cluster, &ns, *kind, name, object).await,
        Step::Apply {
            kind,
            name,
            object,
            create: true,
        } => create(ctx, cluster, &ns, *kind, name, object).await,
        Step::OrphanStatefulSet { name } => orphan_statefulset(ctx, cluster, &ns, name).await,
        Step::ResizePvc { name, size } => resize_pvc(ctx, cluster, &ns, name, size).await,
        Step::LabelPvc {
            name,
            labels,
            annotations,
        } => label_pvc(ctx, cluster, &ns, name, labels, annotations).await,
        Step::SetServing { pod, serving, .. } => {
            set_serving(ctx, cluster, &ns, pod, *serving).await
        }
        Step::RestartPod {
            pod, uid, serving, ..
        } => restart_pod(ctx, cluster, pod, uid.as_deref(), *serving).await,
        Step::MigrateSchema { replica, shard } => {
            bounded(
                &format!("copying the schema onto {replica}"),
                SERVER_STEP_BUDGET,
                migrate_schema(cluster, world, replica, *shard, connections),
            )
            .await
        }
        Step::ScaleIn(a) => scale_in::run(cluster, world, a, ctx, connections).await,
        Step::EnsureKeeperRoot { root } => ensure_keeper_root(cluster, world, ctx, root).await,
        Step::DropDnsCache { replica } => {
            drop_dns_cache(cluster, world, replica, connections).await
        }
        Step::RestartReplicatedTables { replica, tables } => {
            restart_replicated_tables(cluster, world, replica, tables, connections).await
        }
        Step::Delete { kind, name } => delete(ctx, cluster, &ns, *kind, name).await,
    }
}

/// Applies `object` over the existing one, after removing what other writers added to what the
/// operator owns ([`remove_foreign_fields`]); a removal is told as a repair.
async fn apply(
    ctx: &Context,
    cluster: &ClickHouseCluster,
    ns: &str,
    kind: Kind,
    name: &str,
    object: &serde_json::Value,
) -> Result<Done, Error> {
    let api = dynamic(ctx, ns, kind);
    let removed = remove_foreign_fields(&api, name, object).await?;
    noted(
        ctx,
        cluster,
        kind,
        api.patch(
            name,
            &PatchParams::apply(MANAGER).force(),
            &Patch::Apply(object),
        )
        .await,
    )?;
    if let Some(removed) = removed.filter(|r| !r.writers.is_empty()) {
        return Ok(Done::Finished(Some(PlannedEvent {
            kind: EventType::Warning,
            reason: "Repaired",
            action: "Apply",
            message: format!(
                "{} {name}: removed what another writer added to what the operator owns ({}, set by {}) and applied what the cluster's spec wants",
                kind.as_str(),
                removed.paths,
                removed.writers,
            ),
        })));
    }
    Ok(normal(
        "Applied",
        "Apply",
        format!("applied {} {name}", kind.as_str()),
    ))
}

/// Creates `object`; one that exists already and is not the cluster's is a name conflict.
async fn create(
    ctx: &Context,
    cluster: &ClickHouseCluster,
    ns: &str,
    kind: Kind,
    name: &str,
    object: &serde_json::Value,
) -> Result<Done, Error> {
    let api = dynamic(ctx, ns, kind);
    let o: DynamicObject = serde_json::from_value(object.clone()).map_err(|e| {
        Error::failed(
            FailureReason::Internal,
            format!("{} {name} does not deserialise: {e}", kind.as_str()),
        )
    })?;
    let pp = PostParams {
        field_manager: Some(MANAGER.into()),
        ..PostParams::default()
    };
    match noted(ctx, cluster, kind, api.create(&pp, &o).await) {
        Ok(_) => Ok(normal(
            "Created",
            "Create",
            format!("created {} {name}", kind.as_str()),
        )),
        Err(kube::Error::Api(e)) if e.code == 409 => Err(Error::failed(
            FailureReason::NameConflict,
            format!(
                "{} {name} already exists and is not managed by ClickHouseCluster {}: rename or remove it",
                kind.as_str(),
                cluster.name_any()
            ),
        )),
        Err(e) => Err(e.into()),
    }
}

/// Deletes a StatefulSet with its pod kept, to create it again.
async fn orphan_statefulset(
    ctx: &Context,
    cluster: &ClickHouseCluster,
    ns: &str,
    name: &str,
) -> Result<Done, Error> {
    let dp = DeleteParams {
        propagation_policy: Some(PropagationPolicy::Orphan),
        ..DeleteParams::default()
    };
    ignore_not_found(noted_deletion(
        ctx,
        cluster,
        Kind::StatefulSet,
        name,
        None,
        api::<StatefulSet>(ctx, ns).delete(name, &dp).await,
    ))?;
    Ok(normal(
        "StatefulSetOrphaned",
        "Recreate",
        format!("deleted StatefulSet {name} with its pod kept; it is created again next"),
    ))
}

async fn resize_pvc(
    ctx: &Context,
    cluster: &ClickHouseCluster,
    ns: &str,
    name: &str,
    size: &str,
) -> Result<Done, Error> {
    noted(
        ctx,
        cluster,
        Kind::PersistentVolumeClaim,
        api::<PersistentVolumeClaim>(ctx, ns)
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"resources": {"requests": {"storage": size}}}})),
            )
            .await,
    )?;
    Ok(normal(
        "VolumeResized",
        "Resize",
        format!("PVC {name} resized to {size}"),
    ))
}

async fn label_pvc(
    ctx: &Context,
    cluster: &ClickHouseCluster,
    ns: &str,
    name: &str,
    labels: &std::collections::BTreeMap<String, String>,
    annotations: &std::collections::BTreeMap<String, String>,
) -> Result<Done, Error> {
    let patch = json!({"metadata": {"labels": labels, "annotations": annotations}});
    ignore_not_found(noted(
        ctx,
        cluster,
        Kind::PersistentVolumeClaim,
        api::<PersistentVolumeClaim>(ctx, ns)
            .patch(name, &PatchParams::default(), &Patch::Merge(patch))
            .await,
    ))?;
    Ok(normal(
        "VolumeLabelled",
        "Label",
        format!("PVC {name} has the labels and annotations of spec.storage"),
    ))
}

/// Puts the pod in the client Service or takes it out (its serving label).
async fn set_serving(
    ctx: &Context,
    cluster: &ClickHouseCluster,
    ns: &str,
    pod: &str,
    serving: bool,
) -> Result<Done, Error> {
    let value = serving.then_some(labels::TRUE);
    let patch = json!({"metadata": {"labels": {labels::SERVING: value}}});
    ignore_not_found(noted(
        ctx,
        cluster,
        Kind::Pod,
        api::<Pod>(ctx, ns)
            .patch(pod, &PatchParams::default(), &Patch::Merge(patch))
            .await,
    ))?;
    Ok(if serving {
        normal(
            "BackInTraffic",
            "Rollout",
            format!("{pod} is in the client Service again"),
        )
    } else {
        normal(
            "LeftTraffic",
            "Rollout",
            format!("{pod} is out of the client Service until its restart"),
        )
    })
}

async fn ensure_keeper_root(
    cluster: &ClickHouseCluster,
    world: &World,
    ctx: &Context,
    root: &str,
) -> Result<Done, Error> {
    let password = world.observed.inputs.keeper_password.as_ref();
    super::keeper_root::ensure(cluster, ctx, password, root).await?;
    Ok(normal(
        "KeeperRootCreated",
        "Create",
        format!("the root {root} exists in the external Keeper"),
    ))
}

/// Best effort: 18.16 resolves its hosts again right away and reports a host that does not
/// resolve yet (a pod without an address) as an error, though the cache was dropped; nothing
/// depends on it but the next pass's checks.
async fn drop_dns_cache(
    cluster: &ClickHouseCluster,
    world: &World,
    replica: &str,
    connections: &clickhouse::Connections,
) -> Result<Done, Error> {
    let client = ch_client(cluster, world, replica, connections)?;
    match tokio::time::timeout(DNS_DROP_BUDGET, chreplica::drop_dns_cache(&client)).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => debug!(replica = %replica, error = %e, "dropping the DNS cache"),
        Err(_) => debug!(replica = %replica, "dropping the DNS cache: no answer"),
    }
    Ok(Done::Finished(None))
}

/// Best effort: the table is read-only either way, and the status says so until it is not; the
/// next pass tries again while the session stays expired.
async fn restart_replicated_tables(
    cluster: &ClickHouseCluster,
    world: &World,
    replica: &str,
    tables: &[(String, String)],
    connections: &clickhouse::Connections,
) -> Result<Done, Error> {
    let client = ch_client(cluster, world, replica, connections)?;
    let tables: Vec<TableName> = tables.iter().map(|(db, t)| TableName::new(db, t)).collect();
    let names = tables
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ");
    match chreplica::restart_replicas(&client, &tables, RESTART_REPLICA_BUDGET).await {
        Ok(()) => Ok(normal(
            "KeeperSessionReopened",
            "RestartReplica",
            format!(
                "{replica}: {names} read-only since their Keeper session expired; \
                 made to open a new one now that Keeper answers"
            ),
        )),
        Err(e) => {
            warn!(replica = %replica, error = %e, "reopening the Keeper session of read-only tables");
            Ok(Done::Finished(None))
        }
    }
}

async fn delete(
    ctx: &Context,
    cluster: &ClickHouseCluster,
    ns: &str,
    kind: Kind,
    name: &str,
) -> Result<Done, Error> {
    ignore_not_found(noted_deletion(
        ctx,
        cluster,
        kind,
        name,
        None,
        dynamic(ctx, ns, kind)
            .delete(name, &DeleteParams::background())
            .await,
    ))?;
    Ok(normal(
        "Deleted",
        "Delete",
        format!("deleted {} {name}", kind.as_str()),
    ))
}

/// Removes from object `name` what other writers added to what the operator owns and
/// `desired` does not have ([`model::diff::foreign_fields`], read from a fresh copy: the caches
/// keep only others' managed fields; a field at the value the API server would give it again
/// is left, [`model::diff::is_api_default`]), with one JSON patch that tests each list element's key
/// before removing it; returns the paths removed and their writers, for the event (never a
/// value: a hand-added environment variable may hold a secret), or `None` when nothing was.
async fn remove_foreign_fields(
    api: &kube::Api<kube::api::DynamicObject>,
    name: &str,
    desired: &serde_json::Value,
) -> Result<Option<Removed>, Error> {
    use model::diff::{FIELD_MANAGER, fields_to_remove_but_defaults, removal_patch};
    let Some(current) = api.get_opt(name).await? else {
        return Ok(None);
    };
    let current = serde_json::to_value(&current).expect("Kubernetes objects serialise");
    let foreign = fields_to_remove_but_defaults(&current, desired, FIELD_MANAGER);
    if foreign.is_empty() {
        return Ok(None);
    }
    let managed = &current["metadata"]["managedFields"];
    let writers: BTreeSet<&str> = managed
        .as_array()
        .into_iter()
        .flatten()
        .filter(|e| model::diff::is_foreign_entry(e, FIELD_MANAGER))
        .filter_map(|e| e["manager"].as_str())
        .collect();
    let patch: json_patch::Patch =
        serde_json::from_value(removal_patch(&foreign, managed, FIELD_MANAGER))
            .map_err(|e| Error::failed(FailureReason::Internal, format!("a JSON patch: {e}")))?;
    let params = PatchParams {
        field_manager: Some(MANAGER.into()),
        ..PatchParams::default()
    };
    api.patch(name, &params, &Patch::<()>::Json(patch)).await?;
    let paths: Vec<String> = foreign.iter().map(|f| f.pointer()).collect();
    if writers.is_empty() {
        // only what the object was created with and the spec no longer asks for (decision 57)
        info!(object = %name, removed = ?paths, "removed fields the spec no longer asks for");
        return Ok(Some(Removed {
            paths: paths.join(", "),
            writers: String::new(),
        }));
    }
    warn!(object = %name, removed = ?paths, writers = ?writers, "removed fields another writer added");
    Ok(Some(Removed {
        paths: paths.join(", "),
        writers: writers.into_iter().collect::<Vec<_>>().join(", "),
    }))
}

/// What [`remove_foreign_fields`] removed: the paths, and the other writers that set them
/// (empty: only fields the object was created with and the spec no longer asks for).
struct Removed {
    paths: String,
    writers: String,
}

async fn create_operator_secret(cluster: &ClickHouseCluster, ctx: &Context) -> Result<Done, Error> {
    let c = model::Cluster::new(cluster)
        .map_err(|e| Error::failed(FailureReason::InvalidSpec, e.to_string()))?;
    let secret = model::secret::operator_secret(
        &c,
        &model::secret::Generated {
            operator: Password(random_password()),
            interserver: Password(random_password()),
            keeper: Password(random_password()),
            cluster: Password(random_password()),
            cluster_secret: Password(random_password()),
            exporter: Password(random_password()),
        },
    );
    let created = api::<Secret>(ctx, &cluster.namespace().unwrap_or_default())
        .create(&PostParams::default(), &secret)
        .await;
    match noted(ctx, cluster, Kind::Secret, created) {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        Err(e) => return Err(e.into()),
    }
    Ok(normal(
        "CredentialsCreated",
        "Create",
        format!(
            "created Secret {}",
            names::operator_secret(&cluster.name_any())
        ),
    ))
}

/// Makes the cluster the only owner of `<cluster>-operator`, kept from a deleted cluster of the
/// same name with the volumes it retained ([`super::retained`]); the Secret's data is left as
/// it is.
async fn adopt_operator_secret(cluster: &ClickHouseCluster, ctx: &Context) -> Result<Done, Error> {
    let name = names::operator_secret(&cluster.name_any());
    let owner = kube::Resource::controller_owner_ref(cluster, &()).ok_or_else(|| {
        Error::failed(FailureReason::InvalidSpec, "the cluster has no uid".into())
    })?;
    let adopted = api::<Secret>(ctx, &cluster.namespace().unwrap_or_default())
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"metadata": {"ownerReferences": [owner]}})),
        )
        .await;
    noted(ctx, cluster, Kind::Secret, adopted)?;
    Ok(normal(
        "CredentialsAdopted",
        "Update",
        format!(
            "took over Secret {name}, kept from a deleted cluster of this name with its volumes: \
             the servers keep the Keeper identity and passwords their data was written with"
        ),
    ))
}

/// Adds the exporter's password to `<cluster>-operator`, only if it is still absent and the
/// Secret has not changed since it was read (the patch names its resourceVersion), so that a
/// password written meanwhile is never replaced.
async fn add_exporter_password(cluster: &ClickHouseCluster, ctx: &Context) -> Result<Done, Error> {
    let name = names::operator_secret(&cluster.name_any());
    let api = api::<Secret>(ctx, &cluster.namespace().unwrap_or_default());
    let current = api.get_opt(&name).await?;
    let present = current
        .as_ref()
        .and_then(|s| s.data.as_ref())
        .is_some_and(|d| d.contains_key(names::EXPORTER_PASSWORD_KEY));
    if let Some(secret) = current.filter(|_| !present) {
        let value = k8s_openapi::ByteString(random_password().into_bytes());
        let added = api
            .patch(
                &name,
                &PatchParams::default(),
                &Patch::Merge(serde_json::json!({
                    "metadata": {"resourceVersion": secret.metadata.resource_version},
                    "data": {names::EXPORTER_PASSWORD_KEY: value},
                })),
            )
            .await;
        noted(ctx, cluster, Kind::Secret, added)?;
    }
    Ok(normal(
        "CredentialsCreated",
        "Create",
        format!("added the exporter's password to Secret {name}"),
    ))
}

/// Publishes the exporter's credentials (see [`crate::controller::exporter_credentials`]). A
/// failure is the operator's own set-up, not the cluster's: it is logged, the cluster's pass
/// goes on, and the next pass tries again.
async fn publish_exporter_credentials(cluster: &ClickHouseCluster, world: &World, ctx: &Context) {
    let Some(publisher) = &ctx.exporter_credentials else {
        return;
    };
    let (Some(password), ca) = super::observe::exporter_credentials(cluster, world) else {
        return;
    };
    let ns = cluster.namespace().unwrap_or_default();
    if let Err(e) = publisher
        .publish(&ctx.client, &ns, &cluster.name_any(), password, ca)
        .await
    {
        warn!(
            cluster = %cluster.name_any(),
            secret = %publisher.secret(),
            error = %e,
            "could not publish the exporter's credentials (EXPORTER_CREDENTIALS_SECRET): the exporter reports this cluster's servers down until it can"
        );
    }
}

/// A random password of 32 letters and digits (no look-alikes).
fn random_password() -> String {
    const CHARS: &[u8] = b"ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnpqrstuvwxyz23456789";
    let mut rng = rand::rng();
    (0..32)
        .map(|_| CHARS[rng.random_range(0..CHARS.len())] as char)
        .collect()
}

/// Takes the pod out of the client Service (unless it was observed out of it already), then
/// deletes it, only if it is still the pod that was observed (its replacement is never deleted
/// by name).
async fn restart_pod(
    ctx: &Context,
    cluster: &ClickHouseCluster,
    pod: &str,
    uid: Option<&str>,
    serving: bool,
) -> Result<Done, Error> {
    let pods = api::<Pod>(ctx, &cluster.namespace().unwrap_or_default());
    if serving {
        let unlabel = json!({"metadata": {"labels": {labels::SERVING: null}}});
        ignore_not_found(noted(
            ctx,
            cluster,
            Kind::Pod,
            pods.patch(pod, &PatchParams::default(), &Patch::Merge(unlabel))
                .await,
        ))?;
    }
    let dp = DeleteParams {
        preconditions: uid.map(|uid| Preconditions {
            uid: Some(uid.to_string()),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    ignore_gone(noted_deletion(
        ctx,
        cluster,
        Kind::Pod,
        pod,
        uid,
        pods.delete(pod, &dp).await,
    ))?;
    Ok(Done::Finished(None))
}

async fn migrate_schema(
    cluster: &ClickHouseCluster,
    world: &World,
    replica: &str,
    shard: ShardIndex,
    connections: &clickhouse::Connections,
) -> Result<Done, Error> {
    let target = ch_client(cluster, world, replica, connections)?;
    let map = &cluster
        .status
        .as_ref()
        .map(|s| s.replica_state_map.clone())
        .unwrap_or_default();
    let mut peers = Vec::new();
    let mut others = Vec::new();
    let mut seen_shards = BTreeSet::new();
    for (n, r) in map
        .iter()
        .filter(|(_, r)| r.state == crate::api::ReplicaState::Ready)
    {
        // Every Ready replica is a source: one that cannot be reached fails the step (it is
        // tried again next pass) rather than leave the new replica without its tables.
        let c = ch_client(cluster, world, n, connections)?;
        if r.shard == shard {
            peers.push(c);
        } else if seen_shards.insert(r.shard) {
            others.push(c);
        }
    }
    let (policy, _) = crate::api::SchemaPolicy::normalise(&cluster.spec.schema_policy);
    let cluster_name = ClusterName(cluster.name_any());
    let outcome = schemer::migrate_new_host(
        &target,
        schemer::MigrationSources {
            cluster: &cluster_name,
            shard_peers: &peers,
            other_shards: &others,
        },
        policy,
        schemer::Topology {
            hosts: (cluster.spec.shards * cluster.spec.replicas) as usize,
            shard_replicas: cluster.spec.replicas as usize,
        },
    )
    .await
    .map_err(|e| Error::clickhouse(&format!("copying the schema onto {replica}"), e))?;
    let created = |b: &Option<schemer::BatchOutcome>| b.as_ref().map_or(0, |b| b.created.len());
    Ok(normal(
        "SchemaCopied",
        "MigrateSchema",
        format!(
            "replica {replica} is ready: {} replicated and {} distributed object(s) created",
            created(&outcome.replicated),
            created(&outcome.distributed)
        ),
    ))
}
