//! The server's `config.d/`: the common ConfigMap `<cluster>-common`, shared by every replica,
//! and the per-replica ConfigMap `<sts>` with what differs per replica (macros, interserver
//! host), so that adding or removing a replica rewrites no other replica's own file.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ConfigMap;

use super::settings::needs_restart;
use super::xml::{Element, ROOT};
use crate::api::ShardIndex;
pub use crate::conventions::OPERATOR_FILE_PREFIX;
use crate::model::labels::{self, Component};
use crate::model::{BuildError, Cluster, Password, ReplicaSpec, names};

/// Ports, listen addresses, logger, TLS, distributed DDL: read at startup.
pub const SERVER_FILE: &str = "00-operator-server.xml";
/// The user's settings that need a restart (see [`super::settings`]).
pub const SETTINGS_FILE: &str = "00-operator-settings.xml";
/// What ClickHouse reloads: `remote_servers`, the Keeper nodes, the user's reloadable settings.
/// Its name sorts after [`SERVER_FILE`]: files merge in name order, so a reloadable setting the
/// user sets (`logger/level`) overrides the server file's default instead of being overridden.
/// `spec.configuration.secretSettings`: each setting read from its environment variable
/// ([`crate::model::names::secret_setting_env`]), which the pod takes from the Secret key.
pub const SECRET_SETTINGS_FILE: &str = "00-operator-settings-from-secrets.xml";
pub const RUNTIME_FILE: &str = "00-operator-zz-runtime.xml";
/// Closes the MySQL and PostgreSQL wire-protocol ports the images' `config.xml` opens (9004,
/// 9005): nothing of the operator uses them, the pods do not declare them, and they stay
/// plaintext even with `spec.tls.required`. A user who wants one sets `mysql_port` or
/// `postgresql_port` in `spec.configuration.settings` (merged later). Reloaded: current
/// servers close the listeners at the reload, and an operator upgrade restarts nothing for
/// it (invariant 9).
pub const CLOSED_PORTS_FILE: &str = "00-operator-closed-ports.xml";
/// The ports [`CLOSED_PORTS_FILE`] closes.
pub const CLOSED_PORTS: &[&str] = &["mysql_port", "postgresql_port"];
/// The per-replica file: macros and `interserver_http_host`.
pub const REPLICA_FILE: &str = "00-operator-replica.xml";
/// Keeper path of the distributed DDL queue (`ON CLUSTER`).
pub const DDL_PATH: &str = "/clickhouse/task_queue/ddl";

/// When a change of a file takes effect.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Effect {
    /// Read at startup: the file is part of the pod template's config hash.
    Restart,
    /// Reloaded by ClickHouse at runtime: no pod template depends on it.
    Reload,
    /// Read at startup, but its content also follows what the operator learns (the server
    /// version): no pod template hashes it; what restarts the servers for it is the spec
    /// field's own hash annotation (the system log TTLs, decision 49).
    NextStart,
}

/// One file of `config.d/`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigFile {
    pub name: String,
    pub content: String,
    pub effect: Effect,
}

