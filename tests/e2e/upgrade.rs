//! Invariants 3 and 9: objects edited or deleted by hand come back, and a new operator version
//! restarts no ClickHouse or Keeper pod.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ConfigMap, Service};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use kube::{Client, ResourceExt};
use serde_json::json;

use crate::support::*;

/// (uid, restartCount) of every pod of the namespace.
async fn pods(client: &Client, ns: &str) -> BTreeMap<String, (String, i32)> {
    pod_ids(client, ns, "").await
}

/// Invariant 3: the client Service and the common ConfigMap deleted by hand, and a field of the
/// headless Service edited by hand, are restored on the next pass, and no pod restarts.
#[tokio::test]
async fn objects_deleted_or_edited_by_hand_come_back() {
    let (Scenario { client, ns, op }, _) = Scenario::ready(
        "restore",
        json!({"replicas": 1, "keeper": {"replicas": 1}, "storage": {"size": "1Gi"}}),
    )
    .await;
    let before = pods(&client, &ns).await;
    let services: Api<Service> = Api::namespaced(client.clone(), &ns);
    let configs: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    services
        .delete("c1", &DeleteParams::default())
        .await
        .unwrap();
    configs
        .delete("c1-common", &DeleteParams::default())
        .await
        .unwrap();
    services
        .patch(
            "c1-headless",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"publishNotReadyAddresses": false}})),
        )
        .await
        .unwrap();
    wait_for(Duration::from_secs(60), "the objects back", || {
        let (services, configs) = (services.clone(), configs.clone());
        async move {
            let client_svc = services.get_opt("c1").await.ok()??;
            configs.get_opt("c1-common").await.ok()??;
            let headless = services.get("c1-headless").await.ok()?;
            let restored = headless.spec?.publish_not_ready_addresses == Some(true);
            (restored && client_svc.uid().is_some()).then_some(())
        }
    })
    .await;
    wait_status(&client, &ns, "c1", READY, "ready again", |s| {
        s.state == clickhouse_operator::api::ClusterState::Ready
    })
    .await;
    assert_eq!(pods(&client, &ns).await, before, "no pod restarted");
    finish(&client, &ns, op).await;
}

/// Invariant 9: objects written by an earlier operator version (here: without the hash
/// annotations this version adds) are taken over by the new one without restarting a pod.
#[tokio::test]
async fn a_new_operator_version_restarts_no_pod() {
    let (Scenario { client, ns, op }, _) = Scenario::ready(
        "upgrade",
        json!({"replicas": 2, "keeper": {"replicas": 1}, "storage": {"size": "1Gi"}}),
    )
    .await;
    drop(op);
    let before = pods(&client, &ns).await;
    // What the previous version left: the same objects without the hash annotations.
    let strip = json!({"metadata": {"annotations": {
        "clickhouse.com/object-hash": null, "clickhouse.com/template-hash": null}}});
    let sts: Api<StatefulSet> = Api::namespaced(client.clone(), &ns);
    for s in sts.list(&ListParams::default()).await.unwrap().items {
        sts.patch(
            &s.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&strip),
        )
        .await
        .unwrap();
    }
    let configs: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    for c in configs.list(&ListParams::default()).await.unwrap().items {
        configs
            .patch(
                &c.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&strip),
            )
            .await
            .unwrap();
    }
    let op = start_operator(&client, &ns, false).await;
    wait_for(
        Duration::from_secs(60),
        "the new version's annotations",
        || {
            let sts = sts.clone();
            async move {
                let all = sts.list(&ListParams::default()).await.ok()?.items;
                all.iter()
                    .all(|s| s.annotations().contains_key("clickhouse.com/object-hash"))
                    .then_some(())
            }
        },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(10)).await;
    wait_status(&client, &ns, "c1", READY, "ready", |s| {
        s.state == clickhouse_operator::api::ClusterState::Ready
    })
    .await;
    assert_eq!(pods(&client, &ns).await, before, "no pod restarted");
    finish(&client, &ns, op).await;
}

/// The operator binary run as a process watching one namespace, killed on drop; its log in
/// the target folder.
struct OperatorProcess {
    child: std::process::Child,
}

