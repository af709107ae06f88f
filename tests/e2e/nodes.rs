//! The multi-node cluster of the harness (`support::multi_node_client`): three Ready nodes in
//! three zones, a node stopped and started again. What the operator does on such days is for
//! the tests that use it; this one proves the harness.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, PostParams};
use serde_json::json;

use crate::support::*;

fn ready(node: &Node) -> String {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
        .map(|c| c.status.clone())
        .unwrap_or_default()
}

#[tokio::test]
async fn three_zoned_nodes_and_one_stopped_and_started_again() {
    let _nodes = NODE_DISRUPTION.lock().await;
    let client = multi_node_client().await;
    let nodes: Api<Node> = Api::all(client.clone());
    let list = nodes.list(&Default::default()).await.unwrap();
    let zones: Vec<(String, String, String)> = list
        .items
        .iter()
        .map(|n| {
            let zone = n
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get("topology.kubernetes.io/zone"))
                .cloned()
                .unwrap_or_default();
            (n.metadata.name.clone().unwrap(), zone, ready(n))
        })
        .collect();
    assert_eq!(
        zones,
        [
            ("node-1".into(), "zone-a".into(), "True".into()),
            ("node-2".into(), "zone-b".into(), "True".into()),
            ("node-3".into(), "zone-c".into(), "True".into()),
        ]
    );
    let ns = namespace(&client, "nodes").await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "on3", "annotations": {"local-kubelet.clickhouse.com/hollow": "true"}},
        "spec": {"nodeName": "node-3", "terminationGracePeriodSeconds": 1,
                 "containers": [{"name": "server", "image": "clickhouse/clickhouse-server:24.8"}]}
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    let pod_ready = |want: &'static str| {
        let pods = pods.clone();
        move || {
            let pods = pods.clone();
            async move {
                let p = pods.get("on3").await.ok()?;
                p.status?
                    .conditions?
                    .iter()
                    .any(|c| c.type_ == "Ready" && c.status == want)
                    .then_some(())
            }
        }
    };
    wait_for(Duration::from_secs(60), "on3 Ready", pod_ready("True")).await;
    node_stop("node-3");
    wait_for(Duration::from_secs(60), "node-3 NotReady", || {
        let nodes = nodes.clone();
        async move { (ready(&nodes.get("node-3").await.ok()?) == "Unknown").then_some(()) }
    })
    .await;
    wait_for(Duration::from_secs(30), "on3 not ready", pod_ready("False")).await;
    node_start("node-3");
    wait_for(
        Duration::from_secs(60),
        "on3 Ready again",
        pod_ready("True"),
    )
    .await;
    multi_node_kubectl(&["delete", "namespace", &ns, "--wait=false"]);
}
