//! The ClickHouseCluster controller: observe → decide (pure, `plan::decide`) → act → report.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Pod, Secret, Service};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::jiff::Timestamp;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, ListParams, PartialObjectMeta, Patch,
    PatchParams, PostParams, PropagationPolicy,
};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType as KubeEventType, Recorder};
use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};
use rand::Rng;
use serde_json::json;
use tracing::{debug, info, warn};

use super::{CLUSTER_LABEL, Context, MANAGER, PassTimer};
use crate::api::{
    ClickHouseBackup, ClickHouseCluster, ClickHouseClusterStatus, ReclaimPolicy, ReplicaState,
};
use crate::clickhouse::{self, replica as chreplica, schemer, sql::ClusterName};
use crate::model::{self, Password, names};
use crate::plan::engine::{Action as Step, Kind, Observed, TRAFFIC_LABELS};
use crate::plan::scale_in::{self, ScaleInAction};
use crate::plan::{self, EventType, Plan, PlannedEvent, Sibling, World};
use crate::runtime::backoff::RECHECK;
use crate::runtime::metrics::{ErrorLabels, KindLabels, ObjectLabels};

pub const KIND: &str = "ClickHouseCluster";
/// Finalizer of a ClickHouseCluster: deletion runs the PVC reclaim policy first.
pub const FINALIZER: &str = "clickhouse.com/finalizer";
/// Label that hands a PVC to the PVC cleaner.
pub const DELETE_PVC_LABEL: &str = "clickhouse.com/delete-pvc";
/// How long a shard's sync before scale-in may take.
const SYNC_TIMEOUT: Duration = Duration::from_secs(300);

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("{reason}: {message}")]
    Failed {
        reason: &'static str,
        message: String,
    },
}

impl Error {
    fn reason(&self) -> &'static str {
        match self {
            Error::Kube(_) => "KubernetesApi",
            Error::Failed { reason, .. } => reason,
        }
    }
}

/// The clusters of the Secret's namespace that reference it (users, TLS, environment).
pub fn clusters_referencing_secret(
    clusters: &[Arc<ClickHouseCluster>],
    secret: &PartialObjectMeta<Secret>,
) -> Vec<ObjectRef<ClickHouseCluster>> {
    let (Some(ns), Some(name)) = (
        secret.metadata.namespace.as_deref(),
        secret.metadata.name.as_deref(),
    ) else {
        return Vec::new();
    };
    clusters
        .iter()
        .filter(|c| c.metadata.namespace.as_deref() == Some(ns))
        .filter(|c| referenced_secrets(c).iter().any(|(_, s)| s == name))
        .map(|c| ObjectRef::from_obj(c.as_ref()))
        .collect()
}

/// The Secrets a cluster reads: (field naming it, Secret name).
pub fn referenced_secrets(c: &ClickHouseCluster) -> Vec<(&'static str, String)> {
    let s = &c.spec;
    [
        (
            "spec.users.secretName",
            s.users.as_ref().map(|u| u.secret_name.clone()),
        ),
        (
            "spec.tls.serverCertSecret",
            s.tls.server_cert_secret.clone().filter(|_| s.tls.enabled),
        ),
        (
            "spec.tls.caSecret",
            s.tls.ca_secret.clone().filter(|_| s.tls.enabled),
        ),
        ("spec.pod.envSecret", s.pod.env_secret.clone()),
        ("spec.keeper.pod.envSecret", s.keeper.pod.env_secret.clone()),
    ]
    .into_iter()
    .filter_map(|(f, n)| n.map(|n| (f, n)))
    .collect()
}

fn api<K>(ctx: &Context, ns: &str) -> Api<K>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>,
{
    Api::namespaced(ctx.client.clone(), ns)
}

fn by_name<K: Resource>(items: Vec<K>) -> BTreeMap<String, K> {
    items
        .into_iter()
        .map(|o| (o.meta().name.clone().unwrap_or_default(), o))
        .collect()
}

