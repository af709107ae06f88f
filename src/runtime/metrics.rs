//! Prometheus metrics, and the HTTP server for `/metrics`, `/healthz` and `/readyz`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use axum::{Router, extract::State, http::StatusCode, routing::get};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::{
    counter::Counter, family::Family, gauge::Gauge, histogram::Histogram,
};
use prometheus_client::registry::Registry;

use crate::api::{ClickHouseClusterStatus, ClusterState};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabels {
    pub kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ErrorLabels {
    pub kind: String,
    pub reason: String,
}

/// One cluster.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ClusterLabels {
    pub namespace: String,
    pub cluster: String,
}

/// One state of one cluster.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StateLabels {
    pub namespace: String,
    pub cluster: String,
    pub state: String,
}

/// A count of one component's pods of one cluster: `desired`, `ready` or `updated`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PodCountLabels {
    pub namespace: String,
    pub cluster: String,
    pub component: String,
    pub count: String,
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
    labels: KindLabels,
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

/// The states a cluster can report, each a series of `cluster_state`.
const STATES: [ClusterState; 6] = [
    ClusterState::Initializing,
    ClusterState::Ready,
    ClusterState::Paused,
    ClusterState::Stopping,
    ClusterState::Error,
    ClusterState::Suspended,
];

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
    /// Passes due and waiting for a slot (MAX_CONCURRENT_RECONCILES), by kind.
    pub queue_depth: Family<KindLabels, Gauge>,
    /// How long a due pass waited for its slot, by kind.
    pub queue_wait: Family<KindLabels, Histogram>,
    pub registry: Registry,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("clickhouse_operator");
        let reconciles = Family::<KindLabels, Counter>::default();
        let errors = Family::<ErrorLabels, Counter>::default();
        let duration = Family::<KindLabels, Histogram>::new_with_constructor(|| {
            Histogram::new([0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0])
        });
        let last_success =
            Family::<ObjectLabels, Gauge<f64, std::sync::atomic::AtomicU64>>::default();
        let writes = Family::<KindLabels, Counter>::default();
        registry.register("reconciles", "Reconcile passes started", reconciles.clone());
        registry.register(
            "reconcile_errors",
            "Reconcile passes that failed, by reason",
            errors.clone(),
        );
        registry.register(
            "reconcile_duration_seconds",
            "Duration of reconcile passes",
            duration.clone(),
        );
        registry.register(
            "last_successful_reconcile_timestamp_seconds",
            "Unix time of the last successful pass of each object",
            last_success.clone(),
        );
        registry.register(
            "api_writes",
            "Write requests sent to the Kubernetes API, by kind of object",
            writes.clone(),
        );
        let cluster_state = Family::<StateLabels, Gauge>::default();
        let cluster_pods = Family::<PodCountLabels, Gauge>::default();
        let cluster_condemned = Family::<ClusterLabels, Gauge>::default();
        let last_backup =
            Family::<ClusterLabels, Gauge<f64, std::sync::atomic::AtomicU64>>::default();
        let build_info = Family::<BuildLabels, Gauge>::default();
        registry.register(
            "cluster_state",
            "1 for the state in each ClickHouseCluster's status, 0 for the others",
            cluster_state.clone(),
        );
        registry.register(
            "cluster_pods",
            "Pods of each cluster's servers and Keeper: desired, ready, updated (ready on the current revision)",
            cluster_pods.clone(),
        );
        registry.register(
            "cluster_condemned_replicas",
            "Replicas of each cluster being removed by a scale-in",
            cluster_condemned.clone(),
        );
        registry.register(
            "cluster_last_successful_backup_timestamp_seconds",
            "Unix time at which the newest successful ClickHouseBackup of each cluster completed",
            last_backup.clone(),
        );
        let backup_failures = Family::<ErrorLabels, Counter>::default();
        registry.register(
            "backup_failures",
            "ClickHouseBackups and ClickHouseRestores that failed, by kind and reason (the reason of their status)",
            backup_failures.clone(),
        );
        registry.register("build_info", "The operator's version", build_info.clone());
        let observations = Family::<SourceLabels, Counter>::default();
        registry.register(
            "cluster_observations",
            "Passes of clusters by where they read the Kubernetes objects: the watch-fed caches, or the API server (after the operator's own writes, or before the caches are filled)",
            observations.clone(),
        );
        let queue_depth = Family::<KindLabels, Gauge>::default();
        registry.register(
            "workqueue_depth",
            "Passes due and waiting for a slot (MAX_CONCURRENT_RECONCILES), by kind (as controller-runtime's workqueue_depth)",
            queue_depth.clone(),
        );
        let queue_wait = Family::<KindLabels, Histogram>::new_with_constructor(|| {
            Histogram::new([0.001, 0.01, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0])
        });
        registry.register(
            "workqueue_queue_duration_seconds",
            "How long a due pass waited for its slot, by kind (as controller-runtime's workqueue_queue_duration_seconds)",
            queue_wait.clone(),
        );
        build_info
            .get_or_create(&BuildLabels {
                version: crate::api::validate::OPERATOR_VERSION.to_string(),
            })
            .set(1);
        Metrics {
            reconciles,
            errors,
            duration,
            last_success,
            writes,
            cluster_state,
            cluster_pods,
            cluster_condemned,
            last_backup,
            backup_failures,
            build_info,
            observations,
            queue_depth,
            queue_wait,
            registry,
        }
    }
}

