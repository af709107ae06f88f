//! A cluster that uses another cluster's Keeper ensemble (decision 28), on the local Kubernetes
//! with real ClickHouse 18.16 servers and the Keeper stand-in (ZooKeeper 3.8).

use serde_json::json;

use crate::support::*;

async fn count(client: &kube::Client, ns: &str, cluster: &str, pod: &str) -> u64 {
    let ch = sql_client(client, ns, cluster, pod).await;
    exec(&ch, "SYSTEM SYNC REPLICA default.t").await;
    query(&ch, "SELECT count() AS v FROM default.t").await[0]
        .parse()
        .unwrap()
}

/// Decision 28: cluster `b` keeps its replication metadata and DDL queue under its own root in
/// cluster `a`'s Keeper (another namespace): both replicate a table of the same Keeper path
/// without seeing each other's rows, on every replica; `b`'s root exists before its servers
/// start, stays when `b` is deleted with `reclaimPolicy: Retain` (b created again takes it over
/// with its rows) and goes when `b` is deleted with `Delete`, while `a`'s paths and replication
/// are untouched.
/// Decision 38: `b` is refused, with the reason in its status, until `a` lists `b`'s
/// namespace in `spec.keeper.allowedNamespaces`; `b`'s root belongs to `b`'s identity alone, so
/// `a`'s servers can list the roots but not read inside `b`'s. A third cluster on the same
/// ensemble by its members' address can neither nest its root inside `b`'s nor take `b`'s root
/// (refused with the reason, nothing created), and deleting it leaves `b`'s data as it was.
/// Decision 71 (review M-4): that third cluster, in a namespace `a` does not allow, naming `a`'s
/// Keeper by its members (the Keeper Service's address, then its DNS name) rather than by
/// `clusterRef`, is refused as `clusterRef` would be: no server of it starts and nothing is
/// created in `a`'s Keeper (its chosen root `/squat/c` is absent there). What this proves is
/// the operator's side, the deputy every Keeper NetworkPolicy lets in: this cluster does not
/// enforce NetworkPolicies, and the in-process operator reaches every pod from the machine
/// anyway, so without the check the operator created the root and c's servers replicated
/// through `a`'s Keeper. Once `a` allows c's namespace, c's root must lie in its own folder.
#[tokio::test]
async fn a_cluster_on_another_clusters_keeper_replicates_under_its_own_root() {
    let client = client().await;
    let ns_a = namespace(&client, "keepa").await;
    let ns_b = namespace(&client, "keepb").await;
    let ns_c = namespace(&client, "keepc").await;
    let both = format!("{ns_a},{ns_b},{ns_c}");
    let op = start_operator_env(&client, &ns_a, &[("WATCH_NAMESPACE", &both)]).await;
    create_cluster(
        &client,
        &ns_a,
        "a",
        json!({"replicas": 2, "storage": {"size": "1Gi"}, "keeper": {"replicas": 1}}),
    )
    .await;
    create_cluster(
        &client,
        &ns_b,
        "b",
        json!({"replicas": 2, "storage": {"size": "1Gi"},
            "keeper": {"replicas": 0, "external": {"clusterRef": {"name": "a", "namespace": ns_a}}}}),
    )
    .await;
    let refused = wait_status(
        &client,
        &ns_b,
        "b",
        std::time::Duration::from_secs(120),
        "b refused without a's consent",
        |s| {
            let says = |m: &str| m.contains("to its spec.keeper.allowedNamespaces");
            s.message.as_deref().is_some_and(says) || s.conditions.iter().any(|c| says(&c.message))
        },
    )
    .await;
    assert!(
        refused.status.unwrap().keeper_root.is_none(),
        "no root before the consent"
    );
    patch_spec(
        &client,
        &ns_a,
        "a",
        json!({"keeper": {"allowedNamespaces": [ns_b]}}),
    )
    .await;
    let a = wait_ready(&client, &ns_a, "a", 2).await;
    let b = wait_ready(&client, &ns_b, "b", 1).await;
    let root = format!("/clickhouse-operator/{ns_b}/b");
    assert_eq!(
        b.status.as_ref().unwrap().keeper_root.as_deref(),
        Some(root.as_str())
    );
    let pods = |c: &clickhouse_operator::api::ClickHouseCluster| -> Vec<String> {
        replica_names(c)
            .into_iter()
            .map(|r| format!("{r}-0"))
            .collect()
    };
    let (pods_a, pods_b) = (pods(&a), pods(&b));
    // the same Keeper path in both clusters, ON CLUSTER through each one's own DDL queue
    for (ns, name, pod, rows) in [(&ns_a, "a", &pods_a[0], 100), (&ns_b, "b", &pods_b[0], 200)] {
        let ch = sql_client(&client, ns, name, pod).await;
        exec(&ch, &format!("CREATE TABLE default.t ON CLUSTER {name} (x UInt64) ENGINE = ReplicatedMergeTree('/clickhouse/tables/{{shard}}/t', '{{replica}}') ORDER BY x")).await;
        exec(
            &ch,
            &format!("INSERT INTO default.t SELECT number FROM system.numbers LIMIT {rows}"),
        )
        .await;
    }
    for p in &pods_a {
        assert_eq!(count(&client, &ns_a, "a", p).await, 100, "a on {p}");
    }
    for p in &pods_b {
        assert_eq!(count(&client, &ns_b, "b", p).await, 200, "b on {p}");
    }
    // b's root is b's: a's servers (a's identity) can neither read it (listing its folder
    // reads it) nor look inside
    let a0 = sql_client(&client, &ns_a, "a", &pods_a[0]).await;
    let under = |path: String| {
        format!("SELECT name AS v FROM system.zookeeper WHERE path = '{path}' ORDER BY name")
    };
    let options = clickhouse_operator::clickhouse::QueryOptions::new();
    for path in [format!("/clickhouse-operator/{ns_b}"), root.clone()] {
        let seen = a0.query(&under(path.clone()), &options).await;
        let refused = seen
            .as_ref()
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            refused.contains("Not authenticated")
                || refused.contains("NoAuth")
                || refused.contains("no auth"),
            "a's identity reads {path}: {:?}",
            seen.map(|r| r.len())
        );
    }
    let a_paths = query(&a0, &under("/clickhouse/tables/0/t/replicas".into())).await;
    assert_eq!(a_paths.len(), 2, "a's two replicas: {a_paths:?}");

    // decision 71 (review M-4): a cluster of a namespace a does not allow, naming a's Keeper
    // by its members (the Service's address, or its DNS name) instead of clusterRef, is
    // refused as a clusterRef would be: the operator, which a's Keeper NetworkPolicy lets in,
    // creates nothing in a's Keeper for it (no `/squat`) and starts none of its servers
    let keeper_ip =
        kube::Api::<k8s_openapi::api::core::v1::Service>::namespaced(client.clone(), &ns_a)
            .get("a-keeper")
            .await
            .unwrap()
            .spec
            .unwrap()
            .cluster_ip
            .unwrap();
    let c_api =
        kube::Api::<clickhouse_operator::api::ClickHouseCluster>::namespaced(client.clone(), &ns_c);
    let recreate_c = |root: String, host: String| {
        let (client, c_api, ns_c) = (client.clone(), c_api.clone(), ns_c.clone());
        async move {
            let _ = c_api.delete("c", &Default::default()).await;
            wait_for(std::time::Duration::from_secs(60), "c gone", || {
                let c_api = c_api.clone();
                async move { c_api.get_opt("c").await.ok()?.is_none().then_some(()) }
            })
            .await;
            create_cluster(
                &client,
                &ns_c,
                "c",
                json!({"replicas": 1, "storage": {"size": "1Gi"},
                    "keeper": {"replicas": 0, "external": {"root": root,
                        "nodes": [{"host": host, "port": 9181}]}}}),
            )
            .await;
        }
    };
    let statefulsets_c =
        kube::Api::<k8s_openapi::api::apps::v1::StatefulSet>::namespaced(client.clone(), &ns_c);
    let no_statefulset_of_c = || {
        let api = statefulsets_c.clone();
        async move {
            api.list(&Default::default())
                .await
                .unwrap()
                .items
                .is_empty()
        }
    };
    let refusal = format!(
        "spec.keeper.external.nodes: name the Keeper of ClickHouseCluster {ns_a}/a, which does not let namespace {ns_c} use its Keeper"
    );
    for host in [
        keeper_ip.clone(),
        format!("a-keeper.{ns_a}.svc.cluster.local"),
    ] {
        recreate_c("/squat/c".into(), host.clone()).await;
        let refused = wait_status(
            &client,
            &ns_c,
            "c",
            std::time::Duration::from_secs(120),
            &refusal,
            |s| s.conditions.iter().any(|c| c.message.contains(&refusal)),
        )
        .await;
        assert!(refused.status.unwrap().keeper_root.is_none(), "{host}");
        assert!(
            no_statefulset_of_c().await,
            "no server of c started ({host})"
        );
        let top = query(&a0, &under("/".into())).await;
        assert!(
            !top.iter().any(|n| n == "squat"),
            "nothing created in a's Keeper for c ({host}): {top:?}"
        );
    }
    // allowed by a, c's members are held to c's own folder (decision 38): a root inside b's,
    // or b's itself, is refused before anything is created
    patch_spec(
        &client,
        &ns_a,
        "a",
        json!({"keeper": {"allowedNamespaces": [ns_b, ns_c]}}),
    )
    .await;
    let folder = format!("must lie below /clickhouse-operator/{ns_c}/");
    for c_root in [format!("{root}/nested"), root.clone()] {
        recreate_c(c_root.clone(), keeper_ip.clone()).await;
        let refused = wait_status(
            &client,
            &ns_c,
            "c",
            std::time::Duration::from_secs(120),
            &folder,
            |s| s.conditions.iter().any(|c| c.message.contains(&folder)),
        )
        .await;
        assert!(refused.status.unwrap().keeper_root.is_none(), "{c_root}");
        assert!(no_statefulset_of_c().await, "no server of c started");
    }
    clean_up(&client, &ns_c).await;
    for p in &pods_b {
        assert_eq!(count(&client, &ns_b, "b", p).await, 200, "b on {p} after c");
    }

    // b deleted with `reclaimPolicy: Retain` (the default): its root stays with its volumes
    // (a still may not read it), and b created again takes over its credentials, its root and
    // its rows (decision 30)
    let b_spec = json!({"replicas": 2, "storage": {"size": "1Gi"},
        "keeper": {"replicas": 0, "external": {"clusterRef": {"name": "a", "namespace": ns_a}}}});
    clean_up(&client, &ns_b).await;
    let kept = a0
        .query(&under(format!("/clickhouse-operator/{ns_b}")), &options)
        .await;
    assert!(
        kept.is_err(),
        "b's root kept, closed to a: {:?}",
        kept.map(|r| r.len())
    );
    create_cluster(&client, &ns_b, "b", b_spec).await;
    let b = wait_ready(&client, &ns_b, "b", 1).await;
    assert_eq!(
        b.status.as_ref().unwrap().keeper_root.as_deref(),
        Some(root.as_str())
    );
    for p in &pods(&b) {
        assert_eq!(
            count(&client, &ns_b, "b", p).await,
            200,
            "b on {p} created again"
        );
    }

    // b deleted with `reclaimPolicy: Delete`: its root goes, a keeps its paths and replicates
    patch_spec(
        &client,
        &ns_b,
        "b",
        json!({"storage": {"reclaimPolicy": "Delete"}}),
    )
    .await;
    wait_ready(&client, &ns_b, "b", 2).await;
    clean_up(&client, &ns_b).await;
    wait_for(
        std::time::Duration::from_secs(60),
        "b's root removed from a's Keeper",
        || {
            let (a0, q) = (a0.clone(), under(format!("/clickhouse-operator/{ns_b}")));
            let options = options.clone();
            // readable again, and empty, once b's root is gone
            async move { a0.query(&q, &options).await.ok()?.is_empty().then_some(()) }
        },
    )
    .await;
    assert_eq!(
        query(&a0, &under("/clickhouse/tables/0/t/replicas".into())).await,
        a_paths
    );
    let a1 = sql_client(&client, &ns_a, "a", &pods_a[1]).await;
    exec(
        &a1,
        "INSERT INTO default.t SELECT number + 1000 FROM system.numbers LIMIT 10",
    )
    .await;
    for p in &pods_a {
        assert_eq!(
            count(&client, &ns_a, "a", p).await,
            110,
            "a on {p} after b left"
        );
    }
    finish_all(&client, &[&ns_a, &ns_b, &ns_c], op).await;
}

