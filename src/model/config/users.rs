//! The server's `users.d/` file: profiles, quotas, the users of `spec.users` and the operator's
//! own user. Passwords appear only as `password_sha256_hex`. ClickHouse reloads this file at
//! runtime, so no pod template depends on it.

use sha2::{Digest, Sha256};

use super::xml::{Element, ROOT};
pub use crate::conventions::DEFAULT_QUOTA;
use crate::model::{BuildError, Cluster, Password, ReplicaSpec, names};

/// Profile and quota given to users that name none.
pub const DEFAULT_PROFILE: &str = "default";
/// `poll_interval` of the default profile, unless `spec.configuration.profiles.default` sets
/// it. The default profile is the server's global settings; `poll_interval` is how often a
/// connection that waits for its next query looks whether the server is stopping. At
/// ClickHouse's 10 s, one idle connection (a peer's Distributed pool, a client's pool) kept a
/// stopping server up for 10 s, and so each restart of a roll. At 1 s an 18.16 server stops
/// 1.5 s after SIGTERM with an idle native connection open, 10.0 s at the default. Servers
/// read it at start: a running server gets it at its next restart.
pub const DEFAULT_POLL_INTERVAL: (&str, &str) = ("poll_interval", "1");
/// The image's own user, without a password.
pub const DEFAULT_USER: &str = "default";

/// SHA-256 of a password, hex-encoded, as `password_sha256_hex` wants it.
pub fn sha256_hex(password: &Password) -> String {
    hex::encode(Sha256::digest(password.0.as_bytes()))
}

/// Suffix of a users Secret key whose value is the SHA-256 of the password, hex-encoded
/// (`alice.sha256_hex`): written as `password_sha256_hex`, so the password itself is in no
/// Secret, no operator memory and no file.
pub const SHA256_SUFFIX: &str = ".sha256_hex";
/// Suffix of a users Secret key whose value is SHA-1 of SHA-1 of the password, hex-encoded
/// (`alice.double_sha1_hex`, what MySQL clients need): written as `password_double_sha1_hex`.
pub const DOUBLE_SHA1_SUFFIX: &str = ".double_sha1_hex";

/// What a users Secret key gives its user.
#[derive(Clone, PartialEq, Eq)]
pub enum Credential<'a> {
    /// The password itself (the key is the user name): hashed here.
    Plain(&'a Password),
    /// `password_sha256_hex`, as given (lower case).
    Sha256Hex(String),
    /// `password_double_sha1_hex`, as given (lower case).
    DoubleSha1Hex(String),
}

impl Credential<'_> {
    fn element(&self) -> Element {
        match self {
            Credential::Plain(p) => Element::leaf("password_sha256_hex", sha256_hex(p)),
            Credential::Sha256Hex(h) => Element::leaf("password_sha256_hex", h),
            Credential::DoubleSha1Hex(h) => Element::leaf("password_double_sha1_hex", h),
        }
        .secret()
    }
}

