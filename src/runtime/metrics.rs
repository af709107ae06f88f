//! Prometheus metrics, and the HTTP server for `/metrics`, `/healthz` and `/readyz`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use axum::{Router, extract::State, http::StatusCode, routing::get};
use prometheus_client::encoding::{EncodeLabelSet, LabelSetEncoder};
use prometheus_client::metrics::{
    counter::Counter, family::Family, gauge::Gauge, histogram::Histogram,
};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabels {
    pub kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ErrorLabels {
    pub kind: String,
    pub reason: String,
}

/// The label that names a ClickHouseCluster on a series (the operator's and the exporter's):
/// `clickhouse_cluster` by default, which leaves `cluster` to the Kubernetes cluster a
/// multi-cluster Prometheus (Thanos, Mimir, kube-prometheus) gives every series, or `cluster`,
/// the name of earlier versions.
#[derive(Clone, Copy, Debug, Default, Hash, PartialEq, Eq)]
pub enum ClusterLabel {
    #[default]
    ClickHouseCluster,
    Cluster,
}

impl ClusterLabel {
    /// The label's name.
    pub fn name(self) -> &'static str {
        match self {
            ClusterLabel::ClickHouseCluster => "clickhouse_cluster",
            ClusterLabel::Cluster => "cluster",
        }
    }

    /// From the value of the environment variable `variable`: `clickhouse_cluster` or
    /// `cluster`; unset or empty, the default.
    pub fn parse(value: Option<&str>, variable: &str) -> Result<ClusterLabel, String> {
        match value.map(str::trim) {
            None | Some("") | Some("clickhouse_cluster") => Ok(ClusterLabel::ClickHouseCluster),
            Some("cluster") => Ok(ClusterLabel::Cluster),
            Some(other) => Err(format!(
                "{variable}: {other:?} is neither clickhouse_cluster nor cluster"
            )),
        }
    }
}

/// One cluster: `namespace` and the cluster under its [`ClusterLabel`].
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct ClusterLabels {
    pub namespace: String,
    pub cluster: String,
    pub label: ClusterLabel,
}

impl EncodeLabelSet for ClusterLabels {
    fn encode(&self, encoder: &mut LabelSetEncoder) -> Result<(), std::fmt::Error> {
        [
            ("namespace", self.namespace.as_str()),
            (self.label.name(), self.cluster.as_str()),
        ]
        .encode(encoder)
    }
}

/// One state of one cluster.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct StateLabels {
    pub cluster: ClusterLabels,
    pub state: String,
}

impl EncodeLabelSet for StateLabels {
    fn encode(&self, encoder: &mut LabelSetEncoder) -> Result<(), std::fmt::Error> {
        self.cluster.encode(encoder)?;
        [("state", self.state.as_str())].encode(encoder)
    }
}

/// A count of one component's pods of one cluster: `desired`, `ready` or `updated`.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct PodCountLabels {
    pub cluster: ClusterLabels,
    pub component: String,
    pub count: String,
}

impl EncodeLabelSet for PodCountLabels {
    fn encode(&self, encoder: &mut LabelSetEncoder) -> Result<(), std::fmt::Error> {
        self.cluster.encode(encoder)?;
        [
            ("component", self.component.as_str()),
            ("count", self.count.as_str()),
        ]
        .encode(encoder)
    }
}

/// One queue, as controller-runtime labels its `workqueue_*` series: `name` and `controller`,
/// both the controller's name (the kind in lower case, `clickhousecluster`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct QueueLabels {
    pub name: String,
    pub controller: String,
}

/// One controller, as controller-runtime labels its `controller_runtime_*` series.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ControllerLabels {
    pub controller: String,
}

/// How a pass ended, as controller-runtime's `controller_runtime_reconcile_total` says it:
/// `success` (nothing to do until a change), `requeue_after` (due again after a delay) or
/// `error`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabels {
    pub controller: String,
    pub result: String,
}

/// The name controller-runtime would give the controller of `kind`: the kind in lower case.
pub fn controller_name(kind: &str) -> String {
    kind.to_ascii_lowercase()
}

/// Where a pass read the Kubernetes objects of its cluster: `cache` or `api`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SourceLabels {
    pub source: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BuildLabels {
    pub version: String,
}

/// A pass waiting for its slot (see [`Metrics::queued`]).
pub struct Queued<'a> {
    metrics: &'a Metrics,
    labels: QueueLabels,
    since: std::time::Instant,
    done: bool,
}

