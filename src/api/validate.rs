//! What only the operator can check about a ClickHouseCluster (the API server checks the CEL
//! rules of the CRD first). An invalid spec becomes status `error` with these messages; it never
//! causes a write to a managed object.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use super::cluster::{ClickHouseClusterSpec, PodSettings};
use crate::util::names::{
    is_dns_label, is_dns_subdomain, is_label_key, is_label_value, operator_secret, users_secret,
};
use crate::util::{cron::Cron, quantity};

/// This operator's version, also the newest resource format it understands (`spec.crVersion`):
/// the package version, or `CLICKHOUSE_OPERATOR_VERSION` when set at build time (a release
/// build, or the test that swaps one build for another).
pub const OPERATOR_VERSION: &str = match option_env!("CLICKHOUSE_OPERATOR_VERSION") {
    Some(v) => v,
    None => env!("CARGO_PKG_VERSION"),
};

/// Longest cluster name: every object name derived from it must stay a valid DNS label.
pub const MAX_CLUSTER_NAME_LEN: usize = 40;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldError {
    pub field: String,
    pub message: String,
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

/// A finding that is allowed but worth saying (decision 16: no redundancy).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Warning(pub String);

/// Label key prefixes the operator owns on its pods; users cannot set them.
const RESERVED_LABEL_PREFIXES: [&str; 2] = ["clickhouse.com/", "app.kubernetes.io/"];

fn parse_version(v: &str) -> Option<(u64, u64, u64)> {
    let v = v.trim().trim_start_matches('v');
    let mut it = v.split('.');
    let major = it.next()?.parse().ok()?;
    let minor = it.next().unwrap_or("0").parse().ok()?;
    let patch = it.next().unwrap_or("0").parse().ok()?;
    if it.next().is_some() {
        return None;
    }
    Some((major, minor, patch))
}

/// Checks a cluster's name and spec. Returns every error (not just the first) and the warnings.
pub fn validate(name: &str, spec: &ClickHouseClusterSpec) -> (Vec<FieldError>, Vec<Warning>) {
    let mut errors = Errors::default();
    check_name(name, &mut errors);
    check_counts(spec, &mut errors);
    check_images(spec, &mut errors);
    check_storage(spec, &mut errors);
    check_disruption_budget(spec, &mut errors);
    check_secrets(name, spec, &mut errors);
    check_tls(spec, &mut errors);
    check_backup_schedules(spec, &mut errors);
    check_upgrade_options(spec, &mut errors);
    for (which, pod, reserved) in [
        ("spec.pod", &spec.pod, super::SERVER_RESERVED_ENV),
        (
            "spec.keeper.pod",
            &spec.keeper.pod,
            super::KEEPER_RESERVED_ENV,
        ),
    ] {
        check_pod(which, pod, reserved, &mut errors);
    }
    check_keeper_start(spec, &mut errors);
    check_configuration(name, spec, &mut errors);
    check_system_logs(spec, &mut errors);
    check_logging(spec, &mut errors);
    check_protocols(spec, &mut errors);
    check_replicated_access(spec, &mut errors);
    check_client_service(spec, &mut errors);
    check_cr_version(spec, &mut errors);
    (errors.0, warnings(spec))
}

/// The errors found so far, in the order the checks found them.
#[derive(Default)]
struct Errors(Vec<FieldError>);

impl Errors {
    fn add(&mut self, field: &str, message: String) {
        self.0.push(FieldError {
            field: field.to_string(),
            message,
        });
    }
}

/// `metadata.name`: every object name derived from it must stay a valid DNS label.
fn check_name(name: &str, errors: &mut Errors) {
    if !is_dns_label(name) || name.len() > MAX_CLUSTER_NAME_LEN {
        errors.add(
            "metadata.name",
            format!(
                "{name:?} must be a DNS label (lower-case letters, digits, '-', starting with a letter) of at most {MAX_CLUSTER_NAME_LEN} characters"
            ),
        );
    }
}

/// Shards, replicas and Keeper members: at least one shard and replica, a Keeper ensemble
/// that can form a quorum, and Keeper wherever tables are replicated.
fn check_counts(spec: &ClickHouseClusterSpec, errors: &mut Errors) {
    if spec.shards < 1 {
        errors.add(
            "spec.shards",
            format!("must be at least 1, got {}", spec.shards),
        );
    }
    if spec.replicas < 1 {
        errors.add(
            "spec.replicas",
            format!("must be at least 1, got {}", spec.replicas),
        );
    }
    let k = spec.keeper.replicas;
    if !matches!(k, 0 | 1 | 3 | 5 | 7) {
        errors.add(
            "spec.keeper.replicas",
            format!("must be 0 or an odd number up to 7 (quorum needs a majority), got {k}"),
        );
    }
    if let Some(x) = &spec.keeper.external {
        if k != 0 {
            errors.add(
                "spec.keeper.replicas",
                format!(
                    "must be 0 with spec.keeper.external (an ensemble of its own besides), got {k}"
                ),
            );
        }
        match (x.nodes.is_empty(), &x.cluster_ref) {
            (true, None) | (false, Some(_)) => errors.add(
                "spec.keeper.external",
                "needs either nodes or clusterRef".into(),
            ),
            _ => {}
        }
        for (i, n) in x.nodes.iter().enumerate() {
            if n.host.trim().is_empty() || n.host.contains(|c: char| c.is_whitespace() || c == '/')
            {
                errors.add(
                    &format!("spec.keeper.external.nodes[{i}].host"),
                    format!("{:?} is not a host name or address", n.host),
                );
            }
            if !(1..=65535).contains(&n.port) {
                errors.add(
                    &format!("spec.keeper.external.nodes[{i}].port"),
                    format!("{} is not a port", n.port),
                );
            }
        }
        if let Some(r) = &x.cluster_ref
            && (!is_dns_label(&r.name) || r.namespace.as_deref().is_some_and(|n| !is_dns_label(n)))
        {
            errors.add(
                "spec.keeper.external.clusterRef",
                "must name a ClickHouseCluster (and its namespace) by DNS labels".into(),
            );
        }
        if let Some(root) = &x.root {
            let ok = root.starts_with('/')
                && root.len() > 1
                && !root.ends_with('/')
                && root.split('/').skip(1).all(|p| {
                    !p.is_empty()
                        && p != "."
                        && p != ".."
                        && p.chars()
                            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
                });
            if !ok {
                errors.add(
                    "spec.keeper.external.root",
                    format!("{root:?} is not an absolute Keeper path such as /clickhouse/prod (letters, digits, '-', '_', '.')"),
                );
            }
        }
    }
    if k == 0 && spec.replicas > 1 && spec.keeper.external.is_none() {
        errors.add(
            "spec.keeper.replicas",
            format!(
                "is 0 but spec.replicas is {}: replicated tables need Keeper",
                spec.replicas
            ),
        );
    }
}

/// The server and Keeper images must be named; Keeper's cannot be a `-distroless` tag.
fn check_images(spec: &ClickHouseClusterSpec, errors: &mut Errors) {
    if spec.image.trim().is_empty() {
        errors.add("spec.image", "must not be empty".into());
    }
    if spec.keeper.image.trim().is_empty() {
        errors.add("spec.keeper.image", "must not be empty".into());
    }
    if spec.keeper.replicas > 0
        && spec.keeper.external.is_none()
        && is_distroless(&spec.keeper.image)
    {
        errors.add(
            "spec.keeper.image",
            format!(
                "{:?} is a distroless image: it has no shell, and the Keeper pod needs one (its \
                 command derives the member's raft id from the pod's ordinal, its readiness probe \
                 asks `srvr`); use the same version without the -distroless suffix",
                spec.keeper.image
            ),
        );
    }
}

/// Is `image` a `-distroless` tag (no shell, no `/entrypoint.sh`)?
fn is_distroless(image: &str) -> bool {
    let no_digest = image.split('@').next().unwrap_or_default();
    let last = no_digest.rsplit('/').next().unwrap_or_default();
    last.split_once(':')
        .is_some_and(|(_, tag)| tag.ends_with("-distroless") || tag == "distroless")
}

/// Keeper's own `startup_timeout` (`spec.keeper.settings`), when given, must end before the
/// startup probe's budget: Keeper opens its client port, which the probe checks, only with a
/// quorum or once that timeout has passed.
fn check_keeper_start(spec: &ClickHouseClusterSpec, errors: &mut Errors) {
    let Some(value) = spec.keeper.settings.get("startup_timeout") else {
        return;
    };
    let budget = spec
        .keeper
        .pod
        .startup_seconds
        .unwrap_or(super::DEFAULT_KEEPER_STARTUP_SECONDS);
    match value.trim().parse::<i64>() {
        Ok(ms) if ms > 0 && ms < i64::from(budget) * 1000 => {}
        Ok(_) | Err(_) => errors.add(
            "spec.keeper.settings.startup_timeout",
            format!(
                "{value:?}: milliseconds, more than 0 and less than the startup probe's budget \
                 (spec.keeper.pod.startupSeconds, {budget} s = {} ms): Keeper opens its client \
                 port only with a quorum or after this timeout, and the probe restarts a member \
                 whose port stays closed longer than its budget; leave it unset for half the budget",
                i64::from(budget) * 1000
            ),
        ),
    }
}

/// The server and Keeper volume sizes: quantities larger than 0; PVC labels; the disks, their
/// storage policies and the log volume.
fn check_storage(spec: &ClickHouseClusterSpec, errors: &mut Errors) {
    let st = &spec.storage;
    let mut sizes = vec![
        ("spec.storage.size".to_string(), &st.data.size),
        (
            "spec.keeper.storage.size".to_string(),
            &spec.keeper.storage.size,
        ),
    ];
    if let Some(l) = &st.logs {
        sizes.push(("spec.storage.logs.size".to_string(), &l.size));
    }
    for d in &st.disks {
        sizes.push((format!("spec.storage.disks[{}].size", d.name), &d.size));
    }
    for (field, size) in sizes {
        match quantity::parse_bytes(size) {
            Some(0) => errors.add(&field, "must be larger than 0".into()),
            Some(_) => {}
            None => errors.add(&field, format!("{size:?} is not a quantity such as 10Gi")),
        }
    }
    check_labels("spec.storage.labels", &st.data.labels, errors);
    check_labels(
        "spec.keeper.storage.labels",
        &spec.keeper.storage.labels,
        errors,
    );
    for (field, annotations) in [
        ("spec.storage.annotations", &st.data.annotations),
        (
            "spec.keeper.storage.annotations",
            &spec.keeper.storage.annotations,
        ),
    ] {
        for key in annotations.keys() {
            if !is_label_key(key) {
                errors.add(field, format!("{key:?} is not a valid annotation key"));
            }
        }
    }
    let mut disks = BTreeSet::new();
    for d in &st.disks {
        let name = &d.name;
        if !is_dns_label(name) || name.len() > MAX_DISK_NAME_LEN {
            errors.add(
                "spec.storage.disks",
                format!(
                    "{name:?} must be lower-case letters, digits and '-', starting with a letter, at most {MAX_DISK_NAME_LEN} characters"
                ),
            );
        } else if name == "default" {
            errors.add(
                "spec.storage.disks",
                "\"default\" is the data volume's disk: name the further disk otherwise".into(),
            );
        } else if !disks.insert(name.as_str()) {
            errors.add(
                "spec.storage.disks",
                format!("the disk {name:?} is named twice"),
            );
        }
    }
    for (policy, p) in &st.policies {
        let at = format!("spec.storage.policies.{policy}");
        if !is_xml_name(policy) {
            errors.add(
                "spec.storage.policies",
                format!(
                    "{policy:?} must be letters, digits and '_', starting with a letter or '_'"
                ),
            );
        }
        if p.volumes.is_empty() {
            errors.add(&at, "a policy needs at least one volume".into());
        }
        if let Some(f) = p.move_factor
            && !(0.0..=1.0).contains(&f)
        {
            errors.add(
                &format!("{at}.moveFactor"),
                format!("{f} is not between 0 and 1"),
            );
        }
        let mut volumes = BTreeSet::new();
        let mut used = BTreeSet::new();
        for v in &p.volumes {
            let vat = format!("{at}.volumes[{}]", v.name);
            if !is_xml_name(&v.name) {
                errors.add(
                    &format!("{at}.volumes"),
                    format!(
                        "{:?} must be letters, digits and '_', starting with a letter or '_'",
                        v.name
                    ),
                );
            } else if !volumes.insert(v.name.as_str()) {
                errors.add(
                    &format!("{at}.volumes"),
                    format!("the volume {:?} is named twice", v.name),
                );
            }
            if v.disks.is_empty() {
                errors.add(
                    &format!("{vat}.disks"),
                    "a volume needs at least one disk".into(),
                );
            }
            for disk in &v.disks {
                if disk != "default" && !disks.contains(disk.as_str()) {
                    errors.add(
                        &format!("{vat}.disks"),
                        format!("{disk:?} is neither \"default\" nor a disk of spec.storage.disks"),
                    );
                } else if !used.insert(disk.as_str()) {
                    errors.add(
                        &format!("{vat}.disks"),
                        format!("the disk {disk:?} is in more than one volume of the policy"),
                    );
                }
            }
            if let Some(max) = &v.max_data_part_size
                && quantity::parse_bytes(max).is_none_or(|b| b == 0)
            {
                errors.add(
                    &format!("{vat}.maxDataPartSize"),
                    format!("{max:?} is not a quantity larger than 0 such as 1Gi"),
                );
            }
        }
    }
}

/// A file of `shardFiles` or `replicaFiles` at `field`: a plain `.xml`/`.yaml` name, not the
/// operator's prefix, and not also in `hidden_by` (where one would hide the other).
fn check_extra_file(field: &str, file: &str, hidden_by: Option<&str>, errors: &mut Errors) {
    let prefix = crate::model::config::server::OPERATOR_FILE_PREFIX;
    if file.contains('/') || !(file.ends_with(".xml") || file.ends_with(".yaml")) {
        errors.add(
            field,
            format!("{file:?} must be a plain file name ending in .xml or .yaml"),
        );
    } else if file.starts_with(prefix) {
        errors.add(
            field,
            format!("{file:?} is reserved for the operator's own files (prefix {prefix})"),
        );
    } else if let Some(other) = hidden_by {
        errors.add(
            field,
            format!("{file:?} is also in {other}: one would hide the other"),
        );
    }
}

/// Longest disk name: its PVC `disk-<name>-<cluster>-<shard>-<index>-0` stays a DNS name with a
/// cluster name of up to 40 characters.
const MAX_DISK_NAME_LEN: usize = 20;

/// A name that is an XML element name and safe in a SQL string: `[A-Za-z_][A-Za-z0-9_]*`.
fn is_xml_name(s: &str) -> bool {
    let mut chars = s.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
        && s.len() <= 64
}

/// `spec.users.replicatedAccess` keeps SQL users in Keeper: the cluster needs one.
fn check_replicated_access(spec: &ClickHouseClusterSpec, errors: &mut Errors) {
    if spec.users.as_ref().is_some_and(|u| u.replicated_access)
        && spec.keeper.replicas == 0
        && spec.keeper.external.is_none()
    {
        errors.add(
            "spec.users.replicatedAccess",
            "keeps the users created with SQL in Keeper: the cluster has none \
             (spec.keeper.replicas is 0 and spec.keeper.external is not set)"
                .into(),
        );
    }
}

/// `spec.protocols`: the MySQL and PostgreSQL protocols take clients in clear whatever the
/// server offers, so not with `spec.tls.required`; no protocol on the servers' metrics port.
fn check_protocols(spec: &ClickHouseClusterSpec, errors: &mut Errors) {
    let p = &spec.protocols;
    for (on, field) in [(p.mysql, "mysql"), (p.postgresql, "postgresql")] {
        if on && spec.tls.enabled && spec.tls.required {
            errors.add(
                &format!("spec.protocols.{field}"),
                "a client may connect in clear on this protocol's port, which spec.tls.required \
                 forbids: use HTTPS or native TLS, or gRPC (TLS only with spec.tls)"
                    .into(),
            );
        }
    }
    if spec.server_metrics.enabled {
        for (on, field, port) in [
            (p.mysql, "mysql", crate::model::names::MYSQL_PORT),
            (
                p.postgresql,
                "postgresql",
                crate::model::names::POSTGRESQL_PORT,
            ),
            (p.grpc, "grpc", crate::model::names::GRPC_PORT),
        ] {
            if on && spec.server_metrics.port == port {
                errors.add(
                    "spec.serverMetrics.port",
                    format!("{port} is the port of spec.protocols.{field}"),
                );
            }
        }
    }
}

/// `spec.logging`: a level ClickHouse knows, a size it reads, a sane count; and never beside
/// the setting it replaces (which would decide by the order of the files), nor files off with
/// a log volume nothing would write to.
fn check_logging(spec: &ClickHouseClusterSpec, errors: &mut Errors) {
    let l = &spec.logging;
    if let Some(level) = l
        .level
        .as_ref()
        .filter(|l| !super::LOG_LEVELS.contains(&l.as_str()))
    {
        errors.add(
            "spec.logging.level",
            format!("{level:?} is not one of {}", super::LOG_LEVELS.join(", ")),
        );
    }
    if let Some(size) = &l.size {
        let digits = size.strip_suffix(['K', 'M', 'G']).unwrap_or(size);
        if digits.is_empty() || digits.len() > 12 || !digits.bytes().all(|b| b.is_ascii_digit()) {
            errors.add(
                "spec.logging.size",
                format!("{size:?} is not a size such as 100M (digits, then K, M or G)"),
            );
        }
    }
    if let Some(count) = l.count.filter(|c| !(1..=1000).contains(c)) {
        errors.add(
            "spec.logging.count",
            format!("{count} is not between 1 and 1000"),
        );
    }
    if l.files == Some(false) && spec.storage.logs.is_some() {
        errors.add(
            "spec.logging.files",
            "false leaves the log volume of spec.storage.logs unused: keep the files or remove \
             the volume (a volume cannot be removed from a running cluster)"
                .into(),
        );
    }
    let replaced = [
        ("logger/level", "level", l.level.is_some()),
        ("logger/formatting", "format", l.format.is_some()),
        ("logger/size", "size", l.size.is_some()),
        ("logger/count", "count", l.count.is_some()),
    ];
    for key in spec.configuration.settings.keys() {
        for (path, field, set) in replaced {
            if set && (key == path || key.starts_with(&format!("{path}/"))) {
                errors.add(
                    &format!("spec.configuration.settings.{key}"),
                    format!("spec.logging.{field} sets it: remove one of the two"),
                );
            }
        }
    }
}

/// `spec.systemLogs` (decision 49): known tables, at most 100 years; and no setting that would
/// make a server with the operator's `ttl` refuse to start (`<table>/engine`, which ClickHouse
/// refuses beside a `ttl`) or that the operator's file overrides (`<table>/ttl`).
fn check_system_logs(spec: &ClickHouseClusterSpec, errors: &mut Errors) {
    use crate::model::config::system_logs as logs;
    if let Some(s) = &spec.system_logs {
        if s.ttl_days > 36500 {
            errors.add(
                "spec.systemLogs.ttlDays",
                format!("{} days is more than 36500", s.ttl_days),
            );
        }
        for (table, days) in &s.tables {
            let field = format!("spec.systemLogs.tables.{table}");
            if !logs::is_known(table) {
                errors.add(
                    &field,
                    format!(
                        "not a system log table the operator knows (one of {}, {})",
                        logs::DEFAULT_TABLES.join(", "),
                        logs::OPTIONAL_TABLES.join(", ")
                    ),
                );
            } else if *days > 36500 {
                errors.add(&field, format!("{days} days is more than 36500"));
            }
        }
    }
    for (table, _) in logs::ttls(spec.system_logs.as_ref()) {
        for key in ["engine", "ttl"] {
            let path = format!("{table}/{key}");
            if spec.configuration.settings.contains_key(&path) {
                errors.add(
                    &format!("spec.configuration.settings.{path}"),
                    format!(
                        "the operator writes a ttl for {table} (spec.systemLogs): set its days \
                         there, or 0 in spec.systemLogs.tables.{table} to write your own"
                    ),
                );
            }
        }
    }
}

/// The disruption budget must let at least one pod go.
fn check_disruption_budget(spec: &ClickHouseClusterSpec, errors: &mut Errors) {
    let m = &spec.server_metrics;
    let taken = [
        crate::model::names::HTTP_PORT,
        crate::model::names::TCP_PORT,
        crate::model::names::INTERSERVER_HTTP_PORT,
        crate::model::names::HTTPS_PORT,
        crate::model::names::TCP_SECURE_PORT,
        crate::model::names::INTERSERVER_HTTPS_PORT,
    ];
    if m.enabled && (!(1024..=65535).contains(&m.port) || taken.contains(&m.port)) {
        errors.add(
            "spec.serverMetrics.port",
            format!("{} is not a free port between 1024 and 65535", m.port),
        );
    }
    if let Some(secs) = spec.catch_up_seconds
        && !(10..=7 * 86_400).contains(&secs)
    {
        errors.add(
            "spec.catchUpSeconds",
            format!("must be between 10 and 604800 (a week), got {secs}"),
        );
    }
    if spec.pod_disruption_budget.max_unavailable < 1 {
        errors.add(
            "spec.podDisruptionBudget.maxUnavailable",
            format!(
                "must be at least 1, got {}",
                spec.pod_disruption_budget.max_unavailable
            ),
        );
    }
}

/// Referenced Secrets: valid names, none of them one the operator generates itself.
fn check_secrets(name: &str, spec: &ClickHouseClusterSpec, errors: &mut Errors) {
    if let Some(users) = &spec.users
        && !is_dns_subdomain(&users.secret_name)
    {
        errors.add(
            "spec.users.secretName",
            format!("{:?} is not a valid Secret name", users.secret_name),
        );
    }
    // The operator generates Secrets of its own; a referenced Secret must not be one of them.
    let generated = [users_secret(name), operator_secret(name)];
    for (field, key) in spec.configuration.secret_keys() {
        let key_chars = |k: &str| {
            !k.is_empty()
                && k.len() <= 253
                && k.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        };
        if !is_dns_subdomain(&key.name) {
            errors.add(field, format!("{:?} is not a valid Secret name", key.name));
        } else if generated.contains(&key.name) {
            errors.add(
                field,
                format!(
                    "{:?} is the name of a Secret the operator generates for this cluster: use another name",
                    key.name
                ),
            );
        }
        if !key_chars(&key.key) {
            errors.add(field, format!("{:?} is not a valid Secret key", key.key));
        }
    }
    for (field, secret, _) in spec.secret_references() {
        if let Some(secret) = secret
            && generated.contains(secret)
        {
            errors.add(
                field,
                format!(
                    "{secret:?} is the name of a Secret the operator generates for this cluster: use another name"
                ),
            );
        }
    }
}

/// TLS: enabled needs a server certificate, required needs enabled.
fn check_tls(spec: &ClickHouseClusterSpec, errors: &mut Errors) {
    if spec.tls.enabled && spec.tls.server_cert_secret.is_none() {
        errors.add(
            "spec.tls.serverCertSecret",
            "is required when spec.tls.enabled is true".into(),
        );
    }
    if spec.tls.required && !spec.tls.enabled {
        errors.add("spec.tls.required", "needs spec.tls.enabled: true".into());
    }
    // Without a CA the operator cannot verify the servers, so it talks plain HTTP; with only
    // the secure ports served it would be locked out of the cluster.
    if spec.tls.required && spec.tls.enabled && spec.tls.ca_secret.is_none() {
        errors.add(
            "spec.tls.caSecret",
            "is required when spec.tls.required is true (the operator verifies the servers with it)"
                .into(),
        );
    }
    if spec.keeper.tls {
        if !spec.tls.enabled {
            errors.add("spec.keeper.tls", "needs spec.tls.enabled: true".into());
        } else if spec.tls.ca_secret.is_none() {
            errors.add(
                "spec.tls.caSecret",
                "is required when spec.keeper.tls is true (the Keeper members and the servers verify each other with it)"
                    .into(),
            );
        }
        if spec.keeper.replicas == 0 {
            errors.add(
                "spec.keeper.tls",
                "applies to the cluster's own Keeper: needs spec.keeper.replicas > 0".into(),
            );
        }
        let since = crate::clickhouse::Capability::KeeperTls.since();
        for (field, image) in [
            ("spec.image", &spec.image),
            ("spec.keeper.image", &spec.keeper.image),
        ] {
            if let Some((_, v)) = crate::plan::upgrade::image_version(image)
                && v < since
            {
                errors.add(
                    field,
                    format!(
                        "{image:?} is older than {}.{}, the first version with Keeper over TLS (spec.keeper.tls)",
                        since.major, since.minor
                    ),
                );
            }
        }
    }
}

/// `spec.upgradeOptions`: a known `apply`, a valid cron, one version source when enabled.
fn check_upgrade_options(spec: &ClickHouseClusterSpec, errors: &mut Errors) {
    let u = &spec.upgrade_options;
    let apply = match crate::plan::upgrade::Apply::parse(&u.apply) {
        Ok(a) => a,
        Err(e) => {
            errors.add("spec.upgradeOptions.apply", e);
            return;
        }
    };
    if let Err(e) = Cron::parse(&u.schedule) {
        errors.add("spec.upgradeOptions.schedule", e);
    }
    if apply == crate::plan::upgrade::Apply::Disabled {
        return;
    }
    match &u.version_source {
        None => errors.add(
            "spec.upgradeOptions.versionSource",
            "automatic upgrades need a version source (url or configMap)".into(),
        ),
        Some(s) if s.url.is_some() == s.config_map.is_some() => errors.add(
            "spec.upgradeOptions.versionSource",
            "set exactly one of url and configMap".into(),
        ),
        Some(s) => {
            if let Some(url) = &s.url {
                if url.starts_with("http://") && !s.insecure {
                    errors.add(
                        "spec.upgradeOptions.versionSource.url",
                        format!(
                            "{url:?} is plain HTTP: whoever is on the path would choose the version; use https://, or set insecure: true"
                        ),
                    );
                } else if !(url.starts_with("http://") || url.starts_with("https://")) {
                    errors.add(
                        "spec.upgradeOptions.versionSource.url",
                        format!("{url:?} is not an https:// URL"),
                    );
                }
            }
        }
    }
    for (i, r) in u.allowed_repositories.iter().enumerate() {
        let ok = !r.is_empty()
            && !r.contains(['@', ' '])
            && r.rsplit_once(':')
                .is_none_or(|(_, tail)| tail.contains('/'));
        if !ok {
            errors.add(
                &format!("spec.upgradeOptions.allowedRepositories[{i}]"),
                format!("{r:?} is not an image repository (no tag, no digest)"),
            );
        }
    }
}

/// Backup schedules: unique DNS-label names, a valid cron expression, at least one backup
/// kept, and a destination to write to.
fn check_backup_schedules(spec: &ClickHouseClusterSpec, errors: &mut Errors) {
    if !spec.backup.schedules.is_empty() && spec.backup.destination.is_none() {
        errors.add(
            "spec.backup.destination",
            "scheduled backups need a destination".into(),
        );
    }
    if let Some(d) = &spec.backup.destination {
        check_destination("spec.backup.destination", d, errors);
    }
    for (i, d) in spec.backup.allowed_destinations.iter().enumerate() {
        check_destination(&format!("spec.backup.allowedDestinations[{i}]"), d, errors);
    }
    for (i, e) in spec.backup.agent.env.iter().enumerate() {
        if super::AgentPodSettings::owns_env(&e.name) {
            errors.add(
                &format!("spec.backup.agent.env[{i}].name"),
                format!(
                    "{:?} is one of the variables the operator configures the agent with",
                    e.name
                ),
            );
        }
    }
    let mut schedule_names = BTreeSet::new();
    for (i, s) in spec.backup.schedules.iter().enumerate() {
        let f = |leaf: &str| format!("spec.backup.schedules[{i}].{leaf}");
        if !is_dns_label(&s.name) {
            errors.add(&f("name"), format!("{:?} must be a DNS label", s.name));
        }
        if !schedule_names.insert(s.name.as_str()) {
            errors.add(&f("name"), format!("{:?} is used twice", s.name));
        }
        if let Err(e) = Cron::parse(&s.schedule) {
            errors.add(&f("schedule"), e);
        }
        if s.keep < 1 {
            errors.add(&f("keep"), format!("must be at least 1, got {}", s.keep));
        }
    }
}

/// The problems of an S3 destination found at field `at` (see [`check_destination`]).
pub fn destination_errors(at: &str, d: &super::S3Destination) -> Vec<FieldError> {
    let mut errors = Errors::default();
    check_destination(at, d, &mut errors);
    errors.0
}

/// An S3 destination: an http(s) endpoint, a bucket name S3 accepts, a Secret name.
fn check_destination(at: &str, d: &super::S3Destination, errors: &mut Errors) {
    if d.endpoint.starts_with("http://") {
        if !d.insecure {
            errors.add(
                &format!("{at}.endpoint"),
                format!(
                    "{:?} is plain HTTP: use https://, or set insecure: true to send backups and signed requests in clear",
                    d.endpoint
                ),
            );
        }
    } else if !d.endpoint.starts_with("https://") {
        errors.add(
            &format!("{at}.endpoint"),
            format!(
                "{:?} must start with https:// (or http:// with insecure)",
                d.endpoint
            ),
        );
    }
    let b = &d.bucket;
    let bucket_ok = (3..=63).contains(&b.len())
        && b.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.')
        && !b.starts_with(['-', '.'])
        && !b.ends_with(['-', '.']);
    if !bucket_ok {
        errors.add(
            &format!("{at}.bucket"),
            format!("{b:?} is not an S3 bucket name (3 to 63 of a-z, 0-9, '-', '.')"),
        );
    }
    match &d.web_identity {
        None if d.secret_name.is_empty() => errors.add(
            &format!("{at}.secretName"),
            "set secretName (a Secret with static keys) or webIdentity (a role assumed with a ServiceAccount's token)".into(),
        ),
        None if !is_dns_subdomain(&d.secret_name) => errors.add(
            &format!("{at}.secretName"),
            format!("{:?} is not a Secret name", d.secret_name),
        ),
        None => {}
        Some(w) => {
            for (field, set) in [
                ("secretName", !d.secret_name.is_empty()),
                ("accessKeyIdKey", d.access_key_id_key.is_some()),
                ("secretAccessKeyKey", d.secret_access_key_key.is_some()),
            ] {
                if set {
                    errors.add(
                        &format!("{at}.{field}"),
                        "static keys and webIdentity exclude each other: remove one".into(),
                    );
                }
            }
            check_web_identity(&format!("{at}.webIdentity"), w, d.insecure, errors);
        }
    }
    if let Some(p) = &d.prefix
        && (p.starts_with('/') || p.contains("//") || p.contains(".."))
    {
        errors.add(
            &format!("{at}.prefix"),
            format!("{p:?} must be a relative path without '//' or '..'"),
        );
    }
}

/// A role assumed with a ServiceAccount's token: a role ARN, a ServiceAccount name, an audience
/// a token can carry, an STS endpoint that is an https URL (http with `insecure`) naming only a
/// host, a port and a path.
fn check_web_identity(at: &str, w: &super::WebIdentity, insecure: bool, errors: &mut Errors) {
    if let Err(why) = crate::backup::sts::check_role_arn(&w.role_arn) {
        errors.add(&format!("{at}.roleArn"), format!("{:?} {why}", w.role_arn));
    }
    if !is_dns_subdomain(&w.service_account_name) {
        errors.add(
            &format!("{at}.serviceAccountName"),
            format!("{:?} is not a ServiceAccount name", w.service_account_name),
        );
    }
    if let Some(a) = &w.audience
        && (a.is_empty() || a.len() > 256 || a.chars().any(|c| c.is_whitespace() || c.is_control()))
    {
        errors.add(
            &format!("{at}.audience"),
            format!("{a:?} must be 1 to 256 characters without spaces"),
        );
    }
    if let Some(e) = &w.sts_endpoint
        && let Err(why) = crate::backup::sts::check_endpoint(e, insecure)
    {
        errors.add(&format!("{at}.stsEndpoint"), format!("{e:?} {why}"));
    }
}

/// The pod settings at `which` (server or Keeper): sidecar names, labels outside the
/// operator's prefixes, the topology spread key, environment variables the operator or the
/// image's entrypoint owns (`reserved`).
fn check_pod(which: &str, pod: &PodSettings, reserved: &[&str], errors: &mut Errors) {
    for (i, e) in pod.env.iter().enumerate() {
        if reserved.contains(&e.name.as_str()) {
            errors.add(
                &format!("{which}.env[{i}].name"),
                format!(
                    "{:?} is set by the operator or acted on by the image's entrypoint against \
                     the operator's configuration (reserved: {})",
                    e.name,
                    reserved.join(", ")
                ),
            );
        }
    }
    if let Some(secs) = pod.startup_seconds
        && !(10..=86_400).contains(&secs)
    {
        errors.add(
            &format!("{which}.startupSeconds"),
            format!("must be between 10 and 86400, got {secs}"),
        );
    }
    let mut names = BTreeSet::new();
    for (i, c) in pod.sidecars.iter().enumerate() {
        if matches!(c.name.as_str(), "clickhouse" | "keeper") || !names.insert(c.name.as_str()) {
            errors.add(
                &format!("{which}.sidecars[{i}].name"),
                format!("{:?} is reserved or used twice", c.name),
            );
        }
    }
    check_labels(&format!("{which}.labels"), &pod.labels, errors);
    if let Some(key) = &pod.topology_spread_key
        && !is_label_key(key)
    {
        errors.add(
            &format!("{which}.topologySpreadKey"),
            format!("{key:?} is not a valid label key"),
        );
    }
}

/// The client Service's options fit its type; its labels are valid and not the operator's.
fn check_client_service(spec: &ClickHouseClusterSpec, errors: &mut Errors) {
    use crate::api::ClientServiceType;
    let cs = &spec.client_service;
    if cs.external_traffic_policy.is_some() && cs.r#type == ClientServiceType::ClusterIP {
        errors.add(
            "spec.clientService.externalTrafficPolicy",
            "applies to type NodePort or LoadBalancer only".into(),
        );
    }
    if !cs.load_balancer_source_ranges.is_empty() {
        if cs.r#type != ClientServiceType::LoadBalancer {
            errors.add(
                "spec.clientService.loadBalancerSourceRanges",
                "applies to type LoadBalancer only".into(),
            );
        }
        check_networks(
            errors,
            "spec.clientService.loadBalancerSourceRanges",
            &cs.load_balancer_source_ranges,
        );
    }
    check_labels("spec.clientService.labels", &cs.labels, errors);
}