/// The users of the users Secret and their credentials: a key is a user name with its
/// password, or a user name with [`SHA256_SUFFIX`] or [`DOUBLE_SHA1_SUFFIX`] and the hash. A
/// user with two keys, a hash that is not one (64 or 40 hex digits) and a double SHA-1 for
/// servers known to be older than it are refused, the key named and never the value.
pub fn credentials(
    secret: &std::collections::BTreeMap<String, Password>,
    version: Option<crate::version::Version>,
) -> Result<std::collections::BTreeMap<&str, Credential<'_>>, BuildError> {
    let mut out = std::collections::BTreeMap::new();
    for (key, value) in secret {
        let field = format!("spec.users.secretName (key {key:?})");
        let hash = |len: usize| {
            let h = value.0.trim().to_ascii_lowercase();
            if h.len() == len && h.bytes().all(|b| b.is_ascii_hexdigit()) {
                Ok(h)
            } else {
                Err(BuildError::UsersSecret {
                    field: field.clone(),
                    detail: format!("the value is not a hash of {len} hexadecimal digits"),
                })
            }
        };
        let (user, credential) = if let Some(user) = key.strip_suffix(SHA256_SUFFIX) {
            (user, Credential::Sha256Hex(hash(64)?))
        } else if let Some(user) = key.strip_suffix(DOUBLE_SHA1_SUFFIX) {
            if version.is_some_and(|v| !v.supports(crate::version::Capability::PasswordDoubleSha1))
            {
                return Err(BuildError::UsersSecret {
                    field,
                    detail: format!(
                        "a double SHA-1 password needs ClickHouse {} or later: the servers run {}",
                        crate::version::Capability::PasswordDoubleSha1.since(),
                        version.map(|v| v.to_string()).unwrap_or_default()
                    ),
                });
            }
            (user, Credential::DoubleSha1Hex(hash(40)?))
        } else {
            (key.as_str(), Credential::Plain(value))
        };
        if out.insert(user, credential).is_some() {
            return Err(BuildError::UsersSecret {
                field,
                detail: format!("user {user:?} has more than one key (a password and a hash)"),
            });
        }
    }
    Ok(out)
}

/// One account of the users file.
struct Account<'a> {
    networks: Element,
    profile: &'a str,
    quota: &'a str,
    databases: &'a [String],
    /// SQL privileges (`<grants>`, 23.6 and later); none: the version's default (all).
    grants: Vec<String>,
    /// `access_management` (20.4 and later).
    access_management: bool,
}

/// The privileges of the operator's account where the servers have SQL privileges for users of
/// the users file (23.6 and later, [`crate::version::Capability::UserGrantsInUsersFile`]):
/// what its statements, its backup agents and the exporter need, and nothing else. Reading
/// every table and writing into one are needed: a copied view must be able to read its
/// sources, a materialized view to write into its target, a restored part is attached with
/// `INSERT`; `SET DEFINER` on `definers` lets it copy a view whose definer is one of them. It
/// has no access management (no `CREATE USER`, `GRANT`), no mutations or `TRUNCATE`, no
/// `SYSTEM` statement beyond the three it sends, no file, URL or other table functions beyond
/// `remote`/`cluster` and S3 (backups). Each statement kind the operator sends is run under
/// these grants on the 26.x engine in `tests/modern_config/accounts.rs`.
pub fn operator_grants(definers: &[&str]) -> Vec<String> {
    let mut grants = vec![
        "GRANT SELECT, INSERT, SHOW ON *.*".to_string(),
        "GRANT CREATE DATABASE, CREATE TABLE, CREATE VIEW, CREATE DICTIONARY, CREATE FUNCTION ON *.*".into(),
        "GRANT DROP DATABASE, DROP TABLE, DROP VIEW, DROP DICTIONARY ON *.*".into(),
        "GRANT SYSTEM SYNC REPLICA, SYSTEM DROP REPLICA, SYSTEM DROP DNS CACHE ON *.*".into(),
        "GRANT ALTER FREEZE PARTITION ON *.*".into(),
        "GRANT BACKUP ON *.*".into(),
        "GRANT REMOTE, S3 ON *.*".into(),
    ];
    // one statement per user: `SET DEFINER ON a, b` is refused (seen on 26.x)
    grants.extend(definers.iter().map(|d| {
        format!(
            "GRANT SET DEFINER ON `{}`",
            d.replace('\\', "\\\\").replace('`', "\\`")
        )
    }));
    grants
}

