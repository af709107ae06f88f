//! Backups with short-lived credentials (decision 43): a second S3 server whose STS verifies the
//! local API server's ServiceAccount tokens.

use super::*;

/// The S3 server of the web identity test: a second SeaweedFS on ports of its own, with its STS
/// (`AssumeRoleWithWebIdentity` on the S3 port) trusting the local API server as an OIDC
/// provider: it fetches the API server's JWKS (`/openid/v1/jwks`, read anonymously, verified
/// with the cluster's CA) and checks each token's signature, issuer and audience itself.
/// Its ports (each gRPC port is 10000 above) are clear of the first server's, gRPC included.
const WI_S3_PORT: u16 = 8433;

const WI_FILER_PORT: u16 = 8988;

const WI_BUCKET: &str = "chop-wi";

const ROLE: &str = "arn:aws:iam::000000000000:role/chop-backups";

/// The test's own static identity, to look into the bucket; no pod, Secret or resource of the
/// namespace holds it.
const WI_ADMIN: (&str, &str) = ("wi-admin", "wi-admin-secret-key");

/// Starts the web identity S3 server with a role `chop-backups` whose trust policy admits the
/// OIDC provider `kubernetes` (issuer `https://kubernetes.default.svc`, the API server's, audience
/// `sts.amazonaws.com`) for the subject `system:serviceaccount:<ns>:ch-backups` only, and whose
/// policy allows the bucket `chop-wi` only.
fn web_identity_s3(ns: &str) -> S3Server {
    let weed = weed_binary();
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("seaweedfs-wi-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("data")).unwrap();
    let kubeconfig_text = std::fs::read_to_string(kubeconfig()).unwrap();
    let api_server = kubeconfig_text
        .lines()
        .find_map(|l| l.trim().strip_prefix("server: "))
        .expect("the API server in the kubeconfig")
        .to_string();
    let ca = kubeconfig().with_file_name("pki").join("ca.crt");
    assert!(ca.exists(), "{}", ca.display());
    let iam = json!({
        "sts": {
            "tokenDuration": "1h", "maxSessionLength": "12h", "issuer": "seaweedfs-sts",
            "signingKey": random_key(),
            "providers": [{"name": "kubernetes", "type": "oidc", "enabled": true, "config": {
                "issuer": "https://kubernetes.default.svc",
                "clientId": "sts.amazonaws.com",
                "jwksUri": format!("{api_server}/openid/v1/jwks"),
                "tlsCaCert": ca.display().to_string(),
            }}],
        },
        "policy": {"defaultEffect": "Deny"},
        "roles": [{
            "roleName": "chop-backups", "roleArn": ROLE,
            "trustPolicy": {"Version": "2012-10-17", "Statement": [{
                "Effect": "Allow", "Principal": {"Federated": "kubernetes"},
                "Action": ["sts:AssumeRoleWithWebIdentity"],
                "Condition": {"StringEquals": {"oidc:sub": format!("system:serviceaccount:{ns}:ch-backups")}},
            }]},
            "attachedPolicies": ["chop-wi-bucket"],
        }],
        "policies": [{"name": "chop-wi-bucket", "document": {"Version": "2012-10-17", "Statement": [{
            "Effect": "Allow", "Action": ["s3:*"],
            "Resource": [format!("arn:aws:s3:::{WI_BUCKET}"), format!("arn:aws:s3:::{WI_BUCKET}/*")],
        }]}}],
    });
    std::fs::write(dir.join("iam.json"), iam.to_string()).unwrap();
    std::fs::write(
        dir.join("s3.json"),
        json!({"identities": [{"name": "wi-admin",
            "credentials": [{"accessKey": WI_ADMIN.0, "secretKey": WI_ADMIN.1}],
            "actions": ["Admin", "Read", "Write", "List", "Tagging"]}]})
        .to_string(),
    )
    .unwrap();
    let log = dir.join("weed.log");
    let child = spawn_weed(
        &weed,
        vec![
            format!("-dir={}", dir.join("data").display()),
            format!("-s3.config={}", dir.join("s3.json").display()),
            format!("-s3.iam.config={}", dir.join("iam.json").display()),
            format!("-bucket={WI_BUCKET}"),
            format!("-s3.port={WI_S3_PORT}"),
            format!("-filer.port={WI_FILER_PORT}"),
            "-master.port=9433".into(),
            "-volume.port=9440".into(),
            "-webdav.port=7433".into(),
            "-s3.port.iceberg=0".into(),
            "-s3.port.lance=0".into(),
            "-master.telemetry=false".into(),
        ],
        &log,
    );
    S3Server {
        child: std::sync::Mutex::new(child),
        log,
        for_pods: format!("http://{}:{WI_S3_PORT}", gateway()),
    }
}

/// 32 random bytes in base64 (the STS signing key).
fn random_key() -> String {
    let out = Command::new("openssl")
        .args(["rand", "-base64", "32"])
        .output()
        .expect("openssl rand");
    assert!(out.status.success());
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

/// The web identity bucket as this test process reaches it, with its own static identity.
fn wi_bucket(prefix: &str) -> Bucket {
    Bucket::open(
        &S3Destination {
            endpoint: format!("http://127.0.0.1:{WI_S3_PORT}"),
            bucket: WI_BUCKET.into(),
            prefix: Some(prefix.into()),
            secret_name: "unused".into(),
            ..S3Destination::default()
        },
        WI_ADMIN.0,
        WI_ADMIN.1,
        "",
        Patience::Quick,
    )
    .unwrap()
}

/// An OIDC provider's verifier reads the issuer's discovery document and keys without
/// credentials, as an IAM OIDC provider reads a cluster's: the ClusterRole Kubernetes ships for
/// it, bound to unauthenticated clients.
async fn allow_anonymous_oidc_discovery(client: &Client) {
    use k8s_openapi::api::rbac::v1::ClusterRoleBinding;
    let b: ClusterRoleBinding = serde_json::from_value(json!({
        "metadata": {"name": "e2e-service-account-issuer-discovery-anonymous"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                    "name": "system:service-account-issuer-discovery"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group",
                      "name": "system:unauthenticated"}],
    }))
    .unwrap();
    match Api::<ClusterRoleBinding>::all(client.clone())
        .create(&PostParams::default(), &b)
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        Err(e) => panic!("{e}"),
    }
}

