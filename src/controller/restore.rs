//! The ClickHouseRestore controller: what a restore's pass reads beyond what every agent-driven
//! pass reads ([`super::jobs`]: the ClickHouseBackup it names and that backup's cluster), and
//! its plan (`plan::backup::restore`).

use kube::ResourceExt;
use kube::api::Api;
use tokio::sync::Semaphore;

use super::jobs::{Common, Error, JobResource};
use super::{Context, api};
use crate::api::{
    ClickHouseBackup, ClickHouseCluster, ClickHouseRestore, ClickHouseRestoreStatus, RestoreState,
};
use crate::model::job::Mode;
use crate::plan::backup::restore::{self as plan, NamedBackup, World};
use crate::plan::backup::{Outcome, Plan};
use crate::runtime::backoff::Backoff;

pub const KIND: &str = "ClickHouseRestore";

impl JobResource for ClickHouseRestore {
    type Status = ClickHouseRestoreStatus;
    type World = World;
    const KIND: &'static str = KIND;
    const ACTION: &'static str = "Restore";
    const MODE: Mode = Mode::Restore;

    fn cluster_name(&self) -> &str {
        &self.spec.cluster_name
    }

    fn status(&self) -> ClickHouseRestoreStatus {
        self.status.clone().unwrap_or_default()
    }

    fn is_over(s: &ClickHouseRestoreStatus) -> bool {
        matches!(s.state, RestoreState::Succeeded | RestoreState::Failed)
    }

    fn recorded(s: &ClickHouseRestoreStatus) -> Vec<(i32, String)> {
        s.shards
            .iter()
            .filter(|s| !s.done)
            .map(|s| (s.shard, s.replica.clone()))
            .collect()
    }

    fn permits(ctx: &Context) -> &Semaphore {
        &ctx.restore_permits
    }

    fn backoff(ctx: &Context) -> &Backoff {
        &ctx.restore_backoff
    }

    async fn world(&self, ctx: &Context, common: Common) -> Result<World, Error> {
        let ns = self.namespace().unwrap_or_default();
        let backups: Api<ClickHouseBackup> = api(ctx, &ns);
        let named = backups.get_opt(&self.spec.backup_name).await?;
        let backup_cluster = match &named {
            Some(b) => ctx.cluster_or_api(&ns, &b.spec.cluster_name).await?,
            None => None,
        };
        let backup_cluster_destination =
            backup_cluster.and_then(|c| c.spec.backup.destination.clone());
        Ok(World {
            now: common.now,
            cluster: common.cluster,
            backup: named.map(|b| NamedBackup {
                state: b.status.as_ref().map(|s| s.state).unwrap_or_default(),
                cluster: b.spec.cluster_name.clone(),
                destination: b.spec.destination.clone(),
            }),
            backup_cluster_destination,
            ready: common.ready,
            shards: common.shards,
            image: ctx.operator_image.clone(),
        })
    }

    fn decide(&self, world: &World) -> Plan<ClickHouseRestoreStatus> {
        plan::decide(self, world)
    }

    fn report(
        &self,
        plan: Plan<ClickHouseRestoreStatus>,
        outcome: &Outcome,
        world: &World,
    ) -> Plan<ClickHouseRestoreStatus> {
        let shards = world.cluster.as_ref().map_or(0, |c| c.spec.shards);
        plan::report(plan, outcome, shards, world.now)
    }

    fn cluster_of(world: &World) -> Option<&ClickHouseCluster> {
        world.cluster.as_deref()
    }
}
