//! The operator's clients against the real servers: the statements chosen for the server's
//! version, retries until a server answers, HTTPS verified against the cluster's CA, and the
//! ZooKeeper protocol.

use std::time::Duration;

use clickhouse_operator::clickhouse::client::{Client, ErrorCode, QueryOptions};
use clickhouse_operator::clickhouse::sql::{self, ReplicaMacro};
use clickhouse_operator::clickhouse::version::Version;

use crate::harness::{self, Harness, SERIAL, cluster, create_fixture, scalar};

/// Decision 17: the modern statements are refused by 18.16 (which is why they are covered by
/// exact-SQL unit tests only), and the statements chosen for the detected version run.
#[tokio::test]
async fn modern_statements_are_refused_by_18_16_so_the_fallbacks_are_chosen() {
    let _serial = SERIAL.lock().await;
    let mut h = Harness::new(5, &[(1, "r1")]);
    h.start("r1");
    let r1 = h.client("r1");
    create_fixture(&[&r1]).await;

    let version = r1.version().await.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!((version.major, version.minor), (18, 16));
    let modern: Version = "24.8.4.13".parse().unwrap_or_else(|e| panic!("{e}"));
    let events = sql::TableName::new("db1", "events");
    let c = cluster();
    let refused = [
        (sql::sync_replica(modern, &events), ErrorCode::SYNTAX_ERROR),
        (
            sql::drop_replica(modern, &ReplicaMacro("rX".into()), &events).unwrap_or_default(),
            ErrorCode::SYNTAX_ERROR,
        ),
        (
            sql::drop_table(modern, &sql::TableName::new("db1", "v")),
            ErrorCode::SYNTAX_ERROR,
        ),
        (
            sql::discover_databases(modern, sql::Source::AllReplicas(&c)),
            // Unknown table function clusterAllReplicas.
            ErrorCode(46),
        ),
        (
            sql::discover_databases(modern, sql::Source::Local),
            // system.databases has no engine_full: missing column.
            ErrorCode(47),
        ),
    ];
    for (statement, code) in refused {
        let err = r1
            .exec(&statement, &QueryOptions::new())
            .await
            .err()
            .unwrap_or_else(|| panic!("18.16 ran {statement}"));
        assert_eq!(err.code(), Some(code), "{statement}: {err}");
        assert!(!err.is_retryable());
    }
    // The forms chosen for 18.16 run.
    for statement in [
        sql::sync_replica(version, &events),
        sql::discover_databases(version, sql::Source::Local),
        sql::discover_tables(version, sql::Source::Local),
        sql::drop_table(version, &sql::TableName::new("db1", "v")),
    ] {
        r1.exec(&statement, &QueryOptions::new())
            .await
            .unwrap_or_else(|e| panic!("{statement}: {e}"));
    }
    assert_eq!(
        sql::drop_replica(version, &ReplicaMacro("rX".into()), &events),
        None
    );
    assert_eq!(sql::discover_functions(version, sql::Source::Local), None);

    // Wrong credentials are a classified, non-retryable error; so is a dead endpoint with a
    // short timeout a retryable transport error.
    let mut wrong = clickhouse_operator::clickhouse::ClientConfig::new(
        r1.endpoint().clone(),
        clickhouse_operator::clickhouse::Credentials {
            user: harness::USER.into(),
            password: "wrong".into(),
        },
    );
    wrong.timeout = Duration::from_secs(2);
    let err = Client::new(wrong.clone())
        .unwrap_or_else(|e| panic!("{e}"))
        .exec("SELECT 1", &QueryOptions::new())
        .await
        .err()
        .unwrap_or_else(|| panic!("wrong password accepted"));
    assert_eq!(err.code(), Some(ErrorCode::WRONG_PASSWORD), "{err}");
    assert!(!err.is_retryable());
    h.kill("r1");
    let err = r1
        .exec(
            "SELECT 1",
            &QueryOptions::new().timeout(Duration::from_secs(2)),
        )
        .await
        .err()
        .unwrap_or_else(|| panic!("a killed server answered"));
    assert!(err.is_retryable(), "{err}");
}

