//! The ClickHouseRestore controller (decision 13): `New → Running → Succeeded | Failed`. A
//! restore starts once the backup's manifest is in the bucket (a complete backup), the cluster
//! has the backup's number of shards and a Ready backup replica in each; then one agent Job per
//! shard creates the schema on every replica of the shard and attaches the shard's parts on its
//! backup replica, from where replication copies them to the others.

use std::sync::Arc;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::{Resource, ResourceExt};
use serde_json::json;

use super::backup::{
    Error, JobState, default_prefix, job_state, open_bucket, ready_backup_replicas, record,
    remove_jobs,
};
use super::{Context, PassTimer};
use crate::api::{
    BackupState, ClickHouseBackup, ClickHouseCluster, ClickHouseRestore, ClickHouseRestoreStatus,
    ReplicaState, RestoreState, S3Destination, ShardRestoreStatus,
};
use crate::backup::checks;
use crate::backup::job::{AgentJob, Mode, Placement, job_name};
use crate::backup::manifest::{self, Manifest};
use crate::backup::store::Patience;
use crate::model::names;
use crate::plan::backup::destination;
use crate::runtime::backoff::RECHECK;

pub const KIND: &str = "ClickHouseRestore";

fn owner(r: &ClickHouseRestore) -> OwnerReference {
    OwnerReference {
        api_version: ClickHouseRestore::api_version(&()).into(),
        kind: ClickHouseRestore::kind(&()).into(),
        name: r.name_any(),
        uid: r.uid().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }
}

struct Pass<'a> {
    ctx: &'a Context,
    restore: &'a ClickHouseRestore,
    ns: String,
    status: ClickHouseRestoreStatus,
    events: Vec<(EventType, &'static str, String)>,
}

