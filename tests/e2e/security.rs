//! Issue 15 on real 18.16 servers: what a process that is not part of a cluster can and cannot
//! do to it.

use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use serde_json::json;

use crate::support::*;

/// Issue 15: replication is authenticated. A cluster gets a generated replication password
/// (`interserver-password` in `<cluster>-operator`); its servers replicate with it (a row
/// inserted on one replica reaches the other, through `ON CLUSTER` DDL), while a fetch of the
/// same data part from the interserver port by a process that is not a server of the cluster
/// (this test) is refused with HTTP 401 without the credentials and with a wrong password, and
/// answered with the right ones.
#[tokio::test]
async fn a_data_part_cannot_be_fetched_without_the_replication_credentials() {
    let client = client().await;
    let ns = namespace(&client, "sec").await;
    let op = start_operator(&client, &ns, false).await;
    create_cluster(
        &client,
        &ns,
        "c1",
        json!({"shards": 1, "replicas": 2, "keeper": {"replicas": 1}, "storage": {"size": "1Gi"}}),
    )
    .await;
    let ready = wait_ready(&client, &ns, "c1", 1).await;
    let replicas: Vec<String> = ready
        .status
        .unwrap()
        .replica_state_map
        .keys()
        .cloned()
        .collect();
    let first = format!("{}-0", replicas[0]);
    let second = format!("{}-0", replicas[1]);
    let ch = sql_client(&client, &ns, "c1", &first).await;
    exec(&ch, "CREATE TABLE default.t ON CLUSTER c1 (x UInt64) ENGINE = ReplicatedMergeTree('/clickhouse/tables/{shard}/default/t', '{replica}') ORDER BY x").await;
    exec(&ch, "INSERT INTO default.t VALUES (42)").await;
    let c2 = sql_client(&client, &ns, "c1", &second).await;
    exec(&c2, "SYSTEM SYNC REPLICA default.t").await;
    assert_eq!(
        query(&c2, "SELECT toString(sum(x)) AS v FROM default.t").await,
        ["42"],
        "replicated with the credentials"
    );

    let secret = Api::<Secret>::namespaced(client.clone(), &ns)
        .get("c1-operator")
        .await
        .unwrap();
    let password =
        String::from_utf8(secret.data.unwrap()["interserver-password"].0.clone()).unwrap();
    assert!(password.len() >= 32, "a generated password");
    let part = query(
        &ch,
        "SELECT name AS v FROM system.parts WHERE database = 'default' AND table = 't' AND active",
    )
    .await
    .remove(0);
    let ip = wait_for(
        Duration::from_secs(30),
        "the first server's address",
        || {
            let client = client.clone();
            let (ns, first) = (ns.clone(), first.clone());
            async move {
                Api::<k8s_openapi::api::core::v1::Pod>::namespaced(client, &ns)
                    .get(&first)
                    .await
                    .ok()?
                    .status?
                    .pod_ip
            }
        },
    )
    .await;
    let url = format!(
        "http://{ip}:9009/?endpoint=DataPartsExchange%3A%2Fclickhouse%2Ftables%2F0%2Fdefault%2Ft%2Freplicas%2F{}&part={part}&compress=false",
        replicas[0]
    );
    let http = reqwest::Client::new();
    let fetch = |auth: Option<(&str, &str)>| {
        let mut req = http.post(&url);
        if let Some((u, p)) = auth {
            req = req.basic_auth(u, Some(p));
        }
        async move {
            let r = req.send().await.expect("the interserver port answers");
            (
                r.status().as_u16(),
                r.bytes().await.unwrap_or_default().len(),
            )
        }
    };
    let (anonymous, _) = fetch(None).await;
    let (wrong, _) = fetch(Some(("interserver", "not-the-password"))).await;
    let (right, body) = fetch(Some(("interserver", &password))).await;
    println!(
        "fetch of part {part}: without credentials {anonymous}, wrong password {wrong}, right password {right} ({body} bytes)"
    );
    assert_eq!(anonymous, 401, "no credentials");
    assert_eq!(wrong, 401, "a wrong password");
    assert_eq!(right, 200, "the replication credentials");
    assert!(body > 0);
    finish(&client, &ns, op).await;
}
