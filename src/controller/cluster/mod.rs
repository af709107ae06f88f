//! The ClickHouseCluster controller: observe ([`observe`]) → decide (the pure
//! [`crate::plan::decide`]) → act ([`execute`]) → report (the pure
//! [`crate::plan::report::report`]), then one status write and the events.

mod done;
mod execute;
pub mod idle;
pub mod keeper_root;
mod observe;
pub mod preview;
mod retained;
mod scale_in;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DynamicObject, PartialObjectMeta, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};
use serde_json::json;
use tracing::{debug, info, warn};

use super::kube::ignore_not_found;
use super::{Context, MANAGER, PassTimer, api};
use crate::api::{ClickHouseCluster, ClickHouseClusterStatus, ReclaimPolicy};
use crate::controller::cache::{Seen, Write};
use crate::plan::facts::Kind;
use crate::plan::{self, Failure, FailureReason, Plan, PlannedEvent, World};
use crate::runtime::backoff::RECHECK;
use crate::runtime::metrics::{ClusterGauges, KindLabels, ObjectLabels, PodCounts};

pub const KIND: &str = "ClickHouseCluster";
/// Finalizer of a ClickHouseCluster: deletion runs the PVC reclaim policy first (decision 12).
/// The operator adds it itself rather than through kube-runtime's finalizer helper, because it
/// adds it only to a cluster it manages: a second cluster refused in a namespace (decision 18)
/// gets none, so deleting it never waits for the operator.
pub const FINALIZER: &str = "clickhouse.com/finalizer";
pub use crate::model::labels::DELETE_PVC as DELETE_PVC_LABEL;
/// How many times one reconcile observes and decides again right away (`Plan::again`).
const PASSES_PER_RECONCILE: usize = 4;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("{}: {}", .0.reason, .0.message)]
    Failed(Failure),
    /// A test stopped the pass right there, as if the process had died (decision 24): nothing
    /// after it runs, not even the pass's status write.
    #[error("{0}")]
    Stopped(String),
}

impl Error {
    pub fn failed(reason: FailureReason, message: String) -> Self {
        Error::Failed(Failure { reason, message })
    }

    fn clickhouse(what: &str, e: impl std::fmt::Display) -> Self {
        Error::failed(FailureReason::ClickHouse, format!("{what}: {e}"))
    }

    pub fn reason(&self) -> FailureReason {
        match self {
            Error::Kube(_) => FailureReason::KubernetesApi,
            Error::Failed(f) => f.reason,
            Error::Stopped(_) => FailureReason::Internal,
        }
    }
}

/// The resourceVersion of each cluster's last status write by this operator, by namespace/name:
/// a cached copy older than that is read again from the API server before a pass plans on it.
#[derive(Default)]
pub struct LastWrites(Mutex<HashMap<String, String>>);

impl LastWrites {
    fn get(&self, key: &str) -> Option<String> {
        self.0.lock().expect("never poisoned").get(key).cloned()
    }

    fn set(&self, key: &str, rv: Option<String>) {
        let mut m = self.0.lock().expect("never poisoned");
        match rv {
            Some(rv) => m.insert(key.to_string(), rv),
            None => m.remove(key),
        };
    }
}

/// The clusters of the Secret's namespace that reference it (users, TLS, environment, backup
/// destinations).
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
        .filter(|c| {
            c.spec.referenced_secrets().iter().any(|(_, s)| s == name)
                || c.spec.backup_secrets().iter().any(|s| s == name)
        })
        .map(|c| ObjectRef::from_obj(c.as_ref()))
        .collect()
}

fn dynamic(ctx: &Context, ns: &str, kind: Kind) -> Api<DynamicObject> {
    Api::namespaced_with(
        ctx.client.clone(),
        ns,
        &crate::controller::kinds::resource(kind),
    )
}

/// Remembers the object a write answered with, so that the next pass plans from the caches
/// only once they show it (decision 41).
fn noted<K: Resource>(
    ctx: &Context,
    cluster: &ClickHouseCluster,
    kind: Kind,
    r: Result<K, kube::Error>,
) -> Result<K, kube::Error> {
    if let Ok(o) = &r {
        ctx.caches.wrote(
            &cluster.namespace().unwrap_or_default(),
            &cluster.name_any(),
            Write::of(kind, o),
        );
    }
    r
}

