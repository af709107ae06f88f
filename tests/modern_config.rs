//! The server configuration and users files the operator generates load in a current ClickHouse
//! engine (docs/testing.md, "What is proven on which ClickHouse"): chDB 4.4, the ClickHouse 26.x
//! engine as a Python module (installed from PyPI by `hack/chdb.sh`), is started on them with
//! `chdb.connect(':memory:?config-file=…')`, and its own system tables are read back.
//!
//! Layout: one replica's files are written into a temporary folder as the server pod has them
//! under `/etc/clickhouse-server` (see `src/model/statefulset.rs`): `config.d/` holds the common
//! ConfigMap (the operator's files and `spec.configuration.files`), the replica's own ConfigMap
//! and `remote_servers` from the users Secret; `users.d/` holds the users file from the users
//! Secret. Underneath lie a small `config.xml` and `users.xml` standing in for the image's own
//! (the parts the generated files override or rely on: ports, `openSSL`, an example cluster,
//! `user_directories`, the passwordless `default` user). Test-only files, named `zz-test.xml` so
//! they merge last, only move the log files into the temporary folder (chDB honours `logger`,
//! and would otherwise write into `/var/log/clickhouse-server`), let the `default` user read the
//! access system tables (`access_management`) and show password hashes
//! (`display_secrets_in_show_and_select`); the TLS test also moves the certificate paths.
//!
//! What the 26.x engine proves here: every generated file merges (malformed XML fails the
//! load, see the negative tests); the users file is accepted, including every profile setting
//! (an unknown setting name fails the load); `system.clusters` lists exactly the cluster of the
//! spec with the pods' DNS names, the secure port with TLS and the operator's user;
//! `system.macros` and `interserver_http_host` are the replica's; profiles, quotas, users, their
//! profiles, networks and SHA-256 password hashes are what the spec and the Secrets say;
//! settings of the settings file and nested settings (`merge_tree/…`) are in force; the Keeper
//! nodes are the ones ReplicatedMergeTree tries; the generated `openSSL` server and client
//! sections build TLS contexts (with a test certificate), and an invalid value there is refused.
//!
//! What it does not prove: chDB has no network listeners, so ports are parsed, not served, and
//! `listen_host` is not exercised; nobody logs in (chDB's session is always `default`), so
//! passwords are compared as hashes, not used; the Keeper and pod hosts do not resolve here, so
//! nothing is replicated; chDB does not apply `max_concurrent_queries` (it reports 0 whatever
//! the file says) and forces `logger.level` to `trace`, so neither can be read back; what a
//! real 26.x server does at startup beyond loading the configuration (binding ports, the
//! `path`, access storage on disk) is not run.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde::Deserialize;

use clickhouse_operator::api::ClickHouseCluster;
use clickhouse_operator::model::config::server::{RUNTIME_FILE, SERVER_FILE};
use clickhouse_operator::model::{Cluster, Desired, Inputs, Password, ReplicaSpec, desired, names};

/// Stand-in for the image's `config.xml`: the image's values of what the generated files
/// override (ports, logger, `openSSL`, an example cluster in `remote_servers`) and the
/// `user_directories` entry that makes the server read `users.xml` and merge `users.d/`.
const BASE_CONFIG: &str = r#"<?xml version="1.0"?>
<clickhouse>
    <logger>
        <level>trace</level>
        <log>/var/log/clickhouse-server/clickhouse-server.log</log>
        <errorlog>/var/log/clickhouse-server/clickhouse-server.err.log</errorlog>
        <size>1000M</size>
        <count>10</count>
    </logger>
    <http_port>8123</http_port>
    <tcp_port>9000</tcp_port>
    <mysql_port>9004</mysql_port>
    <postgresql_port>9005</postgresql_port>
    <interserver_http_port>9009</interserver_http_port>
    <max_connections>4096</max_connections>
    <max_concurrent_queries>1000</max_concurrent_queries>
    <openSSL>
        <server>
            <verificationMode>none</verificationMode>
            <loadDefaultCAFile>true</loadDefaultCAFile>
            <cacheSessions>true</cacheSessions>
            <disableProtocols>sslv2,sslv3</disableProtocols>
            <preferServerCiphers>true</preferServerCiphers>
            <invalidCertificateHandler><name>RejectCertificateHandler</name></invalidCertificateHandler>
        </server>
        <client>
            <loadDefaultCAFile>true</loadDefaultCAFile>
            <cacheSessions>true</cacheSessions>
            <disableProtocols>sslv2,sslv3</disableProtocols>
            <preferServerCiphers>true</preferServerCiphers>
            <invalidCertificateHandler><name>RejectCertificateHandler</name></invalidCertificateHandler>
        </client>
    </openSSL>
    <user_directories>
        <users_xml><path>users.xml</path></users_xml>
    </user_directories>
    <remote_servers>
        <default>
            <shard><replica><host>localhost</host><port>9000</port></replica></shard>
        </default>
    </remote_servers>
    <distributed_ddl><path>/clickhouse/task_queue/ddl</path></distributed_ddl>
</clickhouse>
"#;

/// Stand-in for the image's `users.xml`: the passwordless `default` user, profiles `default`
/// and `readonly`, quota `default`.
const BASE_USERS: &str = r#"<?xml version="1.0"?>
<clickhouse>
    <profiles>
        <default/>
        <readonly><readonly>1</readonly></readonly>
    </profiles>
    <users>
        <default>
            <password></password>
            <networks><ip>::/0</ip></networks>
            <profile>default</profile>
            <quota>default</quota>
        </default>
    </users>
    <quotas>
        <default>
            <interval>
                <duration>3600</duration>
                <queries>0</queries>
                <errors>0</errors>
                <result_rows>0</result_rows>
                <read_rows>0</read_rows>
                <execution_time>0</execution_time>
            </interval>
        </default>
    </quotas>
</clickhouse>
"#;

/// Test-only users file: lets the chDB session (always `default`) read `system.users`,
/// `system.settings_profile_elements`, `system.quotas` and `SHOW CREATE USER`.
const TEST_USERS: &str = r#"<?xml version="1.0"?>
<clickhouse>
    <users><default><access_management>1</access_management></default></users>
</clickhouse>
"#;

mod chdb;
use chdb::chdb_python;

/// A test whose tool is missing is skipped here and said so; in CI (`CI=true`, set by
/// `.ci/run`), where everything is installed, a missing tool fails it instead.
fn skipped(why: &str) {
    assert!(
        std::env::var("CI").map_or(true, |v| v != "true"),
        "{why}: in CI nothing may be skipped"
    );
    eprintln!("SKIPPED: {why}");
}

const UID: &str = "00000000-0000-4000-8000-000000000016";

/// One replica's configuration laid out like `/etc/clickhouse-server`; removed when dropped
/// unless `KEEP_MODERN_CONFIG_DIR` is set.
struct Layout {
    dir: PathBuf,
}

impl Drop for Layout {
    fn drop(&mut self) {
        if std::env::var_os("KEEP_MODERN_CONFIG_DIR").is_none() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

impl Layout {
    fn config_d(&self, name: &str) -> PathBuf {
        self.dir.join("config.d").join(name)
    }

    fn users_d(&self, name: &str) -> PathBuf {
        self.dir.join("users.d").join(name)
    }

    fn read(&self, path: &Path) -> String {
        std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    }

    /// Replaces the content of one file of the layout.
    fn rewrite(&self, path: &Path, f: impl FnOnce(String) -> String) {
        let new = f(self.read(path));
        write(path, &new);
    }
}

fn write(path: &Path, content: &str) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, content).unwrap();
}

fn secret_file(d: &Desired, key: &str) -> String {
    String::from_utf8(d.users_secret.data.as_ref().unwrap()[key].0.clone()).unwrap()
}

