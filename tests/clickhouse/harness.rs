//! Real servers for the ClickHouse integration tests: one ZooKeeper 3.8 (Debian's
//! `zookeeper`, standalone) and Debian's `clickhouse-server` 18.16 processes, each on its own
//! loopback address (127.x.y.z, with `<listen_host>` replaced in a `config.d` file), free
//! ports, its own data folder, `{shard}`/`{replica}` macros and a `remote_servers` cluster
//! `c1` listing every server of the test. Everything is killed when the [`Harness`] is
//! dropped, also on failure or panic.
//!
//! On loopback addresses no server recognises itself, so `ON CLUSTER` DDL cannot run here;
//! the tests create their fixture tables on each server.
//!
//! Also what the tests share beside the servers: one cluster at a time ([`SERIAL`]), the fixture
//! of an existing shard ([`create_fixture`]) and queries run on the servers.

use std::collections::BTreeMap;
use std::fs;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use clickhouse_operator::clickhouse::client::{
    Client, ClientConfig, Credentials, Endpoint, QueryOptions,
};
use clickhouse_operator::clickhouse::sql::ClusterName;

/// The operator's user in the test servers' `users.xml`.
pub const USER: &str = "operator";
/// Its password.
pub const PASSWORD: &str = "s3cret'pw";
/// The cluster name in `remote_servers`.
pub const CLUSTER: &str = "c1";

/// A process killed (SIGKILL) and reaped on drop.
struct Process {
    name: String,
    child: Child,
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        eprintln!("harness: stopped {}", self.name);
    }
}

/// One server of the test's cluster.
#[derive(Clone, Debug)]
pub struct ServerSpec {
    /// The `{replica}` macro.
    pub name: String,
    /// The `{shard}` macro.
    pub shard: u32,
    /// Its own loopback address.
    pub ip: Ipv4Addr,
    /// HTTP port.
    pub http: u16,
    /// Native port (Distributed queries between servers).
    pub tcp: u16,
    /// Interserver port (replication fetches).
    pub interserver: u16,
    /// HTTPS port (only served by a harness built with [`Harness::with_tls`]).
    pub https: u16,
}

/// ZooKeeper plus the ClickHouse servers of one test.
pub struct Harness {
    dir: PathBuf,
    specs: Vec<ServerSpec>,
    servers: BTreeMap<String, Process>,
    zk_addr: SocketAddr,
    /// The test CA's certificate (PEM) when the servers serve HTTPS.
    ca_pem: Option<Vec<u8>>,
    // Dropped last (fields drop in order): servers before ZooKeeper.
    _zookeeper: Process,
}

/// Makes the child die with the thread that started it, so that even a test process killed
/// with SIGKILL (where no `Drop` runs) leaves no server behind.
fn die_with_parent(command: &mut Command) -> &mut Command {
    use std::os::unix::process::CommandExt;
    // SAFETY: between fork and exec only the async-signal-safe `prctl` is called.
    unsafe {
        command.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) == -1 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        })
    }
}

fn free_port(ip: Ipv4Addr) -> u16 {
    TcpListener::bind((ip, 0))
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or_else(|e| panic!("no free port on {ip}: {e}"))
}

fn wait_for(what: &str, timeout: Duration, mut ok: impl FnMut() -> bool) {
    let start = Instant::now();
    while start.elapsed() < timeout {
        if ok() {
            eprintln!("harness: {what} after {:?}", start.elapsed());
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("harness: {what} not reached within {timeout:?}");
}

fn four_letter(addr: SocketAddr, cmd: &str) -> Option<String> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_millis(500)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(1))).ok()?;
    s.write_all(cmd.as_bytes()).ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    Some(out)
}

fn http_ping(spec: &ServerSpec) -> bool {
    let addr = SocketAddr::from((spec.ip, spec.http));
    let Ok(mut s) = TcpStream::connect_timeout(&addr, Duration::from_millis(300)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(1)));
    let req = format!("GET /ping HTTP/1.0\r\nHost: {}\r\n\r\n", spec.ip);
    if s.write_all(req.as_bytes()).is_err() {
        return false;
    }
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out.contains("Ok.")
}

