//! ClickHouse Keeper XML configuration → ZooKeeper 3.8 `zoo.cfg` and `myid`, and ClickHouse
//! Keeper's runtime membership changes played on ZooKeeper.
//!
//! ClickHouse Keeper (without `enable_reconfiguration`) watches its configuration file: when
//! `raft_configuration` changes, the leader adds and removes the members that differ, one at a
//! time, and every member publishes the committed list in `/keeper/config`. ZooKeeper 3.8 has
//! the same machinery behind its `reconfig` request (dynamic configuration, `/zookeeper/config`),
//! but reads its file only at start. So each member here runs with dynamic reconfiguration on,
//! and [`follow_membership`] re-reads the member's Keeper XML every second and, while that
//! member leads, sends the first difference as a `reconfig` (as the operator's own client would
//! speak to a Keeper). Followers wait, as Keeper's followers do. The identity allowed to
//! reconfigure, [`SUPER`], exists only in this stand-in.

use anyhow::{Context, Result, bail};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clickhouse_operator::clickhouse::keeper::Session;

/// The stand-in's reconfiguring identity (`user:password`).
pub const SUPER: &str = "super:local-kubelet";
/// `base64(sha1(SUPER))`, ZooKeeper's `superDigest` form of [`SUPER`].
pub const SUPER_DIGEST: &str = "super:v0C7fDETgjQ6Dq2nqGVlElII2W4=";

#[derive(Debug, Default, Clone, PartialEq)]
pub struct KeeperConfig {
    pub tcp_port: Option<u16>,
    pub server_id: Option<String>,
    pub server_id_env: Option<String>,
    /// (id, hostname, port)
    pub servers: Vec<(u32, String, u16)>,
    /// `keeper_server/four_letter_word_white_list` (ZooKeeper's `4lw.commands.whitelist`);
    /// `None`: every command.
    pub four_letter_words: Option<String>,
    /// `keeper_server/coordination_settings/startup_timeout` (ms)
    pub startup_timeout_ms: Option<u64>,
    /// `path`, `keeper_server/storage_path`, `keeper_server/log_storage_path`: where Keeper
    /// keeps its state ([`state_dir`]).
    pub path: Option<String>,
    pub storage_path: Option<String>,
    pub log_storage_path: Option<String>,
}

/// Keeper's default `startup_timeout` (ms), `CoordinationSettings`.
pub const DEFAULT_STARTUP_TIMEOUT_MS: u64 = 180_000;

/// The folder Keeper writes its state to, where the stand-in keeps ZooKeeper's data (and its
/// dynamic configuration): `storage_path`, else the parent of `log_storage_path`, else
/// `<path>/coordination` (`path` by default `/var/lib/clickhouse-keeper`), as Keeper's
/// `KeeperContext` places its state file.
pub fn state_dir(cfg: &KeeperConfig) -> String {
    if let Some(s) = cfg.storage_path.as_deref().filter(|s| !s.is_empty()) {
        return s.trim_end_matches('/').to_string();
    }
    if let Some(l) = cfg.log_storage_path.as_deref().filter(|s| !s.is_empty()) {
        let l = l.trim_end_matches('/');
        if let Some((parent, _)) = l.rsplit_once('/').filter(|(p, _)| !p.is_empty()) {
            return parent.to_string();
        }
    }
    let path = cfg
        .path
        .as_deref()
        .filter(|s| !s.is_empty())
        .unwrap_or("/var/lib/clickhouse-keeper");
    format!("{}/coordination", path.trim_end_matches('/'))
}

/// The loopback port ZooKeeper serves clients on; the member's configured client port is
/// opened by the gate (`keeper-gate`) in front of it. The first of 2181, 12181, … that no
/// configured port takes (the same on every member of one configuration).
pub fn internal_client_port(cfg: &KeeperConfig) -> u16 {
    let client = cfg.tcp_port.unwrap_or(9181);
    let taken = |p: u16| {
        p == client
            || cfg
                .servers
                .iter()
                .any(|(_, _, r)| p == *r || p == r.saturating_add(1))
    };
    [2181u16, 12181, 22181, 32181, 42181]
        .into_iter()
        .find(|p| !taken(*p))
        .unwrap_or(52181)
}

fn child<'a, 'i>(n: roxmltree::Node<'a, 'i>, name: &str) -> Option<roxmltree::Node<'a, 'i>> {
    n.children()
        .find(|c| c.is_element() && c.has_tag_name(name))
}

fn text(n: roxmltree::Node) -> String {
    n.text().unwrap_or_default().trim().to_string()
}

