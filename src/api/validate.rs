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

pub use crate::version::OPERATOR_VERSION;

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

pub use crate::util::limits::{
    EXTERNAL_KEEPER_NODES_CEILING, Limits, REPLICAS_CEILING, SHARDS_CEILING,
};

/// Checks a cluster's name and spec under the default [`Limits`]. Returns every error (not just
/// the first) and the warnings.
pub fn validate(name: &str, spec: &ClickHouseClusterSpec) -> (Vec<FieldError>, Vec<Warning>) {
    validate_with(name, spec, &Limits::default())
}

/// Checks a cluster's name and spec under the operator's `limits`.
pub fn validate_with(
    name: &str,
    spec: &ClickHouseClusterSpec,
    limits: &Limits,
) -> (Vec<FieldError>, Vec<Warning>) {
    let mut errors = Errors::default();
    check_name(name, &mut errors);
    check_counts(spec, &mut errors);
    check_limits(spec, limits, &mut errors);
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

/// Shards, replicas and external Keeper members at most what the operator allows.
fn check_limits(spec: &ClickHouseClusterSpec, limits: &Limits, errors: &mut Errors) {
    if spec.shards > limits.max_shards {
        errors.add(
            "spec.shards",
            format!(
                "must be at most {} (this operator's MAX_SHARDS), got {}",
                limits.max_shards, spec.shards
            ),
        );
    }
    if spec.replicas > limits.max_replicas {
        errors.add(
            "spec.replicas",
            format!(
                "must be at most {} (this operator's MAX_REPLICAS), got {}",
                limits.max_replicas, spec.replicas
            ),
        );
    }
    if let Some(x) = &spec.keeper.external
        && x.nodes.len() as u64 > EXTERNAL_KEEPER_NODES_CEILING
    {
        errors.add(
            "spec.keeper.external.nodes",
            format!(
                "must list at most {EXTERNAL_KEEPER_NODES_CEILING} members, got {}",
                x.nodes.len()
            ),
        );
    }
}

/// Shards, replicas and Keeper members: at least one shard and replica, or no shard for a
/// Keeper-only cluster (decision 55) with an ensemble of its own; a Keeper ensemble that can
/// form a quorum, and Keeper wherever tables are replicated.
fn check_counts(spec: &ClickHouseClusterSpec, errors: &mut Errors) {
    if spec.shards < 0 {
        errors.add(
            "spec.shards",
            format!("must be at least 0, got {}", spec.shards),
        );
    }
    if spec.shards == 0 && (spec.keeper.replicas < 1 || spec.keeper.external.is_some()) {
        errors.add(
            "spec.shards",
            "is 0 (a Keeper-only cluster): spec.keeper.replicas must be at least 1, without spec.keeper.external".into(),
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
    if let Some(why) = su_refuses_group_zero(spec) {
        errors.add("spec.image", why);
    }
    if spec.troubleshoot && is_distroless(&spec.image) {
        errors.add(
            "spec.troubleshoot",
            format!(
                "{:?} is a distroless image: it has no shell to keep the container up when the                  server stops; troubleshoot with the same version without the -distroless suffix",
                spec.image
            ),
        );
    }
}

/// Decision 66: with `spec.podSecurity.ids: Platform` on OpenShift the server runs as a uid of
/// the namespace's range whose primary group is 0, and the image's entrypoint runs
/// `clickhouse su "$(id -u):$(id -g)"` for every folder and for the server. Before ClickHouse
/// #71626 (November 2024) `clickhouse su` looks a numeric group of 0 up by name and exits with
/// "Group 0 is not found in the system": every server crash-loops. Fixed in 24.11 and newer
/// and in the patch releases 24.3.14 and 24.8.7 (the floating tags `24.3` and `24.8` are newer
/// ones); not in any 24.7, 24.9 or 24.10 release. Images before 24.1 (outside the 24.x–26.x the
/// pods are made for) were not checked and are not refused. Refused under Platform unless `spec.pod.template` sets a `runAsGroup` other
/// than 0 (the server container's or the pod's), which the entrypoint then passes to `su`
/// instead. An unknown version (`latest`, a digest, no tag) is taken as the newest.
fn su_refuses_group_zero(spec: &ClickHouseClusterSpec) -> Option<String> {
    if spec.pod_security.ids != super::PodIds::Platform || is_distroless(&spec.image) {
        return None;
    }
    let group = |v: &serde_json::Value| v["securityContext"]["runAsGroup"].as_i64();
    let template = spec.pod.template.as_ref();
    let container_group = template
        .and_then(|t| t["spec"]["containers"].as_array())
        .and_then(|cs| cs.iter().find(|c| c["name"] == "clickhouse"))
        .and_then(group);
    let pod_group = template.and_then(|t| group(&t["spec"]));
    if container_group.or(pod_group).is_some_and(|g| g != 0) {
        return None;
    }
    let no_digest = spec.image.split('@').next().unwrap_or_default();
    let last = no_digest.rsplit('/').next().unwrap_or_default();
    let tag = last.split_once(':').map(|(_, t)| t).unwrap_or_default();
    let core = tag.split(['-', '+']).next().unwrap_or_default();
    let parts: Vec<u32> = core.split('.').map_while(|p| p.parse().ok()).collect();
    let fixed = match parts.as_slice() {
        [] => true,
        [major, ..] if *major != 24 => true,
        [24, minor, ..] if *minor >= 11 => true,
        [24, 3] | [24, 8] => true,
        [24, 3, patch, ..] => *patch >= 14,
        [24, 8, patch, ..] => *patch >= 7,
        _ => false,
    };
    (!fixed).then(|| {
        format!(
            "{:?} with spec.podSecurity.ids: Platform: where the platform starts the server with \
             group 0 (OpenShift), this image's entrypoint exits at its first `clickhouse su` \
             (\"Group 0 is not found in the system\", fixed in November 2024): use 24.3.14, \
             24.8.7 or a later patch release of these, 24.11 or newer, or set a runAsGroup other \
             than 0 in spec.pod.template",
            spec.image
        )
    })
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
    let budget = spec.keeper.startup_seconds();
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
    let prefix = crate::conventions::OPERATOR_FILE_PREFIX;
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
            (p.mysql, "mysql", crate::conventions::MYSQL_PORT),
            (
                p.postgresql,
                "postgresql",
                crate::conventions::POSTGRESQL_PORT,
            ),
            (p.grpc, "grpc", crate::conventions::GRPC_PORT),
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
    use crate::conventions as logs;
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
    for (table, _) in crate::api::SystemLogsSpec::ttls(spec.system_logs.as_ref()) {
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
        crate::conventions::HTTP_PORT,
        crate::conventions::TCP_PORT,
        crate::conventions::INTERSERVER_HTTP_PORT,
        crate::conventions::HTTPS_PORT,
        crate::conventions::TCP_SECURE_PORT,
        crate::conventions::INTERSERVER_HTTPS_PORT,
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
        let since = crate::version::Capability::KeeperTls.since();
        for (field, image) in [
            ("spec.image", &spec.image),
            ("spec.keeper.image", &spec.keeper.image),
        ] {
            if let Some((_, v)) = crate::version::image_version(image)
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
    let apply = match crate::version::Apply::parse(&u.apply) {
        Ok(a) => a,
        Err(e) => {
            errors.add("spec.upgradeOptions.apply", e);
            return;
        }
    };
    if let Err(e) = Cron::parse(&u.schedule) {
        errors.add("spec.upgradeOptions.schedule", e);
    }
    if apply == crate::version::Apply::Disabled {
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
    if let Err(why) = crate::util::web_identity::check_role_arn(&w.role_arn) {
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
        && let Err(why) = crate::util::web_identity::check_endpoint(e, insecure)
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
        if !crate::conventions::is_element_name(name) {
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
    check_replica_files(name, spec, errors);
    check_shard_weights(spec, errors);
    check_shard_files(spec, errors);
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
    check_secret_settings(spec, errors);
    check_secret_files(spec, errors);
    for var in spec.pod.env.iter().map(|e| &e.name) {
        if var.starts_with(crate::conventions::SECRET_SETTING_ENV_PREFIX) {
            errors.add(
                "spec.pod.env",
                format!(
                    "{var:?} is reserved for spec.configuration.secretSettings (prefix {})",
                    crate::conventions::SECRET_SETTING_ENV_PREFIX
                ),
            );
        }
    }
    for key in spec.configuration.settings.keys() {
        check_setting_key("spec.configuration.settings", key, errors);
    }
    check_users(spec, errors);
}

/// `spec.configuration.replicaFiles`: keyed by the name of one of the cluster's replicas, each
/// file a name that no file of the cluster or of the replica's shard has.
fn check_replica_files(name: &str, spec: &ClickHouseClusterSpec, errors: &mut Errors) {
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
}

/// `spec.shardWeights`: keyed by the index of one of the cluster's shards, each weight from 1
/// to 1000.
fn check_shard_weights(spec: &ClickHouseClusterSpec, errors: &mut Errors) {
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
}

/// `spec.configuration.shardFiles`: keyed by a shard index, each file a name that no file of
/// the cluster has.
fn check_shard_files(spec: &ClickHouseClusterSpec, errors: &mut Errors) {
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
}

/// `spec.configuration.secretSettings`: setting paths, none of the Keeper client's and none
/// that overlaps a plain setting.
fn check_secret_settings(spec: &ClickHouseClusterSpec, errors: &mut Errors) {
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
}

/// `spec.configuration.secretFiles`: configuration file names that no plain file has.
fn check_secret_files(spec: &ClickHouseClusterSpec, errors: &mut Errors) {
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
}

/// `spec.users`: profiles and quotas the configuration defines, valid names and networks.
fn check_users(spec: &ClickHouseClusterSpec, errors: &mut Errors) {
    if let Some(profile) = spec.users.as_ref().and_then(|u| u.profile.as_ref())
        && !is_profile(spec, profile)
    {
        errors.add("spec.users.profile", unknown_profile(profile));
    }
    let Some(users) = &spec.users else {
        return;
    };
    check_networks(errors, "spec.users.networks", &users.networks);
    for (name, account) in &users.accounts {
        let at = format!("spec.users.accounts.{name}");
        if !crate::conventions::is_element_name(name) {
            errors.add(
                "spec.users.accounts",
                format!("{name:?} is not a user name (a letter or '_' first, then letters, digits, '_', '-', '.')"),
            );
        }
        check_networks(errors, &format!("{at}.networks"), &account.networks);
        if let Some(profile) = &account.profile
            && !is_profile(spec, profile)
        {
            errors.add(&format!("{at}.profile"), unknown_profile(profile));
        }
        if let Some(quota) = &account.quota
            && quota != crate::conventions::DEFAULT_QUOTA
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

/// A built-in settings profile or one of `spec.configuration.profiles`.
fn is_profile(spec: &ClickHouseClusterSpec, profile: &str) -> bool {
    BUILT_IN_PROFILES.contains(&profile) || spec.configuration.profiles.contains_key(profile)
}

fn unknown_profile(profile: &str) -> String {
    format!(
        "{profile:?} is neither in spec.configuration.profiles nor one of {BUILT_IN_PROFILES:?}: ClickHouse would refuse the whole users file"
    )
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
mod tests;