/// The files of the common ConfigMap, sorted by name: the operator's three files and the
/// user's `spec.configuration.files` (whose content the operator cannot judge: restart).
pub fn common_files(c: &Cluster<'_>) -> Result<Vec<ConfigFile>, BuildError> {
    let settings = &c.spec.configuration.settings;
    let restart = Element::from_paths(
        settings
            .iter()
            .filter(|(k, _)| needs_restart(k))
            .map(|(k, v)| (k.as_str(), v.as_str())),
        "spec.configuration.settings",
    )?;
    // the client's own Keeper settings (timeouts) go inside the operator's `zookeeper`
    // element, which replaces the image's: written beside it, they would be dropped
    let keeper_client = Element::from_paths(
        settings
            .iter()
            .filter_map(|(k, v)| Some((k.strip_prefix("zookeeper/")?, v.as_str()))),
        "spec.configuration.settings",
    )?;
    // `spec.logging.level` is reloaded like the setting `logger/level` it replaces (validation
    // refuses both at once)
    let level = c.spec.logging.level.as_deref().map(|l| ("logger/level", l));
    let reload = Element::from_paths(
        settings
            .iter()
            .filter(|(k, _)| !needs_restart(k) && !k.starts_with("zookeeper/"))
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .chain(level),
        "spec.configuration.settings",
    )?;
    let mut files = vec![
        ConfigFile {
            name: SERVER_FILE.into(),
            content: server_element(c).to_document(),
            effect: Effect::Restart,
        },
        ConfigFile {
            name: SETTINGS_FILE.into(),
            content: Element::new(ROOT).children(restart).to_document(),
            effect: Effect::Restart,
        },
        ConfigFile {
            name: CLOSED_PORTS_FILE.into(),
            content: Element::new(ROOT)
                .children(
                    CLOSED_PORTS
                        .iter()
                        .filter(|p| !opened(c, p))
                        .map(|p| Element::new(p).attr("remove", "remove")),
                )
                .to_document(),
            effect: Effect::Reload,
        },
        ConfigFile {
            name: RUNTIME_FILE.into(),
            content: Element::new(ROOT)
                .children(zookeeper(c).map(|z| z.children(keeper_client)))
                .children(reload)
                .to_document(),
            effect: Effect::Reload,
        },
    ];
    let secret_settings = &c.spec.configuration.secret_settings;
    if !secret_settings.is_empty() {
        let vars: Vec<String> = (0..secret_settings.len())
            .map(crate::model::names::secret_setting_env)
            .collect();
        let elements = Element::from_env_paths(
            secret_settings
                .keys()
                .zip(&vars)
                .map(|(k, v)| (k.as_str(), v.as_str())),
            "spec.configuration.secretSettings",
        )?;
        files.push(ConfigFile {
            name: SECRET_SETTINGS_FILE.into(),
            content: Element::new(ROOT).children(elements).to_document(),
            effect: Effect::Restart,
        });
    }
    if let Some((name, _)) = c
        .spec
        .configuration
        .users_d_files()
        .find(|(n, _)| n.starts_with(OPERATOR_FILE_PREFIX))
    {
        return Err(BuildError::ReservedFile(format!("users.d/{name}")));
    }
    for (name, content) in c.spec.configuration.config_d_files() {
        if name.starts_with(OPERATOR_FILE_PREFIX) {
            return Err(BuildError::ReservedFile(name.clone()));
        }
        files.push(ConfigFile {
            name: name.clone(),
            content: content.clone(),
            effect: Effect::Restart,
        });
    }
    files.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(files)
}

/// Whether `spec.protocols` opens the port [`CLOSED_PORTS`] would close.
fn opened(c: &Cluster<'_>, port: &str) -> bool {
    let p = &c.spec.protocols;
    (port == "mysql_port" && p.mysql) || (port == "postgresql_port" && p.postgresql)
}

/// The protocols of `spec.protocols`: their ports, and gRPC over TLS with the server
/// certificate when `spec.tls` is on (MySQL and PostgreSQL offer TLS on their own port from the
/// `openSSL` server section).
fn protocols(c: &Cluster<'_>) -> Vec<Element> {
    let p = &c.spec.protocols;
    let mut out = Vec::new();
    if p.mysql {
        out.push(Element::leaf("mysql_port", names::MYSQL_PORT));
    }
    if p.postgresql {
        out.push(Element::leaf("postgresql_port", names::POSTGRESQL_PORT));
    }
    if p.grpc {
        out.push(Element::leaf("grpc_port", names::GRPC_PORT));
        if c.spec.tls.enabled {
            out.push(
                Element::new("grpc")
                    .child(Element::leaf("enable_ssl", 1))
                    .child(Element::leaf(
                        "ssl_cert_file",
                        format!("{}/tls.crt", names::SERVER_TLS_PATH),
                    ))
                    .child(Element::leaf(
                        "ssl_key_file",
                        format!("{}/tls.key", names::SERVER_TLS_PATH),
                    ))
                    .child(Element::leaf("ssl_require_client_auth", "false")),
            );
        }
    }
    out
}

