//! The update strategies other than Smart Update, and Smart Update without a client Service,
//! driven end to end with rows being written (S2-26, S2-30, S2-33, S2-34, S2-37).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use clickhouse_operator::api::{ClickHouseCluster, ClusterState};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, ListParams};
use kube::{Client, ResourceExt};
use serde_json::json;

use crate::support::*;
use crate::workload::Workload;

const SERVERS: &str = "app.kubernetes.io/component=server";
const KEEPER: &str = "app.kubernetes.io/component=keeper";

/// The update strategy of each StatefulSet of the cluster, by name.
async fn strategies(client: &Client, ns: &str) -> BTreeMap<String, String> {
    Api::<StatefulSet>::namespaced(client.clone(), ns)
        .list(&ListParams::default().labels("clickhouse.com/cluster=c1"))
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|s| {
            let t = s
                .spec
                .update_strategy
                .as_ref()
                .and_then(|u| u.type_.clone())
                .unwrap_or_default();
            (s.name_any(), t)
        })
        .collect()
}

/// Whether the server pod `name` carries the pod-template annotation `mark`.
async fn pod_has_mark(client: &Client, ns: &str, name: &str, mark: &str) -> bool {
    Api::<Pod>::namespaced(client.clone(), ns)
        .get_opt(name)
        .await
        .ok()
        .flatten()
        .and_then(|p| p.metadata.annotations)
        .is_some_and(|a| a.get("example.com/mark").map(String::as_str) == Some(mark))
}

async fn state(client: &Client, ns: &str) -> (ClusterState, String) {
    let c = Api::<ClickHouseCluster>::namespaced(client.clone(), ns)
        .get("c1")
        .await
        .unwrap();
    let s = c.status.unwrap_or_default();
    (s.state, s.message.unwrap_or_default())
}

