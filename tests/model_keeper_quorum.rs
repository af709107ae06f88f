//! The generated Keeper ensemble configuration forms a quorum.
//!
//! Nothing runs ClickHouse Keeper here, so, as the local kubelet does (CONTROL-PLANE.md §4–5),
//! the raft configuration the operator generated is translated for ZooKeeper 3.8 (Debian's
//! package, which speaks the same client protocol): every `<server>` of `raft_configuration`
//! becomes `server.<id>=<address>:<raft port>:<raft port + 1>`, each member's hostname is mapped
//! to a loopback address of its own, and each member's id is computed by the container's own
//! command from its pod hostname. Three members must elect exactly one leader.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use clickhouse_operator::api::ClickHouseCluster;
use clickhouse_operator::model::keeper::{config_map, keeper_command};
use clickhouse_operator::model::{Cluster, names};

/// A test whose tool is missing is skipped here and said so; in CI (`CI=true`, set by
/// `.ci/run`), where everything is installed, a missing tool fails it instead.
fn skipped(why: &str) {
    assert!(
        std::env::var("CI").map_or(true, |v| v != "true"),
        "{why}: in CI nothing may be skipped"
    );
    eprintln!("SKIPPED: {why}");
}

const ZOOKEEPER_JAR: &str = "/usr/share/java/zookeeper.jar";

/// The ZooKeeper members; killed and their folder removed when dropped, also on failure.
struct Ensemble {
    children: Vec<Child>,
    dir: PathBuf,
}

impl Drop for Ensemble {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A raft member as the generated configuration lists it.
struct Member {
    id: String,
    hostname: String,
    port: u16,
}

fn members(xml: &str) -> Vec<Member> {
    let doc = roxmltree::Document::parse(xml).unwrap();
    doc.descendants()
        .filter(|n| {
            n.has_tag_name("server")
                && n.parent()
                    .is_some_and(|p| p.has_tag_name("raft_configuration"))
        })
        .map(|s| {
            let t = |tag: &str| {
                s.children()
                    .find(|n| n.has_tag_name(tag))
                    .and_then(|n| n.text())
                    .unwrap()
                    .to_string()
            };
            Member {
                id: t("id"),
                hostname: t("hostname"),
                port: t("port").parse().unwrap(),
            }
        })
        .collect()
}

/// The raft id the container's command computes for a pod hostname.
fn server_id(hostname: &str) -> String {
    let command = keeper_command();
    assert_eq!(command[..2], ["/bin/bash", "-c"]);
    let script = command[2].replace("exec /entrypoint.sh", "echo \"$KEEPER_SERVER_ID\"");
    let out = Command::new("/bin/bash")
        .args(["-c", &script])
        .env("HOSTNAME", hostname)
        .output()
        .unwrap();
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

/// Sends a four-letter word, returns the answer.
fn four_letters(addr: &str, port: u16, word: &str) -> String {
    let Ok(mut s) = TcpStream::connect((addr, port)) else {
        return String::new();
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    let _ = s.write_all(word.as_bytes());
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out
}

#[test]
fn generated_keeper_ensemble_forms_a_quorum() {
    if !Path::new(ZOOKEEPER_JAR).exists() {
        skipped("ZooKeeper is not installed");
        return;
    }
    let spec = serde_json::from_value(serde_json::json!({"keeper": {"replicas": 3}})).unwrap();
    let mut c = ClickHouseCluster::new("c1", spec);
    c.metadata.namespace = Some("t1".into());
    c.metadata.uid = Some("00000000-0000-4000-8000-000000000002".into());
    let cm = config_map(&Cluster::new(&c).unwrap());
    let xml = &cm.data.as_ref().unwrap()[names::KEEPER_CONFIG_FILE];
    let members = members(xml);
    assert_eq!(members.len(), 3);

    // Each member on a loopback address of its own; a block per test process.
    let block = std::process::id() % 200 + 20;
    let address = |i: usize| format!("127.77.{block}.{}", i + 1);
    let client_port = names::KEEPER_CLIENT_PORT as u16;
    let servers: Vec<String> = members
        .iter()
        .enumerate()
        .map(|(i, m)| format!("server.{}={}:{}:{}", m.id, address(i), m.port, m.port + 1))
        .collect();
    let dir = std::env::temp_dir().join(format!("model-keeper-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let mut ensemble = Ensemble {
        children: Vec::new(),
        dir: dir.clone(),
    };
    for (i, m) in members.iter().enumerate() {
        // The pod's hostname is the first label of its DNS name; the command derives the id.
        let pod = m.hostname.split('.').next().unwrap();
        assert_eq!(server_id(pod), m.id, "{pod}");
        let data = dir.join(pod);
        std::fs::create_dir_all(&data).unwrap();
        std::fs::write(data.join("myid"), format!("{}\n", m.id)).unwrap();
        let cfg = format!(
            "tickTime=500\ninitLimit=20\nsyncLimit=5\ndataDir={}\nclientPort={client_port}\nclientPortAddress={}\n4lw.commands.whitelist=*\nadmin.enableServer=false\n{}\n",
            data.display(),
            address(i),
            servers.join("\n")
        );
        std::fs::write(data.join("zoo.cfg"), cfg).unwrap();
        let log = std::fs::File::create(data.join("out.log")).unwrap();
        ensemble.children.push(
            Command::new("java")
                .args([
                    "-Xmx128m",
                    "-cp",
                    "/usr/share/java/*:/etc/zookeeper/conf",
                    "org.apache.zookeeper.server.quorum.QuorumPeerMain",
                ])
                .arg(data.join("zoo.cfg"))
                .stdin(Stdio::null())
                .stdout(log.try_clone().unwrap())
                .stderr(log)
                .spawn()
                .expect("java starts"),
        );
    }
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let modes: Vec<String> = (0..members.len())
            .map(|i| {
                four_letters(&address(i), client_port, "srvr")
                    .lines()
                    .find_map(|l| l.strip_prefix("Mode: ").map(str::to_string))
                    .unwrap_or_default()
            })
            .collect();
        let leaders = modes.iter().filter(|m| *m == "leader").count();
        let followers = modes.iter().filter(|m| *m == "follower").count();
        if leaders == 1 && followers == 2 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no quorum within 90 s: {modes:?}; logs in {}",
            dir.display()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// Decision 42: the raft id is the pod's ordinal + 1 whether the host name is the pod's name or,
/// with `setHostnameAsFQDN`, its full DNS name (whose later labels hold `-` too).
#[test]
fn the_raft_id_comes_from_the_ordinal_with_a_short_or_a_full_host_name() {
    assert_eq!(server_id("c1-keeper-0"), "1");
    assert_eq!(server_id("my-cluster-keeper-2"), "3");
    assert_eq!(
        server_id("c1-keeper-1.c1-keeper-headless.t-1.svc.cluster.local"),
        "2"
    );
    assert_eq!(
        server_id("db-2-keeper-4.db-2-keeper-headless.prod-eu.svc.k8s-1.example"),
        "5"
    );
}
