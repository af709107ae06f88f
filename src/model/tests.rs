//! Behaviour of the builders: what objects a spec gives, what changes a pod template and what
//! does not, and that no plain password leaks.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::PodTemplateSpec;
use serde_json::json;

use super::config::server::{REPLICA_FILE, RUNTIME_FILE, SERVER_FILE, SETTINGS_FILE};
use super::*;
use crate::api::ClickHouseCluster;

mod real_images;

const UID: &str = "6f1c9a52-0000-4000-8000-000000000001";

fn cluster(spec: serde_json::Value) -> ClickHouseCluster {
    let mut c = ClickHouseCluster::new("c1", serde_json::from_value(spec).unwrap());
    c.metadata.namespace = Some("t1".into());
    c.metadata.uid = Some(UID.into());
    c
}

/// Replicas of `shards` × `per_shard`, creation indexes in shard order.
fn replicas(shards: i32, per_shard: i64) -> Vec<ReplicaSpec> {
    (0..shards)
        .flat_map(|s| {
            (0..per_shard).map(move |i| ReplicaSpec::new("c1", s, i64::from(s) * per_shard + i))
        })
        .collect()
}

fn inputs(replicas: Vec<ReplicaSpec>) -> Inputs {
    Inputs {
        replicas,
        listed: None,
        secrets: BTreeMap::new(),
        user_passwords: BTreeMap::from([
            ("alice".to_string(), Password("alice-secret-pw".into())),
            ("bob".to_string(), Password("bob-secret-pw".into())),
        ]),
        operator_password: Password("operator-secret-pw".into()),
        interserver_password: Some(Password("interserver-secret-pw".into())),
        keeper_password: Some(Password("keeper-secret-pw".into())),
        operator_networks: vec!["10.244.0.0/16".into()],
        operator_pods: None,
        cluster_password: Some(Password("c1uster-pw".into())),
        cluster_secret: Some(Password("c1uster-secret".into())),
        server_version: None,
        exporter_password: Some(Password("exporter-secret-pw".into())),
        backup_collections: Vec::new(),
    }
}

fn build(c: &ClickHouseCluster, i: &Inputs) -> Desired {
    desired(&Cluster::new(c).unwrap(), i).unwrap()
}

fn templates(d: &Desired) -> Vec<PodTemplateSpec> {
    d.server_statefulsets
        .iter()
        .map(|s| s.spec.template.clone())
        .collect()
}

fn annotation<'a>(t: &'a PodTemplateSpec, key: &str) -> Option<&'a str> {
    t.metadata
        .as_ref()?
        .annotations
        .as_ref()?
        .get(key)
        .map(String::as_str)
}

fn common_file<'a>(d: &'a Desired, name: &str) -> &'a str {
    d.common_config.data.as_ref().unwrap()[name].as_str()
}

/// The `remote_servers` file, kept in the users Secret (it carries a password).
fn remote_file(d: &Desired) -> String {
    let data = d.users_secret.data.as_ref().unwrap();
    String::from_utf8(data[names::REMOTE_SERVERS_FILE].0.clone()).unwrap()
}

fn users_file(d: &Desired) -> String {
    let data = d.users_secret.data.as_ref().unwrap();
    String::from_utf8(data[names::USERS_FILE].0.clone()).unwrap()
}

fn parse(xml: &str) -> roxmltree::Document<'_> {
    roxmltree::Document::parse(xml).unwrap_or_else(|e| panic!("{e}:\n{xml}"))
}

/// S0-10 / S0-11: 3 shards × 2 replicas give 6 StatefulSets with distinct names that are
/// stable across builds, each with one pod.
#[test]
fn three_shards_by_two_replicas_give_six_statefulsets_with_distinct_stable_names() {
    let c = cluster(json!({"shards": 3, "replicas": 2}));
    let i = inputs(replicas(3, 2));
    let d = build(&c, &i);
    let names: Vec<_> = d
        .server_statefulsets
        .iter()
        .map(|s| s.metadata.name.clone().unwrap())
        .collect();
    assert_eq!(
        names,
        ["c1-0-0", "c1-0-1", "c1-1-2", "c1-1-3", "c1-2-4", "c1-2-5"]
    );
    for s in &d.server_statefulsets {
        assert_eq!(s.spec.replicas, Some(1));
        assert_eq!(s.spec.service_name.as_deref(), Some("c1-headless"));
    }
    let again = build(&c, &i);
    assert_eq!(again.server_statefulsets, d.server_statefulsets);
    assert_eq!(again.common_config, d.common_config);
    assert_eq!(d.replica_configs.len(), 6);
    assert_eq!(d.shard_pdbs.len(), 3);
}

/// remote_servers lists every replica of every shard, by DNS name, in shard order.
#[test]
fn remote_servers_lists_every_replica_of_every_shard() {
    let c = cluster(json!({"shards": 3, "replicas": 2}));
    let d = build(&c, &inputs(replicas(3, 2)));
    let xml = remote_file(&d);
    let doc = parse(&xml);
    let cluster = doc
        .descendants()
        .find(|n| n.has_tag_name("remote_servers"))
        .unwrap()
        .children()
        .find(|n| n.has_tag_name("c1"))
        .unwrap();
    let shards: Vec<Vec<String>> = cluster
        .children()
        .filter(|n| n.has_tag_name("shard"))
        .map(|s| {
            s.descendants()
                .filter(|n| n.has_tag_name("host"))
                .map(|h| h.text().unwrap().to_string())
                .collect()
        })
        .collect();
    assert_eq!(shards.len(), 3);
    for (s, hosts) in shards.iter().enumerate() {
        let want: Vec<_> = replicas(3, 2)
            .into_iter()
            .filter(|r| r.shard == s as i32)
            .map(|r| format!("{}-0.c1-headless.t1.svc.cluster.local", r.name))
            .collect();
        assert_eq!(hosts, &want);
    }
    // Servers reach each other as the cluster's own account, or as the operator's in a
    // cluster created before that account existed.
    assert!(xml.contains("<user>clickhouse_cluster</user>"), "{xml}");
    assert!(!xml.contains("clickhouse_operator"), "{xml}");
    let mut older = inputs(replicas(3, 2));
    older.cluster_password = None;
    let old = remote_file(&build(&c, &older));
    assert!(old.contains("<user>clickhouse_operator</user>"), "{old}");
    // Keeper nodes are listed in the runtime file.
    let runtime = parse(common_file(&d, RUNTIME_FILE));
    let nodes = runtime
        .descendants()
        .filter(|n| n.has_tag_name("node"))
        .count();
    assert_eq!(nodes, 3);
}

/// No ConfigMap, and no built object but Secrets, contains a plain password: the users file has
/// each user's SHA-256; the operator's password is in its own Secret and in the `remote_servers`
/// file of the users Secret (servers log in to each other with it), users' passwords nowhere.
#[test]
fn no_config_map_or_built_object_contains_a_plain_password() {
    let c = cluster(
        json!({"users": {"secretName": "users"}, "tls": {"enabled": true, "serverCertSecret": "tls"}}),
    );
    let i = inputs(replicas(2, 2));
    let d = build(&c, &i);
    let mut texts = vec![
        serde_json::to_string(&d.common_config).unwrap(),
        serde_json::to_string(&d.replica_configs).unwrap(),
        serde_json::to_string(&d.server_statefulsets).unwrap(),
        serde_json::to_string(&d.headless_service).unwrap(),
        serde_json::to_string(&d.client_service).unwrap(),
        serde_json::to_string(&d.shard_pdbs).unwrap(),
        serde_json::to_string(&d.keeper.as_ref().unwrap().config).unwrap(),
        serde_json::to_string(&d.keeper.as_ref().unwrap().statefulset).unwrap(),
        users_file(&d),
    ];
    texts.extend(d.common_config.data.clone().unwrap().into_values());
    for pw in [
        "alice-secret-pw",
        "bob-secret-pw",
        "operator-secret-pw",
        "interserver-secret-pw",
        "keeper-secret-pw",
        "c1uster-pw",
    ] {
        for t in &texts {
            assert!(!t.contains(pw), "{pw} leaked");
        }
    }
    let users = users_file(&d);
    let doc = parse(&users);
    for (user, pw) in [
        ("alice", "alice-secret-pw"),
        (names::OPERATOR_USER, "operator-secret-pw"),
    ] {
        let u = doc
            .descendants()
            .find(|n| n.has_tag_name(user))
            .unwrap_or_else(|| panic!("{user} missing"));
        let hash = u
            .children()
            .find(|n| n.has_tag_name("password_sha256_hex"))
            .unwrap();
        assert_eq!(
            hash.text(),
            Some(config::users::sha256_hex(&Password(pw.into())).as_str())
        );
        assert!(u.children().all(|n| !n.has_tag_name("password")));
    }
    let remote = remote_file(&d);
    assert!(remote.contains("<password hide_in_preprocessed=\"true\">c1uster-pw</password>"));
    assert!(
        !remote.contains("operator-secret-pw"),
        "not the operator's password: {remote}"
    );
    assert!(!remote.contains("alice-secret-pw") && !remote.contains("bob-secret-pw"));
    // The operator's own Secret keeps its password.
    let op = secret::operator_secret(
        &Cluster::new(&c).unwrap(),
        &secret::Generated {
            operator: i.operator_password.clone(),
            interserver: i.interserver_password.clone().unwrap(),
            keeper: i.keeper_password.clone().unwrap(),
            cluster: i.cluster_password.clone().unwrap(),
            cluster_secret: Password("cluster-secret-value".into()),
            exporter: i.exporter_password.clone().unwrap(),
        },
    );
    let data = op.data.unwrap();
    assert_eq!(data[names::OPERATOR_PASSWORD_KEY].0, b"operator-secret-pw");
    assert_eq!(
        data[names::INTERSERVER_PASSWORD_KEY].0,
        b"interserver-secret-pw"
    );
    assert_eq!(data[names::KEEPER_PASSWORD_KEY].0, b"keeper-secret-pw");
    assert_eq!(data[names::CLUSTER_SECRET_KEY].0, b"cluster-secret-value");
    assert!(!format!("{:?}", i.operator_password).contains("operator-secret-pw"));
}

/// Decision 41 (a roll restarts each server promptly): the default profile, the servers' global
/// settings, has `poll_interval` 1 s, so an idle connection to a stopping server (a peer's
/// Distributed pool, a client's pool) holds it for about a second, not ClickHouse's 10 s; the
/// user's own value and the user's other settings of that profile stay, other profiles get
/// nothing. The users file is reloaded at runtime: no pod template changes with it.
#[test]
fn the_default_profile_checks_for_shutdown_every_second_unless_the_user_says_otherwise() {
    let poll = |xml: &str, profile: &str| -> Option<String> {
        let doc = parse(xml);
        let profiles = doc
            .descendants()
            .find(|n| n.has_tag_name("profiles"))
            .expect("profiles");
        let p = profiles.children().find(|n| n.has_tag_name(profile))?;
        p.children()
            .find(|n| n.has_tag_name("poll_interval"))
            .and_then(|n| n.text())
            .map(str::to_string)
    };
    let plain = build(&cluster(json!({})), &inputs(replicas(1, 1)));
    assert_eq!(poll(&users_file(&plain), "default").as_deref(), Some("1"));
    let with_others = cluster(json!({"configuration": {"profiles": {
        "default": {"max_memory_usage": "1000"}, "ro": {"readonly": "1"}}}}));
    let d = build(&with_others, &inputs(replicas(1, 1)));
    let users = users_file(&d);
    assert_eq!(poll(&users, "default").as_deref(), Some("1"));
    assert!(
        users.contains("<max_memory_usage>1000</max_memory_usage>"),
        "{users}"
    );
    assert_eq!(poll(&users, "ro"), None, "{users}");
    let own = cluster(json!({"configuration": {"profiles": {"default": {"poll_interval": "10"}}}}));
    let own = build(&own, &inputs(replicas(1, 1)));
    let users = users_file(&own);
    assert_eq!(poll(&users, "default").as_deref(), Some("10"));
    assert_eq!(users.matches("<poll_interval>").count(), 1, "{users}");
    assert_eq!(
        templates(&own),
        templates(&plain),
        "poll_interval restarts no pod"
    );
}

/// S2-16 / S2-17: runtime-reloaded configuration (profiles, quotas, users, passwords,
/// reloadable settings, another replica, Keeper members) changes no server pod template.
#[test]
fn reloadable_changes_change_no_pod_template() {
    let base = json!({"shards": 2, "replicas": 2, "users": {"secretName": "users"},
        "configuration": {"profiles": {"default": {"max_memory_usage": "1000"}},
                          "quotas": {"default": {"duration": "3600", "queries": "10"}},
                          "settings": {"max_concurrent_queries": "100", "mark_cache_size": "1000"}}});
    let c0 = cluster(base.clone());
    let i0 = inputs(replicas(2, 2));
    let d0 = build(&c0, &i0);
    let mut variants: Vec<(&str, ClickHouseCluster, Inputs)> = Vec::new();
    let mut c = c0.clone();
    c.spec
        .configuration
        .profiles
        .get_mut("default")
        .unwrap()
        .insert("max_memory_usage".into(), "2000".into());
    variants.push(("profile setting", c, i0.clone()));
    let mut c = c0.clone();
    c.spec
        .configuration
        .quotas
        .get_mut("default")
        .unwrap()
        .insert("queries".into(), "20".into());
    variants.push(("quota", c, i0.clone()));
    let mut c = c0.clone();
    c.spec
        .configuration
        .settings
        .insert("max_concurrent_queries".into(), "300".into());
    variants.push(("reloadable setting", c, i0.clone()));
    let mut i = i0.clone();
    i.user_passwords
        .insert("alice".into(), Password("rotated".into()));
    i.user_passwords
        .insert("carol".into(), Password("new".into()));
    variants.push(("user password and a new user", c0.clone(), i));
    let mut i = i0.clone();
    i.operator_password = Password("rotated".into());
    variants.push(("operator password", c0.clone(), i));
    let mut c = c0.clone();
    c.spec.keeper.replicas = 5;
    variants.push(("keeper members", c, i0.clone()));
    for (what, c, i) in variants {
        let d = build(&c, &i);
        assert_eq!(
            templates(&d),
            templates(&d0),
            "{what} changed a pod template"
        );
        assert_eq!(
            d.keeper.as_ref().unwrap().statefulset.spec.template,
            d0.keeper.as_ref().unwrap().statefulset.spec.template,
            "{what} changed the Keeper pod template"
        );
        assert!(
            d.common_config != d0.common_config
                || d.users_secret != d0.users_secret
                || d.keeper.as_ref().unwrap().config != d0.keeper.as_ref().unwrap().config,
            "{what} changed no file at all"
        );
    }
}

/// S0-05: adding a replica changes neither the other replicas' StatefulSets nor their own
/// ConfigMaps; only the shared remote_servers (reloaded) changes.
#[test]
fn adding_a_replica_leaves_the_others_untouched() {
    let c = cluster(json!({"replicas": 2}));
    let before = build(&c, &inputs(replicas(1, 2)));
    let mut more = replicas(1, 2);
    more.push(ReplicaSpec::new("c1", 0, 2));
    let after = build(&c, &inputs(more));
    assert_eq!(
        after.server_statefulsets[..2],
        before.server_statefulsets[..]
    );
    assert_eq!(after.replica_configs[..2], before.replica_configs[..]);
    assert_ne!(remote_file(&after), remote_file(&before));
    assert_eq!(
        common_file(&after, RUNTIME_FILE),
        common_file(&before, RUNTIME_FILE)
    );
}

/// S2-15: changing the image changes every server pod template, and no Keeper template.
#[test]
fn changing_the_image_changes_every_server_pod_template() {
    let c0 = cluster(json!({"shards": 2, "replicas": 2}));
    let i = inputs(replicas(2, 2));
    let d0 = build(&c0, &i);
    let mut c = c0.clone();
    c.spec.image = "clickhouse/clickhouse-server:25.3".into();
    let d = build(&c, &i);
    for (a, b) in templates(&d0).iter().zip(templates(&d)) {
        assert_ne!(a, &b);
        assert_eq!(
            b.spec.as_ref().unwrap().containers[0].image.as_deref(),
            Some("clickhouse/clickhouse-server:25.3")
        );
    }
    assert_eq!(
        d.keeper.unwrap().statefulset.spec.template,
        d0.keeper.unwrap().statefulset.spec.template
    );
}

