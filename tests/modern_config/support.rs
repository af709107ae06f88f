//! What every test of this binary uses: the stand-ins for the image's own files, a replica's
//! files laid out like `/etc/clickhouse-server`, chDB run on them, and the clusters and inputs
//! the operator's model is built from.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use clickhouse_operator::api::ClickHouseCluster;
use clickhouse_operator::model::{Cluster, Desired, Inputs, Password, ReplicaSpec, desired, names};

use crate::chdb::chdb_python;

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

/// A test whose tool is missing is skipped here and said so; in CI (`CI=true`, set by
/// `.ci/run`), where everything is installed, a missing tool fails it instead.
pub fn skipped(why: &str) {
    assert!(
        std::env::var("CI").map_or(true, |v| v != "true"),
        "{why}: in CI nothing may be skipped"
    );
    eprintln!("SKIPPED: {why}");
}

pub const UID: &str = "00000000-0000-4000-8000-000000000016";

/// One replica's configuration laid out like `/etc/clickhouse-server`; removed when dropped
/// unless `KEEP_MODERN_CONFIG_DIR` is set.
pub struct Layout {
    pub dir: PathBuf,
}

impl Drop for Layout {
    fn drop(&mut self) {
        if std::env::var_os("KEEP_MODERN_CONFIG_DIR").is_none() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

impl Layout {
    pub fn config_d(&self, name: &str) -> PathBuf {
        self.dir.join("config.d").join(name)
    }

    pub fn users_d(&self, name: &str) -> PathBuf {
        self.dir.join("users.d").join(name)
    }

    pub fn read(&self, path: &Path) -> String {
        std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    }

    /// Replaces the content of one file of the layout.
    pub fn rewrite(&self, path: &Path, f: impl FnOnce(String) -> String) {
        let new = f(self.read(path));
        write(path, &new);
    }
}

pub fn write(path: &Path, content: &str) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, content).unwrap();
}

pub fn secret_file(d: &Desired, key: &str) -> String {
    String::from_utf8(d.users_secret.data.as_ref().unwrap()[key].0.clone()).unwrap()
}

/// Writes the files replica `replica` mounts (as `server_volumes` in `src/model/statefulset.rs`
/// projects them) into a fresh folder. `extra` is more test-only XML for `config.d/zz-test.xml`.
pub fn lay_out(tag: &str, d: &Desired, replica: &str, extra: &str) -> Layout {
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
pub struct Run {
    /// Why `chdb.connect` refused the configuration, if it did.
    pub load_error: Option<String>,
    /// Per query: the rows (each value as text, NULL as `None`) or the error.
    pub results: Vec<Result<Vec<Vec<Option<String>>>, String>>,
    /// chDB's own stderr (details of a load error go there).
    pub stderr: String,
    /// The server log written while running.
    pub log: String,
}

impl Run {
    pub fn loaded(&self) -> &Self {
        assert!(
            self.load_error.is_none(),
            "chDB refused the configuration: {:?}\n{}",
            self.load_error,
            self.stderr
        );
        self
    }

    /// The rows of query `i`, each row's values joined by tabs (NULL as `\N`).
    pub fn rows(&self, i: usize) -> Vec<String> {
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
    pub fn error(&self, i: usize) -> &str {
        match &self.loaded().results[i] {
            Ok(rows) => panic!("query {i} succeeded: {rows:?}"),
            Err(e) => e,
        }
    }
}

/// Starts chDB on the layout's `config.xml` in a fresh Python process and runs `queries` in
/// one session.
pub fn run(layout: &Layout, queries: &[&str]) -> Run {
    run_with_env(layout, queries, &[])
}

/// [`run`] with environment variables set for the engine, as a pod sets them.
pub fn run_with_env(layout: &Layout, queries: &[&str], env: &[(&str, &str)]) -> Run {
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
pub const CLUSTERS: &str = "SELECT cluster, shard_num, replica_num, host_name, port, user, \
     internal_replication FROM system.clusters ORDER BY cluster, shard_num, replica_num";

/// Checks the rows of [`CLUSTERS`]: exactly `shards`, each a list of pod host names, in the
/// cluster `cluster`, on `port`, as the cluster's own account (decision 27: not the operator's).
/// Nothing else (no example cluster of the image).
pub fn check_clusters(
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
pub fn replicas(cluster: &str, shards: i32, per_shard: i64) -> Vec<ReplicaSpec> {
    (0..shards)
        .flat_map(|s| {
            (0..per_shard)
                .map(move |i| ReplicaSpec::new(cluster, s.into(), i64::from(s) * per_shard + i))
        })
        .collect()
}

pub fn inputs(replicas: Vec<ReplicaSpec>, users: &[(&str, &str)]) -> Inputs {
    Inputs {
        replicas,
        listed: None,
        leaving: Vec::new(),
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

pub fn build(c: &ClickHouseCluster, i: &Inputs) -> Desired {
    desired(&Cluster::new(c).unwrap(), i).unwrap()
}

/// A 2 × 2 cluster `c1` in `t1` with the given extra spec fields, Secret users `alice`, `bob`.
pub fn c1(extra: serde_json::Value) -> (ClickHouseCluster, Inputs) {
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

pub const C1_HOSTS: [&[&str]; 2] = [
    &[
        "c1-0-0-0.c1-headless.t1.svc.cluster.local",
        "c1-0-1-0.c1-headless.t1.svc.cluster.local",
    ],
    &[
        "c1-1-2-0.c1-headless.t1.svc.cluster.local",
        "c1-1-3-0.c1-headless.t1.svc.cluster.local",
    ],
];
