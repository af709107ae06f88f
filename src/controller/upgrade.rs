//! Automatic version upgrades (S2-24, decision 15): on the schedule of `spec.upgradeOptions`, the
//! elected operator reads the cluster's version source and acts on the verdict of
//! [`crate::plan::upgrade::decide`]: a newer allowed version is written into the resource's
//! `spec.image` (never into a StatefulSet; Smart Update rolls it out), with an event naming both
//! versions. A source that cannot be read is an event and a `VersionSource` condition, never an
//! error state of the cluster. Each slot is checked once: `status.upgrade.lastCheck`.

use std::time::Duration;

use crate::plan::EventType;
use chrono::{DateTime, Utc};
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;
use tracing::{info, warn};

use super::{Context, api};
use crate::api::{ClickHouseCluster, ClusterState, UpgradeStatus, VersionSource};
use crate::plan::backup::schedule::due;
use crate::plan::status::set_condition;
use crate::plan::upgrade::{Apply, Verdict, decide, parse_document};
use crate::util::cron::Cron;

/// The field manager of what a check writes.
const MANAGER: &str = "clickhouse-operator-upgrades";
/// The condition a check sets.
pub const CONDITION: &str = "VersionSource";
/// How long reading a source may take.
const READ_TIMEOUT: Duration = Duration::from_secs(10);
/// The default key of a ConfigMap source.
pub const DEFAULT_KEY: &str = "versions.json";

/// The most a version source may answer with.
pub const MAX_DOCUMENT: usize = 64 << 10;

/// Reads the version document of `source` (in namespace `ns`).
async fn read_source(ctx: &Context, ns: &str, source: &VersionSource) -> Result<String, String> {
    if let Some(cm) = &source.config_map {
        let key = cm.key.as_deref().unwrap_or(DEFAULT_KEY);
        let found = api::<ConfigMap>(ctx, ns)
            .get_opt(&cm.name)
            .await
            .map_err(|e| format!("reading ConfigMap {}: {e}", cm.name))?
            .ok_or_else(|| format!("ConfigMap {} does not exist in namespace {ns}", cm.name))?;
        return found
            .data
            .and_then(|d| d.get(key).cloned())
            .ok_or_else(|| format!("ConfigMap {} has no key {key}", cm.name));
    }
    let url = source.url.as_deref().ok_or("no url and no configMap")?;
    fetch(url, source.insecure, READ_TIMEOUT).await
}

/// GETs a version document (decision 37): `https://` only unless `insecure`; redirects only
/// to the same scheme, host and port; no proxy from the environment; the answer read up to
/// [`MAX_DOCUMENT`] bytes and refused beyond; all of it within `timeout`. An error names what
/// went wrong with the source the cluster named, never a host it was sent to, an address or
/// what the answer held.
pub async fn fetch(url: &str, insecure: bool, timeout: Duration) -> Result<String, String> {
    let parsed = reqwest::Url::parse(url).map_err(|_| "the url cannot be parsed".to_string())?;
    match parsed.scheme() {
        "https" => {}
        "http" if insecure => {}
        "http" => return Err("plain http:// is refused (set insecure: true to allow it)".into()),
        other => return Err(format!("the scheme {other}:// is not https://")),
    }
    let origin = (
        parsed.scheme().to_string(),
        parsed.host_str().unwrap_or_default().to_string(),
        parsed.port_or_known_default(),
    );
    let policy = reqwest::redirect::Policy::custom(move |attempt| {
        let u = attempt.url();
        let same = (
            u.scheme(),
            u.host_str().unwrap_or_default(),
            u.port_or_known_default(),
        ) == (origin.0.as_str(), origin.1.as_str(), origin.2);
        if !same {
            attempt.error("redirected to another host")
        } else if attempt.previous().len() >= 3 {
            attempt.error("more than 3 redirects")
        } else {
            attempt.follow()
        }
    });
    let http = reqwest::Client::builder()
        .no_proxy()
        .redirect(policy)
        .connect_timeout(Duration::from_secs(5))
        .timeout(timeout)
        .build()
        .map_err(|_| "cannot build an HTTP client".to_string())?;
    let plain = |e: reqwest::Error| -> String {
        if e.is_redirect() {
            "it redirected to another host, or more than 3 times: refused".into()
        } else if e.is_timeout() {
            format!("no answer within {} s", timeout.as_secs())
        } else if e.is_connect() {
            "cannot connect".into()
        } else {
            "the request failed".into()
        }
    };
    let mut answer = http.get(parsed).send().await.map_err(plain)?;
    if !answer.status().is_success() {
        return Err(format!("it answered HTTP {}", answer.status().as_u16()));
    }
    if answer
        .content_length()
        .is_some_and(|n| n > MAX_DOCUMENT as u64)
    {
        return Err(format!(
            "the answer is larger than {} KiB",
            MAX_DOCUMENT >> 10
        ));
    }
    let mut body: Vec<u8> = Vec::new();
    while let Some(chunk) = answer.chunk().await.map_err(plain)? {
        if body.len() + chunk.len() > MAX_DOCUMENT {
            return Err(format!(
                "the answer is larger than {} KiB",
                MAX_DOCUMENT >> 10
            ));
        }
        body.extend_from_slice(&chunk);
    }
    String::from_utf8(body).map_err(|_| "the answer is not UTF-8 text".into())
}

