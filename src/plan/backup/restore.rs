//! A ClickHouseRestore's state machine (decision 13): `New → Running → Succeeded | Failed`. A
//! restore starts once its backup is usable (a ClickHouseBackup here has succeeded), its place
//! is one the cluster names, every shard has a Ready backup replica and the backup's manifest
//! is in the bucket, keeps its rules and has the cluster's number of shards; then one agent per
//! shard creates the schema on every replica of the shard and attaches the shard's parts on its
//! backup replica, from where replication copies them to the others.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::jiff::Timestamp;

use super::destination::{self, default_prefix};
use super::take::{backup_replicas, in_map};
use super::{
    Agent, FOLLOW, Failure, FailureReason, Next, Outcome, Plan, Shard, Step, gave_up_waiting, next,
    s3_url,
};
use crate::api::{
    BackupState, ClickHouseCluster, ClickHouseRestore, ClickHouseRestoreStatus, ReplicaState,
    RestoreState, S3Destination, ShardRestoreStatus,
};
use crate::model::job::{AgentJob, Mode};
use crate::model::manifest;
use crate::plan::EventType;

/// The ClickHouseBackup a restore names, as observed.
#[derive(Clone, Debug, PartialEq)]
pub struct NamedBackup {
    pub state: BackupState,
    pub cluster: String,
    pub destination: Option<S3Destination>,
}

/// What a pass of a restore observed.
#[derive(Clone, Debug)]
pub struct World {
    pub now: Timestamp,
    /// The cluster restored into; `None`: not found.
    pub cluster: Option<std::sync::Arc<ClickHouseCluster>>,
    /// The ClickHouseBackup of `spec.backupName`, if there is one.
    pub backup: Option<NamedBackup>,
    /// That backup's cluster's destination, if that cluster exists.
    pub backup_cluster_destination: Option<S3Destination>,
    /// The replicas whose pods are Ready now.
    pub ready: BTreeSet<String>,
    /// Each shard recorded in the status, observed.
    pub shards: BTreeMap<i32, Shard>,
    /// The image agent Jobs run.
    pub image: String,
}

fn namespace(r: &ClickHouseRestore) -> String {
    r.metadata.namespace.clone().unwrap_or_default()
}

/// Where the backup is, its prefix written out (the folder of the cluster it was taken of), if
/// `cluster` names that place (see [`destination::choose_for_restore`]).
pub fn location(
    restore: &ClickHouseRestore,
    cluster: &ClickHouseCluster,
    w: &World,
) -> Result<S3Destination, Failure> {
    let ns = namespace(restore);
    let cluster_name = cluster.metadata.name.clone().unwrap_or_default();
    let found = match (&restore.spec.destination, &w.backup) {
        (Some(d), _) => Some((d.clone(), cluster_name.clone())),
        (None, Some(b)) => b
            .destination
            .clone()
            .or_else(|| w.backup_cluster_destination.clone())
            .or_else(|| cluster.spec.backup.destination.clone())
            .map(|d| (d, b.cluster.clone())),
        (None, None) => cluster
            .spec
            .backup
            .destination
            .clone()
            .map(|d| (d, cluster_name.clone())),
    };
    let Some((mut d, source)) = found else {
        return Err(Failure::new(
            FailureReason::Destination,
            format!(
                "no destination: backup {} is not a ClickHouseBackup here; set spec.destination",
                restore.spec.backup_name
            ),
        ));
    };
    if d.prefix.is_none() {
        d.prefix = Some(default_prefix(&ns, &source));
    }
    destination::choose_for_restore(&d, cluster, &ns)
        .map_err(|e| Failure::new(FailureReason::Destination, e.to_string()))
}

