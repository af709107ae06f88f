//! The generated server configuration boots a real ClickHouse server (Debian's 18.16 package).
//!
//! One replica's `config.d/` (the common ConfigMap and the replica's own) and `users.d/` (the
//! users Secret) are written into a temporary folder laid out like `/etc/clickhouse-server`, on
//! top of Debian's `config.xml` and `users.xml`. A test-only `config.d/zz-test.xml` moves ports,
//! paths and the listen address so the server runs unprivileged on 127.0.0.1 with free ports;
//! nothing else of the generated configuration is changed.
//!
//! The generated `storage_configuration` (docs/configuration.md, "Storage": a further disk and a
//! storage policy) is in the files: 18.16, older than storage policies, boots with it and ignores
//! it.
//!
//! What 18.16 cannot show: `getMacro()` does not exist there (the macros are read from
//! `system.macros` instead); the pod and Keeper hosts do not resolve outside Kubernetes, so
//! replication is not exercised here (the local kubelet tests do that). Found on 18.16: it
//! resolves every `remote_servers` host when the cluster config is loaded, and refuses the whole
//! main-config reload while one does not resolve (users reload separately and are not affected).

use clickhouse_operator::api::ShardIndex;
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use clickhouse_operator::api::ClickHouseCluster;
use clickhouse_operator::model::{
    Cluster, Desired, Inputs, Password, ReplicaSpec, config::server::REPLICA_FILE, desired, names,
};

/// A test whose tool is missing is skipped here and said so; in CI (`CI=true`, set by
/// `.ci/run`), where everything is installed, a missing tool fails it instead.
fn skipped(why: &str) {
    assert!(
        std::env::var("CI").map_or(true, |v| v != "true"),
        "{why}: in CI nothing may be skipped"
    );
    eprintln!("SKIPPED: {why}");
}

const SERVER: &str = "/usr/sbin/clickhouse-server";
const BASE: &str = "/etc/clickhouse-server";

/// A running server; killed (and its folder removed) when dropped, also when a test fails.
struct ServerGuard {
    child: Child,
    dir: PathBuf,
}

impl Drop for ServerGuard {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::env::var_os("KEEP_MODEL_BOOT_DIR").is_none() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// One HTTP GET of a query; returns (status code, body).
fn query(port: u16, user: Option<(&str, &str)>, sql: &str) -> (u16, String) {
    query_with(port, user, sql, "")
}

/// [`query`] with further URL parameters (`&name=value…`, already encoded), such as settings.
fn query_with(port: u16, user: Option<(&str, &str)>, sql: &str, params: &str) -> (u16, String) {
    let mut target = format!("/?query={}{params}", urlencoding::encode(sql));
    if let Some((u, p)) = user {
        target.push_str(&format!(
            "&user={}&password={}",
            urlencoding::encode(u),
            urlencoding::encode(p)
        ));
    }
    let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else {
        return (0, String::new());
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(10)));
    let req = format!("GET {target} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n");
    if s.write_all(req.as_bytes()).is_err() {
        return (0, String::new());
    }
    let mut resp = String::new();
    let _ = s.read_to_string(&mut resp);
    let code = resp
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = resp
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (code, body)
}

fn write(path: &Path, content: &str) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, content).unwrap();
}

fn cluster() -> ClickHouseCluster {
    let spec = serde_json::from_value(serde_json::json!({
        "shards": 2,
        "replicas": 1,
        "users": {"secretName": "c1-app-users"},
        // 18.16 predates storage policies (19.15): it must boot with them and ignore them
        "storage": {"size": "10Gi", "disks": [{"name": "cold", "size": "10Gi"}],
            "policies": {"tiered": {"volumes": [{"name": "hot", "disks": ["default"]},
                {"name": "cold", "disks": ["cold"]}]}}},
        "configuration": {
            "settings": {"max_concurrent_queries": "150", "max_connections": "2048"},
            "profiles": {"default": {"max_memory_usage": "1234567890"}},
            "quotas": {"default": {"duration": "3600", "queries": "0"}},
            "files": {"users.d/carol.xml": "<yandex><users><carol><password>carol-pw</password><networks><ip>::/0</ip></networks><profile>default</profile><quota>default</quota></carol></users></yandex>"}
        }
    }))
    .unwrap();
    let mut c = ClickHouseCluster::new("c1", spec);
    c.metadata.namespace = Some("t1".into());
    c.metadata.uid = Some("00000000-0000-4000-8000-000000000001".into());
    c
}