fn user(
    name: &str,
    field: &str,
    credential: &Credential<'_>,
    account: Account<'_>,
) -> Result<Element, BuildError> {
    // `replace` drops whatever the image defines for the same user (e.g. a plain `password` of
    // `default`), which ClickHouse would refuse next to `password_sha256_hex`.
    let mut e = Element::checked(name, field)?
        .attr("replace", "replace")
        .child(credential.element())
        .child(account.networks)
        .child(Element::leaf("profile", account.profile))
        .child(Element::leaf("quota", account.quota));
    if account.access_management {
        e = e.child(Element::leaf("access_management", 1));
    }
    if !account.grants.is_empty() {
        e = e.child(
            Element::new("grants")
                .children(account.grants.iter().map(|g| Element::leaf("query", g))),
        );
    }
    if !account.databases.is_empty() {
        e = e.child(
            Element::new("allow_databases").children(
                account
                    .databases
                    .iter()
                    .map(|d| Element::leaf("database", d)),
            ),
        );
    }
    Ok(e)
}

/// A network (canonical `address/len`, see [`crate::util::networks::parse`]) as an `<ip>` entry
/// every supported version matches exactly: a single address without a prefix, an IPv4 network
/// as its IPv4-mapped IPv6 network (`::ffff:10.1.0.0/112` for `10.1.0.0/16`). ClickHouse 18.16
/// compares clients as IPv6 and applies an IPv4 prefix length to the mapped address, so it
/// matches `10.1.0.0/16` (or any IPv4 network, even a /32) against every IPv4 client (seen on
/// 18.16.1); the mapped form is matched correctly there and by newer versions, which compare
/// IPv4 networks in that mapped form too.
pub fn ip_entry(network: &str) -> String {
    let (addr, len) = network.split_once('/').unwrap_or((network, ""));
    let v4 = addr.parse::<std::net::Ipv4Addr>().is_ok();
    match (v4, len.parse::<u8>().ok()) {
        (true, Some(32)) | (false, Some(128)) | (_, None) => addr.to_string(),
        (true, Some(l)) => format!("::ffff:{addr}/{}", u16::from(l) + 96),
        (false, Some(l)) => format!("{addr}/{l}"),
    }
}

/// `networks` of the server pod itself (loopback), `servers` (the cluster's own server pods, by
/// the DNS name their headless Service gives them: ClickHouse resolves each `<host>` and
/// compares its addresses with the client's, so a pod that comes back with a new address is
/// still recognised), and `extra` addresses or CIDRs. (A `host_regexp` would need the reverse
/// lookup of the client's address, which 18.16 listening on `::` does not match: it sees IPv4
/// clients as IPv4-mapped IPv6 addresses.)
fn networks(c: &Cluster<'_>, servers: &[ReplicaSpec], extra: &[String]) -> Element {
    let mut n = Element::new("networks")
        .attr("replace", "replace")
        .child(Element::leaf("ip", "::1"))
        .child(Element::leaf("ip", "127.0.0.1"))
        .children(extra.iter().map(|ip| Element::leaf("ip", ip_entry(ip))));
    for r in servers {
        n = n.child(Element::leaf(
            "host",
            names::replica_host(c.name, c.namespace, c.spec.cluster_domain(), &r.name),
        ));
    }
    n
}

/// Networks of the image's passwordless `default` user, unless the users Secret defines
/// `default`: the pod itself and the cluster's own server pods `replicas`; nobody else reaches a
/// passwordless user.
pub fn default_user_networks(c: &Cluster<'_>, replicas: &[ReplicaSpec]) -> Element {
    networks(c, replicas, &[])
}