impl Metrics {
    /// Counts a pass that read its objects from `source` (`cache` or `api`).
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
        let labels = KindLabels { kind: kind.into() };
        self.queue_depth.get_or_create(&labels).inc();
        Queued {
            metrics: self,
            labels,
            since: std::time::Instant::now(),
            done: false,
        }
    }

    pub fn observe_pass(&self, kind: &str, took: Duration) {
        self.duration
            .get_or_create(&KindLabels { kind: kind.into() })
            .observe(took.as_secs_f64());
    }

    /// The series of a cluster from the status it reports.
    pub fn record_cluster(&self, namespace: &str, cluster: &str, status: &ClickHouseClusterStatus) {
        for state in STATES {
            self.cluster_state
                .get_or_create(&StateLabels {
                    namespace: namespace.into(),
                    cluster: cluster.into(),
                    state: state.to_string(),
                })
                .set(i64::from(state == status.state));
        }
        for (component, c) in [
            ("clickhouse", &status.clickhouse),
            ("keeper", &status.keeper),
        ] {
            for (count, v) in [
                ("desired", c.size),
                ("ready", c.ready),
                ("updated", c.updated),
            ] {
                self.cluster_pods
                    .get_or_create(&PodCountLabels {
                        namespace: namespace.into(),
                        cluster: cluster.into(),
                        component: component.into(),
                        count: count.into(),
                    })
                    .set(i64::from(v));
            }
        }
        let condemned = status
            .replica_state_map
            .values()
            .filter(|r| r.state == crate::api::ReplicaState::Condemned)
            .count();
        self.cluster_condemned
            .get_or_create(&ClusterLabels {
                namespace: namespace.into(),
                cluster: cluster.into(),
            })
            .set(condemned as i64);
    }

    /// A backup of `cluster` that completed at `unix` seconds (the newest one counts).
    pub fn record_backup(&self, namespace: &str, cluster: &str, unix: f64) {
        let g = self.last_backup.get_or_create(&ClusterLabels {
            namespace: namespace.into(),
            cluster: cluster.into(),
        });
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
        let labels = ClusterLabels {
            namespace: namespace.into(),
            cluster: cluster.into(),
        };
        for state in STATES {
            self.cluster_state.remove(&StateLabels {
                namespace: namespace.into(),
                cluster: cluster.into(),
                state: state.to_string(),
            });
        }
        for component in ["clickhouse", "keeper"] {
            for count in ["desired", "ready", "updated"] {
                self.cluster_pods.remove(&PodCountLabels {
                    namespace: namespace.into(),
                    cluster: cluster.into(),
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

    /// The queue: a due pass counts in `workqueue_depth` until it has its slot, and its wait is
    /// observed then (or when it gives up waiting).
    #[test]
    fn the_queue_depth_counts_passes_waiting_for_a_slot() {
        let m = Metrics::default();
        let a = m.queued("ClickHouseCluster");
        let b = m.queued("ClickHouseCluster");
        let depth = |m: &Metrics| {
            m.queue_depth
                .get_or_create(&KindLabels {
                    kind: "ClickHouseCluster".into(),
                })
                .get()
        };
        assert_eq!(depth(&m), 2);
        a.started();
        assert_eq!(depth(&m), 1);
        drop(b);
        assert_eq!(depth(&m), 0);
        let text = m.encode();
        assert!(
            text.contains("clickhouse_operator_workqueue_depth{kind=\"ClickHouseCluster\"} 0"),
            "{text}"
        );
        assert!(
            text.contains(
                "clickhouse_operator_workqueue_queue_duration_seconds_count{kind=\"ClickHouseCluster\"} 2"
            ),
            "{text}"
        );
    }

    /// Per cluster, its state as a labelled gauge, its pods desired/ready/updated, its condemned
    /// replicas and its last successful backup; `build_info`; every series of a deleted cluster
    /// removed (docs/monitoring.md, "The operator's metrics").
    #[test]
    fn cluster_series_follow_the_status_and_go_with_the_cluster() {
        let m = Metrics::default();
        let status: ClickHouseClusterStatus = serde_json::from_value(serde_json::json!({
            "state": "error",
            "clickhouse": {"size": 4, "ready": 3, "updated": 2},
            "keeper": {"size": 3, "ready": 3, "updated": 3},
            "replicaStateMap": {
                "c1-0-0": {"shard": 0, "index": 0, "state": "Ready", "isBackupPod": true},
                "c1-0-2": {"shard": 0, "index": 2, "state": "Condemned", "isBackupPod": false}
            }
        }))
        .unwrap();
        m.record_cluster("t1", "c1", &status);
        m.record_backup("t1", "c1", 1.7e9);
        m.record_backup("t1", "c1", 1.6e9);
        m.record_backup_failure("ClickHouseBackup", "Bucket");
        let text = m.encode();
        for line in [
            r#"clickhouse_operator_cluster_state{namespace="t1",cluster="c1",state="error"} 1"#,
            r#"clickhouse_operator_cluster_state{namespace="t1",cluster="c1",state="ready"} 0"#,
            r#"clickhouse_operator_cluster_pods{namespace="t1",cluster="c1",component="clickhouse",count="ready"} 3"#,
            r#"clickhouse_operator_cluster_pods{namespace="t1",cluster="c1",component="keeper",count="desired"} 3"#,
            r#"clickhouse_operator_cluster_condemned_replicas{namespace="t1",cluster="c1"} 1"#,
            r#"clickhouse_operator_cluster_last_successful_backup_timestamp_seconds{namespace="t1",cluster="c1"} 1700000000"#,
            r#"clickhouse_operator_build_info{version=""#,
            r#"clickhouse_operator_backup_failures_total{kind="ClickHouseBackup",reason="Bucket"} 1"#,
        ] {
            assert!(text.contains(line), "{line}\n{text}");
        }
        m.forget_cluster("t1", "c1");
        let text = m.encode();
        assert!(!text.contains(r#"cluster="c1""#), "{text}");
        assert!(text.contains("clickhouse_operator_build_info"));
    }
}