impl Pass<'_> {
    fn fail(&mut self, message: String) {
        self.status.state = RestoreState::Failed;
        self.status.completion_time = Some(Timestamp::now().to_string());
        self.events
            .push((EventType::Warning, "RestoreFailed", message.clone()));
        self.status.message = Some(message);
    }

    /// Where the backup is (its prefix written out: the folder of the cluster it was taken
    /// of), if the cluster restored into names that place (see
    /// [`destination::choose_for_restore`]); `Err` says why not.
    async fn source(
        &self,
        cluster: &ClickHouseCluster,
    ) -> Result<Result<S3Destination, String>, Error> {
        let backups: Api<ClickHouseBackup> = Api::namespaced(self.ctx.client.clone(), &self.ns);
        let found = match &self.restore.spec.destination {
            Some(d) => Some((d.clone(), cluster.name_any())),
            None => match backups.get_opt(&self.restore.spec.backup_name).await? {
                Some(b) => {
                    let of = self.ctx.cluster(&self.ns, &b.spec.cluster_name);
                    b.spec
                        .destination
                        .clone()
                        .or_else(|| of?.spec.backup.destination.clone())
                        .or_else(|| cluster.spec.backup.destination.clone())
                        .map(|d| (d, b.spec.cluster_name.clone()))
                }
                None => cluster
                    .spec
                    .backup
                    .destination
                    .clone()
                    .map(|d| (d, cluster.name_any())),
            },
        };
        let Some((mut d, source_cluster)) = found else {
            return Ok(Err(format!(
                "no destination: backup {} is not a ClickHouseBackup here; set spec.destination",
                self.restore.spec.backup_name
            )));
        };
        if d.prefix.is_none() {
            d.prefix = Some(default_prefix(&self.ns, &source_cluster));
        }
        Ok(destination::choose_for_restore(&d, cluster, &self.ns).map_err(|e| e.to_string()))
    }

    async fn start(&mut self, cluster: &ClickHouseCluster) -> Result<Option<Action>, Error> {
        let backup = self.restore.spec.backup_name.clone();
        let backups: Api<ClickHouseBackup> = Api::namespaced(self.ctx.client.clone(), &self.ns);
        if let Some(b) = backups.get_opt(&backup).await?
            && self.restore.spec.destination.is_none()
        {
            match b.status.as_ref().map(|s| s.state) {
                Some(BackupState::Succeeded) => {}
                Some(BackupState::Failed) => {
                    self.fail(format!(
                        "backup {backup} failed: there is nothing to restore"
                    ));
                    return Ok(None);
                }
                _ => {
                    self.status.message = Some(format!("waiting for backup {backup} to finish"));
                    return Ok(Some(Action::requeue(RECHECK * 2)));
                }
            }
        }
        let d = match self.source(cluster).await? {
            Ok(d) => d,
            Err(e) => {
                self.fail(e);
                return Ok(None);
            }
        };
        let bucket = match open_bucket(self.ctx, &self.ns, &d, cluster, Patience::Quick).await? {
            Ok(b) => b,
            Err(e) => {
                self.fail(e);
                return Ok(None);
            }
        };
        let key = manifest::manifest_key(&backup);
        let m: Manifest = match bucket.get(&key, checks::limits::MANIFEST_BYTES).await {
            Ok(Some(data)) => match serde_json::from_slice::<Manifest>(&data) {
                Ok(m) => match checks::check_manifest(&m, &backup) {
                    Ok(()) => m,
                    Err(r) => {
                        self.fail(format!(
                            "{} breaks a rule, nothing was restored: {r}",
                            bucket.url(&key)
                        ));
                        return Ok(None);
                    }
                },
                Err(e) => {
                    self.fail(format!(
                        "{} is not a backup manifest: {e}",
                        bucket.url(&key)
                    ));
                    return Ok(None);
                }
            },
            Ok(None) => {
                self.fail(format!(
                    "{} does not exist: backup {backup} is not complete, or not in this bucket",
                    bucket.url(&key)
                ));
                return Ok(None);
            }
            Err(e) => {
                self.fail(e.to_string());
                return Ok(None);
            }
        };
        if m.shards.len() as i32 != cluster.spec.shards {
            self.fail(format!(
                "backup {backup} has {} shard(s), cluster {} has {}: restore into a cluster with \
                 as many shards",
                m.shards.len(),
                cluster.name_any(),
                cluster.spec.shards
            ));
            return Ok(None);
        }
        let replicas = ready_backup_replicas(self.ctx, &self.ns, cluster).await?;
        if let Some((shard, _)) = replicas.iter().find(|(_, r)| r.is_none()) {
            self.status.message = Some(format!(
                "waiting for a Ready backup replica in shard {shard}"
            ));
            return Ok(Some(Action::requeue(RECHECK * 2)));
        }
        self.status.state = RestoreState::Running;
        self.status.start_time = Some(Timestamp::now().to_string());
        self.status.shards = replicas
            .into_iter()
            .map(|(shard, r)| ShardRestoreStatus {
                shard,
                replica: r.unwrap_or_default(),
                ..ShardRestoreStatus::default()
            })
            .collect();
        let message = format!(
            "restoring {} into {}",
            bucket.url(&manifest::backup_dir(&backup)),
            cluster.name_any()
        );
        self.events
            .push((EventType::Normal, "RestoreStarted", message.clone()));
        self.status.message = Some(message);
        Ok(Some(Action::requeue(std::time::Duration::from_secs(1))))
    }

    async fn follow(&mut self, cluster: &ClickHouseCluster) -> Result<Option<Action>, Error> {
        let d = match self.source(cluster).await? {
            Ok(d) => d,
            Err(e) => {
                self.fail(format!(
                    "the backup's destination changed during the restore: {e}"
                ));
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
        let name = self.restore.name_any();
        let mut running = false;
        for i in 0..self.status.shards.len() {
            let shard = self.status.shards[i].clone();
            if shard.done {
                continue;
            }
            if map
                .get(&shard.replica)
                .is_none_or(|r| r.state == ReplicaState::Condemned)
            {
                self.fail(format!(
                    "replica {} of shard {} was removed during the restore",
                    shard.replica, shard.shard
                ));
                return Ok(None);
            }
            let job = job_name(&name, Mode::Restore, shard.shard);
            match job_state(&jobs, &pods, &job, &shard.replica, Mode::Restore).await? {
                JobState::Missing => {
                    let Some(server) = pods.get_opt(&names::replica_pod(&shard.replica)).await?
                    else {
                        self.fail(format!("the pod of replica {} is gone", shard.replica));
                        return Ok(None);
                    };
                    let peers = map
                        .iter()
                        .filter(|(n, r)| {
                            r.shard == shard.shard
                                && **n != shard.replica
                                && r.state != ReplicaState::Condemned
                        })
                        .map(|(n, _)| n.clone())
                        .collect();
                    let agent = AgentJob {
                        mode: Mode::Restore,
                        owner: owner(self.restore),
                        namespace: self.ns.clone(),
                        cluster: cluster.name_any(),
                        cluster_domain: cluster.spec.cluster_domain().to_string(),
                        backup: self.restore.spec.backup_name.clone(),
                        shard: shard.shard,
                        replica: shard.replica.clone(),
                        peers,
                        placement: Placement::beside(&server),
                        image: self.ctx.operator_image.clone(),
                        destination: d.clone(),
                        prefix: d.prefix.clone().unwrap_or_default(),
                        base: None,
                        tables: Vec::new(),
                        into_non_empty: self.restore.spec.into_non_empty_tables,
                        allow_external: self.restore.spec.allow_external_sources,
                        tls: AgentJob::tls_of(cluster),
                    };
                    jobs.create(&PostParams::default(), &agent.build()).await?;
                    running = true;
                }
                JobState::Running => running = true,
                JobState::Done(r) => {
                    let s = &mut self.status.shards[i];
                    s.parts_attached = r.parts_attached;
                    s.bytes_downloaded = r.bytes_downloaded;
                    s.done = true;
                }
                JobState::Failed(why) => {
                    self.fail(format!("shard {} on {}: {why}", shard.shard, shard.replica));
                    return Ok(None);
                }
            }
        }
        if running {
            return Ok(Some(Action::requeue(RECHECK)));
        }
        self.status.state = RestoreState::Succeeded;
        self.status.completion_time = Some(Timestamp::now().to_string());
        self.status.bytes_downloaded = self.status.shards.iter().map(|s| s.bytes_downloaded).sum();
        self.status.message = None;
        self.events.push((
            EventType::Normal,
            "RestoreSucceeded",
            format!(
                "{} parts attached, {} bytes downloaded",
                self.status
                    .shards
                    .iter()
                    .map(|s| s.parts_attached)
                    .sum::<u64>(),
                self.status.bytes_downloaded
            ),
        ));
        Ok(None)
    }
}

pub async fn reconcile(
    restore: Arc<ClickHouseRestore>,
    ctx: Arc<Context>,
) -> Result<Action, Error> {
    let _permit = ctx
        .backup_permits
        .acquire()
        .await
        .expect("the semaphore is never closed");
    let _timer = PassTimer::start(KIND, &ctx.metrics);
    let ns = restore.namespace().unwrap_or_default();
    let old = restore.status.clone().unwrap_or_default();
    if matches!(old.state, RestoreState::Succeeded | RestoreState::Failed) {
        remove_jobs(&ctx, &ns, &restore.name_any(), restore.uid()).await?;
        return Ok(Action::await_change());
    }
    let mut pass = Pass {
        ctx: &ctx,
        restore: &restore,
        ns: ns.clone(),
        status: old.clone(),
        events: Vec::new(),
    };
    let next = match ctx.cluster(&ns, &restore.spec.cluster_name) {
        None if old.state == RestoreState::New => {
            pass.status.message = Some(format!(
                "ClickHouseCluster {} not found in namespace {ns}",
                restore.spec.cluster_name
            ));
            Some(Action::requeue(RECHECK * 6))
        }
        None => {
            pass.fail(format!(
                "ClickHouseCluster {} was deleted during the restore",
                restore.spec.cluster_name
            ));
            None
        }
        Some(cluster) if old.state == RestoreState::New => pass.start(&cluster).await?,
        Some(cluster) => pass.follow(&cluster).await?,
    };
    let (status, events) = (pass.status, pass.events);
    let over = matches!(status.state, RestoreState::Succeeded | RestoreState::Failed);
    let changed = (status != old).then(|| json!(status));
    record(&ctx, restore.as_ref(), changed, over, events, "Restore").await?;
    ctx.backup_backoff
        .succeeded(&format!("{ns}/restore/{}", restore.name_any()));
    Ok(next.unwrap_or_else(Action::await_change))
}

pub fn error_policy(restore: Arc<ClickHouseRestore>, error: &Error, ctx: Arc<Context>) -> Action {
    let key = format!(
        "{}/restore/{}",
        restore.namespace().unwrap_or_default(),
        restore.name_any()
    );
    let reason = match error {
        Error::Kube(_) => "KubernetesApi",
        Error::Bucket(_) => "Bucket",
    };
    super::retry_later(KIND, &key, reason, error, &ctx.backup_backoff, &ctx)
}