async fn observe(cluster: &ClickHouseCluster, ctx: &Context) -> Result<World, Error> {
    let ns = cluster.namespace().unwrap_or_default();
    let name = cluster.name_any();
    let siblings = ctx
        .clusters_in(&ns)
        .iter()
        .filter(|c| c.metadata.deletion_timestamp.is_none() || c.name_any() == name)
        .map(|c| Sibling {
            name: c.name_any(),
            created: c.metadata.creation_timestamp.as_ref().map(|t| t.0),
        })
        .collect();
    let lp = ListParams::default().labels(&format!("{CLUSTER_LABEL}={name}"));
    let mut o = Observed {
        statefulsets: by_name(api::<StatefulSet>(ctx, &ns).list(&lp).await?.items),
        pods: by_name(api::<Pod>(ctx, &ns).list(&lp).await?.items),
        pvcs: by_name(
            api::<PersistentVolumeClaim>(ctx, &ns)
                .list(&lp)
                .await?
                .items,
        ),
        ..Observed::default()
    };
    for cm in api::<ConfigMap>(ctx, &ns).list(&lp).await?.items {
        o.objects.insert(
            (Kind::ConfigMap, cm.name_any()),
            serde_json::to_value(&cm).unwrap_or_default(),
        );
    }
    for s in api::<Service>(ctx, &ns).list(&lp).await?.items {
        o.objects.insert(
            (Kind::Service, s.name_any()),
            serde_json::to_value(&s).unwrap_or_default(),
        );
    }
    for p in api::<PodDisruptionBudget>(ctx, &ns).list(&lp).await?.items {
        o.objects.insert(
            (Kind::PodDisruptionBudget, p.name_any()),
            serde_json::to_value(&p).unwrap_or_default(),
        );
    }
    let secrets: Api<Secret> = api(ctx, &ns);
    for s in secrets.list(&lp).await?.items {
        if s.name_any() == names::operator_secret(&name)
            && let Some(pw) = s
                .data
                .as_ref()
                .and_then(|d| d.get(names::OPERATOR_PASSWORD_KEY))
        {
            o.operator_secret_present = true;
            o.inputs.operator_password = Password(String::from_utf8_lossy(&pw.0).into_owned());
        }
        o.objects.insert(
            (Kind::Secret, s.name_any()),
            serde_json::to_value(&s).unwrap_or_default(),
        );
    }
    for (field, secret) in referenced_secrets(cluster) {
        match secrets.get_opt(&secret).await? {
            None => o.missing_secrets.push((field.to_string(), secret)),
            Some(s) => {
                let data: model::SecretData = s
                    .data
                    .unwrap_or_default()
                    .into_iter()
                    .map(|(k, v)| (k, v.0))
                    .collect();
                if field == "spec.users.secretName" {
                    o.inputs.user_passwords = data
                        .iter()
                        .map(|(k, v)| {
                            (k.clone(), Password(String::from_utf8_lossy(v).into_owned()))
                        })
                        .collect();
                } else {
                    o.inputs.secrets.insert(secret, data);
                }
            }
        }
    }
    let backups: Api<ClickHouseBackup> = api(ctx, &ns);
    o.backup_in_flight = backups
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .find(|b| {
            b.spec.cluster_name == name && b.status.as_ref().is_some_and(|s| s.state.in_flight())
        })
        .map(|b| b.name_any());
    let mut world = World {
        clusters_in_namespace: siblings,
        observed: o,
    };
    // What each Ready server has loaded of remote_servers (see `Observed::cluster_hosts`).
    if world.observed.operator_secret_present {
        let ready: Vec<String> = cluster
            .status
            .iter()
            .flat_map(|s| s.replica_state_map.keys())
            .filter(|r| {
                world
                    .observed
                    .pods
                    .get(&names::replica_pod(r))
                    .and_then(|p| p.status.as_ref()?.conditions.as_ref())
                    .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
            })
            .cloned()
            .collect();
        for r in ready {
            let seen = match ch_client(cluster, &world, &r) {
                Ok(c) => {
                    let q = format!(
                        "SELECT count() AS n FROM system.clusters WHERE cluster = {}",
                        clickhouse::sql::literal(&name)
                    );
                    c.query(&q, &clickhouse::QueryOptions::new())
                        .await
                        .ok()
                        .and_then(|rows| rows.iter().next().and_then(|row| row.u64("n").ok()))
                }
                Err(_) => None,
            };
            world.observed.cluster_hosts.insert(r, seen);
        }
    }
    Ok(world)
}