/// The version a protocol of `spec.protocols` needs, when the servers are known to be older:
/// an error naming the field (the configuration is not written for servers that cannot serve
/// it).
pub fn check_protocols(
    c: &Cluster<'_>,
    version: Option<crate::version::Version>,
) -> Result<(), BuildError> {
    use crate::version::Capability;
    let Some(v) = version else {
        return Ok(());
    };
    if c.spec.users.as_ref().is_some_and(|u| u.replicated_access)
        && !v.supports(Capability::ReplicatedAccessStorage)
    {
        return Err(BuildError::Unsupported {
            field: "spec.users.replicatedAccess".into(),
            detail: format!(
                "needs ClickHouse {} or later: the servers run {v}",
                Capability::ReplicatedAccessStorage.since()
            ),
        });
    }
    let p = &c.spec.protocols;
    for (on, field, cap) in [
        (p.mysql, "mysql", Capability::MysqlProtocol),
        (p.postgresql, "postgresql", Capability::PostgresqlProtocol),
        (p.grpc, "grpc", Capability::GrpcProtocol),
    ] {
        if on && !v.supports(cap) {
            return Err(BuildError::Unsupported {
                field: format!("spec.protocols.{field}"),
                detail: format!(
                    "needs ClickHouse {} or later: the servers run {v}",
                    cap.since()
                ),
            });
        }
    }
    Ok(())
}

/// `00-operator-server.xml`.
fn server_element(c: &Cluster<'_>) -> Element {
    let tls = &c.spec.tls;
    let mut root = Element::new(ROOT)
        .child(Element::leaf("listen_host", "::"))
        .child(Element::leaf("listen_host", "0.0.0.0"))
        .child(Element::leaf("listen_try", 1));
    if tls.enabled && tls.required {
        root = root
            .child(Element::new("http_port").attr("remove", "remove"))
            .child(Element::new("tcp_port").attr("remove", "remove"))
            .child(Element::new("interserver_http_port").attr("remove", "remove"))
            .child(Element::leaf(
                "interserver_https_port",
                names::INTERSERVER_HTTPS_PORT,
            ));
    } else {
        root = root
            .child(Element::leaf("http_port", names::HTTP_PORT))
            .child(Element::leaf("tcp_port", names::TCP_PORT))
            .child(Element::leaf(
                "interserver_http_port",
                names::INTERSERVER_HTTP_PORT,
            ));
    }
    if tls.enabled {
        let ca = tls
            .ca_secret
            .as_ref()
            .map(|_| Element::leaf("caConfig", format!("{}/ca.crt", names::SERVER_CA_PATH)));
        let common = |e: Element| {
            e.child(Element::leaf("cacheSessions", "true"))
                .child(Element::leaf(
                    "disableProtocols",
                    "sslv2,sslv3,tlsv1,tlsv1_1",
                ))
                .child(Element::leaf("preferServerCiphers", "true"))
                .children(ca.clone())
        };
        root = root
            .child(Element::leaf("https_port", names::HTTPS_PORT))
            .child(Element::leaf("tcp_port_secure", names::TCP_SECURE_PORT))
            .child(
                Element::new("openSSL")
                    .attr("replace", "replace")
                    .child(common(
                        Element::new("server")
                            .child(Element::leaf(
                                "certificateFile",
                                format!("{}/tls.crt", names::SERVER_TLS_PATH),
                            ))
                            .child(Element::leaf(
                                "privateKeyFile",
                                format!("{}/tls.key", names::SERVER_TLS_PATH),
                            ))
                            .child(Element::leaf("verificationMode", "none"))
                            .child(Element::leaf("loadDefaultCAFile", "false")),
                    ))
                    .child(common(
                        Element::new("client")
                            .child(Element::leaf(
                                "verificationMode",
                                if tls.ca_secret.is_some() {
                                    "relaxed"
                                } else {
                                    "none"
                                },
                            ))
                            .child(Element::leaf("loadDefaultCAFile", "true"))
                            .child(
                                Element::new("invalidCertificateHandler")
                                    .child(Element::leaf("name", "RejectCertificateHandler")),
                            ),
                    )),
            );
    }
    root = root.children(protocols(c));
    if c.spec.users.as_ref().is_some_and(|u| u.replicated_access) {
        // the image's `users_xml` (the users file of the operator and `spec.users`) and, in
        // place of its `local_directory` on each server's disk, Keeper: a user created with
        // SQL is then known to every server, a new replica included
        root = root.child(
            Element::new("user_directories")
                .attr("replace", "replace")
                .child(Element::new("users_xml").child(Element::leaf("path", "users.xml")))
                .child(Element::new("replicated").child(Element::leaf(
                    "zookeeper_path",
                    names::REPLICATED_ACCESS_PATH,
                ))),
        );
    }
    if c.spec.server_metrics.enabled {
        root = root.child(
            Element::new("prometheus")
                .child(Element::leaf("endpoint", "/metrics"))
                .child(Element::leaf("port", c.spec.server_metrics.port))
                .child(Element::leaf("metrics", "true"))
                .child(Element::leaf("events", "true"))
                .child(Element::leaf("asynchronous_metrics", "true")),
        );
    }
    if let Some(storage) = storage_configuration(c) {
        root = root.child(storage);
    }
    root.child(logger(&c.spec.logging))
        .child(Element::new("distributed_ddl").child(Element::leaf("path", DDL_PATH)))
}

