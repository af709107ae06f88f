//! Credentials over passes: the exporter's account, the cluster secret and grants as the
//! servers' versions allow, a secret setting's missing key.

use super::*;

/// Decision 36: a cluster made before the exporter had an account of its own gets its
/// password added to `<cluster>-operator`, then the account in the users file, which the servers
/// reload: no StatefulSet changes, no pod restarts.
#[test]
fn an_older_cluster_gets_the_exporters_account_without_a_restart() {
    let mut sim =
        Sim::new(serde_json::json!({"shards": 1, "replicas": 2, "keeper": {"replicas": 1}}));
    sim.converge(30);
    assert_eq!(sim.state(), ClusterState::Ready);
    sim.obs.inputs.exporter_password = None;
    let pods_before: Vec<String> = sim.obs.pods.keys().cloned().collect();
    let p = sim.plan();
    assert!(
        p.steps.contains(&Step::AddExporterPassword),
        "{:?}",
        p.steps
    );
    sim.act(&p);
    assert!(sim.obs.inputs.exporter_password.is_some());
    let p = sim.plan_caught_up();
    assert!(
        statefulsets_applied(&p).is_empty(),
        "no restart: {:?}",
        p.steps
    );
    assert!(
        !p.steps.iter().any(|a| matches!(a, Step::RestartPod { .. })),
        "{:?}",
        p.steps
    );
    sim.converge(10);
    assert!(
        users_secret_file(&sim, crate::model::names::USERS_FILE)
            .contains(crate::model::names::EXPORTER_USER)
    );
    assert_eq!(
        sim.obs.pods.keys().cloned().collect::<Vec<_>>(),
        pods_before
    );
}

/// Decision 33: the cluster `<secret>` and the operator's grants are written only once every
/// server has reported a version that has them (the image tag says 24.8 throughout, as the
/// local kubelet's 18.16 pods do); the version is in the status; a server restarting keeps
/// them; an image whose tag names an older version takes them away in the pass that changes
/// the image, before any pod restarts on it.
#[test]
fn the_cluster_secret_and_grants_follow_the_versions_the_servers_report() {
    use crate::model::names::{REMOTE_SERVERS_FILE, USERS_FILE};
    let mut sim = Sim::new(serde_json::json!({"shards": 2, "replicas": 2,
        "image": "clickhouse/clickhouse-server:24.8"}));
    sim.obs.inputs.cluster_password = Some(model::Password("cluster-pw".into()));
    sim.obs.inputs.cluster_secret = Some(model::Password("the-cluster-secret".into()));
    // servers that do not answer the version: nothing version-dependent
    sim.converge(30);
    let remote = users_secret_file(&sim, REMOTE_SERVERS_FILE);
    assert!(!remote.contains("<secret") && remote.contains("<user>clickhouse_cluster</user>"));
    assert_eq!(sim.cluster.status.as_ref().unwrap().version, None);
    // 18.16 everywhere, whatever the tag says: still nothing
    sim.server_version = Some("18.16.1".into());
    sim.converge(10);
    let remote = users_secret_file(&sim, REMOTE_SERVERS_FILE);
    assert!(!remote.contains("<secret"), "{remote}");
    assert!(!users_secret_file(&sim, USERS_FILE).contains("<grants>"));
    assert_eq!(
        sim.cluster.status.as_ref().unwrap().version.as_deref(),
        Some("18.16.1.0")
    );
    // every server on 24.8: the secret replaces the account, the operator gets its grants
    sim.server_version = Some("24.8.4.13".into());
    let restarts_before = sim.log.iter().filter(|l| l.contains("restart")).count();
    sim.converge(10);
    let remote = users_secret_file(&sim, REMOTE_SERVERS_FILE);
    assert!(
        remote.contains("<secret hide_in_preprocessed=\"true\">the-cluster-secret</secret>"),
        "{remote}"
    );
    assert!(
        !remote.contains("<user>") && !remote.contains("<password"),
        "{remote}"
    );
    assert_eq!(remote.matches("<replica>").count(), 4);
    let users = users_secret_file(&sim, USERS_FILE);
    assert!(
        users.contains("<query>GRANT SELECT, INSERT, SHOW ON *.*</query>"),
        "{users}"
    );
    assert_eq!(
        sim.cluster.status.as_ref().unwrap().version.as_deref(),
        Some("24.8.4.13")
    );
    assert_eq!(
        sim.log.iter().filter(|l| l.contains("restart")).count(),
        restarts_before,
        "a runtime-reloaded file: no server restarts for it"
    );
    // a server not answering (restarting) keeps them
    sim.server_version = None;
    assert!(
        sim.plan_caught_up().steps.is_empty(),
        "nothing is rewritten while a version is unknown"
    );
    sim.server_version = Some("24.8.4.13".into());
    // an older image: gone in the pass that changes the image, before the first restart
    sim.cluster.spec.image = "clickhouse/clickhouse-server:20.3".into();
    sim.cluster.metadata.generation = Some(2);
    let p = sim.plan_caught_up();
    let secret_at = p
        .steps
        .iter()
        .position(
            |a| matches!(a, Step::Apply { kind: Kind::Secret, name, .. } if name == "c1-users"),
        )
        .expect("the users Secret is rewritten");
    assert!(
        p.steps[..secret_at].iter().all(|a| !matches!(
            a,
            Step::RestartPod { .. }
                | Step::Apply {
                    kind: Kind::StatefulSet,
                    ..
                }
        )),
        "{:?}",
        p.steps
    );
    sim.act(&p);
    let remote = users_secret_file(&sim, REMOTE_SERVERS_FILE);
    assert!(!remote.contains("<secret") && remote.contains("<user>clickhouse_cluster</user>"));
    assert!(!users_secret_file(&sim, USERS_FILE).contains("<grants>"));
}

