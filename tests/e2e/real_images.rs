//! Decision 42: pods that would start on the real `clickhouse/clickhouse-server` and
//! `clickhouse/clickhouse-keeper` images, shown on the node agent that behaves like a kubelet
//! with them (`local-kubelet/README.md`): a read-only root filesystem enforced, image volumes
//! as CRI-O makes them (inside the read-only root: the suite's local Kubernetes is started with
//! `LOCAL_KUBELET_IMAGE_VOLUMES=crio`, so every test here and elsewhere runs under it), the
//! images' entrypoints emulated, and a Keeper client port that opens only with a quorum or
//! after Keeper's `startup_timeout`. What is verified how is in
//! `docs/running-on-real-clusters.md`.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use clickhouse_operator::clickhouse::keeper::four_letter_word;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams};
use kube::{Client, ResourceExt};
use serde_json::json;

use crate::support::*;

/// A pod's uid and the restart count and start time of its main container.
async fn main_container(client: &Client, ns: &str, pod: &str) -> Option<(String, i32, String)> {
    let p = Api::<Pod>::namespaced(client.clone(), ns)
        .get(pod)
        .await
        .ok()?;
    let uid = p.uid()?;
    let status = p.status?.container_statuses?.into_iter().next()?;
    let started = status.state?.running?.started_at?.0.to_string();
    Some((uid, status.restart_count, started))
}

