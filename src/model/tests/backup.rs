//! Backup destinations as the servers see them: named collections, and a web identity's role.

use super::*;

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
            .find(|v| v.name == crate::model::statefulset::WEB_IDENTITY_VOLUME)
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
            .find(|m| m.name == crate::model::statefulset::WEB_IDENTITY_VOLUME)
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