/// A ClickHouse client for a replica's pod, as the operator's own user.
fn ch_client(
    cluster: &ClickHouseCluster,
    world: &World,
    replica: &str,
) -> Result<clickhouse::Client, Error> {
    let pod = names::replica_pod(replica);
    let ip = world
        .observed
        .pods
        .get(&pod)
        .and_then(|p| p.status.as_ref()?.pod_ip.clone())
        .ok_or_else(|| Error::Failed {
            reason: "ReplicaUnreachable",
            message: format!("pod {pod} has no address"),
        })?;
    let tls = cluster.spec.tls.enabled;
    let ca = cluster
        .spec
        .tls
        .ca_secret
        .as_ref()
        .and_then(|s| world.observed.inputs.secrets.get(s))
        .and_then(|d| d.get("ca.crt").cloned());
    let mut config = clickhouse::ClientConfig::new(
        clickhouse::Endpoint {
            host: ip,
            port: if tls && ca.is_some() {
                names::HTTPS_PORT as u16
            } else {
                names::HTTP_PORT as u16
            },
        },
        clickhouse::Credentials {
            user: names::OPERATOR_USER.to_string(),
            password: world.observed.inputs.operator_password.0.clone(),
        },
    );
    if tls {
        config.tls_ca_pem = ca;
    }
    clickhouse::Client::new(config).map_err(|e| Error::Failed {
        reason: "ClickHouse",
        message: e.to_string(),
    })
}

fn ch_error(what: &str, e: impl std::fmt::Display) -> Error {
    Error::Failed {
        reason: "ClickHouse",
        message: format!("{what}: {e}"),
    }
}

fn resource(kind: Kind) -> ApiResource {
    match kind {
        Kind::ConfigMap => ApiResource::erase::<ConfigMap>(&()),
        Kind::Secret => ApiResource::erase::<Secret>(&()),
        Kind::Service => ApiResource::erase::<Service>(&()),
        Kind::StatefulSet => ApiResource::erase::<StatefulSet>(&()),
        Kind::PodDisruptionBudget => ApiResource::erase::<PodDisruptionBudget>(&()),
    }
}

fn dynamic(ctx: &Context, ns: &str, kind: Kind) -> Api<DynamicObject> {
    Api::namespaced_with(ctx.client.clone(), ns, &resource(kind))
}

fn ignore_not_found<T>(r: Result<T, kube::Error>) -> Result<(), kube::Error> {
    match r {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(e) => Err(e),
    }
}

fn random_password() -> String {
    const CHARS: &[u8] = b"ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnpqrstuvwxyz23456789";
    let mut rng = rand::rng();
    (0..32)
        .map(|_| CHARS[rng.random_range(0..CHARS.len())] as char)
        .collect()
}

