//! Credentials: no plain password outside Secrets, replication and Keeper authenticated with
//! generated passwords, every credential hidden from the preprocessed copy and mounted for the
//! pod's group only, secret settings and files from their Secret keys.

use super::*;

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

/// Decision 34: every element of the generated files that holds a credential — a password,
/// a password hash, the cluster's `<secret>`, the Keeper identity — carries
/// `hide_in_preprocessed`, so that servers of 23.8 and later leave it out of the merged copy
/// they write to `preprocessed_configs/` on the data volume (ClickHouse's `ConfigProcessor::
/// hideElements`, ClickHouse pull request 53818; chDB, the only modern engine here, writes no
/// such copy, so the removal itself is the engine's and not proven here). Both with the
/// servers' accounts in `remote_servers` (older servers) and with the cluster secret (newer);
/// the 26.x engine loads these files with the attribute (`tests/modern_config/`), and so
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