/// S2-16 / S0-20: a setting that needs a restart changes the config hash, equally on every
/// replica, and only the hash in the pod template.
#[test]
fn a_restart_setting_changes_the_config_hash_of_every_replica() {
    let c0 = cluster(json!({"shards": 2}));
    let i = inputs(replicas(2, 2));
    let d0 = build(&c0, &i);
    let hashes0: Vec<_> = templates(&d0)
        .iter()
        .map(|t| annotation(t, labels::CONFIG_HASH).unwrap().to_string())
        .collect();
    assert!(hashes0.iter().all(|h| h == &hashes0[0]), "replicas differ");
    let mut c = c0.clone();
    c.spec
        .configuration
        .settings
        .insert("mark_cache_size".into(), "1000".into());
    let d = build(&c, &i);
    assert!(common_file(&d, SETTINGS_FILE).contains("<mark_cache_size>1000</mark_cache_size>"));
    for (t0, t) in templates(&d0).iter().zip(templates(&d)) {
        assert_ne!(
            annotation(t0, labels::CONFIG_HASH),
            annotation(&t, labels::CONFIG_HASH)
        );
        let mut t = t.clone();
        t.metadata.as_mut().unwrap().annotations =
            t0.metadata.as_ref().unwrap().annotations.clone();
        assert_eq!(&t, t0, "more than the hash changed");
    }
    // A user file is content the operator cannot judge: it restarts too.
    let mut c = c0.clone();
    c.spec
        .configuration
        .files
        .insert("extra.xml".into(), "<clickhouse/>".into());
    assert_ne!(
        annotation(&templates(&build(&c, &i))[0], labels::CONFIG_HASH),
        Some(hashes0[0].as_str())
    );
}

/// S2-16: a change of a TLS, CA or env Secret's data changes that Secret's hash annotation;
/// an unrelated Secret changes nothing.
#[test]
fn a_tls_ca_or_env_secret_change_changes_its_hash() {
    let c = cluster(
        json!({"tls": {"enabled": true, "serverCertSecret": "tls", "caSecret": "ca"},
        "pod": {"envSecret": "env"}, "keeper": {"pod": {"envSecret": "kenv"}}}),
    );
    let secret = |v: &str| BTreeMap::from([("tls.crt".to_string(), v.as_bytes().to_vec())]);
    let mut i0 = inputs(replicas(1, 2));
    for name in ["tls", "ca", "env", "kenv", "unrelated"] {
        i0.secrets.insert(name.into(), secret("v1"));
    }
    let d0 = build(&c, &i0);
    let t0 = &templates(&d0)[0];
    for key in [
        labels::TLS_SECRET_HASH,
        labels::CA_SECRET_HASH,
        labels::ENV_SECRET_HASH,
    ] {
        assert!(annotation(t0, key).is_some(), "{key} missing");
    }
    for (name, key) in [
        ("tls", labels::TLS_SECRET_HASH),
        ("ca", labels::CA_SECRET_HASH),
        ("env", labels::ENV_SECRET_HASH),
    ] {
        let mut i = i0.clone();
        i.secrets.insert(name.into(), secret("v2"));
        let d = build(&c, &i);
        for (a, b) in templates(&d0).iter().zip(templates(&d)) {
            assert_ne!(annotation(a, key), annotation(&b, key), "{name}");
            assert_eq!(
                annotation(a, labels::CONFIG_HASH),
                annotation(&b, labels::CONFIG_HASH)
            );
        }
        assert_eq!(
            d.keeper.unwrap().statefulset,
            d0.keeper.clone().unwrap().statefulset
        );
    }
    let mut i = i0.clone();
    i.secrets.insert("kenv".into(), secret("v2"));
    let d = build(&c, &i);
    assert_eq!(templates(&d), templates(&d0));
    assert_ne!(
        d.keeper.unwrap().statefulset,
        d0.keeper.clone().unwrap().statefulset
    );
    let mut i = i0.clone();
    i.secrets.insert("unrelated".into(), secret("v2"));
    assert_eq!(templates(&build(&c, &i)), templates(&d0));
    // A Secret that is not there yet hashes apart from every content.
    let mut i = i0.clone();
    i.secrets.remove("tls");
    assert_ne!(
        annotation(&templates(&build(&c, &i))[0], labels::TLS_SECRET_HASH),
        annotation(t0, labels::TLS_SECRET_HASH)
    );
}

/// Every generated XML file parses, with and without TLS, settings, profiles and Keeper.
#[test]
fn every_generated_xml_parses() {
    for spec in [
        json!({}),
        json!({"replicas": 1, "keeper": {"replicas": 0}}),
        json!({"tls": {"enabled": true, "required": true, "serverCertSecret": "t", "caSecret": "ca"},
               "configuration": {"settings": {"logger/level": "debug", "a/b/c": "x & <y>"},
                                 "profiles": {"ro": {"readonly": "1"}},
                                 "quotas": {"q": {"duration": "60"}}},
               "users": {"secretName": "u", "profile": "ro"}}),
    ] {
        let c = cluster(spec);
        let d = build(&c, &inputs(replicas(2, 2)));
        for (name, xml) in d.common_config.data.as_ref().unwrap() {
            let doc = parse(xml);
            assert_eq!(doc.root_element().tag_name().name(), "clickhouse", "{name}");
        }
        for cm in &d.replica_configs {
            parse(&cm.data.as_ref().unwrap()[REPLICA_FILE]);
        }
        parse(&users_file(&d));
        if let Some(k) = &d.keeper {
            parse(&k.config.data.as_ref().unwrap()[names::KEEPER_CONFIG_FILE]);
        }
    }
}

/// The per-replica file has the macros and the replica's own DNS name as interserver host.
#[test]
fn replica_config_has_macros_and_interserver_host() {
    let c = cluster(json!({"shards": 2}));
    let d = build(&c, &inputs(replicas(2, 2)));
    let cm = &d.replica_configs[3];
    assert_eq!(cm.metadata.name.as_deref(), Some("c1-1-3"));
    let xml = &cm.data.as_ref().unwrap()[REPLICA_FILE];
    let doc = parse(xml);
    let text = |tag: &str| {
        doc.descendants()
            .find(|n| n.has_tag_name(tag))
            .and_then(|n| n.text())
            .unwrap()
            .to_string()
    };
    assert_eq!(text("cluster"), "c1");
    assert_eq!(text("shard"), "1");
    assert_eq!(text("replica"), "c1-1-3");
    assert_eq!(
        text("interserver_http_host"),
        "c1-1-3-0.c1-headless.t1.svc.cluster.local"
    );
}

/// S0-01: every object carries the standard labels and a controller owner reference to the
/// cluster.
#[test]
fn every_object_has_the_labels_and_an_owner_reference() {
    let c = cluster(json!({}));
    let d = build(&c, &inputs(replicas(1, 2)));
    let k = d.keeper.clone().unwrap();
    let metas = [
        vec![
            d.common_config.metadata.clone(),
            d.users_secret.metadata.clone(),
            d.headless_service.metadata.clone(),
            d.client_service.clone().unwrap().metadata,
            k.config.metadata,
            k.statefulset.metadata,
            k.headless_service.metadata,
            k.client_service.metadata,
            k.pdb.metadata,
            secret::operator_secret(
                &Cluster::new(&c).unwrap(),
                &secret::Generated {
                    operator: Password("x".into()),
                    interserver: Password("y".into()),
                    keeper: Password("z".into()),
                    cluster: Password("w".into()),
                    cluster_secret: Password("v".into()),
                    exporter: Password("u".into()),
                },
            )
            .metadata,
        ],
        d.replica_configs
            .iter()
            .map(|x| x.metadata.clone())
            .collect(),
        d.server_statefulsets
            .iter()
            .map(|x| x.metadata.clone())
            .collect(),
        d.shard_pdbs.iter().map(|x| x.metadata.clone()).collect(),
    ]
    .concat();
    for m in metas {
        let name = m.name.clone().unwrap();
        let l = m.labels.unwrap();
        for key in [
            labels::NAME,
            labels::INSTANCE,
            labels::MANAGED_BY,
            labels::COMPONENT,
        ] {
            assert!(l.contains_key(key), "{name} lacks {key}");
        }
        assert_eq!(l[labels::CLUSTER], "c1", "{name}");
        assert_eq!(m.namespace.as_deref(), Some("t1"));
        let owners = m.owner_references.unwrap();
        assert_eq!(owners.len(), 1);
        assert_eq!(owners[0].uid, UID);
        assert_eq!(owners[0].kind, "ClickHouseCluster");
        assert_eq!(owners[0].controller, Some(true));
    }
}

/// S0-22 / S0-23: server pods carry serving and spread labels; the client Service selects
/// serving, the spread constraint selects spread, the StatefulSet selector neither.
#[test]
fn serving_and_spread_labels_drive_the_client_service_and_the_spread_constraint() {
    let c = cluster(
        json!({"pod": {"topologySpreadKey": "topology.kubernetes.io/zone", "labels": {"team": "a"}}}),
    );
    let d = build(&c, &inputs(replicas(1, 2)));
    let sts = &d.server_statefulsets[0];
    let pod_labels = sts
        .spec
        .template
        .metadata
        .as_ref()
        .unwrap()
        .labels
        .clone()
        .unwrap();
    assert_eq!(pod_labels[labels::SERVING], "true");
    assert_eq!(pod_labels[labels::SPREAD], "true");
    assert_eq!(pod_labels[labels::SHARD], "0");
    assert_eq!(pod_labels[labels::REPLICA], "c1-0-0");
    assert_eq!(pod_labels["team"], "a");
    let selector = sts.spec.selector.match_labels.clone().unwrap();
    assert_eq!(
        selector.keys().collect::<Vec<_>>(),
        [labels::CLUSTER, labels::REPLICA]
    );
    let client = d.client_service.unwrap().spec.unwrap();
    assert_eq!(client.selector.unwrap()[labels::SERVING], "true");
    assert_eq!(client.type_.as_deref(), Some("ClusterIP"));
    let spread = &sts
        .spec
        .template
        .spec
        .as_ref()
        .unwrap()
        .topology_spread_constraints
        .as_ref()
        .unwrap()[0];
    assert_eq!(spread.max_skew, 1);
    assert_eq!(spread.when_unsatisfiable, "ScheduleAnyway");
    let sel = spread.label_selector.clone().unwrap().match_labels.unwrap();
    assert_eq!(sel[labels::SPREAD], "true");
    assert!(!sel.contains_key(labels::SERVING));
    let headless = d.headless_service.spec.unwrap();
    assert_eq!(headless.cluster_ip.as_deref(), Some("None"));
    assert_eq!(headless.publish_not_ready_addresses, Some(true));
    assert!(!headless.selector.unwrap().contains_key(labels::SERVING));
    let ports: Vec<_> = headless.ports.unwrap().iter().map(|p| p.port).collect();
    assert_eq!(ports, [8123, 9000, 9009]);
}

/// S0-10 / S2-21: pause sets every server and Keeper StatefulSet to 0 replicas.
#[test]
fn pause_scales_every_statefulset_to_zero() {
    let c = cluster(json!({"pause": true, "shards": 2}));
    let d = build(&c, &inputs(replicas(2, 2)));
    assert!(
        d.server_statefulsets
            .iter()
            .all(|s| s.spec.replicas == Some(0))
    );
    assert_eq!(d.keeper.unwrap().statefulset.spec.replicas, Some(0));
}

/// S2-26 / S2-33 / S2-34: SmartUpdate and OnDelete give OnDelete; RollingUpdate gives
/// RollingUpdate. Keeper is always `OnDelete`: the operator rolls its members (decision 31).
#[test]
fn update_strategy_maps_to_the_statefulset_strategy() {
    for (strategy, want) in [
        ("SmartUpdate", "OnDelete"),
        ("OnDelete", "OnDelete"),
        ("RollingUpdate", "RollingUpdate"),
    ] {
        let c = cluster(json!({"updateStrategy": strategy}));
        let d = build(&c, &inputs(replicas(1, 1)));
        let get = |s: &StatefulSet| s.spec.update_strategy.clone().unwrap().type_.unwrap();
        assert_eq!(get(&d.server_statefulsets[0]), want, "{strategy}");
        assert_eq!(get(&d.keeper.unwrap().statefulset), "OnDelete");
    }
}

/// S0-18: one budget per shard with the spec's maxUnavailable, selecting that shard's pods.
#[test]
fn each_shard_gets_a_pdb_with_the_specs_max_unavailable() {
    let c =
        cluster(json!({"shards": 2, "replicas": 5, "podDisruptionBudget": {"maxUnavailable": 2}}));
    let d = build(&c, &inputs(replicas(2, 5)));
    for (s, p) in d.shard_pdbs.iter().enumerate() {
        assert_eq!(
            p.metadata.name.as_deref(),
            Some(format!("c1-shard-{s}").as_str())
        );
        let spec = p.spec.clone().unwrap();
        assert_eq!(
            spec.max_unavailable,
            Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(2))
        );
        let sel = spec.selector.unwrap().match_labels.unwrap();
        assert_eq!(sel[labels::SHARD], s.to_string());
        assert_eq!(sel[labels::COMPONENT], "server");
    }
}

/// Keeper: one StatefulSet, raft ids ordinal + 1 with every member's DNS name, a budget that
/// keeps a majority (n=1 gives 0), the id computed from the hostname.
#[test]
fn keeper_lists_every_member_and_its_budget_keeps_quorum() {
    for (n, max) in [(1, 0), (3, 1), (5, 2), (7, 3)] {
        let c = cluster(json!({"keeper": {"replicas": n}}));
        let d = build(&c, &inputs(replicas(1, 2)));
        let k = d.keeper.unwrap();
        assert_eq!(k.statefulset.spec.replicas, Some(n));
        assert_eq!(
            k.statefulset.spec.pod_management_policy.as_deref(),
            Some("Parallel")
        );
        let pdb = k.pdb.spec.unwrap().max_unavailable.unwrap();
        assert_eq!(
            pdb,
            k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(max),
            "n={n}"
        );
        let xml = &k.config.data.as_ref().unwrap()[names::KEEPER_CONFIG_FILE];
        let doc = parse(xml);
        let servers: Vec<(String, String, String)> = doc
            .descendants()
            .filter(|x| x.has_tag_name("server"))
            .map(|s| {
                let t = |tag| {
                    s.children()
                        .find(|x| x.has_tag_name(tag))
                        .unwrap()
                        .text()
                        .unwrap()
                        .to_string()
                };
                (t("id"), t("hostname"), t("port"))
            })
            .collect();
        let want: Vec<_> = (0..n)
            .map(|i| {
                (
                    (i + 1).to_string(),
                    format!("c1-keeper-{i}.c1-keeper-headless.t1.svc.cluster.local"),
                    "9234".to_string(),
                )
            })
            .collect();
        assert_eq!(servers, want);
        let id = doc
            .descendants()
            .find(|x| x.has_tag_name("server_id"))
            .unwrap();
        assert_eq!(id.attribute("from_env"), Some("KEEPER_SERVER_ID"));
        let container = &k
            .statefulset
            .spec
            .template
            .spec
            .as_ref()
            .unwrap()
            .containers[0];
        assert_eq!(
            container.command.clone().unwrap(),
            [
                "/bin/bash",
                "-c",
                "h=${HOSTNAME%%.*}; export KEEPER_SERVER_ID=$(( ${h##*-} + 1 )); exec /entrypoint.sh"
            ]
        );
        // decision 42: the image's entrypoint creates its folders on the data volume
        let data_dir = container
            .env
            .iter()
            .flatten()
            .find(|e| e.name == "CLICKHOUSE_DATA_DIR")
            .and_then(|e| e.value.clone());
        assert_eq!(data_dir.as_deref(), Some(names::KEEPER_DATA_PATH));
        let mounts: Vec<_> = container
            .volume_mounts
            .clone()
            .unwrap()
            .into_iter()
            .map(|m| m.mount_path)
            .collect();
        assert!(mounts.contains(&"/etc/clickhouse-keeper".to_string()));
        assert!(mounts.contains(&"/var/lib/clickhouse-keeper".to_string()));
        let headless = k.headless_service.spec.unwrap();
        assert_eq!(headless.publish_not_ready_addresses, Some(true));
        assert_eq!(k.client_service.metadata.name.as_deref(), Some("c1-keeper"));
    }
    let c = cluster(json!({"replicas": 1, "keeper": {"replicas": 0}}));
    let d = build(&c, &inputs(replicas(1, 1)));
    assert!(d.keeper.is_none());
    assert!(!common_file(&d, RUNTIME_FILE).contains("<zookeeper"));
}