fn is_ready(p: &Pod) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// Decision 42: Keeper opens its client port only with a quorum, or once its
/// `startup_timeout` has passed, and the startup probe checks that port. A member that comes
/// back while the two others hang (their processes stopped) waits for its quorum longer than
/// the probe's budget (60 s): the operator's `startup_timeout` (half the budget) opens the
/// port in time, so the member is never restarted; it stays unready (it does not serve) and
/// turns Ready once its peers go on. With Keeper's own default (180 s) the probe would kill it
/// after 60 s and again on every restart.
#[tokio::test]
async fn a_keeper_member_waiting_for_its_quorum_beyond_the_probe_budget_is_not_restarted() {
    let (Scenario { client, ns, op }, _) = Scenario::ready(
        "kwait",
        json!({"shards": 1, "replicas": 1, "keeper": {"replicas": 3}, "storage": {"size": "1Gi"}}),
    )
    .await;
    let mut stopped = Vec::new();
    for i in [1, 2] {
        let pod = format!("c1-keeper-{i}");
        let ip = pod_ip(&client, &ns, &pod).await;
        let pid = pid_of("QuorumPeerMain", &pod, Some(&ip));
        // SAFETY: a signal to a process of this machine
        assert_eq!(unsafe { libc::kill(pid, libc::SIGSTOP) }, 0);
        stopped.push(pid);
    }
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let old_uid = pods.get("c1-keeper-0").await.unwrap().uid().unwrap();
    pods.delete("c1-keeper-0", &DeleteParams::default())
        .await
        .unwrap();
    let (uid, _, started) = wait_for(
        Duration::from_secs(120),
        "c1-keeper-0 back and running",
        || {
            let (client, ns, old_uid) = (client.clone(), ns.clone(), old_uid.clone());
            async move {
                main_container(&client, &ns, "c1-keeper-0")
                    .await
                    .filter(|(uid, _, _)| *uid != old_uid)
            }
        },
    )
    .await;
    let since = Instant::now();
    let ip = pod_ip(&client, &ns, "c1-keeper-0").await;
    let addr: SocketAddr = format!(
        "{ip}:{}",
        clickhouse_operator::model::names::KEEPER_CLIENT_PORT
    )
    .parse()
    .unwrap();
    // closed while the member waits for its quorum, open (not serving) after its timeout
    let mut closed_at_first = false;
    let mut opened_after = None;
    while since.elapsed() < Duration::from_secs(85) {
        let answer = four_letter_word(addr, "srvr", Duration::from_secs(2)).await;
        match answer {
            Err(_) if opened_after.is_none() => closed_at_first = true,
            Ok(text) => {
                assert!(!text.contains("Mode: "), "serves without a quorum: {text}");
                opened_after.get_or_insert(since.elapsed());
            }
            Err(_) => {}
        }
        let pod = pods.get("c1-keeper-0").await.unwrap();
        assert_eq!(
            pod.uid().as_deref(),
            Some(uid.as_str()),
            "the pod was replaced"
        );
        assert!(!is_ready(&pod), "Ready without a quorum");
        let (_, restarts, now_started) = main_container(&client, &ns, "c1-keeper-0")
            .await
            .expect("the member keeps running");
        assert_eq!(
            (restarts, now_started.as_str()),
            (0, started.as_str()),
            "the member was restarted after {:?}",
            since.elapsed()
        );
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    println!(
        "client port closed at first: {closed_at_first}; open after {opened_after:?} (startup_timeout 30 s)"
    );
    assert!(closed_at_first, "the port was open before a quorum");
    let opened = opened_after.expect("the port opened after startup_timeout");
    assert!(opened < Duration::from_secs(50), "{opened:?}");
    for pid in stopped {
        // SAFETY: as above
        unsafe { libc::kill(pid, libc::SIGCONT) };
    }
    wait_for(
        Duration::from_secs(120),
        "c1-keeper-0 Ready once its peers go on",
        || {
            let pods = pods.clone();
            async move { pods.get("c1-keeper-0").await.ok().filter(is_ready) }
        },
    )
    .await;
    let (_, restarts, _) = main_container(&client, &ns, "c1-keeper-0").await.unwrap();
    assert_eq!(restarts, 0);
    wait_status(&client, &ns, "c1", READY, "ready again", |s| {
        s.state == clickhouse_operator::api::ClusterState::Ready
    })
    .await;
    finish(&client, &ns, op).await;
}

/// Decision 42: with `podSecurity.ids: Platform` the operator fixes no uid, gid or
/// fsGroup, and the pods run under the ids the platform assigns. Here the ids OpenShift's
/// `restricted-v2` constraint would inject (a uid from the namespace's range, no passwd entry,
/// group 0, fsGroup the range's first id) are put into the pod templates the way its
/// admission does; the servers and Keeper start on them, replicate, and the processes run as
/// that uid.
#[tokio::test]
async fn pods_run_under_the_ids_the_platform_assigns() {
    const UID: i64 = 1_000_650_000;
    let Scenario { client, ns, op } = Scenario::start("platform").await;
    let assigned = json!({"spec": {"securityContext": {
        "runAsUser": UID, "runAsGroup": 0, "fsGroup": UID}}});
    create_cluster(
        &client,
        &ns,
        "c1",
        json!({"shards": 1, "replicas": 2, "storage": {"size": "1Gi"},
               "podSecurity": {"ids": "Platform"},
               "pod": {"template": assigned},
               "keeper": {"replicas": 1, "pod": {"template": assigned}}}),
    )
    .await;
    let c = wait_ready(&client, &ns, "c1", 1).await;
    let replicas = replica_names(&c);
    for (program, pod) in [
        ("clickhouse-server", format!("{}-0", replicas[0])),
        ("clickhouse-server", format!("{}-0", replicas[1])),
        ("QuorumPeerMain", "c1-keeper-0".to_string()),
    ] {
        let ip = pod_ip(&client, &ns, &pod).await;
        let pid = pid_of(program, &pod, Some(&ip));
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        let uid_line = status.lines().find(|l| l.starts_with("Uid:")).unwrap();
        assert!(
            uid_line.split_whitespace().nth(1) == Some(&UID.to_string()),
            "{pod}: {uid_line}"
        );
    }
    let first = sql_client(&client, &ns, "c1", &format!("{}-0", replicas[0])).await;
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
    let second = sql_client(&client, &ns, "c1", &format!("{}-0", replicas[1])).await;
    exec(&second, "SYSTEM SYNC REPLICA default.t").await;
    assert_eq!(
        query(&second, "SELECT count() AS v FROM default.t").await,
        ["1000"]
    );
    finish(&client, &ns, op).await;
}

/// The waiting reason and message of a pod's first container, if it waits.
async fn waiting(client: &Client, ns: &str, pod: &str) -> Option<(String, String)> {
    let p = Api::<Pod>::namespaced(client.clone(), ns)
        .get(pod)
        .await
        .ok()?;
    let w = p
        .status?
        .container_statuses?
        .into_iter()
        .next()?
        .state?
        .waiting?;
    Some((w.reason?, w.message.unwrap_or_default()))
}

/// Issue 52 item 1, decision 65: `podSecurity.ids: Platform` on a cluster whose admission
/// assigns no uid (EKS, GKE, kind, k3s; here the node agent, which refuses `runAsNonRoot`
/// for the server and Keeper images as a kubelet does: they declare no `USER`, so they would
/// start as root). The pods cannot start; the status says `error` with a condition that names
/// the refused pods and what to do, instead of waiting for ever. Setting `ids: Fixed` heals
/// it: every pod starts and the cluster is `ready`.
#[tokio::test]
async fn platform_ids_where_no_admission_assigns_them_are_an_error_that_says_what_to_do() {
    use clickhouse_operator::api::ClusterState;
    let Scenario { client, ns, op } = Scenario::start("noids").await;
    create_cluster(
        &client,
        &ns,
        "c1",
        json!({"shards": 1, "replicas": 1, "storage": {"size": "1Gi"},
               "podSecurity": {"ids": "Platform"}, "keeper": {"replicas": 1}}),
    )
    .await;
    let refused = wait_status(
        &client,
        &ns,
        "c1",
        Duration::from_secs(120),
        "the refusal of the pods reported",
        |s| {
            s.state == ClusterState::Error
                && s.message.as_deref().is_some_and(|m| {
                    m.starts_with(
                        "spec.podSecurity.ids: Platform, but the platform assigned no uid",
                    )
                })
        },
    )
    .await;
    let s = refused.status.unwrap();
    let message = s.message.unwrap();
    println!("{message}");
    assert!(message.contains("c1-keeper-0"), "{message}");
    assert!(
        message.contains("set spec.podSecurity.ids: Fixed, or runAsUser, runAsGroup and fsGroup"),
        "{message}"
    );
    assert!(
        s.conditions
            .iter()
            .any(|c| c.status == "False" && c.reason == "InvalidSpec"),
        "{:?}",
        s.conditions
    );
    let (reason, kubelet) = waiting(&client, &ns, "c1-keeper-0").await.unwrap();
    assert_eq!(reason, "CreateContainerConfigError");
    assert!(
        kubelet.starts_with("container has runAsNonRoot and image will run as root"),
        "{kubelet}"
    );
    patch_spec(&client, &ns, "c1", json!({"podSecurity": {"ids": "Fixed"}})).await;
    let c = wait_ready(&client, &ns, "c1", 2).await;
    let replicas = replica_names(&c);
    write_thousand_rows(&client, &ns, &replicas).await;
    assert_thousand_rows(&client, &ns, &replicas, "with Fixed ids").await;
    finish(&client, &ns, op).await;
}

/// Issue 52 item 2, decision 66. First the node agent as a kubelet with the real image: a
/// server pod of `clickhouse-server:24.2` run with OpenShift's ids (a uid of the namespace's
/// range, group 0) exits at its entrypoint's first `clickhouse su`, "Group 0 is not found in
/// the system", as the images built before ClickHouse #71626 do; `24.8` (a floating tag of a
/// fixed release) starts under the same ids. Then the operator: such a tag under
/// `podSecurity.ids: Platform` with those ids is refused by validation, the status naming the
/// versions that work, and nothing is created.
#[tokio::test]
async fn platform_ids_refuse_server_tags_whose_su_cannot_take_group_zero() {
    use clickhouse_operator::api::ClusterState;
    use k8s_openapi::api::apps::v1::StatefulSet;
    const UID: i64 = 1_000_650_000;
    let Scenario { client, ns, op } = Scenario::start("sugid").await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    for tag in ["24.2", "24.8"] {
        let name = format!("server-{}", tag.replace('.', "-"));
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {
                "securityContext": {"runAsUser": UID, "runAsGroup": 0, "fsGroup": UID,
                                    "runAsNonRoot": true},
                "containers": [{"name": "clickhouse",
                                "image": format!("clickhouse/clickhouse-server:{tag}"),
                                "securityContext": {"readOnlyRootFilesystem": true},
                                "volumeMounts": [{"name": "data", "mountPath": "/var/lib/clickhouse"},
                                                 {"name": "tmp", "mountPath": "/tmp"},
                                                 {"name": "logs", "mountPath": "/var/log/clickhouse-server"}]}],
                "volumes": [{"name": "data", "emptyDir": {}}, {"name": "tmp", "emptyDir": {}},
                            {"name": "logs", "emptyDir": {}}]}
        }))
        .unwrap();
        pods.create(&Default::default(), &pod).await.unwrap();
    }
    let exited = wait_for(Duration::from_secs(90), "the 24.2 server exits", || {
        let pods = pods.clone();
        async move {
            let p = pods.get("server-24-2").await.ok()?;
            let cs = p.status?.container_statuses?.into_iter().next()?;
            let t = cs
                .last_state
                .and_then(|s| s.terminated)
                .or(cs.state?.terminated)?;
            Some(t)
        }
    })
    .await;
    let log_dir = pod_log_dir();
    let log = std::fs::read_dir(&log_dir)
        .unwrap()
        .flatten()
        .filter(|e| {
            let n = e.file_name().to_string_lossy().to_string();
            n.starts_with(&format!("{ns}_server-24-2_"))
        })
        .map(|e| std::fs::read_to_string(e.path().join("clickhouse.log")).unwrap_or_default())
        .collect::<String>();
    println!("24.2 exited with {}: {log}", exited.exit_code);
    assert_ne!(exited.exit_code, 0);
    assert!(
        log.contains("DB::Exception: Group 0 is not found in the system"),
        "{log}"
    );
    wait_for(Duration::from_secs(90), "the 24.8 server Ready", || {
        let pods = pods.clone();
        async move { pods.get("server-24-8").await.ok().filter(is_ready) }
    })
    .await;
    for name in ["server-24-2", "server-24-8"] {
        pods.delete(name, &DeleteParams::default()).await.unwrap();
    }

    let assigned = json!({"spec": {"securityContext": {
        "runAsUser": UID, "runAsGroup": 0, "fsGroup": UID}}});
    create_cluster(
        &client,
        &ns,
        "c1",
        json!({"shards": 1, "replicas": 1, "storage": {"size": "1Gi"},
               "image": "clickhouse/clickhouse-server:24.2",
               "podSecurity": {"ids": "Platform"},
               "pod": {"template": assigned},
               "keeper": {"replicas": 1, "pod": {"template": assigned}}}),
    )
    .await;
    let refused = wait_status(
        &client,
        &ns,
        "c1",
        Duration::from_secs(60),
        "the image refused",
        |s| s.state == ClusterState::Error,
    )
    .await;
    let s = refused.status.unwrap();
    let message = s.message.unwrap_or_default();
    println!("{message}");
    assert!(message.contains("spec.image"), "{message}");
    assert!(
        message.contains("Group 0 is not found in the system"),
        "{message}"
    );
    assert!(message.contains("24.3.14, 24.8.7"), "{message}");
    let sts: Api<StatefulSet> = Api::namespaced(client.clone(), &ns);
    assert!(
        sts.list(&Default::default())
            .await
            .unwrap()
            .items
            .is_empty(),
        "nothing is created"
    );
    finish(&client, &ns, op).await;
}

