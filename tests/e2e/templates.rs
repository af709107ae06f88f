//! Pod templates (decision 28) on the local Kubernetes with real ClickHouse 18.16 servers: what the
//! user's template adds runs in the pods (a pull secret is recorded by the node agent), a change to it rolls them one at a time, and a
//! template that sets what the operator owns is refused without touching a pod.

use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use serde_json::json;

use crate::support::*;
use clickhouse_operator::api::ClusterState;

/// The template: a pull secret, an init container that writes `word` into a volume of its own,
/// mounted in the server container at ClickHouse's `user_files` folder (nested in the data
/// volume's mount).
fn template(word: &str) -> serde_json::Value {
    json!({"spec": {
        "imagePullSecrets": [{"name": "registry"}],
        "initContainers": [{
            "name": "prepare",
            "image": "busybox",
            "command": ["sh", "-c", format!("echo {word} > /files/marker")],
            "volumeMounts": [{"name": "user-files", "mountPath": "/files"}],
            "securityContext": {"allowPrivilegeEscalation": false,
                "capabilities": {"drop": ["ALL"]}}
        }],
        "volumes": [{"name": "user-files", "emptyDir": {}}],
        "containers": [{
            "name": "clickhouse",
            "volumeMounts": [{"name": "user-files", "mountPath": "/var/lib/clickhouse/user_files"}]
        }]
    }})
}

/// The marker each server reads through `file()` (from its `user_files`), by pod.
async fn markers(client: &kube::Client, ns: &str, pods: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    for p in pods {
        let ch = sql_client(client, ns, "c1", p).await;
        let v = query(&ch, "SELECT s AS v FROM file('marker', 'TSV', 's String')").await;
        out.push(v.join(","));
    }
    out
}