/// User labels at `field`: valid, and none with a prefix the operator reserves.
fn check_labels(field: &str, labels: &BTreeMap<String, String>, errors: &mut Errors) {
    for (key, value) in labels {
        if !is_label_key(key) || !is_label_value(value) {
            errors.add(field, format!("{key:?}: {value:?} is not a valid label"));
        } else if RESERVED_LABEL_PREFIXES.iter().any(|p| key.starts_with(p)) {
            errors.add(field, format!("{key:?} is reserved for the operator"));
        }
    }
}

/// Configuration: plain `.xml`/`.yaml` file names, settings as element paths.
fn check_configuration(name: &str, spec: &ClickHouseClusterSpec, errors: &mut Errors) {
    for name in spec.keeper.settings.keys() {
        if !crate::model::config::xml::is_element_name(name) {
            errors.add(
                "spec.keeper.settings",
                format!("{name:?} is not a Keeper setting name"),
            );
        }
    }
    for file in spec.configuration.files.keys() {
        let plain = file
            .strip_prefix(crate::api::USERS_D_PREFIX)
            .unwrap_or(file);
        if !is_config_file_name(plain) {
            errors.add("spec.configuration.files", config_file_name_error(file));
        }
    }
    for (replica, files) in &spec.configuration.replica_files {
        let field = format!("spec.configuration.replicaFiles[{replica}]");
        let shard = replica
            .strip_prefix(&format!("{name}-"))
            .and_then(|rest| rest.split_once('-'))
            .filter(|(s, i)| {
                s.parse::<u32>().is_ok_and(|n| n.to_string() == *s)
                    && i.parse::<u64>().is_ok_and(|n| n.to_string() == *i)
            })
            .map(|(s, _)| s.to_string());
        let Some(shard) = shard else {
            errors.add(
                &field,
                format!("{replica:?} is not a replica name such as \"{name}-0-1\" (<cluster>-<shard>-<index>)"),
            );
            continue;
        };
        for file in files.keys() {
            let in_shard = spec
                .configuration
                .shard_files
                .get(&shard)
                .is_some_and(|f| f.contains_key(file));
            let hidden = (spec.configuration.files.contains_key(file) || in_shard)
                .then_some("spec.configuration.files or the shard's shardFiles");
            check_extra_file(&field, file, hidden, errors);
        }
    }
    for (shard, weight) in &spec.shard_weights {
        let field = format!("spec.shardWeights[{shard}]");
        match shard.parse::<i32>() {
            Ok(s) if s.to_string() == *shard && (0..spec.shards).contains(&s) => {}
            _ => errors.add(
                &field,
                format!(
                    "{shard:?} is not the index of a shard (\"0\" to \"{}\")",
                    spec.shards - 1
                ),
            ),
        }
        if !(1..=1000).contains(weight) {
            errors.add(
                &field,
                format!(
                    "{weight} is not between 1 and 1000 (a shard of weight 0 would leave the \
                     cluster's queries)"
                ),
            );
        }
    }
    for (shard, files) in &spec.configuration.shard_files {
        let field = format!("spec.configuration.shardFiles[{shard}]");
        if shard
            .parse::<u32>()
            .map_or(true, |s| s.to_string() != *shard)
        {
            errors.add(
                &field,
                format!("{shard:?} is not a shard index such as \"0\""),
            );
        }
        for file in files.keys() {
            let hidden = spec
                .configuration
                .files
                .contains_key(file)
                .then_some("spec.configuration.files");
            check_extra_file(&field, file, hidden, errors);
        }
    }
    let keeper = spec.keeper.replicas > 0 || spec.keeper.external.is_some();
    if !keeper
        && spec
            .configuration
            .settings
            .keys()
            .any(|k| k.starts_with("zookeeper/"))
    {
        errors.add(
            "spec.configuration.settings",
            "zookeeper/… settings need a Keeper (spec.keeper.replicas or spec.keeper.external)"
                .into(),
        );
    }
    for key in spec.configuration.secret_settings.keys() {
        let field = "spec.configuration.secretSettings";
        if key.starts_with("zookeeper/") {
            errors.add(
                &format!("{field}.{key}"),
                "the Keeper client's settings go in spec.configuration.settings".into(),
            );
            continue;
        }
        if check_setting_key(field, key, errors)
            && spec.configuration.settings.keys().any(|s| {
                s == key || s.starts_with(&format!("{key}/")) || key.starts_with(&format!("{s}/"))
            })
        {
            errors.add(
                &format!("{field}.{key}"),
                "is also set (or contains a setting set) in spec.configuration.settings".into(),
            );
        }
    }
    for file in spec.configuration.secret_files.keys() {
        let field = "spec.configuration.secretFiles";
        let plain = file
            .strip_prefix(crate::api::USERS_D_PREFIX)
            .unwrap_or(file);
        let in_extra = spec
            .configuration
            .shard_files
            .values()
            .chain(spec.configuration.replica_files.values())
            .any(|f| f.contains_key(plain));
        let hidden = (spec.configuration.files.contains_key(file) || (in_extra && plain == file))
            .then_some("spec.configuration.files, shardFiles or replicaFiles");
        if !is_config_file_name(plain) {
            errors.add(field, config_file_name_error(file));
        } else {
            check_extra_file(field, plain, hidden, errors);
        }
    }
    for var in spec.pod.env.iter().map(|e| &e.name) {
        if var.starts_with(crate::model::names::SECRET_SETTING_ENV_PREFIX) {
            errors.add(
                "spec.pod.env",
                format!(
                    "{var:?} is reserved for spec.configuration.secretSettings (prefix {})",
                    crate::model::names::SECRET_SETTING_ENV_PREFIX
                ),
            );
        }
    }
    for key in spec.configuration.settings.keys() {
        check_setting_key("spec.configuration.settings", key, errors);
    }
    if let Some(profile) = spec.users.as_ref().and_then(|u| u.profile.as_ref())
        && !BUILT_IN_PROFILES.contains(&profile.as_str())
        && !spec.configuration.profiles.contains_key(profile)
    {
        errors.add(
            "spec.users.profile",
            format!(
                "{profile:?} is neither in spec.configuration.profiles nor one of {BUILT_IN_PROFILES:?}: ClickHouse would refuse the whole users file"
            ),
        );
    }
    if let Some(users) = &spec.users {
        check_networks(errors, "spec.users.networks", &users.networks);
        for (name, account) in &users.accounts {
            let at = format!("spec.users.accounts.{name}");
            if !crate::model::config::xml::is_element_name(name) {
                errors.add(
                    "spec.users.accounts",
                    format!("{name:?} is not a user name (a letter or '_' first, then letters, digits, '_', '-', '.')"),
                );
            }
            check_networks(errors, &format!("{at}.networks"), &account.networks);
            if let Some(profile) = &account.profile
                && !BUILT_IN_PROFILES.contains(&profile.as_str())
                && !spec.configuration.profiles.contains_key(profile)
            {
                errors.add(
                    &format!("{at}.profile"),
                    format!("{profile:?} is neither in spec.configuration.profiles nor one of {BUILT_IN_PROFILES:?}: ClickHouse would refuse the whole users file"),
                );
            }
            if let Some(quota) = &account.quota
                && quota != crate::model::config::users::DEFAULT_QUOTA
                && !spec.configuration.quotas.contains_key(quota)
            {
                errors.add(
                    &format!("{at}.quota"),
                    format!("{quota:?} is neither in spec.configuration.quotas nor \"default\": ClickHouse would refuse the whole users file"),
                );
            }
            for db in &account.databases {
                if !is_identifier(db) {
                    errors.add(
                        &format!("{at}.databases"),
                        format!("{db:?} is not a database name (letters, digits and '_', not starting with a digit)"),
                    );
                }
            }
        }
    }
}