/// Decision 36: where the operator publishes the exporter's credentials, a cluster whose
/// credentials are not (or no longer) the published ones gets them published, without holding
/// anything else up; once current, nothing is published again.
#[test]
fn the_exporters_credentials_are_published_until_current() {
    let mut sim =
        Sim::new(serde_json::json!({"shards": 1, "replicas": 2, "keeper": {"replicas": 1}}));
    sim.converge(30);
    assert_eq!(sim.state(), ClusterState::Ready);
    assert!(
        !sim.plan().steps.contains(&Step::PublishExporterCredentials),
        "none configured"
    );
    sim.obs.exporter_credentials_published = Some(false);
    let p = sim.plan();
    assert_eq!(p.steps, [Step::PublishExporterCredentials]);
    assert!(p.failure.is_none());
    sim.act(&p);
    let p = sim.plan_caught_up();
    assert!(p.steps.is_empty(), "{:?}", p.steps);
    assert_eq!(sim.state(), ClusterState::Ready);
}

/// Decision 34: a Secret key that `secretSettings` or `secretFiles` names and its Secret
/// does not have would keep the pods from starting: the pass says which, writes nothing, and
/// goes on once the key is there.
#[test]
fn a_missing_key_of_a_secret_setting_is_said_and_nothing_is_written() {
    let mut sim = Sim::new(
        serde_json::json!({"shards": 1, "replicas": 2, "keeper": {"replicas": 1},
        "configuration": {"secretSettings": {"timezone": {"name": "cfg", "key": "tz"}},
            "secretFiles": {"s3.xml": {"name": "cfg", "key": "s3"}}}}),
    );
    sim.obs.inputs.secrets.insert(
        "cfg".into(),
        BTreeMap::from([("tz".to_string(), b"UTC".to_vec())]),
    );
    let p = sim.plan();
    let f = p.failure.as_ref().expect("refused");
    assert_eq!(f.reason, crate::plan::FailureReason::MissingSecret);
    assert!(
        f.message.contains("Secret cfg")
            && f.message.contains("no key s3")
            && f.message.contains("spec.configuration.secretFiles"),
        "{}",
        f.message
    );
    assert!(p.steps.is_empty(), "nothing written: {:?}", p.steps);
    sim.obs
        .inputs
        .secrets
        .get_mut("cfg")
        .unwrap()
        .insert("s3".into(), b"<clickhouse/>".to_vec());
    sim.converge(30);
    assert_eq!(sim.state(), ClusterState::Ready);
}
