//! A ClickHouseBackup's state machine (decision 26): `New → Starting → Running → Succeeded |
//! Failed`. A backup starts once its destination is one its cluster names, the bucket answers
//! and every shard has a Ready backup replica; it records each shard's replica, then runs one
//! agent per shard beside it; when every shard's manifest is written it writes its own manifest
//! last and succeeds. A shard whose backup replica leaves, whose server changes under its
//! agent, or whose agent fails or cannot start fails the backup, with the cause.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::jiff::Timestamp;

use super::destination::{self, default_prefix};
use super::{
    Agent, FOLLOW, Failure, FailureReason, InMap, Next, Outcome, Plan, Shard, Step,
    gave_up_waiting, next, s3_url,
};
use crate::api::{
    BackupState, ClickHouseBackup, ClickHouseBackupStatus, ClickHouseCluster, ReplicaState,
    S3Destination, ShardBackupStatus,
};
use crate::model::job::{AgentJob, Mode};
use crate::model::manifest::{self, Manifest};
use crate::plan::EventType;

/// An earlier backup in the namespace, as a base candidate.
#[derive(Clone, Debug, PartialEq)]
pub struct Earlier {
    pub name: String,
    pub cluster: String,
    pub destination: Option<S3Destination>,
    pub succeeded: bool,
    pub completed: Option<String>,
}

/// What a pass of a backup observed.
#[derive(Clone, Debug)]
pub struct World {
    pub now: Timestamp,
    /// The cluster backed up; `None`: not found.
    pub cluster: Option<std::sync::Arc<ClickHouseCluster>>,
    /// The replicas whose pods are Ready now.
    pub ready: BTreeSet<String>,
    /// Each shard recorded in the status, observed.
    pub shards: BTreeMap<i32, Shard>,
    /// The other ClickHouseBackups of the namespace.
    pub others: Vec<Earlier>,
    /// The image agent Jobs run.
    pub image: String,
}

/// Same bucket and folder: backups that can build on each other.
pub fn same_place(a: &S3Destination, b: &S3Destination, default_prefix: &str) -> bool {
    let prefix = |d: &S3Destination| {
        d.prefix
            .clone()
            .unwrap_or_else(|| default_prefix.to_string())
    };
    a.endpoint.trim_end_matches('/') == b.endpoint.trim_end_matches('/')
        && a.bucket == b.bucket
        && prefix(a) == prefix(b)
}

/// Per shard, its backup replica if it is Ready (from the cluster's replica map and pods).
pub fn backup_replicas(
    cluster: &ClickHouseCluster,
    ready: &dyn Fn(&str) -> bool,
) -> BTreeMap<i32, Option<String>> {
    let mut out: BTreeMap<i32, Option<String>> =
        (0..cluster.spec.shards).map(|s| (s, None)).collect();
    if let Some(status) = &cluster.status {
        for (name, r) in &status.replica_state_map {
            if r.is_backup_pod && r.state == ReplicaState::Ready && ready(name) {
                out.insert(r.shard.get(), Some(name.to_string()));
            }
        }
    }
    out
}

/// The replica of each shard as the cluster's map has it now.
pub fn in_map(cluster: &ClickHouseCluster, replica: &str) -> InMap {
    match cluster
        .status
        .as_ref()
        .and_then(|s| s.replica_state_map.get(replica))
    {
        Some(r) if r.state != ReplicaState::Condemned => InMap::Present,
        _ => InMap::Leaving,
    }
}

fn name(b: &ClickHouseBackup) -> String {
    b.metadata.name.clone().unwrap_or_default()
}

fn namespace(b: &ClickHouseBackup) -> String {
    b.metadata.namespace.clone().unwrap_or_default()
}

