//! The ClickHouseBackup controller. At this stage it checks the backup's cluster and reports;
//! running `BACKUP` on the cluster's backup replica comes with the backup engine.

use std::sync::Arc;

use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::{Resource, ResourceExt};
use serde_json::json;

use super::{Context, MANAGER, PassTimer};
use crate::api::{ClickHouseBackup, ClickHouseBackupStatus};
use crate::runtime::backoff::RECHECK;

pub const KIND: &str = "ClickHouseBackup";

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
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
    let mut status = old.clone();
    status.message = match ctx.cluster(&ns, &backup.spec.cluster_name) {
        None => Some(format!(
            "ClickHouseCluster {} not found in namespace {ns}",
            backup.spec.cluster_name
        )),
        Some(_) => Some("waiting: backups are not taken by this operator version yet".into()),
    };
    if status != old {
        let api: Api<ClickHouseBackup> = Api::namespaced(ctx.client.clone(), &ns);
        let body = json!({
            "apiVersion": ClickHouseBackup::api_version(&()),
            "kind": ClickHouseBackup::kind(&()),
            "status": ClickHouseBackupStatus { ..status },
        });
        api.patch_status(
            &backup.name_any(),
            &PatchParams::apply(MANAGER).force(),
            &Patch::Apply(&body),
        )
        .await?;
    }
    ctx.backup_backoff
        .succeeded(&format!("{ns}/{}", backup.name_any()));
    Ok(Action::requeue(RECHECK * 6))
}

pub fn error_policy(backup: Arc<ClickHouseBackup>, error: &Error, ctx: Arc<Context>) -> Action {
    let key = format!(
        "{}/{}",
        backup.namespace().unwrap_or_default(),
        backup.name_any()
    );
    super::retry_later(
        KIND,
        &key,
        "KubernetesApi",
        error,
        &ctx.backup_backoff,
        &ctx,
    )
}