fn inputs() -> Inputs {
    Inputs {
        replicas: vec![
            ReplicaSpec::new("c1", ShardIndex(0), 0),
            ReplicaSpec::new("c1", ShardIndex(1), 3),
        ],
        listed: None,
        leaving: Vec::new(),
        secrets: BTreeMap::new(),
        user_passwords: BTreeMap::from([("alice".into(), Password("alice pw & <x>".into()))]),
        operator_password: Password("op3rator-pw".into()),
        interserver_password: Some(Password("int3rserver-pw".into())),
        keeper_password: Some(Password("k33per-pw".into())),
        operator_networks: vec!["10.244.0.0/16".into()],
        operator_pods: None,
        cluster_password: Some(Password("c1uster-pw".into())),
        cluster_secret: Some(Password("c1uster-secret".into())),
        exporter_password: Some(Password("exp0rter-pw".into())),
        server_version: None,
        backup_collections: Vec::new(),
    }
}

/// The names of the `users.d` files the users Secret holds.
fn users_d_files(d: &Desired) -> Vec<String> {
    d.users_secret
        .data
        .as_ref()
        .unwrap()
        .keys()
        .filter_map(|k| Some(k.strip_prefix("users-d.")?.to_string()))
        .collect()
}

fn users_file(d: &Desired) -> String {
    String::from_utf8(
        d.users_secret.data.as_ref().unwrap()[names::USERS_FILE]
            .0
            .clone(),
    )
    .unwrap()
}