/// The next pass of `restore`.
pub fn decide(restore: &ClickHouseRestore, w: &World) -> Plan<ClickHouseRestoreStatus> {
    let old = restore.status.clone().unwrap_or_default();
    let mut plan = Plan::new(old.clone());
    match (old.state, w.cluster.as_deref()) {
        (RestoreState::Succeeded | RestoreState::Failed, _) => {}
        (RestoreState::New, None) => {
            plan.status.message = Some(format!(
                "ClickHouseCluster {} not found in namespace {}",
                restore.spec.cluster_name,
                namespace(restore)
            ));
            plan.requeue = Some(FOLLOW * 6);
        }
        (_, None) => fail(
            &mut plan,
            w.now,
            Failure::new(
                FailureReason::ClusterDeleted,
                format!(
                    "ClickHouseCluster {} was deleted during the restore",
                    restore.spec.cluster_name
                ),
            ),
        ),
        (RestoreState::New, Some(cluster)) => start(&mut plan, restore, cluster, w),
        (_, Some(cluster)) => follow(&mut plan, restore, cluster, w),
    }
    plan
}

fn fail(plan: &mut Plan<ClickHouseRestoreStatus>, now: Timestamp, failure: Failure) {
    plan.status.state = RestoreState::Failed;
    plan.status.completion_time = Some(now.to_string());
    plan.status.message = Some(failure.message.clone());
    plan.status.reason = Some(failure.reason.as_str().into());
    plan.failed("RestoreFailed", "Restore", failure);
}

fn start(
    plan: &mut Plan<ClickHouseRestoreStatus>,
    restore: &ClickHouseRestore,
    cluster: &ClickHouseCluster,
    w: &World,
) {
    let backup = &restore.spec.backup_name;
    if restore.spec.destination.is_none()
        && let Some(b) = &w.backup
    {
        match b.state {
            BackupState::Succeeded => {}
            BackupState::Failed => {
                return fail(
                    plan,
                    w.now,
                    Failure::new(
                        FailureReason::BackupNotUsable,
                        format!("backup {backup} failed: there is nothing to restore"),
                    ),
                );
            }
            _ => {
                plan.status.message = Some(format!("waiting for backup {backup} to finish"));
                plan.requeue = Some(FOLLOW * 2);
                return;
            }
        }
    }
    let d = match location(restore, cluster, w) {
        Ok(d) => d,
        Err(f) => return fail(plan, w.now, f),
    };
    let replicas = backup_replicas(cluster, &|r| w.ready.contains(r));
    if let Some((shard, _)) = replicas.iter().find(|(_, r)| r.is_none()) {
        let message = format!("waiting for a Ready backup replica in shard {shard}");
        if let Some(failure) = gave_up_waiting(&restore.metadata, w.now, &message) {
            return fail(plan, w.now, failure);
        }
        plan.status.message = Some(message);
        plan.requeue = Some(FOLLOW * 2);
        return;
    }
    let s = &mut plan.status;
    s.state = RestoreState::Running;
    s.start_time = Some(w.now.to_string());
    s.shards = replicas
        .into_iter()
        .map(|(shard, r)| ShardRestoreStatus {
            shard,
            replica: r.unwrap_or_default(),
            ..ShardRestoreStatus::default()
        })
        .collect();
    let message = format!(
        "restoring {} into {}",
        s3_url(
            &d,
            d.prefix.as_deref().unwrap_or_default(),
            &manifest::backup_dir(backup)
        ),
        cluster.metadata.name.clone().unwrap_or_default()
    );
    s.message = Some(message.clone());
    plan.event(EventType::Normal, "RestoreStarted", "Restore", message);
    plan.steps.push(Step::ReadManifest {
        destination: d,
        backup: backup.clone(),
    });
    plan.requeue = Some(std::time::Duration::from_secs(1));
}