impl Harness {
    /// Starts ZooKeeper for a cluster of `servers` (`(shard, replica name)`); no ClickHouse
    /// server runs until [`Harness::start`]. `slot` keeps the addresses of concurrently
    /// running tests apart.
    pub fn new(slot: u8, servers: &[(u32, &str)]) -> Harness {
        let pid = std::process::id();
        let octet2 = 64 + (pid % 128) as u8;
        let octet3 = slot;
        let dir = std::env::temp_dir().join(format!("chop-clickhouse-it-{pid}-{slot}"));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("create {}: {e}", dir.display()));

        let zk_ip = Ipv4Addr::new(127, octet2, octet3, 250);
        let zk_port = free_port(zk_ip);
        let zk_addr = SocketAddr::from((zk_ip, zk_port));
        let zk = start_zookeeper(&dir.join("zookeeper"), zk_addr);
        wait_for("ZooKeeper answers ruok", Duration::from_secs(60), || {
            four_letter(zk_addr, "ruok").is_some_and(|r| r.contains("imok"))
        });

        let specs = servers
            .iter()
            .enumerate()
            .map(|(i, (shard, name))| {
                let ip = Ipv4Addr::new(127, octet2, octet3, 10 + i as u8);
                ServerSpec {
                    name: name.to_string(),
                    shard: *shard,
                    ip,
                    http: free_port(ip),
                    tcp: free_port(ip),
                    interserver: free_port(ip),
                    https: free_port(ip),
                }
            })
            .collect();
        Harness {
            dir,
            specs,
            servers: BTreeMap::new(),
            zk_addr,
            ca_pem: None,
            _zookeeper: zk,
        }
    }

    /// As [`Harness::new`], and every server also serves HTTPS with a certificate for its
    /// address, signed by a CA made for this test (with `openssl`); clients use HTTPS and
    /// trust only that CA.
    pub fn with_tls(slot: u8, servers: &[(u32, &str)]) -> Harness {
        Harness::with_tls_san(slot, servers, false)
    }

    /// [`Harness::with_tls`] with certificates that name only `<replica>.chop.test` (a DNS
    /// name, as cert-manager issues them), no address.
    pub fn with_tls_names(slot: u8, servers: &[(u32, &str)]) -> Harness {
        Harness::with_tls_san(slot, servers, true)
    }

    /// The DNS name of `replica`'s certificate in [`Harness::with_tls_names`].
    pub fn tls_name(replica: &str) -> String {
        format!("{replica}.chop.test")
    }

    fn with_tls_san(slot: u8, servers: &[(u32, &str)], dns: bool) -> Harness {
        let mut h = Harness::new(slot, servers);
        let pki = h.dir.join("pki");
        fs::create_dir_all(&pki).unwrap_or_else(|e| panic!("{e}"));
        openssl(
            &pki,
            &[
                "req",
                "-x509",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-keyout",
                "ca.key",
                "-out",
                "ca.crt",
                "-days",
                "2",
                "-subj",
                "/CN=clickhouse-it-ca",
            ],
        );
        for spec in &h.specs {
            let n = &spec.name;
            openssl(
                &pki,
                &[
                    "req",
                    "-newkey",
                    "rsa:2048",
                    "-nodes",
                    "-keyout",
                    &format!("{n}.key"),
                    "-out",
                    &format!("{n}.csr"),
                    "-subj",
                    &format!("/CN={}", spec.ip),
                ],
            );
            fs::write(
                pki.join(format!("{n}.ext")),
                if dns {
                    format!(
                        "subjectAltName=DNS:{}\nextendedKeyUsage=serverAuth\n",
                        Harness::tls_name(n)
                    )
                } else {
                    format!(
                        "subjectAltName=IP:{}\nextendedKeyUsage=serverAuth\n",
                        spec.ip
                    )
                },
            )
            .unwrap_or_else(|e| panic!("{e}"));
            openssl(
                &pki,
                &[
                    "x509",
                    "-req",
                    "-in",
                    &format!("{n}.csr"),
                    "-CA",
                    "ca.crt",
                    "-CAkey",
                    "ca.key",
                    "-CAcreateserial",
                    "-out",
                    &format!("{n}.crt"),
                    "-days",
                    "2",
                    "-extfile",
                    &format!("{n}.ext"),
                ],
            );
        }
        h.ca_pem = Some(fs::read(pki.join("ca.crt")).unwrap_or_else(|e| panic!("{e}")));
        h
    }

    /// The test CA (PEM) of a harness built with [`Harness::with_tls`].
    /// ZooKeeper's client address.
    pub fn zookeeper(&self) -> SocketAddr {
        self.zk_addr
    }

    pub fn ca_pem(&self) -> Option<&[u8]> {
        self.ca_pem.as_deref()
    }

    fn spec(&self, name: &str) -> &ServerSpec {
        self.specs
            .iter()
            .find(|s| s.name == name)
            .unwrap_or_else(|| panic!("no server {name} in this test's cluster"))
    }

    fn server_dir(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// Starts server `name` (with its data folder as left by a previous run, if any) and
    /// waits until it answers `/ping`.
    pub fn start(&mut self, name: &str) {
        let spec = self.spec(name).clone();
        let dir = self.server_dir(name);
        fs::create_dir_all(dir.join("config.d")).unwrap_or_else(|e| panic!("{e}"));
        fs::write(dir.join("config.xml"), self.config(&spec, &dir))
            .unwrap_or_else(|e| panic!("{e}"));
        fs::write(
            dir.join("config.d/listen.xml"),
            format!(
                "<yandex><listen_host replace=\"replace\">{}</listen_host></yandex>\n",
                spec.ip
            ),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        fs::write(dir.join("users.xml"), users_xml()).unwrap_or_else(|e| panic!("{e}"));
        let log = fs::File::create(dir.join("stdout.log")).unwrap_or_else(|e| panic!("{e}"));
        let child = die_with_parent(&mut Command::new("/usr/sbin/clickhouse-server"))
            .arg(format!(
                "--config-file={}",
                dir.join("config.xml").display()
            ))
            .current_dir(&dir)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap_or_else(|e| panic!("{e}")))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("start clickhouse-server {name}: {e}"));
        self.servers.insert(
            name.to_string(),
            Process {
                name: format!("clickhouse-server {name} ({})", spec.ip),
                child,
            },
        );
        wait_for(
            &format!(
                "clickhouse-server {name} on {}:{} answers /ping",
                spec.ip, spec.http
            ),
            Duration::from_secs(60),
            || http_ping(&spec),
        );
    }

    /// Kills server `name` (SIGKILL, as a deleted pod).
    pub fn kill(&mut self, name: &str) {
        self.servers.remove(name);
    }

    /// Kills server `name`, deletes its data (a new PVC) and starts it again.
    pub fn restart_fresh(&mut self, name: &str) {
        self.kill(name);
        let _ = fs::remove_dir_all(self.server_dir(name).join("data"));
        self.start(name);
    }

    /// A client of server `name`, as the operator would build it.
    pub fn client(&self, name: &str) -> Client {
        let spec = self.spec(name);
        let mut config = ClientConfig::new(
            Endpoint {
                host: spec.ip.to_string(),
                port: spec.http,
            },
            Credentials {
                user: USER.into(),
                password: PASSWORD.into(),
            },
        );
        if let Some(ca) = &self.ca_pem {
            config.endpoint.port = spec.https;
            config.tls_ca_pem = Some(ca.clone());
        }
        config.timeout = Duration::from_secs(20);
        config.retry.first_delay = Duration::from_millis(100);
        config.retry.attempts = 9;
        Client::new(config).unwrap_or_else(|e| panic!("{e}"))
    }

    fn config(&self, spec: &ServerSpec, dir: &Path) -> String {
        let mut shards: BTreeMap<u32, Vec<&ServerSpec>> = BTreeMap::new();
        for s in &self.specs {
            shards.entry(s.shard).or_default().push(s);
        }
        let mut remote = String::new();
        for replicas in shards.values() {
            remote.push_str("<shard><internal_replication>true</internal_replication>");
            for r in replicas {
                remote.push_str(&format!(
                    "<replica><host>{}</host><port>{}</port><user>{USER}</user><password>{}</password></replica>",
                    r.ip,
                    r.tcp,
                    xml_escape(PASSWORD)
                ));
            }
            remote.push_str("</shard>");
        }
        let d = dir.display();
        let tls = match &self.ca_pem {
            Some(_) => {
                let pki = self.dir.join("pki");
                format!(
                    "<https_port>{}</https_port><openSSL><server><certificateFile>{}</certificateFile>\
                     <privateKeyFile>{}</privateKeyFile><verificationMode>none</verificationMode>\
                     <loadDefaultCAFile>false</loadDefaultCAFile><disableProtocols>sslv2,sslv3</disableProtocols>\
                     </server></openSSL>",
                    spec.https,
                    pki.join(format!("{}.crt", spec.name)).display(),
                    pki.join(format!("{}.key", spec.name)).display()
                )
            }
            None => String::new(),
        };
        format!(
            r#"<yandex>
  <logger><level>information</level><log>{d}/server.log</log><errorlog>{d}/server.err.log</errorlog><size>100M</size><count>1</count></logger>
  <http_port>{http}</http_port>
  <tcp_port>{tcp}</tcp_port>
  <interserver_http_port>{inter}</interserver_http_port>
  <interserver_http_host>{ip}</interserver_http_host>
  <path>{d}/data/</path>
  <tmp_path>{d}/data/tmp/</tmp_path>
  <user_files_path>{d}/data/user_files/</user_files_path>
  <format_schema_path>{d}/data/format_schemas/</format_schema_path>
  <users_config>users.xml</users_config>
  <default_profile>default</default_profile>
  <default_database>default</default_database>
  <mark_cache_size>67108864</mark_cache_size>
  <uncompressed_cache_size>67108864</uncompressed_cache_size>
  <max_concurrent_queries>50</max_concurrent_queries>
  <zookeeper><node><host>{zk_ip}</host><port>{zk_port}</port></node><session_timeout_ms>6000</session_timeout_ms></zookeeper>
  <macros><shard>{shard}</shard><replica>{name}</replica></macros>
  <remote_servers><{CLUSTER}>{remote}</{CLUSTER}></remote_servers>
  {tls}
  <query_log><database>system</database><table>query_log</table><flush_interval_milliseconds>500</flush_interval_milliseconds></query_log>
</yandex>
"#,
            http = spec.http,
            tcp = spec.tcp,
            inter = spec.interserver,
            ip = spec.ip,
            zk_ip = self.zk_addr.ip(),
            zk_port = self.zk_addr.port(),
            shard = spec.shard,
            name = spec.name,
        )
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        // Servers first, then ZooKeeper (field order).
        self.servers.clear();
        if std::thread::panicking() {
            eprintln!("harness: test failed, logs kept in {}", self.dir.display());
        } else {
            let _ = fs::remove_dir_all(&self.dir);
        }
    }
}