/// Decision 43, S2 backups: with `webIdentity` and no static key anywhere (no Secret of the
/// namespace holds one, no resource names one), a 2-shard × 2-replica cluster on 18.16 servers
/// is backed up to a real S3 server whose STS verifies the API server's own ServiceAccount tokens
/// (SeaweedFS, its OIDC provider fetching the API server's JWKS): the operator checks the bucket
/// with a token it requests for the ServiceAccount, each agent exchanges its projected token,
/// and the bucket holds the manifest. A ServiceAccount the role's trust policy does not name, a
/// token for another audience, and a ServiceAccount that does not opt in each end `Failed` with
/// reason `Credentials` and what to fix. The table is dropped and restored with every row on
/// every replica. No token and no temporary credential is in any status, Event, agent log or
/// termination message, or the operator's log.
#[tokio::test]
async fn a_backup_and_its_restore_run_on_web_identity_and_foreign_tokens_are_refused() {
    use k8s_openapi::api::core::v1::ServiceAccount;
    let client = client().await;
    allow_anonymous_oidc_discovery(&client).await;
    let ns = namespace(&client, "webid").await;
    let server = web_identity_s3(&ns);
    wait_weed_up(&server, &wi_bucket("probe"), WI_FILER_PORT, WI_BUCKET).await;
    // the bucket takes nothing unsigned: what the agents write, they wrote as the role
    let anonymous = reqwest::Client::new()
        .put(format!(
            "http://127.0.0.1:{WI_S3_PORT}/{WI_BUCKET}/anonymous"
        ))
        .body("x")
        .send()
        .await
        .unwrap()
        .status();
    assert_eq!(anonymous.as_u16(), 403, "an unsigned write is refused");
    let op = start_operator_env(&client, &ns, &[]).await;
    // a JWT (a ServiceAccount token, a SeaweedFS session token) starts with `eyJ`
    watch_for_secrets(&[WI_ADMIN.1, "eyJ"]);
    for (name, opted_in) in [
        ("ch-backups", true),
        ("intruder", true),
        ("unlabelled", false),
    ] {
        let labels = if opted_in {
            json!({"clickhouse.com/s3-credentials": "true"})
        } else {
            json!({})
        };
        let sa: ServiceAccount =
            serde_json::from_value(json!({"metadata": {"name": name, "labels": labels}})).unwrap();
        Api::<ServiceAccount>::namespaced(client.clone(), &ns)
            .create(&PostParams::default(), &sa)
            .await
            .unwrap();
    }
    let at = |sa: &str, audience: Option<&str>| {
        let mut w =
            json!({"roleArn": ROLE, "serviceAccountName": sa, "stsEndpoint": server.for_pods});
        if let Some(a) = audience {
            w["audience"] = json!(a);
        }
        json!({"endpoint": server.for_pods, "insecure": true, "bucket": WI_BUCKET, "webIdentity": w})
    };
    let refused = [
        ("intruder", at("intruder", None), "trust policy"),
        ("audience", at("ch-backups", Some("not-sts")), "audience"),
        (
            "unlabelled",
            at("unlabelled", None),
            "does not carry the label",
        ),
    ];
    create_cluster(
        &client,
        &ns,
        "c1",
        json!({"shards": 2, "replicas": 2, "keeper": {"replicas": 1}, "storage": {"size": "1Gi"},
               "backup": {"destination": at("ch-backups", None),
                          "allowedDestinations": refused.iter().map(|(_, d, _)| d.clone()).collect::<Vec<_>>()}}),
    )
    .await;
    let ready = wait_ready(&client, &ns, "c1", 1).await;
    let generated = operator_secrets(&client, &ns, "c1").await;
    watch_for_secrets(&generated.iter().map(String::as_str).collect::<Vec<_>>());
    let labelled: Vec<String> = Api::<Secret>::namespaced(client.clone(), &ns)
        .list(&ListParams::default().labels("clickhouse.com/s3-credentials=true"))
        .await
        .unwrap()
        .items
        .iter()
        .map(|s| s.name_any())
        .collect();
    assert!(labelled.is_empty(), "no static key anywhere: {labelled:?}");
    let map = ready.status.unwrap().replica_state_map;
    // the servers run under the ServiceAccount, its token projected by the node, no API token
    for replica in map.keys() {
        let pod = Api::<Pod>::namespaced(client.clone(), &ns)
            .get(&format!("{replica}-0"))
            .await
            .unwrap();
        let spec = pod.spec.unwrap();
        assert_eq!(spec.service_account_name.as_deref(), Some("ch-backups"));
        assert_eq!(spec.automount_service_account_token, Some(false));
        assert!(
            spec.volumes.unwrap_or_default().iter().any(|v| v
                .projected
                .as_ref()
                .and_then(|p| p.sources.as_ref())
                .is_some_and(|s| s.iter().any(|s| s.service_account_token.is_some()))),
            "{replica}: the projected token"
        );
    }
    let any = map.keys().next().unwrap().clone();
    let ch = sql_client(&client, &ns, "c1", &format!("{any}-0")).await;
    exec(&ch, "CREATE TABLE IF NOT EXISTS default.events ON CLUSTER c1 (batch UInt64, id UInt64) ENGINE = ReplicatedMergeTree('/clickhouse/tables/{shard}/default/events', '{replica}') PARTITION BY batch ORDER BY (batch, id)").await;
    exec(&ch, "CREATE TABLE IF NOT EXISTS default.events_all ON CLUSTER c1 AS default.events ENGINE = Distributed(c1, default, events, batch)").await;
    let sync = QueryOptions::new().setting("insert_distributed_sync", 1);
    for batch in 0..10 {
        ch.exec(&format!("INSERT INTO default.events_all SELECT {batch}, number FROM system.numbers LIMIT 10000"), &sync).await.unwrap();
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    let before = rows_per_replica(&client, &ns).await;
    println!("rows per replica: {before:?}");
    assert!(before.values().all(|n| *n > 0));

    start_backup(&client, &ns, "wi-full", json!({"clusterName": "c1"})).await;
    let full = wait_backup_done(&client, &ns, "wi-full").await;
    let st = full.status.clone().unwrap();
    assert_eq!(st.state, BackupState::Succeeded, "{:?}", st.message);
    println!("web identity backup: {} bytes uploaded", st.bytes_uploaded);
    assert!(st.bytes_uploaded > 0);
    let b = wi_bucket(&format!("{ns}/c1"));
    assert!(
        b.get(&manifest::manifest_key("wi-full"), u64::MAX)
            .await
            .unwrap()
            .is_some(),
        "the manifest is in the bucket"
    );

    for (name, destination, why) in &refused {
        let backup = format!("wi-{name}");
        start_backup(
            &client,
            &ns,
            &backup,
            json!({"clusterName": "c1", "destination": destination}),
        )
        .await;
        let st = wait_backup_done(&client, &ns, &backup)
            .await
            .status
            .unwrap();
        let message = st.message.clone().unwrap_or_default();
        println!("{backup}: {:?} {:?}: {message}", st.state, st.reason);
        assert_eq!(st.state, BackupState::Failed, "{message}");
        assert_eq!(st.reason.as_deref(), Some("Credentials"), "{message}");
        assert!(message.contains(why), "{message}");
        assert!(!message.contains("eyJ"), "{message}");
    }

    exec(&ch, "DROP TABLE default.events ON CLUSTER c1").await;
    start_restore(
        &client,
        &ns,
        "wi-restore",
        json!({"clusterName": "c1", "backupName": "wi-full"}),
    )
    .await;
    let r = wait_restore_done(&client, &ns, "wi-restore").await;
    let rs = r.status.unwrap();
    assert_eq!(rs.state, RestoreState::Succeeded, "{:?}", rs.message);
    println!(
        "web identity restore: {} bytes downloaded",
        rs.bytes_downloaded
    );
    let restored = wait_for(
        Duration::from_secs(120),
        "every replica to hold its rows again",
        || {
            let (client, ns, expected) = (client.clone(), ns.clone(), before.clone());
            async move {
                let now = rows_per_replica(&client, &ns).await;
                (now == expected).then_some(now)
            }
        },
    )
    .await;
    println!("rows per replica after the restore: {restored:?}");

    let mut secrets = clickhouse_operator::backup::sts::remembered();
    println!(
        "{} tokens and temporary credentials the operator held",
        secrets.len()
    );
    assert!(!secrets.is_empty(), "the operator exchanged tokens");
    secrets.extend(["eyJ".to_string(), WI_ADMIN.1.to_string()]);
    secrets.extend(generated);
    assert_no_secret_leaked(&client, &ns, &secrets, true).await;

    // an invalid webIdentity is said with its field, and nothing else of the cluster changes
    let mut invalid = refused
        .iter()
        .map(|(_, d, _)| d.clone())
        .collect::<Vec<_>>();
    invalid.push(json!({"endpoint": server.for_pods, "insecure": true, "bucket": WI_BUCKET,
        "secretName": "s3-creds",
        "webIdentity": {"roleArn": "arn:aws:iam::role/no-account", "serviceAccountName": "ch-backups"}}));
    patch_spec(
        &client,
        &ns,
        "c1",
        json!({"backup": {"allowedDestinations": invalid}}),
    )
    .await;
    let said = wait_status(
        &client,
        &ns,
        "c1",
        Duration::from_secs(60),
        "the invalid webIdentity said",
        |s| {
            s.message
                .as_deref()
                .is_some_and(|m| m.contains("allowedDestinations[3].webIdentity.roleArn"))
        },
    )
    .await;
    let message = said.status.unwrap().message.unwrap_or_default();
    println!("invalid webIdentity: {message}");
    assert!(
        message.contains("allowedDestinations[3].secretName") && message.contains("exclude"),
        "{message}"
    );
    finish(&client, &ns, op).await;
    let mut weed = server.child.lock().unwrap();
    let _ = weed.kill();
    let _ = weed.wait();
}