/// Decision 55: a Keeper-only cluster (`shards: 0`, three members) runs its ensemble and no
/// server (no server pod, no client Service, no server NetworkPolicy), is `ready` once its
/// members are, and another cluster, in a namespace it allows, replicates through it by
/// `keeper.external.clusterRef`: rows written on one replica are on both.
#[tokio::test]
async fn a_keeper_only_cluster_serves_another_clusters_replication() {
    use k8s_openapi::api::core::v1::{Pod, Service};
    use k8s_openapi::api::networking::v1::NetworkPolicy;
    use kube::api::{Api, ListParams};
    let client = client().await;
    let ns_k = namespace(&client, "keeponly").await;
    let ns_c = namespace(&client, "keepuser").await;
    let both = format!("{ns_k},{ns_c}");
    let op = start_operator_env(&client, &ns_k, &[("WATCH_NAMESPACE", &both)]).await;
    create_cluster(
        &client,
        &ns_k,
        "k",
        json!({"shards": 0, "keeper": {"replicas": 3, "allowedNamespaces": [ns_c]}}),
    )
    .await;
    let k = wait_ready(&client, &ns_k, "k", 1).await;
    let status = k.status.unwrap();
    assert_eq!(status.keeper.ready, 3, "{status:?}");
    assert_eq!(status.clickhouse.size, 0, "{status:?}");
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns_k);
    let servers = pods
        .list(&ListParams::default().labels("app.kubernetes.io/component=server"))
        .await
        .unwrap();
    assert!(servers.items.is_empty(), "no server pod");
    let services: Api<Service> = Api::namespaced(client.clone(), &ns_k);
    assert!(
        services.get_opt("k").await.unwrap().is_none(),
        "no client Service"
    );
    let policies: Api<NetworkPolicy> = Api::namespaced(client.clone(), &ns_k);
    let names: Vec<String> = policies
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|p| p.metadata.name)
        .collect();
    assert_eq!(names, ["k-keeper"], "only Keeper's NetworkPolicy");

    create_cluster(
        &client,
        &ns_c,
        "c",
        json!({"replicas": 2, "storage": {"size": "1Gi"},
            "keeper": {"replicas": 0, "external": {"clusterRef": {"name": "k", "namespace": ns_k}}}}),
    )
    .await;
    let c = wait_ready(&client, &ns_c, "c", 1).await;
    let replicas = replica_names(&c);
    let first = sql_client(&client, &ns_c, "c", &format!("{}-0", replicas[0])).await;
    exec(&first, "CREATE TABLE default.t ON CLUSTER c (x UInt64) ENGINE = ReplicatedMergeTree('/clickhouse/tables/{shard}/t', '{replica}') ORDER BY x").await;
    exec(
        &first,
        "INSERT INTO default.t SELECT number FROM system.numbers LIMIT 300",
    )
    .await;
    for r in &replicas {
        assert_eq!(
            count(&client, &ns_c, "c", &format!("{r}-0")).await,
            300,
            "on {r}"
        );
    }
    finish_all(&client, &[&ns_c, &ns_k], op).await;
}
