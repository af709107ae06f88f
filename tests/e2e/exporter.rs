//! The metrics exporter (docs/monitoring.md) against real 18.16 servers and the Keeper stand-in:
//! every server and Keeper member of the cluster is in one scrape with its labels, the servers'
//! figures under ClickHouse's own names; a server that is down reports `clickhouse_up 0` while
//! the others keep reporting.

use std::time::{Duration, Instant};

use clickhouse_operator::exporter;
use clickhouse_operator::runtime::settings::WatchNamespaces;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::ListParams;
use serde_json::json;

use crate::support::*;

/// The exporter's token in this test (the chart's `exporter.tokenSecret`).
const TOKEN: &str = "exporter-test-token";

fn sample<'a>(text: &'a str, name: &str, pod: &str) -> Option<&'a str> {
    text.lines()
        .find(|l| l.starts_with(&format!("{name}{{")) && l.contains(&format!("pod=\"{pod}\"")))
        .and_then(|l| l.rsplit(' ').next())
}

/// docs/monitoring.md, end to end: the exporter runs as a pod of the operator chart
/// (`exporter.enabled`, scoped to the test namespace by `watchNamespace`, so under the chart's
/// namespaced Role), and its `/metrics` holds, for each of the four servers of a 2×2 cluster,
/// `clickhouse_up 1`, its `system.metrics` and `system.events` figures under ClickHouse's own
/// names (`ClickHouseMetrics_*`, `ClickHouseProfileEvents_*`), replication and parts figures of a
/// replicated table, with the labels namespace, clickhouse_cluster, shard, replica and pod; and
/// for each of the three Keeper members `keeper_up 1` with its `mntr` figures. Five queries move
/// that host's query counter by at least five; a replica that stops fetching shows a replication
/// queue after an insert on the other replica of its shard. Every metric the chart's dashboards
/// and alert rules use is in the real output (or named, with the reason, as absent on these
/// servers), the operator's controller-runtime series among them. The names of earlier versions
/// (`EXPORTER_METRIC_NAMES=operator`, `EXPORTER_CLUSTER_LABEL=cluster`) scrape the same servers
/// as `clickhouse_metric_*`, `clickhouse_event_*_total` with the label cluster. With one
/// server hung (its process stopped), the very next scrape reports it `clickhouse_up 0` while the
/// three others still report `1` with their metrics; running again, it is reported up again; the
/// same with the server killed (SIGKILL) until the node restarted it. (A member whose pod is gone
/// is reported down too: `exporter::tests`.)
#[tokio::test]
async fn every_server_and_keeper_member_is_scraped_and_a_down_host_is_reported() {
    let client = client().await;
    let ns = namespace(&client, "export").await;
    // decision 36: the operator publishes the exporter's credentials in the chart's Secret
    let credentials = "m-clickhouse-operator-exporter-credentials";
    let op = start_operator_env(
        &client,
        &ns,
        &[("EXPORTER_CREDENTIALS_SECRET", credentials)],
    )
    .await;
    let token: k8s_openapi::api::core::v1::Secret = serde_json::from_value(
        json!({"metadata": {"name": "exporter-token"}, "stringData": {"token": TOKEN}}),
    )
    .unwrap();
    Api::<k8s_openapi::api::core::v1::Secret>::namespaced(client.clone(), &ns)
        .create(&Default::default(), &token)
        .await
        .unwrap();
    // the chart with only its exporter: the operator runs in this test, the PVC cleaner is off
    let chart = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("charts/clickhouse-operator");
    helm_run(&[
        "install",
        "m",
        &chart.to_string_lossy(),
        "-n",
        &ns,
        "--skip-crds",
        "--set",
        "replicaCount=0",
        "--set",
        "pvcCleaner.enabled=false",
        "--set",
        "exporter.enabled=true",
        "--set",
        "exporter.cacheSeconds=1",
        "--set",
        "exporter.tokenSecret.name=exporter-token",
        "--set",
        &format!("watchNamespace={ns}"),
        "--set",
        "image.repository=localhost/clickhouse-operator",
        "--set",
        "image.tag=dev",
        // the chart requires it (decision 71); every local cluster's pods are in 198.18.0.0/15
        "--set",
        "operatorNetworks={198.18.0.0/15}",
    ]);
    create_cluster(
        &client,
        &ns,
        "c1",
        json!({"shards": 2, "replicas": 2, "keeper": {"replicas": 3}, "storage": {"size": "1Gi"}}),
    )
    .await;
    // decision 36: the exporter's ServiceAccount may read its one Secret, no other
    for (secret, allowed) in [
        (credentials, true),
        ("c1-operator", false),
        ("exporter-token", false),
    ] {
        assert_eq!(
            may_get_secret(&client, &ns, "m-clickhouse-operator-exporter", secret).await,
            allowed,
            "the exporter reading Secret {secret}"
        );
    }
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let exporter_ip = wait_for(Duration::from_secs(120), "the exporter pod running", || {
        let pods = pods.clone();
        async move {
            let p = pods
                .list(&ListParams::default().labels("app.kubernetes.io/component=exporter"))
                .await
                .ok()?
                .items
                .pop()?;
            let st = p.status?;
            (st.phase.as_deref() == Some("Running")).then_some(st.pod_ip?)
        }
    })
    .await;
    let url = format!("http://{exporter_ip}:9116/metrics");
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    // decision 36: /metrics answers only with the token of the chart's Secret
    let anonymous = http.get(&url).send().await.unwrap();
    assert_eq!(anonymous.status().as_u16(), 401, "no token, no metrics");
    // a request at once: within the exporter's 1 s cache, the last scrape's answer
    let fetch = || {
        let (http, url) = (http.clone(), url.clone());
        async move {
            let r = http.get(&url).bearer_auth(TOKEN).send().await.ok()?;
            r.status().is_success().then_some(())?;
            r.text().await.ok()
        }
    };
    // past the exporter's 1 s cache: a fresh scrape
    let scrape = || {
        let fetch = fetch();
        async move {
            tokio::time::sleep(Duration::from_millis(1100)).await;
            fetch.await
        }
    };

    let ready = wait_ready(&client, &ns, "c1", 1).await;
    // (replica, shard), shard by shard
    let mut replicas: Vec<(String, i32)> = ready
        .status
        .unwrap()
        .replica_state_map
        .iter()
        .map(|(r, s)| (r.to_string(), s.shard.get()))
        .collect();
    replicas.sort_by_key(|(r, s)| (*s, r.clone()));
    assert_eq!(replicas.len(), 4, "{replicas:?}");
    let ch = sql_client(&client, &ns, "c1", &format!("{}-0", replicas[0].0)).await;
    exec(&ch, "CREATE TABLE default.t ON CLUSTER c1 (x UInt64) ENGINE = ReplicatedMergeTree('/clickhouse/tables/{shard}/default/t', '{replica}') ORDER BY x").await;
    for (r, _) in &replicas {
        let c = sql_client(&client, &ns, "c1", &format!("{r}-0")).await;
        exec(&c, "INSERT INTO default.t VALUES (1)").await;
    }
    // decision 36: the exporter's own account reads the system tables and nothing else
    {
        use clickhouse_operator::clickhouse::{ClientConfig, Credentials, Endpoint, QueryOptions};
        let secret = Api::<k8s_openapi::api::core::v1::Secret>::namespaced(client.clone(), &ns)
            .get("c1-operator")
            .await
            .unwrap();
        let password =
            String::from_utf8(secret.data.unwrap()["exporter-password"].0.clone()).unwrap();
        let ip = pods
            .get(&format!("{}-0", replicas[0].0))
            .await
            .unwrap()
            .status
            .and_then(|s| s.pod_ip)
            .unwrap();
        let exporter_account = clickhouse_operator::clickhouse::Client::new(ClientConfig::new(
            Endpoint {
                host: ip,
                port: 8123,
            },
            Credentials {
                user: "clickhouse_exporter".into(),
                password,
            },
        ))
        .unwrap();
        let o = QueryOptions::new();
        assert!(
            exporter_account
                .query("SELECT count() AS v FROM system.metrics", &o)
                .await
                .is_ok()
        );
        // 18.16 has no SQL privileges for users of the users file: the account is read-only
        // over every database there (reading no rows is proven on the 26.x engine in
        // tests/modern_config/accounts.rs)
        for write in [
            "CREATE TABLE default.exporter_was_here (x UInt8) ENGINE = Memory",
            "INSERT INTO default.t VALUES (2)",
            "DROP TABLE default.t",
        ] {
            let r = exporter_account.exec(write, &o).await;
            assert!(r.is_err(), "the exporter's account ran {write}");
        }
    }

    let keepers: Vec<String> = (0..3).map(|i| format!("c1-keeper-{i}")).collect();
    let started = Instant::now();
    let text = wait_for(
        Duration::from_secs(60),
        "every server and Keeper member up, with its table, in the exporter pod's output",
        || {
            let (replicas, keepers) = (replicas.clone(), keepers.clone());
            let scrape = scrape();
            async move {
                let t = scrape.await?;
                let all = replicas.iter().all(|(r, _)| {
                    let pod = format!("{r}-0");
                    sample(&t, "clickhouse_up", &pod) == Some("1")
                        && t.lines().any(|l| {
                            l.starts_with("clickhouse_table_active_parts{")
                                && l.contains(&format!("pod=\"{pod}\""))
                                && l.contains("table=\"t\"")
                        })
                }) && keepers
                    .iter()
                    .all(|k| sample(&t, "keeper_up", k) == Some("1"));
                all.then_some(t)
            }
        },
    )
    .await;
    // decision 36: a request right after a scrape gets that scrape's answer, unchanged (a
    // fresh one differs: the servers' counters move between two scrapes)
    let again = fetch().await.expect("a request within the cache's second");
    assert!(again == text, "a second scrape within the cache's interval");
    println!(
        "the exporter pod reports 4 servers and 3 Keeper members ({:?} after the cluster was ready)",
        started.elapsed()
    );
    for (r, shard) in &replicas {
        let pod = format!("{r}-0");
        for name in [
            "ClickHouseMetrics_Query",
            "ClickHouseProfileEvents_Query",
            "clickhouse_replica_queue_size",
            "clickhouse_replica_absolute_delay_seconds",
            "clickhouse_replica_is_readonly",
            "clickhouse_replica_is_session_expired",
            "clickhouse_table_active_parts",
            "clickhouse_table_max_parts_per_partition",
        ] {
            assert!(
                sample(&text, name, &pod).is_some(),
                "{name} of {pod}\n{text}"
            );
        }
        let line = text
            .lines()
            .find(|l| l.starts_with("clickhouse_up{") && l.contains(&pod))
            .unwrap();
        assert_eq!(
            line,
            format!(
                r#"clickhouse_up{{namespace="{ns}",clickhouse_cluster="c1",shard="{shard}",replica="{r}",pod="{pod}"}} 1"#
            )
        );
    }
    for k in &keepers {
        for name in ["keeper_avg_latency", "keeper_outstanding_requests"] {
            assert!(sample(&text, name, k).is_some(), "{name} of {k}\n{text}");
        }
        assert!(
            text.contains(&format!(
                r#"keeper_up{{namespace="{ns}",clickhouse_cluster="c1",pod="{k}"}} 1"#
            )),
            "{text}"
        );
    }

    // every metric the chart's dashboards and alerts use is exported (by the exporter or the
    // operator), or is one of these, with the reason it is absent here
    const ABSENT_HERE: &[(&str, &str)] = &[
        (
            "clickhouse_disk_free_bytes",
            "system.disks exists from 19.15; the servers here are 18.16",
        ),
        (
            "clickhouse_disk_total_bytes",
            "system.disks exists from 19.15; the servers here are 18.16",
        ),
        (
            "clickhouse_operator_cluster_last_successful_backup_timestamp_seconds",
            "only once a backup of the cluster succeeded (none here)",
        ),
        (
            "clickhouse_operator_reconcile_errors_total",
            "only once a pass failed (none here)",
        ),
    ];
    let operator = op.metrics.encode();
    let mut used = std::collections::BTreeSet::new();
    let mut sources: Vec<String> = std::fs::read_dir(chart.join("dashboards"))
        .unwrap()
        .map(|e| std::fs::read_to_string(e.unwrap().path()).unwrap())
        .collect();
    sources.push(
        std::fs::read_to_string(chart.join("templates/exporter.yaml"))
            .unwrap()
            .lines()
            .filter(|l| l.trim_start().starts_with("expr:"))
            .collect::<Vec<_>>()
            .join("\n"),
    );
    for src in &sources {
        let exprs: Vec<String> = if src.trim_start().starts_with('{') {
            let v: serde_json::Value = serde_json::from_str(src).unwrap();
            v["panels"]
                .as_array()
                .unwrap()
                .iter()
                .flat_map(|p| p["targets"].as_array().unwrap().clone())
                .map(|t| t["expr"].as_str().unwrap().to_string())
                .collect()
        } else {
            vec![src.clone()]
        };
        for e in exprs {
            let mut word = String::new();
            for c in e.chars().chain([' ']) {
                if c.is_ascii_alphanumeric() || c == '_' {
                    word.push(c);
                } else {
                    // a series of the exporter or the operator, not the label naming the
                    // cluster
                    if [
                        "clickhouse_",
                        "ClickHouse",
                        "keeper_",
                        "workqueue_",
                        "controller_runtime_",
                    ]
                    .iter()
                    .any(|p| word.starts_with(p))
                        && !word.ends_with('_')
                        && word != "clickhouse_cluster"
                    {
                        used.insert(word.clone());
                    }
                    word.clear();
                }
            }
        }
    }
    assert!(used.len() > 20, "{used:?}");
    let missing: Vec<&String> = used
        .iter()
        .filter(|m| {
            let series = format!("{m}{{");
            let typed = format!("# TYPE {} ", m.trim_end_matches("_total"));
            !(text.contains(&series)
                || operator.contains(&series)
                || operator.contains(&typed)
                || ABSENT_HERE.iter().any(|(n, _)| n == m))
        })
        .collect();
    assert!(
        missing.is_empty(),
        "metrics used by the chart's dashboards or alerts that nobody exports: {missing:?}"
    );
    for name in [
        "ClickHouseProfileEvents_Query",
        "ClickHouseMetrics_Merge",
        "workqueue_depth",
        "controller_runtime_reconcile_time_seconds_bucket",
    ] {
        assert!(used.contains(name), "the chart reads {name}: {used:?}");
    }
    assert!(
        !used.iter().any(|m| m.starts_with("clickhouse_metric_")
            || m.starts_with("clickhouse_event_")
            || m.starts_with("clickhouse_operator_workqueue")),
        "the chart reads an earlier name: {used:?}"
    );

    // the names of earlier versions, by their switches, on the same servers and members
    let earlier = exporter::Naming::parse(Some("operator"), Some("cluster")).unwrap();
    let found = exporter::targets(&client, &WatchNamespaces::Only(vec![ns.clone()]), None)
        .await
        .unwrap();
    let old = exporter::scrape_targets(found, earlier).await;
    for (r, shard) in &replicas {
        let pod = format!("{r}-0");
        for name in [
            "clickhouse_metric_Query",
            "clickhouse_event_Query_total",
            "clickhouse_replica_queue_size",
        ] {
            assert!(sample(&old, name, &pod).is_some(), "{name} of {pod}\n{old}");
        }
        assert!(
            old.contains(&format!(
                r#"clickhouse_up{{namespace="{ns}",cluster="c1",shard="{shard}",replica="{r}",pod="{pod}"}} 1"#
            )),
            "{old}"
        );
    }
    assert!(
        !old.contains("ClickHouseMetrics_") && !old.contains("clickhouse_cluster="),
        "{old}"
    );

    // a query moves that host's counter; a replica that does not fetch shows its queue
    let first = format!("{}-0", replicas[0].0);
    let second = format!("{}-0", replicas[1].0);
    assert_eq!(replicas[0].1, replicas[1].1, "two replicas of one shard");
    let queries = |t: &str, pod: &str| -> f64 {
        sample(t, "ClickHouseProfileEvents_Query", pod)
            .unwrap()
            .parse()
            .unwrap()
    };
    let before = queries(&text, &first);
    for _ in 0..5 {
        exec(&ch, "SELECT 1").await;
    }
    let c2 = sql_client(&client, &ns, "c1", &second).await;
    exec(&c2, "SYSTEM STOP FETCHES default.t").await;
    exec(&ch, "INSERT INTO default.t VALUES (2)").await;
    let queued = wait_for(
        Duration::from_secs(30),
        "a queue on the replica that does not fetch",
        || {
            let second = second.clone();
            let scrape = scrape();
            async move {
                let t = scrape.await?;
                let q = t.lines().find(|l| {
                    l.starts_with("clickhouse_replica_queue_size{")
                        && l.contains(&format!("pod=\"{second}\""))
                        && l.contains("table=\"t\"")
                })?;
                (q.rsplit(' ').next()? != "0").then_some(t)
            }
        },
    )
    .await;
    let after = queries(&queued, &first);
    assert!(after >= before + 5.0, "Query counter {before} → {after}");
    exec(&c2, "SYSTEM START FETCHES default.t").await;

    // one host hung (its server process stopped with SIGSTOP: connections are accepted and
    // never answered): the very next scrape reports it down, within the per-host timeout, and
    // the three others as usual; once it runs again, it is reported up again
    let victim = format!("{}-0", replicas[3].0);
    let victim_ip = pods
        .get(&victim)
        .await
        .unwrap()
        .status
        .and_then(|s| s.pod_ip)
        .unwrap();
    let pid = pid_of("clickhouse-server", &victim, Some(&victim_ip));
    // SAFETY: kill(2) on a process of this machine, found by its pod's name and address.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGSTOP) }, 0);
    let started = Instant::now();
    let down = scrape().await;
    let took = started.elapsed();
    // SAFETY: as above.
    unsafe { libc::kill(pid, libc::SIGCONT) };
    let down = down.expect("a scrape with one host hung");
    println!("the scrape with one host hung took {took:?}");
    assert_eq!(sample(&down, "clickhouse_up", &victim), Some("0"), "{down}");
    assert!(sample(&down, "ClickHouseMetrics_Query", &victim).is_none());
    for (r, _) in &replicas[..3] {
        let other = format!("{r}-0");
        assert_eq!(sample(&down, "clickhouse_up", &other), Some("1"), "{down}");
        assert!(sample(&down, "ClickHouseMetrics_Query", &other).is_some());
    }
    wait_for(Duration::from_secs(60), "the host reported up again", || {
        let (victim, scrape) = (victim.clone(), scrape());
        async move { (sample(&scrape.await?, "clickhouse_up", &victim) == Some("1")).then_some(()) }
    })
    .await;
    // one server killed (SIGKILL; its container is restarted by the node): the next scrape
    // reports it down and the others up, and once it runs again it is reported up again
    // (the cache expires first: the node may restart the server within a second)
    let pid = pid_of("clickhouse-server", &victim, Some(&victim_ip));
    tokio::time::sleep(Duration::from_millis(1100)).await;
    // SAFETY: as above.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0);
    let killed = fetch().await.expect("a scrape with one host killed");
    assert_eq!(
        sample(&killed, "clickhouse_up", &victim),
        Some("0"),
        "{killed}"
    );
    for (r, _) in &replicas[..3] {
        let other = format!("{r}-0");
        assert_eq!(
            sample(&killed, "clickhouse_up", &other),
            Some("1"),
            "{killed}"
        );
    }
    wait_for(Duration::from_secs(120), "the killed host reported up again", || {
        let (victim, scrape) = (victim.clone(), scrape());
        async move { (sample(&scrape.await?, "clickhouse_up", &victim) == Some("1")).then_some(()) }
    })
    .await;
    // a deleted cluster's credentials leave the published Secret with it
    let secrets = Api::<k8s_openapi::api::core::v1::Secret>::namespaced(client.clone(), &ns);
    let keys = |s: k8s_openapi::api::core::v1::Secret| -> Vec<String> {
        s.data.unwrap_or_default().into_keys().collect()
    };
    assert_eq!(
        keys(secrets.get(credentials).await.unwrap()),
        [format!("{ns}_c1_password")],
        "one entry, the cluster's password (no TLS: no CA)"
    );
    Api::<clickhouse_operator::api::ClickHouseCluster>::namespaced(client.clone(), &ns)
        .delete("c1", &Default::default())
        .await
        .unwrap();
    wait_for(
        Duration::from_secs(120),
        "the deleted cluster's credentials withdrawn",
        || {
            let secrets = secrets.clone();
            async move {
                keys(secrets.get(credentials).await.ok()?)
                    .is_empty()
                    .then_some(())
            }
        },
    )
    .await;
    helm_run(&["uninstall", "m", "-n", &ns, "--wait"]);
    finish(&client, &ns, op).await;
}