fn xml_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('\'', "&apos;")
        .replace('"', "&quot;")
}

fn users_xml() -> String {
    format!(
        r#"<yandex>
  <profiles><default><max_memory_usage>2000000000</max_memory_usage><log_queries>1</log_queries></default></profiles>
  <quotas><default></default></quotas>
  <users>
    <default><password></password><networks><ip>127.0.0.0/8</ip></networks><profile>default</profile><quota>default</quota></default>
    <{USER}><password>{}</password><networks><ip>127.0.0.0/8</ip></networks><profile>default</profile><quota>default</quota></{USER}>
  </users>
</yandex>
"#,
        xml_escape(PASSWORD)
    )
}

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap_or_else(|e| panic!("openssl: {e}"));
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn start_zookeeper(dir: &Path, addr: SocketAddr) -> Process {
    let conf = dir.join("conf");
    fs::create_dir_all(&conf).unwrap_or_else(|e| panic!("{e}"));
    fs::create_dir_all(dir.join("data")).unwrap_or_else(|e| panic!("{e}"));
    fs::write(
        conf.join("zoo.cfg"),
        format!(
            "tickTime=500\ninitLimit=10\nsyncLimit=5\ndataDir={}\nclientPort={}\nclientPortAddress={}\n\
             admin.enableServer=false\n4lw.commands.whitelist=ruok,srvr\nmaxSessionTimeout=60000\n",
            dir.join("data").display(),
            addr.port(),
            addr.ip()
        ),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let _ = fs::copy(
        "/etc/zookeeper/conf/log4j.properties",
        conf.join("log4j.properties"),
    );
    let log = fs::File::create(dir.join("zookeeper.log")).unwrap_or_else(|e| panic!("{e}"));
    let child = die_with_parent(&mut Command::new("java"))
        .arg("-Xmx256m")
        .arg("-Dzookeeper.root.logger=INFO,CONSOLE")
        .arg("-cp")
        .arg(format!("/usr/share/java/*:{}", conf.display()))
        .arg("org.apache.zookeeper.server.quorum.QuorumPeerMain")
        .arg(conf.join("zoo.cfg"))
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap_or_else(|e| panic!("{e}")))
        .stderr(log)
        .spawn()
        .unwrap_or_else(|e| panic!("start ZooKeeper: {e}"));
    Process {
        name: format!("ZooKeeper ({addr})"),
        child,
    }
}

