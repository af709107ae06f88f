//! Node-level bad days on the local Kubernetes of three nodes in three zones
//! (`support::multi_node_client`), with real 18.16 servers and the Keeper stand-in: a node
//! drained while a client writes, a node's agent stopped for 90 s, and where the scheduler puts
//! the pods (`antiAffinity: Required` with fewer nodes than replicas, `topologySpreadKey` over
//! the zones). The nodes' volumes are local: a pod's PV binds it to its node, so a pod of a
//! drained or stopped node waits for that node (documented in `docs/operations.md`).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use clickhouse_operator::api::{ClickHouseCluster, ClusterState};
use clickhouse_operator::plan::facts::pod_ready;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};
use serde_json::json;

use crate::support::*;
use crate::workload::*;

const SERVERS: &str = "clickhouse.com/cluster=c1,app.kubernetes.io/component=server";

/// Per pod of the cluster: (node, Ready).
async fn placement(pods: &Api<Pod>, selector: &str) -> BTreeMap<String, (String, bool)> {
    pods.list(&ListParams::default().labels(selector))
        .await
        .map(|l| l.items)
        .unwrap_or_default()
        .into_iter()
        .map(|p| {
            let node = p
                .spec
                .as_ref()
                .and_then(|s| s.node_name.clone())
                .unwrap_or_default();
            let ready = pod_ready(&p);
            (p.name_any(), (node, ready))
        })
        .collect()
}

/// The shard of a server pod `c1-<shard>-<index>-0`.
fn shard_of(pod: &str) -> String {
    pod.split('-').nth(1).unwrap_or_default().to_string()
}

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

/// Runs a blocking call (a command) off the test's runtime, where the writer and the samplers
/// run.
async fn off_runtime<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(f).await.unwrap()
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

/// Placement by the real scheduler over three nodes in three zones: a shard of three replicas
/// with `antiAffinity: Required` and `topologySpreadKey: topology.kubernetes.io/zone` has one
/// replica per zone, and so have the three Keeper members (`antiAffinity: Required`); a fourth
/// replica, which no node may take, stays Pending with the scheduler's reason in the status
/// while the others run undisturbed (no pod replaced), and asking for three again removes it.
#[tokio::test]
async fn required_anti_affinity_and_zone_spread_as_the_scheduler_places_them() {
    let _nodes = NODE_DISRUPTION.lock().await;
    let client = multi_node_client().await;
    let ns = namespace(&client, "nodeplace").await;
    let op = start_operator(&client, &ns, false).await;
    create_cluster(
        &client,
        &ns,
        "c1",
        json!({"shards": 1, "replicas": 3, "storage": {"size": "1Gi"},
               "pod": {"antiAffinity": "Required", "topologySpreadKey": "topology.kubernetes.io/zone"},
               "keeper": {"replicas": 3, "pod": {"antiAffinity": "Required"}}}),
    )
    .await;
    wait_ready(&client, &ns, "c1", 1).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    // one node per zone: node-1 zone-a, node-2 zone-b, node-3 zone-c
    for selector in [
        SERVERS,
        "clickhouse.com/cluster=c1,app.kubernetes.io/component=keeper",
    ] {
        let placed = placement(&pods, selector).await;
        let nodes: BTreeSet<&String> = placed.values().map(|(n, _)| n).collect();
        assert_eq!(nodes.len(), 3, "{selector}: {placed:?}");
    }
    let before = pod_ids(&client, &ns, "clickhouse.com/cluster=c1").await;
    patch_spec(&client, &ns, "c1", json!({"replicas": 4})).await;
    let reason = wait_status(
        &client,
        &ns,
        "c1",
        Duration::from_secs(120),
        "the scheduler's reason in the status",
        |s| {
            s.message
                .as_deref()
                .is_some_and(|m| m.contains("cannot be scheduled"))
        },
    )
    .await
    .status
    .unwrap()
    .message
    .unwrap_or_default();
    println!("status: {reason}");
    assert!(
        reason.contains("anti-affinity"),
        "the scheduler's reason: {reason}"
    );
    let placed = placement(&pods, SERVERS).await;
    assert_eq!(placed.values().filter(|(_, r)| *r).count(), 3, "{placed:?}");
    let now = pod_ids(&client, &ns, "clickhouse.com/cluster=c1").await;
    for (pod, id) in &before {
        assert_eq!(now.get(pod), Some(id), "{pod} was disturbed");
    }
    patch_spec(&client, &ns, "c1", json!({"replicas": 3})).await;
    wait_ready(&client, &ns, "c1", 3).await;
    assert_eq!(placement(&pods, SERVERS).await.len(), 3);
    finish(&client, &ns, op).await;
}

