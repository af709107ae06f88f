//! What decision 27 closes, on real 18.16 servers and the Keeper stand-in (ZooKeeper 3.8, which
//! enforces the same digest ACLs and four-letter-word list as Keeper): what a process that is not
//! part of a cluster can and cannot do to it.

use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use serde_json::json;

use std::collections::BTreeMap;

use clickhouse_operator::clickhouse::keeper::Session;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

use crate::support::*;

/// Decision 27: replication is authenticated. A cluster gets a generated replication
/// password (`interserver-password` in `<cluster>-operator`); its servers replicate with it (a row
/// inserted on one replica reaches the other, through `ON CLUSTER` DDL), while a fetch of the
/// same data part from the interserver port by a process that is not a server of the cluster
/// (this test) is refused with HTTP 401 without the credentials and with a wrong password, and
/// answered with the right ones. Keeper: an anonymous client reads and writes none of the
/// cluster's znodes (replication metadata, the DDL queue) while the servers still do, and only
/// `ruok`, `srvr` and `mntr` are answered.
#[tokio::test]
async fn outside_the_cluster_no_part_is_fetched_and_no_keeper_node_touched() {
    let Scenario { client, ns, op } = Scenario::start("sec").await;
    create_cluster(
        &client,
        &ns,
        "c1",
        json!({"shards": 1, "replicas": 2, "keeper": {"replicas": 1}, "storage": {"size": "1Gi"}}),
    )
    .await;
    let replicas = replica_names(&wait_ready(&client, &ns, "c1", 1).await);
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
    let ip = pod_ip(&client, &ns, &first).await;
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

    // Keeper: the servers authenticate (digest identity) and their znodes carry an ACL for it,
    // so a client that is not a server of the cluster (this test) reads and writes none of them,
    // neither the table's replication metadata nor the distributed DDL queue
    let keeper_ip = pod_ip(&client, &ns, "c1-keeper-0").await;
    let keeper_addr: std::net::SocketAddr = format!("{keeper_ip}:9181").parse().unwrap();
    let mut zk = Session::connect(keeper_addr, Duration::from_secs(5))
        .await
        .expect("a Keeper session");
    let no_auth = -102;
    for path in [
        "/clickhouse",
        "/clickhouse/tables/0/default/t",
        "/clickhouse/tables/0/default/t/replicas",
        "/clickhouse/task_queue/ddl",
    ] {
        let read = zk.children(path).await;
        println!("anonymous children({path}): {read:?}");
        assert_eq!(
            read.err().and_then(|e| e.code()),
            Some(no_auth),
            "read {path}"
        );
        let write = zk
            .create(
                &format!("{path}/intruder"),
                b"x",
                &[clickhouse_operator::clickhouse::keeper::AclEntry::world(31)],
            )
            .await;
        assert_eq!(
            write.err().and_then(|e| e.code()),
            Some(no_auth),
            "write {path}"
        );
    }
    // the servers themselves still read it (through system.zookeeper, as their identity)
    assert_eq!(
        query(
            &ch,
            "SELECT toString(count()) AS v FROM system.zookeeper WHERE path = '/clickhouse/tables/0/default/t/replicas'"
        )
        .await,
        ["2"]
    );
    // only the four-letter words the probe and the exporter use are answered
    for (word, answered) in [
        ("ruok", true),
        ("srvr", true),
        ("mntr", true),
        ("dump", false),
        ("srst", false),
        ("cons", false),
    ] {
        let reply = four_letter_word(keeper_addr, word).await;
        let refused = reply.contains("not in the whitelist") || reply.contains("not executed");
        println!("{word}: {}", reply.lines().next().unwrap_or_default());
        assert_eq!(!refused && !reply.is_empty(), answered, "{word}: {reply}");
    }
    finish(&client, &ns, op).await;
}

/// A four-letter-word command to a Keeper member and its whole answer.
async fn four_letter_word(addr: std::net::SocketAddr, word: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(word.as_bytes()).await.unwrap();
    let mut out = String::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_string(&mut out)).await;
    out
}

/// Whether `selector` selects `labels` (matchLabels and matchExpressions).
fn matches(selector: &LabelSelector, labels: &BTreeMap<String, String>) -> bool {
    selector
        .match_labels
        .iter()
        .flatten()
        .all(|(k, v)| labels.get(k) == Some(v))
        && selector.match_expressions.iter().flatten().all(|e| {
            let values = e.values.clone().unwrap_or_default();
            match e.operator.as_str() {
                "In" => labels.get(&e.key).is_some_and(|v| values.contains(v)),
                "NotIn" => labels.get(&e.key).is_none_or(|v| !values.contains(v)),
                "Exists" => labels.contains_key(&e.key),
                "DoesNotExist" => !labels.contains_key(&e.key),
                other => panic!("operator {other}"),
            }
        })
}