/// [`noted`] for a deletion of object `name` (`uid`: the one meant, where the deletion named it).
fn noted_deletion<K: Resource>(
    ctx: &Context,
    cluster: &ClickHouseCluster,
    kind: Kind,
    name: &str,
    uid: Option<&str>,
    r: Result<either::Either<K, kube::core::Status>, kube::Error>,
) -> Result<either::Either<K, kube::core::Status>, kube::Error> {
    let seen = match &r {
        Ok(either::Either::Left(o)) => Some(Seen::Gone {
            uid: o.meta().uid.clone().or(uid.map(str::to_string)),
            version: o.meta().resource_version.clone(),
        }),
        Ok(either::Either::Right(_)) => Some(Seen::Gone {
            uid: uid.map(str::to_string),
            version: None,
        }),
        Err(_) => None,
    };
    if let Some(seen) = seen {
        ctx.caches.wrote(
            &cluster.namespace().unwrap_or_default(),
            &cluster.name_any(),
            Write {
                kind,
                name: name.to_string(),
                seen,
            },
        );
    }
    r
}

/// Publishes the Events of a pass through the operator's recorder: one per type, reason and
/// action, naming what each was about ([`crate::controller::events::merge`]).
async fn publish(cluster: &ClickHouseCluster, events: &[PlannedEvent], ctx: &Context) {
    let reference = cluster.object_ref(&());
    for e in crate::controller::events::merge(events) {
        ctx.events.publish(&reference, &e).await;
    }
}

fn key(cluster: &ClickHouseCluster) -> String {
    format!(
        "{}/{}",
        cluster.namespace().unwrap_or_default(),
        cluster.name_any()
    )
}

/// Writes the status when it changed, on the resourceVersion the pass planned from (a
/// conflict fails the pass, which is retried at once on a fresh read); returns the cluster as
/// the API server now has it. A replica map change the state machine does not allow (S0-06,
/// [`crate::plan::replicas::map_change_refused`]) is not written: the old map is kept, the
/// status says `error` with what was refused, and the pass fails.
async fn write_status(
    cluster: &ClickHouseCluster,
    status: &ClickHouseClusterStatus,
    ctx: &Context,
) -> Result<ClickHouseCluster, Error> {
    if cluster.status.as_ref() == Some(status) {
        return Ok(cluster.clone());
    }
    let old_map = cluster
        .status
        .as_ref()
        .map(|s| s.replica_state_map.clone())
        .unwrap_or_default();
    if let Some(why) =
        crate::plan::replicas::map_change_refused(&old_map, &status.replica_state_map)
    {
        // a bug: the map stays as it was, the status says so, and the pass stops here
        let failure = crate::plan::Failure {
            reason: FailureReason::Internal,
            message: format!(
                "internal error: {why}, which the replica state machine does not allow (S0-06); the replica map was kept as it was and the pass stopped; please report this"
            ),
        };
        tracing::error!(cluster = %cluster.name_any(), error = %failure.message, "refused status write");
        let mut kept = crate::plan::status::failed(
            status,
            cluster.metadata.generation,
            &failure,
            Timestamp::now(),
        );
        kept.replica_state_map = old_map;
        kept.members = Some(crate::plan::status::members(&cluster.name_any(), &kept));
        write_status_unchecked(cluster, &kept, ctx).await?;
        return Err(Error::Failed(failure));
    }
    write_status_unchecked(cluster, status, ctx).await
}

/// Writes `status` as it is (see [`write_status`]).
async fn write_status_unchecked(
    cluster: &ClickHouseCluster,
    status: &ClickHouseClusterStatus,
    ctx: &Context,
) -> Result<ClickHouseCluster, Error> {
    let api: Api<ClickHouseCluster> = api(ctx, &cluster.namespace().unwrap_or_default());
    let body = json!({
        "apiVersion": ClickHouseCluster::api_version(&()),
        "kind": ClickHouseCluster::kind(&()),
        "metadata": {"resourceVersion": cluster.resource_version()},
        "status": status,
    });
    let updated = api
        .patch_status(
            &cluster.name_any(),
            &PatchParams::apply(MANAGER).force(),
            &Patch::Apply(&body),
        )
        .await?;
    ctx.last_writes
        .set(&key(cluster), updated.resource_version());
    ctx.metrics
        .writes
        .get_or_create(&KindLabels { kind: KIND.into() })
        .inc();
    Ok(updated)
}

async fn ensure_finalizer(
    cluster: &ClickHouseCluster,
    ctx: &Context,
) -> Result<ClickHouseCluster, Error> {
    if cluster.finalizers().iter().any(|f| f == FINALIZER) {
        return Ok(cluster.clone());
    }
    let mut finalizers = cluster.finalizers().to_vec();
    finalizers.push(FINALIZER.to_string());
    let updated = api::<ClickHouseCluster>(ctx, &cluster.namespace().unwrap_or_default())
        .patch(
            &cluster.name_any(),
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": finalizers, "resourceVersion": cluster.resource_version()}})),
        )
        .await?;
    ctx.last_writes
        .set(&key(cluster), updated.resource_version());
    Ok(updated)
}

