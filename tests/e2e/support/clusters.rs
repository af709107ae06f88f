//! ClickHouseClusters: created, patched, waited for (a status, ready at a generation, a
//! rollout), and read (replicas).

use std::time::Duration;

use clickhouse_operator::api::{ClickHouseCluster, ClusterState};
use kube::Client;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

use super::wait_for;

/// The server image the clusters of these tests name unless they name another: the local
/// kubelet runs ClickHouse 18.16 for every `clickhouse-server` image, so the tag says so. The
/// operator trusts a tag in one place, the order of a first start (decision 58): with a tag of
/// 21.3 or later, servers start beside their Keeper, which 18.16 does not survive (its DDL
/// queue gives up for good).
pub const SERVER_IMAGE: &str = "clickhouse/clickhouse-server:18.16.1";

/// Creates a ClickHouseCluster from a JSON spec ([`SERVER_IMAGE`] unless it names an image).
pub async fn create_cluster(
    client: &Client,
    ns: &str,
    name: &str,
    mut spec: serde_json::Value,
) -> ClickHouseCluster {
    let api: Api<ClickHouseCluster> = Api::namespaced(client.clone(), ns);
    if let Some(o) = spec.as_object_mut() {
        o.entry("image").or_insert_with(|| SERVER_IMAGE.into());
    }
    let obj: ClickHouseCluster = serde_json::from_value(serde_json::json!({
        "apiVersion": "clickhouse.com/v1alpha1",
        "kind": "ClickHouseCluster",
        "metadata": {"name": name, "namespace": ns},
        "spec": spec,
    }))
    .expect("a ClickHouseCluster");
    api.create(&PostParams::default(), &obj)
        .await
        .expect("create the cluster")
}

/// Waits until the cluster's status satisfies `pred`, and returns it.
pub async fn wait_status(
    client: &Client,
    ns: &str,
    name: &str,
    timeout: Duration,
    what: &str,
    pred: impl Fn(&clickhouse_operator::api::ClickHouseClusterStatus) -> bool,
) -> ClickHouseCluster {
    let api: Api<ClickHouseCluster> = Api::namespaced(client.clone(), ns);
    let last = std::sync::Mutex::new(None);
    let waited = tokio::time::timeout(
        timeout,
        wait_for(timeout + Duration::from_secs(60), what, || {
            let api = api.clone();
            let (pred, last) = (&pred, &last);
            async move {
                let c = api.get(name).await.ok()?;
                *last.lock().unwrap() = c.status.clone();
                c.status.as_ref().filter(|s| pred(s)).map(|_| c.clone())
            }
        }),
    )
    .await;
    match waited {
        Ok(c) => c,
        Err(_) => {
            let last = last.lock().unwrap().clone();
            panic!(
                "timed out after {timeout:?} waiting for {what}; the last status: {:?}",
                last.map(|s| (s.state, s.message, s.conditions))
            )
        }
    }
}

/// How long a cluster may take to become ready in these tests.
pub const READY: Duration = Duration::from_secs(300);

/// Merges `spec` into the cluster's spec.
pub async fn patch_spec(client: &Client, ns: &str, name: &str, spec: serde_json::Value) {
    Api::<ClickHouseCluster>::namespaced(client.clone(), ns)
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": spec })),
        )
        .await
        .expect("patch the cluster");
}

/// Lets the cluster `name` lose data (`clickhouse.com/allow-data-loss`) and lowers its
/// `spec.shards` to `shards`: the shards beyond it are removed.
pub async fn remove_shards(client: &Client, ns: &str, name: &str, shards: i32) {
    Api::<ClickHouseCluster>::namespaced(client.clone(), ns)
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(
                json!({"metadata": {"annotations": {"clickhouse.com/allow-data-loss": "true"}}}),
            ),
        )
        .await
        .expect("annotate the cluster");
    patch_spec(client, ns, name, json!({ "shards": shards })).await;
}