impl OperatorProcess {
    fn start(binary: &std::path::Path, ns: &str) -> OperatorProcess {
        let log_dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("operator-logs");
        std::fs::create_dir_all(&log_dir).unwrap();
        let version = binary_version(binary);
        let log = std::fs::File::create(log_dir.join(format!("{ns}-{version}.log"))).unwrap();
        let child = std::process::Command::new(binary)
            .arg("run")
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("KUBECONFIG", kubeconfig())
            .env("WATCH_NAMESPACE", ns)
            .env("LEADER_ELECTION", "false")
            .env("POD_NAMESPACE", ns)
            .env("POD_NAME", format!("operator-{version}"))
            .env("HTTP_ADDR", "127.0.0.1:0")
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("start {}: {e}", binary.display()));
        OperatorProcess { child }
    }
}

impl Drop for OperatorProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What `binary --version` says.
fn binary_version(binary: &std::path::Path) -> String {
    let out = std::process::Command::new(binary)
        .arg("--version")
        .output()
        .unwrap_or_else(|e| panic!("{}: {e}", binary.display()));
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .trim_start_matches("clickhouse-operator ")
        .to_string()
}

/// Invariant 9: a cluster made by this build, then the operator process replaced by the next
/// version's binary (built by `hack/next-operator.sh` with another version string), which
/// applies a change of a reloaded setting: no ClickHouse or Keeper pod is restarted and no pod
/// template changes.
#[tokio::test]
async fn swapping_the_operator_binary_for_the_next_version_restarts_no_pod() {
    let current = std::path::PathBuf::from(env!("CARGO_BIN_EXE_clickhouse-operator"));
    let next = current
        .parent()
        .and_then(|d| d.parent())
        .map(|t| t.join("next-operator/clickhouse-operator"))
        .unwrap();
    assert!(
        next.exists(),
        "{} is missing: run hack/next-operator.sh before the tests (hack/test.sh does)",
        next.display()
    );
    let (v1, v2) = (binary_version(&current), binary_version(&next));
    assert_ne!(v1, v2, "the next build reports another version");
    println!("operator {v1} replaced by {v2}");
    let client = client().await;
    let ns = namespace(&client, "swap").await;
    let old = OperatorProcess::start(&current, &ns);
    create_cluster(
        &client,
        &ns,
        "c1",
        json!({"shards": 1, "replicas": 2, "keeper": {"replicas": 1},
               "storage": {"size": "1Gi"}, "crVersion": v1}),
    )
    .await;
    wait_ready(&client, &ns, "c1", 1).await;
    let before = pods(&client, &ns).await;
    let sts: Api<StatefulSet> = Api::namespaced(client.clone(), &ns);
    let templates = |all: Vec<StatefulSet>| -> BTreeMap<String, String> {
        all.iter()
            .map(|s| {
                let t = serde_json::to_string(&s.spec.template).unwrap();
                (s.name_any(), t)
            })
            .collect()
    };
    let templates_before = templates(sts.list(&ListParams::default()).await.unwrap().items);
    drop(old);
    let new = OperatorProcess::start(&next, &ns);
    patch_spec(
        &client,
        &ns,
        "c1",
        json!({"configuration": {"settings": {"max_concurrent_queries": "150"}}}),
    )
    .await;
    wait_ready(&client, &ns, "c1", 2).await;
    let common: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let applied = serde_json::to_string(&common.get("c1-common").await.unwrap().data).unwrap();
    assert!(
        applied.contains("150"),
        "the new version applied the change"
    );
    // a few more passes of the new version over the settled cluster
    tokio::time::sleep(Duration::from_secs(12)).await;
    assert_eq!(pods(&client, &ns).await, before, "no pod restarted");
    assert_eq!(
        templates(sts.list(&ListParams::default()).await.unwrap().items),
        templates_before,
        "no pod template changed"
    );
    drop(new);
    let op = start_operator(&client, &ns, false).await;
    finish(&client, &ns, op).await;
}

