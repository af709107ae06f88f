//! The ClickHouseBackup controller (decision 26): `New → Starting → Running → Succeeded |
//! Failed`. A backup starts once its destination answers and every shard has a Ready backup
//! replica; it records each shard's replica, then runs one agent Job per shard beside it
//! ([`crate::backup::job`]); when every shard's manifest is written it writes the backup's own
//! manifest last and succeeds. A shard whose backup replica is removed or whose agent fails
//! fails the backup, with the cause in the message.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Pod, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType, Recorder};
use kube::{Resource, ResourceExt};
use serde_json::json;
use tracing::{info, warn};

use super::{Context, MANAGER, PassTimer};
use crate::api::{
    BackupState, ClickHouseBackup, ClickHouseBackupStatus, ClickHouseCluster, ReplicaState,
    S3Destination, ShardBackupStatus,
};
use crate::backup::agent::Report;
use crate::backup::job::{AgentJob, Mode, Placement, job_name, server_changed};
use crate::backup::manifest::{self, Manifest};
use crate::backup::store::{Bucket, Patience};
use crate::model::names;
use crate::plan::backup::destination;
use crate::runtime::backoff::RECHECK;

pub const KIND: &str = "ClickHouseBackup";

/// How long a new backup waits for a Ready backup replica in every shard before it fails.
const WAIT_FOR_REPLICAS: std::time::Duration = std::time::Duration::from_secs(600);

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("{0}")]
    Bucket(#[from] crate::backup::store::Error),
}

pub use crate::plan::backup::destination::default_prefix;

/// The destination of a backup: its own, else its cluster's (whether the cluster allows it is
/// [`destination::choose`]'s to say).
pub fn destination_of(
    backup: &ClickHouseBackup,
    cluster: &ClickHouseCluster,
) -> Option<S3Destination> {
    backup
        .spec
        .destination
        .clone()
        .or_else(|| cluster.spec.backup.destination.clone())
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
                out.insert(r.shard, Some(name.clone()));
            }
        }
    }
    out
}

/// How long an agent's pod may fail to start (image, configuration, scheduling) before its
/// backup or restore fails.
pub const AGENT_START_GRACE: i64 = 120;

/// Why an agent's pod cannot start, once it has failed to for [`AGENT_START_GRACE`] seconds:
/// an image that cannot be pulled, a configuration the kubelet refuses (a missing Secret key),
/// or no node for it.
pub fn agent_stuck(pod: &Pod, now: Timestamp) -> Option<String> {
    let created = pod.metadata.creation_timestamp.as_ref()?.0;
    if now.duration_since(created).as_secs() < AGENT_START_GRACE {
        return None;
    }
    let status = pod.status.as_ref()?;
    let waiting = status.container_statuses.iter().flatten().find_map(|c| {
        let w = c.state.as_ref()?.waiting.as_ref()?;
        let reason = w.reason.clone().unwrap_or_default();
        matches!(
            reason.as_str(),
            "ErrImagePull"
                | "ImagePullBackOff"
                | "InvalidImageName"
                | "CreateContainerConfigError"
                | "CreateContainerError"
        )
        .then(|| format!("{reason}: {}", w.message.clone().unwrap_or_default()))
    });
    let unschedulable = || {
        status.conditions.iter().flatten().find_map(|c| {
            (c.type_ == "PodScheduled" && c.status == "False").then(|| {
                format!(
                    "{}: {}",
                    c.reason.clone().unwrap_or_default(),
                    c.message.clone().unwrap_or_default()
                )
            })
        })
    };
    waiting.or_else(unschedulable)
}

/// The reason the pod of an active agent Job cannot start, if it cannot (see [`agent_stuck`]).
pub(super) async fn stuck_agent(pods: &Api<Pod>, job: &str) -> Result<Option<String>, kube::Error> {
    let lp = ListParams::default().labels(&format!("batch.kubernetes.io/job-name={job}"));
    Ok(pods
        .list(&lp)
        .await?
        .items
        .iter()
        .find_map(|p| agent_stuck(p, Timestamp::now())))
}

