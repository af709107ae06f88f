//! The whole story of the charts on the local Kubernetes, in one test: the operator installed by
//! its chart runs in the cluster under the chart's RBAC; the cluster chart's cluster becomes ready,
//! a second one is refused by the quota and, with the quota off, by the operator; scale out and
//! in, roll, pause, leader failover and delete; then the API server's audit log shows that no
//! request of the operator was denied and which RBAC rules were never used (`KEPT_UNUSED` says why
//! those are kept).

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use clickhouse_operator::api::{ClickHouseBackup, ClickHouseCluster, ClusterState};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Pod, ResourceQuota};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, PostParams};

use crate::support::{
    Cleanup, LEASE_DURATION, RETRY_PERIOD, Request, aggregated, audit_requests, client,
    cluster_pods, create_namespace, docs, helm, helm_in_cluster, kubeconfig, pod_network, repo,
    rule_triples, skipped, text, upgrade_and_wait, wait_for, wait_state,
};

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

    // ---- the operator chart, CRDs included, watching the cluster namespace only, given the
    // pod network (required, decision 71) and the cluster namespace as the one with webIdentity
    // backups (decision 72: the token rules are there, and unused, as listed below)
    let chart = repo().join("charts/clickhouse-operator");
    let networks = format!("operatorNetworks={{{}}}", pod_network());
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
        "--set",
        &networks,
        "--set",
        &format!("rbac.webIdentityNamespaces={{{ch_ns}}}"),
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
    // decision 71: the chart gives the operator the networks it was given, looked nothing up,
    // and says which; the operator started on its pod's address inside them
    let deployment: k8s_openapi::api::apps::v1::Deployment =
        Api::namespaced(client.clone(), &op_ns)
            .get("op-clickhouse-operator")
            .await
            .unwrap();
    let given = deployment.spec.template.spec.unwrap().containers[0]
        .env
        .clone()
        .unwrap_or_default()
        .into_iter()
        .find(|e| e.name == "OPERATOR_NETWORKS")
        .and_then(|e| e.value)
        .unwrap_or_default();
    assert_eq!(given, pod_network());
    assert!(
        out.contains(&format!("accepts logins from: {given}")),
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
        .filter(|d| !aggregated(d))
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