/// Runs `sql` on every client, in order.
pub async fn exec_all(clients: &[&Client], sql: &str) {
    for c in clients {
        c.exec(sql, &QueryOptions::new())
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
    }
}

/// One `UInt64` from a one-row, one-column query.
pub async fn scalar(client: &Client, sql: &str) -> u64 {
    let rows = client
        .query(sql, &QueryOptions::new())
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
    let row = rows
        .iter()
        .next()
        .unwrap_or_else(|| panic!("{sql}: no row"));
    row.u64("v").unwrap_or_else(|e| panic!("{sql}: {e}"))
}

/// The user objects of a server (`db.name`, `.inner` tables left out).
pub async fn user_tables(client: &Client) -> std::collections::BTreeSet<String> {
    let sql = "SELECT concat(database, '.', name) AS t FROM system.tables \
               WHERE database NOT IN ('system') AND name NOT LIKE '.inner%' ORDER BY t";
    let rows = client
        .query(sql, &QueryOptions::new())
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
    rows.iter()
        .map(|r| {
            r.str("t")
                .map(str::to_string)
                .unwrap_or_else(|e| panic!("{e}"))
        })
        .collect()
}

/// Tests share two cores: one cluster at a time.
pub static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The cluster of `remote_servers` ([`CLUSTER`]) as the statement builders name it.
pub fn cluster() -> ClusterName {
    ClusterName(CLUSTER.into())
}