/// Merges one XML file into `cfg` (later files override earlier ones, as config.d does).
pub fn merge(cfg: &mut KeeperConfig, xml: &str) -> Result<()> {
    let doc = roxmltree::Document::parse(xml).context("invalid XML")?;
    let root = doc.root_element();
    let Some(ks) = child(root, "keeper_server") else {
        return Ok(());
    };
    if let Some(p) = child(ks, "tcp_port") {
        cfg.tcp_port = Some(text(p).parse().context("keeper_server/tcp_port")?);
    }
    // Keeper over TLS (the operator's `spec.keeper.tls`) is configuration only here: the
    // stand-in refuses it rather than serve in clear what the configuration asks to encrypt.
    let raft_secure = child(ks, "raft_configuration")
        .and_then(|rc| child(rc, "secure"))
        .is_some_and(|s| matches!(text(s).as_str(), "true" | "1"));
    if child(ks, "tcp_port_secure").is_some() || raft_secure {
        anyhow::bail!(
            "the ZooKeeper stand-in does not run Keeper over TLS (keeper_server/tcp_port_secure, raft_configuration/secure)"
        );
    }
    if let Some(id) = child(ks, "server_id") {
        if let Some(env) = id.attribute("from_env") {
            cfg.server_id_env = Some(env.to_string());
            cfg.server_id = None;
        } else {
            cfg.server_id = Some(text(id));
            cfg.server_id_env = None;
        }
    }
    if let Some(w) = child(ks, "four_letter_word_white_list") {
        cfg.four_letter_words = Some(text(w));
    }
    if let Some(t) = child(ks, "coordination_settings").and_then(|c| child(c, "startup_timeout")) {
        cfg.startup_timeout_ms = Some(
            text(t)
                .parse()
                .context("keeper_server/coordination_settings/startup_timeout")?,
        );
    }
    if let Some(p) = child(root, "path") {
        cfg.path = Some(text(p));
    }
    if let Some(p) = child(ks, "storage_path") {
        cfg.storage_path = Some(text(p));
    }
    if let Some(p) = child(ks, "log_storage_path") {
        cfg.log_storage_path = Some(text(p));
    }
    if let Some(rc) = child(ks, "raft_configuration") {
        let mut servers = Vec::new();
        for s in rc
            .children()
            .filter(|c| c.is_element() && c.has_tag_name("server"))
        {
            let id: u32 = child(s, "id")
                .map(text)
                .context("raft server without id")?
                .parse()
                .context("raft server id")?;
            let host = child(s, "hostname")
                .map(text)
                .context("raft server without hostname")?;
            let port: u16 = match child(s, "port") {
                Some(p) => text(p).parse().context("raft server port")?,
                None => 9234,
            };
            servers.push((id, host, port));
        }
        cfg.servers = servers;
    }
    Ok(())
}

/// zoo.cfg text (ZooKeeper's data in `data_dir`). The member's id is taken when it starts
/// (the emulated Keeper binary reads `server_id`, see `entrypoint.rs`).
pub fn zoo_cfg(cfg: &KeeperConfig, data_dir: &str) -> Result<String> {
    if cfg.servers.is_empty() && cfg.tcp_port.is_none() {
        bail!(
            "no keeper_server configuration found in the XML files mounted under /etc/clickhouse-keeper"
        );
    }
    if cfg.server_id.is_none() && cfg.server_id_env.is_none() {
        bail!("keeper_server/server_id is not set");
    }
    let internal = internal_client_port(cfg);
    let words = cfg.four_letter_words.as_deref().unwrap_or("*");
    if !words
        .chars()
        .all(|c| c.is_ascii_lowercase() || c == ',' || c == '*')
    {
        bail!(
            "keeper_server/four_letter_word_white_list {words:?}: four-letter words, comma-separated"
        );
    }
    let mut s = format!(
        "tickTime=500\ninitLimit=20\nsyncLimit=10\ndataDir={data_dir}\n\
         4lw.commands.whitelist={words}\nadmin.enableServer=false\nquorumListenOnAllIPs=true\n\
         autopurge.snapRetainCount=3\nautopurge.purgeInterval=1\n"
    );
    if cfg.servers.is_empty() {
        s.push_str(&format!(
            "clientPortAddress=127.0.0.1\nclientPort={internal}\nreconfigEnabled=false\nstandaloneEnabled=true\n"
        ));
        return Ok(s);
    }
    // even one member runs as an ensemble, so that it can grow at runtime
    s.push_str("reconfigEnabled=true\nstandaloneEnabled=false\n");
    for (id, host, port) in &cfg.servers {
        s.push_str(&format!("{}\n", server_line(*id, host, *port, internal)));
    }
    Ok(s)
}

/// ZooKeeper's dynamic configuration line of a member (its election port is the raft port + 1;
/// clients on the loopback port behind the member's gate).
fn server_line(id: u32, host: &str, port: u16, client: u16) -> String {
    format!(
        "server.{id}={host}:{port}:{}:participant;127.0.0.1:{client}",
        port.saturating_add(1)
    )
}

