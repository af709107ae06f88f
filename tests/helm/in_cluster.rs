//! The charts on the real local Kubernetes, with the operator running in the cluster under the
//! chart's RBAC, and the audit log as the judge of least privilege.

use std::collections::{BTreeMap, BTreeSet};
use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use clickhouse_operator::api::{ClickHouseBackup, ClickHouseCluster, ClusterState};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Namespace, Pod, ResourceQuota};
use kube::api::{Api, DeleteParams, ListParams, ObjectMeta, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config, ResourceExt};

use super::{docs, helm, helm_cmd, repo, rule_triples, skipped, text};

const READY: Duration = Duration::from_secs(360);
/// The operator's Lease duration (src/runtime/leader.rs) and its standby's retry period.
const LEASE_DURATION: Duration = Duration::from_secs(15);
const RETRY_PERIOD: Duration = Duration::from_secs(2);

/// The local cluster: `CHOP_KUBECONFIG`, or one started here (stopped at exit).
fn kubeconfig() -> &'static Path {
    static KC: OnceLock<PathBuf> = OnceLock::new();
    static STARTED: OnceLock<PathBuf> = OnceLock::new();
    extern "C" fn down_at_exit() {
        if let Some(dir) = STARTED.get() {
            let _ = Command::new("bash")
                .arg(repo().join("hack/local-cluster.sh"))
                .arg("down")
                .arg(dir)
                .status();
        }
    }
    KC.get_or_init(|| {
        if let Ok(p) = std::env::var("CHOP_KUBECONFIG") {
            return PathBuf::from(p);
        }
        let dir = repo()
            .join("target")
            .join(format!("helm-cluster-{}", std::process::id()));
        STARTED.set(dir.clone()).unwrap();
        // SAFETY: registering a plain extern "C" function with atexit has no preconditions.
        unsafe {
            libc::atexit(down_at_exit);
        }
        let ok = Command::new("bash")
            .arg(repo().join("hack/local-cluster.sh"))
            .arg("up")
            .arg(&dir)
            // the operator's image as `hack/image.sh` wrote it: pods of that image run from it
            .env("LOCAL_KUBELET_IMAGE_STORE", repo().join("target/image/oci"))
            .status()
            .expect("run hack/local-cluster.sh")
            .success();
        assert!(ok, "hack/local-cluster.sh up {} failed (another local cluster running? set CHOP_KUBECONFIG=<its dir>/kubeconfig)", dir.display());
        dir.join("kubeconfig")
    })
}

fn kubectl() -> PathBuf {
    let out = Command::new("bash")
        .arg(repo().join("hack/build-control-plane.sh"))
        .output()
        .expect("hack/build-control-plane.sh");
    let dir = String::from_utf8_lossy(&out.stdout)
        .lines()
        .last()
        .unwrap_or_default()
        .to_string();
    PathBuf::from(dir).join("kubectl")
}

async fn client() -> Client {
    let kc = Kubeconfig::read_from(kubeconfig()).expect("read the kubeconfig");
    let config = Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .expect("a valid kubeconfig");
    Client::try_from(config).expect("a client")
}