/// Runs one action. Updates `status` for actions whose success the map records.
async fn run_step(
    cluster: &ClickHouseCluster,
    world: &World,
    status: &mut ClickHouseClusterStatus,
    step: &Step,
    ctx: &Context,
) -> Result<Option<PlannedEvent>, Error> {
    let ns = cluster.namespace().unwrap_or_default();
    let name = cluster.name_any();
    let pp = PatchParams::apply(MANAGER).force();
    let normal = |reason: &'static str, action: &'static str, message: String| {
        Some(PlannedEvent {
            kind: EventType::Normal,
            reason,
            action,
            message,
        })
    };
    match step {
        Step::CreateOperatorSecret => {
            let c = model::Cluster::new(cluster).map_err(|e| Error::Failed {
                reason: "InvalidSpec",
                message: e.to_string(),
            })?;
            let secret = model::secret::operator_secret(&c, &Password(random_password()));
            match api::<Secret>(ctx, &ns)
                .create(&PostParams::default(), &secret)
                .await
            {
                Ok(_) => {}
                Err(kube::Error::Api(e)) if e.code == 409 => {}
                Err(e) => return Err(e.into()),
            }
            Ok(normal(
                "CredentialsCreated",
                "Create",
                format!("created Secret {}", names::operator_secret(&name)),
            ))
        }
        Step::Apply {
            kind,
            name: obj,
            object,
            create,
        } => {
            let api = dynamic(ctx, &ns, *kind);
            if *create {
                let o: DynamicObject =
                    serde_json::from_value(object.clone()).map_err(|e| Error::Failed {
                        reason: "Internal",
                        message: format!("{} {obj} does not deserialise: {e}", kind.as_str()),
                    })?;
                match api
                    .create(
                        &PostParams {
                            field_manager: Some(MANAGER.into()),
                            ..PostParams::default()
                        },
                        &o,
                    )
                    .await
                {
                    Ok(_) => {}
                    Err(kube::Error::Api(e)) if e.code == 409 => {
                        return Err(Error::Failed {
                            reason: "NameConflict",
                            message: format!(
                                "{} {obj} already exists and is not managed by ClickHouseCluster {name}: rename or remove it",
                                kind.as_str()
                            ),
                        });
                    }
                    Err(e) => return Err(e.into()),
                }
                return Ok(normal(
                    "Created",
                    "Create",
                    format!("created {} {obj}", kind.as_str()),
                ));
            }
            api.patch(obj, &pp, &Patch::Apply(object)).await?;
            Ok(normal(
                "Applied",
                "Apply",
                format!("applied {} {obj}", kind.as_str()),
            ))
        }
        Step::RecreateStatefulSet { name: sts, object } => {
            let api = api::<StatefulSet>(ctx, &ns);
            let dp = DeleteParams {
                propagation_policy: Some(PropagationPolicy::Orphan),
                ..DeleteParams::default()
            };
            ignore_not_found(api.delete(sts, &dp).await)?;
            for _ in 0..60 {
                if api.get_opt(sts).await?.is_none() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            dynamic(ctx, &ns, Kind::StatefulSet)
                .patch(sts, &pp, &Patch::Apply(object))
                .await?;
            Ok(normal(
                "StatefulSetRecreated",
                "Recreate",
                format!("recreated StatefulSet {sts}; its pod kept running"),
            ))
        }
        Step::ResizePvc { name: pvc, size } => {
            api::<PersistentVolumeClaim>(ctx, &ns)
                .patch(
                    pvc,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"spec": {"resources": {"requests": {"storage": size}}}})),
                )
                .await?;
            Ok(normal(
                "VolumeResized",
                "Resize",
                format!("PVC {pvc} resized to {size}"),
            ))
        }
        Step::RestartPod { pod, .. } => {
            let pods = api::<Pod>(ctx, &ns);
            let labels: serde_json::Map<String, serde_json::Value> =
                [(model::labels::SERVING.to_string(), serde_json::Value::Null)]
                    .into_iter()
                    .collect();
            ignore_not_found(
                pods.patch(
                    pod,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"metadata": {"labels": labels}})),
                )
                .await,
            )?;
            ignore_not_found(pods.delete(pod, &DeleteParams::default()).await)?;
            Ok(None)
        }
        Step::MigrateSchema { replica, shard } => {
            let target = ch_client(cluster, world, replica)?;
            let ready = |n: &&String| {
                status
                    .replica_state_map
                    .get(*n)
                    .is_some_and(|r| r.state == ReplicaState::Ready)
            };
            let mut peers = Vec::new();
            let mut others = Vec::new();
            let names_all: Vec<String> = status.replica_state_map.keys().cloned().collect();
            let mut seen_shards = std::collections::BTreeSet::new();
            for n in names_all.iter().filter(ready) {
                let s = status.replica_state_map[n].shard;
                let Ok(c) = ch_client(cluster, world, n) else {
                    continue;
                };
                if s == *shard {
                    peers.push(c);
                } else if seen_shards.insert(s) {
                    others.push(c);
                }
            }
            let (policy, _) = crate::api::SchemaPolicy::normalise(&cluster.spec.schema_policy);
            let cluster_name = ClusterName(name.clone());
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
            .map_err(|e| ch_error(&format!("copying the schema onto {replica}"), e))?;
            if let Some(r) = status.replica_state_map.get_mut(replica) {
                r.state = ReplicaState::Ready;
            }
            let created =
                |b: &Option<schemer::BatchOutcome>| b.as_ref().map_or(0, |b| b.created.len());
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
        Step::ScaleIn(a) => {
            let event = run_scale_in(cluster, world, a, ctx).await?;
            scale_in::record(&mut status.replica_state_map, a);
            Ok(event)
        }
        Step::Delete { kind, name: obj } => {
            ignore_not_found(
                dynamic(ctx, &ns, *kind)
                    .delete(obj, &DeleteParams::background())
                    .await,
            )?;
            Ok(normal(
                "Deleted",
                "Delete",
                format!("deleted {} {obj}", kind.as_str()),
            ))
        }
    }
}