/// Pods run as non-root with a read-only root filesystem, seccomp RuntimeDefault, writable
/// volumes where ClickHouse writes, and /ping probes.
#[test]
fn server_pods_are_locked_down_and_probed_on_ping() {
    let c = cluster(json!({"storage": {"size": "20Gi", "storageClassName": "fast"}}));
    let d = build(&c, &inputs(replicas(1, 1)));
    let sts = &d.server_statefulsets[0];
    let pod = sts.spec.template.spec.clone().unwrap();
    let psc = pod.security_context.unwrap();
    assert_eq!(
        (psc.run_as_user, psc.fs_group, psc.run_as_non_root),
        (Some(101), Some(101), Some(true))
    );
    assert_eq!(psc.seccomp_profile.unwrap().type_, "RuntimeDefault");
    let main = &pod.containers[0];
    let csc = main.security_context.clone().unwrap();
    assert_eq!(csc.allow_privilege_escalation, Some(false));
    assert_eq!(csc.read_only_root_filesystem, Some(true));
    let mounts: BTreeMap<_, _> = main
        .volume_mounts
        .clone()
        .unwrap()
        .into_iter()
        .map(|m| (m.mount_path, m.name))
        .collect();
    for path in [
        "/var/lib/clickhouse",
        "/var/log/clickhouse-server",
        "/tmp",
        "/etc/clickhouse-server/config.d",
        "/etc/clickhouse-server/users.d",
    ] {
        assert!(mounts.contains_key(path), "{path}");
    }
    for probe in [
        main.readiness_probe.clone().unwrap(),
        main.liveness_probe.clone().unwrap(),
        main.startup_probe.clone().unwrap(),
    ] {
        let get = probe.http_get.unwrap();
        assert_eq!(get.path.as_deref(), Some("/ping"));
        assert_eq!(
            get.port,
            k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(8123)
        );
    }
    // A server loading many parts after a restart is not killed before `startupSeconds`
    // (default 120 s); one stuck at start-up is restarted then, not after a long delay.
    let startup = main.startup_probe.clone().unwrap();
    assert_eq!(
        startup.period_seconds.unwrap() * startup.failure_threshold.unwrap(),
        120
    );
    assert_eq!(
        main.liveness_probe.clone().unwrap().initial_delay_seconds,
        None
    );
    let vct = &sts.spec.volume_claim_templates.clone().unwrap()[0];
    assert_eq!(vct.metadata.name.as_deref(), Some("data"));
    let vspec = vct.spec.clone().unwrap();
    assert_eq!(vspec.storage_class_name.as_deref(), Some("fast"));
    assert_eq!(
        vspec.resources.unwrap().requests.unwrap()["storage"].0,
        "20Gi"
    );
    // config.d combines the common and the replica ConfigMaps; users.d the users Secret.
    let projected: Vec<String> = pod
        .volumes
        .unwrap()
        .into_iter()
        .filter_map(|v| v.projected)
        .flat_map(|p| p.sources.unwrap())
        .map(|s| {
            s.config_map
                .map(|c| c.name)
                .or(s.secret.map(|s| s.name))
                .unwrap()
        })
        .collect();
    // config.d: common, replica, remote_servers, interserver credentials and the Keeper
    // identity from the users Secret; users.d: users.
    assert_eq!(
        projected,
        [
            "c1-common",
            "c1-0-0",
            "c1-users",
            "c1-users",
            "c1-users",
            "c1-users"
        ]
    );
}

/// The PVC Kubernetes creates for a replica (`<claim template>-<sts>-<ordinal>`) is the one
/// [`names::data_pvc`] names, which scale-in labels and storage growth resizes.
#[test]
fn a_replicas_data_pvc_is_named_by_data_pvc() {
    let c = cluster(json!({"shards": 2}));
    let d = build(&c, &inputs(replicas(2, 2)));
    for sts in &d.server_statefulsets {
        let name = sts.metadata.name.clone().unwrap();
        let templates = sts.spec.volume_claim_templates.clone().unwrap();
        let claims: Vec<String> = templates
            .iter()
            .map(|t| format!("{}-{name}-0", t.metadata.name.clone().unwrap()))
            .collect();
        assert_eq!(claims, [names::data_pvc(&name)]);
    }
}

/// With TLS the secure ports are served and used between replicas; `required` drops the plain
/// ones and probes over HTTPS.
#[test]
fn tls_serves_secure_ports_and_required_drops_plain_ones() {
    let c = cluster(json!({"tls": {"enabled": true, "serverCertSecret": "tls"}}));
    let d = build(&c, &inputs(replicas(1, 1)));
    let ports: Vec<_> = d
        .client_service
        .clone()
        .unwrap()
        .spec
        .unwrap()
        .ports
        .unwrap()
        .iter()
        .map(|p| p.port)
        .collect();
    assert_eq!(ports, [8123, 9000, 8443, 9440]);
    let remote = remote_file(&d);
    assert!(remote.contains("<port>9440</port>") && remote.contains("<secure>1</secure>"));
    assert!(common_file(&d, SERVER_FILE).contains("/etc/clickhouse-server/tls/tls.crt"));
    let c = cluster(json!({"tls": {"enabled": true, "required": true, "serverCertSecret": "tls"}}));
    let d = build(&c, &inputs(replicas(1, 1)));
    let ports: Vec<_> = d
        .client_service
        .clone()
        .unwrap()
        .spec
        .unwrap()
        .ports
        .unwrap()
        .iter()
        .map(|p| p.port)
        .collect();
    assert_eq!(ports, [8443, 9440]);
    let probe = d.server_statefulsets[0]
        .spec
        .template
        .spec
        .clone()
        .unwrap()
        .containers[0]
        .readiness_probe
        .clone()
        .unwrap()
        .http_get
        .unwrap();
    assert_eq!(
        (probe.port.clone(), probe.scheme.as_deref()),
        (
            k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(8443),
            Some("HTTPS")
        )
    );
    let c = cluster(json!({"clientService": {"enabled": false}}));
    assert!(build(&c, &inputs(replicas(1, 1))).client_service.is_none());
}

/// User input that cannot become configuration is an error naming the field, never a panic.
#[test]
fn invalid_names_are_errors_not_panics() {
    let c = cluster(json!({"configuration": {"profiles": {"bad name": {"x": "1"}}}}));
    let err = desired(&Cluster::new(&c).unwrap(), &inputs(replicas(1, 1))).unwrap_err();
    assert!(
        err.to_string().contains("spec.configuration.profiles"),
        "{err}"
    );
    let c = cluster(json!({}));
    let mut i = inputs(replicas(1, 1));
    i.user_passwords
        .insert("1user".into(), Password("p".into()));
    let err = desired(&Cluster::new(&c).unwrap(), &i).unwrap_err();
    assert!(matches!(err, BuildError::InvalidName { .. }));
    assert!(!err.to_string().contains("\"p\""));
    let c =
        cluster(json!({"configuration": {"files": {"00-operator-server.xml": "<clickhouse/>"}}}));
    assert!(matches!(
        desired(&Cluster::new(&c).unwrap(), &inputs(replicas(1, 1))),
        Err(BuildError::ReservedFile(_))
    ));
    let mut c = cluster(json!({}));
    c.metadata.uid = None;
    assert_eq!(
        Cluster::new(&c).unwrap_err(),
        BuildError::MissingMetadata("uid")
    );
}

/// A Secret entry named like the operator's user cannot replace it.
#[test]
fn a_user_cannot_take_the_operator_user() {
    let c = cluster(json!({}));
    let mut i = inputs(replicas(1, 1));
    i.user_passwords
        .insert(names::OPERATOR_USER.into(), Password("hijack".into()));
    let d = build(&c, &i);
    let users = users_file(&d);
    assert_eq!(users.matches("<clickhouse_operator").count(), 1);
    assert!(users.contains(&config::users::sha256_hex(&Password(
        "operator-secret-pw".into()
    ))));
}

/// The image's passwordless `default` user is reachable only from the pod itself and the
/// cluster's own server pods, unless the users Secret gives it a password.
#[test]
fn the_passwordless_default_user_is_restricted_to_the_cluster() {
    let c = cluster(json!({}));
    let d = build(&c, &inputs(replicas(1, 2)));
    let users = users_file(&d);
    let doc = parse(&users);
    let default = doc
        .descendants()
        .find(|n| n.has_tag_name("default") && n.parent().is_some_and(|p| p.has_tag_name("users")))
        .unwrap();
    let networks = default
        .children()
        .find(|n| n.has_tag_name("networks"))
        .unwrap();
    assert_eq!(networks.attribute("replace"), Some("replace"));
    let entries: Vec<_> = networks
        .children()
        .filter(|n| n.is_element())
        .map(|n| {
            (
                n.tag_name().name().to_string(),
                n.text().unwrap().to_string(),
            )
        })
        .collect();
    assert!(entries.contains(&("ip".into(), "127.0.0.1".into())));
    assert!(!entries.iter().any(|(_, v)| v == "::/0"));
    let hosts: Vec<&str> = entries
        .iter()
        .filter(|(k, _)| k == "host")
        .map(|(_, v)| v.as_str())
        .collect();
    assert_eq!(
        hosts,
        [
            "c1-0-0-0.c1-headless.t1.svc.cluster.local",
            "c1-0-1-0.c1-headless.t1.svc.cluster.local"
        ]
    );
    // With a password from the users Secret, `default` is the user's, reached from the same
    // networks as the others (by default the operator's), not only from the servers.
    let mut i = inputs(replicas(1, 2));
    i.user_passwords
        .insert("default".into(), Password("pw".into()));
    let users = users_file(&build(&c, &i));
    let list = &users[users.find("<users>").expect("users")..];
    assert_eq!(list.matches("<default").count(), 1, "{users}");
    assert!(users.contains("<default replace=\"replace\">"), "{users}");
    assert_eq!(
        user_networks(&users, "default"),
        ["ip ::1", "ip 127.0.0.1", "ip ::ffff:10.244.0.0/112"]
    );
}

/// The `networks` entries of `user` in a users file, as "kind value".
fn user_networks(users: &str, user: &str) -> Vec<String> {
    let doc = parse(users);
    let u = doc
        .descendants()
        .find(|n| n.has_tag_name("users"))
        .and_then(|l| l.children().find(|n| n.has_tag_name(user)))
        .unwrap_or_else(|| panic!("{user} missing: {users}"));
    u.children()
        .find(|n| n.has_tag_name("networks"))
        .unwrap()
        .children()
        .filter(|n| n.is_element())
        .map(|n| format!("{} {}", n.tag_name().name(), n.text().unwrap_or_default()))
        .collect()
}

/// Decision 36: the metrics exporter logs in as an account of its own, never the
/// operator's: from the operator's networks, with a read-only profile; where the servers have
/// SQL privileges for users of the users file, it reads the `system` tables and sees the other
/// tables' metadata (`SHOW`) but not their rows; a user of `spec.users` of that name does not
/// replace it. Older servers hide the other databases' parts and replicas from an account
/// limited to `system`, so there it keeps every database, read-only.
#[test]
fn the_exporter_logs_in_read_only_as_its_own_account() {
    let c = cluster(json!({"users": {"secretName": "users"}}));
    let mut i = inputs(replicas(1, 2));
    i.user_passwords
        .insert(names::EXPORTER_USER.into(), Password("hijack".into()));
    let users = users_file(&build(&c, &i));
    let doc = parse(&users);
    let exporter: Vec<_> = doc
        .descendants()
        .filter(|n| {
            n.has_tag_name(names::EXPORTER_USER)
                && n.parent().is_some_and(|p| p.has_tag_name("users"))
        })
        .collect();
    assert_eq!(exporter.len(), 1, "{users}");
    let child = |n: &roxmltree::Node, tag: &str| {
        n.children()
            .find(|c| c.has_tag_name(tag))
            .map(|c| c.text().unwrap_or_default().to_string())
    };
    assert_eq!(
        child(&exporter[0], "profile").as_deref(),
        Some(names::EXPORTER_PROFILE)
    );
    assert!(
        !users.contains("hijack"),
        "spec.users cannot take the exporter's account over"
    );
    assert!(
        !exporter[0]
            .children()
            .any(|c| c.has_tag_name("allow_databases")),
        "18.16 would hide the parts and replicas of other databases"
    );
    assert_eq!(
        user_networks(&users, names::EXPORTER_USER),
        ["ip ::1", "ip 127.0.0.1", "ip ::ffff:10.244.0.0/112"]
    );
    let profile = doc
        .descendants()
        .find(|n| {
            n.has_tag_name(names::EXPORTER_PROFILE)
                && n.parent().is_some_and(|p| p.has_tag_name("profiles"))
        })
        .unwrap();
    assert_eq!(child(&profile, "readonly").as_deref(), Some("2"));
    assert!(
        !users.contains("GRANT"),
        "18.16: no grants in the users file"
    );
    let mut modern = i.clone();
    modern.server_version = Some("24.8".parse().unwrap());
    let users = users_file(&build(&c, &modern));
    let doc = parse(&users);
    let exporter = doc
        .descendants()
        .find(|n| {
            n.has_tag_name(names::EXPORTER_USER)
                && n.parent().is_some_and(|p| p.has_tag_name("users"))
        })
        .unwrap();
    let grants: Vec<String> = exporter
        .descendants()
        .filter(|n| n.has_tag_name("query"))
        .map(|n| n.text().unwrap_or_default().to_string())
        .collect();
    assert_eq!(
        grants,
        [
            "GRANT SELECT ON system.*",
            "GRANT SHOW DATABASES, SHOW TABLES ON *.*"
        ]
    );
    assert!(
        !exporter
            .children()
            .any(|c| c.has_tag_name("allow_databases")),
        "`<grants>` excludes every other access setting"
    );
    let mut none = i.clone();
    none.exporter_password = None;
    assert!(!users_file(&build(&c, &none)).contains(names::EXPORTER_USER));
}

/// Decision 27: no generated account accepts any address. The operator's account accepts the
/// operator's networks and the pod itself; the cluster's own account (as which Distributed
/// queries and `ON CLUSTER` reach the other shards) only the cluster's server pods by name (in
/// a cluster from before that account, the operator's accepts them); the users of the Secret accept
/// `users.networks` (by default the operator's networks), each account's own networks,
/// profile, quota and databases where `users.accounts` names it; the networks the operator
/// wrote are on the users Secret for `plan`.
#[test]
fn accounts_accept_only_their_networks_and_get_their_profile_quota_and_databases() {
    // (the exporter's account is checked by the test below)
    let c = cluster(json!({
        "users": {"secretName": "users", "networks": ["10.1.0.0/16"], "accounts": {
            "bob": {"networks": ["198.18.0.1/32"], "profile": "readonly", "quota": "q1",
                    "databases": ["sales", "ops"]}}},
        "configuration": {"quotas": {"q1": {"duration": "3600", "queries": "10"}}}}));
    let mut i = inputs(replicas(1, 2));
    i.operator_networks = vec!["10.244.0.0/16".into(), "fd00::/64".into()];
    let d = build(&c, &i);
    let users = users_file(&d);
    let servers = [
        "host c1-0-0-0.c1-headless.t1.svc.cluster.local",
        "host c1-0-1-0.c1-headless.t1.svc.cluster.local",
    ];
    assert_eq!(
        user_networks(&users, names::OPERATOR_USER),
        [
            "ip ::1",
            "ip 127.0.0.1",
            "ip ::ffff:10.244.0.0/112",
            "ip fd00::/64",
        ]
    );
    // the servers reach each other as the cluster's account, accepted from them only
    assert_eq!(
        user_networks(&users, names::CLUSTER_USER),
        ["ip ::1", "ip 127.0.0.1", servers[0], servers[1]]
    );
    // a cluster created before that account existed: the operator's, from the servers too
    let mut older = i.clone();
    older.cluster_password = None;
    let old = users_file(&build(&c, &older));
    assert_eq!(
        user_networks(&old, names::OPERATOR_USER),
        [
            "ip ::1",
            "ip 127.0.0.1",
            "ip ::ffff:10.244.0.0/112",
            "ip fd00::/64",
            servers[0],
            servers[1],
        ]
    );
    assert!(!old.contains(names::CLUSTER_USER), "{old}");
    assert_eq!(
        user_networks(&users, "alice"),
        ["ip ::1", "ip 127.0.0.1", "ip ::ffff:10.1.0.0/112"]
    );
    assert_eq!(
        user_networks(&users, "bob"),
        ["ip ::1", "ip 127.0.0.1", "ip 198.18.0.1"]
    );
    assert!(!users.contains("::/0"), "{users}");
    let doc = parse(&users);
    let bob = doc.descendants().find(|n| n.has_tag_name("bob")).unwrap();
    let leaf = |n: roxmltree::Node, tag: &str| {
        n.children()
            .find(|c| c.has_tag_name(tag))
            .and_then(|c| c.text())
            .map(str::to_string)
    };
    assert_eq!(leaf(bob, "profile").as_deref(), Some("readonly"));
    assert_eq!(leaf(bob, "quota").as_deref(), Some("q1"));
    let dbs: Vec<&str> = bob
        .children()
        .find(|n| n.has_tag_name("allow_databases"))
        .unwrap()
        .children()
        .filter(|n| n.has_tag_name("database"))
        .filter_map(|n| n.text())
        .collect();
    assert_eq!(dbs, ["sales", "ops"]);
    let alice = doc.descendants().find(|n| n.has_tag_name("alice")).unwrap();
    assert_eq!(leaf(alice, "quota").as_deref(), Some("default"));
    assert!(!alice.children().any(|n| n.has_tag_name("allow_databases")));
    // without users.networks the Secret's users get the operator's networks
    let plain = cluster(json!({"users": {"secretName": "users"}}));
    let users = users_file(&build(&plain, &i));
    assert_eq!(
        user_networks(&users, "alice"),
        [
            "ip ::1",
            "ip 127.0.0.1",
            "ip ::ffff:10.244.0.0/112",
            "ip fd00::/64"
        ]
    );
    // the running operator's networks, for `plan`
    assert_eq!(
        d.users_secret.metadata.annotations.as_ref().unwrap()[labels::OPERATOR_NETWORKS],
        "10.244.0.0/16,fd00::/64"
    );
}

