//! One controller for the resources whose work agent Jobs do: ClickHouseBackup and
//! ClickHouseRestore (decision 26). A pass is the cluster's shape: it observes (the cluster from
//! the cache; the cluster's pods, the resource's agent Jobs and their pods from the API), asks
//! the pure plan (`plan::backup`) what to do, runs the steps, has the pure report turn what they
//! found into the status, writes that status when it changed, publishes the events, counts a
//! failure under its reason, and once the resource is over removes its agent Jobs. It decides
//! nothing itself.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Pod, Secret};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::Action;
use kube::{Resource, ResourceExt};
use serde::Serialize;
use serde_json::json;
use tokio::sync::Semaphore;
use tracing::{info, warn};

use super::kube::ignore_not_found;
use super::{Context, MANAGER, PassTimer, StepPoint, api};
use crate::api::{ClickHouseCluster, S3Destination};
use crate::backup::checks;
use crate::backup::store::{Bucket, Patience};
use crate::model::job::{BACKUP_LABEL, Mode, Placement, job_name};
use crate::model::manifest::{self, Manifest};
use crate::model::names;
use crate::plan::backup::destination::{self, default_prefix};
use crate::plan::backup::{
    self as plan, Failure, FailureReason, InMap, Outcome, Plan, Shard, Step,
};
use crate::runtime::backoff::Backoff;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("{0}")]
    Bucket(#[from] crate::backup::store::Error),
    /// A test's fault-injection hook stopped the pass ([`super::AfterJobStep`]).
    #[error("stopped {0} (fault injection)")]
    Stopped(String),
}

impl Error {
    /// The label of the error metric.
    pub fn reason(&self) -> &'static str {
        match self {
            Error::Kube(_) => "KubernetesApi",
            Error::Bucket(_) => "Bucket",
            Error::Stopped(_) => "Internal",
        }
    }
}

/// What every backup and restore pass observes.
pub struct Common {
    pub now: Timestamp,
    pub cluster: Option<Arc<ClickHouseCluster>>,
    /// The cluster's replicas whose pods are Ready.
    pub ready: BTreeSet<String>,
    /// Each shard recorded in the status: its replica, its pod and its agent.
    pub shards: BTreeMap<i32, Shard>,
}

/// A resource whose work agent Jobs do.
pub trait JobResource:
    Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
    + Clone
    + std::fmt::Debug
    + serde::de::DeserializeOwned
    + Send
    + Sync
    + 'static
{
    type Status: Clone + PartialEq + Serialize + Default + Send + Sync;
    /// What the plan reads.
    type World: Send + Sync;
    const KIND: &'static str;
    /// The events' action.
    const ACTION: &'static str;
    const MODE: Mode;

    fn cluster_name(&self) -> &str;
    fn status(&self) -> Self::Status;
    fn is_over(status: &Self::Status) -> bool;
    /// The shards the status recorded, with their replicas.
    fn recorded(status: &Self::Status) -> Vec<(i32, String)>;
    fn permits(ctx: &Context) -> &Semaphore;
    fn backoff(ctx: &Context) -> &Backoff;
    /// What only this kind reads, with the common facts, as the plan's world.
    fn world(
        &self,
        ctx: &Context,
        common: Common,
    ) -> impl std::future::Future<Output = Result<Self::World, Error>> + Send;
    fn decide(&self, world: &Self::World) -> Plan<Self::Status>;
    fn report(
        &self,
        plan: Plan<Self::Status>,
        outcome: &Outcome,
        world: &Self::World,
    ) -> Plan<Self::Status>;
    /// The cluster of the world, for the steps (credentials are checked against it).
    fn cluster_of(world: &Self::World) -> Option<&ClickHouseCluster>;
    /// Called on every pass of an ended resource and after the pass that ends it.
    fn ended(&self, _ctx: &Context, _status: &Self::Status) {}
    /// Runs before everything else in a pass (finalizers, deletion); `Some` ends the pass.
    fn prepare(
        &self,
        _ctx: &Context,
    ) -> impl std::future::Future<Output = Result<Option<Action>, Error>> + Send {
        async { Ok(None) }
    }
}

fn key<K: JobResource>(object: &K) -> String {
    format!(
        "{}/{}/{}",
        K::KIND,
        object.namespace().unwrap_or_default(),
        object.name_any()
    )
}

