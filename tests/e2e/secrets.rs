//! Secrets on real 18.16 servers: settings and files from Secret keys reach the servers without
//! passing through a ConfigMap, and a users Secret that does not exist yet is named and, once
//! created, heals the cluster.

use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use serde_json::json;

use crate::support::*;

/// Decision 34 on 18.16: a server setting from a Secret key (`secretSettings`: the server's
/// `timezone`) and a `config.d` file from a Secret key (`secretFiles`: a `merge_tree` setting)
/// are in force on every replica (and the Keeper client's `session_timeout_ms`, a setting of the
/// user's, is in the servers' merged `zookeeper` section), while neither value is in the cluster
/// resource or any ConfigMap. A new value of the key rolls the servers and is in force after; a
/// reference to a key the Secret does not have is said in the status (MissingSecret) with no pod
/// restarted, and the cluster is ready again once it is put back.
#[tokio::test]
async fn settings_and_files_from_secret_keys_reach_the_servers() {
    use k8s_openapi::api::core::v1::ConfigMap;
    let client = client().await;
    let ns = namespace(&client, "secret-settings").await;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns);
    let secret = |tz: &str| -> Secret {
        serde_json::from_value(json!({"metadata": {"name": "server-config"}, "stringData": {
            "tz": tz,
            "merge-tree.xml": "<clickhouse><merge_tree><parts_to_throw_insert>7777</parts_to_throw_insert></merge_tree></clickhouse>"
        }}))
        .unwrap()
    };
    secrets
        .create(&Default::default(), &secret("Asia/Tokyo"))
        .await
        .unwrap();
    let op = start_operator(&client, &ns, false).await;
    let configuration = json!({
        // the Keeper client's own settings are the user's (docs/reference/api.md)
        "settings": {"zookeeper/session_timeout_ms": "17000"},
        "secretSettings": {"timezone": {"name": "server-config", "key": "tz"}},
        "secretFiles": {"merge-tree.xml": {"name": "server-config", "key": "merge-tree.xml"}}
    });
    create_cluster(
        &client,
        &ns,
        "c1",
        json!({"replicas": 2, "keeper": {"replicas": 1}, "storage": {"size": "1Gi"},
            "configuration": configuration}),
    )
    .await;
    let ready = wait_ready(&client, &ns, "c1", 1).await;
    let pods_of = |c: &clickhouse_operator::api::ClickHouseCluster| -> Vec<String> {
        replica_names(c).iter().map(|r| format!("{r}-0")).collect()
    };
    let in_force = |tz: &'static str| {
        let (client, ns, pods) = (client.clone(), ns.clone(), pods_of(&ready));
        async move {
            for pod in &pods {
                let ch = sql_client(&client, &ns, "c1", pod).await;
                assert_eq!(query(&ch, "SELECT timezone() AS v").await, [tz], "{pod}");
                assert_eq!(
                    query(&ch, "SELECT value AS v FROM system.merge_tree_settings WHERE name = 'parts_to_throw_insert'").await,
                    ["7777"],
                    "{pod}"
                );
            }
        }
    };
    in_force("Asia/Tokyo").await;
    // the servers merged the Keeper client's setting into their `zookeeper` section: 18.16
    // writes its merged configuration to the data volume
    for r in replica_names(&ready) {
        let volume = volume_path(
            &client,
            &ns,
            &clickhouse_operator::model::names::data_pvc(&r),
        )
        .await;
        let merged =
            std::fs::read_to_string(volume.join("preprocessed_configs/config.xml")).unwrap();
        let zk = &merged[merged.find("<zookeeper").unwrap()..merged.find("</zookeeper>").unwrap()];
        assert!(
            zk.contains("<session_timeout_ms>17000</session_timeout_ms>"),
            "{r}: {zk}"
        );
        assert!(zk.contains("<node"), "{r}: {zk}");
    }
    let configs = Api::<ConfigMap>::namespaced(client.clone(), &ns)
        .list(&Default::default())
        .await
        .unwrap();
    for cm in &configs.items {
        let text = serde_json::to_string(&cm.data).unwrap();
        assert!(
            !text.contains("Asia/Tokyo") && !text.contains("7777"),
            "{text}"
        );
    }
    // a new value rolls the servers
    secrets
        .replace("server-config", &Default::default(), &{
            let mut s = secret("Europe/Berlin");
            s.metadata.resource_version = secrets
                .get("server-config")
                .await
                .unwrap()
                .metadata
                .resource_version;
            s
        })
        .await
        .unwrap();
    wait_for(
        Duration::from_secs(240),
        "the new timezone on every replica",
        || {
            let (client, ns, pods) = (client.clone(), ns.clone(), pods_of(&ready));
            async move {
                for pod in &pods {
                    let ip = pod_ip(&client, &ns, pod).await;
                    let ch = sql_client_at(&client, &ns, "c1", &ip, Duration::from_secs(5)).await;
                    let tz = ch
                        .query(
                            "SELECT timezone() AS v",
                            &clickhouse_operator::clickhouse::QueryOptions::new(),
                        )
                        .await
                        .ok()?;
                    (tz.iter().next()?.str("v").ok()? == "Europe/Berlin").then_some(())?;
                }
                Some(())
            }
        },
    )
    .await;
    wait_status(&client, &ns, "c1", READY, "ready after the roll", |s| {
        s.state == clickhouse_operator::api::ClusterState::Ready
    })
    .await;
    in_force("Europe/Berlin").await;
    // a key the Secret does not have: said, nothing restarted
    let before = pod_ids(&client, &ns, "clickhouse.com/cluster=c1").await;
    patch_spec(
        &client,
        &ns,
        "c1",
        json!({"configuration": {"secretSettings": {"timezone": {"name": "server-config", "key": "nope"}}}}),
    )
    .await;
    wait_status(&client, &ns, "c1", READY, "the missing key said", |s| {
        s.conditions.iter().any(|c| {
            c.message.starts_with("MissingSecret: ") && c.message.contains("has no key nope")
        })
    })
    .await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(
        pod_ids(&client, &ns, "clickhouse.com/cluster=c1").await,
        before,
        "no pod restarted"
    );
    patch_spec(
        &client,
        &ns,
        "c1",
        json!({"configuration": {"secretSettings": {"timezone": {"name": "server-config", "key": "tz"}}}}),
    )
    .await;
    wait_ready(&client, &ns, "c1", 3).await;
    assert_eq!(
        pod_ids(&client, &ns, "clickhouse.com/cluster=c1").await,
        before,
        "no pod restarted"
    );
    finish(&client, &ns, op).await;
}