/// Issue 52 item 5, decision 67: a Keeper member loads its snapshot and logs before it waits
/// for a quorum and before it opens any port, so `startup_timeout` only starts after the load.
/// The stand-in loads its snapshots and logs at the rate the pod's annotation gives (1 MiB/s);
/// a 72 MiB snapshot is added and the member restarted: it needs 72 s before its port opens,
/// more than the 60 s budget earlier versions gave (it was killed and reloaded for ever). The
/// default budget now grows with the volume (60 s + 60 s per GiB: 120 s for 1Gi): the member
/// loads, opens its port and is Ready without a restart, and serves the rows written before.
#[tokio::test]
async fn a_keeper_member_whose_state_loads_longer_than_a_minute_starts_without_a_restart() {
    let (Scenario { client, ns, op }, c) = Scenario::ready(
        "kload",
        json!({"shards": 1, "replicas": 1, "storage": {"size": "1Gi"},
               "keeper": {"replicas": 1, "pod": {"annotations": {
                   "local-kubelet.clickhouse.com/keeper-load-bytes-per-second": "1048576"}}}}),
    )
    .await;
    let replicas = replica_names(&c);
    write_thousand_rows(&client, &ns, &replicas).await;
    let volume = volume_path(&client, &ns, "data-c1-keeper-0").await;
    let snapshots = volume.join("coordination/snapshots");
    std::fs::create_dir_all(&snapshots).unwrap();
    std::fs::write(
        snapshots.join("snapshot_large.bin.zstd"),
        vec![0x5au8; 72 << 20],
    )
    .unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let old_uid = pods.get("c1-keeper-0").await.unwrap().uid().unwrap();
    pods.delete("c1-keeper-0", &DeleteParams::default())
        .await
        .unwrap();
    let (uid, _, started) = wait_for(
        Duration::from_secs(120),
        "c1-keeper-0 back and running",
        || {
            let (client, ns, old_uid) = (client.clone(), ns.clone(), old_uid.clone());
            async move {
                main_container(&client, &ns, "c1-keeper-0")
                    .await
                    .filter(|(uid, _, _)| *uid != old_uid)
            }
        },
    )
    .await;
    let since = Instant::now();
    let ready = wait_for(Duration::from_secs(180), "c1-keeper-0 Ready", || {
        let (pods, client, ns) = (pods.clone(), client.clone(), ns.clone());
        let (uid, started) = (uid.clone(), started.clone());
        async move {
            let (now_uid, restarts, now_started) =
                main_container(&client, &ns, "c1-keeper-0").await?;
            assert_eq!(
                (now_uid.as_str(), restarts, now_started.as_str()),
                (uid.as_str(), 0, started.as_str()),
                "the member was restarted while it loaded"
            );
            pods.get("c1-keeper-0").await.ok().filter(is_ready)?;
            Some(since.elapsed())
        }
    })
    .await;
    println!("c1-keeper-0 Ready {ready:?} after its start, no restart");
    assert!(
        ready > Duration::from_secs(60),
        "the load took longer than the earlier budget: {ready:?}"
    );
    wait_status(&client, &ns, "c1", READY, "ready again", |s| {
        s.state == clickhouse_operator::api::ClusterState::Ready
    })
    .await;
    assert_thousand_rows(&client, &ns, &replicas, "after Keeper's long load").await;
    finish(&client, &ns, op).await;
}