/// The users file (decision 27: no account accepts any address), from the cluster and `inputs`.
///
/// - The cluster's own account [`names::CLUSTER_USER`] (where the cluster has its password), as
///   which the servers reach each other through `remote_servers` (Distributed queries, `ON
///   CLUSTER`), accepts logins only from the server pod itself and the cluster's server pods.
/// - The operator's account accepts logins from the operator's networks and the server pod
///   itself; in a cluster without its own account, from the cluster's server pods too (they
///   reach each other as the operator there).
/// - The users of the Secret `spec.users.secretName` get the profile `spec.users.profile`
///   (default `default`), the quota `default` and the networks `spec.users.networks` (default:
///   the operator's networks, the pod network), or what `spec.users.accounts.<user>` says
///   instead, and there `databases` as `allow_databases`.
pub fn users_file(c: &Cluster<'_>, inputs: &crate::model::Inputs) -> Result<String, BuildError> {
    let users = credentials(&inputs.user_passwords, inputs.server_version)?;
    // the servers whose logins the cluster's accounts accept: those that stay and those leaving
    let servers: Vec<ReplicaSpec> = inputs
        .replicas
        .iter()
        .chain(&inputs.leaving)
        .cloned()
        .collect();
    let replicas = servers.as_slice();
    let mut profiles = profiles(&c.spec.configuration)?;
    let quotas = quotas(&c.spec.configuration)?;
    let profile = c
        .spec
        .users
        .as_ref()
        .and_then(|u| u.profile.as_deref())
        .unwrap_or(DEFAULT_PROFILE);
    Element::checked(profile, "spec.users.profile")?;
    let mut list = Element::new("users").child(operator_user(c, inputs, &users)?);
    if let Some(p) = &inputs.exporter_password {
        // The metrics exporter, from the operator's networks: a read-only session that reads
        // the `system` tables and sees every table's metadata (`system.parts` and
        // `system.replicas` show only tables the account may see), not their rows. Servers
        // without `<grants>` cannot say so: an account limited to `system` sees no other
        // database's parts or replicas there (seen on 18.16.1), so it keeps every database,
        // read-only (SECURITY.md).
        profiles = profiles.child(
            Element::new(names::EXPORTER_PROFILE)
                .child(Element::leaf("readonly", "2"))
                .child(Element::leaf("max_execution_time", "10")),
        );
        list = list.child(user(
            names::EXPORTER_USER,
            "exporter user",
            &Credential::Plain(p),
            Account {
                networks: networks(c, &[], &inputs.operator_networks),
                profile: names::EXPORTER_PROFILE,
                quota: DEFAULT_QUOTA,
                databases: &[],
                grants: if grants_supported(inputs) {
                    vec![
                        "GRANT SELECT ON system.*".into(),
                        "GRANT SHOW DATABASES, SHOW TABLES ON *.*".into(),
                    ]
                } else {
                    Vec::new()
                },
                access_management: false,
            },
        )?);
    }
    if let Some(p) = &inputs.cluster_password {
        list = list.child(user(
            names::CLUSTER_USER,
            "cluster user",
            &Credential::Plain(p),
            Account {
                networks: networks(c, replicas, &[]),
                profile: DEFAULT_PROFILE,
                quota: DEFAULT_QUOTA,
                databases: &[],
                grants: Vec::new(),
                access_management: false,
            },
        )?);
    }
    list = list.children(secret_users(c, inputs, &users, profile)?);
    if !users.contains_key(DEFAULT_USER) {
        list = list.child(Element::new(DEFAULT_USER).child(default_user_networks(c, replicas)));
    }
    Ok(Element::new(ROOT)
        .child(profiles)
        .child(quotas)
        .child(list)
        .to_document())
}

/// `<profiles>`: `spec.configuration.profiles`, the default one with
/// [`DEFAULT_POLL_INTERVAL`] unless it sets it.
fn profiles(configuration: &crate::api::Configuration) -> Result<Element, BuildError> {
    let mut profiles = Element::new("profiles");
    let mut named = configuration.profiles.clone();
    let (key, value) = DEFAULT_POLL_INTERVAL;
    named
        .entry(DEFAULT_PROFILE.into())
        .or_default()
        .entry(key.into())
        .or_insert_with(|| value.into());
    for (name, settings) in &named {
        profiles = profiles.child(
            Element::checked(name, "spec.configuration.profiles")?.children(Element::from_paths(
                settings.iter().map(|(k, v)| (k.as_str(), v.as_str())),
                &format!("spec.configuration.profiles.{name}"),
            )?),
        );
    }
    Ok(profiles)
}