/// `logger` from `spec.logging`: without it, what the operator always wrote (so a cluster that
/// sets nothing keeps its file). The level here is the default the runtime file overrides
/// (`spec.logging.level` is reloaded, see [`common_files`]); files off write empty paths,
/// which ClickHouse reads as no file.
fn logger(l: &crate::api::LoggingSpec) -> Element {
    let files = l.files.unwrap_or(true);
    let path = |name: &str| {
        if files {
            format!("{}/{name}", names::SERVER_LOG_PATH)
        } else {
            String::new()
        }
    };
    Element::new("logger")
        .child(Element::leaf("level", "information"))
        .child(Element::leaf("log", path("clickhouse-server.log")))
        .child(Element::leaf("errorlog", path("clickhouse-server.err.log")))
        .child(Element::leaf("size", l.size.as_deref().unwrap_or("100M")))
        .child(Element::leaf("count", l.count.unwrap_or(3)))
        .child(Element::leaf("console", 1))
        .children(
            (l.format == Some(crate::api::LogFormat::Json))
                .then(|| Element::new("formatting").child(Element::leaf("type", "json"))),
        )
}

/// `storage_configuration` from `spec.storage.disks` and `spec.storage.policies` (none without
/// either, so the file of a cluster without them is unchanged): a disk per further volume at
/// its mount path, the policies' volumes in the spec's order (ClickHouse keeps the order of
/// the elements), a volume's disks as repeated `disk` elements.
fn storage_configuration(c: &Cluster<'_>) -> Option<Element> {
    let st = &c.spec.storage;
    if st.disks.is_empty() && st.policies.is_empty() {
        return None;
    }
    let disks = st
        .disks
        .iter()
        .map(|d| Element::new(&d.name).child(Element::leaf("path", names::disk_path(&d.name))));
    let policies = st.policies.iter().map(|(name, p)| {
        let volumes = p.volumes.iter().map(|v| {
            Element::new(&v.name)
                .children(v.disks.iter().map(|d| Element::leaf("disk", d)))
                .children(
                    v.max_data_part_size
                        .as_deref()
                        .and_then(crate::util::quantity::parse_bytes)
                        .map(|b| Element::leaf("max_data_part_size_bytes", b)),
                )
        });
        Element::new(name)
            .child(Element::new("volumes").children(volumes))
            .children(p.move_factor.map(|f| Element::leaf("move_factor", f)))
    });
    Some(
        Element::new("storage_configuration")
            .children((!st.disks.is_empty()).then(|| Element::new("disks").children(disks)))
            .children(
                (!st.policies.is_empty()).then(|| Element::new("policies").children(policies)),
            ),
    )
}