/// What `hack/image.sh` built: (image reference, manifest digest, version).
fn built_image() -> (String, String, String) {
    let env = repo_path("target/image/image.env");
    let text = std::fs::read_to_string(&env).unwrap_or_else(|e| {
        panic!(
            "{}: {e}: run `bash hack/image.sh` first (the README's test command does)",
            env.display()
        )
    });
    let get = |k: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{k}=")))
            .unwrap_or_else(|| panic!("{k} in {}", env.display()))
            .to_string()
    };
    (get("IMAGE"), get("DIGEST"), get("VERSION"))
}

fn repo_path(p: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(p)
}

/// docs/operations.md, "The image": the operator installed from its packaged chart runs from
/// the image `hack/image.sh` built, not from a binary of the machine: the node agent, holding
/// that image in its store (`LOCAL_KUBELET_IMAGE_STORE`), unpacks its root filesystem and
/// starts its entrypoint as its user (`local-kubelet/src/oci.rs`), and reports the image's
/// digest as the container's `imageID`. From there the operator (leader election on, its
/// Lease in its own namespace, watching another) brings up a replicated cluster whose rows
/// reach both replicas: its names resolve, its API token, CA and ClickHouse connections work
/// inside the image.
#[tokio::test]
async fn the_operator_runs_from_its_packaged_chart_and_image_and_serves_a_cluster() {
    let (image, digest, version) = built_image();
    let client = client().await;
    let op_ns = namespace(&client, "imgop").await;
    let ns = namespace(&client, "img").await;
    let chart = repo_path(&format!("target/image/clickhouse-operator-{version}.tgz"));
    let chart = chart.to_string_lossy();
    let watch = format!("watchNamespace={ns}");
    let mut args = vec![
        "install",
        "op",
        &chart,
        "-n",
        &op_ns,
        "--skip-crds",
        "--set",
        "replicaCount=1",
        "--set",
        "pvcCleaner.enabled=false",
        "--set",
        &watch,
    ];
    // the test writes its rows from this machine with the operator's account: on several
    // nodes this machine reaches the pods from the bridge, outside the operator pod's network
    // (the chart requires the value, decision 71; every local cluster's pods are in 198.18.0.0/15)
    let cidr = cluster_network("POD_CIDR").unwrap_or_else(|| "198.18.0.0/15".into());
    let networks = format!("operatorNetworks={{{cidr}}}");
    args.extend(["--set", &networks]);
    helm_run(&args);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &op_ns);
    let op_pod = wait_for(Duration::from_secs(180), "the operator pod Ready", || {
        let pods = pods.clone();
        async move {
            let p = pods
                .list(
                    &kube::api::ListParams::default()
                        .labels("app.kubernetes.io/component=operator"),
                )
                .await
                .ok()?
                .items
                .pop()?;
            is_ready(&p).then_some(p)
        }
    })
    .await;
    let status = op_pod.status.clone().unwrap().container_statuses.unwrap();
    assert_eq!(status[0].image, image, "the chart names the built image");
    assert!(
        status[0].image_id.ends_with(&format!("@{digest}")),
        "the container ran from the built image {digest}: imageID {}",
        status[0].image_id
    );
    // the process: the image's binary, inside the image's root filesystem, as its user
    let name = op_pod.name_any();
    let pid = pid_of("/clickhouse-operator", &name, None);
    let root = std::fs::read_link(format!("/proc/{pid}/root")).unwrap();
    assert!(
        root.ends_with("rootfs") && root != std::path::Path::new("/"),
        "the operator's root is the image's root filesystem: {}",
        root.display()
    );
    assert!(root.join("clickhouse-operator").is_file());
    assert!(!root.join("bin/sh").exists(), "no shell in the image");
    let proc_status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let uid_line = proc_status.lines().find(|l| l.starts_with("Uid:")).unwrap();
    assert_eq!(
        uid_line.split_whitespace().nth(1),
        Some("65532"),
        "{uid_line}"
    );

    create_cluster(
        &client,
        &ns,
        "c1",
        json!({"shards": 1, "replicas": 2, "storage": {"size": "1Gi"},
               "keeper": {"replicas": 1}}),
    )
    .await;
    let c = wait_ready(&client, &ns, "c1", 1).await;
    let replicas = replica_names(&c);
    write_thousand_rows(&client, &ns, &replicas).await;
    assert_thousand_rows(&client, &ns, &replicas, "from the image's operator").await;
    // the operator in the pod deletes what it made
    clean_up(&client, &ns).await;
    helm_run(&["uninstall", "op", "-n", &op_ns, "--wait"]);
    let all: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    for n in [&ns, &op_ns] {
        let _ = all.delete(n, &DeleteParams::default()).await;
    }
}