/// S2-09 and S2-10 (bad input): a new cluster whose users Secret does not exist yet is
/// `error` with the Secret and the field that names it, and nothing is created (no credentials
/// Secret, ConfigMap or StatefulSet: a half-built cluster would start without its users);
/// creating the Secret heals it without touching the spec, and its user is in the users file.
#[tokio::test]
async fn a_missing_users_secret_is_named_nothing_is_created_and_creating_it_heals() {
    use clickhouse_operator::api::ClusterState;
    use k8s_openapi::api::apps::v1::StatefulSet;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::{ListParams, PostParams};
    let Scenario { client, ns, op } = Scenario::start("nosecret").await;
    create_cluster(
        &client,
        &ns,
        "c1",
        json!({"shards": 1, "replicas": 1, "keeper": {"replicas": 1}, "storage": {"size": "1Gi"},
               "users": {"secretName": "app-users"}}),
    )
    .await;
    let failed = wait_status(
        &client,
        &ns,
        "c1",
        Duration::from_secs(60),
        "the missing Secret said",
        |s| s.state == ClusterState::Error,
    )
    .await;
    let s = failed.status.unwrap();
    let message = s.message.unwrap_or_default();
    println!("{message}");
    assert!(
        message.contains("Secret app-users")
            && message.contains("spec.users.secretName")
            && message.contains("does not exist"),
        "{message}"
    );
    assert!(
        s.conditions
            .iter()
            .any(|c| c.message.starts_with("MissingSecret: ")),
        "{:?}",
        s.conditions
    );
    // a few more passes: still nothing of the cluster exists
    tokio::time::sleep(Duration::from_secs(5)).await;
    let lp = ListParams::default().labels("clickhouse.com/cluster=c1");
    assert!(
        Api::<StatefulSet>::namespaced(client.clone(), &ns)
            .list(&lp)
            .await
            .unwrap()
            .items
            .is_empty()
    );
    assert!(
        Api::<ConfigMap>::namespaced(client.clone(), &ns)
            .list(&lp)
            .await
            .unwrap()
            .items
            .is_empty()
    );
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns);
    assert!(secrets.get_opt("c1-operator").await.unwrap().is_none());
    let users: Secret = serde_json::from_value(json!({
        "metadata": {"name": "app-users"},
        "stringData": {"alice": "alice-pw"},
    }))
    .unwrap();
    secrets
        .create(&PostParams::default(), &users)
        .await
        .unwrap();
    let started = std::time::Instant::now();
    let ready = wait_ready(&client, &ns, "c1", 1).await;
    println!("ready {:?} after the Secret was created", started.elapsed());
    assert_eq!(ready.status.unwrap().state, ClusterState::Ready);
    let users_file = secrets.get("c1-users").await.unwrap().data.unwrap()
        [clickhouse_operator::model::names::USERS_FILE]
        .0
        .clone();
    let users_file = String::from_utf8_lossy(&users_file).into_owned();
    assert!(users_file.contains("<alice"), "{users_file}");
    finish(&client, &ns, op).await;
}