/// The file with `remote_servers`, kept in the Secret `<cluster>-users` and projected into
/// `config.d/`: servers connect to each other with the cluster's `secret` or, without one, as
/// `account`, whose password must be written in plain text there, so it never goes into a
/// ConfigMap. ClickHouse reloads it at runtime.
pub fn remote_servers_file(
    c: &Cluster<'_>,
    replicas: &[ReplicaSpec],
    account: (&str, &Password),
    secret: Option<&Password>,
    collections: &[crate::model::S3Collection],
) -> Result<String, BuildError> {
    let mut root = Element::new(ROOT).child(remote_servers(c, replicas, account, secret)?);
    if !collections.is_empty() {
        root = root.child(named_collections(collections));
    }
    Ok(root.to_document())
}

/// The backup destinations' buckets and keys as named collections (decision 35): a `BACKUP`
/// or `RESTORE` names the collection and a folder in it, so the keys are in no statement, no
/// query log and no error text. In the file the servers reload (a rotated key is in force
/// without a restart), each key hidden from the preprocessed copy on the data volume.
pub fn named_collections(collections: &[crate::model::S3Collection]) -> Element {
    Element::new("named_collections").children(collections.iter().map(|n| {
        let e = Element::new(&n.name).child(Element::leaf("url", &n.url));
        match &n.auth {
            crate::model::S3Auth::Keys {
                access_key_id,
                secret_access_key,
            } => e
                .child(Element::leaf("access_key_id", access_key_id).secret())
                .child(Element::leaf("secret_access_key", secret_access_key).secret()),
            // decision 43: the server's S3 client exchanges its pod's token for the role
            crate::model::S3Auth::Environment => {
                e.child(Element::leaf("use_environment_credentials", "1"))
            }
        }
    }))
}

/// The file with `interserver_http_credentials`, kept in the Secret `<cluster>-users` and
/// projected into `config.d/`: every server fetches parts from the others as
/// [`names::INTERSERVER_USER`] with this password and refuses a fetch without it (HTTP 401). Read
/// at startup only: the pod template carries its hash ([`labels::INTERSERVER_HASH`]), so a new
/// password restarts the servers one at a time.
pub fn interserver_file(password: &Password) -> String {
    Element::new(ROOT)
        .child(
            Element::new("interserver_http_credentials")
                .attr("replace", "replace")
                .child(Element::leaf("user", names::INTERSERVER_USER))
                .child(Element::leaf("password", &password.0).secret()),
        )
        .to_document()
}

/// The file with ClickHouse's Keeper identity (`zookeeper/identity`, digest
/// [`names::KEEPER_USER`]`:<password>`), kept in the Secret `<cluster>-users` and projected into
/// `config.d/` after the runtime file whose `zookeeper` section it merges into: ClickHouse then
/// authenticates to Keeper and creates every znode with an ACL for this identity only, so no
/// other client can read or change replication metadata or the distributed DDL queue. Empty
/// (a root element only) without Keeper. Reloaded at runtime; it must never change once used
/// (see [`keeper_identity_of`]).
pub fn keeper_identity_file(c: &Cluster<'_>, password: &Password) -> String {
    let mut root = Element::new(ROOT);
    if c.keeper_members > 0 || c.spec.keeper.external.is_some() {
        root = root.child(Element::new("zookeeper").child(
            Element::leaf("identity", format!("{}:{}", names::KEEPER_USER, password.0)).secret(),
        ));
    }
    root.to_document()
}

/// The identity a [`keeper_identity_file`] with `password` holds, as written there (escaped).
pub fn keeper_identity_text(password: &Password) -> String {
    super::xml::escape(&format!("{}:{}", names::KEEPER_USER, password.0))
}

