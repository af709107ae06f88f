//! What changes a pod template and what does not: runtime-reloaded configuration restarts
//! nothing, the image, restart settings and Secret contents restart the pods that use them, and
//! the change classification agrees with the templates.

use super::*;

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
    more.push(ReplicaSpec::new("c1", ShardIndex(0), 2));
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