/// `<quotas>`: `spec.configuration.quotas`, each one interval.
fn quotas(configuration: &crate::api::Configuration) -> Result<Element, BuildError> {
    let mut quotas = Element::new("quotas");
    for (name, settings) in &configuration.quotas {
        quotas = quotas.child(Element::checked(name, "spec.configuration.quotas")?.child(
            Element::new("interval").children(Element::from_paths(
                settings.iter().map(|(k, v)| (k.as_str(), v.as_str())),
                &format!("spec.configuration.quotas.{name}"),
            )?),
        ));
    }
    Ok(quotas)
}

/// Whether the servers take SQL privileges in the users file.
fn grants_supported(inputs: &crate::model::Inputs) -> bool {
    inputs
        .server_version
        .is_some_and(|v| v.supports(crate::version::Capability::UserGrantsInUsersFile))
}

/// The operator's account, with [`operator_grants`] where the servers take them; from the
/// cluster's server pods too in a cluster without its own account.
fn operator_user(
    c: &Cluster<'_>,
    inputs: &crate::model::Inputs,
    users: &std::collections::BTreeMap<&str, Credential<'_>>,
) -> Result<Element, BuildError> {
    let servers: Vec<ReplicaSpec> = match inputs.cluster_password {
        Some(_) => Vec::new(),
        None => inputs
            .replicas
            .iter()
            .chain(&inputs.leaving)
            .cloned()
            .collect(),
    };
    let servers_as_operator = servers.as_slice();
    let grants = if grants_supported(inputs) {
        let mut definers: Vec<&str> = vec![DEFAULT_USER, names::OPERATOR_USER];
        definers.extend(
            users
                .keys()
                .copied()
                .filter(|u| *u != DEFAULT_USER && *u != names::OPERATOR_USER),
        );
        let mut grants = operator_grants(&definers);
        // the backup destinations' named collections, which its agents' statements name
        grants.extend(
            super::server::backup_collections(inputs)
                .iter()
                .map(|c| format!("GRANT NAMED COLLECTION ON {}", c.name)),
        );
        grants
    } else {
        Vec::new()
    };
    user(
        names::OPERATOR_USER,
        "operator user",
        &Credential::Plain(&inputs.operator_password),
        Account {
            networks: networks(c, servers_as_operator, &inputs.operator_networks),
            profile: DEFAULT_PROFILE,
            quota: DEFAULT_QUOTA,
            databases: &[],
            grants,
            access_management: false,
        },
    )
}