/// Decision 28: an init container and an extra volume from `spec.pod.template` are in the running
/// server pods (the init container ran first: the server reads what it wrote, through a mount
/// nested in the data volume's), a pull secret from `spec.keeper.pod.template` is on the Keeper
/// pod; changing the template restarts every server pod exactly once, one at a time, the backup
/// replica last (Smart Update), and the servers then read the new marker. A template that sets
/// the main container's image is refused with the field named, no pod restarts, and reverting
/// it heals the cluster.
#[tokio::test]
async fn a_pod_template_adds_init_containers_and_volumes_and_a_change_rolls_one_at_a_time() {
    let (Scenario { client, ns, op }, c) = Scenario::ready(
        "tmpl",
        json!({"replicas": 2, "storage": {"size": "1Gi"}, "pod": {"template": template("one")},
            "keeper": {"replicas": 1, "pod": {"template":
                {"spec": {"imagePullSecrets": [{"name": "registry"}]}}}}}),
    )
    .await;
    let pods_api: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let servers: Vec<String> = replica_names(&c)
        .into_iter()
        .map(|r| format!("{r}-0"))
        .collect();
    assert_eq!(servers.len(), 2);
    for name in &servers {
        let p = pods_api.get(name).await.unwrap();
        let spec = p.spec.as_ref().unwrap();
        assert_eq!(
            spec.image_pull_secrets.as_ref().unwrap()[0].name,
            "registry"
        );
        assert_eq!(spec.init_containers.as_ref().unwrap()[0].name, "prepare");
        assert!(
            spec.volumes
                .as_ref()
                .unwrap()
                .iter()
                .any(|v| v.name == "user-files")
        );
        let init = &p
            .status
            .as_ref()
            .unwrap()
            .init_container_statuses
            .as_ref()
            .unwrap()[0];
        let done = init.state.as_ref().and_then(|s| s.terminated.as_ref());
        assert_eq!(done.map(|t| t.exit_code), Some(0), "{name}: {init:?}");
    }
    // the node agent recorded the pull secret it was given (it does not exist: the kubelet's
    // own warning, and the container still starts, its image being on the machine)
    let events: Api<k8s_openapi::api::core::v1::Event> = Api::namespaced(client.clone(), &ns);
    let recorded = wait_for(
        std::time::Duration::from_secs(30),
        "the pull events",
        || {
            let (events, pod) = (events.clone(), servers[0].clone());
            async move {
                let list = events.list(&Default::default()).await.ok()?.items;
                let of = |reason: &str| {
                    list.iter()
                        .find(|e| {
                            e.involved_object.name.as_deref() == Some(pod.as_str())
                                && e.reason.as_deref() == Some(reason)
                        })
                        .and_then(|e| e.message.clone())
                };
                Some((of("Pulled")?, of("FailedToRetrieveImagePullSecret")?))
            }
        },
    )
    .await;
    assert!(
        recorded.0.contains("image pull secrets: registry"),
        "{recorded:?}"
    );
    assert!(recorded.1.contains("(registry)"), "{recorded:?}");
    let keeper = pods_api.get("c1-keeper-0").await.unwrap();
    assert_eq!(
        keeper.spec.unwrap().image_pull_secrets.unwrap()[0].name,
        "registry"
    );
    assert_eq!(markers(&client, &ns, &servers).await, ["one", "one"]);

    // a change to the init container: every server pod restarts once, one at a time
    let selector = "clickhouse.com/cluster=c1,app.kubernetes.io/component=server";
    let before = pod_ids(&client, &ns, selector).await;
    patch_spec(
        &client,
        &ns,
        "c1",
        json!({"pod": {"template": template("two")}}),
    )
    .await;
    let (order, most_down) = watch_rollout(&client, &ns, "c1", &before, 2, 2).await;
    assert!(
        most_down <= 1,
        "one server at a time: {most_down} down at once"
    );
    let backup = format!("{}-0", backup_replica(&c));
    assert_eq!(
        order.last(),
        Some(&backup),
        "the backup replica last: {order:?}"
    );
    assert_eq!(markers(&client, &ns, &servers).await, ["two", "two"]);

    // the main container's image set through the template: refused, no pod touched
    let before = pod_ids(&client, &ns, selector).await;
    let mut bad = template("two");
    bad["spec"]["containers"][0]["image"] = json!("clickhouse/clickhouse-server:24.8");
    patch_spec(&client, &ns, "c1", json!({"pod": {"template": bad}})).await;
    let c = wait_status(
        &client,
        &ns,
        "c1",
        std::time::Duration::from_secs(60),
        "the template refused",
        |s| s.state == ClusterState::Error && s.observed_generation == Some(3),
    )
    .await;
    let message = c.status.unwrap().message.unwrap_or_default();
    assert!(
        message.contains("spec.pod.template.spec.containers[clickhouse].image"),
        "{message}"
    );
    tokio::time::sleep(std::time::Duration::from_secs(6)).await;
    assert_eq!(
        pod_ids(&client, &ns, selector).await,
        before,
        "no pod restarted"
    );
    patch_spec(
        &client,
        &ns,
        "c1",
        json!({"pod": {"template": template("two")}}),
    )
    .await;
    wait_ready(&client, &ns, "c1", 4).await;
    assert_eq!(
        pod_ids(&client, &ns, selector).await,
        before,
        "no pod restarted"
    );
    finish(&client, &ns, op).await;
}

