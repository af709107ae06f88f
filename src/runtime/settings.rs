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

/// The key of the PVC deletion proof; never printed.
#[derive(Clone, PartialEq, Eq)]
pub struct PvcDeleteKey {
    pub key: Vec<u8>,
    /// Set by `PVC_DELETE_KEY`, not made up by this process.
    pub shared: bool,
}

impl std::fmt::Debug for PvcDeleteKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "PvcDeleteKey({} bytes, shared: {})",
            self.key.len(),
            self.shared
        )
    }
}

impl PvcDeleteKey {
    /// From `PVC_DELETE_KEY` (at least 16 characters), or 32 random bytes of this process.
    pub fn from_value(value: Option<&str>) -> Result<PvcDeleteKey, String> {
        match value.map(str::trim).filter(|v| !v.is_empty()) {
            Some(v) if v.len() < 16 => Err("PVC_DELETE_KEY: must be at least 16 characters".into()),
            Some(v) => Ok(PvcDeleteKey {
                key: v.as_bytes().to_vec(),
                shared: true,
            }),
            None => Ok(PvcDeleteKey {
                key: (0..32).map(|_| rand::random::<u8>()).collect(),
                shared: false,
            }),
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
    /// The key the operator signs the PVCs it hands to the PVC cleaner with, and the cleaner
    /// checks them with (`PVC_DELETE_KEY`; the chart keeps it in a Secret). Without it, a key of
    /// this process's own: its in-process cleaner checks what it signs.
    pub pvc_delete_key: PvcDeleteKey,
    /// Namespace and name of the leader-election Lease.
    pub lease_namespace: String,
    pub lease_name: String,
    /// This replica's identity in the Lease (the pod name in a cluster).
    pub identity: String,
    /// The image backup and restore Jobs run (`OPERATOR_IMAGE`: the operator's own image, which
    /// the chart sets; the agent is a subcommand of the operator's binary).
    pub operator_image: String,
    /// Networks the operator, its backup agents and the exporter connect to ClickHouse from
    /// (`OPERATOR_NETWORKS`, comma-separated addresses or CIDRs): the only ones, with the
    /// cluster's own server pods, from which the operator's account accepts a login. Required
    /// in a pod, and holding its address (`POD_IP`, decision 71); outside a pod, unset, the
    /// networks of this machine's addresses.
    pub operator_networks: Vec<String>,
    /// The labels of the operator's pods (`OPERATOR_POD_SELECTOR`, `key=value,…`; the chart
    /// sets it, and the same labels select its exporter), in `lease_namespace`: the clusters'
    /// NetworkPolicies let these pods in. Unset: they let the operator's networks in.
    pub operator_pod_labels: Option<std::collections::BTreeMap<String, String>>,
    /// The Secret, in `lease_namespace`, where the operator publishes each cluster's exporter
    /// credentials and the exporter reads them (`EXPORTER_CREDENTIALS_SECRET`; the chart creates
    /// it), so that the exporter may read that one Secret and no other (decision 36). Unset:
    /// nothing is published, and the exporter reads each cluster's own Secrets.
    pub exporter_credentials: Option<String>,
    /// The file of defaults merged under every cluster's spec (decision 52) that
    /// `CLUSTER_DEFAULTS_FILE` names (the chart mounts its `clusterDefaults` there), read at
    /// start; none without it. A file that cannot be read stops the operator here, naming it;
    /// the controller parses it into the API's defaults, and a field that cannot take a default
    /// stops the operator at start too, naming the file.
    pub cluster_defaults_file: Option<DefaultsFile>,
    /// The label that names the ClickHouseCluster on the operator's per-cluster series
    /// (`METRICS_CLUSTER_LABEL`: `clickhouse_cluster`, the default, or `cluster`).
    pub metrics_cluster_label: crate::runtime::metrics::ClusterLabel,
    /// The most shards and replicas per shard a cluster may have (`MAX_SHARDS`,
    /// `MAX_REPLICAS`; decision 68), up to the CRD's ceilings.
    pub limits: crate::util::limits::Limits,
}

/// The operator-level defaults file (`CLUSTER_DEFAULTS_FILE`) as read at start.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DefaultsFile {
    /// The path as `CLUSTER_DEFAULTS_FILE` gives it (errors about the file quote it).
    pub path: String,
    /// The file's text.
    pub text: String,
}

/// Parses `key=value,…` (a label selector of equalities only).
pub fn parse_labels(
    value: &str,
    field: &str,
) -> Result<std::collections::BTreeMap<String, String>, String> {
    let mut out = std::collections::BTreeMap::new();
    for item in value.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        let (k, v) = item
            .split_once('=')
            .ok_or_else(|| format!("{field}: {item:?} is not key=value"))?;
        let (k, v) = (k.trim(), v.trim());
        if !crate::util::names::is_label_key(k) || !crate::util::names::is_label_value(v) {
            return Err(format!("{field}: {item:?} is not a label key=value"));
        }
        out.insert(k.to_string(), v.to_string());
    }
    Ok(out)
}