/// The accounts of the users Secret (but the operator's own names), with `profile` and what
/// `spec.users` says of each.
fn secret_users(
    c: &Cluster<'_>,
    inputs: &crate::model::Inputs,
    users: &std::collections::BTreeMap<&str, Credential<'_>>,
    profile: &str,
) -> Result<Vec<Element>, BuildError> {
    let spec_users = c.spec.users.as_ref();
    let user_networks = spec_users
        .map(|u| u.networks.as_slice())
        .filter(|n| !n.is_empty())
        .unwrap_or(&inputs.operator_networks);
    let mut list = Vec::new();
    for (name, credential) in users {
        let name = *name;
        if name == names::OPERATOR_USER
            || name == names::CLUSTER_USER
            || name == names::EXPORTER_USER
        {
            // The operator's accounts are the operator's: a same-named entry cannot replace them.
            continue;
        }
        let account = spec_users.and_then(|u| u.accounts.get(name));
        let networks_of = account
            .map(|a| a.networks.as_slice())
            .filter(|n| !n.is_empty())
            .unwrap_or(user_networks);
        let profile_of = account
            .and_then(|a| a.profile.as_deref())
            .unwrap_or(profile);
        Element::checked(profile_of, &format!("spec.users.accounts.{name}.profile"))?;
        let quota_of = account
            .and_then(|a| a.quota.as_deref())
            .unwrap_or(DEFAULT_QUOTA);
        Element::checked(quota_of, &format!("spec.users.accounts.{name}.quota"))?;
        list.push(user(
            name,
            "spec.users.secretName (a key)",
            credential,
            Account {
                networks: networks(c, &[], networks_of),
                profile: profile_of,
                quota: quota_of,
                databases: account.map(|a| a.databases.as_slice()).unwrap_or(&[]),
                grants: Vec::new(),
                // written only where the servers have it (an older one ignores or refuses it)
                access_management: account.is_some_and(|a| a.access_management)
                    && inputs
                        .server_version
                        .is_some_and(|v| v.supports(crate::version::Capability::AccessManagement)),
            },
        )?);
    }
    Ok(list)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn secret(pairs: &[(&str, &str)]) -> BTreeMap<String, Password> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), Password(v.to_string())))
            .collect()
    }

    /// Passwords not in the clear: a key with `.sha256_hex` or `.double_sha1_hex` names its user
    /// and holds the hash, taken as it is (lower-cased); a plain key holds the password, hashed
    /// here.
    #[test]
    fn hashed_keys_give_their_user_the_hash_as_it_is() {
        let sha = "A".repeat(64);
        let dsha = "b".repeat(40);
        let s = secret(&[
            ("alice.sha256_hex", &sha),
            ("bob.double_sha1_hex", &dsha),
            ("carol", "carol-pw"),
        ]);
        let c = credentials(&s, Some("24.8".parse().unwrap())).unwrap();
        assert_eq!(
            c.keys().copied().collect::<Vec<_>>(),
            ["alice", "bob", "carol"]
        );
        assert!(c["alice"] == Credential::Sha256Hex("a".repeat(64)));
        assert!(c["bob"] == Credential::DoubleSha1Hex(dsha.clone()));
        assert_eq!(
            c["carol"].element().to_document(),
            Element::leaf(
                "password_sha256_hex",
                sha256_hex(&Password("carol-pw".into()))
            )
            .secret()
            .to_document()
        );
        // the version unknown: allowed (the servers report it later)
        assert!(credentials(&s, None).is_ok());
    }

    /// A user with two keys, a value that is no hash, and a double SHA-1 for servers older than
    /// it are refused, naming the key and never the value.
    #[test]
    fn bad_hashed_keys_are_refused_naming_the_key_not_the_value() {
        let secret_value = "s3cret-not-a-hash";
        for (s, version, words) in [
            (
                secret(&[("alice.sha256_hex", secret_value)]),
                "24.8",
                "64 hexadecimal digits",
            ),
            (
                secret(&[("alice.double_sha1_hex", &"0".repeat(64))]),
                "24.8",
                "40 hexadecimal digits",
            ),
            (
                secret(&[
                    ("alice", secret_value),
                    ("alice.sha256_hex", &"0".repeat(64)),
                ]),
                "24.8",
                "more than one key",
            ),
            (
                secret(&[("alice.double_sha1_hex", &"0".repeat(40))]),
                "18.16.1",
                "needs ClickHouse 20.1",
            ),
        ] {
            let e = credentials(&s, Some(version.parse().unwrap()))
                .err()
                .unwrap()
                .to_string();
            assert!(e.contains(words), "{e}");
            assert!(e.contains("alice"), "{e}");
            assert!(!e.contains(secret_value), "{e}");
        }
    }

    /// Decision 27: an IPv4 network is written as its IPv4-mapped IPv6 network, which 18.16 matches
    /// correctly (it matches a plain IPv4 CIDR against every IPv4 client); single addresses and
    /// IPv6 networks stay as they are.
    #[test]
    fn ipv4_networks_are_written_in_the_mapped_form_every_version_matches() {
        assert_eq!(ip_entry("10.1.0.0/16"), "::ffff:10.1.0.0/112");
        assert_eq!(ip_entry("0.0.0.0/0"), "::ffff:0.0.0.0/96");
        assert_eq!(ip_entry("198.18.0.1/32"), "198.18.0.1");
        assert_eq!(ip_entry("fd00::/8"), "fd00::/8");
        assert_eq!(ip_entry("::/0"), "::/0");
        assert_eq!(ip_entry("fd00::5/128"), "fd00::5");
    }
}