/// The classification and the builders agree: a server (Keeper) pod template changes exactly
/// when `changes::classify` says the change restarts server (Keeper) pods.
#[test]
fn classification_agrees_with_the_pod_templates() {
    use changes::{Need, classify};
    let base = json!({"shards": 2, "replicas": 2, "users": {"secretName": "u"},
        "tls": {"enabled": false, "serverCertSecret": "tls"},
        "configuration": {"settings": {"max_concurrent_queries": "1", "mark_cache_size": "1"},
                          "profiles": {"p": {"readonly": "1"}}}});
    let edits: Vec<serde_json::Value> = vec![
        json!({"replicas": 3}),
        json!({"shards": 3}),
        json!({"keeper": {"replicas": 5}}),
        json!({"image": "other"}),
        json!({"pod": {"resources": {"limits": {"cpu": "1"}}}}),
        json!({"pod": {"env": [{"name": "A", "value": "1"}]}}),
        json!({"pod": {"sidecars": [{"name": "s", "image": "s"}]}}),
        json!({"pod": {"annotations": {"a": "b"}}}),
        json!({"keeper": {"image": "other"}}),
        json!({"keeper": {"pod": {"nodeSelector": {"a": "b"}}}}),
        json!({"configuration": {"settings": {"max_concurrent_queries": "2", "mark_cache_size": "1"}, "profiles": {"p": {"readonly": "1"}}}}),
        json!({"configuration": {"settings": {"max_concurrent_queries": "1", "mark_cache_size": "2"}, "profiles": {"p": {"readonly": "1"}}}}),
        json!({"configuration": {"settings": {"max_concurrent_queries": "1", "mark_cache_size": "1"}, "profiles": {"p": {"readonly": "0"}}}}),
        json!({"users": {"secretName": "u", "profile": "p"}}),
        json!({"tls": {"enabled": true, "serverCertSecret": "tls"}}),
        json!({"storage": {"size": "20Gi"}, "storageScaling": {"enableVolumeScaling": true}}),
        json!({"pause": true}),
        json!({"updateStrategy": "RollingUpdate"}),
        json!({"podDisruptionBudget": {"maxUnavailable": 2}}),
        json!({"clientService": {"type": "NodePort"}}),
    ];
    let i = inputs(replicas(2, 2));
    let old = cluster(base.clone());
    let d0 = build(&old, &i);
    for edit in edits {
        let mut merged = base.clone();
        for (k, v) in edit.as_object().unwrap() {
            merged[k] = v.clone();
        }
        let new = cluster(merged);
        let d = build(&new, &i);
        let ch = classify(&old.spec, &new.spec);
        let restarts = |c: &changes::ComponentChanges| {
            c.needs(Need::RollingRestart) || c.needs(Need::FullStopStart)
        };
        assert_eq!(
            templates(&d) != templates(&d0),
            restarts(&ch.server),
            "server, edit {edit}: {ch:?}"
        );
        assert_eq!(
            d.keeper.as_ref().unwrap().statefulset.spec.template
                != d0.keeper.as_ref().unwrap().statefulset.spec.template,
            restarts(&ch.keeper),
            "keeper, edit {edit}: {ch:?}"
        );
    }
}

proptest::proptest! {
    /// S0-11 / remote_servers: for any set of replicas, every replica has its own StatefulSet
    /// and ConfigMap of the same name, appears exactly once in remote_servers under its shard,
    /// and every shard that has a replica has a budget.
    #[test]
    fn any_replica_set_is_built_consistently(
        picks in proptest::collection::btree_map(0i64..500, 0i32..5, 1..20)
    ) {
        let reps: Vec<ReplicaSpec> =
            picks.iter().map(|(i, s)| ReplicaSpec::new("c1", *s, *i)).collect();
        let c = cluster(json!({"shards": 2}));
        let d = build(&c, &inputs(reps.clone()));
        let remote = remote_file(&d);
        let doc = parse(&remote);
        for (r, (sts, cm)) in reps.iter().zip(d.server_statefulsets.iter().zip(&d.replica_configs)) {
            proptest::prop_assert_eq!(sts.metadata.name.as_ref(), Some(&r.name));
            proptest::prop_assert_eq!(cm.metadata.name.as_ref(), Some(&r.name));
            let host = names::replica_host("c1", "t1", names::DEFAULT_CLUSTER_DOMAIN, &r.name);
            let hits: Vec<_> = doc
                .descendants()
                .filter(|n| n.has_tag_name("host") && n.text() == Some(host.as_str()))
                .collect();
            proptest::prop_assert_eq!(hits.len(), 1);
            // Its shard element holds the replicas of that shard only.
            let shard = hits[0].parent().unwrap().parent().unwrap();
            let shard_hosts: std::collections::BTreeSet<String> = shard
                .descendants()
                .filter(|n| n.has_tag_name("host"))
                .map(|n| n.text().unwrap().to_string())
                .collect();
            let want: std::collections::BTreeSet<String> = reps
                .iter()
                .filter(|o| o.shard == r.shard)
                .map(|o| names::replica_host("c1", "t1", names::DEFAULT_CLUSTER_DOMAIN, &o.name))
                .collect();
            proptest::prop_assert_eq!(shard_hosts, want);
            let pdb = names::shard_pdb("c1", r.shard);
            proptest::prop_assert!(d.shard_pdbs.iter().any(|p| p.metadata.name.as_ref() == Some(&pdb)));
        }
        let distinct: std::collections::BTreeSet<_> =
            d.server_statefulsets.iter().map(|s| s.metadata.name.clone()).collect();
        proptest::prop_assert_eq!(distinct.len(), reps.len());
    }
}

/// docs/monitoring.md, "The servers' own endpoint": the servers' own Prometheus endpoint is off by
/// default (nothing generated, so no existing pod template changes); on, the server file has the
/// `prometheus` section on its port and every server container declares that port as `prometheus`,
/// and the change restarts.
#[test]
fn the_servers_own_prometheus_endpoint_is_generated_only_when_asked() {
    let off = cluster(serde_json::json!({"shards": 1, "replicas": 2}));
    let on = cluster(
        serde_json::json!({"shards": 1, "replicas": 2, "serverMetrics": {"enabled": true}}),
    );
    let i = inputs(replicas(1, 2));
    let (d_off, d_on) = (build(&off, &i), build(&on, &i));
    assert!(!common_file(&d_off, SERVER_FILE).contains("<prometheus>"));
    let doc = parse(common_file(&d_on, SERVER_FILE));
    let p = doc
        .descendants()
        .find(|n| n.has_tag_name("prometheus"))
        .expect("a prometheus section");
    let leaf = |name: &str| {
        p.children()
            .find(|n| n.has_tag_name(name))
            .and_then(|n| n.text())
            .map(str::to_string)
    };
    assert_eq!(leaf("port").as_deref(), Some("9363"));
    assert_eq!(leaf("endpoint").as_deref(), Some("/metrics"));
    for t in templates(&d_on) {
        let ports = t.spec.as_ref().unwrap().containers[0]
            .ports
            .clone()
            .unwrap();
        assert!(
            ports
                .iter()
                .any(|p| p.name.as_deref() == Some("prometheus") && p.container_port == 9363),
            "{ports:?}"
        );
    }
    for t in templates(&d_off) {
        let ports = t.spec.as_ref().unwrap().containers[0]
            .ports
            .clone()
            .unwrap();
        assert!(
            ports
                .iter()
                .all(|p| p.name.as_deref() != Some("prometheus"))
        );
    }
    let ch = crate::model::changes::classify(&off.spec, &on.spec);
    assert!(ch.server.needs(crate::model::changes::Need::RollingRestart));
}

/// Decision 27: replication between the servers is authenticated. With a replication password
/// (every cluster created by this version), `<cluster>-users` holds an
/// `interserver_http_credentials` file with it, every server pod projects that file into
/// `config.d/` and carries its hash, so a new password restarts the servers; the password is in
/// no ConfigMap or pod template. A cluster created before (no password in its operator Secret)
/// keeps its pod templates exactly (invariant 9: an operator upgrade restarts no pod) until the
/// password is added.
#[test]
fn replication_is_authenticated_with_a_generated_password() {
    let c = cluster(json!({"shards": 2, "replicas": 2}));
    let with = inputs(replicas(2, 2));
    let d = build(&c, &with);
    let file = String::from_utf8(
        d.users_secret.data.as_ref().unwrap()[names::INTERSERVER_FILE]
            .0
            .clone(),
    )
    .unwrap();
    let doc = parse(&file);
    let creds = doc
        .descendants()
        .find(|n| n.has_tag_name("interserver_http_credentials"))
        .expect("interserver_http_credentials");
    let leaf = |name: &str| {
        creds
            .children()
            .find(|n| n.has_tag_name(name))
            .and_then(|n| n.text())
    };
    assert_eq!(leaf("user"), Some(names::INTERSERVER_USER));
    assert_eq!(leaf("password"), Some("interserver-secret-pw"));
    for t in templates(&d) {
        assert!(annotation(&t, labels::INTERSERVER_HASH).is_some());
        let text = serde_json::to_string(&t).unwrap();
        assert!(text.contains(names::INTERSERVER_FILE), "projected: {text}");
        assert!(!text.contains("interserver-secret-pw"));
    }
    assert!(
        !serde_json::to_string(&d.common_config)
            .unwrap()
            .contains("interserver-secret-pw")
    );
    // a new password restarts every server
    let mut rotated = inputs(replicas(2, 2));
    rotated.interserver_password = Some(Password("another-pw".into()));
    let r = build(&c, &rotated);
    for (a, b) in templates(&d).iter().zip(templates(&r).iter()) {
        assert_ne!(
            annotation(a, labels::INTERSERVER_HASH),
            annotation(b, labels::INTERSERVER_HASH)
        );
    }
    // a cluster from before: no file, no projection, no hash
    let mut before = inputs(replicas(2, 2));
    before.interserver_password = None;
    let b = build(&c, &before);
    assert!(
        !b.users_secret
            .data
            .as_ref()
            .unwrap()
            .contains_key(names::INTERSERVER_FILE)
    );
    for t in templates(&b) {
        assert!(annotation(&t, labels::INTERSERVER_HASH).is_none());
        assert!(
            !serde_json::to_string(&t)
                .unwrap()
                .contains(names::INTERSERVER_FILE)
        );
    }
}

/// A StatefulSet written as `older` still rolls for a change of the cluster's own (a new image
/// over `desired`), and the changed one does not roll again for itself.
fn assert_a_real_change_rolls(older: &serde_json::Value, desired: &serde_json::Value) {
    use crate::model::changes::pod_template_changed;
    let mut other = desired.clone();
    other["spec"]["template"]["spec"]["containers"][0]["image"] = json!("clickhouse:99");
    other["metadata"]["annotations"][labels::TEMPLATE_HASH] =
        serde_json::Value::String(template_hash(&other["spec"]["template"]));
    assert!(pod_template_changed(older, &other));
    assert!(!pod_template_changed(&other, &other));
}

/// Decisions 28, 32, 34 and 42, and invariant 9: ClickHouse and Keeper pods mount no ServiceAccount
/// token, keep a shard's replicas (the Keeper members) apart and mount their credentials 0440,
/// Keeper's entrypoint is told its data directory and its command survives `setHostnameAsFQDN`; a
/// StatefulSet written by an operator version that did not say so (its template lacks all of it,
/// the API server's default 0644 on its volumes, its template hash taken without them) is not
/// rolled for them, while a real change still is.
#[test]
fn pods_mount_no_token_and_an_older_template_without_the_field_is_not_rolled_for_it() {
    use crate::model::changes::pod_template_changed;
    let c = cluster(json!({"shards": 1, "replicas": 2, "keeper": {"replicas": 3}}));
    let d = build(&c, &inputs(replicas(1, 2)));
    let keeper = d.keeper.as_ref().unwrap().statefulset.clone();
    let mut all: Vec<StatefulSet> = d.server_statefulsets.clone();
    all.push(keeper);
    for sts in &all {
        let spec = sts.spec.template.spec.as_ref().unwrap();
        assert_eq!(spec.automount_service_account_token, Some(false));
        let desired = serde_json::to_value(sts).unwrap();
        // as a previous version wrote it: no such field, no default anti-affinity (decision 28),
        // hash over what it had
        let mut older = desired.clone();
        let older_spec = older["spec"]["template"]["spec"].as_object_mut().unwrap();
        older_spec.remove("automountServiceAccountToken");
        assert!(
            older_spec.remove("affinity").is_some(),
            "the default anti-affinity is in the template"
        );
        // nor a mode on the volumes of credentials (decision 34): the hash was taken without
        // it, and the API server wrote its default 0644
        let mut modes = 0;
        for v in older["spec"]["template"]["spec"]["volumes"]
            .as_array_mut()
            .unwrap()
        {
            for kind in ["secret", "projected"] {
                if let Some(m) = v.get_mut(kind).and_then(|s| s.as_object_mut())
                    && m.remove("defaultMode").is_some()
                {
                    modes += 1;
                }
            }
        }
        assert!(modes > 0 || sts.metadata.name.as_deref().unwrap().contains("keeper"));
        // nor the main container's log-on-error termination message (decision 30): the API server
        // wrote its default `File`
        let main = &mut older["spec"]["template"]["spec"]["containers"][0];
        assert_eq!(
            main.as_object_mut()
                .unwrap()
                .remove("terminationMessagePolicy"),
            Some(json!(crate::model::LOG_ON_ERROR)),
            "the main container ends with its log's tail"
        );
        // nor Keeper's data directory variable and host-name-safe command (decision 42)
        if main["name"] == crate::model::keeper::KEEPER_CONTAINER {
            let m = main.as_object_mut().unwrap();
            m.insert(
                "command".into(),
                json!([
                    "/bin/bash",
                    "-c",
                    "export KEEPER_SERVER_ID=$(( ${HOSTNAME##*-} + 1 )); exec /entrypoint.sh"
                ]),
            );
            let env = m["env"].as_array_mut().unwrap();
            env.retain(|e| e["name"] != "CLICKHOUSE_DATA_DIR");
            assert!(env.is_empty(), "no other variable: {env:?}");
            m.remove("env");
        }
        older["metadata"]["annotations"][labels::TEMPLATE_HASH] =
            serde_json::Value::String(hash::json_hash(&older["spec"]["template"]));
        older["spec"]["template"]["spec"]["containers"][0]["terminationMessagePolicy"] =
            json!("File");
        for v in older["spec"]["template"]["spec"]["volumes"]
            .as_array_mut()
            .unwrap()
        {
            for kind in ["secret", "projected"] {
                if let Some(m) = v.get_mut(kind).and_then(|s| s.as_object_mut()) {
                    m.insert("defaultMode".into(), json!(0o644));
                }
            }
        }
        assert!(
            !pod_template_changed(&older, &desired),
            "{} would restart on an operator upgrade",
            sts.metadata.name.as_deref().unwrap()
        );
        assert_a_real_change_rolls(&older, &desired);
    }
}