async fn run_scale_in(
    cluster: &ClickHouseCluster,
    world: &World,
    a: &ScaleInAction,
    ctx: &Context,
) -> Result<Option<PlannedEvent>, Error> {
    let ns = cluster.namespace().unwrap_or_default();
    let event = |reason: &'static str, message: String| {
        Some(PlannedEvent {
            kind: EventType::Normal,
            reason,
            action: "ScaleIn",
            message,
        })
    };
    match a {
        ScaleInAction::LeaveTraffic { replica } => {
            let labels: serde_json::Map<String, serde_json::Value> = TRAFFIC_LABELS
                .iter()
                .map(|l| (l.to_string(), serde_json::Value::Null))
                .collect();
            ignore_not_found(
                api::<Pod>(ctx, &ns)
                    .patch(
                        &names::replica_pod(replica),
                        &PatchParams::default(),
                        &Patch::Merge(json!({"metadata": {"labels": labels}})),
                    )
                    .await,
            )?;
            Ok(event(
                "LeftTraffic",
                format!("{replica} is out of the client Service and the topology spread"),
            ))
        }
        ScaleInAction::SyncShard { replica, backup } => {
            if backup.is_empty() {
                return Ok(event(
                    "Synced",
                    format!("{replica}: its whole shard is removed, nothing to sync to"),
                ));
            }
            let client = ch_client(cluster, world, backup)?;
            let tables = chreplica::sync_shard(&client, SYNC_TIMEOUT)
                .await
                .map_err(|e| ch_error(&format!("syncing the shard of {replica} on {backup}"), e))?;
            Ok(event(
                "Synced",
                format!(
                    "{} replicated table(s) synced on {backup} before removing {replica}",
                    tables.len()
                ),
            ))
        }
        ScaleInAction::DropObjects { replica } => match ch_client(cluster, world, replica) {
            Ok(client) => {
                let dropped = chreplica::drop_leaving_objects(&client)
                    .await
                    .map_err(|e| ch_error(&format!("dropping the tables of {replica}"), e))?;
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
            Err(_) => Ok(Some(PlannedEvent {
                kind: EventType::Warning,
                reason: "ObjectsNotDropped",
                action: "ScaleIn",
                message: format!(
                    "{replica} has no running pod: its tables are cleaned from Keeper by a survivor instead"
                ),
            })),
        },
        ScaleInAction::DeleteStatefulSet { replica } => {
            ignore_not_found(
                api::<StatefulSet>(ctx, &ns)
                    .delete(replica, &DeleteParams::background())
                    .await,
            )?;
            ignore_not_found(
                api::<ConfigMap>(ctx, &ns)
                    .delete(&names::replica_config(replica), &DeleteParams::background())
                    .await,
            )?;
            Ok(event(
                "ReplicaDeleted",
                format!("StatefulSet {replica} deleted"),
            ))
        }
        ScaleInAction::DropKeeperMetadata {
            replica,
            shard,
            survivors,
        } => {
            let Some(survivor) = survivors.first() else {
                return Ok(event(
                    "KeeperCleaned",
                    format!("{replica}: no surviving replica in its shard"),
                ));
            };
            let client = ch_client(cluster, world, survivor)?;
            let cleanup = chreplica::drop_replica_metadata(
                &client,
                &chreplica::LeavingReplica {
                    shard: clickhouse::sql::ShardMacro(shard.to_string()),
                    replica: clickhouse::sql::ReplicaMacro(replica.clone()),
                },
            )
            .await
            .map_err(|e| {
                ch_error(
                    &format!("dropping the Keeper metadata of {replica} from {survivor}"),
                    e,
                )
            })?;
            if !cleanup.is_clean() {
                return Ok(Some(PlannedEvent {
                    kind: EventType::Warning,
                    reason: "KeeperMetadataLeft",
                    action: "ScaleIn",
                    message: format!(
                        "this ClickHouse version cannot drop the Keeper metadata of {replica} for {} table(s)",
                        cleanup.left_behind.len()
                    ),
                }));
            }
            Ok(event(
                "KeeperCleaned",
                format!("Drop replica {replica}: Keeper metadata removed"),
            ))
        }
        ScaleInAction::LabelPvcsAndForget { replica } => {
            label_pvcs(ctx, &ns, world, |p| {
                p.metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get(model::labels::REPLICA))
                    .map(String::as_str)
                    == Some(replica)
                    || p.metadata.name.as_deref()
                        == Some(&format!(
                            "{}-{}",
                            model::statefulset::DATA_VOLUME,
                            names::replica_pod(replica)
                        ))
            })
            .await?;
            Ok(event(
                "ReplicaRemoved",
                format!("{replica} removed; its PVCs are labelled {DELETE_PVC_LABEL}"),
            ))
        }
    }
}