/// Per shard of `cluster`, its backup replica if that replica's pod is Ready now.
pub(super) async fn ready_backup_replicas(
    ctx: &Context,
    ns: &str,
    cluster: &ClickHouseCluster,
) -> Result<BTreeMap<i32, Option<String>>, kube::Error> {
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), ns);
    let lp = ListParams::default().labels(&format!(
        "{}={}",
        crate::model::labels::CLUSTER,
        cluster.name_any()
    ));
    let listed = pods.list(&lp).await?.items;
    let ready = |replica: &str| {
        listed.iter().any(|p| {
            p.name_any() == names::replica_pod(replica) && crate::plan::facts::pod_ready(p)
        })
    };
    Ok(backup_replicas(cluster, &ready))
}

/// Where one shard's agent Job stands.
pub(super) enum JobState {
    /// Not created yet.
    Missing,
    Running,
    /// Done, with what the agent reported.
    Done(Report),
    /// Failed, or its pod cannot start: why.
    Failed(String),
}

/// The state of agent Job `job`: its outcome from its pod's termination message once it ended,
/// and an agent whose pod cannot start counted as failed (see [`agent_stuck`]).
pub(super) async fn job_state(
    jobs: &Api<Job>,
    pods: &Api<Pod>,
    job: &str,
    replica: &str,
    mode: Mode,
) -> Result<JobState, kube::Error> {
    let Some(found) = jobs.get_opt(job).await? else {
        return Ok(JobState::Missing);
    };
    let server = pods.get_opt(&names::replica_pod(replica)).await?;
    if let Some(why) = server_changed(&found, server.as_ref()) {
        return Ok(JobState::Failed(match mode {
            Mode::Backup => format!(
                "the backup replica failed during the backup: {why}; nothing of this backup \
                 counts, the next backup starts afresh"
            ),
            Mode::Restore => format!(
                "the replica failed during the restore: {why}; some parts may be attached \
                 already: drop the restored tables and restore again"
            ),
        }));
    }
    let st = found.status.unwrap_or_default();
    let succeeded = st.succeeded.unwrap_or(0) > 0;
    if succeeded || st.failed.unwrap_or(0) > 0 {
        return Ok(
            match agent_outcome(termination_message(pods, job).await?.as_deref()) {
                Ok(r) if succeeded => JobState::Done(r),
                Ok(_) => JobState::Failed(format!("the agent's Job {job} failed")),
                Err(e) => JobState::Failed(e),
            },
        );
    }
    Ok(match stuck_agent(pods, job).await? {
        Some(why) => JobState::Failed(format!(
            "the agent cannot start ({why}); check the operator's OPERATOR_IMAGE and the \
             destination's Secret"
        )),
        None => JobState::Running,
    })
}

/// Ends a pass of a backup or restore: its status written when it changed, its agent Jobs
/// removed once it is over (after the outcome is recorded), its events published.
pub(super) async fn record<K>(
    ctx: &Context,
    object: &K,
    status: Option<serde_json::Value>,
    over: bool,
    events: Vec<(EventType, &'static str, String)>,
    action: &str,
) -> Result<(), kube::Error>
where
    K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    let ns = object.namespace().unwrap_or_default();
    if let Some(status) = status {
        let api: Api<K> = Api::namespaced(ctx.client.clone(), &ns);
        let body = json!({
            "apiVersion": K::api_version(&()),
            "kind": K::kind(&()),
            "status": status,
        });
        api.patch_status(
            &object.name_any(),
            &PatchParams::apply(MANAGER).force(),
            &Patch::Apply(&body),
        )
        .await?;
    }
    if over {
        remove_jobs(ctx, &ns, &object.name_any(), object.uid()).await?;
    }
    let recorder = Recorder::new(ctx.client.clone(), ctx.reporter.clone());
    let reference = object.object_ref(&());
    for (type_, reason, note) in events {
        let event = Event {
            type_,
            reason: reason.into(),
            note: Some(note.chars().take(1000).collect()),
            action: action.into(),
            secondary: None,
        };
        if let Err(e) = recorder.publish(&event, &reference).await {
            warn!(error = %e, reason, "cannot publish event");
        }
    }
    Ok(())
}

