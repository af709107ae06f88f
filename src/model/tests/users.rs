//! The accounts of the users file: the operator's, the exporter's, the image's `default`, the
//! users of the users Secret and users managed with SQL, each from its own networks.

use super::*;

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

/// S0-22: a leaving replica (condemned, its StatefulSet still there) is out of the cluster's
/// hosts, but a client connected to it before it left can still insert through its Distributed
/// tables, which forward to the others as the cluster's account: that account, and the
/// passwordless `default`, keep accepting the leaving server's logins until it is deleted.
#[test]
fn the_cluster_account_accepts_a_leaving_server_until_it_is_deleted() {
    let c = cluster(json!({}));
    let host = |r: &str| format!("<host>{r}-0.c1-headless.t1.svc.cluster.local</host>");
    let mut i = inputs(replicas(1, 2));
    i.cluster_password = Some(Password("cl".into()));
    let gone = users_file(&build(&c, &i));
    i.leaving = vec![ReplicaSpec::new("c1", ShardIndex(0), 7)];
    let leaving = users_file(&build(&c, &i));
    let doc = parse(&leaving);
    for account in [names::CLUSTER_USER, "default"] {
        let node = doc
            .descendants()
            .find(|n| {
                n.has_tag_name(account) && n.parent().is_some_and(|p| p.has_tag_name("users"))
            })
            .unwrap();
        let hosts: Vec<&str> = node
            .descendants()
            .filter(|n| n.has_tag_name("host"))
            .filter_map(|n| n.text())
            .collect();
        assert!(
            hosts.contains(&"c1-0-7-0.c1-headless.t1.svc.cluster.local"),
            "{account}: {hosts:?}"
        );
    }
    assert!(!gone.contains(&host("c1-0-7")));
    assert!(leaving.contains(&host("c1-0-0")) && gone.contains(&host("c1-0-0")));
}