/// One pass of a backup or restore.
pub async fn reconcile<K: JobResource>(object: Arc<K>, ctx: Arc<Context>) -> Result<Action, Error> {
    // every line the pass logs names its resource and cluster (the log trail)
    let span = tracing::info_span!(
        "pass",
        namespace = %object.namespace().unwrap_or_default(),
        kind = %K::KIND,
        name = %object.name_any(),
        cluster = %object.cluster_name(),
    );
    let result = tracing::Instrument::instrument(pass(object, ctx.clone()), span).await;
    ctx.metrics.reconciled(K::KIND, &result);
    result
}

/// One pass of a backup or restore: [`reconcile`] without its span.
async fn pass<K: JobResource>(object: Arc<K>, ctx: Arc<Context>) -> Result<Action, Error> {
    let queued = ctx.metrics.queued(K::KIND);
    let _permit = K::permits(&ctx)
        .acquire()
        .await
        .expect("the semaphore is never closed");
    queued.started();
    let _timer = PassTimer::start(K::KIND, &ctx.metrics);
    if let Some(action) = object.prepare(&ctx).await? {
        return Ok(action);
    }
    let ns = object.namespace().unwrap_or_default();
    let old = object.status();
    if K::is_over(&old) {
        object.ended(&ctx, &old);
        remove_agents(&ctx, &ns, object.as_ref()).await?;
        return Ok(Action::await_change());
    }
    let common = observe(&ctx, object.as_ref(), &old).await?;
    let world = object.world(&ctx, common).await?;
    let plan = object.decide(&world);
    let outcome = act(&ctx, &ns, K::cluster_of(&world), &plan.steps).await?;
    let plan = object.report(plan, &outcome, &world);
    if plan.status != old {
        let api: Api<K> = api(&ctx, &ns);
        let body = json!({
            "apiVersion": K::api_version(&()),
            "kind": K::kind(&()),
            "status": plan.status,
        });
        api.patch_status(
            &object.name_any(),
            &PatchParams::apply(MANAGER).force(),
            &Patch::Apply(&body),
        )
        .await?;
        let state = state_of(&plan.status);
        if state != state_of(&old) {
            info!(from = %state_of(&old), to = %state, message = plan.failure.as_ref().map_or("", |f| f.message.as_str()), "state changed");
        }
        crash_at(&ctx, StepPoint::After, &format!("write status {state}"))?;
    }
    publish(&ctx, object.as_ref(), &plan).await;
    if let Some(f) = &plan.failure {
        ctx.metrics
            .record_backup_failure(K::KIND, f.reason.as_str());
        warn!(kind = K::KIND, namespace = %ns, name = %object.name_any(), reason = f.reason.as_str(), message = %f.message, "failed");
    }
    if K::is_over(&plan.status) {
        object.ended(&ctx, &plan.status);
        remove_agents(&ctx, &ns, object.as_ref()).await?;
    }
    K::backoff(&ctx).succeeded(&key(object.as_ref()));
    Ok(plan
        .requeue
        .map_or_else(Action::await_change, Action::requeue))
}

pub fn error_policy<K: JobResource>(object: Arc<K>, error: &Error, ctx: Arc<Context>) -> Action {
    super::retry_later(
        K::KIND,
        &key(object.as_ref()),
        error.reason(),
        error,
        K::backoff(&ctx),
        &ctx,
    )
}

/// The cluster, its Ready pods, and each recorded shard's replica, pod and agent.
async fn observe<K: JobResource>(
    ctx: &Context,
    object: &K,
    status: &K::Status,
) -> Result<Common, Error> {
    let ns = object.namespace().unwrap_or_default();
    let now = Timestamp::now();
    let cluster = ctx.cluster_or_api(&ns, object.cluster_name()).await?;
    let pods: Api<Pod> = api(ctx, &ns);
    let of_cluster = pods
        .list(&ListParams::default().labels(&format!(
            "{}={}",
            crate::model::labels::CLUSTER,
            object.cluster_name()
        )))
        .await?
        .items;
    let ready: BTreeSet<String> = of_cluster
        .iter()
        .filter(|p| crate::plan::facts::pod_ready(p))
        .filter_map(|p| p.labels().get(crate::model::labels::REPLICA).cloned())
        .collect();
    let recorded = K::recorded(status);
    let mut shards = BTreeMap::new();
    if !recorded.is_empty() {
        let owned = |o: &kube::api::ObjectMeta| {
            o.owner_references
                .iter()
                .flatten()
                .any(|r| Some(&r.uid) == object.meta().uid.as_ref())
        };
        let lp = ListParams::default().labels(&format!("{BACKUP_LABEL}={}", object.name_any()));
        let jobs: Vec<Job> = api::<Job>(ctx, &ns)
            .list(&lp)
            .await?
            .items
            .into_iter()
            .filter(|j| owned(&j.metadata))
            .collect();
        let agent_pods = pods.list(&lp).await?.items;
        for (shard, replica) in recorded {
            let name = job_name(&object.name_any(), K::MODE, shard);
            let job = jobs.iter().find(|j| j.name_any() == name);
            let job_pods: Vec<Pod> = agent_pods
                .iter()
                .filter(|p| p.labels().get("batch.kubernetes.io/job-name") == Some(&name))
                .cloned()
                .collect();
            let server = of_cluster
                .iter()
                .find(|p| p.name_any() == names::replica_pod(&replica));
            shards.insert(
                shard,
                Shard {
                    replica: cluster
                        .as_deref()
                        .map_or(InMap::Leaving, |c| plan::take::in_map(c, &replica)),
                    placement: server.map(Placement::beside),
                    agent: plan::agent(job, &job_pods, server, now),
                },
            );
        }
    }
    Ok(Common {
        now,
        cluster,
        ready,
        shards,
    })
}

