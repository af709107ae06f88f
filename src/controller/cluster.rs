//! The ClickHouseCluster controller: observe → decide (pure, `plan::decide`) → act → report.

use std::sync::Arc;

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PartialObjectMeta, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType as KubeEventType, Recorder};
use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};
use serde_json::json;
use tracing::{info, warn};

use super::{Context, MANAGER, PassTimer};
use crate::api::{ClickHouseCluster, ClickHouseClusterStatus};
use crate::plan::{self, EventType, Plan, Sibling, World};
use crate::runtime::backoff::RECHECK;
use crate::runtime::metrics::{ErrorLabels, ObjectLabels};

pub const KIND: &str = "ClickHouseCluster";

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("{reason}: {message}")]
    Failed {
        reason: &'static str,
        message: String,
    },
}

impl Error {
    fn reason(&self) -> &'static str {
        match self {
            Error::Kube(_) => "KubernetesApi",
            Error::Failed { reason, .. } => reason,
        }
    }
}

/// The clusters of the Secret's namespace that reference it (users, TLS, environment).
pub fn clusters_referencing_secret(
    clusters: &[Arc<ClickHouseCluster>],
    secret: &PartialObjectMeta<Secret>,
) -> Vec<ObjectRef<ClickHouseCluster>> {
    let (Some(ns), Some(name)) = (
        secret.metadata.namespace.as_deref(),
        secret.metadata.name.as_deref(),
    ) else {
        return Vec::new();
    };
    clusters
        .iter()
        .filter(|c| c.metadata.namespace.as_deref() == Some(ns))
        .filter(|c| referenced_secrets(c).iter().any(|s| s == name))
        .map(|c| ObjectRef::from_obj(c.as_ref()))
        .collect()
}

/// Names of the Secrets a cluster reads.
pub fn referenced_secrets(c: &ClickHouseCluster) -> Vec<String> {
    let s = &c.spec;
    [
        s.users.as_ref().map(|u| u.secret_name.clone()),
        s.tls.server_cert_secret.clone(),
        s.tls.ca_secret.clone(),
        s.pod.env_secret.clone(),
        s.keeper.pod.env_secret.clone(),
    ]
    .into_iter()
    .flatten()
    .collect()
}

fn observe(cluster: &ClickHouseCluster, ctx: &Context) -> World {
    let ns = cluster.namespace().unwrap_or_default();
    World {
        clusters_in_namespace: ctx
            .clusters_in(&ns)
            .iter()
            .filter(|c| c.metadata.deletion_timestamp.is_none())
            .map(|c| Sibling {
                name: c.name_any(),
                created: c.metadata.creation_timestamp.as_ref().map(|t| t.0),
            })
            .collect(),
    }
}

async fn report(cluster: &ClickHouseCluster, plan: &Plan, ctx: &Context) -> Result<(), Error> {
    let old = cluster.status.clone().unwrap_or_default();
    if plan.status != old {
        let api: Api<ClickHouseCluster> =
            Api::namespaced(ctx.client.clone(), &cluster.namespace().unwrap_or_default());
        let body = json!({
            "apiVersion": ClickHouseCluster::api_version(&()),
            "kind": ClickHouseCluster::kind(&()),
            "status": plan.status,
        });
        api.patch_status(
            &cluster.name_any(),
            &PatchParams::apply(MANAGER).force(),
            &Patch::Apply(&body),
        )
        .await?;
        ctx.metrics
            .writes
            .get_or_create(&crate::runtime::metrics::KindLabels { kind: KIND.into() })
            .inc();
    }
    if !plan.events.is_empty() {
        let recorder = Recorder::new(ctx.client.clone(), ctx.reporter.clone());
        let reference = cluster.object_ref(&());
        for e in &plan.events {
            let event = Event {
                type_: match e.kind {
                    EventType::Normal => KubeEventType::Normal,
                    EventType::Warning => KubeEventType::Warning,
                },
                reason: e.reason.into(),
                note: Some(e.message.chars().take(1000).collect()),
                action: e.action.into(),
                secondary: None,
            };
            if let Err(err) = recorder.publish(&event, &reference).await {
                warn!(error = %err, reason = e.reason, "cannot publish event");
            }
        }
    }
    Ok(())
}

pub async fn reconcile(
    cluster: Arc<ClickHouseCluster>,
    ctx: Arc<Context>,
) -> Result<Action, Error> {
    let _permit = ctx
        .cluster_permits
        .acquire()
        .await
        .expect("the semaphore is never closed");
    let _timer = PassTimer::start(KIND, &ctx.metrics);
    let key = format!(
        "{}/{}",
        cluster.namespace().unwrap_or_default(),
        cluster.name_any()
    );
    info!(cluster = %key, generation = ?cluster.metadata.generation, "pass started");

    if cluster.metadata.deletion_timestamp.is_some() {
        // Nothing is created for a cluster being deleted; owned objects go with it.
        return Ok(Action::await_change());
    }
    let world = observe(&cluster, &ctx);
    let plan = plan::decide(&cluster, &world, Timestamp::now());
    report(&cluster, &plan, &ctx).await?;
    match plan.failure {
        Some(f) => Err(Error::Failed {
            reason: f.reason,
            message: f.message,
        }),
        None => {
            ctx.cluster_backoff.succeeded(&key);
            ctx.metrics
                .last_success
                .get_or_create(&ObjectLabels {
                    kind: KIND.into(),
                    namespace: cluster.namespace().unwrap_or_default(),
                    name: cluster.name_any(),
                })
                .set(Timestamp::now().as_millisecond() as f64 / 1000.0);
            info!(cluster = %key, state = %plan.status.state, "pass done");
            Ok(Action::requeue(RECHECK))
        }
    }
}

pub fn error_policy(cluster: Arc<ClickHouseCluster>, error: &Error, ctx: Arc<Context>) -> Action {
    let key = format!(
        "{}/{}",
        cluster.namespace().unwrap_or_default(),
        cluster.name_any()
    );
    let delay = ctx.cluster_backoff.failed(&key);
    ctx.metrics
        .errors
        .get_or_create(&ErrorLabels {
            kind: KIND.into(),
            reason: error.reason().into(),
        })
        .inc();
    warn!(cluster = %key, error = %error, retry_in_ms = delay.as_millis() as u64, failures = ctx.cluster_backoff.failures(&key), "pass failed");
    Action::requeue(delay)
}

/// The status a cluster would get, for `clickhouse-operator plan` (no cluster access).
pub fn offline_status(cluster: &ClickHouseCluster) -> ClickHouseClusterStatus {
    plan::decide(cluster, &World::default(), Timestamp::now()).status
}