/// Deletion (S2-09: run the finalizers and stop): PVCs follow `spec.storage.reclaimPolicy`
/// (decision 12), and so do what their data depends on: the credentials Secret (handed to the
/// retained volumes, [`retained`]) and the root in an external Keeper (kept with them); owned
/// objects go through garbage collection.
async fn finalize(cluster: &ClickHouseCluster, ctx: &Context) -> Result<Action, Error> {
    let ns = cluster.namespace().unwrap_or_default();
    let delete = cluster.spec.storage.data.reclaim_policy == ReclaimPolicy::Delete;
    if delete {
        let (world, _) = observe::observe(cluster, ctx, &Default::default()).await?;
        scale_in::label_pvcs(ctx, cluster, &world, |_| true).await?;
    } else {
        retained::hand_credentials_to_volumes(cluster, ctx).await?;
    }
    let root = cluster.status.as_ref().and_then(|s| s.keeper_root.clone());
    let root = root.filter(|_| cluster.spec.keeper.external.is_some());
    if let Some(root) = root.as_ref().filter(|_| !delete) {
        // the retained tables' replication metadata: a cluster created again with this name,
        // the credentials and the volumes, takes it over (keeper_root::ensure)
        info!(cluster = %cluster.name_any(), root = %root, "kept the cluster's root in the external Keeper with its retained volumes");
    }
    if let Some(root) = root.filter(|_| delete) {
        // the root in the shared Keeper goes with the cluster, once no server writes to it
        if !keeper_root::servers_stopped(cluster, ctx).await? {
            return Ok(Action::requeue(std::time::Duration::from_secs(2)));
        }
        let (world, _) = observe::observe(cluster, ctx, &Default::default()).await?;
        let password = world.observed.inputs.keeper_password.as_ref();
        let kept = keeper_root::remove(cluster, ctx, password, &root).await?;
        if kept.is_empty() {
            info!(cluster = %cluster.name_any(), root = %root, "removed the cluster's root from the external Keeper");
        } else {
            warn!(cluster = %cluster.name_any(), root = %root, kept = ?kept, "removed the cluster's root from the external Keeper but the roots of other clusters in it");
        }
    }
    if let Some(publisher) = &ctx.exporter_credentials
        && let Err(e) = publisher
            .withdraw(&ctx.client, &ns, &cluster.name_any())
            .await
    {
        // a Secret the operator may not patch stays as it was; nothing else depends on it
        warn!(cluster = %cluster.name_any(), secret = %publisher.secret(), error = %e, "could not remove the exporter's credentials");
    }
    let finalizers: Vec<String> = cluster
        .finalizers()
        .iter()
        .filter(|f| *f != FINALIZER)
        .cloned()
        .collect();
    ignore_not_found(
        api::<ClickHouseCluster>(ctx, &ns)
            .patch(
                &cluster.name_any(),
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"finalizers": finalizers}})),
            )
            .await,
    )?;
    ctx.last_writes.set(&key(cluster), None);
    ctx.metrics.forget_cluster(&ns, &cluster.name_any());
    ctx.caches.forget(&ns, &cluster.name_any());
    ctx.pacer.forget(&key(cluster));
    ctx.idle.forget(&key(cluster));
    info!(cluster = %cluster.name_any(), "deleted");
    Ok(Action::await_change())
}

/// The cluster to plan from: the cached copy, unless the operator wrote the cluster since the
/// cache saw it (then a fresh read), so that no pass plans from a status older than the
/// operator's own last write.
async fn fresh(
    cluster: &ClickHouseCluster,
    ctx: &Context,
) -> Result<Option<ClickHouseCluster>, Error> {
    match ctx.last_writes.get(&key(cluster)) {
        Some(rv) if cluster.resource_version().as_deref() != Some(rv.as_str()) => {
            Ok(
                api::<ClickHouseCluster>(ctx, &cluster.namespace().unwrap_or_default())
                    .get_opt(&cluster.name_any())
                    .await?,
            )
        }
        _ => Ok(Some(cluster.clone())),
    }
}

/// What the passes of one reconcile reached: the cluster as the API server has it (as last read
/// or written) and as the passes planned it (the same, with the status they reported, which
/// is written once, at the end), the Events to publish, and what [`pass`] returns.
struct Passes {
    stored: ClickHouseCluster,
    planned: ClickHouseCluster,
    events: Vec<PlannedEvent>,
    wrote: bool,
    caught_up: bool,
    soon: bool,
    /// What the last pass read, for the idle checks that follow it (decision 60).
    mark: (Option<idle::Stamps>, Option<Vec<idle::Server>>),
}

