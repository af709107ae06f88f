//! ClickHouse Keeper XML configuration → ZooKeeper 3.8 `zoo.cfg` and `myid`.

use anyhow::{Context, Result, bail};

#[derive(Debug, Default, Clone, PartialEq)]
pub struct KeeperConfig {
    pub tcp_port: Option<u16>,
    pub server_id: Option<String>,
    pub server_id_env: Option<String>,
    /// (id, hostname, port)
    pub servers: Vec<(u32, String, u16)>,
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
    if let Some(id) = child(ks, "server_id") {
        if let Some(env) = id.attribute("from_env") {
            cfg.server_id_env = Some(env.to_string());
            cfg.server_id = None;
        } else {
            cfg.server_id = Some(text(id));
            cfg.server_id_env = None;
        }
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

/// zoo.cfg text and the myid of this member.
pub fn zoo_cfg(
    cfg: &KeeperConfig,
    data_dir: &str,
    pod_hostname: &str,
    env: &[(String, String)],
) -> Result<(String, u32)> {
    if cfg.servers.is_empty() && cfg.tcp_port.is_none() {
        bail!(
            "no keeper_server configuration found in the XML files mounted under /etc/clickhouse-keeper"
        );
    }
    let by_hostname = || {
        cfg.servers
            .iter()
            .find(|(_, h, _)| h.split('.').next() == Some(pod_hostname))
            .map(|(id, _, _)| *id)
    };
    let from_env = cfg.server_id_env.as_ref().and_then(|var| {
        env.iter()
            .rev()
            .find(|(k, _)| k == var)
            .map(|(_, v)| (var.clone(), v.clone()))
    });
    let myid: u32 = if let Some(id) = &cfg.server_id {
        id.parse()
            .with_context(|| format!("keeper_server/server_id {id:?}"))?
    } else if let Some((var, v)) = from_env {
        v.trim()
            .parse()
            .with_context(|| format!("server_id from {var}={v:?}"))?
    } else {
        by_hostname().with_context(|| {
            format!(
                "no server_id{} and no raft server named after the pod's hostname {pod_hostname}",
                cfg.server_id_env
                    .as_ref()
                    .map(|v| format!(" (from_env {v} is not set)"))
                    .unwrap_or_default()
            )
        })?
    };
    let mut s = format!(
        "tickTime=500\ninitLimit=20\nsyncLimit=10\ndataDir={data_dir}\nclientPort={}\n\
         4lw.commands.whitelist=*\nadmin.enableServer=false\nquorumListenOnAllIPs=true\n\
         reconfigEnabled=false\nstandaloneEnabled=true\nautopurge.snapRetainCount=3\n\
         autopurge.purgeInterval=1\n",
        cfg.tcp_port.unwrap_or(9181)
    );
    if cfg.servers.len() > 1 {
        if !cfg.servers.iter().any(|(id, _, _)| *id == myid) {
            bail!("server_id {myid} is not in raft_configuration");
        }
        for (id, host, port) in &cfg.servers {
            s.push_str(&format!(
                "server.{id}={host}:{port}:{}\n",
                port.saturating_add(1)
            ));
        }
    }
    Ok((s, myid))
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
    fn translate() {
        let mut c = KeeperConfig::default();
        merge(&mut c, XML).unwrap();
        let (cfg, id) = zoo_cfg(&c, "/d", "k-1", &[("KEEPER_ID".into(), "2".into())]).unwrap();
        assert_eq!(id, 2);
        assert!(cfg.contains("server.3=k-2.k.ns.svc.cluster.local:9234:9235"));
        assert!(cfg.contains("clientPort=9181"));
        c.server_id_env = None;
        let (_, id) = zoo_cfg(&c, "/d", "k-2", &[]).unwrap();
        assert_eq!(id, 3);
        let mut one = KeeperConfig::default();
        merge(&mut one, "<yandex><keeper_server><server_id>1</server_id><raft_configuration><server><id>1</id><hostname>a</hostname></server></raft_configuration></keeper_server></yandex>").unwrap();
        let (cfg, _) = zoo_cfg(&one, "/d", "a", &[]).unwrap();
        assert!(!cfg.contains("server.1"));
        assert!(zoo_cfg(&KeeperConfig::default(), "/d", "a", &[]).is_err());
    }
}