/// Decision 27: ClickHouse authenticates to Keeper. With a Keeper password (every cluster created
/// by this version) `<cluster>-users` holds a file that merges `zookeeper/identity`
/// (`clickhouse:<password>`, escaped) into the runtime file's `zookeeper` section: it sorts after
/// that file and does not replace the section. Every server pod projects it into `config.d/`;
/// the password is in no ConfigMap or pod template. Without Keeper the file is empty; a cluster
/// created before (no password) has no such file and keeps its pod templates.
#[test]
fn servers_authenticate_to_keeper_with_a_generated_identity() {
    use crate::model::config::server::{RUNTIME_FILE, keeper_identity_of, keeper_identity_text};
    let c = cluster(json!({"shards": 1, "replicas": 2, "keeper": {"replicas": 3}}));
    let mut with = inputs(replicas(1, 2));
    with.keeper_password = Some(Password("k<&>pw".into()));
    let d = build(&c, &with);
    let file = String::from_utf8(
        d.users_secret.data.as_ref().unwrap()[names::KEEPER_IDENTITY_FILE]
            .0
            .clone(),
    )
    .unwrap();
    let doc = parse(&file);
    let zk = doc
        .descendants()
        .find(|n| n.has_tag_name("zookeeper"))
        .expect("zookeeper");
    assert_eq!(
        zk.attribute("replace"),
        None,
        "merges, does not replace: {file}"
    );
    let identity = zk
        .children()
        .find(|n| n.has_tag_name("identity"))
        .and_then(|n| n.text());
    assert_eq!(identity, Some("clickhouse:k<&>pw"));
    assert_eq!(
        keeper_identity_of(&file),
        Some(keeper_identity_text(&Password("k<&>pw".into())).as_str())
    );
    // merged after the file that lists the members (config.d is read in name order)
    assert!(names::KEEPER_IDENTITY_FILE > RUNTIME_FILE);
    let runtime = &d.common_config.data.as_ref().unwrap()[RUNTIME_FILE];
    assert!(
        runtime.contains("<zookeeper replace=\"replace\">"),
        "{runtime}"
    );
    for t in templates(&d) {
        let text = serde_json::to_string(&t).unwrap();
        assert!(
            text.contains(names::KEEPER_IDENTITY_FILE),
            "projected: {text}"
        );
        assert!(!text.contains("k<&>pw") && !text.contains("k&lt;&amp;&gt;pw"));
    }
    let public = serde_json::to_string(&d.common_config).unwrap()
        + &serde_json::to_string(&d.keeper.as_ref().unwrap().config).unwrap();
    assert!(!public.contains("k&lt;&amp;&gt;pw") && !public.contains("k<&>pw"));
    // without Keeper: the file exists and names no identity
    let none = cluster(json!({"shards": 1, "replicas": 1, "keeper": {"replicas": 0}}));
    let n = build(&none, &with);
    let empty = String::from_utf8(
        n.users_secret.data.as_ref().unwrap()[names::KEEPER_IDENTITY_FILE]
            .0
            .clone(),
    )
    .unwrap();
    assert_eq!(keeper_identity_of(&empty), None, "{empty}");
    assert!(!empty.contains("zookeeper"), "{empty}");
    // a cluster from before: no file, no projection
    let mut before = inputs(replicas(1, 2));
    before.keeper_password = None;
    let b = build(&c, &before);
    assert!(
        !b.users_secret
            .data
            .as_ref()
            .unwrap()
            .contains_key(names::KEEPER_IDENTITY_FILE)
    );
    for t in templates(&b) {
        assert!(
            !serde_json::to_string(&t)
                .unwrap()
                .contains(names::KEEPER_IDENTITY_FILE)
        );
    }
}

/// Decision 27 and invariant 9: Keeper members answer only the four-letter words the probe and the
/// exporter use; the list is in the configuration but not in the pod template's hash, so an
/// ensemble an older operator created is not restarted for it.
#[test]
fn keeper_answers_few_four_letter_words_without_a_restart_for_them() {
    use crate::model::config::keeper::{FOUR_LETTER_WORDS, keeper_file, keeper_restart_part};
    let c = cluster(json!({"shards": 1, "replicas": 1, "keeper": {"replicas": 3}}));
    let d = build(&c, &inputs(replicas(1, 1)));
    let k = d.keeper.as_ref().unwrap();
    let file = &k.config.data.as_ref().unwrap()[names::KEEPER_CONFIG_FILE];
    let doc = parse(file);
    let words = doc
        .descendants()
        .find(|n| n.has_tag_name("four_letter_word_white_list"))
        .and_then(|n| n.text());
    assert_eq!(words, Some(FOUR_LETTER_WORDS));
    assert_eq!(FOUR_LETTER_WORDS, "ruok,srvr,mntr");
    let model = Cluster::new(&c).unwrap();
    assert!(keeper_file(&model, 3).contains("four_letter_word_white_list"));
    assert!(!keeper_restart_part(&model).contains("four_letter_word_white_list"));
    // the readiness probe asks `srvr`, which is on the list
    let probe = serde_json::to_string(&k.statefulset.spec.template).unwrap();
    assert!(probe.contains("printf srvr"), "{probe}");
}

/// Decision 27: the NetworkPolicies. `<cluster>-server` selects the server pods: every port from
/// the cluster's servers, the client ports (not the interserver one) from the operator (its
/// pods by selector in its namespace, or its networks without one), the backup agents and the
/// spec's clients (everyone when none). `<cluster>-keeper` selects the Keeper pods: every port
/// from the members, the client port from the servers and the operator only. Switched off:
/// none.
#[test]
fn network_policies_let_in_only_what_each_port_needs() {
    use k8s_openapi::api::networking::v1::NetworkPolicy;
    let c = cluster(
        json!({"shards": 1, "replicas": 2, "keeper": {"replicas": 3},
        "networkPolicy": {"clients": [{"podSelector": {"matchLabels": {"app": "bi"}}}]}}),
    );
    let mut i = inputs(replicas(1, 2));
    i.operator_pods = Some(crate::model::network_policy::OperatorPods {
        namespace: "ops".into(),
        labels: BTreeMap::from([(
            "app.kubernetes.io/name".into(),
            "clickhouse-operator".into(),
        )]),
    });
    let d = build(&c, &i);
    let by_name: BTreeMap<String, &NetworkPolicy> = d
        .network_policies
        .iter()
        .map(|p| (p.metadata.name.clone().unwrap(), p))
        .collect();
    assert_eq!(
        by_name.keys().collect::<Vec<_>>(),
        ["c1-keeper", "c1-server"]
    );
    let v = |p: &NetworkPolicy| serde_json::to_value(p.spec.as_ref().unwrap()).unwrap();
    let server = v(by_name["c1-server"]);
    assert_eq!(
        server["podSelector"]["matchLabels"],
        json!({"clickhouse.com/cluster": "c1", "app.kubernetes.io/component": "server"})
    );
    assert_eq!(server["policyTypes"], json!(["Ingress"]));
    let rules = server["ingress"].as_array().unwrap();
    assert_eq!(rules.len(), 3);
    // the servers: every port
    assert_eq!(
        rules[0],
        json!({"from": [{"podSelector": {"matchLabels":
            {"clickhouse.com/cluster": "c1", "app.kubernetes.io/component": "server"}}}]})
    );
    let client_ports =
        json!([{"port": 8123, "protocol": "TCP"}, {"port": 9000, "protocol": "TCP"}]);
    // the operator (by its pods) and the backup agents: the client ports
    assert_eq!(rules[1]["ports"], client_ports);
    assert_eq!(
        rules[1]["from"],
        json!([
            {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ops"}},
             "podSelector": {"matchLabels": {"app.kubernetes.io/name": "clickhouse-operator"}}},
            {"podSelector": {"matchLabels": {"app.kubernetes.io/name": "clickhouse-backup-agent"}}}
        ])
    );
    // the spec's clients: the client ports
    assert_eq!(rules[2]["ports"], client_ports);
    assert_eq!(
        rules[2]["from"],
        json!([{"podSelector": {"matchLabels": {"app": "bi"}}}])
    );
    let text = server.to_string();
    assert!(
        !text.contains("9009"),
        "the interserver port is the servers' only: {text}"
    );
    let keeper = v(by_name["c1-keeper"]);
    assert_eq!(
        keeper["podSelector"]["matchLabels"],
        json!({"clickhouse.com/cluster": "c1", "app.kubernetes.io/component": "keeper"})
    );
    let rules = keeper["ingress"].as_array().unwrap();
    assert_eq!(
        rules[0]["ports"],
        serde_json::Value::Null,
        "members: every port"
    );
    assert_eq!(
        rules[1]["ports"],
        json!([{"port": 9181, "protocol": "TCP"}])
    );
    let from = rules[1]["from"].as_array().unwrap();
    assert_eq!(
        from.len(),
        2,
        "the servers and the operator: no other namespace unless allowed (decision 38)"
    );
    let mut shared = c.clone();
    shared.spec.keeper.allowed_namespaces = vec!["tenant-a".into()];
    let d_shared = build(&shared, &i);
    let keeper_shared = d_shared
        .network_policies
        .iter()
        .find(|p| p.metadata.name.as_deref() == Some("c1-keeper"))
        .map(v)
        .unwrap();
    let from = keeper_shared["ingress"][1]["from"]
        .as_array()
        .unwrap()
        .clone();
    assert_eq!(from.len(), 3);
    assert_eq!(
        from[2],
        json!({"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "tenant-a"}},
               "podSelector": {"matchLabels": {
            "clickhouse.com/keeper-of-cluster": "c1", "clickhouse.com/keeper-of-namespace": "t1"}}}),
        "only the allowed namespace's servers of clusters that use this Keeper"
    );
    // without the operator's pods: its networks; without clients: everyone on the client ports
    let open = cluster(json!({"shards": 1, "replicas": 1, "keeper": {"replicas": 0}}));
    let d = build(&open, &inputs(replicas(1, 1)));
    assert_eq!(d.network_policies.len(), 1, "no Keeper, no Keeper policy");
    let server = v(&d.network_policies[0]);
    assert_eq!(
        server["ingress"][1]["from"][0],
        json!({"ipBlock": {"cidr": "10.244.0.0/16"}})
    );
    assert_eq!(server["ingress"][2].get("from"), None, "clients: everyone");
    // with TLS required and the servers' metrics endpoint: those ports, not the plain ones
    let tls = cluster(
        json!({"tls": {"enabled": true, "serverCertSecret": "t", "caSecret": "ca", "required": true},
        "serverMetrics": {"enabled": true}}),
    );
    let d = build(&tls, &inputs(replicas(1, 2)));
    let server = v(&d.network_policies[0]);
    assert_eq!(
        server["ingress"][2]["ports"],
        json!([{"port": 8443, "protocol": "TCP"}, {"port": 9440, "protocol": "TCP"}, {"port": 9363, "protocol": "TCP"}])
    );
    // switched off: none
    let off = cluster(json!({"networkPolicy": {"enabled": false}}));
    assert!(
        build(&off, &inputs(replicas(1, 2)))
            .network_policies
            .is_empty()
    );
}