impl Queued<'_> {
    /// The pass has its slot: out of the queue, its wait observed.
    pub fn started(mut self) {
        self.leave();
    }

    fn leave(&mut self) {
        if !self.done {
            self.done = true;
            self.metrics.queue_depth.get_or_create(&self.labels).dec();
            self.metrics
                .queue_wait
                .get_or_create(&self.labels)
                .observe(self.since.elapsed().as_secs_f64());
        }
    }
}

impl Drop for Queued<'_> {
    fn drop(&mut self) {
        self.leave();
    }
}

/// The states a cluster can report, each a series of `cluster_state`: the names its status
/// gives them (the controller's tests keep them the same as the API's).
pub const CLUSTER_STATES: [&str; 6] = [
    "initializing",
    "ready",
    "paused",
    "stopping",
    "error",
    "suspended",
];

/// What the series of one cluster show, read from the status it reports
/// ([`Metrics::record_cluster`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClusterGauges {
    /// The state in its status, one of [`CLUSTER_STATES`].
    pub state: String,
    /// Its servers' pods.
    pub clickhouse: PodCounts,
    /// Its Keeper's pods.
    pub keeper: PodCounts,
    /// Its replicas being removed by a scale-in.
    pub condemned: i64,
}

/// The pods of one component of a cluster.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PodCounts {
    /// Pods the spec asks for.
    pub desired: i64,
    /// Pods that are Ready.
    pub ready: i64,
    /// Ready pods on the current revision.
    pub updated: i64,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ObjectLabels {
    pub kind: String,
    pub namespace: String,
    pub name: String,
}

pub struct Metrics {
    pub reconciles: Family<KindLabels, Counter>,
    pub errors: Family<ErrorLabels, Counter>,
    pub duration: Family<KindLabels, Histogram>,
    pub last_success: Family<ObjectLabels, Gauge<f64, std::sync::atomic::AtomicU64>>,
    pub writes: Family<KindLabels, Counter>,
    /// Per cluster and state: 1 for the state in the status, 0 for the others.
    pub cluster_state: Family<StateLabels, Gauge>,
    pub cluster_pods: Family<PodCountLabels, Gauge>,
    pub cluster_condemned: Family<ClusterLabels, Gauge>,
    pub last_backup: Family<ClusterLabels, Gauge<f64, std::sync::atomic::AtomicU64>>,
    /// Backups and restores that failed, by kind and reason.
    pub backup_failures: Family<ErrorLabels, Counter>,
    pub build_info: Family<BuildLabels, Gauge>,
    pub observations: Family<SourceLabels, Counter>,
    /// controller-runtime's `workqueue_depth`: passes due and waiting for a slot
    /// (MAX_CONCURRENT_RECONCILES).
    pub queue_depth: Family<QueueLabels, Gauge>,
    /// controller-runtime's `workqueue_adds_total`: passes that became due.
    pub queue_adds: Family<QueueLabels, Counter>,
    /// controller-runtime's `workqueue_queue_duration_seconds`: how long a due pass waited
    /// for its slot.
    pub queue_wait: Family<QueueLabels, Histogram>,
    /// controller-runtime's `workqueue_work_duration_seconds`: how long a pass took.
    pub work_duration: Family<QueueLabels, Histogram>,
    /// controller-runtime's `workqueue_retries_total`: failed passes due again after their
    /// backoff.
    pub queue_retries: Family<QueueLabels, Counter>,
    /// controller-runtime's `controller_runtime_reconcile_total`, by result.
    pub reconcile_results: Family<ResultLabels, Counter>,
    /// controller-runtime's `controller_runtime_reconcile_errors_total`.
    pub reconcile_errors: Family<ControllerLabels, Counter>,
    /// controller-runtime's `controller_runtime_reconcile_time_seconds`.
    pub reconcile_time: Family<ControllerLabels, Histogram>,
    /// controller-runtime's `controller_runtime_active_workers`: passes running now.
    pub active_workers: Family<ControllerLabels, Gauge>,
    /// controller-runtime's `controller_runtime_max_concurrent_reconciles`.
    pub max_concurrent: Family<ControllerLabels, Gauge>,
    /// The label that names the cluster on the per-cluster series.
    pub cluster_label: ClusterLabel,
    pub registry: Registry,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new(ClusterLabel::default())
    }
}