/// The networks of this machine's own (non-loopback) addresses, as [`pod_network_of`] guesses
/// them.
///
/// [`pod_network_of`]: crate::util::networks::pod_network_of
fn local_networks() -> Vec<String> {
    let mut out = Vec::new();
    let mut addrs: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `addrs` with a list that is freed below with freeifaddrs; every
    // node and address is read only while the list lives.
    unsafe {
        if libc::getifaddrs(&mut addrs) != 0 {
            return out;
        }
        let mut at = addrs;
        while !at.is_null() {
            let a = (*at).ifa_addr;
            if !a.is_null() {
                let ip: Option<std::net::IpAddr> = match i32::from((*a).sa_family) {
                    libc::AF_INET => {
                        let v4 = &*(a as *const libc::sockaddr_in);
                        Some(std::net::Ipv4Addr::from(u32::from_be(v4.sin_addr.s_addr)).into())
                    }
                    libc::AF_INET6 => {
                        let v6 = &*(a as *const libc::sockaddr_in6);
                        Some(std::net::Ipv6Addr::from(v6.sin6_addr.s6_addr).into())
                    }
                    _ => None,
                };
                if let Some(ip) = ip.filter(|ip| {
                    !ip.is_loopback()
                        && !matches!(ip, std::net::IpAddr::V6(v6) if v6.segments()[0] & 0xffc0 == 0xfe80)
                }) {
                    let n = crate::util::networks::pod_network_of(ip);
                    if !out.contains(&n) {
                        out.push(n);
                    }
                }
            }
            at = (*at).ifa_next;
        }
        libc::freeifaddrs(addrs);
    }
    out
}

/// The operator's networks as this process's environment gives them (empty if it gives none).
pub fn operator_networks_from_env() -> Vec<String> {
    operator_networks(
        std::env::var("OPERATOR_NETWORKS").ok().as_deref(),
        std::env::var("POD_IP").ok().as_deref(),
    )
    .unwrap_or_default()
}

/// `OPERATOR_NETWORKS`; outside a pod (no `POD_IP`), by default this machine's addresses.
///
/// In a pod it is required, and must hold the pod's own address (decision 71, review M-3): the
/// operator's account on every server accepts logins only from these networks, so a value that
/// misses the pod (a Node's pod CIDR when the pod runs on another Node, a CNI that hands out
/// addresses of its own pools) would lock the operator out of every server. Refusing to start
/// says so at once, in the pod's log and its restarts, instead of a guess around the pod's
/// address that other pods of the network (the exporter, the backup agents) may lie outside.
fn operator_networks(explicit: Option<&str>, pod_ip: Option<&str>) -> Result<Vec<String>, String> {
    let explicit = explicit.map(str::trim).filter(|v| !v.is_empty());
    let pod_ip = match pod_ip.map(str::trim).filter(|v| !v.is_empty()) {
        Some(ip) => Some(
            ip.parse::<std::net::IpAddr>()
                .map_err(|_| format!("POD_IP: {ip:?} is not an address"))?,
        ),
        None => None,
    };
    if let Some(v) = explicit {
        let list = crate::util::networks::parse_list(v, "OPERATOR_NETWORKS")?;
        if list.is_empty() {
            return Err("OPERATOR_NETWORKS: no network given".into());
        }
        if let Some(ip) = pod_ip
            && !list.iter().any(|n| crate::util::networks::contains(n, ip))
        {
            return Err(format!(
                "OPERATOR_NETWORKS ({}) does not hold this pod's address {ip} (POD_IP): the operator's logins would be refused on every server; set it (the chart's operatorNetworks) to the whole network pods get their addresses from",
                list.join(",")
            ));
        }
        return Ok(list);
    }
    if let Some(ip) = pod_ip {
        return Err(format!(
            "OPERATOR_NETWORKS is not set: in a pod ({ip}) it must name the networks pods get their addresses from (the chart's operatorNetworks), which the operator's account on every server accepts logins from"
        ));
    }
    let local = local_networks();
    if local.is_empty() {
        return Err(
            "OPERATOR_NETWORKS is not set and no address of this machine gives a network: set it"
                .into(),
        );
    }
    Ok(local)
}

