//! Operator settings from the environment.

use std::collections::BTreeSet;
use std::net::SocketAddr;

/// Which namespaces the operator watches.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WatchNamespaces {
    All,
    Only(Vec<String>),
}

impl WatchNamespaces {
    /// Parses `WATCH_NAMESPACE`: empty or unset means all namespaces; otherwise a comma-separated
    /// list (blanks around names and empty items are ignored, duplicates removed, order kept).
    pub fn parse(value: Option<&str>) -> Result<WatchNamespaces, String> {
        let mut seen = BTreeSet::new();
        let mut list = Vec::new();
        for item in value.unwrap_or("").split(',') {
            let ns = item.trim();
            if ns.is_empty() {
                continue;
            }
            if !crate::util::names::is_dns_label(ns) {
                return Err(format!("WATCH_NAMESPACE: {ns:?} is not a namespace name"));
            }
            if seen.insert(ns.to_string()) {
                list.push(ns.to_string());
            }
        }
        Ok(if list.is_empty() {
            WatchNamespaces::All
        } else {
            WatchNamespaces::Only(list)
        })
    }

    pub fn includes(&self, ns: &str) -> bool {
        match self {
            WatchNamespaces::All => true,
            WatchNamespaces::Only(list) => list.iter().any(|n| n == ns),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogFormat {
    Json,
    Text,
}

#[derive(Clone, Debug)]
pub struct Settings {
    pub watch_namespaces: WatchNamespaces,
    /// Objects of each kind reconciled in parallel (clusters and backups counted separately).
    pub max_concurrent_reconciles: u16,
    pub log_format: LogFormat,
    pub log_level: String,
    /// Address of `/metrics`, `/healthz` and `/readyz`.
    pub http_addr: SocketAddr,
    pub leader_election: bool,
    /// Run the PVC cleaner inside the operator too (it can also run alone: `pvc-cleaner`).
    pub pvc_cleaner: bool,
    /// Namespace and name of the leader-election Lease.
    pub lease_namespace: String,
    pub lease_name: String,
    /// This replica's identity in the Lease (the pod name in a cluster).
    pub identity: String,
    /// The image backup and restore Jobs run (`OPERATOR_IMAGE`: the operator's own image, which
    /// the chart sets; the agent is a subcommand of the operator's binary).
    pub operator_image: String,
}

fn parse_max_concurrent(value: Option<&str>) -> Result<u16, String> {
    match value.map(str::trim).filter(|v| !v.is_empty()) {
        None => Ok(1),
        Some(v) => match v.parse::<u16>() {
            Ok(n) if n >= 1 => Ok(n),
            _ => Err(format!(
                "MAX_CONCURRENT_RECONCILES: {v:?} must be a whole number from 1 to 65535"
            )),
        },
    }
}

impl Settings {
    /// Reads the settings through `get` (the process environment in production).
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Settings, String> {
        let log_format = match get("LOG_FORMAT")
            .as_deref()
            .map(str::to_ascii_lowercase)
            .as_deref()
        {
            None | Some("") | Some("json") => LogFormat::Json,
            Some("text") => LogFormat::Text,
            Some(other) => return Err(format!("LOG_FORMAT: {other:?} must be json or text")),
        };
        let http_addr = get("HTTP_ADDR")
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| "0.0.0.0:8080".into());
        let http_addr = http_addr.parse().map_err(|_| {
            format!("HTTP_ADDR: {http_addr:?} is not an address such as 0.0.0.0:8080")
        })?;
        let leader_election = match get("LEADER_ELECTION").as_deref() {
            None | Some("") | Some("true") => true,
            Some("false") => false,
            Some(other) => return Err(format!("LEADER_ELECTION: {other:?} must be true or false")),
        };
        let pvc_cleaner = match get("PVC_CLEANER").as_deref() {
            None | Some("") | Some("true") => true,
            Some("false") => false,
            Some(other) => return Err(format!("PVC_CLEANER: {other:?} must be true or false")),
        };
        let identity = get("POD_NAME")
            .filter(|s| !s.is_empty())
            .or_else(|| get("HOSTNAME").filter(|s| !s.is_empty()))
            .unwrap_or_else(|| format!("clickhouse-operator-{}", std::process::id()));
        Ok(Settings {
            watch_namespaces: WatchNamespaces::parse(get("WATCH_NAMESPACE").as_deref())?,
            max_concurrent_reconciles: parse_max_concurrent(
                get("MAX_CONCURRENT_RECONCILES").as_deref(),
            )?,
            log_format,
            log_level: get("LOG_LEVEL")
                .filter(|s| !s.is_empty())
                .unwrap_or_else(|| "info".into()),
            http_addr,
            leader_election,
            pvc_cleaner,
            lease_namespace: get("POD_NAMESPACE")
                .filter(|s| !s.is_empty())
                .unwrap_or_else(|| "default".into()),
            lease_name: get("LEASE_NAME")
                .filter(|s| !s.is_empty())
                .unwrap_or_else(|| "clickhouse-operator-leader".into()),
            identity,
            operator_image: get("OPERATOR_IMAGE")
                .filter(|s| !s.is_empty())
                .unwrap_or_else(|| {
                    format!(
                        "ghcr.io/clickhouse-operator/clickhouse-operator:{}",
                        crate::api::validate::OPERATOR_VERSION
                    )
                }),
        })
    }

    pub fn from_env() -> Result<Settings, String> {
        Settings::from_lookup(|k| std::env::var(k).ok())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    /// S2-07: empty or unset watches everything; a comma-separated list watches those.
    #[test]
    fn empty_watch_namespace_watches_all_and_a_list_watches_those() {
        assert_eq!(WatchNamespaces::parse(None), Ok(WatchNamespaces::All));
        assert_eq!(WatchNamespaces::parse(Some("")), Ok(WatchNamespaces::All));
        assert_eq!(
            WatchNamespaces::parse(Some(" , ,")),
            Ok(WatchNamespaces::All)
        );
        assert_eq!(
            WatchNamespaces::parse(Some("t1")),
            Ok(WatchNamespaces::Only(vec!["t1".into()]))
        );
        assert_eq!(
            WatchNamespaces::parse(Some(" t2 ,t1,, t2")),
            Ok(WatchNamespaces::Only(vec!["t2".into(), "t1".into()]))
        );
        assert!(WatchNamespaces::parse(Some("t1,Bad_NS")).is_err());
        let only = WatchNamespaces::parse(Some("t1")).unwrap();
        assert!(only.includes("t1") && !only.includes("t2"));
        assert!(WatchNamespaces::All.includes("anything"));
    }

    /// S2-08: the default is 1; zero and garbage are refused.
    #[test]
    fn max_concurrent_reconciles_defaults_to_one_and_refuses_zero_and_garbage() {
        assert_eq!(parse_max_concurrent(None), Ok(1));
        assert_eq!(parse_max_concurrent(Some("")), Ok(1));
        assert_eq!(parse_max_concurrent(Some("4")), Ok(4));
        assert!(parse_max_concurrent(Some("0")).is_err());
        assert!(parse_max_concurrent(Some("-1")).is_err());
        assert!(parse_max_concurrent(Some("many")).is_err());
    }

    #[test]
    fn settings_from_environment() {
        let env: HashMap<&str, &str> = [
            ("WATCH_NAMESPACE", "a,b"),
            ("MAX_CONCURRENT_RECONCILES", "2"),
            ("LOG_FORMAT", "TEXT"),
            ("POD_NAME", "op-0"),
            ("POD_NAMESPACE", "ops"),
        ]
        .into();
        let s = Settings::from_lookup(|k| env.get(k).map(|v| v.to_string())).unwrap();
        assert_eq!(s.max_concurrent_reconciles, 2);
        assert_eq!(s.log_format, LogFormat::Text);
        assert_eq!(s.identity, "op-0");
        assert_eq!(s.lease_namespace, "ops");
        assert!(s.leader_election);
        let bad = Settings::from_lookup(|k| (k == "LOG_FORMAT").then(|| "xml".to_string()));
        assert!(bad.unwrap_err().contains("LOG_FORMAT"));
    }
}
