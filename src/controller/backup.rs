//! The ClickHouseBackup controller: what a backup's pass reads beyond what every agent-driven
//! pass reads ([`super::jobs`]), and its plan (`plan::backup::backup`).

use crate::plan::EventType;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::ListParams;
use kube::runtime::controller::Action;
use tokio::sync::Semaphore;

use super::jobs::{Common, Error, JobResource, remove_agents, remove_backup_data, set_finalizer};
use super::{Context, api};
use crate::api::{BackupState, ClickHouseBackup, ClickHouseBackupStatus, ClickHouseCluster};
use crate::model::job::Mode;
use crate::plan::backup::take::{self as plan, DATA_FINALIZER, Deleting, Deletion, Earlier, World};
use crate::plan::backup::{Outcome, Plan};
use crate::runtime::backoff::Backoff;

pub const KIND: &str = "ClickHouseBackup";

impl JobResource for ClickHouseBackup {
    type Status = ClickHouseBackupStatus;
    type World = World;
    const KIND: &'static str = KIND;
    const ACTION: &'static str = "Backup";
    const MODE: Mode = Mode::Backup;

    fn cluster_name(&self) -> &str {
        &self.spec.cluster_name
    }

    fn status(&self) -> ClickHouseBackupStatus {
        self.status.clone().unwrap_or_default()
    }

    fn is_over(s: &ClickHouseBackupStatus) -> bool {
        matches!(s.state, BackupState::Succeeded | BackupState::Failed)
    }

    fn recorded(s: &ClickHouseBackupStatus) -> Vec<(i32, String)> {
        s.shards
            .iter()
            .filter(|s| !s.done)
            .map(|s| (s.shard, s.replica.clone()))
            .collect()
    }

    fn permits(ctx: &Context) -> &Semaphore {
        &ctx.backup_permits
    }

    fn backoff(ctx: &Context) -> &Backoff {
        &ctx.backup_backoff
    }

    async fn world(&self, ctx: &Context, common: Common) -> Result<World, Error> {
        let ns = self.namespace().unwrap_or_default();
        // earlier backups of the cluster, from the cache the cluster controller keeps
        let others = super::cache::group(&ctx.caches.backups, &ns, &self.spec.cluster_name)
            .into_iter()
            .map(|b| Earlier {
                name: b.name_any(),
                cluster: b.spec.cluster_name.clone(),
                destination: b.spec.destination.clone(),
                succeeded: b
                    .status
                    .as_ref()
                    .is_some_and(|s| s.state == BackupState::Succeeded),
                completed: b.status.as_ref().and_then(|s| s.completion_time.clone()),
            })
            .collect();
        Ok(World {
            now: common.now,
            cluster: common.cluster,
            ready: common.ready,
            shards: common.shards,
            others,
            image: ctx.operator_image.clone(),
        })
    }

    fn decide(&self, world: &World) -> Plan<ClickHouseBackupStatus> {
        plan::decide(self, world)
    }

    fn report(
        &self,
        plan: Plan<ClickHouseBackupStatus>,
        outcome: &Outcome,
        world: &World,
    ) -> Plan<ClickHouseBackupStatus> {
        plan::report(plan, outcome, world.now)
    }

    fn cluster_of(world: &World) -> Option<&ClickHouseCluster> {
        world.cluster.as_deref()
    }

    /// `deletionPolicy: Delete`: the finalizer kept while it applies, and a deleted backup's
    /// data removed before it goes (see [`plan::deletion`]).
    async fn prepare(&self, ctx: &Context) -> Result<Option<Action>, Error> {
        let has = self.finalizers().iter().any(|f| f == DATA_FINALIZER);
        if self.metadata.deletion_timestamp.is_some() {
            if !has {
                return Ok(Some(Action::await_change()));
            }
            return delete(self, ctx).await.map(Some);
        }
        let wants = plan::wants_finalizer(self);
        if wants != has {
            set_finalizer(ctx, self, DATA_FINALIZER, wants).await?;
        }
        Ok(None)
    }

    /// A succeeded backup's completion time into its cluster's last-successful-backup metric.
    fn ended(&self, ctx: &Context, status: &ClickHouseBackupStatus) {
        if status.state != BackupState::Succeeded {
            return;
        }
        if let Some(t) = status
            .completion_time
            .as_deref()
            .and_then(|t| t.parse::<Timestamp>().ok())
        {
            ctx.metrics.record_backup(
                &self.namespace().unwrap_or_default(),
                &self.spec.cluster_name,
                t.as_millisecond() as f64 / 1000.0,
            );
        }
    }
}

/// One pass of a deleted backup that carries [`DATA_FINALIZER`].
async fn delete(backup: &ClickHouseBackup, ctx: &Context) -> Result<Action, Error> {
    let ns = backup.namespace().unwrap_or_default();
    let name = backup.name_any();
    remove_agents(ctx, &ns, backup).await?;
    let lp = ListParams::default().labels(&format!("{}={name}", crate::model::job::BACKUP_LABEL));
    let agents_left = api::<Pod>(ctx, &ns)
        .list(&lp)
        .await?
        .items
        .iter()
        .filter(|p| p.owner_references().iter().any(|o| o.kind == "Job"))
        .count();
    let dependents = super::cache::group(&ctx.caches.backups, &ns, &backup.spec.cluster_name)
        .into_iter()
        .filter(|b| {
            b.status
                .as_ref()
                .is_some_and(|s| s.state.in_flight() && s.base.as_deref() == Some(name.as_str()))
        })
        .map(|b| b.name_any())
        .collect();
    let deleting = Deleting {
        agents_left,
        dependents,
    };
    let key = format!("{KIND}/{ns}/{name}");
    match plan::deletion(backup, &deleting) {
        Deletion::Wait(why) => {
            tracing::info!(namespace = %ns, backup = %name, why = %why, "deleted backup: its data waits");
            Ok(Action::requeue(crate::plan::backup::FOLLOW))
        }
        Deletion::Release(note) => {
            if let Some(note) = note {
                super::publish_events(
                    ctx,
                    backup,
                    [(EventType::Warning, "BackupDataKept", note)],
                    "Delete",
                )
                .await;
            }
            set_finalizer(ctx, backup, DATA_FINALIZER, false).await?;
            Ok(Action::await_change())
        }
        Deletion::RemoveData(d) => {
            let cluster = ctx.cluster_or_api(&ns, &backup.spec.cluster_name).await?;
            match remove_backup_data(
                ctx,
                &ns,
                &d,
                (&backup.spec.cluster_name, cluster.as_deref()),
                &name,
            )
            .await?
            {
                Ok((removed, kept)) => {
                    let note = format!(
                        "{removed} objects removed from {}; {kept} kept, referenced by other backups",
                        d.bucket
                    );
                    super::publish_events(
                        ctx,
                        backup,
                        [(EventType::Normal, "BackupDataRemoved", note)],
                        "Delete",
                    )
                    .await;
                    set_finalizer(ctx, backup, DATA_FINALIZER, false).await?;
                    ctx.backup_backoff.succeeded(&key);
                    Ok(Action::await_change())
                }
                Err(f) => {
                    let note = format!(
                        "the backup's data cannot be removed yet, it stays until it can ({}); set deletionPolicy: Retain to keep it and let the deletion finish",
                        f.message
                    );
                    super::publish_events(
                        ctx,
                        backup,
                        [(EventType::Warning, "BackupDataNotRemoved", note)],
                        "Delete",
                    )
                    .await;
                    Ok(Action::requeue(ctx.backup_backoff.failed(&key)))
                }
            }
        }
    }
}