impl Metrics {
    /// The operator's metrics, its per-cluster series naming the cluster `cluster_label`
    /// (`METRICS_CLUSTER_LABEL`).
    pub fn new(cluster_label: ClusterLabel) -> Self {
        let pass_buckets =
            || Histogram::new([0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0]);
        let mut metrics = Metrics {
            reconciles: Family::default(),
            errors: Family::default(),
            duration: Family::new_with_constructor(pass_buckets),
            last_success: Family::default(),
            writes: Family::default(),
            cluster_state: Family::default(),
            cluster_pods: Family::default(),
            cluster_condemned: Family::default(),
            last_backup: Family::default(),
            backup_failures: Family::default(),
            build_info: Family::default(),
            observations: Family::default(),
            queue_depth: Family::default(),
            queue_adds: Family::default(),
            queue_wait: Family::new_with_constructor(|| {
                Histogram::new([0.001, 0.01, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0])
            }),
            work_duration: Family::new_with_constructor(pass_buckets),
            queue_retries: Family::default(),
            reconcile_results: Family::default(),
            reconcile_errors: Family::default(),
            reconcile_time: Family::new_with_constructor(pass_buckets),
            active_workers: Family::default(),
            max_concurrent: Family::default(),
            cluster_label,
            registry: Registry::default(),
        };
        metrics.register_runtime();
        metrics.register_operator();
        metrics
            .build_info
            .get_or_create(&BuildLabels {
                version: crate::version::OPERATOR_VERSION.to_string(),
            })
            .set(1);
        metrics
    }

    /// Registers the series of controller-runtime's names, without a prefix: what controller
    /// dashboards read.
    fn register_runtime(&mut self) {
        let root = &mut self.registry;
        root.register(
            "workqueue_depth",
            "Passes due and waiting for a slot (MAX_CONCURRENT_RECONCILES), per controller",
            self.queue_depth.clone(),
        );
        root.register(
            "workqueue_adds",
            "Passes that became due, per controller",
            self.queue_adds.clone(),
        );
        root.register(
            "workqueue_queue_duration_seconds",
            "How long a due pass waited for its slot, per controller",
            self.queue_wait.clone(),
        );
        root.register(
            "workqueue_work_duration_seconds",
            "How long a pass took, per controller",
            self.work_duration.clone(),
        );
        root.register(
            "workqueue_retries",
            "Failed passes due again after their backoff, per controller",
            self.queue_retries.clone(),
        );
        root.register(
            "controller_runtime_reconcile",
            "Passes per controller, by result: success, requeue_after or error",
            self.reconcile_results.clone(),
        );
        root.register(
            "controller_runtime_reconcile_errors",
            "Passes that failed, per controller",
            self.reconcile_errors.clone(),
        );
        root.register(
            "controller_runtime_reconcile_time_seconds",
            "How long a pass took, per controller",
            self.reconcile_time.clone(),
        );
        root.register(
            "controller_runtime_active_workers",
            "Passes running now, per controller",
            self.active_workers.clone(),
        );
        root.register(
            "controller_runtime_max_concurrent_reconciles",
            "Passes of one controller that may run at once (MAX_CONCURRENT_RECONCILES)",
            self.max_concurrent.clone(),
        );
    }

    /// Registers the operator's own series, prefixed `clickhouse_operator_`.
    fn register_operator(&mut self) {
        let registry = self
            .registry
            .sub_registry_with_prefix("clickhouse_operator");
        registry.register(
            "reconciles",
            "Reconcile passes started",
            self.reconciles.clone(),
        );
        registry.register(
            "reconcile_errors",
            "Reconcile passes that failed, by reason",
            self.errors.clone(),
        );
        registry.register(
            "reconcile_duration_seconds",
            "Duration of reconcile passes",
            self.duration.clone(),
        );
        registry.register(
            "last_successful_reconcile_timestamp_seconds",
            "Unix time of the last successful pass of each object",
            self.last_success.clone(),
        );
        registry.register(
            "api_writes",
            "Write requests sent to the Kubernetes API, by kind of object",
            self.writes.clone(),
        );
        registry.register(
            "cluster_state",
            "1 for the state in each ClickHouseCluster's status, 0 for the others",
            self.cluster_state.clone(),
        );
        registry.register(
            "cluster_pods",
            "Pods of each cluster's servers and Keeper: desired, ready, updated (ready on the current revision)",
            self.cluster_pods.clone(),
        );
        registry.register(
            "cluster_condemned_replicas",
            "Replicas of each cluster being removed by a scale-in",
            self.cluster_condemned.clone(),
        );
        registry.register(
            "cluster_last_successful_backup_timestamp_seconds",
            "Unix time at which the newest successful ClickHouseBackup of each cluster completed",
            self.last_backup.clone(),
        );
        registry.register(
            "backup_failures",
            "ClickHouseBackups and ClickHouseRestores that failed, by kind and reason (the reason of their status)",
            self.backup_failures.clone(),
        );
        registry.register(
            "build_info",
            "The operator's version",
            self.build_info.clone(),
        );
        registry.register(
            "cluster_observations",
            "Passes of clusters by where they read the Kubernetes objects: the watch-fed caches, or the API server (after the operator's own writes, or before the caches are filled); glance: an idle check that found the caches unchanged and the servers saying what they said, and went no further",
            self.observations.clone(),
        );
    }

