//! What the status says on the way, end to end: a LoadBalancer's address (S2-37), a pass
//! started by an annotation during a long backoff (S2-02), and `stopping` before `paused`
//! (S2-22).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use clickhouse_operator::api::{ClickHouseCluster, ClusterState};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Service};
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::{Client, ResourceExt};
use serde_json::json;

use crate::support::*;

fn passes(op: &Operator) -> u64 {
    op.metrics
        .encode()
        .lines()
        .find(|l| l.starts_with("clickhouse_operator_reconciles_total{kind=\"ClickHouseCluster\"}"))
        .and_then(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .unwrap_or(0)
}

/// The resourceVersion of every object of the cluster that the operator writes, by kind/name.
async fn object_versions(client: &Client, ns: &str) -> BTreeMap<String, String> {
    let lp = ListParams::default().labels("clickhouse.com/cluster=c1");
    let mut out = BTreeMap::new();
    for s in Api::<StatefulSet>::namespaced(client.clone(), ns)
        .list(&lp)
        .await
        .unwrap()
    {
        out.insert(
            format!("StatefulSet/{}", s.name_any()),
            s.resource_version().unwrap(),
        );
    }
    for c in Api::<ConfigMap>::namespaced(client.clone(), ns)
        .list(&lp)
        .await
        .unwrap()
    {
        out.insert(
            format!("ConfigMap/{}", c.name_any()),
            c.resource_version().unwrap(),
        );
    }
    for s in Api::<Service>::namespaced(client.clone(), ns)
        .list(&lp)
        .await
        .unwrap()
    {
        out.insert(
            format!("Service/{}", s.name_any()),
            s.resource_version().unwrap(),
        );
    }
    out
}

/// S2-37, S2-02 and S2-22 on one cluster whose client Service is a LoadBalancer:
/// - no load-balancer controller runs here, so the Service gets no address: with every pod
///   Ready the cluster stays `initializing`, `status.host` empty, and says it waits for the
///   address; once the Service's status is given an ingress address (as a cloud's controller
///   would), the cluster is `ready` with that address as `status.host`;
/// - a refused change puts the cluster in `error` and its passes into a backoff that grows;
///   once no pass has run for 8 s, an annotation (which changes no generation) starts a pass
///   within 2 s, and that pass writes none of the cluster's objects;
/// - pause: while the pods terminate the state is `stopping`, and `paused` is said only once
///   no pod of the cluster is left; resume returns to `ready`.
#[tokio::test]
async fn the_status_says_a_load_balancers_address_an_annotation_starts_a_pass_and_stopping() {
    let Scenario { client, ns, op } = Scenario::start("status").await;
    create_cluster(
        &client,
        &ns,
        "c1",
        json!({"replicas": 1, "keeper": {"replicas": 1}, "storage": {"size": "1Gi"},
               "clientService": {"type": "LoadBalancer"}}),
    )
    .await;
    let clusters: Api<ClickHouseCluster> = Api::namespaced(client.clone(), &ns);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let cluster_pods = ListParams::default().labels("clickhouse.com/cluster=c1");
    // every pod Ready, and still not ready: no address
    wait_for(Duration::from_secs(300), "every pod of c1 Ready", || {
        let (pods, lp) = (pods.clone(), cluster_pods.clone());
        async move {
            let l = pods.list(&lp).await.ok()?.items;
            (l.len() == 2 && l.iter().all(clickhouse_operator::plan::facts::pod_ready))
                .then_some(())
        }
    })
    .await;
    let until = Instant::now() + Duration::from_secs(10);
    let mut message = String::new();
    while Instant::now() < until {
        let s = clusters.get("c1").await.unwrap().status.unwrap_or_default();
        assert_ne!(s.state, ClusterState::Ready, "ready without an address");
        assert!(s.host.is_none(), "no address yet: {:?}", s.host);
        message = s.message.unwrap_or_default();
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    println!("without an address: {message}");
    assert!(message.contains("address"), "{message}");
    Api::<Service>::namespaced(client.clone(), &ns)
        .patch_status(
            "c1",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"status": {"loadBalancer": {"ingress": [{"ip": "203.0.113.10"}]}}}),
            ),
        )
        .await
        .expect("give the LoadBalancer an address");
    let c = wait_ready(&client, &ns, "c1", 1).await;
    assert_eq!(c.status.unwrap().host.as_deref(), Some("203.0.113.10"));

    // a refused change, then a long backoff, then an annotation
    patch_spec(&client, &ns, "c1", json!({"crVersion": "99.0.0"})).await;
    wait_status(&client, &ns, "c1", Duration::from_secs(60), "error", |s| {
        s.state == ClusterState::Error
    })
    .await;
    let mut last = (passes(&op), Instant::now());
    let quiet = loop {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let n = passes(&op);
        if n != last.0 {
            last = (n, Instant::now());
        } else if last.1.elapsed() >= Duration::from_secs(8) {
            break n;
        }
        assert!(
            n < 10_000,
            "the passes of a refused spec back off: {n} passes"
        );
    };
    let versions = object_versions(&client, &ns).await;
    let t = Instant::now();
    clusters
        .patch(
            "c1",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {
                "clickhouse.com/reconcile-trigger": "1"}}})),
        )
        .await
        .unwrap();
    while passes(&op) == quiet {
        assert!(
            t.elapsed() < Duration::from_secs(2),
            "the annotation started no pass within 2 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    println!("annotation → pass in {:?}", t.elapsed());
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        object_versions(&client, &ns).await,
        versions,
        "the annotation's pass wrote no object"
    );
    patch_spec(&client, &ns, "c1", json!({"crVersion": null})).await;
    wait_ready(&client, &ns, "c1", 3).await;

    // pause: `stopping` while pods terminate, `paused` only once none is left
    patch_spec(&client, &ns, "c1", json!({"pause": true})).await;
    let mut seen: Vec<ClusterState> = Vec::new();
    let t = Instant::now();
    loop {
        let s = clusters.get("c1").await.unwrap().status.unwrap_or_default();
        let left = pods.list(&cluster_pods).await.unwrap().items.len();
        if seen.last() != Some(&s.state) {
            seen.push(s.state);
        }
        if s.state == ClusterState::Paused {
            assert_eq!(left, 0, "`paused` while {left} pod(s) remain");
            break;
        }
        assert!(t.elapsed() < READY, "never paused: {seen:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    println!("states while pausing: {seen:?}");
    assert!(
        seen.contains(&ClusterState::Stopping),
        "`stopping` while the pods terminate: {seen:?}"
    );
    patch_spec(&client, &ns, "c1", json!({"pause": false})).await;
    wait_ready(&client, &ns, "c1", 5).await;
    finish(&client, &ns, op).await;
}