async fn label_pvcs(
    ctx: &Context,
    ns: &str,
    world: &World,
    select: impl Fn(&PersistentVolumeClaim) -> bool,
) -> Result<(), Error> {
    for (pvc, p) in &world.observed.pvcs {
        if select(p) {
            ignore_not_found(
                api::<PersistentVolumeClaim>(ctx, ns)
                    .patch(
                        pvc,
                        &PatchParams::default(),
                        &Patch::Merge(json!({"metadata": {"labels": {DELETE_PVC_LABEL: "true"}}})),
                    )
                    .await,
            )?;
        }
    }
    Ok(())
}

async fn publish(cluster: &ClickHouseCluster, events: &[PlannedEvent], ctx: &Context) {
    if events.is_empty() {
        return;
    }
    let recorder = Recorder::new(ctx.client.clone(), ctx.reporter.clone());
    let reference = cluster.object_ref(&());
    for e in events {
        let event = Event {
            type_: match e.kind {
                EventType::Normal => KubeEventType::Normal,
                EventType::Warning => KubeEventType::Warning,
            },
            reason: e.reason.into(),
            note: Some(e.message.chars().take(1000).collect()),
            action: e.action.into(),
            secondary: None,
        };
        if let Err(err) = recorder.publish(&event, &reference).await {
            warn!(error = %err, reason = e.reason, "cannot publish event");
        }
    }
}