/// S0-12, decision 74: the exporter reads the public, versioned `status.members` and not
/// the operator's `replicaStateMap`, on the real API server with real 18.16 servers. The
/// operator writes `members` (version 1: both servers with shard, replica and pod, the Keeper
/// member) and the exporter, run as `clickhouse-operator exporter` runs it, scrapes each up and
/// says it used them. With the operator stopped, the status is then written as other operator
/// versions would write it: `members` naming a replica that no map entry has and no pod runs
/// (`c1-0-9`): reported `clickhouse_up 0` (an exporter reading the map does not report it);
/// the previous shape, with no `members`: every pod that exists still scraped up, nothing
/// reported for the missing one, `clickhouse_exporter_status_members_version 0` and
/// `…_used 0`; an unknown newer version (2, with the same lists): the same, version 2. The
/// operator started again writes version 1 again and the exporter uses it. 169 s on its last
/// run; with the exporter expecting the members it made from the map, as it did before, it
/// had no series for `c1-0-9` and this test failed.
#[tokio::test]
async fn the_exporter_reads_the_public_versioned_members_of_any_operators_status() {
    use clickhouse_operator::api::{ClickHouseCluster, MEMBERS_VERSION};
    use kube::api::{Patch, PatchParams};
    let Scenario { client, ns, op } = Scenario::start("exportver").await;
    create_cluster(
        &client,
        &ns,
        "c1",
        json!({"shards": 2, "replicas": 1, "keeper": {"replicas": 1}, "storage": {"size": "1Gi"}}),
    )
    .await;
    let ready = wait_ready(&client, &ns, "c1", 1).await;
    let status = ready.status.unwrap();
    let members = status.members.clone().expect("status.members written");
    assert_eq!(members.version, MEMBERS_VERSION);
    let mut servers: Vec<(i32, String, String)> = members
        .servers
        .iter()
        .map(|m| (m.shard, m.replica.clone(), m.pod.clone()))
        .collect();
    servers.sort();
    let mut from_map: Vec<(i32, String, String)> = status
        .replica_state_map
        .iter()
        .map(|(r, e)| (e.shard.get(), r.to_string(), format!("{r}-0")))
        .collect();
    from_map.sort();
    assert_eq!(servers, from_map, "one member per replica");
    let keeper: Vec<&str> = members.keeper.iter().map(|k| k.pod.as_str()).collect();
    assert_eq!(keeper, vec!["c1-keeper-0"]);

    let naming = exporter::Naming::parse(None, None).unwrap();
    let namespaces = WatchNamespaces::Only(vec![ns.clone()]);
    let scrape = || exporter::scrape(&client, &namespaces, None, naming);
    let series = |text: &str, name: &str| -> Option<String> {
        text.lines()
            .find(|l| {
                l.starts_with(&format!(
                    "{name}{{namespace=\"{ns}\",clickhouse_cluster=\"c1\"}}"
                ))
            })
            .and_then(|l| l.rsplit(' ').next())
            .map(str::to_string)
    };
    // every server up, as the members list them; a scrape right after a start may find a
    // server not answering yet
    let all_up = |text: &str| {
        servers
            .iter()
            .all(|(_, _, pod)| sample(text, "clickhouse_up", pod) == Some("1"))
            && sample(text, "keeper_up", "c1-keeper-0") == Some("1")
    };
    let text = wait_for(Duration::from_secs(60), "every member scraped up", || {
        let (scrape, all_up) = (&scrape, &all_up);
        async move {
            let t = scrape().await;
            all_up(&t).then_some(t)
        }
    })
    .await;
    assert_eq!(
        series(&text, "clickhouse_exporter_status_members_version").as_deref(),
        Some("1"),
        "{text}"
    );
    assert_eq!(
        series(&text, "clickhouse_exporter_status_members_used").as_deref(),
        Some("1"),
        "{text}"
    );

    // the operator stops; the status becomes what other operator versions write
    drop(op);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let clusters: Api<ClickHouseCluster> = Api::namespaced(client.clone(), &ns);
    let write = |members: serde_json::Value| {
        let clusters = clusters.clone();
        async move {
            clusters
                .patch_status(
                    "c1",
                    &PatchParams::default(),
                    &Patch::Merge(json!({"status": {"members": members}})),
                )
                .await
                .expect("write the status")
        }
    };
    let mut listed: Vec<serde_json::Value> = servers
        .iter()
        .map(|(shard, replica, pod)| json!({"shard": shard, "replica": replica, "pod": pod}))
        .collect();
    listed.push(json!({"shard": 0, "replica": "c1-0-9", "pod": "c1-0-9-0"}));
    let keeper_list = json!([{"pod": "c1-keeper-0"}]);
    let written = write(json!({"version": 1, "servers": listed, "keeper": keeper_list})).await;
    assert!(
        !written
            .status
            .unwrap()
            .replica_state_map
            .keys()
            .any(|r| r.as_str() == "c1-0-9"),
        "no map entry for c1-0-9"
    );
    let text = scrape().await;
    assert!(all_up(&text), "{text}");
    assert!(
        text.contains(&format!(
            r#"clickhouse_up{{namespace="{ns}",clickhouse_cluster="c1",shard="0",replica="c1-0-9",pod="c1-0-9-0"}} 0"#
        )),
        "a member without a pod is reported down, from status.members alone\n{text}"
    );

    for (what, members, version) in [
        (
            "the previous shape, no members",
            serde_json::Value::Null,
            "0",
        ),
        (
            "an unknown newer version",
            json!({"version": 2, "servers": listed, "keeper": keeper_list}),
            "2",
        ),
    ] {
        write(members).await;
        let text = scrape().await;
        assert!(
            all_up(&text),
            "{what}: every pod that exists is scraped\n{text}"
        );
        assert_eq!(
            sample(&text, "clickhouse_up", "c1-0-9-0"),
            None,
            "{what}\n{text}"
        );
        assert!(
            text.contains("clickhouse_exporter_discovery_up 1"),
            "{what}\n{text}"
        );
        assert_eq!(
            series(&text, "clickhouse_exporter_status_members_version").as_deref(),
            Some(version),
            "{what}\n{text}"
        );
        assert_eq!(
            series(&text, "clickhouse_exporter_status_members_used").as_deref(),
            Some("0"),
            "{what}\n{text}"
        );
        println!("{what}: every pod scraped, members not used");
    }

    // the operator again: it writes the members of its version, which the exporter uses
    let op = start_operator(&client, &ns, false).await;
    wait_status(
        &client,
        &ns,
        "c1",
        Duration::from_secs(60),
        "status.members of version 1 again",
        |s| {
            s.members
                .as_ref()
                .is_some_and(|m| m.version == MEMBERS_VERSION && m.servers.len() == 2)
        },
    )
    .await;
    let text = scrape().await;
    assert!(all_up(&text), "{text}");
    assert_eq!(
        series(&text, "clickhouse_exporter_status_members_used").as_deref(),
        Some("1"),
        "{text}"
    );
    finish(&client, &ns, op).await;
}

