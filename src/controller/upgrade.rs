//! Automatic version upgrades (seed 002, S2-24): on the schedule of `spec.upgradeOptions`, the
//! elected operator reads the cluster's version source and acts on the verdict of
//! [`crate::plan::upgrade::decide`]: a newer allowed version is written into the resource's
//! `spec.image` (never into a StatefulSet; Smart Update rolls it out), with an event naming both
//! versions. A source that cannot be read is an event and a `VersionSource` condition, never an
//! error state of the cluster. Each slot is checked once: `status.upgrade.lastCheck`.

use std::time::Duration;

use chrono::{DateTime, Utc};
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::EventType;
use serde_json::json;
use tracing::{info, warn};

use super::Context;
use crate::api::{ClickHouseCluster, ClusterState, UpgradeStatus, VersionSource};
use crate::plan::backup::schedule::due;
use crate::plan::status::set_condition;
use crate::plan::upgrade::{Apply, Verdict, decide, parse_document};
use crate::util::cron::Cron;

/// The field manager of what a check writes.
const MANAGER: &str = "clickhouse-operator-upgrades";
/// The condition a check sets.
pub const CONDITION: &str = "VersionSource";
/// How long reading a source may take.
const READ_TIMEOUT: Duration = Duration::from_secs(10);
/// The default key of a ConfigMap source.
pub const DEFAULT_KEY: &str = "versions.json";

/// Reads the version document of `source` (in namespace `ns`).
async fn read_source(ctx: &Context, ns: &str, source: &VersionSource) -> Result<String, String> {
    if let Some(cm) = &source.config_map {
        let key = cm.key.as_deref().unwrap_or(DEFAULT_KEY);
        let found = Api::<ConfigMap>::namespaced(ctx.client.clone(), ns)
            .get_opt(&cm.name)
            .await
            .map_err(|e| format!("reading ConfigMap {}: {e}", cm.name))?
            .ok_or_else(|| format!("ConfigMap {} does not exist in namespace {ns}", cm.name))?;
        return found
            .data
            .and_then(|d| d.get(key).cloned())
            .ok_or_else(|| format!("ConfigMap {} has no key {key}", cm.name));
    }
    let url = source.url.as_deref().ok_or("no url and no configMap")?;
    let http = reqwest::Client::builder()
        .timeout(READ_TIMEOUT)
        .build()
        .map_err(|e| e.to_string())?;
    let answer = http
        .get(url)
        .send()
        .await
        .map_err(|e| format!("{url}: {e}"))?;
    if !answer.status().is_success() {
        return Err(format!("{url} answered {}", answer.status()));
    }
    answer.text().await.map_err(|e| format!("{url}: {e}"))
}

/// One look at `cluster`: nothing unless a slot of its schedule is due and not checked yet.
pub async fn tick(ctx: &Context, cluster: &ClickHouseCluster) -> Result<(), kube::Error> {
    let u = &cluster.spec.upgrade_options;
    let Ok(apply) = Apply::parse(&u.apply) else {
        return Ok(()); // the cluster's pass reports the invalid field
    };
    if apply == Apply::Disabled || cluster.metadata.deletion_timestamp.is_some() {
        return Ok(());
    }
    let Ok(cron) = Cron::parse(&u.schedule) else {
        return Ok(());
    };
    let status = cluster.status.clone().unwrap_or_default();
    let last = status
        .upgrade
        .as_ref()
        .and_then(|s| s.last_check.as_deref())
        .and_then(|t| DateTime::parse_from_rfc3339(t).ok())
        .map(|t| t.with_timezone(&Utc));
    let Some(slot) = due(&cron, last, Utc::now()) else {
        return Ok(());
    };
    let ns = cluster.namespace().unwrap_or_default();
    let name = cluster.name_any();
    let ready = status.state == ClusterState::Ready
        && status.observed_generation == cluster.metadata.generation;
    // the source is read only when its answer can matter
    let document = if ready && !cluster.spec.pause {
        match &u.version_source {
            Some(s) => read_source(ctx, &ns, s)
                .await
                .and_then(|text| parse_document(&text)),
            None => Err("no version source".into()),
        }
    } else {
        Err(String::new())
    };
    let verdict = decide(
        &apply,
        &cluster.spec.image,
        ready,
        cluster.spec.pause,
        document.as_ref().map_err(Clone::clone),
    );
    let api: Api<ClickHouseCluster> = Api::namespaced(ctx.client.clone(), &ns);
    let mut current = cluster.clone();
    let mut record = status.upgrade.clone().unwrap_or_default();
    record.last_check = Some(slot.to_rfc3339());
    let mut event = None;
    match &verdict {
        Verdict::Upgrade { from, to, image } => {
            // the spec first: a check whose status write fails is simply repeated, and then
            // finds the new version current
            current = api
                .patch(
                    &name,
                    &PatchParams::apply(MANAGER),
                    &Patch::Merge(json!({
                        "metadata": {"resourceVersion": cluster.resource_version()},
                        "spec": {"image": image},
                    })),
                )
                .await?;
            let message = format!("upgrading {from} → {to}: spec.image is now {image}");
            info!(cluster = %name, %from, %to, %image, "automatic upgrade");
            record.message = Some(message.clone());
            record.last_upgrade = Some(image.clone());
            record.last_upgrade_time = Some(Timestamp::now().to_string());
            event = Some((EventType::Normal, "Upgrade", message));
        }
        Verdict::Current(why) | Verdict::Skip(why) => record.message = Some(why.clone()),
        Verdict::Problem(why) => {
            warn!(cluster = %name, problem = %why, "automatic upgrade check");
            record.message = Some(why.clone());
            event = Some((EventType::Warning, "UpgradeCheckFailed", why.clone()));
        }
    }
    let mut conditions = current
        .status
        .as_ref()
        .map(|s| s.conditions.clone())
        .unwrap_or_default();
    match &verdict {
        Verdict::Problem(why) => set_condition(
            &mut conditions,
            CONDITION,
            false,
            "Unusable",
            why,
            current.metadata.generation,
            Timestamp::now(),
        ),
        Verdict::Upgrade { .. } | Verdict::Current(_) => set_condition(
            &mut conditions,
            CONDITION,
            true,
            "Read",
            "the version source was read",
            current.metadata.generation,
            Timestamp::now(),
        ),
        Verdict::Skip(_) => {}
    }
    let written = write_record(&api, &current, record, conditions).await;
    super::publish_events(ctx, &current, event, "Upgrade").await;
    written
}

/// Writes `status.upgrade` and the conditions, unless the cluster changed in between (its
/// next tick then checks the slot again).
async fn write_record(
    api: &Api<ClickHouseCluster>,
    cluster: &ClickHouseCluster,
    record: UpgradeStatus,
    conditions: Vec<crate::api::Condition>,
) -> Result<(), kube::Error> {
    api.patch_status(
        &cluster.name_any(),
        &PatchParams::default(),
        &Patch::Merge(json!({
            "metadata": {"resourceVersion": cluster.resource_version()},
            "status": {"upgrade": record, "conditions": conditions},
        })),
    )
    .await
    .map(drop)
}