    /// Counts a pass that read its objects from `source` (`cache` or `api`), or an idle check
    /// that stopped at a glance (`glance`).
    pub fn observed(&self, source: &str) {
        self.observations
            .get_or_create(&SourceLabels {
                source: source.into(),
            })
            .inc();
    }

    /// A pass of `kind` is due and waits for its slot: counted in the queue depth until the
    /// returned guard says it [`Queued::started`] (or is dropped), then its wait observed.
    pub fn queued<'a>(&'a self, kind: &str) -> Queued<'a> {
        let labels = queue_labels(kind);
        self.queue_adds.get_or_create(&labels).inc();
        self.queue_depth.get_or_create(&labels).inc();
        Queued {
            metrics: self,
            labels,
            since: std::time::Instant::now(),
            done: false,
        }
    }

    /// How many passes of each of `kinds` may run at once.
    pub fn set_max_concurrent_reconciles(&self, kinds: &[&str], slots: u16) {
        for kind in kinds {
            self.max_concurrent
                .get_or_create(&controller_labels(kind))
                .set(i64::from(slots));
        }
    }

    /// A pass of `kind` has its slot and starts (counted, and running until
    /// [`Metrics::observe_pass`]).
    pub fn pass_started(&self, kind: &str) {
        self.reconciles
            .get_or_create(&KindLabels { kind: kind.into() })
            .inc();
        self.active_workers
            .get_or_create(&controller_labels(kind))
            .inc();
    }

    /// A pass of `kind` that started ended after `took`.
    pub fn observe_pass(&self, kind: &str, took: Duration) {
        let took = took.as_secs_f64();
        self.duration
            .get_or_create(&KindLabels { kind: kind.into() })
            .observe(took);
        self.reconcile_time
            .get_or_create(&controller_labels(kind))
            .observe(took);
        self.work_duration
            .get_or_create(&queue_labels(kind))
            .observe(took);
        self.active_workers
            .get_or_create(&controller_labels(kind))
            .dec();
    }

    /// How a pass of `kind` ended: `await_change` is a success, another action a requeue after
    /// a delay, an error an error that is retried after its backoff.
    pub fn reconciled<E>(&self, kind: &str, result: &Result<kube::runtime::controller::Action, E>) {
        let result = match result {
            Ok(action) if *action == kube::runtime::controller::Action::await_change() => "success",
            Ok(_) => "requeue_after",
            Err(_) => {
                self.reconcile_errors
                    .get_or_create(&controller_labels(kind))
                    .inc();
                self.queue_retries.get_or_create(&queue_labels(kind)).inc();
                "error"
            }
        };
        self.reconcile_results
            .get_or_create(&ResultLabels {
                controller: controller_name(kind),
                result: result.into(),
            })
            .inc();
    }

    fn cluster_labels(&self, namespace: &str, cluster: &str) -> ClusterLabels {
        ClusterLabels {
            namespace: namespace.into(),
            cluster: cluster.into(),
            label: self.cluster_label,
        }
    }

    /// The series of a cluster from the status it reports.
    pub fn record_cluster(&self, namespace: &str, cluster: &str, gauges: &ClusterGauges) {
        let labels = self.cluster_labels(namespace, cluster);
        for state in CLUSTER_STATES {
            self.cluster_state
                .get_or_create(&StateLabels {
                    cluster: labels.clone(),
                    state: state.to_string(),
                })
                .set(i64::from(state == gauges.state));
        }
        for (component, c) in [
            ("clickhouse", &gauges.clickhouse),
            ("keeper", &gauges.keeper),
        ] {
            for (count, v) in [
                ("desired", c.desired),
                ("ready", c.ready),
                ("updated", c.updated),
            ] {
                self.cluster_pods
                    .get_or_create(&PodCountLabels {
                        cluster: labels.clone(),
                        component: component.into(),
                        count: count.into(),
                    })
                    .set(v);
            }
        }
        self.cluster_condemned
            .get_or_create(&labels)
            .set(gauges.condemned);
    }

    /// A backup of `cluster` that completed at `unix` seconds (the newest one counts).
    pub fn record_backup(&self, namespace: &str, cluster: &str, unix: f64) {
        let g = self
            .last_backup
            .get_or_create(&self.cluster_labels(namespace, cluster));
        if unix > g.get() {
            g.set(unix);
        }
    }

    /// Counts a backup or restore (`kind`) that failed for `reason`.
    pub fn record_backup_failure(&self, kind: &str, reason: &str) {
        self.backup_failures
            .get_or_create(&ErrorLabels {
                kind: kind.into(),
                reason: reason.into(),
            })
            .inc();
    }

    /// Removes every series of a deleted cluster.
    pub fn forget_cluster(&self, namespace: &str, cluster: &str) {
        let labels = self.cluster_labels(namespace, cluster);
        for state in CLUSTER_STATES {
            self.cluster_state.remove(&StateLabels {
                cluster: labels.clone(),
                state: state.to_string(),
            });
        }
        for component in ["clickhouse", "keeper"] {
            for count in ["desired", "ready", "updated"] {
                self.cluster_pods.remove(&PodCountLabels {
                    cluster: labels.clone(),
                    component: component.into(),
                    count: count.into(),
                });
            }
        }
        self.cluster_condemned.remove(&labels);
        self.last_backup.remove(&labels);
        self.last_success.remove(&ObjectLabels {
            kind: "ClickHouseCluster".into(),
            namespace: namespace.into(),
            name: cluster.into(),
        });
    }

    pub fn encode(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)
            .expect("encoding metrics into a String cannot fail");
        out
    }
}

