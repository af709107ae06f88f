//! Recovery on the real local Kubernetes: a wiped status, a cluster deleted and created again, hand
//! edits of owned objects, every server down at once, every Keeper member down at once, a server
//! hung during the schema copy, a pod no node takes.

use std::time::{Duration, Instant};

use clickhouse_operator::api::ClusterState;
use kube::api::{Api, DeleteParams, ListParams};
use kube::{Client, ResourceExt};
use serde_json::json;

use crate::support::*;
use crate::workload::*;

/// A lost status (docs/operations.md, "What happens on a bad day"): the status of a running
/// 2-shard cluster replaced by `{}` (as a backup tool or a
/// hand edit may do): the map is taken back from the server StatefulSets before anything is
/// written, so no version of the Secret holding `remote_servers` lacks a replica (watched
/// throughout; the servers reload it within seconds, and one without the cluster fails every
/// Distributed query until it is written back), a Distributed query through either server keeps
/// answering with every row (read 5 times a second for 15 s, none failing), no pod restarts,
/// and the cluster is ready again with the same replicas.
#[tokio::test]
async fn a_wiped_status_costs_no_distributed_query() {
    use kube::api::{Patch, PatchParams};
    let (Scenario { client, ns, op }, ready) = Scenario::ready(
        "wiped",
        json!({"shards": 2, "replicas": 1, "keeper": {"replicas": 1}, "storage": {"size": "1Gi"}}),
    )
    .await;
    let replicas = replica_names(&ready);
    let ch = sql_client(&client, &ns, "c1", &format!("{}-0", replicas[0])).await;
    exec(
        &ch,
        "CREATE TABLE default.t ON CLUSTER c1 (x UInt64) ENGINE = MergeTree ORDER BY x",
    )
    .await;
    exec(
        &ch,
        "CREATE TABLE default.d ON CLUSTER c1 AS default.t ENGINE = Distributed(c1, default, t, x)",
    )
    .await;
    for r in &replicas {
        let c = sql_client(&client, &ns, "c1", &format!("{r}-0")).await;
        exec(
            &c,
            "INSERT INTO default.t SELECT number FROM system.numbers LIMIT 10",
        )
        .await;
    }
    let before = pod_ids(&client, &ns, "clickhouse.com/cluster=c1").await;
    // every version of the Secret holding remote_servers, as the API server hands them out
    let versions = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let watch = {
        use futures::StreamExt;
        use kube::runtime::watcher;
        let secrets: Api<k8s_openapi::api::core::v1::Secret> = Api::namespaced(client.clone(), &ns);
        let (versions, stop) = (versions.clone(), stop.clone());
        tokio::spawn(async move {
            let config = watcher::Config::default().fields("metadata.name=c1-users");
            let mut events = watcher(secrets, config).boxed();
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                let next = tokio::time::timeout(Duration::from_secs(1), events.next()).await;
                let Ok(Some(Ok(watcher::Event::Apply(s) | watcher::Event::InitApply(s)))) = next
                else {
                    continue;
                };
                let file = s
                    .data
                    .and_then(|d| {
                        d.get(clickhouse_operator::model::names::REMOTE_SERVERS_FILE)
                            .cloned()
                    })
                    .map(|b| String::from_utf8_lossy(&b.0).into_owned())
                    .unwrap_or_default();
                versions.lock().unwrap().push(file);
            }
        })
    };
    tokio::time::sleep(Duration::from_secs(2)).await;
    let api = Api::<clickhouse_operator::api::ClickHouseCluster>::namespaced(client.clone(), &ns);
    api.patch_status(
        "c1",
        &PatchParams::default(),
        &Patch::Merge(json!({"status": null})),
    )
    .await
    .unwrap();
    let mut failures = Vec::new();
    let started = Instant::now();
    let mut reads = 0;
    while started.elapsed() < Duration::from_secs(15) {
        for r in &replicas {
            let c = sql_client(&client, &ns, "c1", &format!("{r}-0")).await;
            reads += 1;
            match c
                .query(
                    "SELECT count() AS v FROM default.d",
                    &clickhouse_operator::clickhouse::QueryOptions::new(),
                )
                .await
            {
                Ok(rows) if rows.iter().next().and_then(|r| r.u64("v").ok()) == Some(20) => {}
                other => failures.push(format!("{r}: {:?}", other.map(|rows| rows.len()))),
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    watch.await.unwrap();
    let versions = versions.lock().unwrap().clone();
    assert!(!versions.is_empty(), "the Secret was watched");
    for v in &versions {
        for r in &replicas {
            assert!(
                v.contains(&format!("<host>{r}-0.")),
                "a remote_servers without {r}: {v}"
            );
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {reads} reads failed: {failures:?}",
        failures.len()
    );
    let again = wait_status(&client, &ns, "c1", READY, "ready after the wipe", |s| {
        s.state == ClusterState::Ready && s.replica_state_map.len() == 2
    })
    .await;
    assert_eq!(replica_names(&again), replicas);
    assert_eq!(
        pod_ids(&client, &ns, "clickhouse.com/cluster=c1").await,
        before,
        "no pod restarted"
    );
    finish(&client, &ns, op).await;
}

/// The operator's credentials Secret of cluster `name`: its data and the kinds of its owners.
async fn credentials(
    client: &Client,
    ns: &str,
    name: &str,
) -> Option<(std::collections::BTreeMap<String, Vec<u8>>, Vec<String>)> {
    let s = Api::<k8s_openapi::api::core::v1::Secret>::namespaced(client.clone(), ns)
        .get_opt(&format!("{name}-operator"))
        .await
        .unwrap()?;
    let owners = s
        .owner_references()
        .iter()
        .map(|o| o.kind.clone())
        .collect();
    let data = s
        .data
        .unwrap_or_default()
        .into_iter()
        .map(|(k, v)| (k, v.0))
        .collect();
    Some((data, owners))
}

/// Decision 30: a cluster deleted and created again with the same name, as a GitOps tool or
/// `kubectl delete -f` / `apply -f` does, with rows written every second throughout. With
/// `reclaimPolicy: Retain` (the default) the credentials Secret outlives the cluster, owned by
/// the retained volumes; the cluster created again takes it over with the replicas of those
/// volumes, its servers keep the Keeper identity their replicated tables were created with,
/// and it is ready with every acknowledged row on every replica, writes going on through its
/// new client Service. Without the credentials (the Secret deleted by hand) the servers cannot
/// open their tables, and the status says why: the crash loop with the last error of the log.
/// Once the retained volumes are deleted, garbage collection takes the Secret too; with
/// `reclaimPolicy: Delete` the Secret goes with the cluster and its volumes.
#[tokio::test]
async fn a_cluster_deleted_and_created_again_comes_back_with_every_row() {
    let Scenario { client, ns, op } = Scenario::start("recreate").await;
    let spec = json!({"shards": 1, "replicas": 2, "keeper": {"replicas": 1},
                      "storage": {"size": "1Gi"}});
    create_cluster(&client, &ns, "c1", spec.clone()).await;
    let first = wait_ready(&client, &ns, "c1", 1).await;
    let workload = Workload::start(&client, &ns, "c1").await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let (data, owners) = credentials(&client, &ns, "c1").await.unwrap();
    assert_eq!(owners, ["ClickHouseCluster"]);

    clean_up(&client, &ns).await;
    let (kept, owners) = credentials(&client, &ns, "c1")
        .await
        .expect("the credentials outlive the cluster with its volumes");
    assert_eq!(kept, data);
    assert!(
        !owners.is_empty() && owners.iter().all(|o| o == "PersistentVolumeClaim"),
        "{owners:?}"
    );
    create_cluster(&client, &ns, "c1", spec.clone()).await;
    let again = wait_ready(&client, &ns, "c1", 1).await;
    assert_eq!(replica_names(&again), replica_names(&first));
    let (adopted, owners) = credentials(&client, &ns, "c1").await.unwrap();
    assert_eq!(adopted, data);
    assert_eq!(owners, ["ClickHouseCluster"]);
    // writes go on through the new client Service
    tokio::time::sleep(Duration::from_secs(10)).await;
    let batches = workload.stop_and_check(&client, &ns).await;
    println!("{batches} batches acknowledged and found on every replica");

    // without the credentials the data was written with, Keeper refuses the servers their
    // replicated tables' nodes: never `ready`, and the status names the cause (the read-only
    // table and Keeper's answer, or a crash loop with the last error of the log)
    clean_up(&client, &ns).await;
    Api::<k8s_openapi::api::core::v1::Secret>::namespaced(client.clone(), &ns)
        .delete("c1-operator", &DeleteParams::default())
        .await
        .unwrap();
    create_cluster(&client, &ns, "c1", spec.clone()).await;
    let clusters =
        Api::<clickhouse_operator::api::ClickHouseCluster>::namespaced(client.clone(), &ns);
    let started = Instant::now();
    let said = loop {
        let c = clusters.get("c1").await.unwrap();
        let s = c.status.clone().unwrap_or_default();
        let m = s.message.clone().unwrap_or_default();
        // (an earlier crash may have another last error, e.g. while Keeper's name does not
        // resolve yet: the status must come to name the identity)
        if m.contains("Not authenticated") || m.contains("NoAuth") {
            break c;
        }
        if started.elapsed() > Duration::from_secs(240) {
            let replicas = replica_names(&c);
            let mut seen = Vec::new();
            for r in &replicas {
                let ch = sql_client(&client, &ns, "c1", &format!("{r}-0")).await;
                for q in [
                    "SELECT concat(database, '.', table, ' readonly=', toString(is_readonly)) AS v FROM system.replicas",
                    "SELECT name AS v FROM system.zookeeper WHERE path = '/clickhouse/tables/0/default/events'",
                ] {
                    seen.push(format!(
                        "{r}: {q}: {:?}",
                        ch.query(q, &Default::default()).await.map(|rows| rows
                            .iter()
                            .filter_map(|r| r.str("v").ok().map(str::to_string))
                            .collect::<Vec<_>>())
                    ));
                }
            }
            panic!(
                "no cause in the status after 240 s: {:?} {m:?}; {seen:#?}",
                s.state
            );
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    };
    let status = said.status.unwrap();
    let message = status.message.unwrap();
    println!("status: {message}");
    assert!(
        message.contains("Not authenticated") || message.contains("NoAuth"),
        "the cause is the Keeper identity: {message}"
    );
    assert_ne!(status.state, ClusterState::Ready);
    tokio::time::sleep(Duration::from_secs(10)).await;
    let later = wait_status(&client, &ns, "c1", READY, "a status", |_| true).await;
    assert_ne!(
        later.status.unwrap().state,
        ClusterState::Ready,
        "never ready"
    );
    clean_up(&client, &ns).await;

    // reclaimPolicy: Delete, on new volumes: the Secret goes with the cluster and its volumes
    let pvcs =
        Api::<k8s_openapi::api::core::v1::PersistentVolumeClaim>::namespaced(client.clone(), &ns);
    pvcs.delete_collection(&DeleteParams::default(), &ListParams::default())
        .await
        .unwrap();
    wait_for(
        Duration::from_secs(120),
        "the retained volumes deleted by hand",
        || {
            let pvcs = pvcs.clone();
            async move {
                pvcs.list(&ListParams::default())
                    .await
                    .ok()?
                    .items
                    .is_empty()
                    .then_some(())
            }
        },
    )
    .await;
    wait_for(
        Duration::from_secs(60),
        "the credentials collected with the last volume that owned them",
        || {
            let client = client.clone();
            let ns = ns.clone();
            async move {
                credentials(&client, &ns, "c1")
                    .await
                    .is_none()
                    .then_some(())
            }
        },
    )
    .await;
    let mut delete = spec.clone();
    delete["storage"]["reclaimPolicy"] = json!("Delete");
    create_cluster(&client, &ns, "c1", delete).await;
    wait_ready(&client, &ns, "c1", 1).await;
    clean_up(&client, &ns).await;
    wait_for(
        Duration::from_secs(120),
        "the Secret and the volumes gone with a Delete cluster",
        || {
            let client = client.clone();
            let ns = ns.clone();
            async move {
                let pvcs = Api::<k8s_openapi::api::core::v1::PersistentVolumeClaim>::namespaced(
                    client.clone(),
                    &ns,
                )
                .list(&ListParams::default())
                .await
                .ok()?;
                let secret = credentials(&client, &ns, "c1").await;
                (pvcs.items.is_empty() && secret.is_none()).then_some(())
            }
        },
    )
    .await;
    finish(&client, &ns, op).await;
}

/// Decision 30: edits by hand to what the operator owns are repaired, lists and maps
/// included, under write load: an environment variable added to a server's and to Keeper's
/// container, an annotation added to a server's pod template, and a probe's period changed.
/// Server-side apply alone leaves what another field manager added; the operator removes it
/// (found by that manager's managed fields) and applies its own, once: the server pod restarts
/// at most once for it (the template goes back to the revision the pod runs), and so does
/// Keeper's (the operator rolls Keeper only from a template it wrote), the status is `ready`
/// again, every acknowledged row is on every replica, and a pass
/// after the repair writes nothing (once the StatefulSets are rolled out, their generations and
/// what each writer last applied stay the same for 15 s).
#[tokio::test]
async fn hand_edits_of_owned_objects_are_repaired_once() {
    use k8s_openapi::api::apps::v1::StatefulSet;
    use kube::api::{Patch, PatchParams};
    let (Scenario { client, ns, op }, ready) = Scenario::ready(
        "drift",
        json!({"shards": 1, "replicas": 2, "keeper": {"replicas": 1}, "storage": {"size": "1Gi"}}),
    )
    .await;
    let replicas = replica_names(&ready);
    let server = replicas[0].clone();
    let workload = Workload::start(&client, &ns, "c1").await;
    let sets: Api<StatefulSet> = Api::namespaced(client.clone(), &ns);
    let server_pod = format!("{server}-0");
    let observer = Observer::start(&client, &ns, "c1").await;
    let before: std::collections::BTreeMap<String, serde_json::Value> = {
        let mut m = std::collections::BTreeMap::new();
        for s in [server.as_str(), "c1-keeper"] {
            let o = serde_json::to_value(sets.get(s).await.unwrap()).unwrap();
            m.insert(s.to_string(), o["spec"]["template"].clone());
        }
        m
    };
    let by_hand = |manager: &str| PatchParams {
        field_manager: Some(manager.into()),
        ..PatchParams::default()
    };
    let edits: Vec<(&str, &str, serde_json::Value)> = vec![
        (
            server.as_str(),
            "kubectl-edit",
            json!([{"op": "add", "path": "/spec/template/spec/containers/0/env/-",
                    "value": {"name": "BY_HAND", "value": "1"}}]),
        ),
        (
            server.as_str(),
            "kubectl-annotate",
            json!([{"op": "add", "path": "/spec/template/metadata/annotations/example.com~1by-hand",
                    "value": "1"}]),
        ),
        (
            server.as_str(),
            "kubectl-patch",
            json!([{"op": "replace", "path": "/spec/template/spec/containers/0/readinessProbe/periodSeconds",
                    "value": 17}]),
        ),
        (
            "c1-keeper",
            "kubectl-edit",
            json!([{"op": "add", "path": "/spec/template/spec/containers/0/env",
                    "value": [{"name": "BY_HAND", "value": "1"}]}]),
        ),
    ];
    for (set, manager, ops) in edits {
        let patch: json_patch::Patch = serde_json::from_value(ops.clone()).unwrap();
        sets.patch(set, &by_hand(manager), &Patch::<()>::Json(patch))
            .await
            .unwrap_or_else(|e| panic!("{set}: {ops}: {e}"));
        let want = before[set].clone();
        let set_name = set.to_string();
        wait_for(
            Duration::from_secs(60),
            &format!("{set}: {ops} repaired"),
            || {
                let (sets, want, set_name) = (sets.clone(), want.clone(), set_name.clone());
                async move {
                    let o = serde_json::to_value(sets.get(&set_name).await.ok()?).ok()?;
                    (o["spec"]["template"] == want).then_some(())
                }
            },
        )
        .await;
        wait_ready(&client, &ns, "c1", 1).await;
    }
    // a pass after the repair writes nothing: once every StatefulSet has rolled its pods back
    // to the repaired template, neither its spec (generation) nor what any writer last applied
    // to it (managedFields outside the status subresource) changes; the status itself moves
    // with pod readiness and is not the operator's write
    wait_for(
        Duration::from_secs(180),
        "every StatefulSet rolled out and ready",
        || {
            let sets = sets.clone();
            async move {
                let all = sets.list(&ListParams::default()).await.ok()?;
                all.iter()
                    .all(|s| {
                        let st = s.status.clone().unwrap_or_default();
                        let want = s.spec.replicas.unwrap_or(1);
                        st.observed_generation == s.metadata.generation
                            && st.ready_replicas == Some(want)
                            && st.updated_replicas == Some(want)
                            && st.current_revision == st.update_revision
                    })
                    .then_some(())
            }
        },
    )
    .await;
    wait_ready(&client, &ns, "c1", 1).await;
    let versions = |sets: Api<StatefulSet>| async move {
        let mut v = Vec::new();
        for s in sets.list(&ListParams::default()).await.unwrap() {
            let writes: Vec<_> = s
                .metadata
                .managed_fields
                .clone()
                .unwrap_or_default()
                .into_iter()
                .filter(|m| m.subresource.is_none())
                .map(|m| (m.manager, m.time))
                .collect();
            v.push((s.name_any(), s.metadata.generation, writes));
        }
        v
    };
    let settled = versions(sets.clone()).await;
    tokio::time::sleep(Duration::from_secs(15)).await;
    assert_eq!(
        versions(sets.clone()).await,
        settled,
        "a StatefulSet was written again"
    );
    let restarts = observer.uids();
    observer.stop().await;
    println!("pod uids: {restarts:?}");
    assert!(
        restarts[&server_pod].len() <= 2,
        "the server pod restarted more than once: {restarts:?}"
    );
    assert!(
        restarts["c1-keeper-0"].len() <= 2,
        "the Keeper pod restarted more than once: {restarts:?}"
    );
    let batches = workload.stop_and_check(&client, &ns).await;
    println!("{batches} batches acknowledged and found on every replica");
    let status = wait_ready(&client, &ns, "c1", 1).await.status.unwrap();
    assert_eq!(status.state, ClusterState::Ready);
    finish(&client, &ns, op).await;
}

/// The `FullCrash` condition of a status: its status and message.
fn crash(s: &clickhouse_operator::api::ClickHouseClusterStatus) -> Option<(String, String)> {
    s.conditions
        .iter()
        .find(|c| c.r#type == "FullCrash")
        .map(|c| (c.status.clone(), c.message.clone()))
}

/// Waits until `SYSTEM SYNC REPLICA default.events` succeeds on each replica of `c1`: a server
/// that lost its Keeper session (ClickHouse 18.16) opens a new one for its tables only some
/// seconds after it answers again, and `ready` comes first.
async fn syncs_again(client: &Client, ns: &str, replicas: &[String]) {
    for r in replicas {
        let ch = sql_client(client, ns, "c1", &format!("{r}-0")).await;
        wait_for(Duration::from_secs(90), &format!("{r} syncs again"), || {
            let ch = ch.clone();
            async move {
                ch.exec("SYSTEM SYNC REPLICA default.events", &Default::default())
                    .await
                    .ok()
            }
        })
        .await;
    }
}

/// S2-12: every server of a ready cluster down at once, rows written throughout: each server
/// process is stopped (SIGSTOP, so that the outage lasts: a killed pod is back here within a
/// second, before a pass sees it) until its pod is not Ready. The status reports the full crash
/// (condition `FullCrash` `True`, what is down first in the message) while no server serves;
/// once the processes go on, every replica is back, the condition clears, and every
/// acknowledged row is on every replica.
#[tokio::test]
async fn every_server_down_at_once_is_reported_as_a_full_crash_and_all_come_back() {
    let (Scenario { client, ns, op }, _) = Scenario::ready(
        "crash",
        json!({"shards": 2, "replicas": 1, "keeper": {"replicas": 1}, "storage": {"size": "1Gi"}}),
    )
    .await;
    let workload = Workload::start(&client, &ns, "c1").await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let api = Api::<clickhouse_operator::api::ClickHouseCluster>::namespaced(client.clone(), &ns);
    let before = api.get("c1").await.unwrap().status.unwrap();
    assert_eq!(crash(&before).map(|c| c.0).as_deref(), Some("False"));
    let mut stopped = Vec::new();
    for r in replica_names(&api.get("c1").await.unwrap()) {
        let pod = format!("{r}-0");
        let ip = pod_ip(&client, &ns, &pod).await;
        let pid = pid_of("clickhouse-server", &pod, Some(&ip));
        // SAFETY: a signal to a process of this machine
        assert_eq!(unsafe { libc::kill(pid, libc::SIGSTOP) }, 0);
        stopped.push(pid);
    }
    let reported = wait_status(
        &client,
        &ns,
        "c1",
        Duration::from_secs(60),
        "the full crash reported",
        |s| crash(s).is_some_and(|c| c.0 == "True"),
    )
    .await
    .status
    .unwrap();
    let (_, said) = crash(&reported).unwrap();
    println!("FullCrash: {said}; message: {:?}", reported.message);
    assert!(said.contains("every server is down (0/2 Ready)"), "{said}");
    for pid in stopped {
        // SAFETY: as above
        unsafe { libc::kill(pid, libc::SIGCONT) };
    }
    let back = wait_status(
        &client,
        &ns,
        "c1",
        READY,
        "ready again, the crash over",
        |s| s.state == ClusterState::Ready && crash(s).is_some_and(|c| c.0 == "False"),
    )
    .await;
    let replicas = replica_names(&back);
    assert_eq!(replicas.len(), 2);
    // A server stopped longer than its Keeper session lost it; ClickHouse 18.16 opens a new one
    // for its tables only some seconds after it answers again, and the status does not see
    // that yet (`ready` comes first): the rows are checked once every replica syncs again.
    syncs_again(&client, &ns, &replicas).await;
    let batches = workload.stop_and_check(&client, &ns).await;
    println!("{batches} batches acknowledged and found on every replica");
    finish(&client, &ns, op).await;
}

/// S2-12, Keeper's half: every member of a three-member Keeper ensemble down
/// at once, rows written throughout. Each member's process is stopped (SIGSTOP: a killed one
/// is back within a second) until none serves: the status reports the full crash (condition
/// `FullCrash` `True`, "Keeper has no serving member (0/3)"). A change of Keeper's pod template
/// made while they are all down is the operator's recovery: one member at a time (the roll of
/// decision 31) would wait for the first replaced member to serve, which it cannot without a
/// quorum, so the operator replaces every member that does not serve at once (`repair`), and
/// the StatefulSet (`Parallel`) starts them beside each other: every new pod is created before
/// the first of them is Ready. Keeper serves again, the condition clears, and every
/// acknowledged row is on every replica. Without the parallel replacement the ensemble stays
/// down and the test times out.
#[tokio::test]
async fn every_keeper_member_down_is_reported_as_a_full_crash_and_replaced_at_once() {
    use k8s_openapi::api::core::v1::Pod;
    let (Scenario { client, ns, op }, ready) = Scenario::ready(
        "kcrash",
        json!({"shards": 1, "replicas": 2, "keeper": {"replicas": 3}, "storage": {"size": "1Gi"}}),
    )
    .await;
    let generation = ready.metadata.generation.unwrap_or(1);
    let workload = Workload::start(&client, &ns, "c1").await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let members: Vec<String> = (0..3).map(|i| format!("c1-keeper-{i}")).collect();
    let mut old_uids = Vec::new();
    for pod in &members {
        old_uids.push(pods.get(pod).await.unwrap().uid().unwrap());
        let ip = pod_ip(&client, &ns, pod).await;
        let pid = pid_of("QuorumPeerMain", pod, Some(&ip));
        // SAFETY: a signal to a process of this machine
        assert_eq!(unsafe { libc::kill(pid, libc::SIGSTOP) }, 0);
    }
    let reported = wait_status(
        &client,
        &ns,
        "c1",
        Duration::from_secs(90),
        "Keeper's full crash reported",
        |s| crash(s).is_some_and(|c| c.0 == "True"),
    )
    .await
    .status
    .unwrap();
    let (_, said) = crash(&reported).unwrap();
    println!(
        "FullCrash: {said}; state {:?}, message: {:?}",
        reported.state, reported.message
    );
    assert!(
        said.contains("Keeper has no serving member (0/3)"),
        "{said}"
    );
    assert!(
        !said.contains("every server is down"),
        "the servers still run: {said}"
    );
    // the recovery: a template change while no member serves
    patch_spec(
        &client,
        &ns,
        "c1",
        json!({"keeper": {"pod": {"annotations": {"example.com/recovery": "1"}}}}),
    )
    .await;
    let back = wait_status(
        &client,
        &ns,
        "c1",
        READY,
        "ready again on the new template, the crash over",
        |s| {
            s.state == ClusterState::Ready
                && s.observed_generation == Some(generation + 1)
                && crash(s).is_some_and(|c| c.0 == "False")
        },
    )
    .await;
    // every member was replaced, and all of them were created before the first was Ready
    let mut created = Vec::new();
    let mut first_ready = None;
    for (pod, old) in members.iter().zip(&old_uids) {
        let p = pods.get(pod).await.unwrap();
        assert_ne!(p.uid().as_ref(), Some(old), "{pod} was not replaced");
        let at = p.metadata.creation_timestamp.clone().unwrap().0;
        let ready_at = p
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready" && c.status == "True"))
            .and_then(|c| c.last_transition_time.clone())
            .map(|t| t.0)
            .expect("a Ready member");
        first_ready =
            Some(first_ready.map_or(ready_at, |f: k8s_openapi::jiff::Timestamp| f.min(ready_at)));
        created.push((pod.clone(), at, ready_at));
    }
    println!("replaced members (created, Ready): {created:?}");
    let first_ready = first_ready.unwrap();
    for (pod, at, _) in &created {
        assert!(
            *at <= first_ready,
            "{pod} was created at {at}, after the first replaced member was Ready at {first_ready}: one at a time"
        );
    }
    syncs_again(&client, &ns, &replica_names(&back)).await;
    let batches = workload
        .stop_and_check_after_keeper_loss(&client, &ns)
        .await;
    println!("{batches} batches acknowledged and found on every replica");
    finish(&client, &ns, op).await;
}

/// Decision 31: a server that stops answering in the middle of a pass holds it no longer
/// than the step budget. A scale-out from one replica to two, rows written throughout; right
/// before the schema copy onto the new replica starts, its server process is stopped (SIGSTOP
/// from the operator's step hook, so that the copy meets a server that accepts connections and
/// never answers: each statement would wait 8 s three times). The copy gives up after 20 s and
/// the status says so well before the statements' retries would have ended; once the process
/// goes on, a later pass copies the schema, the cluster is `ready` with both replicas, and
/// every acknowledged row is on each.
#[tokio::test]
async fn a_server_hung_during_the_schema_copy_holds_the_pass_no_longer_than_its_budget() {
    use clickhouse_operator::controller::{Faults, StepPoint};
    use clickhouse_operator::plan::step::Step;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex};
    let client = client().await;
    let ns = namespace(&client, "hung").await;
    // the cluster's own name keeps its pod names apart from other tests' (the hook finds the
    // process by its pod's host name alone)
    let name = "hung";
    // armed once the cluster is ready: its first replica's (empty) schema copy is not the one
    let armed = Arc::new(AtomicBool::new(false));
    let fired = Arc::new(AtomicBool::new(false));
    let stopped: Arc<Mutex<Option<(i32, Instant)>>> = Arc::default();
    let hook: clickhouse_operator::controller::AfterStep = {
        let (armed, fired, stopped) = (armed.clone(), fired.clone(), stopped.clone());
        Arc::new(move |point, step| {
            if let (StepPoint::Before, Step::MigrateSchema { replica, .. }) = (point, step)
                && armed.load(Ordering::SeqCst)
                && !fired.swap(true, Ordering::SeqCst)
            {
                let pid = pid_of("clickhouse-server", &format!("{replica}-0"), None);
                // SAFETY: a signal to a process of this machine
                assert_eq!(unsafe { libc::kill(pid, libc::SIGSTOP) }, 0);
                *stopped.lock().unwrap() = Some((pid, Instant::now()));
            }
            false
        })
    };
    let op = start_operator_with(
        &client,
        &ns,
        Faults {
            after_step: Some(hook),
            ..Default::default()
        },
    )
    .await;
    create_cluster(
        &client,
        &ns,
        name,
        json!({"shards": 1, "replicas": 1, "keeper": {"replicas": 1}, "storage": {"size": "1Gi"}}),
    )
    .await;
    wait_ready(&client, &ns, name, 1).await;
    let workload = Workload::start(&client, &ns, name).await;
    armed.store(true, Ordering::SeqCst);
    patch_spec(&client, &ns, name, json!({"replicas": 2})).await;
    let gave_up = wait_status(
        &client,
        &ns,
        name,
        Duration::from_secs(120),
        "the schema copy given up",
        |s| {
            s.message
                .as_deref()
                .is_some_and(|m| m.contains("did not finish within 20 s"))
        },
    )
    .await;
    let (pid, at) = stopped.lock().unwrap().expect("the copy's server stopped");
    let held = at.elapsed();
    println!(
        "the copy was given up {held:?} after its server stopped: {:?}",
        gave_up.status.and_then(|s| s.message)
    );
    // SAFETY: as above
    unsafe { libc::kill(pid, libc::SIGCONT) };
    assert!(
        held < Duration::from_secs(40),
        "the pass waited {held:?} on a server that does not answer"
    );
    let ready = wait_ready(&client, &ns, name, 2).await;
    assert_eq!(replica_names(&ready).len(), 2);
    let batches = workload.stop_and_check(&client, &ns).await;
    println!("{batches} batches acknowledged and found on every replica");
    finish(&client, &ns, op).await;
}

/// S2-31 and S2-39 (the two-minute rule of `plan::facts::UNSCHEDULABLE_GRACE`): a node
/// selector no node matches, under write load. While the canary's new pod is Pending the status
/// names the pod and the scheduler's own reason, and the cluster is not `error`; once the pod
/// has been unschedulable for more than two minutes the state is `error` with that said;
/// reverting the selector brings the cluster back to `ready` with every acknowledged row on
/// every replica.
#[tokio::test]
async fn an_unschedulable_pod_is_named_with_the_schedulers_reason_and_an_error_after_two_minutes() {
    let (Scenario { client, ns, op }, _) = Scenario::ready(
        "unsched",
        json!({"shards": 1, "replicas": 2, "keeper": {"replicas": 1}, "storage": {"size": "1Gi"}}),
    )
    .await;
    let workload = Workload::start(&client, &ns, "c1").await;
    patch_spec(
        &client,
        &ns,
        "c1",
        json!({"pod": {"nodeSelector": {"example.com/no-such-node": "x"}}}),
    )
    .await;
    let pending = wait_status(
        &client,
        &ns,
        "c1",
        Duration::from_secs(120),
        "the status naming the Pending pod",
        |s| {
            s.message
                .as_deref()
                .is_some_and(|m| m.contains("cannot be scheduled"))
        },
    )
    .await;
    let seen = Instant::now();
    let s = pending.status.unwrap();
    let message = s.message.unwrap_or_default();
    println!("pending: {:?}: {message}", s.state);
    assert_ne!(s.state, ClusterState::Error, "{message}");
    assert!(
        message.contains("node(s) didn't match") || message.contains("node affinity/selector"),
        "the scheduler's reason: {message}"
    );
    let failed = wait_status(
        &client,
        &ns,
        "c1",
        Duration::from_secs(240),
        "state error after two minutes unschedulable",
        |s| s.state == ClusterState::Error,
    )
    .await;
    let message = failed.status.unwrap().message.unwrap_or_default();
    println!(
        "error {:?} after the first Pending status: {message}",
        seen.elapsed()
    );
    assert!(
        message.contains("unschedulable for more than 2 minutes"),
        "{message}"
    );
    assert!(
        seen.elapsed() > Duration::from_secs(60),
        "an error only after two minutes Pending: {:?}",
        seen.elapsed()
    );
    patch_spec(&client, &ns, "c1", json!({"pod": {"nodeSelector": null}})).await;
    let started = Instant::now();
    wait_ready(&client, &ns, "c1", 3).await;
    println!("ready {:?} after the revert", started.elapsed());
    let batches = workload.stop_and_check(&client, &ns).await;
    println!("{batches} batches acknowledged, each on every replica");
    finish(&client, &ns, op).await;
}