/// One look at `cluster`: nothing unless a slot of its schedule is due and not checked yet.
pub async fn tick(ctx: &Context, cluster: &ClickHouseCluster) -> Result<(), kube::Error> {
    let u = &cluster.spec.upgrade_options;
    let Ok(apply) = Apply::parse(&u.apply) else {
        return Ok(()); // the cluster's pass reports the invalid field
    };
    if apply == Apply::Disabled || cluster.metadata.deletion_timestamp.is_some() {
        return Ok(());
    }
    let Ok(cron) = Cron::parse(&u.schedule) else {
        return Ok(());
    };
    let status = cluster.status.clone().unwrap_or_default();
    let last = status
        .upgrade
        .as_ref()
        .and_then(|s| s.last_check.as_deref())
        .and_then(|t| DateTime::parse_from_rfc3339(t).ok())
        .map(|t| t.with_timezone(&Utc));
    let Some(slot) = due(&cron, last, Utc::now()) else {
        return Ok(());
    };
    let ns = cluster.namespace().unwrap_or_default();
    let name = cluster.name_any();
    let ready = status.state == ClusterState::Ready
        && status.observed_generation == cluster.metadata.generation;
    // the source is read only when its answer can matter
    let document = if ready && !cluster.spec.pause {
        match &u.version_source {
            Some(s) => read_source(ctx, &ns, s)
                .await
                .and_then(|text| parse_document(&text)),
            None => Err("no version source".into()),
        }
    } else {
        Err(String::new())
    };
    let verdict = decide(
        &apply,
        &cluster.spec.image,
        &u.allowed_repositories,
        ready,
        cluster.spec.pause,
        document.as_ref().map_err(Clone::clone),
    );
    let api: Api<ClickHouseCluster> = api(ctx, &ns);
    let mut current = cluster.clone();
    let mut record = status.upgrade.clone().unwrap_or_default();
    record.last_check = Some(slot.to_rfc3339());
    let mut event = None;
    match &verdict {
        Verdict::Upgrade { from, to, image } => {
            // the spec first: a check whose status write fails is simply repeated, and then
            // finds the new version current
            current = api
                .patch(
                    &name,
                    &PatchParams::apply(MANAGER),
                    &Patch::Merge(json!({
                        "metadata": {"resourceVersion": cluster.resource_version()},
                        "spec": {"image": image},
                    })),
                )
                .await?;
            let message = format!("upgrading {from} → {to}: spec.image is now {image}");
            info!(cluster = %name, %from, %to, %image, "automatic upgrade");
            record.message = Some(message.clone());
            record.last_upgrade = Some(image.clone());
            record.last_upgrade_time = Some(Timestamp::now().to_string());
            event = Some((EventType::Normal, "Upgrade", message));
        }
        Verdict::Current(why) | Verdict::Skip(why) => record.message = Some(why.clone()),
        Verdict::Problem(why) => {
            warn!(cluster = %name, problem = %why, "automatic upgrade check");
            record.message = Some(why.clone());
            event = Some((EventType::Warning, "UpgradeCheckFailed", why.clone()));
        }
    }
    let mut conditions = current
        .status
        .as_ref()
        .map(|s| s.conditions.clone())
        .unwrap_or_default();
    match &verdict {
        Verdict::Problem(why) => set_condition(
            &mut conditions,
            CONDITION,
            false,
            "Unusable",
            why,
            current.metadata.generation,
            Timestamp::now(),
        ),
        Verdict::Upgrade { .. } | Verdict::Current(_) => set_condition(
            &mut conditions,
            CONDITION,
            true,
            "Read",
            "the version source was read",
            current.metadata.generation,
            Timestamp::now(),
        ),
        Verdict::Skip(_) => {}
    }
    let written = write_record(&api, &current, record, conditions).await;
    super::publish_events(ctx, &current, event, "Upgrade").await;
    written
}