async fn wait_for<T, F, Fut>(timeout: Duration, what: &str, mut probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if let Some(v) = probe().await {
            return v;
        }
        if tokio::time::Instant::now() >= deadline {
            panic!("timed out after {timeout:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Uninstalls the releases and deletes the namespaces when the test ends, passed or failed; on
/// failure, prints the end of the operator's logs.
struct Cleanup {
    op_ns: String,
    ch_ns: String,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        let kc = kubeconfig();
        if std::thread::panicking() {
            let dir = kc.parent().unwrap().join("logs/pods");
            if let Ok(entries) = std::fs::read_dir(&dir) {
                for e in entries.flatten() {
                    let name = e.file_name().to_string_lossy().to_string();
                    if name.starts_with(&format!("{}_", self.op_ns)) {
                        for f in std::fs::read_dir(e.path()).into_iter().flatten().flatten() {
                            let text = std::fs::read_to_string(f.path()).unwrap_or_default();
                            let tail: Vec<&str> = text.lines().rev().take(40).collect();
                            eprintln!(
                                "---- {name}/{} (last 40 lines) ----",
                                f.file_name().to_string_lossy()
                            );
                            for l in tail.iter().rev() {
                                eprintln!("{l}");
                            }
                        }
                    }
                }
            }
        }
        if let Ok(h) = helm() {
            for (rel, ns) in [("c1", &self.ch_ns), ("op", &self.op_ns)] {
                let _ = helm_cmd(h)
                    .args(["--kubeconfig"])
                    .arg(kc)
                    .args(["uninstall", rel, "-n", ns, "--ignore-not-found"])
                    .output();
            }
        }
        let k = kubectl();
        // the operator is gone: nothing would remove the finalizers
        let _ = Command::new(&k)
            .arg("--kubeconfig")
            .arg(kc)
            .args([
                "-n",
                &self.ch_ns,
                "patch",
                "chc",
                "c1",
                "c2",
                "--type=merge",
                "-p",
                r#"{"metadata":{"finalizers":null}}"#,
            ])
            .output();
        let _ = Command::new(&k)
            .arg("--kubeconfig")
            .arg(kc)
            .args([
                "delete",
                "namespace",
                &self.ch_ns,
                &self.op_ns,
                "--wait=false",
                "--ignore-not-found",
            ])
            .output();
    }
}

fn helm_in_cluster(args: &[&str]) -> String {
    let h = helm().expect("helm");
    // The API server refuses a ClickHouseCluster while the namespace's new ResourceQuota has no
    // status yet ("status unknown for quota"); the chart creates both at once, so an install
    // may meet that for a few seconds. A user re-runs the install; so does the test.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(90);
    loop {
        let mut c = helm_cmd(h);
        c.arg("--kubeconfig").arg(kubeconfig()).args(args);
        let out = c.output().expect("run helm");
        let stderr = String::from_utf8_lossy(&out.stderr);
        if !out.status.success()
            && stderr.contains("status unknown for quota")
            && std::time::Instant::now() < deadline
        {
            eprintln!("helm {args:?}: the quota has no status yet, retrying");
            let mut undo = helm_cmd(h);
            undo.arg("--kubeconfig").arg(kubeconfig());
            if let Some(i) = args.iter().position(|a| *a == "install") {
                undo.args(["uninstall", args[i + 1]]);
                if let Some(n) = args.iter().position(|a| *a == "-n") {
                    undo.args(["-n", args[n + 1]]);
                }
                let _ = undo.output();
            }
            std::thread::sleep(std::time::Duration::from_secs(3));
            continue;
        }
        assert!(
            out.status.success(),
            "helm {args:?} failed:\n{}\n{stderr}",
            String::from_utf8_lossy(&out.stdout)
        );
        return String::from_utf8_lossy(&out.stdout).into_owned();
    }
}

async fn create_namespace(client: &Client, name: &str) {
    Api::<Namespace>::all(client.clone())
        .create(
            &PostParams::default(),
            &Namespace {
                metadata: ObjectMeta {
                    name: Some(name.into()),
                    ..ObjectMeta::default()
                },
                ..Namespace::default()
            },
        )
        .await
        .expect("create a namespace");
}

async fn wait_state(
    api: &Api<ClickHouseCluster>,
    name: &str,
    what: &str,
    pred: impl Fn(&ClickHouseCluster) -> bool,
) -> ClickHouseCluster {
    wait_for(READY, what, || async {
        let c = api.get(name).await.ok()?;
        pred(&c).then_some(c)
    })
    .await
}

/// Applies `sets` to release c1 and waits until the cluster is `state` at the new generation.
async fn upgrade_and_wait(
    api: &Api<ClickHouseCluster>,
    ch_ns: &str,
    sets: &[&str],
    state: ClusterState,
    extra: impl Fn(&ClickHouseCluster) -> bool,
) -> ClickHouseCluster {
    let chart = repo()
        .join("charts/onprem-clickhouse-cluster")
        .to_string_lossy()
        .into_owned();
    let mut args = vec!["upgrade", "c1", &chart, "-n", ch_ns, "--reuse-values"];
    for s in sets {
        // annotation values are strings ("true"), spec values keep their YAML type
        args.push(if s.starts_with("annotations.") {
            "--set-string"
        } else {
            "--set"
        });
        args.push(s);
    }
    helm_in_cluster(&args);
    let generation = api.get("c1").await.unwrap().metadata.generation.unwrap();
    wait_state(
        api,
        "c1",
        &format!("c1 {state} at generation {generation} after {sets:?}"),
        |c| {
            c.status
                .as_ref()
                .is_some_and(|s| s.state == state && s.observed_generation == Some(generation))
                && extra(c)
        },
    )
    .await
}

/// (uid, restarts) of every ClickHouse and Keeper pod of c1.
async fn cluster_pods(client: &Client, ns: &str) -> BTreeMap<String, (String, i32)> {
    Api::<Pod>::namespaced(client.clone(), ns)
        .list(&ListParams::default().labels("clickhouse.com/cluster=c1"))
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|p| {
            let restarts = p
                .status
                .as_ref()
                .and_then(|s| s.container_statuses.as_ref())
                .map_or(0, |cs| cs.iter().map(|c| c.restart_count).sum());
            (p.name_any(), (p.uid().unwrap_or_default(), restarts))
        })
        .collect()
}

/// One request of a ServiceAccount in the audit log.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Request {
    user: String,
    verb: String,
    group: String,
    resource: String,
    namespace: String,
    name: String,
    code: i64,
}

fn audit_requests(audit: &Path, users: &BTreeSet<String>, since: &str) -> Vec<Request> {
    let mut out = BTreeMap::new();
    let f = std::fs::File::open(audit).unwrap_or_else(|e| panic!("{}: {e}", audit.display()));
    for line in std::io::BufReader::new(f).lines() {
        let Ok(line) = line else { continue };
        let Ok(ev) = serde_json::from_str::<serde_json::Value>(&line) else {
            continue;
        };
        let user = ev["user"]["username"].as_str().unwrap_or_default();
        if !users.contains(user) || ev["stage"] == "RequestReceived" {
            continue;
        }
        if ev["requestReceivedTimestamp"].as_str().unwrap_or_default() < since {
            continue;
        }
        let o = &ev["objectRef"];
        let mut resource = o["resource"].as_str().unwrap_or_default().to_string();
        if let Some(sub) = o["subresource"].as_str() {
            resource = format!("{resource}/{sub}");
        }
        let req = Request {
            user: user.to_string(),
            verb: ev["verb"].as_str().unwrap_or_default().to_string(),
            group: o["apiGroup"].as_str().unwrap_or_default().to_string(),
            resource,
            namespace: o["namespace"].as_str().unwrap_or_default().to_string(),
            name: o["name"].as_str().unwrap_or_default().to_string(),
            code: ev["responseStatus"]["code"].as_i64().unwrap_or(0),
        };
        out.insert(ev["auditID"].as_str().unwrap_or_default().to_string(), req);
    }
    out.into_values().collect()
}