/// The report an agent left in its pod's termination message (or the message itself).
pub fn agent_outcome(message: Option<&str>) -> Result<Report, String> {
    let Some(m) = message.map(str::trim).filter(|m| !m.is_empty()) else {
        return Err("the agent ended without a report".into());
    };
    match serde_json::from_str::<Report>(m) {
        Ok(r) if r.ok => Ok(r),
        Ok(r) => Err(r.error.unwrap_or_else(|| "the agent failed".into())),
        // not JSON: the tail of its log (FallbackToLogsOnError)
        Err(_) => Err(m.lines().last().unwrap_or(m).to_string()),
    }
}

fn owner(b: &ClickHouseBackup) -> OwnerReference {
    OwnerReference {
        api_version: ClickHouseBackup::api_version(&()).into(),
        kind: ClickHouseBackup::kind(&()).into(),
        name: b.name_any(),
        uid: b.uid().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }
}

struct Pass<'a> {
    ctx: &'a Context,
    backup: &'a ClickHouseBackup,
    ns: String,
    status: ClickHouseBackupStatus,
    events: Vec<(EventType, &'static str, String)>,
}

impl Pass<'_> {
    fn fail(&mut self, message: String) {
        self.status.state = BackupState::Failed;
        self.status.completion_time = Some(Timestamp::now().to_string());
        self.events
            .push((EventType::Warning, "BackupFailed", message.clone()));
        self.status.message = Some(message);
    }

    /// `New`: checks, then records the replicas and `Starting`.
    async fn start(&mut self, cluster: &ClickHouseCluster) -> Result<Option<Action>, Error> {
        if !cluster.spec.storage.disks.is_empty() {
            // the agent reads the snapshot of the data volume only: parts on the other disks
            // would be missing from the backup without anyone noticing
            self.fail(format!(
                "cluster {} has further disks (spec.storage.disks): backups read the data volume only and would miss the parts on them, so none is taken",
                cluster.name_any()
            ));
            return Ok(None);
        }
        let d = match destination::choose(self.backup.spec.destination.as_ref(), cluster, &self.ns)
        {
            Ok(d) => d,
            Err(e) => {
                self.fail(e.to_string());
                return Ok(None);
            }
        };
        if cluster.spec.pause {
            self.fail(format!(
                "cluster {} is paused: nothing runs to back up",
                cluster.name_any()
            ));
            return Ok(None);
        }
        let replicas = ready_backup_replicas(self.ctx, &self.ns, cluster).await?;
        let missing: Vec<String> = replicas
            .iter()
            .filter(|(_, r)| r.is_none())
            .map(|(s, _)| s.to_string())
            .collect();
        if !missing.is_empty() {
            let waited = self
                .backup
                .metadata
                .creation_timestamp
                .as_ref()
                .map(|t| Timestamp::now().duration_since(t.0).as_secs())
                .unwrap_or(0);
            let message = format!(
                "waiting for a Ready backup replica in shard(s) {}",
                missing.join(", ")
            );
            if waited as u64 > WAIT_FOR_REPLICAS.as_secs() {
                self.fail(format!("{message} for {waited} s: giving up"));
                return Ok(None);
            }
            self.status.message = Some(message);
            return Ok(Some(Action::requeue(RECHECK * 2)));
        }
        let bucket = match open_bucket(self.ctx, &self.ns, &d, cluster, Patience::Quick).await? {
            Ok(b) => b,
            Err(e) => {
                self.fail(e);
                return Ok(None);
            }
        };
        if let Err(e) = bucket.check().await {
            self.fail(e.to_string());
            return Ok(None);
        }
        let base = if self.backup.spec.incremental {
            self.latest_complete(cluster, &d, &bucket).await?
        } else {
            None
        };
        self.status.state = BackupState::Starting;
        self.status.start_time = Some(Timestamp::now().to_string());
        self.status.base = base.clone();
        self.status.shards = replicas
            .iter()
            .map(|(shard, r)| ShardBackupStatus {
                shard: *shard,
                replica: r.clone().unwrap_or_default(),
                ..ShardBackupStatus::default()
            })
            .collect();
        let on: Vec<&str> = self
            .status
            .shards
            .iter()
            .map(|s| s.replica.as_str())
            .collect();
        let message = format!(
            "backing up to {} on {}{}",
            bucket.url(&manifest::backup_dir(&self.backup.name_any())),
            on.join(", "),
            base.map(|b| format!(", incremental on {b}"))
                .unwrap_or_default()
        );
        self.events
            .push((EventType::Normal, "BackupStarted", message.clone()));
        self.status.message = Some(message);
        Ok(Some(Action::requeue(std::time::Duration::from_secs(1))))
    }

    /// The latest Succeeded backup of the same cluster in the same place whose manifest is in
    /// the bucket.
    async fn latest_complete(
        &self,
        cluster: &ClickHouseCluster,
        d: &S3Destination,
        bucket: &Bucket,
    ) -> Result<Option<String>, Error> {
        let api: Api<ClickHouseBackup> = Api::namespaced(self.ctx.client.clone(), &self.ns);
        let prefix = default_prefix(&self.ns, &cluster.name_any());
        let mut done: Vec<(String, String)> = api
            .list(&ListParams::default())
            .await?
            .items
            .into_iter()
            .filter(|b| {
                b.spec.cluster_name == cluster.name_any() && b.name_any() != self.backup.name_any()
            })
            .filter(|b| {
                b.status
                    .as_ref()
                    .is_some_and(|s| s.state == BackupState::Succeeded)
            })
            .filter(|b| destination_of(b, cluster).is_some_and(|o| same_place(&o, d, &prefix)))
            .map(|b| {
                let at = b
                    .status
                    .as_ref()
                    .and_then(|s| s.completion_time.clone())
                    .unwrap_or_default();
                (at, b.name_any())
            })
            .collect();
        done.sort();
        for (_, name) in done.into_iter().rev() {
            if bucket
                .get(
                    &manifest::manifest_key(&name),
                    crate::backup::checks::limits::MANIFEST_BYTES,
                )
                .await?
                .is_some()
            {
                return Ok(Some(name));
            }
        }
        Ok(None)
    }

    /// `Starting` / `Running`: one Job per shard; their outcomes; the manifest last.
    async fn follow(&mut self, cluster: &ClickHouseCluster) -> Result<Option<Action>, Error> {
        let d = match destination::choose(self.backup.spec.destination.as_ref(), cluster, &self.ns)
        {
            Ok(d) => d,
            Err(e) => {
                self.fail(format!("the destination changed during the backup: {e}"));
                return Ok(None);
            }
        };
        let map = cluster
            .status
            .as_ref()
            .map(|s| s.replica_state_map.clone())
            .unwrap_or_default();
        let jobs: Api<Job> = Api::namespaced(self.ctx.client.clone(), &self.ns);
        let pods: Api<Pod> = Api::namespaced(self.ctx.client.clone(), &self.ns);
        let name = self.backup.name_any();
        let mut running = false;
        for i in 0..self.status.shards.len() {
            let shard = self.status.shards[i].clone();
            if shard.done {
                continue;
            }
            match map.get(&shard.replica) {
                Some(r) if r.state != ReplicaState::Condemned => {}
                _ => {
                    self.fail(format!(
                        "backup replica {} of shard {} was removed during the backup; the next \
                         backup runs on the shard's new backup replica",
                        shard.replica, shard.shard
                    ));
                    return Ok(None);
                }
            }
            let job = job_name(&name, Mode::Backup, shard.shard);
            match job_state(&jobs, &pods, &job, &shard.replica, Mode::Backup).await? {
                JobState::Missing => {
                    let Some(server) = pods.get_opt(&names::replica_pod(&shard.replica)).await?
                    else {
                        self.fail(format!(
                            "the pod of backup replica {} of shard {} is gone",
                            shard.replica, shard.shard
                        ));
                        return Ok(None);
                    };
                    let agent = AgentJob {
                        mode: Mode::Backup,
                        owner: owner(self.backup),
                        namespace: self.ns.clone(),
                        cluster: cluster.name_any(),
                        cluster_domain: cluster.spec.cluster_domain().to_string(),
                        backup: name.clone(),
                        shard: shard.shard,
                        replica: shard.replica.clone(),
                        peers: Vec::new(),
                        placement: Placement::beside(&server),
                        image: self.ctx.operator_image.clone(),
                        destination: d.clone(),
                        prefix: d
                            .prefix
                            .clone()
                            .unwrap_or_else(|| default_prefix(&self.ns, &cluster.name_any())),
                        base: self.status.base.clone(),
                        tables: self.backup.spec.tables.clone(),
                        into_non_empty: false,
                        allow_external: false,
                        tls: AgentJob::tls_of(cluster),
                    };
                    jobs.create(&PostParams::default(), &agent.build()).await?;
                    info!(backup = %name, %job, "agent job created");
                    running = true;
                }
                JobState::Running => running = true,
                JobState::Done(r) => {
                    let s = &mut self.status.shards[i];
                    s.parts_uploaded = r.parts_uploaded;
                    s.bytes_uploaded = r.bytes_uploaded;
                    s.parts_reused = r.parts_reused;
                    s.bytes_reused = r.bytes_reused;
                    s.done = true;
                }
                JobState::Failed(why) => {
                    self.fail(format!("shard {} on {}: {why}", shard.shard, shard.replica));
                    return Ok(None);
                }
            }
        }
        if running {
            if self.status.state == BackupState::Starting {
                self.status.state = BackupState::Running;
            }
            return Ok(Some(Action::requeue(RECHECK)));
        }
        // every shard is done: the manifest goes last
        let bucket = match open_bucket(self.ctx, &self.ns, &d, cluster, Patience::Patient).await? {
            Ok(b) => b,
            Err(e) => {
                self.fail(e);
                return Ok(None);
            }
        };
        let m = Manifest {
            format: manifest::FORMAT,
            backup: name.clone(),
            namespace: self.ns.clone(),
            cluster: cluster.name_any(),
            shards: self.status.shards.iter().map(|s| s.shard).collect(),
            base: self.status.base.clone(),
            completed: Timestamp::now().to_string(),
        };
        let key = manifest::manifest_key(&name);
        bucket
            .put(&key, serde_json::to_vec_pretty(&m).unwrap_or_default())
            .await?;
        self.status.state = BackupState::Succeeded;
        self.status.completion_time = Some(m.completed.clone());
        self.status.manifest = Some(bucket.url(&key));
        self.status.bytes_uploaded = self.status.shards.iter().map(|s| s.bytes_uploaded).sum();
        self.status.bytes_reused = self.status.shards.iter().map(|s| s.bytes_reused).sum();
        self.status.message = None;
        self.events.push((
            EventType::Normal,
            "BackupSucceeded",
            format!(
                "{} bytes uploaded, {} reused; manifest {}",
                self.status.bytes_uploaded,
                self.status.bytes_reused,
                bucket.url(&key)
            ),
        ));
        Ok(None)
    }
}