/// The fixture of an existing shard: ReplicatedMergeTree tables in two databases, a view, a
/// materialized view, an unreferenced MergeTree table, and a Distributed table over a local
/// table in another database (S1-14's `db2.t_local`). Created on each server: `ON CLUSTER`
/// cannot run on loopback addresses.
pub async fn create_fixture(clients: &[&Client]) {
    for sql in [
        "CREATE DATABASE IF NOT EXISTS db1",
        "CREATE DATABASE IF NOT EXISTS db2",
        "CREATE TABLE IF NOT EXISTS db1.events (d Date DEFAULT today(), id UInt64, s String) \
         ENGINE = ReplicatedMergeTree('/clickhouse/tables/{shard}/db1/events', '{replica}') \
         PARTITION BY toYYYYMM(d) ORDER BY id",
        "CREATE VIEW IF NOT EXISTS db1.v AS SELECT id, s FROM db1.events",
        "CREATE MATERIALIZED VIEW IF NOT EXISTS db1.mv ENGINE = MergeTree ORDER BY id \
         AS SELECT id FROM db1.events",
        "CREATE TABLE IF NOT EXISTS db1.unreferenced (x UInt8) ENGINE = MergeTree ORDER BY x",
        "CREATE TABLE IF NOT EXISTS db2.t_local (id UInt64, shard String) \
         ENGINE = ReplicatedMergeTree('/clickhouse/tables/{shard}/db2/t_local', '{replica}') ORDER BY id",
        "CREATE TABLE IF NOT EXISTS db1.dist AS db2.t_local \
         ENGINE = Distributed(c1, db2, t_local, rand())",
    ] {
        exec_all(clients, sql).await;
    }
}