/// What [`pass`] reached: the cluster as the API server has it, whether the passes wrote to
/// Kubernetes, whether they wait for their servers, and what the last one read (for
/// [`idle::Marks::set`]; `None` when it did not read the caches).
struct Passed {
    cluster: ClickHouseCluster,
    wrote: bool,
    soon: bool,
    mark: (Option<idle::Stamps>, Option<Vec<idle::Server>>),
}

impl Passes {
    /// Writes the status the passes reported, when it differs from the stored one.
    async fn write(&mut self, ctx: &Context) -> Result<(), Error> {
        // the public part follows the rest of the status (S0-12)
        let name = self.planned.name_any();
        if let Some(s) = self.planned.status.as_mut() {
            s.members = Some(crate::plan::status::members(&name, s));
        }
        let Some(status) = to_write(self.stored.status.as_ref(), self.planned.status.as_ref())
        else {
            return Ok(());
        };
        let written = write_status(&self.stored, &status.clone(), ctx).await?;
        self.planned = written.clone();
        self.stored = written;
        Ok(())
    }
}

/// PURE: the status to write, if any: the one the passes reported, unless it is the one
/// stored (a pass that changed nothing in the status writes nothing).
fn to_write<'a>(
    stored: Option<&ClickHouseClusterStatus>,
    reported: Option<&'a ClickHouseClusterStatus>,
) -> Option<&'a ClickHouseClusterStatus> {
    reported.filter(|r| stored != Some(*r))
}

/// PURE: whether a pass that planned from `planned` must write that status before it acts:
/// its replica map is not the one stored (entries added or condemned by the pass before, or
/// their steps done), and what the pass does next acts on it (S0-19, S0-21: a new or condemned
/// entry is stored before anything is created or removed for it).
fn map_first(
    stored: Option<&ClickHouseClusterStatus>,
    planned: Option<&ClickHouseClusterStatus>,
    acts: bool,
) -> bool {
    let map = |s: Option<&ClickHouseClusterStatus>| s.map(|s| s.replica_state_map.clone());
    acts && map(stored).unwrap_or_default() != map(planned).unwrap_or_default()
}

/// One pass: observe, decide, act, report; again right away while the plan asks for it.
/// The status is written once, at the end, when it changed (also when a pass failed or a step
/// could not be run), and before a pass acts on a replica map not stored yet; the Events are
/// published after it. Returns the cluster as written, whether anything was written to
/// Kubernetes but the status, and whether the last plan waits for the servers
/// (`Plan::recheck_soon`).
async fn pass(current: ClickHouseCluster, ctx: &Context) -> Result<Passed, Error> {
    let mut p = Passes {
        stored: current.clone(),
        planned: current,
        events: Vec::new(),
        wrote: false,
        caught_up: false,
        soon: false,
        mark: (None, None),
    };
    let result = passes(&mut p, ctx).await;
    if let Err(e @ Error::Stopped(_)) = result {
        // as if the process had died: nothing is written
        return Err(e);
    }
    let written = p.write(ctx).await;
    publish(&p.stored, &p.events, ctx).await;
    match (result, written) {
        (Err(e), written) => {
            if let Err(w) = written {
                warn!(cluster = %p.stored.name_any(), error = %w, "cannot write the status of a failed pass");
            }
            Err(e)
        }
        (Ok(()), Err(w)) => Err(w),
        (Ok(()), Ok(())) => {
            if p.caught_up {
                // the caches have seen everything this pass saw (its own writes are awaited
                // apart)
                let (ns, name) = (
                    p.stored.namespace().unwrap_or_default(),
                    p.stored.name_any(),
                );
                ctx.caches.set_dirty(&ns, &name, false);
            }
            Ok(Passed {
                cluster: p.stored,
                wrote: p.wrote,
                soon: p.soon,
                mark: if p.caught_up { p.mark } else { (None, None) },
            })
        }
    }
}