/// The whole story, in order (one test: the steps build on each other and share one cluster).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn charts_in_the_cluster_least_privilege_quota_guard_and_failover() {
    let Ok(_) = helm() else {
        skipped(&format!(
            "helm cannot be built here: {}",
            helm().unwrap_err()
        ));
        return;
    };
    // the binary the node agent runs for the operator image: cargo built it for this test
    let binary = PathBuf::from(env!("CARGO_BIN_EXE_clickhouse-operator"));
    assert!(binary.is_file());
    let started = Instant::now();
    let client = client().await;
    let since = k8s_openapi::jiff::Timestamp::now().to_string();
    let id = std::process::id() % 100_000;
    let op_ns = format!("helm-op-{id}");
    let ch_ns = format!("helm-ch-{id}");
    let _cleanup = Cleanup {
        op_ns: op_ns.clone(),
        ch_ns: ch_ns.clone(),
    };
    create_namespace(&client, &op_ns).await;
    create_namespace(&client, &ch_ns).await;

    // ---- the operator chart, CRDs included, watching the cluster namespace only
    let chart = repo().join("charts/clickhouse-operator");
    let out = helm_in_cluster(&[
        "install",
        "op",
        &chart.to_string_lossy(),
        "-n",
        &op_ns,
        "--set",
        "image.repository=localhost/clickhouse-operator",
        "--set",
        "image.tag=dev",
        "--set",
        &format!("watchNamespace={ch_ns}"),
        "--set-string",
        "log.level=info\\,clickhouse_operator=debug",
        "--set",
        "log.format=text",
    ]);
    eprintln!("{out}");
    let leases: Api<Lease> = Api::namespaced(client.clone(), &op_ns);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &op_ns);
    let op_pods = |pods: Api<Pod>| async move {
        pods.list(&ListParams::default().labels("app.kubernetes.io/component=operator"))
            .await
            .map(|l| {
                l.items
                    .into_iter()
                    .map(|p| p.name_any())
                    .collect::<BTreeSet<_>>()
            })
            .unwrap_or_default()
    };
    let leader = wait_for(
        Duration::from_secs(120),
        "an operator pod holding the Lease",
        || {
            let (leases, pods) = (leases.clone(), pods.clone());
            async move {
                let holder = leases
                    .get("op-clickhouse-operator-leader")
                    .await
                    .ok()?
                    .spec?
                    .holder_identity?;
                op_pods(pods).await.contains(&holder).then_some(holder)
            }
        },
    )
    .await;
    eprintln!("leader: {leader} ({:?})", started.elapsed());
    // decision 40: without operatorNetworks, the chart gives the operator the pod CIDRs the
    // Nodes publish, not a guess, and says which
    let node_cidrs: BTreeSet<String> = Api::<k8s_openapi::api::core::v1::Node>::all(client.clone())
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .flat_map(|n| n.spec.and_then(|s| s.pod_cidrs).unwrap_or_default())
        .collect();
    assert!(!node_cidrs.is_empty(), "the node publishes its pod CIDR");
    let deployment: k8s_openapi::api::apps::v1::Deployment =
        Api::namespaced(client.clone(), &op_ns)
            .get("op-clickhouse-operator")
            .await
            .unwrap();
    let networks = deployment.spec.template.spec.unwrap().containers[0]
        .env
        .clone()
        .unwrap_or_default()
        .into_iter()
        .find(|e| e.name == "OPERATOR_NETWORKS")
        .and_then(|e| e.value)
        .unwrap_or_default();
    assert_eq!(
        networks
            .split(',')
            .map(str::to_string)
            .collect::<BTreeSet<_>>(),
        node_cidrs
    );
    assert!(
        out.contains(&format!("accepts logins from: {networks}")),
        "{out}"
    );

    // ---- the cluster chart with its quota
    let chc_chart = repo().join("charts/onprem-clickhouse-cluster");
    helm_in_cluster(&[
        "install",
        "c1",
        &chc_chart.to_string_lossy(),
        "-n",
        &ch_ns,
        "--set",
        "spec.replicas=1",
        "--set",
        "spec.keeper.replicas=1",
        "--set",
        "spec.storage.size=1Gi",
        "--set",
        "spec.keeper.storage.size=1Gi",
    ]);
    let quotas: Api<ResourceQuota> = Api::namespaced(client.clone(), &ch_ns);
    assert_eq!(
        quotas
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .len(),
        1
    );
    let api: Api<ClickHouseCluster> = Api::namespaced(client.clone(), &ch_ns);
    wait_state(&api, "c1", "c1 ready (operator in the cluster)", |c| {
        c.status
            .as_ref()
            .is_some_and(|s| s.state == ClusterState::Ready)
    })
    .await;
    eprintln!("c1 ready ({:?})", started.elapsed());

    // ---- S0-08: a second cluster is refused by the API server. The quota admission charges a
    // ClickHouseCluster only once the quota controller has filled the quota's status; helm
    // creates both in the same second, so c1 may be counted only at the controller's next full
    // resync (--resource-quota-sync-period, 5 min by default). Wait for it, and say how long.
    let counted = Instant::now();
    wait_for(
        Duration::from_secs(330),
        "the quota to count c1",
        || async {
            let q = quotas
                .list(&ListParams::default())
                .await
                .ok()?
                .items
                .pop()?;
            let used = q.status?.used?;
            (used.get("count/clickhouseclusters.clickhouse.com")?.0 == "1").then_some(())
        },
    )
    .await;
    eprintln!("the quota counts c1 after {:?}", counted.elapsed());
    let second: ClickHouseCluster = serde_json::from_value(serde_json::json!({
        "apiVersion": "clickhouse.com/v1alpha1",
        "kind": "ClickHouseCluster",
        "metadata": {"name": "c2", "namespace": ch_ns},
        "spec": {"replicas": 1, "keeper": {"replicas": 1}, "storage": {"size": "1Gi"}},
    }))
    .unwrap();
    let err = api
        .create(&PostParams::default(), &second)
        .await
        .expect_err("the quota refuses a second ClickHouseCluster");
    assert!(err.to_string().contains("exceeded quota"), "{err}");

    // ---- S0-07: without the quota, the operator's guard refuses it
    let c = upgrade_and_wait(
        &api,
        &ch_ns,
        &["resourceQuota.enabled=false"],
        ClusterState::Ready,
        |_| true,
    )
    .await;
    assert_eq!(c.status.unwrap().clickhouse.ready, 1);
    assert!(
        quotas
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .is_empty()
    );
    api.create(&PostParams::default(), &second)
        .await
        .expect("accepted without the quota");
    let c2 = wait_state(
        &api,
        "c2",
        "c2 refused by the operator (status error)",
        |c| {
            c.status
                .as_ref()
                .is_some_and(|s| s.state == ClusterState::Error)
        },
    )
    .await;
    let msg = c2.status.unwrap().message.unwrap_or_default();
    assert!(
        msg.contains("already managed by ClickHouseCluster c1"),
        "{msg}"
    );
    let sts: Api<StatefulSet> = Api::namespaced(client.clone(), &ch_ns);
    assert!(
        sts.list(&ListParams::default().labels("clickhouse.com/cluster=c2"))
            .await
            .unwrap()
            .items
            .is_empty()
    );
    api.delete("c2", &DeleteParams::default()).await.unwrap();
    wait_for(Duration::from_secs(60), "c2 gone", || async {
        api.get_opt("c2").await.ok()?.is_none().then_some(())
    })
    .await;
    upgrade_and_wait(
        &api,
        &ch_ns,
        &["resourceQuota.enabled=true"],
        ClusterState::Ready,
        |_| true,
    )
    .await;
    eprintln!("quota and guard checked ({:?})", started.elapsed());

    // ---- users from a Secret of the chart, then a changed password (the operator reads the
    // referenced Secret and applies the users Secret it renders)
    upgrade_and_wait(
        &api,
        &ch_ns,
        &[
            "usersSecret.create=true",
            "usersSecret.users.analyst=first-password",
        ],
        ClusterState::Ready,
        |_| true,
    )
    .await;
    helm_in_cluster(&[
        "upgrade",
        "c1",
        &chc_chart.to_string_lossy(),
        "-n",
        &ch_ns,
        "--reuse-values",
        "--set",
        "usersSecret.users.analyst=second-password",
    ]);
    tokio::time::sleep(Duration::from_secs(8)).await;
    wait_state(&api, "c1", "c1 ready after a password change", |c| {
        c.status
            .as_ref()
            .is_some_and(|s| s.state == ClusterState::Ready)
    })
    .await;
    eprintln!("users ({:?})", started.elapsed());

    // ---- scale out (replicas and shards), scale in
    upgrade_and_wait(
        &api,
        &ch_ns,
        &["spec.replicas=2", "spec.shards=2"],
        ClusterState::Ready,
        |c| c.status.as_ref().is_some_and(|s| s.clickhouse.ready == 4),
    )
    .await;
    eprintln!("scaled out ({:?})", started.elapsed());
    upgrade_and_wait(
        &api,
        &ch_ns,
        &[
            "spec.replicas=1",
            "spec.shards=1",
            "annotations.clickhouse\\.com/allow-data-loss=true",
        ],
        ClusterState::Ready,
        |c| {
            c.status
                .as_ref()
                .is_some_and(|s| s.clickhouse.size == 1 && s.clickhouse.ready == 1)
        },
    )
    .await;
    eprintln!("scaled in ({:?})", started.elapsed());

    // ---- roll: a new image, a PDB and a client Service change in one go
    upgrade_and_wait(
        &api,
        &ch_ns,
        &[
            "spec.image=clickhouse/clickhouse-server:24.9",
            "spec.podDisruptionBudget.maxUnavailable=2",
            "spec.clientService.annotations.team=analytics",
        ],
        ClusterState::Ready,
        |_| true,
    )
    .await;
    eprintln!("rolled ({:?})", started.elapsed());
    // the client Service switched off and on again
    upgrade_and_wait(
        &api,
        &ch_ns,
        &["spec.clientService.enabled=false"],
        ClusterState::Ready,
        |_| true,
    )
    .await;
    upgrade_and_wait(
        &api,
        &ch_ns,
        &["spec.clientService.enabled=true"],
        ClusterState::Ready,
        |_| true,
    )
    .await;
    // a volume grows: PVC resized, StatefulSet recreated with its pod orphaned
    upgrade_and_wait(
        &api,
        &ch_ns,
        &[
            "spec.storageScaling.enableVolumeScaling=true",
            "spec.storage.size=2Gi",
        ],
        ClusterState::Ready,
        |_| true,
    )
    .await;
    eprintln!("services and storage ({:?})", started.elapsed());
    upgrade_and_wait(
        &api,
        &ch_ns,
        &["spec.pause=true"],
        ClusterState::Paused,
        |_| true,
    )
    .await;
    upgrade_and_wait(
        &api,
        &ch_ns,
        &["spec.pause=false"],
        ClusterState::Ready,
        |_| true,
    )
    .await;
    eprintln!("paused and resumed ({:?})", started.elapsed());

    // ---- a ClickHouseBackup gets a status from the backup controller
    let backups: Api<ClickHouseBackup> = Api::namespaced(client.clone(), &ch_ns);
    let b: ClickHouseBackup = serde_json::from_value(serde_json::json!({
        "apiVersion": "clickhouse.com/v1alpha1",
        "kind": "ClickHouseBackup",
        "metadata": {"name": "b1", "namespace": ch_ns},
        "spec": {"clusterName": "c1"},
    }))
    .unwrap();
    backups
        .create(&PostParams::default(), &b)
        .await
        .expect("create a backup");
    // the cluster names no destination: the backup fails, saying so
    wait_for(
        Duration::from_secs(60),
        "backup b1 failed for want of a destination",
        || async {
            let m = backups.get("b1").await.ok()?.status?.message?;
            m.contains("no destination").then_some(())
        },
    )
    .await;
    backups
        .delete("b1", &DeleteParams::default())
        .await
        .unwrap();

    // ---- S2-06: kill the leader; the standby takes the Lease within its duration, and the
    // cluster stays ready with no pod restarted
    let before = cluster_pods(&client, &ch_ns).await;
    let lease = leases.get("op-clickhouse-operator-leader").await.unwrap();
    let leader = lease.spec.unwrap().holder_identity.unwrap();
    let killed = Instant::now();
    pods.delete(&leader, &DeleteParams::default().grace_period(0))
        .await
        .expect("delete the leader pod");
    let new_leader = wait_for(
        LEASE_DURATION * 3,
        "another replica holding the Lease",
        || {
            let (leases, leader) = (leases.clone(), leader.clone());
            async move {
                let h = leases
                    .get("op-clickhouse-operator-leader")
                    .await
                    .ok()?
                    .spec?
                    .holder_identity?;
                (h != leader).then_some(h)
            }
        },
    )
    .await;
    let took = killed.elapsed();
    eprintln!("leader {leader} killed; {new_leader} took the Lease after {took:?}");
    assert!(
        took <= LEASE_DURATION + RETRY_PERIOD + Duration::from_secs(2),
        "the standby took {took:?} to take the Lease (duration {LEASE_DURATION:?})"
    );
    // the new leader has made its passes: nothing changed
    tokio::time::sleep(Duration::from_secs(15)).await;
    let c = api.get("c1").await.unwrap();
    let s = c.status.as_ref().unwrap();
    assert_eq!(
        s.state,
        ClusterState::Ready,
        "after the failover: {:?}",
        s.message
    );
    assert_eq!(
        cluster_pods(&client, &ch_ns).await,
        before,
        "no ClickHouse or Keeper pod restarted"
    );

    // ---- delete
    helm_in_cluster(&["uninstall", "c1", "-n", &ch_ns]);
    wait_for(
        Duration::from_secs(120),
        "c1 deleted (finalizer removed by the operator)",
        || async { api.get_opt("c1").await.ok()?.is_none().then_some(()) },
    )
    .await;
    eprintln!("deleted ({:?})", started.elapsed());
    // let the PVC cleaner sweep (every 10 s) the PVCs labelled by the scale-in
    tokio::time::sleep(Duration::from_secs(12)).await;

    // ---- least privilege, from the audit log
    let audit = kubeconfig().parent().unwrap().join("audit.log");
    let op_user = format!("system:serviceaccount:{op_ns}:op-clickhouse-operator");
    let cleaner_user = format!("system:serviceaccount:{op_ns}:op-clickhouse-operator-pvc-cleaner");
    let users: BTreeSet<String> = [op_user.clone(), cleaner_user.clone()].into();
    let requests = audit_requests(&audit, &users, &since);
    assert!(
        !requests.is_empty(),
        "no request of the operator in {}",
        audit.display()
    );
    // the operator in the pods did the work, under the chart's ServiceAccount (in-cluster config)
    for (verb, resource) in [
        ("create", "statefulsets"),
        ("patch", "clickhouseclusters/status"),
    ] {
        assert!(
            requests.iter().any(|r| r.user == op_user
                && r.verb == verb
                && r.resource == resource
                && r.namespace == ch_ns
                && r.code < 300),
            "no {verb} {resource} by {op_user}"
        );
    }
    let denied: Vec<&Request> = requests.iter().filter(|r| r.code == 403).collect();
    let manifest = helm_in_cluster(&["get", "manifest", "op", "-n", &op_ns]);
    let rendered = docs(&manifest);
    // (role namespace or "" for cluster-wide, subject user) → triples
    let mut rules: Vec<(String, String, (String, String, String))> = Vec::new();
    // the operator's and the cleaner's roles (not those aggregated into view/edit/admin for
    // tenants, which no ServiceAccount of the chart is bound to)
    for role in rendered
        .iter()
        .filter(|d| matches!(text(d, "kind").as_str(), "Role" | "ClusterRole"))
        .filter(|d| !super::aggregated(d))
    {
        let name = text(role, "metadata.name");
        let user = if name.ends_with("pvc-cleaner") {
            &cleaner_user
        } else {
            &op_user
        };
        for t in rule_triples(role) {
            rules.push((text(role, "metadata.namespace"), user.clone(), t));
        }
    }
    let mut used: BTreeSet<usize> = BTreeSet::new();
    let mut unmatched = Vec::new();
    for r in &requests {
        let mut any = false;
        for (i, (ns, user, (g, res, v))) in rules.iter().enumerate() {
            if *user == r.user
                && *g == r.group
                && *res == r.resource
                && *v == r.verb
                && (ns.is_empty() || *ns == r.namespace)
            {
                used.insert(i);
                any = true;
            }
        }
        if !any && r.code != 403 {
            unmatched.push(r.clone());
        }
    }
    let mut summary: BTreeMap<String, usize> = BTreeMap::new();
    for r in &requests {
        *summary
            .entry(format!(
                "{} {} {}{} in {} → {}",
                r.user.rsplit(':').next().unwrap(),
                r.verb,
                if r.group.is_empty() {
                    String::new()
                } else {
                    format!("{}/", r.group)
                },
                r.resource,
                r.namespace,
                r.code
            ))
            .or_default() += 1;
    }
    eprintln!(
        "requests of the operator's ServiceAccounts ({}):",
        requests.len()
    );
    for (k, n) in &summary {
        eprintln!("  {n:5} × {k}");
    }
    let unused: Vec<String> = rules
        .iter()
        .enumerate()
        .filter(|(i, _)| !used.contains(i))
        .map(|(_, (ns, user, (g, r, v)))| {
            format!(
                "{} may {v} {}{r} in {}",
                user.rsplit(':').next().unwrap(),
                if g.is_empty() {
                    String::new()
                } else {
                    format!("{g}/")
                },
                if ns.is_empty() { "all namespaces" } else { ns }
            )
        })
        .collect();
    eprintln!("RBAC rules never used in this run ({}):", unused.len());
    for u in &unused {
        eprintln!("  {u}");
    }
    assert!(
        denied.is_empty(),
        "requests of the operator denied by RBAC: {denied:#?}"
    );
    assert!(
        unmatched.is_empty(),
        "requests allowed by no rule of the chart: {unmatched:#?}"
    );
    let unexplained: Vec<&String> = unused
        .iter()
        .filter(|u| !KEPT_UNUSED.iter().any(|(k, _)| u.contains(k)))
        .collect();
    assert!(
        unexplained.is_empty(),
        "RBAC rules of the chart never used by the operator: remove them, or list them in \
         KEPT_UNUSED with the reason (also in the chart's comment): {unexplained:#?}"
    );
    eprintln!("done in {:?}", started.elapsed());
}