/// Runs the steps; a refusal (credentials, bucket, manifest) goes into the outcome and stops
/// the steps, anything that may pass when retried is an error.
async fn act(
    ctx: &Context,
    ns: &str,
    cluster: Option<&ClickHouseCluster>,
    steps: &[Step],
) -> Result<Outcome, Error> {
    let mut outcome = Outcome::default();
    let refused = |reason, message: String| Some(Failure::new(reason, message));
    for step in steps {
        crash_at(ctx, StepPoint::Before, &step.describe())?;
        match step {
            Step::CheckBucket {
                destination,
                candidates,
            } => {
                let Some(cluster) = cluster else { break };
                let bucket =
                    match open_bucket(ctx, ns, destination, cluster, Patience::Quick).await? {
                        Ok(b) => b,
                        Err(f) => {
                            outcome.refused = Some(f);
                            break;
                        }
                    };
                if let Err(e) = bucket.check().await {
                    outcome.refused = refused(FailureReason::Bucket, e.to_string());
                    break;
                }
                for c in candidates {
                    let key = manifest::manifest_key(c);
                    if bucket
                        .get(&key, checks::limits::MANIFEST_BYTES)
                        .await?
                        .is_some()
                    {
                        outcome.base = Some(c.clone());
                        break;
                    }
                }
            }
            Step::ReadManifest {
                destination,
                backup,
            } => {
                let Some(cluster) = cluster else { break };
                let bucket =
                    match open_bucket(ctx, ns, destination, cluster, Patience::Quick).await? {
                        Ok(b) => b,
                        Err(f) => {
                            outcome.refused = Some(f);
                            break;
                        }
                    };
                let key = manifest::manifest_key(backup);
                let url = bucket.url(&key);
                let read = match bucket.get(&key, checks::limits::MANIFEST_BYTES).await {
                    Ok(Some(data)) => serde_json::from_slice::<Manifest>(&data)
                        .map_err(|e| {
                            (
                                FailureReason::ManifestRefused,
                                format!("{url} is not a backup manifest: {e}"),
                            )
                        })
                        .and_then(|m| {
                            checks::check_manifest(&m, backup).map(|()| m).map_err(|r| {
                                (
                                    FailureReason::ManifestRefused,
                                    format!("{url} breaks a rule, nothing was restored: {r}"),
                                )
                            })
                        }),
                    Ok(None) => Err((
                        FailureReason::BackupNotUsable,
                        format!(
                            "{url} does not exist: backup {backup} is not complete, or not in this bucket"
                        ),
                    )),
                    Err(e) => Err((FailureReason::Bucket, e.to_string())),
                };
                match read {
                    Ok(m) => outcome.manifest = Some(m),
                    Err((reason, message)) => {
                        outcome.refused = refused(reason, message);
                        break;
                    }
                }
            }
            Step::CreateAgent(agent) => {
                let jobs: Api<Job> = api(ctx, ns);
                match jobs.create(&PostParams::default(), &agent.build()).await {
                    Ok(_) => {
                        info!(namespace = %ns, owner = %agent.owner.name, shard = agent.shard, replica = %agent.replica, "agent job created")
                    }
                    Err(kube::Error::Api(e)) if e.code == 409 => {}
                    Err(e) => return Err(e.into()),
                }
            }
            Step::WriteManifest {
                destination,
                manifest,
            } => {
                let Some(cluster) = cluster else { break };
                let bucket =
                    match open_bucket(ctx, ns, destination, cluster, Patience::Patient).await? {
                        Ok(b) => b,
                        Err(f) => {
                            outcome.refused = Some(f);
                            break;
                        }
                    };
                let key = manifest::manifest_key(&manifest.backup);
                bucket
                    .put(
                        &key,
                        serde_json::to_vec_pretty(manifest).unwrap_or_default(),
                    )
                    .await?;
                info!(namespace = %ns, backup = %manifest.backup, manifest = %bucket.url(&key), "backup manifest written");
            }
        }
        crash_at(ctx, StepPoint::After, &step.describe())?;
    }
    Ok(outcome)
}