/// The next pass of `backup`.
pub fn decide(backup: &ClickHouseBackup, w: &World) -> Plan<ClickHouseBackupStatus> {
    let old = backup.status.clone().unwrap_or_default();
    let mut plan = Plan::new(old.clone());
    match (old.state, w.cluster.as_deref()) {
        (BackupState::Succeeded | BackupState::Failed, _) => {}
        (BackupState::New, None) => {
            plan.status.message = Some(format!(
                "ClickHouseCluster {} not found in namespace {}",
                backup.spec.cluster_name,
                namespace(backup)
            ));
            plan.requeue = Some(FOLLOW * 6);
        }
        (_, None) => fail(
            &mut plan,
            w.now,
            Failure::new(
                FailureReason::ClusterDeleted,
                format!(
                    "ClickHouseCluster {} was deleted during the backup",
                    backup.spec.cluster_name
                ),
            ),
        ),
        (BackupState::New, Some(cluster)) => start(&mut plan, backup, cluster, w),
        (_, Some(cluster)) => follow(&mut plan, backup, cluster, w),
    }
    plan
}

/// The backup fails: its status says why, an event too, and no step runs.
fn fail(plan: &mut Plan<ClickHouseBackupStatus>, now: Timestamp, failure: Failure) {
    plan.status.state = BackupState::Failed;
    plan.status.completion_time = Some(now.to_string());
    plan.status.message = Some(failure.message.clone());
    plan.status.reason = Some(failure.reason.as_str().into());
    plan.status.manifest = None;
    plan.failed("BackupFailed", "Backup", failure);
}

/// `New`: checks, then (once the bucket answers) the replicas recorded and `Starting`.
fn start(
    plan: &mut Plan<ClickHouseBackupStatus>,
    backup: &ClickHouseBackup,
    cluster: &ClickHouseCluster,
    w: &World,
) {
    let cluster_name = cluster.metadata.name.clone().unwrap_or_default();
    let ns = namespace(backup);
    if cluster.spec.shards == 0 {
        return fail(
            plan,
            w.now,
            Failure::new(
                FailureReason::KeeperOnly,
                format!(
                    "ClickHouseCluster {cluster_name} is Keeper-only (spec.shards is 0): it has no tables to back up"
                ),
            ),
        );
    }
    let d = match destination::choose(backup.spec.destination.as_ref(), cluster, &ns) {
        Ok(d) => d,
        Err(e) => {
            return fail(
                plan,
                w.now,
                Failure::new(FailureReason::Destination, e.to_string()),
            );
        }
    };
    if cluster.spec.pause {
        return fail(
            plan,
            w.now,
            Failure::new(
                FailureReason::ClusterPaused,
                format!("cluster {cluster_name} is paused: nothing runs to back up"),
            ),
        );
    }
    let replicas = backup_replicas(cluster, &|r| w.ready.contains(r));
    let missing: Vec<String> = replicas
        .iter()
        .filter(|(_, r)| r.is_none())
        .map(|(s, _)| s.to_string())
        .collect();
    if !missing.is_empty() {
        let message = format!(
            "waiting for a Ready backup replica in shard(s) {}",
            missing.join(", ")
        );
        if let Some(failure) = gave_up_waiting(&backup.metadata, w.now, &message) {
            return fail(plan, w.now, failure);
        }
        plan.status.message = Some(message);
        plan.requeue = Some(FOLLOW * 2);
        return;
    }
    let prefix = default_prefix(&ns, &cluster_name);
    let mut candidates: Vec<(String, String)> = w
        .others
        .iter()
        .filter(|b| b.cluster == cluster_name && b.name != name(backup) && b.succeeded)
        .filter(|b| {
            b.destination
                .as_ref()
                .or(cluster.spec.backup.destination.as_ref())
                .is_some_and(|o| same_place(o, &d, &prefix))
        })
        .map(|b| (b.completed.clone().unwrap_or_default(), b.name.clone()))
        .collect();
    candidates.sort();
    let s = &mut plan.status;
    s.state = BackupState::Starting;
    s.start_time = Some(w.now.to_string());
    s.destination = Some(S3Destination {
        prefix: Some(d.prefix.clone().unwrap_or_else(|| prefix.clone())),
        ..d.clone()
    });
    s.shards = replicas
        .iter()
        .map(|(shard, r)| ShardBackupStatus {
            shard: *shard,
            replica: r.clone().unwrap_or_default(),
            ..ShardBackupStatus::default()
        })
        .collect();
    let on: Vec<&str> = s.shards.iter().map(|s| s.replica.as_str()).collect();
    let message = format!(
        "backing up to {} on {}",
        s3_url(
            &d,
            d.prefix.as_deref().unwrap_or(&prefix),
            &manifest::backup_dir(&name(backup))
        ),
        on.join(", "),
    );
    s.message = Some(message.clone());
    plan.event(EventType::Normal, "BackupStarted", "Backup", message);
    plan.steps.push(Step::CheckBucket {
        destination: d,
        candidates: if backup.spec.incremental {
            candidates.into_iter().rev().map(|(_, n)| n).collect()
        } else {
            Vec::new()
        },
    });
    plan.requeue = Some(std::time::Duration::from_secs(1));
}

