//! A test's namespace and the operator run in-process for it; the end of a test (its clusters
//! deleted while the operator runs, then the namespace).

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use clickhouse_operator::api::ClickHouseCluster;
use clickhouse_operator::runtime::metrics::{Health, Metrics};
use clickhouse_operator::runtime::settings::Settings;
use k8s_openapi::api::core::v1::Namespace;
use kube::Client;
use kube::api::{Api, ObjectMeta, PostParams};

use super::wait_for;

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// Creates a namespace of its own for a test.
pub async fn namespace(client: &Client, prefix: &str) -> String {
    let name = format!(
        "{prefix}-{}-{}",
        std::process::id() % 100_000,
        COUNTER.fetch_add(1, Ordering::SeqCst)
    );
    let api: Api<Namespace> = Api::all(client.clone());
    api.create(
        &PostParams::default(),
        &Namespace {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                ..ObjectMeta::default()
            },
            ..Namespace::default()
        },
    )
    .await
    .expect("create a namespace");
    super::guarantees::watch(client, &name);
    name
}

/// The operator running in-process, watching `namespace` only. Stopped when dropped.
pub struct Operator {
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
    pub metrics: std::sync::Arc<Metrics>,
}

impl Drop for Operator {
    fn drop(&mut self) {
        self.task.abort();
    }
}

pub async fn start_operator(client: &Client, namespace: &str, leader_election: bool) -> Operator {
    start(client, namespace, leader_election, Default::default(), &[]).await
}

/// The operator without leader election, with settings of the environment overridden.
pub async fn start_operator_env(
    client: &Client,
    namespace: &str,
    env: &[(&'static str, &str)],
) -> Operator {
    start(client, namespace, false, Default::default(), env).await
}

/// The operator without leader election, with faults injected (decision 24).
pub async fn start_operator_with(
    client: &Client,
    namespace: &str,
    faults: clickhouse_operator::controller::Faults,
) -> Operator {
    start(client, namespace, false, faults, &[]).await
}

/// The operator without leader election, with faults injected and settings of the
/// environment overridden.
pub async fn start_operator_with_env(
    client: &Client,
    namespace: &str,
    faults: clickhouse_operator::controller::Faults,
    env: &[(&'static str, &str)],
) -> Operator {
    start(client, namespace, false, faults, env).await
}

async fn start(
    client: &Client,
    namespace: &str,
    leader_election: bool,
    faults: clickhouse_operator::controller::Faults,
    extra: &[(&'static str, &str)],
) -> Operator {
    let mut env = vec![
        ("WATCH_NAMESPACE", namespace.to_string()),
        ("LEADER_ELECTION", leader_election.to_string()),
        ("POD_NAMESPACE", namespace.to_string()),
        ("POD_NAME", format!("operator-{namespace}")),
        ("HTTP_ADDR", "127.0.0.1:0".to_string()),
    ];
    env.extend(extra.iter().map(|(k, v)| (*k, v.to_string())));
    let settings = Settings::from_lookup(|k| {
        env.iter()
            .rev()
            .find(|(n, _)| *n == k)
            .map(|(_, v)| v.clone())
    })
    .expect("valid settings");
    let metrics = std::sync::Arc::new(Metrics::default());
    let client = client.clone();
    let m = metrics.clone();
    let task = tokio::spawn(async move {
        let lost: futures::future::BoxFuture<'static, ()> = if settings.leader_election {
            let elector = clickhouse_operator::runtime::leader::LeaderElector::new(
                client.clone(),
                &settings.lease_namespace,
                &settings.lease_name,
                &settings.identity,
            );
            let mut rx = elector.acquire().await;
            Box::pin(async move {
                while *rx.borrow() {
                    if rx.changed().await.is_err() {
                        break;
                    }
                }
            })
        } else {
            Box::pin(futures::future::pending())
        };
        clickhouse_operator::controller::run_with(
            &settings,
            client,
            m,
            std::sync::Arc::new(Health::default()),
            lost,
            faults,
        )
        .await
    });
    Operator { task, metrics }
}

/// Ends a test: deletes its ClickHouseClusters while the operator still runs (the finalizer
/// completes, S0-02), waits until they and their pods are gone, then deletes the namespace.
pub async fn finish(client: &Client, ns: &str, operator: Operator) {
    finish_all(client, &[ns], operator).await;
}

/// [`finish`] for the clusters of several namespaces watched by one operator.
pub async fn finish_all(client: &Client, namespaces: &[&str], operator: Operator) {
    for ns in namespaces {
        clean_up(client, ns).await;
        super::guarantees::assert_kept(ns);
    }
    drop(operator);
    let all: Api<Namespace> = Api::all(client.clone());
    for ns in namespaces {
        let _ = all.delete(ns, &kube::api::DeleteParams::default()).await;
    }
}

/// Deletes the ClickHouseClusters of `ns` (the operator running) and waits until they and
/// every pod of the namespace are gone.
pub async fn clean_up(client: &Client, ns: &str) {
    use k8s_openapi::api::core::v1::Pod;
    use kube::api::DeleteParams;
    let clusters: Api<ClickHouseCluster> = Api::namespaced(client.clone(), ns);
    clusters
        .delete_collection(&DeleteParams::default(), &Default::default())
        .await
        .expect("delete the clusters");
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    wait_for(
        Duration::from_secs(120),
        "the clusters and their pods to be gone",
        || {
            let (clusters, pods) = (clusters.clone(), pods.clone());
            async move {
                let c = clusters.list(&Default::default()).await.ok()?;
                let p = pods.list(&Default::default()).await.ok()?;
                (c.items.is_empty() && p.items.is_empty()).then_some(())
            }
        },
    )
    .await;
}