/// The passes of [`pass`], up to [`PASSES_PER_RECONCILE`], without the final status write.
async fn passes(p: &mut Passes, ctx: &Context) -> Result<(), Error> {
    let ns = p.stored.namespace().unwrap_or_default();
    let name = p.stored.name_any();
    for _ in 0..PASSES_PER_RECONCILE {
        // decision 52: the operator's defaults under the cluster's own spec, for this pass only
        // (the cluster object is never written with them)
        let mut current = p.planned.clone();
        current.spec = ctx
            .cluster_defaults
            .apply(&current.spec)
            .map_err(|e| Error::failed(FailureReason::InvalidSpec, e))?;
        // the servers' clients of this pass share their HTTP clients
        let connections = crate::clickhouse::Connections::default();
        // before anything is read: a change meanwhile makes the next idle check a full pass
        let stamps = idle::stamps(&current, ctx);
        let (mut world, fresh) = observe::observe(&current, ctx, &connections).await?;
        world.observed.default_storage_classes = ctx.cluster_defaults.storage_classes();
        world.limits = ctx.limits;
        p.caught_up = fresh;
        p.mark = (stamps, idle::servers(&current, &world));
        let mut plan = plan::decide(&current, &world, Timestamp::now());
        if !plan.lag_checks.is_empty() {
            observe::read_lag(&current, &mut world, &plan.lag_checks, &connections).await;
            plan = plan::decide(&current, &world, Timestamp::now());
        }
        p.soon = plan.recheck_soon;
        if plan.manage {
            let with = ensure_finalizer(&p.stored, ctx).await?;
            p.stored.metadata = with.metadata.clone();
            p.planned.metadata = with.metadata;
            current.metadata = p.planned.metadata.clone();
        }
        if map_first(
            p.stored.status.as_ref(),
            p.planned.status.as_ref(),
            !plan.steps.is_empty(),
        ) {
            p.write(ctx).await?;
            current.metadata = p.planned.metadata.clone();
        }
        if plan.steps.iter().any(|a| a.writes_kubernetes()) {
            // each write is remembered as it is made: the next pass plans from the caches only
            // once they show it (decision 41)
            p.wrote = true;
        }
        let outcome = match execute::act(&mut current, &world, &plan, ctx, &connections).await {
            Ok(o) => o,
            Err(e) => {
                // a write may have been made without its answer: until the caches hold what the
                // API server says, passes read the API server
                ctx.caches.set_dirty(&ns, &name, true);
                return Err(e);
            }
        };
        let (status, events) = plan::report::report(
            &plan,
            &outcome,
            current.metadata.generation,
            Timestamp::now(),
        );
        ctx.metrics.record_cluster(&ns, &name, &gauges(&status));
        p.planned.status = Some(status);
        p.events.extend(events);
        if let Some(f) = outcome.failure.or(plan.failure) {
            return Err(Error::Failed(f));
        }
        if !plan.again {
            break;
        }
    }
    Ok(())
}

pub async fn reconcile(
    cluster: Arc<ClickHouseCluster>,
    ctx: Arc<Context>,
) -> Result<Action, Error> {
    // every line the pass logs names its cluster (the log trail)
    let span = tracing::info_span!(
        "pass",
        namespace = %cluster.metadata.namespace.as_deref().unwrap_or_default(),
        cluster = %cluster.name_any(),
    );
    let result =
        tracing::Instrument::instrument(reconcile_in_span(cluster, ctx.clone()), span).await;
    ctx.metrics.reconciled(KIND, &result);
    result
}

/// One pass of `cluster`: [`reconcile`] without its span.
async fn reconcile_in_span(
    cluster: Arc<ClickHouseCluster>,
    ctx: Arc<Context>,
) -> Result<Action, Error> {
    let queued = ctx.metrics.queued(KIND);
    // an idle health check waits for one of the idle slots first, so that it never queues
    // ahead of more than a few passes a change triggered (decision 41)
    let idle = ctx.pacer.take_idle(&key(&cluster));
    let _idle_permit = if idle {
        Some(
            ctx.idle_permits
                .acquire()
                .await
                .expect("the semaphore is never closed"),
        )
    } else {
        None
    };
    let _permit = ctx
        .cluster_permits
        .acquire()
        .await
        .expect("the semaphore is never closed");
    queued.started();
    let _timer = PassTimer::start(KIND, &ctx.metrics);
    // the pass may have waited for its permit: plan from the cache's copy as it is now
    let cluster = ctx
        .cluster(
            cluster.metadata.namespace.as_deref().unwrap_or_default(),
            &cluster.name_any(),
        )
        .unwrap_or(cluster);
    let cluster = match &ctx.faults.stale_cache {
        Some(stale) => stale(cluster),
        None => cluster,
    };
    let key = key(&cluster);
    debug!(cluster = %key, generation = ?cluster.metadata.generation, "pass started");
    if cluster.metadata.deletion_timestamp.is_some() {
        if cluster.finalizers().iter().any(|f| f == FINALIZER) {
            return finalize(&cluster, &ctx).await;
        }
        return Ok(Action::await_change());
    }
    let Some(current) = fresh(&cluster, &ctx).await? else {
        return Ok(Action::await_change());
    };
    let started = std::time::Instant::now();
    if idle && idle::unchanged(&current, &ctx, &key).await {
        // nothing new in the caches, the servers say what they said: the pass would plan
        // nothing (decision 60)
        ctx.metrics.observed("glance");
        succeeded(&cluster, &ctx);
        debug!(cluster = %key, "idle check: nothing new at a glance");
        return Ok(Action::requeue(idle_recheck(&ctx, &key, started)));
    }
    let Passed {
        cluster: current,
        wrote,
        soon,
        mark,
    } = pass(current, &ctx).await?;
    succeeded(&cluster, &ctx);
    debug!(cluster = %key, state = %current.status.as_ref().map(|s| s.state).unwrap_or_default(), "pass done");
    // a server loading its configuration, or a shard becoming reachable: no event says so
    let recheck = ctx.pacer.recheck(&key, soon);
    let settled = current
        .status
        .as_ref()
        .is_some_and(|s| s.state == crate::api::ClusterState::Ready);
    if settled && !wrote {
        ctx.idle.set(&key, mark.0, mark.1);
        return Ok(Action::requeue(idle_recheck(&ctx, &key, started)));
    }
    ctx.idle.forget(&key);
    Ok(Action::requeue(recheck))
}