/// An empty folder for one server, named after the test.
fn fresh_dir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("model-boot-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Lays out the configuration of replica `c1-1-3` in `dir` and starts the server on it.
/// `extra` is more test-only XML for `zz-test.xml` (paths of the TLS files, ports).
fn start(d: &Desired, dir: PathBuf, extra: &str) -> (ServerGuard, u16) {
    for f in ["config.xml", "users.xml"] {
        std::fs::copy(Path::new(BASE).join(f), dir.join(f)).unwrap();
    }
    for (name, content) in d.common_config.data.as_ref().unwrap() {
        write(&dir.join("config.d").join(name), content);
    }
    let replica = d
        .replica_configs
        .iter()
        .find(|c| c.metadata.name.as_deref() == Some("c1-1-3"))
        .unwrap();
    write(
        &dir.join("config.d").join(REPLICA_FILE),
        &replica.data.as_ref().unwrap()[REPLICA_FILE],
    );
    write(&dir.join("users.d").join(names::USERS_FILE), &users_file(d));
    // the users.d files of spec.configuration.files, from the users Secret (docs/changes.md)
    for file in users_d_files(d) {
        let key = names::users_d_key(&file);
        write(
            &dir.join("users.d").join(&file),
            &String::from_utf8(d.users_secret.data.as_ref().unwrap()[&key].0.clone()).unwrap(),
        );
    }
    // remote_servers is in the users Secret, projected into config.d.
    write(
        &dir.join("config.d").join(names::REMOTE_SERVERS_FILE),
        &String::from_utf8(
            d.users_secret.data.as_ref().unwrap()[names::REMOTE_SERVERS_FILE]
                .0
                .clone(),
        )
        .unwrap(),
    );
    // and so are the replication credentials
    if let Some(file) = d
        .users_secret
        .data
        .as_ref()
        .unwrap()
        .get(names::INTERSERVER_FILE)
    {
        write(
            &dir.join("config.d").join(names::INTERSERVER_FILE),
            &String::from_utf8(file.0.clone()).unwrap(),
        );
    }
    let (http, tcp, interserver) = (free_port(), free_port(), free_port());
    let data = dir.join("data");
    let test = format!(
        r#"<?xml version="1.0"?>
<clickhouse>
    <listen_host replace="replace">127.0.0.1</listen_host>
    <listen_host remove="remove"/>
    <http_port replace="replace">{http}</http_port>
    <tcp_port replace="replace">{tcp}</tcp_port>
    <interserver_http_port replace="replace">{interserver}</interserver_http_port>
    <path>{data}/</path>
    <tmp_path>{data}/tmp/</tmp_path>
    <user_files_path>{data}/user_files/</user_files_path>
    <format_schema_path>{data}/format_schemas/</format_schema_path>
    <logger>
        <log>{dir}/log/server.log</log>
        <errorlog>{dir}/log/server.err.log</errorlog>
    </logger>
    {extra}
</clickhouse>
"#,
        data = data.display(),
        dir = dir.display()
    );
    write(&dir.join("config.d").join("zz-test.xml"), &test);
    let out = std::fs::File::create(dir.join("stdout.log")).unwrap();
    let child = Command::new(SERVER)
        .arg(format!(
            "--config-file={}",
            dir.join("config.xml").display()
        ))
        .current_dir(&dir)
        .stdin(Stdio::null())
        .stdout(out.try_clone().unwrap())
        .stderr(out)
        .spawn()
        .expect("clickhouse-server starts");
    let guard = ServerGuard { child, dir };
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if query(http, None, "SELECT 1").1.trim() == "1" {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the server did not answer within 60 s; see {}",
            guard.dir.join("log").display()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    (guard, http)
}

/// The generated configuration boots 18.16, gives the macros, lets the operator and a user of
/// the users Secret log in, and applies the profile; a password change is reloaded without a
/// restart.
#[test]
fn generated_config_boots_a_real_server() {
    if !Path::new(SERVER).exists() {
        skipped(&format!("{SERVER} is not installed"));
        return;
    }
    let c = cluster();
    let mut i = inputs();
    let d = desired(&Cluster::new(&c).unwrap(), &i).unwrap();
    let server_file = &d.common_config.data.as_ref().unwrap()
        [clickhouse_operator::model::config::server::SERVER_FILE];
    assert!(
        server_file.contains("<storage_configuration>"),
        "{server_file}"
    );
    let (mut guard, port) = start(&d, fresh_dir("plain"), "");

    assert_eq!(query(port, None, "SELECT 1").1.trim(), "1");

    // Macros: getMacro() on modern servers, system.macros on 18.16 (which lacks getMacro).
    let (code, body) = query(port, None, "SELECT getMacro('replica'), getMacro('shard')");
    let macros = if code == 200 {
        body.trim().replace('\t', " ")
    } else {
        assert!(body.contains("getMacro"), "unexpected error: {body}");
        let (_, m) = query(
            port,
            None,
            "SELECT substitution FROM system.macros WHERE macro IN ('replica', 'shard') ORDER BY macro",
        );
        m.trim().replace('\n', " ")
    };
    assert_eq!(macros, "c1-1-3 1");
    let (_, cluster_macro) = query(
        port,
        None,
        "SELECT substitution FROM system.macros WHERE macro = 'cluster'",
    );
    assert_eq!(cluster_macro.trim(), "c1");

    // The operator's user and a user from the users Secret log in with their passwords, and
    // only with them.
    let op = (names::OPERATOR_USER, "op3rator-pw");
    assert_eq!(query(port, Some(op), "SELECT 1"), (200, "1\n".into()));
    let (code, body) = query(port, Some((names::OPERATOR_USER, "wrong")), "SELECT 1");
    assert_ne!(code, 200, "a wrong password was accepted: {body}");
    let alice = ("alice", "alice pw & <x>");
    assert_eq!(query(port, Some(alice), "SELECT 1"), (200, "1\n".into()));
    // a user of a users.d file from spec.configuration.files (docs/changes.md)
    assert_eq!(
        query(port, Some(("carol", "carol-pw")), "SELECT 1"),
        (200, "1\n".into())
    );

    // The users' profile from spec.configuration.profiles is in force.
    let (_, v) = query(
        port,
        Some(alice),
        "SELECT value FROM system.settings WHERE name = 'max_memory_usage'",
    );
    assert_eq!(v.trim(), "1234567890");

    // remote_servers replaced the image's example clusters with the cluster c1. Modern servers
    // list it; 18.16 resolves every host when system.clusters is read, and the pod names do not
    // resolve outside Kubernetes, so there the error naming our replica's host is the proof.
    let (code, clusters) = query(port, None, "SELECT DISTINCT cluster FROM system.clusters");
    if code == 200 {
        assert!(clusters.lines().any(|l| l == "c1"), "{clusters}");
        assert!(!clusters.contains("test_shard_localhost"), "{clusters}");
    } else {
        assert!(
            clusters.contains("c1-0-0-0.c1-headless.t1.svc.cluster.local"),
            "{clusters}"
        );
    }

    // Reload without restart: a rotated password works within seconds, same process.
    i.user_passwords
        .insert("alice".into(), Password("rotated".into()));
    let d2 = desired(&Cluster::new(&c).unwrap(), &i).unwrap();
    // 18.16 notices a change by the file's modification time in whole seconds: let the second
    // tick over (Kubernetes swaps projected files far later than that).
    std::thread::sleep(Duration::from_millis(1100));
    write(
        &guard.dir.join("users.d").join(names::USERS_FILE),
        &users_file(&d2),
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    while query(port, Some(("alice", "rotated")), "SELECT 1").0 != 200 {
        assert!(
            Instant::now() < deadline,
            "the new password was not reloaded"
        );
        std::thread::sleep(Duration::from_millis(300));
    }
    assert!(
        guard.child.try_wait().unwrap().is_none(),
        "the server restarted"
    );
}

/// With TLS the generated openSSL section, secure ports and secure remote_servers boot 18.16,
/// and the server answers over HTTPS. Only the certificate paths and ports are moved.
#[test]
fn generated_tls_config_serves_https() {
    if !Path::new(SERVER).exists() || !Path::new("/usr/bin/openssl").exists() {
        skipped("clickhouse-server or openssl is not installed");
        return;
    }
    let mut c = cluster();
    c.spec.tls.enabled = true;
    c.spec.tls.server_cert_secret = Some("c1-tls".into());
    c.spec.tls.ca_secret = Some("c1-ca".into());
    let d = desired(&Cluster::new(&c).unwrap(), &inputs()).unwrap();
    let dir = fresh_dir("tls");
    let (crt, key) = (dir.join("tls.crt"), dir.join("tls.key"));
    let ok = Command::new("openssl")
        .args([
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
        ])
        .args(["-subj", "/CN=127.0.0.1", "-keyout"])
        .arg(&key)
        .arg("-out")
        .arg(&crt)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .unwrap();
    assert!(ok.success(), "openssl failed");
    let (https, secure) = (free_port(), free_port());
    let extra = format!(
        r#"<https_port replace="replace">{https}</https_port>
    <tcp_port_secure replace="replace">{secure}</tcp_port_secure>
    <openSSL>
        <server>
            <certificateFile>{crt}</certificateFile>
            <privateKeyFile>{key}</privateKeyFile>
            <caConfig>{crt}</caConfig>
        </server>
        <client><caConfig>{crt}</caConfig></client>
    </openSSL>"#,
        crt = crt.display(),
        key = key.display()
    );
    let (_guard, _) = start(&d, dir, &extra);
    let out = Command::new("curl")
        .args(["-sk", "--max-time", "10"])
        .arg(format!("https://127.0.0.1:{https}/?query=SELECT%2042"))
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "42");
}

/// Decision 33: why the cluster `<secret>` waits for every server to report 20.10 or later. The
/// files as written for such servers (the secret in `remote_servers`, `<grants>` for the
/// operator's account) on 18.16: the server starts and every account logs in (it ignores
/// `<grants>`), but it refuses the `remote_servers` with the secret (Code 137, "Unknown element
/// in config: secret", when `system.clusters` or a Distributed query loads the clusters);
/// written for the version the servers report, the same configuration has neither.
#[test]
fn the_cluster_secret_is_refused_by_18_16_and_grants_are_ignored() {
    if !Path::new(SERVER).exists() {
        skipped(&format!("{SERVER} is not installed"));
        return;
    }
    let c = cluster();
    let mut i = inputs();
    i.server_version = Some("24.8.4.13".parse().unwrap());
    let d = desired(&Cluster::new(&c).unwrap(), &i).unwrap();
    let remote = String::from_utf8(
        d.users_secret.data.as_ref().unwrap()[names::REMOTE_SERVERS_FILE]
            .0
            .clone(),
    )
    .unwrap();
    assert!(
        remote.contains("<secret hide_in_preprocessed=\"true\">c1uster-secret</secret>"),
        "{remote}"
    );
    assert!(users_file(&d).contains("<grants>"));
    let (guard, port) = start(&d, fresh_dir("secret"), "");
    let op = (names::OPERATOR_USER, "op3rator-pw");
    assert_eq!(query(port, Some(op), "SELECT 1"), (200, "1\n".into()));
    assert_eq!(
        query(port, Some(("alice", "alice pw & <x>")), "SELECT 1"),
        (200, "1\n".into())
    );
    // 18.16 reads remote_servers when system.clusters is first read, and refuses it
    let (code, body) = query(
        port,
        None,
        "SELECT count() FROM system.clusters WHERE cluster = 'c1'",
    );
    assert_ne!(code, 200, "18.16 accepted the cluster secret: {body}");
    assert!(
        body.contains("Code: 137") && body.contains("Unknown element in config: secret"),
        "{body}"
    );
    drop(guard);
    // the same cluster, written for the version the servers report (18.16): no secret
    i.server_version = Some("18.16.1".parse().unwrap());
    let d = desired(&Cluster::new(&c).unwrap(), &i).unwrap();
    assert!(!users_file(&d).contains("<grants>"));
    let (_guard, port) = start(&d, fresh_dir("no-secret"), "");
    let (_, body) = query(
        port,
        None,
        "SELECT count() FROM system.clusters WHERE cluster = 'c1'",
    );
    assert!(!body.contains("Unknown element"), "{body}");
}

/// Decision 49: before any server reported its version, the system log TTLs are written for the
/// version the image tag names (24.8 here), so an 18.16 server may start with them, as the
/// servers of the local Kubernetes do: it boots, writes its query log and ignores the `<ttl>`
/// (18.16 has no table TTL). Once 18.16 is reported, the file holds no table at all.
#[test]
fn system_log_ttls_written_for_the_image_tag_boot_18_16_which_ignores_them() {
    use clickhouse_operator::model::config::system_logs::SYSTEM_LOGS_FILE;
    if !Path::new(SERVER).exists() {
        skipped(&format!("{SERVER} is not installed"));
        return;
    }
    let c = cluster();
    let mut i = inputs();
    let d = desired(&Cluster::new(&c).unwrap(), &i).unwrap();
    let file = &d.common_config.data.as_ref().unwrap()[SYSTEM_LOGS_FILE];
    assert!(
        file.contains("<query_log>") && file.contains("INTERVAL 30 DAY"),
        "{file}"
    );
    let (_guard, port) = start(&d, fresh_dir("system-logs"), "");
    let op = (names::OPERATOR_USER, "op3rator-pw");
    assert_eq!(
        query_with(port, Some(op), "SELECT 1", "&log_queries=1"),
        (200, "1\n".into())
    );
    // the query log is flushed every 7.5 s (SYSTEM FLUSH LOGS is not allowed over GET)
    let deadline = Instant::now() + Duration::from_secs(30);
    let engine = loop {
        let (code, engine) = query(
            port,
            Some(op),
            "SELECT engine_full FROM system.tables WHERE database = 'system' AND name = 'query_log'",
        );
        assert_eq!(code, 200, "{engine}");
        if engine.contains("MergeTree") {
            break engine;
        }
        assert!(Instant::now() < deadline, "no query_log after 30 s");
        std::thread::sleep(Duration::from_millis(500));
    };
    assert!(!engine.contains("TTL"), "{engine}");

    i.server_version = Some("18.16.1".parse().unwrap());
    let d = desired(&Cluster::new(&c).unwrap(), &i).unwrap();
    let file = &d.common_config.data.as_ref().unwrap()[SYSTEM_LOGS_FILE];
    assert!(!file.contains("_log"), "{file}");
}

/// `spec.logging` on 18.16: the server boots with the generated logger (size, count, and the
/// JSON `formatting` element, which 18.16 predates and ignores: it logs text), logs at the
/// spec's level, and a new level is reloaded without a restart (docs/changes.md).
#[test]
fn the_log_level_of_spec_logging_is_in_force_and_reloaded_on_18_16() {
    use clickhouse_operator::model::config::server::RUNTIME_FILE;
    if !Path::new(SERVER).exists() {
        skipped(&format!("{SERVER} is not installed"));
        return;
    }
    let logging = |level: &str| {
        let mut c = cluster();
        c.spec.logging = serde_json::from_value(serde_json::json!({"level": level,
            "format": "Json", "size": "10M", "count": 2}))
        .unwrap();
        c
    };
    let i = inputs();
    let c = logging("information");
    let d = desired(&Cluster::new(&c).unwrap(), &i).unwrap();
    let (guard, port) = start(&d, fresh_dir("logging"), "");
    let log = guard.dir.join("log").join("server.log");
    let read = || std::fs::read_to_string(&log).unwrap_or_default();
    assert_eq!(query(port, None, "SELECT 1").1.trim(), "1");
    assert!(read().contains("<Information>"), "{}", read());
    assert!(!read().contains("<Debug>"), "debug lines at information");
    assert!(!read().trim_start().starts_with('{'), "18.16 wrote JSON");

    let d2 = desired(&Cluster::new(&logging("trace")).unwrap(), &i).unwrap();
    std::thread::sleep(Duration::from_millis(1100));
    write(
        &guard.dir.join("config.d").join(RUNTIME_FILE),
        &d2.common_config.data.as_ref().unwrap()[RUNTIME_FILE],
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        query(port, None, "SELECT 1");
        if read().contains("<Trace>") || read().contains("<Debug>") {
            break;
        }
        assert!(Instant::now() < deadline, "the new level was not reloaded");
        std::thread::sleep(Duration::from_millis(300));
    }
    let mut guard = guard;
    assert!(
        guard.child.try_wait().unwrap().is_none(),
        "the server restarted"
    );
}

/// Passwords not in the clear, on 18.16: a users Secret key `<user>.sha256_hex` holds the
/// SHA-256 of the password, and that user logs in with the password (and not with another, nor
/// with the hash itself).
#[test]
fn a_user_given_by_its_sha256_hash_logs_in_with_the_password_on_18_16() {
    use sha2::{Digest, Sha256};
    if !Path::new(SERVER).exists() {
        skipped(&format!("{SERVER} is not installed"));
        return;
    }
    let c = cluster();
    let mut i = inputs();
    let hash = hex::encode(Sha256::digest(b"dave pw & <y>"));
    i.user_passwords
        .insert("dave.sha256_hex".into(), Password(hash.clone()));
    let d = desired(&Cluster::new(&c).unwrap(), &i).unwrap();
    let users = users_file(&d);
    assert!(users.contains(&hash), "{users}");
    assert!(!users.contains("dave.sha256_hex"), "{users}");
    let (_guard, port) = start(&d, fresh_dir("hashed-user"), "");
    assert_eq!(
        query(port, Some(("dave", "dave pw & <y>")), "SELECT 1"),
        (200, "1\n".into())
    );
    assert_ne!(query(port, Some(("dave", "wrong")), "SELECT 1").0, 200);
    assert_ne!(query(port, Some(("dave", &hash)), "SELECT 1").0, 200);
}