/// Whether a TCP connection from inside the pod with address `from` (its network namespace,
/// where the node agent enforces the NetworkPolicies) to `to`:`port` opens within 3 s. The
/// ClusterIP proxy accepts a connection and then resets a refused one: with `answer`, an HTTP
/// request is sent and a byte of the answer read too.
fn connects(from: &str, to: &str, port: u16, answer: bool) -> bool {
    let o: Vec<&str> = from.split('.').collect();
    let netns = format!("lk-{}-{}", o[2], o[3]);
    let script = if answer {
        format!(
            "exec 3<>/dev/tcp/{to}/{port} && printf 'GET /ping HTTP/1.0\\r\\n\\r\\n' >&3 && head -c 1 <&3 | grep -q ."
        )
    } else {
        format!("exec 3<>/dev/tcp/{to}/{port}")
    };
    std::process::Command::new("timeout")
        .args(["3", "ip", "netns", "exec", &netns, "bash", "-c", &script])
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// A pod of the node agent's light mode (no process but its network), with `labels`.
async fn bystander(client: &Client, ns: &str, name: &str, labels: serde_json::Value) -> String {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": name, "labels": labels,
                     "annotations": {"local-kubelet.clickhouse.com/hollow": "true"}},
        "spec": {"terminationGracePeriodSeconds": 1,
                 "containers": [{"name": "c", "image": "clickhouse/clickhouse-server:24.8"}]}
    }))
    .unwrap();
    pods.create(&Default::default(), &pod).await.unwrap();
    wait_for(
        Duration::from_secs(60),
        &format!("{name}'s address"),
        || {
            let pods = pods.clone();
            async move { pods.get(name).await.ok()?.status?.pod_ip }
        },
    )
    .await
}

/// The network of the operator run by the tests: it runs on this machine, whose connections
/// reach every pod (as a node's reach its own pods), so its network is the node network's first
/// /24 (the gateway and the nodes' addresses), not the pod network its default would guess
/// outside a pod.
fn node_network() -> String {
    let network = std::fs::read_to_string(multi_node_dir().join("network")).unwrap();
    let gateway = network
        .lines()
        .find_map(|l| l.strip_prefix("GATEWAY="))
        .expect("GATEWAY in the cluster's network file");
    format!("{}.0/24", gateway.rsplit_once('.').unwrap().0)
}

