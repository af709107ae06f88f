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

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabels {
    pub kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ErrorLabels {
    pub kind: String,
    pub reason: String,
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
        Metrics {
            reconciles,
            errors,
            duration,
            last_success,
            writes,
            registry,
        }
    }
}

impl Metrics {
    pub fn observe_pass(&self, kind: &str, took: Duration) {
        self.duration
            .get_or_create(&KindLabels { kind: kind.into() })
            .observe(took.as_secs_f64());
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
}
