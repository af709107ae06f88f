//! TLS: the generated `openSSL` sections, the secure ports and `remote_servers`, and the servers'
//! `zookeeper` section for a Keeper over TLS.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use clickhouse_operator::api::ClickHouseCluster;
use clickhouse_operator::model::{Inputs, names};

use crate::support::{C1_HOSTS, CLUSTERS, build, c1, check_clusters, lay_out, run, skipped};

/// The TLS cluster of these tests: server certificate and CA Secrets.
fn tls_cluster(required: bool) -> (ClickHouseCluster, Inputs) {
    c1(serde_json::json!({
        "tls": {"enabled": true, "serverCertSecret": "c1-tls", "caSecret": "c1-ca",
                "required": required}
    }))
}

/// A self-signed certificate and its key in `dir`, or `None` without `openssl`.
fn self_signed(dir: &Path) -> Option<(PathBuf, PathBuf)> {
    let (crt, key) = (dir.join("test.crt"), dir.join("test.key"));
    std::fs::create_dir_all(dir).unwrap();
    let ok = Command::new("openssl")
        .args([
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
        ])
        .args(["-subj", "/CN=modern-config-test-ca", "-keyout"])
        .arg(&key)
        .arg("-out")
        .arg(&crt)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    ok.then_some((crt, key))
}

/// docs/testing.md: with `tls.enabled` the generated `openSSL` section, secure ports and secure
/// `remote_servers` load on ClickHouse 26.x. As generated, the server's TLS context is built
/// from the generated section: it fails on the CA file the pod mounts at
/// `/etc/clickhouse-server/ca/ca.crt`, which does not exist here (the image's section names no
/// CA), and the client context (used by `remoteSecure`) likewise. With only the three file
/// paths moved to a test certificate (the files are unavoidable to build a context: chDB loads
/// them when the context is built), both contexts build, so the 26.x engine accepts every
/// other generated value (verification modes, disabled protocols, session cache, handlers);
/// the same layout with an invalid verification mode is refused, so the check can fail.
#[test]
fn tls_sections_build_tls_contexts_and_clusters_use_the_secure_port() {
    let (c, i) = tls_cluster(false);
    let d = build(&c, &i);
    let layout = lay_out("tls", &d, "c1-1-3", "");
    let r = run(
        &layout,
        &[
            CLUSTERS,
            "SELECT name, value FROM system.server_settings WHERE name IN \
             ('openSSL.server.certificateFile', 'openSSL.server.privateKeyFile', \
             'openSSL.server.caConfig', 'openSSL.server.verificationMode', \
             'openSSL.server.loadDefaultCAFile', 'openSSL.server.disableProtocols', \
             'openSSL.client.caConfig', 'openSSL.client.verificationMode', \
             'openSSL.client.invalidCertificateHandler.name', 'interserver_http_port') \
             ORDER BY name",
            "SELECT count() FROM system.certificates",
            "SELECT * FROM remoteSecure('127.0.0.1:1', system.one)",
        ],
    );
    check_clusters(&r.rows(0), "c1", &C1_HOSTS, names::TCP_SECURE_PORT).unwrap();
    assert_eq!(
        r.rows(1),
        [
            "interserver_http_port\t9009",
            "openSSL.client.caConfig\t/etc/clickhouse-server/ca/ca.crt",
            "openSSL.client.invalidCertificateHandler.name\tRejectCertificateHandler",
            "openSSL.client.verificationMode\trelaxed",
            "openSSL.server.caConfig\t/etc/clickhouse-server/ca/ca.crt",
            "openSSL.server.certificateFile\t/etc/clickhouse-server/tls/tls.crt",
            "openSSL.server.disableProtocols\tsslv2,sslv3,tlsv1,tlsv1_1",
            "openSSL.server.loadDefaultCAFile\t0",
            "openSSL.server.privateKeyFile\t/etc/clickhouse-server/tls/tls.key",
            "openSSL.server.verificationMode\tnone",
        ]
    );
    let missing = "File not found: /etc/clickhouse-server/ca/ca.crt";
    assert!(r.error(2).contains(missing), "{}", r.error(2));
    assert!(r.error(3).contains(missing), "{}", r.error(3));

    let Some((crt, key)) = self_signed(&layout.dir.join("tls")) else {
        skipped("the TLS context part: openssl is not installed");
        return;
    };
    let paths = |mode: &str| {
        format!(
            r#"<openSSL>
        <server>
            <certificateFile>{crt}</certificateFile>
            <privateKeyFile>{key}</privateKeyFile>
            <caConfig>{crt}</caConfig>{mode}
        </server>
        <client><caConfig>{crt}</caConfig></client>
    </openSSL>"#,
            crt = crt.display(),
            key = key.display()
        )
    };
    let queries = [
        "SELECT subject, path FROM system.certificates",
        "SELECT * FROM remoteSecure('127.0.0.1:1', system.one)",
    ];
    let with_files = lay_out("tls-files", &d, "c1-1-3", &paths(""));
    let r = run(&with_files, &queries);
    assert_eq!(
        r.rows(0),
        [format!("/CN=modern-config-test-ca\t{}", crt.display())]
    );
    // The client context builds too: the connection itself is what fails (nothing listens).
    assert!(r.error(1).contains("Connection refused"), "{}", r.error(1));

    let bogus = lay_out(
        "tls-bogus",
        &d,
        "c1-1-3",
        &paths("\n            <verificationMode>bogus</verificationMode>"),
    );
    let r = run(&bogus, &queries);
    assert!(
        r.error(0).contains("Invalid verification mode"),
        "{}",
        r.error(0)
    );
}

