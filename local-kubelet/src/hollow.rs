//! A hollow ClickHouse server: the light mode of a server pod for scale benchmarks, in the
//! spirit of Kubernetes' hollow nodes. A pod annotated `local-kubelet.clickhouse.com/hollow:
//! "true"` whose image is a ClickHouse server runs this instead of the real server: one small
//! process in the pod's network and mount namespaces that answers, on the HTTP port, the
//! queries the operator sends to an idle server, as a server of the image's version with the
//! pod's configuration would:
//!
//! - `GET /ping` (the probes) and `GET /`: `Ok.`;
//! - `SELECT version()`: the version named by the image tag (`24.8` → `24.8.1.1`);
//! - `SELECT count() …, version() …, (… system.replicas …) … FROM system.clusters WHERE
//!   cluster = '<c>'` (the operator's glance): the hosts of `<c>` in the `remote_servers` of
//!   the pod's `config.d/` files, read at each query (so a reload is seen), that version, and
//!   no read-only table (it has none);
//! - `SELECT count() … FROM cluster('<c>', system.one)`: its shards (every one answers), or
//!   ClickHouse's error 170 when the cluster is not configured;
//! - `SELECT 1`: 1; `SYSTEM DROP DNS CACHE`: an empty success (it resolves nothing).
//!
//! Any other `SELECT` gets an empty result and any other statement an empty success, both
//! written to the container log as unanswered, so a benchmark can tell what a hollow server
//! did not really do. It stores nothing, replicates nothing, checks no password: results from
//! hollow pods are labelled as such.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The annotation that makes a server pod hollow.
pub const ANNOTATION: &str = "local-kubelet.clickhouse.com/hollow";

/// Is the pod a hollow server pod ([`ANNOTATION`] `"true"`)?
pub fn is_hollow(pod: &k8s_openapi::api::core::v1::Pod) -> bool {
    pod.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ANNOTATION))
        .is_some_and(|v| v == "true")
}

/// The version a hollow server reports for an image tag: `24.8` → `24.8.1.1`, `23.3.2` →
/// `23.3.2.1`; a tag that is not a version (`latest`) → `24.8.1.1`.
pub fn version_of_tag(image: &str) -> String {
    let no_digest = image.split('@').next().unwrap_or_default();
    let last = no_digest.rsplit('/').next().unwrap_or_default();
    let tag = last.split_once(':').map(|(_, t)| t).unwrap_or("");
    let core = tag.split(['-', '+']).next().unwrap_or("");
    let parts: Vec<&str> = core.split('.').collect();
    if parts.len() < 2 || parts.len() > 4 || parts.iter().any(|p| p.parse::<u32>().is_err()) {
        return "24.8.1.1".into();
    }
    let mut v: Vec<String> = parts.iter().map(|p| p.to_string()).collect();
    while v.len() < 4 {
        v.push("1".into());
    }
    v.join(".")
}

/// The clusters of the `remote_servers` sections of every `*.xml` under `config_d`, merged in
/// file name order (a later file's cluster replaces an earlier one's): cluster → hosts per
/// shard.
pub fn clusters(config_d: &Path) -> BTreeMap<String, Vec<usize>> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(config_d)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "xml"))
        .collect();
    files.sort();
    let mut out = BTreeMap::new();
    for f in files {
        let Ok(text) = std::fs::read_to_string(&f) else {
            continue;
        };
        let Ok(doc) = roxmltree::Document::parse(&text) else {
            continue;
        };
        for rs in doc
            .root_element()
            .children()
            .filter(|n| n.has_tag_name("remote_servers"))
        {
            for c in rs.children().filter(|n| n.is_element()) {
                let shards: Vec<usize> = c
                    .children()
                    .filter(|n| n.has_tag_name("shard"))
                    .map(|s| {
                        s.children()
                            .filter(|r| r.has_tag_name("replica"))
                            .filter(|r| r.children().any(|h| h.has_tag_name("host")))
                            .count()
                    })
                    .collect();
                out.insert(c.tag_name().name().to_string(), shards);
            }
        }
    }
    out
}