/// The `state` of a backup's or restore's status.
fn state_of(status: &impl Serialize) -> String {
    serde_json::to_value(status)
        .ok()
        .and_then(|v| v.get("state")?.as_str().map(str::to_string))
        .unwrap_or_default()
}

/// The fault-injection hook ([`super::AfterJobStep`]; never set in the operator binary).
fn crash_at(ctx: &Context, point: StepPoint, what: &str) -> Result<(), Error> {
    match &ctx.faults.after_job_step {
        Some(hook) if hook(point, what) => Err(Error::Stopped(format!("{point:?} {what}"))),
        _ => Ok(()),
    }
}

/// The bucket of destination `d` with the keys of its Secret (only a Secret that opts in, see
/// [`destination::credentials`]); `Err` says what is wrong with the Secret or the destination.
pub async fn open_bucket(
    ctx: &Context,
    ns: &str,
    d: &S3Destination,
    cluster: &ClickHouseCluster,
    patience: Patience,
) -> Result<Result<Bucket, Failure>, Error> {
    open_bucket_of(ctx, ns, d, &cluster.name_any(), Some(cluster), patience).await
}

/// [`open_bucket`] for cluster `name`, which may be gone.
pub async fn open_bucket_of(
    ctx: &Context,
    ns: &str,
    d: &S3Destination,
    name: &str,
    cluster: Option<&ClickHouseCluster>,
    patience: Patience,
) -> Result<Result<Bucket, Failure>, Error> {
    if d.web_identity.is_some() {
        return open_web_identity_bucket(ctx, ns, d, name, patience).await;
    }
    let secrets: Api<Secret> = api(ctx, ns);
    let secret = secrets.get_opt(&d.secret_name).await?;
    let spec = cluster.map(|c| &c.spec);
    let (access, secret_key) = match destination::credentials(d, secret.as_ref(), name, spec, ns) {
        Ok(keys) => keys,
        Err(e) => return Ok(Err(Failure::new(FailureReason::Credentials, e.to_string()))),
    };
    Ok(
        Bucket::open(d, &access, &secret_key, &default_prefix(ns, name), patience)
            .map_err(|e| Failure::new(FailureReason::Destination, e.to_string())),
    )
}

/// [`open_bucket_of`] for a destination with `webIdentity` (decision 43): a token of its
/// ServiceAccount (one that opts in), with the destination's audience, is requested from the
/// API server for 10 minutes and exchanged with STS for the role's temporary credentials.
async fn open_web_identity_bucket(
    ctx: &Context,
    ns: &str,
    d: &S3Destination,
    cluster_name: &str,
    patience: Patience,
) -> Result<Result<Bucket, Failure>, Error> {
    use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
    use k8s_openapi::api::core::v1::ServiceAccount;
    let refused = |e: String| Ok(Err(Failure::new(FailureReason::Credentials, e)));
    let Some(w) = d.web_identity.as_ref() else {
        return refused("the destination has no webIdentity".into());
    };
    let accounts: Api<ServiceAccount> = api(ctx, ns);
    // the chart grants these only in the namespaces of rbac.webIdentityNamespaces (decision 72)
    let account = match accounts.get_opt(&w.service_account_name).await {
        Ok(a) => a,
        Err(kube::Error::Api(e)) if e.code == 403 => {
            return refused(format!(
                "the operator may not read ServiceAccount {} ({}): grant it get on serviceaccounts and create on serviceaccounts/token in namespace {ns} (the chart's rbac.webIdentityNamespaces)",
                w.service_account_name, e.message
            ));
        }
        Err(e) => return Err(e.into()),
    };
    if let Err(e) = destination::web_identity(d, account.as_ref(), ns) {
        return refused(e.to_string());
    }
    let request = TokenRequest {
        spec: Some(TokenRequestSpec {
            audiences: Some(vec![w.audience().to_string()]),
            expiration_seconds: Some(600),
            ..TokenRequestSpec::default()
        }),
        ..TokenRequest::default()
    };
    let token = match accounts
        .create_token_request(&w.service_account_name, &PostParams::default(), &request)
        .await
    {
        Ok(t) => t.status.and_then(|s| s.token).unwrap_or_default(),
        Err(kube::Error::Api(e)) if e.code == 403 => {
            return refused(format!(
                "the operator may not request a token of ServiceAccount {} ({}): grant it create on serviceaccounts/token in namespace {ns} (the chart's rbac.webIdentityNamespaces)",
                w.service_account_name, e.message
            ));
        }
        Err(e) => return Err(e.into()),
    };
    crate::backup::sts::remember(&token);
    let sts = match crate::backup::sts::Sts::new(
        &w.sts_endpoint(d.region()),
        d.insecure,
        &w.role_arn,
        &w.service_account_name,
        &format!("clickhouse-operator-{ns}-{cluster_name}"),
    ) {
        Ok(s) => s,
        Err(e) => return Ok(Err(Failure::new(FailureReason::Destination, e.to_string()))),
    };
    let provider = std::sync::Arc::new(crate::backup::sts::WebIdentityCredentials::new(
        sts,
        crate::backup::sts::Token::Fixed(token),
    ));
    if let Err(e) = provider.current().await {
        return refused(e.to_string());
    }
    Ok(Bucket::open_with(
        d,
        &crate::backup::store::Credentials::WebIdentity(provider),
        &default_prefix(ns, cluster_name),
        patience,
    )
    .map_err(|e| Failure::new(FailureReason::Destination, e.to_string())))
}