/// `Starting` / `Running`: one agent per shard; their outcomes; the manifest last.
fn follow(
    plan: &mut Plan<ClickHouseBackupStatus>,
    backup: &ClickHouseBackup,
    cluster: &ClickHouseCluster,
    w: &World,
) {
    let ns = namespace(backup);
    let cluster_name = cluster.metadata.name.clone().unwrap_or_default();
    let d = match destination::choose(backup.spec.destination.as_ref(), cluster, &ns) {
        Ok(d) => d,
        Err(e) => {
            return fail(
                plan,
                w.now,
                Failure::new(
                    FailureReason::Destination,
                    format!("the destination changed during the backup: {e}"),
                ),
            );
        }
    };
    let prefix = d
        .prefix
        .clone()
        .unwrap_or_else(|| default_prefix(&ns, &cluster_name));
    let mut running = false;
    for i in 0..plan.status.shards.len() {
        let recorded = plan.status.shards[i].clone();
        if recorded.done {
            continue;
        }
        let (n, replica) = (recorded.shard, recorded.replica.clone());
        let shard = w.shards.get(&n).cloned().unwrap_or(Shard {
            replica: InMap::Leaving,
            placement: None,
            agent: Agent::Missing,
        });
        match next(Mode::Backup, n, &replica, &shard) {
            Next::Create(placement) => {
                plan.steps.push(Step::CreateAgent(Box::new(AgentJob {
                    mode: Mode::Backup,
                    owner: super::owner("ClickHouseBackup", &backup.metadata),
                    namespace: ns.clone(),
                    cluster: cluster_name.clone(),
                    cluster_domain: cluster.spec.cluster_domain().to_string(),
                    backup: name(backup),
                    shard: n,
                    replica,
                    peers: Vec::new(),
                    placement: *placement,
                    image: w.image.clone(),
                    destination: d.clone(),
                    prefix: prefix.clone(),
                    base: plan.status.base.clone(),
                    tables: backup.spec.tables.clone(),
                    into_non_empty: false,
                    disks: cluster
                        .spec
                        .storage
                        .disks
                        .iter()
                        .map(|d| d.name.clone())
                        .collect(),
                    allow_external: false,
                    pod: cluster.spec.backup.agent.clone(),
                    tls: AgentJob::tls_of(cluster),
                })));
                running = true;
            }
            Next::Wait => running = true,
            Next::Done(r) => {
                let s = &mut plan.status.shards[i];
                s.parts_uploaded = r.parts_uploaded;
                s.bytes_uploaded = r.bytes_uploaded;
                s.parts_reused = r.parts_reused;
                s.bytes_reused = r.bytes_reused;
                s.done = true;
            }
            Next::Fail(f) => return fail(plan, w.now, f),
        }
    }
    if running {
        if plan.status.state == BackupState::Starting {
            plan.status.state = BackupState::Running;
        }
        plan.requeue = Some(FOLLOW);
        return;
    }
    // every shard is done: the manifest goes last
    let s = &mut plan.status;
    let m = Manifest {
        format: manifest::FORMAT,
        backup: name(backup),
        namespace: ns.clone(),
        cluster: cluster_name,
        shards: s.shards.iter().map(|s| s.shard).collect(),
        base: s.base.clone(),
        completed: w.now.to_string(),
    };
    let url = s3_url(&d, &prefix, &manifest::manifest_key(&name(backup)));
    s.state = BackupState::Succeeded;
    s.completion_time = Some(m.completed.clone());
    s.manifest = Some(url.clone());
    s.bytes_uploaded = s.shards.iter().map(|s| s.bytes_uploaded).sum();
    s.bytes_reused = s.shards.iter().map(|s| s.bytes_reused).sum();
    s.message = None;
    let message = format!(
        "{} bytes uploaded, {} reused; manifest {url}",
        s.bytes_uploaded, s.bytes_reused
    );
    plan.event(EventType::Normal, "BackupSucceeded", "Backup", message);
    plan.steps.push(Step::WriteManifest {
        destination: d,
        manifest: m,
    });
}