/// Writes the status when it changed; returns the cluster as the API server now has it.
async fn write_status(
    cluster: &ClickHouseCluster,
    status: &ClickHouseClusterStatus,
    ctx: &Context,
) -> Result<ClickHouseCluster, Error> {
    if cluster.status.as_ref() == Some(status) {
        return Ok(cluster.clone());
    }
    let api: Api<ClickHouseCluster> = api(ctx, &cluster.namespace().unwrap_or_default());
    let body = json!({
        "apiVersion": ClickHouseCluster::api_version(&()),
        "kind": ClickHouseCluster::kind(&()),
        "status": status,
    });
    let updated = api
        .patch_status(
            &cluster.name_any(),
            &PatchParams::apply(MANAGER).force(),
            &Patch::Apply(&body),
        )
        .await?;
    ctx.metrics
        .writes
        .get_or_create(&KindLabels { kind: KIND.into() })
        .inc();
    Ok(updated)
}

/// Runs the plan's actions in order, stopping at the first failure. Returns the status to
/// report and the failure, if any.
async fn act(
    cluster: &ClickHouseCluster,
    world: &World,
    plan: &Plan,
    ctx: &Context,
) -> (ClickHouseClusterStatus, Vec<PlannedEvent>, Option<Error>) {
    let mut status = plan.status.clone();
    let mut events = plan.events.clone();
    // Chains of one condemned replica stop at their first failure; other work goes on.
    let mut failed_replicas = std::collections::BTreeSet::new();
    let mut failure = None;
    for step in &plan.actions {
        if let Step::ScaleIn(a) = step
            && failed_replicas.contains(a.replica())
        {
            continue;
        }
        debug!(cluster = %cluster.name_any(), step = %step.describe(), "acting");
        match run_step(cluster, world, &mut status, step, ctx).await {
            Ok(Some(e)) => events.push(e),
            Ok(None) => {}
            Err(e) => {
                warn!(cluster = %cluster.name_any(), step = %step.describe(), error = %e, "step failed");
                if let Step::ScaleIn(a) = step {
                    failed_replicas.insert(a.replica().to_string());
                }
                if failure.is_none() {
                    failure = Some(Error::Failed {
                        reason: e.reason(),
                        message: format!("{} failed: {e}", step.describe()),
                    });
                }
                if !matches!(step, Step::ScaleIn(_)) {
                    break;
                }
            }
        }
        ctx.metrics
            .writes
            .get_or_create(&KindLabels { kind: KIND.into() })
            .inc();
    }
    if let Some(Error::Failed { reason, message }) = &failure {
        status = plan::status::failed(
            &status,
            cluster.metadata.generation,
            &plan::Failure {
                reason,
                message: message.clone(),
            },
            Timestamp::now(),
        );
        events.push(PlannedEvent {
            kind: EventType::Warning,
            reason: "ReconcileFailed",
            action: "Reconcile",
            message: message.clone(),
        });
    }
    (status, events, failure)
}

async fn check_lag(cluster: &ClickHouseCluster, world: &mut World, replicas: &[String]) {
    for r in replicas {
        let caught_up = match ch_client(cluster, world, r) {
            Ok(c) => match chreplica::replication_lag(&c).await {
                Ok(lag) => lag.is_synced(),
                Err(e) => {
                    debug!(replica = %r, error = %e, "cannot read replication lag");
                    false
                }
            },
            Err(_) => false,
        };
        world.observed.caught_up.insert(r.clone(), caught_up);
    }
}

async fn ensure_finalizer(cluster: &ClickHouseCluster, ctx: &Context) -> Result<(), Error> {
    if cluster.finalizers().iter().any(|f| f == FINALIZER) {
        return Ok(());
    }
    let mut finalizers = cluster.finalizers().to_vec();
    finalizers.push(FINALIZER.to_string());
    api::<ClickHouseCluster>(ctx, &cluster.namespace().unwrap_or_default())
        .patch(
            &cluster.name_any(),
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": finalizers, "resourceVersion": cluster.resource_version()}})),
        )
        .await?;
    Ok(())
}