/// Decision 28: `spec.pod.template` and `spec.keeper.pod.template` reach every server and Keeper
/// pod template (an init container, an extra volume mounted into the main container, a pull
/// secret); one that sets what the operator owns is an error naming the field, for the servers
/// and for Keeper alike, and nothing is built.
#[test]
fn pod_templates_reach_the_server_and_keeper_pods_and_owned_fields_are_refused() {
    let template = json!({"spec": {
        "imagePullSecrets": [{"name": "registry"}],
        "initContainers": [{"name": "prepare", "image": "busybox", "command": ["true"]}],
        "volumes": [{"name": "scratch", "emptyDir": {}}],
        "containers": [{"name": "clickhouse",
            "volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}]}]}});
    let mut keeper_template = template.clone();
    keeper_template["spec"]["containers"][0]["name"] = json!("keeper");
    let c = cluster(
        json!({"keeper": {"replicas": 3, "pod": {"template": keeper_template}},
        "pod": {"template": template}}),
    );
    let d = build(&c, &inputs(replicas(2, 2)));
    let keeper = &d.keeper.as_ref().unwrap().statefulset.spec;
    let mut all = templates(&d);
    all.push(keeper.template.clone());
    assert_eq!(all.len(), 5);
    for t in &all {
        let spec = t.spec.as_ref().unwrap();
        assert_eq!(
            spec.image_pull_secrets.as_ref().unwrap()[0].name,
            "registry"
        );
        assert_eq!(spec.init_containers.as_ref().unwrap()[0].name, "prepare");
        let volumes = spec.volumes.as_ref().unwrap();
        assert!(volumes.iter().any(|v| v.name == "scratch"));
        let main = &spec.containers[0];
        assert!(main.image.is_some(), "the main container keeps its image");
        assert!(
            main.volume_mounts
                .as_ref()
                .unwrap()
                .iter()
                .any(|m| m.mount_path == "/scratch")
        );
    }
    for (spec, field) in [
        (
            json!({"pod": {"template": {"spec": {"containers": [{"name": "clickhouse", "image": "x"}]}}}}),
            "spec.pod.template.spec.containers[clickhouse].image",
        ),
        (
            json!({"keeper": {"replicas": 3, "pod": {"template": {"spec": {"volumes": [{"name": "config", "emptyDir": {}}]}}}}}),
            "spec.keeper.pod.template.spec.volumes[config]",
        ),
    ] {
        let c = cluster(spec);
        match desired(&Cluster::new(&c).unwrap(), &inputs(replicas(1, 1))) {
            Err(BuildError::PodTemplate { field: f, .. }) => assert_eq!(f, field),
            other => panic!("not refused: {:?}", other.map(|_| ())),
        }
    }
}

/// Decision 28: `spec.clusterDomain` names every host the servers and Keeper know each other by
/// (`remote_servers`, the Keeper nodes, the interserver host, Keeper's raft members).
#[test]
fn the_cluster_domain_names_every_host() {
    let c = cluster(json!({"clusterDomain": "corp.example", "keeper": {"replicas": 3}}));
    let d = build(&c, &inputs(replicas(1, 2)));
    let mut texts = vec![remote_file(&d), common_file(&d, RUNTIME_FILE).to_string()];
    texts.extend(
        d.replica_configs
            .iter()
            .flat_map(|m| m.data.clone().unwrap().into_values()),
    );
    texts.extend(
        d.keeper
            .as_ref()
            .unwrap()
            .config
            .data
            .clone()
            .unwrap()
            .into_values(),
    );
    let all = texts.join("\n");
    assert!(!all.contains("cluster.local"), "{all}");
    assert!(
        all.contains("c1-0-0-0.c1-headless.t1.svc.corp.example"),
        "{all}"
    );
    assert!(
        all.contains("c1-keeper-2.c1-keeper-headless.t1.svc.corp.example"),
        "{all}"
    );
}

/// docs/configuration.md: the client Service carries the user's labels, source ranges and traffic
/// policy; with `perReplica`, every replica gets `<replica>-client` selecting its pod only.
#[test]
fn client_service_options_and_per_replica_services() {
    let c = cluster(json!({"clientService": {"type": "LoadBalancer",
        "labels": {"team": "db"}, "annotations": {"lb": "internal"},
        "loadBalancerSourceRanges": ["10.0.0.0/8"], "externalTrafficPolicy": "Local",
        "perReplica": true}}));
    let d = build(&c, &inputs(replicas(2, 2)));
    let client = d.client_service.as_ref().unwrap();
    let mut all = vec![client.clone()];
    all.extend(d.replica_services.iter().cloned());
    assert_eq!(all.len(), 5);
    for s in &all {
        let labels = s.metadata.labels.as_ref().unwrap();
        assert_eq!(labels["team"], "db");
        assert_eq!(labels["clickhouse.com/cluster"], "c1");
        assert_eq!(s.metadata.annotations.as_ref().unwrap()["lb"], "internal");
        let spec = s.spec.as_ref().unwrap();
        assert_eq!(spec.type_.as_deref(), Some("LoadBalancer"));
        assert_eq!(
            spec.load_balancer_source_ranges.as_ref().unwrap(),
            &["10.0.0.0/8"]
        );
        assert_eq!(spec.external_traffic_policy.as_deref(), Some("Local"));
    }
    let names: Vec<String> = d
        .replica_services
        .iter()
        .map(|s| s.metadata.name.clone().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "c1-0-0-client",
            "c1-0-1-client",
            "c1-1-2-client",
            "c1-1-3-client"
        ]
    );
    let selector = d.replica_services[1]
        .spec
        .as_ref()
        .unwrap()
        .selector
        .as_ref()
        .unwrap();
    assert_eq!(selector, &labels::replica_selector("c1", "c1-0-1"));
    // off by default
    let d = build(&cluster(json!({})), &inputs(replicas(1, 2)));
    assert!(d.replica_services.is_empty());
    let spec = d.client_service.unwrap().spec.unwrap();
    assert_eq!(spec.external_traffic_policy, None);
    assert_eq!(spec.load_balancer_source_ranges, None);
}

/// Decision 28: an external Keeper: the servers list its nodes (or the referenced cluster's Keeper
/// Service) under the cluster's root, keep their Keeper identity, carry the labels the other
/// cluster's Keeper NetworkPolicy admits, and the cluster has no Keeper objects of its own.
#[test]
fn an_external_keeper_is_listed_under_the_clusters_root() {
    let c = cluster(
        json!({"replicas": 2, "keeper": {"replicas": 0, "external": {
        "nodes": [{"host": "zk-0.zk", "port": 2181}, {"host": "10.0.0.7"}], "root": "/ch/prod"}}}),
    );
    let d = build(&c, &inputs(replicas(1, 2)));
    assert!(d.keeper.is_none());
    let runtime = common_file(&d, RUNTIME_FILE);
    let doc = parse(runtime);
    let zk = doc
        .descendants()
        .find(|n| n.has_tag_name("zookeeper"))
        .unwrap();
    let hosts: Vec<&str> = zk
        .descendants()
        .filter(|n| n.has_tag_name("host"))
        .filter_map(|n| n.text())
        .collect();
    assert_eq!(hosts, ["zk-0.zk", "10.0.0.7"]);
    let root = zk.children().find(|n| n.has_tag_name("root")).unwrap();
    assert_eq!(root.text(), Some("/ch/prod"));
    let identity = d.users_secret.data.as_ref().unwrap()[names::KEEPER_IDENTITY_FILE]
        .0
        .clone();
    assert!(String::from_utf8(identity).unwrap().contains("<identity "));

    let c = cluster(
        json!({"replicas": 2, "keeper": {"replicas": 0, "external": {
        "clusterRef": {"name": "shared", "namespace": "infra"}}}}),
    );
    let d = build(&c, &inputs(replicas(1, 2)));
    let runtime = common_file(&d, RUNTIME_FILE);
    assert!(
        runtime.contains("<host>shared-keeper.infra.svc.cluster.local</host>"),
        "{runtime}"
    );
    assert!(runtime.contains("<port>9181</port>"), "{runtime}");
    assert!(
        runtime.contains("<root>/clickhouse-operator/t1/c1</root>"),
        "{runtime}"
    );
    let t = &templates(&d)[0];
    let l = t.metadata.as_ref().unwrap().labels.as_ref().unwrap();
    assert_eq!(l[labels::KEEPER_OF_CLUSTER], "shared");
    assert_eq!(l[labels::KEEPER_OF_NAMESPACE], "infra");
}

/// Decision 28: the replicas of one shard, and the Keeper members, are kept on different nodes:
/// preferred by default, required or not at all when the spec says so; the user's own affinity
/// terms stay.
#[test]
fn replicas_of_a_shard_and_keeper_members_are_kept_apart() {
    let anti = |t: &PodTemplateSpec| {
        serde_json::to_value(t.spec.as_ref().unwrap().affinity.as_ref())
            .unwrap()
            .get("podAntiAffinity")
            .cloned()
            .unwrap_or_default()
    };
    let c = cluster(json!({"shards": 2, "replicas": 2, "keeper": {"replicas": 3}}));
    let d = build(&c, &inputs(replicas(2, 2)));
    for (t, shard) in templates(&d).iter().zip([0, 0, 1, 1]) {
        assert_eq!(
            anti(t)["preferredDuringSchedulingIgnoredDuringExecution"],
            json!([{"weight": 100, "podAffinityTerm": {"topologyKey": "kubernetes.io/hostname",
                "labelSelector": {"matchLabels": {"clickhouse.com/cluster": "c1",
                    "app.kubernetes.io/component": "server", "clickhouse.com/shard": shard.to_string()}}}}])
        );
    }
    let keeper = &d.keeper.as_ref().unwrap().statefulset.spec;
    assert_eq!(
        anti(&keeper.template)["preferredDuringSchedulingIgnoredDuringExecution"][0]["podAffinityTerm"]
            ["labelSelector"]["matchLabels"],
        json!({"clickhouse.com/cluster": "c1", "app.kubernetes.io/component": "keeper"})
    );
    let c = cluster(
        json!({"shards": 1, "replicas": 2, "pod": {"antiAffinity": "Required",
        "affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
            {"topologyKey": "topology.kubernetes.io/zone", "labelSelector": {"matchLabels": {"app": "x"}}}]}}},
        "keeper": {"replicas": 1, "pod": {"antiAffinity": "None"}}}),
    );
    let d = build(&c, &inputs(replicas(1, 2)));
    let required =
        anti(&templates(&d)[0])["requiredDuringSchedulingIgnoredDuringExecution"].clone();
    assert_eq!(required.as_array().unwrap().len(), 2, "{required}");
    assert_eq!(required[0]["topologyKey"], "topology.kubernetes.io/zone");
    assert_eq!(required[1]["topologyKey"], "kubernetes.io/hostname");
    let keeper = &d.keeper.as_ref().unwrap().statefulset.spec;
    assert!(keeper.template.spec.as_ref().unwrap().affinity.is_none());
}

/// docs/changes.md: Keeper's coordination settings from the spec replace the operator's defaults
/// where they name them and add to them otherwise; without any, the file is as before (so running
/// ensembles keep their hash); a change restarts the members, not the servers.
#[test]
fn keeper_coordination_settings_come_from_the_spec() {
    let coordination = |d: &Desired| -> Vec<(String, String)> {
        let file = d.keeper.as_ref().unwrap().config.data.clone().unwrap()
            [names::KEEPER_CONFIG_FILE]
            .clone();
        let doc = parse(&file);
        doc.descendants()
            .find(|n| n.has_tag_name("coordination_settings"))
            .unwrap()
            .children()
            .filter(|n| n.is_element())
            .map(|n| {
                (
                    n.tag_name().name().to_string(),
                    n.text().unwrap_or_default().to_string(),
                )
            })
            .collect()
    };
    let plain = cluster(json!({"keeper": {"replicas": 3}}));
    let d = build(&plain, &inputs(replicas(1, 1)));
    assert_eq!(
        coordination(&d),
        [
            ("operation_timeout_ms".to_string(), "10000".to_string()),
            ("session_timeout_ms".into(), "30000".into()),
            ("raft_logs_level".into(), "warning".into()),
            // decision 42: half the 60 s startup probe budget
            ("startup_timeout".into(), "30000".into()),
        ]
    );
    let tuned = cluster(json!({"keeper": {"replicas": 3, "settings": {
        "session_timeout_ms": "60000", "snapshot_distance": "50000"}}}));
    let t = build(&tuned, &inputs(replicas(1, 1)));
    let settings = coordination(&t);
    assert_eq!(
        settings,
        [
            ("operation_timeout_ms".to_string(), "10000".to_string()),
            ("session_timeout_ms".into(), "60000".into()),
            ("raft_logs_level".into(), "warning".into()),
            ("snapshot_distance".into(), "50000".into()),
            ("startup_timeout".into(), "30000".into()),
        ]
    );
    let keeper_template =
        |d: &Desired| d.keeper.as_ref().unwrap().statefulset.spec.template.clone();
    assert_ne!(
        keeper_template(&d),
        keeper_template(&t),
        "the members restart"
    );
    assert_eq!(templates(&d), templates(&t), "the servers do not");
}

/// docs/changes.md: a shard's own configuration files reach that shard's replicas only (their
/// ConfigMaps, projected into `config.d`), and a change restarts only them: the other shard's
/// pod templates are those of a cluster without shard files.
#[test]
fn shard_files_reach_that_shards_replicas_only() {
    let plain = build(
        &cluster(json!({"shards": 2, "replicas": 2})),
        &inputs(replicas(2, 2)),
    );
    let with = build(
        &cluster(
            json!({"shards": 2, "replicas": 2, "configuration": {"shardFiles": {
            "1": {"disks.xml": "<clickhouse><x>1</x></clickhouse>"}}}}),
        ),
        &inputs(replicas(2, 2)),
    );
    for (cm, shard) in with.replica_configs.iter().zip([0, 0, 1, 1]) {
        let data = cm.data.as_ref().unwrap();
        assert_eq!(
            data.contains_key("disks.xml"),
            shard == 1,
            "{:?}",
            cm.metadata.name
        );
        assert!(data.contains_key(REPLICA_FILE));
    }
    let (a, b) = (templates(&plain), templates(&with));
    assert_eq!(a[0], b[0]);
    assert_eq!(a[1], b[1]);
    assert_ne!(a[2], b[2]);
    assert_ne!(a[3], b[3]);
    assert!(annotation(&b[2], labels::SHARD_FILES_HASH).is_some());
}

/// docs/changes.md: a replica's own configuration files (`configuration.replicaFiles`, keyed by the
/// replica's name) reach that replica only (its ConfigMap, projected into `config.d`), and a
/// change restarts only it: every other pod template is that of a cluster without them.
#[test]
fn replica_files_reach_that_replica_only() {
    let plain = build(
        &cluster(json!({"shards": 2, "replicas": 2})),
        &inputs(replicas(2, 2)),
    );
    let with = build(
        &cluster(
            json!({"shards": 2, "replicas": 2, "configuration": {"replicaFiles": {
            "c1-1-3": {"pinned.xml": "<clickhouse><x>1</x></clickhouse>"},
            "c1-9-99": {"gone.xml": "<clickhouse/>"}}}}),
        ),
        &inputs(replicas(2, 2)),
    );
    let names: Vec<String> = with
        .replica_configs
        .iter()
        .map(|c| c.metadata.name.clone().unwrap())
        .collect();
    assert_eq!(names, ["c1-0-0", "c1-0-1", "c1-1-2", "c1-1-3"]);
    for cm in &with.replica_configs {
        let data = cm.data.as_ref().unwrap();
        let mine = cm.metadata.name.as_deref() == Some("c1-1-3");
        assert_eq!(
            data.contains_key("pinned.xml"),
            mine,
            "{:?}",
            cm.metadata.name
        );
        assert!(!data.contains_key("gone.xml"));
    }
    let (a, b) = (templates(&plain), templates(&with));
    assert_eq!(a[..3], b[..3]);
    assert_ne!(a[3], b[3]);
    assert!(annotation(&b[3], labels::REPLICA_FILES_HASH).is_some());
}

/// docs/changes.md: a `users.d/` file of `configuration.files` is kept in `<cluster>-users` and
/// projected into `users.d` (not in any ConfigMap, as it may hold passwords); the operator's
/// own names stay reserved there too.
#[test]
fn users_d_files_go_to_users_d_through_the_users_secret() {
    let content =
        "<clickhouse><profiles><bi><max_threads>2</max_threads></bi></profiles></clickhouse>";
    let c = cluster(
        json!({"configuration": {"files": {"users.d/bi.xml": content, "a.xml": "<clickhouse/>"}}}),
    );
    let d = build(&c, &inputs(replicas(1, 1)));
    let data = d.users_secret.data.as_ref().unwrap();
    assert_eq!(data[&names::users_d_key("bi.xml")].0, content.as_bytes());
    let common = d.common_config.data.as_ref().unwrap();
    assert!(common.contains_key("a.xml"));
    assert!(
        !common.keys().any(|k| k.contains("bi.xml")),
        "{:?}",
        common.keys()
    );
    let t = serde_json::to_value(&templates(&d)[0]).unwrap();
    let users_d = t["spec"]["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "users-d")
        .unwrap();
    let items: Vec<(String, String)> = users_d["projected"]["sources"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|s| s["secret"]["items"].as_array().cloned().unwrap_or_default())
        .map(|i| {
            (
                i["key"].as_str().unwrap().to_string(),
                i["path"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert!(
        items.contains(&("users-d.bi.xml".to_string(), "bi.xml".to_string())),
        "{items:?}"
    );
    let c = cluster(
        json!({"configuration": {"files": {"users.d/00-operator-users.xml": "<clickhouse/>"}}}),
    );
    assert!(matches!(
        desired(&Cluster::new(&c).unwrap(), &inputs(replicas(1, 1))),
        Err(BuildError::ReservedFile(_))
    ));
}

/// docs/configuration.md, "Storage": further disks, storage policies and a log volume: a claim
/// template and a mount per disk (`disk-<name>` at `/var/lib/clickhouse-disks/<name>`), the log
/// volume's claim instead of scratch space, `storage_configuration` with the disks at their mount
/// paths and the policies' volumes in the spec's order; PVC labels and annotations on every claim
/// template under the operator's labels. Without them the objects are the same as before.
#[test]
fn disks_policies_and_a_log_volume_become_claims_mounts_and_storage_configuration() {
    let plain = build(&cluster(json!({})), &inputs(replicas(1, 1)));
    let c = cluster(json!({"storage": {
        "size": "10Gi",
        "labels": {"team": "analytics", "app.kubernetes.io/instance": "mine"},
        "annotations": {"example.com/tier": "hot"},
        "disks": [{"name": "cold", "size": "100Gi", "storageClassName": "hdd"},
                  {"name": "jbod2", "size": "10Gi"}],
        "policies": {"tiered": {"moveFactor": 0.2, "volumes": [
            {"name": "hot", "disks": ["default", "jbod2"], "maxDataPartSize": "1Gi"},
            {"name": "cold", "disks": ["cold"]}]}},
        "logs": {"size": "2Gi"}
    }}));
    let d = build(&c, &inputs(replicas(1, 1)));
    let sts = &d.server_statefulsets[0];
    let claims = sts.spec.volume_claim_templates.as_ref().unwrap();
    let names: Vec<_> = claims
        .iter()
        .map(|c| c.metadata.name.clone().unwrap())
        .collect();
    assert_eq!(names, ["data", "disk-cold", "disk-jbod2", "logs"]);
    for claim in claims {
        let l = claim.metadata.labels.as_ref().unwrap();
        assert_eq!(l["team"], "analytics");
        assert_eq!(l[labels::CLUSTER], "c1", "the operator's labels win");
        assert_ne!(
            l["app.kubernetes.io/instance"], "mine",
            "the operator's labels win"
        );
        assert_eq!(
            claim.metadata.annotations.as_ref().unwrap()["example.com/tier"],
            "hot"
        );
    }
    let class = |i: usize| claims[i].spec.as_ref().unwrap().storage_class_name.clone();
    assert_eq!(class(1).as_deref(), Some("hdd"));
    assert_eq!(class(2), None);
    let pod = sts.spec.template.spec.as_ref().unwrap();
    let mounts = pod.containers[0].volume_mounts.as_ref().unwrap();
    let at = |v: &str| {
        mounts
            .iter()
            .find(|m| m.name == v)
            .map(|m| m.mount_path.clone())
    };
    assert_eq!(
        at("disk-cold").as_deref(),
        Some("/var/lib/clickhouse-disks/cold")
    );
    assert_eq!(
        at("disk-jbod2").as_deref(),
        Some("/var/lib/clickhouse-disks/jbod2")
    );
    assert_eq!(at("logs").as_deref(), Some(names::SERVER_LOG_PATH));
    let volumes = pod.volumes.as_ref().unwrap();
    assert!(
        !volumes.iter().any(|v| v.name == "logs"),
        "the log volume is the claim, not scratch space"
    );
    let server = common_file(&d, SERVER_FILE);
    let storage = &server[server.find("<storage_configuration>").expect(server)..];
    for expected in [
        "<cold>\n                <path>/var/lib/clickhouse-disks/cold/</path>",
        "<jbod2>\n                <path>/var/lib/clickhouse-disks/jbod2/</path>",
        "<tiered>\n                <volumes>\n                    <hot>\n                        <disk>default</disk>\n                        <disk>jbod2</disk>\n                        <max_data_part_size_bytes>1073741824</max_data_part_size_bytes>\n                    </hot>\n                    <cold>\n                        <disk>cold</disk>\n                    </cold>\n                </volumes>\n                <move_factor>0.2</move_factor>",
    ] {
        assert!(storage.contains(expected), "{expected}\nin\n{storage}");
    }
    // without any of it: one claim, scratch space for logs, no storage_configuration
    let sts0 = &plain.server_statefulsets[0];
    assert_eq!(sts0.spec.volume_claim_templates.as_ref().unwrap().len(), 1);
    assert!(
        sts0.spec
            .template
            .spec
            .as_ref()
            .unwrap()
            .volumes
            .as_ref()
            .unwrap()
            .iter()
            .any(|v| v.name == "logs" && v.empty_dir.is_some())
    );
    assert!(!common_file(&plain, SERVER_FILE).contains("storage_configuration"));
    let claim0 = &sts0.spec.volume_claim_templates.as_ref().unwrap()[0];
    assert!(claim0.metadata.annotations.is_none());
}

/// docs/configuration.md, "Storage": the Keeper's PVC labels and annotations come from
/// `spec.keeper.storage`.
#[test]
fn keeper_pvcs_carry_the_labels_of_keeper_storage() {
    let c = cluster(json!({"keeper": {"storage": {"size": "1Gi", "labels": {"team": "k"}}}}));
    let d = build(&c, &inputs(replicas(1, 1)));
    let k = d.keeper.unwrap();
    let claim = &k.statefulset.spec.volume_claim_templates.as_ref().unwrap()[0];
    assert_eq!(claim.metadata.labels.as_ref().unwrap()["team"], "k");
}

/// docs/configuration.md ("Placement") and invariant 9: `topologySpreadKey` spreads each shard's
/// replicas over the topology (a constraint selecting the shard's pods) besides the whole
/// cluster's, so that with two zones no shard sits in one; a StatefulSet written before the shard
/// constraint existed (only the cluster-wide one, its hash taken without the other) is not rolled
/// for it, while a real change still rolls and then writes both. Keeper members get the one spread
/// only.
#[test]
fn each_shard_is_spread_over_the_topology_and_an_older_template_is_not_rolled_for_it() {
    use crate::model::changes::pod_template_changed;
    let zone = "topology.kubernetes.io/zone";
    let c = cluster(json!({"shards": 2, "replicas": 2,
        "pod": {"topologySpreadKey": zone}, "keeper": {"replicas": 3,
            "pod": {"topologySpreadKey": zone}}}));
    let d = build(&c, &inputs(replicas(2, 2)));
    for sts in &d.server_statefulsets {
        let shard = sts
            .spec
            .template
            .metadata
            .as_ref()
            .unwrap()
            .labels
            .as_ref()
            .unwrap()[labels::SHARD]
            .clone();
        let spread = sts
            .spec
            .template
            .spec
            .as_ref()
            .unwrap()
            .topology_spread_constraints
            .clone()
            .unwrap();
        // one spread per topology key (the API server refuses two with the same key and
        // `whenUnsatisfiable`): the shard's own
        assert_eq!(spread.len(), 1, "{spread:?}");
        assert_eq!(spread[0].topology_key, zone);
        assert_eq!(spread[0].max_skew, 1);
        let selector = spread[0]
            .label_selector
            .clone()
            .unwrap()
            .match_labels
            .unwrap();
        assert_eq!(selector.get(labels::SHARD), Some(&shard), "the shard's own");
        assert_eq!(selector[labels::CLUSTER], "c1");

        // a template written when the key spread the cluster's servers instead
        let desired = serde_json::to_value(sts).unwrap();
        let mut older = desired.clone();
        older["spec"]["template"]["spec"]["topologySpreadConstraints"][0]["labelSelector"]["matchLabels"] =
            serde_json::to_value(labels::spread_selector("c1")).unwrap();
        older["metadata"]["annotations"][labels::TEMPLATE_HASH] =
            serde_json::Value::String(template_hash(&older["spec"]["template"]));
        assert!(
            !pod_template_changed(&older, &desired),
            "{} would restart on an operator upgrade",
            sts.metadata.name.as_deref().unwrap()
        );
        assert_a_real_change_rolls(&older, &desired);
    }
    let keeper = d.keeper.as_ref().unwrap();
    let spread = keeper
        .statefulset
        .spec
        .template
        .spec
        .as_ref()
        .unwrap()
        .topology_spread_constraints
        .clone()
        .unwrap();
    assert_eq!(spread.len(), 1);
}

/// docs/security.md, "What a cluster gets": `spec.keeper.tls` (configuration only: the ZooKeeper
/// stand-in refuses it): Keeper serves a secure client port besides the plain one (its probes, the
/// operator's own sessions and clusters on `keeper.external.clusterRef` use that), raft over TLS,
/// an `openSSL` with the cluster's certificate verified against its CA, both mounted into the
/// members; the servers reach every member on the secure port; the Keeper NetworkPolicy admits it;
/// a new certificate restarts the members (its hash is in their template). Without it none of this
/// is there.
#[test]
fn keeper_tls_secures_client_and_raft_traffic_with_the_clusters_certificate() {
    let tls = json!({"enabled": true, "serverCertSecret": "c1-tls", "caSecret": "c1-ca"});
    let c = cluster(json!({"keeper": {"replicas": 3, "tls": true}, "tls": tls}));
    let d = build(&c, &inputs(replicas(1, 2)));
    let k = d.keeper.as_ref().unwrap();
    let xml = &k.config.data.as_ref().unwrap()[names::KEEPER_CONFIG_FILE];
    for want in [
        "<tcp_port>9181</tcp_port>",
        "<tcp_port_secure>9281</tcp_port_secure>",
        "<raft_configuration>\n            <secure>true</secure>",
        "<certificateFile>/etc/clickhouse-keeper/tls/tls.crt</certificateFile>",
        "<privateKeyFile>/etc/clickhouse-keeper/tls/tls.key</privateKeyFile>",
        "<caConfig>/etc/clickhouse-keeper/ca/ca.crt</caConfig>",
        "<verificationMode>relaxed</verificationMode>",
        "<name>RejectCertificateHandler</name>",
    ] {
        assert!(xml.contains(want), "{want} not in\n{xml}");
    }
    let pod = k.statefulset.spec.template.spec.as_ref().unwrap();
    let volumes: Vec<(String, Option<String>)> = pod
        .volumes
        .iter()
        .flatten()
        .map(|v| {
            (
                v.name.clone(),
                v.secret.as_ref().and_then(|s| s.secret_name.clone()),
            )
        })
        .collect();
    assert!(volumes.contains(&("tls".into(), Some("c1-tls".into()))));
    assert!(volumes.contains(&("ca".into(), Some("c1-ca".into()))));
    let container = &pod.containers[0];
    let mounts: Vec<&str> = container
        .volume_mounts
        .iter()
        .flatten()
        .map(|m| m.mount_path.as_str())
        .collect();
    assert!(mounts.contains(&names::KEEPER_TLS_PATH) && mounts.contains(&names::KEEPER_CA_PATH));
    assert!(
        container
            .ports
            .iter()
            .flatten()
            .any(|p| p.container_port == names::KEEPER_SECURE_CLIENT_PORT)
    );
    let annotations = k
        .statefulset
        .spec
        .template
        .metadata
        .as_ref()
        .unwrap()
        .annotations
        .clone()
        .unwrap();
    assert!(
        annotations.contains_key(labels::TLS_SECRET_HASH),
        "{annotations:?}"
    );
    let runtime = &d.common_config.data.as_ref().unwrap()[config::server::RUNTIME_FILE];
    assert_eq!(runtime.matches("<port>9281</port>").count(), 3, "{runtime}");
    assert_eq!(
        runtime.matches("<secure>1</secure>").count(),
        3,
        "{runtime}"
    );
    let policy = serde_json::to_value(
        d.network_policies
            .iter()
            .find(|p| p.metadata.name.as_deref() == Some("c1-keeper"))
            .unwrap(),
    )
    .unwrap();
    assert!(policy.to_string().contains("9281"), "{policy}");

    // without it: nothing of the above, in the same cluster with TLS
    let plain = cluster(json!({"keeper": {"replicas": 3}, "tls": tls}));
    let d = build(&plain, &inputs(replicas(1, 2)));
    let k = d.keeper.as_ref().unwrap();
    let xml = &k.config.data.as_ref().unwrap()[names::KEEPER_CONFIG_FILE];
    assert!(!xml.contains("secure") && !xml.contains("openSSL"), "{xml}");
    let runtime = &d.common_config.data.as_ref().unwrap()[config::server::RUNTIME_FILE];
    assert!(
        !runtime.contains("9281") && !runtime.contains("<secure>"),
        "{runtime}"
    );
    let template = k.statefulset.spec.template.metadata.as_ref().unwrap();
    assert!(
        !template
            .annotations
            .as_ref()
            .unwrap()
            .contains_key(labels::TLS_SECRET_HASH)
    );
}

/// Decision 34: every element of the generated files that holds a credential — a password,
/// a password hash, the cluster's `<secret>`, the Keeper identity — carries
/// `hide_in_preprocessed`, so that servers of 23.8 and later leave it out of the merged copy
/// they write to `preprocessed_configs/` on the data volume (ClickHouse's `ConfigProcessor::
/// hideElements`, ClickHouse pull request 53818; chDB, the only modern engine here, writes no
/// such copy, so the removal itself is the engine's and not proven here). Both with the
/// servers' accounts in `remote_servers` (older servers) and with the cluster secret (newer);
/// the 26.x engine loads these files with the attribute (`tests/modern_config.rs`), and so
/// does 18.16 (`tests/model_boot.rs` and every e2e test).
#[test]
fn every_credential_in_a_generated_file_is_hidden_from_the_preprocessed_copy() {
    let c = cluster(json!({"replicas": 2, "keeper": {"replicas": 3},
        "users": {"secretName": "users"}}));
    for version in [None, Some("26.9.2.1")] {
        let mut i = inputs(replicas(2, 2));
        i.server_version = version.map(|v| v.parse().unwrap());
        let d = build(&c, &i);
        let mut credentials: Vec<String> = vec![
            i.interserver_password.clone().unwrap().0,
            format!(
                "{}:{}",
                names::KEEPER_USER,
                i.keeper_password.clone().unwrap().0
            ),
        ];
        if version.is_some() {
            credentials.push(i.cluster_secret.clone().unwrap().0);
        } else {
            credentials.push(i.cluster_password.clone().unwrap().0);
        }
        let hashes = [&i.operator_password, i.exporter_password.as_ref().unwrap()]
            .into_iter()
            .chain(i.user_passwords.values())
            .map(config::users::sha256_hex);
        credentials.extend(hashes);
        let mut found = std::collections::BTreeSet::new();
        let files = d.users_secret.data.as_ref().unwrap();
        for (name, content) in files {
            let text = String::from_utf8(content.0.clone()).unwrap();
            if !name.ends_with(".xml") {
                continue;
            }
            for node in parse(&text).descendants().filter(|n| n.is_text()) {
                let value = node.text().unwrap_or_default();
                if let Some(cred) = credentials.iter().find(|c| value.contains(c.as_str())) {
                    let element = node.parent_element().unwrap();
                    assert_eq!(
                        element.attribute("hide_in_preprocessed"),
                        Some("true"),
                        "{name}: <{}> holds a credential",
                        element.tag_name().name()
                    );
                    found.insert(cred.clone());
                }
            }
        }
        assert_eq!(
            found,
            credentials.iter().cloned().collect(),
            "every credential is in some file ({version:?})"
        );
        // and none is in a ConfigMap at all
        for cm in std::iter::once(&d.common_config).chain(&d.replica_configs) {
            for text in cm.data.as_ref().unwrap().values() {
                assert!(!credentials.iter().any(|c| text.contains(c.as_str())));
            }
        }
    }
}

/// The Keeper identity in use is read from the file as written now (hidden from the
/// preprocessed copy) and as written before (no attribute), so an upgrade of the operator
/// never takes it for a changed identity.
#[test]
fn the_keeper_identity_is_read_from_old_and_new_files() {
    let c = cluster(json!({"replicas": 1, "keeper": {"replicas": 1}}));
    let pw = Password("k&y".into());
    let new = config::server::keeper_identity_file(&Cluster::new(&c).unwrap(), &pw);
    let text = config::server::keeper_identity_text(&pw);
    assert_eq!(
        config::server::keeper_identity_of(&new),
        Some(text.as_str())
    );
    let old =
        format!("<clickhouse><zookeeper><identity>{text}</identity></zookeeper></clickhouse>");
    assert_eq!(
        config::server::keeper_identity_of(&old),
        Some(text.as_str())
    );
    assert_eq!(config::server::keeper_identity_of("<clickhouse/>"), None);
}

/// Decision 34: the volumes of credentials (configuration and users files from the Secret,
/// TLS certificate and CA) are mounted 0440, readable by the servers' and Keeper's `fsGroup`
/// and no other user of the pod; a ConfigMap-only volume keeps the default.
#[test]
fn credentials_are_mounted_readable_by_the_pods_group_only() {
    let c = cluster(
        json!({"replicas": 1, "keeper": {"replicas": 1, "tls": true},
        "tls": {"enabled": true, "serverCertSecret": "c1-tls", "caSecret": "c1-ca"}}),
    );
    let d = build(&c, &inputs(replicas(1, 1)));
    let mut all: Vec<StatefulSet> = d.server_statefulsets.clone();
    all.push(d.keeper.as_ref().unwrap().statefulset.clone());
    for sts in &all {
        let spec = sts.spec.template.spec.as_ref().unwrap();
        assert_eq!(
            spec.security_context.as_ref().and_then(|s| s.fs_group),
            Some(statefulset::CLICKHOUSE_UID)
        );
        let mut seen = Vec::new();
        for v in spec.volumes.as_ref().unwrap() {
            let mode = v
                .secret
                .as_ref()
                .map(|s| s.default_mode)
                .or(v.projected.as_ref().map(|p| p.default_mode));
            if let Some(mode) = mode {
                assert_eq!(mode, Some(0o440), "{}", v.name);
                seen.push(v.name.clone());
            }
        }
        assert!(
            seen.contains(&"tls".to_string()) && seen.contains(&"ca".to_string()),
            "{seen:?}"
        );
    }
}

/// Decision 34: a setting of `secretSettings` is written as an element that reads the
/// server container's environment variable (`from_env`, hidden from the preprocessed copy),
/// which the pod takes from the Secret key; a file of `secretFiles` is projected from its
/// Secret key into `config.d` or `users.d`. No value is in a ConfigMap or the pod template; a
/// new value of a key changes the template's `secret-config-hash` (a rolling restart) and
/// nothing else, a `users.d` file's value changes nothing (the servers reload it).
#[test]
fn secret_settings_and_files_reach_the_servers_from_their_secret_keys_only() {
    let c = cluster(json!({"replicas": 1, "configuration": {
        "settings": {"storage_configuration/disks/s3/endpoint": "https://s3.example/b/"},
        "secretSettings": {
            "storage_configuration/disks/s3/secret_access_key": {"name": "s3", "key": "secret"},
            "timezone": {"name": "s3", "key": "tz"}},
        "secretFiles": {
            "collections.xml": {"name": "files", "key": "collections"},
            "users.d/bi.xml": {"name": "files", "key": "bi"}}}}));
    let mut i = inputs(replicas(1, 1));
    i.secrets.insert(
        "s3".into(),
        BTreeMap::from([
            ("secret".to_string(), b"S3-SECRET-VALUE".to_vec()),
            ("tz".to_string(), b"Asia/Tokyo".to_vec()),
        ]),
    );
    i.secrets.insert(
        "files".into(),
        BTreeMap::from([
            (
                "collections".to_string(),
                b"<clickhouse>COLLECTION-PW</clickhouse>".to_vec(),
            ),
            ("bi".to_string(), b"<clickhouse>BI-PW</clickhouse>".to_vec()),
        ]),
    );
    let d = build(&c, &i);
    let file = common_file(&d, config::server::SECRET_SETTINGS_FILE);
    let doc = parse(file);
    let leaf = |path: &[&str]| {
        let mut n = doc.root_element();
        for p in path {
            n = n
                .children()
                .find(|c| c.has_tag_name(*p))
                .unwrap_or_else(|| panic!("{p}: {file}"));
        }
        n
    };
    let secret = leaf(&["storage_configuration", "disks", "s3", "secret_access_key"]);
    let tz = leaf(&["timezone"]);
    // in the order of their paths
    assert_eq!(
        secret.attribute("from_env"),
        Some("CLICKHOUSE_SECRET_SETTING_0")
    );
    assert_eq!(
        tz.attribute("from_env"),
        Some("CLICKHOUSE_SECRET_SETTING_1")
    );
    for n in [secret, tz] {
        assert_eq!(n.attribute("hide_in_preprocessed"), Some("true"));
        assert_eq!(n.text(), None);
    }
    let values = ["S3-SECRET-VALUE", "Asia/Tokyo", "COLLECTION-PW", "BI-PW"];
    for cm in std::iter::once(&d.common_config).chain(&d.replica_configs) {
        for text in cm.data.as_ref().unwrap().values() {
            assert!(!values.iter().any(|v| text.contains(v)), "{text}");
        }
    }
    let sts = &d.server_statefulsets[0];
    let template = serde_json::to_string(&sts.spec.template).unwrap();
    assert!(!values.iter().any(|v| template.contains(v)), "{template}");
    let spec = sts.spec.template.spec.as_ref().unwrap();
    let env: Vec<_> = spec.containers[0]
        .env
        .as_ref()
        .unwrap()
        .iter()
        .filter(|e| e.name.starts_with(names::SECRET_SETTING_ENV_PREFIX))
        .map(|e| {
            let r = e
                .value_from
                .as_ref()
                .unwrap()
                .secret_key_ref
                .as_ref()
                .unwrap();
            (e.name.as_str(), r.name.as_str(), r.key.as_str(), r.optional)
        })
        .collect();
    assert_eq!(
        env,
        [
            ("CLICKHOUSE_SECRET_SETTING_0", "s3", "secret", Some(false)),
            ("CLICKHOUSE_SECRET_SETTING_1", "s3", "tz", Some(false))
        ]
    );
    let projected = |volume: &str| -> Vec<(String, String, String)> {
        spec.volumes
            .as_ref()
            .unwrap()
            .iter()
            .find(|v| v.name == volume)
            .unwrap()
            .projected
            .as_ref()
            .unwrap()
            .sources
            .as_ref()
            .unwrap()
            .iter()
            .filter_map(|s| s.secret.as_ref())
            .flat_map(|s| {
                s.items
                    .iter()
                    .flatten()
                    .map(|i| (s.name.clone(), i.key.clone(), i.path.clone()))
            })
            .filter(|(n, _, _)| n == "files")
            .collect()
    };
    assert_eq!(
        projected("config-d"),
        [(
            "files".to_string(),
            "collections".to_string(),
            "collections.xml".to_string()
        )]
    );
    assert_eq!(
        projected("users-d"),
        [("files".to_string(), "bi".to_string(), "bi.xml".to_string())]
    );
    let hash =
        |d: &Desired| annotation(&templates(d)[0], labels::SECRET_CONFIG_HASH).map(str::to_string);
    assert!(hash(&d).is_some());
    let changed = |secret: &str, key: &str| {
        let mut i2 = i.clone();
        i2.secrets
            .get_mut(secret)
            .unwrap()
            .insert(key.into(), b"new".to_vec());
        build(&c, &i2)
    };
    for (secret, key) in [("s3", "secret"), ("s3", "tz"), ("files", "collections")] {
        let d2 = changed(secret, key);
        assert_ne!(hash(&d2), hash(&d), "{secret}/{key}");
        assert_eq!(
            annotation(&templates(&d2)[0], labels::CONFIG_HASH),
            annotation(&templates(&d)[0], labels::CONFIG_HASH)
        );
    }
    assert_eq!(
        changed("files", "bi").server_statefulsets,
        d.server_statefulsets
    );
    // without any, no annotation and no file
    let plain = build(&cluster(json!({"replicas": 1})), &i);
    assert!(hash(&plain).is_none());
    assert!(
        !plain
            .common_config
            .data
            .as_ref()
            .unwrap()
            .contains_key(config::server::SECRET_SETTINGS_FILE)
    );
}

/// The Keeper client's own settings (`zookeeper/session_timeout_ms`, …), which are the user's
/// (docs/reference/api.md), go inside the operator's `zookeeper` element, after the members, in the
/// file the servers reload (one element: ClickHouse would not merge two of the same name in one
/// file), with an own and an external Keeper alike; no other file has them.
#[test]
fn keeper_client_settings_join_the_operators_zookeeper_element() {
    for keeper in [
        json!({"replicas": 3}),
        json!({"replicas": 0, "external": {"nodes": [{"host": "zk-0", "port": 2181}], "root": "/ch"}}),
    ] {
        let c = cluster(
            json!({"replicas": 2, "keeper": keeper, "configuration": {"settings": {
            "zookeeper/session_timeout_ms": "15000",
            "zookeeper/operation_timeout_ms": "5000",
            "max_concurrent_queries": "100"}}}),
        );
        let d = build(&c, &inputs(replicas(1, 2)));
        let runtime = common_file(&d, RUNTIME_FILE);
        let doc = parse(runtime);
        let zk: Vec<_> = doc
            .root_element()
            .children()
            .filter(|n| n.has_tag_name("zookeeper"))
            .collect();
        assert_eq!(zk.len(), 1, "{runtime}");
        let text = |name: &str| {
            zk[0]
                .children()
                .find(|n| n.has_tag_name(name))
                .and_then(|n| n.text())
                .map(str::to_string)
        };
        assert_eq!(text("session_timeout_ms").as_deref(), Some("15000"));
        assert_eq!(text("operation_timeout_ms").as_deref(), Some("5000"));
        assert!(
            zk[0].children().any(|n| n.has_tag_name("node")),
            "{runtime}"
        );
        assert!(!common_file(&d, SETTINGS_FILE).contains("zookeeper"));
    }
}

/// Decision 35: the backup destinations' buckets and keys are named collections in the file
/// the servers reload (no restart: no pod template changes), each key hidden from the
/// preprocessed copy, and only where every server reads them from its configuration for
/// `BACKUP`, hides them from the preprocessed copy and requires a grant to use them (23.8+);
/// 18.16 to 23.7 get none (the keys go in the statement there).
#[test]
fn backup_destinations_become_named_collections_only_where_the_servers_read_them() {
    let c = cluster(json!({"shards": 1, "replicas": 2}));
    let mut i = inputs(replicas(1, 2));
    i.backup_collections = vec![S3Collection {
        name: "chop_s3_0123456789abcdef".into(),
        url: "https://s3.example.com/backups/".into(),
        auth: crate::model::S3Auth::Keys {
            access_key_id: "AKIDEXAMPLE".into(),
            secret_access_key: "wJalr/SECRET+key".into(),
        },
    }];
    let mut by_version = Vec::new();
    for version in [
        None,
        Some("18.16.1"),
        Some("22.8.5"),
        Some("23.7.1"),
        Some("23.8.2"),
        Some("26.1.2"),
    ] {
        i.server_version = version.map(|v| v.parse().unwrap());
        let d = build(&c, &i);
        let remote = remote_file(&d);
        let doc = parse(&remote);
        let collection = doc
            .descendants()
            .find(|n| n.has_tag_name("chop_s3_0123456789abcdef"));
        by_version.push((version, collection.is_some()));
        if let Some(n) = collection {
            assert_eq!(n.parent().unwrap().tag_name().name(), "named_collections");
            let child = |tag: &str| n.children().find(|c| c.has_tag_name(tag)).unwrap();
            assert_eq!(child("url").text(), Some("https://s3.example.com/backups/"));
            for (tag, value) in [
                ("access_key_id", "AKIDEXAMPLE"),
                ("secret_access_key", "wJalr/SECRET+key"),
            ] {
                assert_eq!(child(tag).text(), Some(value));
                assert_eq!(child(tag).attribute("hide_in_preprocessed"), Some("true"));
            }
        }
        // nothing a pod template carries changes with the collections
        let without = {
            let mut j = i.clone();
            j.backup_collections.clear();
            build(&c, &j)
        };
        assert_eq!(templates(&d), templates(&without), "{version:?}");
    }
    assert_eq!(
        by_version,
        vec![
            (None, false),
            (Some("18.16.1"), false),
            (Some("22.8.5"), false),
            (Some("23.7.1"), false),
            (Some("23.8.2"), true),
            (Some("26.1.2"), true),
        ]
    );
}

/// Decision 43: with `webIdentity` on `spec.backup.destination` every server pod runs under its
/// ServiceAccount (still without a Kubernetes API token) with the token projected for its
/// audience where the AWS SDKs look and the variables ClickHouse's S3 client reads; on a server
/// that reads named collections the destination's collection carries no key and
/// `use_environment_credentials`. A static-key destination adds nothing to the pods.
#[test]
fn a_web_identity_destination_gives_the_servers_its_role_and_a_keyless_collection() {
    let web = json!({"endpoint": "https://s3.eu-west-1.amazonaws.com", "bucket": "backups",
                     "region": "eu-west-1",
                     "webIdentity": {"roleArn": "arn:aws:iam::123456789012:role/backups",
                                     "serviceAccountName": "ch-backups"}});
    let c = cluster(json!({"shards": 1, "replicas": 2, "backup": {"destination": web}}));
    let d: crate::api::S3Destination = serde_json::from_value(web).unwrap();
    let mut i = inputs(replicas(1, 2));
    i.server_version = Some("24.8.1".parse().unwrap());
    i.backup_collections = crate::plan::backup::destination::collections(&c, |_| None);
    assert_eq!(i.backup_collections.len(), 1);
    assert_eq!(i.backup_collections[0].name, S3Collection::name_of(&d));
    let built = build(&c, &i);
    for t in templates(&built) {
        let pod = t.spec.unwrap();
        assert_eq!(pod.service_account_name.as_deref(), Some("ch-backups"));
        assert_eq!(pod.automount_service_account_token, Some(false));
        let token = pod
            .volumes
            .unwrap()
            .into_iter()
            .find(|v| v.name == crate::model::job::WEB_IDENTITY_VOLUME)
            .and_then(|v| v.projected)
            .and_then(|p| p.sources)
            .unwrap()[0]
            .service_account_token
            .clone()
            .unwrap();
        assert_eq!(token.audience.as_deref(), Some("sts.amazonaws.com"));
        let server = &pod.containers[0];
        let env = server.env.clone().unwrap();
        let get = |n: &str| {
            env.iter()
                .find(|e| e.name == n)
                .and_then(|e| e.value.clone())
        };
        assert_eq!(
            get("AWS_ROLE_ARN").as_deref(),
            Some("arn:aws:iam::123456789012:role/backups")
        );
        assert_eq!(
            get("AWS_WEB_IDENTITY_TOKEN_FILE").as_deref(),
            Some("/var/run/secrets/eks.amazonaws.com/serviceaccount/token")
        );
        assert_eq!(get("AWS_DEFAULT_REGION").as_deref(), Some("eu-west-1"));
        let mount = server
            .volume_mounts
            .as_ref()
            .unwrap()
            .iter()
            .find(|m| m.name == crate::model::job::WEB_IDENTITY_VOLUME)
            .unwrap();
        assert_eq!(mount.read_only, Some(true));
    }
    let doc = remote_file(&built);
    let parsed = parse(&doc);
    let collection = parsed
        .descendants()
        .find(|n| n.has_tag_name(i.backup_collections[0].name.as_str()))
        .expect("the collection");
    let tags: Vec<&str> = collection
        .children()
        .filter(|n| n.is_element())
        .map(|n| n.tag_name().name())
        .collect();
    assert_eq!(tags, ["url", "use_environment_credentials"]);
    // static keys: nothing of this in the pods
    let plain = cluster(json!({"shards": 1, "replicas": 2, "backup": {"destination":
        {"endpoint": "https://s3.example.com", "bucket": "backups", "secretName": "s3"}}}));
    for t in templates(&build(&plain, &inputs(replicas(1, 2)))) {
        let pod = t.spec.unwrap();
        assert!(pod.service_account_name.is_none());
        assert!(
            !pod.containers[0]
                .env
                .clone()
                .unwrap_or_default()
                .iter()
                .any(|e| e.name.starts_with("AWS_"))
        );
    }
}

/// `spec.logging`: unset, the logger the operator always wrote (no restart for any running
/// cluster); set, its size, count and JSON format in the startup file and its level in the
/// file the servers reload; files off write empty paths (ClickHouse writes no file then).
#[test]
fn logging_writes_the_logger_with_its_level_in_the_reloaded_file() {
    let i = inputs(replicas(1, 1));
    let plain = build(&cluster(json!({})), &i);
    let server = common_file(&plain, SERVER_FILE);
    assert!(
        server.contains(
            "    <logger>\n        <level>information</level>\n        \
             <log>/var/log/clickhouse-server/clickhouse-server.log</log>\n        \
             <errorlog>/var/log/clickhouse-server/clickhouse-server.err.log</errorlog>\n        \
             <size>100M</size>\n        <count>3</count>\n        <console>1</console>\n    \
             </logger>"
        ),
        "{server}"
    );
    let set = build(
        &cluster(
            json!({"logging": {"level": "debug", "format": "Json", "size": "500M",
            "count": 10, "files": false}}),
        ),
        &i,
    );
    let server = common_file(&set, SERVER_FILE);
    for want in [
        "<log></log>",
        "<errorlog></errorlog>",
        "<size>500M</size>",
        "<count>10</count>",
        "<formatting>\n            <type>json</type>\n        </formatting>",
    ] {
        assert!(server.contains(want), "{want}: {server}");
    }
    let runtime = common_file(&set, RUNTIME_FILE);
    assert!(
        runtime.contains("<logger>\n        <level>debug</level>\n    </logger>"),
        "{runtime}"
    );
    // only the level: the startup file is as without spec.logging
    let level = build(&cluster(json!({"logging": {"level": "trace"}})), &i);
    assert_eq!(
        common_file(&level, SERVER_FILE),
        common_file(&plain, SERVER_FILE)
    );
}

/// `spec.shardWeights`: the named shard's `<weight>` in `remote_servers`; a shard not named
/// gets none (ClickHouse's default 1), so the file of a cluster without weights is unchanged.
#[test]
fn shard_weights_are_written_into_remote_servers() {
    let i = inputs(replicas(2, 1));
    let plain = remote_file(&build(&cluster(json!({"shards": 2})), &i));
    assert!(!plain.contains("<weight>"), "{plain}");
    let weighted = remote_file(&build(
        &cluster(json!({"shards": 2, "shardWeights": {"1": 3}})),
        &i,
    ));
    let shards: Vec<&str> = weighted.split("<shard>").skip(1).collect();
    assert_eq!(shards.len(), 2, "{weighted}");
    assert!(!shards[0].contains("<weight>"), "{weighted}");
    assert!(
        shards[1].trim_start().starts_with("<weight>3</weight>"),
        "{weighted}"
    );
    assert_eq!(
        weighted
            .replace("<weight>3</weight>", "")
            .replace(" ", "")
            .replace("\n", ""),
        plain.replace(" ", "").replace("\n", "")
    );
}

/// `spec.protocols`: each protocol that is on is served (its port in the startup file, its
/// port no longer closed), declared on the container, published by the headless and client
/// Services and allowed as a client port by the NetworkPolicy; gRPC takes TLS with the server
/// certificate when `spec.tls` is on; servers known to be older than a protocol refuse it.
#[test]
fn protocols_are_served_declared_published_and_allowed() {
    let i = inputs(replicas(1, 1));
    let plain = build(&cluster(json!({})), &i);
    assert!(common_file(&plain, config::server::CLOSED_PORTS_FILE).contains("<mysql_port remove"));
    let d = build(
        &cluster(json!({"protocols": {"mysql": true, "postgresql": true, "grpc": true}})),
        &i,
    );
    let server = common_file(&d, SERVER_FILE);
    for want in [
        "<mysql_port>9004</mysql_port>",
        "<postgresql_port>9005</postgresql_port>",
        "<grpc_port>9100</grpc_port>",
    ] {
        assert!(server.contains(want), "{want}: {server}");
    }
    assert!(!server.contains("enable_ssl"), "{server}");
    let closed = common_file(&d, config::server::CLOSED_PORTS_FILE);
    assert!(
        !closed.contains("mysql_port") && !closed.contains("postgresql_port"),
        "{closed}"
    );
    let sts = serde_json::to_value(&d.server_statefulsets[0]).unwrap();
    let container_ports: Vec<i64> = sts["spec"]["template"]["spec"]["containers"][0]["ports"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["containerPort"].as_i64().unwrap())
        .collect();
    let service_ports = |s: &k8s_openapi::api::core::v1::Service| -> Vec<i32> {
        s.spec
            .as_ref()
            .unwrap()
            .ports
            .as_ref()
            .unwrap()
            .iter()
            .map(|p| p.port)
            .collect()
    };
    let client = service_ports(d.client_service.as_ref().unwrap());
    let headless = service_ports(&d.headless_service);
    let policy = serde_json::to_string(&d.network_policies[0]).unwrap();
    for port in [9004, 9005, 9100] {
        assert!(
            container_ports.contains(&i64::from(port)),
            "{container_ports:?}"
        );
        assert!(client.contains(&port), "{client:?}");
        assert!(headless.contains(&port), "{headless:?}");
        assert!(policy.contains(&format!("\"port\":{port}")), "{policy}");
    }
    // gRPC with TLS
    let tls = build(
        &cluster(json!({"protocols": {"grpc": true},
            "tls": {"enabled": true, "serverCertSecret": "c1-tls"}})),
        &i,
    );
    let server = common_file(&tls, SERVER_FILE);
    assert!(
        server.contains("<enable_ssl>1</enable_ssl>")
            && server.contains("<ssl_cert_file>/etc/clickhouse-server/tls/tls.crt</ssl_cert_file>"),
        "{server}"
    );
    // servers known to be older
    let mut old = inputs(replicas(1, 1));
    old.server_version = Some("18.16.1".parse().unwrap());
    let c = cluster(json!({"protocols": {"mysql": true}}));
    let e = desired(&Cluster::new(&c).unwrap(), &old).unwrap_err();
    assert_eq!(
        e.to_string(),
        "spec.protocols.mysql: needs ClickHouse 20.1.0.0 or later: the servers run 18.16.1.0"
    );
}

/// Users managed with SQL: `accessManagement` gives the user `access_management` where the
/// servers have it (20.4; not before, not while no version is known); `replicatedAccess` puts
/// SQL-created users in Keeper (`user_directories` of the users file and Keeper, in place of
/// each server's own disk), and is refused for servers known to be older than 21.9.
#[test]
fn sql_users_get_access_management_and_replicated_storage() {
    let spec = json!({"users": {"secretName": "u", "replicatedAccess": true,
        "accounts": {"alice": {"accessManagement": true}}}});
    let mut i = inputs(replicas(1, 1));
    i.user_passwords = BTreeMap::from([
        ("alice".into(), Password("a".into())),
        ("bob".into(), Password("b".into())),
    ]);
    let unknown = build(&cluster(spec.clone()), &i);
    assert!(!users_file(&unknown).contains("access_management"));
    i.server_version = Some("24.8.4.13".parse().unwrap());
    let d = build(&cluster(spec.clone()), &i);
    let users = users_file(&d);
    let alice = users
        .split("<alice")
        .nth(1)
        .unwrap()
        .split("</alice>")
        .next()
        .unwrap();
    assert!(
        alice.contains("<access_management>1</access_management>"),
        "{users}"
    );
    let bob = users
        .split("<bob")
        .nth(1)
        .unwrap()
        .split("</bob>")
        .next()
        .unwrap();
    assert!(!bob.contains("access_management"), "{users}");
    let server = common_file(&d, SERVER_FILE);
    assert!(
        server.contains(
            "<user_directories replace=\"replace\">\n        <users_xml>\n            \
             <path>users.xml</path>\n        </users_xml>\n        <replicated>\n            \
             <zookeeper_path>/clickhouse/access</zookeeper_path>\n        </replicated>\n    \
             </user_directories>"
        ),
        "{server}"
    );
    i.server_version = Some("21.8.1".parse().unwrap());
    let c = cluster(spec);
    let e = desired(&Cluster::new(&c).unwrap(), &i).unwrap_err();
    assert!(
        e.to_string()
            .starts_with("spec.users.replicatedAccess: needs ClickHouse 21.9")
    );
}