/// A pass (or an idle check at a glance) of `cluster` succeeded: its backoff starts again, its
/// last success is now.
fn succeeded(cluster: &ClickHouseCluster, ctx: &Context) {
    ctx.cluster_backoff.succeeded(&key(cluster));
    ctx.metrics
        .last_success
        .get_or_create(&ObjectLabels {
            kind: KIND.into(),
            namespace: cluster.namespace().unwrap_or_default(),
            name: cluster.name_any(),
        })
        .set(Timestamp::now().as_millisecond() as f64 / 1000.0);
}

/// When an idle `ready` cluster is checked next, its check having started at `started`: paced
/// so that checks never fill the pass slots (decision 41).
fn idle_recheck(ctx: &Context, key: &str, started: std::time::Instant) -> std::time::Duration {
    let next = ctx.pacer.idle_pass(
        started.elapsed(),
        ctx.concurrency,
        crate::runtime::backoff::spread_of(key),
        || ctx.clusters.iter().map(|s| s.state().len()).sum(),
    );
    ctx.pacer.schedule(key, next);
    next
}

pub fn error_policy(cluster: Arc<ClickHouseCluster>, error: &Error, ctx: Arc<Context>) -> Action {
    if error.reason() == FailureReason::CatchUpTimeout {
        // Not a step that failed: the pass did its work and reported a replica that lags.
        // It heals without any Kubernetes event, so it is re-checked as a healthy cluster is.
        warn!(cluster = %key(&cluster), error = %error, "rollout stopped");
        return Action::requeue(RECHECK);
    }
    super::retry_later(
        KIND,
        &key(&cluster),
        error.reason().as_str(),
        error,
        &ctx.cluster_backoff,
        &ctx,
    )
}

/// What the operator's series of a cluster show ([`crate::runtime::metrics`]), from the status
/// it reports: its state by name, its servers' and Keeper's pods, its condemned replicas.
pub fn gauges(status: &ClickHouseClusterStatus) -> ClusterGauges {
    let pods = |c: &crate::api::ComponentStatus| PodCounts {
        desired: i64::from(c.size),
        ready: i64::from(c.ready),
        updated: i64::from(c.updated),
    };
    let condemned = status
        .replica_state_map
        .values()
        .filter(|r| r.state == crate::api::ReplicaState::Condemned)
        .count();
    ClusterGauges {
        state: status.state.to_string(),
        clickhouse: pods(&status.clickhouse),
        keeper: pods(&status.keeper),
        condemned: condemned as i64,
    }
}