/// The ClusterIP of Service `service` (a cluster's client Service is named like the cluster).
pub async fn service_ip(client: &Client, ns: &str, service: &str) -> String {
    Api::<k8s_openapi::api::core::v1::Service>::namespaced(client.clone(), ns)
        .get(service)
        .await
        .expect("the Service")
        .spec
        .and_then(|s| s.cluster_ip)
        .expect("a ClusterIP")
}

/// Waits until the cluster is ready at `generation`.
pub async fn wait_ready(
    client: &Client,
    ns: &str,
    name: &str,
    generation: i64,
) -> ClickHouseCluster {
    wait_status(
        client,
        ns,
        name,
        READY,
        &format!("{name} ready at generation {generation}"),
        |s| s.state == ClusterState::Ready && s.observed_generation == Some(generation),
    )
    .await
}

/// The backup replica of the only shard (or the first one listed) in the cluster's status.
pub fn backup_replica(c: &ClickHouseCluster) -> String {
    c.status
        .as_ref()
        .unwrap()
        .replica_state_map
        .iter()
        .find(|(_, r)| r.is_backup_pod)
        .map(|(n, _)| n.to_string())
        .expect("a backup replica")
}

/// Watches the server pods of `cluster` (`total` of them, `before` as [`pod_ids`] gave them)
/// until the cluster is ready at `generation`: the pods in the order they were replaced and the
/// most that were down at once. Fails unless every pod was replaced before ready.
pub async fn watch_rollout(
    client: &Client,
    ns: &str,
    cluster: &str,
    before: &std::collections::BTreeMap<String, (String, i32)>,
    total: usize,
    generation: i64,
) -> (Vec<String>, usize) {
    let (order, most_down) = watch_replacements(client, ns, cluster, before, total, |s, _, _| {
        s.state == ClusterState::Ready && s.observed_generation == Some(generation)
    })
    .await;
    assert_eq!(
        order.len(),
        total,
        "every pod restarted once before ready: {order:?}"
    );
    (order, most_down)
}

/// Watches the server pods of `cluster` (`total` of them, `before` as [`pod_ids`] gave them)
/// until `done` (the cluster's status, how many pods were replaced so far, how many are down
/// now) holds: the pods in the order they were replaced and the most that were down at once.
/// Fails after [`READY`].
pub async fn watch_replacements(
    client: &Client,
    ns: &str,
    cluster: &str,
    before: &std::collections::BTreeMap<String, (String, i32)>,
    total: usize,
    done: impl Fn(&clickhouse_operator::api::ClickHouseClusterStatus, usize, usize) -> bool,
) -> (Vec<String>, usize) {
    use k8s_openapi::api::core::v1::Pod;
    use kube::ResourceExt;
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let api: Api<ClickHouseCluster> = Api::namespaced(client.clone(), ns);
    let selector = format!("clickhouse.com/cluster={cluster},app.kubernetes.io/component=server");
    let mut order: Vec<String> = Vec::new();
    let mut most_down = 0;
    let deadline = tokio::time::Instant::now() + READY;
    loop {
        let list = pods
            .list(&kube::api::ListParams::default().labels(&selector))
            .await
            .unwrap()
            .items;
        let mut down = total.saturating_sub(list.len());
        for p in &list {
            let name = p.name_any();
            if !clickhouse_operator::plan::facts::pod_ready(p) {
                down += 1;
            }
            if before.get(&name).map(|(uid, _)| uid) != p.uid().as_ref() && !order.contains(&name) {
                order.push(name);
            }
        }
        most_down = most_down.max(down);
        let s = api.get(cluster).await.unwrap().status.unwrap();
        if done(&s, order.len(), down) {
            return (order, most_down);
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "rollout did not finish: replaced {order:?}, {s:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The replicas of a cluster's ReplicaStateMap, by name.
pub fn replica_names(cluster: &ClickHouseCluster) -> Vec<String> {
    cluster
        .status
        .as_ref()
        .map(|s| s.replica_state_map.keys().map(|k| k.to_string()).collect())
        .unwrap_or_default()
}