/// The answer to one statement: HTTP status, body, exception code.
pub fn answer(sql: &str, version: &str, config_d: &Path) -> (u16, String, Option<u32>) {
    let s = sql.trim().trim_end_matches(';').trim();
    let lower = s.to_ascii_lowercase();
    let one = |name: &str, ty: &str, value: String| {
        (
            200,
            format!(
                "{{\"meta\":[{{\"name\":\"{name}\",\"type\":\"{ty}\"}}],\"data\":[[{value}]],\"rows\":1}}\n"
            ),
            None,
        )
    };
    if lower == "select version()" {
        return one("version()", "String", format!("\"{version}\""));
    }
    if lower == "select 1" {
        return one("1", "UInt8", "1".into());
    }
    let quoted = || {
        let start = s.find('\'')? + 1;
        let len = s[start..].find('\'')?;
        Some(s[start..start + len].to_string())
    };
    if lower.starts_with(
        "select count() as n, version() as v, \
         (select count() from system.replicas where is_readonly or is_session_expired) as ro \
         from system.clusters where cluster = ",
    ) {
        let cluster = quoted().unwrap_or_default();
        let hosts: usize = clusters(config_d)
            .get(&cluster)
            .map(|shards| shards.iter().sum())
            .unwrap_or(0);
        return (
            200,
            format!(
                "{{\"meta\":[{{\"name\":\"n\",\"type\":\"UInt64\"}},{{\"name\":\"v\",\"type\":\"String\"}},{{\"name\":\"ro\",\"type\":\"UInt64\"}}],\"data\":[[\"{hosts}\",\"{version}\",\"0\"]],\"rows\":1}}\n"
            ),
            None,
        );
    }
    if lower.starts_with("select count() as n from cluster(") {
        let cluster = quoted().unwrap_or_default();
        return match clusters(config_d).get(&cluster) {
            Some(shards) => one("n", "UInt64", format!("\"{}\"", shards.len())),
            None => (
                500,
                format!(
                    "Code: 170. DB::Exception: Requested cluster '{cluster}' not found. (BAD_GET) (version {version} (hollow))\n"
                ),
                Some(170),
            ),
        };
    }
    if lower == "system drop dns cache" {
        // a real server forgets its resolved addresses and answers nothing; there are none here
        return (200, String::new(), None);
    }
    eprintln!("hollow: unanswered statement: {}", s.replace('\n', " "));
    if lower.starts_with("select") || lower.starts_with("show") || lower.starts_with("with") {
        return (200, "{\"meta\":[],\"data\":[],\"rows\":0}\n".into(), None);
    }
    (200, String::new(), None)
}

/// Serves `port` on every address until killed.
pub fn run(version: String, config_d: PathBuf, port: u16) -> ! {
    let listener = TcpListener::bind(("0.0.0.0", port)).unwrap_or_else(|e| {
        eprintln!("hollow: cannot listen on port {port}: {e}");
        std::process::exit(1)
    });
    eprintln!(
        "hollow ClickHouse server {version} on port {port}, configuration in {}",
        config_d.display()
    );
    for stream in listener.incoming().flatten() {
        let (version, config_d) = (version.clone(), config_d.clone());
        std::thread::spawn(move || {
            let _ = connection(stream, &version, &config_d);
        });
    }
    std::process::exit(1)
}