/// The identity a [`keeper_identity_file`] holds, as written (escaped); `None` if it holds none.
/// Files written before the element was hidden from `preprocessed_configs/` have it without
/// attributes.
pub fn keeper_identity_of(file: &str) -> Option<&str> {
    let open = file.find("<identity")?;
    let start = open + file[open..].find('>')? + 1;
    let len = file[start..].find("</identity>")?;
    Some(&file[start..start + len])
}

/// `remote_servers` with one cluster named like the ClickHouseCluster: every shard that has a
/// replica in `replicas`, in shard order, and its replicas by creation index. With a `secret`
/// (20.10 and later, see [`crate::plan::fleet`]) the cluster carries it and no replica names an
/// account: the servers prove to each other that they belong to the cluster, and a
/// Distributed query or `ON CLUSTER` statement runs on every shard as the user who started it,
/// with that user's rights. Without one, every replica is reached as `user`. It replaces the
/// example clusters of the image's `config.xml`.
pub fn remote_servers(
    c: &Cluster<'_>,
    replicas: &[ReplicaSpec],
    (user, password): (&str, &Password),
    secret: Option<&Password>,
) -> Result<Element, BuildError> {
    let mut by_shard: BTreeMap<ShardIndex, Vec<&ReplicaSpec>> = BTreeMap::new();
    for r in replicas {
        by_shard.entry(r.shard).or_default().push(r);
    }
    let tls = c.spec.tls.enabled;
    let port = if tls {
        names::TCP_SECURE_PORT
    } else {
        names::TCP_PORT
    };
    let shards = by_shard.into_iter().map(|(shard, mut rs)| {
        rs.sort_by_key(|r| r.index);
        // only a weight the spec sets is written: the file of a cluster without weights stays
        let weight = c.spec.shard_weights.get(&shard.to_string());
        Element::new("shard")
            .children(weight.map(|w| Element::leaf("weight", w)))
            .child(Element::leaf("internal_replication", "true"))
            .children(rs.into_iter().map(|r| {
                let mut e = Element::new("replica")
                    .child(Element::leaf(
                        "host",
                        names::replica_host(c.name, c.namespace, c.spec.cluster_domain(), &r.name),
                    ))
                    .child(Element::leaf("port", port));
                if secret.is_none() {
                    e = e
                        .child(Element::leaf("user", user))
                        .child(Element::leaf("password", &password.0).secret());
                }
                if tls {
                    e.child(Element::leaf("secure", 1))
                } else {
                    e
                }
            }))
    });
    Ok(Element::new("remote_servers")
        .attr("replace", "replace")
        .child(
            Element::checked(c.name, "metadata.name")?
                .children(secret.map(|s| Element::leaf("secret", &s.0).secret()))
                .children(shards),
        ))
}

/// The Keeper nodes of an external ensemble (`spec.keeper.external`) as (host, port): its
/// listed members, or the referenced cluster's Keeper client Service.
pub fn external_keeper_nodes(c: &Cluster<'_>) -> Vec<(String, i32)> {
    let Some(x) = &c.spec.keeper.external else {
        return Vec::new();
    };
    match &x.cluster_ref {
        Some(r) => vec![(
            format!(
                "{}.{}.svc.{}",
                names::keeper(&r.name),
                r.namespace.as_deref().unwrap_or(c.namespace),
                c.spec.cluster_domain()
            ),
            names::KEEPER_CLIENT_PORT,
        )],
        None => x.nodes.iter().map(|n| (n.host.clone(), n.port)).collect(),
    }
}