/// Writes the files replica `replica` mounts (as `server_volumes` in `src/model/statefulset.rs`
/// projects them) into a fresh folder. `extra` is more test-only XML for `config.d/zz-test.xml`.
fn lay_out(tag: &str, d: &Desired, replica: &str, extra: &str) -> Layout {
    let dir = std::env::temp_dir().join(format!("modern-config-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let layout = Layout { dir };
    write(&layout.dir.join("config.xml"), BASE_CONFIG);
    write(&layout.dir.join("users.xml"), BASE_USERS);
    // config.d: the common ConfigMap, the replica's ConfigMap, remote_servers and the
    // replication credentials from the Secret.
    for (name, content) in d.common_config.data.as_ref().unwrap() {
        write(&layout.config_d(name), content);
    }
    let own = d
        .replica_configs
        .iter()
        .find(|c| c.metadata.name.as_deref() == Some(replica))
        .unwrap_or_else(|| panic!("no ConfigMap of replica {replica}"));
    for (name, content) in own.data.as_ref().unwrap() {
        write(&layout.config_d(name), content);
    }
    write(
        &layout.config_d(names::REMOTE_SERVERS_FILE),
        &secret_file(d, names::REMOTE_SERVERS_FILE),
    );
    // and the replication credentials, as the pod projects them
    write(
        &layout.config_d(names::INTERSERVER_FILE),
        &secret_file(d, names::INTERSERVER_FILE),
    );
    // users.d: the users file from the Secret.
    write(
        &layout.users_d(names::USERS_FILE),
        &secret_file(d, names::USERS_FILE),
    );
    let log = layout.dir.join("log");
    write(
        &layout.config_d("zz-test.xml"),
        &format!(
            r#"<?xml version="1.0"?>
<clickhouse>
    <logger>
        <log>{log}/server.log</log>
        <errorlog>{log}/server.err.log</errorlog>
        <console>0</console>
    </logger>
    <display_secrets_in_show_and_select>1</display_secrets_in_show_and_select>
    {extra}
</clickhouse>
"#,
            log = log.display()
        ),
    );
    write(&layout.users_d("zz-test.xml"), TEST_USERS);
    layout
}

/// What chDB said about one layout.
#[derive(Debug)]
struct Run {
    /// Why `chdb.connect` refused the configuration, if it did.
    load_error: Option<String>,
    /// Per query: the rows (each value as text, NULL as `None`) or the error.
    results: Vec<Result<Vec<Vec<Option<String>>>, String>>,
    /// chDB's own stderr (details of a load error go there).
    stderr: String,
    /// The server log written while running.
    log: String,
}

impl Run {
    fn loaded(&self) -> &Self {
        assert!(
            self.load_error.is_none(),
            "chDB refused the configuration: {:?}\n{}",
            self.load_error,
            self.stderr
        );
        self
    }

    /// The rows of query `i`, each row's values joined by tabs (NULL as `\N`).
    fn rows(&self, i: usize) -> Vec<String> {
        match &self.loaded().results[i] {
            Ok(rows) => rows
                .iter()
                .map(|r| {
                    r.iter()
                        .map(|v| v.as_deref().unwrap_or("\\N"))
                        .collect::<Vec<_>>()
                        .join("\t")
                })
                .collect(),
            Err(e) => panic!("query {i} failed: {e}"),
        }
    }

    /// The error of query `i`, which must have failed.
    fn error(&self, i: usize) -> &str {
        match &self.loaded().results[i] {
            Ok(rows) => panic!("query {i} succeeded: {rows:?}"),
            Err(e) => e,
        }
    }
}

/// Starts chDB on the layout's `config.xml` in a fresh Python process and runs `queries` in
/// one session.
fn run(layout: &Layout, queries: &[&str]) -> Run {
    run_with_env(layout, queries, &[])
}

/// [`run`] with environment variables set for the engine, as a pod sets them.
fn run_with_env(layout: &Layout, queries: &[&str], env: &[(&str, &str)]) -> Run {
    const SCRIPT: &str = r#"
import json, sys
req = json.load(sys.stdin)
out = {"load_error": None, "results": []}
try:
    import chdb
    conn = chdb.connect(":memory:?config-file=" + req["config"])
except Exception as e:
    out["load_error"] = "%s: %s" % (type(e).__name__, e)
else:
    cur = conn.cursor()
    for q in req["queries"]:
        try:
            cur.execute(q)
            rows = cur.fetchall() or ()
            out["results"].append({"rows": [[None if v is None else str(v) for v in r] for r in rows]})
        except Exception as e:
            out["results"].append({"error": str(e)})
    conn.close()
sys.stdout.write("\nMODERN-CONFIG-RESULT " + json.dumps(out) + "\n")
"#;
    let request = serde_json::json!({
        "config": layout.dir.join("config.xml"),
        "queries": queries,
    });
    let mut child = Command::new(chdb_python())
        .args(["-c", SCRIPT])
        .envs(env.iter().copied())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run chDB");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(request.to_string().as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let json = stdout
        .lines()
        .find_map(|l| l.strip_prefix("MODERN-CONFIG-RESULT "))
        .unwrap_or_else(|| panic!("chDB's script failed ({}):\n{stdout}\n{stderr}", out.status));
    let v: serde_json::Value = serde_json::from_str(json).unwrap();
    let text = |v: &serde_json::Value| v.as_str().unwrap_or_default().to_string();
    let results = v["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| match r.get("rows") {
            Some(rows) => Ok(rows
                .as_array()
                .unwrap()
                .iter()
                .map(|row| {
                    row.as_array()
                        .unwrap()
                        .iter()
                        .map(|x| x.as_str().map(str::to_string))
                        .collect()
                })
                .collect()),
            None => Err(text(&r["error"])),
        })
        .collect();
    Run {
        load_error: v["load_error"].as_str().map(str::to_string),
        results,
        stderr,
        log: std::fs::read_to_string(layout.dir.join("log").join("server.log")).unwrap_or_default(),
    }
}

/// `system.clusters`, one row per host: cluster, shard, replica, host, port, user, internal
/// replication.
const CLUSTERS: &str = "SELECT cluster, shard_num, replica_num, host_name, port, user, \
     internal_replication FROM system.clusters ORDER BY cluster, shard_num, replica_num";

/// Checks the rows of [`CLUSTERS`]: exactly `shards`, each a list of pod host names, in the
/// cluster `cluster`, on `port`, as the cluster's own account (decision 27: not the operator's).
/// Nothing else (no example cluster of the image).
fn check_clusters(
    rows: &[String],
    cluster: &str,
    shards: &[&[&str]],
    port: i32,
) -> Result<(), String> {
    let expected: Vec<String> = shards
        .iter()
        .enumerate()
        .flat_map(|(s, hosts)| {
            hosts.iter().enumerate().map(move |(r, host)| {
                format!(
                    "{cluster}\t{}\t{}\t{host}\t{port}\t{}\t1",
                    s + 1,
                    r + 1,
                    names::CLUSTER_USER
                )
            })
        })
        .collect();
    if rows == expected.as_slice() {
        Ok(())
    } else {
        Err(format!(
            "system.clusters:\n{}\nexpected:\n{}",
            rows.join("\n"),
            expected.join("\n")
        ))
    }
}

fn cluster_from(name: &str, namespace: &str, spec: serde_json::Value) -> ClickHouseCluster {
    let mut c = ClickHouseCluster::new(name, serde_json::from_value(spec).unwrap());
    c.metadata.namespace = Some(namespace.into());
    c.metadata.uid = Some(UID.into());
    c
}

/// Replicas of `shards` × `per_shard`, creation indexes in shard order.
fn replicas(cluster: &str, shards: i32, per_shard: i64) -> Vec<ReplicaSpec> {
    (0..shards)
        .flat_map(|s| {
            (0..per_shard).map(move |i| ReplicaSpec::new(cluster, s, i64::from(s) * per_shard + i))
        })
        .collect()
}

fn inputs(replicas: Vec<ReplicaSpec>, users: &[(&str, &str)]) -> Inputs {
    Inputs {
        replicas,
        listed: None,
        secrets: BTreeMap::new(),
        user_passwords: users
            .iter()
            .map(|(u, p)| (u.to_string(), Password(p.to_string())))
            .collect(),
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

fn build(c: &ClickHouseCluster, i: &Inputs) -> Desired {
    desired(&Cluster::new(c).unwrap(), i).unwrap()
}

/// A 2 × 2 cluster `c1` in `t1` with the given extra spec fields, Secret users `alice`, `bob`.
fn c1(extra: serde_json::Value) -> (ClickHouseCluster, Inputs) {
    let mut spec = serde_json::json!({"shards": 2, "replicas": 2});
    spec.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    (
        cluster_from("c1", "t1", spec),
        inputs(
            replicas("c1", 2, 2),
            &[("alice", "alice pw & <x>"), ("bob", "bob-pw")],
        ),
    )
}

const C1_HOSTS: [&[&str]; 2] = [
    &[
        "c1-0-0-0.c1-headless.t1.svc.cluster.local",
        "c1-0-1-0.c1-headless.t1.svc.cluster.local",
    ],
    &[
        "c1-1-2-0.c1-headless.t1.svc.cluster.local",
        "c1-1-3-0.c1-headless.t1.svc.cluster.local",
    ],
];

/// docs/testing.md: the example cluster of `deploy/examples/cluster.yaml` (2 shards × 2 replicas,
/// 3 Keeper members, its users Secret) loads on ClickHouse 26.x as replica `demo-1-3`:
/// `system.clusters` lists exactly the 2 × 2 pods of `demo` (the image's example cluster is
/// replaced), the macros and `interserver_http_host` are the replica's, the default profile's
/// `max_memory_usage` is in effect, the Secret's user exists with its profile, and a
/// ReplicatedMergeTree table expands the macros and tries exactly the three Keeper members.
#[test]
fn example_cluster_loads_with_its_clusters_macros_profile_and_keeper_nodes() {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/deploy/examples/cluster.yaml"
    ))
    .unwrap();
    let docs: Vec<serde_yaml::Value> = serde_yaml::Deserializer::from_str(&text)
        .map(|d| serde_yaml::Value::deserialize(d).unwrap())
        .collect();
    let mut c: ClickHouseCluster = serde_yaml::from_value(docs[0].clone()).unwrap();
    c.metadata.uid = Some(UID.into());
    let secret = docs
        .iter()
        .find(|d| d["kind"].as_str() == Some("Secret"))
        .expect("the example has a users Secret");
    assert_eq!(
        c.spec.users.as_ref().map(|u| u.secret_name.as_str()),
        secret["metadata"]["name"].as_str()
    );
    let users: Vec<(String, String)> = secret["stringData"]
        .as_mapping()
        .unwrap()
        .iter()
        .map(|(k, v)| {
            (
                k.as_str().unwrap().to_string(),
                v.as_str().unwrap().to_string(),
            )
        })
        .collect();
    let users: Vec<(&str, &str)> = users
        .iter()
        .map(|(u, p)| (u.as_str(), p.as_str()))
        .collect();
    assert_eq!((c.spec.shards, c.spec.replicas), (2, 2));
    let d = build(&c, &inputs(replicas("demo", 2, 2), &users));
    let layout = lay_out("example", &d, "demo-1-3", "");
    let r = run(
        &layout,
        &[
            CLUSTERS,
            "SELECT macro, substitution FROM system.macros ORDER BY macro",
            "SELECT getMacro('cluster'), getMacro('shard'), getMacro('replica')",
            "SELECT value FROM system.server_settings WHERE name = 'interserver_http_host'",
            "SELECT getSetting('max_memory_usage')",
            "SELECT name, auth_type FROM system.users WHERE name = 'analyst'",
            "SELECT user_name, inherit_profile FROM system.settings_profile_elements \
             WHERE user_name = 'analyst'",
            "CREATE TABLE rmt (x Int32) ENGINE = ReplicatedMergeTree('/t/{cluster}/{shard}', \
             '{replica}') ORDER BY x",
        ],
    );
    check_clusters(
        &r.rows(0),
        "demo",
        &[
            &[
                "demo-0-0-0.demo-headless.demo.svc.cluster.local",
                "demo-0-1-0.demo-headless.demo.svc.cluster.local",
            ],
            &[
                "demo-1-2-0.demo-headless.demo.svc.cluster.local",
                "demo-1-3-0.demo-headless.demo.svc.cluster.local",
            ],
        ],
        names::TCP_PORT,
    )
    .unwrap();
    assert_eq!(
        r.rows(1),
        ["cluster\tdemo", "replica\tdemo-1-3", "shard\t1"]
    );
    assert_eq!(r.rows(2), ["demo\t1\tdemo-1-3"]);
    assert_eq!(
        r.rows(3),
        ["demo-1-3-0.demo-headless.demo.svc.cluster.local"]
    );
    assert_eq!(r.rows(4), ["10000000000"]);
    assert_eq!(r.rows(5), ["analyst\t['sha256_password']"]);
    assert_eq!(r.rows(6), ["analyst\tdefault"]);
    // The macros expand (a missing one fails with NO_ELEMENTS_IN_CONFIG) and ZooKeeper is
    // configured (without it: NO_ZOOKEEPER); the pods' Keeper hosts do not resolve here.
    let e = r.error(7);
    assert!(
        e.contains("Cannot use any of provided ZooKeeper nodes"),
        "{e}"
    );
    for i in 0..3 {
        let host = format!(
            "Cannot use ZooKeeper host demo-keeper-{i}.demo-keeper-headless.demo.svc.cluster.local:{}",
            names::KEEPER_CLIENT_PORT
        );
        assert!(r.log.contains(&host), "the log does not name {host}");
    }
    assert!(!r.log.contains("demo-keeper-3"), "a fourth Keeper node");
}

/// docs/testing.md: `spec.configuration.settings`, `profiles`, `quotas` and a users Secret load on
/// ClickHouse 26.x: the settings file overrides the image (`max_connections`), nested and
/// reloadable settings are in force, every profile and its settings are in
/// `system.settings_profile_elements`, the Secret's users get `spec.users.profile` and the
/// operator's user the default profile, all with SHA-256 hashes of their passwords (as the
/// engine computes them), each account only from its networks (decision 27: the operator's, an
/// account's own, the cluster's pods by name for the cluster's account and `default`); the
/// quota's limits are in `system.quota_limits`.
#[test]
fn settings_profiles_quotas_and_users_are_in_force() {
    let (c, i) = c1(serde_json::json!({
        "users": {"secretName": "c1-app-users", "profile": "app",
                  "accounts": {"bob": {"networks": ["198.18.0.0/16", "fd00::/8"], "databases": ["sales"]}}},
        "configuration": {
            "settings": {
                "max_concurrent_queries": "150",
                "max_connections": "2048",
                "max_table_size_to_drop": "123456",
                "merge_tree/parts_to_throw_insert": "777"
            },
            "profiles": {
                "default": {"max_memory_usage": "1234567890", "max_execution_time": "60"},
                "app": {"max_threads": "3", "readonly": "1"}
            },
            "quotas": {"default": {"duration": "3600", "queries": "1000", "errors": "50"}}
        }
    }));
    let d = build(&c, &i);
    let layout = lay_out("settings", &d, "c1-0-1", "");
    let r = run(
        &layout,
        &[
            "SELECT name, value FROM system.server_settings WHERE name IN \
             ('max_connections', 'max_table_size_to_drop') ORDER BY name",
            "SELECT value FROM system.merge_tree_settings WHERE name = 'parts_to_throw_insert'",
            "SELECT name, value FROM system.settings WHERE name IN \
             ('max_memory_usage', 'max_execution_time') ORDER BY name",
            "SELECT profile_name, setting_name, value FROM system.settings_profile_elements \
             WHERE profile_name IS NOT NULL ORDER BY profile_name, setting_name",
            "SELECT user_name, inherit_profile FROM system.settings_profile_elements \
             WHERE user_name IS NOT NULL ORDER BY user_name",
            "SELECT name, auth_type, host_ip, host_names, host_names_regexp FROM system.users \
             ORDER BY name",
            "SELECT quota_name, duration, max_queries, max_errors FROM system.quota_limits",
            "SELECT arraySort(apply_to_list) FROM system.quotas WHERE name = 'default'",
            "SHOW CREATE USER alice SETTINGS format_display_secrets_in_show_and_select = 1",
            "SELECT upper(hex(SHA256('alice pw & <x>')))",
            "SHOW CREATE USER clickhouse_operator SETTINGS format_display_secrets_in_show_and_select = 1",
            "SELECT upper(hex(SHA256('op3rator-pw')))",
            CLUSTERS,
            "SELECT substitution FROM system.macros WHERE macro = 'replica'",
        ],
    );
    assert_eq!(
        r.rows(0),
        ["max_connections\t2048", "max_table_size_to_drop\t123456"]
    );
    assert_eq!(r.rows(1), ["777"]);
    assert_eq!(
        r.rows(2),
        ["max_execution_time\t60", "max_memory_usage\t1234567890"]
    );
    assert_eq!(
        r.rows(3),
        [
            "app\tmax_threads\t3",
            "app\treadonly\t1",
            // decision 36: the exporter's account reads and sets nothing but its session
            "clickhouse_exporter\tmax_execution_time\t10",
            "clickhouse_exporter\treadonly\t2",
            "default\tmax_execution_time\t60",
            "default\tmax_memory_usage\t1234567890",
            // the operator's own: a stopping server waits at most 1 s for an idle connection
            "default\tpoll_interval\t1",
            "readonly\treadonly\t1",
        ]
    );
    assert_eq!(
        r.rows(4),
        [
            "alice\tapp",
            "bob\tapp",
            "clickhouse_cluster\tdefault",
            "clickhouse_exporter\tclickhouse_exporter",
            "clickhouse_operator\tdefault",
            "default\tdefault"
        ]
    );
    // decision 27: every account only from its networks (the IPv4-mapped form of an IPv4 network
    // is taken as it is); the cluster's account and `default` from the cluster's pods by name
    let servers = C1_HOSTS
        .iter()
        .flat_map(|shard| shard.iter())
        .map(|h| format!("'{h}'"))
        .collect::<Vec<_>>()
        .join(", ");
    assert_eq!(
        r.rows(5),
        [
            // ::1 and 127.0.0.1 are shown as `localhost`.
            "alice\t['sha256_password']\t['::ffff:10.244.0.0/112']\t['localhost']\t[]".to_string(),
            "bob\t['sha256_password']\t['::ffff:198.18.0.0/112', 'fd00::/8']\t['localhost']\t[]".to_string(),
            format!("clickhouse_cluster\t['sha256_password']\t[]\t['localhost', {servers}]\t[]"),
            "clickhouse_exporter\t['sha256_password']\t['::ffff:10.244.0.0/112']\t['localhost']\t[]".to_string(),
            "clickhouse_operator\t['sha256_password']\t['::ffff:10.244.0.0/112']\t['localhost']\t[]".to_string(),
            format!("default\t['plaintext_password']\t[]\t['localhost', {servers}]\t[]"),
        ]
    );
    assert_eq!(r.rows(6), ["default\t3600\t1000\t50"]);
    assert_eq!(
        r.rows(7),
        [
            "['alice', 'bob', 'clickhouse_cluster', 'clickhouse_exporter', 'clickhouse_operator', 'default']"
        ]
    );
    let alice = &r.rows(8)[0];
    assert!(
        alice.contains(&format!("sha256_hash BY '{}'", r.rows(9)[0])),
        "{alice}"
    );
    assert!(alice.contains("SETTINGS PROFILE `app`"), "{alice}");
    let op = &r.rows(10)[0];
    assert!(
        op.contains(&format!("sha256_hash BY '{}'", r.rows(11)[0])),
        "{op}"
    );
    check_clusters(&r.rows(12), "c1", &C1_HOSTS, names::TCP_PORT).unwrap();
    assert_eq!(r.rows(13), ["c1-0-1"]);
}

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

/// The custom files of the tests below: one adds a cluster, one sets a nested setting the
/// spec also sets and overrides a setting of the spec.
fn custom_files() -> serde_json::Value {
    serde_json::json!({
        "50-extra-cluster.xml": "<clickhouse><remote_servers><analytics><shard><replica>\
            <host>analytics.example.com</host><port>9000</port></replica></shard>\
            </analytics></remote_servers></clickhouse>",
        "60-tuning.xml": "<?xml version=\"1.0\"?>\n<clickhouse>\n  <merge_tree>\n    \
            <parts_to_throw_insert>700</parts_to_throw_insert>\n  </merge_tree>\n  \
            <max_connections>3000</max_connections>\n</clickhouse>\n"
    })
}

/// docs/testing.md: `spec.configuration.files` load on ClickHouse 26.x next to the operator's files
/// and merge after them (their names sort after `00-operator-`): a custom cluster is added to
/// the operator's `remote_servers`, and where a custom file and the spec's settings set the
/// same element (nested or not), the custom file wins — the later file in name order wins.
#[test]
fn custom_files_merge_after_the_operators_files() {
    let (c, i) = c1(serde_json::json!({
        "configuration": {
            "settings": {"max_connections": "2048", "merge_tree/parts_to_throw_insert": "500"},
            "files": custom_files()
        }
    }));
    let d = build(&c, &i);
    let layout = lay_out("files", &d, "c1-1-2", "");
    let r = run(
        &layout,
        &[
            "SELECT cluster, shard_num, replica_num, host_name FROM system.clusters \
             WHERE cluster = 'analytics'",
            CLUSTERS,
            "SELECT value FROM system.merge_tree_settings WHERE name = 'parts_to_throw_insert'",
            "SELECT value FROM system.server_settings WHERE name = 'max_connections'",
        ],
    );
    assert_eq!(r.rows(0), ["analytics\t1\t1\tanalytics.example.com"]);
    let c1_rows: Vec<String> = r
        .rows(1)
        .into_iter()
        .filter(|l| l.starts_with("c1\t"))
        .collect();
    check_clusters(&c1_rows, "c1", &C1_HOSTS, names::TCP_PORT).unwrap();
    assert_eq!(r.rows(2), ["700"]);
    assert_eq!(r.rows(3), ["3000"]);
}

/// docs/testing.md: a profile setting ClickHouse 26.x does not know fails the whole load (the users
/// file is refused, so no user could log in). The operator passes the names of
/// `spec.configuration.profiles` through unchecked: a misspelt setting in the spec gives a
/// users file a current server refuses.
#[test]
fn an_unknown_profile_setting_fails_the_load() {
    let (c, i) = c1(serde_json::json!({
        "configuration": {"profiles": {"default": {"max_memory_usag": "1"}}}
    }));
    let d = build(&c, &i);
    let layout = lay_out("unknown-setting", &d, "c1-0-0", "");
    let r = run(&layout, &["SELECT 1"]);
    let e = r
        .load_error
        .as_deref()
        .unwrap_or_else(|| panic!("a profile with an unknown setting loaded: {r:?}"));
    assert!(
        r.stderr.contains("Unknown setting 'max_memory_usag'")
            || e.contains("Unknown setting 'max_memory_usag'"),
        "{e}\n{}",
        r.stderr
    );
}

/// docs/testing.md: malformed XML fails the load on ClickHouse 26.x, in `config.d/` (a custom file
/// with a mismatched closing tag) and in `users.d/` (the generated users file with one closing
/// tag dropped), while the same layout with the well-formed file loads.
#[test]
fn malformed_xml_fails_the_load() {
    let good = "<clickhouse><max_connections>1</max_connections></clickhouse>";
    let broken = "<clickhouse><max_connections>1</max_connection></clickhouse>";
    let (c, i) = c1(serde_json::json!({"configuration": {"files": {"50-custom.xml": good}}}));
    let d = build(&c, &i);
    let layout = lay_out("malformed", &d, "c1-0-0", "");
    let query = ["SELECT value FROM system.server_settings WHERE name = 'max_connections'"];
    assert_eq!(run(&layout, &query).rows(0), ["1"]);

    layout.rewrite(&layout.config_d("50-custom.xml"), |s| {
        assert_eq!(s, good);
        broken.to_string()
    });
    let r = run(&layout, &query);
    assert!(r.load_error.is_some(), "malformed config.d loaded: {r:?}");

    layout.rewrite(&layout.config_d("50-custom.xml"), |_| good.to_string());
    layout.rewrite(&layout.users_d(names::USERS_FILE), |s| {
        assert!(s.contains("</networks>"), "{s}");
        s.replacen("</networks>", "", 1)
    });
    let r = run(&layout, &query);
    let e = r.load_error.as_deref().unwrap_or_default();
    assert!(
        e.contains(names::USERS_FILE) || r.stderr.contains(names::USERS_FILE),
        "malformed users.d loaded or failed for another reason: {r:?}"
    );
}

/// docs/testing.md: the `system.clusters` check notices a generated `remote_servers` file that
/// lacks one replica of the spec (here `c1-1-3`, removed from the file after generation).
#[test]
fn a_replica_missing_from_remote_servers_is_noticed() {
    let (c, i) = c1(serde_json::json!({}));
    let d = build(&c, &i);
    let layout = lay_out("missing-replica", &d, "c1-0-0", "");
    let host = C1_HOSTS[1][1];
    layout.rewrite(&layout.config_d(names::REMOTE_SERVERS_FILE), |s| {
        let at = s.find(host).expect("the replica is in remote_servers");
        let start = s[..at].rfind("<replica>").unwrap();
        let end = at + s[at..].find("</replica>").unwrap() + "</replica>".len();
        format!("{}{}", &s[..start], &s[end..])
    });
    let r = run(&layout, &[CLUSTERS]);
    let rows = r.rows(0);
    assert_eq!(rows.len(), 3, "{rows:?}");
    let e = check_clusters(&rows, "c1", &C1_HOSTS, names::TCP_PORT)
        .expect_err("a missing replica went unnoticed");
    assert!(e.contains(host), "{e}");
}

/// The value of `logger/level` after merging `config.d/` as ClickHouse does: files in name
/// order, a later file's element replacing an earlier one's (shown on 26.x by
/// `custom_files_merge_after_the_operators_files`).
fn merged_logger_level(d: &Desired) -> Option<String> {
    let files = d.common_config.data.as_ref().unwrap();
    let mut level = None;
    for (name, xml) in files {
        let doc = roxmltree::Document::parse(xml).unwrap_or_else(|e| panic!("{name}: {e}"));
        if let Some(l) = doc
            .root_element()
            .children()
            .filter(|n| n.has_tag_name("logger"))
            .flat_map(|n| n.children())
            .rfind(|n| n.has_tag_name("level"))
        {
            level = l.text().map(str::to_string);
        }
    }
    level
}

/// docs/testing.md: `spec.configuration.settings: {logger/level: debug}` is reloadable, so it goes
/// to the runtime file; the server file sets `logger/level` to `information` by default. Files
/// merge in name order, the later one winning, so the runtime file must sort after the server file
/// (it once did not, and the spec's level was silently ignored). chDB cannot show the level (it
/// forces `logger.level` to `trace`), so the merge is computed from the files, by the rule the
/// custom-files test proves on 26.x. Checked by hand on Debian's 18.16 server: with the runtime
/// file sorting first no `<Debug>` line is logged; sorting last, `<Debug>` lines are.
#[test]
fn a_logger_level_from_the_spec_is_not_overridden_by_the_operators_default() {
    let (c, i) = c1(serde_json::json!({
        "configuration": {"settings": {"logger/level": "debug"}}
    }));
    let d = build(&c, &i);
    let files = d.common_config.data.as_ref().unwrap();
    assert!(files[RUNTIME_FILE].contains("<level>debug</level>"));
    assert!(RUNTIME_FILE > SERVER_FILE);
    assert_eq!(merged_logger_level(&d).as_deref(), Some("debug"));
}

/// docs/monitoring.md, "The servers' own endpoint": with `serverMetrics` on, the generated
/// `prometheus` section (the servers' own endpoint of ClickHouse 20.1 and later) loads on 26.x with
/// everything else. chDB serves no port, so that the endpoint answers is not shown here.
#[test]
fn the_servers_own_prometheus_section_loads() {
    let (c, i) = c1(serde_json::json!({"serverMetrics": {"enabled": true, "port": 9400}}));
    let d = build(&c, &i);
    assert!(d.common_config.data.as_ref().unwrap()[SERVER_FILE].contains("<prometheus>"));
    let layout = lay_out("prometheus", &d, "c1-0-0", "");
    let r = run(&layout, &[CLUSTERS]);
    check_clusters(&r.rows(0), "c1", &C1_HOSTS, names::TCP_PORT).unwrap();
}

/// docs/configuration.md, "Storage": the disks and storage policy of `spec.storage` load on
/// ClickHouse 26.x and work: `system.disks` has the further disk, `system.storage_policies` the
/// policy's volumes in the spec's order with their disks and move factor, and a table of the policy
/// with a `TTL … TO VOLUME 'cold'` keeps its expired rows on the cold disk and its current rows on
/// the default one (`system.parts.disk_name`). Test-only: the disk's path is moved into the
/// temporary folder (the pod mounts its volume at `/var/lib/clickhouse-disks/cold/`, which the
/// model's unit test checks); the data volume is chDB's own.
#[test]
fn disks_and_a_storage_policy_move_expired_parts_to_the_cold_disk() {
    let (c, i) = c1(serde_json::json!({"storage": {
        "size": "10Gi",
        "disks": [{"name": "cold", "size": "100Gi"}],
        "policies": {"tiered": {"moveFactor": 0.2, "volumes": [
            {"name": "hot", "disks": ["default"], "maxDataPartSize": "1Gi"},
            {"name": "cold", "disks": ["cold"]}]}}
    }}));
    let d = build(&c, &i);
    let tag = "storage";
    let dir = std::env::temp_dir().join(format!("modern-config-{tag}-{}", std::process::id()));
    let cold = dir.join("disks").join("cold");
    let extra = format!(
        "<storage_configuration><disks><cold><path>{}/</path></cold></disks></storage_configuration>",
        cold.display()
    );
    let layout = lay_out(tag, &d, "c1-0-0", &extra);
    std::fs::create_dir_all(&cold).unwrap();
    let server =
        layout.read(&layout.config_d(clickhouse_operator::model::config::server::SERVER_FILE));
    assert!(
        server.contains("<path>/var/lib/clickhouse-disks/cold/</path>"),
        "{server}"
    );
    let run = run(
        &layout,
        &[
            "SELECT name FROM system.disks ORDER BY name",
            "SELECT policy_name, volume_name, volume_priority, arrayStringConcat(disks, ','), \
             max_data_part_size, move_factor FROM system.storage_policies \
             WHERE policy_name = 'tiered' ORDER BY volume_priority",
            "CREATE TABLE default.events (d DateTime, x UInt64) ENGINE = MergeTree ORDER BY x \
             TTL d + INTERVAL 1 DAY TO VOLUME 'cold' SETTINGS storage_policy = 'tiered'",
            "INSERT INTO default.events SELECT now() - INTERVAL 10 DAY, number FROM numbers(100)",
            "INSERT INTO default.events SELECT now(), number FROM numbers(50)",
            "SELECT disk_name, sum(rows) FROM system.parts WHERE database = 'default' \
             AND table = 'events' AND active GROUP BY disk_name ORDER BY disk_name",
        ],
    );
    assert_eq!(run.rows(0), ["cold", "default"]);
    assert_eq!(
        run.rows(1),
        [
            "tiered\thot\t1\tdefault\t1073741824\t0.2",
            "tiered\tcold\t2\tcold\t0\t0.2"
        ]
    );
    run.rows(2);
    run.rows(3);
    run.rows(4);
    assert_eq!(run.rows(5), ["cold\t100", "default\t50"]);
}

/// Decision 33: for servers that report 20.10 or later the cluster carries its `<secret>` and no
/// replica names an account; the 26.x engine loads it and lists the cluster with every pod
/// (the account column then shows `default`: remote shards run a query as its initiator).
/// With 23.6 or later the operator's account has its grants (`SHOW GRANTS`), nothing else
/// changes for the other accounts.
#[test]
fn a_cluster_secret_and_the_operators_grants_load() {
    let (c, mut i) = c1(serde_json::json!({}));
    i.server_version = Some("24.8.4.13".parse().unwrap());
    let d = build(&c, &i);
    let remote = secret_file(&d, names::REMOTE_SERVERS_FILE);
    assert!(
        remote.contains("<secret hide_in_preprocessed=\"true\">c1uster-secret</secret>"),
        "{remote}"
    );
    assert!(!remote.contains("c1uster-pw"), "{remote}");
    let layout = lay_out("secret", &d, "c1-1-3", "");
    let r = run(
        &layout,
        &[
            "SELECT cluster, shard_num, replica_num, host_name, user FROM system.clusters \
             ORDER BY cluster, shard_num, replica_num",
            "SHOW GRANTS FOR clickhouse_operator",
            "SHOW GRANTS FOR alice",
        ],
    );
    let mut want = Vec::new();
    for (s, hosts) in C1_HOSTS.iter().enumerate() {
        for (n, host) in hosts.iter().enumerate() {
            want.push(format!("c1\t{}\t{}\t{host}\tdefault", s + 1, n + 1));
        }
    }
    assert_eq!(r.rows(0), want);
    // the engine merges the grants: compare what is granted on what
    fn granted(lines: &[String], to: &str) -> std::collections::BTreeSet<(String, String)> {
        let mut out = std::collections::BTreeSet::new();
        for l in lines {
            let l = l.trim_start_matches("GRANT ").trim_end_matches(to).trim();
            let (what, on) = l.rsplit_once(" ON ").unwrap_or_else(|| panic!("{l}"));
            for p in what.split(", ") {
                out.insert((p.to_string(), on.replace('`', "")));
            }
        }
        out
    }
    let grants = r.rows(1);
    let expected: Vec<String> = clickhouse_operator::model::config::users::operator_grants(&[
        "default",
        names::OPERATOR_USER,
        "alice",
        "bob",
    ]);
    assert_eq!(
        granted(&grants, " TO clickhouse_operator"),
        granted(&expected, ""),
        "{grants:?}"
    );
    for definer in ["alice", "bob", "default", names::OPERATOR_USER] {
        assert!(
            grants
                .iter()
                .any(|g| g.starts_with(&format!("GRANT SET DEFINER ON {definer} "))),
            "{definer}: {grants:?}"
        );
    }
    // a user of the users Secret keeps what the version gives a users-file user without
    // grants (every privilege but access management), not the operator's list
    let alice = r.rows(2);
    assert!(alice.iter().any(|g| g.contains("TRUNCATE")), "{alice:?}");
    assert!(
        alice
            .iter()
            .all(|g| !g.contains("ACCESS MANAGEMENT") && !g.contains("CREATE USER")),
        "{alice:?}"
    );
}

/// SECURITY.md, "What the operator protects": the operator's grants allow every kind of statement
/// the operator, its backup agents and the exporter send — built by the operator's own statement
/// builders — and refuse what it never sends. The chDB session is always `default`, so a test-only
/// users file gives `default` exactly the grants the generated users file gives the operator's
/// account (copied out of that file); every statement must then pass the access check (it may still
/// fail for another reason: no Keeper, no remote server, no S3 here, a table that is not
/// replicated), and access management, mutations, `TRUNCATE`, other `SYSTEM` statements and file or
/// URL table functions are refused with ACCESS_DENIED (`KILL QUERY` is not among them: a user may
/// always kill its own queries).
#[test]
fn the_operators_grants_allow_its_statements_and_nothing_else() {
    use clickhouse_operator::clickhouse::backup as chbackup;
    use clickhouse_operator::clickhouse::sql::{
        self, ClusterName, DatabaseName, ReplicaMacro, Source, TableName,
    };
    let (c, mut i) = c1(serde_json::json!({}));
    i.server_version = Some("26.9.2.1".parse().unwrap());
    let d = build(&c, &i);
    let users = secret_file(&d, names::USERS_FILE);
    let operator = &users[users.find("<clickhouse_operator").unwrap()..];
    let grants = &operator[operator.find("<grants>").unwrap()
        ..operator.find("</grants>").unwrap() + "</grants>".len()];
    let layout = lay_out("grants", &d, "c1-1-3", "");
    write(
        &layout.users_d("zz-test.xml"),
        &format!("<clickhouse><users><default>{grants}</default></users></clickhouse>"),
    );
    let v = clickhouse_operator::clickhouse::Version::new(26, 9);
    let db = DatabaseName("src".into());
    let table = TableName {
        database: db.clone(),
        name: "t".into(),
    };
    let cluster = ClusterName("c1".into());
    let replica = ReplicaMacro("c1-0-1".into());
    let create = |q: &str| sql::create_if_not_exists(q).unwrap_or_else(|| q.to_string());
    let mut allowed: Vec<String> = vec![
        sql::create_database(&db, "Atomic"),
        create("CREATE TABLE src.t (x UInt8) ENGINE = MergeTree ORDER BY x"),
        create("CREATE TABLE src.t2 (x UInt8) ENGINE = MergeTree ORDER BY x"),
        "INSERT INTO src.t VALUES (1)".into(),
        create("CREATE VIEW src.v (x UInt8) AS SELECT x FROM src.t"),
        create(
            "CREATE MATERIALIZED VIEW src.mv TO src.t2 (x UInt8) DEFINER = alice \
             SQL SECURITY DEFINER AS SELECT x FROM src.t",
        ),
        create(
            "CREATE DICTIONARY src.d (x UInt8) PRIMARY KEY x SOURCE(CLICKHOUSE(TABLE 't' DB \
             'src')) LIFETIME(0) LAYOUT(FLAT())",
        ),
        create("CREATE FUNCTION linear AS (x, k, b) -> ((k * x) + b)"),
        sql::select_version().into(),
        sql::discover_databases(v, Source::Local),
        sql::discover_databases(v, Source::AllReplicas(&cluster)),
        sql::discover_tables(v, Source::Local),
        sql::server_glance(&cluster),
        sql::shards_answering(&cluster),
        sql::fetches_from(&replica),
        sql::replicated_tables().into(),
        sql::replication_status().into(),
        sql::discover_droppable_tables(),
        sql::discover_replicated_databases().into(),
        sql::zookeeper_children("/clickhouse"),
        sql::sync_replica(v, &table),
        sql::drop_dns_cache().into(),
        chbackup::freeze_sql("src", "t"),
        chbackup::attach_part_sql("src", "t2", "all_1_1_0"),
        chbackup::backup_sql(
            &["src".into()],
            "S3('http://127.0.0.1:1/backups/c1/x', 'key', 'secret')",
            None,
        ),
    ];
    allowed.extend(sql::discover_functions(v, Source::Local));
    allowed.extend(sql::discover_dictionaries(v));
    allowed.extend(sql::drop_replica(v, &replica, &table));
    allowed.extend(sql::drop_database_replica(
        v,
        &sql::ShardMacro("0".into()),
        &replica,
        &db,
    ));
    allowed.extend([
        sql::drop_dictionary(&TableName {
            database: db.clone(),
            name: "d".into(),
        }),
        sql::drop_table(
            v,
            &TableName {
                database: db.clone(),
                name: "mv".into(),
            },
        ),
        sql::drop_table(
            v,
            &TableName {
                database: db.clone(),
                name: "v".into(),
            },
        ),
        sql::drop_database(v, &db),
    ]);
    let refused = [
        "CREATE USER mallory",
        "GRANT SELECT ON *.* TO alice",
        "ALTER TABLE src.t DELETE WHERE 1",
        "ALTER TABLE src.t DROP PARTITION tuple()",
        "TRUNCATE TABLE src.t",
        "SYSTEM SHUTDOWN",
        "SYSTEM DROP MARK CACHE",
        "SYSTEM STOP MERGES src.t",
        "SELECT * FROM file('x', 'CSV', 'x UInt8')",
        "SELECT * FROM url('http://127.0.0.1:1/', 'CSV', 'x UInt8')",
    ];
    // the refused statements run on tables that exist: before the drops
    let drops = allowed.len() - 4;
    let mut queries: Vec<&str> = allowed[..drops].iter().map(String::as_str).collect();
    queries.extend(refused);
    queries.extend(allowed[drops..].iter().map(String::as_str));
    let r = run(&layout, &queries);
    r.loaded();
    let denied = |e: &str| e.contains("ACCESS_DENIED") || e.contains("Code: 497");
    for (n, q) in queries.iter().enumerate() {
        let result = &r.results[n];
        if refused.contains(q) {
            let e = result
                .as_ref()
                .err()
                .unwrap_or_else(|| panic!("{q} was allowed"));
            assert!(denied(e), "{q}: refused, but not for access: {e}");
        } else if let Err(e) = result {
            assert!(!denied(e), "{q}: {e}");
        }
    }
    // what must have worked outright
    for n in [0, 1, 2, 3, 4, 5, 6, 7, 9, 11] {
        assert!(r.results[n].is_ok(), "{}: {:?}", queries[n], r.results[n]);
    }
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

/// Decision 36: the exporter's account reads what the exporter sends and nothing else. As in
/// the operator's grants test, the chDB session is `default`, so a test-only users file gives
/// `default` the exporter's grants and profile copied out of the generated users file. Every
/// statement of [`clickhouse_operator::exporter::queries`] passes; reading a table outside
/// `system`, writing, DDL and access management are refused.
#[test]
fn the_exporters_account_reads_the_system_tables_and_nothing_else() {
    use clickhouse_operator::exporter::queries;
    let (c, mut i) = c1(serde_json::json!({}));
    i.server_version = Some("26.9.2.1".parse().unwrap());
    let d = build(&c, &i);
    let users = secret_file(&d, names::USERS_FILE);
    // the account in `<users>` (its profile of the same name comes before, in `<profiles>`)
    let exporter = &users[users.find("<users>").unwrap()..];
    let exporter = &exporter[exporter
        .find(&format!("<{}", names::EXPORTER_USER))
        .unwrap()..];
    let exporter = &exporter[..exporter
        .find(&format!("</{}>", names::EXPORTER_USER))
        .unwrap()];
    let grants = &exporter[exporter.find("<grants>").unwrap()
        ..exporter.find("</grants>").unwrap() + "</grants>".len()];
    assert!(
        !exporter.contains("allow_databases"),
        "grants exclude other access settings: {exporter}"
    );
    let layout = lay_out("exporter", &d, "c1-1-3", "");
    write(
        &layout.users_d("zz-test.xml"),
        &format!(
            "<clickhouse><users><default><profile>{}</profile>{grants}</default></users></clickhouse>",
            names::EXPORTER_PROFILE
        ),
    );
    // chDB's `default` database reads files: its tables are refused as files
    let refused = [
        "SELECT * FROM default.t",
        "INSERT INTO default.t VALUES (1)",
        "CREATE TABLE default.u (x UInt8) ENGINE = Memory",
        "DROP TABLE default.t",
        "CREATE USER mallory",
        "SET readonly = 0",
        "SELECT * FROM file('x', 'CSV', 'x UInt8')",
    ];
    let mut all: Vec<&str> = queries::ALL.to_vec();
    all.extend(refused);
    all.push("SELECT getSetting('readonly')");
    let r = run(&layout, &all);
    r.loaded();
    let denied = |e: &str| e.contains("ACCESS_DENIED") || e.contains("Code: 497");
    for (n, q) in queries::ALL.iter().enumerate() {
        match &r.results[n] {
            Ok(_) => {}
            // chDB, an embedded engine, has no `system.asynchronous_metrics`
            Err(e) if *q == queries::ASYNCHRONOUS_METRICS && e.contains("UNKNOWN_TABLE") => {}
            Err(e) => panic!("{q}: {e}"),
        }
    }
    for (n, q) in refused.iter().enumerate() {
        let e = r.error(queries::ALL.len() + n);
        assert!(denied(e) || e.contains("READONLY"), "{q}: {e}");
    }
    assert_eq!(r.rows(all.len() - 1), ["2"], "the session is read-only");
}

/// Decision 34: the 26.x engine takes the settings of `secretSettings` from the environment
/// variables the pod sets from their Secret keys (`from_env`, with `hide_in_preprocessed`):
/// a server setting (`max_table_size_to_drop`) and a nested one (a `merge_tree` setting) are in force with
/// the values of the variables, which appear in no file of the layout.
#[test]
fn secret_settings_are_read_from_the_environment() {
    let key = |k: &str| serde_json::json!({"name": "cfg", "key": k});
    let (c, i) = c1(serde_json::json!({"configuration": {"secretSettings": {
        "max_table_size_to_drop": key("drop"),
        "merge_tree/parts_to_throw_insert": key("parts")}}}));
    let d = build(&c, &i);
    let layout = lay_out("secret-settings", &d, "c1-1-3", "");
    // in the order of their paths: max_table_size_to_drop, then merge_tree/…
    let r = run_with_env(
        &layout,
        &[
            "SELECT value FROM system.server_settings WHERE name = 'max_table_size_to_drop'",
            "SELECT value FROM system.merge_tree_settings WHERE name = 'parts_to_throw_insert'",
        ],
        &[
            (&names::secret_setting_env(0), "98765432109"),
            (&names::secret_setting_env(1), "1234567891"),
        ],
    );
    assert_eq!(r.rows(0), ["98765432109"]);
    assert_eq!(r.rows(1), ["1234567891"]);
    // (values long enough that a log's timestamps and ids cannot hold them by chance)
    for entry in walk(&layout.dir) {
        let text = std::fs::read_to_string(&entry).unwrap_or_default();
        assert!(
            !text.contains("98765432109") && !text.contains("1234567891"),
            "{}",
            entry.display()
        );
    }
}

/// Every file under `dir`.
fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

/// Decision 35: on a server that reads named collections for `BACKUP`, the operator keeps
/// each backup destination's bucket and keys in a named collection of the file the servers
/// reload, and the agent's statements name the collection and a folder in it: no key is in any
/// statement. The 26.x engine loads the file, and as the operator's account (its grants) a
/// `BACKUP … TO S3(<collection>, …)` and a `RESTORE … FROM` it are accepted and go to the
/// collection's bucket (here on a port nothing listens on, so they fail there with "connection
/// refused", and the error names neither key); a collection the file does not have is refused
/// by name. Without the grant `NAMED COLLECTION ON <collection>` the engine refuses the
/// statement (seen here first): the operator's account gets it for each collection, and a user
/// with the users file's default privileges can neither use nor list it.
#[test]
fn backups_name_the_destinations_named_collection_and_carry_no_key() {
    use clickhouse_operator::clickhouse::backup as chbackup;
    let (c, mut i) = c1(serde_json::json!({}));
    i.server_version = Some("26.9.2.1".parse().unwrap());
    let d = clickhouse_operator::api::S3Destination {
        endpoint: "http://127.0.0.1:1".into(),
        bucket: "backups".into(),
        secret_name: "s3-creds".into(),
        ..Default::default()
    };
    let name = clickhouse_operator::model::S3Collection::name_of(&d);
    i.backup_collections = vec![clickhouse_operator::model::S3Collection {
        name: name.clone(),
        url: clickhouse_operator::model::S3Collection::url_of(&d),
        auth: clickhouse_operator::model::S3Auth::Keys {
            access_key_id: "AKIDCOLLECTION".into(),
            secret_access_key: "SECRETCOLLECTIONKEY".into(),
        },
    }];
    let built = build(&c, &i);
    let users = secret_file(&built, names::USERS_FILE);
    let operator = &users[users.find("<clickhouse_operator").unwrap()..];
    let grants = &operator[operator.find("<grants>").unwrap()
        ..operator.find("</grants>").unwrap() + "</grants>".len()];
    let layout = lay_out("collections", &built, "c1-1-3", "");
    write(
        &layout.users_d("zz-test.xml"),
        &format!("<clickhouse><users><default>{grants}</default></users></clickhouse>"),
    );
    let dbs = vec!["src".to_string()];
    let target = chbackup::s3_collection_target(&name, "t1/c1/backups/b1/shard-0/");
    let backup = chbackup::backup_sql(&dbs, &target, None).replace(" ASYNC", "");
    let restore = chbackup::restore_sql(&dbs, &target, false).replace(" ASYNC", "");
    let missing = chbackup::backup_sql(
        &dbs,
        &chbackup::s3_collection_target("chop_s3_ffffffffffffffff", "x/"),
        None,
    )
    .replace(" ASYNC", "");
    for q in [&backup, &restore, &missing] {
        assert!(
            !q.contains("AKIDCOLLECTION") && !q.contains("SECRETCOLLECTIONKEY"),
            "{q}"
        );
    }
    let queries = [
        "CREATE DATABASE src",
        "CREATE TABLE src.t (x UInt8) ENGINE = MergeTree ORDER BY x",
        "INSERT INTO src.t VALUES (1)",
        // nothing listens on port 1: fail at once instead of retrying for minutes
        "SET s3_retry_attempts = 0",
        "SET backup_restore_s3_retry_attempts = 0",
        backup.as_str(),
        restore.as_str(),
        missing.as_str(),
    ];
    let r = run(&layout, &queries);
    r.loaded();
    for (q, result) in queries.iter().zip(&r.results).take(5) {
        assert!(result.is_ok(), "{q}: {result:?}");
    }
    for n in [5, 6] {
        let e = r.results[n]
            .as_ref()
            .err()
            .unwrap_or_else(|| panic!("{} reached a server on port 1?", queries[n]));
        println!(
            "{}\n  -> {}",
            queries[n],
            e.chars().take(400).collect::<String>()
        );
        assert!(
            !e.contains("ACCESS_DENIED") && !e.contains("Code: 497"),
            "{e}"
        );
        assert!(
            !e.to_lowercase().contains("collection"),
            "the collection is known: {e}"
        );
        assert!(
            e.contains("bucket backups")
                && e.contains("t1/c1/backups/b1/shard-0/")
                && e.contains("Connection refused"),
            "it went to the collection's bucket, in the folder named: {e}"
        );
        assert!(
            !e.contains("SECRETCOLLECTIONKEY") && !e.contains("AKIDCOLLECTION"),
            "{e}"
        );
    }
    let e = r.results[7]
        .as_ref()
        .expect_err("an unknown collection is refused");
    println!("{missing}\n  -> {e}");
    assert!(e.contains("chop_s3_ffffffffffffffff"), "{e}");
    // a user of the users file with the default privileges (no grants, even with access
    // management) can neither use nor list the collection: its keys serve the backups only
    let plain = lay_out("collections-plain", &built, "c1-1-3", "");
    let probe = format!(
        "SELECT count() FROM s3({name}, filename = 'x.csv', format = 'CSV', structure = 'x UInt8')"
    );
    let p = run(
        &plain,
        &[
            "SET s3_retry_attempts = 0",
            probe.as_str(),
            "SELECT count() FROM system.named_collections",
        ],
    );
    p.loaded();
    let denied = p.results[1]
        .as_ref()
        .expect_err("a plain user may not use the collection");
    assert!(
        denied.contains("ACCESS_DENIED") && denied.contains(&name),
        "{denied}"
    );
    assert_eq!(p.results[2], Ok(vec![vec![Some("0".to_string())]]));
    // the agent waits for a collection the server has not loaded yet by this text
    // (`backup::agent::collection_unknown`)
    assert!(
        e.to_lowercase().contains("no named collection")
            || e.to_lowercase().contains("no collection named"),
        "{e}"
    );
}

/// Decision 43: a destination with `webIdentity` becomes a named collection with
/// `use_environment_credentials` and no key, which the 26.x engine loads; as the operator's
/// account a `BACKUP … TO S3(<collection>, …)` is accepted and goes to the collection's bucket
/// (nothing listens there: "connection refused"), with the credentials of the server's own
/// environment. That the server's S3 client then exchanges the pod's token with STS is
/// ClickHouse's (`AWS_ROLE_ARN`, `AWS_WEB_IDENTITY_TOKEN_FILE`), not exercised here: chDB has no
/// STS to ask.
#[test]
fn a_web_identity_destination_is_a_keyless_collection_backups_can_name() {
    use clickhouse_operator::clickhouse::backup as chbackup;
    let web = serde_json::json!({"endpoint": "http://127.0.0.1:1", "insecure": true,
        "bucket": "backups",
        "webIdentity": {"roleArn": "arn:aws:iam::123456789012:role/backups",
                        "serviceAccountName": "ch-backups"}});
    let (c, mut i) = c1(serde_json::json!({"backup": {"destination": web}}));
    i.server_version = Some("26.9.2.1".parse().unwrap());
    i.backup_collections =
        clickhouse_operator::plan::backup::destination::collections(&c, |_| None);
    assert_eq!(i.backup_collections.len(), 1);
    let name = i.backup_collections[0].name.clone();
    let built = build(&c, &i);
    let remote = secret_file(&built, names::REMOTE_SERVERS_FILE);
    assert!(
        remote.contains("<use_environment_credentials>1</use_environment_credentials>")
            && !remote.contains("access_key_id"),
        "{remote}"
    );
    let users = secret_file(&built, names::USERS_FILE);
    let operator = &users[users.find("<clickhouse_operator").unwrap()..];
    let grants = &operator[operator.find("<grants>").unwrap()
        ..operator.find("</grants>").unwrap() + "</grants>".len()];
    let layout = lay_out("web-identity", &built, "c1-1-3", "");
    write(
        &layout.users_d("zz-test.xml"),
        &format!("<clickhouse><users><default>{grants}</default></users></clickhouse>"),
    );
    let target = chbackup::s3_collection_target(&name, "t1/c1/backups/b1/shard-0/");
    let backup = chbackup::backup_sql(&["src".to_string()], &target, None).replace(" ASYNC", "");
    let queries = [
        "CREATE DATABASE src",
        "CREATE TABLE src.t (x UInt8) ENGINE = MergeTree ORDER BY x",
        "INSERT INTO src.t VALUES (1)",
        "SET s3_retry_attempts = 0",
        "SET backup_restore_s3_retry_attempts = 0",
        backup.as_str(),
    ];
    // no instance metadata to ask on this machine: the environment chain ends at once
    let r = run_with_env(&layout, &queries, &[("AWS_EC2_METADATA_DISABLED", "true")]);
    r.loaded();
    for (q, result) in queries.iter().zip(&r.results).take(5) {
        assert!(result.is_ok(), "{q}: {result:?}");
    }
    let e = r.results[5]
        .as_ref()
        .expect_err("nothing listens on port 1");
    println!("{backup}\n  -> {}", e.chars().take(400).collect::<String>());
    assert!(
        !e.to_lowercase().contains("collection"),
        "the collection is known: {e}"
    );
    assert!(
        e.contains("bucket backups")
            && e.contains("t1/c1/backups/b1/shard-0/")
            && e.contains("Connection refused"),
        "it went to the collection's bucket, in the folder named: {e}"
    );
}

/// Decision 49, docs/configuration.md "System log tables": the TTLs of `spec.systemLogs` are the
/// TTLs ClickHouse 26.x creates its system log tables with: `ttlDays` on every default table,
/// a table's own days over it, an optional table named (`text_log`) turned on with its days,
/// and a default table set to 0 left as the image has it (no TTL).
#[test]
fn system_log_tables_are_created_with_the_specs_ttls() {
    use clickhouse_operator::model::config::system_logs::{DEFAULT_TABLES, SYSTEM_LOGS_FILE};
    let (c, i) = c1(serde_json::json!({"systemLogs": {"ttlDays": 7,
        "tables": {"query_log": 30, "trace_log": 0, "text_log": 3}}}));
    let d = build(&c, &i);
    assert!(d.common_config.data.as_ref().unwrap()[SYSTEM_LOGS_FILE].contains("text_log"));
    // trace_log is in the image's configuration (here the stand-in's), without a TTL
    let layout = lay_out(
        "system-logs",
        &d,
        "c1-0-0",
        "<trace_log><database>system</database><table>trace_log</table></trace_log>",
    );
    let r = run(
        &layout,
        &[
            "SYSTEM FLUSH LOGS",
            "SELECT name, engine_full FROM system.tables WHERE database = 'system' \
             AND name LIKE '%_log' ORDER BY name",
        ],
    );
    let tables: BTreeMap<String, String> = r
        .rows(1)
        .iter()
        .filter_map(|row| {
            let (n, e) = row.split_once('\t')?;
            Some((n.to_string(), e.to_string()))
        })
        .collect();
    let ttl = |t: &str| {
        let e = tables
            .get(t)
            .unwrap_or_else(|| panic!("no system.{t}: {tables:?}"));
        e.split_once(" TTL ").map(|(_, rest)| {
            rest.split(" SETTINGS")
                .next()
                .unwrap_or_default()
                .to_string()
        })
    };
    for t in DEFAULT_TABLES
        .iter()
        .filter(|t| !["query_log", "trace_log"].contains(t))
    {
        assert_eq!(
            ttl(t).as_deref(),
            Some("event_date + toIntervalDay(7)"),
            "{t}"
        );
    }
    assert_eq!(
        ttl("query_log").as_deref(),
        Some("event_date + toIntervalDay(30)")
    );
    assert_eq!(
        ttl("text_log").as_deref(),
        Some("event_date + toIntervalDay(3)")
    );
    assert_eq!(ttl("trace_log"), None);
}

/// `spec.logging.format: Json` on ClickHouse 26.x: the generated `logger/formatting` makes the
/// server write its log as one JSON object per line (chDB honours `logger`; the test only moves
/// the files into the temporary folder).
#[test]
fn a_json_log_format_writes_one_json_object_per_line() {
    let (c, i) = c1(serde_json::json!({"logging": {"format": "Json", "size": "10M", "count": 2}}));
    let d = build(&c, &i);
    let layout = lay_out("json-log", &d, "c1-0-0", "");
    let r = run(&layout, &["SELECT 1"]);
    assert_eq!(r.rows(0), ["1"]);
    let lines: Vec<&str> = r.log.lines().filter(|l| !l.trim().is_empty()).collect();
    assert!(!lines.is_empty(), "no server log");
    for line in &lines {
        let v: serde_json::Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("not a JSON object ({e}): {line}"));
        assert!(v["message"].is_string(), "{line}");
    }
}

/// `spec.logging.level` wins over the operator's default in the merged files, as the setting
/// `logger/level` it replaces does (files merge in name order).
#[test]
fn the_level_of_spec_logging_is_the_merged_level() {
    let (c, i) = c1(serde_json::json!({"logging": {"level": "warning"}}));
    assert_eq!(
        merged_logger_level(&build(&c, &i)).as_deref(),
        Some("warning")
    );
}

/// `spec.shardWeights` on ClickHouse 26.x: `system.clusters` has each shard's weight, the
/// named one's and 1 for the others.
#[test]
fn shard_weights_are_the_clusters_weights() {
    let (c, i) = c1(serde_json::json!({"shardWeights": {"1": 3}}));
    let d = build(&c, &i);
    let layout = lay_out("shard-weights", &d, "c1-0-0", "");
    let r = run(
        &layout,
        &[
            CLUSTERS,
            "SELECT DISTINCT shard_num, shard_weight FROM system.clusters \
             WHERE cluster = 'c1' ORDER BY shard_num",
        ],
    );
    check_clusters(&r.rows(0), "c1", &C1_HOSTS, names::TCP_PORT).unwrap();
    assert_eq!(r.rows(1), ["1\t1", "2\t3"]);
}

/// Passwords not in the clear on ClickHouse 26.x: users Secret keys `<user>.sha256_hex` and
/// `<user>.double_sha1_hex` give their user that hash as it is (`system.users.auth_type`, and
/// the hash of `SHOW CREATE USER` is the SHA-256 of the password, or its double SHA-1).
#[test]
fn users_given_by_their_hashes_have_those_hashes() {
    use sha2::{Digest, Sha256};
    let (c, mut i) = c1(serde_json::json!({}));
    i.server_version = Some("24.8.4.13".parse().unwrap());
    i.user_passwords.insert(
        "carol.sha256_hex".into(),
        Password(hex::encode(Sha256::digest(b"carol pw"))),
    );
    let d = build(&c, &i);
    let layout = lay_out("hashed-users", &d, "c1-0-0", "");
    let mysql = "dave.double_sha1_hex";
    let r = run(
        &layout,
        &[
            "SELECT name, auth_type FROM system.users WHERE name = 'carol'",
            "SHOW CREATE USER carol SETTINGS format_display_secrets_in_show_and_select = 1",
            "SELECT upper(hex(SHA256('carol pw')))",
        ],
    );
    assert_eq!(r.rows(0), ["carol\t['sha256_password']"]);
    assert!(r.rows(1)[0].contains(&r.rows(2)[0]), "{:?}", r.rows(1));

    // double SHA-1: its hash, computed by the engine itself from the password
    let probe = run(&layout, &["SELECT hex(SHA1(unhex(hex(SHA1('dave pw')))))"]);
    let double = probe.rows(0)[0].to_lowercase();
    i.user_passwords
        .insert(mysql.into(), Password(double.clone()));
    let d = build(&c, &i);
    let layout = lay_out("hashed-users-2", &d, "c1-0-0", "");
    let r = run(
        &layout,
        &[
            "SELECT name, auth_type FROM system.users WHERE name = 'dave'",
            "SHOW CREATE USER dave SETTINGS format_display_secrets_in_show_and_select = 1",
        ],
    );
    assert_eq!(r.rows(0), ["dave\t['double_sha1_password']"]);
    assert!(
        r.rows(1)[0].to_lowercase().contains(&double),
        "{:?}",
        r.rows(1)
    );
}

/// `spec.protocols` on ClickHouse 26.x: the MySQL, PostgreSQL and gRPC ports, and gRPC's TLS
/// section with `spec.tls`, load (chDB serves no port, so that they answer is not shown here),
/// and the MySQL and PostgreSQL ports are no longer removed.
#[test]
fn the_client_protocols_load() {
    for extra in [
        serde_json::json!({"protocols": {"mysql": true, "postgresql": true, "grpc": true}}),
        serde_json::json!({"protocols": {"mysql": true, "postgresql": true, "grpc": true},
            "tls": {"enabled": true, "serverCertSecret": "c1-tls", "caSecret": "c1-ca"}}),
    ] {
        let tls = extra.get("tls").is_some();
        let (c, i) = c1(extra);
        let d = build(&c, &i);
        let files = d.common_config.data.as_ref().unwrap();
        assert!(files[SERVER_FILE].contains("<grpc_port>9100</grpc_port>"));
        assert_eq!(
            files[SERVER_FILE].contains("<enable_ssl>1</enable_ssl>"),
            tls
        );
        let layout = lay_out(
            if tls { "protocols-tls" } else { "protocols" },
            &d,
            "c1-0-0",
            "",
        );
        let r = run(&layout, &[CLUSTERS]);
        let port = if tls {
            names::TCP_SECURE_PORT
        } else {
            names::TCP_PORT
        };
        check_clusters(&r.rows(0), "c1", &C1_HOSTS, port).unwrap();
    }
}

/// Users managed with SQL on ClickHouse 26.x: `spec.users.accounts.<user>.accessManagement`
/// gives that user the right to create users and grant (`SHOW GRANTS FOR`), and not another;
/// `replicatedAccess` loads (chDB keeps no replicated access storage, so where the users go is
/// not shown here; see docs/testing.md).
#[test]
fn access_management_lets_the_user_manage_users_with_sql() {
    let (c, mut i) = c1(
        serde_json::json!({"users": {"secretName": "u", "replicatedAccess": true,
        "accounts": {"alice": {"accessManagement": true}}}}),
    );
    i.server_version = Some("24.8.4.13".parse().unwrap());
    let d = build(&c, &i);
    let layout = lay_out("access-management", &d, "c1-0-0", "");
    let r = run(&layout, &["SHOW GRANTS FOR alice", "SHOW GRANTS FOR bob"]);
    let alice = r.rows(0).join("\n");
    assert!(
        alice.contains("CREATE USER") && alice.contains("WITH GRANT OPTION"),
        "{alice}"
    );
    assert!(
        !r.rows(1).join("\n").contains("CREATE USER"),
        "{:?}",
        r.rows(1)
    );
}
