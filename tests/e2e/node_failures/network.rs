//! NetworkPolicies enforced across the nodes: the generated ones checked by real connections,
//! and a replica cut off from Keeper, then from everything.

use std::time::{Duration, Instant};

use clickhouse_operator::api::{ClickHouseCluster, ClusterState};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::api::Api;
use kube::{Client, ResourceExt};
use serde_json::json;

use crate::support::*;
use crate::workload::*;

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
    let cluster_ip = service_ip(&client, &ns, "c1").await;
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