/// S1-05: a statement that fails for a reason that passes (here: the server is not up yet,
/// as a pod that just became Ready may still refuse) is retried with backoff and succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ddl_is_retried_until_the_server_answers() {
    let _serial = SERIAL.lock().await;
    let mut h = Harness::new(6, &[(1, "r1")]);
    let r1 = h.client("r1");
    let pending = tokio::spawn(async move {
        r1.exec(
            "CREATE DATABASE IF NOT EXISTS retried",
            &QueryOptions::new().retry(true),
        )
        .await
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    // The first attempts are refused: nothing listens yet.
    assert!(!pending.is_finished());
    h.start("r1");
    pending
        .await
        .unwrap_or_else(|e| panic!("{e}"))
        .unwrap_or_else(|e| panic!("not retried until success: {e}"));
    assert_eq!(
        scalar(
            &h.client("r1"),
            "SELECT count() AS v FROM system.databases WHERE name = 'retried'"
        )
        .await,
        1
    );
}

/// The client's HTTPS with a custom CA: a server whose certificate the CA signed is
/// reached; a client trusting another CA refuses the same server; an unusable CA is a
/// configuration error, not a panic.
#[tokio::test]
async fn https_with_the_clusters_ca_is_verified() {
    let _serial = SERIAL.lock().await;
    let mut h = Harness::with_tls(7, &[(1, "r1")]);
    h.start("r1");
    let r1 = h.client("r1");
    let version = r1.version().await.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!((version.major, version.minor), (18, 16));

    let other = Harness::with_tls(8, &[(1, "x")]);
    let mut config = clickhouse_operator::clickhouse::ClientConfig::new(
        r1.endpoint().clone(),
        clickhouse_operator::clickhouse::Credentials {
            user: harness::USER.into(),
            password: harness::PASSWORD.into(),
        },
    );
    config.tls_ca_pem = other.ca_pem().map(<[u8]>::to_vec);
    config.timeout = Duration::from_secs(5);
    let err = Client::new(config.clone())
        .unwrap_or_else(|e| panic!("{e}"))
        .exec("SELECT 1", &QueryOptions::new())
        .await
        .err()
        .unwrap_or_else(|| panic!("a certificate of another CA was accepted"));
    assert!(
        matches!(
            err,
            clickhouse_operator::clickhouse::Error::Transport { .. }
        ),
        "{err}"
    );

    config.tls_ca_pem = Some(b"not a certificate".to_vec());
    assert!(matches!(
        Client::new(config),
        Err(clickhouse_operator::clickhouse::Error::Config { .. })
    ));
}

/// SECURITY.md, "What the operator protects": a server whose certificate names only a DNS name (as
/// cert-manager issues them) is reached by address and verified by that name; verifying it against
/// its address, as a client without the name does, fails the handshake with an error that names the
/// endpoint and the certificate. Without a CA the client still talks HTTPS (unverified), never
/// plain HTTP.
#[tokio::test]
async fn https_verifies_the_server_by_its_dns_name() {
    let _serial = SERIAL.lock().await;
    let mut h = Harness::with_tls_names(7, &[(1, "r1")]);
    h.start("r1");
    let by_address = h.client("r1");
    let mut config = clickhouse_operator::clickhouse::ClientConfig::new(
        by_address.endpoint().clone(),
        clickhouse_operator::clickhouse::Credentials {
            user: harness::USER.into(),
            password: harness::PASSWORD.into(),
        },
    );
    config.tls_ca_pem = h.ca_pem().map(<[u8]>::to_vec);
    config.timeout = Duration::from_secs(5);
    let err = Client::new(config.clone())
        .unwrap_or_else(|e| panic!("{e}"))
        .exec("SELECT 1", &QueryOptions::new())
        .await
        .err()
        .unwrap_or_else(|| panic!("a certificate for another name was accepted"));
    println!("verified against the address: {err}");
    assert!(
        matches!(
            err,
            clickhouse_operator::clickhouse::Error::Transport { .. }
        ),
        "{err}"
    );
    assert!(
        err.to_string().contains(&by_address.endpoint().to_string()),
        "{err}"
    );
    config.tls_server_name = Some(Harness::tls_name("r1"));
    let by_name = Client::new(config.clone()).unwrap_or_else(|e| panic!("{e}"));
    let version = by_name.version().await.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!((version.major, version.minor), (18, 16));
    // TLS without a CA: still HTTPS (the secure port speaks nothing else), not verified
    config.tls_ca_pem = None;
    config.tls_server_name = None;
    config.tls_unverified = true;
    let unverified = Client::new(config).unwrap_or_else(|e| panic!("{e}"));
    unverified
        .exec("SELECT 1", &QueryOptions::new())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
}

/// Decision 25: the operator's own ZooKeeper-protocol client against a real ZooKeeper 3.8:
/// nodes are created, listed and read; a missing node is `None`; a server that publishes no
/// membership (standalone) says so instead of failing; a refused `reconfig` is an error with
/// the server's code, and a closed port an error, never a panic.
#[tokio::test]
async fn keeper_client_speaks_the_zookeeper_protocol_to_a_real_server() {
    use clickhouse_operator::clickhouse::keeper::{self, Session};
    let _serial = SERIAL.lock().await;
    let h = Harness::new(8, &[]);
    let addr = h.zookeeper();
    // `ruok` is answered a moment before sessions are accepted
    let started = std::time::Instant::now();
    let mut s = loop {
        match Session::connect(addr, Duration::from_secs(5)).await {
            Ok(s) => break s,
            Err(e) if started.elapsed() < Duration::from_secs(20) => {
                eprintln!("not yet: {e}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => panic!("{e}"),
        }
    };
    let open = [keeper::AclEntry::world(keeper::perms::ALL)];
    assert_eq!(s.create("/chop", b"v1", &open).await.unwrap(), "/chop");
    let again = s.create("/chop", b"v2", &open).await.unwrap_err();
    assert_eq!(again.code(), Some(keeper::NODE_EXISTS), "{again}");
    s.create("/chop/a", b"", &open).await.unwrap();
    s.create("/chop/b", b"", &open).await.unwrap();
    let mut children = s.children("/chop").await.unwrap();
    children.sort();
    assert_eq!(children, ["a", "b"]);
    assert_eq!(s.get("/chop").await.unwrap().as_deref(), Some(&b"v1"[..]));
    assert_eq!(s.get("/chop/none").await.unwrap(), None);
    assert_eq!(s.members().await.unwrap(), None);
    let refused = s.reconfig(&[], &[1]).await.unwrap_err();
    assert!(refused.code().is_some(), "{refused}");
    s.close().await;

    // Decision 38: the ACLs of an external root, as a real ZooKeeper applies them. The root
    // belongs to its cluster's digest identity; the level above lets everyone create and
    // delete children, nobody change its ACL.
    let (own, shared) =
        clickhouse_operator::controller::cluster::keeper_root::acls(Some("clickhouse:tenant-pw"));
    let mut tenant = Session::connect(addr, Duration::from_secs(5))
        .await
        .unwrap();
    tenant
        .add_digest_auth("clickhouse:tenant-pw")
        .await
        .unwrap();
    tenant.create("/shared", b"", &shared).await.unwrap();
    tenant.create("/shared/t1", b"", &own).await.unwrap();
    tenant
        .create("/shared/t1/replicas", b"", &own)
        .await
        .unwrap();
    assert_eq!(tenant.acl("/shared/t1").await.unwrap(), own);
    let mut other = Session::connect(addr, Duration::from_secs(5))
        .await
        .unwrap();
    other.add_digest_auth("clickhouse:other-pw").await.unwrap();
    let no_auth = other
        .create("/shared/t1/planted", b"", &open)
        .await
        .unwrap_err();
    assert_eq!(
        no_auth.code(),
        Some(-102),
        "another identity cannot write under the root: {no_auth}"
    );
    assert!(other.children("/shared/t1").await.is_err(), "nor list it");
    other.create("/shared/t2", b"", &own).await.unwrap();
    assert!(
        other.set_acl("/shared", &open).await.is_err(),
        "nobody opens the shared level again"
    );
    let live = other.delete("/shared/t1").await.unwrap_err();
    assert!(live.code().is_some(), "a root with children stays: {live}");
    other.close().await;
    tenant.delete("/shared/t1/replicas").await.unwrap();
    tenant.delete("/shared/t1").await.unwrap();
    tenant.close().await;
    let closed = std::net::SocketAddr::new(addr.ip(), 1);
    assert!(
        Session::connect(closed, Duration::from_secs(2))
            .await
            .is_err()
    );
}