/// A succeeded backup's completion time into its cluster's last-successful-backup metric.
fn record_success(ctx: &Context, backup: &ClickHouseBackup, status: &ClickHouseBackupStatus) {
    if status.state != BackupState::Succeeded {
        return;
    }
    if let Some(t) = status
        .completion_time
        .as_deref()
        .and_then(|t| t.parse::<Timestamp>().ok())
    {
        ctx.metrics.record_backup(
            &backup.namespace().unwrap_or_default(),
            &backup.spec.cluster_name,
            t.as_millisecond() as f64 / 1000.0,
        );
    }
}

pub async fn reconcile(backup: Arc<ClickHouseBackup>, ctx: Arc<Context>) -> Result<Action, Error> {
    let _permit = ctx
        .backup_permits
        .acquire()
        .await
        .expect("the semaphore is never closed");
    let _timer = PassTimer::start(KIND, &ctx.metrics);
    let ns = backup.namespace().unwrap_or_default();
    let old = backup.status.clone().unwrap_or_default();
    if matches!(old.state, BackupState::Succeeded | BackupState::Failed) {
        record_success(&ctx, &backup, &old);
        remove_jobs(&ctx, &ns, &backup.name_any(), backup.uid()).await?;
        return Ok(Action::await_change());
    }
    let mut pass = Pass {
        ctx: &ctx,
        backup: &backup,
        ns: ns.clone(),
        status: old.clone(),
        events: Vec::new(),
    };
    let next = match ctx.cluster(&ns, &backup.spec.cluster_name) {
        None if old.state == BackupState::New => {
            pass.status.message = Some(format!(
                "ClickHouseCluster {} not found in namespace {ns}",
                backup.spec.cluster_name
            ));
            Some(Action::requeue(RECHECK * 6))
        }
        None => {
            pass.fail(format!(
                "ClickHouseCluster {} was deleted during the backup",
                backup.spec.cluster_name
            ));
            None
        }
        Some(cluster) if old.state == BackupState::New => pass.start(&cluster).await?,
        Some(cluster) => pass.follow(&cluster).await?,
    };
    let (status, events) = (pass.status, pass.events);
    let over = matches!(status.state, BackupState::Succeeded | BackupState::Failed);
    let changed = (status != old).then(|| json!(status));
    record(&ctx, backup.as_ref(), changed, over, events, "Backup").await?;
    record_success(&ctx, &backup, &status);
    ctx.backup_backoff
        .succeeded(&format!("{ns}/{}", backup.name_any()));
    Ok(next.unwrap_or_else(Action::await_change))
}