/// Deletion (seed 002: run the finalizers and stop): PVCs follow `spec.storage.reclaimPolicy`
/// (decision 12); owned objects go through garbage collection.
async fn finalize(cluster: &ClickHouseCluster, ctx: &Context) -> Result<Action, Error> {
    let ns = cluster.namespace().unwrap_or_default();
    if cluster.spec.storage.reclaim_policy == ReclaimPolicy::Delete {
        let world = observe(cluster, ctx).await?;
        label_pvcs(ctx, &ns, &world, |_| true).await?;
    }
    let finalizers: Vec<String> = cluster
        .finalizers()
        .iter()
        .filter(|f| *f != FINALIZER)
        .cloned()
        .collect();
    ignore_not_found(
        api::<ClickHouseCluster>(ctx, &ns)
            .patch(
                &cluster.name_any(),
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"finalizers": finalizers}})),
            )
            .await,
    )?;
    info!(cluster = %cluster.name_any(), "deleted");
    Ok(Action::await_change())
}

pub async fn reconcile(
    cluster: Arc<ClickHouseCluster>,
    ctx: Arc<Context>,
) -> Result<Action, Error> {
    let _permit = ctx
        .cluster_permits
        .acquire()
        .await
        .expect("the semaphore is never closed");
    let _timer = PassTimer::start(KIND, &ctx.metrics);
    let key = format!(
        "{}/{}",
        cluster.namespace().unwrap_or_default(),
        cluster.name_any()
    );
    debug!(cluster = %key, generation = ?cluster.metadata.generation, "pass started");

    if cluster.metadata.deletion_timestamp.is_some() {
        if cluster.finalizers().iter().any(|f| f == FINALIZER) {
            return finalize(&cluster, &ctx).await;
        }
        return Ok(Action::await_change());
    }
    let mut current = (*cluster).clone();
    for _ in 0..4 {
        let mut world = observe(&current, &ctx).await?;
        let mut plan = plan::decide(&current, &world, Timestamp::now());
        if !plan.lag_checks.is_empty() {
            let checks = plan.lag_checks.clone();
            check_lag(&current, &mut world, &checks).await;
            plan = plan::decide(&current, &world, Timestamp::now());
        }
        if plan.manage {
            ensure_finalizer(&current, &ctx).await?;
        }
        let (status, events, failure) = act(&current, &world, &plan, &ctx).await;
        current = write_status(&current, &status, &ctx).await?;
        publish(&current, &events, &ctx).await;
        if let Some(f) = failure {
            return Err(f);
        }
        if let Some(f) = plan.failure {
            return Err(Error::Failed {
                reason: f.reason,
                message: f.message,
            });
        }
        if !plan.again {
            break;
        }
    }
    ctx.cluster_backoff.succeeded(&key);
    ctx.metrics
        .last_success
        .get_or_create(&ObjectLabels {
            kind: KIND.into(),
            namespace: cluster.namespace().unwrap_or_default(),
            name: cluster.name_any(),
        })
        .set(Timestamp::now().as_millisecond() as f64 / 1000.0);
    debug!(cluster = %key, state = %current.status.as_ref().map(|s| s.state).unwrap_or_default(), "pass done");
    Ok(Action::requeue(RECHECK))
}

pub fn error_policy(cluster: Arc<ClickHouseCluster>, error: &Error, ctx: Arc<Context>) -> Action {
    let key = format!(
        "{}/{}",
        cluster.namespace().unwrap_or_default(),
        cluster.name_any()
    );
    let delay = ctx.cluster_backoff.failed(&key);
    ctx.metrics
        .errors
        .get_or_create(&ErrorLabels {
            kind: KIND.into(),
            reason: error.reason().into(),
        })
        .inc();
    warn!(cluster = %key, error = %error, retry_in_ms = delay.as_millis() as u64, failures = ctx.cluster_backoff.failures(&key), "pass failed");
    Action::requeue(delay)
}

/// What the operator would decide for a cluster read from a file (no cluster access): the
/// plan of a first pass over an empty namespace.
pub fn offline_plan(cluster: &ClickHouseCluster) -> Plan {
    let mut world = World::default();
    world.observed.operator_secret_present = true;
    plan::decide(cluster, &world, Timestamp::now())
}