/// docs/testing.md: with `tls.required` the plain ports are removed from the image's configuration
/// and the interserver HTTPS port replaces the HTTP one on ClickHouse 26.x (`http_port` and
/// `tcp_port` are not server settings chDB reports; their removal is not observable here).
#[test]
fn required_tls_swaps_the_interserver_port() {
    let (c, i) = tls_cluster(true);
    let d = build(&c, &i);
    let layout = lay_out("tls-required", &d, "c1-0-0", "");
    let r = run(
        &layout,
        &[
            "SELECT name, value FROM system.server_settings WHERE name IN \
             ('interserver_http_port', 'interserver_https_port') ORDER BY name",
            CLUSTERS,
        ],
    );
    assert_eq!(
        r.rows(0),
        [
            "interserver_http_port\t0".to_string(),
            format!("interserver_https_port\t{}", names::INTERSERVER_HTTPS_PORT),
        ]
    );
    check_clusters(&r.rows(1), "c1", &C1_HOSTS, names::TCP_SECURE_PORT).unwrap();
}

/// docs/security.md, "What a cluster gets": with `spec.keeper.tls` the servers' `zookeeper` section
/// names every member on the secure client port with `secure` set; the 26.x engine loads it and
/// tries exactly those members (the hosts do not resolve here, so the log naming them is the
/// proof). Keeper's own side (`tcp_port_secure`, raft `secure`, its `openSSL`) is configuration
/// only: chDB runs no Keeper and the test stand-in refuses it (`src/model/tests/tls.rs`,
/// `local-kubelet`).
#[test]
fn servers_reach_a_tls_keeper_on_its_secure_port() {
    let (c, i) = c1(serde_json::json!({
        "keeper": {"replicas": 3, "tls": true},
        "tls": {"enabled": true, "serverCertSecret": "c1-tls", "caSecret": "c1-ca"}
    }));
    let d = build(&c, &i);
    let layout = lay_out("keeper-tls", &d, "c1-1-3", "");
    let r = run(
        &layout,
        &[
            "SELECT count() FROM system.zookeeper_connection",
            "CREATE TABLE rmt (x Int32) ENGINE = ReplicatedMergeTree('/t/{cluster}/{shard}', \
             '{replica}') ORDER BY x",
        ],
    );
    r.loaded();
    let e = r.error(1);
    assert!(e.contains("ZooKeeper") || e.contains("Keeper"), "{e}");
    for m in 0..3 {
        let host = format!(
            "c1-keeper-{m}.c1-keeper-headless.t1.svc.cluster.local:{}",
            names::KEEPER_SECURE_CLIENT_PORT
        );
        assert!(
            r.log.contains(&host),
            "the log does not name {host}:\n{}",
            r.log
        );
    }
    assert!(!r.log.contains(":9181"), "a member on the plain port");
}