fn follow(
    plan: &mut Plan<ClickHouseRestoreStatus>,
    restore: &ClickHouseRestore,
    cluster: &ClickHouseCluster,
    w: &World,
) {
    let d = match location(restore, cluster, w) {
        Ok(d) => d,
        Err(f) => {
            return fail(
                plan,
                w.now,
                Failure::new(
                    f.reason,
                    format!(
                        "the backup's destination changed during the restore: {}",
                        f.message
                    ),
                ),
            );
        }
    };
    let cluster_name = cluster.metadata.name.clone().unwrap_or_default();
    let map = cluster
        .status
        .as_ref()
        .map(|s| s.replica_state_map.clone())
        .unwrap_or_default();
    let mut running = false;
    for i in 0..plan.status.shards.len() {
        let recorded = plan.status.shards[i].clone();
        if recorded.done {
            continue;
        }
        let (n, replica) = (recorded.shard, recorded.replica.clone());
        let shard = w.shards.get(&n).cloned().unwrap_or(Shard {
            replica: in_map(cluster, &replica),
            placement: None,
            agent: Agent::Missing,
        });
        match next(Mode::Restore, n, &replica, &shard) {
            Next::Create(placement) => {
                let peers = map
                    .iter()
                    .filter(|(name, r)| {
                        r.shard.get() == n
                            && **name != replica
                            && r.state != ReplicaState::Condemned
                    })
                    .map(|(name, _)| name.to_string())
                    .collect();
                plan.steps.push(Step::CreateAgent(Box::new(AgentJob {
                    mode: Mode::Restore,
                    owner: super::owner("ClickHouseRestore", &restore.metadata),
                    namespace: namespace(restore),
                    cluster: cluster_name.clone(),
                    cluster_domain: cluster.spec.cluster_domain().to_string(),
                    backup: restore.spec.backup_name.clone(),
                    shard: n,
                    replica,
                    peers,
                    placement: *placement,
                    image: w.image.clone(),
                    destination: d.clone(),
                    prefix: d.prefix.clone().unwrap_or_default(),
                    base: None,
                    tables: Vec::new(),
                    into_non_empty: restore.spec.into_non_empty_tables,
                    // parts are attached from the data volume; the server's storage policy
                    // moves them where they belong
                    disks: Vec::new(),
                    allow_external: restore.spec.allow_external_sources,
                    pod: cluster.spec.backup.agent.clone(),
                    tls: AgentJob::tls_of(cluster),
                })));
                running = true;
            }
            Next::Wait => running = true,
            Next::Done(r) => {
                let s = &mut plan.status.shards[i];
                s.parts_attached = r.parts_attached;
                s.bytes_downloaded = r.bytes_downloaded;
                s.done = true;
            }
            Next::Fail(f) => return fail(plan, w.now, f),
        }
    }
    if running {
        plan.requeue = Some(FOLLOW);
        return;
    }
    let s = &mut plan.status;
    s.state = RestoreState::Succeeded;
    s.completion_time = Some(w.now.to_string());
    s.bytes_downloaded = s.shards.iter().map(|s| s.bytes_downloaded).sum();
    s.message = None;
    let message = format!(
        "{} parts attached, {} bytes downloaded",
        s.shards.iter().map(|s| s.parts_attached).sum::<u64>(),
        s.bytes_downloaded
    );
    plan.event(EventType::Normal, "RestoreSucceeded", "Restore", message);
}

/// The status written after the steps ran: a refused or unreadable manifest, or one with
/// another number of shards, fails the restore.
pub fn report(
    mut plan: Plan<ClickHouseRestoreStatus>,
    outcome: &Outcome,
    cluster_shards: i32,
    now: Timestamp,
) -> Plan<ClickHouseRestoreStatus> {
    if let Some(refused) = &outcome.refused {
        fail(&mut plan, now, refused.clone());
        return plan;
    }
    if let Some(m) = &outcome.manifest
        && m.shards.len() as i32 != cluster_shards
    {
        let message = format!(
            "backup {} has {} shard(s), the cluster has {cluster_shards}: restore into a cluster with as many shards",
            m.backup,
            m.shards.len(),
        );
        fail(
            &mut plan,
            now,
            Failure::new(FailureReason::ShardCount, message),
        );
    }
    plan
}