/// What [`follow_membership`] needs: where the member's Keeper XML files are mounted from and
/// the member's client address.
#[derive(Debug, Clone)]
pub struct MembershipWatch {
    pub roots: Vec<PathBuf>,
    pub addr: SocketAddr,
}

/// The members the Keeper XML under `roots` lists (files merged as at start).
pub fn configured(roots: &[PathBuf]) -> Result<KeeperConfig> {
    let mut files = Vec::new();
    for r in roots {
        collect_xml(r, &mut files);
    }
    files.sort_by_key(|p| {
        let n = p
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .to_string();
        (n != "keeper_config.xml" && n != "config.xml", p.clone())
    });
    let mut kc = KeeperConfig::default();
    for f in &files {
        let text = std::fs::read_to_string(f).unwrap_or_default();
        merge(&mut kc, &text).with_context(|| format!("{}", f.display()))?;
    }
    Ok(kc)
}

/// The one change the leader makes next to go from `live` (member ids) to `want`: a member
/// to add (its dynamic configuration line) or one to remove. Additions first, as ClickHouse
/// Keeper's leader does.
pub fn next_change(live: &[u32], want: &KeeperConfig) -> Option<(Vec<String>, Vec<u32>)> {
    let client = internal_client_port(want);
    if let Some((id, host, port)) = want.servers.iter().find(|(id, _, _)| !live.contains(id)) {
        return Some((vec![server_line(*id, host, *port, client)], vec![]));
    }
    let wanted: Vec<u32> = want.servers.iter().map(|(id, _, _)| *id).collect();
    live.iter()
        .find(|id| !wanted.contains(id))
        .map(|id| (vec![], vec![*id]))
}

/// Plays ClickHouse Keeper's reaction to a changed `raft_configuration` on this member, every
/// second, until the container stops (the task is aborted).
pub async fn follow_membership(w: MembershipWatch) {
    let mut last_error = String::new();
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let r = async {
            let want = configured(&w.roots)?;
            if want.servers.is_empty() {
                return Ok(None);
            }
            let mut s = Session::connect(w.addr, Duration::from_secs(3)).await?;
            let live = s.members().await?.map(|m| m.voters()).unwrap_or_default();
            let Some((add, remove)) = next_change(&live, &want) else {
                s.close().await;
                return Ok(None);
            };
            if !leads(w.addr).await {
                s.close().await;
                return Ok(None);
            }
            s.add_digest_auth(SUPER).await?;
            let r = s.reconfig(&add, &remove).await;
            s.close().await;
            r.map(|_| Some(format!("added {add:?}, removed {remove:?}")))
                .map_err(anyhow::Error::from)
        }
        .await;
        match r {
            Ok(Some(done)) => {
                tracing::info!("keeper {}: membership changed: {done}", w.addr);
                last_error.clear();
            }
            Ok(None) => last_error.clear(),
            Err(e) => {
                let m = format!("{e:#}");
                if m != last_error {
                    tracing::info!("keeper {}: membership change not applied yet: {m}", w.addr);
                    last_error = m;
                }
            }
        }
    }
}

/// Whether the member at `addr` says it leads (`srvr`: `Mode: leader`).
async fn leads(addr: SocketAddr) -> bool {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let r = tokio::time::timeout(Duration::from_secs(2), async {
        let mut c = tokio::net::TcpStream::connect(addr).await?;
        c.write_all(b"srvr").await?;
        let mut out = String::new();
        c.read_to_string(&mut out).await?;
        Ok::<_, std::io::Error>(out)
    })
    .await;
    matches!(r, Ok(Ok(out)) if out.lines().any(|l| l.trim() == "Mode: leader"))
}