/// What the operator would decide for a cluster read from a file (no cluster access): the
/// plan of a first pass over an empty namespace.
pub fn offline_plan(cluster: &ClickHouseCluster) -> Plan {
    let mut world = World::default();
    world.observed.operator_secret_present = true;
    plan::decide(cluster, &world, Timestamp::now())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::ClientServiceType;
    use serde_json::Value;

    /// A change of a Secret triggers a pass of the clusters of its namespace that read it: the
    /// users Secret, and (decision 35) a backup destination's Secret, whose keys the servers keep
    /// as a named collection, so that a rotated key reaches them.
    #[test]
    fn a_changed_secret_triggers_the_clusters_that_read_it_backup_destinations_included() {
        use kube::core::PartialObjectMetaExt;
        let c: ClickHouseCluster = serde_json::from_value(json!({
            "apiVersion": "clickhouse.com/v1alpha1", "kind": "ClickHouseCluster",
            "metadata": {"name": "c1", "namespace": "ns"},
            "spec": {"users": {"secretName": "app-users"},
                     "backup": {"destination": {"endpoint": "https://s3.example.com", "bucket": "b",
                                                "secretName": "s3-creds"},
                                "allowedDestinations": [{"endpoint": "https://dr.example.com",
                                                         "bucket": "dr", "secretName": "dr-creds"}]}}
        }))
        .unwrap();
        let clusters = vec![Arc::new(c)];
        let triggered = |ns: &str, name: &str| {
            let meta = kube::api::ObjectMeta {
                name: Some(name.into()),
                namespace: Some(ns.into()),
                ..Default::default()
            }
            .into_response_partial::<Secret>();
            clusters_referencing_secret(&clusters, &meta).len()
        };
        assert_eq!(triggered("ns", "app-users"), 1);
        assert_eq!(triggered("ns", "s3-creds"), 1);
        assert_eq!(triggered("ns", "dr-creds"), 1);
        assert_eq!(triggered("ns", "other"), 0);
        assert_eq!(triggered("elsewhere", "s3-creds"), 0);
    }

    fn status(map: &[(&str, crate::api::ReplicaState)], message: &str) -> ClickHouseClusterStatus {
        let mut s = ClickHouseClusterStatus {
            message: Some(message.into()),
            ..ClickHouseClusterStatus::default()
        };
        for (n, state) in map {
            s.replica_state_map.insert(
                (*n).into(),
                crate::api::ReplicaStatus {
                    shard: crate::api::ShardIndex(0),
                    state: *state,
                    is_backup_pod: false,
                    index: 0,
                    scale_in_step: None,
                    released: false,
                },
            );
        }
        s
    }

    /// A pass writes the status it reported only when it differs from the stored one.
    #[test]
    fn a_status_equal_to_the_stored_one_is_not_written() {
        use crate::api::ReplicaState::Ready;
        let stored = status(&[("c1-0-0", Ready)], "waiting for c1-0-0");
        assert_eq!(to_write(Some(&stored), Some(&stored.clone())), None);
        assert_eq!(to_write(Some(&stored), None), None);
        let changed = status(&[("c1-0-0", Ready)], "waiting for nothing");
        assert_eq!(to_write(Some(&stored), Some(&changed)), Some(&changed));
        assert_eq!(to_write(None, Some(&changed)), Some(&changed));
    }

    /// S0-19, S0-21: a pass that acts on a replica map the pass before changed (entries added
    /// or condemned, steps recorded) writes it first; one whose map is the stored one, or that
    /// does nothing, leaves the status to the one write at the end of the reconcile.
    #[test]
    fn a_pass_acting_on_a_replica_map_not_stored_yet_writes_the_status_first() {
        use crate::api::ReplicaState::{Condemned, Pending, Ready};
        let stored = status(&[("c1-0-0", Ready)], "ready");
        let added = status(&[("c1-0-0", Ready), ("c1-0-1", Pending)], "adding");
        let condemned = status(&[("c1-0-0", Condemned)], "removing");
        let message_only = status(&[("c1-0-0", Ready)], "another message");
        assert!(map_first(Some(&stored), Some(&added), true));
        assert!(map_first(Some(&stored), Some(&condemned), true));
        assert!(map_first(None, Some(&added), true));
        assert!(!map_first(Some(&stored), Some(&added), false));
        assert!(!map_first(Some(&stored), Some(&message_only), true));
        assert!(!map_first(Some(&stored), Some(&stored), true));
    }

    fn cluster(r#type: ClientServiceType, enabled: bool) -> ClickHouseCluster {
        let mut c =
            crate::testing::cluster_named("demo", json!({"clusterDomain": "example.internal"}));
        c.metadata.namespace = Some("analytics".into());
        c.spec.client_service.r#type = r#type;
        c.spec.client_service.enabled = enabled;
        c
    }

    /// The `host` the status report gives with the client Service `demo` observed as `service`
    /// (`None`: not observed).
    fn host(c: &ClickHouseCluster, service: Option<Value>) -> Option<String> {
        let mut world = World::default();
        world.observed.operator_secret_present = true;
        if let Some(svc) = service {
            world
                .observed
                .objects
                .insert((Kind::Service, "demo".into()), svc);
        }
        plan::decide(c, &world, Timestamp::now()).status.host
    }

    /// The `Endpoint` column of `kubectl get chc` (`status.host`): the client Service's DNS
    /// name once the Service exists, a LoadBalancer's ingress address once it has one, nothing
    /// otherwise.
    #[test]
    fn status_host_is_the_client_services_address() {
        let svc = json!({"metadata": {"name": "demo"}, "spec": {"type": "ClusterIP"}});
        let c = cluster(ClientServiceType::ClusterIP, true);
        assert_eq!(host(&c, None), None);
        assert_eq!(
            host(&c, Some(svc.clone())).as_deref(),
            Some("demo.analytics.svc.example.internal")
        );
        let c = cluster(ClientServiceType::NodePort, true);
        assert_eq!(
            host(&c, Some(svc)).as_deref(),
            Some("demo.analytics.svc.example.internal")
        );

        let c = cluster(ClientServiceType::LoadBalancer, true);
        let pending = json!({"metadata": {"name": "demo"}, "status": {"loadBalancer": {}}});
        assert_eq!(host(&c, Some(pending)), None);
        let ip = json!({"metadata": {"name": "demo"},
            "status": {"loadBalancer": {"ingress": [{"ip": "203.0.113.7"}]}}});
        assert_eq!(host(&c, Some(ip)).as_deref(), Some("203.0.113.7"));
        let name = json!({"metadata": {"name": "demo"},
            "status": {"loadBalancer": {"ingress": [{"hostname": "lb.example.com"}]}}});
        assert_eq!(host(&c, Some(name)).as_deref(), Some("lb.example.com"));

        let c = cluster(ClientServiceType::ClusterIP, false);
        let svc = json!({"metadata": {"name": "demo"}});
        assert_eq!(host(&c, Some(svc)), None);
    }

    /// The operator's series of a cluster read its status: the state by name, the pods the
    /// spec asks for, the Ready ones and the updated ones of each component, and the condemned
    /// replicas.
    #[test]
    fn the_gauges_of_a_cluster_are_read_from_its_status() {
        let status: ClickHouseClusterStatus = serde_json::from_value(json!({
            "state": "error",
            "clickhouse": {"size": 4, "ready": 3, "updated": 2},
            "keeper": {"size": 3, "ready": 3, "updated": 3},
            "replicaStateMap": {
                "c1-0-0": {"shard": 0, "index": 0, "state": "Ready", "isBackupPod": true},
                "c1-0-2": {"shard": 0, "index": 2, "state": "Condemned", "isBackupPod": false}
            }
        }))
        .unwrap();
        assert_eq!(
            gauges(&status),
            ClusterGauges {
                state: "error".into(),
                clickhouse: PodCounts {
                    desired: 4,
                    ready: 3,
                    updated: 2,
                },
                keeper: PodCounts {
                    desired: 3,
                    ready: 3,
                    updated: 3,
                },
                condemned: 1,
            }
        );
        assert_eq!(
            gauges(&ClickHouseClusterStatus::default()),
            ClusterGauges {
                state: "initializing".into(),
                ..ClusterGauges::default()
            }
        );
    }

    /// Every state a cluster's status can name has its series of `cluster_state`, and the
    /// metrics name no other: the states are read from the API's schema, so that a new one
    /// fails here until the metrics list it.
    #[test]
    fn every_cluster_state_has_its_series() {
        use crate::api::ClusterState;
        use crate::runtime::metrics::CLUSTER_STATES;
        fn names(v: &Value, out: &mut Vec<String>) {
            match v {
                Value::Object(m) => {
                    for (k, v) in m {
                        match (k.as_str(), v) {
                            ("enum", Value::Array(a)) => {
                                out.extend(a.iter().filter_map(|s| s.as_str().map(str::to_string)))
                            }
                            ("const", Value::String(s)) => out.push(s.clone()),
                            _ => names(v, out),
                        }
                    }
                }
                Value::Array(a) => a.iter().for_each(|v| names(v, out)),
                _ => {}
            }
        }
        let schema = serde_json::to_value(schemars::schema_for!(ClusterState)).unwrap();
        let mut serialized = Vec::new();
        names(&schema, &mut serialized);
        let mut states: Vec<String> = serialized
            .iter()
            .map(|s| {
                let state: ClusterState = serde_json::from_value(json!(s)).unwrap();
                state.to_string()
            })
            .collect();
        states.sort();
        states.dedup();
        assert!(states.len() >= 6, "{schema}");
        let mut listed: Vec<String> = CLUSTER_STATES.iter().map(|s| s.to_string()).collect();
        listed.sort();
        assert_eq!(states, listed);
    }
}
