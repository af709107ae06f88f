//! SQL on the servers, as the operator's own user; a thousand rows written and checked on every
//! replica.

use std::time::Duration;

use kube::Client;
use kube::api::Api;

use super::pod_ip;

/// A ClickHouse client for a server pod, as the operator's own user.
pub async fn sql_client(
    client: &Client,
    ns: &str,
    cluster: &str,
    pod: &str,
) -> clickhouse_operator::clickhouse::Client {
    let ip = pod_ip(client, ns, pod).await;
    sql_client_at(client, ns, cluster, &ip, Duration::from_secs(30)).await
}

/// A ClickHouse client for `host` (a pod or Service address), as the operator's own user.
pub async fn sql_client_at(
    client: &Client,
    ns: &str,
    cluster: &str,
    host: &str,
    timeout: Duration,
) -> clickhouse_operator::clickhouse::Client {
    let config = sql_config_at(client, ns, cluster, host, timeout).await;
    clickhouse_operator::clickhouse::Client::new(config).expect("a ClickHouse client")
}

/// What [`sql_client_at`] connects with: a client made from it anew opens its own connections.
pub async fn sql_config_at(
    client: &Client,
    ns: &str,
    cluster: &str,
    host: &str,
    timeout: Duration,
) -> clickhouse_operator::clickhouse::ClientConfig {
    use clickhouse_operator::clickhouse::{ClientConfig, Credentials, Endpoint};
    use k8s_openapi::api::core::v1::Secret;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), ns);
    let secret = secrets
        .get(&format!("{cluster}-operator"))
        .await
        .expect("the operator's Secret");
    let password = String::from_utf8(secret.data.unwrap()["password"].0.clone()).unwrap();
    let mut config = ClientConfig::new(
        Endpoint {
            host: host.to_string(),
            port: 8123,
        },
        Credentials {
            user: "clickhouse_operator".into(),
            password,
        },
    );
    config.timeout = timeout;
    config
}

/// Runs SQL whose result has a column `v` and returns it, as strings, row by row.
pub async fn query(c: &clickhouse_operator::clickhouse::Client, sql: &str) -> Vec<String> {
    use clickhouse_operator::clickhouse::QueryOptions;
    let rows = c
        .query(sql, &QueryOptions::new())
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
    rows.iter()
        .map(|r| {
            r.str("v")
                .map(str::to_string)
                .or_else(|_| r.u64("v").map(|n| n.to_string()))
                .unwrap_or_else(|e| panic!("{sql}: {e}"))
        })
        .collect()
}

/// Runs a statement.
pub async fn exec(c: &clickhouse_operator::clickhouse::Client, sql: &str) {
    use clickhouse_operator::clickhouse::QueryOptions;
    c.exec(sql, &QueryOptions::new().retry(true))
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
}

/// Creates `default.t` (ReplicatedMergeTree, `ON CLUSTER c1`) through the first replica of
/// `replicas` and writes the numbers 0 to 999 into it.
pub async fn write_thousand_rows(client: &Client, ns: &str, replicas: &[String]) {
    let first = sql_client(client, ns, "c1", &format!("{}-0", replicas[0])).await;
    exec(
        &first,
        "CREATE TABLE default.t ON CLUSTER c1 (n UInt64) \
         ENGINE = ReplicatedMergeTree('/clickhouse/tables/{shard}/t', '{replica}') ORDER BY n",
    )
    .await;
    exec(
        &first,
        "INSERT INTO default.t SELECT number FROM system.numbers LIMIT 1000",
    )
    .await;
}

/// Every replica of `replicas` holds exactly the rows of [`write_thousand_rows`] (count and sum),
/// once synced; `when` names the moment in the failure.
pub async fn assert_thousand_rows(client: &Client, ns: &str, replicas: &[String], when: &str) {
    for r in replicas {
        let s = sql_client(client, ns, "c1", &format!("{r}-0")).await;
        exec(&s, "SYSTEM SYNC REPLICA default.t").await;
        assert_eq!(
            query(
                &s,
                "SELECT concat(toString(count()), '/', toString(sum(n))) AS v FROM default.t"
            )
            .await,
            ["1000/499500"],
            "{when}: {r}"
        );
    }
}