/// Decodes `%XX` and `+` of a URL query value.
fn url_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < b.len() => match u8::from_str_radix(&s[i + 1..i + 3], 16) {
                Ok(v) => {
                    out.push(v);
                    i += 2;
                }
                Err(_) => out.push(b'%'),
            },
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// One keep-alive connection: requests until the peer closes or stays idle for a minute.
fn connection(stream: TcpStream, version: &str, config_d: &Path) -> std::io::Result<()> {
    stream.set_read_timeout(Some(Duration::from_secs(60)))?;
    let mut out = stream.try_clone()?;
    let mut r = BufReader::new(stream);
    loop {
        let mut line = String::new();
        if r.read_line(&mut line)? == 0 {
            return Ok(());
        }
        let mut parts = line.split_whitespace();
        let method = parts.next().unwrap_or_default().to_string();
        let target = parts.next().unwrap_or("/").to_string();
        let mut length = 0usize;
        loop {
            let mut h = String::new();
            if r.read_line(&mut h)? == 0 {
                return Ok(());
            }
            let h = h.trim_end();
            if h.is_empty() {
                break;
            }
            if let Some((k, v)) = h.split_once(':')
                && k.eq_ignore_ascii_case("content-length")
            {
                length = v.trim().parse().unwrap_or(0);
            }
        }
        let mut body = vec![0; length];
        r.read_exact(&mut body)?;
        let (path, query) = target.split_once('?').unwrap_or((target.as_str(), ""));
        let param = query
            .split('&')
            .filter_map(|kv| kv.split_once('='))
            .find(|(k, _)| *k == "query")
            .map(|(_, v)| url_decode(v));
        let sql = match (param, body.is_empty()) {
            (Some(q), true) => Some(q),
            (Some(q), false) => Some(format!("{q} {}", String::from_utf8_lossy(&body))),
            (None, false) => Some(String::from_utf8_lossy(&body).into_owned()),
            (None, true) => None,
        };
        let (status, text, code) = match (method.as_str(), path, sql) {
            (_, "/ping", _) | ("GET", "/", None) => (200, "Ok.\n".to_string(), None),
            (_, "/", Some(sql)) => answer(&sql, version, config_d),
            _ => (404, "Not found\n".to_string(), None),
        };
        let reason = if status == 200 { "OK" } else { "Error" };
        let mut head = format!(
            "HTTP/1.1 {status} {reason}\r\nContent-Type: text/plain; charset=UTF-8\r\nContent-Length: {}\r\nConnection: Keep-Alive\r\n",
            text.len()
        );
        if let Some(c) = code {
            head.push_str(&format!("X-ClickHouse-Exception-Code: {c}\r\n"));
        }
        head.push_str("\r\n");
        head.push_str(&text);
        out.write_all(head.as_bytes())?;
        out.flush()?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_come_from_the_image_tag() {
        assert_eq!(
            version_of_tag("clickhouse/clickhouse-server:24.8"),
            "24.8.1.1"
        );
        assert_eq!(
            version_of_tag("reg:5000/x/clickhouse-server:23.3.2-alpine"),
            "23.3.2.1"
        );
        assert_eq!(version_of_tag("clickhouse-server:latest"), "24.8.1.1");
        assert_eq!(version_of_tag("clickhouse-server"), "24.8.1.1");
    }

    /// What the operator sees of a hollow server, through the operator's own client: the
    /// version of the image tag, the hosts and shards of its cluster as the pod's
    /// `remote_servers` lists them (a later file replacing an earlier one's cluster), error 170
    /// for a cluster it does not have, and `/ping`.
    #[tokio::test]
    async fn the_operators_client_reads_version_hosts_and_shards_from_a_hollow_server() {
        use clickhouse_operator::clickhouse::replica::{Glance, glance, shards_answering};
        use clickhouse_operator::clickhouse::sql::ClusterName;
        use clickhouse_operator::clickhouse::{Client, ClientConfig, Credentials, Endpoint};
        let dir = std::env::temp_dir().join(format!("hollow-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let replica = |h: &str| format!("<replica><host>{h}</host><port>9000</port></replica>");
        std::fs::write(
            dir.join("00-old.xml"),
            format!("<clickhouse><remote_servers><c1><shard>{}</shard></c1></remote_servers></clickhouse>", replica("a")),
        )
        .unwrap();
        std::fs::write(
            dir.join("10-remote-servers.xml"),
            format!(
                "<clickhouse><remote_servers replace=\"replace\"><c1><shard>{}{}</shard><shard>{}{}</shard><shard>{}</shard></c1></remote_servers></clickhouse>",
                replica("a"), replica("b"), replica("c"), replica("d"), replica("e")
            ),
        )
        .unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        drop(listener);
        let d = dir.clone();
        std::thread::spawn(move || run("24.8.1.1".into(), d, port));
        let client = Client::new(ClientConfig::new(
            Endpoint {
                host: "127.0.0.1".into(),
                port,
            },
            Credentials {
                user: "clickhouse_operator".into(),
                password: "x".into(),
            },
        ))
        .unwrap();
        let mut version = None;
        for _ in 0..50 {
            if let Ok(v) = client.version().await {
                version = Some(v);
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(version.unwrap().to_string(), "24.8.1.1");
        let c1 = ClusterName("c1".into());
        assert_eq!(
            glance(&client, &c1).await.unwrap(),
            Glance {
                hosts: 5,
                version: "24.8.1.1".to_string(),
                read_only: 0
            }
        );
        assert_eq!(shards_answering(&client, &c1).await.unwrap(), 3);
        let missing = shards_answering(&client, &ClusterName("other".into())).await;
        assert!(
            missing
                .as_ref()
                .is_err_and(|e| e.to_string().contains("170")),
            "{missing:?}"
        );
        assert_eq!(
            glance(&client, &ClusterName("other".into()))
                .await
                .unwrap()
                .hosts,
            0
        );
        let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.write_all(b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\n")
            .unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut text = String::new();
        let mut buf = [0u8; 256];
        while !text.ends_with("\r\n\r\nOk.\n") {
            let n = s.read(&mut buf).unwrap();
            assert!(n > 0, "closed after {text:?}");
            text.push_str(&String::from_utf8_lossy(&buf[..n]));
        }
        assert!(
            text.starts_with("HTTP/1.1 200") && text.ends_with("Ok.\n"),
            "{text}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn url_values_decode() {
        assert_eq!(url_decode("SELECT+1%3B"), "SELECT 1;");
        assert_eq!(url_decode("100%"), "100%");
    }
}