/// Every entry of `networks` is an address or CIDR ClickHouse accepts.
fn check_networks(errors: &mut Errors, field: &str, networks: &[String]) {
    for n in networks {
        if let Err(e) = crate::util::networks::parse(n, field) {
            let (_, message) = e.split_once(": ").unwrap_or(("", &e));
            errors.add(field, message.to_string());
        }
    }
}

/// A plain database name.
fn is_identifier(name: &str) -> bool {
    name.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// A setting key of `field` (`settings`, `secretSettings`): an element path the operator does
/// not write itself. Whether it is one.
fn check_setting_key(field: &str, key: &str, errors: &mut Errors) -> bool {
    if !is_element_path(key) {
        errors.add(
            field,
            format!(
                "{key:?} is not an element path such as max_concurrent_queries or logger/level"
            ),
        );
        false
    } else if let Some(owned) = operator_owned(key) {
        errors.add(
            &format!("{field}.{key}"),
            format!("is set by the operator ({owned}) and cannot be overridden"),
        );
        false
    } else {
        true
    }
}

/// A file name of `files` or `secretFiles` (without `users.d/`): letters, digits, `-`, `_`,
/// `.`, ending in `.xml` or `.yaml`.
fn is_config_file_name(plain: &str) -> bool {
    plain
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        && (plain.ends_with(".xml") || plain.ends_with(".yaml"))
}

fn config_file_name_error(file: &str) -> String {
    format!(
        "{file:?} must be a plain file name (letters, digits, '-', '_', '.') ending in .xml or .yaml, or users.d/ and such a name"
    )
}

/// Profiles every server has (the image's users file).
const BUILT_IN_PROFILES: [&str; 2] = ["default", "readonly"];

/// Server settings the operator writes itself, by first path element (or full path), and why:
/// overriding one would break the cluster silently (ports the probes and Services use, the
/// cluster topology, Keeper, the data path on the volume, the log files on their volume).
fn operator_owned(key: &str) -> Option<&'static str> {
    const OWNED: &[(&str, &str)] = &[
        ("tcp_port", "the ports the Services and probes use"),
        ("http_port", "the ports the Services and probes use"),
        ("https_port", "the ports the Services and probes use"),
        ("tcp_port_secure", "the ports the Services and probes use"),
        ("interserver_http_port", "replication between the replicas"),
        ("interserver_https_port", "replication between the replicas"),
        ("interserver_http_host", "replication between the replicas"),
        (
            "interserver_http_credentials",
            "replication between the replicas",
        ),
        ("listen_host", "the addresses the pods serve on"),
        ("listen_try", "the addresses the pods serve on"),
        ("macros", "the shard and replica of each pod"),
        ("remote_servers", "the cluster's topology"),
        // the client's timeouts and other `zookeeper/*` settings are the user's
        ("zookeeper/node", "the Keeper ensemble"),
        ("zookeeper/root", "the Keeper ensemble"),
        ("zookeeper/identity", "the Keeper identity"),
        ("zookeeper/implementation", "the Keeper ensemble"),
        ("distributed_ddl", "the ON CLUSTER queue"),
        ("openSSL", "spec.tls"),
        ("path", "the data volume"),
        ("users_config", "spec.users and the operator's account"),
        ("user_directories", "spec.users and the operator's account"),
        ("logger/log", "the log volume"),
        ("logger/errorlog", "the log volume"),
    ];
    if key == "zookeeper" {
        return Some("the Keeper ensemble");
    }
    OWNED
        .iter()
        .find(|(k, _)| key == *k || key.starts_with(&format!("{k}/")))
        .map(|(_, why)| *why)
}

