//! Backup schedules (S2-40): every few seconds the elected operator looks at each cluster's
//! `spec.backup.schedules`. A schedule whose slot is due gets an ordinary ClickHouseBackup owned
//! by the cluster (none while the cluster is paused, none while one of the schedule is still
//! running); retention removes the schedule's oldest successful backups beyond `keep`, with
//! their data in the bucket (only the objects no remaining backup references).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::{Resource, ResourceExt};
use tracing::{info, warn};

use super::jobs::{Error, remove_backup_data};
use super::kube::ignore_not_found;
use super::{Context, api};
use crate::api::{BackupState, ClickHouseBackup, ClickHouseBackupSpec, ClickHouseCluster};
use crate::plan::backup::destination;
use crate::plan::backup::schedule::{
    DUE_ANNOTATION, Kept, SCHEDULE_LABEL, backup_name, due, expired,
};
use crate::util::cron::Cron;

/// How often schedules are looked at.
pub const TICK: Duration = Duration::from_secs(5);

/// Looks at every cluster's schedules (backups, and automatic upgrades: see
/// [`super::upgrade`]) every [`TICK`], for as long as the operator acts.
pub async fn run(ctx: Arc<Context>) {
    loop {
        let clusters: Vec<Arc<ClickHouseCluster>> =
            ctx.clusters.iter().flat_map(|s| s.state()).collect();
        for c in clusters {
            if let Err(e) = tick(&ctx, &c).await {
                warn!(cluster = %c.name_any(), error = %e, "backup schedules: will try again");
            }
            if let Err(e) = super::upgrade::tick(&ctx, &c).await {
                warn!(cluster = %c.name_any(), error = %e, "upgrade check: will try again");
            }
        }
        tokio::time::sleep(TICK).await;
    }
}

fn slot_of(b: &ClickHouseBackup) -> Option<DateTime<Utc>> {
    b.annotations()
        .get(DUE_ANNOTATION)
        .and_then(|s| DateTime::parse_from_rfc3339(s).ok())
        .map(|t| t.with_timezone(&Utc))
}

async fn tick(ctx: &Context, cluster: &ClickHouseCluster) -> Result<(), Error> {
    let schedules = &cluster.spec.backup.schedules;
    if schedules.is_empty() || cluster.metadata.deletion_timestamp.is_some() {
        return Ok(());
    }
    let ns = cluster.namespace().unwrap_or_default();
    let api: Api<ClickHouseBackup> = api(ctx, &ns);
    let all = api
        .list(&ListParams::default().labels(SCHEDULE_LABEL))
        .await?
        .items;
    let mut by_schedule: BTreeMap<String, Vec<ClickHouseBackup>> = BTreeMap::new();
    for b in all
        .into_iter()
        .filter(|b| b.spec.cluster_name == cluster.name_any())
    {
        let s = b.labels().get(SCHEDULE_LABEL).cloned().unwrap_or_default();
        by_schedule.entry(s).or_default().push(b);
    }
    for s in schedules {
        let Ok(cron) = Cron::parse(&s.schedule) else {
            continue; // reported by the cluster's validation
        };
        let mine = by_schedule.remove(&s.name).unwrap_or_default();
        let kept: Vec<Kept> = mine
            .iter()
            .filter_map(|b| {
                let state = b.status.as_ref().map(|s| s.state).unwrap_or_default();
                Some(Kept {
                    name: b.name_any(),
                    slot: slot_of(b)?,
                    succeeded: state == BackupState::Succeeded,
                    finished: matches!(state, BackupState::Succeeded | BackupState::Failed),
                })
            })
            .collect();
        for name in expired(&kept, s.keep.max(1) as usize) {
            let Some(b) = mine.iter().find(|b| b.name_any() == name) else {
                continue;
            };
            remove_backup(ctx, cluster, b).await?;
        }
        if cluster.spec.pause {
            continue;
        }
        let busy = mine.iter().any(|b| {
            !matches!(
                b.status.as_ref().map(|s| s.state).unwrap_or_default(),
                BackupState::Succeeded | BackupState::Failed
            )
        });
        if busy {
            continue;
        }
        let last = kept.iter().map(|k| k.slot).max();
        let Some(slot) = due(&cron, last, Utc::now()) else {
            continue;
        };
        let name = backup_name(&cluster.name_any(), &s.name, slot);
        let mut backup = ClickHouseBackup::new(
            &name,
            ClickHouseBackupSpec {
                cluster_name: cluster.name_any(),
                destination: None,
                tables: Vec::new(),
                incremental: s.incremental,
                // retention removes the data of the backups it removes; deleting the cluster
                // (which owns them) keeps it
                deletion_policy: Default::default(),
            },
        );
        backup.metadata.namespace = Some(ns.clone());
        backup.metadata.labels = Some(BTreeMap::from([(
            SCHEDULE_LABEL.to_string(),
            s.name.clone(),
        )]));
        backup.metadata.annotations = Some(BTreeMap::from([(
            DUE_ANNOTATION.to_string(),
            slot.to_rfc3339(),
        )]));
        backup.metadata.owner_references = Some(vec![OwnerReference {
            api_version: ClickHouseCluster::api_version(&()).into(),
            kind: ClickHouseCluster::kind(&()).into(),
            name: cluster.name_any(),
            uid: cluster.uid().unwrap_or_default(),
            controller: Some(false),
            block_owner_deletion: Some(false),
        }]);
        match api.create(&PostParams::default(), &backup).await {
            Ok(_) => {
                info!(cluster = %cluster.name_any(), backup = %name, "scheduled backup created")
            }
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// Removes a backup past its schedule's retention: the objects in the bucket that no other
/// backup in the same place references (its manifest first, so that it stops being complete),
/// then the resource.
async fn remove_backup(
    ctx: &Context,
    cluster: &ClickHouseCluster,
    backup: &ClickHouseBackup,
) -> Result<(), Error> {
    let ns = cluster.namespace().unwrap_or_default();
    let name = backup.name_any();
    if let Ok(d) = destination::choose(backup.spec.destination.as_ref(), cluster, &ns) {
        match remove_backup_data(ctx, &ns, &d, (&cluster.name_any(), Some(cluster)), &name).await? {
            Ok(_) => {}
            Err(f) => {
                warn!(backup = %name, reason = f.reason.as_str(), error = %f.message, "cannot remove the backup's data yet");
                return Ok(());
            }
        }
    }
    let api: Api<ClickHouseBackup> = api(ctx, &ns);
    Ok(ignore_not_found(
        api.delete(&name, &DeleteParams::background()).await,
    )?)
}