/// Writes `status.upgrade` and the conditions, unless the cluster changed in between (its
/// next tick then checks the slot again).
async fn write_record(
    api: &Api<ClickHouseCluster>,
    cluster: &ClickHouseCluster,
    record: UpgradeStatus,
    conditions: Vec<crate::api::Condition>,
) -> Result<(), kube::Error> {
    api.patch_status(
        &cluster.name_any(),
        &PatchParams::default(),
        &Patch::Merge(json!({
            "metadata": {"resourceVersion": cluster.resource_version()},
            "status": {"upgrade": record, "conditions": conditions},
        })),
    )
    .await
    .map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A version source on this machine: answers by path (a document, one too large with and
    /// without a length, redirects to this host and to another, a 404, silence).
    async fn source() -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            loop {
                let Ok((mut c, _)) = listener.accept().await else {
                    return;
                };
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 4096];
                    let n = c.read(&mut buf).await.unwrap_or(0);
                    let head = String::from_utf8_lossy(&buf[..n]).to_string();
                    let path = head.split_whitespace().nth(1).unwrap_or("/").to_string();
                    let doc = r#"{"versions": [{"version": "25.3"}]}"#;
                    let answer: Vec<u8> = match path.as_str() {
                        "/doc" => format!(
                            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{doc}",
                            doc.len()
                        )
                        .into_bytes(),
                        "/big" => {
                            let mut a = b"HTTP/1.1 200 OK\r\nContent-Length: 1048576\r\n\r\n".to_vec();
                            a.extend(std::iter::repeat_n(b'x', 1 << 20));
                            a
                        }
                        "/big-chunked" => {
                            let mut a = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
                            for _ in 0..64 {
                                a.extend(b"4000\r\n");
                                a.extend(std::iter::repeat_n(b'x', 0x4000));
                                a.extend(b"\r\n");
                            }
                            a.extend(b"0\r\n\r\n");
                            a
                        }
                        "/here" => b"HTTP/1.1 302 Found\r\nLocation: /doc\r\nContent-Length: 0\r\n\r\n".to_vec(),
                        "/away" => format!(
                            "HTTP/1.1 302 Found\r\nLocation: http://127.0.0.2:{port}/doc\r\nContent-Length: 0\r\n\r\n"
                        )
                        .into_bytes(),
                        "/slow" => {
                            tokio::time::sleep(Duration::from_secs(30)).await;
                            Vec::new()
                        }
                        _ => b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n".to_vec(),
                    };
                    let _ = c.write_all(&answer).await;
                });
            }
        });
        format!("http://127.0.0.1:{port}")
    }

    /// Decision 37: the version source is read within bounds, and what goes wrong is said
    /// without a host, an address or the answer's content: plain http without `insecure`, a
    /// redirect to another host, an answer over 64 KiB (with or without a length), silence and
    /// an error status are refused; a redirect within the host and a document are read.
    #[tokio::test]
    async fn a_version_source_is_read_within_bounds_and_refusals_reveal_nothing() {
        let base = source().await;
        let t = Duration::from_secs(2);
        assert_eq!(
            fetch(&format!("{base}/doc"), false, t).await.unwrap_err(),
            "plain http:// is refused (set insecure: true to allow it)"
        );
        assert!(
            fetch(&format!("{base}/doc"), true, t)
                .await
                .unwrap()
                .contains("25.3")
        );
        assert!(
            fetch(&format!("{base}/here"), true, t)
                .await
                .unwrap()
                .contains("25.3")
        );
        let away = fetch(&format!("{base}/away"), true, t).await.unwrap_err();
        assert!(away.contains("redirected to another host"), "{away}");
        assert!(
            !away.contains("127.0.0.2"),
            "no address of another host: {away}"
        );
        for big in ["/big", "/big-chunked"] {
            assert_eq!(
                fetch(&format!("{base}{big}"), true, t).await.unwrap_err(),
                "the answer is larger than 64 KiB",
                "{big}"
            );
        }
        assert_eq!(
            fetch(&format!("{base}/slow"), true, Duration::from_secs(1))
                .await
                .unwrap_err(),
            "no answer within 1 s"
        );
        assert_eq!(
            fetch(&format!("{base}/missing"), true, t)
                .await
                .unwrap_err(),
            "it answered HTTP 404"
        );
        assert!(
            fetch("ftp://x/doc", true, t)
                .await
                .unwrap_err()
                .contains("not https://")
        );
        let closed = fetch("http://127.0.0.1:1/doc", true, t).await.unwrap_err();
        assert_eq!(closed, "cannot connect");
        // what a document held is not repeated in the error
        let leak =
            crate::plan::upgrade::parse_document(r#"{"versions": [{"version": "s3cr3t-token"}]}"#)
                .unwrap_err();
        assert!(!leak.contains("s3cr3t"), "{leak}");
        let leak =
            crate::plan::upgrade::parse_document(r#"{"versions": "s3cr3t-token"}"#).unwrap_err();
        assert!(!leak.contains("s3cr3t"), "{leak}");
    }
}
