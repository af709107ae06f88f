//! PURE: which ClickHouse version the cluster's configuration may rely on (decision 33).
//!
//! Some of what the operator writes is understood only by newer servers: the cluster
//! `<secret>` (20.10) makes 18.16 refuse the whole `remote_servers` file, `<grants>` of a users
//! file user (23.6) are ignored before. The image tag cannot be trusted to say what runs (a tag
//! such as `latest` names no version, a registry mirror may retag, the local kubelet runs 18.16
//! whatever the tag), so the operator relies on what the servers themselves report
//! (`SELECT version()`, read with the pass's health check):
//!
//! - the *recorded* version (`status.version`) is the lowest version reported by every
//!   server of the cluster, once each has answered; while some do not answer (a pod
//!   restarting), the record stays, lowered at once by any lower version that is reported;
//! - the version the configuration may rely on is the recorded one, lowered to the spec
//!   image's tag when that names a version: a downgrade turns the newer features off before
//!   the first pod restarts on the older image.

use std::collections::BTreeMap;

use crate::plan::upgrade::image_version;
use crate::version::Version;

/// The lowest version the servers of `live` replicas report: from `reported` when every one of
/// them answered, else the `recorded` one lowered by whatever was reported. `None` while no
/// version is known.
pub fn recorded_version(
    recorded: Option<&str>,
    reported: &BTreeMap<String, String>,
    live: &[&crate::api::ReplicaName],
) -> Option<Version> {
    let versions: Vec<Version> = live
        .iter()
        .filter_map(|r| reported.get(r.as_str())?.parse().ok())
        .collect();
    let lowest = versions.iter().min().copied();
    if !live.is_empty() && versions.len() == live.len() {
        return lowest;
    }
    let recorded = recorded.and_then(|v| v.parse::<Version>().ok());
    match (recorded, lowest) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (Some(a), None) => Some(a),
        (None, _) => None,
    }
}

/// The version the generated configuration may rely on: `recorded`, lowered to the version
/// the spec `image`'s tag names, if it names one.
pub fn usable_version(recorded: Option<Version>, image: &str) -> Option<Version> {
    let tag = image_version(image).map(|(_, v)| v);
    match (recorded, tag) {
        (Some(r), Some(t)) => Some(r.min(t)),
        (r, _) => r,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::version::Capability;

    fn reported(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(r, v)| (r.to_string(), v.to_string()))
            .collect()
    }

    /// Decision 33: the version is taken from what every server reports, the lowest one.
    #[test]
    fn the_recorded_version_is_the_lowest_every_server_reports() {
        let (a, b) = (
            crate::api::ReplicaName::from("a"),
            crate::api::ReplicaName::from("b"),
        );
        let live = [&a, &b];
        let both = reported(&[("a", "24.8.4.13"), ("b", "23.3.1.2823-lts")]);
        assert_eq!(
            recorded_version(None, &both, &live),
            Some("23.3.1.2823".parse().unwrap())
        );
        // one server not answering: nothing is recorded yet
        let one = reported(&[("a", "24.8.4.13")]);
        assert_eq!(recorded_version(None, &one, &live), None);
        // …and a record stays while a server restarts
        assert_eq!(
            recorded_version(Some("24.3.1.1"), &one, &live),
            Some("24.3.1.1".parse().unwrap())
        );
        // …but a lower version reported lowers it at once
        let lower = reported(&[("a", "18.16.1")]);
        assert_eq!(
            recorded_version(Some("24.3.1.1"), &lower, &live),
            Some("18.16.1".parse().unwrap())
        );
        // every server upgraded: the record rises
        let up = reported(&[("a", "25.3.1.1"), ("b", "25.3.1.1")]);
        assert_eq!(
            recorded_version(Some("24.3.1.1"), &up, &live),
            Some("25.3.1.1".parse().unwrap())
        );
        // no server yet
        assert_eq!(recorded_version(None, &BTreeMap::new(), &[]), None);
    }

    /// Decision 33: the image tag never raises the version (the local kubelet runs 18.16 for a
    /// `24.8` tag) but lowers it, so a downgrade turns newer features off before any pod
    /// restarts on the older image; a tag that names no version changes nothing.
    #[test]
    fn the_image_tag_only_lowers_the_usable_version() {
        let v = |s: &str| s.parse::<Version>().unwrap();
        assert_eq!(
            usable_version(Some(v("18.16.1")), "clickhouse/clickhouse-server:24.8"),
            Some(v("18.16.1"))
        );
        let down = usable_version(Some(v("24.8.4.13")), "yandex/clickhouse-server:19.16");
        assert_eq!(down, Some(v("19.16")));
        assert!(!down.unwrap().supports(Capability::ClusterSecret));
        assert_eq!(
            usable_version(Some(v("24.8.4.13")), "clickhouse/clickhouse-server:latest"),
            Some(v("24.8.4.13"))
        );
        assert_eq!(
            usable_version(None, "clickhouse/clickhouse-server:24.8"),
            None
        );
    }
}
