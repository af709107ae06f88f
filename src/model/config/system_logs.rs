//! `spec.systemLogs`: a TTL on each system log table (decision 49), so that `query_log`,
//! `part_log`, `metric_log` and the rest do not grow until the data volume is full.
//!
//! ClickHouse creates a system log table at startup from its section of the configuration
//! (`<query_log>`); from 21.1 a `<ttl>` there becomes the table's TTL, and a table found with
//! another definition is renamed (`query_log_0`) and created anew. A section written for a
//! table the image's configuration does not have turns that log on, so the defaults are only
//! the tables the images' `config.xml` turns on; the others are written only when the spec names
//! them.
//!
//! The file depends on the server version (nothing before 21.1, which ignores the element, and
//! 18.16, which has no table TTL at all): the version the servers report, or while none is
//! known the version the image tag names. What restarts the servers is the spec
//! ([`spec_hash`]), not the file: the version the operator learns after the pods started, or an
//! operator upgrade that brings the default, changes the file and restarts nothing; the servers
//! read it at their next start (invariant 9).

use super::xml::{Element, ROOT};
use crate::api::{ClickHouseClusterSpec, SystemLogsSpec};
use crate::util::json_hash;
use crate::version::{Capability, Version};

/// The file in the common ConfigMap.
pub const SYSTEM_LOGS_FILE: &str = "00-operator-system-logs.xml";

pub use crate::conventions::{DEFAULT_TABLES, OPTIONAL_TABLES, is_known};

/// The days of each table that gets a TTL under `spec` (see [`SystemLogsSpec::ttls`]).
pub fn ttls(spec: Option<&SystemLogsSpec>) -> Vec<(String, u32)> {
    SystemLogsSpec::ttls(spec)
}

/// The version the file is written for: the servers' reported one, else the image tag's.
pub fn version_for(reported: Option<Version>, image: &str) -> Option<Version> {
    reported.or_else(|| {
        let (repo, tag) = image.rsplit_once(':')?;
        if repo.is_empty() || tag.contains('/') {
            return None;
        }
        tag.parse().ok()
    })
}

/// `00-operator-system-logs.xml`: each table's `<ttl>` where `version` has
/// [`Capability::SystemLogTtl`]; a root element only otherwise (an unknown version too).
pub fn file(spec: &ClickHouseClusterSpec, version: Option<Version>) -> String {
    let mut root = Element::new(ROOT);
    if version.is_some_and(|v| v.supports(Capability::SystemLogTtl)) {
        root = root.children(ttls(spec.system_logs.as_ref()).into_iter().map(|(t, d)| {
            Element::new(&t).child(Element::leaf(
                "ttl",
                format!("event_date + INTERVAL {d} DAY DELETE"),
            ))
        }));
    }
    root.to_document()
}

/// The pod-template hash of `spec.systemLogs` ([`crate::model::labels::SYSTEM_LOGS_HASH`]):
/// only when it is set, so that clusters that never set it (and ran before it existed) keep
/// their templates.
pub fn spec_hash(spec: &ClickHouseClusterSpec) -> Option<String> {
    let s = spec.system_logs.as_ref()?;
    Some(json_hash(&serde_json::json!(ttls(Some(s)))))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::spec;

    fn v(s: &str) -> Option<Version> {
        Some(s.parse().unwrap())
    }

    /// Decision 49: unset, every default table gets 30 days, in one element each.
    #[test]
    fn the_default_is_thirty_days_on_the_default_tables() {
        let f = file(&spec(serde_json::json!({})), v("24.8.4.13"));
        for t in DEFAULT_TABLES {
            let want = format!(
                "    <{t}>\n        <ttl>event_date + INTERVAL 30 DAY DELETE</ttl>\n    </{t}>\n"
            );
            assert!(f.contains(&want), "{t}: {f}");
        }
        assert!(!f.contains("text_log"), "{f}");
        assert!(!f.contains("opentelemetry"), "{f}");
    }

    /// Decision 49: `ttlDays`, a table's own days, a table turned off with 0, an optional
    /// table named, and the off switch.
    #[test]
    fn days_per_table_and_the_off_switch() {
        let s = spec(serde_json::json!({"systemLogs": {"ttlDays": 7,
            "tables": {"query_log": 90, "trace_log": 0, "text_log": 3}}}));
        let t = ttls(s.system_logs.as_ref());
        let t: Vec<(&str, u32)> = t.iter().map(|(n, d)| (n.as_str(), *d)).collect();
        assert_eq!(
            t,
            vec![
                ("asynchronous_metric_log", 7),
                ("metric_log", 7),
                ("part_log", 7),
                ("query_log", 90),
                ("query_thread_log", 7),
                ("text_log", 3),
            ]
        );
        let f = file(&s, v("25.3"));
        assert!(f.contains("INTERVAL 90 DAY"), "{f}");
        assert!(!f.contains("trace_log"), "{f}");
        let off = spec(serde_json::json!({"systemLogs": {"ttlDays": 0}}));
        assert!(ttls(off.system_logs.as_ref()).is_empty());
        assert!(!file(&off, v("25.3")).contains("_log"));
    }

    /// Decision 49: nothing before 21.1 (18.16 has no table TTL; 20.x ignores the element) nor
    /// while no version is known; the image tag stands in for a version not reported yet,
    /// and the reported one wins over it.
    #[test]
    fn the_file_follows_the_version_the_servers_run() {
        let s = spec(serde_json::json!({}));
        assert!(!file(&s, v("18.16.1")).contains("_log"));
        assert!(!file(&s, v("20.12.5")).contains("_log"));
        assert!(!file(&s, None).contains("_log"));
        assert!(file(&s, v("21.1")).contains("query_log"));
        let img = "clickhouse/clickhouse-server:24.8";
        assert_eq!(version_for(None, img), v("24.8"));
        assert_eq!(version_for(v("18.16.1"), img), v("18.16.1"));
        assert_eq!(
            version_for(None, "clickhouse/clickhouse-server:latest"),
            None
        );
        assert_eq!(version_for(None, "registry:5000/clickhouse"), None);
    }

    /// Decision 49, invariant 9: the pod template carries a hash of the spec only when
    /// `spec.systemLogs` is set; equal TTLs hash alike, other TTLs differently.
    #[test]
    fn only_a_set_spec_is_hashed_into_the_pod_template() {
        assert_eq!(spec_hash(&spec(serde_json::json!({}))), None);
        let a = spec_hash(&spec(serde_json::json!({"systemLogs": {}})));
        let b = spec_hash(&spec(serde_json::json!({"systemLogs": {"ttlDays": 30}})));
        let c = spec_hash(&spec(serde_json::json!({"systemLogs": {"ttlDays": 7}})));
        assert!(a.is_some());
        assert_eq!(a, b);
        assert_ne!(a, c);
    }
}