/// Rules of the chart that this run does not exercise but the operator needs, and why.
const KEPT_UNUSED: &[(&str, &str)] = &[
    (
        "may get apps/statefulsets",
        "repairing a hand edit reads the object by name for its managed fields (the caches keep \
         only others' entries); hand edits are repaired in tests/e2e/faults.rs, not in this run",
    ),
    (
        "may get configmaps",
        "repairing a hand edit reads the object by name (see statefulsets)",
    ),
    (
        "may get services",
        "repairing a hand edit reads the object by name (see statefulsets)",
    ),
    (
        "may get policy/poddisruptionbudgets",
        "repairing a hand edit reads the object by name (see statefulsets)",
    ),
    (
        "may get networking.k8s.io/networkpolicies",
        "repairing a hand edit reads the object by name (see statefulsets)",
    ),
    (
        "may get pods/log",
        "the last error of a crash-looping container is read from its previous run's log; no \
         container crash-loops in this run (tests/e2e/faults.rs has one)",
    ),
    (
        "may patch configmaps",
        "a change of spec.configuration (settings, files) or of the Keeper size updates a \
         ConfigMap the operator created; this run changes neither, so it only creates them",
    ),
    (
        "may get batch/jobs",
        "a backup reads its agent Jobs by name; backups run in tests/e2e/backup/ (an S3 \
         server beside the cluster), not in this run",
    ),
    (
        "may create batch/jobs",
        "a backup creates one agent Job per shard; see tests/e2e/backup/",
    ),
    (
        "may get clickhouse.com/clickhousebackups",
        "a restore reads the ClickHouseBackup it names; see tests/e2e/backup/",
    ),
    (
        "may create clickhouse.com/clickhousebackups",
        "a schedule creates a backup when a slot is due; see tests/e2e/backup/schedule.rs",
    ),
    (
        "may delete clickhouse.com/clickhousebackups",
        "a schedule's retention deletes its oldest backups; see tests/e2e/backup/schedule.rs",
    ),
    (
        "may patch clickhouse.com/clickhouserestores/status",
        "restores run in tests/e2e/backup/, not in this run",
    ),
    (
        "may get serviceaccounts",
        "a backup with webIdentity reads its ServiceAccount (does it opt in?); see \
         tests/e2e/backup/web_identity.rs",
    ),
    (
        "may create serviceaccounts/token",
        "a backup with webIdentity requests a token of its ServiceAccount to check the bucket \
         and read and write manifests; see tests/e2e/backup/web_identity.rs",
    ),
    (
        "may delete batch/jobs",
        "a finished backup's agent Jobs are deleted; see tests/e2e/backup/",
    ),
    (
        "may patch networking.k8s.io/networkpolicies",
        "a NetworkPolicy is applied again when spec.networkPolicy.clients or the TLS ports \
         change; this run changes neither, so it only creates them",
    ),
    (
        "may delete networking.k8s.io/networkpolicies",
        "the NetworkPolicies are deleted when spec.networkPolicy.enabled is turned off (see \
         tests/e2e/security.rs); this run keeps them",
    ),
];