/// docs/configuration.md, "Pod templates": with `clientService.perReplica`, every replica gets
/// `<replica>-client`, and a query through it always lands on that replica; the client Service
/// carries the user's labels. Switching it off removes those Services and restarts no pod.
#[tokio::test]
async fn per_replica_services_reach_their_replica_and_go_when_switched_off() {
    use k8s_openapi::api::core::v1::Service;
    let (Scenario { client, ns, op }, c) = Scenario::ready(
        "svc",
        json!({"replicas": 2, "storage": {"size": "1Gi"}, "keeper": {"replicas": 1},
            "clientService": {"perReplica": true, "labels": {"team": "db"}}}),
    )
    .await;
    let services: Api<Service> = Api::namespaced(client.clone(), &ns);
    let client_labels = services.get("c1").await.unwrap().metadata.labels.unwrap();
    assert_eq!(client_labels.get("team").map(String::as_str), Some("db"));
    let replicas = replica_names(&c);
    assert_eq!(replicas.len(), 2);
    for r in &replicas {
        let ip = service_ip(&client, &ns, &format!("{r}-client")).await;
        let ch = sql_client_at(&client, &ns, "c1", &ip, std::time::Duration::from_secs(10)).await;
        for _ in 0..4 {
            assert_eq!(
                query(&ch, "SELECT hostName() AS v").await,
                [format!("{r}-0")],
                "{r}-client reaches {r} only"
            );
        }
    }
    let selector = "clickhouse.com/cluster=c1,app.kubernetes.io/component=server";
    let before = pod_ids(&client, &ns, selector).await;
    patch_spec(
        &client,
        &ns,
        "c1",
        json!({"clientService": {"perReplica": false}}),
    )
    .await;
    wait_ready(&client, &ns, "c1", 2).await;
    wait_for(
        std::time::Duration::from_secs(30),
        "the per-replica Services gone",
        || {
            let services = services.clone();
            let replicas = replicas.clone();
            async move {
                for r in &replicas {
                    if services
                        .get_opt(&format!("{r}-client"))
                        .await
                        .ok()?
                        .is_some()
                    {
                        return None;
                    }
                }
                Some(())
            }
        },
    )
    .await;
    assert!(
        services.get_opt("c1").await.unwrap().is_some(),
        "the client Service stays"
    );
    assert_eq!(
        pod_ids(&client, &ns, selector).await,
        before,
        "no pod restarted"
    );
    finish(&client, &ns, op).await;
}

/// docs/changes.md: `configuration.shardFiles` reach that shard's servers only, and a change
/// restarts only that shard's replicas.
#[tokio::test]
async fn shard_files_reach_one_shard_and_a_change_restarts_only_it() {
    let Scenario { client, ns, op } = Scenario::start("shardf").await;
    let file = |n: u32| {
        json!({"1": {"merge-tree.xml": format!(
            "<clickhouse><merge_tree><parts_to_throw_insert>{n}</parts_to_throw_insert></merge_tree></clickhouse>")}})
    };
    create_cluster(
        &client,
        &ns,
        "c1",
        json!({"shards": 2, "replicas": 1, "storage": {"size": "1Gi"}, "keeper": {"replicas": 1},
            "configuration": {"shardFiles": file(1234)}}),
    )
    .await;
    let c = wait_ready(&client, &ns, "c1", 1).await;
    let by_shard = |c: &clickhouse_operator::api::ClickHouseCluster| {
        let map = &c.status.as_ref().unwrap().replica_state_map;
        let mut v: Vec<(i32, String)> = map
            .iter()
            .map(|(n, r)| (r.shard.get(), format!("{n}-0")))
            .collect();
        v.sort();
        v
    };
    let pods = by_shard(&c);
    let setting =
        "SELECT value AS v FROM system.merge_tree_settings WHERE name = 'parts_to_throw_insert'";
    let values = |pods: Vec<(i32, String)>| {
        let client = client.clone();
        let ns = ns.clone();
        async move {
            let mut out = Vec::new();
            for (_, p) in &pods {
                let ch = sql_client(&client, &ns, "c1", p).await;
                out.push(query(&ch, setting).await.join(","));
            }
            out
        }
    };
    let default = values(vec![pods[0].clone()]).await[0].clone();
    assert_ne!(default, "1234");
    assert_eq!(
        values(pods.clone()).await,
        [default.clone(), "1234".to_string()]
    );
    let selector = "clickhouse.com/cluster=c1,app.kubernetes.io/component=server";
    let before = pod_ids(&client, &ns, selector).await;
    patch_spec(
        &client,
        &ns,
        "c1",
        json!({"configuration": {"shardFiles": file(2345)}}),
    )
    .await;
    wait_ready(&client, &ns, "c1", 2).await;
    let after = pod_ids(&client, &ns, selector).await;
    assert_eq!(
        after[&pods[0].1], before[&pods[0].1],
        "shard 0 not restarted"
    );
    assert_ne!(after[&pods[1].1], before[&pods[1].1], "shard 1 restarted");
    assert_eq!(values(pods.clone()).await, [default, "2345".to_string()]);
    finish(&client, &ns, op).await;
}