/// `LOG_LEVEL`: a level or a filter (`info`, `clickhouse_operator=debug,kube=warn`); one that
/// does not parse is refused at start rather than silently replaced.
fn parse_log_level(value: Option<&str>) -> Result<String, String> {
    const LEVELS: [&str; 6] = ["off", "error", "warn", "info", "debug", "trace"];
    let level = value
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .unwrap_or("info");
    // a bare word is a target to the filter's syntax, so `verbose` or `infos` would parse (and
    // log nothing of the operator's own): a directive without `=` must be a level
    if let Some(bad) = level.split(',').map(str::trim).find(|d| {
        !d.is_empty()
            && !d.contains('=')
            && !d.contains('[')
            && !LEVELS.contains(&d.to_ascii_lowercase().as_str())
    }) {
        return Err(format!(
            "LOG_LEVEL {level:?}: {bad:?} is not a level (off, error, warn, info, debug, trace); a filter names targets as target=level"
        ));
    }
    tracing_subscriber::EnvFilter::try_new(level)
        .map(|_| level.to_string())
        .map_err(|e| {
            format!("LOG_LEVEL {level:?} is not a level (error, warn, info, debug, trace) or a filter: {e}")
        })
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

/// Every environment variable [`Settings`] reads (`run`, `pvc-cleaner` and `exporter` read
/// them): name, default, meaning. `clickhouse-operator run --help` lists them from here, and
/// [`Settings::from_lookup`] reads no other.
pub const ENV: &[(&str, &str, &str)] = &[
    (
        "WATCH_NAMESPACE",
        "all",
        "comma-separated namespaces to watch",
    ),
    (
        "MAX_CONCURRENT_RECONCILES",
        "1",
        "objects of each kind reconciled in parallel",
    ),
    ("LOG_FORMAT", "json", "json or text"),
    (
        "MAX_SHARDS",
        "256",
        "the most shards a cluster may have (1 to 1024, the CRD's maximum)",
    ),
    (
        "MAX_REPLICAS",
        "16",
        "the most replicas per shard a cluster may have (1 to 32, the CRD's maximum)",
    ),
    (
        "CLUSTER_DEFAULTS_FILE",
        "none",
        "a file of defaults merged under every cluster's spec (pod, keeper.pod, configuration.settings, profiles, quotas)",
    ),
    (
        "LOG_LEVEL",
        "info",
        "a tracing filter, e.g. info,clickhouse_operator=debug",
    ),
    (
        "HTTP_ADDR",
        "0.0.0.0:8080",
        "/metrics, /healthz and /readyz",
    ),
    (
        "METRICS_CLUSTER_LABEL",
        "clickhouse_cluster",
        "the label naming the ClickHouseCluster on the operator's metrics: clickhouse_cluster or cluster",
    ),
    (
        "LEADER_ELECTION",
        "true",
        "only the holder of the Lease acts; a standby takes over",
    ),
    (
        "PVC_CLEANER",
        "true",
        "also run the PVC cleaner in the operator",
    ),
    (
        "PVC_DELETE_KEY",
        "a key of this process",
        "the key (16 characters or more) PVCs handed to the PVC cleaner are signed with",
    ),
    ("POD_NAME", "HOSTNAME", "identity in the Lease"),
    (
        "HOSTNAME",
        "clickhouse-operator-<pid>",
        "identity in the Lease without POD_NAME",
    ),
    (
        "POD_NAMESPACE",
        "default",
        "namespace of the Lease and of EXPORTER_CREDENTIALS_SECRET",
    ),
    (
        "LEASE_NAME",
        "clickhouse-operator-leader",
        "name of the Lease",
    ),
    (
        "POD_IP",
        "none",
        "the operator's address (set in a pod): it must lie in OPERATOR_NETWORKS",
    ),
    (
        "OPERATOR_NETWORKS",
        "required in a pod (POD_IP); outside one, this machine's addresses",
        "comma-separated addresses or CIDRs the operator connects to ClickHouse from",
    ),
    (
        "OPERATOR_POD_SELECTOR",
        "none",
        "key=value,... of the operator's pods, which the clusters' NetworkPolicies let in",
    ),
    (
        "EXPORTER_CREDENTIALS_SECRET",
        "none",
        "the Secret the operator publishes exporter credentials in",
    ),
    (
        "OPERATOR_IMAGE",
        "the released image of this version",
        "the image of backup and restore Jobs",
    ),
];

/// The list of [`ENV`] for `--help`.
pub fn env_help() -> String {
    let width = ENV.iter().map(|(n, _, _)| n.len()).max().unwrap_or(0);
    let mut out = String::from("Environment (default in brackets):\n");
    for (name, default, meaning) in ENV {
        out.push_str(&format!("  {name:width$}  {meaning} [{default}]\n"));
    }
    out.push_str("Kubernetes: the in-cluster configuration, or KUBECONFIG.");
    out
}

impl Settings {
    /// Reads the settings through `get` (the process environment in production); only the
    /// variables of [`ENV`].
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Settings, String> {
        let get = |name: &str| {
            debug_assert!(
                ENV.iter().any(|(n, _, _)| *n == name),
                "{name} is read but not listed in settings::ENV"
            );
            get(name)
        };
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
        let operator_networks = operator_networks(
            get("OPERATOR_NETWORKS").as_deref(),
            get("POD_IP").as_deref(),
        )?;
        let operator_pod_labels =
            match get("OPERATOR_POD_SELECTOR").filter(|v| !v.trim().is_empty()) {
                None => None,
                Some(v) => Some(parse_labels(&v, "OPERATOR_POD_SELECTOR")?),
            };
        let exporter_credentials = match get("EXPORTER_CREDENTIALS_SECRET")
            .map(|v| v.trim().to_string())
            .filter(|v| !v.is_empty())
        {
            None => None,
            Some(v) if crate::util::names::is_dns_subdomain(&v) => Some(v),
            Some(v) => {
                return Err(format!(
                    "EXPORTER_CREDENTIALS_SECRET: {v:?} is not a Secret name"
                ));
            }
        };
        let cluster_defaults_file =
            match get("CLUSTER_DEFAULTS_FILE").filter(|v| !v.trim().is_empty()) {
                None => None,
                Some(path) => {
                    let text = std::fs::read_to_string(path.trim())
                        .map_err(|e| format!("CLUSTER_DEFAULTS_FILE: cannot read {path:?}: {e}"))?;
                    Some(DefaultsFile { path, text })
                }
            };
        let metrics_cluster_label = crate::runtime::metrics::ClusterLabel::parse(
            get("METRICS_CLUSTER_LABEL").as_deref(),
            "METRICS_CLUSTER_LABEL",
        )?;
        let limits = crate::util::limits::Limits::from_lookup(get)?;
        Ok(Settings {
            limits,
            metrics_cluster_label,
            cluster_defaults_file,
            exporter_credentials,
            operator_pod_labels,
            operator_networks,
            watch_namespaces: WatchNamespaces::parse(get("WATCH_NAMESPACE").as_deref())?,
            max_concurrent_reconciles: parse_max_concurrent(
                get("MAX_CONCURRENT_RECONCILES").as_deref(),
            )?,
            log_format,
            log_level: parse_log_level(get("LOG_LEVEL").as_deref())?,
            http_addr,
            leader_election,
            pvc_cleaner,
            pvc_delete_key: PvcDeleteKey::from_value(get("PVC_DELETE_KEY").as_deref())?,
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
                        crate::version::OPERATOR_VERSION
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

    /// Decision 52: `CLUSTER_DEFAULTS_FILE` is read at start: a file that cannot be read stops
    /// the operator, naming it (what the file holds is checked by the controller's
    /// `cluster_defaults`).
    #[test]
    fn the_cluster_defaults_file_is_read_at_start_and_an_unreadable_one_stops_it() {
        let dir = std::env::temp_dir().join(format!("chop-defaults-file-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("d.yaml");
        std::fs::write(&path, "pod: {nodeSelector: {pool: db}}").unwrap();
        let path = path.display().to_string();
        let ok = Settings::from_lookup(|k| (k == "CLUSTER_DEFAULTS_FILE").then(|| path.clone()))
            .unwrap();
        assert_eq!(
            ok.cluster_defaults_file,
            Some(DefaultsFile {
                path: path.clone(),
                text: "pod: {nodeSelector: {pool: db}}".into()
            })
        );
        let e = Settings::from_lookup(|k| {
            (k == "CLUSTER_DEFAULTS_FILE").then(|| "/nonexistent/defaults.yaml".to_string())
        })
        .unwrap_err();
        assert!(
            e.contains("CLUSTER_DEFAULTS_FILE") && e.contains("cannot read"),
            "{e}"
        );
        assert_eq!(
            Settings::from_lookup(|_| None)
                .unwrap()
                .cluster_defaults_file,
            None
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

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

    /// A level or a filter is taken; a word that is neither, or a filter that does not parse,
    /// is refused at start with what is wrong (not silently replaced by `info`).
    #[test]
    fn a_log_level_that_is_not_a_level_or_filter_is_refused() {
        assert_eq!(parse_log_level(None), Ok("info".into()));
        assert_eq!(parse_log_level(Some(" ")), Ok("info".into()));
        assert_eq!(parse_log_level(Some("debug")), Ok("debug".into()));
        assert_eq!(parse_log_level(Some("WARN")), Ok("WARN".into()));
        assert_eq!(
            parse_log_level(Some("info,clickhouse_operator=debug,kube=warn")),
            Ok("info,clickhouse_operator=debug,kube=warn".into())
        );
        for bad in ["verbose", "infos", "info,chatty", "kube=loud"] {
            let e = parse_log_level(Some(bad)).unwrap_err();
            assert!(e.contains("LOG_LEVEL"), "{bad}: {e}");
        }
    }

    /// S2-08: the default is 1; zero and garbage are refused (the slots themselves, end to end:
    /// `tests/e2e/concurrency.rs`).
    #[test]
    fn max_concurrent_reconciles_defaults_to_one_and_refuses_zero_and_garbage() {
        assert_eq!(parse_max_concurrent(None), Ok(1));
        assert_eq!(parse_max_concurrent(Some("")), Ok(1));
        assert_eq!(parse_max_concurrent(Some("4")), Ok(4));
        assert!(parse_max_concurrent(Some("0")).is_err());
        assert!(parse_max_concurrent(Some("-1")).is_err());
        assert!(parse_max_concurrent(Some("many")).is_err());
    }

    /// With (nearly) nothing set, every variable of [`ENV`] is read (the fallbacks too), and
    /// no other.
    #[test]
    fn the_settings_read_exactly_the_listed_variables() {
        let read = std::sync::Mutex::new(BTreeSet::new());
        let settings = Settings::from_lookup(|k| {
            read.lock().unwrap().insert(k.to_string());
            (k == "OPERATOR_NETWORKS").then(|| "10.0.0.0/8".to_string())
        });
        assert!(settings.is_ok(), "{settings:?}");
        let listed: BTreeSet<String> = ENV.iter().map(|(n, _, _)| n.to_string()).collect();
        assert_eq!(read.into_inner().unwrap(), listed);
        assert_eq!(listed.len(), ENV.len(), "a variable is listed twice");
        let help = env_help();
        for (name, _, _) in ENV {
            assert!(help.contains(name), "{help}");
        }
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
        use crate::runtime::metrics::ClusterLabel;
        assert_eq!(s.metrics_cluster_label, ClusterLabel::ClickHouseCluster);
        let label = |v: &'static str| {
            Settings::from_lookup(move |k| (k == "METRICS_CLUSTER_LABEL").then(|| v.to_string()))
        };
        assert_eq!(
            label("cluster").unwrap().metrics_cluster_label,
            ClusterLabel::Cluster
        );
        assert!(
            label("kubernetes_cluster")
                .unwrap_err()
                .contains("METRICS_CLUSTER_LABEL")
        );
        let bad = Settings::from_lookup(|k| (k == "LOG_FORMAT").then(|| "xml".to_string()));
        assert!(bad.unwrap_err().contains("LOG_FORMAT"));
        assert_eq!(s.exporter_credentials, None);
        let named = |v: &str| {
            let v = v.to_string();
            Settings::from_lookup(move |k| (k == "EXPORTER_CREDENTIALS_SECRET").then(|| v.clone()))
        };
        assert_eq!(
            named("rel-exporter-credentials")
                .unwrap()
                .exporter_credentials
                .as_deref(),
            Some("rel-exporter-credentials")
        );
        for hostile in ["../x", "a/b", "A_B"] {
            assert!(
                named(hostile)
                    .unwrap_err()
                    .contains("EXPORTER_CREDENTIALS_SECRET"),
                "{hostile}"
            );
        }
    }

    /// Decision 27: the operator's account accepts logins from `OPERATOR_NETWORKS`; outside a
    /// pod, unset, from this machine's addresses (never loopback alone, never everything); a bad
    /// value is refused with its variable.
    /// Decision 71 (review M-3): in a pod (`POD_IP`) it is required, and the operator refuses to
    /// start when the pod's own address lies outside it, where it used to guess the /16 around
    /// the pod's address or accept networks its own pod is not in.
    #[test]
    fn operator_networks_come_from_the_setting_and_must_hold_the_pods_address() {
        assert_eq!(
            operator_networks(Some("10.0.0.0/8, 192.168.1.5"), Some("10.244.1.2")).unwrap(),
            ["10.0.0.0/8", "192.168.1.5/32"]
        );
        assert_eq!(
            operator_networks(Some("fd00:1::/32"), Some("fd00:1:2:3::9")).unwrap(),
            ["fd00:1::/32"]
        );
        for (networks, ip) in [
            (None, "10.244.1.2"),
            (Some(" "), "fd00:1:2:3::9"),
            (Some("10.244.0.0/24"), "10.244.1.2"),
            (Some("10.244.1.2/32,fd00::/8"), "10.244.1.3"),
            (Some("fd00::/8"), "10.244.1.2"),
        ] {
            let why = operator_networks(networks, Some(ip)).unwrap_err();
            assert!(
                why.starts_with("OPERATOR_NETWORKS ") && why.contains(ip)
                    || why.contains(&format!("in a pod ({ip})")),
                "{networks:?} {ip}: {why}"
            );
        }
        let local = operator_networks(None, None).unwrap();
        assert!(!local.is_empty());
        assert!(
            local
                .iter()
                .all(|n| n != "::/0" && n != "0.0.0.0/0" && !n.starts_with("127."))
        );
        assert!(
            operator_networks(Some("everywhere"), None)
                .unwrap_err()
                .starts_with("OPERATOR_NETWORKS: ")
        );
        assert!(
            operator_networks(None, Some("pod"))
                .unwrap_err()
                .starts_with("POD_IP: ")
        );
        assert!(
            Settings::from_lookup(|k| (k == "POD_IP").then(|| "198.18.1.7".to_string())).is_err()
        );
        let s = Settings::from_lookup(|k| match k {
            "POD_IP" => Some("198.18.1.7".to_string()),
            "OPERATOR_NETWORKS" => Some("198.18.0.0/15".to_string()),
            _ => None,
        })
        .unwrap();
        assert_eq!(s.operator_networks, ["198.18.0.0/15"]);
    }
}