/// S2-34 and S2-33 under write load. `OnDelete`: a change that needs a restart reaches the
/// StatefulSets and restarts nothing for as long as nobody deletes a pod, while the state stays
/// `initializing` and says it waits for the pods to be deleted; each pod deleted by hand comes
/// back on the new template, and once all are, the cluster is `ready`. `RollingUpdate`: the
/// server StatefulSets switch to the native rolling update and the StatefulSet controller
/// replaces every server pod by itself, while Keeper stays `OnDelete` (rolled by the operator,
/// S2-26) and, not changed, is not restarted. Every acknowledged row is on every replica after.
#[tokio::test]
async fn on_delete_waits_for_pods_deleted_by_hand_and_rolling_update_rolls_natively() {
    let (Scenario { client, ns, op }, c) = Scenario::ready(
        "strat",
        json!({"shards": 1, "replicas": 2, "keeper": {"replicas": 1},
               "storage": {"size": "1Gi"}, "updateStrategy": "OnDelete"}),
    )
    .await;
    let replicas = replica_names(&c);
    for (name, t) in strategies(&client, &ns).await {
        assert_eq!(t, "OnDelete", "{name} under OnDelete");
    }
    let workload = Workload::start(&client, &ns, "c1").await;
    let keeper_before = pod_ids(&client, &ns, KEEPER).await;

    // OnDelete: the change waits for the pods to be deleted
    let before = pod_ids(&client, &ns, SERVERS).await;
    patch_spec(
        &client,
        &ns,
        "c1",
        json!({"pod": {"annotations": {"example.com/mark": "one"}}}),
    )
    .await;
    let sts: Api<StatefulSet> = Api::namespaced(client.clone(), &ns);
    wait_for(
        Duration::from_secs(60),
        "the server StatefulSets on the new template",
        || {
            let (sts, replicas) = (sts.clone(), replicas.clone());
            async move {
                for r in &replicas {
                    let s = sts.get(r).await.ok()?;
                    let a = s.spec.template.metadata?.annotations?;
                    (a.get("example.com/mark")? == "one").then_some(())?;
                }
                Some(())
            }
        },
    )
    .await;
    let until = Instant::now() + Duration::from_secs(20);
    while Instant::now() < until {
        let (s, message) = state(&client, &ns).await;
        assert_eq!(
            pod_ids(&client, &ns, SERVERS).await,
            before,
            "OnDelete restarts nothing by itself"
        );
        assert!(
            s == ClusterState::Initializing,
            "a pending revision under OnDelete is `initializing`, not {s:?} ({message})"
        );
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    let (_, message) = state(&client, &ns).await;
    println!("OnDelete, pods not deleted yet: {message}");
    assert!(!message.is_empty(), "the status says what it waits for");
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    for (i, r) in replicas.iter().enumerate() {
        let pod = format!("{r}-0");
        pods.delete(&pod, &DeleteParams::default()).await.unwrap();
        wait_for(
            Duration::from_secs(180),
            &format!("{pod} back on the new template and Ready"),
            || {
                let (client, ns, pod, pods) =
                    (client.clone(), ns.clone(), pod.clone(), pods.clone());
                async move {
                    let p = pods.get_opt(&pod).await.ok()??;
                    let ready = p
                        .status
                        .as_ref()?
                        .conditions
                        .as_ref()?
                        .iter()
                        .any(|c| c.type_ == "Ready" && c.status == "True");
                    (ready && pod_has_mark(&client, &ns, &pod, "one").await).then_some(())
                }
            },
        )
        .await;
        if i + 1 < replicas.len() {
            let (s, _) = state(&client, &ns).await;
            assert_eq!(
                s,
                ClusterState::Initializing,
                "one pod still on the old template"
            );
        }
    }
    wait_ready(&client, &ns, "c1", 2).await;

    // RollingUpdate: the StatefulSet controller replaces every server pod
    let before = pod_ids(&client, &ns, SERVERS).await;
    patch_spec(
        &client,
        &ns,
        "c1",
        json!({"updateStrategy": "RollingUpdate",
               "pod": {"annotations": {"example.com/mark": "two"}}}),
    )
    .await;
    wait_ready(&client, &ns, "c1", 3).await;
    for (name, t) in strategies(&client, &ns).await {
        let want = if name.contains("keeper") {
            "OnDelete"
        } else {
            "RollingUpdate"
        };
        assert_eq!(t, want, "{name} under RollingUpdate");
    }
    let after = pod_ids(&client, &ns, SERVERS).await;
    for (pod, (uid, _)) in &before {
        assert_ne!(
            after.get(pod).map(|a| &a.0),
            Some(uid),
            "{pod} was replaced by the rolling update"
        );
        assert!(pod_has_mark(&client, &ns, pod, "two").await, "{pod}");
    }
    assert_eq!(
        pod_ids(&client, &ns, KEEPER).await,
        keeper_before,
        "Keeper, unchanged, is not restarted"
    );
    let batches = workload.stop_and_check(&client, &ns).await;
    println!("{batches} batches acknowledged and found on every replica");
    assert!(batches > 0);
    finish(&client, &ns, op).await;
}

/// S2-30 and S2-19: with the client Service switched off there is no client path to wait for,
/// so Smart Update restarts the replicas itself, one at a time, the backup replica last, and the
/// cluster returns to `ready`; no Service by the cluster's name exists meanwhile. Rows written
/// straight to a replica before the change are on both replicas after it.
#[tokio::test]
async fn smart_update_without_the_client_service_rolls_one_replica_at_a_time() {
    let (Scenario { client, ns, op }, c) = Scenario::ready(
        "noclient",
        json!({"shards": 1, "replicas": 2, "keeper": {"replicas": 1},
               "storage": {"size": "1Gi"}, "clientService": {"enabled": false}}),
    )
    .await;
    let replicas = replica_names(&c);
    let backup = backup_replica(&c);
    let services: Api<k8s_openapi::api::core::v1::Service> = Api::namespaced(client.clone(), &ns);
    assert!(
        services.get_opt("c1").await.unwrap().is_none(),
        "no client Service"
    );
    write_thousand_rows(&client, &ns, &replicas).await;
    let before = pod_ids(&client, &ns, SERVERS).await;
    patch_spec(
        &client,
        &ns,
        "c1",
        json!({"pod": {"annotations": {"example.com/mark": "one"}}}),
    )
    .await;
    let (order, most_down) = watch_rollout(&client, &ns, "c1", &before, 2, 2).await;
    println!("restart order: {order:?}, most down at once: {most_down}");
    assert_eq!(most_down, 1, "one replica down at a time");
    assert_eq!(
        order.last(),
        Some(&format!("{backup}-0")),
        "the backup replica last"
    );
    assert!(services.get_opt("c1").await.unwrap().is_none());
    assert_thousand_rows(&client, &ns, &replicas, "after the rollout").await;
    finish(&client, &ns, op).await;
}

fn openssl(dir: &std::path::Path, args: &[&str]) {
    let out = std::process::Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("openssl");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A CA (`ca.crt`, `ca.key`) in `pki`, made once.
fn certificate_authority(pki: &std::path::Path) {
    std::fs::create_dir_all(pki).unwrap();
    if pki.join("ca.crt").exists() {
        return;
    }
    openssl(
        pki,
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "ca.key",
            "-out",
            "ca.crt",
            "-days",
            "2",
            "-subj",
            "/CN=test-ca",
        ],
    );
}

/// A server certificate `<name>.crt` (key `<name>.key`) signed by the CA of `pki`, for every
/// replica's name in the headless Service of cluster `c1` in `ns`; its serial number, as
/// `openssl x509 -serial` prints it.
fn server_certificate(pki: &std::path::Path, ns: &str, name: &str) -> String {
    certificate_authority(pki);
    let wildcard = format!("*.c1-headless.{ns}.svc.cluster.local");
    let (key, csr, crt) = (
        format!("{name}.key"),
        format!("{name}.csr"),
        format!("{name}.crt"),
    );
    openssl(
        pki,
        &[
            "req", "-newkey", "rsa:2048", "-nodes", "-keyout", &key, "-out", &csr, "-subj",
            "/CN=c1",
        ],
    );
    std::fs::write(
        pki.join("ext"),
        format!("subjectAltName=DNS:{wildcard}\nextendedKeyUsage=serverAuth,clientAuth\n"),
    )
    .unwrap();
    openssl(
        pki,
        &[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            &crt,
            "-days",
            "2",
            "-extfile",
            "ext",
        ],
    );
    serial_of(&std::fs::read(pki.join(&crt)).unwrap()).expect("the new certificate's serial")
}

/// The serial number of the first PEM certificate in `pem`.
fn serial_of(pem: &[u8]) -> Option<String> {
    use std::io::Write;
    let mut child = std::process::Command::new("openssl")
        .args(["x509", "-noout", "-serial"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .ok()?;
    child.stdin.take()?.write_all(pem).ok()?;
    let out = child.wait_with_output().ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    (out.status.success())
        .then(|| text.trim().strip_prefix("serial=").map(str::to_string))
        .flatten()
}

/// The serial number of the certificate `ip` serves on 8443 under `name`.
fn served_serial(name: &str, ip: &str) -> Option<String> {
    let out = std::process::Command::new("openssl")
        .args([
            "s_client",
            "-connect",
            &format!("{ip}:8443"),
            "-servername",
            name,
        ])
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .output()
        .ok()?;
    serial_of(&out.stdout)
}

/// The Secrets `c1-tls` (a server certificate `tls`, see [`server_certificate`]) and `c1-ca`
/// in `ns`, from a CA made in `pki`; the certificate's serial.
async fn tls_secrets(client: &Client, ns: &str, pki: &std::path::Path) -> String {
    let serial = server_certificate(pki, ns, "tls");
    let read = |f: &str| std::fs::read_to_string(pki.join(f)).unwrap();
    let secrets: Api<k8s_openapi::api::core::v1::Secret> = Api::namespaced(client.clone(), ns);
    for s in [
        json!({"metadata": {"name": "c1-tls"}, "type": "kubernetes.io/tls",
               "stringData": {"tls.crt": read("tls.crt"), "tls.key": read("tls.key")}}),
        json!({"metadata": {"name": "c1-ca"}, "stringData": {"ca.crt": read("ca.crt")}}),
    ] {
        secrets
            .create(&Default::default(), &serde_json::from_value(s).unwrap())
            .await
            .unwrap();
    }
    serial
}

/// Whether `pod` answers `/ping` over HTTPS on 8443 with a certificate for `name` signed by
/// the CA of `ca`.
fn https_ping(ca: &std::path::Path, name: &str, ip: &str) -> bool {
    std::process::Command::new("curl")
        .args(["-sS", "--max-time", "5", "--cacert"])
        .arg(ca)
        .arg("--resolve")
        .arg(format!("{name}:8443:{ip}"))
        .arg(format!("https://{name}:8443/ping"))
        .output()
        .is_ok_and(|o| o.status.success() && String::from_utf8_lossy(&o.stdout).trim() == "Ok.")
}

/// S2-23: `tls.enabled` switched on, then off, on a running cluster with rows in a replicated
/// table. Each switch stops every server at once (no server pod Ready at some moment, every pod
/// replaced) and starts them again on the new configuration: with TLS on, every replica serves
/// HTTPS on 8443 with the certificate of `serverCertSecret`, verified against the CA of
/// `caSecret` under its name in the headless Service, and the operator reaches the cluster
/// (`ready`); with TLS off, 8443 serves nothing. The rows are on every replica throughout.
#[tokio::test]
async fn tls_switched_on_and_off_stops_and_starts_the_cluster_and_keeps_the_rows() {
    let (Scenario { client, ns, op }, c) = Scenario::ready(
        "tlsflip",
        json!({"shards": 1, "replicas": 2, "keeper": {"replicas": 1},
               "storage": {"size": "1Gi"}}),
    )
    .await;
    let replicas = replica_names(&c);
    write_thousand_rows(&client, &ns, &replicas).await;
    // a CA and one server certificate for every replica's name in the headless Service
    let pki = std::env::temp_dir().join(format!("tlsflip-{}", std::process::id()));
    tls_secrets(&client, &ns, &pki).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let ca = pki.join("ca.crt");
    for (generation, on) in [(2, true), (3, false)] {
        let before = pod_ids(&client, &ns, SERVERS).await;
        patch_spec(
            &client,
            &ns,
            "c1",
            json!({"tls": {"enabled": on, "serverCertSecret": "c1-tls", "caSecret": "c1-ca"}}),
        )
        .await;
        // the whole cluster stops: at some moment no server pod is Ready
        let mut all_down = false;
        let t = Instant::now();
        loop {
            let list = pods
                .list(&ListParams::default().labels(SERVERS))
                .await
                .unwrap()
                .items;
            if !list.iter().any(clickhouse_operator::plan::facts::pod_ready) {
                all_down = true;
            }
            let s = Api::<ClickHouseCluster>::namespaced(client.clone(), &ns)
                .get("c1")
                .await
                .unwrap()
                .status
                .unwrap_or_default();
            if s.state == ClusterState::Ready && s.observed_generation == Some(generation) {
                break;
            }
            assert!(t.elapsed() < READY, "tls {on}: not ready: {:?}", s.message);
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        assert!(all_down, "tls {on}: the servers were stopped together");
        let after = pod_ids(&client, &ns, SERVERS).await;
        for (pod, (uid, _)) in &before {
            assert_ne!(after.get(pod).map(|a| &a.0), Some(uid), "{pod} restarted");
        }
        for r in &replicas {
            let pod = format!("{r}-0");
            let ip = pod_ip(&client, &ns, &pod).await;
            let name = format!("{pod}.c1-headless.{ns}.svc.cluster.local");
            assert_eq!(
                https_ping(&ca, &name, &ip),
                on,
                "tls {on}: {pod} serving HTTPS on 8443"
            );
        }
        assert_thousand_rows(&client, &ns, &replicas, &format!("tls {on}")).await;
    }
    let _ = std::fs::remove_dir_all(&pki);
    finish(&client, &ns, op).await;
}

/// S2-16: the certificate of a running TLS cluster rotated, as cert-manager
/// renews one: the `serverCertSecret` gets a new key and certificate from the same CA while rows
/// are written. The operator rolls the servers the Smart Update way (the Secret's hash in the
/// pod template, `clickhouse.com/tls-secret-hash`): each server pod replaced once, never more
/// than one down at once, the backup replica last, the cluster `ready` again; afterwards every
/// replica serves the new certificate (its serial, read with `openssl s_client`) verified
/// against the CA, and every acknowledged row is on every replica. Without the hash the pods
/// would keep serving the old certificate until something else restarted them.
#[tokio::test]
async fn a_rotated_server_certificate_rolls_the_servers_one_at_a_time_and_is_served() {
    use kube::api::{Patch, PatchParams};
    let Scenario { client, ns, op } = Scenario::start("tlsrot").await;
    let pki = std::env::temp_dir().join(format!("tlsrot-{}", std::process::id()));
    let first = tls_secrets(&client, &ns, &pki).await;
    create_cluster(
        &client,
        &ns,
        "c1",
        json!({"shards": 1, "replicas": 2, "keeper": {"replicas": 1}, "storage": {"size": "1Gi"},
               "tls": {"enabled": true, "serverCertSecret": "c1-tls", "caSecret": "c1-ca"}}),
    )
    .await;
    let c = wait_ready(&client, &ns, "c1", 1).await;
    let replicas = replica_names(&c);
    let servers: Vec<String> = replicas.iter().map(|r| format!("{r}-0")).collect();
    let ca = pki.join("ca.crt");
    let name_of = |pod: &str| format!("{pod}.c1-headless.{ns}.svc.cluster.local");
    for pod in &servers {
        let ip = pod_ip(&client, &ns, pod).await;
        assert!(https_ping(&ca, &name_of(pod), &ip), "{pod} serves HTTPS");
        assert_eq!(served_serial(&name_of(pod), &ip).as_ref(), Some(&first));
    }
    let workload = Workload::start(&client, &ns, "c1").await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let before = pod_ids(&client, &ns, SERVERS).await;
    // the renewal: a new key and certificate in the same Secret
    let second = server_certificate(&pki, &ns, "renewed");
    assert_ne!(first, second);
    let read = |f: &str| std::fs::read_to_string(pki.join(f)).unwrap();
    Api::<k8s_openapi::api::core::v1::Secret>::namespaced(client.clone(), &ns)
        .patch(
            "c1-tls",
            &PatchParams::default(),
            &Patch::Merge(json!({"stringData": {"tls.crt": read("renewed.crt"),
                                                 "tls.key": read("renewed.key")}})),
        )
        .await
        .unwrap();
    let rotated = Instant::now();
    let total = servers.len();
    let (order, most_down) =
        watch_replacements(&client, &ns, "c1", &before, total, |s, n, down| {
            n == total && s.state == ClusterState::Ready && down == 0
        })
        .await;
    println!(
        "rolled {order:?} in {:?}, at most {most_down} down at once",
        rotated.elapsed()
    );
    assert!(
        most_down <= 1,
        "one server at a time: {most_down} down at once"
    );
    let backup = format!("{}-0", backup_replica(&c));
    assert_eq!(
        order.last(),
        Some(&backup),
        "the backup replica last: {order:?}"
    );
    let after = pod_ids(&client, &ns, SERVERS).await;
    for pod in &servers {
        assert_eq!(after[pod].1, 0, "{pod}: its container restarted in place");
        let ip = pod_ip(&client, &ns, pod).await;
        assert!(https_ping(&ca, &name_of(pod), &ip), "{pod} serves HTTPS");
        assert_eq!(
            served_serial(&name_of(pod), &ip).as_ref(),
            Some(&second),
            "{pod} serves the renewed certificate"
        );
    }
    let batches = workload.stop_and_check(&client, &ns).await;
    println!("{batches} batches acknowledged and found on every replica");
    let _ = std::fs::remove_dir_all(&pki);
    finish(&client, &ns, op).await;
}
