//! Placement (decision 28) as the real scheduler decides it. The local Kubernetes has one node
//! with a kubelet; this test adds a second Node object without one (its status and Lease
//! written by the test, a taint that only this test's pods tolerate), so the scheduler has two
//! nodes to choose from. A pod it places there never runs: the test reads the scheduler's
//! choice from the data PVC's `volume.kubernetes.io/selected-node` annotation (the volume is
//! provisioned on the node the scheduler picked) or the pod's `nodeName`.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, PersistentVolumeClaim, Pod};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;

use crate::support::*;

const TAINT: &str = "clickhouse.com/test-placement";

/// A Ready Node `name` without a kubelet, tainted for this test, kept Ready (its Lease renewed)
/// until the returned task is aborted.
async fn fake_node(client: &kube::Client, name: &str) -> tokio::task::JoinHandle<()> {
    let nodes: Api<Node> = Api::all(client.clone());
    let node: Node = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name,
            "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64"}},
        "spec": {"taints": [{"key": TAINT, "value": "true", "effect": "NoSchedule"}]}
    }))
    .unwrap();
    nodes.create(&PostParams::default(), &node).await.unwrap();
    let (client, name) = (client.clone(), name.to_string());
    tokio::spawn(async move {
        let nodes: Api<Node> = Api::all(client.clone());
        let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-node-lease");
        loop {
            let now = k8s_openapi::jiff::Timestamp::now().to_string();
            let cap = json!({"cpu": "2", "memory": "24Gi", "pods": "110"});
            let _ = nodes
                .patch_status(
                    &name,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"status": {"capacity": cap, "allocatable": cap,
                        "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                            "message": "kept Ready by the test", "lastHeartbeatTime": now,
                            "lastTransitionTime": now}]}})),
                )
                .await;
            let lease: Lease = serde_json::from_value(json!({
                "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": name, "namespace": "kube-node-lease"},
                "spec": {"holderIdentity": name, "leaseDurationSeconds": 40,
                    "renewTime": k8s_openapi::jiff::Timestamp::now().to_string()}
            }))
            .unwrap();
            if leases.get_opt(&name).await.ok().flatten().is_none() {
                let _ = leases.create(&PostParams::default(), &lease).await;
            } else {
                let _ = leases
                    .patch(
                        &name,
                        &PatchParams::default(),
                        &Patch::Merge(json!({"spec": {
                        "renewTime": k8s_openapi::jiff::Timestamp::now().to_string()}})),
                    )
                    .await;
            }
            tokio::time::sleep(Duration::from_secs(5)).await;
        }
    })
}

/// Decision 28: with two nodes, the scheduler puts the two replicas of each shard on different
/// nodes (the default, preferred anti-affinity), for both shards of a 2×2 cluster.
#[tokio::test]
async fn the_replicas_of_each_shard_are_scheduled_on_different_nodes() {
    let client = client().await;
    let ns = namespace(&client, "place").await;
    let node = format!("{ns}-node");
    let keep_ready = fake_node(&client, &node).await;
    let op = start_operator(&client, &ns, false).await;
    create_cluster(
        &client,
        &ns,
        "c1",
        json!({"shards": 2, "replicas": 2, "storage": {"size": "1Gi"}, "keeper": {"replicas": 1},
            "pod": {"tolerations": [{"key": TAINT, "operator": "Exists", "effect": "NoSchedule"}]}}),
    )
    .await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), &ns);
    // where the scheduler put each server pod: (shard, node)
    let placed: BTreeMap<String, (String, String)> =
        wait_for(Duration::from_secs(180), "every server pod placed", || {
            let (pods, pvcs) = (pods.clone(), pvcs.clone());
            async move {
                let list = pods
                    .list(
                        &kube::api::ListParams::default()
                            .labels("clickhouse.com/cluster=c1,app.kubernetes.io/component=server"),
                    )
                    .await
                    .ok()?;
                let mut out = BTreeMap::new();
                for p in &list.items {
                    let name = p.metadata.name.clone()?;
                    let shard = p
                        .metadata
                        .labels
                        .as_ref()?
                        .get("clickhouse.com/shard")?
                        .clone();
                    let bound = p.spec.as_ref().and_then(|s| s.node_name.clone());
                    let selected = match bound {
                        Some(n) => Some(n),
                        None => pvcs
                            .get_opt(&format!("data-{name}"))
                            .await
                            .ok()??
                            .metadata
                            .annotations
                            .and_then(|a| a.get("volume.kubernetes.io/selected-node").cloned()),
                    };
                    out.insert(name, (shard, selected?));
                }
                (out.len() == 4).then_some(out)
            }
        })
        .await;
    let mut by_shard: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (shard, n) in placed.values() {
        by_shard.entry(shard).or_default().push(n);
    }
    assert_eq!(by_shard.len(), 2, "{placed:?}");
    for (shard, nodes) in &by_shard {
        assert_eq!(nodes.len(), 2, "{placed:?}");
        assert_ne!(nodes[0], nodes[1], "shard {shard} on one node: {placed:?}");
    }
    finish(&client, &ns, op).await;
    keep_ready.abort();
    let _ = Api::<Node>::all(client.clone())
        .delete(&node, &DeleteParams::default())
        .await;
}