/// The bucket of destination `d` with the credentials of its Secret (only a Secret that opts
/// in, see [`destination::credentials`]); `Err` says what is wrong with the Secret or the
/// destination.
pub(super) async fn open_bucket(
    ctx: &Context,
    ns: &str,
    d: &S3Destination,
    cluster: &ClickHouseCluster,
    patience: Patience,
) -> Result<Result<Bucket, String>, Error> {
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), ns);
    let secret = secrets.get_opt(&d.secret_name).await?;
    let (access, secret_key) = match destination::credentials(d, secret.as_ref(), cluster, ns) {
        Ok(keys) => keys,
        Err(e) => return Ok(Err(e.to_string())),
    };
    Ok(Bucket::open(
        d,
        &access,
        &secret_key,
        &default_prefix(ns, &cluster.name_any()),
        patience,
    )
    .map_err(|e| e.to_string()))
}

/// The termination message of a Job's pod.
pub(super) async fn termination_message(
    pods: &Api<Pod>,
    job: &str,
) -> Result<Option<String>, kube::Error> {
    let lp = ListParams::default().labels(&format!("batch.kubernetes.io/job-name={job}"));
    let found = pods.list(&lp).await?.items;
    Ok(found.iter().find_map(|p| {
        p.status
            .as_ref()?
            .container_statuses
            .as_ref()?
            .iter()
            .find_map(|c| c.state.as_ref()?.terminated.as_ref()?.message.clone())
    }))
}