/// Removes backup `name`'s data at `d`: every object under its folder that no other backup's
/// shard manifest in the same place references (its manifest first, so that it stops being
/// complete at once), reading the bucket as a stream within bounds (`backup::removal`, decision
/// 70). Returns how many objects went and how many stayed; a bucket that fails or passes a
/// bound is a failure the caller reports in an Event, and the removal is retried.
pub async fn remove_backup_data(
    ctx: &Context,
    ns: &str,
    d: &S3Destination,
    (cluster_name, cluster): (&str, Option<&ClickHouseCluster>),
    name: &str,
) -> Result<Result<(usize, usize), Failure>, Error> {
    let bucket = match open_bucket_of(ctx, ns, d, cluster_name, cluster, Patience::Patient).await? {
        Ok(b) => b,
        Err(f) => return Ok(Err(f)),
    };
    let dir = format!("{}/", manifest::backup_dir(name));
    match crate::backup::removal::remove(&bucket, name, crate::backup::removal::DEADLINE).await {
        Ok(done) => {
            info!(namespace = %ns, backup = %name, removed = done.gone, kept = done.kept, bucket = %bucket.url(&dir), "backup data removed");
            Ok(Ok((done.gone, done.kept)))
        }
        Err(e) => Ok(Err(Failure::new(FailureReason::Destination, e.to_string()))),
    }
}

/// Sets or removes `finalizer` on `object`, unless the object changed since it was read.
pub async fn set_finalizer<K: JobResource>(
    ctx: &Context,
    object: &K,
    finalizer: &str,
    present: bool,
) -> Result<(), kube::Error> {
    let mut finalizers: Vec<String> = object.meta().finalizers.clone().unwrap_or_default();
    finalizers.retain(|f| f != finalizer);
    if present {
        finalizers.push(finalizer.to_string());
    }
    let api: Api<K> = api(ctx, &object.namespace().unwrap_or_default());
    api.patch(
        &object.name_any(),
        &PatchParams::default(),
        &Patch::Merge(json!({
            "metadata": {"finalizers": finalizers, "resourceVersion": object.resource_version()}
        })),
    )
    .await
    .map(drop)
}

async fn publish<K: JobResource>(ctx: &Context, object: &K, plan: &Plan<K::Status>) {
    let events: Vec<_> = plan
        .events
        .iter()
        .map(|e| (e.kind, e.reason, e.message.clone()))
        .collect();
    super::publish_events(ctx, object, events, K::ACTION).await;
}

/// Deletes the agent Jobs of an ended backup or restore (those it owns), with their pods.
pub async fn remove_agents<K: JobResource>(
    ctx: &Context,
    ns: &str,
    object: &K,
) -> Result<(), kube::Error> {
    let jobs: Api<Job> = api(ctx, ns);
    let lp = ListParams::default().labels(&format!("{BACKUP_LABEL}={}", object.name_any()));
    let uid = object.meta().uid.clone();
    for j in jobs.list(&lp).await?.items {
        let owned = j
            .metadata
            .owner_references
            .iter()
            .flatten()
            .any(|o| Some(&o.uid) == uid.as_ref());
        if !owned {
            continue;
        }
        ignore_not_found(
            jobs.delete(&j.name_any(), &DeleteParams::background())
                .await,
        )?;
    }
    Ok(())
}