/// The names of the pods (of the policy's namespace) a policy applies to, sorted.
fn selected(policy: &NetworkPolicy, pods: &[k8s_openapi::api::core::v1::Pod]) -> Vec<String> {
    let sel = policy
        .spec
        .as_ref()
        .unwrap()
        .pod_selector
        .clone()
        .unwrap_or_default();
    let mut out: Vec<String> = pods
        .iter()
        .filter(|p| matches(&sel, p.metadata.labels.as_ref().unwrap_or(&BTreeMap::new())))
        .map(|p| p.metadata.name.clone().unwrap())
        .collect();
    out.sort();
    out
}

/// The names of the pods (all in the policy's namespace, whose labels are `ns_labels`) that a
/// policy lets reach TCP `port` of the pods it selects, sorted: rules without ports allow every
/// port, rules without peers everyone; a peer is a pod selector (in the policy's namespace or
/// the namespaces its namespace selector picks) or an IP block holding the pod's address.
fn allowed(
    policy: &NetworkPolicy,
    port: i32,
    pods: &[k8s_openapi::api::core::v1::Pod],
    ns_labels: &BTreeMap<String, String>,
) -> Vec<String> {
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
    let empty = BTreeMap::new();
    let in_block = |cidr: &str, ip: &str| -> bool {
        let (net, len) = cidr.split_once('/').unwrap();
        let (net, ip): (std::net::Ipv4Addr, std::net::Ipv4Addr) = match (net.parse(), ip.parse()) {
            (Ok(n), Ok(i)) => (n, i),
            _ => return false,
        };
        let len: u32 = len.parse().unwrap();
        let mask = if len == 0 { 0 } else { u32::MAX << (32 - len) };
        u32::from(net) & mask == u32::from(ip) & mask
    };
    let mut out: Vec<String> =
        pods.iter()
            .filter(|p| {
                let labels = p.metadata.labels.as_ref().unwrap_or(&empty);
                let ip = p
                    .status
                    .as_ref()
                    .and_then(|s| s.pod_ip.clone())
                    .unwrap_or_default();
                policy
                    .spec
                    .as_ref()
                    .unwrap()
                    .ingress
                    .iter()
                    .flatten()
                    .any(|rule| {
                        let port_ok = rule.ports.as_ref().is_none_or(|ps| {
                            ps.iter().any(|p| p.port == Some(IntOrString::Int(port)))
                        });
                        let peer_ok = rule.from.as_ref().is_none_or(|peers| {
                            peers.iter().any(|peer| {
                                if let Some(b) = &peer.ip_block {
                                    return in_block(&b.cidr, &ip);
                                }
                                let ns_ok = peer
                                    .namespace_selector
                                    .as_ref()
                                    .is_none_or(|s| matches(s, ns_labels));
                                let pod_ok = peer
                                    .pod_selector
                                    .as_ref()
                                    .is_none_or(|s| matches(s, labels));
                                ns_ok && pod_ok
                            })
                        });
                        port_ok && peer_ok
                    })
            })
            .map(|p| p.metadata.name.clone().unwrap())
            .collect();
    out.sort();
    out
}

/// Runs `script` with `sh` in a pod of the namespace that is not part of any cluster (no
/// cluster labels), with `env`, and returns what it printed once it finished.
async fn run_in_foreign_pod(
    client: &kube::Client,
    ns: &str,
    name: &str,
    script: &str,
    env: serde_json::Value,
) -> String {
    use k8s_openapi::api::core::v1::Pod;
    use kube::api::{LogParams, PostParams};
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"app": "intruder"}},
        "spec": {"restartPolicy": "Never", "containers": [{
            "name": "sh", "image": "debian:12", "command": ["sh", "-c", script], "env": env}]}
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    wait_for(
        Duration::from_secs(120),
        "the foreign pod to finish",
        || {
            let pods = pods.clone();
            async move {
                let phase = pods.get(name).await.ok()?.status?.phase?;
                (phase == "Succeeded" || phase == "Failed").then_some(())
            }
        },
    )
    .await;
    pods.logs(name, &LogParams::default()).await.unwrap()
}

