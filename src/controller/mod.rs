//! Kubernetes glue: the controllers that observe the world, call the pure planner and act.

pub mod backup;
pub mod cache;
pub mod cluster;
pub mod events;
pub mod exporter_credentials;
pub mod jobs;
pub mod kinds;
pub mod kube;
pub mod pvc_cleaner;
pub mod restore;
pub mod schedule;
pub mod upgrade;

use std::sync::Arc;
use std::time::Instant;

use ::kube::api::{Api, PartialObjectMeta};
use ::kube::runtime::controller::Action;
use ::kube::runtime::{
    Controller, WatchStreamExt, events::Reporter, reflector, reflector::ObjectRef,
    reflector::Store, watcher,
};
use ::kube::{Client, Resource};
use futures::{StreamExt, stream::select_all};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Secret;
use tokio::sync::Semaphore;
use tracing::{info, warn};

use crate::api::defaults::ClusterDefaults;
use crate::api::{ClickHouseBackup, ClickHouseCluster, ClickHouseRestore};
use crate::runtime::backoff::Backoff;
use crate::runtime::metrics::{ErrorLabels, Health, Metrics};
use crate::runtime::settings::{Settings, WatchNamespaces};

/// Field manager of every server-side apply, and the events' reporting controller.
pub const MANAGER: &str = crate::model::diff::FIELD_MANAGER;

/// Shared by every pass.
pub struct Context {
    pub client: Client,
    /// Caches of the ClickHouseClusters, one per watched namespace (or one for all).
    pub clusters: Vec<Store<ClickHouseCluster>>,
    pub metrics: Arc<Metrics>,
    pub cluster_backoff: Backoff,
    pub backup_backoff: Backoff,
    pub restore_backoff: Backoff,
    /// The operator's one recorder of Events, which counts an Event that happens again
    /// instead of writing it again ([`events`]).
    pub events: events::Recorder,
    /// MAX_CONCURRENT_RECONCILES, counted separately for clusters, backups and restores, across
    /// namespaces; taken in the order the passes become due (see [`run_with`]). S2-08, end to
    /// end: `concurrency::with_one_slot_a_second_clusters_pass_waits_for_the_first_and_then_converges`,
    /// `concurrency::backups_restores_and_clusters_each_pass_in_slots_of_their_own`.
    pub cluster_permits: Semaphore,
    pub backup_permits: Semaphore,
    pub restore_permits: Semaphore,
    /// Taken before [`Context::cluster_permits`] by idle health checks only, so that a pass a
    /// change triggers queues behind at most [`crate::runtime::backoff::idle_slots`] of them.
    pub idle_permits: Semaphore,
    /// The last status write of each cluster (see [`cluster::LastWrites`]).
    pub last_writes: cluster::LastWrites,
    /// Faults injected by tests (decision 24); none in the operator binary.
    pub faults: Faults,
    /// The image of backup and restore Jobs (`OPERATOR_IMAGE`).
    pub operator_image: String,
    /// The watch-fed caches passes read (decision 41).
    pub caches: cache::Caches,
    /// Where the operator connects from (`OPERATOR_NETWORKS`, decision 27).
    pub operator_networks: Vec<String>,
    /// Where its pods are (`OPERATOR_POD_SELECTOR`), for the NetworkPolicies.
    pub operator_pods: Option<crate::model::network_policy::OperatorPods>,
    /// Paces the health checks of idle clusters (decision 41).
    pub pacer: crate::runtime::backoff::Pacer,
    /// What the last idle pass of each cluster read, for idle checks at a glance (decision 60).
    pub idle: cluster::idle::Marks,
    /// MAX_CONCURRENT_RECONCILES.
    pub concurrency: u16,
    /// Signs the PVCs handed to the PVC cleaner (decision 39).
    pub pvc_delete_key: crate::runtime::settings::PvcDeleteKey,
    /// Where the exporter's credentials are published (`EXPORTER_CREDENTIALS_SECRET`).
    pub exporter_credentials: Option<exporter_credentials::Publisher>,
    /// Defaults merged under every cluster's spec (`CLUSTER_DEFAULTS_FILE`, decision 52).
    pub cluster_defaults: ClusterDefaults,
    /// The most shards and replicas a cluster may have (`MAX_SHARDS`, `MAX_REPLICAS`).
    pub limits: crate::api::validate::Limits,
}