fn queue_labels(kind: &str) -> QueueLabels {
    QueueLabels {
        name: controller_name(kind),
        controller: controller_name(kind),
    }
}

fn controller_labels(kind: &str) -> ControllerLabels {
    ControllerLabels {
        controller: controller_name(kind),
    }
}

/// Liveness and readiness of the process.
#[derive(Default)]
pub struct Health {
    /// Set once the controllers' caches are running (the standby is ready too: it serves metrics).
    pub ready: AtomicBool,
}

#[derive(Clone)]
struct AppState {
    metrics: Arc<Metrics>,
    health: Arc<Health>,
}

async fn metrics_handler(
    State(s): State<AppState>,
) -> (StatusCode, [(&'static str, &'static str); 1], String) {
    (
        StatusCode::OK,
        [(
            "content-type",
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        s.metrics.encode(),
    )
}

async fn readyz(State(s): State<AppState>) -> (StatusCode, &'static str) {
    if s.health.ready.load(Ordering::Relaxed) {
        (StatusCode::OK, "ok")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "starting")
    }
}

/// Serves `/metrics`, `/healthz` and `/readyz` on `addr` until the process ends.
pub async fn serve(
    addr: SocketAddr,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
) -> std::io::Result<()> {
    let app = Router::new()
        .route("/metrics", get(metrics_handler))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .with_state(AppState { metrics, health });
    let listener = tokio::net::TcpListener::bind(addr).await?;
    axum::serve(listener, app).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_are_exposed_with_their_labels() {
        let m = Metrics::default();
        m.reconciles
            .get_or_create(&KindLabels {
                kind: "ClickHouseCluster".into(),
            })
            .inc();
        m.errors
            .get_or_create(&ErrorLabels {
                kind: "ClickHouseCluster".into(),
                reason: "InvalidSpec".into(),
            })
            .inc();
        m.observe_pass("ClickHouseCluster", Duration::from_millis(30));
        m.last_success
            .get_or_create(&ObjectLabels {
                kind: "ClickHouseCluster".into(),
                namespace: "t1".into(),
                name: "c1".into(),
            })
            .set(1.7e9);
        let text = m.encode();
        assert!(
            text.contains("clickhouse_operator_reconciles_total{kind=\"ClickHouseCluster\"} 1"),
            "{text}"
        );
        assert!(text.contains("reason=\"InvalidSpec\""));
        assert!(text.contains("clickhouse_operator_reconcile_duration_seconds_bucket"));
        assert!(text.contains("clickhouse_operator_last_successful_reconcile_timestamp_seconds{"));
    }

    /// controller-runtime's queue metrics, under its names and labels (`name`, `controller`):
    /// a due pass is added and counts in `workqueue_depth` until it has its slot, and its wait
    /// is observed then (or when it gives up waiting).
    #[test]
    fn the_queue_depth_counts_passes_waiting_for_a_slot_under_controller_runtimes_names() {
        let m = Metrics::default();
        let a = m.queued("ClickHouseCluster");
        let b = m.queued("ClickHouseCluster");
        let depth = |m: &Metrics| {
            m.queue_depth
                .get_or_create(&queue_labels("ClickHouseCluster"))
                .get()
        };
        assert_eq!(depth(&m), 2);
        a.started();
        assert_eq!(depth(&m), 1);
        drop(b);
        assert_eq!(depth(&m), 0);
        let text = m.encode();
        for line in [
            r#"workqueue_depth{name="clickhousecluster",controller="clickhousecluster"} 0"#,
            r#"workqueue_adds_total{name="clickhousecluster",controller="clickhousecluster"} 2"#,
            r#"workqueue_queue_duration_seconds_count{name="clickhousecluster",controller="clickhousecluster"} 2"#,
        ] {
            assert!(text.contains(&format!("\n{line}\n")), "{line}\n{text}");
        }
        assert!(!text.contains("clickhouse_operator_workqueue"), "{text}");
    }

    /// controller-runtime's pass metrics, under its names and labels: passes running, their
    /// time (`controller_runtime_reconcile_time_seconds`, `workqueue_work_duration_seconds`),
    /// how they ended (`controller_runtime_reconcile_total` by `result`), failures and the
    /// retries they cause, and the slots of each controller.
    #[test]
    fn passes_are_counted_timed_and_ended_under_controller_runtimes_names() {
        use kube::runtime::controller::Action;
        let m = Metrics::default();
        m.set_max_concurrent_reconciles(&["ClickHouseCluster", "ClickHouseBackup"], 3);
        m.pass_started("ClickHouseCluster");
        m.pass_started("ClickHouseCluster");
        assert!(
            m.encode().contains(
                "\ncontroller_runtime_active_workers{controller=\"clickhousecluster\"} 2\n"
            )
        );
        m.observe_pass("ClickHouseCluster", Duration::from_millis(30));
        m.observe_pass("ClickHouseCluster", Duration::from_millis(70));
        m.reconciled::<()>("ClickHouseCluster", &Ok(Action::await_change()));
        m.reconciled::<()>(
            "ClickHouseCluster",
            &Ok(Action::requeue(Duration::from_secs(5))),
        );
        m.reconciled("ClickHouseCluster", &Err(()));
        m.reconciled("ClickHouseBackup", &Err(()));
        let text = m.encode();
        for line in [
            r#"controller_runtime_active_workers{controller="clickhousecluster"} 0"#,
            r#"controller_runtime_max_concurrent_reconciles{controller="clickhousecluster"} 3"#,
            r#"controller_runtime_max_concurrent_reconciles{controller="clickhousebackup"} 3"#,
            r#"controller_runtime_reconcile_time_seconds_count{controller="clickhousecluster"} 2"#,
            r#"workqueue_work_duration_seconds_count{name="clickhousecluster",controller="clickhousecluster"} 2"#,
            r#"controller_runtime_reconcile_total{controller="clickhousecluster",result="success"} 1"#,
            r#"controller_runtime_reconcile_total{controller="clickhousecluster",result="requeue_after"} 1"#,
            r#"controller_runtime_reconcile_total{controller="clickhousecluster",result="error"} 1"#,
            r#"controller_runtime_reconcile_errors_total{controller="clickhousecluster"} 1"#,
            r#"controller_runtime_reconcile_errors_total{controller="clickhousebackup"} 1"#,
            r#"workqueue_retries_total{name="clickhousebackup",controller="clickhousebackup"} 1"#,
            r#"clickhouse_operator_reconciles_total{kind="ClickHouseCluster"} 2"#,
            r#"clickhouse_operator_reconcile_duration_seconds_count{kind="ClickHouseCluster"} 2"#,
        ] {
            assert!(text.contains(&format!("\n{line}\n")), "{line}\n{text}");
        }
    }

    fn a_status() -> ClusterGauges {
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
    }

    /// Per cluster, its state as a labelled gauge, its pods desired/ready/updated, its condemned
    /// replicas and its last successful backup, the cluster named by the label
    /// `clickhouse_cluster` by default; `build_info`; every series of a deleted cluster removed
    /// (docs/monitoring.md, "The operator's metrics").
    #[test]
    fn cluster_series_follow_the_status_and_go_with_the_cluster() {
        let m = Metrics::default();
        assert_eq!(m.cluster_label, ClusterLabel::ClickHouseCluster);
        m.record_cluster("t1", "c1", &a_status());
        m.record_backup("t1", "c1", 1.7e9);
        m.record_backup("t1", "c1", 1.6e9);
        m.record_backup_failure("ClickHouseBackup", "Bucket");
        let text = m.encode();
        for line in [
            r#"clickhouse_operator_cluster_state{namespace="t1",clickhouse_cluster="c1",state="error"} 1"#,
            r#"clickhouse_operator_cluster_state{namespace="t1",clickhouse_cluster="c1",state="ready"} 0"#,
            r#"clickhouse_operator_cluster_pods{namespace="t1",clickhouse_cluster="c1",component="clickhouse",count="ready"} 3"#,
            r#"clickhouse_operator_cluster_pods{namespace="t1",clickhouse_cluster="c1",component="keeper",count="desired"} 3"#,
            r#"clickhouse_operator_cluster_condemned_replicas{namespace="t1",clickhouse_cluster="c1"} 1"#,
            r#"clickhouse_operator_cluster_last_successful_backup_timestamp_seconds{namespace="t1",clickhouse_cluster="c1"} 1700000000"#,
            r#"clickhouse_operator_build_info{version=""#,
            r#"clickhouse_operator_backup_failures_total{kind="ClickHouseBackup",reason="Bucket"} 1"#,
        ] {
            assert!(text.contains(line), "{line}\n{text}");
        }
        assert!(!text.contains(",cluster=\""), "no label cluster: {text}");
        m.forget_cluster("t1", "c1");
        let text = m.encode();
        assert!(!text.contains(r#"cluster="c1""#), "{text}");
        assert!(text.contains("clickhouse_operator_build_info"));
    }

    /// `METRICS_CLUSTER_LABEL=cluster` keeps the label of earlier versions; other values are
    /// refused.
    #[test]
    fn the_cluster_label_of_earlier_versions_stays_available() {
        for unset in [None, Some(""), Some("clickhouse_cluster")] {
            assert_eq!(
                ClusterLabel::parse(unset, "METRICS_CLUSTER_LABEL"),
                Ok(ClusterLabel::ClickHouseCluster)
            );
        }
        let label = ClusterLabel::parse(Some("cluster"), "METRICS_CLUSTER_LABEL").unwrap();
        let m = Metrics::new(label);
        m.record_cluster("t1", "c1", &a_status());
        m.record_backup("t1", "c1", 1.7e9);
        let text = m.encode();
        for line in [
            r#"clickhouse_operator_cluster_state{namespace="t1",cluster="c1",state="error"} 1"#,
            r#"clickhouse_operator_cluster_pods{namespace="t1",cluster="c1",component="keeper",count="desired"} 3"#,
            r#"clickhouse_operator_cluster_condemned_replicas{namespace="t1",cluster="c1"} 1"#,
            r#"clickhouse_operator_cluster_last_successful_backup_timestamp_seconds{namespace="t1",cluster="c1"} 1700000000"#,
        ] {
            assert!(text.contains(line), "{line}\n{text}");
        }
        assert!(!text.contains("clickhouse_cluster="), "{text}");
        m.forget_cluster("t1", "c1");
        assert!(!m.encode().contains(r#"cluster="c1""#));
        assert!(
            ClusterLabel::parse(Some("k8s_cluster"), "METRICS_CLUSTER_LABEL")
                .unwrap_err()
                .contains("METRICS_CLUSTER_LABEL")
        );
    }
}