fn collect_xml(p: &std::path::Path, out: &mut Vec<PathBuf>) {
    if p.is_dir() {
        if let Ok(rd) = std::fs::read_dir(p) {
            for e in rd.flatten() {
                let q = e.path();
                let name = e.file_name().to_string_lossy().to_string();
                if name.starts_with('.') {
                    continue;
                }
                if q.is_dir() {
                    collect_xml(&q, out);
                } else if name.ends_with(".xml") {
                    out.push(q);
                }
            }
        }
    } else if p.to_string_lossy().ends_with(".xml") {
        out.push(p.to_path_buf());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    const XML: &str = r#"<clickhouse><keeper_server><tcp_port>9181</tcp_port>
        <server_id from_env="KEEPER_ID"/>
        <raft_configuration>
          <server><id>1</id><hostname>k-0.k.ns.svc.cluster.local</hostname><port>9234</port></server>
          <server><id>2</id><hostname>k-1.k.ns.svc.cluster.local</hostname><port>9234</port></server>
          <server><id>3</id><hostname>k-2.k.ns.svc.cluster.local</hostname><port>9234</port></server>
        </raft_configuration></keeper_server></clickhouse>"#;

    #[test]
    fn keeper_over_tls_is_refused_by_the_stand_in() {
        for xml in [
            "<clickhouse><keeper_server><tcp_port>9181</tcp_port><tcp_port_secure>9281</tcp_port_secure></keeper_server></clickhouse>",
            "<clickhouse><keeper_server><raft_configuration><secure>true</secure><server><id>1</id><hostname>a</hostname></server></raft_configuration></keeper_server></clickhouse>",
        ] {
            let e = merge(&mut KeeperConfig::default(), xml).unwrap_err();
            assert!(
                e.to_string().contains("does not run Keeper over TLS"),
                "{e}"
            );
        }
    }

    #[test]
    fn translate() {
        let mut c = KeeperConfig::default();
        merge(&mut c, XML).unwrap();
        let cfg = zoo_cfg(&c, "/d").unwrap();
        assert!(cfg.contains("server.3=k-2.k.ns.svc.cluster.local:9234:9235"));
        // clients reach ZooKeeper on the loopback port behind the gate
        assert!(
            cfg.contains(
                "server.1=k-0.k.ns.svc.cluster.local:9234:9235:participant;127.0.0.1:2181"
            ),
            "{cfg}"
        );
        assert!(cfg.contains("dataDir=/d\n"), "{cfg}");
        let mut one = KeeperConfig::default();
        merge(&mut one, "<yandex><keeper_server><server_id>1</server_id><raft_configuration><server><id>1</id><hostname>a</hostname><port>2181</port></server></raft_configuration></keeper_server></yandex>").unwrap();
        let cfg = zoo_cfg(&one, "/d").unwrap();
        assert!(
            cfg.contains("server.1=a:2181:2182:participant;127.0.0.1:12181"),
            "a raft port of 2181 moves the loopback client port: {cfg}"
        );
        assert!(cfg.contains("standaloneEnabled=false"), "{cfg}");
        assert!(zoo_cfg(&KeeperConfig::default(), "/d").is_err());
        let mut no_id = KeeperConfig::default();
        merge(
            &mut no_id,
            "<clickhouse><keeper_server><tcp_port>9181</tcp_port></keeper_server></clickhouse>",
        )
        .unwrap();
        assert!(zoo_cfg(&no_id, "/d").is_err(), "no server_id");
        // every command without a list, the listed ones with it
        assert!(cfg.contains("4lw.commands.whitelist=*\n"), "{cfg}");
        merge(
            &mut one,
            "<clickhouse><keeper_server><four_letter_word_white_list>ruok,srvr,mntr</four_letter_word_white_list></keeper_server></clickhouse>",
        )
        .unwrap();
        let cfg = zoo_cfg(&one, "/d").unwrap();
        assert!(
            cfg.contains("4lw.commands.whitelist=ruok,srvr,mntr\n"),
            "{cfg}"
        );
        one.four_letter_words = Some("ruok\nsecureClientPort=1".into());
        assert!(zoo_cfg(&one, "/d").is_err(), "no injection into zoo.cfg");
    }

    #[test]
    fn state_folder_and_startup_timeout() {
        let mut c = KeeperConfig::default();
        merge(&mut c, XML).unwrap();
        assert_eq!(state_dir(&c), "/var/lib/clickhouse-keeper/coordination");
        assert_eq!(c.startup_timeout_ms, None);
        merge(
            &mut c,
            "<clickhouse><path>/var/lib/clickhouse-keeper</path><keeper_server>\
             <log_storage_path>/data/k/coordination/log</log_storage_path>\
             <coordination_settings><startup_timeout>15000</startup_timeout></coordination_settings>\
             </keeper_server></clickhouse>",
        )
        .unwrap();
        assert_eq!(state_dir(&c), "/data/k/coordination");
        assert_eq!(c.startup_timeout_ms, Some(15000));
        c.storage_path = Some("/s/".into());
        assert_eq!(state_dir(&c), "/s");
    }

    #[test]
    fn the_leader_adds_before_it_removes_and_one_member_at_a_time() {
        let mut c = KeeperConfig::default();
        merge(&mut c, XML).unwrap();
        let (add, remove) = next_change(&[1, 2], &c).unwrap();
        assert_eq!(
            add,
            vec![
                "server.3=k-2.k.ns.svc.cluster.local:9234:9235:participant;127.0.0.1:2181"
                    .to_string()
            ]
        );
        assert!(remove.is_empty());
        assert_eq!(next_change(&[1, 2, 3, 4], &c), Some((vec![], vec![4])));
        assert_eq!(next_change(&[3, 1, 2], &c), None);
    }
}