impl Context {
    pub fn clusters_in(&self, namespace: &str) -> Vec<Arc<ClickHouseCluster>> {
        self.clusters
            .iter()
            .flat_map(|s| s.state())
            .filter(|c| c.metadata.namespace.as_deref() == Some(namespace))
            .collect()
    }

    /// Every cluster of the watched namespaces, as cached.
    pub fn all_clusters(&self) -> Vec<Arc<ClickHouseCluster>> {
        self.clusters.iter().flat_map(|s| s.state()).collect()
    }

    pub fn cluster(&self, namespace: &str, name: &str) -> Option<Arc<ClickHouseCluster>> {
        let key = ObjectRef::<ClickHouseCluster>::new(name).within(namespace);
        self.clusters.iter().find_map(|s| s.get(&key))
    }

    /// [`Context::cluster`], asking the API server when the cache does not have it: a cache
    /// that is still filling after the operator started (or lags behind) is no proof that the
    /// cluster is gone, and a backup or restore fails for a deleted cluster.
    pub async fn cluster_or_api(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<Arc<ClickHouseCluster>>, ::kube::Error> {
        if let Some(c) = self.cluster(namespace, name) {
            return Ok(Some(c));
        }
        Ok(api::<ClickHouseCluster>(self, namespace)
            .get_opt(name)
            .await?
            .map(Arc::new))
    }
}

/// Runs the controllers until a shutdown signal. `lost_leadership` resolves when this replica
/// must stop acting; the function then returns an error.
pub async fn run(
    settings: &Settings,
    client: Client,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
    lost_leadership: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    run_with(
        settings,
        client,
        metrics,
        health,
        lost_leadership,
        Faults::default(),
    )
    .await
}

/// Where the executor is: about to run a step, or just ran it (before anything records it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StepPoint {
    Before,
    After,
}

/// Called before and after each step: `true` stops the pass right there, as if the process had
/// died (fault-injection tests, decision 24; never set in the operator binary).
pub type AfterStep = Arc<dyn Fn(StepPoint, &crate::plan::step::Step) -> bool + Send + Sync>;

/// The same for a backup or restore pass ([`jobs`]): called before and after each step of its
/// plan (named by [`crate::plan::backup::Step::describe`]) and after its status write
/// (`"write status <state>"`); `true` stops the pass there, as if the process had died.
pub type AfterJobStep = Arc<dyn Fn(StepPoint, &str) -> bool + Send + Sync>;

/// Given the cluster as the watch cache holds it when a pass starts, the copy the pass gets
/// instead: an older one plays a cache that lags behind the API server (decision 24).
pub type StaleCache = Arc<dyn Fn(Arc<ClickHouseCluster>) -> Arc<ClickHouseCluster> + Send + Sync>;

/// Faults a test injects into the controllers.
#[derive(Clone, Default)]
pub struct Faults {
    pub after_step: Option<AfterStep>,
    pub after_job_step: Option<AfterJobStep>,
    pub stale_cache: Option<StaleCache>,
}

