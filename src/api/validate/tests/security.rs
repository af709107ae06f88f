//! Access and TLS: replicated access, protocols in clear, users' profiles and networks, TLS
//! for the servers and for Keeper.

use super::*;

/// `spec.users.replicatedAccess` needs a Keeper, the cluster's own or an external one.
#[test]
fn replicated_access_needs_keeper() {
    let mut s: ClickHouseClusterSpec = serde_json::from_value(serde_json::json!({
        "replicas": 1, "users": {"secretName": "u", "replicatedAccess": true},
        "keeper": {"replicas": 0}}))
    .unwrap();
    assert_eq!(
        validate("c1", &s)
            .0
            .iter()
            .map(|e| e.field.as_str())
            .collect::<Vec<_>>(),
        ["spec.users.replicatedAccess"]
    );
    s.keeper.replicas = 3;
    assert!(validate("c1", &s).0.is_empty());
}

/// `spec.protocols`: MySQL and PostgreSQL are refused with `tls.required` (a client could
/// connect in clear), gRPC is not; a protocol's port is not the metrics port.
#[test]
fn protocols_in_clear_are_refused_with_required_tls() {
    let mut s: ClickHouseClusterSpec = serde_json::from_value(serde_json::json!({
        "protocols": {"mysql": true, "postgresql": true, "grpc": true},
        "tls": {"enabled": true, "required": true, "serverCertSecret": "c1-tls",
            "caSecret": "c1-ca"},
        "serverMetrics": {"enabled": true, "port": 9100}}))
    .unwrap();
    let (errors, _) = validate("c1", &s);
    let fields: Vec<&str> = errors.iter().map(|e| e.field.as_str()).collect();
    assert_eq!(
        fields,
        [
            "spec.protocols.mysql",
            "spec.protocols.postgresql",
            "spec.serverMetrics.port"
        ]
    );
    s.tls.required = false;
    s.server_metrics.port = 9363;
    assert!(
        validate("c1", &s).0.is_empty(),
        "{:?}",
        validate("c1", &s).0
    );
}

/// S2-10: an unknown profile for the users would make ClickHouse refuse the whole users
/// file; `tls.required` without a CA would lock the operator out.
#[test]
fn an_unknown_users_profile_and_required_tls_without_a_ca_are_refused() {
    let mut s = spec();
    s.users = Some(UsersSpec {
        secret_name: "users".into(),
        profile: Some("analysts".into()),
        ..UsersSpec::default()
    });
    assert_eq!(fields("c1", &s), vec!["spec.users.profile".to_string()]);
    s.configuration
        .profiles
        .insert("analysts".into(), BTreeMap::new());
    assert!(fields("c1", &s).is_empty());
    s.users.as_mut().unwrap().profile = Some("readonly".into());
    assert!(fields("c1", &s).is_empty());
    s.tls = TlsSpec {
        enabled: true,
        server_cert_secret: Some("tls".into()),
        ca_secret: None,
        required: true,
    };
    assert_eq!(fields("c1", &s), vec!["spec.tls.caSecret".to_string()]);
    s.tls.ca_secret = Some("ca".into());
    assert!(fields("c1", &s).is_empty());
}

/// S2-10: Keeper over TLS needs the cluster's TLS with a CA, the cluster's own Keeper,
/// and images that do not name a version older than 22.3; each refused with its field.
#[test]
fn keeper_tls_needs_cluster_tls_a_ca_an_own_ensemble_and_new_enough_images() {
    let mut s = spec();
    s.keeper.tls = true;
    assert_eq!(fields("c1", &s), vec!["spec.keeper.tls".to_string()]);
    s.tls = TlsSpec {
        enabled: true,
        server_cert_secret: Some("tls".into()),
        ca_secret: None,
        required: false,
    };
    assert_eq!(fields("c1", &s), vec!["spec.tls.caSecret".to_string()]);
    s.tls.ca_secret = Some("ca".into());
    assert!(fields("c1", &s).is_empty(), "{:?}", fields("c1", &s));
    s.image = "clickhouse/clickhouse-server:21.8".into();
    s.keeper.image = "clickhouse/clickhouse-keeper:21.12".into();
    assert_eq!(
        fields("c1", &s),
        vec!["spec.image".to_string(), "spec.keeper.image".to_string()]
    );
    s.image = "clickhouse/clickhouse-server:latest".into();
    s.keeper.image = "clickhouse/clickhouse-keeper:22.3".into();
    assert!(fields("c1", &s).is_empty());
    s.keeper.replicas = 0;
    assert!(fields("c1", &s).contains(&"spec.keeper.tls".to_string()));
}

/// Decision 27: the users' networks and per-user accounts are checked before ClickHouse sees
/// them: a network that is not an address or CIDR, an unknown profile or quota, a database
/// that is not a name, each refused with its field.
#[test]
fn user_networks_and_accounts_are_checked_with_their_field() {
    let mut s = spec();
    let mut accounts = BTreeMap::new();
    accounts.insert(
        "alice".to_string(),
        crate::api::AccountSpec {
            networks: vec!["10.0.0.0/8".into(), "10.0.0.0/40".into()],
            profile: Some("nobody".into()),
            quota: Some("q1".into()),
            databases: vec!["db1".into(), "db 2".into()],
            access_management: false,
        },
    );
    accounts.insert("bad name".to_string(), Default::default());
    s.users = Some(UsersSpec {
        secret_name: "users".into(),
        networks: vec!["::/0".into(), "somewhere".into()],
        accounts,
        ..UsersSpec::default()
    });
    assert_eq!(
        fields("c1", &s),
        [
            "spec.users.networks",
            "spec.users.accounts.alice.networks",
            "spec.users.accounts.alice.profile",
            "spec.users.accounts.alice.quota",
            "spec.users.accounts.alice.databases",
            "spec.users.accounts",
        ]
    );
    let u = s.users.as_mut().unwrap();
    u.networks = vec!["::/0".into()];
    u.accounts.remove("bad name");
    let a = u.accounts.get_mut("alice").unwrap();
    a.networks = vec!["198.18.0.1".into()];
    a.profile = Some("readonly".into());
    a.quota = Some("default".into());
    a.databases = vec!["db1".into()];
    assert!(fields("c1", &s).is_empty(), "{:?}", fields("c1", &s));
}
