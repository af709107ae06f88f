//! The ClickHouseBackup controller: what a backup's pass reads beyond what every agent-driven
//! pass reads ([`super::jobs`]), and its plan (`plan::backup::backup`).

use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use tokio::sync::Semaphore;

use super::Context;
use super::jobs::{Common, Error, JobResource};
use crate::api::{BackupState, ClickHouseBackup, ClickHouseBackupStatus, ClickHouseCluster};
use crate::model::job::Mode;
use crate::plan::backup::take::{self as plan, Earlier, World};
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
