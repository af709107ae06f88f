//! A node drained and a node stopped for a while (decisions 46 and 47), and a node that never
//! comes back, its replicas replaced when asked (decision 54).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use clickhouse_operator::api::{ClickHouseCluster, ClusterState};
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};
use serde_json::json;

use super::{SERVERS, off_runtime, placement, shard_of};
use crate::support::*;
use crate::workload::*;

/// Samples every 500 ms how many server pods of each shard are Ready; returns the smallest
/// count seen per shard, with when it was first seen at zero.
struct ShardWatch {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<BTreeMap<String, usize>>,
}

impl ShardWatch {
    fn start(client: &Client, ns: &str) -> ShardWatch {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
        let task = tokio::spawn(async move {
            let mut least: BTreeMap<String, usize> = BTreeMap::new();
            while !flag.load(Ordering::SeqCst) {
                let now = placement(&pods, SERVERS).await;
                if !now.is_empty() {
                    let mut ready: BTreeMap<String, usize> = BTreeMap::new();
                    for (pod, (_, r)) in &now {
                        *ready.entry(shard_of(pod)).or_default() += usize::from(*r);
                    }
                    for (shard, n) in ready {
                        let e = least.entry(shard).or_insert(n);
                        *e = (*e).min(n);
                    }
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            least
        });
        ShardWatch { stop, task }
    }

    async fn stop(self) -> BTreeMap<String, usize> {
        self.stop.store(true, Ordering::SeqCst);
        self.task.await.unwrap()
    }
}

/// The PVCs of the cluster by name, with their uid.
async fn pvc_uids(client: &Client, ns: &str) -> BTreeMap<String, String> {
    Api::<PersistentVolumeClaim>::namespaced(client.clone(), ns)
        .list(&ListParams::default().labels("clickhouse.com/cluster=c1"))
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|p| (p.name_any(), p.metadata.uid.unwrap_or_default()))
        .collect()
}

/// Decisions 46 and 47: a 2×2 cluster
/// with 3 Keeper members, each shard's replicas and the members on distinct nodes
/// (`antiAffinity: Required`), rows written every second throughout:
///
/// 1. a node is drained (`kubectl drain`, evictions through the eviction API): the shards'
///    PodDisruptionBudgets let one replica of each go, no shard is ever without a Ready
///    replica, the evicted pods wait for their node (local volumes), the status is not
///    `ready` meanwhile, and after `uncordon` they come back on it and the cluster is `ready`;
/// 2. a node's agent is stopped for 90 s: within a minute the status names the replicas that are
///    down, nothing is deleted or replaced (the pods, StatefulSets and PVCs keep their uids),
///    and after it starts again the cluster is `ready`;
///
/// then every acknowledged row is on every replica of its shard.
#[tokio::test]
async fn a_drained_node_and_a_stopped_node_cost_no_row_and_no_shard() {
    let _nodes = NODE_DISRUPTION.lock().await;
    let client = multi_node_client().await;
    let ns = namespace(&client, "nodebad").await;
    let op = start_operator(&client, &ns, false).await;
    create_cluster(
        &client,
        &ns,
        "c1",
        json!({"shards": 2, "replicas": 2, "storage": {"size": "1Gi"},
               "pod": {"antiAffinity": "Required"},
               "keeper": {"replicas": 3, "pod": {"antiAffinity": "Required"}}}),
    )
    .await;
    wait_ready(&client, &ns, "c1", 1).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let before = placement(&pods, SERVERS).await;
    println!("servers by node: {before:?}");
    for shard in ["0", "1"] {
        let nodes: BTreeSet<&String> = before
            .iter()
            .filter(|(p, _)| shard_of(p) == shard)
            .map(|(_, (n, _))| n)
            .collect();
        assert_eq!(
            nodes.len(),
            2,
            "shard {shard}'s replicas share a node: {before:?}"
        );
    }
    let workload = Workload::start(&client, &ns, "c1").await;
    let watch = ShardWatch::start(&client, &ns);

    // 1. drain the node of the first server pod
    let (victim_pod, (node, _)) = before.iter().next().unwrap();
    let node = node.clone();
    let on_node: Vec<String> = before
        .iter()
        .filter(|(_, (n, _))| *n == node)
        .map(|(p, _)| p.clone())
        .collect();
    println!("draining {node} (servers {on_node:?}, {victim_pod} among them)");
    let started = Instant::now();
    let out = off_runtime({
        let node = node.clone();
        move || {
            multi_node_kubectl(&[
                "drain",
                &node,
                "--ignore-daemonsets",
                "--delete-emptydir-data",
                "--timeout=240s",
            ])
        }
    })
    .await;
    println!("drained in {:?}: {}", started.elapsed(), out.trim());
    // the evicted pods wait for their volumes' node
    tokio::time::sleep(Duration::from_secs(15)).await;
    let during = placement(&pods, SERVERS).await;
    for p in &on_node {
        let (n, ready) = during.get(p).cloned().unwrap_or_default();
        assert!(
            !ready && (n.is_empty() || n == node),
            "{p} should wait for {node} (its local volume): on {n:?}, ready {ready}"
        );
    }
    let c: ClickHouseCluster = Api::namespaced(client.clone(), &ns)
        .get("c1")
        .await
        .unwrap();
    let status = c.status.unwrap_or_default();
    assert_ne!(status.state, ClusterState::Ready, "{status:?}");
    println!(
        "status while drained: {} {:?}",
        status.state, status.message
    );
    off_runtime({
        let node = node.clone();
        move || multi_node_kubectl(&["uncordon", &node])
    })
    .await;
    wait_ready(&client, &ns, "c1", 1).await;
    let after = placement(&pods, SERVERS).await;
    for p in &on_node {
        assert_eq!(
            after.get(p).map(|(n, _)| n.as_str()),
            Some(node.as_str()),
            "{p} is back on its node"
        );
    }
    println!("back after the drain in {:?}", started.elapsed());

    // 2. stop the agent of another node for 90 s
    let node2 = after
        .values()
        .map(|(n, _)| n.clone())
        .filter(|n| *n != node)
        .max()
        .unwrap();
    let down: Vec<String> = after
        .iter()
        .filter(|(_, (n, _))| *n == node2)
        .map(|(p, _)| p.clone())
        .collect();
    let uids_before = pod_ids(&client, &ns, "clickhouse.com/cluster=c1").await;
    let pvcs_before = pvc_uids(&client, &ns).await;
    println!("stopping {node2} (servers {down:?})");
    let stopped = Instant::now();
    off_runtime({
        let node = node2.clone();
        move || node_stop(&node)
    })
    .await;
    // the node controller marks the pods not Ready after its grace period (10 s here); the
    // status follows at the next pass, which on a loaded machine may wait for servers that
    // no longer answer: a minute at most
    let clusters: Api<ClickHouseCluster> = Api::namespaced(client.clone(), &ns);
    let mut named = None;
    let mut last = String::new();
    while named.is_none() && stopped.elapsed() < Duration::from_secs(60) {
        if let Some(s) = clusters.get("c1").await.ok().and_then(|c| c.status) {
            last = s.message.clone().unwrap_or_default();
            let all = down
                .iter()
                .all(|p| last.contains(&format!("pod {p}: node {node2} stopped reporting")));
            if s.state != ClusterState::Ready && all {
                named = Some(stopped.elapsed());
            }
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    println!("{named:?} after the stop: {last}");
    tokio::time::sleep(Duration::from_secs(90).saturating_sub(stopped.elapsed())).await;
    let uids_down = pod_ids(&client, &ns, "clickhouse.com/cluster=c1").await;
    let pvcs_down = pvc_uids(&client, &ns).await;
    // the node comes back whatever was found, so that the tests after this one have it
    off_runtime({
        let node = node2.clone();
        move || node_start(&node)
    })
    .await;
    assert!(
        named.is_some(),
        "the status did not name the replicas of the stopped node within a minute: {last}"
    );
    // the operator deletes or replaces pods, never restarts a container: a container that a
    // kubelet restarted meanwhile is shown with why, not counted against the operator
    report_restarts(&client, &ns, &uids_before, &uids_down).await;
    assert_eq!(
        uids(&uids_down),
        uids(&uids_before),
        "a pod was deleted or replaced while its node was down"
    );
    assert_eq!(pvcs_down, pvcs_before, "a PVC changed");
    wait_ready(&client, &ns, "c1", 1).await;
    println!("ready {:?} after the stop", stopped.elapsed());

    let least = watch.stop().await;
    println!("fewest Ready replicas per shard: {least:?}");
    assert!(
        least.values().all(|n| *n >= 1) && least.len() == 2,
        "a shard had no Ready replica: {least:?}"
    );
    let rows = workload.stop_and_check(&client, &ns).await;
    println!("{rows} acknowledged batches on every replica");
    finish(&client, &ns, op).await;
}

/// Decision 54 (issue scenario "PVCs on a node that never comes back"): a 2×2 cluster with
/// `antiAffinity: Required` and its one Keeper member on node-1, rows written and checked on
/// every replica first (see the test for why not while the node goes). A
/// node holding servers stops and stays down: nothing is replaced by itself (decision 47);
/// annotating the cluster `clickhouse.com/replace-replicas` with the replicas of that node
/// gives them up: new replicas with new names start on the nodes left (each shard's replicas
/// still on distinct nodes), get the schema and the data from their shards, and the cluster is
/// `ready` with the node still down; the status no longer lists the old replicas and, on 18.16
/// (no `SYSTEM DROP REPLICA`), names their Keeper metadata left behind. The node then comes
/// back: the old pods go, the new replicas are not disturbed, and every replica, the new ones
/// included, holds every row of its shard.
#[tokio::test]
async fn replicas_of_a_node_that_never_comes_back_are_replaced_when_asked() {
    let _nodes = NODE_DISRUPTION.lock().await;
    let client = multi_node_client().await;
    let ns = namespace(&client, "nodegone").await;
    let op = start_operator(&client, &ns, false).await;
    create_cluster(
        &client,
        &ns,
        "c1",
        json!({"shards": 2, "replicas": 2, "storage": {"size": "1Gi"},
               "pod": {"antiAffinity": "Required"},
               "keeper": {"replicas": 1,
                          "pod": {"nodeSelector": {"kubernetes.io/hostname": "node-1"}}}}),
    )
    .await;
    wait_ready(&client, &ns, "c1", 1).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let before = placement(&pods, SERVERS).await;
    println!("servers by node: {before:?}");
    // the node other than Keeper's with the most servers
    let mut per_node: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (pod, (node, _)) in &before {
        per_node.entry(node.clone()).or_default().push(pod.clone());
    }
    let (node, lost_pods) = per_node
        .into_iter()
        .filter(|(n, _)| n != "node-1")
        .max_by_key(|(_, p)| p.len())
        .expect("servers outside node-1");
    let lost: Vec<String> = lost_pods
        .iter()
        .map(|p| p.strip_suffix("-0").unwrap().to_string())
        .collect();
    // Rows written, then every acknowledged one checked on every replica, before the node
    // goes: a row only one replica has when its node is lost for good is lost with it, whatever
    // an operator does (replication is asynchronous), and on 18.16 (no SYSTEM DROP REPLICA)
    // its part holds the survivors' replication queues until the lost replica's Keeper
    // metadata is removed by hand; with insert_quorum, a quorum the lost replica was part of
    // holds every later quorum insert of its shard. What the replacement must keep is every
    // row the shard holds.
    let workload = Workload::start(&client, &ns, "c1").await;
    tokio::time::sleep(Duration::from_secs(10)).await;
    let batches = workload.stop_and_check(&client, &ns).await;
    let shard_rows = |pod: String| {
        let (client, ns) = (client.clone(), ns.clone());
        async move {
            let ch = sql_client(&client, &ns, "c1", &pod).await;
            exec(&ch, "SYSTEM SYNC REPLICA default.events").await;
            query(&ch, "SELECT count() AS v FROM default.events").await[0].clone()
        }
    };
    let mut rows_before = BTreeMap::new();
    for pod in before.keys() {
        rows_before.insert(shard_of(pod), shard_rows(pod.clone()).await);
    }
    println!("{batches} acknowledged batches on every replica; rows per shard {rows_before:?}");

    println!("stopping {node} for good (servers {lost_pods:?})");
    off_runtime({
        let node = node.clone();
        move || node_stop(&node)
    })
    .await;
    let clusters: Api<ClickHouseCluster> = Api::namespaced(client.clone(), &ns);
    wait_status(
        &client,
        &ns,
        "c1",
        Duration::from_secs(90),
        "the lost node's replicas in the status",
        |s| {
            let m = s.message.as_deref().unwrap_or_default();
            lost_pods
                .iter()
                .all(|p| m.contains(&format!("pod {p}: node {node} stopped reporting")))
        },
    )
    .await;
    // nothing is replaced by itself
    tokio::time::sleep(Duration::from_secs(10)).await;
    let c = clusters.get("c1").await.unwrap();
    assert_eq!(replica_names(&c).len(), 4, "{:?}", replica_names(&c));

    let asked = Instant::now();
    clusters
        .patch(
            "c1",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({"metadata": {"annotations": {
                "clickhouse.com/replace-replicas": lost.join(",")}}})),
        )
        .await
        .unwrap();
    let c = wait_status(
        &client,
        &ns,
        "c1",
        Duration::from_secs(300),
        "ready with new replicas in place of the lost ones",
        |s| {
            s.state == ClusterState::Ready
                && s.replica_state_map.len() == 4
                && lost
                    .iter()
                    .all(|r| !s.replica_state_map.contains_key(r.as_str()))
        },
    )
    .await;
    println!(
        "ready {:?} after the annotation, node still down: {:?}",
        asked.elapsed(),
        replica_names(&c)
    );
    let after = placement(&pods, SERVERS).await;
    for shard in ["0", "1"] {
        let nodes: BTreeSet<&String> = after
            .iter()
            .filter(|(p, (_, ready))| shard_of(p) == shard && *ready)
            .map(|(_, (n, _))| n)
            .collect();
        assert_eq!(nodes.len(), 2, "shard {shard}: {after:?}");
        assert!(!nodes.contains(&node), "shard {shard} on {node}: {after:?}");
    }
    let status = c.status.clone().unwrap_or_default();
    let left = status
        .conditions
        .iter()
        .find(|c| c.r#type == "KeeperMetadataLeft" && c.status == "True")
        .map(|c| c.message.clone())
        .unwrap_or_default();
    println!("KeeperMetadataLeft: {left}");
    assert!(
        lost.iter().any(|r| left.contains(r.as_str())),
        "18.16 cannot drop a replica from Keeper: the status should say what stays: {left:?}"
    );

    // the node comes back: the old pods go, the new replicas stay as they are
    let kept = pod_ids(&client, &ns, SERVERS).await;
    off_runtime({
        let node = node.clone();
        move || node_start(&node)
    })
    .await;
    wait_for(
        Duration::from_secs(120),
        "the old pods gone after their node came back",
        || {
            let pods = pods.clone();
            let lost_pods = lost_pods.clone();
            async move {
                let now = placement(&pods, SERVERS).await;
                lost_pods.iter().all(|p| !now.contains_key(p)).then_some(())
            }
        },
    )
    .await;
    wait_ready(&client, &ns, "c1", 1).await;
    let now = pod_ids(&client, &ns, SERVERS).await;
    for (pod, id) in &kept {
        if !lost_pods.contains(pod) {
            assert_eq!(now.get(pod), Some(id), "{pod} was disturbed");
        }
    }
    // every row of each shard on each of its replicas, the new ones included
    for pod in placement(&pods, SERVERS).await.keys() {
        assert_eq!(
            shard_rows(pod.clone()).await,
            rows_before[&shard_of(pod)],
            "{pod} holds its shard's rows"
        );
    }
    finish(&client, &ns, op).await;
}

/// Pod name → uid of [`pod_ids`]' answer.
fn uids(ids: &BTreeMap<String, (String, i32)>) -> BTreeMap<String, String> {
    ids.iter()
        .map(|(p, (u, _))| (p.clone(), u.clone()))
        .collect()
}

/// Prints each container whose restart count grew between `before` and `after`, with the
/// reason, exit code and message of its last termination.
async fn report_restarts(
    client: &Client,
    ns: &str,
    before: &BTreeMap<String, (String, i32)>,
    after: &BTreeMap<String, (String, i32)>,
) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    for (name, (_, n)) in after {
        if before.get(name).is_none_or(|(_, m)| m >= n) {
            continue;
        }
        let last = pods
            .get(name)
            .await
            .ok()
            .and_then(|p| p.status?.container_statuses)
            .unwrap_or_default()
            .into_iter()
            .filter_map(|c| {
                let t = c.last_state?.terminated?;
                Some(format!(
                    "{}: {:?} exit {} at {:?}: {}",
                    c.name,
                    t.reason,
                    t.exit_code,
                    t.finished_at,
                    t.message.unwrap_or_default()
                ))
            })
            .collect::<Vec<_>>();
        println!("container of {name} restarted by its kubelet: {last:?}");
    }
}