/// [`run`], with faults injected.
pub async fn run_with(
    settings: &Settings,
    client: Client,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
    lost_leadership: impl std::future::Future<Output = ()> + Send + 'static,
    faults: Faults,
) -> anyhow::Result<()> {
    let cluster_defaults = cluster_defaults(settings).map_err(anyhow::Error::msg)?;
    let namespaces: Vec<Option<String>> = match &settings.watch_namespaces {
        WatchNamespaces::All => vec![None],
        WatchNamespaces::Only(list) => list.iter().cloned().map(Some).collect(),
    };
    let mut cluster_controllers = Vec::new();
    let mut stores = Vec::new();
    let mut caches = cache::Caches::default();
    for ns in &namespaces {
        let (ctl, store) = cluster_controller(&client, ns.as_deref(), &mut caches);
        stores.push(store);
        cluster_controllers.push(ctl);
    }
    let ctx = Arc::new(Context::new(
        settings,
        cluster_defaults,
        client.clone(),
        stores,
        metrics,
        caches,
        faults,
    ));
    // MAX_CONCURRENT_RECONCILES is enforced by the permits each pass takes first (tokio's
    // semaphore hands them out first come, first served), not by the runtime's own limit: at
    // its limit the runtime parks every due object in a hash set and takes whichever it finds
    // first when a slot frees, so with many clusters the same few are passed again and again
    // and the others never (1000 clusters on one slot: 5203 passes in 9 minutes went to 329 of
    // them, 671 never had a first pass). Unlimited, it hands every due object over at once, to
    // wait for a permit in order.
    let config = ::kube::runtime::controller::Config::default().concurrency(0);
    let mut streams = Vec::new();
    for ctl in cluster_controllers {
        streams.push(
            ctl.with_config(config.clone())
                .shutdown_on_signal()
                .run(cluster::reconcile, cluster::error_policy, ctx.clone())
                .map(|_| ())
                .boxed(),
        );
    }
    for ns in &namespaces {
        streams.push(job_controller::<ClickHouseBackup>(
            &client,
            ns.as_deref(),
            &config,
            &ctx,
        ));
    }
    for ns in &namespaces {
        streams.push(job_controller::<ClickHouseRestore>(
            &client,
            ns.as_deref(),
            &config,
            &ctx,
        ));
    }
    if settings.pvc_cleaner {
        tokio::spawn(pvc_cleaner::run(
            client.clone(),
            settings.watch_namespaces.clone(),
            settings.pvc_delete_key.clone(),
        ));
    }
    health
        .ready
        .store(true, std::sync::atomic::Ordering::Relaxed);
    info!(namespaces = ?settings.watch_namespaces, concurrency = settings.max_concurrent_reconciles, operator_networks = ?settings.operator_networks, "controllers started");
    let all = select_all(streams).for_each(|_| futures::future::ready(()));
    tokio::select! {
        _ = all => Ok(()),
        _ = schedule::run(ctx.clone()) => Ok(()),
        _ = ctx.events.run() => Ok(()),
        _ = lost_leadership => anyhow::bail!("lost the leader lease: stopping so that only one replica acts"),
    }
}

/// The controller of the ClickHouseClusters of namespace `ns` (every namespace: `None`), with
/// the watches that feed `caches` and trigger its passes, and its cache of the clusters.
fn cluster_controller(
    client: &Client,
    ns: Option<&str>,
    caches: &mut cache::Caches,
) -> (Controller<ClickHouseCluster>, Store<ClickHouseCluster>) {
    // the clusters as `Controller::new` watches them, each kept without what no pass reads
    let writer = reflector::store::Writer::<ClickHouseCluster>::default();
    let store = writer.as_reader();
    let clusters = reflector(
        writer,
        watcher(
            kube::namespaced_or_all::<ClickHouseCluster>(client, ns),
            watcher::Config::default(),
        )
        .modify(slim_cluster),
    )
    .applied_objects();
    let ctl = Controller::for_stream(clusters, store.clone());
    let secret_store = store.clone();
    // Each watch keeps its cache before it triggers the pass, so a pass sees the event
    // that started it.
    let ctl = cache::watch(ctl, &mut caches.objects, client, ns);
    let secret_meta = cache::Index::new(|_| None);
    let backups = cache::Index::new(|b: &ClickHouseBackup| Some(b.spec.cluster_name.clone()));
    caches.secret_meta.push(secret_meta.clone());
    caches.backups.push(backups.clone());
    let ctl = ctl
        .watches_stream(
            cache::feed(
                backups,
                kube::namespaced_or_all(client, ns),
                watcher::Config::default(),
            ),
            |b: ClickHouseBackup| {
                let ns = b.metadata.namespace.clone()?;
                Some(ObjectRef::new(&b.spec.cluster_name).within(&ns))
            },
        )
        .watches_stream(
            cache::feed(
                secret_meta,
                kube::namespaced_or_all::<PartialObjectMeta<Secret>>(client, ns),
                watcher::Config::default(),
            ),
            move |secret| cluster::clusters_referencing_secret(&secret_store.state(), &secret),
        );
    (ctl, store)
}

/// `kubectl apply`'s copy of the last configuration it applied, kept as an annotation.
const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// What the operator keeps of a watched ClickHouseCluster: all of it but its managed fields and
/// `kubectl apply`'s copy of its spec ([`LAST_APPLIED`]), which no pass reads: 4.4 MB of the
/// 26.7 MB live heap of 200 small clusters (benchmarks/scale.md). A pass that must see the
/// resource as stored reads it from the API server.
fn slim_cluster(c: &mut ClickHouseCluster) {
    c.metadata.managed_fields = None;
    if let Some(a) = c.metadata.annotations.as_mut() {
        a.remove(LAST_APPLIED);
    }
}