/// S2-24, decision 15: automatic version upgrades from a ConfigMap source on a one-minute
/// schedule. While the cluster is paused, slots pass and nothing changes. Once it is ready, the
/// next slot writes the latest offered image into `spec.image`, once; Smart Update rolls every
/// server one at a time, the backup replica last; later slots find that version current. A
/// source that cannot be used is reported in `status.upgrade` and a condition, while the cluster
/// stays `ready`.
#[tokio::test]
async fn automatic_upgrades_write_the_new_image_once_and_roll_it_out() {
    use clickhouse_operator::api::{ClickHouseCluster, ClusterState};
    let Scenario { client, ns, op } = Scenario::start("autoup").await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let versions = |doc: &str| -> ConfigMap {
        serde_json::from_value(json!({"metadata": {"name": "versions"},
                                      "data": {"versions.json": doc}}))
        .unwrap()
    };
    cms.create(
        &Default::default(),
        &versions(
            r#"{"recommended": "24.8", "versions": [{"version": "24.8"}, {"version": "25.3"}]}"#,
        ),
    )
    .await
    .unwrap();
    create_cluster(
        &client,
        &ns,
        "c1",
        json!({"shards": 1, "replicas": 2, "keeper": {"replicas": 1}, "storage": {"size": "1Gi"},
               "image": "clickhouse/clickhouse-server:24.8", "pause": true,
               "upgradeOptions": {"apply": "Latest", "schedule": "*/1 * * * *",
                                  "versionSource": {"configMap": {"name": "versions"}}}}),
    )
    .await;
    let api: Api<ClickHouseCluster> = Api::namespaced(client.clone(), &ns);
    // paused: a slot passes, nothing is written
    let paused = wait_status(
        &client,
        &ns,
        "c1",
        Duration::from_secs(150),
        "a slot checked while paused",
        |s| {
            s.upgrade
                .as_ref()
                .and_then(|u| u.message.as_deref())
                .is_some_and(|m| m.contains("paused"))
        },
    )
    .await;
    assert_eq!(paused.spec.image, "clickhouse/clickhouse-server:24.8");
    assert_eq!(paused.metadata.generation, Some(1));

    patch_spec(&client, &ns, "c1", json!({"pause": false})).await;
    let ready = wait_ready(&client, &ns, "c1", 2).await;
    let map = ready.status.unwrap().replica_state_map;
    let backup = format!("{}-0", map.iter().find(|(_, r)| r.is_backup_pod).unwrap().0);
    let before = pod_ids(&client, &ns, "app.kubernetes.io/component=server").await;
    // the next slot upgrades; sample the pods until the rollout is over
    let mut order: Vec<String> = Vec::new();
    let mut most_down = 0;
    let started = std::time::Instant::now();
    loop {
        let c = api.get("c1").await.unwrap();
        let now = pod_ids(&client, &ns, "app.kubernetes.io/component=server").await;
        for (pod, (uid, _)) in &now {
            if before.get(pod).is_some_and(|(old, _)| old != uid) && !order.contains(pod) {
                order.push(pod.clone());
            }
        }
        let serving = c.status.as_ref().map_or(0, |s| s.clickhouse.ready);
        most_down = most_down.max(2 - serving);
        let s = c.status.clone().unwrap_or_default();
        if c.spec.image.ends_with(":25.3")
            && s.state == ClusterState::Ready
            && s.observed_generation == c.metadata.generation
            && order.len() == 2
        {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(300),
            "no upgrade: {:?} {:?}",
            c.spec.image,
            s.upgrade
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let upgraded = api.get("c1").await.unwrap();
    let record = upgraded.status.clone().unwrap().upgrade.unwrap();
    println!(
        "upgraded after {:?}: {record:?}, pods restarted in order {order:?}",
        started.elapsed()
    );
    assert_eq!(upgraded.spec.image, "clickhouse/clickhouse-server:25.3");
    assert_eq!(
        upgraded.metadata.generation,
        Some(3),
        "one write of spec.image"
    );
    assert_eq!(order.last(), Some(&backup), "the backup replica last");
    assert!(
        most_down <= 1,
        "one server at a time: {most_down} down at once"
    );
    assert!(record.message.unwrap().contains("24.8.0.0 → 25.3.0.0"));

    // a later slot: current; then a source that is no document: reported, the cluster ready
    let checked = record.last_check.clone();
    wait_status(
        &client,
        &ns,
        "c1",
        Duration::from_secs(90),
        "a later slot",
        |s| {
            s.upgrade.as_ref().is_some_and(|u| {
                u.last_check != checked
                    && u.message.as_deref() == Some("25.3.0.0 is the version to run")
            })
        },
    )
    .await;
    cms.replace("versions", &Default::default(), &versions("not json"))
        .await
        .unwrap_or_else(|_| panic!("replace"));
    let bad = wait_status(
        &client,
        &ns,
        "c1",
        Duration::from_secs(90),
        "the bad source reported",
        |s| {
            s.conditions
                .iter()
                .any(|c| c.r#type == "VersionSource" && c.status == "False")
        },
    )
    .await;
    let s = bad.status.unwrap();
    println!("{:?}", s.upgrade);
    assert_eq!(s.state, ClusterState::Ready);
    assert!(
        s.upgrade
            .unwrap()
            .message
            .unwrap()
            .contains("not a version document")
    );
    assert_eq!(bad.spec.image, "clickhouse/clickhouse-server:25.3");
    finish(&client, &ns, op).await;
}

/// Issue 52 item 6, decision 67: an ensemble whose template an earlier version wrote (the
/// Keeper command without the host-name fix, no `CLICKHOUSE_DATA_DIR`, the 60 s startup
/// budget) crash-loops on CRI-O (the suite's image volumes): the entrypoint cannot create
/// `/var/lib/clickhouse/coordination` in the read-only root. An operator upgrade restarts no
/// running pod (invariant 9), so these fixes are held back from running members; a member
/// that crash-loops gets them: the new operator writes the ensemble's template and replaces
/// the member, which starts, and the cluster is `ready` with its rows.
#[tokio::test]
async fn a_crash_looping_keeper_ensemble_of_an_earlier_version_heals_after_the_upgrade() {
    use k8s_openapi::api::core::v1::Pod;
    let (Scenario { client, ns, op }, c) = Scenario::ready(
        "kheal",
        json!({"shards": 1, "replicas": 1, "keeper": {"replicas": 1}, "storage": {"size": "1Gi"}}),
    )
    .await;
    let replicas = replica_names(&c);
    write_thousand_rows(&client, &ns, &replicas).await;
    drop(op);
    // the template as the earlier version wrote it, written as the operator writes
    let sts: Api<StatefulSet> = Api::namespaced(client.clone(), &ns);
    let keeper = sts.get("c1-keeper").await.unwrap();
    let template = serde_json::to_value(&keeper.spec.template).unwrap();
    let earlier = clickhouse_operator::model::with_deferred_keeper_launch(template, None);
    assert!(
        earlier["spec"]["containers"][0]["command"][2]
            .as_str()
            .unwrap()
            .contains("${HOSTNAME##*-}")
    );
    sts.patch(
        "c1-keeper",
        &PatchParams {
            field_manager: Some(clickhouse_operator::model::diff::FIELD_MANAGER.into()),
            ..PatchParams::default()
        },
        &Patch::Merge(json!({"spec": {"template": {"spec": {
            "containers": earlier["spec"]["containers"]}}}})),
    )
    .await
    .unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    pods.delete("c1-keeper-0", &DeleteParams::default())
        .await
        .unwrap();
    let crashed = wait_for(
        Duration::from_secs(120),
        "c1-keeper-0 crash-looping on the earlier template",
        || {
            let pods = pods.clone();
            async move {
                let p = pods.get("c1-keeper-0").await.ok()?;
                let cs = p.status?.container_statuses?.into_iter().next()?;
                (cs.restart_count >= 2).then_some(cs.restart_count)
            }
        },
    )
    .await;
    println!("c1-keeper-0 restarted {crashed} times on the earlier template");
    let op = start_operator(&client, &ns, false).await;
    // the status still says what the stopped operator last wrote: wait for the member itself
    let healed = std::time::Instant::now();
    wait_for(
        Duration::from_secs(240),
        "c1-keeper-0 Ready on the fixed template",
        || {
            let (pods, sts) = (pods.clone(), sts.clone());
            async move {
                let t = sts.get("c1-keeper").await.ok()?.spec.template.spec?;
                let fixed = t.containers[0].command.as_ref()
                    == Some(&clickhouse_operator::model::keeper::keeper_command());
                let p = pods.get("c1-keeper-0").await.ok()?;
                let ready = p
                    .status?
                    .conditions?
                    .iter()
                    .any(|c| c.type_ == "Ready" && c.status == "True");
                (fixed && ready).then_some(())
            }
        },
    )
    .await;
    println!(
        "c1-keeper-0 Ready on the fixed template {:?} after the upgrade",
        healed.elapsed()
    );
    wait_status(&client, &ns, "c1", READY, "ready after the upgrade", |s| {
        s.state == clickhouse_operator::api::ClusterState::Ready
    })
    .await;
    let keeper = sts.get("c1-keeper").await.unwrap();
    let c = &keeper.spec.template.spec.unwrap().containers[0];
    assert_eq!(
        c.command.as_ref().unwrap(),
        &clickhouse_operator::model::keeper::keeper_command()
    );
    assert!(
        c.env
            .iter()
            .flatten()
            .any(|e| e.name == clickhouse_operator::model::keeper::DATA_DIR_ENV)
    );
    let p = pods.get("c1-keeper-0").await.unwrap();
    let cs = &p.status.unwrap().container_statuses.unwrap()[0];
    assert_eq!(cs.restart_count, 0, "a new pod on the fixed template");
    assert_thousand_rows(&client, &ns, &replicas, "after Keeper healed").await;
    finish(&client, &ns, op).await;
}