/// CRD upgrades: Helm created the CRDs, so applying the new ones server-side conflicts on every
/// changed field unless the fields are taken over (`--force-conflicts`), as charts/README.md
/// says. Run on copies of the CRDs in a group of their own, so that nobody's CRDs change.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crd_upgrade_with_server_side_apply_over_older_crds() {
    let Ok(_) = helm() else {
        skipped(&format!(
            "helm cannot be built here: {}",
            helm().unwrap_err()
        ));
        return;
    };
    let _ = client().await;
    let group = format!("upgrade-{}.chop.test", std::process::id() % 100_000);
    let new = String::from_utf8(
        Command::new(env!("CARGO_BIN_EXE_clickhouse-operator"))
            .arg("crd")
            .output()
            .expect("clickhouse-operator crd")
            .stdout,
    )
    .unwrap()
    .replace("clickhouse.com", &group);
    // the older CRDs: no spec.pause, another description
    let mut old_docs = docs(&new);
    for d in &mut old_docs {
        let props = d["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
            .as_mapping_mut()
            .unwrap();
        props.remove("pause");
        d["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["description"] =
            serde_yaml::Value::String("an older version".into());
    }
    let old: String = old_docs
        .iter()
        .map(|d| format!("---\n{}", serde_yaml::to_string(d).unwrap()))
        .collect();
    let dir = repo()
        .join("target")
        .join(format!("helm-crd-upgrade-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("old.yaml"), &old).unwrap();
    std::fs::write(dir.join("new.yaml"), &new).unwrap();
    let k = kubectl();
    let kubectl_run = |args: &[&str]| {
        Command::new(&k)
            .arg("--kubeconfig")
            .arg(kubeconfig())
            .args(args)
            .output()
            .unwrap()
    };
    let names = [
        format!("clickhouseclusters.{group}"),
        format!("clickhousebackups.{group}"),
    ];
    struct Gone<'a>(&'a dyn Fn(&[&str]) -> std::process::Output, &'a [String; 2]);
    impl Drop for Gone<'_> {
        fn drop(&mut self) {
            (self.0)(&[
                "delete",
                "crd",
                &self.1[0],
                &self.1[1],
                "--ignore-not-found",
                "--wait=false",
            ]);
        }
    }
    let _gone = Gone(&kubectl_run, &names);
    // as `helm install` does: a plain create
    let out = kubectl_run(&["create", "-f", &dir.join("old.yaml").to_string_lossy()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // without --force-conflicts the API server refuses the changed fields
    let out = kubectl_run(&[
        "apply",
        "--server-side",
        "-f",
        &dir.join("new.yaml").to_string_lossy(),
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        !out.status.success() && stderr.contains("conflict"),
        "apply --server-side over CRDs created by another manager: {} {stderr}",
        out.status
    );
    // with it, as charts/README.md says, the new CRDs are in place
    let out = kubectl_run(&[
        "apply",
        "--server-side",
        "--force-conflicts",
        "-f",
        &dir.join("new.yaml").to_string_lossy(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = kubectl_run(&[
        "get",
        "crd",
        &names[0],
        "-o",
        "jsonpath={.spec.versions[0].schema.openAPIV3Schema.properties.spec.properties.pause.type}",
    ]);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "boolean",
        "the new schema is applied"
    );
    let readme = std::fs::read_to_string(repo().join("charts/README.md")).unwrap();
    assert!(
        readme.contains(
            "clickhouse-operator crd | kubectl apply --server-side --force-conflicts -f -"
        )
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// "Install with Helm" runs as written: the marked shell block of README.md (once the section is
/// there) or else of charts/README.md, with only its first two lines (namespaces and image)
/// replaced to suit the local cluster. The charts it installs are the ones `hack/image.sh`
/// packaged, and the image is the one it built: every operator pod seen while the block runs
/// reports that image's digest as its `imageID` (the node agent runs it from the image's root
/// filesystem, `local-kubelet/src/oci.rs`), so what users install is what ran here.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn install_with_helm_readme_runs_as_written() {
    let helm_bin = match helm() {
        Ok(h) => h,
        Err(why) => {
            skipped(&format!("helm cannot be built here: {why}"));
            return;
        }
    };
    let _ = client().await;
    const MARK: &str = "<!-- tests/helm.rs runs the next block";
    let (file, readme) = ["README.md", "charts/README.md"]
        .iter()
        .map(|f| {
            (
                *f,
                std::fs::read_to_string(repo().join(f)).unwrap_or_default(),
            )
        })
        .find(|(_, text)| text.contains(MARK))
        .expect("a README with the marked \"Install with Helm\" block");
    eprintln!("running the block of {file}");
    let start = readme.find(MARK).unwrap();
    let block = &readme[start..];
    let block = &block[block.find("```sh\n").unwrap() + 6..];
    let block = &block[..block.find("\n```").unwrap()];
    let mut lines: Vec<&str> = block.lines().collect();
    assert!(
        lines[0].starts_with("export OPERATOR_NS=") && lines[1].starts_with("export IMAGE_REPO=")
    );
    let id = std::process::id() % 100_000;
    let (op_ns, ch_ns) = (
        format!("helm-readme-op-{id}"),
        format!("helm-readme-ch-{id}"),
    );
    let first = format!("export OPERATOR_NS={op_ns} CLUSTER_NS={ch_ns}");
    lines[0] = &first;
    // the image `hack/image.sh` built, as its image.env names it
    let built = std::fs::read_to_string(repo().join("target/image/image.env"))
        .expect("target/image/image.env: run `bash hack/image.sh` first");
    let built_var = |k: &str| {
        built
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{k}=")))
            .unwrap_or_else(|| panic!("{k} in target/image/image.env"))
            .to_string()
    };
    let (image, digest) = (built_var("IMAGE"), built_var("DIGEST"));
    let (image_repo, image_tag) = image.rsplit_once(':').unwrap();
    assert_eq!(image_tag, env!("CARGO_PKG_VERSION"));
    let second = format!("export IMAGE_REPO={image_repo} IMAGE_TAG={image_tag}");
    lines[1] = &second;
    assert!(
        block.contains(&format!(
            "target/image/clickhouse-operator-{}.tgz",
            env!("CARGO_PKG_VERSION")
        )),
        "the block installs the packaged chart of this version"
    );
    let script = lines.join("\n");
    struct Cleanup(String, String);
    impl Drop for Cleanup {
        fn drop(&mut self) {
            let k = kubectl();
            let kc = kubeconfig();
            if let Ok(h) = helm() {
                for (rel, ns) in [("events", &self.1), ("clickhouse-operator", &self.0)] {
                    let _ = helm_cmd(h)
                        .arg("--kubeconfig")
                        .arg(kc)
                        .args(["uninstall", rel, "-n", ns, "--ignore-not-found"])
                        .output();
                }
            }
            let _ = Command::new(&k)
                .arg("--kubeconfig")
                .arg(kc)
                .args([
                    "-n",
                    &self.1,
                    "patch",
                    "chc",
                    "events",
                    "other",
                    "--type=merge",
                    "-p",
                    r#"{"metadata":{"finalizers":null}}"#,
                ])
                .output();
            let _ = Command::new(&k)
                .arg("--kubeconfig")
                .arg(kc)
                .args([
                    "delete",
                    "namespace",
                    &self.0,
                    &self.1,
                    "--wait=false",
                    "--ignore-not-found",
                ])
                .output();
        }
    }
    let _cleanup = Cleanup(op_ns.clone(), ch_ns.clone());
    let path = format!(
        "{}:{}:{}",
        helm_bin.parent().unwrap().display(),
        kubectl().parent().unwrap().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut cmd = helm_cmd(helm_bin);
    // helm_cmd's environment (helm's folders under target/), but bash runs the block
    let envs: Vec<(String, String)> = cmd
        .get_envs()
        .filter_map(|(k, v)| {
            Some((
                k.to_string_lossy().into_owned(),
                v?.to_string_lossy().into_owned(),
            ))
        })
        .collect();
    cmd = Command::new("bash");
    cmd.args(["-euo", "pipefail", "-c", &script])
        .current_dir(repo())
        .env("PATH", path)
        .env("KUBECONFIG", kubeconfig())
        .envs(envs);
    // the image ids of the operator's pods (operator and PVC cleaner) while the block runs
    let seen = std::sync::Arc::new(std::sync::Mutex::new(BTreeSet::<(String, String)>::new()));
    let watcher = {
        let (seen, op_ns) = (seen.clone(), op_ns.clone());
        let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(client().await, &op_ns);
        tokio::spawn(async move {
            loop {
                for p in pods
                    .list(&Default::default())
                    .await
                    .map(|l| l.items)
                    .unwrap_or_default()
                {
                    for c in p
                        .status
                        .and_then(|s| s.container_statuses)
                        .unwrap_or_default()
                    {
                        if c.state.as_ref().is_some_and(|s| s.running.is_some()) {
                            seen.lock().unwrap().insert((c.image, c.image_id));
                        }
                    }
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        })
    };
    let started = Instant::now();
    let out = tokio::task::spawn_blocking(move || cmd.output().expect("bash"))
        .await
        .unwrap();
    watcher.abort();
    let seen = seen.lock().unwrap().clone();
    assert!(!seen.is_empty(), "no operator container seen running");
    for (img, id) in &seen {
        assert!(
            img == &image && id.ends_with(&format!("@{digest}")),
            "an operator container ran {img} ({id}), not the built image {image}@{digest}"
        );
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!("{stdout}\n{stderr}\n(ran in {:?})", started.elapsed());
    assert!(out.status.success(), "the README's block failed");
    assert!(
        stderr.contains("exceeded quota"),
        "the second cluster was not refused by the quota"
    );
    assert!(stdout.contains("refused, as it should be"));
    assert!(
        stdout.contains("ready"),
        "kubectl get chc shows the cluster ready"
    );
}