/// Deletes the agent Jobs of a finished backup or restore (those it owns), with their pods.
pub(super) async fn remove_jobs(
    ctx: &Context,
    ns: &str,
    owner: &str,
    owner_uid: Option<String>,
) -> Result<(), kube::Error> {
    let jobs: Api<Job> = Api::namespaced(ctx.client.clone(), ns);
    let lp = ListParams::default().labels(&format!("{}={owner}", crate::backup::job::BACKUP_LABEL));
    let owned = |j: &Job| {
        j.metadata
            .owner_references
            .iter()
            .flatten()
            .any(|o| Some(&o.uid) == owner_uid.as_ref())
    };
    for j in jobs.list(&lp).await?.items.into_iter().filter(owned) {
        match jobs
            .delete(&j.name_any(), &kube::api::DeleteParams::background())
            .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

pub fn error_policy(backup: Arc<ClickHouseBackup>, error: &Error, ctx: Arc<Context>) -> Action {
    let key = format!(
        "{}/{}",
        backup.namespace().unwrap_or_default(),
        backup.name_any()
    );
    let reason = match error {
        Error::Kube(_) => "KubernetesApi",
        Error::Bucket(_) => "Bucket",
    };
    super::retry_later(KIND, &key, reason, error, &ctx.backup_backoff, &ctx)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{ClickHouseClusterSpec, ClickHouseClusterStatus, ReplicaStatus};

    fn cluster() -> ClickHouseCluster {
        let spec: ClickHouseClusterSpec =
            serde_json::from_value(json!({"shards": 2, "replicas": 2})).unwrap();
        let mut c = ClickHouseCluster::new("c1", spec);
        let r = |shard, backup, state| ReplicaStatus {
            shard,
            state,
            is_backup_pod: backup,
            index: 0,
            scale_in_step: None,
        };
        c.status = Some(ClickHouseClusterStatus {
            replica_state_map: BTreeMap::from([
                ("c1-0-0".into(), r(0, true, ReplicaState::Ready)),
                ("c1-0-1".into(), r(0, false, ReplicaState::Ready)),
                ("c1-1-0".into(), r(1, true, ReplicaState::Ready)),
                ("c1-1-1".into(), r(1, false, ReplicaState::Ready)),
            ]),
            ..ClickHouseClusterStatus::default()
        });
        c
    }

    /// Seed 000: each shard's backup runs on its backup replica, and only once that replica's
    /// pod is Ready; another replica is never used instead.
    #[test]
    fn each_shard_is_backed_up_on_its_backup_replica_only() {
        let c = cluster();
        let all = backup_replicas(&c, &|_| true);
        assert_eq!(all[&0].as_deref(), Some("c1-0-0"));
        assert_eq!(all[&1].as_deref(), Some("c1-1-0"));
        let one_down = backup_replicas(&c, &|r| r != "c1-1-0");
        assert_eq!(one_down[&1], None, "not the other replica of the shard");
    }

    /// An agent pod that cannot pull its image fails its backup once the grace is over, not
    /// before; a pod that runs is never called stuck.
    #[test]
    fn an_agent_that_cannot_start_is_reported_after_the_grace() {
        let created = Timestamp::now();
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": "b-backup-0-x", "creationTimestamp": created.to_string()},
            "status": {"containerStatuses": [{"name": "agent", "image": "x", "imageID": "",
                "ready": false, "restartCount": 0,
                "state": {"waiting": {"reason": "ErrImagePull", "message": "no such image"}}}]}
        }))
        .unwrap();
        assert_eq!(agent_stuck(&pod, created), None, "within the grace");
        let later = created + k8s_openapi::jiff::SignedDuration::from_secs(AGENT_START_GRACE);
        assert_eq!(
            agent_stuck(&pod, later).as_deref(),
            Some("ErrImagePull: no such image")
        );
        let mut running = pod.clone();
        running
            .status
            .as_mut()
            .unwrap()
            .container_statuses
            .as_mut()
            .unwrap()[0]
            .state = Some(Default::default());
        assert_eq!(agent_stuck(&running, later), None);
    }

    #[test]
    fn an_agent_report_says_what_failed() {
        let ok = serde_json::to_string(&Report {
            ok: true,
            bytes_uploaded: 5,
            ..Report::default()
        })
        .unwrap();
        assert_eq!(agent_outcome(Some(&ok)).unwrap().bytes_uploaded, 5);
        let bad = serde_json::to_string(&Report {
            ok: false,
            error: Some("freezing db.t: Code: 60".into()),
            ..Report::default()
        })
        .unwrap();
        assert_eq!(
            agent_outcome(Some(&bad)).unwrap_err(),
            "freezing db.t: Code: 60"
        );
        assert!(agent_outcome(None).is_err());
        assert_eq!(
            agent_outcome(Some("line one\nthread main panicked")).unwrap_err(),
            "thread main panicked"
        );
    }

    #[test]
    fn backups_build_on_each_other_only_in_the_same_place() {
        let d = |endpoint: &str, prefix: Option<&str>| S3Destination {
            endpoint: endpoint.into(),
            bucket: "b".into(),
            prefix: prefix.map(str::to_string),
            secret_name: "s".into(),
            ..S3Destination::default()
        };
        assert!(same_place(
            &d("http://s3/", None),
            &d("http://s3", Some("ns/c1")),
            "ns/c1"
        ));
        assert!(!same_place(
            &d("http://s3", None),
            &d("http://s3", Some("x")),
            "ns/c1"
        ));
        assert!(!same_place(
            &d("http://a", None),
            &d("http://b", None),
            "ns/c1"
        ));
    }
}