/// The running controller of the backups or restores (`K`) of namespace `ns` (every namespace:
/// `None`), triggered by their agent Jobs too.
fn job_controller<K: jobs::JobResource>(
    client: &Client,
    ns: Option<&str>,
    config: &::kube::runtime::controller::Config,
    ctx: &Arc<Context>,
) -> futures::stream::BoxStream<'static, ()> {
    Controller::new(
        kube::namespaced_or_all::<K>(client, ns),
        watcher::Config::default(),
    )
    .owns(
        kube::namespaced_or_all::<Job>(client, ns),
        watcher::Config::default().labels(crate::model::job::BACKUP_LABEL),
    )
    .with_config(config.clone())
    .shutdown_on_signal()
    .run(jobs::reconcile::<K>, jobs::error_policy::<K>, ctx.clone())
    .map(|_| ())
    .boxed()
}

impl Context {
    /// The context of the controllers: `stores` and `caches` are the watches' caches,
    /// `cluster_defaults` the defaults of `settings` ([`cluster_defaults`]).
    fn new(
        settings: &Settings,
        cluster_defaults: ClusterDefaults,
        client: Client,
        stores: Vec<Store<ClickHouseCluster>>,
        metrics: Arc<Metrics>,
        caches: cache::Caches,
        faults: Faults,
    ) -> Context {
        Context {
            client: client.clone(),
            clusters: stores,
            metrics,
            cluster_backoff: Backoff::default(),
            backup_backoff: Backoff::default(),
            restore_backoff: Backoff::default(),
            events: events::Recorder::new(
                client,
                Reporter {
                    controller: MANAGER.into(),
                    instance: Some(settings.identity.clone()),
                },
            ),
            cluster_permits: Semaphore::new(settings.max_concurrent_reconciles.into()),
            backup_permits: Semaphore::new(settings.max_concurrent_reconciles.into()),
            restore_permits: Semaphore::new(settings.max_concurrent_reconciles.into()),
            idle_permits: Semaphore::new(crate::runtime::backoff::idle_slots(
                settings.max_concurrent_reconciles,
            )),
            last_writes: cluster::LastWrites::default(),
            faults,
            operator_image: settings.operator_image.clone(),
            operator_networks: settings.operator_networks.clone(),
            operator_pods: settings.operator_pod_labels.clone().map(|labels| {
                crate::model::network_policy::OperatorPods {
                    namespace: settings.lease_namespace.clone(),
                    labels,
                }
            }),
            caches,
            pacer: Default::default(),
            idle: Default::default(),
            concurrency: settings.max_concurrent_reconciles,
            pvc_delete_key: settings.pvc_delete_key.clone(),
            exporter_credentials: settings.exporter_credentials.clone().map(|name| {
                exporter_credentials::Publisher::new(settings.lease_namespace.clone(), name)
            }),
            cluster_defaults,
            limits: settings.limits,
        }
    }
}

/// The operator-level defaults merged under every cluster's spec (decision 52): those of the
/// file `CLUSTER_DEFAULTS_FILE` names, as the settings read it at start; none without it. A
/// field that cannot take a default is refused, naming the file: the operator does not start.
pub fn cluster_defaults(settings: &Settings) -> Result<ClusterDefaults, String> {
    match &settings.cluster_defaults_file {
        None => Ok(ClusterDefaults::default()),
        Some(file) => ClusterDefaults::parse(&file.text)
            .map_err(|e| format!("CLUSTER_DEFAULTS_FILE {:?}: {e}", file.path)),
    }
}

/// The API of a namespaced kind in one namespace.
pub fn api<K>(ctx: &Context, ns: &str) -> Api<K>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>,
{
    kube::namespaced(&ctx.client, ns)
}