/// `zookeeper` listing every Keeper member (or the external ensemble's, under the cluster's
/// root), or nothing without Keeper.
fn zookeeper(c: &Cluster<'_>) -> Option<Element> {
    if let Some(x) = &c.spec.keeper.external {
        return Some(
            Element::new("zookeeper")
                .attr("replace", "replace")
                .children(external_keeper_nodes(c).into_iter().map(|(host, port)| {
                    Element::new("node")
                        .child(Element::leaf("host", host))
                        .child(Element::leaf("port", port))
                }))
                .child(Element::leaf("root", x.root_of(c.namespace, c.name))),
        );
    }
    let n = c.keeper_members;
    let tls = c.spec.keeper.tls;
    (n > 0).then(|| {
        Element::new("zookeeper")
            .attr("replace", "replace")
            .children((0..n).map(|i| {
                Element::new("node")
                    .child(Element::leaf(
                        "host",
                        names::keeper_host(c.name, c.namespace, c.spec.cluster_domain(), i),
                    ))
                    .child(Element::leaf(
                        "port",
                        if tls {
                            names::KEEPER_SECURE_CLIENT_PORT
                        } else {
                            names::KEEPER_CLIENT_PORT
                        },
                    ))
                    .children(tls.then(|| Element::leaf("secure", 1)))
            }))
    })
}

/// The common ConfigMap `<cluster>-common`.
pub fn common_config_map(c: &Cluster<'_>, files: &[ConfigFile]) -> ConfigMap {
    ConfigMap {
        metadata: c.meta(
            names::common_config(c.name),
            labels::common(c.name, Component::Server),
        ),
        data: Some(
            files
                .iter()
                .map(|f| (f.name.clone(), f.content.clone()))
                .collect(),
        ),
        ..ConfigMap::default()
    }
}

/// The per-replica file: macros `cluster`, `shard`, `replica`, and the replica's DNS name as
/// `interserver_http_host` (what other replicas fetch parts from).
pub fn replica_file(c: &Cluster<'_>, r: &ReplicaSpec) -> String {
    Element::new(ROOT)
        .child(
            Element::new("macros")
                .attr("replace", "replace")
                .child(Element::leaf("cluster", c.name))
                .child(Element::leaf("shard", r.shard))
                .child(Element::leaf("replica", &r.name)),
        )
        .child(Element::leaf(
            "interserver_http_host",
            names::replica_host(c.name, c.namespace, c.spec.cluster_domain(), &r.name),
        ))
        .to_document()
}

/// The per-replica ConfigMap `<sts>`.
pub fn replica_config_map(c: &Cluster<'_>, r: &ReplicaSpec) -> ConfigMap {
    let mut data = BTreeMap::from([(REPLICA_FILE.to_string(), replica_file(c, r))]);
    data.extend(shard_files(c, r.shard).clone());
    data.extend(replica_files(c, &r.name).clone());
    ConfigMap {
        metadata: c.meta(names::replica_config(&r.name), labels::replica(c.name, r)),
        data: Some(data),
        ..ConfigMap::default()
    }
}

/// The user's files of replica `replica` (`spec.configuration.replicaFiles`), empty when it has
/// none.
pub fn replica_files<'a>(c: &'a Cluster<'_>, replica: &str) -> &'a BTreeMap<String, String> {
    static NONE: BTreeMap<String, String> = BTreeMap::new();
    c.spec
        .configuration
        .replica_files
        .get(replica)
        .unwrap_or(&NONE)
}

/// The user's files of shard `shard` (`spec.configuration.shardFiles`), empty when it has none.
pub fn shard_files<'a>(c: &'a Cluster<'_>, shard: ShardIndex) -> &'a BTreeMap<String, String> {
    static NONE: BTreeMap<String, String> = BTreeMap::new();
    c.spec
        .configuration
        .shard_files
        .get(&shard.to_string())
        .unwrap_or(&NONE)
}

/// The backup destinations' named collections where they are written: every server runs a
/// version whose `BACKUP` reads them (older ones get the keys in the statement, masked in every
/// log and error of the operator and its agents).
pub fn backup_collections(inputs: &crate::model::Inputs) -> &[crate::model::S3Collection] {
    let supported = inputs
        .server_version
        .is_some_and(|v| v.supports(crate::version::Capability::BackupNamedCollection));
    if supported {
        &inputs.backup_collections
    } else {
        &[]
    }
}