/// The status written after the steps ran: a refusal fails the backup; the base chosen is
/// recorded and named.
pub fn report(
    mut plan: Plan<ClickHouseBackupStatus>,
    outcome: &Outcome,
    now: Timestamp,
) -> Plan<ClickHouseBackupStatus> {
    if let Some(refused) = &outcome.refused {
        fail(&mut plan, now, refused.clone());
        return plan;
    }
    if let Some(base) = &outcome.base {
        plan.status.base = Some(base.clone());
        let note = format!(", incremental on {base}");
        if let Some(m) = plan.status.message.as_mut() {
            m.push_str(&note);
        }
        for e in plan
            .events
            .iter_mut()
            .filter(|e| e.reason == "BackupStarted")
        {
            e.message.push_str(&note);
        }
    }
    plan
}

/// The finalizer a ClickHouseBackup with `deletionPolicy: Delete` carries until its data is
/// removed from the bucket.
pub const DATA_FINALIZER: &str = "clickhouse.com/backup-data";

/// What deleting a backup observed.
#[derive(Clone, Debug, Default)]
pub struct Deleting {
    /// Agent pods of the backup still there.
    pub agents_left: usize,
    /// Backups in flight whose base is this one.
    pub dependents: Vec<String>,
}

/// What a deleted backup with [`DATA_FINALIZER`] asks for.
#[derive(Clone, Debug, PartialEq)]
pub enum Deletion {
    /// Not yet: why (its agents are stopping, a backup that builds on it runs).
    Wait(String),
    /// Remove its data at this destination, then the finalizer.
    RemoveData(Box<S3Destination>),
    /// Remove the finalizer, with a note when data may be left behind.
    Release(Option<String>),
}

/// Whether a backup should carry [`DATA_FINALIZER`] now (not while it is being deleted: then
/// [`deletion`] says when it goes).
pub fn wants_finalizer(backup: &ClickHouseBackup) -> bool {
    backup.spec.deletion_policy == crate::api::DeletionPolicy::Delete
}

/// What deleting `backup` does next. Its agents stop first (their Jobs are removed), so that
/// nothing writes under its folder any more; a backup in flight that builds on it is waited
/// for, since its parts are about to be referenced; then its data goes, except what other
/// backups reference. A backup that never started has nothing to remove; one whose policy was
/// switched back to `Retain` keeps its data.
pub fn deletion(backup: &ClickHouseBackup, w: &Deleting) -> Deletion {
    let status = backup.status.clone().unwrap_or_default();
    if !wants_finalizer(backup) {
        return Deletion::Release(None);
    }
    if w.agents_left > 0 {
        return Deletion::Wait(format!("{} agent pod(s) stopping", w.agents_left));
    }
    if !w.dependents.is_empty() {
        return Deletion::Wait(format!(
            "backup(s) {} build on this one and are still running",
            w.dependents.join(", ")
        ));
    }
    match (status.state, status.destination) {
        (BackupState::New, _) => Deletion::Release(None),
        (_, Some(d)) => Deletion::RemoveData(Box::new(d)),
        (_, None) => Deletion::Release(Some(
            "its destination was not recorded (it started under an older operator): its data, if any, stays in the bucket".into(),
        )),
    }
}