/// Decision 27 under an enforcing network (decision 46): the NetworkPolicies the operator
/// generates let the cluster work (rows written through the client Service, replicated,
/// queried across shards, Keeper used by every server: every acknowledged row on both
/// replicas) and refuse what they should, checked by real connections from pods of the
/// namespace: a pod the `networkPolicy.clients` peers name reaches the client ports (directly
/// and through the client Service) but not the interserver port or Keeper; any other pod
/// reaches none of them; a server reaches Keeper and its peer's interserver port.
#[tokio::test]
async fn the_generated_network_policies_let_the_cluster_work_and_refuse_the_rest() {
    let _nodes = NODE_DISRUPTION.lock().await;
    let client = multi_node_client().await;
    let ns = namespace(&client, "nodepol").await;
    let op = start_operator_env(&client, &ns, &[("OPERATOR_NETWORKS", &node_network())]).await;
    create_cluster(
        &client,
        &ns,
        "c1",
        json!({"shards": 1, "replicas": 2, "storage": {"size": "1Gi"}, "keeper": {"replicas": 1},
               "networkPolicy": {"clients": [{"podSelector": {"matchLabels": {"role": "app"}}}]}}),
    )
    .await;
    wait_ready(&client, &ns, "c1", 1).await;
    let workload = Workload::start(&client, &ns, "c1").await;
    let app = bystander(&client, &ns, "app", json!({"role": "app"})).await;
    let stranger = bystander(&client, &ns, "stranger", json!({"role": "other"})).await;
    let server = pod_ip(&client, &ns, "c1-0-0-0").await;
    let peer = pod_ip(&client, &ns, "c1-0-1-0").await;
    let keeper = pod_ip(&client, &ns, "c1-keeper-0").await;
    let service: Api<k8s_openapi::api::core::v1::Service> = Api::namespaced(client.clone(), &ns);
    let cluster_ip = service
        .get("c1")
        .await
        .unwrap()
        .spec
        .and_then(|s| s.cluster_ip)
        .unwrap();
    let cases: [(&str, &str, &str, u16, bool); 10] = [
        ("app", &app, &server, 8123, true),
        ("app", &app, &cluster_ip, 8123, true),
        ("app", &app, &server, 9009, false),
        ("app", &app, &keeper, 9181, false),
        ("stranger", &stranger, &server, 8123, false),
        ("stranger", &stranger, &cluster_ip, 8123, false),
        ("stranger", &stranger, &server, 9009, false),
        ("stranger", &stranger, &keeper, 9181, false),
        ("server", &server, &keeper, 9181, true),
        ("server", &server, &peer, 9009, true),
    ];
    let mut wrong = Vec::new();
    for (who, from, to, port, want) in cases {
        // a policy takes effect within about a second of its change
        let mut got = !want;
        for _ in 0..3 {
            // off the test's runtime, where the writer runs
            let (f, t, answer) = (from.to_string(), to.to_string(), to == cluster_ip);
            got = tokio::task::spawn_blocking(move || connects(&f, &t, port, answer))
                .await
                .unwrap();
            if got == want {
                break;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        println!(
            "{who} -> {to}:{port}: {}",
            if got { "open" } else { "refused" }
        );
        if got != want {
            wrong.push(format!(
                "{who} -> {to}:{port} should be {}",
                if want { "open" } else { "refused" }
            ));
        }
    }
    assert!(wrong.is_empty(), "{wrong:?}");
    let rows = workload.stop_and_check(&client, &ns).await;
    println!("{rows} acknowledged batches on both replicas");
    assert!(
        rows >= 10,
        "the cluster did not work through its policies: {rows} batches"
    );
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    for name in ["app", "stranger"] {
        pods.delete(name, &Default::default()).await.unwrap();
    }
    finish(&client, &ns, op).await;
}

/// A NetworkPolicy that limits the egress of the pod `pod` to `to` (none: nothing at all).
fn egress_only(pod: &str, to: Option<serde_json::Value>) -> NetworkPolicy {
    let egress = to
        .map(|peers| vec![json!({"to": peers})])
        .unwrap_or_default();
    serde_json::from_value(json!({
        "metadata": {"name": "cut-off"},
        "spec": {"podSelector": {"matchLabels": {"statefulset.kubernetes.io/pod-name": pod}},
                 "policyTypes": ["Egress"], "egress": egress}
    }))
    .unwrap()
}

/// Waits (up to `within`) until the status is not `ready` and its message names `replica`
/// with one of `words`; the message, or a panic naming the last one seen.
async fn status_names(
    client: &Client,
    ns: &str,
    replica: &str,
    words: &[&str],
    within: Duration,
) -> String {
    let clusters: Api<ClickHouseCluster> = Api::namespaced(client.clone(), ns);
    let started = Instant::now();
    let mut last = String::new();
    while started.elapsed() < within {
        if let Some(s) = clusters.get("c1").await.ok().and_then(|c| c.status) {
            last = s.message.clone().unwrap_or_default();
            let named = last
                .split(&format!("{replica} ("))
                .nth(1)
                .is_some_and(|rest| words.iter().any(|w| rest.contains(w)));
            if s.state != ClusterState::Ready && named {
                return last;
            }
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    panic!("the status did not name {replica} ({words:?}) within {within:?}: {last}");
}

/// Issue scenario "one replica cut off from Keeper, then from everything" (decision 46 for the
/// enforcing network; decisions 45 and 53 for the operator): a 2×2 cluster with one Keeper
/// member under its generated NetworkPolicies, rows written every second through the client
/// Service. A NetworkPolicy limits one server's egress:
///
/// 1. to the other servers only, for at least 60 s: its Keeper session expires, its replicated
///    table is read-only (checked on the server), and the status, `ready` until then, names
///    the replica and why;
/// 2. to nothing, for 60 s: the status still names it;
///
/// then the policy is deleted: the cluster is `ready` again without a pod replaced, and every
/// acknowledged row is on every replica of its shard, the cut-off one included. Egress only:
/// NetworkPolicies add up, and the operator's own ingress rules let the other servers reach it
/// (fetches from it, Distributed queries into it); what it cannot do is open a connection.
#[tokio::test]
async fn a_replica_cut_off_from_keeper_then_from_everything_is_reported_and_catches_up() {
    let _nodes = NODE_DISRUPTION.lock().await;
    let client = multi_node_client().await;
    let ns = namespace(&client, "nodecut").await;
    let op = start_operator_env(&client, &ns, &[("OPERATOR_NETWORKS", &node_network())]).await;
    create_cluster(
        &client,
        &ns,
        "c1",
        json!({"shards": 2, "replicas": 2, "storage": {"size": "1Gi"}, "keeper": {"replicas": 1}}),
    )
    .await;
    wait_ready(&client, &ns, "c1", 1).await;
    let uids_before = pod_ids(&client, &ns, "clickhouse.com/cluster=c1").await;
    let workload = Workload::start(&client, &ns, "c1").await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let (replica, pod) = ("c1-0-0", "c1-0-0-0");
    let victim = sql_client(&client, &ns, "c1", pod).await;
    let policies: Api<NetworkPolicy> = Api::namespaced(client.clone(), &ns);

    // 1. cut off from Keeper: the other servers only
    let cut = Instant::now();
    policies
        .create(
            &Default::default(),
            &egress_only(
                pod,
                Some(json!([{"podSelector": {"matchLabels": {
                    "clickhouse.com/cluster": "c1", "app.kubernetes.io/component": "server"}}}])),
            ),
        )
        .await
        .unwrap();
    let said = status_names(
        &client,
        &ns,
        replica,
        &["read-only", "Keeper"],
        Duration::from_secs(150),
    )
    .await;
    println!("{:?} after the cut from Keeper: {said}", cut.elapsed());
    tokio::time::sleep(Duration::from_secs(60).saturating_sub(cut.elapsed())).await;
    let read_only = query(
        &victim,
        "SELECT toString(max(is_readonly)) AS v FROM system.replicas",
    )
    .await;
    assert_eq!(
        read_only,
        ["1"],
        "the cut-off replica's table should be read-only"
    );

    // 2. cut off from everything
    let all = Instant::now();
    policies
        .replace("cut-off", &Default::default(), &{
            let mut p = egress_only(pod, None);
            p.metadata.resource_version = policies.get("cut-off").await.unwrap().resource_version();
            p
        })
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(60)).await;
    let said = status_names(&client, &ns, replica, &[""], Duration::from_secs(5)).await;
    println!("{:?} after the cut from everything: {said}", all.elapsed());

    // the policy goes: the replica catches up
    let healed = Instant::now();
    policies
        .delete("cut-off", &Default::default())
        .await
        .unwrap();
    wait_ready(&client, &ns, "c1", 1).await;
    println!("ready {:?} after the policy went", healed.elapsed());
    assert_eq!(
        pod_ids(&client, &ns, "clickhouse.com/cluster=c1").await,
        uids_before,
        "a pod was deleted or replaced"
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
                && lost.iter().all(|r| !s.replica_state_map.contains_key(r))
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