/// Whether ServiceAccount `account` of `ns` may get Secret `secret` of `ns`, as the API server
/// decides it (a SubjectAccessReview).
async fn may_get_secret(client: &kube::Client, ns: &str, account: &str, secret: &str) -> bool {
    use k8s_openapi::api::authorization::v1::SubjectAccessReview;
    let review: SubjectAccessReview = serde_json::from_value(json!({
        "spec": {
            "user": format!("system:serviceaccount:{ns}:{account}"),
            "groups": ["system:serviceaccounts", format!("system:serviceaccounts:{ns}"), "system:authenticated"],
            "resourceAttributes": {"namespace": ns, "verb": "get", "resource": "secrets", "name": secret}
        }
    }))
    .unwrap();
    Api::<SubjectAccessReview>::all(client.clone())
        .create(&Default::default(), &review)
        .await
        .unwrap()
        .status
        .is_some_and(|s| s.allowed)
}

/// The resident memory of this process, in KiB (Linux).
fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// Benchmark (docs/internals.md, "Benchmarks"), not a test: the exporter's scrape time and memory
/// for 20 and 100 hosts, simulated by pointing it at the two real 18.16 servers of a cluster 10 and
/// 50 times each (with its Keeper member once). Run it with `hack/bench.sh exporter`.
#[tokio::test]
#[ignore = "a benchmark: hack/bench.sh exporter"]
async fn benchmark_exporter_scrape_of_20_and_100_hosts() {
    let (Scenario { client, ns, op }, _) = Scenario::ready(
        "expbench",
        json!({"shards": 1, "replicas": 2, "keeper": {"replicas": 1}, "storage": {"size": "1Gi"}}),
    )
    .await;
    let found = exporter::targets(&client, &WatchNamespaces::Only(vec![ns.clone()]), None)
        .await
        .unwrap();
    let servers: Vec<exporter::Target> = found
        .iter()
        .filter(|t| matches!(t, exporter::Target::Server { .. }))
        .cloned()
        .collect();
    println!();
    println!(
        "{:>6} {:>12} {:>12} {:>14}",
        "hosts", "scrape ms", "ms / host", "RSS KiB after"
    );
    for hosts in [2usize, 20, 100] {
        let targets: Vec<exporter::Target> = servers.iter().cycle().take(hosts).cloned().collect();
        // warm, then the median of five
        exporter::scrape_targets(targets.clone(), exporter::Naming::default()).await;
        let mut times = Vec::new();
        let mut size = 0;
        for _ in 0..5 {
            let t = Instant::now();
            size = exporter::scrape_targets(targets.clone(), exporter::Naming::default())
                .await
                .len();
            times.push(t.elapsed().as_secs_f64() * 1000.0);
        }
        times.sort_by(f64::total_cmp);
        let median = times[2];
        println!(
            "{hosts:>6} {median:>12.1} {:>12.2} {:>14}   ({} KiB of text)",
            median / hosts as f64,
            rss_kib(),
            size / 1024
        );
    }
    finish(&client, &ns, op).await;
}