/// Publishes `events` (type, reason, note) about `object` through the operator's recorder
/// ([`events`]), each note cut to 1000 characters; an event that cannot be published is
/// logged, never fails the pass.
pub async fn publish_events<K>(
    ctx: &Context,
    object: &K,
    events: impl IntoIterator<Item = (crate::plan::EventType, &'static str, String)>,
    action: &'static str,
) where
    K: Resource<DynamicType = ()>,
{
    let reference = object.object_ref(&());
    for (kind, reason, message) in events {
        let event = crate::plan::PlannedEvent {
            kind,
            reason,
            action,
            message,
        };
        ctx.events.publish(&reference, &event).await;
    }
}

/// After a failed pass of an object of `kind`: counts the error under `reason`, logs it and
/// asks for a retry after the object's backoff delay (S2-05).
pub fn retry_later(
    kind: &'static str,
    key: &str,
    reason: &str,
    error: &dyn std::fmt::Display,
    backoff: &Backoff,
    ctx: &Context,
) -> Action {
    let delay = backoff.failed(key);
    ctx.metrics
        .errors
        .get_or_create(&ErrorLabels {
            kind: kind.into(),
            reason: reason.into(),
        })
        .inc();
    warn!(kind, object = %key, error = %error, retry_in_ms = delay.as_millis() as u64, failures = backoff.failures(key), "pass failed");
    Action::requeue(delay)
}

/// Times a pass and counts it.
pub struct PassTimer<'a> {
    kind: &'static str,
    started: Instant,
    metrics: &'a Metrics,
}

impl<'a> PassTimer<'a> {
    pub fn start(kind: &'static str, metrics: &'a Metrics) -> Self {
        metrics.pass_started(kind);
        PassTimer {
            kind,
            started: Instant::now(),
            metrics,
        }
    }
}

impl Drop for PassTimer<'_> {
    fn drop(&mut self) {
        self.metrics.observe_pass(self.kind, self.started.elapsed());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A watched cluster is kept without its managed fields and `kubectl apply`'s copy of its
    /// spec; its spec, status and every other annotation (the operator's own among them) stay.
    #[test]
    fn a_watched_cluster_is_kept_without_managed_fields_and_kubectls_copy() {
        let mut c: ClickHouseCluster = serde_json::from_value(serde_json::json!({
            "apiVersion": "clickhouse.com/v1alpha1", "kind": "ClickHouseCluster",
            "metadata": {"name": "c1", "namespace": "ns", "annotations": {
                LAST_APPLIED: "{\"spec\":{\"shards\":2}}",
                crate::plan::pass::REPLACE_REPLICAS: "c1-0-0"},
                "managedFields": [{"manager": "kubectl", "operation": "Apply",
                    "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {}}}]},
            "spec": {"shards": 2},
            "status": {"state": "ready"}
        }))
        .unwrap();
        let before = c.clone();
        slim_cluster(&mut c);
        assert!(c.metadata.managed_fields.is_none());
        let annotations = c.metadata.annotations.clone().unwrap();
        assert!(!annotations.contains_key(LAST_APPLIED));
        assert_eq!(annotations[crate::plan::pass::REPLACE_REPLICAS], "c1-0-0");
        assert_eq!(c.spec, before.spec);
        assert_eq!(c.status, before.status);
    }

    /// Decision 52: `CLUSTER_DEFAULTS_FILE` is read and checked at start: a file that cannot be
    /// read or holds a field that cannot take a default stops the operator, naming it.
    #[test]
    fn cluster_defaults_are_read_at_start_and_a_bad_file_stops_it() {
        let dir = std::env::temp_dir().join(format!("chop-defaults-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let with = |text: &str| {
            let path = dir.join("d.yaml");
            std::fs::write(&path, text).unwrap();
            let path = path.display().to_string();
            let settings = Settings::from_lookup(move |k| {
                (k == "CLUSTER_DEFAULTS_FILE").then(|| path.clone())
            })?;
            cluster_defaults(&settings)
        };
        let ok = with("pod: {nodeSelector: {pool: db}}").unwrap();
        assert!(!ok.is_empty());
        let e = with("shards: 3").unwrap_err();
        assert!(
            e.contains("CLUSTER_DEFAULTS_FILE") && e.contains("shards"),
            "{e}"
        );
        let e = Settings::from_lookup(|k| {
            (k == "CLUSTER_DEFAULTS_FILE").then(|| "/nonexistent/defaults.yaml".to_string())
        })
        .and_then(|s| cluster_defaults(&s))
        .unwrap_err();
        assert!(e.contains("cannot read"), "{e}");
        assert!(
            cluster_defaults(&Settings::from_lookup(|_| None).unwrap())
                .unwrap()
                .is_empty()
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