/// `max_concurrent_queries`, `logger/level`: `/`-separated XML element names.
fn is_element_path(key: &str) -> bool {
    !key.is_empty()
        && key.split('/').all(|p| {
            !p.is_empty()
                && p.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
                && p.chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
        })
}

/// `spec.crVersion`: a version, not newer than this operator.
fn check_cr_version(spec: &ClickHouseClusterSpec, errors: &mut Errors) {
    if let Some(v) = &spec.cr_version {
        match (parse_version(v), parse_version(OPERATOR_VERSION)) {
            (Some(want), Some(have)) if want > have => errors.add(
                "spec.crVersion",
                format!(
                    "{v} is newer than this operator ({OPERATOR_VERSION}): upgrade the operator and its CRDs first"
                ),
            ),
            (None, _) => errors.add(
                "spec.crVersion",
                format!("{v:?} is not a version such as 0.1.0"),
            ),
            _ => {}
        }
    }
}

/// Allowed but unsafe (decision 16): a single copy of the data, a single Keeper member.
fn warnings(spec: &ClickHouseClusterSpec) -> Vec<Warning> {
    let mut warnings = Vec::new();
    if spec.replicas == 1 {
        warnings.push(Warning(
            "spec.replicas is 1: every shard has a single copy of its data".into(),
        ));
    }
    if spec.keeper.replicas == 1 {
        warnings.push(Warning(
            "spec.keeper.replicas is 1: losing that member stops all inserts".into(),
        ));
    }
    warnings
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::cluster::*;
    use std::collections::BTreeMap;

    fn spec() -> ClickHouseClusterSpec {
        serde_json::from_value(serde_json::json!({})).unwrap()
    }

    /// `errors` name `field` with a message containing `words` (for the input `what`).
    fn assert_error(errors: &[FieldError], what: &serde_json::Value, field: &str, words: &str) {
        assert!(
            errors
                .iter()
                .any(|e| e.field == field && e.message.contains(words)),
            "{what}: want {field} ({words}) in {errors:?}"
        );
    }

    fn fields(name: &str, s: &ClickHouseClusterSpec) -> Vec<String> {
        validate(name, s).0.into_iter().map(|e| e.field).collect()
    }

    /// Decision 34: settings and files from Secret keys follow the rules of `settings` and
    /// `files`, name valid Secrets and keys that are not the operator's own, overlap nothing
    /// else, and the environment variables they use are the operator's.
    #[test]
    fn secret_settings_and_files_are_checked_like_their_plain_kin() {
        let with = |configuration: serde_json::Value, pod: serde_json::Value| {
            let s: ClickHouseClusterSpec = serde_json::from_value(
                serde_json::json!({"configuration": configuration, "pod": pod}),
            )
            .unwrap();
            validate("c1", &s).0
        };
        let key = serde_json::json!({"name": "s3", "key": "secret"});
        let ok = with(
            serde_json::json!({"secretSettings": {"storage_configuration/disks/s3/secret_access_key": key},
                "secretFiles": {"s3.xml": key, "users.d/bi.xml": key}}),
            serde_json::json!({}),
        );
        assert!(ok.is_empty(), "{ok:?}");
        for (configuration, pod, field, words) in [
            (
                serde_json::json!({"secretSettings": {"tcp_port": key}}),
                serde_json::json!({}),
                "spec.configuration.secretSettings.tcp_port",
                "set by the operator",
            ),
            (
                serde_json::json!({"secretSettings": {"a//b": key}}),
                serde_json::json!({}),
                "spec.configuration.secretSettings",
                "element path",
            ),
            (
                serde_json::json!({"secretSettings": {"logger": key}, "settings": {"logger/level": "debug"}}),
                serde_json::json!({}),
                "spec.configuration.secretSettings.logger",
                "also set",
            ),
            (
                serde_json::json!({"secretFiles": {"../x.xml": key}}),
                serde_json::json!({}),
                "spec.configuration.secretFiles",
                "plain file name",
            ),
            (
                serde_json::json!({"secretFiles": {"00-operator-users.xml": key}}),
                serde_json::json!({}),
                "spec.configuration.secretFiles",
                "reserved",
            ),
            (
                serde_json::json!({"secretFiles": {"a.xml": key}, "files": {"a.xml": "<clickhouse/>"}}),
                serde_json::json!({}),
                "spec.configuration.secretFiles",
                "hide",
            ),
            (
                serde_json::json!({"secretFiles": {"a.xml": {"name": "c1-operator", "key": "password"}}}),
                serde_json::json!({}),
                "spec.configuration.secretFiles",
                "generates",
            ),
            (
                serde_json::json!({"secretSettings": {"timezone": {"name": "Bad_Name", "key": "k"}}}),
                serde_json::json!({}),
                "spec.configuration.secretSettings",
                "not a valid Secret name",
            ),
            (
                serde_json::json!({"secretSettings": {"timezone": {"name": "s", "key": "../k"}}}),
                serde_json::json!({}),
                "spec.configuration.secretSettings",
                "not a valid Secret key",
            ),
            (
                serde_json::json!({}),
                serde_json::json!({"env": [{"name": "CLICKHOUSE_SECRET_SETTING_0", "value": "x"}]}),
                "spec.pod.env",
                "reserved",
            ),
        ] {
            let errors = with(configuration.clone(), pod);
            assert_error(&errors, &configuration, field, words);
        }
    }

    #[test]
    fn defaults_are_valid_and_redundant() {
        let s = spec();
        assert_eq!(s.shards, 1);
        assert_eq!(s.replicas, 2);
        assert_eq!(s.keeper.replicas, 3);
        assert_eq!(s.pod_disruption_budget.max_unavailable, 1);
        assert_eq!(s.update_strategy, UpdateStrategy::SmartUpdate);
        assert!(!s.pause);
        assert!(s.client_service.enabled);
        let (errors, warnings) = validate("c1", &s);
        assert!(errors.is_empty(), "{errors:?}");
        assert!(warnings.is_empty(), "{warnings:?}");
    }

    #[test]
    fn counts_are_checked() {
        let mut s = spec();
        s.shards = 0;
        s.replicas = 0;
        s.pod_disruption_budget.max_unavailable = 0;
        let f = fields("c1", &s);
        assert!(f.contains(&"spec.shards".to_string()));
        assert!(f.contains(&"spec.replicas".to_string()));
        assert!(f.contains(&"spec.podDisruptionBudget.maxUnavailable".to_string()));
    }

    /// S2-10 / S2-14: an even Keeper ensemble is refused with a message naming the field.
    #[test]
    fn keeper_must_be_zero_or_odd() {
        for (k, ok) in [
            (0, true),
            (1, true),
            (2, false),
            (3, true),
            (4, false),
            (5, true),
            (7, true),
            (9, false),
            (-1, false),
        ] {
            let mut s = spec();
            s.replicas = 1;
            s.keeper.replicas = k;
            let (errors, _) = validate("c1", &s);
            assert_eq!(errors.is_empty(), ok, "keeper {k}: {errors:?}");
            if !ok {
                assert_eq!(errors[0].field, "spec.keeper.replicas");
                assert!(errors[0].message.contains("odd"));
            }
        }
        let mut s = spec();
        s.keeper.replicas = 0;
        let (errors, _) = validate("c1", &s);
        assert!(errors[0].message.contains("need Keeper"), "{errors:?}");
    }

    /// Decision 16: single copies are allowed but reported.
    #[test]
    fn single_replica_or_keeper_is_a_warning_not_an_error() {
        let mut s = spec();
        s.replicas = 1;
        s.keeper.replicas = 1;
        let (errors, warnings) = validate("c1", &s);
        assert!(errors.is_empty());
        assert_eq!(warnings.len(), 2);
    }

    #[test]
    fn names_and_references_are_checked() {
        let s = spec();
        assert!(fields("C1", &s).contains(&"metadata.name".to_string()));
        assert!(fields("1c", &s).contains(&"metadata.name".to_string()));
        assert!(fields(&"a".repeat(41), &s).contains(&"metadata.name".to_string()));
        assert!(fields(&"a".repeat(40), &s).is_empty());
        let mut s = spec();
        s.users = Some(UsersSpec {
            secret_name: "Bad_Name".into(),
            profile: None,
            ..UsersSpec::default()
        });
        s.tls.enabled = true;
        s.storage.data.size = "lots".into();
        s.pod
            .labels
            .insert("clickhouse.com/shard".into(), "x".into());
        s.pod.labels.insert("team".into(), "a b".into());
        s.configuration
            .files
            .insert("../etc/passwd".into(), String::new());
        s.configuration
            .settings
            .insert("logger/".into(), String::new());
        let f = fields("c1", &s);
        for want in [
            "spec.users.secretName",
            "spec.tls.serverCertSecret",
            "spec.storage.size",
            "spec.pod.labels",
            "spec.configuration.files",
            "spec.configuration.settings",
        ] {
            assert!(f.contains(&want.to_string()), "{want} missing in {f:?}");
        }
        assert_eq!(f.iter().filter(|x| *x == "spec.pod.labels").count(), 2);
        // A referenced Secret cannot be one the operator generates (it would be overwritten).
        let mut s = spec();
        s.users = Some(UsersSpec {
            secret_name: "c1-users".into(),
            profile: None,
            ..UsersSpec::default()
        });
        s.pod.env_secret = Some("c1-operator".into());
        let f = fields("c1", &s);
        assert!(f.contains(&"spec.users.secretName".to_string()), "{f:?}");
        assert!(f.contains(&"spec.pod.envSecret".to_string()), "{f:?}");
    }

    /// S2-10: `replicaFiles` keys are replica names of this cluster and their files follow
    /// the rules of `shardFiles`, without hiding a common or a shard file.
    #[test]
    fn replica_files_are_checked_with_the_field_named() {
        let of = |files: serde_json::Value| {
            let mut s = spec();
            s.configuration = serde_json::from_value(files).unwrap();
            validate("c1", &s).0
        };
        let good = of(serde_json::json!({"replicaFiles": {"c1-0-7": {"a.xml": "<clickhouse/>"}}}));
        assert!(good.is_empty(), "{good:?}");
        for (files, field, words) in [
            (
                serde_json::json!({"replicaFiles": {"c2-0-7": {"a.xml": ""}}}),
                "spec.configuration.replicaFiles[c2-0-7]",
                "not a replica name",
            ),
            (
                serde_json::json!({"replicaFiles": {"c1-0-x": {"a.xml": ""}}}),
                "spec.configuration.replicaFiles[c1-0-x]",
                "not a replica name",
            ),
            (
                serde_json::json!({"replicaFiles": {"c1-0-1": {"../a.xml": ""}}}),
                "spec.configuration.replicaFiles[c1-0-1]",
                "plain file name",
            ),
            (
                serde_json::json!({"replicaFiles": {"c1-0-1": {"00-operator-x.xml": ""}}}),
                "spec.configuration.replicaFiles[c1-0-1]",
                "reserved",
            ),
            (
                serde_json::json!({"files": {"a.xml": ""}, "replicaFiles": {"c1-0-1": {"a.xml": ""}}}),
                "spec.configuration.replicaFiles[c1-0-1]",
                "hide",
            ),
            (
                serde_json::json!({"shardFiles": {"0": {"b.xml": ""}}, "replicaFiles": {"c1-0-1": {"b.xml": ""}}}),
                "spec.configuration.replicaFiles[c1-0-1]",
                "hide",
            ),
        ] {
            assert_error(&of(files.clone()), &files, field, words);
        }
    }

    /// S2-10: disks, policies and the log volume are checked with the field named: disk
    /// names (DNS-safe, not `default`, unique), sizes, a policy's volumes and their disks
    /// (declared ones or `default`, each in one volume), the move factor, PVC labels.
    #[test]
    fn disks_and_storage_policies_are_checked_with_the_field_named() {
        let of = |storage: serde_json::Value| {
            let mut s = spec();
            s.storage = serde_json::from_value(storage).unwrap();
            validate("c1", &s).0
        };
        let good = of(serde_json::json!({
            "disks": [{"name": "cold", "size": "10Gi"}, {"name": "ssd-2", "size": "1Gi"}],
            "policies": {"tiered": {"moveFactor": 0.1, "volumes": [
                {"name": "hot", "disks": ["default", "ssd-2"], "maxDataPartSize": "1Gi"},
                {"name": "cold", "disks": ["cold"]}]}},
            "logs": {"size": "1Gi"}, "labels": {"team": "a"}}));
        assert!(good.is_empty(), "{good:?}");
        let cases = [
            (
                serde_json::json!({"disks": [{"name": "Cold", "size": "1Gi"}]}),
                "spec.storage.disks",
                "lower-case",
            ),
            (
                serde_json::json!({"disks": [{"name": "default", "size": "1Gi"}]}),
                "spec.storage.disks",
                "data volume",
            ),
            (
                serde_json::json!({"disks": [{"name": "a", "size": "1Gi"}, {"name": "a", "size": "1Gi"}]}),
                "spec.storage.disks",
                "twice",
            ),
            (
                serde_json::json!({"disks": [{"name": "a", "size": "lots"}]}),
                "spec.storage.disks[a].size",
                "quantity",
            ),
            (
                serde_json::json!({"logs": {"size": "0"}}),
                "spec.storage.logs.size",
                "larger than 0",
            ),
            (
                serde_json::json!({"policies": {"p": {"volumes": [{"name": "v", "disks": ["nope"]}]}}}),
                "spec.storage.policies.p.volumes[v].disks",
                "neither",
            ),
            (
                serde_json::json!({"disks": [{"name": "a", "size": "1Gi"}], "policies": {"p": {"volumes": [{"name": "v", "disks": ["a"]}, {"name": "w", "disks": ["a"]}]}}}),
                "spec.storage.policies.p.volumes[w].disks",
                "more than one volume",
            ),
            (
                serde_json::json!({"policies": {"p": {"volumes": []}}}),
                "spec.storage.policies.p",
                "at least one volume",
            ),
            (
                serde_json::json!({"policies": {"p": {"moveFactor": 1.5, "volumes": [{"name": "v", "disks": ["default"]}]}}}),
                "spec.storage.policies.p.moveFactor",
                "between 0 and 1",
            ),
            (
                serde_json::json!({"policies": {"p-1": {"volumes": [{"name": "v", "disks": ["default"]}]}}}),
                "spec.storage.policies",
                "letters, digits and '_'",
            ),
            (
                serde_json::json!({"policies": {"p": {"volumes": [{"name": "v", "disks": ["default"], "maxDataPartSize": "big"}]}}}),
                "spec.storage.policies.p.volumes[v].maxDataPartSize",
                "quantity",
            ),
            (
                serde_json::json!({"labels": {"bad key!": "x"}}),
                "spec.storage.labels",
                "not a valid label",
            ),
        ];
        for (storage, field, words) in cases {
            assert_error(&of(storage.clone()), &storage, field, words);
        }
    }

    /// SECURITY.md, "What the operator protects": the settings the operator writes itself are
    /// refused with the field named, nested keys too; other keys, `logger/level` among them, are
    /// accepted.
    #[test]
    fn settings_the_operator_owns_are_refused() {
        let mut s = spec();
        for key in [
            "tcp_port",
            "listen_host",
            "remote_servers/c1/shard",
            "zookeeper/node/host",
            "zookeeper/root",
            "zookeeper/identity",
            "zookeeper/implementation",
            "zookeeper",
            "macros/replica",
            "path",
            "logger/log",
        ] {
            s.configuration.settings = BTreeMap::from([(key.to_string(), "x".to_string())]);
            assert_eq!(
                fields("c1", &s),
                vec![format!("spec.configuration.settings.{key}")],
                "{key}"
            );
        }
        for key in [
            "max_concurrent_queries",
            "logger/level",
            "pathological",
            "merge_tree/parts_to_throw_insert",
            // the Keeper client's own settings are the user's (docs/reference/api.md)
            "zookeeper/session_timeout_ms",
            "zookeeper/operation_timeout_ms",
        ] {
            s.configuration.settings = BTreeMap::from([(key.to_string(), "1".to_string())]);
            assert!(fields("c1", &s).is_empty(), "{key}");
        }
        // … with a Keeper only, and not from a Secret (they would not reach the servers)
        s.configuration.settings =
            BTreeMap::from([("zookeeper/session_timeout_ms".to_string(), "1".to_string())]);
        s.keeper.replicas = 0;
        s.replicas = 1;
        assert_eq!(fields("c1", &s), ["spec.configuration.settings"]);
        let mut s = spec();
        s.configuration.secret_settings = BTreeMap::from([(
            "zookeeper/session_timeout_ms".to_string(),
            crate::api::SecretKeyRef {
                name: "s".into(),
                key: "k".into(),
            },
        )]);
        assert_eq!(
            fields("c1", &s),
            ["spec.configuration.secretSettings.zookeeper/session_timeout_ms"]
        );
    }

    /// `spec.users.replicatedAccess` needs a Keeper, the cluster's own or an external one.
    #[test]
    fn replicated_access_needs_keeper() {
        let mut s: ClickHouseClusterSpec = serde_json::from_value(serde_json::json!({
            "replicas": 1, "users": {"secretName": "u", "replicatedAccess": true},
            "keeper": {"replicas": 0}}))
        .unwrap();
        assert_eq!(
            validate("c1", &s)
                .0
                .iter()
                .map(|e| e.field.as_str())
                .collect::<Vec<_>>(),
            ["spec.users.replicatedAccess"]
        );
        s.keeper.replicas = 3;
        assert!(validate("c1", &s).0.is_empty());
    }

    /// `spec.protocols`: MySQL and PostgreSQL are refused with `tls.required` (a client could
    /// connect in clear), gRPC is not; a protocol's port is not the metrics port.
    #[test]
    fn protocols_in_clear_are_refused_with_required_tls() {
        let mut s: ClickHouseClusterSpec = serde_json::from_value(serde_json::json!({
            "protocols": {"mysql": true, "postgresql": true, "grpc": true},
            "tls": {"enabled": true, "required": true, "serverCertSecret": "c1-tls",
                "caSecret": "c1-ca"},
            "serverMetrics": {"enabled": true, "port": 9100}}))
        .unwrap();
        let (errors, _) = validate("c1", &s);
        let fields: Vec<&str> = errors.iter().map(|e| e.field.as_str()).collect();
        assert_eq!(
            fields,
            [
                "spec.protocols.mysql",
                "spec.protocols.postgresql",
                "spec.serverMetrics.port"
            ]
        );
        s.tls.required = false;
        s.server_metrics.port = 9363;
        assert!(
            validate("c1", &s).0.is_empty(),
            "{:?}",
            validate("c1", &s).0
        );
    }

    /// `spec.logging`: its values are checked, and the settings it replaces are refused beside
    /// it but still taken alone (the earlier way, kept working).
    #[test]
    fn logging_values_are_checked_and_the_settings_it_replaces_refused_beside_it() {
        let mut s = spec();
        s.logging = crate::api::LoggingSpec {
            level: Some("verbose".into()),
            format: Some(crate::api::LogFormat::Json),
            size: Some("1T".into()),
            count: Some(0),
            files: Some(false),
        };
        s.storage.logs = serde_json::from_value(serde_json::json!({"size": "1Gi"})).unwrap();
        s.configuration
            .settings
            .insert("logger/formatting/type".into(), "json".into());
        s.configuration
            .settings
            .insert("logger/level".into(), "debug".into());
        let (errors, _) = validate("c1", &s);
        let fields: Vec<&str> = errors.iter().map(|e| e.field.as_str()).collect();
        assert_eq!(
            fields,
            [
                "spec.logging.level",
                "spec.logging.size",
                "spec.logging.count",
                "spec.logging.files",
                "spec.configuration.settings.logger/formatting/type",
                "spec.configuration.settings.logger/level",
            ]
        );
        s.logging = crate::api::LoggingSpec {
            level: Some("debug".into()),
            size: Some("500M".into()),
            count: Some(10),
            ..Default::default()
        };
        s.configuration.settings.remove("logger/level");
        assert!(
            validate("c1", &s).0.is_empty(),
            "{:?}",
            validate("c1", &s).0
        );
        // the settings alone, as before spec.logging existed
        s.logging = Default::default();
        s.configuration
            .settings
            .insert("logger/level".into(), "debug".into());
        assert!(validate("c1", &s).0.is_empty());
    }

    /// Decision 49: `spec.systemLogs` names only known tables (never a path), with at most
    /// 36500 days, and a setting that would stop a server beside the operator's `ttl` is
    /// refused.
    #[test]
    fn system_log_tables_and_days_are_checked_and_an_engine_beside_the_ttl_refused() {
        let mut s = spec();
        s.system_logs = Some(crate::api::SystemLogsSpec {
            ttl_days: 40000,
            tables: BTreeMap::from([
                ("../etc/passwd".to_string(), 3),
                ("text_log".to_string(), 50000),
                ("query_log".to_string(), 7),
            ]),
        });
        s.configuration
            .settings
            .insert("query_log/engine".into(), "ENGINE = Log".into());
        s.configuration.settings.insert(
            "opentelemetry_span_log/engine".into(),
            "ENGINE = Log".into(),
        );
        let (errors, _) = validate("c1", &s);
        let fields: Vec<&str> = errors.iter().map(|e| e.field.as_str()).collect();
        assert_eq!(
            fields,
            [
                "spec.systemLogs.ttlDays",
                "spec.systemLogs.tables.../etc/passwd",
                "spec.systemLogs.tables.text_log",
                "spec.configuration.settings.query_log/engine",
            ]
        );
        // the table's own TTL off: its engine is the user's
        s.system_logs = Some(crate::api::SystemLogsSpec {
            ttl_days: 30,
            tables: BTreeMap::from([("query_log".to_string(), 0)]),
        });
        assert!(validate("c1", &s).0.is_empty());
        // unset, the default TTLs count
        s.system_logs = None;
        assert_eq!(validate("c1", &s).0.len(), 1);
    }

    /// S2-10: the servers' own metrics port must not be one the servers already use.
    #[test]
    fn the_server_metrics_port_must_be_free() {
        let mut s = spec();
        s.server_metrics.enabled = true;
        assert!(fields("c1", &s).is_empty());
        for port in [8123, 9009, 80] {
            s.server_metrics.port = port;
            assert_eq!(
                fields("c1", &s),
                vec!["spec.serverMetrics.port".to_string()],
                "{port}"
            );
        }
        s.server_metrics.enabled = false;
        assert!(
            fields("c1", &s).is_empty(),
            "a port of a switched-off endpoint is not checked"
        );
    }

    /// S2-10: the client Service's options must fit its type, its networks be CIDRs and
    /// its labels not the operator's.
    #[test]
    fn client_service_options_fit_its_type() {
        use crate::api::{ClientServiceType, ExternalTrafficPolicy};
        let mut s = spec();
        s.client_service.external_traffic_policy = Some(ExternalTrafficPolicy::Local);
        assert_eq!(
            fields("c1", &s),
            vec!["spec.clientService.externalTrafficPolicy".to_string()]
        );
        s.client_service.r#type = ClientServiceType::NodePort;
        assert!(fields("c1", &s).is_empty());
        s.client_service.load_balancer_source_ranges = vec!["10.0.0.0/8".into()];
        assert_eq!(
            fields("c1", &s),
            vec!["spec.clientService.loadBalancerSourceRanges".to_string()]
        );
        s.client_service.r#type = ClientServiceType::LoadBalancer;
        assert!(fields("c1", &s).is_empty());
        s.client_service.load_balancer_source_ranges = vec!["ten/8".into()];
        assert_eq!(
            fields("c1", &s),
            vec!["spec.clientService.loadBalancerSourceRanges".to_string()]
        );
        s.client_service.load_balancer_source_ranges.clear();
        s.client_service
            .labels
            .insert("clickhouse.com/cluster".into(), "x".into());
        assert_eq!(
            fields("c1", &s),
            vec!["spec.clientService.labels".to_string()]
        );
        s.client_service.labels.clear();
        s.client_service.labels.insert("team".into(), "db".into());
        assert!(fields("c1", &s).is_empty());
    }

    /// Decision 28: an external Keeper needs no own members, either nodes or a cluster reference,
    /// and an absolute root path; with it, several replicas need no Keeper of their own.
    #[test]
    fn an_external_keeper_is_checked_with_its_field() {
        use crate::api::{ExternalKeeper, KeeperClusterRef, KeeperNode};
        let mut s = spec();
        s.replicas = 2;
        s.keeper.replicas = 0;
        assert_eq!(fields("c1", &s), vec!["spec.keeper.replicas".to_string()]);
        s.keeper.external = Some(ExternalKeeper {
            nodes: vec![KeeperNode {
                host: "zk-0.zk".into(),
                port: 2181,
            }],
            ..ExternalKeeper::default()
        });
        assert!(fields("c1", &s).is_empty());
        s.keeper.replicas = 3;
        assert_eq!(fields("c1", &s), vec!["spec.keeper.replicas".to_string()]);
        s.keeper.replicas = 0;
        let x = s.keeper.external.as_mut().unwrap();
        x.cluster_ref = Some(KeeperClusterRef {
            name: "other".into(),
            namespace: None,
        });
        assert_eq!(fields("c1", &s), vec!["spec.keeper.external".to_string()]);
        let x = s.keeper.external.as_mut().unwrap();
        x.nodes.clear();
        assert!(fields("c1", &s).is_empty());
        for (root, ok) in [
            ("/ch/prod", true),
            ("ch/prod", false),
            ("/ch/", false),
            ("/", false),
            ("/ch/../x", false),
            ("/ch prod", false),
        ] {
            s.keeper.external.as_mut().unwrap().root = Some(root.into());
            assert_eq!(
                fields("c1", &s).is_empty(),
                ok,
                "{root}: {:?}",
                fields("c1", &s)
            );
        }
    }

    /// Shard weights name a shard of the cluster by its index, and weigh 1 to 1000 (0 would take
    /// the shard out of the cluster's queries).
    #[test]
    fn shard_weights_name_an_existing_shard_and_weigh_1_to_1000() {
        let mut s = spec();
        s.shards = 2;
        s.shard_weights = BTreeMap::from([
            ("0".to_string(), 0),
            ("1".to_string(), 1000),
            ("2".to_string(), 1),
            ("01".to_string(), 1),
            ("x".to_string(), 1001),
        ]);
        let (errors, _) = validate("c1", &s);
        let fields: Vec<&str> = errors.iter().map(|e| e.field.as_str()).collect();
        assert_eq!(
            fields,
            [
                "spec.shardWeights[0]",
                "spec.shardWeights[01]",
                "spec.shardWeights[2]",
                "spec.shardWeights[x]",
                "spec.shardWeights[x]",
            ]
        );
        s.shard_weights = BTreeMap::from([("1".to_string(), 3)]);
        assert!(validate("c1", &s).0.is_empty());
    }

    /// S2-10: shard files are named by a shard index, plain file names, not the operator's
    /// and not also common files; Keeper settings are element names.
    #[test]
    fn shard_files_and_keeper_settings_are_checked() {
        let mut s = spec();
        let file = |name: &str| BTreeMap::from([(name.to_string(), "<clickhouse/>".to_string())]);
        s.configuration
            .shard_files
            .insert("0".into(), file("a.xml"));
        assert!(fields("c1", &s).is_empty());
        for (shard, name) in [
            ("x", "a.xml"),
            ("01", "a.xml"),
            ("0", "sub/a.xml"),
            ("0", "a.txt"),
            ("0", "00-operator-x.xml"),
        ] {
            s.configuration.shard_files = BTreeMap::from([(shard.to_string(), file(name))]);
            assert_eq!(
                fields("c1", &s),
                vec![format!("spec.configuration.shardFiles[{shard}]")],
                "{shard} {name}"
            );
        }
        s.configuration.shard_files = BTreeMap::from([("0".to_string(), file("a.xml"))]);
        s.configuration.files = file("a.xml");
        assert_eq!(
            fields("c1", &s),
            vec!["spec.configuration.shardFiles[0]".to_string()]
        );
        s.configuration.files.clear();
        s.keeper.settings.insert("bad name".into(), "1".into());
        assert_eq!(fields("c1", &s), vec!["spec.keeper.settings".to_string()]);
    }

    /// S2-10: an unknown profile for the users would make ClickHouse refuse the whole users
    /// file; `tls.required` without a CA would lock the operator out.
    #[test]
    fn an_unknown_users_profile_and_required_tls_without_a_ca_are_refused() {
        let mut s = spec();
        s.users = Some(UsersSpec {
            secret_name: "users".into(),
            profile: Some("analysts".into()),
            ..UsersSpec::default()
        });
        assert_eq!(fields("c1", &s), vec!["spec.users.profile".to_string()]);
        s.configuration
            .profiles
            .insert("analysts".into(), BTreeMap::new());
        assert!(fields("c1", &s).is_empty());
        s.users.as_mut().unwrap().profile = Some("readonly".into());
        assert!(fields("c1", &s).is_empty());
        s.tls = TlsSpec {
            enabled: true,
            server_cert_secret: Some("tls".into()),
            ca_secret: None,
            required: true,
        };
        assert_eq!(fields("c1", &s), vec!["spec.tls.caSecret".to_string()]);
        s.tls.ca_secret = Some("ca".into());
        assert!(fields("c1", &s).is_empty());
    }

    /// S2-10: Keeper over TLS needs the cluster's TLS with a CA, the cluster's own Keeper,
    /// and images that do not name a version older than 22.3; each refused with its field.
    #[test]
    fn keeper_tls_needs_cluster_tls_a_ca_an_own_ensemble_and_new_enough_images() {
        let mut s = spec();
        s.keeper.tls = true;
        assert_eq!(fields("c1", &s), vec!["spec.keeper.tls".to_string()]);
        s.tls = TlsSpec {
            enabled: true,
            server_cert_secret: Some("tls".into()),
            ca_secret: None,
            required: false,
        };
        assert_eq!(fields("c1", &s), vec!["spec.tls.caSecret".to_string()]);
        s.tls.ca_secret = Some("ca".into());
        assert!(fields("c1", &s).is_empty(), "{:?}", fields("c1", &s));
        s.image = "clickhouse/clickhouse-server:21.8".into();
        s.keeper.image = "clickhouse/clickhouse-keeper:21.12".into();
        assert_eq!(
            fields("c1", &s),
            vec!["spec.image".to_string(), "spec.keeper.image".to_string()]
        );
        s.image = "clickhouse/clickhouse-server:latest".into();
        s.keeper.image = "clickhouse/clickhouse-keeper:22.3".into();
        assert!(fields("c1", &s).is_empty());
        s.keeper.replicas = 0;
        assert!(fields("c1", &s).contains(&"spec.keeper.tls".to_string()));
    }

    /// Decision 27: the users' networks and per-user accounts are checked before ClickHouse sees
    /// them: a network that is not an address or CIDR, an unknown profile or quota, a database
    /// that is not a name, each refused with its field.
    #[test]
    fn user_networks_and_accounts_are_checked_with_their_field() {
        let mut s = spec();
        let mut accounts = BTreeMap::new();
        accounts.insert(
            "alice".to_string(),
            crate::api::AccountSpec {
                networks: vec!["10.0.0.0/8".into(), "10.0.0.0/40".into()],
                profile: Some("nobody".into()),
                quota: Some("q1".into()),
                databases: vec!["db1".into(), "db 2".into()],
                access_management: false,
            },
        );
        accounts.insert("bad name".to_string(), Default::default());
        s.users = Some(UsersSpec {
            secret_name: "users".into(),
            networks: vec!["::/0".into(), "somewhere".into()],
            accounts,
            ..UsersSpec::default()
        });
        assert_eq!(
            fields("c1", &s),
            [
                "spec.users.networks",
                "spec.users.accounts.alice.networks",
                "spec.users.accounts.alice.profile",
                "spec.users.accounts.alice.quota",
                "spec.users.accounts.alice.databases",
                "spec.users.accounts",
            ]
        );
        let u = s.users.as_mut().unwrap();
        u.networks = vec!["::/0".into()];
        u.accounts.remove("bad name");
        let a = u.accounts.get_mut("alice").unwrap();
        a.networks = vec!["198.18.0.1".into()];
        a.profile = Some("readonly".into());
        a.quota = Some("default".into());
        a.databases = vec!["db1".into()];
        assert!(fields("c1", &s).is_empty(), "{:?}", fields("c1", &s));
    }

    /// S2-24: `upgradeOptions` is off by default with the default schedule; when on, it needs
    /// a known `apply`, a valid cron and exactly one version source.
    #[test]
    fn upgrade_options_are_checked() {
        let mut s = spec();
        assert_eq!(s.upgrade_options.apply, "Disabled");
        assert_eq!(s.upgrade_options.schedule, "0 4 * * *");
        assert!(fields("c1", &s).is_empty());
        s.upgrade_options.apply = "Recommended".into();
        assert_eq!(
            fields("c1", &s),
            vec!["spec.upgradeOptions.versionSource".to_string()]
        );
        s.upgrade_options.version_source = Some(VersionSource {
            url: Some("https://versions.example/clickhouse.json".into()),
            config_map: Some(ConfigMapKey {
                name: "v".into(),
                key: None,
            }),
            insecure: false,
        });
        assert_eq!(
            fields("c1", &s),
            vec!["spec.upgradeOptions.versionSource".to_string()]
        );
        s.upgrade_options
            .version_source
            .as_mut()
            .unwrap()
            .config_map = None;
        assert!(fields("c1", &s).is_empty());
        s.upgrade_options.version_source.as_mut().unwrap().url = Some("ftp://x".into());
        s.upgrade_options.schedule = "0 4 * *".into();
        assert_eq!(
            fields("c1", &s),
            vec![
                "spec.upgradeOptions.schedule".to_string(),
                "spec.upgradeOptions.versionSource.url".to_string()
            ]
        );
        s.upgrade_options.apply = "soon".into();
        assert_eq!(
            fields("c1", &s),
            vec!["spec.upgradeOptions.apply".to_string()]
        );
    }

    /// Decision 37: a plain-HTTP version source only with `insecure`; allowed repositories
    /// are repositories, not images.
    #[test]
    fn an_upgrade_source_is_https_and_repositories_carry_no_tag() {
        let mut s = spec();
        s.upgrade_options.apply = "Latest".into();
        s.upgrade_options.version_source = Some(VersionSource {
            url: Some("http://versions.internal/ch.json".into()),
            ..VersionSource::default()
        });
        s.upgrade_options.allowed_repositories = vec![
            "mirror.example:5000/ch/server".into(),
            "mirror.example/ch/server:25.3".into(),
            "x@sha256:abc".into(),
        ];
        assert_eq!(
            fields("c1", &s),
            vec![
                "spec.upgradeOptions.versionSource.url".to_string(),
                "spec.upgradeOptions.allowedRepositories[1]".to_string(),
                "spec.upgradeOptions.allowedRepositories[2]".to_string(),
            ]
        );
        s.upgrade_options.version_source.as_mut().unwrap().insecure = true;
        s.upgrade_options.allowed_repositories.truncate(1);
        assert!(fields("c1", &s).is_empty());
    }

    #[test]
    fn backup_schedules_are_checked() {
        let mut s = spec();
        s.backup.destination = Some(crate::api::S3Destination {
            endpoint: "http://s3:8333".into(),
            bucket: "backups".into(),
            secret_name: "s3".into(),
            insecure: true,
            ..Default::default()
        });
        let sched = |name: &str, cron: &str, keep| BackupSchedule {
            name: name.into(),
            schedule: cron.into(),
            keep,
            incremental: true,
        };
        s.backup.schedules = vec![sched("daily", "0 3 * * *", 7)];
        assert!(fields("c1", &s).is_empty());
        s.backup.schedules = vec![sched("daily", "0 3 * *", 7), sched("daily", "0 3 * * *", 0)];
        let f = fields("c1", &s);
        assert!(f.contains(&"spec.backup.schedules[0].schedule".to_string()));
        assert!(f.contains(&"spec.backup.schedules[1].name".to_string()));
        assert!(f.contains(&"spec.backup.schedules[1].keep".to_string()));
        s.backup.schedules = vec![sched("daily", "0 3 * * *", 7)];
        s.backup.destination = None;
        assert_eq!(
            fields("c1", &s),
            vec!["spec.backup.destination".to_string()]
        );
    }

    /// A destination must be usable: an http(s) endpoint, an S3 bucket name, a Secret name, a
    /// relative prefix; each problem names its field.
    #[test]
    fn s3_destinations_are_checked_field_by_field() {
        let mut s = spec();
        s.backup.destination = Some(crate::api::S3Destination {
            endpoint: "s3.example.com".into(),
            bucket: "Backups_1".into(),
            prefix: Some("/abs/../x".into()),
            secret_name: "Bad_Secret".into(),
            ..Default::default()
        });
        assert_eq!(
            fields("c1", &s),
            [
                "spec.backup.destination.endpoint",
                "spec.backup.destination.bucket",
                "spec.backup.destination.secretName",
                "spec.backup.destination.prefix",
            ]
        );
    }

    /// Decision 43: a destination has static keys or web identity, never both and never
    /// neither; its role ARN, ServiceAccount, audience and STS endpoint are each checked, and an
    /// http STS endpoint needs `insecure` as the endpoint does.
    #[test]
    fn web_identity_destinations_are_checked_and_exclude_static_keys() {
        let mut s = spec();
        let web = |role: &str, sa: &str, sts: Option<&str>| crate::api::WebIdentity {
            role_arn: role.into(),
            service_account_name: sa.into(),
            audience: None,
            sts_endpoint: sts.map(str::to_string),
        };
        let d = |secret: &str, w: Option<crate::api::WebIdentity>| crate::api::S3Destination {
            endpoint: "https://s3.example.com".into(),
            bucket: "backups".into(),
            secret_name: secret.into(),
            web_identity: w,
            ..Default::default()
        };
        let good = web("arn:aws:iam::123456789012:role/backups", "ch-backups", None);
        s.backup.destination = Some(d("", Some(good.clone())));
        assert!(fields("c1", &s).is_empty(), "{:?}", fields("c1", &s));
        s.backup.destination = Some(d("", None));
        assert_eq!(fields("c1", &s), ["spec.backup.destination.secretName"]);
        let mut both = d("s3", Some(good.clone()));
        both.access_key_id_key = Some("id".into());
        s.backup.destination = Some(both);
        assert_eq!(
            fields("c1", &s),
            [
                "spec.backup.destination.secretName",
                "spec.backup.destination.accessKeyIdKey"
            ]
        );
        let mut bad = web(
            "arn:aws:iam::role/x",
            "Bad_SA",
            Some("http://sts.local:8333"),
        );
        bad.audience = Some("two words".into());
        s.backup.destination = Some(d("", Some(bad)));
        let (errors, _) = validate("c1", &s);
        let named: Vec<&str> = errors.iter().map(|e| e.field.as_str()).collect();
        assert_eq!(
            named,
            [
                "spec.backup.destination.webIdentity.roleArn",
                "spec.backup.destination.webIdentity.serviceAccountName",
                "spec.backup.destination.webIdentity.audience",
                "spec.backup.destination.webIdentity.stsEndpoint",
            ]
        );
        assert!(
            errors[3].message.contains("insecure"),
            "{}",
            errors[3].message
        );
        let mut insecure = d(
            "",
            Some(web(
                "arn:aws:iam::123456789012:role/b",
                "sa",
                Some("http://sts.local:8333"),
            )),
        );
        insecure.insecure = true;
        s.backup.destination = Some(insecure);
        assert!(fields("c1", &s).is_empty());
    }

    /// Decision 26: the agent's pods take extra environment variables, never one the agent is
    /// configured with.
    #[test]
    fn agent_environment_cannot_override_the_agents_own() {
        let mut s = spec();
        let var = |n: &str| k8s_openapi::api::core::v1::EnvVar {
            name: n.into(),
            value: Some("x".into()),
            ..Default::default()
        };
        s.backup.agent.env = vec![
            var("HTTPS_PROXY"),
            var("NO_PROXY"),
            var("S3_ENDPOINT"),
            var("CH_HOSTS"),
            var("SHARD"),
            var("AWS_ROLE_ARN"),
            var("AWS_CA_BUNDLE"),
        ];
        assert_eq!(
            fields("c1", &s),
            [
                "spec.backup.agent.env[2].name",
                "spec.backup.agent.env[3].name",
                "spec.backup.agent.env[4].name",
                "spec.backup.agent.env[5].name"
            ]
        );
    }

    /// Decision 29: a plain-HTTP endpoint only with `insecure`, for the cluster's destination
    /// and every destination it allows.
    #[test]
    fn plain_http_destinations_need_insecure() {
        let mut s = spec();
        let d = |endpoint: &str, insecure| crate::api::S3Destination {
            endpoint: endpoint.into(),
            bucket: "backups".into(),
            secret_name: "s3".into(),
            insecure,
            ..Default::default()
        };
        s.backup.destination = Some(d("http://minio:9000", false));
        s.backup.allowed_destinations =
            vec![d("https://s3.example.com", false), d("http://x", false)];
        let (errors, _) = validate("c1", &s);
        let fields: Vec<&str> = errors.iter().map(|e| e.field.as_str()).collect();
        assert_eq!(
            fields,
            [
                "spec.backup.destination.endpoint",
                "spec.backup.allowedDestinations[1].endpoint"
            ]
        );
        assert!(
            errors[0].message.contains("insecure: true"),
            "{}",
            errors[0].message
        );
        s.backup.destination = Some(d("http://minio:9000", true));
        s.backup.allowed_destinations = vec![d("https://s3.example.com", false)];
        assert!(validate("c1", &s).0.is_empty());
    }

    /// S2-25: a resource newer than the operator is refused with a message to upgrade.
    #[test]
    fn newer_cr_version_is_refused() {
        let mut s = spec();
        s.cr_version = Some(OPERATOR_VERSION.into());
        assert!(fields("c1", &s).is_empty());
        s.cr_version = Some("99.0.0".into());
        let (errors, _) = validate("c1", &s);
        assert_eq!(errors[0].field, "spec.crVersion");
        assert!(errors[0].message.contains("upgrade the operator"));
        s.cr_version = Some("x.y".into());
        assert_eq!(fields("c1", &s), vec!["spec.crVersion".to_string()]);
    }

    /// Decision 42: a `-distroless` Keeper image has no shell, which the Keeper pod's command and
    /// readiness probe need: refused with the reason. A distroless server image is fine (no
    /// command, HTTP probes), and an external Keeper's image is not used.
    #[test]
    fn a_distroless_keeper_image_is_refused_with_the_reason() {
        let mut s = spec();
        for image in [
            "clickhouse/clickhouse-keeper:26.1-distroless",
            "registry.example:5000/ch/clickhouse-keeper:26.1.2.3-distroless@sha256:abc",
        ] {
            s.keeper.image = image.into();
            let (errors, _) = validate("c1", &s);
            assert_error(
                &errors,
                &serde_json::json!(image),
                "spec.keeper.image",
                "no shell",
            );
        }
        for image in [
            "clickhouse/clickhouse-keeper:26.1",
            "clickhouse/clickhouse-keeper:26.1-alpine",
            "registry.example:5000/distroless/clickhouse-keeper:26.1",
        ] {
            s.keeper.image = image.into();
            assert!(fields("c1", &s).is_empty(), "{image}");
        }
        s.keeper.image = "clickhouse/clickhouse-keeper:26.1".into();
        s.image = "clickhouse/clickhouse-server:26.1-distroless".into();
        assert!(fields("c1", &s).is_empty());
    }

    /// Decision 42: variables the operator sets or the images' entrypoints act on against
    /// the operator's configuration are refused in `env`, each with its index.
    #[test]
    fn reserved_environment_variables_are_refused_with_their_index() {
        let var = |name: &str| k8s_openapi::api::core::v1::EnvVar {
            name: name.into(),
            value: Some("x".into()),
            ..Default::default()
        };
        let mut s = spec();
        s.pod.env = vec![
            var("TZ"),
            var("CLICKHOUSE_PASSWORD"),
            var("CLICKHOUSE_SKIP_USER_SETUP"),
        ];
        s.keeper.pod.env = vec![
            var("CLICKHOUSE_DATA_DIR"),
            var("TZ"),
            var("KEEPER_SERVER_ID"),
        ];
        assert_eq!(
            fields("c1", &s),
            [
                "spec.pod.env[1].name",
                "spec.pod.env[2].name",
                "spec.keeper.pod.env[0].name",
                "spec.keeper.pod.env[2].name",
            ]
        );
        s.pod.env = vec![var("TZ")];
        s.keeper.pod.env = vec![var("TZ")];
        assert!(fields("c1", &s).is_empty());
    }

    /// Decision 42: Keeper's own `startup_timeout` must end within the startup probe's
    /// budget, or the probe would restart a member still waiting for its quorum.
    #[test]
    fn keepers_startup_timeout_must_end_within_the_probe_budget() {
        let mut s = spec();
        for (timeout, startup_seconds, ok) in [
            ("30000", None, true),
            ("59999", None, true),
            ("60000", None, false),
            ("180000", None, false),
            ("180000", Some(200), true),
            ("0", None, false),
            ("soon", None, false),
        ] {
            s.keeper.settings =
                BTreeMap::from([("startup_timeout".to_string(), timeout.to_string())]);
            s.keeper.pod.startup_seconds = startup_seconds;
            let errors = fields("c1", &s);
            if ok {
                assert!(
                    errors.is_empty(),
                    "{timeout} {startup_seconds:?}: {errors:?}"
                );
            } else {
                assert_eq!(
                    errors,
                    ["spec.keeper.settings.startup_timeout"],
                    "{timeout} {startup_seconds:?}"
                );
            }
        }
    }
}