/// Decision 27: no generated account accepts any address. With the operator's
/// networks set to the address it connects from (`OPERATOR_NETWORKS`, here this machine's address on the pod
/// network), a process in a pod that is not part of the cluster cannot log in as the operator's
/// account, nor as a user of the users Secret whose networks are the default (the operator's),
/// nor as one whose account allows a /24 that holds this machine's address but not the pods'
/// (an IPv4 network: 18.16 matches a plain IPv4 CIDR against every client, the mapped form the
/// operator writes correctly), while a user whose account says `::/0` can; the operator, the users from the allowed address,
/// and the servers among themselves (a Distributed query over two shards, `ON CLUSTER` DDL)
/// keep working. The cluster's NetworkPolicies, evaluated on the real pods' labels and
/// addresses (the local Kubernetes does not enforce them): the interserver port is open to the
/// servers only, Keeper's client port to the servers (and the operator, here by its address),
/// the client ports to the servers and the spec's clients (`app=bi`), raft to the members; the
/// foreign pod reaches none of them; switched off, they are deleted. The operator's password
/// rotated in `<cluster>-operator`: the new one is accepted and the old refused, the cluster is
/// ready again, and no Distributed query running meanwhile failed (the servers reach each other
/// as the cluster's own account, which the rotation does not touch).
#[tokio::test]
async fn accounts_refuse_logins_from_outside_their_networks() {
    use k8s_openapi::api::core::v1::Pod;
    use kube::api::PostParams;
    let client = client().await;
    let ns = namespace(&client, "nets").await;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns);
    let creds: Secret = serde_json::from_value(json!({
        "metadata": {"name": "creds"},
        "stringData": {"alice": "alice-pw", "bob": "bob-pw", "carol": "carol-pw"}
    }))
    .unwrap();
    secrets
        .create(&PostParams::default(), &creds)
        .await
        .unwrap();
    // the address this process reaches the pods from: the node's (the gateway of the pod
    // network), as every pod's hostIP says
    let probe: Pod = serde_json::from_value(json!({
        "metadata": {"name": "where", "labels": {"app": "bi"}},
        "spec": {"restartPolicy": "Never", "containers": [{"name": "sh", "image": "debian:12", "command": ["true"]}]}
    }))
    .unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    pods.create(&PostParams::default(), &probe).await.unwrap();
    let host_ip = wait_for(Duration::from_secs(60), "the node's address", || {
        let pods = pods.clone();
        async move { pods.get("where").await.ok()?.status?.host_ip }
    })
    .await;
    // on several nodes this machine reaches the pods from the bridge's address
    let machine = cluster_network("GATEWAY").unwrap_or_else(|| host_ip.clone());
    let op = start_operator_env(
        &client,
        &ns,
        &[("OPERATOR_NETWORKS", &format!("{machine}/32"))],
    )
    .await;
    create_cluster(
        &client,
        &ns,
        "c1",
        json!({"shards": 2, "replicas": 1, "keeper": {"replicas": 1}, "storage": {"size": "1Gi"},
               // a tag that claims a cluster secret (20.10) but not a start beside Keeper
               "image": "clickhouse/clickhouse-server:20.10",
               "users": {"secretName": "creds", "accounts": {
                   "bob": {"networks": ["::/0"]},
                   "carol": {"networks": [format!("{host_ip}/24")]}}},
               "networkPolicy": {"clients": [{"podSelector": {"matchLabels": {"app": "bi"}}}]}}),
    )
    .await;
    let ready = wait_ready(&client, &ns, "c1", 1).await;
    let replicas = replica_names(&ready);
    // the version is the one the servers report, not the image tag's (20.10): so no cluster
    // secret, which 18.16 refuses, although the cluster has one
    assert_eq!(
        ready.status.as_ref().unwrap().version.as_deref(),
        Some("18.16.1.0")
    );
    assert!(ready.spec.image.ends_with(":20.10"), "{}", ready.spec.image);
    let users_secret = secrets.get("c1-users").await.unwrap().data.unwrap();
    let remote = users_secret[clickhouse_operator::model::names::REMOTE_SERVERS_FILE]
        .0
        .clone();
    let remote = String::from_utf8(remote).unwrap();
    assert!(
        !remote.contains("<secret") && remote.contains("<user>clickhouse_cluster</user>"),
        "{remote}"
    );
    let first = format!("{}-0", replicas[0]);
    let ch = sql_client(&client, &ns, "c1", &first).await;
    // the servers reach each other as the cluster's account (by their pods' DNS names)
    exec(
        &ch,
        "CREATE TABLE default.l ON CLUSTER c1 (x UInt64) ENGINE = MergeTree ORDER BY x",
    )
    .await;
    exec(
        &ch,
        "CREATE TABLE default.d ON CLUSTER c1 AS default.l ENGINE = Distributed(c1, default, l, x)",
    )
    .await;
    exec(&ch, "INSERT INTO default.d VALUES (1) (2) (3) (4)").await;
    wait_for(Duration::from_secs(60), "rows on both shards", || {
        let ch = ch.clone();
        async move {
            let rows = ch
                .query(
                    "SELECT toString(count()) AS v FROM default.d",
                    &Default::default(),
                )
                .await
                .ok()?;
            let r = rows.iter().next()?;
            (r.str("v").ok()? == "4").then_some(())
        }
    })
    .await;
    let server_ip = pods
        .get(&first)
        .await
        .unwrap()
        .status
        .unwrap()
        .pod_ip
        .unwrap();
    let generated = secrets.get("c1-operator").await.unwrap().data.unwrap();
    let operator_pw = String::from_utf8(generated["password"].0.clone()).unwrap();
    let cluster_pw = String::from_utf8(generated["cluster-password"].0.clone()).unwrap();
    // from this machine's address: the operator's account and alice
    let http = reqwest::Client::new();
    let login = |user: &str, pw: &str| {
        let req = http
            .post(format!("http://{server_ip}:8123/"))
            .basic_auth(user, Some(pw))
            .body("SELECT 1");
        async move {
            let r = req.send().await.unwrap();
            (r.status().as_u16(), r.text().await.unwrap_or_default())
        }
    };
    assert_eq!(login("clickhouse_operator", &operator_pw).await.0, 200);
    assert_eq!(login("alice", "alice-pw").await.0, 200);
    assert_eq!(login("carol", "carol-pw").await.0, 200);
    // from a pod that is not part of the cluster
    let script = format!(
        "for u in clickhouse_operator:$OP clickhouse_cluster:$CL alice:alice-pw bob:bob-pw carol:carol-pw; do \
           printf '%s ' \"${{u%%:*}}\"; \
           curl -s -o /tmp/out -w '%{{http_code}} ' -u \"$u\" --data-binary 'SELECT 1' http://{server_ip}:8123/; \
           head -c 160 /tmp/out | tr '\\n' ' '; echo; \
         done"
    );
    let out = run_in_foreign_pod(
        &client,
        &ns,
        "intruder",
        &script,
        json!([{"name": "OP", "value": operator_pw}, {"name": "CL", "value": cluster_pw}]),
    )
    .await;
    println!("from a foreign pod:\n{out}");
    let line = |user: &str| {
        out.lines()
            .find(|l| l.starts_with(&format!("{user} ")))
            .unwrap_or_else(|| panic!("{user}: {out}"))
            .to_string()
    };
    // carol's /24 holds this machine's address, not the pods' (from the network's second /24)
    for refused in [
        "clickhouse_operator",
        "clickhouse_cluster",
        "alice",
        "carol",
    ] {
        let l = line(refused);
        assert!(!l.contains(" 200 "), "{l}");
        assert!(l.contains("is not allowed to connect from address"), "{l}");
    }
    assert!(line("bob").contains(" 200 1"), "{}", line("bob"));

    // NetworkPolicies (not enforced by the local Kubernetes): their selectors, evaluated on the
    // real pods, let each port be reached by exactly who should reach it
    let all = pods.list(&Default::default()).await.unwrap().items;
    let policies: Api<NetworkPolicy> = Api::namespaced(client.clone(), &ns);
    let get = |name: &'static str| {
        let policies = policies.clone();
        async move { policies.get(name).await.unwrap() }
    };
    let server_policy = get("c1-server").await;
    let keeper_policy = get("c1-keeper").await;
    let mut servers: Vec<String> = replicas.iter().map(|r| format!("{r}-0")).collect();
    servers.sort();
    let ns_labels = BTreeMap::from([("kubernetes.io/metadata.name".to_string(), ns.clone())]);
    assert_eq!(selected(&server_policy, &all), servers);
    assert_eq!(selected(&keeper_policy, &all), ["c1-keeper-0"]);
    assert_eq!(
        allowed(&server_policy, 9009, &all, &ns_labels),
        servers,
        "interserver"
    );
    let mut clients = servers.clone();
    clients.push("where".into());
    clients.sort();
    assert_eq!(
        allowed(&server_policy, 8123, &all, &ns_labels),
        clients,
        "HTTP"
    );
    assert_eq!(
        allowed(&server_policy, 9000, &all, &ns_labels),
        clients,
        "native"
    );
    let mut keeper_clients = servers.clone();
    keeper_clients.push("c1-keeper-0".into());
    assert_eq!(
        allowed(&keeper_policy, 9181, &all, &ns_labels),
        keeper_clients,
        "Keeper's clients: the servers (and the members, which may reach every port)"
    );
    assert_eq!(
        allowed(&keeper_policy, 9234, &all, &ns_labels),
        ["c1-keeper-0"],
        "raft"
    );
    // the operator (in this process, not a pod) is let in by its networks: this machine only
    let ip_blocks = serde_json::to_string(&server_policy.spec).unwrap();
    assert!(
        ip_blocks.contains(&format!("\"cidr\":\"{machine}/32\"")),
        "{ip_blocks}"
    );
    // switched off, they are deleted
    patch_spec(
        &client,
        &ns,
        "c1",
        json!({"networkPolicy": {"enabled": false}}),
    )
    .await;
    wait_for(
        Duration::from_secs(60),
        "the NetworkPolicies deleted",
        || {
            let policies = policies.clone();
            async move {
                policies
                    .list(&Default::default())
                    .await
                    .ok()?
                    .items
                    .is_empty()
                    .then_some(())
            }
        },
    )
    .await;

    // the operator's password rotated (documented in SECURITY.md): while Distributed queries
    // run through a server as a user, the operator gets the new password accepted and the old
    // one refused, the cluster is ready again, and not one query failed
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let answered = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
    let load = {
        let (stop, answered, url) = (
            stop.clone(),
            answered.clone(),
            format!("http://{server_ip}:8123/"),
        );
        tokio::spawn(async move {
            let http = reqwest::Client::new();
            let (mut ok, mut failed) = (0u32, Vec::new());
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                answered.store(ok, std::sync::atomic::Ordering::Relaxed);
                let r = http
                    .post(&url)
                    .basic_auth("alice", Some("alice-pw"))
                    .body("SELECT count() FROM default.d")
                    .send()
                    .await;
                match r {
                    Ok(r) if r.status().is_success() => ok += 1,
                    Ok(r) => failed.push(r.text().await.unwrap_or_default()),
                    Err(e) => failed.push(e.to_string()),
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            (ok, failed)
        })
    };
    let rotated = "a-rotated-operator-password-of-40-chars!";
    secrets
        .patch(
            "c1-operator",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({"stringData": {"password": rotated}})),
        )
        .await
        .unwrap();
    let rotated_at = std::time::Instant::now();
    wait_for(
        Duration::from_secs(120),
        "the rotated password accepted",
        || {
            let login = login("clickhouse_operator", rotated);
            async move { (login.await.0 == 200).then_some(()) }
        },
    )
    .await;
    println!("rotated password accepted after {:?}", rotated_at.elapsed());
    assert_ne!(
        login("clickhouse_operator", &operator_pw).await.0,
        200,
        "the old one refused"
    );
    wait_status(
        &client,
        &ns,
        "c1",
        Duration::from_secs(120),
        "ready after the rotation",
        |s| s.state == clickhouse_operator::api::ClusterState::Ready,
    )
    .await;
    let during = answered.load(std::sync::atomic::Ordering::Relaxed);
    assert!(during > 0, "no query answered while the password rotated");
    // the load goes on until it has answered a few more queries than a quick rotation leaves
    // time for, so that it spans the rotation and what follows it
    wait_for(
        Duration::from_secs(60),
        "queries after the rotation",
        || {
            let answered = answered.clone();
            async move { (answered.load(std::sync::atomic::Ordering::Relaxed) > 10).then_some(()) }
        },
    )
    .await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (ok, failed) = load.await.unwrap();
    println!(
        "Distributed queries during the rotation: {ok} answered, {} failed",
        failed.len()
    );
    assert!(ok > 10, "{ok}");
    assert!(
        failed.is_empty(),
        "queries failed during the rotation: {failed:?}"
    );
    for p in ["where", "intruder"] {
        pods.delete(p, &Default::default()).await.unwrap();
    }
    finish(&client, &ns, op).await;
}
